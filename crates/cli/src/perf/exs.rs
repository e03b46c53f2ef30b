//! `softrdma perf exs`: the Extended Sockets API (`libexs.so`, `sys/exs.h`)
//! against plain sockets and against itself, in one run.
//!
//! One C program of our own (`exs_c/exs_bench.c`) is built at run time
//! with `cc` against the header (embedded in this binary) and the built
//! `libexs.so`; each measurement is one run of it, which forks into a
//! server and a client on 127.0.0.1 ([`Ctx::run`]). Per run of the set:
//!
//! * **latency**: RDMA-model ping-pong (`SOCK_SEQPACKET`) at 1, 10 and
//!   100 B, one-way µs, for normal transfers (small-packet size 0:
//!   advertisement, RDMA Read, ACK), immediate data (the default
//!   small-packet size) and persistent transfers (the server sends one
//!   block with `EXS_PERSISTENT` and stays passive; each of the client's
//!   receives is one RDMA Read of it, round trip halved; a library that
//!   answers `EOPNOTSUPP` makes the cell "not built", not a failure);
//! * **blast**: the same bytes at each message size over the RDMA model
//!   (a window of sends in flight) and over a raw TCP stream (blocking
//!   `send(2)` into a `recv(2)` sink), with each side's CPU (`getrusage`
//!   user + system of the process, over its wall time);
//! * **Open Group model**: `exs_send` on a kernel TCP socket with a few
//!   sends in flight, events taken with `exs_qdequeue`, into the same
//!   sink; against the raw TCP stream of the same size.
//!
//! Ratios are per run (immediate / normal, persistent / normal, RDMA /
//! TCP, exs_send / send), their medians over `--runs` are what the
//! targets judge; every value also shows its run-to-run spread
//! ((max − min) / median).
//!
//! Every program runs with a deadline: the client (the parent) is killed
//! at it, the server dies with it (`PR_SET_PDEATHSIG`), and both arm
//! `alarm(2)` a little later as a second bound. A failed or overrun cell
//! shows why and the run goes on.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::loss::proc::load_note;
use super::runs::{self, ratio_stats, stats, Figure};

/// What `softrdma perf exs --help` says first.
pub(crate) const ABOUT: &str = "Measures libexs.so, the Extended Sockets API, on 127.0.0.1: \
    one-way latency of the RDMA model (UNH-EXS) at 1, 10 and 100 B for normal transfers \
    (advertisement, RDMA Read, ACK; small-packet size 0), immediate data and persistent \
    transfers (\"not built\" while the library refuses EXS_PERSISTENT); blast throughput \
    from 1 KiB to 16 MiB messages over the RDMA model against a raw TCP stream moving the \
    same bytes, with each side's CPU; and the Open Group model (exs_send with sends in \
    flight on a kernel socket) against blocking send(2) into the same recv(2) sink.\n\n\
    Every figure that is judged is a ratio measured in the same run; with --runs N the \
    medians are judged and each value shows its run-to-run spread. The paper's UNH-EXS \
    figures on iWARP are printed next to the latencies.\n\n\
    The benchmark program is built at run time with cc against sys/exs.h and libexs.so, \
    looked for in $SOFTRDMA_LIB_DIR, else <dir of this executable>/../lib (libexs.so.1), \
    else the executable's directory and its deps/ (cargo's libexs.so, after cargo build \
    --release -p softrdma-exs).";

/// `softrdma perf exs [OPTIONS]`.
#[derive(Debug, clap::Args)]
#[command(
    after_long_help = "Output: the table and the targets block on stdout (--json: \
    one JSON object instead), progress on stderr.\n\n\
    Exit status: 0 when every cell worked (a \"not built\" cell is no failure), 1 when one \
    failed or libexs.so or cc is missing, 2 for a bad command line."
)]
pub(crate) struct ExsArgs {
    /// Short runs: 1 000 round trips per latency size (5 000 without),
    /// blasts at 1 KiB, 1 MiB and 16 MiB only with fewer bytes.
    #[arg(long)]
    quick: bool,

    /// Print one JSON object (every run's cells, the medians, the
    /// targets) on stdout instead of the table.
    #[arg(long)]
    json: bool,

    /// Repeat the whole set N times, 1 to 50; the table shows medians and
    /// the targets are judged on the median ratios.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    runs: u32,
}

/// The header the program is built against (the repository's).
const EXS_H: &str = include_str!("../../../exs/include/sys/exs.h");
/// The benchmark program.
const BENCH_C: &str = include_str!("exs_c/exs_bench.c");

/// Latency message sizes (the program's).
const LAT_SIZES: [usize; 3] = [1, 10, 100];

/// The RDMA model's transfer kinds, in the order they run.
const KINDS: [&str; 3] = ["normal", "immediate", "persistent"];

/// UNH-EXS on iWARP, one-way µs at 1, 10 and 100 B (the paper's figures),
/// per kind of [`KINDS`].
const PAPER_US: [[f64; 3]; 3] = [[33.0, 33.0, 34.0], [17.0, 17.0, 17.0], [10.0, 10.0, 10.0]];

/// Blast message sizes.
const BLAST_SIZES: [usize; 5] = [1 << 10, 16 << 10, 256 << 10, 1 << 20, 16 << 20];
/// Blast message sizes with `--quick`.
const QUICK_BLAST_SIZES: [usize; 3] = [1 << 10, 1 << 20, 16 << 20];

/// Sends in flight in the Open Group model.
const OG_DEPTH: u32 = 4;

