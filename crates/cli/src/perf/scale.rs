//! `softrdma perf scale`: what one server pays per peer.
//!
//! For each transport and each N (1, 10, 100, 1 000, 10 000 client
//! endpoints), one server process and ⌈N / 2 500⌉ client processes on
//! 127.0.0.1 (this binary re-run with hidden `--role` arguments; see
//! `scale/roles.rs`). Each client endpoint exchanges one request and
//! reply with the server; then everything stays idle, endpoints open,
//! for twice the RD idle expiry set for the run (`--idle-ms`, default
//! 1 000 ms) plus half a second. Reported per (transport, N):
//!
//! * **setup**: time from telling the clients to start until the server
//!   has served all N peers (RC: connection + first message; UD/RD: first
//!   message), and that per peer;
//! * **server memory**: resident set size (`VmRSS` of the server process)
//!   before any peer, after setup, and after the idle period, and the
//!   idle figure's growth divided by N ("per idle peer"); RSS moves in
//!   pages and the allocator may keep freed memory, so small N are noisy;
//! * **state**: open descriptors of the server; for RD the peer entries
//!   still alive after the idle period (the expiry must have removed
//!   them); for RC the connections held;
//! * **idle poll**: one empty poll of the server's CQ after the idle
//!   period (mean of 200), every peer still open: what a busy-polling
//!   server pays per spin with N peers on one CQ (the RC server has all N
//!   connections on it).
//!
//! RC needs a descriptor per connection: the processes are started with
//! `ulimit -n` raised to N + 1 024; when the system does not allow that,
//! the row says so instead of a figure. Transports are table-driven
//! ([`TRANSPORTS`]). DC (SoftDC): the server has one DCT and one DCI, at
//! most 16 RC connections at a time (its table); each client endpoint is
//! a DCT of its own (one UD socket: a descriptor per endpoint in the
//! clients), so every reply needs a connection, made and evicted through
//! the server's table; "live peer state" is the table's slots in use and
//! the connections it closed (evicted or idle).
//!
//! Output: table on stdout, progress on stderr, `scale.md`, `scale.csv`,
//! `scale.jsonl` and two PNG plots in `--out DIR`; `--json` prints the
//! JSON lines instead of the table. Exit status: 0 done, 1 failed,
//! 2 bad arguments.

mod roles;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use self::roles::Kind;
use super::loss::proc::{load_note, progress, role_command, Kv, Proc};
use super::loss::write_file;
use super::plot::{write_png, Chart, Series};

/// What `softrdma perf scale --help` says first.
pub(crate) const ABOUT: &str = "Measures what one server process pays per peer: for each \
    transport and N = 1, 10, 100, 1 000 and 10 000 client endpoints on 127.0.0.1 (in \
    client processes of 2 500 endpoints each), the setup time until the server has served \
    all N, the server's resident memory before any peer, after setup and after an idle \
    period (and its growth per idle peer), its open descriptors and live peer state, and one \
    empty poll of its completion queue with every peer open.\n\n\
    RC needs a descriptor per connection: the processes start with `ulimit -n` raised to \
    N + 1 024; where the system does not allow that, the row says so.";

/// One transport of the experiment (table-driven: add a row to add one).
struct Transport {
    kind: Kind,
    label: &'static str,
    /// Descriptors the server needs per peer (RC: one TCP connection).
    fds_per_peer: u64,
    /// Descriptors a client process needs per endpoint.
    client_fds_per_peer: u64,
}

const TRANSPORTS: &[Transport] = &[
    Transport {
        kind: Kind::Rc,
        label: "RC",
        fds_per_peer: 1,
        client_fds_per_peer: 1,
    },
    Transport {
        kind: Kind::Ud,
        label: "UD",
        fds_per_peer: 0,
        client_fds_per_peer: 0,
    },
    Transport {
        kind: Kind::Rd,
        label: "RD",
        fds_per_peer: 0,
        client_fds_per_peer: 0,
    },
    Transport {
        kind: Kind::Dc,
        label: "DC",
        // At most the table's 16 connections.
        fds_per_peer: 0,
        client_fds_per_peer: 1,
    },
];

const ALL_N: &[usize] = &[1, 10, 100, 1_000, 10_000];
/// Client endpoints per client process.
const PER_CLIENT: usize = 2_500;

