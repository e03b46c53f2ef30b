//! The tshark driver against the shared golden captures
//! (testdata/iwarp/ of the repository).

mod common;

use softrdma_sim::iwarp_testdata;
use softrdma_sim::tshark::Tshark;

#[test]
fn handmade_ok_has_12_good_crcs() {
    let Some(ts) = Tshark::for_test("handmade_ok_has_12_good_crcs") else {
        return;
    };
    let pcap = iwarp_testdata("handmade-ok.pcap");
    assert_eq!(ts.count_good_crc(&pcap).unwrap(), 12);
    assert_eq!(ts.count_bad_crc(&pcap).unwrap(), 0);
    assert_eq!(ts.malformed_count(&pcap).unwrap(), 0);
    assert_eq!(ts.expert_errors(&pcap).unwrap(), 0);

    // The PDML-based verdicts agree with the text of `-V`.
    let verbose = ts.verbose(&pcap).unwrap();
    assert_eq!(verbose.matches("Good CRC32").count(), 12);
    assert_eq!(verbose.matches("Bad CRC32").count(), 0);

    // Same answer when the capture is piped in from memory.
    let bytes = std::fs::read(&pcap).unwrap();
    assert_eq!(ts.count_good_crc(&bytes).unwrap(), 12);

    // Two FPDUs in frame 13: one TCP segment can carry several.
    let rows = ts
        .fields(
            &pcap,
            "iwarp_mpa.fpdu",
            &["frame.number", "iwarp_rdma.opcode", "iwarp_mpa.ulpdulength"],
        )
        .unwrap();
    assert_eq!(rows.len(), 11, "{rows:?}");
    let frame13 = rows.iter().find(|r| r[0] == "13").expect("frame 13");
    assert_eq!(frame13[1], "0x05|0x00");
    assert_eq!(frame13[2], "21|14");
}

#[test]
fn handmade_bad_crc_has_exactly_one_bad_crc() {
    let Some(ts) = Tshark::for_test("handmade_bad_crc_has_exactly_one_bad_crc") else {
        return;
    };
    let pcap = iwarp_testdata("handmade-bad-crc.pcap");
    let checks = ts.crc_checks(&pcap).unwrap();
    let bad: Vec<_> = checks.iter().filter(|c| !c.good).collect();
    assert_eq!(bad.len(), 1, "{checks:#?}");
    assert_eq!(bad[0].frame, 6);
    assert_eq!(bad[0].value, "0xc32706ee");
    assert!(
        bad[0].label.contains("should be 0xa61fd4de"),
        "{}",
        bad[0].label
    );
    assert_eq!(ts.count_bad_crc(&pcap).unwrap(), 1);
    assert_eq!(ts.count_good_crc(&pcap).unwrap(), 11);
    // A bad MPA CRC raises no expert item: the verdict is in the CRC field.
    assert_eq!(ts.expert_errors(&pcap).unwrap(), 0);
}

#[test]
fn handmade_markers_decode_with_good_crcs() {
    let Some(ts) = Tshark::for_test("handmade_markers_decode_with_good_crcs") else {
        return;
    };
    let pcap = iwarp_testdata("handmade-markers.pcap");
    let checks = ts.crc_checks(&pcap).unwrap();
    assert_eq!(checks.len(), 4, "{checks:#?}");
    assert!(checks.iter().all(|c| c.good), "{checks:#?}");
    assert_eq!(ts.malformed_count(&pcap).unwrap(), 0);

    let rows = ts
        .fields(
            &pcap,
            "iwarp_mpa.marker_fpduptr",
            &[
                "frame.number",
                "tcp.srcport",
                "tcp.seq",
                "tcp.len",
                "iwarp_mpa.marker_fpduptr",
            ],
        )
        .unwrap();
    println!("handmade-markers.pcap: frame, src port, rel seq, len, FPDU back pointers");
    for r in &rows {
        println!("  {}", r.join("  "));
    }
    let pointers: Vec<&str> = rows.iter().map(|r| r[4].as_str()).collect();
    assert_eq!(pointers, ["0|508", "0|508", "252"]);

    let flags = ts
        .fields(
            &pcap,
            "iwarp_mpa.req || iwarp_mpa.rep",
            &["iwarp_mpa.marker_flag"],
        )
        .unwrap();
    assert_eq!(flags, [["1"], ["1"]]);
}

fn check_siw_capture(test: &str, file: &str, crc: bool) {
    let Some(ts) = Tshark::for_test(test) else {
        return;
    };
    let pcap = iwarp_testdata(file);
    let rows = ts
        .fields(
            &pcap,
            "iwarp_mpa.req || iwarp_mpa.rep",
            &[
                "frame.number",
                "iwarp_mpa.key.req",
                "iwarp_mpa.key.rep",
                "iwarp_mpa.crc_flag",
                "iwarp_mpa.rev",
                "iwarp_mpa.pdlength",
            ],
        )
        .unwrap();
    let crc_flag = if crc { "1" } else { "0" };
    assert_eq!(
        rows,
        [
            [
                "4",
                "4d504120494420526571204672616d65",
                "",
                crc_flag,
                "2",
                "4"
            ],
            [
                "6",
                "",
                "4d504120494420526570204672616d65",
                crc_flag,
                "2",
                "4"
            ],
        ],
        "{file}: MPA Request in frame 4, Reply in frame 6"
    );
    let summary = ts.summary(&pcap).unwrap();
    assert!(summary.contains("MPA Request Frame"), "{summary}");
    assert!(summary.contains("MPA Reply Frame"), "{summary}");
    let fpdus = ts
        .fields(&pcap, "iwarp_mpa.fpdu", &["frame.number"])
        .unwrap();
    assert!(fpdus.len() > 20, "{file}: only {} FPDU frames", fpdus.len());
    assert_eq!(ts.malformed_count(&pcap).unwrap(), 0);
    assert_eq!(ts.expert_errors(&pcap).unwrap(), 0);
    assert_eq!(ts.count_bad_crc(&pcap).unwrap(), 0);
    let good = ts.count_good_crc(&pcap).unwrap();
    if crc {
        assert!(good >= fpdus.len(), "{file}: {good} good CRCs");
    } else {
        assert_eq!(good, 0, "{file}: CRC was not negotiated");
    }
}

#[test]
fn siw_default_decodes_mpa_request_and_reply() {
    check_siw_capture(
        "siw_default_decodes_mpa_request_and_reply",
        "siw-rping-default.pcap",
        false,
    );
}

#[test]
fn siw_crc_p2p_decodes_mpa_request_and_reply() {
    check_siw_capture(
        "siw_crc_p2p_decodes_mpa_request_and_reply",
        "siw-rping-crc-p2p.pcap",
        true,
    );
}

/// The hex copied into tests/common matches golden.txt byte for byte.
#[test]
fn copied_golden_vectors_match_golden_txt() {
    let text = std::fs::read_to_string(iwarp_testdata("golden.txt")).unwrap();
    let mut from_file: Vec<Vec<u8>> = Vec::new();
    for line in text.lines() {
        if line.starts_with(char::is_whitespace) {
            from_file
                .last_mut()
                .expect("hex before any title")
                .extend(common::hex(line));
        } else if !line.trim().is_empty() {
            from_file.push(Vec::new());
        }
    }
    let copied = common::golden_vectors();
    assert_eq!(from_file.len(), copied.len());
    for ((name, bytes, len), file_bytes) in copied.iter().zip(&from_file) {
        assert_eq!(bytes.len(), *len, "{name}");
        assert_eq!(bytes, file_bytes, "{name}");
    }
}
