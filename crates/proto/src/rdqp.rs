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
//!   registered memory and CRC;
//!   `docs/datagram.md` §12.5-12.6),
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
//! # RD QP semantics (`docs/datagram.md` §11)
//!
//! The text below is what this module implements; it is meant for
//! `docs/datagram.md` as §11.
//!
//! ```text
//! ## 11. RD QP semantics
//!
//! An RD QP (`crates/proto/src/rdqp.rs`) is a datagram QP whose every data
//! datagram is the RD shim (§9), one DDP segment and the CRC. The segment
//! follows the UD layout of §10 (Q = 1 with the DQPN word and the sender's
//! slot in its top octet; X, T-MSN and T-MO on every tagged segment; the
//! sender's QPN in RsvdULP of Send and Immediate Data segments; Send with
//! immediate as Send segments then one Immediate Data segment). The
//! reliability layer (§9.4) gives each (source QP, destination QP) pair
//! in-order, exactly-once delivery, so the receiver needs neither
//! reassembly timeouts nor duplicate tables: segments of one kind arrive
//! in the order they were sent.
//!
//! * Operations: Send and Send with immediate (solicited or not), RDMA
//!   Write, Write-Record, RDMA Read, atomic fetch-and-add and
//!   compare-and-swap (8 octets, RFC 7306 layout). Refused at post time:
//!   Send with Invalidate, Write with immediate, local invalidate. A
//!   message may be up to `max_msg` octets (at most 2^32 − 1).
//! * Numbering, per (local QP, peer QP), starting at 1 when the peer entry
//!   is created and kept until it expires: MSN of QN 0 (Sends), of QN 1
//!   (Read and Atomic Requests; the Atomic Request's Request Identifier is
//!   its MSN), of QN 3 (Atomic Responses), the tagged T-MSN (Write and
//!   Write-Record), and the Terminate MSN (QN 2; §3.6's MSN 1 is the first
//!   Terminate). Receivers use MSNs as identifiers only.
//! * Send-side completion. A Send, Write or Write-Record completes
//!   successfully when the peer has acknowledged every datagram of it
//!   (that is what RD's reliability means: delivered to the peer's RDMAP
//!   layer); a Read or atomic when its response has been placed. Within
//!   one peer, work requests start in posting order (a Read or atomic waits
//!   while `ord` of them are outstanding to that peer; a fenced request
//!   waits until none is) and their completions are reported in posting
//!   order (a Send posted after a Read to the same peer is reported after
//!   the Read). Across peers there is no order: a slow peer never holds
//!   back another peer's completions.
//! * Peer failure. When the reliability layer gives up on a peer (retry
//!   limit), every work request to that peer not yet completed, whether
//!   started or only queued, completes with RetryExcErr and a PeerFailed
//!   event is raised; requests to other peers are unaffected. The same
//!   happens to a Read or atomic still waiting for its response when the
//!   peer entry expires (nothing came back for idle_timeout).
//! * Errors found by the target are reported with a Terminate datagram
//!   (§3.6) sent to the requester as ordinary RD data. Its RsvdULP holds
//!   the MSN or T-MSN of the message it is about, its D echo that
//!   message's header (R: the Read Request), so the requester finds the
//!   work request exactly and completes it with
//!   RDMAP/DDP protection errors → RemAccessErr, "no buffer" → RnrRetryExcErr,
//!   other DDP untagged errors → RemInvReqErr, anything else → RemOpErr.
//!   A Terminate never answers a response or a Terminate; the target drops
//!   the rest of the failed message silently, raises one RemoteAccess
//!   event per message for a protection error, and goes on serving
//!   everybody.
//! * The Terminate is never overtaken by the ACK of what it reports, so a
//!   Send, Write or Write-Record (completed by ACKs) fails deterministically
//!   instead of succeeding first:
//!   - the target sends it as an RD *report* (§9.4 addendum): before any
//!     datagram not yet sent, past a full window, and until it is
//!     acknowledged the ACK covering the failed datagram rides only on data
//!     datagrams at or after the report. Control datagrams and re-sent
//!     earlier datagrams name the failed PSN as the next expected; an ACK
//!     that is owed meanwhile is carried by re-sending the report.
//!     Deliveries and everything else go on, so nothing stalls, even when
//!     both sides report errors to each other;
//!   - the requester acts on a delivered segment before the ACK it carries
//!     completes anything, and when an ACK arrives on a data datagram that
//!     is not delivered (out of order: a Terminate before it may be lost),
//!     the requests it acknowledged succeed only once that datagram's PSN
//!     has been delivered. Should the peer's session change first, they
//!     complete with RetryExcErr (their outcome cannot be confirmed).
//! * Receiving a Send. The first segment (MO 0) takes the oldest posted
//!   receive; segments are scattered straight into it at their MO; the
//!   receive completes with the L segment (with an Immediate Data L
//!   segment: imm set). A message longer than the receive (after the GRH,
//!   if any) or than max_msg completes the receive with LocLenErr and the
//!   sender's request with RemInvReqErr (Terminate DDP "too long"); a
//!   receive buffer the memory refuses completes with LocProtErr (sender:
//!   RemOpErr).
//! * No receive posted. RD has no receiver-not-ready retry: the message is
//!   dropped and counted, and the sender's request completes with
//!   RnrRetryExcErr (Terminate DDP "no buffer"). Later messages are
//!   received normally.
//! * RDMA Write and Write-Record are placed segment by segment after the
//!   remote access checks (STag, PD, REMOTE_WRITE, bounds); Write-Record
//!   segments are then logged as on UD (§3.3, §10). No receive is consumed.
//!   A Write-Record message can be partial only if its sender gave up, so
//!   the default partial-message timeout is the RD give-up span.
//! * RDMA Read. The responder checks REMOTE_READ and bounds for the whole
//!   range when the request arrives, then sends the Read Response segments
//!   (T-MSN = the request's MSN, §3.4) straight from the registered source,
//!   at transmission and at every retransmission. The requester places
//!   each segment at its T-MO in the local scatter list and checks sink
//!   STag, base TO, order and length. If the source fails the checks later
//!   (deregistered during the read), the segment goes out as a Terminate
//!   instead and the Read fails with RemAccessErr.
//! * Atomics execute exactly once: the request is delivered once by RD,
//!   and the responder keeps the original value until the peer has
//!   acknowledged the Atomic Response, which is rebuilt from it on every
//!   retransmission.
//! * Limits. A requester has at most `ord` Reads and atomics outstanding
//!   per peer; a responder serves at most `ird` per peer and
//!   `max_inbound` in all (responses and Terminates share that pool; a
//!   reserve of max_inbound/8 is kept for Terminates). A request beyond
//!   them is refused with Terminate "insufficient IRD" (RemOpErr).
//! * A local gather failure at (re)transmission (the source was
//!   deregistered while in flight) completes the request with LocProtErr
//!   and its datagram goes out as a sender-abort Terminate (RDMAP local
//!   catastrophic, echo of the message): the receiver abandons the message
//!   in progress (its receive returns to the queue).
//! * State. Per peer: numbering, the message being received, counters of
//!   outstanding requests: created on demand and removed when the
//!   reliability layer expires the peer (no traffic for idle_timeout); a
//!   new session of the peer abandons the message being received. Queues
//!   and the inbound pool are allocated when the QP is created.
//! * Peer restart (the peer answers our session with a reset: it restarted
//!   or forgot us). A Send, Write or Write-Record acknowledged in part, and
//!   a Read or atomic whose request was acknowledged (or whose response
//!   had begun), complete with RetryExcErr; none of their remaining
//!   datagrams, and no response or Terminate queued for the old
//!   incarnation, is sent in the new session; requests acknowledged in
//!   none of their datagrams are sent again whole. Completions behind
//!   them (posting order) are released.
//! * A segment from the middle of a message (MO / T-MO not the next
//!   expected) with no message of its MSN / T-MSN in progress is never
//!   placed and never starts a message: Terminate (Send: DDP invalid MO;
//!   Write, Write-Record: RDMAP catastrophic stream error), the rest of
//!   the message is dropped.
//!
//! Addendum to §9.4 (reliability rules), implemented by
//! `RdEndpoint::send_report`:
//!
//! * Reports. The layer above may queue a token as a report about the data
//!   datagram just delivered from a peer. It is sent before every token not
//!   yet sent and may exceed the window by one datagram. Until the peer
//!   acknowledges it, the ACK of the reported datagram rides only on data
//!   datagrams at or after the report; other datagrams (control ones,
//!   earlier ones re-sent) acknowledge at most up to the reported PSN, and
//!   an ACK owed meanwhile goes out by re-sending the report. A receiver
//!   that acts on a segment before using the ACK it carries, and that uses
//!   an ACK from an undelivered datagram only once it has delivered up to
//!   that datagram, never sees the ACK before the report.
//! ```

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
use crate::peers::PeerTable;
use crate::rd::{
    seq_after, Event, RdConfig, RdConfigError, RdEndpoint, RdStats, SendError, Transmit, Verdict,
};
use crate::ud::{grh_header, GRH_LEN, MAX_MTU, MIN_MTU};
use crate::wr::{
    CqKind, DgramAddr, Payload, PostError, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
    WorkCompletion, MAX_SGE,
};

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

/// What the reliability layer sequences for an RD QP: one segment of a
/// send work request or of an inbound response / Terminate, by slot,
/// generation and segment number. Nothing else is kept per datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    from: Source,
    slot: u32,
    gen: u32,
    seg: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Sq,
    Inbound,
}

// ----------------------------------------------------------------------
// Internal state
// ----------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    WriteRecord,
    Read,
    Atomic,
}

impl Kind {
    /// Completed by acknowledgements (not by a response).
    fn acked_kind(self) -> bool {
        matches!(self, Kind::Send | Kind::Write | Kind::WriteRecord)
    }
}

/// A send work request.
#[derive(Debug, Clone, Copy)]
struct SqEntry {
    wr: SendWr,
    dest: DgramAddr,
    kind: Kind,
    /// Its first token was given to the reliability layer.
    started: bool,
    /// MSN (Send), T-MSN (Write, Write-Record) or request MSN (Read,
    /// atomic); fixed at start.
    msn: u32,
    /// Payload octets per data segment.
    room: u32,
    /// Data segments (the Immediate Data segment excluded).
    data_segs: u32,
    /// All segments (tokens).
    nsegs: u32,
    /// Tokens given to the reliability layer.
    pumped: u32,
    /// Tokens acknowledged or abandoned.
    resolved: u32,
    /// Tokens acknowledged.
    acked: u32,
    /// Read / atomic: the response is awaited (holds one ORD unit).
    awaiting: bool,
    /// Acknowledged, but its success waits for the peer's gate.
    gated: bool,
    /// Read: response octets placed.
    received: u32,
    /// Its outcome is decided (`outcome`).
    done: bool,
    outcome: (WcStatus, u32),
    /// Its completion was produced (or suppressed): every earlier request
    /// to the same peer was reported before.
    reported: bool,
    /// Next request to the same peer in posting order (not yet reported).
    next_all: u32,
    /// Terminate MSN of the sender-abort Terminate, once one was needed.
    abort_msn: u32,
    /// In the peer's list of requests still to pump.
    in_fifo: bool,
    next: u32,
}

#[derive(Debug, Clone, Copy)]
struct SqSlot {
    gen: u32,
    e: Option<SqEntry>,
}

#[derive(Debug, Clone, Copy)]
enum InKind {
    Read {
        req: ReadRequest,
        msn: u32,
    },
    Atomic {
        resp: AtomicResponse,
        msn: u32,
    },
    Terminate {
        term: TerminateRepr,
        /// MSN / T-MSN of the message it is about (RsvdULP).
        about: u32,
        /// Its own Terminate MSN.
        msn: u32,
    },
}

/// Something this QP sends on its own account: a response or a
/// Terminate.
#[derive(Debug, Clone, Copy)]
struct InEntry {
    peer: DgramAddr,
    kind: InKind,
    room: u32,
    nsegs: u32,
    pumped: u32,
    resolved: u32,
    /// Counts against the peer's IRD.
    ird: bool,
    /// Stop pumping (failed source, failed peer).
    dead: bool,
    /// A remote access event was raised for it.
    reported: bool,
    /// Terminate MSN used if its source fails in flight.
    abort_msn: u32,
    in_fifo: bool,
    next: u32,
}

#[derive(Debug, Clone, Copy)]
struct InSlot {
    gen: u32,
    e: Option<InEntry>,
}

/// A slot of a table threaded by a per-peer intrusive FIFO (the requests
/// still to pump, the responses still to send).
trait FifoSlot {
    /// The entry's (in the FIFO, next slot) link, if the slot is in use.
    fn link(&mut self) -> Option<(&mut bool, &mut u32)>;
}

impl FifoSlot for SqSlot {
    fn link(&mut self) -> Option<(&mut bool, &mut u32)> {
        self.e.as_mut().map(|e| (&mut e.in_fifo, &mut e.next))
    }
}

impl FifoSlot for InSlot {
    fn link(&mut self) -> Option<(&mut bool, &mut u32)> {
        self.e.as_mut().map(|e| (&mut e.in_fifo, &mut e.next))
    }
}

/// Appends `slot` to the FIFO `head..tail` threaded through `slots`.
fn fifo_push<S: FifoSlot>(slots: &mut [S], head: &mut u32, tail: &mut u32, slot: u32) {
    if let Some((in_fifo, next)) = slots[slot as usize].link() {
        *in_fifo = true;
        *next = NIL;
    }
    if *tail == NIL {
        *head = slot;
    } else if let Some((_, next)) = slots[*tail as usize].link() {
        *next = slot;
    }
    *tail = slot;
}

/// Removes `slot` from the FIFO `head..tail` (if it is in it) and clears
/// its link.
fn fifo_unlink<S: FifoSlot>(slots: &mut [S], head: &mut u32, tail: &mut u32, slot: u32) {
    let Some((in_fifo, next)) = slots[slot as usize].link() else {
        return;
    };
    if !*in_fifo {
        return;
    }
    *in_fifo = false;
    let after = std::mem::replace(next, NIL);
    let mut prev = NIL;
    let mut cur = *head;
    while cur != NIL && cur != slot {
        prev = cur;
        cur = slots[cur as usize].link().map_or(NIL, |(_, n)| *n);
    }
    if cur == NIL {
        return;
    }
    if prev == NIL {
        *head = after;
    } else if let Some((_, n)) = slots[prev as usize].link() {
        *n = after;
    }
    if *tail == slot {
        *tail = prev;
    }
}

/// The Send message being received from a peer.
#[derive(Debug, Clone, Copy)]
struct RxMsg {
    msn: u32,
    /// Posting sequence of the claimed receive.
    seq: u64,
    wr: RecvWr,
    /// Octets of message the receive takes.
    cap: u64,
    /// Octets received so far (= the next MO expected).
    received: u32,
}

/// What this QP keeps per peer (besides the reliability layer's entry).
#[derive(Debug, Clone, Copy)]
struct PeerState {
    tx_msn: u32,
    tx_req: u32,
    tx_tmsn: u32,
    tx_resp: u32,
    tx_term: u32,
    /// Requests not yet reported, in posting order.
    all_head: u32,
    all_tail: u32,
    /// Requests not yet wholly given to the reliability layer.
    sq_head: u32,
    sq_tail: u32,
    in_head: u32,
    in_tail: u32,
    ord_used: u16,
    ird_used: u16,
    /// Send-queue slot of the Read that got the last Read Response.
    read_hint: u32,
    /// Success completions wait until the peer's datagram with this
    /// (epoch, PSN) is delivered (its ACK arrived out of order, ahead of a
    /// Terminate it may follow).
    gate: Option<(u32, u32)>,
    rx: Option<RxMsg>,
    /// Send MSN whose remaining segments are dropped.
    skip_send: Option<u32>,
    /// T-MSN whose remaining segments are dropped.
    skip_tagged: Option<u32>,
    /// The tagged (Write, Write-Record) message being received: T-MSN
    /// and the next T-MO expected.
    rx_tagged: Option<(u32, u32)>,
    ready: bool,
    turn_in: bool,
}

impl PeerState {
    fn new() -> Self {
        PeerState {
            tx_msn: 1,
            tx_req: 1,
            tx_tmsn: 1,
            tx_resp: 1,
            tx_term: 1,
            all_head: NIL,
            all_tail: NIL,
            sq_head: NIL,
            sq_tail: NIL,
            in_head: NIL,
            in_tail: NIL,
            ord_used: 0,
            ird_used: 0,
            read_hint: NIL,
            gate: None,
            rx: None,
            skip_send: None,
            skip_tagged: None,
            rx_tagged: None,
            ready: false,
            turn_in: false,
        }
    }

    fn idle(&self) -> bool {
        self.all_head == NIL
            && self.sq_head == NIL
            && self.in_head == NIL
            && self.ord_used == 0
            && self.ird_used == 0
            && self.gate.is_none()
            && self.rx.is_none()
    }

    fn next_term(&mut self) -> u32 {
        let m = self.tx_term;
        self.tx_term = m.wrapping_add(1);
        m
    }
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
    /// ([`crate::ud::offer_staged`]); empty until the first such batch.
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

