//! Busy-poll parking (engine `progress` module): while an application
//! busy-polls a CQ, the progress thread leaves the QP's socket to it. These
//! tests check that this never loses or strands a message: a poller that
//! stops without arming its CQ still gets its completions from the
//! progress thread, and one that arms the CQ and blocks on the completion
//! channel is woken, whichever order sends, polls and arming come in.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::cm::{self, ConnParams, Listener};
use softrdma_engine::{CompChannel, Completion, Context, Cq, Qp, QpCaps};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

const NONE: Completion = Completion {
    wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
    qp_num: 0,
};

/// Generous: a missing wake-up is a hang, not a slow machine.
const LIMIT: Duration = Duration::from_secs(10);

struct Side {
    ctx: Context,
    cq: Arc<Cq>,
    qp: Qp,
    buf: Vec<u8>,
    stag: u32,
}

fn side(channel: Option<Arc<CompChannel>>) -> Side {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, channel);
    let qp = ctx.create_qp(1, pd, QpCaps::default(), cq.clone(), cq.clone());
    let mut buf = vec![0u8; 4096];
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    // SAFETY: `buf` lives in the returned Side, which outlives the QP's use
    // of it (the contexts are dropped at the end of each test).
    let stag = unsafe {
        ctx.registry()
            .register(buf.as_mut_ptr(), 4096, buf.as_ptr() as u64, access, pd)
    }
    .unwrap();
    Side {
        ctx,
        cq,
        qp,
        buf,
        stag,
    }
}

fn connect(a: &Side, b: &Side) {
    let lis = Listener::bind(&a.ctx, "127.0.0.1:0").unwrap();
    let addr = lis.local_addr().unwrap();
    let (ctx, qp) = (b.ctx.clone(), b.qp.clone());
    let h = thread::spawn(move || {
        cm::connect(&ctx, &qp, addr, &ConnParams::default()).unwrap();
    });
    lis.accept()
        .unwrap()
        .accept(&a.qp, &ConnParams::default())
        .unwrap();
    h.join().unwrap();
}

/// A (whose CQ fires `channel`, if any) with receives 0..`recvs` posted,
/// connected to B.
fn connected(channel: Option<Arc<CompChannel>>, recvs: u64) -> (Side, Side) {
    let a = side(channel);
    let b = side(None);
    for k in 0..recvs {
        a.post_recv(k);
    }
    connect(&a, &b);
    (a, b)
}

impl Side {
    fn post_recv(&self, k: u64) {
        self.qp
            .post_recv(RecvWr {
                wr_id: k,
                sgl: SgList::single(self.buf.as_ptr() as u64 + 64 * k, 64, self.stag),
            })
            .unwrap();
    }

    /// Sends octet `v` (64 octets of it) unsignaled.
    fn send(&self, v: u8) {
        let at = 2048 + 64 * u64::from(v % 16);
        // SAFETY: inside our registered buffer; no work request reads this
        // slot now (each send uses its own and completes before reuse).
        unsafe {
            std::ptr::write_bytes((self.buf.as_ptr() as *mut u8).add(at as usize), v, 64);
        }
        self.qp
            .post_send(SendWr {
                wr_id: u64::from(v),
                op: SendOp::Send {
                    imm: None,
                    invalidate: None,
                },
                payload: Payload::Sgl(SgList::single(self.buf.as_ptr() as u64 + at, 64, self.stag)),
                flags: SendFlags::default(),
            })
            .unwrap();
    }

    /// Busy-polls `n` times, expecting nothing.
    fn spin(&self, n: usize) {
        let mut out = [NONE; 4];
        for _ in 0..n {
            assert_eq!(self.cq.poll(&mut out), 0, "nothing was sent yet");
        }
    }

    /// Waits for a completion without polling the CQ (no inline progress):
    /// only the progress thread can deliver it.
    fn wait_queued(&self) -> Completion {
        let end = Instant::now() + LIMIT;
        while self.cq.is_empty() {
            assert!(Instant::now() < end, "the progress thread never took over");
            thread::sleep(Duration::from_millis(1));
        }
        let mut out = [NONE; 1];
        assert_eq!(self.cq.poll(&mut out), 1);
        out[0]
    }

    fn received(&self, k: u64, v: u8) {
        let slot = &self.buf[64 * k as usize..64 * (k as usize + 1)];
        assert!(slot.iter().all(|&b| b == v), "receive {k} holds {v}");
    }
}

