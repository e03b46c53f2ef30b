//! RC queue pairs over real TCP sockets.
//!
//! A [`Qp`] wraps the sans-IO [`RcQp`] with a non-blocking `TcpStream`:
//!
//! * **transmit** runs on the caller's thread inside `post_send` (and on
//!   the progress thread when the socket pushed back): `writev` of header,
//!   registered memory and trailer, nothing copied;
//! * **receive** runs on the context's progress thread (epoll, level
//!   triggered) and inline from [`crate::Cq::poll`] when the CQ is empty, so
//!   a busy-polling application sees completions without a thread hop.
//!   While such a poller spins, the progress thread leaves the socket to it
//!   (busy-poll parking, `progress` module docs) instead of waking for
//!   every message; arming a CQ (`req_notify`) hands the socket back at
//!   once. With CRC every FPDU is verified before any of its octets are
//!   acted on: whole FPDUs in the receive buffer at once, and an FPDU cut
//!   by a read is kept by the protocol engine until its rest arrives
//!   (read straight behind its start, `RcQp::rx_stash_space`; later reads
//!   are sized to whole FPDUs so bulk streams are rarely cut). Without
//!   CRC, the payload of a Write, Read Response or Send whose header has
//!   arrived is read from the socket straight into registered memory
//!   (`RcQp::rx_direct`, one `readv` per FPDU that also takes the next
//!   header), so bulk data is copied once, by the kernel; [`Qp::rx_stats`]
//!   counts octets placed that way and octets copied.
//!
//! Before it is connected a QP only accepts receives (they are kept and
//! handed to the connection); `post_send` on an unconnected QP is refused.
//!
//! A QP created with a shared receive queue ([`Context::create_qp_with_srq`])
//! takes every receive from the [`Srq`]; `post_recv` on it is refused with
//! [`QpError::Invalid`], as in verbs.
//!
//! Lock order: a QP's core lock, then (receive path of an SRQ QP) the SRQ's
//! lock, then the registration table's read lock. Completions go to the
//! CQs under the QP lock (so a QP's completions keep their order whichever
//! thread makes progress), async events only after it is released. No code
//! takes a QP lock while holding an SRQ or CQ lock (inline progress from
//! `Cq::poll` only try-locks a QP).

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use softrdma_proto::memory::Access;
use softrdma_proto::rc::{
    CqKind, DirectRx, PostError, RcConfig, RcEvent, RcQp, RcState, RecvQueue,
};
use softrdma_proto::wr::{RecvWr, SendWr, MAX_SGE};
use softrdma_wire::rdmap::{Layer, TerminateCause};

use crate::cq::{AsyncEvent, Completion, Cq, Direct};
use crate::mr::{View, REMOTE_RIGHTS};
use crate::progress::Parking;
use crate::srq::Srq;
use crate::sys::{self, NoSigPipe};
use crate::{Context, Shared};

/// Sizes a QP is created with (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: usize,
    /// Receive queue depth.
    pub max_recv_wr: usize,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
        }
    }
}

/// Errors of the QP data path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpError {
    /// The queue is full.
    QueueFull,
    /// Not connected yet (sends need a connection).
    NotConnected,
    /// The operation is not supported on this connection (RFC 7306 toward
    /// a peer that is not softrdma).
    Unsupported,
    /// A parameter is invalid.
    Invalid,
}

impl From<PostError> for QpError {
    fn from(e: PostError) -> Self {
        match e {
            PostError::QueueFull => QpError::QueueFull,
            PostError::Unsupported => QpError::Unsupported,
            PostError::Invalid => QpError::Invalid,
        }
    }
}

/// State of the transport behind a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpLinkState {
    /// No connection yet.
    Unconnected,
    /// Connected; data may flow (or the RTR is awaited).
    Connected,
    /// Error: work flushed, the connection is gone or going.
    Error,
}

struct Link {
    rc: RcQp,
    sock: TcpStream,
    /// Watching for writability (the socket pushed back).
    want_write: bool,
    /// No transmit before this instant (siw takes over its socket only after
    /// sending its MPA Reply; see `Config::rtr_holdoff`).
    hold_until: Option<Instant>,
    closed: bool,
    /// The receive path is paused for a receive (`RcQp::rx_paused`) and the
    /// progress thread watches the socket through `QpShared::park_held`
    /// (never readable).
    rx_held: bool,
    /// While held: when the peer's close was first seen (`HELD_EOF_GRACE`).
    held_eof: Option<Instant>,
}

pub(crate) struct QpCore {
    link: Option<Link>,
    /// Receives posted before the connection exists.
    early_rq: RecvQueue,
    rxbuf: Vec<u8>,
    /// After a direct read: read at most this much into `rxbuf` (the next
    /// FPDU's header), so its payload can be placed directly too.
    rx_hint: Option<usize>,
    /// Reads in a row, under `rx_hint`, that found no FPDU to place
    /// directly.
    rx_short: u32,
    /// With CRC: the FPDU length of the stream, so reads take whole FPDUs
    /// (0: not known).
    rx_align: usize,
    rx_stats: RxStats,
    /// Completions gathered under the QP lock and handed to the CQs
    /// before it is released (in order).
    out_send: Vec<Completion>,
    out_recv: Vec<Completion>,
    errored: bool,
    /// The Terminate that moved the connection to the error state, and
    /// whether the peer sent it.
    terminate: Option<(TerminateCause, bool)>,
}

