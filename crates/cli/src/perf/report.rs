//! Results of benchmark cells and how they are shown: one [`PerfResult`]
//! per (test, transport, size), printed as an aligned text table
//! ([`format_table`]) or as JSON lines ([`PerfResult::to_json`], parsed
//! back by [`PerfResult::from_json`] when the suite collects the output
//! of its child processes).
//!
//! Ratios: latency ratio = softrdma p50 / baseline p50 (lower is better),
//! bandwidth ratio = softrdma Gbit/s / baseline Gbit/s (higher is better);
//! the baseline is the raw-socket test of the same size measured in the
//! same run ([`PerfResult::set_baseline`]).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::hist::Histogram;

/// One measured cell (or a failed one: `error` set). Its JSON form (field
/// names as here, in this order) is what `--json` prints and the suite
/// reads back from its children.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct PerfResult {
    /// Test name (`send_lat`, `tcp_bw`, `fi_pingpong`, …).
    pub test: String,
    /// Transport (`rc`, `ud`, `rd`, `tcp`, `udp`, or a peer's provider).
    pub transport: String,
    /// Message size, octets.
    pub size: u64,
    /// Measured iterations (round trips or messages).
    #[serde(default)]
    pub iters: u64,
    /// One-way latency, median, µs (latency tests).
    pub lat_us_p50: Option<f64>,
    /// One-way latency, 99th percentile, µs.
    pub lat_us_p99: Option<f64>,
    /// One-way latency, mean, µs.
    pub lat_us_mean: Option<f64>,
    /// Goodput, Gbit/s (message octets; bandwidth tests).
    pub bw_gbps: Option<f64>,
    /// Messages per second, millions.
    pub msg_rate_mps: Option<f64>,
    /// Name of the baseline this result is compared with.
    pub baseline: Option<String>,
    /// The baseline's figure (p50 µs or Gbit/s).
    pub baseline_value: Option<f64>,
    /// This figure / the baseline's.
    pub ratio: Option<f64>,
    /// How both ends waited: `poll` or `event`.
    #[serde(default)]
    pub wait: String,
    /// MPA CRC (RC only).
    pub crc: Option<bool>,
    /// TCP congestion control of a row over TCP ([`PerfResult::new`]; a
    /// raw TCP baseline's read from its socket); `None` for datagram rows.
    pub tcp_cc: Option<String>,
    /// Every byte was checked (`--verify`).
    #[serde(default)]
    pub verified: bool,
    /// Messages lost (datagram transports and UDP) and retried or skipped.
    #[serde(default)]
    pub lost: u64,
    /// DC only: latency of the first message to a target the initiator
    /// had no connection to (an 8 B Read, post to completion, invitation
    /// and connection set-up included), µs; the cell's own figures are
    /// steady state. `null` on every other transport.
    pub first_msg_us: Option<f64>,
    /// Framed TCP baselines (`tcp_mpa_bw`, `tcp_mpa_crc_bw`): RDMA Write
    /// FPDUs per message. `null` elsewhere.
    pub fpdus_per_msg: Option<u64>,
    /// Raw UDP bandwidth baselines (`udp_bw`, `udp_crc_bw`): message octets
    /// per datagram. `null` elsewhere.
    pub dgram_payload: Option<u64>,
    /// Remarks in prose (how it was counted, …); every figure has a field
    /// of its own.
    #[serde(default)]
    pub note: String,
    /// Why the cell failed.
    pub error: Option<String>,
}

impl PerfResult {
    /// A result for `test` over `transport` at `size` with nothing measured.
    /// A result with nothing measured yet. A row over TCP starts with
    /// the congestion control its connections were given: a peer's the
    /// system's (it opens its own sockets), softrdma's and raw TCP's what
    /// this end of the run set, else the system's (a raw TCP baseline
    /// replaces it with what its socket reported).
    pub(crate) fn new(test: &str, transport: &str, size: u64, wait: &str) -> PerfResult {
        let tcp_cc = if test.starts_with("fi_") || test.starts_with("ucx_") {
            transport
                .contains("tcp")
                .then(super::tcp_cc::system_default)
                .flatten()
        } else if matches!(transport, "rc" | "dc" | "tcp") {
            super::tcp_cc::chosen().or_else(super::tcp_cc::system_default)
        } else {
            None
        };
        PerfResult {
            test: test.into(),
            transport: transport.into(),
            size,
            wait: wait.into(),
            tcp_cc,
            ..Default::default()
        }
    }

    /// A failed cell.
    pub(crate) fn failed(test: &str, transport: &str, size: u64, wait: &str, why: &str) -> Self {
        PerfResult {
            error: Some(why.to_string()),
            ..PerfResult::new(test, transport, size, wait)
        }
    }