fn recv_ok(c: Completion, k: u64) {
    assert_eq!(c.wc.status, WcStatus::Success, "{:?}", c.wc);
    assert_eq!(c.wc.opcode, WcOpcode::Recv);
    assert_eq!(c.wc.wr_id, k);
    assert_eq!(c.wc.byte_len, 64);
}

/// A poller that spun, then stopped without arming its CQ: the message
/// that arrives afterwards is still completed by the progress thread.
#[test]
fn spinning_then_idle_poller_still_gets_completions() {
    let (a, b) = connected(None, 8);
    for round in 0..4u8 {
        a.spin(1000);
        b.send(round + 1);
        let c = a.wait_queued();
        recv_ok(c, u64::from(round));
        a.received(u64::from(round), round + 1);
    }
}

/// A poller that spun, then armed its CQ and blocked on the channel: the
/// channel fires for a message sent after arming and for one that arrived
/// (and may sit parked in the socket) before arming.
#[test]
fn armed_after_spinning_wakes_the_channel() {
    let ch = CompChannel::new().unwrap();
    let (a, b) = connected(Some(ch.clone()), 8);
    let mut out = [NONE; 1];

    // Sent after arming.
    a.spin(1000);
    a.cq.req_notify(false);
    b.send(1);
    assert_eq!(ch.get_event(Some(LIMIT)), Some(a.cq.id()));
    assert_eq!(a.cq.poll(&mut out), 1);
    recv_ok(out[0], 0);
    a.received(0, 1);

    // Sent while the poller still spins, armed afterwards. Polling stops
    // right after the send, so the message may be parked in the socket.
    a.spin(1000);
    b.send(2);
    a.cq.req_notify(false);
    // Either the progress thread completed it before the CQ was armed (no
    // event then: verbs semantics; the poll after arming finds it), or
    // after (the channel fires).
    let c = if a.cq.poll(&mut out) == 1 {
        out[0]
    } else {
        assert_eq!(ch.get_event(Some(LIMIT)), Some(a.cq.id()));
        assert_eq!(a.cq.poll(&mut out), 1);
        out[0]
    };
    recv_ok(c, 1);
    a.received(1, 2);

    // Many messages in a row, event-driven (arm, poll until empty, wait).
    for v in 3..8u8 {
        a.spin(100);
        b.send(v);
        loop {
            a.cq.req_notify(false);
            if a.cq.poll(&mut out) == 1 {
                break;
            }
            assert_eq!(ch.get_event(Some(LIMIT)), Some(a.cq.id()));
        }
        recv_ok(out[0], u64::from(v) - 1);
        a.received(u64::from(v) - 1, v);
    }
}

/// Two threads: one busy-polls without pause while the other sends a
/// burst; every message completes in order exactly once.
#[test]
fn busy_poller_receives_a_burst_in_order() {
    let (a, b) = connected(None, 32);
    let n = 200u64;
    // Credits: the sender never has more messages out than receives posted.
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sender = {
        let done = done.clone();
        let b_qp = b.qp.clone();
        let (ptr, stag) = (b.buf.as_ptr() as u64, b.stag);
        thread::spawn(move || {
            for i in 0..n {
                let end = Instant::now() + LIMIT;
                while i >= done.load(std::sync::atomic::Ordering::Acquire) + 16 {
                    assert!(Instant::now() < end, "receiver stuck");
                    thread::yield_now();
                }
                let wr = SendWr {
                    wr_id: i,
                    op: SendOp::Send {
                        imm: None,
                        invalidate: None,
                    },
                    payload: Payload::Sgl(SgList::single(ptr + 2048, 64, stag)),
                    flags: SendFlags::default(),
                };
                // Send queue full: the sender's own progress frees it.
                while b_qp.post_send(wr).is_err() {
                    thread::sleep(Duration::from_micros(100));
                }
                if i % 16 == 15 {
                    thread::sleep(Duration::from_millis(2));
                }
            }
        })
    };
    let mut out = [NONE; 8];
    let mut next = 0u64;
    let end = Instant::now() + LIMIT;
    while next < n {
        assert!(Instant::now() < end, "stuck after {next} of {n}");
        let k = a.cq.poll(&mut out);
        for c in &out[..k] {
            assert_eq!(c.wc.status, WcStatus::Success, "{:?}", c.wc);
            assert_eq!(c.wc.wr_id, next % 32, "in order");
            a.post_recv(next % 32);
            next += 1;
            done.store(next, std::sync::atomic::Ordering::Release);
        }
    }
    sender.join().unwrap();
}

