//! librdmacm (rdma-core 44 `rdma/rdma_cma.h`) over softrdma.
//!
//! librdmacm.so.1 (`crates/capi-rdmacm`) forwards every `rdma_*` call to
//! the `softrdma_rdma_*` functions of [`ffi`] (version node
//! `SOFTRDMA_PRIVATE_1`, listed in `exports.txt` here), so rdma_cm shares
//! this library's one engine and its verbs objects: `cm_id->verbs` is a
//! context of this library, `rdma_create_qp` makes an ordinary QP of it.
//!
//! # Port spaces
//!
//! * `RDMA_PS_TCP` (and `RDMA_PS_IB`): RC over iWARP. Listening, connect,
//!   accept, reject and disconnect are the engine's rdma_cm-style ids
//!   ([`softrdma_engine::cm_events`]): TCP plus MPA with private data,
//!   interoperable with kernel iWARP (siw) peers.
//! * `RDMA_PS_UDP` (and `RDMA_PS_IPOIB`): UD. The SIDR exchange
//!   (`rdma_connect` → `CONNECT_REQUEST` → `rdma_accept`/`rdma_reject` →
//!   `ESTABLISHED`/`REJECTED` with `param.ud`) runs over a short TCP
//!   connection to the listener's port ([`sidr`]; ours, softrdma to
//!   softrdma). `param.ud.ah_attr` carries the peer's address as an
//!   IPv4-mapped GID, `qp_num` its QP number, `qkey` [`RDMA_UDP_QKEY`].
//!   `rdma_join_multicast` attaches the id's UD QP to the IPv4 group
//!   (engine UD multicast) and reports `MULTICAST_JOIN` with the group's
//!   GID and QPN `0xFFFFFF`.
//!
//! # Events
//!
//! An event channel's descriptor is an epoll descriptor watching the
//! engine's CM channel and this module's own queue (address and route
//! resolution, UD and multicast events), so it is readable whenever
//! `rdma_get_cm_event` may have something; made `O_NONBLOCK`,
//! `rdma_get_cm_event` fails with `EAGAIN` instead of waiting, as
//! upstream. Ids created without a channel are synchronous
//! (`rdma_create_ep`, `rdma_get_request`): each call waits for its own
//! event, which stays readable through `id->event` until the next call.
//!
//! # Addresses and devices
//!
//! Address and route resolution complete at once (there is no ARP or
//! path query to wait for): the local address is the one the kernel's
//! routing picks toward the destination, and its device is this
//! library's device for that address. Loopback addresses follow the
//! kernel's rdma_cm: binding to one (like the wildcard) attaches no
//! device, and resolving toward one (or toward the wildcard) attaches the
//! first device with an active port, which is the first non-loopback
//! device when there is one; a connection request arriving over loopback
//! is on that device too. Applications that keep only devices with a
//! non-loopback interface (libfabric's verbs provider) thus find
//! `id->verbs` among them for loopback traffic as well.

pub mod addrinfo;
pub mod ffi;
pub mod sidr;

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use softrdma_engine::cm::ConnParams;
use softrdma_engine::cm_events::{CmEvent, CmEventKind, CmId, EventChannel};

use crate::abi::*;
use crate::abi_cm::*;
use crate::objects::{self, qp_from_raw};

/// `RDMA_PS_IPOIB`.
pub const RDMA_PS_IPOIB: c_int = 0x0002;
/// `RDMA_PS_TCP`.
pub const RDMA_PS_TCP: c_int = 0x0106;
/// `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: c_int = 0x0111;
/// `RDMA_PS_IB`.
pub const RDMA_PS_IB: c_int = 0x013F;
/// The qkey of rdma_cm UD QPs and groups.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// The multicast QPN of `MULTICAST_JOIN` events.
pub const MCAST_QPN: u32 = 0x00FF_FFFF;

