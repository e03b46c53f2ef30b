//! rc_quickbench: a quick loopback benchmark of the RC transport against raw
//! TCP, both measured in the same run and both waiting the same way: every
//! end busy-polls (non-blocking sockets for TCP, `Cq::poll` for softrdma;
//! how an end waits decides latency here, `docs/engine.md`).
//!
//! ```sh
//! cargo run --release -p softrdma-engine --example rc_quickbench [-- OPTIONS]
//! ```
//!
//! The two ends are two processes by default (the binary re-executes itself
//! with `--peer …`, so each side has its own engine and progress thread);
//! `--threads` runs the peer as a thread of this process instead. This
//! process is the measuring side: it listens on 127.0.0.1, the peer
//! connects. Tests (`--tests a,b,…`, default all but `write-lat-pt`):
//!
//! * `tcp-lat`: raw TCP 64 B ping-pong, TCP_NODELAY, non-blocking, busy-poll;
//! * `send-lat`: RC 64 B Send ping-pong (pre-posted receives, reposted after
//!   each completion), busy-polling `Cq::poll`;
//! * `write-lat`: RC 64 B RDMA Write ping-pong (ib_write_lat style: each
//!   side writes into the other's buffer and watches the last octet of its
//!   own), calling `Cq::poll` between looks so receive progress is inline;
//! * `write-lat-pt`: the same, looking at memory only: placement is left to
//!   each side's progress thread (what an unmodified ib_write_lat would see);
//! * `tcp-bw`: raw TCP stream of 1 MiB messages, both ends busy-poll;
//! * `write-bw-crc` / `write-bw-nocrc`: RC 1 MiB RDMA Write bandwidth with a
//!   window of outstanding signaled writes (ib_write_bw style), MPA CRC
//!   asked for by both sides / by neither side.
//!
//! The tests run in `--rounds` rounds, interleaved (every test once per
//! round), so a burst of load from elsewhere hits baseline and softrdma
//! alike; latency statistics are over the samples of all rounds, bandwidth
//! is the median round. Latency is one way (RTT / 2). Bandwidth is timed
//! from the end of a warm-up to the end of a closing handshake that proves
//! the receiver has everything (a 1-octet ack after EOF for TCP, a Send
//! answered by a Send for RC), so data still queued in socket buffers is
//! not counted as delivered. The raw TCP receiver reads 256 KiB at a time,
//! as the engine does.
//!
//! Options (environment variable in brackets, default in parentheses):
//!
//! * `--iters N` [RCQB_ITERS] (10000): measured round trips per round;
//! * `--warmup N` [RCQB_WARMUP] (1000): unmeasured round trips first;
//! * `--secs S` [RCQB_SECS] (2): per bandwidth test and round;
//! * `--rounds R` [RCQB_ROUNDS] (3);
//! * `--window W` [RCQB_WINDOW] (16): outstanding 1 MiB writes;
//! * `--timeout S` [RCQB_TIMEOUT] (30): a test fails after S seconds
//!   without progress (a hang, not a slow machine);
//! * `--tests LIST` [RCQB_TESTS]: comma-separated names from the list above;
//! * `--threads` [RCQB_THREADS=1]: peer as a thread, not a process.
//!
//! Engine knobs come from `SOFTRDMA_*` as usual (`SOFTRDMA_PROGRESS`, …);
//! the bandwidth tests override the CRC.

use std::error::Error;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::process::{Child, Command};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};
use std::{env, fmt, process};

use softrdma_engine::cm::{self, ConnParams, Listener};
use softrdma_engine::config::{Config, ProgressMode};
use softrdma_engine::{Completion, Context, Cq, Qp, QpCaps};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

macro_rules! bail {
    ($($t:tt)*) => { return Err(format!($($t)*).into()) };
}

/// Ping-pong message size.
const LAT_MSG: usize = 64;
/// Bandwidth message size.
const BW_MSG: usize = 1 << 20;
/// Receives kept posted in the Send ping-pong.
const RQ_DEPTH: usize = 16;
/// Every this many sends/writes in a ping-pong is signaled.
const SIGNAL_EVERY: usize = 16;
/// Read size of the raw TCP stream receiver: the engine's receive buffer
/// (qp.rs `RXBUF`), so both receivers drain the socket in the same steps.
const TCP_RX: usize = 256 * 1024;
/// Messages/writes completed before the bandwidth clock starts.
const BW_WARMUP: u64 = 64;

const NO_COMPLETION: Completion = Completion {
    wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
    qp_num: 0,
};

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Test {
    TcpLat,
    SendLat,
    WriteLat,
    WriteLatPt,
    TcpBw,
    WriteBw { crc: bool },
}

const ALL_TESTS: [Test; 7] = [
    Test::TcpLat,
    Test::SendLat,
    Test::WriteLat,
    Test::WriteLatPt,
    Test::TcpBw,
    Test::WriteBw { crc: true },
    Test::WriteBw { crc: false },
];

