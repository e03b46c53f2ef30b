//! DDP segment headers (RFC 5041 §4) and the softrdma datagram extension words.
//!
//! Every ULPDU starts with a DDP header. Its first octet is the DDP control
//! octet, its second belongs to the ULP (RDMAP uses it as its own control
//! octet, see [`crate::rdmap`]). Two layouts follow, chosen by the T bit:
//!
//! ```text
//! tagged (T=1), 14 octets            untagged (T=0), 18 octets
//!  0: DDP control                     0: DDP control
//!  1: RDMAP control                   1: RDMAP control
//!  2: STag            (4)             2: RsvdULP[8:39] (4)  Invalidate STag
//!  6: TO              (8)             6: QN            (4)
//! 14: payload                        10: MSN           (4)
//!                                    14: MO            (4)
//!                                    18: RDMAP header part, payload
//! ```
//!
//! # Two modes
//!
//! * [`Mode::Stream`] (TCP/MPA): bits 0x3C of the control octet are reserved.
//!   RFC 5041 §4.2 (DDP Control Field) has the sender set reserved bits to
//!   zero and the receiver leave them unchecked, so a stream-mode receiver
//!   ignores them and a stream-mode sender never sets them.
//! * [`Mode::Datagram`] (softrdma iWARP over UDP, `docs/datagram.md`): bit
//!   0x20 (**X**) adds the tagged sequence extension (T-MSN, T-MO) after a
//!   tagged header, bit 0x10 (**Q**) adds a Destination QP Number word after
//!   the (extended) DDP header. Bits 0x0C stay reserved; a receiver drops a
//!   segment that sets any of them, or X on an untagged segment, as
//!   [`Error::Malformed`].
//!
//! ```text
//! datagram tagged:    ctrl rdmap STag TO [T-MSN T-MO]X [DQPN]Q payload
//! datagram untagged:  ctrl rdmap RsvdULP QN MSN MO [DQPN]Q RDMAP-part payload
//! ```

use crate::field::{u32_at, u64_at};
use crate::{Error, Result};

/// Length of the tagged DDP header (RFC 5041 §4.3).
pub const TAGGED_HEADER_LEN: usize = 14;
/// Length of the untagged DDP header (RFC 5041 §4.4).
pub const UNTAGGED_HEADER_LEN: usize = 18;
/// The DDP version this crate speaks (DV field; 1 = RFC 5041).
pub const DDP_VERSION: u8 = 1;

/// Length of the tagged sequence extension (T-MSN + T-MO), datagram mode.
pub const EXT_LEN: usize = 8;
/// Length of the Destination QP Number word, datagram mode.
pub const DQPN_LEN: usize = 4;

/// Control octet: T, tagged buffer model.
pub const FLAG_T: u8 = 0x80;
/// Control octet: L, last segment of the DDP message.
pub const FLAG_L: u8 = 0x40;
/// Control octet: X, tagged sequence extension present (datagram mode only).
pub const FLAG_X: u8 = 0x20;
/// Control octet: Q, Destination QP Number present (datagram mode only).
pub const FLAG_Q: u8 = 0x10;
/// Control octet: bits reserved in both modes.
pub const RESERVED_MASK: u8 = 0x0C;
/// Control octet: every bit reserved in stream mode (X, Q and [`RESERVED_MASK`]).
pub const STREAM_RESERVED_MASK: u8 = 0x3C;
/// Control octet: DV, the DDP version.
pub const DV_MASK: u8 = 0x03;

/// Which lower layer the DDP segment travels on; decides what the reserved
/// bits of the control octet mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// TCP with MPA framing: standard RFC 5041, bits 0x3C reserved.
    Stream,
    /// softrdma iWARP over UDP: X and Q carry meaning, 0x0C reserved.
    Datagram,
}

