//! The unmodified Debian rdma_cm and rsockets programs over softrdma's
//! librdmacm.so.1 + libibverbs.so.1, through `softrdma run`: server and
//! client as separate processes on loopback, each must exit 0 with the
//! output the program prints on success.
//!
//! The harness (building `softrdma` and both libraries, deadlines that
//! kill a hung child, free ports, waiting for the server's listening
//! socket, one pair at a time) is `crates/capi/tests/common`. `udaddy`
//! (its port is fixed: 7174) and `mckey` (multicast) run in a network
//! namespace of their own, created with `unshare -n`; without the right to
//! create one (not root) they are skipped, except under `CI=true`, where
//! they fail.

#[path = "../../capi/tests/common/mod.rs"]
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{finish, free_port, need, pair, run, serial, softrdma, spawn, Done, DEADLINE};

// ----------------------------------------------------------------------
// RDMA_PS_TCP: RC over iWARP
// ----------------------------------------------------------------------

#[test]
fn rping_100_verified_pings() {
    let port = free_port().to_string();
    let common = ["-a", "127.0.0.1", "-p", &port, "-v", "-C", "100"];
    let s: Vec<&str> = ["-s"].iter().chain(&common).copied().collect();
    let c: Vec<&str> = ["-c"].iter().chain(&common).copied().collect();
    let (sd, cd) = pair("rping", &s, &c, port.parse().unwrap());
    cd.assert_ok(
        "rping client",
        &["ping data: rdma-ping-0: ", "ping data: rdma-ping-99: "],
    );
    sd.assert_ok(
        "rping server",
        &[
            "server ping data: rdma-ping-0: ",
            "server ping data: rdma-ping-99: ",
        ],
    );
    assert_eq!(cd.stdout.matches("ping data: rdma-ping-").count(), 100);
}

/// `rping -q`: the application creates its own QP (`ibv_create_qp`) and
/// moves it through INIT/RTR/RTS with `rdma_init_qp_attr` +
/// `ibv_modify_qp` (iWARP attributes: RTR and RTS carry the state only);
/// rdma_cm finds it by `conn_param.qp_num`.
#[test]
fn rping_own_qp() {
    let port = free_port().to_string();
    let common = ["-a", "127.0.0.1", "-p", &port, "-v", "-q", "-C", "20"];
    let s: Vec<&str> = ["-s"].iter().chain(&common).copied().collect();
    let c: Vec<&str> = ["-c"].iter().chain(&common).copied().collect();
    let (sd, cd) = pair("rping", &s, &c, port.parse().unwrap());
    cd.assert_ok(
        "rping -q client",
        &["ping data: rdma-ping-0: ", "ping data: rdma-ping-19: "],
    );
    sd.assert_ok(
        "rping -q server",
        &[
            "server ping data: rdma-ping-0: ",
            "server ping data: rdma-ping-19: ",
        ],
    );
    assert_eq!(cd.stdout.matches("ping data: rdma-ping-").count(), 20);
}

#[test]
fn ucmatose() {
    let port = free_port().to_string();
    let (sd, cd) = pair(
        "ucmatose",
        &["-p", &port],
        &["-s", "127.0.0.1", "-p", &port],
        port.parse().unwrap(),
    );
    cd.assert_ok(
        "ucmatose client",
        &[
            "receiving data transfers",
            "data transfers complete",
            "return status 0",
        ],
    );
    sd.assert_ok(
        "ucmatose server",
        &["data transfers complete", "disconnected", "return status 0"],
    );
}

/// True once `/proc/<pid or self>/net/<proto>(6)` shows `port` as a TCP
/// listener (`tcp`) or a bound UDP socket (`udp`).
fn has_socket(proc_dir: &str, proto: &str, port: u16) -> bool {
    let want = format!(":{port:04X}");
    [proto.to_string(), format!("{proto}6")].iter().any(|f| {
        std::fs::read_to_string(format!("{proc_dir}/net/{f}")).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && (proto == "udp" || cols[3] == "0A")
            })
        })
    })
}

