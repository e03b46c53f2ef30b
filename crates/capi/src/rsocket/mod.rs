//! rsockets (`rdma/rsocket.h`) over softrdma: stream sockets whose data
//! travels over an RC queue pair instead of kernel TCP.
//!
//! librdmacm.so.1 forwards `rsocket`, `rbind`, … to [`ffi`] (exported as
//! `softrdma_r*`, see `crates/capi-rdmacm`). Only `SOCK_STREAM` over
//! IPv4/IPv6 is provided; `SOCK_DGRAM` rsockets fail with `EOPNOTSUPP`.
//! The wire protocol is ours (see [`conn`]), so both ends must use
//! softrdma's librdmacm; it does not interoperate with rdma-core's
//! rsockets.
//!
//! * An rsocket's number is a real descriptor (an eventfd, never readable)
//!   reserved so numbers never collide with the process's other
//!   descriptors; `rpoll` and `rselect` accept both kinds.
//! * `rsocket` takes `SOCK_STREAM` exactly, as rdma-core's does (no type
//!   flags), and never succeeds from inside softrdma's own calls: so
//!   rdma-core's `librspreload.so`, which offers every `socket()` of a
//!   process to `rsocket()` first, gets kernel sockets for the engine's
//!   own TCP connections (made with `SOCK_CLOEXEC`) instead of recursing
//!   into rsockets for ever.
//! * Blocking calls wait on the connection's completion channel or CM
//!   event channel, after polling for [`SPIN`] (`SOFTRDMA_RSOCKET_SPIN_US`);
//!   `rpoll` with a timeout polls as long first. `O_NONBLOCK` (`rfcntl`)
//!   and `MSG_DONTWAIT` make them fail with `EAGAIN` instead; `rconnect`
//!   then returns `EINPROGRESS` and completes in the background
//!   (`POLLOUT`, then `SO_ERROR`). `rpoll` sleeps only once its
//!   connections' CQs are armed with nothing new found.
//! * Socket options: `SO_ERROR` is real; `SO_REUSEADDR` is always in effect
//!   (the listener is a TCP socket with it set); buffer sizes, TCP options
//!   and the `SOL_RDMA` sizes are recorded and read back but do not change
//!   the fixed slot sizes of [`conn`]. `RDMA_ROUTE` is refused
//!   (`ENOTSUP`): there are no path records.
//! * `riomap` registers the buffer for remote write and tells the peer;
//!   `riowrite` RDMA-Writes into the peer's mapping; `PROT_READ` mappings
//!   are not supported (`EINVAL`), as in rdma-core. `riomap`, `riounmap`
//!   and `rshutdown` never fail with `EAGAIN`: on a non-blocking socket
//!   too they wait until their message to the peer can go.
//! * `rclose` sends FIN and waits (at most [`LINGER`]) for outstanding
//!   sends and the peer's FIN before disconnecting, so data sent just
//!   before closing arrives.

pub mod conn;
pub mod ffi;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use softrdma_engine::cm::ConnParams;
use softrdma_engine::cm_events::{CmEvent, CmId, EventChannel};

use conn::{Blocked, Conn};

/// `SOL_RDMA` from rsocket.h.
pub const SOL_RDMA: i32 = 0x10000;
/// `RDMA_SQSIZE`.
pub const RDMA_SQSIZE: i32 = 0;
/// `RDMA_RQSIZE`.
pub const RDMA_RQSIZE: i32 = 1;
/// `RDMA_INLINE`.
pub const RDMA_INLINE: i32 = 2;
/// `RDMA_IOMAPSIZE`.
pub const RDMA_IOMAPSIZE: i32 = 3;
/// `RDMA_ROUTE`.
pub const RDMA_ROUTE: i32 = 4;

