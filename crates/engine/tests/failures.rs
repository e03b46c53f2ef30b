//! Failure paths of the engine over real TCP loopback between two
//! processes: a peer killed with SIGKILL, disconnect with work in flight,
//! remote access violations against memory fenced by guard pages, CQ
//! overrun, and many QPs at once.
//!
//! Each test plays one end ("a", the connecting side) and re-executes this
//! test binary as the other end (the `peer` test, "b", told its scenario
//! by `SOFTRDMA_FAILURES_PEER`). The peer owns its memory and asserts what
//! it observes there itself. It talks to the test over its standard
//! streams:
//!
//! * stdout `@peer listening PORT`: it listens (the test connects);
//! * stdout `@peer ready ADDR RKEY`: connected, memory registered, receives
//!   posted (ADDR and RKEY name its target buffer, 0 when unused);
//! * stdin `finish`: the test's end is done; the peer runs its last checks;
//! * stdout `@peer ok`: every check passed (then it exits 0).
//!
//! A failed check panics the peer; the test fails unless it saw `@peer ok`
//! and a successful exit, and shows the peer's output. The peer is killed
//! when the test ends early, and kills itself after [`PEER_LIFETIME`].

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

mod child;

use softrdma_engine::cm::{self, ConnParams, Listener};
use softrdma_engine::{AsyncEvent, Completion, Context, Cq, Qp, QpCaps};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

const ALL: Access = Access(1 | 2 | 4 | 8);
const SIGNALED: SendFlags = SendFlags {
    signaled: true,
    solicited: false,
    fence: false,
};
/// How long either end waits for completions or events it expects.
const LIMIT: Duration = Duration::from_secs(20);
/// How long the test waits for a line from the peer, or for it to exit.
const PEER_WAIT: Duration = Duration::from_secs(30);
/// The peer exits on its own after this long, whatever happens.
const PEER_LIFETIME: Duration = Duration::from_secs(60);
/// Names the peer's scenario.
const PEER_ENV: &str = "SOFTRDMA_FAILURES_PEER";
/// Starts each line of the peer's protocol (libtest may print on the same
/// line before it).
const MARK: &str = "@peer ";

fn blank() -> Completion {
    Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }
}

/// Collects `n` completions or panics after `limit`.
fn collect(cq: &Cq, n: usize, limit: Duration) -> Vec<Completion> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [blank(); 32];
    while got.len() < n {
        let k = cq.poll(&mut buf);
        got.extend_from_slice(&buf[..k]);
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions within {limit:?}: {got:?}",
            got.len()
        );
        if k == 0 {
            thread::yield_now();
        }
    }
    got
}

/// Memory with an inaccessible guard page on each side.
struct Guarded {
    base: *mut u8,
    total: usize,
    len: usize,
}

impl Guarded {
    fn new(len: usize) -> Guarded {
        let page = 4096;
        let body = len.div_ceil(page) * page;
        let total = body + 2 * page;
        // SAFETY: anonymous private mapping; no file, checked for failure.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base as *mut u8;
        // SAFETY: both guard pages lie inside the mapping made above.
        unsafe {
            assert_eq!(
                libc::mprotect(base as *mut libc::c_void, page, libc::PROT_NONE),
                0
            );
            assert_eq!(
                libc::mprotect(
                    base.add(page + body) as *mut libc::c_void,
                    page,
                    libc::PROT_NONE
                ),
                0
            );
        }
        Guarded { base, total, len }
    }
    /// Start of the usable memory, placed so it ends exactly at the upper
    /// guard page.
    fn ptr(&self) -> *mut u8 {
        let body = self.total - 2 * 4096;
        // SAFETY: inside the mapping.
        unsafe { self.base.add(4096 + body - self.len) }
    }
    fn bytes(&self) -> Vec<u8> {
        // SAFETY: the usable range is mapped read/write.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len).to_vec() }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.total) };
    }
}

struct End {
    ctx: Context,
    pd: u32,
    cq: Arc<Cq>,
    qp: Qp,
}

fn end(cq_len: usize) -> End {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(cq_len, None);
    let qp = ctx.create_qp(
        7,
        pd,
        QpCaps {
            max_send_wr: 512,
            max_recv_wr: 512,
        },
        cq.clone(),
        cq.clone(),
    );
    End { ctx, pd, cq, qp }
}

fn register(e: &End, buf: &mut [u8]) -> u32 {
    // SAFETY: each test keeps `buf` alive until its contexts are dropped.
    unsafe {
        e.ctx
            .registry()
            .register(buf.as_mut_ptr(), buf.len(), buf.as_ptr() as u64, ALL, e.pd)
    }
    .unwrap()
}

