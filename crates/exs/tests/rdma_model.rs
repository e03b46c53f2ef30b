//! The RDMA model of `libexs.so` between two processes of one C program
//! (`tests/c/rdma_test.c`, built against `include/sys/exs.h` and the
//! library cargo just built): the program forks, the child serves on
//! 127.0.0.1 and the parent connects. Every run is bounded by a deadline.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

mod common;
use common::{compile, install_library, run, text, Tmp};

/// Builds `rdma_test` once per test in its own directory, next to a
/// `libexs.so.1` copy of the library (the SONAME the program loads).
fn build(name: &str) -> (Tmp, PathBuf) {
    let tmp = Tmp::new(&format!("rdma-{name}"));
    install_library(&tmp.0);
    let exe = tmp.0.join("rdma_test");
    compile("rdma_test.c", &exe, &tmp.0, &["-lpthread"]);
    (tmp, exe)
}

fn case(mode: &str, args: &[&str], limit: Duration) -> String {
    // One directory per mode and arguments: tests of one mode run at once.
    let (tmp, exe) = build(
        &[mode]
            .iter()
            .chain(args)
            .copied()
            .collect::<Vec<_>>()
            .join("-"),
    );
    let o = run(
        Command::new(&exe)
            .arg(mode)
            .args(args)
            .env("TMPDIR", &tmp.0),
        limit,
        mode,
    );
    let t = text(&o);
    drop(tmp);
    assert!(o.status.success(), "rdma_test {mode} failed:\n{t}");
    assert!(t.contains("client: ok"), "no client verdict:\n{t}");
    t
}

#[test]
fn seqpacket_transfers_keep_boundaries_and_truncate_short_receives() {
    let t = case("seqpacket", &[], Duration::from_secs(90));
    assert!(t.contains("server: ok"), "{t}");
}

#[test]
fn stream_keeps_byte_order_across_short_receives() {
    let t = case("stream", &[], Duration::from_secs(90));
    assert!(t.contains("server: ok"), "{t}");
}

/// Credits 16 on one end and 4 on the other negotiate 4; small messages
/// are blasted with 256 operations queued per side and every one must
/// arrive, in order, without a reset (a Send without a posted receive
/// would end the connection). 10^6 messages with a release build of the
/// library, 50 000 with a debug one (about 15 000 per second there); the
/// install test (`scripts/test-install.sh`) runs 10^6 against the
/// installed release library.
#[test]
fn credits_are_negotiated_and_a_blast_never_overruns_the_receiver() {
    let n = if cfg!(debug_assertions) {
        "50000"
    } else {
        "1000000"
    };
    let t = case("credits", &[n], Duration::from_secs(300));
    assert!(
        t.contains("server: ok") && t.contains(&format!("blast: {n} messages")),
        "{t}"
    );
}

#[test]
fn calls_that_cannot_start_fail_and_late_failures_are_events() {
    let t = case("errors", &[], Duration::from_secs(90));
    assert!(t.contains("server: ok"), "{t}");
}

/// Every outstanding operation ends with `ECONNRESET`, later calls fail
/// with it, and `exs_poll` reports `POLLHUP | POLLERR`.
#[test]
fn a_peer_killed_mid_transfer_resets_every_outstanding_operation() {
    case("kill", &[], Duration::from_secs(90));
}

#[test]
fn latency_ping_pong_runs() {
    let t = case("latency", &["200"], Duration::from_secs(90));
    for what in ["normal", "immediate", "persistent"] {
        for size in [1, 10, 100] {
            assert!(
                t.contains(&format!("latency {what} {size} B:")),
                "no {what} {size} B figure in\n{t}"
            );
        }
    }
}

/// Persistent send and receive, with and without notes: pulls of the
/// whole block (again and again), shorter pulls with `MSG_TRUNC`, pulls
/// and writes at offsets (contents checked), bounds (`EINVAL`), a send
/// longer than the peer's receive block (`EMSGSIZE`), one note event per
/// access with the right buffer and length, and the passive side's
/// refusals.
#[test]
fn persistent_blocks_are_pulled_and_pushed_one_sided() {
    let t = case("persistent", &[], Duration::from_secs(90));
    assert!(t.contains("server: ok"), "{t}");
}

/// Two connections with a thread each per side, one sleeping in
/// `exs_qdequeue` and one busy-polling, on their own queues: whichever
/// thread drives the connections (the waiters do, the progress thread
/// stays off the channel meanwhile), every event reaches its queue and
/// every message arrives intact.
#[test]
fn threads_waiting_on_their_own_queues_each_get_their_events() {
    let t = case("threads", &["2000"], Duration::from_secs(120));
    assert!(
        t.contains("server: ok") && t.contains("threads: 2000 ping-pongs"),
        "{t}"
    );
}

/// `exs_sendmsg` / `exs_recvmsg` (gather and scatter over registered and
/// unregistered iovecs, message boundaries, truncation with `MSG_TRUNC`
/// in the event and `msg_flags`), `exs_sendfile` (memory and a file range
/// of a file under `$TMPDIR`; a range past the end of the file: `EIO`),
/// `exs_poll` (an RDMA descriptor with a pipe, readable only once the
/// peer sent, writable only with credits, `POLLHUP` when both directions
/// are shut), `exs_cancel` (receives not matched and sends waiting for
/// credits: counts and `ECANCELED` events; sends on the wire go on),
/// `exs_shutdown` (end of stream after the last message, `EPIPE` for
/// later sends, the other direction still working, `SHUT_RD` ending
/// receives at once), `exs_aclose`, and their bad arguments, on a
/// SOCK_SEQPACKET connection.
#[test]
fn seqpacket_sendmsg_sendfile_poll_cancel_shutdown() {
    let t = case("calls", &["seqpacket"], Duration::from_secs(90));
    assert!(t.contains("server: ok"), "{t}");
}

/// The same calls on a SOCK_STREAM connection: the bytes of every
/// message arrive in order through receives shorter than the messages.
#[test]
fn stream_sendmsg_sendfile_poll_cancel_shutdown() {
    let t = case("calls", &["stream"], Duration::from_secs(90));
    assert!(t.contains("server: ok"), "{t}");
}