/// How long `rclose` waits for outstanding sends and the peer's FIN.
pub const LINGER: Duration = Duration::from_secs(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An errno result.
pub type Res<T> = Result<T, i32>;

enum St {
    Fresh,
    Listening {
        chan_fd: i32,
        chan: EventChannel,
        id: CmId,
        pending: VecDeque<(CmId, SocketAddr)>,
    },
    Connecting {
        chan: EventChannel,
        id: CmId,
        conn: Box<Conn>,
    },
    Connected {
        /// The channel of an id we connected (kept for its lifetime).
        _chan: Option<EventChannel>,
        _id: CmId,
        conn: Box<Conn>,
    },
    Failed,
    Closed,
}

struct RSock {
    nonblock: bool,
    bound: Option<SocketAddr>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    family: i32,
    st: St,
    /// Options recorded for read-back: (level, name) → value.
    opts: HashMap<(i32, i32), i32>,
    /// Pending `SO_ERROR`.
    so_error: i32,
    shut_rd: bool,
}

impl RSock {
    fn new(family: i32, nonblock: bool, st: St) -> RSock {
        RSock {
            nonblock,
            bound: None,
            local: None,
            peer: None,
            family,
            st,
            opts: HashMap::new(),
            so_error: 0,
            shut_rd: false,
        }
    }

    fn any_addr(&self) -> SocketAddr {
        if self.family == libc::AF_INET6 {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
        } else {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
        }
    }
}

struct Entry {
    /// The reserved descriptor whose number is the rsocket's.
    _fd: OwnedFd,
    sock: Mutex<RSock>,
}

type Table = HashMap<i32, Arc<Entry>>;

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn get(fd: i32) -> Res<Arc<Entry>> {
    lock(&TABLE)
        .as_ref()
        .and_then(|t| t.get(&fd).cloned())
        .ok_or(libc::EBADF)
}

/// True if `fd` is an rsocket of this process.
pub fn is_rsocket(fd: i32) -> bool {
    get(fd).is_ok()
}

fn insert(sock: RSock) -> Res<i32> {
    // SAFETY: no pointers; eventfd returns a new descriptor or -1.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(errno());
    }
    // SAFETY: `raw` is a descriptor we just opened and own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let n = fd.as_raw_fd();
    lock(&TABLE).get_or_insert_with(HashMap::new).insert(
        n,
        Arc::new(Entry {
            _fd: fd,
            sock: Mutex::new(sock),
        }),
    );
    Ok(n)
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

thread_local! {
    static INTERNAL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Marks the calling thread as running softrdma's own work for as long as
/// it lives: an `rsocket()` call meanwhile (an interposed `socket()` of
/// the engine's, turned into `rsocket()` by `librspreload.so`) fails with
/// `ENOTSUP`, so the interposer makes a kernel socket instead of recursing.
struct Internal(());

impl Internal {
    /// Enters (nests).
    fn enter() -> Internal {
        INTERNAL.with(|c| c.set(c.get() + 1));
        Internal(())
    }

    /// True while this thread is inside softrdma's own work.
    fn active() -> bool {
        INTERNAL.with(|c| c.get() > 0)
    }
}

impl Drop for Internal {
    fn drop(&mut self) {
        INTERNAL.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

fn engine() -> Res<softrdma_engine::Context> {
    let _in = Internal::enter();
    crate::rdmacm::engine()
}

fn io_errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

// ----------------------------------------------------------------------
// Socket addresses
// ----------------------------------------------------------------------

/// Reads a `sockaddr` (IPv4 or IPv6).
///
/// # Safety
/// `addr` must point to `len` readable octets (or be null).
pub unsafe fn sockaddr_read(addr: *const libc::sockaddr, len: u32) -> Res<SocketAddr> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: at least the family is readable (checked above).
    let family = i32::from(unsafe { (*addr).sa_family });
    match family {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: long enough for a sockaddr_in (checked); unaligned read.
            let sin = unsafe { std::ptr::read_unaligned(addr as *const libc::sockaddr_in) };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: long enough for a sockaddr_in6 (checked); unaligned read.
            let s6 = unsafe { std::ptr::read_unaligned(addr as *const libc::sockaddr_in6) };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s6.sin6_addr.s6_addr),
                u16::from_be(s6.sin6_port),
                s6.sin6_flowinfo,
                s6.sin6_scope_id,
            )))
        }
        libc::AF_INET | libc::AF_INET6 => Err(libc::EINVAL),
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// The `sockaddr_storage` for `a` and its length.
pub fn sockaddr_of(a: &SocketAddr) -> (libc::sockaddr_storage, u32) {
    // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits in a sockaddr_storage.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let s6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: a sockaddr_in6 fits in a sockaddr_storage.
            unsafe { std::ptr::write(&mut ss as *mut _ as *mut libc::sockaddr_in6, s6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as u32)
}

/// Writes `a` to a caller's `sockaddr`/`socklen_t` pair, truncating as
/// `getsockname(2)` does.
///
/// With `addr` null only the length is written, as rdma-core's rsockets
/// do (`librspreload.so` asks `rgetsockname` so for the family of the
/// kernel socket it falls back to).
///
/// # Safety
/// `addr` must point to `*len` writable octets, `len` to a `socklen_t`
/// (either may be null: nothing is written there then).
pub unsafe fn sockaddr_write(a: &SocketAddr, addr: *mut libc::sockaddr, len: *mut u32) {
    if len.is_null() {
        return;
    }
    let (ss, n) = sockaddr_of(a);
    if addr.is_null() {
        // SAFETY: `len` is a valid socklen_t (caller).
        unsafe { *len = n };
        return;
    }
    // SAFETY: `len` is a valid socklen_t (caller).
    let room = unsafe { *len } as usize;
    // SAFETY: the caller provides `room` writable octets at `addr`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            &ss as *const _ as *const u8,
            addr as *mut u8,
            room.min(n as usize),
        );
        *len = n;
    }
}

