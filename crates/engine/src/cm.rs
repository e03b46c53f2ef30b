//! Connection setup for RC QPs (rdma_cm semantics, `RDMA_PS_TCP`): a TCP
//! connection, then the MPA Request/Reply negotiation ([`softrdma_proto::mpa`]),
//! then the QP runs over the socket.
//!
//! * [`Listener::bind`] / [`Listener::accept`] give an [`Incoming`]
//!   connection request with the peer's private data; the application
//!   [`Incoming::accept`]s it onto a QP (with its own private data and
//!   IRD/ORD) or [`Incoming::reject`]s it (MPA Reply with R=1).
//! * [`connect`] is the active side.
//!
//! These calls block (with the configured MPA timeout). The MPA frames are
//! read with exact lengths (20-octet header, then the private data) so no
//! FPDU octet is ever consumed by the set-up code.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use softrdma_proto::mpa::{
    self, Initiator, MpaConfig, MpaError, Negotiated, Outcome, PeerRequest, Responder, Rtr,
};
use softrdma_proto::rc::{RcConfig, RtrKind, RtrRole};
use softrdma_wire::fpdu;

use crate::{Context, Qp};

/// Why connection set-up failed.
#[derive(Debug)]
pub enum CmError {
    /// Socket error (refused, reset, unreachable).
    Io(io::Error),
    /// The MPA negotiation failed (bad frame, timeout, no common RTR …).
    Mpa(MpaError),
    /// The peer rejected the connection; its private data.
    Rejected(Vec<u8>),
    /// The QP is already connected.
    Busy,
}

impl std::fmt::Display for CmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CmError::Io(e) => write!(f, "connection: {e}"),
            CmError::Mpa(e) => write!(f, "MPA negotiation: {e}"),
            CmError::Rejected(pd) => write!(
                f,
                "connection rejected by the peer ({} octets of private data)",
                pd.len()
            ),
            CmError::Busy => write!(f, "the QP is already connected"),
        }
    }
}

impl std::error::Error for CmError {}

impl From<io::Error> for CmError {
    fn from(e: io::Error) -> Self {
        CmError::Io(e)
    }
}

impl From<MpaError> for CmError {
    fn from(e: MpaError) -> Self {
        CmError::Mpa(e)
    }
}

/// Connection parameters the application supplies (`rdma_conn_param`).
#[derive(Debug, Clone, Default)]
pub struct ConnParams {
    /// ULP private data (at most 256 octets less what MPA v2 and the
    /// softrdma trailer take: 244).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Read depth (`responder_resources`); 0 = default 16.
    pub ird: u16,
    /// Outbound RDMA Read depth (`initiator_depth`); 0 = default 16.
    pub ord: u16,
}

pub(crate) fn mpa_config(ctx: &Context, p: &ConnParams) -> MpaConfig {
    let c = ctx.config();
    MpaConfig {
        rev: c.mpa_rev,
        crc: c.mpa_crc,
        markers: c.mpa_markers,
        p2p: c.mpa_p2p,
        ird: if p.ird == 0 {
            mpa::DEFAULT_DEPTH
        } else {
            p.ird
        },
        ord: if p.ord == 0 {
            mpa::DEFAULT_DEPTH
        } else {
            p.ord
        },
        private_data: p.private_data.clone(),
        timeout: c.mpa_timeout,
        rtr_holdoff: c.rtr_holdoff,
        ..MpaConfig::default()
    }
}

