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

use std::fmt;
use std::time::{Duration, Instant};

use softrdma_wire::mpa::{
    frame_len, FrameKind, IrdOrd, MpaFrame, MpaRepr, HEADER_LEN, IRD_ORD_LEN, IRD_ORD_MAX,
    MAX_PRIVATE_DATA, REV_1, REV_2, SIW_MAX_PRIVATE_DATA,
};
use softrdma_wire::rdmap::TerminateCause;

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

/// Octets queued for the peer and how many of them were written.
#[derive(Debug, Default)]
struct TxBuf {
    buf: Vec<u8>,
    sent: usize,
}

impl TxBuf {
    fn set(&mut self, bytes: Vec<u8>) {
        self.buf = bytes;
        self.sent = 0;
    }

    fn pending(&self) -> Option<&[u8]> {
        self.buf.get(self.sent..).filter(|rest| !rest.is_empty())
    }

    fn advance(&mut self, n: usize) {
        let left = self.buf.len() - self.sent;
        debug_assert!(
            n <= left,
            "transmitted({n}) with only {left} octets pending"
        );
        self.sent += n.min(left);
    }

    fn is_drained(&self) -> bool {
        self.sent >= self.buf.len()
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.sent = 0;
    }
}

/// Accumulates one MPA frame from the stream, failing fast on a bad header.
#[derive(Debug)]
struct FrameReader {
    buf: Vec<u8>,
    expect: FrameKind,
    /// PD_Length above this fails as soon as the header is in.
    fail_fast_pd: usize,
}

impl FrameReader {
    fn new(expect: FrameKind, fail_fast_pd: usize) -> FrameReader {
        FrameReader {
            buf: Vec::with_capacity(HEADER_LEN + fail_fast_pd),
            expect,
            fail_fast_pd,
        }
    }

    /// Takes octets up to the end of the frame: `(consumed, complete)`.
    fn feed(&mut self, data: &[u8]) -> Result<(usize, bool), MpaError> {
        let mut used = 0;
        if self.buf.len() < HEADER_LEN {
            let take = (HEADER_LEN - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            used = take;
            if self.buf.len() < HEADER_LEN {
                return Ok((used, false));
            }
            self.check_header()?;
        }
        let total = frame_len(&self.buf).unwrap_or(HEADER_LEN);
        let take = (total - self.buf.len()).min(data.len() - used);
        self.buf.extend_from_slice(&data[used..used + take]);
        used += take;
        Ok((used, self.buf.len() == total))
    }

    fn check_header(&self) -> Result<(), MpaError> {
        let f = MpaFrame::new_unchecked(&self.buf[..HEADER_LEN]);
        if f.kind() != Some(self.expect) {
            return Err(MpaError::BadKey);
        }
        if f.rev() > REV_2 {
            return Err(MpaError::UnsupportedRevision(f.rev()));
        }
        let len = usize::from(f.pd_length());
        if len > self.fail_fast_pd {
            return Err(MpaError::PrivateDataTooLong {
                len,
                max: self.fail_fast_pd,
            });
        }
        Ok(())
    }

    fn frame(&self) -> MpaFrame<&[u8]> {
        MpaFrame::new_unchecked(&self.buf[..])
    }
}

/// Builds one frame. `ulp` and the optional trailer form the private data
/// after the IRD/ORD word.
fn build_frame(repr: MpaRepr<'_>, ulp: &[u8], trailer: Option<SoftrdmaTrailer>) -> Vec<u8> {
    let mut pd = Vec::with_capacity(ulp.len() + EXT_TRAILER_LEN);
    pd.extend_from_slice(ulp);
    if let Some(t) = trailer {
        pd.extend_from_slice(&t.to_bytes());
    }
    let repr = MpaRepr {
        private_data: &pd,
        ..repr
    };
    let mut out = vec![0; repr.buffer_len()];
    repr.emit(&mut out);
    out
}

/// An automatic rejection: R=1, no ULP private data, the IRD/ORD word
/// only for a well-formed enhanced Request answered with Rev 2.
fn reject_frame(reply_rev: u8, word: Option<IrdOrd>, crc: bool) -> Vec<u8> {
    let repr = MpaRepr {
        reject: true,
        crc,
        rev: reply_rev,
        ..MpaRepr::reply(word, &[])
    };
    build_frame(repr, &[], None)
}

/// The IRD/ORD word's share of PD_Length.
const fn word_len(enhanced: bool) -> usize {
    if enhanced {
        IRD_ORD_LEN
    } else {
        0
    }
}

/// The initiator (active side) of an MPA negotiation: sends the Request,
/// waits for the Reply.
#[derive(Debug)]
pub struct Initiator {
    cfg: MpaConfig,
    /// The IRD/ORD word we sent (Rev 2).
    sent_word: Option<IrdOrd>,
    sent_trailer: bool,
    tx: TxBuf,
    rx: FrameReader,
    deadline: Option<Instant>,
    state: State,
    outcome: Option<Outcome>,
    failure: Option<MpaError>,
    framing: Option<Framing>,
}

impl Initiator {
    /// Starts a negotiation: the Request is queued for [`Initiator::poll_transmit`]
    /// and the timer runs from `now`.
    ///
    /// Fails with [`MpaError::InvalidConfig`] for a bad `rev`,
    /// `max_private_data`, or P2P with no RTR kind to offer, and with
    /// [`MpaError::UlpPrivateDataTooLong`] if the ULP's private data and the
    /// IRD/ORD word exceed `max_private_data`. The softrdma trailer is left
    /// out (no error) when it alone does not fit.
    pub fn new(cfg: MpaConfig, now: Instant) -> Result<Initiator, MpaError> {
        cfg.validate()?;
        let enhanced = cfg.rev == REV_2;
        let ird = cfg.ird.min(IRD_ORD_MAX);
        let ord = cfg.ord.min(IRD_ORD_MAX);
        let sent_word = enhanced.then(|| {
            let p2p = cfg.p2p;
            IrdOrd {
                ird,
                ord,
                p2p,
                rtr_write: p2p && cfg.rtr.write,
                rtr_read: p2p && cfg.rtr.read && ord >= 1,
                rtr_send: p2p && cfg.rtr.send,
            }
        });
        if let Some(w) = sent_word {
            if w.p2p && !(w.rtr_write || w.rtr_read || w.rtr_send) {
                return Err(MpaError::InvalidConfig(
                    "p2p with no RTR kind to offer (Read needs ord >= 1)",
                ));
            }
        }
        let base = word_len(enhanced) + cfg.private_data.len();
        if base > cfg.max_private_data {
            return Err(MpaError::UlpPrivateDataTooLong {
                len: cfg.private_data.len(),
                max: cfg.max_private_data.saturating_sub(word_len(enhanced)),
            });
        }
        let sent_trailer = cfg.softrdma_ext && base + EXT_TRAILER_LEN <= cfg.max_private_data;
        let repr = MpaRepr {
            markers: cfg.markers,
            crc: cfg.crc,
            rev: cfg.rev,
            ..MpaRepr::request(sent_word, &[])
        };
        let request = build_frame(
            repr,
            &cfg.private_data,
            sent_trailer.then_some(SoftrdmaTrailer::OURS),
        );
        let mut tx = TxBuf::default();
        tx.set(request);
        Ok(Initiator {
            rx: FrameReader::new(FrameKind::Reply, cfg.max_private_data),
            deadline: cfg.deadline(now),
            cfg,
            sent_word,
            sent_trailer,
            tx,
            state: State::AwaitingPeer,
            outcome: None,
            failure: None,
            framing: None,
        })
    }

    /// Feeds octets received from the responder; returns how many were
    /// consumed (never past the end of the Reply). See the module
    /// documentation for the contract.
    pub fn handle_bytes(&mut self, data: &[u8], now: Instant) -> Result<usize, MpaError> {
        match self.state {
            State::AwaitingPeer => {}
            State::Failed => return Err(self.failure.unwrap_or(MpaError::InvalidState)),
            _ => return Ok(0),
        }
        let (used, complete) = match self.rx.feed(data) {
            Ok(r) => r,
            Err(e) => return Err(self.fail(e)),
        };
        if complete {
            match self.process_reply(now) {
                Ok(outcome) => {
                    self.state = match outcome {
                        Outcome::Negotiated(_) => State::Negotiated,
                        _ => State::Rejected,
                    };
                    self.outcome = Some(outcome);
                }
                Err(e) => return Err(self.fail(e)),
            }
        }
        Ok(used)
    }

    fn fail(&mut self, e: MpaError) -> MpaError {
        self.state = State::Failed;
        self.failure = Some(e);
        self.outcome = Some(Outcome::Failed(e));
        self.tx.clear();
        e
    }

    fn process_reply(&mut self, now: Instant) -> Result<Outcome, MpaError> {
        let f = self.rx.frame();
        let pd = f.private_data();
        let rev = f.rev();
        let enhanced_flag = rev == REV_2 && f.enhanced();
        if f.reject() {
            // Lenient: siw's automatic reject may carry the enhanced flag
            // with no word at all.
            let rest = match pd.get(IRD_ORD_LEN..) {
                Some(rest) if enhanced_flag => rest,
                _ => pd,
            };
            let ulp = match SoftrdmaTrailer::split(rest) {
                Some((ulp, _)) if self.sent_trailer => ulp,
                _ => rest,
            };
            return Ok(Outcome::Rejected {
                private_data: ulp.to_vec(),
            });
        }
        if rev > self.cfg.rev {
            return Err(MpaError::InvalidFrame("Reply Rev above the Request's"));
        }
        // A Rev-2 Reply without the enhanced flag is taken as "no word"
        // (siw would fail the connect; RFC 5044 semantics still work).
        let word = if enhanced_flag {
            let w = IrdOrd::parse(pd)
                .map_err(|_| MpaError::InvalidFrame("enhanced flag without IRD/ORD word"))?;
            Some(w)
        } else {
            None
        };
        let rest = if enhanced_flag {
            &pd[IRD_ORD_LEN..]
        } else {
            pd
        };
        let requested_p2p = self.sent_word.is_some_and(|w| w.p2p);
        if word.is_some_and(|w| w.p2p) && !requested_p2p {
            return Err(MpaError::InvalidFrame("P2P accepted but not requested"));
        }
        // From here on the Reply is well-formed and accepting: a failure
        // may be reported with a Terminate in this framing.
        self.framing = Some(Framing {
            crc: self.cfg.crc || f.crc(),
            markers_tx: f.markers(),
            markers_rx: self.cfg.markers,
        });
        let (ird, ord, rtr) = match (word, self.sent_word) {
            (Some(w), Some(sent)) => {
                let rtr = if w.p2p {
                    let offered = RtrSupport {
                        write: sent.rtr_write,
                        read: sent.rtr_read,
                        send: sent.rtr_send,
                    };
                    pick_rtr(&w, offered).ok_or(MpaError::NoMatchingRtr)?
                } else {
                    // The responder declined P2P.
                    Rtr::InitiatorSendsFirst
                };
                let can_serve = sent.ird.max(self.cfg.max_ird.min(IRD_ORD_MAX));
                if w.ord > can_serve {
                    return Err(MpaError::InsufficientIrd {
                        needed: w.ord,
                        available: can_serve,
                    });
                }
                let ord = sent.ord.min(w.ird);
                if rtr == Rtr::ZeroLengthRead && ord == 0 {
                    return Err(MpaError::InsufficientIrd {
                        needed: 1,
                        available: w.ird,
                    });
                }
                (w.ord, ord, rtr)
            }
            _ => (
                self.cfg.ird.min(IRD_ORD_MAX),
                self.cfg.ord.min(IRD_ORD_MAX),
                Rtr::InitiatorSendsFirst,
            ),
        };
        let (ulp, peer) = match SoftrdmaTrailer::split(rest) {
            Some((ulp, t)) if self.sent_trailer => (ulp, Some(t)),
            _ => (rest, None),
        };
        let peer_is_softrdma = peer.is_some();
        let holdoff = if peer_is_softrdma {
            Duration::ZERO
        } else {
            self.cfg.rtr_holdoff
        };
        Ok(Outcome::Negotiated(Negotiated {
            rev,
            enhanced: word.is_some(),
            crc: self.cfg.crc || f.crc(),
            markers_tx: f.markers(),
            markers_rx: self.cfg.markers,
            ird,
            ord,
            rtr,
            first_fpdu_not_before: Some(now.checked_add(holdoff).unwrap_or(now)),
            peer_private_data: ulp.to_vec(),
            peer_is_softrdma,
            ext_flags: peer.map_or(0, |t| t.flags & EXT_SUPPORTED),
        }))
    }

