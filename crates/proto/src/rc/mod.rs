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
//!   iWARP has no receiver-not-ready retry. With `RcConfig::rnr_wait`
//!   (InfiniBand-style QPs) it waits instead, as below.
//!
//! Receiver not ready (`RcConfig::rnr_wait`): InfiniBand answers a Send
//! that finds no receive with an RNR NAK and the sender retries; over one
//! TCP stream the same back-pressure comes from not reading. At each FPDU
//! boundary (in RTS, between messages, without markers) the receive path
//! peeks at the next FPDU's header: a Send starting a message (QN 0, MO 0,
//! the expected MSN), or the Immediate Data message of a Write with
//! immediate, when no receive is posted, is not consumed — no receive
//! taken, MSN not advanced, nothing placed. The receive path pauses
//! ([`RcQp::rx_paused`]) holding every octet from that FPDU's first on;
//! the driver stops reading the transport, and after posting receives
//! calls [`RcQp::rx_resume`], which hands the held octets to the receive
//! path again. With CRC the check is made when the FPDU is whole (before
//! it is verified and acted on); streamed FPDUs are checked when their
//! header is complete (a shorter start is held until it is). Messages
//! before the pause point (Read Requests included, which are answered)
//! were processed; those after it wait, in order. Transmit is unaffected.
//!
//! Immediate data between softrdma peers: the verbs immediate (32 bits)
//! travels in an RFC 7306 Immediate Data message (8 octets): the low 32 bits
//! carry the value, bit 32 says whether it belongs to the Send that follows
//! (Send with immediate: the pair consumes one receive) or stands alone after
//! an RDMA Write (Write with immediate: consumes one receive and completes as
//! `RecvRdmaWithImm` with the Write's length).
//!
//! # Layout
//!
//! This file holds the configuration, the queue pair's state and its API
//! (posting, polling, disconnect). The rest is one file per step:
//! `recv_queue` (the RQ or SRQ), `tx_build` (choosing and framing the
//! next FPDU), `tx_ring` (the framed FPDUs not yet written), `tx`
//! (writing them), `rx` (deframing, header rules, placement, message
//! ends), `rx_stash` (partial FPDUs kept for their CRC), `rx_wait`
//! (receiver not ready: the pause before a Send without receive), `rx_direct`
//! (placement straight from the transport), `fail` (Terminates and the
//! error state); [`mpa`] negotiates the connection before any of this.

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

pub mod mpa;

mod fail;
mod recv_queue;
mod rx;
mod rx_direct;
mod rx_stash;
mod rx_wait;
mod tx;
mod tx_build;
mod tx_ring;

pub use crate::wr::{CqKind, PostError};
pub use recv_queue::RecvQueue;
pub use rx_direct::{DirectPiece, DirectRx};
use tx_build::{span_slice, tagged_placeholder, Body};
use tx_ring::{
    Built, PendingFpdu, TxRing, HDR_CAP, IOV_CAP, IOV_MID, IOV_ONE, SMALL_GATHER, TX_BATCH,
    TX_BATCH_BYTES,
};

/// The stage of a Write's send-queue entry that frames its placement
/// probe, a zero-length Read Request (`RcConfig::write_placed`); stage 1
/// is a Write's Immediate Data message.
const WRITE_PROBE_STAGE: u8 = 2;

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
    /// A signaled RDMA Write completes once the peer has placed it,
    /// InfiniBand's meaning of a Write completion, instead of once its
    /// last FPDU is written to the transport (iWARP's: the local buffer is
    /// free). A zero-length Read Request follows such a Write (it needs an
    /// ORD slot); the peer answers it only after placing what came before
    /// (RFC 5040 ordering), and its response completes the Write. Any
    /// RFC 5040 responder serves it: a zero-length Read touches no memory.
    pub write_placed: bool,
    /// Receiver not ready waits (InfiniBand's RNR NAK and retry, as the
    /// transport's back-pressure): a Send, or the Immediate Data message of
    /// a Write with immediate, that finds no posted receive is not
    /// consumed and the receive path pauses before it
    /// ([`RcQp::rx_paused`]) until a receive is posted
    /// ([`RcQp::rx_resume`]), instead of terminating the stream (iWARP's
    /// DDP "no buffer"). Not with markers on receive (siw only).
    pub rnr_wait: bool,
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
            write_placed: false,
            rnr_wait: false,
        }
    }
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
    /// `RcConfig::rnr_wait`: octets not yet handed to the receive path,
    /// from an FPDU boundary on (the Send waiting for a receive and what
    /// followed it, or an FPDU start too short to tell).
    rx_held: Vec<u8>,
    /// The FPDU at the front of `rx_held` waits for a receive.
    rx_paused: bool,
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
            rx_held: Vec::new(),
            rx_paused: false,
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
                // A Write's Immediate Data message and its placement
                // probe are messages of their own, after the Write's.
                let write_done = matches!(e.wr.op, SendOp::Write { .. })
                    && (stage == 1 || stage == WRITE_PROBE_STAGE);
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
        self.sq.get(self.sq_cursor).is_some_and(|e| match e.state {
            SqState::Sending { stage, .. } => !self.blocked(&e.wr, stage),
            _ => false,
        })
    }

    /// Whether the SQ head to frame must wait (ORD full, fence).
    fn blocked(&self, wr: &SendWr, stage: u8) -> bool {
        let needs_ord = match wr.op {
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => true,
            // The placement probe of a Write (`RcConfig::write_placed`).
            SendOp::Write { .. } => stage == WRITE_PROBE_STAGE,
            _ => false,
        };
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
}

/// Flags of a default signaled send.
pub const SIGNALED: SendFlags = SendFlags {
    signaled: true,
    solicited: false,
    fence: false,
};
