//! Datagram queue pairs, unreliable (UD, `IBV_QPT_UD`) and reliable (RD),
//! over softrdma's iWARP-over-UDP framing (`docs/datagram.md`).
//!
//! * [`UdQueuePair`]: created with [`ProtectionDomain::create_ud_qp`]; no
//!   connection and no state machine: it can send and receive as soon as
//!   it exists. Every send names its destination with an
//!   [`AddressHandle`].
//! * [`RdQueuePair`]: created with [`ProtectionDomain::create_rd_qp`];
//!   the same, plus reliable, in-order, exactly-once delivery per peer QP
//!   and the one-sided operations (see [Reliable
//!   datagrams](#reliable-datagrams)).
//! * [`AddressHandle`] (`ibv_ah`): where a datagram goes, an IP address, a
//!   UDP port and a QP number ([`DgramAddr`]). Made from the protection
//!   domain ([`ProtectionDomain::create_ah`] and friends), from a received
//!   completion's source ([`AddressHandle::from_completion`], like
//!   `ibv_create_ah_from_wc`), or for a multicast group
//!   ([`ProtectionDomain::create_mcast_ah`]). Cheap to clone.
//!
//! # Addresses
//!
//! A UD QP lives on a UDP socket of its context, shared by up to 256 QPs;
//! its number is `(port << 8) | slot`, so `(IP, QPN)` alone locates it
//! ([`ProtectionDomain::create_ah_by_qpn`]). [`UdQpOptions::bind`] says
//! which address the socket is bound to. The default, `0.0.0.0:0`,
//! receives on every interface on a port the kernel picks, and a reply
//! built with [`AddressHandle::from_completion`] always goes back the way
//! the request came (the source the peer sees is the one the kernel chose
//! for its route). [`UdQueuePair::address`] is what a peer needs to reach
//! the QP: for a QP bound to `0.0.0.0` it names the host's address on its
//! default route (127.0.0.1 on a host without one); on a host with several
//! addresses, [`UdQueuePair::address_toward`] gives the one toward a
//! given peer, or bind a concrete address.
//!
//! # Semantics
//!
//! UD is unreliable: a message is delivered whole (into one posted
//! receive, up to [`UdQpOptions::max_msg`] octets, cut into datagrams that
//! fit the path MTU, never IP-fragmented) or not at all; nothing is
//! retransmitted or acknowledged, and a message that finds no receive
//! posted is dropped (counted in [`UdQpStats`]). A send completes when
//! its datagrams have left. UD takes Send (± immediate, ± solicited),
//! RDMA Write and RDMA Write-Record ([`SendOp::WriteRecord`], softrdma
//! only); Send with Invalidate, Write with immediate, Read and atomics are
//! refused at post time with [`UdPostError::Unsupported`]. Receive
//! completions carry the sender in [`WorkCompletion::src`]; identify
//! buffers by `wr_id` (messages that interleave complete in the order they
//! finish). With [`UdQpOptions::grh`] every receive buffer starts with a
//! 40-octet IBA GRH ([`GRH_LEN`]), as `ibv_ud_pingpong` expects.
//!
//! # Write-Record
//!
//! An RDMA Write-Record places data like an RDMA Write, segment by segment
//! as datagrams arrive, and logs it at the target: a
//! [`WcOpcode::RecvWriteRecord`] completion on the receive CQ (consuming
//! no receive) listing what was placed ([`WorkCompletion::record`]), and a
//! per-region validity map the target queries in terms of a
//! [`MemoryRegion`] and offsets ([`UdQueuePair::record_valid_ranges`],
//! [`UdQueuePair::record_is_valid`], [`UdQueuePair::record_clear`]). A
//! message missing datagrams is retired after a partial timeout
//! ([`UdQueuePair::set_record_partial_timeout`]) with a
//! [`WcStatus::RecordPartial`] completion, or silently
//! ([`UdQueuePair::set_record_partial_action`]); the valid map keeps what
//! arrived either way.
//!
//! # Multicast
//!
//! `ibv_attach_mcast`, IPv4 only: [`UdQueuePair::attach_mcast`] joins a
//! group on the interface of the QP's bound address, and a send to
//! [`ProtectionDomain::create_mcast_ah`]`(group)` reaches every QP attached
//! to it, in any process of the link using the same `SOFTRDMA_MCAST_PORT`
//! (see `softrdma_engine::dgram`). Groups are link-local (TTL 1).
//!
//! # Reliable datagrams
//!
//! An [`RdQueuePair`] talks to any number of peer RD QPs without
//! connections, like UD, with the same [`AddressHandle`]s and addresses
//! (UD and RD QPs even share UDP sockets), but every datagram carries a
//! small shim that gives each (local QP, peer QP) pair reliable,
//! in-order, exactly-once delivery: cumulative ACKs, NAKs, retransmission
//! with RFC 6298 timers (run by the context's progress thread, whether or
//! not anybody polls), go-back-N (`docs/datagram.md` §9, §11). On top
//! of it:
//!
//! * **Operations:** Send (± immediate, ± solicited), RDMA Write, RDMA
//!   Write-Record, RDMA Read and the 8-octet atomics (fetch-and-add,
//!   compare-and-swap). Send with Invalidate, Write with immediate and
//!   local invalidate are refused ([`RdPostError::Unsupported`]); a
//!   multicast address handle too (RD is point to point).
//! * **Completion:** a Send, Write or Write-Record completes when the peer
//!   has acknowledged all of it (it reached the peer's RDMA layer), a Read
//!   or atomic when its response is placed. Requests to one peer start
//!   and complete in posting order; requests to different peers are
//!   independent.
//! * **Errors at the target** fail only the request concerned: a remote
//!   access violation with `RemAccessErr` (and an
//!   [`crate::AsyncEvent::DgramRemoteAccessError`] at the target), a
//!   message too long for the receive with `RemInvReqErr`, a Send that
//!   finds no receive posted with `RnrRetryExcErr` (RD never retries
//!   that: keep receives posted).
//! * **Peer failure:** a peer that stops answering (the retry limit of
//!   [`RdQpOptions::reliability`], about 4 s by default) fails every
//!   request to it with `RetryExcErr` and raises
//!   [`crate::AsyncEvent::DgramPeerFailed`]; other peers carry on.
//! * **Write-Record** validity queries work as on UD
//!   ([`RdQueuePair::record_valid_ranges`] and friends).
//!
//! ```
//! use std::time::Duration;
//! use softrdma_verbs::{
//!     Access, Context, Payload, QpCaps, RdQpOptions, RecvWr, SendFlags, SendOp, SendWr, SgList,
//!     WcOpcode, WcStatus,
//! };
//! let opts = RdQpOptions { bind: "127.0.0.1:0".parse().unwrap(), ..RdQpOptions::default() };
//! let (actx, bctx) = (Context::open().unwrap(), Context::open().unwrap());
//! let (apd, bpd) = (actx.alloc_pd(), bctx.alloc_pd());
//! let (acq, bcq) = (actx.create_cq(16, None), bctx.create_cq(16, None));
//! let a = apd.create_rd_qp(&acq, &acq, QpCaps::default(), opts)?;
//! let b = bpd.create_rd_qp(&bcq, &bcq, QpCaps::default(), opts)?;
//! let amr = apd.register(4096, Access::LOCAL_WRITE)?;
//! let bmr = bpd.register(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
//! bmr.write_at(0, b"remote data")?;
//! let to_b = apd.create_ah(b.address())?;
//! let flags = SendFlags { signaled: true, ..SendFlags::default() };
//!
//! // A Send into a posted receive, then a Read of b's memory.
//! let sge = bmr.sge(1024, 1024);
//! b.post_recv(RecvWr { wr_id: 1, sgl: SgList::single(sge.addr, sge.length, sge.lkey) })?;
//! amr.write_at(0, b"hello")?;
//! let sge = amr.sge(0, 5);
//! let payload = Payload::Sgl(SgList::single(sge.addr, sge.length, sge.lkey));
//! let op = SendOp::Send { imm: None, invalidate: None };
//! a.post_send(SendWr { wr_id: 2, op, payload, flags }, &to_b)?;
//! let sge = amr.sge(100, 11);
//! let payload = Payload::Sgl(SgList::single(sge.addr, sge.length, sge.lkey));
//! let op = SendOp::Read { remote_addr: bmr.addr(), rkey: bmr.rkey() };
//! a.post_send(SendWr { wr_id: 3, op, payload, flags }, &to_b)?;
//!
//! let wait = Duration::from_secs(5);
//! let sent = acq.wait_one(wait).unwrap().wc;
//! let read = acq.wait_one(wait).unwrap().wc;
//! assert_eq!((sent.wr_id, sent.status), (2, WcStatus::Success));
//! assert_eq!((read.wr_id, read.opcode, read.byte_len), (3, WcOpcode::RdmaRead, 11));
//! let recv = bcq.wait_one(wait).unwrap().wc;
//! assert_eq!((recv.wr_id, recv.byte_len, recv.src), (1, 5, Some(a.address())));
//! let mut got = [0u8; 11];
//! amr.read_at(100, &mut got)?;
//! assert_eq!(&got, b"remote data");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Example: `ibv_ud_pingpong` in one process
//!
//! ```
//! use std::time::Duration;
//! use softrdma_verbs::{
//!     Access, AddressHandle, CompletionQueue, Context, MemoryRegion, Payload, ProtectionDomain,
//!     QpCaps, RecvWr, SendFlags, SendOp, SendWr, SgList, UdQpOptions, UdQueuePair, WcOpcode,
//!     WcStatus,
//! };
//! // One side: a context, a PD, a CQ, a UD QP on loopback, a buffer.
//! fn side() -> (ProtectionDomain, CompletionQueue, UdQueuePair, MemoryRegion) {
//!     let ctx = Context::open().unwrap();
//!     let pd = ctx.alloc_pd();
//!     let cq = ctx.create_cq(16, None);
//!     let opts = UdQpOptions { bind: "127.0.0.1:0".parse().unwrap(), ..UdQpOptions::default() };
//!     let qp = pd.create_ud_qp(&cq, &cq, QpCaps::default(), opts).unwrap();
//!     let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
//!     (pd, cq, qp, mr)
//! }
//! let (spd, scq, server, smr) = side();
//! let (cpd, ccq, client, cmr) = side();
//! let wait = Duration::from_secs(5);
//!
//! // The server posts a receive and tells the client its address.
//! let sge = smr.sge(0, 1024);
//! server.post_recv(RecvWr { wr_id: 1, sgl: SgList::single(sge.addr, sge.length, sge.lkey) })?;
//! let to_server = cpd.create_ah(server.address())?;
//!
//! // The client sends "ping" and waits for the reply.
//! cmr.write_at(0, b"ping")?;
//! let sge = cmr.sge(1024, 1024);
//! client.post_recv(RecvWr { wr_id: 2, sgl: SgList::single(sge.addr, sge.length, sge.lkey) })?;
//! let sge = cmr.sge(0, 4);
//! let send = |wr_id, sgl| SendWr {
//!     wr_id,
//!     op: SendOp::Send { imm: None, invalidate: None },
//!     payload: Payload::Sgl(sgl),
//!     flags: SendFlags { signaled: true, ..SendFlags::default() },
//! };
//! client.post_send(send(3, SgList::single(sge.addr, sge.length, sge.lkey)), &to_server)?;
//!
//! // The server answers whoever sent the request.
//! let req = scq.wait_one(wait).unwrap();
//! assert_eq!((req.wc.status, req.wc.opcode, req.wc.byte_len), (WcStatus::Success, WcOpcode::Recv, 4));
//! let back = AddressHandle::from_completion(&spd, &req.wc)?;
//! assert_eq!(back.dest(), client.address());
//! smr.write_at(0, b"pong")?;
//! let sge = smr.sge(0, 4);
//! server.post_send(send(4, SgList::single(sge.addr, sge.length, sge.lkey)), &back)?;
//!
//! let mut got = Vec::new();
//! while got.len() < 2 {
//!     got.push(ccq.wait_one(wait).unwrap().wc);
//! }
//! let reply = got.iter().find(|wc| wc.opcode == WcOpcode::Recv).unwrap();
//! let mut data = [0u8; 4];
//! cmr.read_at(1024, &mut data)?;
//! assert_eq!((reply.byte_len, &data), (4, b"pong"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

