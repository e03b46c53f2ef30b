//! dgram_bench: figures for the datagram issue, measured in one run on
//! loopback and between two network namespaces joined by veth
//! (`softrdma_sim::netns::NetPair`; needs root), each end a separate
//! process, every QP and raw socket at MTU 1500:
//!
//! 1. **64 B one-way latency**: UD Send ping-pong, both ends busy-polling
//!    their CQ, against a raw UDP ping-pong of 64-octet datagrams on
//!    non-blocking sockets, both ends busy-polling `recv_from`; one-way =
//!    round trip / 2; p50 and p99.
//! 2. **Bandwidth, 64 KiB Write-Record messages** (45 datagrams of 1472
//!    UDP octets and one of 676 each) against a raw UDP blast of exactly
//!    those datagram sizes, both with `sendmmsg` in batches of 32
//!    datagrams: engine with offload (its default: UDP GSO runs, GRO
//!    receive) against raw `sendmmsg` with `UDP_SEGMENT` runs cut the
//!    same way and `UDP_GRO` on the receiver; and engine without offload
//!    against plain raw `sendmmsg`/`recvmmsg`. Senders blast for
//!    [`SECONDS`]; the figure is what the receiver took in per second,
//!    counted as message octets on both sides (Write-Record: the octets
//!    its records report placed, complete or partial, i.e. octets
//!    recorded valid; raw: UDP payload octets × 65536 / 66916, the share
//!    of message octets in those same datagrams).
//! 3. **At 1 % loss** (namespaces only; nftables drops 1 % of the packets
//!    entering the receiver's namespace): Write-Record goodput (octets
//!    recorded valid per second) against UD Send goodput (octets of
//!    complete messages delivered per second), 64 KiB messages, both
//!    offered at the same paced rate (half the lossless Write-Record rate
//!    measured in 2., so the receiver is not the bottleneck).
//!
//! The namespaces' veth links get `gso_max_segs 1`, as in
//! `tests/netns_dgram.rs`: GSO runs are cut into datagrams before the link,
//! as a NIC without UDP segmentation offload would, so loss hits single
//! datagrams (with veth's own offload a run crosses as one packet).
//!
//! ```sh
//! cargo build --release -p softrdma-engine --example dgram_bench
//! sudo target/release/examples/dgram_bench            # everything
//! sudo target/release/examples/dgram_bench --latency  # 1. only
//! ```
//!
//! The engine takes the `SOFTRDMA_*` environment (`SOFTRDMA_PROGRESS`,
//! …) except the MTU and offload, which each measurement sets. Busy
//! polling wants a core per end: on a machine with two cores, or other
//! load, the p99 latencies show scheduler ticks (4 ms at 250 Hz), so the
//! load average is printed with the table. A benchmark, not a test: it
//! asserts nothing about the figures.

use std::collections::HashMap;
use std::fmt::Debug;
use std::io::{BufRead, BufReader, Write};
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::str::FromStr;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::config::Config;
use softrdma_engine::{Completion, Context, Cq, DgramQpHandle, QpCaps, QpError, UdOptions};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    DgramAddr, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
    WorkCompletion,
};
use softrdma_sim::netns::NetPair;

const MTU: usize = 1500;
/// The message size of the bandwidth runs.
const MSG: usize = 64 << 10;
/// UDP payload of a full Write-Record segment at MTU 1500: 26 (DDP tagged
/// + X + DQPN) + 1442 + 4 (CRC).
const WR_DGRAM: usize = 1472;
/// Full segments per 64 KiB message, and the last one's UDP payload.
const WR_FULL: usize = MSG / 1442;
const WR_TAIL: usize = 26 + (MSG - WR_FULL * 1442) + 4;
/// Datagrams per `sendmmsg` (the engine's batch).
const BATCH: usize = 32;
/// Ping-pong round trips measured (after [`WARMUP`]), unless
/// [`LAT_BUDGET`] runs out first (a loaded machine).
const ITERS: usize = 20_000;
const WARMUP: usize = 2_000;
const LAT_BUDGET: Duration = Duration::from_secs(15);
/// A pong not back within this is counted lost (the ping is sent again).
const PONG_WAIT: Duration = Duration::from_secs(1);
/// How long each bandwidth sender runs.
const SECONDS: f64 = 2.0;
const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

