//! The reliable-datagram (RD) shim: the 26-octet header that precedes the
//! DDP segment in an RD datagram (`docs/datagram.md` §9; not a standard).
//!
//! ```text
//! UD datagram:  DDP segment ............................... | CRC32C (4)
//! RD datagram:  RD shim (26) | [DDP segment, if D] ........ | CRC32C (4)
//!               |<----------------- covered by the CRC ---->|
//! ```
//!
//! # Telling RD from UD
//!
//! A UD datagram starts with the DDP control octet, whose low two bits are
//! DV = 1 (`0b01`). An RD datagram starts with [`MAGIC`] = `0x52` (ASCII
//! `R`), whose low two bits are `0b10`: read as a DDP control octet that is
//! DV = 2, which no DDP segment may carry. So octet 0 decides alone:
//!
//! | `octet0 & 0x03` | meaning |
//! |---|---|
//! | `0b01` | UD: a DDP segment starts here |
//! | `0b10` | RD: a shim starts here; octet 0 must be exactly [`MAGIC`], otherwise [`Error::BadVersion`] (another shim version) |
//! | `0b00`, `0b11` | reserved: [`Error::BadVersion`] |
//!
//! A receiver that only knows UD ([`crate::datagram::parse`]) drops an RD
//! datagram as [`Error::BadVersion`] (the CRC matches, DV = 2 does not); it
//! never misreads it.
//!
//! # Layout
//!
//! ```text
//!  0        1                          4        5                          8
//! +--------+--------------------------+--------+--------------------------+
//! |  0x52  |        DQPN (24)         | flags  |        SQPN (24)         |
//! +--------+--------------------------+--------+--------------------------+
//!  8                 12                16                20                24       26
//! +-----------------+-----------------+-----------------+-----------------+--------+
//! |   epoch (32)    |    PSN (32)     | ack epoch (32)  | ack PSN (32)    | window |
//! |      (D)        |      (D)        |    (A or R)     | (A) / floor (R) |  (16)  |
//! +-----------------+-----------------+-----------------+-----------------+--------+
//!
//! flags:  D 0x80  a DDP segment follows; epoch and PSN are valid
//!         S 0x40  SYN: the sender's session `epoch` is not yet acknowledged (needs D)
//!         A 0x20  ack epoch / ack PSN acknowledge every PSN below ack PSN
//!         N 0x10  NAK: with A, PSN = ack PSN is missing; resend from it
//!         R 0x08  reset: no session `ack epoch` here; ack PSN holds the epoch floor
//!         P 0x04  poll: answer with an ACK at once
//!         0x03    reserved: zero, a receiver drops the datagram otherwise
//! ```
//!
//! Every field is big-endian. The 26 octets (4k + 2) put the DDP STag, TO and
//! QN fields, which sit 2 octets into the segment, on 4-octet boundaries.
//! Fields a flag does not validate are sent as zero and ignored on receive.
//! DQPN and SQPN are 24-bit QP numbers (`QPN = (port << 8) | slot`); a
//! receiver demultiplexes on DQPN, so the DDP segment of an RD datagram need
//! not carry a Q word. When it does, [`parse`] requires its low 24 bits to
//! equal DQPN.
//!
//! # Receive order
//!
//! [`split`] and [`parse`] keep the order of `docs/datagram.md` §4: the CRC
//! over everything before the last four octets is checked before any field
//! is read, then octet 0 classifies the datagram, then the shim, then (for
//! [`parse`]) the DDP segment.

use crate::crc;
use crate::datagram::{self, CRC_LEN};
use crate::field::{put_u16, put_u32, u16_at, u32_at};
use crate::rdmap::SegmentRepr;
use crate::{Error, Result};

/// Octet 0 of every RD datagram (ASCII `R`; low two bits `0b10`, which no
/// DDP control octet has).
pub const MAGIC: u8 = 0x52;
/// Length of the RD shim.
pub const SHIM_LEN: usize = 26;
/// Largest QP number the 24-bit SQPN/DQPN fields hold.
pub const MAX_QPN: u32 = 0x00FF_FFFF;
/// Mask of the two low bits of octet 0 that tell UD, RD and reserved apart.
pub const KIND_MASK: u8 = 0x03;
/// `octet0 & KIND_MASK` of a UD datagram (the DDP version, DV = 1).
pub const KIND_UD: u8 = 0x01;
/// `octet0 & KIND_MASK` of an RD datagram.
pub const KIND_RD: u8 = 0x02;
/// The shortest RD datagram: a shim with no segment, and the CRC.
pub const MIN_DATAGRAM_LEN: usize = SHIM_LEN + CRC_LEN;