/// `enum rdma_cm_event_type`.
pub mod ev {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`.
    pub const ADDR_RESOLVED: i32 = 0;
    /// `RDMA_CM_EVENT_ADDR_ERROR`.
    pub const ADDR_ERROR: i32 = 1;
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    pub const ROUTE_RESOLVED: i32 = 2;
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`.
    pub const CONNECT_REQUEST: i32 = 4;
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`.
    pub const CONNECT_RESPONSE: i32 = 5;
    /// `RDMA_CM_EVENT_UNREACHABLE`.
    pub const UNREACHABLE: i32 = 7;
    /// `RDMA_CM_EVENT_REJECTED`.
    pub const REJECTED: i32 = 8;
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    pub const ESTABLISHED: i32 = 9;
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`.
    pub const MULTICAST_JOIN: i32 = 12;
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process's engine (shared with libibverbs and rsockets).
pub fn engine() -> Result<softrdma_engine::Context, i32> {
    objects::engine().cloned()
}

/// An errno result.
pub type Res<T> = Result<T, i32>;

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

// ----------------------------------------------------------------------
// Channels
// ----------------------------------------------------------------------

/// An event not yet handed out, in our terms.
pub(crate) struct Pending {
    /// `*mut IdObj` of the id it is about.
    pub id: usize,
    /// `*mut IdObj` of the listening id (connect requests), or 0.
    pub listen_id: usize,
    pub event: i32,
    pub status: i32,
    pub param: Param,
    pub private_data: Vec<u8>,
}

/// An event's parameters.
pub(crate) enum Param {
    None,
    Conn {
        responder_resources: u8,
        initiator_depth: u8,
    },
    /// `user`: the multicast join's context, reported as
    /// `param.ud.private_data` (upstream does the same).
    Ud {
        ah_attr: ibv_ah_attr,
        qp_num: u32,
        qkey: u32,
        user: usize,
    },
}

/// What a channel shares with its ids and their threads.
pub struct ChanShared {
    /// The descriptor the application polls (epoll over the two below).
    epfd: OwnedFd,
    /// Readable while `queue` is not empty.
    efd: OwnedFd,
    queue: Mutex<VecDeque<Pending>>,
    /// The engine channel of this channel's TCP ids.
    engine: EventChannel,
    /// Channels whose engine channel holds ids that now report here
    /// (`rdma_migrate_id`, `rdma_get_request`): their engine events are
    /// pumped here too, and their descriptors are in `epfd`. Held strongly:
    /// the application may destroy the old channel (cmatose -m does), and
    /// the engine drops the events of a dropped channel. (Migrating ids
    /// back and forth between two channels makes them hold each other:
    /// both stay allocated until exit.)
    foreign: Mutex<Vec<Arc<ChanShared>>>,
}

impl ChanShared {
    fn new() -> Res<Arc<ChanShared>> {
        let engine = EventChannel::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        // SAFETY: no pointers; returns a new descriptor or -1.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(errno());
        }
        // SAFETY: `ep` was just opened and is ours.
        let epfd = unsafe { OwnedFd::from_raw_fd(ep) };
        // SAFETY: no pointers.
        let e = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if e < 0 {
            return Err(errno());
        }
        // SAFETY: `e` was just opened and is ours.
        let efd = unsafe { OwnedFd::from_raw_fd(e) };
        for fd in [efd.as_raw_fd(), engine.fd()] {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: fd as u64,
            };
            // SAFETY: valid descriptors and a live epoll_event.
            if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                return Err(errno());
            }
        }
        Ok(Arc::new(ChanShared {
            epfd,
            efd,
            queue: Mutex::new(VecDeque::new()),
            engine,
            foreign: Mutex::new(Vec::new()),
        }))
    }

    /// Makes this channel also wait for and pump `other`'s engine events
    /// (an id of `other`'s engine channel now reports here).
    fn adopt(&self, other: &Arc<ChanShared>) {
        if std::ptr::eq(self, Arc::as_ptr(other)) {
            return;
        }
        let mut f = lock(&self.foreign);
        if f.iter().any(|c| Arc::ptr_eq(c, other)) {
            return;
        }
        let fd = other.engine.fd();
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        let ep = self.epfd.as_raw_fd();
        // A failure only costs wake-ups.
        // SAFETY: valid descriptors (we hold the other channel) and a live epoll_event.
        let _ = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        f.push(other.clone());
    }

    /// Moves engine events of this channel and of the adopted ones to the
    /// channels their ids report to.
    fn pump(&self) {
        let foreign: Vec<Arc<ChanShared>> = lock(&self.foreign).clone();
        for c in std::iter::once(self).chain(foreign.iter().map(|a| &**a)) {
            while let Some(e) = c.engine.try_get_event() {
                if let Some((to, p)) = from_engine(e) {
                    to.push(p);
                }
            }
        }
    }

    /// Queues one of our own events.
    pub(crate) fn push(&self, p: Pending) {
        let mut q = lock(&self.queue);
        q.push_back(p);
        let one: u64 = 1;
        let (fd, p) = (self.efd.as_raw_fd(), &one as *const u64 as *const c_void);
        // SAFETY: writes 8 octets from a live u64 to our eventfd.
        let _ = unsafe { libc::write(fd, p, 8) };
    }

    fn pop_own(&self) -> Option<Pending> {
        let mut q = lock(&self.queue);
        let p = q.pop_front();
        if q.is_empty() {
            let mut v: u64 = 0;
            let (fd, p) = (self.efd.as_raw_fd(), &mut v as *mut u64 as *mut c_void);
            // SAFETY: reads 8 octets into a live u64 (non-blocking eventfd).
            let _ = unsafe { libc::read(fd, p, 8) };
        }
        p
    }

    fn fd(&self) -> c_int {
        self.epfd.as_raw_fd()
    }
}

/// `struct rdma_event_channel` and what stands behind it.
#[repr(C)]
pub struct ChanObj {
    /// What the application sees (`fd`: the epoll descriptor).
    pub ch: rdma_event_channel,
    /// The shared part.
    pub shared: Arc<ChanShared>,
}

/// `rdma_create_event_channel`.
pub fn create_channel() -> Res<*mut ChanObj> {
    let shared = ChanShared::new()?;
    Ok(Box::into_raw(Box::new(ChanObj {
        ch: rdma_event_channel { fd: shared.fd() },
        shared,
    })))
}

// ----------------------------------------------------------------------
// Ids
// ----------------------------------------------------------------------

/// What an id is doing, beyond what `rdma_cm_id` shows.
#[derive(Default)]
pub(crate) struct IdSt {
    /// The engine id (TCP port spaces), once listening or connecting.
    pub engine: Option<CmId>,
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    /// UD: the listener for SIDR requests.
    pub ud_listener: Option<sidr::Listener>,
    /// The port `rdma_bind_addr` chose for a port-0 bind, held by a bound
    /// (not listening) socket until `rdma_listen` opens the listener on it.
    pub reserved: Option<softrdma_engine::cm::PortReservation>,
    /// UD: the SIDR request this (child) id holds.
    pub ud_request: Option<std::net::TcpStream>,
    /// Multicast groups joined: (group, the QP was attached).
    pub mcast: Vec<(IpAddr, bool)>,
    /// `rdma_create_ep` with QP attributes on a passive id: what
    /// `rdma_get_request` gives each new id.
    pub qp_init: Option<ibv_qp_init_attr>,
    /// We made the CQs/channels of the QP (NULL CQs given).
    pub own_cqs: bool,
    /// We made the PD (NULL PD given).
    pub own_pd: bool,
    /// The event a synchronous call waited for, freed by the next one.
    pub held: Option<usize>,
    /// `RDMA_OPTION_ID_TOS`, recorded.
    pub tos: Option<u8>,
    /// The QP being connected when the application made it itself
    /// (`conn_param.qp_num`, `id->qp` NULL): `*mut ibv_qp`.
    pub own_qp: usize,
    /// This id called `rdma_connect` (the active side).
    pub active: bool,
}

/// `struct rdma_cm_id` and what stands behind it.
#[repr(C)]
pub struct IdObj {
    /// What the application sees.
    pub id: rdma_cm_id,
    /// The channel events go to.
    pub chan: Mutex<Arc<ChanShared>>,
    /// The channel we created for a synchronous id (destroyed with it).
    pub own_chan: *mut ChanObj,
    pub(crate) st: Mutex<IdSt>,
}

/// Live ids (`*mut IdObj` as usize): events for ids destroyed meanwhile
/// are dropped.
pub(crate) fn live() -> MutexGuard<'static, Option<HashSet<usize>>> {
    static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
    lock(&LIVE)
}

pub(crate) fn is_live(p: usize) -> bool {
    live().as_ref().is_some_and(|s| s.contains(&p))
}

/// Engine id number → `*mut IdObj`.
fn by_engine() -> MutexGuard<'static, Option<HashMap<u64, usize>>> {
    static MAP: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);
    lock(&MAP)
}

fn engine_map(num: u64, id: usize) {
    by_engine().get_or_insert_with(HashMap::new).insert(num, id);
}

fn engine_unmap(num: u64) {
    if let Some(m) = by_engine().as_mut() {
        m.remove(&num);
    }
}

fn engine_lookup(num: u64) -> Option<usize> {
    by_engine().as_ref().and_then(|m| m.get(&num).copied())
}