/// The blast target applies from this size on.
const BLAST_JUDGED_FROM: usize = 1 << 20;
/// The Open Group target applies from this size on (below it the
/// per-operation cost of a queued send is the figure, not bandwidth).
const OG_JUDGED_FROM: usize = 16 << 10;

/// Target: immediate / normal one-way latency at most this.
const TARGET_IMMEDIATE: f64 = 0.6;
/// Target: persistent / normal one-way latency at most this.
const TARGET_PERSISTENT: f64 = 0.45;
/// Target: RDMA blast / raw TCP at least this.
const TARGET_BLAST: f64 = 0.9;
/// Target: exs_send / send at least this.
const TARGET_OG: f64 = 0.95;

/// The blast modes: key, label.
const XFERS: [(&str, &str); 3] = [
    ("tcp", "raw TCP send/recv"),
    ("rdma", "RDMA model"),
    ("og", "Open Group exs_send"),
];

/// Octets moved per blast cell at `size`: about `total` octets, but at
/// least `min_msgs` and at most `max_msgs` messages.
fn blast_bytes(size: usize, quick: bool) -> u64 {
    let (total, min_msgs, max_msgs): (u64, u64, u64) = if quick {
        (64 << 20, 8, 20_000)
    } else {
        (1 << 30, 16, 400_000)
    };
    let size = size as u64;
    (total / size).clamp(min_msgs, max_msgs) * size
}

// ---------------------------------------------------------------------
// The program's output
// ---------------------------------------------------------------------

/// One blast's figures as the client prints them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct XferLine {
    mode: String,
    size: usize,
    bytes: u64,
    secs: f64,
}

/// What one run of the program printed.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct BenchOut {
    /// `lat KIND SIZE US`.
    lat: Vec<(String, usize, f64)>,
    /// `notbuilt KIND REASON`: the reason.
    not_built: Option<String>,
    /// `xfer MODE SIZE BYTES SECONDS`.
    xfer: Option<XferLine>,
    /// `cpu SIDE CPU_SECONDS WALL_SECONDS`, by side.
    cpu: BTreeMap<String, (f64, f64)>,
}

impl BenchOut {
    /// The CPU share of one core of `side` (`client` or `server`).
    fn cpu_share(&self, side: &str) -> Option<f64> {
        let &(cpu, wall) = self.cpu.get(side)?;
        (wall > 0.0).then_some(cpu / wall)
    }
}

/// Parses the program's stdout; lines it does not know are skipped.
pub(crate) fn parse_output(out: &str) -> BenchOut {
    let mut b = BenchOut::default();
    for line in out.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| w.get(i).and_then(|s| s.parse::<f64>().ok());
        let int = |i: usize| w.get(i).and_then(|s| s.parse::<u64>().ok());
        match w.first().copied() {
            Some("lat") if w.len() == 4 => {
                if let (Some(size), Some(us)) = (int(2), num(3)) {
                    b.lat.push((w[1].to_string(), size as usize, us));
                }
            }
            Some("notbuilt") if w.len() >= 2 => {
                b.not_built = Some(w[2..].join(" "));
            }
            Some("xfer") if w.len() == 5 => {
                if let (Some(size), Some(bytes), Some(secs)) = (int(2), int(3), num(4)) {
                    b.xfer = Some(XferLine {
                        mode: w[1].to_string(),
                        size: size as usize,
                        bytes,
                        secs,
                    });
                }
            }
            Some("cpu") if w.len() == 4 => {
                if let (Some(c), Some(t)) = (num(2), num(3)) {
                    b.cpu.insert(w[1].to_string(), (c, t));
                }
            }
            _ => {}
        }
    }
    b
}

/// The line of `out` that best says what went wrong: the first `FAIL`
/// line, else the last one with an error, else the last one; at most 240
/// characters.
pub(crate) fn complaint(out: &str) -> String {
    let lines: Vec<&str> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    // The program's first FAIL is the cause (the client's, after the
    // server's, is its consequence).
    let at = lines
        .iter()
        .position(|l| l.starts_with("FAIL"))
        .or_else(|| {
            lines.iter().rposition(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("fail") || l.contains("error") || l.contains("panick")
            })
        })
        .or(lines.len().checked_sub(1));
    let Some(at) = at else {
        return "(no output)".into();
    };
    let mut s: String = lines[at].chars().take(240).collect();
    if lines[at].chars().count() > 240 {
        s.push('…');
    }
    s
}

// ---------------------------------------------------------------------
// Cells and their aggregation
// ---------------------------------------------------------------------

/// One figure of one run.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Cell {
    /// Measured.
    Ok(f64),
    /// The library does not have the feature (not a failure).
    NotBuilt(String),
    /// The measurement failed: why.
    Failed(String),
}

impl Figure for Cell {
    fn value(&self) -> Option<f64> {
        match self {
            Cell::Ok(v) => Some(*v),
            _ => None,
        }
    }

    fn absent(&self) -> bool {
        matches!(self, Cell::NotBuilt(_))
    }
}

impl Cell {
    fn json(&self) -> Value {
        match self {
            Cell::Ok(v) => json!(v),
            Cell::NotBuilt(w) => json!({ "not_built": w }),
            Cell::Failed(w) => json!({ "failed": w }),
        }
    }
}

/// Every run's cells by key (`lat/normal/1`, `mbps/rdma/1024`,
/// `cpu_client/tcp/1024`, ...).
type Run = BTreeMap<String, Cell>;

/// A key's median, spread and count over the runs, or why none.
type Stats = runs::Stats<Cell>;

fn lat_key(kind: &str, size: usize) -> String {
    format!("lat/{kind}/{size}")
}

