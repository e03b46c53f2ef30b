//! RDMAP (RFC 5040) and its RFC 7306 extensions: opcodes, the
//! opcode-specific header parts, Terminate with its error tables, and
//! [`SegmentRepr`], the decoded DDP + RDMAP header of one segment that the
//! rest of softrdma works with.
//!
//! # RDMAP control octet (ULPDU octet 1)
//!
//! ```text
//!  bits 0-1 (0xC0)  RV, RDMAP version (1 = RFC 5040)
//!  bits 2-3 (0x30)  reserved: zero on send, ignored on receive
//!  bits 4-7 (0x0F)  opcode
//! ```
//!
//! # Header lengths (DDP header included)
//!
//! | message | T | length |
//! |---|---|---|
//! | RDMA Write, Read Response, Write-Record | 1 | 14 |
//! | Send (all four kinds) | 0 | 18 |
//! | Immediate Data (+SE) | 0 | 18 + 8 = 26 |
//! | Atomic Response | 0 | 18 + 12 = 30 |
//! | Read Request | 0 | 18 + 28 = 46 |
//! | Atomic Request | 0 | 18 + 52 = 70 |
//! | Terminate | 0 | 18 + 4 + (2 if M or D) + (14/18 if D) + (28 if R) |
//!
//! In datagram mode a tagged header grows by 8 with X, and any header by 4
//! with Q (the DQPN word sits between the DDP header and the RDMAP part).
//!
//! # What `SegmentRepr::parse` checks
//!
//! * DV = 1 and RV = 1, else [`Error::BadVersion`].
//! * Datagram mode: no bit of 0x0C, no X on an untagged segment, X present on
//!   a Read Response or Write-Record; else [`Error::Malformed`].
//! * For an opcode defined in the mode, the T bit matches the opcode's
//!   buffer model, else [`Error::Malformed`].
//! * The fixed header and the opcode-specific part are in the buffer, else
//!   [`Error::Truncated`].
//! * Read Request, Atomic Request, Atomic Response and Immediate Data are
//!   single-segment messages whose whole content is their header part: any
//!   octet after it is [`Error::Malformed`].
//! * Octets after a Terminate's attachments are left as payload, not an
//!   error (see [`TerminateRepr::parse`] for the siw case behind this).
//!
//! It does not reject opcodes the peer must answer with a Terminate
//! ("unexpected opcode": 0xC in stream mode, 0xD–0xF, RFC 7306 opcodes a QP
//! did not enable). Those parse as a plain tagged or untagged header with
//! [`RdmapBody::None`], so the protocol layer has what it needs to build the
//! Terminate and echo the header ([`EchoedHeader::from_segment`]).

use crate::ddp::{
    DdpHeader, DdpSegment, Mode, TaggedExt, DQPN_LEN, EXT_LEN, FLAG_Q, FLAG_T, FLAG_X,
};
use crate::ddp::{
    DDP_VERSION, DV_MASK, FLAG_L, RESERVED_MASK, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN,
};
use crate::field::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use crate::{Error, Result};

/// The RDMAP version this crate speaks (RV field; 1 = RFC 5040).
pub const RDMAP_VERSION: u8 = 1;
/// RDMAP control octet: RV.
pub const RV_MASK: u8 = 0xC0;
/// RDMAP control octet: reserved bits.
pub const RSVD_MASK: u8 = 0x30;
/// RDMAP control octet: opcode.
pub const OPCODE_MASK: u8 = 0x0F;

/// Length of the Read Request header part (after the untagged DDP header).
pub const READ_REQUEST_LEN: usize = 28;
/// Length of the Atomic Request header part (RFC 7306).
pub const ATOMIC_REQUEST_LEN: usize = 52;
/// Length of the Atomic Response header part (RFC 7306).
pub const ATOMIC_RESPONSE_LEN: usize = 12;
/// Length of the immediate data of an Immediate Data message (RFC 7306).
pub const IMMEDIATE_LEN: usize = 8;
/// Length of the Terminate Control word.
pub const TERMINATE_CONTROL_LEN: usize = 4;
/// Length of the DDP Segment Length field of a Terminate.
pub const TERMINATE_SEGMENT_LEN_LEN: usize = 2;
/// Length of the Terminated RDMAP header (the Read Request header part).
pub const TERMINATED_RDMAP_HEADER_LEN: usize = 28;
/// Longest header [`SegmentRepr::parse`] accepts in stream mode (a Terminate
/// with every attachment, or an Atomic Request).
pub const MAX_STREAM_HEADER_LEN: usize = 70;
/// Longest header in datagram mode (the stream maximum plus a DQPN word).
pub const MAX_HEADER_LEN: usize = MAX_STREAM_HEADER_LEN + DQPN_LEN;

crate::open_enum! {
    /// RDMAP opcode (low 4 bits of the RDMAP control octet).
    pub enum Opcode(u8) {
        /// RDMA Write (tagged).
        RdmaWrite = 0x0,
        /// RDMA Read Request (untagged, QN 1).
        ReadRequest = 0x1,
        /// RDMA Read Response (tagged).
        ReadResponse = 0x2,
        /// Send (untagged, QN 0).
        Send = 0x3,
        /// Send with Invalidate.
        SendInvalidate = 0x4,
        /// Send with Solicited Event.
        SendSe = 0x5,
        /// Send with Solicited Event and Invalidate.
        SendSeInvalidate = 0x6,
        /// Terminate (untagged, QN 2).
        Terminate = 0x7,
        /// Immediate Data (RFC 7306, untagged, QN 0).
        ImmediateData = 0x8,
        /// Immediate Data with Solicited Event (RFC 7306).
        ImmediateDataSe = 0x9,
        /// Atomic Request (RFC 7306, untagged, QN 1).
        AtomicRequest = 0xA,
        /// Atomic Response (RFC 7306, untagged, QN 3).
        AtomicResponse = 0xB,
        /// RDMA Write-Record (softrdma datagram extension, tagged); reserved
        /// in RFC 5040/7306, so undefined in stream mode.
        WriteRecord = 0xC,
    }
}

impl Opcode {
    /// Whether the opcode uses the tagged buffer model (Write, Read Response,
    /// Write-Record). False for every untagged and every unknown opcode.
    pub const fn is_tagged_op(self) -> bool {
        matches!(
            self,
            Opcode::RdmaWrite | Opcode::ReadResponse | Opcode::WriteRecord
        )
    }

    /// Whether the opcode has a meaning in `mode`: 0x0–0xB in both, 0xC
    /// (Write-Record) only in datagram mode.
    pub const fn is_defined_in(self, mode: Mode) -> bool {
        match self {
            Opcode::Unknown(_) => false,
            Opcode::WriteRecord => matches!(mode, Mode::Datagram),
            _ => true,
        }
    }

    /// The DDP queue number an untagged opcode uses: 0 Send/Immediate,
    /// 1 Read/Atomic Request, 2 Terminate, 3 Atomic Response; `None` for
    /// tagged and unknown opcodes.
    pub const fn queue_number(self) -> Option<u32> {
        match self {
            Opcode::Send
            | Opcode::SendInvalidate
            | Opcode::SendSe
            | Opcode::SendSeInvalidate
            | Opcode::ImmediateData
            | Opcode::ImmediateDataSe => Some(0),
            Opcode::ReadRequest | Opcode::AtomicRequest => Some(1),
            Opcode::Terminate => Some(2),
            Opcode::AtomicResponse => Some(3),
            _ => None,
        }
    }

    /// One of the four Send opcodes.
    pub const fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::Send | Opcode::SendInvalidate | Opcode::SendSe | Opcode::SendSeInvalidate
        )
    }

    /// A Send with Invalidate (RsvdULP carries the STag to invalidate).
    pub const fn has_invalidate(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
    }

    /// A message that asks for a solicited event.
    pub const fn is_solicited(self) -> bool {
        matches!(
            self,
            Opcode::SendSe | Opcode::SendSeInvalidate | Opcode::ImmediateDataSe
        )
    }

    /// The RDMAP control octet for this opcode: RV = 1, reserved bits zero.
    pub fn control_octet(self) -> u8 {
        (RDMAP_VERSION << 6) | (u8::from(self) & OPCODE_MASK)
    }
}

/// RDMA Read Request header part (RFC 5040 §4.4), 28 octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadRequest {
    /// Data Sink STag: the requester's buffer the Read Response targets.
    pub sink_stag: u32,
    /// Data Sink Tagged Offset.
    pub sink_to: u64,
    /// RDMA Read Message Size in octets.
    pub size: u32,
    /// Data Source STag: the remote buffer being read.
    pub src_stag: u32,
    /// Data Source Tagged Offset.
    pub src_to: u64,
}

impl ReadRequest {
    /// Decodes the first 28 octets of `b`.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < READ_REQUEST_LEN {
            return Err(Error::Truncated);
        }
        Ok(ReadRequest {
            sink_stag: u32_at(b, 0),
            sink_to: u64_at(b, 4),
            size: u32_at(b, 12),
            src_stag: u32_at(b, 16),
            src_to: u64_at(b, 20),
        })
    }

    /// Writes the 28 octets. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let buf = &mut buf[..READ_REQUEST_LEN];
        put_u32(buf, 0, self.sink_stag);
        put_u64(buf, 4, self.sink_to);
        put_u32(buf, 12, self.size);
        put_u32(buf, 16, self.src_stag);
        put_u64(buf, 20, self.src_to);
    }

    /// The 28 octets, as a Terminate's Terminated RDMAP header carries them.
    pub fn to_bytes(&self) -> [u8; READ_REQUEST_LEN] {
        let mut b = [0u8; READ_REQUEST_LEN];
        self.emit(&mut b);
        b
    }
}

