//! Datagram sockets over UD queue pairs.
//!
//! A UDP socket that softrdma takes keeps its kernel socket (plain peers
//! still reach it there) and gets one UD QP, entered in the registry under
//! the socket's own address. A `sendto` toward an address the registry
//! (or an earlier datagram from it) shows as interposed is one UD Send to
//! that socket's QP; anything else goes to the kernel. Each UD message
//! starts with an 8-octet header:
//!
//! | octets | field |
//! |---|---|
//! | 0..2 | `b"SU"` |
//! | 2..4 | the sender socket's UDP port (big endian) |
//! | 4..6 | multicast: the destination port (big endian); else zero |
//! | 6 | 1: sent to a multicast group; else zero |
//! | 7 | zero |
//!
//! so the receiver reports the sender's socket address (the completion's
//! source IP, the header's port) as `recvfrom` would, and answers it over
//! UD without asking the registry (it remembers the sender's QP).
//!
//! The QP is self-driven (`UdQpOptions::self_driven`): its UDP socket is
//! its own and the engine's progress thread does not read it. A call on
//! the socket polls the CQ, which reads the QP's socket on the caller's
//! thread; a call that has to wait spins for `SOFTRDMA_SOCKETS_SPIN_US`,
//! then sleeps on one private epoll set holding the kernel socket, the
//! QP's UDP socket and the CQ's completion channel (armed: the progress
//! thread still runs the QP's timers and resumes a transmit the socket
//! pushed back, and what that completes must wake the sleeper). A UD
//! datagram arriving for a sleeping caller wakes it directly. Datagrams
//! that arrive while the application is in no call wait in the QP's
//! socket buffer, as the kernel's datagrams wait in the kernel socket's
//! (RD's are read by the progress thread when nobody polled for 10 ms, so
//! the peer's messages are acknowledged).
//!
//! Multicast (`SOFTRDMA_SOCKETS_MCAST=ud`, opt-in: every member of the
//! groups the program uses runs under the interposer with it). A UD
//! socket's `IP_ADD_MEMBERSHIP` also attaches its QP to the group
//! (`IP_DROP_MEMBERSHIP` detaches it), and a `sendto` to a group address
//! is one UD multicast Send (to `Context::mcast_dest`) instead of the
//! kernel's datagram, so no member gets both. Every QP attached to the
//! group receives it whatever its socket's port, so the header carries
//! the destination port and a receiver whose port differs drops the
//! message (the kernel delivers a group datagram only to sockets bound to
//! its port). Plain senders' group datagrams still arrive on the kernel
//! socket. Without the policy, group traffic is the kernel's.
//!
//! Receives are served from pre-posted buffers and copied out; a socket
//! reads whichever of its two sources (UD messages, kernel datagrams) has
//! something, UD first. Loss is UDP's: a message that finds no posted
//! buffer is dropped, as a datagram that finds a full socket buffer.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use softrdma_verbs::{
    Access, AddressHandle, Completion, CompletionChannel, CompletionQueue, DgramAddr, MemoryRegion,
    Payload, ProtectionDomain, QpCaps, RdQpOptions, RdQueuePair, RecvWr, SendFlags, SendOp, SendWr,
    SgList, UdQpOptions, UdQueuePair, WcOpcode, WcStatus, WorkCompletion,
};

use crate::conn::Device;

/// Octets of the UD header.
pub const HDR: usize = 8;
/// The largest datagram carried (UDP's own limit).
pub const MAX_DGRAM: usize = 65_507;
/// Octets per receive buffer.
const BUF: usize = HDR + MAX_DGRAM;
/// Receive buffers posted per socket.
const RX_BUFS: usize = 128;
/// Send slots per socket.
const TX_BUFS: usize = 16;
/// How long "not interposed" is believed of a destination before the
/// registry is asked again.
const NEGATIVE_TTL: Duration = Duration::from_secs(1);

/// `SOFTRDMA_SOCKETS_MCAST=ud`: group memberships and sends to groups of
/// UD sockets go over UD multicast (module docs).
pub fn mcast_ud() -> bool {
    static M: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *M.get_or_init(|| std::env::var("SOFTRDMA_SOCKETS_MCAST").as_deref() == Ok("ud"))
}

