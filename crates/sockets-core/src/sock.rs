//! One application TCP socket softrdma watches: its phase (plain kernel
//! socket, MPA exchange, RC stream), and the socket calls on it.
//!
//! Every application socket keeps its kernel descriptor. While a socket
//! is plain ([`Sock::is_pass`]) every call goes to the kernel untouched.
//! A connection between two interposed ends runs the MPA exchange on the
//! connection's own TCP stream, then iWARP (MPA/DDP/RDMAP) on it: the QP
//! owns a duplicate of the descriptor, the application's descriptor stays
//! open for `fstat`, socket options and `getpeername`, and the data calls
//! go to the [`Conn`].
//!
//! The client decides before `connect`: it accelerates when the registry
//! shows an interposed listener at the destination (or a rule says so),
//! records itself in the registry, connects, and sends its MPA Request
//! without waiting; the Reply is read by whichever call next needs the
//! connection. The server decides at `accept`: a connection whose client
//! is in the registry gets its Request read (peeked first: anything else
//! leaves the socket to the kernel with no octet consumed). A server that
//! does not want the connection rejects it, and both ends then go on as
//! plain TCP on the same connection after the two MPA frames.

use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::c_int;
use softrdma_proto::mpa::{Initiator, Outcome};
use softrdma_wire::mpa as wmpa;

use crate::conn::{Conn, Params, StreamErr, PARAMS_LEN};
use crate::real::real;
use crate::registry::{ClientEntry, ListenerEntry};
use crate::stat::{Kind, Reason, Role, Slot, State};

/// A result that may tell the caller to do the kernel's call instead.
#[derive(Debug)]
pub enum Out<T> {
    /// The socket is plain: call the kernel.
    Pass,
    /// Done here: the value, or `errno`.
    Done(Result<T, c_int>),
}

/// How long a blocking call waits for the peer's MPA frame before the
/// connection is given up.
const MPA_TIMEOUT: Duration = Duration::from_secs(10);

enum Phase {
    /// Created; not connected or listening yet.
    Fresh,
    /// Listening (accept decides each connection).
    Listening,
    /// A non-blocking connect toward an interposed listener is under way.
    Connecting,
    /// Our MPA Request is out; the Reply is awaited.
    ClientMpa(Box<ClientMpa>),
    /// A softrdma client's MPA Request is awaited.
    ServerMpa,
    /// The stream runs over RC.
    Rc(Box<Conn>),
    /// Plain kernel socket.
    Kernel,
    /// The connection failed while softrdma had it: calls fail with this.
    Failed(c_int),
    /// A datagram socket with its UD QP.
    Ud(Box<UdState>),
    /// A DDPMODE socket switched to the Extended Sockets RDMA model: the
    /// EXS model drives the QP; the stream keeps what arrived before the
    /// peer's switch message for `recv`.
    Exs(Arc<Mutex<Conn>>, c_int),
}

/// What the sockets interposer hands the Extended Sockets RDMA model when
/// a DDPMODE socket switches (`docs/exs.md`, "DDPMODE sockets").
#[derive(Debug)]
pub struct Handover {
    /// The application's descriptor.
    pub fd: c_int,
    /// `AF_INET` or `AF_INET6`.
    pub family: c_int,
    /// The connection: its QP and CQ, and the stream protocol finishing
    /// on them ([`Conn::handover`]).
    pub conn: Arc<Mutex<Conn>>,
}

/// The Extended Sockets library in the same process (the interposer's
/// own `exs_*` exports) registers these.
#[derive(Debug, Clone, Copy)]
pub struct ExsHooks {
    /// Adopts the connection into the EXS RDMA model; returns this end's
    /// switch payload (its EXS parameters) or `errno`.
    pub adopt: fn(Handover) -> Result<Vec<u8>, c_int>,
    /// The application closed the descriptor of a switched socket.
    pub closed: fn(c_int),
}

static EXS_HOOKS: std::sync::OnceLock<ExsHooks> = std::sync::OnceLock::new();

/// Registers the EXS hooks (once).
pub fn set_exs_hooks(h: ExsHooks) {
    let _ = EXS_HOOKS.set(h);
}

/// A datagram socket's softrdma side.
struct UdState {
    end: crate::udp::UdEnd,
    _entry: Option<crate::registry::UdpEntry>,
}

struct ClientMpa {
    ini: Initiator,
    conn: Conn,
    efd: c_int,
    deadline: Instant,
}

struct Inner {
    phase: Phase,
    slot: Slot,
    listener: Option<ListenerEntry>,
    client: Option<ClientEntry>,
    shut_rd: bool,
    role: Role,
    /// The application switched the socket with `SOFTRDMA_DDPMODE`.
    ddp: bool,
    /// Datagram sockets without a UD QP yet: destinations found plain,
    /// and when (asked again after a second).
    dgram_plain: std::collections::HashMap<SocketAddr, Instant>,
    /// Datagram sockets: the `connect`ed peer.
    connected: Option<SocketAddr>,
    /// Datagram sockets: the transport `SOFTRDMA_TRANSPORT` chose (`None`:
    /// the process's `SOFTRDMA_SOCKETS_UDP`; `Some(None)`: the kernel).
    dgram_transport: Option<Option<crate::udp::Transport>>,
}

/// A socket softrdma watches.
pub struct Sock {
    /// `AF_INET` or `AF_INET6`.
    pub family: c_int,
    /// Stream (TCP) or datagram (UDP).
    pub kind: Kind,
    pass: AtomicBool,
    nonblock: AtomicBool,
    fds: AtomicUsize,
    /// Set in a forked child for a socket whose connection stays the
    /// parent's.
    inherited: AtomicBool,
    /// Engine objects are attached (a forked child cannot use them).
    engine: AtomicBool,
    lowat: AtomicUsize,
    rcvtimeo_us: AtomicU64,
    sndtimeo_us: AtomicU64,
    /// Bumped whenever the socket's readiness may have changed (epoll's
    /// edge-triggered entries report a change once).
    pub gen: AtomicU64,
    /// The application's epoll sets that hold the socket in the kernel
    /// (while it is plain): `(epfd, events, data)`. When softrdma takes
    /// the socket, these move to the sets' shadow lists.
    kernel_epolls: Mutex<Vec<(c_int, u32, u64)>>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Sock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sock")
            .field("family", &self.family)
            .field("pass", &self.is_pass())
            .finish_non_exhaustive()
    }
}

/// What `poll` needs of a socket softrdma carries.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ready {
    /// `POLL*` bits that hold now.
    pub events: i16,
    /// A descriptor whose readiness wakes a waiter, and for what.
    pub wait: Option<(c_int, i16)>,
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn fmt_addr(a: Option<SocketAddr>) -> String {
    a.map(|a| a.to_string()).unwrap_or_default()
}

fn local_addr(fd: c_int) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getsockname writes at most `len` octets into `ss`.
    let r = unsafe { libc::getsockname(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) };
    // SAFETY: `ss` holds `len` octets written by the kernel.
    (r == 0).then(|| unsafe { crate::addr::from_sockaddr(&ss as *const _ as *const _, len) })?
}

fn peer_addr(fd: c_int) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: getpeername writes at most `len` octets into `ss`.
    let r = unsafe { libc::getpeername(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) };
    // SAFETY: `ss` holds `len` octets written by the kernel.
    (r == 0).then(|| unsafe { crate::addr::from_sockaddr(&ss as *const _ as *const _, len) })?
}

/// Waits for `events` on `fd` until `deadline` (`None`: forever).
/// False on timeout. A signal handler that interrupts the wait ends it
/// with `Err(EINTR)` as it would end the kernel's blocking socket call —
/// unless the call has no timeout and the handler restarts calls
/// ([`crate::wait::signal_restarts`]): then the wait ends as a wake-up
/// and the caller carries on, as the restarted call would.
fn wait_fd(fd: c_int, events: i16, deadline: Option<Instant>) -> Result<bool, c_int> {
    let timeout = match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            left.as_millis().clamp(1, i32::MAX as u128) as c_int
        }
    };
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { (real().poll)(&mut p, 1, timeout) };
    match r {
        r if r > 0 => Ok(true),
        0 => Ok(false),
        _ => match errno() {
            libc::EINTR if deadline.is_none() && crate::wait::signal_restarts() => Ok(true),
            libc::EINTR => Err(libc::EINTR),
            _ => Ok(true),
        },
    }
}