/// A burst that inline progress reads in one go, polled one completion at
/// a time: the first goes straight to the poller (the CQ's hand-off), the
/// rest wait in the CQ, and all come back in the order they were made.
#[test]
fn one_completion_per_poll_keeps_a_burst_in_order() {
    let (a, b) = connected(None, 16);
    for round in 0..4u64 {
        a.spin(100);
        for v in 0..12u8 {
            b.send(v + 1);
        }
        let mut out = [NONE; 1];
        let end = Instant::now() + LIMIT;
        let mut got = Vec::new();
        while got.len() < 12 {
            assert!(Instant::now() < end, "only {} of 12", got.len());
            if a.cq.poll(&mut out) == 1 {
                got.push(out[0].wc.wr_id);
                a.post_recv(out[0].wc.wr_id);
            }
        }
        // Receives are consumed in posting order, so completions made in
        // order carry these wr_ids (16 posted, 12 taken per round).
        let want: Vec<u64> = (0..12).map(|i| (round * 12 + i) % 16).collect();
        assert_eq!(got, want, "round {round}");
    }
}

/// An armed CQ whose completion a busy poll receives inline still fires
/// its channel: the hand-off to the poller is only for unarmed CQs.
#[test]
fn armed_cq_fires_even_when_its_poller_receives_inline() {
    let ch = CompChannel::new().unwrap();
    let (a, b) = connected(Some(ch.clone()), 8);
    let mut out = [NONE; 4];
    for v in 1..=4u8 {
        a.spin(100);
        a.cq.req_notify(false);
        b.send(v);
        let end = Instant::now() + LIMIT;
        while a.cq.poll(&mut out) == 0 {
            assert!(Instant::now() < end, "message {v} never completed");
        }
        recv_ok(out[0], u64::from(v) - 1);
        assert_eq!(
            ch.get_event(Some(LIMIT)),
            Some(a.cq.id()),
            "the armed CQ fired for message {v}"
        );
        assert_eq!(ch.try_get_event(), None, "once");
    }
}

