//! Captures synthesized by `softrdma_sim::pcap`, checked by tshark.

mod common;

use common::{client, hex, save_pcap, server};
use softrdma_sim::pcap::{
    decode_frame, Dir, PcapFile, PcapWriter, TcpConfig, TcpFlags, TcpSession, Transport, UdpFlow,
};
use softrdma_sim::tshark::Tshark;
use std::net::{Ipv4Addr, SocketAddrV4};

/// The golden session: MPA Request/Reply, then each golden FPDU in its own
/// segment. Returns the pcap bytes.
fn golden_session(cfg: TcpConfig) -> Vec<u8> {
    let w = PcapWriter::new(Vec::new()).unwrap();
    let mut tcp = TcpSession::open_with(w, client(), server(), cfg).unwrap();
    let c2s = Dir::ClientToServer;
    let s2c = Dir::ServerToClient;
    tcp.send(c2s, &hex(common::MPA_REQUEST)).unwrap();
    tcp.send(s2c, &hex(common::MPA_REPLY)).unwrap();
    tcp.send_segments(
        c2s,
        &[
            &hex(common::FPDU_WRITE),
            &hex(common::FPDU_SEND),
            &hex(common::FPDU_READ_REQUEST),
        ],
    )
    .unwrap();
    tcp.send_segments(s2c, &[&hex(common::FPDU_READ_RESPONSE)])
        .unwrap();
    tcp.send_segments(c2s, &[&hex(common::FPDU_ZERO_WRITE)])
        .unwrap();
    tcp.send_segments(s2c, &[&hex(common::FPDU_TERMINATE)])
        .unwrap();
    tcp.close().unwrap().into_inner()
}

/// Every frame has valid IPv4 and TCP/UDP checksums according to tshark,
/// and TCP analysis flags nothing (so seq/ack numbers are consistent).
fn assert_clean_transport(ts: &Tshark, pcap: &std::path::Path) {
    let ts = ts.clone().with_checksum_validation();
    let rows = ts
        .fields(
            pcap,
            "",
            &[
                "frame.number",
                "ip.checksum.status",
                "tcp.checksum.status",
                "udp.checksum.status",
                "tcp.analysis.flags",
            ],
        )
        .unwrap();
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(
            r[1],
            "1",
            "{}: frame {}: IPv4 checksum {r:?}",
            pcap.display(),
            r[0]
        );
        assert!(
            r[2] == "1" || r[3] == "1",
            "{}: frame {}: TCP/UDP checksum not good: {r:?}",
            pcap.display(),
            r[0]
        );
        assert_eq!(
            r[4],
            "",
            "{}: frame {}: TCP analysis flags",
            pcap.display(),
            r[0]
        );
    }
    assert_eq!(
        ts.expert_errors(pcap).unwrap(),
        0,
        "{}:\n{}",
        pcap.display(),
        ts.expert_error_report(pcap).unwrap()
    );
}

#[test]
fn golden_session_decodes_with_good_crcs() {
    let Some(ts) = Tshark::for_test("golden_session_decodes_with_good_crcs") else {
        return;
    };
    let bytes = golden_session(TcpConfig::default());
    let pcap = save_pcap("golden_session", &bytes);

    let checks = ts.crc_checks(&pcap).unwrap();
    assert_eq!(checks.len(), 6, "{}: {checks:#?}", pcap.display());
    assert!(checks.iter().all(|c| c.good), "{checks:#?}");
    assert_eq!(ts.count_good_crc(&pcap).unwrap(), 6);
    assert_eq!(ts.count_bad_crc(&pcap).unwrap(), 0);
    assert_eq!(ts.malformed_count(&pcap).unwrap(), 0);
    assert_clean_transport(&ts, &pcap);

    let mpa = ts
        .fields(
            &pcap,
            "iwarp_mpa.req || iwarp_mpa.rep",
            &[
                "tcp.srcport",
                "iwarp_mpa.crc_flag",
                "iwarp_mpa.rev",
                "iwarp_mpa.privatedata",
            ],
        )
        .unwrap();
    assert_eq!(
        mpa,
        [
            ["40001", "1", "2", "00100010756c702d68656c6c6f"],
            ["7174", "1", "2", "00100010756c702d6f6b"],
        ]
    );

    let fpdus = ts
        .fields(
            &pcap,
            "iwarp_mpa.fpdu",
            &[
                "tcp.srcport",
                "iwarp_mpa.ulpdulength",
                "iwarp_rdma.opcode",
                "iwarp_mpa.crc_check",
            ],
        )
        .unwrap();
    assert_eq!(
        fpdus,
        [
            ["40001", "27", "0x00", "0xc32706ee"],
            ["40001", "28", "0x03", "0x1dbb4313"],
            ["40001", "46", "0x01", "0xe743842d"],
            ["7174", "78", "0x02", "0xcc15c721"],
            ["40001", "14", "0x00", "0xebd34c5f"],
            ["7174", "42", "0x07", "0x710d5e50"],
        ]
    );

    // In-memory input gives the same verdicts.
    assert_eq!(ts.count_good_crc(&bytes).unwrap(), 6);
}