// ---------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() >= 3 && args[1] == "--role" {
        role(&args[2]);
        return;
    }
    // `--latency`: the latency rows only.
    let latency_only = args.get(1).is_some_and(|a| a == "--latency");
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load_before = load();
    let lo = Env::Loopback;
    let mut rows = Vec::new();
    measure(&lo, latency_only, &mut rows);
    match NetPair::create() {
        Ok(pair) => {
            let mut env = Env::Netns(Box::new(netns(pair)));
            let lossless = measure(&env, latency_only, &mut rows);
            if !latency_only {
                loss(&mut env, lossless, &mut rows);
            }
        }
        Err(e) => eprintln!("namespaces unavailable ({e}): loopback only"),
    }
    println!();
    println!("| where | what | softrdma | baseline | ratio |\n|---|---|---|---|---|");
    for r in &rows {
        println!("| {} | {} | {} | {} | {} |", r[0], r[1], r[2], r[3], r[4]);
    }
    println!(
        "\n{} CPUs; load average before: {}, after: {}",
        thread::available_parallelism().map_or(0, |n| n.get()),
        load_before.trim(),
        load().trim()
    );
}

/// A [`NetPair`] whose veth links carry single datagrams.
fn netns(pair: NetPair) -> NetPair {
    for ns in &pair.ns {
        let out = Command::new("ip")
            .args(["-n", ns, "-o", "link", "show", "type", "veth"])
            .output()
            .unwrap();
        let list = String::from_utf8_lossy(&out.stdout);
        let dev = list
            .split(": ")
            .nth(1)
            .and_then(|n| n.split('@').next())
            .expect("a veth device");
        let ok = Command::new("ip")
            .args(["-n", ns, "link", "set", "dev", dev, "gso_max_segs", "1"])
            .status()
            .unwrap()
            .success();
        assert!(ok, "gso_max_segs on {dev}");
    }
    pair
}

enum Env {
    Loopback,
    Netns(Box<NetPair>),
}

impl Env {
    fn name(&self) -> &'static str {
        match self {
            Env::Loopback => "loopback",
            Env::Netns(_) => "netns (veth)",
        }
    }

    /// The address of end `side` (0 sends, 1 receives / answers).
    fn addr(&self, side: usize) -> Ipv4Addr {
        match self {
            Env::Loopback => Ipv4Addr::LOCALHOST,
            Env::Netns(p) => p.addr[side],
        }
    }

    fn spawn(&self, side: usize, spec: &str) -> Proc {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match self {
            Env::Loopback => Command::new(exe),
            Env::Netns(p) => p.command(side, exe),
        };
        cmd.args(["--role", spec]);
        Proc::spawn(cmd, spec)
    }

    fn set_loss(&mut self, permille: u32) {
        if let Env::Netns(p) = self {
            p.set_loss(1, permille).unwrap();
        }
    }
}

fn us(ns: f64) -> String {
    format!("{:.1}", ns / 1000.0)
}

fn gbit(octets_per_s: f64) -> String {
    format!("{:.2}", octets_per_s * 8.0 / 1e9)
}