/// The shared part of a QP (the CQs and the progress thread hold it).
pub struct QpShared {
    pub(crate) shared: Arc<Shared>,
    qpn: u32,
    pd: u32,
    caps: QpCaps,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    /// The shared receive queue every receive comes from, if any.
    srq: Option<Arc<Srq>>,
    /// A receive side bound after creation ([`Qp::bind_receive`]): its
    /// SRQ and receive CQ replace `srq` and `recv_cq`.
    bound: OnceLock<(Arc<Srq>, Arc<Cq>)>,
    /// The socket's epoll interest and busy-poll parking.
    park: Parking,
    /// While the receive path waits for a receive: the socket's interest
    /// without reading (write interest only), in place of `park`.
    park_held: Parking,
    /// This QP, for re-registering its socket with the progress thread.
    me: std::sync::Weak<QpShared>,
    /// Raises no QP async events ([`Qp::set_internal`]).
    internal: AtomicBool,
    /// Its user drives all its progress ([`Qp::set_self_driven`]).
    self_driven: AtomicBool,
    /// Signaled Writes complete once placed ([`Qp::set_write_placed`]).
    write_placed: AtomicBool,
    /// A Send without receive waits ([`Qp::set_rnr_wait`]).
    rnr_wait: AtomicBool,
    /// The receive path waits for a receive: the timer looks again for
    /// one (SRQ) and for a reset (`QpShared::rx_interest`).
    rnr_timer: AtomicBool,
    /// The remote rights the QP grants ([`Qp::set_remote_access`]).
    remote_access: AtomicU32,
    core: Mutex<QpCore>,
}

impl std::fmt::Debug for QpShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpShared")
            .field("qpn", &self.qpn)
            .field("pd", &self.pd)
            .finish()
    }
}

/// An RC queue pair.
#[derive(Debug, Clone)]
pub struct Qp {
    pub(crate) inner: Arc<QpShared>,
}

const RXBUF: usize = 256 * 1024;

/// Payload octets left in an FPDU worth a direct read: below this the
/// copy path's larger read, which also takes what follows, is cheaper.
/// (With CRC also the octets an FPDU must still lack to be streamed rather
/// than kept whole: `RcConfig::crc_direct_min`.)
pub(crate) const DIRECT_MIN: usize = 2048;
/// Octets one inline poll reads at most (about 100-250 µs of placing on
/// loopback), so a poller whose sender keeps the socket full returns to
/// its caller with the completions so far and stamps its activity.
const INLINE_RX_BUDGET: usize = 1 << 20;

/// Header-sized reads in a row without a direct placement after which the
/// receive path goes back to reading the whole buffer (small messages).
const SHORT_RUN_END: u32 = 3;

/// Where received payload went (counters since the QP was created).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxStats {
    /// Octets read from the socket straight into registered memory.
    pub direct_octets: u64,
    /// Octets read into the receive buffer (headers, trailers, and payload
    /// placed by a copy: with CRC, small FPDUs, or a failed check).
    pub copied_octets: u64,
}

/// One `readv` of the rest of an FPDU's payload into the memory `d`
/// describes, and of what follows into `tail`; then tells `rc` what was
/// placed — with CRC, the placed octets read back through the same
/// io-vectors for the CRC to cover. `None` if a piece fails its memory
/// check (nothing read).
fn read_direct(
    fd: std::os::fd::RawFd,
    v: &View<'_>,
    d: &DirectRx,
    tail: &mut [u8],
    rc: &mut RcQp,
) -> Option<io::Result<usize>> {
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut iov = [empty; MAX_SGE + 1];
    let mut k = 0;
    for p in d.pieces() {
        if p.len == 0 {
            continue;
        }
        let ptr = v.place_ptr(p.key, p.addr, p.len, p.remote).ok()?;
        iov[k] = libc::iovec {
            iov_base: ptr.cast(),
            // Inside a region of the address space: fits usize.
            iov_len: p.len as usize,
        };
        k += 1;
    }
    let pieces = k;
    if !tail.is_empty() {
        iov[k] = libc::iovec {
            iov_base: tail.as_mut_ptr().cast(),
            iov_len: tail.len(),
        };
        k += 1;
    }
    // SAFETY: every iovec is a range `place_ptr` checked to lie in a live region registered with write access (kept alive by the view's read lock during the call), or `tail`, a live buffer we borrow mutably; the kernel writes at most iov_len octets to each.
    let r = unsafe { libc::syscall(libc::SYS_readv, fd, iov.as_ptr(), k as libc::c_int) };
    if r < 0 {
        return Some(Err(io::Error::last_os_error()));
    }
    let n = (r as usize).min(d.len);
    let ok = if rc.config().crc {
        let mut placed: [&[u8]; MAX_SGE] = [&[]; MAX_SGE];
        let (mut m, mut left) = (0, n);
        for io in &iov[..pieces] {
            if left == 0 {
                break;
            }
            let len = io.iov_len.min(left);
            // SAFETY: the first `len` octets of a registered range checked above, which the read lock of `v` keeps registered and the readv just wrote.
            placed[m] = unsafe { std::slice::from_raw_parts(io.iov_base as *const u8, len) };
            m += 1;
            left -= len;
        }
        rc.rx_direct_placed(n, &placed[..m])
    } else {
        rc.rx_direct_placed(n, &[])
    };
    debug_assert!(ok, "rx_direct offered the octets");
    Some(Ok(r as usize))
}

/// How often a receive path waiting for a receive from an SRQ looks
/// whether one was posted (`QpShared::rx_interest`).
const RNR_RECHECK: std::time::Duration = std::time::Duration::from_millis(1);

/// How often a receive path waiting for a receive looks whether the
/// connection was reset under it (`QpShared::recheck_parked`): the socket
/// is not read while it waits, so nothing else would see it.
const HELD_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a receive path that waits for a receive goes on waiting once
/// the peer has closed its end (the rest of the stream is in the socket):
/// an application that posts receives in that time gets the peer's last
/// messages; one that does not (it waits for the disconnect) sees the
/// connection end, as an InfiniBand disconnect would end it.
const HELD_EOF_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// What a zero-timeout `poll` (no read) says of a socket nobody reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Open.
    Open,
    /// The peer closed its end (FIN behind the unread octets).
    PeerClosed,
    /// Failed or hung up both ways (a reset).
    Reset,
}