    fn refresh(&mut self) {
        self.rd_deadline = self.ep.poll_timeout();
    }

    // ------------------------------------------------------------------
    // Peers and pumping tokens into the reliability layer
    // ------------------------------------------------------------------

    fn mark_ready(&mut self, peer: DgramAddr) {
        if let Some(p) = self.peers.get_mut(&peer) {
            if !p.ready && (p.sq_head != NIL || p.in_head != NIL) {
                p.ready = true;
                self.ready.push_back(peer);
            }
        }
    }

    fn pump_all(&mut self) {
        for _ in 0..self.ready.len() {
            let Some(peer) = self.ready.pop_front() else {
                break;
            };
            let Some(p) = self.peers.get_mut(&peer) else {
                continue;
            };
            p.ready = false;
            self.pump(peer);
        }
    }

    /// Gives the peer's next tokens to the reliability layer, keeping at
    /// most `pump_depth` queued there; responses and requests take turns.
    /// (Terminates do not come here: they go out as reports.)
    fn pump(&mut self, peer: DgramAddr) {
        loop {
            if self.ep.queued(&peer) >= self.pump_depth {
                return;
            }
            let Some(p) = self.peers.get(&peer).copied() else {
                return;
            };
            let in_head = p.in_head;
            let sq_ok = p.sq_head != NIL && self.sq_can_start(p.sq_head, &p);
            let use_in = in_head != NIL && (!sq_ok || p.turn_in);
            if use_in {
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.turn_in = false;
                }
                self.pump_in(peer, in_head);
            } else if sq_ok {
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.turn_in = true;
                }
                self.pump_sq(peer, p.sq_head);
            } else {
                return;
            }
        }
    }

    fn sq_can_start(&self, slot: u32, p: &PeerState) -> bool {
        let Some(e) = self.sq[slot as usize].e.as_ref() else {
            return true;
        };
        if e.started {
            return true;
        }
        let fenced = e.wr.flags.fence && p.ord_used > 0;
        match e.kind {
            Kind::Read | Kind::Atomic => !fenced && p.ord_used < self.cfg.ord,
            _ => !fenced,
        }
    }

    /// Fixes a request's numbering and segmentation when it starts.
    fn start_sq(&mut self, slot: u32) {
        let Some(e) = self.sq[slot as usize].e else {
            return;
        };
        let room_send = self.room(e.dest.ip, false);
        let room_tagged = self.room(e.dest.ip, true);
        let Some(p) = self.peers.get_mut(&e.dest) else {
            return;
        };
        let len = e.wr.payload.len();
        let (msn, room, data_segs, nsegs, awaiting) = match e.wr.op {
            SendOp::Send { imm, .. } => {
                let data = if len == 0 {
                    u32::from(imm.is_none())
                } else {
                    len.div_ceil(u64::from(room_send)) as u32
                };
                let m = p.tx_msn;
                p.tx_msn = m.wrapping_add(1);
                (m, room_send, data, data + u32::from(imm.is_some()), false)
            }
            SendOp::Write { .. } | SendOp::WriteRecord { .. } => {
                let data = len.div_ceil(u64::from(room_tagged)).max(1) as u32;
                let m = p.tx_tmsn;
                p.tx_tmsn = m.wrapping_add(1);
                (m, room_tagged, data, data, false)
            }
            _ => {
                let m = p.tx_req;
                p.tx_req = m.wrapping_add(1);
                p.ord_used += 1;
                (m, 0, 1, 1, true)
            }
        };
        if let Some(e) = self.sq[slot as usize].e.as_mut() {
            e.started = true;
            e.msn = msn;
            e.room = room;
            e.data_segs = data_segs;
            e.nsegs = nsegs;
            e.awaiting = awaiting;
        }
    }

    fn pump_sq(&mut self, peer: DgramAddr, slot: u32) {
        if self.sq[slot as usize].e.is_some_and(|e| !e.started) {
            self.start_sq(slot);
        }
        let gen = self.sq[slot as usize].gen;
        let Some(e) = self.sq[slot as usize].e else {
            self.sq_unlink(peer, slot);
            return;
        };
        if e.done || e.pumped >= e.nsegs {
            self.sq_unlink(peer, slot);
            self.try_free_sq(slot);
            return;
        }
        let token = Token {
            from: Source::Sq,
            slot,
            gen,
            seg: e.pumped,
        };
        match self.ep.send(peer, token, self.now) {
            Ok(()) => {
                self.maybe_tx = true;
                let mut finished = false;
                if let Some(e) = self.sq[slot as usize].e.as_mut() {
                    e.pumped += 1;
                    finished = e.pumped >= e.nsegs;
                }
                if finished {
                    self.sq_unlink(peer, slot);
                }
            }
            Err(SendError::TableFull) => {
                self.stats.tx_table_full += 1;
                self.complete(slot, WcStatus::GeneralErr, 0);
                self.maybe_drop_peer(peer);
            }
            Err(SendError::QueueFull) => {}
        }
    }

    fn pump_in(&mut self, peer: DgramAddr, slot: u32) {
        let gen = self.inb[slot as usize].gen;
        let Some(e) = self.inb[slot as usize].e else {
            self.in_unlink(peer, slot);
            return;
        };
        if e.dead || e.pumped >= e.nsegs {
            self.in_unlink(peer, slot);
            self.try_free_in(slot);
            return;
        }
        let token = Token {
            from: Source::Inbound,
            slot,
            gen,
            seg: e.pumped,
        };
        match self.ep.send(peer, token, self.now) {
            Ok(()) => {
                self.maybe_tx = true;
                let mut finished = false;
                if let Some(e) = self.inb[slot as usize].e.as_mut() {
                    e.pumped += 1;
                    finished = e.pumped >= e.nsegs;
                }
                if finished {
                    self.in_unlink(peer, slot);
                }
            }
            Err(SendError::TableFull) => {
                self.kill_in(slot);
            }
            Err(SendError::QueueFull) => {}
        }
    }

    fn sq_push(&mut self, peer: DgramAddr, slot: u32) {
        if let Some(p) = self.peers.get_mut(&peer) {
            fifo_push(&mut self.sq, &mut p.sq_head, &mut p.sq_tail, slot);
        }
    }

    fn sq_unlink(&mut self, peer: DgramAddr, slot: u32) {
        let mut none = (NIL, NIL);
        let (head, tail) = match self.peers.get_mut(&peer) {
            Some(p) => (&mut p.sq_head, &mut p.sq_tail),
            None => (&mut none.0, &mut none.1),
        };
        fifo_unlink(&mut self.sq, head, tail, slot);
    }

    fn in_push(&mut self, peer: DgramAddr, slot: u32) {
        if let Some(p) = self.peers.get_mut(&peer) {
            fifo_push(&mut self.inb, &mut p.in_head, &mut p.in_tail, slot);
        }
    }

    fn in_unlink(&mut self, peer: DgramAddr, slot: u32) {
        let mut none = (NIL, NIL);
        let (head, tail) = match self.peers.get_mut(&peer) {
            Some(p) => (&mut p.in_head, &mut p.in_tail),
            None => (&mut none.0, &mut none.1),
        };
        fifo_unlink(&mut self.inb, head, tail, slot);
    }

    /// Removes the peer's state if nothing of it is left and the
    /// reliability layer has no entry for it either.
    fn maybe_drop_peer(&mut self, peer: DgramAddr) {
        let idle = self.peers.get(&peer).is_some_and(|p| p.idle());
        if idle && !self.ep.has_peer(&peer) {
            self.peers.remove(&peer);
            let n = self.peers.len();
            if self.peers.capacity() > 4 * n + 64 {
                self.peers.shrink_to(2 * n);
            }
        }
    }

    /// Payload octets per segment towards `ip`.
    fn room(&self, ip: IpAddr, tagged: bool) -> u32 {
        let template = if tagged {
            SegmentRepr {
                ddp: DdpHeader::Tagged {
                    stag: 0,
                    to: 0,
                    ext: Some(TaggedExt { msn: 0, mo: 0 }),
                },
                dqpn: Some(0),
                ..SegmentRepr::tagged(Opcode::RdmaWrite, 0, 0, true)
            }
        } else {
            SegmentRepr {
                dqpn: Some(0),
                ..SegmentRepr::untagged(Opcode::Send, 0, 0, 0, true, RdmapBody::None)
            }
        };
        let overhead = match ip.to_canonical() {
            IpAddr::V4(_) => IPV4_UDP_OVERHEAD,
            IpAddr::V6(_) => IPV6_UDP_OVERHEAD,
        };
        wrd::max_payload_with(self.cfg.mtu, overhead, &template).clamp(1, u32::MAX as usize) as u32
    }

    /// The DQPN word of §10: our slot in the top octet.
    fn dqpn_word(&self, dest_qpn: u32) -> u32 {
        ((self.cfg.qpn & 0xFF) << 24) | (dest_qpn & MAX_QPN)
    }

    // ------------------------------------------------------------------
    // Completions and slots
    // ------------------------------------------------------------------

    /// Decides a send work request's outcome (once); it leaves the pump
    /// list, its completion is reported once every earlier request to the
    /// same peer was, and its slot is freed when its last token is settled.
    fn complete(&mut self, slot: u32, status: WcStatus, byte_len: u32) {
        let Some(e) = self.sq[slot as usize].e.as_mut() else {
            return;
        };
        if e.done {
            return;
        }
        e.done = true;
        e.outcome = (status, byte_len);
        let (dest, awaiting) = (e.dest, e.awaiting);
        e.awaiting = false;
        if awaiting {
            if let Some(p) = self.peers.get_mut(&dest) {
                p.ord_used = p.ord_used.saturating_sub(1);
            }
            self.mark_ready(dest);
        }
        self.sq_unlink(dest, slot);
        if status == WcStatus::Success {
            self.stats.tx_messages += 1;
        } else {
            self.stats.tx_errors += 1;
        }
        self.report(dest);
        self.maybe_drop_peer(dest);
    }

    /// Produces the completions of `peer`'s requests whose outcome is
    /// decided, in posting order up to the first undecided one.
    fn report(&mut self, peer: DgramAddr) {
        loop {
            let Some(p) = self.peers.get_mut(&peer) else {
                return;
            };
            let head = p.all_head;
            let Some(e) = self.sq.get_mut(head as usize).and_then(|s| s.e.as_mut()) else {
                return;
            };
            if !e.done {
                return;
            }
            p.all_head = e.next_all;
            if p.all_head == NIL {
                p.all_tail = NIL;
            }
            e.reported = true;
            e.next_all = NIL;
            let ((status, len), wr) = (e.outcome, e.wr);
            if status != WcStatus::Success || wr.flags.signaled {
                self.completions.push_back((
                    CqKind::Send,
                    WorkCompletion::new(wr.wr_id, status, WcOpcode::of(&wr.op), len),
                ));
            }
            self.try_free_sq(head);
        }
    }

    fn try_free_sq(&mut self, slot: u32) {
        let s = &mut self.sq[slot as usize];
        let Some(e) = s.e else {
            return;
        };
        if e.reported && e.resolved >= e.pumped && !e.in_fifo {
            s.e = None;
            s.gen = s.gen.wrapping_add(1);
            self.sq_free.push(slot);
        }
    }

    fn try_free_in(&mut self, slot: u32) {
        let Some(e) = self.inb[slot as usize].e else {
            return;
        };
        if !(e.dead || e.pumped >= e.nsegs) || e.resolved < e.pumped || e.in_fifo {
            return;
        }
        if e.ird {
            if let Some(p) = self.peers.get_mut(&e.peer) {
                p.ird_used = p.ird_used.saturating_sub(1);
            }
        }
        let s = &mut self.inb[slot as usize];
        s.e = None;
        s.gen = s.gen.wrapping_add(1);
        self.in_free.push(slot);
        self.maybe_drop_peer(e.peer);
    }

    /// Stops sending an inbound slot; it is freed once its tokens settle.
    fn kill_in(&mut self, slot: u32) {
        let Some(e) = self.inb[slot as usize].e.as_mut() else {
            return;
        };
        e.dead = true;
        let peer = e.peer;
        self.in_unlink(peer, slot);
        self.try_free_in(slot);
    }

    fn alloc_in(&mut self, for_terminate: bool) -> Option<u32> {
        if !for_terminate && self.in_free.len() <= self.term_reserve {
            return None;
        }
        self.in_free.pop()
    }

    fn push_event(&mut self, ev: DgramEvent) {
        if self.events.len() >= self.cfg.event_depth {
            self.stats.events_lost += 1;
        } else {
            self.events.push_back(ev);
        }
    }

    fn drain_tracker(&mut self) {
        while let Some(wc) = self.tracker.poll_completion() {
            self.completions.push_back((CqKind::Recv, wc));
        }
    }

    // ------------------------------------------------------------------
    // Reliability-layer events
    // ------------------------------------------------------------------

    fn drain_rd_events(&mut self) {
        while let Some(ev) = self.ep.poll_event() {
            match ev {
                Event::Acked { peer, token } => self.token_settled(peer, token, true),
                Event::Abandoned { peer, token } => self.token_settled(peer, token, false),
                Event::PeerFailed { peer, .. } => self.peer_failed(peer),
                Event::SessionStarted { peer, replaced } => {
                    self.fail_gated(peer);
                    if replaced {
                        self.abort_rx(peer);
                    }
                }
                Event::Resynced { peer, .. } => self.peer_resynced(peer),
                Event::PeerExpired { peer } => self.peer_expired(peer),
            }
        }
    }

    fn token_settled(&mut self, peer: DgramAddr, t: Token, acked: bool) {
        let slot = t.slot;
        match t.from {
            Source::Sq => {
                let Some(s) = self.sq.get_mut(slot as usize) else {
                    return;
                };
                if s.gen != t.gen {
                    return;
                }
                let Some(e) = s.e.as_mut() else {
                    return;
                };
                e.resolved += 1;
                if acked {
                    e.acked += 1;
                }
                if acked && !e.done && e.kind.acked_kind() && e.acked == e.nsegs {
                    self.candidates.push(slot);
                } else {
                    self.try_free_sq(slot);
                }
            }
            Source::Inbound => {
                let Some(s) = self.inb.get_mut(slot as usize) else {
                    return;
                };
                if s.gen != t.gen {
                    return;
                }
                let Some(e) = s.e.as_mut() else {
                    return;
                };
                e.resolved += 1;
                self.try_free_in(slot);
            }
        }
        self.mark_ready(peer);
    }

    /// Completes the requests acknowledged by the datagram just handled (or
    /// a timer): successfully, unless a Terminate failed them meanwhile, or
    /// later, when `gate` says the ACK came on a datagram not delivered (a
    /// Terminate before it may still be on its way).
    fn finalize(&mut self, gate: Option<(DgramAddr, u32, u32)>) {
        let mut c = std::mem::take(&mut self.candidates);
        for slot in c.drain(..) {
            let Some(e) = self.sq[slot as usize].e.as_mut() else {
                continue;
            };
            if e.done {
                continue;
            }
            match gate {
                Some((peer, epoch, psn)) if e.dest == peer => {
                    e.gated = true;
                    self.stats.tx_gated += 1;
                    if let Some(p) = self.peers.get_mut(&peer) {
                        p.gate = match p.gate {
                            Some((ge, g)) if ge == epoch && seq_after(g, psn) => Some((ge, g)),
                            _ => Some((epoch, psn)),
                        };
                    }
                }
                _ => {
                    let len = e.wr.payload.len() as u32;
                    self.complete(slot, WcStatus::Success, len);
                }
            }
        }
        self.candidates = c;
    }

    /// The peer's datagram (epoch, psn) was delivered: gated requests up to
    /// it succeed.
    fn release_gate(&mut self, peer: DgramAddr, epoch: u32, psn: u32) {
        let open = self
            .peers
            .get(&peer)
            .and_then(|p| p.gate)
            .is_some_and(|(ge, g)| ge == epoch && !seq_after(g, psn));
        if !open {
            return;
        }
        if let Some(p) = self.peers.get_mut(&peer) {
            p.gate = None;
        }
        self.settle_gated(peer, None);
    }

    /// The peer's session changed while requests were gated: their ACK
    /// can no longer be confirmed; they fail.
    fn fail_gated(&mut self, peer: DgramAddr) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if p.gate.take().is_some() {
            self.settle_gated(peer, Some(WcStatus::RetryExcErr));
        }
    }

    fn settle_gated(&mut self, peer: DgramAddr, error: Option<WcStatus>) {
        for i in 0..self.sq.len() {
            let Some(e) = self.sq[i].e.as_mut() else {
                continue;
            };
            if e.dest != peer || !e.gated {
                continue;
            }
            e.gated = false;
            let len = e.wr.payload.len() as u32;
            match error {
                None => self.complete(i as u32, WcStatus::Success, len),
                Some(st) => self.complete(i as u32, st, 0),
            }
        }
    }

    /// The reliability layer gave up on `peer`: everything of ours towards
    /// it fails; other peers are not touched.
    fn peer_failed(&mut self, peer: DgramAddr) {
        self.push_event(DgramEvent::PeerFailed { peer });
        self.fail_gated(peer);
        for i in 0..self.sq.len() {
            let hit = self.sq[i].e.is_some_and(|e| e.dest == peer && !e.done);
            if hit {
                self.complete(i as u32, WcStatus::RetryExcErr, 0);
            }
        }
        self.kill_inbound_of(peer);
    }

    fn kill_inbound_of(&mut self, peer: DgramAddr) {
        for i in 0..self.inb.len() {
            if self.inb[i].e.is_some_and(|e| e.peer == peer) {
                self.kill_in(i as u32);
            }
        }
    }

    /// The peer answered our session with a reset: it lost the session
    /// (a new incarnation of the process, or it forgot us), and the
    /// reliability layer re-sends our unacknowledged tokens in a new one.
    /// What the old session acknowledged went to a peer state that is
    /// gone, so:
    ///
    /// * a Send, Write or Write-Record acknowledged in part fails with
    ///   RetryExcErr (its rest would reach a receiver that never saw its
    ///   beginning); one acknowledged in none of its datagrams is simply
    ///   sent again, whole;
    /// * a Read or atomic whose request was acknowledged (or whose
    ///   response had begun) fails with RetryExcErr: the response will
    ///   never come, and completions are reported in posting order;
    /// * requests waiting for a gate fail (their ACK cannot be confirmed),
    ///   responses and Terminates to the old session are dropped, and the
    ///   message being received from the peer is abandoned;
    /// * nothing of the failed requests or dropped responses is sent in the
    ///   new session ([`RdEndpoint::discard_unsent`]).
    fn peer_resynced(&mut self, peer: DgramAddr) {
        self.fail_gated(peer);
        for i in 0..self.sq.len() {
            let Some(e) = self.sq[i].e else {
                continue;
            };
            if e.dest != peer || e.done || !e.started {
                continue;
            }
            let broken = if e.kind.acked_kind() {
                e.acked > 0 && e.acked < e.nsegs
            } else {
                e.awaiting && (e.acked > 0 || e.received > 0)
            };
            if broken {
                self.stats.tx_resync_failed += 1;
                self.complete(i as u32, WcStatus::RetryExcErr, 0);
            }
        }
        self.kill_inbound_of(peer);
        self.abort_rx(peer);
        let (sq, inb) = (&self.sq, &self.inb);
        self.ep.discard_unsent(&peer, |t| match t.from {
            Source::Sq => sq
                .get(t.slot as usize)
                .is_some_and(|s| s.gen == t.gen && s.e.is_some_and(|e| !e.done)),
            Source::Inbound => inb
                .get(t.slot as usize)
                .is_some_and(|s| s.gen == t.gen && s.e.is_some_and(|e| !e.dead)),
        });
        self.mark_ready(peer);
    }

    /// The reliability layer forgot `peer` after idle_timeout of quiet.
    fn peer_expired(&mut self, peer: DgramAddr) {
        self.abort_rx(peer);
        for i in 0..self.sq.len() {
            let hit = self.sq[i]
                .e
                .is_some_and(|e| e.dest == peer && e.awaiting && !e.done);
            if hit {
                self.complete(i as u32, WcStatus::RetryExcErr, 0);
            }
        }
        self.kill_inbound_of(peer);
        self.fail_gated(peer);
        if let Some(p) = self.peers.get_mut(&peer) {
            p.skip_send = None;
            p.skip_tagged = None;
            p.rx_tagged = None;
        }
        self.maybe_drop_peer(peer);
        self.mark_ready(peer);
    }

    /// The message being received from `peer` is abandoned: its receive
    /// returns to the queue at its posting position.
    fn abort_rx(&mut self, peer: DgramAddr) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        p.skip_send = None;
        p.skip_tagged = None;
        p.rx_tagged = None;
        if let Some(m) = p.rx.take() {
            self.rq.give_back(m.seq, m.wr);
        }
    }

    // ------------------------------------------------------------------
    // Transmit
    // ------------------------------------------------------------------

    /// Hands datagrams to `sink` in batches of up to [`TX_BATCH`] until
    /// nothing is left or the sink stops accepting (`WouldBlock`: the
    /// datagram stays pending and is offered first next time). Returns the
    /// number accepted. Another sink error drops the datagram it refused
    /// (the reliability layer will resend it) and is returned.
    pub fn poll_transmit<M: Memory, S: DatagramSink>(
        &mut self,
        mem: &M,
        sink: &mut S,
    ) -> io::Result<usize> {
        let mut total = 0;
        let res = loop {
            self.pump_all();
            let mut drained = false;
            while self.pending.len() < TX_BATCH {
                match self.ep.poll_transmit(self.now) {
                    Some(t) => self.pending.push_back(t),
                    None => {
                        drained = true;
                        break;
                    }
                }
            }
            let mut plans = std::mem::take(&mut self.plans);
            plans.clear();
            let mut i = 0;
            while i < self.pending.len() && plans.len() < TX_BATCH {
                let t = self.pending[i];
                match self.plan(&t, mem) {
                    Some(p) => {
                        plans.push(p);
                        i += 1;
                    }
                    None => {
                        self.pending.remove(i);
                        self.stats.tx_stale += 1;
                    }
                }
            }
            if plans.is_empty() {
                self.plans = plans;
                if drained {
                    self.maybe_tx = false;
                    break Ok(total);
                }
                continue;
            }
            let mut stage = std::mem::take(&mut self.stage);
            // `offered` may be fewer than `plans.len()` (the staging buffer
            // full): only a sink that took fewer than it was offered pushed
            // back. A lone datagram (a ping-pong's answer, an ACK) goes
            // with one-entry arrays: the batch's would be written whole.
            let (offered, sent) = if plans.len() == 1 {
                self.send_plans::<M, S, 1, IOV_PER>(mem, sink, &plans, &mut stage)
            } else {
                self.send_plans::<M, S, TX_BATCH, { TX_BATCH * IOV_PER }>(
                    mem, sink, &plans, &mut stage,
                )
            };
            self.stage = stage;
            self.plans = plans;
            match sent {
                Ok(k) => {
                    let k = k.min(offered);
                    for _ in 0..k {
                        self.pending.pop_front();
                    }
                    self.stats.tx_datagrams += k as u64;
                    total += k;
                    if k < offered {
                        break Ok(total);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(total),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.pending.pop_front();
                    self.stats.tx_socket_errors += 1;
                    break Err(e);
                }
            }
        };
        self.refresh();
        res
    }

    /// [`RdQp::set_now`], then [`RdQp::poll_transmit`].
    pub fn poll_transmit_at<M: Memory, S: DatagramSink>(
        &mut self,
        mem: &M,
        sink: &mut S,
        now: Instant,
    ) -> io::Result<usize> {
        self.set_now(now);
        self.poll_transmit(mem, sink)
    }

    /// The header and payload source of one datagram; `None` if its token
    /// is settled already (nothing to send).
    fn plan<M: Memory>(&mut self, t: &Transmit<DgramAddr, Token>, mem: &M) -> Option<Plan> {
        let mut p = Plan {
            dest: (t.peer.ip, t.peer.port),
            ..Plan::EMPTY
        };
        match t.token {
            None => {
                p.hlen = wrd::emit_header(&t.shim, None, &mut p.hdr);
            }
            Some(tok) => {
                let (repr, body) = match tok.from {
                    Source::Sq => self.sq_segment_checked(tok, mem)?,
                    Source::Inbound => self.in_segment_checked(tok, mem)?,
                };
                p.hlen = wrd::emit_header(&t.shim, Some(&repr), &mut p.hdr);
                p.body = body;
            }
        }
        Some(p)
    }

    fn sq_segment_checked<M: Memory>(
        &mut self,
        tok: Token,
        mem: &M,
    ) -> Option<(SegmentRepr, Body)> {
        let s = self.sq.get(tok.slot as usize)?;
        if s.gen != tok.gen {
            return None;
        }
        let e = s.e?;
        let (repr, body) = self.sq_segment(&e, tok.slot, tok.seg)?;
        let Body::Local { off, len, .. } = body else {
            return Some((repr, body));
        };
        if gather_ok(mem, &e.wr.payload, off, len) {
            return Some((repr, body));
        }
        // The source went away in flight: abort the request; this
        // datagram becomes a sender-abort Terminate.
        if !e.done {
            self.stats.tx_aborted += 1;
            self.complete(tok.slot, WcStatus::LocProtErr, 0);
        }
        let mut msn = e.abort_msn;
        if msn == 0 {
            msn = self.peers.get_mut(&e.dest).map_or(1, |p| p.next_term());
            if let Some(x) = self.sq[tok.slot as usize].e.as_mut() {
                x.abort_msn = msn;
            }
        }
        let spec = TermSpec {
            cause: TerminateCause::RdmapLocalCatastrophic,
            echo: echo_of(&repr),
            seg_len: None,
            rdmap: None,
            about: e.msn,
        };
        Some((self.terminate_repr(&spec, msn, e.dest.qpn), Body::None))
    }

    /// Segment `seg` of the request in send-queue slot `slot`.
    fn sq_segment(&self, e: &SqEntry, slot: u32, seg: u32) -> Option<(SegmentRepr, Body)> {
        let dqpn = Some(self.dqpn_word(e.dest.qpn));
        let total = e.wr.payload.len();
        let last = seg + 1 >= e.nsegs;
        let solicited = e.wr.flags.solicited;
        let off = u64::from(seg) * u64::from(e.room);
        let len = u64::from(e.room).min(total.saturating_sub(off));
        let repr = match e.wr.op {
            SendOp::Send { imm, .. } => {
                if seg >= e.data_segs {
                    let op = if solicited {
                        Opcode::ImmediateDataSe
                    } else {
                        Opcode::ImmediateData
                    };
                    let mut r = SegmentRepr::untagged(
                        op,
                        0,
                        e.msn,
                        total as u32,
                        true,
                        RdmapBody::Immediate(u64::from(imm.unwrap_or(0))),
                    );
                    set_rsvd_ulp(&mut r, self.cfg.qpn);
                    r.dqpn = dqpn;
                    return Some((r, Body::None));
                }
                let op = if solicited {
                    Opcode::SendSe
                } else {
                    Opcode::Send
                };
                let mut r = SegmentRepr::untagged(
                    op,
                    0,
                    e.msn,
                    off as u32,
                    last && imm.is_none(),
                    RdmapBody::None,
                );
                set_rsvd_ulp(&mut r, self.cfg.qpn);
                r.dqpn = dqpn;
                r
            }
            SendOp::Write {
                remote_addr, rkey, ..
            }
            | SendOp::WriteRecord { remote_addr, rkey } => {
                let op = if e.kind == Kind::WriteRecord {
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
            SendOp::Read { remote_addr, rkey } => {
                let first = match e.wr.payload {
                    Payload::Sgl(s) => s.as_slice().first().copied().unwrap_or_default(),
                    Payload::Inline(_) => Default::default(),
                };
                let req = ReadRequest {
                    sink_stag: first.lkey,
                    sink_to: first.addr,
                    size: total as u32,
                    src_stag: rkey,
                    src_to: remote_addr,
                };
                let mut r = SegmentRepr::untagged(
                    Opcode::ReadRequest,
                    1,
                    e.msn,
                    0,
                    true,
                    RdmapBody::ReadRequest(req),
                );
                r.dqpn = dqpn;
                return Some((r, Body::None));
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                let mut r = atomic_request(WireAtomicOp::CompareSwap, e.msn, rkey, remote_addr);
                if let RdmapBody::AtomicRequest(a) = &mut r.body {
                    a.add_swap = swap;
                    a.compare = compare;
                }
                r.dqpn = dqpn;
                return Some((r, Body::None));
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                let mut r = atomic_request(WireAtomicOp::FetchAdd, e.msn, rkey, remote_addr);
                if let RdmapBody::AtomicRequest(a) = &mut r.body {
                    a.add_swap = add;
                }
                r.dqpn = dqpn;
                return Some((r, Body::None));
            }
            SendOp::LocalInvalidate { .. } => return None,
        };
        Some((repr, Body::Local { slot, off, len }))
    }

    fn in_segment_checked<M: Memory>(
        &mut self,
        tok: Token,
        mem: &M,
    ) -> Option<(SegmentRepr, Body)> {
        let s = self.inb.get(tok.slot as usize)?;
        if s.gen != tok.gen {
            return None;
        }
        let e = s.e?;
        let dqpn = Some(self.dqpn_word(e.peer.qpn));
        match e.kind {
            InKind::Read { req, msn } => {
                let off = u64::from(tok.seg) * u64::from(e.room);
                let len = u64::from(e.room).min(u64::from(req.size).saturating_sub(off));
                let src_to = req.src_to.wrapping_add(off);
                match mem.remote_read(req.src_stag, src_to, len) {
                    Ok(_) => {
                        let repr = SegmentRepr {
                            ddp: DdpHeader::Tagged {
                                stag: req.sink_stag,
                                to: req.sink_to.wrapping_add(off),
                                ext: Some(TaggedExt {
                                    msn,
                                    mo: off as u32,
                                }),
                            },
                            dqpn,
                            ..SegmentRepr::tagged(
                                Opcode::ReadResponse,
                                req.sink_stag,
                                0,
                                tok.seg + 1 >= e.nsegs,
                            )
                        };
                        Some((
                            repr,
                            Body::Remote {
                                stag: req.src_stag,
                                to: src_to,
                                len,
                            },
                        ))
                    }
                    Err(error) => {
                        // The source failed the checks after the request
                        // was accepted: the Read fails at the requester.
                        if !e.reported {
                            self.stats.rx_access_errors += 1;
                            self.push_event(DgramEvent::RemoteAccess {
                                src: e.peer,
                                opcode: Opcode::ReadRequest,
                                msn,
                                stag: req.src_stag,
                                to: src_to,
                                len: len as u32,
                                error,
                            });
                        }
                        let mut tmsn = e.abort_msn;
                        if tmsn == 0 {
                            tmsn = self.peers.get_mut(&e.peer).map_or(1, |p| p.next_term());
                        }
                        if let Some(x) = self.inb[tok.slot as usize].e.as_mut() {
                            x.reported = true;
                            x.abort_msn = tmsn;
                        }
                        self.kill_in(tok.slot);
                        let req_repr = SegmentRepr::untagged(
                            Opcode::ReadRequest,
                            1,
                            msn,
                            0,
                            true,
                            RdmapBody::ReadRequest(req),
                        );
                        let spec = TermSpec {
                            cause: error.terminate_cause(false),
                            echo: echo_of(&req_repr),
                            seg_len: None,
                            rdmap: Some(req.to_bytes()),
                            about: msn,
                        };
                        Some((self.terminate_repr(&spec, tmsn, e.peer.qpn), Body::None))
                    }
                }
            }
            InKind::Atomic { resp, msn } => {
                let mut r = SegmentRepr::untagged(
                    Opcode::AtomicResponse,
                    3,
                    msn,
                    0,
                    true,
                    RdmapBody::AtomicResponse(resp),
                );
                r.dqpn = dqpn;
                Some((r, Body::None))
            }
            InKind::Terminate {
                term, about, msn, ..
            } => {
                let mut r = SegmentRepr::untagged(
                    Opcode::Terminate,
                    2,
                    msn,
                    0,
                    true,
                    RdmapBody::Terminate(term),
                );
                set_rsvd_ulp(&mut r, about);
                r.dqpn = dqpn;
                Some((r, Body::None))
            }
        }
    }

    fn terminate_repr(&self, spec: &TermSpec, msn: u32, dest_qpn: u32) -> SegmentRepr {
        let term = TerminateRepr {
            cause: spec.cause,
            segment_len: spec.seg_len,
            ddp_header: spec.echo,
            rdmap_header: spec.rdmap,
        };
        let mut r = SegmentRepr::untagged(
            Opcode::Terminate,
            2,
            msn,
            0,
            true,
            RdmapBody::Terminate(term),
        );
        set_rsvd_ulp(&mut r, spec.about);
        r.dqpn = Some(self.dqpn_word(dest_qpn));
        r
    }

    /// Frames the planned datagrams and offers them to the sink: from
    /// [`STAGE_MIN_BATCH`] on, as many as the staging buffer holds framed
    /// contiguously there (one io-vector each, as UD's batches;
    /// `docs/datagram.md` §12.5); otherwise gathered from memory. Returns
    /// how many were offered (a prefix of `plans`) and what the sink said.
    /// `B` sizes the arrays it fills (at most `B` plans are sent; `IOV` is
    /// `B * IOV_PER`): 1 for a lone datagram, whose arrays would otherwise
    /// be a whole batch's, written on every call.
    fn send_plans<M: Memory, S: DatagramSink, const B: usize, const IOV: usize>(
        &self,
        mem: &M,
        sink: &mut S,
        plans: &[Plan],
        stage: &mut Vec<u8>,
    ) -> (usize, io::Result<usize>) {
        debug_assert!(IOV == B * IOV_PER && (1..=B).contains(&plans.len()));
        let plans = &plans[..plans.len().min(B)];
        let n = plans.len();
        let mut trailers = [[0u8; CRC_LEN]; B];
        let mut pieces: [[&[u8]; MAX_SGE]; B] = [[&[]; MAX_SGE]; B];
        let mut npieces = [0usize; B];
        for (j, p) in plans.iter().enumerate() {
            npieces[j] = match p.body {
                Body::None => 0,
                Body::Local { slot, off, len } => match self.sq[slot as usize].e.as_ref() {
                    Some(e) => payload_pieces(mem, &e.wr.payload, off, len, &mut pieces[j]),
                    None => 0,
                },
                Body::Remote { stag, to, len } => {
                    pieces[j][0] = mem.remote_read(stag, to, len).unwrap_or(&[]);
                    usize::from(len > 0)
                }
            };
        }
        if n >= STAGE_MIN_BATCH {
            let mut dests = [plans[0].dest; B];
            for (d, p) in dests.iter_mut().zip(plans) {
                *d = p.dest;
            }
            let staged = offer_staged(sink, stage, &dests[..n], |j, room| {
                let hdr = &plans[j].hdr[..plans[j].hlen];
                let body = &pieces[j][..npieces[j]];
                let len = hdr.len() + body.iter().map(|b| b.len()).sum::<usize>();
                if len > room.len() {
                    return None;
                }
                room[..hdr.len()].copy_from_slice(hdr);
                let mut at = hdr.len();
                for b in body {
                    room[at..at + b.len()].copy_from_slice(b);
                    at += b.len();
                }
                Some(len)
            });
            if let Some(r) = staged {
                return r;
            }
        }
        for (j, p) in plans.iter().enumerate() {
            trailers[j] = datagram::trailer(&p.hdr[..p.hlen], &pieces[j][..npieces[j]]);
        }
        let mut iov = [IoSlice::new(&[]); IOV];
        let mut bounds = [(0usize, 0usize); B];
        let mut k = 0;
        for j in 0..n {
            let start = k;
            iov[k] = IoSlice::new(&plans[j].hdr[..plans[j].hlen]);
            k += 1;
            for piece in &pieces[j][..npieces[j]] {
                iov[k] = IoSlice::new(piece);
                k += 1;
            }
            iov[k] = IoSlice::new(&trailers[j]);
            k += 1;
            bounds[j] = (start, k);
        }
        let mut dests = [plans[0].dest; B];
        for (d, p) in dests.iter_mut().zip(plans) {
            *d = p.dest;
        }
        (n, offer::<S, B>(sink, &dests[..n], &iov, &bounds[..n]))
    }

    // ------------------------------------------------------------------
    // Receive
    // ------------------------------------------------------------------

    /// Takes one UDP payload that arrived from `src_ip:src_port`. The shim
    /// goes to the reliability layer; a segment it delivers is acted on
    /// (placed, scattered, answered). Anything wrong is counted and
    /// dropped or answered with a Terminate; nothing stops the QP.
    pub fn handle_datagram<M: Memory>(
        &mut self,
        src_ip: IpAddr,
        src_port: u16,
        data: &[u8],
        mem: &mut M,
        now: Instant,
    ) {
        self.set_now(now);
        let now = self.now;
        self.stats.rx_datagrams += 1;
        let (shim, seg) = match wrd::split(data) {
            Ok((Some(s), seg)) => (s, seg),
            Ok((None, _)) => {
                self.stats.rx_not_rd += 1;
                return;
            }
            Err(WireError::BadCrc) => {
                self.stats.rx_bad_crc += 1;
                return;
            }
            Err(_) => {
                self.stats.rx_malformed += 1;
                return;
            }
        };
        let src = DgramAddr {
            ip: src_ip.to_canonical(),
            port: src_port,
            qpn: shim.src_qpn,
        };
        let mut shim_in = shim;
        let mut parsed = None;
        if shim.data.is_some() {
            match SegmentRepr::parse(seg, datagram::MODE) {
                Ok((repr, h)) if repr.dqpn.is_none_or(|q| q & MAX_QPN == shim.dst_qpn) => {
                    parsed = Some((repr, h));
                }
                _ => {
                    // Not acknowledged: the sender resends it, and a peer
                    // that keeps sending garbage fails by the retry limit.
                    self.stats.rx_malformed += 1;
                    shim_in.data = None;
                    shim_in.poll = false;
                }
            }
        }
        let verdict = self.ep.handle_datagram(src, &shim_in, now);
        self.maybe_tx = true;
        match verdict {
            Verdict::Deliver | Verdict::Control => {}
            Verdict::Duplicate => self.stats.rx_duplicates += 1,
            Verdict::Drop(crate::rd::DropReason::WrongQp) => self.stats.rx_wrong_qp += 1,
            Verdict::Drop(_) => self.stats.rx_not_delivered += 1,
        }
        // The events first (sessions, failures, acknowledged tokens), then
        // the segment, and only then do acknowledged requests succeed: a
        // Terminate carrying the ACK of the request it fails is acted on
        // first. An ACK on a datagram not delivered may have overtaken a
        // Terminate; its requests wait until that datagram is delivered.
        self.drain_rd_events();
        if verdict == Verdict::Deliver {
            if let Some((repr, h)) = parsed {
                self.peers.get_or_insert_with(src, PeerState::new);
                self.rx_segment(src, &repr, &seg[h..], seg, mem, now);
            }
            if let Some(d) = shim_in.data {
                self.release_gate(src, d.epoch, d.psn);
            }
        }
        let gate = match (verdict, shim_in.data) {
            (Verdict::Drop(_), Some(d)) => Some((src, d.epoch, d.psn)),
            _ => None,
        };
        self.finalize(gate);
        self.pump_all();
        self.refresh();
    }

    fn rx_segment<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        payload: &[u8],
        seg: &[u8],
        mem: &mut M,
        now: Instant,
    ) {
        match repr.opcode {
            Opcode::Send | Opcode::SendSe | Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                self.rx_send(src, repr, payload, seg, mem)
            }
            Opcode::RdmaWrite | Opcode::WriteRecord => {
                self.rx_tagged(src, repr, payload, seg, mem, now)
            }
            Opcode::ReadRequest => self.rx_read_request(src, repr, seg, mem),
            Opcode::AtomicRequest => self.rx_atomic_request(src, repr, seg, mem),
            Opcode::ReadResponse => self.rx_read_response(src, repr, payload, mem),
            Opcode::AtomicResponse => self.rx_atomic_response(src, repr, mem),
            Opcode::Terminate => self.rx_terminate(src, repr),
            _ => {
                // Send with Invalidate (not used on RD) and unknown opcodes.
                self.stats.rx_inconsistent += 1;
                let about = msn_of(repr);
                self.queue_terminate(
                    src,
                    TermSpec::about(TerminateCause::RdmapUnexpectedOpcode, seg, about),
                );
            }
        }
    }

    /// Queues a Terminate to `peer` about the datagram just delivered from
    /// it, as a report ([`RdEndpoint::send_report`]).
    fn queue_terminate(&mut self, peer: DgramAddr, spec: TermSpec) {
        let Some(slot) = self.alloc_in(true) else {
            self.stats.terminates_dropped += 1;
            return;
        };
        let Some(p) = self.peers.get_mut(&peer) else {
            self.in_free.push(slot);
            return;
        };
        let msn = p.next_term();
        let term = TerminateRepr {
            cause: spec.cause,
            segment_len: spec.seg_len,
            ddp_header: spec.echo,
            rdmap_header: spec.rdmap,
        };
        self.inb[slot as usize].e = Some(InEntry {
            peer,
            kind: InKind::Terminate {
                term,
                about: spec.about,
                msn,
            },
            room: 0,
            nsegs: 1,
            pumped: 0,
            resolved: 0,
            ird: false,
            dead: false,
            reported: false,
            abort_msn: 0,
            in_fifo: false,
            next: NIL,
        });
        // A report to the reliability layer: ahead of everything unsent,
        // past a full window, and the ACK of the datagram it is about
        // travels only with it or after it.
        let token = Token {
            from: Source::Inbound,
            slot,
            gen: self.inb[slot as usize].gen,
            seg: 0,
        };
        if self.ep.send_report(peer, token, self.now).is_err() {
            self.stats.terminates_dropped += 1;
            self.kill_in(slot);
            return;
        }
        self.maybe_tx = true;
        self.stats.terminates_sent += 1;
        if let Some(e) = self.inb[slot as usize].e.as_mut() {
            e.pumped = 1;
        }
    }

    fn rx_send<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        payload: &[u8],
        seg: &[u8],
        mem: &mut M,
    ) {
        let DdpHeader::Untagged { qn, msn, mo, .. } = repr.ddp else {
            return;
        };
        let imm_seg = matches!(repr.opcode, Opcode::ImmediateData | Opcode::ImmediateDataSe);
        let end = u64::from(mo) + payload.len() as u64;
        let Some(p) = self.peers.get_mut(&src) else {
            return;
        };
        if p.skip_send == Some(msn) {
            self.stats.rx_skipped += 1;
            return;
        }
        p.skip_send = None;
        if qn != 0 || (imm_seg && !repr.last) || end > u64::from(u32::MAX) {
            let cause = if qn != 0 {
                TerminateCause::DdpUntaggedInvalidQn
            } else {
                TerminateCause::RdmapCatastrophicStream
            };
            return self.rx_send_fail(src, msn, repr.last, None, cause, seg);
        }
        if let Some(m) = p.rx {
            if m.msn != msn {
                // The previous message never ended (a misbehaving sender):
                // abandon it.
                self.stats.rx_inconsistent += 1;
                p.rx = None;
                self.rq.give_back(m.seq, m.wr);
            }
        }
        let Some(p) = self.peers.get_mut(&src) else {
            return;
        };
        let mut m = match p.rx {
            Some(m) => m,
            None => {
                if mo != 0 {
                    // Its beginning was not received here (this side or
                    // the sender restarted, or a hostile sender): never
                    // taken for a new message; the sender learns it.
                    self.stats.rx_orphan_segments += 1;
                    return self.rx_send_fail(
                        src,
                        msn,
                        repr.last,
                        None,
                        TerminateCause::DdpUntaggedInvalidMo,
                        seg,
                    );
                }
                let Some((seq, wr)) = self.rq.take() else {
                    self.stats.rx_no_recv += 1;
                    return self.rx_send_fail(
                        src,
                        msn,
                        repr.last,
                        None,
                        TerminateCause::DdpUntaggedNoBuffer,
                        seg,
                    );
                };
                let grh = self.grh_len();
                let cap = wr.sgl.total_len().saturating_sub(grh).min(self.cfg.max_msg);
                if wr.sgl.total_len() < grh {
                    self.stats.rx_len_err += 1;
                    return self.rx_send_fail(
                        src,
                        msn,
                        repr.last,
                        Some((wr, WcStatus::LocLenErr)),
                        TerminateCause::DdpUntaggedTooLong,
                        seg,
                    );
                }
                RxMsg {
                    msn,
                    seq,
                    wr,
                    cap,
                    received: 0,
                }
            }
        };
        if let Some(p) = self.peers.get_mut(&src) {
            p.rx = None;
        }
        if mo != m.received {
            self.stats.rx_inconsistent += 1;
            self.rq.give_back(m.seq, m.wr);
            return self.rx_send_fail(
                src,
                msn,
                repr.last,
                None,
                TerminateCause::DdpUntaggedInvalidMo,
                seg,
            );
        }
        if end > m.cap {
            self.stats.rx_len_err += 1;
            return self.rx_send_fail(
                src,
                msn,
                repr.last,
                Some((m.wr, WcStatus::LocLenErr)),
                TerminateCause::DdpUntaggedTooLong,
                seg,
            );
        }
        let grh = self.grh_len();
        if !payload.is_empty() && scatter(mem, &m.wr.sgl, grh + u64::from(mo), payload).is_err() {
            self.stats.rx_prot_err += 1;
            return self.rx_send_fail(
                src,
                msn,
                repr.last,
                Some((m.wr, WcStatus::LocProtErr)),
                TerminateCause::DdpLocalCatastrophic,
                seg,
            );
        }
        m.received = end as u32;
        if !repr.last {
            if let Some(p) = self.peers.get_mut(&src) {
                p.rx = Some(m);
            }
            return;
        }
        let imm = match repr.body {
            RdmapBody::Immediate(v) if imm_seg => Some(v as u32),
            _ => None,
        };
        self.finish_recv(src, m.wr, end as u32, imm, repr.opcode.is_solicited(), mem);
    }

    /// A Send message failed here: its receive (if it took one) completes
    /// with `recv`'s status, its later segments are dropped, and the sender
    /// gets a Terminate (a report: it cannot be overtaken by the ACK).
    fn rx_send_fail(
        &mut self,
        src: DgramAddr,
        msn: u32,
        last: bool,
        recv: Option<(RecvWr, WcStatus)>,
        cause: TerminateCause,
        seg: &[u8],
    ) {
        if let Some(p) = self.peers.get_mut(&src) {
            if let Some(m) = p.rx.take() {
                self.rq.give_back(m.seq, m.wr);
            }
            if !last {
                p.skip_send = Some(msn);
            }
        }
        if let Some((wr, status)) = recv {
            self.rq.consumed();
            let mut wc = WorkCompletion::new(wr.wr_id, status, WcOpcode::Recv, 0);
            wc.src = Some(src);
            self.completions.push_back((CqKind::Recv, wc));
        }
        self.queue_terminate(src, TermSpec::about(cause, seg, msn));
    }

    fn finish_recv<M: Memory>(
        &mut self,
        src: DgramAddr,
        wr: RecvWr,
        total: u32,
        imm: Option<u32>,
        solicited: bool,
        mem: &mut M,
    ) {
        if let Some(ours) = self.cfg.grh {
            let h = grh_header(src.ip, ours, u64::from(total));
            if scatter(mem, &wr.sgl, 0, &h).is_err() {
                self.stats.rx_prot_err += 1;
                self.rq.consumed();
                let mut wc = WorkCompletion::new(wr.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0);
                wc.src = Some(src);
                self.completions.push_back((CqKind::Recv, wc));
                return;
            }
        }
        self.rq.consumed();
        self.stats.rx_delivered += 1;
        let mut wc = WorkCompletion::new(
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            total.saturating_add(self.grh_len() as u32),
        );
        wc.imm = imm;
        wc.solicited = solicited;
        wc.src = Some(src);
        self.completions.push_back((CqKind::Recv, wc));
    }

    fn grh_len(&self) -> u64 {
        if self.cfg.grh.is_some() {
            GRH_LEN as u64
        } else {
            0
        }
    }

    fn rx_tagged<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        payload: &[u8],
        seg: &[u8],
        mem: &mut M,
        now: Instant,
    ) {
        let DdpHeader::Tagged { stag, to, ext } = repr.ddp else {
            return;
        };
        let (msn, mo) = ext.map_or((0, 0), |e| (e.msn, e.mo));
        let Some(p) = self.peers.get_mut(&src) else {
            return;
        };
        if ext.is_some() && p.skip_tagged == Some(msn) {
            self.stats.rx_skipped += 1;
            return;
        }
        p.skip_tagged = None;
        if ext.is_some() {
            if p.rx_tagged.is_some_and(|(m, _)| m != msn) {
                // The previous message never ended (its sender gave up
                // on it).
                self.stats.rx_inconsistent += 1;
                p.rx_tagged = None;
            }
            let expected = p.rx_tagged.map_or(0, |(_, next)| next);
            if mo != expected {
                // A segment from the middle of a message whose beginning
                // (or the segment before) was not received here: a restart
                // on either side, or a hostile sender. Not placed.
                self.stats.rx_orphan_segments += 1;
                p.rx_tagged = None;
                if !repr.last {
                    p.skip_tagged = Some(msn);
                }
                let cause = TerminateCause::RdmapCatastrophicStream;
                self.queue_terminate(src, TermSpec::about(cause, seg, msn));
                return;
            }
            let end = u64::from(mo) + payload.len() as u64;
            p.rx_tagged = match u32::try_from(end) {
                Ok(next) if !repr.last => Some((msn, next)),
                _ => None,
            };
        }
        let record = repr.opcode == Opcode::WriteRecord;
        // A Write-Record segment the tracker will drop as stale (a late
        // segment of a message already retired) is checked, not placed:
        // memory changes only where the log says.
        let res = self
            .tracker
            .place_tagged(mem, record, src, stag, to, mo, msn, payload);
        if let Err(error) = res {
            self.stats.rx_access_errors += 1;
            self.push_event(DgramEvent::RemoteAccess {
                src,
                opcode: repr.opcode,
                msn,
                stag,
                to,
                len: payload.len() as u32,
                error,
            });
            if let Some(p) = self.peers.get_mut(&src) {
                p.rx_tagged = None;
                if !repr.last && ext.is_some() {
                    p.skip_tagged = Some(msn);
                }
            }
            self.queue_terminate(src, TermSpec::about(error.terminate_cause(true), seg, msn));
            return;
        }
        if record {
            self.stats.rx_record_segments += 1;
            self.tracker
                .placed(src, stag, to, mo, msn, payload.len() as u32, repr.last, now);
            self.drain_tracker();
        } else {
            self.stats.rx_write_segments += 1;
        }
    }

    /// Whether a new Read / atomic from `src` fits IRD and the pool.
    fn ird_room(&self, src: DgramAddr) -> bool {
        self.peers
            .get(&src)
            .is_some_and(|p| p.ird_used < self.cfg.ird)
            && self.in_free.len() > self.term_reserve
    }

    fn rx_read_request<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        seg: &[u8],
        mem: &mut M,
    ) {
        let (DdpHeader::Untagged { qn, msn, .. }, RdmapBody::ReadRequest(req)) =
            (repr.ddp, repr.body)
        else {
            return;
        };
        let mut spec = TermSpec::about(TerminateCause::DdpUntaggedInvalidQn, seg, msn);
        spec.rdmap = Some(req.to_bytes());
        if qn != 1 {
            self.stats.rx_inconsistent += 1;
            return self.queue_terminate(src, spec);
        }
        if !self.ird_room(src) {
            self.stats.rx_ird_exceeded += 1;
            spec.cause = TerminateCause::MpaInsufficientIrd;
            return self.queue_terminate(src, spec);
        }
        if let Err(error) = mem.remote_read(req.src_stag, req.src_to, u64::from(req.size)) {
            self.stats.rx_access_errors += 1;
            self.push_event(DgramEvent::RemoteAccess {
                src,
                opcode: Opcode::ReadRequest,
                msn,
                stag: req.src_stag,
                to: req.src_to,
                len: req.size,
                error,
            });
            spec.cause = error.terminate_cause(false);
            return self.queue_terminate(src, spec);
        }
        let room = self.room(src.ip, true);
        let nsegs = u64::from(req.size).div_ceil(u64::from(room)).max(1) as u32;
        self.stats.rx_read_requests += 1;
        self.add_inbound(src, InKind::Read { req, msn }, room, nsegs);
    }

    fn add_inbound(&mut self, src: DgramAddr, kind: InKind, room: u32, nsegs: u32) {
        let Some(slot) = self.alloc_in(false) else {
            return;
        };
        self.inb[slot as usize].e = Some(InEntry {
            peer: src,
            kind,
            room,
            nsegs,
            pumped: 0,
            resolved: 0,
            ird: true,
            dead: false,
            reported: false,
            abort_msn: 0,
            in_fifo: false,
            next: NIL,
        });
        if let Some(p) = self.peers.get_mut(&src) {
            p.ird_used += 1;
        }
        self.in_push(src, slot);
        self.mark_ready(src);
    }

    fn rx_atomic_request<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        seg: &[u8],
        mem: &mut M,
    ) {
        let (DdpHeader::Untagged { qn, msn, .. }, RdmapBody::AtomicRequest(req)) =
            (repr.ddp, repr.body)
        else {
            return;
        };
        let mut spec = TermSpec::about(TerminateCause::DdpUntaggedInvalidQn, seg, msn);
        if qn != 1 {
            self.stats.rx_inconsistent += 1;
            return self.queue_terminate(src, spec);
        }
        let op = match req.op {
            WireAtomicOp::FetchAdd => AtomicOp::FetchAdd(req.add_swap),
            WireAtomicOp::CompareSwap => AtomicOp::CompareSwap {
                compare: req.compare,
                swap: req.add_swap,
            },
            _ => {
                self.stats.rx_inconsistent += 1;
                spec.cause = TerminateCause::RdmapOperationUnspecified;
                return self.queue_terminate(src, spec);
            }
        };
        if !self.ird_room(src) {
            self.stats.rx_ird_exceeded += 1;
            spec.cause = TerminateCause::MpaInsufficientIrd;
            return self.queue_terminate(src, spec);
        }
        match mem.remote_atomic(req.stag, req.to, op) {
            Ok(orig) => {
                self.stats.rx_atomics += 1;
                let rmsn = self.peers.get_mut(&src).map_or(1, |p| {
                    let m = p.tx_resp;
                    p.tx_resp = m.wrapping_add(1);
                    m
                });
                let resp = AtomicResponse {
                    req_id: req.req_id,
                    orig_value: orig,
                };
                self.add_inbound(src, InKind::Atomic { resp, msn: rmsn }, 0, 1);
            }
            Err(error) => {
                self.stats.rx_access_errors += 1;
                self.push_event(DgramEvent::RemoteAccess {
                    src,
                    opcode: Opcode::AtomicRequest,
                    msn,
                    stag: req.stag,
                    to: req.to,
                    len: 8,
                    error,
                });
                spec.cause = error.terminate_cause(false);
                self.queue_terminate(src, spec);
            }
        }
    }

    /// The oldest unfinished request to `peer` that `pred` accepts.
    fn find_sq(&self, peer: DgramAddr, pred: impl Fn(&SqEntry) -> bool) -> Option<u32> {
        self.sq
            .iter()
            .enumerate()
            .find(|(_, s)| s.e.is_some_and(|e| e.dest == peer && !e.done && pred(&e)))
            .map(|(i, _)| i as u32)
    }

    fn rx_read_response<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        payload: &[u8],
        mem: &mut M,
    ) {
        let DdpHeader::Tagged {
            stag,
            to,
            ext: Some(TaggedExt { msn, mo }),
        } = repr.ddp
        else {
            self.stats.rx_unmatched_responses += 1;
            return;
        };
        let is_it = |e: &SqEntry| e.kind == Kind::Read && e.awaiting && e.msn == msn;
        // The Read being answered is usually the one answered last.
        let hint = self.peers.get(&src).map_or(NIL, |p| p.read_hint);
        let hinted = self
            .sq
            .get(hint as usize)
            .and_then(|s| s.e)
            .is_some_and(|e| e.dest == src && !e.done && is_it(&e));
        let found = if hinted {
            Some(hint)
        } else {
            self.find_sq(src, is_it)
        };
        let Some(slot) = found else {
            self.stats.rx_unmatched_responses += 1;
            return;
        };
        if let Some(p) = self.peers.get_mut(&src) {
            p.read_hint = slot;
        }
        let Some(e) = self.sq[slot as usize].e else {
            return;
        };
        let Payload::Sgl(sgl) = e.wr.payload else {
            return;
        };
        let first = sgl.as_slice().first().copied().unwrap_or_default();
        let size = sgl.total_len();
        let end = u64::from(mo) + payload.len() as u64;
        let fits = stag == first.lkey
            && to.wrapping_sub(u64::from(mo)) == first.addr
            && mo == e.received
            && end <= size
            && (!repr.last || end == size);
        if !fits {
            self.stats.rx_inconsistent += 1;
            return self.complete(slot, WcStatus::RemOpErr, 0);
        }
        if !payload.is_empty() && scatter(mem, &sgl, u64::from(mo), payload).is_err() {
            return self.complete(slot, WcStatus::LocProtErr, 0);
        }
        self.stats.rx_read_segments += 1;
        if let Some(e) = self.sq[slot as usize].e.as_mut() {
            e.received = end as u32;
        }
        if repr.last {
            self.complete(slot, WcStatus::Success, size as u32);
        }
    }

    fn rx_atomic_response<M: Memory>(&mut self, src: DgramAddr, repr: &SegmentRepr, mem: &mut M) {
        let RdmapBody::AtomicResponse(resp) = repr.body else {
            return;
        };
        let Some(slot) = self.find_sq(src, |e| {
            e.kind == Kind::Atomic && e.awaiting && e.msn == resp.req_id
        }) else {
            self.stats.rx_unmatched_responses += 1;
            return;
        };
        let Some(Payload::Sgl(sgl)) = self.sq[slot as usize].e.map(|e| e.wr.payload) else {
            return;
        };
        match scatter(mem, &sgl, 0, &resp.orig_value.to_ne_bytes()) {
            Ok(()) => self.complete(slot, WcStatus::Success, 8),
            Err(_) => self.complete(slot, WcStatus::LocProtErr, 0),
        }
    }

    fn rx_terminate(&mut self, src: DgramAddr, repr: &SegmentRepr) {
        self.stats.rx_terminates += 1;
        let (
            DdpHeader::Untagged {
                rsvd_ulp: about, ..
            },
            RdmapBody::Terminate(t),
        ) = (repr.ddp, repr.body)
        else {
            return;
        };
        let Some(echo) = t.ddp_header else {
            self.stats.rx_unmatched_terminates += 1;
            return;
        };
        let v = echo.view();
        let tagged = v.tagged();
        let qn = v.qn();
        if t.cause == TerminateCause::RdmapLocalCatastrophic {
            // The sender of a message we are receiving aborted it (one
            // such Terminate per datagram it had queued).
            if let Some(p) = self.peers.get_mut(&src) {
                if tagged {
                    p.skip_tagged = Some(about);
                    if p.rx_tagged.is_some_and(|(m, _)| m == about) {
                        p.rx_tagged = None;
                    }
                } else if qn == Some(0) {
                    if let Some(m) = p.rx.filter(|m| m.msn == about) {
                        p.rx = None;
                        self.rq.give_back(m.seq, m.wr);
                        self.stats.rx_aborted += 1;
                    }
                    if let Some(p) = self.peers.get_mut(&src) {
                        p.skip_send = Some(about);
                    }
                }
            }
            return;
        }
        // About a message of ours.
        let status = status_of(t.cause);
        let slot = if tagged {
            self.find_sq(src, |e| {
                matches!(e.kind, Kind::Write | Kind::WriteRecord) && e.started && e.msn == about
            })
        } else {
            match qn {
                Some(0) => {
                    self.find_sq(src, |e| e.kind == Kind::Send && e.started && e.msn == about)
                }
                Some(1) => self.find_sq(src, |e| {
                    matches!(e.kind, Kind::Read | Kind::Atomic) && e.started && e.msn == about
                }),
                _ => None,
            }
        };
        match slot {
            Some(s) => self.complete(s, status, 0),
            None => self.stats.rx_unmatched_terminates += 1,
        }
    }
}

