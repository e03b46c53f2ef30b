//! Unmodified Debian TCP programs under `softrdma run --sockets`.
//!
//! Every test runs a server and its clients as separate processes, in one
//! of three pairings (one `#[test]` each: `PROGRAM::both`,
//! `PROGRAM::client_only`, `PROGRAM::server_only`): both ends interposed
//! (`softrdma run --sockets -- PROG ...`), only the client, only the
//! server. Per run it checks
//!
//! * the data: files compared byte for byte, the replies a program must
//!   give, the results the programs report themselves;
//! * the `SOFTRDMA_SOCKETS_REPORT` lines the interposed processes append at
//!   exit (one file per side): both interposed, each side carried at
//!   least one connection over RC (`rc_conns >= 1`) and moved RC octets;
//!   one side interposed, that side carried none over RC and left at
//!   least one to the kernel (`kernel_conns >= 1`); a plain side wrote no
//!   line at all (it never loaded the interposer);
//! * a capture of the run on `lo` (`tcpdump`, filtered on the test's
//!   ports), dissected by `tshark` as `crates/sim/src/tshark.rs` does (MPA
//!   found by heuristic): DDP/RDMAP frames when both ends are interposed,
//!   none (but TCP payload) otherwise. Without `tcpdump` (or the right to
//!   capture) this part is skipped with a note; without `tshark` the test
//!   fails unless `SOFTRDMA_SKIP_TSHARK=1`.
//!
//! UDP (sockperf's default) between two interposed sockets goes over UD
//! queue pairs, whose datagrams use a UDP port of their own: both
//! interposed, each side moved UD octets (`ud_tx_bytes`/`ud_rx_bytes`) and
//! the capture of the program's own port holds no datagram at all, while
//! the server's QP port (from its registry entry) carries datagrams that
//! the repository's dissector (`tools/wireshark/softrdma_dgram.lua`)
//! decodes as softrdma iWARP (`srdma`); one side interposed, no UD octets,
//! the datagrams are on the program's port and none is `srdma`. No RC and
//! no DDP/RDMAP over TCP in any UDP pairing.
//!
//! Every process runs in its own process group under a deadline: a hang
//! is killed (with its threads' stacks taken by gdb first, when installed)
//! and fails the test. Each test has its own ports (picked by the kernel)
//! and its own registry directory (`SOFTRDMA_SOCKETS_DIR`, given to every
//! process, plain ones included), so tests run in parallel never find each
//! other. A failed test keeps its directory (captures, reports, outputs)
//! and names it.
//!
//! The programs come from `scripts/install-test-deps.sh`. The interposer
//! (`cargo build -p softrdma-sockets`) is built by the first test that
//! needs it, into this test's target directory; `SOFTRDMA_LIB_DIR` in the
//! test's environment makes `softrdma run --sockets` take the interposer
//! from there instead (another build, an installed one).

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------
// Harness
// ------------------------------------------------------------------

/// How long one program may run.
const DEADLINE: Duration = Duration::from_secs(60);
/// How long a server has to exit after being asked to stop.
const STOP_GRACE: Duration = Duration::from_secs(20);
/// How long a server has to start listening.
const LISTEN_WAIT: Duration = Duration::from_secs(30);
/// The most packets one capture keeps (the start of the run, where the
/// MPA negotiation is, and enough of the data to judge).
const CAPTURE_PACKETS: &str = "3000";
/// Octets kept of each packet: the headers (TCP, and MPA/DDP/RDMAP of a
/// segment's first FPDU, which tshark still finds), so a kept capture of
/// a bulk transfer stays small.
const CAPTURE_SNAPLEN: &str = "512";

/// tshark's options for MPA (as in `crates/sim/src/tshark.rs`): MPA has
/// no port of its own and is found only by heuristic, which must run
/// before any dissector registered on the port; the RPC-over-RDMA
/// heuristic would claim Send payloads.
const TSHARK_BASE_ARGS: [&str; 5] = [
    "-n",
    "-o",
    "tcp.try_heuristic_first:TRUE",
    "--disable-heuristic",
    "rpcrdma_iwarp",
];

/// The `softrdma` CLI of this build, with the interposer built beside it.
fn softrdma() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_softrdma"));
        let dir = bin.parent().expect("target profile dir").to_path_buf();
        // Always (re)build: cheap when up to date, and a stale interposer
        // would test old code. `cargo test -p softrdma-cli` does not build
        // the cdylib (it is no dependency of the CLI).
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "softrdma-sockets"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        let mut child = cmd
            .spawn()
            .expect("running cargo to build softrdma-sockets");
        let until = Instant::now() + Duration::from_secs(1200);
        let st = loop {
            if let Some(st) = child.try_wait().expect("wait for cargo") {
                break st;
            }
            if Instant::now() >= until {
                let _ = child.kill();
                panic!("building softrdma-sockets took more than 20 minutes");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(st.success(), "cargo build -p softrdma-sockets failed");
        let lib = dir.join("libsoftrdma_sockets.so");
        assert!(lib.is_file(), "{} missing after the build", lib.display());
        bin
    })
}

fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
}

/// Asserts a Debian program is installed.
fn need(prog: &str) {
    assert!(
        on_path(prog),
        "{prog} is not installed: run scripts/install-test-deps.sh"
    );
}

/// Ports handed out by this test binary: never twice, even after release.
fn taken() -> &'static Mutex<Vec<u16>> {
    static TAKEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    &TAKEN
}

/// A port free for both TCP and UDP on 127.0.0.1 that no other test of
/// this binary got, taken below the kernel's ephemeral range
/// (`ip_local_port_range`): a port the kernel handed out for port 0 is
/// handed out again — to another test's client, to a datagram QP's own
/// socket — before the program under test binds it ("Address already in
/// use"), while ports below the range go only to those who name them.
/// `_udp` is kept for the callers: every port is free for both.
fn free_port(_udp: bool) -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (first, last) = (10_000u16, low.saturating_sub(1).max(10_001));
    let span = u64::from(last - first);
    let mut x = u64::from(std::process::id()) << 16 | 0x9e37;
    loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = first + (x % span) as u16;
        let mut t = taken().lock().unwrap_or_else(|e| e.into_inner());
        if t.contains(&port) {
            continue;
        }
        let tcp = TcpListener::bind(("127.0.0.1", port)).is_ok();
        let udp = UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if tcp && udp {
            t.push(port);
            return port;
        }
    }
}

fn free_tcp_port() -> u16 {
    free_port(false)
}

/// `len` pseudo-random octets (xorshift64*), the same for the same seed.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v = vec![0u8; len.div_ceil(8) * 8];
    for c in v.chunks_exact_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        c.copy_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Compares two files: `Err` names the sizes or the first differing octet.
fn same_file(want: &Path, got: &Path) -> Result<(), String> {
    let open = |p: &Path| File::open(p).map_err(|e| format!("{}: {e}", p.display()));
    let (mut a, mut b) = (open(want)?, open(got)?);
    let (la, lb) = (
        a.metadata().map_or(0, |m| m.len()),
        b.metadata().map_or(0, |m| m.len()),
    );
    if la != lb {
        return Err(format!(
            "{} has {lb} octets, {} has {la}",
            got.display(),
            want.display()
        ));
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut off = 0u64;
    loop {
        let n = a.read(&mut ba).map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        b.read_exact(&mut bb[..n]).map_err(|e| e.to_string())?;
        if ba[..n] != bb[..n] {
            let i = (0..n).find(|&i| ba[i] != bb[i]).unwrap_or(0);
            return Err(format!(
                "{} differs from {} first at octet {}",
                got.display(),
                want.display(),
                off + i as u64
            ));
        }
        off += n as u64;
    }
}

/// Compares `got` with `want`: `Err` names the lengths or the first
/// differing octet.
fn same_bytes(want: &[u8], got: &[u8]) -> Result<(), String> {
    if want.len() != got.len() {
        return Err(format!("{} octets, not {}", got.len(), want.len()));
    }
    match (0..want.len()).find(|&i| want[i] != got[i]) {
        Some(i) => Err(format!("differs first at octet {i}")),
        None => Ok(()),
    }
}

/// Sends `sig` to process `pid`.
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// The last `n` characters of `s`.
fn tail(s: &str, n: usize) -> &str {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

fn drain(mut r: impl Read + Send + 'static, buf: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 65536];
        loop {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&chunk[..n]),
            }
        }
    })
}

/// A running program: its own process group (so a server's children die
/// with it at a deadline), its output collected as it comes.
struct Proc {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    out: Arc<Mutex<Vec<u8>>>,
    err: Arc<Mutex<Vec<u8>>>,
    drains: Vec<JoinHandle<()>>,
    done: bool,
}

/// How a program ended.
#[derive(Debug)]
struct Done {
    label: String,
    code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    stdout: Vec<u8>,
    stderr: String,
    /// Killed at the deadline: its threads' stacks just before.
    stacks: String,
}

impl Done {
    /// Exited 0 before the deadline.
    fn ok(&self) -> bool {
        !self.timed_out && self.code == Some(0)
    }

