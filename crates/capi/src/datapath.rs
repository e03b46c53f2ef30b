//! The data path the header inlines reach through `ibv_context_ops`:
//! `post_send`, `post_recv`, `post_srq_recv`, `poll_cq`, `req_notify_cq`,
//! and the conversions between the C work requests/completions and the
//! engine's.
//!
//! Errors follow rdma-core providers: the call returns an errno value
//! (not -1) and `*bad_wr` names the first request not posted; requests
//! before it were posted.
//!
//! Sends are accepted in RTR as well as RTS (iWARP has no
//! receive-only state once connected; perftest's iWARP send-credit flow
//! relies on it). An RC QP moved to RTR/RTS before its IB-style connection is up (the
//! `ibv_rc_pingpong` server does RTR and RTS before it even tells the
//! client its QPN) accepts sends once the connection is established: a
//! send that finds it still coming up waits for it (up to
//! [`CONNECT_WAIT`]) instead of failing.

use std::ffi::c_int;
use std::time::Duration;

use softrdma_engine as engine;
use softrdma_engine::{Completion, QpError};
use softrdma_proto::wr::{
    InlineData, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, Sge, WcOpcode, WcStatus,
    MAX_INLINE, MAX_SGE,
};

use crate::abi::*;
use crate::objects::*;

/// How long a send on an RC QP in RTS waits for its connection.
pub const CONNECT_WAIT: Duration = Duration::from_secs(30);

/// softrdma's `ibv_wr_opcode` for RDMA Write-Record (datagram QPs;
/// `softrdma/verbs.h`).
pub const IBV_WR_SOFTRDMA_WRITE_RECORD: c_int = 0x5201;

fn qp_error_errno(e: QpError) -> c_int {
    match e {
        QpError::QueueFull => libc::ENOMEM,
        QpError::NotConnected => libc::ENOTCONN,
        QpError::Unsupported => libc::EOPNOTSUPP,
        QpError::Invalid => libc::EINVAL,
    }
}

/// The scatter/gather list of a C request.
///
/// # Safety
/// `sg` must point at `n` readable entries when `n > 0`.
pub unsafe fn sgl_from_c(sg: *const ibv_sge, n: c_int) -> Result<SgList, c_int> {
    if n < 0 || n as usize > MAX_SGE {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(SgList::new());
    }
    if sg.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract, n entries are readable.
    let s = unsafe { std::slice::from_raw_parts(sg, n as usize) };
    let mut v = [Sge::default(); MAX_SGE];
    for (d, e) in v.iter_mut().zip(s) {
        *d = Sge {
            addr: e.addr,
            length: e.length,
            lkey: e.lkey,
        };
    }
    SgList::from_slice(&v[..n as usize]).ok_or(libc::EINVAL)
}

/// Copies the bytes a scatter list names (for `IBV_SEND_INLINE`: the
/// application's buffers need not be registered).
///
/// # Safety
/// Every entry must name readable memory of the caller.
pub unsafe fn inline_from_sgl(sgl: &SgList) -> Result<InlineData, c_int> {
    let total = sgl.total_len();
    if total > MAX_INLINE as u64 {
        return Err(libc::EINVAL);
    }
    let mut buf = [0u8; MAX_INLINE];
    let mut at = 0usize;
    for s in sgl.as_slice() {
        let len = s.length as usize;
        if len == 0 {
            continue;
        }
        // SAFETY: per the contract, addr..addr+len is readable; the total fits buf (checked above).
        unsafe { std::ptr::copy_nonoverlapping(s.addr as *const u8, buf[at..].as_mut_ptr(), len) };
        at += len;
    }
    InlineData::new(&buf[..at]).ok_or(libc::EINVAL)
}

/// The engine request for a C send request (the UD destination apart).
///
/// # Safety
/// `wr` must be a readable request whose scatter list is readable.
pub unsafe fn send_wr_from_c(qp: &QpObj, wr: &ibv_send_wr) -> Result<SendWr, c_int> {
    // SAFETY: per the contract.
    unsafe { send_wr_from_c_sig(wr, qp.sq_sig_all) }
}

