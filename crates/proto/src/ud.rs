//! The unreliable-datagram (UD) queue pair over UDP, sans-IO.
//!
//! [`UdQp`] speaks softrdma's iWARP-over-UDP framing (`docs/datagram.md`):
//! one DDP segment per datagram, CRC32C on every datagram, the Q bit and a
//! DQPN word on every segment it sends. It owns no socket and reads no
//! clock:
//!
//! * in: [`UdQp::post_send`] (with the destination of each work request;
//!   [`UdQp::post_send_and_transmit`] posts and transmits in one call and
//!   sends a lone small message without queueing it),
//!   [`UdQp::post_recv`], [`UdQp::handle_datagram`] (one UDP payload and its
//!   source), [`UdQp::handle_timeout`];
//! * out: [`UdQp::poll_transmit`] (hands datagrams to a [`DatagramSink`]:
//!   from five planned datagrams on, as many as fit framed whole — header,
//!   payload copied from registered memory, CRC — one after the other into
//!   a 64 KiB staging buffer, one buffer each; smaller batches and
//!   datagrams over 16 KiB gathered as header, payload slices of registered
//!   memory and CRC trailer; a lone small datagram copied whole;
//!   `docs/datagram.md` §12.5), [`UdQp::poll_completion`],
//!   [`UdQp::poll_event`], [`UdQp::poll_timeout`], [`UdQp::stats`].
//!
//! The engine demultiplexes several QPs sharing one UDP socket with
//! [`dqpn_of`], which peeks at the DQPN word without a full parse.
//!
//! # Semantics
//!
//! * **Operations.** Send and Send with immediate (solicited or not); RDMA
//!   Write; RDMA Write-Record (opcode 0xC). Send with Invalidate, Write with
//!   immediate, Read, atomics and local invalidate are refused at post time
//!   ([`PostError::Unsupported`]); the matching opcodes are dropped and
//!   counted on receive. A UD QP never sends a Terminate.
//! * **Send completion.** A send work request completes (if signaled, or
//!   with an error) once the sink has accepted every datagram of it. A
//!   local gather failure completes it with [`WcStatus::LocProtErr`], a
//!   socket error other than `WouldBlock` with [`WcStatus::GeneralErr`].
//! * **Segmentation.** Messages up to [`UdConfig::max_msg`] octets are cut
//!   into segments that fit the path MTU ([`UdConfig::mtu`], IPv4 or IPv6
//!   overhead by the destination address, `datagram::max_payload_with`).
//!   Every segment but the last of a message carries the same number of
//!   payload octets.
//! * **Reassembly.** Send segments are matched by (source, MSN) and
//!   scattered at their MO straight into the posted receive the message
//!   claimed when its first segment (whichever arrived first) came in. The
//!   receive completes only when every octet of the message has arrived.
//!   A message that is still incomplete [`UdConfig::reassembly_timeout`]
//!   after its first segment arrived, or that is evicted because
//!   [`UdConfig::max_reassembly`] messages are in reassembly (the oldest
//!   goes), is dropped and counted; the receive it claimed goes back to the
//!   receive queue *at its posting position* (ahead of every receive posted
//!   after it), so it is as if it had never been taken and the application
//!   never sees it complete (its buffer may hold octets of the dropped
//!   message: as in verbs, only the first `byte_len` octets of a completed
//!   receive are defined). Receive completions come in the order messages
//!   complete, which may differ from posting order when messages
//!   interleave: identify buffers by `wr_id`, as UD applications do.
//! * **Duplicates.** The last [`DEDUP_WINDOW`] MSNs of each source (up to
//!   [`UdConfig::max_sources`] sources, least recently used forgotten
//!   first) are remembered once their message is finished (delivered,
//!   failed or dropped): later segments of them are counted duplicates and
//!   ignored, so a message is delivered at most once and a dropped message
//!   is never half revived. A message more than [`DEDUP_WINDOW`] MSNs behind
//!   the newest of its source is taken as the start of a restarted sender.
//! * **Errors never stop the QP.** A bad CRC, a malformed or unsupported
//!   segment, a wrong DQPN, a message without a posted receive: dropped and
//!   counted ([`UdStats`]). A message longer than the receive buffer (after
//!   the GRH, if any) or than [`UdConfig::max_msg`] completes its receive
//!   with [`WcStatus::LocLenErr`] as soon as a segment shows it; a receive
//!   buffer the memory refuses completes with [`WcStatus::LocProtErr`]. An
//!   RDMA Write or Write-Record segment that fails the remote access checks
//!   ([`Memory::remote_write`]: STag, PD, rights, bounds) places nothing, is
//!   counted and reported as [`UdEvent::RemoteAccess`] with its source and
//!   T-MSN.
//! * **Write and Write-Record** segments are placed as they arrive, each at
//!   its own TO, so reordering does not matter. Write-Record segments are
//!   then reported to the [`Tracker`] (CQ entries and/or validity map, see
//!   [`crate::record`]); they consume no posted receive. Tracker completions
//!   are moved to this QP's completion queue (receive CQ) as they appear,
//!   so they keep their order with the Send completions.
//! * **GRH.** With [`UdConfig::grh`] set, the first [`GRH_LEN`] octets of
//!   every receive buffer get an IBA GRH ([`grh_header`]) and the payload
//!   lands after it; `byte_len` includes the 40 octets (what
//!   `ibv_ud_pingpong` and `udaddy` expect).
//! * **No allocation per message.** Queues, the reassembly table and the
//!   per-source duplicate memory are allocated when the QP is created;
//!   hash maps are created with twice the capacity they ever hold. (The
//!   Write-Record [`Tracker`] keeps its own bounded state.)
//!
//! # DATAGRAM.md-addendum
//!
//! The text below is meant for `docs/datagram.md` (a new section "UD
//! conventions"); it is what this module implements.
//!
//! ```text
//! ## UD conventions (unreliable datagram QPs)
//!
//! A UD QP sends every segment with Q = 1. QP numbers are 24 bits.
//!
//! * DQPN word. Bits 23..0 hold the destination QPN. Bits 31..24 hold the
//!   sender's "slot", the low octet of the sending QP's own QPN. Receivers
//!   compare only bits 23..0 with their QPN. (datagram.md §3.2 calls the
//!   whole word DQPN; for UD its top octet is the source slot.)
//! * Source QPN. Untagged segments (Send, Immediate Data) carry the sending
//!   QP's full QPN in RsvdULP (octets 2..5; top octet zero). Tagged
//!   segments (RDMA Write, Write-Record) have no spare field; their source
//!   QPN is (UDP source port << 8) | slot, the design brief's convention
//!   QPN = (port << 8) | slot. A QP whose number does not follow that
//!   convention is identified exactly only by its untagged segments.
//! * Sequence numbers. A UD QP keeps one MSN counter for QN 0 and one T-MSN
//!   counter for tagged messages, both starting at 1 and shared by all its
//!   destinations. A receiver sees increasing numbers (mod 2^32) with gaps
//!   and keys messages on (source, MSN) or (source, STag, T-MSN); it never
//!   relies on them being contiguous.
//! * Send with immediate. The message is its Send segments (L = 0, MO as
//!   usual; none if the payload is empty) followed by one Immediate Data
//!   segment (opcode 0x8, or 0x9 with solicited event) with the same MSN,
//!   MO = the payload length, L = 1 and the immediate in the low 32 bits of
//!   its 8-octet field (high 32 bits sent 0, ignored). The receiver
//!   completes the receive when the payload [0, MO) and the Immediate Data
//!   segment have arrived. An Immediate Data segment with L = 0 is dropped.
//! * Send segments of one message all use opcode Send (0x3), or Send with
//!   SE (0x5) when solicited; the L segment decides the solicited flag.
//!   Send with Invalidate is not used on UD and is dropped on receive.
//! * Segment sizes. Every segment but the last carries the same number of
//!   payload octets: PMTU - IP/UDP header - DDP/RDMAP header - 4.
//! * RDMA Write over UD: tagged, X = 1 (T-MSN, T-MO) and Q = 1; each segment
//!   is placed at its own TO as it arrives; no completion at the target.
//!   A receiver also accepts Write segments without X.
//! * Write with immediate, Read, atomics and Terminate are not used on UD;
//!   a UD receiver drops and counts them and never answers with a Terminate.
//! * Receive rules. A Send message is complete when the L segment has given
//!   its length (MO + payload of the L segment) and every octet below it has
//!   arrived; segments that contradict the message (ending past its known
//!   length, a second L segment with another end or kind, an L segment
//!   ending before octets already received) are dropped. A message still
//!   incomplete `reassembly_timeout` after its first segment is dropped as
//!   a whole; nothing of it is delivered.
//! * GRH option (C ABI). When a UD QP is set to deliver a GRH, the first 40
//!   octets of each receive buffer hold an IBA GRH: IPVer 6, TClass 0,
//!   FlowLabel 0, PayLen = message length (saturated at 65535), NxtHdr
//!   0x1B, HopLmt 64, SGID = the source IP address as a GID (IPv4-mapped
//!   ::ffff:a.b.c.d, or the IPv6 address), DGID = ours likewise. The
//!   payload follows at offset 40 and the completion's length counts the
//!   40 octets.
//! ```

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softrdma_wire::datagram::{self, CRC_LEN, IPV4_UDP_OVERHEAD, IPV6_UDP_OVERHEAD};
use softrdma_wire::ddp::{self as wddp, DdpHeader, TaggedExt};
use softrdma_wire::rdmap::{Opcode, RdmapBody, SegmentRepr};
use softrdma_wire::Error as WireError;

use crate::memory::{gather_into, payload_pieces, scatter, MemError, Memory};
use crate::rc::{CqKind, PostError};
use crate::record::{RecordConfig, RecordStats, Tracker};
use crate::wr::{
    DgramAddr, Payload, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion, MAX_SGE,
};

/// QP numbers are 24 bits; the DQPN word's top octet is the source slot.
pub const QPN_MASK: u32 = 0x00FF_FFFF;

/// The DQPN of a multicast datagram: every QP attached to the group takes
/// it (ibv_attach_mcast semantics). No QP may have this number.
pub const MCAST_QPN: u32 = QPN_MASK;
/// Length of the IBA Global Route Header placed in front of received
/// payloads when [`UdConfig::grh`] is set.
pub const GRH_LEN: usize = 40;
/// Smallest path MTU a UD QP accepts.
pub const MIN_MTU: usize = 128;
/// Largest path MTU a UD QP accepts (a UDP datagram's limit).
pub const MAX_MTU: usize = 65535;
/// Largest [`UdConfig::max_msg`].
pub const MAX_MSG_LIMIT: usize = 16 << 20;
/// Datagrams handed to [`DatagramSink::send_batch`] at once.
pub const TX_BATCH: usize = 32;
/// Most disjoint octet ranges held for one message in reassembly; a
/// segment that would need one more is dropped (counted in
/// [`UdStats::rx_fragment_overflow`]).
pub const MAX_REASM_FRAGMENTS: usize = 32;
/// Finished MSNs remembered per source to drop duplicates.
pub const DEDUP_WINDOW: u32 = 1024;

const WIN_WORDS: usize = DEDUP_WINDOW as usize / 64;
/// Largest UD header: untagged + DQPN + immediate data (30), rounded up.
const HDR_CAP: usize = 32;
/// IoSlices per datagram: header, up to MAX_SGE payload pieces, trailer.
const IOV_PER: usize = MAX_SGE + 2;
/// A lone datagram with at most this many payload octets is copied behind
/// its header and sent as one buffer: one CRC pass and one io-vector
/// instead of a three-piece gather (the 64 B latency case).
const SMALL_COPY: usize = 512;
/// The buffer a small datagram is framed in: header, payload, CRC.
const SMALL_FRAME: usize = HDR_CAP + SMALL_COPY + CRC_LEN;
/// Octets of the staging buffer in which a batch of datagrams is framed
/// contiguously (header, payload copied behind it, CRC), so that the
/// kernel takes each GSO run as one io-vector. A gather of three or more
/// io-vectors per datagram costs the kernel's copy more than the copy into
/// the staging buffer costs us (`docs/datagram.md` §12.5). Datagrams
/// larger than [`STAGE_MAX_DGRAM`] are gathered as before.
const STAGE_CAP: usize = 64 << 10;
/// Smallest batch framed in the staging buffer: below it (the latency
/// path) the datagrams are gathered, or copied whole when small.
pub(crate) const STAGE_MIN_BATCH: usize = 5;
/// Largest datagram staged (CRC included): at least four fit in the
/// staging buffer, and for larger ones the io-vectors around the payload
/// cost little.
const STAGE_MAX_DGRAM: usize = STAGE_CAP / 4;

/// Parameters of a UD queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdConfig {
    /// This QP's number (24 bits). Its low octet is the slot sent in every
    /// DQPN word; by the design brief's convention it is
    /// `(udp_port << 8) | slot`.
    pub qpn: u32,
    /// Path MTU in octets ([`MIN_MTU`]..=[`MAX_MTU`]); segments are sized so
    /// IP + UDP + header + payload + CRC fit it.
    pub mtu: usize,
    /// Largest message sent or received (at most [`MAX_MSG_LIMIT`]).
    pub max_msg: usize,
    /// Send queue depth.
    pub sq_depth: usize,
    /// Receive queue depth (posted plus claimed by messages in reassembly).
    pub rq_depth: usize,
    /// Messages in reassembly at once; one more evicts the oldest.
    pub max_reassembly: usize,
    /// How long after its first segment a message may stay incomplete.
    pub reassembly_timeout: Duration,
    /// Sources whose finished MSNs are remembered (duplicate suppression).
    pub max_sources: usize,
    /// Events held for [`UdQp::poll_event`]; more are counted as lost.
    pub event_depth: usize,
    /// `Some(our address)`: put a GRH in front of every received payload.
    pub grh: Option<IpAddr>,
    /// Accept segments without a DQPN word (this QP is its socket's
    /// default QP); a tagged source without one counts as slot 0.
    pub accept_without_dqpn: bool,
    /// Write-Record logging.
    pub record: RecordConfig,
}

impl Default for UdConfig {
    /// QPN 0, MTU 1500, 64 KiB messages, depth 128, 64 messages in
    /// reassembly for 100 ms, 256 sources, 64 events, no GRH.
    fn default() -> Self {
        UdConfig {
            qpn: 0,
            mtu: 1500,
            max_msg: 64 << 10,
            sq_depth: 128,
            rq_depth: 128,
            max_reassembly: 64,
            reassembly_timeout: Duration::from_millis(100),
            max_sources: 256,
            event_depth: 64,
            grh: None,
            accept_without_dqpn: false,
            record: RecordConfig::default(),
        }
    }
}

/// Why [`UdQp::new`] refused a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdConfigError {
    /// The QPN does not fit 24 bits.
    Qpn,
    /// The MTU is outside [`MIN_MTU`]..=[`MAX_MTU`].
    Mtu,
    /// `max_msg` is above [`MAX_MSG_LIMIT`].
    MaxMsg,
    /// A depth or table size is zero.
    Depth,
}

impl fmt::Display for UdConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UdConfigError::Qpn => "QP number does not fit 24 bits",
            UdConfigError::Mtu => "MTU out of range",
            UdConfigError::MaxMsg => "maximum message size above the limit",
            UdConfigError::Depth => "queue depth or table size is zero",
        })
    }
}

impl std::error::Error for UdConfigError {}

/// Counters of a UD QP. Datagram-level counters count datagrams; message
/// counters count each message at most once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct UdStats {
    /// Datagrams the sink accepted.
    pub tx_datagrams: u64,
    /// Send work requests completed successfully.
    pub tx_messages: u64,
    /// Send work requests that failed (gather or socket error).
    pub tx_errors: u64,
    /// Datagrams handed to [`UdQp::handle_datagram`].
    pub rx_datagrams: u64,
    /// Dropped: CRC32C mismatch.
    pub rx_bad_crc: u64,
    /// Dropped: unparsable, or breaking a UD rule (QN, RsvdULP, Immediate
    /// Data without L, offsets overflowing).
    pub rx_malformed: u64,
    /// Dropped: DQPN missing or not ours.
    pub rx_bad_dqpn: u64,
    /// Dropped: an opcode UD does not take (Read, atomics, Terminate, Send
    /// with Invalidate, unknown).
    pub rx_unsupported: u64,
    /// Segments ignored because their octets had arrived already or their
    /// message was finished.
    pub rx_duplicates: u64,
    /// Segments ignored because they contradict their message.
    pub rx_inconsistent: u64,
    /// Segments ignored because their message already had
    /// [`MAX_REASM_FRAGMENTS`] disjoint ranges.
    pub rx_fragment_overflow: u64,
    /// Messages delivered (receive completed successfully).
    pub rx_delivered: u64,
    /// Messages dropped: no receive posted when the first segment came.
    pub rx_no_recv: u64,
    /// Messages whose receive completed with `LocLenErr`.
    pub rx_len_err: u64,
    /// Messages whose receive completed with `LocProtErr`.
    pub rx_prot_err: u64,
    /// Messages dropped incomplete at the reassembly timeout.
    pub rx_timeouts: u64,
    /// Messages dropped incomplete to make room in the reassembly table.
    pub rx_evicted: u64,
    /// RDMA Write segments placed.
    pub rx_write_segments: u64,
    /// Write-Record segments placed (and reported to the tracker).
    pub rx_record_segments: u64,
    /// Write / Write-Record segments refused by the memory checks.
    pub rx_access_errors: u64,
    /// Events dropped because [`UdConfig::event_depth`] were waiting.
    pub events_lost: u64,
}

