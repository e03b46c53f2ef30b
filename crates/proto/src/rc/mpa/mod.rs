//! Sans-IO MPA connection set-up: the exchange of the MPA Request and MPA
//! Reply (RFC 5044 §7.1) with the RFC 6581 enhanced connection set-up (the
//! IRD/ORD word and peer-to-peer "ready to receive" mode), as the initiator
//! ([`Initiator`]) and as the responder ([`Responder`]).
//!
//! The frames themselves are parsed and built by [`softrdma_wire::mpa`]; this
//! module decides what to send and what the two ends agreed on. It never
//! touches a socket or a clock (design.md §2): the caller moves the bytes and
//! passes the time in.
//!
//! # Driving a negotiation
//!
//! Both roles have the same I/O surface:
//!
//! * [`Initiator::handle_bytes`] / [`Responder::handle_bytes`] take octets
//!   from the TCP stream, split at any octet. They consume octets **up to the
//!   end of the peer's frame and not one octet further**, and return how many
//!   they consumed. Octets after the frame are FPDUs of the data phase and
//!   stay with the caller. Once the peer's frame is complete (and in every
//!   later state) they return `Ok(0)`; after a failure they return the
//!   failure again.
//! * `poll_transmit()` returns the octets still to be written and
//!   `transmitted(n)` says that `n` of them were written, so a partial write
//!   just leaves the rest pending.
//! * `poll_timeout()` gives the deadline of the MPA timer and
//!   `handle_timeout(now)` fires it.
//! * `state()` tells where the negotiation is; `poll_outcome()` hands out the
//!   [`Outcome`] once, **and only after every octet from `poll_transmit` has
//!   been written** (so "drain the transmit, then act on the outcome" is
//!   always correct: the Reply precedes the first FPDU, a rejecting Reply is
//!   on its way before the caller closes).
//!
//! The responder stops in [`State::RequestReceived`] after a valid Request:
//! the ULP looks at [`Responder::request`] and calls [`Responder::accept`] or
//! [`Responder::reject`].
//!
//! # Negotiation rules
//!
//! | item | rule |
//! |---|---|
//! | Rev | The initiator sends [`MpaConfig::rev`] (1 or 2; Rev 2 always with the enhanced flag and the IRD/ORD word). The responder answers `min(Request Rev, its own rev)`, so Rev 0 (pre-RFC, accepted like siw does) is answered with Rev 0, and a Rev-2 + enhanced Request is answered Rev 2 + enhanced + IRD/ORD word when the responder is configured for Rev 2 (siw fails the connect otherwise). A Rev-2 Request without the enhanced flag gets a Rev-2 Reply without it. The initiator accepts a Reply Rev at or below its own. |
//! | CRC | Used in both directions if either frame has C=1. The responder sets C in its Reply if the Request had it or it wants CRC itself. |
//! | Markers | Per direction: M=1 means "I want to receive markers". `markers_rx` is our own M, `markers_tx` the peer's. We support markers in both directions, so a Request or Reply with M=1 is accepted (siw refuses M=1; we do not). |
//! | IRD/ORD | Rev 2 + enhanced only; "relaxed", like siw (see below). Without the word the outcome reports the locally configured values. |
//! | P2P | Rev 2 + enhanced only. The initiator offers every RTR kind in [`MpaConfig::rtr`] (the Read RTR only if its ORD is at least 1). A responder configured with `p2p` picks one: zero-length Write, else Read, else Send; if none matches it rejects (Reply with R=1) and fails with [`MpaError::NoMatchingRtr`]. A responder configured without `p2p` declines (Reply P2P=0). |
//! | Start rule | [`Negotiated::rtr`]: with P2P the initiator sends the chosen RTR message first and the responder sends nothing until it has arrived; without P2P RFC 5044's "initiator sends first" applies ([`Rtr::InitiatorSendsFirst`]). |
//!
//! ## IRD/ORD ("relaxed" negotiation)
//!
//! With `Ii`/`Oi` the initiator's word, `Ir`/`Or` the responder ULP's wishes
//! (the arguments of [`Responder::accept`]) and `Mr` the responder's
//! [`MpaConfig::max_ird`]:
//!
//! * responder ORD = `min(Or, Ii)`: it never issues more Reads than the
//!   initiator can take;
//! * responder IRD = `min(max(Ir, Oi), max(Ir, Mr))`: raised toward the
//!   initiator's ORD, never above `max_ird` (and never below what the ULP
//!   asked), and at least 1 when the Read RTR was chosen (the RTR consumes
//!   one inbound Read slot);
//! * the Reply carries those two values. The initiator then uses
//!   ORD = `min(Oi, Reply IRD)` and IRD = `Reply ORD` (the exact number of
//!   Reads the responder may have outstanding). If the Reply's ORD exceeds
//!   `max(Ii, Mi)` the initiator fails with [`MpaError::InsufficientIrd`]
//!   (LLP Terminate 0x06), as siw does.
//!
//! So `initiator.ord <= responder.ird` and `responder.ord <= initiator.ird`
//! always hold after a successful negotiation. This matches siw as responder
//! (it takes the Request's ORD as its IRD and the Request's IRD as its ORD)
//! except that we do not raise our ORD above what the ULP asked for.
//!
//! # Failures
//!
//! | what arrives | responder | initiator |
//! |---|---|---|
//! | wrong key (incl. the other role's key) | fail [`MpaError::BadKey`], no Reply | fail `BadKey` |
//! | Rev > 2 | fail [`MpaError::UnsupportedRevision`], no Reply (RFC 5044: close and report) | same |
//! | PD_Length > 512 | fail [`MpaError::PrivateDataTooLong`] after the 20-octet header, no Reply | same, already above [`MpaConfig::max_private_data`] |
//! | PD_Length > `max_private_data` (≤ 512) | Reply R=1, fail `PrivateDataTooLong` | fail after the header |
//! | R=1 in a Request; enhanced flag (Rev 2) with PD_Length < 4 | Reply R=1, fail [`MpaError::InvalidFrame`] (siw rejects the latter the same way) | – |
//! | P2P with no RTR kind in common | Reply R=1, fail [`MpaError::NoMatchingRtr`] | – |
//! | R=1 in the Reply | – | [`Outcome::Rejected`] with the Reply's private data |
//! | Reply Rev above the Request's, P2P accepted but not requested, enhanced with PD_Length < 4 | – | fail `InvalidFrame` |
//! | Reply picks an RTR kind we did not offer (or none) | – | fail `NoMatchingRtr` |
//! | Reply ORD above what we can serve | – | fail [`MpaError::InsufficientIrd`] |
//! | nothing within [`MpaConfig::timeout`] | fail [`MpaError::Timeout`] | same |
//!
//! [`MpaError::terminate_cause`] maps each failure to its LLP Terminate code
//! (layer 2, etype 0): 0x04 invalid Request/Reply, 0x06 insufficient IRD,
//! 0x07 no matching RTR. A Terminate is an FPDU, so it can only be sent once
//! the framing is known: [`Initiator::terminate_framing`] gives the framing
//! when the initiator failed *after* an accepting Reply (no matching RTR,
//! insufficient IRD), which is when siw sends one. Everywhere else there is
//! no FPDU framing yet (or R=1 announced that no FPDU follows) and the caller
//! simply closes.
//!
//! Octets the peer sends where the protocol forbids them (after its Request
//! but before our Reply; right behind the Reply) are not consumed and not
//! judged here: siw fails the connection for the former, and the caller sees
//! them as data it did not expect.
//!
//! # Discovering another softrdma endpoint
//!
//! RFC 7306 atomics and immediate data must only be used between two
//! softrdma endpoints (siw has neither). MPA has no wire-legal place that a
//! plain iWARP peer ignores:
//!
//! * the reserved bits of octet 16 are taken (siw's private GSO bit is 0x08)
//!   and Wireshark flags any reserved bit as an RFC 5044 violation;
//! * every bit of the IRD/ORD word is assigned, and Rev 3 is rejected by siw;
//! * anything after the frame is a protocol violation for siw (it looks past
//!   the private data and fails with EPROTO);
//! * a prefix in the private data would shift the ULP's own private data,
//!   which rdma_cm ULPs parse from offset 0.
//!
//! The least harmful choice is an 8-octet **trailer at the end of the private
//! data** (after the ULP's private data, which itself follows the IRD/ORD
//! word):
//!
//! ```text
//!   "sRDMA" (73 52 44 4d 41) | version (1 octet, 1) | flags (2 octets, big-endian)
//!   flags: 0x0001 RFC 7306 atomics, 0x0002 RFC 7306 immediate data, others reserved
//! ```
//!
//! * The initiator appends it when [`MpaConfig::softrdma_ext`] is on and it
//!   fits [`MpaConfig::max_private_data`] (else it is silently left out and
//!   the connection is a plain iWARP one).
//! * A responder with `softrdma_ext` on strips a trailer it finds from the
//!   private data it gives its ULP and answers with its own trailer; it
//!   never sends one to an initiator that did not send one, so siw
//!   initiators never see it.
//! * The initiator strips the Reply's trailer; [`Negotiated::peer_is_softrdma`]
//!   is true on both sides exactly when both trailers were exchanged, and
//!   [`Negotiated::ext_flags`] is the intersection of both flag sets.
//! * A responder with `softrdma_ext` off behaves like any other iWARP
//!   responder: it leaves the private data alone, so its ULP sees the
//!   trailer.
//!
//! **The cost**: a softrdma initiator talking to a non-softrdma responder
//! (siw, hardware) shows that responder's ULP 8 more octets of private data
//! than our ULP gave, and the trailer uses 8 of the 256 octets siw accepts.
//! ULPs that read a structure from the start of the private data (rping,
//! NVMe-oF, iSER) are unaffected; one that insists on an exact length is
//! not, and for it `softrdma_ext` must be turned off on the initiator. A ULP
//! private data that by chance ends in the 8 trailer octets would be
//! mistaken for a trailer by a softrdma responder (the magic and version make
//! this a 2^-48 event for random data).
//!
//! # siw specifics
//!
//! * Private data (IRD/ORD word and trailer included) is limited to
//!   [`MpaConfig::max_private_data`], 256 by default, the most siw accepts;
//!   it can be raised to the RFC's 512 for other peers.
//! * The initiator sends nothing after its Request until the Reply arrived
//!   (this module only ever queues the Request).
//! * siw as responder sends its Reply before it hands the socket to the QP
//!   (wire.md §9 item 11), so an FPDU sent the instant the Reply arrives can
//!   be lost. The initiator's outcome therefore carries
//!   [`Negotiated::first_fpdu_not_before`] = Reply time +
//!   [`MpaConfig::rtr_holdoff`] (the RTR included), except toward a softrdma
//!   responder, which takes the data phase over without a gap. Whether the
//!   hold-off is long enough is proved by the interop tests against siw,
//!   not here.
//!
//! # Layout
//!
//! This file holds the constants, configuration, outcome and error
//! types. Beside it: `frame` (transmit buffer, frame reader and
//! builders), `initiator` ([`Initiator`]) and `responder`
//! ([`Responder`]).