    /// True for latency results.
    pub(crate) fn is_lat(&self) -> bool {
        self.lat_us_p50.is_some() || (self.bw_gbps.is_none() && self.test.ends_with("_lat"))
    }

    /// Fills the latency fields from a histogram of one-way nanoseconds.
    pub(crate) fn set_latency(&mut self, h: &Histogram) {
        self.iters = h.count();
        self.lat_us_p50 = Some(h.quantile(0.5) / 1e3);
        self.lat_us_p99 = Some(h.quantile(0.99) / 1e3);
        self.lat_us_mean = Some(h.mean() / 1e3);
        let mean_s = h.mean() * 2.0 / 1e9;
        if mean_s > 0.0 {
            // A ping-pong moves one message each way per round trip.
            self.msg_rate_mps = Some(1.0 / mean_s / 1e6);
            self.bw_gbps = None;
        }
    }

    /// Fills the bandwidth fields from octets and messages over `secs`.
    pub(crate) fn set_bandwidth(&mut self, octets: u64, msgs: u64, secs: f64) {
        self.iters = msgs;
        if secs > 0.0 {
            self.bw_gbps = Some(octets as f64 * 8.0 / secs / 1e9);
            self.msg_rate_mps = Some(msgs as f64 / secs / 1e6);
        }
    }

    /// The headline figure: p50 µs for latency, Gbit/s for bandwidth.
    pub(crate) fn value(&self) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        if self.is_lat() {
            self.lat_us_p50
        } else {
            self.bw_gbps
        }
    }

    /// Compares with `base` (same kind of figure): sets baseline, its
    /// value and the ratio (value / baseline value), or only the name when
    /// either figure is missing.
    pub(crate) fn set_baseline(&mut self, base: &PerfResult) {
        self.baseline = Some(base.test.clone());
        self.baseline_value = base.value();
        self.ratio = match (self.value(), base.value()) {
            (Some(v), Some(b)) if b > 0.0 => Some(v / b),
            _ => None,
        };
    }

    /// One JSON object on one line (every field, `null` where a figure is
    /// missing or not finite).
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a PerfResult always serializes")
    }

    /// Parses what [`PerfResult::to_json`] wrote (`None` if it is not such
    /// an object: `test`, `transport` and `size` are required, the other
    /// fields default when missing).
    pub(crate) fn from_json(line: &str) -> Option<PerfResult> {
        serde_json::from_str(line.trim()).ok()
    }
}

/// Whether progress is drawn as a live bar: stderr is a terminal and the
/// run is not under CI (`CI=true`). Otherwise every progress line is
/// printed as it is, which is what CI logs read.
fn interactive() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && !std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Progress of a run on stderr. Every [`Progress::line`] is printed, the
/// same text whether stderr is a terminal or not; on a terminal (and not
/// under CI) an `indicatif` bar below those lines shows how far the run
/// is (steps done of `len`, or a spinner when `len` is 0) and the step
/// under way. The bar is redrawn only when something changes (no ticker
/// thread runs beside the measurements), and cleared by
/// [`Progress::finish`] or when dropped.
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    /// A progress display for `len` steps (0: unknown, a spinner).
    pub(crate) fn new(len: u64) -> Progress {
        use indicatif::{ProgressBar, ProgressFinish, ProgressStyle};
        let bar = interactive().then(|| {
            let (bar, template) = if len == 0 {
                (
                    ProgressBar::new_spinner(),
                    "{spinner} [{elapsed_precise}] {wide_msg}",
                )
            } else {
                (
                    ProgressBar::new(len),
                    "[{elapsed_precise}] {bar:30} {pos:>3}/{len} {wide_msg}",
                )
            };
            let style = ProgressStyle::with_template(template)
                .expect("a valid progress template")
                .progress_chars("#>.");
            // New bars draw on stderr.
            bar.with_style(style).with_finish(ProgressFinish::AndClear)
        });
        Progress { bar }
    }

    /// Prints `text` on stderr (above the bar when there is one).
    pub(crate) fn line(&self, text: &str) {
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// Names the step under way (shown on the bar only).
    pub(crate) fn step(&self, what: &str) {
        if let Some(b) = &self.bar {
            b.set_message(what.to_string());
        }
    }

    /// One step done.
    pub(crate) fn inc(&self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }

    /// Clears the bar (the printed lines stay).
    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// A size in octets the way the table shows it (`64`, `4Ki`, `1Mi`).
pub(crate) fn fmt_size(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}Mi", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}Ki", n >> 10)
    } else {
        n.to_string()
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}"),
        _ => "-".into(),
    }
}