/// Asynchronous errors of a UD QP; none of them stops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdEvent {
    /// An RDMA Write or Write-Record segment failed the remote access
    /// checks; nothing of it was placed.
    RemoteAccess {
        /// Who sent it (QPN by the tagged-source convention).
        src: DgramAddr,
        /// [`Opcode::RdmaWrite`] or [`Opcode::WriteRecord`].
        opcode: Opcode,
        /// The segment's T-MSN (0 for a Write without X).
        msn: u32,
        /// The STag it named.
        stag: u32,
        /// The segment's TO.
        to: u64,
        /// Its payload length.
        len: u32,
        /// Why the memory refused it.
        error: MemError,
    },
}

/// One datagram of a batch: destination and the gathered pieces (header,
/// payload slices, CRC trailer).
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// Destination IP address and UDP port.
    pub dest: (IpAddr, u16),
    /// The UDP payload, in pieces.
    pub bufs: &'a [IoSlice<'a>],
}

/// Where [`UdQp::poll_transmit`] hands its datagrams (a UDP socket in the
/// engine, a vector in tests).
pub trait DatagramSink {
    /// Sends one datagram made of `bufs` to `dest`. `WouldBlock` means "not
    /// now": the datagram stays pending and is offered again later.
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()>;

    /// Sends datagrams in order, stopping at the first that is not
    /// accepted, like `sendmmsg`: `Ok(n)` with `n ≥ 1` when the first `n`
    /// were accepted, `Err(e)` when the first one failed with `e`. The
    /// default calls [`DatagramSink::send`] for each.
    fn send_batch(&mut self, batch: &[Datagram<'_>]) -> io::Result<usize> {
        for (i, d) in batch.iter().enumerate() {
            if let Err(e) = self.send(d.dest, d.bufs) {
                return if i == 0 { Err(e) } else { Ok(i) };
            }
        }
        Ok(batch.len())
    }
}

/// The DQPN a datagram is addressed to (its low 24 bits), read from the
/// control octet's layout without parsing or checking the CRC; `None` if
/// the datagram is too short, not DDP version 1, or carries no DQPN. For
/// demultiplexing QPs that share a socket; the QP still checks everything.
pub fn dqpn_of(datagram: &[u8]) -> Option<u32> {
    let &c = datagram.first()?;
    if c & wddp::DV_MASK != wddp::DDP_VERSION || c & wddp::FLAG_Q == 0 {
        return None;
    }
    let at = if c & wddp::FLAG_T != 0 {
        wddp::TAGGED_HEADER_LEN
            + if c & wddp::FLAG_X != 0 {
                wddp::EXT_LEN
            } else {
                0
            }
    } else {
        wddp::UNTAGGED_HEADER_LEN
    };
    if datagram.len() < at + wddp::DQPN_LEN + CRC_LEN {
        return None;
    }
    let w = datagram.get(at..at + wddp::DQPN_LEN)?;
    Some(u32::from_be_bytes([w[0], w[1], w[2], w[3]]) & QPN_MASK)
}

/// The GID of an address: IPv4 as IPv4-mapped IPv6 (`::ffff:a.b.c.d`),
/// IPv6 as it is.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip.to_canonical() {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The 40-octet IBA GRH put in front of a received payload: IPVer 6,
/// TClass 0, FlowLabel 0, PayLen `payload_len` (saturated), NxtHdr 0x1B,
/// HopLmt 64, SGID from `src`, DGID from `dst` ([`gid_of`]).
pub fn grh_header(src: IpAddr, dst: IpAddr, payload_len: u64) -> [u8; GRH_LEN] {
    let mut h = [0u8; GRH_LEN];
    h[0] = 0x60;
    let pl = u16::try_from(payload_len).unwrap_or(u16::MAX);
    h[4..6].copy_from_slice(&pl.to_be_bytes());
    h[6] = 0x1B;
    h[7] = 64;
    h[8..24].copy_from_slice(&gid_of(src));
    h[24..40].copy_from_slice(&gid_of(dst));
    h
}

// ----------------------------------------------------------------------
// Internal state
// ----------------------------------------------------------------------

/// A send work request in the send queue.
#[derive(Debug, Clone, Copy)]
/// `W`: the work request itself once queued, or a reference to it while
/// the transmit shortcut looks at it (no copy of its kilobyte or so).
struct SqEntry<W = SendWr> {
    wr: W,
    dest: DgramAddr,
    /// MSN (Send) or T-MSN (Write, Write-Record).
    msn: u32,
    /// Payload octets per data segment.
    room: u64,
    /// Data segments (the Immediate Data segment excluded).
    data_segs: u32,
    /// All segments.
    nsegs: u32,
    /// Segments the sink accepted.
    done: u32,
}

impl SqEntry<&SendWr> {
    /// The same entry owning its work request (`wr` is the one it refers
    /// to), to be queued.
    fn holding(self, wr: SendWr) -> SqEntry {
        SqEntry {
            wr,
            dest: self.dest,
            msn: self.msn,
            room: self.room,
            data_segs: self.data_segs,
            nsegs: self.nsegs,
            done: self.done,
        }
    }
}

/// What [`UdQp::frame_small`] made of a segment.
enum Framed {
    /// Framed: the datagram is the first this many octets of the buffer.
    Ready(usize),
    /// More payload than `SMALL_COPY`.
    TooBig,
    /// The memory refused part of the gather list.
    Unreadable,
}

#[derive(Debug, Clone, Copy, Default)]
struct Planned {
    idx: usize,
    seg: u32,
}

/// The receive queue: posted receives in posting order, with the count of
/// receives claimed by messages in reassembly.
#[derive(Debug)]
pub(crate) struct RecvFifo {
    wrs: VecDeque<(u64, RecvWr)>,
    depth: usize,
    claimed: usize,
    next_seq: u64,
}

impl RecvFifo {
    pub(crate) fn new(depth: usize) -> Self {
        RecvFifo {
            wrs: VecDeque::with_capacity(depth),
            depth,
            claimed: 0,
            next_seq: 0,
        }
    }

    pub(crate) fn post(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.wrs.len() + self.claimed >= self.depth {
            return Err(PostError::QueueFull);
        }
        self.wrs.push_back((self.next_seq, wr));
        self.next_seq += 1;
        Ok(())
    }

    #[inline]
    pub(crate) fn take(&mut self) -> Option<(u64, RecvWr)> {
        let x = self.wrs.pop_front()?;
        self.claimed += 1;
        Some(x)
    }

    /// A claimed receive returns to its posting position.
    pub(crate) fn give_back(&mut self, seq: u64, wr: RecvWr) {
        self.claimed = self.claimed.saturating_sub(1);
        let at = self.wrs.partition_point(|&(s, _)| s < seq);
        self.wrs.insert(at, (seq, wr));
    }

    /// Receives posted and not claimed.
    pub(crate) fn len(&self) -> usize {
        self.wrs.len()
    }

    /// A claimed receive completed.
    pub(crate) fn consumed(&mut self) {
        self.claimed = self.claimed.saturating_sub(1);
    }
}

/// Disjoint, non-adjacent `[start, end)` ranges received of one message.
#[derive(Debug, Clone, Copy)]
struct Frags {
    iv: [(u32, u32); MAX_REASM_FRAGMENTS],
    n: usize,
}

impl Frags {
    const EMPTY: Frags = Frags {
        iv: [(0, 0); MAX_REASM_FRAGMENTS],
        n: 0,
    };

    fn as_slice(&self) -> &[(u32, u32)] {
        &self.iv[..self.n]
    }

    fn end(&self) -> u32 {
        self.as_slice().last().map_or(0, |r| r.1)
    }

    /// Every octet of `[s, e)` is present (true when empty).
    fn covers(&self, s: u32, e: u32) -> bool {
        s >= e || self.as_slice().iter().any(|&(a, b)| a <= s && e <= b)
    }

    /// Exactly `[0, total)` is present.
    fn complete(&self, total: u32) -> bool {
        match self.as_slice() {
            [] => total == 0,
            [r] => *r == (0, total),
            _ => false,
        }
    }

    /// The first range touching or overlapping `[s, e]`, and the first
    /// range after it that does not.
    fn span(&self, s: u32, e: u32) -> (usize, usize) {
        let n = self.n;
        let i = self.iv[..n].iter().position(|r| r.1 >= s).unwrap_or(n);
        let j = i + self.iv[i..n].iter().position(|r| r.0 > e).unwrap_or(n - i);
        (i, j)
    }

    /// Whether `[s, e)` can be added without exceeding the bound.
    fn can_add(&self, s: u32, e: u32) -> bool {
        if s >= e {
            return true;
        }
        let (i, j) = self.span(s, e);
        i != j || self.n < MAX_REASM_FRAGMENTS
    }

    /// Adds `[s, e)`; the caller checked [`Frags::can_add`].
    fn add(&mut self, s: u32, e: u32) {
        if s >= e {
            return;
        }
        let n = self.n;
        let (i, j) = self.span(s, e);
        if i == j {
            if n == MAX_REASM_FRAGMENTS {
                return;
            }
            self.iv.copy_within(i..n, i + 1);
            self.iv[i] = (s, e);
            self.n += 1;
            return;
        }
        self.iv[i] = (s.min(self.iv[i].0), e.max(self.iv[j - 1].1));
        self.iv.copy_within(j..n, i + 1);
        self.n -= j - i - 1;
    }
}

/// A Send message in reassembly.
#[derive(Debug, Clone, Copy)]
struct Reasm {
    src: DgramAddr,
    msn: u32,
    /// Posting sequence of the claimed receive.
    seq: u64,
    wr: RecvWr,
    /// Octets of payload the receive takes (after the GRH, within max_msg).
    cap: u64,
    /// `None`: never times out (the timeout overflowed `Instant`).
    deadline: Option<Instant>,
    /// Known once the L segment arrived.
    total: Option<u32>,
    /// The L segment was Immediate Data.
    last_imm: bool,
    imm: Option<u32>,
    solicited: bool,
    frags: Frags,
}

/// One received Send-family segment, decoded.
#[derive(Debug, Clone, Copy)]
struct RxSeg {
    mo: u32,
    end: u32,
    last: bool,
    imm_seg: bool,
    imm: Option<u32>,
    solicited: bool,
}

/// Finished MSNs of one source: a ring of [`DEDUP_WINDOW`] bits below and
/// including `highest`.
#[derive(Debug, Clone, Copy)]
struct SrcWin {
    addr: DgramAddr,
    highest: u32,
    bits: [u64; WIN_WORDS],
    used: u64,
}

impl SrcWin {
    fn bit(msn: u32) -> (usize, u64) {
        let b = (msn % DEDUP_WINDOW) as usize;
        (b / 64, 1u64 << (b % 64))
    }

    fn is_done(&self, msn: u32) -> bool {
        if self.highest.wrapping_sub(msn) >= DEDUP_WINDOW {
            // Newer than anything seen, or so old it means a restart.
            return false;
        }
        let (w, m) = Self::bit(msn);
        self.bits[w] & m != 0
    }

    fn mark(&mut self, msn: u32) {
        let behind = self.highest.wrapping_sub(msn);
        if behind >= DEDUP_WINDOW {
            let ahead = msn.wrapping_sub(self.highest);
            if ahead < DEDUP_WINDOW {
                // Slide forward: forget the bits the window leaves.
                for k in 1..=ahead {
                    let (w, m) = Self::bit(self.highest.wrapping_add(k));
                    self.bits[w] &= !m;
                }
            } else {
                // Far ahead, or far behind (a restarted sender).
                self.bits = [0; WIN_WORDS];
            }
            self.highest = msn;
        }
        let (w, m) = Self::bit(msn);
        self.bits[w] |= m;
    }
}

/// An unreliable-datagram queue pair's protocol engine. See the module
/// documentation.
#[derive(Debug)]
pub struct UdQp {
    cfg: UdConfig,
    // --- transmit ---
    sq: VecDeque<SqEntry>,
    tx_msn: u32,
    tx_tmsn: u32,
    // --- receive ---
    rq: RecvFifo,
    slots: Vec<Option<Reasm>>,
    free_slots: Vec<usize>,
    slot_map: HashMap<(DgramAddr, u32), usize>,
    sources: Vec<SrcWin>,
    source_map: HashMap<DgramAddr, usize>,
    /// Index in `sources` of the source marked last (a hint: checked
    /// against the address before use).
    last_source: usize,
    use_clock: u64,
    tracker: Tracker,
    /// [`STAGE_CAP`] octets from the first batch of datagrams staged on
    /// (kept for the next ones); empty on a QP that never sent one.
    stage: Vec<u8>,
    /// The buffer a small datagram is framed in by
    /// [`UdQp::post_send_and_transmit`] ([`SMALL_FRAME`] octets, kept
    /// instead of a zeroed stack array per send: every octet of a framed
    /// datagram is written before it is read).
    small: Vec<u8>,
    // --- outputs ---
    completions: VecDeque<(CqKind, WorkCompletion)>,
    events: VecDeque<UdEvent>,
    stats: UdStats,
}

impl UdQp {
    /// A UD QP ready to send and receive, with every queue allocated.
    pub fn new(cfg: UdConfig) -> Result<Self, UdConfigError> {
        if cfg.qpn & !QPN_MASK != 0 || cfg.qpn == MCAST_QPN {
            return Err(UdConfigError::Qpn);
        }
        if !(MIN_MTU..=MAX_MTU).contains(&cfg.mtu) {
            return Err(UdConfigError::Mtu);
        }
        if cfg.max_msg > MAX_MSG_LIMIT {
            return Err(UdConfigError::MaxMsg);
        }
        if cfg.sq_depth == 0 || cfg.rq_depth == 0 || cfg.max_reassembly == 0 || cfg.max_sources == 0
        {
            return Err(UdConfigError::Depth);
        }
        Ok(UdQp {
            cfg,
            sq: VecDeque::with_capacity(cfg.sq_depth),
            tx_msn: 1,
            tx_tmsn: 1,
            rq: RecvFifo::new(cfg.rq_depth),
            slots: vec![None; cfg.max_reassembly],
            free_slots: (0..cfg.max_reassembly).rev().collect(),
            slot_map: HashMap::with_capacity(2 * cfg.max_reassembly),
            sources: Vec::with_capacity(cfg.max_sources),
            source_map: HashMap::with_capacity(2 * cfg.max_sources),
            last_source: 0,
            use_clock: 0,
            tracker: Tracker::new(cfg.record),
            stage: Vec::new(),
            small: vec![0; SMALL_FRAME],
            completions: VecDeque::with_capacity(cfg.sq_depth + cfg.rq_depth + 64),
            events: VecDeque::with_capacity(cfg.event_depth),
            stats: UdStats::default(),
        })
    }

    /// The parameters.
    pub fn config(&self) -> &UdConfig {
        &self.cfg
    }

    /// This QP's number.
    pub fn qpn(&self) -> u32 {
        self.cfg.qpn
    }

    /// The counters.
    pub fn stats(&self) -> UdStats {
        self.stats
    }

    /// The Write-Record tracker: validity map queries
    /// ([`Tracker::valid_ranges`], [`Tracker::is_valid`]),
    /// [`Tracker::clear`], [`Tracker::forget_stag`], its settings and
    /// counters. Its completions reach [`UdQp::poll_completion`] on their
    /// own; do not poll it directly.
    pub fn record_tracker(&mut self) -> &mut Tracker {
        &mut self.tracker
    }

    /// The Write-Record counters.
    pub fn record_stats(&self) -> RecordStats {
        self.tracker.stats()
    }

    /// Receives posted and not claimed by a message.
    pub fn recv_posted(&self) -> usize {
        self.rq.wrs.len()
    }

    /// Messages in reassembly.
    pub fn in_reassembly(&self) -> usize {
        self.slot_map.len()
    }

    /// Queues a send work request for `dest` (IP, UDP port and QPN of the
    /// target QP). Refused, with nothing queued: [`PostError::QueueFull`];
    /// [`PostError::Unsupported`] for Send with Invalidate, Write with
    /// immediate, Read, atomics and local invalidate;
    /// [`PostError::Invalid`] for a payload above `max_msg` or a QPN above
    /// 24 bits.
    pub fn post_send(&mut self, wr: SendWr, dest: DgramAddr) -> Result<(), PostError> {
        let e = self.admit(&wr, dest)?.holding(wr);
        self.sq.push_back(e);
        Ok(())
    }

