//! `softrdma perf suite`: the loopback matrix (test × transport × size),
//! each softrdma cell next to its raw-socket baseline measured just before
//! it in the same child process, one table on stdout, `report.md` and PNG
//! plots in `--out DIR` (default `perf-report/`), progress on stderr.
//!
//! Every (test, transport) group runs as its own `softrdma perf TEST
//! --json` child (which runs its own two ends), under a deadline: a group
//! that fails, crashes or overruns shows as failed cells with the reason,
//! and the exit code is 1. The whole matrix has a time budget (60 s,
//! `--quick` 15 s, `--budget S` to change it); groups that would start
//! after it are reported as skipped rather than run (their rows say so,
//! the last line counts them apart from failed cells, and the exit code
//! is 1 as well: the table is incomplete).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::cell::{Kind, WaitMode, TESTS, TRANSPORTS};
use super::plot::{write_png, Chart, Series};
use super::report::{format_table, PerfResult, Progress};
use super::{peers, spawn};

/// One child run of the suite.
#[derive(Clone, Debug)]
struct Group {
    test: &'static str,
    transport: &'static str,
    sizes: Vec<usize>,
    no_crc: bool,
    /// A cell a target (or its floor or ceiling) is read from:
    /// run three times as long in four alternated rounds.
    target: bool,
}

/// What `softrdma perf suite --help` says first.
pub(crate) const ABOUT: &str = "Runs the loopback matrix (test x transport x size), each \
    softrdma cell next to its raw-socket baseline measured just before it in the same child \
    process, and prints one table on stdout, progress on stderr; writes report.md and PNG \
    plots to --out DIR.\n\n\
    Every (test, transport) group runs as its own `softrdma perf TEST --json` process under \
    a deadline: a group that fails, crashes or overruns shows as failed cells with the \
    reason. The matrix has a time budget; groups that would start after it are reported as \
    skipped, not run.";

/// `softrdma perf suite [OPTIONS]`.
#[derive(Debug, clap::Args)]
#[command(
    after_long_help = "Exit status: 0 when every cell worked, 1 when a cell failed or \
    was skipped for the budget (the table is incomplete), 2 for a bad command line."
)]
pub(crate) struct SuiteOpts {
    /// A short run: five tests, sizes 64 and 64Ki, shorter cells, a 14 s
    /// budget.
    #[arg(long)]
    quick: bool,
    /// Where report.md and the PNG plots go (created if missing).
    #[arg(long, value_name = "DIR", default_value = "perf-report")]
    out: PathBuf,
    /// Also print every result as one JSON object per line on stdout.
    #[arg(long)]
    json: bool,
    /// Also run fi_pingpong (libfabric) and ucx_perftest (UCX), if
    /// installed.
    #[arg(long)]
    peers: bool,
    /// How both ends of every cell wait (softrdma and baselines alike).
    #[arg(long, value_name = "MODE", default_value = "poll", value_parser = super::cli::wait_arg())]
    wait: WaitMode,
    /// Time budget of the whole matrix in seconds, 1 to 3600 [default: 57;
    /// with --quick 14].
    #[arg(long, value_name = "SECONDS", value_parser = super::cli::budget_arg)]
    budget: Option<Duration>,
}

#[cfg(test)]
fn parse(args: &[String]) -> Result<SuiteOpts, String> {
    use clap::Parser;
    #[derive(Parser)]
    struct Suite {
        #[command(flatten)]
        o: SuiteOpts,
    }
    let argv = std::iter::once("suite".to_string()).chain(args.iter().cloned());
    Suite::try_parse_from(argv)
        .map(|s| s.o)
        .map_err(|e| e.to_string())
}

fn groups(o: &SuiteOpts) -> Vec<Group> {
    let sizes: Vec<usize> = if o.quick {
        vec![64, 64 << 10]
    } else {
        vec![64, 4 << 10, 64 << 10, 1 << 20]
    };
    let quick_tests = [
        "send_lat",
        "write_lat",
        "send_bw",
        "write_bw",
        "write_record_bw",
    ];
    let mut g = Vec::new();
    for tr in TRANSPORTS {
        for t in TESTS {
            if (tr.refuses)(t.op).is_some() {
                continue;
            }
            if o.quick && !quick_tests.contains(&t.name) {
                continue;
            }
            if t.name == "write_lat" && o.wait == WaitMode::Event {
                continue;
            }
            let sizes = match (t.fixed_size, t.kind) {
                (Some(f), _) => vec![f],
                // A 1 MiB ping-pong costs milliseconds a round trip; the
                // 1 MiB figures that matter are bandwidths.
                (None, Kind::Lat) => sizes.iter().copied().filter(|&s| s < 1 << 20).collect(),
                (None, Kind::Bw) => sizes.clone(),
            };
            g.push(Group {
                test: t.name,
                transport: tr.name,
                sizes,
                no_crc: false,
                target: false,
            });
        }
    }
    // RC Write bandwidth without MPA CRC (a target of its own).
    g.insert(
        0,
        Group {
            test: "write_bw",
            transport: "rc",
            sizes: if o.quick {
                vec![64 << 10]
            } else {
                vec![64 << 10, 1 << 20]
            },
            no_crc: true,
            target: false,
        },
    );
    // The floor of the RC latency targets: a raw TCP ping-pong framed as
    // RC Sends by the wire code alone, against the raw ping-pong.
    g.push(Group {
        test: "tcp_mpa_lat",
        transport: "tcp",
        sizes: vec![64],
        no_crc: false,
        target: false,
    });
    // The same for UD: a raw UDP ping-pong framed as UD Sends by the wire
    // code alone, against the raw ping-pong.
    g.push(Group {
        test: "udp_dgram_lat",
        transport: "udp",
        sizes: vec![64],
        no_crc: false,
        target: false,
    });
    // The bounds of the CRC target — a raw TCP stream that checksums what
    // it moves, and one framed as RC Writes with CRC, each FPDU's payload
    // read into place by its own readv and checksummed there — and the
    // floor of the no-CRC one (the same stream without CRC), each against
    // the raw stream.
    for test in ["tcp_mpa_crc_bw", "tcp_crc_bw", "tcp_mpa_bw"] {
        g.push(Group {
            test,
            transport: "tcp",
            sizes: if o.quick {
                vec![64 << 10]
            } else {
                vec![1 << 20]
            },
            no_crc: false,
            target: false,
        });
    }
    // The floor of "UD latency 15 % below RC": the raw UDP ping-pong
    // against the raw TCP one, alternated round by round.
    g.push(Group {
        test: "udp_lat",
        transport: "udp",
        sizes: vec![64],
        no_crc: false,
        target: false,
    });
    // And of the Write-Record target: the raw UDP blast doing the CRC and
    // placement work every datagram iWARP receiver must do.
    g.push(Group {
        test: "udp_crc_bw",
        transport: "udp",
        sizes: vec![64 << 10],
        no_crc: false,
        target: false,
    });
    // The cells of the targets first, so that a slow machine
    // spends its budget on them; the table is sorted back afterwards. A
    // bandwidth target's bounds run right behind it: the raw TCP stream
    // moves between states minutes apart, and a bound measured in another
    // state than its target says little about it.
    // (test, transport, without CRC)
    let first = [
        ("send_lat", "rc", false),
        ("write_lat", "rc", false),
        ("send_lat", "ud", false),
        ("write_bw", "rc", false),
        ("tcp_mpa_crc_bw", "tcp", false),
        ("tcp_crc_bw", "tcp", false),
        ("write_record_bw", "ud", false),
        ("udp_crc_bw", "udp", false),
        ("write_bw", "rc", true),
        ("tcp_mpa_bw", "tcp", false),
    ];
    g.sort_by_key(|x| {
        first
            .iter()
            .position(|&k| (x.test, x.transport, x.no_crc) == k)
            .unwrap_or(first.len())
    });
    // The target cells, and their floors and ceilings, run longer (see
    // `Group::target`): latency groups whole; a bandwidth target's size
    // leaves its group for one of its own (its other sizes are no target).
    // (`--quick` keeps its groups: it has no time for more children.)
    let mut out = Vec::with_capacity(g.len() + TARGET_BW.len());
    for mut x in g {
        if TARGET_LAT.contains(&(x.test, x.transport)) {
            x.target = true;
            out.push(x);
            continue;
        }
        let cells: Vec<usize> = if o.quick {
            Vec::new()
        } else {
            x.sizes
                .iter()
                .copied()
                .filter(|&s| TARGET_BW.contains(&(x.test, x.transport, s, x.no_crc)))
                .collect()
        };
        x.sizes.retain(|s| !cells.contains(s));
        let (test, transport, no_crc) = (x.test, x.transport, x.no_crc);
        if !x.sizes.is_empty() {
            out.push(x);
        }
        out.extend(cells.into_iter().map(|s| Group {
            test,
            transport,
            sizes: vec![s],
            no_crc,
            target: true,
        }));
    }
    out
}

