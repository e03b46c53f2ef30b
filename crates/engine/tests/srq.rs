//! Shared receive queues over real TCP on loopback, every end in this
//! process: one side has two QPs sharing one SRQ, each connected to its own
//! peer QP (in its own context). Checked: FIFO consumption across QPs with
//! the data and QP number of every completion, receives posted before any
//! connection, the limit event (once per arming), `post_recv` refused on an
//! SRQ QP, and an empty SRQ terminating the sender like a QP without
//! receives.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::cm::{self, ConnParams, Listener};
use softrdma_engine::{AsyncEvent, Completion, Context, Cq, Qp, QpCaps, QpError, QpLinkState, Srq};
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
/// Size of one receive buffer (and of one message slot on the senders).
const SLOT: usize = 4096;
const SLOTS: usize = 64;

fn blank() -> Completion {
    Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }
}

/// Collects `n` completions or panics after 10 s.
fn collect(cq: &Cq, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [blank(); 32];
    while got.len() < n {
        let k = cq.poll(&mut buf[..(n - got.len()).min(32)]);
        got.extend_from_slice(&buf[..k]);
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions within 10 s: {got:?}",
            got.len()
        );
        if k == 0 {
            thread::yield_now();
        }
    }
    got
}

/// Registers `buf` in `pd` of `ctx`.
fn register(ctx: &Context, pd: u32, buf: &mut [u8]) -> u32 {
    // SAFETY: each test keeps `buf` alive until its contexts are dropped.
    unsafe {
        ctx.registry()
            .register(buf.as_mut_ptr(), buf.len(), buf.as_ptr() as u64, ALL, pd)
    }
    .unwrap()
}

/// The side with the SRQ.
struct Server {
    ctx: Context,
    pd: u32,
    cq: Arc<Cq>,
    srq: Arc<Srq>,
    listener: Listener,
    buf: Vec<u8>,
    stag: u32,
}

fn server() -> Server {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(1024, None);
    let srq = ctx.create_srq(SLOTS);
    let listener = Listener::bind(&ctx, "127.0.0.1:0").unwrap();
    let mut buf = vec![0u8; SLOTS * SLOT];
    let stag = register(&ctx, pd, &mut buf);
    Server {
        ctx,
        pd,
        cq,
        srq,
        listener,
        buf,
        stag,
    }
}

impl Server {
    fn qp(&self, qpn: u32) -> Qp {
        self.ctx.create_qp_with_srq(
            qpn,
            self.pd,
            QpCaps::default(),
            self.cq.clone(),
            self.cq.clone(),
            self.srq.clone(),
        )
    }

    /// Posts receives into slots `range` (wr_id = slot).
    fn post(&self, range: std::ops::Range<usize>) {
        let base = self.buf.as_ptr() as u64;
        for i in range {
            self.srq
                .post_recv(RecvWr {
                    wr_id: i as u64,
                    sgl: SgList::single(base + (i * SLOT) as u64, SLOT as u32, self.stag),
                })
                .unwrap();
        }
    }

    fn slot(&self, i: usize, len: usize) -> &[u8] {
        &self.buf[i * SLOT..i * SLOT + len]
    }

    /// The async events queued so far, without the CommEstablished ones.
    fn events(&self) -> Vec<AsyncEvent> {
        std::iter::from_fn(|| self.ctx.async_events().try_get())
            .filter(|e| !matches!(e, AsyncEvent::CommEstablished { .. }))
            .collect()
    }
}

/// A peer: its own context, one QP, `SLOTS` message slots.
struct Peer {
    ctx: Context,
    cq: Arc<Cq>,
    qp: Qp,
    buf: Vec<u8>,
    stag: u32,
}

/// A peer connected to `qp` on the server, with message slot `j` filled
/// with a pattern of `tag` and `j`.
fn peer(s: &Server, qp: &Qp, tag: u8) -> Peer {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(1024, None);
    let pqp = ctx.create_qp(1, pd, QpCaps::default(), cq.clone(), cq.clone());
    let mut buf = vec![0u8; SLOTS * SLOT];
    for (i, b) in buf.iter_mut().enumerate() {
        *b = tag ^ ((i / SLOT) as u8).wrapping_mul(31) ^ (i % 253) as u8;
    }
    let stag = register(&ctx, pd, &mut buf);
    thread::scope(|sc| {
        let t = sc.spawn(|| {
            s.listener
                .accept()
                .unwrap()
                .accept(qp, &ConnParams::default())
                .unwrap()
        });
        cm::connect(
            &ctx,
            &pqp,
            s.listener.local_addr().unwrap(),
            &ConnParams::default(),
        )
        .unwrap();
        t.join().unwrap();
    });
    Peer {
        ctx,
        cq,
        qp: pqp,
        buf,
        stag,
    }
}

