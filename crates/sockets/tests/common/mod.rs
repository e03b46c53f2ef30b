//! What the interposer's process-driven tests share: the interposer
//! library, a scratch directory holding the registry and the exit report,
//! compiling a test program from `tests/c`, free ports, and waiting for
//! programs under a deadline.
//!
//! Each test file compiles this module on its own; items one of them does
//! not use (the socat-driven test compiles no program of its own) are
//! marked `allow(dead_code)`.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>`, from this test's own path (`target/<profile>/deps/…`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// `libsoftrdma_sockets.so` of this build; fails if it is not there.
pub fn interposer() -> PathBuf {
    let p = target_dir().join("libsoftrdma_sockets.so");
    assert!(
        p.is_file(),
        "{} is missing (cargo builds it with the tests)",
        p.display()
    );
    p
}

/// Compiles `tests/c/<name>.c` into `<dir>/<name>` against the package's
/// headers, with warnings as errors and `flags` added, within a minute.
#[allow(dead_code)]
pub fn build_c(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join(name);
    let child = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(src.join(format!("tests/c/{name}.c")))
        .arg("-I")
        .arg(src.join("include"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cc runs");
    let o = finish(child, Duration::from_secs(60), "cc");
    assert!(
        o.status.success(),
        "compiling tests/c/{name}.c failed: {}",
        text(&o)
    );
    out
}

/// A TCP port nothing listens on at the moment.
#[allow(dead_code)]
pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A UDP port nothing is bound to on 127.0.0.1 at the moment.
#[allow(dead_code)]
pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free port")
        .port()
}

/// A scratch directory with an empty `registry` in it and the path of
/// the exit report; removed when dropped.
pub struct Scratch {
    /// The directory, `softrdma-<name>-<pid>` under the system's
    /// temporary one.
    pub dir: PathBuf,
}

impl Scratch {
    /// Creates `softrdma-<name>-<pid>`, emptied first.
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("softrdma-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("registry")).expect("temp dir");
        Scratch { dir }
    }

    /// Where the processes append their exit reports.
    pub fn report(&self) -> PathBuf {
        self.dir.join("report.txt")
    }

    /// `exe` with this directory's registry and exit report, stdout and
    /// stderr piped, under the interposer if `interposed`.
    pub fn command(&self, exe: impl AsRef<OsStr>, interposed: bool) -> Command {
        let mut c = Command::new(exe);
        c.env("SOFTRDMA_SOCKETS_DIR", self.dir.join("registry"))
            .env("SOFTRDMA_SOCKETS_REPORT", self.report())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if interposed {
            c.env("LD_PRELOAD", interposer());
        }
        c
    }

    /// The `<key>=` totals of the processes' exit reports, summed.
    pub fn report_sum(&self, key: &str) -> u64 {
        let field = format!("{key}=");
        std::fs::read_to_string(self.report())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix(field.as_str()))
            })
            .map(|v| v.parse::<u64>().expect("a count"))
            .sum()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits for `child` at most `limit`; `None` (and killed) past it.
pub fn wait_for(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return Some(s);
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` at most `limit`; kills it and fails past it.
#[allow(dead_code)]
pub fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
    let done = wait_for(&mut child, limit).is_some();
    let out = child.wait_with_output().expect("output");
    assert!(
        done,
        "{what} did not finish in {limit:?}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A finished program's stdout followed by its stderr.
#[allow(dead_code)]
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
