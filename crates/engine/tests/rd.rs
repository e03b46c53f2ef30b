//! RD (reliable datagram) QPs over real UDP (`docs/datagram.md` §9–§11).
//!
//! On 127.0.0.1, between two contexts:
//!
//! * every operation: Send (± immediate, solicited, zero-length), 64 KiB
//!   Sends cut into MTU-1500 segments, RDMA Write, RDMA Read, fetch-and-add
//!   and compare-and-swap, Write-Record (CQ record and validity map);
//!   completions in posting order, the data byte-exact;
//! * remote access violations (Write, Write-Record, Read, atomic against
//!   memory without the right, or a bad STag) fail only their own work
//!   request (`RemAccessErr`, one `DgramRemoteAccessError` per message at
//!   the target, nothing placed), while the requests around them succeed;
//! * a UD QP and an RD QP sharing one UDP socket, on both ends: each gets
//!   only its own datagrams (the first octet tells the framings apart),
//!   and an RD Send aimed at the UD QP fails by the retry limit without
//!   the UD QP ever taking it for a UD message;
//! * a peer process killed with SIGKILL (this binary re-executed as the
//!   `peer` test, as in `failures.rs`): only the work requests to it fail,
//!   with `RetryExcErr`, a `DgramPeerFailed` event names it, and traffic
//!   to another peer keeps completing meanwhile and afterwards;
//! * a busy-polled RD QP runs its own due timers (retransmission) from
//!   `Cq::poll`, not only on the progress thread's millisecond ticks
//!   (`DgramQpStats::timers_inline`).
//!
//! Between two hosts (two network namespaces joined by veth,
//! `softrdma_sim::netns::NetPair`, one process in each, MTU 9000 on the
//! link and the QPs), with nftables dropping 0.1 %, 1 % and 5 % of the
//! packets arriving at the receiver: RD moves 256 MiB (4096 Sends of
//! 64 KiB, each with its sequence number and a pattern) intact and in
//! order; the receiver checks every octet and the order, the sender that
//! every Send succeeded. The veth links get `gso_max_segs 1` so the loss
//! hits single datagrams, not GSO runs (see `netns_dgram.rs`). Each level
//! prints its MB/s and the reliability layer's counters
//! (`--nocapture`). They need root; without the right to make namespaces
//! they are skipped, except under `CI=true`.

mod child;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::dgram::ProtoStats;
use softrdma_engine::{
    AsyncEvent, Completion, Context, Cq, DgramQpHandle, QpCaps, RdOptions, RdQpCounters, UdOptions,
};
use softrdma_proto::memory::Access;
use softrdma_proto::rd::RdConfig;
use softrdma_proto::rdqp::RdQpConfig;
use softrdma_proto::wr::{
    DgramAddr, InlineData, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
    WorkCompletion,
};
use softrdma_sim::netns::NetPair;

const LIMIT: Duration = Duration::from_secs(20);

// ----------------------------------------------------------------------
// Harness
// ----------------------------------------------------------------------

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..len).map(|_| r.next() as u8).collect()
}

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
        let k = cq.poll(&mut buf[..(n - got.len()).min(32)]);
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

/// Polls for `d` and asserts nothing completes.
fn assert_quiet(cq: &Cq, d: Duration) {
    let deadline = Instant::now() + d;
    let mut buf = [blank(); 4];
    while Instant::now() < deadline {
        let k = cq.poll(&mut buf);
        assert_eq!(k, 0, "unexpected completion: {:?}", &buf[..k]);
        thread::sleep(Duration::from_millis(2));
    }
}

/// Registered heap memory.
struct Buf {
    mem: Vec<u8>,
    stag: u32,
}

impl Buf {
    fn new(ctx: &Context, pd: u32, len: usize, access: Access) -> Buf {
        Buf::with(ctx, pd, vec![0u8; len], access)
    }
    fn with(ctx: &Context, pd: u32, mut mem: Vec<u8>, access: Access) -> Buf {
        // SAFETY: `mem`'s heap block does not move when the Vec does, and
        // every test keeps the Buf alive while its context may touch it.
        let stag = unsafe {
            ctx.registry()
                .register(mem.as_mut_ptr(), mem.len(), mem.as_ptr() as u64, access, pd)
        }
        .unwrap();
        Buf { mem, stag }
    }
    fn addr(&self, off: usize) -> u64 {
        self.mem.as_ptr() as u64 + off as u64
    }
    fn sgl(&self, off: usize, len: usize) -> SgList {
        SgList::single(self.addr(off), len as u32, self.stag)
    }
    fn recv(&self, wr_id: u64, off: usize, len: usize) -> RecvWr {
        RecvWr {
            wr_id,
            sgl: self.sgl(off, len),
        }
    }
    /// The contents (read once the completions say the engine is done
    /// with the range).
    fn bytes(&self) -> &[u8] {
        &self.mem
    }
    fn u64_at(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.mem[off..off + 8].try_into().unwrap())
    }
}

const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
const ALL: Access = Access(1 | 2 | 4 | 8);
const SIGNALED: SendFlags = SendFlags {
    signaled: true,
    solicited: false,
    fence: false,
};

/// Fast timers for the tests that wait for a peer to fail: it gives up
/// after 20 + 40 + 80 + 100 + 100 ms of silence.
fn fast_rd() -> RdConfig {
    RdConfig {
        rto_min: Duration::from_millis(20),
        rto_initial: Duration::from_millis(20),
        rto_max: Duration::from_millis(100),
        retry_limit: 4,
        max_datagram_lifetime: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(2),
        ..RdConfig::default()
    }
}