/// Flag D: a DDP segment follows the shim; epoch and PSN are valid.
pub const FLAG_DATA: u8 = 0x80;
/// Flag S: SYN, the sender's session is not yet acknowledged (with D only).
pub const FLAG_SYN: u8 = 0x40;
/// Flag A: the ack epoch and ack PSN fields carry a cumulative ACK.
pub const FLAG_ACK: u8 = 0x20;
/// Flag N: NAK, with A: the ack PSN is missing at the receiver.
pub const FLAG_NAK: u8 = 0x10;
/// Flag R: reset, no session with the ack epoch here (excludes A).
pub const FLAG_RST: u8 = 0x08;
/// Flag P: poll, asks the receiver for an immediate ACK.
pub const FLAG_POLL: u8 = 0x04;
/// Flags octet: reserved bits (must be zero).
pub const FLAGS_RESERVED: u8 = 0x03;

/// Octet offsets inside the shim.
mod ofs {
    pub const MAGIC: usize = 0;
    pub const DQPN: usize = 1;
    pub const FLAGS: usize = 4;
    pub const SQPN: usize = 5;
    pub const EPOCH: usize = 8;
    pub const PSN: usize = 12;
    pub const ACK_EPOCH: usize = 16;
    pub const ACK_PSN: usize = 20;
    pub const WINDOW: usize = 24;
}

fn u24_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

fn put_u24(b: &mut [u8], at: usize, v: u32) {
    let o = v.to_be_bytes();
    b[at..at + 3].copy_from_slice(&o[1..]);
}

/// Which framing a UDP payload uses, from its first octet alone (no CRC or
/// length check; see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// A UD datagram: the DDP control octet comes first.
    Ud,
    /// An RD datagram with a shim this module speaks ([`MAGIC`]).
    Rd,
}

impl Framing {
    /// Classifies by octet 0: [`Error::BadVersion`] for a reserved kind or
    /// an RD shim version other than [`MAGIC`].
    pub fn of(octet0: u8) -> Result<Framing> {
        match octet0 & KIND_MASK {
            KIND_UD => Ok(Framing::Ud),
            KIND_RD if octet0 == MAGIC => Ok(Framing::Rd),
            _ => Err(Error::BadVersion),
        }
    }
}

/// A view of an RD shim in a buffer (the shim first).
///
/// [`RdShim::new_checked`] guarantees [`SHIM_LEN`] octets, so no accessor
/// panics; it checks neither the magic nor the flags (see
/// [`RdShimRepr::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdShim<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RdShim<T> {
    /// Wraps a buffer without any check.
    pub const fn new_unchecked(buffer: T) -> Self {
        RdShim { buffer }
    }

    /// Wraps a buffer, checking that it holds a whole shim.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let s = Self::new_unchecked(buffer);
        s.check_len()?;
        Ok(s)
    }

    /// [`Error::Truncated`] unless the buffer holds [`SHIM_LEN`] octets.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < SHIM_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Octet 0 (should be [`MAGIC`]).
    pub fn magic(&self) -> u8 {
        self.buffer.as_ref()[ofs::MAGIC]
    }

    /// Destination QP number (24 bits).
    pub fn dst_qpn(&self) -> u32 {
        u24_at(self.buffer.as_ref(), ofs::DQPN)
    }

    /// The flags octet, raw.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[ofs::FLAGS]
    }

    /// Source QP number (24 bits).
    pub fn src_qpn(&self) -> u32 {
        u24_at(self.buffer.as_ref(), ofs::SQPN)
    }

    /// The sender's session epoch (valid with D).
    pub fn epoch(&self) -> u32 {
        u32_at(self.buffer.as_ref(), ofs::EPOCH)
    }

    /// Packet sequence number (valid with D).
    pub fn psn(&self) -> u32 {
        u32_at(self.buffer.as_ref(), ofs::PSN)
    }

    /// Epoch of the peer's session that the ACK or reset is about.
    pub fn ack_epoch(&self) -> u32 {
        u32_at(self.buffer.as_ref(), ofs::ACK_EPOCH)
    }

    /// Cumulative ACK PSN (with A), or the epoch floor (with R).
    pub fn ack_psn(&self) -> u32 {
        u32_at(self.buffer.as_ref(), ofs::ACK_PSN)
    }

    /// Receive window (credits) in datagrams.
    pub fn window(&self) -> u16 {
        u16_at(self.buffer.as_ref(), ofs::WINDOW)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RdShim<T> {
    /// Writes octet 0.
    pub fn set_magic(&mut self, v: u8) {
        self.buffer.as_mut()[ofs::MAGIC] = v;
    }

    /// Writes the low 24 bits of `v` as DQPN.
    pub fn set_dst_qpn(&mut self, v: u32) {
        put_u24(self.buffer.as_mut(), ofs::DQPN, v);
    }

    /// Writes the flags octet.
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[ofs::FLAGS] = v;
    }

    /// Writes the low 24 bits of `v` as SQPN.
    pub fn set_src_qpn(&mut self, v: u32) {
        put_u24(self.buffer.as_mut(), ofs::SQPN, v);
    }

    /// Writes the epoch.
    pub fn set_epoch(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), ofs::EPOCH, v);
    }

    /// Writes the PSN.
    pub fn set_psn(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), ofs::PSN, v);
    }

    /// Writes the ack epoch.
    pub fn set_ack_epoch(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), ofs::ACK_EPOCH, v);
    }

    /// Writes the ack PSN (or epoch floor).
    pub fn set_ack_psn(&mut self, v: u32) {
        put_u32(self.buffer.as_mut(), ofs::ACK_PSN, v);
    }

    /// Writes the window.
    pub fn set_window(&mut self, v: u16) {
        put_u16(self.buffer.as_mut(), ofs::WINDOW, v);
    }
}

