//! `SOCK_DGRAM` sockets of the RDMA model (UD and RD queue pairs)
//! between two processes of one C program (`tests/c/dgram_test.c`, built
//! against `include/sys/exs.h` and the library cargo just built). Every
//! run is bounded by a deadline.

use std::path::Path;
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

fn case(mode: &str) -> String {
    let dir =
        std::env::temp_dir().join(format!("softrdma-exs-dgram-{mode}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let lib = common::library();
    std::fs::copy(&lib, dir.join("libexs.so.1")).expect("library");
    std::os::unix::fs::symlink("libexs.so.1", dir.join("libexs.so")).expect("link");
    let exe = dir.join("dgram_test");
    let o = run(
        Command::new("cc")
            .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&exe)
            .arg(manifest().join("tests/c/dgram_test.c"))
            .arg("-I")
            .arg(manifest().join("include"))
            .arg("-L")
            .arg(&dir)
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .arg("-lexs"),
        Duration::from_secs(60),
        "cc dgram_test.c",
    );
    assert!(o.status.success(), "compiling dgram_test.c: {}", text(&o));
    let o = run(Command::new(&exe).arg(mode), Duration::from_secs(90), mode);
    let t = text(&o);
    let _ = std::fs::remove_dir_all(dir);
    assert!(o.status.success(), "dgram_test {mode} failed:\n{t}");
    assert!(
        t.contains("client: ok") && t.contains("server: ok") && t.contains("sizes: 10 datagrams"),
        "missing verdicts:\n{t}"
    );
    t
}

/// Datagrams of 1 to 65536 octets with contents checked and echoed to
/// the reported source, `MSG_TRUNC`, connected sockets, refused calls,
/// `ECANCELED` at close: over UD.
#[test]
fn ud_datagrams_keep_boundaries_sources_and_truncation() {
    case("ud");
}

/// The same over RD queue pairs (`EXS_F_SETDGRAM`, `EXS_DGRAM_RD`).
#[test]
fn rd_datagrams_keep_boundaries_sources_and_truncation() {
    case("rd");
}