fn rd_opts(bind: SocketAddr, rd: RdConfig) -> RdOptions {
    RdOptions {
        proto: RdQpConfig {
            rd,
            ..RdQpConfig::default()
        },
        mtu: Some(1500),
        bind,
        self_driven: false,
    }
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

struct End {
    ctx: Context,
    pd: u32,
    scq: Arc<Cq>,
    rcq: Arc<Cq>,
    qp: DgramQpHandle,
}

fn end(opts: RdOptions) -> End {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let scq = ctx.create_cq(1024, None);
    let rcq = ctx.create_cq(1024, None);
    let qp = ctx
        .create_rd_qp(pd, QpCaps::default(), scq.clone(), rcq.clone(), opts)
        .unwrap();
    End {
        ctx,
        pd,
        scq,
        rcq,
        qp,
    }
}

fn wr(wr_id: u64, op: SendOp, payload: SgList) -> SendWr {
    SendWr {
        wr_id,
        op,
        payload: Payload::Sgl(payload),
        flags: SIGNALED,
    }
}

fn send_op(imm: Option<u32>) -> SendOp {
    SendOp::Send {
        imm,
        invalidate: None,
    }
}

fn rd_stats(qp: &DgramQpHandle) -> RdQpCounters {
    match qp.stats().proto {
        ProtoStats::Rd(s) => s,
        other => panic!("not an RD QP: {other:?}"),
    }
}

fn events(ctx: &Context) -> Vec<AsyncEvent> {
    let mut v = Vec::new();
    while let Some(e) = ctx.async_events().try_get() {
        v.push(e);
    }
    v
}

/// Waits for an async event `pred` accepts (events are raised just after
/// the completions of the same engine call are queued).
fn wait_event(ctx: &Context, pred: impl Fn(&AsyncEvent) -> bool) -> Vec<AsyncEvent> {
    let deadline = Instant::now() + LIMIT;
    let mut seen = Vec::new();
    while !seen.iter().any(&pred) {
        let left = deadline.saturating_duration_since(Instant::now());
        match ctx.async_events().get(Some(left)) {
            Some(e) => seen.push(e),
            None => panic!("no such event within {LIMIT:?}: {seen:?}"),
        }
    }
    seen.extend(events(ctx));
    seen
}

fn statuses(c: &[Completion]) -> Vec<(u64, WcStatus)> {
    c.iter().map(|c| (c.wc.wr_id, c.wc.status)).collect()
}

#[test]
fn rd_handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<DgramQpHandle>();
    check::<RdOptions>();
}

// ----------------------------------------------------------------------
// Every operation between two contexts
// ----------------------------------------------------------------------

#[test]
fn send_write_read_atomics_and_write_record_between_two_contexts() {
    let a = end(rd_opts(local(0), RdConfig::default()));
    let b = end(rd_opts(local(0), RdConfig::default()));
    let to_b = b.qp.local_addr();
    assert_eq!(to_b.qpn >> 8, u32::from(to_b.port));

    const K: usize = 1024;
    let src = Buf::with(&a.ctx, a.pd, pattern(1, 256 * K), Access::LOCAL_WRITE);
    let sink = Buf::new(&a.ctx, a.pd, 64 * K, Access::LOCAL_WRITE);
    let res = Buf::new(&a.ctx, a.pd, 16, Access::LOCAL_WRITE);
    let rbuf = Buf::new(&b.ctx, b.pd, 4 * 64 * K, Access::LOCAL_WRITE);
    let target = Buf::new(&b.ctx, b.pd, 128 * K, ALL);
    let readsrc = Buf::with(&b.ctx, b.pd, pattern(2, 64 * K), ALL);
    let mut atom = vec![0u8; 16];
    atom[..8].copy_from_slice(&100u64.to_ne_bytes());
    let atom = Buf::with(&b.ctx, b.pd, atom, ALL);
    let rec = Buf::new(&b.ctx, b.pd, 32 * K, RW);

    for i in 0..4 {
        b.qp.post_recv(rbuf.recv(10 + i, i as usize * 64 * K, 64 * K))
            .unwrap();
    }
    let post = |w: SendWr| a.qp.post_send(w, to_b).unwrap();
    post(wr(1, send_op(None), src.sgl(0, 1000)));
    post(wr(2, send_op(Some(0xdead_beef)), src.sgl(1000, 64 * K)));
    post(SendWr {
        flags: SendFlags {
            solicited: true,
            ..SIGNALED
        },
        ..wr(3, send_op(Some(7)), SgList::default())
    });
    let write = SendOp::Write {
        remote_addr: target.addr(0),
        rkey: target.stag,
        imm: None,
    };
    post(wr(4, write, src.sgl(2000, 100 * K)));
    let read = SendOp::Read {
        remote_addr: readsrc.addr(100),
        rkey: readsrc.stag,
    };
    post(wr(5, read, sink.sgl(0, 50 * K)));
    let fadd = SendOp::FetchAdd {
        remote_addr: atom.addr(0),
        rkey: atom.stag,
        add: 5,
    };
    post(wr(6, fadd, res.sgl(0, 8)));
    let cas = SendOp::CompareSwap {
        remote_addr: atom.addr(0),
        rkey: atom.stag,
        compare: 105,
        swap: 999,
    };
    post(wr(7, cas, res.sgl(8, 8)));
    let record = SendOp::WriteRecord {
        remote_addr: rec.addr(1000),
        rkey: rec.stag,
    };
    post(wr(8, record, src.sgl(5000, 20 * K)));
    // After the Write: its receive completing means the Write was placed
    // (RD delivers in order).
    post(wr(9, send_op(None), src.sgl(7, 16)));

    // The sender: every request succeeded, reported in posting order.
    let got = collect(&a.scq, 9, LIMIT);
    let summary: Vec<_> = got
        .iter()
        .map(|c| (c.wc.wr_id, c.wc.status, c.wc.opcode))
        .collect();
    use WcOpcode as O;
    let ok = WcStatus::Success;
    assert_eq!(
        summary,
        vec![
            (1, ok, O::Send),
            (2, ok, O::Send),
            (3, ok, O::Send),
            (4, ok, O::RdmaWrite),
            (5, ok, O::RdmaRead),
            (6, ok, O::FetchAdd),
            (7, ok, O::CompSwap),
            (8, ok, O::WriteRecord),
            (9, ok, O::Send),
        ]
    );
    assert!(got.iter().all(|c| c.qp_num == a.qp.qpn()));
    assert_eq!(got[4].wc.byte_len, 50 * K as u32);

    // The target: four receives (in order) and one Write-Record record.
    let got = collect(&b.rcq, 5, LIMIT);
    let recvs: Vec<_> = got
        .iter()
        .filter(|c| c.wc.opcode == WcOpcode::Recv)
        .map(|c| c.wc)
        .collect();
    assert_eq!(recvs.len(), 4, "{got:?}");
    let from_a = a.qp.local_addr();
    for (i, (len, imm, solicited)) in [
        (1000, None, false),
        (64 * K as u32, Some(0xdead_beef), false),
        (0, Some(7), true),
        (16, None, false),
    ]
    .into_iter()
    .enumerate()
    {
        let wc = recvs[i];
        assert_eq!(wc.wr_id, 10 + i as u64);
        assert_eq!(
            (wc.status, wc.byte_len, wc.imm, wc.solicited, wc.src),
            (WcStatus::Success, len, imm, solicited, Some(from_a)),
            "receive {i}"
        );
    }
    let r = got
        .iter()
        .find(|c| c.wc.opcode == WcOpcode::RecvWriteRecord)
        .expect("a Write-Record record");
    assert_eq!(r.wc.status, WcStatus::Success);
    let info = r.wc.record.expect("record info");
    assert_eq!(
        (info.stag, info.to, info.len),
        (rec.stag, rec.addr(1000), 20 * K as u32)
    );

    // The data.
    let s = src.bytes();
    let rb = rbuf.bytes();
    assert_eq!(&rb[..1000], &s[..1000]);
    assert_eq!(&rb[64 * K..128 * K], &s[1000..1000 + 64 * K]);
    assert_eq!(&rb[3 * 64 * K..3 * 64 * K + 16], &s[7..23]);
    assert_eq!(&target.bytes()[..100 * K], &s[2000..2000 + 100 * K]);
    assert!(target.bytes()[100 * K..].iter().all(|&x| x == 0));
    assert_eq!(&sink.bytes()[..50 * K], &readsrc.bytes()[100..100 + 50 * K]);
    assert_eq!((res.u64_at(0), res.u64_at(8)), (100, 105));
    assert_eq!(atom.u64_at(0), 999);
    assert_eq!(&rec.bytes()[1000..1000 + 20 * K], &s[5000..5000 + 20 * K]);
    assert!(b.qp.is_valid(rec.stag, rec.addr(1000), 20 * K as u64));
    assert!(!b.qp.is_valid(rec.stag, rec.addr(999), 2));
    let mut out = [(0u64, 0u64); 4];
    assert_eq!(
        b.qp.valid_ranges(rec.stag, rec.addr(0), 32 * K as u64, &mut out),
        (1, false)
    );
    assert_eq!(out[0], (rec.addr(1000), rec.addr(1000 + 20 * K)));

    // The counters.
    let sa = rd_stats(&a.qp);
    let sb = rd_stats(&b.qp);
    assert_eq!((sa.qp.tx_messages, sa.qp.tx_errors), (9, 0), "{sa:?}");
    assert_eq!(sb.qp.rx_delivered, 4, "{sb:?}");
    assert_eq!((sb.qp.rx_read_requests, sb.qp.rx_atomics), (1, 2), "{sb:?}");
    assert_eq!(sb.qp.rx_record_segments, 15, "{sb:?}");
    assert!(sa.rd.data_sent > 100 && sb.rd.delivered >= sa.rd.data_sent - sa.rd.retransmitted);
    assert!(events(&b.ctx).is_empty() && events(&a.ctx).is_empty());
    assert_quiet(&b.rcq, Duration::from_millis(20));
}