fn mbps_key(mode: &str, size: usize) -> String {
    format!("mbps/{mode}/{size}")
}

fn cpu_key(side: &str, mode: &str, size: usize) -> String {
    format!("cpu_{side}/{mode}/{size}")
}

/// A judged target.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Target {
    name: String,
    /// The worst median ratio among the rows judged.
    figure: Option<f64>,
    /// Where that worst figure is.
    at: Option<String>,
    /// `met`, `not met` or `not judged`.
    status: &'static str,
    /// Why it was not judged.
    note: Option<String>,
}

/// Judges the worst of `rows` ((label, median ratio)) against `limit`:
/// `at_most` for latency ratios (worst = largest), else at least (worst =
/// smallest). `empty_note` says why when no row has a figure.
fn judge(
    name: String,
    rows: Vec<(String, Option<f64>)>,
    limit: f64,
    at_most: bool,
    empty_note: String,
) -> Target {
    let worst = rows
        .into_iter()
        .filter_map(|(l, r)| r.map(|r| (l, r)))
        .reduce(|a, b| {
            let b_worse = if at_most { b.1 > a.1 } else { b.1 < a.1 };
            if b_worse {
                b
            } else {
                a
            }
        });
    match worst {
        None => Target {
            name,
            figure: None,
            at: None,
            status: "not judged",
            note: Some(empty_note),
        },
        Some((at, r)) => Target {
            name,
            figure: Some(r),
            at: Some(at),
            status: if (at_most && r <= limit) || (!at_most && r >= limit) {
                "met"
            } else {
                "not met"
            },
            note: None,
        },
    }
}

/// Why a kind has no figure in any run, for a target's note.
fn why_missing(runs: &[Run], keys: &[String]) -> String {
    for k in keys {
        match stats(runs, k).why {
            Some(Cell::NotBuilt(w)) => return format!("not built ({w})"),
            Some(Cell::Failed(w)) => return format!("failed: {w}"),
            _ => {}
        }
    }
    "no figure".into()
}

/// The targets, judged on the median ratios of `runs`.
fn targets(runs: &[Run], sizes: &[usize]) -> Vec<Target> {
    let mut t = Vec::new();
    for (kind, limit) in [
        ("immediate", TARGET_IMMEDIATE),
        ("persistent", TARGET_PERSISTENT),
    ] {
        let rows = LAT_SIZES
            .iter()
            .map(|&s| {
                let r = ratio_stats(runs, &lat_key(kind, s), &lat_key("normal", s));
                (format!("{s} B"), r.median)
            })
            .collect();
        let keys: Vec<String> = LAT_SIZES
            .iter()
            .flat_map(|&s| [lat_key(kind, s), lat_key("normal", s)])
            .collect();
        t.push(judge(
            format!("{kind} ≤ {limit} × normal one-way latency (1, 10, 100 B)"),
            rows,
            limit,
            true,
            why_missing(runs, &keys),
        ));
    }
    for (mode, from, limit, what) in [
        ("rdma", BLAST_JUDGED_FROM, TARGET_BLAST, "RDMA-model blast"),
        ("og", OG_JUDGED_FROM, TARGET_OG, "Open Group exs_send"),
    ] {
        let judged: Vec<usize> = sizes.iter().copied().filter(|&s| s >= from).collect();
        let rows = judged
            .iter()
            .map(|&s| {
                let r = ratio_stats(runs, &mbps_key(mode, s), &mbps_key("tcp", s));
                (size_label(s), r.median)
            })
            .collect();
        let keys: Vec<String> = judged
            .iter()
            .flat_map(|&s| [mbps_key(mode, s), mbps_key("tcp", s)])
            .collect();
        t.push(judge(
            format!(
                "{what} ≥ {limit} × raw TCP bandwidth (messages ≥ {})",
                size_label(from)
            ),
            rows,
            limit,
            false,
            why_missing(runs, &keys),
        ));
    }
    t
}

// ---------------------------------------------------------------------
// Formatting
// ---------------------------------------------------------------------

/// `1 KiB`, `16 MiB`, `100 B`.
pub(crate) fn size_label(s: usize) -> String {
    if s >= 1 << 20 && s.is_multiple_of(1 << 20) {
        format!("{} MiB", s >> 20)
    } else if s >= 1 << 10 && s.is_multiple_of(1 << 10) {
        format!("{} KiB", s >> 10)
    } else {
        format!("{s} B")
    }
}

/// A value with `decimals`, or what stands in for it.
fn fmt_stat(s: &Stats, decimals: usize) -> String {
    match (s.median, &s.why) {
        (Some(m), _) => format!("{m:.decimals$}"),
        (None, Some(Cell::NotBuilt(_))) => "not built".into(),
        (None, Some(Cell::Failed(_))) => "FAILED".into(),
        _ => "-".into(),
    }
}

/// A spread as a percentage, or `-`.
fn fmt_spread(s: &Stats) -> String {
    s.spread
        .map_or_else(|| "-".into(), |v| format!("{:.0}%", v * 100.0))
}

/// A CPU share as a percentage of one core.
fn fmt_cpu(s: &Stats) -> String {
    s.median
        .map_or_else(|| "-".into(), |v| format!("{:.0}%", v * 100.0))
}