pub use softrdma_engine::dgram::{DgramError, SocketStats};
pub use softrdma_engine::MCAST_QPN;
pub use softrdma_proto::rd::{RdConfig, RdStats};
pub use softrdma_proto::record::{PartialAction, RecordConfig, RecordMode, RecordStats};
pub use softrdma_proto::ud::{UdStats, GRH_LEN, MAX_MSG_LIMIT, MAX_MTU, MIN_MTU};
pub use softrdma_proto::wr::{DgramAddr, WriteRecordInfo, MAX_RECORD_RANGES};

use softrdma_engine as engine;
use softrdma_engine::dgram::ProtoStats;
use softrdma_proto::rdqp::RdQpConfig;
use softrdma_proto::ud::{UdConfig, QPN_MASK};

use crate::{
    CompletionQueue, MemoryRegion, OutOfBounds, Payload, ProtectionDomain, QpCaps, RecvWr, SendOp,
    SendWr, WorkCompletion,
};
#[cfg(doc)]
use crate::{WcOpcode, WcStatus};

// ----------------------------------------------------------------------
// Address handles
// ----------------------------------------------------------------------

/// Where a datagram goes (`ibv_ah`): a peer QP's IP address, UDP port and
/// QP number, in a protection domain. A QP sends with address handles of
/// its own protection domain only. Cheap to clone.
///
/// ```
/// use softrdma_verbs::{AhError, Context, DgramAddr};
/// let pd = Context::open().unwrap().alloc_pd();
/// let ip = "192.0.2.7".parse().unwrap();
/// let ah = pd.create_ah_to(ip, 4791, (4791 << 8) | 3).unwrap();
/// assert_eq!(ah.dest(), DgramAddr { ip, port: 4791, qpn: (4791 << 8) | 3 });
/// // By the (port << 8) | slot rule the QPN implies the port.
/// assert_eq!(pd.create_ah_by_qpn(ip, (4791 << 8) | 3).unwrap().dest(), ah.dest());
/// assert_eq!(pd.create_ah_to(ip, 4791, 1 << 24).unwrap_err(), AhError::InvalidQpn(1 << 24));
/// ```
#[derive(Debug, Clone)]
pub struct AddressHandle {
    dest: DgramAddr,
    pd: ProtectionDomain,
}

