//! The tshark driver itself: expert counting, malformed frames, errors,
//! Lua scripts, and the behaviour when tshark is missing.

mod common;

use common::save_pcap;
use softrdma_sim::pcap::{Dir, PcapFile, PcapWriter, UdpFlow};
use softrdma_sim::tshark::{Error, Tshark, SKIP_ENV};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::Command;

fn ep(last: u8, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, last), port)
}

/// Parses the `Errors (N)` header of `-q -z expert,error` (0 when absent).
fn errors_in_report(report: &str) -> usize {
    report
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Errors (")
                .and_then(|r| r.strip_suffix(')'))
                .map(|n| n.parse().unwrap())
        })
        .unwrap_or(0)
}

/// Frame 1: UDP with a corrupted IPv4 header checksum.
/// Frame 2: a 4-octet "DNS message" (too short: Malformed Packet).
/// Frame 3: a clean UDP datagram.
fn capture_with_errors() -> Vec<u8> {
    let mut flow = UdpFlow::new(
        PcapWriter::new(Vec::new()).unwrap(),
        ep(1, 1000),
        ep(2, 2000),
    );
    flow.send(Dir::ClientToServer, b"abcd").unwrap();
    let mut w = flow.into_writer();
    w.write_udp(ep(1, 1000), ep(2, 53), b"abcd").unwrap();
    w.write_udp(ep(2, 2000), ep(1, 1000), b"fine").unwrap();
    let clean = w.into_inner();

    let file = PcapFile::parse(&clean).unwrap();
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    for (n, rec) in file.records.iter().enumerate() {
        let mut data = rec.data.clone();
        if n == 0 {
            data[14 + 10] ^= 0xff; // IPv4 header checksum
        }
        w.write_frame(&data).unwrap();
    }
    w.into_inner()
}

#[test]
fn expert_errors_match_z_expert_and_malformed_count() {
    let Some(ts) = Tshark::for_test("expert_errors_match_z_expert_and_malformed_count") else {
        return;
    };
    let bytes = capture_with_errors();
    let pcap = save_pcap("expert_errors", &bytes);

    // Without checksum validation only the malformed DNS frame is an error.
    assert_eq!(ts.malformed_count(&pcap).unwrap(), 1);
    assert_eq!(ts.expert_errors(&pcap).unwrap(), 1);
    let report = ts.expert_error_report(&pcap).unwrap();
    assert_eq!(errors_in_report(&report), 1, "{report}");
    assert!(report.contains("Malformed"), "{report}");

    // With it, the bad IPv4 checksum is one more.
    let checking = ts.clone().with_checksum_validation();
    assert_eq!(checking.expert_errors(&pcap).unwrap(), 2);
    let report = checking.expert_error_report(&pcap).unwrap();
    assert_eq!(errors_in_report(&report), 2, "{report}");
    assert!(report.contains("Bad checksum"), "{report}");
    assert_eq!(checking.expert_errors(&bytes).unwrap(), 2);

    let rows = checking
        .fields(&pcap, "_ws.malformed", &["frame.number", "udp.dstport"])
        .unwrap();
    assert_eq!(rows, [["2", "53"]]);

    // A clean capture has an empty report.
    let golden = softrdma_sim::iwarp_testdata("handmade-ok.pcap");
    assert_eq!(ts.expert_error_report(&golden).unwrap(), "");
}

