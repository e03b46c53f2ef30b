//! `softrdma perf --transport dc` (issue 7): every test DC has, in
//! loopback (two processes), tiny iteration counts, `--verify --json`;
//! the JSON fields are sane and the note carries the first-message
//! latency apart from the steady-state figure. Write-Record over DC is
//! refused (exit 2). Correctness only: no timing is compared with
//! anything.

use std::collections::BTreeMap;
use std::process::{Command, Output};

/// One benchmark at a time (both ends busy-poll).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn softrdma(args: &[&str]) -> Output {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .output()
        .expect("run softrdma")
}

#[derive(Debug, Clone, PartialEq)]
enum V {
    S(String),
    N(f64),
    B(bool),
    Null,
}

/// Parses one flat JSON object of scalars (what `--json` prints).
fn parse(line: &str) -> Option<BTreeMap<String, V>> {
    let c: Vec<char> = line.trim().chars().collect();
    let mut i = 0usize;
    let skip = |i: &mut usize| {
        while c.get(*i).is_some_and(|x| x.is_whitespace()) {
            *i += 1;
        }
    };
    let text = |i: &mut usize| -> Option<String> {
        (c.get(*i) == Some(&'"')).then_some(())?;
        *i += 1;
        let mut s = String::new();
        loop {
            match *c.get(*i)? {
                '"' => {
                    *i += 1;
                    return Some(s);
                }
                '\\' => {
                    let e = *c.get(*i + 1)?;
                    *i += 2;
                    match e {
                        'n' => s.push('\n'),
                        't' => s.push('\t'),
                        'u' => {
                            let h: String = c.get(*i..*i + 4)?.iter().collect();
                            s.push(char::from_u32(u32::from_str_radix(&h, 16).ok()?)?);
                            *i += 4;
                        }
                        x => s.push(x),
                    }
                }
                x => {
                    s.push(x);
                    *i += 1;
                }
            }
        }
    };
    let mut m = BTreeMap::new();
    skip(&mut i);
    (c.get(i) == Some(&'{')).then_some(())?;
    i += 1;
    loop {
        skip(&mut i);
        if c.get(i) == Some(&'}') {
            return Some(m);
        }
        let k = text(&mut i)?;
        skip(&mut i);
        (c.get(i) == Some(&':')).then_some(())?;
        i += 1;
        skip(&mut i);
        let v = match *c.get(i)? {
            '"' => V::S(text(&mut i)?),
            't' if c[i..].starts_with(&['t', 'r', 'u', 'e']) => {
                i += 4;
                V::B(true)
            }
            'f' if c[i..].starts_with(&['f', 'a', 'l', 's', 'e']) => {
                i += 5;
                V::B(false)
            }
            'n' if c[i..].starts_with(&['n', 'u', 'l', 'l']) => {
                i += 4;
                V::Null
            }
            _ => {
                let st = i;
                while c
                    .get(i)
                    .is_some_and(|x| x.is_ascii_digit() || "+-.eE".contains(*x))
                {
                    i += 1;
                }
                V::N(c[st..i].iter().collect::<String>().parse().ok()?)
            }
        };
        m.insert(k, v);
        skip(&mut i);
        match c.get(i)? {
            ',' => i += 1,
            '}' => return Some(m),
            _ => return None,
        }
    }
}

fn num(m: &BTreeMap<String, V>, k: &str) -> Option<f64> {
    match m.get(k) {
        Some(V::N(x)) => Some(*x),
        _ => None,
    }
}

fn s<'a>(m: &'a BTreeMap<String, V>, k: &str) -> Option<&'a str> {
    match m.get(k) {
        Some(V::S(x)) => Some(x),
        _ => None,
    }
}

/// The first-message latency in a DC note, µs.
fn first_msg(note: &str) -> Option<f64> {
    note.split_whitespace()
        .find_map(|w| w.strip_prefix("first_msg_us="))?
        .parse()
        .ok()
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
    assert_eq!(r.get("verified"), Some(&V::B(true)), "{stdout}");
    assert_eq!(r.get("error"), Some(&V::Null), "{stdout}");
    assert!(num(r, "iters").unwrap_or(0.0) > 0.0, "{stdout}");
    assert!(num(r, "msg_rate_mps").unwrap_or(0.0) > 0.0, "{stdout}");
    let value = if bw {
        assert_eq!(r.get("lat_us_p50"), Some(&V::Null), "{stdout}");
        num(r, "bw_gbps").expect("bw_gbps")
    } else {
        let p50 = num(r, "lat_us_p50").expect("lat_us_p50");
        let p99 = num(r, "lat_us_p99").expect("lat_us_p99");
        assert!(p99 >= p50, "{stdout}");
        assert_eq!(r.get("bw_gbps"), Some(&V::Null), "{stdout}");
        p50
    };
    assert!(value > 0.0, "{stdout}");
    let bvalue = num(r, "baseline_value").expect("baseline_value");
    let ratio = num(r, "ratio").expect("ratio");
    assert!(
        (ratio - value / bvalue).abs() <= 1e-9 * ratio.abs().max(1.0),
        "ratio {ratio} != {value} / {bvalue}"
    );
    // First-message latency apart from the steady-state figure: present,
    // positive, finite, and below the invitation timeout plus slack.
    let note = s(r, "note").expect("note");
    let first = first_msg(note).unwrap_or_else(|| panic!("no first_msg_us in {note:?}"));
    assert!(first > 0.0 && first < 10e6, "first message {first} us");
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
