//! `softrdma perf sockets`: unmodified TCP and UDP programs under the
//! sockets interposer, against the same programs on the kernel's sockets
//! and under rsockets, in one run.
//!
//! Each benchmark is a server program and a client program on 127.0.0.1
//! ([`BENCHES`]): sockperf ping-pong over TCP and over UDP (64 B; one-way
//! latency, mean and 50th percentile), sockperf throughput over TCP
//! (1 472 B messages), iperf3 over TCP (one stream) and redis-benchmark's
//! GET and SET against redis-server; and a memory row: a UDP echo server
//! of our own holding `--udp-clients` clients, a socket and port each,
//! on kernel UDP and over UD ([`Ctx::measure_memory`]). Each runs in
//! every [`Mode`] (the memory row in kernel and interposed only), one
//! right after the other:
//!
//! * **kernel**: the programs as they are;
//! * **interposed**: both ends under `LD_PRELOAD=libsoftrdma-sockets.so.1`
//!   with a registry directory (`SOFTRDMA_SOCKETS_DIR`) of their own, so
//!   TCP connections between them run over RC queue pairs and UDP
//!   sockets send to each other over UD;
//! * **left alone**: only the client under the interposer; the server is
//!   not in the registry, so the client's socket stays a kernel socket and
//!   the row measures the interposer's pass-through path;
//! * **rsockets**: both ends under rdma-core's `librspreload.so` over
//!   softrdma's librdmacm (`LD_LIBRARY_PATH`, as `softrdma run` does).
//!
//! Every interposed process appends its totals to the file named by
//! `SOFTRDMA_SOCKETS_REPORT` at exit; the run reads them to check that
//! the mode measured is the mode that ran: an interposed TCP row whose
//! client reports no RC connection, or a left-alone row whose client
//! reports one, is a failed measurement, not a figure. The other
//! `SOFTRDMA_SOCKETS*` variables are removed from the programs'
//! environment.
//!
//! Ratios are to the kernel row of the same run (latency: mode / kernel,
//! lower is better; bandwidth and requests per second: mode / kernel,
//! higher is better); `--runs N` repeats everything N times and takes the
//! median of each ratio, which the targets are judged on.
//!
//! Every program runs with a deadline and is killed at it; a server is
//! stopped with SIGINT (its exit writes its report), then SIGKILL after a
//! grace period. A failed or overrun measurement is a failed cell with the
//! reason; the run goes on.

use std::fmt::Write as _;
use std::fs::File;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::cell::WaitMode;
use super::loss::proc::load_note;
use super::report::Progress;
use super::tcp_cc;

/// What `softrdma perf sockets --help` says first.
pub(crate) const ABOUT: &str = "Runs unmodified socket programs on 127.0.0.1 in four \
    modes, one right after the other: on the kernel's sockets (kernel), both ends under the \
    sockets interposer libsoftrdma-sockets.so.1 (interposed: TCP over RC queue pairs), only \
    the client under it (left alone: the interposer's pass-through path), and both ends \
    under rdma-core's rsockets preload librspreload.so over softrdma's librdmacm \
    (rsockets). Benchmarks: sockperf ping-pong over TCP and UDP (64 B, one-way latency: \
    mean and 50th percentile), sockperf throughput over TCP (1472 B), iperf3 over TCP, and \
    redis-benchmark GET and SET against redis-server; and the memory of a UDP echo server \
    holding --udp-clients clients (a socket and port each; kernel and interposed only: \
    its Pss plus its UDP sockets' queued kernel memory, and the growth per client).\n\n\
    Every figure is also a ratio to the kernel row of the same run; the targets block \
    judges the ratios (with --runs N: their medians). The interposer's exit report \
    (SOFTRDMA_SOCKETS_REPORT) is checked: an interposed TCP row that ran over the kernel, \
    or a left-alone row that did not, is a failed cell. A program that fails or overruns \
    its deadline is a failed cell with the reason.\n\n\
    The interposer is looked for like softrdma's libibverbs (softrdma run --help): \
    $SOFTRDMA_LIB_DIR, else <dir of this executable>/../lib/softrdma \
    (libsoftrdma-sockets.so.1), else the executable's directory and its deps/ (cargo's \
    libsoftrdma_sockets.so, after cargo build --release -p softrdma-sockets).";

/// `softrdma perf sockets [OPTIONS]`.
#[derive(Debug, clap::Args)]
#[command(
    after_long_help = "Output: the table and the targets block on stdout (--json: \
    one JSON object instead), progress on stderr.\n\n\
    Exit status: 0 when every kernel, interposed and left-alone cell worked (rsockets cells \
    may fail: the table says why), 1 when one failed or the interposer is missing, 2 for a \
    bad command line."
)]
pub(crate) struct SocketsArgs {
    /// Short runs: 1 s per program (3 s without), 20 000 redis requests per
    /// command (100 000 without).
    #[arg(long)]
    quick: bool,

    /// Print one JSON object (every run's figures, the medians, the
    /// targets) on stdout instead of the table.
    #[arg(long)]
    json: bool,

    /// Repeat the whole set N times, 1 to 50; the table shows medians and
    /// the targets are judged on the median ratios.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    runs: u32,

    /// How the programs wait, the same in every mode: `event` runs them
    /// as they are (blocking sockets); `poll` gives sockperf's ends
    /// --nonblocked (they spin on their receive calls).
    ///
    /// iperf3 and redis have no such choice and wait as they always do
    /// (select, epoll).
    #[arg(long, value_name = "MODE", default_value = "event", value_parser = wait_names())]
    wait: WaitMode,

    /// Only these benchmarks, comma-separated [default: all].
    #[arg(long, value_name = "B,B,...", value_delimiter = ',', value_parser = bench_names())]
    bench: Vec<usize>,

    /// The memory row's UDP clients: the echo server holds N clients, each
    /// a socket with a port of its own (0: no memory row).
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(0..=30_000))]
    udp_clients: u32,

    /// rdma-core's rsockets preload library [default: the first
    /// /usr/lib/*/rsocket/librspreload.so, /usr/lib64/rsocket/..., or
    /// /usr/lib/rsocket/... that exists].
    #[arg(long, value_name = "PATH")]
    rspreload: Option<PathBuf>,
}

/// `--wait`: the programs' wait modes, by the names `softrdma perf`'s
/// tests take.
fn wait_names() -> impl clap::builder::TypedValueParser<Value = WaitMode> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new("event").help("blocking sockets, as the programs come"),
        PossibleValue::new("poll").help("sockperf --nonblocked on both ends"),
    ])
    .map(|s| WaitMode::parse(&s).expect("a possible value"))
}

/// The benchmarks of [`BENCHES`] by key, as table indices.
fn bench_names() -> impl clap::builder::TypedValueParser<Value = usize> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        BENCHES
            .iter()
            .map(|b| PossibleValue::new(b.key).help(b.label)),
    )
    .map(|s| {
        BENCHES
            .iter()
            .position(|b| b.key == s)
            .expect("a possible value")
    })
}

// ---------------------------------------------------------------------
// Modes and benchmarks
// ---------------------------------------------------------------------

/// How the two ends of a measurement run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Plain programs on the kernel's sockets.
    Kernel,
    /// Both ends under the sockets interposer.
    Interposed,
    /// Only the client under the interposer (pass-through).
    LeftAlone,
    /// Both ends under rsockets over softrdma's librdmacm.
    Rsockets,
}

/// Every mode, in the order they run and are shown.
const MODES: [Mode; 4] = [
    Mode::Kernel,
    Mode::Interposed,
    Mode::LeftAlone,
    Mode::Rsockets,
];

impl Mode {
    /// The name in the table and the JSON.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Interposed => "interposed",
            Mode::LeftAlone => "left-alone",
            Mode::Rsockets => "rsockets",
        }
    }

    /// The ratio column's heading.
    fn ratio_head(self) -> &'static str {
        match self {
            Mode::Kernel => "k/k",
            Mode::Interposed => "int/k",
            Mode::LeftAlone => "left/k",
            Mode::Rsockets => "rs/k",
        }
    }

    /// Whether each end runs under the interposer: (server, client).
    fn interposed_ends(self) -> (bool, bool) {
        match self {
            Mode::Interposed => (true, true),
            Mode::LeftAlone => (false, true),
            Mode::Kernel | Mode::Rsockets => (false, false),
        }
    }
}

/// What a benchmark's programs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Program {
    /// `sockperf sr` / `sockperf pp`.
    SockperfPingPong,
    /// `sockperf sr` / `sockperf tp`.
    SockperfThroughput,
    /// `iperf3 -s -1` / `iperf3 -c`.
    Iperf3,
    /// `redis-server` / `redis-benchmark`.
    Redis,
    /// A UDP echo server of our own (`sockets_c/udp_echo.c`, built with
    /// cc) and batches of client sockets: the server's memory.
    UdpMemory,
}

/// One figure a benchmark reports.
#[derive(Debug)]
struct Metric {
    /// Key in the JSON.
    key: &'static str,
    /// Appended to the benchmark's label in the table.
    label: &'static str,
    /// Unit as shown.
    unit: &'static str,
    /// Latency (lower is better) rather than a rate.
    lower_is_better: bool,
}

/// One benchmark: a server and a client program, one or more figures.
#[derive(Debug)]
struct Bench {
    /// `--bench` name and JSON key.
    key: &'static str,
    /// Label in the table.
    label: &'static str,
    program: Program,
    /// The programs talk UDP (carried over UD when interposed).
    udp: bool,
    /// The executables that must be on PATH.
    needs: &'static [&'static str],
    metrics: &'static [Metric],
    /// A memory figure (kernel and interposed only; its own target).
    memory: bool,
}

