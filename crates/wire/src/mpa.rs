//! MPA connection set-up frames: the MPA Request and MPA Reply (RFC 5044 §7.1),
//! with the RFC 6581 (MPA revision 2) IRD/ORD word.
//!
//! Each direction of a TCP connection starts with exactly one such frame; the
//! initiator sends a Request, the responder answers with a Reply. The frames
//! carry neither markers nor a CRC. Layout (RFC 5044 §7.1):
//!
//! ```text
//!  octet  0..16  Key: "MPA ID Req Frame" or "MPA ID Rep Frame" (no NUL)
//!  octet 16      flags: M 0x80 | C 0x40 | R 0x20 | enhanced 0x10 | reserved 0x0F
//!  octet 17      Rev (0 = pre-RFC drafts, 1 = RFC 5044, 2 = RFC 6581)
//!  octet 18..20  PD_Length, big-endian
//!  octet 20..    private data (PD_Length octets); with Rev 2 and the
//!                enhanced flag, its first 4 octets are the IRD/ORD word
//! ```
//!
//! Two levels of access are offered, as everywhere in this crate:
//!
//! * [`MpaFrame`] is a view over a buffer that reads (and, for mutable
//!   buffers, writes) the raw fields without interpreting them;
//! * [`MpaRepr`] is the decoded, validated frame. Its `private_data` is the
//!   ULP's private data only: the IRD/ORD word, when present, is split out
//!   into [`MpaRepr::ird_ord`], the way siw hides it from its ULP.
//!
//! A streaming receiver reads octets until [`frame_len`] (or, better, the
//! stricter [`check_header`]) can tell how long the frame is, then waits for
//! that many octets and calls [`MpaRepr::parse`]. Octets after the frame are
//! never looked at here; whether they are a protocol violation (siw says they
//! are) is the connection manager's decision.
//!
//! Negotiation (which flags and IRD/ORD values a Reply should carry) is not
//! this module's business; it lives in the protocol crate.

use crate::field;
use crate::{Error, Result};

/// The 16-octet key that opens an MPA Request: ASCII `"MPA ID Req Frame"`.
pub const KEY_REQUEST: [u8; 16] = *b"MPA ID Req Frame";

/// The 16-octet key that opens an MPA Reply: ASCII `"MPA ID Rep Frame"`.
pub const KEY_REPLY: [u8; 16] = *b"MPA ID Rep Frame";

/// Length of the fixed part of an MPA Request/Reply (key, flags, Rev,
/// PD_Length), in octets.
pub const HEADER_LEN: usize = 20;

/// Largest PD_Length RFC 5044 allows. Larger frames are rejected with
/// [`Error::TooLong`]. With the IRD/ORD word present, the word counts
/// toward this limit.
pub const MAX_PRIVATE_DATA: usize = 512;

/// Largest PD_Length Linux siw accepts on receive (`MPA_MAX_PRIVDATA`); it
/// drops the connection on anything larger. The IRD/ORD word counts toward
/// it. Senders that want to talk to siw keep PD_Length at or below this.
/// This module does not enforce it.
pub const SIW_MAX_PRIVATE_DATA: usize = 256;

/// Length of the RFC 6581 IRD/ORD word, in octets.
pub const IRD_ORD_LEN: usize = 4;

/// Octet 16 flag: **M**, the sender wants to *receive* markers.
pub const FLAG_MARKERS: u8 = 0x80;
/// Octet 16 flag: **C**, the sender wants CRCs (used if either side sets it).
pub const FLAG_CRC: u8 = 0x40;
/// Octet 16 flag: **R**, the responder rejects the connection (Reply only).
pub const FLAG_REJECT: u8 = 0x20;
/// Octet 16 flag: RFC 6581 enhanced connection set-up; only meaningful with
/// Rev 2, and then the private data starts with the IRD/ORD word.
pub const FLAG_ENHANCED: u8 = 0x10;
/// Octet 16 reserved bits. Sent as zero, ignored on receive.
pub const FLAG_RESERVED: u8 = 0x0F;
/// The reserved bit Linux siw uses privately (when built with `try_gso`) to
/// announce that it accepts FPDUs larger than one MSS. Treated like any other
/// reserved bit: ignored on receive, never sent.
pub const FLAG_SIW_GSO: u8 = 0x08;

/// Rev value of pre-RFC MPA drafts; siw still accepts it, and so does
/// [`MpaRepr::parse`].
pub const REV_DRAFT: u8 = 0;
/// Rev value of RFC 5044 MPA.
pub const REV_1: u8 = 1;
/// Rev value of RFC 6581 (enhanced connection set-up) MPA. The highest
/// revision this module accepts.
pub const REV_2: u8 = 2;

/// IRD/ORD word, first half: peer-to-peer (RTR) mode requested or accepted.
pub const WORD_P2P: u16 = 0x8000;
/// IRD/ORD word, first half: a zero-length Send may serve as the RTR message.
pub const WORD_RTR_SEND: u16 = 0x4000;
/// IRD/ORD word, second half: a zero-length RDMA Write may serve as the RTR
/// message.
pub const WORD_RTR_WRITE: u16 = 0x8000;
/// IRD/ORD word, second half: a zero-length RDMA Read Request may serve as
/// the RTR message.
pub const WORD_RTR_READ: u16 = 0x4000;
/// IRD/ORD word: mask of the 14-bit IRD (first half) and ORD (second half).
pub const WORD_DEPTH_MASK: u16 = 0x3FFF;
/// Largest IRD or ORD the word can carry (14 bits).
pub const IRD_ORD_MAX: u16 = WORD_DEPTH_MASK;

/// Octet offsets inside the frame.
mod ofs {
    use core::ops::Range;
    pub const KEY: Range<usize> = 0..16;
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LENGTH: usize = 18;
    pub const PD: usize = 20;
}

