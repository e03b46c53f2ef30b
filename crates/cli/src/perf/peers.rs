//! Peer benchmarks side by side with softrdma (`--peers`), when installed
//! (`scripts/install-perf-peers.sh`: Debian's libfabric-bin and
//! ucx-utils), on loopback with the same sizes:
//!
//! * libfabric `fi_pingpong` with providers `tcp` (msg endpoints),
//!   `tcp;ofi_rxm` and `udp;ofi_rxd` (rdm endpoints): its `usec/xfer`
//!   (one way, mean over the run) as latency, its `MB/sec` (10^6 octets)
//!   as a ping-pong throughput;
//! * `ucx_perftest` with `UCX_TLS=tcp`: `tag_lat` (one-way latency, its
//!   50th percentile) and `tag_bw` (stream bandwidth, MB/s of 2^20
//!   octets), final numbers (`-f`).
//!
//! Each runs as a server process and a client process; a peer that fails
//! or overruns its deadline is a failed row with the reason. The peers
//! wait the way they wait (they busy-poll their completion queues by
//! default); the report says so.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::cell::{Kind, WaitMode};
use super::report::PerfResult;
use super::spawn::run_command;

const DEADLINE: Duration = Duration::from_secs(15);

fn installed(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(47592)
}

fn iters_for(size: usize) -> usize {
    match size {
        0..=4096 => 1000,
        4097..=65536 => 200,
        _ => 50,
    }
}

/// Runs a server/client pair; returns the client's stdout.
fn pair(server: Command, client: Command) -> Result<String, String> {
    let mut server = server;
    let mut srv = server
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the server: {e}"))?;
    std::thread::sleep(Duration::from_millis(300));
    let out = run_command(client, DEADLINE, &mut |_| {});
    // The server ends with its client; make sure.
    let mut waited = 0;
    while matches!(srv.try_wait(), Ok(None)) && waited < 100 {
        std::thread::sleep(Duration::from_millis(20));
        waited += 1;
    }
    let _ = srv.kill();
    let _ = srv.wait();
    let out = out.map_err(|e| format!("cannot start the client: {e}"))?;
    match out.status {
        Some(s) if s.success() => Ok(out.stdout),
        Some(s) => Err(format!(
            "client exit {s}: {}",
            out.stderr.lines().last().unwrap_or("").trim()
        )),
        None => Err("client overran its deadline; killed".into()),
    }
}

/// Parses fi_pingpong's result row: (usec/xfer, MB/sec).
fn parse_fi(out: &str) -> Option<(f64, f64)> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("bytes"));
    lines.next()?;
    let row = lines.find(|l| !l.trim().is_empty())?;
    let f: Vec<&str> = row.split_whitespace().collect();
    if f.len() < 8 {
        return None;
    }
    Some((f[6].parse().ok()?, f[5].parse().ok()?))
}

/// Parses ucx_perftest `-f` output: (latency p50 µs, bandwidth MB/s avg).
fn parse_ucx(out: &str) -> Option<(f64, f64)> {
    let row = out.lines().rev().find(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 8 && f.iter().all(|x| x.parse::<f64>().is_ok())
    })?;
    let f: Vec<f64> = row
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    Some((f[1], f[4]))
}

const FI_PROVIDERS: [(&str, &str); 3] = [
    ("tcp", "msg"),
    ("tcp;ofi_rxm", "rdm"),
    ("udp;ofi_rxd", "rdm"),
];

/// The message size at which TCP-based peers' latency is bracketed by a
/// raw TCP ping-pong ([`run_all`]'s `yardstick`).
pub(crate) const YARDSTICK_SIZE: usize = 64;

/// The sizes at which TCP-based peers' bandwidth is bracketed by raw TCP
/// streams (those of the "RC bandwidth vs best TCP peer" target).
pub(crate) const BW_YARDSTICK_SIZES: [usize; 2] = [64 << 10, 1 << 20];

/// Measures raw TCP now: `(Kind::Lat, size)` a ping-pong (its one-way p50
/// in µs), `(Kind::Bw, size)` a stream (Gbit/s); `None` if it failed.
pub(crate) type Yardstick<'a> = &'a mut dyn FnMut(Kind, usize) -> Option<f64>;