fn qp_type_of(ps: c_int) -> c_int {
    match ps {
        RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
        _ => IBV_QPT_RC,
    }
}

fn is_ud(ps: c_int) -> bool {
    qp_type_of(ps) == IBV_QPT_UD
}

/// A new id on `chan` (NULL: synchronous, with a channel of its own).
///
/// # Safety
/// `chan` is NULL or a live channel of this library.
pub unsafe fn create_id(chan: *mut ChanObj, context: *mut c_void, ps: c_int) -> Res<*mut IdObj> {
    if !matches!(ps, RDMA_PS_TCP | RDMA_PS_UDP | RDMA_PS_IB | RDMA_PS_IPOIB) {
        return Err(libc::EINVAL);
    }
    let (own, chan) = if chan.is_null() {
        let c = create_channel()?;
        (c, c)
    } else {
        (std::ptr::null_mut(), chan)
    };
    // SAFETY: a live channel (contract, or just created).
    let shared = unsafe { (*chan).shared.clone() };
    let obj = new_id(shared, chan as usize, context as usize, ps);
    // SAFETY: just made, not yet shared.
    unsafe { (*obj).own_chan = own };
    Ok(obj)
}

/// A new id reporting to `shared`, whose `ChanObj` (the application's
/// `id->channel`) is at `chan_ptr`; nothing is dereferenced, so threads
/// that outlive the application's objects can make child ids.
pub(crate) fn new_id(
    shared: Arc<ChanShared>,
    chan_ptr: usize,
    context: usize,
    ps: c_int,
) -> *mut IdObj {
    // SAFETY: all-zero is a valid rdma_cm_id (NULL pointers, zero ints).
    let mut id: rdma_cm_id = unsafe { std::mem::zeroed() };
    id.channel = chan_ptr as *mut rdma_event_channel;
    id.context = context as *mut c_void;
    id.ps = ps;
    id.qp_type = qp_type_of(ps);
    let obj = Box::into_raw(Box::new(IdObj {
        id,
        chan: Mutex::new(shared),
        own_chan: std::ptr::null_mut(),
        st: Mutex::new(IdSt::default()),
    }));
    live().get_or_insert_with(HashSet::new).insert(obj as usize);
    obj
}

/// Our id behind an `rdma_cm_id`.
///
/// # Safety
/// `id` must be NULL or a live id of this library.
pub unsafe fn id_from_raw<'a>(id: *mut rdma_cm_id) -> Res<&'a mut IdObj> {
    // SAFETY: per the contract; rdma_cm_id is IdObj's first field.
    unsafe { (id as *mut IdObj).as_mut() }.ok_or(libc::EINVAL)
}

impl IdObj {
    fn chan(&self) -> Arc<ChanShared> {
        lock(&self.chan).clone()
    }

    fn raw(&mut self) -> *mut rdma_cm_id {
        &mut self.id
    }

    fn sync(&self) -> bool {
        !self.own_chan.is_null()
    }

    /// Records the local address and picks the device for it
    /// ([`cm_device`]).
    fn set_src(&mut self, a: SocketAddr) -> Res<()> {
        let dev = cm_device(a.ip()).ok_or(libc::EADDRNOTAVAIL)?;
        self.id.verbs = objects::device_context(dev)?;
        self.id.port_num = 1;
        write_storage(&mut self.id.route.addr.src_addr, &a);
        self.id.route.addr.addr.sgid = objects::gid_of(dev.ip);
        lock(&self.st).src = Some(a);
        Ok(())
    }

    fn dst_ip(&self) -> IpAddr {
        lock(&self.st)
            .dst
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |d| d.ip())
    }

    fn set_dst(&mut self, a: SocketAddr) {
        write_storage(&mut self.id.route.addr.dst_addr, &a);
        self.id.route.addr.addr.dgid = objects::gid_of(a.ip());
        lock(&self.st).dst = Some(a);
    }
}

fn write_storage(dst: &mut sockaddr_storage, a: &SocketAddr) {
    let (ss, len) = crate::rsocket::sockaddr_of(a);
    // SAFETY: `ss` is a live sockaddr_storage of 128 octets; len ≤ 128.
    let src = unsafe { std::slice::from_raw_parts(&ss as *const _ as *const u8, len as usize) };
    dst.0 = [0; 128];
    dst.0[..len as usize].copy_from_slice(src);
}

/// `rdma_destroy_id`.
///
/// # Safety
/// `id` is a live id; no other thread uses it.
pub unsafe fn destroy_id(id: *mut rdma_cm_id) -> Res<()> {
    // SAFETY: contract.
    let obj = unsafe { id_from_raw(id) }?;
    if let Some(s) = live().as_mut() {
        s.remove(&(obj as *mut IdObj as usize));
    }
    let st = std::mem::take(&mut *lock(&obj.st));
    if let Some(e) = &st.engine {
        engine_unmap(e.number());
        e.destroy();
    }
    if let Some(h) = st.held {
        // SAFETY: an event we allocated and held.
        unsafe { free_event(h as *mut rdma_cm_event) };
    }
    drop(st);
    let own = obj.own_chan;
    // SAFETY: allocated by create_id with Box::into_raw; handed back once.
    drop(unsafe { Box::from_raw(obj as *mut IdObj) });
    if !own.is_null() {
        // SAFETY: the channel we created for this id.
        drop(unsafe { Box::from_raw(own) });
    }
    Ok(())
}

// ----------------------------------------------------------------------
// Getting events
// ----------------------------------------------------------------------

/// `struct rdma_cm_event` plus the private data it points at.
#[repr(C)]
pub struct EvObj {
    /// What the application sees.
    pub ev: rdma_cm_event,
    private: Vec<u8>,
}

/// Frees an event.
///
/// # Safety
/// `e` is an event of this library not yet freed.
pub unsafe fn free_event(e: *mut rdma_cm_event) {
    // SAFETY: allocated by `make_event` with Box::into_raw.
    drop(unsafe { Box::from_raw(e as *mut EvObj) });
}