/// The data each of `many_qps_at_once`'s Sends carries.
fn many_pattern() -> Vec<u8> {
    (0..1 << 16).map(|i| (i % 251) as u8).collect()
}

// ---------------------------------------------------------------------
// The test's side: the peer process.

/// The peer process, with this test's protocol on top of [`child::Peer`].
struct Peer(child::Peer);

impl std::ops::Deref for Peer {
    type Target = child::Peer;
    fn deref(&self) -> &child::Peer {
        &self.0
    }
}

impl std::ops::DerefMut for Peer {
    fn deref_mut(&mut self) -> &mut child::Peer {
        &mut self.0
    }
}

impl Peer {
    fn spawn(scenario: &str) -> Peer {
        let cmd = Command::new(std::env::current_exe().unwrap());
        Peer(child::Peer::spawn(
            cmd,
            PEER_ENV,
            scenario,
            scenario.to_string(),
            PEER_WAIT,
        ))
    }

    /// The port the peer listens on.
    fn port(&mut self) -> u16 {
        self.expect("listening")[0].parse().unwrap()
    }

    /// Connects `qp` to the peer's listener.
    fn connect(&mut self, ctx: &Context, qp: &Qp) {
        let port = self.port();
        connect(ctx, qp, port);
    }

    /// Waits until the peer is ready; returns its target buffer's address
    /// and rkey.
    fn ready(&mut self) -> (u64, u32) {
        let w = self.expect("ready");
        (w[0].parse().unwrap(), w[1].parse().unwrap())
    }

    /// Tells the peer the test's end is done and waits for its verdict:
    /// `@peer ok` and exit status 0.
    fn finish(mut self) {
        self.tell("finish");
        self.close_stdin();
        let status = self.wait_exit();
        self.reap();
        let rest = self.pending_lines();
        if !status.success() || rest != ["ok"] {
            self.fail(&format!("exit {status}, last lines {rest:?}"));
        }
    }
}

/// Connects `qp` to a peer's listener on `port`.
fn connect(ctx: &Context, qp: &Qp, port: u16) {
    if let Err(e) = cm::connect(ctx, qp, ("127.0.0.1", port), &ConnParams::default()) {
        panic!("connect to the peer on port {port}: {e}");
    }
}

// ---------------------------------------------------------------------
// The peer process.

/// The peer: runs the scenario named in the environment (nothing without
/// it) and prints `@peer ok` once every check passed.
#[test]
fn peer() {
    let Ok(scenario) = std::env::var(PEER_ENV) else {
        return;
    };
    thread::spawn(|| {
        thread::sleep(PEER_LIFETIME);
        eprintln!("peer: still running after {PEER_LIFETIME:?}, exiting");
        std::process::exit(3);
    });
    match scenario.as_str() {
        "violation-0" => peer_violation(0),
        "violation-1" => peer_violation(1),
        "violation-2" => peer_violation(2),
        "overrun" => peer_overrun(),
        "disconnect" => peer_disconnect(),
        "many" => peer_many(),
        other => panic!("unknown scenario {other}"),
    }
    say("ok");
}

fn say(line: &str) {
    println!("{MARK}{line}");
}

fn listen(ctx: &Context) -> Listener {
    let l = Listener::bind(ctx, "127.0.0.1:0").unwrap();
    say(&format!("listening {}", l.local_addr().unwrap().port()));
    l
}

fn accept(l: &Listener, qp: &Qp) {
    l.accept()
        .unwrap()
        .accept(qp, &ConnParams::default())
        .unwrap();
}

/// Waits for the test's `finish` (its end is done).
fn await_finish() {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "finish", "the test went away");
}

