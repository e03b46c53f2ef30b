//! The reliable-datagram (RD) queue pair over UDP, sans-IO.
//!
//! [`RdQp`] runs RDMAP over the RD reliability layer ([`crate::rd`]): every
//! datagram is the RD shim, one DDP segment laid out as on a UD QP
//! (`docs/datagram.md` §10: Q = 1 with the DQPN word, X on tagged
//! segments) and the CRC32C; ACK-only control datagrams are the shim and
//! the CRC. It owns no socket and reads no clock:
//!
//! * in: [`RdQp::post_send`] (with the destination of each work request),
//!   [`RdQp::post_recv`], [`RdQp::handle_datagram`],
//!   [`RdQp::handle_timeout`], [`RdQp::set_now`];
//! * out: [`RdQp::poll_transmit`] (hands datagrams to a [`DatagramSink`],
//!   first transmission or retransmission alike: from five planned
//!   datagrams on, as many as fit framed whole into a staging buffer as
//!   UD's are; the others gathered as shim + header, payload slices of
//!   registered memory and CRC),
//!   [`RdQp::poll_completion`], [`RdQp::poll_event`], [`RdQp::poll_timeout`].
//!
//! It implements [`DatagramQp`], the engine's one interface to datagram
//! QPs. `post_send` and `poll_transmit` take no `now` there: the QP uses
//! the latest instant it was given (`handle_datagram`, `handle_timeout`,
//! [`DatagramQp::set_now`]), so the engine calls `set_now` before them
//! ([`RdQp::post_send_at`] and [`RdQp::poll_transmit_at`] do both).
//!
//! # How segments become tokens
//!
//! The reliability layer sequences [`Token`]s: (send-queue slot or inbound
//! slot, generation, segment number). The QP hands a work request's
//! segments to [`RdEndpoint::send`] as it goes (at most a window's worth
//! per peer ahead of the acknowledgements, so the layer's queues stay
//! short), Terminates to [`RdEndpoint::send_report`], and when the
//! endpoint asks for a token's datagram it rebuilds that exact segment
//! from the work request (headers, offsets, MSNs fixed when the request
//! started) and the registered memory. A slot is reused only when every
//! token of it was acknowledged or abandoned, and the generation makes a
//! stale token harmless.
//!
//! # RD QP semantics
//!
//! What an RD QP promises on the wire and to its user (the segment layout
//! it shares with UD, ordering and exactly-once delivery per peer, the
//! completion rules, errors found by the target and how their Terminate is
//! never overtaken by the ACK of what it reports, Reads and atomics, and
//! the reliability layer's *reports*) is `docs/datagram.md` §11, the
//! specification this module implements.
//!
//! # Layout
//!
//! This file holds the configuration, statistics and the queue pair's
//! state and API. Beside it: `slots` (send and inbound slot tables and
//! their per-peer FIFOs), `peer` (per-peer QP state), `pump` (work into
//! the reliability endpoint), `settle` (acknowledged or failed tokens
//! into completions), `tx` (datagrams out), `rx` (Sends and Terminates
//! in) and `rx_tagged` (Writes, Reads, atomics and their responses in).

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use softrdma_wire::datagram::{self, CRC_LEN, IPV4_UDP_OVERHEAD, IPV6_UDP_OVERHEAD};
use softrdma_wire::ddp::{DdpHeader, TaggedExt};
use softrdma_wire::rd::{self as wrd, MAX_QPN, SHIM_LEN};
use softrdma_wire::rdmap::{
    self, AtomicOp as WireAtomicOp, AtomicRequest, AtomicResponse, EchoedHeader, Opcode, RdmapBody,
    ReadRequest, SegmentRepr, TerminateCause, TerminateRepr,
};
use softrdma_wire::Error as WireError;

use crate::dgram::record::{RecordConfig, RecordStats, Tracker};
use crate::dgram::{
    offer, offer_staged, set_rsvd_ulp, DatagramSink, RecvFifo, STAGE_MIN_BATCH, TX_BATCH,
};
use crate::dgram::{DatagramQp, DgramEvent};
use crate::memory::{payload_pieces, scatter, AtomicOp, Memory};
use crate::rd::{
    seq_after, Event, RdConfig, RdConfigError, RdEndpoint, RdStats, SendError, Transmit, Verdict,
};
use crate::ud::{grh_header, GRH_LEN, MAX_MTU, MIN_MTU};
use crate::util::peers::PeerTable;
use crate::wr::{
    CqKind, DgramAddr, Payload, PostError, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
    WorkCompletion, MAX_SGE,
};