// ----------------------------------------------------------------------
// Remote access violations
// ----------------------------------------------------------------------

#[test]
fn remote_access_violation_fails_only_that_work_request() {
    let a = end(rd_opts(local(0), RdConfig::default()));
    let b = end(rd_opts(local(0), RdConfig::default()));
    let to_b = b.qp.local_addr();
    let src = Buf::with(&a.ctx, a.pd, pattern(3, 64 << 10), Access::LOCAL_WRITE);
    let sink = Buf::new(&a.ctx, a.pd, 16 << 10, Access::LOCAL_WRITE);
    let rbuf = Buf::new(&b.ctx, b.pd, 8 << 10, Access::LOCAL_WRITE);
    // Readable, not writable, no atomics.
    let ro = Buf::new(&b.ctx, b.pd, 16 << 10, Access(Access::LOCAL_WRITE.0 | 4));
    let rw = Buf::new(&b.ctx, b.pd, 16 << 10, RW);
    for i in 0..2 {
        b.qp.post_recv(rbuf.recv(100 + i, i as usize * 4096, 4096))
            .unwrap();
    }
    let post = |w: SendWr| a.qp.post_send(w, to_b).unwrap();
    let write_to = |buf: &Buf, off: usize| SendOp::Write {
        remote_addr: buf.addr(off),
        rkey: buf.stag,
        imm: None,
    };
    post(wr(1, send_op(None), src.sgl(0, 100)));
    // 10 KiB: seven segments, one Terminate, one event.
    post(wr(2, write_to(&ro, 0), src.sgl(0, 10 << 10)));
    post(wr(3, write_to(&rw, 0), src.sgl(0, 10 << 10)));
    let bad_read = SendOp::Read {
        remote_addr: rw.addr(0),
        rkey: rw.stag ^ 0x5500,
    };
    post(wr(4, bad_read, sink.sgl(0, 1000)));
    let bad_record = SendOp::WriteRecord {
        remote_addr: ro.addr(100),
        rkey: ro.stag,
    };
    post(wr(5, bad_record, src.sgl(0, 3000)));
    let bad_atomic = SendOp::FetchAdd {
        remote_addr: ro.addr(0),
        rkey: ro.stag,
        add: 1,
    };
    post(wr(6, bad_atomic, sink.sgl(8000, 8)));
    // Past the end of a writable region.
    post(wr(7, write_to(&rw, (16 << 10) - 100), src.sgl(0, 200)));
    post(wr(8, send_op(Some(5)), src.sgl(200, 300)));
    let good_read = SendOp::Read {
        remote_addr: ro.addr(0),
        rkey: ro.stag,
    };
    post(wr(9, good_read, sink.sgl(0, 4096)));

    let got = collect(&a.scq, 9, LIMIT);
    let ok = WcStatus::Success;
    let bad = WcStatus::RemAccessErr;
    assert_eq!(
        statuses(&got),
        vec![
            (1, ok),
            (2, bad),
            (3, ok),
            (4, bad),
            (5, bad),
            (6, bad),
            (7, bad),
            (8, ok),
            (9, ok)
        ]
    );
    // Nothing placed where it was refused; the rest is exact.
    assert!(ro.bytes().iter().all(|&x| x == 0));
    assert_eq!(&rw.bytes()[..10 << 10], &src.bytes()[..10 << 10]);
    assert!(rw.bytes()[10 << 10..].iter().all(|&x| x == 0));
    assert_eq!(&sink.bytes()[..4096], &ro.bytes()[..4096]);

    let recvs = collect(&b.rcq, 2, LIMIT);
    assert_eq!(
        recvs
            .iter()
            .map(|c| (c.wc.wr_id, c.wc.status, c.wc.byte_len, c.wc.imm))
            .collect::<Vec<_>>(),
        vec![(100, ok, 100, None), (101, ok, 300, Some(5))]
    );
    assert_eq!(&rbuf.bytes()[..100], &src.bytes()[..100]);
    assert_eq!(&rbuf.bytes()[4096..4396], &src.bytes()[200..500]);

    // One event per refused message at the target, none at the sender.
    let ev = events(&b.ctx);
    let opcodes: Vec<_> = ev
        .iter()
        .map(|e| match e {
            AsyncEvent::DgramRemoteAccessError {
                qpn, src, opcode, ..
            } => {
                assert_eq!((*qpn, *src), (b.qp.qpn(), a.qp.local_addr()));
                *opcode
            }
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    use softrdma_wire::rdmap::Opcode as Op;
    assert_eq!(
        opcodes,
        vec![
            Op::RdmaWrite,
            Op::ReadRequest,
            Op::WriteRecord,
            Op::AtomicRequest,
            Op::RdmaWrite
        ]
    );
    assert!(events(&a.ctx).is_empty());
    let sb = rd_stats(&b.qp);
    assert_eq!(sb.qp.terminates_sent, 5, "{sb:?}");
    assert_eq!(sb.qp.rx_access_errors, 5, "{sb:?}");
    let sa = rd_stats(&a.qp);
    assert_eq!((sa.qp.tx_messages, sa.qp.tx_errors), (4, 5), "{sa:?}");
    assert_quiet(&b.rcq, Duration::from_millis(20));
}

// ----------------------------------------------------------------------
// UD and RD on one socket
// ----------------------------------------------------------------------

#[test]
fn ud_and_rd_qps_share_a_socket_and_get_only_their_own_datagrams() {
    struct Host {
        ctx: Context,
        pd: u32,
        cq: Arc<Cq>,
        ud: DgramQpHandle,
        rd: DgramQpHandle,
    }
    let host = || {
        let ctx = Context::new().unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(1024, None);
        let ud = ctx
            .create_ud_qp(
                pd,
                QpCaps::default(),
                cq.clone(),
                cq.clone(),
                UdOptions {
                    bind: local(0),
                    mtu: Some(1500),
                    ..UdOptions::default()
                },
            )
            .unwrap();
        let port = ud.local_addr().port;
        let rd = ctx
            .create_rd_qp(
                pd,
                QpCaps::default(),
                cq.clone(),
                cq.clone(),
                rd_opts(local(port), fast_rd()),
            )
            .unwrap();
        assert_eq!(rd.local_addr().port, port, "one socket");
        assert_ne!(rd.qpn(), ud.qpn());
        Host {
            ctx,
            pd,
            cq,
            ud,
            rd,
        }
    };
    let a = host();
    let b = host();
    let src = Buf::with(&a.ctx, a.pd, pattern(4, 64 << 10), Access::LOCAL_WRITE);
    let rbuf = Buf::new(&b.ctx, b.pd, 64 * 8192, Access::LOCAL_WRITE);
    const N: u64 = 16;
    for i in 0..N {
        let qp = if i % 2 == 0 { &b.ud } else { &b.rd };
        qp.post_recv(rbuf.recv(i, i as usize * 8192, 8192)).unwrap();
    }
    // Interleaved: even to the UD QP, odd to the RD QP, several segments
    // each.
    for i in 0..N {
        let len = 3000 + 100 * i as usize;
        let w = wr(i, send_op(Some(i as u32)), src.sgl(i as usize * 7, len));
        if i % 2 == 0 {
            a.ud.post_send(w, b.ud.local_addr()).unwrap();
        } else {
            a.rd.post_send(w, b.rd.local_addr()).unwrap();
        }
    }
    let sent = collect(&a.cq, N as usize, LIMIT);
    assert!(
        sent.iter().all(|c| c.wc.status == WcStatus::Success),
        "{sent:?}"
    );
    let mut got = collect(&b.cq, N as usize, LIMIT);
    got.sort_by_key(|c| c.wc.wr_id);
    for c in &got {
        let i = c.wc.wr_id;
        let (qp, from) = if i % 2 == 0 {
            (&b.ud, a.ud.local_addr())
        } else {
            (&b.rd, a.rd.local_addr())
        };
        let len = 3000 + 100 * i as usize;
        assert_eq!(c.qp_num, qp.qpn(), "message {i} reached its own QP");
        assert_eq!(
            (c.wc.status, c.wc.byte_len as usize, c.wc.imm, c.wc.src),
            (WcStatus::Success, len, Some(i as u32), Some(from))
        );
        let at = i as usize * 8192;
        assert_eq!(
            &rbuf.bytes()[at..at + len],
            &src.bytes()[i as usize * 7..i as usize * 7 + len]
        );
    }
    let sock = b.rd.socket_stats();
    assert_eq!((sock.rx_no_qp, sock.rx_no_dqpn), (0, 0), "{sock:?}");
    let ProtoStats::Ud(ud) = b.ud.stats().proto else {
        panic!("UD counters")
    };
    assert_eq!(ud.rx_delivered, N / 2, "{ud:?}");

    // An RD Send aimed at the UD QP: the UD QP drops every datagram (RD
    // framing), nothing is delivered, and the RD sender gives up on that
    // "peer" alone.
    let before = ud;
    b.ud.post_recv(rbuf.recv(99, 0, 8192)).unwrap();
    a.rd.post_send(wr(50, send_op(None), src.sgl(0, 100)), b.ud.local_addr())
        .unwrap();
    let c = collect(&a.cq, 1, LIMIT);
    assert_eq!(statuses(&c), vec![(50, WcStatus::RetryExcErr)]);
    let ProtoStats::Ud(ud) = b.ud.stats().proto else {
        panic!("UD counters")
    };
    assert_eq!(ud.rx_delivered, before.rx_delivered, "{ud:?}");
    assert!(
        ud.rx_malformed > before.rx_malformed,
        "dropped as another framing: {ud:?}"
    );
    let (qpn, dest) = (a.rd.qpn(), b.ud.local_addr());
    wait_event(
        &a.ctx,
        |e| matches!(e, AsyncEvent::DgramPeerFailed { qpn: q, peer } if *q == qpn && *peer == dest),
    );
    assert_quiet(&b.cq, Duration::from_millis(20));
}

// ----------------------------------------------------------------------
// A peer process that disappears
// ----------------------------------------------------------------------

/// Names the peer's scenario.
const PEER_ENV: &str = "SOFTRDMA_RD_PEER";
/// Starts each protocol line of a peer (libtest may print before it).
const MARK: &str = "@peer ";
/// How long the test waits for a line from a peer, or its exit.
const PEER_WAIT: Duration = Duration::from_secs(90);
/// A peer exits by itself after this long, whatever happens.
const PEER_LIFETIME: Duration = Duration::from_secs(240);

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
    /// Runs scenario `spec` (`name key=value …`) with `cmd` (this binary,
    /// maybe inside a namespace).
    fn spawn(cmd: Command, spec: &str) -> Peer {
        Peer(child::Peer::spawn(
            cmd,
            PEER_ENV,
            spec,
            spec.to_string(),
            PEER_WAIT,
        ))
    }

    fn local(spec: &str) -> Peer {
        Peer::spawn(Command::new(std::env::current_exe().unwrap()), spec)
    }

    /// The peer's QP address from `ready IP PORT QPN`.
    fn ready(&mut self) -> DgramAddr {
        let w = self.expect("ready");
        DgramAddr {
            ip: w[0].parse().unwrap(),
            port: w[1].parse().unwrap(),
            qpn: w[2].parse().unwrap(),
        }
    }

    /// Waits for `@peer ok` and a successful exit.
    fn finish(mut self) {
        self.finish_ok();
    }
}

/// `key=value` words of a scenario.
fn arg<T: std::str::FromStr>(spec: &str, key: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    let v = spec
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .find(|(k, _)| *k == key)
        .unwrap_or_else(|| panic!("no `{key}` in `{spec}`"))
        .1;
    v.parse()
        .unwrap_or_else(|e| panic!("`{key}={v}` in `{spec}`: {e:?}"))
}

/// The peer: runs the scenario named in the environment (nothing without
/// it) and prints `@peer ok` when every check passed.
#[test]
fn peer() {
    let Ok(spec) = std::env::var(PEER_ENV) else {
        return;
    };
    thread::spawn(|| {
        thread::sleep(PEER_LIFETIME);
        eprintln!("peer: still running after {PEER_LIFETIME:?}, exiting");
        std::process::exit(3);
    });
    match spec.split_whitespace().next() {
        Some("sink") => peer_sink(),
        Some("bulk-recv") => peer_bulk_recv(&spec),
        Some("bulk-send") => peer_bulk_send(&spec),
        other => panic!("unknown scenario {other:?}"),
    }
    say("ok");
}

fn say(line: &str) {
    println!("{MARK}{line}");
}

/// Receives Sends for ever (until killed), reposting each receive.
fn peer_sink() {
    let e = end(rd_opts(local(0), fast_rd()));
    let rbuf = Buf::new(&e.ctx, e.pd, 64 * 4096, Access::LOCAL_WRITE);
    for i in 0..64u64 {
        e.qp.post_recv(rbuf.recv(i, i as usize * 4096, 4096))
            .unwrap();
    }
    let a = e.qp.local_addr();
    say(&format!("ready {} {} {}", a.ip, a.port, a.qpn));
    let mut buf = [blank(); 32];
    loop {
        let k = e.rcq.poll(&mut buf);
        for c in &buf[..k] {
            assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
            let i = c.wc.wr_id;
            e.qp.post_recv(rbuf.recv(i, i as usize * 4096, 4096))
                .unwrap();
        }
        if k == 0 {
            thread::sleep(Duration::from_micros(200));
        }
    }
}

#[test]
fn killed_peer_fails_only_its_own_work_requests() {
    let mut p = Peer::local("sink");
    let to_p = p.ready();
    let a = end(rd_opts(local(0), fast_rd()));
    let b = end(rd_opts(local(0), fast_rd()));
    let to_b = b.qp.local_addr();
    let src = Buf::with(&a.ctx, a.pd, pattern(5, 8192), Access::LOCAL_WRITE);
    let sink = Buf::new(&a.ctx, a.pd, 4096, Access::LOCAL_WRITE);
    let rbuf = Buf::new(&b.ctx, b.pd, 256 * 1024, Access::LOCAL_WRITE);
    let mut b_posted = 0u64;
    let mut b_recv = |n: u64| {
        for _ in 0..n {
            let i = b_posted % 64;
            b.qp.post_recv(rbuf.recv(b_posted, i as usize * 4096, 4096))
                .unwrap();
            b_posted += 1;
        }
    };
    let send = |id: u64, dest: DgramAddr| {
        a.qp.post_send(
            wr(id, send_op(None), src.sgl(id as usize % 1000, 3000)),
            dest,
        )
        .unwrap()
    };

    // Both peers work.
    b_recv(10);
    for i in 0..10 {
        send(i, to_p);
        send(100 + i, to_b);
    }
    let got = collect(&a.scq, 20, LIMIT);
    assert!(
        got.iter().all(|c| c.wc.status == WcStatus::Success),
        "{got:?}"
    );
    collect(&b.rcq, 10, LIMIT);

    // The peer process dies.
    p.reap();
    let killed = Instant::now();
    let read = SendOp::Read {
        remote_addr: 0x1000,
        rkey: 0x1234,
    };
    // Work for the dead peer, interleaved with work for the live one.
    b_recv(10);
    for i in 0..10 {
        send(200 + i, to_p);
        send(300 + i, to_b);
    }
    a.qp.post_send(wr(250, read, sink.sgl(0, 100)), to_p)
        .unwrap();
    // The live peer's work completes long before the dead one's fails.
    let mut live = Vec::new();
    let mut dead = Vec::new();
    let mut live_done_at = None;
    let mut rounds = 0;
    let mut buf = [blank(); 32];
    while dead.len() < 11 {
        assert!(killed.elapsed() < LIMIT, "live {live:?} dead {dead:?}");
        let k = a.scq.poll(&mut buf);
        for c in &buf[..k] {
            if c.wc.wr_id >= 300 {
                assert!(
                    c.wc.wr_id >= 310 || dead.is_empty(),
                    "live work held back until the failure"
                );
                live.push((c.wc.wr_id, c.wc.status));
            } else {
                dead.push((c.wc.wr_id, c.wc.status));
            }
        }
        if live.len() == 10 * (rounds + 1) {
            live_done_at.get_or_insert_with(Instant::now);
            // Keep the live peer busy while the dead one times out.
            if rounds < 3 {
                rounds += 1;
                b_recv(10);
                for i in 0..10 {
                    send(300 + 10 * rounds as u64 + i, to_b);
                }
            }
        }
        if k == 0 {
            thread::sleep(Duration::from_millis(1));
        }
    }
    let failed_at = killed.elapsed();
    let mut expect_dead: Vec<_> = (200..210).map(|i| (i, WcStatus::RetryExcErr)).collect();
    expect_dead.push((250, WcStatus::RetryExcErr));
    assert_eq!(dead, expect_dead, "in posting order");
    assert!(
        live.iter().all(|&(_, s)| s == WcStatus::Success),
        "{live:?}"
    );
    assert!(
        live_done_at.is_some_and(|t| t.duration_since(killed) < failed_at),
        "the live peer's work completed before the dead peer's failed"
    );
    // Five expiries without progress: 20 + 40 + 80 + 100 + 100 ms.
    assert!(
        failed_at >= Duration::from_millis(300),
        "failed after {failed_at:?}"
    );
    let qpn = a.qp.qpn();
    let ev = wait_event(
        &a.ctx,
        |e| matches!(e, AsyncEvent::DgramPeerFailed { qpn: q, peer } if *q == qpn && *peer == to_p),
    );
    assert!(
        !ev.iter()
            .any(|e| matches!(e, AsyncEvent::DgramPeerFailed { peer, .. } if *peer == to_b)),
        "{ev:?}"
    );
    // Whatever is left for the live peer completes, and it keeps working.
    let rest = 10 * (rounds + 1) - live.len();
    let got = collect(&a.scq, rest, LIMIT);
    assert!(
        got.iter().all(|c| c.wc.status == WcStatus::Success),
        "{got:?}"
    );
    b_recv(5);
    for i in 0..5 {
        send(400 + i, to_b);
    }
    let got = collect(&a.scq, 5, LIMIT);
    assert!(
        got.iter().all(|c| c.wc.status == WcStatus::Success),
        "{got:?}"
    );
    let n = 10 * (rounds + 1) + 5;
    let got = collect(&b.rcq, n, LIMIT);
    assert!(
        got.iter()
            .all(|c| c.wc.status == WcStatus::Success && c.wc.src == Some(a.qp.local_addr())),
        "{got:?}"
    );
    let s = rd_stats(&a.qp);
    assert_eq!(s.rd.peers_failed, 1, "{s:?}");
    eprintln!(
        "peer failed {failed_at:?} after the kill; live peer: {} sends meanwhile",
        live.len()
    );
}

// ----------------------------------------------------------------------
// 256 MiB between two hosts under loss
// ----------------------------------------------------------------------

/// The veth link's MTU and the QPs' path MTU.
const BULK_MTU: usize = 9000;
/// Sends of the bulk test, each [`BULK_MSG`] octets.
const BULK_COUNT: u64 = 4096;
const BULK_MSG: usize = 64 << 10;
/// Receives the receiver keeps posted (receive buffers: 64 MiB).
const BULK_RECVS: usize = 1024;
/// Sends the sender keeps outstanding.
const BULK_OUTSTANDING: u64 = 128;
/// RD has no receiver-not-ready retry (a Send that finds no receive
/// posted fails), so the sender needs credits: every [`CREDIT_EVERY`]
/// messages the receiver tells it, with an 8-octet Send, how many it has
/// taken and posted again, and the sender stays less than
/// [`BULK_RECVS`] messages ahead of that.
const CREDIT_EVERY: u64 = 64;
/// Receives the sender keeps posted for credit messages.
const CREDIT_RECVS: usize = 32;
/// The longest a loss level may take (it takes 0.5–3.5 s on a 2-core VM
/// in a debug build).
const BULK_LIMIT: Duration = Duration::from_secs(60);
/// Octets the pattern repeats after (a prime, so messages differ).
const BULK_PERIOD: usize = 65_521;

/// The pattern: message `seq` is its sequence number (8 octets, LE)
/// followed by octets `[8, BULK_MSG)` of the stream starting at
/// `(seq * 4099) % BULK_PERIOD` of this buffer.
fn bulk_stream() -> Vec<u8> {
    pattern(0x5eed, BULK_PERIOD + BULK_MSG)
}

fn bulk_fill(stream: &[u8], seq: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&seq.to_le_bytes());
    let at = (seq as usize * 4099) % BULK_PERIOD;
    out[8..].copy_from_slice(&stream[at + 8..at + BULK_MSG]);
}