crate::open_enum! {
    /// Atomic Operation Code word of an Atomic Request (RFC 7306): 28
    /// reserved bits and a 4-bit code. The whole word is kept, so a request
    /// with reserved bits set shows up as `Unknown`.
    pub enum AtomicOp(u32) {
        /// Fetch and Add.
        FetchAdd = 0,
        /// Swap.
        Swap = 1,
        /// Compare and Swap.
        CompareSwap = 2,
    }
}

/// Atomic Request header part (RFC 7306), 52 octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicRequest {
    /// Atomic operation.
    pub op: AtomicOp,
    /// Request Identifier, echoed by the response.
    pub req_id: u32,
    /// Remote STag of the target.
    pub stag: u32,
    /// Remote Tagged Offset of the 8-octet target.
    pub to: u64,
    /// Add or Swap Data.
    pub add_swap: u64,
    /// Add or Swap Mask.
    pub add_swap_mask: u64,
    /// Compare Data.
    pub compare: u64,
    /// Compare Mask.
    pub compare_mask: u64,
}

impl AtomicRequest {
    /// Decodes the first 52 octets of `b`.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < ATOMIC_REQUEST_LEN {
            return Err(Error::Truncated);
        }
        Ok(AtomicRequest {
            op: AtomicOp::from(u32_at(b, 0)),
            req_id: u32_at(b, 4),
            stag: u32_at(b, 8),
            to: u64_at(b, 12),
            add_swap: u64_at(b, 20),
            add_swap_mask: u64_at(b, 28),
            compare: u64_at(b, 36),
            compare_mask: u64_at(b, 44),
        })
    }

    /// Writes the 52 octets. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let buf = &mut buf[..ATOMIC_REQUEST_LEN];
        put_u32(buf, 0, u32::from(self.op));
        put_u32(buf, 4, self.req_id);
        put_u32(buf, 8, self.stag);
        put_u64(buf, 12, self.to);
        put_u64(buf, 20, self.add_swap);
        put_u64(buf, 28, self.add_swap_mask);
        put_u64(buf, 36, self.compare);
        put_u64(buf, 44, self.compare_mask);
    }
}

/// Atomic Response header part (RFC 7306), 12 octets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicResponse {
    /// Original Request Identifier.
    pub req_id: u32,
    /// Original Remote Data Value (the target's value before the operation).
    pub orig_value: u64,
}

impl AtomicResponse {
    /// Decodes the first 12 octets of `b`.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < ATOMIC_RESPONSE_LEN {
            return Err(Error::Truncated);
        }
        Ok(AtomicResponse {
            req_id: u32_at(b, 0),
            orig_value: u64_at(b, 4),
        })
    }

    /// Writes the 12 octets. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let buf = &mut buf[..ATOMIC_RESPONSE_LEN];
        put_u32(buf, 0, self.req_id);
        put_u64(buf, 4, self.orig_value);
    }
}

crate::open_enum! {
    /// The layer a Terminate blames (high nibble of the Terminate Control word).
    pub enum Layer(u8) {
        /// RDMAP.
        Rdmap = 0,
        /// DDP.
        Ddp = 1,
        /// The lower layer protocol (MPA, or the datagram framing).
        Llp = 2,
    }
}

macro_rules! terminate_causes {
    ($( $name:ident = ($layer:expr, $etype:expr, $code:expr, $desc:expr), )+) => {
        /// The (layer, error type, error code) triple of a Terminate
        /// (RFC 5040 §4.8 and §7, RFC 5041 §7, RFC 5044 §8, RFC 6581), one
        /// variant per row of the tables; any other triple is `Unknown`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum TerminateCause {
            $( #[doc = $desc] $name, )+
            /// A triple with no name here; the raw values are kept.
            Unknown {
                /// Layer nibble.
                layer: u8,
                /// Error type nibble.
                etype: u8,
                /// Error code octet.
                code: u8,
            },
        }

        impl TerminateCause {
            /// The cause for a raw triple (layer and etype are 4-bit fields on
            /// the wire). `to_raw(from_raw(l, e, c)) == (l, e, c)` for every triple.
            pub const fn from_raw(layer: u8, etype: u8, code: u8) -> Self {
                match (layer, etype, code) {
                    $( ($layer, $etype, $code) => TerminateCause::$name, )+
                    _ => TerminateCause::Unknown { layer, etype, code },
                }
            }

            /// The raw (layer, etype, code) triple.
            pub const fn to_raw(self) -> (u8, u8, u8) {
                match self {
                    $( TerminateCause::$name => ($layer, $etype, $code), )+
                    TerminateCause::Unknown { layer, etype, code } => (layer, etype, code),
                }
            }

            /// A short English description of the cause.
            pub const fn description(self) -> &'static str {
                match self {
                    $( TerminateCause::$name => $desc, )+
                    TerminateCause::Unknown { .. } => "unknown terminate cause",
                }
            }
        }
    };
}

terminate_causes! {
    RdmapLocalCatastrophic = (0, 0, 0x00, "RDMAP: local catastrophic error"),
    RdmapInvalidStag = (0, 1, 0x00, "RDMAP remote protection: invalid STag"),
    RdmapBaseBounds = (0, 1, 0x01, "RDMAP remote protection: base or bounds violation"),
    RdmapAccessRights = (0, 1, 0x02, "RDMAP remote protection: access rights violation"),
    RdmapStagNotAssociated = (0, 1, 0x03, "RDMAP remote protection: STag not associated with the RDMAP stream"),
    RdmapToWrap = (0, 1, 0x04, "RDMAP remote protection: tagged offset wrap"),
    RdmapStagCannotInvalidate = (0, 1, 0x09, "RDMAP remote protection: STag cannot be invalidated"),
    RdmapProtectionUnspecified = (0, 1, 0xFF, "RDMAP remote protection: unspecified error"),
    RdmapInvalidVersion = (0, 2, 0x05, "RDMAP remote operation: invalid RDMAP version"),
    RdmapUnexpectedOpcode = (0, 2, 0x06, "RDMAP remote operation: unexpected opcode"),
    RdmapCatastrophicStream = (0, 2, 0x07, "RDMAP remote operation: catastrophic error, local to the stream"),
    RdmapCatastrophicGlobal = (0, 2, 0x08, "RDMAP remote operation: catastrophic error, global"),
    RdmapOperationCannotInvalidate = (0, 2, 0x09, "RDMAP remote operation: STag cannot be invalidated"),
    RdmapOperationUnspecified = (0, 2, 0xFF, "RDMAP remote operation: unspecified error"),
    DdpLocalCatastrophic = (1, 0, 0x00, "DDP: local catastrophic error"),
    DdpTaggedInvalidStag = (1, 1, 0x00, "DDP tagged buffer: invalid STag"),
    DdpTaggedBaseBounds = (1, 1, 0x01, "DDP tagged buffer: base or bounds violation"),
    DdpTaggedStagNotAssociated = (1, 1, 0x02, "DDP tagged buffer: STag not associated with the DDP stream"),
    DdpTaggedToWrap = (1, 1, 0x03, "DDP tagged buffer: tagged offset wrap"),
    DdpTaggedInvalidVersion = (1, 1, 0x04, "DDP tagged buffer: invalid DDP version"),
    DdpUntaggedInvalidQn = (1, 2, 0x01, "DDP untagged buffer: invalid queue number"),
    DdpUntaggedNoBuffer = (1, 2, 0x02, "DDP untagged buffer: invalid MSN, no buffer available"),
    DdpUntaggedMsnRange = (1, 2, 0x03, "DDP untagged buffer: invalid MSN, out of range"),
    DdpUntaggedInvalidMo = (1, 2, 0x04, "DDP untagged buffer: invalid message offset"),
    DdpUntaggedTooLong = (1, 2, 0x05, "DDP untagged buffer: message too long for the buffer"),
    DdpUntaggedInvalidVersion = (1, 2, 0x06, "DDP untagged buffer: invalid DDP version"),
    MpaConnectionLost = (2, 0, 0x01, "LLP: connection lost or closed"),
    MpaCrcError = (2, 0, 0x02, "LLP: CRC error"),
    MpaMarkerMismatch = (2, 0, 0x03, "LLP: marker and ULPDU length mismatch"),
    MpaInvalidRequest = (2, 0, 0x04, "LLP: invalid MPA Request or Reply"),
    MpaLocalCatastrophic = (2, 0, 0x05, "LLP: local catastrophic error"),
    MpaInsufficientIrd = (2, 0, 0x06, "LLP: insufficient IRD resources"),
    MpaNoMatchingRtr = (2, 0, 0x07, "LLP: no matching RTR option"),
}

impl TerminateCause {
    /// The layer blamed.
    pub const fn layer(self) -> Layer {
        match self.to_raw().0 {
            0 => Layer::Rdmap,
            1 => Layer::Ddp,
            2 => Layer::Llp,
            l => Layer::Unknown(l),
        }
    }

    /// The error type (low nibble of the first control octet).
    pub const fn etype(self) -> u8 {
        self.to_raw().1
    }