impl Peer {
    /// Posts a Send of `len` octets from message slot `j`.
    fn send(&self, j: usize, len: usize) {
        self.qp
            .post_send(SendWr {
                wr_id: j as u64,
                op: SendOp::Send {
                    imm: None,
                    invalidate: None,
                },
                payload: Payload::Sgl(SgList::single(
                    self.buf.as_ptr() as u64 + (j * SLOT) as u64,
                    len as u32,
                    self.stag,
                )),
                flags: SIGNALED,
            })
            .unwrap();
    }

    fn msg(&self, j: usize, len: usize) -> &[u8] {
        &self.buf[j * SLOT..j * SLOT + len]
    }

    fn events(&self) -> Vec<AsyncEvent> {
        std::iter::from_fn(|| self.ctx.async_events().try_get())
            .filter(|e| !matches!(e, AsyncEvent::CommEstablished { .. }))
            .collect()
    }
}

fn len_of(k: usize) -> usize {
    1 + (k * 397) % SLOT
}

#[test]
fn two_qps_take_from_one_srq_in_fifo_order() {
    let s = server();
    // Receives posted before any QP exists, let alone connects.
    s.post(0..16);
    assert_eq!(s.srq.len(), 16);
    let qa = s.qp(11);
    let qb = s.qp(12);
    assert!(Arc::ptr_eq(qa.srq().unwrap(), &s.srq));
    let pa = peer(&s, &qa, 0xA0);
    let pb = peer(&s, &qb, 0x0B);
    assert_eq!(qa.link_state(), QpLinkState::Connected);
    assert_eq!(qb.link_state(), QpLinkState::Connected);
    assert_eq!(s.srq.len(), 16, "connecting takes no receive");

    // One at a time, alternating peers: receive k is taken by message k,
    // whichever QP it arrived on.
    for k in 0..8 {
        let (p, q) = if k % 2 == 0 { (&pa, &qa) } else { (&pb, &qb) };
        let len = len_of(k);
        p.send(k, len);
        assert_eq!(collect(&p.cq, 1)[0].wc.status, WcStatus::Success);
        let c = collect(&s.cq, 1)[0];
        assert_eq!(
            (c.wc.wr_id, c.wc.status, c.wc.opcode, c.wc.byte_len),
            (k as u64, WcStatus::Success, WcOpcode::Recv, len as u32),
            "message {k}"
        );
        assert_eq!(c.qp_num, q.qpn(), "message {k}");
        assert!(s.slot(k, len) == p.msg(k, len), "data of message {k}");
    }
    assert_eq!(s.srq.len(), 8);

    // Both peers at once: 24 messages each into 48 receives.
    s.post(16..56);
    assert_eq!(s.srq.len(), 48);
    let per = 24;
    thread::scope(|sc| {
        for p in [&pa, &pb] {
            sc.spawn(move || {
                for j in 0..per {
                    p.send(j, len_of(j + 100));
                }
                let done = collect(&p.cq, per);
                assert!(done.iter().all(|c| c.wc.status == WcStatus::Success));
            });
        }
    });
    let got = collect(&s.cq, 2 * per);
    let mut all: Vec<u64> = got.iter().map(|c| c.wc.wr_id).collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (8..56).collect::<Vec<u64>>(),
        "each receive taken exactly once, oldest first"
    );
    for (p, q) in [(&pa, &qa), (&pb, &qb)] {
        let mine: Vec<&Completion> = got.iter().filter(|c| c.qp_num == q.qpn()).collect();
        assert_eq!(mine.len(), per, "QP {}", q.qpn());
        assert!(
            mine.windows(2).all(|w| w[0].wc.wr_id < w[1].wc.wr_id),
            "a QP's messages take receives in order: {:?}",
            mine.iter().map(|c| c.wc.wr_id).collect::<Vec<_>>()
        );
        for (j, c) in mine.iter().enumerate() {
            let len = len_of(j + 100);
            assert_eq!(
                (c.wc.status, c.wc.byte_len),
                (WcStatus::Success, len as u32)
            );
            assert!(
                s.slot(c.wc.wr_id as usize, len) == p.msg(j, len),
                "QP {} message {j} in slot {}",
                q.qpn(),
                c.wc.wr_id
            );
        }
    }
    assert!(s.srq.is_empty());
    assert_eq!(s.events(), vec![], "no limit armed, no error");
}