/// Which of the two MPA start-up frames a buffer holds; told apart by the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// The initiator's MPA Request ([`KEY_REQUEST`]).
    Request,
    /// The responder's MPA Reply ([`KEY_REPLY`]).
    Reply,
}

impl FrameKind {
    /// The key that identifies this kind of frame on the wire.
    pub const fn key(self) -> &'static [u8; 16] {
        match self {
            FrameKind::Request => &KEY_REQUEST,
            FrameKind::Reply => &KEY_REPLY,
        }
    }

    /// The kind whose key equals `key` exactly, or `None`.
    pub fn from_key(key: &[u8]) -> Option<FrameKind> {
        if key == KEY_REQUEST {
            Some(FrameKind::Request)
        } else if key == KEY_REPLY {
            Some(FrameKind::Reply)
        } else {
            None
        }
    }
}

/// The RFC 6581 IRD/ORD word that opens the private data of a Rev 2 frame
/// with the enhanced flag.
///
/// Bit layout (big-endian, RFC 6581):
///
/// ```text
///  first u16:  P2P 0x8000 | RTR zero-length Send  0x4000 | IRD 0x3FFF
///  second u16: RTR zero-length Write 0x8000 | RTR zero-length Read 0x4000 | ORD 0x3FFF
/// ```
///
/// Every 32-bit value is a valid word, so parsing never fails once four
/// octets are present.
///
/// # Depths above 14 bits
///
/// `ird` and `ord` are `u16`, but the word has only 14 bits for each.
/// [`IrdOrd::emit`] and [`IrdOrd::to_bytes`] **saturate** a value above
/// [`IRD_ORD_MAX`] to `IRD_ORD_MAX` (0x3FFF), so the flag bits next to it
/// are never disturbed and the peer still sees "as many as the field can
/// say". A saturated value does not round-trip; callers that care clamp
/// first (e.g. with [`IrdOrd::saturated`]) and negotiate with the clamped
/// value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IrdOrd {
    /// Inbound RDMA Read queue depth of the sender (0..=0x3FFF on the wire).
    pub ird: u16,
    /// Outbound RDMA Read queue depth of the sender (0..=0x3FFF on the wire).
    pub ord: u16,
    /// Peer-to-peer (ready-to-receive) mode: requested in a Request, accepted
    /// in a Reply.
    pub p2p: bool,
    /// A zero-length Send may be used as the RTR message.
    pub rtr_send: bool,
    /// A zero-length RDMA Write may be used as the RTR message.
    pub rtr_write: bool,
    /// A zero-length RDMA Read Request may be used as the RTR message.
    pub rtr_read: bool,
}

impl IrdOrd {
    /// A word with the given depths, no P2P and no RTR option.
    pub const fn new(ird: u16, ord: u16) -> IrdOrd {
        IrdOrd {
            ird,
            ord,
            p2p: false,
            rtr_send: false,
            rtr_write: false,
            rtr_read: false,
        }
    }

    /// The same word with `ird` and `ord` clamped to [`IRD_ORD_MAX`], i.e.
    /// exactly what [`IrdOrd::emit`] would put on the wire.
    pub const fn saturated(self) -> IrdOrd {
        let mut w = self;
        if w.ird > IRD_ORD_MAX {
            w.ird = IRD_ORD_MAX;
        }
        if w.ord > IRD_ORD_MAX {
            w.ord = IRD_ORD_MAX;
        }
        w
    }

    /// Whether `ird` and `ord` fit the 14-bit fields, so that emit followed
    /// by parse gives this value back.
    pub const fn is_representable(&self) -> bool {
        self.ird <= IRD_ORD_MAX && self.ord <= IRD_ORD_MAX
    }

    /// Decodes the four wire octets of the word.
    pub fn from_bytes(octets: [u8; IRD_ORD_LEN]) -> IrdOrd {
        let hi = u16::from_be_bytes([octets[0], octets[1]]);
        let lo = u16::from_be_bytes([octets[2], octets[3]]);
        IrdOrd {
            ird: hi & WORD_DEPTH_MASK,
            ord: lo & WORD_DEPTH_MASK,
            p2p: hi & WORD_P2P != 0,
            rtr_send: hi & WORD_RTR_SEND != 0,
            rtr_write: lo & WORD_RTR_WRITE != 0,
            rtr_read: lo & WORD_RTR_READ != 0,
        }
    }

    /// Encodes the word into its four wire octets, saturating depths above
    /// [`IRD_ORD_MAX`] (see the type's documentation).
    pub fn to_bytes(&self) -> [u8; IRD_ORD_LEN] {
        let w = self.saturated();
        let mut hi = w.ird & WORD_DEPTH_MASK;
        if w.p2p {
            hi |= WORD_P2P;
        }
        if w.rtr_send {
            hi |= WORD_RTR_SEND;
        }
        let mut lo = w.ord & WORD_DEPTH_MASK;
        if w.rtr_write {
            lo |= WORD_RTR_WRITE;
        }
        if w.rtr_read {
            lo |= WORD_RTR_READ;
        }
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        [a, b, c, d]
    }

    /// Parses the word from the first [`IRD_ORD_LEN`] octets of `buf`.
    ///
    /// Returns [`Error::Truncated`] if `buf` is shorter than that; any four
    /// octets form a valid word.
    pub fn parse(buf: &[u8]) -> Result<IrdOrd> {
        match buf.get(..IRD_ORD_LEN) {
            Some(&[a, b, c, d]) => Ok(IrdOrd::from_bytes([a, b, c, d])),
            _ => Err(Error::Truncated),
        }
    }

