//! Debian's unmodified `qperf` over softrdma's libibverbs.so.1, through
//! `softrdma run`: a server and a client process on loopback, every RDMA
//! test qperf has (XRC aside: Debian's build has none), at message sizes
//! from 1 octet to 1 MiB, in qperf's default connection mode, and the RC
//! tests also over rdma_cm (`-cm1`).
//!
//! That mode is IB-style: each side sends its LID, QPN, PSN, rkey and
//! address over qperf's own TCP socket and moves its QP with
//! `ibv_modify_qp` alone, with no GID (`is_global` 0: a peer on this
//! host). qperf waits for completions with `ibv_get_cq_event` and ends
//! each test from a `SIGALRM` handler installed without `SA_RESTART`, so
//! a wait that a signal does not interrupt hangs the test; both ends stop
//! on their own timers and destroy their QPs without a handshake, so the
//! later one must not see the earlier one's close as errors. Each client
//! run ends with qperf's `quit`, which makes the server exit.
//!
//! Requires `scripts/install-test-deps.sh` (the `qperf` package); a
//! missing `qperf` fails the test.

mod common;

use common::{free_port, pair};

/// Seconds per test (qperf's `-t`).
const SECS: &str = "1";

/// Message sizes for the tests that take one (qperf's `-m`).
const SIZES: &[&str] = &["1", "1K", "64K", "1M"];

/// Runs every test of `tests` at every size of `sizes` (none: qperf's
/// default) in one client run, ending with `quit`, against a fresh
/// server; checks that both exit 0, nothing failed, and each run printed
/// a figure.
fn qperf(tests: &[&str], sizes: &[&str]) {
    qperf_with(&[], tests, sizes);
}

/// [`qperf`] with client options `opts` (e.g. `-cm1`) before the tests.
fn qperf_with(opts: &[&str], tests: &[&str], sizes: &[&str]) {
    let port = free_port().to_string();
    let server = ["-lp", port.as_str()];
    let mut client = vec!["127.0.0.1", "-lp", port.as_str(), "-t", SECS];
    client.extend_from_slice(opts);
    let runs = if sizes.is_empty() {
        client.extend_from_slice(tests);
        tests.len()
    } else {
        for size in sizes {
            client.extend_from_slice(&["-m", size]);
            client.extend_from_slice(tests);
        }
        tests.len() * sizes.len()
    };
    client.push("quit");
    let (sd, cd) = pair("qperf", &server, &client, port.parse().unwrap());
    for (who, d) in [("server", &sd), ("client", &cd)] {
        d.assert_ok(&format!("qperf {who}"), &[]);
        assert!(
            !d.stdout.contains("failed") && !d.stderr.contains("failed"),
            "qperf {who} reported a failure:\n{}\n{}{}",
            d.stdout,
            d.stderr,
            d.peer
        );
    }
    // Each run prints `name:` and then its figures (`latency  =  21 us`,
    // `bw  =  2.1 GB/sec`, `msg_rate  =  200 K/sec`, ...); a figure of 0
    // means nothing arrived.
    let named = cd
        .stdout
        .lines()
        .filter(|l| tests.iter().any(|t| l.trim_end() == format!("{t}:")))
        .count();
    let figures: Vec<&str> = cd.stdout.lines().filter(|l| l.contains(" = ")).collect();
    assert!(
        named == runs && figures.len() >= runs,
        "qperf client: {named} runs named and {} figures, {runs} expected:\n{}",
        figures.len(),
        cd.stdout
    );
    for f in figures {
        let value = f.split('=').nth(1).unwrap_or_default().trim();
        let zero = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .is_none_or(|v| v <= 0.0);
        assert!(!zero, "qperf client: a zero figure {f:?}:\n{}", cd.stdout);
    }
}

// Ping-pong tests: each side posts its next receive before it answers,
// so no message ever finds the peer without a receive.

#[test]
fn qperf_rc_and_uc_latency() {
    qperf(&["rc_lat", "uc_lat"], SIZES);
}