/// Rows of the table: softrdma's, and baselines measured against another
/// baseline (`tcp_crc_bw`); the raw baselines are their ratio column.
fn table_row(r: &PerfResult) -> bool {
    !matches!(r.transport.as_str(), "tcp" | "udp") || r.baseline.is_some()
}

/// Table order: transport, then test as in the tables, CRC before no-CRC,
/// then size.
fn table_order(r: &PerfResult) -> (usize, usize, bool, u64) {
    (
        TRANSPORTS
            .iter()
            .position(|t| t.name == r.transport)
            .unwrap_or(usize::MAX),
        TESTS
            .iter()
            .position(|t| t.name == r.test)
            .unwrap_or(usize::MAX),
        r.crc == Some(false),
        r.size,
    )
}

/// Entry point of `softrdma perf suite ARGS`.
pub(crate) fn main(o: SuiteOpts) -> ExitCode {
    if let Err(e) = std::fs::create_dir_all(&o.out) {
        eprintln!(
            "softrdma perf suite: cannot create {}: {e}",
            o.out.display()
        );
        return ExitCode::from(1);
    }
    let started = Instant::now();
    let load_start = machine().3;
    let ticks_start = CpuTicks::now();
    let budget = o
        .budget
        .unwrap_or(Duration::from_secs(if o.quick { 14 } else { 57 }));
    let (lat_d, bw_d) = if o.quick { (0.04, 0.06) } else { (0.08, 0.12) };
    let gs = groups(&o);
    let mut rows: Vec<PerfResult> = Vec::new();
    let mut failed = false;
    // Cells not run because the budget was used up (a loaded machine).
    let mut skipped = 0usize;
    eprintln!(
        "softrdma perf suite: {} groups, {} cells, wait {}, budget {} s",
        gs.len(),
        gs.iter().map(|g| g.sizes.len()).sum::<usize>(),
        o.wait.name(),
        budget.as_secs()
    );
    let progress = Progress::new(gs.len() as u64);
    for (i, g) in gs.iter().enumerate() {
        let left = budget.saturating_sub(started.elapsed());
        let label = format!(
            "{} {}{}",
            g.test,
            g.transport,
            if g.no_crc { " no-crc" } else { "" }
        );
        let step = step_label(i, gs.len());
        progress.step(&label);
        if left < Duration::from_millis(300) {
            progress.line(&format!("{step} {label}: skipped (time budget used up)"));
            progress.inc();
            for &s in &g.sizes {
                rows.push(PerfResult::failed(
                    g.test,
                    g.transport,
                    s as u64,
                    o.wait.name(),
                    "skipped: the suite's time budget was used up",
                ));
            }
            skipped += g.sizes.len();
            continue;
        }
        let kind = super::cell::test_by_name(g.test).map(|t| t.kind);
        // Behind schedule (a loaded machine): shorten what is left so
        // every group still runs.
        let done = i.max(1) as f64;
        let per_group = started.elapsed().as_secs_f64() / done;
        let remaining = (gs.len() - i) as f64;
        let scale = if i == 0 {
            1.0
        } else {
            (left.as_secs_f64() / (per_group * remaining)).clamp(0.1, 1.0)
        };
        // The cells the targets are read from, and their floors
        // and ceilings, run three times as long in four alternated rounds:
        // a 64 B latency ratio taken from 0.08 s moved by 0.1 and more
        // between suite runs on this kind of host, a 1 MiB bandwidth ratio
        // from 0.12 s by 0.25 (about 8 s more in all).
        let d = scale
            * if kind == Some(Kind::Lat) { lat_d } else { bw_d }
            * if g.target { 3.0 } else { 1.0 };
        let sizes: Vec<String> = g.sizes.iter().map(|s| s.to_string()).collect();
        let mut args: Vec<String> = vec!["perf".into(), g.test.into()];
        // A baseline row (`tcp_crc_bw`) has its transport built in.
        if !matches!(g.transport, "tcp" | "udp") {
            args.extend(["--transport".into(), g.transport.into()]);
        }
        args.extend([
            "--sizes".into(),
            sizes.join(","),
            "--duration".into(),
            format!("{d:.4}"),
            "--warmup".into(),
            "10".into(),
            "--wait".into(),
            o.wait.name().into(),
            "--json".into(),
            "--rounds".into(),
            // Alternating rounds against load bursts, unless time is short.
            if o.quick || scale < 0.5 {
                "1"
            } else if g.target {
                "4"
            } else {
                "2"
            }
            .into(),
        ]);
        if g.no_crc {
            args.push("--no-crc".into());
        }
        let t0 = Instant::now();
        // Generous per group, but never past the end of the budget by much.
        let deadline = left.min(Duration::from_secs(20)) + Duration::from_secs(2);
        let (mut got, why) = run_child(&args, deadline);
        // Every size must have a softrdma row.
        for &s in &g.sizes {
            if !got.iter().any(|r| r.test == g.test && r.size == s as u64) {
                let reason = if why.is_empty() {
                    "no result".to_string()
                } else {
                    why.clone()
                };
                got.push(PerfResult::failed(
                    g.test,
                    g.transport,
                    s as u64,
                    o.wait.name(),
                    &reason,
                ));
            }
        }
        let bad = got.iter().filter(|r| r.error.is_some()).count();
        failed |= bad > 0;
        progress.line(&format!(
            "{step} {label}: {} ({:.1} s)",
            if bad == 0 {
                "ok".to_string()
            } else {
                format!("{bad} failed")
            },
            t0.elapsed().as_secs_f64()
        ));
        progress.inc();
        if o.json {
            for r in &got {
                println!("{}", r.to_json());
            }
        }
        rows.extend(got);
    }
    progress.finish();
    // UD against RC latency, alternated in one child: the cells above run
    // seconds apart, and this machine's TCP latency can change by half in
    // between, so their quotient is no comparison.
    let h2h = head_to_head(&o, budget.saturating_sub(started.elapsed()));
    failed |= h2h.iter().any(|r| r.error.is_some());
    if o.json {
        for r in &h2h {
            println!("{}", r.to_json());
        }
    }
    let mut peer_rows = Vec::new();
    let mut peers_found = String::from("peers: not asked for (--peers)");
    if o.peers {
        let peer_sizes: Vec<usize> = if o.quick {
            vec![64, 64 << 10]
        } else {
            vec![64, 4 << 10, 64 << 10, 1 << 20]
        };
        // Raw TCP right before and after each TCP-based peer's 64 B
        // latency run and its 64 KiB and 1 MiB bandwidth runs
        // (busy-polling, as the peers wait): the yardsticks of the "RC vs
        // best TCP peer" targets. Only when softrdma's cells busy-poll too,
        // so that both ratios are to the same kind of raw socket run.
        let mut yardstick = |kind: Kind, size: usize| {
            let (test, secs) = match kind {
                Kind::Lat => ("tcp_lat", "0.15"),
                Kind::Bw => ("tcp_bw", "0.3"),
            };
            let size = size.to_string();
            let args: Vec<String> = [
                "perf",
                "baseline",
                test,
                "--size",
                &size,
                "--duration",
                secs,
                "--warmup",
                "10",
                "--wait",
                "poll",
                "--json",
            ]
            .map(String::from)
            .into();
            let (got, _) = run_child(&args, Duration::from_secs(10));
            let r = got.iter().find(|r| r.test == test && r.error.is_none())?;
            match kind {
                Kind::Lat => r.lat_us_p50,
                Kind::Bw => r.bw_gbps,
            }
        };
        let (found, pr) = peers::run_all(
            &peer_sizes,
            None,
            o.wait,
            &mut |l| eprintln!("{l}"),
            (o.wait == WaitMode::Poll).then_some(&mut yardstick as peers::Yardstick<'_>),
        );
        peers_found = found;
        if let Some(n) = super::tcp_cc::peers_note() {
            peers_found.push_str(&format!("\nnote: {n}"));
        }
        eprintln!("{peers_found}");
        if o.json {
            for r in &pr {
                println!("{}", r.to_json());
            }
        }
        peer_rows = pr;
    }
    let wall = started.elapsed().as_secs_f64();
    let steal = ticks_start
        .zip(CpuTicks::now())
        .and_then(|(a, b)| a.steal_pct(b));
    let mut soft: Vec<PerfResult> = rows.iter().filter(|r| table_row(r)).cloned().collect();
    soft.sort_by_key(table_order);
    let target_lines = targets(&rows, &peer_rows, &h2h);
    let targets = targets_text(&target_lines);
    if !o.json {
        println!(
            "softrdma perf suite: loopback, two processes per cell, wait mode {} on both ends, \
             {}, {:.1} s, load average at start {load_start}, CPU steal during the run {}",
            o.wait.name(),
            super::tcp_cc::describe(),
            wall,
            steal_text(steal)
        );
        if let Some(w) = steal_warning(steal) {
            println!("{w}");
        }
        print!("{}", format_table(&soft));
        if !h2h.is_empty() {
            println!();
            println!("head to head: {H2H_WHAT}");
            print!("{}", format_table(&h2h));
        }
        if !peer_rows.is_empty() {
            println!();
            print!("{}", format_table(&peer_rows));
        }
        println!("{peers_found}");
        println!();
        println!("targets (same-run ratios):");
        print!("{targets}");
        println!(
            "latency: one way (round trip / 2), p50; ratio = softrdma / raw sockets of this run \
             (latency: lower is better; bandwidth: higher is better)"
        );
    }
    let plots = match write_plots(&o.out, &rows, &peer_rows) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("softrdma perf suite: plots: {e}");
            failed = true;
            Vec::new()
        }
    };
    let md = report_md(
        &o,
        (&rows, &h2h),
        &peer_rows,
        &peers_found,
        &targets,
        &plots,
        (wall, &load_start, steal),
    );
    let tj = o.out.join("targets.json");
    let json = serde_json::to_string_pretty(&target_lines).expect("targets serialize");
    if let Err(e) = std::fs::write(&tj, json + "\n") {
        eprintln!("softrdma perf suite: cannot write {}: {e}", tj.display());
        failed = true;
    }
    let path = o.out.join("report.md");
    if let Err(e) = std::fs::write(&path, md) {
        eprintln!("softrdma perf suite: cannot write {}: {e}", path.display());
        failed = true;
    } else {
        if let Some(w) = steal_warning(steal) {
            eprintln!("softrdma perf suite: {w}");
        }
        eprintln!(
            "softrdma perf suite: wrote {} and {} plots in {:.1} s{}{}",
            path.display(),
            plots.len(),
            wall,
            if skipped > 0 {
                format!(" ({skipped} cells skipped: the time budget was used up)")
            } else {
                String::new()
            },
            if failed { " (some cells FAILED)" } else { "" }
        );
    }
    if failed || skipped > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs `softrdma ARGS` (a `perf … --json` child) under `deadline`: the
