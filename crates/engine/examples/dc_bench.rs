//! dc_bench: SoftDC against RC in the same run, over loopback
//! (`docs/dc.md` §7).
//!
//! ```sh
//! cargo run --release -p softrdma-engine --example dc_bench -- [ITERS] [PEERS] [PARTS]
//! ```
//!
//! PARTS: a comma list of `first`, `lat`, `post`, `bw`, `mem` (default
//! all of them).
//!
//! * **first-message latency**: a DCI posts one 64 B Send to a DCT it has
//!   never reached (a fresh DCT each trial): time from `post_send` to the
//!   receive completion at the DCT (invitation, accept, TCP + MPA set-up,
//!   data). One thread polls both ends. Median and 90th percentile of 50.
//! * **steady-state 64 B Send latency**: ping-pong between two threads
//!   busy-polling (client DCI → server DCT, server DCI → client DCT),
//!   half the round trip, ITERS (default 20 000) after 2 000 warm-up; the
//!   same with two RC QPs connected by `cm`. Ratio DC / RC.
//! * **post overhead**: one thread posts a 64 B RDMA Write and polls its
//!   completion (a Write completes when written to the socket), ITERS
//!   times, DC and RC alternately in 5 rounds: the software cost of the
//!   sender's path (the receiving side's progress thread places the data).
//!   Median per Write, ratio DC / RC.
//! * **1 MiB RDMA Write bandwidth**: 16 outstanding, 1.5 s, DC and RC.
//!   Ratio DC / RC.
//! * **server memory at PEERS (default 1 000) peers**: a server process
//!   (this binary re-run) with one DCT (capacity-16 table), or an RC
//!   listener accepting one QP per peer (shared receive queue); PEERS
//!   peers (DCIs in distinct protection domains, so each needs its own
//!   connection; RC QPs) each send one message. The server's resident
//!   set growth (VmRSS after − before) for each, and the ratio.
//!
//! Everything busy-polls (the mode perftest-style latency uses).

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::cm::{self, ConnParams, Listener};
use softrdma_engine::dc::{DcOptions, DcService, Dci, Dct};
use softrdma_engine::{Completion, Context, Cq, Qp, QpCaps, Srq};
use softrdma_proto::dc::{DcConfig, DcTarget};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    DgramAddr, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
    WorkCompletion,
};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const KEY: u64 = 0xbe_ec;
const NONE: Completion = Completion {
    wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
    qp_num: 0,
};
const SIG: SendFlags = SendFlags {
    signaled: true,
    solicited: false,
    fence: false,
};

/// A registered buffer (leaked for the process's lifetime).
struct Mem {
    ptr: *mut u8,
    stag: u32,
}

// SAFETY: plain octets reached through raw pointers only.
unsafe impl Send for Mem {}
// SAFETY: as above.
unsafe impl Sync for Mem {}

impl Mem {
    fn new(ctx: &Context, pd: u32, len: usize) -> Mem {
        let ptr = Box::leak(vec![0u8; len].into_boxed_slice()).as_mut_ptr();
        let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        // SAFETY: a leaked allocation of `len` octets, valid for ever.
        let stag = unsafe { ctx.registry().register(ptr, len, ptr as u64, acc, pd) }.unwrap();
        Mem { ptr, stag }
    }
    fn sgl(&self, off: usize, len: usize) -> SgList {
        SgList::single(self.ptr as u64 + off as u64, len as u32, self.stag)
    }
}

fn dest(dct: u32) -> DcTarget {
    DcTarget {
        addr: DgramAddr {
            ip: LO,
            port: (dct >> 8) as u16,
            qpn: dct,
        },
        key: KEY,
        local: 0,
    }
}

fn send(wr_id: u64, m: &Mem, len: usize) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Sgl(m.sgl(0, len)),
        flags: SIG,
    }
}

fn post_recvs(srq_or_qp: &dyn Fn(RecvWr), m: &Mem, n: usize) {
    for i in 0..n {
        srq_or_qp(RecvWr {
            wr_id: i as u64,
            sgl: m.sgl(4096 + i * 64, 64),
        });
    }
}

fn dc_opts(cap: usize) -> DcOptions {
    DcOptions {
        table: DcConfig {
            capacity: cap,
            ..DcConfig::default()
        },
        bind_ip: LO,
    }
}

/// One end of a ping-pong: something to send with.
trait PingEnd {
    fn post(&self, wr: SendWr);
}

/// A DC end: DCT + DCI on one CQ.
struct DcEnd {
    _ctx: Context,
    cq: Arc<Cq>,
    srq: Arc<Srq>,
    dct: Dct,
    dci: Dci,
    mem: Mem,
    peer: u32,
}