/// True if `dest` is an IPv4 group that goes over UD multicast.
pub fn mcast_dest(dest: SocketAddr) -> bool {
    mcast_ud()
        && match dest.ip().to_canonical() {
            IpAddr::V4(a) => a.is_multicast(),
            IpAddr::V6(_) => false,
        }
}

/// Where a datagram goes over UD ([`UdEnd::peer`]).
#[derive(Debug, Clone)]
pub struct Dest {
    ah: AddressHandle,
    /// A group's destination port (the header's).
    mcast_port: Option<u16>,
}

/// The datagram transport of a socket's QP (`SOFTRDMA_SOCKETS_UDP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Unreliable datagrams: loss as UDP's.
    Ud,
    /// Reliable datagrams (softrdma's RD): acknowledged, retransmitted,
    /// in order per peer; a Send completes when the peer has it.
    Rd,
}

impl Transport {
    /// The registry's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Ud => "ud",
            Transport::Rd => "rd",
        }
    }

    /// Parses the registry's word.
    pub fn parse(s: &str) -> Option<Transport> {
        match s {
            "ud" => Some(Transport::Ud),
            "rd" => Some(Transport::Rd),
            _ => None,
        }
    }
}

/// What carries a socket, as `SOFTRDMA_TRANSPORT` names it
/// (`softrdma/sockets.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SockTransport {
    /// The kernel (`SOFTRDMA_TRANSPORT_KERNEL`, 0).
    Kernel,
    /// An RC queue pair, streams only (`SOFTRDMA_TRANSPORT_RC`, 1).
    Rc,
    /// A UD queue pair (`SOFTRDMA_TRANSPORT_UD`, 2).
    Ud,
    /// An RD queue pair (`SOFTRDMA_TRANSPORT_RD`, 3).
    Rd,
}

impl SockTransport {
    /// The option's value.
    pub fn as_int(self) -> i32 {
        match self {
            SockTransport::Kernel => 0,
            SockTransport::Rc => 1,
            SockTransport::Ud => 2,
            SockTransport::Rd => 3,
        }
    }

    /// From the option's value.
    pub fn from_int(v: i32) -> Option<SockTransport> {
        match v {
            0 => Some(SockTransport::Kernel),
            1 => Some(SockTransport::Rc),
            2 => Some(SockTransport::Ud),
            3 => Some(SockTransport::Rd),
            _ => None,
        }
    }
}

impl From<Transport> for SockTransport {
    fn from(t: Transport) -> SockTransport {
        match t {
            Transport::Ud => SockTransport::Ud,
            Transport::Rd => SockTransport::Rd,
        }
    }
}

enum DQp {
    Ud(UdQueuePair),
    Rd(RdQueuePair),
}

impl DQp {
    fn post_recv(&self, wr: RecvWr) -> bool {
        match self {
            DQp::Ud(q) => q.post_recv(wr).is_ok(),
            DQp::Rd(q) => q.post_recv(wr).is_ok(),
        }
    }
    fn post_send(&self, wr: SendWr, ah: &AddressHandle) -> bool {
        match self {
            DQp::Ud(q) => q.post_send(wr, ah).is_ok(),
            DQp::Rd(q) => q.post_send(wr, ah).is_ok(),
        }
    }
    fn address(&self) -> DgramAddr {
        match self {
            DQp::Ud(q) => q.address(),
            DQp::Rd(q) => q.address(),
        }
    }
    fn pd(&self) -> &ProtectionDomain {
        match self {
            DQp::Ud(q) => q.pd(),
            DQp::Rd(q) => q.pd(),
        }
    }
    fn qpn(&self) -> u32 {
        match self {
            DQp::Ud(q) => q.qpn(),
            DQp::Rd(q) => q.qpn(),
        }
    }
    fn socket_fd(&self) -> i32 {
        match self {
            DQp::Ud(q) => q.socket_fd(),
            DQp::Rd(q) => q.socket_fd(),
        }
    }
}

struct RxMsg {
    idx: usize,
    len: usize,
    src: SocketAddr,
}