fn held_state(fd: std::os::fd::RawFd) -> Held {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one live pollfd; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n <= 0 {
        Held::Open
    } else if p.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
        Held::Reset
    } else if p.revents & libc::POLLRDHUP != 0 {
        Held::PeerClosed
    } else {
        Held::Open
    }
}

/// How long after the first FPDU a silent non-softrdma responder gets a
/// probe (see `RcQp::send_probe`).
const PROBE_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

impl Qp {
    pub(crate) fn new(
        shared: Arc<Shared>,
        qpn: u32,
        pd: u32,
        caps: QpCaps,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
    ) -> Qp {
        Qp::with_srq(shared, qpn, pd, caps, send_cq, recv_cq, None)
    }

    /// As [`Qp::new`], optionally taking receives from `srq`.
    pub(crate) fn with_srq(
        shared: Arc<Shared>,
        qpn: u32,
        pd: u32,
        caps: QpCaps,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        srq: Option<Arc<Srq>>,
    ) -> Qp {
        let inner = Arc::new_cyclic(|me| QpShared {
            me: me.clone(),
            park_held: Parking::default(),
            rnr_wait: AtomicBool::new(false),
            rnr_timer: AtomicBool::new(false),
            shared,
            qpn,
            pd,
            caps,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            srq,
            bound: OnceLock::new(),
            park: Parking::default(),
            internal: AtomicBool::new(false),
            self_driven: AtomicBool::new(false),
            write_placed: AtomicBool::new(false),
            remote_access: AtomicU32::new(REMOTE_RIGHTS.0),
            core: Mutex::new(QpCore {
                link: None,
                early_rq: RecvQueue::new(caps.max_recv_wr),
                rxbuf: Vec::new(),
                rx_hint: None,
                rx_short: 0,
                rx_align: 0,
                rx_stats: RxStats::default(),
                out_send: Vec::with_capacity(caps.max_send_wr),
                out_recv: Vec::with_capacity(caps.max_recv_wr),
                errored: false,
                terminate: None,
            }),
        });
        send_cq.attach(Arc::downgrade(&inner));
        if !Arc::ptr_eq(&send_cq, &recv_cq) {
            recv_cq.attach(Arc::downgrade(&inner));
        }
        Qp { inner }
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// The protection domain.
    pub fn pd(&self) -> u32 {
        self.inner.pd
    }

    /// The capacities the QP was created with.
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// The shared receive queue the QP takes its receives from, if any.
    pub fn srq(&self) -> Option<&Arc<Srq>> {
        self.inner.srq_ref()
    }

    /// Binds the receive side of a QP created without a shared receive
    /// queue, after creation: from now on incoming Sends (and Writes with
    /// immediate data) take their receives from `srq` and complete into
    /// `recv_cq` (which also progresses the QP inline when polled). For
    /// SoftDC's reverse use of a connection (`docs/dc.md` §2); the QP's
    /// protection domain must be the SRQ user's. Refused
    /// ([`QpError::Invalid`]) on a QP that has an SRQ already, was bound
    /// before, or has receives of its own posted.
    pub fn bind_receive(&self, srq: Arc<Srq>, recv_cq: Arc<Cq>) -> Result<(), QpError> {
        if self.inner.srq.is_some() {
            return Err(QpError::Invalid);
        }
        // Under the QP lock: no receive is processed half-way through.
        let mut c = self.inner.lock();
        let own = !c.early_rq.is_empty()
            || c.link
                .as_mut()
                .is_some_and(|l| !l.rc.recv_queue().is_empty());
        if own {
            return Err(QpError::Invalid);
        }
        self.inner
            .bound
            .set((srq, recv_cq.clone()))
            .map_err(|_| QpError::Invalid)?;
        drop(c);
        recv_cq.attach(Arc::downgrade(&self.inner));
        Ok(())
    }

    /// Marks a QP that the engine uses internally (SoftDC connections):
    /// it raises no QP async events (established, fatal, access error) —
    /// the application never sees its number, and its closing is normal
    /// operation; errors reach the application as work completions. SRQ
    /// limit events are still raised.
    pub fn set_internal(&self) {
        self.inner.internal.store(true, Ordering::Relaxed);
    }

    /// The QP's user drives all of its progress through `Cq::poll`, and
    /// waits on the connection's socket itself when it has nothing to do
    /// (readable for what arrives; writable while [`Qp::tx_idle`] is
    /// false): the progress thread never watches the connection, so an
    /// arriving message wakes the waiting thread directly instead of the
    /// progress thread first. Set before the connection is attached. The
    /// sockets interposer uses it: a socket needs progress only while its
    /// application is in a call on it.
    pub fn set_self_driven(&self) {
        self.inner.self_driven.store(true, Ordering::Relaxed);
    }

    /// A signaled RDMA Write completes once the peer has placed it
    /// (InfiniBand's meaning; `RcConfig::write_placed`) rather than once
    /// it is written to the connection (iWARP's). Set before the connection
    /// is attached; IB-style connections ([`crate::ibconn`]) set it.
    pub fn set_write_placed(&self) {
        self.inner.write_placed.store(true, Ordering::Relaxed);
    }

    /// A Send (or Write with immediate) that finds no posted receive waits
    /// for one, as InfiniBand's RNR NAK and retry make it, instead of
    /// terminating the connection (iWARP's rule; `RcConfig::rnr_wait`):
    /// the QP stops reading its socket until a receive is posted, so TCP's
    /// flow control holds the sender back. Set before the connection is
    /// attached; IB-style connections ([`crate::ibconn`]) set it.
    pub fn set_rnr_wait(&self) {
        self.inner.rnr_wait.store(true, Ordering::Relaxed);
    }

    /// Sets the remote operations the QP accepts (the `IBV_ACCESS_REMOTE_*`
    /// bits of `ibv_modify_qp`'s `qp_access_flags`; other bits are
    /// ignored). A peer's RDMA Write, RDMA Read or atomic needs its right
    /// here as well as in the memory region, as in verbs; a QP accepts all
    /// three until this is called.
    pub fn set_remote_access(&self, flags: u32) {
        self.inner
            .remote_access
            .store(flags & REMOTE_RIGHTS.0, Ordering::Relaxed);
    }

    /// The transport state.
    pub fn link_state(&self) -> QpLinkState {
        let c = self.inner.lock();
        match &c.link {
            None if c.errored => QpLinkState::Error,
            None => QpLinkState::Unconnected,
            Some(l) if l.rc.state() == RcState::Error => QpLinkState::Error,
            Some(_) => QpLinkState::Connected,
        }
    }

    /// The Terminate that failed the connection, if one did, and whether
    /// the peer sent it (`true`) or this side (`false`, e.g.
    /// [`TerminateCause::DdpUntaggedNoBuffer`]: a Send found no receive).
    /// `None` while connected, and after a close or a transport failure.
    pub fn terminate_cause(&self) -> Option<(TerminateCause, bool)> {
        self.inner.lock().terminate
    }

    /// Octets written to the connection's socket that the peer has not
    /// acknowledged yet (`SIOCOUTQ`); `None` without a connection or if
    /// the socket cannot tell. 0: everything written reached the peer's
    /// TCP receive queue (SoftDC waits for it before letting the peer
    /// close a connection it wrote on, `docs/dc.md` §2).
    pub fn tx_unacked(&self) -> Option<usize> {
        let c = self.inner.lock();
        let fd = c.link.as_ref().filter(|l| !l.closed)?.sock.as_raw_fd();
        let mut n: libc::c_int = 0;
        // SAFETY: ioctl(TIOCOUTQ == SIOCOUTQ) on the link's own open socket (kept open by the QP lock held here), writing one c_int we own.
        let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
        (r == 0).then_some(n.max(0) as usize)
    }

    /// True when the QP has nothing left to write to its socket (no
    /// connection, a closed one, or every framed octet handed to TCP): a
    /// completed Send may still have octets in the engine until then.
    pub fn tx_idle(&self) -> bool {
        let c = self.inner.lock();
        c.link
            .as_ref()
            .is_none_or(|l| l.closed || !l.rc.wants_transmit())
    }

    /// Where received payload went so far: placed straight from the socket
    /// or copied through the receive buffer.
    pub fn rx_stats(&self) -> RxStats {
        self.inner.lock().rx_stats
    }

    /// Posts a send work request and transmits what the socket takes.
    ///
    /// On an open connection that may transmit now, post and write are one
    /// protocol call (`RcQp::post_send_and_transmit`), whose shortcut sends
    /// a lone small Send or Write with one system call and nothing queued.
    pub fn post_send(&self, wr: SendWr) -> Result<(), QpError> {
        let mut c = self.inner.lock();
        let Some(link) = c.link.as_mut() else {
            return Err(QpError::NotConnected);
        };
        if link.closed || link.hold_until.is_some() {
            link.rc.post_send(wr)?;
            self.inner.transmit(&mut c);
        } else {
            let pd = self.inner.pd;
            let rc = &mut link.rc;
            let sock = &mut link.sock;
            let res =
                self.inner
                    .shared
                    .registry
                    .with_qp_view(pd, self.inner.remote_rights(), |v| {
                        rc.post_send_and_transmit(wr, v, &mut NoSigPipe(sock))
                    })?;
            self.inner.transmitted(link, res);
        }
        self.inner.flush(c);
        Ok(())
    }

    /// Posts a receive. A QP with a shared receive queue has none of its
    /// own: [`QpError::Invalid`] (post to the [`Srq`] instead).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), QpError> {
        if self.inner.srq_ref().is_some() {
            return Err(QpError::Invalid);
        }
        let mut c = self.inner.lock();
        match c.link.as_mut() {
            Some(link) => {
                link.rc.post_recv(wr)?;
                if link.rc.rx_paused() {
                    // The Send waiting for it goes on (and what followed it);
                    // answers to Reads among them go out.
                    self.inner.rx_resume(link);
                    self.inner.transmit(&mut c);
                }
            }
            None => c.early_rq.post(wr)?,
        }
        self.inner.flush(c);
        Ok(())
    }