use std::fmt;
use std::time::{Duration, Instant};

use softrdma_wire::mpa::{
    frame_len, FrameKind, IrdOrd, MpaFrame, MpaRepr, HEADER_LEN, IRD_ORD_LEN, IRD_ORD_MAX,
    MAX_PRIVATE_DATA, REV_1, REV_2, SIW_MAX_PRIVATE_DATA,
};
use softrdma_wire::rdmap::TerminateCause;

mod frame;
mod initiator;
mod responder;

use frame::{build_frame, reject_frame, word_len, FrameReader, TxBuf};
pub use initiator::Initiator;
pub use responder::Responder;

/// Default [`MpaConfig::timeout`]: how long to wait for the peer's frame.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default [`MpaConfig::rtr_holdoff`] (wire.md §9 item 11).
pub const DEFAULT_RTR_HOLDOFF: Duration = Duration::from_millis(5);

/// Default [`MpaConfig::ird`] and [`MpaConfig::ord`].
pub const DEFAULT_DEPTH: u16 = 16;

/// Default [`MpaConfig::max_ird`]; siw's per-QP maximum (`SIW_MAX_IRD_QP`).
pub const DEFAULT_MAX_IRD: u16 = 128;

/// The magic that opens the softrdma private-data trailer.
pub const EXT_MAGIC: [u8; 5] = *b"sRDMA";