    /// Ended before the deadline by itself or on the signal it was asked
    /// to stop with, without crashing.
    fn stopped_cleanly(&self) -> bool {
        let crash = [
            libc::SIGSEGV,
            libc::SIGABRT,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGKILL,
        ];
        !self.timed_out && !self.signal.is_some_and(|s| crash.contains(&s))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Standard output and error together (programs differ in which one
    /// they report on).
    fn all_text(&self) -> String {
        format!("{}\n{}", self.text(), self.stderr)
    }

    /// How it ended and the end of what it printed.
    fn describe(&self) -> String {
        format!(
            "{}: exit {:?}, signal {:?}{}\n  stdout (end): {}\n  stderr (end): {}{}",
            self.label,
            self.code,
            self.signal,
            if self.timed_out {
                " (KILLED AT THE DEADLINE: hung)"
            } else {
                ""
            },
            tail(&self.text(), 3000),
            tail(&self.stderr, 3000),
            if self.stacks.is_empty() {
                String::new()
            } else {
                format!("\n  stacks before the kill:\n{}", self.stacks)
            }
        )
    }
}

impl Proc {
    /// Starts `cmd` (its stdin, stdout and stderr as the caller set them;
    /// piped ones are collected).
    fn start(label: &str, mut cmd: Command) -> Proc {
        cmd.process_group(0);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {label}: {e}"));
        let (out, err) = (Arc::default(), Arc::default());
        let mut drains = Vec::new();
        if let Some(o) = child.stdout.take() {
            drains.push(drain(o, Arc::clone(&out)));
        }
        if let Some(e) = child.stderr.take() {
            drains.push(drain(e, Arc::clone(&err)));
        }
        Proc {
            label: label.to_string(),
            stdin: child.stdin.take(),
            child,
            out,
            err,
            drains,
            done: false,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Standard output so far.
    fn out(&self) -> Vec<u8> {
        self.out.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Standard error so far.
    fn err(&self) -> String {
        String::from_utf8_lossy(&self.err.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Writes `data` to the program's standard input, giving up at
    /// `until` (a program that stopped reading must not hang the test; the
    /// writer thread then ends when the program is killed).
    fn write_stdin(&mut self, data: &[u8], until: Instant) -> std::io::Result<()> {
        let mut stdin = self
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("stdin not piped"))?;
        let data = data.to_vec();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = stdin.write_all(&data);
            let _ = tx.send((r, stdin));
        });
        match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok((r, stdin)) => {
                self.stdin = Some(stdin);
                r
            }
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{} does not read its standard input", self.label),
            )),
        }
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits until standard output holds `needle` after its first `from`
    /// octets; false if the program ended or `until` passed first.
    fn wait_output(&mut self, needle: &[u8], from: usize, until: Instant) -> bool {
        loop {
            let out = self.out();
            if out.len() > from && out[from..].windows(needle.len()).any(|w| w == needle) {
                return true;
            }
            if !self.running() || Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the program until `until`; kills its process group then.
    fn wait(mut self, until: Instant) -> Done {
        self.finish(until)
    }

    /// Asks the program to stop with `sig` (if it still runs) and waits
    /// [`STOP_GRACE`] for it.
    fn stop(mut self, sig: i32) -> Done {
        if self.running() {
            signal(self.pid(), sig);
        }
        self.finish(Instant::now() + STOP_GRACE)
    }

    fn finish(&mut self, until: Instant) -> Done {
        self.stdin = None;
        let mut timed_out = false;
        let mut stacks = String::new();
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                break st;
            }
            if Instant::now() >= until {
                timed_out = true;
                stacks = post_mortem(self.pid());
                signal(self.pid(), libc::SIGKILL);
                break self.child.wait().expect("wait after kill");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        self.done = true;
        // What the group left running (a server's children) goes too.
        // SAFETY: kill(2) of the process group this test made.
        unsafe { libc::kill(-(self.pid() as libc::pid_t), libc::SIGKILL) };
        // Pipes still held by a child that outlived the kill close soon.
        for d in self.drains.drain(..) {
            let _ = d.join();
        }
        Done {
            label: self.label.clone(),
            code: status.code(),
            signal: status.signal(),
            timed_out,
            stdout: self.out(),
            stderr: self.err(),
            stacks,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.done {
            // SAFETY: kill(2) of the process group this test made.
            unsafe { libc::kill(-(self.pid() as libc::pid_t), libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }
}

/// What a hung program was doing, taken before it is killed: every
/// thread's stack from gdb (when installed and allowed to attach), else
/// the threads' kernel wait channels.
fn post_mortem(pid: u32) -> String {
    if on_path("gdb") && on_path("timeout") {
        // Bounded: a debugger that cannot attach must not hang the test.
        let out = Command::new("timeout")
            .args(["-s", "KILL", "30", "gdb", "-p", &pid.to_string()])
            .args(["-batch", "-nx", "-q", "-ex", "set pagination off"])
            .args(["-ex", "thread apply all bt 30"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output();
        if let Ok(o) = out {
            let text = String::from_utf8_lossy(&o.stdout);
            let bt: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with('#') || l.starts_with("Thread "))
                .collect();
            if !bt.is_empty() {
                return bt.join("\n");
            }
        }
    }
    let mut out = String::from("(no stacks from gdb; kernel wait channels)");
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

/// True once something listens on `port` (TCP: a LISTEN socket; UDP: a
/// bound socket), IPv4 or IPv6.
fn listening(port: u16, udp: bool) -> bool {
    let want = format!(":{port:04X}");
    let files: [&str; 2] = if udp {
        ["/proc/net/udp", "/proc/net/udp6"]
    } else {
        ["/proc/net/tcp", "/proc/net/tcp6"]
    };
    files.iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 3 && c[1].ends_with(&want) && (udp || c[3] == "0A")
            })
        })
    })
}

/// Waits until `server` listens on `port`; panics (with its output) if it
/// exits first or takes too long.
fn wait_listening(server: &mut Proc, port: u16, udp: bool) {
    let until = Instant::now() + LISTEN_WAIT;
    while !listening(port, udp) {
        if !server.running() || Instant::now() >= until {
            let why = if server.running() {
                "never listened"
            } else {
                "exited before listening"
            };
            let d = server.finish(Instant::now());
            panic!("{} {why} on port {port}:\n{}", d.label, d.describe());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Which ends run under the interposer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pairing {
    Both,
    ClientOnly,
    ServerOnly,
}

/// A server-side or a client-side process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Server,
    Client,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Server => "server",
            Side::Client => "client",
        }
    }
}

/// What a test's connections are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// TCP: over RC when both ends are interposed.
    Tcp,
    /// UDP: over UD when both ends are interposed.
    Udp,
    /// A TCP control connection and UDP data (iperf3 `-u`): RC and UD
    /// when both ends are interposed.
    TcpAndUdp,
}

/// One side's `SOFTRDMA_SOCKETS_REPORT` lines, summed.
#[derive(Debug, Default)]
struct Report {
    lines: Vec<String>,
    rc_conns: u64,
    kernel_conns: u64,
    rc_tx_bytes: u64,
    rc_rx_bytes: u64,
    ud_socks: u64,
    ud_tx_bytes: u64,
    ud_rx_bytes: u64,
}

/// Parses `pid=N rc_conns=N kernel_conns=N rc_tx_bytes=N rc_rx_bytes=N
/// ud_socks=N ud_tx_bytes=N ud_rx_bytes=N` lines (one per interposed
/// process that exited) and sums them.
fn parse_report(text: &str) -> Result<Report, String> {
    let mut r = Report::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut got = [None; 8];
        const KEYS: [&str; 8] = [
            "pid",
            "rc_conns",
            "kernel_conns",
            "rc_tx_bytes",
            "rc_rx_bytes",
            "ud_socks",
            "ud_tx_bytes",
            "ud_rx_bytes",
        ];
        for kv in line.split_whitespace() {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("report line {line:?}: {kv:?} is not key=value"))?;
            let v: u64 = v
                .parse()
                .map_err(|_| format!("report line {line:?}: {kv:?} is not a number"))?;
            if let Some(i) = KEYS.iter().position(|&x| x == k) {
                got[i] = Some(v);
            }
        }
        let [Some(_), Some(rc), Some(kern), Some(tx), Some(rx), Some(ud), Some(utx), Some(urx)] =
            got
        else {
            return Err(format!("report line {line:?} lacks one of {KEYS:?}"));
        };
        r.rc_conns += rc;
        r.kernel_conns += kern;
        r.rc_tx_bytes += tx;
        r.rc_rx_bytes += rx;
        r.ud_socks += ud;
        r.ud_tx_bytes += utx;
        r.ud_rx_bytes += urx;
        r.lines.push(line.to_string());
    }
    Ok(r)
}

/// What tshark found in a capture.
struct Dissected {
    file: PathBuf,
    frames: usize,
    /// Frames with TCP or UDP payload.
    payload: usize,
    /// Frames with a DDP/RDMAP header.
    ddp: usize,
    /// Datagrams to or from the server's UD QP port, and how many of them
    /// the softrdma datagram dissector decoded (`None`: no QP port known).
    ud: Option<(usize, usize)>,
}

impl std::fmt::Display for Dissected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "capture {}: {} frames, {} with payload, {} DDP/RDMAP",
            self.file.display(),
            self.frames,
            self.payload,
            self.ddp
        )?;
        if let Some((port, srdma)) = self.ud {
            write!(f, "; {port} on the QP port, {srdma} srdma")?;
        }
        Ok(())
    }
}

/// A running capture of the test's ports on `lo`.
struct Capture {
    tcpdump: Proc,
    file: PathBuf,
    /// The UDP port of the server socket's UD QP, once known
    /// ([`Case::ud_port`]).
    ud_port: Option<u16>,
    /// The program's ports: what the main dissection looks at.
    ports: Vec<u16>,
}