/// Many connections completing into one CQ (past the CQ's readiness-set
/// threshold, `cq::READY_SET_MIN`): a busy poll reads only the sockets the
/// kernel reports readable, and still gets every message of every QP, in
/// order per QP, and notices a peer that closes (its QP's receives flushed).
#[test]
fn many_connections_on_one_busy_polled_cq() {
    const QPS: u32 = 12;
    const ROUNDS: u32 = 600;
    let (actx, bctx) = (Context::new().unwrap(), Context::new().unwrap());
    let (apd, bpd) = (actx.alloc_pd(), bctx.alloc_pd());
    let (acq, bcq) = (actx.create_cq(4096, None), bctx.create_cq(4096, None));
    let len = 64 * 8 * QPS as usize;
    let (mut abuf, mut bbuf) = (vec![0u8; len], vec![0u8; len]);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    // SAFETY: both buffers outlive the contexts' use of them (the QPs are
    // disconnected and the contexts dropped before the buffers).
    let (astag, bstag) = unsafe {
        (
            actx.registry()
                .register(abuf.as_mut_ptr(), len, abuf.as_ptr() as u64, access, apd)
                .unwrap(),
            bctx.registry()
                .register(bbuf.as_mut_ptr(), len, bbuf.as_ptr() as u64, access, bpd)
                .unwrap(),
        )
    };
    let aqps: Vec<Qp> = (0..QPS)
        .map(|i| actx.create_qp(100 + i, apd, QpCaps::default(), acq.clone(), acq.clone()))
        .collect();
    let bqps: Vec<Qp> = (0..QPS)
        .map(|i| bctx.create_qp(200 + i, bpd, QpCaps::default(), bcq.clone(), bcq.clone()))
        .collect();
    // Receive k of QP i: slot i * 8 + k of A's buffer.
    let slot = |i: usize, k: u64| (i * 8 + k as usize) * 64;
    let post = |i: usize, k: u64| {
        aqps[i]
            .post_recv(RecvWr {
                wr_id: k,
                sgl: SgList::single(abuf.as_ptr() as u64 + slot(i, k) as u64, 64, astag),
            })
            .unwrap();
    };
    for i in 0..QPS as usize {
        for k in 0..8 {
            post(i, k);
        }
    }
    let lis = Listener::bind(&actx, "127.0.0.1:0").unwrap();
    let addr = lis.local_addr().unwrap();
    for (a, b) in aqps.iter().zip(&bqps) {
        let (ctx, qp) = (bctx.clone(), b.clone());
        let h = thread::spawn(move || {
            cm::connect(&ctx, &qp, addr, &ConnParams::default()).unwrap();
        });
        lis.accept()
            .unwrap()
            .accept(a, &ConnParams::default())
            .unwrap();
        h.join().unwrap();
    }
    let qp_index = |qpn: u32| aqps.iter().position(|q| q.qpn() == qpn).unwrap();
    let mut next = vec![0u32; QPS as usize];
    let mut out = [NONE; 16];
    let mut bout = [NONE; 16];
    for r in 0..ROUNDS {
        // Round r: QP r mod QPS of B sends 64 octets of r's low octet.
        let i = (r % QPS) as usize;
        let at = 64 * i;
        let v = (r % 251) as u8;
        bbuf[at..at + 64].fill(v);
        bqps[i]
            .post_send(SendWr {
                wr_id: u64::from(r),
                op: SendOp::Send {
                    imm: None,
                    invalidate: None,
                },
                payload: Payload::Sgl(SgList::single(bbuf.as_ptr() as u64 + at as u64, 64, bstag)),
                flags: SendFlags {
                    signaled: true,
                    ..SendFlags::default()
                },
            })
            .unwrap();
        let end = Instant::now() + LIMIT;
        // B's CQ is polled meanwhile (its progress is inline); a Send
        // completion taken here is counted, not lost.
        let mut b_done = 0;
        let c = loop {
            let n = acq.poll(&mut out[..1]);
            if n == 1 {
                break out[0];
            }
            let m = bcq.poll(&mut bout);
            for w in &bout[..m] {
                assert_eq!(w.wc.status, WcStatus::Success);
            }
            b_done += m;
            assert!(
                Instant::now() < end,
                "round {r}: QP {i}'s message never came"
            );
        };
        assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
        assert_eq!(c.wc.opcode, WcOpcode::Recv);
        let got = qp_index(c.qp_num);
        assert_eq!(got, i, "round {r}: a completion of QP {got}");
        assert_eq!(c.wc.wr_id, u64::from(next[i] % 8), "QP {i} out of order");
        next[i] += 1;
        let k = c.wc.wr_id;
        assert!(
            abuf[slot(i, k)..slot(i, k) + 64].iter().all(|&b| b == v),
            "round {r}: QP {i} receive {k}"
        );
        post(i, k);
        // Wait for the send's completion at B (the slot is reused).
        let end = Instant::now() + LIMIT;
        while b_done == 0 {
            let n = bcq.poll(&mut bout[..1]);
            if n == 1 {
                assert_eq!(bout[0].wc.status, WcStatus::Success);
                b_done += 1;
            }
            assert!(Instant::now() < end, "round {r}: B's Send never completed");
        }
        assert_eq!(b_done, 1, "round {r}: one Send, one completion at B");
    }
    // The polls asked the kernel which sockets were readable (about one
    // per round on an idle host, 480-510 in 600 rounds with the other
    // tests running beside: a message the progress thread delivered first
    // is taken from the queue without a walk).
    assert!(
        acq.ready_set_polls() > 0,
        "A's CQ used its readiness set in {} polls",
        acq.ready_set_polls()
    );
    // B's QP 5 closes its connection: A's QP 5 notices (the busy poll's
    // readiness set reports the close as readable; the progress thread
    // may get there first) and its receives are flushed; the other QPs
    // are untouched.
    bqps[5].disconnect();
    let end = Instant::now() + LIMIT;
    let mut flushed = 0;
    while flushed < 8 {
        let n = acq.poll(&mut out);
        for c in &out[..n] {
            assert_eq!(qp_index(c.qp_num), 5, "{c:?}");
            assert_eq!(c.wc.status, WcStatus::WrFlushErr, "{c:?}");
            flushed += 1;
        }
        assert!(Instant::now() < end, "{flushed} of QP 5's receives flushed");
    }
    for q in aqps.iter().chain(&bqps) {
        q.disconnect();
    }
}