/// The target of a remote access violation: the region is fenced by guard
/// pages in this process, which checks that nothing was placed.
fn peer_violation(case: u32) {
    let b = end(64);
    let l = listen(&b.ctx);
    accept(&l, &b.qp);
    let g = Guarded::new(1000);
    // SAFETY: the guarded mapping outlives the context (declared later,
    // dropped first).
    let rs = unsafe {
        b.ctx.registry().register(
            g.ptr(),
            1000,
            g.ptr() as u64,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            b.pd,
        )
    }
    .unwrap();
    let base = g.ptr() as u64;
    b.qp.post_recv(RecvWr {
        wr_id: 99,
        sgl: SgList::single(base, 8, rs),
    })
    .unwrap();
    say(&format!("ready {base} {rs}"));
    // The receive is flushed, the QP reports an access error.
    let t = collect(&b.cq, 1, LIMIT);
    assert_eq!(
        (t[0].wc.wr_id, t[0].wc.status),
        (99, WcStatus::WrFlushErr),
        "case {case}: {t:?}"
    );
    let ev = b.ctx.async_events().get(Some(LIMIT));
    assert!(
        matches!(ev, Some(AsyncEvent::CommEstablished { .. })),
        "case {case}: {ev:?}"
    );
    let ev = b.ctx.async_events().get(Some(LIMIT));
    assert!(
        matches!(ev, Some(AsyncEvent::QpAccessError { .. })),
        "case {case}: {ev:?}"
    );
    // After the requester has seen its work fail.
    await_finish();
    assert!(
        g.bytes().iter().all(|&x| x == 0),
        "case {case}: not one octet placed"
    );
    let mut more = [blank(); 4];
    let k = b.cq.poll(&mut more);
    assert_eq!(k, 0, "case {case}: more completions {:?}", &more[..k]);
}

/// The side whose CQ of 4 overruns on 10 receive completions.
fn peer_overrun() {
    let b = end(4);
    let l = listen(&b.ctx);
    accept(&l, &b.qp);
    let mut rbuf = vec![0u8; 64];
    let lb = register(&b, &mut rbuf);
    for i in 0..10 {
        b.qp.post_recv(RecvWr {
            wr_id: i,
            sgl: SgList::single(rbuf.as_ptr() as u64, 64, lb),
        })
        .unwrap();
    }
    say("ready 0 0");
    let deadline = Instant::now() + LIMIT;
    while !b.cq.overrun() {
        let mut none = [];
        b.cq.poll(&mut none);
        assert!(Instant::now() < deadline, "overrun not detected");
        thread::sleep(Duration::from_millis(5));
    }
    let mut seen = false;
    while let Some(e) = b.ctx.async_events().try_get() {
        seen |= matches!(e, AsyncEvent::CqError { .. });
    }
    assert!(seen, "CQ error event raised");
    assert_eq!(b.cq.len(), 4, "the CQ keeps what fitted");
    await_finish();
    drop(b);
    drop(rbuf);
}

/// The receiving side of a connection its peer closes with 64 MiB of Sends
/// and Writes in flight.
fn peer_disconnect() {
    let b = end(1024);
    let l = listen(&b.ctx);
    accept(&l, &b.qp);
    let mut sink = vec![0u8; 8 << 20];
    let lb = register(&b, &mut sink);
    for i in 0..64 {
        b.qp.post_recv(RecvWr {
            wr_id: 1000 + i,
            sgl: SgList::single(sink.as_ptr() as u64, 1 << 20, lb),
        })
        .unwrap();
    }
    say(&format!("ready {} {lb}", sink.as_ptr() as u64));
    // The connection ends: the remaining receives flush.
    let got = collect(&b.cq, 64, LIMIT);
    let mut ids: Vec<u64> = got.iter().map(|c| c.wc.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (1000..1064).collect::<Vec<_>>(),
        "every receive completes exactly once"
    );
    let flushed = got
        .iter()
        .filter(|c| c.wc.status == WcStatus::WrFlushErr)
        .count();
    let ok = got
        .iter()
        .filter(|c| c.wc.status == WcStatus::Success)
        .count();
    assert_eq!(flushed + ok, 64, "{got:?}");
    assert!(flushed > 0);
    assert!(
        got.iter()
            .all(|c| c.wc.status != WcStatus::Success || c.wc.byte_len == 1 << 20),
        "{got:?}"
    );
    await_finish();
    drop(b);
    drop(sink);
}