const LAT_METRICS: &[Metric] = &[
    Metric {
        key: "avg_us",
        label: "avg",
        unit: "µs",
        lower_is_better: true,
    },
    Metric {
        key: "p50_us",
        label: "p50",
        unit: "µs",
        lower_is_better: true,
    },
];

/// The benchmarks (table-driven: a row adds one).
const BENCHES: &[Bench] = &[
    Bench {
        key: "sockperf-tcp-pp",
        label: "sockperf TCP ping-pong 64 B",
        program: Program::SockperfPingPong,
        udp: false,
        needs: &["sockperf"],
        metrics: LAT_METRICS,
        memory: false,
    },
    Bench {
        key: "sockperf-udp-pp",
        label: "sockperf UDP ping-pong 64 B",
        program: Program::SockperfPingPong,
        udp: true,
        needs: &["sockperf"],
        metrics: LAT_METRICS,
        memory: false,
    },
    Bench {
        key: "sockperf-tcp-tp",
        label: "sockperf TCP throughput 1472 B",
        program: Program::SockperfThroughput,
        udp: false,
        needs: &["sockperf"],
        metrics: &[Metric {
            key: "mbytes_per_s",
            label: "",
            unit: "MB/s",
            lower_is_better: false,
        }],
        memory: false,
    },
    Bench {
        key: "iperf3-tcp",
        label: "iperf3 TCP",
        program: Program::Iperf3,
        udp: false,
        needs: &["iperf3"],
        metrics: &[Metric {
            key: "gbit_per_s",
            label: "",
            unit: "Gbit/s",
            lower_is_better: false,
        }],
        memory: false,
    },
    Bench {
        key: "redis",
        label: "redis-benchmark",
        program: Program::Redis,
        udp: false,
        needs: &["redis-server", "redis-benchmark"],
        metrics: &[
            Metric {
                key: "get_rps",
                label: "GET",
                unit: "req/s",
                lower_is_better: false,
            },
            Metric {
                key: "set_rps",
                label: "SET",
                unit: "req/s",
                lower_is_better: false,
            },
        ],
        memory: false,
    },
    Bench {
        key: "udp-memory",
        label: "UDP server, N clients",
        program: Program::UdpMemory,
        udp: true,
        needs: &["cc"],
        metrics: &[
            Metric {
                key: "server_kib",
                label: "memory",
                unit: "KiB",
                lower_is_better: true,
            },
            Metric {
                key: "per_client_bytes",
                label: "per client",
                unit: "B",
                lower_is_better: true,
            },
        ],
        memory: true,
    },
];

/// Why a memory row has no left-alone or rsockets cell (not a failure).
const NOT_RUN: &str = "not run: the memory row compares kernel UDP and UD only";

/// The memory row's client sockets per client process: each interposed
/// socket holds its UD QP's registered buffers (about 9.4 MB), so the
/// clients come in batches that exit before the next starts; the server
/// keeps what it learnt of each.
const UDP_BATCH: u32 = 250;

/// The first port the memory row's clients bind (below the kernel's
/// ephemeral range, so the batches' ports do not repeat).
const UDP_FIRST_PORT: u32 = 20_000;

/// The memory row's programs (C, built at run time).
const UDP_ECHO_C: &str = include_str!("sockets_c/udp_echo.c");

/// sockperf's message size for ping-pong.
const PP_SIZE: usize = 64;
/// sockperf's message size for throughput (its own advice for TCP).
const TP_SIZE: usize = 1472;

// ---------------------------------------------------------------------
// Output parsers
// ---------------------------------------------------------------------

/// `s` without ANSI escape sequences (sockperf colours some lines).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            if it.peek() == Some(&'[') {
                it.next();
                // Parameters and intermediates, then one final letter.
                for c in it.by_ref() {
                    if c.is_ascii_alphabetic() || c == '~' {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The number that starts `s` (after blanks).
fn leading_number(s: &str) -> Option<f64> {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')))
        .unwrap_or(s.len());
    s[..end].parse().ok()
}

/// sockperf ping-pong: (`avg-latency`, `percentile 50.000`) in µs, one
/// way (sockperf halves the round trip unless told `--full-rtt`).
pub(crate) fn parse_sockperf_pp(out: &str) -> Option<(f64, f64)> {
    let out = strip_ansi(out);
    let mut avg = None;
    let mut p50 = None;
    for line in out.lines() {
        if let Some((_, rest)) = line.split_once("avg-latency=") {
            avg = leading_number(rest);
        }
        if let Some((_, rest)) = line.split_once("percentile 50.000") {
            p50 = rest.trim_start().strip_prefix('=').and_then(leading_number);
        }
    }
    Some((avg?, p50?))
}

/// sockperf throughput: `BandWidth is X MBps`.
pub(crate) fn parse_sockperf_tp(out: &str) -> Option<f64> {
    let out = strip_ansi(out);
    out.lines()
        .rev()
        .filter_map(|l| l.split_once("BandWidth is ").map(|(_, r)| r))
        .find_map(leading_number)
}

/// iperf3 `--json`: `end.sum_received.bits_per_second`; `Err` with
/// iperf3's own `error` when it reports one.
pub(crate) fn parse_iperf3(out: &str) -> Result<f64, String> {
    let v: serde_json::Value = serde_json::from_str(out.trim())
        .map_err(|e| format!("iperf3 printed no JSON result ({e})"))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(format!("iperf3: {e}"));
    }
    v.pointer("/end/sum_received/bits_per_second")
        .and_then(|b| b.as_f64())
        .ok_or_else(|| "iperf3's JSON has no end.sum_received.bits_per_second".into())
}

/// redis-benchmark `-q`: (GET, SET) requests per second, from its final
/// `NAME: X requests per second` lines (the progress lines before them
/// are separated by carriage returns).
pub(crate) fn parse_redis(out: &str) -> Option<(f64, f64)> {
    let mut get = None;
    let mut set = None;
    for piece in out.split(['\r', '\n']) {
        let piece = piece.trim();
        let Some((name, rest)) = piece.split_once(": ") else {
            continue;
        };
        if !rest.contains("requests per second") {
            continue;
        }
        let v = leading_number(rest);
        match name {
            "GET" => get = v,
            "SET" => set = v,
            _ => {}
        }
    }
    Some((get?, set?))
}

/// One line of the interposer's exit report (`SOFTRDMA_SOCKETS_REPORT`):
/// one process's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ReportLine {
    /// The process.
    pub pid: u32,
    /// Connections carried over RC.
    pub rc_conns: u64,
    /// Connections left to the kernel.
    pub kernel_conns: u64,
    /// Octets sent over RC.
    pub rc_tx_bytes: u64,
    /// Octets received over RC.
    pub rc_rx_bytes: u64,
    /// Datagram sockets given a UD QP.
    pub ud_socks: u64,
    /// Octets sent over UD.
    pub ud_tx_bytes: u64,
}

/// Parses a report file: one [`ReportLine`] per well-formed line
/// (`pid=N rc_conns=N kernel_conns=N rc_tx_bytes=N rc_rx_bytes=N
/// ud_socks=N ud_tx_bytes=N ud_rx_bytes=N`).
pub(crate) fn parse_report(text: &str) -> Vec<ReportLine> {
    text.lines()
        .filter_map(|l| {
            let mut r = ReportLine::default();
            let mut pid = false;
            for w in l.split_whitespace() {
                let (k, v) = w.split_once('=')?;
                match k {
                    "pid" => {
                        r.pid = v.parse().ok()?;
                        pid = true;
                    }
                    "rc_conns" => r.rc_conns = v.parse().ok()?,
                    "kernel_conns" => r.kernel_conns = v.parse().ok()?,
                    "rc_tx_bytes" => r.rc_tx_bytes = v.parse().ok()?,
                    "rc_rx_bytes" => r.rc_rx_bytes = v.parse().ok()?,
                    "ud_socks" => r.ud_socks = v.parse().ok()?,
                    "ud_tx_bytes" => r.ud_tx_bytes = v.parse().ok()?,
                    _ => {}
                }
            }
            pid.then_some(r)
        })
        .collect()
}

// ---------------------------------------------------------------------
// Libraries
// ---------------------------------------------------------------------

/// rdma-core's rsockets preload library, if installed.
fn find_rspreload() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("rsocket/librspreload.so"))
        .collect();
    candidates.sort();
    candidates.push("/usr/lib64/rsocket/librspreload.so".into());
    candidates.push("/usr/lib/rsocket/librspreload.so".into());
    candidates.into_iter().find(|p| p.is_file())
}

