//! The extended verbs reached through function tables in objects:
//! `ibv_create_cq_ex` with `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`
//! and the `ibv_wc_read_*` calls, `ibv_create_qp_ex`, `ibv_qp_to_qp_ex` and
//! the `ibv_wr_*` calls.
//!
//! `ibv_wr_*`: `wr_start` opens a batch, each `wr_<op>` call adds a work
//! request (taking `qp->wr_id` and `qp->wr_flags` at that moment), the
//! `wr_set_*` calls complete the last one, `wr_complete` posts the batch in
//! order (returning the first error; requests before it were posted) and
//! `wr_abort` drops it. Errors found while building (an unsupported
//! operation, too many SGEs) are kept and returned by `wr_complete`.

use std::ffi::{c_int, c_uint, c_void};

use softrdma_proto::wr::{InlineData, Payload, SendFlags, SendOp, SendWr, SgList, Sge, MAX_SGE};

use crate::abi::*;
use crate::datapath::{self, empty_completion, wc_to_c};
use crate::export::{export, guard, guard_ptr};
use crate::objects::*;

/// One request being built.
#[derive(Clone, Copy)]
struct Pending {
    wr: SendWr,
    ah: *mut ibv_ah,
    remote_qpn: u32,
}

/// The `ibv_wr_*` batch of a QP.
#[derive(Default)]
pub struct WrBatch {
    open: bool,
    reqs: Vec<Pending>,
    error: Option<c_int>,
}

// SAFETY: the raw AH pointers are application handles only dereferenced by the thread posting the batch (verbs: a QP's batch belongs to one thread at a time).
unsafe impl Send for WrBatch {}

/// A fresh `ibv_qp_ex` around `base` with our `ibv_wr_*` table.
pub fn new_qp_ex(base: ibv_qp) -> ibv_qp_ex {
    ibv_qp_ex {
        qp_base: base,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
        wr_bind_mw: Some(wr_bind_mw),
        wr_local_inv: Some(wr_local_inv),
        wr_rdma_read: Some(wr_rdma_read),
        wr_rdma_write: Some(wr_rdma_write),
        wr_rdma_write_imm: Some(wr_rdma_write_imm),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: Some(wr_send_inv),
        wr_send_tso: Some(wr_send_tso),
        wr_set_ud_addr: Some(wr_set_ud_addr),
        wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_atomic_write: Some(wr_atomic_write),
    }
}

fn with_batch(qp: *mut ibv_qp_ex, f: impl FnOnce(&QpObj, &mut WrBatch)) {
    guard((), || {
        // SAFETY: the application's QP (ibv_qp_ex starts our QpObj).
        let Some(q) = (unsafe { qp_from_raw(qp as *mut ibv_qp) }) else {
            return;
        };
        let mut b = q.batch.lock().unwrap_or_else(|p| p.into_inner());
        f(q, &mut b)
    })
}

fn add(qp: *mut ibv_qp_ex, op: SendOp) {
    with_batch(qp, |q, b| {
        if !b.open {
            b.error.get_or_insert(libc::EINVAL);
            return;
        }
        // SAFETY: plain fields of the application-visible part of our live QP.
        let (wr_id, flags) = unsafe { ((*q.raw()).wr_id, (*q.raw()).wr_flags) };
        b.reqs.push(Pending {
            wr: SendWr {
                wr_id,
                op,
                payload: Payload::Sgl(SgList::new()),
                flags: SendFlags {
                    signaled: q.sq_sig_all || flags & IBV_SEND_SIGNALED != 0,
                    solicited: flags & IBV_SEND_SOLICITED != 0,
                    fence: flags & IBV_SEND_FENCE != 0,
                },
            },
            ah: std::ptr::null_mut(),
            remote_qpn: 0,
        });
    })
}

fn last(qp: *mut ibv_qp_ex, f: impl FnOnce(&mut Pending) -> Result<(), c_int>) {
    with_batch(qp, |_, b| {
        let r = match b.reqs.last_mut() {
            Some(p) => f(p),
            None => Err(libc::EINVAL),
        };
        if let Err(e) = r {
            b.error.get_or_insert(e);
        }
    })
}

unsafe extern "C" fn wr_start(qp: *mut ibv_qp_ex) {
    with_batch(qp, |_, b| {
        b.open = true;
        b.reqs.clear();
        b.error = None;
    })
}

