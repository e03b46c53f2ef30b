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
//!   memory and CRC trailer; a lone small datagram copied whole),
//!   [`UdQp::poll_completion`],
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
//! # Conventions
//!
//! The wire conventions this module implements (DQPN word and source slot,
//! source QPN, sequence numbers, Send with immediate, segment sizes, RDMA
//! Write over UD, what a UD receiver drops) are written down in
//! `docs/datagram.md` §10, "UD conventions".
//!
//! # Layout
//!
//! This file holds the constants, configuration, statistics, events and
//! the queue pair's state and API. Beside it: `tx` (planning, framing
//! and offering datagrams), `rx` (checking, placing and reassembling),
//! `reasm` (fragment ranges and the duplicate window). What UD shares
//! with RD lives in [`crate::dgram`] and is re-exported here.

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

use crate::dgram::record::{RecordConfig, RecordStats, Tracker};
use crate::dgram::{offer, offer_staged, set_rsvd_ulp, RecvFifo, STAGE_MIN_BATCH};
use crate::memory::{gather_into, payload_pieces, scatter, MemError, Memory};
use crate::wr::{
    CqKind, DgramAddr, Payload, PostError, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
    WorkCompletion, MAX_SGE,
};

mod reasm;
mod rx;
mod tx;

pub use crate::dgram::{Datagram, DatagramSink, TX_BATCH};
use reasm::{Frags, Reasm, RxSeg, SrcWin};

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
    /// `STAGE_CAP` octets from the first batch of datagrams staged on
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
        self.rq.len()
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
}

#[cfg(test)]
mod tests;