/// What rsockets runs with: the preload library and the directory of
/// softrdma's `librdmacm.so.1` (for `LD_LIBRARY_PATH`); `Err`: why the
/// rsockets cells cannot run.
fn rsockets_setup(asked: Option<PathBuf>) -> Result<(PathBuf, PathBuf), String> {
    let pre = match asked {
        Some(p) if p.is_file() => p,
        Some(p) => return Err(format!("{}: no such file", p.display())),
        None => find_rspreload().ok_or(
            "librspreload.so not found (rdma-core's rsockets preload: Debian's librdmacm1 \
             ships it in /usr/lib/<arch>/rsocket/)",
        )?,
    };
    let lib = crate::run::find_lib_dir(crate::run::VERBS).map_err(|looked| {
        format!(
            "softrdma's librdmacm not found (looked in {}; build it: cargo build --release -p \
             softrdma-capi -p softrdma-capi-rdmacm)",
            looked.join("; ")
        )
    })?;
    let dir = crate::run::link_dir(&lib)
        .map_err(|e| format!("cannot make the library links for {}: {e}", lib.display()))?;
    Ok((pre, dir))
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

// ---------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------

/// A program running with its stdout and stderr in files.
struct Running {
    child: Option<Child>,
    pid: u32,
    stdout: PathBuf,
    stderr: PathBuf,
    status: Option<ExitStatus>,
}

impl Running {
    /// Starts `cmd`, its output going to `<base>.out` and `<base>.err`.
    fn start(mut cmd: Command, name: &str, base: &Path) -> Result<Running, String> {
        let with = |ext: &str| {
            let mut p = base.as_os_str().to_os_string();
            p.push(ext);
            PathBuf::from(p)
        };
        let (stdout, stderr) = (with(".out"), with(".err"));
        let file = |p: &Path| File::create(p).map_err(|e| format!("{}: {e}", p.display()));
        cmd.stdin(Stdio::null())
            .stdout(file(&stdout)?)
            .stderr(file(&stderr)?);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        Ok(Running {
            pid: child.id(),
            child: Some(child),
            stdout,
            stderr,
            status: None,
        })
    }

    /// Waits until it exits or `until`; its status, `None` if it still
    /// runs.
    fn wait_until(&mut self, until: Instant) -> Option<ExitStatus> {
        loop {
            let c = self.child.as_mut()?;
            match c.try_wait() {
                Ok(Some(st)) => {
                    self.child = None;
                    self.status = Some(st);
                    return Some(st);
                }
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                _ => return None,
            }
        }
    }

    /// Whether it has exited (its status then).
    fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.wait_until(Instant::now());
        }
        self.status
    }

    /// Stops it: SIGINT (a clean exit, which writes the interposer's
    /// report), then SIGKILL after `grace`. Whether it had to be killed.
    fn stop(&mut self, grace: Duration) -> bool {
        if self.exited().is_some() {
            return false;
        }
        let _ = Command::new("kill")
            .args(["-INT", &self.pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if self.wait_until(Instant::now() + grace).is_some() {
            return false;
        }
        self.kill();
        true
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            self.status = c.wait().ok();
        }
    }

    /// Everything it printed: stdout, then stderr.
    fn output(&self) -> String {
        let read = |p: &Path| std::fs::read(p).unwrap_or_default();
        let mut s = String::from_utf8_lossy(&read(&self.stdout)).into_owned();
        s.push('\n');
        s.push_str(&String::from_utf8_lossy(&read(&self.stderr)));
        s
    }

    /// Its stdout alone.
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.stdout).unwrap_or_default()).into_owned()
    }

    /// The line of its output that best says what went wrong: the last
    /// one that mentions an error, else the last one.
    fn complaint(&self) -> String {
        complaint(&self.output())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The line of `out` that best says what went wrong (see
/// [`Running::complaint`]), at most 240 characters.
fn complaint(out: &str) -> String {
    let out = strip_ansi(out);
    let lines: Vec<&str> = out
        .split(['\n', '\r'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let at = lines
        .iter()
        .rposition(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("error") || l.contains("fail") || l.contains("panick")
        })
        .or(lines.len().checked_sub(1));
    let Some(at) = at else {
        return "(no output)".into();
    };
    let mut pick = lines[at].to_string();
    // sockperf puts the errno on a line of its own.
    if let Some(next) = lines.get(at + 1).filter(|l| l.starts_with("(errno")) {
        pick.push(' ');
        pick.push_str(next);
    }
    let mut s: String = pick.chars().take(240).collect();
    if pick.chars().count() > 240 {
        s.push('…');
    }
    s
}

/// Whether something listens on `port` of this host: a TCP listener
/// (`/proc/net/tcp*`, state `0A`) or a bound UDP socket (`/proc/net/udp*`).
fn listening(port: u16, udp: bool) -> bool {
    let files: &[&str] = if udp {
        &["/proc/net/udp", "/proc/net/udp6"]
    } else {
        &["/proc/net/tcp", "/proc/net/tcp6"]
    };
    let want = format!(":{port:04X}");
    files.iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 3 && w[1].ends_with(&want) && (udp || w[3] == "0A")
            })
        })
    })
}