/// The sequencing part of a data datagram (flag D).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataSeq {
    /// The sender's session epoch for this (source QP, destination QP)
    /// direction.
    pub epoch: u32,
    /// Packet sequence number within the session (starts at 0).
    pub psn: u32,
    /// SYN (flag S): the session is not yet acknowledged; a receiver without
    /// it may create it at PSN 0.
    pub syn: bool,
}

/// What the shim says about the *peer's* session (the reverse direction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feedback {
    /// Neither A nor R.
    None,
    /// Flag A (and N): every PSN before `psn` of session `epoch` arrived.
    Ack {
        /// The acknowledged session (the peer's epoch).
        epoch: u32,
        /// Next PSN expected: everything before it arrived.
        psn: u32,
        /// Flag N: `psn` is missing while later ones arrived; resend from it.
        nak: bool,
    },
    /// Flag R: the sender of this shim has no session `epoch` (it expired,
    /// restarted or refuses it as older than its current one).
    Reset {
        /// The refused session.
        epoch: u32,
        /// A new session's epoch must be serially greater than this.
        floor: u32,
    },
}

/// The decoded RD shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdShimRepr {
    /// Destination QP number (24 bits).
    pub dst_qpn: u32,
    /// Source QP number (24 bits).
    pub src_qpn: u32,
    /// Flag D with epoch, PSN and S: a DDP segment follows.
    pub data: Option<DataSeq>,
    /// Flags A/N or R with the ack epoch and ack PSN fields.
    pub feedback: Feedback,
    /// Flag P: ask for an immediate ACK.
    pub poll: bool,
    /// Receive window (credits) of the shim's sender, in datagrams: how many
    /// unacknowledged data datagrams it accepts from the receiver of the shim.
    pub window: u16,
}

impl RdShimRepr {
    /// A shim with no data, no feedback and no poll: the base for control
    /// datagrams.
    pub const fn control(src_qpn: u32, dst_qpn: u32, window: u16) -> RdShimRepr {
        RdShimRepr {
            dst_qpn,
            src_qpn,
            data: None,
            feedback: Feedback::None,
            poll: false,
            window,
        }
    }

    /// Decodes a shim at the start of `buf` (which may continue with the
    /// segment). Checks: [`Error::Truncated`] under [`SHIM_LEN`] octets,
    /// [`Error::BadVersion`] unless octet 0 is [`MAGIC`], [`Error::Malformed`]
    /// for a reserved flag bit, A with R, N without A, or S without D. Whether
    /// a segment follows is the datagram's business ([`split`]).
    pub fn parse(buf: &[u8]) -> Result<RdShimRepr> {
        let v = RdShim::new_checked(buf)?;
        if v.magic() != MAGIC {
            return Err(Error::BadVersion);
        }
        let f = v.flags();
        if f & FLAGS_RESERVED != 0
            || (f & FLAG_ACK != 0 && f & FLAG_RST != 0)
            || (f & FLAG_NAK != 0 && f & FLAG_ACK == 0)
            || (f & FLAG_SYN != 0 && f & FLAG_DATA == 0)
        {
            return Err(Error::Malformed);
        }
        let data = (f & FLAG_DATA != 0).then(|| DataSeq {
            epoch: v.epoch(),
            psn: v.psn(),
            syn: f & FLAG_SYN != 0,
        });
        let feedback = if f & FLAG_ACK != 0 {
            Feedback::Ack {
                epoch: v.ack_epoch(),
                psn: v.ack_psn(),
                nak: f & FLAG_NAK != 0,
            }
        } else if f & FLAG_RST != 0 {
            Feedback::Reset {
                epoch: v.ack_epoch(),
                floor: v.ack_psn(),
            }
        } else {
            Feedback::None
        };
        Ok(RdShimRepr {
            dst_qpn: v.dst_qpn(),
            src_qpn: v.src_qpn(),
            data,
            feedback,
            poll: f & FLAG_POLL != 0,
            window: v.window(),
        })
    }

    /// [`Error::Malformed`] if a QP number does not fit 24 bits (the only
    /// thing the type does not already rule out).
    pub fn validate(&self) -> Result<()> {
        if self.dst_qpn > MAX_QPN || self.src_qpn > MAX_QPN {
            return Err(Error::Malformed);
        }
        Ok(())
    }

