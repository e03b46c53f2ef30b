//! Unmodified Debian socket programs over softrdma's rsockets: sockperf
//! and iperf3 under rdma-core's `librspreload.so` (which turns their TCP
//! sockets into rsockets of the librdmacm.so.1 they load: ours, through
//! `softrdma run`), and rstream/riostream, which call rsockets themselves,
//! with their default arguments (the whole table of sizes, latency and
//! bandwidth). Server and client are separate processes on loopback, each
//! killed at a deadline so a hang fails the test.
//!
//! A preloaded program that silently fell back to kernel TCP would pass
//! on its output alone, so each of those tests also watches both
//! processes for softrdma's progress thread (`softrdma-progress`, started
//! by the first connected queue pair of a process): it must show up in
//! both.
//!
//! Requires `scripts/install-test-deps.sh` (rdmacm-utils, which brings
//! librdmacm1 and its `librspreload.so.1`; sockperf; iperf3).

mod common;

use std::collections::BTreeSet;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{finish, free_port, need, serial, spawn, Done};

/// How long one preloaded pair may run.
const PRELOAD_DEADLINE: Duration = Duration::from_secs(60);
/// How long rstream/riostream may run their whole default table (about
/// 40 s on two busy cores, most of it the 100 000 round trips of 64 B).
const TABLE_DEADLINE: Duration = Duration::from_secs(300);

/// rdma-core's preload library (package librdmacm1).
fn rspreload() -> String {
    const CANDIDATES: &[&str] = &[
        "/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so.1",
        "/usr/lib/aarch64-linux-gnu/rsocket/librspreload.so.1",
        "/usr/lib64/rsocket/librspreload.so.1",
        "/usr/lib/rsocket/librspreload.so.1",
    ];
    CANDIDATES
        .iter()
        .find(|p| std::path::Path::new(p).is_file())
        .map(|p| p.to_string())
        .unwrap_or_else(|| {
            panic!(
                "librspreload.so.1 not found in {CANDIDATES:?}: run scripts/install-test-deps.sh \
                 (librdmacm1, via rdmacm-utils)"
            )
        })
}

/// Starts `softrdma run -- env LD_PRELOAD=librspreload prog args`: the
/// preload applies to the program only, not to the `softrdma` launcher.
fn spawn_preloaded(prog: &str, args: &[&str]) -> Child {
    need(prog);
    let preload = format!("LD_PRELOAD={}", rspreload());
    let mut all = vec![preload.as_str(), prog];
    all.extend_from_slice(args);
    spawn("env", &all)
}

/// True once something listens on TCP `port` (IPv4 or IPv6).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// Names of a process's threads that start with `softrdma-`, sampled
/// until [`Watch::stop`].
struct Watch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<BTreeSet<String>>,
}

impl Watch {
    fn new(pid: u32) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = BTreeSet::new();
            loop {
                let done = flag.load(Ordering::Relaxed);
                if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                    for t in tasks.flatten() {
                        let comm =
                            std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                        let comm = comm.trim();
                        if comm.starts_with("softrdma-") {
                            seen.insert(comm.to_string());
                        }
                    }
                }
                if done {
                    return seen;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Watch { stop, thread }
    }

    fn stop(self) -> BTreeSet<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("watch thread")
    }
}

/// softrdma's progress thread name as the kernel keeps it (15 octets).
const PROGRESS_THREAD: &str = "softrdma-progre";

/// What a server/client run left: both programs, and the softrdma threads
/// seen in each.
struct PairRun {
    server: Done,
    client: Done,
    server_threads: BTreeSet<String>,
    client_threads: BTreeSet<String>,
}

impl PairRun {
    /// Both sides ran a softrdma connection.
    fn assert_over_softrdma(&self, what: &str) {
        for (who, seen) in [
            ("server", &self.server_threads),
            ("client", &self.client_threads),
        ] {
            assert!(
                seen.contains(PROGRESS_THREAD),
                "{what}: the {who} never started softrdma's progress thread (threads seen: \
                 {seen:?}): its socket did not become an rsocket{}{}",
                self.client.summary("the client"),
                self.server.summary("the server"),
            );
        }
    }
}

