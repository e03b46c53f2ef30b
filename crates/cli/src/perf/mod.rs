//! `softrdma perf`: perftest-style benchmarks whose every figure is a ratio
//! to a raw-socket baseline measured in the same run.
//!
//! Sub-commands: `TEST` (send_lat, write_bw, …), `baseline`, `suite`,
//! `loss`, `scale`. Each returns an [`ExitCode`]: 0 when every cell
//! worked, 1 when a cell failed (the table says which and why), 2 for bad
//! arguments. Errors are printed on stderr with the reason.
//!
//! Modules shared by every sub-command (also `loss` and `scale`):
//! [`hist`] (latency histogram), [`ctrl`] (control channel), [`spawn`]
//! (re-executing this binary for the other end), [`cell`] (tests,
//! transports, cell parameters, verify pattern), [`baseline`] (raw TCP/UDP
//! runners), [`rdma`] (softrdma runners), [`report`] (results, table,
//! JSON), [`peers`] (libfabric and UCX), [`plot`] (PNG charts).

pub(crate) mod baseline;
pub(crate) mod cell;
pub(crate) mod ctrl;
pub(crate) mod dc;
pub(crate) mod hist;
pub mod loss;
pub(crate) mod mpa_bw;
pub(crate) mod peers;
pub mod plot;
pub(crate) mod rdma;
pub(crate) mod report;
pub mod scale;
pub(crate) mod spawn;
pub(crate) mod suite;
pub(crate) mod tcp_cc;

use std::io::Write;
use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Duration;

use cell::{
    baseline_for, dgram_mtu, dgram_payload, test_by_name, transport_by_name, Kind, Op, Spec,
    TestDef, WaitMode, BASELINES, TRANSPORTS,
};
use ctrl::{Ctrl, Msg};
use report::PerfResult;

const USAGE: &str = "usage: softrdma perf suite|loss|scale|baseline B|TEST [OPTIONS]

  softrdma perf suite [--quick] [--out DIR] [--json] [--peers] [--wait poll|event]
                      [--budget S] [--tcp-cc NAME|system]
      the loopback matrix (test x transport x size) with raw-socket ratios,
      report.md and PNG plots in DIR (default perf-report/)
  softrdma perf TEST [OPTIONS]        one test, every size with its baseline
  softrdma perf baseline B [OPTIONS]  a raw-socket baseline alone

TEST: send_lat send_bw write_lat write_bw read_lat read_bw
      write_record_lat write_record_bw atomic_lat