    /// The error code.
    pub const fn code(self) -> u8 {
        self.to_raw().2
    }
}

impl core::fmt::Display for TerminateCause {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let (l, e, c) = self.to_raw();
        write!(
            f,
            "{} (layer {l}, type {e}, code {c:#04x})",
            self.description()
        )
    }
}

/// The DDP header of the offending segment, echoed by a Terminate (D bit):
/// 14 octets if its T bit is set, else 18. Only the standard header is
/// echoed; in datagram mode the X/T-MSN/T-MO/DQPN words are left out (the
/// echoed control octet still shows the X and Q bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EchoedHeader {
    octets: [u8; UNTAGGED_HEADER_LEN],
    len: u8,
}

impl EchoedHeader {
    /// Copies the standard DDP header from the start of `ulpdu`: 14 octets
    /// if its T bit is set, else 18. [`Error::Truncated`] if shorter.
    pub fn from_segment(ulpdu: &[u8]) -> Result<Self> {
        let first = *ulpdu.first().ok_or(Error::Truncated)?;
        let len = if first & FLAG_T != 0 {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        };
        let src = ulpdu.get(..len).ok_or(Error::Truncated)?;
        let mut octets = [0u8; UNTAGGED_HEADER_LEN];
        octets[..len].copy_from_slice(src);
        Ok(EchoedHeader {
            octets,
            len: len as u8,
        })
    }

    /// The echoed octets (14 or 18).
    pub fn as_bytes(&self) -> &[u8] {
        &self.octets[..usize::from(self.len)]
    }

    /// 14 or 18.
    pub fn header_len(&self) -> usize {
        usize::from(self.len)
    }

    /// A stream-mode view of the echoed header, to read its fields.
    pub fn view(&self) -> DdpSegment<&[u8]> {
        DdpSegment::new_unchecked(self.as_bytes(), Mode::Stream)
    }
}

/// Terminate Control word bit: M, the DDP Segment Length is valid.
pub const TERM_M: u32 = 0x0000_8000;
/// Terminate Control word bit: D, a DDP header is attached.
pub const TERM_D: u32 = 0x0000_4000;
/// Terminate Control word bit: R, an RDMAP header is attached.
pub const TERM_R: u32 = 0x0000_2000;

/// Terminate header part (RFC 5040 §4.8), after the untagged DDP header:
///
/// ```text
/// 18  Terminate Control (4): layer(4) etype(4) code(8) M D R reserved(13)
/// 22  DDP Segment Length (2)         present if M or D
/// 24  Terminated DDP header (14/18)  present if D; length by its T bit
/// ..  Terminated RDMAP header (28)   present if R (Read Request header part)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateRepr {
    /// Layer, error type and code.
    pub cause: TerminateCause,
    /// DDP Segment Length of the offending segment; `Some` sets M.
    pub segment_len: Option<u16>,
    /// Echoed DDP header; `Some` sets D.
    pub ddp_header: Option<EchoedHeader>,
    /// Echoed Read Request header part; `Some` sets R.
    pub rdmap_header: Option<[u8; TERMINATED_RDMAP_HEADER_LEN]>,
}

impl TerminateRepr {
    /// A Terminate with nothing attached.
    pub const fn new(cause: TerminateCause) -> Self {
        TerminateRepr {
            cause,
            segment_len: None,
            ddp_header: None,
            rdmap_header: None,
        }
    }

    /// The Terminate Control word as sent.
    pub fn control_word(&self) -> u32 {
        let (l, e, c) = self.cause.to_raw();
        let mut w =
            (u32::from(l & 0x0F) << 28) | (u32::from(e & 0x0F) << 24) | (u32::from(c) << 16);
        if self.segment_len.is_some() {
            w |= TERM_M;
        }
        if self.ddp_header.is_some() {
            w |= TERM_D;
        }
        if self.rdmap_header.is_some() {
            w |= TERM_R;
        }
        w
    }

    /// Octets of the Terminate header part.
    pub fn buffer_len(&self) -> usize {
        let mut n = TERMINATE_CONTROL_LEN;
        if self.segment_len.is_some() || self.ddp_header.is_some() {
            n += TERMINATE_SEGMENT_LEN_LEN;
        }
        if let Some(h) = &self.ddp_header {
            n += h.header_len();
        }
        if self.rdmap_header.is_some() {
            n += TERMINATED_RDMAP_HEADER_LEN;
        }
        n
    }

    /// Decodes a Terminate header part from the start of `b`; returns it and
    /// the octets it took.
    ///
    /// The DDP Segment Length field is present when M or D is set (siw reads
    /// it when M is set, Wireshark when D is set; both senders set M and D
    /// together). Its value is kept only when M says it is valid.
    ///
    /// Leniency: when R is set but fewer than 28 octets follow, the RDMAP
    /// header is taken as absent and those octets are left unconsumed.
    /// Linux siw sends such Terminates for remote-protection errors on a
    /// Send (M+D+R with only the 18-octet DDP header attached).
    pub fn parse(b: &[u8]) -> Result<(Self, usize)> {
        if b.len() < TERMINATE_CONTROL_LEN {
            return Err(Error::Truncated);
        }
        let w = u32_at(b, 0);
        let cause =
            TerminateCause::from_raw((w >> 28) as u8, ((w >> 24) & 0x0F) as u8, (w >> 16) as u8);
        let mut off = TERMINATE_CONTROL_LEN;
        let mut t = TerminateRepr::new(cause);
        if w & (TERM_M | TERM_D) != 0 {
            if b.len() < off + TERMINATE_SEGMENT_LEN_LEN {
                return Err(Error::Truncated);
            }
            if w & TERM_M != 0 {
                t.segment_len = Some(u16_at(b, off));
            }
            off += TERMINATE_SEGMENT_LEN_LEN;
        }
        if w & TERM_D != 0 {
            let h = EchoedHeader::from_segment(&b[off..])?;
            off += h.header_len();
            t.ddp_header = Some(h);
        }
        if w & TERM_R != 0 {
            if let Some(r) = b.get(off..off + TERMINATED_RDMAP_HEADER_LEN) {
                let mut a = [0u8; TERMINATED_RDMAP_HEADER_LEN];
                a.copy_from_slice(r);
                t.rdmap_header = Some(a);
                off += TERMINATED_RDMAP_HEADER_LEN;
            }
        }
        Ok((t, off))
    }

    /// Writes the Terminate header part; returns [`Self::buffer_len`].
    /// Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        let len = self.buffer_len();
        let buf = &mut buf[..len];
        put_u32(buf, 0, self.control_word());
        let mut off = TERMINATE_CONTROL_LEN;
        if self.segment_len.is_some() || self.ddp_header.is_some() {
            put_u16(buf, off, self.segment_len.unwrap_or(0));
            off += TERMINATE_SEGMENT_LEN_LEN;
        }
        if let Some(h) = &self.ddp_header {
            buf[off..off + h.header_len()].copy_from_slice(h.as_bytes());
            off += h.header_len();
        }
        if let Some(r) = &self.rdmap_header {
            buf[off..off + TERMINATED_RDMAP_HEADER_LEN].copy_from_slice(r);
        }
        len
    }
}

/// The opcode-specific header part that follows the DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RdmapBody {
    /// Nothing: tagged messages, Sends, unknown opcodes.
    None,
    /// Read Request header part.
    ReadRequest(ReadRequest),
    /// Terminate header part.
    Terminate(TerminateRepr),
    /// Atomic Request header part.
    AtomicRequest(AtomicRequest),
    /// Atomic Response header part.
    AtomicResponse(AtomicResponse),
    /// Immediate data of an Immediate Data message.
    Immediate(u64),
}

impl RdmapBody {
    /// Octets of the header part.
    pub fn buffer_len(&self) -> usize {
        match self {
            RdmapBody::None => 0,
            RdmapBody::ReadRequest(_) => READ_REQUEST_LEN,
            RdmapBody::Terminate(t) => t.buffer_len(),
            RdmapBody::AtomicRequest(_) => ATOMIC_REQUEST_LEN,
            RdmapBody::AtomicResponse(_) => ATOMIC_RESPONSE_LEN,
            RdmapBody::Immediate(_) => IMMEDIATE_LEN,
        }
    }

    /// Writes the header part; returns [`Self::buffer_len`]. Panics if `buf`
    /// is shorter.
    pub fn emit(&self, buf: &mut [u8]) -> usize {
        match self {
            RdmapBody::None => {}
            RdmapBody::ReadRequest(r) => r.emit(buf),
            RdmapBody::Terminate(t) => {
                t.emit(buf);
            }
            RdmapBody::AtomicRequest(a) => a.emit(buf),
            RdmapBody::AtomicResponse(a) => a.emit(buf),
            RdmapBody::Immediate(v) => put_u64(&mut buf[..IMMEDIATE_LEN], 0, *v),
        }
        self.buffer_len()
    }

    /// Which body an untagged segment with `opcode` carries, and whether
    /// that body is the whole message (no octet may follow it).
    fn kind(opcode: Opcode) -> BodyKind {
        match opcode {
            Opcode::ReadRequest => BodyKind::Exact(READ_REQUEST_LEN),
            Opcode::AtomicRequest => BodyKind::Exact(ATOMIC_REQUEST_LEN),
            Opcode::AtomicResponse => BodyKind::Exact(ATOMIC_RESPONSE_LEN),
            Opcode::ImmediateData | Opcode::ImmediateDataSe => BodyKind::Exact(IMMEDIATE_LEN),
            Opcode::Terminate => BodyKind::Terminate,
            _ => BodyKind::None,
        }
    }