/// A datagram socket's UD side.
pub struct UdEnd {
    qp: DQp,
    transport: Transport,
    cq: CompletionQueue,
    chan: CompletionChannel,
    rx_mr: MemoryRegion,
    tx_mr: MemoryRegion,
    rx: VecDeque<RxMsg>,
    tx_free: Vec<usize>,
    /// Destinations known to be interposed (their QP's address handle), or
    /// not (`None`, with when that was last checked).
    peers: HashMap<SocketAddr, (Option<AddressHandle>, Instant)>,
    /// Multicast groups the QP is attached to.
    groups: Vec<std::net::Ipv4Addr>,
    /// The socket's own UDP port (the header's).
    port: u16,
    /// Private epoll set over the kernel socket, the QP's own UDP socket
    /// and the completion channel: the one descriptor a waiter sleeps on.
    waitfd: i32,
    /// Messages sent and received (statistics).
    pub msgs_out: u64,
    /// As [`UdEnd::msgs_out`], inbound.
    pub msgs_in: u64,
}

impl std::fmt::Debug for UdEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdEnd")
            .field("qpn", &self.qp.qpn())
            .field("transport", &self.transport)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Drop for UdEnd {
    fn drop(&mut self) {
        if self.waitfd >= 0 {
            // SAFETY: our own epoll descriptor.
            unsafe { (crate::real::real().close)(self.waitfd) };
        }
    }
}