fn make_event(p: Pending) -> *mut rdma_cm_event {
    // SAFETY: all-zero is a valid event (NULL pointers, zero ints).
    let mut ev: rdma_cm_event = unsafe { std::mem::zeroed() };
    ev.id = p.id as *mut rdma_cm_id;
    ev.listen_id = p.listen_id as *mut rdma_cm_id;
    ev.event = p.event;
    ev.status = p.status;
    let mut obj = Box::new(EvObj {
        ev,
        private: p.private_data,
    });
    let (pd, pdlen) = if obj.private.is_empty() {
        (std::ptr::null(), 0u8)
    } else {
        (
            obj.private.as_ptr() as *const c_void,
            obj.private.len().min(255) as u8,
        )
    };
    match p.param {
        Param::None => {}
        Param::Conn {
            responder_resources,
            initiator_depth,
        } => {
            obj.ev.param.conn = rdma_conn_param {
                private_data: pd,
                private_data_len: pdlen,
                responder_resources,
                initiator_depth,
                flow_control: 1,
                retry_count: 7,
                rnr_retry_count: 7,
                srq: 0,
                qp_num: 0,
            };
        }
        Param::Ud {
            ah_attr,
            qp_num,
            qkey,
            user,
        } => {
            let (pd, pdlen) = if user != 0 {
                (user as *const c_void, 0)
            } else {
                (pd, pdlen)
            };
            obj.ev.param.ud = rdma_ud_param {
                private_data: pd,
                private_data_len: pdlen,
                ah_attr,
                qp_num,
                qkey,
            };
        }
    }
    Box::into_raw(obj) as *mut rdma_cm_event
}

/// Turns an engine event into ours (creating the child id of a connect
/// request), with the channel it belongs on. `None` for ids that are
/// gone.
fn from_engine(e: CmEvent) -> Option<(Arc<ChanShared>, Pending)> {
    let num = e.id().number();
    match e {
        CmEvent::ConnectRequest {
            id,
            listener,
            private_data,
            peer,
            ird,
            ord,
        } => {
            let lp = engine_lookup(listener.number()).filter(|p| is_live(*p));
            let Some(lp) = lp else {
                let _ = id.reject(&[]);
                return None;
            };
            // The rdma_cm contract: no listener is destroyed while its
            // events are being read.
            // SAFETY: a live id (checked above; see the contract).
            let l = unsafe { &mut *(lp as *mut IdObj) };
            let child = new_id(
                l.chan(),
                l.id.channel as usize,
                l.id.context as usize,
                l.id.ps,
            );
            // SAFETY: just created.
            let c = unsafe { &mut *child };
            let local_ip = if peer.ip().is_loopback() {
                peer.ip()
            } else {
                softrdma_engine::ibconn::local_addr_toward(peer.ip())
                    .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
            };
            let lport = lock(&l.st).src.map_or(0, |a| a.port());
            let _ = c.set_src(SocketAddr::new(local_ip, lport));
            c.set_dst(peer);
            engine_map(id.number(), child as usize);
            lock(&c.st).engine = Some(id);
            Some((
                l.chan(),
                Pending {
                    id: child as usize,
                    listen_id: lp,
                    event: ev::CONNECT_REQUEST,
                    status: 0,
                    param: Param::Conn {
                        responder_resources: ird.min(255) as u8,
                        initiator_depth: ord.min(255) as u8,
                    },
                    private_data,
                },
            ))
        }
        other => {
            let ip = engine_lookup(num).filter(|p| is_live(*p))?;
            // SAFETY: live (checked).
            let obj = unsafe { &*(ip as *const IdObj) };
            let (own_qp, active) = {
                let st = lock(&obj.st);
                (st.own_qp, st.active)
            };
            let qp = if obj.id.qp.is_null() {
                own_qp as *mut ibv_qp
            } else {
                obj.id.qp
            };
            // SAFETY: id->qp or the QP found by number: NULL or a live QP of ours.
            if let Some(q) = unsafe { qp_from_raw(qp) } {
                match other.kind() {
                    CmEventKind::Established => q.set_state(IBV_QPS_RTS),
                    CmEventKind::Disconnected => q.set_state(IBV_QPS_ERR),
                    _ => {}
                }
            }
            // An active id without a QP of its own gets CONNECT_RESPONSE
            // (the application moves its QP and calls rdma_establish), as
            // upstream.
            let mut event = other.rdma_cm_event() as i32;
            if active && obj.id.qp.is_null() && other.kind() == CmEventKind::Established {
                event = ev::CONNECT_RESPONSE;
            }
            Some((
                obj.chan(),
                Pending {
                    id: ip,
                    listen_id: 0,
                    event,
                    status: other.status(),
                    param: Param::Conn {
                        responder_resources: 16,
                        initiator_depth: 16,
                    },
                    private_data: other.private_data().to_vec(),
                },
            ))
        }
    }
}

/// The next event of `chan`, waiting unless the descriptor is
/// non-blocking.
pub(crate) fn next_event(chan: &Arc<ChanShared>) -> Res<Pending> {
    loop {
        // Engine events move over first (child ids are made here); an
        // event for an id migrated to another channel goes there.
        chan.pump();
        while let Some(p) = chan.pop_own() {
            if is_live(p.id) {
                return Ok(p);
            }
        }
        // SAFETY: no pointers; our descriptor.
        let fl = unsafe { libc::fcntl(chan.fd(), libc::F_GETFL) };
        if fl >= 0 && fl & libc::O_NONBLOCK != 0 {
            return Err(libc::EAGAIN);
        }
        let mut p = libc::pollfd {
            fd: chan.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        let _ = unsafe { libc::poll(&mut p, 1, -1) };
    }
}

/// `rdma_get_cm_event`.
///
/// # Safety
/// `chan` is a live channel.
pub unsafe fn get_event(chan: *mut ChanObj) -> Res<*mut rdma_cm_event> {
    // SAFETY: contract.
    let c = unsafe { chan.as_ref() }.ok_or(libc::EINVAL)?;
    // Our own reference for the wait: another thread may destroy the
    // channel meanwhile (rping does, at exit, while its event thread
    // waits here); the waiter then keeps what it uses alive instead of
    // reading the freed ChanObj when an event wakes it.
    let shared = Arc::clone(&c.shared);
    Ok(make_event(next_event(&shared)?))
}

/// For synchronous ids: waits for the next event of the id's channel and
/// checks it is `want`; the event is held (freed by the next call or by
/// destroy) so `id->event` stays readable.
fn complete(obj: &mut IdObj, want: i32) -> Res<()> {
    let chan = obj.chan();
    if let Some(h) = lock(&obj.st).held.take() {
        obj.id.event = std::ptr::null_mut();
        // SAFETY: an event we allocated and held.
        unsafe { free_event(h as *mut rdma_cm_event) };
    }
    let e = make_event(next_event(&chan)?);
    // SAFETY: just made.
    let (event, status) = unsafe { ((*e).event, (*e).status) };
    obj.id.event = e;
    lock(&obj.st).held = Some(e as usize);
    if event != want {
        // As librdmacm: a rejection is ECONNREFUSED whatever its status
        // (-ECONNRESET for a peer that closed before its MPA Reply).
        return Err(if event == ev::REJECTED || status >= 0 {
            libc::ECONNREFUSED
        } else {
            -status
        });
    }
    Ok(())
}

fn emit(obj: &mut IdObj, event: i32, status: i32, param: Param, private_data: Vec<u8>) {
    let id = obj as *mut IdObj as usize;
    obj.chan().push(Pending {
        id,
        listen_id: 0,
        event,
        status,
        param,
        private_data,
    });
}

// ----------------------------------------------------------------------
// Addresses
// ----------------------------------------------------------------------

/// Whether rdma_cm treats `ip` as "any address" for device purposes: the
/// wildcard and the loopback addresses (no RDMA device runs on the
/// loopback interface as such; the kernel's rdma_cm has the same rule).
fn any_addr(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_unspecified() || ip.is_loopback()
}

/// The device rdma_cm attaches to an id whose local address is `ip`: the
/// device of the interface with that address; for a loopback (or
/// wildcard) address, the first device with an active port (all of ours
/// are), which is the first non-loopback device when there is one, as
/// the kernel's rdma_cm binds loopback traffic to the first active
/// device. The peer of a loopback connection gets the same device, so
/// both ends of it name one device.
fn cm_device(ip: IpAddr) -> Option<&'static crate::device::DevObj> {
    if any_addr(ip) {
        return crate::device::devices().first();
    }
    crate::device::device_for_ip(ip)
}