    /// Writes the word into the first [`IRD_ORD_LEN`] octets of `buf`,
    /// saturating depths above [`IRD_ORD_MAX`].
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than [`IRD_ORD_LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        buf[..IRD_ORD_LEN].copy_from_slice(&self.to_bytes());
    }
}

/// Total length of an MPA frame (header plus PD_Length), once the 20-octet
/// fixed part is in `prefix`; `None` while fewer octets have arrived.
///
/// Nothing is validated: a streaming receiver that wants to fail fast on a
/// bad key or an oversized PD_Length, instead of waiting for up to 65 555
/// octets, uses [`check_header`].
pub fn frame_len(prefix: &[u8]) -> Option<usize> {
    if prefix.len() < HEADER_LEN {
        return None;
    }
    Some(HEADER_LEN + usize::from(field::u16_at(prefix, ofs::PD_LENGTH)))
}

/// Validates the 20-octet fixed part of an MPA frame at the start of
/// `prefix` and returns the total frame length (20 + PD_Length).
///
/// The private data need not have arrived yet. The checks, in this order,
/// are those of [`MpaRepr::parse`] that depend on the fixed part only:
///
/// 1. [`Error::Truncated`] if `prefix` holds fewer than [`HEADER_LEN`] octets;
/// 2. [`Error::Malformed`] if the key is neither [`KEY_REQUEST`] nor
///    [`KEY_REPLY`];
/// 3. [`Error::BadVersion`] if Rev is above 2;
/// 4. [`Error::TooLong`] if PD_Length is above [`MAX_PRIVATE_DATA`];
/// 5. [`Error::Malformed`] if a Request has R set, if the enhanced flag is
///    set with a Rev other than 2, or if it is set with PD_Length below 4.
///
/// Reserved flag bits (0x0F, among them siw's GSO bit) are not checked.
pub fn check_header(prefix: &[u8]) -> Result<usize> {
    let Some(header) = prefix.get(..HEADER_LEN) else {
        return Err(Error::Truncated);
    };
    let view = MpaFrame::new_unchecked(header);
    let kind = view.kind().ok_or(Error::Malformed)?;
    if view.rev() > REV_2 {
        return Err(Error::BadVersion);
    }
    let pd_len = usize::from(view.pd_length());
    if pd_len > MAX_PRIVATE_DATA {
        return Err(Error::TooLong);
    }
    if kind == FrameKind::Request && view.reject() {
        return Err(Error::Malformed);
    }
    if view.enhanced() && (view.rev() != REV_2 || pd_len < IRD_ORD_LEN) {
        return Err(Error::Malformed);
    }
    Ok(HEADER_LEN + pd_len)
}

/// A view of an MPA Request or Reply in a buffer.
///
/// Accessors read the raw fields and do not validate them (a wrong key gives
/// `kind() == None`, a Rev of 7 reads as 7); [`MpaRepr::parse`] is the
/// validating decoder. The buffer may extend past the frame; the octets after
/// `HEADER_LEN + pd_length()` are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpaFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> MpaFrame<T> {
    /// Wraps `buffer` without any check. Accessors may panic if it is too
    /// short.
    pub const fn new_unchecked(buffer: T) -> MpaFrame<T> {
        MpaFrame { buffer }
    }

    /// Wraps `buffer` after [`MpaFrame::check_len`] succeeds, so that no
    /// accessor can panic.
    pub fn new_checked(buffer: T) -> Result<MpaFrame<T>> {
        let frame = MpaFrame::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    /// [`Error::Truncated`] unless the buffer holds the 20-octet fixed part
    /// and all PD_Length octets of private data.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        match frame_len(b) {
            Some(len) if b.len() >= len => Ok(()),
            _ => Err(Error::Truncated),
        }
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The 16-octet key.
    pub fn key(&self) -> [u8; 16] {
        let mut key = [0u8; 16];
        key.copy_from_slice(&self.buffer.as_ref()[ofs::KEY]);
        key
    }

    /// The frame kind the key names, or `None` if it is neither the Request
    /// nor the Reply key.
    pub fn kind(&self) -> Option<FrameKind> {
        FrameKind::from_key(&self.buffer.as_ref()[ofs::KEY])
    }

    /// Octet 16, all flag bits including the reserved ones.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[ofs::FLAGS]
    }

    /// The M flag: the sender wants to receive markers.
    pub fn markers(&self) -> bool {
        self.flags() & FLAG_MARKERS != 0
    }

    /// The C flag: the sender wants CRCs.
    pub fn crc(&self) -> bool {
        self.flags() & FLAG_CRC != 0
    }

    /// The R flag: the connection is rejected (meaningful in a Reply).
    pub fn reject(&self) -> bool {
        self.flags() & FLAG_REJECT != 0
    }

    /// The RFC 6581 enhanced connection set-up flag.
    pub fn enhanced(&self) -> bool {
        self.flags() & FLAG_ENHANCED != 0
    }

    /// The reserved bits of octet 16 (`flags() & 0x0F`), unshifted.
    pub fn reserved(&self) -> u8 {
        self.flags() & FLAG_RESERVED
    }

    /// The Rev field.
    pub fn rev(&self) -> u8 {
        self.buffer.as_ref()[ofs::REV]
    }

    /// The PD_Length field: octets of private data, IRD/ORD word included.
    pub fn pd_length(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), ofs::PD_LENGTH)
    }

    /// Total frame length, `HEADER_LEN + pd_length()`.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + usize::from(self.pd_length())
    }

    /// All PD_Length octets of private data, IRD/ORD word included.
    pub fn private_data(&self) -> &[u8] {
        &self.buffer.as_ref()[ofs::PD..self.frame_len()]
    }

    /// The IRD/ORD word, if the frame has one: Rev 2, the enhanced flag set
    /// and at least four octets of private data. `None` otherwise.
    pub fn ird_ord(&self) -> Option<IrdOrd> {
        if self.rev() == REV_2 && self.enhanced() {
            IrdOrd::parse(self.private_data()).ok()
        } else {
            None
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MpaFrame<T> {
    /// Writes the key of `kind`.
    pub fn set_kind(&mut self, kind: FrameKind) {
        self.buffer.as_mut()[ofs::KEY].copy_from_slice(kind.key());
    }

    /// Writes the 16-octet key as given (for building malformed frames).
    pub fn set_key(&mut self, key: &[u8; 16]) {
        self.buffer.as_mut()[ofs::KEY].copy_from_slice(key);
    }

    /// Writes octet 16, reserved bits included.
    pub fn set_flags(&mut self, flags: u8) {
        self.buffer.as_mut()[ofs::FLAGS] = flags;
    }

    /// Writes the Rev field.
    pub fn set_rev(&mut self, rev: u8) {
        self.buffer.as_mut()[ofs::REV] = rev;
    }

    /// Writes the PD_Length field.
    pub fn set_pd_length(&mut self, len: u16) {
        field::put_u16(self.buffer.as_mut(), ofs::PD_LENGTH, len);
    }

    /// The PD_Length octets of private data, mutable.
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let end = self.frame_len();
        &mut self.buffer.as_mut()[ofs::PD..end]
    }
}

/// A decoded MPA Request or Reply.
///
/// `private_data` is the ULP's private data only; the IRD/ORD word of an
/// enhanced Rev 2 frame is in `ird_ord`. Invariants of a representable
/// value (what [`MpaRepr::parse`] produces, and what [`MpaRepr::emit`]
/// expects):
///
/// * `ird_ord` is `Some` exactly when `rev == 2` and the enhanced flag is
///   set; emit sets the flag iff `ird_ord` is `Some`, so `ird_ord` must be
///   `None` for Rev 0 and 1;
/// * `rev <= 2`;
/// * `reject` only in a Reply;
/// * `private_data.len()` is at most [`MAX_PRIVATE_DATA`], minus
///   [`IRD_ORD_LEN`] when `ird_ord` is `Some`;
/// * the depths in `ird_ord` fit 14 bits ([`IrdOrd::is_representable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MpaRepr<'a> {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M: the sender wants to receive markers.
    pub markers: bool,
    /// C: the sender wants CRCs.
    pub crc: bool,
    /// R: the responder rejects the connection (Reply only).
    pub reject: bool,
    /// The Rev field: 0, 1 or 2.
    pub rev: u8,
    /// The RFC 6581 IRD/ORD word; `Some` iff Rev 2 with the enhanced flag.
    pub ird_ord: Option<IrdOrd>,
    /// The ULP's private data (the IRD/ORD word excluded).
    pub private_data: &'a [u8],
}

impl<'a> MpaRepr<'a> {
    /// A Request with no flags set. With an IRD/ORD word it is Rev 2 with
    /// the enhanced flag (what siw sends by default); without one, Rev 1.
    pub const fn request(ird_ord: Option<IrdOrd>, private_data: &'a [u8]) -> MpaRepr<'a> {
        MpaRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: false,
            reject: false,
            rev: if ird_ord.is_some() { REV_2 } else { REV_1 },
            ird_ord,
            private_data,
        }
    }