// ----------------------------------------------------------------------
// Waiting
// ----------------------------------------------------------------------

fn millis_until(deadline: Option<Instant>) -> i32 {
    deadline.map_or(-1, |d| {
        d.saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128) as i32
    })
}

/// Waits until one of `fds` is readable or `deadline` passes.
fn wait_readable(fds: &[i32], deadline: Option<Instant>) {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `p` is a live array of `p.len()` pollfds.
    let _ = unsafe {
        libc::poll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            millis_until(deadline),
        )
    };
}

fn drain(s: &RSock) {
    if let St::Connected { conn, .. } | St::Connecting { conn, .. } = &s.st {
        conn.drain_wakeups();
    }
}

/// Progress for a socket; returns the descriptors to wait on while it
/// is not ready (empty: look again at once).
fn progress(s: &mut RSock) -> Vec<i32> {
    progress_with(s, true)
}

/// [`progress`]; a connection's CQ is armed only with `arm` (a caller that
/// will look again soon instead of sleeping leaves it alone, so the
/// engine keeps leaving the socket to this thread's polls).
fn progress_with(s: &mut RSock, arm: bool) -> Vec<i32> {
    match &mut s.st {
        St::Listening {
            chan,
            pending,
            chan_fd,
            ..
        } => {
            while let Some(ev) = chan.try_get_event() {
                if let CmEvent::ConnectRequest {
                    id,
                    private_data,
                    peer,
                    ..
                } = ev
                {
                    if private_data == conn::PD_MAGIC {
                        pending.push_back((id, peer));
                    } else {
                        // Not an rsocket peer.
                        let _ = id.reject(&[]);
                    }
                }
            }
            if pending.is_empty() {
                vec![*chan_fd]
            } else {
                Vec::new()
            }
        }
        St::Connecting { chan, conn, id } => {
            let mut next = None;
            while let Some(ev) = chan.try_get_event() {
                match ev {
                    CmEvent::Established { .. } => next = Some(Ok(())),
                    CmEvent::Rejected { .. } => next = Some(Err(libc::ECONNREFUSED)),
                    CmEvent::Unreachable { status, .. } | CmEvent::ConnectError { status, .. } => {
                        next = Some(Err(if status < 0 {
                            -status
                        } else {
                            libc::ECONNREFUSED
                        }))
                    }
                    _ => {}
                }
            }
            let fds = vec![chan.fd(), conn.wait_fd()];
            match next {
                Some(Ok(())) => {
                    if let St::Connecting { chan, id, conn } =
                        std::mem::replace(&mut s.st, St::Failed)
                    {
                        s.st = St::Connected {
                            _chan: Some(chan),
                            _id: id,
                            conn,
                        };
                    }
                    Vec::new()
                }
                Some(Err(e)) => {
                    id.destroy();
                    s.so_error = e;
                    s.st = St::Failed;
                    Vec::new()
                }
                None => fds,
            }
        }
        St::Connected { conn, .. } => {
            // Anything that completed may be what the caller waits for:
            // look again before arming and sleeping.
            if conn.progress() || (arm && conn.arm()) {
                return Vec::new();
            }
            vec![conn.wait_fd()]
        }
        St::Fresh | St::Failed | St::Closed => Vec::new(),
    }
}

/// How long a blocking call on a connection, or an `rpoll` that may wait,
/// keeps polling before it arms the CQ and sleeps, unless
/// `SOFTRDMA_RSOCKET_SPIN_US` says otherwise (rdma-core's rsockets poll
/// for a configurable time too). What arrives meanwhile is read and placed
/// by the caller's own polls; after it, by the engine's progress thread,
/// which then wakes the caller through the completion channel: two
/// hand-overs between threads. A 64 B sockperf ping-pong under
/// `librspreload.so` on two busy cores: median 51-66 µs without polling,
/// 13-21 µs with 50 µs of it (most replies come within it).
pub const SPIN: Duration = Duration::from_micros(50);