    /// Starts running the protocol over `sock` with the negotiated `cfg`.
    /// `hold_until`: transmit nothing before then. Receives posted so far
    /// move to the connection. The socket is made non-blocking, gets
    /// `TCP_NODELAY` and, if the context's configuration names one
    /// (`SOFTRDMA_TCP_CONGESTION`), its congestion control algorithm —
    /// nothing to do for the engine's own connections, which have it from
    /// before their SYN (`cm::Listener::bind`, the connects), but a socket
    /// made elsewhere gets it here.
    pub fn attach(
        &self,
        sock: TcpStream,
        cfg: RcConfig,
        hold_until: Option<Instant>,
    ) -> io::Result<()> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        if let Some(cc) = &self.inner.shared.config.tcp_congestion {
            crate::sys::set_tcp_congestion(sock.as_raw_fd(), cc)?;
        }
        let mut rc = RcQp::new(RcConfig {
            sq_depth: self.inner.caps.max_send_wr,
            rq_depth: self.inner.caps.max_recv_wr,
            write_placed: cfg.write_placed || self.inner.write_placed.load(Ordering::Relaxed),
            rnr_wait: cfg.rnr_wait || self.inner.rnr_wait.load(Ordering::Relaxed),
            ..cfg
        });
        let token = u64::from(self.inner.qpn);
        {
            let mut c = self.inner.lock();
            if c.link.is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "QP already connected",
                ));
            }
            let early: Vec<RecvWr> = std::iter::from_fn(|| c.early_rq.take_front()).collect();
            for wr in early {
                let _ = rc.post_recv(wr);
            }
            c.rxbuf = vec![0; RXBUF];
            c.link = Some(Link {
                rc,
                sock,
                want_write: false,
                hold_until,
                closed: false,
                rx_held: false,
                held_eof: None,
            });
        }
        let fd = self
            .inner
            .lock()
            .link
            .as_ref()
            .map(|l| l.sock.as_raw_fd())
            .expect("just attached");
        if !self.inner.self_driven.load(Ordering::Relaxed) {
            self.inner.park.register(
                self.inner.shared.progress()?,
                fd,
                token,
                Arc::downgrade(&self.inner),
            )?;
        }
        if !self.inner.internal.load(Ordering::Relaxed) {
            self.inner.shared.events.raise(AsyncEvent::CommEstablished {
                qpn: self.inner.qpn,
            });
        }
        // Toward a peer that is not softrdma, after our first FPDUs: one
        // probe if the peer stays silent (RcQp::send_probe: the siw Reply race).
        if !cfg.softrdma_ext {
            if let Some(t) = hold_until {
                let weak = Arc::downgrade(&self.inner);
                let at = t + PROBE_AFTER;
                let _ = std::thread::Builder::new()
                    .name("softrdma-probe".into())
                    .spawn(move || {
                        std::thread::sleep(at.saturating_duration_since(Instant::now()));
                        if let Some(q) = weak.upgrade() {
                            let mut c = q.lock();
                            if let Some(link) = c.link.as_mut() {
                                link.rc.send_probe();
                            }
                            q.transmit(&mut c);
                            q.flush(c);
                        }
                    });
            }
        }
        // Anything already posted (or the RTR) goes out now.
        let mut c = self.inner.lock();
        self.inner.transmit(&mut c);
        self.inner.flush(c);
        Ok(())
    }

    /// Disconnects: flushes outstanding work, sends what was started, and
    /// closes the connection.
    pub fn disconnect(&self) {
        let mut c = self.inner.lock();
        if let Some(link) = c.link.as_mut() {
            link.rc.disconnect();
            if link.rc.config().rnr_wait {
                // The peer may wait for a receive and read nothing more:
                // octets stuck in the socket then end in a reset.
                crate::reaper::watch(&link.sock);
            }
        } else {
            c.errored = true;
            let drained: Vec<RecvWr> = std::iter::from_fn(|| c.early_rq.take_front()).collect();
            for wr in drained {
                c.out_recv.push(Completion {
                    wc: softrdma_proto::wr::WorkCompletion::new(
                        wr.wr_id,
                        softrdma_proto::wr::WcStatus::WrFlushErr,
                        softrdma_proto::wr::WcOpcode::Recv,
                        0,
                    ),
                    qp_num: self.inner.qpn,
                });
            }
        }
        self.inner.transmit(&mut c);
        self.inner.flush(c);
    }
}