impl TermSpec {
    /// A Terminate about the segment `seg` (DDP header first).
    fn about(cause: TerminateCause, seg: &[u8], about: u32) -> TermSpec {
        TermSpec {
            cause,
            echo: EchoedHeader::from_segment(seg).ok(),
            seg_len: Some(seg.len().min(usize::from(u16::MAX)) as u16),
            rdmap: None,
            about,
        }
    }
}

/// The completion status a Terminate's cause gives the request it names
/// (as on RC).
fn status_of(cause: TerminateCause) -> WcStatus {
    match cause.layer() {
        rdmap::Layer::Rdmap if cause.etype() == 1 => WcStatus::RemAccessErr,
        rdmap::Layer::Ddp if cause.etype() == 1 => WcStatus::RemAccessErr,
        rdmap::Layer::Ddp if cause == TerminateCause::DdpUntaggedNoBuffer => {
            WcStatus::RnrRetryExcErr
        }
        rdmap::Layer::Ddp if cause.etype() == 2 => WcStatus::RemInvReqErr,
        _ => WcStatus::RemOpErr,
    }
}

/// MSN (untagged) or T-MSN (tagged, 0 without X) of a segment.
fn msn_of(repr: &SegmentRepr) -> u32 {
    match repr.ddp {
        DdpHeader::Untagged { msn, .. } => msn,
        DdpHeader::Tagged { ext, .. } => ext.map_or(0, |e| e.msn),
    }
}