/// Runs `server` until it listens on `port`, then `client`; the client
/// must finish by `limit`. A server that keeps serving (`exits` false) is
/// killed once the client is done, after checking it is still alive; one
/// that exits by itself gets a few seconds more.
fn run_pair(
    server: impl FnOnce() -> Child,
    client: impl FnOnce() -> Child,
    port: u16,
    exits: bool,
    limit: Duration,
) -> PairRun {
    let _g = serial();
    let deadline = Instant::now() + limit;
    let mut s = server();
    while !listening(port) {
        if let Some(st) = s.try_wait().expect("wait") {
            let d = finish(s, deadline);
            panic!(
                "server exited ({st}) before listening on {port}:\n{}\n{}",
                d.stdout, d.stderr
            );
        }
        if Instant::now() >= deadline {
            let d = finish(s, Instant::now());
            panic!(
                "server never listened on {port}:\n{}\n{}",
                d.stdout, d.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let sw = Watch::new(s.id());
    let c = client();
    let cw = Watch::new(c.id());
    let client = finish(c, deadline);
    let client_threads = cw.stop();
    let server = if exits {
        let grace = Instant::now() + Duration::from_secs(10);
        finish(
            s,
            if client.ok() {
                deadline.max(grace)
            } else {
                grace
            },
        )
    } else {
        let alive = s.try_wait().expect("wait").is_none();
        let _ = s.kill();
        let d = finish(s, Instant::now() + Duration::from_secs(5));
        assert!(
            alive,
            "the server ended before the client was done:{}{}",
            d.summary("the server"),
            client.summary("the client")
        );
        d
    };
    let server_threads = sw.stop();
    let mut run = PairRun {
        server,
        client,
        server_threads,
        client_threads,
    };
    run.server.peer = run.client.summary("the client");
    run.client.peer = run.server.summary("the server");
    run
}

/// The number after `label` in `text` (up to the next space).
fn number_after(text: &str, label: &str) -> Option<f64> {
    let at = text.find(label)? + label.len();
    text[at..].split_whitespace().next()?.parse().ok()
}

// ----------------------------------------------------------------------
// Under librspreload.so
// ----------------------------------------------------------------------

/// sockperf ping-pong over TCP: `sr` serves (and would have failed to
/// listen, looping on descriptors until EMFILE, had the engine's own
/// sockets been turned into rsockets), `pp` measures for two seconds.
#[test]
fn sockperf_tcp_ping_pong_under_rspreload() {
    need("sockperf");
    let port = free_port();
    let p = port.to_string();
    let run = run_pair(
        || spawn_preloaded("sockperf", &["sr", "--tcp", "-p", &p]),
        || {
            spawn_preloaded(
                "sockperf",
                &["pp", "--tcp", "-i", "127.0.0.1", "-p", &p, "-t", "2"],
            )
        },
        port,
        false,
        PRELOAD_DEADLINE,
    );
    run.client
        .assert_ok("sockperf pp", &["Summary: Latency is"]);
    let usec =
        number_after(&run.client.stdout, "Summary: Latency is").expect("a latency in the summary");
    assert!(usec > 0.0, "latency {usec}: {}", run.client.stdout);
    let replies = number_after(&run.client.stdout, "ReceivedMessages=").unwrap_or(0.0);
    assert!(replies > 0.0, "no replies: {}", run.client.stdout);
    run.assert_over_softrdma("sockperf pp");
}

/// sockperf throughput over TCP: messages sent for two seconds, the rate
/// reported.
#[test]
fn sockperf_tcp_throughput_under_rspreload() {
    need("sockperf");
    let port = free_port();
    let p = port.to_string();
    let run = run_pair(
        || spawn_preloaded("sockperf", &["sr", "--tcp", "-p", &p]),
        || {
            spawn_preloaded(
                "sockperf",
                &["tp", "--tcp", "-i", "127.0.0.1", "-p", &p, "-t", "2"],
            )
        },
        port,
        false,
        PRELOAD_DEADLINE,
    );
    run.client
        .assert_ok("sockperf tp", &["Summary: Message Rate is"]);
    let rate = number_after(&run.client.stdout, "Summary: Message Rate is")
        .expect("a rate in the summary");
    assert!(rate > 0.0, "message rate {rate}: {}", run.client.stdout);
    run.assert_over_softrdma("sockperf tp");
}

/// The number of the first `field` after `key` in iperf3's JSON (both
/// quoted).
fn json_number_after(json: &str, key: &str, field: &str) -> Option<f64> {
    let at = json.find(key)?;
    let rest = &json[at..];
    let b = rest.find(field)? + field.len();
    let v = rest[b..].trim_start().strip_prefix(':')?.trim_start();
    let end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '+' || c == '-'))
        .unwrap_or(v.len());
    v[..end].parse().ok()
}

/// iperf3: one two-second TCP test (its control connection and data
/// stream both rsockets; `select()` goes to `rpoll`), the server serving
/// one client (`-1`) and exiting.
#[test]
fn iperf3_tcp_under_rspreload() {
    need("iperf3");
    let port = free_port();
    let p = port.to_string();
    let run = run_pair(
        || spawn_preloaded("iperf3", &["-s", "-1", "-p", &p]),
        || {
            spawn_preloaded(
                "iperf3",
                &["-c", "127.0.0.1", "-p", &p, "-t", "2", "--json"],
            )
        },
        port,
        true,
        PRELOAD_DEADLINE,
    );
    run.client.assert_ok("iperf3 -c", &["\"sum_received\""]);
    run.server.assert_ok("iperf3 -s -1", &["Server listening"]);
    let out = &run.client.stdout;
    let sent = json_number_after(out, "\"sum_sent\"", "\"bytes\"").unwrap_or(0.0);
    let received = json_number_after(out, "\"sum_received\"", "\"bytes\"").unwrap_or(0.0);
    assert!(
        sent > 0.0 && received > 0.0,
        "iperf3 moved nothing (sent {sent}, received {received}): {out}"
    );
    // From rgetsockopt(TCP_INFO): an rsocket retransmits nothing.
    let retransmits = json_number_after(out, "\"sum_sent\"", "\"retransmits\"");
    assert_eq!(retransmits, Some(0.0), "{out}");
    run.assert_over_softrdma("iperf3");
}

// ----------------------------------------------------------------------
// rsockets programs, default arguments
// ----------------------------------------------------------------------

/// rstream/riostream with no options but the port (and the server's
/// address for the client): every default size, latency then bandwidth,
/// on two connections. Both sides print the whole table and exit 0.
fn default_table(prog: &str) {
    need(prog);
    let port = free_port();
    let p = port.to_string();
    let run = run_pair(
        || spawn(prog, &["-p", &p]),
        || spawn(prog, &["-p", &p, "-s", "127.0.0.1"]),
        port,
        true,
        TABLE_DEADLINE,
    );
    let rows = [
        "64_lat", "4k_lat", "64k_lat", "1m_lat", "64_bw", "4k_bw", "64k_bw", "1m_bw",
    ];
    for (who, d) in [("client", &run.client), ("server", &run.server)] {
        d.assert_ok(&format!("{prog} {who}"), &["name"]);
        for r in rows {
            let line = d
                .stdout
                .lines()
                .find(|l| l.split_whitespace().next() == Some(r))
                .unwrap_or_else(|| panic!("{prog} {who}: no {r} row:\n{}", d.stdout));
            // name, bytes, xfers, iters, total, time, Gb/sec, usec/xfer
            let cols: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(cols.len(), 8, "{prog} {who}: {line}");
            let usec: f64 = cols[7].parse().unwrap_or(0.0);
            assert!(usec > 0.0, "{prog} {who}: {line}");
        }
    }
}

#[test]
fn rstream_default_arguments() {
    default_table("rstream");
}

/// riostream's latency rows watch the last octet of the buffer the peer
/// RDMA-Writes into and then write it themselves: each `riowrite` must
/// place that octet exactly once, after the rest (`rsocket::conn`).
#[test]
fn riostream_default_arguments() {
    default_table("riostream");
}