/// Why an address handle could not be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AhError {
    /// The QP number does not fit 24 bits.
    InvalidQpn(u32),
    /// UDP port 0 is nobody's.
    InvalidPort,
    /// `0.0.0.0` or `::` is not a destination (a QP bound to it is reached
    /// at [`UdQueuePair::address`]).
    UnspecifiedAddress,
    /// The completion has no source: it is not a datagram QP's receive.
    NoSource,
    /// Not an IPv4 multicast group address.
    NotMulticast(IpAddr),
}

impl fmt::Display for AhError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AhError::InvalidQpn(q) => {
                write!(f, "address handle: QP number {q:#x} does not fit 24 bits")
            }
            AhError::InvalidPort => f.write_str("address handle: UDP port 0"),
            AhError::UnspecifiedAddress => f.write_str(
                "address handle: an unspecified IP address (0.0.0.0 or ::) is not a destination",
            ),
            AhError::NoSource => f.write_str(
                "address handle: the completion carries no source (not a datagram QP's receive)",
            ),
            AhError::NotMulticast(ip) => {
                write!(f, "address handle: {ip} is not an IPv4 multicast group")
            }
        }
    }
}

impl std::error::Error for AhError {}

impl AddressHandle {
    /// The sender of a received message, to reply to
    /// (`ibv_create_ah_from_wc`): any datagram QP completion with a source
    /// (receives, and Write-Record completions, whose source QPN follows
    /// the `(port << 8) | slot` rule).
    pub fn from_completion(
        pd: &ProtectionDomain,
        wc: &WorkCompletion,
    ) -> Result<AddressHandle, AhError> {
        pd.create_ah(wc.src.ok_or(AhError::NoSource)?)
    }

    /// The destination.
    pub fn dest(&self) -> DgramAddr {
        self.dest
    }

    /// The protection domain it was created in.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// True if it addresses a multicast group.
    pub fn is_multicast(&self) -> bool {
        self.dest.ip.to_canonical().is_multicast()
    }
}

impl ProtectionDomain {
    /// An address handle for `dest` (for instance a peer's
    /// [`UdQueuePair::address`], exchanged out of band).
    pub fn create_ah(&self, dest: DgramAddr) -> Result<AddressHandle, AhError> {
        if dest.qpn & !QPN_MASK != 0 {
            return Err(AhError::InvalidQpn(dest.qpn));
        }
        if dest.port == 0 {
            return Err(AhError::InvalidPort);
        }
        if dest.ip.is_unspecified() {
            return Err(AhError::UnspecifiedAddress);
        }
        Ok(AddressHandle {
            dest,
            pd: self.clone(),
        })
    }

    /// An address handle for QP `qpn` at UDP port `port` of `ip`.
    pub fn create_ah_to(&self, ip: IpAddr, port: u16, qpn: u32) -> Result<AddressHandle, AhError> {
        self.create_ah(DgramAddr { ip, port, qpn })
    }

    /// An address handle for softrdma QP `qpn` at `ip`, its UDP port taken
    /// from the number (`qpn >> 8`, the `(port << 8) | slot` rule every
    /// softrdma datagram QP follows): all `ibv_ud_pingpong` exchanges.
    pub fn create_ah_by_qpn(&self, ip: IpAddr, qpn: u32) -> Result<AddressHandle, AhError> {
        if qpn & !QPN_MASK != 0 {
            return Err(AhError::InvalidQpn(qpn));
        }
        self.create_ah(DgramAddr {
            ip,
            port: (qpn >> 8) as u16,
            qpn,
        })
    }

    /// An address handle reaching every QP attached to the IPv4 multicast
    /// `group` ([`UdQueuePair::attach_mcast`]) in contexts using the same
    /// `SOFTRDMA_MCAST_PORT` as this one.
    pub fn create_mcast_ah(&self, group: IpAddr) -> Result<AddressHandle, AhError> {
        match group.to_canonical() {
            IpAddr::V4(g) if g.is_multicast() => self.create_ah(self.ctx.mcast_dest(group)),
            _ => Err(AhError::NotMulticast(group)),
        }
    }