/// `rdma_bind_addr`. A wildcard or loopback address binds no device
/// (`id->verbs` stays NULL until a connection request or address
/// resolution picks one), as rdma_bind_addr(3) documents for the
/// wildcard and the kernel's rdma_cm does for loopback; any other address
/// binds the device of the interface that has it (`EADDRNOTAVAIL` when
/// none has).
///
/// Port 0 is given a port at once, as the kernel's rdma_cm does, so that
/// `rdma_get_src_port` and `rdma_get_local_addr` report it before
/// `rdma_listen` (qperf sends it to its client): a socket bound to it
/// holds it until the listener opens on it.
pub fn bind_addr(obj: &mut IdObj, a: SocketAddr) -> Res<()> {
    if lock(&obj.st).engine.is_some() {
        return Err(libc::EINVAL);
    }
    if a.ip().to_canonical().is_multicast() {
        return Err(libc::EADDRNOTAVAIL);
    }
    let (a, reserved) = if a.port() == 0 {
        let r = softrdma_engine::cm::PortReservation::new(a)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EADDRINUSE))?;
        (r.addr(), Some(r))
    } else {
        (a, None)
    };
    if any_addr(a.ip()) {
        write_storage(&mut obj.id.route.addr.src_addr, &a);
        let mut st = lock(&obj.st);
        st.src = Some(a);
        st.reserved = reserved;
        return Ok(());
    }
    obj.set_src(a)?;
    lock(&obj.st).reserved = reserved;
    Ok(())
}

/// `rdma_resolve_addr`: completes at once with `ADDR_RESOLVED` (or
/// `ADDR_ERROR` if no device has the local address). The local address
/// is the given source, else the bound one, else (a wildcard) the
/// address the kernel's routing picks toward `dst` (`dst` itself when it
/// is a loopback address or one of this host's); its device is
/// [`cm_device`]'s.
pub fn resolve_addr(obj: &mut IdObj, src: Option<SocketAddr>, dst: SocketAddr) -> Res<()> {
    let bound = lock(&obj.st).src;
    let local = match (src, bound) {
        (Some(s), _) if !s.ip().is_unspecified() => s.ip(),
        (_, Some(s)) if !s.ip().is_unspecified() => s.ip(),
        _ if dst.ip().is_loopback() => dst.ip(),
        _ if dst.ip().is_unspecified() => match dst {
            SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            SocketAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        },
        _ => softrdma_engine::ibconn::local_addr_toward(dst.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    };
    let port = src.or(bound).map_or(0, |s| s.port());
    let status = match obj.set_src(SocketAddr::new(local, port)) {
        Ok(()) => 0,
        Err(e) => -e,
    };
    obj.set_dst(dst);
    let event = if status == 0 {
        ev::ADDR_RESOLVED
    } else {
        ev::ADDR_ERROR
    };
    emit(obj, event, status, Param::None, Vec::new());
    if obj.sync() {
        complete(obj, ev::ADDR_RESOLVED)?;
    }
    Ok(())
}

/// `rdma_resolve_route`: completes at once with `ROUTE_RESOLVED`.
pub fn resolve_route(obj: &mut IdObj) -> Res<()> {
    if lock(&obj.st).dst.is_none() {
        return Err(libc::EINVAL);
    }
    obj.id.route.num_paths = 1;
    emit(obj, ev::ROUTE_RESOLVED, 0, Param::None, Vec::new());
    if obj.sync() {
        complete(obj, ev::ROUTE_RESOLVED)?;
    }
    Ok(())
}

// ----------------------------------------------------------------------
// QPs
// ----------------------------------------------------------------------

/// `rdma_create_qp`: a QP of the id's device; NULL CQs in `attr` get a
/// completion channel and CQ each (with `cq_context` = the id), a NULL PD
/// the id's PD or a new one, as rdma_cm does. RC QPs start in INIT (the
/// connection moves them to RTS), UD QPs in RTS with [`RDMA_UDP_QKEY`].
/// The granted capabilities are written back to `attr.cap`.
///
/// # Safety
/// `pd` NULL or a live PD of this library.
pub unsafe fn create_qp(
    obj: &mut IdObj,
    mut pd: *mut ibv_pd,
    attr: &mut ibv_qp_init_attr,
) -> Res<()> {
    use crate::verbs_api as v;
    if obj.id.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    if !obj.id.qp.is_null() {
        return Err(libc::EBUSY);
    }
    if pd.is_null() {
        pd = obj.id.pd;
    }
    if pd.is_null() {
        // SAFETY: verbs is a live context of ours.
        pd = unsafe { v::ibv_alloc_pd(obj.id.verbs) };
        if pd.is_null() {
            return Err(libc::ENOMEM);
        }
        lock(&obj.st).own_pd = true;
    }
    if obj.id.pd.is_null() {
        obj.id.pd = pd;
    }
    let mut a = copy_init(attr);
    if a.qp_type == 0 {
        a.qp_type = obj.id.qp_type;
    }
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        // SAFETY: verbs is live.
        unsafe { make_cqs(obj, &a) }?;
        if a.send_cq.is_null() {
            a.send_cq = obj.id.send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = obj.id.recv_cq;
        }
    }
    // SAFETY: pd live, `a` a valid copy.
    let qp = unsafe { v::ibv_create_qp(pd, &mut a) };
    if qp.is_null() {
        return Err(errno());
    }
    // SAFETY: just created by this library.
    let q = unsafe { qp_from_raw(qp) }.ok_or(libc::EINVAL)?;
    if a.qp_type == IBV_QPT_UD {
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut qa: ibv_qp_attr = unsafe { std::mem::zeroed() };
        qa.pkey_index = 0;
        qa.port_num = 1;
        qa.qkey = RDMA_UDP_QKEY;
        let steps = [
            (
                IBV_QPS_INIT,
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
            ),
            (IBV_QPS_RTR, IBV_QP_STATE),
            (IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_SQ_PSN),
        ];
        for (s, mask) in steps {
            qa.qp_state = s;
            // SAFETY: qp live, qa valid.
            let r = unsafe { v::ibv_modify_qp(qp, &mut qa, mask) };
            if r != 0 {
                // SAFETY: created above, not handed out.
                unsafe { v::ibv_destroy_qp(qp) };
                return Err(r);
            }
        }
    } else {
        q.set_state(IBV_QPS_INIT);
    }
    obj.id.qp = qp;
    attr.cap = a.cap;
    Ok(())
}