impl Test {
    fn name(self) -> &'static str {
        match self {
            Test::TcpLat => "tcp-lat",
            Test::SendLat => "send-lat",
            Test::WriteLat => "write-lat",
            Test::WriteLatPt => "write-lat-pt",
            Test::TcpBw => "tcp-bw",
            Test::WriteBw { crc: true } => "write-bw-crc",
            Test::WriteBw { crc: false } => "write-bw-nocrc",
        }
    }

    fn parse(s: &str) -> Option<Test> {
        ALL_TESTS.iter().copied().find(|t| t.name() == s)
    }

    fn label(self) -> &'static str {
        match self {
            Test::TcpLat => "raw TCP 64 B ping-pong",
            Test::SendLat => "RC Send 64 B ping-pong",
            Test::WriteLat => "RC Write 64 B ping-pong (poll_cq)",
            Test::WriteLatPt => "RC Write 64 B ping-pong (mem only)",
            Test::TcpBw => "raw TCP stream 1 MiB",
            Test::WriteBw { crc: true } => "RC Write bw 1 MiB, CRC on",
            Test::WriteBw { crc: false } => "RC Write bw 1 MiB, CRC off",
        }
    }
}

#[derive(Debug, Clone)]
struct Opts {
    iters: usize,
    warmup: usize,
    secs: f64,
    window: usize,
    timeout: Duration,
    tests: Vec<Test>,
    threads: bool,
    rounds: usize,
}

fn parse_num<T: std::str::FromStr>(name: &str, v: &str) -> Res<T> {
    v.parse()
        .map_err(|_| format!("{name}: bad value {v:?}").into())
}

fn parse_tests(v: &str) -> Res<Vec<Test>> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            Test::parse(s).ok_or_else(|| {
                let names: Vec<_> = ALL_TESTS.iter().map(|t| t.name()).collect();
                format!("unknown test {s:?} (known: {})", names.join(",")).into()
            })
        })
        .collect()
}

impl Opts {
    fn parse(args: &[String]) -> Res<Opts> {
        let mut o = Opts {
            iters: 10_000,
            warmup: 1_000,
            secs: 2.0,
            window: 16,
            timeout: Duration::from_secs(30),
            tests: ALL_TESTS
                .iter()
                .copied()
                .filter(|&t| t != Test::WriteLatPt)
                .collect(),
            threads: false,
            rounds: 3,
        };
        let envs: [(&str, &str); 8] = [
            ("RCQB_ROUNDS", "--rounds"),
            ("RCQB_ITERS", "--iters"),
            ("RCQB_WARMUP", "--warmup"),
            ("RCQB_SECS", "--secs"),
            ("RCQB_WINDOW", "--window"),
            ("RCQB_TIMEOUT", "--timeout"),
            ("RCQB_TESTS", "--tests"),
            ("RCQB_THREADS", "--threads"),
        ];
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (var, flag) in envs {
            if let Ok(v) = env::var(var) {
                pairs.push((flag.to_string(), v));
            }
        }
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--threads" => pairs.push((a.clone(), "1".into())),
                "-h" | "--help" => {
                    println!(
                        "usage: rc_quickbench [--iters N] [--warmup N] [--secs S] [--window W] \
                         [--rounds R] [--timeout S] [--tests LIST] [--threads]\ntests: {}",
                        ALL_TESTS.map(|t| t.name()).join(",")
                    );
                    process::exit(0);
                }
                _ => {
                    let v = it.next().ok_or_else(|| format!("{a}: value missing"))?;
                    pairs.push((a.clone(), v.clone()));
                }
            }
        }
        for (flag, v) in pairs {
            match flag.as_str() {
                "--iters" => o.iters = parse_num(&flag, &v)?,
                "--warmup" => o.warmup = parse_num(&flag, &v)?,
                "--secs" => o.secs = parse_num(&flag, &v)?,
                "--window" => o.window = parse_num(&flag, &v)?,
                "--rounds" => o.rounds = parse_num(&flag, &v)?,
                "--timeout" => o.timeout = Duration::from_secs(parse_num(&flag, &v)?),
                "--tests" => o.tests = parse_tests(&v)?,
                "--threads" => o.threads = !matches!(v.as_str(), "0" | "" | "false"),
                _ => bail!("unknown option {flag} (try --help)"),
            }
        }
        if o.iters == 0
            || o.rounds == 0
            || o.window == 0
            || o.window > 128
            || o.secs.is_nan()
            || o.secs <= 0.0
        {
            bail!("need --iters > 0, --rounds > 0, 0 < --window <= 128, --secs > 0");
        }
        Ok(o)
    }

    /// The arguments that make a peer process run `t` against `port`.
    fn peer_args(&self, t: Test, port: u16) -> Vec<String> {
        vec![
            "--peer".into(),
            t.name().into(),
            port.to_string(),
            self.iters.to_string(),
            self.warmup.to_string(),
            self.window.to_string(),
            self.timeout.as_secs().to_string(),
        ]
    }

    fn from_peer_args(a: &[String]) -> Res<(Test, u16, Opts)> {
        if a.len() != 6 {
            bail!("--peer: expected TEST PORT ITERS WARMUP WINDOW TIMEOUT");
        }
        let t = Test::parse(&a[0]).ok_or("--peer: unknown test")?;
        let o = Opts {
            iters: parse_num("iters", &a[2])?,
            warmup: parse_num("warmup", &a[3])?,
            secs: 0.0,
            window: parse_num("window", &a[4])?,
            timeout: Duration::from_secs(parse_num("timeout", &a[5])?),
            tests: vec![t],
            threads: false,
            rounds: 1,
        };
        Ok((t, parse_num("port", &a[1])?, o))
    }

    fn total(&self) -> usize {
        self.warmup + self.iters
    }
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/// A hang detector for spin loops: fails when `timeout` passes without
/// [`Watch::progress`]. The clock is read only every 256 spins, so it stays
/// out of the tightest loops; a loaded machine that merely slows the test
/// down does not trip it.
struct Watch {
    timeout: Duration,
    deadline: Option<Instant>,
    spins: u32,
}