#[test]
fn fpdus_split_and_coalesced_across_segments_reassemble() {
    let Some(ts) = Tshark::for_test("fpdus_split_and_coalesced_across_segments_reassemble") else {
        return;
    };
    // A small MSS splits FPDUs over segments and packs several per segment;
    // sequence numbers wrap around 2^32 in the client's stream.
    let cfg = TcpConfig {
        mss: 40,
        client_isn: u32::MAX - 60,
        ..TcpConfig::default()
    };
    let w = PcapWriter::new(Vec::new()).unwrap();
    let mut tcp = TcpSession::open_with(w, client(), server(), cfg).unwrap();
    tcp.send(Dir::ClientToServer, &hex(common::MPA_REQUEST))
        .unwrap();
    tcp.send(Dir::ServerToClient, &hex(common::MPA_REPLY))
        .unwrap();
    let mut stream = Vec::new();
    for v in [
        common::FPDU_WRITE,
        common::FPDU_SEND,
        common::FPDU_READ_REQUEST,
        common::FPDU_ZERO_WRITE,
    ] {
        stream.extend(hex(v));
    }
    tcp.send(Dir::ClientToServer, &stream).unwrap();
    tcp.send(Dir::ServerToClient, &hex(common::FPDU_READ_RESPONSE))
        .unwrap();
    let bytes = tcp.close().unwrap().into_inner();
    let pcap = save_pcap("split_and_coalesced", &bytes);

    let checks = ts.crc_checks(&pcap).unwrap();
    assert_eq!(checks.len(), 5, "{}: {checks:#?}", pcap.display());
    assert!(checks.iter().all(|c| c.good), "{checks:#?}");
    assert_eq!(ts.malformed_count(&pcap).unwrap(), 0);
    assert_clean_transport(&ts, &pcap);

    // 144 octets of FPDUs at MSS 40: segments of 40, 40, 40, 24 (PSH last).
    let lens = ts
        .fields(
            &pcap,
            "tcp.srcport == 40001 && tcp.len > 0",
            &["tcp.len", "tcp.flags.push"],
        )
        .unwrap();
    let lens: Vec<(&str, &str)> = lens
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str()))
        .collect();
    assert_eq!(
        lens,
        [
            ("33", "1"),
            ("40", "0"),
            ("40", "0"),
            ("40", "0"),
            ("24", "1")
        ]
    );
}

#[test]
fn tshark_flags_corrupted_checksums() {
    let Some(ts) = Tshark::for_test("tshark_flags_corrupted_checksums") else {
        return;
    };
    let ts = ts.with_checksum_validation();
    let good = golden_session(TcpConfig::default());
    let file = PcapFile::parse(&good).unwrap();

    // Rewrite the capture with frame 4 (MPA Request) damaged in its TCP
    // payload, and frame 5 (MPA Reply) damaged in its IPv4 header (TTL).
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    for (n, rec) in file.records.iter().enumerate() {
        let mut data = rec.data.clone();
        match n + 1 {
            4 => *data.last_mut().unwrap() ^= 0x01,
            5 => data[14 + 8] -= 1,
            _ => {}
        }
        w.write_frame_at(rec.timestamp, &data).unwrap();
    }
    let bad = w.into_inner();
    let pcap = save_pcap("corrupted_checksums", &bad);
    let rows = ts
        .fields(
            &pcap,
            "frame.number <= 5",
            &["frame.number", "ip.checksum.status", "tcp.checksum.status"],
        )
        .unwrap();
    assert_eq!(
        rows,
        [
            ["1", "1", "1"],
            ["2", "1", "1"],
            ["3", "1", "1"],
            ["4", "1", "0"],
            ["5", "0", "1"],
        ]
    );
    assert!(ts.expert_errors(&pcap).unwrap() >= 2);
    // Our own decoder agrees.
    let file = PcapFile::parse(&bad).unwrap();
    let p4 = decode_frame(&file.records[3].data).unwrap();
    assert!(p4.header_checksum_ok);
    assert!(matches!(
        p4.transport,
        Transport::Tcp {
            checksum_ok: false,
            ..
        }
    ));
    assert!(
        !decode_frame(&file.records[4].data)
            .unwrap()
            .header_checksum_ok
    );
}