/// A copy of QP creation attributes (plain data).
pub(crate) fn copy_init(a: &ibv_qp_init_attr) -> ibv_qp_init_attr {
    ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    }
}

/// A completion channel and CQ for each missing CQ of `a`, with the id
/// as CQ context (the `rdma_get_*_comp` inlines check it).
///
/// # Safety
/// `obj.id.verbs` is a live context.
unsafe fn make_cqs(obj: &mut IdObj, a: &ibv_qp_init_attr) -> Res<()> {
    use crate::verbs_api as v;
    let ctx = obj.id.verbs;
    let me = obj.raw() as *mut c_void;
    let make = |n: u32| -> Res<(*mut ibv_comp_channel, *mut ibv_cq)> {
        // SAFETY: ctx is live.
        let ch = unsafe { v::ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: ctx and ch live.
        let cq = unsafe { v::ibv_create_cq(ctx, n.max(1) as c_int, me, ch, 0) };
        if cq.is_null() {
            // SAFETY: created above.
            unsafe { v::ibv_destroy_comp_channel(ch) };
            return Err(libc::ENOMEM);
        }
        Ok((ch, cq))
    };
    if a.recv_cq.is_null() && obj.id.recv_cq.is_null() {
        let (ch, cq) = make(a.cap.max_recv_wr)?;
        obj.id.recv_cq_channel = ch;
        obj.id.recv_cq = cq;
        lock(&obj.st).own_cqs = true;
    }
    if a.send_cq.is_null() && obj.id.send_cq.is_null() {
        let (ch, cq) = make(a.cap.max_send_wr)?;
        obj.id.send_cq_channel = ch;
        obj.id.send_cq = cq;
        lock(&obj.st).own_cqs = true;
    }
    Ok(())
}

/// `rdma_destroy_qp` (with the CQs, channels and PD we made for it).
///
/// # Safety
/// The id's QP, CQs and channels are live objects of this library.
pub unsafe fn destroy_qp(obj: &mut IdObj) {
    use crate::verbs_api as v;
    if !obj.id.qp.is_null() {
        let groups = std::mem::take(&mut lock(&obj.st).mcast);
        // SAFETY: live QP.
        if let Some(d) = unsafe { qp_from_raw(obj.id.qp) }.and_then(|q| q.dgram()) {
            for (g, attached) in groups {
                if attached {
                    let _ = d.detach_mcast(g);
                }
            }
        }
        // SAFETY: live QP of ours, destroyed once.
        unsafe { v::ibv_destroy_qp(obj.id.qp) };
        obj.id.qp = std::ptr::null_mut();
    }
    let (own_cqs, own_pd) = {
        let st = lock(&obj.st);
        (st.own_cqs, st.own_pd)
    };
    if own_cqs {
        // SAFETY: CQs and channels we created, destroyed once.
        unsafe {
            for cq in [obj.id.send_cq, obj.id.recv_cq] {
                if !cq.is_null() {
                    v::ibv_destroy_cq(cq);
                }
            }
            for ch in [obj.id.send_cq_channel, obj.id.recv_cq_channel] {
                if !ch.is_null() {
                    v::ibv_destroy_comp_channel(ch);
                }
            }
        }
        obj.id.send_cq = std::ptr::null_mut();
        obj.id.recv_cq = std::ptr::null_mut();
        obj.id.send_cq_channel = std::ptr::null_mut();
        obj.id.recv_cq_channel = std::ptr::null_mut();
        lock(&obj.st).own_cqs = false;
    }
    if own_pd && !obj.id.pd.is_null() {
        // SAFETY: the PD we allocated, freed once.
        unsafe { v::ibv_dealloc_pd(obj.id.pd) };
        obj.id.pd = std::ptr::null_mut();
        lock(&obj.st).own_pd = false;
    }
}

// ----------------------------------------------------------------------
// Connections
// ----------------------------------------------------------------------

/// The connection parameters the engine takes.
fn conn_params(p: Option<&rdma_conn_param>) -> ConnParams {
    let Some(p) = p else {
        return ConnParams::default();
    };
    let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
        Vec::new()
    } else {
        let (data, len) = (p.private_data as *const u8, usize::from(p.private_data_len));
        // SAFETY: private_data has private_data_len octets (rdma_conn_param contract).
        unsafe { std::slice::from_raw_parts(data, len) }.to_vec()
    };
    ConnParams {
        private_data,
        ird: u16::from(p.responder_resources),
        ord: u16::from(p.initiator_depth),
    }
}

/// An application that asks for receiver-not-ready retries
/// (`rnr_retry_count` > 0) gets InfiniBand's behaviour on its QP: a Send
/// that finds no posted receive waits for one ([`softrdma_engine::Qp::set_rnr_wait`]).
fn rnr_wait_if_asked(qp: &softrdma_engine::Qp, p: Option<&rdma_conn_param>) {
    if p.is_some_and(|p| p.rnr_retry_count > 0) {
        qp.set_rnr_wait();
    }
}

/// The RC QP to connect: the id's, else the one numbered in the
/// parameters (the application made its own QP).
fn rc_qp(obj: &IdObj, p: Option<&rdma_conn_param>) -> Res<softrdma_engine::Qp> {
    let (qp, raw) = rc_qp_raw(obj, p)?;
    if obj.id.qp.is_null() {
        lock(&obj.st).own_qp = raw as usize;
    }
    Ok(qp)
}

