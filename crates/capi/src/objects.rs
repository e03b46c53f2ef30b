//! How the C objects map to softrdma objects, and the crate-internal API
//! the verbs calls, [`crate::rdmacm`] and [`crate::rsocket`] share
//! (documented for the rdmacm side in `docs/capi.md`).
//!
//! Every C object is a heap allocation of a `#[repr(C)]` Rust struct whose
//! **first field is the C struct** the application sees (`ibv_pd`,
//! `ibv_cq_ex`, `ibv_qp_ex`, ...), so the application's pointer is also a
//! pointer to ours; `*_from_raw` turn one into the other. The context is
//! the exception the ABI dictates: the application gets
//! `&verbs_context.context`, the last field of `verbs_context`, which is
//! the first field of [`CtxObj`] ([`CtxObj::from_raw`] subtracts the
//! offset). Objects are created with `Box::into_raw` and freed by the
//! matching destroy call.
//!
//! There is exactly one softrdma engine per process ([`engine`]), shared
//! by every opened context, by rdma_cm and by rsockets, whichever of
//! libibverbs.so.1/librdmacm.so.1 is loaded first (librdmacm.so.1 forwards
//! into this library).
//!
//! Lifetime rules follow verbs: the application destroys children before
//! parents. PDs, CQs and SRQs carry a [`UseCount`] of the objects that
//! name them (AHs, SRQs and QPs on a PD — not MRs, see `ibv_dealloc_pd`;
//! QPs on their send and receive CQ; QPs on their SRQ; SoftDC DCTs on their PD, CQ and SRQ, DCIs
//! on their PD and CQ): `ibv_dealloc_pd`, `ibv_destroy_cq` and
//! `ibv_destroy_srq` return `EBUSY` and keep the object while it is not
//! zero, as rdma-core's providers do. Engine objects are reference
//! counted besides, so the count protects the application's pointers
//! (`qp->send_cq`, `dct->srq`, ...), not our memory.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::c_int;
use std::net::IpAddr;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use softrdma_engine as engine;
use softrdma_proto::wr::DgramAddr;

use crate::abi::*;
use crate::device::DevObj;

/// The process's one softrdma engine, created on first use. Fails (with
/// an errno) only if a `SOFTRDMA_*` variable is invalid or the system
/// refuses an eventfd.
pub fn engine() -> Result<&'static engine::Context, i32> {
    static ENGINE: OnceLock<Result<engine::Context, i32>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            engine::Context::new().map_err(|e| {
                eprintln!("softrdma: {e}");
                e.raw_os_error().unwrap_or(libc::EINVAL)
            })
        })
        .as_ref()
        .map_err(|e| *e)
}

// ---------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------

/// An opened device (`ibv_open_device`).
#[repr(C)]
pub struct CtxObj {
    /// The extended context; the application holds `&vctx.context`.
    pub vctx: verbs_context,
    /// The device it was opened on.
    pub dev: &'static DevObj,
    /// `async_fd`: the context's own view of the engine's async events.
    pub async_fd: AppFd,
}

/// A descriptor the application sees in place of an engine eventfd (a
/// completion channel's `fd`, a context's `async_fd`): an epoll
/// descriptor watching that eventfd, so it is readable exactly when the
/// eventfd is, and its file status flags are the application's alone.
/// The engine keeps its eventfds non-blocking for its own drains; an
/// `O_NONBLOCK` the application sets here is what `ibv_get_cq_event` and
/// `ibv_get_async_event` read to fail with `EAGAIN` instead of waiting.
/// Nobody reads from it, so nothing the application does to it (flags,
/// poll, epoll) can steal a wake-up from the engine.
#[derive(Debug)]
pub struct AppFd(std::os::fd::OwnedFd);

impl AppFd {
    /// An epoll descriptor (close-on-exec) watching `inner` for input.
    pub fn watching(inner: std::os::fd::RawFd) -> Result<AppFd, i32> {
        use std::os::fd::FromRawFd;
        // SAFETY: no pointers; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let own = AppFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        // SAFETY: our epoll descriptor, a live event struct.
        if unsafe { libc::epoll_ctl(fd, libc::EPOLL_CTL_ADD, inner, &mut ev) } < 0 {
            return Err(errno());
        }
        Ok(own)
    }

    /// The descriptor.
    pub fn raw(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }

    /// True when the application made the descriptor non-blocking.
    pub fn nonblocking(&self) -> bool {
        // SAFETY: no pointers; our descriptor.
        let fl = unsafe { libc::fcntl(self.raw(), libc::F_GETFL) };
        fl >= 0 && fl & libc::O_NONBLOCK != 0
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EMFILE)
}