fn bulk_check(stream: &[u8], seq: u64, got: &[u8]) -> Result<(), String> {
    let n = u64::from_le_bytes(got[..8].try_into().unwrap());
    if n != seq {
        return Err(format!("message {seq} arrived carrying {n}"));
    }
    let at = (seq as usize * 4099) % BULK_PERIOD;
    if got[8..] != stream[at + 8..at + BULK_MSG] {
        let i = (8..BULK_MSG)
            .find(|&i| got[i] != stream[at + i])
            .unwrap_or(0);
        return Err(format!("message {seq} differs at octet {i}"));
    }
    Ok(())
}

fn bulk_opts(ip: IpAddr) -> RdOptions {
    RdOptions {
        proto: RdQpConfig {
            max_msg: BULK_MSG as u64,
            ..RdQpConfig::default()
        },
        mtu: Some(BULK_MTU),
        bind: SocketAddr::new(ip, 0),
        self_driven: false,
    }
}

fn bulk_caps() -> QpCaps {
    QpCaps {
        max_send_wr: 256,
        max_recv_wr: BULK_RECVS,
    }
}

/// Receives [`BULK_COUNT`] Sends from `from` and checks each octet and
/// the order.
fn peer_bulk_recv(spec: &str) {
    let ip: IpAddr = arg(spec, "ip");
    let from: IpAddr = arg(spec, "from");
    let stream = bulk_stream();
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let scq = ctx.create_cq(64, None);
    let rcq = ctx.create_cq(BULK_RECVS + 64, None);
    let qp = ctx
        .create_rd_qp(pd, bulk_caps(), scq.clone(), rcq.clone(), bulk_opts(ip))
        .unwrap();
    let rbuf = Buf::new(&ctx, pd, BULK_RECVS * BULK_MSG, Access::LOCAL_WRITE);
    for i in 0..BULK_RECVS {
        qp.post_recv(rbuf.recv(i as u64, i * BULK_MSG, BULK_MSG))
            .unwrap();
    }
    let a = qp.local_addr();
    say(&format!("ready {} {} {}", a.ip, a.port, a.qpn));
    let mut seq = 0u64;
    let mut buf = [blank(); 32];
    let mut last = Instant::now();
    while seq < BULK_COUNT {
        let k = rcq.poll(&mut buf);
        for c in &buf[..k] {
            let wc = c.wc;
            assert_eq!(
                (wc.status, wc.opcode, wc.byte_len as usize),
                (WcStatus::Success, WcOpcode::Recv, BULK_MSG),
                "receive of message {seq}: {wc:?}"
            );
            let sender = wc.src.expect("a source");
            assert_eq!(sender.ip, from);
            let i = wc.wr_id as usize;
            assert_eq!(i, seq as usize % BULK_RECVS, "receives complete in order");
            let got = &rbuf.bytes()[i * BULK_MSG..(i + 1) * BULK_MSG];
            if let Err(e) = bulk_check(&stream, seq, got) {
                panic!("{e}");
            }
            seq += 1;
            qp.post_recv(rbuf.recv(i as u64, i * BULK_MSG, BULK_MSG))
                .unwrap();
            if seq.is_multiple_of(CREDIT_EVERY) {
                // Unsignaled: only a failure completes.
                let credit = SendWr {
                    wr_id: seq,
                    op: send_op(None),
                    payload: Payload::Inline(InlineData::new(&seq.to_le_bytes()).unwrap()),
                    flags: SendFlags::default(),
                };
                qp.post_send(credit, sender).unwrap();
            }
        }
        let failed = scq.poll(&mut buf[..1]);
        assert_eq!(failed, 0, "a credit Send failed: {:?}", buf[0]);
        if k > 0 {
            last = Instant::now();
        } else {
            assert!(
                last.elapsed() < Duration::from_secs(30),
                "nothing for 30 s after message {seq}"
            );
            thread::yield_now();
        }
    }
    let s = rd_stats(&qp);
    say(&format!(
        "received n={seq} rx_datagrams={} delivered={} out_of_order={} duplicates={} naks={} no_recv={}",
        s.qp.rx_datagrams, s.rd.delivered, s.rd.out_of_order, s.rd.duplicates, s.rd.naks_sent,
        s.qp.rx_no_recv
    ));
    assert_eq!(s.qp.rx_no_recv, 0);
    // Stay until the sender has seen the last acknowledgements.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// Sends [`BULK_COUNT`] Sends to `to`, at most [`BULK_OUTSTANDING`] at a
/// time; every one must succeed.
fn peer_bulk_send(spec: &str) {
    let ip: IpAddr = arg(spec, "ip");
    let to = DgramAddr {
        ip: arg(spec, "to"),
        port: arg(spec, "port"),
        qpn: arg(spec, "qpn"),
    };
    let stream = bulk_stream();
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let scq = ctx.create_cq(512, None);
    let rcq = ctx.create_cq(64, None);
    let qp = ctx
        .create_rd_qp(pd, bulk_caps(), scq.clone(), rcq.clone(), bulk_opts(ip))
        .unwrap();
    let cbuf = Buf::new(&ctx, pd, CREDIT_RECVS * 8, Access::LOCAL_WRITE);
    for i in 0..CREDIT_RECVS {
        qp.post_recv(cbuf.recv(i as u64, i * 8, 8)).unwrap();
    }
    // Messages the receiver has taken and posted receives for again.
    let mut credit = 0u64;
    // One source buffer per outstanding Send, refilled when it completes.
    let slots = BULK_OUTSTANDING as usize;
    let mut src = Buf::new(&ctx, pd, slots * BULK_MSG, Access::LOCAL_WRITE);
    let start = Instant::now();
    let mut posted = 0u64;
    let mut done = 0u64;
    let mut buf = [blank(); 32];
    let mut last = Instant::now();
    while done < BULK_COUNT {
        let k = rcq.poll(&mut buf);
        for c in &buf[..k] {
            assert_eq!(
                (c.wc.status, c.wc.byte_len),
                (WcStatus::Success, 8),
                "credit: {c:?}"
            );
            let i = c.wc.wr_id as usize;
            let v = u64::from_le_bytes(cbuf.bytes()[i * 8..i * 8 + 8].try_into().unwrap());
            credit = credit.max(v);
            qp.post_recv(cbuf.recv(i as u64, i * 8, 8)).unwrap();
        }
        while posted < BULK_COUNT
            && posted - done < BULK_OUTSTANDING
            && posted < credit + BULK_RECVS as u64
        {
            let i = posted as usize % slots;
            // The slot's previous Send completed (posted - done <
            // BULK_OUTSTANDING), so the engine no longer reads it.
            bulk_fill(
                &stream,
                posted,
                &mut src.mem[i * BULK_MSG..(i + 1) * BULK_MSG],
            );
            let w = wr(posted, send_op(None), src.sgl(i * BULK_MSG, BULK_MSG));
            qp.post_send(w, to).unwrap();
            posted += 1;
        }
        let k = scq.poll(&mut buf);
        for c in &buf[..k] {
            assert_eq!(
                (c.wc.wr_id, c.wc.status),
                (done, WcStatus::Success),
                "Sends complete in order, successfully; {:?}",
                rd_stats(&qp)
            );
            done += 1;
        }
        assert!(
            start.elapsed() < BULK_LIMIT,
            "only {done} of {BULK_COUNT} Sends completed within {BULK_LIMIT:?}"
        );
        if k > 0 {
            last = Instant::now();
        } else {
            assert!(
                last.elapsed() < Duration::from_secs(30),
                "no completion for 30 s after {done}"
            );
            thread::yield_now();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let s = rd_stats(&qp);
    say(&format!(
        "sent n={done} secs={secs:.3} data_sent={} retransmitted={} timeouts={} fast_retransmits={} tx_datagrams={}",
        s.rd.data_sent, s.rd.retransmitted, s.rd.timeouts, s.rd.fast_retransmits, s.qp.tx_datagrams
    ));
}

/// Serializes the bulk tests: each measures a rate on a 2-core machine.
static BULK: Mutex<()> = Mutex::new(());

fn bulk_under_loss(test: &str, permille: u32) {
    let _one_at_a_time = BULK.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut pair) = NetPair::for_test(test) else {
        return;
    };
    for side in 0..2 {
        pair.set_mtu(side, BULK_MTU as u32).unwrap();
        // Single datagrams through the veth, so loss hits datagrams, not
        // GSO runs (`netns_dgram.rs` explains).
        let out = Command::new("ip")
            .args(["-n", &pair.ns[side], "link", "set", "dev"])
            .args([pair.veth(side), "gso_max_segs", "1"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    pair.set_loss(1, permille).unwrap();
    let [a, b] = pair.addr;
    let exe = std::env::current_exe().unwrap();
    let mut rx = Peer::spawn(pair.command(1, &exe), &format!("bulk-recv ip={b} from={a}"));
    let to = rx.ready();
    let mut tx = Peer::spawn(
        pair.command(0, &exe),
        &format!(
            "bulk-send ip={a} to={} port={} qpn={}",
            to.ip, to.port, to.qpn
        ),
    );
    let sent = tx.expect("sent");
    let received = rx.expect("received");
    tx.finish();
    rx.tell("done");
    rx.finish();
    let field = |words: &[String], key: &str| -> f64 {
        words
            .iter()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} in {words:?}"))
            .parse()
            .unwrap()
    };
    let secs = field(&sent, "secs");
    // Exactly once: every datagram sent for the first time was delivered
    // once (retransmissions only ever as duplicates or after a loss).
    assert_eq!(
        field(&sent, "data_sent"),
        field(&received, "delivered"),
        "sender {sent:?}, receiver {received:?}"
    );
    let dropped = pair.dropped(1);
    assert!(dropped > 0, "the loss rule dropped nothing");
    let mib = (BULK_COUNT as usize * BULK_MSG) as f64 / (1 << 20) as f64;
    eprintln!(
        "{test}: {mib} MiB at {:.1} % loss in {secs:.2} s = {:.1} MB/s; kernel dropped {}; sender: {}; receiver: {}",
        f64::from(permille) / 10.0,
        (BULK_COUNT as usize * BULK_MSG) as f64 / secs / 1e6,
        dropped,
        sent.join(" "),
        received.join(" ")
    );
}

#[test]
fn rd_moves_256_mib_intact_and_in_order_under_0_1_percent_loss() {
    bulk_under_loss(
        "rd_moves_256_mib_intact_and_in_order_under_0_1_percent_loss",
        1,
    );
}

#[test]
fn rd_moves_256_mib_intact_and_in_order_under_1_percent_loss() {
    bulk_under_loss(
        "rd_moves_256_mib_intact_and_in_order_under_1_percent_loss",
        10,
    );
}

#[test]
fn rd_moves_256_mib_intact_and_in_order_under_5_percent_loss() {
    bulk_under_loss(
        "rd_moves_256_mib_intact_and_in_order_under_5_percent_loss",
        50,
    );
}

/// A busy poller runs its RD QP's due timers itself: a Send to a socket
/// that never answers is re-sent by the retransmission timer and finally
/// fails (`RetryExcErr`); while the test thread spins on `Cq::poll`, those
/// timer runs happen inline (`timers_inline`), not only on the progress
/// thread (which, woken at its millisecond resolution and taking the QP
/// lock from the poller, stalled busy-polled RD round trips by ~1 ms).
#[test]
fn busy_polled_rd_qp_runs_its_timers_inline() {
    let silent = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let a = end(rd_opts(local(0), fast_rd()));
    let src = Buf::with(&a.ctx, a.pd, pattern(7, 256), ALL);
    let dest = DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: silent.local_addr().unwrap().port(),
        qpn: u32::from(silent.local_addr().unwrap().port()) << 8,
    };
    a.qp.post_send(wr(1, send_op(None), src.sgl(0, 100)), dest)
        .unwrap();
    // fast_rd gives up after ~340 ms of silence; spin (no yield) until then.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = [blank(); 4];
    let got = loop {
        let k = a.scq.poll(&mut buf);
        if k > 0 {
            break buf[..k].to_vec();
        }
        assert!(Instant::now() < deadline, "the Send never failed");
    };
    assert_eq!(statuses(&got), vec![(1, WcStatus::RetryExcErr)]);
    let st = a.qp.stats();
    let rd = rd_stats(&a.qp).rd;
    assert!(rd.retransmitted >= 1, "{rd:?}");
    assert!(
        st.timers_inline >= 1,
        "no timer ran from the busy poller: inline {}, thread {}, {rd:?}",
        st.timers_inline,
        st.timers_thread
    );
    println!(
        "timer runs: inline {}, progress thread {}; {} retransmissions",
        st.timers_inline, st.timers_thread, rd.retransmitted
    );
}
