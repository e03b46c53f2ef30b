//! The RDMA model of `libexs.so` between two processes of one C program
//! (`tests/c/rdma_test.c`, built against `include/sys/exs.h` and the
//! library cargo just built): the program forks, the child serves on
//! 127.0.0.1 and the parent connects. Every run is bounded by a deadline.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `cmd` within `limit`; kills it and fails past it.
fn run(cmd: &mut Command, limit: Duration, what: &str) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    let end = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what} did not finish in {limit:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Builds `rdma_test` once per test in its own directory, next to a
/// `libexs.so.1` copy of the library (the SONAME the program loads).
fn build(name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("softrdma-exs-rdma-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let lib = common::library();
    std::fs::copy(&lib, dir.join("libexs.so.1")).expect("library");
    std::os::unix::fs::symlink("libexs.so.1", dir.join("libexs.so")).expect("link");
    let exe = dir.join("rdma_test");
    let o = run(
        Command::new("cc")
            .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&exe)
            .arg(manifest().join("tests/c/rdma_test.c"))
            .arg("-I")
            .arg(manifest().join("include"))
            .arg("-L")
            .arg(&dir)
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lexs")
            .arg("-lpthread"),
        Duration::from_secs(60),
        "cc rdma_test.c",
    );
    assert!(o.status.success(), "compiling rdma_test.c: {}", text(&o));
    (dir, exe)
}

fn case(mode: &str, args: &[&str], limit: Duration) -> String {
    let (dir, exe) = build(mode);
    let o = run(Command::new(&exe).arg(mode).args(args), limit, mode);
    let t = text(&o);
    let _ = std::fs::remove_dir_all(dir);
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
/// library, 50 000 with a debug one (about 15 000 per second there).
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