/// The results as an aligned text table, one row each, failed cells with
/// their reason.
pub(crate) fn format_table(rows: &[PerfResult]) -> String {
    let head = [
        "test",
        "transport",
        "size",
        "iters",
        "lat p50 us",
        "lat p99 us",
        "Gbit/s",
        "Mmsg/s",
        "baseline",
        "ratio",
        "notes",
    ];
    let mut cells: Vec<Vec<String>> = Vec::new();
    for r in rows {
        let mut notes = Vec::new();
        if let Some(c) = r.crc {
            notes.push(if c { "crc" } else { "no-crc" }.to_string());
        }
        if r.verified {
            notes.push("verified".into());
        }
        if r.lost > 0 {
            notes.push(format!("lost {}", r.lost));
        }
        if let Some(f) = r.first_msg_us {
            notes.push(format!("first message {f:.1} us"));
        }
        if let Some(n) = r.fpdus_per_msg {
            notes.push(format!("{n} FPDUs/message"));
        }
        if let Some(n) = r.dgram_payload {
            notes.push(format!("{n} octets/datagram"));
        }
        if !r.note.is_empty() {
            notes.push(r.note.clone());
        }
        if let Some(e) = &r.error {
            notes.push(format!("ERROR: {e}"));
        }
        let ratio = match r.ratio {
            Some(x) if x < 0.1 => format!("{x:.3}x"),
            Some(x) => format!("{x:.2}x"),
            None => "-".into(),
        };
        // The baseline with its figure (p50 µs or Gbit/s), so a strange
        // ratio shows which side was strange.
        let baseline = match (&r.baseline, r.baseline_value) {
            (Some(b), Some(v)) => format!("{b} {}", opt(Some(v), 2)),
            (Some(b), None) => b.clone(),
            _ => "-".into(),
        };
        let lat = r.is_lat();
        cells.push(vec![
            r.test.clone(),
            r.transport.clone(),
            fmt_size(r.size),
            if r.error.is_some() {
                "-".into()
            } else {
                r.iters.to_string()
            },
            opt(r.lat_us_p50, 2),
            opt(r.lat_us_p99, 2),
            if lat { "-".into() } else { opt(r.bw_gbps, 2) },
            opt(r.msg_rate_mps, 3),
            baseline,
            ratio,
            notes.join("; "),
        ]);
    }
    let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for row in &cells {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, row: &[String]| {
        for (i, (c, w)) in row.iter().zip(&width).enumerate() {
            let last = i + 1 == row.len();
            // Text columns left-aligned, figures right-aligned.
            if i <= 1 || i == 8 || last {
                if last {
                    out.push_str(c);
                } else {
                    let _ = write!(out, "{c:<w$}  ");
                }
            } else {
                let _ = write!(out, "{c:>w$}  ");
            }
        }
        while out.ends_with(' ') {
            out.pop();
        }
        out.push('\n');
    };
    let head: Vec<String> = head.iter().map(|s| s.to_string()).collect();
    line(&mut out, &head);
    let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
    line(&mut out, &rule);
    for row in &cells {
        line(&mut out, row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trips() {
        let mut r = PerfResult::new("send_lat", "rc", 64, "poll");
        let mut h = Histogram::new();
        for v in [3000, 3100, 3200] {
            h.record(v);
        }
        r.set_latency(&h);
        r.crc = Some(false);
        r.first_msg_us = Some(812.5);
        r.note = "quote \" and \\ and\nnewline é".into();
        let mut b = PerfResult::new("tcp_lat", "tcp", 64, "poll");
        b.set_latency(&h);
        r.set_baseline(&b);
        assert_eq!(r.ratio, Some(1.0));
        let j = r.to_json();
        assert_eq!(PerfResult::from_json(&j), Some(r.clone()));
        let f = PerfResult::failed("write_bw", "rd", 1 << 20, "poll", "it broke");
        assert_eq!(PerfResult::from_json(&f.to_json()), Some(f.clone()));
        assert!(PerfResult::from_json("not json").is_none());
        assert!(PerfResult::from_json("{\"test\":1}").is_none());
        let t = format_table(&[r, f.clone()]);
        assert!(t.contains("ERROR: it broke"), "{t}");
        assert!(t.contains("1.00x"), "{t}");
        assert!(t.contains("first message 812.5 us"), "{t}");
        // Missing figures are null, not absent; the DC figure is a number.
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["first_msg_us"], serde_json::json!(812.5));
        assert!(v["bw_gbps"].is_null());
        let v: serde_json::Value = serde_json::from_str(&f.to_json()).unwrap();
        assert!(v["first_msg_us"].is_null());
        let mut nan = PerfResult::new("send_bw", "ud", 64, "poll");
        nan.bw_gbps = Some(f64::NAN);
        assert!(nan.to_json().contains("\"bw_gbps\":null"));
        assert_eq!(fmt_size(65536), "64Ki");
        assert_eq!(fmt_size(1 << 20), "1Mi");
        assert_eq!(fmt_size(100), "100");
    }
}