/// Starts `first` (spawned by `spawn`), waits until `proc_dir` shows its
/// socket (`proto`, `port`), then runs `second`; returns their results.
fn staged(
    spawn: impl Fn(&str, &[&str]) -> Child,
    first: (&str, &[&str]),
    second: (&str, &[&str]),
    proc_dir: &str,
    proto: &str,
    port: u16,
) -> (Done, Done) {
    let _g = serial();
    let deadline = Instant::now() + DEADLINE;
    let mut a = spawn(first.0, first.1);
    while !has_socket(proc_dir, proto, port) {
        if let Ok(Some(st)) = a.try_wait() {
            let d = finish(a, deadline);
            panic!("{first:?} exited ({st}) early:\n{}\n{}", d.stdout, d.stderr);
        }
        if Instant::now() >= deadline {
            let d = finish(a, Instant::now());
            panic!(
                "{first:?} never opened {proto} {port}:\n{}\n{}",
                d.stdout, d.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let b = spawn(second.0, second.1);
    let bd = finish(b, deadline);
    // The first gets a little longer than the second to wind down.
    let ad = finish(a, deadline.max(Instant::now() + Duration::from_secs(10)));
    (ad, bd)
}

/// Four connections, then every id (the listener too) moved to a new
/// event channel and the old one destroyed before disconnecting
/// (`rdma_migrate_id`): the DISCONNECTED events still arrive.
#[test]
fn ucmatose_four_connections_migrated() {
    let port = free_port().to_string();
    let (sd, cd) = pair(
        "ucmatose",
        &["-p", &port, "-c", "4", "-C", "20", "-m"],
        &["-s", "127.0.0.1", "-p", &port, "-c", "4", "-C", "20", "-m"],
        port.parse().unwrap(),
    );
    cd.assert_ok(
        "ucmatose -m client",
        &[
            "migrating to new event channel",
            "data transfers complete",
            "return status 0",
        ],
    );
    sd.assert_ok(
        "ucmatose -m server",
        &[
            "migrating to new event channel",
            "disconnected",
            "return status 0",
        ],
    );
}

#[test]
fn rdma_server_and_rdma_client() {
    let port = free_port().to_string();
    let (sd, cd) = staged(
        spawn,
        ("rdma_server", &["-p", &port]),
        ("rdma_client", &["-s", "127.0.0.1", "-p", &port]),
        "/proc/self",
        "tcp",
        port.parse().unwrap(),
    );
    // Both take the inline path (max_inline_data >= 16 granted).
    sd.assert_ok("rdma_server", &["rdma_server: end 0"]);
    cd.assert_ok("rdma_client", &["rdma_client: end 0"]);
    for d in [&sd, &cd] {
        assert!(
            !d.stdout.contains("doesn't support IBV_SEND_INLINE"),
            "{}",
            d.stdout
        );
    }
}

/// perftest with `-R` (rdma_cm connection and exchange): exit 0 on both
/// sides, and a result row under the header (both sides, except the
/// passive server of `ib_read_lat`, which prints none).
fn perftest_rdma_cm(prog: &str) {
    perftest_rdma_cm_args(prog, &[]);
}

/// [`perftest_rdma_cm`] with `extra` arguments on both sides.
fn perftest_rdma_cm_args(prog: &str, extra: &[&str]) {
    let server_reports = prog != "ib_read_lat";
    let port = free_port().to_string();
    let mut s = vec!["-R", "-d", "softrdma_lo", "-p", &port];
    s.extend_from_slice(extra);
    let mut c = s.clone();
    c.push("127.0.0.1");
    let (sd, cd) = pair(prog, &s, &c, port.parse().unwrap());
    for (who, d) in [("server", &sd), ("client", &cd)] {
        d.assert_ok(&format!("{prog} -R {who}"), &["Transport type : IW"]);
        if who == "server" && !server_reports {
            continue;
        }
        let mut lines = d.stdout.lines().skip_while(|l| !l.contains("#bytes"));
        let row = lines.nth(1).unwrap_or_default();
        let first = row.split_whitespace().next().unwrap_or_default();
        assert!(
            first.parse::<u64>().is_ok(),
            "{prog} -R {who}: no result row after the header:\n{}",
            d.stdout
        );
    }
}

#[test]
fn ib_send_lat_rdma_cm() {
    perftest_rdma_cm("ib_send_lat");
}

#[test]
fn ib_send_bw_rdma_cm() {
    perftest_rdma_cm("ib_send_bw");
}

/// Two QPs: perftest pairs them by the order of `CONNECT_REQUEST` on the
/// server, and its iWARP credit writes go to the peer QP of the same index
/// (stalled both sides in about a third of the runs while requests could
/// overtake each other).
#[test]
fn ib_send_bw_rdma_cm_two_qps() {
    perftest_rdma_cm_args("ib_send_bw", &["-q", "2"]);
}

#[test]
fn ib_write_lat_rdma_cm() {
    perftest_rdma_cm("ib_write_lat");
}

#[test]
fn ib_write_bw_rdma_cm() {
    perftest_rdma_cm("ib_write_bw");
}

#[test]
fn ib_read_lat_rdma_cm() {
    perftest_rdma_cm("ib_read_lat");
}

#[test]
fn ib_read_bw_rdma_cm() {
    perftest_rdma_cm("ib_read_bw");
}

// ----------------------------------------------------------------------
// rsockets
// ----------------------------------------------------------------------

/// rstream/riostream with custom sizes (the default table runs for about
/// a minute on two busy cores) in the given `-T` modes; the result row
/// ("custom", size, transfers as the program abbreviates them (`label`),
/// ...) on both sides.
fn rsocket_stream(prog: &str, size: &str, count: &str, label: &str, modes: &[&str]) {
    let port = free_port().to_string();
    let mut s = vec!["-p", &port, "-S", size, "-C", count];
    for m in modes {
        s.extend_from_slice(&["-T", m]);
    }
    let mut c = s.clone();
    c.extend_from_slice(&["-s", "127.0.0.1"]);
    let (sd, cd) = pair(prog, &s, &c, port.parse().unwrap());
    for (who, d) in [("server", &sd), ("client", &cd)] {
        d.assert_ok(&format!("{prog} {modes:?} {who}"), &["name", "custom "]);
        let row = d
            .stdout
            .lines()
            .find(|l| l.starts_with("custom "))
            .unwrap_or_default();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols.get(2),
            Some(&label),
            "{prog} {who}: transfers column: {row}"
        );
    }
}

#[test]
fn rstream_nonblocking_verified() {
    rsocket_stream("rstream", "65536", "500", "500", &["v"]);
}

#[test]
fn rstream_blocking_verified() {
    rsocket_stream("rstream", "4096", "2000", "2k", &["b", "v"]);
}

#[test]
fn rstream_async_rpoll() {
    rsocket_stream("rstream", "1000000", "50", "50", &["a", "v"]);
}

#[test]
fn riostream_nonblocking_verified() {
    rsocket_stream("riostream", "65536", "500", "500", &["v"]);
}

#[test]
fn riostream_blocking_verified() {
    rsocket_stream("riostream", "100000", "100", "100", &["b", "v"]);
}

#[test]
fn riostream_async_rpoll() {
    rsocket_stream("riostream", "4096", "1000", "1k", &["a"]);
}

// ----------------------------------------------------------------------
// RDMA_PS_UDP: UD, in a network namespace of their own
// ----------------------------------------------------------------------

/// A private network namespace held by a `sleep` process, with loopback
/// up (and multicast routed over it).
struct Netns {
    holder: Child,
}

impl Netns {
    /// `None` (the test is skipped) where namespaces cannot be made,
    /// except under `CI=true`.
    fn new() -> Option<Netns> {
        let made = Command::new("unshare")
            .args(["-n", "--", "sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let fail = |why: String| -> Option<Netns> {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("cannot create a network namespace under CI: {why}");
            }
            eprintln!("skipped: cannot create a network namespace ({why}); needs root");
            None
        };
        let mut holder = match made {
            Ok(c) => c,
            Err(e) => return fail(format!("unshare: {e}")),
        };
        let ns = Netns {
            holder: {
                // Wait until the holder is inside its own namespace.
                let me = std::fs::read_link("/proc/self/ns/net").ok();
                let start = Instant::now();
                loop {
                    if let Ok(Some(st)) = holder.try_wait() {
                        return fail(format!("unshare -n exited: {st}"));
                    }
                    let theirs = std::fs::read_link(format!("/proc/{}/ns/net", holder.id())).ok();
                    if theirs.is_some() && theirs != me {
                        break;
                    }
                    if start.elapsed() > Duration::from_secs(10) {
                        let _ = holder.kill();
                        return fail("the namespace did not appear".into());
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                holder
            },
        };
        for cmd in [
            &["ip", "link", "set", "lo", "up"][..],
            &["ip", "link", "set", "lo", "multicast", "on"],
            &["ip", "route", "add", "224.0.0.0/4", "dev", "lo"],
        ] {
            let st = ns.command(cmd[0]).args(&cmd[1..]).status();
            match st {
                Ok(s) if s.success() => {}
                other => return fail(format!("{cmd:?} in the namespace: {other:?}")),
            }
        }
        Some(ns)
    }

    /// A command run inside the namespace.
    fn command(&self, prog: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/proc/{}/ns/net", self.holder.id()))
            .arg("--")
            .arg(prog);
        c
    }

    /// Starts `softrdma run -- prog args` inside the namespace.
    fn spawn(&self, prog: &str, args: &[&str]) -> Child {
        need(prog);
        let mut c = self.command(softrdma().to_str().expect("utf-8 path"));
        c.arg("run")
            .arg("--")
            .arg(prog)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {prog} in the namespace: {e}"))
    }

    /// Runs `first`, waits until it has the socket (`proto`, `port`), then
    /// `second`; returns (first, second).
    fn pair(
        &self,
        prog: &str,
        first: &[&str],
        second: &[&str],
        proto: &str,
        port: u16,
    ) -> (Done, Done) {
        let dir = format!("/proc/{}", self.holder.id());
        staged(
            |p, a| self.spawn(p, a),
            (prog, first),
            (prog, second),
            &dir,
            proto,
            port,
        )
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// udaddy: the SIDR exchange (`param.ud` with QPN, qkey and an address
/// vector), then SEND_WITH_IMM both ways, the server answering through
/// `ibv_create_ah_from_wc` (GRH) with the QPN from the immediate data.
#[test]
fn udaddy() {
    let Some(ns) = Netns::new() else { return };
    // udaddy has no port option (-p is the port space): 7174.
    let (sd, cd) = ns.pair("udaddy", &[], &["-s", "127.0.0.1"], "tcp", 7174);
    sd.assert_ok(
        "udaddy server",
        &[
            "receiving data transfers",
            "sending replies",
            "data transfers complete",
            "return status 0",
        ],
    );
    cd.assert_ok(
        "udaddy client",
        &[
            "initiating data transfers",
            "receiving data transfers",
            "data transfers complete",
            "return status 0",
        ],
    );
}

/// The UDP port every softrdma context with a multicast member listens on
/// (`SOFTRDMA_MCAST_PORT` default).
const MCAST_PORT: u16 = 18516;

/// mckey: a receiver joins the group, the sender (`-s`) joins send-only
/// and sends 10 datagrams to the group's AH (QPN 0xFFFFFF); the receiver
/// must get all of them.
#[test]
fn mckey() {
    let Some(ns) = Netns::new() else { return };
    let group = format!("239.{}.{}.{}", 1 + std::process::id() % 250, 7, 9);
    let (rd, sd) = ns.pair(
        "mckey",
        &["-m", &group],
        &["-m", &group, "-s"],
        "udp",
        MCAST_PORT,
    );
    let joined = format!("mckey: joined dgid: ::ffff:{group}");
    rd.assert_ok(
        "mckey receiver",
        &[
            &joined,
            "receiving data transfers",
            "data transfers complete",
            "return status 0",
        ],
    );
    sd.assert_ok(
        "mckey sender",
        &[
            &joined,
            "initiating data transfers",
            "data transfers complete",
            "return status 0",
        ],
    );
}

// ----------------------------------------------------------------------
// Failures are reported, not hung on
// ----------------------------------------------------------------------

/// Clients pointed at a port nobody listens on fail with rdma_cm's
/// REJECTED (status -ECONNREFUSED, as the kernel's iWARP CM reports a
/// refused connection) once the connect retry
/// (`SOFTRDMA_CONNECT_RETRY_MS`, 1 s) is spent, or the rsocket equivalent,
/// and exit non-zero well before the deadline.
#[test]
fn connecting_to_nothing_fails_cleanly() {
    let port = free_port().to_string();
    let started = Instant::now();
    let d = run("ucmatose", &["-s", "127.0.0.1", "-p", &port]);
    assert_ne!(d.code, Some(0), "ucmatose: {d:?}");
    assert!(!d.timed_out, "ucmatose hung: {d:?}");
    assert!(
        d.stdout
            .contains("event: RDMA_CM_EVENT_REJECTED, error: -111"),
        "ucmatose: {d:?}"
    );
    let d = run("rping", &["-c", "-a", "127.0.0.1", "-p", &port, "-C", "1"]);
    assert_ne!(d.code, Some(0), "rping: {d:?}");
    assert!(
        d.stderr.contains("RDMA_CM_EVENT_REJECTED, error -111"),
        "rping: {d:?}"
    );
    let d = run("rdma_client", &["-s", "127.0.0.1", "-p", &port]);
    assert!(
        d.stderr.contains("rdma_connect: Connection refused"),
        "rdma_client: {d:?}"
    );
    assert!(
        d.stdout.contains("rdma_client: end -1"),
        "rdma_client: {d:?}"
    );
    let d = run(
        "rstream",
        &["-s", "127.0.0.1", "-p", &port, "-S", "100", "-C", "1"],
    );
    assert_ne!(d.code, Some(0), "rstream: {d:?}");
    assert!(!d.timed_out, "rstream hung: {d:?}");
    // Each of these is a few milliseconds of work; a minute means a wait
    // that should not be there.
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
}