/// The three tables.
fn format_table(runs: &[Run], sizes: &[usize]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "\nRDMA model one-way latency, µs (median; spread = (max-min)/median over runs)"
    );
    let _ = writeln!(
        o,
        "{:<7} {:>10} {:>6} {:>10} {:>6} {:>10} {:>6} {:>9} {:>9}   {:>14}",
        "size",
        "normal",
        "±",
        "immediate",
        "±",
        "persistent",
        "±",
        "imm/norm",
        "pers/norm",
        "paper n/i/p"
    );
    for (i, &s) in LAT_SIZES.iter().enumerate() {
        let st: Vec<Stats> = KINDS.iter().map(|k| stats(runs, &lat_key(k, s))).collect();
        let r = |k: &str| {
            let r = ratio_stats(runs, &lat_key(k, s), &lat_key("normal", s));
            r.median.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
        };
        let _ = writeln!(
            o,
            "{:<7} {:>10} {:>6} {:>10} {:>6} {:>10} {:>6} {:>9} {:>9}   {:>14}",
            format!("{s} B"),
            fmt_stat(&st[0], 2),
            fmt_spread(&st[0]),
            fmt_stat(&st[1], 2),
            fmt_spread(&st[1]),
            fmt_stat(&st[2], 2),
            fmt_spread(&st[2]),
            r("immediate"),
            r("persistent"),
            format!("{}/{}/{}", PAPER_US[0][i], PAPER_US[1][i], PAPER_US[2][i])
        );
    }
    for (mode, title, head) in [
        ("rdma", "RDMA-model blast against raw TCP", "rdma/tcp"),
        (
            "og",
            "Open Group exs_send (4 in flight) against blocking send, same kernel socket",
            "og/tcp",
        ),
    ] {
        let _ = writeln!(
            o,
            "\n{title}, MB/s (10^6 B/s; CPU: % of one core, client/server)"
        );
        let _ = writeln!(
            o,
            "{:<7} {:>9} {:>9} {:>5} {:>9} {:>5} {:>9} {:>5} {:>11} {:>11}",
            "size",
            "bytes",
            mode,
            "±",
            "tcp",
            "±",
            head,
            "±",
            format!("cpu {mode}"),
            "cpu tcp"
        );
        for &s in sizes {
            let a = stats(runs, &mbps_key(mode, s));
            let b = stats(runs, &mbps_key("tcp", s));
            let r = ratio_stats(runs, &mbps_key(mode, s), &mbps_key("tcp", s));
            let cpu = |m: &str| {
                format!(
                    "{}/{}",
                    fmt_cpu(&stats(runs, &cpu_key("client", m, s))),
                    fmt_cpu(&stats(runs, &cpu_key("server", m, s)))
                )
            };
            let bytes = runs
                .iter()
                .find_map(|r| r.get(&format!("bytes/{s}")).and_then(Cell::value))
                .map_or_else(|| "-".into(), |b| size_label(b as usize));
            let _ = writeln!(
                o,
                "{:<7} {:>9} {:>9} {:>5} {:>9} {:>5} {:>9} {:>5} {:>11} {:>11}",
                size_label(s),
                bytes,
                fmt_stat(&a, 0),
                fmt_spread(&a),
                fmt_stat(&b, 0),
                fmt_spread(&b),
                r.median.map_or_else(|| "-".into(), |v| format!("{v:.2}")),
                fmt_spread(&r),
                cpu(mode),
                cpu("tcp")
            );
        }
    }
    o
}

/// The targets block.
fn format_targets(t: &[Target], runs: usize) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "\ntargets ({}):",
        if runs > 1 {
            "median ratios over the runs; the worst row"
        } else {
            "the worst row"
        }
    );
    for t in t {
        let fig = match (&t.figure, &t.at) {
            (Some(f), Some(at)) => format!("{f:.2} at {at}"),
            _ => t.note.clone().unwrap_or_default(),
        };
        let _ = writeln!(o, "  {:<72} {:<10} {}", t.name, t.status, fig);
    }
    o
}

/// Every failed cell: (run, key, why).
fn failures(runs: &[Run]) -> Vec<(usize, String, String)> {
    let mut f = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        for (k, c) in r {
            if let Cell::Failed(w) = c {
                f.push((i + 1, k.clone(), w.clone()));
            }
        }
    }
    f
}

// ---------------------------------------------------------------------
// The library, the program, its runs
// ---------------------------------------------------------------------

/// Where `libexs.so` is: `$SOFTRDMA_LIB_DIR` (`env`) alone when set, else
/// `<exe_dir>/../lib/libexs.so.1`, `<exe_dir>/libexs.so`,
/// `<exe_dir>/deps/libexs.so`. Err: what was looked at.
pub(crate) fn libexs_among(
    env: Option<&Path>,
    exe_dir: Option<&Path>,
) -> Result<PathBuf, Vec<String>> {
    let mut tried: Vec<PathBuf> = Vec::new();
    if let Some(d) = env {
        tried.push(d.join("libexs.so.1"));
        tried.push(d.join("libexs.so"));
    } else if let Some(e) = exe_dir {
        let lib = e
            .parent()
            .map_or_else(|| e.join("../lib"), |p| p.join("lib"));
        tried.push(lib.join("libexs.so.1"));
        tried.push(e.join("libexs.so"));
        tried.push(e.join("deps/libexs.so"));
    }
    if let Some(p) = tried.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    let mut looked: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    if env.is_none() {
        looked.insert(0, "SOFTRDMA_LIB_DIR: not set".into());
    }
    if looked.len() == 1 {
        looked.push("the executable's directory: unknown".into());
    }
    Err(looked)
}

