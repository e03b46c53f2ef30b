//! Nested epoll sets and signals on a carried connection, from a C
//! program (`tests/c/nested_epoll.c`): the client waits for a carried
//! socket through an epoll set inside another (level-triggered,
//! edge-triggered, one-shot, three sets deep), through `poll` and
//! `select` on an epoll descriptor, checks loops, removal and closing,
//! and a blocking read interrupted by a signal. The same program runs
//! under the kernel alone, which shows its checks are the kernel's
//! semantics.

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
    let out = tmp.join("nested_epoll");
    let st = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-pthread", "-o"])
        .arg(&out)
        .arg(dir.join("tests/c/nested_epoll.c"))
        .arg("-I")
        .arg(dir.join("include"))
        .status()
        .expect("cc runs");
    assert!(st.success(), "compiling tests/c/nested_epoll.c failed");
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
        let tmp = std::env::temp_dir().join(format!(
            "softrdma-nested-epoll-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("registry")).expect("temp dir");
        let report = tmp.join("report.txt");
        Run { tmp, report }
    }

    fn cmd(&self, exe: &Path, args: &[&str], interposed: bool) -> Command {
        let mut c = Command::new(exe);
        c.args(args)
            .env("SOFTRDMA_SOCKETS_DIR", self.tmp.join("registry"))
            .env("SOFTRDMA_SOCKETS_REPORT", &self.report)
            .env_remove("SOFTRDMA_SOCKETS")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if interposed {
            c.env("LD_PRELOAD", interposer());
        }
        c
    }

    /// The `rc_conns=` totals of the processes' exit reports.
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

/// Runs server and client; returns their outputs.
fn pair(run: &Run, interposed: bool) -> (Output, Output) {
    let exe = build_c(&run.tmp);
    let port = free_port().to_string();
    let mut server = run
        .cmd(&exe, &["server", &port], interposed)
        .spawn()
        .expect("server starts");
    // The client connects once the server listens (its first line).
    let mut first = [0u8; 10];
    use std::io::Read;
    server
        .stdout
        .as_mut()
        .expect("server stdout")
        .read_exact(&mut first)
        .expect("server says it listens");
    assert_eq!(&first, b"listening\n");
    let client = run
        .cmd(&exe, &["client", &port], interposed)
        .spawn()
        .expect("client starts");
    let c = finish(client, Duration::from_secs(60), "client");
    let s = finish(server, Duration::from_secs(30), "server");
    (c, s)
}

fn line_value(out: &str, key: &str) -> Option<i64> {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn nested_sets_report_a_carried_socket_and_signals_restart_as_in_the_kernel() {
    let run = Run::new("rc");
    let (c, s) = pair(&run, true);
    let (ct, st) = (text(&c), text(&s));
    assert!(c.status.success(), "client: {ct}");
    assert!(s.status.success(), "server: {st}");
    assert!(ct.contains("all checks passed"), "{ct}");
    assert!(st.contains("server: echoed 13 records"), "{st}");
    assert_eq!(
        line_value(&ct, "transport: "),
        Some(1),
        "the connection is carried over RC: {ct}"
    );
    // One level of the kernel's five goes to softrdma's own wait chain.
    assert_eq!(line_value(&ct, "depth: "), Some(4), "{ct}");
    assert_eq!(run.rc_conns(), 2, "both ends count one RC connection");
}

#[test]
fn the_same_checks_hold_under_the_kernel_alone() {
    let run = Run::new("kernel");
    let (c, s) = pair(&run, false);
    let (ct, st) = (text(&c), text(&s));
    assert!(c.status.success(), "client: {ct}");
    assert!(s.status.success(), "server: {st}");
    assert!(ct.contains("all checks passed"), "{ct}");
    assert_eq!(line_value(&ct, "transport: "), Some(0), "{ct}");
    assert_eq!(line_value(&ct, "depth: "), Some(5), "{ct}");
    assert_eq!(run.rc_conns(), 0, "no interposer, no report");
}
