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

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::hist::Histogram;

/// One measured cell (or a failed one: `error` set).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PerfResult {
    /// Test name (`send_lat`, `tcp_bw`, `fi_pingpong`, …).
    pub test: String,
    /// Transport (`rc`, `ud`, `rd`, `tcp`, `udp`, or a peer's provider).
    pub transport: String,
    /// Message size, octets.
    pub size: u64,
    /// Measured iterations (round trips or messages).
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
    pub wait: String,
    /// MPA CRC (RC only).
    pub crc: Option<bool>,
    /// TCP congestion control of a row over TCP ([`PerfResult::new`]; a
    /// raw TCP baseline's read from its socket); `None` for datagram rows.
    pub tcp_cc: Option<String>,
    /// Every byte was checked (`--verify`).
    pub verified: bool,
    /// Messages lost (datagram transports and UDP) and retried or skipped.
    pub lost: u64,
    /// Remarks (how it was counted, …).
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

    /// One JSON object on one line.
    pub(crate) fn to_json(&self) -> String {
        let mut s = String::from("{");
        let mut first = true;
        let mut field = |k: &str, v: String| {
            if !first {
                s.push(',');
            }
            first = false;
            let _ = write!(s, "\"{k}\":{v}");
        };
        let num = |v: Option<f64>| match v {
            Some(x) if x.is_finite() => format!("{x}"),
            _ => "null".into(),
        };
        field("test", json_str(&self.test));
        field("transport", json_str(&self.transport));
        field("size", self.size.to_string());
        field("iters", self.iters.to_string());
        field("lat_us_p50", num(self.lat_us_p50));
        field("lat_us_p99", num(self.lat_us_p99));
        field("lat_us_mean", num(self.lat_us_mean));
        field("bw_gbps", num(self.bw_gbps));
        field("msg_rate_mps", num(self.msg_rate_mps));
        field(
            "baseline",
            self.baseline
                .as_deref()
                .map(json_str)
                .unwrap_or("null".into()),
        );
        field("baseline_value", num(self.baseline_value));
        field("ratio", num(self.ratio));
        field("wait", json_str(&self.wait));
        field(
            "crc",
            self.crc.map(|b| b.to_string()).unwrap_or("null".into()),
        );
        field(
            "tcp_cc",
            self.tcp_cc
                .as_deref()
                .map(json_str)
                .unwrap_or("null".into()),
        );
        field("verified", self.verified.to_string());
        field("lost", self.lost.to_string());
        field("note", json_str(&self.note));
        field(
            "error",
            self.error.as_deref().map(json_str).unwrap_or("null".into()),
        );
        s.push('}');
        s
    }

    /// Parses what [`PerfResult::to_json`] wrote (`None` if it is not such
    /// an object).
    pub(crate) fn from_json(line: &str) -> Option<PerfResult> {
        let m = parse_flat_json(line)?;
        let s = |k: &str| match m.get(k) {
            Some(Json::Str(s)) => Some(s.clone()),
            _ => None,
        };
        let n = |k: &str| match m.get(k) {
            Some(Json::Num(x)) => Some(*x),
            _ => None,
        };
        Some(PerfResult {
            test: s("test")?,
            transport: s("transport")?,
            size: n("size")? as u64,
            iters: n("iters").unwrap_or(0.0) as u64,
            lat_us_p50: n("lat_us_p50"),
            lat_us_p99: n("lat_us_p99"),
            lat_us_mean: n("lat_us_mean"),
            bw_gbps: n("bw_gbps"),
            msg_rate_mps: n("msg_rate_mps"),
            baseline: s("baseline"),
            baseline_value: n("baseline_value"),
            ratio: n("ratio"),
            wait: s("wait").unwrap_or_default(),
            crc: match m.get("crc") {
                Some(Json::Bool(b)) => Some(*b),
                _ => None,
            },
            tcp_cc: s("tcp_cc"),
            verified: matches!(m.get("verified"), Some(Json::Bool(true))),
            lost: n("lost").unwrap_or(0.0) as u64,
            note: s("note").unwrap_or_default(),
            error: s("error"),
        })
    }
}

/// `s` as a JSON string literal.
pub(crate) fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A JSON scalar.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Json {
    /// A string.
    Str(String),
    /// A number.
    Num(f64),
    /// true/false.
    Bool(bool),
    /// null.
    Null,
}

/// Parses one flat JSON object (scalar values only).
pub(crate) fn parse_flat_json(line: &str) -> Option<BTreeMap<String, Json>> {
    let b = line.trim().as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && (b[*i] as char).is_ascii_whitespace() {
            *i += 1;
        }
    };
    let string = |i: &mut usize| -> Option<String> {
        if b.get(*i) != Some(&b'"') {
            return None;
        }
        *i += 1;
        let mut out = String::new();
        loop {
            let c = *b.get(*i)?;
            *i += 1;
            match c {
                b'"' => return Some(out),
                b'\\' => {
                    let e = *b.get(*i)?;
                    *i += 1;
                    match e {
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let h = std::str::from_utf8(b.get(*i..*i + 4)?).ok()?;
                            out.push(char::from_u32(u32::from_str_radix(h, 16).ok()?)?);
                            *i += 4;
                        }
                        c => out.push(c as char),
                    }
                }
                _ => {
                    // Copy a whole UTF-8 sequence.
                    let start = *i - 1;
                    let mut end = *i;
                    while end < b.len() && (b[end] & 0xC0) == 0x80 {
                        end += 1;
                    }
                    out.push_str(std::str::from_utf8(&b[start..end]).ok()?);
                    *i = end;
                }
            }
        }
    };
    let mut m = BTreeMap::new();
    ws(&mut i);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    ws(&mut i);
    if b.get(i) == Some(&b'}') {
        return Some(m);
    }
    loop {
        ws(&mut i);
        let k = string(&mut i)?;
        ws(&mut i);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i += 1;
        ws(&mut i);
        let v = match b.get(i)? {
            b'"' => Json::Str(string(&mut i)?),
            b't' if b[i..].starts_with(b"true") => {
                i += 4;
                Json::Bool(true)
            }
            b'f' if b[i..].starts_with(b"false") => {
                i += 5;
                Json::Bool(false)
            }
            b'n' if b[i..].starts_with(b"null") => {
                i += 4;
                Json::Null
            }
            _ => {
                let start = i;
                while i < b.len() && matches!(b[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                Json::Num(std::str::from_utf8(&b[start..i]).ok()?.parse().ok()?)
            }
        };
        m.insert(k, v);
        ws(&mut i);
        match b.get(i)? {
            b',' => i += 1,
            b'}' => return Some(m),
            _ => return None,
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
        let t = format_table(&[r, f]);
        assert!(t.contains("ERROR: it broke"), "{t}");
        assert!(t.contains("1.00x"), "{t}");
        assert_eq!(fmt_size(65536), "64Ki");
        assert_eq!(fmt_size(1 << 20), "1Mi");
        assert_eq!(fmt_size(100), "100");
    }
}