/// result rows it printed, and why it failed (empty if it did not).
fn run_child(args: &[String], deadline: Duration) -> (Vec<PerfResult>, String) {
    match spawn::run_self(args, &[], deadline, &mut |_| {}) {
        Ok(out) => {
            let got = out
                .stdout
                .lines()
                .filter_map(PerfResult::from_json)
                .collect();
            let why = match out.status {
                Some(st) if st.success() => String::new(),
                Some(st) => last_line(&out.stderr).unwrap_or_else(|| format!("exit {st}")),
                None => format!("killed after {:.0} s (deadline)", deadline.as_secs_f64()),
            };
            (got, why)
        }
        Err(e) => (Vec::new(), format!("cannot run: {e}")),
    }
}

/// The step number a group's progress line starts with: `[ 3/26]`.
fn step_label(i: usize, n: usize) -> String {
    let w = n.to_string().len();
    format!("[{:>w$}/{n}]", i + 1)
}

fn last_line(s: &str) -> Option<String> {
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
}

fn find<'a>(
    rows: &'a [PerfResult],
    test: &str,
    tr: &str,
    size: u64,
    crc: Option<bool>,
) -> Option<&'a PerfResult> {
    rows.iter().find(|r| {
        r.test == test
            && r.transport == tr
            && r.size == size
            && r.error.is_none()
            && (crc.is_none() || r.crc == crc)
    })
}

