//! The command line of `softrdma perf`: [`PerfArgs`] and its sub-commands,
//! the options of one test ([`TestArgs`]), and the value parsers the
//! sub-commands share (sizes, wait mode, transport).
//!
//! Each test of [`TESTS`] and [`BASELINES`] is a sub-command of its own
//! ([`TestCommand`], built from those tables), so `softrdma perf --help`
//! lists them and `softrdma perf send_lat --help` shows the defaults of
//! that test. A single option's rules (ranges, size syntax, names) are
//! checked by its value parser, options that exclude each other by clap;
//! what depends on the test ([`TestArgs::opts`]: a transport that refuses
//! it, `--versus` against itself, ...) is checked after parsing and
//! reported through [`crate::usage_error`], in the same form and with the
//! same exit status 2.

use std::time::Duration;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, FromArgMatches, Subcommand};

use super::cell::{self, test_by_name, transport_by_name, Kind, Op, TestDef, WaitMode};
use super::cell::{BASELINES, TESTS, TRANSPORTS};
use super::{exs, loss, middleware, scale, sockets, suite, tcp_cc, Opts, DEFAULT_PORT};

/// `softrdma perf`.
#[derive(Debug, Args)]
#[command(
    about = "Benchmarks with same-run raw-socket baselines",
    long_about = "Benchmarks whose every figure is a ratio to a raw-socket baseline measured \
        in the same run: softrdma over TCP is compared with raw TCP, over UDP with raw UDP, \
        the two measured one right after the other in the same process pair, so both sides \
        of a ratio see the same machine.\n\n\
        `softrdma perf TEST` runs one test (send_lat, write_bw, ...) at the sizes given; \
        `softrdma perf suite` the whole loopback matrix with a report and plots; \
        `softrdma perf baseline NAME` one raw-socket baseline alone; `softrdma perf loss` \
        goodput under packet loss between two network namespaces (root); \
        `softrdma perf scale` what one server pays per peer; `softrdma perf sockets` \
        unmodified socket programs under the sockets interposer and rsockets; \
        `softrdma perf exs` the Extended Sockets API (libexs.so) against plain sockets; \
        `softrdma perf middleware` qperf, fi_pingpong and MPI over softrdma against their references.\n\n\
        Every TCP connection of a run, raw and softrdma's, uses one congestion control \
        algorithm (--tcp-cc), given to every process the run starts.",
    after_long_help = "Exit status: 0 when every cell worked, 1 when a cell failed (the table \
        says which and why), 2 for a bad command line."
)]
pub struct PerfArgs {
    /// TCP congestion control of every connection of the run.
    ///
    /// Raw sockets and RC/DC connections alike, in every process the run
    /// starts. Without it: the choice of the parent run (for the processes a
    /// run starts), else SOFTRDMA_TCP_CONGESTION, else cubic when the kernel
    /// allows it to this process (loopback streams under bbr are bimodal),
    /// else the system's default. `system` keeps the host's default. The
    /// kernel must allow the algorithm (net.ipv4.tcp_allowed_congestion_control,
    /// or any loaded one with CAP_NET_ADMIN). Given once: a run has one
    /// algorithm.
    #[arg(
        long,
        global = true,
        value_name = "NAME|system",
        value_parser = tcp_cc_arg,
        display_order = 900
    )]
    pub tcp_cc: Vec<String>,

    #[command(subcommand)]
    pub command: PerfCommand,
}

