//! The reliable-connected (RC) queue pair over one MPA stream, sans-IO.
//!
//! [`RcQp`] runs RDMAP/DDP over an already negotiated MPA connection (see
//! [`crate::mpa`] for the negotiation). It owns no socket and reads no clock:
//!
//! * in: [`RcQp::post_send`], [`RcQp::post_recv`], [`RcQp::handle_bytes`]
//!   (stream octets split anywhere), [`RcQp::handle_llp_closed`]; for a
//!   receiver that reads into place itself: [`RcQp::rx_direct`] /
//!   [`RcQp::rx_direct_placed`] (payload straight into memory: without
//!   CRC, or with `RcConfig::crc_direct_min`) and [`RcQp::rx_stash_space`]
//!   / [`RcQp::rx_stash_filled`] (CRC: the rest of a partial FPDU straight
//!   behind its start);
//! * out: [`RcQp::poll_transmit`] (writes FPDUs through any
//!   [`std::io::Write`], surviving partial writes and `WouldBlock`),
//!   [`RcQp::poll_completion`], [`RcQp::poll_event`].
//!
//! With CRC an FPDU is verified before any of it is acted on (verify, then
//! place): an FPDU that arrives in pieces is kept until it is complete —
//! unless `RcConfig::crc_direct_min` is set and the FPDU still lacks at
//! least that many octets: then, as siw and RNICs do, its header is acted
//! on and its payload placed as it arrives (straight from the transport
//! through [`RcQp::rx_direct`]), the CRC checked at its end, and nothing
//! of it completes before; a mismatch terminates the stream (RFC 5041:
//! placement may precede validation, delivery may not). Without CRC
//! (nothing to verify) and with markers (siw interoperation) FPDUs are
//! processed as they stream in. A whole FPDU that is a
//! one-segment plain Send or RDMA Write arriving between messages takes a
//! shortcut past the general receive machinery with the same outcome
//! (`RcQp::rx_shortcut`); anything unusual about it, errors included, goes
//! the general way. The same on the way out:
//! [`RcQp::post_send_and_transmit`] writes a lone small plain Send or
//! Write posted to an idle QP as one contiguous FPDU, with no send queue
//! entry unless the socket takes less than all of it.
//!
//! Memory is reached only through [`Memory`]. Every STag, bound and right is
//! checked before an octet moves; a failed check becomes a Terminate (RFC
//! 5040 §7), the QP enters the error state and all outstanding work completes
//! with flush errors.
//!
//! Rules this engine keeps (RFC 5040/5041/5044, and siw's expectations in
//! `docs/wire.md` §9):
//! * MSNs start at 1 per queue (QN 0 Send/Immediate, 1 Read/Atomic Request,
//!   3 Atomic Response) and are checked exactly on receive; MO must equal
//!   the octets received so far; a Terminate is QN 2, MSN 1, MO 0.
//! * A message is finished before the next one of the same kind (tagged or
//!   untagged) starts; the transmitter switches between the send queue and
//!   inbound Read Responses only at message boundaries, serving at most
//!   `read_burst` responses before giving the send queue a turn.
//! * Outbound Reads and atomics never exceed ORD; inbound ones beyond IRD are
//!   a protocol error. Read Responses must target exactly the requested sink
//!   and length.
//! * RFC 7306 messages (Immediate Data, atomics) are sent only when the peer
//!   is known to be softrdma (`RcConfig::softrdma_ext`); otherwise they are
//!   refused locally and, on receive, answered as unexpected opcodes.
//! * A Send with no posted receive is a Terminate (DDP untagged, code 0x02):
//!   iWARP has no receiver-not-ready retry.
//!
//! Immediate data between softrdma peers: the verbs immediate (32 bits)
//! travels in an RFC 7306 Immediate Data message (8 octets): the low 32 bits
//! carry the value, bit 32 says whether it belongs to the Send that follows
//! (Send with immediate: the pair consumes one receive) or stands alone after
//! an RDMA Write (Write with immediate: consumes one receive and completes as
//! `RecvRdmaWithImm` with the Write's length).

use std::collections::VecDeque;
use std::io::{self, IoSlice};

use softrdma_wire::ddp::{self, DdpHeader, Mode};
use softrdma_wire::fpdu::{self, Deframer, Event, Framer};
use softrdma_wire::rdmap::{
    self, AtomicOp as WireAtomicOp, AtomicRequest, AtomicResponse, EchoedHeader, Opcode, RdmapBody,
    ReadRequest, SegmentRepr, TerminateCause, TerminateRepr,
};
use softrdma_wire::{crc::Crc32c, Error as WireError};

use crate::memory::{scatter, AtomicOp, MemError, Memory};
use crate::wr::{
    Payload, RecvWr, SendFlags, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion, MAX_INLINE,
    MAX_SGE,
};

/// What has to happen before data may flow (RFC 5044 "initiator sends
/// first", RFC 6581 peer-to-peer RTR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtrRole {
    /// Nothing: both sides may send at once.
    None,
    /// We are the P2P initiator: send this RTR message first.
    Send(RtrKind),
    /// We are the responder: send nothing until the first FPDU arrives. With
    /// `Some(kind)` that FPDU is the P2P RTR of this kind and is absorbed;
    /// with `None` it is ordinary traffic (RFC 5044 initiator-sends-first).
    Await(Option<RtrKind>),
}

/// The zero-length message used as RTR (RFC 6581).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtrKind {
    /// Zero-length RDMA Write to STag 1, TO 0 (what siw sends).
    Write,
    /// Zero-length RDMA Read Request (sink STag 0, source STag 1).
    Read,
    /// Zero-length Send (consumes no receive at a softrdma responder).
    Send,
}

/// Parameters of an RC connection, from the MPA negotiation and the QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConfig {
    /// CRC32C negotiated (either side asked).
    pub crc: bool,
    /// Insert markers in what we send (the peer asked for them).
    pub markers_tx: bool,
    /// Expect markers in what we receive (we asked for them).
    pub markers_rx: bool,
    /// Inbound RDMA Read / atomic requests we accept outstanding.
    pub ird: u16,
    /// Outbound RDMA Read / atomic requests we may have outstanding.
    pub ord: u16,
    /// Largest ULPDU we send (from the MSS, `fpdu::max_ulpdu`).
    pub max_ulpdu: usize,
    /// The peer is softrdma: RFC 7306 immediate data and atomics allowed.
    pub softrdma_ext: bool,
    /// Send queue depth.
    pub sq_depth: usize,
    /// Receive queue depth (unused when a shared receive queue is given).
    pub rq_depth: usize,
    /// RTR duty.
    pub rtr: RtrRole,
    /// Inbound Read Responses sent in a row before the send queue gets a
    /// message in (so serving Reads never starves the send queue).
    pub read_burst: usize,
    /// With CRC: an FPDU arriving in parts that still lacks at least this
    /// many octets is processed as it arrives — header acted on, payload
    /// placed (by [`RcQp::rx_direct`] straight from the transport), CRC
    /// checked at its end before anything of it completes — instead of
    /// kept until whole and verified first. 0 (the default): every FPDU is
    /// verified before any of it is acted on.
    pub crc_direct_min: usize,
}

impl Default for RcConfig {
    fn default() -> Self {
        RcConfig {
            crc: true,
            markers_tx: false,
            markers_rx: false,
            ird: 16,
            ord: 16,
            max_ulpdu: fpdu::max_ulpdu(1448, false),
            softrdma_ext: true,
            sq_depth: 128,
            rq_depth: 128,
            rtr: RtrRole::None,
            read_burst: 4,
            crc_direct_min: 0,
        }
    }
}

/// Which completion queue a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqKind {
    /// The send queue's CQ.
    Send,
    /// The receive queue's CQ.
    Recv,
}

/// Connection-level events for the engine driving this QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RcEvent {
    /// The QP entered the error state (verbs `IBV_EVENT_QP_FATAL` or
    /// `IBV_EVENT_QP_ACCESS_ERR`): `cause` is the Terminate sent or received
    /// (`None` for an LLP failure or a local disconnect).
    Error {
        /// The Terminate cause, if any.
        cause: Option<TerminateCause>,
        /// True if the peer sent the Terminate, false if we did.
        remote: bool,
    },
    /// Everything that will ever be sent has been written: the engine may
    /// close the TCP connection.
    TxClosed,
    /// The shared or private receive queue fell below its limit
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    RecvLimitReached,
}

/// Why a work request was refused at post time (nothing was queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The queue is full.
    QueueFull,
    /// The operation needs a softrdma peer (RFC 7306), or is otherwise not
    /// supported on this connection.
    Unsupported,
    /// A parameter is invalid (an atomic with a buffer other than 8 octets,
    /// inline data on a Read, more SGEs than allowed).
    Invalid,
}

/// QP state as far as the wire protocol is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RcState {
    /// Waiting for the RTR; receive processing runs, transmit is held.
    AwaitingRtr,
    /// Data flows.
    Rts,
    /// Error: outstanding work flushed; a Terminate may still be on its way.
    Error,
}

/// A receive queue, private to a QP or shared by several (an SRQ).
#[derive(Debug, Clone)]
pub struct RecvQueue {
    wrs: VecDeque<RecvWr>,
    depth: usize,
    limit: Option<usize>,
}

impl RecvQueue {
    /// A queue of at most `depth` receives.
    pub fn new(depth: usize) -> Self {
        RecvQueue {
            wrs: VecDeque::with_capacity(depth),
            depth,
            limit: None,
        }
    }

    /// Posts a receive.
    pub fn post(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.wrs.len() >= self.depth {
            return Err(PostError::QueueFull);
        }
        self.wrs.push_back(wr);
        Ok(())
    }

    /// Receives currently posted.
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    /// True if no receive is posted.
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// Takes the oldest receive without limit accounting (to move receives
    /// between queues).
    pub fn take_front(&mut self) -> Option<RecvWr> {
        self.wrs.pop_front()
    }

    /// Arms the limit event: it fires once when fewer than `limit` receives
    /// remain (`ibv_modify_srq` with `IBV_SRQ_LIMIT`); 0 disarms.
    pub fn arm_limit(&mut self, limit: usize) {
        self.limit = (limit > 0).then_some(limit);
    }

    /// Takes the oldest receive; the flag says the limit event fired.
    #[inline]
    fn take(&mut self) -> (Option<RecvWr>, bool) {
        let wr = self.wrs.pop_front();
        let fired = match self.limit {
            Some(l) if self.wrs.len() < l => {
                self.limit = None;
                true
            }
            _ => false,
        };
        (wr, fired)
    }

    fn drain(&mut self) -> impl Iterator<Item = RecvWr> + '_ {
        self.wrs.drain(..)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SqState {
    /// Not started, or being framed: `framed` payload octets are in FPDUs.
    Sending { stage: u8, framed: u64 },
    /// Framed completely; waiting for the last FPDU to be written.
    Framed,
    /// Waiting for a Read Response or Atomic Response.
    AwaitResponse,
    /// Finished with this status and length.
    Done(WcStatus, u32),
}

#[derive(Debug, Clone, Copy)]
struct SqEntry {
    wr: SendWr,
    state: SqState,
    /// Sequence number of this entry (position since the QP was created).
    seq: u64,
}

/// An outbound Read or atomic waiting for its response.
#[derive(Debug, Clone, Copy)]
struct OrdEntry {
    /// SQ sequence number, or `None` for the P2P RTR Read.
    seq: Option<u64>,
    kind: OrdKind,
}

#[derive(Debug, Clone, Copy)]
enum OrdKind {
    Read {
        sink_stag: u32,
        sink_to: u64,
        size: u32,
        received: u64,
    },
    Atomic {
        req_id: u32,
    },
}

/// An inbound request waiting to be answered.
#[derive(Debug, Clone, Copy)]
enum IrdEntry {
    Read { req: ReadRequest, sent: u64 },
    Atomic { req_id: u32, orig: u64 },
}

/// What finishing the write of an FPDU means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Done {
    Nothing,
    /// The last FPDU of SQ entry `seq`: it completes (Send, Write).
    SqComplete(u64),
    /// The last FPDU of the Terminate.
    Terminate,
}

/// A memory span of an FPDU's payload, resolved again at write time.
#[derive(Debug, Clone, Copy, Default)]
struct Span {
    /// lkey for local gathers, STag for Read Response sources.
    key: u32,
    addr: u64,
    len: u64,
    remote: bool,
}

const HDR_CAP: usize = fpdu::LEN_FIELD + rdmap::MAX_STREAM_HEADER_LEN + MAX_INLINE;

/// Gathered payloads up to this size are copied behind the header (one
/// CRC pass, two io-vectors) instead of being written from their spans.
const SMALL_GATHER: usize = MAX_INLINE;

/// One FPDU ready to be written (possibly partly written).
#[derive(Debug, Clone, Copy)]
struct PendingFpdu {
    /// Length field, header, and inline payload; or with markers, nothing
    /// (the whole FPDU is in `RcQp::marker_buf`).
    hdr: [u8; HDR_CAP],
    hdr_len: usize,
    spans: [Span; MAX_SGE],
    nspans: usize,
    trailer: [u8; 8],
    trailer_len: usize,
    /// Octets of the whole FPDU.
    total: usize,
    written: usize,
    /// The FPDU lives in the marker buffer at this offset.
    owned: Option<usize>,
    done: Done,
}