    /// [`UdQp::post_send`] followed by [`UdQp::poll_transmit`], with the
    /// same effect on the queue, the sink, the counters and the
    /// completions, and the same returns (the outer error: the post was
    /// refused and nothing happened; the inner: what `poll_transmit`
    /// would return).
    ///
    /// The latency case takes a shortcut: a work request whose message is
    /// one datagram with at most `SMALL_COPY` (512) payload octets, posted
    /// to an empty send queue, is framed straight from the request (header,
    /// payload copied behind it, CRC) and offered to the sink as one
    /// buffer; once the sink takes it the request is done (a signaled one
    /// completes at once) and never enters the queue. If the sink refuses
    /// it, or the payload cannot be read, the request is queued and
    /// handled exactly as `poll_transmit` handles a queued one (stays
    /// pending on `WouldBlock`, fails with `GeneralErr` on another socket
    /// error, with `LocProtErr` on a refused gather list).
    pub fn post_send_and_transmit<M: Memory, S: DatagramSink>(
        &mut self,
        wr: SendWr,
        dest: DgramAddr,
        mem: &M,
        sink: &mut S,
    ) -> Result<io::Result<usize>, PostError> {
        let e = self.admit(&wr, dest)?;
        if self.sq.is_empty() && e.nsegs == 1 {
            let mut buf = std::mem::take(&mut self.small);
            let framed = match buf.as_mut_slice().try_into() {
                Ok(frame) => self.frame_small(&e, 0, mem, frame),
                Err(_) => Framed::TooBig, // not SMALL_FRAME octets: never
            };
            let sent = match framed {
                Framed::Ready(n) => {
                    Some(sink.send((e.dest.ip, e.dest.port), &[IoSlice::new(&buf[..n])]))
                }
                Framed::TooBig | Framed::Unreadable => None,
            };
            self.small = buf;
            if let Some(sent) = sent {
                let Err(err) = sent else {
                    // What `commit` does for a request whose last datagram went.
                    self.stats.tx_datagrams += 1;
                    self.retire(&e);
                    return Ok(Ok(1));
                };
                // Refused: queued, and what `poll_transmit` does with it.
                self.sq.push_back(e.holding(wr));
                return Ok(match err.kind() {
                    io::ErrorKind::WouldBlock => Ok(0),
                    io::ErrorKind::Interrupted => self.poll_transmit(mem, sink),
                    _ => {
                        self.fail_head(WcStatus::GeneralErr);
                        Err(err)
                    }
                });
            }
        }
        self.sq.push_back(e.holding(wr));
        Ok(self.poll_transmit(mem, sink))
    }

    /// Checks a send work request and numbers it (MSN or T-MSN): the
    /// queue entry [`UdQp::post_send`] queues.
    fn admit<'w>(
        &mut self,
        wr: &'w SendWr,
        dest: DgramAddr,
    ) -> Result<SqEntry<&'w SendWr>, PostError> {
        if self.sq.len() >= self.cfg.sq_depth {
            return Err(PostError::QueueFull);
        }
        let (template, imm) = match wr.op {
            SendOp::Send {
                invalidate: Some(_),
                ..
            } => return Err(PostError::Unsupported),
            SendOp::Send { imm, .. } => (
                SegmentRepr::untagged(Opcode::Send, 0, 0, 0, true, RdmapBody::None),
                imm,
            ),
            SendOp::Write { imm: Some(_), .. } => return Err(PostError::Unsupported),
            SendOp::Write { .. } | SendOp::WriteRecord { .. } => (
                SegmentRepr {
                    ddp: DdpHeader::Tagged {
                        stag: 0,
                        to: 0,
                        ext: Some(TaggedExt { msn: 0, mo: 0 }),
                    },
                    ..SegmentRepr::tagged(Opcode::RdmaWrite, 0, 0, true)
                },
                None,
            ),
            _ => return Err(PostError::Unsupported),
        };
        if dest.qpn & !QPN_MASK != 0 {
            return Err(PostError::Invalid);
        }
        let len = wr.payload.len();
        if len > self.cfg.max_msg as u64 {
            return Err(PostError::Invalid);
        }
        let template = SegmentRepr {
            dqpn: Some(0),
            ..template
        };
        let overhead = match dest.ip.to_canonical() {
            IpAddr::V4(_) => IPV4_UDP_OVERHEAD,
            IpAddr::V6(_) => IPV6_UDP_OVERHEAD,
        };
        let room = datagram::max_payload_with(self.cfg.mtu, overhead, &template).max(1) as u64;
        let data_segs = if len == 0 {
            u32::from(imm.is_none())
        } else {
            len.div_ceil(room) as u32
        };
        let tagged = template.ddp.is_tagged();
        let counter = if tagged {
            &mut self.tx_tmsn
        } else {
            &mut self.tx_msn
        };
        let msn = *counter;
        *counter = msn.wrapping_add(1);
        Ok(SqEntry {
            wr,
            dest,
            msn,
            room,
            data_segs,
            nsegs: data_segs + u32::from(imm.is_some()),
            done: 0,
        })
    }

    /// Posts a receive. The buffer takes the GRH (if configured) and then
    /// the message.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        self.rq.post(wr)
    }

    /// The next completion, with the queue it belongs to (Write-Record
    /// completions go to the receive CQ).
    pub fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        if let Some(c) = self.completions.pop_front() {
            return Some(c);
        }
        self.tracker.poll_completion().map(|wc| (CqKind::Recv, wc))
    }

    /// The next asynchronous error.
    pub fn poll_event(&mut self) -> Option<UdEvent> {
        self.events.pop_front()
    }

    /// True if [`UdQp::poll_transmit`] has datagrams to send.
    pub fn wants_transmit(&self) -> bool {
        !self.sq.is_empty()
    }

    /// When [`UdQp::handle_timeout`] should next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // Called after every operation: with no message in reassembly (the
        // single-datagram case) the slot table is not walked at all.
        let own = if self.free_slots.len() == self.slots.len() {
            None
        } else {
            self.slots.iter().flatten().filter_map(|r| r.deadline).min()
        };
        match (own, self.tracker.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Drops the messages whose reassembly time is up (their receives go
    /// back to the queue) and lets the Write-Record tracker retire its
    /// partial messages.
    pub fn handle_timeout(&mut self, now: Instant) {
        for i in 0..self.slots.len() {
            let expired = self.slots[i]
                .as_ref()
                .and_then(|r| r.deadline)
                .is_some_and(|d| d <= now);
            if expired {
                self.drop_slot(i);
                self.stats.rx_timeouts += 1;
            }
        }
        self.tracker.handle_timeout(now);
        self.drain_tracker();
    }

    // ------------------------------------------------------------------
    // Transmit
    // ------------------------------------------------------------------

    /// Builds datagrams for the queued work requests and hands them to
    /// `sink` in batches of up to [`TX_BATCH`], until the queue is empty or
    /// the sink stops accepting (`WouldBlock`: the datagram stays pending).
    /// Returns the number of datagrams accepted.
    ///
    /// Another error from the sink fails the work request whose datagram
    /// it refused ([`WcStatus::GeneralErr`]) and is returned; the QP keeps
    /// working and the next call carries on with the next request.
    pub fn poll_transmit<M: Memory, S: DatagramSink>(
        &mut self,
        mem: &M,
        sink: &mut S,
    ) -> io::Result<usize> {
        let mut total = 0;
        let mut plan = [Planned::default(); TX_BATCH];
        loop {
            let n = self.plan(mem, &mut plan);
            if n == 0 {
                return Ok(total);
            }
            let mut stage = std::mem::take(&mut self.stage);
            // `offered` may be fewer than `n` (the staging buffer full):
            // only a sink that took fewer than it was offered pushed back.
            let (offered, res) = self.send_planned(mem, sink, &plan[..n], &mut stage);
            self.stage = stage;
            match res {
                Ok(k) => {
                    let k = k.min(offered);
                    self.commit(&plan[..k]);
                    total += k;
                    if k < offered {
                        return Ok(total);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(total),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.fail_head(WcStatus::GeneralErr);
                    return Err(e);
                }
            }
        }
    }

    /// Chooses the next segments to send; fails a head request whose
    /// gather list the memory refuses.
    fn plan<M: Memory>(&mut self, mem: &M, out: &mut [Planned; TX_BATCH]) -> usize {
        loop {
            let mut n = 0;
            let mut bad_head = false;
            for (idx, e) in self.sq.iter().enumerate() {
                if n == TX_BATCH {
                    break;
                }
                if !gather_ok(mem, &e.wr.payload) {
                    bad_head = idx == 0;
                    break;
                }
                let mut s = e.done;
                while s < e.nsegs && n < TX_BATCH {
                    out[n] = Planned { idx, seg: s };
                    n += 1;
                    s += 1;
                }
            }
            if !bad_head {
                return n;
            }
            self.fail_head(WcStatus::LocProtErr);
        }
    }

    /// The header and payload range of segment `i` of `e`.
    fn segment<W: Borrow<SendWr>>(&self, e: &SqEntry<W>, i: u32) -> (SegmentRepr, u64, u64) {
        let wr = e.wr.borrow();
        let total = wr.payload.len();
        let last = i + 1 == e.nsegs;
        let dqpn = Some(((self.cfg.qpn & 0xFF) << 24) | (e.dest.qpn & QPN_MASK));
        let solicited = wr.flags.solicited;
        if i >= e.data_segs {
            // The Immediate Data segment that ends a Send with immediate.
            let imm = match wr.op {
                SendOp::Send { imm: Some(v), .. } => v,
                _ => 0,
            };
            let op = if solicited {
                Opcode::ImmediateDataSe
            } else {
                Opcode::ImmediateData
            };
            let mut repr = SegmentRepr::untagged(
                op,
                0,
                e.msn,
                total as u32,
                true,
                RdmapBody::Immediate(u64::from(imm)),
            );
            set_rsvd_ulp(&mut repr, self.cfg.qpn);
            repr.dqpn = dqpn;
            return (repr, total, 0);
        }
        let off = u64::from(i) * e.room;
        let len = e.room.min(total - off);
        let repr = match wr.op {
            SendOp::Write {
                remote_addr, rkey, ..
            }
            | SendOp::WriteRecord { remote_addr, rkey } => {
                let op = if matches!(wr.op, SendOp::WriteRecord { .. }) {
                    Opcode::WriteRecord
                } else {
                    Opcode::RdmaWrite
                };
                SegmentRepr {
                    ddp: DdpHeader::Tagged {
                        stag: rkey,
                        to: remote_addr.wrapping_add(off),
                        ext: Some(TaggedExt {
                            msn: e.msn,
                            mo: off as u32,
                        }),
                    },
                    dqpn,
                    ..SegmentRepr::tagged(op, rkey, 0, last)
                }
            }
            _ => {
                let op = if solicited {
                    Opcode::SendSe
                } else {
                    Opcode::Send
                };
                let mut repr =
                    SegmentRepr::untagged(op, 0, e.msn, off as u32, last, RdmapBody::None);
                set_rsvd_ulp(&mut repr, self.cfg.qpn);
                repr.dqpn = dqpn;
                repr
            }
        };
        (repr, off, len)
    }

    /// Frames the planned segments and offers them to the sink: a lone
    /// small one copied behind its header; from [`STAGE_MIN_BATCH`] on, as
    /// many as the staging buffer holds framed there; the rest gathered
    /// from memory. Returns how many were offered (a prefix of the plan)
    /// and what the sink said.
    fn send_planned<M: Memory, S: DatagramSink>(
        &self,
        mem: &M,
        sink: &mut S,
        plan: &[Planned],
        stage: &mut Vec<u8>,
    ) -> (usize, io::Result<usize>) {
        // Scratch arrays sized for the plan: a lone datagram (the latency
        // case) must not pay for initialising a full batch's kilobytes.
        const SMALL: usize = STAGE_MIN_BATCH - 1;
        match plan.len() {
            1 => match self.send_small(mem, sink, &plan[0]) {
                Some(r) => (1, r),
                None => (1, self.send_planned_n::<M, S, 1, IOV_PER>(mem, sink, plan)),
            },
            2..STAGE_MIN_BATCH => (
                plan.len(),
                self.send_planned_n::<M, S, SMALL, { SMALL * IOV_PER }>(mem, sink, plan),
            ),
            _ => match self.send_staged(mem, sink, plan, stage) {
                Some(r) => r,
                None => (
                    plan.len().min(TX_BATCH),
                    self.send_planned_n::<M, S, TX_BATCH, { TX_BATCH * IOV_PER }>(mem, sink, plan),
                ),
            },
        }
    }

    /// The datagrams of `plan` that fit in [`STAGE_CAP`] octets, each
    /// framed whole into `stage` behind the one before it and offered as
    /// one buffer (see [`offer_staged`]); `None` (nothing sent) if the
    /// first is larger than [`STAGE_MAX_DGRAM`] or its payload cannot be
    /// read. A later datagram that is too large, or whose payload cannot
    /// be read, ends the batch before it (the general path takes it when it
    /// reaches the head).
    fn send_staged<M: Memory, S: DatagramSink>(
        &self,
        mem: &M,
        sink: &mut S,
        plan: &[Planned],
        stage: &mut Vec<u8>,
    ) -> Option<(usize, io::Result<usize>)> {
        let n = plan.len().min(TX_BATCH);
        let mut dests = [(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0u16); TX_BATCH];
        for (d, p) in dests.iter_mut().zip(&plan[..n]) {
            let e = &self.sq[p.idx];
            *d = (e.dest.ip, e.dest.port);
        }
        offer_staged(sink, stage, &dests[..n], |j, room| {
            let e = &self.sq[plan[j].idx];
            let (repr, off, len) = self.segment(e, plan[j].seg);
            let h = repr.header_len();
            let end = usize::try_from(len)
                .ok()
                .and_then(|l| h.checked_add(l))
                .filter(|&end| end <= room.len())?;
            datagram::emit_header(&repr, room);
            gather_into(mem, &e.wr.payload, off, &mut room[h..end]).then_some(end)
        })
    }

    /// A lone segment of at most [`SMALL_COPY`] payload octets, copied
    /// behind its header into one buffer and sealed there; `None` for a
    /// larger one.
    fn send_small<M: Memory, S: DatagramSink>(
        &self,
        mem: &M,
        sink: &mut S,
        p: &Planned,
    ) -> Option<io::Result<usize>> {
        let e = &self.sq[p.idx];
        let mut buf = [0u8; SMALL_FRAME];
        // `plan` checked the gather list: a refused one cannot show here,
        // and if it did, the general path would send what it can read.
        let Framed::Ready(n) = self.frame_small(e, p.seg, mem, &mut buf) else {
            return None;
        };
        let bufs = [IoSlice::new(&buf[..n])];
        let batch = [Datagram {
            dest: (e.dest.ip, e.dest.port),
            bufs: &bufs,
        }];
        Some(sink.send_batch(&batch))
    }

    /// Segment `seg` of `e` framed whole into `buf` (header, payload
    /// copied behind it, CRC) if it carries at most [`SMALL_COPY`] payload
    /// octets and every one of them can be read.
    fn frame_small<M: Memory, W: Borrow<SendWr>>(
        &self,
        e: &SqEntry<W>,
        seg: u32,
        mem: &M,
        buf: &mut [u8; SMALL_FRAME],
    ) -> Framed {
        let (repr, off, len) = self.segment(e, seg);
        if len > SMALL_COPY as u64 {
            return Framed::TooBig;
        }
        let at = datagram::emit_header(&repr, buf);
        // `len` ≤ SMALL_COPY octets fit behind a header of at most HDR_CAP.
        let end = at + len as usize;
        if !gather_into(mem, &e.wr.borrow().payload, off, &mut buf[at..end]) {
            return Framed::Unreadable;
        }
        Framed::Ready(datagram::seal(buf, end))
    }

    /// [`UdQp::send_planned`] for at most `N` datagrams (`I` = `N` ×
    /// `IOV_PER` io-vectors).
    fn send_planned_n<M: Memory, S: DatagramSink, const N: usize, const I: usize>(
        &self,
        mem: &M,
        sink: &mut S,
        plan: &[Planned],
    ) -> io::Result<usize> {
        let n = plan.len().min(N);
        let plan = &plan[..n];
        let mut hdrs = [[0u8; HDR_CAP]; N];
        let mut hlens = [0usize; N];
        let mut trailers = [[0u8; CRC_LEN]; N];
        let mut pieces: [[&[u8]; MAX_SGE]; N] = [[&[]; MAX_SGE]; N];
        let mut npieces = [0usize; N];
        let mut dests = [(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0u16); N];
        for (j, p) in plan.iter().enumerate() {
            let e = &self.sq[p.idx];
            let (repr, off, len) = self.segment(e, p.seg);
            hlens[j] = datagram::emit_header(&repr, &mut hdrs[j]);
            npieces[j] = payload_pieces(mem, &e.wr.payload, off, len, &mut pieces[j]);
            trailers[j] = datagram::trailer(&hdrs[j][..hlens[j]], &pieces[j][..npieces[j]]);
            dests[j] = (e.dest.ip, e.dest.port);
        }
        let mut iov = [IoSlice::new(&[]); I];
        let mut bounds = [(0usize, 0usize); N];
        let mut k = 0;
        for j in 0..n {
            let start = k;
            iov[k] = IoSlice::new(&hdrs[j][..hlens[j]]);
            k += 1;
            for p in &pieces[j][..npieces[j]] {
                iov[k] = IoSlice::new(p);
                k += 1;
            }
            iov[k] = IoSlice::new(&trailers[j]);
            k += 1;
            bounds[j] = (start, k);
        }
        offer::<S, N>(sink, &dests[..n], &iov, &bounds[..n])
    }

    /// The sink accepted these segments (a prefix of the plan).
    fn commit(&mut self, accepted: &[Planned]) {
        for p in accepted {
            if let Some(e) = self.sq.get_mut(p.idx) {
                e.done += 1;
            }
        }
        self.stats.tx_datagrams += accepted.len() as u64;
        while self.sq.front().is_some_and(|e| e.done >= e.nsegs) {
            let e = self.sq.pop_front().expect("front exists");
            self.retire(&e);
        }
    }

    /// A request all of whose datagrams the sink took: counted, and
    /// completed if signaled.
    fn retire<W: Borrow<SendWr>>(&mut self, e: &SqEntry<W>) {
        let wr = e.wr.borrow();
        self.stats.tx_messages += 1;
        if wr.flags.signaled {
            self.completions.push_back((
                CqKind::Send,
                WorkCompletion::new(
                    wr.wr_id,
                    WcStatus::Success,
                    WcOpcode::of(&wr.op),
                    wr.payload.len() as u32,
                ),
            ));
        }
    }

    /// Completes the head send request with an error; its remaining
    /// datagrams are not sent.
    fn fail_head(&mut self, status: WcStatus) {
        if let Some(e) = self.sq.pop_front() {
            self.stats.tx_errors += 1;
            self.completions.push_back((
                CqKind::Send,
                WorkCompletion::new(e.wr.wr_id, status, WcOpcode::of(&e.wr.op), 0),
            ));
        }
    }

    // ------------------------------------------------------------------
    // Receive
    // ------------------------------------------------------------------

    /// Takes one UDP payload that arrived from `src_ip:src_port`. Sends are
    /// scattered into posted receives, Writes and Write-Records placed;
    /// completions and events become visible through
    /// [`UdQp::poll_completion`] and [`UdQp::poll_event`]. Anything wrong
    /// is counted ([`UdQp::stats`]) and dropped; nothing stops the QP.
    pub fn handle_datagram<M: Memory>(
        &mut self,
        src_ip: IpAddr,
        src_port: u16,
        data: &[u8],
        mem: &mut M,
        now: Instant,
    ) {
        self.handle_datagram_lazy(src_ip, src_port, data, mem, || now)
    }

    /// [`UdQp::handle_datagram`], asking `now` for the time only when the
    /// datagram starts a timer: a message of several datagrams (its
    /// reassembly deadline) or a Write-Record segment (the record's
    /// partial-placement timeout). A Send or Write in one datagram — every
    /// 64 B message — reads no clock.
    pub fn handle_datagram_lazy<M: Memory, F: FnMut() -> Instant>(
        &mut self,
        src_ip: IpAddr,
        src_port: u16,
        data: &[u8],
        mem: &mut M,
        mut now: F,
    ) {
        self.stats.rx_datagrams += 1;
        let (repr, payload) = match datagram::parse(data) {
            Ok(x) => x,
            Err(WireError::BadCrc) => {
                self.stats.rx_bad_crc += 1;
                return;
            }
            Err(_) => {
                self.stats.rx_malformed += 1;
                return;
            }
        };
        let slot = match repr.dqpn {
            Some(w) if w & QPN_MASK == self.cfg.qpn || w & QPN_MASK == MCAST_QPN => (w >> 24) as u8,
            None if self.cfg.accept_without_dqpn => 0,
            _ => {
                self.stats.rx_bad_dqpn += 1;
                return;
            }
        };
        let ip = src_ip.to_canonical();
        match repr.opcode {
            Opcode::Send | Opcode::SendSe | Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                self.rx_untagged(ip, src_port, &repr, payload, mem, &mut now)
            }
            Opcode::RdmaWrite | Opcode::WriteRecord => {
                let src = DgramAddr {
                    ip,
                    port: src_port,
                    qpn: (u32::from(src_port) << 8) | u32::from(slot),
                };
                self.rx_tagged(src, &repr, payload, mem, &mut now)
            }
            _ => self.stats.rx_unsupported += 1,
        }
    }

    fn rx_tagged<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        payload: &[u8],
        mem: &mut M,
        now: &mut impl FnMut() -> Instant,
    ) {
        let DdpHeader::Tagged { stag, to, ext } = repr.ddp else {
            self.stats.rx_malformed += 1;
            return;
        };
        let (msn, mo) = ext.map_or((0, 0), |e| (e.msn, e.mo));
        let record = repr.opcode == Opcode::WriteRecord;
        // A Write-Record segment the tracker will drop as stale (a late
        // segment of a message already retired) is checked, not placed:
        // memory changes only where the log says.
        let res = self
            .tracker
            .place_tagged(mem, record, src, stag, to, mo, msn, payload);
        if let Err(error) = res {
            self.stats.rx_access_errors += 1;
            self.push_event(UdEvent::RemoteAccess {
                src,
                opcode: repr.opcode,
                msn,
                stag,
                to,
                len: payload.len() as u32,
                error,
            });
            return;
        }
        if record {
            self.stats.rx_record_segments += 1;
            self.tracker.placed(
                src,
                stag,
                to,
                mo,
                msn,
                payload.len() as u32,
                repr.last,
                now(),
            );
            self.drain_tracker();
        } else {
            self.stats.rx_write_segments += 1;
        }
    }

    fn rx_untagged<M: Memory>(
        &mut self,
        ip: IpAddr,
        port: u16,
        repr: &SegmentRepr,
        payload: &[u8],
        mem: &mut M,
        now: &mut impl FnMut() -> Instant,
    ) {
        let DdpHeader::Untagged {
            rsvd_ulp,
            qn,
            msn,
            mo,
        } = repr.ddp
        else {
            self.stats.rx_malformed += 1;
            return;
        };
        let imm_seg = matches!(repr.opcode, Opcode::ImmediateData | Opcode::ImmediateDataSe);
        let end = u64::from(mo) + payload.len() as u64;
        if qn != 0
            || rsvd_ulp & !QPN_MASK != 0
            || (imm_seg && !repr.last)
            || end > u64::from(u32::MAX)
        {
            self.stats.rx_malformed += 1;
            return;
        }
        let seg = RxSeg {
            mo,
            end: end as u32,
            last: repr.last,
            imm_seg,
            imm: match repr.body {
                RdmapBody::Immediate(v) if imm_seg => Some(v as u32),
                _ => None,
            },
            solicited: repr.opcode.is_solicited(),
        };
        let src = DgramAddr {
            ip,
            port,
            qpn: rsvd_ulp,
        };
        if let Some(&i) = self.slot_map.get(&(src, msn)) {
            self.rx_continue(i, &seg, payload, mem);
            return;
        }
        if self.is_done(src, msn) {
            self.stats.rx_duplicates += 1;
            return;
        }
        let whole = mo == 0 && repr.last;
        if !whole && self.free_slots.is_empty() {
            self.evict_oldest();
        }
        let Some((seq, wr)) = self.rq.take() else {
            self.stats.rx_no_recv += 1;
            self.mark_done(src, msn);
            return;
        };
        if wr.sgl.total_len() < self.grh_len() {
            // Not even room for the GRH.
            return self.finish_err(src, msn, &wr, WcStatus::LocLenErr);
        }
        let cap = self.capacity(&wr);
        if whole {
            if u64::from(seg.end) > cap {
                return self.finish_err(src, msn, &wr, WcStatus::LocLenErr);
            }
            if scatter(mem, &wr.sgl, self.grh_len() + u64::from(mo), payload).is_err() {
                return self.finish_err(src, msn, &wr, WcStatus::LocProtErr);
            }
            return self.finish_ok(src, msn, &wr, seg.end, seg.imm, seg.solicited, mem);
        }
        let Some(i) = self.free_slots.pop() else {
            // Not reached: a slot was freed above.
            self.rq.give_back(seq, wr);
            return;
        };
        self.slots[i] = Some(Reasm {
            src,
            msn,
            seq,
            wr,
            cap,
            deadline: now().checked_add(self.cfg.reassembly_timeout),
            total: None,
            last_imm: false,
            imm: None,
            solicited: false,
            frags: Frags::EMPTY,
        });
        self.slot_map.insert((src, msn), i);
        self.rx_continue(i, &seg, payload, mem);
    }

    /// A segment of the message in slot `i`.
    fn rx_continue<M: Memory>(&mut self, i: usize, seg: &RxSeg, payload: &[u8], mem: &mut M) {
        let grh = self.grh_len();
        let Some(r) = self.slots[i].as_mut() else {
            return;
        };
        let inconsistent = match r.total {
            Some(t) => seg.end > t || (seg.last && (seg.end != t || seg.imm_seg != r.last_imm)),
            None => seg.last && seg.end < r.frags.end(),
        };
        if inconsistent {
            self.stats.rx_inconsistent += 1;
            return;
        }
        if u64::from(seg.end) > r.cap {
            let r = self.release_slot(i);
            return self.finish_err(r.src, r.msn, &r.wr, WcStatus::LocLenErr);
        }
        if r.frags.covers(seg.mo, seg.end) && (!seg.last || r.total.is_some()) {
            self.stats.rx_duplicates += 1;
            return;
        }
        if !r.frags.can_add(seg.mo, seg.end) {
            self.stats.rx_fragment_overflow += 1;
            return;
        }
        if !payload.is_empty() && scatter(mem, &r.wr.sgl, grh + u64::from(seg.mo), payload).is_err()
        {
            let r = self.release_slot(i);
            return self.finish_err(r.src, r.msn, &r.wr, WcStatus::LocProtErr);
        }
        r.frags.add(seg.mo, seg.end);
        if seg.last {
            r.total = Some(seg.end);
            r.last_imm = seg.imm_seg;
            r.imm = seg.imm;
            r.solicited = seg.solicited;
        }
        if r.total.is_some_and(|t| r.frags.complete(t)) {
            let r = self.release_slot(i);
            let total = r.total.unwrap_or(0);
            self.finish_ok(r.src, r.msn, &r.wr, total, r.imm, r.solicited, mem);
        }
    }

    /// Octets of message the receive can take.
    fn capacity(&self, wr: &RecvWr) -> u64 {
        let room = wr.sgl.total_len().saturating_sub(self.grh_len());
        room.min(self.cfg.max_msg as u64)
            .min(u64::from(u32::MAX) - GRH_LEN as u64)
    }

    fn grh_len(&self) -> u64 {
        if self.cfg.grh.is_some() {
            GRH_LEN as u64
        } else {
            0
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn finish_ok<M: Memory>(
        &mut self,
        src: DgramAddr,
        msn: u32,
        wr: &RecvWr,
        total: u32,
        imm: Option<u32>,
        solicited: bool,
        mem: &mut M,
    ) {
        if let Some(ours) = self.cfg.grh {
            let h = grh_header(src.ip, ours, u64::from(total));
            if scatter(mem, &wr.sgl, 0, &h).is_err() {
                return self.finish_err(src, msn, wr, WcStatus::LocProtErr);
            }
        }
        self.rq.consumed();
        self.mark_done(src, msn);
        self.stats.rx_delivered += 1;
        let mut wc = WorkCompletion::new(
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            total + self.grh_len() as u32,
        );
        wc.imm = imm;
        wc.solicited = solicited;
        wc.src = Some(src);
        self.completions.push_back((CqKind::Recv, wc));
    }

    fn finish_err(&mut self, src: DgramAddr, msn: u32, wr: &RecvWr, status: WcStatus) {
        self.rq.consumed();
        self.mark_done(src, msn);
        match status {
            WcStatus::LocLenErr => self.stats.rx_len_err += 1,
            _ => self.stats.rx_prot_err += 1,
        }
        let mut wc = WorkCompletion::new(wr.wr_id, status, WcOpcode::Recv, 0);
        wc.src = Some(src);
        self.completions.push_back((CqKind::Recv, wc));
    }

    /// Frees slot `i` and returns what it held.
    fn release_slot(&mut self, i: usize) -> Reasm {
        let r = self.slots[i].take().expect("slot in use");
        self.slot_map.remove(&(r.src, r.msn));
        self.free_slots.push(i);
        r
    }

    /// Drops the incomplete message in slot `i`: its receive goes back to
    /// the queue and its late segments will be ignored.
    fn drop_slot(&mut self, i: usize) {
        let r = self.release_slot(i);
        self.rq.give_back(r.seq, r.wr);
        self.mark_done(r.src, r.msn);
    }

    fn evict_oldest(&mut self) {
        let oldest = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|r| (r.deadline, r.seq, i)))
            // `None` deadlines (never) sort first in Option's order; they
            // are the oldest in spirit too.
            .min()
            .map(|(_, _, i)| i);
        if let Some(i) = oldest {
            self.drop_slot(i);
            self.stats.rx_evicted += 1;
        }
    }

    /// The index of `src`'s window: the last source's without hashing
    /// (most traffic comes from the peer of the datagram before).
    fn source_index(&self, src: DgramAddr) -> Option<usize> {
        if self
            .sources
            .get(self.last_source)
            .is_some_and(|w| w.addr == src)
        {
            return Some(self.last_source);
        }
        self.source_map.get(&src).copied()
    }

    fn is_done(&self, src: DgramAddr, msn: u32) -> bool {
        self.source_index(src)
            .is_some_and(|i| self.sources[i].is_done(msn))
    }

    fn mark_done(&mut self, src: DgramAddr, msn: u32) {
        self.use_clock += 1;
        let used = self.use_clock;
        if let Some(i) = self.source_index(src) {
            self.last_source = i;
            let w = &mut self.sources[i];
            w.used = used;
            w.mark(msn);
            return;
        }
        let mut w = SrcWin {
            addr: src,
            highest: msn,
            bits: [0; WIN_WORDS],
            used,
        };
        w.mark(msn);
        if self.sources.len() < self.cfg.max_sources {
            self.source_map.insert(src, self.sources.len());
            self.sources.push(w);
            return;
        }
        // Forget the least recently used source.
        let Some((i, _)) = self.sources.iter().enumerate().min_by_key(|(_, s)| s.used) else {
            return;
        };
        self.source_map.remove(&self.sources[i].addr);
        self.source_map.insert(src, i);
        self.sources[i] = w;
    }

    fn push_event(&mut self, ev: UdEvent) {
        if self.events.len() >= self.cfg.event_depth {
            self.stats.events_lost += 1;
        } else {
            self.events.push_back(ev);
        }
    }

    /// Moves the tracker's completions behind ours, keeping their order.
    fn drain_tracker(&mut self) {
        while let Some(wc) = self.tracker.poll_completion() {
            self.completions.push_back((CqKind::Recv, wc));
        }
    }
}