/// The sub-commands of `softrdma perf`.
#[derive(Debug, Subcommand)]
pub enum PerfCommand {
    /// The loopback matrix (test x transport x size) with raw-socket
    /// ratios, a report and plots.
    #[command(long_about = suite::ABOUT)]
    Suite(suite::SuiteOpts),
    /// Goodput under random packet loss between two network namespaces
    /// (needs root).
    #[command(long_about = loss::ABOUT)]
    Loss(loss::LossArgs),
    /// Server memory and setup time for 1 to 10 000 peers, per transport.
    #[command(long_about = scale::ABOUT)]
    Scale(scale::ScaleArgs),
    /// Unmodified socket programs (sockperf, iperf3, redis) on the kernel,
    /// under the sockets interposer, passed through it, and under rsockets.
    #[command(long_about = sockets::ABOUT)]
    Sockets(sockets::SocketsArgs),
    /// The Extended Sockets API (libexs.so): RDMA-model latency and blast
    /// against raw TCP, the Open Group model against plain send.
    #[command(long_about = exs::ABOUT)]
    Exs(exs::ExsArgs),
    /// qperf, fi_pingpong and MPI over softrdma next to perftest,
    /// libfabric's tcp provider and Open MPI over TCP.
    #[command(long_about = middleware::ABOUT)]
    Middleware(middleware::MiddlewareArgs),
    /// One raw-socket baseline alone, without its reference.
    #[command(
        long_about = BASELINE_ABOUT,
        mut_arg("transport", |a| a.hide(true)),
        mut_arg("versus", |a| a.hide(true))
    )]
    Baseline(BaselineArgs),
    /// The server end of a loopback run (started by `softrdma perf TEST`):
    /// prints `LISTENING <port>` on stdout with --announce, then serves one
    /// control session.
    #[command(name = "__server", hide = true)]
    Server(ServerArgs),
    #[command(flatten)]
    Test(TestCommand),
}

const BASELINE_ABOUT: &str = "Runs one raw-socket baseline at the sizes given, alone. \
    (`softrdma perf NAME` runs the baselines that do more than a raw socket next to their \
    reference: tcp_crc_bw against tcp_bw, ...) The options are those of a test (softrdma \
    perf send_lat --help) but --transport and --versus.";

/// `softrdma perf baseline NAME [OPTIONS]`.
#[derive(Debug, Args)]
pub struct BaselineArgs {
    /// The baseline.
    #[arg(value_name = "NAME", value_parser = baseline_names())]
    pub name: String,

    #[command(flatten)]
    pub opts: TestArgs,
}

/// `softrdma perf __server [--port P] [--announce]`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Control port (0: any free one).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Listen on 127.0.0.1 only, print `LISTENING <port>` on stdout and give
    /// up when no client comes within 30 s.
    #[arg(long)]
    pub announce: bool,
}

/// The options of one test (`softrdma perf TEST`, `softrdma perf baseline
/// NAME`).
#[derive(Clone, Debug, Args)]
pub struct TestArgs {
    /// Transport of the softrdma side.
    ///
    /// dc also reports its first-message latency (connection made on
    /// demand): the table's note, the JSON field `first_msg_us`. A
    /// baseline takes none.
    #[arg(short = 't', long, value_name = "TRANSPORT", value_parser = transport_names())]
    pub transport: Option<String>,

    /// Message size in octets [default: 64; atomic_lat: 8].
    ///
    /// A number with an optional binary suffix: K, Ki or k (x 1024), M, Mi
    /// or m (x 1024²): 64, 4Ki, 1Mi. From 1 to 16Mi.
    #[arg(short = 's', long, value_name = "BYTES", value_parser = size_arg, overrides_with = "sizes")]
    pub size: Option<usize>,

    /// Several sizes, comma-separated (64,4Ki,1Mi), or `all`: every power of
    /// two from 2 to 8Mi.
    ///
    /// Each size runs with its own baseline. atomic_lat takes 8 only (other
    /// sizes are dropped).
    #[arg(long, value_name = "A,B,...|all", value_parser = sizes_arg, overrides_with = "size")]
    pub sizes: Option<SizeList>,

    /// Measured round trips (latency) or messages (bandwidth) per size
    /// [default: 1000 round trips; bandwidth tests run for 1 s].
    #[arg(short = 'n', long, value_name = "N", value_parser = count_arg, conflicts_with = "duration")]
    pub iters: Option<u64>,

    /// Seconds of measuring per size instead of a count, in (0, 3600].
    #[arg(short = 'D', long, value_name = "SECONDS", value_parser = duration_arg)]
    pub duration: Option<f64>,