/// [`rc_qp`] and the `ibv_qp` it belongs to.
fn rc_qp_raw(obj: &IdObj, p: Option<&rdma_conn_param>) -> Res<(softrdma_engine::Qp, *mut ibv_qp)> {
    let qp = if obj.id.qp.is_null() {
        let n = p.map_or(0, |p| p.qp_num);
        objects::qp_by_num(n).ok_or(libc::EINVAL)? as *mut ibv_qp
    } else {
        obj.id.qp
    };
    // SAFETY: id->qp or a registered QP: live objects of ours.
    let q = unsafe { qp_from_raw(qp) }.ok_or(libc::EINVAL)?;
    Ok((q.rc().cloned().ok_or(libc::EINVAL)?, qp))
}

/// `rdma_listen`.
pub fn listen(obj: &mut IdObj, backlog: c_int) -> Res<()> {
    let ctx = engine()?;
    let src = lock(&obj.st)
        .src
        .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
    let me = obj as *mut IdObj as usize;
    if is_ud(obj.id.ps) {
        let proto = sidr::ChildProto {
            listen_id: me,
            chan: obj.chan(),
            chan_ptr: obj.id.channel as usize,
            context: obj.id.context as usize,
            ps: obj.id.ps,
        };
        let l = sidr::Listener::start(src, proto)?;
        let local = l.local_addr();
        write_storage(&mut obj.id.route.addr.src_addr, &local);
        let mut st = lock(&obj.st);
        st.src = Some(local);
        st.ud_listener = Some(l);
        st.reserved = None;
        return Ok(());
    }
    let id = obj.chan().engine.create_id(&ctx);
    let local = id
        .listen(src, backlog.max(0) as u32)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EADDRINUSE))?;
    write_storage(&mut obj.id.route.addr.src_addr, &local);
    engine_map(id.number(), me);
    let mut st = lock(&obj.st);
    st.src = Some(local);
    st.engine = Some(id);
    // The listener holds the port now.
    st.reserved = None;
    Ok(())
}

/// `rdma_connect`.
pub fn connect(obj: &mut IdObj, p: Option<&rdma_conn_param>) -> Res<()> {
    let dst = lock(&obj.st).dst.ok_or(libc::EINVAL)?;
    if is_ud(obj.id.ps) {
        let params = conn_params(p);
        sidr::connect(
            obj as *mut IdObj as usize,
            obj.chan(),
            dst,
            params.private_data,
        );
    } else {
        let ctx = engine()?;
        let qp = rc_qp(obj, p)?;
        rnr_wait_if_asked(&qp, p);
        let id = obj.chan().engine.create_id(&ctx);
        engine_map(id.number(), obj as *mut IdObj as usize);
        if let Err(e) = id.connect(&qp, dst, &conn_params(p)) {
            engine_unmap(id.number());
            return Err(match e {
                softrdma_engine::cm::CmError::Busy => libc::EISCONN,
                _ => libc::EINVAL,
            });
        }
        let mut st = lock(&obj.st);
        st.engine = Some(id);
        st.active = true;
    }
    if obj.sync() {
        let want = if obj.id.qp.is_null() {
            ev::CONNECT_RESPONSE
        } else {
            ev::ESTABLISHED
        };
        complete(obj, want)?;
    }
    Ok(())
}

/// `rdma_accept`.
pub fn accept(obj: &mut IdObj, p: Option<&rdma_conn_param>) -> Res<()> {
    if is_ud(obj.id.ps) {
        let sock = lock(&obj.st).ud_request.take().ok_or(libc::EINVAL)?;
        let qpn = if obj.id.qp.is_null() {
            p.map_or(0, |p| p.qp_num)
        } else {
            // SAFETY: id->qp is a live QP of ours.
            unsafe { (*obj.id.qp).qp_num }
        };
        // SIDR has no ESTABLISHED on the passive side.
        return sidr::reply(sock, true, qpn, &conn_params(p).private_data);
    }
    let id = lock(&obj.st).engine.clone().ok_or(libc::EINVAL)?;
    let qp = rc_qp(obj, p)?;
    rnr_wait_if_asked(&qp, p);
    id.accept(&qp, &conn_params(p)).map_err(|e| match e {
        softrdma_engine::cm::CmError::Busy => libc::EISCONN,
        softrdma_engine::cm::CmError::Io(io) => io.raw_os_error().unwrap_or(libc::ECONNABORTED),
        _ => libc::ECONNABORTED,
    })?;
    // The passive side is connected when accept returns (the MPA Reply is
    // out, the QP runs): sends may be posted before ESTABLISHED is read.
    let raw = if obj.id.qp.is_null() {
        lock(&obj.st).own_qp as *mut ibv_qp
    } else {
        obj.id.qp
    };
    // SAFETY: id->qp or the QP found by number: a live QP of ours.
    if let Some(q) = unsafe { qp_from_raw(raw) } {
        q.set_state(IBV_QPS_RTS);
    }
    if obj.sync() {
        complete(obj, ev::ESTABLISHED)?;
    }
    Ok(())
}

/// `rdma_reject`.
pub fn reject(obj: &mut IdObj, private_data: &[u8]) -> Res<()> {
    if is_ud(obj.id.ps) {
        let sock = lock(&obj.st).ud_request.take().ok_or(libc::EINVAL)?;
        return sidr::reply(sock, false, 0, private_data);
    }
    let id = lock(&obj.st).engine.clone().ok_or(libc::EINVAL)?;
    id.reject(private_data).map_err(|_| libc::EINVAL)
}

/// `rdma_disconnect`.
pub fn disconnect(obj: &mut IdObj) -> Res<()> {
    if is_ud(obj.id.ps) {
        return Err(libc::EINVAL);
    }
    let id = lock(&obj.st).engine.clone().ok_or(libc::EINVAL)?;
    // SAFETY: id->qp is NULL or a live QP of ours.
    if let Some(q) = unsafe { qp_from_raw(obj.id.qp) } {
        q.set_state(IBV_QPS_ERR);
    }
    id.disconnect().map_err(|_| libc::ENOTCONN)
}