    fn matches(&self, kind: BodyKind) -> bool {
        matches!(
            (self, kind),
            (RdmapBody::None, BodyKind::None)
                | (RdmapBody::ReadRequest(_), BodyKind::Exact(READ_REQUEST_LEN))
                | (
                    RdmapBody::AtomicRequest(_),
                    BodyKind::Exact(ATOMIC_REQUEST_LEN)
                )
                | (
                    RdmapBody::AtomicResponse(_),
                    BodyKind::Exact(ATOMIC_RESPONSE_LEN)
                )
                | (RdmapBody::Immediate(_), BodyKind::Exact(IMMEDIATE_LEN))
                | (RdmapBody::Terminate(_), BodyKind::Terminate)
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyKind {
    None,
    Exact(usize),
    Terminate,
}

/// The decoded DDP + RDMAP header of one segment. The payload (everything
/// after [`SegmentRepr::header_len`] octets) stays with the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SegmentRepr {
    /// DDP L bit: last segment of the message.
    pub last: bool,
    /// RDMAP opcode.
    pub opcode: Opcode,
    /// DDP buffer-model fields (and the datagram tagged extension).
    pub ddp: DdpHeader,
    /// Datagram mode only: the Destination QP Number word (Q bit).
    pub dqpn: Option<u32>,
    /// Opcode-specific header part (untagged messages only).
    pub body: RdmapBody,
}

impl SegmentRepr {
    /// A tagged segment (RDMA Write, Read Response, Write-Record) with no
    /// datagram extension words.
    pub const fn tagged(opcode: Opcode, stag: u32, to: u64, last: bool) -> SegmentRepr {
        SegmentRepr {
            last,
            opcode,
            ddp: DdpHeader::Tagged {
                stag,
                to,
                ext: None,
            },
            dqpn: None,
            body: RdmapBody::None,
        }
    }

    /// An untagged segment on queue `qn` with no datagram extension words.
    pub const fn untagged(
        opcode: Opcode,
        qn: u32,
        msn: u32,
        mo: u32,
        last: bool,
        body: RdmapBody,
    ) -> SegmentRepr {
        SegmentRepr {
            last,
            opcode,
            ddp: DdpHeader::Untagged {
                rsvd_ulp: 0,
                qn,
                msn,
                mo,
            },
            dqpn: None,
            body,
        }
    }

    /// Decodes the header of `ulpdu` (a whole DDP segment, DDP header first)
    /// and returns it with its length, i.e. the offset of the payload. See
    /// the module documentation for what is checked.
    ///
    /// Always inlined: every segment received goes through it, and its
    /// result returned through memory was read back in wider moves than
    /// wrote it, which stalled (`docs/performance.md`, "The latency path").
    #[inline(always)]
    pub fn parse(ulpdu: &[u8], mode: Mode) -> Result<(SegmentRepr, usize)> {
        // The checks of `DdpSegment::check_control` and `check_len`, in
        // their order, with the control octet read once and the fields read
        // from fixed-size arrays (no bounds check per field): this runs for
        // every segment received.
        let [c, rctl, ..] = *ulpdu else {
            return Err(Error::Truncated);
        };
        if c & DV_MASK != DDP_VERSION || rctl >> 6 != RDMAP_VERSION {
            return Err(Error::BadVersion);
        }
        let dgram = mode == Mode::Datagram;
        let tagged = c & FLAG_T != 0;
        if dgram && (c & RESERVED_MASK != 0 || (c & FLAG_X != 0 && !tagged)) {
            return Err(Error::Malformed);
        }
        let x = dgram && tagged && c & FLAG_X != 0;
        let q = dgram && c & FLAG_Q != 0;
        let opcode = Opcode::from(rctl & OPCODE_MASK);
        if opcode.is_defined_in(mode) {
            if opcode.is_tagged_op() != tagged {
                return Err(Error::Malformed);
            }
            if dgram && matches!(opcode, Opcode::ReadResponse | Opcode::WriteRecord) && !x {
                return Err(Error::Malformed);
            }
        }
        let (ddp, mut off) = if tagged {
            let h: &[u8; TAGGED_HEADER_LEN] = ulpdu.first_chunk().ok_or(Error::Truncated)?;
            let ext = if x {
                let e: &[u8; TAGGED_HEADER_LEN + EXT_LEN] =
                    ulpdu.first_chunk().ok_or(Error::Truncated)?;
                Some(TaggedExt {
                    msn: u32_at(e, TAGGED_HEADER_LEN),
                    mo: u32_at(e, TAGGED_HEADER_LEN + 4),
                })
            } else {
                None
            };
            let ddp = DdpHeader::Tagged {
                stag: u32_at(h, 2),
                to: u64_at(h, 6),
                ext,
            };
            (ddp, TAGGED_HEADER_LEN + if x { EXT_LEN } else { 0 })
        } else {
            let h: &[u8; UNTAGGED_HEADER_LEN] = ulpdu.first_chunk().ok_or(Error::Truncated)?;
            let ddp = DdpHeader::Untagged {
                rsvd_ulp: u32_at(h, 2),
                qn: u32_at(h, 6),
                msn: u32_at(h, 10),
                mo: u32_at(h, 14),
            };
            (ddp, UNTAGGED_HEADER_LEN)
        };
        let dqpn = if q {
            let w = ulpdu.get(off..off + DQPN_LEN).ok_or(Error::Truncated)?;
            off += DQPN_LEN;
            Some(u32_at(w, 0))
        } else {
            None
        };
        let (body, n) = Self::parse_body(opcode, tagged, &ulpdu[off..])?;
        let repr = SegmentRepr {
            last: c & FLAG_L != 0,
            opcode,
            ddp,
            dqpn,
            body,
        };
        Ok((repr, off + n))
    }

    /// The opcode-specific header part at the start of `rest` (what follows
    /// the DDP header) and its length.
    #[inline]
    fn parse_body(opcode: Opcode, tagged: bool, rest: &[u8]) -> Result<(RdmapBody, usize)> {
        if tagged {
            return Ok((RdmapBody::None, 0));
        }
        Ok(match RdmapBody::kind(opcode) {
            BodyKind::None => (RdmapBody::None, 0),
            BodyKind::Terminate => {
                let (t, n) = TerminateRepr::parse(rest)?;
                (RdmapBody::Terminate(t), n)
            }
            BodyKind::Exact(n) => {
                if rest.len() < n {
                    return Err(Error::Truncated);
                }
                if rest.len() > n {
                    return Err(Error::Malformed);
                }
                let body = match opcode {
                    Opcode::ReadRequest => RdmapBody::ReadRequest(ReadRequest::parse(rest)?),
                    Opcode::AtomicRequest => RdmapBody::AtomicRequest(AtomicRequest::parse(rest)?),
                    Opcode::AtomicResponse => {
                        RdmapBody::AtomicResponse(AtomicResponse::parse(rest)?)
                    }
                    _ => RdmapBody::Immediate(u64_at(rest, 0)),
                };
                (body, n)
            }
        })
    }

    /// Octets [`SegmentRepr::emit`] writes: DDP header (with extension words
    /// and DQPN) plus the opcode-specific part.
    pub fn header_len(&self) -> usize {
        self.ddp.buffer_len()
            + if self.dqpn.is_some() { DQPN_LEN } else { 0 }
            + self.body.buffer_len()
    }

    /// The RDMAP control octet (RV = 1, reserved bits zero).
    pub fn rdmap_control(&self) -> u8 {
        self.opcode.control_octet()
    }

    /// Writes exactly [`SegmentRepr::header_len`] octets at the start of
    /// `buf`; the payload is the caller's.
    ///
    /// The X and Q bits follow `ddp`'s extension and `dqpn`: a stream-mode
    /// sender keeps both `None` (see [`SegmentRepr::validate`]).
    ///
    /// # Panics
    /// If `buf` is shorter than `header_len()`.
    pub fn emit(&self, buf: &mut [u8]) {
        let n = self
            .ddp
            .emit(self.last, self.rdmap_control(), self.dqpn, buf);
        self.body.emit(&mut buf[n..]);
    }

    /// Checks that this representation is one [`SegmentRepr::parse`] gives
    /// back from its own emission in `mode`: the error is the one parse
    /// would return ([`Error::Malformed`] for every inconsistency).
    pub fn validate(&self, mode: Mode) -> Result<()> {
        if u8::from(self.opcode) > OPCODE_MASK {
            return Err(Error::Malformed);
        }
        let ext = matches!(self.ddp, DdpHeader::Tagged { ext: Some(_), .. });
        if mode == Mode::Stream && (ext || self.dqpn.is_some()) {
            return Err(Error::Malformed);
        }
        let tagged = self.ddp.is_tagged();
        if self.opcode.is_defined_in(mode) {
            if self.opcode.is_tagged_op() != tagged {
                return Err(Error::Malformed);
            }
            if mode == Mode::Datagram
                && matches!(self.opcode, Opcode::ReadResponse | Opcode::WriteRecord)
                && !ext
            {
                return Err(Error::Malformed);
            }
        }
        let kind = if tagged {
            BodyKind::None
        } else {
            RdmapBody::kind(self.opcode)
        };
        if !self.body.matches(kind) {
            return Err(Error::Malformed);
        }
        Ok(())
    }

    /// Whether this representation may be sent in `mode`
    /// (`validate(mode).is_ok()`).
    pub fn fits(&self, mode: Mode) -> bool {
        self.validate(mode).is_ok()
    }
}

/// The header length of a segment from its first two octets (DDP control,
/// RDMAP control), for a deframer that wants the whole header before handing
/// it on: 14 / 18 / 26 / 30 / 46 / 70, plus 8 (X) and 4 (Q) in datagram
/// mode. `None` when fewer than two octets are given, or when the length
/// depends on later octets (an untagged Terminate).
///
/// For a segment that [`SegmentRepr::parse`] accepts, the hint equals the
/// header length parse returns; for others it is only a guess.
pub fn header_len_hint(first_octets: &[u8], mode: Mode) -> Option<usize> {
    let (&dctl, rest) = first_octets.split_first()?;
    let &rctl = rest.first()?;
    let tagged = dctl & FLAG_T != 0;
    let mut n = if tagged {
        TAGGED_HEADER_LEN
    } else {
        UNTAGGED_HEADER_LEN
    };
    if mode == Mode::Datagram {
        if tagged && dctl & FLAG_X != 0 {
            n += EXT_LEN;
        }
        if dctl & FLAG_Q != 0 {
            n += DQPN_LEN;
        }
    }
    if !tagged {
        match RdmapBody::kind(Opcode::from(rctl & OPCODE_MASK)) {
            BodyKind::None => {}
            BodyKind::Exact(k) => n += k,
            BodyKind::Terminate => return None,
        }
    }
    Some(n)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ddp::TaggedExt;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace()
            .map(|h| u8::from_str_radix(h, 16).unwrap())
            .collect()
    }

    /// The FPDUs of testdata/iwarp/golden.txt, as (title keyword, octets).
    fn golden_fpdus() -> Vec<(&'static str, Vec<u8>)> {
        vec![
            (
                "RDMA Write",
                hex("00 1b c1 40 00 00 33 03 00 00 56 00 12 34 00 00
                     52 44 4d 41 2d 57 52 49 54 45 2d 31 33 00 00 00
                     c3 27 06 ee"),
            ),
            (
                "Send",
                hex("00 1c 41 43 00 00 00 00 00 00 00 00 00 00 00 01
                     00 00 00 00 68 65 6c 6c 6f 20 73 65 6e 64 00 00
                     1d bb 43 13"),
            ),
            (
                "Read Request",
                hex("00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 01
                     00 00 00 00 00 01 2a 01 00 00 7f 00 00 00 10 00
                     00 00 00 40 00 00 4c 02 00 00 7f 00 ab cd 00 00
                     e7 43 84 2d"),
            ),
            (
                "Read Response",
                hex("00 4e c1 42 00 01 2a 01 00 00 7f 00 00 00 10 00
                     00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f
                     10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f
                     20 21 22 23 24 25 26 27 28 29 2a 2b 2c 2d 2e 2f
                     30 31 32 33 34 35 36 37 38 39 3a 3b 3c 3d 3e 3f
                     cc 15 c7 21"),
            ),
            (
                "Terminate",
                hex("00 2a 41 47 00 00 00 00 00 00 00 02 00 00 00 01
                     00 00 00 00 12 02 c0 00 00 64 41 43 00 00 00 00
                     00 00 00 00 00 00 00 05 00 00 00 00 71 0d 5e 50"),
            ),
            (
                "zero-length",
                hex("00 0e c1 40 00 00 00 01 00 00 00 00 00 00 00 00
                     eb d3 4c 5f"),
            ),
        ]
    }

    /// The ULPDU of an FPDU: strip the length field, pad and CRC (checking
    /// the CRC on the way).
    fn ulpdu(fpdu: &[u8]) -> &[u8] {
        let len = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
        let pad = (4 - (2 + len) % 4) % 4;
        assert_eq!(fpdu.len(), 2 + len + pad + 4);
        let crc = crate::crc::crc32c(&fpdu[..2 + len + pad]);
        assert_eq!(crate::crc::to_wire(crc), fpdu[2 + len + pad..]);
        &fpdu[2..2 + len]
    }

    fn golden(name: &str) -> Vec<u8> {
        let (_, f) = golden_fpdus()
            .into_iter()
            .find(|(n, _)| *n == name)
            .unwrap();
        ulpdu(&f).to_vec()
    }

    /// Parses, checks the header length, re-emits header + payload and
    /// compares byte for byte.
    fn roundtrip_exact(u: &[u8]) -> (SegmentRepr, usize) {
        let (repr, hlen) = SegmentRepr::parse(u, Mode::Stream).unwrap();
        assert_eq!(hlen, repr.header_len());
        repr.validate(Mode::Stream).unwrap();
        let mut out = vec![0u8; u.len()];
        repr.emit(&mut out[..hlen]);
        out[hlen..].copy_from_slice(&u[hlen..]);
        assert_eq!(out, u);
        if repr.opcode != Opcode::Terminate {
            assert_eq!(header_len_hint(u, Mode::Stream), Some(hlen));
        }
        (repr, hlen)
    }

    #[test]
    fn golden_write() {
        let u = golden("RDMA Write");
        let (r, h) = roundtrip_exact(&u);
        assert_eq!(
            r,
            SegmentRepr {
                last: true,
                opcode: Opcode::RdmaWrite,
                ddp: DdpHeader::Tagged {
                    stag: 0x3303,
                    to: 0x0000_5600_1234_0000,
                    ext: None
                },
                dqpn: None,
                body: RdmapBody::None,
            }
        );
        assert_eq!(&u[h..], b"RDMA-WRITE-13");
    }

    #[test]
    fn golden_send() {
        let u = golden("Send");
        let (r, h) = roundtrip_exact(&u);
        assert_eq!(r.opcode, Opcode::Send);
        assert!(r.last);
        assert_eq!(
            r.ddp,
            DdpHeader::Untagged {
                rsvd_ulp: 0,
                qn: 0,
                msn: 1,
                mo: 0
            }
        );
        assert_eq!(r.body, RdmapBody::None);
        assert_eq!(&u[h..], b"hello send");
        assert_eq!(r.opcode.queue_number(), Some(0));
    }

    #[test]
    fn golden_read_request() {
        let u = golden("Read Request");
        let (r, h) = roundtrip_exact(&u);
        assert_eq!(h, 46);
        assert_eq!(r.opcode, Opcode::ReadRequest);
        assert_eq!(
            r.ddp,
            DdpHeader::Untagged {
                rsvd_ulp: 0,
                qn: 1,
                msn: 1,
                mo: 0
            }
        );
        assert_eq!(
            r.body,
            RdmapBody::ReadRequest(ReadRequest {
                sink_stag: 0x12a01,
                sink_to: 0x7f00_0000_1000,
                size: 64,
                src_stag: 0x4c02,
                src_to: 0x7f00_abcd_0000,
            })
        );
    }

    #[test]
    fn golden_read_response() {
        let u = golden("Read Response");
        let (r, h) = roundtrip_exact(&u);
        assert_eq!(r.opcode, Opcode::ReadResponse);
        assert_eq!(
            r.ddp,
            DdpHeader::Tagged {
                stag: 0x12a01,
                to: 0x7f00_0000_1000,
                ext: None
            }
        );
        let expect: Vec<u8> = (0u8..64).collect();
        assert_eq!(&u[h..], &expect[..]);
    }

    #[test]
    fn golden_terminate() {
        let u = golden("Terminate");
        assert_eq!(u.len(), 42);
        let (r, h) = roundtrip_exact(&u);
        assert_eq!(h, 42);
        assert_eq!(r.opcode, Opcode::Terminate);
        assert_eq!(
            r.ddp,
            DdpHeader::Untagged {
                rsvd_ulp: 0,
                qn: 2,
                msn: 1,
                mo: 0
            }
        );
        let RdmapBody::Terminate(t) = r.body else {
            panic!("not a terminate: {r:?}")
        };
        assert_eq!(t.cause, TerminateCause::DdpUntaggedNoBuffer);
        assert_eq!(t.cause.layer(), Layer::Ddp);
        assert_eq!(t.segment_len, Some(100));
        assert_eq!(t.rdmap_header, None);
        let echo = t.ddp_header.unwrap();
        assert_eq!(echo.header_len(), 18);
        let v = echo.view();
        assert_eq!((v.qn(), v.msn(), v.mo()), (Some(0), Some(5), Some(0)));
        assert_eq!(v.rdmap_control(), 0x43);
        assert_eq!(t.control_word(), 0x1202_c000);
    }

    #[test]
    fn golden_zero_length_write() {
        let u = golden("zero-length");
        let (r, h) = roundtrip_exact(&u);
        assert_eq!(h, u.len());
        assert_eq!(
            r.ddp,
            DdpHeader::Tagged {
                stag: 1,
                to: 0,
                ext: None
            }
        );
    }

    /// The embedded vectors are the ones in the repository's
    /// `testdata/iwarp/golden.txt`.
    #[test]
    fn golden_file_agrees() {
        let text = include_str!("../../../testdata/iwarp/golden.txt");
        let mut found = Vec::new();
        let mut cur: Option<(String, Vec<u8>)> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("  ").and_then(|l| l.split_once(": ")) {
                if let Some((_, bytes)) = cur.as_mut() {
                    bytes.extend(hex(rest.1));
                }
            } else {
                found.extend(cur.take());
                cur = Some((line.to_string(), Vec::new()));
            }
        }
        found.extend(cur);
        let fpdus: Vec<_> = found
            .into_iter()
            .filter(|(t, _)| t.starts_with("FPDU"))
            .collect();
        let embedded = golden_fpdus();
        assert_eq!(fpdus.len(), embedded.len());
        for ((title, bytes), (name, ours)) in fpdus.iter().zip(&embedded) {
            assert!(title.contains(name), "{title} vs {name}");
            assert_eq!(bytes, ours, "{title}");
            let (repr, h) = SegmentRepr::parse(ulpdu(bytes), Mode::Stream).unwrap();
            assert_eq!(h, repr.header_len());
        }
    }

    #[test]
    fn terminate_layout_variants() {
        let send = golden("Send");
        let write = golden("RDMA Write");
        let rr = ReadRequest {
            sink_stag: 1,
            sink_to: 2,
            size: 3,
            src_stag: 4,
            src_to: 5,
        };
        // Tagged echo: 14 octets, chosen by the echoed T bit.
        let t = TerminateRepr {
            cause: TerminateCause::DdpTaggedInvalidStag,
            segment_len: Some(13),
            ddp_header: Some(EchoedHeader::from_segment(&write).unwrap()),
            rdmap_header: None,
        };
        assert_eq!(t.buffer_len(), 4 + 2 + 14);
        // Remote protection on a Read Request: M + D + R.
        let t2 = TerminateRepr {
            cause: TerminateCause::RdmapAccessRights,
            segment_len: Some(0),
            ddp_header: Some(EchoedHeader::from_segment(&send).unwrap()),
            rdmap_header: Some(rr.to_bytes()),
        };
        assert_eq!(t2.buffer_len(), 4 + 2 + 18 + 28);
        // Catastrophic: nothing attached. M alone still carries the length slot.
        let t3 = TerminateRepr::new(TerminateCause::RdmapLocalCatastrophic);
        assert_eq!(t3.buffer_len(), 4);
        let t4 = TerminateRepr {
            segment_len: Some(7),
            ..TerminateRepr::new(TerminateCause::MpaCrcError)
        };
        assert_eq!(t4.buffer_len(), 6);
        // D without M: the slot is sent (zero) and its value not reported.
        let t5 = TerminateRepr {
            ddp_header: Some(EchoedHeader::from_segment(&send).unwrap()),
            ..TerminateRepr::new(TerminateCause::RdmapUnexpectedOpcode)
        };
        for t in [t, t2, t3, t4, t5] {
            let mut b = vec![0u8; t.buffer_len()];
            assert_eq!(t.emit(&mut b), b.len());
            assert_eq!(TerminateRepr::parse(&b), Ok((t, b.len())));
            let seg = SegmentRepr {
                last: true,
                opcode: Opcode::Terminate,
                ddp: DdpHeader::Untagged {
                    rsvd_ulp: 0,
                    qn: 2,
                    msn: 1,
                    mo: 0,
                },
                dqpn: None,
                body: RdmapBody::Terminate(t),
            };
            let mut u = vec![0u8; seg.header_len()];
            seg.emit(&mut u);
            assert_eq!(SegmentRepr::parse(&u, Mode::Stream), Ok((seg, u.len())));
        }
    }

    #[test]
    fn terminate_siw_short_rdmap_header() {
        // siw: remote protection on a Send sets M, D and R but attaches only
        // the 18-octet DDP header. Parse it with the RDMAP header absent.
        let send = golden("Send");
        let mut b = vec![0x01, 0x09, 0xE0, 0x00, 0x00, 0x0A];
        b.extend_from_slice(&send[..18]);
        let (t, n) = TerminateRepr::parse(&b).unwrap();
        assert_eq!(n, b.len());
        assert_eq!(t.cause, TerminateCause::RdmapStagCannotInvalidate);
        assert_eq!(t.segment_len, Some(10));
        assert!(t.ddp_header.is_some() && t.rdmap_header.is_none());
        // Tagged variant: 14 echoed, 4 stray octets are left as payload.
        let write = golden("RDMA Write");
        let mut b = vec![0x01, 0x01, 0xE0, 0x00, 0x00, 0x0D];
        b.extend_from_slice(&write[..18]);
        let (t, n) = TerminateRepr::parse(&b).unwrap();
        assert_eq!(n, 4 + 2 + 14);
        assert_eq!(t.ddp_header.unwrap().header_len(), 14);
    }

    #[test]
    fn terminate_truncated() {
        let u = golden("Terminate");
        for cut in 18..u.len() {
            assert_eq!(
                SegmentRepr::parse(&u[..cut], Mode::Stream),
                Err(Error::Truncated),
                "cut {cut}"
            );
        }
        assert_eq!(
            TerminateRepr::parse(&[0x12, 0x02, 0x40, 0x00, 0x00]),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn terminate_cause_table() {
        let mut named = 0;
        let mut descs = std::collections::HashSet::new();
        for l in 0..=255u8 {
            for e in 0..=255u8 {
                for c in [0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0x7F, 0xFE, 0xFF] {
                    let cause = TerminateCause::from_raw(l, e, c);
                    assert_eq!(cause.to_raw(), (l, e, c));
                    if !matches!(cause, TerminateCause::Unknown { .. }) {
                        named += 1;
                        assert!(descs.insert(cause.description()));
                    }
                }
            }
        }
        assert_eq!(named, 33);
        for l in 0..16u8 {
            for e in 0..16u8 {
                for c in 0..=255u8 {
                    assert_eq!(TerminateCause::from_raw(l, e, c).to_raw(), (l, e, c));
                }
            }
        }
        assert_eq!(
            TerminateCause::from_raw(2, 0, 2),
            TerminateCause::MpaCrcError
        );
        assert_eq!(
            TerminateCause::from_raw(2, 0, 6),
            TerminateCause::MpaInsufficientIrd
        );
        assert_eq!(
            TerminateCause::from_raw(2, 0, 7),
            TerminateCause::MpaNoMatchingRtr
        );
        assert_eq!(
            TerminateCause::from_raw(0, 2, 6),
            TerminateCause::RdmapUnexpectedOpcode
        );
        assert_eq!(
            TerminateCause::from_raw(1, 2, 4),
            TerminateCause::DdpUntaggedInvalidMo
        );
        assert_eq!(
            TerminateCause::from_raw(0, 1, 1),
            TerminateCause::RdmapBaseBounds
        );
        assert_eq!(TerminateCause::MpaCrcError.layer(), Layer::Llp);
        assert_eq!(TerminateCause::from_raw(9, 0, 0).layer(), Layer::Unknown(9));
        assert!(TerminateCause::DdpUntaggedNoBuffer
            .to_string()
            .contains("no buffer"));
    }

    #[test]
    fn opcode_helpers() {
        use Opcode::*;
        for (op, tagged, qn) in [
            (RdmaWrite, true, None),
            (ReadRequest, false, Some(1)),
            (ReadResponse, true, None),
            (Send, false, Some(0)),
            (SendInvalidate, false, Some(0)),
            (SendSe, false, Some(0)),
            (SendSeInvalidate, false, Some(0)),
            (Terminate, false, Some(2)),
            (ImmediateData, false, Some(0)),
            (ImmediateDataSe, false, Some(0)),
            (AtomicRequest, false, Some(1)),
            (AtomicResponse, false, Some(3)),
            (WriteRecord, true, None),
            (Unknown(0xD), false, None),
        ] {
            assert_eq!(op.is_tagged_op(), tagged, "{op:?}");
            assert_eq!(op.queue_number(), qn, "{op:?}");
        }
        assert!(SendSeInvalidate.has_invalidate() && SendInvalidate.has_invalidate());
        assert!(!SendSe.has_invalidate());
        assert!(SendSe.is_solicited() && ImmediateDataSe.is_solicited() && !Send.is_solicited());
        assert!(Send.is_send() && !ImmediateData.is_send());
        assert!(
            !WriteRecord.is_defined_in(Mode::Stream) && WriteRecord.is_defined_in(Mode::Datagram)
        );
        assert_eq!(Opcode::from(0xC), WriteRecord);
        assert_eq!(AtomicRequest.control_octet(), 0x4A);
    }

    fn untagged(opcode: Opcode, body: RdmapBody) -> SegmentRepr {
        SegmentRepr {
            last: true,
            opcode,
            ddp: DdpHeader::Untagged {
                rsvd_ulp: 0,
                qn: opcode.queue_number().unwrap_or(0),
                msn: 1,
                mo: 0,
            },
            dqpn: None,
            body,
        }
    }

    fn bytes(r: &SegmentRepr) -> Vec<u8> {
        let mut v = vec![0u8; r.header_len()];
        r.emit(&mut v);
        v
    }

    #[test]
    fn atomics_and_immediate() {
        let req = AtomicRequest {
            op: AtomicOp::CompareSwap,
            req_id: 0x1234,
            stag: 0x4c02,
            to: 0x7f00_abcd_0008,
            add_swap: 1,
            add_swap_mask: !0,
            compare: 2,
            compare_mask: !0,
        };
        let cases = [
            (
                untagged(Opcode::AtomicRequest, RdmapBody::AtomicRequest(req)),
                70,
            ),
            (
                untagged(
                    Opcode::AtomicResponse,
                    RdmapBody::AtomicResponse(AtomicResponse {
                        req_id: 0x1234,
                        orig_value: 99,
                    }),
                ),
                30,
            ),
            (
                untagged(
                    Opcode::ImmediateData,
                    RdmapBody::Immediate(0xDEAD_BEEF_0000_0001),
                ),
                26,
            ),
            (
                untagged(Opcode::ImmediateDataSe, RdmapBody::Immediate(7)),
                26,
            ),
        ];
        for (r, len) in cases {
            let b = bytes(&r);
            assert_eq!(b.len(), len);
            assert_eq!(header_len_hint(&b, Mode::Stream), Some(len));
            assert_eq!(SegmentRepr::parse(&b, Mode::Stream), Ok((r, len)));
            // One octet short: truncated; one octet of payload: malformed.
            assert_eq!(
                SegmentRepr::parse(&b[..len - 1], Mode::Stream),
                Err(Error::Truncated)
            );
            let mut more = b.clone();
            more.push(0);
            assert_eq!(
                SegmentRepr::parse(&more, Mode::Stream),
                Err(Error::Malformed)
            );
        }
        // Reserved bits of the atomic opcode word survive as Unknown.
        let mut b = bytes(&cases_first(req));
        b[18] = 0x10;
        let (r, _) = SegmentRepr::parse(&b, Mode::Stream).unwrap();
        let RdmapBody::AtomicRequest(a) = r.body else {
            panic!()
        };
        assert_eq!(a.op, AtomicOp::Unknown(0x1000_0002));
    }

    fn cases_first(req: AtomicRequest) -> SegmentRepr {
        untagged(Opcode::AtomicRequest, RdmapBody::AtomicRequest(req))
    }

    #[test]
    fn errors() {
        let write = golden("RDMA Write");
        let send = golden("Send");
        let rreq = golden("Read Request");
        // Too short for the control octets or the fixed header.
        assert_eq!(SegmentRepr::parse(&[], Mode::Stream), Err(Error::Truncated));
        assert_eq!(
            SegmentRepr::parse(&write[..1], Mode::Stream),
            Err(Error::Truncated)
        );
        assert_eq!(
            SegmentRepr::parse(&write[..13], Mode::Stream),
            Err(Error::Truncated)
        );
        assert_eq!(
            SegmentRepr::parse(&send[..17], Mode::Stream),
            Err(Error::Truncated)
        );
        assert_eq!(
            SegmentRepr::parse(&rreq[..45], Mode::Stream),
            Err(Error::Truncated)
        );
        // Read Request with payload.
        let mut r = rreq.clone();
        r.extend_from_slice(b"xx");
        assert_eq!(SegmentRepr::parse(&r, Mode::Stream), Err(Error::Malformed));
        // DV and RV.
        for (i, v) in [(0usize, 0xc0u8), (0, 0xc2), (1, 0x00), (1, 0x80)] {
            let mut w = write.clone();
            w[i] = v | (w[i] & if i == 0 { 0 } else { 0x0F });
            assert_eq!(
                SegmentRepr::parse(&w, Mode::Stream),
                Err(Error::BadVersion),
                "{i} {v:#x}"
            );
        }
        // T bit against the opcode.
        let mut w = write.clone();
        w[0] &= !FLAG_T;
        assert_eq!(SegmentRepr::parse(&w, Mode::Stream), Err(Error::Malformed));
        let mut s = send.clone();
        s[0] |= FLAG_T;
        assert_eq!(SegmentRepr::parse(&s, Mode::Stream), Err(Error::Malformed));
        // Stream mode ignores DDP and RDMAP reserved bits.
        let mut s = send.clone();
        s[0] |= 0x3C;
        s[1] |= 0x30;
        let (r, h) = SegmentRepr::parse(&s, Mode::Stream).unwrap();
        assert_eq!((r.opcode, h, r.dqpn), (Opcode::Send, 18, None));
        // The same octets in datagram mode: reserved bits are malformed.
        assert_eq!(
            SegmentRepr::parse(&s, Mode::Datagram),
            Err(Error::Malformed)
        );
        // Versions are checked before reserved bits.
        let mut s = send.clone();
        s[0] |= 0x04;
        s[1] &= 0x3F;
        assert_eq!(
            SegmentRepr::parse(&s, Mode::Datagram),
            Err(Error::BadVersion)
        );
        // Datagram: X on an untagged segment.
        let mut s = send.clone();
        s[0] |= FLAG_X;
        assert_eq!(
            SegmentRepr::parse(&s, Mode::Datagram),
            Err(Error::Malformed)
        );
        // Datagram: Read Response without X.
        let rresp = golden("Read Response");
        assert_eq!(
            SegmentRepr::parse(&rresp, Mode::Datagram),
            Err(Error::Malformed)
        );
        // A plain Write is fine in datagram mode.
        assert!(SegmentRepr::parse(&write, Mode::Datagram).is_ok());
    }

    #[test]
    fn unexpected_opcodes_parse() {
        let write = golden("RDMA Write");
        let send = golden("Send");
        for op in 0xCu8..=0xF {
            for (base, tagged) in [(&write, true), (&send, false)] {
                let mut u = base.clone();
                u[1] = 0x40 | op;
                let (r, h) = SegmentRepr::parse(&u, Mode::Stream).unwrap();
                assert_eq!(u8::from(r.opcode), op);
                assert_eq!(r.ddp.is_tagged(), tagged);
                assert_eq!(r.body, RdmapBody::None);
                assert_eq!(h, if tagged { 14 } else { 18 });
                assert!(r.fits(Mode::Stream));
            }
        }
        // Write-Record in datagram mode must be tagged with X.
        let mut u = write.clone();
        u[1] = 0x4C;
        assert_eq!(
            SegmentRepr::parse(&u, Mode::Datagram),
            Err(Error::Malformed)
        );
        let mut u = send.clone();
        u[1] = 0x4C;
        assert_eq!(
            SegmentRepr::parse(&u, Mode::Datagram),
            Err(Error::Malformed)
        );
        // The echo of an unexpected segment is available from its octets.
        let e = EchoedHeader::from_segment(&u).unwrap();
        assert_eq!(e.as_bytes(), &u[..18]);
        assert_eq!(EchoedHeader::from_segment(&u[..17]), Err(Error::Truncated));
        assert_eq!(EchoedHeader::from_segment(&[]), Err(Error::Truncated));
    }

    #[test]
    fn datagram_segments() {
        let rr = SegmentRepr {
            last: true,
            opcode: Opcode::ReadResponse,
            ddp: DdpHeader::Tagged {
                stag: 0x12a01,
                to: 0x1000,
                ext: Some(TaggedExt { msn: 9, mo: 0 }),
            },
            dqpn: Some(77),
            body: RdmapBody::None,
        };
        let b = bytes(&rr);
        assert_eq!(b.len(), 26);
        assert_eq!(b[0], 0xF1);
        assert_eq!(header_len_hint(&b, Mode::Datagram), Some(26));
        assert_eq!(SegmentRepr::parse(&b, Mode::Datagram), Ok((rr, 26)));
        assert_eq!(rr.validate(Mode::Stream), Err(Error::Malformed));
        // In stream mode the same octets read as a plain 14-octet header.
        let (s, h) = SegmentRepr::parse(&b, Mode::Stream).unwrap();
        assert_eq!(h, 14);
        assert_eq!(s.dqpn, None);

        let req = SegmentRepr {
            dqpn: Some(0x00FF_FFFF),
            ..untagged(
                Opcode::ReadRequest,
                RdmapBody::ReadRequest(ReadRequest {
                    sink_stag: 1,
                    sink_to: 2,
                    size: 3,
                    src_stag: 4,
                    src_to: 5,
                }),
            )
        };
        let b = bytes(&req);
        assert_eq!(b.len(), 18 + 4 + 28);
        assert_eq!(&b[18..22], &[0x00, 0xFF, 0xFF, 0xFF]);
        assert_eq!(header_len_hint(&b, Mode::Datagram), Some(50));
        assert_eq!(SegmentRepr::parse(&b, Mode::Datagram), Ok((req, 50)));
    }

    #[test]
    fn hint_edges() {
        assert_eq!(header_len_hint(&[], Mode::Stream), None);
        assert_eq!(header_len_hint(&[0x41], Mode::Stream), None);
        assert_eq!(header_len_hint(&[0x41, 0x47], Mode::Stream), None);
        assert_eq!(header_len_hint(&[0x41, 0x41], Mode::Stream), Some(46));
        assert_eq!(header_len_hint(&[0x41, 0x4A], Mode::Stream), Some(70));
        assert_eq!(header_len_hint(&[0x41, 0x4B], Mode::Stream), Some(30));
        assert_eq!(header_len_hint(&[0x41, 0x48], Mode::Stream), Some(26));
        assert_eq!(header_len_hint(&[0xC1, 0x40], Mode::Stream), Some(14));
        assert_eq!(header_len_hint(&[0xF1, 0x40], Mode::Stream), Some(14));
        assert_eq!(header_len_hint(&[0xF1, 0x40], Mode::Datagram), Some(26));
        assert_eq!(header_len_hint(&[0x51, 0x4A], Mode::Datagram), Some(74));
    }

    // ---- property tests ----

    fn arb_cause() -> impl Strategy<Value = TerminateCause> {
        (0u8..16, 0u8..16, any::<u8>()).prop_map(|(l, e, c)| TerminateCause::from_raw(l, e, c))
    }

    fn arb_terminate() -> impl Strategy<Value = TerminateRepr> {
        (
            arb_cause(),
            proptest::option::of(any::<u16>()),
            proptest::option::of(any::<[u8; 18]>()),
            proptest::option::of(any::<[u8; 28]>()),
        )
            .prop_map(|(cause, segment_len, echo, rdmap_header)| TerminateRepr {
                cause,
                segment_len,
                ddp_header: echo.map(|e| EchoedHeader::from_segment(&e).unwrap()),
                rdmap_header,
            })
    }

    fn arb_body_material() -> impl Strategy<
        Value = (
            ReadRequest,
            AtomicRequest,
            AtomicResponse,
            u64,
            TerminateRepr,
        ),
    > {
        let rr = (
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
        )
            .prop_map(|(sink_stag, sink_to, size, src_stag, src_to)| ReadRequest {
                sink_stag,
                sink_to,
                size,
                src_stag,
                src_to,
            });
        let ar = (
            prop_oneof![Just(0u32), Just(1), Just(2), any::<u32>()],
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<[u64; 4]>(),
        )
            .prop_map(|(op, req_id, stag, to, d)| AtomicRequest {
                op: AtomicOp::from(op),
                req_id,
                stag,
                to,
                add_swap: d[0],
                add_swap_mask: d[1],
                compare: d[2],
                compare_mask: d[3],
            });
        let resp = (any::<u32>(), any::<u64>())
            .prop_map(|(req_id, orig_value)| AtomicResponse { req_id, orig_value });
        (rr, ar, resp, any::<u64>(), arb_terminate())
    }

    fn arb_mode() -> impl Strategy<Value = Mode> {
        prop_oneof![Just(Mode::Stream), Just(Mode::Datagram)]
    }

    /// An arbitrary segment that `validate(mode)` accepts, covering every
    /// opcode kind (unknown ones in both buffer models).
    pub(crate) fn arb_segment() -> impl Strategy<Value = (Mode, SegmentRepr)> {
        (
            arb_mode(),
            0u8..16,
            any::<(bool, bool)>(),
            any::<[u32; 4]>(),
            any::<u64>(),
            proptest::option::of(any::<(u32, u32)>()),
            proptest::option::of(any::<u32>()),
            arb_body_material(),
        )
            .prop_map(
                |(mode, raw, (last, t_flag), w, to, ext, dqpn, (rr, ar, resp, imm, term))| {
                    let opcode = Opcode::from(raw);
                    let dg = mode == Mode::Datagram;
                    let tagged = if opcode.is_defined_in(mode) {
                        opcode.is_tagged_op()
                    } else {
                        t_flag
                    };
                    let ddp = if tagged {
                        let needs_ext =
                            dg && matches!(opcode, Opcode::ReadResponse | Opcode::WriteRecord);
                        let ext = if !dg {
                            None
                        } else if needs_ext {
                            Some(ext.unwrap_or((1, 0)))
                        } else {
                            ext
                        };
                        DdpHeader::Tagged {
                            stag: w[0],
                            to,
                            ext: ext.map(|(msn, mo)| TaggedExt { msn, mo }),
                        }
                    } else {
                        DdpHeader::Untagged {
                            rsvd_ulp: w[0],
                            qn: w[1],
                            msn: w[2],
                            mo: w[3],
                        }
                    };
                    let body = if tagged {
                        RdmapBody::None
                    } else {
                        match opcode {
                            Opcode::ReadRequest => RdmapBody::ReadRequest(rr),
                            Opcode::AtomicRequest => RdmapBody::AtomicRequest(ar),
                            Opcode::AtomicResponse => RdmapBody::AtomicResponse(resp),
                            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                                RdmapBody::Immediate(imm)
                            }
                            Opcode::Terminate => RdmapBody::Terminate(term),
                            _ => RdmapBody::None,
                        }
                    };
                    let repr = SegmentRepr {
                        last,
                        opcode,
                        ddp,
                        dqpn: if dg { dqpn } else { None },
                        body,
                    };
                    (mode, repr)
                },
            )
    }

    /// [`SegmentRepr::parse`] as it was written before it decoded the
    /// header itself: every field and check through [`DdpSegment`].
    fn parse_through_the_view(ulpdu: &[u8], mode: Mode) -> Result<(SegmentRepr, usize)> {
        if ulpdu.len() < 2 {
            return Err(Error::Truncated);
        }
        let seg = DdpSegment::new_unchecked(ulpdu, mode);
        let rctl = seg.rdmap_control();
        if seg.dv() != crate::ddp::DDP_VERSION || rctl >> 6 != RDMAP_VERSION {
            return Err(Error::BadVersion);
        }
        seg.check_control()?;
        let opcode = Opcode::from(rctl & OPCODE_MASK);
        let tagged = seg.tagged();
        if opcode.is_defined_in(mode) {
            if opcode.is_tagged_op() != tagged {
                return Err(Error::Malformed);
            }
            if mode == Mode::Datagram
                && matches!(opcode, Opcode::ReadResponse | Opcode::WriteRecord)
                && !seg.x()
            {
                return Err(Error::Malformed);
            }
        }
        seg.check_len()?;
        let off = seg.header_len();
        let (body, n) = SegmentRepr::parse_body(opcode, tagged, &ulpdu[off..])?;
        let repr = SegmentRepr {
            last: seg.last(),
            opcode,
            ddp: seg.header(),
            dqpn: seg.dqpn(),
            body,
        };
        Ok((repr, off + n))
    }

    proptest! {
        #[test]
        fn prop_emit_parse_roundtrip(
            (mode, repr) in arb_segment(),
            payload in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            prop_assert_eq!(repr.validate(mode), Ok(()));
            let mut b = bytes(&repr);
            let hlen = b.len();
            prop_assert_eq!(hlen, repr.header_len());
            if !matches!(repr.body, RdmapBody::Terminate(_)) {
                prop_assert_eq!(header_len_hint(&b, mode), Some(hlen));
            }
            prop_assert_eq!(SegmentRepr::parse(&b, mode), Ok((repr, hlen)));
            // Payload after the header: accepted exactly where the message
            // may carry one.
            b.extend_from_slice(&payload);
            let exact = matches!(
                repr.body,
                RdmapBody::ReadRequest(_) | RdmapBody::AtomicRequest(_)
                    | RdmapBody::AtomicResponse(_) | RdmapBody::Immediate(_)
            );
            let got = SegmentRepr::parse(&b, mode);
            if exact && !payload.is_empty() {
                prop_assert_eq!(got, Err(Error::Malformed));
            } else {
                prop_assert_eq!(got, Ok((repr, hlen)));
            }
            // Every strict prefix of the header is truncated (except inside
            // a Terminate's RDMAP echo, which parse tolerates being short).
            let lenient_from = match repr.body {
                RdmapBody::Terminate(TerminateRepr { rdmap_header: Some(_), .. }) => {
                    hlen - TERMINATED_RDMAP_HEADER_LEN
                }
                _ => hlen,
            };
            for cut in 0..lenient_from {
                prop_assert_eq!(SegmentRepr::parse(&b[..cut], mode), Err(Error::Truncated));
            }
        }

        #[test]
        fn prop_parse_never_panics(
            mode in arb_mode(),
            mut data in proptest::collection::vec(any::<u8>(), 0..128),
            fix_versions in any::<bool>(),
        ) {
            if fix_versions && data.len() >= 2 {
                data[0] = (data[0] & !0x03) | 0x01;
                data[1] = (data[1] & 0x3F) | 0x40;
            }
            let _ = header_len_hint(&data, mode);
            if let Ok((repr, hlen)) = SegmentRepr::parse(&data, mode) {
                prop_assert!(hlen <= data.len());
                prop_assert_eq!(hlen, repr.header_len());
                prop_assert_eq!(repr.validate(mode), Ok(()));
                if !matches!(repr.body, RdmapBody::Terminate(_)) {
                    prop_assert_eq!(header_len_hint(&data, mode), Some(hlen));
                }
                let again = bytes(&repr);
                prop_assert_eq!(SegmentRepr::parse(&again, mode), Ok((repr, hlen)));
            }
            if let Ok(seg) = DdpSegment::new_checked(&data[..], mode) {
                let _ = (seg.header(), seg.ext(), seg.dqpn(), seg.payload(), seg.mo(), seg.to());
            }
        }

        /// `parse` decodes the DDP header itself, once per segment; the
        /// checked view's accessors are the oracle: the same result (value,
        /// length or error) for any input.
        #[test]
        fn prop_parse_agrees_with_the_view(
            mode in arb_mode(),
            mut data in proptest::collection::vec(any::<u8>(), 0..72),
            fix_versions in any::<bool>(),
        ) {
            if fix_versions && data.len() >= 2 {
                data[0] = (data[0] & !0x03) | 0x01;
                data[1] = (data[1] & 0x3F) | 0x40;
            }
            prop_assert_eq!(SegmentRepr::parse(&data, mode), parse_through_the_view(&data, mode));
        }

        #[test]
        fn prop_terminate_roundtrip(t in arb_terminate(), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
            let mut b = vec![0u8; t.buffer_len()];
            t.emit(&mut b);
            let n = b.len();
            b.extend_from_slice(&tail);
            prop_assert_eq!(TerminateRepr::parse(&b), Ok((t, n)));
        }
    }
}