mod peer;
mod pump;
mod rx;
mod rx_tagged;
mod settle;
mod slots;
mod tx;

use peer::{PeerState, RxMsg};
use rx::{echo_of, status_of};
pub use slots::Token;
use slots::{fifo_push, fifo_unlink, InEntry, InKind, InSlot, Kind, Source, SqEntry, SqSlot};

/// Largest [`RdQpConfig::max_msg`]: T-MO and the Read size are 32 bits.
pub const MAX_MSG_LIMIT: u64 = u32::MAX as u64;

/// The QP a datagram of either framing is addressed to, without checking
/// the CRC: the shim's DQPN for RD (octet 0 = `0x52`), the DQPN word for UD
/// ([`crate::ud::dqpn_of`]); `None` if too short or without one. For
/// demultiplexing QPs that share a socket; the QP checks everything.
pub fn dqpn_of(datagram: &[u8]) -> Option<u32> {
    match wrd::Framing::of(*datagram.first()?).ok()? {
        wrd::Framing::Rd if datagram.len() >= wrd::MIN_DATAGRAM_LEN => {
            Some(wrd::RdShim::new_unchecked(datagram).dst_qpn())
        }
        wrd::Framing::Rd => None,
        wrd::Framing::Ud => crate::ud::dqpn_of(datagram),
    }
}

const NIL: u32 = u32::MAX;
/// Shim + the largest segment header (untagged 18 + DQPN 4 + Terminate or
/// Atomic Request part 52).
const HDR_CAP: usize = SHIM_LEN + 80;
/// IoSlices per datagram: header, up to MAX_SGE payload pieces, trailer.
const IOV_PER: usize = MAX_SGE + 2;

/// Parameters of an RD queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdQpConfig {
    /// This QP's number (24 bits); `(udp_port << 8) | slot` by the design
    /// brief's convention. It overrides `rd.local_qpn`.
    pub qpn: u32,
    /// Path MTU ([`MIN_MTU`]..=[`MAX_MTU`]); segments are sized so IP + UDP
    /// + shim + header + payload + CRC fit it.
    pub mtu: usize,
    /// Largest message sent, received or read (at most [`MAX_MSG_LIMIT`]).
    pub max_msg: u64,
    /// Send queue depth (work requests not yet completed, plus completed
    /// ones whose last datagrams are still unacknowledged).
    pub sq_depth: usize,
    /// Receive queue depth (posted plus claimed by a message in progress).
    pub rq_depth: usize,
    /// Reads and atomics this QP has outstanding per peer, at most.
    pub ord: u16,
    /// Reads and atomics this QP serves per peer at once, at most.
    pub ird: u16,
    /// Inbound slots in all (Read and Atomic Responses being sent,
    /// Terminates); allocated at creation.
    pub max_inbound: usize,
    /// Events held for [`RdQp::poll_event`]; more are counted as lost.
    pub event_depth: usize,
    /// `Some(our address)`: put a GRH in front of every received payload
    /// (`docs/datagram.md` §10).
    pub grh: Option<IpAddr>,
    /// Write-Record logging.
    pub record: RecordConfig,
    /// The reliability layer (its `local_qpn` is set from `qpn`).
    pub rd: RdConfig,
}

impl Default for RdQpConfig {
    /// QPN 0, MTU 1500, 1 GiB messages, depth 128, ORD/IRD 16, 1024
    /// inbound slots, 64 events, no GRH, default RD settings, and the
    /// default Write-Record settings except the partial-message timeout,
    /// which is the RD give-up span (a message can only stay partial if
    /// its sender gave up).
    fn default() -> Self {
        let rd = RdConfig::default();
        RdQpConfig {
            qpn: 0,
            mtu: 1500,
            max_msg: 1 << 30,
            sq_depth: 128,
            rq_depth: 128,
            ord: 16,
            ird: 16,
            max_inbound: 1024,
            event_depth: 64,
            grh: None,
            record: RecordConfig {
                partial_timeout: rd.give_up_span(),
                ..RecordConfig::default()
            },
            rd,
        }
    }
}