/// `rdma_get_request`: waits for a connect request on a synchronous
/// listening id; the new id is synchronous too and gets a QP if
/// `rdma_create_ep` was given QP attributes.
pub fn get_request(obj: &mut IdObj) -> Res<*mut rdma_cm_id> {
    if !obj.sync() {
        return Err(libc::EINVAL);
    }
    let chan = obj.chan();
    loop {
        let p = next_event(&chan)?;
        if p.event != ev::CONNECT_REQUEST {
            continue;
        }
        let e = make_event(p);
        // SAFETY: just made; its id is the live child.
        let child = unsafe { (*e).id };
        // SAFETY: a live id we made.
        let c = unsafe { id_from_raw(child) }?;
        // The child reports to a channel of its own from now on.
        let own = create_channel()?;
        c.id.channel = own as *mut rdma_event_channel;
        // SAFETY: just created.
        let shared = unsafe { (*own).shared.clone() };
        shared.adopt(&chan);
        *lock(&c.chan) = shared;
        c.own_chan = own;
        c.id.event = e;
        lock(&c.st).held = Some(e as usize);
        let init = lock(&obj.st).qp_init.as_ref().map(copy_init);
        if let Some(mut attr) = init {
            let pd = obj.id.pd;
            // SAFETY: the listener's PD (or NULL: one is made).
            if let Err(err) = unsafe { create_qp(c, pd, &mut attr) } {
                let _ = reject(c, &[]);
                // SAFETY: the child is ours, not handed out.
                let _ = unsafe { destroy_id(child) };
                return Err(err);
            }
        }
        return Ok(child);
    }
}

/// `rdma_join_multicast(_ex)`: attaches the id's UD QP (unless send-only)
/// and reports `MULTICAST_JOIN`.
pub fn join_multicast(obj: &mut IdObj, group: SocketAddr, send_only: bool, user: usize) -> Res<()> {
    let g = group.ip().to_canonical();
    let IpAddr::V4(g4) = g else {
        return Err(libc::EAFNOSUPPORT);
    };
    if !g4.is_multicast() || obj.id.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    let mut attached = false;
    if !send_only {
        // SAFETY: id->qp is NULL or a live QP of ours.
        let q = unsafe { qp_from_raw(obj.id.qp) }.ok_or(libc::EINVAL)?;
        let d = q.dgram().ok_or(libc::EINVAL)?;
        d.attach_mcast(g).map_err(|_| libc::EADDRNOTAVAIL)?;
        attached = true;
    }
    lock(&obj.st).mcast.push((g, attached));
    emit(
        obj,
        ev::MULTICAST_JOIN,
        0,
        Param::Ud {
            ah_attr: ah_attr_to(g, 0xC000),
            qp_num: MCAST_QPN,
            qkey: RDMA_UDP_QKEY,
            user,
        },
        Vec::new(),
    );
    Ok(())
}

/// `rdma_leave_multicast`.
pub fn leave_multicast(obj: &mut IdObj, group: SocketAddr) -> Res<()> {
    let g = group.ip().to_canonical();
    let found = {
        let mut st = lock(&obj.st);
        let i = st.mcast.iter().position(|(x, _)| *x == g);
        i.map(|i| st.mcast.remove(i))
    };
    let (_, attached) = found.ok_or(libc::EADDRNOTAVAIL)?;
    if attached {
        // SAFETY: id->qp is NULL or a live QP of ours.
        if let Some(d) = unsafe { qp_from_raw(obj.id.qp) }.and_then(|q| q.dgram()) {
            let _ = d.detach_mcast(g);
        }
    }
    Ok(())
}

/// An address vector toward `ip` (GID routed: the IPv4-mapped address).
pub fn ah_attr_to(ip: IpAddr, dlid: u16) -> ibv_ah_attr {
    // SAFETY: all-zero is a valid ibv_ah_attr.
    let mut a: ibv_ah_attr = unsafe { std::mem::zeroed() };
    a.grh.dgid = objects::gid_of(ip);
    a.grh.sgid_index = 0;
    a.grh.hop_limit = 64;
    a.is_global = 1;
    a.dlid = dlid;
    a.port_num = 1;
    a
}

/// `rdma_init_qp_attr`: the attributes rdma_cm would use to move the id's
/// QP to `attr->qp_state`.
pub fn init_qp_attr(obj: &IdObj, attr: &mut ibv_qp_attr) -> Res<c_int> {
    let ud = is_ud(obj.id.ps);
    let mask = match attr.qp_state {
        IBV_QPS_INIT => {
            attr.pkey_index = 0;
            attr.port_num = 1;
            if ud {
                attr.qkey = RDMA_UDP_QKEY;
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY
            } else {
                attr.qp_access_flags = (IBV_ACCESS_LOCAL_WRITE
                    | IBV_ACCESS_REMOTE_WRITE
                    | IBV_ACCESS_REMOTE_READ) as u32;
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
            }
        }
        // iWARP: the connection manager moves the QP; RTR and RTS are
        // state changes only (what the kernel's iw_cm reports too).
        IBV_QPS_RTR => IBV_QP_STATE,
        IBV_QPS_RTS => {
            attr.sq_psn = 0;
            IBV_QP_STATE | if ud { IBV_QP_SQ_PSN } else { 0 }
        }
        _ => return Err(libc::EINVAL),
    };
    Ok(mask)
}

/// `rdma_migrate_id`: later events of the id go to `chan`; events already
/// queued for it follow it. As rdma_migrate_id(3): a NULL `chan` makes
/// the id synchronous (on a channel of its own; `EINVAL` if it already
/// is), and a synchronous id moved to an application's channel is
/// asynchronous from then on (its held event is freed, its own channel
/// closed).
///
/// # Safety
/// `chan` is NULL or a live channel.
pub unsafe fn migrate(obj: &mut IdObj, chan: *mut ChanObj) -> Res<()> {
    let was_sync = obj.sync();
    let (chan, made) = if chan.is_null() {
        if was_sync {
            return Err(libc::EINVAL);
        }
        (create_channel()?, true)
    } else {
        (chan, false)
    };
    // SAFETY: contract, or just created.
    let c = unsafe { &*chan };
    let old = obj.chan();
    c.shared.adopt(&old);
    *lock(&obj.chan) = c.shared.clone();
    obj.id.channel = chan as *mut rdma_event_channel;
    let me = obj as *mut IdObj as usize;
    let mine: Vec<Pending> = {
        let mut q = lock(&old.queue);
        let (mine, rest): (VecDeque<Pending>, VecDeque<Pending>) =
            q.drain(..).partition(|p| p.id == me);
        *q = rest;
        mine.into_iter().collect()
    };
    for p in mine {
        c.shared.push(p);
    }
    if was_sync {
        if let Some(h) = lock(&obj.st).held.take() {
            obj.id.event = std::ptr::null_mut();
            // SAFETY: an event we allocated and held.
            unsafe { free_event(h as *mut rdma_cm_event) };
        }
        // The old channel lives on while adopted (its engine events are
        // pumped by the new one); only the application-facing object goes.
        // SAFETY: the channel create_id made for this id, dropped once.
        drop(unsafe { Box::from_raw(obj.own_chan) });
        obj.own_chan = std::ptr::null_mut();
    }
    if made {
        obj.own_chan = chan;
    }
    Ok(())
}