    /// A UD queue pair completing into `send_cq` and `recv_cq`
    /// (`ibv_create_qp` with `IBV_QPT_UD`), ready at once: no state
    /// transitions. `caps` gives the queue depths; Write-Record completions
    /// go to `recv_cq` and take no receive.
    pub fn create_ud_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        opts: UdQpOptions,
    ) -> Result<UdQueuePair, DgramError> {
        let grh = opts.grh.then(|| {
            let ip = opts.bind.ip();
            if ip.is_unspecified() {
                host_address(ip)
            } else {
                ip
            }
        });
        let proto = UdConfig {
            max_msg: opts.max_msg,
            reassembly_timeout: opts.reassembly_timeout,
            grh,
            record: opts.record,
            ..UdConfig::default()
        };
        let qp = self.ctx.create_ud_qp(
            self.pd,
            caps,
            send_cq.cq.clone(),
            recv_cq.cq.clone(),
            engine::UdOptions {
                proto,
                mtu: opts.mtu,
                bind: opts.bind,
                self_driven: opts.self_driven,
            },
        )?;
        Ok(UdQueuePair {
            inner: Arc::new(DgramInner {
                qp,
                pd: self.clone(),
                max_msg: opts.max_msg,
            }),
        })
    }

    fn same_as(&self, other: &ProtectionDomain) -> bool {
        self.pd == other.pd && std::ptr::eq(self.ctx.registry(), other.ctx.registry())
    }
}

/// The address this host uses on its default route (what `0.0.0.0`
/// means to a peer), or loopback when there is no route. Nothing is sent:
/// the kernel is only asked for the route to a documentation address.
fn host_address(family: IpAddr) -> IpAddr {
    let (probe, fallback): (IpAddr, IpAddr) = match family {
        IpAddr::V4(_) => (
            Ipv4Addr::new(203, 0, 113, 1).into(),
            Ipv4Addr::LOCALHOST.into(),
        ),
        IpAddr::V6(_) => (
            Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1).into(),
            Ipv6Addr::LOCALHOST.into(),
        ),
    };
    engine::ibconn::local_addr_toward(probe).unwrap_or(fallback)
}

// ----------------------------------------------------------------------
// UD queue pairs
// ----------------------------------------------------------------------

/// How a UD queue pair is created ([`ProtectionDomain::create_ud_qp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdQpOptions {
    /// The address the QP's UDP socket is bound to. Port 0 (the default)
    /// shares a socket of this context bound to the same IP with a free
    /// slot, or opens one on a port the kernel picks. Default `0.0.0.0:0`:
    /// every interface (see the [module documentation](self) on
    /// addresses).
    pub bind: SocketAddr,
    /// Path MTU the QP sizes its datagrams for ([`MIN_MTU`]..=[`MAX_MTU`]);
    /// `None` (the default): `SOFTRDMA_DGRAM_MTU` (1500). Loopback takes
    /// 65535; a datagram too large for the real path fails its send.
    pub mtu: Option<usize>,
    /// Largest message sent or received, up to [`MAX_MSG_LIMIT`] (default
    /// 64 KiB). Longer sends are refused ([`UdPostError::MessageTooLong`]).
    pub max_msg: usize,
    /// Put a 40-octet IBA GRH ([`GRH_LEN`]) in front of every received
    /// payload, its DGID this QP's address (default off).
    pub grh: bool,
    /// How long after its first datagram an incomplete message is kept
    /// before it is dropped whole (default 100 ms).
    pub reassembly_timeout: Duration,
    /// Write-Record logging at this QP as a target: CQ entries and/or the
    /// validity map, partial timeout and action, bounds (default: both
    /// logs, 100 ms, partials delivered).
    pub record: RecordConfig,
    /// Self-driven (default off): the QP gets a UDP socket of its own that
    /// the context's progress thread does not read. Its user polls a CQ of
    /// the QP (which reads the socket on the polling thread) and, with
    /// nothing to do, waits for [`UdQueuePair::socket_fd`] to become
    /// readable (and for the CQ's completion channel, armed, for what the
    /// progress thread still completes: its timers, a transmit resumed
    /// after the socket pushed back). A datagram then wakes the waiting
    /// thread directly instead of the progress thread first.
    /// `softrdma_engine::dgram` ("Self-driven datagram QPs") has the
    /// details.
    pub self_driven: bool,
}

impl Default for UdQpOptions {
    fn default() -> Self {
        let proto = UdConfig::default();
        UdQpOptions {
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            mtu: None,
            max_msg: proto.max_msg,
            grh: false,
            reassembly_timeout: proto.reassembly_timeout,
            record: proto.record,
            self_driven: false,
        }
    }
}

/// Why a work request was refused by a UD QP (nothing was queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdPostError {
    /// The operation does not exist on UD (`op` names it): UD takes Send
    /// (± immediate), RDMA Write and RDMA Write-Record.
    Unsupported {
        /// The refused operation, in words.
        op: &'static str,
    },
    /// The message is longer than the QP's [`UdQpOptions::max_msg`].
    MessageTooLong {
        /// Octets of the message.
        len: u64,
        /// The QP's limit.
        max: usize,
    },
    /// The queue is full.
    QueueFull,
    /// The address handle belongs to another protection domain.
    ForeignAddressHandle,
    /// An invalid parameter.
    Invalid,
}

impl fmt::Display for UdPostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UdPostError::Unsupported { op } => write!(
                f,
                "work request refused: {op} is not supported on UD queue pairs \
                 (UD takes Send, Send with immediate, RDMA Write and RDMA Write-Record)"
            ),
            UdPostError::MessageTooLong { len, max } => write!(
                f,
                "work request refused: a {len}-octet message is longer than the UD QP's \
                 maximum message ({max} octets)"
            ),
            UdPostError::QueueFull => f.write_str("work request refused: the queue is full"),
            UdPostError::ForeignAddressHandle => f.write_str(
                "work request refused: the address handle belongs to another protection domain",
            ),
            UdPostError::Invalid => f.write_str("work request refused: invalid parameter"),
        }
    }
}