impl QpShared {
    /// The remote rights the QP grants ([`Qp::set_remote_access`]).
    fn remote_rights(&self) -> Access {
        Access(self.remote_access.load(Ordering::Relaxed))
    }

    /// The period of the timer of a receive path that waits for a receive.
    fn held_check(&self) -> std::time::Duration {
        if self.srq_ref().is_some() {
            RNR_RECHECK
        } else {
            HELD_CHECK
        }
    }

    /// The SRQ receives come from: the one of creation, or the one bound
    /// later ([`Qp::bind_receive`]).
    fn srq_ref(&self) -> Option<&Arc<Srq>> {
        self.srq.as_ref().or_else(|| self.bound.get().map(|b| &b.0))
    }

    /// The CQ receives complete into (see `srq_ref`).
    fn recv_cq(&self) -> &Arc<Cq> {
        self.bound.get().map_or(&self.recv_cq, |b| &b.1)
    }

    fn lock(&self) -> MutexGuard<'_, QpCore> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes what the protocol has to send; watches for writability when
    /// the socket pushes back.
    fn transmit(&self, c: &mut QpCore) {
        let Some(link) = c.link.as_mut() else { return };
        if link.closed {
            return;
        }
        if let Some(t) = link.hold_until {
            if Instant::now() < t {
                if !link.want_write {
                    link.want_write = true;
                    let park = self.park_of(link);
                    let _ = self
                        .shared
                        .progress()
                        .and_then(|p| park.watch_write(p, true));
                }
                return;
            }
            link.hold_until = None;
        }
        let pd = self.pd;
        let rc = &mut link.rc;
        let sock = &mut link.sock;
        let res = self
            .shared
            .registry
            .with_qp_view(pd, self.remote_rights(), |v| {
                rc.poll_transmit(v, &mut NoSigPipe(sock))
            });
        self.transmitted(link, res);
    }

    /// After a write attempt: a failed connection is closed under the
    /// protocol; write interest follows what is left to send.
    fn transmitted(&self, link: &mut Link, res: io::Result<usize>) {
        if res.is_err() {
            link.rc.handle_llp_closed();
        }
        let want = link.rc.wants_transmit();
        if want != link.want_write {
            link.want_write = want;
            let park = self.park_of(link);
            let _ = self
                .shared
                .progress()
                .and_then(|p| park.watch_write(p, want));
        }
    }

    /// The parking that holds the socket's epoll interest now.
    fn park_of(&self, link: &Link) -> &Parking {
        if link.rx_held {
            &self.park_held
        } else {
            &self.park
        }
    }

    /// Hands the octets held for a receive back to the protocol (after
    /// receives were posted; `RcQp::rx_resume`), then brings the socket's
    /// read interest in line with whether it is still paused.
    fn rx_resume(&self, link: &mut Link) {
        if link.rc.rx_paused() {
            let rc = &mut link.rc;
            match self.srq_ref() {
                // Lock order: QP core (held), SRQ, registry.
                Some(srq) => {
                    let mut q = srq.lock();
                    if !q.is_empty() {
                        self.shared
                            .registry
                            .with_qp_view(self.pd, self.remote_rights(), |v| {
                                rc.rx_resume_with_srq(v, &mut q)
                            });
                    }
                }
                None => self
                    .shared
                    .registry
                    .with_qp_view(self.pd, self.remote_rights(), |v| rc.rx_resume(v)),
            }
        }
        self.rx_interest(link);
    }