    /// Serve one session for a client on another host (`--connect`), then
    /// exit.
    ///
    /// Listens on every address. Give both ends the same --no-crc.
    #[arg(long, conflicts_with = "connect")]
    pub server: bool,

    /// Control port of --server (a client names it in --connect HOST:PORT).
    #[arg(short = 'p', long, value_name = "PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,

    /// Measure against a `--server` on HOST (port 18515 unless given).
    ///
    /// Without --server or --connect both ends run on this host, as two
    /// processes (loopback).
    #[arg(short = 'c', long, value_name = "HOST[:PORT]")]
    pub connect: Option<String>,

    /// RC without the MPA CRC (give it to both ends).
    #[arg(long)]
    pub no_crc: bool,

    /// Fill every octet of every message with a pattern and check it at the
    /// receiver (a mismatch fails the cell).
    #[arg(long)]
    pub verify: bool,

    /// One JSON object per result on stdout instead of the table.
    #[arg(long)]
    pub json: bool,

    /// How both ends wait for the next event: `poll` spins (poll_cq in a
    /// loop, non-blocking sockets), `event` sleeps (completion channel,
    /// blocking sockets).
    ///
    /// softrdma and its baseline always wait the same way. write_lat
    /// watches memory and needs poll.
    #[arg(long, value_name = "MODE", default_value = "poll", value_parser = wait_arg())]
    pub wait: WaitMode,

    /// Outstanding messages of a bandwidth test, 1 to 1024.
    #[arg(long, value_name = "W", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub window: u16,

    /// Unmeasured round trips first (latency tests) [default: a tenth of
    /// --iters, at most 200; 100 with --duration].
    #[arg(long, value_name = "N")]
    pub warmup: Option<u64>,

    /// Skip the same-run baselines (softrdma figures alone, no ratio).
    #[arg(long, conflicts_with = "versus")]
    pub no_baseline: bool,

    /// Alternate baseline and test R times, each with 1/R of the iterations
    /// or duration, 1 to 100; the rounds merge into one result each.
    #[arg(long, value_name = "R", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,

    /// Take the same test over TRANSPORT as the reference instead of raw
    /// sockets, alternated the same way (a head-to-head ratio, e.g. UD
    /// against RC latency).
    #[arg(long, value_name = "TRANSPORT", value_parser = transport_names())]
    pub versus: Option<String>,

    /// Also run fi_pingpong (libfabric) and ucx_perftest (UCX) at the same
    /// sizes, if installed.
    #[arg(long)]
    pub peers: bool,
}

/// A list of message sizes (`--sizes`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeList(pub Vec<usize>);

/// A test by name, with its options: one sub-command per entry of
/// [`TESTS`] and [`BASELINES`].
#[derive(Clone, Debug)]
pub struct TestCommand {
    /// The test.
    pub test: &'static TestDef,
    /// Its options.
    pub args: TestArgs,
    /// `--transport` was on the command line (not the test's default).
    pub transport_given: bool,
}

fn is_baseline(t: &TestDef) -> bool {
    matches!(t.op, Op::Tcp | Op::Udp)
}

/// The transport a test runs over unless told.
fn default_transport(t: &TestDef) -> &'static str {
    match t.op {
        Op::Tcp => "tcp",
        Op::Udp => "udp",
        Op::WriteRecord => "ud",
        _ => "rc",
    }
}