/// What the head-to-head table is.
const H2H_WHAT: &str = "UD and RC 64 B send_lat alternated round by round in one \
    process pair (ratio = UD / RC)";

/// The head-to-head run (`H2H_WHAT`): one child, `perf send_lat
/// --transport ud --versus rc`, four rounds; nothing if less than two
/// seconds of the budget are left. A child that fails gives a failed row.
fn head_to_head(o: &SuiteOpts, left: Duration) -> Vec<PerfResult> {
    if left < Duration::from_secs(2) {
        eprintln!("head to head send_lat ud/rc: skipped (time budget used up)");
        return Vec::new();
    }
    let d = if o.quick { 0.3 } else { 0.8 };
    let args: Vec<String> = [
        "perf",
        "send_lat",
        "--transport",
        "ud",
        "--versus",
        "rc",
        "--size",
        "64",
        "--duration",
        &format!("{d}"),
        "--warmup",
        "10",
        "--wait",
        o.wait.name(),
        "--rounds",
        "4",
        "--json",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let t0 = Instant::now();
    let deadline = left.min(Duration::from_secs(10)) + Duration::from_secs(2);
    let (mut got, why) = run_child(&args, deadline);
    if !got.iter().any(|r| r.transport == "ud" && r.ratio.is_some()) {
        let why = if why.is_empty() { "no result" } else { &why };
        got.retain(|r| r.error.is_some());
        got.push(PerfResult::failed("send_lat", "ud", 64, o.wait.name(), why));
    }
    eprintln!(
        "head to head send_lat ud/rc: {} ({:.1} s)",
        if got.iter().any(|r| r.error.is_some()) {
            "failed"
        } else {
            "ok"
        },
        t0.elapsed().as_secs_f64()
    );
    got
}

/// The latency groups (test, transport) whose cells the targets
/// and their floors are read from.
const TARGET_LAT: [(&str, &str); 6] = [
    ("send_lat", "rc"),
    ("write_lat", "rc"),
    ("send_lat", "ud"),
    ("tcp_mpa_lat", "tcp"),
    ("udp_dgram_lat", "udp"),
    ("udp_lat", "udp"),
];

/// The bandwidth cells (test, transport, size, without CRC) the
/// targets and their floors and ceilings are read from.
const TARGET_BW: [(&str, &str, usize, bool); 7] = [
    ("write_bw", "rc", 1 << 20, false),
    ("write_bw", "rc", 1 << 20, true),
    ("tcp_mpa_crc_bw", "tcp", 1 << 20, false),
    ("tcp_crc_bw", "tcp", 1 << 20, false),
    ("tcp_mpa_bw", "tcp", 1 << 20, false),
    ("write_record_bw", "ud", 64 << 10, false),
    ("udp_crc_bw", "udp", 64 << 10, false),
];

/// One line of the targets block: a same-run ratio, and the bound it
/// should keep when it is a target. Written to `targets.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
struct TargetLine {
    /// What is compared (`floor: …`, `ceiling: …` for the bounds).
    name: String,
    /// `target`; or, beside the target above it, `floor`, `ceiling`, or
    /// `detail` (the same figure read another way).
    kind: &'static str,
    /// The ratio this run measured; `null` when a cell is missing.
    ratio: Option<f64>,
    /// A target's comparison: `<=` or `>=` (`null` beside a target).
    bound: Option<&'static str>,
    /// A target's limit (`null` beside a target).
    limit: Option<f64>,
    /// Printed indented, under the target it belongs to.
    #[serde(skip)]
    indent: bool,
    /// The bound as printed (`<= 1.10`; `-` beside a target).
    #[serde(skip)]
    shown: String,
}

/// The targets block as printed: `name ratio (target BOUND LIMIT)`, the
/// lines beside a target without the parenthesis.
fn targets_text(lines: &[TargetLine]) -> String {
    let mut s = String::new();
    for l in lines {
        let v = l
            .ratio
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| "n/a".into());
        let name = format!("{}{}", if l.indent { "  " } else { "" }, l.name);
        // Floors, ceilings and details bound or explain the target above
        // them; they have no target of their own.
        let target = match l.bound {
            Some(_) => format!("   (target {})", l.shown),
            None => String::new(),
        };
        let _ = writeln!(s, "  {name:<52} {v:>6}{target}");
    }
    s
}

