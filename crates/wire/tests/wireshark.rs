//! Wireshark as the outside judge of our encoder: a TCP session carrying an
//! MPA Request/Reply and every RC opcode, framed by this crate with CRC on,
//! must dissect with "Good CRC32" for every FPDU, nothing malformed, and the
//! opcode/QN/MSN/STag fields we sent; a copy with one flipped bit must be
//! reported bad. A second session negotiates markers.

mod common;

use std::net::{Ipv4Addr, SocketAddrV4};

use common::frame;
use softrdma_sim::pcap::{Dir, PcapWriter, TcpSession};
use softrdma_sim::tshark::Tshark;
use softrdma_wire::ddp::DdpHeader;
use softrdma_wire::fpdu::Framer;
use softrdma_wire::mpa::{IrdOrd, MpaRepr};
use softrdma_wire::rdmap::{
    AtomicOp, AtomicRequest, AtomicResponse, EchoedHeader, Opcode, RdmapBody, ReadRequest,
    SegmentRepr, TerminateCause, TerminateRepr,
};

/// One FPDU of the scripted session and what tshark must show for it.
struct Sent {
    dir: Dir,
    repr: SegmentRepr,
    payload: Vec<u8>,
}

/// The scripted session: every RFC 5040 and RFC 7306 opcode, a two-segment
/// Send and a two-segment Write, and zero-length messages.
fn script() -> Vec<Sent> {
    use Dir::{ClientToServer as C, ServerToClient as S};
    let data =
        |n: usize, seed: u8| -> Vec<u8> { (0..n).map(|i| seed.wrapping_add(i as u8)).collect() };
    let mut inval = SegmentRepr::untagged(Opcode::SendInvalidate, 0, 2, 0, true, RdmapBody::None);
    if let DdpHeader::Untagged { rsvd_ulp, .. } = &mut inval.ddp {
        *rsvd_ulp = 0x0012_3401;
    }
    let mut se_inval =
        SegmentRepr::untagged(Opcode::SendSeInvalidate, 0, 4, 0, true, RdmapBody::None);
    if let DdpHeader::Untagged { rsvd_ulp, .. } = &mut se_inval.ddp {
        *rsvd_ulp = 0x0012_3402;
    }
    let read = ReadRequest {
        sink_stag: 0x0001_2a01,
        sink_to: 0x7f00_0000_1000,
        size: 64,
        src_stag: 0x4c02,
        src_to: 0x7f00_abcd_0000,
    };
    let atomic = AtomicRequest {
        op: AtomicOp::FetchAdd,
        req_id: 7,
        stag: 0x4c02,
        to: 0x7f00_abcd_0040,
        add_swap: 5,
        add_swap_mask: 0,
        compare: 0,
        compare_mask: 0,
    };
    let offending = {
        let mut u = vec![0u8; 18];
        SegmentRepr::untagged(Opcode::Send, 0, 9, 0, true, RdmapBody::None).emit(&mut u);
        u
    };
    let mut term = TerminateRepr::new(TerminateCause::DdpUntaggedNoBuffer);
    term.segment_len = Some(100);
    term.ddp_header = Some(EchoedHeader::from_segment(&offending).unwrap());
    vec![
        // Peer-to-peer RTR: zero-length Write to STag 1.
        Sent {
            dir: C,
            repr: SegmentRepr::tagged(Opcode::RdmaWrite, 1, 0, true),
            payload: vec![],
        },
        Sent {
            dir: C,
            repr: SegmentRepr::tagged(Opcode::RdmaWrite, 0x3303, 0x5600_1234_0000, false),
            payload: data(1000, 1),
        },
        Sent {
            dir: C,
            repr: SegmentRepr::tagged(Opcode::RdmaWrite, 0x3303, 0x5600_1234_0000 + 1000, true),
            payload: data(13, 2),
        },
        Sent {
            dir: C,
            repr: SegmentRepr::untagged(Opcode::Send, 0, 1, 0, false, RdmapBody::None),
            payload: data(700, 3),
        },
        Sent {
            dir: C,
            repr: SegmentRepr::untagged(Opcode::Send, 0, 1, 700, true, RdmapBody::None),
            payload: data(10, 4),
        },
        Sent {
            dir: C,
            repr: inval,
            payload: data(5, 5),
        },
        Sent {
            dir: C,
            repr: SegmentRepr::untagged(Opcode::SendSe, 0, 3, 0, true, RdmapBody::None),
            payload: data(0, 6),
        },
        Sent {
            dir: C,
            repr: se_inval,
            payload: data(7, 7),
        },
        Sent {
            dir: C,
            repr: SegmentRepr::untagged(
                Opcode::ReadRequest,
                1,
                1,
                0,
                true,
                RdmapBody::ReadRequest(read),
            ),
            payload: vec![],
        },
        Sent {
            dir: S,
            repr: SegmentRepr::tagged(Opcode::ReadResponse, read.sink_stag, read.sink_to, true),
            payload: data(64, 8),
        },
        Sent {
            dir: C,
            repr: SegmentRepr::untagged(
                Opcode::ImmediateData,
                0,
                5,
                0,
                true,
                RdmapBody::Immediate(0x1122_3344_5566_7788),
            ),
            payload: vec![],
        },
        Sent {
            dir: C,
            repr: SegmentRepr::untagged(
                Opcode::ImmediateDataSe,
                0,
                6,
                0,
                true,
                RdmapBody::Immediate(42),
            ),
            payload: vec![],
        },
        Sent {
            dir: C,
            repr: SegmentRepr::untagged(
                Opcode::AtomicRequest,
                1,
                2,
                0,
                true,
                RdmapBody::AtomicRequest(atomic),
            ),
            payload: vec![],
        },
        Sent {
            dir: S,
            repr: SegmentRepr::untagged(
                Opcode::AtomicResponse,
                3,
                1,
                0,
                true,
                RdmapBody::AtomicResponse(AtomicResponse {
                    req_id: 7,
                    orig_value: 99,
                }),
            ),
            payload: vec![],
        },
        Sent {
            dir: S,
            repr: SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None),
            payload: data(33, 9),
        },
        Sent {
            dir: S,
            repr: SegmentRepr::untagged(
                Opcode::Terminate,
                2,
                1,
                0,
                true,
                RdmapBody::Terminate(term),
            ),
            payload: vec![],
        },
    ]
}