/// Why [`RdQp::new`] refused a configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdQpConfigError {
    /// The QPN does not fit 24 bits.
    Qpn,
    /// The MTU is outside [`MIN_MTU`]..=[`MAX_MTU`].
    Mtu,
    /// `max_msg` is above [`MAX_MSG_LIMIT`].
    MaxMsg,
    /// A depth, limit or pool size is zero.
    Depth,
    /// The reliability layer refused its settings.
    Rd(RdConfigError),
}

impl fmt::Display for RdQpConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdQpConfigError::Qpn => f.write_str("QP number does not fit 24 bits"),
            RdQpConfigError::Mtu => f.write_str("MTU out of range"),
            RdQpConfigError::MaxMsg => f.write_str("maximum message size above the limit"),
            RdQpConfigError::Depth => f.write_str("queue depth, limit or pool size is zero"),
            RdQpConfigError::Rd(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for RdQpConfigError {}

/// Counters of an RD QP (the reliability layer keeps its own,
/// [`RdQp::rd_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RdQpStats {
    /// Datagrams the sink accepted (data and control).
    pub tx_datagrams: u64,
    /// Send work requests completed successfully.
    pub tx_messages: u64,
    /// Send work requests completed with an error.
    pub tx_errors: u64,
    /// Datagrams not sent because their token was already settled.
    pub tx_stale: u64,
    /// Datagrams the sink refused with an error other than `WouldBlock`
    /// (left to retransmission).
    pub tx_socket_errors: u64,
    /// Work requests aborted by a local gather failure in flight.
    pub tx_aborted: u64,
    /// Work requests refused because the peer table was full.
    pub tx_table_full: u64,
    /// Work requests failed (`RetryExcErr`) because the peer lost our
    /// session (it restarted) after acknowledging part of them: a message
    /// acknowledged in part, a Read or atomic whose request it had
    /// acknowledged.
    pub tx_resync_failed: u64,
    /// Datagrams handed to [`RdQp::handle_datagram`].
    pub rx_datagrams: u64,
    /// Dropped: CRC32C mismatch.
    pub rx_bad_crc: u64,
    /// Dropped: unparsable shim or segment (a bad segment's shim feedback
    /// is still used, its data is not acknowledged).
    pub rx_malformed: u64,
    /// Dropped: a UD datagram (no RD shim).
    pub rx_not_rd: u64,
    /// Dropped: another DQPN.
    pub rx_wrong_qp: u64,
    /// Data datagrams delivered before (RD duplicates).
    pub rx_duplicates: u64,
    /// Data datagrams the reliability layer did not deliver (out of order,
    /// stale session, no session, table full).
    pub rx_not_delivered: u64,
    /// Send messages delivered (receive completed successfully).
    pub rx_delivered: u64,
    /// Send messages dropped: no receive posted.
    pub rx_no_recv: u64,
    /// Receives completed with `LocLenErr`.
    pub rx_len_err: u64,
    /// Receives completed with `LocProtErr`.
    pub rx_prot_err: u64,
    /// Segments breaking the rules (wrong MO, QN, opcode): Terminate sent.
    pub rx_inconsistent: u64,
    /// Later segments of a message already failed or dropped.
    pub rx_skipped: u64,
    /// Segments from the middle of a message whose beginning was not
    /// received here (a restart on either side, a hostile peer): not
    /// placed, answered with a Terminate.
    pub rx_orphan_segments: u64,
    /// RDMA Write segments placed.
    pub rx_write_segments: u64,
    /// Write-Record segments placed (and logged).
    pub rx_record_segments: u64,
    /// Remote access violations (Write, Write-Record, Read, atomic).
    pub rx_access_errors: u64,
    /// Read Requests accepted.
    pub rx_read_requests: u64,
    /// Atomic Requests executed.
    pub rx_atomics: u64,
    /// Read or Atomic Requests refused: IRD or the inbound pool exhausted.
    pub rx_ird_exceeded: u64,
    /// Read Response segments placed.
    pub rx_read_segments: u64,
    /// Responses matching no outstanding request (dropped).
    pub rx_unmatched_responses: u64,
    /// Terminates received.
    pub rx_terminates: u64,
    /// Terminates matching no work request or message.
    pub rx_unmatched_terminates: u64,
    /// Messages abandoned on a sender-abort Terminate.
    pub rx_aborted: u64,
    /// Terminates queued.
    pub terminates_sent: u64,
    /// Success completions held back until the peer's datagrams before an
    /// ACK that arrived out of order were delivered.
    pub tx_gated: u64,
    /// Terminates not sent: the inbound pool was full.
    pub terminates_dropped: u64,
    /// Events dropped because [`RdQpConfig::event_depth`] were waiting.
    pub events_lost: u64,
}