impl CtxObj {
    /// Our object behind an application's `ibv_context`.
    ///
    /// # Safety
    /// `ctx` must be NULL or a context this library handed out and not yet
    /// closed.
    pub unsafe fn from_raw<'a>(ctx: *mut ibv_context) -> Option<&'a CtxObj> {
        if ctx.is_null() {
            return None;
        }
        let off = std::mem::offset_of!(verbs_context, context);
        // SAFETY: per the contract, ctx points at the `context` field of the `verbs_context` that starts a live CtxObj.
        Some(unsafe { &*((ctx as *mut u8).sub(off) as *const CtxObj) })
    }

    /// The pointer the application uses.
    pub fn raw(&self) -> *mut ibv_context {
        &self.vctx.context as *const ibv_context as *mut ibv_context
    }
}

/// The context rdma_cm hands out as `cm_id->verbs` for `dev`: one per
/// device, opened on first use and never closed (like librdmacm's
/// per-device contexts).
pub fn device_context(dev: &'static DevObj) -> Result<*mut ibv_context, i32> {
    static CTXS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let mut v = CTXS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = v.iter().find(|(d, _)| *d == dev.index) {
        return Ok(*c as *mut ibv_context);
    }
    let c = crate::verbs_api::open_context(dev)?;
    v.push((dev.index, c as usize));
    Ok(c)
}

// ---------------------------------------------------------------------
// Object registry (completion events and async events name objects by id)
// ---------------------------------------------------------------------