/// Writes the session as a pcap: MPA frames, then each FPDU in its own TCP
/// segment (Wireshark's marker-aware parsing wants segment = FPDU).
fn session_pcap(crc: bool, markers: bool, sent: &[Sent]) -> Vec<u8> {
    let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
    let server = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 7174);
    let w = PcapWriter::new(Vec::new()).unwrap();
    let mut tcp = TcpSession::open(w, client, server).unwrap();
    let word = Some(IrdOrd {
        p2p: true,
        rtr_write: true,
        rtr_read: true,
        ..IrdOrd::new(16, 16)
    });
    let mut req = MpaRepr::request(word, b"softrdma");
    req.crc = crc;
    req.markers = markers;
    let mut rep = MpaRepr::reply(
        Some(IrdOrd {
            p2p: true,
            rtr_write: true,
            ..IrdOrd::new(16, 16)
        }),
        b"ok",
    );
    rep.crc = crc;
    rep.markers = markers;
    for (dir, m) in [(Dir::ClientToServer, &req), (Dir::ServerToClient, &rep)] {
        let mut b = vec![0u8; m.buffer_len()];
        m.emit(&mut b);
        tcp.send(dir, &b).unwrap();
    }
    let mut framers = [Framer::new(crc, markers), Framer::new(crc, markers)];
    for s in sent {
        let f = &mut framers[matches!(s.dir, Dir::ServerToClient) as usize];
        let bytes = frame(f, &s.repr, &s.payload);
        tcp.send_segments(s.dir, &[&bytes]).unwrap();
    }
    let pcap = tcp.close().unwrap().into_inner();
    // For a look by hand: SOFTRDMA_PCAP_DIR=dir keeps the captures.
    if let Ok(dir) = std::env::var("SOFTRDMA_PCAP_DIR") {
        let name = format!(
            "wire-session-crc{}-markers{}.pcap",
            crc as u8, markers as u8
        );
        std::fs::write(std::path::Path::new(&dir).join(name), &pcap).unwrap();
    }
    pcap
}

fn opcode_name(o: Opcode) -> String {
    format!("0x{:02x}", u8::from(o))
}