/// One line on what a test measures.
fn test_about(name: &str) -> &'static str {
    match name {
        "send_lat" => "Send latency: a ping-pong of Sends (one way = round trip / 2)",
        "send_bw" => "Send bandwidth: a stream of Sends into posted receives",
        "write_lat" => "RDMA Write latency: a ping-pong of Writes, each end watching its memory",
        "write_bw" => "RDMA Write bandwidth: a stream of Writes",
        "read_lat" => "RDMA Read latency: one Read at a time (rc, rd, dc)",
        "read_bw" => "RDMA Read bandwidth: a window of Reads (rc, rd, dc)",
        "write_record_lat" => "RDMA Write-Record latency (datagram transports: ud, rd)",
        "write_record_bw" => "RDMA Write-Record bandwidth (datagram transports: ud, rd)",
        "atomic_lat" => "Atomic fetch-and-add latency, 8-octet operands (rc, rd, dc)",
        "tcp_lat" => "Raw TCP ping-pong: the baseline of rc and dc latency",
        "tcp_bw" => "Raw TCP stream: the baseline of rc and dc bandwidth",
        "tcp_mpa_lat" => {
            "tcp_lat with RC Send FPDUs framed and checked by the wire code alone: the floor \
             of RC latency"
        }
        "udp_lat" => {
            "Raw UDP ping-pong: the baseline of ud and rd latency (against tcp_lat: the floor \
             of UD latency below RC's)"
        }
        "udp_dgram_lat" => {
            "udp_lat with UD Sends framed and checked by the wire code alone: the floor of UD \
             latency"
        }
        "udp_bw" => "Raw UDP stream: the baseline of ud and rd bandwidth",
        "tcp_mpa_bw" => {
            "tcp_bw as RC Write FPDUs without CRC, each payload read into place by its own \
             readv: the floor of RC Write bandwidth without CRC"
        }
        "tcp_mpa_crc_bw" => {
            "tcp_mpa_bw with the MPA CRC32C at both ends: the floor of RC Write bandwidth \
             with CRC"
        }
        "tcp_crc_bw" => {
            "tcp_bw with CRC32C over every octet at both ends: the ceiling of MPA with CRC"
        }
        "udp_crc_bw" => {
            "udp_bw with a CRC32C trailer per datagram and the receiver copying each payload \
             into place: the ceiling of datagram iWARP"
        }
        _ => "",
    }
}

/// The long description of a test's sub-command.
fn test_long_about(t: &TestDef) -> String {
    let about = test_about(t.name);
    let body = if is_baseline(t) {
        match cell::reference_of(t) {
            Some(r) => format!(
                "Runs {} at every size given, each next to {} measured just before it in \
                 the same process pair (ratio = {} / {}; --no-baseline or `softrdma perf \
                 baseline {}`: alone).",
                t.name, r.name, t.name, r.name, t.name
            ),
            None => format!("Runs {} at every size given: a raw-socket figure.", t.name),
        }
    } else {
        let tail = if t.kind == Kind::Lat {
            "latency: lower is better"
        } else {
            "bandwidth: higher is better"
        };
        format!(
            "Runs {} at every size given, each next to its raw-socket baseline ({}_{} for \
             rc and dc, udp_{} for ud and rd) measured in the same process pair; ratio = \
             softrdma / baseline ({tail}).",
            t.name,
            "tcp",
            if t.kind == Kind::Lat { "lat" } else { "bw" },
            if t.kind == Kind::Lat { "lat" } else { "bw" },
        )
    };
    format!(
        "{about}.\n\n{body} Without --server or --connect both ends run on this host as two \
         processes; the table goes to stdout, progress to stderr."
    )
}

/// The sub-command of test `t`.
fn test_command(t: &'static TestDef) -> Command {
    // After the options: they bring TestArgs' own description.
    let cmd = TestArgs::augment_args(Command::new(t.name))
        .about(test_about(t.name))
        .long_about(test_long_about(t))
        .after_long_help(
            "Exit status: 0 when every cell worked, 1 when a cell failed (the table says \
             which and why), 2 for a bad command line.",
        );
    if is_baseline(t) {
        cmd.mut_arg("transport", |a| a.hide(true))
            .mut_arg("versus", |a| a.hide(true))
    } else {
        cmd.mut_arg("transport", |a| a.default_value(default_transport(t)))
    }
}