#[test]
fn failures_report_stderr() {
    let Some(ts) = Tshark::for_test("failures_report_stderr") else {
        return;
    };
    let golden = softrdma_sim::iwarp_testdata("handmade-ok.pcap");
    let err = ts
        .fields(&golden, "frame.number ==", &["frame.number"])
        .unwrap_err();
    assert!(matches!(err, Error::Failed { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("frame.number =="), "{msg}");
    assert!(msg.contains("stderr:"), "{msg}");

    let missing = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-file.pcap");
    let err = ts.summary(&missing).unwrap_err();
    assert!(err.to_string().contains("no-such-file.pcap"), "{err}");

    let err = ts
        .clone()
        .with_option("no_such.preference", "1")
        .summary(&golden)
        .unwrap_err();
    assert!(err.to_string().contains("no_such.preference"), "{err}");

    // Success is unaffected by whatever tshark prints on stderr (as root:
    // "Running as user root ... This could be dangerous").
    assert!(ts.version().unwrap().starts_with("TShark"));
}

const LUA_SCRIPT: &str = r#"
-- Test dissector: one tag octet; 0xff raises an Error-level expert item.
local port = 50000
for _, a in ipairs({...}) do
  local v = a:match("^port=(%d+)$")
  if v then port = tonumber(v) end
end
local p = Proto("srsimtest", "softrdma-sim Lua test")
local f_tag = ProtoField.uint8("srsimtest.tag", "Tag", base.HEX)
p.fields = { f_tag }
local ef_bad = ProtoExpert.new("srsimtest.bad", "Tag is 0xff",
                               expert.group.CHECKSUM, expert.severity.ERROR)
p.experts = { ef_bad }
function p.dissector(tvb, pinfo, tree)
  pinfo.cols.protocol = "SRSIMTEST"
  local t = tree:add(p, tvb())
  local item = t:add(f_tag, tvb(0, 1))
  if tvb(0, 1):uint() == 0xff then
    item:add_proto_expert_info(ef_bad)
  end
  return tvb:len()
end
DissectorTable.get("udp.port"):add(port, p)
"#;

#[test]
fn lua_script_and_argument() {
    let Some(ts) = Tshark::for_test("lua_script_and_argument") else {
        return;
    };
    let script = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("srsimtest.lua");
    std::fs::write(&script, LUA_SCRIPT).unwrap();

    // Port 50001 is only dissected if the script got its argument (UDP tries
    // the lower port first, so the source port is the higher one).
    let mut flow = UdpFlow::new(
        PcapWriter::new(Vec::new()).unwrap(),
        ep(1, 60000),
        ep(2, 50001),
    );
    flow.send(Dir::ClientToServer, &[0x01, 0x00]).unwrap();
    flow.send(Dir::ClientToServer, &[0xff]).unwrap();
    let bytes = flow.into_writer().into_inner();
    save_pcap("lua_udp", &bytes);

    let plain = ts.clone().with_lua(&script);
    let rows = plain.fields(&bytes, "", &["srsimtest.tag"]).unwrap();
    assert_eq!(rows, [[""], [""]]);

    let ts = ts.with_lua(&script).with_lua_arg("port=50001");
    let rows = ts.fields(&bytes, "", &["srsimtest.tag"]).unwrap();
    assert_eq!(rows, [["0x01"], ["0xff"]]);
    assert_eq!(ts.expert_errors(&bytes).unwrap(), 1);
    assert!(ts.summary(&bytes).unwrap().contains("SRSIMTEST"));
}

/// Runs `probe_for_test` in a child process with an empty PATH.
fn run_probe(skip: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "probe_for_test",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("PATH", "")
    .env_remove(SKIP_ENV);
    if let Some(v) = skip {
        cmd.env(SKIP_ENV, v);
    }
    cmd.output().unwrap()
}

/// Used by `missing_tshark_fails_unless_skip_is_set` (run in a child with
/// no tshark on PATH); passes trivially when tshark is present.
#[test]
fn probe_for_test() {
    if Tshark::for_test("probe_for_test").is_none() {
        println!("probe: returned early");
    }
}

#[test]
fn missing_tshark_fails_unless_skip_is_set() {
    let out = run_probe(None);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("scripts/install-test-deps.sh"), "{text}");

    let out = run_probe(Some("1"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("probe_for_test: SKIPPED"), "{stderr}");

    // Any other value does not skip.
    assert!(!run_probe(Some("0")).status.success());
}
