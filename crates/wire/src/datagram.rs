//! softrdma iWARP over UDP: one DDP segment per datagram, protected by a
//! CRC32C trailer (`docs/datagram.md`; not a standard).
//!
//! ```text
//! UDP payload = DDP header [T-MSN T-MO]X [DQPN]Q | RDMAP header part | payload | CRC32C (4)
//! ```
//!
//! * No MPA: no ULPDU_Length, no markers, no pad. The UDP length delimits
//!   the segment.
//! * The CRC32C covers every octet before it and is stored least-significant
//!   octet first, exactly like the MPA CRC ([`crate::crc`]).
//! * The DDP control octet is read in [`Mode::Datagram`]: X and Q add words,
//!   0x0C must be zero (see [`crate::ddp`]).
//!
//! Receiving: [`parse`] checks the CRC before it looks at any header field, so
//! every corrupted datagram is [`Error::BadCrc`], whatever octet was hit.
//! Sending: [`emit_header`] writes the header, the payload stays where it is
//! (a gather list), and [`trailer`] computes the CRC over both without a copy;
//! or, for a small payload copied behind the header, [`seal`] appends it.

use crate::crc::{self, Crc32c};
use crate::ddp::Mode;
use crate::rdmap::SegmentRepr;
use crate::{Error, Result};

/// Length of the CRC32C trailer.
pub const CRC_LEN: usize = 4;
/// IPv4 header (no options) plus UDP header.
pub const IPV4_UDP_OVERHEAD: usize = 20 + 8;
/// IPv6 header (no extension headers) plus UDP header.
pub const IPV6_UDP_OVERHEAD: usize = 40 + 8;
/// The DDP mode every datagram is read in.
pub const MODE: Mode = Mode::Datagram;

/// Decodes one UDP payload: checks the CRC32C trailer, then parses the
/// segment header in datagram mode. Returns the header and the payload (the
/// octets between the header and the CRC).
///
/// Errors: [`Error::Truncated`] when the datagram cannot hold two control
/// octets and a CRC, or ends inside the header its control octets announce;
/// [`Error::BadCrc`] when the trailer does not match; otherwise whatever
/// [`SegmentRepr::parse`] reports.
///
/// Always inlined, as [`SegmentRepr::parse`] is: returned through memory,
/// the header was written in narrow pieces and copied on in 16-octet
/// moves the CPU cannot forward from its store buffer, a stall on every
/// datagram received (`docs/performance.md`, "The latency path").
#[inline(always)]
pub fn parse(datagram: &[u8]) -> Result<(SegmentRepr, &[u8])> {
    if datagram.len() < 2 + CRC_LEN {
        return Err(Error::Truncated);
    }
    let (segment, tail) = datagram.split_at(datagram.len() - CRC_LEN);
    let mut wire = [0u8; CRC_LEN];
    wire.copy_from_slice(tail);
    if crc::from_wire(wire) != crc::crc32c(segment) {
        return Err(Error::BadCrc);
    }
    let (repr, hlen) = SegmentRepr::parse(segment, MODE)?;
    Ok((repr, &segment[hlen..]))
}

/// Writes the segment header at the start of `buf`; returns its length
/// ([`SegmentRepr::header_len`]). The caller should hold a `repr` that
/// [`SegmentRepr::validate`] accepts in [`Mode::Datagram`].
///
/// # Panics
/// If `buf` is shorter than the header.
pub fn emit_header(repr: &SegmentRepr, buf: &mut [u8]) -> usize {
    let n = repr.header_len();
    repr.emit(&mut buf[..n]);
    n
}

/// The four CRC octets that end a datagram made of `header` followed by the
/// `payload` slices, computed without gathering them.
pub fn trailer(header: &[u8], payload: &[&[u8]]) -> [u8; CRC_LEN] {
    let mut c = Crc32c::new();
    c.update(header);
    for p in payload {
        c.update(p);
    }
    c.wire_bytes()
}

/// Appends the CRC trailer to a segment already laid out contiguously in
/// `buf[..len]` (header, then payload): writes it at `buf[len..len + 4]`
/// and returns the datagram length. One CRC pass, for small datagrams that
/// are cheaper to copy than to gather.
///
/// # Panics
/// If `buf` is shorter than `len + 4`.
pub fn seal(buf: &mut [u8], len: usize) -> usize {
    let c = crc::to_wire(crc::crc32c(&buf[..len]));
    buf[len..len + CRC_LEN].copy_from_slice(&c);
    len + CRC_LEN
}

/// Size of the UDP payload for `repr` carrying `payload_len` octets.
pub fn buffer_len(repr: &SegmentRepr, payload_len: usize) -> usize {
    repr.header_len() + payload_len + CRC_LEN
}

/// Writes header, payload and CRC contiguously into `out`; returns the
/// datagram length. Meant for tests and small messages; the send path
/// gathers with [`emit_header`] and [`trailer`].
///
/// # Panics
/// If `out` is shorter than [`buffer_len`].
pub fn emit_into(repr: &SegmentRepr, payload: &[u8], out: &mut [u8]) -> usize {
    let total = buffer_len(repr, payload.len());
    let out = &mut out[..total];
    let h = emit_header(repr, out);
    out[h..h + payload.len()].copy_from_slice(payload);
    let t = trailer(&out[..h], &[payload]);
    out[h + payload.len()..].copy_from_slice(&t);
    total
}