impl std::error::Error for UdPostError {}

impl From<engine::QpError> for UdPostError {
    fn from(e: engine::QpError) -> Self {
        match e {
            engine::QpError::QueueFull => UdPostError::QueueFull,
            // Refused before the engine sees it; kept for completeness.
            engine::QpError::Unsupported => UdPostError::Unsupported {
                op: "the operation",
            },
            engine::QpError::NotConnected | engine::QpError::Invalid => UdPostError::Invalid,
        }
    }
}

/// The operations UD refuses, named for [`UdPostError::Unsupported`].
fn ud_unsupported(op: &SendOp) -> Option<&'static str> {
    match op {
        SendOp::Send {
            invalidate: Some(_),
            ..
        } => Some("Send with Invalidate"),
        SendOp::Send { .. } => None,
        SendOp::Write { imm: Some(_), .. } => Some("RDMA Write with immediate"),
        SendOp::Write { .. } | SendOp::WriteRecord { .. } => None,
        SendOp::Read { .. } => Some("RDMA Read"),
        SendOp::CompareSwap { .. } => Some("atomic compare-and-swap"),
        SendOp::FetchAdd { .. } => Some("atomic fetch-and-add"),
        SendOp::LocalInvalidate { .. } => Some("local invalidate"),
    }
}

/// Counters of a UD queue pair ([`UdQueuePair::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdQpStats {
    /// The UD protocol counters (datagrams, messages, drops by cause).
    pub ud: UdStats,
    /// Write-Record counters (this QP as a target).
    pub record: RecordStats,
    /// Async events not queued because too many were waiting.
    pub events_dropped: u64,
    /// The counters of the UDP socket this QP shares with others.
    pub socket: SocketStats,
    /// The counters of the context's multicast socket (zero before the
    /// context's first attach).
    pub mcast_socket: SocketStats,
}

/// An unreliable-datagram queue pair (`IBV_QPT_UD`); see the [module
/// documentation](self). Clones share the QP, which is destroyed with the
/// last of them (its multicast groups left, queued work discarded without
/// completions, as `ibv_destroy_qp`).
#[derive(Debug, Clone)]
pub struct UdQueuePair {
    inner: Arc<DgramInner>,
}

#[derive(Debug)]
struct DgramInner {
    qp: engine::DgramQpHandle,
    pd: ProtectionDomain,
    max_msg: usize,
}

impl UdQueuePair {
    /// The QP number: `(port << 8) | slot` of its UDP socket.
    pub fn qpn(&self) -> u32 {
        self.inner.qp.qpn()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The descriptor of the QP's UDP socket: for a self-driven QP
    /// ([`UdQpOptions::self_driven`]) what to wait on (readable) before
    /// polling its CQ. Other QPs share a socket the progress thread reads.
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        self.inner.qp.socket_fd()
    }

    /// What a peer needs to reach this QP: IP address, UDP port and QPN.
    /// For a QP bound to `0.0.0.0` (or `::`), the address this host uses on
    /// its default route, or loopback without one (see
    /// [`UdQueuePair::address_toward`]).
    pub fn address(&self) -> DgramAddr {
        address(&self.inner.qp)
    }

    /// What `peer` needs to reach this QP: for a QP bound to `0.0.0.0`,
    /// the address this host uses toward `peer` (the source `peer` sees in
    /// its completions); otherwise the bound address. Fails only if there
    /// is no route to `peer`.
    pub fn address_toward(&self, peer: IpAddr) -> io::Result<DgramAddr> {
        address_toward(&self.inner.qp, peer)
    }

    /// The address the QP's socket is bound to (its IP may be
    /// unspecified).
    pub fn local_addr(&self) -> SocketAddr {
        let a = self.inner.qp.local_addr();
        SocketAddr::new(a.ip, a.port)
    }

    /// Posts a send work request to `ah` (`ibv_post_send` with
    /// `wr.ud.ah`) and transmits what the socket takes at once. Send
    /// (± immediate, solicited), RDMA Write and RDMA Write-Record;
    /// anything else is [`UdPostError::Unsupported`]. The completion comes
    /// when the datagrams have left (no acknowledgement: UD).
    pub fn post_send(&self, wr: SendWr, ah: &AddressHandle) -> Result<(), UdPostError> {
        if let Some(op) = ud_unsupported(&wr.op) {
            return Err(UdPostError::Unsupported { op });
        }
        if !ah.pd.same_as(&self.inner.pd) {
            return Err(UdPostError::ForeignAddressHandle);
        }
        let len = wr.payload.len();
        if len > self.inner.max_msg as u64 {
            return Err(UdPostError::MessageTooLong {
                len,
                max: self.inner.max_msg,
            });
        }
        Ok(self.inner.qp.post_send(wr, ah.dest)?)
    }

