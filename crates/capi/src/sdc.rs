//! The C API of SoftDC, softrdma's software dynamically connected
//! transport (`ibv_sdc_*` in `include/softrdma/verbs.h`, version node
//! `SOFTRDMA_1.1`; the design is `docs/dc.md`).
//!
//! * `ibv_sdc_create_dct(pd, cq, srq, dc_key, attr)` → `struct
//!   ibv_sdc_dct *` ([`DctObj`] over an engine [`edc::Dct`]): incoming
//!   Sends and Writes with immediate take receives from the `ibv_srq`'s
//!   engine SRQ and complete into the `ibv_cq`'s engine CQ, so the
//!   application polls and arms them with the ordinary `ibv_poll_cq` /
//!   `ibv_req_notify_cq` / completion channel.
//! * `ibv_sdc_create_qp(pd, init_attr)` → `struct ibv_sdc_qp *`
//!   ([`DciObj`] over an engine [`edc::Dci`]): a DC initiator completing
//!   into `init_attr->send_cq`; its completions carry `qp_num` =
//!   `dci->qp_num`. A DCI is deliberately **not** an `ibv_qp`: it has no
//!   state machine, no receive queue and no destination of its own, so
//!   `ibv_modify_qp`, `ibv_post_recv` and a plain `ibv_post_send` would all
//!   be errors on it; a distinct type lets the compiler say so.
//! * `ibv_sdc_create_ah(pd, sockaddr)` → an ordinary `struct ibv_ah *`
//!   (destroyed by `ibv_sdc_destroy_ah` or `ibv_destroy_ah`); an AH from
//!   `ibv_create_ah` with a GRH works as well. One AH serves any number of
//!   DCIs, DCTs numbers and threads.
//! * `ibv_sdc_post_send(dci, wr, dest, num_dest, bad_wr)`: the chain of
//!   ordinary `ibv_send_wr`s (Send ± imm ± invalidate, Write ± imm, Read,
//!   atomics; converted as `ibv_post_send` does), each with its own
//!   destination `struct ibv_sdc_dest { ah, dct_num, dc_key }` from the
//!   parallel array `dest` (or all to `dest[0]` when `num_dest == 1`).
//!
//! The context's DC service (connection table, invitation protocol) is
//! set up by the first DCI or DCT of the process (there is one engine per
//! process: [`crate::objects::engine`]); `struct ibv_sdc_attr` of that
//! first call sets its options, later ones are ignored.
//!
//! Errors: functions returning a pointer return NULL with `errno`; the
//! others return an errno value (0 on success), as rdma-core's destroy and
//! post calls do. EINVAL for NULL or inconsistent arguments, EOPNOTSUPP for
//! what DC does not carry (Write-Record, a genuinely IPv6 address, unknown
//! `comp_mask` bits), ENOMEM when the send queue is full.

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use softrdma_engine::dc as edc;
use softrdma_engine::QpError;
use softrdma_proto::dc::DcTarget;
use softrdma_proto::wr::{DgramAddr, MAX_INLINE, MAX_SGE};

use crate::abi::*;
use crate::export::{export, guard, guard_errno, guard_ptr};
use crate::objects::*;

/// `ibv_sdc_attr.comp_mask`: `capacity` is valid.
pub const IBV_SDC_ATTR_CAPACITY: u32 = 1 << 0;
/// `ibv_sdc_attr.comp_mask`: `idle_timeout_ms` is valid.
pub const IBV_SDC_ATTR_IDLE_TIMEOUT: u32 = 1 << 1;
/// `ibv_sdc_attr.comp_mask`: `invite_timeout_ms` is valid.
pub const IBV_SDC_ATTR_INVITE_TIMEOUT: u32 = 1 << 2;
const ATTR_ALL: u32 =
    IBV_SDC_ATTR_CAPACITY | IBV_SDC_ATTR_IDLE_TIMEOUT | IBV_SDC_ATTR_INVITE_TIMEOUT;