/// The receiving side of 24 connections, each delivering 64 KiB.
fn peer_many() {
    let n = 24;
    let b = Context::new().unwrap();
    let pb = b.alloc_pd();
    let cqb = b.create_cq(4096, None);
    let l = listen(&b);
    let mut dst = vec![0u8; n * (1 << 16)];
    // SAFETY: `dst` outlives the context's use of it (dropped after it).
    let ld = unsafe {
        b.registry()
            .register(dst.as_mut_ptr(), dst.len(), dst.as_ptr() as u64, ALL, pb)
    }
    .unwrap();
    let mut qps = Vec::new();
    for i in 0..n {
        let qb = b.create_qp(
            200 + i as u32,
            pb,
            QpCaps::default(),
            cqb.clone(),
            cqb.clone(),
        );
        qb.post_recv(RecvWr {
            wr_id: i as u64,
            sgl: SgList::single(dst.as_ptr() as u64 + (i << 16) as u64, 1 << 16, ld),
        })
        .unwrap();
        accept(&l, &qb);
        qps.push(qb);
    }
    say("ready 0 0");
    let got = collect(&cqb, n, LIMIT);
    assert!(
        got.iter()
            .all(|c| c.wc.status == WcStatus::Success && c.wc.byte_len == 1 << 16),
        "{got:?}"
    );
    let mut ids: Vec<u64> = got.iter().map(|c| c.wc.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..n as u64).collect::<Vec<_>>());
    let src = many_pattern();
    for i in 0..n {
        assert!(dst[i << 16..(i + 1) << 16] == src[..], "QP {i}");
    }
    await_finish();
    drop(qps);
    drop(cqb);
    drop(b);
    drop(dst);
}

// ---------------------------------------------------------------------
// The tests.

#[test]
fn remote_violations_touch_nothing_outside_the_region() {
    for case in 0..3 {
        let mut src = vec![0xAAu8; 8192];
        let mut peer = Peer::spawn(&format!("violation-{case}"));
        let a = end(64);
        peer.connect(&a.ctx, &a.qp);
        let ls = register(&a, &mut src);
        let (base, rs) = peer.ready();
        let (op, expect) = match case {
            // One octet past the end: would hit the upper guard page.
            0 => (
                SendOp::Write {
                    remote_addr: base + 1,
                    rkey: rs,
                    imm: None,
                },
                WcStatus::Success,
            ),
            // One octet before the start: would hit the lower guard page.
            1 => (
                SendOp::Write {
                    remote_addr: base - 1,
                    rkey: rs,
                    imm: None,
                },
                WcStatus::Success,
            ),
            // Read without REMOTE_READ.
            _ => (
                SendOp::Read {
                    remote_addr: base,
                    rkey: rs,
                },
                WcStatus::RemAccessErr,
            ),
        };
        a.qp.post_send(SendWr {
            wr_id: 1,
            op,
            payload: Payload::Sgl(SgList::single(src.as_ptr() as u64, 1000, ls)),
            flags: SIGNALED,
        })
        .unwrap();
        let first = collect(&a.cq, 1, LIMIT);
        assert_eq!(first[0].wc.status, expect, "case {case}");
        // The requester learns of it: later work completes in error.
        let deadline = Instant::now() + LIMIT;
        loop {
            a.qp.post_send(SendWr {
                wr_id: 2,
                op: SendOp::Send {
                    imm: None,
                    invalidate: None,
                },
                payload: Payload::Sgl(SgList::new()),
                flags: SIGNALED,
            })
            .ok();
            let c = collect(&a.cq, 1, LIMIT);
            if c[0].wc.status != WcStatus::Success {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "requester never saw the Terminate"
            );
            thread::sleep(Duration::from_millis(10));
        }
        // The target saw its receive flushed and the access error, and
        // now checks its guarded memory.
        peer.finish();
        drop(a);
        drop(src);
    }
}

#[test]
fn cq_overrun_is_reported() {
    let mut buf = vec![0u8; 64];
    let mut peer = Peer::spawn("overrun");
    let a = end(64);
    peer.connect(&a.ctx, &a.qp);
    let la = register(&a, &mut buf);
    peer.ready();
    for i in 0..10 {
        a.qp.post_send(SendWr {
            wr_id: i,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(buf.as_ptr() as u64, 8, la)),
            flags: SIGNALED,
        })
        .unwrap();
    }
    collect(&a.cq, 10, LIMIT);
    // The peer saw the overrun flag, the CQ error event, and 4 entries.
    peer.finish();
    drop(a);
    drop(buf);
}

#[test]
fn disconnect_with_work_in_flight_completes_everything() {
    let mut big = vec![1u8; 8 << 20];
    let mut peer = Peer::spawn("disconnect");
    let a = end(1024);
    peer.connect(&a.ctx, &a.qp);
    let la = register(&a, &mut big);
    let (sink, lb) = peer.ready();
    for i in 0..64 {
        let op = if i % 2 == 0 {
            SendOp::Write {
                remote_addr: sink,
                rkey: lb,
                imm: None,
            }
        } else {
            SendOp::Send {
                imm: None,
                invalidate: None,
            }
        };
        a.qp.post_send(SendWr {
            wr_id: i,
            op,
            payload: Payload::Sgl(SgList::single(big.as_ptr() as u64, 1 << 20, la)),
            flags: SIGNALED,
        })
        .unwrap();
    }
    a.qp.disconnect();
    let done = collect(&a.cq, 64, LIMIT);
    let mut ids: Vec<u64> = done.iter().map(|c| c.wc.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..64).collect::<Vec<_>>(),
        "every send WR completes exactly once"
    );
    // The peer saw the connection end: each receive completed once, some
    // flushed.
    peer.finish();
    drop(a);
    drop(big);
}