/// Frames datagrams back to back into `stage` (grown to [`STAGE_CAP`] on
/// first use and kept) and offers each as one buffer, all at once:
/// `frame(j, room)` writes datagram `j` (for `dests[j]`) without its CRC at
/// the start of `room` and returns its length, or `None` if it does not
/// fit in `room` or its payload cannot be read, which ends the batch before
/// it. No datagram gets more than [`STAGE_MAX_DGRAM`] octets (CRC
/// included). The CRC is sealed behind each. Returns how many were offered
/// and what the sink said of them; `None` (nothing offered) if not even
/// the first was framed. Fewer may be offered than `dests` holds: a sink
/// that takes all it was offered has not pushed back.
pub(crate) fn offer_staged<S: DatagramSink>(
    sink: &mut S,
    stage: &mut Vec<u8>,
    dests: &[(IpAddr, u16)],
    mut frame: impl FnMut(usize, &mut [u8]) -> Option<usize>,
) -> Option<(usize, io::Result<usize>)> {
    if stage.len() < STAGE_CAP {
        stage.resize(STAGE_CAP, 0);
    }
    let mut spans = [(0usize, 0usize); TX_BATCH];
    let (mut n, mut at) = (0, 0);
    // Each datagram is sealed after the next one is framed: the CRC then
    // reads octets whose stores have left the store buffer, where sealing
    // right behind the copy waits for them (on this host a 1.4 KiB copy
    // and its CRC take ~63 ns back to back and ~44 ns this way).
    let mut unsealed: Option<(usize, usize)> = None;
    for j in 0..dests.len().min(TX_BATCH) {
        // Room for this datagram's CRC too: the CRC_LEN octets behind
        // `len` are reserved, so framing the next one never overlaps it.
        let room = STAGE_MAX_DGRAM.min(STAGE_CAP - at).saturating_sub(CRC_LEN);
        let Some(len) = frame(j, &mut stage[at..at + room]) else {
            break;
        };
        if let Some((a, l)) = unsealed.replace((at, len)) {
            datagram::seal(&mut stage[a..], l);
        }
        spans[n] = (at, at + len + CRC_LEN);
        at += len + CRC_LEN;
        n += 1;
    }
    let (a, l) = unsealed?;
    datagram::seal(&mut stage[a..], l);
    let mut iov = [IoSlice::new(&[]); TX_BATCH];
    let mut bounds = [(0usize, 0usize); TX_BATCH];
    for (j, &(a, b)) in spans[..n].iter().enumerate() {
        iov[j] = IoSlice::new(&stage[a..b]);
        bounds[j] = (j, j + 1);
    }
    Some((
        n,
        offer::<S, TX_BATCH>(sink, &dests[..n], &iov, &bounds[..n]),
    ))
}

