//! `softrdma perf`: every test over every transport that has it, in
//! loopback mode (two processes), with tiny iteration counts, `--verify`
//! and `--json`; a corrupted byte must fail `--verify`; `perf suite
//! --quick` writes report.md and decodable PNGs; bad arguments exit 2.
//! Correctness only: no figure is compared with anything but its own
//! baseline arithmetic.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value as J;

/// One benchmark at a time: both ends busy-poll, and several runs at
/// once on a 2-core machine only measure the scheduler.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn softrdma(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut c = Command::new(env!("CARGO_BIN_EXE_softrdma"));
    c.args(args);
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().expect("run softrdma")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

type Obj = serde_json::Map<String, J>;

/// A JSON object (what `--json` prints), or None.
fn parse_obj(line: &str) -> Option<Obj> {
    match serde_json::from_str(line.trim()).ok()? {
        J::Object(m) => Some(m),
        _ => None,
    }
}

fn num(m: &Obj, k: &str) -> Option<f64> {
    m.get(k)?.as_f64()
}

fn s<'a>(m: &'a Obj, k: &str) -> Option<&'a str> {
    m.get(k)?.as_str()
}

/// Fields every result row has.
const FIELDS: [&str; 15] = [
    "test",
    "transport",
    "size",
    "iters",
    "lat_us_p50",
    "lat_us_p99",
    "bw_gbps",
    "msg_rate_mps",
    "baseline",
    "ratio",
    "wait",
    "lost",
    "first_msg_us",
    "fpdus_per_msg",
    "dgram_payload",
];