/// [`send_wr_from_c`] for a send queue that is not a [`QpObj`] (the DC
/// initiators of [`crate::sdc`]): `sig_all` is its `sq_sig_all`.
///
/// # Safety
/// As for [`send_wr_from_c`].
pub unsafe fn send_wr_from_c_sig(wr: &ibv_send_wr, sig_all: bool) -> Result<SendWr, c_int> {
    // SAFETY: per the contract.
    let sgl = unsafe { sgl_from_c(wr.sg_list, wr.num_sge) }?;
    let imm = u32::from_be(wr.imm_data);
    // SAFETY: the union members are plain integers; reading the one the opcode names.
    let (rdma, atomic) = unsafe { (wr.wr.rdma, wr.wr.atomic) };
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send {
            imm: None,
            invalidate: None,
        },
        IBV_WR_SEND_WITH_IMM => SendOp::Send {
            imm: Some(imm),
            invalidate: None,
        },
        IBV_WR_SEND_WITH_INV => SendOp::Send {
            imm: None,
            invalidate: Some(wr.imm_data),
        },
        IBV_WR_RDMA_WRITE => SendOp::Write {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm: None,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::Write {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm: Some(imm),
        },
        IBV_WR_RDMA_READ => SendOp::Read {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        IBV_WR_LOCAL_INV => SendOp::LocalInvalidate { stag: wr.imm_data },
        // The destination is in `wr.ud` (datagram QPs), so the target
        // address travels in the otherwise unused `bind_mw` member:
        // `mw` holds the remote address, `rkey` the rkey
        // (`softrdma_wr_set_record()` in softrdma/verbs.h).
        IBV_WR_SOFTRDMA_WRITE_RECORD => SendOp::WriteRecord {
            remote_addr: wr.bind_mw.mw as u64,
            rkey: wr.bind_mw.rkey,
        },
        _ => return Err(libc::EOPNOTSUPP),
    };
    let inline = wr.send_flags & IBV_SEND_INLINE != 0
        && matches!(op, SendOp::Send { .. } | SendOp::Write { .. });
    let payload = if inline {
        // SAFETY: per the contract the scatter list names readable memory.
        Payload::Inline(unsafe { inline_from_sgl(&sgl) }?)
    } else {
        Payload::Sgl(sgl)
    };
    Ok(SendWr {
        wr_id: wr.wr_id,
        op,
        payload,
        flags: SendFlags {
            signaled: sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0,
            solicited: wr.send_flags & IBV_SEND_SOLICITED != 0,
            fence: wr.send_flags & IBV_SEND_FENCE != 0,
        },
    })
}

/// Posts one engine request on `qp` (`ud` names the destination of a
/// datagram QP's request).
pub fn post_one(qp: &QpObj, wr: SendWr, ud: Option<(&AhObj, u32)>) -> Result<(), c_int> {
    let st = qp.state();
    match &qp.kind {
        QpKind::Rc(q) => {
            // RTR is accepted too: an iWARP connection carries both
            // directions once up, and perftest's iWARP send-credit flow has
            // its server write credits from a QP it left in RTR.
            if !matches!(st, IBV_QPS_RTR | IBV_QPS_RTS | IBV_QPS_SQD | IBV_QPS_ERR) {
                return Err(libc::EINVAL);
            }
            match q.post_send(wr) {
                Ok(()) => Ok(()),
                Err(QpError::NotConnected) if matches!(st, IBV_QPS_RTR | IBV_QPS_RTS) => {
                    wait_connected(qp, q)?;
                    q.post_send(wr).map_err(qp_error_errno)
                }
                Err(e) => Err(qp_error_errno(e)),
            }
        }
        QpKind::Dgram(d) => {
            // RTR too, as for RC: perftest's iWARP send-credit flow sends
            // from a server QP it left in RTR.
            if st != IBV_QPS_RTS && st != IBV_QPS_RTR {
                return Err(libc::EINVAL);
            }
            let (ah, qpn) = ud.ok_or(libc::EINVAL)?;
            let dest = ah.dest(qpn)?;
            crate::export::debug!("QP {:#x}: {:?} to {dest:?}", qp.qpn(), wr.op);
            d.post_send(wr, dest).map_err(qp_error_errno)
        }
    }
}

fn wait_connected(qp: &QpObj, q: &engine::Qp) -> Result<(), c_int> {
    let e = engine()?;
    e.ib_conn()
        .wait_connected(q, qp.qpn(), CONNECT_WAIT)
        .map_err(|err| {
            eprintln!("softrdma: QP {:#x}: {err}", qp.qpn());
            libc::ENOTCONN
        })
}

/// `ops.post_send`.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    crate::export::guard_errno(|| {
        // SAFETY: the application passes a QP of ours.
        let Some(q) = (unsafe { qp_from_raw(qp) }) else {
            return libc::EINVAL;
        };
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a request of the application's linked list.
            let w = unsafe { &*cur };
            // SAFETY: the request's scatter list is the application's.
            let r = unsafe { send_wr_from_c(q, w) }.and_then(|sw| {
                let ud = if q.dgram().is_some() {
                    // SAFETY: the union's ud member for a datagram QP.
                    let u = unsafe { w.wr.ud };
                    let ah = ah_checked(u.ah).ok_or(libc::EINVAL)?;
                    Some((ah, u.remote_qpn))
                } else {
                    None
                };
                post_one(q, sw, ud)
            });
            if let Err(e) = r {
                crate::export::debug!(
                    "post_send on QP {:#x} (state {}): opcode {} flags {:#x} sge {}: errno {e}",
                    q.qpn(),
                    q.state(),
                    w.opcode,
                    w.send_flags,
                    w.num_sge
                );
                if !bad.is_null() {
                    // SAFETY: the application's out-pointer.
                    unsafe { *bad = cur };
                }
                return e;
            }
            cur = w.next;
        }
        0
    })
}