#[test]
fn limit_event_fires_once_per_arming() {
    let s = server();
    assert_eq!(s.srq.arm_limit(SLOTS + 1), Err(QpError::Invalid));
    assert_eq!(s.srq.arm_limit(SLOTS), Ok(()));
    assert_eq!(s.srq.arm_limit(0), Ok(()), "0 disarms");
    let qa = s.qp(21);
    let qb = s.qp(22);
    let pa = peer(&s, &qa, 1);
    let pb = peer(&s, &qb, 2);
    let mut k = 0;
    let mut deliver = |n: usize| {
        for _ in 0..n {
            let p = if k % 2 == 0 { &pa } else { &pb };
            p.send(k % SLOTS, 64);
            assert_eq!(collect(&p.cq, 1)[0].wc.status, WcStatus::Success);
            assert_eq!(collect(&s.cq, 1)[0].wc.status, WcStatus::Success);
            k += 1;
        }
    };
    let want = AsyncEvent::SrqLimitReached { id: s.srq.id() };
    // Events are raised right after the completions they go with.
    let settle = || thread::sleep(Duration::from_millis(50));

    s.post(0..8);
    s.srq.arm_limit(4).unwrap();
    deliver(4); // 7, 6, 5, 4 left: not below 4
    settle();
    assert_eq!(s.events(), vec![], "4 left is not below the limit 4");
    deliver(1); // 3 left
    let ev = s.ctx.async_events().get(Some(Duration::from_secs(5)));
    assert_eq!(ev, Some(want));
    assert_eq!(s.srq.len(), 3);
    deliver(3); // 2, 1, 0 left: disarmed
    settle();
    assert_eq!(s.events(), vec![], "fires once per arming");

    // Posting never fires it; re-arming makes it fire once more.
    s.post(8..12);
    s.srq.arm_limit(3).unwrap();
    settle();
    assert_eq!(s.events(), vec![]);
    deliver(1); // 3 left
    settle();
    assert_eq!(s.events(), vec![]);
    deliver(1); // 2 left
    let ev = s.ctx.async_events().get(Some(Duration::from_secs(5)));
    assert_eq!(ev, Some(want));
    deliver(2);
    settle();
    assert_eq!(s.events(), vec![]);

    // Armed, then disarmed with 0: nothing.
    s.post(12..14);
    s.srq.arm_limit(2).unwrap();
    s.srq.arm_limit(0).unwrap();
    deliver(2);
    settle();
    assert_eq!(s.events(), vec![]);
    assert!(s.srq.is_empty());
    assert_eq!(qa.link_state(), QpLinkState::Connected);
    assert_eq!(qb.link_state(), QpLinkState::Connected);
}

#[test]
fn post_recv_on_an_srq_qp_is_refused() {
    let s = server();
    let q = s.qp(31);
    let wr = RecvWr {
        wr_id: 1,
        sgl: SgList::single(s.buf.as_ptr() as u64, 64, s.stag),
    };
    assert_eq!(q.post_recv(wr), Err(QpError::Invalid), "unconnected");
    let p = peer(&s, &q, 3);
    assert_eq!(q.post_recv(wr), Err(QpError::Invalid), "connected");
    assert!(s.srq.is_empty(), "nothing reached the SRQ");
    // The SRQ's own depth is enforced.
    s.post(0..SLOTS);
    assert_eq!(s.srq.post_recv(wr), Err(QpError::QueueFull));
    assert_eq!(s.srq.len(), SLOTS);
    // The QP still works, from the SRQ.
    p.send(0, 10);
    let c = collect(&s.cq, 1)[0];
    assert_eq!((c.wc.wr_id, c.qp_num), (0, q.qpn()));
    assert_eq!(s.srq.len(), SLOTS - 1);
}