    /// The flags octet this shim is sent with.
    pub const fn flags(&self) -> u8 {
        let mut f = 0;
        if let Some(d) = self.data {
            f |= FLAG_DATA;
            if d.syn {
                f |= FLAG_SYN;
            }
        }
        match self.feedback {
            Feedback::None => {}
            Feedback::Ack { nak, .. } => {
                f |= FLAG_ACK;
                if nak {
                    f |= FLAG_NAK;
                }
            }
            Feedback::Reset { .. } => f |= FLAG_RST,
        }
        if self.poll {
            f |= FLAG_POLL;
        }
        f
    }

    /// Octets [`RdShimRepr::emit`] writes: always [`SHIM_LEN`].
    pub const fn buffer_len(&self) -> usize {
        SHIM_LEN
    }

    /// Writes the shim into the first [`SHIM_LEN`] octets of `buf`; fields
    /// no flag validates are written as zero, QP numbers as their low 24
    /// bits (see [`RdShimRepr::validate`]).
    ///
    /// # Panics
    /// If `buf` is shorter than [`SHIM_LEN`].
    pub fn emit(&self, buf: &mut [u8]) {
        let mut v = RdShim::new_unchecked(&mut buf[..SHIM_LEN]);
        v.set_magic(MAGIC);
        v.set_dst_qpn(self.dst_qpn);
        v.set_flags(self.flags());
        v.set_src_qpn(self.src_qpn);
        let (epoch, psn) = self.data.map_or((0, 0), |d| (d.epoch, d.psn));
        v.set_epoch(epoch);
        v.set_psn(psn);
        let (ae, ap) = match self.feedback {
            Feedback::None => (0, 0),
            Feedback::Ack { epoch, psn, .. } => (epoch, psn),
            Feedback::Reset { epoch, floor } => (epoch, floor),
        };
        v.set_ack_epoch(ae);
        v.set_ack_psn(ap);
        v.set_window(self.window);
    }
}

/// Checks the CRC32C trailer of a UDP payload, then splits off the RD shim.
///
/// Returns `(None, segment)` for a UD datagram and `(Some(shim), segment)`
/// for an RD one, where `segment` is what lies between the shim (if any) and
/// the CRC: the DDP segment, still to be parsed with
/// [`SegmentRepr::parse`] in [`crate::ddp::Mode::Datagram`] (empty for an RD
/// control datagram).
///
/// Errors, in the order checked: [`Error::Truncated`] (fewer than 1 + 4
/// octets), [`Error::BadCrc`], [`Error::BadVersion`] (octet 0, see
/// [`Framing::of`]), then for RD: [`Error::Truncated`] (shorter than
/// [`MIN_DATAGRAM_LEN`], or flag D with nothing after the shim), whatever
/// [`RdShimRepr::parse`] reports, and [`Error::Malformed`] for octets after a
/// shim without D.
pub fn split(udp_payload: &[u8]) -> Result<(Option<RdShimRepr>, &[u8])> {
    if udp_payload.len() < 1 + CRC_LEN {
        return Err(Error::Truncated);
    }
    let (body, tail) = udp_payload.split_at(udp_payload.len() - CRC_LEN);
    let mut wire = [0u8; CRC_LEN];
    wire.copy_from_slice(tail);
    if crc::from_wire(wire) != crc::crc32c(body) {
        return Err(Error::BadCrc);
    }
    match Framing::of(body[0])? {
        Framing::Ud => Ok((None, body)),
        Framing::Rd => {
            let shim = RdShimRepr::parse(body)?;
            let rest = &body[SHIM_LEN..];
            match (shim.data.is_some(), rest.is_empty()) {
                (true, true) => Err(Error::Truncated),
                (false, false) => Err(Error::Malformed),
                _ => Ok((Some(shim), rest)),
            }
        }
    }
}

/// A fully decoded datagram of either framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datagram<'a> {
    /// UD: a segment header and its payload.
    Ud {
        /// The DDP/RDMAP header.
        segment: SegmentRepr,
        /// The payload (between the header and the CRC).
        payload: &'a [u8],
    },
    /// RD: the shim and, with flag D, the segment.
    Rd {
        /// The shim.
        shim: RdShimRepr,
        /// The segment header and payload (flag D), or `None` (control).
        segment: Option<(SegmentRepr, &'a [u8])>,
    },
}