    /// Posts a receive. A message longer than the buffer completes it
    /// with `LocLenErr`; with [`UdQpOptions::grh`], the first [`GRH_LEN`]
    /// octets of the buffer take the GRH and `byte_len` counts them.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), UdPostError> {
        Ok(self.inner.qp.post_recv(wr)?)
    }

    /// Attaches the QP to the IPv4 multicast `group` (`ibv_attach_mcast`),
    /// on the interface of its bound address: sends to
    /// [`ProtectionDomain::create_mcast_ah`]`(group)` reach it. Attaching
    /// twice is a no-op.
    pub fn attach_mcast(&self, group: IpAddr) -> Result<(), DgramError> {
        self.inner.qp.attach_mcast(group)
    }

    /// Detaches the QP from `group` (`ibv_detach_mcast`);
    /// [`DgramError::NotAttached`] if it was not attached.
    pub fn detach_mcast(&self, group: IpAddr) -> Result<(), DgramError> {
        self.inner.qp.detach_mcast(group)
    }

    /// Write-Record validity map: the ranges of `[offset, offset + len)`
    /// of `mr` that Write-Records to this QP placed and nobody cleared
    /// since, as offsets into `mr`, in order (adjacent ranges may be
    /// listed apart).
    ///
    /// ```
    /// # use softrdma_verbs::{Access, Context, QpCaps, UdQpOptions};
    /// # let ctx = Context::open().unwrap();
    /// # let pd = ctx.alloc_pd();
    /// # let cq = ctx.create_cq(16, None);
    /// # let qp = pd.create_ud_qp(&cq, &cq, QpCaps::default(), UdQpOptions::default()).unwrap();
    /// let mr = pd.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    /// // Nothing written yet.
    /// assert_eq!(qp.record_valid_ranges(&mr, 0, 4096), Ok(vec![]));
    /// assert_eq!(qp.record_is_valid(&mr, 0, 1), Ok(false));
    /// assert!(qp.record_valid_ranges(&mr, 4000, 100).is_err());
    /// ```
    pub fn record_valid_ranges(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
    ) -> Result<Vec<Range<usize>>, OutOfBounds> {
        record_valid_ranges(&self.inner.qp, mr, offset, len)
    }

    /// Whether every octet of `[offset, offset + len)` of `mr` is valid
    /// (placed by Write-Records and not cleared since); true for `len` 0.
    pub fn record_is_valid(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
    ) -> Result<bool, OutOfBounds> {
        record_is_valid(&self.inner.qp, mr, offset, len)
    }

    /// Clears validity of `[offset, offset + len)` of `mr` (the data was
    /// used; the next Write-Record there makes it valid again).
    pub fn record_clear(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
    ) -> Result<(), OutOfBounds> {
        record_clear(&self.inner.qp, mr, offset, len)
    }

    /// Forgets every Write-Record state of `mr` at this QP (validity map,
    /// messages in progress). Call before deregistering a region that
    /// Write-Records targeted, or the state stays until the QP goes.
    pub fn record_forget(&self, mr: &MemoryRegion) {
        self.inner.qp.forget_stag(mr.rkey())
    }

    /// How long a Write-Record message may place nothing new before it is
    /// retired as partial ([`RecordConfig::partial_timeout`]).
    pub fn set_record_partial_timeout(&self, timeout: Duration) {
        self.inner.qp.set_record_partial_timeout(timeout)
    }

    /// What a partial Write-Record message gives: a
    /// [`WcStatus::RecordPartial`] completion listing the placed ranges, or
    /// nothing ([`RecordConfig::partial_action`]).
    pub fn set_record_partial_action(&self, action: PartialAction) {
        self.inner.qp.set_record_partial_action(action)
    }

    /// The QP's counters.
    pub fn stats(&self) -> UdQpStats {
        let q = &self.inner.qp;
        let s = q.stats();
        let ProtoStats::Ud(ud) = s.proto else {
            unreachable!("a UD QP has UD counters")
        };
        UdQpStats {
            ud,
            record: s.record,
            events_dropped: s.events_dropped,
            socket: q.socket_stats(),
            mcast_socket: q.mcast_socket_stats(),
        }
    }

    /// The engine QP (for the C ABI and tools in this workspace).
    pub fn engine(&self) -> &engine::DgramQpHandle {
        &self.inner.qp
    }
}

// ----------------------------------------------------------------------
// What UD and RD queue pairs share
// ----------------------------------------------------------------------

fn address(qp: &engine::DgramQpHandle) -> DgramAddr {
    let a = qp.local_addr();
    if a.ip.is_unspecified() {
        DgramAddr {
            ip: host_address(a.ip),
            ..a
        }
    } else {
        a
    }
}

fn address_toward(qp: &engine::DgramQpHandle, peer: IpAddr) -> io::Result<DgramAddr> {
    let a = qp.local_addr();
    if !a.ip.is_unspecified() {
        return Ok(a);
    }
    Ok(DgramAddr {
        ip: engine::ibconn::local_addr_toward(peer)?,
        ..a
    })
}

fn record_valid_ranges(
    qp: &engine::DgramQpHandle,
    mr: &MemoryRegion,
    offset: usize,
    len: usize,
) -> Result<Vec<Range<usize>>, OutOfBounds> {
    mr.check(offset, len)?;
    let base = mr.addr();
    let end = base + (offset + len) as u64;
    let mut at = base + offset as u64;
    let mut buf = [(0u64, 0u64); 32];
    let mut out = Vec::new();
    loop {
        let (n, more) = qp.valid_ranges(mr.rkey(), at, end.saturating_sub(at), &mut buf);
        out.extend(
            buf[..n]
                .iter()
                .map(|&(a, b)| (a - base) as usize..(b - base) as usize),
        );
        match buf[..n].last() {
            Some(&(_, b)) if more && b < end => at = b,
            _ => return Ok(out),
        }
    }
}

fn record_is_valid(
    qp: &engine::DgramQpHandle,
    mr: &MemoryRegion,
    offset: usize,
    len: usize,
) -> Result<bool, OutOfBounds> {
    mr.check(offset, len)?;
    Ok(qp.is_valid(mr.rkey(), mr.addr() + offset as u64, len as u64))
}

fn record_clear(
    qp: &engine::DgramQpHandle,
    mr: &MemoryRegion,
    offset: usize,
    len: usize,
) -> Result<(), OutOfBounds> {
    mr.check(offset, len)?;
    qp.clear(mr.rkey(), mr.addr() + offset as u64, len as u64);
    Ok(())
}

// ----------------------------------------------------------------------
// RD queue pairs
// ----------------------------------------------------------------------

