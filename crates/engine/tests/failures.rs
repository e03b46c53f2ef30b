//! Failure paths of the engine over real TCP: a peer killed with SIGKILL,
//! disconnect with work in flight, remote access violations against memory
//! fenced by guard pages, CQ overrun, and many QPs at once.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

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

fn pair(a: &End, b: &End) {
    let l = Listener::bind(&b.ctx, "127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let bqp = b.qp.clone();
    let t = thread::spawn(move || {
        l.accept()
            .unwrap()
            .accept(&bqp, &ConnParams::default())
            .unwrap()
    });
    cm::connect(&a.ctx, &a.qp, addr, &ConnParams::default()).unwrap();
    t.join().unwrap();
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

#[test]
fn remote_violations_touch_nothing_outside_the_region() {
    for case in 0..3 {
        let a = end(64);
        let b = end(64);
        pair(&a, &b);
        let mut src = vec![0xAAu8; 8192];
        let ls = register(&a, &mut src);
        let g = Guarded::new(1000);
        // SAFETY: the guarded mapping outlives both contexts in this scope.
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
        b.qp.post_recv(RecvWr {
            wr_id: 99,
            sgl: SgList::single(base, 8, rs),
        })
        .unwrap();
        a.qp.post_send(SendWr {
            wr_id: 1,
            op,
            payload: Payload::Sgl(SgList::single(src.as_ptr() as u64, 1000, ls)),
            flags: SIGNALED,
        })
        .unwrap();
        let first = collect(&a.cq, 1, Duration::from_secs(5));
        assert_eq!(first[0].wc.status, expect, "case {case}");
        // The target: its receive is flushed, the QP reports an access error.
        let t = collect(&b.cq, 1, Duration::from_secs(5));
        assert_eq!(t[0].wc.status, WcStatus::WrFlushErr);
        let ev = b.ctx.async_events().get(Some(Duration::from_secs(5)));
        assert!(
            matches!(ev, Some(AsyncEvent::CommEstablished { .. })),
            "{ev:?}"
        );
        let ev = b.ctx.async_events().get(Some(Duration::from_secs(5)));
        assert!(
            matches!(ev, Some(AsyncEvent::QpAccessError { .. })),
            "case {case}: {ev:?}"
        );
        // The requester learns of it: later work completes in error.
        let deadline = Instant::now() + Duration::from_secs(5);
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
            let c = collect(&a.cq, 1, Duration::from_secs(5));
            if c[0].wc.status != WcStatus::Success {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "requester never saw the Terminate"
            );
            thread::sleep(Duration::from_millis(10));
        }
        assert!(
            g.bytes().iter().all(|&x| x == 0),
            "case {case}: not one octet placed"
        );
        drop(src);
    }
}

#[test]
fn cq_overrun_is_reported() {
    let a = end(64);
    let b = end(4);
    pair(&a, &b);
    let mut buf = vec![0u8; 64];
    let la = register(&a, &mut buf);
    let mut rbuf = vec![0u8; 64];
    let lb = register(&b, &mut rbuf);
    for i in 0..10 {
        b.qp.post_recv(RecvWr {
            wr_id: i,
            sgl: SgList::single(rbuf.as_ptr() as u64, 64, lb),
        })
        .unwrap();
    }
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
    collect(&a.cq, 10, Duration::from_secs(5));
    let deadline = Instant::now() + Duration::from_secs(5);
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
}

#[test]
fn disconnect_with_work_in_flight_completes_everything() {
    let a = end(1024);
    let b = end(1024);
    pair(&a, &b);
    let mut big = vec![1u8; 8 << 20];
    let la = register(&a, &mut big);
    let mut sink = vec![0u8; 8 << 20];
    let lb = register(&b, &mut sink);
    for i in 0..64 {
        b.qp.post_recv(RecvWr {
            wr_id: 1000 + i,
            sgl: SgList::single(sink.as_ptr() as u64, 1 << 20, lb),
        })
        .unwrap();
    }
    for i in 0..64 {
        let op = if i % 2 == 0 {
            SendOp::Write {
                remote_addr: sink.as_ptr() as u64,
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
    let done = collect(&a.cq, 64, Duration::from_secs(10));
    let mut ids: Vec<u64> = done.iter().map(|c| c.wc.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..64).collect::<Vec<_>>(),
        "every send WR completes exactly once"
    );
    // The peer sees the connection end: its remaining receives flush.
    let got = collect(&b.cq, 64, Duration::from_secs(10));
    let flushed = got
        .iter()
        .filter(|c| c.wc.status == WcStatus::WrFlushErr)
        .count();
    let ok = got
        .iter()
        .filter(|c| c.wc.status == WcStatus::Success)
        .count();
    assert_eq!(flushed + ok, 64);
    assert!(flushed > 0);
}

#[test]
fn many_qps_at_once() {
    let n = 24;
    let a = Context::new().unwrap();
    let b = Context::new().unwrap();
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let cqa = a.create_cq(4096, None);
    let cqb = b.create_cq(4096, None);
    let l = Listener::bind(&b, "127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut src = vec![0u8; 1 << 16];
    for (i, x) in src.iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    // SAFETY: the buffers outlive the contexts' use in this test.
    let ls = unsafe {
        a.registry()
            .register(src.as_mut_ptr(), src.len(), src.as_ptr() as u64, ALL, pa)
    }
    .unwrap();
    let mut dst = vec![0u8; n * (1 << 16)];
    // SAFETY: as above.
    let ld = unsafe {
        b.registry()
            .register(dst.as_mut_ptr(), dst.len(), dst.as_ptr() as u64, ALL, pb)
    }
    .unwrap();
    let mut qps = Vec::new();
    for i in 0..n {
        let qa = a.create_qp(
            100 + i as u32,
            pa,
            QpCaps::default(),
            cqa.clone(),
            cqa.clone(),
        );
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
        let qb2 = qb.clone();
        let l2 = &l;
        thread::scope(|s| {
            s.spawn(move || {
                l2.accept()
                    .unwrap()
                    .accept(&qb2, &ConnParams::default())
                    .unwrap()
            });
            cm::connect(&a, &qa, addr, &ConnParams::default()).unwrap();
        });
        qps.push((qa, qb));
    }
    for (i, (qa, _)) in qps.iter().enumerate() {
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
    collect(&cqa, n, Duration::from_secs(20));
    let got = collect(&cqb, n, Duration::from_secs(20));
    assert!(got
        .iter()
        .all(|c| c.wc.status == WcStatus::Success && c.wc.byte_len == 1 << 16));
    for i in 0..n {
        assert!(dst[i << 16..(i + 1) << 16] == src[..], "QP {i}");
    }
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