/// Where a datagram's payload comes from.
#[derive(Debug, Clone, Copy)]
enum Body {
    None,
    /// The work request's payload in send-queue slot `slot`.
    Local {
        slot: u32,
        off: u64,
        len: u64,
    },
    /// A Read Response: registered memory named by the request.
    Remote {
        stag: u32,
        to: u64,
        len: u64,
    },
}

/// One datagram ready to gather.
#[derive(Debug, Clone, Copy)]
struct Plan {
    hdr: [u8; HDR_CAP],
    hlen: usize,
    body: Body,
    dest: (IpAddr, u16),
}

impl Plan {
    const EMPTY: Plan = Plan {
        hdr: [0; HDR_CAP],
        hlen: 0,
        body: Body::None,
        dest: (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
    };
}

/// A Terminate to queue.
#[derive(Debug, Clone, Copy)]
struct TermSpec {
    cause: TerminateCause,
    /// The offending segment (DDP header first), for the D echo.
    echo: Option<EchoedHeader>,
    seg_len: Option<u16>,
    rdmap: Option<[u8; rdmap::TERMINATED_RDMAP_HEADER_LEN]>,
    about: u32,
}

/// A reliable-datagram queue pair's protocol engine. See the module
/// documentation.
#[derive(Debug)]
pub struct RdQp {
    cfg: RdQpConfig,
    ep: RdEndpoint<DgramAddr, Token>,
    now: Instant,
    rd_deadline: Option<Instant>,
    maybe_tx: bool,
    pump_depth: usize,
    term_reserve: usize,
    // --- send queue ---
    sq: Vec<SqSlot>,
    sq_free: Vec<u32>,
    /// Requests whose last token was just acknowledged: they succeed once
    /// the datagram that carried the ACK has been acted on.
    candidates: Vec<u32>,
    // --- inbound responses and Terminates ---
    inb: Vec<InSlot>,
    in_free: Vec<u32>,
    // --- peers ---
    peers: PeerTable<DgramAddr, PeerState>,
    ready: VecDeque<DgramAddr>,
    /// Where batches of datagrams are framed contiguously
    /// ([`crate::dgram::offer_staged`]); empty until the first such batch.
    stage: Vec<u8>,
    /// The plans of the batch `poll_transmit` is sending, kept between
    /// calls (capacity [`TX_BATCH`]): an array of them on the stack was
    /// written whole on every call, some 5 KiB for a lone ACK or answer.
    plans: Vec<Plan>,
    // --- receive ---
    rq: RecvFifo,
    tracker: Tracker,
    // --- outputs ---
    pending: VecDeque<Transmit<DgramAddr, Token>>,
    completions: VecDeque<(CqKind, WorkCompletion)>,
    events: VecDeque<DgramEvent>,
    stats: RdQpStats,
}

impl RdQp {
    /// An RD QP with every queue and pool allocated; `now` starts its
    /// clock.
    pub fn new(cfg: RdQpConfig, now: Instant) -> Result<Self, RdQpConfigError> {
        if cfg.qpn > MAX_QPN {
            return Err(RdQpConfigError::Qpn);
        }
        if !(MIN_MTU..=MAX_MTU).contains(&cfg.mtu) {
            return Err(RdQpConfigError::Mtu);
        }
        if cfg.max_msg > MAX_MSG_LIMIT {
            return Err(RdQpConfigError::MaxMsg);
        }
        if cfg.sq_depth == 0
            || cfg.rq_depth == 0
            || cfg.ord == 0
            || cfg.ird == 0
            || cfg.max_inbound == 0
            || cfg.sq_depth >= NIL as usize
            || cfg.max_inbound >= NIL as usize
        {
            return Err(RdQpConfigError::Depth);
        }
        let rd_cfg = RdConfig {
            local_qpn: cfg.qpn,
            ..cfg.rd
        };
        let ep = RdEndpoint::new(rd_cfg).map_err(RdQpConfigError::Rd)?;
        let pump_depth = usize::from(rd_cfg.tx_window).clamp(1, rd_cfg.max_queue);
        Ok(RdQp {
            cfg: RdQpConfig { rd: rd_cfg, ..cfg },
            ep,
            now,
            rd_deadline: None,
            maybe_tx: false,
            pump_depth,
            term_reserve: cfg.max_inbound / 8,
            sq: vec![SqSlot { gen: 0, e: None }; cfg.sq_depth],
            sq_free: (0..cfg.sq_depth as u32).rev().collect(),
            candidates: Vec::with_capacity(cfg.sq_depth),
            inb: vec![InSlot { gen: 0, e: None }; cfg.max_inbound],
            in_free: (0..cfg.max_inbound as u32).rev().collect(),
            peers: PeerTable::new(),
            stage: Vec::new(),
            plans: Vec::with_capacity(TX_BATCH),
            ready: VecDeque::with_capacity(cfg.sq_depth + cfg.max_inbound),
            rq: RecvFifo::new(cfg.rq_depth),
            tracker: Tracker::new(cfg.record),
            pending: VecDeque::with_capacity(TX_BATCH),
            completions: VecDeque::with_capacity(cfg.sq_depth + cfg.rq_depth + 64),
            events: VecDeque::with_capacity(cfg.event_depth),
            stats: RdQpStats::default(),
        })
    }