fn epoll_add(ep: i32, fd: i32) {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: registering a descriptor in our own epoll set.
    unsafe { (crate::real::real().epoll_ctl)(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
}

impl UdEnd {
    /// A QP of `transport` for the socket `fd` bound to `local` (its
    /// kernel socket stays the socket's other source), every receive
    /// posted.
    pub fn new(
        dev: &Device,
        fd: i32,
        local: SocketAddr,
        transport: Transport,
    ) -> std::io::Result<UdEnd> {
        let chan = dev.ctx().create_comp_channel()?;
        let cq = dev
            .ctx()
            .create_cq(2 * (RX_BUFS + TX_BUFS) + 8, Some(&chan));
        let bind = SocketAddr::new(local.ip(), 0);
        let caps = QpCaps {
            max_send_wr: TX_BUFS + 4,
            max_recv_wr: RX_BUFS,
        };
        let qp = match transport {
            Transport::Ud => dev
                .pd()
                .create_ud_qp(
                    &cq,
                    &cq,
                    caps,
                    UdQpOptions {
                        bind,
                        max_msg: BUF,
                        self_driven: true,
                        ..UdQpOptions::default()
                    },
                )
                .map(DQp::Ud),
            Transport::Rd => dev
                .pd()
                .create_rd_qp(
                    &cq,
                    &cq,
                    caps,
                    RdQpOptions {
                        bind,
                        max_msg: BUF,
                        self_driven: true,
                        ..RdQpOptions::default()
                    },
                )
                .map(DQp::Rd),
        }
        .map_err(|e| std::io::Error::other(e.to_string()))?;
        let reg = |n: usize, a: Access| {
            dev.pd()
                .register(n * BUF, a)
                .map_err(|e| std::io::Error::other(e.to_string()))
        };
        let rx_mr = reg(RX_BUFS, Access::LOCAL_WRITE)?;
        let tx_mr = reg(TX_BUFS, Access(0))?;
        // SAFETY: a new epoll set of our own.
        let waitfd = unsafe { (crate::real::real().epoll_create1)(libc::EPOLL_CLOEXEC) };
        if waitfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        epoll_add(waitfd, fd);
        epoll_add(waitfd, qp.socket_fd());
        epoll_add(waitfd, chan.fd());
        let u = UdEnd {
            qp,
            transport,
            cq,
            chan,
            rx_mr,
            tx_mr,
            rx: VecDeque::new(),
            tx_free: (0..TX_BUFS).rev().collect(),
            peers: HashMap::new(),
            groups: Vec::new(),
            port: local.port(),
            waitfd,
            msgs_out: 0,
            msgs_in: 0,
        };
        for i in 0..RX_BUFS {
            u.post_recv(i);
        }
        Ok(u)
    }

    fn post_recv(&self, idx: usize) {
        let sge = self.rx_mr.sge(idx * BUF, BUF as u32);
        let _ = self.qp.post_recv(RecvWr {
            wr_id: idx as u64,
            sgl: SgList::single(sge.addr, sge.length, sge.lkey),
        });
    }

    /// The QP's UDP port, number and transport (the registry entry).
    pub fn qp_addr(&self) -> (u16, u32, Transport) {
        let a = self.qp.address();
        (a.port, a.qpn, self.transport)
    }

    /// The descriptor a waiter sleeps on (readable: a kernel datagram, a
    /// UD datagram on the QP's socket, or the armed CQ fired).
    pub fn wait_fd(&self) -> i32 {
        self.waitfd
    }

    /// Takes the CQ's completions. True if anything changed.
    pub fn progress(&mut self) -> bool {
        let blank = Completion {
            wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
            qp_num: 0,
        };
        let mut out = [blank; 32];
        let mut changed = false;
        loop {
            let n = self.cq.poll(&mut out);
            for c in &out[..n] {
                self.complete(&c.wc);
            }
            changed |= n > 0;
            if n < out.len() {
                break;
            }
        }
        changed
    }

    fn complete(&mut self, wc: &WorkCompletion) {
        match wc.opcode {
            WcOpcode::Recv => {
                let idx = wc.wr_id as usize;
                let len = wc.byte_len as usize;
                let mut h = [0u8; HDR];
                let ok = wc.status == WcStatus::Success
                    && idx < RX_BUFS
                    && len >= HDR
                    && self.rx_mr.read_at(idx * BUF, &mut h).is_ok()
                    && h[..2] == *b"SU";
                let src = wc.src.filter(|_| ok);
                match src {
                    // A group's message for another port (module docs).
                    Some(_) if h[6] == 1 && u16::from_be_bytes([h[4], h[5]]) != self.port => {
                        self.post_recv(idx)
                    }
                    Some(s) => {
                        let port = u16::from_be_bytes([h[2], h[3]]);
                        let from = SocketAddr::new(s.ip.to_canonical(), port);
                        // Its QP answers for it from now on.
                        if let Ok(ah) = self.qp.pd().create_ah(s) {
                            self.peers.insert(from, (Some(ah), Instant::now()));
                        }
                        self.msgs_in += 1;
                        self.rx.push_back(RxMsg {
                            idx,
                            len: len - HDR,
                            src: from,
                        });
                    }
                    None if idx < RX_BUFS => self.post_recv(idx),
                    None => {}
                }
            }
            _ => {
                if wc.wr_id < TX_BUFS as u64 {
                    self.tx_free.push(wc.wr_id as usize);
                }
            }
        }
    }

    /// Arms the CQ and drains the channel (before a wait on
    /// [`UdEnd::wait_fd`]); true if completions arrived meanwhile.
    pub fn arm(&mut self) -> bool {
        // The channel serves this CQ alone, which fires at most once per
        // arming: one event at most to take (an event left over would
        // only wake a waiter once for nothing). One look, not a loop that
        // ends on an empty look (two more system calls per wait).
        let _ = self.chan.get_event(Some(Duration::ZERO));
        self.cq.req_notify(false);
        self.progress()
    }

    /// True with a UD message queued.
    pub fn has_message(&self) -> bool {
        !self.rx.is_empty()
    }

    /// Room to send without waiting.
    pub fn can_send(&self) -> bool {
        !self.tx_free.is_empty()
    }

    /// The length and source of the next UD message.
    pub fn peek_meta(&self) -> Option<(usize, SocketAddr)> {
        self.rx.front().map(|m| (m.len, m.src))
    }

    /// Copies the next message into `bufs` (in order); with `consume` the
    /// message is gone after (the rest of a long one is discarded, as
    /// UDP does). Returns its full length and source.
    pub fn read(&mut self, bufs: &mut [&mut [u8]], consume: bool) -> Option<(usize, SocketAddr)> {
        let m = self.rx.front()?;
        let (idx, len, src) = (m.idx, m.len, m.src);
        let mut off = 0;
        for b in bufs.iter_mut() {
            if off >= len {
                break;
            }
            let n = b.len().min(len - off);
            let _ = self.rx_mr.read_at(idx * BUF + HDR + off, &mut b[..n]);
            off += n;
        }
        if consume {
            self.rx.pop_front();
            self.post_recv(idx);
        }
        Some((len, src))
    }

    /// Attaches the QP to `group` (`join`) or detaches it, for the
    /// socket's `IP_ADD_MEMBERSHIP`/`IP_DROP_MEMBERSHIP` under
    /// `SOFTRDMA_SOCKETS_MCAST=ud`. UD only (RD is point to point); false
    /// if nothing changed.
    pub fn join(&mut self, group: std::net::Ipv4Addr, join: bool) -> bool {
        let DQp::Ud(q) = &self.qp else {
            return false;
        };
        let known = self.groups.contains(&group);
        if join && !known && q.attach_mcast(IpAddr::V4(group)).is_ok() {
            self.groups.push(group);
            return true;
        }
        if !join && known {
            let _ = q.detach_mcast(IpAddr::V4(group));
            self.groups.retain(|g| *g != group);
            return true;
        }
        false
    }

    /// Where to send toward `dest` over UD: an interposed socket's QP
    /// (asking the registry when the answer is not known or has grown
    /// old), or a multicast group (`SOFTRDMA_SOCKETS_MCAST=ud`, UD only).
    pub fn peer(&mut self, dest: SocketAddr) -> Option<Dest> {
        let dest = SocketAddr::new(dest.ip().to_canonical(), dest.port());
        if dest.is_ipv6() {
            return None;
        }
        if let IpAddr::V4(g) = dest.ip() {
            if g.is_multicast() {
                if !mcast_dest(dest) || self.transport != Transport::Ud {
                    return None;
                }
                let ah = match self.peers.get(&dest) {
                    Some((Some(ah), _)) => ah.clone(),
                    _ => {
                        let ah = self.qp.pd().create_mcast_ah(dest.ip()).ok()?;
                        self.peers.insert(dest, (Some(ah.clone()), Instant::now()));
                        ah
                    }
                };
                return Some(Dest {
                    ah,
                    mcast_port: Some(dest.port()),
                });
            }
        }
        self.unicast_peer(dest).map(|ah| Dest {
            ah,
            mcast_port: None,
        })
    }

    fn unicast_peer(&mut self, dest: SocketAddr) -> Option<AddressHandle> {
        if let Some((ah, at)) = self.peers.get(&dest) {
            if ah.is_some() || at.elapsed() < NEGATIVE_TTL {
                return ah.clone();
            }
        }
        let ours = self.transport;
        let ah = crate::registry::udp_peer(dest).and_then(|(port, qpn, t)| {
            // Both ends must run the same datagram transport.
            if t != ours {
                return None;
            }
            let ip = match dest.ip() {
                ip if ip.is_unspecified() => IpAddr::from([127, 0, 0, 1]),
                ip => ip,
            };
            self.qp.pd().create_ah_to(ip, port, qpn).ok()
        });
        self.peers.insert(dest, (ah.clone(), Instant::now()));
        ah
    }

    /// Sends one datagram of `data` (gathered) to `dest`. `Ok(false)`: no
    /// send slot free now.
    pub fn send(&mut self, dest: &Dest, data: &[&[u8]]) -> Result<bool, i32> {
        let len: usize = data.iter().map(|d| d.len()).sum();
        if len > MAX_DGRAM {
            return Err(libc::EMSGSIZE);
        }
        let Some(idx) = self.tx_free.pop() else {
            return Ok(false);
        };
        let mut h = [0u8; HDR];
        h[..2].copy_from_slice(b"SU");
        h[2..4].copy_from_slice(&self.port.to_be_bytes());
        if let Some(p) = dest.mcast_port {
            h[4..6].copy_from_slice(&p.to_be_bytes());
            h[6] = 1;
        }
        let _ = self.tx_mr.write_at(idx * BUF, &h);
        let mut off = HDR;
        for d in data {
            let _ = self.tx_mr.write_at(idx * BUF + off, d);
            off += d.len();
        }
        let sge = self.tx_mr.sge(idx * BUF, off as u32);
        let wr = SendWr {
            wr_id: idx as u64,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(sge.addr, sge.length, sge.lkey)),
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        };
        if self.qp.post_send(wr, &dest.ah) {
            self.msgs_out += 1;
            Ok(true)
        } else {
            self.tx_free.push(idx);
            Err(libc::EIO)
        }
    }
}