/// Runs one test/transport in loopback and checks its JSON lines.
fn check_cell(test: &str, transport: &str, size: usize) {
    let iters = if test.ends_with("_bw") { "40" } else { "8" };
    let sz = size.to_string();
    let out = softrdma(
        &[
            "perf",
            test,
            "--transport",
            transport,
            "--size",
            &sz,
            "--iters",
            iters,
            "--warmup",
            "2",
            "--verify",
            "--json",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{test} over {transport}: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        text(&out.stderr)
    );
    let objs: Vec<_> = stdout.lines().filter_map(parse_obj).collect();
    assert_eq!(objs.len(), 2, "baseline + result expected: {stdout}");
    let base = &objs[0];
    let r = &objs[1];
    for f in FIELDS {
        assert!(
            r.contains_key(f),
            "{test}/{transport}: no field {f}: {stdout}"
        );
        assert!(base.contains_key(f), "baseline: no field {f}: {stdout}");
    }
    assert_eq!(s(r, "test"), Some(test));
    assert_eq!(s(r, "transport"), Some(transport));
    assert_eq!(num(r, "size"), Some(size as f64));
    assert_eq!(s(r, "wait"), Some("poll"));
    assert_eq!(r.get("verified"), Some(&J::Bool(true)));
    assert_eq!(base.get("verified"), Some(&J::Bool(false)));
    assert_eq!(r.get("error"), Some(&J::Null), "{stdout}");
    assert!(num(r, "iters").unwrap() > 0.0);
    assert!(num(r, "msg_rate_mps").unwrap() > 0.0);
    let lat = test.ends_with("_lat");
    let want_base = match (transport, lat) {
        ("rc", true) => "tcp_lat",
        ("rc", false) => "tcp_bw",
        (_, true) => "udp_lat",
        (_, false) => "udp_bw",
    };
    assert_eq!(s(base, "test"), Some(want_base));
    assert_eq!(s(r, "baseline"), Some(want_base));
    let (value, bvalue) = if lat {
        let p50 = num(r, "lat_us_p50").unwrap();
        let p99 = num(r, "lat_us_p99").unwrap();
        assert!(p50 > 0.0 && p99 >= p50, "{stdout}");
        assert_eq!(r.get("bw_gbps"), Some(&J::Null));
        (p50, num(base, "lat_us_p50").unwrap())
    } else {
        let bw = num(r, "bw_gbps").unwrap();
        assert!(bw > 0.0, "{stdout}");
        (bw, num(base, "bw_gbps").unwrap())
    };
    assert!(bvalue > 0.0);
    assert_eq!(num(r, "baseline_value"), Some(bvalue));
    let ratio = num(r, "ratio").unwrap();
    assert!(
        (ratio - value / bvalue).abs() <= 1e-9 * ratio.abs().max(1.0),
        "ratio {ratio} != {value} / {bvalue}"
    );
    if transport == "rc" {
        assert_eq!(r.get("crc"), Some(&J::Bool(true)));
    }
}

#[test]
fn every_test_over_rc() {
    for t in [
        "send_lat",
        "send_bw",
        "write_lat",
        "write_bw",
        "read_lat",
        "read_bw",
        "atomic_lat",
    ] {
        check_cell(t, "rc", if t == "atomic_lat" { 8 } else { 4096 });
    }
}

#[test]
fn every_test_over_ud() {
    for t in [
        "send_lat",
        "send_bw",
        "write_lat",
        "write_bw",
        "write_record_lat",
        "write_record_bw",
    ] {
        // 4000 octets: three datagrams per message at MTU 1500.
        check_cell(t, "ud", 4000);
    }
}

#[test]
fn every_test_over_rd() {
    for t in [
        "send_lat",
        "send_bw",
        "write_lat",
        "write_bw",
        "read_lat",
        "read_bw",
        "write_record_lat",
        "write_record_bw",
        "atomic_lat",
    ] {
        check_cell(t, "rd", if t == "atomic_lat" { 8 } else { 3000 });
    }
}

#[test]
fn small_and_odd_sizes_verify() {
    check_cell("send_lat", "rc", 1);
    check_cell("write_lat", "rc", 7);
    check_cell("write_bw", "rc", 100);
    check_cell("send_lat", "ud", 9);
}

#[test]
fn no_crc_and_event_mode() {
    let out = softrdma(
        &[
            "perf", "write_bw", "--size", "65536", "--iters", "20", "--no-crc", "--verify",
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = text(&out.stdout)
        .lines()
        .filter_map(parse_obj)
        .find(|m| s(m, "test") == Some("write_bw"))
        .expect("a write_bw result");
    assert_eq!(r.get("crc"), Some(&J::Bool(false)));
    let out = softrdma(
        &[
            "perf", "send_lat", "--wait", "event", "--iters", "10", "--verify", "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let objs: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    assert_eq!(objs.len(), 2);
    for o in &objs {
        assert_eq!(s(o, "wait"), Some("event"));
        assert!(num(o, "lat_us_p50").unwrap() > 0.0);
    }
}

#[test]
fn baselines_alone() {
    for b in ["tcp_lat", "tcp_bw", "udp_lat", "udp_bw"] {
        let out = softrdma(
            &[
                "perf", "baseline", b, "--sizes", "64,5000", "--iters", "20", "--json",
            ],
            &[],
        );
        assert!(out.status.success(), "{b}: {}", text(&out.stderr));
        let objs: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
        assert_eq!(objs.len(), 2, "{b}");
        for (o, size) in objs.iter().zip([64.0, 5000.0]) {
            assert_eq!(s(o, "test"), Some(b));
            assert_eq!(num(o, "size"), Some(size));
            assert_eq!(o.get("error"), Some(&J::Null));
            let v = if b.ends_with("lat") {
                num(o, "lat_us_p50")
            } else {
                num(o, "bw_gbps")
            };
            assert!(v.unwrap() > 0.0);
        }
    }
}

/// A latency floor `name` runs alone as a baseline (200 iterations at
/// 64 B, its note naming what it frames) and, as a test at `sizes`, against
/// `raw` of the same run.
fn latency_floor_alone_and_against(name: &str, raw: &str, sizes: &str, note_has: &str) {
    let out = softrdma(
        &[
            "perf", "baseline", name, "--size", "64", "--iters", "200", "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let objs: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    assert_eq!(objs.len(), 1);
    assert_eq!(s(&objs[0], "test"), Some(name));
    assert_eq!(num(&objs[0], "iters"), Some(200.0));
    assert!(num(&objs[0], "lat_us_p50").unwrap() > 0.0);
    assert!(s(&objs[0], "note").unwrap().contains(note_has));
    let out = softrdma(
        &["perf", name, "--sizes", sizes, "--iters", "200", "--json"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let objs: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    let rows: Vec<_> = objs.iter().filter(|o| s(o, "test") == Some(name)).collect();
    assert_eq!(rows.len(), 2, "{objs:?}");
    for r in rows {
        assert_eq!(s(r, "baseline"), Some(raw));
        assert!(num(r, "ratio").unwrap() > 0.0);
    }
}

/// `tcp_mpa_lat` (the RC latency floor: a raw TCP ping-pong of RC Send
/// FPDUs framed and checked by the wire code) runs alone and against
/// `tcp_lat` of the same run, with a clear error above one FPDU.
#[test]
fn mpa_latency_floor() {
    latency_floor_alone_and_against("tcp_mpa_lat", "tcp_lat", "64,4096", "CRC32C");
    let out = softrdma(
        &[
            "perf",
            "baseline",
            "tcp_mpa_lat",
            "--size",
            "64Ki",
            "--iters",
            "10",
        ],
        &[],
    );
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(all.contains("up to 16384 octets"), "{all}");
}

/// `udp_dgram_lat` (the UD latency floor: a raw UDP ping-pong of UD Send
/// datagrams framed and checked by the wire code) runs alone and against
/// `udp_lat` of the same run, with a clear error above one datagram.
#[test]
fn dgram_latency_floor() {
    latency_floor_alone_and_against("udp_dgram_lat", "udp_lat", "64,1024", "UD Send framing");
    let out = softrdma(
        &[
            "perf",
            "baseline",
            "udp_dgram_lat",
            "--size",
            "4Ki",
            "--iters",
            "10",
        ],
        &[],
    );
    assert!(!out.status.success());
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(all.contains("(one datagram)"), "{all}");
}

/// `tcp_crc_bw` and `udp_crc_bw` (the CRC ceilings), `tcp_mpa_bw` and
/// `tcp_mpa_crc_bw` (the floors of RC Write bandwidth without and with CRC)
/// run alone as baselines, and as
/// tests they are measured against `tcp_bw`/`udp_bw` of the same run.
#[test]
fn crc_ceiling_baselines() {
    for (b, raw, note) in [
        ("tcp_crc_bw", "tcp_bw", "crc32c"),
        ("udp_crc_bw", "udp_bw", "crc32c"),
        ("tcp_mpa_bw", "tcp_bw", "RDMA Write FPDUs without CRC"),
        ("tcp_mpa_crc_bw", "tcp_bw", "RDMA Write FPDUs with CRC32C"),
    ] {
        crc_ceiling(b, raw, note);
    }
}

fn crc_ceiling(b: &str, raw: &str, note: &str) {
    let out = softrdma(
        &[
            "perf", "baseline", b, "--size", "64Ki", "--iters", "50", "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let objs: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    assert_eq!(objs.len(), 1);
    assert_eq!(s(&objs[0], "test"), Some(b));
    assert!(s(&objs[0], "note").unwrap().contains(note), "{b}");
    let out = softrdma(
        &["perf", b, "--size", "64Ki", "--iters", "50", "--json"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let objs: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    assert_eq!(objs.len(), 2, "{raw} + {b} expected");
    assert_eq!(s(&objs[0], "test"), Some(raw));
    let r = &objs[1];
    assert_eq!(s(r, "test"), Some(b));
    assert_eq!(s(r, "baseline"), Some(raw));
    let (bw, base) = (
        num(r, "bw_gbps").unwrap(),
        num(&objs[0], "bw_gbps").unwrap(),
    );
    assert!(bw > 0.0 && base > 0.0);
    assert_eq!(num(r, "baseline_value"), Some(base));
    let ratio = num(r, "ratio").unwrap();
    assert!((ratio - bw / base).abs() < 1e-9 * ratio.max(1.0));
    // A baseline takes no transport.
    let out = softrdma(&["perf", b, "--transport", "rc"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

/// `perf udp_lat` measures the raw UDP ping-pong against the raw TCP one of
/// the same run (the floor of the UD/RC latency target), each over its own
/// socket; `perf baseline udp_lat` still runs it alone.
#[test]
fn udp_lat_against_tcp_lat() {
    let out = softrdma(
        &[
            "perf", "udp_lat", "--size", "64", "--iters", "200", "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let objs: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    assert_eq!(objs.len(), 2, "tcp_lat + udp_lat expected");
    let (base, r) = (&objs[0], &objs[1]);
    assert_eq!(
        (s(base, "test"), s(base, "transport")),
        (Some("tcp_lat"), Some("tcp"))
    );
    assert_eq!(
        (s(r, "test"), s(r, "transport")),
        (Some("udp_lat"), Some("udp"))
    );
    assert_eq!(s(r, "baseline"), Some("tcp_lat"));
    let (lat, blat) = (
        num(r, "lat_us_p50").unwrap(),
        num(base, "lat_us_p50").unwrap(),
    );
    assert!(lat > 0.0 && blat > 0.0);
    assert_eq!(num(r, "baseline_value"), Some(blat));
    let ratio = num(r, "ratio").unwrap();
    assert!((ratio - lat / blat).abs() < 1e-9 * ratio.max(1.0));
    let out = softrdma(
        &[
            "perf", "baseline", "udp_lat", "--size", "64", "--iters", "100", "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let objs: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    assert_eq!(objs.len(), 1, "alone");
    assert_eq!(s(&objs[0], "test"), Some("udp_lat"));
    assert_eq!(s(&objs[0], "baseline"), None);
}

#[test]
fn verify_catches_a_flipped_byte() {
    for (t, tr) in [
        ("send_lat", "rc"),
        ("write_bw", "rc"),
        ("read_lat", "rd"),
        ("send_bw", "ud"),
    ] {
        let out = softrdma(
            &[
                "perf",
                t,
                "--transport",
                tr,
                "--size",
                "256",
                "--iters",
                "5",
                "--verify",
                "--json",
                "--no-baseline",
            ],
            &[("SOFTRDMA_PERF_CORRUPT", "1")],
        );
        assert_eq!(out.status.code(), Some(1), "{t}/{tr} must fail");
        let stdout = text(&out.stdout);
        let r = stdout
            .lines()
            .filter_map(parse_obj)
            .find(|m| s(m, "test") == Some(t))
            .expect("a result line");
        let err = s(&r, "error").unwrap_or_default().to_string();
        assert!(err.contains("verify"), "{t}/{tr}: error {err:?}");
        // Without --verify the same hook changes nothing.
        let out = softrdma(
            &[
                "perf",
                t,
                "--transport",
                tr,
                "--size",
                "256",
                "--iters",
                "5",
                "--json",
                "--no-baseline",
            ],
            &[("SOFTRDMA_PERF_CORRUPT", "1")],
        );
        assert!(out.status.success(), "{t}/{tr}: {}", text(&out.stderr));
    }
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        vec!["perf", "nosuch_test"],
        vec!["perf"],
        vec!["perf", "read_lat", "--transport", "ud"],
        vec!["perf", "atomic_lat", "--transport", "ud"],
        vec!["perf", "write_record_bw", "--transport", "rc"],
        vec!["perf", "send_lat", "--transport", "xx"],
        vec!["perf", "send_lat", "--iters", "0"],
        vec!["perf", "send_lat", "--iters", "5", "--duration", "1"],
        vec!["perf", "send_lat", "--size", "lots"],
        vec!["perf", "send_lat", "--size", "99999999999"],
        vec!["perf", "send_lat", "--server", "--connect", "x"],
        vec!["perf", "write_lat", "--wait", "event"],
        vec!["perf", "send_lat", "--wait", "sometimes"],
        vec!["perf", "send_lat", "--bogus"],
        vec!["perf", "send_lat", "--size"],
        vec!["perf", "baseline", "nosuch"],
        vec!["perf", "baseline", "tcp_lat", "--transport", "rc"],
        vec!["perf", "suite", "--bogus"],
    ] {
        let out = softrdma(&args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains("softrdma perf"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// Decodes a PNG fully (any colour type, as 8-bit RGB); returns (w, h,
/// pixels).
fn decode_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut dec = png::Decoder::new(std::io::BufReader::new(f));
    dec.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = dec.read_info().expect("PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("PNG data");
    buf.truncate(info.buffer_size());
    let px = match info.color_type {
        png::ColorType::Rgb => buf,
        png::ColorType::Rgba => buf.chunks(4).flat_map(|c| [c[0], c[1], c[2]]).collect(),
        png::ColorType::Grayscale => buf.iter().flat_map(|&g| [g, g, g]).collect(),
        png::ColorType::GrayscaleAlpha => buf.chunks(2).flat_map(|c| [c[0]; 3]).collect(),
        other => panic!("colour type {other:?} after expansion"),
    };
    assert_eq!(px.len(), 3 * (info.width * info.height) as usize);
    (info.width, info.height, px)
}

/// `perf suite --quick --budget BUDGET` into a fresh folder named after
/// `name` and this process; the folder and what the suite did.
fn quick_suite(name: &str, budget: &str) -> (std::path::PathBuf, Output) {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = softrdma(
        &[
            "perf",
            "suite",
            "--quick",
            "--budget",
            budget,
            "--out",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    (dir, out)
}

/// A budget too short for the matrix: the groups that would start after
/// it are skipped, their rows say why, the last line counts them as
/// skipped (not as failed cells), the report is still written and the
/// exit code is 1 (the table is incomplete).
#[test]
fn suite_out_of_budget_says_what_it_skipped() {
    let (dir, out) = quick_suite("softrdma-perf-budget", "1");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("skipped: the suite's time budget was used up"),
        "{stdout}"
    );
    let last = stderr.lines().last().unwrap_or("");
    assert!(
        last.contains("cells skipped: the time budget was used up"),
        "last line: {last}\n{stderr}"
    );
    assert!(dir.join("report.md").exists(), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quick_suite_writes_report_and_pngs() {
    let (dir, out) = quick_suite("softrdma-perf-suite", "600");
    let stdout = text(&out.stdout);
    let code = out.status.code();
    // A cell may fail on a machine under load (the suite then says so and
    // exits 1); the report and plots must be there either way.
    assert!(
        code == Some(0) || (code == Some(1) && stdout.contains("ERROR:")),
        "exit {code:?}\n{stdout}\n{}",
        text(&out.stderr)
    );
    for tr in ["rc", "ud", "rd"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(tr) && !l.contains("ERROR")),
            "no working {tr} cell:\n{stdout}"
        );
    }
    assert!(stdout.contains("targets (same-run ratios):"), "{stdout}");
    // The reference rows, each against its raw baseline.
    for (row, raw, what) in [
        ("tcp_crc_bw", "tcp_bw", "CRC ceiling"),
        ("udp_crc_bw", "udp_bw", "datagram ceiling"),
        ("tcp_mpa_lat", "tcp_lat", "RC latency floor"),
        ("udp_dgram_lat", "udp_lat", "UD latency floor"),
        ("tcp_mpa_bw", "tcp_bw", "RC no-CRC bandwidth floor"),
        ("tcp_mpa_crc_bw", "tcp_bw", "RC CRC bandwidth floor"),
        ("udp_lat", "tcp_lat", "UD/RC latency floor"),
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(row) && l.contains(raw)),
            "no {what} row:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("floor: raw TCP stream as RC Writes, no CRC"),
        "{stdout}"
    );
    assert!(
        stdout.contains("floor: raw TCP stream as RC Writes with CRC"),
        "{stdout}"
    );
    assert!(
        stdout.contains("floor: raw TCP ping-pong framed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("floor: raw UDP ping-pong framed as UD Sends"),
        "{stdout}"
    );
    assert!(
        stdout.contains("floor: raw UDP / raw TCP ping-pong, alternated"),
        "{stdout}"
    );
    // UD against RC, alternated in one child: its table and a figure (or,
    // on a machine under load, a failed row that says why).
    let h2h: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("head to head:"))
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(!h2h.is_empty(), "no head-to-head table:\n{stdout}");
    let measured = h2h
        .iter()
        .any(|l| l.starts_with("send_lat") && l.contains("send_lat/rc"));
    assert!(
        measured || (code == Some(1) && h2h.iter().any(|l| l.contains("ERROR:"))),
        "no head-to-head row:\n{stdout}"
    );
    let alternated = stdout
        .lines()
        .find(|l| l.contains("RC 64 B send_lat, alternated"))
        .unwrap_or_else(|| panic!("no alternated UD/RC target line:\n{stdout}"));
    assert_eq!(
        alternated
            .split_whitespace()
            .any(|w| w.parse::<f64>().is_ok_and(|x| x > 0.0)),
        measured,
        "{alternated}"
    );
    assert!(
        stdout
            .lines()
            .next()
            .is_some_and(|l| l.contains("CPU steal during the run")),
        "{stdout}"
    );
    // The targets as numbers: every line a name, a kind, and a ratio
    // that is a number (or null for a missing cell); targets have limits.
    let tj = std::fs::read_to_string(dir.join("targets.json")).expect("targets.json");
    let tj: J = serde_json::from_str(&tj).expect("targets.json is JSON");
    let lines = tj.as_array().expect("an array");
    assert!(lines.iter().any(|l| l["kind"] == "target"), "{tj}");
    for l in lines {
        assert!(l["name"].is_string(), "{l}");
        assert!(l["ratio"].is_number() || l["ratio"].is_null(), "{l}");
        if l["kind"] == "target" {
            assert!(l["limit"].is_number(), "{l}");
        }
    }
    let md = std::fs::read_to_string(dir.join("report.md")).expect("report.md");
    for want in [
        "nproc",
        "kernel",
        "CPU steal during the run",
        "wait mode",
        "How to read it",
        "Head to head",
        "send_lat",
        "ratio",
    ] {
        assert!(md.contains(want), "report.md lacks {want:?}");
    }
    let mut pngs = 0;
    for tr in ["rc", "ud", "rd"] {
        for kind in ["latency", "bandwidth"] {
            let p = dir.join(format!("{kind}_{tr}.png"));
            let (w, h, px) = decode_png(&p);
            assert_eq!((w, h), (1000, 600));
            // Not blank: some dark (text/axes) and some coloured pixels.
            assert!(px.chunks(3).any(|c| c.iter().all(|&v| v < 80)));
            assert!(px.chunks(3).any(|c| c.iter().max() != c.iter().min()));
            assert!(md.contains(&format!("{kind}_{tr}.png")));
            pngs += 1;
        }
    }
    assert_eq!(pngs, 6);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rounds_alternate_and_merge() {
    // 3 rounds of 4 round trips (ceil(10 / 3)) each for the baseline and
    // for the test: 12 measured iterations each, one histogram.
    let out = softrdma(
        &[
            "perf", "send_lat", "--iters", "10", "--rounds", "3", "--verify", "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let objs: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    assert_eq!(objs.len(), 2);
    for o in &objs {
        assert_eq!(num(o, "iters"), Some(12.0), "{o:?}");
    }
    let out = softrdma(&["perf", "send_lat", "--rounds", "0"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

/// `--versus`: the same test over two transports, alternated round by
/// round; the reference row is the other transport's, the ratio is the
/// quotient of their p50s; nonsense combinations are usage errors.
#[test]
fn versus_alternates_two_transports() {
    let out = softrdma(
        &[
            "perf",
            "send_lat",
            "--transport",
            "ud",
            "--versus",
            "rc",
            "--iters",
            "200",
            "--rounds",
            "2",
            "--verify",
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let objs: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    assert_eq!(objs.len(), 2, "{objs:?}");
    let rc = &objs[0];
    let ud = &objs[1];
    assert_eq!(
        (s(rc, "test"), s(rc, "transport")),
        (Some("send_lat"), Some("rc"))
    );
    assert_eq!(rc.get("baseline"), Some(&J::Null));
    assert_eq!(
        (s(ud, "test"), s(ud, "transport")),
        (Some("send_lat"), Some("ud"))
    );
    assert_eq!(s(ud, "baseline"), Some("send_lat/rc"));
    for o in &objs {
        assert_eq!(num(o, "iters"), Some(200.0), "{o:?}");
    }
    let (u, r) = (
        num(ud, "lat_us_p50").unwrap(),
        num(rc, "lat_us_p50").unwrap(),
    );
    let ratio = num(ud, "ratio").unwrap();
    assert!(
        (ratio - u / r).abs() < 1e-6 * ratio.max(1.0),
        "{ratio} vs {u}/{r}"
    );
    for bad in [
        &["perf", "send_lat", "--transport", "ud", "--versus", "ud"][..],
        &["perf", "read_lat", "--transport", "rc", "--versus", "ud"],
        &["perf", "tcp_lat", "--versus", "rc"],
        &["perf", "send_lat", "--versus", "xyz"],
        &["perf", "send_lat", "--versus", "ud", "--no-baseline"],
    ] {
        let out = softrdma(bad, &[]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(
            text(&out.stderr).contains("--versus"),
            "{bad:?}: {}",
            text(&out.stderr)
        );
    }
}

/// `--tcp-cc`: the header names the run's TCP congestion control
/// (default cubic when the kernel allows it, `system` keeps the host's,
/// `SOFTRDMA_TCP_CONGESTION` is taken when no option is given); an
/// algorithm the kernel refuses, or the option without a value, is a usage
/// error that says what is allowed.
#[test]
fn tcp_congestion_control_is_named_and_checked() {
    let run = |args: &[&str], env: Option<&str>| {
        let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let mut c = Command::new(env!("CARGO_BIN_EXE_softrdma"));
        c.args(args)
            .env_remove("SOFTRDMA_TCP_CONGESTION")
            .env_remove("SOFTRDMA_PERF_TCP_CC");
        if let Some(cc) = env {
            c.env("SOFTRDMA_TCP_CONGESTION", cc);
        }
        c.output().expect("run softrdma")
    };
    let sysctl = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let system = sysctl("tcp_congestion_control");
    let allowed = sysctl("tcp_allowed_congestion_control");
    let header = |out: &Output| {
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        stdout
            .lines()
            .find(|l| l.starts_with("softrdma perf "))
            .unwrap_or_else(|| panic!("no header in {stdout}"))
            .to_string()
    };
    let tcp_bw = [
        "perf", "baseline", "tcp_bw", "--size", "4Ki", "--iters", "50",
    ];

    let h = header(&run(&[&tcp_bw[..], &["--tcp-cc", "reno"]].concat(), None));
    assert!(h.contains("TCP congestion control reno"), "{h}");

    // The kernel lets a process set an algorithm in the allowed list, and
    // root (CAP_NET_ADMIN) any loaded one: a kernel built with bbr as its
    // default may leave cubic loaded but out of the allowed list.
    let available = sysctl("tcp_available_congestion_control");
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false);
    let has = |list: &str| list.split_whitespace().any(|a| a == "cubic");
    let default = if has(&allowed) || (root && has(&available)) {
        "cubic"
    } else {
        system.as_str()
    };
    let h = header(&run(&tcp_bw, None));
    assert!(
        h.contains(&format!("TCP congestion control {default} (")),
        "{h}"
    );

    let h = header(&run(
        &[
            "perf", "write_bw", "--size", "4Ki", "--iters", "50", "--tcp-cc", "system",
        ],
        None,
    ));
    assert!(
        h.contains(&format!(
            "TCP congestion control {system} (the system default)"
        )),
        "{h}"
    );

    let h = header(&run(&tcp_bw, Some("reno")));
    assert!(h.contains("TCP congestion control reno"), "{h}");

    for args in [
        &[&tcp_bw[..], &["--tcp-cc", "no_such_cc"]].concat(),
        &[&tcp_bw[..], &["--tcp-cc"]].concat(),
        &[&tcp_bw[..], &["--tcp-cc", "reno", "--tcp-cc", "cubic"]].concat(),
    ] {
        let out = run(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains("--tcp-cc"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let err = text(&run(&[&tcp_bw[..], &["--tcp-cc", "no_such_cc"]].concat(), None).stderr);
    assert!(err.contains("allowed to this process"), "{err}");
    assert!(
        err.contains("loaded (any of them with CAP_NET_ADMIN)"),
        "{err}"
    );
    // From the environment: named as the variable; usage still answers.
    let out = run(&tcp_bw, Some("no_such_cc"));
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("SOFTRDMA_TCP_CONGESTION=no_such_cc"), "{err}");
    for cmd in ["loss", "scale"] {
        let out = run(&["perf", cmd, "--help"], Some("no_such_cc"));
        assert!(out.status.success(), "{cmd} --help: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("--tcp-cc"),
            "{cmd} usage names --tcp-cc"
        );
    }

    // JSON rows over TCP carry it; a datagram row has none.
    let out = run(
        &[
            "perf", "write_bw", "--size", "4Ki", "--iters", "50", "--json", "--tcp-cc", "reno",
        ],
        None,
    );
    let rows: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    assert_eq!(rows.len(), 2, "tcp_bw and write_bw: {}", text(&out.stdout));
    for r in &rows {
        assert_eq!(s(r, "tcp_cc"), Some("reno"), "{r:?}");
    }
    let out = run(
        &[
            "perf",
            "send_lat",
            "--transport",
            "ud",
            "--iters",
            "50",
            "--json",
        ],
        None,
    );
    let rows: Vec<_> = text(&out.stdout).lines().filter_map(parse_obj).collect();
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(r.get("tcp_cc"), Some(&J::Null), "{r:?}");
    }
}