/// [`SPIN`], or `SOFTRDMA_RSOCKET_SPIN_US` (microseconds; 0: sleep at once).
fn spin() -> Duration {
    static US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    Duration::from_micros(*US.get_or_init(|| {
        std::env::var("SOFTRDMA_RSOCKET_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(SPIN.as_micros() as u64)
    }))
}

/// Runs `op` on the socket until it stops saying "would block", waiting
/// between tries unless the call is non-blocking (polling for [`SPIN`]
/// first).
fn blocking<T>(
    e: &Entry,
    dontwait: bool,
    op: impl FnMut(&mut RSock) -> Result<T, Blocked>,
) -> Res<T> {
    wait_for(e, Some(dontwait), op)
}

/// [`blocking`] for calls that rdma-core's rsockets never fail with
/// `EAGAIN` (`riomap` and `riounmap` queue their message to the peer
/// there, `rshutdown` blocks): they wait, on a non-blocking socket too,
/// for what their message needs — a send slot, which completions free
/// without the peer's help, and a peer credit, of which the data path
/// leaves [`conn::RESERVE`] for such messages.
fn waiting<T>(e: &Entry, op: impl FnMut(&mut RSock) -> Result<T, Blocked>) -> Res<T> {
    wait_for(e, None, op)
}

/// [`blocking`] (`Some(dontwait)`) or [`waiting`] (`None`).
fn wait_for<T>(
    e: &Entry,
    dontwait: Option<bool>,
    mut op: impl FnMut(&mut RSock) -> Result<T, Blocked>,
) -> Res<T> {
    let mut spin_until = None;
    loop {
        let fds = {
            let mut s = lock(&e.sock);
            match op(&mut s) {
                Ok(v) => return Ok(v),
                Err(Blocked::Errno(err)) => return Err(err),
                Err(Blocked::Again) if dontwait.is_some_and(|d| d || s.nonblock) => {
                    return Err(libc::EAGAIN)
                }
                Err(Blocked::Again) => {}
            }
            if matches!(s.st, St::Connected { .. }) {
                let now = Instant::now();
                if now < *spin_until.get_or_insert_with(|| now + spin()) {
                    // `op` made progress already; look again.
                    drop(s);
                    std::hint::spin_loop();
                    continue;
                }
            }
            let fds = progress(&mut s);
            if fds.is_empty() {
                continue;
            }
            fds
        };
        wait_readable(&fds, None);
        drain(&lock(&e.sock));
    }
}

// ----------------------------------------------------------------------
// The calls
// ----------------------------------------------------------------------

/// `rsocket(domain, type, protocol)`.
///
/// As rdma-core's: the type is `SOCK_STREAM` exactly (no `SOCK_NONBLOCK`
/// or `SOCK_CLOEXEC` flags; non-blocking is `rfcntl(F_SETFL)`), the
/// protocol 0 or `IPPROTO_TCP`, anything else `ENOTSUP`. Besides
/// compatibility this is what lets `librspreload.so` run over softrdma: it
/// offers every `socket()` of the process to `rsocket()` first and makes a
/// kernel socket when that fails, and softrdma's own kernel sockets (the
/// engine's TCP connections and listeners, made while an rsocket listens
/// or connects) are all created with `SOCK_CLOEXEC`. A call made while
/// this thread runs `rlisten`, `raccept` or `rconnect` is refused too.
pub fn socket(domain: i32, ty: i32, protocol: i32) -> Res<i32> {
    if Internal::active() {
        return Err(libc::ENOTSUP);
    }
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(libc::EAFNOSUPPORT);
    }
    if ty != libc::SOCK_STREAM || (protocol != 0 && protocol != libc::IPPROTO_TCP) {
        return Err(libc::ENOTSUP);
    }
    insert(RSock::new(domain, false, St::Fresh))
}

/// `rbind`.
pub fn bind(fd: i32, addr: SocketAddr) -> Res<()> {
    let e = get(fd)?;
    let mut s = lock(&e.sock);
    if !matches!(s.st, St::Fresh) || s.bound.is_some() {
        return Err(libc::EINVAL);
    }
    s.bound = Some(addr);
    s.local = Some(addr);
    Ok(())
}

/// `rlisten`.
pub fn listen(fd: i32, backlog: i32) -> Res<()> {
    let _in = Internal::enter();
    let e = get(fd)?;
    let ctx = engine()?;
    let mut s = lock(&e.sock);
    if !matches!(s.st, St::Fresh) {
        return Err(libc::EINVAL);
    }
    let addr = s.bound.unwrap_or_else(|| s.any_addr());
    let chan = EventChannel::new().map_err(io_errno)?;
    let id = chan.create_id(&ctx);
    let local = id
        .listen(addr, backlog.max(0) as u32)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EADDRINUSE))?;
    s.local = Some(local);
    s.st = St::Listening {
        chan_fd: chan.fd(),
        chan,
        id,
        pending: VecDeque::new(),
    };
    Ok(())
}