    /// The octets still to be written to the peer (the Request, or what is
    /// left of it), or `None`. Nothing else is ever queued: the initiator
    /// sends nothing after its Request until the Reply has arrived.
    pub fn poll_transmit(&self) -> Option<&[u8]> {
        self.tx.pending()
    }

    /// Records that the first `n` octets of [`Initiator::poll_transmit`]
    /// were written. `n` above that length is a caller bug (clamped; a debug
    /// assertion).
    pub fn transmitted(&mut self, n: usize) {
        self.tx.advance(n);
    }

    /// When [`Initiator::handle_timeout`] must be called: the deadline for
    /// the Reply, while it is awaited.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitingPeer => self.deadline,
            _ => None,
        }
    }

    /// Fails the negotiation with [`MpaError::Timeout`] if `now` is at or
    /// past the deadline and the Reply has not arrived.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == State::AwaitingPeer && self.deadline.is_some_and(|d| now >= d) {
            self.fail(MpaError::Timeout);
        }
    }

    /// Where the negotiation is.
    pub fn state(&self) -> State {
        self.state
    }

    /// The outcome, once: when the negotiation is over and nothing is left
    /// to transmit.
    pub fn poll_outcome(&mut self) -> Option<Outcome> {
        if self.tx.is_drained() {
            self.outcome.take()
        } else {
            None
        }
    }

    /// The FPDU framing agreed by an accepting Reply, for a Terminate to send
    /// when the negotiation then failed ([`MpaError::NoMatchingRtr`],
    /// [`MpaError::InsufficientIrd`]), as siw does. `None` if no accepting
    /// Reply was read.
    pub fn terminate_framing(&self) -> Option<Framing> {
        match self.state {
            State::Failed => self.framing,
            _ => None,
        }
    }
}

/// What the responder remembers between the Request and the ULP's decision.
#[derive(Debug)]
struct Pending {
    request: PeerRequest,
    reply_rev: u8,
    /// We answer with the enhanced flag and an IRD/ORD word.
    answer_enhanced: bool,
    crc: bool,
    /// The initiator's softrdma trailer, if one was recognised.
    peer_trailer: Option<SoftrdmaTrailer>,
}

/// The responder (passive side) of an MPA negotiation: waits for the
/// Request, lets the ULP decide, sends the Reply.
#[derive(Debug)]
pub struct Responder {
    cfg: MpaConfig,
    tx: TxBuf,
    rx: FrameReader,
    deadline: Option<Instant>,
    state: State,
    pending: Option<Pending>,
    outcome: Option<Outcome>,
    failure: Option<MpaError>,
}

impl Responder {
    /// Starts waiting for the Request; the timer runs from `now`. Fails with
    /// [`MpaError::InvalidConfig`] for a bad `rev` or `max_private_data`.
    pub fn new(cfg: MpaConfig, now: Instant) -> Result<Responder, MpaError> {
        cfg.validate()?;
        Ok(Responder {
            rx: FrameReader::new(FrameKind::Request, MAX_PRIVATE_DATA),
            deadline: cfg.deadline(now),
            cfg,
            tx: TxBuf::default(),
            state: State::AwaitingPeer,
            pending: None,
            outcome: None,
            failure: None,
        })
    }

    /// Feeds octets received from the initiator; returns how many were
    /// consumed (never past the end of the Request). See the module
    /// documentation for the contract.
    ///
    /// An invalid Request fails the negotiation; for the errors listed in
    /// the module documentation a Reply with R=1 is queued first.
    pub fn handle_bytes(&mut self, data: &[u8], _now: Instant) -> Result<usize, MpaError> {
        match self.state {
            State::AwaitingPeer => {}
            State::Failed => return Err(self.failure.unwrap_or(MpaError::InvalidState)),
            _ => return Ok(0),
        }
        let (used, complete) = match self.rx.feed(data) {
            Ok(r) => r,
            Err(e) => return Err(self.fail(e, None)),
        };
        if complete {
            self.process_request()?;
        }
        Ok(used)
    }

    /// Fails; with `reject`, that rejecting Reply is queued.
    fn fail(&mut self, e: MpaError, reject: Option<Vec<u8>>) -> MpaError {
        self.state = State::Failed;
        self.failure = Some(e);
        self.outcome = Some(Outcome::Failed(e));
        self.pending = None;
        match reject {
            Some(reply) => self.tx.set(reply),
            None => self.tx.clear(),
        }
        e
    }

    fn process_request(&mut self) -> Result<(), MpaError> {
        let f = self.rx.frame();
        let rev = f.rev();
        let (req_crc, req_markers, req_reject) = (f.crc(), f.markers(), f.reject());
        let enhanced = rev == REV_2 && f.enhanced();
        let pd = f.private_data().to_vec();
        let reply_rev = rev.min(self.cfg.rev);
        let crc = self.cfg.crc || req_crc;
        let answer_enhanced = enhanced && reply_rev == REV_2;
        let auto_reject = |this: &mut Responder, e: MpaError, word: Option<IrdOrd>| {
            let reply = reject_frame(reply_rev, word, crc);
            this.fail(e, Some(reply))
        };
        if req_reject {
            let e = MpaError::InvalidFrame("R set in a Request");
            return Err(auto_reject(self, e, None));
        }
        if pd.len() > self.cfg.max_private_data {
            let e = MpaError::PrivateDataTooLong {
                len: pd.len(),
                max: self.cfg.max_private_data,
            };
            return Err(auto_reject(self, e, None));
        }
        let word = if enhanced {
            match IrdOrd::parse(&pd) {
                Ok(w) => Some(w),
                Err(_) => {
                    let e = MpaError::InvalidFrame("enhanced flag without IRD/ORD word");
                    return Err(auto_reject(self, e, None));
                }
            }
        } else {
            None
        };
        let rest = if enhanced {
            &pd[IRD_ORD_LEN..]
        } else {
            &pd[..]
        };
        let (ulp, peer_trailer) = match SoftrdmaTrailer::split(rest) {
            Some((ulp, t)) if self.cfg.softrdma_ext => (ulp, Some(t)),
            _ => (rest, None),
        };
        let rtr = match word {
            Some(w) if w.p2p && answer_enhanced && self.cfg.p2p => {
                match pick_rtr(&w, self.cfg.rtr) {
                    Some(rtr) => rtr,
                    None => {
                        let word = Some(IrdOrd::new(0, 0));
                        return Err(auto_reject(self, MpaError::NoMatchingRtr, word));
                    }
                }
            }
            _ => Rtr::InitiatorSendsFirst,
        };
        let request = PeerRequest {
            rev,
            crc: req_crc,
            markers: req_markers,
            ird_ord: word,
            rtr,
            private_data: ulp.to_vec(),
            peer_is_softrdma: peer_trailer.is_some(),
        };
        self.pending = Some(Pending {
            request,
            reply_rev,
            answer_enhanced,
            crc,
            peer_trailer,
        });
        self.state = State::RequestReceived;
        Ok(())
    }

    /// The Request, while the ULP has to decide ([`State::RequestReceived`]).
    pub fn request(&self) -> Option<&PeerRequest> {
        self.pending.as_ref().map(|p| &p.request)
    }

    /// Accepts the Request: queues the Reply with the ULP's `private_data`
    /// and its wished `ird`/`ord` (negotiated as the module documentation
    /// says; clamped to 0x3FFF). The outcome is
    /// [`Outcome::Negotiated`].
    ///
    /// Fails with [`MpaError::InvalidState`] outside
    /// [`State::RequestReceived`], and with
    /// [`MpaError::UlpPrivateDataTooLong`] if `private_data` plus the
    /// IRD/ORD word exceed `max_private_data`; the state is then unchanged.
    pub fn accept(&mut self, private_data: &[u8], ird: u16, ord: u16) -> Result<(), MpaError> {
        let p = self.pending.as_ref().ok_or(MpaError::InvalidState)?;
        let base = word_len(p.answer_enhanced) + private_data.len();
        if base > self.cfg.max_private_data {
            return Err(MpaError::UlpPrivateDataTooLong {
                len: private_data.len(),
                max: self
                    .cfg
                    .max_private_data
                    .saturating_sub(word_len(p.answer_enhanced)),
            });
        }
        let Some(p) = self.pending.take() else {
            return Err(MpaError::InvalidState);
        };
        let ird = ird.min(IRD_ORD_MAX);
        let ord = ord.min(IRD_ORD_MAX);
        let rtr = p.request.rtr;
        let (ird, ord, word) = match p.request.ird_ord {
            Some(peer) if p.answer_enhanced => {
                let cap = ird.max(self.cfg.max_ird.min(IRD_ORD_MAX));
                let mut our_ird = ird.max(peer.ord).min(cap);
                if rtr == Rtr::ZeroLengthRead {
                    our_ird = our_ird.max(1);
                }
                let our_ord = ord.min(peer.ird);
                (our_ird, our_ord, Some(rtr.word(our_ird, our_ord)))
            }
            _ => (ird, ord, None),
        };
        let trailer = (p.request.peer_is_softrdma
            && base + EXT_TRAILER_LEN <= self.cfg.max_private_data)
            .then_some(SoftrdmaTrailer::OURS);
        let ext_flags = match (trailer, p.peer_trailer) {
            (Some(_), Some(peer)) => peer.flags & EXT_SUPPORTED,
            _ => 0,
        };
        let repr = MpaRepr {
            markers: self.cfg.markers,
            crc: p.crc,
            rev: p.reply_rev,
            ..MpaRepr::reply(word, &[])
        };
        self.tx.set(build_frame(repr, private_data, trailer));
        self.outcome = Some(Outcome::Negotiated(Negotiated {
            rev: p.reply_rev,
            enhanced: word.is_some(),
            crc: p.crc,
            markers_tx: p.request.markers,
            markers_rx: self.cfg.markers,
            ird,
            ord,
            rtr,
            first_fpdu_not_before: None,
            peer_private_data: p.request.private_data,
            peer_is_softrdma: trailer.is_some(),
            ext_flags,
        }));
        self.state = State::Negotiated;
        Ok(())
    }