#[derive(Default)]
struct Registry {
    /// Engine CQ id -> `*mut CqObj`.
    cqs: HashMap<u64, usize>,
    /// QP number -> `*mut QpObj`.
    qps: HashMap<u32, usize>,
    /// Engine SRQ id -> `*mut SrqObj`.
    srqs: HashMap<u64, usize>,
    /// Live address handles (`*mut AhObj`): a send names its AH in the
    /// work request, and a stale or garbage pointer there must be an
    /// error, not a wild read.
    ahs: std::collections::HashSet<usize>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static REG: OnceLock<Mutex<Registry>> = OnceLock::new();
    REG.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn register_cq(id: u64, p: *mut CqObj) {
    registry().cqs.insert(id, p as usize);
}
pub(crate) fn unregister_cq(id: u64) {
    registry().cqs.remove(&id);
}
/// The CQ object with engine id `id`, if it still exists.
pub(crate) fn cq_by_id(id: u64) -> Option<*mut CqObj> {
    registry().cqs.get(&id).map(|p| *p as *mut CqObj)
}
pub(crate) fn register_qp(qpn: u32, p: *mut QpObj) {
    registry().qps.insert(qpn, p as usize);
}
pub(crate) fn unregister_qp(qpn: u32) {
    registry().qps.remove(&qpn);
}
/// The QP object numbered `qpn`, if it exists.
pub fn qp_by_num(qpn: u32) -> Option<*mut QpObj> {
    registry().qps.get(&qpn).map(|p| *p as *mut QpObj)
}
pub(crate) fn register_srq(id: u64, p: *mut SrqObj) {
    registry().srqs.insert(id, p as usize);
}
pub(crate) fn unregister_srq(id: u64) {
    registry().srqs.remove(&id);
}
pub(crate) fn srq_by_id(id: u64) -> Option<*mut SrqObj> {
    registry().srqs.get(&id).map(|p| *p as *mut SrqObj)
}
pub(crate) fn register_ah(p: *mut AhObj) {
    registry().ahs.insert(p as usize);
}
pub(crate) fn unregister_ah(p: *mut AhObj) {
    registry().ahs.remove(&(p as usize));
}
/// Our AH behind an `ibv_ah` the application names in a work request, if
/// it is a live AH of this library (checked against the registry, so a
/// garbage pointer is refused rather than read).
pub fn ah_checked<'a>(p: *mut ibv_ah) -> Option<&'a AhObj> {
    let live = registry().ahs.contains(&(p as usize));
    // SAFETY: registered AHs are live until ibv_destroy_ah unregisters them (verbs: not while a send naming it is being posted).
    live.then(|| unsafe { &*(p as *const AhObj) })
}

// ---------------------------------------------------------------------
// Use counts
// ---------------------------------------------------------------------

/// How many live objects name a PD, CQ or SRQ. Taken once an object
/// that names it has been created (after every step that can fail),
/// given back when that object is destroyed; while it is not zero the
/// PD/CQ/SRQ cannot be deallocated/destroyed (`EBUSY`, the object stays
/// usable).
#[derive(Debug, Default)]
pub struct UseCount(AtomicU32);

impl UseCount {
    /// One more user.
    pub fn hold(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    /// One user less (never below zero).
    pub fn release(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Some object still names it.
    pub fn in_use(&self) -> bool {
        self.0.load(Ordering::Acquire) != 0
    }
}

/// Gives back a use of the PD `pd` (NULL: nothing) that the
/// object being destroyed took when it was created.
///
/// # Safety
/// `pd` must be NULL or a live PD of this library.
pub unsafe fn release_pd(pd: *mut ibv_pd) {
    // SAFETY: per the contract.
    if let Some(p) = unsafe { pd_from_raw(pd) } {
        p.users.release();
    }
}

/// Gives back a use of the CQ `cq` (NULL: nothing) that the
/// object being destroyed took when it was created.
///
/// # Safety
/// `cq` must be NULL or a live CQ of this library.
pub unsafe fn release_cq(cq: *mut ibv_cq) {
    // SAFETY: per the contract.
    if let Some(c) = unsafe { cq_from_raw(cq) } {
        c.users.release();
    }
}

/// Gives back a use of the SRQ `srq` (NULL: nothing) that the
/// object being destroyed took when it was created.
///
/// # Safety
/// `srq` must be NULL or a live SRQ of this library.
pub unsafe fn release_srq(srq: *mut ibv_srq) {
    // SAFETY: per the contract.
    if let Some(s) = unsafe { srq_from_raw(srq) } {
        s.users.release();
    }
}

// ---------------------------------------------------------------------
// PD, MR, AH, channel, CQ, SRQ
// ---------------------------------------------------------------------

/// A protection domain.
#[repr(C)]
pub struct PdObj {
    /// What the application sees.
    pub pd: ibv_pd,
    /// The engine's PD number.
    pub num: u32,
    /// AHs, SRQs, QPs, DCTs and DCIs in this PD (MRs do not count).
    pub users: UseCount,
}

/// A memory region over application memory.
#[repr(C)]
pub struct MrObj {
    /// What the application sees (`lkey == rkey ==` the STag).
    pub mr: ibv_mr,
    /// The engine STag.
    pub stag: u32,
}

/// An address handle: where datagrams go.
#[repr(C)]
pub struct AhObj {
    /// What the application sees.
    pub ah: ibv_ah,
    /// The destination IP (from the GID; a multicast group for
    /// multicast).
    pub ip: IpAddr,
    /// The UDP port when known exactly (rdma_cm UD, `softrdma` AHs);
    /// `None`: taken from the remote QPN at post time (`qpn >> 8`).
    pub port: Option<u16>,
}

impl AhObj {
    /// The datagram destination for a send to `remote_qpn` through this
    /// handle (multicast groups map to the engine's multicast address).
    pub fn dest(&self, remote_qpn: u32) -> Result<DgramAddr, i32> {
        if self.ip.to_canonical().is_multicast() {
            return Ok(engine()?.mcast_dest(self.ip));
        }
        Ok(DgramAddr {
            ip: self.ip,
            port: self.port.unwrap_or((remote_qpn >> 8) as u16),
            qpn: remote_qpn & 0x00FF_FFFF,
        })
    }
}

/// A completion channel (a pollable eventfd).
#[repr(C)]
pub struct ChannelObj {
    /// What the application sees (`fd` is `app_fd`).
    pub ch: ibv_comp_channel,
    /// The engine channel.
    pub engine: Arc<engine::CompChannel>,
    /// The descriptor the application polls.
    pub app_fd: AppFd,
}

/// A completion queue (always allocated as `ibv_cq_ex`, whose prefix is
/// `ibv_cq`).
#[repr(C)]
pub struct CqObj {
    /// What the application sees (it reads `status`/`wr_id` that polling
    /// writes: hence the cell).
    pub cq: UnsafeCell<ibv_cq_ex>,
    /// The engine CQ.
    pub engine: Arc<engine::Cq>,
    /// The channel it reports to, if any.
    pub channel: Option<Arc<engine::CompChannel>>,
    /// The completion `ibv_start_poll`/`ibv_next_poll` stand on.
    pub cur: Mutex<ibv_wc>,
    /// Completions handed back by [`QpObj::release_deferred`], returned
    /// before the engine's (see [`crate::datapath`] on peer close).
    pub pending: Mutex<std::collections::VecDeque<engine::Completion>>,
    /// `pending` is not empty (checked without the lock on every poll).
    pub has_pending: std::sync::atomic::AtomicBool,
    /// QPs (once per role: send and receive), DCTs and DCIs completing
    /// into it.
    pub users: UseCount,
}

/// A shared receive queue.
#[repr(C)]
pub struct SrqObj {
    /// What the application sees.
    pub srq: ibv_srq,
    /// The engine SRQ.
    pub engine: Arc<engine::Srq>,
    /// Its protection domain's number.
    pub pd_num: u32,
    /// QPs and DCTs receiving from it.
    pub users: UseCount,
    /// The armed limit (`ibv_query_srq`'s `srq_limit`): set by
    /// `ibv_create_srq`/`ibv_modify_srq`, 0 once its limit event has been
    /// delivered by `ibv_get_async_event` (the engine disarms it when it
    /// fires).
    pub limit: std::sync::atomic::AtomicU32,
}

/// What a QP runs on.
pub enum QpKind {
    /// RC over TCP (also UC, which softrdma runs as RC; see
    /// `docs/capi.md`).
    Rc(engine::Qp),
    /// UD or (softrdma extension) RD over UDP.
    Dgram(engine::DgramQpHandle),
}

/// Attributes remembered for `ibv_query_qp`.
#[derive(Clone, Copy, Default)]
pub struct QpRemembered {
    /// The last attributes set, by mask bit.
    pub attr: ibv_qp_attr,
}

/// A queue pair (always allocated as `ibv_qp_ex`, whose prefix is
/// `ibv_qp`).
#[repr(C)]
pub struct QpObj {
    /// What the application sees (it writes `wr_id`/`wr_flags`, we write
    /// `state`: hence the cell).
    pub ex: UnsafeCell<ibv_qp_ex>,
    /// The QP number.
    pub qpn: u32,
    /// `ibv_qp_type`.
    pub qp_type: c_int,
    /// The engine QP.
    pub kind: QpKind,
    /// Every send is signaled (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// The capabilities granted.
    pub cap: ibv_qp_cap,
    /// The protection domain's number.
    pub pd_num: u32,
    /// The device (for addresses).
    pub dev: &'static DevObj,
    /// `ibv_qp_state`, mirrored into `ex.qp_base.state`.
    pub state: AtomicI32,
    /// For `ibv_query_qp`.
    pub remembered: Mutex<QpRemembered>,
    /// The `ibv_wr_*` batch being built.
    pub batch: Mutex<crate::qp_ex::WrBatch>,
    /// Connected IB-style (`ibv_modify_qp` to RTR with a destination).
    pub ib_style: std::sync::atomic::AtomicBool,
    /// Receive flushes held back after the peer closed an IB-style
    /// connection (see [`crate::datapath`]); released to the receive CQ
    /// when the application moves the QP to ERR.
    pub deferred: Mutex<Vec<engine::Completion>>,
}

impl QpObj {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The C object.
    pub fn raw(&self) -> *mut ibv_qp_ex {
        self.ex.get()
    }

    /// The RC engine QP (RC and UC QPs).
    pub fn rc(&self) -> Option<&engine::Qp> {
        match &self.kind {
            QpKind::Rc(q) => Some(q),
            QpKind::Dgram(_) => None,
        }
    }

    /// The datagram engine QP (UD and RD QPs).
    pub fn dgram(&self) -> Option<&engine::DgramQpHandle> {
        match &self.kind {
            QpKind::Dgram(q) => Some(q),
            QpKind::Rc(_) => None,
        }
    }

    /// The current `ibv_qp_state`.
    pub fn state(&self) -> i32 {
        self.state.load(Ordering::Acquire)
    }

    /// Hands the held-back receive flushes to the receive CQ (the
    /// application moved the QP to ERR: in IB its receives flush now).
    pub fn release_deferred(&self) {
        let d = std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|p| p.into_inner()));
        if d.is_empty() {
            return;
        }
        // SAFETY: recv_cq is the application's live CQ of ours (verbs: CQs outlive their QPs).
        let rcq = unsafe { (*self.raw()).qp_base.recv_cq };
        // SAFETY: as above.
        if let Some(c) = unsafe { cq_from_raw(rcq) } {
            c.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(d);
            c.has_pending.store(true, Ordering::Release);
        }
    }