/// Latency and bandwidth rows; returns the lossless Write-Record rate
/// (offload on).
fn measure(env: &Env, latency_only: bool, rows: &mut Vec<[String; 5]>) -> f64 {
    let (a, b) = (env.addr(0), env.addr(1));
    // 1. Latency.
    let lat = |kind: &str| {
        let mut srv = env.spawn(1, &format!("{kind}-server ip={b}"));
        let r = srv.expect("ready");
        let mut cli = env.spawn(
            0,
            &format!(
                "{kind}-client ip={a} to={b} port={} qpn={}",
                r.get::<u16>("port"),
                r.get::<u32>("qpn")
            ),
        );
        let res = cli.expect("result");
        srv.tell("stop");
        (
            res.get::<f64>("p50"),
            res.get::<f64>("p99"),
            res.get::<u64>("samples"),
        )
    };
    let (u50, u99, un) = lat("lat-ud");
    let (r50, r99, rn) = lat("lat-raw");
    rows.push([
        env.name().into(),
        "64 B one-way latency p50 / p99 (µs): UD Send vs raw UDP, busy-poll".into(),
        format!("{} / {} ({un} samples)", us(u50), us(u99)),
        format!("{} / {} ({rn} samples)", us(r50), us(r99)),
        format!("{:.2} / {:.2}", u50 / r50, u99 / r99),
    ]);
    // 2. Bandwidth.
    let mut lossless = 0.0;
    if latency_only {
        return lossless;
    }
    for offload in [true, false] {
        let mut wr_rx = env.spawn(1, &format!("bw-wr-recv ip={b} offload={offload}"));
        let r = wr_rx.expect("ready");
        let mut wr_tx = env.spawn(
            0,
            &format!(
                "bw-wr-send ip={a} to={b} port={} qpn={} stag={} base={} offload={offload} rate=0",
                r.get::<u16>("port"),
                r.get::<u32>("qpn"),
                r.get::<u32>("stag"),
                r.get::<u64>("base")
            ),
        );
        let sent = wr_tx.expect("sent");
        thread::sleep(Duration::from_millis(300));
        wr_rx.tell("stop");
        let wr = wr_rx.expect("result");
        let mut raw_rx = env.spawn(1, &format!("bw-raw-recv ip={b} gro={offload}"));
        let r = raw_rx.expect("ready");
        let mut raw_tx = env.spawn(
            0,
            &format!(
                "bw-raw-send ip={a} to={b} port={} gso={offload}",
                r.get::<u16>("port")
            ),
        );
        let raw_sent = raw_tx.expect("sent");
        thread::sleep(Duration::from_millis(300));
        raw_rx.tell("stop");
        let raw = raw_rx.expect("result");
        let (w, x) = (wr.get::<f64>("rate"), raw.get::<f64>("rate"));
        let what = if offload {
            "64 KiB Write-Record vs raw UDP blast, same datagrams (Gbit/s received): GSO+GRO both"
        } else {
            "64 KiB Write-Record vs raw UDP blast, same datagrams (Gbit/s received): no offload"
        };
        rows.push([
            env.name().into(),
            what.into(),
            format!(
                "{} (offered {}, {:.1} % complete msgs)",
                gbit(w),
                gbit(sent.get("rate")),
                100.0 * wr.get::<f64>("complete") / sent.get::<f64>("messages")
            ),
            format!("{} (offered {})", gbit(x), gbit(raw_sent.get("rate"))),
            format!("{:.2}", w / x),
        ]);
        if offload {
            lossless = w;
        }
    }
    lossless
}

/// 3.: both offered at half the lossless Write-Record rate.
fn loss(env: &mut Env, lossless: f64, rows: &mut Vec<[String; 5]>) {
    env.set_loss(10);
    let (a, b) = (env.addr(0), env.addr(1));
    let rate = (lossless / 2.0).max(10e6) as u64;
    let mut wr_rx = env.spawn(1, &format!("bw-wr-recv ip={b} offload=true"));
    let r = wr_rx.expect("ready");
    let mut wr_tx = env.spawn(
        0,
        &format!(
            "bw-wr-send ip={a} to={b} port={} qpn={} stag={} base={} offload=true rate={rate}",
            r.get::<u16>("port"),
            r.get::<u32>("qpn"),
            r.get::<u32>("stag"),
            r.get::<u64>("base")
        ),
    );
    let wr_sent = wr_tx.expect("sent");
    thread::sleep(Duration::from_millis(300));
    wr_rx.tell("stop");
    let wr = wr_rx.expect("result");
    let mut ud_rx = env.spawn(1, &format!("bw-ud-recv ip={b}"));
    let r = ud_rx.expect("ready");
    let mut ud_tx = env.spawn(
        0,
        &format!(
            "bw-ud-send ip={a} to={b} port={} qpn={} rate={rate}",
            r.get::<u16>("port"),
            r.get::<u32>("qpn")
        ),
    );
    let ud_sent = ud_tx.expect("sent");
    thread::sleep(Duration::from_millis(300));
    ud_rx.tell("stop");
    let ud = ud_rx.expect("result");
    env.set_loss(0);
    let (w, u) = (wr.get::<f64>("rate"), ud.get::<f64>("rate"));
    rows.push([
        format!("{} 1 % loss", env.name()),
        format!(
            "64 KiB goodput at {} Gbit/s offered (Gbit/s): Write-Record octets valid vs UD Send \
             complete messages",
            gbit(rate as f64)
        ),
        format!(
            "{} ({:.1} % of messages complete)",
            gbit(w),
            100.0 * wr.get::<f64>("complete") / wr_sent.get::<f64>("messages")
        ),
        format!(
            "{} (UD, {:.1} % of messages delivered)",
            gbit(u),
            100.0 * ud.get::<f64>("delivered") / ud_sent.get::<f64>("messages")
        ),
        format!("{:.2}", w / u),
    ]);
}