    /// A Reply with no flags set (an acceptance). With an IRD/ORD word it is
    /// Rev 2 with the enhanced flag; without one, Rev 1.
    pub const fn reply(ird_ord: Option<IrdOrd>, private_data: &'a [u8]) -> MpaRepr<'a> {
        MpaRepr {
            kind: FrameKind::Reply,
            ..MpaRepr::request(ird_ord, private_data)
        }
    }

    /// Parses and validates the MPA frame at the start of `buf`.
    ///
    /// Returns the frame and the number of octets it occupies
    /// (`20 + PD_Length`). Octets after the frame are not looked at.
    ///
    /// Errors, checked in this order:
    ///
    /// * [`Error::Truncated`]: fewer than 20 octets;
    /// * [`Error::Malformed`]: the key is neither Request nor Reply;
    /// * [`Error::BadVersion`]: Rev above 2 (0, 1 and 2 are accepted);
    /// * [`Error::TooLong`]: PD_Length above 512;
    /// * [`Error::Malformed`]: R set in a Request; the enhanced flag with a
    ///   Rev other than 2; the enhanced flag with PD_Length below 4;
    /// * [`Error::Truncated`]: the buffer ends before the private data does.
    ///
    /// Reserved flag bits are ignored. Never panics, never allocates.
    pub fn parse(buf: &'a [u8]) -> Result<(MpaRepr<'a>, usize)> {
        let len = check_header(buf)?;
        let frame = MpaFrame::new_checked(buf)?;
        let kind = frame.kind().ok_or(Error::Malformed)?;
        let pd = &buf[ofs::PD..len];
        let (ird_ord, private_data) = if frame.enhanced() {
            let (word, rest) = pd.split_at_checked(IRD_ORD_LEN).ok_or(Error::Malformed)?;
            (Some(IrdOrd::parse(word)?), rest)
        } else {
            (None, pd)
        };
        let repr = MpaRepr {
            kind,
            markers: frame.markers(),
            crc: frame.crc(),
            reject: frame.reject(),
            rev: frame.rev(),
            ird_ord,
            private_data,
        };
        Ok((repr, len))
    }

    /// The PD_Length this frame carries: the ULP private data plus the
    /// IRD/ORD word if present.
    pub fn pd_length(&self) -> usize {
        self.private_data.len()
            + if self.ird_ord.is_some() {
                IRD_ORD_LEN
            } else {
                0
            }
    }

    /// Octets [`MpaRepr::emit`] writes: `20 + PD_Length`.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.pd_length()
    }

    /// The octet 16 this frame is emitted with (reserved bits zero).
    pub fn flags(&self) -> u8 {
        let mut flags = 0;
        if self.markers {
            flags |= FLAG_MARKERS;
        }
        if self.crc {
            flags |= FLAG_CRC;
        }
        if self.reject {
            flags |= FLAG_REJECT;
        }
        if self.ird_ord.is_some() {
            flags |= FLAG_ENHANCED;
        }
        flags
    }

