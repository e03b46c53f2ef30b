//! The softrdma runtime: sockets, the progress thread, completion queues
//! and memory registration. Besides the C ABI crates, the only place with
//! syscalls and `unsafe` (wire and proto have neither); each `unsafe` block says why it is
//! sound in a `// SAFETY:` line.
//!
//! * [`Context`]: one per process and device; owns the registration table,
//!   the async event queue and (started on first use) the progress thread.
//! * [`mr`]: memory registration and the [`softrdma_proto::memory::Memory`]
//!   view over it.
//! * [`cq`]: completion queues, completion channels (eventfds), async events.
//! * [`qp`]: RC queue pairs over TCP.
//! * [`dgram`]: datagram (UD and RD) queue pairs over UDP, multicast.
//! * [`dc`]: software dynamically connected transport (DCI/DCT over UD + RC).
//! * [`srq`]: shared receive queues.
//! * [`cm`]: connection setup: listen, connect, accept, reject, with MPA
//!   negotiation, private data and the peer-to-peer RTR.
//! * [`cm_events`]: the same with rdma_cm semantics: ids and an event
//!   channel (a pollable fd) delivering connect requests, establishment,
//!   rejection and disconnection.
//! * [`ibconn`]: daemonless IB-style connection by QP number.
//! * [`config`]: the `SOFTRDMA_*` environment knobs.
//! * [`rawudp`]: plain UDP with GSO/GRO, for `softrdma perf`'s raw baselines.

pub mod cm;
pub mod cm_events;
pub mod config;
pub mod cq;
pub mod dc;
pub mod dgram;
pub mod ibconn;
pub mod mr;
mod progress;
pub mod qp;
pub mod rawudp;
mod reaper;
pub mod srq;
mod sys;
pub use sys::sockaddr_of;
mod udp;

use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

pub use cq::{AsyncEvent, AsyncEvents, CompChannel, Completion, Cq};
pub use dgram::{
    DgramError, DgramQpHandle, DgramQpStats, RdOptions, RdQpCounters, SocketStats, UdOptions,
    MCAST_QPN,
};
pub use mr::{Pages, RegError, Registry};
pub use qp::{Qp, QpCaps, QpError, QpLinkState};
pub use srq::Srq;

use progress::Progress;

/// State shared by everything created from one [`Context`].
#[derive(Debug)]
pub struct Shared {
    /// Registered memory.
    pub registry: Registry,
    /// Async events (`ibv_get_async_event`).
    pub events: Arc<AsyncEvents>,
    progress: OnceLock<Progress>,
    ib: OnceLock<Arc<ibconn::IbConn>>,
    dgram: dgram::Service,
    next_pd: AtomicU32,
    next_cq: AtomicU64,
    /// Configuration read from the environment at creation.
    pub config: config::Config,
}

impl Shared {
    pub(crate) fn progress(&self) -> io::Result<&Progress> {
        if let Some(p) = self.progress.get() {
            return Ok(p);
        }
        let p = Progress::start()?;
        Ok(self.progress.get_or_init(|| p))
    }
}

/// A softrdma device context.
#[derive(Debug, Clone)]
pub struct Context {
    shared: Arc<Shared>,
}

impl Context {
    /// A context configured from the environment (see [`config`]).
    pub fn new() -> io::Result<Context> {
        Context::with_config(
            config::Config::from_env()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        )
    }