/// Length of the softrdma private-data trailer: magic, version, flags.
pub const EXT_TRAILER_LEN: usize = 8;

/// The trailer version this module sends.
pub const EXT_VERSION: u8 = 1;

/// Trailer flag: the sender implements the RFC 7306 atomic operations.
pub const EXT_ATOMICS: u16 = 0x0001;

/// Trailer flag: the sender implements RFC 7306 immediate data.
pub const EXT_IMMEDIATE: u16 = 0x0002;

/// The trailer flags this implementation announces.
pub const EXT_SUPPORTED: u16 = EXT_ATOMICS | EXT_IMMEDIATE;

/// The softrdma capability trailer found at the end of MPA private data (see
/// the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SoftrdmaTrailer {
    /// Version of the sender's extension ([`EXT_VERSION`] for us). Any
    /// version is recognised; new capabilities are new flag bits.
    pub version: u8,
    /// Capability flags ([`EXT_ATOMICS`], [`EXT_IMMEDIATE`]); unknown bits
    /// are ignored.
    pub flags: u16,
}

impl SoftrdmaTrailer {
    /// The trailer this implementation sends.
    pub const OURS: SoftrdmaTrailer = SoftrdmaTrailer {
        version: EXT_VERSION,
        flags: EXT_SUPPORTED,
    };