/// Runs `peer`, bracketed by `yardstick` measuring `wanted` when there is
/// one and something is wanted: the peer's output, and the mean of the
/// raw figures just before and just after it (`None` unless both were
/// measured).
fn bracketed<T>(
    yardstick: &mut Option<Yardstick<'_>>,
    wanted: Option<(Kind, usize)>,
    peer: impl FnOnce() -> T,
) -> (T, Option<f64>) {
    let (Some(y), Some((kind, size))) = (yardstick.as_mut(), wanted) else {
        return (peer(), None);
    };
    let before = y(kind, size);
    let out = peer();
    let after = y(kind, size);
    (out, before.zip(after).map(|(a, b)| (a + b) / 2.0))
}

/// Marks a peer latency row with the raw TCP ping-pong of its moment: the
/// table then shows its ratio to raw TCP like softrdma's rows.
fn against_raw(r: &mut PerfResult, raw_us: Option<f64>) {
    if let (Some(raw), Some(lat)) = (raw_us.filter(|&v| v > 0.0), r.lat_us_p50) {
        r.baseline = Some("tcp_lat".into());
        r.baseline_value = Some(raw);
        r.ratio = Some(lat / raw);
    }
}

/// Marks a peer bandwidth row with the raw TCP stream of its moment (its
/// ratio to it, higher is better, as softrdma's rows).
fn against_raw_bw(r: &mut PerfResult, raw_gbps: Option<f64>) {
    if let (Some(raw), Some(bw)) = (raw_gbps.filter(|&v| v > 0.0), r.bw_gbps) {
        r.baseline = Some("tcp_bw".into());
        r.baseline_value = Some(raw);
        r.ratio = Some(bw / raw);
    }
}

/// What a TCP-based peer's run at `size` is bracketed with, if anything:
/// its 64 B latency run by raw ping-pongs, its bandwidth runs at
/// [`BW_YARDSTICK_SIZES`] by raw streams.
fn bracket_for(tcp: bool, lat: bool, bw: bool, size: usize) -> Option<(Kind, usize)> {
    if !tcp {
        None
    } else if lat && size == YARDSTICK_SIZE {
        Some((Kind::Lat, size))
    } else if bw && BW_YARDSTICK_SIZES.contains(&size) {
        Some((Kind::Bw, size))
    } else {
        None
    }
}