/// `raccept`: the new rsocket and the peer's address.
pub fn accept(fd: i32) -> Res<(i32, SocketAddr)> {
    let _in = Internal::enter();
    let e = get(fd)?;
    let ctx = engine()?;
    let (id, peer, local, family) = blocking(&e, false, |s| {
        progress(s);
        let (local, family) = (s.local, s.family);
        match &mut s.st {
            St::Listening { pending, .. } => match pending.pop_front() {
                Some((id, peer)) => Ok((id, peer, local, family)),
                None => Err(Blocked::Again),
            },
            _ => Err(Blocked::Errno(libc::EINVAL)),
        }
    })?;
    let conn = match Conn::new(&ctx) {
        Ok(c) => Box::new(c),
        Err(_) => {
            let _ = id.reject(&[]);
            return Err(libc::ENOMEM);
        }
    };
    let params = ConnParams {
        private_data: conn::PD_MAGIC.to_vec(),
        ..ConnParams::default()
    };
    if id.accept(conn.qp(), &params).is_err() {
        return Err(libc::ECONNABORTED);
    }
    let mut s = RSock::new(
        family,
        false,
        St::Connected {
            _chan: None,
            _id: id,
            conn,
        },
    );
    s.local = local;
    s.peer = Some(peer);
    Ok((insert(s)?, peer))
}

fn connect_outcome(s: &mut RSock) -> Result<(), Blocked> {
    match s.st {
        St::Connected { .. } => Ok(()),
        St::Failed => {
            let err = std::mem::take(&mut s.so_error);
            Err(Blocked::Errno(if err == 0 {
                libc::ECONNREFUSED
            } else {
                err
            }))
        }
        St::Connecting { .. } => Err(Blocked::Again),
        _ => Err(Blocked::Errno(libc::EINVAL)),
    }
}

/// `rconnect`.
pub fn connect(fd: i32, addr: SocketAddr) -> Res<()> {
    let _in = Internal::enter();
    let e = get(fd)?;
    let ctx = engine()?;
    {
        let mut s = lock(&e.sock);
        match s.st {
            St::Fresh => {}
            St::Connecting { .. } => return Err(libc::EALREADY),
            St::Connected { .. } => return Err(libc::EISCONN),
            _ => return Err(libc::EINVAL),
        }
        let conn = Box::new(Conn::new(&ctx).map_err(|_| libc::ENOMEM)?);
        let chan = EventChannel::new().map_err(io_errno)?;
        let id = chan.create_id(&ctx);
        let params = ConnParams {
            private_data: conn::PD_MAGIC.to_vec(),
            ..ConnParams::default()
        };
        id.connect(conn.qp(), addr, &params)
            .map_err(|_| libc::ECONNREFUSED)?;
        s.peer = Some(addr);
        s.st = St::Connecting { chan, id, conn };
        if s.nonblock {
            return Err(libc::EINPROGRESS);
        }
    }
    blocking(&e, false, |s| {
        progress(s);
        connect_outcome(s)
    })
}

fn conn_of(s: &mut RSock) -> Result<&mut Conn, Blocked> {
    if matches!(s.st, St::Connecting { .. }) {
        progress(s);
    }
    match &mut s.st {
        St::Connected { conn, .. } => Ok(conn),
        St::Connecting { .. } => Err(Blocked::Again),
        _ => Err(Blocked::Errno(libc::ENOTCONN)),
    }
}

/// `rsend`.
pub fn send(fd: i32, data: &[u8], flags: i32) -> Res<usize> {
    let e = get(fd)?;
    if data.is_empty() {
        return Ok(0);
    }
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    blocking(&e, dontwait, |s| conn_of(s)?.send(data))
}

/// `rrecv`.
pub fn recv(fd: i32, out: &mut [u8], flags: i32) -> Res<usize> {
    let e = get(fd)?;
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    let peek = flags & libc::MSG_PEEK != 0;
    let waitall = flags & libc::MSG_WAITALL != 0 && !peek;
    let mut done = 0;
    loop {
        let r = blocking(&e, dontwait, |s| {
            if s.shut_rd {
                return Ok(0);
            }
            conn_of(s)?.recv(&mut out[done..], peek)
        });
        match r {
            Ok(0) => return Ok(done),
            Ok(n) => {
                done += n;
                if !waitall || done == out.len() {
                    return Ok(done);
                }
            }
            // Octets already received are returned; the error stays for
            // the next call (SO_ERROR / the connection's state).
            Err(_) if done > 0 => return Ok(done),
            Err(err) => return Err(err),
        }
    }
}

