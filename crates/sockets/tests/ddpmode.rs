//! `SOFTRDMA_DDPMODE` (`softrdma/sockets.h`) from a C program built
//! against the header: with `SOFTRDMA_SOCKETS=ddpmode` a connected socket
//! is plain until both ends switch it, then carries its bytes over RC; a
//! peer that does not switch leaves the socket plain and its data intact;
//! without the interposer the option is refused with `ENOPROTOOPT`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>`, from this test's own path (`target/<profile>/deps/…`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

fn interposer() -> PathBuf {
    let p = target_dir().join("libsoftrdma_sockets.so");
    assert!(
        p.is_file(),
        "{} is missing (cargo builds it with the tests)",
        p.display()
    );
    p
}

fn build_c(tmp: &Path) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tmp.join("ddpmode");
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(dir.join("tests/c/ddpmode.c"))
        .arg("-I")
        .arg(dir.join("include"))
        .status()
        .expect("cc runs");
    assert!(st.success(), "compiling tests/c/ddpmode.c failed");
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

struct Run {
    tmp: PathBuf,
    report: PathBuf,
}

impl Run {
    fn new(name: &str) -> Run {
        let tmp =
            std::env::temp_dir().join(format!("softrdma-ddpmode-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("registry")).expect("temp dir");
        let report = tmp.join("report.txt");
        Run { tmp, report }
    }

    fn cmd(&self, exe: &Path, args: &[&str], interposed: bool) -> Command {
        let mut c = Command::new(exe);
        c.args(args)
            .env("SOFTRDMA_SOCKETS", "ddpmode")
            .env("SOFTRDMA_SOCKETS_DIR", self.tmp.join("registry"))
            .env("SOFTRDMA_SOCKETS_REPORT", &self.report)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if interposed {
            c.env("LD_PRELOAD", interposer());
        }
        c
    }

    fn rc_conns(&self) -> u64 {
        std::fs::read_to_string(&self.report)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix("rc_conns="))
            })
            .map(|v| v.parse::<u64>().expect("a count"))
            .sum()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// Waits for `child` at most `limit`; kills it and fails past it.
fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
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

#[test]
fn both_ends_switch_and_the_data_goes_over_rc() {
    let run = Run::new("both");
    let exe = build_c(&run.tmp);
    let port = free_port();
    // The server accepts one connection: no probe, a pause instead.
    let server = run
        .cmd(&exe, &["server", &port.to_string()], true)
        .spawn()
        .expect("server starts");
    std::thread::sleep(Duration::from_millis(300));
    let client = run
        .cmd(&exe, &["client", &port.to_string()], true)
        .spawn()
        .expect("client starts");
    let c = finish(client, Duration::from_secs(30), "client");
    let s = finish(server, Duration::from_secs(30), "server");
    assert!(c.status.success(), "client: {}", text(&c));
    assert!(s.status.success(), "server: {}", text(&s));
    assert!(
        text(&s).contains("switch: ok, DDPMODE reads 1"),
        "{}",
        text(&s)
    );
    assert!(text(&s).contains("octets intact"), "{}", text(&s));
    assert!(
        text(&c).contains("switch: ok, DDPMODE reads 1"),
        "{}",
        text(&c)
    );
    assert_eq!(run.rc_conns(), 2, "both ends count one RC connection");
}

#[test]
fn a_peer_that_does_not_switch_leaves_the_socket_plain() {
    let run = Run::new("noswitch");
    let exe = build_c(&run.tmp);
    let port = free_port();
    let server = run
        .cmd(&exe, &["server", &port.to_string()], true)
        .spawn()
        .expect("server starts");
    std::thread::sleep(Duration::from_millis(300));
    let client = run
        .cmd(&exe, &["noswitch-client", &port.to_string()], true)
        .spawn()
        .expect("client starts");
    let c = finish(client, Duration::from_secs(30), "client");
    let s = finish(server, Duration::from_secs(30), "server");
    assert!(c.status.success(), "client: {}", text(&c));
    assert!(s.status.success(), "server: {}", text(&s));
    assert!(
        text(&s).contains("peer did not switch; plain data intact"),
        "{}",
        text(&s)
    );
    assert_eq!(run.rc_conns(), 0, "nothing went over RC");
}

#[test]
fn without_the_interposer_the_option_is_refused() {
    let run = Run::new("none");
    let exe = build_c(&run.tmp);
    // A client alone: its switch fails with ENOPROTOOPT from the kernel.
    let port = free_port();
    let l = std::net::TcpListener::bind(("127.0.0.1", port)).expect("listener");
    let client = run
        .cmd(&exe, &["client", &port.to_string()], false)
        .spawn()
        .expect("client starts");
    let (mut conn, _) = l.accept().expect("accept");
    use std::io::{Read, Write};
    let mut hi = [0u8; 3];
    conn.read_exact(&mut hi).expect("hi");
    conn.write_all(b"ok\n").expect("ok");
    let c = finish(client, Duration::from_secs(30), "client");
    assert!(!c.status.success());
    assert!(
        text(&c).contains(&format!("errno {}", libc::ENOPROTOOPT)),
        "{}",
        text(&c)
    );
}