/// `softrdma perf scale [OPTIONS]`.
#[derive(Debug, clap::Args)]
#[command(
    after_long_help = "Output: the table on stdout (--json: JSON lines instead), progress \
    on stderr; scale.md, scale.csv, scale.jsonl and two PNG plots in --out DIR.\n\n\
    Exit status: 0 done, 1 failed, 2 for a bad command line."
)]
pub(crate) struct ScaleArgs {
    /// N up to 1 000.
    #[arg(long)]
    quick: bool,
    /// At most this many endpoints (a smaller ladder, for tests).
    #[arg(long, hide = true, value_name = "N", value_parser = at_least_one)]
    max_n: Option<usize>,
    /// Where scale.md, scale.csv, scale.jsonl and the PNG plots go (created
    /// if missing).
    #[arg(long, value_name = "DIR", default_value = "perf-scale")]
    out: PathBuf,
    /// Print JSON lines instead of the table.
    #[arg(long)]
    json: bool,
    /// Transports, comma-separated [default: all].
    #[arg(long, value_name = "T,T,...", value_delimiter = ',', value_parser = transport_names())]
    transports: Vec<usize>,
    /// RD idle expiry of the run in milliseconds, 10 to 60000; the server is
    /// measured idle after 2 x MS + 500 ms.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    idle_ms: u64,
    /// Runs one process of a point (a child of the run): `--role ROLE
    /// key=value...`.
    #[arg(long, hide = true, num_args = 1.., value_name = "ROLE KEY=VALUE")]
    role: Option<Vec<String>>,
}

/// The options `run` works with, defaults filled in.
#[derive(Debug)]
struct Args {
    out: PathBuf,
    json: bool,
    ns: Vec<usize>,
    transports: Vec<usize>,
    idle_ms: u64,
}

impl ScaleArgs {
    fn resolve(self) -> Args {
        let mut ns = ALL_N.to_vec();
        let quick = self.quick.then_some(1_000);
        if let Some(m) = [quick, self.max_n].into_iter().flatten().min() {
            ns.retain(|&n| n <= m);
            if ns.is_empty() {
                ns.push(m);
            }
        }
        Args {
            out: self.out,
            json: self.json,
            ns,
            transports: if self.transports.is_empty() {
                (0..TRANSPORTS.len()).collect()
            } else {
                self.transports
            },
            idle_ms: self.idle_ms,
        }
    }
}

/// A count of at least 1.
fn at_least_one(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The transports of [`TRANSPORTS`] by key, as table indices.
fn transport_names() -> impl clap::builder::TypedValueParser<Value = usize> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        TRANSPORTS
            .iter()
            .map(|t| PossibleValue::new(t.kind.key()).help(t.label)),
    )
    .map(|s| {
        TRANSPORTS
            .iter()
            .position(|t| t.kind.key() == s)
            .expect("a possible value")
    })
}