    /// The parameters (with `rd.local_qpn` = `qpn`).
    pub fn config(&self) -> &RdQpConfig {
        &self.cfg
    }

    /// This QP's number.
    pub fn qpn(&self) -> u32 {
        self.cfg.qpn
    }

    /// The QP's counters.
    pub fn stats(&self) -> RdQpStats {
        self.stats
    }

    /// The reliability layer's counters.
    pub fn rd_stats(&self) -> &RdStats {
        self.ep.stats()
    }

    /// The reliability layer (peer entries, windows, sessions), read only.
    pub fn rd(&self) -> &RdEndpoint<DgramAddr, Token> {
        &self.ep
    }

    /// Peers this QP keeps state for (numbering, a message being received,
    /// outstanding requests); zero when every peer has expired.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Inbound slots in use (responses and Terminates being sent).
    pub fn inbound_in_use(&self) -> usize {
        self.inb.len() - self.in_free.len()
    }

    /// Send-queue slots in use.
    pub fn sq_in_use(&self) -> usize {
        self.sq.len() - self.sq_free.len()
    }

    /// Receives posted and not claimed by a message.
    pub fn recv_posted(&self) -> usize {
        self.rq.len()
    }

    /// The Write-Record tracker (validity map queries, settings); its
    /// completions reach [`RdQp::poll_completion`] on their own.
    pub fn record_tracker(&mut self) -> &mut Tracker {
        &mut self.tracker
    }

    /// The Write-Record counters.
    pub fn record_stats(&self) -> RecordStats {
        self.tracker.stats()
    }