/// The performance targets (same-run ratios, see `docs/performance.md`),
/// each followed by the floors, ceilings and other readings that go with
/// it.
fn targets(rows: &[PerfResult], peers: &[PerfResult], h2h: &[PerfResult]) -> Vec<TargetLine> {
    let mut s = Vec::new();
    let mut line = |name: &str, v: Option<f64>, target: &str| {
        let indent = name.starts_with("  ");
        let name = name.trim_start();
        let kind = if !indent {
            "target"
        } else if name.starts_with("floor:") {
            "floor"
        } else if name.starts_with("ceiling:") {
            "ceiling"
        } else {
            "detail"
        };
        let (bound, limit) = match target.split_once(' ') {
            Some(("<=", x)) => (Some("<="), x.parse().ok()),
            Some((">=", x)) => (Some(">="), x.parse().ok()),
            _ => (None, None),
        };
        s.push(TargetLine {
            name: name.to_string(),
            kind,
            ratio: v,
            bound,
            limit,
            indent,
            shown: target.to_string(),
        });
    };
    let ratio = |t: &str, tr: &str, size: u64, crc: Option<bool>| {
        find(rows, t, tr, size, crc).and_then(|r| r.ratio)
    };
    line(
        "RC 64 B send_lat / raw TCP ping-pong",
        ratio("send_lat", "rc", 64, None),
        "<= 1.10",
    );
    line(
        "RC 64 B write_lat / raw TCP ping-pong",
        ratio("write_lat", "rc", 64, None),
        "<= 1.10",
    );
    line(
        "  floor: raw TCP ping-pong framed as RC Sends / raw",
        ratio("tcp_mpa_lat", "tcp", 64, None),
        "-",
    );
    line(
        "UD 64 B send_lat / raw UDP ping-pong",
        ratio("send_lat", "ud", 64, None),
        "<= 1.10",
    );
    line(
        "  floor: raw UDP ping-pong framed as UD Sends / raw",
        ratio("udp_dgram_lat", "udp", 64, None),
        "-",
    );
    let ud_rc = match (
        find(rows, "send_lat", "ud", 64, None).and_then(|r| r.lat_us_p50),
        find(rows, "send_lat", "rc", 64, None).and_then(|r| r.lat_us_p50),
    ) {
        (Some(u), Some(r)) if r > 0.0 => Some(u / r),
        _ => None,
    };
    let alternated = h2h
        .iter()
        .find(|r| r.transport == "ud" && r.error.is_none())
        .and_then(|r| r.ratio);
    line(
        "UD 64 B send_lat / RC 64 B send_lat, alternated",
        alternated,
        "<= 0.85",
    );
    line("  the two cells above (measured apart)", ud_rc, "-");
    // The udp_lat row measured against tcp_lat (the UD cells' own udp_lat
    // baselines carry no ratio).
    let raw_udp_tcp = rows
        .iter()
        .find(|r| {
            r.test == "udp_lat"
                && r.size == 64
                && r.error.is_none()
                && r.baseline.as_deref() == Some("tcp_lat")
        })
        .and_then(|r| r.ratio);
    line(
        "  floor: raw UDP / raw TCP ping-pong, alternated",
        raw_udp_tcp,
        "-",
    );
    line(
        "RC write_bw 1 MiB, CRC on / raw TCP stream",
        ratio("write_bw", "rc", 1 << 20, Some(true)),
        ">= 0.90",
    );
    line(
        "  ceiling: raw TCP stream + CRC32C both ends / raw",
        ratio("tcp_crc_bw", "tcp", 1 << 20, None),
        "-",
    );
    line(
        "  floor: raw TCP stream as RC Writes with CRC / raw",
        ratio("tcp_mpa_crc_bw", "tcp", 1 << 20, None),
        "-",
    );
    // The engine's share: RC 1 MiB Writes (with CRC or not) against the
    // protocol's own floor, each against the raw stream of its own moment.
    let rc_over_floor = |crc: bool, floor: &str| match (
        ratio("write_bw", "rc", 1 << 20, Some(crc)),
        ratio(floor, "tcp", 1 << 20, None),
    ) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    line(
        "  RC / that floor, each against raw of its moment",
        rc_over_floor(true, "tcp_mpa_crc_bw"),
        "-",
    );
    line(
        "RC write_bw 1 MiB, CRC off / raw TCP stream",
        ratio("write_bw", "rc", 1 << 20, Some(false)),
        ">= 0.95",
    );
    line(
        "  floor: raw TCP stream as RC Writes, no CRC / raw",
        ratio("tcp_mpa_bw", "tcp", 1 << 20, None),
        "-",
    );
    line(
        "  RC / that floor, each against raw of its moment",
        rc_over_floor(false, "tcp_mpa_bw"),
        "-",
    );
    line(
        "UD write_record_bw 64 KiB / raw UDP blast",
        ratio("write_record_bw", "ud", 64 << 10, None),
        ">= 0.90",
    );
    line(
        "  ceiling: raw UDP blast + CRC32C + placement / raw",
        ratio("udp_crc_bw", "udp", 64 << 10, None),
        "-",
    );
    // Peers: best TCP-based peer and libfabric udp;ofi_rxd.
    // The peers' rows of one kind and size: TCP-based, or libfabric's rxd.
    let matching = |kind_lat: bool, size: u64, tcp: bool| {
        peers.iter().filter(move |r| {
            r.error.is_none()
                && r.size == size
                && r.is_lat() == kind_lat
                && (r.transport.contains("tcp") == tcp)
                && (tcp || r.transport.contains("rxd"))
        })
    };
    let best = |kind_lat: bool, size: u64, tcp: bool| -> Option<f64> {
        let vals = matching(kind_lat, size, tcp);
        if kind_lat {
            vals.filter_map(|r| r.lat_us_p50).min_by(f64::total_cmp)
        } else {
            vals.filter_map(|r| r.bw_gbps).max_by(f64::total_cmp)
        }
    };
    let rel = |mine: Option<f64>, theirs: Option<f64>| match (mine, theirs) {
        (Some(m), Some(t)) if t > 0.0 => Some(m / t),
        _ => None,
    };
    if !peers.is_empty() {
        let lat =
            |t: &str, tr: &str, size: u64| find(rows, t, tr, size, None).and_then(|r| r.lat_us_p50);
        let bw = |t: &str, tr: &str, size: u64| {
            find(rows, t, tr, size, Some(true))
                .or_else(|| find(rows, t, tr, size, None))
                .and_then(|r| r.bw_gbps)
        };
        line(
            "RC 64 B send_lat / best TCP peer latency",
            rel(lat("send_lat", "rc", 64), best(true, 64, true)),
            "<= 1.05",
        );
        // Through raw TCP of each one's moment: RC's ratio to its
        // alternated raw ping-pong over the lowest ratio of a TCP peer to
        // the raw ping-pongs run just before and after it (the peer
        // closest to raw TCP, which need not be the fastest in µs above;
        // fi_pingpong reports a mean, the others a median).
        let peer_ratio = matching(true, peers::YARDSTICK_SIZE as u64, true)
            .filter_map(|r| r.ratio)
            .min_by(f64::total_cmp);
        line(
            "  each against raw TCP of its own moment",
            rel(
                find(rows, "send_lat", "rc", 64, None).and_then(|r| r.ratio),
                peer_ratio,
            ),
            "-",
        );
        // The peers check no payload end to end (TCP's checksum is the
        // only one), so RC is also shown as they run: without the MPA CRC.
        let bw_no_crc = |t: &str, tr: &str, size: u64| {
            find(rows, t, tr, size, Some(false)).and_then(|r| r.bw_gbps)
        };
        for (label, size) in [("64 KiB", 64u64 << 10), ("1 MiB", 1 << 20)] {
            line(
                &format!("RC write_bw {label} / best TCP peer bandwidth"),
                rel(bw("write_bw", "rc", size), best(false, size, true)),
                ">= 1.0",
            );
            line(
                "  RC without CRC, as the peers run / best peer",
                rel(bw_no_crc("write_bw", "rc", size), best(false, size, true)),
                "-",
            );
            // Through raw TCP of each one's moment: RC's ratio to its raw
            // stream over the highest ratio of a TCP-based peer to the raw
            // streams run just before and after it.
            let peer_ratio = matching(false, size, true)
                .filter_map(|r| r.ratio)
                .max_by(f64::total_cmp);
            let rc_ratio =
                |crc: bool| find(rows, "write_bw", "rc", size, Some(crc)).and_then(|r| r.ratio);
            line(
                "  each against raw TCP of its own moment (CRC)",
                rel(rc_ratio(true), peer_ratio),
                "-",
            );
            line(
                "  each against raw TCP of its own moment (no CRC)",
                rel(rc_ratio(false), peer_ratio),
                "-",
            );
        }
        line(
            "RD write_bw 64 KiB / libfabric udp;ofi_rxd bandwidth",
            rel(bw("write_bw", "rd", 64 << 10), best(false, 64 << 10, false)),
            ">= 3",
        );
        line(
            "RD 64 B send_lat / libfabric udp;ofi_rxd latency",
            rel(lat("send_lat", "rd", 64), best(true, 64, false)),
            "<= 0.8",
        );
    }
    s
}

/// A peer's series in the plots: short enough for the legend (17
/// characters) and distinct per provider — "fi tcp", "fi tcp;ofi_rxm",
/// "fi udp;ofi_rxd", "ucx tcp" (the test name is the chart's kind).
fn peer_series_name(test: &str, transport: &str) -> String {
    if test.starts_with("fi_") {
        format!("fi {transport}")
    } else {
        transport.to_string()
    }
}