    /// A context with an explicit configuration. Fails if the kernel will
    /// not give this process's TCP sockets `config.tcp_congestion`.
    pub fn with_config(config: config::Config) -> io::Result<Context> {
        if let Some(cc) = &config.tcp_congestion {
            sys::probe_tcp_congestion(cc)?;
        }
        Ok(Context {
            shared: Arc::new(Shared {
                registry: Registry::new(),
                events: Arc::new(AsyncEvents::new()?),
                progress: OnceLock::new(),
                ib: OnceLock::new(),
                dgram: dgram::Service::default(),
                next_pd: AtomicU32::new(1),
                next_cq: AtomicU64::new(1),
                config,
            }),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &config::Config {
        &self.shared.config
    }

    /// The registration table.
    pub fn registry(&self) -> &Registry {
        &self.shared.registry
    }

    /// The async event queue.
    pub fn async_events(&self) -> &AsyncEvents {
        &self.shared.events
    }

    /// The IB-style (daemonless, by QP number) connection service.
    pub fn ib_conn(&self) -> Arc<ibconn::IbConn> {
        self.shared
            .ib
            .get_or_init(|| ibconn::IbConn::new(Arc::downgrade(&self.shared)))
            .clone()
    }

    /// A new protection domain number.
    pub fn alloc_pd(&self) -> u32 {
        self.shared.next_pd.fetch_add(1, Ordering::Relaxed)
    }

    /// A completion queue of `capacity` entries, optionally tied to a
    /// completion channel.
    pub fn create_cq(&self, capacity: usize, channel: Option<Arc<CompChannel>>) -> Arc<Cq> {
        let id = self.shared.next_cq.fetch_add(1, Ordering::Relaxed);
        let inline = self.shared.config.progress != config::ProgressMode::Thread;
        Cq::new(
            id,
            capacity.max(1),
            channel,
            self.shared.events.clone(),
            inline,
        )
    }

    /// An RC queue pair whose number makes it reachable IB-style (see
    /// [`ibconn`]): `(port << 8) | slot` of one of this context's listeners.
    pub fn create_rc_qp(
        &self,
        pd: u32,
        caps: QpCaps,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
    ) -> Result<Qp, ibconn::IbConnError> {
        let ib = self.ib_conn();
        let qpn = ib.reserve()?;
        let qp = self.create_qp(qpn, pd, caps, send_cq, recv_cq);
        ib.bind(qpn, &qp)?;
        Ok(qp)
    }

    /// An RC queue pair in protection domain `pd`. Its number is assigned
    /// by the connection manager when it binds (`qpn`), or by the caller.
    pub fn create_qp(
        &self,
        qpn: u32,
        pd: u32,
        caps: QpCaps,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
    ) -> Qp {
        Qp::new(self.shared.clone(), qpn, pd, caps, send_cq, recv_cq)
    }

    /// A shared receive queue of at most `depth` receives (at least 1)
    /// (`ibv_create_srq`); QPs use it when created with
    /// [`Context::create_qp_with_srq`].
    pub fn create_srq(&self, depth: usize) -> Arc<Srq> {
        Arc::new(Srq::new(depth))
    }
}

/// Octets of socket buffer (each way) the engine gives its UDP sockets.
pub const DGRAM_SOCKET_BUFFER: usize = 4 << 20;

/// Gives a plain UDP socket the send and receive buffers the engine's
/// datagram sockets get ([`DGRAM_SOCKET_BUFFER`], capped by the kernel's
/// `rmem_max`/`wmem_max`), so that a raw-UDP baseline (`softrdma perf`)
/// is measured like for like. Errors are `setsockopt`'s.
pub fn tune_udp_socket(sock: &std::net::UdpSocket) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let v = DGRAM_SOCKET_BUFFER as libc::c_int;
    udp::set_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, v)?;
    udp::set_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, v)
}

/// Whether the TCP socket `sock`, which a write just found full, has room
/// again: one `poll` for `POLLOUT` that does not wait. A raw-socket
/// baseline (`softrdma perf`) busy-polls this instead of retrying the
/// write: the kernel answers it without the socket's lock and says yes
/// once about a third of the send buffer is free, while a write retried on
/// every spin takes the lock each time and holds up the acknowledgements
/// that free the room (`docs/performance.md`, "The bulk path"). An error or hang-up
/// counts as room: the write that follows reports it.
pub fn tcp_has_room(sock: &std::net::TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    sys::has_room(sock.as_raw_fd())
}

/// Sets the TCP congestion control algorithm of `sock` (`TCP_CONGESTION`),
/// as RC QPs do with `SOFTRDMA_TCP_CONGESTION`; a raw-socket baseline
/// (`softrdma perf`) sets its own connections the same way so both sides
/// of a ratio run one algorithm. `ENOENT`: the kernel has no such
/// algorithm; `EPERM`: this process may not choose it.
pub fn set_tcp_congestion<S: std::os::fd::AsRawFd>(sock: &S, name: &str) -> io::Result<()> {
    sys::set_tcp_congestion(sock.as_raw_fd(), name)
}

/// `TcpStream::connect_timeout` with congestion control `cc` set on the
/// socket before its SYN, as the engine's connects do. Set afterwards, a
/// host default of bbr has already been initialised on the connection and
/// leaves the kernel's pacing on; a listener given `cc`
/// ([`set_tcp_congestion`]) hands it to what it accepts from the start.
pub fn tcp_connect(
    addr: &std::net::SocketAddr,
    timeout: std::time::Duration,
    cc: Option<&str>,
) -> io::Result<std::net::TcpStream> {
    sys::connect_timeout(addr, timeout, cc)
}

/// The TCP congestion control algorithm `sock` runs.
pub fn tcp_congestion<S: std::os::fd::AsRawFd>(sock: &S) -> io::Result<String> {
    sys::tcp_congestion(sock.as_raw_fd())
}

/// Checks, on a socket made for the purpose, that the kernel lets this
/// process choose congestion control `name` (what creating a context with
/// `SOFTRDMA_TCP_CONGESTION=name` checks); the error names the variable and
/// what is allowed.
pub fn check_tcp_congestion(name: &str) -> io::Result<()> {
    sys::probe_tcp_congestion(name)
}

/// Octets of heap the process's allocator has handed out and not yet had
/// back (glibc `mallinfo2`: chunks in use plus mmapped blocks): the live
/// state of a process, without the free memory the allocator keeps
/// mapped, which RSS counts. `softrdma perf scale` reports both. `None`
/// where the allocator cannot say (not glibc).
pub fn heap_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no arguments and returns a plain struct by value; it only reads the allocator's statistics.
        let m = unsafe { libc::mallinfo2() };
        Some(m.uordblks as u64 + m.hblkhd as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}