/// `struct ibv_sdc_attr`: options of the process's DC service, taken
/// from the first DCI or DCT created (NULL or a zero `comp_mask`: the
/// defaults: 16 connections, 2 s idle timeout, 2 s invitation timeout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sdc_attr {
    /// Which of the fields below are set (`IBV_SDC_ATTR_*`).
    pub comp_mask: u32,
    /// Most connections at once (initiator and target side together).
    pub capacity: u32,
    /// An idle initiator connection is closed after this long (ms).
    pub idle_timeout_ms: u32,
    /// An unanswered invitation fails its work requests after this long
    /// (ms).
    pub invite_timeout_ms: u32,
}

/// `struct ibv_sdc_dct`: what the application sees of a DC target.
#[repr(C)]
pub struct ibv_sdc_dct {
    /// The PD's context.
    pub context: *mut ibv_context,
    /// The application's pointer, untouched.
    pub dct_context: *mut c_void,
    /// Its protection domain.
    pub pd: *mut ibv_pd,
    /// Where its receive completions go.
    pub cq: *mut ibv_cq,
    /// Whose receives incoming Sends consume.
    pub srq: *mut ibv_srq,
    /// The DC access key initiators must present.
    pub dc_key: u64,
    /// The number initiators address (`ibv_sdc_dest.dct_num`).
    pub dct_num: u32,
}

/// `struct ibv_sdc_qp_init_attr`.
#[repr(C)]
pub struct ibv_sdc_qp_init_attr {
    /// Copied to `ibv_sdc_qp.qp_context`.
    pub qp_context: *mut c_void,
    /// Where its completions go.
    pub send_cq: *mut ibv_cq,
    /// `max_send_wr`, `max_send_sge`, `max_inline_data` (updated to what
    /// was granted); the receive fields must be 0.
    pub cap: ibv_qp_cap,
    /// Every work request completes (as `ibv_qp_init_attr.sq_sig_all`).
    pub sq_sig_all: c_int,
    /// Service options (NULL: defaults; see [`ibv_sdc_attr`]).
    pub sdc_attr: *const ibv_sdc_attr,
}

/// `struct ibv_sdc_qp`: what the application sees of a DC initiator.
#[repr(C)]
pub struct ibv_sdc_qp {
    /// The PD's context.
    pub context: *mut ibv_context,
    /// The application's pointer, untouched.
    pub qp_context: *mut c_void,
    /// Its protection domain.
    pub pd: *mut ibv_pd,
    /// Where its completions go.
    pub send_cq: *mut ibv_cq,
    /// The number its completions carry (`ibv_wc.qp_num`).
    pub qp_num: u32,
    /// The capabilities granted.
    pub cap: ibv_qp_cap,
    /// `sq_sig_all` as created.
    pub sq_sig_all: c_int,
}

/// `struct ibv_sdc_dest`: where one work request of
/// `ibv_sdc_post_send` goes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_sdc_dest {
    /// The target's address (`ibv_sdc_create_ah` or `ibv_create_ah`).
    pub ah: *mut ibv_ah,
    /// The DCT number (`ibv_sdc_dct.dct_num` at the target).
    pub dct_num: u32,
    /// The DC access key.
    pub dc_key: u64,
}

/// `struct ibv_sdc_stats`: DC counters (`ibv_sdc_query_dct`,
/// `ibv_sdc_query_qp`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sdc_stats {
    /// This DCT: invitations rejected for a wrong key (0 for a DCI).
    pub dct_rejected: u64,
    /// This DCI: work requests posted and not yet completed (0 for a
    /// DCT).
    pub outstanding: u64,
    /// Service: invitations sent (first transmissions).
    pub invites: u64,
    /// Service: invitation retransmissions.
    pub retransmits: u64,
    /// Service: invitations that timed out.
    pub timeouts: u64,
    /// Service: invitations rejected for a wrong key (all DCTs).
    pub rejected_bad_key: u64,
    /// Service: invitations rejected for an unknown DCT.
    pub rejected_no_dct: u64,
    /// Service: invitations rejected because every slot was busy.
    pub rejected_busy: u64,
    /// Service: idle connections closed to make room.
    pub evictions: u64,
    /// Service: idle connections closed after the idle timeout.
    pub idle_closes: u64,
    /// Service: connections accepted on the target side.
    pub target_accepts: u64,
    /// Service: connection table capacity.
    pub capacity: u32,
    /// Service: slots in use now.
    pub live: u32,
    /// Service: highest number of slots in use at once.
    pub max_live: u32,
    /// Service: RC QPs that exist now.
    pub rc_qps: u32,
}