/// Runs every installed peer at `sizes` (latency and/or bandwidth per
/// `kind`, `None`: both); returns a line saying which peers were found and
/// their results. With a `yardstick`, each TCP-based peer's latency run at
/// [`YARDSTICK_SIZE`] is bracketed by raw TCP ping-pongs, and its row
/// carries their mean as its baseline: on a machine whose TCP latency
/// drifts between moments, a peer measured after softrdma's cells is then
/// compared through raw TCP of its own moment, not softrdma's.
pub(crate) fn run_all(
    sizes: &[usize],
    kind: Option<Kind>,
    wait: WaitMode,
    progress: &mut dyn FnMut(&str),
    mut yardstick: Option<Yardstick<'_>>,
) -> (String, Vec<PerfResult>) {
    let lat = kind != Some(Kind::Bw);
    let bw = kind != Some(Kind::Lat);
    let w = "peer's own (busy-poll)";
    let _ = wait;
    let mut rows = Vec::new();
    let fi = installed("fi_pingpong");
    let ucx = installed("ucx_perftest");
    if fi {
        for (prov, ep) in FI_PROVIDERS {
            for &size in sizes {
                progress(&format!("  peer fi_pingpong {prov} {size} ..."));
                let port = free_port();
                let it = iters_for(size).to_string();
                let s = size.to_string();
                let mut srv = Command::new("fi_pingpong");
                srv.args([
                    "-p",
                    prov,
                    "-e",
                    ep,
                    "-I",
                    &it,
                    "-S",
                    &s,
                    "-B",
                    &port.to_string(),
                ]);
                let mut cli = Command::new("fi_pingpong");
                cli.args([
                    "-p",
                    prov,
                    "-e",
                    ep,
                    "-I",
                    &it,
                    "-S",
                    &s,
                    "-P",
                    &port.to_string(),
                    "127.0.0.1",
                ]);
                let bracket = bracket_for(prov.starts_with("tcp"), lat, bw, size);
                let (out, raw) = bracketed(&mut yardstick, bracket, || pair(srv, cli));
                let raw_of = |k: Kind| raw.filter(|_| bracket.is_some_and(|b| b.0 == k));
                match out
                    .and_then(|o| parse_fi(&o).ok_or_else(|| format!("unreadable output: {o:?}")))
                {
                    Ok((usec, mbs)) => {
                        if lat {
                            let mut r = PerfResult::new("fi_pingpong_lat", prov, size as u64, w);
                            r.iters = iters_for(size) as u64;
                            r.lat_us_p50 = Some(usec);
                            r.lat_us_mean = Some(usec);
                            r.msg_rate_mps = Some(1.0 / usec);
                            r.note = "mean usec/xfer (no percentiles)".into();
                            against_raw(&mut r, raw_of(Kind::Lat));
                            rows.push(r);
                        }
                        if bw {
                            let mut r = PerfResult::new("fi_pingpong_bw", prov, size as u64, w);
                            r.iters = iters_for(size) as u64;
                            r.bw_gbps = Some(mbs * 8.0 / 1000.0);
                            r.msg_rate_mps = Some(mbs * 1e6 / size as f64 / 1e6);
                            r.note = "ping-pong throughput".into();
                            against_raw_bw(&mut r, raw_of(Kind::Bw));
                            rows.push(r);
                        }
                    }
                    Err(e) => {
                        rows.push(PerfResult::failed("fi_pingpong", prov, size as u64, w, &e))
                    }
                }
            }
        }
    }
    if ucx {
        let tests: Vec<&str> = [("tag_lat", lat), ("tag_bw", bw)]
            .iter()
            .filter(|t| t.1)
            .map(|t| t.0)
            .collect();
        for t in tests {
            for &size in sizes {
                progress(&format!("  peer ucx_perftest {t} {size} ..."));
                let port = free_port().to_string();
                // A stream needs more messages than a ping-pong to leave
                // its start-up behind (about 50 MB at 1 MiB).
                let n = if t == "tag_bw" {
                    (50usize << 20).div_ceil(size).clamp(200, 20_000)
                } else {
                    iters_for(size)
                }
                .to_string();
                let s = size.to_string();
                let mut srv = Command::new("ucx_perftest");
                srv.env("UCX_TLS", "tcp")
                    .args(["-t", t, "-s", &s, "-n", &n, "-w", "50", "-p", &port]);
                let mut cli = Command::new("ucx_perftest");
                cli.env("UCX_TLS", "tcp").args([
                    "127.0.0.1",
                    "-t",
                    t,
                    "-s",
                    &s,
                    "-n",
                    &n,
                    "-w",
                    "50",
                    "-p",
                    &port,
                    "-f",
                ]);
                let name = format!("ucx_{t}");
                let bracket = bracket_for(true, t == "tag_lat", t == "tag_bw", size);
                let (out, raw) = bracketed(&mut yardstick, bracket, || pair(srv, cli));
                match out
                    .and_then(|o| parse_ucx(&o).ok_or_else(|| format!("unreadable output: {o:?}")))
                {
                    Ok((lat_us, mbs)) => {
                        let mut r = PerfResult::new(&name, "ucx tcp", size as u64, w);
                        r.iters = n.parse().unwrap_or(0);
                        if t == "tag_lat" {
                            r.lat_us_p50 = Some(lat_us);
                            against_raw(&mut r, raw);
                        } else {
                            r.bw_gbps = Some(mbs * 1048576.0 * 8.0 / 1e9);
                            r.msg_rate_mps = Some(mbs * 1048576.0 / size as f64 / 1e6);
                            against_raw_bw(&mut r, raw);
                        }
                        rows.push(r);
                    }
                    Err(e) => rows.push(PerfResult::failed(&name, "ucx tcp", size as u64, w, &e)),
                }
            }
        }
    }
    let yn = |b: bool| if b { "found" } else { "not installed" };
    let found = format!(
        "peers: fi_pingpong (libfabric) {}, ucx_perftest (UCX) {}{}",
        yn(fi),
        yn(ucx),
        if fi && ucx {
            ""
        } else {
            " (scripts/install-perf-peers.sh installs them)"
        }
    );
    (found, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_peer_output() {
        let fi = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                  64      200     =200     25k         0.78s      0.03    1947.53       0.00\n";
        assert_eq!(parse_fi(fi), Some((1947.53, 0.03)));
        assert_eq!(parse_fi("garbage"), None);
        let ucx = "+---+\n|  Test |\n+----+\n                        2000      5.596   671.009  1736.494        0.09       0.04        1490         576\n";
        assert_eq!(parse_ucx(ucx), Some((5.596, 0.09)));
        assert_eq!(parse_ucx("nothing"), None);
    }

    #[test]
    fn a_bracketed_peer_gets_the_mean_of_the_raw_runs_around_it() {
        let mut calls = Vec::new();
        let mut figures = [3.0, 5.0].into_iter();
        let raw = {
            let mut y = || {
                calls.push("raw");
                figures.next()
            };
            let mut y = |k: Kind, size: usize| {
                assert_eq!((k, size), (Kind::Lat, 64));
                y()
            };
            let mut ys: Option<Yardstick<'_>> = Some(&mut y);
            let (out, raw) = bracketed(&mut ys, Some((Kind::Lat, 64)), || 7);
            assert_eq!((out, raw), (7, Some(4.0)));
            raw
        };
        assert_eq!(calls, ["raw", "raw"]);
        let mut r = PerfResult::new("fi_pingpong_lat", "tcp", 64, "x");
        r.lat_us_p50 = Some(6.0);
        against_raw(&mut r, raw);
        assert_eq!(r.baseline.as_deref(), Some("tcp_lat"));
        assert_eq!((r.baseline_value, r.ratio), (Some(4.0), Some(1.5)));
        // A failed raw run on either side: no baseline, no ratio.
        let mut fail = [Some(3.0), None].into_iter();
        let mut y = |_: Kind, _: usize| fail.next().flatten();
        let mut ys: Option<Yardstick<'_>> = Some(&mut y);
        assert_eq!(bracketed(&mut ys, Some((Kind::Lat, 64)), || ()).1, None);
        let mut r = PerfResult::new("ucx_tag_lat", "ucx tcp", 64, "x");
        r.lat_us_p50 = Some(6.0);
        against_raw(&mut r, None);
        assert_eq!((r.baseline, r.ratio), (None, None));
        // Without a yardstick, or with nothing wanted, the peer runs alone.
        assert_eq!(bracketed(&mut None, Some((Kind::Lat, 64)), || 1), (1, None));
        let mut never = |_: Kind, _: usize| -> Option<f64> { panic!("not wanted") };
        let mut ys: Option<Yardstick<'_>> = Some(&mut never);
        assert_eq!(bracketed(&mut ys, None, || 2), (2, None));
    }

    /// Bandwidth rows get the raw stream of their moment; what is
    /// bracketed with what.
    #[test]
    fn a_peer_bandwidth_row_gets_the_raw_stream_of_its_moment() {
        let mut figures = [30.0, 40.0].into_iter();
        let mut y = |k: Kind, size: usize| {
            assert_eq!((k, size), (Kind::Bw, 1 << 20));
            figures.next()
        };
        let mut ys: Option<Yardstick<'_>> = Some(&mut y);
        let (_, raw) = bracketed(&mut ys, bracket_for(true, false, true, 1 << 20), || ());
        assert_eq!(raw, Some(35.0));
        let mut r = PerfResult::new("ucx_tag_bw", "ucx tcp", 1 << 20, "x");
        r.bw_gbps = Some(42.0);
        against_raw_bw(&mut r, raw);
        assert_eq!(r.baseline.as_deref(), Some("tcp_bw"));
        assert_eq!((r.baseline_value, r.ratio), (Some(35.0), Some(1.2)));
        assert_eq!(bracket_for(true, true, true, 64), Some((Kind::Lat, 64)));
        assert_eq!(
            bracket_for(true, true, true, 64 << 10),
            Some((Kind::Bw, 64 << 10))
        );
        assert_eq!(bracket_for(true, true, true, 4 << 10), None);
        assert_eq!(bracket_for(false, true, true, 64), None, "not TCP-based");
        assert_eq!(
            bracket_for(true, false, true, 64),
            None,
            "a bandwidth run at 64 B"
        );
    }
}
