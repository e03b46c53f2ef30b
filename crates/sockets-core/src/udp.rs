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
//! | 7 | kind: 0 a datagram; Write-Record (below): 1 a datagram asking for a ring, 4 a datagram asking for credit, 2 a grant, 3 credit |
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
//! Write-Record (`Transport::Wr`: `SOFTRDMA_TRANSPORT_WR`,
//! `SOFTRDMA_SOCKETS_UDP=wr`; both ends must have it, the registry entry
//! says `wr`). The QP is a UD QP; a datagram is one RDMA Write-Record of
//! an 8-octet header (`b"SW"`, the sender socket's port, the record's
//! sequence number, big endian) and the payload into a 64 KiB slot
//! ([`SLOT`]) of a ring the *receiver* granted this sender:
//!
//! * **Rings.** A socket has [`RINGS`] rings of [`RING_SLOTS`] slots, each
//!   its own memory region, handed out one per writer QP. A sender without
//!   a ring sends the datagram as a UD Send with kind 1 (at most every
//!   2 ms); the receiver takes a free ring for the sender's QP and answers
//!   with a grant (kind 2: rkey, address, slots, records consumed so far),
//!   or with a grant of zero slots when every ring is taken (the sender
//!   goes on with UD Sends and asks again a second later). A ring is the
//!   sender's alone, so two writers never share a slot; a Write-Record
//!   completion whose source is not the ring's owner, or whose STag is a
//!   region the ring no longer has, is ignored.
//! * **Credit.** The sender writes record `n` into slot `n % slots` only
//!   while `n` is below the receiver's last "consumed" count plus the
//!   slots; the receiver counts a record consumed when the application
//!   has read it (consumed = one past the highest sequence number read)
//!   and sends the count (kind 3) every half ring, and when asked. A
//!   sender out of credit sends the datagram as a UD Send instead, asking
//!   for credit (kind 4, at most every 2 ms): an unread slot is never
//!   written; what does not fit the UD buffers either is lost, as UDP's.
//! * **Records lost whole** (every segment of them) never complete, so
//!   their slots would never count as consumed: a later record read moves
//!   the count past them, and a sender out of credit whose ring has no
//!   record queued and none completed for 200 ms gets the ring re-keyed
//!   (a new region, a new grant): whatever was still in flight toward the
//!   old region cannot land in the new one, so re-keying loses at most
//!   records that were late, never overwrites one.
//! * **Delivery.** A record that completed whole is a datagram. One
//!   missing segments is retired by the QP after 100 ms without a new
//!   segment (or when the sender's next record to the ring starts) and
//!   delivered as the part placed contiguously from its start: fewer
//!   octets than its length, which `recvmsg` reports with `MSG_TRUNC`;
//!   one whose first segment (the header) is lost is not delivered.
//!   Records are read straight from the ring; a slot is only written
//!   again after the application read it.
//!
//! Receives are served from pre-posted buffers and copied out; a socket
//! reads whichever of its two sources (UD messages, kernel datagrams) has
//! something, UD first. Loss is UDP's: a message that finds no posted
//! buffer is dropped, as a datagram that finds a full socket buffer.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use softrdma_verbs::dgram::{PartialAction, RecordConfig, RecordMode};
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
/// Write-Record: octets of a slot of a receive ring (a header and the
/// largest datagram).
pub const SLOT: usize = 64 << 10;
/// Write-Record: slots of the ring one sender writes into.
pub const RING_SLOTS: u32 = 8;
/// Write-Record: rings of a socket (the senders it serves by
/// Write-Record; others send UD Sends).
pub const RINGS: usize = 8;
/// Header kinds (octet 7; 0: a datagram): a datagram whose sender asks
/// for a ring.
const K_HELLO: u8 = 1;
/// A ring granted (body: rkey, address, slots, consumed; 20 octets).
const K_GRANT: u8 = 2;
/// Credit: records of the ring consumed (body: rkey, consumed).
const K_CREDIT: u8 = 3;
/// A datagram whose sender is out of credit.
const K_ASK: u8 = 4;
/// Least time between two requests of a sender (hello or ask) to a peer.
const ASK_EVERY: Duration = Duration::from_millis(2);
/// How long a Write-Record missing segments waits before it is delivered
/// partly (the QP's record partial timeout).
const PARTIAL_TIMEOUT: Duration = Duration::from_millis(100);
/// A ring whose sender is out of credit with none of its records queued
/// and none completed for this long is re-keyed (its records in flight
/// are lost).
const STUCK: Duration = Duration::from_millis(200);

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
    /// A UD QP whose datagrams are RDMA Write-Records into the receiver's
    /// registered area (module docs, "Write-Record"): loss as UD's, and a
    /// datagram missing segments is delivered partly.
    Wr,
}