/// A DC target: the C struct first (the application's pointer is ours).
#[repr(C)]
pub struct DctObj {
    /// What the application sees.
    pub dct: ibv_sdc_dct,
    /// The engine DCT (dropping it destroys it).
    pub engine: edc::Dct,
}

/// A DC initiator: the C struct first.
#[repr(C)]
pub struct DciObj {
    /// What the application sees.
    pub qp: ibv_sdc_qp,
    /// The engine DCI.
    pub engine: edc::Dci,
    /// Its protection domain's number.
    pub pd_num: u32,
}

fn ms(v: u32) -> Result<Duration, c_int> {
    if v == 0 {
        return Err(libc::EINVAL);
    }
    Ok(Duration::from_millis(u64::from(v)))
}

/// The service options an `ibv_sdc_attr` (or NULL) asks for.
fn options(attr: *const ibv_sdc_attr) -> Result<edc::DcOptions, c_int> {
    let mut o = edc::DcOptions::default();
    // SAFETY: the application's attributes or NULL.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return Ok(o);
    };
    if a.comp_mask & !ATTR_ALL != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if a.comp_mask & IBV_SDC_ATTR_CAPACITY != 0 {
        if a.capacity == 0 {
            return Err(libc::EINVAL);
        }
        o.table.capacity = a.capacity as usize;
    }
    if a.comp_mask & IBV_SDC_ATTR_IDLE_TIMEOUT != 0 {
        o.table.idle_timeout = ms(a.idle_timeout_ms)?;
    }
    if a.comp_mask & IBV_SDC_ATTR_INVITE_TIMEOUT != 0 {
        o.table.invite_timeout = ms(a.invite_timeout_ms)?;
    }
    Ok(o)
}

fn dc_errno(e: edc::DcError) -> c_int {
    crate::export::debug!("DC: {e}");
    match e {
        edc::DcError::Io(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
        edc::DcError::Dgram(_) => libc::EADDRNOTAVAIL,
        edc::DcError::Register => libc::ENOMEM,
    }
}

fn service(attr: *const ibv_sdc_attr) -> Result<std::sync::Arc<edc::DcService>, c_int> {
    let opts = options(attr)?;
    edc::DcService::of(engine()?, opts).map_err(dc_errno)
}

/// `ibv_sdc_create_dct`: a DC target in `pd` with access key `dc_key`,
/// consuming receives of `srq` (same PD) and completing into `cq`.
pub unsafe extern "C" fn ibv_sdc_create_dct(
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    dc_key: u64,
    attr: *const ibv_sdc_attr,
) -> *mut ibv_sdc_dct {
    guard_ptr(|| {
        // SAFETY: the application's PD, CQ and SRQ (verbs contract) or NULL.
        let (p, c, s) = unsafe { (pd_from_raw(pd), cq_from_raw(cq), srq_from_raw(srq)) };
        let (Some(p), Some(c), Some(s)) = (p, c, s) else {
            return Err(libc::EINVAL);
        };
        if s.pd_num != p.num {
            return Err(libc::EINVAL);
        }
        let svc = service(attr)?;
        let dct = edc::Dct::new(&svc, p.num, c.engine.clone(), s.engine.clone(), dc_key)
            .map_err(dc_errno)?;
        let o = Box::new(DctObj {
            dct: ibv_sdc_dct {
                context: p.pd.context,
                dct_context: std::ptr::null_mut(),
                pd,
                cq,
                srq,
                dc_key,
                dct_num: dct.number(),
            },
            engine: dct,
        });
        p.users.hold();
        c.users.hold();
        s.users.hold();
        Ok(Box::into_raw(o) as *mut ibv_sdc_dct)
    })
}

/// `ibv_sdc_destroy_dct`: 0 or an errno.
pub unsafe extern "C" fn ibv_sdc_destroy_dct(dct: *mut ibv_sdc_dct) -> c_int {
    guard_errno(|| {
        if dct.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a DCT of ours (Box::into_raw in ibv_sdc_create_dct), destroyed once (verbs contract).
        let d = unsafe { Box::from_raw(dct as *mut DctObj) };
        // SAFETY: the DCT's PD, CQ and SRQ, live (none can go while the DCT names it).
        unsafe {
            release_pd(d.dct.pd);
            release_cq(d.dct.cq);
            release_srq(d.dct.srq);
        }
        0
    })
}

/// `ibv_sdc_create_qp`: a DC initiator in `pd`.
pub unsafe extern "C" fn ibv_sdc_create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_sdc_qp_init_attr,
) -> *mut ibv_sdc_qp {
    guard_ptr(|| {
        // SAFETY: the application's PD or NULL.
        let p = unsafe { pd_from_raw(pd) }.ok_or(libc::EINVAL)?;
        // SAFETY: the application's attributes or NULL.
        let a = unsafe { init_attr.as_mut() }.ok_or(libc::EINVAL)?;
        // SAFETY: the application's CQ or NULL.
        let c = unsafe { cq_from_raw(a.send_cq) }.ok_or(libc::EINVAL)?;
        let cap = &mut a.cap;
        if cap.max_send_wr > crate::device::MAX_QP_WR as u32
            || cap.max_send_sge > MAX_SGE as u32
            || cap.max_inline_data > MAX_INLINE as u32
        {
            return Err(libc::EINVAL);
        }
        if cap.max_recv_wr != 0 || cap.max_recv_sge != 0 {
            // A DCI has no receive queue (receives are the DCT's SRQ's).
            return Err(libc::EINVAL);
        }
        let svc = service(a.sdc_attr)?;
        cap.max_send_wr = cap.max_send_wr.max(1);
        cap.max_send_sge = MAX_SGE as u32;
        cap.max_inline_data = MAX_INLINE as u32;
        let dci = edc::Dci::new(&svc, p.num, c.engine.clone(), cap.max_send_wr as usize);
        let o = Box::new(DciObj {
            qp: ibv_sdc_qp {
                context: p.pd.context,
                qp_context: a.qp_context,
                pd,
                send_cq: a.send_cq,
                qp_num: dci.qp_num(),
                cap: *cap,
                sq_sig_all: c_int::from(a.sq_sig_all != 0),
            },
            engine: dci,
            pd_num: p.num,
        });
        p.users.hold();
        c.users.hold();
        Ok(Box::into_raw(o) as *mut ibv_sdc_qp)
    })
}