    /// Writes the frame into the first [`MpaRepr::buffer_len`] octets of
    /// `buf`. Reserved flag bits are written as zero; the enhanced flag is
    /// set iff `ird_ord` is `Some`. IRD/ORD depths above 0x3FFF are
    /// saturated (see [`IrdOrd`]).
    ///
    /// A value that breaks the type's invariants (Rev other than 2 with an
    /// IRD/ORD word, R in a Request, too much private data) trips a
    /// `debug_assert!`; in release builds the frame is written as asked and
    /// a conforming receiver will refuse it.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than `buffer_len()`, or if the private data does
    /// not fit the 16-bit PD_Length field at all (a caller bug either way).
    pub fn emit(&self, buf: &mut [u8]) {
        let pd_len = self.pd_length();
        debug_assert!(
            self.ird_ord.is_none() || self.rev == REV_2,
            "an IRD/ORD word needs Rev 2"
        );
        debug_assert!(
            !(self.reject && self.kind == FrameKind::Request),
            "R is only valid in a Reply"
        );
        debug_assert!(
            pd_len <= MAX_PRIVATE_DATA,
            "MPA private data above 512 octets (IRD/ORD word included)"
        );
        let pd_length = u16::try_from(pd_len).expect("MPA private data does not fit PD_Length");
        let buf = &mut buf[..HEADER_LEN + pd_len];
        let mut frame = MpaFrame::new_unchecked(buf);
        frame.set_kind(self.kind);
        frame.set_flags(self.flags());
        frame.set_rev(self.rev);
        frame.set_pd_length(pd_length);
        let pd = frame.private_data_mut();
        let ulp = match self.ird_ord {
            Some(word) => {
                word.emit(pd);
                &mut pd[IRD_ORD_LEN..]
            }
            None => pd,
        };
        ulp.copy_from_slice(self.private_data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// golden.txt: "MPA Request rev2, C=1, enh, IRD=ORD=16, PD='ulp-hello'".
    const GOLDEN_REQUEST: [u8; 33] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, //
        0x50, 0x02, 0x00, 0x0d, 0x00, 0x10, 0x00, 0x10, 0x75, 0x6c, 0x70, 0x2d, 0x68, 0x65, 0x6c,
        0x6c, //
        0x6f,
    ];

    /// golden.txt: "MPA Reply rev2, C=1, enh, IRD=ORD=16, PD='ulp-ok'".
    const GOLDEN_REPLY: [u8; 30] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d,
        0x65, //
        0x50, 0x02, 0x00, 0x0a, 0x00, 0x10, 0x00, 0x10, 0x75, 0x6c, 0x70, 0x2d, 0x6f, 0x6b,
    ];

    fn emit_vec(repr: &MpaRepr<'_>) -> Vec<u8> {
        let mut out = vec![0xAA; repr.buffer_len()];
        repr.emit(&mut out);
        out
    }

    /// A frame built field by field through the view, bypassing emit's
    /// invariants.
    fn raw(key: &[u8; 16], flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + pd.len()];
        let mut f = MpaFrame::new_unchecked(&mut b[..]);
        f.set_key(key);
        f.set_flags(flags);
        f.set_rev(rev);
        f.set_pd_length(u16::try_from(pd.len()).unwrap());
        f.private_data_mut().copy_from_slice(pd);
        b
    }

    #[test]
    fn keys_differ_only_in_octet_9() {
        assert_eq!(&KEY_REQUEST, b"MPA ID Req Frame");
        assert_eq!(&KEY_REPLY, b"MPA ID Rep Frame");
        let diff: Vec<usize> = (0..16)
            .filter(|&i| KEY_REQUEST[i] != KEY_REPLY[i])
            .collect();
        assert_eq!(diff, [9]);
        assert_eq!(FrameKind::from_key(&KEY_REQUEST), Some(FrameKind::Request));
        assert_eq!(FrameKind::from_key(&KEY_REPLY), Some(FrameKind::Reply));
        assert_eq!(FrameKind::from_key(b"MPA ID Req Fram"), None);
    }

    #[test]
    fn golden_request() {
        let (repr, len) = MpaRepr::parse(&GOLDEN_REQUEST).unwrap();
        assert_eq!(len, 33);
        assert_eq!(
            repr,
            MpaRepr {
                kind: FrameKind::Request,
                markers: false,
                crc: true,
                reject: false,
                rev: 2,
                ird_ord: Some(IrdOrd::new(16, 16)),
                private_data: b"ulp-hello",
            }
        );
        assert_eq!(repr.buffer_len(), GOLDEN_REQUEST.len());
        assert_eq!(emit_vec(&repr), GOLDEN_REQUEST);

        let view = MpaFrame::new_checked(&GOLDEN_REQUEST[..]).unwrap();
        assert_eq!(view.key(), KEY_REQUEST);
        assert_eq!(view.kind(), Some(FrameKind::Request));
        assert!(view.crc() && view.enhanced());
        assert!(!view.markers() && !view.reject());
        assert_eq!(view.reserved(), 0);
        assert_eq!(view.rev(), 2);
        assert_eq!(view.pd_length(), 13);
        assert_eq!(view.private_data(), b"\x00\x10\x00\x10ulp-hello");
        assert_eq!(view.ird_ord(), Some(IrdOrd::new(16, 16)));
        assert_eq!(frame_len(&GOLDEN_REQUEST[..20]), Some(33));
        assert_eq!(check_header(&GOLDEN_REQUEST[..20]), Ok(33));
    }

    #[test]
    fn golden_reply() {
        let (repr, len) = MpaRepr::parse(&GOLDEN_REPLY).unwrap();
        assert_eq!(len, 30);
        let expected = MpaRepr {
            crc: true,
            ..MpaRepr::reply(Some(IrdOrd::new(16, 16)), b"ulp-ok")
        };
        assert_eq!(repr, expected);
        assert_eq!(emit_vec(&expected), GOLDEN_REPLY);
        let view = MpaFrame::new_checked(GOLDEN_REPLY).unwrap();
        assert_eq!(view.kind(), Some(FrameKind::Reply));
        assert_eq!(view.into_inner(), GOLDEN_REPLY);
    }