/// Reads the `IPPROTO_TCP` option `opt` of `sock` into `v`; false if
/// `getsockopt` fails. `T` must be the option's plain-integer C type.
fn tcp_option<T>(sock: &TcpStream, opt: libc::c_int, v: &mut T) -> bool {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` octets into the live `v`.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            opt,
            v as *mut T as *mut libc::c_void,
            &mut len,
        )
    };
    r == 0
}

/// TCP's current maximum segment size for `sock` (`TCP_MAXSEG`).
fn mss(sock: &TcpStream) -> usize {
    let mut v: libc::c_int = 0;
    if tcp_option(sock, libc::TCP_MAXSEG, &mut v) && v > 0 {
        v as usize
    } else {
        1448
    }
}

/// The largest TCP segment the path of `sock` carries: its path MTU less
/// the IP and TCP headers and, when negotiated, the timestamp option
/// (`TCP_INFO`). `None` if the kernel does not say.
fn path_mss(sock: &TcpStream) -> Option<usize> {
    // SAFETY: `tcp_info` is plain integers, for which all zeros is valid.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    if !tcp_option(sock, libc::TCP_INFO, &mut ti) || ti.tcpi_pmtu == 0 {
        return None;
    }
    let ip = match sock.peer_addr().ok()? {
        SocketAddr::V4(_) => 20,
        SocketAddr::V6(a) if a.ip().to_ipv4_mapped().is_some() => 20,
        SocketAddr::V6(_) => 40,
    };
    // TCPI_OPT_TIMESTAMPS of <linux/tcp.h>.
    const TIMESTAMPS: u8 = 1;
    let options = if ti.tcpi_options & TIMESTAMPS != 0 {
        12
    } else {
        0
    };
    (ti.tcpi_pmtu as usize).checked_sub(ip + 20 + options)
}

/// Segment sizes from which on no Ethernet link — and so no iWARP RNIC,
/// whose receive path wants each FPDU in one TCP segment — can be on the
/// path: jumbo frames end near 9 KiB (16 KiB leaves room).
const BEYOND_ETHERNET: usize = 16 * 1024;

/// The effective maximum segment size of RFC 5044 (the smaller of the
/// peer's MSS and the path MTU's) for sizing FPDUs: TCP's current segment
/// size, except on paths beyond Ethernet frame sizes (loopback: MTU 64
/// KiB), where Linux also bounds that segment by half the largest window
/// the peer has offered — 32 KiB right after the handshake, though the path
/// carries twice that. There the path MTU's segment is used, so a bulk
/// transfer moves half as many FPDUs (no receiver on such a path needs the
/// alignment the smaller size would buy).
fn emss(sock: &TcpStream) -> usize {
    let mss = mss(sock);
    if mss < BEYOND_ETHERNET {
        return mss;
    }
    path_mss(sock).map_or(mss, |p| p.max(mss))
}

/// The largest ULPDU (DDP segment) an RC connection on `sock` sends: its
/// effective MSS (`emss`), capped by `SOFTRDMA_MAX_FPDU`, less the MPA
/// framing (and markers when `markers`) — read when the connection starts
/// and kept for its life. Public so that a raw baseline can frame its
/// stream exactly as RC would on the same kind of connection.
pub fn max_ulpdu(cfg: &crate::config::Config, sock: &TcpStream, markers: bool) -> usize {
    let emss = emss(sock).min(cfg.max_fpdu.unwrap_or(usize::MAX));
    fpdu::max_ulpdu(emss, markers).max(64)
}

/// The RC engine's parameters for a negotiated connection.
pub(crate) fn rc_config(
    ctx: &Context,
    n: &Negotiated,
    initiator: bool,
    sock: &TcpStream,
) -> RcConfig {
    let kind = match n.rtr {
        Rtr::ZeroLengthWrite => Some(RtrKind::Write),
        Rtr::ZeroLengthRead => Some(RtrKind::Read),
        Rtr::ZeroLengthSend => Some(RtrKind::Send),
        Rtr::InitiatorSendsFirst => None,
    };
    let rtr = match (initiator, kind) {
        (true, Some(k)) => RtrRole::Send(k),
        (true, None) => RtrRole::None,
        (false, k) => RtrRole::Await(k),
    };
    RcConfig {
        crc: n.crc,
        markers_tx: n.markers_tx,
        markers_rx: n.markers_rx,
        ird: n.ird,
        ord: n.ord,
        max_ulpdu: max_ulpdu(ctx.config(), sock, n.markers_tx),
        softrdma_ext: n.peer_is_softrdma,
        rtr,
        crc_direct_min: if ctx.config().mpa_crc_direct {
            crate::qp::DIRECT_MIN
        } else {
            0
        },
        ..RcConfig::default()
    }
}

/// Reads one MPA frame exactly (header, then private data).
fn read_frame(sock: &mut TcpStream, deadline: Instant) -> Result<Vec<u8>, CmError> {
    let mut buf = vec![0u8; softrdma_wire::mpa::HEADER_LEN];
    read_exact_by(sock, &mut buf, deadline)?;
    let total = softrdma_wire::mpa::frame_len(&buf).unwrap_or(softrdma_wire::mpa::HEADER_LEN);
    if total > buf.len() {
        let at = buf.len();
        buf.resize(total, 0);
        read_exact_by(sock, &mut buf[at..], deadline)?;
    }
    Ok(buf)
}

fn read_exact_by(
    sock: &mut TcpStream,
    mut buf: &mut [u8],
    deadline: Instant,
) -> Result<(), CmError> {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CmError::Mpa(MpaError::Timeout));
        }
        sock.set_read_timeout(Some(left))?;
        match sock.read(buf) {
            Ok(0) => {
                return Err(CmError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed during MPA set-up",
                )))
            }
            Ok(n) => buf = &mut buf[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(CmError::Mpa(MpaError::Timeout))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn send_all(sock: &mut TcpStream, data: &[u8]) -> io::Result<()> {
    crate::sys::NoSigPipe(sock).write_all(data)
}

/// Connects `qp` to a listener at `addr`. Returns the peer's private data.
pub fn connect(
    ctx: &Context,
    qp: &Qp,
    addr: impl ToSocketAddrs,
    params: &ConnParams,
) -> Result<Vec<u8>, CmError> {
    connect_then(ctx, qp, addr, params, || {})
}

/// As [`connect`]; `tcp_done` runs once the TCP connection is made or
/// could not be (before the MPA exchange). `cm_events` uses it to start
/// the connects of one process in the order they were asked for, so a
/// listener accepts (and reports) them in that order.
pub(crate) fn connect_then(
    ctx: &Context,
    qp: &Qp,
    addr: impl ToSocketAddrs,
    params: &ConnParams,
    tcp_done: impl FnOnce(),
) -> Result<Vec<u8>, CmError> {
    let mut hook = Some(tcp_done);
    let res = connect_inner(ctx, qp, addr, params, &mut hook);
    // Failed before the TCP connect was tried.
    if let Some(f) = hook.take() {
        f()
    }
    res
}

/// The longest pause between two connects to a peer that refuses.
const REFUSED_PAUSE_MAX: Duration = Duration::from_millis(50);

/// `TcpStream::connect_timeout` (with congestion control `cc` set before
/// the SYN), tried again while the peer refuses the connection, for up to
/// `retry` (`Config::connect_retry`): pauses of 1 ms doubling to
/// [`REFUSED_PAUSE_MAX`]. Any other outcome is returned at once, and the
/// last refusal when `retry` is spent.
fn connect_tcp(
    addr: &SocketAddr,
    timeout: Duration,
    retry: Duration,
    cc: Option<&str>,
) -> io::Result<TcpStream> {
    let give_up = Instant::now() + retry;
    let mut pause = Duration::from_millis(1);
    loop {
        match crate::sys::connect_timeout(addr, timeout, cc) {
            Err(e)
                if e.kind() == io::ErrorKind::ConnectionRefused
                    && Instant::now() + pause <= give_up =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(REFUSED_PAUSE_MAX);
            }
            r => return r,
        }
    }
}

fn connect_inner<F: FnOnce()>(
    ctx: &Context,
    qp: &Qp,
    addr: impl ToSocketAddrs,
    params: &ConnParams,
    tcp_done: &mut Option<F>,
) -> Result<Vec<u8>, CmError> {
    if qp.link_state() != crate::QpLinkState::Unconnected {
        return Err(CmError::Busy);
    }
    let timeout = ctx.config().mpa_timeout;
    let addr = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address"))?;
    let sock = connect_tcp(
        &addr,
        timeout,
        ctx.config().connect_retry,
        ctx.config().tcp_congestion.as_deref(),
    );
    if let Some(f) = tcp_done.take() {
        f()
    }
    let mut sock = sock?;
    sock.set_nodelay(true)?;
    let now = Instant::now();
    let deadline = now + timeout;
    let mut ini = Initiator::new(mpa_config(ctx, params), now)?;
    while let Some(out) = ini.poll_transmit() {
        let n = out.len();
        send_all(&mut sock, out)?;
        ini.transmitted(n);
    }
    let reply = read_frame(&mut sock, deadline)?;
    ini.handle_bytes(&reply, Instant::now())?;
    // Anything the initiator must send after the Reply (nothing today).
    while let Some(out) = ini.poll_transmit() {
        let n = out.len();
        send_all(&mut sock, out)?;
        ini.transmitted(n);
    }
    match ini.poll_outcome() {
        Some(Outcome::Negotiated(n)) => {
            sock.set_read_timeout(None)?;
            let cfg = rc_config(ctx, &n, true, &sock);
            qp.attach(sock, cfg, n.first_fpdu_not_before)?;
            Ok(n.peer_private_data)
        }
        Some(Outcome::Rejected { private_data }) => Err(CmError::Rejected(private_data)),
        Some(Outcome::Failed(e)) => Err(CmError::Mpa(e)),
        // A whole Reply frame that settles nothing is the peer's protocol
        // error (not a timeout: that would read as an unreachable peer).
        None => Err(CmError::Mpa(MpaError::InvalidFrame(
            "the MPA Reply did not complete the negotiation",
        ))),
    }
}

/// A TCP port held for a listener to come (`rdma_bind_addr` to port 0,
/// which chooses the port before `rdma_listen`): a socket bound to it with
/// `SO_REUSEADDR` that never listens, so no other program can take the
/// port while [`Listener::bind`] (whose listeners also reuse addresses)
/// still can. Dropping it lets the port go.
#[derive(Debug)]
pub struct PortReservation {
    /// Held for its descriptor: the bound socket is the reservation.
    _sock: TcpListener,
    addr: SocketAddr,
}

impl PortReservation {
    /// Holds a port on `addr`'s address (port 0: the kernel chooses one).
    pub fn new(addr: SocketAddr) -> io::Result<PortReservation> {
        let sock = crate::sys::bound_tcp_socket(addr)?;
        let addr = sock.local_addr()?;
        Ok(PortReservation { _sock: sock, addr })
    }

    /// The address held, with its port.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A passive endpoint: a TCP listener for MPA connection requests.
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    ctx: Context,
}

impl Listener {
    /// Listens on `addr` (port 0 picks one). With
    /// `SOFTRDMA_TCP_CONGESTION` the listening socket gets that algorithm,
    /// which every connection it accepts inherits from its first packet.
    pub fn bind(ctx: &Context, addr: impl ToSocketAddrs) -> io::Result<Listener> {
        let tcp = TcpListener::bind(addr)?;
        if let Some(cc) = &ctx.config().tcp_congestion {
            crate::sys::set_tcp_congestion(tcp.as_raw_fd(), cc)?;
        }
        Ok(Listener {
            tcp,
            ctx: ctx.clone(),
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Waits for a connection and its MPA Request.
    pub fn accept(&self) -> Result<Incoming, CmError> {
        let (sock, peer) = self.accept_tcp()?;
        self.handshake(sock, peer)
    }

    /// Waits for a TCP connection only ([`Listener::accept`]'s first half).
    pub(crate) fn accept_tcp(&self) -> io::Result<(TcpStream, SocketAddr)> {
        self.tcp.accept()
    }

    /// Reads the MPA Request on a connection from [`Listener::accept_tcp`]
    /// ([`Listener::accept`]'s second half).
    pub(crate) fn handshake(
        &self,
        mut sock: TcpStream,
        peer: SocketAddr,
    ) -> Result<Incoming, CmError> {
        sock.set_nodelay(true)?;
        let now = Instant::now();
        let timeout = self.ctx.config().mpa_timeout;
        let mut resp = Responder::new(mpa_config(&self.ctx, &ConnParams::default()), now)?;
        let req = read_frame(&mut sock, now + timeout)?;
        resp.handle_bytes(&req, Instant::now())?;
        // An automatic rejection (a bad Request) leaves a Reply to send.
        if let Some(request) = resp.request().cloned() {
            return Ok(Incoming {
                sock,
                peer,
                resp,
                request,
                ctx: self.ctx.clone(),
            });
        }
        while let Some(out) = resp.poll_transmit() {
            let n = out.len();
            let _ = send_all(&mut sock, out);
            resp.transmitted(n);
        }
        match resp.poll_outcome() {
            Some(Outcome::Failed(e)) => Err(CmError::Mpa(e)),
            _ => Err(CmError::Mpa(MpaError::Timeout)),
        }
    }

    /// The listening socket's descriptor (to poll for pending requests).
    pub fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.tcp.as_raw_fd()
    }
}

/// A connection request waiting for the application's decision.
#[derive(Debug)]
pub struct Incoming {
    sock: TcpStream,
    peer: SocketAddr,
    resp: Responder,
    request: PeerRequest,
    ctx: Context,
}

impl Incoming {
    /// The initiator's ULP private data.
    pub fn private_data(&self) -> &[u8] {
        &self.request.private_data
    }

    /// The initiator's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The Request as negotiated so far (IRD/ORD offered, CRC, markers).
    pub fn request(&self) -> &PeerRequest {
        &self.request
    }

    /// Accepts onto `qp` with our private data and depths.
    pub fn accept(mut self, qp: &Qp, params: &ConnParams) -> Result<(), CmError> {
        if qp.link_state() != crate::QpLinkState::Unconnected {
            return Err(CmError::Busy);
        }
        let ird = if params.ird == 0 {
            mpa::DEFAULT_DEPTH
        } else {
            params.ird
        };
        let ord = if params.ord == 0 {
            mpa::DEFAULT_DEPTH
        } else {
            params.ord
        };
        self.resp.accept(&params.private_data, ird, ord)?;
        while let Some(out) = self.resp.poll_transmit() {
            let n = out.len();
            send_all(&mut self.sock, out)?;
            self.resp.transmitted(n);
        }
        match self.resp.poll_outcome() {
            Some(Outcome::Negotiated(n)) => {
                let cfg = rc_config(&self.ctx, &n, false, &self.sock);
                qp.attach(self.sock, cfg, None)?;
                Ok(())
            }
            Some(Outcome::Failed(e)) => Err(CmError::Mpa(e)),
            _ => Err(CmError::Mpa(MpaError::Timeout)),
        }
    }

    /// Rejects with private data (MPA Reply with R=1), then closes.
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), CmError> {
        self.resp.reject(private_data)?;
        while let Some(out) = self.resp.poll_transmit() {
            let n = out.len();
            send_all(&mut self.sock, out)?;
            self.resp.transmitted(n);
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        Ok(())
    }
}

/// The MPA initiator for a TCP connection made elsewhere (the sockets
/// interposer, which runs the exchange on the application's own
/// connection without blocking): this context's MPA settings and
/// `params`. The caller moves the frames ([`Initiator::poll_transmit`],
/// [`Initiator::handle_bytes`]) and hands the outcome to
/// [`attach_negotiated`].
pub fn initiator(ctx: &Context, params: &ConnParams) -> Result<Initiator, MpaError> {
    Initiator::new(mpa_config(ctx, params), Instant::now())
}

/// The MPA responder for a TCP connection made elsewhere (see
/// [`initiator`]).
pub fn responder(ctx: &Context) -> Result<Responder, MpaError> {
    Responder::new(mpa_config(ctx, &ConnParams::default()), Instant::now())
}

/// Runs `qp` over `sock` after an MPA exchange that ended in `n`, as the
/// initiator or the responder (what [`connect`] and [`Incoming::accept`]
/// do once their exchange is over). The socket is made non-blocking.
pub fn attach_negotiated(
    ctx: &Context,
    qp: &Qp,
    sock: TcpStream,
    n: &Negotiated,
    initiator: bool,
) -> io::Result<()> {
    let cfg = rc_config(ctx, n, initiator, &sock);
    let hold = if initiator {
        n.first_fpdu_not_before
    } else {
        None
    };
    qp.attach(sock, cfg, hold)
}

/// How long a blocking CM call may take, as configured.
pub fn timeout(ctx: &Context) -> Duration {
    ctx.config().mpa_timeout
}