/// Entry point of `softrdma perf scale`.
pub(crate) fn main(args: ScaleArgs) -> ExitCode {
    if let Some(role) = &args.role {
        let kv = Kv::parse(role.iter().skip(1).map(String::as_str));
        return if roles::run(&role[0], &kv) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let a = args.resolve();
    match run(&a) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("softrdma perf scale: some points failed (see the table)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("softrdma perf scale: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One measured point.
#[derive(Debug, Clone)]
struct Row {
    transport: usize,
    n: usize,
    result: Result<Point, String>,
}

#[derive(Debug, Clone, Copy)]
struct Point {
    setup_s: f64,
    rss0: u64,
    rss_setup: u64,
    rss_idle: u64,
    heap0: u64,
    heap_idle: u64,
    fds0: u64,
    fds_idle: u64,
    live_peers: u64,
    expired: u64,
    resent: u64,
    /// One empty poll of the server's CQ after the idle period, ns.
    idle_poll_ns: u64,
}

impl Point {
    fn per_peer_idle(&self, n: usize) -> f64 {
        (self.rss_idle as f64 - self.rss0 as f64) / n as f64
    }

    /// Live heap per idle peer: what the server's state holds, without
    /// the free memory the allocator keeps (which RSS includes).
    fn per_peer_heap_idle(&self, n: usize) -> f64 {
        (self.heap_idle as f64 - self.heap0 as f64) / n as f64
    }

    fn per_peer_setup(&self, n: usize) -> f64 {
        (self.rss_setup as f64 - self.rss0 as f64) / n as f64
    }
}

/// One line of `scale.jsonl` (and of `--json`): a point's figures, or
/// its error.
#[derive(serde::Serialize)]
struct JsonRow<'a> {
    test: &'static str,
    transport: &'a str,
    n: usize,
    #[serde(flatten)]
    figures: Option<JsonFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

/// The figures of a point that worked (memory in octets).
#[derive(serde::Serialize)]
struct JsonFigures {
    setup_s: f64,
    rss_before: u64,
    rss_setup: u64,
    rss_idle: u64,
    per_peer_setup_bytes: f64,
    per_peer_idle_bytes: f64,
    per_peer_heap_idle_bytes: f64,
    fds_before: u64,
    fds_idle: u64,
    live_peers: u64,
    expired: u64,
    resent: u64,
    idle_poll_ns: u64,
}

/// `x` to `digits` decimals (the precision the figures are worth).
fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// The JSON line of a point of `transport` at `n` endpoints.
fn json_line(transport: &str, n: usize, result: &Result<Point, String>) -> String {
    let row = JsonRow {
        test: "scale",
        transport,
        n,
        figures: result.as_ref().ok().map(|p| JsonFigures {
            setup_s: round(p.setup_s, 6),
            rss_before: p.rss0,
            rss_setup: p.rss_setup,
            rss_idle: p.rss_idle,
            per_peer_setup_bytes: round(p.per_peer_setup(n), 1),
            per_peer_idle_bytes: round(p.per_peer_idle(n), 1),
            per_peer_heap_idle_bytes: round(p.per_peer_heap_idle(n), 1),
            fds_before: p.fds0,
            fds_idle: p.fds_idle,
            live_peers: p.live_peers,
            expired: p.expired,
            resent: p.resent,
            idle_poll_ns: p.idle_poll_ns,
        }),
        error: result.as_ref().err().map(String::as_str),
    };
    serde_json::to_string(&row).expect("a scale row always serializes") + "\n"
}

fn run(a: &Args) -> Result<bool, String> {
    let start = Instant::now();
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let load_before = load_note();
    let mut rows = Vec::new();
    for &ti in &a.transports {
        for &n in &a.ns {
            let t = &TRANSPORTS[ti];
            progress(start, &format!("{} N={n}: starting", t.label));
            let result = point(a, t, n, start);
            match &result {
                Ok(p) => progress(
                    start,
                    &format!(
                        "{} N={n}: setup {:.3} s, server RSS {} -> {} -> {} KiB idle ({:.0} B per idle peer)",
                        t.label,
                        p.setup_s,
                        p.rss0 >> 10,
                        p.rss_setup >> 10,
                        p.rss_idle >> 10,
                        p.per_peer_idle(n)
                    ),
                ),
                Err(e) => progress(start, &format!("{} N={n}: FAILED: {e}", t.label)),
            }
            rows.push(Row {
                transport: ti,
                n,
                result,
            });
        }
    }
    report(a, &rows, start, &load_before)?;
    Ok(rows.iter().all(|r| r.result.is_ok()))
}

fn point(a: &Args, t: &Transport, n: usize, start: Instant) -> Result<Point, String> {
    let nofile = (n as u64 * t.fds_per_peer + 1024).max(1024);
    let settle = 2 * a.idle_ms + 500;
    let common = vec![
        format!("transport={}", t.kind.key()),
        format!("idle_ms={}", a.idle_ms),
    ];
    let mut sargs = common.clone();
    sargs.extend([format!("n={n}"), format!("settle_ms={settle}")]);
    let cmd = role_command(None, Some(nofile), "scale", "server", &sargs)?;
    let mut server = Proc::spawn(cmd, &format!("scale server ({})", sargs.join(" ")))?;
    let ready = server.expect("ready", Duration::from_secs(30))?;
    let limit: u64 = ready.get("fd_limit")?;
    if t.fds_per_peer > 0 && limit < n as u64 * t.fds_per_peer + 256 {
        return Err(format!(
            "not run: needs about {} open files in the server, the limit is {limit} \
             (raise it with ulimit -n, as root)",
            n as u64 * t.fds_per_peer + 256
        ));
    }
    let k = n.div_ceil(PER_CLIENT);
    let mut clients = Vec::with_capacity(k);
    for c in 0..k {
        let first = c * PER_CLIENT;
        let count = PER_CLIENT.min(n - first);
        let mut cargs = common.clone();
        cargs.extend([
            format!("first={first}"),
            format!("count={count}"),
            format!("port={}", ready.get::<u16>("port")?),
            format!("qpn={}", ready.get::<u32>("qpn")?),
        ]);
        let cmd = role_command(
            None,
            Some((count as u64 * t.client_fds_per_peer + 1024).max(1024)),
            "scale",
            "client",
            &cargs,
        )?;
        clients.push(Proc::spawn(cmd, &format!("scale client {c}"))?);
    }
    for (c, p) in clients.iter_mut().enumerate() {
        let r = p.expect("ready", Duration::from_secs(300))?;
        let _ = (c, r);
    }
    progress(
        start,
        &format!("{} N={n}: {k} client process(es) ready, go", t.label),
    );
    let go = Instant::now();
    for p in clients.iter_mut() {
        p.tell("go")?;
    }
    server.tell("go")?;
    // The clients are watched while the server serves them: one that
    // fails (an endpoint without a reply) ends the point with its own
    // words at once, not when the server gives up waiting for it.
    let mut done: Vec<Option<Kv>> = vec![None; k];
    let setup = loop {
        if let Some(s) = server.poll("setup", Duration::from_millis(50))? {
            break s;
        }
        for (p, d) in clients.iter_mut().zip(done.iter_mut()) {
            if d.is_none() {
                *d = p.poll("done", Duration::ZERO)?;
            }
        }
    };
    let setup_s = go.elapsed().as_secs_f64();
    let mut resent = 0;
    for (p, d) in clients.iter_mut().zip(done) {
        let d = match d {
            Some(d) => d,
            None => p.expect("done", Duration::from_secs(120))?,
        };
        resent += d.get::<u64>("resent")?;
    }
    progress(
        start,
        &format!(
            "{} N={n}: all served in {setup_s:.3} s; idle for {settle} ms",
            t.label
        ),
    );
    let res = server.expect("result", Duration::from_millis(settle + 60_000))?;
    let _ = server.tell("stop");
    for p in clients.iter_mut() {
        let _ = p.tell("stop");
    }
    Ok(Point {
        setup_s,
        rss0: ready.get("rss")?,
        rss_setup: setup.get("rss")?,
        rss_idle: res.get("rss")?,
        heap0: ready.get("heap")?,
        heap_idle: res.get("heap")?,
        fds0: ready.get("fds")?,
        fds_idle: res.get("fds")?,
        live_peers: res.get("live_peers")?,
        expired: res.get("expired")?,
        resent,
        idle_poll_ns: res.get("poll_ns")?,
    })
}

fn kib(b: u64) -> String {
    format!("{}", b >> 10)
}

fn report(a: &Args, rows: &[Row], start: Instant, load_before: &str) -> Result<(), String> {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# softrdma perf scale\n\nOne server process, N client endpoints on 127.0.0.1, one \
         request/reply each, then idle {} ms (RD idle expiry {} ms). RSS of the server \
         process (VmRSS, KiB); per-peer = (idle RSS - RSS before any peer) / N; heap/peer \
         = the same for the heap in use (glibc mallinfo2: live allocations, without the free \
         memory the allocator keeps mapped, which RSS counts). Engine \
         progress mode SOFTRDMA_PROGRESS={} (in `both`, every CQ poll progresses each QP \
         attached to the CQ: the RC server has all N on one CQ).\n",
        2 * a.idle_ms + 500,
        a.idle_ms,
        std::env::var("SOFTRDMA_PROGRESS").unwrap_or_else(|_| "both (default)".into())
    );
    let _ = writeln!(
        md,
        "| transport | N | setup s | setup µs/peer | RSS before KiB | RSS setup KiB | RSS idle KiB \
         | B/peer setup | B/peer idle | heap B/peer idle | server fds | live peer state \
         | idle poll µs | notes |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut csv = String::from(
        "transport,n,setup_s,rss_before,rss_setup,rss_idle,per_peer_setup_bytes,\
         per_peer_idle_bytes,per_peer_heap_idle_bytes,fds_before,fds_idle,live_peers,expired,resent,\
         idle_poll_ns,error\n",
    );
    let mut jsonl = String::new();
    for r in rows {
        let t = &TRANSPORTS[r.transport];
        jsonl.push_str(&json_line(t.kind.key(), r.n, &r.result));
        match &r.result {
            Ok(p) => {
                let state = match t.kind {
                    Kind::Rd => format!("{} RD peers ({} expired)", p.live_peers, p.expired),
                    Kind::Rc => format!("{} connections", p.live_peers),
                    Kind::Dc => format!(
                        "{} table slots ({} connections closed)",
                        p.live_peers, p.expired
                    ),
                    Kind::Ud => "none (UD)".into(),
                };
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.3} | {:.1} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {} → {} | {state} | {:.2} | {} |",
                    t.label,
                    r.n,
                    p.setup_s,
                    p.setup_s * 1e6 / r.n as f64,
                    kib(p.rss0),
                    kib(p.rss_setup),
                    kib(p.rss_idle),
                    p.per_peer_setup(r.n),
                    p.per_peer_idle(r.n),
                    p.per_peer_heap_idle(r.n),
                    p.fds0,
                    p.fds_idle,
                    p.idle_poll_ns as f64 / 1e3,
                    if p.resent > 0 {
                        format!("{} UD requests re-sent", p.resent)
                    } else {
                        String::new()
                    }
                );
                let _ = writeln!(
                    csv,
                    "{},{},{:.6},{},{},{},{:.1},{:.1},{:.1},{},{},{},{},{},{},",
                    t.kind.key(),
                    r.n,
                    p.setup_s,
                    p.rss0,
                    p.rss_setup,
                    p.rss_idle,
                    p.per_peer_setup(r.n),
                    p.per_peer_idle(r.n),
                    p.per_peer_heap_idle(r.n),
                    p.fds0,
                    p.fds_idle,
                    p.live_peers,
                    p.expired,
                    p.resent,
                    p.idle_poll_ns
                );
            }
            Err(e) => {
                let _ = writeln!(
                    md,
                    "| {} | {} | - | - | - | - | - | - | - | - | - | - | - | FAILED: {} |",
                    t.label,
                    r.n,
                    e.replace('|', "/")
                );
                let _ = writeln!(
                    csv,
                    "{},{},,,,,,,,,,,,,,{}",
                    t.kind.key(),
                    r.n,
                    e.replace([',', '\n'], ";")
                );
            }
        }
    }
    let _ = writeln!(
        md,
        "\nBefore the run: {load_before}; after: {}.",
        load_note()
    );
    if a.json {
        print!("{jsonl}");
    } else {
        print!("{md}");
    }
    write_file(&a.out.join("scale.md"), &md)?;
    write_file(&a.out.join("scale.csv"), &csv)?;
    write_file(&a.out.join("scale.jsonl"), &jsonl)?;
    type Metric = fn(&Point, usize) -> f64;
    let plots: [(&str, &str, &str, bool, Metric); 2] = [
        (
            "scale_per_peer.png",
            "Server memory per idle peer",
            "bytes per peer (RSS growth / N)",
            false,
            |p, n| p.per_peer_idle(n),
        ),
        (
            "scale_setup.png",
            "Setup time, N peers",
            "setup time (s)",
            true,
            |p, _| p.setup_s,
        ),
    ];
    for (file, title, y_label, log_y, metric) in plots {
        let series: Vec<Series> = a
            .transports
            .iter()
            .map(|&ti| Series {
                name: TRANSPORTS[ti].label.to_string(),
                points: rows
                    .iter()
                    .filter(|r| r.transport == ti)
                    .filter_map(|r| Some((r.n as f64, metric(r.result.as_ref().ok()?, r.n))))
                    .collect(),
            })
            .collect();
        let chart = Chart {
            title,
            x_label: "client endpoints N",
            y_label,
            log_x: true,
            log_y,
            series: &series,
        };
        let path = a.out.join(file);
        match write_png(&chart, &path) {
            Ok(()) => progress(start, &format!("wrote {}", path.display())),
            Err(e) => progress(start, &format!("plot {}: FAILED: {e}", path.display())),
        }
    }
    progress(
        start,
        &format!(
            "done; wrote {}/scale.md, scale.csv, scale.jsonl",
            a.out.display()
        ),
    );
    Ok(())
}