/// A port free on 127.0.0.1 for TCP and UDP just now.
fn free_port() -> Result<u16, String> {
    for _ in 0..20 {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err("no port free for both TCP and UDP".into())
}

// ---------------------------------------------------------------------
// One measurement
// ---------------------------------------------------------------------

/// What a run measures with: libraries, durations, where files go.
struct Ctx {
    interposer: PathBuf,
    /// (librspreload.so, directory of softrdma's librdmacm.so.1), or why
    /// rsockets cannot run.
    rsockets: Result<(PathBuf, PathBuf), String>,
    /// The run's private directory (registries, reports, outputs).
    tmp: PathBuf,
    /// Seconds of each sockperf and iperf3 client.
    secs: u32,
    /// redis-benchmark requests per command.
    redis_n: u64,
    wait: WaitMode,
    /// `--tcp-cc` as given (iperf3 sets it on its sockets).
    cc: Option<String>,
    /// Measurements so far (names their files).
    seq: u32,
    /// The memory row's client count.
    udp_clients: u32,
    /// The memory row's program, once built (or why it cannot be).
    udp_echo: Option<Result<PathBuf, String>>,
}

/// One measurement's outcome.
#[derive(Debug, Clone)]
struct Outcome {
    /// One value per metric of the benchmark, or why there is none.
    values: Result<Vec<f64>, String>,
    /// The interposer's report lines of the client and the server.
    client_report: Option<ReportLine>,
    server_report: Option<ReportLine>,
}

/// The variables the programs must not inherit: the measurement decides
/// them.
const CLEARED_VARS: &[&str] = &[
    "LD_PRELOAD",
    "SOFTRDMA_SOCKETS",
    "SOFTRDMA_SOCKETS_DIR",
    "SOFTRDMA_SOCKETS_REPORT",
    "SOFTRDMA_SOCKETS_PEERS",
    "SOFTRDMA_SOCKETS_EXCLUDE",
    "SOFTRDMA_SOCKETS_STATS",
];

impl Ctx {
    /// Gives `cmd` the environment of one end in `mode`.
    fn environ(
        &self,
        cmd: &mut Command,
        mode: Mode,
        interposed: bool,
        dir: &Path,
        report: &Path,
    ) -> Result<(), String> {
        for v in CLEARED_VARS {
            cmd.env_remove(v);
        }
        // The engine's algorithm for rsockets' own connections: the one
        // asked for, else the system's (as every program's sockets).
        match &self.cc {
            Some(cc) if cc != "system" => cmd.env("SOFTRDMA_TCP_CONGESTION", cc),
            _ => cmd.env_remove("SOFTRDMA_TCP_CONGESTION"),
        };
        if interposed {
            cmd.env("LD_PRELOAD", &self.interposer)
                .env("SOFTRDMA_SOCKETS_DIR", dir)
                .env("SOFTRDMA_SOCKETS_REPORT", report);
        }
        if mode == Mode::Rsockets {
            let (pre, ld) = self.rsockets.as_ref().map_err(Clone::clone)?;
            cmd.env("LD_PRELOAD", pre).env(
                "LD_LIBRARY_PATH",
                crate::run::library_path(ld, std::env::var_os("LD_LIBRARY_PATH")),
            );
        }
        Ok(())
    }

    /// The (server, client) commands of `b` on `port`.
    fn commands(&self, b: &Bench, port: u16) -> (Command, Command, Duration) {
        let p = port.to_string();
        let secs = self.secs.to_string();
        let poll = self.wait == WaitMode::Poll;
        let slack = Duration::from_secs(20);
        match b.program {
            Program::SockperfPingPong | Program::SockperfThroughput => {
                let mut s = Command::new("sockperf");
                s.arg("sr");
                let mut c = Command::new("sockperf");
                let (sub, size) = if b.program == Program::SockperfPingPong {
                    ("pp", PP_SIZE)
                } else {
                    ("tp", TP_SIZE)
                };
                c.args([sub, "-i", "127.0.0.1", "-p", &p, "-t", &secs])
                    .args(["-m", &size.to_string()]);
                if !b.udp {
                    s.arg("--tcp");
                    c.arg("--tcp");
                }
                s.args(["-p", &p]);
                if poll {
                    s.arg("--nonblocked");
                    c.arg("--nonblocked");
                }
                (s, c, Duration::from_secs(u64::from(self.secs)) + slack)
            }
            Program::Iperf3 => {
                let mut s = Command::new("iperf3");
                s.args(["-s", "-1", "-p", &p]);
                let mut c = Command::new("iperf3");
                c.args(["-c", "127.0.0.1", "-p", &p, "-t", &secs, "--json"]);
                if let Some(cc) = self.cc.as_deref().filter(|c| *c != "system") {
                    c.args(["-C", cc]);
                }
                (s, c, Duration::from_secs(u64::from(self.secs)) + slack)
            }
            Program::Redis => {
                let mut s = Command::new("redis-server");
                s.args(["--port", &p, "--save", "", "--appendonly", "no"])
                    .args(["--bind", "127.0.0.1"]);
                let mut c = Command::new("redis-benchmark");
                c.args(["-h", "127.0.0.1", "-p", &p, "-t", "get,set", "-q"])
                    .args(["-n", &self.redis_n.to_string()]);
                // At least 2 000 requests a second.
                let within = Duration::from_secs(self.redis_n / 1000 + 10);
                (s, c, within)
            }
            Program::UdpMemory => unreachable!("the memory row has its own measurement"),
        }
    }

    /// Measures `b` in `mode` once.
    fn measure(&mut self, b: &Bench, mode: Mode) -> Outcome {
        let mut o = Outcome {
            values: Err(String::new()),
            client_report: None,
            server_report: None,
        };
        o.values = self.measure_into(b, mode, &mut o);
        o
    }

    fn measure_into(&mut self, b: &Bench, mode: Mode, o: &mut Outcome) -> Result<Vec<f64>, String> {
        if b.memory && !matches!(mode, Mode::Kernel | Mode::Interposed) {
            return Err(NOT_RUN.into());
        }
        if let Some(missing) = b.needs.iter().find(|n| !on_path(n)) {
            return Err(format!("{missing} is not installed (not on PATH)"));
        }
        if b.program == Program::UdpMemory {
            return self.measure_memory(b, mode, o);
        }
        self.seq += 1;
        let base = self
            .tmp
            .join(format!("{:03}-{}-{}", self.seq, b.key, mode.key()));
        let dir = base.with_extension("registry");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let report = base.with_extension("report");
        let port = free_port()?;
        let (mut scmd, mut ccmd, within) = self.commands(b, port);
        let (s_int, c_int) = mode.interposed_ends();
        self.environ(&mut scmd, mode, s_int, &dir, &report)?;
        self.environ(&mut ccmd, mode, c_int, &dir, &report)?;

        let mut server = Running::start(scmd, "the server", &base.with_extension("server"))?;
        let up_by = Instant::now() + Duration::from_secs(10);
        while !listening(port, b.udp) {
            if let Some(st) = server.exited() {
                return Err(format!(
                    "the server exited ({st}) before listening on port {port}: {}",
                    server.complaint()
                ));
            }
            if Instant::now() >= up_by {
                return Err(format!(
                    "the server did not listen on port {port} within 10 s: {}",
                    server.complaint()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut client = Running::start(ccmd, "the client", &base.with_extension("client"))?;
        let status = client.wait_until(Instant::now() + within);
        if status.is_none() {
            client.kill();
        }
        // iperf3 -s -1 ends by itself after its test.
        let grace = if b.program == Program::Iperf3 {
            server.wait_until(Instant::now() + Duration::from_secs(3));
            Duration::from_secs(2)
        } else {
            Duration::from_secs(5)
        };
        let server_killed = server.stop(grace);

        let lines = parse_report(&std::fs::read_to_string(&report).unwrap_or_default());
        o.client_report = lines.iter().find(|l| l.pid == client.pid).copied();
        o.server_report = lines.iter().find(|l| l.pid == server.pid).copied();

        let Some(st) = status else {
            return Err(format!(
                "the client overran its deadline of {} s and was killed: {}",
                within.as_secs(),
                client.complaint()
            ));
        };
        if !st.success() {
            return Err(format!("the client failed ({st}): {}", client.complaint()));
        }
        let values = match b.program {
            Program::SockperfPingPong => parse_sockperf_pp(&client.output())
                .map(|(a, p)| vec![a, p])
                .ok_or_else(|| {
                    format!(
                        "no avg-latency and 50th percentile in sockperf's output: {}",
                        client.complaint()
                    )
                })?,
            Program::SockperfThroughput => parse_sockperf_tp(&client.output())
                .map(|v| vec![v])
                .ok_or_else(|| {
                    format!("no BandWidth in sockperf's output: {}", client.complaint())
                })?,
            Program::Iperf3 => vec![parse_iperf3(&client.stdout())? / 1e9],
            Program::Redis => parse_redis(&client.output())
                .map(|(g, s)| vec![g, s])
                .ok_or_else(|| {
                    format!(
                        "no GET and SET requests per second in redis-benchmark's output: {}",
                        client.complaint()
                    )
                })?,
            Program::UdpMemory => unreachable!("the memory row has its own measurement"),
        };
        // The mode that ran must be the mode measured.
        let pid = client.pid;
        match (mode, o.client_report) {
            (Mode::Interposed | Mode::LeftAlone, None) => {
                return Err(format!(
                    "the client (pid {pid}) wrote no interposer report: the library did not \
                     load or the client did not exit normally"
                ))
            }
            (Mode::Interposed, Some(r)) if b.udp && r.ud_tx_bytes == 0 => {
                return Err(
                    "measured interposed, but the client's report shows no octet sent over                      UD: the datagrams went through the kernel"
                        .to_string(),
                )
            }
            (Mode::LeftAlone, Some(r)) if r.ud_tx_bytes > 0 => {
                return Err(format!(
                    "measured left alone, but the client's report shows {} octets sent over UD",
                    r.ud_tx_bytes
                ))
            }
            (Mode::Interposed, Some(r)) if !b.udp && r.rc_conns == 0 => {
                return Err(format!(
                    "measured interposed, but the client's report shows rc_conns=0 \
                     kernel_conns={}: the connection ran over the kernel",
                    r.kernel_conns
                ))
            }
            (Mode::LeftAlone, Some(r)) if r.rc_conns > 0 => {
                return Err(format!(
                    "measured left alone, but the client's report shows rc_conns={}",
                    r.rc_conns
                ))
            }
            _ => {}
        }
        if server_killed && mode == Mode::Interposed && !b.udp && o.server_report.is_none() {
            // The client's figures stand; the server's totals are lost.
            eprintln!(
                "  note: the server (pid {}) did not stop on SIGINT and was killed",
                server.pid
            );
        }
        Ok(values)
    }
}

// ---------------------------------------------------------------------
// The memory row
// ---------------------------------------------------------------------

/// A process's memory as the memory row counts it, in octets: its
/// proportional set size (`Pss` of `/proc/PID/smaps_rollup`: private
/// pages, shared ones divided among their users) plus the kernel memory
/// queued on its UDP sockets (`tx_queue` + `rx_queue` of
/// `/proc/net/udp*`, by the inodes of its descriptors). `Err`: why not.
pub(crate) fn process_memory(pid: u32) -> Result<u64, String> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .map_err(|e| format!("/proc/{pid}/smaps_rollup: {e}"))?;
    let pss_kib = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| format!("no Pss in /proc/{pid}/smaps_rollup"))?;
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map_err(|e| format!("/proc/{pid}/fd: {e}"))?
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_string)
        })
        .collect();
    Ok(pss_kib * 1024 + udp_queued(&inodes))
}

/// The octets queued (`tx_queue` + `rx_queue`) on the UDP sockets of
/// `inodes`.
fn udp_queued(inodes: &[String]) -> u64 {
    let mut sum = 0;
    for f in ["/proc/net/udp", "/proc/net/udp6"] {
        let Ok(t) = std::fs::read_to_string(f) else {
            continue;
        };
        sum += udp_queued_in(&t, inodes);
    }
    sum
}

/// [`udp_queued`] over one `/proc/net/udp*` table.
pub(crate) fn udp_queued_in(table: &str, inodes: &[String]) -> u64 {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            // sl local rem st tx_queue:rx_queue tr:when retrnsmt uid timeout inode
            let (queues, inode) = (w.get(4)?, w.get(9)?);
            if !inodes.iter().any(|i| i == inode) {
                return None;
            }
            let (tx, rx) = queues.split_once(':')?;
            Some(u64::from_str_radix(tx, 16).ok()? + u64::from_str_radix(rx, 16).ok()?)
        })
        .sum()
}

/// `answered K of N last P` of the clients' output: (K, P).
pub(crate) fn parse_answered(out: &str) -> Option<(u32, u32)> {
    out.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["answered", k, "of", _, "last", p] => Some((k.parse().ok()?, p.parse().ok()?)),
            _ => None,
        }
    })
}