#[test]
fn qperf_rdma_write_latency() {
    // `_lat`: RDMA Write with immediate, ping-pong; `_poll_lat`: plain
    // RDMA Write, each side spinning on the last octet of its buffer.
    qperf(
        &[
            "rc_rdma_write_lat",
            "uc_rdma_write_lat",
            "rc_rdma_write_poll_lat",
            "uc_rdma_write_poll_lat",
        ],
        SIZES,
    );
}

#[test]
fn qperf_rdma_read() {
    qperf(&["rc_rdma_read_lat", "rc_rdma_read_bw"], SIZES);
}

#[test]
fn qperf_ud() {
    // A UD message is one packet: qperf's MTU, 2 KiB, is the largest.
    // Its address handles carry a LID and no GRH.
    qperf(&["ud_lat", "ud_bw", "ud_bi_bw"], &["1", "1K", "2K"]);
}

#[test]
fn qperf_rc_atomics() {
    // The message rate tests take no size; the verifying ones check every
    // value returned, with `-m / 8` atomics in flight.
    qperf(&["rc_compare_swap_mr", "rc_fetch_add_mr"], &[]);
    qperf(&["ver_rc_compare_swap", "ver_rc_fetch_add"], &["8", "64K"]);
}

/// `-cm1`: the RC QPs are connected through rdma_cm (iWARP: TCP + MPA)
/// instead of IB-style. The server binds its rdma_cm id to port 0 and
/// sends the client the port `rdma_get_src_port` reports before it
/// listens, so the bind must choose the port, as the kernel's does.
/// (qperf connects UC and UD QPs IB-style whatever `-cm` says.)
#[test]
fn qperf_rdma_cm() {
    qperf_with(
        &["-cm1"],
        &[
            "rc_lat",
            "rc_rdma_write_lat",
            "rc_rdma_write_poll_lat",
            "rc_rdma_read_lat",
            "rc_rdma_read_bw",
        ],
        SIZES,
    );
    qperf_with(&["-cm1"], &["rc_compare_swap_mr", "rc_fetch_add_mr"], &[]);
    qperf_with(
        &["-cm1"],
        &["ver_rc_compare_swap", "ver_rc_fetch_add"],
        &["8", "64K"],
    );
}

/// The streaming tests over rdma_cm. qperf asks for receiver-not-ready
/// retries (`rnr_retry_count` 7), so its QPs wait for receives as
/// InfiniBand's do (below); its client ends each test with
/// `rdma_disconnect` while the server's receive path may be waiting for
/// a receive it will never post, and the server waits for the
/// disconnect: the waiting end must see its peer go although it does
/// not read the socket. Two seconds a test: a debug build's first 1 MiB
/// message can take most of one.
#[test]
fn qperf_rdma_cm_streaming() {
    qperf_with(
        &["-cm1", "-t", "2"],
        &["rc_bw", "rc_bi_bw", "rc_rdma_write_bw"],
        SIZES,
    );
}

/// Streaming tests: the sender posts up to 1024 messages ahead, and the
/// receiver reposts receives only as it polls. In IB an RC/UC Send (or
/// Write with immediate) that finds no receive is answered with an RNR
/// NAK and retried (qperf sets `rnr_retry` 7: for ever), so the sender
/// just slows down. IB-style softrdma QPs do the same (where iWARP ends
/// the connection with a Terminate, DDP "no buffer"): the receiver stops
/// reading its connection until a receive is posted, and TCP holds the
/// sender back. Small sizes make the receiver fall behind every time.
/// Two seconds a test, as over rdma_cm: a debug build sometimes takes
/// most of a second over its first 1 MiB messages.
#[test]
fn qperf_streaming_send_and_write_with_immediate() {
    qperf_with(
        &["-t", "2"],
        &[
            "rc_bw",
            "rc_bi_bw",
            "uc_bw",
            "uc_bi_bw",
            "rc_rdma_write_bw",
            "uc_rdma_write_bw",
        ],
        SIZES,
    );
}