    /// Rejects the Request: queues a Reply with R=1 and the ULP's
    /// `private_data` (after the IRD/ORD word when the Reply is enhanced).
    /// The outcome is [`Outcome::Rejected`].
    ///
    /// Fails like [`Responder::accept`], leaving the state unchanged.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), MpaError> {
        let p = self.pending.as_ref().ok_or(MpaError::InvalidState)?;
        let wl = word_len(p.answer_enhanced);
        if wl + private_data.len() > self.cfg.max_private_data {
            return Err(MpaError::UlpPrivateDataTooLong {
                len: private_data.len(),
                max: self.cfg.max_private_data.saturating_sub(wl),
            });
        }
        let Some(p) = self.pending.take() else {
            return Err(MpaError::InvalidState);
        };
        let word = p.answer_enhanced.then(|| IrdOrd::new(0, 0));
        let repr = MpaRepr {
            reject: true,
            crc: p.crc,
            rev: p.reply_rev,
            ..MpaRepr::reply(word, &[])
        };
        self.tx.set(build_frame(repr, private_data, None));
        self.outcome = Some(Outcome::Rejected {
            private_data: private_data.to_vec(),
        });
        self.state = State::Rejected;
        Ok(())
    }

    /// The octets still to be written to the peer (the Reply, or what is
    /// left of it), or `None`.
    pub fn poll_transmit(&self) -> Option<&[u8]> {
        self.tx.pending()
    }

    /// Records that the first `n` octets of [`Responder::poll_transmit`]
    /// were written. `n` above that length is a caller bug (clamped; a debug
    /// assertion).
    pub fn transmitted(&mut self, n: usize) {
        self.tx.advance(n);
    }

    /// When [`Responder::handle_timeout`] must be called: the deadline for
    /// the Request, while it is awaited. The ULP's decision time is not
    /// bounded here.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitingPeer => self.deadline,
            _ => None,
        }
    }

    /// Fails the negotiation with [`MpaError::Timeout`] if `now` is at or
    /// past the deadline and the Request has not arrived.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == State::AwaitingPeer && self.deadline.is_some_and(|d| now >= d) {
            self.fail(MpaError::Timeout, None);
        }
    }

    /// Where the negotiation is.
    pub fn state(&self) -> State {
        self.state
    }

    /// The outcome, once: when the negotiation is over and the Reply (if
    /// any) has been fully transmitted.
    pub fn poll_outcome(&mut self) -> Option<Outcome> {
        if self.tx.is_drained() {
            self.outcome.take()
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use softrdma_wire::mpa::{KEY_REPLY, KEY_REQUEST};

    // ---------------------------------------------------------------
    // Real siw frames. Extracted from ../shared/testdata/iwarp with
    // `tshark -r FILE -q -z follow,tcp,raw,0` (Linux 6.12 siw, rping).
    // ---------------------------------------------------------------

    /// siw-rping-default.pcap, initiator: Rev 2, octet 16 = 0x10 (enhanced
    /// only), PD = IRD/ORD word (IRD 1, ORD 1), no P2P.
    const SIW_DEFAULT_REQUEST: &str = "4d504120494420526571204672616d651002000400010001";
    /// siw-rping-default.pcap, responder's Reply to it.
    const SIW_DEFAULT_REPLY: &str = "4d504120494420526570204672616d651002000400010001";
    /// siw-rping-default.pcap: the first 8 octets of the responder's first
    /// FPDU (a Read Request), which follows the Reply in the same stream.
    const SIW_DEFAULT_REPLY_NEXT: &str = "002e414100000000";
    /// siw-rping-crc-p2p.pcap, initiator: C + enhanced, P2P, IRD 1,
    /// Write + Read RTR, ORD 1.
    const SIW_P2P_REQUEST: &str = "4d504120494420526571204672616d65500200048001c001";
    /// siw-rping-crc-p2p.pcap, responder: C + enhanced, P2P, IRD 1, Write
    /// RTR, ORD 1.
    const SIW_P2P_REPLY: &str = "4d504120494420526570204672616d655002000480018001";
    /// golden.txt: "MPA Request rev2, C=1, enh, IRD=ORD=16, PD='ulp-hello'".
    const GOLDEN_REQUEST: &str =
        "4d504120494420526571204672616d655002000d00100010756c702d68656c6c6f";
    /// golden.txt: "MPA Reply rev2, C=1, enh, IRD=ORD=16, PD='ulp-ok'".
    const GOLDEN_REPLY: &str = "4d504120494420526570204672616d655002000a00100010756c702d6f6b";

    fn hex(s: &str) -> Vec<u8> {
        assert!(s.len().is_multiple_of(2));
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// A raw frame, bypassing every invariant of the wire encoder.
    fn raw(key: &[u8; 16], flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
        let mut b = key.to_vec();
        b.push(flags);
        b.push(rev);
        b.extend_from_slice(&u16::try_from(pd.len()).unwrap().to_be_bytes());
        b.extend_from_slice(pd);
        b
    }

    fn word(w: IrdOrd) -> Vec<u8> {
        w.to_bytes().to_vec()
    }

    /// What siw's `siw_proc_mpareply` (siw_cm.c, mainline defaults: CRC not
    /// required, not strict, relaxed IRD negotiation, max IRD 128) demands
    /// of the Reply to `request`.
    fn siw_accepts_reply(request: &[u8], reply: &[u8]) -> Result<(), &'static str> {
        let len = frame_len(reply).ok_or("short")?;
        if len != reply.len() {
            return Err("octets after the Reply");
        }
        let f = MpaFrame::new_checked(reply).map_err(|_| "truncated")?;
        if usize::from(f.pd_length()) > SIW_MAX_PRIVATE_DATA {
            return Err("PD_Length above 256");
        }
        if f.rev() > 2 {
            return Err("rev > 2");
        }
        if f.key() != KEY_REPLY {
            return Err("bad key");
        }
        if f.reject() {
            return Err("rejected");
        }
        if f.markers() {
            return Err("M=1");
        }
        let req = MpaFrame::new_checked(request).unwrap();
        if req.rev() == 2 && req.enhanced() {
            if f.rev() < 2 || !f.enhanced() {
                return Err("not Rev 2 + enhanced");
            }
            let rep = f.ird_ord().ok_or("no IRD/ORD word")?;
            let sent = req.ird_ord().unwrap();
            if sent.ird < rep.ord && rep.ord > 128 {
                return Err("insufficient IRD");
            }
            if sent.p2p && (sent.rtr_write || sent.rtr_read) {
                let ok = (sent.rtr_write && rep.rtr_write) || (sent.rtr_read && rep.rtr_read);
                if !ok {
                    return Err("no matching RTR");
                }
            }
        }
        Ok(())
    }

    /// What siw's `siw_proc_mpareq` demands of a Request before it accepts
    /// (anything else: close, or a Reply with R=1).
    fn siw_accepts_request(request: &[u8]) -> Result<(), &'static str> {
        let len = frame_len(request).ok_or("short")?;
        if len != request.len() {
            return Err("octets after the Request");
        }
        let f = MpaFrame::new_checked(request).map_err(|_| "truncated")?;
        if usize::from(f.pd_length()) > SIW_MAX_PRIVATE_DATA {
            return Err("PD_Length above 256");
        }
        if f.rev() > 2 {
            return Err("rev > 2");
        }
        if f.key() != KEY_REQUEST {
            return Err("bad key");
        }
        if f.rev() == 2 && f.enhanced() && f.pd_length() < 4 {
            return Err("enhanced without word");
        }
        if f.markers() {
            return Err("M=1");
        }
        Ok(())
    }

    // ---------------------------------------------------------------
    // A driver: both ends against each other through split streams.
    // ---------------------------------------------------------------

    /// Chunk sizes for writes and reads, cycled.
    struct Splitter {
        sizes: Vec<usize>,
        i: usize,
    }

    impl Splitter {
        fn new(sizes: Vec<usize>) -> Splitter {
            assert!(!sizes.is_empty());
            Splitter { sizes, i: 0 }
        }

        /// Pseudo-random sizes in 1..=max (xorshift, seeded).
        fn seeded(mut seed: u64, max: usize) -> Splitter {
            seed |= 1;
            let sizes = (0..97)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    1 + (seed % max as u64) as usize
                })
                .collect();
            Splitter::new(sizes)
        }

        fn next(&mut self) -> usize {
            let s = self.sizes[self.i % self.sizes.len()].max(1);
            self.i += 1;
            s
        }
    }

    #[derive(Debug, Clone)]
    enum Decision {
        Accept { pd: Vec<u8>, ird: u16, ord: u16 },
        Reject(Vec<u8>),
    }

    #[derive(Debug)]
    struct Run {
        now: Instant,
        initiator: Option<Outcome>,
        responder: Option<Outcome>,
        request: Option<PeerRequest>,
        request_bytes: Vec<u8>,
        reply_bytes: Vec<u8>,
        i2r_left: Vec<u8>,
        r2i_left: Vec<u8>,
    }

    fn run(icfg: MpaConfig, rcfg: MpaConfig, decision: &Decision, split: &mut Splitter) -> Run {
        let now = Instant::now();
        let mut ini = Initiator::new(icfg, now).unwrap();
        let mut res = Responder::new(rcfg, now).unwrap();
        let mut r = Run {
            now,
            initiator: None,
            responder: None,
            request: None,
            request_bytes: Vec::new(),
            reply_bytes: Vec::new(),
            i2r_left: Vec::new(),
            r2i_left: Vec::new(),
        };
        for _ in 0..100_000 {
            let mut progress = false;
            if let Some(p) = ini.poll_transmit() {
                let n = split.next().min(p.len());
                r.i2r_left.extend_from_slice(&p[..n]);
                r.request_bytes.extend_from_slice(&p[..n]);
                ini.transmitted(n);
                progress = true;
            }
            if !r.i2r_left.is_empty() {
                let n = split.next().min(r.i2r_left.len());
                // After a failure the connection is dead: drop the rest.
                let c = match res.handle_bytes(&r.i2r_left[..n], now) {
                    Ok(c) => {
                        assert!(c <= n);
                        c
                    }
                    Err(_) => r.i2r_left.len(),
                };
                r.i2r_left.drain(..c);
                progress |= c > 0;
            }
            if res.state() == State::RequestReceived {
                r.request = res.request().cloned();
                match decision {
                    Decision::Accept { pd, ird, ord } => res.accept(pd, *ird, *ord).unwrap(),
                    Decision::Reject(pd) => res.reject(pd).unwrap(),
                }
                progress = true;
            }
            if let Some(p) = res.poll_transmit() {
                let n = split.next().min(p.len());
                r.r2i_left.extend_from_slice(&p[..n]);
                r.reply_bytes.extend_from_slice(&p[..n]);
                res.transmitted(n);
                progress = true;
            }
            if !r.r2i_left.is_empty() {
                let n = split.next().min(r.r2i_left.len());
                let c = match ini.handle_bytes(&r.r2i_left[..n], now) {
                    Ok(c) => {
                        assert!(c <= n);
                        c
                    }
                    Err(_) => r.r2i_left.len(),
                };
                r.r2i_left.drain(..c);
                progress |= c > 0;
            }
            if r.initiator.is_none() {
                r.initiator = ini.poll_outcome();
                progress |= r.initiator.is_some();
            }
            if r.responder.is_none() {
                r.responder = res.poll_outcome();
                progress |= r.responder.is_some();
            }
            if !progress {
                break;
            }
        }
        assert_eq!(
            ini.poll_transmit(),
            None,
            "initiator sends only its Request"
        );
        assert_eq!(res.poll_transmit(), None);
        r
    }

    fn negotiated(o: &Option<Outcome>) -> &Negotiated {
        match o {
            Some(Outcome::Negotiated(n)) => n,
            other => panic!("not negotiated: {other:?}"),
        }
    }

    fn default_accept() -> Decision {
        Decision::Accept {
            pd: b"responder-ulp".to_vec(),
            ird: 16,
            ord: 16,
        }
    }

    /// Checks everything two ends must agree on after a successful run.
    fn check_pair(icfg: &MpaConfig, rcfg: &MpaConfig, decision: &Decision, r: &Run) {
        let Decision::Accept {
            pd: acc_pd,
            ird: acc_ird,
            ord: acc_ord,
        } = decision
        else {
            panic!("check_pair needs an acceptance")
        };
        let i = negotiated(&r.initiator);
        let s = negotiated(&r.responder);
        assert!(r.i2r_left.is_empty() && r.r2i_left.is_empty());

        // Both frames are valid for the (strict) wire decoder, exactly one
        // frame each.
        let (req, n) = MpaRepr::parse(&r.request_bytes).unwrap();
        assert_eq!(n, r.request_bytes.len());
        let (rep, n) = MpaRepr::parse(&r.reply_bytes).unwrap();
        assert_eq!(n, r.reply_bytes.len());
        assert!(!rep.reject);
        assert!(
            usize::from(MpaFrame::new_unchecked(&r.request_bytes[..]).pd_length())
                <= icfg.max_private_data
        );
        assert!(
            usize::from(MpaFrame::new_unchecked(&r.reply_bytes[..]).pd_length())
                <= rcfg.max_private_data
        );

        let rev = icfg.rev.min(rcfg.rev);
        assert_eq!((i.rev, s.rev), (rev, rev));
        assert_eq!(rep.rev, rev);
        assert_eq!(req.rev, icfg.rev);
        let enhanced = rev == 2;
        assert_eq!((i.enhanced, s.enhanced), (enhanced, enhanced));

        let crc = icfg.crc || rcfg.crc;
        assert_eq!((i.crc, s.crc), (crc, crc));
        assert_eq!(i.markers_rx, icfg.markers);
        assert_eq!(i.markers_tx, rcfg.markers);
        assert_eq!(s.markers_rx, rcfg.markers);
        assert_eq!(s.markers_tx, icfg.markers);
        assert_eq!(i.framing().markers_tx, s.framing().markers_rx);

        let p2p = enhanced && icfg.p2p && rcfg.p2p;
        let expected_rtr = if p2p {
            pick_rtr(
                &IrdOrd {
                    rtr_write: icfg.rtr.write,
                    rtr_read: icfg.rtr.read && icfg.ord.min(IRD_ORD_MAX) >= 1,
                    rtr_send: icfg.rtr.send,
                    ..IrdOrd::default()
                },
                rcfg.rtr,
            )
            .unwrap()
        } else {
            Rtr::InitiatorSendsFirst
        };
        assert_eq!((i.rtr, s.rtr), (expected_rtr, expected_rtr));

        let (iird, iord) = (icfg.ird.min(IRD_ORD_MAX), icfg.ord.min(IRD_ORD_MAX));
        let (aird, aord) = ((*acc_ird).min(IRD_ORD_MAX), (*acc_ord).min(IRD_ORD_MAX));
        if enhanced {
            let cap = aird.max(rcfg.max_ird);
            let mut rird = aird.max(iord).min(cap);
            if expected_rtr == Rtr::ZeroLengthRead {
                rird = rird.max(1);
            }
            assert_eq!(s.ord, aord.min(iird));
            assert_eq!(s.ird, rird);
            assert_eq!(i.ord, iord.min(s.ird));
            assert_eq!(i.ird, s.ord);
            assert!(i.ord <= s.ird && s.ord <= i.ird);
            assert_eq!(rep.ird_ord.map(|w| (w.ird, w.ord)), Some((s.ird, s.ord)));
        } else {
            assert_eq!((i.ird, i.ord), (iird, iord));
            assert_eq!((s.ird, s.ord), (aird, aord));
            assert!(rep.ird_ord.is_none());
        }

        // softrdma discovery.
        let wl = word_len(icfg.rev == 2);
        let i_trailer =
            icfg.softrdma_ext && wl + icfg.private_data.len() + 8 <= icfg.max_private_data;
        let r_trailer = i_trailer
            && rcfg.softrdma_ext
            && word_len(enhanced) + acc_pd.len() + 8 <= rcfg.max_private_data;
        assert_eq!(i.peer_is_softrdma, r_trailer);
        assert_eq!(s.peer_is_softrdma, r_trailer);
        let flags = if r_trailer { EXT_SUPPORTED } else { 0 };
        assert_eq!((i.ext_flags, s.ext_flags), (flags, flags));

        // Private data both ways; a responder without the extension hands
        // the trailer to its ULP like siw would.
        assert_eq!(&i.peer_private_data, acc_pd);
        let mut seen_by_responder = icfg.private_data.clone();
        if i_trailer && !rcfg.softrdma_ext {
            seen_by_responder.extend_from_slice(&SoftrdmaTrailer::OURS.to_bytes());
        }
        assert_eq!(s.peer_private_data, seen_by_responder);
        let request = r.request.as_ref().unwrap();
        assert_eq!(request.private_data, seen_by_responder);
        assert_eq!(request.peer_is_softrdma, i_trailer && rcfg.softrdma_ext);

        // Start rule and the hold-off.
        let holdoff = if r_trailer {
            Duration::ZERO
        } else {
            icfg.rtr_holdoff
        };
        assert_eq!(i.first_fpdu_not_before, Some(r.now + holdoff));
        assert_eq!(s.first_fpdu_not_before, None);
    }

    fn cfg(rev: u8, crc: bool, markers: bool, p2p: bool, ext: bool) -> MpaConfig {
        MpaConfig {
            rev,
            crc,
            markers,
            p2p,
            softrdma_ext: ext,
            ..MpaConfig::default()
        }
    }

    /// Rev 1/2 × CRC × markers × P2P × extension, on each side: 1024
    /// combinations, each with its own stream splits (chunks of 1..=7
    /// octets).
    #[test]
    fn negotiation_matrix() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for bits in 0u32..1024 {
            let b = |k: u32| bits & (1 << k) != 0;
            let mut icfg = cfg(if b(0) { 2 } else { 1 }, b(1), b(2), b(3), b(4));
            let rcfg = cfg(if b(5) { 2 } else { 1 }, b(6), b(7), b(8), b(9));
            icfg.private_data = b"initiator-ulp".to_vec();
            let decision = default_accept();
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let mut split = Splitter::seeded(seed, 7);
            let r = run(icfg.clone(), rcfg.clone(), &decision, &mut split);
            check_pair(&icfg, &rcfg, &decision, &r);
        }
    }

    fn arb_rtr() -> impl Strategy<Value = RtrSupport> {
        (any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(write, read, send)| RtrSupport { write, read, send })
            .prop_filter("one kind at least", |r| !r.is_empty())
    }

    fn arb_cfg() -> impl Strategy<Value = MpaConfig> {
        (
            1u8..=2,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            arb_rtr(),
            (0u16..300, 0u16..300, 0u16..200),
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(
                |(rev, crc, markers, p2p, ext, rtr, (ird, ord, max_ird), pd)| MpaConfig {
                    rev,
                    crc,
                    markers,
                    p2p,
                    rtr,
                    ird,
                    ord,
                    max_ird,
                    private_data: pd,
                    softrdma_ext: ext,
                    ..MpaConfig::default()
                },
            )
    }

    /// Whether the initiator config can offer an RTR kind the responder
    /// takes (else the responder rejects: tested separately).
    fn rtr_compatible(i: &MpaConfig, r: &MpaConfig) -> bool {
        if !(i.rev == 2 && r.rev == 2 && i.p2p && r.p2p) {
            return true;
        }
        let offer = IrdOrd {
            rtr_write: i.rtr.write,
            rtr_read: i.rtr.read && i.ord >= 1,
            rtr_send: i.rtr.send,
            ..IrdOrd::default()
        };
        pick_rtr(&offer, r.rtr).is_some()
    }

    proptest! {
        /// Random configurations, depths, private data and stream splits:
        /// both outcomes agree (or the responder rejects for lack of a
        /// common RTR, and then both ends say so).
        #[test]
        fn prop_negotiation_agrees(
            icfg in arb_cfg(),
            rcfg in arb_cfg(),
            acc_pd in proptest::collection::vec(any::<u8>(), 0..40),
            acc_ird in 0u16..300,
            acc_ord in 0u16..300,
            sizes in proptest::collection::vec(1usize..64, 1..20),
        ) {
            let icfg = if icfg.p2p && icfg.rev == 2 && !icfg.rtr.write && !icfg.rtr.send && icfg.ord == 0 {
                MpaConfig { ord: 1, ..icfg }
            } else {
                icfg
            };
            let decision = Decision::Accept { pd: acc_pd, ird: acc_ird, ord: acc_ord };
            let r = run(icfg.clone(), rcfg.clone(), &decision, &mut Splitter::new(sizes));
            if rtr_compatible(&icfg, &rcfg) {
                check_pair(&icfg, &rcfg, &decision, &r);
            } else {
                prop_assert_eq!(r.responder, Some(Outcome::Failed(MpaError::NoMatchingRtr)));
                prop_assert_eq!(r.initiator, Some(Outcome::Rejected { private_data: vec![] }));
            }
        }

        /// Garbage in any split never panics, never consumes more than it
        /// was given, and never consumes past a frame.
        #[test]
        fn prop_garbage_is_safe(
            data in proptest::collection::vec(any::<u8>(), 0..700),
            prefix_key in 0u8..3,
            sizes in proptest::collection::vec(1usize..80, 1..10),
        ) {
            let mut data = data;
            if data.len() >= 16 {
                match prefix_key {
                    0 => data[..16].copy_from_slice(&KEY_REQUEST),
                    1 => data[..16].copy_from_slice(&KEY_REPLY),
                    _ => {}
                }
            }
            let now = Instant::now();
            let mut res = Responder::new(MpaConfig::default(), now).unwrap();
            let mut ini = Initiator::new(MpaConfig::default(), now).unwrap();
            for side in 0..2 {
                let mut split = Splitter::new(sizes.clone());
                let mut at = 0;
                let mut total = 0;
                while at < data.len() {
                    let n = split.next().min(data.len() - at);
                    let got = if side == 0 {
                        res.handle_bytes(&data[at..at + n], now)
                    } else {
                        ini.handle_bytes(&data[at..at + n], now)
                    };
                    match got {
                        Ok(c) => { prop_assert!(c <= n); total += c; }
                        Err(_) => break,
                    }
                    at += n;
                }
                if let Some(len) = frame_len(&data) {
                    prop_assert!(total <= len);
                }
            }
            if res.state() == State::RequestReceived {
                prop_assert!(res.accept(b"x", 4, 4).is_ok());
            }
            let _ = res.poll_outcome();
            let _ = ini.poll_outcome();
        }
    }

    // ---------------------------------------------------------------
    // Private data and the softrdma trailer.
    // ---------------------------------------------------------------

    fn pd(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn private_data_round_trip_at_the_siw_limit() {
        // 4 (word) + 244 + 8 (trailer) = 256: the trailer still fits.
        for (len, softrdma) in [
            (0, true),
            (1, true),
            (244, true),
            (245, false),
            (252, false),
        ] {
            let icfg = MpaConfig {
                private_data: pd(len),
                ..MpaConfig::default()
            };
            let rcfg = MpaConfig::default();
            let decision = Decision::Accept {
                pd: pd(len).into_iter().rev().collect(),
                ird: 8,
                ord: 8,
            };
            let r = run(
                icfg.clone(),
                rcfg.clone(),
                &decision,
                &mut Splitter::seeded(len as u64, 50),
            );
            check_pair(&icfg, &rcfg, &decision, &r);
            assert_eq!(
                negotiated(&r.initiator).peer_is_softrdma,
                softrdma,
                "len {len}"
            );
            let pd_len = MpaFrame::new_unchecked(&r.request_bytes[..]).pd_length();
            assert_eq!(usize::from(pd_len), 4 + len + if softrdma { 8 } else { 0 });
            assert!(siw_accepts_request(&r.request_bytes).is_ok());
        }
        // 253 octets do not fit next to the word.
        let icfg = MpaConfig {
            private_data: pd(253),
            ..MpaConfig::default()
        };
        assert_eq!(
            Initiator::new(icfg, Instant::now()).unwrap_err(),
            MpaError::UlpPrivateDataTooLong { len: 253, max: 252 }
        );
        // Rev 1 has no word: 256 octets fit (without the trailer).
        let icfg = MpaConfig {
            rev: 1,
            private_data: pd(256),
            ..MpaConfig::default()
        };
        let r = run(
            icfg.clone(),
            MpaConfig::default(),
            &default_accept(),
            &mut Splitter::seeded(3, 100),
        );
        check_pair(&icfg, &MpaConfig::default(), &default_accept(), &r);
    }

    #[test]
    fn private_data_round_trip_with_the_limit_raised_to_512() {
        let big = |ext: bool, len: usize| MpaConfig {
            max_private_data: 512,
            softrdma_ext: ext,
            private_data: pd(len),
            ..MpaConfig::default()
        };
        for (ext, len) in [(true, 500), (false, 508), (true, 508)] {
            let (icfg, rcfg) = (big(ext, len), big(ext, 0));
            let decision = Decision::Accept {
                pd: pd(508),
                ird: 1,
                ord: 1,
            };
            let r = run(
                icfg.clone(),
                rcfg.clone(),
                &decision,
                &mut Splitter::seeded(len as u64, 200),
            );
            check_pair(&icfg, &rcfg, &decision, &r);
            assert_eq!(MpaFrame::new_unchecked(&r.reply_bytes[..]).pd_length(), 512);
        }
        assert_eq!(
            Initiator::new(big(true, 509), Instant::now()).unwrap_err(),
            MpaError::UlpPrivateDataTooLong { len: 509, max: 508 }
        );
        assert!(matches!(
            Initiator::new(
                MpaConfig {
                    max_private_data: 513,
                    ..MpaConfig::default()
                },
                Instant::now()
            ),
            Err(MpaError::InvalidConfig(_))
        ));
        // A 512-octet Request to a responder with the siw limit: it reads
        // the frame and rejects it.
        let r = run(
            big(false, 508),
            MpaConfig::default(),
            &default_accept(),
            &mut Splitter::seeded(9, 64),
        );
        assert_eq!(
            r.responder,
            Some(Outcome::Failed(MpaError::PrivateDataTooLong {
                len: 512,
                max: 256
            }))
        );
        assert_eq!(
            r.initiator,
            Some(Outcome::Rejected {
                private_data: vec![]
            })
        );
        assert!(r.i2r_left.is_empty());
    }

    #[test]
    fn accept_with_too_much_private_data_can_be_retried() {
        let now = Instant::now();
        let mut res = Responder::new(MpaConfig::default(), now).unwrap();
        res.handle_bytes(&hex(SIW_DEFAULT_REQUEST), now).unwrap();
        assert_eq!(
            res.accept(&pd(253), 1, 1),
            Err(MpaError::UlpPrivateDataTooLong { len: 253, max: 252 })
        );
        assert_eq!(res.state(), State::RequestReceived);
        assert_eq!(
            res.reject(&pd(253)).unwrap_err(),
            MpaError::UlpPrivateDataTooLong { len: 253, max: 252 }
        );
        res.accept(&pd(252), 1, 1).unwrap();
        let reply = res.poll_transmit().unwrap().to_vec();
        assert_eq!(MpaFrame::new_unchecked(&reply[..]).pd_length(), 256);
        assert!(siw_accepts_reply(&hex(SIW_DEFAULT_REQUEST), &reply).is_ok());
        assert_eq!(res.accept(b"", 1, 1), Err(MpaError::InvalidState));
    }

    #[test]
    fn softrdma_discovery_both_ways() {
        for (ext_i, ext_r) in [(true, true), (true, false), (false, true), (false, false)] {
            let icfg = MpaConfig {
                softrdma_ext: ext_i,
                private_data: b"hello".to_vec(),
                ..MpaConfig::default()
            };
            let rcfg = MpaConfig {
                softrdma_ext: ext_r,
                ..MpaConfig::default()
            };
            let decision = default_accept();
            let r = run(
                icfg.clone(),
                rcfg.clone(),
                &decision,
                &mut Splitter::seeded(5, 11),
            );
            check_pair(&icfg, &rcfg, &decision, &r);
            let (i, s) = (negotiated(&r.initiator), negotiated(&r.responder));
            let both = ext_i && ext_r;
            assert_eq!((i.peer_is_softrdma, s.peer_is_softrdma), (both, both));
            // The trailer is on the wire only where announced.
            let req_pd = MpaFrame::new_unchecked(&r.request_bytes[..])
                .private_data()
                .to_vec();
            let rep_pd = MpaFrame::new_unchecked(&r.reply_bytes[..])
                .private_data()
                .to_vec();
            assert_eq!(SoftrdmaTrailer::split(&req_pd).is_some(), ext_i);
            assert_eq!(SoftrdmaTrailer::split(&rep_pd).is_some(), both);
            if ext_i && !ext_r {
                // A plain responder's ULP sees the 8 octets, like siw's would.
                assert_eq!(
                    s.peer_private_data,
                    b"hello\x73\x52\x44\x4d\x41\x01\x00\x03"
                );
            } else {
                assert_eq!(s.peer_private_data, b"hello");
            }
            // Only toward a non-softrdma responder is the first FPDU held off.
            let expect = if both {
                r.now
            } else {
                r.now + DEFAULT_RTR_HOLDOFF
            };
            assert_eq!(i.first_fpdu_not_before, Some(expect));
        }
    }

    #[test]
    fn trailer_layout() {
        assert_eq!(SoftrdmaTrailer::OURS.to_bytes(), *b"sRDMA\x01\x00\x03");
        let (ulp, t) = SoftrdmaTrailer::split(b"abcsRDMA\x07\x80\x01").unwrap();
        assert_eq!(ulp, b"abc");
        assert_eq!(
            t,
            SoftrdmaTrailer {
                version: 7,
                flags: 0x8001
            }
        );
        assert_eq!(SoftrdmaTrailer::split(b"RDMA\x01\x00\x03"), None);
        assert_eq!(SoftrdmaTrailer::split(b"xRDMA\x01\x00\x03"), None);
        // A peer with unknown flags: only the known ones are agreed.
        let now = Instant::now();
        let mut res = Responder::new(MpaConfig::default(), now).unwrap();
        let mut body = word(IrdOrd::new(4, 4));
        body.extend_from_slice(b"sRDMA\x02\xff\xf1");
        res.handle_bytes(&raw(&KEY_REQUEST, 0x10, 2, &body), now)
            .unwrap();
        assert!(res.request().unwrap().peer_is_softrdma);
        assert!(res.request().unwrap().private_data.is_empty());
        res.accept(b"", 4, 4).unwrap();
        res.transmitted(res.poll_transmit().unwrap().len());
        let n = match res.poll_outcome() {
            Some(Outcome::Negotiated(n)) => n,
            other => panic!("{other:?}"),
        };
        assert!(n.peer_is_softrdma);
        assert_eq!(n.ext_flags, EXT_ATOMICS);
    }

    // ---------------------------------------------------------------
    // Rejections.
    // ---------------------------------------------------------------

    #[test]
    fn reject_with_private_data() {
        for rev in [1, 2] {
            let icfg = MpaConfig {
                rev,
                private_data: b"let me in".to_vec(),
                ..MpaConfig::default()
            };
            let rcfg = MpaConfig::default();
            let decision = Decision::Reject(b"go away".to_vec());
            let r = run(icfg, rcfg, &decision, &mut Splitter::seeded(77, 5));
            assert_eq!(
                r.initiator,
                Some(Outcome::Rejected {
                    private_data: b"go away".to_vec()
                })
            );
            assert_eq!(
                r.responder,
                Some(Outcome::Rejected {
                    private_data: b"go away".to_vec()
                })
            );
            assert_eq!(r.request.unwrap().private_data, b"let me in");
            let (rep, _) = MpaRepr::parse(&r.reply_bytes).unwrap();
            assert!(rep.reject);
            assert_eq!(rep.rev, rev);
            assert_eq!(rep.ird_ord.is_some(), rev == 2);
            assert_eq!(rep.private_data, b"go away");
        }
    }

    #[test]
    fn no_matching_rtr_is_rejected_by_the_responder() {
        let icfg = MpaConfig {
            rtr: RtrSupport {
                write: false,
                read: false,
                send: true,
            },
            ..MpaConfig::default()
        };
        let rcfg = MpaConfig {
            rtr: RtrSupport {
                write: true,
                read: false,
                send: false,
            },
            ..MpaConfig::default()
        };
        let r = run(icfg, rcfg, &default_accept(), &mut Splitter::seeded(1, 9));
        assert_eq!(r.responder, Some(Outcome::Failed(MpaError::NoMatchingRtr)));
        assert_eq!(
            MpaError::NoMatchingRtr.terminate_cause(),
            Some(TerminateCause::MpaNoMatchingRtr)
        );
        assert_eq!(TerminateCause::MpaNoMatchingRtr.to_raw(), (2, 0, 7));
        assert_eq!(
            r.initiator,
            Some(Outcome::Rejected {
                private_data: vec![]
            })
        );
        let (rep, _) = MpaRepr::parse(&r.reply_bytes).unwrap();
        assert!(rep.reject && rep.ird_ord.is_some());
    }

    #[test]
    fn responder_rtr_preference_and_decline() {
        let now = Instant::now();
        let request = |w: IrdOrd| raw(&KEY_REQUEST, 0x10, 2, &word(w));
        let p2p = |write, read, send, ord| IrdOrd {
            ird: 4,
            ord,
            p2p: true,
            rtr_write: write,
            rtr_read: read,
            rtr_send: send,
        };
        for (offer, expect) in [
            (p2p(true, true, true, 1), Rtr::ZeroLengthWrite),
            (p2p(false, true, true, 1), Rtr::ZeroLengthRead),
            (p2p(false, false, true, 1), Rtr::ZeroLengthSend),
            // A Read RTR offered with ORD 0: our IRD is raised to 1 for it.
            (p2p(false, true, false, 0), Rtr::ZeroLengthRead),
        ] {
            let mut res = Responder::new(MpaConfig::default(), now).unwrap();
            res.handle_bytes(&request(offer), now).unwrap();
            assert_eq!(res.request().unwrap().rtr, expect);
            res.accept(b"", 0, 0).unwrap();
            let reply = res.poll_transmit().unwrap().to_vec();
            let w = MpaFrame::new_unchecked(&reply[..]).ird_ord().unwrap();
            assert_eq!(w, expect.word(w.ird, w.ord));
            if expect == Rtr::ZeroLengthRead {
                assert!(w.ird >= 1);
            }
        }
        // A responder that does not do P2P declines it.
        let rcfg = MpaConfig {
            p2p: false,
            ..MpaConfig::default()
        };
        let mut res = Responder::new(rcfg, now).unwrap();
        res.handle_bytes(&request(p2p(true, true, true, 1)), now)
            .unwrap();
        assert_eq!(res.request().unwrap().rtr, Rtr::InitiatorSendsFirst);
        res.accept(b"", 2, 2).unwrap();
        let reply = res.poll_transmit().unwrap().to_vec();
        let w = MpaFrame::new_unchecked(&reply[..]).ird_ord().unwrap();
        assert!(!w.p2p && !w.rtr_write && !w.rtr_read && !w.rtr_send);
    }

    // ---------------------------------------------------------------
    // Bad frames.
    // ---------------------------------------------------------------

    /// Feeds `frame` to a fresh responder in one call.
    fn responder_fed(cfg: MpaConfig, frame: &[u8]) -> (Responder, Result<usize, MpaError>) {
        let now = Instant::now();
        let mut res = Responder::new(cfg, now).unwrap();
        let got = res.handle_bytes(frame, now);
        (res, got)
    }

    #[test]
    fn responder_bad_frames_without_reply() {
        let cases: [(Vec<u8>, MpaError); 4] = [
            (
                raw(&KEY_REPLY, 0x10, 2, &word(IrdOrd::new(1, 1))),
                MpaError::BadKey,
            ),
            // Garbage key, PD_Length 0xFFFF: fails after 20 octets.
            (
                [b"GET / HTTP/1.1\r\n".as_slice(), &[0x10, 2, 0xFF, 0xFF]].concat(),
                MpaError::BadKey,
            ),
            (
                raw(&KEY_REQUEST, 0x10, 3, &word(IrdOrd::new(1, 1))),
                MpaError::UnsupportedRevision(3),
            ),
            (
                raw(&KEY_REQUEST, 0x00, 1, &[0u8; 600])[..20].to_vec(),
                MpaError::PrivateDataTooLong { len: 600, max: 512 },
            ),
        ];
        for (frame, err) in cases {
            let (mut res, got) = responder_fed(MpaConfig::default(), &frame[..20]);
            assert_eq!(got, Err(err));
            assert_eq!(res.state(), State::Failed);
            assert_eq!(res.poll_transmit(), None, "no Reply for {err:?}");
            assert_eq!(res.poll_outcome(), Some(Outcome::Failed(err)));
            assert_eq!(
                err.terminate_cause(),
                Some(TerminateCause::MpaInvalidRequest)
            );
            assert_eq!(TerminateCause::MpaInvalidRequest.to_raw(), (2, 0, 4));
            // Further input gets the same answer.
            assert_eq!(res.handle_bytes(b"more", Instant::now()), Err(err));
            assert_eq!(res.poll_timeout(), None);
        }
    }

    #[test]
    fn responder_bad_frames_with_rejecting_reply() {
        let cases = [
            // R=1 in a Request.
            (
                raw(&KEY_REQUEST, 0x30, 2, &word(IrdOrd::new(1, 1))),
                MpaError::InvalidFrame("R set in a Request"),
            ),
            // Enhanced flag, PD_Length 2: siw rejects this the same way.
            (
                raw(&KEY_REQUEST, 0x10, 2, &[0, 1]),
                MpaError::InvalidFrame("enhanced flag without IRD/ORD word"),
            ),
            // 300 octets: below the RFC's 512, above our 256.
            (
                raw(&KEY_REQUEST, 0x00, 1, &[7u8; 300]),
                MpaError::PrivateDataTooLong { len: 300, max: 256 },
            ),
        ];
        for (frame, err) in cases {
            let (mut res, got) = responder_fed(MpaConfig::default(), &frame);
            assert_eq!(got, Err(err));
            let reply = res.poll_transmit().unwrap().to_vec();
            assert_eq!(res.poll_outcome(), None, "outcome waits for the Reply");
            let f = MpaFrame::new_checked(&reply[..]).unwrap();
            assert_eq!(f.kind(), Some(FrameKind::Reply));
            assert!(f.reject());
            assert_eq!(f.rev(), MpaFrame::new_unchecked(&frame[..]).rev());
            res.transmitted(reply.len() - 1);
            assert_eq!(res.poll_outcome(), None);
            res.transmitted(1);
            assert_eq!(res.poll_outcome(), Some(Outcome::Failed(err)));
            assert_eq!(res.poll_outcome(), None, "handed out once");
        }
    }

    #[test]
    fn responder_lenient_cases() {
        // Rev 1 with the (Rev-2-only) enhanced bit: reserved, ignored.
        let (res, got) = responder_fed(MpaConfig::default(), &raw(&KEY_REQUEST, 0x10, 1, b"abc"));
        assert_eq!(got, Ok(23));
        let req = res.request().unwrap();
        assert_eq!(
            (req.rev, req.ird_ord, &req.private_data[..]),
            (1, None, &b"abc"[..])
        );
        // Reserved bits (siw's GSO bit among them) are ignored.
        let (res, _) = responder_fed(
            MpaConfig::default(),
            &raw(&KEY_REQUEST, 0x1F, 2, &word(IrdOrd::new(2, 3))),
        );
        assert_eq!(res.request().unwrap().ird_ord, Some(IrdOrd::new(2, 3)));
        // M=1: we support markers, so it is accepted.
        let (mut res, _) = responder_fed(
            MpaConfig::default(),
            &raw(&KEY_REQUEST, 0x90, 2, &word(IrdOrd::new(2, 3))),
        );
        assert!(res.request().unwrap().markers);
        res.accept(b"", 4, 4).unwrap();
        let reply = res.poll_transmit().unwrap().to_vec();
        assert!(!MpaFrame::new_unchecked(&reply[..]).markers());
        res.transmitted(reply.len());
        let n = match res.poll_outcome() {
            Some(Outcome::Negotiated(n)) => n,
            other => panic!("{other:?}"),
        };
        assert!(n.markers_tx && !n.markers_rx);
        // Rev 0 (pre-RFC), which siw still accepts: answered with Rev 0.
        let (mut res, _) = responder_fed(MpaConfig::default(), &raw(&KEY_REQUEST, 0x40, 0, b"old"));
        res.accept(b"new", 4, 4).unwrap();
        let reply = res.poll_transmit().unwrap().to_vec();
        assert_eq!(reply, raw(&KEY_REPLY, 0x40, 0, b"new"));
        // A Rev-2 Request without the enhanced flag gets no word back.
        let (mut res, _) = responder_fed(MpaConfig::default(), &raw(&KEY_REQUEST, 0x00, 2, b"x"));
        res.accept(b"y", 4, 4).unwrap();
        assert_eq!(res.poll_transmit().unwrap(), raw(&KEY_REPLY, 0x40, 2, b"y"));
        // A Rev-1 responder answers a Rev-2 enhanced Request with Rev 1.
        let rcfg = MpaConfig {
            rev: 1,
            crc: false,
            ..MpaConfig::default()
        };
        let (mut res, _) = responder_fed(rcfg, &hex(SIW_P2P_REQUEST));
        assert_eq!(res.request().unwrap().rtr, Rtr::InitiatorSendsFirst);
        res.accept(b"", 4, 4).unwrap();
        assert_eq!(res.poll_transmit().unwrap(), raw(&KEY_REPLY, 0x40, 1, b""));
    }

    /// Feeds `reply` to an initiator built from `cfg`.
    fn initiator_fed(cfg: MpaConfig, reply: &[u8]) -> (Initiator, Result<usize, MpaError>) {
        let now = Instant::now();
        let mut ini = Initiator::new(cfg, now).unwrap();
        let n = ini.poll_transmit().unwrap().len();
        ini.transmitted(n);
        let got = ini.handle_bytes(reply, now);
        (ini, got)
    }

    fn plain() -> MpaConfig {
        MpaConfig {
            softrdma_ext: false,
            ..MpaConfig::default()
        }
    }

    #[test]
    fn initiator_bad_replies() {
        let p2p = |write, read, send, ird, ord| IrdOrd {
            ird,
            ord,
            p2p: true,
            rtr_write: write,
            rtr_read: read,
            rtr_send: send,
        };
        let rev1 = MpaConfig { rev: 1, ..plain() };
        let no_p2p = MpaConfig {
            p2p: false,
            ..plain()
        };
        let write_only = MpaConfig {
            rtr: RtrSupport {
                write: true,
                read: false,
                send: false,
            },
            ..plain()
        };
        let cases: Vec<(MpaConfig, Vec<u8>, MpaError, bool)> = vec![
            (
                plain(),
                raw(&KEY_REQUEST, 0x10, 2, &word(IrdOrd::new(1, 1))),
                MpaError::BadKey,
                false,
            ),
            (
                plain(),
                raw(&KEY_REPLY, 0x10, 3, &word(IrdOrd::new(1, 1))),
                MpaError::UnsupportedRevision(3),
                false,
            ),
            (
                plain(),
                raw(&KEY_REPLY, 0x00, 2, &[0; 300])[..20].to_vec(),
                MpaError::PrivateDataTooLong { len: 300, max: 256 },
                false,
            ),
            (
                rev1,
                raw(&KEY_REPLY, 0x10, 2, &word(IrdOrd::new(1, 1))),
                MpaError::InvalidFrame("Reply Rev above the Request's"),
                false,
            ),
            (
                no_p2p,
                raw(&KEY_REPLY, 0x10, 2, &word(p2p(true, false, false, 1, 1))),
                MpaError::InvalidFrame("P2P accepted but not requested"),
                false,
            ),
            (
                plain(),
                raw(&KEY_REPLY, 0x10, 2, &[0, 1]),
                MpaError::InvalidFrame("enhanced flag without IRD/ORD word"),
                false,
            ),
            (
                plain(),
                raw(&KEY_REPLY, 0x10, 2, &word(p2p(false, false, false, 1, 1))),
                MpaError::NoMatchingRtr,
                true,
            ),
            (
                write_only,
                raw(&KEY_REPLY, 0x10, 2, &word(p2p(false, true, false, 1, 1))),
                MpaError::NoMatchingRtr,
                true,
            ),
            (
                plain(),
                raw(&KEY_REPLY, 0x50, 2, &word(p2p(true, false, false, 1, 200))),
                MpaError::InsufficientIrd {
                    needed: 200,
                    available: 128,
                },
                true,
            ),
        ];
        for (cfg, reply, err, framing) in cases {
            let (mut ini, got) = initiator_fed(cfg, &reply);
            assert_eq!(got, Err(err));
            assert_eq!(ini.state(), State::Failed);
            assert_eq!(ini.terminate_framing().is_some(), framing, "{err:?}");
            assert!(err.terminate_cause().is_some());
            assert_eq!(ini.poll_outcome(), Some(Outcome::Failed(err)));
        }
        assert_eq!(
            MpaError::InsufficientIrd {
                needed: 2,
                available: 1
            }
            .terminate_cause(),
            Some(TerminateCause::MpaInsufficientIrd)
        );
        // The framing a Terminate would use after a bad RTR choice.
        let (ini, _) = initiator_fed(
            plain(),
            &raw(&KEY_REPLY, 0x90, 2, &word(p2p(false, false, false, 1, 1))),
        );
        assert_eq!(
            ini.terminate_framing(),
            Some(Framing {
                crc: true,
                markers_tx: true,
                markers_rx: false
            })
        );
    }

    #[test]
    fn initiator_lenient_replies() {
        let outcome = |cfg: MpaConfig, reply: Vec<u8>| {
            let (mut ini, got) = initiator_fed(cfg, &reply);
            assert_eq!(got, Ok(reply.len()));
            ini.poll_outcome().unwrap()
        };
        // siw's automatic reject: enhanced + R, PD_Length 0.
        assert_eq!(
            outcome(plain(), raw(&KEY_REPLY, 0x30, 2, b"")),
            Outcome::Rejected {
                private_data: vec![]
            }
        );
        // A Rev-1 answer to our Rev-2 Request: no word, no P2P.
        let o = outcome(plain(), raw(&KEY_REPLY, 0x00, 1, b"pd"));
        let Outcome::Negotiated(n) = o else { panic!() };
        assert_eq!(
            (n.rev, n.enhanced, n.rtr),
            (1, false, Rtr::InitiatorSendsFirst)
        );
        assert_eq!((n.ird, n.ord, n.crc), (16, 16, true));
        assert_eq!(n.peer_private_data, b"pd");
        // Rev 2 without the enhanced flag: the same.
        let Outcome::Negotiated(n) = outcome(plain(), raw(&KEY_REPLY, 0x00, 2, b"")) else {
            panic!()
        };
        assert!(!n.enhanced);
        // The responder declines P2P: RFC 5044's rule.
        let Outcome::Negotiated(n) =
            outcome(plain(), raw(&KEY_REPLY, 0x10, 2, &word(IrdOrd::new(3, 2))))
        else {
            panic!()
        };
        assert_eq!((n.rtr, n.ird, n.ord), (Rtr::InitiatorSendsFirst, 2, 3));
        // M=1 in the Reply: we insert markers.
        let Outcome::Negotiated(n) =
            outcome(plain(), raw(&KEY_REPLY, 0x90, 2, &word(IrdOrd::new(3, 2))))
        else {
            panic!()
        };
        assert!(n.markers_tx && !n.markers_rx && n.crc);
        // Several RTR bits: the preferred one among those we offered.
        let w = IrdOrd {
            p2p: true,
            rtr_read: true,
            rtr_send: true,
            ..IrdOrd::new(1, 1)
        };
        let Outcome::Negotiated(n) = outcome(plain(), raw(&KEY_REPLY, 0x10, 2, &word(w))) else {
            panic!()
        };
        assert_eq!(n.rtr, Rtr::ZeroLengthRead);
        // Relaxed: a Reply ORD above our IRD but within max_ird raises it.
        let Outcome::Negotiated(n) = outcome(
            plain(),
            raw(&KEY_REPLY, 0x10, 2, &word(IrdOrd::new(100, 100))),
        ) else {
            panic!()
        };
        assert_eq!((n.ird, n.ord), (100, 16));
        // A peer's trailer is not looked for if we did not send ours.
        let mut pd = word(IrdOrd::new(1, 1));
        pd.extend_from_slice(b"sRDMA\x01\x00\x03");
        let Outcome::Negotiated(n) = outcome(plain(), raw(&KEY_REPLY, 0x10, 2, &pd)) else {
            panic!()
        };
        assert!(!n.peer_is_softrdma);
        assert_eq!(n.peer_private_data, b"sRDMA\x01\x00\x03");
    }

    #[test]
    fn config_errors() {
        let now = Instant::now();
        for rev in [0, 3] {
            let c = MpaConfig {
                rev,
                ..MpaConfig::default()
            };
            assert!(matches!(
                Initiator::new(c.clone(), now),
                Err(MpaError::InvalidConfig(_))
            ));
            assert!(matches!(
                Responder::new(c, now),
                Err(MpaError::InvalidConfig(_))
            ));
        }
        let c = MpaConfig {
            rtr: RtrSupport {
                write: false,
                read: true,
                send: false,
            },
            ord: 0,
            ..MpaConfig::default()
        };
        assert!(matches!(
            Initiator::new(c.clone(), now),
            Err(MpaError::InvalidConfig(_))
        ));
        // Without P2P the same is fine, and so is Rev 1.
        assert!(Initiator::new(
            MpaConfig {
                p2p: false,
                ..c.clone()
            },
            now
        )
        .is_ok());
        assert!(Initiator::new(MpaConfig { rev: 1, ..c }, now).is_ok());
        let mut res = Responder::new(MpaConfig::default(), now).unwrap();
        assert_eq!(res.accept(b"", 1, 1), Err(MpaError::InvalidState));
        assert_eq!(res.reject(b""), Err(MpaError::InvalidState));
        assert_eq!(MpaError::InvalidState.terminate_cause(), None);
        assert!(!MpaError::Timeout.to_string().is_empty());
    }

    // ---------------------------------------------------------------
    // Stream handling, transmit, timeouts.
    // ---------------------------------------------------------------

    #[test]
    fn consumes_only_the_peers_frame() {
        let now = Instant::now();
        // The initiator: siw's Reply and the responder's first FPDU octets
        // in one read.
        let mut ini = Initiator::new(plain(), now).unwrap();
        let stream = [hex(SIW_DEFAULT_REPLY), hex(SIW_DEFAULT_REPLY_NEXT)].concat();
        assert_eq!(ini.handle_bytes(&stream, now), Ok(24));
        assert_eq!(ini.handle_bytes(&stream[24..], now), Ok(0));
        assert_eq!(ini.state(), State::Negotiated);
        // The outcome waits until the Request is out.
        assert_eq!(ini.poll_outcome(), None);
        ini.transmitted(ini.poll_transmit().unwrap().len());
        assert!(matches!(ini.poll_outcome(), Some(Outcome::Negotiated(_))));
        // The responder, one octet at a time, with octets behind the Request.
        let mut res = Responder::new(MpaConfig::default(), now).unwrap();
        let stream = [hex(SIW_P2P_REQUEST), b"FPDU".to_vec()].concat();
        let mut used = 0;
        for b in stream.chunks(1) {
            used += res.handle_bytes(b, now).unwrap();
        }
        assert_eq!(used, 24);
        assert_eq!(res.state(), State::RequestReceived);
        assert_eq!(res.handle_bytes(b"more", now), Ok(0));
    }

    #[test]
    fn partial_writes_resume() {
        let now = Instant::now();
        let mut ini = Initiator::new(MpaConfig::default(), now).unwrap();
        let whole = ini.poll_transmit().unwrap().to_vec();
        let mut out = Vec::new();
        while let Some(p) = ini.poll_transmit() {
            let n = p.len().min(3);
            out.extend_from_slice(&p[..n]);
            ini.transmitted(n);
        }
        assert_eq!(out, whole);
        assert_eq!(ini.poll_transmit(), None);
        ini.transmitted(0);
    }

    #[test]
    fn timeouts() {
        let now = Instant::now();
        let short = MpaConfig {
            timeout: Duration::from_millis(50),
            ..MpaConfig::default()
        };
        let mut ini = Initiator::new(MpaConfig::default(), now).unwrap();
        assert_eq!(ini.poll_timeout(), Some(now + DEFAULT_TIMEOUT));
        ini.handle_timeout(now + Duration::from_millis(9_999));
        assert_eq!(ini.state(), State::AwaitingPeer);
        ini.handle_timeout(now + DEFAULT_TIMEOUT);
        assert_eq!(ini.state(), State::Failed);
        assert_eq!(
            ini.poll_transmit(),
            None,
            "nothing more to send after a failure"
        );
        assert_eq!(ini.poll_outcome(), Some(Outcome::Failed(MpaError::Timeout)));
        assert_eq!(ini.poll_timeout(), None);
        assert_eq!(MpaError::Timeout.terminate_cause(), None);
        assert_eq!(ini.terminate_framing(), None);
        assert_eq!(
            ini.handle_bytes(&hex(SIW_DEFAULT_REPLY), now),
            Err(MpaError::Timeout)
        );

        let mut res = Responder::new(short.clone(), now).unwrap();
        assert_eq!(res.poll_timeout(), Some(now + Duration::from_millis(50)));
        // Half a Request does not stop the timer.
        res.handle_bytes(&hex(SIW_DEFAULT_REQUEST)[..10], now)
            .unwrap();
        res.handle_timeout(now + Duration::from_millis(50));
        assert_eq!(res.poll_outcome(), Some(Outcome::Failed(MpaError::Timeout)));

        // Once the Request is in, the responder's timer stops; once the
        // Reply is in, the initiator's does.
        let mut res = Responder::new(short.clone(), now).unwrap();
        res.handle_bytes(&hex(SIW_DEFAULT_REQUEST), now).unwrap();
        assert_eq!(res.poll_timeout(), None);
        res.handle_timeout(now + Duration::from_secs(60));
        assert_eq!(res.state(), State::RequestReceived);
        let (mut ini, _) = initiator_fed(short, &hex(SIW_DEFAULT_REPLY));
        assert_eq!(ini.poll_timeout(), None);
        ini.handle_timeout(now + Duration::from_secs(60));
        assert_eq!(ini.state(), State::Negotiated);
        // A timeout too large for Instant: no deadline.
        let ini = Initiator::new(
            MpaConfig {
                timeout: Duration::MAX,
                ..MpaConfig::default()
            },
            now,
        )
        .unwrap();
        assert_eq!(ini.poll_timeout(), None);
    }

    // ---------------------------------------------------------------
    // Golden frames: the wire vectors and real siw.
    // ---------------------------------------------------------------

    #[test]
    fn golden_vectors_request_gets_golden_reply() {
        let (mut res, got) = responder_fed(MpaConfig::default(), &hex(GOLDEN_REQUEST));
        assert_eq!(got, Ok(33));
        let req = res.request().unwrap().clone();
        assert_eq!(req.private_data, b"ulp-hello");
        assert_eq!(req.ird_ord, Some(IrdOrd::new(16, 16)));
        res.accept(b"ulp-ok", 16, 16).unwrap();
        assert_eq!(res.poll_transmit().unwrap(), hex(GOLDEN_REPLY));
        // And the golden Reply, given to an initiator whose Request is the
        // golden Request.
        let icfg = MpaConfig {
            p2p: false,
            softrdma_ext: false,
            private_data: b"ulp-hello".to_vec(),
            ..MpaConfig::default()
        };
        let mut ini = Initiator::new(icfg, Instant::now()).unwrap();
        assert_eq!(ini.poll_transmit().unwrap(), hex(GOLDEN_REQUEST));
        ini.transmitted(33);
        ini.handle_bytes(&hex(GOLDEN_REPLY), Instant::now())
            .unwrap();
        let Some(Outcome::Negotiated(n)) = ini.poll_outcome() else {
            panic!()
        };
        assert_eq!(n.peer_private_data, b"ulp-ok");
        assert_eq!(
            (n.ird, n.ord, n.crc, n.rtr),
            (16, 16, true, Rtr::InitiatorSendsFirst)
        );
    }

    #[test]
    fn siw_default_request_gets_a_reply_siw_accepts() {
        let request = hex(SIW_DEFAULT_REQUEST);
        assert_eq!(request[16], 0x10);
        // Our defaults (CRC wanted, extension on, IRD/ORD 16).
        let (mut res, got) = responder_fed(MpaConfig::default(), &request);
        assert_eq!(got, Ok(24));
        let req = res.request().unwrap();
        assert_eq!((req.rev, req.crc, req.markers), (2, false, false));
        assert_eq!(req.ird_ord, Some(IrdOrd::new(1, 1)));
        assert!(req.private_data.is_empty() && !req.peer_is_softrdma);
        assert_eq!(req.rtr, Rtr::InitiatorSendsFirst);
        res.accept(b"", 16, 16).unwrap();
        let reply = res.poll_transmit().unwrap().to_vec();
        assert_eq!(siw_accepts_reply(&request, &reply), Ok(()));
        let f = MpaFrame::new_checked(&reply[..]).unwrap();
        assert_eq!((f.flags(), f.rev(), f.pd_length()), (0x50, 2, 4));
        // IRD raised to 16 (>= siw's ORD 1), ORD lowered to siw's IRD 1.
        assert_eq!(f.ird_ord(), Some(IrdOrd::new(16, 1)));
        res.transmitted(reply.len());
        let Some(Outcome::Negotiated(n)) = res.poll_outcome() else {
            panic!()
        };
        assert_eq!(
            (n.crc, n.ird, n.ord, n.rtr),
            (true, 16, 1, Rtr::InitiatorSendsFirst)
        );
        assert!(!n.peer_is_softrdma && !n.markers_tx && !n.markers_rx);

        // Configured like siw (no CRC, IRD/ORD 1): byte-identical to siw's
        // own Reply.
        let rcfg = MpaConfig {
            crc: false,
            ..MpaConfig::default()
        };
        let (mut res, _) = responder_fed(rcfg, &request);
        res.accept(b"", 1, 1).unwrap();
        assert_eq!(res.poll_transmit().unwrap(), hex(SIW_DEFAULT_REPLY));
    }

    #[test]
    fn siw_p2p_request_gets_siws_own_reply() {
        let request = hex(SIW_P2P_REQUEST);
        let (mut res, _) = responder_fed(MpaConfig::default(), &request);
        let req = res.request().unwrap();
        assert!(req.crc);
        assert_eq!(req.rtr, Rtr::ZeroLengthWrite);
        res.accept(b"", 1, 1).unwrap();
        let reply = res.poll_transmit().unwrap().to_vec();
        assert_eq!(reply, hex(SIW_P2P_REPLY));
        assert_eq!(siw_accepts_reply(&request, &reply), Ok(()));
        res.transmitted(reply.len());
        let Some(Outcome::Negotiated(n)) = res.poll_outcome() else {
            panic!()
        };
        assert_eq!(
            (n.crc, n.rtr, n.ird, n.ord),
            (true, Rtr::ZeroLengthWrite, 1, 1)
        );
    }

    #[test]
    fn siw_p2p_reply_is_accepted_by_our_initiator() {
        let siw_like = MpaConfig {
            ird: 1,
            ord: 1,
            softrdma_ext: false,
            ..MpaConfig::default()
        };
        // We offer the Send RTR too; otherwise our Request is siw's.
        let ini = Initiator::new(siw_like.clone(), Instant::now()).unwrap();
        let mut expect = hex(SIW_P2P_REQUEST);
        expect[20] |= 0x40;
        assert_eq!(ini.poll_transmit().unwrap(), expect);
        assert_eq!(siw_accepts_request(&expect), Ok(()));
        let write_read = MpaConfig {
            rtr: RtrSupport {
                write: true,
                read: true,
                send: false,
            },
            ..siw_like.clone()
        };
        let ini = Initiator::new(write_read, Instant::now()).unwrap();
        assert_eq!(ini.poll_transmit().unwrap(), hex(SIW_P2P_REQUEST));

        for cfg in [siw_like, MpaConfig::default()] {
            let now = Instant::now();
            let mut ini = Initiator::new(cfg.clone(), now).unwrap();
            assert_eq!(siw_accepts_request(ini.poll_transmit().unwrap()), Ok(()));
            ini.transmitted(ini.poll_transmit().unwrap().len());
            assert_eq!(ini.handle_bytes(&hex(SIW_P2P_REPLY), now), Ok(24));
            let Some(Outcome::Negotiated(n)) = ini.poll_outcome() else {
                panic!()
            };
            assert_eq!((n.rev, n.enhanced, n.crc), (2, true, true));
            assert_eq!(n.rtr, Rtr::ZeroLengthWrite);
            assert_eq!((n.ird, n.ord), (1, 1));
            assert!(!n.markers_tx && !n.markers_rx && !n.peer_is_softrdma);
            assert!(n.peer_private_data.is_empty());
            assert_eq!(n.first_fpdu_not_before, Some(now + DEFAULT_RTR_HOLDOFF));
        }
        // siw's default (non-P2P) Reply to our default P2P Request: siw as
        // responder would echo P2P, but a declining Reply must work too.
        let (mut ini, got) = initiator_fed(MpaConfig::default(), &hex(SIW_DEFAULT_REPLY));
        assert_eq!(got, Ok(24));
        let Some(Outcome::Negotiated(n)) = ini.poll_outcome() else {
            panic!()
        };
        assert_eq!(
            (n.rtr, n.ird, n.ord, n.crc),
            (Rtr::InitiatorSendsFirst, 1, 1, true)
        );
    }
}