    /// The eight wire octets.
    pub fn to_bytes(self) -> [u8; EXT_TRAILER_LEN] {
        let [f0, f1] = self.flags.to_be_bytes();
        let m = EXT_MAGIC;
        [m[0], m[1], m[2], m[3], m[4], self.version, f0, f1]
    }

    /// Splits a trailer off the end of `private_data`: the ULP's part and the
    /// trailer, or `None` if the last eight octets are not a trailer.
    pub fn split(private_data: &[u8]) -> Option<(&[u8], SoftrdmaTrailer)> {
        let cut = private_data.len().checked_sub(EXT_TRAILER_LEN)?;
        let (ulp, t) = private_data.split_at(cut);
        if t[..EXT_MAGIC.len()] != EXT_MAGIC {
            return None;
        }
        let trailer = SoftrdmaTrailer {
            version: t[5],
            flags: u16::from_be_bytes([t[6], t[7]]),
        };
        Some((ulp, trailer))
    }
}

/// The RTR (ready-to-receive) messages an endpoint can send (initiator) or
/// accept (responder) in peer-to-peer mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RtrSupport {
    /// A zero-length RDMA Write (siw: STag 1, TO 0).
    pub write: bool,
    /// A zero-length RDMA Read Request (uses one ORD/IRD slot and gets a
    /// zero-length Read Response back).
    pub read: bool,
    /// A zero-length Send (consumes one MSN of queue 0).
    pub send: bool,
}

impl RtrSupport {
    /// All three kinds.
    pub const ALL: RtrSupport = RtrSupport {
        write: true,
        read: true,
        send: true,
    };

    /// Whether no kind is enabled.
    pub const fn is_empty(&self) -> bool {
        !(self.write || self.read || self.send)
    }
}

impl Default for RtrSupport {
    fn default() -> RtrSupport {
        RtrSupport::ALL
    }
}