// ---------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------

/// `key=value` words.
#[derive(Debug, Clone, Default)]
struct Kv(HashMap<String, String>);

impl Kv {
    fn parse<'a>(words: impl IntoIterator<Item = &'a str>) -> Kv {
        Kv(words
            .into_iter()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    fn get<T: FromStr>(&self, key: &str) -> T
    where
        T::Err: Debug,
    {
        let v = self
            .0
            .get(key)
            .unwrap_or_else(|| panic!("no `{key}` in {:?}", self.0));
        v.parse().unwrap_or_else(|e| panic!("`{key}={v}`: {e:?}"))
    }
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// A child running one role; killed and reaped when dropped.
struct Proc {
    spec: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(mut cmd: Command, spec: &str) -> Proc {
        eprintln!("[{:?}] {spec}", START.get_or_init(Instant::now).elapsed());
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            spec: spec.to_string(),
            stdin: child.stdin.take(),
            child,
            lines,
        }
    }

    fn expect(&mut self, word: &str) -> Kv {
        match self.lines.recv_timeout(Duration::from_secs(120)) {
            Ok(line) => {
                let mut w = line.split_whitespace();
                assert_eq!(w.next(), Some(word), "`{}` said `{line}`", self.spec);
                Kv::parse(w)
            }
            Err(e) => panic!("`{}`: no `{word}`: {e}", self.spec),
        }
    }

    fn tell(&mut self, line: &str) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = writeln!(s, "{line}").and_then(|()| s.flush());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stdin = None;
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn say(line: &str) {
    println!("{line}");
}

/// Lines from the driver; the process exits when it goes away.
fn commands() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                return;
            }
        }
        std::process::exit(0);
    });
    rx
}

fn role(spec: &str) {
    // Whatever happens, no child outlives two minutes.
    thread::spawn(|| {
        thread::sleep(Duration::from_secs(120));
        std::process::exit(3);
    });
    let mut words = spec.split_whitespace();
    let name = words.next().unwrap_or_default().to_string();
    let kv = Kv::parse(words);
    match name.as_str() {
        "lat-ud-server" => lat_ud_server(&kv),
        "lat-ud-client" => lat_ud_client(&kv),
        "lat-raw-server" => lat_raw_server(&kv),
        "lat-raw-client" => lat_raw_client(&kv),
        "bw-wr-recv" => bw_wr_recv(&kv),
        "bw-wr-send" => bw_wr_send(&kv),
        "bw-ud-recv" => bw_ud_recv(&kv),
        "bw-ud-send" => bw_ud_send(&kv),
        "bw-raw-recv" => bw_raw_recv(&kv),
        "bw-raw-send" => bw_raw_send(&kv),
        other => panic!("unknown role {other}"),
    }
}

// ---------------------------------------------------------------------
// Engine helpers
// ---------------------------------------------------------------------

/// Heap memory the engine may write: accessed only through its pointer.
struct Mem {
    _backing: Vec<u8>,
    ptr: *mut u8,
    len: usize,
}

impl Mem {
    fn new(len: usize) -> Mem {
        let mut backing = vec![0x5Au8; len];
        let ptr = backing.as_mut_ptr();
        Mem {
            _backing: backing,
            ptr,
            len,
        }
    }

    fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }

    fn register(&self, ctx: &Context, pd: u32) -> u32 {
        // SAFETY: every role declares its `Mem` before its context, so the
        // memory outlives the context's use of it.
        unsafe {
            ctx.registry()
                .register(self.ptr, self.len, self.ptr as u64, RW, pd)
        }
        .unwrap()
    }
}

struct End {
    // Dropped in this order: QP, CQ, context.
    qp: DgramQpHandle,
    cq: Arc<Cq>,
    ctx: Context,
    pd: u32,
}

/// A context (the `SOFTRDMA_*` environment, MTU 1500, offload as given)
/// with one UD QP on `ip`.
fn end(ip: Ipv4Addr, offload: bool, depth: usize) -> End {
    let ctx = Context::with_config(Config {
        dgram_mtu: MTU,
        dgram_offload: offload,
        ..Config::from_env().expect("SOFTRDMA_* settings")
    })
    .unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(1 << 16, None);
    let qp = ctx
        .create_ud_qp(
            pd,
            QpCaps {
                max_send_wr: depth,
                max_recv_wr: depth,
            },
            cq.clone(),
            cq.clone(),
            UdOptions {
                bind: SocketAddr::from((ip, 0)),
                mtu: Some(MTU),
                ..UdOptions::default()
            },
        )
        .unwrap();
    End { qp, cq, ctx, pd }
}