    /// Read interest follows the receive path: none while it waits for a
    /// receive (the progress thread would be woken for ever by a socket
    /// nobody reads; write interest stays), back once it goes on. A QP
    /// whose receives come from an SRQ cannot be told of a post: it looks
    /// again every `RNR_RECHECK` (InfiniBand's RNR timer); any other looks
    /// every `HELD_CHECK` whether the peer reset the connection.
    fn rx_interest(&self, link: &mut Link) {
        if link.closed {
            // Closing unregistered both parkings: nothing to watch.
            link.rx_held = false;
            self.rnr_timer.store(false, Ordering::Relaxed);
            return;
        }
        let paused = link.rc.rx_paused();
        if paused == link.rx_held || self.self_driven.load(Ordering::Relaxed) {
            return;
        }
        let Ok(p) = self.shared.progress() else {
            return;
        };
        let (fd, token) = (link.sock.as_raw_fd(), u64::from(self.qpn));
        if paused {
            self.park.unregister(p);
            self.park_held.register_quiet(p, fd, token, self.me.clone());
            p.set_timer(token, Instant::now() + self.held_check());
        } else {
            self.park_held.unregister(p);
            if self.park.register(p, fd, token, self.me.clone()).is_err() {
                // Without the progress thread only inline progress reads.
                link.rc.handle_llp_closed();
            }
        }
        link.rx_held = paused;
        self.rnr_timer.store(paused, Ordering::Relaxed);
        // The write interest moves along.
        if link.want_write {
            let _ = self.park_of(link).watch_write(p, true);
        }
    }

    /// Reads and processes everything the socket has (non-blocking).
    ///
    /// Payload of an RDMA Write, Read Response or Send whose header has
    /// arrived is read straight into registered memory (`RcQp::rx_direct`):
    /// one `readv` takes the rest of the payload into the destination and
    /// only the trailer plus the next FPDU's header into `rxbuf`, so a
    /// stream of large FPDUs is placed with no copy beyond the kernel's.
    /// With CRC this holds for FPDUs that still lack `DIRECT_MIN` octets or
    /// more when their header is read (`SOFTRDMA_MPA_CRC_DIRECT`, on by
    /// default): the placed octets are read back into the CRC, which is
    /// checked when the trailer arrives, before anything of the FPDU
    /// completes. Everything else goes through `rxbuf` and
    /// `RcQp::handle_bytes` (with CRC: verify, then place).
    ///
    /// Stops after a read that found the socket empty, or once `budget`
    /// octets were read (an inline poll returns to its caller and stamps
    /// its activity while a sender keeps the socket full); returns the
    /// octets read.
    fn receive(&self, c: &mut QpCore, budget: usize) -> usize {
        let mut total = 0usize;
        let QpCore {
            link,
            rxbuf,
            rx_hint,
            rx_short,
            rx_align,
            rx_stats,
            ..
        } = c;
        let Some(link) = link.as_mut() else { return 0 };
        if link.closed {
            return 0;
        }
        if link.rc.rx_paused() {
            // Receives may have come (an SRQ's): go on if they did.
            self.rx_resume(link);
            if link.rc.rx_paused() {
                return 0;
            }
        }
        let pd = self.pd;
        loop {
            if link.rc.rx_paused() {
                // A Send waits for a receive: the rest stays in the socket.
                break;
            }
            let offer = link.rc.rx_direct();
            let direct = offer.filter(|d| d.len >= DIRECT_MIN);
            // The direct read that happened, if any.
            let mut used: Option<DirectRx> = None;
            // Octets offered to the rest of a partial FPDU (CRC).
            let mut stash_need = 0;
            let res = match direct {
                Some(d) => {
                    let tail = (d.trailer + d.next_header).min(rxbuf.len());
                    let fd = link.sock.as_raw_fd();
                    let rc = &mut link.rc;
                    let r = self
                        .shared
                        .registry
                        .with_qp_view(pd, self.remote_rights(), |v| {
                            read_direct(fd, v, &d, &mut rxbuf[..tail], rc)
                        });
                    match r {
                        Some(r) => {
                            used = Some(d);
                            r.map(|n| (n, d.len + tail))
                        }
                        // A piece failed its check: the copy path reports it.
                        None => sys::recv(fd, rxbuf).map(|n| (n, rxbuf.len())),
                    }
                }
                None => {
                    let mut limit = match (*rx_hint, offer) {
                        // In a run of directly placed FPDUs, a short
                        // payload (a message's last FPDU) is copied, and
                        // the read ends at the next payload.
                        (Some(_), Some(d)) => d.len + d.trailer + d.next_header,
                        (Some(h), None) => h,
                        (None, _) => rxbuf.len(),
                    }
                    .min(rxbuf.len());
                    // Whole FPDUs per read: none is split, none kept.
                    if let Some(k) = limit.checked_div(*rx_align) {
                        limit = k.max(1) * *rx_align;
                    }
                    if let Some(l) = link.rc.rx_stash_fpdu_len() {
                        *rx_align = if l <= rxbuf.len() / 2 { l } else { 0 };
                    }
                    match link.rc.rx_stash_space() {
                        // With CRC, the rest of a partial FPDU goes straight
                        // behind its start, what follows into rxbuf.
                        Some(space) => {
                            stash_need = space.len();
                            let mut iov = [
                                io::IoSliceMut::new(space),
                                io::IoSliceMut::new(&mut rxbuf[..limit]),
                            ];
                            sys::readv(link.sock.as_raw_fd(), &mut iov)
                                .map(|n| (n, stash_need + limit))
                        }
                        None => sys::recv(link.sock.as_raw_fd(), &mut rxbuf[..limit])
                            .map(|n| (n, limit)),
                    }
                }
            };
            let (n, offered) = match res {
                Ok((0, _)) => {
                    link.rc.handle_llp_closed();
                    break;
                }
                Ok(x) => x,
                Err(e) if sys::would_block(&e) => break,
                Err(e) if sys::interrupted(&e) => continue,
                Err(_) => {
                    link.rc.handle_llp_closed();
                    break;
                }
            };
            total += n;
            // With a direct read the first octets are already in place.
            let placed = used.map_or(0, |d| n.min(d.len));
            if let Some(d) = used {
                rx_stats.direct_octets += placed as u64;
                // Enough to reach the next payload from anywhere in this
                // FPDU's trailer (a few payload octets more are harmless).
                *rx_hint = Some(d.trailer + d.next_header);
                *rx_short = 0;
            }
            let stashed = n.min(stash_need);
            if stashed > 0 {
                rx_stats.copied_octets += stashed as u64;
                let rc = &mut link.rc;
                let ok = match self.srq_ref() {
                    Some(srq) => {
                        let mut q = srq.lock();
                        self.shared
                            .registry
                            .with_qp_view(pd, self.remote_rights(), |v| {
                                rc.rx_stash_filled_with_srq(stashed, v, &mut q)
                            })
                    }
                    None => self
                        .shared
                        .registry
                        .with_qp_view(pd, self.remote_rights(), |v| rc.rx_stash_filled(stashed, v)),
                };
                debug_assert!(ok, "rx_stash_space offered the room");
            }
            let data = &rxbuf[..n - placed - stashed];
            if !data.is_empty() {
                rx_stats.copied_octets += data.len() as u64;
                let rc = &mut link.rc;
                match self.srq_ref() {
                    // Lock order: QP core (held), SRQ, registry.
                    Some(srq) => {
                        let mut q = srq.lock();
                        self.shared
                            .registry
                            .with_qp_view(pd, self.remote_rights(), |v| {
                                rc.handle_bytes_with_srq(data, v, &mut q)
                            });
                    }
                    None => self
                        .shared
                        .registry
                        .with_qp_view(pd, self.remote_rights(), |v| rc.handle_bytes(data, v)),
                }
                // Keep reading header-sized pieces only while they lead to
                // direct placement: the run ends after a few FPDUs in a
                // row too short to place directly (a short read may have
                // cut the header: that does not count).
                if placed == 0
                    && n == offered
                    && rx_hint.is_some()
                    && link
                        .rc
                        .rx_direct()
                        .filter(|d| d.len >= DIRECT_MIN)
                        .is_none()
                {
                    *rx_short += 1;
                    if *rx_short >= SHORT_RUN_END {
                        *rx_hint = None;
                        *rx_short = 0;
                    }
                }
            }
            if n < offered || total >= budget {
                break;
            }
        }
        self.rx_interest(link);
        total
    }

