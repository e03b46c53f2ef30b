//! UDP multicast under the interposer (`tests/c/udp_mcast.c`): with
//! `SOFTRDMA_SOCKETS_MCAST=ud` on both ends the group's datagrams go over
//! UD multicast, each delivered once; without it they stay the kernel's,
//! also delivered once.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

fn interposer() -> PathBuf {
    let p = target_dir().join("libsoftrdma_sockets.so");
    assert!(p.is_file(), "{} is missing", p.display());
    p
}

struct Run {
    tmp: PathBuf,
    report: PathBuf,
    exe: PathBuf,
}

impl Run {
    fn new(name: &str) -> Run {
        let tmp =
            std::env::temp_dir().join(format!("softrdma-udp-mcast-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("registry")).expect("temp dir");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let exe = tmp.join("udp_mcast");
        let st = Command::new("cc")
            .args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(dir.join("tests/c/udp_mcast.c"))
            .status()
            .expect("cc runs");
        assert!(st.success(), "compiling tests/c/udp_mcast.c failed");
        let report = tmp.join("report.txt");
        Run { tmp, report, exe }
    }

    fn cmd(&self, args: &[&str], mcast: bool) -> Command {
        let mut c = Command::new(&self.exe);
        c.args(args)
            .env("LD_PRELOAD", interposer())
            .env("SOFTRDMA_SOCKETS_DIR", self.tmp.join("registry"))
            .env("SOFTRDMA_SOCKETS_REPORT", &self.report)
            .env_remove("SOFTRDMA_SOCKETS")
            .env_remove("SOFTRDMA_SOCKETS_UDP")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if mcast {
            c.env("SOFTRDMA_SOCKETS_MCAST", "ud");
        } else {
            c.env_remove("SOFTRDMA_SOCKETS_MCAST");
        }
        c
    }

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

    /// One receiver and one sender on a group of their own; the
    /// receiver's output.
    fn exchange(&self, mcast: bool) -> String {
        let pid = std::process::id();
        let group = format!("239.77.{}.{}", (pid >> 8) as u8, pid as u8);
        let port = std::net::UdpSocket::bind("0.0.0.0:0")
            .and_then(|s| s.local_addr())
            .expect("a free port")
            .port()
            .to_string();
        let recv = self
            .cmd(&["recv", &group, &port], mcast)
            .spawn()
            .expect("receiver starts");
        std::thread::sleep(Duration::from_millis(500));
        let send = self
            .cmd(&["send", &group, &port], mcast)
            .spawn()
            .expect("sender starts");
        let s = finish(send, Duration::from_secs(30), "sender");
        let r = finish(recv, Duration::from_secs(30), "receiver");
        assert!(s.status.success(), "sender: {}", text(&s));
        assert!(r.status.success(), "receiver: {}", text(&r));
        text(&r)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
    let end = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("{what} did not finish in {limit:?}: {}", text(&out));
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

fn each_once(r: &str) {
    for i in 0..3 {
        let line = format!("got datagram-{i}\n");
        assert_eq!(r.matches(&line).count(), 1, "{r}");
    }
    assert!(r.contains("received 3"), "{r}");
}

#[test]
fn with_the_policy_the_group_goes_over_ud_once() {
    let run = Run::new("ud");
    let r = run.exchange(true);
    each_once(&r);
    assert_eq!(run.ud_tx_bytes(), 3 * 10, "the three datagrams over UD");
}

#[test]
fn without_it_the_kernel_carries_the_group() {
    let run = Run::new("kernel");
    let r = run.exchange(false);
    each_once(&r);
    assert_eq!(run.ud_tx_bytes(), 0, "nothing over UD");
}