fn blank() -> Completion {
    Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }
}

fn dest_of(kv: &Kv) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(kv.get("to")),
        port: kv.get("port"),
        qpn: kv.get("qpn"),
    }
}

fn send_wr(id: u64, op: SendOp, addr: u64, len: usize, stag: u32, signaled: bool) -> SendWr {
    SendWr {
        wr_id: id,
        op,
        payload: Payload::Sgl(SgList::single(addr, len as u32, stag)),
        flags: SendFlags {
            signaled,
            ..SendFlags::default()
        },
    }
}

const SEND: SendOp = SendOp::Send {
    imm: None,
    invalidate: None,
};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report_latency(mut one_way: Vec<f64>, lost: u64) {
    one_way.sort_by(f64::total_cmp);
    if one_way.is_empty() {
        one_way.push(f64::NAN);
    }
    say(&format!(
        "result p50={} p99={} samples={} lost={lost}",
        percentile(&one_way, 0.5),
        percentile(&one_way, 0.99),
        one_way.len()
    ));
}

// ---------------------------------------------------------------------
// 1. Latency
// ---------------------------------------------------------------------

fn lat_ud_server(kv: &Kv) {
    let mem = Mem::new(2 * 4096);
    let e = end(kv.get("ip"), true, 64);
    let stag = mem.register(&e.ctx, e.pd);
    for i in 0..32 {
        e.qp.post_recv(RecvWr {
            wr_id: i,
            sgl: SgList::single(mem.addr(0), 64, stag),
        })
        .unwrap();
    }
    let me = e.qp.local_addr();
    say(&format!("ready port={} qpn={}", me.port, me.qpn));
    let cmds = commands();
    let mut buf = [blank(); 16];
    let (mut n, mut idle) = (0u64, 0u64);
    loop {
        let k = e.cq.poll(&mut buf);
        idle += u64::from(k == 0);
        for c in &buf[..k] {
            if c.wc.opcode != WcOpcode::Recv {
                continue;
            }
            e.qp.post_recv(RecvWr {
                wr_id: c.wc.wr_id,
                sgl: SgList::single(mem.addr(0), 64, stag),
            })
            .unwrap();
            let wr = send_wr(0, SEND, mem.addr(4096), 64, stag, n % 16 == 0);
            e.qp.post_send(wr, c.wc.src.unwrap()).unwrap();
            n += 1;
        }
        if idle % 1024 == 1023 && cmds.try_recv().is_ok() {
            break;
        }
    }
}

fn lat_ud_client(kv: &Kv) {
    let mem = Mem::new(2 * 4096);
    let e = end(kv.get("ip"), true, 64);
    let stag = mem.register(&e.ctx, e.pd);
    let dest = dest_of(kv);
    let mut buf = [blank(); 16];
    let mut times = Vec::with_capacity(ITERS);
    let (start, mut lost, mut armed) = (Instant::now(), 0u64, false);
    for i in 0..WARMUP + ITERS {
        if start.elapsed() > LAT_BUDGET {
            break;
        }
        if !armed {
            e.qp.post_recv(RecvWr {
                wr_id: 1,
                sgl: SgList::single(mem.addr(0), 64, stag),
            })
            .unwrap();
            armed = true;
        }
        let t = Instant::now();
        let wr = send_wr(0, SEND, mem.addr(4096), 64, stag, i % 16 == 0);
        e.qp.post_send(wr, dest).unwrap();
        'wait: while t.elapsed() < PONG_WAIT {
            let k = e.cq.poll(&mut buf);
            for c in &buf[..k] {
                if c.wc.opcode == WcOpcode::Recv {
                    armed = false;
                    break 'wait;
                }
            }
        }
        if armed {
            lost += 1;
        } else if i >= WARMUP {
            times.push(t.elapsed().as_nanos() as f64 / 2.0);
        }
    }
    report_latency(times, lost);
}