/// Reads one whole MPA frame from `fd` if it has arrived, consuming
/// exactly its octets. `Err(None)`: the stream does not start with an
/// MPA frame of `key` (nothing consumed); `Err(Some(errno))`: the
/// connection ended.
fn take_frame(fd: c_int, key: &[u8; 16]) -> Result<Option<Vec<u8>>, Option<c_int>> {
    let mut head = [0u8; wmpa::HEADER_LEN];
    let peek = |buf: &mut [u8]| -> Result<usize, Option<c_int>> {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe {
            (real().recv)(
                fd,
                buf.as_mut_ptr() as *mut _,
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => Err(Some(libc::ECONNRESET)),
            n if n > 0 => Ok(n as usize),
            _ => match errno() {
                libc::EAGAIN | libc::EINTR => Ok(0),
                e => Err(Some(e)),
            },
        }
    };
    let n = peek(&mut head)?;
    let k = n.min(16);
    if head[..k] != key[..k] {
        return Err(None);
    }
    if n < wmpa::HEADER_LEN {
        return Ok(None);
    }
    let total = wmpa::frame_len(&head).unwrap_or(wmpa::HEADER_LEN);
    let mut frame = vec![0u8; total];
    if peek(&mut frame)? < total {
        return Ok(None);
    }
    // SAFETY: `frame` is writable for `total` octets, which are queued.
    let got = unsafe { (real().recv)(fd, frame.as_mut_ptr() as *mut _, total, libc::MSG_DONTWAIT) };
    if got != total as isize {
        return Err(Some(libc::EPROTO));
    }
    Ok(Some(frame))
}

fn send_all(fd: c_int, mut b: &[u8]) -> Result<(), c_int> {
    while !b.is_empty() {
        // SAFETY: `b` is readable for its length.
        let n = unsafe { (real().send)(fd, b.as_ptr() as *const _, b.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => {
                    let _ = wait_fd(fd, libc::POLLOUT, Some(Instant::now() + MPA_TIMEOUT));
                    continue;
                }
                e => return Err(e),
            }
        }
        b = &b[n as usize..];
    }
    Ok(())
}

fn dup_cloexec(fd: c_int) -> Result<c_int, c_int> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we were handed.
    let d = unsafe { (real().fcntl)(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if d < 0 {
        Err(errno())
    } else {
        Ok(d)
    }
}

fn close_raw(fd: c_int) {
    // SAFETY: closing a descriptor this module made.
    unsafe { (real().close)(fd) };
}

/// A connection the application closed, kept until it can end cleanly.
struct Lingering {
    conn: Box<Conn>,
    /// Give up (disconnect) at this instant whatever is left.
    give_up: Instant,
}

impl Lingering {
    /// Progresses; true when the connection was ended.
    fn step(&mut self, now: Instant) -> bool {
        if self.conn.close_step() || now >= self.give_up {
            self.conn.disconnect();
            return true;
        }
        false
    }
}

/// The connections the application closed that still send what was
/// written, or wait for the peer's end of stream.
static LINGER: Mutex<Vec<Lingering>> = Mutex::new(Vec::new());
static LINGER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// How long a closed connection may keep sending what was written.
const LINGER_MAX: Duration = Duration::from_secs(30);

fn linger(conn: Box<Conn>) {
    let mut l = LINGER.lock().unwrap_or_else(|e| e.into_inner());
    l.push(Lingering {
        conn,
        give_up: Instant::now() + LINGER_MAX,
    });
    let pid = std::process::id();
    if LINGER_PID.swap(pid, Ordering::Relaxed) != pid {
        let _ = std::thread::Builder::new()
            .name("softrdma-linger".into())
            .spawn(|| {
                crate::guard::enter_forever();
                loop {
                    std::thread::sleep(Duration::from_millis(2));
                    let now = Instant::now();
                    let mut l = LINGER.lock().unwrap_or_else(|e| e.into_inner());
                    l.retain_mut(|x| !x.step(now));
                }
            });
    }
}

/// At exit: gives the connections the application closed up to
/// [`LINGER_MAX`] to send what was written (the kernel would deliver a
/// closed socket's data after the process is gone; softrdma's send
/// buffers go with the process).
pub fn drain_lingering() {
    loop {
        let now = Instant::now();
        let mut l = LINGER.lock().unwrap_or_else(|e| e.into_inner());
        l.retain_mut(|x| !x.step(now));
        if l.is_empty() {
            return;
        }
        drop(l);
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Sock {
    /// A socket just created (`socket`, or `accept` for a server end).
    pub fn new(fd: c_int, family: c_int, nonblock: bool) -> Arc<Sock> {
        Self::with_kind(fd, family, nonblock, Kind::Stream)
    }

    /// A socket of `kind` just created.
    pub fn with_kind(fd: c_int, family: c_int, nonblock: bool, kind: Kind) -> Arc<Sock> {
        Arc::new(Sock {
            family,
            kind,
            pass: AtomicBool::new(true),
            nonblock: AtomicBool::new(nonblock),
            fds: AtomicUsize::new(1),
            inherited: AtomicBool::new(false),
            engine: AtomicBool::new(false),
            lowat: AtomicUsize::new(1),
            rcvtimeo_us: AtomicU64::new(0),
            sndtimeo_us: AtomicU64::new(0),
            gen: AtomicU64::new(0),
            kernel_epolls: Mutex::new(Vec::new()),
            inner: Mutex::new(Inner {
                phase: Phase::Fresh,
                slot: Slot::new(fd, kind),
                dgram_plain: std::collections::HashMap::new(),
                connected: None,
                dgram_transport: None,
                listener: None,
                client: None,
                shut_rd: false,
                role: Role::Unknown,
                ddp: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True while every call can go straight to the kernel (plain sockets,
    /// listeners, sockets not connected yet).
    pub fn is_pass(&self) -> bool {
        self.pass.load(Ordering::Acquire)
    }

    fn set_kernel(&self, inner: &mut Inner, reason: Reason) {
        inner.phase = Phase::Kernel;
        inner.client = None;
        inner.slot.set_state(State::Kernel, reason);
        self.pass.store(true, Ordering::Release);
        self.gen.fetch_add(1, Ordering::Relaxed);
    }

    /// softrdma takes the socket (it stops being plain): the kernel epoll
    /// registrations the application made move to the sets' shadow lists.
    fn take_over(self: &Arc<Self>, fd: c_int) {
        self.pass.store(false, Ordering::Release);
        let regs: Vec<_> =
            std::mem::take(&mut *self.kernel_epolls.lock().unwrap_or_else(|e| e.into_inner()));
        for (epfd, events, data) in regs {
            // SAFETY: removing the application's registration from its set.
            unsafe { (real().epoll_ctl)(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
            if let Some(set) = crate::table::epoll(epfd) {
                set.shadow_add(fd, self.clone(), events, data);
            }
        }
    }

    /// Records the application's kernel epoll registration of this (plain)
    /// socket: `op` on set `epfd` succeeded with `events`/`data`.
    pub fn note_kernel_epoll(&self, epfd: c_int, op: c_int, events: u32, data: u64) {
        let mut v = self.kernel_epolls.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|r| r.0 != epfd);
        if op != libc::EPOLL_CTL_DEL {
            v.push((epfd, events, data));
        }
    }

    /// `setsockopt(SOL_SOFTRDMA, SOFTRDMA_DDPMODE, 1)`: switches a
    /// connected plain socket to DDP, running the MPA exchange on the
    /// connection now (the client end initiates, the server end answers;
    /// both ends call it at the same point of their streams). Blocks until
    /// the exchange ends, at most `SO_RCVTIMEO` or 10 s. Errors: `ENOTCONN`
    /// (not connected), `ETIMEDOUT` (the peer did not switch), `EPROTO`
    /// (the peer sent other data first; it is left unread),
    /// `ECONNREFUSED` (the peer refused: its policy), `ENOMEM`.
    pub fn set_ddpmode(self: &Arc<Self>, fd: c_int) -> Result<(), c_int> {
        let deadline = Some(
            self.deadline(false)
                .unwrap_or_else(|| Instant::now() + MPA_TIMEOUT),
        );
        {
            let mut inner = self.lock();
            match (&inner.phase, inner.role) {
                (Phase::Rc(_) | Phase::Exs(..), _) => return Ok(()),
                (Phase::Kernel, Role::Client) => {
                    if peer_addr(fd).is_none() {
                        return Err(libc::ENOTCONN);
                    }
                    inner.ddp = true;
                    self.take_over(fd);
                    inner.slot.set_state(State::Handshake, Reason::None);
                    self.start_client(&mut inner, fd);
                }
                (Phase::Kernel, Role::Server) => {
                    inner.ddp = true;
                    self.take_over(fd);
                    inner.slot.set_state(State::Handshake, Reason::None);
                    inner.phase = Phase::ServerMpa;
                }
                (Phase::Connecting | Phase::ClientMpa(_) | Phase::ServerMpa, _) => {}
                (Phase::Failed(e), _) => return Err(*e),
                _ => return Err(libc::ENOTCONN),
            }
        }
        loop {
            let mut inner = self.lock();
            self.drive(&mut inner, fd);
            let wait = match &inner.phase {
                Phase::Rc(_) => return Ok(()),
                Phase::Failed(e) => return Err(*e),
                Phase::Kernel if inner.role == Role::Client => return Err(libc::ECONNREFUSED),
                Phase::Kernel => return Err(libc::EPROTO),
                Phase::ClientMpa(c) => (c.efd, libc::POLLIN),
                Phase::Connecting => (fd, libc::POLLOUT),
                _ => (fd, libc::POLLIN),
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                if matches!(inner.phase, Phase::ServerMpa) {
                    // Nothing was read: the socket stays plain.
                    self.set_kernel(&mut inner, Reason::Policy);
                    return Err(libc::ETIMEDOUT);
                }
                if let Phase::ClientMpa(c) = &inner.phase {
                    close_raw(c.efd);
                }
                self.fail(&mut inner, libc::ETIMEDOUT, Reason::HandshakeFailed);
                return Err(libc::ETIMEDOUT);
            }
            drop(inner);
            wait_fd(wait.0, wait.1, deadline)?;
        }
    }

    /// `getsockopt(SOL_SOFTRDMA, SOFTRDMA_DDPMODE)`: 1 while the socket's
    /// bytes go over RC, 2 once it switched to the Extended Sockets RDMA
    /// model, else 0.
    pub fn ddpmode(&self) -> c_int {
        match self.lock().phase {
            Phase::Rc(_) => 1,
            Phase::Exs(..) => 2,
            _ => 0,
        }
    }

    /// The application's first Extended Sockets call of the RDMA model on
    /// the socket: a DDPMODE socket carried over RC moves to the EXS model
    /// (after what was written; the peer follows when its application
    /// makes its first such call). `Ok(true)` once it has (or had), `Ok(false)` for a
    /// socket softrdma does not carry over RC (the call stays with the
    /// Open Group model).
    pub fn exs_switch(&self, fd: c_int) -> Result<bool, c_int> {
        if self.is_inherited() {
            return Err(libc::EBADF);
        }
        let mut inner = self.lock();
        self.drive(&mut inner, fd);
        match &inner.phase {
            Phase::Exs(..) => Ok(true),
            Phase::Rc(_) if inner.ddp => self.adopt(&mut inner, fd).map(|()| true),
            Phase::Failed(e) => Err(*e),
            _ => Ok(false),
        }
    }

    /// Hands the connection to the EXS model and sends the switch message
    /// (after the data written).
    fn adopt(&self, inner: &mut Inner, fd: c_int) -> Result<(), c_int> {
        let Some(h) = EXS_HOOKS.get() else {
            return Err(libc::EOPNOTSUPP);
        };
        let Phase::Rc(conn) = std::mem::replace(&mut inner.phase, Phase::Kernel) else {
            unreachable!("checked by the caller")
        };
        let shared = Arc::new(Mutex::new(*conn));
        let r = (h.adopt)(Handover {
            fd,
            family: self.family,
            conn: shared.clone(),
        });
        match r {
            Ok(ours) => {
                shared
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .begin_switch(ours);
                inner.phase = Phase::Exs(shared, fd);
                self.gen.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                let conn = match Arc::try_unwrap(shared) {
                    Ok(m) => m.into_inner().unwrap_or_else(|e| e.into_inner()),
                    Err(_) => {
                        self.fail(inner, e, Reason::Resources);
                        return Err(e);
                    }
                };
                inner.phase = Phase::Rc(Box::new(conn));
                Err(e)
            }
        }
    }

    /// `getsockopt(SOL_SOFTRDMA, SOFTRDMA_TRANSPORT)`: what carries the
    /// socket now — RC for a stream carried over RC, the QP's transport
    /// for a datagram socket that has its QP, else the kernel.
    pub fn transport(&self) -> crate::udp::SockTransport {
        use crate::udp::SockTransport;
        match &self.lock().phase {
            Phase::Rc(_) | Phase::Exs(..) => SockTransport::Rc,
            Phase::Ud(u) => u.end.qp_addr().2.into(),
            _ => SockTransport::Kernel,
        }
    }

    /// `getsockopt(SOL_SOFTRDMA, SOFTRDMA_RECORDS)`: datagrams sent as
    /// Write-Records, received as Write-Records, and of those delivered
    /// partly (zeros for a socket without a Write-Record QP).
    pub fn record_counts(&self) -> (u64, u64, u64) {
        match &self.lock().phase {
            Phase::Ud(u) => u.end.record_counts(),
            _ => (0, 0, 0),
        }
    }

    /// After the kernel accepted `IP_ADD_MEMBERSHIP` (`join`) or
    /// `IP_DROP_MEMBERSHIP` of `group` on a datagram socket: with
    /// `SOFTRDMA_SOCKETS_MCAST=ud` the socket's UD QP (taken now if need
    /// be) is attached to the group or detached from it.
    pub fn mcast_membership(self: &Arc<Self>, fd: c_int, group: std::net::Ipv4Addr, join: bool) {
        if self.kind != Kind::Dgram || !crate::udp::mcast_ud() || !group.is_multicast() {
            return;
        }
        let mut inner = self.lock();
        if join && !self.take_udp(&mut inner, fd) {
            return;
        }
        if let Phase::Ud(u) = &mut inner.phase {
            u.end.join(group, join);
        }
    }

    /// `setsockopt(SOL_SOFTRDMA, SOFTRDMA_TRANSPORT)` on a datagram
    /// socket: the transport of the QP it will get (`Kernel`: none, the
    /// socket stays the kernel's). Only before softrdma took the socket
    /// (`EBUSY` after: its QP exists; choosing what it has is a no-op);
    /// `EOPNOTSUPP` on a stream socket (`SOFTRDMA_DDPMODE` is its
    /// switch), `EINVAL` for RC on a datagram socket.
    pub fn set_transport(&self, t: crate::udp::SockTransport) -> Result<(), c_int> {
        use crate::udp::SockTransport;
        if self.kind != Kind::Dgram {
            return Err(libc::EOPNOTSUPP);
        }
        let want = match t {
            SockTransport::Kernel => None,
            SockTransport::Ud => Some(crate::udp::Transport::Ud),
            SockTransport::Rd => Some(crate::udp::Transport::Rd),
            SockTransport::Wr => Some(crate::udp::Transport::Wr),
            SockTransport::Rc => return Err(libc::EINVAL),
        };
        let mut inner = self.lock();
        match &inner.phase {
            Phase::Fresh => {
                inner.dgram_transport = Some(want);
                Ok(())
            }
            Phase::Ud(u) if Some(u.end.qp_addr().2) == want => Ok(()),
            Phase::Kernel if want.is_none() => Ok(()),
            _ => Err(libc::EBUSY),
        }
    }

    /// The application's view of `O_NONBLOCK`.
    pub fn nonblocking(&self) -> bool {
        self.nonblock.load(Ordering::Relaxed)
    }

    /// Sets the application's view of `O_NONBLOCK`.
    pub fn set_nonblocking(&self, on: bool) {
        self.nonblock.store(on, Ordering::Relaxed)
    }

    /// True if softrdma owns the descriptor's file status flags (the
    /// engine made the shared socket non-blocking).
    pub fn flags_shadowed(&self) -> bool {
        self.engine.load(Ordering::Relaxed)
    }

    /// True once every application descriptor of the socket was closed
    /// (an epoll set drops it then, as the kernel drops a closed file).
    pub fn is_closed(&self) -> bool {
        self.fds.load(Ordering::Acquire) == 0
    }

    /// Another descriptor refers to the socket (`dup`).
    pub fn add_fd(&self) {
        self.fds.fetch_add(1, Ordering::Relaxed);
    }

    /// In a forked child: a socket with engine objects stays the
    /// parent's. Returns true if this one did.
    pub fn mark_inherited(&self) -> bool {
        if self.engine.load(Ordering::Relaxed) {
            self.inherited.store(true, Ordering::Release);
            true
        } else {
            false
        }
    }

    /// True for a socket a forked child cannot use.
    pub fn is_inherited(&self) -> bool {
        self.inherited.load(Ordering::Acquire)
    }

    /// Records `SO_RCVLOWAT`, `SO_RCVTIMEO`, `SO_SNDTIMEO` (also given to
    /// the kernel by the caller).
    pub fn note_option(&self, level: c_int, name: c_int, val: &[u8]) {
        if level != libc::SOL_SOCKET {
            return;
        }
        match name {
            libc::SO_RCVLOWAT if val.len() >= 4 => {
                let v = i32::from_ne_bytes([val[0], val[1], val[2], val[3]]).max(1);
                self.lowat.store(v as usize, Ordering::Relaxed);
            }
            libc::SO_RCVTIMEO | libc::SO_SNDTIMEO
                if val.len() >= std::mem::size_of::<libc::timeval>() =>
            {
                let sec = i64::from_ne_bytes(val[..8].try_into().expect("8 octets"));
                let usec = i64::from_ne_bytes(val[8..16].try_into().expect("8 octets"));
                let us = (sec.max(0) as u64)
                    .saturating_mul(1_000_000)
                    .saturating_add(usec.max(0) as u64);
                if name == libc::SO_RCVTIMEO {
                    self.rcvtimeo_us.store(us, Ordering::Relaxed);
                } else {
                    self.sndtimeo_us.store(us, Ordering::Relaxed);
                }
            }
            _ => {}
        }
    }

    fn deadline(&self, send: bool) -> Option<Instant> {
        let us = if send {
            self.sndtimeo_us.load(Ordering::Relaxed)
        } else {
            self.rcvtimeo_us.load(Ordering::Relaxed)
        };
        (us > 0).then(|| Instant::now() + Duration::from_micros(us))
    }

    /// `listen`: the kernel listens; the socket is entered in the
    /// registry so interposed clients accelerate toward it.
    pub fn listen(&self, fd: c_int, backlog: c_int) -> c_int {
        // SAFETY: forwarding the application's call.
        let r = unsafe { (real().listen)(fd, backlog) };
        if r == 0 {
            let mut inner = self.lock();
            let local = local_addr(fd);
            inner.slot.set_role(Role::Listener);
            inner.role = Role::Listener;
            inner.slot.set_addrs(Some(&fmt_addr(local)), None);
            inner.slot.set_state(State::Kernel, Reason::Listener);
            if inner.listener.is_none() && crate::policy::serve() {
                inner.listener = local.and_then(|a| ListenerEntry::new(a).ok());
            }
            inner.phase = Phase::Listening;
            self.pass.store(true, Ordering::Release);
        }
        r
    }

    /// `connect`: decides, enters the registry, connects, and sends the
    /// MPA Request once connected.
    ///
    /// # Safety
    /// `addr` points to `len` readable octets (or is null).
    pub unsafe fn connect(
        self: &Arc<Self>,
        fd: c_int,
        addr: *const libc::sockaddr,
        len: libc::socklen_t,
    ) -> c_int {
        // SAFETY: the caller's address.
        let dest = unsafe { crate::addr::from_sockaddr(addr, len) };
        let mut inner = self.lock();
        if !matches!(inner.phase, Phase::Fresh) {
            drop(inner);
            // SAFETY: forwarding the application's call.
            return unsafe { (real().connect)(fd, addr, len) };
        }
        inner.slot.set_role(Role::Client);
        inner.role = Role::Client;
        let Some(dest) = dest else {
            self.set_kernel(&mut inner, Reason::Unsupported);
            drop(inner);
            // SAFETY: as above.
            return unsafe { (real().connect)(fd, addr, len) };
        };
        let reason = if !crate::policy::connect_allowed(dest) {
            Some(Reason::Policy)
        } else if !crate::policy::peer_is_softrdma(dest) {
            Some(Reason::PlainPeer)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.set_kernel(&mut inner, reason);
            drop(inner);
            // SAFETY: as above.
            let r = unsafe { (real().connect)(fd, addr, len) };
            let e = errno();
            self.lock()
                .slot
                .set_addrs(Some(&fmt_addr(local_addr(fd))), Some(&dest.to_string()));
            // SAFETY: restoring errno for the caller.
            unsafe { *libc::__errno_location() = e };
            return r;
        }
        // Bind first, so the registry can name the connection's local end
        // before the server accepts it.
        let local = match local_addr(fd) {
            Some(a) if a.port() != 0 => a,
            _ => {
                // The source address routing picks for `dest` (the
                // server names the connection by it).
                let src = crate::registry::source_for(dest)
                    .unwrap_or_else(|| crate::registry::unspecified_like(&dest));
                let (ss, sl) = crate::addr::to_sockaddr(&src);
                // SAFETY: a valid address of `sl` octets.
                if unsafe { libc::bind(fd, &ss as *const _ as *const libc::sockaddr, sl) } != 0 {
                    let e = errno();
                    if e != libc::EINVAL {
                        self.set_kernel(&mut inner, Reason::Resources);
                        drop(inner);
                        // SAFETY: as above.
                        return unsafe { (real().connect)(fd, addr, len) };
                    }
                }
                match local_addr(fd) {
                    Some(a) => a,
                    None => {
                        self.set_kernel(&mut inner, Reason::Resources);
                        drop(inner);
                        // SAFETY: as above.
                        return unsafe { (real().connect)(fd, addr, len) };
                    }
                }
            }
        };
        inner.client = ClientEntry::new(local).ok();
        if inner.client.is_none() {
            self.set_kernel(&mut inner, Reason::Resources);
            drop(inner);
            // SAFETY: as above.
            return unsafe { (real().connect)(fd, addr, len) };
        }
        inner
            .slot
            .set_addrs(Some(&local.to_string()), Some(&dest.to_string()));
        inner.slot.set_state(State::Handshake, Reason::None);
        self.take_over(fd);
        // SAFETY: forwarding the application's call.
        let r = unsafe { (real().connect)(fd, addr, len) };
        let e = errno();
        if r == 0 {
            self.start_client(&mut inner, fd);
        } else if e == libc::EINPROGRESS {
            inner.phase = Phase::Connecting;
        } else {
            // Refused, unreachable …: the socket stays as the kernel left it.
            self.set_kernel(&mut inner, Reason::PlainPeer);
        }
        drop(inner);
        // SAFETY: restoring errno for the caller.
        unsafe { *libc::__errno_location() = e };
        r
    }

    /// The TCP connection is up: send the MPA Request.
    fn start_client(&self, inner: &mut Inner, fd: c_int) {
        let dev = match crate::device() {
            Ok(d) => d,
            Err(_) => return self.fail(inner, libc::ENOMEM, Reason::Resources),
        };
        let conn = match Conn::new(&dev, inner.ddp) {
            Ok(c) => c,
            Err(_) => return self.fail(inner, libc::ENOMEM, Reason::Resources),
        };
        self.engine.store(true, Ordering::Relaxed);
        let params = softrdma_engine::cm::ConnParams {
            private_data: Params::ours(0).to_bytes().to_vec(),
            ..Default::default()
        };
        let Ok(mut ini) = softrdma_engine::cm::initiator(dev.engine(), &params) else {
            return self.fail(inner, libc::EPROTO, Reason::HandshakeFailed);
        };
        let efd = match dup_cloexec(fd) {
            Ok(d) => d,
            Err(e) => return self.fail(inner, e, Reason::Resources),
        };
        while let Some(out) = ini.poll_transmit() {
            let n = out.len();
            if let Err(e) = send_all(efd, out) {
                close_raw(efd);
                return self.fail(inner, e, Reason::HandshakeFailed);
            }
            ini.transmitted(n);
        }
        inner.phase = Phase::ClientMpa(Box::new(ClientMpa {
            ini,
            conn,
            efd,
            deadline: Instant::now() + MPA_TIMEOUT,
        }));
    }

    fn fail(&self, inner: &mut Inner, e: c_int, reason: Reason) {
        inner.phase = Phase::Failed(e);
        inner.client = None;
        inner.slot.set_state(State::Closed, reason);
        self.gen.fetch_add(1, Ordering::Relaxed);
    }

    /// `accept` on a listening socket: the kernel's accept, then the
    /// decision for the new connection. Returns the new descriptor and,
    /// when softrdma watches it, its socket.
    ///
    /// # Safety
    /// `addr`/`len` as `accept4(2)` takes them.
    pub unsafe fn accept(
        &self,
        fd: c_int,
        addr: *mut libc::sockaddr,
        len: *mut libc::socklen_t,
        flags: c_int,
    ) -> (c_int, Option<Arc<Sock>>) {
        // SAFETY: forwarding the application's call.
        let nfd = unsafe { (real().accept4)(fd, addr, len, flags) };
        if nfd < 0 {
            return (nfd, None);
        }
        let e = errno();
        let peer = peer_addr(nfd);
        let s = Sock::new(nfd, self.family, flags & libc::SOCK_NONBLOCK != 0);
        {
            let mut inner = s.lock();
            inner.slot.set_role(Role::Server);
            inner.role = Role::Server;
            inner
                .slot
                .set_addrs(Some(&fmt_addr(local_addr(nfd))), Some(&fmt_addr(peer)));
            match peer {
                Some(p) if crate::policy::serve() && crate::registry::client_at(p) => {
                    s.pass.store(false, Ordering::Release);
                    // The Request is read at the socket's first use, not
                    // here: a server that forks a child per connection
                    // (socat `fork`) hands it over untouched.
                    inner.phase = Phase::ServerMpa;
                    inner.slot.set_state(State::Handshake, Reason::None);
                }
                Some(_) => s.set_kernel(&mut inner, Reason::PlainPeer),
                None => s.set_kernel(&mut inner, Reason::Unsupported),
            }
        }
        // SAFETY: restoring errno for the caller.
        unsafe { *libc::__errno_location() = e };
        (nfd, Some(s))
    }

    /// Moves a connection toward RC as far as it can without waiting.
    fn drive(&self, inner: &mut Inner, fd: c_int) {
        match &mut inner.phase {
            Phase::Connecting => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one valid pollfd, no waiting.
                let r = unsafe { (real().poll)(&mut p, 1, 0) };
                if r == 1 {
                    if p.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                        // The connect failed; SO_ERROR is left for the
                        // application to read.
                        self.set_kernel(inner, Reason::PlainPeer);
                    } else {
                        self.start_client(inner, fd);
                        self.gen.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Phase::ClientMpa(c) => {
                let frame = match take_frame(c.efd, &wmpa::KEY_REPLY) {
                    Ok(Some(f)) => f,
                    Ok(None) => {
                        if Instant::now() >= c.deadline {
                            close_raw(c.efd);
                            self.fail(inner, libc::ETIMEDOUT, Reason::HandshakeFailed);
                        }
                        return;
                    }
                    Err(None) => {
                        close_raw(c.efd);
                        return self.fail(inner, libc::ECONNRESET, Reason::HandshakeFailed);
                    }
                    Err(Some(e)) => {
                        close_raw(c.efd);
                        return self.fail(inner, e, Reason::HandshakeFailed);
                    }
                };
                let _ = c.ini.handle_bytes(&frame, Instant::now());
                let Phase::ClientMpa(c) = std::mem::replace(&mut inner.phase, Phase::Fresh) else {
                    unreachable!("matched above")
                };
                let ClientMpa {
                    mut ini,
                    mut conn,
                    efd,
                    ..
                } = *c;
                inner.client = None;
                match ini.poll_outcome() {
                    Some(Outcome::Negotiated(n)) => {
                        let Some(peer) = Params::parse(&n.peer_private_data) else {
                            close_raw(efd);
                            return self.fail(inner, libc::EPROTO, Reason::HandshakeFailed);
                        };
                        conn.start(peer);
                        conn.set_efd(efd);
                        // SAFETY: `efd` is our own duplicate; the QP owns it from here.
                        let sock = unsafe { TcpStream::from_raw_fd(efd) };
                        if softrdma_verbs::cm::attach_negotiated(conn.qp(), sock, &n, true).is_err()
                        {
                            return self.fail(inner, libc::EPROTO, Reason::HandshakeFailed);
                        }
                        self.established(inner, conn);
                    }
                    Some(Outcome::Rejected { .. }) => {
                        // The server keeps the connection plain: so do we.
                        close_raw(efd);
                        self.engine.store(false, Ordering::Relaxed);
                        std::mem::forget(conn);
                        self.set_kernel(inner, Reason::Policy);
                    }
                    _ => {
                        close_raw(efd);
                        self.fail(inner, libc::EPROTO, Reason::HandshakeFailed)
                    }
                }
            }
            Phase::ServerMpa => {
                let frame = match take_frame(fd, &wmpa::KEY_REQUEST) {
                    Ok(Some(f)) => f,
                    Ok(None) => return,
                    Err(None) => return self.set_kernel(inner, Reason::PlainPeer),
                    Err(Some(e)) => return self.fail(inner, e, Reason::HandshakeFailed),
                };
                self.serve(inner, fd, &frame);
            }
            _ => {}
        }
    }

    /// A softrdma client's MPA Request arrived: answer it.
    fn serve(&self, inner: &mut Inner, fd: c_int, frame: &[u8]) {
        let dev = match crate::device() {
            Ok(d) => d,
            Err(_) => return self.fail(inner, libc::ENOMEM, Reason::Resources),
        };
        let Ok(mut resp) = softrdma_engine::cm::responder(dev.engine()) else {
            return self.fail(inner, libc::EPROTO, Reason::HandshakeFailed);
        };
        let _ = resp.handle_bytes(frame, Instant::now());
        let peer = resp.request().and_then(|r| Params::parse(&r.private_data));
        let want = peer.is_some() && (crate::policy::serve() || inner.ddp);
        let conn = if want {
            Conn::new(&dev, inner.ddp).ok()
        } else {
            None
        };
        let (Some(peer), Some(mut conn)) = (peer, conn) else {
            // Not ours to carry: reject, and both ends go on plain.
            if resp.request().is_some() && resp.reject(&[]).is_ok() {
                if let Some(out) = resp.poll_transmit() {
                    let _ = send_all(fd, out);
                }
                return self.set_kernel(inner, Reason::Policy);
            }
            return self.fail(inner, libc::EPROTO, Reason::HandshakeFailed);
        };
        self.engine.store(true, Ordering::Relaxed);
        // A DDPMODE socket may move to the EXS RDMA model, whose receives
        // are RDMA Reads: the default depths both ways (the initiator asks
        // for them too).
        let depth = if inner.ddp {
            softrdma_proto::mpa::DEFAULT_DEPTH
        } else {
            0
        };
        if resp
            .accept(&Params::ours(0).to_bytes()[..PARAMS_LEN], depth, depth)
            .is_err()
        {
            return self.fail(inner, libc::EPROTO, Reason::HandshakeFailed);
        }
        while let Some(out) = resp.poll_transmit() {
            let n = out.len();
            if let Err(e) = send_all(fd, out) {
                return self.fail(inner, e, Reason::HandshakeFailed);
            }
            resp.transmitted(n);
        }
        let Some(Outcome::Negotiated(n)) = resp.poll_outcome() else {
            return self.fail(inner, libc::EPROTO, Reason::HandshakeFailed);
        };
        conn.start(peer);
        let efd = match dup_cloexec(fd) {
            Ok(d) => d,
            Err(e) => return self.fail(inner, e, Reason::Resources),
        };
        conn.set_efd(efd);
        // SAFETY: `efd` is our own duplicate; the QP owns it from here.
        let sock = unsafe { TcpStream::from_raw_fd(efd) };
        if softrdma_verbs::cm::attach_negotiated(conn.qp(), sock, &n, false).is_err() {
            return self.fail(inner, libc::EPROTO, Reason::HandshakeFailed);
        }
        self.established(inner, conn);
    }

    fn established(&self, inner: &mut Inner, conn: Conn) {
        inner.phase = Phase::Rc(Box::new(conn));
        inner.slot.set_state(State::Rc, Reason::None);
        self.gen.fetch_add(1, Ordering::Relaxed);
    }

    /// Receives into `bufs` (`recv`/`read`/`readv`/`recvmsg` on a
    /// stream). `flags`: `MSG_PEEK`, `MSG_WAITALL`, `MSG_DONTWAIT`,
    /// `MSG_TRUNC`.
    pub fn recv(&self, fd: c_int, bufs: &mut [&mut [u8]], flags: c_int) -> Out<usize> {
        if self.is_inherited() {
            return Out::Done(Err(libc::EBADF));
        }
        if flags & libc::MSG_OOB != 0 {
            return Out::Done(Err(libc::EINVAL));
        }
        let nonblock = self.nonblocking() || flags & libc::MSG_DONTWAIT != 0;
        let peek = flags & libc::MSG_PEEK != 0;
        let waitall = flags & libc::MSG_WAITALL != 0 && !peek;
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let deadline = self.deadline(false);
        let mut spin: Option<Instant> = None;
        let mut done = 0usize;
        loop {
            let mut inner = self.lock();
            self.drive(&mut inner, fd);
            if let Phase::Exs(c, _) = &inner.phase {
                let c = c.clone();
                let (got, over) = exs_read(&c, bufs, done, peek);
                if got > 0 && !peek {
                    inner_stat_received(&inner, got);
                }
                drop(inner);
                done += got;
                if done == want || (done > 0 && (!waitall || over)) {
                    return Out::Done(Ok(done));
                }
                if over {
                    // The stream ended at the switch: the socket is the EXS
                    // model's now.
                    return Out::Done(Err(libc::EOPNOTSUPP));
                }
                if nonblock || deadline.is_some_and(|d| Instant::now() >= d) {
                    return Out::Done(if done > 0 {
                        Ok(done)
                    } else {
                        Err(libc::EAGAIN)
                    });
                }
                // The EXS model drives the QP; look again shortly.
                std::thread::sleep(Duration::from_micros(500));
                continue;
            }
            let shut_rd = inner.shut_rd;
            let wait = match &mut inner.phase {
                Phase::Fresh | Phase::Listening | Phase::Kernel | Phase::Ud(_) => {
                    if done > 0 {
                        return Out::Done(Ok(done));
                    }
                    return Out::Pass;
                }
                Phase::Failed(e) => {
                    return Out::Done(if done > 0 { Ok(done) } else { Err(*e) });
                }
                Phase::Connecting => (fd, libc::POLLOUT),
                Phase::ClientMpa(c) => (c.efd, libc::POLLIN),
                Phase::ServerMpa => (fd, libc::POLLIN),
                Phase::Exs(..) => unreachable!("handled above"),
                Phase::Rc(conn) => {
                    if want == 0 {
                        return Out::Done(Ok(0));
                    }
                    if conn.progress() {
                        self.gen.fetch_add(1, Ordering::Relaxed);
                    }
                    if shut_rd {
                        return Out::Done(Ok(done));
                    }
                    if conn.peer_switch().is_some() && conn.readable_bytes() == 0 {
                        // The peer moved to the EXS model: its stream ended
                        // there (this end's goes on until it switches too).
                        return Out::Done(if done > 0 {
                            Ok(done)
                        } else {
                            Err(libc::EOPNOTSUPP)
                        });
                    }
                    let mut got = 0;
                    // Fill the buffers in order from where we are.
                    let mut pos = done;
                    for b in bufs.iter_mut() {
                        if pos >= b.len() {
                            pos -= b.len();
                            continue;
                        }
                        let n = if flags & libc::MSG_TRUNC != 0 && !peek {
                            conn.discard(b.len() - pos)
                        } else {
                            conn.read(&mut b[pos..], peek)
                        };
                        got += n;
                        if n < b.len() - pos {
                            break;
                        }
                        pos = 0;
                    }
                    if got > 0 {
                        if !peek {
                            inner_stat_received(&inner, got);
                        }
                        done += got;
                        self.gen.fetch_add(1, Ordering::Relaxed);
                    }
                    let Phase::Rc(conn) = &mut inner.phase else {
                        unreachable!("still RC")
                    };
                    if done == want || (done > 0 && !waitall) {
                        return Out::Done(Ok(done));
                    }
                    if conn.readable_bytes() == 0 && conn.at_eof() {
                        return Out::Done(Ok(done));
                    }
                    if nonblock {
                        return Out::Done(if done > 0 {
                            Ok(done)
                        } else {
                            Err(libc::EAGAIN)
                        });
                    }
                    if spinning(&mut spin) {
                        continue;
                    }
                    conn.wait()
                }
            };
            drop(inner);
            if nonblock {
                return Out::Done(if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::EAGAIN)
                });
            }
            match wait_fd(wait.0, wait.1, deadline) {
                Ok(true) => {}
                Ok(false) if deadline.is_some_and(|d| Instant::now() >= d) => {
                    return Out::Done(if done > 0 {
                        Ok(done)
                    } else {
                        Err(libc::EAGAIN)
                    });
                }
                Ok(false) => {}
                Err(e) => {
                    return Out::Done(if done > 0 { Ok(done) } else { Err(e) });
                }
            }
        }
    }

    /// Sends `bufs` in order (`send`/`write`/`writev`/`sendmsg`).
    pub fn send(&self, fd: c_int, bufs: &[&[u8]], flags: c_int) -> Out<usize> {
        if self.is_inherited() {
            return Out::Done(Err(libc::EPIPE));
        }
        if flags & libc::MSG_OOB != 0 {
            return Out::Done(Err(libc::EOPNOTSUPP));
        }
        let nonblock = self.nonblocking() || flags & libc::MSG_DONTWAIT != 0;
        let want: usize = bufs.iter().map(|b| b.len()).sum();
        let deadline = self.deadline(true);
        let mut spin: Option<Instant> = None;
        let mut done = 0usize;
        loop {
            let mut inner = self.lock();
            self.drive(&mut inner, fd);
            if matches!(inner.phase, Phase::Exs(..)) {
                return Out::Done(if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::EOPNOTSUPP)
                });
            }
            let wait = match &mut inner.phase {
                Phase::Fresh | Phase::Listening | Phase::Kernel | Phase::Ud(_) => {
                    if done > 0 {
                        return Out::Done(Ok(done));
                    }
                    return Out::Pass;
                }
                Phase::Failed(e) => {
                    let e = *e;
                    return Out::Done(if done > 0 { Ok(done) } else { Err(e) });
                }
                Phase::Connecting => (fd, libc::POLLOUT),
                Phase::ClientMpa(c) => (c.efd, libc::POLLIN),
                Phase::ServerMpa => (fd, libc::POLLIN),
                Phase::Exs(..) => unreachable!("handled above"),
                Phase::Rc(conn) => {
                    conn.progress();
                    let mut pos = done;
                    let mut put = 0;
                    let mut err = None;
                    for b in bufs {
                        if pos >= b.len() {
                            pos -= b.len();
                            continue;
                        }
                        match conn.write(&b[pos..]) {
                            Ok(n) => {
                                put += n;
                                if n < b.len() - pos {
                                    break;
                                }
                            }
                            Err(StreamErr::WouldBlock) => break,
                            Err(StreamErr::Errno(e)) => {
                                err = Some(e);
                                break;
                            }
                        }
                        pos = 0;
                    }
                    if put > 0 {
                        inner_stat_sent(&inner, put);
                        done += put;
                        self.gen.fetch_add(1, Ordering::Relaxed);
                    }
                    let Phase::Rc(conn) = &mut inner.phase else {
                        unreachable!("still RC")
                    };
                    if let Some(e) = err {
                        if done > 0 {
                            return Out::Done(Ok(done));
                        }
                        return Out::Done(Err(e));
                    }
                    if done == want {
                        return Out::Done(Ok(done));
                    }
                    if nonblock {
                        return Out::Done(if done > 0 {
                            Ok(done)
                        } else {
                            Err(libc::EAGAIN)
                        });
                    }
                    if spinning(&mut spin) {
                        continue;
                    }
                    conn.wait()
                }
            };
            drop(inner);
            if nonblock {
                return Out::Done(if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::EAGAIN)
                });
            }
            match wait_fd(wait.0, wait.1, deadline) {
                Ok(false) if deadline.is_some_and(|d| Instant::now() >= d) => {
                    return Out::Done(if done > 0 {
                        Ok(done)
                    } else {
                        Err(libc::EAGAIN)
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    return Out::Done(if done > 0 { Ok(done) } else { Err(e) });
                }
            }
        }
    }

    /// `shutdown`. Writing: the end of stream goes after the data.
    /// Reading: later reads return end of file.
    pub fn shutdown(&self, fd: c_int, how: c_int) -> Out<()> {
        let mut inner = self.lock();
        self.drive(&mut inner, fd);
        if matches!(inner.phase, Phase::Exs(..)) {
            // `exs_shutdown` is the way on a switched socket.
            return Out::Done(Err(libc::EOPNOTSUPP));
        }
        if !matches!(inner.phase, Phase::Rc(_)) {
            return Out::Pass;
        }
        if how != libc::SHUT_RD && how != libc::SHUT_WR && how != libc::SHUT_RDWR {
            return Out::Done(Err(libc::EINVAL));
        }
        if how != libc::SHUT_WR {
            inner.shut_rd = true;
        }
        if let Phase::Rc(conn) = &mut inner.phase {
            if how != libc::SHUT_RD {
                conn.shutdown_write();
            }
        }
        self.gen.fetch_add(1, Ordering::Relaxed);
        Out::Done(Ok(()))
    }

    /// Readiness for `poll`/`select`/`epoll` after making what progress
    /// there is; `Ready::events` is 0 for a plain socket (the caller asks
    /// the kernel). [`Ready::wait`] is what a caller that finds nothing
    /// waits on (level-triggered: it holds while progress can be made).
    pub fn ready(&self, fd: c_int) -> Ready {
        if self.is_inherited() {
            return Ready {
                events: libc::POLLERR | libc::POLLHUP,
                wait: None,
            };
        }
        let mut inner = self.lock();
        self.drive(&mut inner, fd);
        let lowat = self.lowat.load(Ordering::Relaxed);
        let shut_rd = inner.shut_rd;
        match &mut inner.phase {
            Phase::Fresh | Phase::Listening | Phase::Kernel => Ready::default(),
            Phase::Ud(u) => {
                let mut ev = 0;
                u.end.progress();
                if u.end.has_message() || kernel_readable(fd) {
                    ev |= libc::POLLIN;
                }
                if u.end.can_send() {
                    ev |= libc::POLLOUT;
                }
                if ev & libc::POLLIN == 0 && u.end.arm() && u.end.has_message() {
                    ev |= libc::POLLIN;
                }
                Ready {
                    events: ev,
                    wait: Some((u.end.wait_fd(), libc::POLLIN)),
                }
            }
            Phase::Failed(_) => Ready {
                events: libc::POLLIN | libc::POLLOUT | libc::POLLERR | libc::POLLHUP,
                wait: None,
            },
            Phase::Connecting => Ready {
                events: 0,
                wait: Some((fd, libc::POLLOUT)),
            },
            Phase::ClientMpa(c) => Ready {
                events: 0,
                wait: Some((c.efd, libc::POLLIN)),
            },
            Phase::ServerMpa => Ready {
                events: 0,
                wait: Some((fd, libc::POLLIN)),
            },
            Phase::Rc(conn) => {
                let mut ev = rc_events(conn, lowat, shut_rd);
                if conn.progress() {
                    self.gen.fetch_add(1, Ordering::Relaxed);
                    ev = rc_events(conn, lowat, shut_rd);
                }
                if conn.peer_switch().is_some() {
                    // The peer's stream ended at its switch: a read tells.
                    ev |= libc::POLLIN;
                }
                Ready {
                    events: ev,
                    wait: Some(conn.wait()),
                }
            }
            Phase::Exs(c, _) => {
                let c = c.lock().unwrap_or_else(|e| e.into_inner());
                // Readable while the stream holds octets from before the
                // switch, and once it ended there (a read then fails).
                let ev = if c.readable_bytes() > 0 || c.peer_switch().is_some() || c.at_eof() {
                    libc::POLLIN
                } else {
                    0
                };
                // The EXS model's pump takes what arrives on the
                // connection; a waiter looks again when it does.
                Ready {
                    events: ev,
                    wait: (ev == 0).then(|| (c.efd(), libc::POLLIN)),
                }
            }
        }
    }

    /// `getsockopt` answers softrdma gives itself: `SO_ERROR` of a
    /// connection that failed under softrdma, and `FIONREAD`-like counts.
    pub fn pending_error(&self) -> Option<c_int> {
        match self.lock().phase {
            Phase::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// Octets a read would return now (`FIONREAD`); `None` for a plain socket.
    pub fn readable_bytes(&self, fd: c_int) -> Option<usize> {
        let mut inner = self.lock();
        self.drive(&mut inner, fd);
        match &mut inner.phase {
            Phase::Rc(conn) => {
                conn.progress();
                Some(conn.readable_bytes())
            }
            Phase::Exs(c, _) => Some(c.lock().unwrap_or_else(|e| e.into_inner()).readable_bytes()),
            Phase::Fresh | Phase::Listening | Phase::Kernel => None,
            Phase::Ud(u) => {
                u.end.progress();
                u.end.peek_meta().map(|(len, _)| len)
            }
            _ => Some(0),
        }
    }

    /// One application descriptor of the socket was closed. On the last,
    /// the connection ends after what was written has left.
    pub fn close_fd(&self) {
        if self.fds.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        if self.is_inherited() {
            return;
        }
        let mut inner = self.lock();
        inner.listener = None;
        inner.client = None;
        inner.slot.release();
        match std::mem::replace(&mut inner.phase, Phase::Kernel) {
            Phase::Rc(mut conn) => {
                conn.shutdown_write();
                if conn.close_step() {
                    conn.disconnect();
                } else {
                    linger(conn);
                }
            }
            Phase::ClientMpa(c) => {
                close_raw(c.efd);
                c.conn.disconnect();
            }
            Phase::Exs(_, fd) => {
                // The EXS model closes its side (FIN, disconnect).
                drop(inner);
                if let Some(h) = EXS_HOOKS.get() {
                    (h.closed)(fd);
                }
            }
            _ => {}
        }
    }

    /// At exit: the process's descriptors close, as the kernel would close
    /// them; the connection ends after what was written has left.
    pub fn close_at_exit(&self) {
        self.fds.store(1, Ordering::Relaxed);
        self.close_fd();
    }

    /// A datagram socket gets its UD QP and its registry entry, bound
    /// where the kernel socket is (binding it to the wildcard first if it
    /// is not bound yet). False if it could not (it stays plain).
    fn take_udp(self: &Arc<Self>, inner: &mut Inner, fd: c_int) -> bool {
        if matches!(inner.phase, Phase::Ud(_)) {
            return true;
        }
        if !matches!(inner.phase, Phase::Fresh) || !crate::policy::enabled() {
            return false;
        }
        let transport = match inner.dgram_transport {
            None => crate::policy::udp_transport(),
            Some(Some(t)) => t,
            Some(None) => return false,
        };
        let local = match local_addr(fd) {
            Some(a) if a.port() != 0 => a,
            Some(a) => {
                let (ss, sl) = crate::addr::to_sockaddr(&crate::registry::unspecified_like(&a));
                // SAFETY: a valid address of `sl` octets.
                if unsafe { libc::bind(fd, &ss as *const _ as *const libc::sockaddr, sl) } != 0 {
                    return false;
                }
                match local_addr(fd) {
                    Some(a) => a,
                    None => return false,
                }
            }
            None => return false,
        };
        // UD runs over IPv4: an IPv6 socket takes part when it is bound to
        // the wildcard (dual-stack) or an IPv4-mapped address.
        let local = match local {
            SocketAddr::V6(a) if a.ip().is_unspecified() => {
                SocketAddr::from(([0, 0, 0, 0], a.port()))
            }
            SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
                Some(v4) => SocketAddr::from((v4, a.port())),
                None => return false,
            },
            v4 => v4,
        };
        let Ok(dev) = crate::device() else {
            inner.slot.set_state(State::Kernel, Reason::Resources);
            return false;
        };
        let end = match crate::udp::UdEnd::new(&dev, fd, local, transport) {
            Ok(e) => e,
            Err(_) => {
                inner.slot.set_state(State::Kernel, Reason::Resources);
                return false;
            }
        };
        let (qp_port, qpn, transport) = end.qp_addr();
        let entry = crate::registry::UdpEntry::new(local, qp_port, qpn, transport).ok();
        self.engine.store(true, Ordering::Relaxed);
        inner.slot.set_addrs(Some(&local.to_string()), None);
        inner.slot.set_state(
            if transport == crate::udp::Transport::Wr {
                State::Wr
            } else {
                State::Ud
            },
            Reason::None,
        );
        inner.phase = Phase::Ud(Box::new(UdState { end, _entry: entry }));
        self.take_over(fd);
        true
    }

    /// After a successful `bind` of a datagram socket: softrdma takes it
    /// (auto policy), so interposed senders reach it over UD.
    pub fn after_bind(self: &Arc<Self>, fd: c_int) {
        if self.kind != Kind::Dgram || !crate::policy::serve() {
            return;
        }
        let mut inner = self.lock();
        self.take_udp(&mut inner, fd);
    }

    /// `connect` of a datagram socket: the kernel's, then the peer is
    /// remembered for `send`, and softrdma takes the socket if the peer
    /// is interposed.
    ///
    /// # Safety
    /// `addr` points to `len` readable octets (or is null).
    pub unsafe fn connect_dgram(
        self: &Arc<Self>,
        fd: c_int,
        addr: *const libc::sockaddr,
        len: libc::socklen_t,
    ) -> c_int {
        // SAFETY: forwarding the application's call.
        let r = unsafe { (real().connect)(fd, addr, len) };
        let e = errno();
        if r == 0 {
            // SAFETY: the caller's address.
            let dest = unsafe { crate::addr::from_sockaddr(addr, len) }
                .map(|d| SocketAddr::new(d.ip().to_canonical(), d.port()));
            let mut inner = self.lock();
            inner.connected = dest;
            if let Some(d) = dest {
                inner.slot.set_addrs(None, Some(&d.to_string()));
                if crate::policy::connect_allowed(d)
                    && (crate::udp::mcast_dest(d) || crate::registry::udp_peer(d).is_some())
                {
                    self.take_udp(&mut inner, fd);
                }
            }
        }
        // SAFETY: restoring errno for the caller.
        unsafe { *libc::__errno_location() = e };
        r
    }

    /// `sendto`/`sendmsg`/`send`/`write` on a datagram socket: one UD Send
    /// when the destination (given, or connected) is an interposed
    /// socket, else the kernel's call.
    pub fn send_dgram(
        self: &Arc<Self>,
        fd: c_int,
        bufs: &[&[u8]],
        flags: c_int,
        dest: Option<SocketAddr>,
    ) -> Out<usize> {
        if self.is_inherited() {
            return Out::Pass;
        }
        let nonblock = self.nonblocking() || flags & libc::MSG_DONTWAIT != 0;
        let mut spin: Option<Instant> = None;
        loop {
            let mut inner = self.lock();
            let Some(dest) = dest.or(inner.connected) else {
                return Out::Pass;
            };
            let dest = SocketAddr::new(dest.ip().to_canonical(), dest.port());
            if matches!(inner.phase, Phase::Fresh) {
                // Left to the kernel by `SOFTRDMA_TRANSPORT`.
                if inner.dgram_transport == Some(None) || !crate::policy::connect_allowed(dest) {
                    return Out::Pass;
                }
                let fresh = inner
                    .dgram_plain
                    .get(&dest)
                    .is_some_and(|t| t.elapsed() < Duration::from_secs(1));
                let group = crate::udp::mcast_dest(dest);
                if !group && (fresh || crate::registry::udp_peer(dest).is_none()) {
                    if !fresh {
                        if inner.dgram_plain.len() > 4096 {
                            inner.dgram_plain.clear();
                        }
                        inner.dgram_plain.insert(dest, Instant::now());
                    }
                    return Out::Pass;
                }
                if !self.take_udp(&mut inner, fd) {
                    return Out::Pass;
                }
            }
            let Phase::Ud(u) = &mut inner.phase else {
                return Out::Pass;
            };
            u.end.progress();
            let Some(ah) = u.end.peer(dest) else {
                return Out::Pass;
            };
            let len: usize = bufs.iter().map(|b| b.len()).sum();
            match u.end.send(&ah, bufs) {
                Ok(true) => {
                    inner.slot.sent(len, 1);
                    self.gen.fetch_add(1, Ordering::Relaxed);
                    return Out::Done(Ok(len));
                }
                Ok(false) => {}
                Err(e) => return Out::Done(Err(e)),
            }
            if nonblock {
                return Out::Done(Err(libc::EAGAIN));
            }
            if spinning(&mut spin) {
                continue;
            }
            let w = u.end.wait_fd();
            let more = u.end.arm();
            drop(inner);
            if !more {
                let _ = wait_fd(
                    w,
                    libc::POLLIN,
                    Some(Instant::now() + Duration::from_millis(10)),
                );
            }
        }
    }

    /// `recvfrom`/`recvmsg`/`recv`/`read` on a datagram socket softrdma
    /// took: the next UD message or kernel datagram. `Pass` for a socket
    /// without a UD QP.
    pub fn recv_dgram(&self, fd: c_int, bufs: &mut [&mut [u8]], flags: c_int) -> Out<Dgram> {
        if self.is_inherited() {
            return Out::Done(Err(libc::EBADF));
        }
        if flags & libc::MSG_OOB != 0 {
            return Out::Done(Err(libc::EOPNOTSUPP));
        }
        let nonblock = self.nonblocking() || flags & libc::MSG_DONTWAIT != 0;
        let peek = flags & libc::MSG_PEEK != 0;
        let deadline = self.deadline(false);
        let mut spin: Option<Instant> = None;
        loop {
            let mut inner = self.lock();
            let connected = inner.connected;
            let Phase::Ud(u) = &mut inner.phase else {
                return Out::Pass;
            };
            u.end.progress();
            // A connected socket takes only its peer's datagrams.
            while let (Some(c), Some((_, src))) = (connected, u.end.peek_meta()) {
                if src == c {
                    break;
                }
                u.end.read(&mut [], true);
            }
            if let Some((copied, len, src)) = u.end.read(bufs, !peek) {
                if !peek {
                    inner.slot.received(len, 1);
                }
                self.gen.fetch_add(1, Ordering::Relaxed);
                return Out::Done(Ok(Dgram { copied, len, src }));
            }
            // The kernel socket's datagrams (plain senders).
            let mut iov: Vec<libc::iovec> = bufs
                .iter_mut()
                .map(|b| libc::iovec {
                    iov_base: b.as_mut_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                })
                .collect();
            // SAFETY: sockaddr_storage is plain data.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            // SAFETY: msghdr is plain data; the fields set below are valid.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_name = &mut ss as *mut _ as *mut libc::c_void;
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = iov.len();
            let kflags = (flags & (libc::MSG_PEEK | libc::MSG_TRUNC)) | libc::MSG_DONTWAIT;
            // SAFETY: the caller's buffers through `iov`, our address buffer.
            let n = unsafe { (real().recvmsg)(fd, &mut msg, kflags | libc::MSG_TRUNC) };
            if n >= 0 {
                // SAFETY: the kernel wrote `msg_namelen` octets of address.
                let src = unsafe {
                    crate::addr::from_sockaddr(
                        &ss as *const _ as *const libc::sockaddr,
                        msg.msg_namelen,
                    )
                };
                let len = n as usize;
                let copied = len.min(bufs.iter().map(|b| b.len()).sum());
                return Out::Done(Ok(Dgram {
                    copied,
                    len,
                    src: src.unwrap_or_else(|| {
                        crate::registry::unspecified_like(&SocketAddr::from(([0, 0, 0, 0], 0)))
                    }),
                }));
            }
            let e = errno();
            if e != libc::EAGAIN && e != libc::EINTR {
                return Out::Done(Err(e));
            }
            if nonblock {
                return Out::Done(Err(libc::EAGAIN));
            }
            if spinning(&mut spin) {
                continue;
            }
            let w = u.end.wait_fd();
            let more = u.end.arm();
            drop(inner);
            if more {
                continue;
            }
            match wait_fd(w, libc::POLLIN, deadline) {
                Ok(false) if deadline.is_some_and(|d| Instant::now() >= d) => {
                    return Out::Done(Err(libc::EAGAIN));
                }
                Ok(_) => {}
                Err(e) => return Out::Done(Err(e)),
            }
        }
    }

    /// Records that descriptor `fd` now names the socket (`dup2` targets).
    pub fn set_fd(&self, fd: c_int) {
        self.lock().slot.set_fd(fd);
    }
}

/// Reads what the stream of a switched socket still holds into `bufs`
/// from stream position `done`. Returns the octets and whether the
/// stream is over (nothing left and nothing more coming).
fn exs_read(c: &Mutex<Conn>, bufs: &mut [&mut [u8]], done: usize, peek: bool) -> (usize, bool) {
    let mut c = c.lock().unwrap_or_else(|e| e.into_inner());
    let mut got = 0;
    let mut pos = done;
    for b in bufs.iter_mut() {
        if pos >= b.len() {
            pos -= b.len();
            continue;
        }
        let n = c.read(&mut b[pos..], peek);
        got += n;
        if n < b.len() - pos {
            break;
        }
        pos = 0;
    }
    let over =
        c.readable_bytes() == got * usize::from(peek) && (c.peer_switch().is_some() || c.at_eof());
    (got, over)
}

/// How long a blocking call polls before it sleeps
/// (`SOFTRDMA_SOCKETS_SPIN_US`, default 20 µs; 0: sleep at once). While a
/// caller polls, the answer of a peer that replies within that time
/// reaches it without waking the progress thread and then this thread.
pub fn spin_budget() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("SOFTRDMA_SOCKETS_SPIN_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(20);
        Duration::from_micros(us)
    })
}

/// True while a blocking call's spin budget (`SOFTRDMA_SOCKETS_SPIN_US`,
/// started on first use) lasts. Each turn yields the CPU (`sched_yield`):
/// when the peer that is to answer waits to run on this very CPU (a small
/// or busy machine puts both ends of an exchange on one core), a spin that
/// does not yield holds it off until the spin ends, and every answer comes
/// one whole spin late (sockperf's ping-pong on a loaded 2-core VM: one
/// way took the spin plus 10 µs, 30 µs at the default 20 µs, 110 µs at
/// 100 µs; yielding, 8–10 µs over UD and RC alike). With a core of its
/// own, the yield returns at once and the spin goes on.
pub(crate) fn spinning(until: &mut Option<Instant>) -> bool {
    let budget = spin_budget();
    if budget.is_zero() {
        return false;
    }
    let now = Instant::now();
    let end = *until.get_or_insert(now + budget);
    if now < end {
        // SAFETY: no arguments, no memory touched.
        unsafe { libc::sched_yield() };
        true
    } else {
        false
    }
}

/// Whether the kernel socket `fd` has something to read now.
fn kernel_readable(fd: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    unsafe { (real().poll)(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 }
}

/// What `recvfrom` on a datagram socket returns: octets copied, the
/// datagram's full length, its source.
#[derive(Debug, Clone, Copy)]
pub struct Dgram {
    /// Octets copied into the buffers.
    pub copied: usize,
    /// The datagram's length (more than `copied`: it was truncated).
    pub len: usize,
    /// Where it came from.
    pub src: SocketAddr,
}

fn rc_events(conn: &Conn, lowat: usize, shut_rd: bool) -> i16 {
    let mut ev = 0;
    if conn.readable_bytes() >= lowat || conn.at_eof() || shut_rd {
        ev |= libc::POLLIN;
    }
    if conn.writable() {
        ev |= libc::POLLOUT;
    }
    if conn.fin_received() {
        ev |= libc::POLLRDHUP;
    }
    if conn.broken() {
        ev |= libc::POLLHUP | libc::POLLERR;
    } else if conn.fin_received() && conn.write_shut() {
        ev |= libc::POLLHUP;
    }
    ev
}

fn inner_stat_received(inner: &Inner, n: usize) {
    inner.slot.received(n, 0);
}

fn inner_stat_sent(inner: &Inner, n: usize) {
    inner.slot.sent(n, 0);
}