    #[test]
    fn siw_default_request() {
        // Octet 16 = 0x10 (enhanced only), Rev 2, PD = the IRD/ORD word only.
        let b = raw(&KEY_REQUEST, 0x10, 2, &[0x00, 0x80, 0x00, 0x80]);
        let (repr, len) = MpaRepr::parse(&b).unwrap();
        assert_eq!(len, 24);
        assert_eq!(repr, MpaRepr::request(Some(IrdOrd::new(128, 128)), &[]));
        assert_eq!(emit_vec(&repr), b);
    }

    #[test]
    fn siw_gso_bit_and_reserved_bits_ignored() {
        for reserved in 1..=0x0F {
            let b = raw(&KEY_REPLY, FLAG_CRC | reserved, 1, b"x");
            let (repr, _) = MpaRepr::parse(&b).unwrap();
            assert_eq!(
                repr,
                MpaRepr {
                    crc: true,
                    ..MpaRepr::reply(None, b"x")
                }
            );
            // Re-emitted with the reserved bits cleared.
            let out = emit_vec(&repr);
            assert_eq!(out[16], FLAG_CRC);
            assert_eq!(MpaFrame::new_checked(&b[..]).unwrap().reserved(), reserved);
        }
        let b = raw(&KEY_REQUEST, FLAG_ENHANCED | FLAG_SIW_GSO, 2, &[0, 1, 0, 2]);
        let (repr, _) = MpaRepr::parse(&b).unwrap();
        assert_eq!(repr.ird_ord, Some(IrdOrd::new(1, 2)));
    }

    #[test]
    fn rev1_and_rev0_have_no_word() {
        for rev in [0, 1] {
            let b = raw(&KEY_REQUEST, FLAG_MARKERS, rev, b"\x00\x10\x00\x10abc");
            let (repr, len) = MpaRepr::parse(&b).unwrap();
            assert_eq!(len, b.len());
            assert_eq!(repr.rev, rev);
            assert!(repr.markers);
            assert_eq!(repr.ird_ord, None);
            assert_eq!(repr.private_data, b"\x00\x10\x00\x10abc");
            assert_eq!(emit_vec(&repr), b);
            assert_eq!(MpaFrame::new_checked(&b[..]).unwrap().ird_ord(), None);
        }
        // Rev 2 without the enhanced flag: no word either.
        let b = raw(&KEY_REPLY, 0, 2, b"\x00\x10");
        let (repr, _) = MpaRepr::parse(&b).unwrap();
        assert_eq!(repr.ird_ord, None);
        assert_eq!(repr.private_data, b"\x00\x10");
        let r1 = MpaRepr::request(None, b"hi");
        assert_eq!(r1.rev, 1);
        assert_eq!(MpaRepr::parse(&emit_vec(&r1)).unwrap(), (r1, 22));
    }

    #[test]
    fn reject_reply_accepted() {
        let b = raw(&KEY_REPLY, FLAG_REJECT, 1, b"no");
        let (repr, _) = MpaRepr::parse(&b).unwrap();
        assert!(repr.reject);
        assert_eq!(repr.kind, FrameKind::Reply);
        assert_eq!(emit_vec(&repr), b);
    }

    #[test]
    fn trailing_octets_not_looked_at() {
        let mut b = GOLDEN_REQUEST.to_vec();
        b.extend_from_slice(&[0xFF; 7]);
        let (repr, len) = MpaRepr::parse(&b).unwrap();
        assert_eq!(len, GOLDEN_REQUEST.len());
        assert_eq!(repr.private_data, b"ulp-hello");
        let view = MpaFrame::new_checked(&b[..]).unwrap();
        assert_eq!(view.private_data().len(), 13);
    }

    #[test]
    fn truncated() {
        for n in 0..GOLDEN_REQUEST.len() {
            assert_eq!(
                MpaRepr::parse(&GOLDEN_REQUEST[..n]),
                Err(Error::Truncated),
                "n={n}"
            );
            assert_eq!(
                MpaFrame::new_checked(&GOLDEN_REQUEST[..n]).err(),
                Some(Error::Truncated)
            );
            let expect = if n < HEADER_LEN { None } else { Some(33) };
            assert_eq!(frame_len(&GOLDEN_REQUEST[..n]), expect);
        }
        assert_eq!(check_header(&GOLDEN_REQUEST[..19]), Err(Error::Truncated));
    }

    #[test]
    fn bad_key() {
        let mut b = GOLDEN_REQUEST;
        b[9] = b'x';
        assert_eq!(MpaRepr::parse(&b), Err(Error::Malformed));
        assert_eq!(MpaFrame::new_checked(&b[..]).unwrap().kind(), None);
        // Lower-case, or a NUL-terminated variant: also not a key.
        let b = raw(b"mpa id req frame", 0, 1, b"");
        assert_eq!(MpaRepr::parse(&b), Err(Error::Malformed));
        let b = raw(b"MPA ID Req Fram\0", 0, 1, b"");
        assert_eq!(MpaRepr::parse(&b), Err(Error::Malformed));
        // The key is checked before the private data is awaited.
        assert_eq!(
            MpaRepr::parse(&b"MPA ID Xxx Frame\0\x01\x00\x10"[..]),
            Err(Error::Malformed)
        );
    }

    #[test]
    fn reject_in_request_is_malformed() {
        let b = raw(&KEY_REQUEST, FLAG_REJECT, 1, b"");
        assert_eq!(MpaRepr::parse(&b), Err(Error::Malformed));
    }

    #[test]
    fn enhanced_needs_rev2() {
        for rev in [0, 1] {
            let b = raw(&KEY_REQUEST, FLAG_ENHANCED, rev, &[0, 16, 0, 16]);
            assert_eq!(MpaRepr::parse(&b), Err(Error::Malformed), "rev={rev}");
        }
    }