fn raw_socket(ip: Ipv4Addr) -> UdpSocket {
    let s = UdpSocket::bind((ip, 0)).unwrap();
    let fd = s.as_raw_fd();
    for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        let v: libc::c_int = 4 << 20;
        // SAFETY: setsockopt with a live int and its size.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    s
}

fn lat_raw_server(kv: &Kv) {
    let s = raw_socket(kv.get("ip"));
    s.set_nonblocking(true).unwrap();
    say(&format!(
        "ready port={} qpn=0",
        s.local_addr().unwrap().port()
    ));
    let cmds = commands();
    let mut buf = [0u8; 2048];
    let mut idle = 0u64;
    loop {
        match s.recv_from(&mut buf) {
            Ok((len, from)) => {
                s.send_to(&buf[..len], from).unwrap();
            }
            Err(_) => {
                idle += 1;
                if idle.is_multiple_of(4096) && cmds.try_recv().is_ok() {
                    break;
                }
            }
        }
    }
}

fn lat_raw_client(kv: &Kv) {
    let s = raw_socket(kv.get("ip"));
    s.set_nonblocking(true).unwrap();
    let to = SocketAddr::from((kv.get::<Ipv4Addr>("to"), kv.get::<u16>("port")));
    let msg = [0x5Au8; 64];
    let mut buf = [0u8; 2048];
    let mut times = Vec::with_capacity(ITERS);
    let (start, mut lost) = (Instant::now(), 0u64);
    for i in 0..WARMUP + ITERS {
        if start.elapsed() > LAT_BUDGET {
            break;
        }
        let t = Instant::now();
        s.send_to(&msg, to).unwrap();
        let mut got = false;
        while !got && t.elapsed() < PONG_WAIT {
            got = s.recv_from(&mut buf).is_ok();
        }
        if !got {
            lost += 1;
        } else if i >= WARMUP {
            times.push(t.elapsed().as_nanos() as f64 / 2.0);
        }
    }
    report_latency(times, lost);
}

// ---------------------------------------------------------------------
// 2./3. Bandwidth
// ---------------------------------------------------------------------

/// Target slots of the Write-Record receiver.
const SLOTS: usize = 64;

/// Sleeps until `sent` octets are due at `rate` (0: no pacing).
fn pace(start: Instant, sent: usize, rate: u64) {
    if rate == 0 {
        return;
    }
    let due = start + Duration::from_secs_f64(sent as f64 / rate as f64);
    let now = Instant::now();
    if due > now {
        thread::sleep(due - now);
    }
}

/// Posts `wr`, reaping send completions while the queue is full.
fn post(e: &End, wr: SendWr, dest: DgramAddr, buf: &mut [Completion]) {
    loop {
        match e.qp.post_send(wr, dest) {
            Ok(()) => return,
            Err(QpError::QueueFull) => {
                e.cq.poll(buf);
            }
            Err(err) => panic!("post_send: {err:?}"),
        }
    }
}

/// Sends 64 KiB messages of `op(i)` for [`SECONDS`] at `rate`.
fn blast(e: &End, dest: DgramAddr, rate: u64, mut op: impl FnMut(usize) -> (SendOp, u64, u32)) {
    let mut buf = [blank(); 64];
    let start = Instant::now();
    let mut sent = 0usize;
    let mut i = 0;
    while start.elapsed().as_secs_f64() < SECONDS {
        pace(start, sent, rate);
        let (o, addr, stag) = op(i);
        post(
            e,
            send_wr(i as u64, o, addr, MSG, stag, i % 16 == 0),
            dest,
            &mut buf,
        );
        e.cq.poll(&mut buf);
        sent += MSG;
        i += 1;
    }
    let dt = start.elapsed().as_secs_f64();
    say(&format!("sent messages={i} rate={}", sent as f64 / dt));
}

fn bw_wr_recv(kv: &Kv) {
    let mem = Mem::new(SLOTS * MSG);
    let e = end(kv.get("ip"), kv.get("offload"), 64);
    e.qp.set_record_partial_timeout(Duration::from_millis(10));
    let stag = mem.register(&e.ctx, e.pd);
    let me = e.qp.local_addr();
    say(&format!(
        "ready port={} qpn={} stag={stag} base={}",
        me.port,
        me.qpn,
        mem.addr(0)
    ));
    let cmds = commands();
    let mut buf = [blank(); 256];
    let (mut octets, mut complete, mut records) = (0u64, 0u64, 0u64);
    let (mut first, mut last) = (None, Instant::now());
    loop {
        let k = e.cq.poll(&mut buf);
        if k > 0 {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
        }
        for c in &buf[..k] {
            if c.wc.opcode == WcOpcode::RecvWriteRecord {
                octets += u64::from(c.wc.byte_len);
                records += 1;
                complete += u64::from(c.wc.status == WcStatus::Success);
            }
        }
        if k == 0 && cmds.try_recv().is_ok() {
            break;
        }
    }
    let span = first.map_or(1e-9, |f| (last - f).as_secs_f64().max(1e-9));
    say(&format!(
        "result rate={} records={records} complete={complete}",
        octets as f64 / span
    ));
}