unsafe extern "C" fn wr_abort(qp: *mut ibv_qp_ex) {
    with_batch(qp, |_, b| {
        b.open = false;
        b.reqs.clear();
        b.error = None;
    })
}

unsafe extern "C" fn wr_complete(qp: *mut ibv_qp_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the application's QP.
        let Some(q) = (unsafe { qp_from_raw(qp as *mut ibv_qp) }) else {
            return libc::EINVAL;
        };
        let (reqs, err) = {
            let mut b = q.batch.lock().unwrap_or_else(|p| p.into_inner());
            b.open = false;
            (std::mem::take(&mut b.reqs), b.error.take())
        };
        if let Some(e) = err {
            return e;
        }
        for p in reqs {
            let ud = if q.dgram().is_some() {
                match ah_checked(p.ah) {
                    Some(ah) => Some((ah, p.remote_qpn)),
                    None => return libc::EINVAL,
                }
            } else {
                None
            };
            if let Err(e) = datapath::post_one(q, p.wr, ud) {
                return e;
            }
        }
        0
    })
}

unsafe extern "C" fn wr_send(qp: *mut ibv_qp_ex) {
    add(
        qp,
        SendOp::Send {
            imm: None,
            invalidate: None,
        },
    )
}

unsafe extern "C" fn wr_send_imm(qp: *mut ibv_qp_ex, imm: u32) {
    add(
        qp,
        SendOp::Send {
            imm: Some(u32::from_be(imm)),
            invalidate: None,
        },
    )
}

unsafe extern "C" fn wr_send_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    add(
        qp,
        SendOp::Send {
            imm: None,
            invalidate: Some(rkey),
        },
    )
}

unsafe extern "C" fn wr_rdma_write(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    add(
        qp,
        SendOp::Write {
            remote_addr: addr,
            rkey,
            imm: None,
        },
    )
}

unsafe extern "C" fn wr_rdma_write_imm(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, imm: u32) {
    add(
        qp,
        SendOp::Write {
            remote_addr: addr,
            rkey,
            imm: Some(u32::from_be(imm)),
        },
    )
}

unsafe extern "C" fn wr_rdma_read(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    add(
        qp,
        SendOp::Read {
            remote_addr: addr,
            rkey,
        },
    )
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    compare: u64,
    swap: u64,
) {
    add(
        qp,
        SendOp::CompareSwap {
            remote_addr: addr,
            rkey,
            compare,
            swap,
        },
    )
}

unsafe extern "C" fn wr_atomic_fetch_add(qp: *mut ibv_qp_ex, rkey: u32, addr: u64, v: u64) {
    add(
        qp,
        SendOp::FetchAdd {
            remote_addr: addr,
            rkey,
            add: v,
        },
    )
}

/// `softrdma_wr_write_record` (softrdma/verbs.h): adds an RDMA
/// Write-Record to the `ibv_wr_*` batch; complete it with
/// `ibv_wr_set_ud_addr` and `ibv_wr_set_sge`/`_list`/`ibv_wr_set_inline_data`.
pub unsafe extern "C" fn softrdma_wr_write_record(qp: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    add(
        qp,
        SendOp::WriteRecord {
            remote_addr: addr,
            rkey,
        },
    )
}

unsafe extern "C" fn wr_local_inv(qp: *mut ibv_qp_ex, rkey: u32) {
    add(qp, SendOp::LocalInvalidate { stag: rkey })
}

fn unsupported(qp: *mut ibv_qp_ex) {
    with_batch(qp, |_, b| {
        b.error.get_or_insert(libc::EOPNOTSUPP);
    })
}

unsafe extern "C" fn wr_bind_mw(
    qp: *mut ibv_qp_ex,
    _mw: *mut ibv_mw,
    _rkey: u32,
    _b: *const ibv_mw_bind_info,
) {
    unsupported(qp)
}

unsafe extern "C" fn wr_send_tso(qp: *mut ibv_qp_ex, _h: *mut c_void, _s: u16, _m: u16) {
    unsupported(qp)
}

unsafe extern "C" fn wr_set_xrc_srqn(qp: *mut ibv_qp_ex, _n: u32) {
    unsupported(qp)
}