impl Transport {
    /// The registry's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Ud => "ud",
            Transport::Rd => "rd",
            Transport::Wr => "wr",
        }
    }

    /// Parses the registry's word.
    pub fn parse(s: &str) -> Option<Transport> {
        match s {
            "ud" => Some(Transport::Ud),
            "rd" => Some(Transport::Rd),
            "wr" => Some(Transport::Wr),
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
    /// A UD queue pair carrying RDMA Write-Records
    /// (`SOFTRDMA_TRANSPORT_WR`, 4).
    Wr,
}

impl SockTransport {
    /// The option's value.
    pub fn as_int(self) -> i32 {
        match self {
            SockTransport::Kernel => 0,
            SockTransport::Rc => 1,
            SockTransport::Ud => 2,
            SockTransport::Rd => 3,
            SockTransport::Wr => 4,
        }
    }

    /// From the option's value.
    pub fn from_int(v: i32) -> Option<SockTransport> {
        match v {
            0 => Some(SockTransport::Kernel),
            1 => Some(SockTransport::Rc),
            2 => Some(SockTransport::Ud),
            3 => Some(SockTransport::Rd),
            4 => Some(SockTransport::Wr),
            _ => None,
        }
    }
}

impl From<Transport> for SockTransport {
    fn from(t: Transport) -> SockTransport {
        match t {
            Transport::Ud => SockTransport::Ud,
            Transport::Rd => SockTransport::Rd,
            Transport::Wr => SockTransport::Wr,
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

/// Where a received datagram lies.
#[derive(Clone, Copy)]
enum Loc {
    /// A posted receive buffer (its index).
    Buf(usize),
    /// A ring slot: ring, octet offset of the slot in the ring's region,
    /// the record's sequence number.
    Slot(usize, usize, u32),
}

struct RxMsg {
    loc: Loc,
    /// The datagram's length.
    len: usize,
    /// Octets of it present (less than `len`: a partial Write-Record, the
    /// placed prefix).
    avail: usize,
    src: SocketAddr,
}

/// A receive ring one sender writes its Write-Records into.
struct Ring {
    mr: MemoryRegion,
    /// The sender's QP (IP, QPN): only its records are taken.
    owner: (IpAddr, u32),
    /// Its address handle (grants and credits go there).
    ah: AddressHandle,
    /// The sender socket's address (`recvfrom`'s).
    from: SocketAddr,
    /// One past the highest sequence number consumed.
    consumed: u32,
    /// `consumed` as last sent to the sender.
    credited: u32,
    /// Records of the ring queued for the application.
    queued: usize,
    /// The last record completion (or grant).
    last: Instant,
}

/// A ring a peer granted this socket.
struct Grant {
    rkey: u32,
    base: u64,
    slots: u32,
    /// The next record's sequence number.
    next: u32,
    /// Records may be written while `next` is below this.
    upto: u32,
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
    /// Write-Record: the receive rings granted to senders.
    rings: Vec<Option<Ring>>,
    /// Write-Record: rings peers granted, by the peer QP (UDP port, QPN).
    grants: HashMap<(u16, u32), Grant>,
    /// Write-Record: when a peer QP was last asked for a ring or credit.
    asked: HashMap<(u16, u32), Instant>,
    /// Messages sent and received (statistics).
    pub msgs_out: u64,
    /// As [`UdEnd::msgs_out`], inbound.
    pub msgs_in: u64,
    /// Datagrams sent as Write-Records.
    pub records_out: u64,
    /// Datagrams received as Write-Records (whole or partial).
    pub records_in: u64,
    /// Of [`UdEnd::records_in`], those delivered partly.
    pub records_partial: u64,
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
        let cq = dev.ctx().create_cq(
            2 * (RX_BUFS + TX_BUFS) + 2 * RINGS * RING_SLOTS as usize + 8,
            Some(&chan),
        );
        let bind = SocketAddr::new(local.ip(), 0);
        let caps = QpCaps {
            max_send_wr: TX_BUFS + 4,
            max_recv_wr: RX_BUFS,
        };
        let qp = match transport {
            Transport::Ud | Transport::Wr => dev
                .pd()
                .create_ud_qp(
                    &cq,
                    &cq,
                    caps,
                    UdQpOptions {
                        bind,
                        max_msg: BUF,
                        self_driven: true,
                        record: RecordConfig {
                            mode: RecordMode::Cq,
                            partial_timeout: PARTIAL_TIMEOUT,
                            partial_action: PartialAction::Deliver,
                            ..RecordConfig::default()
                        },
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
            rings: (0..RINGS).map(|_| None).collect(),
            grants: HashMap::new(),
            asked: HashMap::new(),
            msgs_out: 0,
            msgs_in: 0,
            records_out: 0,
            records_in: 0,
            records_partial: 0,
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
        // A poll reads the QP's socket only when the CQ's queue is empty.
        // A Write-Record sender that never reads still needs its peers'
        // grants and credits: it polls until one poll found the queue
        // empty (a few times at most).
        let mut empty_looks: usize = if self.transport == Transport::Wr {
            4
        } else {
            0
        };
        loop {
            let n = self.cq.poll(&mut out);
            for c in &out[..n] {
                self.complete(&c.wc);
            }
            changed |= n > 0;
            if n == 0 || (n < out.len() && empty_looks == 0) {
                break;
            }
            empty_looks = empty_looks.saturating_sub(usize::from(n < out.len()));
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
                        match h[7] {
                            K_GRANT | K_CREDIT => {
                                self.control(idx, len, s, h[7]);
                                self.post_recv(idx);
                                return;
                            }
                            k @ (K_HELLO | K_ASK) if self.transport == Transport::Wr => {
                                self.request(s, from, k)
                            }
                            _ => {}
                        }
                        self.msgs_in += 1;
                        self.rx.push_back(RxMsg {
                            loc: Loc::Buf(idx),
                            len: len - HDR,
                            avail: len - HDR,
                            src: from,
                        });
                    }
                    None if idx < RX_BUFS => self.post_recv(idx),
                    None => {}
                }
            }
            WcOpcode::RecvWriteRecord => self.record(wc),
            _ => {
                if wc.wr_id < TX_BUFS as u64 {
                    self.tx_free.push(wc.wr_id as usize);
                }
            }
        }
    }

    /// A grant or credit from a peer this socket writes to (`at`: its QP).
    fn control(&mut self, idx: usize, len: usize, at: DgramAddr, kind: u8) {
        let mut b = [0u8; 20];
        let need = if kind == K_GRANT { 20 } else { 8 };
        if len < HDR + need || self.rx_mr.read_at(idx * BUF + HDR, &mut b[..need]).is_err() {
            return;
        }
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let key = (at.port, at.qpn);
        let rkey = u32_at(0);
        if kind == K_CREDIT {
            if let Some(g) = self.grants.get_mut(&key).filter(|g| g.rkey == rkey) {
                let upto = u32_at(4).wrapping_add(g.slots);
                if upto.wrapping_sub(g.upto) as i32 > 0 {
                    g.upto = upto;
                }
            }
            return;
        }
        let base = u64::from_be_bytes(b[4..12].try_into().unwrap_or([0; 8]));
        let (slots, consumed) = (u32_at(12), u32_at(16));
        if slots == 0 {
            // Refused (the peer serves as many writers as it can): UD
            // Sends, asking again in a second.
            self.grants.remove(&key);
            self.asked
                .insert(key, Instant::now() + Duration::from_secs(1));
            return;
        }
        match self.grants.get_mut(&key) {
            Some(g) if g.rkey == rkey => {
                let upto = consumed.wrapping_add(slots);
                if upto.wrapping_sub(g.upto) as i32 > 0 {
                    g.upto = upto;
                }
            }
            _ => {
                self.grants.insert(
                    key,
                    Grant {
                        rkey,
                        base,
                        slots,
                        next: consumed,
                        upto: consumed.wrapping_add(slots),
                    },
                );
            }
        }
    }

    /// A writer's request (a hello: it wants a ring; an ask: it is out of
    /// credit), carried on a datagram from QP `at`, socket `from`.
    fn request(&mut self, at: DgramAddr, from: SocketAddr, kind: u8) {
        let owner = (at.ip.to_canonical(), at.qpn);
        let known = self
            .rings
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.owner == owner));
        let i = match known {
            Some(i) => i,
            None => {
                let Ok(ah) = self.qp.pd().create_ah(at) else {
                    return;
                };
                let Some(i) = self.rings.iter().position(Option::is_none) else {
                    // Every ring is taken: this writer sends UD Sends.
                    self.send_ctl(&ah, K_GRANT, &[0u8; 20]);
                    return;
                };
                let Ok(mr) = self.ring_region() else {
                    self.send_ctl(&ah, K_GRANT, &[0u8; 20]);
                    return;
                };
                self.rings[i] = Some(Ring {
                    mr,
                    owner,
                    ah,
                    from,
                    consumed: 0,
                    credited: 0,
                    queued: 0,
                    last: Instant::now(),
                });
                self.grant(i);
                return;
            }
        };
        let Some(r) = self.rings[i].as_ref() else {
            return;
        };
        if kind == K_HELLO {
            self.grant(i);
        } else if r.queued == 0 && r.last.elapsed() >= STUCK {
            // Out of credit with nothing queued and nothing completed for
            // a while: its records in flight were lost. A new region (new
            // rkey) for the ring, so nothing still in flight toward the
            // old one can land in it, and a new grant.
            let Ok(mr) = self.ring_region() else {
                return;
            };
            let Some(r) = self.rings[i].as_mut() else {
                return;
            };
            let old = std::mem::replace(&mut r.mr, mr);
            r.last = Instant::now();
            if let DQp::Ud(q) = &self.qp {
                q.record_forget(&old);
            }
            self.grant(i);
        } else {
            self.credit(i);
        }
    }

    fn ring_region(&self) -> Result<MemoryRegion, ()> {
        self.qp
            .pd()
            .register(
                RING_SLOTS as usize * SLOT,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .map_err(|_| ())
    }

    /// Sends ring `i`'s grant to its writer.
    fn grant(&mut self, i: usize) {
        let Some(r) = self.rings[i].as_mut() else {
            return;
        };
        let mut b = [0u8; 20];
        b[..4].copy_from_slice(&r.mr.rkey().to_be_bytes());
        b[4..12].copy_from_slice(&r.mr.addr().to_be_bytes());
        b[12..16].copy_from_slice(&RING_SLOTS.to_be_bytes());
        b[16..20].copy_from_slice(&r.consumed.to_be_bytes());
        r.credited = r.consumed;
        let ah = r.ah.clone();
        self.send_ctl(&ah, K_GRANT, &b);
    }

    /// Sends ring `i`'s credit (records consumed) to its writer.
    fn credit(&mut self, i: usize) {
        let Some(r) = self.rings[i].as_mut() else {
            return;
        };
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&r.mr.rkey().to_be_bytes());
        b[4..].copy_from_slice(&r.consumed.to_be_bytes());
        r.credited = r.consumed;
        let ah = r.ah.clone();
        self.send_ctl(&ah, K_CREDIT, &b);
    }

    /// One control message (no free send slot: not sent; the writer asks
    /// again).
    fn send_ctl(&mut self, ah: &AddressHandle, kind: u8, body: &[u8]) {
        let Some(idx) = self.tx_free.pop() else {
            return;
        };
        let mut h = [0u8; HDR];
        h[..2].copy_from_slice(b"SU");
        h[2..4].copy_from_slice(&self.port.to_be_bytes());
        h[7] = kind;
        let _ = self.tx_mr.write_at(idx * BUF, &h);
        let _ = self.tx_mr.write_at(idx * BUF + HDR, body);
        let sge = self.tx_mr.sge(idx * BUF, (HDR + body.len()) as u32);
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
        if !self.qp.post_send(wr, ah) {
            self.tx_free.push(idx);
        }
    }

    /// A Write-Record completion: a datagram in a ring slot, whole or (the
    /// record timed out missing segments) its placed prefix.
    fn record(&mut self, wc: &WorkCompletion) {
        let (Some(info), Some(src)) = (wc.record, wc.src) else {
            return;
        };
        let Some(i) = self
            .rings
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.mr.rkey() == info.stag))
        else {
            return; // a region since replaced
        };
        let Some(r) = self.rings[i].as_mut() else {
            return;
        };
        // Only the ring's writer.
        if (src.ip.to_canonical(), src.qpn) != r.owner {
            return;
        }
        let off = info.to.wrapping_sub(r.mr.addr()) as usize;
        if !off.is_multiple_of(SLOT) || off / SLOT >= RING_SLOTS as usize {
            return;
        }
        let prefix = match wc.status {
            WcStatus::Success => info.len as usize,
            WcStatus::RecordPartial => info.ranges[..info.n_ranges as usize]
                .iter()
                .find(|(o, _)| *o == 0)
                .map_or(0, |(_, l)| *l as usize),
            _ => 0,
        };
        let mut h = [0u8; HDR];
        if prefix < HDR || r.mr.read_at(off, &mut h).is_err() || h[..2] != *b"SW" {
            return; // its start is lost: nothing to deliver
        }
        let seq = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        r.queued += 1;
        r.last = Instant::now();
        let from = r.from;
        self.records_in += 1;
        if wc.status != WcStatus::Success {
            self.records_partial += 1;
        }
        self.msgs_in += 1;
        self.rx.push_back(RxMsg {
            loc: Loc::Slot(i, off, seq),
            len: info.len as usize - HDR,
            avail: prefix.min(info.len as usize) - HDR,
            src: from,
        });
    }

    /// The application is done with a datagram: its buffer is posted
    /// again, or its ring slot counts as consumed (credit goes back to the
    /// writer every half ring).
    fn release(&mut self, loc: Loc) {
        match loc {
            Loc::Buf(idx) => self.post_recv(idx),
            Loc::Slot(i, _, seq) => {
                let Some(r) = self.rings[i].as_mut() else {
                    return;
                };
                r.queued = r.queued.saturating_sub(1);
                let next = seq.wrapping_add(1);
                if next.wrapping_sub(r.consumed) as i32 > 0 {
                    r.consumed = next;
                }
                if r.consumed.wrapping_sub(r.credited) >= RING_SLOTS / 2 {
                    self.credit(i);
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
    /// UDP does). Returns the octets copied, its full length and its
    /// source. A partial Write-Record gives its placed prefix: fewer
    /// octets copied than its length even when `bufs` has room.
    pub fn read(
        &mut self,
        bufs: &mut [&mut [u8]],
        consume: bool,
    ) -> Option<(usize, usize, SocketAddr)> {
        let m = self.rx.front()?;
        let (loc, len, avail, src) = (m.loc, m.len, m.avail, m.src);
        let (mr, at) = match loc {
            Loc::Buf(idx) => (&self.rx_mr, idx * BUF + HDR),
            Loc::Slot(i, off, _) => (&self.rings[i].as_ref()?.mr, off + HDR),
        };
        let mut off = 0;
        for b in bufs.iter_mut() {
            if off >= avail {
                break;
            }
            let n = b.len().min(avail - off);
            let _ = mr.read_at(at + off, &mut b[..n]);
            off += n;
        }
        if consume {
            self.rx.pop_front();
            self.release(loc);
        }
        Some((off, len, src))
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
        if self.transport == Transport::Wr && dest.mcast_port.is_none() {
            let d = dest.ah.dest();
            let key = (d.port, d.qpn);
            if let Some(g) = self
                .grants
                .get_mut(&key)
                .filter(|g| g.upto.wrapping_sub(g.next) as i32 > 0)
            {
                // One Write-Record into the next slot of our ring.
                let seq = g.next;
                let remote_addr = g.base + u64::from(seq % g.slots) * SLOT as u64;
                let rkey = g.rkey;
                h[..2].copy_from_slice(b"SW");
                h[2..4].copy_from_slice(&self.port.to_be_bytes());
                h[4..8].copy_from_slice(&seq.to_be_bytes());
                let off = self.fill(idx, &h, data);
                let sge = self.tx_mr.sge(idx * BUF, off as u32);
                let wr = SendWr {
                    wr_id: idx as u64,
                    op: SendOp::WriteRecord { remote_addr, rkey },
                    payload: Payload::Sgl(SgList::single(sge.addr, sge.length, sge.lkey)),
                    flags: SendFlags {
                        signaled: true,
                        ..SendFlags::default()
                    },
                };
                if !self.qp.post_send(wr, &dest.ah) {
                    self.tx_free.push(idx);
                    return Err(libc::EIO);
                }
                if let Some(g) = self.grants.get_mut(&key) {
                    g.next = seq.wrapping_add(1);
                }
                self.msgs_out += 1;
                self.records_out += 1;
                return Ok(true);
            }
            // No ring yet, or no credit: a UD Send, asking (at most every
            // ASK_EVERY) for a ring or for credit.
            let now = Instant::now();
            if self.asked.get(&key).is_none_or(|t| now >= *t) {
                self.asked.insert(key, now + ASK_EVERY);
                h[7] = if self.grants.contains_key(&key) {
                    K_ASK
                } else {
                    K_HELLO
                };
            }
        }
        h[..2].copy_from_slice(b"SU");
        h[2..4].copy_from_slice(&self.port.to_be_bytes());
        if let Some(p) = dest.mcast_port {
            h[4..6].copy_from_slice(&p.to_be_bytes());
            h[6] = 1;
        }
        let off = self.fill(idx, &h, data);
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

    /// Writes the header and the gathered data into send slot `idx`;
    /// returns the octets written.
    fn fill(&self, idx: usize, h: &[u8; HDR], data: &[&[u8]]) -> usize {
        let _ = self.tx_mr.write_at(idx * BUF, h);
        let mut off = HDR;
        for d in data {
            let _ = self.tx_mr.write_at(idx * BUF + off, d);
            off += d.len();
        }
        off
    }

    /// Datagrams sent as Write-Records, received as Write-Records, and of
    /// those delivered partly.
    pub fn record_counts(&self) -> (u64, u64, u64) {
        (self.records_out, self.records_in, self.records_partial)
    }
}