fn find_libexs() -> Result<PathBuf, Vec<String>> {
    let env = std::env::var_os("SOFTRDMA_LIB_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    libexs_among(env.as_deref(), exe_dir.as_deref())
}

/// A finished program: exit status (None: killed at its deadline), stdout,
/// stderr.
struct Ran {
    ok: Option<bool>,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` with stdout and stderr in files under `dir` (named after
/// `tag`), killing it at `deadline`.
fn run_bounded(mut cmd: Command, dir: &Path, tag: &str, deadline: Duration) -> Result<Ran, String> {
    let out = dir.join(format!("{tag}.out"));
    let err = dir.join(format!("{tag}.err"));
    let file = |p: &Path| File::create(p).map_err(|e| format!("{}: {e}", p.display()));
    cmd.stdin(Stdio::null())
        .stdout(file(&out)?)
        .stderr(file(&err)?);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {tag}: {e}"))?;
    let until = Instant::now() + deadline;
    let ok = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st.success()),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    Ok(Ran {
        ok,
        stdout: read(&out),
        stderr: read(&err),
    })
}

/// The run's context: the program and its directory.
struct Ctx {
    dir: PathBuf,
    exe: PathBuf,
    quick: bool,
    seq: u32,
}

impl Ctx {
    /// Builds the program in `dir` against the embedded header and a copy
    /// of `lib` named `libexs.so.1` (its SONAME).
    fn build(dir: &Path, lib: &Path, quick: bool) -> Result<Ctx, String> {
        let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        let inc = dir.join("include/sys");
        std::fs::create_dir_all(&inc).map_err(|e| io(&inc, e))?;
        let h = inc.join("exs.h");
        std::fs::write(&h, EXS_H).map_err(|e| io(&h, e))?;
        let src = dir.join("exs_bench.c");
        std::fs::write(&src, BENCH_C).map_err(|e| io(&src, e))?;
        let so1 = dir.join("libexs.so.1");
        std::fs::copy(lib, &so1).map_err(|e| io(lib, e))?;
        let so = dir.join("libexs.so");
        let _ = std::fs::remove_file(&so);
        std::os::unix::fs::symlink("libexs.so.1", &so).map_err(|e| io(&so, e))?;
        let exe = dir.join("exs_bench");
        let mut cc = Command::new("cc");
        cc.args(["-O2", "-Wall", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg("-I")
            .arg(dir.join("include"))
            .arg("-L")
            .arg(dir)
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lexs");
        let r = run_bounded(cc, dir, "cc", Duration::from_secs(120))?;
        match r.ok {
            Some(true) => Ok(Ctx {
                dir: dir.to_path_buf(),
                exe,
                quick,
                seq: 0,
            }),
            Some(false) => Err(format!(
                "cc could not build exs_bench.c: {}",
                complaint(&r.stderr)
            )),
            None => Err("cc overran its deadline of 120 s".into()),
        }
    }

    /// One run of the program with `args`, killed after `deadline`.
    fn run(&mut self, args: &[String], deadline: Duration) -> Result<BenchOut, Cell> {
        self.seq += 1;
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .env("EXS_BENCH_DEADLINE", (deadline.as_secs() + 5).to_string());
        let tag = format!("run{}-{}", self.seq, args[0]);
        let r = run_bounded(cmd, &self.dir, &tag, deadline).map_err(Cell::Failed)?;
        let out = parse_output(&r.stdout);
        if let Some(w) = out.not_built {
            return Err(Cell::NotBuilt(w));
        }
        match r.ok {
            Some(true) => Ok(out),
            Some(false) => Err(Cell::Failed(complaint(&format!(
                "{}\n{}",
                r.stdout, r.stderr
            )))),
            None => Err(Cell::Failed(format!(
                "overran its deadline of {} s and was killed ({})",
                deadline.as_secs(),
                complaint(&format!("{}\n{}", r.stdout, r.stderr))
            ))),
        }
    }

    /// Round trips per latency size.
    fn lat_iters(&self) -> u64 {
        if self.quick {
            1000
        } else {
            5000
        }
    }

    /// The latency cells of `kind` into `run`.
    fn latency(&mut self, kind: &str, run: &mut Run) {
        let args = vec!["lat".into(), kind.into(), self.lat_iters().to_string()];
        let r = self.run(&args, Duration::from_secs(if self.quick { 30 } else { 60 }));
        for &s in &LAT_SIZES {
            let cell = match &r {
                Ok(out) => out
                    .lat
                    .iter()
                    .find(|(k, size, _)| k == kind && *size == s)
                    .map_or_else(
                        || Cell::Failed("no figure printed".into()),
                        |l| Cell::Ok(l.2),
                    ),
                Err(c) => c.clone(),
            };
            run.insert(lat_key(kind, s), cell);
        }
    }

    /// The blast cells of `mode` at `size` into `run`.
    fn blast(&mut self, mode: &str, size: usize, run: &mut Run) {
        let bytes = blast_bytes(size, self.quick);
        let mut args = vec![mode.to_string(), size.to_string(), bytes.to_string()];
        if mode == "og" {
            args.push(OG_DEPTH.to_string());
        }
        // Generous: 20 s plus 20 MB/s.
        let deadline = Duration::from_secs(20 + bytes / 20_000_000);
        run.insert(format!("bytes/{size}"), Cell::Ok(bytes as f64));
        let r = self.run(&args, deadline).and_then(|out| {
            let x = out
                .xfer
                .clone()
                .filter(|x| x.mode == mode && x.size == size && x.bytes == bytes && x.secs > 0.0)
                .ok_or_else(|| Cell::Failed("no transfer figure printed".into()))?;
            Ok((x.bytes as f64 / x.secs / 1e6, out))
        });
        match r {
            Ok((mbps, out)) => {
                run.insert(mbps_key(mode, size), Cell::Ok(mbps));
                for side in ["client", "server"] {
                    let c = out
                        .cpu_share(side)
                        .map_or_else(|| Cell::Failed(format!("no {side} CPU figure")), Cell::Ok);
                    run.insert(cpu_key(side, mode, size), c);
                }
            }
            Err(c) => {
                for k in [
                    mbps_key(mode, size),
                    cpu_key("client", mode, size),
                    cpu_key("server", mode, size),
                ] {
                    run.insert(k, c.clone());
                }
            }
        }
    }
}

/// A short text of a cell for progress lines.
fn progress_text(c: Option<&Cell>, unit: &str) -> String {
    match c {
        Some(Cell::Ok(v)) => format!("{v:.2} {unit}"),
        Some(Cell::NotBuilt(w)) => format!("not built ({w})"),
        Some(Cell::Failed(w)) => format!("FAILED: {w}"),
        None => "-".into(),
    }
}

// ---------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------

/// Entry point of `softrdma perf exs`.
pub(crate) fn main(a: ExsArgs) -> ExitCode {
    let lib = match find_libexs() {
        Ok(p) => p,
        Err(looked) => {
            eprintln!(
                "softrdma perf exs: libexs.so was not found; looked at:\n  {}\n(build it: cargo \
                 build --release -p softrdma-exs; install it; or set SOFTRDMA_LIB_DIR)",
                looked.join("\n  ")
            );
            return ExitCode::from(1);
        }
    };
    let dir = std::env::temp_dir().join(format!("softrdma-perf-exs-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("softrdma perf exs: {}: {e}", dir.display());
        return ExitCode::from(1);
    }
    let mut ctx = match Ctx::build(&dir, &lib, a.quick) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("softrdma perf exs: {e}");
            let _ = std::fs::remove_dir_all(&dir);
            return ExitCode::from(1);
        }
    };
    let sizes: Vec<usize> = if a.quick {
        QUICK_BLAST_SIZES.to_vec()
    } else {
        BLAST_SIZES.to_vec()
    };
    let t0 = Instant::now();
    let mut runs: Vec<Run> = Vec::new();
    for r in 1..=a.runs {
        let mut run = Run::new();
        for kind in KINDS {
            ctx.latency(kind, &mut run);
            let text = match run.get(&lat_key(kind, LAT_SIZES[0])) {
                // The program's failure or absence, once for every size.
                Some(c @ (Cell::NotBuilt(_) | Cell::Failed(_))) => progress_text(Some(c), ""),
                _ => LAT_SIZES
                    .iter()
                    .map(|&s| format!("{s} B {}", progress_text(run.get(&lat_key(kind, s)), "µs")))
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            eprintln!(
                "[{:>5.1} s] run {r}/{}: latency {kind}: {text}",
                t0.elapsed().as_secs_f64(),
                a.runs,
            );
        }
        for &s in &sizes {
            for (mode, _) in XFERS {
                ctx.blast(mode, s, &mut run);
                eprintln!(
                    "[{:>5.1} s] run {r}/{}: {mode} {}: {}",
                    t0.elapsed().as_secs_f64(),
                    a.runs,
                    size_label(s),
                    progress_text(run.get(&mbps_key(mode, s)), "MB/s")
                );
            }
        }
        runs.push(run);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let tgts = targets(&runs, &sizes);
    let fails = failures(&runs);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&a, &lib, &ctx, &runs, &sizes, &tgts, &fails))
                .expect("the report serializes")
        );
    } else {
        println!(
            "softrdma perf exs: loopback, {} run{}, {} round trips per latency size, \
             libexs {}; {}",
            a.runs,
            if a.runs == 1 { "" } else { "s" },
            ctx.lat_iters(),
            lib.display(),
            load_note()
        );
        print!("{}", format_table(&runs, &sizes));
        if !fails.is_empty() {
            println!("\nfailed:");
            for (r, k, w) in &fails {
                println!("  run {r}, {k}: {w}");
            }
        }
        print!("{}", format_targets(&tgts, runs.len()));
    }
    if fails.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The `--json` object.
fn to_json(
    a: &ExsArgs,
    lib: &Path,
    ctx: &Ctx,
    runs: &[Run],
    sizes: &[usize],
    tgts: &[Target],
    fails: &[(usize, String, String)],
) -> Value {
    let st = |s: &Stats| json!({ "median": s.median, "spread": s.spread, "runs": s.n });
    let latency: Vec<Value> = LAT_SIZES
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let mut m = serde_json::Map::new();
            m.insert("size".into(), json!(s));
            for (k, kind) in KINDS.iter().enumerate() {
                let mut v = st(&stats(runs, &lat_key(kind, s)));
                v["paper_us"] = json!(PAPER_US[k][i]);
                if let Some(Cell::NotBuilt(w)) = stats(runs, &lat_key(kind, s)).why {
                    v["not_built"] = json!(w);
                }
                m.insert(format!("{kind}_us"), v);
            }
            for kind in ["immediate", "persistent"] {
                m.insert(
                    format!("{kind}_over_normal"),
                    st(&ratio_stats(runs, &lat_key(kind, s), &lat_key("normal", s))),
                );
            }
            Value::Object(m)
        })
        .collect();
    let bw = |mode: &str| -> Vec<Value> {
        sizes
            .iter()
            .map(|&s| {
                let bytes = runs
                    .iter()
                    .find_map(|r| r.get(&format!("bytes/{s}")).and_then(Cell::value));
                json!({
                    "size": s,
                    "bytes": bytes.map(|b| b as u64),
                    format!("{mode}_mbps"): st(&stats(runs, &mbps_key(mode, s))),
                    "tcp_mbps": st(&stats(runs, &mbps_key("tcp", s))),
                    "ratio": st(&ratio_stats(runs, &mbps_key(mode, s), &mbps_key("tcp", s))),
                    format!("{mode}_cpu_client"): st(&stats(runs, &cpu_key("client", mode, s))),
                    format!("{mode}_cpu_server"): st(&stats(runs, &cpu_key("server", mode, s))),
                    "tcp_cpu_client": st(&stats(runs, &cpu_key("client", "tcp", s))),
                    "tcp_cpu_server": st(&stats(runs, &cpu_key("server", "tcp", s))),
                })
            })
            .collect()
    };
    json!({
        "runs": a.runs,
        "quick": a.quick,
        "library": lib.display().to_string(),
        "latency_round_trips": ctx.lat_iters(),
        "og_depth": OG_DEPTH,
        "load": load_note(),
        "latency": latency,
        "blast": bw("rdma"),
        "open_group": bw("og"),
        "targets": tgts.iter().map(|t| json!({
            "name": t.name, "status": t.status, "figure": t.figure, "at": t.at, "note": t.note,
        })).collect::<Vec<_>>(),
        "cells": runs.iter().map(|r| {
            r.iter().map(|(k, c)| (k.clone(), c.json())).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
        "failures": fails.iter().map(|(r, k, w)| json!({ "run": r, "cell": k, "error": w }))
            .collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT_OUT: &str = "lat normal 1 31.250\nlat normal 10 31.500\nlat normal 100 32.125\n\
                           garbage line\nlat normal x 3\n";

    #[test]
    fn outputs_parse() {
        let o = parse_output(LAT_OUT);
        assert_eq!(o.lat.len(), 3);
        assert_eq!(o.lat[2], ("normal".to_string(), 100, 32.125));
        assert_eq!(o.not_built, None);
        let o = parse_output(
            "cpu server 0.500000 1.000000\ncpu client 0.250000 0.500000\n\
             xfer rdma 1024 1048576 0.500000\n",
        );
        assert_eq!(
            o.xfer,
            Some(XferLine {
                mode: "rdma".into(),
                size: 1024,
                bytes: 1_048_576,
                secs: 0.5
            })
        );
        assert_eq!(o.cpu_share("server"), Some(0.5));
        assert_eq!(o.cpu_share("client"), Some(0.5));
        assert_eq!(o.cpu_share("nobody"), None);
        let o = parse_output(
            "notbuilt persistent exs_send/exs_recv with EXS_PERSISTENT: Operation not supported\n",
        );
        assert_eq!(
            o.not_built.as_deref(),
            Some("exs_send/exs_recv with EXS_PERSISTENT: Operation not supported")
        );
        // A zero wall time is no share.
        assert_eq!(parse_output("cpu client 1 0\n").cpu_share("client"), None);
        assert_eq!(parse_output("xfer rdma 1024 x 0.5\n").xfer, None);
    }

    #[test]
    fn complaints() {
        assert_eq!(
            complaint(
                "lat normal 1 3\nFAIL client (x.c:1): no event in 20 s (errno 0: Success)\nbye\n"
            ),
            "FAIL client (x.c:1): no event in 20 s (errno 0: Success)"
        );
        assert_eq!(
            complaint("FAIL server (x.c:2): receive 3\nFAIL client (x.c:9): status 256\n"),
            "FAIL server (x.c:2): receive 3"
        );
        assert_eq!(complaint("a\nb\n"), "b");
        assert_eq!(complaint("\n"), "(no output)");
    }

    #[test]
    fn sizes_and_bytes() {
        assert_eq!(size_label(1), "1 B");
        assert_eq!(size_label(1024), "1 KiB");
        assert_eq!(size_label(16 << 20), "16 MiB");
        assert_eq!(size_label(1500), "1500 B");
        // Whole messages, within the bounds.
        for q in [false, true] {
            for &s in &BLAST_SIZES {
                let b = blast_bytes(s, q);
                assert_eq!(b % s as u64, 0);
                assert!(b / s as u64 >= 8, "{s}: {b}");
            }
        }
        assert_eq!(blast_bytes(1024, true), 20_000 * 1024);
        assert_eq!(blast_bytes(16 << 20, false), 64 * (16 << 20));
        assert_eq!(blast_bytes(1024, false), 400_000 * 1024);
    }

    fn run(cells: &[(&str, Cell)]) -> Run {
        cells
            .iter()
            .map(|(k, c)| (k.to_string(), c.clone()))
            .collect()
    }

    /// Latency ratios are per run; their medians are judged; persistent
    /// not built leaves its target unjudged with the reason.
    #[test]
    fn latency_targets() {
        let nb = || Cell::NotBuilt("EOPNOTSUPP".into());
        let one = |n: f64, i: f64| {
            let mut cells = Vec::new();
            for s in LAT_SIZES {
                cells.push((lat_key("normal", s), Cell::Ok(n)));
                cells.push((lat_key("immediate", s), Cell::Ok(i)));
                cells.push((lat_key("persistent", s), nb()));
            }
            cells.into_iter().collect::<Run>()
        };
        // Ratios 0.5, 0.7, 0.55: median 0.55 (met); the mean would not be.
        let runs = vec![one(20.0, 10.0), one(10.0, 7.0), one(20.0, 11.0)];
        let r = ratio_stats(&runs, &lat_key("immediate", 1), &lat_key("normal", 1));
        assert_eq!(r.median, Some(0.55));
        assert_eq!(r.n, 3);
        let s = stats(&runs, &lat_key("normal", 10));
        assert_eq!((s.median, s.spread), (Some(20.0), Some(0.5)));
        let s = stats(&runs, &lat_key("persistent", 10));
        assert_eq!(s.median, None);
        assert_eq!(s.why, Some(nb()));
        let t = targets(&runs, &[]);
        assert_eq!(t[0].status, "met");
        assert_eq!(t[0].figure, Some(0.55));
        assert_eq!(t[1].status, "not judged");
        assert_eq!(t[1].note.as_deref(), Some("not built (EOPNOTSUPP)"));
        // Not built is no failure, and the table says so.
        assert!(failures(&runs).is_empty());
        let table = format_table(&runs, &[]);
        assert!(table.contains("not built"), "{table}");
        assert!(table.contains("33/17/10"), "{table}");
        // One size over the limit fails the target.
        let mut bad = one(20.0, 10.0);
        bad.insert(lat_key("immediate", 100), Cell::Ok(15.0));
        let t = targets(&[bad], &[]);
        assert_eq!(t[0].status, "not met");
        assert_eq!(t[0].figure, Some(0.75));
        assert_eq!(t[0].at.as_deref(), Some("100 B"));
    }

    /// Bandwidth targets look at their sizes only, the worst median
    /// ratio; a failed cell is listed and leaves that ratio out.
    #[test]
    fn bandwidth_targets() {
        let k = 1 << 10;
        let m = 1 << 20;
        let r = run(&[
            (&mbps_key("tcp", k), Cell::Ok(1000.0)),
            (&mbps_key("rdma", k), Cell::Ok(100.0)),
            (&mbps_key("og", k), Cell::Ok(500.0)),
            (&mbps_key("tcp", m), Cell::Ok(2000.0)),
            (&mbps_key("rdma", m), Cell::Ok(1900.0)),
            (&mbps_key("og", m), Cell::Failed("stalled".into())),
            (&mbps_key("tcp", 16 * m), Cell::Ok(2000.0)),
            (&mbps_key("rdma", 16 * m), Cell::Ok(1700.0)),
            (&mbps_key("og", 16 * m), Cell::Ok(1980.0)),
            (&cpu_key("client", "rdma", m), Cell::Ok(0.5)),
            (&cpu_key("server", "rdma", m), Cell::Ok(0.25)),
        ]);
        let sizes = [k, m, 16 * m];
        let t = targets(std::slice::from_ref(&r), &sizes);
        // 1 KiB (0.1) is below the blast target's sizes.
        assert_eq!(t[2].status, "not met");
        assert_eq!(t[2].figure, Some(0.85));
        assert_eq!(t[2].at.as_deref(), Some("16 MiB"));
        // The Open Group's 1 MiB cell failed: judged on 16 MiB alone.
        assert_eq!(t[3].status, "met");
        assert_eq!(t[3].figure, Some(0.99));
        let f = failures(std::slice::from_ref(&r));
        assert_eq!(f, vec![(1, mbps_key("og", m), "stalled".to_string())]);
        let table = format_table(std::slice::from_ref(&r), &sizes);
        assert!(table.contains("FAILED"), "{table}");
        assert!(table.contains("50%/25%"), "{table}");
        assert!(table.contains("0.95"), "{table}");
        // Nothing at the judged sizes: not judged, with the reason.
        let t = targets(std::slice::from_ref(&r), &[k]);
        assert_eq!(t[2].status, "not judged");
        let j = judge("x".into(), vec![], 1.0, false, "none".into());
        assert_eq!((j.status, j.note.as_deref()), ("not judged", Some("none")));
    }

    #[test]
    fn library_is_found() {
        let d = std::env::temp_dir().join(format!("softrdma-exs-lib-test-{}", std::process::id()));
        let bin = d.join("target/release");
        std::fs::create_dir_all(bin.join("deps")).unwrap();
        // Nothing there: what was looked at.
        let looked = libexs_among(None, Some(&bin)).unwrap_err();
        assert_eq!(looked.len(), 4, "{looked:?}");
        assert!(looked[0].contains("SOFTRDMA_LIB_DIR"));
        std::fs::write(bin.join("deps/libexs.so"), b"").unwrap();
        assert_eq!(
            libexs_among(None, Some(&bin)).unwrap(),
            bin.join("deps/libexs.so")
        );
        std::fs::write(bin.join("libexs.so"), b"").unwrap();
        assert_eq!(
            libexs_among(None, Some(&bin)).unwrap(),
            bin.join("libexs.so")
        );
        // SOFTRDMA_LIB_DIR alone when set.
        let env = d.join("lib");
        std::fs::create_dir_all(&env).unwrap();
        assert!(libexs_among(Some(&env), Some(&bin)).is_err());
        std::fs::write(env.join("libexs.so.1"), b"").unwrap();
        assert_eq!(
            libexs_among(Some(&env), Some(&bin)).unwrap(),
            env.join("libexs.so.1")
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A program that overruns its deadline is killed, in time.
    #[test]
    fn deadlines_kill() {
        let d = std::env::temp_dir().join(format!("softrdma-exs-run-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let mut c = Command::new("sh");
        c.args(["-c", "echo started; sleep 30"]);
        let t = Instant::now();
        let r = run_bounded(c, &d, "sleep", Duration::from_millis(300)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(10));
        assert_eq!(r.ok, None);
        assert_eq!(r.stdout.trim(), "started");
        let mut c = Command::new("sh");
        c.args(["-c", "echo FAIL here >&2; exit 3"]);
        let r = run_bounded(c, &d, "fail", Duration::from_secs(10)).unwrap();
        assert_eq!(r.ok, Some(false));
        assert_eq!(complaint(&r.stderr), "FAIL here");
        let _ = std::fs::remove_dir_all(&d);
    }
}