    /// Advances the QP's clock (never backwards); `post_send` and
    /// `poll_transmit` use it.
    pub fn set_now(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    /// Queues a send work request for `dest` (IP, UDP port and QPN of the
    /// target QP). Refused, with nothing queued: [`PostError::QueueFull`];
    /// [`PostError::Unsupported`] for Send with Invalidate, Write with
    /// immediate and local invalidate; [`PostError::Invalid`] for a
    /// payload above `max_msg`, a QPN above 24 bits, a Read into inline
    /// data or an atomic whose local buffer is not 8 registered octets.
    pub fn post_send(&mut self, wr: SendWr, dest: DgramAddr) -> Result<(), PostError> {
        let kind = match wr.op {
            SendOp::Send {
                invalidate: Some(_),
                ..
            }
            | SendOp::Write { imm: Some(_), .. }
            | SendOp::LocalInvalidate { .. } => return Err(PostError::Unsupported),
            SendOp::Send { .. } => Kind::Send,
            SendOp::Write { .. } => Kind::Write,
            SendOp::WriteRecord { .. } => Kind::WriteRecord,
            SendOp::Read { .. } => {
                if matches!(wr.payload, Payload::Inline(_)) {
                    return Err(PostError::Invalid);
                }
                Kind::Read
            }
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => {
                if wr.payload.len() != 8 || matches!(wr.payload, Payload::Inline(_)) {
                    return Err(PostError::Invalid);
                }
                Kind::Atomic
            }
        };
        if dest.qpn > MAX_QPN || wr.payload.len() > self.cfg.max_msg {
            return Err(PostError::Invalid);
        }
        let Some(slot) = self.sq_free.pop() else {
            return Err(PostError::QueueFull);
        };
        let dest = DgramAddr {
            ip: dest.ip.to_canonical(),
            ..dest
        };
        let s = &mut self.sq[slot as usize];
        s.e = Some(SqEntry {
            wr,
            dest,
            kind,
            started: false,
            msn: 0,
            room: 0,
            data_segs: 0,
            nsegs: 0,
            pumped: 0,
            resolved: 0,
            acked: 0,
            awaiting: false,
            gated: false,
            received: 0,
            done: false,
            outcome: (WcStatus::Success, 0),
            reported: false,
            next_all: NIL,
            abort_msn: 0,
            in_fifo: false,
            next: NIL,
        });
        let p = self.peers.get_or_insert_with(dest, PeerState::new);
        if p.all_tail == NIL {
            p.all_head = slot;
        } else if let Some(t) = self.sq[p.all_tail as usize].e.as_mut() {
            t.next_all = slot;
        }
        p.all_tail = slot;
        self.sq_push(dest, slot);
        self.mark_ready(dest);
        self.pump_all();
        self.refresh();
        Ok(())
    }

    /// [`RdQp::set_now`], then [`RdQp::post_send`].
    pub fn post_send_at(
        &mut self,
        wr: SendWr,
        dest: DgramAddr,
        now: Instant,
    ) -> Result<(), PostError> {
        self.set_now(now);
        self.post_send(wr, dest)
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

    /// The next asynchronous event.
    pub fn poll_event(&mut self) -> Option<DgramEvent> {
        self.events.pop_front()
    }

    /// True if [`RdQp::poll_transmit`] may have datagrams to send.
    pub fn wants_transmit(&self) -> bool {
        self.maybe_tx || !self.pending.is_empty()
    }

    /// When [`RdQp::handle_timeout`] should next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.rd_deadline, self.tracker.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the timers due at `now`: delayed ACKs, retransmissions (and
    /// peer failures), probes, expiry, Write-Record partial messages.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.set_now(now);
        self.ep.handle_timeout(self.now);
        self.maybe_tx = true;
        self.drain_rd_events();
        self.finalize(None);
        self.tracker.handle_timeout(self.now);
        self.drain_tracker();
        self.pump_all();
        self.refresh();
    }
}

impl DatagramQp for RdQp {
    fn qpn(&self) -> u32 {
        RdQp::qpn(self)
    }
    fn post_send(&mut self, wr: SendWr, dest: DgramAddr) -> Result<(), PostError> {
        RdQp::post_send(self, wr, dest)
    }
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        RdQp::post_recv(self, wr)
    }
    fn handle_datagram_lazy<M: Memory, F: FnMut() -> Instant>(
        &mut self,
        src_ip: IpAddr,
        src_port: u16,
        data: &[u8],
        mem: &mut M,
        mut now: F,
    ) {
        // Every RD datagram moves the reliability layer's clocks.
        RdQp::handle_datagram(self, src_ip, src_port, data, mem, now())
    }
    fn poll_transmit<M: Memory, S: DatagramSink>(
        &mut self,
        mem: &M,
        sink: &mut S,
    ) -> io::Result<usize> {
        RdQp::poll_transmit(self, mem, sink)
    }
    fn wants_transmit(&self) -> bool {
        RdQp::wants_transmit(self)
    }
    fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        RdQp::poll_completion(self)
    }
    fn poll_event(&mut self) -> Option<DgramEvent> {
        RdQp::poll_event(self)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        RdQp::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        RdQp::handle_timeout(self, now)
    }
    fn record_tracker(&mut self) -> &mut Tracker {
        RdQp::record_tracker(self)
    }
    fn set_now(&mut self, now: Instant) {
        RdQp::set_now(self, now)
    }
}

#[cfg(test)]
mod tests;