/// How an RD queue pair is created ([`ProtectionDomain::create_rd_qp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdQpOptions {
    /// The address the QP's UDP socket is bound to, as
    /// [`UdQpOptions::bind`] (UD and RD QPs share sockets). Default
    /// `0.0.0.0:0`.
    pub bind: SocketAddr,
    /// Path MTU the QP sizes its datagrams for ([`MIN_MTU`]..=[`MAX_MTU`]);
    /// `None` (the default): `SOFTRDMA_DGRAM_MTU` (1500). Every datagram
    /// carries the 26-octet RD shim, so payloads are that much smaller
    /// than on UD.
    pub mtu: Option<usize>,
    /// Largest message sent, received or read, up to [`MAX_MSG_LIMIT`]
    /// (default 1 GiB). Longer sends are refused
    /// ([`RdPostError::MessageTooLong`]); a longer message arriving
    /// completes its receive with `LocLenErr`.
    pub max_msg: usize,
    /// Reads and atomics outstanding per peer, at most (default 16); more
    /// wait in the send queue.
    pub ord: u16,
    /// Reads and atomics served per peer at once, at most (default 16); a
    /// peer asking for more gets its request failed with `RemOpErr`.
    pub ird: u16,
    /// Put a 40-octet IBA GRH ([`GRH_LEN`]) in front of every received
    /// payload, as [`UdQpOptions::grh`] (default off).
    pub grh: bool,
    /// Write-Record logging at this QP as a target (default: both logs,
    /// partials delivered; the partial timeout is the reliability layer's
    /// give-up span, since over RD a message stays partial only if its
    /// sender gave up).
    pub record: RecordConfig,
    /// The reliability layer: windows, ACK and retransmission timers, the
    /// retry limit after which a peer fails, idle expiry, bounds
    /// ([`RdConfig`]; its `local_qpn` and `epoch_seed` are set by the
    /// engine). Default [`RdConfig::default`]: RTO 2 ms–500 ms, 7 retries
    /// (a silent peer fails after about 4 s), windows of 64 datagrams.
    pub reliability: RdConfig,
    /// Self-driven (default off), as [`UdQpOptions::self_driven`]
    /// ([`RdQueuePair::socket_fd`]). The progress thread still runs the
    /// reliability timers, and reads the socket when the user has not
    /// polled for 10 ms (so peers are acknowledged).
    pub self_driven: bool,
}

impl Default for RdQpOptions {
    fn default() -> Self {
        let proto = RdQpConfig::default();
        RdQpOptions {
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            mtu: None,
            max_msg: proto.max_msg as usize,
            ord: proto.ord,
            ird: proto.ird,
            grh: false,
            record: proto.record,
            reliability: proto.rd,
            self_driven: false,
        }
    }
}

/// Why a work request was refused by an RD QP (nothing was queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdPostError {
    /// The operation does not exist on RD (`op` names it): Send with
    /// Invalidate, RDMA Write with immediate, local invalidate.
    Unsupported {
        /// The refused operation, in words.
        op: &'static str,
    },
    /// The message is longer than the QP's [`RdQpOptions::max_msg`].
    MessageTooLong {
        /// Octets of the message.
        len: u64,
        /// The QP's limit.
        max: usize,
    },
    /// The queue is full.
    QueueFull,
    /// The address handle belongs to another protection domain.
    ForeignAddressHandle,
    /// RD is point to point: a multicast address handle is refused.
    MulticastAddressHandle,
    /// An invalid parameter: a Read into inline data, or an atomic whose
    /// local buffer is not one 8-octet scatter list.
    Invalid,
}

impl fmt::Display for RdPostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdPostError::Unsupported { op } => write!(
                f,
                "work request refused: {op} is not supported on RD queue pairs"
            ),
            RdPostError::MessageTooLong { len, max } => write!(
                f,
                "work request refused: a {len}-octet message is longer than the RD QP's \
                 maximum message ({max} octets)"
            ),
            RdPostError::QueueFull => f.write_str("work request refused: the queue is full"),
            RdPostError::ForeignAddressHandle => f.write_str(
                "work request refused: the address handle belongs to another protection domain",
            ),
            RdPostError::MulticastAddressHandle => f.write_str(
                "work request refused: RD is point to point, not for a multicast address handle",
            ),
            RdPostError::Invalid => f.write_str(
                "work request refused: invalid parameter (a Read into inline data, or an \
                 atomic without an 8-octet local buffer)",
            ),
        }
    }
}

impl std::error::Error for RdPostError {}

impl From<engine::QpError> for RdPostError {
    fn from(e: engine::QpError) -> Self {
        match e {
            engine::QpError::QueueFull => RdPostError::QueueFull,
            // Refused before the engine sees it; kept for completeness.
            engine::QpError::Unsupported => RdPostError::Unsupported {
                op: "the operation",
            },
            engine::QpError::NotConnected | engine::QpError::Invalid => RdPostError::Invalid,
        }
    }
}

/// The operations RD refuses, named for [`RdPostError::Unsupported`].
fn rd_unsupported(op: &SendOp) -> Option<&'static str> {
    match op {
        SendOp::Send {
            invalidate: Some(_),
            ..
        } => Some("Send with Invalidate"),
        SendOp::Write { imm: Some(_), .. } => Some("RDMA Write with immediate"),
        SendOp::LocalInvalidate { .. } => Some("local invalidate"),
        _ => None,
    }
}

/// Counters of an RD queue pair ([`RdQueuePair::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdQpStats {
    /// The RD QP's counters (`softrdma_proto::rdqp::RdQpStats`: datagrams,
    /// messages, drops by cause, Terminates sent and received).
    pub rd: softrdma_proto::rdqp::RdQpStats,
    /// The reliability layer's counters: data sent and re-sent, timeouts,
    /// NAKs, duplicates, sessions, peers failed and expired.
    pub reliability: RdStats,
    /// Write-Record counters (this QP as a target).
    pub record: RecordStats,
    /// Async events not queued because too many were waiting.
    pub events_dropped: u64,
    /// The counters of the UDP socket this QP shares with others.
    pub socket: SocketStats,
}

/// A reliable-datagram queue pair; see the [module documentation](self).
/// Clones share the QP, which is destroyed with the last of them (queued
/// work discarded without completions, as `ibv_destroy_qp`).
#[derive(Debug, Clone)]
pub struct RdQueuePair {
    inner: Arc<DgramInner>,
}

