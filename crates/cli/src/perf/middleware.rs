//! `softrdma perf middleware`: unmodified middleware over softrdma next to
//! its own reference, in one run.
//!
//! * **qperf against perftest**: Debian's `qperf` (`rc_lat` at 64 B,
//!   `rc_bw` and `rc_rdma_read_bw` at 64 KiB, polling with `-cp1` as
//!   perftest does) and perftest's `ib_send_lat`, `ib_send_bw`,
//!   `ib_read_bw` at the same sizes, both over softrdma (`softrdma_lo`);
//!   `softrdma perf send_lat`/`send_bw`/`read_bw` against the same
//!   perftest figures.
//! * **fi_pingpong**: libfabric's verbs provider over softrdma (`-e msg`,
//!   and `verbs;ofi_rxm` with `-e rdm`) against libfabric's own `tcp`
//!   provider (`-e msg`, `tcp;ofi_rxm` with `-e rdm`) on the kernel's
//!   TCP, at 64 B (one-way latency) and 1 MiB (ping-pong bandwidth).
//! * **MPI**: `middleware_c/mpi_pp.c`, built with `mpicc` at run time,
//!   over Open MPI's cm PML and ofi MTL on softrdma
//!   (`FI_PROVIDER=verbs;ofi_rxm`, each rank's MTL must report a
//!   `softrdma_` domain) against `--mca pml ob1 --mca btl tcp,self`
//!   without softrdma: one-way latency at 8 B, windowed bandwidth at
//!   1 MiB.
//!
//! Every program runs in a process group of its own with its output in
//! files; at its deadline the whole group (mpirun's daemons and ranks
//! too) is killed, the cell says so and the run goes on. A program that
//! is not installed makes its cells "not installed" (no failure). The
//! programs over softrdma get softrdma's libraries on `LD_LIBRARY_PATH` as
//! `softrdma run` gives them; the references get the caller's
//! `LD_LIBRARY_PATH` without them.
//!
//! Each figure is measured once per run; ratios (softrdma / reference)
//! are per run and their medians over `--runs` are shown, every value
//! with its run-to-run spread ((max − min) / median).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::loss::proc::load_note;
use super::report::PerfResult;
use super::runs::{self, ratio_stats, stats, Figure};

/// What `softrdma perf middleware --help` says first.
pub(crate) const ABOUT: &str = "Runs unmodified middleware over softrdma next to a \
    reference in the same run, on 127.0.0.1: qperf's rc_lat (64 B), rc_bw and \
    rc_rdma_read_bw (64 KiB) against perftest's ib_send_lat, ib_send_bw and ib_read_bw \
    (both over softrdma, polling), softrdma perf send_lat/send_bw/read_bw against the same \
    perftest figures, fi_pingpong over libfabric's verbs provider (msg, and rdm through \
    ofi_rxm) against libfabric's own tcp provider at 64 B and 1 MiB, and an MPI ping-pong \
    (8 B latency, 1 MiB bandwidth) over Open MPI's cm PML and ofi MTL on softrdma against \
    Open MPI's ob1 PML over the tcp BTL.\n\n\
    Ratios are softrdma / reference per run (latency: lower is better; bandwidth: higher \
    is better); with --runs N the table shows their medians and each value's run-to-run \
    spread. A program that is not installed (qperf, perftest, fi_pingpong, mpirun, mpicc) \
    makes its rows \"not installed\"; a failed or overrun measurement shows FAILED with the \
    program's error line and the run goes on.\n\n\
    softrdma's libraries are looked for as `softrdma run` looks for them.";

/// `softrdma perf middleware [OPTIONS]`.
#[derive(Debug, clap::Args)]
#[command(
    after_long_help = "Output: the table, the failures and the notes on stdout (--json: \
    one JSON object instead), progress on stderr.\n\n\
    Exit status: 0 when every measurement worked (\"not installed\" is no failure), 1 when \
    one failed, 2 for a bad command line."
)]
pub(crate) struct MiddlewareArgs {
    /// Short runs: fewer iterations and 1 s qperf tests.
    #[arg(long)]
    quick: bool,

    /// Print one JSON object (every run's cells, the medians, the
    /// ratios) on stdout instead of the table.
    #[arg(long)]
    json: bool,

    /// Repeat the whole set N times, 1 to 50; the table shows medians.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    runs: u32,
}

/// The MPI program.
const MPI_PP_C: &str = include_str!("middleware_c/mpi_pp.c");

/// perftest's device: softrdma's loopback device.
const DEVICE: &str = "softrdma_lo";

/// libfabric's providers for Open MPI's ofi MTL over softrdma.
const MPI_PROVIDER: &str = "verbs;ofi_rxm";

// ---------------------------------------------------------------------
// Parsers
// ---------------------------------------------------------------------