#[test]
fn many_qps_at_once() {
    let n = 24;
    let mut src = many_pattern();
    let mut peer = Peer::spawn("many");
    let a = Context::new().unwrap();
    let pa = a.alloc_pd();
    let cqa = a.create_cq(4096, None);
    // SAFETY: `src` outlives the context's use of it (dropped after it).
    let ls = unsafe {
        a.registry()
            .register(src.as_mut_ptr(), src.len(), src.as_ptr() as u64, ALL, pa)
    }
    .unwrap();
    let port = peer.port();
    let mut qps = Vec::new();
    for i in 0..n {
        let qa = a.create_qp(
            100 + i as u32,
            pa,
            QpCaps::default(),
            cqa.clone(),
            cqa.clone(),
        );
        connect(&a, &qa, port);
        qps.push(qa);
    }
    peer.ready();
    for (i, qa) in qps.iter().enumerate() {
        qa.post_send(SendWr {
            wr_id: i as u64,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(src.as_ptr() as u64, 1 << 16, ls)),
            flags: SIGNALED,
        })
        .unwrap();
    }
    let got = collect(&cqa, n, LIMIT);
    assert!(
        got.iter().all(|c| c.wc.status == WcStatus::Success),
        "{got:?}"
    );
    // The peer verified each QP's 64 KiB.
    peer.finish();
    drop(qps);
    drop(cqa);
    drop(a);
    drop(src);
}

/// Peer process for `killed_peer_flushes_within_a_second`: accepts one
/// connection on the port given in the environment and waits to be killed.
#[test]
fn peer_process() {
    let Ok(port) = std::env::var("SOFTRDMA_TEST_PEER_PORT") else {
        return;
    };
    let b = end(4096);
    let l = Listener::bind(&b.ctx, ("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    let mut sink = vec![0u8; 1 << 20];
    let lb = register(&b, &mut sink);
    for i in 0..256 {
        b.qp.post_recv(RecvWr {
            wr_id: i,
            sgl: SgList::single(sink.as_ptr() as u64, 1 << 20, lb),
        })
        .unwrap();
    }
    println!("listening");
    l.accept()
        .unwrap()
        .accept(&b.qp, &ConnParams::default())
        .unwrap();
    thread::sleep(Duration::from_secs(60));
}

#[test]
fn killed_peer_flushes_within_a_second() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "peer_process", "--nocapture", "--test-threads=1"])
        .env("SOFTRDMA_TEST_PEER_PORT", port.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let a = end(4096);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match cm::connect(&a.ctx, &a.qp, ("127.0.0.1", port), &ConnParams::default()) {
            Ok(_) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "peer never listened: {e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
    let mut big = vec![3u8; 1 << 20];
    let la = register(&a, &mut big);
    let mut rbuf = vec![0u8; 64];
    let lr = register(&a, &mut rbuf);
    for i in 0..8 {
        a.qp.post_recv(RecvWr {
            wr_id: 500 + i,
            sgl: SgList::single(rbuf.as_ptr() as u64, 64, lr),
        })
        .unwrap();
    }
    // Reads keep work outstanding until the peer answers (it will not).
    for i in 0..8 {
        a.qp.post_send(SendWr {
            wr_id: i,
            op: SendOp::Read {
                remote_addr: 0,
                rkey: 0x100,
            },
            payload: Payload::Sgl(SgList::single(big.as_ptr() as u64, 4096, la)),
            flags: SIGNALED,
        })
        .unwrap();
    }
    thread::sleep(Duration::from_millis(50));
    let killed = Instant::now();
    child.kill().unwrap();
    child.wait().unwrap();
    let got = collect(&a.cq, 16, Duration::from_secs(5));
    let elapsed = killed.elapsed();
    assert!(elapsed < Duration::from_secs(1), "flush took {elapsed:?}");
    assert!(
        got.iter().all(|c| c.wc.status != WcStatus::Success),
        "{got:?}"
    );
    assert_eq!(
        got.iter().filter(|c| c.wc.opcode == WcOpcode::Recv).count(),
        8
    );
}