/// Decodes a whole UDP payload of either framing: [`split`], then the DDP
/// segment in datagram mode. An RD segment with a Q word whose low 24 bits
/// differ from the shim's DQPN is [`Error::Malformed`] (bits 31..24 are not
/// compared: UD puts the sender's slot there, `docs/datagram.md` §10). For
/// UD this is [`crate::datagram::parse`].
pub fn parse(udp_payload: &[u8]) -> Result<Datagram<'_>> {
    let (shim, seg) = split(udp_payload)?;
    match shim {
        None => {
            let (segment, h) = SegmentRepr::parse(seg, datagram::MODE)?;
            Ok(Datagram::Ud {
                segment,
                payload: &seg[h..],
            })
        }
        Some(shim) if seg.is_empty() => Ok(Datagram::Rd {
            shim,
            segment: None,
        }),
        Some(shim) => {
            let (segment, h) = SegmentRepr::parse(seg, datagram::MODE)?;
            if segment.dqpn.is_some_and(|q| q & MAX_QPN != shim.dst_qpn) {
                return Err(Error::Malformed);
            }
            Ok(Datagram::Rd {
                shim,
                segment: Some((segment, &seg[h..])),
            })
        }
    }
}

/// Writes the shim and, when given, the segment header contiguously at the
/// start of `buf`; returns the octets written. The payload stays where it is;
/// [`crate::datagram::trailer`] over these octets and the payload slices
/// gives the CRC (it covers the shim too).
///
/// # Panics
/// If `buf` is too short.
pub fn emit_header(shim: &RdShimRepr, segment: Option<&SegmentRepr>, buf: &mut [u8]) -> usize {
    shim.emit(buf);
    match segment {
        Some(s) => SHIM_LEN + datagram::emit_header(s, &mut buf[SHIM_LEN..]),
        None => SHIM_LEN,
    }
}

/// Size of the UDP payload of an RD datagram with `segment` (or none)
/// carrying `payload_len` octets.
pub fn buffer_len(segment: Option<&SegmentRepr>, payload_len: usize) -> usize {
    match segment {
        Some(s) => SHIM_LEN + datagram::buffer_len(s, payload_len),
        None => MIN_DATAGRAM_LEN,
    }
}

/// Writes a whole RD datagram (shim, segment header, payload, CRC)
/// contiguously into `out`; returns its length. A control datagram passes
/// `None` (30 octets). For tests and control datagrams; the data path
/// gathers with [`emit_header`] and [`crate::datagram::trailer`].
///
/// # Panics
/// If `out` is shorter than [`buffer_len`].
pub fn emit_into(
    shim: &RdShimRepr,
    segment: Option<(&SegmentRepr, &[u8])>,
    out: &mut [u8],
) -> usize {
    let payload: &[u8] = segment.map_or(&[], |(_, p)| p);
    let total = buffer_len(segment.map(|(s, _)| s), payload.len());
    let out = &mut out[..total];
    let h = emit_header(shim, segment.map(|(s, _)| s), out);
    out[h..h + payload.len()].copy_from_slice(payload);
    let t = datagram::trailer(&out[..h], &[payload]);
    out[h + payload.len()..].copy_from_slice(&t);
    total
}

/// The most payload octets an RD datagram with `segment`'s header carries on
/// an IPv4 path of `mtu` octets: [`crate::datagram::max_payload`] less
/// [`SHIM_LEN`].
pub fn max_payload(mtu: usize, segment: &SegmentRepr) -> usize {
    datagram::max_payload(mtu, segment).saturating_sub(SHIM_LEN)
}

