//! `tcp_mpa_bw` and `tcp_mpa_crc_bw`: the floors of RC Write bandwidth
//! without and with the MPA CRC over a kernel TCP socket — a raw stream of
//! RDMA Write FPDUs, framed and taken apart with softrdma's wire code and
//! nothing else, placed the way the RC engine places a Write.
//!
//! * The sender cuts every `size`-octet message into tagged RDMA Write
//!   segments of at most the ULPDU RC would use on the same connection
//!   ([`softrdma_engine::cm::max_ulpdu`]: the MSS read right after connect,
//!   less the MPA framing) and writes them with `writev`, header, payload
//!   straight from the message buffer, and pad + CRC field, as many FPDUs
//!   per call as the kernel takes — the RC transmit path. Without CRC the
//!   field is zero and the whole message is offered at once; with CRC
//!   (`tcp_mpa_crc_bw`) each FPDU's CRC32C is computed over its length
//!   field, header, payload and pad right before it is written, in batches
//!   of up to [`CRC_BATCH_BYTES`] so that what the CRC read is still in
//!   cache when the kernel copies it (the RC engine's `TX_BATCH_BYTES`).
//! * The receiver reads each FPDU's payload straight into its target
//!   region (one message long) at the segment's tagged offset with one
//!   `readv` that also takes the FPDU's trailer and the next FPDU's header
//!   (the RC engine's direct placement, `RcQp::rx_direct`), parses and
//!   checks that header (opcode, STag, bounds) and goes on. A payload can
//!   only be placed once its header has been read, so a stream of FPDUs
//!   needs at least one read per FPDU, where the raw stream receiver reads
//!   256 KiB at a time. With CRC the placed octets are checksummed where
//!   they landed (the deframer's `placed_payload`, as the engine does) and
//!   each FPDU's CRC is checked when its trailer arrives; a mismatch ends
//!   the run with an error.
//!
//! No queues, locks, registry, completion queue or end-to-end
//! acknowledgement beyond `tcp_bw`'s: `softrdma perf tcp_mpa_bw` (its
//! ratio to `tcp_bw` of the same run) is what direct placement over a
//! kernel socket costs, whatever the engine around it does, and
//! `tcp_mpa_crc_bw` what it costs with the CRC the MPA stream carries —
//! the bound of RC Write bandwidth with CRC that the engine can approach
//! but not pass.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;

use softrdma_wire::ddp::{DdpHeader, Mode};
use softrdma_wire::fpdu::{self, Chunk, Deframer, Event, Framer, CRC_LEN, LEN_FIELD};
use softrdma_wire::rdmap::{Opcode, SegmentRepr};

use super::cell::Watch;

/// The STag the sender targets and the receiver expects.
const STAG: u32 = 0x0051_7a90;
/// DDP + RDMAP header of a tagged segment (RDMA Write).
const TAGGED_HDR: usize = 14;
/// With CRC, the octets of FPDUs checksummed before they are written: a
/// batch ends once it holds this many (the RC engine's bound, which keeps
/// what the CRC just read in the L2 cache for the kernel's copy).
const CRC_BATCH_BYTES: usize = 1 << 18;

/// The FPDUs of one message: per segment its MPA length field plus
/// header, the payload's place in the message and the trailer length.
pub(crate) struct WriteFrames {
    headers: Vec<[u8; LEN_FIELD + TAGGED_HDR]>,
    spans: Vec<(usize, usize, usize)>,
    /// Per FPDU its pad and CRC field, rewritten for every message when
    /// `crc` is on (zeros otherwise).
    trailers: Vec<[u8; 3 + CRC_LEN]>,
    crc: bool,
}