/// The engine receive for a C receive request.
///
/// # Safety
/// `wr` must be readable, its scatter list too.
unsafe fn recv_wr_from_c(wr: &ibv_recv_wr) -> Result<RecvWr, c_int> {
    Ok(RecvWr {
        wr_id: wr.wr_id,
        // SAFETY: per the contract.
        sgl: unsafe { sgl_from_c(wr.sg_list, wr.num_sge) }?,
    })
}

/// Walks a receive list, posting each with `f`.
///
/// # Safety
/// `wr` must be NULL or a readable list.
unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    mut f: impl FnMut(RecvWr) -> Result<(), c_int>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: per the contract.
        let w = unsafe { &*cur };
        // SAFETY: per the contract.
        if let Err(e) = unsafe { recv_wr_from_c(w) }.and_then(&mut f) {
            if !bad.is_null() {
                // SAFETY: the application's out-pointer.
                unsafe { *bad = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// `ops.post_recv`.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    crate::export::guard_errno(|| {
        // SAFETY: the application passes a QP of ours.
        let Some(q) = (unsafe { qp_from_raw(qp) }) else {
            return libc::EINVAL;
        };
        if q.state() == IBV_QPS_RESET {
            // ibv_post_recv(3): the first request is the failing one.
            if !bad.is_null() {
                // SAFETY: the application's out-pointer.
                unsafe { *bad = wr };
            }
            return libc::EINVAL;
        }
        // SAFETY: the application's list.
        unsafe {
            post_recv_list(wr, bad, |rw| match &q.kind {
                QpKind::Rc(r) => r.post_recv(rw).map_err(qp_error_errno),
                QpKind::Dgram(d) => d.post_recv(rw).map_err(qp_error_errno),
            })
        }
    })
}

/// `ops.post_srq_recv`.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    crate::export::guard_errno(|| {
        // SAFETY: the application passes an SRQ of ours.
        let Some(s) = (unsafe { srq_from_raw(srq) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the application's list.
        unsafe { post_recv_list(wr, bad, |rw| s.engine.post_recv(rw).map_err(qp_error_errno)) }
    })
}

/// A C work completion from an engine one.
pub fn wc_to_c(c: &Completion) -> ibv_wc {
    let wc = &c.wc;
    let mut flags = 0;
    let mut imm = 0u32;
    if let Some(i) = wc.imm {
        flags |= IBV_WC_WITH_IMM;
        imm = i.to_be();
    } else if let Some(r) = wc.invalidated {
        flags |= IBV_WC_WITH_INV;
        imm = r;
    }
    let mut src_qp = 0;
    if let Some(src) = wc.src {
        src_qp = src.qpn;
        if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
            && wc.status == WcStatus::Success
        {
            // Every datagram QP of this library is created with a GRH in
            // front of received payloads (as UD verbs has it).
            flags |= IBV_WC_GRH;
        }
    }
    ibv_wc {
        wr_id: wc.wr_id,
        status: wc.status.ibv_code() as c_int,
        opcode: wc.opcode.ibv_code() as c_int,
        vendor_err: 0,
        byte_len: wc.byte_len,
        imm_data: imm,
        qp_num: c.qp_num,
        src_qp,
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: 0,
        dlid_path_bits: 0,
    }
}