/// As [`max_payload`], with the IP + UDP header size given.
pub fn max_payload_with(mtu: usize, ip_udp_overhead: usize, segment: &SegmentRepr) -> usize {
    datagram::max_payload_with(mtu, ip_udp_overhead, segment).saturating_sub(SHIM_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ddp::{DdpHeader, Mode, TaggedExt};
    use crate::rdmap::{Opcode, RdmapBody};
    use proptest::prelude::*;

    fn data_shim() -> RdShimRepr {
        RdShimRepr {
            dst_qpn: 0x12_3401,
            src_qpn: 0xAB_CD02,
            data: Some(DataSeq {
                epoch: 0x0102_0304,
                psn: 0x0506_0708,
                syn: true,
            }),
            feedback: Feedback::Ack {
                epoch: 0x1112_1314,
                psn: 0x1516_1718,
                nak: false,
            },
            poll: true,
            window: 0x2122,
        }
    }

    fn write_record() -> SegmentRepr {
        SegmentRepr {
            last: true,
            opcode: Opcode::WriteRecord,
            ddp: DdpHeader::Tagged {
                stag: 0x0001_2a01,
                to: 0x1000,
                ext: Some(TaggedExt { msn: 3, mo: 0 }),
            },
            dqpn: None,
            body: RdmapBody::None,
        }
    }

    #[test]
    fn magic_is_no_ddp_control_octet() {
        assert_eq!(MAGIC & KIND_MASK, KIND_RD);
        assert_ne!(MAGIC & KIND_MASK, crate::ddp::DDP_VERSION);
        // Every DDP control octet with DV = 1 is UD; nothing else is.
        for o in 0..=255u8 {
            let f = Framing::of(o);
            match o & 3 {
                1 => assert_eq!(f, Ok(Framing::Ud)),
                _ if o == MAGIC => assert_eq!(f, Ok(Framing::Rd)),
                _ => assert_eq!(f, Err(Error::BadVersion)),
            }
        }
    }

    #[test]
    fn layout() {
        let s = data_shim();
        let mut b = [0u8; SHIM_LEN];
        s.emit(&mut b);
        assert_eq!(
            b,
            [
                0x52, 0x12, 0x34, 0x01, // magic, DQPN
                0xE4, 0xAB, 0xCD, 0x02, // D S A P, SQPN
                1, 2, 3, 4, 5, 6, 7, 8, // epoch, PSN
                0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, // ack epoch, ack PSN
                0x21, 0x22, // window
            ]
        );
        assert_eq!(RdShimRepr::parse(&b), Ok(s));
        let v = RdShim::new_checked(&b[..]).unwrap();
        assert_eq!(
            (v.dst_qpn(), v.src_qpn(), v.flags(), v.window()),
            (0x12_3401, 0xAB_CD02, 0xE4, 0x2122)
        );
        assert_eq!(RdShim::new_checked(&b[..25]), Err(Error::Truncated));
    }

    #[test]
    fn reset_and_nak_layout() {
        let mut s = RdShimRepr::control(7, 9, 0);
        s.feedback = Feedback::Reset {
            epoch: 0xdead_beef,
            floor: 0x0102_0304,
        };
        let mut b = [0u8; SHIM_LEN];
        s.emit(&mut b);
        assert_eq!(b[4], FLAG_RST);
        assert_eq!(&b[8..16], &[0; 8]);
        assert_eq!(&b[16..24], &[0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4]);
        assert_eq!(RdShimRepr::parse(&b), Ok(s));
        s.feedback = Feedback::Ack {
            epoch: 1,
            psn: 2,
            nak: true,
        };
        s.emit(&mut b);
        assert_eq!(b[4], FLAG_ACK | FLAG_NAK);
        assert_eq!(RdShimRepr::parse(&b), Ok(s));
    }

    #[test]
    fn flag_rules() {
        let mut b = [0u8; SHIM_LEN];
        RdShimRepr::control(1, 2, 3).emit(&mut b);
        for (flags, ok) in [
            (0, true),
            (FLAG_POLL, true),
            (0x01, false),
            (0x02, false),
            (FLAG_ACK | FLAG_RST, false),
            (FLAG_NAK, false),
            (FLAG_SYN, false),
            (FLAG_DATA | FLAG_SYN, true),
            (FLAG_RST | FLAG_POLL, true),
        ] {
            b[4] = flags;
            assert_eq!(RdShimRepr::parse(&b).is_ok(), ok, "flags {flags:#x}");
            if !ok {
                assert_eq!(RdShimRepr::parse(&b), Err(Error::Malformed));
            }
        }
        b[4] = 0;
        b[0] = 0x56; // kind 0b10, another shim version
        assert_eq!(RdShimRepr::parse(&b), Err(Error::BadVersion));
    }

    #[test]
    fn ignored_fields_parse_to_nothing() {
        let mut b = [0xFFu8; SHIM_LEN];
        b[0] = MAGIC;
        b[4] = 0;
        let s = RdShimRepr::parse(&b).unwrap();
        assert_eq!(s.data, None);
        assert_eq!(s.feedback, Feedback::None);
        assert_eq!(s.window, 0xFFFF);
        let mut out = [0u8; SHIM_LEN];
        s.emit(&mut out);
        assert_eq!(&out[8..24], &[0; 16]);
    }

    #[test]
    fn whole_datagram() {
        let s = data_shim();
        let seg = write_record();
        let mut out = [0u8; 128];
        let n = emit_into(&s, Some((&seg, b"abc")), &mut out);
        assert_eq!(n, SHIM_LEN + 22 + 3 + 4);
        let d = &out[..n];
        // The CRC covers shim and segment.
        assert_eq!(d[n - 4..], crc::to_wire(crc::crc32c(&d[..n - 4])));
        // The DDP header follows the shim; STag on a 4-octet boundary.
        assert_eq!(d[SHIM_LEN], 0xE1);
        assert_eq!((SHIM_LEN + 2) % 4, 0);
        assert_eq!(&d[SHIM_LEN + 2..SHIM_LEN + 6], &[0x00, 0x01, 0x2a, 0x01]);
        let (shim, rest) = split(d).unwrap();
        assert_eq!(shim, Some(s));
        assert_eq!(rest, &d[SHIM_LEN..n - 4]);
        assert_eq!(
            parse(d),
            Ok(Datagram::Rd {
                shim: s,
                segment: Some((seg, &b"abc"[..]))
            })
        );
        // A UD-only receiver refuses it without misreading it.
        assert_eq!(datagram::parse(d), Err(Error::BadVersion));
        // Gathered header + trailer equals the contiguous form.
        let mut hdr = [0u8; 64];
        let h = emit_header(&s, Some(&seg), &mut hdr);
        assert_eq!(&hdr[..h], &d[..h]);
        assert_eq!(datagram::trailer(&hdr[..h], &[b"a", b"bc"]), d[n - 4..]);
    }

    #[test]
    fn control_datagram() {
        let mut s = RdShimRepr::control(3, 4, 64);
        s.feedback = Feedback::Ack {
            epoch: 9,
            psn: 10,
            nak: false,
        };
        let mut out = [0u8; 64];
        let n = emit_into(&s, None, &mut out);
        assert_eq!(n, MIN_DATAGRAM_LEN);
        assert_eq!(split(&out[..n]), Ok((Some(s), &[][..])));
        assert_eq!(
            parse(&out[..n]),
            Ok(Datagram::Rd {
                shim: s,
                segment: None
            })
        );
    }

    #[test]
    fn ud_passes_through() {
        let seg = SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None);
        let mut out = [0u8; 64];
        let n = datagram::emit_into(&seg, b"hi", &mut out);
        let (shim, rest) = split(&out[..n]).unwrap();
        assert_eq!(shim, None);
        assert_eq!(rest, &out[..n - 4]);
        assert_eq!(
            parse(&out[..n]),
            Ok(Datagram::Ud {
                segment: seg,
                payload: b"hi"
            })
        );
    }

    fn with_crc(mut d: Vec<u8>) -> Vec<u8> {
        let t = datagram::trailer(&d, &[]);
        d.extend_from_slice(&t);
        d
    }

    #[test]
    fn receive_errors() {
        assert_eq!(split(&[]), Err(Error::Truncated));
        assert_eq!(split(&[MAGIC, 0, 0, 0]), Err(Error::Truncated));
        // CRC first: a corrupted octet anywhere is BadCrc.
        let mut out = [0u8; 128];
        let n = emit_into(&data_shim(), Some((&write_record(), b"xyz")), &mut out);
        for bit in 0..n * 8 {
            let mut d = out[..n].to_vec();
            d[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(split(&d), Err(Error::BadCrc), "bit {bit}");
        }
        // Good CRC over a short shim.
        assert_eq!(split(&with_crc(vec![MAGIC; 10])), Err(Error::Truncated));
        // Reserved kinds.
        assert_eq!(split(&with_crc(vec![0x00; 30])), Err(Error::BadVersion));
        assert_eq!(split(&with_crc(vec![0x53; 30])), Err(Error::BadVersion));
        // D without a segment; a control shim with trailing octets.
        let mut shim = [0u8; SHIM_LEN];
        data_shim().emit(&mut shim);
        assert_eq!(split(&with_crc(shim.to_vec())), Err(Error::Truncated));
        RdShimRepr::control(1, 2, 3).emit(&mut shim);
        let mut d = shim.to_vec();
        d.push(0);
        assert_eq!(split(&with_crc(d)), Err(Error::Malformed));
        // Segment DQPN disagreeing with the shim.
        let mut seg = write_record();
        seg.dqpn = Some(data_shim().dst_qpn + 1);
        let n = emit_into(&data_shim(), Some((&seg, b"")), &mut out);
        assert_eq!(parse(&out[..n]), Err(Error::Malformed));
        seg.dqpn = Some(data_shim().dst_qpn);
        let n = emit_into(&data_shim(), Some((&seg, b"")), &mut out);
        assert!(parse(&out[..n]).is_ok());
        // The UD convention's slot octet in bits 31..24 is not compared.
        seg.dqpn = Some(0x0200_0000 | data_shim().dst_qpn);
        let n = emit_into(&data_shim(), Some((&seg, b"")), &mut out);
        assert!(parse(&out[..n]).is_ok());
        // A bad DDP segment behind a good shim.
        let mut d = shim.to_vec();
        d[4] = FLAG_DATA;
        d.extend_from_slice(&[0x43, 0x40]);
        assert_eq!(parse(&with_crc(d)), Err(Error::BadVersion));
    }

    #[test]
    fn validate_and_budget() {
        assert_eq!(data_shim().validate(), Ok(()));
        let mut s = data_shim();
        s.src_qpn = MAX_QPN + 1;
        assert_eq!(s.validate(), Err(Error::Malformed));
        // Emit keeps the low 24 bits and never touches the flags octet.
        let mut b = [0u8; SHIM_LEN];
        s.emit(&mut b);
        assert_eq!(b[4], data_shim().flags());
        assert_eq!(RdShimRepr::parse(&b).unwrap().src_qpn, 0);
        let seg = write_record();
        assert_eq!(max_payload(1500, &seg), 1500 - 28 - 26 - 22 - 4);
        assert_eq!(
            max_payload_with(1500, datagram::IPV6_UDP_OVERHEAD, &seg),
            1500 - 48 - 26 - 22 - 4
        );
        assert_eq!(max_payload(60, &seg), 0);
        let p = vec![0u8; max_payload(1500, &seg)];
        let mut out = vec![0u8; 1500];
        let n = emit_into(&data_shim(), Some((&seg, &p)), &mut out);
        assert_eq!(n + datagram::IPV4_UDP_OVERHEAD, 1500);
    }

    fn arb_shim() -> impl Strategy<Value = RdShimRepr> {
        (
            0..=MAX_QPN,
            0..=MAX_QPN,
            proptest::option::of(any::<(u32, u32, bool)>()),
            0u8..3,
            any::<(u32, u32, bool)>(),
            any::<(bool, u16)>(),
        )
            .prop_map(
                |(dst_qpn, src_qpn, data, fb, (e, p, nak), (poll, window))| RdShimRepr {
                    dst_qpn,
                    src_qpn,
                    data: data.map(|(epoch, psn, syn)| DataSeq { epoch, psn, syn }),
                    feedback: match fb {
                        0 => Feedback::None,
                        1 => Feedback::Ack {
                            epoch: e,
                            psn: p,
                            nak,
                        },
                        _ => Feedback::Reset { epoch: e, floor: p },
                    },
                    poll,
                    window,
                },
            )
    }

    proptest! {
        #[test]
        fn prop_shim_roundtrip(s in arb_shim()) {
            prop_assert_eq!(s.validate(), Ok(()));
            let mut b = [0u8; SHIM_LEN];
            s.emit(&mut b);
            prop_assert_eq!(RdShimRepr::parse(&b), Ok(s));
        }

        #[test]
        fn prop_datagram_roundtrip(
            mut s in arb_shim(),
            seg in crate::rdmap::tests::arb_segment()
                .prop_filter("datagram-valid", |(_, r)| r.fits(Mode::Datagram)),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            with_segment in any::<bool>(),
        ) {
            let (_, mut seg) = seg;
            let payload = match seg.body {
                RdmapBody::None | RdmapBody::Terminate(_) => payload,
                _ => Vec::new(),
            };
            if seg.dqpn.is_some() {
                seg.dqpn = Some(s.dst_qpn);
            }
            let segment = with_segment.then_some((&seg, &payload[..]));
            if !with_segment {
                s.data = None;
            } else if s.data.is_none() {
                s.data = Some(DataSeq { epoch: 1, psn: 0, syn: true });
            }
            let mut out = vec![0u8; buffer_len(segment.map(|(s, _)| s), payload.len())];
            let n = emit_into(&s, segment, &mut out);
            prop_assert_eq!(n, out.len());
            let want = Datagram::Rd {
                shim: s,
                segment: with_segment.then_some((seg, &payload[..])),
            };
            prop_assert_eq!(parse(&out), Ok(want));
        }

        #[test]
        fn prop_never_panics(
            mut data in proptest::collection::vec(any::<u8>(), 0..96),
            fix in any::<(bool, bool, u8)>(),
        ) {
            if fix.0 && !data.is_empty() {
                data[0] = MAGIC;
                if data.len() > 4 {
                    data[4] &= !FLAGS_RESERVED;
                }
                if data.len() > SHIM_LEN {
                    data[SHIM_LEN] = (data[SHIM_LEN] & !0x0F) | 0x01;
                }
                if data.len() > SHIM_LEN + 1 {
                    data[SHIM_LEN + 1] = (data[SHIM_LEN + 1] & 0x3F) | 0x40;
                }
                data.truncate(usize::from(fix.2).max(SHIM_LEN));
            }
            if fix.1 {
                let t = datagram::trailer(&data, &[]);
                data.extend_from_slice(&t);
            }
            let _ = RdShimRepr::parse(&data);
            if let Ok(v) = RdShim::new_checked(&data[..]) {
                let _ = (v.magic(), v.dst_qpn(), v.src_qpn(), v.flags(), v.epoch());
                let _ = (v.psn(), v.ack_epoch(), v.ack_psn(), v.window());
            }
            let _ = split(&data);
            match parse(&data) {
                Ok(Datagram::Rd { shim, segment }) => {
                    let mut out = vec![0u8; data.len() + 64];
                    let n = emit_into(&shim, segment.as_ref().map(|(s, p)| (s, *p)), &mut out);
                    prop_assert_eq!(parse(&out[..n]), Ok(Datagram::Rd { shim, segment }));
                }
                Ok(Datagram::Ud { segment, payload }) => {
                    let mut out = vec![0u8; data.len() + 64];
                    let n = datagram::emit_into(&segment, payload, &mut out);
                    prop_assert_eq!(parse(&out[..n]), Ok(Datagram::Ud { segment, payload }));
                }
                Err(_) => {}
            }
        }
    }
}