impl Mode {
    /// The control-octet bits a receiver treats as reserved in this mode.
    pub const fn reserved_mask(self) -> u8 {
        match self {
            Mode::Stream => STREAM_RESERVED_MASK,
            Mode::Datagram => RESERVED_MASK,
        }
    }
}

/// The tagged sequence extension words (datagram mode, X bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaggedExt {
    /// T-MSN: tagged message sequence number (a Read Response echoes the MSN
    /// of the Read Request it answers).
    pub msn: u32,
    /// T-MO: octet offset of this segment within its tagged message.
    pub mo: u32,
}

/// The buffer-model part of a DDP header: everything but the two control
/// octets and the datagram-mode DQPN word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DdpHeader {
    /// Tagged buffer model (T=1).
    Tagged {
        /// Data sink steering tag.
        stag: u32,
        /// Tagged offset of the first payload octet.
        to: u64,
        /// Datagram-mode sequence extension (X bit); always `None` in stream mode.
        ext: Option<TaggedExt>,
    },
    /// Untagged buffer model (T=0).
    Untagged {
        /// `RsvdULP[8:39]`: zero, or the Invalidate STag of a Send with Invalidate.
        rsvd_ulp: u32,
        /// Queue number.
        qn: u32,
        /// Message sequence number.
        msn: u32,
        /// Message offset of this segment.
        mo: u32,
    },
}

impl DdpHeader {
    /// Whether this is the tagged buffer model.
    pub const fn is_tagged(&self) -> bool {
        matches!(self, DdpHeader::Tagged { .. })
    }

    /// Octets this header takes, control octets included, DQPN excluded:
    /// 14 or 18, plus 8 for a tagged extension.
    pub const fn buffer_len(&self) -> usize {
        match self {
            DdpHeader::Tagged { ext: None, .. } => TAGGED_HEADER_LEN,
            DdpHeader::Tagged { ext: Some(_), .. } => TAGGED_HEADER_LEN + EXT_LEN,
            DdpHeader::Untagged { .. } => UNTAGGED_HEADER_LEN,
        }
    }

    /// The DDP control octet for this header: T, L, X, Q as given, DV = 1.
    pub const fn control_octet(&self, last: bool, dqpn: bool) -> u8 {
        let mut c = DDP_VERSION;
        if last {
            c |= FLAG_L;
        }
        if dqpn {
            c |= FLAG_Q;
        }
        match self {
            DdpHeader::Tagged { ext, .. } => {
                c |= FLAG_T;
                if ext.is_some() {
                    c |= FLAG_X;
                }
            }
            DdpHeader::Untagged { .. } => {}
        }
        c
    }

    /// Writes the DDP header: control octet, `rdmap_control` as octet 1, the
    /// buffer-model fields, the extension words and, when `dqpn` is given, the
    /// DQPN word. Returns the number of octets written
    /// (`buffer_len() + 4·dqpn.is_some()`).
    ///
    /// # Panics
    /// If `buf` is shorter than that.
    pub fn emit(&self, last: bool, rdmap_control: u8, dqpn: Option<u32>, buf: &mut [u8]) -> usize {
        use crate::field::{put_u32, put_u64};
        let len = self.buffer_len() + if dqpn.is_some() { DQPN_LEN } else { 0 };
        let buf = &mut buf[..len];
        buf[0] = self.control_octet(last, dqpn.is_some());
        buf[1] = rdmap_control;
        match *self {
            DdpHeader::Tagged { stag, to, ext } => {
                put_u32(buf, 2, stag);
                put_u64(buf, 6, to);
                if let Some(e) = ext {
                    put_u32(buf, TAGGED_HEADER_LEN, e.msn);
                    put_u32(buf, TAGGED_HEADER_LEN + 4, e.mo);
                }
            }
            DdpHeader::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
            } => {
                put_u32(buf, 2, rsvd_ulp);
                put_u32(buf, 6, qn);
                put_u32(buf, 10, msn);
                put_u32(buf, 14, mo);
            }
        }
        if let Some(q) = dqpn {
            put_u32(buf, self.buffer_len(), q);
        }
        len
    }
}