impl ProtectionDomain {
    /// An RD queue pair completing into `send_cq` and `recv_cq`, ready at
    /// once (no connection, no state transitions). `caps` gives the queue
    /// depths: the send queue holds requests until they complete (a Send,
    /// Write or Write-Record when the peer acknowledged all of it), the
    /// receive queue posted receives. Write-Record completions go to
    /// `recv_cq` and take no receive.
    pub fn create_rd_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        opts: RdQpOptions,
    ) -> Result<RdQueuePair, DgramError> {
        let grh = opts.grh.then(|| {
            let ip = opts.bind.ip();
            if ip.is_unspecified() {
                host_address(ip)
            } else {
                ip
            }
        });
        let proto = RdQpConfig {
            max_msg: opts.max_msg as u64,
            ord: opts.ord,
            ird: opts.ird,
            grh,
            record: opts.record,
            rd: opts.reliability,
            ..RdQpConfig::default()
        };
        let qp = self.ctx.create_rd_qp(
            self.pd,
            caps,
            send_cq.cq.clone(),
            recv_cq.cq.clone(),
            engine::RdOptions {
                proto,
                mtu: opts.mtu,
                bind: opts.bind,
                self_driven: opts.self_driven,
            },
        )?;
        Ok(RdQueuePair {
            inner: Arc::new(DgramInner {
                qp,
                pd: self.clone(),
                max_msg: opts.max_msg,
            }),
        })
    }
}

impl RdQueuePair {
    /// The QP number: `(port << 8) | slot` of its UDP socket.
    pub fn qpn(&self) -> u32 {
        self.inner.qp.qpn()
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The descriptor of the QP's UDP socket, as
    /// [`UdQueuePair::socket_fd`] ([`RdQpOptions::self_driven`]).
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        self.inner.qp.socket_fd()
    }

    /// What a peer needs to reach this QP, as [`UdQueuePair::address`].
    pub fn address(&self) -> DgramAddr {
        address(&self.inner.qp)
    }

    /// What `peer` needs to reach this QP, as
    /// [`UdQueuePair::address_toward`].
    pub fn address_toward(&self, peer: IpAddr) -> io::Result<DgramAddr> {
        address_toward(&self.inner.qp, peer)
    }

    /// The address the QP's socket is bound to (its IP may be
    /// unspecified).
    pub fn local_addr(&self) -> SocketAddr {
        let a = self.inner.qp.local_addr();
        SocketAddr::new(a.ip, a.port)
    }

    /// Posts a send work request to `ah` and transmits what the socket
    /// takes at once: Send (± immediate, solicited), RDMA Write, RDMA
    /// Write-Record, RDMA Read (into an SGL) and the 8-octet atomics (the
    /// original value lands in an 8-octet local buffer). Anything else is
    /// [`RdPostError::Unsupported`]. The completion comes when the peer
    /// has acknowledged the whole message (Send, Write, Write-Record) or
    /// its response has been placed (Read, atomics); completions of
    /// requests to one peer come in posting order. Errors the target
    /// finds fail that request alone (`RemAccessErr`, `RemInvReqErr`,
    /// `RnrRetryExcErr` when no receive was posted: RD does not retry
    /// that); a peer that stops answering fails every request to it with
    /// `RetryExcErr` and raises [`crate::AsyncEvent::DgramPeerFailed`].
    pub fn post_send(&self, wr: SendWr, ah: &AddressHandle) -> Result<(), RdPostError> {
        if let Some(op) = rd_unsupported(&wr.op) {
            return Err(RdPostError::Unsupported { op });
        }
        if !ah.pd.same_as(&self.inner.pd) {
            return Err(RdPostError::ForeignAddressHandle);
        }
        if ah.is_multicast() {
            return Err(RdPostError::MulticastAddressHandle);
        }
        let len = wr.payload.len();
        if len > self.inner.max_msg as u64 {
            return Err(RdPostError::MessageTooLong {
                len,
                max: self.inner.max_msg,
            });
        }
        let inline = matches!(wr.payload, Payload::Inline(_));
        match wr.op {
            SendOp::Read { .. } if inline => return Err(RdPostError::Invalid),
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } if inline || len != 8 => {
                return Err(RdPostError::Invalid)
            }
            _ => {}
        }
        Ok(self.inner.qp.post_send(wr, ah.dest)?)
    }

    /// Posts a receive. A message longer than the buffer completes it
    /// with `LocLenErr` (and fails the sender's request); with
    /// [`RdQpOptions::grh`], the first [`GRH_LEN`] octets of the buffer
    /// take the GRH and `byte_len` counts them.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), RdPostError> {
        Ok(self.inner.qp.post_recv(wr)?)
    }

    /// Write-Record validity map, as [`UdQueuePair::record_valid_ranges`].
    pub fn record_valid_ranges(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
    ) -> Result<Vec<Range<usize>>, OutOfBounds> {
        record_valid_ranges(&self.inner.qp, mr, offset, len)
    }

    /// Whether every octet of `[offset, offset + len)` of `mr` is valid,
    /// as [`UdQueuePair::record_is_valid`].
    pub fn record_is_valid(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
    ) -> Result<bool, OutOfBounds> {
        record_is_valid(&self.inner.qp, mr, offset, len)
    }

    /// Clears validity of `[offset, offset + len)` of `mr`, as
    /// [`UdQueuePair::record_clear`].
    pub fn record_clear(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
    ) -> Result<(), OutOfBounds> {
        record_clear(&self.inner.qp, mr, offset, len)
    }

    /// Forgets every Write-Record state of `mr` at this QP, as
    /// [`UdQueuePair::record_forget`].
    pub fn record_forget(&self, mr: &MemoryRegion) {
        self.inner.qp.forget_stag(mr.rkey())
    }

    /// How long a Write-Record message may place nothing new before it is
    /// retired as partial ([`RecordConfig::partial_timeout`]).
    pub fn set_record_partial_timeout(&self, timeout: Duration) {
        self.inner.qp.set_record_partial_timeout(timeout)
    }

    /// What a partial Write-Record message gives
    /// ([`RecordConfig::partial_action`]).
    pub fn set_record_partial_action(&self, action: PartialAction) {
        self.inner.qp.set_record_partial_action(action)
    }

    /// The QP's counters.
    pub fn stats(&self) -> RdQpStats {
        let q = &self.inner.qp;
        let s = q.stats();
        let ProtoStats::Rd(c) = s.proto else {
            unreachable!("an RD QP has RD counters")
        };
        RdQpStats {
            rd: c.qp,
            reliability: c.rd,
            record: s.record,
            events_dropped: s.events_dropped,
            socket: q.socket_stats(),
        }
    }

    /// The engine QP (for the C ABI and tools in this workspace).
    pub fn engine(&self) -> &engine::DgramQpHandle {
        &self.inner.qp
    }
}