/// Configuration of one end of an MPA negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaConfig {
    /// MPA revision to speak: 1 (RFC 5044) or 2 (RFC 6581, enhanced set-up
    /// with the IRD/ORD word). Default 2 (wire.md §9 item 12: siw's ORD stays
    /// 0 with Rev 1).
    pub rev: u8,
    /// Ask for CRCs (C=1). CRCs are used if either side asks. Default true.
    pub crc: bool,
    /// Ask to *receive* markers (M=1). Default false (siw refuses M=1).
    pub markers: bool,
    /// Initiator: request peer-to-peer mode. Responder: accept it when asked
    /// (declined otherwise). Rev 2 only; ignored with Rev 1. Default true.
    pub p2p: bool,
    /// RTR kinds offered (initiator) or accepted (responder). Default all.
    pub rtr: RtrSupport,
    /// Initiator: inbound RDMA Read depth announced in the Request.
    /// Responder: unused (see [`Responder::accept`]). Clamped to 0x3FFF.
    pub ird: u16,
    /// Initiator: outbound RDMA Read depth announced in the Request.
    /// Responder: unused (see [`Responder::accept`]). Clamped to 0x3FFF.
    pub ord: u16,
    /// How far the IRD may be raised to meet the peer's ORD (relaxed
    /// negotiation); the configured IRD is never lowered. Default 128.
    pub max_ird: u16,
    /// Initiator: the ULP's private data for the Request. Responder: unused
    /// (see [`Responder::accept`] and [`Responder::reject`]).
    pub private_data: Vec<u8>,
    /// Largest PD_Length sent or accepted, the IRD/ORD word and the softrdma
    /// trailer included. Default 256 (siw's limit), at most 512 (RFC 5044).
    pub max_private_data: usize,
    /// Use the softrdma capability trailer (module documentation). Default
    /// true.
    pub softrdma_ext: bool,
    /// How long to wait for the peer's frame, counted from `new`. Default
    /// 10 s.
    pub timeout: Duration,
    /// Initiator: how long after the Reply the first FPDU (the RTR included)
    /// must wait when the responder is not softrdma. Default 5 ms.
    pub rtr_holdoff: Duration,
}

impl Default for MpaConfig {
    fn default() -> MpaConfig {
        MpaConfig {
            rev: REV_2,
            crc: true,
            markers: false,
            p2p: true,
            rtr: RtrSupport::ALL,
            ird: DEFAULT_DEPTH,
            ord: DEFAULT_DEPTH,
            max_ird: DEFAULT_MAX_IRD,
            private_data: Vec::new(),
            max_private_data: SIW_MAX_PRIVATE_DATA,
            softrdma_ext: true,
            timeout: DEFAULT_TIMEOUT,
            rtr_holdoff: DEFAULT_RTR_HOLDOFF,
        }
    }
}

impl MpaConfig {
    /// Checks the settings both roles share: `rev` is 1 or 2 and
    /// `max_private_data` is at most 512.
    pub fn validate(&self) -> Result<(), MpaError> {
        if self.rev != REV_1 && self.rev != REV_2 {
            return Err(MpaError::InvalidConfig("rev must be 1 or 2"));
        }
        if self.max_private_data > MAX_PRIVATE_DATA {
            return Err(MpaError::InvalidConfig("max_private_data above 512"));
        }
        Ok(())
    }

    fn deadline(&self, now: Instant) -> Option<Instant> {
        now.checked_add(self.timeout)
    }
}

/// What must happen before data may flow, once the negotiation succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rtr {
    /// P2P mode, zero-length RDMA Write RTR. Initiator: send it as the first
    /// FPDU (siw uses STag 1, TO 0). Responder: send nothing until it has
    /// arrived; it is not delivered to the ULP.
    ZeroLengthWrite,
    /// P2P mode, zero-length RDMA Read Request RTR (sink STag 0, source
    /// STag 1, size 0 in siw). Initiator: send it first; it uses one ORD
    /// slot until its zero-length Read Response returns. Responder: wait for
    /// it, answer it with a zero-length Read Response, then send freely.
    ZeroLengthRead,
    /// P2P mode, zero-length Send RTR. Initiator: send it first (it uses
    /// MSN 1 of queue 0). Responder: wait for it; it consumes no posted
    /// receive and is not delivered to the ULP, but counts for the MSN.
    ZeroLengthSend,
    /// No P2P mode: RFC 5044's rule applies. The initiator may send any FPDU
    /// first; the responder must not send an FPDU until the initiator's first
    /// FPDU has arrived.
    InitiatorSendsFirst,
}

impl Rtr {
    /// Whether peer-to-peer mode was negotiated (an RTR message is used).
    pub const fn is_p2p(self) -> bool {
        !matches!(self, Rtr::InitiatorSendsFirst)
    }

    /// The RTR flags of the IRD/ORD word that name this choice.
    fn word(self, ird: u16, ord: u16) -> IrdOrd {
        IrdOrd {
            ird,
            ord,
            p2p: self.is_p2p(),
            rtr_write: self == Rtr::ZeroLengthWrite,
            rtr_read: self == Rtr::ZeroLengthRead,
            rtr_send: self == Rtr::ZeroLengthSend,
        }
    }
}