/// Waits until `r`'s stdout has a line `pred` accepts (the line), it
/// exits, or `until`.
fn wait_line(r: &mut Running, until: Instant, pred: impl Fn(&str) -> bool) -> Option<String> {
    loop {
        if let Some(l) = r.stdout().lines().find(|l| pred(l)) {
            return Some(l.to_string());
        }
        if r.exited().is_some() || Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Ctx {
    /// The memory row's program, built once per run.
    fn udp_echo(&mut self) -> Result<PathBuf, String> {
        if let Some(r) = &self.udp_echo {
            return r.clone();
        }
        let src = self.tmp.join("udp_echo.c");
        let exe = self.tmp.join("udp_echo");
        let r = std::fs::write(&src, UDP_ECHO_C)
            .map_err(|e| format!("{}: {e}", src.display()))
            .and_then(|()| {
                let out = Command::new("cc")
                    .args(["-O2", "-Wall", "-o"])
                    .arg(&exe)
                    .arg(&src)
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| format!("cannot run cc: {e}"))?;
                if out.status.success() {
                    Ok(exe.clone())
                } else {
                    Err(format!(
                        "cc could not build the UDP echo program: {}",
                        complaint(&String::from_utf8_lossy(&out.stderr))
                    ))
                }
            });
        self.udp_echo = Some(r.clone());
        r
    }

    /// The memory row in `mode` (kernel or interposed): the echo server
    /// starts; its memory is taken once it is up and again after
    /// `udp_clients` client sockets, each with a port of its own, have
    /// exchanged a datagram with it. The clients come in batches of
    /// [`UDP_BATCH`] sockets, one process each, which exit before the
    /// next starts (over UD each socket holds its QP's registered
    /// buffers); over UD the server keeps what it learnt of every client
    /// (its address handle), the kernel keeps nothing. Values: the
    /// server's memory at the end (KiB) and its growth per client (B).
    fn measure_memory(
        &mut self,
        b: &Bench,
        mode: Mode,
        o: &mut Outcome,
    ) -> Result<Vec<f64>, String> {
        let exe = self.udp_echo()?;
        let n = self.udp_clients;
        self.seq += 1;
        let base = self
            .tmp
            .join(format!("{:03}-{}-{}", self.seq, b.key, mode.key()));
        let dir = base.with_extension("registry");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let report = base.with_extension("report");
        let port = free_port()?;
        let interposed = mode == Mode::Interposed;
        let mut scmd = Command::new(&exe);
        scmd.args(["server", &port.to_string()]);
        self.environ(&mut scmd, mode, interposed, &dir, &report)?;
        let mut server = Running::start(scmd, "the server", &base.with_extension("server"))?;
        if wait_line(&mut server, Instant::now() + Duration::from_secs(10), |l| {
            l == "ready"
        })
        .is_none()
        {
            return Err(format!(
                "the UDP echo server did not start: {}",
                server.complaint()
            ));
        }
        std::thread::sleep(Duration::from_millis(300));
        let before = process_memory(server.pid)?;
        let mut first = UDP_FIRST_PORT;
        let (mut done, mut answered, mut ud_tx) = (0u32, 0u32, 0u64);
        let mut batch_no = 0;
        while done < n {
            let k = (n - done).min(UDP_BATCH);
            batch_no += 1;
            let mut ccmd = Command::new(&exe);
            ccmd.args([
                "clients",
                &port.to_string(),
                &k.to_string(),
                &first.to_string(),
            ]);
            self.environ(&mut ccmd, mode, interposed, &dir, &report)?;
            let mut client = Running::start(
                ccmd,
                "the clients",
                &base.with_extension(format!("clients{batch_no}")),
            )?;
            // Three tries of 2 s per socket at worst; far less in practice.
            let until = Instant::now() + Duration::from_secs(60 + u64::from(k) / 10);
            let line = wait_line(&mut client, until, |l| l.starts_with("answered "));
            let pid = client.pid;
            client.stop(Duration::from_secs(10));
            let Some((got, last)) = line.as_deref().and_then(parse_answered) else {
                return Err(format!(
                    "client batch {batch_no} ({k} sockets from port {first}) did not finish: {}",
                    client.complaint()
                ));
            };
            let lines = parse_report(&std::fs::read_to_string(&report).unwrap_or_default());
            if let Some(r) = lines.iter().find(|l| l.pid == pid) {
                ud_tx += r.ud_tx_bytes;
                if o.client_report.is_none() {
                    o.client_report = Some(*r);
                }
            } else if interposed {
                return Err(format!(
                    "client batch {batch_no} (pid {pid}) wrote no interposer report"
                ));
            }
            done += k;
            answered += got;
            first = last + 1;
        }
        std::thread::sleep(Duration::from_millis(300));
        let after = process_memory(server.pid);
        let server_pid = server.pid;
        server.stop(Duration::from_secs(5));
        let lines = parse_report(&std::fs::read_to_string(&report).unwrap_or_default());
        o.server_report = lines.iter().find(|l| l.pid == server_pid).copied();
        let after = after?;
        // UDP may drop a datagram; a client that never got its echo still
        // reached the server or not: the figures want nearly all of them.
        if u64::from(answered) * 100 < u64::from(n) * 99 {
            return Err(format!(
                "only {answered} of {n} clients got their echo back"
            ));
        }
        if interposed && ud_tx == 0 {
            return Err(
                "measured interposed, but the clients' reports show no octet sent over UD: the \
                 datagrams went through the kernel"
                    .into(),
            );
        }
        if interposed && o.server_report.is_some_and(|r| r.ud_socks == 0) {
            return Err("measured interposed, but the server's socket had no UD QP".into());
        }
        let growth = after as f64 - before as f64;
        Ok(vec![after as f64 / 1024.0, growth / f64::from(n.max(1))])
    }
}

// ---------------------------------------------------------------------
// Aggregation and targets
// ---------------------------------------------------------------------

/// The median of `v` (`None` when empty).
pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// One mode of one row, over every run.
#[derive(Debug, Clone, Serialize)]
struct Cell {
    mode: &'static str,
    /// Per run: the value, `null` when the measurement failed.
    values: Vec<Option<f64>>,
    /// Per run: value / kernel value of the same run.
    ratios: Vec<Option<f64>>,
    /// Per run: why the measurement failed (`null`: it worked).
    errors: Vec<Option<String>>,
    /// Per run: the client's interposer report (`null`: none).
    client_reports: Vec<Option<ReportLine>>,
    /// Per run: the server's interposer report (`null`: none).
    server_reports: Vec<Option<ReportLine>>,
    /// Median of `values`.
    value: Option<f64>,
    /// Median of `ratios`.
    ratio: Option<f64>,
}

/// One row: a figure of a benchmark in every mode.
#[derive(Debug, Clone, Serialize)]
struct Row {
    bench: &'static str,
    metric: &'static str,
    label: String,
    unit: &'static str,
    lower_is_better: bool,
    udp: bool,
    /// A memory figure (the memory target only).
    memory: bool,
    modes: Vec<Cell>,
}

impl Row {
    fn cell(&self, m: Mode) -> &Cell {
        self.modes
            .iter()
            .find(|c| c.mode == m.key())
            .expect("every mode has a cell")
    }
}

/// Every outcome of the run: `[run][bench slot][mode]`.
type Outcomes = Vec<Vec<[Outcome; 4]>>;

/// The rows of `benches` from the outcomes.
fn rows(benches: &[usize], outcomes: &Outcomes) -> Vec<Row> {
    let mut out = Vec::new();
    for (slot, &bi) in benches.iter().enumerate() {
        let b = &BENCHES[bi];
        for (mi, m) in b.metrics.iter().enumerate() {
            let value = |o: &Outcome| o.values.as_ref().ok().map(|v| v[mi]);
            let modes = MODES
                .iter()
                .enumerate()
                .map(|(k, mode)| {
                    let per_run: Vec<&Outcome> = outcomes.iter().map(|r| &r[slot][k]).collect();
                    let values: Vec<Option<f64>> = per_run.iter().map(|o| value(o)).collect();
                    let ratios: Vec<Option<f64>> = outcomes
                        .iter()
                        .zip(&values)
                        .map(|(r, v)| {
                            let k0 = value(&r[slot][0]).filter(|k0| *k0 > 0.0)?;
                            Some((*v)? / k0)
                        })
                        .collect();
                    Cell {
                        mode: mode.key(),
                        errors: per_run
                            .iter()
                            .map(|o| o.values.as_ref().err().cloned())
                            .collect(),
                        client_reports: per_run.iter().map(|o| o.client_report).collect(),
                        server_reports: per_run.iter().map(|o| o.server_report).collect(),
                        value: median(values.iter().flatten().copied().collect()),
                        ratio: median(ratios.iter().flatten().copied().collect()),
                        values,
                        ratios,
                    }
                })
                .collect();
            let label = if m.label.is_empty() {
                b.label.to_string()
            } else {
                format!("{} {}", b.label, m.label)
            };
            out.push(Row {
                bench: b.key,
                metric: m.key,
                label,
                unit: m.unit,
                lower_is_better: m.lower_is_better,
                udp: b.udp,
                memory: b.memory,
                modes,
            });
        }
    }
    out
}

/// One target: a bound on a same-run ratio, judged on every row it
/// covers.
#[derive(Debug, Clone, Serialize)]
struct Target {
    name: &'static str,
    /// `<=` or `>=`.
    bound: &'static str,
    limit: f64,
    /// The figure of each row it covers (`ratio` `null`: missing).
    rows: Vec<TargetRow>,
    /// The row furthest from the bound.
    worst: Option<TargetRow>,
    /// `met`, `not met` or `not judged` (a row is missing, none fails).
    status: &'static str,
}

/// A row's figure under a target.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct TargetRow {
    row: String,
    ratio: Option<f64>,
}

/// Judges `rows`' figures against `bound limit`.
fn judge(
    name: &'static str,
    bound: &'static str,
    limit: f64,
    rows: Vec<(String, Option<f64>)>,
) -> Target {
    let le = bound == "<=";
    let worst = rows
        .iter()
        .filter_map(|(l, v)| v.map(|v| (l.clone(), v)))
        .reduce(|a, b| {
            let b_worse = if le { b.1 > a.1 } else { b.1 < a.1 };
            if b_worse {
                b
            } else {
                a
            }
        })
        .map(|(row, v)| TargetRow {
            row,
            ratio: Some(v),
        });
    let fails = rows
        .iter()
        .any(|(_, v)| v.is_some_and(|v| if le { v > limit } else { v < limit }));
    let missing = rows.is_empty() || rows.iter().any(|(_, v)| v.is_none());
    let status = if fails {
        "not met"
    } else if missing {
        "not judged"
    } else {
        "met"
    };
    Target {
        name,
        bound,
        limit,
        rows: rows
            .into_iter()
            .map(|(row, ratio)| TargetRow { row, ratio })
            .collect(),
        worst,
        status,
    }
}

/// How much better interposed is than rsockets in a row, per run (2 =
/// twice as good: half the latency or twice the rate); the median.
fn advantage(r: &Row) -> Option<f64> {
    let i = r.cell(Mode::Interposed);
    let s = r.cell(Mode::Rsockets);
    let per_run = i
        .values
        .iter()
        .zip(&s.values)
        .filter_map(|(i, s)| {
            let (i, s) = ((*i)?, (*s)?);
            let a = if r.lower_is_better { s / i } else { i / s };
            a.is_finite().then_some(a)
        })
        .collect();
    median(per_run)
}