/// `ibv_sdc_destroy_qp`: 0 or an errno. Work requests not completed yet
/// are dropped without completions (destroy the DCI once they are).
pub unsafe extern "C" fn ibv_sdc_destroy_qp(qp: *mut ibv_sdc_qp) -> c_int {
    guard_errno(|| {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a DCI of ours (Box::into_raw in ibv_sdc_create_qp), destroyed once (verbs contract).
        let d = unsafe { Box::from_raw(qp as *mut DciObj) };
        // SAFETY: the DCI's PD and CQ, live (neither can go while the DCI names it).
        unsafe {
            release_pd(d.qp.pd);
            release_cq(d.qp.send_cq);
        }
        0
    })
}

/// The IP address of a `sockaddr_in`/`sockaddr_in6` (IPv4-mapped IPv6
/// becomes IPv4).
///
/// # Safety
/// `sa` must be NULL or point at a socket address as large as its family
/// says.
unsafe fn ip_of_sockaddr(sa: *const libc::sockaddr) -> Result<IpAddr, c_int> {
    // SAFETY: per the contract.
    let fam = unsafe { sa.as_ref() }.ok_or(libc::EINVAL)?.sa_family;
    match c_int::from(fam) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in (per the contract).
            let a = unsafe { &*(sa as *const libc::sockaddr_in) };
            Ok(IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6 (per the contract).
            let a = unsafe { &*(sa as *const libc::sockaddr_in6) };
            let v6 = Ipv6Addr::from(a.sin6_addr.s6_addr);
            match v6.to_ipv4_mapped() {
                Some(v4) => Ok(IpAddr::V4(v4)),
                // The DC service's sockets are IPv4.
                None => Err(libc::EOPNOTSUPP),
            }
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// `ibv_sdc_create_ah`: an address handle for the DCTs at `addr`'s IP
/// (the port is ignored: a DCT number names its port). An ordinary
/// `ibv_ah`, shareable between DCIs and threads.
pub unsafe extern "C" fn ibv_sdc_create_ah(
    pd: *mut ibv_pd,
    addr: *const libc::sockaddr,
) -> *mut ibv_ah {
    guard_ptr(|| {
        // SAFETY: the application's address or NULL.
        let ip = unsafe { ip_of_sockaddr(addr) }?;
        if ip.is_unspecified() || ip.is_multicast() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the application's PD or NULL (EINVAL).
        unsafe { create_ah(pd, ip, None) }
    })
}

/// `ibv_sdc_destroy_ah`: `ibv_destroy_ah`.
pub unsafe extern "C" fn ibv_sdc_destroy_ah(ah: *mut ibv_ah) -> c_int {
    // SAFETY: forwarded (ibv_destroy_ah checks the AH against the live set).
    unsafe { crate::verbs_api::ibv_destroy_ah(ah) }
}

fn post_errno(e: QpError) -> c_int {
    match e {
        QpError::QueueFull => libc::ENOMEM,
        QpError::NotConnected => libc::ENOTCONN,
        QpError::Unsupported => libc::EOPNOTSUPP,
        QpError::Invalid => libc::EINVAL,
    }
}

/// The engine destination of one `ibv_sdc_dest` for a DCI of PD `pd`.
fn target(q: &DciObj, d: &ibv_sdc_dest) -> Result<DcTarget, c_int> {
    let ah = ah_checked(d.ah).ok_or(libc::EINVAL)?;
    if ah.ah.pd != q.qp.pd {
        return Err(libc::EINVAL);
    }
    let ip = ah.ip;
    if ip.to_canonical().is_multicast() || ip.is_unspecified() {
        return Err(libc::EINVAL);
    }
    // 24 bits, and a port: a number below 256 would send the
    // invitation to UDP port 0, which no DCT has.
    if d.dct_num > 0x00ff_ffff || d.dct_num >> 8 == 0 {
        return Err(libc::EINVAL);
    }
    // A DCT number is `(udp_port << 8) | slot` like every softrdma
    // datagram QP, whatever port the AH may remember.
    Ok(DcTarget {
        addr: DgramAddr {
            ip,
            port: (d.dct_num >> 8) as u16,
            qpn: d.dct_num,
        },
        key: d.dc_key,
        local: q.pd_num,
    })
}

/// `ibv_sdc_post_send`: posts the chain `wr` on DCI `qp`, the i-th
/// request to `dest[i]` (`num_dest` entries; with `num_dest == 1` all go
/// to `dest[0]`). Returns 0, or an errno with `*bad_wr` naming the first
/// request not posted (those before it were).
pub unsafe extern "C" fn ibv_sdc_post_send(
    qp: *mut ibv_sdc_qp,
    wr: *mut ibv_send_wr,
    dest: *const ibv_sdc_dest,
    num_dest: usize,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard_errno(|| {
        let fail = |cur: *mut ibv_send_wr, e: c_int| {
            if !bad_wr.is_null() {
                // SAFETY: the application's out-pointer.
                unsafe { *bad_wr = cur };
            }
            e
        };
        // SAFETY: a DCI of ours or NULL (verbs contract).
        let Some(q) = (unsafe { (qp as *const DciObj).as_ref() }) else {
            return fail(wr, libc::EINVAL);
        };
        if dest.is_null() || num_dest == 0 {
            return fail(wr, libc::EINVAL);
        }
        let mut cur = wr;
        let mut i = 0usize;
        while !cur.is_null() {
            // SAFETY: a request of the application's list.
            let w = unsafe { &*cur };
            let k = if num_dest == 1 { 0 } else { i };
            if k >= num_dest {
                return fail(cur, libc::EINVAL);
            }
            // SAFETY: the application's array of num_dest entries; k < num_dest.
            let d = unsafe { &*dest.add(k) };
            // SAFETY: the request's scatter list is the application's.
            let r = unsafe { crate::datapath::send_wr_from_c_sig(w, q.qp.sq_sig_all != 0) }
                .and_then(|sw| {
                    let t = target(q, d)?;
                    q.engine.post_send(sw, t).map_err(post_errno)
                });
            if let Err(e) = r {
                crate::export::debug!(
                    "ibv_sdc_post_send on DCI {}: opcode {} to DCT {:#x}: errno {e}",
                    q.qp.qp_num,
                    w.opcode,
                    d.dct_num
                );
                return fail(cur, e);
            }
            cur = w.next;
            i += 1;
        }
        0
    })
}

fn fill(out: &mut ibv_sdc_stats, s: edc::DcServiceStats, capacity: usize) {
    let t = s.table;
    out.invites = t.invites;
    out.retransmits = t.retransmits;
    out.timeouts = t.timeouts;
    out.rejected_bad_key = t.rejected_bad_key;
    out.rejected_no_dct = t.rejected_no_dct;
    out.rejected_busy = t.rejected_busy;
    out.evictions = t.evictions;
    out.idle_closes = t.idle_closes;
    out.target_accepts = t.target_accepts;
    out.capacity = capacity.min(u32::MAX as usize) as u32;
    out.live = s.live.min(u32::MAX as usize) as u32;
    out.max_live = t.max_live.min(u32::MAX as usize) as u32;
    out.rc_qps = s.rc_qps.min(u32::MAX as usize) as u32;
}

/// `ibv_sdc_query_dct`: this DCT's rejected invitations and the service's
/// counters; 0 or an errno.
pub unsafe extern "C" fn ibv_sdc_query_dct(
    dct: *mut ibv_sdc_dct,
    stats: *mut ibv_sdc_stats,
) -> c_int {
    guard_errno(|| {
        // SAFETY: a DCT of ours or NULL (verbs contract).
        let d = unsafe { (dct as *const DctObj).as_ref() };
        // SAFETY: the application's out-struct or NULL.
        let out = unsafe { stats.as_mut() };
        let (Some(d), Some(out)) = (d, out) else {
            return libc::EINVAL;
        };
        let svc = d.engine.service();
        let mut s = ibv_sdc_stats {
            dct_rejected: d.engine.rejected(),
            ..ibv_sdc_stats::default()
        };
        fill(&mut s, svc.stats(), svc.options().table.capacity);
        *out = s;
        0
    })
}

/// `ibv_sdc_query_qp`: this DCI's outstanding work requests and the
/// service's counters; 0 or an errno.
pub unsafe extern "C" fn ibv_sdc_query_qp(qp: *mut ibv_sdc_qp, stats: *mut ibv_sdc_stats) -> c_int {
    guard_errno(|| {
        // SAFETY: a DCI of ours or NULL (verbs contract).
        let q = unsafe { (qp as *const DciObj).as_ref() };
        // SAFETY: the application's out-struct or NULL.
        let out = unsafe { stats.as_mut() };
        let (Some(q), Some(out)) = (q, out) else {
            return libc::EINVAL;
        };
        let svc = q.engine.service();
        let mut s = ibv_sdc_stats {
            outstanding: q.engine.outstanding() as u64,
            ..ibv_sdc_stats::default()
        };
        fill(&mut s, svc.stats(), svc.options().table.capacity);
        *out = s;
        0
    })
}

/// `ibv_sdc_dct_lost_no_receive`: connections to `dct` that a Send
/// finding its SRQ empty failed (iWARP has no receiver-not-ready retry:
/// what that Send and the Sends behind it carried is lost, and nothing
/// else tells the target; `docs/dc.md` §4). 0 for NULL.
pub unsafe extern "C" fn ibv_sdc_dct_lost_no_receive(dct: *mut ibv_sdc_dct) -> u64 {
    guard(0, || {
        // SAFETY: a DCT of ours or NULL (verbs contract).
        let d = unsafe { (dct as *const DctObj).as_ref() };
        d.map_or(0, |d| d.engine.connections_lost_no_receive())
    })
}

export!(
    ibv_sdc_create_dct,
    ibv_sdc_destroy_dct,
    ibv_sdc_create_qp,
    ibv_sdc_destroy_qp,
    ibv_sdc_create_ah,
    ibv_sdc_destroy_ah,
    ibv_sdc_post_send,
    ibv_sdc_query_dct,
    ibv_sdc_query_qp,
    ibv_sdc_dct_lost_no_receive,
);
