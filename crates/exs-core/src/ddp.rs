//! DDPMODE sockets: a connected TCP socket the sockets interposer carries
//! over an RC QP (`setsockopt(SOL_SOFTRDMA, SOFTRDMA_DDPMODE, 1)`) moves to
//! the RDMA model at its first RDMA-model call, on the same QP.
//!
//! This works where the interposer and this library are one: the
//! interposer (`libsoftrdma-sockets.so.1`) exports the `exs_*` calls too
//! (`crate::exs_exports!`), so under `LD_PRELOAD` an application's calls
//! bind to it, and one engine, one device and one protection domain serve
//! both. The interposer registers a [`Host`] at load; without one (plain
//! `libexs.so.1`) nothing here is used and DDPMODE descriptors are
//! ordinary kernel sockets of the Open Group model.
//!
//! The switch (the byte stream's switch message, the handover of the
//! CQ) is the interposer's side; here the connection is adopted as an
//! RDMA-model descriptor under the application's own descriptor number,
//! with a [`Prelude`] that takes the stream protocol's last work off the
//! CQ, and a pump thread that drives it (the interposer's QPs are driven
//! by their users, not by the engine's progress thread). The design is in
//! `docs/exs.md`, "DDPMODE sockets".

use std::sync::OnceLock;
use std::time::Duration;

use libc::c_int;
use softrdma_verbs::{CompletionQueue, Context, ProtectionDomain, QueuePair, WorkCompletion};

use crate::Errno;

/// The interposer, seen from the Extended Sockets library in the same
/// process.
pub trait Host: Send + Sync {
    /// The process's device and protection domain (the RDMA model's
    /// registrations must be in the QPs' PD).
    fn device(&self) -> Option<(Context, ProtectionDomain)>;
    /// Moves `fd` to the RDMA model if it is a DDPMODE socket carried over
    /// RC (calling [`adopt`]): `Ok(true)` once it is, `Ok(false)` for any
    /// other descriptor.
    fn switch(&self, fd: c_int) -> Result<bool, Errno>;
    /// Run first on every thread of the RDMA model (the interposer raises
    /// its re-entrancy guard: the thread's C library calls are its own).
    fn thread_start(&self);
}

static HOST: OnceLock<&'static dyn Host> = OnceLock::new();
/// The process whose device the RDMA model took from the host (a forked
/// child's interposer has another).
static DEV_PID: OnceLock<u32> = OnceLock::new();

/// Registers the interposer (once, at its load).
pub fn set_host(h: &'static dyn Host) {
    let _ = HOST.set(h);
}

/// The host's device, for the RDMA model's first use.
pub(crate) fn host_device() -> Option<(Context, ProtectionDomain)> {
    let d = HOST.get()?.device()?;
    let _ = DEV_PID.set(std::process::id());
    Some(d)
}

/// Runs the host's per-thread setup (nothing without a host).
pub(crate) fn thread_start() {
    if let Some(h) = HOST.get() {
        h.thread_start();
    }
}

/// Called by the RDMA-model calls on a descriptor before they look it up:
/// a DDPMODE socket switches now. Errors are the switch's (the socket's
/// connection failed).
pub fn route(fd: c_int) -> Result<(), Errno> {
    let Some(h) = HOST.get() else { return Ok(()) };
    if fd < 0 || crate::rdma::owns(fd) {
        return Ok(());
    }
    h.switch(fd).map(|_| ())
}

/// What a [`Prelude`] made of a completion.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// The RDMA model's own.
    No,
    /// The stream protocol's: taken.
    Yes,
    /// An RDMA-model message that landed in a buffer of the stream
    /// protocol: its octets.
    Msg(Vec<u8>),
}

/// What the RDMA model does next on an adopted connection
/// ([`Prelude::step`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing yet.
    Wait,
    /// Post the receives now (no more stream data comes), then call
    /// [`Prelude::posted`].
    PostReceives,
    /// Start: the peer's parameters (its receives are posted); from here
    /// this end sends RDMA-model messages.
    Start(Vec<u8>),
}