/// An empty engine completion (for buffers).
pub fn empty_completion() -> Completion {
    Completion {
        wc: softrdma_proto::wr::WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }
}

/// Takes up to `out.len()` completions of `c`: first those handed back by
/// [`QpObj::release_deferred`], then the engine's, holding back receive
/// flushes of IB-style QPs the application has not moved to ERR.
///
/// Why: a peer that destroys its QP closes the TCP connection under an
/// IB-style RC QP, and the engine then flushes the posted receives
/// (iWARP semantics). In IB the peer's QP is simply gone: our receives
/// stay posted, and only flush when the application moves the QP to ERR
/// (or never, if it destroys it). `ibv_rc_pingpong` polls its last good
/// completion in the same batch as such flushes and fails on them.
pub fn poll_filtered(c: &CqObj, out: &mut [Completion]) -> usize {
    let mut got = 0;
    if c.has_pending.load(std::sync::atomic::Ordering::Acquire) {
        let mut p = c.pending.lock().unwrap_or_else(|e| e.into_inner());
        while got < out.len() {
            match p.pop_front() {
                Some(x) => {
                    out[got] = x;
                    got += 1;
                }
                None => break,
            }
        }
        if p.is_empty() {
            c.has_pending
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }
    while got < out.len() {
        let n = c.engine.poll(&mut out[got..]);
        if n == 0 {
            break;
        }
        // Compact, dropping held-back flushes.
        let mut w = got;
        for r in got..got + n {
            let mut x = out[r];
            if !hold_back(&mut x, &c.engine) {
                out[w] = x;
                w += 1;
            }
        }
        if w == got + n {
            return w;
        }
        got = w;
    }
    got
}

/// True (and the completion kept back) for a flush of an IB-style QP that
/// the application has not moved to ERR: a receive flush is kept on its
/// QP, a send-side flush in [`HELD_SENDS`]. A UC QP's send-side flush is
/// turned into the success it would be in IB (nothing acknowledges UC).
fn hold_back(x: &mut Completion, cq: &std::sync::Arc<engine::Cq>) -> bool {
    let recv = matches!(x.wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
    if x.wc.status == WcStatus::Success {
        return false;
    }
    let Some(qp) = qp_by_num(x.qp_num) else {
        return false;
    };
    // SAFETY: registered QPs are live (ibv_destroy_qp unregisters before freeing; the verbs contract forbids destroying a QP while polling for it).
    let q = unsafe { &*qp };
    if !q.ib_style.load(std::sync::atomic::Ordering::Acquire) || q.state() == IBV_QPS_ERR {
        return false;
    }
    if !recv {
        if q.qp_type == IBV_QPT_UC && x.wc.status == WcStatus::WrFlushErr {
            // UC has no acknowledgements: a send to a peer QP that is
            // gone leaves the wire and completes (IB drops it silently).
            x.wc.status = WcStatus::Success;
            return false;
        }
        return hold_send(q, x, cq);
    }
    if x.wc.status != WcStatus::WrFlushErr {
        return false;
    }
    q.deferred
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(*x);
    true
}

/// Send-side completions held back per IB-style QP (by QP number).
///
/// Why: when the peer destroys its QP, the TCP connection under an
/// IB-style RC QP closes and the engine flushes the sends still queued at
/// once (iWARP semantics). In IB nothing tells the requester that the
/// peer QP is gone: it retransmits until its retry budget is spent (the
/// QP's `timeout` and `retry_cnt`: 4.096 µs × 2^timeout per try, `retry_cnt`
/// retries), then completes the oldest send with `IBV_WC_RETRY_EXC_ERR`
/// and flushes the rest. Benchmarks such as qperf stop both ends on their
/// own timers and destroy their QPs without a handshake, so the side that
/// stops a few milliseconds later must not see errors in the meantime.
/// A send-side error other than a flush (the QP's own failure) releases
/// the QP at once: its flushes follow it unheld, as in IB.
static HELD_SENDS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<u32, HeldSends>>,
> = std::sync::LazyLock::new(Default::default);

enum HeldSends {
    /// Flushes waiting for the retry budget to run out.
    Held {
        wcs: Vec<Completion>,
        cq: std::sync::Arc<engine::Cq>,
    },
    /// Send-side completions of this QP pass unheld from now on.
    Released,
}

/// IB's transport timer: 4.096 µs × 2^`timeout` (0 is infinite: taken as
/// the largest value, 31), times the tries (`retry_cnt` + 1).
fn retry_budget(timeout: u8, retry_cnt: u8) -> Duration {
    let t = if timeout == 0 { 31 } else { timeout.min(31) };
    let one = Duration::from_nanos(4096u64 << t);
    one * (u32::from(retry_cnt.min(7)) + 1)
}

fn held_sends() -> std::sync::MutexGuard<'static, std::collections::HashMap<u32, HeldSends>> {
    HELD_SENDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Holds a send-side flush of the IB-style QP `q` (see [`HELD_SENDS`]).
fn hold_send(q: &QpObj, x: &Completion, cq: &std::sync::Arc<engine::Cq>) -> bool {
    let qpn = q.qpn();
    let mut h = held_sends();
    if x.wc.status != WcStatus::WrFlushErr {
        h.insert(qpn, HeldSends::Released);
        return false;
    }
    match h.get_mut(&qpn) {
        Some(HeldSends::Released) => false,
        Some(HeldSends::Held { wcs, .. }) => {
            wcs.push(*x);
            true
        }
        None => {
            let (timeout, retry_cnt) = {
                let r = q.remembered.lock().unwrap_or_else(|e| e.into_inner());
                (r.attr.timeout, r.attr.retry_cnt)
            };
            let budget = retry_budget(timeout, retry_cnt);
            let spawned = std::thread::Builder::new()
                .name("softrdma-retry".into())
                .spawn(move || {
                    std::thread::sleep(budget);
                    release_held_sends(qpn, true);
                });
            if spawned.is_err() {
                return false;
            }
            h.insert(
                qpn,
                HeldSends::Held {
                    wcs: vec![*x],
                    cq: cq.clone(),
                },
            );
            true
        }
    }
}

/// Hands the held send-side completions of QP `qpn` to its send CQ (the
/// oldest as `IBV_WC_RETRY_EXC_ERR` when `retry_exceeded`, the rest as
/// flushes); later ones pass unheld.
pub fn release_held_sends(qpn: u32, retry_exceeded: bool) {
    let mut h = held_sends();
    let Some(HeldSends::Held { mut wcs, cq }) = h.insert(qpn, HeldSends::Released) else {
        return;
    };
    drop(h);
    if retry_exceeded {
        if let Some(first) = wcs.first_mut() {
            first.wc.status = WcStatus::RetryExcErr;
        }
    }
    cq.inject(&wcs);
}

/// Forgets QP `qpn`'s held send-side completions (the QP is destroyed).
pub fn forget_held_sends(qpn: u32) {
    held_sends().remove(&qpn);
}

/// `ops.poll_cq`.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    crate::export::guard(-1, || {
        // SAFETY: the application passes a CQ of ours.
        let Some(c) = (unsafe { cq_from_raw(cq) }) else {
            return -1;
        };
        if n <= 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let mut buf = [empty_completion(); 16];
        let mut got = 0usize;
        let want = n as usize;
        while got < want {
            let k = (want - got).min(buf.len());
            let m = poll_filtered(c, &mut buf[..k]);
            for (i, e) in buf[..m].iter().enumerate() {
                // SAFETY: wc has n entries (verbs contract); got + i < n.
                unsafe { *wc.add(got + i) = wc_to_c(e) };
            }
            got += m;
            if m < k {
                break;
            }
        }
        got as c_int
    })
}

/// `ops.req_notify_cq`.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    crate::export::guard_errno(|| {
        // SAFETY: the application passes a CQ of ours.
        let Some(c) = (unsafe { cq_from_raw(cq) }) else {
            return libc::EINVAL;
        };
        c.engine.req_notify(solicited_only != 0);
        0
    })
}