/// A read-only view of a DDP segment (a ULPDU, DDP header first).
///
/// The view knows its [`Mode`], since that decides whether the X and Q bits
/// add words to the header. [`DdpSegment::new_checked`] guarantees that the
/// whole DDP header (extension words and DQPN included) is in the buffer; it
/// does not check versions or reserved bits (see [`DdpSegment::check_control`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DdpSegment<T: AsRef<[u8]>> {
    buffer: T,
    mode: Mode,
}

impl<T: AsRef<[u8]>> DdpSegment<T> {
    /// Wraps a buffer without any check.
    pub const fn new_unchecked(buffer: T, mode: Mode) -> Self {
        DdpSegment { buffer, mode }
    }

    /// Wraps a buffer, checking that it holds the whole DDP header.
    pub fn new_checked(buffer: T, mode: Mode) -> Result<Self> {
        let s = Self::new_unchecked(buffer, mode);
        s.check_len()?;
        Ok(s)
    }

    /// [`Error::Truncated`] unless the buffer holds the two control octets and
    /// every header field they announce.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < 2 || b.len() < self.header_len() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Checks the control octet: [`Error::BadVersion`] unless DV = 1; in
    /// datagram mode, [`Error::Malformed`] for X on an untagged segment or any
    /// bit of [`RESERVED_MASK`]. Stream mode ignores the reserved bits.
    pub fn check_control(&self) -> Result<()> {
        if self.dv() != DDP_VERSION {
            return Err(Error::BadVersion);
        }
        if self.mode == Mode::Datagram {
            let c = self.control();
            if c & RESERVED_MASK != 0 || (c & FLAG_X != 0 && c & FLAG_T == 0) {
                return Err(Error::Malformed);
            }
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The mode the view interprets the control octet in.
    pub const fn mode(&self) -> Mode {
        self.mode
    }

    /// The DDP control octet (octet 0), raw.
    pub fn control(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// T: tagged buffer model.
    pub fn tagged(&self) -> bool {
        self.control() & FLAG_T != 0
    }

    /// L: last segment of the message.
    pub fn last(&self) -> bool {
        self.control() & FLAG_L != 0
    }

    /// X: tagged sequence extension present. Always false in stream mode
    /// (the bit is reserved there) and on untagged segments.
    pub fn x(&self) -> bool {
        self.mode == Mode::Datagram && self.tagged() && self.control() & FLAG_X != 0
    }

    /// Q: Destination QP Number present. Always false in stream mode.
    pub fn q(&self) -> bool {
        self.mode == Mode::Datagram && self.control() & FLAG_Q != 0
    }

    /// The bits of the control octet that are reserved in this mode, as sent.
    pub fn reserved_bits(&self) -> u8 {
        self.control() & self.mode.reserved_mask()
    }

    /// DV: the DDP version.
    pub fn dv(&self) -> u8 {
        self.control() & DV_MASK
    }

    /// Octet 1, which DDP leaves to the ULP: the RDMAP control octet.
    pub fn rdmap_control(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    /// Length of the DDP header announced by the control octet: 14 or 18,
    /// plus the extension words and DQPN in datagram mode.
    pub fn header_len(&self) -> usize {
        let Some(&c) = self.buffer.as_ref().first() else {
            return TAGGED_HEADER_LEN;
        };
        let tagged = c & FLAG_T != 0;
        let mut n = if tagged {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        };
        if self.mode == Mode::Datagram {
            if tagged && c & FLAG_X != 0 {
                n += EXT_LEN;
            }
            if c & FLAG_Q != 0 {
                n += DQPN_LEN;
            }
        }
        n
    }

    fn word(&self, at: usize) -> u32 {
        u32_at(self.buffer.as_ref(), at)
    }

    /// STag of a tagged segment.
    pub fn stag(&self) -> Option<u32> {
        self.tagged().then(|| self.word(2))
    }

    /// TO of a tagged segment.
    pub fn to(&self) -> Option<u64> {
        self.tagged().then(|| u64_at(self.buffer.as_ref(), 6))
    }

    /// `RsvdULP[8:39]` of an untagged segment (the Invalidate STag of a Send
    /// with Invalidate).
    pub fn rsvd_ulp(&self) -> Option<u32> {
        (!self.tagged()).then(|| self.word(2))
    }

    /// QN of an untagged segment.
    pub fn qn(&self) -> Option<u32> {
        (!self.tagged()).then(|| self.word(6))
    }

    /// MSN of an untagged segment.
    pub fn msn(&self) -> Option<u32> {
        (!self.tagged()).then(|| self.word(10))
    }

    /// MO of an untagged segment.
    pub fn mo(&self) -> Option<u32> {
        (!self.tagged()).then(|| self.word(14))
    }

    /// The tagged sequence extension words (datagram mode, X set).
    pub fn ext(&self) -> Option<TaggedExt> {
        self.x().then(|| TaggedExt {
            msn: self.word(TAGGED_HEADER_LEN),
            mo: self.word(TAGGED_HEADER_LEN + 4),
        })
    }

    /// The Destination QP Number (datagram mode, Q set).
    pub fn dqpn(&self) -> Option<u32> {
        self.q().then(|| self.word(self.header_len() - DQPN_LEN))
    }

    /// The buffer-model fields as a [`DdpHeader`].
    pub fn header(&self) -> DdpHeader {
        let b = self.buffer.as_ref();
        if self.tagged() {
            DdpHeader::Tagged {
                stag: u32_at(b, 2),
                to: u64_at(b, 6),
                ext: self.ext(),
            }
        } else {
            DdpHeader::Untagged {
                rsvd_ulp: u32_at(b, 2),
                qn: u32_at(b, 6),
                msn: u32_at(b, 10),
                mo: u32_at(b, 14),
            }
        }
    }

    /// Everything after the DDP header: the RDMAP header part (if any) and
    /// the payload.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // ULPDUs of the golden Write and Send FPDUs (testdata/iwarp/golden.txt).
    const WRITE: [u8; 27] = [
        0xc1, 0x40, 0x00, 0x00, 0x33, 0x03, 0x00, 0x00, 0x56, 0x00, 0x12, 0x34, 0x00, 0x00, b'R',
        b'D', b'M', b'A', b'-', b'W', b'R', b'I', b'T', b'E', b'-', b'1', b'3',
    ];
    const SEND: [u8; 28] = [
        0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, b'h', b'e', b'l', b'l', b'o',
        b' ', b's', b'e', b'n', b'd',
    ];

    #[test]
    fn golden_write_view() {
        let s = DdpSegment::new_checked(&WRITE[..], Mode::Stream).unwrap();
        s.check_control().unwrap();
        assert!(s.tagged() && s.last() && !s.x() && !s.q());
        assert_eq!(s.dv(), 1);
        assert_eq!(s.rdmap_control(), 0x40);
        assert_eq!(s.stag(), Some(0x3303));
        assert_eq!(s.to(), Some(0x0000_5600_1234_0000));
        assert_eq!(s.qn(), None);
        assert_eq!(s.header_len(), TAGGED_HEADER_LEN);
        assert_eq!(s.payload(), b"RDMA-WRITE-13");
        let h = s.header();
        let mut out = [0u8; 14];
        assert_eq!(h.emit(true, 0x40, None, &mut out), 14);
        assert_eq!(out, WRITE[..14]);
    }

    #[test]
    fn golden_send_view() {
        let s = DdpSegment::new_checked(&SEND[..], Mode::Stream).unwrap();
        assert!(!s.tagged() && s.last());
        assert_eq!(
            (s.rsvd_ulp(), s.qn(), s.msn(), s.mo()),
            (Some(0), Some(0), Some(1), Some(0))
        );
        assert_eq!(s.stag(), None);
        assert_eq!(s.payload(), b"hello send");
        let mut out = [0u8; 18];
        s.header().emit(true, 0x43, None, &mut out);
        assert_eq!(out, SEND[..18]);
    }

    #[test]
    fn truncated() {
        assert_eq!(
            DdpSegment::new_checked(&[][..], Mode::Stream).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            DdpSegment::new_checked(&WRITE[..13], Mode::Stream).unwrap_err(),
            Error::Truncated
        );
        assert_eq!(
            DdpSegment::new_checked(&SEND[..17], Mode::Stream).unwrap_err(),
            Error::Truncated
        );
        // X + Q on a tagged segment need 26 octets in datagram mode, 14 in stream mode.
        let mut b = [0u8; 25];
        b[0] = FLAG_T | FLAG_X | FLAG_Q | 1;
        assert_eq!(
            DdpSegment::new_checked(&b[..], Mode::Datagram).unwrap_err(),
            Error::Truncated
        );
        let s = DdpSegment::new_checked(&b[..], Mode::Stream).unwrap();
        assert_eq!(s.header_len(), 14);
        assert_eq!(s.reserved_bits(), FLAG_X | FLAG_Q);
    }

    #[test]
    fn reserved_bits_by_mode() {
        let mut b = SEND;
        b[0] |= 0x3C;
        // Stream mode ignores every reserved bit.
        let s = DdpSegment::new_checked(&b[..], Mode::Stream).unwrap();
        assert_eq!(s.check_control(), Ok(()));
        assert!(!s.q() && !s.x());
        // Datagram mode: 0x0C is malformed, X on untagged is malformed.
        for bits in [0x04, 0x08, FLAG_X] {
            let mut b = [0u8; 22];
            b[0] = 0x41 | bits;
            let s = DdpSegment::new_unchecked(&b[..], Mode::Datagram);
            assert_eq!(s.check_control(), Err(Error::Malformed), "bits {bits:#x}");
        }
        let mut v = WRITE;
        v[0] = (v[0] & !DV_MASK) | 2;
        assert_eq!(
            DdpSegment::new_unchecked(&v[..], Mode::Stream).check_control(),
            Err(Error::BadVersion)
        );
    }

    #[test]
    fn datagram_words() {
        let h = DdpHeader::Tagged {
            stag: 0xAABB_CCDD,
            to: 0x1122_3344_5566_7788,
            ext: Some(TaggedExt { msn: 7, mo: 4096 }),
        };
        let mut buf = [0u8; 26];
        assert_eq!(h.emit(false, 0x4C, Some(0x00AB_CDEF), &mut buf), 26);
        assert_eq!(buf[0], FLAG_T | FLAG_X | FLAG_Q | 1);
        let s = DdpSegment::new_checked(&buf[..], Mode::Datagram).unwrap();
        s.check_control().unwrap();
        assert_eq!(s.header(), h);
        assert_eq!(s.ext(), Some(TaggedExt { msn: 7, mo: 4096 }));
        assert_eq!(s.dqpn(), Some(0x00AB_CDEF));
        assert_eq!(s.header_len(), 26);
        assert!(s.payload().is_empty());

        let u = DdpHeader::Untagged {
            rsvd_ulp: 9,
            qn: 0,
            msn: 3,
            mo: 100,
        };
        let mut buf = [0u8; 22];
        assert_eq!(u.emit(true, 0x43, Some(5), &mut buf), 22);
        assert_eq!(&buf[18..], &[0, 0, 0, 5]);
        let s = DdpSegment::new_checked(&buf[..], Mode::Datagram).unwrap();
        assert_eq!((s.header(), s.dqpn(), s.ext()), (u, Some(5), None));
    }
}