/// `rshutdown`.
pub fn shutdown(fd: i32, how: i32) -> Res<()> {
    let e = get(fd)?;
    if !matches!(how, libc::SHUT_RD | libc::SHUT_WR | libc::SHUT_RDWR) {
        return Err(libc::EINVAL);
    }
    if how != libc::SHUT_WR {
        lock(&e.sock).shut_rd = true;
    }
    if how != libc::SHUT_RD {
        // As rdma-core's, which makes the socket blocking for this: the
        // FIN waits for a send slot on a non-blocking socket too.
        return waiting(&e, |s| match &mut s.st {
            St::Connected { conn, .. } => conn.shutdown_write(),
            _ => Err(Blocked::Errno(libc::ENOTCONN)),
        });
    }
    Ok(())
}

/// `rclose`: sends FIN, waits (at most [`LINGER`]) for outstanding sends
/// and the peer's FIN, then disconnects and frees everything.
pub fn close(fd: i32) -> Res<()> {
    let e = lock(&TABLE)
        .as_mut()
        .and_then(|t| t.remove(&fd))
        .ok_or(libc::EBADF)?;
    let deadline = Instant::now() + LINGER;
    loop {
        let fds = {
            let mut s = lock(&e.sock);
            let St::Connected { conn, .. } = &mut s.st else {
                break;
            };
            if conn.error().is_some() {
                break;
            }
            let _ = conn.shutdown_write();
            conn.progress();
            if conn.sends_idle() && conn.peer_closed() {
                break;
            }
            if conn.arm() {
                continue;
            }
            vec![conn.wait_fd()]
        };
        if Instant::now() >= deadline {
            break;
        }
        wait_readable(&fds, Some(deadline));
        drain(&lock(&e.sock));
    }
    let mut s = lock(&e.sock);
    if let St::Listening { id, .. } | St::Connecting { id, .. } = &s.st {
        id.destroy();
    }
    s.st = St::Closed;
    Ok(())
}

/// What to wait on for a change of `s`'s readiness (nothing: it cannot
/// change by itself).
fn wait_fds(s: &RSock) -> Vec<i32> {
    match &s.st {
        St::Listening { chan_fd, .. } => vec![*chan_fd],
        St::Connecting { chan, conn, .. } => vec![chan.fd(), conn.wait_fd()],
        St::Connected { conn, .. } => vec![conn.wait_fd()],
        St::Fresh | St::Failed | St::Closed => Vec::new(),
    }
}

fn revents(s: &RSock, events: i16) -> i16 {
    let mut r: i16 = 0;
    match &s.st {
        St::Listening { pending, .. } => {
            if !pending.is_empty() {
                r |= libc::POLLIN;
            }
        }
        St::Connecting { .. } => {}
        // As an unconnected TCP socket: hung up, writable.
        St::Fresh => r |= libc::POLLOUT | libc::POLLHUP,
        St::Connected { conn, .. } => {
            if conn.readable() || s.shut_rd {
                r |= libc::POLLIN;
            }
            if conn.writable() {
                r |= libc::POLLOUT;
            }
            if conn.error().is_some() {
                r |= libc::POLLERR;
            }
            if conn.peer_closed() {
                r |= libc::POLLRDHUP;
            }
        }
        St::Failed => r |= libc::POLLOUT | libc::POLLERR | libc::POLLHUP,
        St::Closed => r |= libc::POLLNVAL,
    }
    r & (events | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL)
}

/// What [`settle`] found for one rsocket of a poll.
enum Settled {
    /// These events are ready.
    Ready(i16),
    /// Nothing is ready; a change will make one of these readable.
    Wait(Vec<i32>),
    /// Nothing is ready, but the socket kept changing: look again.
    Busy,
}

/// How often [`settle`] makes progress on one rsocket before it gives up
/// for this round.
const SETTLE_ROUNDS: usize = 64;

/// Makes progress on `s` until `events` are ready or it is safe to sleep
/// on its wake-up descriptors: a connection's CQ is armed only when its
/// progress found nothing new, so a round that handled a completion the
/// caller does not wait for (a send completing, a credit arriving) or that
/// changed the state (connected) must look again before sleeping.
fn settle(s: &mut RSock, events: i16, arm: bool) -> Settled {
    for _ in 0..SETTLE_ROUNDS {
        let fds = progress_with(s, arm);
        let r = revents(s, events);
        if r != 0 {
            return Settled::Ready(r);
        }
        if !fds.is_empty() {
            return Settled::Wait(fds);
        }
        if !arm || !matches!(s.st, St::Connected { .. } | St::Connecting { .. }) {
            // Nothing to arm (or not now): what can change it is on these.
            return Settled::Wait(wait_fds(s));
        }
    }
    Settled::Busy
}