/// The D echo of a segment we build ourselves.
fn echo_of(repr: &SegmentRepr) -> Option<EchoedHeader> {
    let mut b = [0u8; HDR_CAP];
    let n = datagram::emit_header(repr, &mut b);
    EchoedHeader::from_segment(&b[..n]).ok()
}

fn atomic_request(op: WireAtomicOp, msn: u32, stag: u32, to: u64) -> SegmentRepr {
    SegmentRepr::untagged(
        Opcode::AtomicRequest,
        1,
        msn,
        0,
        true,
        RdmapBody::AtomicRequest(AtomicRequest {
            op,
            req_id: msn,
            stag,
            to,
            add_swap: 0,
            add_swap_mask: 0,
            compare: 0,
            compare_mask: 0,
        }),
    )
}

/// Whether octets `[off, off + len)` of a payload can be read.
fn gather_ok<M: Memory>(mem: &M, payload: &Payload, off: u64, len: u64) -> bool {
    let Payload::Sgl(sgl) = payload else {
        return true;
    };
    let mut ok = true;
    let inside = sgl.for_range(off, len, |sge, o, n| {
        ok &= mem
            .local_read(sge.lkey, sge.addr.wrapping_add(o), n)
            .is_ok();
    });
    ok && inside
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
mod tests {
    use super::*;
    use crate::memory::MemError;
    use crate::memory::{Access, VecMemory};
    use crate::rc::SIGNALED;
    use crate::rd::RdEndpoint;
    use crate::wr::SgList;
    use crate::wr::{InlineData, SendFlags};
    use softrdma_wire::rd::{Feedback, RdShimRepr};
    use std::time::Duration;

    const BASE: u64 = 0x10_0000;
    const MEM: usize = 1 << 20;
    /// IPv4 RD Send segment: 1500 − 28 − 26 − 22 − 4.
    const ROOM_SEND: usize = 1420;
    /// IPv4 RD tagged segment with X and Q: 1500 − 28 − 26 − 26 − 4.
    const ROOM_TAGGED: usize = 1416;

    #[derive(Default)]
    struct VecSink {
        out: Vec<Vec<u8>>,
        budget: Option<usize>,
        fail_next: Option<io::ErrorKind>,
    }

    impl DatagramSink for VecSink {
        fn send(&mut self, _dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
            if let Some(k) = self.fail_next.take() {
                return Err(k.into());
            }
            if let Some(b) = &mut self.budget {
                if *b == 0 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                *b -= 1;
            }
            self.out
                .push(bufs.iter().flat_map(|b| b.iter().copied()).collect());
            Ok(())
        }
    }

    struct Node {
        qp: RdQp,
        mem: VecMemory,
        addr: DgramAddr,
        buf: u32,
    }

    fn node(i: u8, now: Instant, f: impl FnOnce(&mut RdQpConfig)) -> Node {
        let port = 4791;
        let qpn = (u32::from(port) << 8) | u32::from(i);
        let mut cfg = RdQpConfig {
            qpn,
            rd: RdConfig {
                epoch_seed: 1000 * u32::from(i),
                ..RdConfig::default()
            },
            ..RdQpConfig::default()
        };
        f(&mut cfg);
        let mut mem = VecMemory::new();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let buf = mem.register(0, BASE, MEM, all | Access::REMOTE_ATOMIC);
        Node {
            qp: RdQp::new(cfg, now).expect("valid config"),
            mem,
            addr: DgramAddr {
                ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)),
                port,
                qpn,
            },
            buf,
        }
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

        fn at(&self, off: usize, len: usize) -> &[u8] {
            &self.mem.bytes(self.buf)[off..off + len]
        }

        fn sgl(&self, off: usize, len: usize) -> Payload {
            Payload::Sgl(SgList::single(BASE + off as u64, len as u32, self.buf))
        }

        fn post(&mut self, id: u64, op: SendOp, off: usize, len: usize, to: DgramAddr) {
            let wr = SendWr {
                wr_id: id,
                op,
                payload: self.sgl(off, len),
                flags: SIGNALED,
            };
            self.qp.post_send(wr, to).expect("posted");
        }

        fn send(&mut self, id: u64, off: usize, len: usize, to: DgramAddr) {
            let op = SendOp::Send {
                imm: None,
                invalidate: None,
            };
            self.post(id, op, off, len, to);
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
            s.out
        }

        fn wcs(&mut self) -> Vec<(CqKind, WorkCompletion)> {
            std::iter::from_fn(|| self.qp.poll_completion()).collect()
        }

        fn events(&mut self) -> Vec<DgramEvent> {
            std::iter::from_fn(|| self.qp.poll_event()).collect()
        }
    }

    fn write(remote: u64, rkey: u32) -> SendOp {
        SendOp::Write {
            remote_addr: BASE + remote,
            rkey,
            imm: None,
        }
    }

    fn read(remote: u64, rkey: u32) -> SendOp {
        SendOp::Read {
            remote_addr: BASE + remote,
            rkey,
        }
    }

    fn fetch_add(remote: u64, rkey: u32, add: u64) -> SendOp {
        SendOp::FetchAdd {
            remote_addr: BASE + remote,
            rkey,
            add,
        }
    }

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Dir {
        AtoB,
        BtoA,
    }

    /// Two QPs on a perfect, zero-latency link with a virtual clock.
    struct Pair {
        a: Node,
        b: Node,
        now: Instant,
    }

    impl Pair {
        fn new(fa: impl FnOnce(&mut RdQpConfig), fb: impl FnOnce(&mut RdQpConfig)) -> Pair {
            let now = Instant::now();
            Pair {
                a: node(1, now, fa),
                b: node(2, now, fb),
                now,
            }
        }

        fn deliver(&mut self, dir: Dir, d: &[u8]) {
            let now = self.now;
            let (from, to) = match dir {
                Dir::AtoB => (self.a.addr, &mut self.b),
                Dir::BtoA => (self.b.addr, &mut self.a),
            };
            to.qp
                .handle_datagram(from.ip, from.port, d, &mut to.mem, now);
        }

        /// Exchanges datagrams until both are quiet; `keep` may drop some.
        fn flow(&mut self, keep: &mut impl FnMut(Dir, &[u8]) -> bool) -> usize {
            let mut n = 0;
            loop {
                let (da, db) = (self.a.tx(), self.b.tx());
                if da.is_empty() && db.is_empty() {
                    return n;
                }
                n += da.len() + db.len();
                for d in da {
                    if keep(Dir::AtoB, &d) {
                        self.deliver(Dir::AtoB, &d);
                    }
                }
                for d in db {
                    if keep(Dir::BtoA, &d) {
                        self.deliver(Dir::BtoA, &d);
                    }
                }
            }
        }

        /// Runs timers and traffic for `dur` of virtual time.
        fn run_with(&mut self, dur: Duration, mut keep: impl FnMut(Dir, &[u8]) -> bool) {
            let end = self.now + dur;
            loop {
                self.flow(&mut keep);
                let next = [self.a.qp.poll_timeout(), self.b.qp.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
                match next {
                    Some(t) if t <= end => {
                        self.now = self.now.max(t);
                        let now = self.now;
                        self.a.qp.handle_timeout(now);
                        self.b.qp.handle_timeout(now);
                    }
                    _ => {
                        self.now = end;
                        return;
                    }
                }
            }
        }

        fn run(&mut self, dur: Duration) {
            self.run_with(dur, |_, _| true);
        }
    }

    fn shim_of(d: &[u8]) -> RdShimRepr {
        wrd::split(d).expect("valid").0.expect("RD datagram")
    }

    fn seg_of(d: &[u8]) -> (SegmentRepr, Vec<u8>) {
        let (_, seg) = wrd::split(d).expect("valid");
        let (r, h) = SegmentRepr::parse(seg, datagram::MODE).expect("segment");
        (r, seg[h..].to_vec())
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn config_is_checked() {
        let t = Instant::now();
        let bad = |f: fn(&mut RdQpConfig)| {
            let mut c = RdQpConfig::default();
            f(&mut c);
            RdQp::new(c, t).unwrap_err()
        };
        assert_eq!(bad(|c| c.qpn = 1 << 24), RdQpConfigError::Qpn);
        assert_eq!(bad(|c| c.mtu = 100), RdQpConfigError::Mtu);
        assert_eq!(bad(|c| c.max_msg = 1 << 32), RdQpConfigError::MaxMsg);
        assert_eq!(bad(|c| c.ord = 0), RdQpConfigError::Depth);
        assert_eq!(bad(|c| c.max_inbound = 0), RdQpConfigError::Depth);
        assert!(matches!(
            bad(|c| c.rd.idle_timeout = Duration::from_millis(1)),
            RdQpConfigError::Rd(_)
        ));
        let q = RdQp::new(
            RdQpConfig {
                qpn: 77,
                ..Default::default()
            },
            t,
        )
        .unwrap();
        assert_eq!(q.config().rd.local_qpn, 77, "the RD layer gets the QPN");
    }

    #[test]
    fn send_completes_on_ack_with_the_ud_segment_layout() {
        let mut p = Pair::new(|_| {}, |_| {});
        let data = p.a.fill(0, 100, 7);
        p.b.recv(9, 0x8000, 4096);
        p.a.send(1, 0, 100, p.b.addr);
        let d = p.a.tx();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0][0], wrd::MAGIC);
        let shim = shim_of(&d[0]);
        assert_eq!((shim.src_qpn, shim.dst_qpn), (p.a.addr.qpn, p.b.addr.qpn));
        let ds = shim.data.unwrap();
        assert!(ds.syn && ds.psn == 0);
        let (r, payload) = seg_of(&d[0]);
        assert_eq!(r.opcode, Opcode::Send);
        assert!(r.last);
        // §10: Q with the slot in the top octet, our QPN in RsvdULP, MSN 1.
        assert_eq!(r.dqpn, Some((1 << 24) | p.b.addr.qpn));
        assert_eq!(
            r.ddp,
            DdpHeader::Untagged {
                rsvd_ulp: p.a.addr.qpn,
                qn: 0,
                msn: 1,
                mo: 0
            }
        );
        assert_eq!(payload, data);
        assert_eq!(d[0].len(), SHIM_LEN + 22 + 100 + 4);
        // Not complete before the peer acknowledged it.
        assert!(p.a.wcs().is_empty());
        p.deliver(Dir::AtoB, &d[0]);
        let got = p.b.wcs();
        assert_eq!(got.len(), 1);
        let wc = got[0].1;
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (9, WcStatus::Success, 100)
        );
        assert_eq!(wc.src, Some(p.a.addr));
        assert_eq!(p.b.at(0x8000, 100), &data[..]);
        assert!(p.a.wcs().is_empty());
        p.run(ms(5));
        let got = p.a.wcs();
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].0, got[0].1.status, got[0].1.opcode),
            (CqKind::Send, WcStatus::Success, WcOpcode::Send)
        );
        assert_eq!(p.b.qp.stats().rx_delivered, 1);
    }

    #[test]
    fn segmented_send_with_immediate_and_solicited() {
        let mut p = Pair::new(|_| {}, |_| {});
        let len = 3 * ROOM_SEND + 5;
        let data = p.a.fill(0, len, 3);
        p.b.recv(1, 0x10000, 8192);
        let wr = SendWr {
            wr_id: 5,
            op: SendOp::Send {
                imm: Some(0xdead_beef),
                invalidate: None,
            },
            payload: p.a.sgl(0, len),
            flags: SendFlags {
                signaled: true,
                solicited: true,
                fence: false,
            },
        };
        p.a.qp.post_send(wr, p.b.addr).unwrap();
        let d = p.a.tx();
        assert_eq!(d.len(), 5, "four Send segments and Immediate Data");
        let segs: Vec<_> = d.iter().map(|x| seg_of(x)).collect();
        assert!(segs[..4]
            .iter()
            .all(|(r, _)| r.opcode == Opcode::SendSe && !r.last));
        assert_eq!(segs[0].1.len(), ROOM_SEND);
        let (imm, _) = &segs[4];
        assert_eq!(imm.opcode, Opcode::ImmediateDataSe);
        assert!(imm.last);
        assert!(matches!(imm.ddp, DdpHeader::Untagged { mo, .. } if mo as usize == len));
        for x in &d {
            p.deliver(Dir::AtoB, x);
        }
        let wc = p.b.wcs()[0].1;
        assert_eq!(wc.byte_len as usize, len);
        assert_eq!(wc.imm, Some(0xdead_beef));
        assert!(wc.solicited);
        assert_eq!(p.b.at(0x10000, len), &data[..]);
        // A zero-length Send with immediate is the Immediate Data segment.
        p.b.recv(2, 0x10000, 0);
        let wr = SendWr {
            wr_id: 6,
            op: SendOp::Send {
                imm: Some(7),
                invalidate: None,
            },
            payload: Payload::Inline(InlineData::new(&[]).unwrap()),
            flags: SIGNALED,
        };
        p.a.qp.post_send(wr, p.b.addr).unwrap();
        p.run(ms(5));
        let wc = p.b.wcs()[0].1;
        assert_eq!((wc.wr_id, wc.byte_len, wc.imm), (2, 0, Some(7)));
        assert_eq!(p.a.wcs().len(), 2);
    }

    #[test]
    fn receive_too_small_is_loc_len_err_here_and_rem_inv_req_there() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.a.fill(0, 4000, 1);
        p.b.recv(1, 0x8000, 2000);
        p.b.recv(2, 0x9000, 8000);
        p.a.send(10, 0, 4000, p.b.addr);
        p.a.send(11, 0, 3000, p.b.addr);
        p.run(ms(20));
        let rx = p.b.wcs();
        assert_eq!(rx.len(), 2);
        assert_eq!((rx[0].1.wr_id, rx[0].1.status), (1, WcStatus::LocLenErr));
        assert_eq!((rx[1].1.wr_id, rx[1].1.status), (2, WcStatus::Success));
        assert_eq!(rx[1].1.byte_len, 3000);
        let tx = p.a.wcs();
        assert_eq!(tx.len(), 2);
        assert_eq!(
            (tx[0].1.wr_id, tx[0].1.status),
            (10, WcStatus::RemInvReqErr)
        );
        assert_eq!((tx[1].1.wr_id, tx[1].1.status), (11, WcStatus::Success));
        assert!(p.b.qp.stats().rx_skipped >= 1, "the rest of the message");
    }

    #[test]
    fn no_receive_drops_the_message_and_fails_the_sender_with_rnr() {
        let mut p = Pair::new(|_| {}, |_| {});
        let data = p.a.fill(0, 2000, 5);
        p.a.send(1, 0, 2000, p.b.addr);
        p.run(ms(20));
        assert!(p.b.wcs().is_empty());
        assert_eq!(p.b.qp.stats().rx_no_recv, 1);
        let tx = p.a.wcs();
        assert_eq!(tx.len(), 1);
        assert_eq!(tx[0].1.status, WcStatus::RnrRetryExcErr);
        // The QP goes on: the next Send is received.
        p.b.recv(7, 0x8000, 4096);
        p.a.send(2, 0, 2000, p.b.addr);
        p.run(ms(20));
        assert_eq!(p.b.wcs()[0].1.status, WcStatus::Success);
        assert_eq!(p.b.at(0x8000, 2000), &data[..]);
        assert_eq!(p.a.wcs()[0].1.status, WcStatus::Success);
        assert!(p.a.events().is_empty());
    }

    #[test]
    fn batches_are_staged_whole_and_arrive_intact() {
        // A window's worth of datagrams (a 40 000-octet Write, then a
        // Send whose three-piece gather list puts datagram boundaries
        // inside and across pieces) leaves in batches of five or more:
        // each datagram framed into the staging buffer and offered as one
        // buffer. The target places every octet, and a lone datagram
        // (fewer than five) is still gathered.
        let mut p = Pair::new(|_| {}, |_| {});
        let wdata = p.a.fill(0, 40_000, 3);
        let sdata = p.a.fill(0x2_0000, 30_000, 5);
        p.b.recv(7, 0x8_0000, 64 << 10);
        p.a.post(1, write(0x4_0000, p.b.buf), 0, 40_000, p.b.addr);
        let three = [
            (0x2_0000u64, 1000u32),
            (0x2_0000 + 1000, 5),
            (0x2_0000 + 1005, 28_995),
        ];
        let sges: Vec<crate::wr::Sge> = three
            .iter()
            .map(|&(off, length)| crate::wr::Sge {
                addr: BASE + off,
                length,
                lkey: p.a.buf,
            })
            .collect();
        let wr = SendWr {
            wr_id: 2,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::from_slice(&sges).expect("three entries")),
            flags: SIGNALED,
        };
        p.a.qp.post_send(wr, p.b.addr).expect("posted");
        // Records, per batch offered, how many buffers each datagram came
        // in.
        #[derive(Default)]
        struct Pieces {
            inner: VecSink,
            batches: Vec<Vec<usize>>,
        }
        impl DatagramSink for Pieces {
            fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
                self.inner.send(dest, bufs)
            }
            fn send_batch(&mut self, batch: &[crate::ud::Datagram<'_>]) -> io::Result<usize> {
                self.batches
                    .push(batch.iter().map(|d| d.bufs.len()).collect());
                for d in batch {
                    self.inner.send(d.dest, d.bufs)?;
                }
                Ok(batch.len())
            }
        }
        let mut sent = 0;
        let mut staged = 0;
        for _ in 0..1000 {
            let mut s = Pieces::default();
            p.a.qp.poll_transmit(&p.a.mem, &mut s).expect("sent");
            for b in &s.batches {
                if b.len() >= STAGE_MIN_BATCH {
                    staged += b.len();
                    assert!(
                        b.iter().all(|&k| k == 1),
                        "a batch of {} staged whole",
                        b.len()
                    );
                } else {
                    assert!(b.iter().all(|&k| k >= 2), "a batch of {} gathered", b.len());
                }
            }
            sent += s.inner.out.len();
            for d in &s.inner.out {
                p.deliver(Dir::AtoB, d);
            }
            // B's ACKs open A's window.
            for d in p.b.tx() {
                p.deliver(Dir::BtoA, &d);
            }
            if !p.a.qp.wants_transmit() && p.a.wcs().len() == 2 {
                break;
            }
        }
        assert!(
            staged >= STAGE_MIN_BATCH,
            "some batches were staged ({staged} of {sent})"
        );
        assert_eq!(p.b.at(0x4_0000, 40_000), &wdata[..], "the Write placed");
        assert_eq!(p.b.at(0x8_0000, 30_000), &sdata[..], "the Send scattered");
        let wcs = p.b.wcs();
        assert_eq!(wcs.len(), 1);
        assert_eq!(
            (wcs[0].1.status, wcs[0].1.byte_len),
            (WcStatus::Success, 30_000)
        );
        assert_eq!(p.b.qp.stats().rx_bad_crc, 0);
    }

    #[test]
    fn write_placed_in_segments_completes_on_ack() {
        let mut p = Pair::new(|_| {}, |_| {});
        let len = 2 * ROOM_TAGGED + 1;
        let data = p.a.fill(0, len, 9);
        p.a.post(1, write(0x4_0000, p.b.buf), 0, len, p.b.addr);
        let d = p.a.tx();
        assert_eq!(d.len(), 3);
        let (r, pl) = seg_of(&d[1]);
        assert_eq!(pl.len(), ROOM_TAGGED);
        assert_eq!(
            r.ddp,
            DdpHeader::Tagged {
                stag: p.b.buf,
                to: BASE + 0x4_0000 + ROOM_TAGGED as u64,
                ext: Some(TaggedExt {
                    msn: 1,
                    mo: ROOM_TAGGED as u32
                })
            }
        );
        for x in &d {
            p.deliver(Dir::AtoB, x);
        }
        assert_eq!(p.b.at(0x4_0000, len), &data[..]);
        assert!(p.b.wcs().is_empty(), "no completion at the target");
        p.run(ms(5));
        let wc = p.a.wcs()[0].1;
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len as usize),
            (WcStatus::Success, WcOpcode::RdmaWrite, len)
        );
    }

    #[test]
    fn write_access_violation_fails_that_request_only_and_its_ack_waits() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.a.fill(0, 100, 1);
        // W1 to a bad STag, W2 fine, both in one burst.
        p.a.post(1, write(0, p.b.buf ^ 0x40), 0, 100, p.b.addr);
        p.a.post(2, write(0x100, p.b.buf), 0, 100, p.b.addr);
        let d = p.a.tx();
        assert_eq!(d.len(), 2);
        p.deliver(Dir::AtoB, &d[0]);
        p.deliver(Dir::AtoB, &d[1]);
        let ev = p.b.events();
        assert_eq!(ev.len(), 1);
        assert!(matches!(
            ev[0],
            DgramEvent::RemoteAccess {
                opcode: Opcode::RdmaWrite,
                msn: 1,
                error: MemError::InvalidStag,
                ..
            }
        ));
        assert_eq!(p.b.at(0x100, 100), p.a.at(0, 100), "W2 placed");
        // Lose B's report once. Whatever B sends, an ACK covering W1
        // (PSN 0) only ever rides on a data datagram at or after the report.
        let mut report_psn = None;
        let mut dropped = false;
        let mut full_acks = 0;
        p.run_with(ms(50), |dir, d| {
            if dir != Dir::BtoA {
                return true;
            }
            let s = shim_of(d);
            if let Some(ds) = s.data {
                report_psn.get_or_insert(ds.psn);
            }
            if let Feedback::Ack { psn, .. } = s.feedback {
                if psn > 0 {
                    full_acks += 1;
                    let at = s.data.map(|ds| ds.psn);
                    assert!(at.is_some() && at >= report_psn, "{s:?}");
                }
            }
            if s.data.is_some() && !dropped {
                dropped = true;
                return false;
            }
            true
        });
        assert!(dropped && full_acks >= 2);
        let tx = p.a.wcs();
        let st: Vec<_> = tx.iter().map(|c| (c.1.wr_id, c.1.status)).collect();
        assert_eq!(st, [(1, WcStatus::RemAccessErr), (2, WcStatus::Success)]);
        assert!(p.a.events().is_empty(), "no peer failure");
        assert_eq!(p.a.qp.sq_in_use(), 0);
        assert_eq!(p.b.qp.inbound_in_use(), 0);
    }

    #[test]
    fn mutual_access_violations_release_each_other() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.a.post(1, write(0, 0xbad01), 0, 10, p.b.addr);
        p.b.post(2, write(0, 0xbad01), 0, 10, p.a.addr);
        p.run(ms(20));
        assert_eq!(p.a.wcs()[0].1.status, WcStatus::RemAccessErr);
        assert_eq!(p.b.wcs()[0].1.status, WcStatus::RemAccessErr);
        // Both directions still work at once.
        p.a.fill(0, 10, 4);
        p.a.post(3, write(0x100, p.b.buf), 0, 10, p.b.addr);
        p.b.post(4, write(0x100, p.a.buf), 0, 10, p.a.addr);
        p.run(ms(20));
        assert_eq!(p.a.wcs()[0].1.status, WcStatus::Success);
        assert_eq!(p.b.wcs()[0].1.status, WcStatus::Success);
        assert_eq!(
            p.a.qp.rd_stats().peers_failed + p.b.qp.rd_stats().peers_failed,
            0
        );
        assert_eq!(p.a.qp.rd_stats().timeouts + p.b.qp.rd_stats().timeouts, 0);
    }

    #[test]
    fn an_ack_overtaking_a_terminate_waits_for_it() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.a.fill(0, 100, 1);
        p.a.recv(5, 0x8000, 64);
        p.a.post(1, write(0, p.b.buf ^ 0x40), 0, 100, p.b.addr);
        p.a.post(2, write(0x100, p.b.buf), 0, 100, p.b.addr);
        for d in p.a.tx() {
            p.deliver(Dir::AtoB, &d);
        }
        // B has a Send for A as well: the Terminate goes first, the Send
        // after it carries the ACK of both Writes.
        p.b.send(7, 0, 10, p.a.addr);
        let out = p.b.tx();
        assert_eq!(out.len(), 2);
        assert_eq!(seg_of(&out[0]).0.opcode, Opcode::Terminate);
        assert!(matches!(
            shim_of(&out[1]).feedback,
            Feedback::Ack { psn: 2, .. }
        ));
        // The Terminate is lost; the Send arrives out of order with the ACK.
        p.deliver(Dir::BtoA, &out[1]);
        assert_eq!(p.a.qp.rd().unacked(&p.b.addr), 0, "RD took the ACK");
        assert!(p.a.wcs().is_empty(), "but nothing succeeds yet");
        assert_eq!(p.a.qp.stats().tx_gated, 2);
        p.run(ms(100));
        let wcs = p.a.wcs();
        let of = |q| -> Vec<_> {
            wcs.iter()
                .filter(|c| c.0 == q)
                .map(|c| (c.1.wr_id, c.1.status))
                .collect()
        };
        assert_eq!(
            of(CqKind::Send),
            [(1, WcStatus::RemAccessErr), (2, WcStatus::Success)]
        );
        assert_eq!(of(CqKind::Recv), [(5, WcStatus::Success)]);
    }

    #[test]
    fn dqpn_of_reads_both_framings() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.a.send(1, 0, 10, p.b.addr);
        let d = p.a.tx();
        assert_eq!(dqpn_of(&d[0]), Some(p.b.addr.qpn));
        assert_eq!(dqpn_of(&d[0][..20]), None);
        let mut ud = [0u8; 64];
        let mut seg = SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None);
        seg.dqpn = Some((7 << 24) | 0x1234);
        let n = datagram::emit_into(&seg, b"x", &mut ud);
        assert_eq!(dqpn_of(&ud[..n]), Some(0x1234));
        assert_eq!(dqpn_of(&[0x53; 40]), None, "reserved framing");
        assert_eq!(dqpn_of(&[]), None);
    }

    #[test]
    fn a_fenced_request_waits_for_earlier_reads() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.b.recv(1, 0x9000, 64);
        p.a.post(1, read(0, p.b.buf), 0, 32, p.b.addr);
        let wr = SendWr {
            wr_id: 2,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: p.a.sgl(0x100, 8),
            flags: SendFlags {
                signaled: true,
                solicited: false,
                fence: true,
            },
        };
        p.a.qp.post_send(wr, p.b.addr).unwrap();
        let d = p.a.tx();
        assert_eq!(d.len(), 1, "only the Read Request");
        assert_eq!(seg_of(&d[0]).0.opcode, Opcode::ReadRequest);
        p.deliver(Dir::AtoB, &d[0]);
        for x in p.b.tx() {
            p.deliver(Dir::BtoA, &x);
        }
        let d = p.a.tx();
        assert_eq!(
            seg_of(&d[0]).0.opcode,
            Opcode::Send,
            "after the Read completed"
        );
        p.run(ms(10));
        let st: Vec<_> = p.a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
        assert_eq!(st, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    }

    #[test]
    fn a_new_session_of_the_sender_returns_the_claimed_receive() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.a.fill(0, 3 * ROOM_SEND, 1);
        p.b.recv(1, 0, 8192);
        p.a.send(1, 0, 3 * ROOM_SEND, p.b.addr);
        let d = p.a.tx();
        p.deliver(Dir::AtoB, &d[0]);
        assert_eq!(p.b.qp.recv_posted(), 0, "claimed by the message");
        // A restarts (newer epochs) and sends another message.
        let now = p.now;
        p.a = node(1, now, |c| c.rd.epoch_seed = 1_000_000);
        let data = p.a.fill(0, 10, 9);
        p.a.send(2, 0, 10, p.b.addr);
        p.run(ms(10));
        let rx = p.b.wcs();
        assert_eq!(rx.len(), 1);
        assert_eq!((rx[0].1.wr_id, rx[0].1.byte_len), (1, 10));
        assert_eq!(p.b.at(0, 10), &data[..]);
        assert_eq!(p.a.wcs()[0].1.status, WcStatus::Success);
    }

    /// `d` with its shim PSN replaced (and the CRC made right again).
    fn with_psn(d: &[u8], psn: u32) -> Vec<u8> {
        let mut d = d.to_vec();
        d[12..16].copy_from_slice(&psn.to_be_bytes());
        let n = d.len();
        let t = datagram::trailer(&d[..n - CRC_LEN], &[]);
        d[n - CRC_LEN..].copy_from_slice(&t);
        d
    }

    /// The Terminates among B's data datagrams.
    fn terminates(out: &[Vec<u8>]) -> Vec<(TerminateCause, u32)> {
        out.iter()
            .filter(|d| shim_of(d).data.is_some())
            .filter_map(|d| match seg_of(d).0 {
                SegmentRepr {
                    ddp: DdpHeader::Untagged { rsvd_ulp, .. },
                    body: RdmapBody::Terminate(t),
                    ..
                } => Some((t.cause, rsvd_ulp)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_send_segment_from_the_middle_of_a_message_is_never_taken_for_one() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.a.fill(0, 3 * ROOM_SEND, 1);
        p.b.recv(1, 0, 8192);
        p.a.send(1, 0, 3 * ROOM_SEND, p.b.addr);
        let d = p.a.tx();
        assert_eq!(d.len(), 3);
        // B never saw the first segment (say B restarted after it): the
        // second and third come as the first datagrams of a session.
        p.deliver(Dir::AtoB, &with_psn(&d[1], 0));
        p.deliver(Dir::AtoB, &with_psn(&d[2], 1));
        let s = p.b.qp.stats();
        assert_eq!((s.rx_orphan_segments, s.rx_skipped), (1, 1));
        assert_eq!(p.b.qp.recv_posted(), 1, "no receive taken");
        assert!(p.b.wcs().is_empty());
        assert!(p.b.at(0, 8192).iter().all(|&x| x == 0), "nothing placed");
        // One Terminate, about MSN 1: invalid MO.
        let out = p.b.tx();
        assert_eq!(
            terminates(&out),
            [(TerminateCause::DdpUntaggedInvalidMo, 1)]
        );
        // A whole message after it is received normally.
        let data = p.a.fill(5000, 100, 2);
        p.a.send(2, 5000, 100, p.b.addr);
        let d = p.a.tx();
        let last = d.last().expect("datagram");
        p.deliver(Dir::AtoB, &with_psn(last, 2));
        let rx = p.b.wcs();
        assert_eq!(rx.len(), 1);
        assert_eq!(
            (rx[0].1.wr_id, rx[0].1.status, rx[0].1.byte_len),
            (1, WcStatus::Success, 100)
        );
        assert_eq!(p.b.at(0, 100), &data[..]);
    }

    #[test]
    fn a_write_segment_from_the_middle_of_a_message_is_never_placed() {
        for record in [false, true] {
            let mut p = Pair::new(|_| {}, |_| {});
            p.a.fill(0, 3 * ROOM_TAGGED, 1);
            let op = if record {
                SendOp::WriteRecord {
                    remote_addr: BASE + 100_000,
                    rkey: p.b.buf,
                }
            } else {
                write(100_000, p.b.buf)
            };
            p.a.post(1, op, 0, 3 * ROOM_TAGGED, p.b.addr);
            let d = p.a.tx();
            assert_eq!(d.len(), 3);
            p.deliver(Dir::AtoB, &with_psn(&d[1], 0));
            p.deliver(Dir::AtoB, &with_psn(&d[2], 1));
            let s = p.b.qp.stats();
            assert_eq!((s.rx_orphan_segments, s.rx_skipped), (1, 1));
            assert_eq!(s.rx_write_segments + s.rx_record_segments, 0);
            assert!(p.b.at(100_000, 3 * ROOM_TAGGED).iter().all(|&x| x == 0));
            assert_eq!(p.b.qp.record_stats(), RecordStats::default());
            let out = p.b.tx();
            assert_eq!(
                terminates(&out),
                [(TerminateCause::RdmapCatastrophicStream, 1)]
            );
            // A whole Write after it is placed.
            let data = p.a.fill(5000, 100, 2);
            p.a.post(2, write(200_000, p.b.buf), 5000, 100, p.b.addr);
            let d = p.a.tx();
            p.deliver(Dir::AtoB, &with_psn(d.last().expect("datagram"), 2));
            assert_eq!(p.b.at(200_000, 100), &data[..]);
            // A segment out of place inside a message in progress is an
            // orphan too.
            p.a.post(3, write(300_000, p.b.buf), 0, 3 * ROOM_TAGGED, p.b.addr);
            let d = p.a.tx();
            p.deliver(Dir::AtoB, &with_psn(&d[0], 3));
            p.deliver(Dir::AtoB, &with_psn(&d[2], 4));
            assert_eq!(p.b.qp.stats().rx_orphan_segments, 2);
            assert!(p
                .b
                .at(300_000 + ROOM_TAGGED, 2 * ROOM_TAGGED)
                .iter()
                .all(|&x| x == 0));
        }
    }

    #[test]
    fn write_record_is_logged_at_the_target() {
        let mut p = Pair::new(|_| {}, |_| {});
        let len = ROOM_TAGGED + 10;
        let data = p.a.fill(0, len, 2);
        let op = SendOp::WriteRecord {
            remote_addr: BASE + 0x2000,
            rkey: p.b.buf,
        };
        p.a.post(1, op, 0, len, p.b.addr);
        p.run(ms(5));
        assert_eq!(p.b.at(0x2000, len), &data[..]);
        let rec = p.b.wcs();
        assert_eq!(rec.len(), 1);
        let wc = rec[0].1;
        assert_eq!(
            (wc.opcode, wc.status),
            (WcOpcode::RecvWriteRecord, WcStatus::Success)
        );
        let info = wc.record.unwrap();
        assert_eq!(
            (info.stag, info.to, info.len as usize, info.msn),
            (p.b.buf, BASE + 0x2000, len, 1)
        );
        assert_eq!(wc.src, Some(p.a.addr));
        assert!(p
            .b
            .qp
            .record_tracker()
            .is_valid(p.b.buf, BASE + 0x2000, len as u64));
        assert_eq!(p.a.wcs()[0].1.opcode, WcOpcode::WriteRecord);
    }

    #[test]
    fn read_response_echoes_the_request_msn() {
        let mut p = Pair::new(|_| {}, |_| {});
        let len = 3 * ROOM_TAGGED;
        let data = p.b.fill(0x1000, len, 8);
        p.a.post(1, read(0x1000, p.b.buf), 0x5000, len, p.b.addr);
        p.a.post(2, read(0x1000, p.b.buf), 0x20000, 10, p.b.addr);
        let req = p.a.tx();
        assert_eq!(req.len(), 2);
        let (r, _) = seg_of(&req[1]);
        let RdmapBody::ReadRequest(rr) = r.body else {
            panic!("read request")
        };
        assert_eq!(
            (rr.sink_stag, rr.sink_to, rr.size),
            (p.a.buf, BASE + 0x20000, 10)
        );
        assert!(matches!(r.ddp, DdpHeader::Untagged { qn: 1, msn: 2, .. }));
        for x in &req {
            p.deliver(Dir::AtoB, x);
        }
        let resp = p.b.tx();
        assert_eq!(resp.len(), 4);
        let tmsns: Vec<u32> = resp
            .iter()
            .map(|x| match seg_of(x).0.ddp {
                DdpHeader::Tagged { ext: Some(e), .. } => e.msn,
                _ => panic!("tagged"),
            })
            .collect();
        assert_eq!(tmsns, [1, 1, 1, 2]);
        // Deliver the responses; the Reads complete on placement.
        for x in &resp {
            p.deliver(Dir::BtoA, x);
        }
        let wcs = p.a.wcs();
        assert_eq!(wcs.len(), 2);
        assert_eq!(
            (wcs[0].1.wr_id, wcs[0].1.status, wcs[0].1.byte_len as usize),
            (1, WcStatus::Success, len)
        );
        assert_eq!(wcs[1].1.opcode, WcOpcode::RdmaRead);
        assert_eq!(p.a.at(0x5000, len), &data[..]);
        assert_eq!(p.a.at(0x20000, 10), &data[..10]);
        p.run(ms(20));
        assert_eq!(p.b.qp.inbound_in_use(), 0, "responses acknowledged");
        assert_eq!(p.a.qp.sq_in_use(), 0);
    }

    #[test]
    fn read_without_the_right_fails_with_rem_access_err() {
        let mut p = Pair::new(|_| {}, |_| {});
        let wo = p.b.mem.register(0, 0x900_0000, 4096, Access::REMOTE_WRITE);
        p.a.post(1, read(0, wo), 0, 100, p.b.addr);
        // Out of bounds too.
        p.a.post(2, read(MEM as u64 - 10, p.b.buf), 0, 100, p.b.addr);
        p.b.fill(0, 100, 1);
        p.a.post(3, read(0, p.b.buf), 0x100, 100, p.b.addr);
        p.run(ms(20));
        let st: Vec<_> = p.a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
        assert_eq!(
            st,
            [
                (1, WcStatus::RemAccessErr),
                (2, WcStatus::RemAccessErr),
                (3, WcStatus::Success)
            ]
        );
        let ev = p.b.events();
        assert_eq!(ev.len(), 2);
        assert!(matches!(
            ev[0],
            DgramEvent::RemoteAccess {
                opcode: Opcode::ReadRequest,
                error: MemError::AccessRights,
                msn: 1,
                ..
            }
        ));
        assert!(matches!(
            ev[1],
            DgramEvent::RemoteAccess {
                error: MemError::BaseBounds,
                msn: 2,
                ..
            }
        ));
    }

    #[test]
    fn ord_bounds_outstanding_reads_per_peer() {
        let mut p = Pair::new(|c| c.ord = 2, |_| {});
        for i in 0..5 {
            p.a.post(i, read(0, p.b.buf), 0x100 * i as usize, 16, p.b.addr);
        }
        let d = p.a.tx();
        assert_eq!(d.len(), 2, "only ORD requests go out");
        for x in &d {
            p.deliver(Dir::AtoB, x);
        }
        for x in p.b.tx() {
            p.deliver(Dir::BtoA, &x);
        }
        assert_eq!(p.a.wcs().len(), 2);
        assert_eq!(p.a.tx().len(), 2, "two more once two completed");
        p.run(ms(20));
        assert_eq!(p.a.wcs().len(), 3);
    }

    #[test]
    fn ird_exceeded_is_rem_op_err() {
        let mut p = Pair::new(|_| {}, |c| c.ird = 1);
        p.a.post(1, read(0, p.b.buf), 0, 16, p.b.addr);
        p.a.post(2, read(0, p.b.buf), 0x100, 16, p.b.addr);
        p.run(ms(20));
        let st: Vec<_> = p.a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
        assert_eq!(st, [(1, WcStatus::Success), (2, WcStatus::RemOpErr)]);
        assert_eq!(p.b.qp.stats().rx_ird_exceeded, 1);
    }

    #[test]
    fn atomics_run_once_and_responses_are_rebuilt() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.b.mem.bytes_mut(p.b.buf)[0x40..0x48].copy_from_slice(&5u64.to_ne_bytes());
        p.a.post(1, fetch_add(0x40, p.b.buf, 10), 0x100, 8, p.b.addr);
        let req = p.a.tx();
        assert_eq!(req.len(), 1);
        // The request arrives twice: executed once.
        p.deliver(Dir::AtoB, &req[0]);
        p.deliver(Dir::AtoB, &req[0]);
        assert_eq!(p.b.qp.stats().rx_atomics, 1);
        assert_eq!(p.b.qp.stats().rx_duplicates, 1);
        // The response is lost; its retransmission carries the kept
        // original value.
        let resp = p.b.tx();
        let (r1, _) = seg_of(&resp[0]);
        assert!(matches!(
            r1.body,
            RdmapBody::AtomicResponse(AtomicResponse {
                req_id: 1,
                orig_value: 5
            })
        ));
        p.now += ms(600);
        let now = p.now;
        p.b.qp.handle_timeout(now);
        let again = p.b.tx();
        let (r2, _) = seg_of(&again[0]);
        assert_eq!(r1, r2, "same segment from the kept value");
        p.deliver(Dir::BtoA, &again[0]);
        let wc = p.a.wcs()[0].1;
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (WcStatus::Success, WcOpcode::FetchAdd, 8)
        );
        assert_eq!(p.a.at(0x100, 8), 5u64.to_ne_bytes());
        assert_eq!(p.b.at(0x40, 8), 15u64.to_ne_bytes());
        // Compare-and-swap, then a mismatch.
        let cas = |compare, swap| SendOp::CompareSwap {
            remote_addr: BASE + 0x40,
            rkey: p.b.buf,
            compare,
            swap,
        };
        let (c1, c2) = (cas(15, 99), cas(15, 7));
        p.a.post(2, c1, 0x108, 8, p.b.addr);
        p.a.post(3, c2, 0x110, 8, p.b.addr);
        p.run(ms(20));
        assert_eq!(p.a.wcs().len(), 2);
        assert_eq!(p.a.at(0x108, 8), 15u64.to_ne_bytes());
        assert_eq!(p.a.at(0x110, 8), 99u64.to_ne_bytes());
        assert_eq!(p.b.at(0x40, 8), 99u64.to_ne_bytes());
        // Misaligned: an error for that request.
        p.a.post(4, fetch_add(0x41, p.b.buf, 1), 0x118, 8, p.b.addr);
        p.run(ms(20));
        assert_eq!(p.a.wcs()[0].1.status, WcStatus::RemOpErr);
        assert!(matches!(
            p.b.events()[..],
            [DgramEvent::RemoteAccess {
                error: MemError::Misaligned,
                ..
            }]
        ));
    }

    #[test]
    fn retransmission_rebuilds_the_same_segment_from_memory() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.a.fill(0, 3000, 6);
        p.a.post(1, write(0, p.b.buf), 0, 3000, p.b.addr);
        let first = p.a.tx();
        p.now += ms(20);
        let now = p.now;
        p.a.qp.handle_timeout(now);
        let again = p.a.tx();
        assert_eq!(first.len(), again.len());
        for (x, y) in first.iter().zip(&again) {
            // Same PSN, same segment octets; the shim's ACK/flags may differ.
            assert_eq!(shim_of(x).data, shim_of(y).data);
            assert_eq!(x[SHIM_LEN..x.len() - 4], y[SHIM_LEN..y.len() - 4]);
        }
        assert_eq!(p.a.qp.rd_stats().retransmitted, first.len() as u64);
        assert_eq!(first.len(), 3);
    }

    #[test]
    fn a_silent_peer_fails_only_its_own_requests() {
        let t = Instant::now();
        let mut a = node(1, t, |_| {});
        let mut b = node(2, t, |_| {});
        let c = node(3, t, |_| {});
        a.fill(0, 100, 1);
        b.recv(1, 0, 4096);
        a.send(10, 0, 100, b.addr);
        a.send(11, 0, 100, c.addr);
        a.post(12, read(0, c.buf), 0x100, 8, c.addr);
        let mut now = t;
        let mut failed_at = None;
        for _ in 0..20_000 {
            for d in a.tx() {
                let s = shim_of(&d);
                if s.dst_qpn == b.addr.qpn {
                    b.qp.handle_datagram(a.addr.ip, a.addr.port, &d, &mut b.mem, now);
                }
            }
            for d in b.tx() {
                a.qp.handle_datagram(b.addr.ip, b.addr.port, &d, &mut a.mem, now);
            }
            let next = [a.qp.poll_timeout(), b.qp.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(n) = next else { break };
            now = n;
            a.qp.handle_timeout(now);
            b.qp.handle_timeout(now);
            if failed_at.is_none()
                && a.events()
                    .contains(&DgramEvent::PeerFailed { peer: c.addr })
            {
                failed_at = Some(now - t);
            }
            if a.qp.peer_count() == 0 {
                break;
            }
        }
        let span = a.qp.config().rd.give_up_span();
        assert!(failed_at.unwrap() <= span + ms(10));
        let mut st: Vec<_> = a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
        st.sort_by_key(|x| x.0);
        assert_eq!(
            st,
            [
                (10, WcStatus::Success),
                (11, WcStatus::RetryExcErr),
                (12, WcStatus::RetryExcErr)
            ]
        );
        assert_eq!(b.qp.stats().rx_delivered, 1);
        // Everything expired in the end: no per-peer state left.
        assert_eq!((a.qp.peer_count(), a.qp.rd().peer_count()), (0, 0));
        assert_eq!((b.qp.peer_count(), b.qp.rd().peer_count()), (0, 0));
        assert_eq!(a.qp.sq_in_use(), 0);
    }

    #[test]
    fn per_peer_state_is_dropped_when_the_peer_expires() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.b.recv(1, 0, 64);
        p.a.send(1, 0, 10, p.b.addr);
        p.a.post(2, read(0, p.b.buf), 0x100, 64, p.b.addr);
        p.run(ms(50));
        assert_eq!(p.a.wcs().len(), 2);
        assert_eq!((p.a.qp.peer_count(), p.b.qp.peer_count()), (1, 1));
        let idle = p.a.qp.config().rd.idle_timeout;
        p.run(idle + ms(10));
        assert_eq!((p.a.qp.peer_count(), p.b.qp.peer_count()), (0, 0));
        assert_eq!((p.a.qp.rd().peer_count(), p.b.qp.rd().peer_count()), (0, 0));
        assert_eq!(p.a.qp.poll_timeout(), None);
        // And a new conversation starts from scratch (MSN 1 again).
        p.b.recv(2, 0, 64);
        p.a.send(3, 0, 10, p.b.addr);
        let d = p.a.tx();
        assert!(matches!(
            seg_of(&d[0]).0.ddp,
            DdpHeader::Untagged { msn: 1, .. }
        ));
    }

    #[test]
    fn a_source_lost_in_flight_aborts_the_send_and_frees_the_receive() {
        let mut p = Pair::new(|_| {}, |_| {});
        let src =
            p.a.mem
                .register(0, 0x800_0000, 4 * ROOM_SEND, Access::LOCAL_WRITE);
        p.b.recv(1, 0, 8192);
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(0x800_0000, 4 * ROOM_SEND as u32, src)),
            flags: SIGNALED,
        };
        p.a.qp.post_send(wr, p.b.addr).unwrap();
        let mut s = VecSink {
            budget: Some(2),
            ..Default::default()
        };
        p.a.qp.poll_transmit(&p.a.mem, &mut s).unwrap();
        for d in &s.out {
            p.deliver(Dir::AtoB, d);
        }
        assert_eq!(p.b.qp.recv_posted(), 0, "claimed by the message");
        p.a.mem.invalidate(src, false).unwrap();
        p.run(ms(50));
        assert_eq!(p.a.wcs()[0].1.status, WcStatus::LocProtErr);
        assert_eq!(p.a.qp.stats().tx_aborted, 1);
        assert!(p.b.wcs().is_empty());
        assert_eq!(p.b.qp.stats().rx_aborted, 1);
        assert_eq!(p.b.qp.recv_posted(), 1, "the receive went back");
        assert_eq!(p.a.qp.sq_in_use(), 0);
    }

    #[test]
    fn a_read_source_lost_in_flight_fails_the_read() {
        let mut p = Pair::new(|_| {}, |_| {});
        let src =
            p.b.mem
                .register(0, 0x800_0000, 4 * ROOM_TAGGED, Access::REMOTE_READ);
        p.a.post(
            1,
            read(0x800_0000 - BASE, src),
            0,
            4 * ROOM_TAGGED,
            p.b.addr,
        );
        for d in p.a.tx() {
            p.deliver(Dir::AtoB, &d);
        }
        p.b.mem.invalidate(src, false).unwrap();
        p.run(ms(50));
        assert_eq!(p.a.wcs()[0].1.status, WcStatus::RemAccessErr);
        assert!(matches!(
            p.b.events()[..],
            [DgramEvent::RemoteAccess {
                error: MemError::InvalidStag,
                ..
            }]
        ));
        assert_eq!(p.b.qp.inbound_in_use(), 0);
    }

    #[test]
    fn grh_in_front_of_the_payload() {
        let ours = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let mut p = Pair::new(|_| {}, |c| c.grh = Some(ours));
        let data = p.a.fill(0, 50, 3);
        p.b.recv(1, 0x1000, 40 + 50);
        p.a.send(1, 0, 50, p.b.addr);
        p.run(ms(5));
        let wc = p.b.wcs()[0].1;
        assert_eq!(wc.byte_len, 90);
        assert_eq!(p.b.at(0x1000, 40), grh_header(p.a.addr.ip, ours, 50));
        assert_eq!(p.b.at(0x1000 + 40, 50), &data[..]);
    }

    #[test]
    fn post_send_refusals() {
        let mut p = Pair::new(|c| c.sq_depth = 1, |_| {});
        let b = p.b.addr;
        let op_refused = |op| SendWr {
            wr_id: 0,
            op,
            payload: Payload::Inline(InlineData::new(&[1]).unwrap()),
            flags: SIGNALED,
        };
        for op in [
            SendOp::Send {
                imm: None,
                invalidate: Some(1),
            },
            SendOp::Write {
                remote_addr: 0,
                rkey: 1,
                imm: Some(1),
            },
            SendOp::LocalInvalidate { stag: 1 },
        ] {
            assert_eq!(
                p.a.qp.post_send(op_refused(op), b),
                Err(PostError::Unsupported)
            );
        }
        assert_eq!(
            p.a.qp.post_send(op_refused(read(0, 1)), b),
            Err(PostError::Invalid)
        );
        let fa = SendWr {
            payload: p.a.sgl(0, 4),
            ..op_refused(fetch_add(0, 1, 1))
        };
        assert_eq!(p.a.qp.post_send(fa, b), Err(PostError::Invalid));
        let far = DgramAddr { qpn: 1 << 24, ..b };
        let send = op_refused(SendOp::Send {
            imm: None,
            invalidate: None,
        });
        assert_eq!(p.a.qp.post_send(send, far), Err(PostError::Invalid));
        p.a.qp.post_send(send, b).unwrap();
        assert_eq!(p.a.qp.post_send(send, b), Err(PostError::QueueFull));
    }

    #[test]
    fn would_block_keeps_datagrams_pending() {
        let mut p = Pair::new(|_| {}, |_| {});
        p.a.fill(0, 5 * ROOM_TAGGED, 1);
        p.a.post(1, write(0, p.b.buf), 0, 5 * ROOM_TAGGED, p.b.addr);
        let mut s = VecSink {
            budget: Some(2),
            ..Default::default()
        };
        assert_eq!(p.a.qp.poll_transmit(&p.a.mem, &mut s).unwrap(), 2);
        assert!(p.a.qp.wants_transmit());
        s.budget = None;
        assert_eq!(p.a.qp.poll_transmit(&p.a.mem, &mut s).unwrap(), 3);
        let psns: Vec<u32> = s.out.iter().map(|d| shim_of(d).data.unwrap().psn).collect();
        assert_eq!(psns, [0, 1, 2, 3, 4]);
        // A hard socket error loses one datagram; retransmission covers it.
        p.a.post(2, write(0, p.b.buf), 0, 10, p.b.addr);
        let mut bad = VecSink {
            fail_next: Some(io::ErrorKind::ConnectionRefused),
            ..Default::default()
        };
        assert!(p.a.qp.poll_transmit(&p.a.mem, &mut bad).is_err());
        for d in &s.out {
            p.deliver(Dir::AtoB, d);
        }
        p.run(ms(100));
        assert_eq!(p.a.wcs().len(), 2);
        assert_eq!(p.a.qp.stats().tx_socket_errors, 1);
    }

    #[test]
    fn bad_input_is_counted_and_acknowledges_nothing() {
        let mut p = Pair::new(|_| {}, |_| {});
        let now = p.now;
        let src = p.a.addr;
        let feed = |p: &mut Pair, d: &[u8]| {
            p.b.qp
                .handle_datagram(src.ip, src.port, d, &mut p.b.mem, now)
        };
        feed(&mut p, &[0x52]);
        let mut d = [0u8; 64];
        let n = wrd::emit_into(&RdShimRepr::control(1, p.b.addr.qpn, 8), None, &mut d);
        d[3] ^= 1;
        feed(&mut p, &d[..n]);
        // A UD datagram at an RD QP.
        let ud = SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None);
        let n = datagram::emit_into(&ud, b"x", &mut d);
        feed(&mut p, &d[..n]);
        // A data shim whose segment does not parse: not delivered.
        let mut shim = RdShimRepr::control(src.qpn, p.b.addr.qpn, 8);
        shim.data = Some(wrd::DataSeq {
            epoch: 5,
            psn: 0,
            syn: true,
        });
        let mut out = [0u8; 128];
        let n = wrd::emit_into(&shim, Some((&ud, b"abc")), &mut out);
        out[SHIM_LEN] = 0x4d; // DV = 1 but reserved DDP bits set
        let fixed = {
            let body = &out[..n - 4];
            let crc = softrdma_wire::crc::crc32c(body).to_le_bytes();
            let mut v = body.to_vec();
            v.extend_from_slice(&crc);
            v
        };
        feed(&mut p, &fixed);
        let st = p.b.qp.stats();
        assert_eq!(
            (st.rx_malformed, st.rx_bad_crc, st.rx_not_rd),
            (2, 1, 1),
            "{st:?}"
        );
        assert_eq!(p.b.qp.rd_stats().delivered, 0);
    }

    #[test]
    fn reports_jump_the_window_and_carry_the_ack_they_hold_back() {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        struct K(u32);
        impl crate::rd::PeerKey for K {
            fn qpn(&self) -> u32 {
                self.0
            }
        }
        let t = Instant::now();
        let cfg = |q| RdConfig {
            local_qpn: q,
            epoch_seed: q,
            tx_window: 2,
            ..RdConfig::default()
        };
        let mut a: RdEndpoint<K, u32> = RdEndpoint::new(cfg(1)).unwrap();
        let mut b: RdEndpoint<K, u32> = RdEndpoint::new(cfg(2)).unwrap();
        for i in 0..3 {
            a.send(K(2), i, t).unwrap();
        }
        let tx: Vec<_> = std::iter::from_fn(|| a.poll_transmit(t)).collect();
        assert_eq!(tx.len(), 2, "window 2");
        // B fills its window towards A, then delivers A's PSN 0 and 1 and
        // reports on PSN 1.
        for i in 10..14 {
            b.send(K(1), i, t).unwrap();
        }
        let old: Vec<_> = std::iter::from_fn(|| b.poll_transmit(t)).collect();
        assert_eq!(old.len(), 2);
        b.handle_datagram(K(1), &tx[0].shim, t);
        b.handle_datagram(K(1), &tx[1].shim, t);
        b.send_report(K(1), 99, t).unwrap();
        let out: Vec<_> = std::iter::from_fn(|| b.poll_transmit(t)).collect();
        assert_eq!(out.len(), 1, "past the full window");
        assert_eq!(out[0].token, Some(99));
        assert_eq!(out[0].shim.data.unwrap().psn, 2, "before the unsent tokens");
        assert!(
            matches!(out[0].shim.feedback, Feedback::Ack { psn: 2, .. }),
            "the report carries the full ACK"
        );
        // An ACK owed (here for a duplicate) rides on the report, sent
        // again, rather than on a control datagram.
        b.handle_datagram(K(1), &tx[1].shim, t);
        let dup_ack = b.poll_transmit(t).unwrap();
        assert_eq!(dup_ack.token, Some(99));
        assert!(dup_ack.retransmission);
        assert_eq!(dup_ack.shim.data.unwrap().psn, 2);
        assert!(matches!(
            dup_ack.shim.feedback,
            Feedback::Ack { psn: 2, .. }
        ));
        // Earlier datagrams re-sent still name PSN 1 as the next expected.
        b.handle_timeout(t + Duration::from_millis(20));
        let resent: Vec<_> =
            std::iter::from_fn(|| b.poll_transmit(t + Duration::from_millis(20))).collect();
        assert_eq!(resent[0].shim.data.unwrap().psn, 0);
        assert!(matches!(
            resent[0].shim.feedback,
            Feedback::Ack { psn: 1, .. }
        ));
        assert!(matches!(
            resent[2].shim.feedback,
            Feedback::Ack { psn: 2, .. }
        ));
        // Once A acknowledges the report, the hold is gone.
        for x in &resent {
            a.handle_datagram(K(2), &x.shim, t);
        }
        let t2 = t + Duration::from_millis(21);
        a.handle_timeout(t2);
        let acks: Vec<_> = std::iter::from_fn(|| a.poll_transmit(t2)).collect();
        assert!(acks
            .iter()
            .all(|x| matches!(x.shim.feedback, Feedback::Ack { psn: 3, .. })));
        b.handle_datagram(K(1), &acks[0].shim, t2);
        b.handle_datagram(K(1), &tx[1].shim, t2);
        let next: Vec<_> = std::iter::from_fn(|| b.poll_transmit(t2)).collect();
        assert!(!next.is_empty());
        assert!(
            next.iter().all(|x| x.token != Some(99)),
            "no carrier needed"
        );
        assert!(next.iter().all(|x| matches!(
            x.shim.feedback,
            Feedback::Ack { psn, .. } if psn >= 2
        )));
    }
}