/// The lines of one chart: every test measured over `transport` (latency
/// or bandwidth), the raw-socket baseline, the peers; each line's points
/// by message size.
fn chart_series(
    transport: &str,
    stream: bool,
    lat: bool,
    rows: &[PerfResult],
    peers: &[PerfResult],
) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    let base = if stream {
        if lat {
            "tcp_lat"
        } else {
            "tcp_bw"
        }
    } else if lat {
        "udp_lat"
    } else {
        "udp_bw"
    };
    let mut names: Vec<(String, bool)> = Vec::new();
    for r in rows
        .iter()
        .filter(|r| r.transport == transport && r.is_lat() == lat)
    {
        let key = (r.test.clone(), r.crc == Some(false));
        if !names.contains(&key) {
            names.push(key);
        }
    }
    for (test, nocrc) in &names {
        let mut pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| {
                &r.test == test
                    && r.transport == transport
                    && (r.crc == Some(false)) == *nocrc
                    && r.error.is_none()
            })
            .filter_map(|r| Some((r.size as f64, if lat { r.lat_us_p50? } else { r.bw_gbps? })))
            .collect();
        // By size: the rows are in the order the cells ran, and a
        // cell measured again later (the targets' cells) would
        // otherwise draw its line back across the chart.
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        series.push(Series {
            name: format!("{test}{}", if *nocrc { " nocrc" } else { "" }),
            points: pts,
        });
    }
    // The baseline: median over the groups' same-run measurements.
    let mut sizes: Vec<u64> = rows
        .iter()
        .filter(|r| r.test == base && r.error.is_none())
        .map(|r| r.size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let pts: Vec<(f64, f64)> = sizes
        .iter()
        .filter_map(|&s| {
            let mut v: Vec<f64> = rows
                .iter()
                .filter(|r| r.test == base && r.size == s && r.error.is_none())
                .filter_map(|r| if lat { r.lat_us_p50 } else { r.bw_gbps })
                .collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).map(|m| (s as f64, *m))
        })
        .collect();
    if !pts.is_empty() {
        series.push(Series {
            name: format!("raw {base}"),
            points: pts,
        });
    }
    for p in peers
        .iter()
        .filter(|p| p.is_lat() == lat && p.error.is_none())
    {
        let name = peer_series_name(&p.test, &p.transport);
        if series.iter().any(|s| s.name == name) {
            continue;
        }
        let pts: Vec<(f64, f64)> = peers
            .iter()
            .filter(|q| q.test == p.test && q.transport == p.transport && q.error.is_none())
            .filter_map(|q| Some((q.size as f64, if lat { q.lat_us_p50? } else { q.bw_gbps? })))
            .collect();
        series.push(Series { name, points: pts });
    }
    series
}

/// Latency and bandwidth vs size, one chart each per transport.
fn write_plots(
    out: &Path,
    rows: &[PerfResult],
    peers: &[PerfResult],
) -> std::io::Result<Vec<String>> {
    let mut files = Vec::new();
    for tr in TRANSPORTS {
        for lat in [true, false] {
            let series = chart_series(tr.name, tr.stream, lat, rows, peers);
            let file = format!(
                "{}_{}.png",
                if lat { "latency" } else { "bandwidth" },
                tr.name
            );
            let title = format!(
                "{} {} vs message size (loopback)",
                tr.name.to_uppercase(),
                if lat {
                    "one-way latency p50"
                } else {
                    "bandwidth"
                }
            );
            let chart = Chart {
                title: &title,
                x_label: "message size (octets)",
                y_label: if lat {
                    "one-way latency p50 (µs)"
                } else {
                    "bandwidth (Gbit/s)"
                },
                log_x: true,
                log_y: true,
                series: &series,
            };
            write_png(&chart, &out.join(&file))?;
            files.push(file);
        }
    }
    Ok(files)
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The machine the suite ran on: (nproc, kernel, CPU model, load).
pub(crate) fn machine() -> (usize, String, String, String) {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = read_trim("/proc/sys/kernel/osrelease");
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    (nproc, kernel, cpu, read_trim("/proc/loadavg"))
}

/// The machine's CPU time counters (`/proc/stat`, the `cpu` line), in clock
/// ticks summed over all CPUs: all of it, and the part a hypervisor ran
/// other guests in while this one had work (*steal*). On a shared virtual
/// machine steal comes in bursts; a run during one measures its cells at
/// different machine speeds, which same-run ratios cannot correct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuTicks {
    total: u64,
    steal: u64,
}

/// Steal at or above this share of a run's CPU time makes the suite warn
/// that its cells are not comparable.
pub(crate) const STEAL_WARN_PCT: f64 = 5.0;

impl CpuTicks {
    /// The counters now; `None` where `/proc/stat` is missing or unlike
    /// Linux's.
    pub(crate) fn now() -> Option<CpuTicks> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The `cpu` line of a `/proc/stat` text: user, nice, system, idle,
    /// iowait, irq, softirq, steal (guest time, when present, is already in
    /// user and nice).
    pub(crate) fn parse(stat: &str) -> Option<CpuTicks> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if v.len() < 8 {
            return None;
        }
        Some(CpuTicks {
            total: v[..8].iter().sum(),
            steal: v[7],
        })
    }

    /// Percent of the CPU time from `self` to `later` that was stolen;
    /// `None` if no time passed (or the counters went back).
    pub(crate) fn steal_pct(self, later: CpuTicks) -> Option<f64> {
        let total = later.total.checked_sub(self.total).filter(|&t| t > 0)?;
        let steal = later.steal.checked_sub(self.steal)?;
        Some(100.0 * steal as f64 / total as f64)
    }
}

/// The run's steal as the header and report print it (`n/a` without
/// counters).
fn steal_text(steal: Option<f64>) -> String {
    steal.map_or_else(|| "n/a".into(), |p| format!("{p:.1} %"))
}

/// The warning for a run with `steal` percent stolen, if it reaches
/// [`STEAL_WARN_PCT`].
pub(crate) fn steal_warning(steal: Option<f64>) -> Option<String> {
    steal.filter(|&p| p >= STEAL_WARN_PCT).map(|p| {
        format!(
            "warning: the hypervisor took {p:.1} % of this machine's CPU time during the run \
             (steal); cells measured at different moments ran at different speeds, so \
             ratios between them are unreliable: run the suite again"
        )
    })
}