/// Connects a fresh peer to `server_qp` (which has no receive available),
/// then posts a Send and, right behind it, a Read. The receiver answers the
/// Send with a Terminate; the Read, still outstanding when it arrives,
/// completes with the status the Terminate's cause maps to (a DDP
/// "no buffer" Terminate: `RnrRetryExcErr`). Returns the two statuses and
/// the peer, or `None` if the Terminate won the race with the second post
/// (the Read then flushes).
fn provoke_no_buffer(s: &Server, server_qp: &Qp) -> Option<(WcStatus, Peer)> {
    let p = peer(s, server_qp, 9);
    p.send(0, 100);
    p.qp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Read {
            remote_addr: s.buf.as_ptr() as u64,
            rkey: s.stag,
        },
        payload: Payload::Sgl(SgList::single(
            p.buf.as_ptr() as u64 + SLOT as u64,
            64,
            p.stag,
        )),
        flags: SIGNALED,
    })
    .unwrap();
    let c = collect(&p.cq, 2);
    assert_eq!((c[0].wc.wr_id, c[0].wc.status), (0, WcStatus::Success));
    assert_eq!(c[1].wc.wr_id, 1);
    match c[1].wc.status {
        WcStatus::WrFlushErr => None,
        st => Some((st, p)),
    }
}

/// Retries [`provoke_no_buffer`] on fresh connections until the race goes
/// the usual way. A debug build on a loaded machine loses it most of the
/// time (the Read's post is tens of microseconds behind the Send's), and
/// once lost ten times in a row: fifty attempts.
fn no_buffer_status(s: &Server, make_qp: impl Fn(u32) -> Qp) -> (WcStatus, Qp, Peer) {
    for attempt in 0..50 {
        let q = make_qp(100 + attempt);
        if let Some((st, p)) = provoke_no_buffer(s, &q) {
            return (st, q, p);
        }
    }
    panic!("the Terminate always beat the second post");
}

fn wait_state(q: &Qp, want: QpLinkState) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while q.link_state() != want {
        assert!(Instant::now() < deadline, "QP {} never {want:?}", q.qpn());
        thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn empty_srq_terminates_the_sender_like_a_qp_without_receives() {
    // Reference: a QP without an SRQ and without receives.
    let plain = server();
    let (plain_status, plain_q, plain_p) = no_buffer_status(&plain, |qpn| {
        plain.ctx.create_qp(
            qpn,
            plain.pd,
            QpCaps::default(),
            plain.cq.clone(),
            plain.cq.clone(),
        )
    });
    assert_eq!(plain_status, WcStatus::RnrRetryExcErr);
    wait_state(&plain_q, QpLinkState::Error);
    wait_state(&plain_p.qp, QpLinkState::Error);

    // An SRQ QP whose SRQ ran empty: one receive, taken by the other QP.
    let s = server();
    let other = s.qp(50);
    let po = peer(&s, &other, 5);
    s.post(0..1);
    po.send(0, 10);
    let c = collect(&s.cq, 1)[0];
    assert_eq!((c.wc.wr_id, c.qp_num), (0, other.qpn()));
    assert!(s.srq.is_empty());
    let (status, q, p) = no_buffer_status(&s, |qpn| s.qp(qpn));
    assert_eq!(status, plain_status, "the same Terminate as without an SRQ");
    wait_state(&q, QpLinkState::Error);
    wait_state(&p.qp, QpLinkState::Error);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut server_events = Vec::new();
    while !server_events.contains(&AsyncEvent::QpFatal { qpn: q.qpn() }) {
        assert!(Instant::now() < deadline, "{server_events:?}");
        server_events.extend(s.events());
        thread::sleep(Duration::from_millis(2));
    }
    assert!(
        server_events
            .iter()
            .all(|e| matches!(e, AsyncEvent::QpFatal { qpn } if *qpn != other.qpn())),
        "only the QPs that found the SRQ empty failed: {server_events:?}"
    );
    // The sender's QP failed on the Terminate.
    let ev = p.ctx.async_events().get(Some(Duration::from_secs(5)));
    assert!(
        matches!(ev, Some(AsyncEvent::CommEstablished { .. })),
        "{ev:?}"
    );
    let ev = p.ctx.async_events().get(Some(Duration::from_secs(5)));
    assert_eq!(ev, Some(AsyncEvent::QpFatal { qpn: p.qp.qpn() }));
    assert_eq!(p.events(), vec![]);

    // The SRQ and its other QP carry on; receives posted now are there for
    // it and none went to the failed QP.
    s.post(1..3);
    assert_eq!(s.srq.len(), 2);
    po.send(1, 20);
    let c = collect(&s.cq, 1)[0];
    assert_eq!(
        (c.wc.wr_id, c.wc.status, c.wc.byte_len, c.qp_num),
        (1, WcStatus::Success, 20, other.qpn())
    );
    assert!(s.slot(1, 20) == po.msg(1, 20));
    assert_eq!(s.srq.len(), 1);
    assert_eq!(other.link_state(), QpLinkState::Connected);
}