/// The most payload octets one datagram with `repr`'s header can carry over
/// an IPv4 path of `mtu` octets without IP fragmentation:
/// `mtu − 20 − 8 − header − 4`, or 0 if that is negative.
pub fn max_payload(mtu: usize, repr: &SegmentRepr) -> usize {
    max_payload_with(mtu, IPV4_UDP_OVERHEAD, repr)
}

/// As [`max_payload`], with the IP + UDP header size given (for instance
/// [`IPV6_UDP_OVERHEAD`]).
pub fn max_payload_with(mtu: usize, ip_udp_overhead: usize, repr: &SegmentRepr) -> usize {
    mtu.saturating_sub(ip_udp_overhead + repr.header_len() + CRC_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ddp::{DdpHeader, TaggedExt};
    use crate::rdmap::{
        EchoedHeader, Opcode, RdmapBody, ReadRequest, TerminateCause, TerminateRepr,
    };
    use proptest::prelude::*;

    fn write_record() -> SegmentRepr {
        SegmentRepr {
            last: true,
            opcode: Opcode::WriteRecord,
            ddp: DdpHeader::Tagged {
                stag: 0x0001_2a01,
                to: 0x7f00_0000_1000,
                ext: Some(TaggedExt { msn: 3, mo: 2048 }),
            },
            dqpn: Some(0x42),
            body: RdmapBody::None,
        }
    }

    fn send_q() -> SegmentRepr {
        SegmentRepr {
            last: false,
            opcode: Opcode::Send,
            ddp: DdpHeader::Untagged {
                rsvd_ulp: 0,
                qn: 0,
                msn: 1,
                mo: 0,
            },
            dqpn: Some(7),
            body: RdmapBody::None,
        }
    }

    #[test]
    fn layout_write_record() {
        let r = write_record();
        let mut out = [0u8; 64];
        let n = emit_into(&r, b"abc", &mut out);
        assert_eq!(n, 26 + 3 + 4);
        let d = &out[..n];
        // ctrl, RDMAP RV=1 op 0xC, STag, TO, T-MSN, T-MO, DQPN.
        assert_eq!(d[0], 0xF1); // T, L, X, Q, DV=1
        assert_eq!(d[1], 0x4C);
        assert_eq!(&d[2..6], &[0x00, 0x01, 0x2a, 0x01]);
        assert_eq!(&d[6..14], &[0, 0, 0x7f, 0, 0, 0, 0x10, 0]);
        assert_eq!(&d[14..18], &[0, 0, 0, 3]);
        assert_eq!(&d[18..22], &[0, 0, 8, 0]);
        assert_eq!(&d[22..26], &[0, 0, 0, 0x42]);
        assert_eq!(&d[26..29], b"abc");
        // CRC over everything before it, LSB first.
        assert_eq!(d[29..], crc::to_wire(crc::crc32c(&d[..29])));
        assert_eq!(parse(d), Ok((r, &b"abc"[..])));
    }

    #[test]
    fn seal_equals_the_gathered_trailer() {
        for r in [write_record(), send_q()] {
            let payload: Vec<u8> = (0..77u8).collect();
            let mut gathered = [0u8; 128];
            let n = emit_into(&r, &payload, &mut gathered);
            let mut sealed = [0u8; 128];
            let h = emit_header(&r, &mut sealed);
            sealed[h..h + payload.len()].copy_from_slice(&payload);
            assert_eq!(seal(&mut sealed, h + payload.len()), n);
            assert_eq!(sealed[..n], gathered[..n]);
            assert_eq!(parse(&sealed[..n]), Ok((r, &payload[..])));
            // A flipped payload octet no longer matches the sealed CRC.
            sealed[h] ^= 1;
            assert_eq!(parse(&sealed[..n]), Err(Error::BadCrc));
        }
    }

    #[test]
    fn layout_untagged_q() {
        let r = send_q();
        let mut out = [0u8; 64];
        let n = emit_into(&r, b"hi", &mut out);
        let d = &out[..n];
        assert_eq!(n, 22 + 2 + 4);
        assert_eq!(d[0], 0x11); // T=0, L=0, Q, DV=1
        assert_eq!(&d[18..22], &[0, 0, 0, 7]);
        assert_eq!(parse(d), Ok((r, &b"hi"[..])));
    }

    #[test]
    fn read_request_and_terminate() {
        let rr = SegmentRepr {
            last: true,
            opcode: Opcode::ReadRequest,
            ddp: DdpHeader::Untagged {
                rsvd_ulp: 0,
                qn: 1,
                msn: 9,
                mo: 0,
            },
            dqpn: Some(3),
            body: RdmapBody::ReadRequest(ReadRequest {
                sink_stag: 1,
                sink_to: 0x1000,
                size: 4096,
                src_stag: 2,
                src_to: 0x2000,
            }),
        };
        let mut out = [0u8; 128];
        let n = emit_into(&rr, &[], &mut out);
        assert_eq!(n, 18 + 4 + 28 + 4);
        let rr_bytes = out[..n].to_vec();
        assert_eq!(parse(&rr_bytes), Ok((rr, &[][..])));

        let term = SegmentRepr {
            last: true,
            opcode: Opcode::Terminate,
            ddp: DdpHeader::Untagged {
                rsvd_ulp: 0,
                qn: 2,
                msn: 1,
                mo: 0,
            },
            dqpn: Some(3),
            body: RdmapBody::Terminate(TerminateRepr {
                cause: TerminateCause::RdmapAccessRights,
                segment_len: Some(0),
                ddp_header: Some(EchoedHeader::from_segment(&rr_bytes).unwrap()),
                rdmap_header: Some(match rr.body {
                    RdmapBody::ReadRequest(r) => r.to_bytes(),
                    _ => unreachable!(),
                }),
            }),
        };
        let n = emit_into(&term, &[], &mut out);
        assert_eq!(n, 18 + 4 + 4 + 2 + 18 + 28 + 4);
        assert_eq!(parse(&out[..n]), Ok((term, &[][..])));
    }

    #[test]
    fn gathered_trailer_matches_contiguous() {
        let r = write_record();
        let payload = b"0123456789abcdef";
        let mut hdr = [0u8; 32];
        let h = emit_header(&r, &mut hdr);
        let t = trailer(&hdr[..h], &[&payload[..5], &payload[5..], &[]]);
        let mut out = [0u8; 64];
        let n = emit_into(&r, payload, &mut out);
        assert_eq!(out[n - 4..n], t);
    }

    #[test]
    fn bad_crc_on_any_bit_flip() {
        let mut out = [0u8; 64];
        let n = emit_into(&send_q(), b"payload", &mut out);
        for bit in 0..n * 8 {
            let mut d = out[..n].to_vec();
            d[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(parse(&d), Err(Error::BadCrc), "bit {bit}");
        }
    }

    #[test]
    fn truncated_and_invalid() {
        assert_eq!(parse(&[]), Err(Error::Truncated));
        assert_eq!(parse(&[0x41, 0x43, 0, 0, 0]), Err(Error::Truncated));
        // A correct CRC over a header that ends early: truncated.
        let mut d = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0];
        let t = trailer(&d, &[]);
        d.extend_from_slice(&t);
        assert_eq!(parse(&d), Err(Error::Truncated));
        // Correct CRC, but a reserved DDP bit set: malformed.
        let mut out = [0u8; 64];
        let n = emit_into(&send_q(), b"x", &mut out);
        let mut d = out[..n].to_vec();
        d[0] |= 0x04;
        let t = trailer(&d[..n - 4], &[]);
        d[n - 4..].copy_from_slice(&t);
        assert_eq!(parse(&d), Err(Error::Malformed));
        // Stored big-endian instead of LSB first: bad CRC.
        let mut d = out[..n].to_vec();
        d[n - 4..].reverse();
        assert_eq!(parse(&d), Err(Error::BadCrc));
    }

    #[test]
    fn mtu_budget() {
        assert_eq!(max_payload(1500, &write_record()), 1500 - 28 - 26 - 4);
        assert_eq!(max_payload(1500, &send_q()), 1500 - 28 - 22 - 4);
        assert_eq!(
            max_payload_with(1500, IPV6_UDP_OVERHEAD, &send_q()),
            1500 - 48 - 22 - 4
        );
        assert_eq!(max_payload(40, &write_record()), 0);
        let r = write_record();
        let p = vec![0xA5u8; max_payload(1500, &r)];
        let mut out = vec![0u8; 1500];
        assert_eq!(emit_into(&r, &p, &mut out) + IPV4_UDP_OVERHEAD, 1500);
    }

    proptest! {
        #[test]
        fn prop_roundtrip(
            (_, repr) in crate::rdmap::tests::arb_segment()
                .prop_filter("datagram-valid", |(_, r)| r.fits(Mode::Datagram)),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let payload = match repr.body {
                RdmapBody::None | RdmapBody::Terminate(_) => payload,
                _ => Vec::new(),
            };
            let mut out = vec![0u8; buffer_len(&repr, payload.len())];
            let n = emit_into(&repr, &payload, &mut out);
            prop_assert_eq!(n, out.len());
            prop_assert_eq!(parse(&out), Ok((repr, &payload[..])));
        }

        #[test]
        fn prop_never_panics(
            mut data in proptest::collection::vec(any::<u8>(), 0..128),
            fix in any::<(bool, bool)>(),
        ) {
            if fix.0 && data.len() >= 2 {
                data[0] = (data[0] & !0x0F) | 0x01;
                data[1] = (data[1] & 0x3F) | 0x40;
            }
            if fix.1 {
                let t = trailer(&data, &[]);
                data.extend_from_slice(&t);
            }
            if let Ok((repr, payload)) = parse(&data) {
                let mut out = vec![0u8; data.len() + 64];
                let n = emit_into(&repr, payload, &mut out);
                prop_assert_eq!(parse(&out[..n]), Ok((repr, payload)));
            }
        }
    }
}