/// Now, UTC, as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn report_md(
    o: &SuiteOpts,
    (rows, h2h): (&[PerfResult], &[PerfResult]),
    peers: &[PerfResult],
    peers_found: &str,
    targets: &str,
    plots: &[String],
    (wall, load_start, steal): (f64, &str, Option<f64>),
) -> String {
    let (nproc, kernel, cpu, load) = machine();
    let mut soft: Vec<PerfResult> = rows.iter().filter(|r| table_row(r)).cloned().collect();
    soft.sort_by_key(table_order);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# softrdma perf suite{}\n",
        if o.quick { " (quick)" } else { "" }
    );
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(s, "| date | {} |", utc_now());
    let _ = writeln!(s, "| nproc | {nproc} |");
    let _ = writeln!(s, "| kernel | {kernel} |");
    let _ = writeln!(s, "| CPU | {cpu} |");
    let _ = writeln!(s, "| load average (start / end) | {load_start} / {load} |");
    let _ = writeln!(
        s,
        "| CPU steal during the run (time a hypervisor gave other guests) | {} |",
        steal_text(steal)
    );
    let _ = writeln!(
        s,
        "| wait mode | {} on both ends, softrdma and baselines alike |",
        o.wait.name()
    );
    let _ = writeln!(
        s,
        "| TCP congestion control | {}, on every connection of the run, raw sockets and RC alike{} |",
        super::tcp_cc::summary(),
        if o.peers && super::tcp_cc::peers_note().is_some() {
            "; the peers, which open their own sockets, run the system default"
        } else {
            ""
        }
    );
    let _ = writeln!(s, "| wall time | {wall:.1} s |");
    let _ = writeln!(
        s,
        "| MPA CRC (RC) | on, except rows marked no-crc |\n| datagram MTU | {} |\n",
        super::cell::dgram_mtu()
    );
    if let Some(w) = steal_warning(steal) {
        let _ = writeln!(s, "**{w}**\n");
    }
    let _ = writeln!(s, "## Results\n\n```text\n{}```\n", format_table(&soft));
    if !h2h.is_empty() {
        let _ = writeln!(
            s,
            "## Head to head\n\n{H2H_WHAT}.\n\n```text\n{}```\n",
            format_table(h2h)
        );
    }
    if !peers.is_empty() {
        let _ = writeln!(s, "## Peers\n\n```text\n{}```\n", format_table(peers));
    }
    let _ = writeln!(s, "{peers_found}\n");
    let _ = writeln!(
        s,
        "## Targets (same-run ratios)\n\n```text\n{targets}```\n\n\
         The same figures as numbers: `targets.json`.\n"
    );
    let _ = writeln!(s, "## Plots\n");
    for p in plots {
        let _ = writeln!(s, "![{p}]({p})\n");
    }
    let _ = writeln!(
        s,
        "## How to read it\n\n\
* Every row is one cell: a test (`send_lat`, `write_bw`, …) over a transport \
(`rc` = iWARP over TCP, `ud`/`rd` = datagram iWARP over UDP) at one message size, \
measured on loopback with the two ends in two processes.\n\
* `*_lat` rows: one-way latency = round trip / 2, p50 and p99 from an HDR \
histogram (3 significant digits) of every round trip. `*_bw` rows: goodput in Gbit/s of message octets and \
the message rate.\n\
* `baseline` / `ratio`: the raw-socket test of the same size and wait mode, measured \
alternately with the cell (two rounds each; the cells the targets below are read from, \
and their floors and ceilings, four rounds over three times the duration) by the same process pair (RC against raw TCP, UD and RD against \
raw UDP cut into datagrams of softrdma's payload size). Latency ratio = softrdma / \
baseline (below 1 is faster than raw sockets); bandwidth ratio = softrdma / baseline \
(above 1 is faster). Only these same-run ratios are meaningful: absolute figures on a \
shared 2-core VM swing by several times between runs.\n\
* Head to head: UD and RC 64 B `send_lat` alternated round by round in one process \
pair, ratio UD / RC; the UD/RC target is read from it, not from the two cells, which \
ran seconds apart.\n\
* Reliable transports (RC, RD) are timed up to proof that the receiver has everything; \
UD and the raw UDP blast are counted at the receiver (what arrived), `lost` says how \
many messages did not. A UD Write raises nothing at its target, so UD `write_bw` is the \
sender's rate (noted in the row).\n\
* Rows with transport `tcp`/`udp` are references, each against its raw baseline: \
`tcp_crc_bw` (raw stream + CRC32C at both ends) and `udp_crc_bw` (raw blast + CRC32C \
trailer + placement copy) are the ceilings of CRC'd RC and datagram bandwidth; \
`tcp_mpa_lat` (raw ping-pong of RC Send FPDUs built and checked by the wire code \
alone) is the floor of RC latency: what the protocol costs without the engine, \
and `udp_dgram_lat` (raw ping-pong of UD Send datagrams, likewise) that of UD latency; \
`tcp_mpa_bw` (raw stream of RC Write FPDUs without CRC, each payload read into place \
by its own `readv` after its header) is the floor of RC Write bandwidth without CRC, \
and `tcp_mpa_crc_bw` (the same stream with the MPA CRC32C computed by the sender and \
checked by the receiver over the placed payload) the floor of RC Write bandwidth with \
CRC; \"RC / that floor\" is the engine's share of a bandwidth target; \
`udp_lat` against `tcp_lat` (the raw UDP ping-pong alternated with the raw TCP one) \
is the floor of the UD/RC latency target: how far below TCP raw UDP itself is.\n\
* `ERROR:` rows are cells that failed, with the reason; the suite's exit code is then 1.\n"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_lines_run_by_size_whatever_order_the_cells_ran_in() {
        // The target cells run first (write_record_bw ud 64 KiB), the
        // matrix after: the line must still go 64 B, 4 KiB, 64 KiB, 1 MiB.
        let bw = |test: &str, size: u64, g: f64| {
            let mut r = PerfResult::new(test, "ud", size, "poll");
            r.bw_gbps = Some(g);
            r
        };
        let rows = vec![
            bw("write_record_bw", 64 << 10, 15.0),
            bw("udp_bw", 64 << 10, 25.0),
            bw("write_record_bw", 64, 0.1),
            bw("write_record_bw", 4 << 10, 4.5),
            bw("write_record_bw", 1 << 20, 19.0),
            bw("udp_bw", 64, 0.2),
        ];
        let series = chart_series("ud", false, false, &rows, &[]);
        let wr = series
            .iter()
            .find(|s| s.name == "write_record_bw")
            .expect("a write_record_bw line");
        let xs: Vec<f64> = wr.points.iter().map(|p| p.0).collect();
        assert_eq!(xs, vec![64.0, 4096.0, 65536.0, 1048576.0]);
        let raw = series
            .iter()
            .find(|s| s.name == "raw udp_bw")
            .expect("a raw line");
        assert_eq!(
            raw.points.iter().map(|p| p.0).collect::<Vec<_>>(),
            vec![64.0, 65536.0]
        );
        // A latency chart of these rows has no line at all.
        assert!(chart_series("ud", false, true, &rows, &[]).is_empty());
    }

    #[test]
    fn targets_are_lines_and_numbers() {
        let mut rc = PerfResult::new("send_lat", "rc", 64, "poll");
        rc.lat_us_p50 = Some(5.5);
        rc.ratio = Some(1.04);
        let lines = targets(&[rc], &[], &[]);
        let first = &lines[0];
        assert_eq!(first.kind, "target");
        assert_eq!(first.ratio, Some(1.04));
        assert_eq!((first.bound, first.limit), (Some("<="), Some(1.10)));
        let floor = lines.iter().find(|l| l.kind == "floor").unwrap();
        assert!(floor.name.starts_with("floor: ") && floor.limit.is_none());
        let text = targets_text(&lines);
        assert!(
            text.lines()
                .next()
                .unwrap()
                .ends_with("1.04   (target <= 1.10)"),
            "{text}"
        );
        // A floor is printed without a target of its own.
        let floor_line = text.lines().find(|l| l.contains("floor: ")).unwrap();
        assert!(!floor_line.contains("(target"), "{text}");
        assert!(
            text.contains("    floor: raw TCP ping-pong framed"),
            "{text}"
        );
        let j: serde_json::Value = serde_json::to_value(&lines).unwrap();
        assert_eq!(j[0]["ratio"], serde_json::json!(1.04));
        assert_eq!(j[0]["limit"], serde_json::json!(1.10));
        assert!(j[0].get("shown").is_none());
    }

    #[test]
    fn dates_and_step_labels() {
        let d = utc_now();
        assert!(
            d.len() == 23 && d.ends_with(" UTC") && d.starts_with("20"),
            "{d}"
        );
        assert_eq!(step_label(0, 2), "[1/2]");
        assert_eq!(step_label(2, 26), "[ 3/26]");
    }

    #[test]
    fn target_cells_run_apart_and_every_cell_runs_once() {
        let full = parse(&[]).unwrap();
        let gs = groups(&full);
        let cells = |gs: &[Group]| {
            let mut v: Vec<_> = gs
                .iter()
                .flat_map(|g| g.sizes.iter().map(|&s| (g.test, g.transport, s, g.no_crc)))
                .collect();
            v.sort();
            v
        };
        let all = cells(&gs);
        let mut once = all.clone();
        once.dedup();
        assert_eq!(once, all, "a cell in two groups");
        // Each bandwidth target is a group of its own, marked, and no other
        // bandwidth group is.
        for t in TARGET_BW {
            let own: Vec<&Group> = gs
                .iter()
                .filter(|g| (g.test, g.transport, g.no_crc) == (t.0, t.1, t.3))
                .filter(|g| g.sizes.contains(&t.2))
                .collect();
            assert_eq!(own.len(), 1, "{t:?}");
            assert!(own[0].target && own[0].sizes == [t.2], "{t:?}");
        }
        // The same group's other sizes stay, unmarked, in one group.
        let rc_write: Vec<&Group> = gs
            .iter()
            .filter(|g| g.test == "write_bw" && g.transport == "rc" && !g.no_crc)
            .collect();
        assert_eq!(rc_write.len(), 2);
        assert!(rc_write
            .iter()
            .any(|g| !g.target && g.sizes == [64, 4 << 10, 64 << 10]));
        for g in &gs {
            let lat = TARGET_LAT.contains(&(g.test, g.transport));
            let bw = g.sizes.len() == 1
                && TARGET_BW.contains(&(g.test, g.transport, g.sizes[0], g.no_crc));
            assert_eq!(g.target, lat || bw, "{} {}", g.test, g.transport);
        }
        // A bandwidth target's bounds run right behind it (the raw stream
        // changes state between minutes).
        let at = |test: &str, transport: &str, size: usize, no_crc: bool| {
            gs.iter()
                .position(|g| {
                    (g.test, g.transport, g.no_crc) == (test, transport, no_crc)
                        && g.sizes.contains(&size)
                })
                .unwrap_or_else(|| panic!("no group for {test} {transport} {size}"))
        };
        let rc_crc = at("write_bw", "rc", 1 << 20, false);
        assert_eq!(at("tcp_mpa_crc_bw", "tcp", 1 << 20, false), rc_crc + 1);
        assert_eq!(at("tcp_crc_bw", "tcp", 1 << 20, false), rc_crc + 2);
        let wr = at("write_record_bw", "ud", 64 << 10, false);
        assert_eq!(at("udp_crc_bw", "udp", 64 << 10, false), wr + 1);
        assert_eq!(
            at("tcp_mpa_bw", "tcp", 1 << 20, false),
            at("write_bw", "rc", 1 << 20, true) + 1
        );
        // --quick splits nothing: the same cells as its groups had.
        let quick = parse(&["--quick".to_string()]).unwrap();
        let qs = groups(&quick);
        assert!(qs
            .iter()
            .all(|g| !g.target || TARGET_LAT.contains(&(g.test, g.transport))));
        let q = cells(&qs);
        let mut qd = q.clone();
        qd.dedup();
        assert_eq!(qd, q);
    }

    #[test]
    fn peer_series_fit_the_legend_and_stay_apart() {
        let names: Vec<String> = [
            ("fi_pingpong_lat", "tcp"),
            ("fi_pingpong_lat", "tcp;ofi_rxm"),
            ("fi_pingpong_lat", "udp;ofi_rxd"),
            ("ucx_tag_lat", "ucx tcp"),
        ]
        .iter()
        .map(|(t, tr)| peer_series_name(t, tr))
        .collect();
        for (i, n) in names.iter().enumerate() {
            assert!(n.chars().count() <= 17, "{n}");
            assert!(!names[..i].contains(n), "{n} twice");
        }
        assert_eq!(names[1], "fi tcp;ofi_rxm");
    }

    #[test]
    fn steal_is_the_stolen_share_of_all_cpu_time() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let a = "cpu  100 0 50 800 10 0 20 20 7 0\ncpu0 50 0 25 400 5 0 10 10 0 0\n";
        let b = "cpu  160 0 80 900 10 0 30 120 9 0\ncpu0 80 0 40 450 5 0 15 60 0 0\n";
        let (a, b) = (CpuTicks::parse(a).unwrap(), CpuTicks::parse(b).unwrap());
        // 300 ticks passed (60 + 30 + 100 + 10 + 100), 100 of them stolen;
        // guest time is not counted twice.
        assert_eq!(a.total, 1000);
        let p = a.steal_pct(b).unwrap();
        assert!((p - 100.0 / 3.0).abs() < 1e-9, "{p}");
        assert!(steal_warning(Some(p)).unwrap().contains("33.3 %"));
        assert_eq!(steal_text(Some(p)), "33.3 %");
        assert!(steal_warning(Some(STEAL_WARN_PCT - 0.1)).is_none());
        assert!(steal_warning(None).is_none());
        assert_eq!(steal_text(None), "n/a");
        // No time passed, counters reset, or a kernel without steal.
        assert_eq!(a.steal_pct(a), None);
        assert_eq!(b.steal_pct(a), None);
        assert_eq!(CpuTicks::parse("cpu  1 2 3 4 5 6 7\n"), None);
        assert_eq!(CpuTicks::parse("intr 5\n"), None);
        // This machine's own counters parse (every Linux since 2.6.11).
        if std::path::Path::new("/proc/stat").exists() {
            assert!(CpuTicks::now().is_some());
        }
    }
}