/// Interposed UDP latency over interposed TCP latency, per statistic
/// (avg, p50), median over runs: UD sockets' ping-pong against RC
/// sockets'.
fn ud_against_rc(rows: &[Row]) -> Vec<(String, Option<f64>)> {
    let lat: Vec<&Row> = rows
        .iter()
        .filter(|r| r.lower_is_better && !r.memory)
        .collect();
    let mut out = Vec::new();
    for u in lat.iter().filter(|r| r.udp) {
        let stat = u.label.rsplit(' ').next().unwrap_or("");
        let Some(t) = lat
            .iter()
            .find(|r| !r.udp && r.label.rsplit(' ').next() == Some(stat))
        else {
            continue;
        };
        let (ui, ti) = (u.cell(Mode::Interposed), t.cell(Mode::Interposed));
        let n = ui.values.len().min(ti.values.len());
        let per_run: Vec<f64> = (0..n)
            .filter_map(|k| match (ui.values[k], ti.values[k]) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            })
            .collect();
        out.push((format!("{} / TCP", u.label), median(per_run)));
    }
    out
}

/// The targets (docs/performance.md, "Sockets").
fn targets(rows: &[Row]) -> Vec<Target> {
    let pick = |mode: Mode, lat: bool, tcp_only: bool| -> Vec<(String, Option<f64>)> {
        rows.iter()
            .filter(|r| !r.memory && r.lower_is_better == lat && !(tcp_only && r.udp))
            .map(|r| (r.label.clone(), r.cell(mode).ratio))
            .collect()
    };
    vec![
        judge(
            "left-alone latency / kernel",
            "<=",
            1.02,
            pick(Mode::LeftAlone, true, false),
        ),
        judge(
            "left-alone bandwidth and requests / kernel",
            ">=",
            0.98,
            pick(Mode::LeftAlone, false, false),
        ),
        judge(
            "interposed TCP latency / kernel",
            "<=",
            1.15,
            pick(Mode::Interposed, true, true),
        ),
        judge(
            "interposed TCP bandwidth and requests / kernel",
            ">=",
            0.9,
            pick(Mode::Interposed, false, true),
        ),
        judge(
            "interposed UDP (over UD) latency / kernel",
            "<=",
            1.15,
            rows.iter()
                .filter(|r| r.lower_is_better && r.udp && !r.memory)
                .map(|r| (r.label.clone(), r.cell(Mode::Interposed).ratio))
                .collect(),
        ),
        judge(
            "interposed UDP / interposed TCP ping-pong",
            "<=",
            0.85,
            ud_against_rc(rows),
        ),
        // UDP rows: softrdma's rsockets leave datagram sockets to the kernel.
        judge(
            "interposed TCP against rsockets (x better)",
            ">=",
            2.0,
            rows.iter()
                .filter(|r| !r.udp)
                .map(|r| (r.label.clone(), advantage(r)))
                .collect(),
        ),
        judge(
            "UDP server memory over UD / kernel UDP",
            "<=",
            1.0,
            rows.iter()
                .filter(|r| r.memory && r.metric == "server_kib")
                .map(|r| (r.label.clone(), r.cell(Mode::Interposed).ratio))
                .collect(),
        ),
    ]
}

// ---------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------

/// A value the way the table shows it, by unit.
fn fmt_value(v: f64, unit: &str) -> String {
    // A growth of a fraction of an octet, up or down, is none.
    let v = if unit == "B" && v.abs() < 0.5 { 0.0 } else { v };
    match unit {
        "µs" => format!("{v:.2}"),
        "Gbit/s" => format!("{v:.2}"),
        "MB/s" => format!("{v:.1}"),
        _ => format!("{v:.0}"),
    }
}

/// The table of `rows`: values (medians) per mode, then ratios to kernel.
fn format_table(rows: &[Row], runs: u32, udp_clients: u32) -> String {
    let mut s = String::new();
    let _ = write!(s, "{:<38} {:<7}", "benchmark", "unit");
    for m in MODES {
        let _ = write!(s, " {:>11}", m.key());
    }
    for m in &MODES[1..] {
        let _ = write!(s, " {:>7}", m.ratio_head());
    }
    let _ = write!(s, " {:>7}", "int:rs");
    s.push('\n');
    for r in rows {
        let label = if r.udp {
            format!("{} *", r.label)
        } else {
            r.label.clone()
        };
        let _ = write!(s, "{label:<38} {:<7}", r.unit);
        for c in &r.modes {
            let failed = c.errors.iter().filter(|e| e.is_some()).count();
            let not_run = c.errors.iter().all(|e| e.as_deref() == Some(NOT_RUN));
            let v = match c.value {
                Some(v) if failed == 0 => fmt_value(v, r.unit),
                Some(v) => format!("{}!", fmt_value(v, r.unit)),
                None if not_run && !c.errors.is_empty() => "-".into(),
                None => "FAILED".into(),
            };
            let _ = write!(s, " {v:>11}");
        }
        for c in &r.modes[1..] {
            let v = c
                .ratio
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into());
            let _ = write!(s, " {v:>7}");
        }
        // How many times better interposed is than rsockets (TCP rows:
        // rsockets leave datagram sockets to the kernel).
        let adv = (!r.udp)
            .then(|| advantage(r))
            .flatten()
            .map(|x| format!("{x:.2}"))
            .unwrap_or_else(|| "-".into());
        let _ = write!(s, " {adv:>7}");
        s.push('\n');
    }
    let mut notes = vec![
        "latency: one way (sockperf's round trip / 2); ratio = mode / kernel of the same run \
         (latency: lower is better; bandwidth, requests: higher is better); int:rs = how many \
         times better interposed is than rsockets (rsockets / interposed latency, interposed \
         / rsockets rate)"
            .to_string(),
    ];
    if runs > 1 {
        notes.push(format!(
            "values and ratios: medians of {runs} runs; `!`: some runs failed (below)"
        ));
    }
    if rows.iter().any(|r| r.udp) {
        notes.push(
            "* UDP: interposed = over UD queue pairs; softrdma's rsockets leave datagram \
             sockets to the kernel (rsockets = its pass-through path)"
                .into(),
        );
    }
    if rows.iter().any(|r| r.memory) {
        notes.push(format!(
            "memory: the UDP echo server's Pss plus the kernel memory queued on its UDP \
             sockets, after {udp_clients} clients (a socket and port each) exchanged a \
             datagram with it; per client: its growth from before the first client / \
             {udp_clients}. Kernel UDP keeps nothing per client; over UD the server keeps \
             each client's address handle in its socket's peer table, and its own UD QP's \
             registered buffers"
        ));
    }
    for n in notes {
        let _ = writeln!(s, "{n}");
    }
    let ud_rc = ud_against_rc(rows);
    if !ud_rc.is_empty() {
        let _ = writeln!(
            s,
            "UD against RC (interposed UDP ping-pong latency / interposed TCP ping-pong latency):"
        );
        for (label, v) in ud_rc {
            let v = v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
            let _ = writeln!(s, "  {label:<44} {v:>7}");
        }
    }
    s
}

/// The targets block.
fn format_targets(t: &[Target], runs: u32) -> String {
    let mut s = format!(
        "targets (same-run ratios{}):\n",
        if runs > 1 {
            format!(", medians of {runs} runs")
        } else {
            String::new()
        }
    );
    for t in t {
        let worst = match &t.worst {
            Some(TargetRow {
                row,
                ratio: Some(v),
            }) => format!("{v:.2} ({row})"),
            _ => "n/a".into(),
        };
        let bound = format!("{} {:.2}", t.bound, t.limit);
        let _ = writeln!(
            s,
            "  {:<48} {:<8} worst {:<46} {}",
            t.name, bound, worst, t.status
        );
    }
    s
}

/// Every failed measurement: `run R, LABEL, MODE: why`, one per
/// measurement (not per figure).
fn failures(benches: &[usize], outcomes: &Outcomes) -> Vec<Failure> {
    let mut v = Vec::new();
    for (run, per_bench) in outcomes.iter().enumerate() {
        for (slot, modes) in per_bench.iter().enumerate() {
            for (k, o) in modes.iter().enumerate() {
                if let Some(e) = o.values.as_ref().err().filter(|e| *e != NOT_RUN) {
                    v.push(Failure {
                        run: run as u32 + 1,
                        bench: BENCHES[benches[slot]].key,
                        mode: MODES[k].key(),
                        error: e.clone(),
                    });
                }
            }
        }
    }
    v
}

/// A failed measurement.
#[derive(Debug, Clone, Serialize)]
struct Failure {
    run: u32,
    bench: &'static str,
    mode: &'static str,
    error: String,
}

/// The JSON document of `--json`.
#[derive(Debug, Serialize)]
struct JsonOut<'a> {
    wait: &'static str,
    runs: u32,
    quick: bool,
    seconds_per_program: u32,
    redis_requests: u64,
    tcp_congestion: String,
    load: String,
    interposer: String,
    rspreload: Option<String>,
    /// The memory row's client count.
    udp_clients: u32,
    rows: &'a [Row],
    /// Interposed UDP ping-pong latency / interposed TCP ping-pong
    /// latency, per statistic.
    ud_against_rc: Vec<TargetRow>,
    targets: &'a [Target],
    failures: &'a [Failure],
}

// ---------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------