/// Picks one RTR kind out of the word's RTR bits that `support` allows:
/// zero-length Write, else Read, else Send.
fn pick_rtr(word: &IrdOrd, support: RtrSupport) -> Option<Rtr> {
    if word.rtr_write && support.write {
        Some(Rtr::ZeroLengthWrite)
    } else if word.rtr_read && support.read {
        Some(Rtr::ZeroLengthRead)
    } else if word.rtr_send && support.send {
        Some(Rtr::ZeroLengthSend)
    } else {
        None
    }
}

/// FPDU framing parameters fixed by the two frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Framing {
    /// CRCs are computed and checked in both directions.
    pub crc: bool,
    /// We insert markers in what we send (the peer asked for them).
    pub markers_tx: bool,
    /// The peer inserts markers in what it sends (we asked for them).
    pub markers_rx: bool,
}

/// The result of a successful negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// The MPA revision in use (the Reply's Rev).
    pub rev: u8,
    /// Whether the RFC 6581 IRD/ORD word was exchanged.
    pub enhanced: bool,
    /// CRCs in both directions (either side asked).
    pub crc: bool,
    /// We insert markers (the peer asked to receive them).
    pub markers_tx: bool,
    /// The peer inserts markers (we asked to receive them).
    pub markers_rx: bool,
    /// Our inbound RDMA Read depth: how many Read Requests the peer may have
    /// outstanding toward us (module documentation for the rule). Without
    /// the IRD/ORD word: the locally configured value.
    pub ird: u16,
    /// Our outbound RDMA Read depth.
    pub ord: u16,
    /// What must happen before data flows.
    pub rtr: Rtr,
    /// Initiator: the first FPDU (the RTR included) must not leave before
    /// this instant (wire.md §9 item 11). Responder: `None`; it waits for the
    /// initiator anyway.
    pub first_fpdu_not_before: Option<Instant>,
    /// The peer's ULP private data, without the IRD/ORD word and without a
    /// softrdma trailer that was recognised.
    pub peer_private_data: Vec<u8>,
    /// Both ends are softrdma and exchanged the capability trailer, so RFC
    /// 7306 atomics and immediate data (per [`Negotiated::ext_flags`]) may be
    /// used. Both ends always agree on this value.
    pub peer_is_softrdma: bool,
    /// The extension flags both ends announced (0 unless
    /// `peer_is_softrdma`).
    pub ext_flags: u16,
}

impl Negotiated {
    /// The FPDU framing parameters.
    pub fn framing(&self) -> Framing {
        Framing {
            crc: self.crc,
            markers_tx: self.markers_tx,
            markers_rx: self.markers_rx,
        }
    }
}

/// How a negotiation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The connection is set up; the data phase may start (observing
    /// [`Negotiated::rtr`]).
    Negotiated(Negotiated),
    /// A Reply with R=1 ended it. Initiator: the responder refused, and
    /// `private_data` is what it sent (IRD/ORD word stripped). Responder: our
    /// ULP refused with [`Responder::reject`], and `private_data` is what it
    /// sent. No FPDU follows; close the connection.
    Rejected {
        /// The ULP private data of the rejecting Reply.
        private_data: Vec<u8>,
    },
    /// The negotiation failed; close the connection (after sending a
    /// Terminate if [`Initiator::terminate_framing`] allows one).
    Failed(MpaError),
}

/// A valid MPA Request, as the responder's ULP sees it before it accepts or
/// rejects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRequest {
    /// The Request's Rev (0, 1 or 2).
    pub rev: u8,
    /// C: the initiator asked for CRCs.
    pub crc: bool,
    /// M: the initiator asked to receive markers.
    pub markers: bool,
    /// The initiator's IRD/ORD word (Rev 2 with the enhanced flag), with its
    /// IRD, ORD, P2P and RTR offers.
    pub ird_ord: Option<IrdOrd>,
    /// The start rule an acceptance will use (the RTR kind already picked,
    /// or [`Rtr::InitiatorSendsFirst`]).
    pub rtr: Rtr,
    /// The initiator's ULP private data (word and recognised trailer
    /// stripped).
    pub private_data: Vec<u8>,
    /// The initiator sent a softrdma trailer (only looked for with
    /// [`MpaConfig::softrdma_ext`]). The final
    /// [`Negotiated::peer_is_softrdma`] is false if our own trailer does not
    /// fit the Reply.
    pub peer_is_softrdma: bool,
}