    /// Moves completions out of the protocol engine into the CQs (under the
    /// QP lock, so they keep their order), then, after the QP lock is
    /// released, events into the async event queue.
    fn flush(&self, c: MutexGuard<'_, QpCore>) {
        self.flush_to(c, None)
    }

    /// [`QpShared::flush`], offering the completions to a poller's
    /// `direct` output first (inline progress).
    fn flush_to(&self, c: MutexGuard<'_, QpCore>, direct: Option<&mut Direct<'_>>) {
        // Most flushes (every empty busy poll, most posts) find nothing:
        // they only release the lock. (`out_recv` is not always empty
        // here: disconnecting a QP that never connected puts its posted
        // receives' flush completions there.)
        if c.out_send.is_empty()
            && c.out_recv.is_empty()
            && !c.link.as_ref().is_some_and(|l| l.rc.has_output())
        {
            return;
        }
        self.flush_output(c, direct);
    }

    /// [`QpShared::flush`] with something to move.
    #[inline(never)]
    fn flush_output(&self, mut c: MutexGuard<'_, QpCore>, mut direct: Option<&mut Direct<'_>>) {
        let mut events: [Option<AsyncEvent>; 4] = [None; 4];
        let mut ne = 0;
        let mut close = false;
        {
            let QpCore {
                link,
                out_send,
                out_recv,
                terminate,
                ..
            } = &mut *c;
            if let Some(link) = link.as_mut() {
                while let Some((kind, wc)) = link.rc.poll_completion() {
                    let comp = Completion {
                        wc,
                        qp_num: self.qpn,
                    };
                    let (staged, cq) = match kind {
                        CqKind::Send => (&mut *out_send, &self.send_cq),
                        CqKind::Recv => (&mut *out_recv, self.recv_cq()),
                    };
                    Direct::hand_or_stage(direct.as_deref_mut(), cq, staged, comp);
                }
                while let Some(ev) = link.rc.poll_event() {
                    if let RcEvent::Error {
                        cause: Some(t),
                        remote,
                    } = ev
                    {
                        terminate.get_or_insert((t, remote));
                    }
                    let ae = match ev {
                        RcEvent::Error { cause: Some(t), .. }
                            if matches!(t.layer(), Layer::Rdmap | Layer::Ddp) && t.etype() == 1 =>
                        {
                            Some(AsyncEvent::QpAccessError { qpn: self.qpn })
                        }
                        RcEvent::Error { .. } => Some(AsyncEvent::QpFatal { qpn: self.qpn }),
                        RcEvent::TxClosed => {
                            close = true;
                            None
                        }
                        RcEvent::RecvLimitReached => Some(AsyncEvent::SrqLimitReached {
                            id: self.srq_ref().map_or(u64::from(self.qpn), |q| q.id()),
                        }),
                    };
                    if let (Some(e), true) = (ae, ne < events.len()) {
                        events[ne] = Some(e);
                        ne += 1;
                    }
                }
                if close && !link.closed {
                    link.closed = true;
                    let _ = link.sock.shutdown(std::net::Shutdown::Both);
                    if link.rc.config().rnr_wait {
                        crate::reaper::watch(&link.sock);
                    }
                    if let Ok(p) = self.shared.progress() {
                        self.park.unregister(p);
                        self.park_held.unregister(p);
                    }
                }
            }
        }
        // Completions reach the CQs before the QP lock is released: two
        // flushers of one QP (progress thread, inline progress, a post)
        // must not overtake each other, as verbs completes a QP's work in
        // order. A CQ never takes a QP lock, so QP core then CQ is safe.
        self.send_cq.push(&c.out_send);
        self.recv_cq().push(&c.out_recv);
        // Cleared, not replaced: the buffers keep their capacity.
        c.out_send.clear();
        c.out_recv.clear();
        drop(c);
        let internal = self.internal.load(Ordering::Relaxed);
        for e in events.iter().flatten() {
            if !internal || matches!(e, AsyncEvent::SrqLimitReached { .. }) {
                self.shared.events.raise(*e);
            }
        }
    }