/// `rpoll` over rsockets and ordinary descriptors alike.
///
/// # Safety
/// `fds` must point to `nfds` pollfds (or be null with `nfds` 0).
pub unsafe fn poll(fds: *mut libc::pollfd, nfds: usize, timeout: i32) -> Res<i32> {
    if nfds == 0 {
        if timeout != 0 {
            let ms = if timeout < 0 {
                u64::MAX / 4
            } else {
                timeout as u64
            };
            std::thread::sleep(Duration::from_millis(ms));
        }
        return Ok(0);
    }
    if fds.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller passes `nfds` live pollfds.
    let fds = unsafe { std::slice::from_raw_parts_mut(fds, nfds) };
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    let spin_until = (timeout != 0).then(|| Instant::now() + spin());
    loop {
        // While spinning, rsockets are only polled; then armed, to sleep.
        let spinning = spin_until.is_some_and(|t| Instant::now() < t);
        let mut ready = 0;
        let mut busy = false;
        let mut waits: Vec<i32> = Vec::new();
        let mut real: Vec<(usize, libc::pollfd)> = Vec::new();
        for (i, p) in fds.iter_mut().enumerate() {
            p.revents = 0;
            if p.fd < 0 {
                continue;
            }
            match get(p.fd) {
                Ok(e) => {
                    let mut s = lock(&e.sock);
                    match settle(&mut s, p.events, !spinning) {
                        Settled::Ready(r) => {
                            p.revents = r;
                            ready += 1;
                        }
                        Settled::Wait(fds) => waits.extend(fds),
                        Settled::Busy => busy = true,
                    }
                }
                Err(_) => real.push((
                    i,
                    libc::pollfd {
                        fd: p.fd,
                        events: p.events,
                        revents: 0,
                    },
                )),
            }
        }
        if !real.is_empty() {
            let mut v: Vec<libc::pollfd> = real.iter().map(|r| r.1).collect();
            // SAFETY: `v` is a live array of `v.len()` pollfds.
            let n = unsafe { libc::poll(v.as_mut_ptr(), v.len() as libc::nfds_t, 0) };
            if n < 0 {
                return Err(errno());
            }
            for ((i, _), p) in real.iter().zip(&v) {
                if p.revents != 0 {
                    fds[*i].revents = p.revents;
                    ready += 1;
                }
            }
        }
        if ready > 0 {
            return Ok(ready);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(0);
        }
        if busy {
            // An rsocket kept changing: look again instead of sleeping on
            // a wake-up that may not be armed.
            std::thread::yield_now();
            continue;
        }
        if spinning && !waits.is_empty() {
            std::hint::spin_loop();
            continue;
        }
        let mut v: Vec<libc::pollfd> = real.iter().map(|r| r.1).collect();
        v.extend(waits.iter().map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }));
        // SAFETY: `v` is a live array of `v.len()` pollfds.
        let n = unsafe {
            libc::poll(
                v.as_mut_ptr(),
                v.len() as libc::nfds_t,
                millis_until(deadline),
            )
        };
        if n < 0 && errno() != libc::EINTR {
            return Err(errno());
        }
        for p in fds.iter() {
            if let Ok(e) = get(p.fd) {
                drain(&lock(&e.sock));
            }
        }
    }
}

/// `rsetsockopt` for an `int`-valued option.
pub fn setsockopt(fd: i32, level: i32, name: i32, value: Option<i32>) -> Res<()> {
    let e = get(fd)?;
    let mut s = lock(&e.sock);
    let known = match level {
        libc::SOL_SOCKET => matches!(
            name,
            libc::SO_REUSEADDR
                | libc::SO_SNDBUF
                | libc::SO_RCVBUF
                | libc::SO_KEEPALIVE
                | libc::SO_OOBINLINE
        ),
        libc::IPPROTO_TCP => matches!(
            name,
            libc::TCP_NODELAY
                | libc::TCP_MAXSEG
                | libc::TCP_KEEPIDLE
                | libc::TCP_KEEPINTVL
                | libc::TCP_KEEPCNT
        ),
        libc::IPPROTO_IPV6 => name == libc::IPV6_V6ONLY,
        SOL_RDMA => match name {
            RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE | RDMA_IOMAPSIZE => true,
            RDMA_ROUTE => return Err(libc::ENOTSUP),
            _ => false,
        },
        _ => false,
    };
    if !known {
        return Err(libc::ENOTSUP);
    }
    let v = value.ok_or(libc::EINVAL)?;
    s.opts.insert((level, name), v);
    Ok(())
}