/// Where a negotiation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Waiting for the peer's frame (the Request, or the Reply).
    AwaitingPeer,
    /// Responder only: a valid Request arrived, waiting for
    /// [`Responder::accept`] or [`Responder::reject`].
    RequestReceived,
    /// Done: negotiated (the outcome may wait for the transmit to drain).
    Negotiated,
    /// Done: rejected with R=1.
    Rejected,
    /// Done: failed.
    Failed,
}

/// Why an MPA negotiation failed, or why an API call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MpaError {
    /// The frame's key is not the one expected here (a Reply key in place of
    /// a Request, or garbage).
    BadKey,
    /// The frame's Rev is above 2.
    UnsupportedRevision(u8),
    /// The peer's PD_Length is above the limit.
    PrivateDataTooLong {
        /// PD_Length as received.
        len: usize,
        /// The limit in force ([`MpaConfig::max_private_data`], or 512).
        max: usize,
    },
    /// The frame breaks an MPA rule (the text says which).
    InvalidFrame(&'static str),
    /// P2P mode was requested, but no RTR kind is common to both ends.
    NoMatchingRtr,
    /// The peer may issue more RDMA Reads than we can serve, or the Read
    /// RTR was chosen with no Read credit on one side.
    InsufficientIrd {
        /// Reads that must be accommodated.
        needed: u16,
        /// Reads that can be.
        available: u16,
    },
    /// The peer's frame did not arrive within [`MpaConfig::timeout`].
    Timeout,
    /// Local: the ULP's private data does not fit the frame.
    UlpPrivateDataTooLong {
        /// Octets the ULP gave.
        len: usize,
        /// Octets that fit (after the IRD/ORD word).
        max: usize,
    },
    /// Local: the configuration is unusable (the text says why).
    InvalidConfig(&'static str),
    /// Local: the call is not valid in the current [`State`].
    InvalidState,
}

impl MpaError {
    /// The LLP Terminate cause (layer 2, etype 0) that describes this error
    /// on the wire, if one does: 0x04 for a bad Request/Reply, 0x06 for
    /// insufficient IRD, 0x07 for no matching RTR. `None` for the timeout
    /// and for local API errors.
    pub fn terminate_cause(&self) -> Option<TerminateCause> {
        match self {
            MpaError::BadKey
            | MpaError::UnsupportedRevision(_)
            | MpaError::PrivateDataTooLong { .. }
            | MpaError::InvalidFrame(_) => Some(TerminateCause::MpaInvalidRequest),
            MpaError::NoMatchingRtr => Some(TerminateCause::MpaNoMatchingRtr),
            MpaError::InsufficientIrd { .. } => Some(TerminateCause::MpaInsufficientIrd),
            MpaError::Timeout
            | MpaError::UlpPrivateDataTooLong { .. }
            | MpaError::InvalidConfig(_)
            | MpaError::InvalidState => None,
        }
    }
}

impl fmt::Display for MpaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MpaError::BadKey => f.write_str("MPA frame with a wrong key"),
            MpaError::UnsupportedRevision(rev) => write!(f, "unsupported MPA Rev {rev}"),
            MpaError::PrivateDataTooLong { len, max } => {
                write!(f, "peer's MPA private data too long ({len} > {max})")
            }
            MpaError::InvalidFrame(why) => write!(f, "invalid MPA frame: {why}"),
            MpaError::NoMatchingRtr => f.write_str("no matching RTR option"),
            MpaError::InsufficientIrd { needed, available } => {
                write!(
                    f,
                    "insufficient IRD ({needed} needed, {available} available)"
                )
            }
            MpaError::Timeout => f.write_str("MPA negotiation timed out"),
            MpaError::UlpPrivateDataTooLong { len, max } => {
                write!(f, "ULP private data too long ({len} > {max})")
            }
            MpaError::InvalidConfig(why) => write!(f, "invalid MPA configuration: {why}"),
            MpaError::InvalidState => f.write_str("call not valid in this MPA state"),
        }
    }
}

impl std::error::Error for MpaError {}

#[cfg(test)]
mod tests;