    /// Progress from the progress thread: readable and/or writable. A
    /// socket that an application busy-polls is parked instead (left to
    /// the poller, for reading and transmitting; `progress` module docs),
    /// unless it hung up.
    pub(crate) fn on_ready(&self, readable: bool, writable: bool, hangup: bool) {
        // A spinning poller's inline progress reads and transmits for this
        // QP: woken for either, the thread leaves both to it (a hang-up is
        // acted on at once).
        let parked = !hangup
            && (readable || writable)
            && self
                .shared
                .progress()
                .is_ok_and(|p| self.park.park_if_spinning_rw(p));
        let (readable, writable) = (readable && !parked, writable && !parked);
        if !readable && !writable {
            return;
        }
        let mut c = self.lock();
        if readable {
            self.receive(&mut c, usize::MAX);
        }
        if readable || writable {
            self.transmit(&mut c);
        }
        self.flush(c);
    }

    /// Inline progress outside a CQ poll: skipped if another thread holds
    /// the QP (it is making progress already). Everything the socket has
    /// is read (no [`INLINE_RX_BUDGET`]): DC relies on it to take a closing
    /// connection's last messages.
    pub(crate) fn progress_inline(&self) {
        self.progress_inline_with(None, usize::MAX)
    }

    /// Progress from [`Cq::poll`] on an empty CQ, which may take the
    /// completions in `direct`: skipped if another thread holds the QP.
    pub(crate) fn progress_inline_to(&self, direct: Option<&mut Direct<'_>>) {
        self.progress_inline_with(direct, INLINE_RX_BUDGET)
    }

    /// The connection's socket while the progress thread watches it.
    pub(crate) fn progress_fd(&self) -> Option<std::os::fd::RawFd> {
        self.park.fd()
    }

    /// Inline progress of a CQ that knows whether the socket is readable
    /// (`Cq::poll` with many QPs): when it is not, no read is tried.
    pub(crate) fn progress_inline_ready(&self, direct: &mut Direct<'_>, readable: bool) {
        let budget = if readable { INLINE_RX_BUDGET } else { 0 };
        self.progress_inline_with(Some(direct), budget)
    }

    /// Inline progress reading up to `budget` octets (0: no read at all).
    fn progress_inline_with(&self, direct: Option<&mut Direct<'_>>, budget: usize) {
        self.park.busy.polled();
        let Ok(mut c) = self.core.try_lock() else {
            return;
        };
        if budget > 0 && self.receive(&mut c, budget) >= INLINE_RX_BUDGET {
            // A poll that placed this much took long enough for the
            // schedule of `polled` stamps to fall behind: stamp now, or
            // the progress thread would take the socket from the poller.
            self.park.busy.stamp();
        }
        // An empty poll stays cheap: no registry lock, no framing.
        if c.link.as_ref().is_some_and(|l| l.rc.wants_transmit()) {
            self.transmit(&mut c);
        }
        self.flush_to(c, direct);
    }
}

impl QpShared {
    /// The parked-socket re-check timer (progress thread).
    pub(crate) fn recheck_parked(&self) {
        if let Ok(p) = self.shared.progress() {
            self.park.recheck(p);
        }
        // A receive path waiting on an SRQ looks again.
        if !self.rnr_timer.load(Ordering::Relaxed) {
            return;
        }
        let mut c = self.lock();
        let Some(link) = c.link.as_mut().filter(|l| l.rx_held) else {
            return;
        };
        self.rx_resume(link);
        if link.rx_held {
            let over = match held_state(link.sock.as_raw_fd()) {
                Held::Open => false,
                // The peer gave up on what it could not send (an IB-style
                // disconnect: `reaper`).
                Held::Reset => true,
                Held::PeerClosed => {
                    let now = Instant::now();
                    now.duration_since(*link.held_eof.get_or_insert(now)) >= HELD_EOF_GRACE
                }
            };
            if over {
                link.rc.handle_llp_closed();
                self.rx_interest(link);
            }
        }
        if link.rx_held {
            if let Ok(p) = self.shared.progress() {
                p.set_timer(u64::from(self.qpn), Instant::now() + self.held_check());
            }
        }
        self.transmit(&mut c);
        self.flush(c);
    }

    /// A CQ this QP completes into was armed.
    pub(crate) fn notify_armed(&self) {
        self.park.notify_armed(|| self.shared.progress());
    }
}

impl Context {
    /// An RC queue pair in protection domain `pd` that takes every receive
    /// from `srq` (`ibv_create_qp` with `srq` set; `caps.max_recv_wr` is
    /// unused). Receive buffers are checked against `pd`: the SRQ's
    /// receives must use memory registered in it.
    pub fn create_qp_with_srq(
        &self,
        qpn: u32,
        pd: u32,
        caps: QpCaps,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        srq: Arc<Srq>,
    ) -> Qp {
        Qp::with_srq(
            self.shared.clone(),
            qpn,
            pd,
            caps,
            send_cq,
            recv_cq,
            Some(srq),
        )
    }
}