#[test]
fn our_fpdus_dissect_with_good_crc_and_the_fields_we_sent() {
    let Some(ts) = Tshark::for_test("our_fpdus_dissect_with_good_crc_and_the_fields_we_sent")
    else {
        return;
    };
    let sent = script();
    let pcap = session_pcap(true, false, &sent);
    assert_eq!(
        ts.count_good_crc(&pcap[..]).unwrap(),
        sent.len(),
        "{}",
        ts.summary(&pcap[..]).unwrap()
    );
    assert_eq!(ts.count_bad_crc(&pcap[..]).unwrap(), 0);
    assert_eq!(
        ts.malformed_count(&pcap[..]).unwrap(),
        0,
        "{}",
        ts.verbose(&pcap[..]).unwrap()
    );
    assert_eq!(
        ts.expert_errors(&pcap[..]).unwrap(),
        0,
        "{}",
        ts.expert_error_report(&pcap[..]).unwrap()
    );

    let rows = ts
        .fields(
            &pcap[..],
            "iwarp_mpa.fpdu",
            &[
                "iwarp_rdma.opcode",
                "iwarp_ddp.qn",
                "iwarp_ddp.msn",
                "iwarp_ddp.mo",
                "iwarp_ddp.stag",
                "iwarp_ddp.last_flag",
                "iwarp_mpa.ulpdulength",
            ],
        )
        .unwrap();
    assert_eq!(rows.len(), sent.len(), "one FPDU per segment");
    for (row, s) in rows.iter().zip(&sent) {
        assert_eq!(row[0], opcode_name(s.repr.opcode), "opcode of {:?}", s.repr);
        match s.repr.ddp {
            DdpHeader::Untagged { qn, msn, mo, .. } => {
                assert_eq!(row[1], qn.to_string(), "QN of {:?}", s.repr);
                assert_eq!(row[2], msn.to_string(), "MSN of {:?}", s.repr);
                assert_eq!(row[3], mo.to_string(), "MO of {:?}", s.repr);
            }
            DdpHeader::Tagged { stag, .. } => {
                assert_eq!(row[4], format!("0x{stag:08x}"), "STag of {:?}", s.repr);
            }
        }
        let last = if s.repr.last {
            ["1", "True"]
        } else {
            ["0", "False"]
        };
        assert!(
            last.contains(&row[5].as_str()),
            "L bit {} of {:?}",
            row[5],
            s.repr
        );
        assert_eq!(row[6], (s.repr.header_len() + s.payload.len()).to_string());
    }
}

#[test]
fn a_flipped_bit_is_reported_bad() {
    let Some(ts) = Tshark::for_test("a_flipped_bit_is_reported_bad") else {
        return;
    };
    let sent = script();
    let mut pcap = session_pcap(true, false, &sent);
    // Flip one payload bit of the 1000-octet Write: find its data in the
    // capture (octets 1, 2, 3, ... as `script` fills them) and corrupt one.
    let pattern: Vec<u8> = (1..=32u8).collect();
    let at = pcap
        .windows(32)
        .position(|w| w == pattern)
        .expect("write payload in capture");
    pcap[at + 100] ^= 0x10;
    assert_eq!(ts.count_bad_crc(&pcap[..]).unwrap(), 1);
    assert_eq!(ts.count_good_crc(&pcap[..]).unwrap(), sent.len() - 1);
}

#[test]
fn markers_session_dissects_with_good_crc() {
    let Some(ts) = Tshark::for_test("markers_session_dissects_with_good_crc") else {
        return;
    };
    let sent = script();
    let pcap = session_pcap(true, true, &sent);
    assert_eq!(
        ts.count_good_crc(&pcap[..]).unwrap(),
        sent.len(),
        "{}",
        ts.verbose(&pcap[..]).unwrap()
    );
    assert_eq!(ts.count_bad_crc(&pcap[..]).unwrap(), 0);
    assert_eq!(ts.malformed_count(&pcap[..]).unwrap(), 0);
    assert_eq!(
        ts.expert_errors(&pcap[..]).unwrap(),
        0,
        "{}",
        ts.expert_error_report(&pcap[..]).unwrap()
    );
    // Markers were really there: tshark shows their back pointers.
    let ptrs = ts
        .field_values(&pcap[..], "iwarp_mpa.markers", "iwarp_mpa.marker_fpduptr")
        .unwrap();
    assert!(ptrs.len() >= 4, "markers seen: {ptrs:?}");
}