impl PendingFpdu {
    fn new() -> Self {
        PendingFpdu {
            hdr: [0; HDR_CAP],
            hdr_len: 0,
            spans: [Span::default(); MAX_SGE],
            nspans: 0,
            trailer: [0; 8],
            trailer_len: 0,
            total: 0,
            written: 0,
            owned: None,
            done: Done::Nothing,
        }
    }
}

/// One FPDU was framed into the transmit ring (or framing failed and the QP
/// is in the error state): what the framing steps return instead of the
/// FPDU itself, which never moves once built.
struct Built;

/// The FPDUs framed and not yet completely written: [`TX_BATCH`] slots,
/// each built in place by `RcQp::build` and written from there, so an FPDU
/// (header, inline data, span list: some 600 octets) is neither zeroed nor
/// moved on its way to the socket.
#[derive(Debug)]
struct TxRing {
    slots: Vec<PendingFpdu>,
    head: usize,
    len: usize,
}

impl TxRing {
    fn new() -> Self {
        TxRing {
            slots: vec![PendingFpdu::new(); TX_BATCH],
            head: 0,
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn clear(&mut self) {
        self.len = 0;
    }

    fn at(&self, i: usize) -> usize {
        (self.head + i) % TX_BATCH
    }

    fn front(&self) -> Option<&PendingFpdu> {
        (self.len > 0).then(|| &self.slots[self.head])
    }

    fn front_mut(&mut self) -> Option<&mut PendingFpdu> {
        (self.len > 0).then(|| &mut self.slots[self.head])
    }

    fn back(&self) -> Option<&PendingFpdu> {
        (self.len > 0).then(|| &self.slots[self.at(self.len - 1)])
    }

    fn pop_front(&mut self) {
        if self.len > 0 {
            self.head = self.at(1);
            self.len -= 1;
        }
    }

    fn pop_back(&mut self) {
        self.len = self.len.saturating_sub(1);
    }

    fn iter(&self) -> impl Iterator<Item = &PendingFpdu> + '_ {
        (0..self.len).map(|i| &self.slots[self.at(i)])
    }

    /// The free slot behind the last FPDU (the ring is not full: callers
    /// frame at most `TX_BATCH`), reset; [`TxRing::commit`] adds it.
    fn next_slot(&mut self) -> &mut PendingFpdu {
        debug_assert!(self.len < TX_BATCH);
        let i = self.at(self.len.min(TX_BATCH - 1));
        let p = &mut self.slots[i];
        p.hdr_len = 0;
        p.nspans = 0;
        p.trailer_len = 0;
        p.total = 0;
        p.written = 0;
        p.owned = None;
        p.done = Done::Nothing;
        p
    }

    fn commit(&mut self) {
        self.len = (self.len + 1).min(TX_BATCH);
    }
}

/// FPDUs batched into one vectored write.
const TX_BATCH: usize = 16;
/// Octets batched into one vectored write, with CRC. The batch is read
/// twice, by its CRC when framed and by the kernel's copy when written; a
/// batch small enough to stay in a core's L2 cache between the two is read
/// from memory once (1 MiB batches measured 0.85x raw TCP for 1 MiB RC
/// Writes with CRC, 256 KiB 0.92x, 128 KiB 0.82x — medians of 4 runs).
/// Without CRC only [`TX_BATCH`] bounds a batch (`docs/datagram.md`
/// §12.18).
const TX_BATCH_BYTES: usize = 1 << 18;
/// IoSlices one batch may need: header + spans + trailer per FPDU.
const IOV_CAP: usize = TX_BATCH * (MAX_SGE + 2);
/// IoSlices one FPDU may need.
const IOV_ONE: usize = MAX_SGE + 2;
/// IoSlices a batch of FPDUs with at most one span each needs.
const IOV_MID: usize = TX_BATCH * 3;

/// One piece of memory a directly placed payload goes to (see
/// [`RcQp::rx_direct`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectPiece {
    /// STag (`remote`: needs REMOTE_WRITE) or lkey (needs LOCAL_WRITE).
    pub key: u32,
    /// Address in the region's address space.
    pub addr: u64,
    /// Octets.
    pub len: u64,
    /// A peer-supplied STag (RDMA Write) rather than a local key.
    pub remote: bool,
}

/// The rest of an FPDU's payload, for direct placement
/// ([`RcQp::rx_direct`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectRx {
    /// Where the octets go, in order.
    pub pieces: [DirectPiece; MAX_SGE],
    /// Pieces in use.
    pub npieces: usize,
    /// Payload octets left in the FPDU (the sum of the pieces).
    pub len: usize,
    /// Octets after the payload before the next FPDU (pad and CRC field).
    pub trailer: usize,
    /// Octets of the next FPDU's length field and header if it is of the
    /// same kind as this one (tagged or untagged): reading exactly
    /// `trailer + next_header` octets after the payload ends a read at the
    /// next payload, so it too can be placed directly.
    pub next_header: usize,
}

impl DirectRx {
    /// The pieces in use.
    pub fn pieces(&self) -> &[DirectPiece] {
        &self.pieces[..self.npieces]
    }
}

/// Where the payload of the segment being received goes.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// Nowhere (zero-length, or discarded after an error).
    Discard,
    /// RDMA Write placement.
    Write { stag: u32, to: u64 },
    /// Read Response placement into the local sink of the ORD head.
    ReadResp { offset: u64 },
    /// Send placement into the receive in progress.
    Recv { offset: u64 },
}

/// A Send being received.
#[derive(Debug, Clone, Copy)]
struct RxRecv {
    wr: RecvWr,
    msn: u32,
    received: u64,
    opcode: Opcode,
}

/// The state of the segment being received.
#[derive(Debug, Clone, Copy)]
struct RxSeg {
    repr: SegmentRepr,
    /// The offending-header echo for a Terminate about this segment.
    echo: Option<EchoedHeader>,
    payload_len: u64,
    target: Target,
    placed: u64,
}

/// An RC queue pair's protocol engine. See the module docs.
#[derive(Debug)]
pub struct RcQp {
    cfg: RcConfig,
    state: RcState,
    // --- transmit ---
    framer: Framer,
    sq: VecDeque<SqEntry>,
    next_seq: u64,
    /// Index in `sq` of the entry being framed (or the next to frame).
    sq_cursor: usize,
    ord: VecDeque<OrdEntry>,
    ird: VecDeque<IrdEntry>,
    /// Next MSN to send on QN 0, 1, 3.
    tx_msn: [u32; 4],
    next_atomic_id: u32,
    /// Message source currently being framed: true = inbound read queue.
    in_ird_message: bool,
    ird_served_in_row: usize,
    pending: TxRing,
    marker_buf: Vec<u8>,
    rtr_to_send: Option<RtrKind>,
    terminate: Option<TerminateRepr>,
    terminate_queued: bool,
    tx_closed: bool,
    // --- receive ---
    deframer: Deframer,
    /// With CRC (and no markers): the start of an FPDU that arrived only in
    /// part, kept until it is complete so it is verified before any of it
    /// is acted on. `rx_stash[..rx_stash_len]` is valid; the vector only
    /// grows (to the largest FPDU seen), so refilling it costs no zeroing.
    rx_stash: Vec<u8>,
    rx_stash_len: usize,
    rq: RecvQueue,
    rx_msn: [u32; 4],
    rx_seg: Option<RxSeg>,
    rx_recv: Option<RxRecv>,
    /// Tagged message in progress: (STag, next TO) of a Write or Read Response.
    rx_tagged: Option<(u32, u64)>,
    /// Octets of the Write message in progress or last finished (for
    /// Write with immediate).
    rx_write_len: u64,
    rx_write_open: bool,
    /// Immediate data announced for the next Send.
    rx_pending_imm: Option<u32>,
    awaiting_rtr: Option<Option<RtrKind>>,
    /// Some FPDU has arrived from the peer.
    rx_any: bool,
    /// A rule the current segment's header broke, reported at its end.
    rx_deferred: Option<(TerminateCause, bool)>,
    // --- outputs ---
    completions: VecDeque<(CqKind, WorkCompletion)>,
    events: VecDeque<RcEvent>,
}

impl RcQp {
    /// A QP in the RTS state (or awaiting the RTR), with the connection's
    /// parameters.
    pub fn new(cfg: RcConfig) -> Self {
        let (rtr_to_send, awaiting_rtr) = match cfg.rtr {
            RtrRole::None => (None, None),
            RtrRole::Send(k) => (Some(k), None),
            RtrRole::Await(k) => (None, Some(k)),
        };
        let max_fpdu = fpdu::fpdu_len(cfg.max_ulpdu);
        RcQp {
            cfg,
            state: if awaiting_rtr.is_some() {
                RcState::AwaitingRtr
            } else {
                RcState::Rts
            },
            framer: Framer::new(cfg.crc, cfg.markers_tx),
            sq: VecDeque::with_capacity(cfg.sq_depth),
            next_seq: 0,
            sq_cursor: 0,
            ord: VecDeque::with_capacity(usize::from(cfg.ord) + 1),
            ird: VecDeque::with_capacity(usize::from(cfg.ird) + 1),
            tx_msn: [1; 4],
            next_atomic_id: 1,
            in_ird_message: false,
            ird_served_in_row: 0,
            pending: TxRing::new(),
            marker_buf: if cfg.markers_tx {
                Vec::with_capacity(max_fpdu + max_fpdu / 128 + 16)
            } else {
                Vec::new()
            },
            rtr_to_send,
            terminate: None,
            terminate_queued: false,
            tx_closed: false,
            deframer: Deframer::new(cfg.crc, cfg.markers_rx),
            rx_stash: Vec::new(),
            rx_stash_len: 0,
            rq: RecvQueue::new(cfg.rq_depth),
            rx_msn: [1; 4],
            rx_seg: None,
            rx_recv: None,
            rx_tagged: None,
            rx_write_len: 0,
            rx_write_open: false,
            rx_pending_imm: None,
            awaiting_rtr,
            rx_any: false,
            rx_deferred: None,
            completions: VecDeque::with_capacity(cfg.sq_depth + cfg.rq_depth + 2),
            events: VecDeque::with_capacity(4),
        }
    }

    /// The connection parameters.
    pub fn config(&self) -> &RcConfig {
        &self.cfg
    }

    /// The protocol state.
    #[inline]
    pub fn state(&self) -> RcState {
        self.state
    }

    /// Posts a send work request. In the error state it completes at once
    /// with a flush error (as verbs does).
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if self.sq.len() >= self.cfg.sq_depth {
            return Err(PostError::QueueFull);
        }
        match wr.op {
            // Write-Record exists only on datagram QPs.
            SendOp::WriteRecord { .. } => return Err(PostError::Unsupported),
            SendOp::Send {
                imm: Some(_),
                invalidate: Some(_),
            } => return Err(PostError::Invalid),
            SendOp::Send { imm: Some(_), .. }
            | SendOp::Write { imm: Some(_), .. }
            | SendOp::CompareSwap { .. }
            | SendOp::FetchAdd { .. }
                if !self.cfg.softrdma_ext =>
            {
                return Err(PostError::Unsupported)
            }
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
                if (wr.payload.len() != 8 || matches!(wr.payload, Payload::Inline(_))) =>
            {
                return Err(PostError::Invalid);
            }
            SendOp::Read { .. }
                if (matches!(wr.payload, Payload::Inline(_))
                    || wr.payload.len() > u64::from(u32::MAX)) =>
            {
                return Err(PostError::Invalid);
            }
            _ => {}
        }
        if wr.payload.len() > u64::from(u32::MAX) {
            return Err(PostError::Invalid);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let state = if self.state == RcState::Error {
            SqState::Done(WcStatus::WrFlushErr, 0)
        } else {
            SqState::Sending {
                stage: 0,
                framed: 0,
            }
        };
        self.sq.push_back(SqEntry { wr, state, seq });
        self.reap_sq();
        Ok(())
    }