fn bw_wr_send(kv: &Kv) {
    let mem = Mem::new(MSG);
    let e = end(kv.get("ip"), kv.get("offload"), 256);
    let stag = mem.register(&e.ctx, e.pd);
    let (rstag, base): (u32, u64) = (kv.get("stag"), kv.get("base"));
    blast(&e, dest_of(kv), kv.get("rate"), |i| {
        (
            SendOp::WriteRecord {
                remote_addr: base + ((i % SLOTS) * MSG) as u64,
                rkey: rstag,
            },
            mem.addr(0),
            stag,
        )
    });
}

fn bw_ud_recv(kv: &Kv) {
    const RQ: usize = 256;
    let mem = Mem::new(RQ * MSG);
    let e = end(kv.get("ip"), true, RQ);
    let stag = mem.register(&e.ctx, e.pd);
    let recv = |i: u64| RecvWr {
        wr_id: i,
        sgl: SgList::single(mem.addr(i as usize * MSG), MSG as u32, stag),
    };
    for i in 0..RQ as u64 {
        e.qp.post_recv(recv(i)).unwrap();
    }
    let me = e.qp.local_addr();
    say(&format!("ready port={} qpn={}", me.port, me.qpn));
    let cmds = commands();
    let mut buf = [blank(); 256];
    let (mut octets, mut delivered) = (0u64, 0u64);
    let (mut first, mut last) = (None, Instant::now());
    loop {
        let k = e.cq.poll(&mut buf);
        if k > 0 {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
        }
        for c in &buf[..k] {
            if c.wc.status == WcStatus::Success {
                octets += u64::from(c.wc.byte_len);
                delivered += 1;
            }
            e.qp.post_recv(recv(c.wc.wr_id)).unwrap();
        }
        if k == 0 && cmds.try_recv().is_ok() {
            break;
        }
    }
    let span = first.map_or(1e-9, |f| (last - f).as_secs_f64().max(1e-9));
    let softrdma_engine::dgram::ProtoStats::Ud(s) = e.qp.stats().proto else {
        unreachable!()
    };
    say(&format!(
        "result rate={} delivered={delivered} timeouts={} evicted={} no_recv={}",
        octets as f64 / span,
        s.rx_timeouts,
        s.rx_evicted,
        s.rx_no_recv
    ));
}

fn bw_ud_send(kv: &Kv) {
    let mem = Mem::new(MSG);
    let e = end(kv.get("ip"), true, 256);
    let stag = mem.register(&e.ctx, e.pd);
    blast(&e, dest_of(kv), kv.get("rate"), |_| {
        (SEND, mem.addr(0), stag)
    });
}

/// The raw blast: the UDP payload sizes of one 64 KiB Write-Record.
fn wr_sizes() -> Vec<usize> {
    let mut v = vec![WR_DGRAM; WR_FULL];
    v.push(WR_TAIL);
    v
}