    #[test]
    fn enhanced_needs_word() {
        for n in 0..IRD_ORD_LEN {
            let b = raw(&KEY_REPLY, FLAG_ENHANCED, 2, &[0u8; 4][..n]);
            assert_eq!(MpaRepr::parse(&b), Err(Error::Malformed), "pd={n}");
            assert_eq!(MpaFrame::new_checked(&b[..]).unwrap().ird_ord(), None);
        }
    }

    #[test]
    fn bad_version() {
        for rev in [3, 4, 0x80, 0xFF] {
            let b = raw(&KEY_REQUEST, 0, rev, b"");
            assert_eq!(MpaRepr::parse(&b), Err(Error::BadVersion), "rev={rev}");
        }
    }

    #[test]
    fn private_data_limit() {
        let pd = [0x5Au8; MAX_PRIVATE_DATA + 1];
        let b = raw(&KEY_REQUEST, 0, 1, &pd[..MAX_PRIVATE_DATA]);
        let (repr, len) = MpaRepr::parse(&b).unwrap();
        assert_eq!(len, HEADER_LEN + MAX_PRIVATE_DATA);
        assert_eq!(repr.private_data.len(), MAX_PRIVATE_DATA);

        let b = raw(&KEY_REQUEST, 0, 1, &pd);
        assert_eq!(MpaRepr::parse(&b), Err(Error::TooLong));
        // Rejected from the header alone, before the private data arrives.
        assert_eq!(check_header(&b[..HEADER_LEN]), Err(Error::TooLong));
        assert_eq!(MpaRepr::parse(&b[..HEADER_LEN]), Err(Error::TooLong));

        // With the word, 508 octets of ULP data is the most.
        let word = Some(IrdOrd::new(1, 1));
        let ok = MpaRepr::request(word, &pd[..MAX_PRIVATE_DATA - IRD_ORD_LEN]);
        assert_eq!(ok.buffer_len(), HEADER_LEN + MAX_PRIVATE_DATA);
        assert_eq!(MpaRepr::parse(&emit_vec(&ok)).unwrap().0, ok);
        let mut b = raw(&KEY_REQUEST, FLAG_ENHANCED, 2, &pd);
        b[20..24].copy_from_slice(&[0, 1, 0, 1]);
        assert_eq!(MpaRepr::parse(&b), Err(Error::TooLong));

        // The largest PD_Length the field can say.
        let mut h = raw(&KEY_REPLY, 0, 2, b"");
        h[18] = 0xFF;
        h[19] = 0xFF;
        assert_eq!(frame_len(&h), Some(HEADER_LEN + 0xFFFF));
        assert_eq!(MpaRepr::parse(&h), Err(Error::TooLong));
    }

    #[test]
    fn ird_ord_bits() {
        let all = IrdOrd {
            ird: 0x3FFF,
            ord: 0x3FFF,
            p2p: true,
            rtr_send: true,
            rtr_write: true,
            rtr_read: true,
        };
        assert_eq!(all.to_bytes(), [0xFF; 4]);
        assert_eq!(IrdOrd::from_bytes([0xFF; 4]), all);
        assert_eq!(IrdOrd::from_bytes([0; 4]), IrdOrd::default());

        let w = IrdOrd {
            p2p: true,
            ..IrdOrd::default()
        };
        assert_eq!(w.to_bytes(), [0x80, 0, 0, 0]);
        let w = IrdOrd {
            rtr_send: true,
            ..IrdOrd::default()
        };
        assert_eq!(w.to_bytes(), [0x40, 0, 0, 0]);
        let w = IrdOrd {
            rtr_write: true,
            ..IrdOrd::default()
        };
        assert_eq!(w.to_bytes(), [0, 0, 0x80, 0]);
        let w = IrdOrd {
            rtr_read: true,
            ..IrdOrd::default()
        };
        assert_eq!(w.to_bytes(), [0, 0, 0x40, 0]);
        assert_eq!(
            IrdOrd::new(0x1234, 0x0ABC).to_bytes(),
            [0x12, 0x34, 0x0A, 0xBC]
        );

        // siw's P2P initiator: Read + Write RTR offered.
        let siw = IrdOrd::from_bytes([0x80, 0x80, 0xC0, 0x01]);
        assert_eq!(
            siw,
            IrdOrd {
                ird: 128,
                ord: 1,
                p2p: true,
                rtr_send: false,
                rtr_write: true,
                rtr_read: true,
            }
        );

        assert_eq!(IrdOrd::parse(&[1, 2, 3]), Err(Error::Truncated));
        assert_eq!(IrdOrd::parse(&[0, 5, 0, 6, 9]), Ok(IrdOrd::new(5, 6)));
    }

    #[test]
    fn ird_ord_saturates_without_touching_flags() {
        let big = IrdOrd::new(0x4000, 0xFFFF);
        assert!(!big.is_representable());
        assert_eq!(big.to_bytes(), [0x3F, 0xFF, 0x3F, 0xFF]);
        assert_eq!(big.saturated(), IrdOrd::new(IRD_ORD_MAX, IRD_ORD_MAX));
        assert!(big.saturated().is_representable());
        let flagged = IrdOrd {
            p2p: true,
            rtr_read: true,
            ..big
        };
        assert_eq!(flagged.to_bytes(), [0xBF, 0xFF, 0x7F, 0xFF]);
        let mut buf = [0u8; 6];
        flagged.emit(&mut buf);
        assert_eq!(buf, [0xBF, 0xFF, 0x7F, 0xFF, 0, 0]);
    }

    #[test]
    #[should_panic]
    fn emit_short_buffer_panics() {
        let repr = MpaRepr::request(None, b"abc");
        let mut buf = [0u8; 22];
        repr.emit(&mut buf);
    }

