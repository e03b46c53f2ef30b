//! Running unmodified rdma-core programs through `softrdma run`.
//!
//! * The `softrdma` binary comes from the same target directory as this
//!   test (`cargo build -p softrdma-cli -p softrdma-capi` first, so both it
//!   and the library beside it are current), and
//!   `softrdma run` finds this crate's `libibverbs.so` beside it.
//! * Each program runs as a child with a deadline: past it the child is
//!   killed and the test fails (a hang never blocks CI).
//! * Server/client pairs use a port nobody listens on (picked by binding
//!   port 0), and the client starts once the server listens on it (seen in
//!   `/proc/net/tcp`, so the server's single accept is not consumed).
//! * Pairs run one at a time (a lock): the machine has two cores and the
//!   benchmarks spin.

#![allow(dead_code)]

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long one program may run.
pub const DEADLINE: Duration = Duration::from_secs(90);

/// The target profile directory (where `libibverbs.so` and `softrdma` are).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf()
}

/// The `softrdma` CLI, built if needed.
pub fn softrdma() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = target_dir();
        let bin = dir.join("softrdma");
        let profile_release = dir.file_name().is_some_and(|n| n == "release");
        // Always (re)build: cheap when up to date, and a stale binary
        // would test old code.
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        // softrdma-capi too: `cargo test` builds its cdylib only in deps/,
        // and a stale libibverbs.so beside the CLI would be tested instead.
        cmd.args(["build", "-q", "-p", "softrdma-cli", "-p", "softrdma-capi"]);
        // librdmacm.so.1 too, once its crate exists (programs that load
        // it would otherwise get the system one or a stale build).
        let rdmacm = Path::new(env!("CARGO_MANIFEST_DIR")).join("../capi-rdmacm/Cargo.toml");
        if rdmacm.is_file() {
            cmd.args(["-p", "softrdma-capi-rdmacm"]);
        }
        if profile_release {
            cmd.arg("--release");
        }
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        let st = cmd.status().expect("running cargo to build softrdma");
        assert!(st.success(), "building the softrdma CLI failed");
        assert!(bin.is_file(), "{} missing after the build", bin.display());
        assert!(
            dir.join("libibverbs.so").is_file(),
            "libibverbs.so missing in {}",
            dir.display()
        );
        bin
    })
    .clone()
}

/// Serialises program runs.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Asserts a Debian program is installed.
pub fn need(prog: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{prog} is not installed: run scripts/install-test-deps.sh (ibverbs-utils, rdmacm-utils, perftest, qperf)"
    );
}

/// A TCP port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind port 0")
}

/// What a finished program left.
#[derive(Debug)]
pub struct Done {
    /// Exit code (None: killed by a signal or by the deadline).
    pub code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// Killed at the deadline.
    pub timed_out: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Killed at the deadline: its threads' stacks just before (see
    /// `post_mortem`); empty otherwise.
    pub stacks: String,
    /// Of a [`pair`]: how the other program ended and what it printed, so
    /// a failure of one side shows both (empty otherwise).
    pub peer: String,
}

impl Done {
    /// Exited 0 before the deadline.
    pub fn ok(&self) -> bool {
        !self.timed_out && self.code == Some(0)
    }

    /// How it ended and what it printed.
    fn outcome(&self) -> String {
        format!(
            "exit {:?}, signal {:?}{}\nstdout:\n{}\nstderr:\n{}",
            self.code,
            self.signal,
            if self.timed_out {
                " (killed at the deadline)"
            } else {
                ""
            },
            self.stdout,
            self.stderr
        )
    }

    /// [`Done::outcome`] as a paragraph for another program's failure
    /// message.
    pub fn summary(&self, who: &str) -> String {
        format!("\n--- {who}: {}", self.outcome())
    }

    /// Asserts exit 0 and that stdout contains every one of `needles`.
    pub fn assert_ok(&self, what: &str, needles: &[&str]) {
        assert!(
            self.ok(),
            "{what}: {}{}{}",
            self.outcome(),
            if self.stacks.is_empty() {
                String::new()
            } else {
                format!("\nstacks before the kill:\n{}", self.stacks)
            },
            self.peer
        );
        for n in needles {
            assert!(
                self.stdout.contains(n),
                "{what}: output lacks {n:?}\nstdout:\n{}\nstderr:\n{}{}",
                self.stdout,
                self.stderr,
                self.peer
            );
        }
    }
}