/// Offers at most `N` datagrams to `sink` at once: datagram `j` goes to
/// `dests[j]` and is made of the io-vectors `iov[bounds[j].0..bounds[j].1]`.
pub(crate) fn offer<S: DatagramSink, const N: usize>(
    sink: &mut S,
    dests: &[(IpAddr, u16)],
    iov: &[IoSlice<'_>],
    bounds: &[(usize, usize)],
) -> io::Result<usize> {
    let empty = Datagram {
        dest: dests[0],
        bufs: &[],
    };
    let mut batch = [empty; N];
    for ((d, dest), &(a, b)) in batch.iter_mut().zip(dests).zip(bounds) {
        *d = Datagram {
            dest: *dest,
            bufs: &iov[a..b],
        };
    }
    sink.send_batch(&batch[..bounds.len().min(N)])
}

fn set_rsvd_ulp(repr: &mut SegmentRepr, v: u32) {
    if let DdpHeader::Untagged { rsvd_ulp, .. } = &mut repr.ddp {
        *rsvd_ulp = v;
    }
}

/// Whether every octet of a gather list can be read.
fn gather_ok<M: Memory>(mem: &M, payload: &Payload) -> bool {
    let Payload::Sgl(sgl) = payload else {
        return true;
    };
    let mut ok = true;
    sgl.for_range(0, sgl.total_len(), |sge, off, n| {
        ok &= mem
            .local_read(sge.lkey, sge.addr.wrapping_add(off), n)
            .is_ok();
    });
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemError;
    use crate::memory::{Access, VecMemory};
    use crate::rc::SIGNALED;
    use crate::wr::{InlineData, SendFlags};
    use crate::wr::{SgList, Sge};
    use std::net::{Ipv4Addr, Ipv6Addr};

    const BASE: u64 = 0x10_0000;
    /// IPv4, untagged + DQPN: 1500 − 28 − 22 − 4.
    const ROOM_SEND: usize = 1446;
    /// IPv4, tagged + X + DQPN: 1500 − 28 − 26 − 4.
    const ROOM_TAGGED: usize = 1442;

    #[derive(Default)]
    struct VecSink {
        out: Vec<((IpAddr, u16), Vec<u8>)>,
        budget: Option<usize>,
        fail_next: Option<io::ErrorKind>,
    }

    impl DatagramSink for VecSink {
        fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
            if let Some(k) = self.fail_next.take() {
                return Err(io::Error::from(k));
            }
            if let Some(b) = &mut self.budget {
                if *b == 0 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                *b -= 1;
            }
            let mut d = Vec::new();
            for b in bufs {
                d.extend_from_slice(b);
            }
            self.out.push((dest, d));
            Ok(())
        }
    }

    struct Node {
        qp: UdQp,
        mem: VecMemory,
        addr: DgramAddr,
        buf: u32,
    }

    fn node(ip: [u8; 4], port: u16, slot: u32, f: impl FnOnce(&mut UdConfig)) -> Node {
        let qpn = (u32::from(port) << 8) | slot;
        let mut cfg = UdConfig {
            qpn,
            ..UdConfig::default()
        };
        f(&mut cfg);
        let mut mem = VecMemory::new();
        let buf = mem.register(0, BASE, 1 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        Node {
            qp: UdQp::new(cfg).expect("valid config"),
            mem,
            addr: DgramAddr {
                ip: IpAddr::V4(Ipv4Addr::from(ip)),
                port,
                qpn,
            },
            buf,
        }
    }

    fn a() -> Node {
        node([10, 0, 0, 1], 4791, 1, |_| {})
    }

    fn b() -> Node {
        node([10, 0, 0, 2], 4791, 2, |_| {})
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
            .collect()
    }

    impl Node {
        fn fill(&mut self, off: usize, len: usize, seed: u8) -> Vec<u8> {
            let p = pattern(len, seed);
            self.mem.bytes_mut(self.buf)[off..off + len].copy_from_slice(&p);
            p
        }

        fn wr(&self, id: u64, op: SendOp, off: usize, len: usize) -> SendWr {
            SendWr {
                wr_id: id,
                op,
                payload: Payload::Sgl(SgList::single(BASE + off as u64, len as u32, self.buf)),
                flags: SIGNALED,
            }
        }

        fn send(&mut self, id: u64, off: usize, len: usize, imm: Option<u32>, to: DgramAddr) {
            let wr = self.wr(
                id,
                SendOp::Send {
                    imm,
                    invalidate: None,
                },
                off,
                len,
            );
            self.qp.post_send(wr, to).expect("posted");
        }

        fn recv(&mut self, id: u64, off: usize, len: usize) {
            let sgl = SgList::single(BASE + off as u64, len as u32, self.buf);
            self.qp
                .post_recv(RecvWr { wr_id: id, sgl })
                .expect("posted");
        }

        fn tx(&mut self) -> Vec<Vec<u8>> {
            let mut s = VecSink::default();
            self.qp.poll_transmit(&self.mem, &mut s).expect("sent");
            s.out.into_iter().map(|(_, d)| d).collect()
        }

        fn rx(&mut self, from: DgramAddr, d: &[u8], now: Instant) {
            self.qp
                .handle_datagram(from.ip, from.port, d, &mut self.mem, now);
        }

        fn wcs(&mut self) -> Vec<(CqKind, WorkCompletion)> {
            std::iter::from_fn(|| self.qp.poll_completion()).collect()
        }

        fn at(&self, off: usize, len: usize) -> &[u8] {
            &self.mem.bytes(self.buf)[off..off + len]
        }
    }

    fn repr_of(d: &[u8]) -> (SegmentRepr, usize) {
        let (r, p) = datagram::parse(d).expect("valid datagram");
        (r, p.len())
    }

    fn untagged(d: &[u8]) -> (u32, u32, u32, u32) {
        match repr_of(d).0.ddp {
            DdpHeader::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
            } => (rsvd_ulp, qn, msn, mo),
            _ => panic!("tagged"),
        }
    }

    /// Re-CRCs a datagram after a header edit.
    fn fix_crc(d: &mut [u8]) {
        let n = d.len() - CRC_LEN;
        let t = datagram::trailer(&d[..n], &[]);
        d[n..].copy_from_slice(&t);
    }

    /// A sink that says which entry point a datagram came through
    /// (`send`: only the transmit shortcut calls it directly) and can push
    /// back or fail like a socket.
    #[derive(Default)]
    struct TraceSink {
        inner: VecSink,
        direct: usize,
    }

    impl DatagramSink for TraceSink {
        fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
            self.direct += 1;
            self.inner.send(dest, bufs)
        }

        fn send_batch(&mut self, batch: &[Datagram<'_>]) -> io::Result<usize> {
            self.inner.send_batch(batch)
        }
    }

    #[test]
    fn transmit_shortcut_matches_the_general_path() {
        // (name, work request, shortcut expected when the queue is empty).
        let n = a();
        let imm = |v| SendOp::Send {
            imm: v,
            invalidate: None,
        };
        let write = SendOp::Write {
            remote_addr: 0x40_0000,
            rkey: 0x1234,
            imm: None,
        };
        let record = SendOp::WriteRecord {
            remote_addr: 0x40_0000,
            rkey: 0x1234,
        };
        let three = SgList::from_slice(&[
            Sge {
                addr: BASE + 10,
                length: 7,
                lkey: n.buf,
            },
            Sge {
                addr: BASE + 900,
                length: 0,
                lkey: 0xdead_0000,
            },
            Sge {
                addr: BASE + 300,
                length: 50,
                lkey: n.buf,
            },
        ])
        .expect("three entries");
        let mut unsignaled = n.wr(6, imm(None), 0, 64);
        unsignaled.flags = SendFlags::default();
        let mut solicited = n.wr(7, imm(None), 0, 64);
        solicited.flags.solicited = true;
        let mut bad_key = n.wr(12, imm(None), 0, 64);
        bad_key.payload = Payload::Sgl(SgList::single(BASE, 64, n.buf ^ 0x100));
        let mut past_end = n.wr(13, imm(None), (1 << 20) - 32, 64);
        past_end.payload = Payload::Sgl(SgList::single(BASE + (1 << 20) - 32, 64, n.buf));
        let mut inline = n.wr(14, imm(None), 0, 0);
        inline.payload = Payload::Inline(InlineData::new(&pattern(40, 3)).expect("fits"));
        let mut sgl3 = n.wr(15, imm(None), 0, 0);
        sgl3.payload = Payload::Sgl(three);
        let cases: Vec<(&str, SendWr, bool)> = vec![
            ("send 64", n.wr(1, imm(None), 0, 64), true),
            ("send 0", n.wr(2, imm(None), 0, 0), true),
            ("send 512", n.wr(3, imm(None), 0, 512), true),
            ("send 513", n.wr(4, imm(None), 0, 513), false),
            ("imm, no payload", n.wr(5, imm(Some(9)), 0, 0), true),
            ("unsignaled", unsignaled, true),
            ("solicited", solicited, true),
            ("imm + payload", n.wr(8, imm(Some(9)), 0, 10), false),
            ("write 100", n.wr(9, write, 0, 100), true),
            ("write-record 100", n.wr(10, record, 0, 100), true),
            ("send 2 datagrams", n.wr(11, imm(None), 0, 2000), false),
            ("bad lkey", bad_key, false),
            ("past the region", past_end, false),
            ("inline", inline, true),
            ("three pieces", sgl3, true),
            (
                "read",
                n.wr(
                    16,
                    SendOp::Read {
                        remote_addr: 0,
                        rkey: 1,
                    },
                    0,
                    8,
                ),
                false,
            ),
        ];
        let dest = b().addr;
        // How the sink treats the post's datagrams: takes all; pushes back
        // (then takes all on the next poll); fails the first.
        for mode in ["all", "would-block", "fail"] {
            let sink = || {
                let mut s = TraceSink::default();
                match mode {
                    "would-block" => s.inner.budget = Some(0),
                    "fail" => s.inner.fail_next = Some(io::ErrorKind::ConnectionRefused),
                    _ => {}
                }
                s
            };
            let (mut fast, mut slow) = (a(), a());
            for node in [&mut fast, &mut slow] {
                node.fill(0, 4096, 5);
            }
            for (name, wr, qualifies) in &cases {
                let (mut fs, mut ss) = (sink(), sink());
                let fr = fast
                    .qp
                    .post_send_and_transmit(*wr, dest, &fast.mem, &mut fs);
                let sr = slow
                    .qp
                    .post_send(*wr, dest)
                    .map(|()| slow.qp.poll_transmit(&slow.mem, &mut ss));
                let what = format!("{name} ({mode})");
                let kinds = |r: &Result<io::Result<usize>, PostError>| match r {
                    Ok(Ok(k)) => Ok(Ok(*k)),
                    Ok(Err(e)) => Ok(Err(e.kind())),
                    Err(e) => Err(*e),
                };
                assert_eq!(kinds(&fr), kinds(&sr), "{what}: returns");
                assert_eq!(fs.inner.out, ss.inner.out, "{what}: datagrams");
                let took = fs.direct > 0;
                assert_eq!(took, *qualifies, "{what}: shortcut taken");
                assert_eq!(ss.direct, 0, "{what}: the general path batches");
                assert_eq!(fast.wcs(), slow.wcs(), "{what}: completions");
                assert_eq!(fast.qp.stats(), slow.qp.stats(), "{what}: counters");
                let wants = fast.qp.wants_transmit();
                assert_eq!(wants, slow.qp.wants_transmit(), "{what}: pending");
                if *qualifies {
                    assert_eq!(wants, mode == "would-block", "{what}: pending");
                }
                // Whatever stayed queued goes the same way later.
                let (mut fs, mut ss) = (TraceSink::default(), TraceSink::default());
                let fr = fast
                    .qp
                    .poll_transmit(&fast.mem, &mut fs)
                    .map_err(|e| e.kind());
                let sr = slow
                    .qp
                    .poll_transmit(&slow.mem, &mut ss)
                    .map_err(|e| e.kind());
                assert_eq!(fr, sr, "{what}: later returns");
                assert_eq!(fs.inner.out, ss.inner.out, "{what}: later datagrams");
                assert_eq!(fast.wcs(), slow.wcs(), "{what}: later completions");
                assert_eq!(fast.qp.stats(), slow.qp.stats(), "{what}: later counters");
                assert!(!fast.qp.wants_transmit(), "{what}: all sent");
            }
        }
        // Behind a queued request the shortcut waits its turn.
        let mut q = a();
        q.qp.post_send(q.wr(1, imm(None), 0, 64), dest)
            .expect("posted");
        let mut s = TraceSink::default();
        let r =
            q.qp.post_send_and_transmit(q.wr(2, imm(None), 0, 64), dest, &q.mem, &mut s);
        assert_eq!(r.expect("posted").expect("sent"), 2);
        assert_eq!(s.direct, 0, "queued first: no shortcut");
        let ids: Vec<u64> = q.wcs().iter().map(|(_, wc)| wc.wr_id).collect();
        assert_eq!(ids, [1, 2], "in order");
    }

    /// Records each datagram's octets and how many buffers it came in.
    #[derive(Default)]
    struct PieceSink {
        inner: VecSink,
        pieces: Vec<usize>,
    }

    impl DatagramSink for PieceSink {
        fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
            self.inner.send(dest, bufs)?;
            self.pieces.push(bufs.len());
            Ok(())
        }
    }

    #[test]
    fn staged_batches_send_what_the_gather_sends() {
        // Batches of five or more datagrams are framed into the staging
        // buffer and offered one buffer per datagram; the octets,
        // completions and counters must be those of the gather path
        // (`send_planned_n`, driven here the way `poll_transmit` drives
        // it), for every MTU, gather list, mix of requests, and a sink
        // that takes only part of a batch.
        let dest = b().addr;
        let record = SendOp::WriteRecord {
            remote_addr: 0x40_0000,
            rkey: 0x1234,
        };
        let send = SendOp::Send {
            imm: None,
            invalidate: None,
        };
        let gather3 = |n: &Node| {
            // Pieces of 1 000, 5 and 40 000 octets: datagram boundaries
            // fall inside and across them.
            let sges = [(0u64, 1000u32), (70_000, 5), (100_000, 40_000)];
            let v: Vec<Sge> = sges
                .iter()
                .map(|&(off, length)| Sge {
                    addr: BASE + off,
                    length,
                    lkey: n.buf,
                })
                .collect();
            Payload::Sgl(SgList::from_slice(&v).expect("three entries"))
        };
        // (name, MTU, requests as (op, offset, length), three-piece list).
        type Case = (&'static str, usize, Vec<(SendOp, usize, usize)>, bool);
        let cases: Vec<Case> = vec![
            ("send 20 000", 1500, vec![(send, 0, 20_000)], false),
            (
                "write-record 64 KiB",
                1500,
                vec![(record, 0, 65_536)],
                false,
            ),
            ("three pieces", 1500, vec![(record, 0, 0)], true),
            (
                "a mix in one batch",
                1500,
                vec![
                    (send, 0, 3000),
                    (send, 7, 100),
                    (record, 9, 5000),
                    (send, 0, 0),
                ],
                false,
            ),
            (
                "MTU 9000: seven per stage",
                9000,
                vec![(record, 0, 200_000)],
                false,
            ),
            (
                "MTU 65535: too big to stage",
                65_535,
                vec![(send, 0, 300_000)],
                false,
            ),
        ];
        for (name, mtu, reqs, three) in &cases {
            for budget in [None, Some(3)] {
                let what = format!("{name} (budget {budget:?})");
                let mk = || {
                    let mut n = node([10, 0, 0, 1], 4791, 1, |c| {
                        c.mtu = *mtu;
                        c.max_msg = 1 << 20;
                    });
                    n.fill(0, 1 << 20, 9);
                    for (i, &(op, off, len)) in reqs.iter().enumerate() {
                        let mut wr = n.wr(i as u64 + 1, op, off, len);
                        if *three {
                            wr.payload = gather3(&n);
                        }
                        n.qp.post_send(wr, dest).expect("posted");
                    }
                    n
                };
                let (mut staged, mut gathered) = (mk(), mk());
                // The staging path, through `poll_transmit`, with a sink
                // that pushes back after `budget` datagrams per poll.
                let mut ss = PieceSink::default();
                let mut polls = 0;
                while staged.qp.wants_transmit() {
                    ss.inner.budget = budget;
                    staged.qp.poll_transmit(&staged.mem, &mut ss).expect("sent");
                    polls += 1;
                    assert!(polls < 10_000, "{what}: no progress");
                }
                // A batch the staging buffer cut short is not a sink
                // pushing back: one poll sends all a willing sink takes.
                if budget.is_none() {
                    assert_eq!(polls, 1, "{what}: polls to send everything");
                }
                // The gather path.
                let mut gs = PieceSink::default();
                let mut plan = [Planned::default(); TX_BATCH];
                loop {
                    let n = gathered.qp.plan(&gathered.mem, &mut plan);
                    if n == 0 {
                        break;
                    }
                    let k = gathered
                        .qp
                        .send_planned_n::<_, _, TX_BATCH, { TX_BATCH * IOV_PER }>(
                            &gathered.mem,
                            &mut gs,
                            &plan[..n],
                        )
                        .expect("sent");
                    gathered.qp.commit(&plan[..k]);
                }
                assert!(!ss.inner.out.is_empty(), "{what}: sent something");
                assert_eq!(ss.inner.out.len(), gs.inner.out.len(), "{what}: datagrams");
                for (i, (x, y)) in ss.inner.out.iter().zip(&gs.inner.out).enumerate() {
                    assert!(x == y, "{what}: datagram {i} differs");
                }
                assert_eq!(staged.wcs(), gathered.wcs(), "{what}: completions");
                assert_eq!(staged.qp.stats(), gathered.qp.stats(), "{what}: counters");
                // Which path framed them: one buffer per staged datagram,
                // header + pieces + trailer per gathered one.
                // (A Send without payload has no piece between the two.)
                assert!(gs.pieces.iter().all(|&p| p >= 2), "{what}: gathered");
                let too_big = *mtu > STAGE_MAX_DGRAM;
                let one_buffer = ss.pieces.iter().filter(|&&p| p == 1).count();
                if too_big {
                    assert_eq!(one_buffer, 0, "{what}: nothing staged");
                } else if budget.is_none() {
                    // Every datagram but those of a last batch of at most
                    // four (sent without staging) came in one buffer.
                    assert!(
                        one_buffer + 4 >= ss.pieces.len(),
                        "{what}: staged {one_buffer} of {}",
                        ss.pieces.len()
                    );
                    assert!(one_buffer > 0, "{what}: staged");
                }
            }
        }
    }

    #[test]
    fn config_is_checked() {
        let bad = |f: fn(&mut UdConfig)| {
            let mut c = UdConfig::default();
            f(&mut c);
            UdQp::new(c).err()
        };
        assert_eq!(bad(|c| c.qpn = 1 << 24), Some(UdConfigError::Qpn));
        assert_eq!(bad(|c| c.mtu = MIN_MTU - 1), Some(UdConfigError::Mtu));
        assert_eq!(bad(|c| c.mtu = MAX_MTU + 1), Some(UdConfigError::Mtu));
        assert_eq!(
            bad(|c| c.max_msg = MAX_MSG_LIMIT + 1),
            Some(UdConfigError::MaxMsg)
        );
        assert_eq!(bad(|c| c.rq_depth = 0), Some(UdConfigError::Depth));
        assert_eq!(bad(|c| c.max_reassembly = 0), Some(UdConfigError::Depth));
        assert_eq!(bad(|_| {}), None);
        assert_eq!(bad(|c| c.max_msg = MAX_MSG_LIMIT), None);
    }

    #[test]
    fn single_segment_send_and_wire_layout() {
        let (mut a, mut b) = (a(), b());
        let data = a.fill(0, 100, 7);
        b.recv(9, 0, 2000);
        a.send(1, 0, 100, None, b.addr);
        let d = a.tx();
        assert_eq!(d.len(), 1);
        let d = &d[0];
        assert_eq!(d.len(), 22 + 100 + 4);
        assert_eq!(d[0], 0x51, "T=0 L=1 X=0 Q=1 DV=1");
        assert_eq!(d[1], 0x43, "RV=1 Send");
        assert_eq!(&d[2..6], &a.addr.qpn.to_be_bytes(), "RsvdULP = source QPN");
        assert_eq!(untagged(d), (a.addr.qpn, 0, 1, 0));
        let dqpn = u32::from_be_bytes(d[18..22].try_into().unwrap());
        assert_eq!(dqpn, (1 << 24) | b.addr.qpn, "slot in the top octet");
        assert_eq!(dqpn_of(d), Some(b.addr.qpn));
        assert_eq!(&d[22..122], &data[..]);
        // The WR completed when the sink took the datagram.
        assert_eq!(
            a.wcs(),
            vec![(
                CqKind::Send,
                WorkCompletion::new(1, WcStatus::Success, WcOpcode::Send, 100)
            )]
        );
        assert!(!a.qp.wants_transmit());
        b.rx(a.addr, d, Instant::now());
        let wcs = b.wcs();
        assert_eq!(wcs.len(), 1);
        let (kind, wc) = wcs[0];
        assert_eq!(kind, CqKind::Recv);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (9, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!((wc.byte_len, wc.imm, wc.solicited), (100, None, false));
        assert_eq!(wc.src, Some(a.addr));
        assert_eq!(b.at(0, 100), &data[..]);
        assert_eq!(b.qp.stats().rx_delivered, 1);
        assert_eq!(a.qp.stats().tx_datagrams, 1);
    }

    /// The clock is asked for only by a datagram that starts a timer: not
    /// by a Send in one datagram (nor a one-datagram Write), once per
    /// datagram that opens or continues a message of several, and by
    /// every Write-Record segment.
    #[test]
    fn the_clock_is_read_only_for_timers() {
        let (mut a, mut b) = (a(), b());
        let asked = std::cell::Cell::new(0u32);
        let rx = |b: &mut Node, from: DgramAddr, d: &[u8]| {
            b.qp.handle_datagram_lazy(from.ip, from.port, d, &mut b.mem, || {
                asked.set(asked.get() + 1);
                Instant::now()
            })
        };
        a.fill(0, 10_000, 5);
        b.recv(1, 0, 2000);
        a.send(1, 0, 64, None, b.addr);
        let d = a.tx();
        rx(&mut b, a.addr, &d[0]);
        assert_eq!(b.wcs().len(), 1, "delivered");
        let w = a.wr(
            2,
            SendOp::Write {
                remote_addr: BASE,
                rkey: b.buf,
                imm: None,
            },
            0,
            64,
        );
        a.qp.post_send(w, b.addr).unwrap();
        for s in a.tx() {
            rx(&mut b, a.addr, &s);
        }
        assert_eq!(
            asked.get(),
            0,
            "a one-datagram Send or Write reads no clock"
        );
        b.recv(3, 0, 16_000);
        a.send(3, 0, 3000, None, b.addr);
        let d = a.tx();
        assert_eq!(d.len(), 3);
        rx(&mut b, a.addr, &d[0]);
        assert_eq!(asked.get(), 1, "the first of three opens a reassembly");
        rx(&mut b, a.addr, &d[1]);
        rx(&mut b, a.addr, &d[2]);
        assert_eq!(asked.get(), 1, "continuing it needs no clock");
        assert_eq!(b.wcs().len(), 1, "reassembled");
        let r = a.wr(
            4,
            SendOp::WriteRecord {
                remote_addr: BASE + 0x1000,
                rkey: b.buf,
            },
            0,
            100,
        );
        a.qp.post_send(r, b.addr).unwrap();
        for s in a.tx() {
            rx(&mut b, a.addr, &s);
        }
        assert_eq!(
            asked.get(),
            2,
            "a Write-Record segment is logged with its time"
        );
    }

    #[test]
    fn segmentation_and_reassembly_in_any_order() {
        let (mut a, mut b) = (a(), b());
        let data = a.fill(0, 10_000, 3);
        b.recv(1, 0, 16_000);
        a.send(1, 0, 10_000, None, b.addr);
        let d = a.tx();
        assert_eq!(d.len(), 10_000usize.div_ceil(ROOM_SEND));
        for (i, s) in d.iter().enumerate() {
            let (r, plen) = repr_of(s);
            let (_, qn, msn, mo) = untagged(s);
            assert_eq!((qn, msn, mo as usize), (0, 1, i * ROOM_SEND));
            assert_eq!(r.last, i + 1 == d.len());
            assert_eq!(plen, ROOM_SEND.min(10_000 - i * ROOM_SEND));
            assert!(s.len() + IPV4_UDP_OVERHEAD <= 1500);
        }
        let now = Instant::now();
        // Reversed, holding the first segment back: nothing completes.
        for s in d[1..].iter().rev() {
            b.rx(a.addr, s, now);
        }
        assert!(b.wcs().is_empty());
        assert_eq!(b.qp.in_reassembly(), 1);
        b.rx(a.addr, &d[0], now);
        let wcs = b.wcs();
        assert_eq!(wcs.len(), 1);
        assert_eq!(wcs[0].1.byte_len, 10_000);
        assert_eq!(b.at(0, 10_000), &data[..]);
        assert_eq!(b.qp.in_reassembly(), 0);
        assert_eq!(b.qp.poll_timeout(), None);
    }

    #[test]
    fn ipv6_destinations_get_smaller_segments() {
        let mut a = a();
        a.fill(0, 3000, 1);
        let dest = DgramAddr {
            ip: IpAddr::V6(Ipv6Addr::LOCALHOST),
            port: 1,
            qpn: 0x100,
        };
        a.send(1, 0, 3000, None, dest);
        let d = a.tx();
        assert_eq!(repr_of(&d[0]).1, 1500 - 48 - 22 - 4);
        // An IPv4-mapped destination is IPv4.
        let dest = DgramAddr {
            ip: IpAddr::V6(Ipv4Addr::new(1, 2, 3, 4).to_ipv6_mapped()),
            ..dest
        };
        a.send(2, 0, 3000, None, dest);
        assert_eq!(repr_of(&a.tx()[0]).1, ROOM_SEND);
    }

    #[test]
    fn send_with_immediate_is_data_then_immediate_segment() {
        let (mut a, mut b) = (a(), b());
        let data = a.fill(0, 3000, 5);
        b.recv(1, 0, 4000);
        b.recv(2, 4000, 100);
        a.send(1, 0, 3000, Some(0xdead_beef), b.addr);
        let d = a.tx();
        assert_eq!(d.len(), 3 + 1);
        for s in &d[..3] {
            let (r, _) = repr_of(s);
            assert_eq!((r.opcode, r.last), (Opcode::Send, false));
        }
        let (r, plen) = repr_of(&d[3]);
        assert_eq!((r.opcode, r.last, plen), (Opcode::ImmediateData, true, 0));
        assert_eq!(r.body, RdmapBody::Immediate(0xdead_beef));
        assert_eq!(untagged(&d[3]), (a.addr.qpn, 0, 1, 3000));
        let now = Instant::now();
        // The immediate first: the message is still incomplete.
        b.rx(a.addr, &d[3], now);
        b.rx(a.addr, &d[0], now);
        b.rx(a.addr, &d[2], now);
        assert!(b.wcs().is_empty());
        b.rx(a.addr, &d[1], now);
        let wc = b.wcs()[0].1;
        assert_eq!(
            (wc.wr_id, wc.byte_len, wc.imm),
            (1, 3000, Some(0xdead_beef))
        );
        assert_eq!(b.at(0, 3000), &data[..]);
        // Zero-length with immediate and solicited event: one datagram.
        let wr = SendWr {
            flags: SendFlags {
                solicited: true,
                ..SIGNALED
            },
            ..a.wr(
                2,
                SendOp::Send {
                    imm: Some(7),
                    invalidate: None,
                },
                0,
                0,
            )
        };
        a.qp.post_send(wr, b.addr).unwrap();
        let d = a.tx();
        assert_eq!(d.len(), 1);
        assert_eq!(repr_of(&d[0]).0.opcode, Opcode::ImmediateDataSe);
        b.rx(a.addr, &d[0], now);
        let wc = b.wcs()[0].1;
        assert_eq!(
            (wc.wr_id, wc.byte_len, wc.imm, wc.solicited),
            (2, 0, Some(7), true)
        );
    }

    #[test]
    fn solicited_and_zero_length_sends() {
        let (mut a, mut b) = (a(), b());
        b.recv(1, 0, 10);
        b.recv(2, 10, 10);
        a.fill(0, 5, 1);
        let wr = SendWr {
            flags: SendFlags {
                solicited: true,
                signaled: false,
                fence: false,
            },
            ..a.wr(
                1,
                SendOp::Send {
                    imm: None,
                    invalidate: None,
                },
                0,
                5,
            )
        };
        a.qp.post_send(wr, b.addr).unwrap();
        a.send(2, 0, 0, None, b.addr);
        let d = a.tx();
        assert_eq!(d.len(), 2);
        assert_eq!(repr_of(&d[0]).0.opcode, Opcode::SendSe);
        assert_eq!(repr_of(&d[1]), (repr_of(&d[1]).0, 0));
        // Only the signaled one completes at the sender.
        assert_eq!(a.wcs().len(), 1);
        let now = Instant::now();
        b.rx(a.addr, &d[0], now);
        b.rx(a.addr, &d[1], now);
        let w = b.wcs();
        assert_eq!(
            (w[0].1.wr_id, w[0].1.solicited, w[0].1.byte_len),
            (1, true, 5)
        );
        assert_eq!(
            (w[1].1.wr_id, w[1].1.solicited, w[1].1.byte_len),
            (2, false, 0)
        );
    }

    #[test]
    fn lost_segment_drops_the_message_and_returns_its_receive() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 4000, 9);
        for id in 1..=3 {
            b.recv(id, (id as usize) * 5000, 5000);
        }
        a.send(1, 0, 4000, None, b.addr); // M1: 3 segments
        a.send(2, 0, 10, None, b.addr); // M2: 1 segment
        let d = a.tx();
        assert_eq!(d.len(), 4);
        let t0 = Instant::now();
        b.rx(a.addr, &d[0], t0);
        b.rx(a.addr, &d[2], t0);
        b.rx(a.addr, &d[3], t0);
        let w = b.wcs();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].1.wr_id, 2, "M1 holds receive 1, M2 took receive 2");
        assert_eq!(b.qp.recv_posted(), 1);
        let deadline = t0 + Duration::from_millis(100);
        assert_eq!(b.qp.poll_timeout(), Some(deadline));
        b.qp.handle_timeout(deadline - Duration::from_millis(1));
        assert_eq!(b.qp.stats().rx_timeouts, 0);
        b.qp.handle_timeout(deadline);
        assert_eq!(b.qp.stats().rx_timeouts, 1);
        assert!(b.wcs().is_empty(), "nothing partial is delivered");
        assert_eq!(b.qp.recv_posted(), 2);
        // The late segment of M1 claims nothing.
        b.rx(a.addr, &d[1], deadline);
        assert!(b.wcs().is_empty());
        assert_eq!(b.qp.stats().rx_duplicates, 1);
        // Receive 1 is back at the head, ahead of receive 3.
        a.send(3, 0, 10, None, b.addr);
        a.send(4, 0, 10, None, b.addr);
        for s in a.tx() {
            b.rx(a.addr, &s, deadline);
        }
        let ids: Vec<u64> = b.wcs().iter().map(|w| w.1.wr_id).collect();
        assert_eq!(ids, vec![1, 3]);
    }

    #[test]
    fn returned_receives_keep_posting_order() {
        let mut f = RecvFifo::new(8);
        let wr = |id| RecvWr {
            wr_id: id,
            sgl: SgList::new(),
        };
        for id in 0..5 {
            f.post(wr(id)).unwrap();
        }
        let (s0, w0) = f.take().unwrap();
        let (s1, w1) = f.take().unwrap();
        let (s2, w2) = f.take().unwrap();
        f.give_back(s0, w0);
        f.give_back(s2, w2);
        f.consumed();
        let _ = (s1, w1);
        let ids: Vec<u64> = f.wrs.iter().map(|(_, w)| w.wr_id).collect();
        assert_eq!(ids, vec![0, 2, 3, 4]);
        assert_eq!(f.claimed, 0);
    }

    #[test]
    fn receive_queue_depth_counts_claimed_receives() {
        let (mut a, mut b) = (a(), node([10, 0, 0, 2], 4791, 2, |c| c.rq_depth = 2));
        a.fill(0, 3000, 1);
        b.recv(1, 0, 4000);
        b.recv(2, 4000, 4000);
        a.send(1, 0, 3000, None, b.addr);
        let d = a.tx();
        let now = Instant::now();
        b.rx(a.addr, &d[0], now);
        assert_eq!(b.qp.recv_posted(), 1);
        let sgl = SgList::single(BASE, 1, b.buf);
        assert_eq!(
            b.qp.post_recv(RecvWr { wr_id: 3, sgl }),
            Err(PostError::QueueFull)
        );
        b.rx(a.addr, &d[1], now);
        b.rx(a.addr, &d[2], now);
        assert_eq!(b.wcs().len(), 1);
        assert_eq!(b.qp.post_recv(RecvWr { wr_id: 3, sgl }), Ok(()));
    }

    #[test]
    fn duplicates_are_delivered_once() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 4000, 2);
        for id in 1..=4 {
            b.recv(id, (id as usize) * 5000, 5000);
        }
        a.send(1, 0, 10, None, b.addr);
        a.send(2, 0, 4000, Some(1), b.addr);
        let d = a.tx();
        let now = Instant::now();
        for s in d.iter().chain(d.iter()).chain(d.iter().rev()) {
            b.rx(a.addr, s, now);
        }
        let w = b.wcs();
        assert_eq!(w.len(), 2);
        assert_eq!(b.qp.recv_posted(), 2);
        assert_eq!(b.qp.stats().rx_delivered, 2);
        assert_eq!(b.qp.stats().rx_duplicates, 2 * d.len() as u64);
        // A duplicate of an octet range within a message in progress.
        a.send(3, 0, 4000, None, b.addr);
        let d = a.tx();
        b.rx(a.addr, &d[0], now);
        b.rx(a.addr, &d[0], now);
        assert_eq!(b.qp.stats().rx_duplicates, 2 * 5 + 1);
        b.rx(a.addr, &d[2], now);
        b.rx(a.addr, &d[1], now);
        assert_eq!(b.wcs().len(), 1);
    }

    #[test]
    fn message_longer_than_the_buffer_is_loc_len_err() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 3000, 2);
        b.recv(1, 0, 100);
        b.recv(2, 1000, 5000);
        a.send(1, 0, 3000, None, b.addr);
        a.send(2, 0, 50, None, b.addr);
        let d = a.tx();
        let now = Instant::now();
        // The last segment shows the length first.
        b.rx(a.addr, &d[2], now);
        let w = b.wcs();
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].1.wr_id, w[0].1.status), (1, WcStatus::LocLenErr));
        assert_eq!(w[0].1.src, Some(a.addr));
        // The rest of the message is ignored; the next one gets receive 2.
        for s in &d {
            b.rx(a.addr, s, now);
        }
        let w = b.wcs();
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].1.wr_id, w[0].1.byte_len), (2, 50));
        assert_eq!(b.qp.stats().rx_len_err, 1);
        assert_eq!(b.qp.in_reassembly(), 0);
        // A single-segment message too long for its buffer.
        b.recv(3, 0, 10);
        a.send(3, 0, 11, None, b.addr);
        b.rx(a.addr, &a.tx()[0], now);
        assert_eq!(b.wcs()[0].1.status, WcStatus::LocLenErr);
        // Longer than max_msg at the receiver.
        let mut c = node([10, 0, 0, 3], 4791, 3, |c| c.max_msg = 64);
        c.recv(1, 0, 1000);
        a.send(4, 0, 65, None, c.addr);
        c.rx(a.addr, &a.tx()[0], now);
        assert_eq!(c.wcs()[0].1.status, WcStatus::LocLenErr);
    }

    #[test]
    fn no_posted_receive_drops_the_whole_message() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 3000, 2);
        a.send(1, 0, 3000, None, b.addr);
        let d = a.tx();
        let now = Instant::now();
        b.rx(a.addr, &d[1], now);
        assert_eq!(b.qp.stats().rx_no_recv, 1);
        b.recv(1, 0, 5000);
        b.rx(a.addr, &d[0], now);
        b.rx(a.addr, &d[2], now);
        assert!(b.wcs().is_empty());
        assert_eq!(b.qp.recv_posted(), 1);
        assert_eq!(b.qp.stats().rx_no_recv, 1);
        assert_eq!(b.qp.stats().rx_duplicates, 2);
    }

    #[test]
    fn bad_input_is_counted_and_dropped() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 100, 2);
        b.recv(1, 0, 5000);
        a.send(1, 0, 100, None, b.addr);
        let good = a.tx().remove(0);
        let now = Instant::now();
        let s = |b: &Node| b.qp.stats();
        let mut d = good.clone();
        d[40] ^= 4;
        b.rx(a.addr, &d, now);
        assert_eq!(s(&b).rx_bad_crc, 1);
        b.rx(a.addr, &good[..5], now);
        assert_eq!(s(&b).rx_malformed, 1);
        // Another DQPN.
        let mut d = good.clone();
        d[21] ^= 1;
        fix_crc(&mut d);
        b.rx(a.addr, &d, now);
        assert_eq!(s(&b).rx_bad_dqpn, 1);
        // A different source slot does not matter for an untagged segment
        // but an RsvdULP above 24 bits does.
        let mut d = good.clone();
        d[2] = 1;
        fix_crc(&mut d);
        b.rx(a.addr, &d, now);
        assert_eq!(s(&b).rx_malformed, 2);
        // QN 1.
        let mut d = good.clone();
        d[9] = 1;
        fix_crc(&mut d);
        b.rx(a.addr, &d, now);
        assert_eq!(s(&b).rx_malformed, 3);
        // Send with Invalidate.
        let mut d = good.clone();
        d[1] = 0x44;
        fix_crc(&mut d);
        b.rx(a.addr, &d, now);
        assert_eq!(s(&b).rx_unsupported, 1);
        // Immediate Data without L.
        let mut repr = SegmentRepr::untagged(
            Opcode::ImmediateData,
            0,
            5,
            0,
            false,
            RdmapBody::Immediate(1),
        );
        repr.dqpn = Some(b.addr.qpn);
        let mut d = vec![0u8; 64];
        let n = datagram::emit_into(&repr, &[], &mut d);
        b.rx(a.addr, &d[..n], now);
        assert_eq!(s(&b).rx_malformed, 4);
        // A Read Request.
        let mut repr = SegmentRepr::untagged(
            Opcode::ReadRequest,
            1,
            1,
            0,
            true,
            RdmapBody::ReadRequest(softrdma_wire::rdmap::ReadRequest {
                sink_stag: 1,
                sink_to: 0,
                size: 8,
                src_stag: b.buf,
                src_to: BASE,
            }),
        );
        repr.dqpn = Some(b.addr.qpn);
        let n = datagram::emit_into(&repr, &[], &mut d);
        b.rx(a.addr, &d[..n], now);
        assert_eq!(s(&b).rx_unsupported, 2);
        // Without DQPN.
        let mut repr = SegmentRepr::untagged(Opcode::Send, 0, 9, 0, true, RdmapBody::None);
        set_rsvd_ulp(&mut repr, a.addr.qpn);
        let n = datagram::emit_into(&repr, b"hi", &mut d);
        b.rx(a.addr, &d[..n], now);
        assert_eq!(s(&b).rx_bad_dqpn, 2);
        assert!(b.wcs().is_empty());
        assert_eq!(s(&b).rx_datagrams, 9);
        // Still working.
        b.rx(a.addr, &good, now);
        assert_eq!(b.wcs().len(), 1);
        // A default QP takes segments without DQPN.
        let mut c = node([10, 0, 0, 3], 4791, 3, |c| c.accept_without_dqpn = true);
        c.recv(1, 0, 10);
        c.rx(a.addr, &d[..n], now);
        assert_eq!(c.wcs()[0].1.byte_len, 2);
    }

    #[test]
    fn rdma_write_is_placed_in_any_order() {
        let (mut a, mut b) = (a(), b());
        let data = a.fill(0, 5000, 4);
        let wr = a.wr(
            1,
            SendOp::Write {
                remote_addr: BASE + 100,
                rkey: b.buf,
                imm: None,
            },
            0,
            5000,
        );
        a.qp.post_send(wr, b.addr).unwrap();
        let d = a.tx();
        assert_eq!(d.len(), 5000usize.div_ceil(ROOM_TAGGED));
        for (i, s) in d.iter().enumerate() {
            assert_eq!(s[0] & 0xF0, if i + 1 == d.len() { 0xF0 } else { 0xB0 });
            let (r, _) = repr_of(s);
            let DdpHeader::Tagged { stag, to, ext } = r.ddp else {
                panic!("untagged")
            };
            let off = (i * ROOM_TAGGED) as u64;
            assert_eq!((stag, to), (b.buf, BASE + 100 + off));
            assert_eq!(
                ext,
                Some(TaggedExt {
                    msn: 1,
                    mo: off as u32
                })
            );
            assert_eq!(r.dqpn, Some((1 << 24) | b.addr.qpn));
            assert_eq!(dqpn_of(s), Some(b.addr.qpn));
        }
        assert_eq!(a.wcs()[0].1.opcode, WcOpcode::RdmaWrite);
        let now = Instant::now();
        for s in d.iter().rev() {
            b.rx(a.addr, s, now);
        }
        assert_eq!(b.at(100, 5000), &data[..]);
        assert!(
            b.wcs().is_empty(),
            "a Write completes nothing at the target"
        );
        assert_eq!(b.qp.stats().rx_write_segments, d.len() as u64);
    }

    #[test]
    fn remote_access_violations_are_events_and_the_qp_goes_on() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 64, 4);
        let ro = b.mem.register(0, 0x900_0000, 4096, Access::REMOTE_READ);
        let other_pd = b.mem.register(7, 0xA00_0000, 4096, Access::REMOTE_WRITE);
        let cases = [
            (b.buf ^ 0x80, BASE, MemError::InvalidStag),
            (b.buf, BASE + (1 << 20) - 10, MemError::BaseBounds),
            (ro, 0x900_0000, MemError::AccessRights),
            (other_pd, 0xA00_0000, MemError::WrongPd),
        ];
        let before = b.mem.clone();
        let now = Instant::now();
        for (i, &(rkey, to, err)) in cases.iter().enumerate() {
            let op = if i % 2 == 0 {
                SendOp::Write {
                    remote_addr: to,
                    rkey,
                    imm: None,
                }
            } else {
                SendOp::WriteRecord {
                    remote_addr: to,
                    rkey,
                }
            };
            let wr = a.wr(i as u64, op, 0, 64);
            a.qp.post_send(wr, b.addr).unwrap();
            for s in a.tx() {
                b.rx(a.addr, &s, now);
            }
            let ev = b.qp.poll_event().expect("event");
            assert_eq!(
                ev,
                UdEvent::RemoteAccess {
                    src: a.addr,
                    opcode: if i % 2 == 0 {
                        Opcode::RdmaWrite
                    } else {
                        Opcode::WriteRecord
                    },
                    msn: i as u32 + 1,
                    stag: rkey,
                    to,
                    len: 64,
                    error: err,
                }
            );
        }
        for s in [b.buf, ro, other_pd] {
            assert_eq!(b.mem.bytes(s), before.bytes(s));
        }
        assert_eq!(b.qp.stats().rx_access_errors, 4);
        assert!(b.wcs().is_empty());
        // The event queue is bounded.
        let mut c = node([10, 0, 0, 3], 4791, 3, |c| c.event_depth = 1);
        for i in 0..3 {
            let wr = a.wr(
                i,
                SendOp::Write {
                    remote_addr: 0,
                    rkey: 0,
                    imm: None,
                },
                0,
                1,
            );
            a.qp.post_send(wr, c.addr).unwrap();
        }
        for s in a.tx() {
            c.rx(a.addr, &s, now);
        }
        assert_eq!(c.qp.stats().events_lost, 2);
        // Sends still work.
        b.recv(1, 0, 100);
        a.send(9, 0, 10, None, b.addr);
        b.rx(a.addr, &a.tx()[0], now);
        assert_eq!(b.wcs()[0].1.status, WcStatus::Success);
    }

    #[test]
    fn write_record_is_logged_without_a_receive() {
        let (mut a, mut b) = (a(), b());
        let data = a.fill(0, 4000, 8);
        let wr = a.wr(
            5,
            SendOp::WriteRecord {
                remote_addr: BASE + 0x1000,
                rkey: b.buf,
            },
            0,
            4000,
        );
        a.qp.post_send(wr, b.addr).unwrap();
        let d = a.tx();
        assert_eq!(d.len(), 3);
        assert!(d.iter().all(|s| s[1] == 0x4C && s[0] & 0x30 == 0x30));
        assert_eq!(a.wcs()[0].1.opcode, WcOpcode::WriteRecord);
        let now = Instant::now();
        b.rx(a.addr, &d[2], now);
        b.rx(a.addr, &d[0], now);
        assert!(b.wcs().is_empty());
        assert!(b.qp.record_tracker().is_valid(b.buf, BASE + 0x1000, 1442));
        assert!(!b.qp.record_tracker().is_valid(b.buf, BASE + 0x1000, 1443));
        b.rx(a.addr, &d[1], now);
        let w = b.wcs();
        assert_eq!(w.len(), 1);
        let (kind, wc) = w[0];
        assert_eq!(kind, CqKind::Recv);
        assert_eq!(
            (wc.opcode, wc.status),
            (WcOpcode::RecvWriteRecord, WcStatus::Success)
        );
        assert_eq!(wc.src, Some(a.addr), "tagged source QPN = port << 8 | slot");
        let rec = wc.record.expect("record info");
        assert_eq!(
            (rec.stag, rec.to, rec.len, rec.msn),
            (b.buf, BASE + 0x1000, 4000, 1)
        );
        assert_eq!(b.at(0x1000, 4000), &data[..]);
        assert!(b.qp.record_tracker().is_valid(b.buf, BASE + 0x1000, 4000));
        assert_eq!(b.qp.stats().rx_record_segments, 3);
        // Duplicates are neither recorded twice nor placed again: what
        // the application wrote after the completion stays.
        let reused = b.fill(0x1000, 4000, 77);
        for s in &d {
            b.rx(a.addr, s, now);
        }
        assert!(b.wcs().is_empty());
        assert_eq!(b.qp.record_stats().duplicates, 3);
        assert_eq!(b.at(0x1000, 4000), &reused[..], "a duplicate was placed");
        assert_eq!(b.qp.stats().rx_no_recv, 0);
        // Zero-length Write-Record: one segment, one record.
        let wr = a.wr(
            6,
            SendOp::WriteRecord {
                remote_addr: BASE,
                rkey: b.buf,
            },
            0,
            0,
        );
        a.qp.post_send(wr, b.addr).unwrap();
        let d = a.tx();
        assert_eq!(d.len(), 1);
        b.rx(a.addr, &d[0], now);
        let wc = b.wcs()[0].1;
        assert_eq!(wc.record.map(|r| (r.len, r.msn)), Some((0, 2)));
    }

    #[test]
    fn a_late_segment_of_a_retired_record_changes_no_memory() {
        // Reordering: the first segment of message 2 overtakes the tail of
        // message 1, which it retires (partial). The tail arrives next: the
        // tracker drops it as stale, and memory must not hold it either —
        // the validity map and the partial record describe memory exactly.
        let (mut a, mut b) = (a(), b());
        let data = a.fill(0, 4000, 8);
        let write = |a: &Node, id, off: u64| {
            a.wr(
                id,
                SendOp::WriteRecord {
                    remote_addr: BASE + off,
                    rkey: b.buf,
                },
                0,
                4000,
            )
        };
        a.qp.post_send(write(&a, 1, 0x1000), b.addr).unwrap();
        let m1 = a.tx();
        a.qp.post_send(write(&a, 2, 0x4000), b.addr).unwrap();
        let m2 = a.tx();
        assert_eq!((m1.len(), m2.len()), (3, 3));
        let before = b.at(0x1000, 4000).to_vec();
        let now = Instant::now();
        b.rx(a.addr, &m1[0], now);
        b.rx(a.addr, &m2[0], now);
        b.rx(a.addr, &m1[1], now);
        b.rx(a.addr, &m1[2], now);
        assert_eq!(b.qp.record_stats().retired_by_newer_msn, 1);
        assert_eq!(b.qp.record_stats().stale_segments, 2);
        assert_eq!(b.at(0x1000, 1442), &data[..1442], "the head was placed");
        assert_eq!(
            b.at(0x1000 + 1442, 4000 - 1442),
            &before[1442..],
            "the stale tail was not"
        );
        let t = b.qp.record_tracker();
        assert!(t.is_valid(b.buf, BASE + 0x1000, 1442));
        assert!(!t.is_valid(b.buf, BASE + 0x1000 + 1442, 1));
        let w = b.wcs();
        assert_eq!(w.len(), 1, "message 1 reported once, as partial");
        assert_eq!(w[0].1.status, WcStatus::RecordPartial);
        // Message 2 goes on as if nothing happened.
        b.rx(a.addr, &m2[1], now);
        b.rx(a.addr, &m2[2], now);
        assert_eq!(b.at(0x4000, 4000), &data[..]);
        assert_eq!(b.wcs()[0].1.status, WcStatus::Success);
    }

    #[test]
    fn record_and_send_completions_keep_arrival_order() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 100, 1);
        b.recv(1, 0, 100);
        let rec = |id| a_wr_record(id, b.buf);
        a.qp.post_send(a.wr(1, rec(1), 0, 10), b.addr).unwrap();
        a.send(2, 0, 10, None, b.addr);
        a.qp.post_send(a.wr(3, rec(3), 0, 10), b.addr).unwrap();
        let now = Instant::now();
        for s in a.tx() {
            b.rx(a.addr, &s, now);
        }
        let ops: Vec<WcOpcode> = b.wcs().iter().map(|w| w.1.opcode).collect();
        assert_eq!(
            ops,
            vec![
                WcOpcode::RecvWriteRecord,
                WcOpcode::Recv,
                WcOpcode::RecvWriteRecord
            ]
        );
    }

    fn a_wr_record(id: u64, rkey: u32) -> SendOp {
        SendOp::WriteRecord {
            remote_addr: BASE + 0x1000 * id,
            rkey,
        }
    }

    #[test]
    fn write_record_partial_after_timeout() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 4000, 8);
        let wr = a.wr(
            5,
            SendOp::WriteRecord {
                remote_addr: BASE,
                rkey: b.buf,
            },
            0,
            4000,
        );
        a.qp.post_send(wr, b.addr).unwrap();
        let d = a.tx();
        let t0 = Instant::now();
        b.rx(a.addr, &d[0], t0);
        b.rx(a.addr, &d[2], t0);
        let t = b.qp.poll_timeout().expect("tracker deadline");
        b.qp.handle_timeout(t);
        let wc = b.wcs()[0].1;
        assert_eq!(wc.status, WcStatus::RecordPartial);
        let rec = wc.record.unwrap();
        assert_eq!(
            &rec.ranges[..usize::from(rec.n_ranges)],
            &[(0, 1442), (2884, 4000 - 2884)]
        );
    }

    #[test]
    fn qps_sharing_a_socket_are_told_apart() {
        let mut a1 = a();
        let mut a2 = node([10, 0, 0, 1], 4791, 7, |_| {});
        let mut b = b();
        let r1 = b.mem.register(0, 0x200_0000, 100, Access::REMOTE_WRITE);
        a1.fill(0, 10, 1);
        a2.fill(0, 10, 2);
        let now = Instant::now();
        for (n, stag) in [(&mut a1, b.buf), (&mut a2, r1)] {
            let to = if stag == b.buf { BASE } else { 0x200_0000 };
            let wr = n.wr(
                1,
                SendOp::WriteRecord {
                    remote_addr: to,
                    rkey: stag,
                },
                0,
                10,
            );
            n.qp.post_send(wr, b.addr).unwrap();
            let d = n.tx();
            let from = n.addr;
            b.rx(from, &d[0], now);
        }
        let w = b.wcs();
        assert_eq!(w.len(), 2, "same T-MSN, different source slots");
        assert_eq!(w[0].1.src, Some(a1.addr));
        assert_eq!(w[1].1.src, Some(a2.addr));
        // Sends from both, same MSN 1: two messages.
        b.recv(1, 0, 100);
        b.recv(2, 100, 100);
        a1.send(2, 0, 10, None, b.addr);
        a2.send(2, 0, 10, None, b.addr);
        let (d1, d2) = (a1.tx(), a2.tx());
        b.rx(a1.addr, &d1[0], now);
        b.rx(a2.addr, &d2[0], now);
        let srcs: Vec<_> = b.wcs().iter().map(|w| w.1.src).collect();
        assert_eq!(srcs, vec![Some(a1.addr), Some(a2.addr)]);
    }

    #[test]
    fn grh_in_front_of_the_payload() {
        let mut a = a();
        let mut b = node([10, 0, 0, 2], 4791, 2, |c| {
            c.grh = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)))
        });
        let data = a.fill(0, 3000, 6);
        b.recv(1, 0, 3040);
        b.recv(2, 4000, 39);
        b.recv(3, 5000, 140);
        a.send(1, 0, 3000, Some(42), b.addr);
        a.send(2, 0, 0, None, b.addr);
        a.send(3, 0, 101, None, b.addr);
        // An IPv4-mapped source is reported as IPv4.
        let from = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
        for s in a.tx() {
            b.qp.handle_datagram(from, a.addr.port, &s, &mut b.mem, Instant::now());
        }
        let w = b.wcs();
        assert_eq!(w.len(), 3);
        let wc = w[0].1;
        assert_eq!((wc.wr_id, wc.byte_len, wc.imm), (1, 3040, Some(42)));
        assert_eq!(wc.src, Some(a.addr));
        let h = b.at(0, 40);
        assert_eq!(h[0] >> 4, 6, "IPVer");
        assert_eq!(&h[1..4], &[0, 0, 0]);
        assert_eq!(u16::from_be_bytes([h[4], h[5]]), 3000, "PayLen");
        assert_eq!((h[6], h[7]), (0x1B, 64));
        assert_eq!(
            &h[8..24],
            &Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets()
        );
        assert_eq!(
            &h[24..40],
            &Ipv4Addr::new(10, 0, 0, 2).to_ipv6_mapped().octets()
        );
        assert_eq!(b.at(40, 3000), &data[..]);
        // 39 octets cannot take the GRH; 140 cannot take 40 + 101.
        assert_eq!((w[1].1.wr_id, w[1].1.status), (2, WcStatus::LocLenErr));
        assert_eq!((w[2].1.wr_id, w[2].1.status), (3, WcStatus::LocLenErr));
        assert_eq!(grh_header(from, from, 1 << 20)[4..6], [0xFF, 0xFF]);
    }

    #[test]
    fn reassembly_table_is_bounded() {
        let mut a = a();
        let mut b = node([10, 0, 0, 2], 4791, 2, |c| c.max_reassembly = 2);
        a.fill(0, 3000, 1);
        for id in 1..=3 {
            b.recv(id, id as usize * 4000, 4000);
            a.send(id, 0, 3000, None, b.addr);
        }
        let d = a.tx();
        let t0 = Instant::now();
        // First segment of each message: the third evicts the first.
        for (i, k) in [0usize, 3, 6].iter().enumerate() {
            b.rx(a.addr, &d[*k], t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(b.qp.stats().rx_evicted, 1);
        assert_eq!(b.qp.in_reassembly(), 2);
        // Message 1's receive went back and message 3 took it.
        for k in [7, 8, 1, 2] {
            b.rx(a.addr, &d[k], t0);
        }
        let w = b.wcs();
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].1.wr_id, w[0].1.byte_len), (1, 3000));
        assert_eq!(b.qp.stats().rx_duplicates, 2);
    }

    #[test]
    fn would_block_keeps_segments_pending() {
        let (mut a, mut b) = (a(), b());
        let data = a.fill(0, 7000, 3);
        b.recv(1, 0, 8000);
        a.send(1, 0, 7000, None, b.addr);
        let mut sink = VecSink {
            budget: Some(2),
            ..VecSink::default()
        };
        assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 2);
        assert!(
            a.wcs().is_empty(),
            "not complete before every datagram left"
        );
        assert!(a.qp.wants_transmit());
        sink.budget = Some(0);
        assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 0);
        sink.budget = None;
        assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 3);
        assert_eq!(a.wcs().len(), 1);
        assert_eq!(sink.out.len(), 5);
        assert!(sink.out.iter().all(|(d, _)| *d == (b.addr.ip, b.addr.port)));
        for (_, s) in &sink.out {
            b.rx(a.addr, s, Instant::now());
        }
        assert_eq!(b.wcs()[0].1.byte_len, 7000);
        assert_eq!(b.at(0, 7000), &data[..]);
        assert_eq!(a.qp.stats().tx_datagrams, 5);
    }

    #[test]
    fn large_batches_span_requests() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 60_000, 3);
        for i in 0..4 {
            b.recv(i, i as usize * 60_000, 60_000);
            a.send(i, 0, 60_000, None, b.addr);
        }
        let d = a.tx();
        assert_eq!(d.len(), 4 * 60_000usize.div_ceil(ROOM_SEND));
        assert_eq!(a.wcs().len(), 4);
        for s in d.iter().rev() {
            b.rx(a.addr, s, Instant::now());
        }
        assert_eq!(b.wcs().len(), 4);
        assert_eq!(b.at(3 * 60_000, 60_000), a.at(0, 60_000));
    }

    #[test]
    fn socket_errors_fail_one_request() {
        let (mut a, b) = (a(), b());
        a.fill(0, 3000, 3);
        a.send(1, 0, 3000, None, b.addr);
        a.send(2, 0, 10, None, b.addr);
        let mut sink = VecSink {
            fail_next: Some(io::ErrorKind::ConnectionRefused),
            ..VecSink::default()
        };
        assert!(a.qp.poll_transmit(&a.mem, &mut sink).is_err());
        assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 1);
        let w = a.wcs();
        assert_eq!((w[0].1.wr_id, w[0].1.status), (1, WcStatus::GeneralErr));
        assert_eq!((w[1].1.wr_id, w[1].1.status), (2, WcStatus::Success));
        assert_eq!(a.qp.stats().tx_errors, 1);
    }

    #[test]
    fn bad_gather_list_is_loc_prot_err() {
        let (mut a, b) = (a(), b());
        a.fill(0, 10, 3);
        let mut wr = a.wr(
            1,
            SendOp::Send {
                imm: None,
                invalidate: None,
            },
            0,
            10,
        );
        wr.payload = Payload::Sgl(SgList::single(BASE, 10, a.buf ^ 0x80));
        wr.flags.signaled = false;
        a.qp.post_send(wr, b.addr).unwrap();
        a.send(2, 0, 10, None, b.addr);
        // Inline data needs no memory.
        let mut wr = a.wr(
            3,
            SendOp::Send {
                imm: None,
                invalidate: None,
            },
            0,
            0,
        );
        wr.payload = Payload::Inline(InlineData::new(b"inline!").unwrap());
        a.qp.post_send(wr, b.addr).unwrap();
        let d = a.tx();
        assert_eq!(d.len(), 2);
        assert_eq!(&d[1][22..29], b"inline!");
        let w = a.wcs();
        assert_eq!((w[0].1.wr_id, w[0].1.status), (1, WcStatus::LocProtErr));
        assert_eq!((w[1].1.wr_id, w[1].1.status), (2, WcStatus::Success));
        assert_eq!((w[2].1.wr_id, w[2].1.byte_len), (3, 7));
    }

    #[test]
    fn bad_receive_buffer_is_loc_prot_err() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 10, 3);
        let sgl = SgList::single(BASE, 100, b.buf ^ 0x80);
        b.qp.post_recv(RecvWr { wr_id: 1, sgl }).unwrap();
        a.send(1, 0, 10, None, b.addr);
        b.rx(a.addr, &a.tx()[0], Instant::now());
        assert_eq!(b.wcs()[0].1.status, WcStatus::LocProtErr);
        assert_eq!(b.qp.stats().rx_prot_err, 1);
    }

    #[test]
    fn post_send_refusals() {
        let (mut a, b) = (a(), b());
        let refused = |a: &mut Node, op: SendOp| {
            let wr = a.wr(1, op, 0, 8);
            a.qp.post_send(wr, b.addr)
        };
        use PostError::{Invalid, Unsupported};
        let cases = [
            SendOp::Send {
                imm: None,
                invalidate: Some(1),
            },
            SendOp::Write {
                remote_addr: 0,
                rkey: 1,
                imm: Some(1),
            },
            SendOp::Read {
                remote_addr: 0,
                rkey: 1,
            },
            SendOp::FetchAdd {
                remote_addr: 0,
                rkey: 1,
                add: 1,
            },
            SendOp::CompareSwap {
                remote_addr: 0,
                rkey: 1,
                compare: 0,
                swap: 1,
            },
            SendOp::LocalInvalidate { stag: 1 },
        ];
        for op in cases {
            assert_eq!(refused(&mut a, op), Err(Unsupported), "{op:?}");
        }
        let send = SendOp::Send {
            imm: None,
            invalidate: None,
        };
        let wr = a.wr(1, send, 0, (64 << 10) + 1);
        assert_eq!(a.qp.post_send(wr, b.addr), Err(Invalid));
        let wr = a.wr(1, send, 0, 1);
        let far = DgramAddr {
            qpn: 1 << 24,
            ..b.addr
        };
        assert_eq!(a.qp.post_send(wr, far), Err(Invalid));
        let mut c = node([1, 1, 1, 1], 1, 1, |c| c.sq_depth = 1);
        let wr = c.wr(1, send, 0, 1);
        assert_eq!(c.qp.post_send(wr, b.addr), Ok(()));
        assert_eq!(c.qp.post_send(wr, b.addr), Err(PostError::QueueFull));
        assert!(a.tx().is_empty());
    }

    #[test]
    fn dqpn_peek() {
        let mut out = [0u8; 128];
        for (tagged, x) in [(false, false), (true, false), (true, true)] {
            let mut repr = if tagged {
                SegmentRepr::tagged(Opcode::RdmaWrite, 1, 2, true)
            } else {
                SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None)
            };
            if x {
                repr.ddp = DdpHeader::Tagged {
                    stag: 1,
                    to: 2,
                    ext: Some(TaggedExt { msn: 3, mo: 4 }),
                };
            }
            let n = datagram::emit_into(&repr, b"p", &mut out);
            assert_eq!(dqpn_of(&out[..n]), None);
            repr.dqpn = Some(0xAB12_3456);
            let n = datagram::emit_into(&repr, &[], &mut out);
            assert_eq!(dqpn_of(&out[..n]), Some(0x12_3456));
            assert_eq!(dqpn_of(&out[..n - 1]), None, "no room for the CRC");
            let mut v = out[..n].to_vec();
            v[0] = (v[0] & !0x03) | 2;
            assert_eq!(dqpn_of(&v), None, "DV 2");
        }
        assert_eq!(dqpn_of(&[]), None);
    }

    #[test]
    fn source_window_marks_slides_and_restarts() {
        let addr = DgramAddr {
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 1,
            qpn: 1,
        };
        let mut w = SrcWin {
            addr,
            highest: u32::MAX - 2,
            bits: [0; WIN_WORDS],
            used: 0,
        };
        w.mark(u32::MAX - 2);
        assert!(w.is_done(u32::MAX - 2));
        assert!(!w.is_done(u32::MAX - 1));
        w.mark(1); // across the wrap
        assert!(w.is_done(1) && w.is_done(u32::MAX - 2));
        assert!(!w.is_done(0) && !w.is_done(u32::MAX));
        w.mark(0);
        assert!(w.is_done(0));
        // Slide: the bit for an MSN that left the window is cleared.
        w.mark(1 + DEDUP_WINDOW - 1);
        assert!(w.is_done(1) && !w.is_done(u32::MAX - 2));
        w.mark(1 + DEDUP_WINDOW);
        assert!(!w.is_done(1), "left the window");
        assert!(!w.is_done(1 + DEDUP_WINDOW + 1));
        // Within the window behind: just marked.
        w.mark(5);
        assert_eq!(w.highest, 1 + DEDUP_WINDOW);
        // Far behind: a restarted sender.
        w.mark(u32::MAX - 10);
        assert!(w.is_done(u32::MAX - 10));
        assert!(!w.is_done(1 + DEDUP_WINDOW) && !w.is_done(5));
        assert_eq!(w.highest, u32::MAX - 10);
    }

    #[test]
    fn sources_are_bounded_lru() {
        let mut a = a();
        let mut b = node([10, 0, 0, 2], 4791, 2, |c| c.max_sources = 2);
        a.fill(0, 10, 1);
        b.recv(1, 0, 100);
        a.send(1, 0, 10, None, b.addr);
        let d = a.tx().remove(0);
        let now = Instant::now();
        b.rx(a.addr, &d, now);
        b.rx(a.addr, &d, now);
        assert_eq!(b.qp.stats().rx_duplicates, 1);
        // Two more sources push the first out; its duplicate is new again.
        for port in [1, 2] {
            let mut c = node([10, 0, 0, 9], port, 1, |_| {});
            c.fill(0, 1, 1);
            b.recv(9, 200, 100);
            c.send(1, 0, 1, None, b.addr);
            b.rx(c.addr, &c.tx()[0], now);
        }
        b.recv(2, 0, 100);
        b.rx(a.addr, &d, now);
        assert_eq!(b.qp.stats().rx_delivered, 4);
        assert_eq!(b.qp.sources.len(), 2);
    }

    #[test]
    fn frags_merge_and_bound() {
        let mut f = Frags::EMPTY;
        f.add(10, 20);
        f.add(30, 40);
        assert!(f.covers(12, 18) && !f.covers(15, 35) && f.covers(5, 5));
        f.add(20, 30);
        assert_eq!(f.as_slice(), &[(10, 40)]);
        f.add(0, 10);
        assert!(f.complete(40) && !f.complete(41));
        let mut f = Frags::EMPTY;
        for i in 0..MAX_REASM_FRAGMENTS as u32 {
            assert!(f.can_add(i * 10, i * 10 + 5));
            f.add(i * 10, i * 10 + 5);
        }
        assert!(!f.can_add(1000, 1001));
        assert!(f.can_add(5, 10), "fills a gap");
        f.add(5, 10);
        assert_eq!(f.n, MAX_REASM_FRAGMENTS - 1);
        assert!(Frags::EMPTY.complete(0));
    }

    #[test]
    fn fragment_bound_drops_segments_not_messages() {
        let mut a = a();
        let mut b = node([10, 0, 0, 2], 4791, 2, |_| {});
        let data = a.fill(0, 200 * 100, 1);
        // A 200-octet MTU budget makes small segments.
        let mut a2 = node([10, 0, 0, 1], 4791, 1, |c| c.mtu = 28 + 22 + 4 + 100);
        a2.mem = a.mem.clone();
        a2.buf = a.buf;
        b.recv(1, 0, 20_000);
        a2.send(1, 0, 20_000, None, b.addr);
        let d = a2.tx();
        assert_eq!(d.len(), 200);
        let now = Instant::now();
        // Every other segment: 33rd disjoint range is refused.
        for s in d.iter().step_by(2).take(MAX_REASM_FRAGMENTS + 1) {
            b.rx(a.addr, s, now);
        }
        assert_eq!(b.qp.stats().rx_fragment_overflow, 1);
        for s in &d {
            b.rx(a.addr, s, now);
        }
        let w = b.wcs();
        assert_eq!(w.len(), 1);
        assert_eq!(b.at(0, 20_000), &data[..]);
    }

    #[test]
    fn inconsistent_segments_are_ignored() {
        let (mut a, mut b) = (a(), b());
        a.fill(0, 3000, 1);
        b.recv(1, 0, 10_000);
        a.send(1, 0, 3000, None, b.addr);
        let d = a.tx();
        let now = Instant::now();
        b.rx(a.addr, &d[1], now);
        b.rx(a.addr, &d[2], now);
        // An L segment that ends elsewhere: the middle one with L set.
        let mut x = d[1].clone();
        x[0] |= 0x40;
        fix_crc(&mut x);
        b.rx(a.addr, &x, now);
        // An Immediate Data L segment after a Send L segment.
        let mut repr = SegmentRepr::untagged(
            Opcode::ImmediateData,
            0,
            1,
            3000,
            true,
            RdmapBody::Immediate(9),
        );
        set_rsvd_ulp(&mut repr, a.addr.qpn);
        repr.dqpn = Some(b.addr.qpn);
        let mut out = [0u8; 64];
        let n = datagram::emit_into(&repr, &[], &mut out);
        b.rx(a.addr, &out[..n], now);
        // A segment past the known end.
        let mut y = d[0].clone();
        y[14..18].copy_from_slice(&3000u32.to_be_bytes());
        fix_crc(&mut y);
        b.rx(a.addr, &y, now);
        assert_eq!(b.qp.stats().rx_inconsistent, 3);
        b.rx(a.addr, &d[0], now);
        let w = b.wcs();
        assert_eq!((w[0].1.byte_len, w[0].1.imm), (3000, None));
    }
}