impl WriteFrames {
    /// The FPDUs of a `size`-octet Write into the region at `to`, cut at
    /// `max_ulpdu` (the ULPDU: header + payload); `crc`: each FPDU carries
    /// its CRC32C, computed anew at every [`WriteFrames::write`].
    pub(crate) fn new(
        size: usize,
        to: u64,
        max_ulpdu: usize,
        crc: bool,
    ) -> io::Result<WriteFrames> {
        let cap = max_ulpdu.saturating_sub(TAGGED_HDR);
        if cap == 0 {
            return Err(io::Error::other(format!(
                "tcp_mpa_bw: a ULPDU of {max_ulpdu} octets leaves no room for payload"
            )));
        }
        let n = size.div_ceil(cap).max(1);
        let mut headers = Vec::with_capacity(n);
        let mut spans = Vec::with_capacity(n);
        for k in 0..n {
            let at = k * cap;
            let len = cap.min(size - at);
            let repr = SegmentRepr::tagged(Opcode::RdmaWrite, STAG, to + at as u64, k + 1 == n);
            let mut h = [0u8; LEN_FIELD + TAGGED_HDR];
            repr.emit(&mut h[LEN_FIELD..]);
            let ulpdu = fpdu::set_ulpdu_len(&mut h, len)
                .map_err(|e| io::Error::other(format!("tcp_mpa_bw: {e:?}")))?;
            headers.push(h);
            spans.push((at, len, fpdu::pad_len(ulpdu) + CRC_LEN));
        }
        Ok(WriteFrames {
            headers,
            trailers: vec![[0; 3 + CRC_LEN]; spans.len()],
            spans,
            crc,
        })
    }

    /// FPDUs per message.
    pub(crate) fn count(&self) -> usize {
        self.spans.len()
    }

    /// Writes the message `msg` as these FPDUs, every one whole, with as
    /// few `writev` calls as the kernel allows; with CRC, batch by batch,
    /// each batch's CRCs computed right before it is written.
    pub(crate) fn write(&mut self, s: &mut TcpStream, msg: &[u8], w: &mut Watch) -> io::Result<()> {
        let n = self.spans.len();
        // The wire code's framer computes each trailer (pad and CRC); the
        // octets it hands back borrowed are the header and payload the
        // io-vectors already point at.
        let mut framer = Framer::new(true, false);
        let mut first = 0;
        while first < n {
            let mut end = first;
            let mut bytes = 0;
            while end < n && (!self.crc || bytes < CRC_BATCH_BYTES) {
                let (at, len, trailer) = self.spans[end];
                if self.crc {
                    let slot = &mut self.trailers[end];
                    let mut filled = 0;
                    framer
                        .frame(&self.headers[end], &[&msg[at..at + len]], |c| {
                            if let Chunk::Inline(t) = c {
                                let t = t.as_slice();
                                slot[filled..filled + t.len()].copy_from_slice(t);
                                filled += t.len();
                            }
                        })
                        .map_err(|e| io::Error::other(format!("tcp_mpa_crc_bw: {e:?}")))?;
                    debug_assert_eq!(filled, trailer, "pad and CRC field");
                }
                bytes += self.headers[end].len() + len + trailer;
                end += 1;
            }
            self.write_range(s, msg, first..end, w)?;
            first = end;
        }
        Ok(())
    }