    /// Sets the state (rdma_cm moves QPs to RTS when a connection is
    /// established, to ERR on disconnect).
    pub fn set_state(&self, s: i32) {
        self.state.store(s, Ordering::Release);
        // SAFETY: `state` is a plain int inside the cell of our live QP object that only this library writes; applications only read it (verbs contract), racing reads see an old or new value.
        unsafe {
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*self.ex.get()).qp_base.state), s)
        };
    }
}

/// Our PD behind an `ibv_pd`.
///
/// # Safety
/// `p` must be NULL or a live PD of this library.
pub unsafe fn pd_from_raw<'a>(p: *mut ibv_pd) -> Option<&'a PdObj> {
    // SAFETY: per the contract; ibv_pd is PdObj's first field.
    unsafe { (p as *const PdObj).as_ref() }
}

/// Our MR behind an `ibv_mr`.
///
/// # Safety
/// `p` must be NULL or a live MR of this library.
pub unsafe fn mr_from_raw<'a>(p: *mut ibv_mr) -> Option<&'a MrObj> {
    // SAFETY: per the contract; ibv_mr is MrObj's first field.
    unsafe { (p as *const MrObj).as_ref() }
}

/// Our AH behind an `ibv_ah`.
///
/// # Safety
/// `p` must be NULL or a live AH of this library.
pub unsafe fn ah_from_raw<'a>(p: *mut ibv_ah) -> Option<&'a AhObj> {
    // SAFETY: per the contract; ibv_ah is AhObj's first field.
    unsafe { (p as *const AhObj).as_ref() }
}

