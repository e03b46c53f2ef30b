//! `SOFTRDMA_TRANSPORT` on UDP sockets (`softrdma/sockets.h`) from a C
//! program built against the header: each end chooses its socket's
//! transport before the socket is bound or used; ends that agree carry
//! their datagrams over that queue pair (the option reads it back, the
//! exit report counts UD octets), ends that disagree or choose the kernel
//! go through the kernel, and the echo arrives intact either way.
//! Without the interposer the option is refused with `ENOPROTOOPT`.

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
    let out = tmp.join("udp_transport");
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(dir.join("tests/c/udp_transport.c"))
        .arg("-I")
        .arg(dir.join("include"))
        .status()
        .expect("cc runs");
    assert!(st.success(), "compiling tests/c/udp_transport.c failed");
    out
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free port")
        .port()
}

struct Run {
    tmp: PathBuf,
    report: PathBuf,
    exe: PathBuf,
}

impl Run {
    fn new(name: &str) -> Run {
        let tmp = std::env::temp_dir().join(format!(
            "softrdma-udp-transport-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("registry")).expect("temp dir");
        let report = tmp.join("report.txt");
        let exe = build_c(&tmp);
        Run { tmp, report, exe }
    }

    fn cmd(&self, args: &[&str], interposed: bool) -> Command {
        let mut c = Command::new(&self.exe);
        c.args(args)
            .env("SOFTRDMA_SOCKETS_DIR", self.tmp.join("registry"))
            .env("SOFTRDMA_SOCKETS_REPORT", &self.report)
            .env_remove("SOFTRDMA_SOCKETS")
            .env_remove("SOFTRDMA_SOCKETS_UDP")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if interposed {
            c.env("LD_PRELOAD", interposer());
        }
        c
    }

    /// UD octets sent, summed over the processes' exit reports.
    fn ud_tx_bytes(&self) -> u64 {
        std::fs::read_to_string(&self.report)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix("ud_tx_bytes="))
            })
            .map(|v| v.parse::<u64>().expect("a count"))
            .sum()
    }

    /// Runs a server choosing `st` and a client choosing `ct`; their
    /// outputs.
    fn pair(&self, st: &str, ct: &str) -> (String, String) {
        let port = free_port().to_string();
        let server = self
            .cmd(&["server", &port, st], true)
            .spawn()
            .expect("server starts");
        std::thread::sleep(Duration::from_millis(300));
        let client = self
            .cmd(&["client", &port, ct], true)
            .spawn()
            .expect("client starts");
        let c = finish(client, Duration::from_secs(30), "client");
        let s = finish(server, Duration::from_secs(30), "server");
        assert!(c.status.success(), "client: {}", text(&c));
        assert!(s.status.success(), "server: {}", text(&s));
        let (s, c) = (text(&s), text(&c));
        assert!(s.contains("echoed 23 octets"), "{s}");
        assert!(c.contains("echo intact"), "{c}");
        (s, c)
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
fn both_ends_choose_rd_over_a_ud_default() {
    let run = Run::new("rd");
    let (s, c) = run.pair("rd", "rd");
    for out in [&s, &c] {
        assert!(out.contains("rc refused: EINVAL"), "{out}");
        assert!(out.contains("before: transport 0"), "{out}");
        assert!(out.contains("late change refused: EBUSY"), "{out}");
    }
    assert!(s.contains("server: transport 3"), "{s}");
    assert!(c.contains("client: transport 3"), "{c}");
    assert_eq!(run.ud_tx_bytes(), 2 * 23, "both datagrams over the QPs");
}

#[test]
fn both_ends_choose_ud() {
    let run = Run::new("ud");
    let (s, c) = run.pair("ud", "default");
    assert!(s.contains("server: transport 2"), "{s}");
    assert!(c.contains("client: transport 2"), "{c}");
    assert_eq!(run.ud_tx_bytes(), 2 * 23, "both datagrams over the QPs");
}

#[test]
fn ends_that_disagree_go_through_the_kernel() {
    let run = Run::new("mismatch");
    let (s, c) = run.pair("rd", "ud");
    assert!(s.contains("server: transport 3"), "{s}");
    assert!(c.contains("client: transport 2"), "{c}");
    assert_eq!(run.ud_tx_bytes(), 0, "nothing over a QP");
}

#[test]
fn a_socket_left_to_the_kernel() {
    let run = Run::new("kernel");
    let (s, c) = run.pair("kernel", "default");
    assert!(s.contains("server: transport 0"), "{s}");
    assert!(!s.contains("late change"), "{s}");
    assert!(c.contains("client: transport 0"), "{c}");
    assert_eq!(run.ud_tx_bytes(), 0, "nothing over a QP");
}

#[test]
fn without_the_interposer_the_option_is_refused() {
    let run = Run::new("none");
    let out = run
        .cmd(&["client", &free_port().to_string(), "ud"], false)
        .output()
        .expect("runs");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("option refused: ENOPROTOOPT"), "{t}");
}