/// rstream's `usec/xfer` (the last column of its result row: half a
/// round trip).
pub(crate) fn parse_rstream(out: &str) -> Option<f64> {
    let mut lines = out.lines();
    lines.find(|l| l.starts_with("name") && l.contains("usec/xfer"))?;
    lines
        .find(|l| !l.trim().is_empty())?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// qperf's first figure (`latency = 21.3 us`, `bw = 1.26 GB/sec`): µs for
/// a latency, MB/s (10^6 B/s) for a bandwidth.
pub(crate) fn parse_qperf(out: &str) -> Option<f64> {
    for line in out.lines() {
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let mut w = value.split_whitespace();
        let (Some(v), Some(unit)) = (w.next().and_then(|v| v.parse::<f64>().ok()), w.next()) else {
            continue;
        };
        let scale = match (name.trim(), unit) {
            ("latency", "ns") => 1e-3,
            ("latency", "us") => 1.0,
            ("latency", "ms") => 1e3,
            ("latency", "sec") => 1e6,
            ("bw", "bytes/sec") => 1e-6,
            ("bw", "KB/sec") => 1e-3,
            ("bw", "MB/sec") => 1.0,
            ("bw", "GB/sec") => 1e3,
            ("bw", "TB/sec") => 1e6,
            _ => continue,
        };
        return Some(v * scale);
    }
    None
}

/// The result row of a perftest table: the header's tokens and the row's
/// (the first line after the `#bytes` header that starts with a number).
fn perftest_row(out: &str) -> Option<(Vec<&str>, Vec<&str>)> {
    let mut lines = out.lines();
    let header = lines.find(|l| l.trim_start().starts_with("#bytes"))?;
    let row = lines.find(|l| {
        l.split_whitespace()
            .next()
            .is_some_and(|w| w.parse::<u64>().is_ok())
    })?;
    Some((
        header.split_whitespace().collect(),
        row.split_whitespace().collect(),
    ))
}

/// perftest's latency table: `t_avg[usec]` (one way, as qperf's figure).
pub(crate) fn parse_perftest_lat(out: &str) -> Option<f64> {
    let (h, r) = perftest_row(out)?;
    let at = h.iter().position(|t| *t == "t_avg[usec]")?;
    r.get(at)?.parse().ok()
}

/// perftest's bandwidth table: `BW average[MB/sec]`, whose MB is 2^20
/// octets, as MB/s (10^6 B/s); `[Gb/sec]` (with `--report_gbits`) too.
pub(crate) fn parse_perftest_bw(out: &str) -> Option<f64> {
    let (h, r) = perftest_row(out)?;
    // `BW peak[..] BW average[..]`: two tokens each, one column each.
    let at = h.iter().position(|t| t.starts_with("average["))?;
    let col = at - h[..at].iter().filter(|t| **t == "BW").count();
    let v: f64 = r.get(col)?.parse().ok()?;
    if h[at].contains("Gb/sec") {
        Some(v * 1e3 / 8.0)
    } else {
        Some(v * 1.048_576)
    }
}

/// fi_pingpong's row: (one-way µs `usec/xfer`, MB/s `MB/sec`), only when
/// every message sent was acknowledged (`#ack` is `=#sent`).
pub(crate) fn parse_fi_pingpong(out: &str) -> Option<(f64, f64)> {
    let mut lines = out.lines();
    let header: Vec<&str> = lines
        .find(|l| l.starts_with("bytes") && l.contains("usec/xfer"))?
        .split_whitespace()
        .collect();
    let row: Vec<&str> = lines.next()?.split_whitespace().collect();
    let col = |name: &str| header.iter().position(|t| *t == name);
    let (sent, ack) = (row.get(col("#sent")?)?, row.get(col("#ack")?)?);
    if ack.strip_prefix('=') != Some(sent) {
        return None;
    }
    let lat = row.get(col("usec/xfer")?)?.parse().ok()?;
    let mbps = row.get(col("MB/sec")?)?.parse().ok()?;
    Some((lat, mbps))
}

/// `mpi_pp`'s lines: (one-way µs at 8 B, MB/s at 1 MiB).
pub(crate) fn parse_mpi_pp(out: &str) -> (Option<f64>, Option<f64>) {
    let (mut lat, mut bw) = (None, None);
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["mpi_pp", "lat", "8", v] => lat = v.parse().ok(),
            ["mpi_pp", "bw", "1048576", v] => bw = v.parse().ok(),
            _ => {}
        }
    }
    (lat, bw)
}

/// The ofi MTL's domains in an `mtl_base_verbose` output, one per rank.
pub(crate) fn mtl_domains(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split("mtl:ofi:provider: ").nth(1))
        .map(|d| d.trim().to_string())
        .collect()
}

/// `softrdma perf TEST --json`'s figure for `test`: mean one-way µs of a
/// latency test, MB/s of a bandwidth test.
pub(crate) fn parse_perf_json(out: &str, test: &str) -> Result<f64, String> {
    let r = out
        .lines()
        .filter_map(PerfResult::from_json)
        .find(|r| r.test == test)
        .ok_or_else(|| format!("no {test} result printed"))?;
    if let Some(e) = r.error {
        return Err(e);
    }
    if test.ends_with("_lat") {
        r.lat_us_mean.ok_or_else(|| "no latency figure".into())
    } else {
        r.bw_gbps
            .map(|g| g * 1e3 / 8.0)
            .ok_or_else(|| "no bandwidth figure".into())
    }
}

/// The line of `out` that best says what went wrong: the last that
/// mentions an error or a failure, else the last; at most 240 characters.
pub(crate) fn complaint(out: &str) -> String {
    let lines: Vec<&str> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let at = lines
        .iter()
        .rposition(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("fail") || l.contains("error") || l.contains("couldn't")
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
// Processes
// ---------------------------------------------------------------------

/// A program in a process group of its own, its output in files.
struct Proc {
    child: Option<Child>,
    pgid: i32,
    out: PathBuf,
    err: PathBuf,
    status: Option<ExitStatus>,
}

impl Proc {
    fn start(mut cmd: Command, base: &Path) -> Result<Proc, String> {
        let out = base.with_extension("out");
        let err = base.with_extension("err");
        let file = |p: &Path| File::create(p).map_err(|e| format!("{}: {e}", p.display()));
        cmd.stdin(Stdio::null())
            .stdout(file(&out)?)
            .stderr(file(&err)?)
            .process_group(0);
        let name = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name}: {e}"))?;
        Ok(Proc {
            pgid: child.id() as i32,
            child: Some(child),
            out,
            err,
            status: None,
        })
    }

    /// Waits until it exits or `until`; its status, `None` if it still runs.
    fn wait_until(&mut self, until: Instant) -> Option<ExitStatus> {
        loop {
            if self.status.is_some() {
                return self.status;
            }
            let c = self.child.as_mut()?;
            match c.try_wait() {
                Ok(Some(st)) => {
                    self.child = None;
                    self.status = Some(st);
                }
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                _ => return None,
            }
        }
    }

    /// Kills its whole group (what is left of it).
    fn kill(&mut self) {
        // kill(1) on the group created for this child (no libc binding
        // here); a group that is gone already is no error.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pgid)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(mut c) = self.child.take() {
            self.status = c.wait().ok();
        }
    }

    /// stdout, then stderr.
    fn output(&self) -> String {
        let read =
            |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
        format!("{}\n{}", read(&self.out), read(&self.err))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a TCP listener is on `port` of this host.
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 3 && w[1].ends_with(&want) && w[3] == "0A"
            })
        })
    })
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