/// `rgetsockopt` for an `int`-valued option.
pub fn getsockopt(fd: i32, level: i32, name: i32) -> Res<i32> {
    let e = get(fd)?;
    let mut s = lock(&e.sock);
    if level == libc::SOL_SOCKET && name == libc::SO_ERROR {
        progress(&mut s);
        let mut err = std::mem::take(&mut s.so_error);
        if err == 0 {
            if let St::Connected { conn, .. } = &s.st {
                err = conn.error().unwrap_or(0);
            }
        }
        return Ok(err);
    }
    if let Some(v) = s.opts.get(&(level, name)) {
        return Ok(*v);
    }
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => Ok(1),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) | (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            Ok((conn::SLOT * conn::RX_SLOTS) as i32)
        }
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) | (libc::IPPROTO_TCP, libc::TCP_NODELAY) => Ok(0),
        (SOL_RDMA, RDMA_SQSIZE) => Ok(conn::TX_SLOTS as i32),
        (SOL_RDMA, RDMA_RQSIZE) => Ok(conn::RX_SLOTS as i32),
        (SOL_RDMA, RDMA_INLINE) => Ok(0),
        (SOL_RDMA, RDMA_IOMAPSIZE) => Ok(1),
        _ => Err(libc::ENOTSUP),
    }
}

/// `rgetsockopt(IPPROTO_TCP, TCP_INFO)`: what a stream of ours can say in
/// a kernel `struct tcp_info` — the state (established, listening or
/// closed) and the largest payload of one message as both segment sizes;
/// every counter (retransmissions, RTT, ...) zero. Programs that report
/// TCP statistics (iperf3) read it.
pub fn tcp_info(fd: i32) -> Res<libc::tcp_info> {
    let e = get(fd)?;
    let s = lock(&e.sock);
    // SAFETY: tcp_info is plain integers; all zeroes is valid.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    ti.tcpi_state = match s.st {
        St::Connected { .. } => 1,                // TCP_ESTABLISHED
        St::Connecting { .. } => 2,               // TCP_SYN_SENT
        St::Listening { .. } => 10,               // TCP_LISTEN
        St::Fresh | St::Failed | St::Closed => 7, // TCP_CLOSE
    };
    ti.tcpi_snd_mss = conn::MAX_DATA as u32;
    ti.tcpi_rcv_mss = conn::MAX_DATA as u32;
    Ok(ti)
}

/// `rfcntl(F_GETFL)` / `rfcntl(F_SETFL)`; other commands `ENOTSUP`.
pub fn fcntl(fd: i32, cmd: i32, arg: i64) -> Res<i32> {
    let e = get(fd)?;
    let mut s = lock(&e.sock);
    match cmd {
        libc::F_GETFL => Ok(libc::O_RDWR | if s.nonblock { libc::O_NONBLOCK } else { 0 }),
        libc::F_SETFL => {
            s.nonblock = arg as i32 & libc::O_NONBLOCK != 0;
            Ok(0)
        }
        _ => Err(libc::ENOTSUP),
    }
}

/// `rgetsockname`.
pub fn sockname(fd: i32) -> Res<SocketAddr> {
    let e = get(fd)?;
    let s = lock(&e.sock);
    Ok(s.local.unwrap_or_else(|| s.any_addr()))
}

/// `rgetpeername`.
pub fn peername(fd: i32) -> Res<SocketAddr> {
    let e = get(fd)?;
    let s = lock(&e.sock);
    match s.st {
        St::Connected { .. } => s.peer.ok_or(libc::ENOTCONN),
        _ => Err(libc::ENOTCONN),
    }
}

/// `riomap`: returns the offset.
///
/// # Safety
/// `buf..buf+len` must stay valid until `riounmap` or `rclose`.
pub unsafe fn iomap(fd: i32, buf: *mut u8, len: usize, prot: i32, offset: i64) -> Res<u64> {
    if prot & libc::PROT_WRITE == 0 || prot & libc::PROT_READ != 0 || buf.is_null() || len == 0 {
        return Err(libc::EINVAL);
    }
    let e = get(fd)?;
    // SAFETY: forwarded from the caller's contract.
    waiting(&e, |s| unsafe { conn_of(s)?.map(buf, len, offset) })
}

/// `riounmap`.
pub fn iounmap(fd: i32, buf: *mut u8) -> Res<()> {
    let e = get(fd)?;
    waiting(&e, |s| match &mut s.st {
        St::Connected { conn, .. } => conn.unmap(buf as u64),
        _ => Err(Blocked::Errno(libc::ENOTCONN)),
    })
}

/// `riowrite`.
pub fn iowrite(fd: i32, data: &[u8], offset: u64, flags: i32) -> Res<usize> {
    let e = get(fd)?;
    if data.is_empty() {
        return Ok(0);
    }
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    blocking(&e, dontwait, |s| conn_of(s)?.iowrite(data, offset))
}