/// Entry point of `softrdma perf sockets`; `cc`: `--tcp-cc` as given.
pub(crate) fn main(a: SocketsArgs, cc: Option<String>) -> ExitCode {
    let interposer = match crate::run::find_interposer() {
        Ok(p) => p,
        Err(looked) => {
            eprintln!(
                "softrdma perf sockets: the sockets interposer ({}) was not found; looked in:\n  \
                 {}\n(build it: cargo build --release -p softrdma-sockets; install it; or set \
                 SOFTRDMA_LIB_DIR)",
                crate::run::SOCKETS.1,
                looked.join("\n  ")
            );
            return ExitCode::from(1);
        }
    };
    let mut benches: Vec<usize> = if a.bench.is_empty() {
        (0..BENCHES.len()).collect()
    } else {
        let mut b = a.bench.clone();
        b.sort_unstable();
        b.dedup();
        b
    };
    // --udp-clients 0: no memory row.
    benches.retain(|&b| !(BENCHES[b].memory && a.udp_clients == 0));
    let tmp = std::env::temp_dir().join(format!("softrdma-perf-sockets-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&tmp) {
        eprintln!("softrdma perf sockets: {}: {e}", tmp.display());
        return ExitCode::from(1);
    }
    let rsockets = rsockets_setup(a.rspreload.clone());
    let mut ctx = Ctx {
        interposer,
        rsockets,
        tmp: tmp.clone(),
        secs: if a.quick { 1 } else { 3 },
        redis_n: if a.quick { 20_000 } else { 100_000 },
        wait: a.wait,
        cc,
        seq: 0,
        udp_clients: a.udp_clients,
        udp_echo: None,
    };
    if let Err(e) = &ctx.rsockets {
        eprintln!("softrdma perf sockets: rsockets cells cannot run: {e}");
    }

    let progress = Progress::new(u64::from(a.runs) * (benches.len() * MODES.len()) as u64);
    let start = Instant::now();
    let mut outcomes: Outcomes = Vec::new();
    for run in 1..=a.runs {
        let mut per_bench = Vec::new();
        for &bi in &benches {
            let b = &BENCHES[bi];
            let modes = MODES.map(|mode| {
                let what = format!("run {run}/{}: {}, {}", a.runs, b.label, mode.key());
                progress.step(&what);
                let o = ctx.measure(b, mode);
                let said = match &o.values {
                    Ok(v) => v
                        .iter()
                        .zip(b.metrics)
                        .map(|(v, m)| format!("{} {}", fmt_value(*v, m.unit), m.unit))
                        .collect::<Vec<_>>()
                        .join(", "),
                    Err(e) if e == NOT_RUN => e.clone(),
                    Err(e) => format!("failed: {e}"),
                };
                progress.line(&format!(
                    "[{:6.1} s] {what}: {said}",
                    start.elapsed().as_secs_f64()
                ));
                progress.inc();
                o
            });
            per_bench.push(modes);
        }
        outcomes.push(per_bench);
    }
    progress.finish();

    let rows = rows(&benches, &outcomes);
    let tgts = targets(&rows);
    let fails = failures(&benches, &outcomes);
    // The programs' output of a failed measurement is worth a look
    // (rsockets' reasons are in the table: they fail on their own).
    let failed = fails.iter().any(|f| f.mode != Mode::Rsockets.key());
    if !failed {
        let _ = std::fs::remove_dir_all(&tmp);
    } else {
        eprintln!(
            "softrdma perf sockets: the programs' output is kept in {}",
            tmp.display()
        );
    }
    let cc_note = match ctx.cc.as_deref().filter(|c| *c != "system") {
        Some(cc) => format!(
            "TCP congestion control {cc} for iperf3 and rsockets' connections, the system's \
             ({}) for sockperf and redis (they set none)",
            tcp_cc::system_default().unwrap_or_else(|| "unknown".into())
        ),
        None => format!(
            "TCP congestion control: the system's ({}) for every connection",
            tcp_cc::system_default().unwrap_or_else(|| "unknown".into())
        ),
    };
    if a.json {
        let out = JsonOut {
            wait: a.wait.name(),
            runs: a.runs,
            quick: a.quick,
            seconds_per_program: ctx.secs,
            redis_requests: ctx.redis_n,
            tcp_congestion: cc_note,
            load: load_note(),
            interposer: ctx.interposer.display().to_string(),
            rspreload: ctx
                .rsockets
                .as_ref()
                .ok()
                .map(|(p, _)| p.display().to_string()),
            udp_clients: a.udp_clients,
            rows: &rows,
            ud_against_rc: ud_against_rc(&rows)
                .into_iter()
                .map(|(row, ratio)| TargetRow { row, ratio })
                .collect(),
            targets: &tgts,
            failures: &fails,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("the report serializes")
        );
    } else {
        println!(
            "softrdma perf sockets: loopback, wait mode {} ({}), {} run{}, {} s per program, \
             {} redis requests per command; {}; {}",
            a.wait.name(),
            match a.wait {
                WaitMode::Event => "blocking sockets, as the programs come",
                WaitMode::Poll => "sockperf --nonblocked on both ends",
            },
            a.runs,
            if a.runs == 1 { "" } else { "s" },
            ctx.secs,
            ctx.redis_n,
            cc_note,
            load_note()
        );
        print!("{}", format_table(&rows, a.runs, a.udp_clients));
        if !fails.is_empty() {
            println!("failed:");
            for f in &fails {
                println!("  run {}, {}, {}: {}", f.run, f.bench, f.mode, f.error);
            }
        }
        print!("{}", format_targets(&tgts, a.runs));
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOCKPERF_PP: &str = "sockperf: \u{1b}[2;35m== version #3.7-no.git == \u{1b}[0m
sockperf[CLIENT] send on:sockperf: using recvfrom() to block on socket(s)

[ 0] IP = 127.0.0.1       PORT = 23451 # TCP
sockperf: Warmup stage (sending a few dummy messages)...
sockperf: Starting test...
sockperf: Test end (interrupted by timer)
sockperf: Test ended
sockperf: [Total Run] RunTime=1.001 sec; Warm up time=400 msec; SentMessages=68303; ReceivedMessages=68302
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=0.550 sec; SentMessages=38448; ReceivedMessages=38448
sockperf: \u{1b}[2;35m====> avg-latency=7.144 (std-dev=12.261)\u{1b}[0m
sockperf: # dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0
sockperf: Summary: Latency is 7.144 usec
sockperf: \u{1b}[2;35mTotal 38448 observations\u{1b}[0m; each percentile contains 384.48 observations
sockperf: ---> <MAX> observation = 2022.819
sockperf: ---> percentile 99.999 = 2022.819
sockperf: ---> percentile 99.990 =   97.419
sockperf: ---> percentile 99.900 =   30.039
sockperf: ---> percentile 99.000 =    9.278
sockperf: ---> percentile 90.000 =    7.225
sockperf: ---> percentile 75.000 =    7.055
sockperf: ---> percentile 50.000 =    6.790
sockperf: ---> percentile 25.000 =    6.754
sockperf: ---> <MIN> observation =    6.669
";

    const SOCKPERF_TP: &str = "sockperf: \u{1b}[2;35m== version #3.7-no.git == \u{1b}[0m
sockperf[CLIENT] send on:
[ 0] IP = 127.0.0.1       PORT = 23454 # TCP
sockperf: Warmup stage (sending a few dummy messages)...
sockperf: Starting test...
sockperf: Test end (interrupted by timer)
sockperf: Test ended
sockperf: Total of 521303 messages sent in 1.005 sec

sockperf: Summary: Message Rate is 518916 [msg/sec]
sockperf: Summary: BandWidth is 728.459 MBps (5827.670 Mbps)
";

    const IPERF3: &str = r#"{
	"start":	{ "connected": [], "version": "iperf 3.12" },
	"intervals":	[],
	"end":	{
		"streams":	[],
		"sum_sent":	{ "start": 0, "end": 1.000117, "seconds": 1.000117, "bytes": 1669332992, "bits_per_second": 13353099454.5, "retransmits": 0, "sender": true },
		"sum_received":	{ "start": 0, "end": 1.007496, "seconds": 1.007496, "bytes": 1668546560, "bits_per_second": 13249057544.64534, "sender": true },
		"cpu_utilization_percent":	{ "host_total": 60.1 }
	}
}"#;

    const REDIS: &str = " \rSET: rps=0.0 (overall: 0.0) avg_msec=-nan (overall: -nan)\r                    \rSET: rps=70196.0 (overall: 69916.3) avg_msec=0.370 (overall: 0.370)\r                   \rSET: 71428.57 requests per second, p50=0.351 msec\n \rGET: rps=67992.0 (overall: 77572.7) avg_msec=0.333 (overall: 0.333)\r                  \rGET: 79365.08 requests per second, p50=0.311 msec\n\n";

    #[test]
    fn sockperf_outputs_parse() {
        assert_eq!(parse_sockperf_pp(SOCKPERF_PP), Some((7.144, 6.790)));
        assert_eq!(parse_sockperf_tp(SOCKPERF_TP), Some(728.459));
        // A failed run prints neither.
        let failed =
            "sockperf: ERROR: Failed listen() for connection\n (errno=24 Too many open files)\n";
        assert_eq!(parse_sockperf_pp(failed), None);
        assert_eq!(parse_sockperf_tp(failed), None);
        // The mean alone is not a result.
        assert_eq!(
            parse_sockperf_pp("sockperf: ====> avg-latency=5.0 (std-dev=1.0)\n"),
            None
        );
        assert_eq!(
            complaint(failed),
            "sockperf: ERROR: Failed listen() for connection (errno=24 Too many open files)"
        );
        assert_eq!(complaint("a\nb\n"), "b");
        assert_eq!(complaint(""), "(no output)");
    }

    #[test]
    fn iperf3_output_parses() {
        let bps = parse_iperf3(IPERF3).unwrap();
        assert!((bps - 13_249_057_544.645_34).abs() < 1e-3, "{bps}");
        let e = parse_iperf3(r#"{"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server: Connection refused"}"#)
            .unwrap_err();
        assert_eq!(e, "iperf3: unable to connect to server: Connection refused");
        assert!(parse_iperf3("iperf3: error - unable to connect").is_err());
        assert!(parse_iperf3(r#"{"end": {}}"#).is_err());
    }

    #[test]
    fn redis_benchmark_output_parses() {
        assert_eq!(parse_redis(REDIS), Some((79365.08, 71428.57)));
        // Progress lines alone are no result.
        assert_eq!(
            parse_redis("\rSET: rps=70196.0 (overall: 69916.3) avg_msec=0.370\r"),
            None
        );
    }

    #[test]
    fn reports_parse() {
        let text = "pid=29161 rc_conns=1 kernel_conns=0 rc_tx_bytes=1112128 rc_rx_bytes=1112064 \
                    ud_socks=1 ud_tx_bytes=640 ud_rx_bytes=640\n\
                    garbage\n\
                    pid=29159 rc_conns=0 kernel_conns=2 rc_tx_bytes=0 rc_rx_bytes=0\n";
        let r = parse_report(text);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            ReportLine {
                pid: 29161,
                rc_conns: 1,
                kernel_conns: 0,
                rc_tx_bytes: 1_112_128,
                rc_rx_bytes: 1_112_064,
                ud_socks: 1,
                ud_tx_bytes: 640
            }
        );
        assert_eq!((r[1].pid, r[1].kernel_conns), (29159, 2));
        assert!(parse_report("pid=x rc_conns=1").is_empty());
    }

    /// The memory row's pieces: the clients' summary line, the queued
    /// octets of a process's UDP sockets, a live process's memory.
    #[test]
    fn memory_row_parts() {
        assert_eq!(
            parse_answered("x\nanswered 249 of 250 last 20311\n"),
            Some((249, 20311))
        );
        assert_eq!(parse_answered("answered 3 of 4\n"), None);
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
 1234: 0100007F:4E20 00000000:0000 07 00000000:00000300 00:00000000 00000000     0        0 5550 2 0000000000000000 0
 1235: 0100007F:4E21 00000000:0000 07 00000100:00000000 00:00000000 00000000     0        0 5551 2 0000000000000000 0
 1236: 0100007F:4E22 00000000:0000 07 00000FFF:00000FFF 00:00000000 00000000     0        0 7777 2 0000000000000000 0
";
        let inodes = ["5550".to_string(), "5551".to_string()];
        assert_eq!(udp_queued_in(table, &inodes), 0x300 + 0x100);
        assert_eq!(udp_queued_in(table, &[]), 0);
        // This process: at least the memory of a buffer it touched.
        let touched = vec![1u8; 8 << 20];
        let m = process_memory(std::process::id()).expect("own memory");
        assert!(m >= 8 << 20, "{m}");
        assert_eq!(touched.iter().map(|&b| u64::from(b)).sum::<u64>(), 8 << 20);
        assert!(process_memory(u32::MAX).is_err());
    }

    /// A memory row's left-alone and rsockets cells are not run, not
    /// failed; its ratio is judged by the memory target alone.
    #[test]
    fn memory_rows_have_their_own_target() {
        let mem = BENCHES.iter().position(|b| b.memory).unwrap();
        let not_run = || Outcome {
            values: Err(NOT_RUN.to_string()),
            client_report: None,
            server_report: None,
        };
        let outcomes = vec![vec![[
            outcome(Some(vec![200.0, 0.0])),
            outcome(Some(vec![14000.0, 700.0])),
            not_run(),
            not_run(),
        ]]];
        let rows = rows(&[mem], &outcomes);
        assert_eq!(rows.len(), 2);
        assert!(failures(&[mem], &outcomes).is_empty());
        let t = targets(&rows);
        let by = |n: &str| t.iter().find(|t| t.name.starts_with(n)).unwrap();
        let m = by("UDP server memory");
        assert_eq!(m.status, "not met");
        assert_eq!(m.worst.as_ref().and_then(|w| w.ratio), Some(70.0));
        assert_eq!(by("interposed UDP (over UD) latency").status, "not judged");
        assert_eq!(by("left-alone latency").status, "not judged");
        let table = format_table(&rows, 1, 10_000);
        assert!(table.contains("70.00"), "{table}");
        assert!(!table.contains("FAILED"), "{table}");
        assert!(table.contains("after 10000 clients"), "{table}");
    }

    /// UD against RC is a line of its own under the table.
    #[test]
    fn ud_against_rc_is_shown() {
        let tcp = BENCHES
            .iter()
            .position(|b| b.key == "sockperf-tcp-pp")
            .unwrap();
        let udp = BENCHES
            .iter()
            .position(|b| b.key == "sockperf-udp-pp")
            .unwrap();
        let lat = |k: f64, i: f64| {
            [
                outcome(Some(vec![k, k])),
                outcome(Some(vec![i, i])),
                outcome(Some(vec![k, k])),
                outcome(None),
            ]
        };
        let outcomes = vec![vec![lat(10.0, 10.0), lat(9.0, 8.0)]];
        let rows = rows(&[tcp, udp], &outcomes);
        let table = format_table(&rows, 1, 0);
        assert!(
            table.contains("sockperf UDP ping-pong 64 B avg / TCP") && table.contains("0.80"),
            "{table}"
        );
    }

    #[test]
    fn ansi_is_stripped() {
        assert_eq!(strip_ansi("a\u{1b}[2;35mb\u{1b}[0mc"), "abc");
    }

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    fn outcome(v: Option<Vec<f64>>) -> Outcome {
        Outcome {
            values: v.ok_or_else(|| "broke".to_string()),
            client_report: None,
            server_report: None,
        }
    }

    /// Ratios are per run against that run's kernel figure, the medians
    /// judged; a failed rsockets cell leaves the rsockets target unjudged.
    #[test]
    fn ratios_medians_and_targets() {
        // sockperf TCP ping-pong (avg, p50) in two runs.
        let tcp = 0;
        let run = |k: f64, i: f64, l: f64| {
            vec![[
                outcome(Some(vec![k, k])),
                outcome(Some(vec![i, i])),
                outcome(Some(vec![l, l])),
                outcome(None),
            ]]
        };
        let outcomes = vec![run(10.0, 11.0, 10.1), run(20.0, 30.0, 20.0)];
        let rows = rows(&[tcp], &outcomes);
        assert_eq!(rows.len(), 2);
        let int = rows[0].cell(Mode::Interposed);
        assert_eq!(int.ratios, vec![Some(1.1), Some(1.5)]);
        assert_eq!(int.ratio, Some(1.3));
        assert_eq!(int.value, Some(20.5));
        assert_eq!(rows[0].cell(Mode::Rsockets).ratio, None);
        let t = targets(&rows);
        let by = |n: &str| t.iter().find(|t| t.name.starts_with(n)).unwrap();
        assert_eq!(by("interposed TCP latency").status, "not met");
        assert_eq!(
            by("interposed TCP latency")
                .worst
                .as_ref()
                .and_then(|w| w.ratio),
            Some(1.3)
        );
        assert_eq!(by("left-alone latency").status, "met");
        // No rate rows: nothing to judge.
        assert_eq!(by("left-alone bandwidth").status, "not judged");
        assert_eq!(by("interposed TCP against rsockets").status, "not judged");
        let f = failures(&[tcp], &outcomes);
        assert_eq!(f.len(), 2);
        assert!(f.iter().all(|f| f.mode == "rsockets" && f.error == "broke"));
        let table = format_table(&rows, 2, 0);
        assert!(table.contains("FAILED"), "{table}");
        assert!(table.contains("1.30"), "{table}");
    }

    /// Rates: higher is better, and the rsockets advantage is int / rs.
    #[test]
    fn rate_rows_judge_the_other_way() {
        let iperf = BENCHES.iter().position(|b| b.key == "iperf3-tcp").unwrap();
        let outcomes = vec![vec![[
            outcome(Some(vec![10.0])),
            outcome(Some(vec![8.0])),
            outcome(Some(vec![9.9])),
            outcome(Some(vec![2.0])),
        ]]];
        let rows = rows(&[iperf], &outcomes);
        let t = targets(&rows);
        let by = |n: &str| t.iter().find(|t| t.name.starts_with(n)).unwrap();
        assert_eq!(by("interposed TCP bandwidth").status, "not met");
        assert_eq!(by("left-alone bandwidth").status, "met");
        let adv = by("interposed TCP against rsockets");
        assert_eq!(adv.status, "met");
        assert_eq!(adv.worst.as_ref().and_then(|w| w.ratio), Some(4.0));
        // The int:rs column shows it per row.
        let table = format_table(&rows, 1, 0);
        let line = table.lines().find(|l| l.starts_with("iperf3 TCP")).unwrap();
        assert!(line.trim_end().ends_with("4.00"), "{table}");
    }

    /// A listener shows in /proc/net/tcp, a bound UDP socket in
    /// /proc/net/udp.
    #[test]
    fn listeners_are_seen() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listening(port, false));
        drop(l);
        assert!(!listening(port, false));
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(listening(u.local_addr().unwrap().port(), true));
    }
}