/// One figure of one run.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Cell {
    /// Measured.
    Ok(f64),
    /// The program is not installed (not a failure).
    NotInstalled(String),
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
        matches!(self, Cell::NotInstalled(_))
    }
}

impl Cell {
    fn json(&self) -> Value {
        match self {
            Cell::Ok(v) => json!(v),
            Cell::NotInstalled(p) => json!({ "not_installed": p }),
            Cell::Failed(w) => json!({ "failed": w }),
        }
    }
}

/// Which environment a program runs in.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Over {
    Softrdma,
    Reference,
}

/// The run's context.
struct Ctx {
    dir: PathBuf,
    quick: bool,
    /// `LD_LIBRARY_PATH` for programs over softrdma, or why there is none.
    softrdma_path: Result<OsString, String>,
    /// `LD_LIBRARY_PATH` for the references (the caller's without
    /// softrdma's directory).
    reference_path: Option<OsString>,
    /// The built MPI program, or why there is none.
    mpi_pp: Option<Result<PathBuf, Cell>>,
    seq: u32,
}

impl Ctx {
    fn new(dir: PathBuf, quick: bool) -> Ctx {
        let old = std::env::var_os("LD_LIBRARY_PATH");
        let link = crate::run::find_lib_dir(crate::run::VERBS)
            .map_err(|looked| {
                format!(
                    "softrdma's libibverbs not found (looked in {})",
                    looked.join(", ")
                )
            })
            .and_then(|d| {
                crate::run::link_dir(&d).map_err(|e| format!("cannot make the library links: {e}"))
            });
        let reference_path = old.as_ref().map(|o| {
            let keep: Vec<PathBuf> = std::env::split_paths(o)
                .filter(|p| link.as_ref().ok() != Some(p))
                .collect();
            std::env::join_paths(keep).unwrap_or_default()
        });
        Ctx {
            dir,
            quick,
            softrdma_path: link.map(|l| crate::run::library_path(&l, old)),
            reference_path,
            mpi_pp: None,
            seq: 0,
        }
    }

    /// `prog args` in the environment of `over`.
    fn command(&self, prog: &str, args: &[&str], over: Over) -> Result<Command, Cell> {
        if !on_path(prog) {
            return Err(Cell::NotInstalled(prog.into()));
        }
        let mut c = Command::new(prog);
        c.args(args);
        self.environ(&mut c, over)?;
        Ok(c)
    }

    fn environ(&self, c: &mut Command, over: Over) -> Result<(), Cell> {
        match over {
            Over::Softrdma => {
                let p = self
                    .softrdma_path
                    .as_ref()
                    .map_err(|e| Cell::Failed(e.clone()))?;
                c.env("LD_LIBRARY_PATH", p);
            }
            Over::Reference => match &self.reference_path {
                Some(p) if !p.is_empty() => {
                    c.env("LD_LIBRARY_PATH", p);
                }
                _ => {
                    c.env_remove("LD_LIBRARY_PATH");
                }
            },
        }
        Ok(())
    }

    fn base(&mut self, tag: &str) -> PathBuf {
        self.seq += 1;
        let tag: String = tag
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        self.dir.join(format!("{:03}-{tag}", self.seq))
    }

    /// Runs `cmd` alone until `deadline`; its output, or why it failed.
    fn single(&mut self, cmd: Command, tag: &str, deadline: Duration) -> Result<String, Cell> {
        let base = self.base(tag);
        let mut p = Proc::start(cmd, &base).map_err(Cell::Failed)?;
        let st = p.wait_until(Instant::now() + deadline);
        p.kill();
        let out = p.output();
        match st {
            None => Err(Cell::Failed(format!(
                "killed at its deadline of {} s ({})",
                deadline.as_secs(),
                complaint(&out)
            ))),
            Some(s) if !s.success() => Err(Cell::Failed(format!("{s}: {}", complaint(&out)))),
            Some(_) => Ok(out),
        }
    }