unsafe extern "C" fn wr_atomic_write(qp: *mut ibv_qp_ex, _rkey: u32, _a: u64, _d: *const c_void) {
    unsupported(qp)
}

unsafe extern "C" fn wr_set_ud_addr(qp: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, _qkey: u32) {
    last(qp, |p| {
        p.ah = ah;
        p.remote_qpn = qpn;
        Ok(())
    })
}

unsafe extern "C" fn wr_set_sge(qp: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last(qp, |p| {
        p.wr.payload = Payload::Sgl(SgList::single(addr, length, lkey));
        Ok(())
    })
}

unsafe extern "C" fn wr_set_sge_list(qp: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    last(qp, |p| {
        if n > MAX_SGE {
            return Err(libc::EINVAL);
        }
        // SAFETY: the application's array of n entries.
        p.wr.payload = Payload::Sgl(unsafe { datapath::sgl_from_c(list, n as c_int) }?);
        Ok(())
    })
}

unsafe extern "C" fn wr_set_inline_data(qp: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    let buf = ibv_data_buf { addr, length: len };
    // SAFETY: one buffer of the application's.
    unsafe { wr_set_inline_data_list(qp, 1, &buf) }
}

unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    last(qp, |p| {
        if n > MAX_SGE || (n > 0 && list.is_null()) {
            return Err(libc::EINVAL);
        }
        let mut sges = [Sge::default(); MAX_SGE];
        for (i, s) in sges.iter_mut().enumerate().take(n) {
            // SAFETY: the application's array of n buffers.
            let b = unsafe { &*list.add(i) };
            *s = Sge {
                addr: b.addr as u64,
                length: u32::try_from(b.length).map_err(|_| libc::EINVAL)?,
                lkey: 0,
            };
        }
        let sgl = SgList::from_slice(&sges[..n]).ok_or(libc::EINVAL)?;
        // SAFETY: the buffers are the application's readable memory.
        let data: InlineData = unsafe { datapath::inline_from_sgl(&sgl) }?;
        p.wr.payload = Payload::Inline(data);
        Ok(())
    })
}

/// `ibv_qp_to_qp_ex@IBVERBS_1.6`: every QP of ours is an `ibv_qp_ex`.
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    qp as *mut ibv_qp_ex
}

/// The `IBV_QP_EX_WITH_*` operations a QP of type `qp_type` offers: RC
/// (and UC, run as RC) Write (+imm), Send (+imm), Read, both atomics, local
/// invalidate and Send with invalidate; UD Send (+imm), as in the IB
/// specification. Memory-window binds, TSO and atomic write are not
/// offered.
fn supported_send_ops(qp_type: c_int) -> u64 {
    match qp_type {
        crate::verbs_api::IBV_QPT_SOFTRDMA_RD => u64::MAX,
        IBV_QPT_UD => (1 << 2) | (1 << 3),
        _ => 0xff | (1 << 9),
    }
}