/// One test run: its pairing, its directory (registry, reports, data,
/// capture) and the checks that failed so far.
struct Case {
    name: String,
    pairing: Pairing,
    dir: PathBuf,
    registry: PathBuf,
    failures: Mutex<Vec<String>>,
}

impl Case {
    fn new(name: &str, pairing: Pairing) -> Case {
        use std::os::unix::fs::PermissionsExt;
        static N: AtomicUsize = AtomicUsize::new(0);
        softrdma();
        let dir = std::env::temp_dir().join(format!(
            "softrdma-sockets-test-{name}-{pairing:?}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("test directory");
        let perm = |p: &Path, mode| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
                .expect("chmod in the test directory")
        };
        // Servers that drop privileges (nginx's workers) still reach the
        // registry and their report file.
        perm(&dir, 0o755);
        let registry = dir.join("registry");
        std::fs::create_dir(&registry).expect("registry directory");
        perm(&registry, 0o1777);
        let case = Case {
            name: name.to_string(),
            pairing,
            dir,
            registry,
            failures: Mutex::new(Vec::new()),
        };
        for side in [Side::Server, Side::Client] {
            let p = case.report_path(side);
            File::create(&p).expect("report file");
            perm(&p, 0o666);
        }
        case
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn report_path(&self, side: Side) -> PathBuf {
        self.path(&format!("{}.report", side.name()))
    }

    fn interposed(&self, side: Side) -> bool {
        match self.pairing {
            Pairing::Both => true,
            Pairing::ClientOnly => side == Side::Client,
            Pairing::ServerOnly => side == Side::Server,
        }
    }

    /// `prog args`, under `softrdma run --sockets` when `side` is
    /// interposed; in the test's directory, with its registry and the
    /// side's report file, stdin from /dev/null, stdout and stderr piped.
    fn command(&self, side: Side, prog: &str, args: &[&str]) -> Command {
        need(prog);
        let mut c = if self.interposed(side) {
            let mut c = Command::new(softrdma());
            c.args(["run", "--sockets", "--", prog]);
            c
        } else {
            Command::new(prog)
        };
        c.args(args)
            .current_dir(&self.dir)
            .env("SOFTRDMA_SOCKETS_DIR", &self.registry)
            .env("SOFTRDMA_SOCKETS_REPORT", self.report_path(side))
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    fn label(&self, side: Side, prog: &str) -> String {
        format!(
            "{} {prog}{}",
            side.name(),
            if self.interposed(side) {
                " (interposed)"
            } else {
                " (plain)"
            }
        )
    }

    fn spawn(&self, side: Side, prog: &str, args: &[&str]) -> Proc {
        Proc::start(&self.label(side, prog), self.command(side, prog, args))
    }

    /// Runs a program to its end (or the deadline).
    fn run(&self, side: Side, prog: &str, args: &[&str]) -> Done {
        self.spawn(side, prog, args).wait(Instant::now() + DEADLINE)
    }

    /// Records a failed check (the test goes on, to show every failure).
    fn fail(&self, msg: String) {
        // The start of it here, as it happens; all of it when the test ends.
        let mut head = msg.len().min(2000);
        while !msg.is_char_boundary(head) {
            head -= 1;
        }
        eprintln!(
            "[{} {:?}] FAILED: {}",
            self.name,
            self.pairing,
            &msg[..head]
        );
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(msg);
    }

    fn check(&self, ok: bool, msg: impl FnOnce() -> String) -> bool {
        if !ok {
            self.fail(msg());
        }
        ok
    }

    /// Checks that a program exited 0 in time.
    fn check_ok(&self, d: &Done) -> bool {
        self.check(d.ok(), || format!("{} failed\n{}", d.label, d.describe()))
    }

    /// Checks that a server asked to stop did so in time, without crashing.
    fn check_stopped(&self, d: &Done) -> bool {
        self.check(d.stopped_cleanly(), || {
            format!("{} did not stop cleanly\n{}", d.label, d.describe())
        })
    }

    fn check_same_file(&self, want: &Path, got: &Path) {
        if let Err(e) = same_file(want, got) {
            self.fail(format!("data: {e}"));
        }
    }

    /// Checks the `SOFTRDMA_SOCKETS_REPORT` lines of both sides (module
    /// docs).
    fn check_reports(&self, transport: Transport) {
        for side in [Side::Server, Side::Client] {
            let who = side.name();
            let path = self.report_path(side);
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let r = match parse_report(&text) {
                Ok(r) => r,
                Err(e) => {
                    self.fail(format!("{who} report: {e}"));
                    continue;
                }
            };
            let shown = || format!("{who} report lines: {:?}", r.lines);
            if !self.interposed(side) {
                self.check(r.lines.is_empty(), || {
                    format!("the plain {who} loaded the interposer: {}", shown())
                });
                continue;
            }
            if !self.check(!r.lines.is_empty(), || {
                format!(
                    "the interposed {who} processes appended no line to \
                     SOFTRDMA_SOCKETS_REPORT ({}): the interposer did not run, or \
                     no process exited normally",
                    path.display()
                )
            }) {
                continue;
            }
            match (transport, self.pairing) {
                (Transport::Tcp, Pairing::Both) => {
                    self.check(r.rc_conns >= 1, || {
                        format!(
                            "both ends interposed, but the {who} carried no connection \
                             over RC: {}",
                            shown()
                        )
                    });
                    self.check(r.rc_tx_bytes + r.rc_rx_bytes > 0, || {
                        format!(
                            "both ends interposed, but the {who} moved no octet over RC: {}",
                            shown()
                        )
                    });
                }
                (Transport::Tcp, _) => {
                    self.check(r.rc_conns == 0, || {
                        format!("the peer is plain, yet the {who} used RC: {}", shown())
                    });
                    self.check(r.kernel_conns >= 1, || {
                        format!(
                            "the peer is plain, yet the {who} left no connection to the \
                             kernel: {}",
                            shown()
                        )
                    });
                }
                (Transport::TcpAndUdp, Pairing::Both) => {
                    self.check(r.rc_conns >= 1, || {
                        format!(
                            "both ends interposed, but the {who} carried no connection \
                             over RC: {}",
                            shown()
                        )
                    });
                    self.check(r.ud_tx_bytes + r.ud_rx_bytes > 0, || {
                        format!(
                            "both ends interposed, but the {who} moved no octet over UD: {}",
                            shown()
                        )
                    });
                }
                (Transport::TcpAndUdp, _) => {
                    self.check(
                        r.rc_conns == 0 && r.ud_tx_bytes + r.ud_rx_bytes == 0,
                        || {
                            format!(
                                "the peer is plain, yet the {who} used RC or UD: {}",
                                shown()
                            )
                        },
                    );
                }
                (Transport::Udp, pairing) => {
                    self.check(r.rc_conns == 0, || {
                        format!("UDP only, yet the {who} used RC: {}", shown())
                    });
                    if pairing == Pairing::Both {
                        self.check(r.ud_socks >= 1, || {
                            format!(
                                "both ends interposed, but the {who} gave no datagram socket \
                                 a UD QP: {}",
                                shown()
                            )
                        });
                        self.check(r.ud_tx_bytes + r.ud_rx_bytes > 0, || {
                            format!(
                                "both ends interposed, but the {who} moved no octet over UD: {}",
                                shown()
                            )
                        });
                    } else {
                        self.check(r.ud_tx_bytes + r.ud_rx_bytes == 0, || {
                            format!("the peer is plain, yet the {who} used UD: {}", shown())
                        });
                    }
                }
            }
        }
    }

    /// Starts `tcpdump -i lo` on `ports`; `None` (with a note) when
    /// tcpdump is not installed or may not capture.
    fn capture(&self, ports: &[u16]) -> Option<Capture> {
        self.capture_with_ud(ports, None)
    }

    /// [`Case::capture`] of `ports` and of `ud_port`, the UDP port of the
    /// server socket's UD QP ([`Case::ud_port`]), if known.
    fn capture_with_ud(&self, ports: &[u16], ud_port: Option<u16>) -> Option<Capture> {
        if !on_path("tcpdump") {
            eprintln!(
                "note: tcpdump is not installed; {} {:?} runs without the capture check \
                 (scripts/install-test-deps.sh installs it)",
                self.name, self.pairing
            );
            return None;
        }
        let file = self.path("capture.pcap");
        let filter = ports
            .iter()
            .chain(ud_port.iter())
            .map(|p| format!("port {p}"))
            .collect::<Vec<_>>()
            .join(" or ");
        let mut cmd = Command::new("tcpdump");
        // --immediate-mode: without it packets wait in the kernel's ring
        // block until it fills or times out, and a short run's packets are
        // lost when tcpdump is stopped.
        cmd.args([
            "-i",
            "lo",
            "-n",
            "-U",
            "--immediate-mode",
            "-s",
            CAPTURE_SNAPLEN,
            "-c",
            CAPTURE_PACKETS,
            "-w",
        ])
        .arg(&file)
        .arg(filter)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut p = Proc::start("tcpdump", cmd);
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            if p.err().contains("listening on") {
                return Some(Capture {
                    tcpdump: p,
                    file,
                    ud_port,
                    ports: ports.to_vec(),
                });
            }
            if !p.running() || Instant::now() >= until {
                let d = p.finish(Instant::now());
                if d.stderr.contains("ermission") || d.stderr.contains("not permitted") {
                    eprintln!(
                        "note: tcpdump may not capture here ({}); {} {:?} runs without \
                         the capture check",
                        d.stderr.trim(),
                        self.name,
                        self.pairing
                    );
                } else {
                    self.fail(format!("tcpdump did not start\n{}", d.describe()));
                }
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The UDP port of the UD QP behind the interposed server socket on
    /// `port` (its registry entry `udp-ADDR-PORT` holds `NETNS PID
    /// QP_PORT QPN TRANSPORT`); `None` when the server is not interposed.
    /// A server interposed whose entry never shows is a failure.
    fn ud_port(&self, port: u16) -> Option<u16> {
        if self.pairing == Pairing::ClientOnly {
            return None;
        }
        let until = Instant::now() + Duration::from_secs(10);
        let suffix = format!("-{port}");
        loop {
            let found = std::fs::read_dir(&self.registry).ok().and_then(|d| {
                d.flatten().find_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if !(name.starts_with("udp-") && name.ends_with(&suffix)) {
                        return None;
                    }
                    let text = std::fs::read_to_string(e.path()).ok()?;
                    text.split_whitespace().nth(2)?.parse::<u16>().ok()
                })
            });
            if found.is_some() {
                return found;
            }
            if Instant::now() >= until {
                self.fail(format!(
                    "the interposed server's UDP socket on port {port} has no registry entry in {}",
                    self.registry.display()
                ));
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Counts the datagrams of `file` to or from `ud_port` and those the
    /// repository's softrdma datagram dissector decodes.
    fn dissect_ud(&self, file: &Path, ud_port: u16) -> Option<(usize, usize)> {
        let lua =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/wireshark/softrdma_dgram.lua");
        let mut cmd = Command::new("tshark");
        cmd.arg("-n")
            .arg("-X")
            .arg(format!("lua_script:{}", lua.display()))
            // By port, not by heuristic: the heuristic wants a whole
            // datagram (its CRC) before it claims a flow, and the capture
            // keeps only the first CAPTURE_SNAPLEN octets of each.
            .args(["-o", &format!("srdma.ports:{ud_port}")])
            .arg("-r")
            .arg(file)
            .args(["-Y", &format!("udp.port == {ud_port}")])
            .args(["-T", "fields", "-e", "frame.protocols"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let t = Proc::start("tshark (srdma)", cmd).wait(Instant::now() + Duration::from_secs(180));
        if !self.check_ok(&t) {
            return None;
        }
        let text = t.text();
        let lines = text.lines().filter(|l| !l.trim().is_empty());
        let (mut all, mut srdma) = (0, 0);
        for l in lines {
            all += 1;
            if l.split(':').any(|p| p == "srdma") {
                srdma += 1;
            }
        }
        Some((all, srdma))
    }

    /// Stops the capture and counts what tshark finds in it; `None` when
    /// that failed (recorded) or tshark is missing and allowed to be.
    fn dissect(&self, cap: Capture) -> Option<Dissected> {
        // Let the last segments reach the capture.
        std::thread::sleep(Duration::from_millis(200));
        let d = cap.tcpdump.stop(libc::SIGINT);
        if !self.check(d.stopped_cleanly(), || {
            format!("tcpdump did not stop\n{}", d.describe())
        }) {
            return None;
        }
        if !on_path("tshark") {
            if std::env::var("SOFTRDMA_SKIP_TSHARK").is_ok_and(|v| v == "1") {
                eprintln!(
                    "note: tshark is not installed (SOFTRDMA_SKIP_TSHARK=1): capture not dissected"
                );
                return None;
            }
            self.fail(
                "tshark not found on PATH; install it with scripts/install-test-deps.sh \
                 (or set SOFTRDMA_SKIP_TSHARK=1)"
                    .into(),
            );
            return None;
        }
        let only_ports = cap
            .ports
            .iter()
            .map(|p| format!("tcp.port == {p} || udp.port == {p}"))
            .collect::<Vec<_>>()
            .join(" || ");
        let mut cmd = Command::new("tshark");
        cmd.args(TSHARK_BASE_ARGS)
            .arg("-r")
            .arg(&cap.file)
            .args(["-Y", &only_ports])
            .args(["-T", "fields", "-E", "separator=;"])
            .args(["-e", "tcp.len", "-e", "udp.length", "-e", "frame.protocols"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let t = Proc::start("tshark", cmd).wait(Instant::now() + Duration::from_secs(180));
        if !self.check_ok(&t) {
            return None;
        }
        let ud = match cap.ud_port {
            Some(p) => Some(self.dissect_ud(&cap.file, p)?),
            None => None,
        };
        let mut n = Dissected {
            file: cap.file,
            frames: 0,
            payload: 0,
            ddp: 0,
            ud,
        };
        for line in t.text().lines() {
            let f: Vec<&str> = line.split(';').collect();
            if f.len() < 3 {
                continue;
            }
            n.frames += 1;
            let len = |s: &str| s.split(',').next().and_then(|v| v.parse::<u64>().ok());
            // udp.length counts its 8-octet header.
            if len(f[0]).is_some_and(|l| l > 0) || len(f[1]).is_some_and(|l| l > 8) {
                n.payload += 1;
            }
            if f[2].split(':').any(|p| p == "iwarp_ddp_rdmap") {
                n.ddp += 1;
            }
        }
        eprintln!("[{} {:?}] {n}", self.name, self.pairing);
        Some(n)
    }

    /// Stops the capture and checks what tshark finds in it: DDP/RDMAP
    /// frames when both ends carry TCP over RC; when both carry UDP over
    /// UD, nothing at all on the program's ports (UD has ports of its
    /// own); otherwise no DDP/RDMAP but payload, so the capture saw the
    /// run. When the server's QP port is known: both interposed, it
    /// carried datagrams and every one is `srdma`; otherwise none is.
    fn check_capture(&self, cap: Option<Capture>, transport: Transport) {
        let Some(n) = cap.and_then(|c| self.dissect(c)) else {
            return;
        };
        if let Some((all, srdma)) = n.ud {
            if self.pairing == Pairing::Both {
                self.check(all > 0 && srdma == all, || {
                    format!(
                        "both ends interposed: the QP port should carry only srdma datagrams: {n}"
                    )
                });
            } else {
                self.check(srdma == 0, || {
                    format!("one end plain, yet srdma datagrams on the QP port: {n}")
                });
            }
        }
        if transport != Transport::Udp && self.pairing == Pairing::Both {
            self.check(n.ddp > 0, || {
                format!("both ends interposed, yet no DDP/RDMAP frame: {n}")
            });
        } else if self.pairing == Pairing::Both {
            self.check(n.payload == 0, || {
                format!(
                    "both ends interposed, yet datagrams on the program's own port \
                     (the kernel's, not UD's): {n}"
                )
            });
        } else {
            self.check(n.payload > 0, || {
                format!("the capture saw no payload of the run: {n}")
            });
            self.check(n.ddp == 0, || {
                format!("a plain (or UDP) run, yet DDP/RDMAP frames: {n}")
            });
        }
    }

    /// Panics with every failed check, if any.
    fn finish(self) {
        let f = self
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if !f.is_empty() {
            panic!(
                "{} ({:?}): {} check(s) failed (files kept in {}):\n\n{}",
                self.name,
                self.pairing,
                f.len(),
                self.dir.display(),
                f.join("\n\n")
            );
        }
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        let failed = !self
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if failed || std::thread::panicking() {
            // Kept for a look, without the bulk data (the capture stays).
            if let Ok(entries) = std::fs::read_dir(&self.dir) {
                for e in entries.flatten() {
                    let big = e
                        .metadata()
                        .is_ok_and(|m| m.is_file() && m.len() > 16 << 20);
                    if big && e.file_name() != "capture.pcap" {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
            eprintln!("kept {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One `#[test]` per pairing for each scenario function.
macro_rules! pairings {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn both() {
                super::$name(super::Pairing::Both)
            }
            #[test]
            fn client_only() {
                super::$name(super::Pairing::ClientOnly)
            }
            #[test]
            fn server_only() {
                super::$name(super::Pairing::ServerOnly)
            }
        }
    )*};
}

pairings!(
    socat_file,
    socat_echo,
    nc_half_close,
    redis_benchmark,
    redis_cli,
    iperf3,
    iperf3_udp,
    nginx,
    memcached,
    memcached_udp,
    sockperf_tcp,
    sockperf_iomux,
    sockperf_udp,
);

// ------------------------------------------------------------------
// The programs
// ------------------------------------------------------------------

/// socat moves a 100 MiB file one way (`-u`); the copy must be exact.
fn socat_file(p: Pairing) {
    let case = Case::new("socat_file", p);
    let port = free_tcp_port();
    let (input, output) = (case.path("in"), case.path("out"));
    std::fs::write(&input, random_bytes(100 << 20, 0x5eed_0001)).expect("input file");
    let cap = case.capture(&[port]);
    let mut server = case.spawn(
        Side::Server,
        "socat",
        &[
            "-u",
            &format!("TCP-LISTEN:{port},reuseaddr,bind=127.0.0.1"),
            &format!("OPEN:{},creat", output.display()),
        ],
    );
    wait_listening(&mut server, port, false);
    let client = case.run(
        Side::Client,
        "socat",
        &[
            "-u",
            &format!("OPEN:{}", input.display()),
            &format!("TCP:127.0.0.1:{port}"),
        ],
    );
    case.check_ok(&client);
    let server = server.wait(Instant::now() + DEADLINE);
    case.check_ok(&server);
    case.check_same_file(&input, &output);
    case.check_reports(Transport::Tcp);
    case.check_capture(cap, Transport::Tcp);
    case.finish();
}

/// A forking socat echo server (`EXEC:cat` per connection) and two
/// clients in turn, each sending 2 MiB and reading it back.
fn socat_echo(p: Pairing) {
    let case = Case::new("socat_echo", p);
    let port = free_tcp_port();
    let cap = case.capture(&[port]);
    let mut server = case.spawn(
        Side::Server,
        "socat",
        &[
            &format!("TCP-LISTEN:{port},fork,reuseaddr,bind=127.0.0.1"),
            "EXEC:cat",
        ],
    );
    wait_listening(&mut server, port, false);
    for i in 0..2u64 {
        let (sent, echoed) = (
            case.path(&format!("sent{i}")),
            case.path(&format!("echo{i}")),
        );
        std::fs::write(&sent, random_bytes(2 << 20, 0xec40 + i)).expect("data file");
        let mut cmd = case.command(
            Side::Client,
            "socat",
            // Wait up to 30 s for the echo after our EOF (default 0.5 s).
            &["-t", "30", "-", &format!("TCP:127.0.0.1:{port}")],
        );
        cmd.stdin(File::open(&sent).expect("data file"))
            .stdout(File::create(&echoed).expect("echo file"));
        let client =
            Proc::start(&case.label(Side::Client, "socat"), cmd).wait(Instant::now() + DEADLINE);
        case.check_ok(&client);
        case.check_same_file(&sent, &echoed);
    }
    let server = server.stop(libc::SIGTERM);
    case.check_stopped(&server);
    case.check_reports(Transport::Tcp);
    case.check_capture(cap, Transport::Tcp);
    case.finish();
}

/// OpenBSD nc with a half-close: the client sends 8 MiB and shuts its
/// sending side (`-N`) while the server's 256 KiB reply still comes back;
/// the server ends at that end of stream, the client when the server
/// closes.
fn nc_half_close(p: Pairing) {
    let case = Case::new("nc_half_close", p);
    let port = free_tcp_port();
    let (data, got_data) = (case.path("data"), case.path("got-data"));
    let (reply, got_reply) = (case.path("reply"), case.path("got-reply"));
    std::fs::write(&data, random_bytes(8 << 20, 0x0c01)).expect("data file");
    std::fs::write(&reply, random_bytes(256 << 10, 0x0c02)).expect("reply file");
    let cap = case.capture(&[port]);
    let mut cmd = case.command(Side::Server, "nc", &["-l", "127.0.0.1", &port.to_string()]);
    cmd.stdin(File::open(&reply).expect("reply"))
        .stdout(File::create(&got_data).expect("out"));
    let mut server = Proc::start(&case.label(Side::Server, "nc"), cmd);
    wait_listening(&mut server, port, false);
    let mut cmd = case.command(Side::Client, "nc", &["-N", "127.0.0.1", &port.to_string()]);
    cmd.stdin(File::open(&data).expect("data"))
        .stdout(File::create(&got_reply).expect("out"));
    let client = Proc::start(&case.label(Side::Client, "nc"), cmd).wait(Instant::now() + DEADLINE);
    case.check_ok(&client);
    let server = server.wait(Instant::now() + DEADLINE);
    case.check_ok(&server);
    case.check_same_file(&data, &got_data);
    case.check_same_file(&reply, &got_reply);
    case.check_reports(Transport::Tcp);
    case.check_capture(cap, Transport::Tcp);
    case.finish();
}

/// Starts `redis-server` on `port` with its files in the test directory.
fn redis_server(case: &Case, port: u16) -> Proc {
    let dir = case.path("redis");
    std::fs::create_dir_all(&dir).expect("redis dir");
    let mut server = case.spawn(
        Side::Server,
        "redis-server",
        &[
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir.to_string_lossy(),
        ],
    );
    wait_listening(&mut server, port, false);
    server
}

/// redis-benchmark's PING, SET, GET, LPUSH and LRANGE_100 (50 connections):
/// every test reports a rate.
fn redis_benchmark(p: Pairing) {
    let case = Case::new("redis_benchmark", p);
    let port = free_tcp_port();
    let cap = case.capture(&[port]);
    let server = redis_server(&case, port);
    let bench = case.run(
        Side::Client,
        "redis-benchmark",
        &[
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            "ping,set,get,lpush,lrange_100",
            "-n",
            "2000",
            "-q",
        ],
    );
    if case.check_ok(&bench) {
        let text = bench.text();
        let segments: Vec<&str> = text.split(['\r', '\n']).map(str::trim).collect();
        for test in [
            "PING_INLINE",
            "PING_MBULK",
            "SET",
            "GET",
            "LPUSH",
            "LRANGE_100",
        ] {
            let rate = segments.iter().find_map(|s| {
                let rest = s
                    .strip_prefix(test)
                    .filter(|r| r.starts_with(':') || r.starts_with(" ("))?;
                let (_, after) = rest.split_once(": ")?;
                let (n, _) = after.split_once(" requests per second")?;
                n.trim().parse::<f64>().ok()
            });
            case.check(rate.is_some_and(|r| r > 0.0), || {
                format!("redis-benchmark: no rate for {test}:\n{text}")
            });
        }
    }
    let server = server.stop(libc::SIGTERM);
    case.check_ok(&server);
    case.check_reports(Transport::Tcp);
    case.check_capture(cap, Transport::Tcp);
    case.finish();
}

/// redis-cli: a 1 MiB binary value set (`-x`) and read back exactly; then
/// BGSAVE (redis forks, its child inherits every connection) while a
/// redis-cli stays connected, which must keep its connection (same client
/// id) and get a 32 KiB value (16 KiB in hex) back after the save.
fn redis_cli(p: Pairing) {
    let case = Case::new("redis_cli", p);
    let port = free_tcp_port();
    let ps = port.to_string();
    let cap = case.capture(&[port]);
    let server = redis_server(&case, port);
    let cli = |args: &[&str]| {
        let mut a = vec!["-h", "127.0.0.1", "-p", &ps];
        a.extend_from_slice(args);
        case.run(Side::Client, "redis-cli", &a)
    };

    let value = case.path("value");
    let big = random_bytes(1 << 20, 0x4ed1);
    std::fs::write(&value, &big).expect("value file");
    let mut cmd = case.command(Side::Client, "redis-cli", &["-p", &ps, "-x", "SET", "big"]);
    cmd.stdin(File::open(&value).expect("value file"));
    let set = Proc::start(&case.label(Side::Client, "redis-cli -x SET"), cmd)
        .wait(Instant::now() + DEADLINE);
    if case.check_ok(&set) {
        case.check(set.text().trim() == "OK", || {
            format!("SET big: {}", set.describe())
        });
    }
    let get = cli(&["GET", "big"]);
    if case.check_ok(&get) {
        let mut want = big.clone();
        want.push(b'\n');
        if let Err(e) = same_bytes(&want, &get.stdout) {
            case.fail(format!("GET big: the value read back {e}"));
        }
    }

    // A client that stays connected across the BGSAVE.
    let mut cmd = case.command(Side::Client, "redis-cli", &["-h", "127.0.0.1", "-p", &ps]);
    cmd.stdin(Stdio::piped());
    let mut held = Proc::start(&case.label(Side::Client, "redis-cli (held)"), cmd);
    let small: String = random_bytes(16 << 10, 0x5a11)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let until = Instant::now() + DEADLINE;
    if let Err(e) = held.write_stdin(format!("CLIENT ID\nSET small {small}\n").as_bytes(), until) {
        case.fail(format!("the held redis-cli: {e}"));
    }
    let before_ok = held.wait_output(b"OK\n", 0, until);
    let id_before = String::from_utf8_lossy(&held.out())
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    case.check(before_ok && id_before.parse::<u64>().is_ok(), || {
        format!(
            "the held redis-cli: no client id and OK before BGSAVE; output {:?}, stderr {}",
            tail(&String::from_utf8_lossy(&held.out()), 500),
            held.err()
        )
    });

    let bg = cli(&["BGSAVE"]);
    if case.check_ok(&bg) {
        case.check(bg.text().contains("Background saving started"), || {
            format!("BGSAVE: {}", bg.describe())
        });
    }
    let mut saved = false;
    let mut last = String::new();
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        let info = cli(&["INFO", "persistence"]);
        last = info.describe();
        let t = info.text();
        if !info.ok() {
            break;
        }
        if t.contains("rdb_bgsave_in_progress:0") && t.contains("rdb_last_bgsave_status:ok") {
            saved = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    case.check(saved, || format!("BGSAVE did not complete: {last}"));
    let dump = case.path("redis/dump.rdb");
    case.check(
        std::fs::metadata(&dump).is_ok_and(|m| m.len() > 1 << 20),
        || format!("{} missing or smaller than the 1 MiB value", dump.display()),
    );

    // The held connection still works, and is the same connection.
    let from = held.out().len();
    let until = Instant::now() + DEADLINE;
    if let Err(e) = held.write_stdin(b"CLIENT ID\nGET small\nPING\n", until) {
        case.fail(format!("the held redis-cli: {e}"));
    }
    let after_ok = held.wait_output(b"PONG\n", from, until);
    let out = held.out();
    let after = String::from_utf8_lossy(&out[from..]).into_owned();
    let lines: Vec<&str> = after.lines().collect();
    case.check(
        after_ok && lines.len() == 3 && lines[0] == id_before && lines[1] == small,
        || {
            format!(
                "the held redis-cli after BGSAVE: want client id {id_before}, the 32 KiB \
                 value, PONG; got {} lines: {:?}",
                lines.len(),
                lines.iter().map(|l| tail(l, 80)).collect::<Vec<_>>()
            )
        },
    );
    held.close_stdin();
    let held = held.wait(Instant::now() + DEADLINE);
    case.check_ok(&held);

    let server = server.stop(libc::SIGTERM);
    case.check_ok(&server);
    case.check_reports(Transport::Tcp);
    case.check_capture(cap, Transport::Tcp);
    case.finish();
}

/// iperf3 one-off servers (`-s -1`) for a 2 s test each way and one with
/// 4 parallel streams; the client's JSON must show octets sent and
/// received.
fn iperf3(p: Pairing) {
    let case = Case::new("iperf3", p);
    let port = free_tcp_port();
    let ps = port.to_string();
    let cap = case.capture(&[port]);
    for mode in [&[][..], &["-R"][..], &["-P", "4"][..]] {
        let mut server = case.spawn(
            Side::Server,
            "iperf3",
            &["-s", "-1", "-B", "127.0.0.1", "-p", &ps],
        );
        wait_listening(&mut server, port, false);
        let mut args = vec!["-c", "127.0.0.1", "-p", &ps, "-t", "2", "--json"];
        args.extend_from_slice(mode);
        let client = case.run(Side::Client, "iperf3", &args);
        if case.check_ok(&client) {
            match serde_json::from_slice::<serde_json::Value>(&client.stdout) {
                Ok(j) => {
                    let end = &j["end"];
                    for k in ["sum_sent", "sum_received"] {
                        let b = end[k]["bytes"].as_f64().unwrap_or(0.0);
                        case.check(b > 0.0, || {
                            format!("iperf3 {mode:?}: end.{k}.bytes = {b}:\n{}", client.text())
                        });
                    }
                    if mode == ["-P", "4"] {
                        let n = end["streams"].as_array().map_or(0, Vec::len);
                        case.check(n == 4, || format!("iperf3 -P 4: {n} streams"));
                    }
                    if mode == ["-R"] {
                        case.check(j["start"]["test_start"]["reverse"] == 1, || {
                            "iperf3 -R: the test was not reversed".into()
                        });
                    }
                }
                Err(e) => case.fail(format!(
                    "iperf3 {mode:?}: bad JSON ({e}): {}",
                    client.text()
                )),
            }
        }
        let server = server.wait(Instant::now() + DEADLINE);
        case.check_ok(&server);
    }
    case.check_reports(Transport::Tcp);
    case.check_capture(cap, Transport::Tcp);
    case.finish();
}

/// iperf3 over UDP (`-u -b 1G -l 1400`, 2 s): the control connection is
/// TCP, the data UDP datagrams; the client's JSON must show datagrams
/// sent and the server's report datagrams received (loss is UDP's, so
/// only its bound is checked: some arrived).
fn iperf3_udp(p: Pairing) {
    let case = Case::new("iperf3_udp", p);
    let port = free_port(true);
    let ps = port.to_string();
    let cap = case.capture(&[port]);
    let mut server = case.spawn(
        Side::Server,
        "iperf3",
        &["-s", "-1", "-B", "127.0.0.1", "-p", &ps],
    );
    wait_listening(&mut server, port, false);
    let client = case.run(
        Side::Client,
        "iperf3",
        &[
            "-c",
            "127.0.0.1",
            "-p",
            &ps,
            "-u",
            "-b",
            "1G",
            "-l",
            "1400",
            "-t",
            "2",
            "--json",
        ],
    );
    if case.check_ok(&client) {
        match serde_json::from_slice::<serde_json::Value>(&client.stdout) {
            Ok(j) => {
                let sum = &j["end"]["sum"];
                let (bytes, packets, lost) = (
                    sum["bytes"].as_f64().unwrap_or(0.0),
                    sum["packets"].as_f64().unwrap_or(0.0),
                    sum["lost_packets"].as_f64().unwrap_or(f64::MAX),
                );
                case.check(bytes > 0.0 && packets > 0.0, || {
                    format!("iperf3 -u: end.sum bytes {bytes}, packets {packets}")
                });
                case.check(lost < packets, || {
                    format!("iperf3 -u: every datagram lost ({lost} of {packets})")
                });
            }
            Err(e) => case.fail(format!("iperf3 -u: bad JSON ({e}): {}", client.text())),
        }
    }
    let server = server.wait(Instant::now() + DEADLINE);
    case.check_ok(&server);
    case.check_reports(Transport::TcpAndUdp);
    case.check_capture(cap, Transport::TcpAndUdp);
    case.finish();
}

/// memcached over UDP (`memcaslap -U`, which wants the TCP and UDP ports
/// equal): gets and sets for 2 s, every get a hit.
fn memcached_udp(p: Pairing) {
    let case = Case::new("memcached_udp", p);
    let port = free_port(true);
    let ps = port.to_string();
    let mut args = vec!["-p", &ps, "-U", &ps, "-l", "127.0.0.1"];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        args.extend_from_slice(&["-u", "root"]);
    }
    let mut server = case.spawn(Side::Server, "memcached", &args);
    wait_listening(&mut server, port, true);
    // The capture starts once the server is up (no traffic before the
    // client), so it can name the server's QP port.
    let cap = case.capture_with_ud(&[port], case.ud_port(port));
    let slap = case.run(
        Side::Client,
        "memcaslap",
        &["-s", &format!("127.0.0.1:{port}"), "-U", "-t", "2s"],
    );
    if case.check_ok(&slap) {
        let t = slap.all_text();
        let num = |key: &str| {
            t.lines()
                .find_map(|l| l.trim().strip_prefix(key)?.trim().parse::<u64>().ok())
        };
        let (gets, misses) = (num("cmd_get:"), num("get_misses:"));
        case.check(
            matches!((gets, misses), (Some(g), Some(m)) if g > 0 && m < g),
            || format!("memcaslap -U: no get hit (cmd_get {gets:?}, get_misses {misses:?}):\n{t}"),
        );
    }
    let server = server.stop(libc::SIGTERM);
    case.check_stopped(&server);
    case.check_reports(Transport::Udp);
    case.check_capture(cap, Transport::Udp);
    case.finish();
}

/// nginx (a master, two workers, sendfile) serves a 10 MiB file to curl,
/// compared byte-exact, then a small page to `wrk -t2 -c10 -d2s`, which
/// must complete requests without socket errors or error statuses.
fn nginx(p: Pairing) {
    let case = Case::new("nginx", p);
    let port = free_tcp_port();
    let d = case.dir.display().to_string();
    let www = case.path("www");
    std::fs::create_dir_all(&www).expect("www");
    std::fs::create_dir_all(case.path("temp")).expect("temp");
    let big = www.join("big.bin");
    std::fs::write(&big, random_bytes(10 << 20, 0x6e61)).expect("big.bin");
    std::fs::write(www.join("index.html"), "softrdma\n".repeat(400)).expect("index");
    // The temporary directories of the modules this nginx has (a directive
    // of a module it lacks would be an error).
    let v = Proc::start("nginx -V", {
        let mut c = Command::new("nginx");
        c.arg("-V")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    })
    .wait(Instant::now() + DEADLINE);
    let mut temps = String::new();
    for (flag, directive, sub) in [
        (
            "--http-client-body-temp-path",
            "client_body_temp_path",
            "body",
        ),
        ("--http-proxy-temp-path", "proxy_temp_path", "proxy"),
        ("--http-fastcgi-temp-path", "fastcgi_temp_path", "fastcgi"),
        ("--http-uwsgi-temp-path", "uwsgi_temp_path", "uwsgi"),
        ("--http-scgi-temp-path", "scgi_temp_path", "scgi"),
    ] {
        if v.all_text().contains(flag) {
            temps.push_str(&format!("    {directive} {d}/temp/{sub};\n"));
        }
    }
    let conf = case.path("nginx.conf");
    // nginx empties its workers' environment but for the variables `env`
    // names: the report file is the test's, so it is passed on. The
    // interposer's own settings (SOFTRDMA_SOCKETS_DIR) are not: it must
    // keep what it read when loaded in the master.
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process on;\nworker_processes 2;\npid {d}/nginx.pid;\n\
             env SOFTRDMA_SOCKETS_REPORT;\n\
             error_log {d}/error.log notice;\n\
             events {{\n    worker_connections 1024;\n}}\n\
             http {{\n    access_log {d}/access.log;\n    sendfile on;\n{temps}\
             \x20   server {{\n        listen 127.0.0.1:{port};\n        root {d}/www;\n    }}\n}}\n"
        ),
    )
    .expect("nginx.conf");
    let cap = case.capture(&[port]);
    let mut server = case.spawn(
        Side::Server,
        "nginx",
        &[
            "-p",
            &d,
            "-e",
            &format!("{d}/error.log"),
            "-c",
            &conf.to_string_lossy(),
        ],
    );
    wait_listening(&mut server, port, false);

    let got = case.path("got.bin");
    let curl = case.run(
        Side::Client,
        "curl",
        &[
            "-sS",
            "--fail",
            "--max-time",
            "50",
            "-o",
            &got.to_string_lossy(),
            &format!("http://127.0.0.1:{port}/big.bin"),
        ],
    );
    if case.check_ok(&curl) {
        case.check_same_file(&big, &got);
    }
    let wrk = case.run(
        Side::Client,
        "wrk",
        &[
            "-t2",
            "-c10",
            "-d2s",
            &format!("http://127.0.0.1:{port}/index.html"),
        ],
    );
    if case.check_ok(&wrk) {
        let t = wrk.text();
        let requests = t.lines().find_map(|l| {
            let (n, _) = l.trim().split_once(" requests in ")?;
            n.parse::<u64>().ok()
        });
        case.check(requests.is_some_and(|n| n > 0), || {
            format!("wrk completed no request:\n{t}")
        });
        case.check(!t.contains("Socket errors"), || {
            format!("wrk saw socket errors:\n{t}")
        });
        case.check(!t.contains("Non-2xx"), || {
            format!("wrk saw error statuses:\n{t}")
        });
    }
    let server = server.stop(libc::SIGTERM);
    case.check_ok(&server);
    let log = std::fs::read_to_string(case.path("error.log")).unwrap_or_default();
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["[alert]", "[crit]", "[emerg]"]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect();
    case.check(bad.is_empty(), || {
        format!(
            "nginx's error.log has {} alert/crit/emerg lines; the first:\n{}",
            bad.len(),
            bad.iter().take(5).copied().collect::<Vec<_>>().join("\n")
        )
    });
    case.check_reports(Transport::Tcp);
    case.check_capture(cap, Transport::Tcp);
    case.finish();
}

/// memcached on TCP (and a UDP port): memccp/memccat of a 512 KiB value,
/// compared byte-exact, then memcaslap for 2 s (16 connections), which
/// must get hits.
fn memcached(p: Pairing) {
    let case = Case::new("memcached", p);
    let port = free_tcp_port();
    let udp = free_port(true);
    let servers = format!("--servers=127.0.0.1:{port}");
    let cap = case.capture(&[port, udp]);
    let (ps, us) = (port.to_string(), udp.to_string());
    let mut args = vec!["-p", &ps, "-U", &us, "-l", "127.0.0.1"];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // memcached refuses to run as root without naming a user.
        args.extend_from_slice(&["-u", "root"]);
    }
    let mut server = case.spawn(Side::Server, "memcached", &args);
    wait_listening(&mut server, port, false);

    let value = random_bytes(512 << 10, 0x3e3c);
    std::fs::write(case.path("value.bin"), &value).expect("value file");
    let cp = case.run(Side::Client, "memccp", &[&servers, "value.bin"]);
    case.check_ok(&cp);
    let cat = case.run(Side::Client, "memccat", &[&servers, "value.bin"]);
    if case.check_ok(&cat) {
        let mut want = value.clone();
        want.push(b'\n');
        if let Err(e) = same_bytes(&want, &cat.stdout) {
            case.fail(format!("memccat value.bin: the value read back {e}"));
        }
    }
    let slap = case.run(
        Side::Client,
        "memcaslap",
        &["-s", &format!("127.0.0.1:{port}"), "-t", "2s"],
    );
    if case.check_ok(&slap) {
        let t = slap.all_text();
        let num = |key: &str| {
            t.lines()
                .find_map(|l| l.trim().strip_prefix(key)?.trim().parse::<u64>().ok())
        };
        let (gets, misses) = (num("cmd_get:"), num("get_misses:"));
        case.check(
            matches!((gets, misses), (Some(g), Some(m)) if g > 0 && m < g),
            || format!("memcaslap: no get hit (cmd_get {gets:?}, get_misses {misses:?}):\n{t}"),
        );
    }
    let server = server.stop(libc::SIGTERM);
    case.check_stopped(&server);
    case.check_reports(Transport::Tcp);
    case.check_capture(cap, Transport::Tcp);
    case.finish();
}

/// Checks a sockperf ping-pong client's result: messages came back, none
/// dropped, a latency.
fn check_sockperf_pp(case: &Case, d: &Done, udp: bool) {
    if !case.check_ok(d) {
        return;
    }
    let t = d.all_text();
    let received = t.lines().find_map(|l| {
        let (_, r) = l.split_once("ReceivedMessages=")?;
        r.trim().parse::<u64>().ok()
    });
    case.check(received.is_some_and(|n| n > 0), || {
        format!("sockperf pp received nothing:\n{t}")
    });
    case.check(t.contains("avg-latency="), || {
        format!("sockperf pp reports no latency:\n{t}")
    });
    if !udp {
        case.check(t.contains("# dropped messages = 0;"), || {
            format!("sockperf pp over TCP dropped messages:\n{t}")
        });
    }
}

/// sockperf over TCP: a server; a 2 s ping-pong and a 2 s throughput
/// client.
fn sockperf_tcp(p: Pairing) {
    let case = Case::new("sockperf_tcp", p);
    let port = free_tcp_port();
    let ps = port.to_string();
    let cap = case.capture(&[port]);
    let mut server = case.spawn(
        Side::Server,
        "sockperf",
        &["sr", "--tcp", "-i", "127.0.0.1", "-p", &ps],
    );
    wait_listening(&mut server, port, false);
    let pp = case.run(
        Side::Client,
        "sockperf",
        &["pp", "--tcp", "-i", "127.0.0.1", "-p", &ps, "-t", "2"],
    );
    check_sockperf_pp(&case, &pp, false);
    let tp = case.run(
        Side::Client,
        "sockperf",
        &["tp", "--tcp", "-i", "127.0.0.1", "-p", &ps, "-t", "2"],
    );
    if case.check_ok(&tp) {
        let t = tp.all_text();
        let rate = t.lines().find_map(|l| {
            let (_, r) = l.split_once("Message Rate is ")?;
            r.split_whitespace().next()?.parse::<u64>().ok()
        });
        case.check(rate.is_some_and(|r| r > 0), || {
            format!("sockperf tp: no message rate:\n{t}")
        });
    }
    let server = server.stop(libc::SIGINT);
    case.check_stopped(&server);
    case.check_reports(Transport::Tcp);
    case.check_capture(cap, Transport::Tcp);
    case.finish();
}

/// sockperf over TCP with select, poll and epoll (`-F`, which sockperf
/// takes only with a feed file of addresses): for each a server and a 1 s
/// ping-pong client, both blocking in that call.
fn sockperf_iomux(p: Pairing) {
    let case = Case::new("sockperf_iomux", p);
    let ports = [free_tcp_port(), free_tcp_port(), free_tcp_port()];
    let cap = case.capture(&ports);
    for (port, (mux, call)) in
        ports
            .iter()
            .zip([("s", "select()"), ("p", "poll()"), ("e", "epoll()")])
    {
        let feed = format!("feed-{mux}.txt");
        std::fs::write(case.path(&feed), format!("T:127.0.0.1:{port}\n")).expect("feed file");
        let mut server = case.spawn(Side::Server, "sockperf", &["sr", "-f", &feed, "-F", mux]);
        wait_listening(&mut server, *port, false);
        let pp = case.run(
            Side::Client,
            "sockperf",
            &["pp", "-f", &feed, "-F", mux, "-t", "1"],
        );
        check_sockperf_pp(&case, &pp, false);
        let used = format!("using {call} to block");
        case.check(pp.all_text().contains(&used), || {
            format!(
                "sockperf pp -F {mux} does not say {used:?}:\n{}",
                pp.all_text()
            )
        });
        let server = server.stop(libc::SIGINT);
        case.check_stopped(&server);
        case.check(server.all_text().contains(&used), || {
            format!(
                "sockperf sr -F {mux} does not say {used:?}:\n{}",
                server.all_text()
            )
        });
    }
    case.check_reports(Transport::Tcp);
    case.check_capture(cap, Transport::Tcp);
    case.finish();
}

/// sockperf over UDP: a 1 s ping-pong, over UD when both ends are
/// interposed.
fn sockperf_udp(p: Pairing) {
    let case = Case::new("sockperf_udp", p);
    let port = free_port(true);
    let ps = port.to_string();
    let mut server = case.spawn(
        Side::Server,
        "sockperf",
        &["sr", "-i", "127.0.0.1", "-p", &ps],
    );
    wait_listening(&mut server, port, true);
    let cap = case.capture_with_ud(&[port], case.ud_port(port));
    let pp = case.run(
        Side::Client,
        "sockperf",
        &["pp", "-i", "127.0.0.1", "-p", &ps, "-t", "1"],
    );
    check_sockperf_pp(&case, &pp, true);
    let server = server.stop(libc::SIGINT);
    case.check_stopped(&server);
    case.check_reports(Transport::Udp);
    case.check_capture(cap, Transport::Udp);
    case.finish();
}

// ------------------------------------------------------------------
// softrdma run --sockets and softrdma sockets stat/list themselves
// ------------------------------------------------------------------

/// Runs `softrdma ARGS` with the case's registry, to its end.
fn softrdma_cmd(case: &Case, args: &[&str]) -> Done {
    let mut c = Command::new(softrdma());
    c.args(args)
        .env("SOFTRDMA_SOCKETS_DIR", &case.registry)
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Proc::start(&format!("softrdma {}", args.join(" ")), c).wait(Instant::now() + DEADLINE)
}

/// The interposer is mapped into the program, first on LD_PRELOAD,
/// before what LD_PRELOAD held.
#[test]
fn run_sockets_preloads_the_interposer() {
    let case = Case::new("run_preload", Pairing::Both);
    let maps = case.run(Side::Client, "cat", &["/proc/self/maps"]);
    if case.check_ok(&maps) {
        let t = maps.text();
        case.check(
            t.contains("libsoftrdma_sockets.so") || t.contains("libsoftrdma-sockets.so.1"),
            || format!("the interposer is not mapped in cat:\n{t}"),
        );
    }
    let mut cmd = case.command(Side::Client, "sh", &["-c", "printf %s \"$LD_PRELOAD\""]);
    cmd.env("LD_PRELOAD", "/nonexistent/earlier.so");
    let env = Proc::start("sh", cmd).wait(Instant::now() + DEADLINE);
    if case.check_ok(&env) {
        let t = env.text();
        case.check(
            t.ends_with("libsoftrdma-sockets.so.1:/nonexistent/earlier.so"),
            || format!("LD_PRELOAD is {t:?}"),
        );
    }
    case.finish();
}

/// Without the interposer, `run --sockets` exits 127 and says what to
/// build.
#[test]
fn run_sockets_names_a_missing_interposer() {
    let case = Case::new("run_missing", Pairing::Both);
    let empty = case.path("empty");
    std::fs::create_dir(&empty).expect("empty dir");
    let mut c = Command::new(softrdma());
    c.args(["run", "--sockets", "--", "true"])
        .env("SOFTRDMA_LIB_DIR", &empty)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let d = Proc::start("softrdma run --sockets", c).wait(Instant::now() + DEADLINE);
    case.check(d.code == Some(127) && !d.timed_out, || d.describe());
    case.check(
        d.stderr.contains("libsoftrdma-sockets.so.1")
            && d.stderr.contains("cargo build -p softrdma-sockets"),
        || d.describe(),
    );
    case.finish();
}

/// `sockets stat` of a process that has no table exits 1 and says so;
/// `sockets list` of an empty registry lists nothing.
#[test]
fn sockets_stat_of_a_plain_process_fails() {
    let case = Case::new("stat_plain", Pairing::ServerOnly);
    let sleeper = case.spawn(Side::Client, "sleep", &["30"]);
    let pid = sleeper.pid().to_string();
    let d = softrdma_cmd(&case, &["sockets", "stat", &pid]);
    case.check(d.code == Some(1) && d.stdout.is_empty(), || d.describe());
    case.check(
        d.stderr.contains(&pid) && d.stderr.contains("softrdma run --sockets"),
        || d.describe(),
    );
    drop(sleeper);
    let list = softrdma_cmd(&case, &["sockets", "list"]);
    case.check(list.ok() && list.stdout.is_empty(), || list.describe());
    let json = softrdma_cmd(&case, &["sockets", "list", "--json"]);
    case.check(json.ok() && json.text().trim() == "[]", || json.describe());
    case.finish();
}

/// While an interposed socat client holds an accelerated connection open,
/// `softrdma sockets stat` shows it (state rc, the peer, the octets sent)
/// and `sockets list` lists both ends.
#[test]
fn sockets_stat_shows_a_live_connection() {
    let case = Case::new("stat_live", Pairing::Both);
    let port = free_tcp_port();
    let out = case.path("out");
    let mut server = case.spawn(
        Side::Server,
        "socat",
        &[
            "-u",
            &format!("TCP-LISTEN:{port},reuseaddr,bind=127.0.0.1"),
            &format!("OPEN:{},creat", out.display()),
        ],
    );
    wait_listening(&mut server, port, false);
    let mut cmd = case.command(
        Side::Client,
        "socat",
        &["-u", "-", &format!("TCP:127.0.0.1:{port}")],
    );
    cmd.stdin(Stdio::piped());
    let mut client = Proc::start(&case.label(Side::Client, "socat"), cmd);
    let data = random_bytes(64 << 10, 0x57a7);
    if let Err(e) = client.write_stdin(&data, Instant::now() + DEADLINE) {
        case.fail(format!("socat client: {e}"));
    }
    let pid = client.pid().to_string();
    let peer = format!("127.0.0.1:{port}");
    let until = Instant::now() + Duration::from_secs(15);
    let mut last;
    let found = loop {
        let d = softrdma_cmd(&case, &["sockets", "stat", &pid, "--json"]);
        last = d.describe();
        if d.ok() {
            match serde_json::from_slice::<serde_json::Value>(&d.stdout) {
                Ok(j) => {
                    let hit = j["sockets"].as_array().is_some_and(|a| {
                        a.iter().any(|s| {
                            s["kind"] == "tcp"
                                && s["role"] == "client"
                                && s["state"] == "rc"
                                // 127.0.0.1:P, or its IPv4-mapped IPv6 form.
                                && s["peer"].as_str().is_some_and(|a| {
                                    a == peer || a == format!("[::ffff:127.0.0.1]:{port}")
                                })
                                && s["tx_bytes"].as_u64() == Some(data.len() as u64)
                        })
                    });
                    if hit
                        && j["pid"].as_u64() == Some(u64::from(client.pid()))
                        && j["totals"]["rc_conns"] == 1
                    {
                        break true;
                    }
                }
                Err(e) => last = format!("bad JSON ({e}): {last}"),
            }
        }
        if Instant::now() >= until {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    case.check(found, || {
        format!("sockets stat --json never showed the client's rc socket to {peer} with 65536 octets sent: {last}")
    });
    let text = softrdma_cmd(&case, &["sockets", "stat", &pid]);
    if case.check_ok(&text) {
        let t = text.text();
        case.check(
            t.starts_with(&format!("pid={pid} rc_conns=1 "))
                && (t.contains(&peer) || t.contains(&format!("127.0.0.1]:{port}"))),
            || format!("sockets stat {pid}:\n{t}"),
        );
    }
    let list = softrdma_cmd(&case, &["sockets", "list"]);
    if case.check_ok(&list) {
        let t = list.text();
        for p in [server.pid().to_string(), pid.clone()] {
            case.check(
                t.lines().any(|l| l.starts_with(&format!("pid={p} "))),
                || format!("sockets list lacks {p}:\n{t}"),
            );
        }
    }
    client.close_stdin();
    let client = client.wait(Instant::now() + DEADLINE);
    case.check_ok(&client);
    let server = server.wait(Instant::now() + DEADLINE);
    case.check_ok(&server);
    match std::fs::read(&out) {
        Ok(got) => {
            if let Err(e) = same_bytes(&data, &got) {
                case.fail(format!("the server's copy {e}"));
            }
        }
        Err(e) => case.fail(format!("{}: {e}", out.display())),
    }
    case.finish();
}

/// The capture check can see iWARP: softrdma's own RC connection
/// (`softrdma rping`, no interposer) captured and dissected the way the
/// program tests do shows DDP/RDMAP frames. (Without it, a capture check
/// that never finds any would go unnoticed in the fallback pairings.)
#[test]
fn the_capture_check_sees_iwarp() {
    let case = Case::new("capture_check", Pairing::ServerOnly);
    let port = free_tcp_port();
    let ps = port.to_string();
    let Some(cap) = case.capture(&[port]) else {
        case.finish();
        return;
    };
    let rping = |args: &[&str]| {
        let mut c = Command::new(softrdma());
        c.arg("rping")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Proc::start(&format!("softrdma rping {}", args.join(" ")), c)
    };
    // 100000-octet buffers: segments longer than the capture keeps.
    let mut server = rping(&["-s", "-a", "127.0.0.1", "-p", &ps, "-S", "100000"]);
    wait_listening(&mut server, port, false);
    let client = rping(&[
        "-c",
        "-a",
        "127.0.0.1",
        "-p",
        &ps,
        "-C",
        "10",
        "-S",
        "100000",
    ])
    .wait(Instant::now() + DEADLINE);
    case.check_ok(&client);
    let server = server.wait(Instant::now() + DEADLINE);
    case.check_ok(&server);
    if let Some(n) = case.dissect(cap) {
        case.check(n.ddp >= 10 && n.payload >= n.ddp, || {
            format!("softrdma rping -C 10 -S 100000 over RC: {n}")
        });
    }
    case.finish();
}

/// The report parser takes the interposer's exit lines and sums them;
/// anything else is an error.
#[test]
fn report_lines_parse_and_sum() {
    let r = parse_report(
        "pid=1 rc_conns=2 kernel_conns=0 rc_tx_bytes=10 rc_rx_bytes=20 ud_socks=1 \
         ud_tx_bytes=7 ud_rx_bytes=0\n\
         pid=2 rc_conns=1 kernel_conns=3 rc_tx_bytes=5 rc_rx_bytes=0 ud_socks=0 \
         ud_tx_bytes=0 ud_rx_bytes=9\n",
    )
    .unwrap();
    assert_eq!(
        (
            r.lines.len(),
            r.rc_conns,
            r.kernel_conns,
            r.rc_tx_bytes,
            r.rc_rx_bytes
        ),
        (2, 3, 3, 15, 20)
    );
    assert_eq!((r.ud_socks, r.ud_tx_bytes, r.ud_rx_bytes), (1, 7, 9));
    assert!(parse_report("").unwrap().lines.is_empty());
    assert!(parse_report("pid=1 rc_conns=2").is_err());
    assert!(parse_report("pid=1 rc_conns=x kernel_conns=0 rc_tx_bytes=0 rc_rx_bytes=0").is_err());
    // Every total is required.
    assert!(parse_report("pid=1 rc_conns=0 kernel_conns=0 rc_tx_bytes=0 rc_rx_bytes=0").is_err());
}
