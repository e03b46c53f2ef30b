//! `softrdma perf --transport dc`: every test DC has, in loopback (two
//! processes), tiny iteration counts, `--verify --json`; the JSON fields
//! are sane and `first_msg_us` carries the first-message latency, as a
//! number, apart from the steady-state figure. Write-Record over DC is
//! refused (exit 2). Correctness only: no timing is compared with
//! anything.

use std::process::{Command, Output};

use serde_json::Value;

/// One benchmark at a time (both ends busy-poll).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn softrdma(args: &[&str]) -> Output {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .output()
        .expect("run softrdma")
}

type Obj = serde_json::Map<String, Value>;

/// One JSON object (what `--json` prints), or None.
fn parse(line: &str) -> Option<Obj> {
    match serde_json::from_str(line.trim()).ok()? {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

fn num(m: &Obj, k: &str) -> Option<f64> {
    m.get(k)?.as_f64()
}

fn s<'a>(m: &'a Obj, k: &str) -> Option<&'a str> {
    m.get(k)?.as_str()
}

fn check(test: &str, size: usize) {
    let bw = test.ends_with("_bw");
    let sz = size.to_string();
    let out = softrdma(&[
        "perf",
        test,
        "--transport",
        "dc",
        "--size",
        &sz,
        "--iters",
        if bw { "40" } else { "8" },
        "--warmup",
        "2",
        "--verify",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{test} over dc: {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    let objs: Vec<_> = stdout.lines().filter_map(parse).collect();
    assert_eq!(objs.len(), 2, "baseline and result expected: {stdout}");
    let (base, r) = (&objs[0], &objs[1]);
    // DC runs over TCP connections: compared with raw TCP.
    let want_base = if bw { "tcp_bw" } else { "tcp_lat" };
    assert_eq!(s(base, "test"), Some(want_base), "{stdout}");
    assert_eq!(s(r, "baseline"), Some(want_base), "{stdout}");
    assert_eq!(s(r, "test"), Some(test));
    assert_eq!(s(r, "transport"), Some("dc"));
    assert_eq!(num(r, "size"), Some(size as f64));
    assert_eq!(r.get("verified"), Some(&Value::Bool(true)), "{stdout}");
    assert_eq!(r.get("error"), Some(&Value::Null), "{stdout}");
    assert!(num(r, "iters").unwrap_or(0.0) > 0.0, "{stdout}");
    assert!(num(r, "msg_rate_mps").unwrap_or(0.0) > 0.0, "{stdout}");
    let value = if bw {
        assert_eq!(r.get("lat_us_p50"), Some(&Value::Null), "{stdout}");
        num(r, "bw_gbps").expect("bw_gbps")
    } else {
        let p50 = num(r, "lat_us_p50").expect("lat_us_p50");
        let p99 = num(r, "lat_us_p99").expect("lat_us_p99");
        assert!(p99 >= p50, "{stdout}");
        assert_eq!(r.get("bw_gbps"), Some(&Value::Null), "{stdout}");
        p50
    };
    assert!(value > 0.0, "{stdout}");
    let bvalue = num(r, "baseline_value").expect("baseline_value");
    let ratio = num(r, "ratio").expect("ratio");
    assert!(
        (ratio - value / bvalue).abs() <= 1e-9 * ratio.abs().max(1.0),
        "ratio {ratio} != {value} / {bvalue}"
    );
    // First-message latency apart from the steady-state figure: a JSON
    // number of its own, positive, finite, and below the invitation
    // timeout plus slack; the note says what it measured.
    let first = r
        .get("first_msg_us")
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("first_msg_us is not a number: {stdout}"));
    assert!(r["first_msg_us"].is_number(), "{stdout}");
    assert!(first > 0.0 && first < 10e6, "first message {first} us");
    assert!(
        s(r, "note").is_some_and(|n| n.contains("first_msg_us")),
        "{stdout}"
    );
    // The raw TCP baseline row has no such figure.
    assert_eq!(base.get("first_msg_us"), Some(&Value::Null), "{stdout}");
}

#[test]
fn latency_tests_over_dc() {
    check("send_lat", 64);
    check("write_lat", 100);
    check("read_lat", 4096);
    check("atomic_lat", 8);
}

#[test]
fn bandwidth_tests_over_dc() {
    check("send_bw", 3000);
    check("write_bw", 65536);
    check("read_bw", 1000);
}

#[test]
fn write_record_over_dc_is_refused() {
    let out = softrdma(&["perf", "write_record_lat", "--transport", "dc"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Write-Record"), "{err}");
}