impl FromArgMatches for TestCommand {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let (name, sub) = m
            .subcommand()
            .ok_or_else(|| clap::Error::new(clap::error::ErrorKind::MissingSubcommand))?;
        let test = test_by_name(name).ok_or_else(|| {
            clap::Error::raw(
                clap::error::ErrorKind::InvalidSubcommand,
                format!("unknown test {name:?}"),
            )
        })?;
        Ok(TestCommand {
            test,
            args: TestArgs::from_arg_matches(sub)?,
            transport_given: sub.value_source("transport") == Some(ValueSource::CommandLine),
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Subcommand for TestCommand {
    fn augment_subcommands(cmd: Command) -> Command {
        TESTS
            .iter()
            .chain(BASELINES)
            .fold(cmd, |cmd, t| cmd.subcommand(test_command(t)))
    }

    fn augment_subcommands_for_update(cmd: Command) -> Command {
        Self::augment_subcommands(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        test_by_name(name).is_some()
    }
}

impl TestArgs {
    /// The options of `test` as the measurement code takes them, after the
    /// checks that depend on the test; `Err`: what is wrong (a usage error).
    /// `alone`: `softrdma perf baseline`, no reference run.
    pub(crate) fn opts(
        self,
        t: &'static TestDef,
        transport_given: bool,
        alone: bool,
    ) -> Result<Opts, String> {
        let baseline_test = is_baseline(t);
        if baseline_test && transport_given {
            return Err(format!("{}: a baseline takes no --transport", t.name));
        }
        let transport = match (&self.transport, baseline_test) {
            (Some(tr), false) => transport_by_name(tr).expect("a possible value").name,
            _ => default_transport(t),
        };
        let mut sizes = match (self.size, self.sizes) {
            (_, Some(SizeList(l))) => l,
            (Some(s), None) => vec![s],
            (None, None) => vec![t.fixed_size.unwrap_or(64)],
        };
        if let Some(fixed) = t.fixed_size {
            sizes.retain(|&s| s == fixed);
            if sizes.is_empty() {
                sizes.push(fixed);
            }
        }
        let o = Opts {
            test: t,
            transport,
            sizes,
            iters: self.iters,
            duration: self.duration,
            server: self.server,
            port: self.port,
            connect: self.connect,
            no_crc: self.no_crc,
            verify: self.verify,
            json: self.json,
            wait: self.wait,
            window: usize::from(self.window),
            warmup: self.warmup,
            baseline: !(self.no_baseline || alone),
            peers: self.peers,
            rounds: self.rounds,
            versus: self
                .versus
                .map(|v| transport_by_name(&v).expect("a possible value").name),
        };
        if !baseline_test {
            let tr = transport_by_name(o.transport).expect("checked");
            if let Some(why) = (tr.refuses)(t.op) {
                let hint = if transport_given {
                    ""
                } else {
                    " (default transport)"
                };
                return Err(format!("{} over {}{hint}: {why}", t.name, tr.name));
            }
        }
        if let Some(v) = o.versus {
            if baseline_test {
                return Err(format!("{}: a baseline takes no --versus", t.name));
            }
            if v == o.transport {
                return Err(format!("--versus {v}: the test runs over {v} already"));
            }
            let tr = transport_by_name(v).expect("checked");
            if let Some(why) = (tr.refuses)(t.op) {
                return Err(format!("--versus {v}: {} over {v}: {why}", t.name));
            }
        }
        if t.op == Op::Write && t.kind == Kind::Lat && o.wait == WaitMode::Event {
            return Err(
                "write_lat watches memory (a Write raises no event at its target): use --wait \
                 poll"
                    .into(),
            );
        }
        Ok(o)
    }
}

/// Parses a size: `64`, `4k`, `4Ki`, `4K`, `1m`, `1Mi`, `1M`.
pub(crate) fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s
        .strip_suffix("Ki")
        .or_else(|| s.strip_suffix('K'))
        .or_else(|| s.strip_suffix('k'))
    {
        (n, 1 << 10)
    } else if let Some(n) = s
        .strip_suffix("Mi")
        .or_else(|| s.strip_suffix('M'))
        .or_else(|| s.strip_suffix('m'))
    {
        (n, 1 << 20)
    } else {
        (s, 1)
    };
    num.parse::<usize>().ok()?.checked_mul(mul)
}

/// A message size (`parse_size`), 1 to [`cell::MAX_SIZE`].
pub(crate) fn size_arg(s: &str) -> Result<usize, String> {
    let n = parse_size(s).ok_or_else(|| format!("bad size {s:?} (64, 4Ki, 1Mi, ...)"))?;
    if n == 0 || n > cell::MAX_SIZE {
        return Err(format!("size {n} out of range (1 .. {})", cell::MAX_SIZE));
    }
    Ok(n)
}

/// `--sizes`: `A,B,...` or `all`.
fn sizes_arg(s: &str) -> Result<SizeList, String> {
    if s == "all" {
        return Ok(SizeList((1..=23).map(|e| 1usize << e).collect()));
    }
    s.split(',')
        .map(size_arg)
        .collect::<Result<_, _>>()
        .map(SizeList)
}

/// A count of at least 1.
pub(crate) fn count_arg(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// `--duration` of a test: seconds in (0, 3600].
fn duration_arg(s: &str) -> Result<f64, String> {
    let d: f64 = s.parse().map_err(|_| format!("bad duration {s:?}"))?;
    if !(d > 0.0 && d <= 3600.0) {
        return Err("must be in (0, 3600] seconds".into());
    }
    Ok(d)
}

/// `--budget` of the suite: whole seconds, 1 to 3600.
pub(crate) fn budget_arg(s: &str) -> Result<Duration, String> {
    s.parse::<u64>()
        .ok()
        .filter(|b| (1..=3600).contains(b))
        .map(Duration::from_secs)
        .ok_or_else(|| "whole seconds, 1 to 3600".into())
}

/// The wait modes, with the names [`WaitMode::parse`] also takes.
pub(crate) fn wait_arg() -> impl TypedValueParser<Value = WaitMode> {
    PossibleValuesParser::new([
        PossibleValue::new("poll")
            .aliases(["busy", "busy-poll"])
            .help("spin: poll_cq in a loop, non-blocking sockets"),
        PossibleValue::new("event")
            .aliases(["events", "block"])
            .help("sleep: completion channel events, blocking sockets"),
    ])
    .map(|s| WaitMode::parse(&s).expect("a possible value"))
}

/// What a transport is, for the help.
fn transport_help(name: &str) -> &'static str {
    match name {
        "rc" => "reliable connection: iWARP over TCP",
        "ud" => "unreliable datagram over UDP",
        "rd" => "reliable datagram over UDP",
        "dc" => "SoftDC: RC connections made on demand",
        _ => "",
    }
}

/// The transports of [`TRANSPORTS`].
fn transport_names() -> PossibleValuesParser {
    PossibleValuesParser::new(
        TRANSPORTS
            .iter()
            .map(|t| PossibleValue::new(t.name).help(transport_help(t.name))),
    )
}

/// The baselines of [`BASELINES`].
fn baseline_names() -> PossibleValuesParser {
    PossibleValuesParser::new(
        BASELINES
            .iter()
            .map(|t| PossibleValue::new(t.name).help(test_about(t.name))),
    )
}

/// `--tcp-cc`: `system` or an algorithm the kernel lets this process set.
fn tcp_cc_arg(s: &str) -> Result<String, String> {
    if s.is_empty() || s.starts_with('-') {
        return Err("an algorithm (cubic, reno, bbr, ...) or system".into());
    }
    tcp_cc::check(s)?;
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes_and_ranges() {
        assert_eq!(parse_size("64Ki"), Some(65536));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("x"), None);
        assert!(size_arg("0").is_err());
        assert!(size_arg("32m").is_err());
        assert_eq!(size_arg("16Mi"), Ok(16 << 20));
        assert_eq!(
            sizes_arg("64,4Ki,1m"),
            Ok(SizeList(vec![64, 4096, 1 << 20]))
        );
        assert_eq!(sizes_arg("all").unwrap().0.len(), 23);
        assert!(sizes_arg("64,,1").is_err());
        assert!(count_arg("0").is_err());
        assert!(duration_arg("0").is_err());
        assert!(duration_arg("3600.5").is_err());
        assert_eq!(budget_arg("15"), Ok(Duration::from_secs(15)));
        assert!(budget_arg("0").is_err());
    }
}