impl Watch {
    fn new(timeout: Duration) -> Watch {
        Watch {
            timeout,
            deadline: None,
            spins: 0,
        }
    }

    /// Something happened: the next wait gets a fresh deadline.
    #[inline]
    fn progress(&mut self) {
        self.deadline = None;
    }

    #[inline]
    fn check(&mut self, what: &str) -> Res<()> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins & 255 == 0 {
            let now = Instant::now();
            match self.deadline {
                None => self.deadline = Some(now + self.timeout),
                Some(d) if now > d => {
                    bail!("no progress for {:?} waiting for {what}", self.timeout)
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

fn read_exact_spin(s: &mut TcpStream, buf: &mut [u8], w: &mut Watch) -> Res<()> {
    let mut at = 0;
    while at < buf.len() {
        match s.read(&mut buf[at..]) {
            Ok(0) => bail!("TCP peer closed"),
            Ok(n) => {
                at += n;
                w.progress();
            }
            Err(e) if would_block(&e) => w.check("a TCP read")?,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn write_all_spin(s: &mut TcpStream, buf: &[u8], w: &mut Watch) -> Res<()> {
    let mut at = 0;
    while at < buf.len() {
        match s.write(&buf[at..]) {
            Ok(0) => bail!("TCP write returned 0"),
            Ok(n) => {
                at += n;
                w.progress();
            }
            Err(e) if would_block(&e) => w.check("a TCP write")?,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// One side of an RC connection: context, CQ, QP and one registered buffer.
struct Rc {
    ctx: Context,
    cq: Arc<Cq>,
    qp: Qp,
    /// Owns the registered memory; only reached through `ptr` afterwards
    /// (the engine writes into it from other threads).
    _buf: Vec<u8>,
    ptr: *mut u8,
    len: usize,
    stag: u32,
    out: [Completion; 16],
}

impl Rc {
    fn new(cfg: Config, len: usize) -> Res<Rc> {
        let ctx = Context::with_config(cfg)?;
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(1024, None);
        let caps = QpCaps {
            max_send_wr: 256,
            max_recv_wr: 64,
        };
        let qp = ctx.create_qp(1, pd, caps, cq.clone(), cq.clone());
        let mut buf = vec![0u8; len];
        let ptr = buf.as_mut_ptr();
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        // SAFETY: the heap block of `buf` lives in the returned Rc, is never
        // moved or resized, and `Drop for Rc` deregisters it before it is
        // freed.
        let stag = unsafe { ctx.registry().register(ptr, len, ptr as u64, access, pd) }
            .map_err(|e| format!("register: {e:?}"))?;
        Ok(Rc {
            ctx,
            cq,
            qp,
            _buf: buf,
            ptr,
            len,
            stag,
            out: [NO_COMPLETION; 16],
        })
    }

    fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }

    /// Our buffer's address and STag, as private data for the peer.
    fn advert(&self) -> Vec<u8> {
        let mut v = self.addr(0).to_le_bytes().to_vec();
        v.extend_from_slice(&self.stag.to_le_bytes());
        v
    }

    fn byte(&self, off: usize) -> u8 {
        assert!(off < self.len);
        // SAFETY: in bounds of the live buffer; volatile because the engine
        // writes it behind the compiler's back (RDMA placement).
        unsafe { self.ptr.add(off).read_volatile() }
    }

    fn set_byte(&self, off: usize, v: u8) {
        assert!(off < self.len);
        // SAFETY: as in `byte`; no work request reads this octet now.
        unsafe { self.ptr.add(off).write_volatile(v) }
    }

    fn post_recv(&self, wr_id: u64, off: usize, len: usize) -> Res<()> {
        self.qp
            .post_recv(RecvWr {
                wr_id,
                sgl: SgList::single(self.addr(off), len as u32, self.stag),
            })
            .map_err(|e| format!("post_recv: {e:?}"))?;
        Ok(())
    }

    fn post(&self, wr_id: u64, op: SendOp, off: usize, len: usize, signaled: bool) -> Res<()> {
        self.qp
            .post_send(SendWr {
                wr_id,
                op,
                payload: Payload::Sgl(SgList::single(self.addr(off), len as u32, self.stag)),
                flags: SendFlags {
                    signaled,
                    ..Default::default()
                },
            })
            .map_err(|e| format!("post_send: {e:?}"))?;
        Ok(())
    }

    /// Polls once; returns (receives completed, sends completed, wr_id of
    /// the last receive). Any error completion is an error.
    #[inline]
    fn poll(&mut self) -> Res<(usize, usize, u64)> {
        let n = self.cq.poll(&mut self.out);
        let (mut recvs, mut sends, mut id) = (0, 0, 0);
        for c in &self.out[..n] {
            if c.wc.status != WcStatus::Success {
                bail!("completion error: {:?}", c.wc);
            }
            if c.wc.opcode == WcOpcode::Recv {
                recvs += 1;
                id = c.wc.wr_id;
            } else {
                sends += 1;
            }
        }
        Ok((recvs, sends, id))
    }

    /// Busy-polls until a receive completes; returns its wr_id.
    fn wait_recv(&mut self, w: &mut Watch) -> Res<u64> {
        loop {
            let (r, _, id) = self.poll()?;
            if r > 0 {
                w.progress();
                return Ok(id);
            }
            w.check("a receive completion")?;
        }
    }
}

impl Drop for Rc {
    fn drop(&mut self) {
        self.qp.disconnect();
        self.ctx.registry().deregister(self.stag);
    }
}

fn parse_advert(pd: &[u8]) -> Res<(u64, u32)> {
    if pd.len() < 12 {
        bail!("peer private data too short ({} octets)", pd.len());
    }
    let addr = u64::from_le_bytes(pd[..8].try_into().expect("8 octets"));
    let stag = u32::from_le_bytes(pd[8..12].try_into().expect("4 octets"));
    Ok((addr, stag))
}

fn rc_config(t: Test) -> Res<Config> {
    let mut c = Config::from_env()?;
    if let Test::WriteBw { crc } = t {
        c.mpa_crc = crc;
    }
    Ok(c)
}

fn buf_len(t: Test) -> usize {
    match t {
        Test::WriteBw { .. } => BW_MSG + 256,
        _ => 4096,
    }
}

// Buffer layout of the RC tests: [0, 64) is what the peer writes into
// (write tests) or the Send source; receives go to slots from RECV_AT; the
// bandwidth tests write [0, 1 MiB) and use the slots after it.
const SRC_AT: usize = 64;
const RECV_AT: usize = 1024;

// ---------------------------------------------------------------------------
// The measuring side
// ---------------------------------------------------------------------------

enum Outcome {
    /// One-way latency samples, nanoseconds (RTT / 2).
    Lat(Vec<f64>),
    /// Gbit/s.
    Bw(f64),
}

/// The other end: a child process or (with `--threads`) a thread.
struct Peer {
    kind: PeerKind,
}

enum PeerKind {
    Process(Child),
    Thread(Option<JoinHandle<Result<(), String>>>),
}

impl Peer {
    fn spawn(t: Test, port: u16, o: &Opts) -> Res<Peer> {
        if o.threads {
            let o2 = o.clone();
            let h = thread::Builder::new()
                .name(format!("peer-{}", t.name()))
                .spawn(move || peer_run(t, port, &o2).map_err(|e| e.to_string()))?;
            return Ok(Peer {
                kind: PeerKind::Thread(Some(h)),
            });
        }
        let exe = env::current_exe()?;
        let child = Command::new(exe).args(o.peer_args(t, port)).spawn()?;
        Ok(Peer {
            kind: PeerKind::Process(child),
        })
    }

    /// True if the peer has already ended.
    fn ended(&mut self) -> bool {
        match &mut self.kind {
            PeerKind::Process(c) => !matches!(c.try_wait(), Ok(None)),
            PeerKind::Thread(h) => h.as_ref().is_none_or(|h| h.is_finished()),
        }
    }

    /// Waits for the peer to end (it should be ending), at most `timeout`.
    fn finish(&mut self, timeout: Duration) -> Res<()> {
        let deadline = Instant::now() + timeout;
        match &mut self.kind {
            PeerKind::Process(c) => loop {
                if let Some(st) = c.try_wait()? {
                    if !st.success() {
                        bail!("peer process failed ({st})");
                    }
                    return Ok(());
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    bail!("peer process did not end; killed");
                }
                thread::sleep(Duration::from_millis(5));
            },
            PeerKind::Thread(h) => {
                let Some(j) = h.take() else { return Ok(()) };
                while !j.is_finished() {
                    if Instant::now() > deadline {
                        bail!("peer thread did not end");
                    }
                    thread::sleep(Duration::from_millis(5));
                }
                match j.join() {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => bail!("peer: {e}"),
                    Err(_) => bail!("peer thread panicked"),
                }
            }
        }
    }

    /// Ends the peer after a failure on our side.
    fn abort(&mut self) {
        if let PeerKind::Process(c) = &mut self.kind {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until `fd` (a listener) is readable, watching the peer.
fn wait_readable(fd: RawFd, peer: &mut Peer, timeout: Duration) -> Res<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        let r = unsafe { libc::poll(&mut p, 1, 50) };
        if r > 0 {
            return Ok(());
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e.into());
            }
        }
        if peer.ended() {
            bail!("the peer ended before connecting");
        }
        if Instant::now() > deadline {
            bail!("no connection from the peer");
        }
    }
}

fn run_test(t: Test, o: &Opts) -> Res<Outcome> {
    match t {
        Test::TcpLat | Test::TcpBw => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let mut peer = Peer::spawn(t, l.local_addr()?.port(), o)?;
            let res = (|| {
                wait_readable(l.as_raw_fd(), &mut peer, o.timeout)?;
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
                if t == Test::TcpLat {
                    tcp_lat_a(s, o)
                } else {
                    tcp_bw_a(s, o)
                }
            })();
            conclude(peer, res, o)
        }
        _ => {
            let mut rc = Rc::new(rc_config(t)?, buf_len(t))?;
            // Receives first: the peer may send as soon as it is connected.
            match t {
                Test::SendLat => {
                    for k in 0..RQ_DEPTH {
                        rc.post_recv(k as u64, RECV_AT + k * LAT_MSG, LAT_MSG)?;
                    }
                }
                Test::WriteBw { .. } => rc.post_recv(0, BW_MSG, LAT_MSG)?,
                _ => {}
            }
            let l = Listener::bind(&rc.ctx, "127.0.0.1:0")?;
            let mut peer = Peer::spawn(t, l.local_addr()?.port(), o)?;
            let res = (|| {
                wait_readable(l.as_raw_fd(), &mut peer, o.timeout)?;
                let inc = l.accept().map_err(|e| format!("accept: {e}"))?;
                let (raddr, rkey) = parse_advert(inc.private_data())?;
                let params = ConnParams {
                    private_data: rc.advert(),
                    ..Default::default()
                };
                inc.accept(&rc.qp, &params)
                    .map_err(|e| format!("accept: {e}"))?;
                match t {
                    Test::SendLat => send_lat_a(&mut rc, o),
                    Test::WriteLat | Test::WriteLatPt => {
                        write_lat_a(&mut rc, raddr, rkey, t == Test::WriteLat, o)
                    }
                    _ => write_bw_a(&mut rc, raddr, rkey, o),
                }
            })();
            // Close first: the peer lingers until it sees us go.
            rc.qp.disconnect();
            let r = conclude(peer, res, o);
            drop(rc);
            r
        }
    }
}

fn conclude(mut peer: Peer, res: Res<Outcome>, o: &Opts) -> Res<Outcome> {
    match res {
        Ok(r) => {
            peer.finish(o.timeout)?;
            Ok(r)
        }
        Err(e) => {
            peer.abort();
            Err(e)
        }
    }
}

fn tcp_lat_a(mut s: TcpStream, o: &Opts) -> Res<Outcome> {
    let mut w = Watch::new(o.timeout);
    let tx = [0x5au8; LAT_MSG];
    let mut rx = [0u8; LAT_MSG];
    let mut samples = Vec::with_capacity(o.iters);
    for i in 0..o.total() {
        let t0 = Instant::now();
        write_all_spin(&mut s, &tx, &mut w)?;
        read_exact_spin(&mut s, &mut rx, &mut w)?;
        let dt = t0.elapsed();
        if i >= o.warmup {
            samples.push(dt.as_nanos() as f64 / 2.0);
        }
    }
    Ok(Outcome::Lat(samples))
}

fn tcp_bw_a(mut s: TcpStream, o: &Opts) -> Res<Outcome> {
    let mut w = Watch::new(o.timeout);
    let msg = vec![0xa5u8; BW_MSG];
    let (mut sent, mut at) = (0u64, 0usize);
    let mut start: Option<(Instant, u64)> = None;
    loop {
        match s.write(&msg[at..]) {
            Ok(n) => {
                at += n;
                w.progress();
            }
            Err(e) if would_block(&e) => {
                w.check("TCP send room")?;
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        if at < BW_MSG {
            continue;
        }
        at = 0;
        sent += 1;
        match start {
            None if sent == BW_WARMUP => start = Some((Instant::now(), sent)),
            Some((t0, _)) if t0.elapsed().as_secs_f64() >= o.secs => break,
            _ => {}
        }
    }
    s.shutdown(Shutdown::Write)?;
    let mut ack = [0u8; 1];
    read_exact_spin(&mut s, &mut ack, &mut w)?;
    let (t0, base) = start.expect("started");
    let secs = t0.elapsed().as_secs_f64();
    Ok(Outcome::Bw(
        (sent - base) as f64 * BW_MSG as f64 * 8.0 / secs / 1e9,
    ))
}

fn send_lat_a(rc: &mut Rc, o: &Opts) -> Res<Outcome> {
    let mut w = Watch::new(o.timeout);
    let send = SendOp::Send {
        imm: None,
        invalidate: None,
    };
    let mut samples = Vec::with_capacity(o.iters);
    for i in 0..o.total() {
        let t0 = Instant::now();
        rc.post(i as u64, send, SRC_AT, LAT_MSG, i % SIGNAL_EVERY == 0)?;
        let k = rc.wait_recv(&mut w)? as usize;
        let dt = t0.elapsed();
        rc.post_recv(k as u64, RECV_AT + k * LAT_MSG, LAT_MSG)?;
        if i >= o.warmup {
            samples.push(dt.as_nanos() as f64 / 2.0);
        }
    }
    Ok(Outcome::Lat(samples))
}

/// The tag of ping-pong round `i` (never 0, the buffer's initial value,
/// and different from the previous round's).
fn tag(i: usize) -> u8 {
    (i % 255) as u8 + 1
}

fn write_lat_a(rc: &mut Rc, raddr: u64, rkey: u32, poll: bool, o: &Opts) -> Res<Outcome> {
    let mut w = Watch::new(o.timeout);
    let mut samples = Vec::with_capacity(o.iters);
    let op = SendOp::Write {
        remote_addr: raddr,
        rkey,
        imm: None,
    };
    for i in 0..o.total() {
        let tg = tag(i);
        rc.set_byte(SRC_AT + LAT_MSG - 1, tg);
        let t0 = Instant::now();
        // Without polling nothing would drain the CQ: leave those writes
        // unsignaled (their send-queue slots are freed when written).
        rc.post(i as u64, op, SRC_AT, LAT_MSG, poll && i % SIGNAL_EVERY == 0)?;
        while rc.byte(LAT_MSG - 1) != tg {
            if poll {
                rc.poll()?;
            }
            w.check("the peer's write")?;
        }
        let dt = t0.elapsed();
        w.progress();
        if i >= o.warmup {
            samples.push(dt.as_nanos() as f64 / 2.0);
        }
    }
    Ok(Outcome::Lat(samples))
}

fn write_bw_a(rc: &mut Rc, raddr: u64, rkey: u32, o: &Opts) -> Res<Outcome> {
    let mut w = Watch::new(o.timeout);
    let op = SendOp::Write {
        remote_addr: raddr,
        rkey,
        imm: None,
    };
    let (mut posted, mut done, mut outstanding) = (0u64, 0u64, 0usize);
    let mut start: Option<(Instant, u64)> = None;
    let mut stop = false;
    loop {
        while !stop && outstanding < o.window {
            rc.post(posted, op, 0, BW_MSG, true)?;
            posted += 1;
            outstanding += 1;
        }
        let (_, s, _) = rc.poll()?;
        done += s as u64;
        outstanding -= s;
        match start {
            None if done >= BW_WARMUP => start = Some((Instant::now(), done)),
            Some((t0, _)) if !stop && t0.elapsed().as_secs_f64() >= o.secs => stop = true,
            _ => {}
        }
        if stop && outstanding == 0 {
            break;
        }
        if s == 0 {
            w.check("write completions")?;
        } else {
            w.progress();
        }
    }
    // Closing handshake: a Send behind the writes, answered by a Send.
    let send = SendOp::Send {
        imm: None,
        invalidate: None,
    };
    rc.post(u64::MAX, send, BW_MSG + 128, LAT_MSG, true)?;
    rc.wait_recv(&mut w)?;
    let (t0, base) = start.expect("started");
    let secs = t0.elapsed().as_secs_f64();
    Ok(Outcome::Bw(
        (done - base) as f64 * BW_MSG as f64 * 8.0 / secs / 1e9,
    ))
}

// ---------------------------------------------------------------------------
// The peer side
// ---------------------------------------------------------------------------

fn peer_run(t: Test, port: u16, o: &Opts) -> Res<()> {
    let addr = ("127.0.0.1", port);
    match t {
        Test::TcpLat | Test::TcpBw => {
            let mut s = TcpStream::connect(addr)?;
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
            let mut w = Watch::new(o.timeout + Duration::from_secs(5));
            if t == Test::TcpLat {
                let mut buf = [0u8; LAT_MSG];
                for _ in 0..o.total() {
                    read_exact_spin(&mut s, &mut buf, &mut w)?;
                    write_all_spin(&mut s, &buf, &mut w)?;
                }
            } else {
                let mut buf = vec![0u8; TCP_RX];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => w.progress(),
                        Err(e) if would_block(&e) => w.check("TCP stream data")?,
                        Err(e) => return Err(e.into()),
                    }
                }
                write_all_spin(&mut s, &[1], &mut w)?;
            }
            Ok(())
        }
        _ => {
            let mut rc = Rc::new(rc_config(t)?, buf_len(t))?;
            match t {
                Test::SendLat => {
                    for k in 0..RQ_DEPTH {
                        rc.post_recv(k as u64, RECV_AT + k * LAT_MSG, LAT_MSG)?;
                    }
                }
                Test::WriteBw { .. } => rc.post_recv(0, BW_MSG, LAT_MSG)?,
                _ => {}
            }
            let params = ConnParams {
                private_data: rc.advert(),
                ..Default::default()
            };
            let pd =
                cm::connect(&rc.ctx, &rc.qp, addr, &params).map_err(|e| format!("connect: {e}"))?;
            let (raddr, rkey) = parse_advert(&pd)?;
            let mut w = Watch::new(o.timeout + Duration::from_secs(5));
            match t {
                Test::SendLat => {
                    let send = SendOp::Send {
                        imm: None,
                        invalidate: None,
                    };
                    for i in 0..o.total() {
                        let k = rc.wait_recv(&mut w)? as usize;
                        rc.post(i as u64, send, SRC_AT, LAT_MSG, i % SIGNAL_EVERY == 0)?;
                        rc.post_recv(k as u64, RECV_AT + k * LAT_MSG, LAT_MSG)?;
                    }
                }
                Test::WriteLat | Test::WriteLatPt => {
                    let poll = t == Test::WriteLat;
                    let op = SendOp::Write {
                        remote_addr: raddr,
                        rkey,
                        imm: None,
                    };
                    for i in 0..o.total() {
                        let tg = tag(i);
                        while rc.byte(LAT_MSG - 1) != tg {
                            if poll {
                                rc.poll()?;
                            }
                            w.check("the peer's write")?;
                        }
                        w.progress();
                        rc.set_byte(SRC_AT + LAT_MSG - 1, tg);
                        let signaled = poll && i % SIGNAL_EVERY == 0;
                        rc.post(i as u64, op, SRC_AT, LAT_MSG, signaled)?;
                    }
                }
                _ => {
                    // Writes land while we poll; the closing Send follows
                    // them on the stream.
                    rc.wait_recv(&mut w)?;
                    let send = SendOp::Send {
                        imm: None,
                        invalidate: None,
                    };
                    rc.post(1, send, BW_MSG + 128, LAT_MSG, false)?;
                }
            }
            // Keep driving progress until the measuring side closes: it has
            // our last message then (it closes only after reading it), and
            // our socket never closes with unread data (no RST). Its close
            // flushes our receives: those completions are expected.
            let linger = Instant::now() + Duration::from_secs(5);
            while rc.qp.link_state() == softrdma_engine::QpLinkState::Connected
                && Instant::now() < linger
            {
                let _ = rc.poll();
                thread::sleep(Duration::from_micros(200));
            }
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

struct LatStats {
    p50: f64,
    p99: f64,
    mean: f64,
}

fn lat_stats(mut v: Vec<f64>) -> LatStats {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)] / 1000.0;
    LatStats {
        p50: at(0.50),
        p99: at(0.99),
        mean: v.iter().sum::<f64>() / v.len() as f64 / 1000.0,
    }
}

/// A test's results over all rounds.
struct Row {
    test: Test,
    /// One-way latency samples of every round (ns).
    samples: Vec<f64>,
    /// Gbit/s of each round.
    bws: Vec<f64>,
    err: Option<String>,
}

impl Row {
    fn lat(&self) -> Option<LatStats> {
        (!self.samples.is_empty()).then(|| lat_stats(self.samples.clone()))
    }

    /// The median round.
    fn bw(&self) -> Option<f64> {
        let mut v = self.bws.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    }
}

struct Ratio(Option<f64>);

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => write!(f, "{:>7.2}x", r),
            None => write!(f, "{:>8}", "-"),
        }
    }
}

fn print_table(rows: &[Row], rounds: usize) {
    let find = |t: Test| rows.iter().find(|r| r.test == t);
    let tcp_lat = find(Test::TcpLat).and_then(Row::lat);
    let tcp_bw = find(Test::TcpBw).and_then(Row::bw);
    let failed = |r: &Row| {
        println!(
            "{:<36} failed: {}",
            r.test.label(),
            r.err.as_deref().unwrap_or("?")
        )
    };
    println!();
    println!(
        "{:<36} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "one-way latency (us), all rounds", "p50", "p99", "mean", "p50 r", "p99 r", "mean r"
    );
    for r in rows.iter().filter(|r| is_lat(r.test)) {
        let (Some(s), None) = (r.lat(), &r.err) else {
            failed(r);
            continue;
        };
        let base = tcp_lat.as_ref().filter(|_| r.test != Test::TcpLat);
        println!(
            "{:<36} {:>8.2} {:>8.2} {:>8.2} {} {} {}",
            r.test.label(),
            s.p50,
            s.p99,
            s.mean,
            Ratio(base.map(|b| s.p50 / b.p50)),
            Ratio(base.map(|b| s.p99 / b.p99)),
            Ratio(base.map(|b| s.mean / b.mean)),
        );
    }
    println!();
    println!(
        "{:<36} {:>8} {:>8}   each round",
        format!("bandwidth (median of {rounds} rounds)"),
        "Gbit/s",
        "ratio",
    );
    for r in rows.iter().filter(|r| !is_lat(r.test)) {
        let (Some(g), None) = (r.bw(), &r.err) else {
            failed(r);
            continue;
        };
        let base = tcp_bw.filter(|_| r.test != Test::TcpBw);
        let each: Vec<String> = r.bws.iter().map(|b| format!("{b:.2}")).collect();
        println!(
            "{:<36} {:>8.2} {}   {}",
            r.test.label(),
            g,
            Ratio(base.map(|b| g / b)),
            each.join(" ")
        );
    }
    println!(
        "ratio = softrdma / raw TCP of this run (latency: lower is better; \
         bandwidth: higher is better)"
    );
}

fn is_lat(t: Test) -> bool {
    matches!(
        t,
        Test::TcpLat | Test::SendLat | Test::WriteLat | Test::WriteLatPt
    )
}

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--peer") {
        // Die with the measuring process, whatever happens to it.
        // SAFETY: prctl with PR_SET_PDEATHSIG and a signal number only.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        let r = Opts::from_peer_args(&args[1..]).and_then(|(t, port, o)| peer_run(t, port, &o));
        if let Err(e) = r {
            eprintln!("rc_quickbench peer: {e}");
            process::exit(1);
        }
        return;
    }
    let o = match Opts::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("rc_quickbench: {e}");
            process::exit(2);
        }
    };
    let cfg = Config::from_env().unwrap_or_else(|e| {
        eprintln!("rc_quickbench: {e}");
        process::exit(2)
    });
    println!(
        "rc_quickbench: 127.0.0.1, ends = {}, waiting = busy-poll on both ends \
         (TCP: non-blocking sockets; RC: Cq::poll), progress = {}, nothing pinned",
        if o.threads {
            "two threads"
        } else {
            "two processes"
        },
        match cfg.progress {
            ProgressMode::Both => "thread + inline",
            ProgressMode::Thread => "thread only",
        }
    );
    println!(
        "{} rounds; latency: {} round trips after {} warm-up per round, 64 B, RC CRC {}; \
         bandwidth: {} s per test and round, 1 MiB messages, window {}",
        o.rounds,
        o.iters,
        o.warmup,
        if cfg.mpa_crc { "on" } else { "off" },
        o.secs,
        o.window
    );
    println!("load average at start: {}", loadavg());
    let mut rows: Vec<Row> = o
        .tests
        .iter()
        .map(|&test| Row {
            test,
            samples: Vec::new(),
            bws: Vec::new(),
            err: None,
        })
        .collect();
    for round in 1..=o.rounds {
        eprintln!("round {round}/{}", o.rounds);
        for row in rows.iter_mut().filter(|r| r.err.is_none()) {
            let t = row.test;
            let began = Instant::now();
            let took = || began.elapsed().as_secs_f64();
            match run_test(t, &o) {
                Ok(Outcome::Lat(v)) => {
                    let s = lat_stats(v.clone());
                    eprintln!(
                        "  {:<15} p50 {:.2} us p99 {:.2} us mean {:.2} us ({:.1} s)",
                        t.name(),
                        s.p50,
                        s.p99,
                        s.mean,
                        took()
                    );
                    row.samples.extend(v);
                }
                Ok(Outcome::Bw(g)) => {
                    eprintln!("  {:<15} {:.2} Gbit/s ({:.1} s)", t.name(), g, took());
                    row.bws.push(g);
                }
                Err(e) => {
                    eprintln!("  {:<15} FAILED: {e}", t.name());
                    row.err = Some(e.to_string());
                }
            }
        }
    }
    print_table(&rows, o.rounds);
    println!("load average at end: {}", loadavg());
    if rows.iter().any(|r| r.err.is_some()) {
        process::exit(1);
    }
}

/// /proc/loadavg, to tell a quiet machine from a busy one.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}