impl DcEnd {
    fn new() -> DcEnd {
        let ctx = Context::new().unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(4096, None);
        let srq = ctx.create_srq(1024);
        let mem = Mem::new(&ctx, pd, 4096 + 1024 * 64);
        post_recvs(&|wr| srq.post_recv(wr).unwrap(), &mem, 1024);
        let svc = DcService::of(&ctx, dc_opts(16)).unwrap();
        let dct = Dct::new(&svc, pd, cq.clone(), srq.clone(), KEY).unwrap();
        let dci = Dci::new(&svc, pd, cq.clone(), 256);
        DcEnd {
            _ctx: ctx,
            cq,
            srq,
            dct,
            dci,
            mem,
            peer: 0,
        }
    }
}

impl PingEnd for DcEnd {
    fn post(&self, wr: SendWr) {
        self.dci.post_send(wr, dest(self.peer)).unwrap();
    }
}

struct RcEnd {
    _ctx: Context,
    cq: Arc<Cq>,
    qp: Qp,
    mem: Mem,
}

impl PingEnd for RcEnd {
    fn post(&self, wr: SendWr) {
        self.qp.post_send(wr).unwrap();
    }
}

fn rc_pair() -> (RcEnd, RcEnd) {
    let mk = || {
        let ctx = Context::new().unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(4096, None);
        let qp = ctx
            .create_rc_qp(
                pd,
                QpCaps {
                    max_send_wr: 256,
                    max_recv_wr: 1024,
                },
                cq.clone(),
                cq.clone(),
            )
            .unwrap();
        let mem = Mem::new(&ctx, pd, 4096 + 1024 * 64);
        post_recvs(&|wr| qp.post_recv(wr).unwrap(), &mem, 1024);
        RcEnd {
            _ctx: ctx,
            cq,
            qp,
            mem,
        }
    };
    let (a, b) = (mk(), mk());
    let l = Listener::bind(&b._ctx, (LO, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let bqp = b.qp.clone();
    let t = thread::spawn(move || {
        l.accept()
            .unwrap()
            .accept(&bqp, &ConnParams::default())
            .unwrap()
    });
    cm::connect(&a._ctx, &a.qp, (LO, port), &ConnParams::default()).unwrap();
    t.join().unwrap();
    (a, b)
}

/// Completions seen on a CQ and not yet consumed by the loop.
#[derive(Default)]
struct Seen {
    recvs: usize,
    sends: usize,
}

/// Polls `cq` until `recvs` receives (reposted with `repost`) and `sends`
/// send completions are available, then consumes them. Completions that
/// arrive early (a reply before our own send completion) are kept.
fn wait(cq: &Cq, seen: &mut Seen, recvs: usize, sends: usize, repost: &dyn Fn(u64)) {
    let mut buf = [NONE; 16];
    while seen.recvs < recvs || seen.sends < sends {
        let n = cq.poll(&mut buf);
        for c in &buf[..n] {
            assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
            if c.wc.opcode == WcOpcode::Recv {
                repost(c.wc.wr_id);
                seen.recvs += 1;
            } else {
                seen.sends += 1;
            }
        }
    }
    seen.recvs -= recvs;
    seen.sends -= sends;
}

/// `iters` 64 B Writes, each posted and polled to completion by one
/// thread: ns per Write.
fn post_cost(post: &dyn Fn(SendWr), cq: &Cq, m: &Mem, raddr: u64, rkey: u32, iters: usize) -> f64 {
    let mut buf = [NONE; 16];
    let t0 = Instant::now();
    for i in 0..iters {
        post(SendWr {
            wr_id: i as u64,
            op: SendOp::Write {
                remote_addr: raddr,
                rkey,
                imm: None,
            },
            payload: Payload::Sgl(m.sgl(0, 64)),
            flags: SIG,
        });
        loop {
            let n = cq.poll(&mut buf);
            if n > 0 {
                assert!(buf[..n].iter().all(|c| c.wc.status == WcStatus::Success));
                break;
            }
        }
    }
    t0.elapsed().as_nanos() as f64 / iters as f64
}

/// Half round trip of `iters` 64 B ping-pongs, in ns (median, mean).
#[allow(clippy::too_many_arguments)] // both ends, spelled out
fn pingpong<E: PingEnd + Sync>(
    a: &E,
    b: &E,
    cq_a: &Cq,
    cq_b: &Cq,
    ra: &(dyn Fn(u64) + Sync),
    rb: &(dyn Fn(u64) + Sync),
    ma: &Mem,
    mb: &Mem,
    iters: usize,
) -> (f64, f64) {
    let warm = 2000;
    thread::scope(|s| {
        s.spawn(|| {
            let mut seen = Seen::default();
            for i in 0..warm + iters {
                wait(cq_b, &mut seen, 1, 0, rb);
                b.post(send(i as u64, mb, 64));
                wait(cq_b, &mut seen, 0, 1, rb);
            }
        });
        let mut seen = Seen::default();
        let mut samples = Vec::with_capacity(iters);
        for i in 0..warm + iters {
            let t0 = Instant::now();
            a.post(send(i as u64, ma, 64));
            wait(cq_a, &mut seen, 1, 1, ra);
            if i >= warm {
                samples.push(t0.elapsed().as_nanos() as f64 / 2.0);
            }
        }
        samples.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        (samples[samples.len() / 2], mean)
    })
}

/// 1 MiB Writes, 16 outstanding, for `secs`: GB/s.
fn write_bw(post: &dyn Fn(SendWr), cq: &Cq, m: &Mem, raddr: u64, rkey: u32, secs: f64) -> f64 {
    const SZ: usize = 1 << 20;
    let t0 = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    let mut buf = [NONE; 16];
    loop {
        let elapsed = t0.elapsed().as_secs_f64();
        while posted - done < 16 && elapsed < secs {
            post(SendWr {
                wr_id: posted,
                op: SendOp::Write {
                    remote_addr: raddr,
                    rkey,
                    imm: None,
                },
                payload: Payload::Sgl(m.sgl(0, SZ)),
                flags: SIG,
            });
            posted += 1;
        }
        let n = cq.poll(&mut buf);
        for c in &buf[..n] {
            assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
            done += 1;
        }
        if elapsed >= secs && done == posted {
            break;
        }
    }
    (done as f64 * SZ as f64) / t0.elapsed().as_secs_f64() / 1e9
}

fn first_message(trials: usize) -> (f64, f64) {
    let srv = DcEnd::new();
    let cli = DcEnd::new();
    let svc = srv.dct.service().clone();
    let pd_s = 1; // the server context's first PD (DcEnd allocates one)
    let mut lat = Vec::new();
    let mut buf = [NONE; 16];
    // Kept: a destroyed DCT's number may be reused.
    let mut dcts = Vec::new();
    for i in 0..trials {
        dcts.push(Dct::new(&svc, pd_s, srv.cq.clone(), srv.srq.clone(), KEY).unwrap());
        let dct = dcts.last().unwrap();
        let t0 = Instant::now();
        cli.dci
            .post_send(send(i as u64, &cli.mem, 64), dest(dct.number()))
            .unwrap();
        let (mut got_recv, mut got_send) = (false, false);
        while !(got_recv && got_send) {
            let n = srv.cq.poll(&mut buf);
            for c in &buf[..n] {
                assert_eq!(c.wc.status, WcStatus::Success);
                if !got_recv {
                    lat.push(t0.elapsed().as_nanos() as f64);
                }
                got_recv = true;
                srv.srq
                    .post_recv(RecvWr {
                        wr_id: c.wc.wr_id,
                        sgl: srv.mem.sgl(4096 + c.wc.wr_id as usize * 64, 64),
                    })
                    .unwrap();
            }
            let n = cli.cq.poll(&mut buf);
            for c in &buf[..n] {
                assert_eq!(c.wc.status, WcStatus::Success);
                got_send = true;
            }
        }
    }
    lat.sort_by(|x, y| x.partial_cmp(y).unwrap());
    (lat[lat.len() / 2], lat[lat.len() * 9 / 10])
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The server side of the memory comparison (a child process).
fn server_main(kind: &str) {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8192, None);
    let srq = ctx.create_srq(4096);
    let mem = Mem::new(&ctx, pd, 4096 + 4096 * 64);
    post_recvs(&|wr| srq.post_recv(wr).unwrap(), &mem, 4096);
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    thread::spawn(move || {
        let mut l = String::new();
        let _ = std::io::stdin().read_line(&mut l);
        st.store(true, Ordering::Relaxed);
    });
    let _dct;
    if kind == "dc" {
        let svc = DcService::of(&ctx, dc_opts(16)).unwrap();
        let d = Dct::new(&svc, pd, cq.clone(), srq.clone(), KEY).unwrap();
        println!("ready {}", d.number());
        _dct = Some(d);
    } else {
        _dct = None;
        let l = Listener::bind(&ctx, (LO, 0)).unwrap();
        println!("ready {}", l.local_addr().unwrap().port());
        let (ctx2, srq2, cq2) = (ctx.clone(), srq.clone(), cq.clone());
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || loop {
            let Ok(inc) = l.accept() else { return };
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1 << 20);
            let qp = ctx2.create_qp_with_srq(
                NEXT.fetch_add(1, Ordering::Relaxed),
                pd,
                QpCaps {
                    max_send_wr: 1,
                    max_recv_wr: 1,
                },
                cq2.clone(),
                cq2.clone(),
                srq2.clone(),
            );
            inc.accept(&qp, &ConnParams::default()).unwrap();
            if tx.send(qp).is_err() {
                return;
            }
        });
        thread::spawn(move || {
            let mut v = Vec::new();
            while let Ok(q) = rx.recv() {
                v.push(q);
            }
        });
    }
    std::io::stdout().flush().unwrap();
    let mut buf = [NONE; 32];
    while !stop.load(Ordering::Relaxed) {
        let n = cq.poll(&mut buf);
        for c in &buf[..n] {
            let _ = srq.post_recv(RecvWr {
                wr_id: c.wc.wr_id,
                sgl: mem.sgl(4096 + c.wc.wr_id as usize * 64, 64),
            });
        }
        if n == 0 {
            thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Server RSS growth (KiB) with `peers` peers of `kind`.
fn server_memory(kind: &str, peers: usize) -> (u64, u64) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["__server", kind])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let n: u32 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    thread::sleep(Duration::from_millis(300));
    let before = rss_kib(child.id());
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(8192, None);
    let mut buf = [NONE; 64];
    let mut keep_rc = Vec::new();
    let mut keep_dc = Vec::new();
    let mut peak = before;
    let mut mems = Vec::new();
    for i in 0..peers {
        let pd = ctx.alloc_pd();
        let m = Mem::new(&ctx, pd, 4096);
        if kind == "dc" {
            let svc = DcService::of(&ctx, dc_opts(16)).unwrap();
            let dci = Dci::new(&svc, pd, cq.clone(), 4);
            dci.post_send(send(i as u64, &m, 64), dest(n)).unwrap();
            keep_dc.push(dci);
        } else {
            let qp = ctx
                .create_rc_qp(pd, QpCaps::default(), cq.clone(), cq.clone())
                .unwrap();
            cm::connect(&ctx, &qp, (LO, n as u16), &ConnParams::default()).unwrap();
            qp.post_send(send(i as u64, &m, 64)).unwrap();
            keep_rc.push(qp);
        }
        mems.push(m);
        let mut k = cq.poll(&mut buf);
        while k > 0 {
            k = cq.poll(&mut buf);
        }
        if i % 50 == 0 {
            peak = peak.max(rss_kib(child.id()));
        }
    }
    let mut left = peers;
    let deadline = Instant::now() + Duration::from_secs(60);
    // Completions already drained above count too: just wait for quiet.
    while Instant::now() < deadline && left > 0 {
        let k = cq.poll(&mut buf);
        left = left.saturating_sub(k);
        if k == 0 {
            thread::sleep(Duration::from_millis(20));
            if cq.is_empty() {
                break;
            }
        }
    }
    thread::sleep(Duration::from_millis(500));
    let after = rss_kib(child.id());
    peak = peak.max(after);
    let _ = child.stdin.take().map(|mut s| s.write_all(b"x\n"));
    let _ = child.kill();
    let _ = child.wait();
    (after.saturating_sub(before), peak.saturating_sub(before))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__server") {
        server_main(&args[2]);
        return;
    }
    let iters: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let peers: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let parts = args
        .get(3)
        .cloned()
        .unwrap_or_else(|| "first,lat,post,bw,mem".into());
    let part = |p: &str| parts.split(',').any(|x| x == p);

    if part("first") {
        let (fm_med, fm_p90) = first_message(50);
        println!(
            "DC first-message latency (post -> receive at a new DCT): median {:.1} us, p90 {:.1} us",
            fm_med / 1e3,
            fm_p90 / 1e3
        );
    }

    // Steady-state latency.
    let mut a = DcEnd::new();
    let mut b = DcEnd::new();
    a.peer = b.dct.number();
    b.peer = a.dct.number();
    let repost = |e: &DcEnd| {
        let srq = e.srq.clone();
        let sgl0 = e.mem.sgl(4096, 64);
        move |id: u64| {
            let mut s = sgl0;
            s = SgList::single(s.as_slice()[0].addr + id * 64, 64, s.as_slice()[0].lkey);
            srq.post_recv(RecvWr { wr_id: id, sgl: s }).unwrap();
        }
    };
    let (ra, rb) = (repost(&a), repost(&b));
    let (ra2, rb2) = rc_pair();
    let rep_rc = |e: &RcEnd| {
        let qp = e.qp.clone();
        let sgl0 = e.mem.sgl(4096, 64);
        move |id: u64| {
            let s = SgList::single(
                sgl0.as_slice()[0].addr + id * 64,
                64,
                sgl0.as_slice()[0].lkey,
            );
            qp.post_recv(RecvWr { wr_id: id, sgl: s }).unwrap();
        }
    };
    let (rra, rrb) = (rep_rc(&ra2), rep_rc(&rb2));
    if part("lat") {
        let (dc_med, dc_mean) = pingpong(&a, &b, &a.cq, &b.cq, &ra, &rb, &a.mem, &b.mem, iters);
        let (rc_med, rc_mean) = pingpong(
            &ra2, &rb2, &ra2.cq, &rb2.cq, &rra, &rrb, &ra2.mem, &rb2.mem, iters,
        );
        println!(
        "64 B Send latency (half RTT, busy-poll): DC median {:.2} us mean {:.2} us; RC median {:.2} us mean {:.2} us; DC/RC median {:.3}, mean {:.3}",
        dc_med / 1e3,
        dc_mean / 1e3,
        rc_med / 1e3,
        rc_mean / 1e3,
        dc_med / rc_med,
        dc_mean / rc_mean
    );
    }
    // One side only (for `perf stat -e instructions`: counts do not
    // depend on the machine's load).
    if part("post_dc") || part("post_rc") {
        let ns = if part("post_dc") {
            post_cost(
                &|wr| a.post(wr),
                &a.cq,
                &a.mem,
                b.mem.ptr as u64 + 8192,
                b.mem.stag,
                iters,
            )
        } else {
            post_cost(
                &|wr| ra2.post(wr),
                &ra2.cq,
                &ra2.mem,
                rb2.mem.ptr as u64 + 8192,
                rb2.mem.stag,
                iters,
            )
        };
        println!(
            "64 B Write post -> completion: {:.2} us ({parts})",
            ns / 1e3
        );
    }
    if part("post") {
        let (mut d, mut r) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            d.push(post_cost(
                &|wr| a.post(wr),
                &a.cq,
                &a.mem,
                b.mem.ptr as u64 + 8192,
                b.mem.stag,
                iters,
            ));
            r.push(post_cost(
                &|wr| ra2.post(wr),
                &ra2.cq,
                &ra2.mem,
                rb2.mem.ptr as u64 + 8192,
                rb2.mem.stag,
                iters,
            ));
        }
        d.sort_by(|x, y| x.partial_cmp(y).unwrap());
        r.sort_by(|x, y| x.partial_cmp(y).unwrap());
        println!(
            "64 B Write post -> completion, one thread (median of 5 rounds): DC {:.2} us, RC {:.2} us, DC/RC {:.3}",
            d[2] / 1e3,
            r[2] / 1e3,
            d[2] / r[2]
        );
    }

    // Bandwidth: 1 MiB Writes into the peer's buffer.
    if part("bw") {
        let big_a = Mem::new(&a._ctx, 1, 1 << 20);
        let big_b = Mem::new(&b._ctx, 1, 1 << 20);
        let dc_bw = write_bw(
            &|wr| a.post(wr),
            &a.cq,
            &big_a,
            big_b.ptr as u64,
            big_b.stag,
            1.5,
        );
        let big_ra = Mem::new(&ra2._ctx, 1, 1 << 20);
        let big_rb = Mem::new(&rb2._ctx, 1, 1 << 20);
        let rc_bw = write_bw(
            &|wr| ra2.post(wr),
            &ra2.cq,
            &big_ra,
            big_rb.ptr as u64,
            big_rb.stag,
            1.5,
        );
        println!(
        "1 MiB RDMA Write bandwidth (16 outstanding): DC {dc_bw:.2} GB/s, RC {rc_bw:.2} GB/s, DC/RC {:.3}",
        dc_bw / rc_bw
    );
    }
    a.peer = 0;
    drop(a);
    drop(b);
    drop(ra2);
    drop(rb2);

    if !part("mem") {
        return;
    }
    let (dc_mem, dc_peak) = server_memory("dc", peers);
    let (rc_mem, rc_peak) = server_memory("rc", peers);
    println!(
        "server RSS growth at {peers} peers: DC {dc_mem} KiB (peak {dc_peak}), RC {rc_mem} KiB (peak {rc_peak}); DC/RC {:.3}",
        dc_mem as f64 / rc_mem.max(1) as f64
    );
}