    /// Writes FPDUs `range` of `msg` whole.
    fn write_range(
        &self,
        s: &mut TcpStream,
        msg: &[u8],
        range: std::ops::Range<usize>,
        w: &mut Watch,
    ) -> io::Result<()> {
        let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(3 * range.len());
        for k in range {
            let (at, len, trailer) = self.spans[k];
            iov.push(IoSlice::new(&self.headers[k]));
            iov.push(IoSlice::new(&msg[at..at + len]));
            iov.push(IoSlice::new(&self.trailers[k][..trailer]));
        }
        let mut left: &mut [IoSlice<'_>] = &mut iov;
        while !left.is_empty() {
            match s.write_vectored(left) {
                Ok(0) => return Err(io::Error::other("TCP write returned 0")),
                Ok(n) => {
                    IoSlice::advance_slices(&mut left, n);
                    w.progress();
                }
                Err(e) if super::baseline::would_block(&e) => super::baseline::wait_room(s, w)?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The receiving end: places every Write payload into `region` (the
/// target of tagged offset 0) and counts the octets placed. Returns at the
/// sender's EOF, which must fall between FPDUs; a header that is not an
/// RDMA Write to [`STAG`] within `region` is an error, and so is, with
/// `crc`, an FPDU whose CRC does not match what was placed.
pub(crate) fn receive(
    s: &mut TcpStream,
    region: &mut [u8],
    w: &mut Watch,
    crc: bool,
) -> io::Result<u64> {
    const HDR: usize = LEN_FIELD + TAGGED_HDR;
    let mut deframer = Deframer::new(crc, false);
    // The trailer of the FPDU being placed, then the next FPDU's header.
    let mut tail = [0u8; 8 + HDR];
    // Octets to read before the next payload starts (the first header).
    let mut want = HDR;
    // Where the current segment's payload goes next.
    let mut place = 0usize;
    let mut octets = 0u64;
    loop {
        let direct = deframer.direct_payload().filter(|&(left, _)| left > 0);
        let r = match direct {
            Some((left, trailer)) => {
                want = trailer + HDR;
                let end = place + left;
                let mut iov = [
                    IoSliceMut::new(&mut region[place..end]),
                    IoSliceMut::new(&mut tail[..want]),
                ];
                s.read_vectored(&mut iov).map(|n| (n, left))
            }
            None => s.read(&mut tail[..want]).map(|n| (n, 0)),
        };
        let (n, left) = match r {
            Ok((0, _)) if deframer.at_boundary() => return Ok(octets),
            Ok((0, _)) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "tcp_mpa_bw: the sender closed inside an FPDU",
                ))
            }
            Ok(x) => x,
            Err(e) if super::baseline::would_block(&e) => {
                w.check("TCP stream data")?;
                continue;
            }
            Err(e) => return Err(e),
        };
        w.progress();
        let placed = n.min(left);
        if placed > 0 {
            // With CRC the octets are checksummed where they landed.
            let ok = if crc {
                deframer.placed_payload(&region[place..place + placed])
            } else {
                deframer.skip_payload(placed)
            };
            debug_assert!(ok, "direct_payload offered the octets");
            place += placed;
            octets += placed as u64;
        }
        let rest = n - placed;
        want -= rest.min(want);
        if want == 0 {
            want = HDR;
        }
        // Trailer and header octets (and, after a header read that ran
        // into a payload, a few payload octets, copied).
        let mut input = &tail[..rest];
        while !input.is_empty() {
            let (used, header) = match deframer.decode(input) {
                Ok((used, Some(Event::Header(h)))) => {
                    let b: [u8; TAGGED_HDR] = h.try_into().map_err(|_| {
                        io::Error::other(format!(
                            "tcp_mpa_bw: a {}-octet header, not a tagged one",
                            h.len()
                        ))
                    })?;
                    (used, Some(b))
                }
                Ok((used, Some(Event::Payload(p)))) => {
                    let end = place + p.len();
                    region
                        .get_mut(place..end)
                        .ok_or_else(|| io::Error::other("tcp_mpa_bw: payload past its segment"))?
                        .copy_from_slice(p);
                    place = end;
                    octets += p.len() as u64;
                    (used, None)
                }
                Ok((used, _)) => (used, None),
                Err(e) => return Err(io::Error::other(format!("tcp_mpa_bw stream: {e:?}"))),
            };
            if let Some(h) = header {
                let payload = deframer.ulpdu_len() - TAGGED_HDR;
                place = check_header(&h, payload, region.len())?;
            }
            input = &input[used..];
        }
    }
}

/// Checks a received header and returns where its `payload` octets go.
fn check_header(h: &[u8], payload: usize, region: usize) -> io::Result<usize> {
    let bad = |what: String| io::Error::other(format!("tcp_mpa_bw: {what}"));
    let (repr, _) = SegmentRepr::parse(h, Mode::Stream).map_err(|e| bad(format!("{e:?}")))?;
    let DdpHeader::Tagged { stag, to, .. } = repr.ddp else {
        return Err(bad(format!("untagged segment {repr:?}")));
    };
    if repr.opcode != Opcode::RdmaWrite || stag != STAG {
        return Err(bad(format!("unexpected segment {repr:?}")));
    }
    usize::try_from(to)
        .ok()
        .filter(|&t| t.checked_add(payload).is_some_and(|e| e <= region))
        .ok_or_else(|| {
            bad(format!(
                "{payload} octets at tagged offset {to}: outside the {region}-octet region"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    /// A connected pair of blocking loopback sockets.
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn watch() -> Watch {
        Watch::new(Duration::from_secs(20))
    }

    /// Sends `msgs` as Writes cut at `ulpdu` (with CRCs when `tx_crc`)
    /// and returns what the receiver (checking CRCs when `rx_crc`) placed
    /// in a region of `region` octets, or its error.
    fn run_with(
        msgs: Vec<Vec<u8>>,
        to: u64,
        ulpdu: usize,
        region: usize,
        tx_crc: bool,
        rx_crc: bool,
    ) -> io::Result<(Vec<u8>, u64)> {
        let (mut tx, mut rx) = pair();
        let sender = std::thread::spawn(move || {
            let mut w = watch();
            for m in &msgs {
                let mut f = WriteFrames::new(m.len(), to, ulpdu, tx_crc).unwrap();
                if f.write(&mut tx, m, &mut w).is_err() {
                    break; // the receiver gave up
                }
            }
        });
        let mut mem = vec![0u8; region];
        let r = receive(&mut rx, &mut mem, &mut watch(), rx_crc);
        drop(rx);
        sender.join().unwrap();
        r.map(|n| (mem, n))
    }

    /// [`run_with`] without CRC.
    fn run(msgs: Vec<Vec<u8>>, to: u64, ulpdu: usize, region: usize) -> io::Result<(Vec<u8>, u64)> {
        run_with(msgs, to, ulpdu, region, false, false)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn every_payload_lands_at_its_offset() {
        // Segment payloads of every length mod 4 (pad 0-3), one-segment
        // and many-segment messages, and a large one the kernel splits.
        for (size, ulpdu) in [
            (1usize, 64usize),
            (97, 64),
            (1000, 14 + 33),
            (4096, 14 + 4096),
            (300_000, 32_741),
            // More than one CRC batch per message.
            (1 << 20, 65_535),
        ] {
            let frames = WriteFrames::new(size, 0, ulpdu, false).unwrap();
            assert_eq!(
                frames.count(),
                size.div_ceil(ulpdu - TAGGED_HDR),
                "size {size}"
            );
            for crc in [false, true] {
                let msgs = vec![pattern(size, 1), pattern(size, 2), pattern(size, 3)];
                let last = msgs[2].clone();
                let (mem, n) = run_with(msgs, 0, ulpdu, size, crc, crc).unwrap();
                assert_eq!(n, 3 * size as u64, "size {size} ulpdu {ulpdu} crc {crc}");
                assert!(
                    mem == last,
                    "size {size} ulpdu {ulpdu} crc {crc}: region differs from the last message"
                );
            }
        }
        // At an offset inside a larger region: nothing else is touched.
        let (mem, n) = run(vec![pattern(500, 9)], 100, 64, 1000).unwrap();
        assert_eq!(n, 500);
        assert_eq!(&mem[100..600], &pattern(500, 9)[..]);
        assert!(mem[..100].iter().chain(&mem[600..]).all(|&b| b == 0));
    }

    #[test]
    fn crc_frames_are_the_wire_framers_octet_for_octet() {
        // Two messages through one WriteFrames (the CRCs are computed anew
        // for each), read raw off the socket and compared with what the
        // wire code's Framer makes of the same segments.
        let (size, ulpdu) = (300_001usize, 32_741usize);
        let msgs = [pattern(size, 4), pattern(size, 7)];
        let (mut tx, mut rx) = pair();
        let mut f = WriteFrames::new(size, 0, ulpdu, true).unwrap();
        let want_len: usize;
        {
            let mut want = Vec::new();
            let mut framer = fpdu::Framer::new(true, false);
            for m in &msgs {
                for (h, &(at, len, _)) in f.headers.iter().zip(&f.spans) {
                    framer
                        .frame_to_vec(h, &[&m[at..at + len]], &mut want)
                        .unwrap();
                }
            }
            want_len = want.len();
            let reader = std::thread::spawn(move || {
                let mut got = Vec::new();
                rx.read_to_end(&mut got).unwrap();
                got
            });
            for m in &msgs {
                f.write(&mut tx, m, &mut watch()).unwrap();
            }
            drop(tx);
            let got = reader.join().unwrap();
            assert_eq!(got.len(), want_len);
            assert!(got == want, "the CRC'd stream differs from the Framer's");
        }
    }

    #[test]
    fn a_crc_mismatch_is_an_error() {
        // Frames without CRC (zero fields) to a receiver that checks them.
        let e = run_with(vec![pattern(1000, 3)], 0, 14 + 300, 1000, false, true).unwrap_err();
        assert!(e.to_string().contains("BadCrc"), "{e}");
    }

    #[test]
    fn a_write_past_the_region_is_refused_before_placement() {
        // The second segment (offset 50 + 50) would end past 120 octets.
        let e = run(vec![pattern(100, 5)], 50, 14 + 50, 120).unwrap_err();
        assert!(
            e.to_string().contains("outside the 120-octet region"),
            "{e}"
        );
        let e = run(vec![pattern(10, 5)], 200, 64, 120).unwrap_err();
        assert!(e.to_string().contains("tagged offset 200"), "{e}");
    }

    #[test]
    fn headers_other_than_a_write_to_our_stag_are_errors() {
        let (mut tx, mut rx) = pair();
        let mut h = [0u8; LEN_FIELD + TAGGED_HDR + 4 + 4];
        SegmentRepr::tagged(Opcode::ReadResponse, STAG, 0, true).emit(&mut h[LEN_FIELD..]);
        fpdu::set_ulpdu_len(&mut h[..LEN_FIELD + TAGGED_HDR], 4).unwrap();
        tx.write_all(&h).unwrap();
        let e = receive(&mut rx, &mut [0u8; 64], &mut watch(), false).unwrap_err();
        assert!(e.to_string().contains("unexpected segment"), "{e}");

        let (mut tx, mut rx) = pair();
        SegmentRepr::tagged(Opcode::RdmaWrite, STAG + 1, 0, true).emit(&mut h[LEN_FIELD..]);
        tx.write_all(&h).unwrap();
        let e = receive(&mut rx, &mut [0u8; 64], &mut watch(), false).unwrap_err();
        assert!(e.to_string().contains("unexpected segment"), "{e}");
    }

    #[test]
    fn eof_inside_an_fpdu_is_an_error_and_between_fpdus_is_the_end() {
        let (mut tx, mut rx) = pair();
        let mut f = WriteFrames::new(40, 0, 64, false).unwrap();
        f.write(&mut tx, &pattern(40, 0), &mut watch()).unwrap();
        drop(tx);
        assert_eq!(
            receive(&mut rx, &mut [0u8; 40], &mut watch(), false).unwrap(),
            40
        );

        let (mut tx, mut rx) = pair();
        let mut h = [0u8; LEN_FIELD + TAGGED_HDR + 10];
        SegmentRepr::tagged(Opcode::RdmaWrite, STAG, 0, true).emit(&mut h[LEN_FIELD..]);
        fpdu::set_ulpdu_len(&mut h[..LEN_FIELD + TAGGED_HDR], 40).unwrap();
        tx.write_all(&h).unwrap();
        drop(tx);
        let e = receive(&mut rx, &mut [0u8; 40], &mut watch(), false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }
}