fn bw_raw_send(kv: &Kv) {
    let s = raw_socket(kv.get("ip"));
    let gso: bool = kv.get("gso");
    let to = SocketAddr::from((kv.get::<Ipv4Addr>("to"), kv.get::<u16>("port")));
    let SocketAddr::V4(to) = to else {
        unreachable!()
    };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: to.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(to.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    let sizes = wr_sizes();
    let payload = vec![0x5Au8; sizes.iter().sum()];
    // The message's datagrams in batches of BATCH, as the engine sends
    // them; with GSO each batch is one run (its last datagram may be
    // shorter), else one entry per datagram.
    let mut offs = Vec::new();
    let mut at = 0;
    for &l in &sizes {
        offs.push((at, l));
        at += l;
    }
    let batches: Vec<&[(usize, usize)]> = offs.chunks(BATCH).collect();
    let fd = s.as_raw_fd();
    let start = Instant::now();
    let mut sent = 0usize;
    let mut calls = 0u64;
    while start.elapsed().as_secs_f64() < SECONDS {
        for b in &batches {
            // SAFETY: all-zero is valid for these C structs.
            let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
            let mut iovs = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; BATCH];
            let mut cmsg = [0u64; 4];
            let n = if gso { 1 } else { b.len() };
            for (k, h) in hdrs.iter_mut().enumerate().take(n) {
                let (o, l) = if gso {
                    (b[0].0, b.iter().map(|x| x.1).sum())
                } else {
                    b[k]
                };
                iovs[k] = libc::iovec {
                    iov_base: payload[o..].as_ptr() as *mut libc::c_void,
                    iov_len: l,
                };
                let h = &mut h.msg_hdr;
                h.msg_name = &sin as *const libc::sockaddr_in as *mut libc::c_void;
                h.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
                h.msg_iov = &mut iovs[k];
                h.msg_iovlen = 1;
                if gso && b.len() > 1 {
                    h.msg_control = cmsg.as_mut_ptr() as *mut libc::c_void;
                    // SAFETY: CMSG macros over the 32-octet `cmsg` buffer,
                    // which holds one u16 control message.
                    unsafe {
                        h.msg_controllen = libc::CMSG_SPACE(size_of::<u16>() as u32) as _;
                        let cm = libc::CMSG_FIRSTHDR(h);
                        (*cm).cmsg_level = SOL_UDP;
                        (*cm).cmsg_type = UDP_SEGMENT;
                        (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                        std::ptr::write_unaligned(libc::CMSG_DATA(cm) as *mut u16, b[0].1 as u16);
                    }
                }
            }
            let mut done = 0;
            while done < n {
                // SAFETY: `hdrs[done..n]` point at live iovecs, address and
                // control buffer; the socket is ours (blocking).
                let r = unsafe {
                    libc::sendmmsg(fd, hdrs.as_mut_ptr().add(done), (n - done) as u32, 0)
                };
                calls += 1;
                assert!(r > 0, "sendmmsg: {}", std::io::Error::last_os_error());
                done += r as usize;
            }
            sent += b.iter().map(|x| x.1).sum::<usize>();
        }
    }
    let dt = start.elapsed().as_secs_f64();
    say(&format!("sent rate={} calls={calls}", sent as f64 / dt));
}

fn bw_raw_recv(kv: &Kv) {
    let s = raw_socket(kv.get("ip"));
    let gro: bool = kv.get("gro");
    let fd = s.as_raw_fd();
    if gro {
        let v: libc::c_int = 1;
        // SAFETY: setsockopt with a live int.
        unsafe {
            libc::setsockopt(
                fd,
                SOL_UDP,
                UDP_GRO,
                &v as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    say(&format!(
        "ready port={} qpn=0",
        s.local_addr().unwrap().port()
    ));
    let cmds = commands();
    const BUF: usize = 65536;
    let mut bufs = vec![0u8; BATCH * BUF];
    let mut cmsgs = [[0u64; 8]; BATCH];
    let (mut octets, mut first, mut last) = (0u64, None, Instant::now());
    loop {
        // SAFETY: all-zero is valid for these C structs.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        let mut iovs = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; BATCH];
        for (i, h) in hdrs.iter_mut().enumerate() {
            iovs[i] = libc::iovec {
                iov_base: bufs[i * BUF..].as_mut_ptr() as *mut libc::c_void,
                iov_len: BUF,
            };
            h.msg_hdr.msg_iov = &mut iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = cmsgs[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_controllen = 64;
        }
        // SAFETY: every header points at a live 64 KiB buffer and a
        // 64-octet control buffer.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                hdrs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n > 0 {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            octets += hdrs[..n as usize]
                .iter()
                .map(|h| u64::from(h.msg_len))
                .sum::<u64>();
        } else if cmds.try_recv().is_ok() {
            break;
        }
    }
    let span = first.map_or(1e-9, |f| (last - f).as_secs_f64().max(1e-9));
    // The Write-Record side counts message octets: scale the datagrams'
    // UDP payload down by the same header + CRC share.
    let share = MSG as f64 / wr_sizes().iter().sum::<usize>() as f64;
    say(&format!(
        "result rate={} share={share}",
        octets as f64 / span * share
    ));
}