#[test]
fn udp_flow_checksums_are_valid() {
    let Some(ts) = Tshark::for_test("udp_flow_checksums_are_valid") else {
        return;
    };
    let a = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 7), 49152);
    let b = SocketAddrV4::new(Ipv4Addr::new(198, 51, 100, 9), 50007);
    let mut flow = UdpFlow::new(PcapWriter::new(Vec::new()).unwrap(), a, b);
    flow.send(Dir::ClientToServer, b"\x01\x02\x03").unwrap();
    flow.send(Dir::ServerToClient, &[0xa5; 1000]).unwrap();
    flow.send(Dir::ClientToServer, &[0x5a; 8999]).unwrap(); // jumbo, odd length
    flow.send(Dir::ClientToServer, b"").unwrap();
    let bytes = flow.into_writer().into_inner();
    let pcap = save_pcap("udp_flow", &bytes);
    let ts = ts.with_checksum_validation();
    assert_eq!(ts.expert_errors(&pcap).unwrap(), 0);
    let rows = ts
        .fields(
            &pcap,
            "",
            &[
                "ip.src",
                "udp.srcport",
                "udp.dstport",
                "udp.length",
                "ip.checksum.status",
                "udp.checksum.status",
            ],
        )
        .unwrap();
    assert_eq!(
        rows,
        [
            ["198.51.100.7", "49152", "50007", "11", "1", "1"],
            ["198.51.100.9", "50007", "49152", "1008", "1", "1"],
            ["198.51.100.7", "49152", "50007", "9007", "1", "1"],
            ["198.51.100.7", "49152", "50007", "8", "1", "1"],
        ]
    );
}

#[test]
fn timestamps_step_monotonically() {
    let Some(ts) = Tshark::for_test("timestamps_step_monotonically") else {
        return;
    };
    let bytes = golden_session(TcpConfig::default());
    let rows = ts
        .fields(&bytes, "", &["frame.time_epoch", "frame.time_delta"])
        .unwrap();
    assert_eq!(rows[0][0], "1700000000.000000000");
    for r in &rows[1..] {
        assert_eq!(r[1], "0.001000000");
    }
}

/// Rebuilds handmade-markers.pcap's TCP streams segment by segment with
/// `TcpSession::send_segments` and checks tshark sees the same markers and
/// CRCs as in the original.
#[test]
fn replayed_marker_session_matches_original() {
    let Some(ts) = Tshark::for_test("replayed_marker_session_matches_original") else {
        return;
    };
    let original = softrdma_sim::iwarp_testdata("handmade-markers.pcap");
    let file = PcapFile::parse(&std::fs::read(&original).unwrap()).unwrap();

    let mut cfg = TcpConfig::default();
    let mut endpoints = None;
    let mut data = Vec::new(); // (from client?, payload)
    for rec in &file.records {
        let p = decode_frame(&rec.data).expect("IPv4 frame");
        let Transport::Tcp {
            src_port,
            dst_port,
            seq,
            flags,
            payload,
            ..
        } = p.transport
        else {
            panic!("not TCP");
        };
        if flags == TcpFlags::SYN {
            cfg.client_isn = seq;
            endpoints = Some((
                SocketAddrV4::new(p.src, src_port),
                SocketAddrV4::new(p.dst, dst_port),
            ));
        } else if flags == TcpFlags::SYN | TcpFlags::ACK {
            cfg.server_isn = seq;
        }
        if !payload.is_empty() {
            let (c, _) = endpoints.expect("SYN first");
            data.push((SocketAddrV4::new(p.src, src_port) == c, payload));
        }
    }
    let (c, s) = endpoints.unwrap();
    let mut tcp = TcpSession::open_with(PcapWriter::new(Vec::new()).unwrap(), c, s, cfg).unwrap();
    for (from_client, payload) in &data {
        let dir = if *from_client {
            Dir::ClientToServer
        } else {
            Dir::ServerToClient
        };
        tcp.send_segments(dir, &[payload]).unwrap();
    }
    let replay = save_pcap("markers_replay", &tcp.close().unwrap().into_inner());

    let fields = [
        "tcp.srcport",
        "tcp.seq",
        "iwarp_mpa.marker_fpduptr",
        "iwarp_mpa.crc_check",
    ];
    let want = ts.fields(&original, "iwarp_mpa.fpdu", &fields).unwrap();
    let got = ts.fields(&replay, "iwarp_mpa.fpdu", &fields).unwrap();
    assert_eq!(got, want);
    assert_eq!(ts.count_good_crc(&replay).unwrap(), 4);
    assert_eq!(ts.count_bad_crc(&replay).unwrap(), 0);
    assert_clean_transport(&ts, &replay);
}
