//! Every golden vector of `testdata/iwarp/golden.txt` and every FPDU
//! Linux siw sent in the two captured rping sessions parses and re-emits
//! byte for byte through this crate.

mod common;

use common::*;
use softrdma_wire::ddp::DdpHeader;
use softrdma_wire::fpdu::{Deframer, Framer};
use softrdma_wire::mpa::{FrameKind, MpaRepr};
use softrdma_wire::rdmap::{Opcode, RdmapBody};

#[test]
fn golden_vectors_round_trip() {
    let vectors = golden_vectors();
    assert_eq!(
        vectors.len(),
        8,
        "golden.txt lists 2 MPA frames and 6 FPDUs"
    );
    let mut fpdus = 0;
    for v in &vectors {
        if v.title.starts_with("MPA") {
            let (repr, used) =
                MpaRepr::parse(&v.bytes).unwrap_or_else(|e| panic!("{}: {e}", v.title));
            assert_eq!(used, v.bytes.len(), "{}", v.title);
            let mut out = vec![0u8; repr.buffer_len()];
            repr.emit(&mut out);
            assert_eq!(out, v.bytes, "{}", v.title);
            assert!(repr.crc && repr.ird_ord.is_some());
            continue;
        }
        assert!(v.title.starts_with("FPDU"), "unknown vector {}", v.title);
        fpdus += 1;
        let seen = deframe_all(&mut Deframer::new(true, false), &v.bytes);
        assert_eq!(seen.len(), 1, "{}", v.title);
        let (repr, payload) = parse_segment(&seen[0].ulpdu());
        let again = frame(&mut Framer::new(true, false), &repr, &payload);
        assert_eq!(again, v.bytes, "{}", v.title);
    }
    assert_eq!(fpdus, 6);
}

/// Decodes one captured siw session; returns its opcodes in order per
/// direction and whether CRC was negotiated.
fn siw_session(name: &str) -> (Vec<Opcode>, Vec<Opcode>, bool, Vec<SegmentSummary>) {
    let pcap = std::fs::read(softrdma_sim::iwarp_testdata(name)).unwrap();
    let (c2s, s2c) = tcp_streams(&pcap);
    let (req, req_len) = MpaRepr::parse(&c2s).expect("MPA Request");
    let (rep, rep_len) = MpaRepr::parse(&s2c).expect("MPA Reply");
    assert_eq!(req.kind, FrameKind::Request);
    assert_eq!(rep.kind, FrameKind::Reply);
    assert!(!rep.reject && !req.markers && !rep.markers);
    // The frames re-emit exactly as siw sent them.
    for (repr, bytes) in [(&req, &c2s[..req_len]), (&rep, &s2c[..rep_len])] {
        let mut out = vec![0u8; repr.buffer_len()];
        repr.emit(&mut out);
        assert_eq!(out, bytes);
    }
    let crc = req.crc || rep.crc;
    let mut summaries = Vec::new();
    let mut ops = [Vec::new(), Vec::new()];
    for (i, stream) in [&c2s[req_len..], &s2c[rep_len..]].into_iter().enumerate() {
        let seen = deframe_all(&mut Deframer::new(crc, false), stream);
        let mut framer = Framer::new(crc, false);
        let mut reframed = Vec::new();
        for s in &seen {
            let (repr, payload) = parse_segment(&s.ulpdu());
            reframed.extend(frame(&mut framer, &repr, &payload));
            ops[i].push(repr.opcode);
            summaries.push(SegmentSummary {
                repr,
                len: payload.len(),
            });
        }
        assert_eq!(
            reframed, stream,
            "{name}: direction {i} re-frames byte for byte"
        );
    }
    let [a, b] = ops;
    (a, b, crc, summaries)
}

#[derive(Debug)]
#[allow(dead_code)]
struct SegmentSummary {
    repr: softrdma_wire::rdmap::SegmentRepr,
    len: usize,
}

#[test]
fn siw_rping_default_session_round_trips() {
    let (client, server, crc, _) = siw_session("siw-rping-default.pcap");
    assert!(!crc, "siw's default is no CRC");
    // rping: the client Sends its buffer advertisement, the server Reads it,
    // Writes back and Sends; 10 iterations.
    assert!(client.contains(&Opcode::Send));
    assert!(client.contains(&Opcode::ReadResponse));
    assert!(server.contains(&Opcode::ReadRequest));
    assert!(server.contains(&Opcode::RdmaWrite));
    assert!(server.contains(&Opcode::Send));
}

#[test]
fn siw_rping_crc_p2p_session_round_trips() {
    let (client, _server, crc, segs) = siw_session("siw-rping-crc-p2p.pcap");
    assert!(crc);
    // In peer-to-peer mode the initiator's first FPDU is the RTR: a
    // zero-length RDMA Write to STag 1, TO 0.
    assert_eq!(client[0], Opcode::RdmaWrite);
    let rtr = &segs[0];
    assert_eq!(rtr.len, 0);
    assert!(matches!(
        rtr.repr.ddp,
        DdpHeader::Tagged { stag: 1, to: 0, .. }
    ));
    assert!(matches!(rtr.repr.body, RdmapBody::None));
}
