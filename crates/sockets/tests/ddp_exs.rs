//! DDPMODE meets the Extended Sockets API (`tests/c/ddp_exs.c`, built
//! against `softrdma/sockets.h` and `sys/exs.h`, linked with `-lexs`):
//! under the interposer, whose `exs_*` exports the program's calls bind
//! to, a socket both ends switched with `SOFTRDMA_DDPMODE` moves to the
//! RDMA model at its first `exs_*` call (normal, immediate, persistent
//! and offset transfers, credits, on the same RC connection); without
//! the interposer the option is refused and the program falls back to
//! the Open Group model with the documented errors.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod common;
use common::{finish, free_tcp_port, target_dir, text, Scratch};

/// `libexs.so` of this build. Cargo builds it on first use (it is another
/// package's library), with this package's interposer: `cargo test` does
/// not build a `cdylib` for the integration tests, and this test needs
/// the current one.
fn libexs() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = target_dir();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args([
                "build",
                "-q",
                "-p",
                "softrdma-exs",
                "-p",
                "softrdma-sockets",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
            if dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            if let Some(target) = dir.parent() {
                cmd.env("CARGO_TARGET_DIR", target);
            }
            let mut child = cmd.spawn().expect("running cargo to build softrdma-exs");
            let until = Instant::now() + Duration::from_secs(1200);
            let st = loop {
                if let Some(st) = child.try_wait().expect("wait for cargo") {
                    break st;
                }
                if Instant::now() >= until {
                    let _ = child.kill();
                    panic!("building softrdma-exs took more than 20 minutes");
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            assert!(
                st.success(),
                "cargo build -p softrdma-exs -p softrdma-sockets failed"
            );
            let lib = dir.join("libexs.so");
            assert!(lib.is_file(), "{} missing after the build", lib.display());
            lib
        })
        .clone()
}

/// Compiles `tests/c/ddp_exs.c` into `dir`, with `libexs.so.1` installed
/// next to it (found there at run time through the rpath).
fn build(dir: &Path) -> PathBuf {
    std::fs::copy(libexs(), dir.join("libexs.so.1")).expect("library");
    std::os::unix::fs::symlink("libexs.so.1", dir.join("libexs.so")).expect("link");
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join("ddp_exs");
    let child = Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(src.join("tests/c/ddp_exs.c"))
        .arg("-I")
        .arg(src.join("include"))
        .arg("-I")
        .arg(src.join("../exs/include"))
        .arg("-L")
        .arg(dir)
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg("-lexs")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cc runs");
    let o = finish(child, Duration::from_secs(60), "cc");
    assert!(o.status.success(), "compiling ddp_exs.c: {}", text(&o));
    out
}

/// Runs the server and the client with `mode`, under the interposer or
/// not; their outputs, both successful.
fn pair(s: &Scratch, mode: &str, interposed: bool) -> (String, String) {
    let exe = build(&s.dir);
    let port = free_tcp_port().to_string();
    let cmd = |role: &str| {
        let mut c = s.command(&exe, interposed);
        c.args([role, port.as_str(), mode])
            .env("SOFTRDMA_SOCKETS", "ddpmode");
        c
    };
    let server = cmd("server").spawn().expect("server starts");
    // The client retries its connect until the server listens.
    let client = cmd("client").spawn().expect("client starts");
    let c = finish(client, Duration::from_secs(60), "client");
    let sv = finish(server, Duration::from_secs(60), "server");
    assert!(
        c.status.success(),
        "client: {}\nserver: {}",
        text(&c),
        text(&sv)
    );
    assert!(
        sv.status.success(),
        "server: {}\nclient: {}",
        text(&sv),
        text(&c)
    );
    (text(&sv), text(&c))
}

#[test]
fn a_ddpmode_socket_runs_the_exs_rdma_model() {
    let s = Scratch::new("ddp-exs-rdma");
    let (sv, c) = pair(&s, "rdma", true);
    for want in [
        "server: DDPMODE on",
        "server: plain write done; read after the peer's switch: EOPNOTSUPP",
        "server: switched, DDPMODE reads 2, credits 64",
        "server: 1 KiB, 1 MiB and 100 octets intact",
        "server: persistent receive written at offset 1000",
        "server: persistent send pulled whole and at offset 3000",
        "server: ok",
    ] {
        assert!(sv.contains(want), "server lacks {want:?}:\n{sv}");
    }
    for want in [
        "client: DDPMODE on",
        "client: 3145733 plain octets from before the switch intact",
        "client: normal and immediate sends done, credits 64",
        "client: read and write after the switch: EOPNOTSUPP",
        "client: offset write and persistent pulls done",
        "client: ok",
    ] {
        assert!(c.contains(want), "client lacks {want:?}:\n{c}");
    }
    // One RC connection per end: the EXS messages went over the QP the
    // DDPMODE switch made (no second connection).
    assert_eq!(
        s.report_sum("rc_conns"),
        2,
        "both ends count one RC connection"
    );
}

#[test]
fn without_the_interposer_the_exs_calls_stay_with_the_kernel() {
    let s = Scratch::new("ddp-exs-fallback");
    let (sv, c) = pair(&s, "fallback", false);
    for (who, out) in [("server", &sv), ("client", &c)] {
        assert!(
            out.contains(&format!("{who}: DDPMODE refused (ENOPROTOOPT)")),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "{who}: RDMA-model calls refused (ENOTSOCK, EOPNOTSUPP)"
            )),
            "{out}"
        );
        assert!(out.contains(&format!("{who}: ok")), "{out}");
    }
    assert!(
        sv.contains("server: Open Group model: 1 KiB and 1 MiB intact"),
        "{sv}"
    );
}