/// `verbs_context.create_qp_ex` (what the inline `ibv_create_qp_ex` calls
/// when more than the PD is given).
pub unsafe extern "C" fn create_qp_ex(
    _ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard_ptr(|| {
        // SAFETY: the application's attributes.
        let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        if a.comp_mask & !(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !supported_send_ops(a.qp_type) != 0
        {
            return Err(libc::EOPNOTSUPP);
        }
        let mut init = crate::verbs_api::QpInit {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all != 0,
        };
        // SAFETY: the application's objects.
        let q = unsafe { crate::verbs_api::create_qp_internal(a.pd, &mut init) }?;
        a.cap = init.cap;
        Ok(q as *mut ibv_qp)
    })
}

// ---------------------------------------------------------------------
// Extended CQ
// ---------------------------------------------------------------------

/// A fresh `ibv_cq_ex` with our polling table.
pub fn new_cq_ex(
    ctx: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq_context: *mut c_void,
    cqe: c_int,
    id: u64,
) -> ibv_cq_ex {
    ibv_cq_ex {
        context: ctx,
        channel,
        cq_context,
        handle: id as u32,
        cqe,
        mutex: pthread_mutex_t([0; 40]),
        cond: pthread_cond_t([0; 48]),
        comp_events_completed: 0,
        async_events_completed: 0,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: Some(read_byte_len),
        read_imm_data: Some(read_imm_data),
        read_qp_num: Some(read_qp_num),
        read_src_qp: Some(read_src_qp),
        read_wc_flags: Some(read_wc_flags),
        read_slid: Some(read_slid),
        read_sl: Some(read_sl),
        read_dlid_path_bits: Some(read_dlid_path_bits),
        read_completion_ts: None,
        read_cvlan: None,
        read_flow_tag: None,
        read_tm_info: None,
        read_completion_wallclock_ns: None,
    }
}

/// `verbs_context.create_cq_ex`. Completion timestamps and the other
/// optional `wc_flags` fields, parent domains and creation flags other
/// than the two hints are not offered (EOPNOTSUPP if asked for); an
/// undefined `comp_mask` bit is EINVAL (as rdma-core's providers).
pub unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard_ptr(|| {
        // SAFETY: the application's attributes.
        let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        // IBV_WC_EX_WITH_{BYTE_LEN,IMM,QP_NUM,SRC_QP,SLID,SL,DLID_PATH_BITS}
        // (bits 0..=6) are what we fill; timestamps, CVLAN, flow tag and
        // TM info are not available.
        if a.wc_flags & !0x7f != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        // comp_mask: IBV_CQ_INIT_ATTR_MASK_FLAGS (1) is taken; a parent
        // domain (MASK_PD, 2) is not offered; other bits are undefined.
        if a.comp_mask & !3 != 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask & 2 != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        // flags: SINGLE_THREADED and IGNORE_OVERRUN are hints we may
        // ignore; other bits ask for what we do not have.
        if a.comp_mask & 1 != 0 && a.flags & !3 != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        // SAFETY: the application's context and channel.
        let c = unsafe {
            crate::verbs_api::create_cq_internal(
                ctx,
                a.cqe.try_into().unwrap_or(-1),
                a.cq_context,
                a.channel,
                a.comp_vector.into(),
            )
        }?;
        Ok(c as *mut ibv_cq_ex)
    })
}

fn poll_into(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the application's CQ.
        let Some(c) = (unsafe { cq_from_raw(cq as *mut ibv_cq) }) else {
            return libc::EINVAL;
        };
        let mut buf = [empty_completion()];
        if crate::datapath::poll_filtered(c, &mut buf) == 0 {
            return libc::ENOENT;
        }
        let wc = wc_to_c(&buf[0]);
        *c.cur.lock().unwrap_or_else(|p| p.into_inner()) = wc;
        // SAFETY: status and wr_id are plain fields of our live CQ that the application reads between polls (single poller, verbs contract).
        unsafe {
            (*cq).status = wc.status;
            (*cq).wr_id = wc.wr_id;
        }
        0
    })
}

unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> c_int {
    poll_into(cq)
}

unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    poll_into(cq)
}

unsafe extern "C" fn end_poll(_cq: *mut ibv_cq_ex) {}

fn cur(cq: *mut ibv_cq_ex) -> ibv_wc {
    guard(ibv_wc::default(), || {
        // SAFETY: the application's CQ.
        match unsafe { cq_from_raw(cq as *mut ibv_cq) } {
            Some(c) => *c.cur.lock().unwrap_or_else(|p| p.into_inner()),
            None => ibv_wc::default(),
        }
    })
}

unsafe extern "C" fn read_opcode(cq: *mut ibv_cq_ex) -> c_int {
    cur(cq).opcode
}
unsafe extern "C" fn read_vendor_err(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).vendor_err
}
unsafe extern "C" fn read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).byte_len
}
unsafe extern "C" fn read_imm_data(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).imm_data
}
unsafe extern "C" fn read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).qp_num
}
unsafe extern "C" fn read_src_qp(cq: *mut ibv_cq_ex) -> u32 {
    cur(cq).src_qp
}
unsafe extern "C" fn read_wc_flags(cq: *mut ibv_cq_ex) -> c_uint {
    cur(cq).wc_flags
}
unsafe extern "C" fn read_slid(cq: *mut ibv_cq_ex) -> u32 {
    u32::from(cur(cq).slid)
}
unsafe extern "C" fn read_sl(cq: *mut ibv_cq_ex) -> u8 {
    cur(cq).sl
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut ibv_cq_ex) -> u8 {
    cur(cq).dlid_path_bits
}

export!(ibv_qp_to_qp_ex, softrdma_wr_write_record);