/// The byte-stream protocol finishing on an adopted QP.
pub trait Prelude: Send {
    /// Looks at a completion of the shared CQ first.
    fn take(&mut self, wc: &WorkCompletion) -> Taken;
    /// Sends what the stream still owes and says what the RDMA model
    /// does next ([`Step::Start`] once).
    fn step(&mut self) -> Step;
    /// The RDMA model's receives are posted.
    fn posted(&mut self);
}

/// A connection the interposer hands over.
pub struct Adopt {
    /// The application's descriptor (it stays the descriptor's number).
    pub fd: c_int,
    /// `AF_INET` or `AF_INET6`.
    pub family: c_int,
    /// The QP (in the host's PD) and its CQ.
    pub qp: QueuePair,
    /// The CQ both protocols complete into.
    pub cq: CompletionQueue,
    /// The QP's descriptor of the TCP connection (the pump waits on it).
    pub efd: c_int,
    /// The stream protocol's side of the handover.
    pub prelude: Box<dyn Prelude>,
}

impl std::fmt::Debug for Adopt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adopt")
            .field("fd", &self.fd)
            .field("qpn", &self.qp.qpn())
            .finish_non_exhaustive()
    }
}

/// Credits of an adopted connection (the interposer's queues have room
/// for this many: `EXS_RECV_ROOM` receives hold `2 × credits + 4`).
pub const CREDITS: u32 = 64;

/// Adopts a connection as an RDMA-model `SOCK_STREAM` descriptor under
/// `a.fd` and starts its pump. Returns this end's parameters for the
/// switch message.
pub fn adopt(a: Adopt) -> Result<Vec<u8>, Errno> {
    // The RDMA model's device must be the host's of this process.
    crate::rdma::dev()?;
    if DEV_PID.get() != Some(&std::process::id()) {
        return Err(libc::EOPNOTSUPP);
    }
    let (fd, qp, efd) = (a.fd, a.qp.clone(), a.efd);
    let (id, ours) = crate::rdma::adopt(a, CREDITS)?;
    let spawned = std::thread::Builder::new()
        .name("exs-ddp".into())
        .spawn(move || pump(fd, id, qp, efd));
    if spawned.is_err() {
        let _ = crate::rdma::close_keep_fd(fd);
        return Err(libc::EAGAIN);
    }
    Ok(ours.to_vec())
}

/// The application closed a switched socket's descriptor with `close`:
/// the RDMA model lets it go (FIN, disconnect) without closing the number
/// again.
pub fn closed(fd: c_int) {
    let _ = crate::rdma::close_keep_fd(fd);
}

/// Drives an adopted connection whenever its TCP connection has something
/// to read (or, while the QP has octets to write, room to write): the
/// RDMA model's progress thread only hears of CQs on its channel.
fn pump(fd: c_int, id: u64, qp: QueuePair, efd: c_int) {
    thread_start();
    // SAFETY: a full local set; pthread_sigmask on this thread.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    while crate::rdma::adopted_alive(fd, id) {
        let mut p = libc::pollfd {
            fd: efd,
            events: if qp.tx_idle() {
                libc::POLLIN
            } else {
                libc::POLLIN | libc::POLLOUT
            },
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 20) };
        crate::rdma::drive_adopted(fd, id);
        if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The peer's (`peer`) or the local address of the TCP socket `fd`.
pub(crate) fn addr_of(fd: c_int, peer: bool) -> Option<std::net::SocketAddr> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = &mut ss as *mut libc::sockaddr_storage as *mut libc::sockaddr;
    // SAFETY: the call writes at most `len` octets into `ss`.
    let r = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    if r != 0 {
        return None;
    }
    crate::rdma::from_sockaddr(p, len, c_int::from(ss.ss_family)).ok()
}