/// Starts `softrdma run -- prog args`, in a process group of its own
/// (`finish` ends the whole group: a forking server's children too).
pub fn spawn(prog: &str, args: &[&str]) -> Child {
    need(prog);
    Command::new(softrdma())
        .process_group(0)
        .arg("run")
        .arg("--")
        .arg(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {prog}: {e}"))
}

/// Kills the process group `pid` leads, if it leads one (children made
/// by [`spawn`] do; for any other the group does not exist: `ESRCH`).
pub fn kill_group(pid: u32) {
    if let Ok(pgid) = i32::try_from(pid) {
        // SAFETY: kill(2) with a negative id signals that process group only.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
}

/// Waits for `child` until `deadline`, killing it then.
pub fn finish(mut child: Child, deadline: Instant) -> Done {
    // Drain the pipes in threads so a chatty child never blocks on them.
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let to = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let te = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut timed_out = false;
    let mut stacks = String::new();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            stacks = post_mortem(child.id());
            let _ = child.kill();
            break child.wait().expect("wait after kill");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // What is left of its process group (a forking server's children)
    // would hold the pipes open: the reads below would never end.
    kill_group(child.id());
    Done {
        code: status.code(),
        signal: std::os::unix::process::ExitStatusExt::signal(&status),
        timed_out,
        stdout: to.join().unwrap_or_default(),
        stderr: te.join().unwrap_or_default(),
        stacks,
        peer: String::new(),
    }
}

/// What a hung program was doing, taken before it is killed: every
/// thread's stack from gdb (when installed), which also flushes the
/// program's stdio buffers into the pipes (a program writing to a pipe
/// buffers its output, and a kill loses it), else the threads' kernel wait
/// channels.
fn post_mortem(pid: u32) -> String {
    // Bounded: a debugger that cannot attach must not hang the test it
    // reports on.
    let gdb = Command::new("timeout")
        .args([
            "-s",
            "KILL",
            "30",
            "gdb",
            "-p",
            &pid.to_string(),
            "-batch",
            "-nx",
            "-q",
        ])
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt 30"])
        .args(["-ex", "call (int) fflush(0)"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    if let Ok(o) = gdb {
        let text = String::from_utf8_lossy(&o.stdout);
        let bt: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with('#') || l.starts_with("Thread "))
            .collect();
        if !bt.is_empty() {
            return bt.join("\n");
        }
    }
    let mut out = String::from(
        "(no stacks from gdb — not installed or not allowed to attach: kernel wait channels)",
    );
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let p = t.path();
            let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
            let wchan = std::fs::read_to_string(p.join("wchan")).unwrap_or_default();
            out.push_str(&format!(
                "\n{} {}: {wchan}",
                comm.trim(),
                t.file_name().to_string_lossy()
            ));
        }
    }
    out
}

/// Runs one program to completion.
pub fn run(prog: &str, args: &[&str]) -> Done {
    let _g = serial();
    finish(spawn(prog, args), Instant::now() + DEADLINE)
}

/// True once something listens on TCP `port` (IPv4 or IPv6).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// Runs a server and, once it listens on `port`, a client; returns
/// (server, client).
pub fn pair(prog: &str, server: &[&str], client: &[&str], port: u16) -> (Done, Done) {
    let _g = serial();
    let deadline = Instant::now() + DEADLINE;
    let mut s = spawn(prog, server);
    while !listening(port) {
        if let Some(st) = s.try_wait().expect("wait") {
            let d = finish(s, deadline);
            panic!(
                "{prog} server exited ({st}) before listening:\n{}\n{}",
                d.stdout, d.stderr
            );
        }
        if Instant::now() >= deadline {
            let d = finish(s, Instant::now());
            panic!(
                "{prog} server never listened on {port}:\n{}\n{}",
                d.stdout, d.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = spawn(prog, client);
    let mut cd = finish(c, deadline);
    // The server gets a little longer than the client to wind down; after
    // a client that failed, only that (it may wait for it for ever).
    let grace = Instant::now() + Duration::from_secs(10);
    let mut sd = finish(s, if cd.ok() { deadline.max(grace) } else { grace });
    sd.peer = cd.summary("the client");
    cd.peer = sd.summary("the server");
    (sd, cd)
}
