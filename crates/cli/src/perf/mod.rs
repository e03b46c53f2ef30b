//! `softrdma perf`: perftest-style benchmarks whose every figure is a ratio
//! to a raw-socket baseline measured in the same run.
//!
//! Sub-commands: `TEST` (send_lat, write_bw, …), `baseline`, `suite`,
//! `loss`, `scale`, `sockets`, `exs`, `middleware`; their command line is [`cli`]. Each returns an
//! [`ExitCode`]: 0 when every cell worked, 1 when a cell failed (the table
//! says which and why), 2 for bad arguments. Errors are printed on stderr
//! with the reason.
//!
//! Modules shared by every sub-command (also `loss` and `scale`):
//! [`hist`] (latency histogram), [`ctrl`] (control channel), [`spawn`]
//! (re-executing this binary for the other end), [`cell`] (tests,
//! transports, cell parameters, verify pattern), [`baseline`] (raw TCP/UDP
//! runners), [`rdma`] (softrdma runners), [`report`] (results, table,
//! JSON), [`peers`] (libfabric and UCX), [`plot`] (PNG charts).

pub(crate) mod baseline;
pub(crate) mod cell;
pub(crate) mod cli;
pub(crate) mod ctrl;
pub(crate) mod dc;
pub(crate) mod exs;
pub(crate) mod hist;
pub mod loss;
pub(crate) mod middleware;
pub(crate) mod mpa_bw;
pub(crate) mod peers;
pub mod plot;
pub(crate) mod rdma;
pub(crate) mod report;
pub(crate) mod runs;
pub mod scale;
pub(crate) mod sockets;
pub(crate) mod spawn;
pub(crate) mod suite;
pub(crate) mod tcp_cc;

use std::io::Write;
use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Duration;

use cell::{
    baseline_for, dgram_mtu, dgram_payload, transport_by_name, Kind, Op, Spec, TestDef, WaitMode,
};
pub use cli::PerfArgs;
use cli::PerfCommand;
use ctrl::{Ctrl, Msg};
use report::PerfResult;

/// Default control port (perftest's).
pub(crate) const DEFAULT_PORT: u16 = 18515;

/// Entry point of `softrdma perf`.
pub fn main(a: PerfArgs) -> ExitCode {
    // Every sub-command's TCP connections, and its children's, run one
    // congestion control algorithm (`tcp_cc` module docs).
    if a.tcp_cc.len() > 1 {
        return crate::usage_error(&["perf"], "--tcp-cc given twice");
    }
    if let Err(e) = tcp_cc::settle(a.tcp_cc.first().map(String::as_str)) {
        return crate::usage_error(&["perf"], &e);
    }
    match a.command {
        PerfCommand::Suite(o) => suite::main(o),
        PerfCommand::Loss(l) => loss::main(l),
        PerfCommand::Scale(s) => scale::main(s),
        PerfCommand::Sockets(s) => sockets::main(s, a.tcp_cc.first().cloned()),
        PerfCommand::Exs(e) => exs::main(e),
        PerfCommand::Middleware(m) => middleware::main(m),
        PerfCommand::Server(s) => serve_port(s.port, s.announce),
        PerfCommand::Baseline(b) => {
            let test = cell::test_by_name(&b.name).expect("a possible value");
            // Alone: even a baseline with a reference (`tcp_crc_bw`).
            let transport_given = b.opts.transport.is_some();
            match b.opts.opts(test, transport_given, true) {
                Ok(o) => test_main(o),
                Err(e) => crate::usage_error(&["perf", "baseline"], &e),
            }
        }
        PerfCommand::Test(t) => match t.args.opts(t.test, t.transport_given, false) {
            Ok(o) => test_main(o),
            Err(e) => crate::usage_error(&["perf", t.test.name], &e),
        },
    }
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

fn test_main(o: Opts) -> ExitCode {
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

/// Serves one control session on `port`: the hidden server end of
/// loopback runs (`__server --announce`: 127.0.0.1 only, prints `LISTENING
/// <port>` on stdout, gives up after 30 s without a client) or `--server`
/// (every address, waits a day).
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
    use super::cli::parse_size;
    use super::*;
    use clap::Parser;

    /// `softrdma perf TEST ARGS` as `test_main` gets it, or the error.
    fn parse_opts(test: &str, args: &[String]) -> Result<Opts, String> {
        let argv = ["softrdma", "perf", test].into_iter().map(String::from);
        let cli = crate::Cli::try_parse_from(argv.chain(args.iter().cloned()))
            .map_err(|e| e.to_string())?;
        match cli.command {
            crate::Command::Perf(PerfArgs {
                command: PerfCommand::Test(t),
                ..
            }) => t.args.opts(t.test, t.transport_given, false),
            other => panic!("not a test: {other:?}"),
        }
    }

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