    /// Posts a receive to the QP's own receive queue.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.state == RcState::Error {
            if self.completions.len() >= self.completions.capacity() {
                return Err(PostError::QueueFull);
            }
            self.completions.push_back((
                CqKind::Recv,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
            ));
            return Ok(());
        }
        self.rq.post(wr)
    }

    /// The QP's own receive queue (to arm its limit, or count receives).
    pub fn recv_queue(&mut self) -> &mut RecvQueue {
        &mut self.rq
    }

    /// True if a completion or a connection event waits to be polled
    /// ([`RcQp::poll_completion`], [`RcQp::poll_event`]).
    #[inline]
    pub fn has_output(&self) -> bool {
        !self.completions.is_empty() || !self.events.is_empty()
    }

    /// The next completion, with the queue it belongs to.
    #[inline]
    pub fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        self.completions.pop_front()
    }

    /// The next connection event.
    #[inline]
    pub fn poll_event(&mut self) -> Option<RcEvent> {
        self.events.pop_front()
    }

    /// Sends one zero-length RDMA Read Request as a probe, if nothing has
    /// arrived from the peer yet, no Read is outstanding and no message is
    /// half sent. Returns whether a probe was queued.
    ///
    /// Why: Linux siw as responder may leave FPDUs that arrive right after
    /// its MPA Reply unread until more data arrives (`docs/wire.md` §9 item
    /// 11). A zero-length Read costs the peer nothing (it answers with a
    /// zero-length Read Response, no memory is touched, no receive is
    /// consumed), and its arrival makes the peer read what was stuck.
    pub fn send_probe(&mut self) -> bool {
        let mid_message = self.in_ird_message || self.sq_mid_message();
        if self.state != RcState::Rts
            || self.rx_any
            || !self.ord.is_empty()
            || self.cfg.ord == 0
            || self.rtr_to_send.is_some()
            || mid_message
        {
            return false;
        }
        self.rtr_to_send = Some(RtrKind::Read);
        true
    }

    /// True while the send queue's head message has some but not all of its
    /// segments framed (the next FPDU must continue it).
    fn sq_mid_message(&self) -> bool {
        self.sq.get(self.sq_cursor).is_some_and(|e| match e.state {
            SqState::Sending { stage, framed } => {
                let write_done = matches!(e.wr.op, SendOp::Write { .. }) && stage == 1;
                framed > 0 && !write_done
            }
            _ => false,
        })
    }

    /// True once any FPDU has arrived from the peer.
    pub fn received_any(&self) -> bool {
        self.rx_any
    }

    /// True if [`RcQp::poll_transmit`] has something to write now.
    pub fn wants_transmit(&self) -> bool {
        if self.tx_closed {
            return false;
        }
        if !self.pending.is_empty() || self.terminate.is_some() {
            return true;
        }
        if self.state == RcState::Error {
            return self.terminate_queued;
        }
        if self.state == RcState::AwaitingRtr {
            return false;
        }
        self.rtr_to_send.is_some() || !self.ird.is_empty() || self.sq_has_work()
    }

    fn sq_has_work(&self) -> bool {
        self.sq
            .get(self.sq_cursor)
            .is_some_and(|e| matches!(e.state, SqState::Sending { .. }) && !self.blocked(&e.wr))
    }

    /// Whether the SQ head to frame must wait (ORD full, fence).
    fn blocked(&self, wr: &SendWr) -> bool {
        let needs_ord = matches!(
            wr.op,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        );
        (needs_ord && self.ord.len() >= usize::from(self.cfg.ord.max(1)))
            || (wr.flags.fence && !self.ord.is_empty())
    }

    /// Local disconnect (`rdma_disconnect`, QP to error): outstanding work
    /// is flushed, nothing more is sent, and [`RcEvent::TxClosed`] follows
    /// once FPDUs already started are written.
    pub fn disconnect(&mut self) {
        self.fail(None, false, None);
    }

    /// The TCP connection closed or failed: flush everything.
    pub fn handle_llp_closed(&mut self) {
        self.fail(None, false, None);
        self.pending.clear();
        self.terminate = None;
        if !self.tx_closed {
            self.tx_closed = true;
            self.events.push_back(RcEvent::TxClosed);
        }
    }

    // ------------------------------------------------------------------
    // Errors
    // ------------------------------------------------------------------

    /// Enters the error state. `cause`: Terminate to send (ours) or received
    /// (`remote`). `current`: status for the oldest outstanding send WR.
    fn fail(&mut self, cause: Option<TerminateRepr>, remote: bool, current: Option<WcStatus>) {
        self.fail_inner(cause, remote, current, None);
    }

    /// Enters the error state because send work request `seq` could not be
    /// framed (a local access failure): it completes with `status`; every
    /// other outstanding one — a Read still awaiting its response ahead of
    /// it included — is flushed.
    fn fail_wr(&mut self, seq: u64, status: WcStatus) {
        self.fail_inner(None, false, Some(status), Some(seq));
    }

    /// [`RcQp::fail`]; with `target`, `current` goes to that send work
    /// request instead of the oldest outstanding one.
    fn fail_inner(
        &mut self,
        cause: Option<TerminateRepr>,
        remote: bool,
        current: Option<WcStatus>,
        target: Option<u64>,
    ) {
        if self.state == RcState::Error {
            return;
        }
        self.state = RcState::Error;
        if let (Some(t), false) = (cause, remote) {
            self.terminate = Some(t);
            self.terminate_queued = true;
        }
        self.events.push_back(RcEvent::Error {
            cause: cause.map(|t| t.cause),
            remote,
        });
        // The send queue: everything not done completes with an error; the
        // oldest one may get a specific status.
        // Entries behind it flush even if they were already written: the
        // peer discarded everything after the failure.
        let mut first = current;
        let mut behind = false;
        for e in self.sq.iter_mut() {
            if !behind && matches!(e.state, SqState::Done(..)) {
                continue;
            }
            behind = true;
            let st = match target {
                Some(t) if t == e.seq => current,
                Some(_) => None,
                None => first.take(),
            };
            e.state = SqState::Done(st.unwrap_or(WcStatus::WrFlushErr), 0);
        }
        self.sq_cursor = self.sq.len();
        self.ord.clear();
        self.ird.clear();
        // Pending FPDUs not yet started are dropped; a started one must
        // finish so the stream stays framed for the Terminate.
        while self.pending.len() > 1 || self.pending.front().is_some_and(|p| p.written == 0) {
            self.pending.pop_back();
        }
        if let Some(p) = self.pending.front_mut() {
            p.done = Done::Nothing;
        }
        if let Some(r) = self.rx_recv.take() {
            self.completions.push_back((
                CqKind::Recv,
                WorkCompletion::new(r.wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
            ));
        }
        for wr in self.rq.drain() {
            self.completions.push_back((
                CqKind::Recv,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
            ));
        }
        self.reap_sq();
        if self.terminate.is_none() && self.pending.is_empty() && !self.tx_closed {
            self.tx_closed = true;
            self.events.push_back(RcEvent::TxClosed);
        }
    }

    /// A Terminate we send about the segment being received.
    fn terminate_about(&self, cause: TerminateCause, with_read_request: bool) -> TerminateRepr {
        let mut t = TerminateRepr::new(cause);
        if let Some(seg) = &self.rx_seg {
            if let Some(echo) = seg.echo {
                t.segment_len = Some(seg.payload_len.min(u64::from(u16::MAX)) as u16);
                t.ddp_header = Some(echo);
            }
            if with_read_request {
                if let RdmapBody::ReadRequest(r) = seg.repr.body {
                    t.rdmap_header = Some(r.to_bytes());
                }
            }
        }
        t
    }

    /// Protocol error found while receiving: send a Terminate and fail.
    fn rx_error(&mut self, cause: TerminateCause, with_read_request: bool) {
        let t = self.terminate_about(cause, with_read_request);
        if let Some(seg) = &mut self.rx_seg {
            seg.target = Target::Discard;
        }
        self.fail_rx_recv();
        self.fail(Some(t), false, Some(WcStatus::RemOpErr));
    }

    /// A receive whose message broke the protocol (or arrived corrupted)
    /// fails with an operation error; other receives just flush.
    fn fail_rx_recv(&mut self) {
        if let Some(r) = self.rx_recv.take() {
            self.completions.push_back((
                CqKind::Recv,
                WorkCompletion::new(r.wr.wr_id, WcStatus::RemOpErr, WcOpcode::Recv, 0),
            ));
        }
    }

    /// Moves finished SQ entries at the front to the completion queue, in
    /// order (verbs completes send work in posting order).
    fn reap_sq(&mut self) {
        while let Some(e) = self.sq.front() {
            let SqState::Done(status, len) = e.state else {
                break;
            };
            let e = self.sq.pop_front().expect("front exists");
            self.sq_cursor = self.sq_cursor.saturating_sub(1);
            if e.wr.flags.signaled || status != WcStatus::Success {
                self.completions.push_back((
                    CqKind::Send,
                    WorkCompletion::new(e.wr.wr_id, status, WcOpcode::of(&e.wr.op), len),
                ));
            }
        }
    }

    fn sq_entry_mut(&mut self, seq: u64) -> Option<&mut SqEntry> {
        let front = self.sq.front()?.seq;
        let i = seq.checked_sub(front)? as usize;
        self.sq.get_mut(i)
    }

    fn complete_seq(&mut self, seq: u64, status: WcStatus, len: u32) {
        if let Some(e) = self.sq_entry_mut(seq) {
            e.state = SqState::Done(status, len);
        }
        self.reap_sq();
    }

    // ------------------------------------------------------------------
    // Transmit
    // ------------------------------------------------------------------

    /// [`RcQp::post_send`] followed by [`RcQp::poll_transmit`], with the
    /// same effect on the queues, the wire and the completions, and the
    /// same returns (the outer error: the post was refused and nothing
    /// happened; the inner: what `poll_transmit` would return).
    ///
    /// The commonest latency case takes a shortcut (`tx_shortcut`):
    /// a plain Send/Send-SE or RDMA Write whose whole message is one small
    /// FPDU, posted to an idle QP in RTS, is framed into one contiguous
    /// buffer and written with a single `write`, and a signaled one
    /// completes at once — no send queue entry, no pending-FPDU ring, no
    /// io-vectors. Anything else, and any check that does not pass, goes
    /// the general way.
    pub fn post_send_and_transmit<M: Memory, W: io::Write>(
        &mut self,
        wr: SendWr,
        mem: &mut M,
        out: &mut W,
    ) -> Result<io::Result<usize>, PostError> {
        if let Some(r) = self.tx_shortcut(&wr, mem, out) {
            return Ok(r);
        }
        self.post_send(wr)?;
        Ok(self.poll_transmit(mem, out))
    }

    /// The transmit shortcut of [`RcQp::post_send_and_transmit`], or `None`
    /// (having changed nothing) when `wr` does not qualify: the QP in RTS
    /// with nothing queued or in flight in either direction (send queue,
    /// pending FPDUs, Read/atomic responses owed or awaited, Terminate,
    /// RTR), no markers; `wr` a Send/Send-SE without Immediate Data or
    /// Invalidate, or an RDMA Write without Immediate Data, whose payload
    /// is readable (lkeys, bounds) and fits one FPDU of at most
    /// [`HDR_CAP`] octets.
    ///
    /// The FPDU is built in the free slot of the pending ring — header,
    /// payload, pad, then the CRC behind them — and written from there. If
    /// the socket takes all of it, the message is done: MSN advanced (Send),
    /// completion queued if signaled. If it takes less, or nothing
    /// (`WouldBlock`), or fails, the slot is committed exactly as the
    /// general path leaves a partly written FPDU (CRC in the trailer) and
    /// the work request enters the send queue as framed, so the rest is
    /// written, completed or flushed the usual way.
    fn tx_shortcut<M: Memory, W: io::Write>(
        &mut self,
        wr: &SendWr,
        mem: &M,
        out: &mut W,
    ) -> Option<io::Result<usize>> {
        if self.state != RcState::Rts
            || self.tx_closed
            || self.cfg.markers_tx
            || self.cfg.sq_depth == 0
            || self.terminate.is_some()
            || self.rtr_to_send.is_some()
            || self.in_ird_message
            || !self.pending.is_empty()
            || !self.sq.is_empty()
            || !self.ird.is_empty()
            || !self.ord.is_empty()
        {
            return None;
        }
        let is_send = match wr.op {
            SendOp::Send {
                imm: None,
                invalidate: None,
            } => true,
            SendOp::Write { imm: None, .. } => false,
            _ => return None,
        };
        let len = wr.payload.len();
        // The header lengths are fixed: untagged Send 18, tagged Write 14.
        let hlen = if is_send {
            ddp::UNTAGGED_HEADER_LEN
        } else {
            ddp::TAGGED_HEADER_LEN
        };
        let ulpdu = hlen + usize::try_from(len).ok()?;
        let end = fpdu::LEN_FIELD + ulpdu + fpdu::pad_len(ulpdu);
        if ulpdu > self.cfg.max_ulpdu || end + fpdu::CRC_LEN > HDR_CAP {
            return None;
        }
        let repr = match wr.op {
            SendOp::Write {
                remote_addr, rkey, ..
            } => SegmentRepr::tagged(Opcode::RdmaWrite, rkey, remote_addr, true),
            _ => {
                let op = if wr.flags.solicited {
                    Opcode::SendSe
                } else {
                    Opcode::Send
                };
                SegmentRepr::untagged(op, 0, self.tx_msn[0], 0, true, RdmapBody::None)
            }
        };
        debug_assert_eq!(repr.header_len(), hlen);
        let p = self.pending.next_slot();
        let mut at = fpdu::LEN_FIELD + hlen;
        match &wr.payload {
            Payload::Inline(d) => {
                let d = d.as_slice();
                p.hdr[at..at + d.len()].copy_from_slice(d);
                at += d.len();
            }
            Payload::Sgl(sgl) => {
                for sge in sgl.as_slice().iter().filter(|s| s.length > 0) {
                    // A failed check: the general path reports it.
                    let d = mem
                        .local_read(sge.lkey, sge.addr, u64::from(sge.length))
                        .ok()?;
                    p.hdr[at..at + d.len()].copy_from_slice(d);
                    at += d.len();
                }
            }
        }
        repr.emit(&mut p.hdr[fpdu::LEN_FIELD..fpdu::LEN_FIELD + hlen]);
        fpdu::set_ulpdu_len(&mut p.hdr[..fpdu::LEN_FIELD + hlen], len as usize)
            .expect("ULPDU within max_ulpdu");
        p.hdr[at..end].fill(0);
        let crc = if self.cfg.crc {
            let mut c = Crc32c::new();
            c.update(&p.hdr[..end]);
            c.wire_bytes()
        } else {
            [0; 4]
        };
        let total = end + fpdu::CRC_LEN;
        p.hdr[end..total].copy_from_slice(&crc);
        let r = loop {
            match out.write(&p.hdr[..total]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let (n, res) = match r {
            Ok(n) => (n.min(total), Ok(n.min(total))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => (0, Ok(0)),
            Err(e) => (0, Err(e)),
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        if is_send {
            self.tx_msn[0] = self.tx_msn[0].wrapping_add(1);
        }
        self.ird_served_in_row = 0;
        if n == total {
            if wr.flags.signaled {
                self.completions.push_back((
                    CqKind::Send,
                    WorkCompletion::new(
                        wr.wr_id,
                        WcStatus::Success,
                        WcOpcode::of(&wr.op),
                        len as u32,
                    ),
                ));
            }
            return Some(res);
        }
        // The rest goes the general way: the state it would be in now.
        p.hdr_len = end;
        p.trailer[..fpdu::CRC_LEN].copy_from_slice(&crc);
        p.trailer_len = fpdu::CRC_LEN;
        p.total = total;
        p.written = n;
        p.done = Done::SqComplete(seq);
        self.pending.commit();
        self.sq.push_back(SqEntry {
            wr: *wr,
            state: SqState::Framed,
            seq,
        });
        self.sq_cursor += 1;
        Some(res)
    }

    /// Frames what can be sent and writes it to `out` with vectored writes,
    /// until everything is written, `out` takes less than offered, or it
    /// returns `WouldBlock` (reported as `Ok`). Other I/O errors are
    /// returned as they are; the caller should then call
    /// [`RcQp::handle_llp_closed`]. Returns the octets written.
    pub fn poll_transmit<M: Memory, W: io::Write>(
        &mut self,
        mem: &mut M,
        out: &mut W,
    ) -> io::Result<usize> {
        let mut total = 0;
        loop {
            if self.tx_closed {
                return Ok(total);
            }
            self.fill_pending(mem);
            if self.pending.is_empty() {
                return Ok(total);
            }
            // The smallest io-vector array that holds the batch: one FPDU
            // (the latency case), FPDUs of one span each (bulk data), or
            // the worst case. Its initialisation is paid on every attempt,
            // also the ones a full socket refuses.
            let r = if self.pending.len() == 1 {
                write_pending::<M, W, IOV_ONE>(&self.pending, &self.marker_buf, mem, out)
            } else if self.pending.iter().all(|p| p.nspans <= 1) {
                write_pending::<M, W, IOV_MID>(&self.pending, &self.marker_buf, mem, out)
            } else {
                write_pending::<M, W, IOV_CAP>(&self.pending, &self.marker_buf, mem, out)
            };
            let (n, offered) = match r {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(total),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            total += n;
            self.advance_written(n);
            if n < offered {
                return Ok(total);
            }
        }
    }

    fn advance_written(&mut self, mut n: usize) {
        while n > 0 {
            let Some(p) = self.pending.front_mut() else {
                break;
            };
            let take = (p.total - p.written).min(n);
            p.written += take;
            n -= take;
            if p.written == p.total {
                let (done, owned) = (p.done, p.owned);
                self.pending.pop_front();
                match done {
                    Done::Nothing => {}
                    Done::SqComplete(seq) => {
                        let len = self
                            .sq_entry_mut(seq)
                            .map(|e| e.wr.payload.len() as u32)
                            .unwrap_or(0);
                        self.complete_seq(seq, WcStatus::Success, len);
                    }
                    Done::Terminate => {}
                }
                if owned.is_some() && self.pending.iter().all(|q| q.owned.is_none()) {
                    self.marker_buf.clear();
                }
            }
        }
        if self.state == RcState::Error
            && self.pending.is_empty()
            && self.terminate.is_none()
            && !self.tx_closed
        {
            self.tx_closed = true;
            self.events.push_back(RcEvent::TxClosed);
        }
    }

    /// Frames FPDUs into the pending batch.
    fn fill_pending<M: Memory>(&mut self, mem: &mut M) {
        let mut bytes: usize = self.pending.iter().map(|p| p.total - p.written).sum();
        // With markers every FPDU is copied into one buffer; keep one at a
        // time so the buffer never moves under a pending FPDU.
        let cap = if self.cfg.markers_tx { 1 } else { TX_BATCH };
        // The octet bound keeps a CRC'd batch in cache until written.
        let max_bytes = if self.cfg.crc {
            TX_BATCH_BYTES
        } else {
            usize::MAX
        };
        while self.pending.len() < cap && bytes < max_bytes {
            let before = self.pending.len();
            if self.next_fpdu(mem).is_none() {
                break;
            }
            match self.pending.back() {
                Some(p) if self.pending.len() == before + 1 => bytes += p.total - p.written,
                // Framing failed (the QP dropped FPDUs not yet started).
                _ => bytes = self.pending.iter().map(|p| p.total - p.written).sum(),
            }
        }
    }

    /// The queued Terminate as an FPDU (QN 2, MSN 1, MO 0, L), if any.
    fn terminate_fpdu<M: Memory>(&mut self, mem: &mut M) -> Option<Built> {
        let t = self.terminate.take()?;
        let repr = SegmentRepr::untagged(Opcode::Terminate, 2, 1, 0, true, RdmapBody::Terminate(t));
        Some(self.build(mem, &repr, &Body::None, Done::Terminate))
    }

    /// Builds the next FPDU to send, if any.
    fn next_fpdu<M: Memory>(&mut self, mem: &mut M) -> Option<Built> {
        if let Some(p) = self.terminate_fpdu(mem) {
            return Some(p);
        }
        if self.state != RcState::Rts {
            return None;
        }
        if let Some(kind) = self.rtr_to_send.take() {
            return Some(self.build_rtr(mem, kind));
        }
        loop {
            // Continue the message in progress, then choose a source.
            let use_ird = if self.in_ird_message {
                true
            } else if self.sq_mid_message() {
                // Finish the Send/Write in progress first: two messages of
                // the same kind must not interleave (wire.md §7.3).
                false
            } else {
                let ird_ready = !self.ird.is_empty();
                let sq_ready = self.sq_has_work();
                match (ird_ready, sq_ready) {
                    (false, false) => return None,
                    (true, false) => true,
                    (false, true) => false,
                    (true, true) => self.ird_served_in_row < self.cfg.read_burst.max(1),
                }
            };
            let r = if use_ird {
                self.next_ird_fpdu(mem)
            } else {
                self.ird_served_in_row = 0;
                self.next_sq_fpdu(mem)
            };
            match r {
                Some(p) => return Some(p),
                None if self.state != RcState::Rts => {
                    return self.terminate_fpdu(mem);
                }
                // A work request that needed no FPDU (local invalidate).
                None => continue,
            }
        }
    }

    fn build_rtr<M: Memory>(&mut self, mem: &mut M, kind: RtrKind) -> Built {
        let repr = match kind {
            RtrKind::Write => SegmentRepr::tagged(Opcode::RdmaWrite, 1, 0, true),
            RtrKind::Send => {
                let msn = self.bump_msn(0);
                SegmentRepr::untagged(Opcode::Send, 0, msn, 0, true, RdmapBody::None)
            }
            RtrKind::Read => {
                let msn = self.bump_msn(1);
                self.ord.push_back(OrdEntry {
                    seq: None,
                    kind: OrdKind::Read {
                        sink_stag: 0,
                        sink_to: 0,
                        size: 0,
                        received: 0,
                    },
                });
                SegmentRepr::untagged(
                    Opcode::ReadRequest,
                    1,
                    msn,
                    0,
                    true,
                    RdmapBody::ReadRequest(ReadRequest {
                        sink_stag: 0,
                        sink_to: 0,
                        size: 0,
                        src_stag: 1,
                        src_to: 0,
                    }),
                )
            }
        };
        self.build(mem, &repr, &Body::None, Done::Nothing)
    }

    fn bump_msn(&mut self, qn: usize) -> u32 {
        let m = self.tx_msn[qn];
        self.tx_msn[qn] = m.wrapping_add(1);
        m
    }

    fn next_ird_fpdu<M: Memory>(&mut self, mem: &mut M) -> Option<Built> {
        let entry = *self.ird.front()?;
        match entry {
            IrdEntry::Atomic { req_id, orig } => {
                self.ird.pop_front();
                self.ird_served_in_row += 1;
                let msn = self.bump_msn(3);
                let repr = SegmentRepr::untagged(
                    Opcode::AtomicResponse,
                    3,
                    msn,
                    0,
                    true,
                    RdmapBody::AtomicResponse(AtomicResponse {
                        req_id,
                        orig_value: orig,
                    }),
                );
                Some(self.build(mem, &repr, &Body::None, Done::Nothing))
            }
            IrdEntry::Read { req, sent } => {
                let room = (self.cfg.max_ulpdu - ddp::TAGGED_HEADER_LEN) as u64;
                let left = u64::from(req.size) - sent;
                let n = left.min(room);
                let last = n == left;
                let repr = SegmentRepr::tagged(
                    Opcode::ReadResponse,
                    req.sink_stag,
                    req.sink_to.wrapping_add(sent),
                    last,
                );
                let body = Body::Remote {
                    stag: req.src_stag,
                    to: req.src_to.wrapping_add(sent),
                    len: n,
                };
                let p = self.build(mem, &repr, &body, Done::Nothing);
                if self.state != RcState::Rts {
                    return None;
                }
                if last {
                    self.ird.pop_front();
                    self.in_ird_message = false;
                    self.ird_served_in_row += 1;
                } else {
                    self.in_ird_message = true;
                    if let Some(IrdEntry::Read { sent: s, .. }) = self.ird.front_mut() {
                        *s += n;
                    }
                }
                Some(p)
            }
        }
    }

    fn next_sq_fpdu<M: Memory>(&mut self, mem: &mut M) -> Option<Built> {
        let idx = self.sq_cursor;
        // The entry's small fields only: its payload (up to some 270
        // octets) is read in place by `build` (Body::Sq).
        let e = self.sq.get(idx)?;
        let SqState::Sending { stage, framed } = e.state else {
            return None;
        };
        if self.blocked(&e.wr) {
            return None;
        }
        let total = e.wr.payload.len();
        let seq = e.seq;
        let set_state = |qp: &mut RcQp, st: SqState| {
            if let Some(x) = qp.sq.get_mut(idx) {
                x.state = st;
            }
        };
        match e.wr.op {
            // Refused by post_send; never queued on an RC QP.
            SendOp::WriteRecord { .. } => {
                set_state(self, SqState::Done(WcStatus::LocQpOpErr, 0));
                self.sq_cursor += 1;
                self.reap_sq();
                None
            }
            SendOp::LocalInvalidate { stag } => {
                let st = match mem.invalidate(stag, false) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::LocProtErr,
                };
                self.sq_cursor += 1;
                if st != WcStatus::Success {
                    self.fail_wr(seq, st);
                } else {
                    set_state(self, SqState::Done(st, 0));
                    self.reap_sq();
                }
                None
            }
            SendOp::Send { imm: Some(imm), .. } if stage == 0 => {
                // Immediate Data announcing the Send that follows.
                let msn = self.bump_msn(0);
                let repr = SegmentRepr::untagged(
                    Opcode::ImmediateData,
                    0,
                    msn,
                    0,
                    true,
                    RdmapBody::Immediate(u64::from(imm) | 1 << 32),
                );
                set_state(
                    self,
                    SqState::Sending {
                        stage: 1,
                        framed: 0,
                    },
                );
                Some(self.build(mem, &repr, &Body::None, Done::Nothing))
            }
            SendOp::Send { invalidate, .. } => {
                let room = (self.cfg.max_ulpdu - ddp::UNTAGGED_HEADER_LEN) as u64;
                let n = (total - framed).min(room);
                let last = framed + n == total;
                let msn = self.tx_msn[0];
                if last {
                    self.tx_msn[0] = msn.wrapping_add(1);
                }
                let opcode = match (e.wr.flags.solicited, invalidate.is_some()) {
                    (false, false) => Opcode::Send,
                    (true, false) => Opcode::SendSe,
                    (false, true) => Opcode::SendInvalidate,
                    (true, true) => Opcode::SendSeInvalidate,
                };
                let mut repr =
                    SegmentRepr::untagged(opcode, 0, msn, framed as u32, last, RdmapBody::None);
                if let (Some(s), DdpHeader::Untagged { rsvd_ulp, .. }) = (invalidate, &mut repr.ddp)
                {
                    *rsvd_ulp = s;
                }
                let body = Body::Sq {
                    idx,
                    offset: framed,
                    len: n,
                };
                let done = if last {
                    Done::SqComplete(seq)
                } else {
                    Done::Nothing
                };
                let p = self.build(mem, &repr, &body, done);
                if self.state == RcState::Rts {
                    if last {
                        set_state(self, SqState::Framed);
                        self.sq_cursor += 1;
                    } else {
                        set_state(
                            self,
                            SqState::Sending {
                                stage,
                                framed: framed + n,
                            },
                        );
                    }
                }
                Some(p)
            }
            SendOp::Write {
                remote_addr,
                rkey,
                imm,
            } => {
                if stage == 1 {
                    let imm = imm.unwrap_or(0);
                    let msn = self.bump_msn(0);
                    let repr = SegmentRepr::untagged(
                        Opcode::ImmediateData,
                        0,
                        msn,
                        0,
                        true,
                        RdmapBody::Immediate(u64::from(imm)),
                    );
                    set_state(self, SqState::Framed);
                    self.sq_cursor += 1;
                    return Some(self.build(mem, &repr, &Body::None, Done::SqComplete(seq)));
                }
                let room = (self.cfg.max_ulpdu - ddp::TAGGED_HEADER_LEN) as u64;
                let n = (total - framed).min(room);
                let last = framed + n == total;
                let repr = SegmentRepr::tagged(
                    Opcode::RdmaWrite,
                    rkey,
                    remote_addr.wrapping_add(framed),
                    last,
                );
                let body = Body::Sq {
                    idx,
                    offset: framed,
                    len: n,
                };
                let done = if last && imm.is_none() {
                    Done::SqComplete(seq)
                } else {
                    Done::Nothing
                };
                let p = self.build(mem, &repr, &body, done);
                if self.state == RcState::Rts {
                    if last && imm.is_none() {
                        set_state(self, SqState::Framed);
                        self.sq_cursor += 1;
                    } else if last {
                        set_state(
                            self,
                            SqState::Sending {
                                stage: 1,
                                framed: total,
                            },
                        );
                    } else {
                        set_state(
                            self,
                            SqState::Sending {
                                stage,
                                framed: framed + n,
                            },
                        );
                    }
                }
                Some(p)
            }
            SendOp::Read { remote_addr, rkey } => {
                let Payload::Sgl(sgl) = e.wr.payload else {
                    return None;
                };
                let first = sgl.as_slice().first().copied().unwrap_or_default();
                let msn = self.bump_msn(1);
                let req = ReadRequest {
                    sink_stag: first.lkey,
                    sink_to: first.addr,
                    size: total as u32,
                    src_stag: rkey,
                    src_to: remote_addr,
                };
                self.ord.push_back(OrdEntry {
                    seq: Some(seq),
                    kind: OrdKind::Read {
                        sink_stag: req.sink_stag,
                        sink_to: req.sink_to,
                        size: req.size,
                        received: 0,
                    },
                });
                set_state(self, SqState::AwaitResponse);
                self.sq_cursor += 1;
                let repr = SegmentRepr::untagged(
                    Opcode::ReadRequest,
                    1,
                    msn,
                    0,
                    true,
                    RdmapBody::ReadRequest(req),
                );
                Some(self.build(mem, &repr, &Body::None, Done::Nothing))
            }
            SendOp::CompareSwap {
                remote_addr, rkey, ..
            }
            | SendOp::FetchAdd {
                remote_addr, rkey, ..
            } => {
                let (op, a, c) = match e.wr.op {
                    SendOp::CompareSwap { compare, swap, .. } => {
                        (WireAtomicOp::CompareSwap, swap, compare)
                    }
                    SendOp::FetchAdd { add, .. } => (WireAtomicOp::FetchAdd, add, 0),
                    _ => unreachable!("matched above"),
                };
                let req_id = self.next_atomic_id;
                self.next_atomic_id = self.next_atomic_id.wrapping_add(1);
                let msn = self.bump_msn(1);
                self.ord.push_back(OrdEntry {
                    seq: Some(seq),
                    kind: OrdKind::Atomic { req_id },
                });
                set_state(self, SqState::AwaitResponse);
                self.sq_cursor += 1;
                let req = AtomicRequest {
                    op,
                    req_id,
                    stag: rkey,
                    to: remote_addr,
                    add_swap: a,
                    add_swap_mask: 0,
                    compare: c,
                    compare_mask: 0,
                };
                let repr = SegmentRepr::untagged(
                    Opcode::AtomicRequest,
                    1,
                    msn,
                    0,
                    true,
                    RdmapBody::AtomicRequest(req),
                );
                Some(self.build(mem, &repr, &Body::None, Done::Nothing))
            }
        }
    }

    /// Frames one FPDU into the transmit ring: header from `repr`, payload
    /// from `body`. A local gather failure fails the QP (local protection
    /// error); a remote source failure (Read Response) terminates; either
    /// way nothing is added to the ring.
    fn build<M: Memory>(
        &mut self,
        mem: &mut M,
        repr: &SegmentRepr,
        body: &Body,
        done: Done,
    ) -> Built {
        let cfg = self.cfg;
        let resolved;
        let mut seq = None;
        let body = match *body {
            Body::Sq { idx, offset, len } => {
                let Some(e) = self.sq.get(idx) else {
                    self.fail(None, false, Some(WcStatus::LocQpOpErr));
                    return Built;
                };
                seq = Some(e.seq);
                resolved = Body::Local {
                    payload: &e.wr.payload,
                    offset,
                    len,
                };
                &resolved
            }
            _ => body,
        };
        let p = self.pending.next_slot();
        match build_into(
            p,
            &cfg,
            &mut self.framer,
            &mut self.marker_buf,
            mem,
            repr,
            body,
            done,
        ) {
            Ok(()) => self.pending.commit(),
            Err((e, true)) => {
                // The region went away between the Read Request and now.
                let t = TerminateRepr::new(e.terminate_cause(false));
                self.fail(Some(t), false, None);
            }
            Err((e, false)) => match seq {
                Some(seq) => self.fail_wr(seq, e.local_status()),
                None => self.fail(None, false, Some(e.local_status())),
            },
        }
        Built
    }

    // ------------------------------------------------------------------
    // Receive
    // ------------------------------------------------------------------

    /// Feeds octets received from the peer (any split). Placement happens
    /// as payload arrives; completions and errors become visible through
    /// [`RcQp::poll_completion`] and [`RcQp::poll_event`].
    pub fn handle_bytes<M: Memory>(&mut self, data: &[u8], mem: &mut M) {
        self.handle_bytes_from(data, mem, None);
    }

    /// As [`RcQp::handle_bytes`], taking receives from a shared receive
    /// queue instead of the QP's own.
    pub fn handle_bytes_with_srq<M: Memory>(
        &mut self,
        data: &[u8],
        mem: &mut M,
        srq: &mut RecvQueue,
    ) {
        self.handle_bytes_from(data, mem, Some(srq));
    }

    fn handle_bytes_from<M: Memory>(
        &mut self,
        mut data: &[u8],
        mem: &mut M,
        mut srq: Option<&mut RecvQueue>,
    ) {
        loop {
            if self.state == RcState::Error || data.is_empty() {
                // Nothing more is accepted after an error; and empty input
                // cannot complete anything (every event is reported by the
                // call that consumed its last octet).
                return;
            }
            // A partial FPDU waits: complete it first.
            if self.rx_stash_len > 0 {
                let need = self.rx_stash_need();
                let take = need.min(data.len());
                self.stash(&data[..take]);
                data = &data[take..];
                self.rx_stash_complete(mem, srq.as_deref_mut());
                continue;
            }
            // Fast path: a whole FPDU at the front is verified (CRC) before
            // any of it is acted on, then handled in one go.
            match self.deframer.decode_whole(data) {
                Ok(Some((n, w))) => {
                    data = &data[n..];
                    if !self.rx_shortcut(&w, mem, srq.as_deref_mut()) {
                        self.rx_whole(w, mem, srq.as_deref_mut());
                    }
                    continue;
                }
                Ok(None) if self.stashes() && !self.streams_crc(data) => {
                    // Only part of an FPDU: kept until the rest arrives.
                    self.stash(data);
                    return;
                }
                Ok(None) => {}
                Err(e) => {
                    if e == WireError::BadCrc {
                        self.rx_crc_failed_send(data, srq.as_deref_mut());
                    }
                    self.rx_stream_error(e);
                    return;
                }
            }
            let (n, ev) = match self.deframer.decode(data) {
                Ok(x) => x,
                Err(e) => {
                    self.rx_stream_error(e);
                    return;
                }
            };
            // Copy the event out of the deframer's borrow.
            let ev = match ev {
                None => None,
                Some(Event::Header(h)) => {
                    let mut buf = [0u8; fpdu::MAX_HEADER];
                    buf[..h.len()].copy_from_slice(h);
                    Some(RxEv::Header(buf, h.len()))
                }
                // Payload octets are the tail of what this step consumed
                // (a marker, if any, comes before them).
                Some(Event::Payload(p)) => Some(RxEv::Payload(p.len())),
                Some(Event::End { .. }) => Some(RxEv::End),
            };
            let consumed = &data[..n];
            data = &data[n..];
            match ev {
                None if n == 0 => return,
                None => {}
                Some(RxEv::Header(buf, len)) => {
                    self.rx_any = true;
                    let ulpdu_len = self.deframer.ulpdu_len();
                    self.rx_header(&buf[..len], ulpdu_len, mem, srq.as_deref_mut());
                }
                Some(RxEv::Payload(len)) => self.rx_payload(&consumed[n - len..], mem),
                Some(RxEv::End) => self.rx_fpdu_end(mem, srq.as_deref_mut()),
            }
        }
    }

    /// The commonest FPDUs, handled without the general receive machinery
    /// (header representation, segment and receive state, deferred
    /// errors), when they arrive whole and verified between messages in
    /// the RTS state:
    ///
    /// * a plain Send or Send with Solicited Event in one segment (DDP
    ///   control exactly T=0 L=1 DV=1, RDMAP control exactly RV=1 and the
    ///   opcode, Invalidate STag 0, QN 0, MO 0, the expected MSN), with no
    ///   Immediate Data pending and a posted receive large enough whose
    ///   memory takes the payload: the receive is taken, the payload
    ///   placed, the MSN advanced, a successful receive completion queued
    ///   (and the receive limit event, if it fires);
    /// * an RDMA Write in one segment (T=1 L=1 DV=1, RV=1) that continues
    ///   no earlier segment and whose STag, offset and rights pass: the
    ///   payload is placed.
    ///
    /// The outcome is the general path's. Returns false when the FPDU is
    /// anything else, or its receive or memory is missing, too small or
    /// refuses it; nothing is changed then (beyond memory already written
    /// with the octets the general path writes there again), and the
    /// caller hands the FPDU to the general path, which reports every error
    /// as it always has.
    fn rx_shortcut<M: Memory>(
        &mut self,
        w: &fpdu::WholeFpdu<'_>,
        mem: &mut M,
        srq: Option<&mut RecvQueue>,
    ) -> bool {
        const LAST_UNTAGGED: u8 = ddp::FLAG_L | ddp::DDP_VERSION;
        const LAST_TAGGED: u8 = ddp::FLAG_T | ddp::FLAG_L | ddp::DDP_VERSION;
        if self.state != RcState::Rts
            || self.awaiting_rtr.is_some()
            || self.rx_seg.is_some()
            || self.rx_deferred.is_some()
        {
            return false;
        }
        let h = w.header;
        let word = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let write = Opcode::RdmaWrite.control_octet();
        if h.len() == ddp::TAGGED_HEADER_LEN && h[0] == LAST_TAGGED && h[1] == write {
            if self.rx_tagged.is_some() || self.rx_write_open {
                return false;
            }
            let (stag, to) = (word(2), u64::from(word(6)) << 32 | u64::from(word(10)));
            let len = w.payload.len() as u64;
            // `remote_write` checks STag, bounds and rights before it
            // writes anything.
            if len > 0 && mem.remote_write(stag, to, w.payload).is_err() {
                return false;
            }
            self.rx_any = true;
            self.rx_write_len = len;
            return true;
        }
        if h.len() != ddp::UNTAGGED_HEADER_LEN
            || self.rx_recv.is_some()
            || self.rx_pending_imm.is_some()
        {
            return false;
        }
        let solicited = match (h[0], h[1]) {
            (LAST_UNTAGGED, c) if c == Opcode::Send.control_octet() => false,
            (LAST_UNTAGGED, c) if c == Opcode::SendSe.control_octet() => true,
            _ => return false,
        };
        // Invalidate STag, QN, MSN, MO.
        if word(2) != 0 || word(6) != 0 || word(10) != self.rx_msn[0] || word(14) != 0 {
            return false;
        }
        let q = match srq {
            Some(q) => q,
            None => &mut self.rq,
        };
        let Some(front) = q.wrs.front() else {
            return false;
        };
        if w.payload.len() as u64 > front.sgl.total_len()
            || scatter(mem, &front.sgl, 0, w.payload).is_err()
        {
            return false;
        }
        let (Some(wr), fired) = q.take() else {
            return false;
        };
        self.rx_any = true;
        if fired {
            self.events.push_back(RcEvent::RecvLimitReached);
        }
        self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
        let mut wc = WorkCompletion::new(
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            w.payload.len() as u32,
        );
        wc.solicited = solicited;
        self.completions.push_back((CqKind::Recv, wc));
        true
    }

    /// Acts on a whole FPDU whose CRC was verified.
    fn rx_whole<M: Memory>(
        &mut self,
        w: fpdu::WholeFpdu<'_>,
        mem: &mut M,
        mut srq: Option<&mut RecvQueue>,
    ) {
        self.rx_any = true;
        self.rx_header(w.header, w.ulpdu_len, mem, srq.as_deref_mut());
        if self.state == RcState::Error {
            return;
        }
        if !w.payload.is_empty() {
            self.rx_payload(w.payload, mem);
            if self.state == RcState::Error {
                return;
            }
        }
        self.rx_fpdu_end(mem, srq);
    }

    /// Partial FPDUs are kept until complete (verify, then place) rather
    /// than streamed: with CRC and without markers. (Markers are rare —
    /// siw interoperation — and keep the streaming path.)
    fn stashes(&self) -> bool {
        self.cfg.crc && !self.cfg.markers_rx && self.deframer.at_boundary()
    }

    /// With CRC and `crc_direct_min`: the partial FPDU at the front of
    /// `data` (its length field there) lacks so many octets that it is
    /// streamed (and its payload offered to `rx_direct`) rather than kept.
    fn streams_crc(&self, data: &[u8]) -> bool {
        let min = self.cfg.crc_direct_min;
        if min == 0 || data.len() < fpdu::LEN_FIELD {
            return false;
        }
        let ulpdu = usize::from(u16::from_be_bytes([data[0], data[1]]));
        fpdu::fpdu_len(ulpdu).saturating_sub(data.len()) >= min
    }

    /// Octets the stashed partial FPDU still lacks (to learn its length:
    /// up to the length field; then to its end). 0 when nothing is kept.
    fn rx_stash_need(&self) -> usize {
        let have = self.rx_stash_len;
        if have == 0 {
            return 0;
        }
        if have < fpdu::LEN_FIELD {
            return fpdu::LEN_FIELD - have;
        }
        let ulpdu = usize::from(u16::from_be_bytes([self.rx_stash[0], self.rx_stash[1]]));
        fpdu::fpdu_len(ulpdu).saturating_sub(have)
    }

    /// Makes room for `n` more stashed octets (the vector only grows).
    fn stash_reserve(&mut self, n: usize) {
        let end = self.rx_stash_len + n;
        if self.rx_stash.len() < end {
            self.rx_stash.resize(end, 0);
        }
    }

    fn stash(&mut self, bytes: &[u8]) {
        self.stash_reserve(bytes.len());
        let at = self.rx_stash_len;
        self.rx_stash[at..at + bytes.len()].copy_from_slice(bytes);
        self.rx_stash_len += bytes.len();
    }

    /// If the stashed FPDU is complete, verifies and handles it.
    fn rx_stash_complete<M: Memory>(&mut self, mem: &mut M, srq: Option<&mut RecvQueue>) {
        if self.rx_stash_len < fpdu::LEN_FIELD || self.rx_stash_need() > 0 {
            return;
        }
        let stash = std::mem::take(&mut self.rx_stash);
        let len = std::mem::take(&mut self.rx_stash_len);
        let mut srq = srq;
        match self.deframer.decode_whole(&stash[..len]) {
            Ok(Some((n, w))) => {
                debug_assert_eq!(n, len, "the stash holds exactly one FPDU");
                self.rx_whole(w, mem, srq.as_deref_mut());
            }
            Ok(None) => {
                // Cannot happen (complete, at a boundary, no markers); fail
                // safe rather than act on unverified octets.
                self.rx_stream_error(WireError::Truncated);
            }
            Err(e) => {
                if e == WireError::BadCrc {
                    self.rx_crc_failed_send(&stash[..len], srq);
                }
                self.rx_stream_error(e);
            }
        }
        self.rx_stash = stash;
    }

    /// With CRC: the room for the rest of a partial FPDU kept by
    /// [`RcQp::handle_bytes`] (`None` if none is kept, or its length is
    /// not known yet), so a receiver can read the rest of it straight into
    /// place; report the octets read with [`RcQp::rx_stash_filled`].
    #[inline]
    pub fn rx_stash_space(&mut self) -> Option<&mut [u8]> {
        if self.rx_stash_len < fpdu::LEN_FIELD || self.state == RcState::Error {
            return None;
        }
        let need = self.rx_stash_need();
        if need == 0 {
            return None;
        }
        self.stash_reserve(need);
        let at = self.rx_stash_len;
        Some(&mut self.rx_stash[at..at + need])
    }

    /// The length of the FPDU kept in part (see [`RcQp::rx_stash_space`]),
    /// once known. FPDUs of a bulk transfer are usually of one length, so a
    /// receiver that reads whole multiples of it splits none.
    #[inline]
    pub fn rx_stash_fpdu_len(&self) -> Option<usize> {
        (self.rx_stash_len >= fpdu::LEN_FIELD).then(|| self.rx_stash_len + self.rx_stash_need())
    }

    /// `n` octets were written at the start of [`RcQp::rx_stash_space`]:
    /// as if they had arrived through [`RcQp::handle_bytes`]. Refused
    /// (`false`, nothing changed) if more than the space.
    pub fn rx_stash_filled<M: Memory>(&mut self, n: usize, mem: &mut M) -> bool {
        self.rx_stash_filled_from(n, mem, None)
    }

    /// As [`RcQp::rx_stash_filled`], taking receives from a shared receive
    /// queue.
    pub fn rx_stash_filled_with_srq<M: Memory>(
        &mut self,
        n: usize,
        mem: &mut M,
        srq: &mut RecvQueue,
    ) -> bool {
        self.rx_stash_filled_from(n, mem, Some(srq))
    }

    fn rx_stash_filled_from<M: Memory>(
        &mut self,
        n: usize,
        mem: &mut M,
        srq: Option<&mut RecvQueue>,
    ) -> bool {
        if n == 0 {
            return true;
        }
        if self.rx_stash_len < fpdu::LEN_FIELD
            || self.state == RcState::Error
            || n > self.rx_stash_need()
            || self.rx_stash.len() < self.rx_stash_len + n
        {
            return false;
        }
        self.rx_stash_len += n;
        self.rx_stash_complete(mem, srq);
        true
    }

    /// The FPDU ended (CRC checked): a rule its header broke is reported
    /// now, otherwise the segment completes.
    fn rx_fpdu_end<M: Memory>(&mut self, mem: &mut M, srq: Option<&mut RecvQueue>) {
        match self.rx_deferred.take() {
            Some((cause, rr)) => {
                self.rx_error(cause, rr);
                self.rx_seg = None;
            }
            None => self.rx_end(mem, srq),
        }
    }

    /// A whole FPDU at the front of `fpdu` failed its CRC before anything
    /// of it was acted on. If its (unverified) header starts a Send, the
    /// receive it would have taken completes with a remote operation error
    /// — as when a Send streamed in fails its CRC at the end (the receive
    /// was taken by then) — instead of merely flushing.
    fn rx_crc_failed_send(&mut self, fpdu: &[u8], srq: Option<&mut RecvQueue>) {
        if self.rx_recv.is_some() || fpdu.len() < fpdu::LEN_FIELD {
            return;
        }
        let ulpdu = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
        let end = (fpdu::LEN_FIELD + ulpdu).min(fpdu.len());
        let Ok((repr, _)) = SegmentRepr::parse(&fpdu[fpdu::LEN_FIELD..end], Mode::Stream) else {
            return;
        };
        let send = matches!(
            repr.opcode,
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate
        );
        if !send || !matches!(repr.ddp, DdpHeader::Untagged { qn: 0, mo: 0, .. }) {
            return;
        }
        let (wr, fired) = match srq {
            Some(q) => q.take(),
            None => self.rq.take(),
        };
        if fired {
            self.events.push_back(RcEvent::RecvLimitReached);
        }
        if let Some(wr) = wr {
            self.completions.push_back((
                CqKind::Recv,
                WorkCompletion::new(wr.wr_id, WcStatus::RemOpErr, WcOpcode::Recv, 0),
            ));
        }
    }

    /// The MPA stream broke (CRC, marker): Terminate, and the stream ends.
    fn rx_stream_error(&mut self, e: WireError) {
        let cause = match e {
            WireError::BadCrc => TerminateCause::MpaCrcError,
            WireError::BadMarker => TerminateCause::MpaMarkerMismatch,
            _ => TerminateCause::MpaLocalCatastrophic,
        };
        self.rx_seg = None;
        self.fail_rx_recv();
        self.fail(
            Some(TerminateRepr::new(cause)),
            false,
            Some(WcStatus::RemOpErr),
        );
    }

    fn rx_header<M: Memory>(
        &mut self,
        h: &[u8],
        ulpdu_len: usize,
        mem: &mut M,
        srq: Option<&mut RecvQueue>,
    ) {
        let echo = EchoedHeader::from_segment(h).ok();
        let repr = match SegmentRepr::parse(h, Mode::Stream) {
            Ok((r, hlen)) if hlen == h.len() || matches!(r.body, RdmapBody::Terminate(_)) => r,
            Ok((r, _)) => {
                // An opcode-specific header with trailing payload where none
                // is allowed is caught below by the per-opcode rules.
                r
            }
            Err(e) => {
                let tagged = h.first().is_some_and(|b| b & ddp::FLAG_T != 0);
                let cause = match e {
                    WireError::BadVersion if h[0] & ddp::DV_MASK != ddp::DDP_VERSION => {
                        if tagged {
                            TerminateCause::DdpTaggedInvalidVersion
                        } else {
                            TerminateCause::DdpUntaggedInvalidVersion
                        }
                    }
                    WireError::BadVersion => TerminateCause::RdmapInvalidVersion,
                    _ => TerminateCause::RdmapCatastrophicStream,
                };
                self.rx_seg = Some(RxSeg {
                    repr: tagged_placeholder(),
                    echo,
                    payload_len: 0,
                    target: Target::Discard,
                    placed: 0,
                });
                self.defer_error(cause, false);
                return;
            }
        };
        let payload_len = (ulpdu_len - repr.header_len().min(ulpdu_len)) as u64;
        self.rx_seg = Some(RxSeg {
            repr,
            echo,
            payload_len,
            target: Target::Discard,
            placed: 0,
        });
        // The P2P responder's RTR.
        if let Some(expect) = self.awaiting_rtr {
            self.awaiting_rtr = None;
            self.state = RcState::Rts;
            let is_rtr = match (expect, repr.opcode, repr.ddp) {
                (Some(RtrKind::Write), Opcode::RdmaWrite, _) => payload_len == 0,
                (Some(RtrKind::Send), Opcode::Send, _) => payload_len == 0,
                (Some(RtrKind::Read), Opcode::ReadRequest, _) => {
                    matches!(repr.body, RdmapBody::ReadRequest(r) if r.size == 0)
                }
                _ => false,
            };
            if is_rtr {
                match repr.opcode {
                    Opcode::ReadRequest => {
                        // Answered like any zero-length Read below.
                    }
                    Opcode::Send => {
                        self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
                        return;
                    }
                    _ => return,
                }
            } else if expect.is_some() {
                self.defer_error(TerminateCause::MpaNoMatchingRtr, false);
                return;
            }
        }
        let untagged = match repr.ddp {
            DdpHeader::Untagged {
                qn,
                msn,
                mo,
                rsvd_ulp,
            } => Some((qn, msn, mo, rsvd_ulp)),
            DdpHeader::Tagged { .. } => None,
        };
        let ext = self.cfg.softrdma_ext;
        match repr.opcode {
            Opcode::RdmaWrite | Opcode::ReadResponse => {
                let DdpHeader::Tagged { stag, to, .. } = repr.ddp else {
                    return self.defer_error(TerminateCause::RdmapUnexpectedOpcode, false);
                };
                // A continuation must follow on from the previous segment.
                if let Some((s, next)) = self.rx_tagged {
                    if s != stag || next != to {
                        return self.defer_error(TerminateCause::DdpTaggedBaseBounds, false);
                    }
                }
                if repr.opcode == Opcode::RdmaWrite {
                    if !self.rx_write_open {
                        self.rx_write_open = true;
                        self.rx_write_len = 0;
                    }
                    if payload_len > 0 {
                        if let Err(e) = mem.check_remote_write(stag, to, payload_len) {
                            return self.defer_error(e.terminate_cause(true), false);
                        }
                        self.set_target(Target::Write { stag, to });
                    }
                } else {
                    let Some(OrdEntry {
                        kind:
                            OrdKind::Read {
                                sink_stag,
                                sink_to,
                                size,
                                received,
                            },
                        ..
                    }) = self.ord.front().copied()
                    else {
                        return self.defer_error(TerminateCause::RdmapUnexpectedOpcode, false);
                    };
                    if stag != sink_stag || to != sink_to.wrapping_add(received) {
                        return self.defer_error(TerminateCause::DdpTaggedStagNotAssociated, false);
                    }
                    if received + payload_len > u64::from(size) {
                        return self.defer_error(TerminateCause::DdpTaggedBaseBounds, false);
                    }
                    self.set_target(Target::ReadResp { offset: received });
                }
                self.rx_tagged = if repr.last {
                    None
                } else {
                    Some((stag, to.wrapping_add(payload_len)))
                };
            }
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate => {
                let (qn, msn, mo, _) = untagged.expect("untagged opcode");
                if qn != 0 {
                    return self.defer_error(TerminateCause::DdpUntaggedInvalidQn, false);
                }
                if mo == 0 && self.rx_recv.is_none() {
                    if msn != self.rx_msn[0] {
                        return self.defer_error(TerminateCause::DdpUntaggedMsnRange, false);
                    }
                    let (wr, fired) = match srq {
                        Some(q) => q.take(),
                        None => self.rq.take(),
                    };
                    if fired {
                        self.events.push_back(RcEvent::RecvLimitReached);
                    }
                    let Some(wr) = wr else {
                        return self.defer_error(TerminateCause::DdpUntaggedNoBuffer, false);
                    };
                    self.rx_recv = Some(RxRecv {
                        wr,
                        msn,
                        received: 0,
                        opcode: repr.opcode,
                    });
                }
                // By reference: a receive is some 170 octets.
                let Some(r) = &self.rx_recv else {
                    return self.defer_error(TerminateCause::DdpUntaggedInvalidMo, false);
                };
                let (r_msn, received, room) = (r.msn, r.received, r.wr.sgl.total_len());
                if msn != r_msn {
                    return self.defer_error(TerminateCause::DdpUntaggedMsnRange, false);
                }
                if u64::from(mo) != received {
                    return self.defer_error(TerminateCause::DdpUntaggedInvalidMo, false);
                }
                if received + payload_len > room {
                    if let Some(r) = self.rx_recv.take() {
                        self.completions.push_back((
                            CqKind::Recv,
                            WorkCompletion::new(r.wr.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, 0),
                        ));
                    }
                    return self.defer_error(TerminateCause::DdpUntaggedTooLong, false);
                }
                self.set_target(Target::Recv { offset: received });
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe if ext => {
                let (qn, msn, mo, _) = untagged.expect("untagged opcode");
                if qn != 0 || mo != 0 || payload_len != 0 {
                    return self.defer_error(TerminateCause::DdpUntaggedInvalidQn, false);
                }
                if msn != self.rx_msn[0] || self.rx_recv.is_some() {
                    self.defer_error(TerminateCause::DdpUntaggedMsnRange, false)
                }
            }
            Opcode::ReadRequest => {
                let (qn, msn, _, _) = untagged.expect("untagged opcode");
                let RdmapBody::ReadRequest(req) = repr.body else {
                    return self.defer_error(TerminateCause::RdmapCatastrophicStream, false);
                };
                if qn != 1 {
                    return self.defer_error(TerminateCause::DdpUntaggedInvalidQn, false);
                }
                if msn != self.rx_msn[1] {
                    return self.defer_error(TerminateCause::DdpUntaggedMsnRange, false);
                }
                if payload_len != 0 {
                    return self.defer_error(TerminateCause::RdmapCatastrophicStream, false);
                }
                if self.ird.len() >= usize::from(self.cfg.ird) {
                    return self.defer_error(TerminateCause::RdmapCatastrophicStream, true);
                }
                if req.size > 0 {
                    if let Err(e) = mem.remote_read(req.src_stag, req.src_to, u64::from(req.size)) {
                        self.defer_error(e.terminate_cause(false), true)
                    }
                }
            }
            Opcode::AtomicRequest if ext => {
                let (qn, msn, _, _) = untagged.expect("untagged opcode");
                if qn != 1 {
                    return self.defer_error(TerminateCause::DdpUntaggedInvalidQn, false);
                }
                if msn != self.rx_msn[1] || payload_len != 0 {
                    return self.defer_error(TerminateCause::DdpUntaggedMsnRange, false);
                }
                if self.ird.len() >= usize::from(self.cfg.ird) {
                    self.defer_error(TerminateCause::RdmapCatastrophicStream, false)
                }
            }
            Opcode::AtomicResponse if ext => {
                let (qn, msn, _, _) = untagged.expect("untagged opcode");
                if qn != 3 || msn != self.rx_msn[3] || payload_len != 0 {
                    return self.defer_error(TerminateCause::DdpUntaggedMsnRange, false);
                }
                let RdmapBody::AtomicResponse(resp) = repr.body else {
                    return self.defer_error(TerminateCause::RdmapCatastrophicStream, false);
                };
                match self.ord.front() {
                    Some(OrdEntry {
                        kind: OrdKind::Atomic { req_id },
                        ..
                    }) if *req_id == resp.req_id => {}
                    _ => self.defer_error(TerminateCause::RdmapUnexpectedOpcode, false),
                }
            }
            Opcode::Terminate => {}
            _ => self.defer_error(TerminateCause::RdmapUnexpectedOpcode, false),
        }
    }

    /// A header broke a rule: discard the segment's payload and send the
    /// Terminate once the FPDU's CRC has verified (a CRC failure takes
    /// precedence: the header itself may be what was corrupted).
    fn defer_error(&mut self, cause: TerminateCause, with_read_request: bool) {
        self.set_target(Target::Discard);
        self.rx_deferred = Some((cause, with_read_request));
    }

    fn set_target(&mut self, t: Target) {
        if let Some(seg) = &mut self.rx_seg {
            seg.target = t;
        }
    }

    fn rx_payload<M: Memory>(&mut self, chunk: &[u8], mem: &mut M) {
        // Only the placement state is copied out (the segment's header
        // representation is not needed here).
        let Some(seg) = &mut self.rx_seg else { return };
        let (at, target) = (seg.placed, seg.target);
        seg.placed += chunk.len() as u64;
        let res: Result<(), MemError> = match target {
            Target::Discard => Ok(()),
            Target::Write { stag, to } => mem.remote_write(stag, to.wrapping_add(at), chunk),
            Target::ReadResp { offset } => {
                let Some(OrdEntry { seq: Some(seq), .. }) = self.ord.front().copied() else {
                    return;
                };
                let Some(Payload::Sgl(sgl)) = self.sq_entry_mut(seq).map(|e| &e.wr.payload) else {
                    return;
                };
                scatter(mem, sgl, offset + at, chunk)
            }
            Target::Recv { offset } => {
                let Some(r) = &self.rx_recv else { return };
                scatter(mem, &r.wr.sgl, offset + at, chunk)
            }
        };
        if let Err(e) = res {
            match target {
                Target::Write { .. } => self.rx_error(e.terminate_cause(true), false),
                Target::ReadResp { .. } => {
                    self.set_target(Target::Discard);
                    self.fail(None, false, Some(WcStatus::LocProtErr));
                }
                _ => {
                    if let Some(r) = self.rx_recv.take() {
                        self.completions.push_back((
                            CqKind::Recv,
                            WorkCompletion::new(
                                r.wr.wr_id,
                                WcStatus::LocProtErr,
                                WcOpcode::Recv,
                                0,
                            ),
                        ));
                    }
                    self.rx_error(TerminateCause::DdpLocalCatastrophic, false);
                }
            }
        }
    }

    /// Direct placement (RFC 5041 §2's "placement from the transport"):
    /// where the rest of the payload of the FPDU being received goes, for a
    /// receiver that can move it from the socket straight into memory
    /// instead of handing it to [`RcQp::handle_bytes`]. Offered only on a
    /// connection without markers, and with CRC only when
    /// `RcConfig::crc_direct_min` lets FPDUs stream (otherwise every FPDU
    /// is verified before it is placed), mid-payload of an RDMA Write, Read
    /// Response or Send segment whose header passed every check. The caller
    /// must still check each piece against its memory (the region may have
    /// gone since the header was checked) and fall back to `handle_bytes`
    /// if one fails — which then reports the error as usual.
    #[inline]
    pub fn rx_direct(&self) -> Option<DirectRx> {
        // The common refusals first, inline at the caller: this is asked
        // on every receive poll.
        if (self.cfg.crc && self.cfg.crc_direct_min == 0) || self.rx_seg.is_none() {
            return None;
        }
        self.rx_direct_resolve()
    }

    fn rx_direct_resolve(&self) -> Option<DirectRx> {
        if self.state == RcState::Error || self.rx_deferred.is_some() {
            return None;
        }
        let (left, trailer) = self.deframer.direct_payload()?;
        let seg = self.rx_seg.as_ref()?;
        if left == 0 || seg.payload_len.checked_sub(seg.placed) != Some(left as u64) {
            return None;
        }
        let mut d = DirectRx {
            pieces: [DirectPiece::default(); MAX_SGE],
            npieces: 0,
            len: left,
            trailer,
            next_header: fpdu::LEN_FIELD + seg.repr.header_len(),
        };
        let at = seg.placed;
        let sgl = match seg.target {
            Target::Discard => return None,
            Target::Write { stag, to } => {
                d.pieces[0] = DirectPiece {
                    key: stag,
                    addr: to.wrapping_add(at),
                    len: left as u64,
                    remote: true,
                };
                d.npieces = 1;
                return Some(d);
            }
            Target::ReadResp { offset } => {
                let OrdEntry { seq: Some(seq), .. } = *self.ord.front()? else {
                    return None;
                };
                let e = self.sq.iter().find(|e| e.seq == seq)?;
                let Payload::Sgl(sgl) = e.wr.payload else {
                    return None;
                };
                (sgl, offset + at)
            }
            Target::Recv { offset } => (self.rx_recv?.wr.sgl, offset + at),
        };
        let (sgl, off) = sgl;
        let mut k = 0;
        let ok = sgl.for_range(off, left as u64, |sge, o, n| {
            d.pieces[k] = DirectPiece {
                key: sge.lkey,
                addr: sge.addr.wrapping_add(o),
                len: n,
                remote: false,
            };
            k += 1;
        });
        if !ok {
            return None;
        }
        d.npieces = k;
        Some(d)
    }

    /// Records that the first `n` octets described by [`RcQp::rx_direct`]
    /// were placed by the caller, as if they had arrived through
    /// [`RcQp::handle_bytes`]. With CRC, `placed` holds those octets as they
    /// now are in memory, in order (pieces of `n` octets in all), for the
    /// CRC to cover; without, it is not read (pass `&[]`). Refused
    /// (`false`, nothing changed) when `rx_direct` offers fewer than `n`
    /// octets, or, with CRC, `placed` does not hold `n`.
    pub fn rx_direct_placed(&mut self, n: usize, placed: &[&[u8]]) -> bool {
        if n == 0 {
            return true;
        }
        if self.rx_direct().is_none_or(|d| d.len < n) {
            return false;
        }
        let ok = if self.cfg.crc {
            placed.iter().map(|p| p.len()).sum::<usize>() == n
                && placed.iter().all(|p| self.deframer.placed_payload(p))
        } else {
            self.deframer.skip_payload(n)
        };
        if !ok {
            return false;
        }
        if let Some(seg) = &mut self.rx_seg {
            seg.placed += n as u64;
        }
        true
    }

    fn rx_end<M: Memory>(&mut self, mem: &mut M, srq: Option<&mut RecvQueue>) {
        let Some(seg) = self.rx_seg.take() else {
            return;
        };
        if self.state == RcState::Error {
            return;
        }
        let repr = seg.repr;
        match repr.opcode {
            Opcode::RdmaWrite => {
                self.rx_write_len += seg.payload_len;
                if repr.last {
                    self.rx_write_open = false;
                }
            }
            Opcode::ReadResponse => {
                let Some(front) = self.ord.front_mut() else {
                    return;
                };
                let OrdKind::Read { size, received, .. } = &mut front.kind else {
                    return;
                };
                *received += seg.payload_len;
                if repr.last {
                    let (size, received) = (*size, *received);
                    let seq = front.seq;
                    self.ord.pop_front();
                    if received != u64::from(size) {
                        return self.rx_error(TerminateCause::DdpTaggedBaseBounds, false);
                    }
                    if let Some(seq) = seq {
                        self.complete_seq(seq, WcStatus::Success, size);
                    }
                }
            }
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate => {
                let Some(r) = &mut self.rx_recv else { return };
                r.received += seg.payload_len;
                if !repr.last {
                    return;
                }
                let r = self.rx_recv.take().expect("receive in progress");
                self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
                let mut wc = WorkCompletion::new(
                    r.wr.wr_id,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    r.received as u32,
                );
                wc.solicited = matches!(r.opcode, Opcode::SendSe | Opcode::SendSeInvalidate);
                wc.imm = self.rx_pending_imm.take();
                if matches!(r.opcode, Opcode::SendInvalidate | Opcode::SendSeInvalidate) {
                    let DdpHeader::Untagged { rsvd_ulp: stag, .. } = repr.ddp else {
                        return;
                    };
                    if let Err(e) = mem.invalidate(stag, true) {
                        self.completions.push_back((
                            CqKind::Recv,
                            WorkCompletion::new(
                                r.wr.wr_id,
                                WcStatus::RemInvReqErr,
                                WcOpcode::Recv,
                                0,
                            ),
                        ));
                        let mut seg = seg;
                        seg.target = Target::Discard;
                        self.rx_seg = Some(seg);
                        self.rx_error(e.terminate_cause(false), false);
                        self.rx_seg = None;
                        return;
                    }
                    wc.invalidated = Some(stag);
                }
                self.completions.push_back((CqKind::Recv, wc));
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                let RdmapBody::Immediate(v) = repr.body else {
                    return;
                };
                self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
                let imm = v as u32;
                if v & (1 << 32) != 0 {
                    self.rx_pending_imm = Some(imm);
                    return;
                }
                // Write with immediate: consumes a receive.
                let (wr, fired) = match srq {
                    Some(q) => q.take(),
                    None => self.rq.take(),
                };
                if fired {
                    self.events.push_back(RcEvent::RecvLimitReached);
                }
                let Some(wr) = wr else {
                    self.rx_seg = Some(seg);
                    self.rx_error(TerminateCause::DdpUntaggedNoBuffer, false);
                    self.rx_seg = None;
                    return;
                };
                let mut wc = WorkCompletion::new(
                    wr.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    self.rx_write_len.min(u64::from(u32::MAX)) as u32,
                );
                wc.imm = Some(imm);
                wc.solicited = repr.opcode == Opcode::ImmediateDataSe;
                self.completions.push_back((CqKind::Recv, wc));
            }
            Opcode::ReadRequest => {
                let RdmapBody::ReadRequest(req) = repr.body else {
                    return;
                };
                self.rx_msn[1] = self.rx_msn[1].wrapping_add(1);
                self.ird.push_back(IrdEntry::Read { req, sent: 0 });
            }
            Opcode::AtomicRequest => {
                let RdmapBody::AtomicRequest(req) = repr.body else {
                    return;
                };
                self.rx_msn[1] = self.rx_msn[1].wrapping_add(1);
                let op = match req.op {
                    WireAtomicOp::FetchAdd => AtomicOp::FetchAdd(req.add_swap),
                    WireAtomicOp::CompareSwap => AtomicOp::CompareSwap {
                        compare: req.compare,
                        swap: req.add_swap,
                    },
                    _ => {
                        self.rx_seg = Some(seg);
                        self.rx_error(TerminateCause::RdmapOperationUnspecified, false);
                        self.rx_seg = None;
                        return;
                    }
                };
                match mem.remote_atomic(req.stag, req.to, op) {
                    Ok(orig) => self.ird.push_back(IrdEntry::Atomic {
                        req_id: req.req_id,
                        orig,
                    }),
                    Err(e) => {
                        self.rx_seg = Some(seg);
                        self.rx_error(e.terminate_cause(false), false);
                        self.rx_seg = None;
                    }
                }
            }
            Opcode::AtomicResponse => {
                let RdmapBody::AtomicResponse(resp) = repr.body else {
                    return;
                };
                self.rx_msn[3] = self.rx_msn[3].wrapping_add(1);
                let Some(front) = self.ord.pop_front() else {
                    return;
                };
                let Some(seq) = front.seq else { return };
                let Some(Payload::Sgl(sgl)) = self.sq_entry_mut(seq).map(|e| e.wr.payload) else {
                    return;
                };
                match scatter(mem, &sgl, 0, &resp.orig_value.to_ne_bytes()) {
                    Ok(()) => self.complete_seq(seq, WcStatus::Success, 8),
                    Err(_) => self.fail(None, false, Some(WcStatus::LocProtErr)),
                }
            }
            Opcode::Terminate => {
                let RdmapBody::Terminate(t) = repr.body else {
                    return;
                };
                let status = match t.cause.layer() {
                    rdmap::Layer::Rdmap if t.cause.etype() == 1 => WcStatus::RemAccessErr,
                    rdmap::Layer::Ddp if t.cause.etype() == 1 => WcStatus::RemAccessErr,
                    rdmap::Layer::Ddp if t.cause == TerminateCause::DdpUntaggedNoBuffer => {
                        WcStatus::RnrRetryExcErr
                    }
                    rdmap::Layer::Ddp if t.cause.etype() == 2 => WcStatus::RemInvReqErr,
                    _ => WcStatus::RemOpErr,
                };
                self.fail(Some(t), true, Some(status));
                if !self.tx_closed && self.pending.is_empty() {
                    self.tx_closed = true;
                    self.events.push_back(RcEvent::TxClosed);
                }
            }
            _ => {}
        }
    }
}

enum RxEv {
    Header([u8; fpdu::MAX_HEADER], usize),
    Payload(usize),
    End,
}

/// Frames one FPDU into `p` (a reset ring slot): header from `repr`,
/// payload from `body`, read in place (spans) unless inline or with
/// markers. `Err((error, remote source))` if the payload cannot be read.
#[allow(clippy::too_many_arguments)]
fn build_into<M: Memory>(
    p: &mut PendingFpdu,
    cfg: &RcConfig,
    framer: &mut Framer,
    marker_buf: &mut Vec<u8>,
    mem: &M,
    repr: &SegmentRepr,
    body: &Body,
    done: Done,
) -> Result<(), (MemError, bool)> {
    p.done = done;
    let hlen = repr.header_len();
    repr.emit(&mut p.hdr[fpdu::LEN_FIELD..fpdu::LEN_FIELD + hlen]);
    p.hdr_len = fpdu::LEN_FIELD + hlen;
    // Resolve the payload into spans (or copy inline data).
    let mut payload_len = 0u64;
    let mut bad: Option<MemError> = None;
    let mut remote_bad = false;
    match *body {
        Body::None => {}
        // Resolved by the caller.
        Body::Sq { .. } => {}
        Body::Local {
            payload: Payload::Inline(d),
            offset,
            len,
        } => {
            let s = &d.as_slice()[offset as usize..(offset + len) as usize];
            p.hdr[p.hdr_len..p.hdr_len + s.len()].copy_from_slice(s);
            p.hdr_len += s.len();
            payload_len = len;
        }
        Body::Local {
            payload: Payload::Sgl(sgl),
            offset,
            len,
        } => {
            let spans = &mut p.spans;
            let mut k = 0;
            sgl.for_range(offset, len, |sge, off, n| {
                if bad.is_none() {
                    if let Err(e) = mem.local_read(sge.lkey, sge.addr.wrapping_add(off), n) {
                        bad = Some(e);
                    }
                }
                spans[k] = Span {
                    key: sge.lkey,
                    addr: sge.addr.wrapping_add(off),
                    len: n,
                    remote: false,
                };
                k += 1;
            });
            p.nspans = k;
            payload_len = len;
        }
        Body::Remote { stag, to, len } => {
            if len > 0 {
                if let Err(e) = mem.remote_read(stag, to, len) {
                    bad = Some(e);
                    remote_bad = true;
                }
                p.spans[0] = Span {
                    key: stag,
                    addr: to,
                    len,
                    remote: true,
                };
                p.nspans = 1;
            }
            payload_len = len;
        }
    }
    if let Some(e) = bad {
        return Err((e, remote_bad));
    }
    let ulpdu = hlen as u64 + payload_len;
    // The slot counts the header plus all payload, inline or gathered.
    fpdu::set_ulpdu_len(&mut p.hdr[..fpdu::LEN_FIELD + hlen], payload_len as usize)
        .expect("ULPDU within max_ulpdu");
    if cfg.markers_tx {
        // Markers: copy the FPDU through the framer into the buffer.
        let start = marker_buf.len();
        let mut pieces: [&[u8]; MAX_SGE + 1] = [&[]; MAX_SGE + 1];
        pieces[0] = &p.hdr[fpdu::LEN_FIELD + hlen..p.hdr_len];
        for (i, s) in p.spans[..p.nspans].iter().enumerate() {
            pieces[i + 1] = span_slice(mem, s);
        }
        let n = framer
            .frame_to_vec(
                &p.hdr[..fpdu::LEN_FIELD + hlen],
                &pieces[..p.nspans + 1],
                marker_buf,
            )
            .expect("valid FPDU");
        p.owned = Some(start);
        p.total = n;
        return Ok(());
    }
    // No markers: CRC over length, header, payload and pad; the payload
    // is read in place, never copied — except a small one, which is
    // gathered behind the header together with the pad: then the FPDU is
    // one CRC pass and two io-vectors (header+payload+pad, CRC), which
    // costs less than the span bookkeeping it saves.
    let pad = fpdu::pad_len(ulpdu as usize);
    if p.nspans > 0
        && payload_len <= SMALL_GATHER as u64
        && p.hdr_len + payload_len as usize + pad <= HDR_CAP
    {
        for i in 0..p.nspans {
            let d = span_slice(mem, &p.spans[i]);
            p.hdr[p.hdr_len..p.hdr_len + d.len()].copy_from_slice(d);
            p.hdr_len += d.len();
        }
        p.nspans = 0;
    }
    let mut crc = Crc32c::new();
    if p.nspans == 0 && p.hdr_len + pad <= HDR_CAP {
        p.hdr[p.hdr_len..p.hdr_len + pad].fill(0);
        p.hdr_len += pad;
        if cfg.crc {
            crc.update(&p.hdr[..p.hdr_len]);
        }
        p.trailer_len = 0;
    } else {
        if cfg.crc {
            crc.update(&p.hdr[..p.hdr_len]);
            for s in &p.spans[..p.nspans] {
                crc.update(span_slice(mem, s));
            }
            crc.update(&[0u8; 3][..pad]);
        }
        p.trailer[..pad].fill(0);
        p.trailer_len = pad;
    }
    let c = if cfg.crc { crc.wire_bytes() } else { [0; 4] };
    let at = p.trailer_len;
    p.trailer[at..at + 4].copy_from_slice(&c);
    p.trailer_len = at + fpdu::CRC_LEN;
    p.total = fpdu::fpdu_len(ulpdu as usize);
    // Keep the framer's stream position in step (markers are off, so
    // only the count matters to it).
    let _ = framer.stream_position();
    Ok(())
}

/// Payload source of an FPDU being built.
enum Body<'a> {
    None,
    /// Octets of the send queue entry at index `idx` (resolved by
    /// `RcQp::build`, so the entry is not copied).
    Sq {
        idx: usize,
        offset: u64,
        len: u64,
    },
    /// As `Sq`, resolved.
    Local {
        payload: &'a Payload,
        offset: u64,
        len: u64,
    },
    Remote {
        stag: u32,
        to: u64,
        len: u64,
    },
}

fn tagged_placeholder() -> SegmentRepr {
    SegmentRepr::tagged(Opcode::Unknown(0xF), 0, 0, true)
}

/// The memory a span refers to (validated when the FPDU was built; the
/// region cannot change in between because the caller holds `mem`).
fn span_slice<'m, M: Memory>(mem: &'m M, s: &Span) -> &'m [u8] {
    let r = if s.remote {
        mem.remote_read(s.key, s.addr, s.len)
    } else {
        mem.local_read(s.key, s.addr, s.len)
    };
    r.unwrap_or(&[])
}

/// Writes the unwritten part of as many of `pending` as fit in `N`
/// io-vectors with one vectored write; returns (octets written, octets
/// offered).
fn write_pending<M: Memory, W: io::Write, const N: usize>(
    pending: &TxRing,
    marker_buf: &[u8],
    mem: &M,
    out: &mut W,
) -> io::Result<(usize, usize)> {
    let mut iov: [IoSlice<'_>; N] = [IoSlice::new(&[]); N];
    let mut k = 0;
    let mut offered = 0;
    for p in pending.iter() {
        if k + p.nspans + 2 > N {
            break;
        }
        offered += push_iov(p, marker_buf, mem, &mut iov, &mut k);
    }
    out.write_vectored(&iov[..k]).map(|n| (n, offered))
}

/// Appends the unwritten part of `p` to `iov`; returns the octets added.
fn push_iov<'a, M: Memory>(
    p: &'a PendingFpdu,
    marker_buf: &'a [u8],
    mem: &'a M,
    iov: &mut [IoSlice<'a>],
    k: &mut usize,
) -> usize {
    let mut skip = p.written;
    let mut added = 0;
    let mut push = |s: &'a [u8], iov: &mut [IoSlice<'a>], k: &mut usize| {
        if skip >= s.len() {
            skip -= s.len();
            return;
        }
        let s = &s[skip..];
        skip = 0;
        if !s.is_empty() {
            iov[*k] = IoSlice::new(s);
            *k += 1;
            added += s.len();
        }
    };
    if let Some(start) = p.owned {
        push(&marker_buf[start..start + p.total], iov, k);
        return added;
    }
    push(&p.hdr[..p.hdr_len], iov, k);
    for s in &p.spans[..p.nspans] {
        push(span_slice(mem, s), iov, k);
    }
    push(&p.trailer[..p.trailer_len], iov, k);
    added
}

/// Flags of a default signaled send.
pub const SIGNALED: SendFlags = SendFlags {
    signaled: true,
    solicited: false,
    fence: false,
};