    #[test]
    fn emit_leaves_octets_after_frame_alone() {
        let repr = MpaRepr::reply(Some(IrdOrd::new(2, 3)), b"z");
        let mut buf = [0xEEu8; 40];
        repr.emit(&mut buf);
        assert!(buf[repr.buffer_len()..].iter().all(|&b| b == 0xEE));
        assert_eq!(MpaRepr::parse(&buf).unwrap(), (repr, 25));
    }

    fn arb_ird_ord() -> impl Strategy<Value = IrdOrd> {
        (
            0..=IRD_ORD_MAX,
            0..=IRD_ORD_MAX,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(ird, ord, p2p, rtr_send, rtr_write, rtr_read)| IrdOrd {
                ird,
                ord,
                p2p,
                rtr_send,
                rtr_write,
                rtr_read,
            })
    }

    /// Everything an `MpaRepr` needs, owning its private data.
    #[derive(Debug, Clone)]
    struct Owned {
        kind: FrameKind,
        markers: bool,
        crc: bool,
        reject: bool,
        rev: u8,
        ird_ord: Option<IrdOrd>,
        pd: Vec<u8>,
    }

    impl Owned {
        fn repr(&self) -> MpaRepr<'_> {
            MpaRepr {
                kind: self.kind,
                markers: self.markers,
                crc: self.crc,
                reject: self.reject,
                rev: self.rev,
                ird_ord: self.ird_ord,
                private_data: &self.pd,
            }
        }
    }

    fn arb_repr() -> impl Strategy<Value = Owned> {
        let kind = prop_oneof![Just(FrameKind::Request), Just(FrameKind::Reply)];
        (
            kind,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            0u8..=2,
            proptest::option::of(arb_ird_ord()),
        )
            .prop_flat_map(|(kind, markers, crc, reject, rev, word)| {
                let ird_ord = if rev == REV_2 { word } else { None };
                let reject = reject && kind == FrameKind::Reply;
                let max = MAX_PRIVATE_DATA - if ird_ord.is_some() { IRD_ORD_LEN } else { 0 };
                proptest::collection::vec(any::<u8>(), 0..=max).prop_map(move |pd| Owned {
                    kind,
                    markers,
                    crc,
                    reject,
                    rev,
                    ird_ord,
                    pd,
                })
            })
    }

    /// Byte strings that look like MPA frames often enough to get past the
    /// key check: a real or random key, any flags and Rev, a PD_Length near
    /// the tail's length, and a random tail.
    fn arb_frameish() -> impl Strategy<Value = Vec<u8>> {
        let key = prop_oneof![Just(KEY_REQUEST), Just(KEY_REPLY), any::<[u8; 16]>(),];
        let rev = prop_oneof![3 => 0u8..=3, 1 => any::<u8>()];
        (
            key,
            any::<u8>(),
            rev,
            proptest::collection::vec(any::<u8>(), 0..600),
            any::<bool>(),
            -3i32..=1,
        )
            .prop_map(|(key, flags, rev, tail, exact, skew)| {
                let pd_len = if exact {
                    i32::try_from(tail.len()).unwrap() + skew
                } else {
                    i32::from(u16::from_be_bytes([
                        tail.first().copied().unwrap_or(0),
                        skew as u8,
                    ]))
                };
                let pd_len = u16::try_from(pd_len.max(0)).unwrap();
                let mut b = Vec::with_capacity(HEADER_LEN + tail.len());
                b.extend_from_slice(&key);
                b.push(flags);
                b.push(rev);
                b.extend_from_slice(&pd_len.to_be_bytes());
                b.extend_from_slice(&tail);
                b
            })
    }

    /// Parse must not panic; when it succeeds, the frame re-emits to the
    /// same octets except for cleared reserved bits, and parses back equal.
    fn check_arbitrary(bytes: &[u8]) -> core::result::Result<(), TestCaseError> {
        let view = MpaFrame::new_checked(bytes);
        if let Ok(view) = view {
            let _ = (
                view.key(),
                view.kind(),
                view.flags(),
                view.rev(),
                view.private_data(),
                view.ird_ord(),
            );
        }
        let _ = frame_len(bytes);
        let header = check_header(bytes);
        match MpaRepr::parse(bytes) {
            Ok((repr, len)) => {
                prop_assert_eq!(header, Ok(len));
                prop_assert!(len <= bytes.len());
                prop_assert_eq!(repr.buffer_len(), len);
                let out = emit_vec(&repr);
                let mut expect = bytes[..len].to_vec();
                expect[16] &= !FLAG_RESERVED;
                prop_assert_eq!(&out, &expect);
                prop_assert_eq!(MpaRepr::parse(&out), Ok((repr, len)));
            }
            Err(e) => {
                if let Err(h) = header {
                    prop_assert_eq!(h, e);
                } else {
                    prop_assert_eq!(e, Error::Truncated);
                }
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn roundtrip_emit_parse(owned in arb_repr()) {
            let repr = owned.repr();
            let out = emit_vec(&repr);
            prop_assert_eq!(out.len(), repr.buffer_len());
            prop_assert_eq!(out[16] & FLAG_RESERVED, 0);
            prop_assert_eq!(out[16] & FLAG_ENHANCED != 0, repr.ird_ord.is_some());
            prop_assert_eq!(frame_len(&out), Some(out.len()));
            prop_assert_eq!(MpaRepr::parse(&out), Ok((repr, out.len())));
            let view = MpaFrame::new_checked(&out[..]).unwrap();
            prop_assert_eq!(view.ird_ord(), repr.ird_ord);
        }

        #[test]
        fn ird_ord_roundtrip(word in arb_ird_ord(), raw in any::<[u8; 4]>()) {
            prop_assert_eq!(IrdOrd::from_bytes(word.to_bytes()), word);
            prop_assert_eq!(IrdOrd::from_bytes(raw).to_bytes(), raw);
        }

        #[test]
        fn parse_never_panics_random(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            check_arbitrary(&bytes)?;
        }

        #[test]
        fn parse_never_panics_frameish(bytes in arb_frameish()) {
            check_arbitrary(&bytes)?;
        }
    }
}