/// Our channel behind an `ibv_comp_channel`.
///
/// # Safety
/// `p` must be NULL or a live channel of this library.
pub unsafe fn channel_from_raw<'a>(p: *mut ibv_comp_channel) -> Option<&'a ChannelObj> {
    // SAFETY: per the contract; ibv_comp_channel is ChannelObj's first field.
    unsafe { (p as *const ChannelObj).as_ref() }
}

/// Our CQ behind an `ibv_cq` (or `ibv_cq_ex`).
///
/// # Safety
/// `p` must be NULL or a live CQ of this library.
pub unsafe fn cq_from_raw<'a>(p: *mut ibv_cq) -> Option<&'a CqObj> {
    // SAFETY: per the contract; ibv_cq_ex (prefix ibv_cq) is CqObj's first field.
    unsafe { (p as *const CqObj).as_ref() }
}

/// Our SRQ behind an `ibv_srq`.
///
/// # Safety
/// `p` must be NULL or a live SRQ of this library.
pub unsafe fn srq_from_raw<'a>(p: *mut ibv_srq) -> Option<&'a SrqObj> {
    // SAFETY: per the contract; ibv_srq is SrqObj's first field.
    unsafe { (p as *const SrqObj).as_ref() }
}

/// Our QP behind an `ibv_qp` (or `ibv_qp_ex`).
///
/// # Safety
/// `p` must be NULL or a live QP of this library.
pub unsafe fn qp_from_raw<'a>(p: *mut ibv_qp) -> Option<&'a QpObj> {
    // SAFETY: per the contract; ibv_qp_ex (prefix ibv_qp) is QpObj's first field.
    unsafe { (p as *const QpObj).as_ref() }
}

/// A new address handle in `pd` toward `ip` (and `port`, when the
/// peer's UDP port is known): the one constructor behind `ibv_create_ah`,
/// `ibv_sdc_create_ah` and [`create_ah_to`]; it holds the PD.
///
/// # Safety
/// `pd` must be NULL or a live PD of this library.
pub unsafe fn create_ah(
    pd: *mut ibv_pd,
    ip: IpAddr,
    port: Option<u16>,
) -> Result<*mut ibv_ah, i32> {
    // SAFETY: per the contract.
    let p = unsafe { pd_from_raw(pd) }.ok_or(libc::EINVAL)?;
    let a = Box::into_raw(Box::new(AhObj {
        ah: ibv_ah {
            context: p.pd.context,
            pd,
            handle: 0,
        },
        ip,
        port,
    }));
    p.users.hold();
    register_ah(a);
    Ok(a as *mut ibv_ah)
}

/// An address handle for an exact datagram destination (rdma_cm UD:
/// `event->param.ud.ah_attr` comes with the peer's UDP port known).
///
/// # Safety
/// `pd` must be a live PD of this library.
pub unsafe fn create_ah_to(pd: *mut ibv_pd, dest: DgramAddr) -> Result<*mut ibv_ah, i32> {
    // SAFETY: per the contract.
    unsafe { create_ah(pd, dest.ip, Some(dest.port)) }
}

/// The GID of an IP address: IPv4-mapped for IPv4.
pub fn gid_of(ip: IpAddr) -> ibv_gid {
    ibv_gid {
        raw: engine::ibconn::gid_of(ip),
    }
}

/// The IP address in a GID: IPv4 for an IPv4-mapped GID; `None` for the
/// zero GID.
pub fn ip_of_gid(g: &ibv_gid) -> Option<IpAddr> {
    if g.raw == [0; 16] {
        return None;
    }
    let v6 = std::net::Ipv6Addr::from(g.raw);
    Some(match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    })
}