B:    tcp_lat tcp_bw udp_lat udp_bw
      tcp_crc_bw (tcp_bw with CRC32C over every octet at both ends, the
      ceiling of MPA with CRC), udp_crc_bw (udp_bw with a CRC32C trailer
      per datagram and the receiver copying each payload to its place, the
      ceiling of datagram iWARP), tcp_mpa_lat (tcp_lat whose messages
      are RC Send FPDUs framed and checked by the wire code alone, the
      floor of RC latency), tcp_mpa_bw (tcp_bw whose stream is RC Write
      FPDUs without CRC, each payload read into place by its own readv,
      the floor of RC Write bandwidth without CRC), tcp_mpa_crc_bw
      (tcp_mpa_bw with the MPA CRC32C at both ends, the floor of RC Write
      bandwidth with CRC), udp_dgram_lat (udp_lat whose datagrams are UD
      Sends framed and checked by the wire code alone, the floor of UD
      latency); `softrdma perf tcp_crc_bw|udp_crc_bw|tcp_mpa_lat|
      tcp_mpa_bw|tcp_mpa_crc_bw|udp_dgram_lat|udp_lat` gives the ratio to
      tcp_bw|udp_bw|tcp_lat|tcp_bw|tcp_bw|udp_lat|tcp_lat of the same run
      (udp_lat against tcp_lat: the floor of UD latency below RC's)

options:
  --transport rc|ud|rd|dc  (default rc; write_record_* default ud; dc also
                           reports its first-message latency in the note)
  --size BYTES | --sizes A,B,...|all   (64, 4Ki, 1Mi; all = 2 .. 8Mi)
  --iters N | --duration S (default: 1000 round trips / 1 s of stream)
  --server [--port P]      serve one session (default port 18515)
  --connect HOST[:PORT]    measure against a server
                           (neither: loopback, the two ends as two processes)
  --wait poll|event        how both ends wait (default poll: busy-polling)
  --no-crc                 RC without MPA CRC (give it to both ends)
  --verify                 fill and check every byte of every message
  --json                   one JSON object per result on stdout
  --window W               outstanding messages of bandwidth tests (16)
  --warmup N               unmeasured round trips first (latency tests)
  --no-baseline            skip the same-run baselines
  --rounds R               alternate baseline and test R times, each with
                           1/R of the iterations (default 1)
  --versus TRANSPORT       the same test over TRANSPORT as the reference
                           instead of raw sockets, alternated the same way
                           (a head-to-head ratio, e.g. UD vs RC latency)
  --peers                  also run fi_pingpong / ucx_perftest if installed
  --tcp-cc NAME|system     TCP congestion control of every connection of the
                           run, raw and RC (default cubic if the kernel allows
                           it: loopback streams under bbr are bimodal; system
                           keeps the host's default; every sub-command)";

/// Default control port (perftest's).
pub(crate) const DEFAULT_PORT: u16 = 18515;

/// Bad command line: message and exit code 2.
pub(crate) fn usage_error(what: &str) -> ExitCode {
    eprintln!("softrdma perf: {what}\n(softrdma perf --help for usage)");
    ExitCode::from(2)
}

/// Entry point of `softrdma perf ARGS`.
pub fn main(args: &[String]) -> ExitCode {
    if matches!(
        args.first().map(String::as_str),
        Some("-h") | Some("--help") | Some("help")
    ) {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    // Every sub-command's TCP connections, and its children's, run one
    // congestion control algorithm (`tcp_cc` module docs).
    let (args, cc) = match tcp_cc::take_option(args) {
        Ok(x) => x,
        Err(e) => return usage_error(&e),
    };
    // A sub-command asked for its usage runs nothing: no algorithm to
    // check (a bad one would otherwise hide the usage).
    let help = args.iter().any(|a| a == "-h" || a == "--help");
    if !help {
        if let Err(e) = tcp_cc::settle(cc.as_deref()) {
            return usage_error(&e);
        }
    }
    let args = &args[..];
    match args.first().map(String::as_str) {
        Some("loss") => loss::main(&args[1..]),
        Some("scale") => scale::main(&args[1..]),
        Some("suite") => suite::main(&args[1..]),
        Some("__server") => server_main(&args[1..]),
        None => usage_error("which test? (suite, baseline, send_lat, …)"),
        Some("baseline") => match args.get(1) {
            Some(b) if BASELINES.iter().any(|t| t.name == b) => {
                // Alone: even a baseline with a reference (`tcp_crc_bw`).
                let mut rest = args[2..].to_vec();
                rest.push("--no-baseline".into());
                test_main(b, &rest)
            }
            Some(b) => usage_error(&format!(
                "unknown baseline {b:?} (tcp_lat, tcp_bw, udp_lat, udp_bw, tcp_crc_bw, udp_crc_bw, tcp_mpa_lat, tcp_mpa_bw, tcp_mpa_crc_bw, udp_dgram_lat)"
            )),
            None => usage_error(
                "baseline: which one? (tcp_lat, tcp_bw, udp_lat, udp_bw, tcp_crc_bw, udp_crc_bw, tcp_mpa_lat, tcp_mpa_bw, tcp_mpa_crc_bw, udp_dgram_lat)",
            ),
        },
        Some(t) if test_by_name(t).is_some() => test_main(t, &args[1..]),
        Some(other) => usage_error(&format!("unknown test or command {other:?}")),
    }
}

/// Parses a size: `64`, `4k`, `4Ki`, `4K`, `1m`, `1Mi`.
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

/// The options of `softrdma perf TEST`.
#[derive(Clone, Debug)]
pub(crate) struct Opts {
    pub test: &'static TestDef,
    pub transport: &'static str,
    pub sizes: Vec<usize>,
    pub iters: Option<u64>,
    pub duration: Option<f64>,
    pub server: bool,
    pub port: u16,
    pub connect: Option<String>,
    pub no_crc: bool,
    pub verify: bool,
    pub json: bool,
    pub wait: WaitMode,
    pub window: usize,
    pub warmup: Option<u64>,
    pub baseline: bool,
    pub peers: bool,
    pub rounds: u32,
    /// The reference is the same test over this transport (`--versus`).
    pub versus: Option<&'static str>,
}

fn parse_opts(test: &str, args: &[String]) -> Result<Opts, String> {
    let t = test_by_name(test).ok_or_else(|| format!("unknown test {test:?}"))?;
    let mut o = Opts {
        test: t,
        transport: match t.op {
            Op::Tcp => "tcp",
            Op::Udp => "udp",
            Op::WriteRecord => "ud",
            _ => "rc",
        },
        sizes: vec![t.fixed_size.unwrap_or(64)],
        iters: None,
        duration: None,
        server: false,
        port: DEFAULT_PORT,
        connect: None,
        no_crc: false,
        verify: false,
        json: false,
        wait: WaitMode::Poll,
        window: 16,
        warmup: None,
        baseline: true,
        peers: false,
        rounds: 1,
        versus: None,
    };
    let mut transport_given = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "--transport" | "-t" => {
                let v = val(a)?;
                if matches!(t.op, Op::Tcp | Op::Udp) {
                    return Err(format!("{}: a baseline takes no --transport", t.name));
                }
                let tr = transport_by_name(&v).ok_or_else(|| {
                    let names: Vec<_> = TRANSPORTS.iter().map(|t| t.name).collect();
                    format!("unknown transport {v:?} (one of {})", names.join(", "))
                })?;
                o.transport = tr.name;
                transport_given = true;
            }
            "--size" | "-s" => {
                let v = val(a)?;
                o.sizes = vec![parse_size(&v).ok_or_else(|| format!("bad --size {v:?}"))?];
            }
            "--sizes" => {
                let v = val(a)?;
                o.sizes = if v == "all" {
                    (1..=23).map(|e| 1usize << e).collect()
                } else {
                    v.split(',')
                        .map(|s| parse_size(s).ok_or_else(|| format!("bad size {s:?} in --sizes")))
                        .collect::<Result<_, _>>()?
                };
            }
            "--iters" | "-n" => {
                let v = val(a)?;
                let n: u64 = v.parse().map_err(|_| format!("bad --iters {v:?}"))?;
                if n == 0 {
                    return Err("--iters must be at least 1".into());
                }
                o.iters = Some(n);
            }
            "--duration" | "-D" => {
                let v = val(a)?;
                let d: f64 = v.parse().map_err(|_| format!("bad --duration {v:?}"))?;
                if !(d > 0.0 && d <= 3600.0) {
                    return Err("--duration must be in (0, 3600] seconds".into());
                }
                o.duration = Some(d);
            }
            "--server" => o.server = true,
            "--port" | "-p" => {
                let v = val(a)?;
                o.port = v.parse().map_err(|_| format!("bad --port {v:?}"))?;
            }
            "--connect" | "-c" => o.connect = Some(val(a)?),
            "--no-crc" => o.no_crc = true,
            "--verify" => o.verify = true,
            "--json" => o.json = true,
            "--wait" => {
                let v = val(a)?;
                o.wait = WaitMode::parse(&v)
                    .ok_or_else(|| format!("bad --wait {v:?} (poll or event)"))?;
            }
            "--window" => {
                let v = val(a)?;
                o.window = v
                    .parse()
                    .ok()
                    .filter(|w| (1..=1024).contains(w))
                    .ok_or_else(|| format!("bad --window {v:?} (1..=1024)"))?;
            }
            "--warmup" => {
                let v = val(a)?;
                o.warmup = Some(v.parse().map_err(|_| format!("bad --warmup {v:?}"))?);
            }
            "--no-baseline" => o.baseline = false,
            "--rounds" => {
                let v = val(a)?;
                o.rounds = v
                    .parse()
                    .ok()
                    .filter(|r| (1..=100).contains(r))
                    .ok_or_else(|| format!("bad --rounds {v:?} (1..=100)"))?;
            }
            "--peers" => o.peers = true,
            "--versus" => {
                let v = val(a)?;
                let tr = transport_by_name(&v).ok_or_else(|| {
                    let names: Vec<_> = TRANSPORTS.iter().map(|t| t.name).collect();
                    format!(
                        "unknown --versus transport {v:?} (one of {})",
                        names.join(", ")
                    )
                })?;
                o.versus = Some(tr.name);
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    if o.iters.is_some() && o.duration.is_some() {
        return Err("give --iters or --duration, not both".into());
    }
    if o.server && o.connect.is_some() {
        return Err("--server and --connect exclude each other".into());
    }
    if let Some(fixed) = t.fixed_size {
        if o.sizes.iter().any(|&s| s != fixed) {
            o.sizes.retain(|&s| s == fixed);
            if o.sizes.is_empty() {
                o.sizes.push(fixed);
            }
        }
    }
    if let Some(&bad) = o.sizes.iter().find(|&&s| s == 0 || s > cell::MAX_SIZE) {
        return Err(format!("size {bad} out of range (1 .. {})", cell::MAX_SIZE));
    }
    if !matches!(t.op, Op::Tcp | Op::Udp) {
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
        if matches!(t.op, Op::Tcp | Op::Udp) {
            return Err(format!("{}: a baseline takes no --versus", t.name));
        }
        if v == o.transport {
            return Err(format!("--versus {v}: the test runs over {v} already"));
        }
        let tr = transport_by_name(v).expect("checked");
        if let Some(why) = (tr.refuses)(t.op) {
            return Err(format!("--versus {v}: {} over {v}: {why}", t.name));
        }
        if !o.baseline {
            return Err("--versus and --no-baseline exclude each other".into());
        }
    }
    if t.op == Op::Write && t.kind == Kind::Lat && o.wait == WaitMode::Event {
        return Err(
            "write_lat watches memory (a Write raises no event at its target): use --wait poll"
                .into(),
        );
    }
    Ok(o)
}

impl Opts {
    /// The cell for `test` at `size` with these options.
    pub(crate) fn spec(&self, test: &'static TestDef, transport: &str, size: usize) -> Spec {
        let (iters, duration) = match (self.iters, self.duration, test.kind) {
            (Some(n), _, _) => (n, 0.0),
            (None, Some(d), _) => (0, d),
            (None, None, Kind::Lat) => (1000, 0.0),
            (None, None, Kind::Bw) => (0, 1.0),
        };
        let warmup = self.warmup.unwrap_or(match test.kind {
            Kind::Lat if iters > 0 => (iters / 10).min(200),
            Kind::Lat => 100,
            Kind::Bw => 0,
        });
        let op = if matches!(self.test.op, Op::Tcp | Op::Udp) {
            Op::WriteRecord
        } else {
            self.test.op
        };
        let payload_tr = if matches!(transport, "tcp" | "udp") {
            if self.transport == "rd" {
                "rd"
            } else {
                "ud"
            }
        } else {
            transport
        };
        Spec {
            test,
            transport: transport.to_string(),
            size,
            iters,
            duration,
            warmup,
            verify: self.verify,
            wait: self.wait,
            window: self.window,
            payload: dgram_payload(payload_tr, op, dgram_mtu()),
        }
    }
}

/// MPA CRC as this process's environment asks for it.
pub(crate) fn env_crc() -> bool {
    !matches!(
        std::env::var("SOFTRDMA_MPA_CRC").as_deref(),
        Ok("0") | Ok("false") | Ok("off") | Ok("no")
    )
}

fn test_main(test: &str, args: &[String]) -> ExitCode {
    let o = match parse_opts(test, args) {
        Ok(o) => o,
        Err(e) => return usage_error(&e),
    };
    if o.no_crc {
        // Before any thread or context exists: every context of this
        // process and of the children it starts reads it.
        std::env::set_var("SOFTRDMA_MPA_CRC", "0");
    }
    if o.server {
        return serve_port(o.port, false);
    }
    let (addr, child) = match &o.connect {
        Some(c) => {
            let a = if c.contains(':') && !c.ends_with(']') {
                c.clone()
            } else {
                format!("{c}:{DEFAULT_PORT}")
            };
            (a, None)
        }
        None => match spawn::ServerChild::spawn(&[], &[], Duration::from_secs(10)) {
            Ok(c) => (format!("127.0.0.1:{}", c.port), Some(c)),
            Err(e) => {
                eprintln!("softrdma perf: cannot start the server process: {e}");
                return ExitCode::from(1);
            }
        },
    };
    let mut ctrl = match Ctrl::connect(addr.as_str(), Duration::from_secs(10)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("softrdma perf: {e}");
            return ExitCode::from(1);
        }
    };
    let rows = run_sizes(&o, &mut ctrl, &mut |r: &PerfResult| {
        if o.json {
            println!("{}", r.to_json());
            let _ = std::io::stdout().flush();
        }
    });
    let _ = ctrl.send(&Msg::new("BYE"));
    drop(ctrl);
    if let Some(c) = child {
        if let Err(e) = c.finish(Duration::from_secs(10)) {
            eprintln!("softrdma perf: {e}");
        }
    }
    let mut rows = rows;
    if o.peers {
        let sizes = o.sizes.clone();
        let (found, prs) = peers::run_all(
            &sizes,
            Some(o.test.kind),
            o.wait,
            &mut |l| eprintln!("{l}"),
            None,
        );
        eprintln!("{found}");
        if let Some(n) = tcp_cc::peers_note() {
            eprintln!("note: {n}");
        }
        for r in &prs {
            if o.json {
                println!("{}", r.to_json());
            }
        }
        rows.extend(prs);
    }
    if !o.json {
        // The congestion control matters to runs with TCP in them.
        let tcp = [Some(o.transport), o.versus]
            .iter()
            .flatten()
            .any(|t| transport_by_name(t).is_some_and(|tr| tr.stream) || *t == "tcp")
            || o.test.op == Op::Tcp
            || (o.baseline && cell::reference_of(o.test).is_some_and(|b| b.op == Op::Tcp));
        println!(
            "softrdma perf {}: wait mode {} on both ends, {}{}",
            o.test.name,
            o.wait.name(),
            if o.connect.is_some() {
                "two hosts/processes (--connect)"
            } else {
                "loopback, two processes"
            },
            if tcp {
                format!(", {}", tcp_cc::describe())
            } else {
                String::new()
            }
        );
        print!("{}", report::format_table(&rows));
        println!(
            "latency: one way (round trip / 2); ratio = softrdma / baseline of this run \
             (latency: lower is better; bandwidth: higher is better)"
        );
    }
    if rows.iter().any(|r| r.error.is_some()) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs every size of `o` over `ctrl` (baseline first, then softrdma),
/// reporting each result to `emit` as it is done; returns them all.
pub(crate) fn run_sizes(
    o: &Opts,
    ctrl: &mut Ctrl,
    emit: &mut dyn FnMut(&PerfResult),
) -> Vec<PerfResult> {
    let mut rows = Vec::new();
    let is_baseline = matches!(o.test.op, Op::Tcp | Op::Udp);
    for &size in &o.sizes {
        let spec = o.spec(o.test, o.transport, size);
        let label = format!(
            "{} {} {}",
            o.test.name,
            o.transport,
            report::fmt_size(size as u64)
        );
        let reference = cell::reference_of(o.test);
        if (is_baseline && reference.is_none()) || !o.baseline {
            eprintln!("  {label} ...");
            let r = cell::run_cell(ctrl, &spec);
            if let Some(e) = &r.error {
                eprintln!("    failed: {e}");
            }
            emit(&r);
            rows.push(r);
            continue;
        }
        let (b, bspec) = match (o.versus, reference) {
            // Head to head: the same test over another transport.
            (Some(v), _) => (o.test, o.spec(o.test, v, size)),
            // A baseline doing extra work against the raw one, or raw
            // UDP against raw TCP: over the reference's own socket.
            (None, Some(b)) => {
                let tr = if b.op == Op::Tcp { "tcp" } else { "udp" };
                (b, o.spec(b, tr, size))
            }
            (None, None) => {
                let tr = transport_by_name(o.transport).expect("checked");
                let b = baseline_for(o.test, tr);
                (b, o.spec(b, if tr.stream { "tcp" } else { "udp" }, size))
            }
        };
        let b_label = match o.versus {
            Some(v) => format!("{} {v}", b.name),
            None => b.name.to_string(),
        };
        eprintln!(
            "  {label} with {b_label} ({} round{}) ...",
            o.rounds,
            if o.rounds == 1 { "" } else { "s" }
        );
        let (base, mut r) = cell::run_interleaved(ctrl, &bspec, &spec, o.rounds);
        r.set_baseline(&base);
        if o.versus.is_some() {
            // Named by transport too: the test's own name says nothing.
            r.baseline = Some(format!("{}/{}", base.test, base.transport));
        }
        for x in [&base, &r] {
            if let Some(e) = &x.error {
                eprintln!("    {} failed: {e}", x.test);
            }
        }
        emit(&base);
        emit(&r);
        rows.push(base);
        rows.push(r);
    }
    rows
}

/// `softrdma perf __server --port P [--announce]`: the hidden server end
/// of loopback runs (`--announce` prints `LISTENING <port>` on stdout).
fn server_main(args: &[String]) -> ExitCode {
    let mut port = DEFAULT_PORT;
    let mut announce = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--port" => match it.next().and_then(|v| v.parse().ok()) {
                Some(p) => port = p,
                None => return usage_error("__server: bad --port"),
            },
            "--announce" => announce = true,
            other => return usage_error(&format!("__server: unknown option {other:?}")),
        }
    }
    serve_port(port, announce)
}

fn serve_port(port: u16, announce: bool) -> ExitCode {
    let bind = if announce { "127.0.0.1" } else { "0.0.0.0" };
    let l = match TcpListener::bind((bind, port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("softrdma perf server: cannot listen on port {port}: {e}");
            return ExitCode::from(1);
        }
    };
    let port = l.local_addr().map(|a| a.port()).unwrap_or(port);
    if announce {
        println!("LISTENING {port}");
        let _ = std::io::stdout().flush();
    } else {
        eprintln!("softrdma perf server: waiting for a client on port {port}");
    }
    let within = if announce {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(24 * 3600)
    };
    let s = match baseline::accept_within(&l, within) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("softrdma perf server: {e}");
            return ExitCode::from(1);
        }
    };
    let mut ctrl = match Ctrl::new(s) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("softrdma perf server: {e}");
            return ExitCode::from(1);
        }
    };
    match cell::serve_session(&mut ctrl) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma perf server: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_refuse() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse_opts("send_lat", &a(&["--sizes", "64,4Ki,1m", "--iters", "5"])).unwrap();
        assert_eq!(o.sizes, vec![64, 4096, 1 << 20]);
        assert_eq!(o.iters, Some(5));
        assert!(parse_opts("read_lat", &a(&["--transport", "ud"]))
            .unwrap_err()
            .contains("RDMA Read"));
        assert!(parse_opts("write_record_bw", &a(&["--transport", "rc"])).is_err());
        assert!(parse_opts("send_lat", &a(&["--iters", "1", "--duration", "1"])).is_err());
        assert!(parse_opts("send_lat", &a(&["--size", "0"])).is_err());
        assert!(parse_opts("send_lat", &a(&["--bogus"])).is_err());
        assert!(parse_opts("write_lat", &a(&["--wait", "event"])).is_err());
        assert_eq!(
            parse_opts("atomic_lat", &a(&["--sizes", "all"]))
                .unwrap()
                .sizes,
            vec![8]
        );
        assert_eq!(
            parse_opts("send_lat", &a(&["--sizes", "all"]))
                .unwrap()
                .sizes
                .len(),
            23
        );
        assert_eq!(parse_size("64Ki"), Some(65536));
        assert_eq!(parse_size("x"), None);
    }
}