    /// Runs `server`, then once it listens on `port` `client`, the pair
    /// within `deadline`; the client's output, or why it failed.
    fn pair(
        &mut self,
        server: Command,
        client: Command,
        port: u16,
        tag: &str,
        deadline: Duration,
    ) -> Result<String, Cell> {
        let until = Instant::now() + deadline;
        let mut s =
            Proc::start(server, &self.base(&format!("{tag}-server"))).map_err(Cell::Failed)?;
        let listen_by = Instant::now() + Duration::from_secs(15).min(deadline);
        while !listening(port) {
            if s.wait_until(Instant::now()).is_some() {
                return Err(Cell::Failed(format!(
                    "the server exited before listening: {}",
                    complaint(&s.output())
                )));
            }
            if Instant::now() >= listen_by {
                s.kill();
                return Err(Cell::Failed(format!(
                    "the server did not listen on port {port}: {}",
                    complaint(&s.output())
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut c =
            Proc::start(client, &self.base(&format!("{tag}-client"))).map_err(Cell::Failed)?;
        let cst = c.wait_until(until);
        // The server ends on its own after a client that finished.
        let grace = Instant::now() + Duration::from_secs(if cst.is_some() { 5 } else { 0 });
        s.wait_until(grace);
        c.kill();
        s.kill();
        let (cout, sout) = (c.output(), s.output());
        match cst {
            None => Err(Cell::Failed(format!(
                "killed at its deadline of {} s ({})",
                deadline.as_secs(),
                complaint(&format!("{cout}\n{sout}"))
            ))),
            Some(st) if !st.success() => Err(Cell::Failed(format!(
                "client {st}: {}",
                complaint(&format!("{cout}\n{sout}"))
            ))),
            Some(_) => Ok(cout),
        }
    }

    fn pair_deadline(&self) -> Duration {
        Duration::from_secs(if self.quick { 40 } else { 90 })
    }

    /// qperf `test` at `size` over softrdma.
    fn qperf(&mut self, test: &str, size: &str, cm: bool) -> Cell {
        let port = match free_port() {
            Ok(p) => p,
            Err(e) => return Cell::Failed(e),
        };
        let ps = port.to_string();
        let secs = if self.quick { "1" } else { "3" };
        let r = (|| -> Result<Cell, Cell> {
            let s = self.command("qperf", &["-lp", &ps], Over::Softrdma)?;
            let mut args = vec!["127.0.0.1", "-lp", &ps, "-cp1", "-t", secs, "-m", size];
            if cm {
                // The QPs connected through rdma_cm.
                args.push("-cm1");
            }
            args.extend([test, "quit"]);
            let c = self.command("qperf", &args, Over::Softrdma)?;
            let out = self.pair(s, c, port, &format!("qperf-{test}"), self.pair_deadline())?;
            // qperf reports a failed test and still exits 0.
            if out.to_ascii_lowercase().contains("fail") {
                return Err(Cell::Failed(complaint(&out)));
            }
            parse_qperf(&out)
                .filter(|v| *v > 0.0)
                .map(Cell::Ok)
                .ok_or_else(|| Cell::Failed(format!("no figure: {}", complaint(&out))))
        })();
        r.unwrap_or_else(|c| c)
    }

    /// perftest `prog` at `size` over softrdma.
    fn perftest(&mut self, prog: &str, size: usize) -> Cell {
        let port = match free_port() {
            Ok(p) => p,
            Err(e) => return Cell::Failed(e),
        };
        let lat = prog.ends_with("_lat");
        let iters = match (lat, self.quick) {
            (true, true) => 2000,
            (true, false) => 10000,
            (false, true) => 2000,
            (false, false) => 10000,
        }
        .to_string();
        let (ps, ss) = (port.to_string(), size.to_string());
        let r = (|| -> Result<Cell, Cell> {
            let args = ["-d", DEVICE, "-p", &ps, "-s", &ss, "-n", &iters];
            let s = self.command(prog, &args, Over::Softrdma)?;
            let mut cargs = args.to_vec();
            cargs.push("127.0.0.1");
            let c = self.command(prog, &cargs, Over::Softrdma)?;
            let out = self.pair(s, c, port, prog, self.pair_deadline())?;
            let v = if lat {
                parse_perftest_lat(&out)
            } else {
                parse_perftest_bw(&out)
            };
            v.filter(|v| *v > 0.0)
                .map(Cell::Ok)
                .ok_or_else(|| Cell::Failed(format!("no result row: {}", complaint(&out))))
        })();
        r.unwrap_or_else(|c| c)
    }

    /// rdma-core's `rstream` ping-pong at `size` (rsockets over softrdma's
    /// librdmacm, its default blocking calls): µs per transfer one way.
    fn rstream(&mut self, size: usize) -> Cell {
        let port = match free_port() {
            Ok(p) => p,
            Err(e) => return Cell::Failed(e),
        };
        let count = if self.quick { "2000" } else { "20000" };
        let (ps, ss) = (port.to_string(), size.to_string());
        let r = (|| -> Result<Cell, Cell> {
            let args = ["-p", &ps, "-S", &ss, "-C", count];
            let s = self.command("rstream", &args, Over::Softrdma)?;
            let mut cargs = vec!["-s", "127.0.0.1"];
            cargs.extend(args);
            let c = self.command("rstream", &cargs, Over::Softrdma)?;
            let out = self.pair(s, c, port, "rstream", self.pair_deadline())?;
            parse_rstream(&out)
                .filter(|v| *v > 0.0)
                .map(Cell::Ok)
                .ok_or_else(|| Cell::Failed(format!("no result row: {}", complaint(&out))))
        })();
        r.unwrap_or_else(|c| c)
    }

    /// `softrdma perf test` at `size` alone (this executable).
    fn perf(&mut self, test: &str, size: &str) -> Cell {
        let exe = match std::env::current_exe() {
            Ok(e) => e,
            Err(e) => return Cell::Failed(format!("this executable: {e}")),
        };
        let mut c = Command::new(exe);
        c.args(["perf", test, "--sizes", size, "--no-baseline", "--json"]);
        if test.ends_with("_lat") {
            c.args(["--iters", if self.quick { "2000" } else { "10000" }]);
        } else {
            c.args(["--duration", if self.quick { "1" } else { "3" }]);
        }
        match self.single(c, &format!("perf-{test}"), self.pair_deadline()) {
            Ok(out) => parse_perf_json(&out, test).map_or_else(Cell::Failed, Cell::Ok),
            Err(c) => c,
        }
    }

    /// fi_pingpong with `prov`/`ep` at `size` in `over`: (latency, MB/s)
    /// cells.
    fn fi_pingpong(&mut self, prov: &str, ep: &str, size: usize, over: Over) -> (Cell, Cell) {
        let port = match free_port() {
            Ok(p) => p,
            Err(e) => return (Cell::Failed(e.clone()), Cell::Failed(e)),
        };
        let iters = match (size <= 64, self.quick) {
            (true, true) => 2000,
            (true, false) => 10000,
            (false, true) => 100,
            (false, false) => 500,
        }
        .to_string();
        let (ps, ss) = (port.to_string(), size.to_string());
        let r = (|| {
            let base = ["-p", prov, "-e", ep, "-S", &ss, "-I", &iters];
            let mut sargs = base.to_vec();
            sargs.extend(["-B", &ps]);
            let mut cargs = base.to_vec();
            cargs.extend(["-P", &ps, "127.0.0.1"]);
            let s = self.command("fi_pingpong", &sargs, over)?;
            let c = self.command("fi_pingpong", &cargs, over)?;
            let out = self.pair(
                s,
                c,
                port,
                &format!("fi-{prov}-{ep}-{size}"),
                self.pair_deadline(),
            )?;
            parse_fi_pingpong(&out)
                .ok_or_else(|| Cell::Failed(format!("no complete result row: {}", complaint(&out))))
        })();
        match r {
            Ok((l, b)) => (Cell::Ok(l), Cell::Ok(b)),
            Err(c) => (c.clone(), c),
        }
    }

    /// Builds `mpi_pp` once.
    fn mpi_program(&mut self) -> Result<PathBuf, Cell> {
        if let Some(r) = &self.mpi_pp {
            return r.clone();
        }
        let r = (|| {
            for p in ["mpicc", "mpirun"] {
                if !on_path(p) {
                    return Err(Cell::NotInstalled(p.into()));
                }
            }
            let src = self.dir.join("mpi_pp.c");
            std::fs::write(&src, MPI_PP_C)
                .map_err(|e| Cell::Failed(format!("{}: {e}", src.display())))?;
            let exe = self.dir.join("mpi_pp");
            let mut c = Command::new("mpicc");
            c.args(["-O2", "-Wall", "-o"]).arg(&exe).arg(&src);
            self.single(c, "mpicc", Duration::from_secs(120))
                .map_err(|c| match c {
                    Cell::Failed(w) => Cell::Failed(format!("mpicc: {w}")),
                    c => c,
                })?;
            Ok(exe)
        })();
        self.mpi_pp = Some(r.clone());
        r
    }

    /// The MPI ping-pong in `over`: (8 B latency, 1 MiB MB/s) cells.
    fn mpi(&mut self, over: Over) -> (Cell, Cell) {
        let r = (|| {
            let exe = self.mpi_program()?;
            let (iters, reps) = if self.quick {
                ("2000", "10")
            } else {
                ("10000", "40")
            };
            let mut args: Vec<String> = ["--allow-run-as-root", "--oversubscribe", "-np", "2"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            let stack: &[&str] = match over {
                Over::Softrdma => &[
                    "-x",
                    "FI_PROVIDER",
                    "--mca",
                    "pml",
                    "cm",
                    "--mca",
                    "mtl",
                    "ofi",
                    "--mca",
                    "mtl_base_verbose",
                    "100",
                ],
                Over::Reference => &["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"],
            };
            args.extend(stack.iter().map(|s| s.to_string()));
            args.push(exe.display().to_string());
            args.extend([iters.to_string(), reps.to_string()]);
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut c = self.command("mpirun", &argv, over)?;
            if over == Over::Softrdma {
                c.env("FI_PROVIDER", MPI_PROVIDER);
            }
            let tag = if over == Over::Softrdma {
                "mpi-softrdma"
            } else {
                "mpi-tcp"
            };
            let out = self.single(
                c,
                tag,
                Duration::from_secs(if self.quick { 90 } else { 180 }),
            )?;
            if over == Over::Softrdma {
                let d = mtl_domains(&out);
                if d.len() != 2 || !d.iter().all(|d| d.starts_with("softrdma_")) {
                    return Err(Cell::Failed(format!(
                        "the ofi MTL is not on softrdma's domains: {d:?}"
                    )));
                }
            }
            match parse_mpi_pp(&out) {
                (Some(l), Some(b)) => Ok((l, b)),
                _ => Err(Cell::Failed(format!("no figures: {}", complaint(&out)))),
            }
        })();
        match r {
            Ok((l, b)) => (Cell::Ok(l), Cell::Ok(b)),
            Err(c) => (c.clone(), c),
        }
    }
}

// ---------------------------------------------------------------------
// Rows
// ---------------------------------------------------------------------

/// One figure's key in a run.
type Run = BTreeMap<&'static str, Cell>;

/// A row of the table: a figure over softrdma and its reference.
struct RowDef {
    label: &'static str,
    /// `µs` (lower is better) or `MB/s`.
    unit: &'static str,
    subject: &'static str,
    reference: &'static str,
    /// What the reference is.
    note: &'static str,
}

const ROWS: &[RowDef] = &[
    RowDef {
        label: "qperf rc_lat 64 B",
        unit: "µs",
        subject: "qperf/rc_lat",
        reference: "perftest/ib_send_lat",
        note: "perftest ib_send_lat -s 64 over softrdma (t_avg)",
    },
    RowDef {
        label: "qperf rc_bw 64 KiB",
        unit: "MB/s",
        subject: "qperf/rc_bw",
        reference: "perftest/ib_send_bw",
        note: "perftest ib_send_bw -s 65536 over softrdma",
    },
    RowDef {
        label: "qperf rc_rdma_read_bw 64 KiB",
        unit: "MB/s",
        subject: "qperf/rc_rdma_read_bw",
        reference: "perftest/ib_read_bw",
        note: "perftest ib_read_bw -s 65536 over softrdma",
    },
    RowDef {
        label: "qperf -cm1 rc_lat 64 B",
        unit: "µs",
        subject: "qperf-cm/rc_lat",
        reference: "perftest/ib_send_lat",
        note: "QPs through rdma_cm; perftest ib_send_lat -s 64 (t_avg)",
    },
    RowDef {
        label: "qperf -cm1 rc_bw 64 KiB",
        unit: "MB/s",
        subject: "qperf-cm/rc_bw",
        reference: "perftest/ib_send_bw",
        note: "QPs through rdma_cm; perftest ib_send_bw -s 65536",
    },
    RowDef {
        label: "rstream 64 B",
        unit: "µs",
        subject: "rstream/lat",
        reference: "perftest/ib_send_lat",
        note:
            "rsockets ping-pong (usec/xfer, half a round trip) vs an RC Send's (t_avg); both poll",
    },
    RowDef {
        label: "softrdma perf send_lat 64 B",
        unit: "µs",
        subject: "perf/send_lat",
        reference: "perftest/ib_send_lat",
        note: "perftest ib_send_lat -s 64 (t_avg); perf: mean one-way",
    },
    RowDef {
        label: "softrdma perf send_bw 64 KiB",
        unit: "MB/s",
        subject: "perf/send_bw",
        reference: "perftest/ib_send_bw",
        note: "perftest ib_send_bw -s 65536",
    },
    RowDef {
        label: "softrdma perf read_bw 64 KiB",
        unit: "MB/s",
        subject: "perf/read_bw",
        reference: "perftest/ib_read_bw",
        note: "perftest ib_read_bw -s 65536",
    },
    RowDef {
        label: "fi_pingpong msg 64 B",
        unit: "µs",
        subject: "fi/verbs-msg/lat",
        reference: "fi/tcp-msg/lat",
        note: "-p verbs over softrdma vs libfabric's -p tcp, kernel TCP",
    },
    RowDef {
        label: "fi_pingpong msg 1 MiB",
        unit: "MB/s",
        subject: "fi/verbs-msg/bw",
        reference: "fi/tcp-msg/bw",
        note: "ping-pong bandwidth, same pair of providers",
    },
    RowDef {
        label: "fi_pingpong rdm 64 B",
        unit: "µs",
        subject: "fi/verbs-rdm/lat",
        reference: "fi/tcp-rdm/lat",
        note: "verbs;ofi_rxm over softrdma vs tcp;ofi_rxm, kernel TCP",
    },
    RowDef {
        label: "fi_pingpong rdm 1 MiB",
        unit: "MB/s",
        subject: "fi/verbs-rdm/bw",
        reference: "fi/tcp-rdm/bw",
        note: "ping-pong bandwidth, same pair of providers",
    },
    RowDef {
        label: "MPI ping-pong 8 B",
        unit: "µs",
        subject: "mpi/softrdma/lat",
        reference: "mpi/tcp/lat",
        note: "cm + ofi MTL (verbs;ofi_rxm) on softrdma vs ob1 + btl tcp,self",
    },
    RowDef {
        label: "MPI bandwidth 1 MiB",
        unit: "MB/s",
        subject: "mpi/softrdma/bw",
        reference: "mpi/tcp/bw",
        note: "16 MPI_Isend in flight; same two stacks",
    },
];

/// A key's median, spread and count over the runs, or why none.
type Stats = runs::Stats<Cell>;

fn fmt_stat(s: &Stats) -> String {
    match (s.median, &s.why) {
        (Some(m), _) if m >= 100.0 => format!("{m:.0}"),
        (Some(m), _) => format!("{m:.2}"),
        (None, Some(Cell::NotInstalled(_))) => "not installed".into(),
        (None, Some(Cell::Failed(_))) => "FAILED".into(),
        _ => "-".into(),
    }
}

fn fmt_spread(s: &Stats) -> String {
    s.spread
        .map_or_else(|| "-".into(), |v| format!("{:.0}%", v * 100.0))
}

/// The table.
fn format_table(runs: &[Run]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<29} {:>5} {:>13} {:>5} {:>13} {:>5} {:>6} {:>5}",
        "row", "unit", "softrdma", "±", "reference", "±", "ratio", "±"
    );
    for r in ROWS {
        let a = stats(runs, r.subject);
        let b = stats(runs, r.reference);
        let q = ratio_stats(runs, r.subject, r.reference);
        let _ = writeln!(
            o,
            "{:<29} {:>5} {:>13} {:>5} {:>13} {:>5} {:>6} {:>5}",
            r.label,
            r.unit,
            fmt_stat(&a),
            fmt_spread(&a),
            fmt_stat(&b),
            fmt_spread(&b),
            q.median.map_or_else(|| "-".into(), |v| format!("{v:.2}")),
            fmt_spread(&q),
        );
    }
    let _ = writeln!(o, "\nreferences:");
    for r in ROWS {
        let _ = writeln!(o, "  {:<29} {}", r.label, r.note);
    }
    o
}

/// Every failed cell: (run, key, why).
fn failures(runs: &[Run]) -> Vec<(usize, &'static str, String)> {
    let mut f = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        for (k, c) in r {
            if let Cell::Failed(w) = c {
                f.push((i + 1, *k, w.clone()));
            }
        }
    }
    f
}

fn progress(t0: Instant, r: u32, runs: u32, key: &str, c: &Cell) {
    let text = match c {
        Cell::Ok(v) => format!("{v:.2}"),
        Cell::NotInstalled(p) => format!("not installed ({p})"),
        Cell::Failed(w) => format!("FAILED: {w}"),
    };
    eprintln!(
        "[{:>6.1} s] run {r}/{runs}: {key}: {text}",
        t0.elapsed().as_secs_f64()
    );
}

/// One run of the whole set.
fn one_run(ctx: &mut Ctx, t0: Instant, r: u32, runs: u32) -> Run {
    let mut run = Run::new();
    let put = |run: &mut Run, key: &'static str, c: Cell| {
        progress(t0, r, runs, key, &c);
        run.insert(key, c);
    };
    for (key, test, size, cm) in [
        ("qperf/rc_lat", "rc_lat", "64", false),
        ("qperf/rc_bw", "rc_bw", "64K", false),
        ("qperf/rc_rdma_read_bw", "rc_rdma_read_bw", "64K", false),
        ("qperf-cm/rc_lat", "rc_lat", "64", true),
        ("qperf-cm/rc_bw", "rc_bw", "64K", true),
    ] {
        let c = ctx.qperf(test, size, cm);
        put(&mut run, key, c);
    }
    let c = ctx.rstream(64);
    put(&mut run, "rstream/lat", c);
    for (key, prog, size) in [
        ("perftest/ib_send_lat", "ib_send_lat", 64),
        ("perftest/ib_send_bw", "ib_send_bw", 65536),
        ("perftest/ib_read_bw", "ib_read_bw", 65536),
    ] {
        let c = ctx.perftest(prog, size);
        put(&mut run, key, c);
    }
    for (key, test, size) in [
        ("perf/send_lat", "send_lat", "64"),
        ("perf/send_bw", "send_bw", "64Ki"),
        ("perf/read_bw", "read_bw", "64Ki"),
    ] {
        let c = ctx.perf(test, size);
        put(&mut run, key, c);
    }
    for (lat_key, bw_key, prov, ep, over) in [
        (
            "fi/verbs-msg/lat",
            "fi/verbs-msg/bw",
            "verbs",
            "msg",
            Over::Softrdma,
        ),
        (
            "fi/tcp-msg/lat",
            "fi/tcp-msg/bw",
            "tcp",
            "msg",
            Over::Reference,
        ),
        (
            "fi/verbs-rdm/lat",
            "fi/verbs-rdm/bw",
            "verbs;ofi_rxm",
            "rdm",
            Over::Softrdma,
        ),
        (
            "fi/tcp-rdm/lat",
            "fi/tcp-rdm/bw",
            "tcp;ofi_rxm",
            "rdm",
            Over::Reference,
        ),
    ] {
        let (l, _) = ctx.fi_pingpong(prov, ep, 64, over);
        put(&mut run, lat_key, l);
        let (_, b) = ctx.fi_pingpong(prov, ep, 1 << 20, over);
        put(&mut run, bw_key, b);
    }
    for (over, lat_key, bw_key) in [
        (Over::Softrdma, "mpi/softrdma/lat", "mpi/softrdma/bw"),
        (Over::Reference, "mpi/tcp/lat", "mpi/tcp/bw"),
    ] {
        let (l, b) = ctx.mpi(over);
        put(&mut run, lat_key, l);
        put(&mut run, bw_key, b);
    }
    run
}

/// Entry point of `softrdma perf middleware`.
pub(crate) fn main(a: MiddlewareArgs) -> ExitCode {
    let dir = std::env::temp_dir().join(format!("softrdma-perf-middleware-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("softrdma perf middleware: {}: {e}", dir.display());
        return ExitCode::from(1);
    }
    let mut ctx = Ctx::new(dir.clone(), a.quick);
    if let Err(e) = &ctx.softrdma_path {
        eprintln!("softrdma perf middleware: {e}; every softrdma figure will fail");
    }
    let t0 = Instant::now();
    let runs: Vec<Run> = (1..=a.runs)
        .map(|r| one_run(&mut ctx, t0, r, a.runs))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    let fails = failures(&runs);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&a, &runs, &fails)).expect("serializes")
        );
    } else {
        println!(
            "softrdma perf middleware: loopback, {} run{}{}; {}",
            a.runs,
            if a.runs == 1 { "" } else { "s" },
            if a.quick { ", quick" } else { "" },
            load_note()
        );
        println!(
            "medians; ± = (max-min)/median over the runs; ratio = softrdma / reference per \
             run (µs: lower is better, MB/s = 10^6 B/s: higher is better)\n"
        );
        print!("{}", format_table(&runs));
        if !fails.is_empty() {
            println!("\nfailed:");
            for (r, k, w) in &fails {
                println!("  run {r}, {k}: {w}");
            }
        }
    }
    if fails.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn to_json(a: &MiddlewareArgs, runs: &[Run], fails: &[(usize, &str, String)]) -> Value {
    let st = |s: &Stats| json!({ "median": s.median, "spread": s.spread, "runs": s.n });
    json!({
        "runs": a.runs,
        "quick": a.quick,
        "load": load_note(),
        "rows": ROWS.iter().map(|r| json!({
            "row": r.label,
            "unit": r.unit,
            "softrdma": st(&stats(runs, r.subject)),
            "reference": st(&stats(runs, r.reference)),
            "ratio": st(&ratio_stats(runs, r.subject, r.reference)),
            "subject_key": r.subject,
            "reference_key": r.reference,
            "reference_note": r.note,
        })).collect::<Vec<_>>(),
        "cells": runs.iter().map(|r| {
            r.iter().map(|(k, c)| (k.to_string(), c.json())).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
        "failures": fails.iter().map(|(r, k, w)| json!({ "run": r, "cell": k, "error": w }))
            .collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rstream_result_row() {
        let out = "name      bytes   xfers   iters   total       time     Gb/sec    usec/xfer\n\
                   custom    64      20k     1       2.4m        0.26s      0.08       6.53\n";
        assert_eq!(parse_rstream(out), Some(6.53));
        assert_eq!(
            parse_rstream("rstream: connect: Connection refused\n"),
            None
        );
        assert_eq!(
            parse_rstream("name bytes xfers iters total time Gb/sec usec/xfer\n"),
            None
        );
    }

    #[test]
    fn qperf_output_parses() {
        assert_eq!(
            parse_qperf("rc_lat:\n    latency  =  59.8 us\nquit:\n"),
            Some(59.8)
        );
        assert_eq!(
            parse_qperf("rc_lat:\n    latency  =  1.5 ms\n"),
            Some(1500.0)
        );
        assert_eq!(
            parse_qperf("rc_rdma_read_bw:\n    bw  =  1.26 GB/sec\n"),
            Some(1260.0)
        );
        assert_eq!(parse_qperf("rc_bw:\n    bw  =  550 MB/sec\n"), Some(550.0));
        assert_eq!(parse_qperf("rc_bw:\n    bw  =  20 KB/sec\n"), Some(0.02));
        assert_eq!(
            parse_qperf("rc_bw:\nfailed to receive RDMA CQ event\n"),
            None
        );
        assert_eq!(parse_qperf("x = y us\n"), None);
    }

    const LAT: &str = "\
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      1000          4.19           22004.11      5.26     	       964.11      	2710.57		13998.53 		22004.11
---------------------------------------------------------------------------------------
";

    const BW: &str = "\
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      2000             1100.25            1000.00		   0.016000
---------------------------------------------------------------------------------------
";

    #[test]
    fn perftest_output_parses() {
        assert_eq!(parse_perftest_lat(LAT), Some(964.11));
        let bw = parse_perftest_bw(BW).unwrap();
        assert!((bw - 1048.576).abs() < 1e-9, "{bw}");
        let gb = BW.replace("[MB/sec]", "[Gb/sec]");
        assert_eq!(parse_perftest_bw(&gb), Some(125_000.0));
        // No row under the header: no figure.
        assert_eq!(parse_perftest_lat(&LAT.replace(" 64 ", " x ")), None);
        assert_eq!(parse_perftest_bw("Couldn't connect to 127.0.0.1:1\n"), None);
        // A latency table is not a bandwidth one.
        assert_eq!(parse_perftest_bw(LAT), None);
    }

    #[test]
    fn fi_pingpong_output_parses() {
        let out =
            "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                   64      1k      =1k      125k        0.10s      1.29      49.62       0.02\n";
        assert_eq!(parse_fi_pingpong(out), Some((49.62, 1.29)));
        // Not every message acknowledged.
        let partial = out.replace("=1k", "=999");
        assert_eq!(parse_fi_pingpong(&partial), None);
        assert_eq!(parse_fi_pingpong("fi_getinfo(): -61\n"), None);
    }

    #[test]
    fn mpi_output_parses() {
        let out = "[vm:1] mtl_ofi_component.c:365: mtl:ofi:provider: softrdma_eth0\n\
                   [vm:2] mtl_ofi_component.c:365: mtl:ofi:provider: softrdma_lo\n\
                   mpi_pp lat 8 17.252\nmpi_pp bw 1048576 2263.4\n";
        assert_eq!(parse_mpi_pp(out), (Some(17.252), Some(2263.4)));
        assert_eq!(mtl_domains(out), vec!["softrdma_eth0", "softrdma_lo"]);
        assert_eq!(parse_mpi_pp("mpi_pp lat 16 3\n"), (None, None));
    }

    #[test]
    fn perf_json_parses() {
        let mut r = PerfResult::new("send_lat", "rc", 64, "poll");
        r.lat_us_mean = Some(7.5);
        r.lat_us_p50 = Some(7.0);
        let mut b = PerfResult::new("send_bw", "rc", 65536, "poll");
        b.bw_gbps = Some(8.0);
        let out = format!("{}\n{}\n", r.to_json(), b.to_json());
        assert_eq!(parse_perf_json(&out, "send_lat"), Ok(7.5));
        assert_eq!(parse_perf_json(&out, "send_bw"), Ok(1000.0));
        assert!(parse_perf_json(&out, "read_bw").is_err());
        let f = PerfResult::failed("read_bw", "rc", 65536, "poll", "boom");
        assert_eq!(parse_perf_json(&f.to_json(), "read_bw"), Err("boom".into()));
    }

    #[test]
    fn complaints() {
        assert_eq!(
            complaint("rc_bw:\nfailed to receive RDMA CQ event\nquit:\n"),
            "failed to receive RDMA CQ event"
        );
        assert_eq!(complaint("a\nb\n"), "b");
        assert_eq!(complaint(""), "(no output)");
    }

    #[test]
    fn rows_ratios_and_table() {
        let run = |q: f64, p: f64| -> Run {
            [
                ("qperf/rc_lat", Cell::Ok(q)),
                ("perftest/ib_send_lat", Cell::Ok(p)),
                ("qperf/rc_bw", Cell::Failed("receiver not ready".into())),
                ("perftest/ib_send_bw", Cell::Ok(1000.0)),
                ("mpi/softrdma/lat", Cell::NotInstalled("mpirun".into())),
                ("mpi/tcp/lat", Cell::NotInstalled("mpirun".into())),
            ]
            .into_iter()
            .collect()
        };
        // Ratios per run: 2.0, 1.0, 3.0; their median is 2.0.
        let runs = vec![run(10.0, 5.0), run(6.0, 6.0), run(12.0, 4.0)];
        let r = ratio_stats(&runs, "qperf/rc_lat", "perftest/ib_send_lat");
        assert_eq!((r.median, r.n), (Some(2.0), 3));
        let s = stats(&runs, "qperf/rc_lat");
        assert_eq!(s.median, Some(10.0));
        assert_eq!(s.spread, Some(0.6));
        let t = format_table(&runs);
        assert!(t.contains("FAILED"), "{t}");
        assert!(t.contains("not installed"), "{t}");
        assert!(t.contains("2.00"), "{t}");
        let f = failures(&runs);
        assert_eq!(f.len(), 3);
        assert!(f
            .iter()
            .all(|(_, k, w)| *k == "qperf/rc_bw" && w == "receiver not ready"));
        // Every row's keys are measured by a run.
        let keys = [
            "qperf/rc_lat",
            "qperf/rc_bw",
            "qperf/rc_rdma_read_bw",
            "qperf-cm/rc_lat",
            "qperf-cm/rc_bw",
            "rstream/lat",
            "perftest/ib_send_lat",
            "perftest/ib_send_bw",
            "perftest/ib_read_bw",
            "perf/send_lat",
            "perf/send_bw",
            "perf/read_bw",
            "fi/verbs-msg/lat",
            "fi/verbs-msg/bw",
            "fi/tcp-msg/lat",
            "fi/tcp-msg/bw",
            "fi/verbs-rdm/lat",
            "fi/verbs-rdm/bw",
            "fi/tcp-rdm/lat",
            "fi/tcp-rdm/bw",
            "mpi/softrdma/lat",
            "mpi/softrdma/bw",
            "mpi/tcp/lat",
            "mpi/tcp/bw",
        ];
        for r in ROWS {
            assert!(
                keys.contains(&r.subject) && keys.contains(&r.reference),
                "{}",
                r.label
            );
        }
    }

    /// A pair whose client overruns is killed at the deadline, group and
    /// all; a program not on PATH is "not installed".
    #[test]
    fn deadlines_kill_and_missing_programs() {
        let d = std::env::temp_dir().join(format!("softrdma-mw-test-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let mut ctx = Ctx::new(d.clone(), true);
        // The "server": this test's own listener, and a sleeper.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut s = Command::new("sleep");
        s.arg("60");
        let mut c = Command::new("sh");
        // The grandchild sleeps in the same group: killed too.
        c.args(["-c", "sleep 60 & echo started; wait"]);
        let t = Instant::now();
        let r = ctx.pair(s, c, port, "t", Duration::from_secs(1));
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        match r {
            Err(Cell::Failed(w)) => assert!(w.contains("deadline"), "{w}"),
            other => panic!("{other:?}"),
        }
        let r = ctx.command("no-such-program-here", &[], Over::Reference);
        assert!(matches!(r, Err(Cell::NotInstalled(p)) if p == "no-such-program-here"));
        let mut c = Command::new("sh");
        c.args(["-c", "echo 'Error: bad thing' >&2; exit 3"]);
        match ctx.single(c, "f", Duration::from_secs(10)) {
            Err(Cell::Failed(w)) => assert!(w.contains("Error: bad thing"), "{w}"),
            other => panic!("{other:?}"),
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
