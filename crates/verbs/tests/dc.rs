//! SoftDC over loopback, in one process (several contexts where a test
//! needs separate connection tables):
//!
//! * completion order per DCI across targets being connected, connected,
//!   unreachable (invitation timeout) and refusing (wrong key): error
//!   completions for the failing targets' work requests only, in order;
//! * one DCI reaching 1 000 distinct DCTs through a capacity-16 table:
//!   every message and every RDMA Write lands intact, never more than 16
//!   connections (table slots and RC QPs) at once, no descriptors leaked
//!   (a second round leaves the count where the first left it);
//! * many DCIs (in separate contexts, and several sharing one) sending to
//!   one DCT concurrently;
//! * every RC operation kind over DC (Send+imm, Write+imm, Read, atomics).
//! * graceful teardowns (evictions through a 4-slot table) raise no async
//!   events on either side (the internal RC QPs are quiet).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use softrdma_verbs::dc::{DcConfig, DcInitiator, DcOptions, DcTarget};
use softrdma_verbs::{
    Access, Completion, CompletionQueue, Context, MemoryRegion, Payload, PostError,
    ProtectionDomain, RecvWr, SendFlags, SendOp, SendWr, SgList, SharedReceiveQueue, WcOpcode,
    WcStatus, WorkCompletion,
};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const KEY: u64 = 0x00dc_0000_cafe;
const WAIT: Duration = Duration::from_secs(30);

/// The tests of this file run one at a time: `one_dci_thousand_dcts_capacity_16`
/// counts the descriptors of the whole process, which the other tests'
/// connections would otherwise change under it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn opts(capacity: usize, invite_timeout: Duration) -> DcOptions {
    DcOptions {
        table: DcConfig {
            capacity,
            invite_timeout,
            ..DcConfig::default()
        },
        bind_ip: LO,
    }
}

fn send_wr(wr_id: u64, mr: &MemoryRegion, off: usize, len: u32, signaled: bool) -> SendWr {
    let s = mr.sge(off, len);
    SendWr {
        wr_id,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Sgl(SgList::single(s.addr, s.length, s.lkey)),
        flags: SendFlags {
            signaled,
            ..SendFlags::default()
        },
    }
}

fn post_recvs(srq: &SharedReceiveQueue, mr: &MemoryRegion, n: usize, size: usize) {
    for i in 0..n {
        let s = mr.sge(i * size, size as u32);
        srq.post_recv(RecvWr {
            wr_id: i as u64,
            sgl: SgList::single(s.addr, s.length, s.lkey),
        })
        .unwrap();
    }
}

/// Polls until `n` completions arrived (panics after [`WAIT`]).
fn poll_n(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + WAIT;
    let mut out = Vec::with_capacity(n);
    let mut buf = [Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }; 32];
    while out.len() < n {
        let k = cq.poll(&mut buf[..(n - out.len()).min(32)]);
        out.extend_from_slice(&buf[..k]);
        if k == 0 {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} completions",
                out.len()
            );
            std::thread::yield_now();
        }
    }
    out
}

/// Nothing more arrives for a while.
fn assert_quiet(cq: &CompletionQueue) {
    let until = Instant::now() + Duration::from_millis(100);
    let mut buf = [Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }; 4];
    while Instant::now() < until {
        assert_eq!(cq.poll(&mut buf), 0, "unexpected completion {:?}", buf[0]);
        std::thread::yield_now();
    }
}

struct Server {
    _ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    srq: SharedReceiveQueue,
    mr: MemoryRegion,
    dcts: Vec<DcTarget>,
}

/// `n_dct` DCTs sharing an SRQ of `recvs` receives of `slot` octets at
/// the start of one region; the region has `extra` octets more after
/// them (RDMA targets).
fn server(
    n_dct: usize,
    recvs: usize,
    slot: usize,
    extra: usize,
    key: u64,
    capacity: usize,
) -> Server {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(recvs + 64, None);
    let srq = pd.create_srq(recvs);
    let mr = pd
        .register(
            recvs * slot + extra,
            Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
        )
        .unwrap();
    post_recvs(&srq, &mr, recvs, slot);
    let dcts = (0..n_dct)
        .map(|_| {
            pd.create_dct(&cq, &srq, key, opts(capacity, Duration::from_secs(5)))
                .unwrap()
        })
        .collect();
    Server {
        _ctx: ctx,
        pd,
        cq,
        srq,
        mr,
        dcts,
    }
}

#[test]
fn completion_order_and_per_target_errors() {
    let _serial = serial();
    let srv = server(2, 256, 64, 0, KEY, 16);
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let dci = pd
        .create_dci(&cq, 128, opts(16, Duration::from_millis(300)))
        .unwrap();
    let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    for i in 0..64u8 {
        mr.write_at(usize::from(i) * 64, &[i; 64]).unwrap();
    }
    let ah = pd.sdc_create_ah(LO);
    // A DCT number nobody answers on: a bound UDP socket that never
    // replies (invitations time out).
    let silent = UdpSocket::bind((LO, 0)).unwrap();
    let silent_dct = u32::from(silent.local_addr().unwrap().port()) << 8;
    let (a, b) = (srv.dcts[0].number(), srv.dcts[1].number());
    // Interleave: A (new), silent (never answers), B with a wrong key,
    // A again, B right key (new), ... Only signaled WRs and errors show.
    let plan: Vec<(u32, u64, bool)> = (0..40)
        .map(|i| match i % 5 {
            0 => (a, KEY, true),
            1 => (silent_dct, KEY, true),
            2 => (b, KEY ^ 1, i % 2 == 0),
            3 => (a, KEY, false),
            _ => (b, KEY, true),
        })
        .collect();
    for (i, &(dct, key, sig)) in plan.iter().enumerate() {
        dci.post_send(send_wr(i as u64, &mr, i * 64, 64, sig), &ah, dct, key)
            .unwrap();
    }
    // Expected: all signaled ones plus every error, in posting order.
    let expected: Vec<(u64, WcStatus)> = plan
        .iter()
        .enumerate()
        .filter_map(|(i, &(dct, key, sig))| {
            let st = if dct == silent_dct {
                WcStatus::RetryExcErr
            } else if key != KEY {
                WcStatus::RemAccessErr
            } else {
                WcStatus::Success
            };
            (sig || st != WcStatus::Success).then_some((i as u64, st))
        })
        .collect();
    let got: Vec<(u64, WcStatus)> = poll_n(&cq, expected.len())
        .iter()
        .map(|c| {
            assert_eq!(c.qp_num, dci.qp_num());
            (c.wc.wr_id, c.wc.status)
        })
        .collect();
    assert_eq!(got, expected);
    assert_quiet(&cq);
    assert_eq!(dci.outstanding(), 0);
    // The right-key messages arrived intact, each once.
    let delivered = poll_n(&srv.cq, 24);
    let mut seen = HashSet::new();
    for c in &delivered {
        assert_eq!(c.wc.status, WcStatus::Success);
        assert_eq!(c.wc.byte_len, 64);
        let mut buf = [0u8; 64];
        srv.mr.read_at(c.wc.wr_id as usize * 64, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == buf[0]), "torn message");
        assert!(seen.insert(buf[0]), "message {} twice", buf[0]);
        let (dct, key, _) = plan[usize::from(buf[0])];
        assert!(dct != silent_dct && key == KEY);
    }
    assert_quiet(&srv.cq);
    // The wrong key was rejected, counted and reported.
    assert!(srv.dcts[1].rejected() >= 1);
    assert_eq!(srv.dcts[0].rejected(), 0);
    assert!(!srv.dcts[1].take_rejections().is_empty());
    let st = dci.stats();
    assert!(st.table.timeouts >= 1);
    assert!(st.table.retransmits >= 3, "{st:?}");
    // The DCI keeps working after errors.
    dci.post_send(send_wr(99, &mr, 0, 64, true), &ah, a, KEY)
        .unwrap();
    let c = poll_n(&cq, 1);
    assert_eq!((c[0].wc.wr_id, c[0].wc.status), (99, WcStatus::Success));
    // Unsupported and invalid requests change nothing.
    let mut wr = send_wr(5, &mr, 0, 8, true);
    wr.op = SendOp::WriteRecord {
        remote_addr: 0,
        rkey: 0,
    };
    assert_eq!(dci.post_send(wr, &ah, a, KEY), Err(PostError::Unsupported));
    let other_pd = ctx.alloc_pd();
    let foreign = other_pd.sdc_create_ah(LO);
    assert_eq!(
        dci.post_send(send_wr(6, &mr, 0, 8, true), &foreign, a, KEY),
        Err(PostError::Invalid)
    );
    drop(srv.pd);
    drop(srv.srq);
}

#[test]
fn every_rc_operation_over_dc() {
    let _serial = serial();
    let srv = server(1, 16, 256, 4096, KEY, 16);
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, None);
    let dci = pd.create_dci(&cq, 32, DcOptions::default()).unwrap();
    let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
    mr.write_at(0, b"0123456789abcdef").unwrap();
    let ah = pd.sdc_create_ah(LO);
    let dct = srv.dcts[0].number();
    let rkey = srv.mr.rkey();
    let raddr = srv.mr.addr();
    let sge = |off: usize, len: u32| {
        let s = mr.sge(off, len);
        Payload::Sgl(SgList::single(s.addr, s.length, s.lkey))
    };
    let flags = SendFlags {
        signaled: true,
        ..SendFlags::default()
    };
    // Counter for the atomics (8-aligned), in the server's region.
    srv.mr.write_at(6144, &5u64.to_ne_bytes()).unwrap();
    let wrs = [
        SendWr {
            wr_id: 1,
            op: SendOp::Send {
                imm: Some(0xabcd),
                invalidate: None,
            },
            payload: sge(0, 16),
            flags,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::Write {
                remote_addr: raddr + 7096,
                rkey,
                imm: None,
            },
            payload: sge(0, 16),
            flags,
        },
        SendWr {
            wr_id: 3,
            op: SendOp::Write {
                remote_addr: raddr + 7196,
                rkey,
                imm: Some(77),
            },
            payload: sge(0, 4),
            flags,
        },
        SendWr {
            wr_id: 4,
            op: SendOp::Read {
                remote_addr: raddr + 7096,
                rkey,
            },
            payload: sge(1024, 16),
            flags,
        },
        SendWr {
            wr_id: 5,
            op: SendOp::FetchAdd {
                remote_addr: raddr + 6144,
                rkey,
                add: 10,
            },
            payload: sge(2048, 8),
            flags,
        },
        SendWr {
            wr_id: 6,
            op: SendOp::CompareSwap {
                remote_addr: raddr + 6144,
                rkey,
                compare: 15,
                swap: 100,
            },
            payload: sge(2056, 8),
            flags,
        },
    ];
    for wr in wrs {
        dci.post_send(wr, &ah, dct, KEY).unwrap();
    }
    let got = poll_n(&cq, 6);
    let ops: Vec<(u64, WcStatus, WcOpcode)> = got
        .iter()
        .map(|c| (c.wc.wr_id, c.wc.status, c.wc.opcode))
        .collect();
    assert_eq!(
        ops,
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::RdmaWrite),
            (3, WcStatus::Success, WcOpcode::RdmaWrite),
            (4, WcStatus::Success, WcOpcode::RdmaRead),
            (5, WcStatus::Success, WcOpcode::FetchAdd),
            (6, WcStatus::Success, WcOpcode::CompSwap),
        ]
    );
    let mut b = [0u8; 16];
    mr.read_at(1024, &mut b).unwrap();
    assert_eq!(&b, b"0123456789abcdef");
    let mut v = [0u8; 8];
    mr.read_at(2048, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 5);
    mr.read_at(2056, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 15);
    srv.mr.read_at(6144, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 100);
    // The target saw the Send with immediate and the Write with immediate.
    let rx = poll_n(&srv.cq, 2);
    assert_eq!(rx[0].wc.imm, Some(0xabcd));
    assert_eq!(rx[0].wc.byte_len, 16);
    assert_eq!(rx[1].wc.imm, Some(77));
    assert_eq!(rx[1].wc.opcode, WcOpcode::RecvRdmaWithImm);
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn one_dci_thousand_dcts_capacity_16() {
    let _serial = serial();
    const N: usize = 1000;
    const SLOT: usize = 64;
    let srv = server(N, N + 16, SLOT, N * SLOT, KEY, 16);
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let dci = pd
        .create_dci(&cq, 64, opts(16, Duration::from_secs(10)))
        .unwrap();
    let mr = pd.register(N * SLOT, Access::LOCAL_WRITE).unwrap();
    let ah = pd.sdc_create_ah(LO);
    let wregion = srv.mr.addr();
    let round = |r: u8| {
        for i in 0..N {
            let mut msg = [0u8; SLOT];
            msg[..4].copy_from_slice(&(i as u32).to_be_bytes());
            msg[4] = r;
            for (k, b) in msg[5..].iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(31).wrapping_add(k as u8) ^ r;
            }
            mr.write_at(i * SLOT, &msg).unwrap();
        }
        let mut posted = 0;
        let mut done = 0;
        let mut sends = 0;
        let t0 = Instant::now();
        while done < 2 * N {
            // At most 64 outstanding: the CQ (256) never overruns.
            while posted < 2 * N && posted - done < 64 {
                // Each DCT gets a Send and then an RDMA Write of the same
                // message (into its own slot after the receive buffers).
                let i = posted / 2;
                let dct = srv.dcts[i].number();
                let wr = if posted % 2 == 0 {
                    send_wr(posted as u64, &mr, i * SLOT, SLOT as u32, true)
                } else {
                    let s = mr.sge(i * SLOT, SLOT as u32);
                    SendWr {
                        wr_id: posted as u64,
                        op: SendOp::Write {
                            remote_addr: wregion + ((N + 16 + i) * SLOT) as u64,
                            rkey: srv.mr.rkey(),
                            imm: None,
                        },
                        payload: Payload::Sgl(SgList::single(s.addr, s.length, s.lkey)),
                        flags: SendFlags {
                            signaled: true,
                            ..SendFlags::default()
                        },
                    }
                };
                match dci.post_send(wr, &ah, dct, KEY) {
                    Ok(()) => posted += 1,
                    Err(PostError::QueueFull) => break,
                    Err(e) => panic!("{e:?}"),
                }
            }
            for c in poll_n(&cq, 1) {
                assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
                assert_eq!(c.wc.wr_id, done as u64, "out of order");
                done += 1;
            }
            let st = dci.stats();
            assert!(st.live <= 16 && st.rc_qps <= 16, "{st:?}");
            if done % 200 == 0 {
                eprintln!("round {r}: {done}/{} in {:?}", 2 * N, t0.elapsed());
            }
        }
        // Every Send arrived once, intact, from the right DCI.
        let rx = poll_n(&srv.cq, N);
        let mut seen = vec![false; N];
        for c in &rx {
            assert_eq!(c.wc.status, WcStatus::Success);
            assert_eq!(c.wc.byte_len as usize, SLOT);
            let mut msg = [0u8; SLOT];
            srv.mr
                .read_at(c.wc.wr_id as usize * SLOT, &mut msg)
                .unwrap();
            let i = u32::from_be_bytes(msg[..4].try_into().unwrap()) as usize;
            assert!(i < N && !seen[i], "message {i} twice or bogus");
            seen[i] = true;
            assert_eq!(msg[4], r);
            for (k, b) in msg[5..].iter().enumerate() {
                assert_eq!(*b, (i as u8).wrapping_mul(31).wrapping_add(k as u8) ^ r);
            }
            sends += 1;
            // Give the receive back.
            let s = srv.mr.sge(c.wc.wr_id as usize * SLOT, SLOT as u32);
            srv.srq
                .post_recv(RecvWr {
                    wr_id: c.wc.wr_id,
                    sgl: SgList::single(s.addr, s.length, s.lkey),
                })
                .unwrap();
        }
        assert_eq!(sends, N);
        // Every Write landed (a Write completes when sent: wait for the
        // placement).
        let deadline = Instant::now() + WAIT;
        for i in 0..N {
            let mut want = [0u8; SLOT];
            mr.read_at(i * SLOT, &mut want).unwrap();
            loop {
                let mut got = [0u8; SLOT];
                srv.mr.read_at((N + 16 + i) * SLOT, &mut got).unwrap();
                if got == want {
                    break;
                }
                assert!(Instant::now() < deadline, "Write {i} never landed");
                std::thread::yield_now();
            }
        }
    };
    round(1);
    let st = dci.stats();
    assert!(st.table.max_live <= 16, "{st:?}");
    assert!(st.max_rc_qps <= 16, "{st:?}");
    assert!(
        st.table.evictions + st.table.idle_closes >= (N - 16) as u64,
        "{st:?}"
    );
    let srv_st = srv.dcts[0].stats();
    assert!(srv_st.table.max_live <= 16, "{srv_st:?}");
    assert!(srv_st.max_rc_qps <= 16, "{srv_st:?}");
    // Steady state: a second round opens and closes as many connections
    // and must leave no descriptor behind.
    std::thread::sleep(Duration::from_millis(200));
    let fds = fd_count();
    round(2);
    // Connections being evicted or idle-closed at the end of the round
    // still hold their descriptors for a moment: a leak never comes back
    // down, a close in flight does.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut after = fd_count();
    while after > fds + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        after = fd_count();
    }
    assert!(
        after <= fds + 2,
        "descriptors grew from {fds} to {after} over 1000 connections (10 s after the round)"
    );
    let st = dci.stats();
    assert!(st.table.max_live <= 16 && st.max_rc_qps <= 16, "{st:?}");
}

#[test]
fn many_dcis_one_dct() {
    let _serial = serial();
    const PER: usize = 100;
    let srv = server(1, 2048, 64, 0, KEY, 64);
    let dct = srv.dcts[0].number();
    // Four contexts with their own table, two DCIs each (sharing that
    // context's connection), all at once.
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            std::thread::spawn(move || {
                let ctx = Context::open().unwrap();
                let pd = ctx.alloc_pd();
                let ah = pd.sdc_create_ah(LO);
                let mr = pd.register(2 * PER * 64, Access::LOCAL_WRITE).unwrap();
                let cqs: Vec<CompletionQueue> = (0..2).map(|_| ctx.create_cq(PER, None)).collect();
                let dcis: Vec<DcInitiator> = cqs
                    .iter()
                    .map(|cq| pd.create_dci(cq, PER, DcOptions::default()).unwrap())
                    .collect();
                for (d, dci) in dcis.iter().enumerate() {
                    for i in 0..PER {
                        let off = (d * PER + i) * 64;
                        let mut m = [t; 64];
                        m[1] = d as u8;
                        m[2..4].copy_from_slice(&(i as u16).to_be_bytes());
                        mr.write_at(off, &m).unwrap();
                        dci.post_send(send_wr(i as u64, &mr, off, 64, true), &ah, dct, KEY)
                            .unwrap();
                    }
                }
                for cq in &cqs {
                    let got = poll_n(cq, PER);
                    for (i, c) in got.iter().enumerate() {
                        assert_eq!((c.wc.wr_id, c.wc.status), (i as u64, WcStatus::Success));
                    }
                }
            })
        })
        .collect();
    let rx = poll_n(&srv.cq, 4 * 2 * PER);
    for t in threads {
        t.join().unwrap();
    }
    let mut seen = HashSet::new();
    // Per (context, DCI), messages arrive in order.
    let mut next = std::collections::HashMap::new();
    for c in &rx {
        assert_eq!(c.wc.status, WcStatus::Success);
        let mut m = [0u8; 64];
        srv.mr.read_at(c.wc.wr_id as usize * 64, &mut m).unwrap();
        let i = u16::from_be_bytes([m[2], m[3]]);
        assert!(seen.insert((m[0], m[1], i)));
        let n = next.entry((m[0], m[1])).or_insert(0u16);
        assert_eq!(*n, i, "out of order from {:?}", (m[0], m[1]));
        *n += 1;
        assert!(m[4..].iter().all(|&x| x == m[0]));
    }
    assert_eq!(seen.len(), 800);
    assert_eq!(srv.dcts[0].rejected(), 0);
}

/// Every async event queued on `ctx` now (none left after).
fn drain_events(ctx: &Context) -> Vec<softrdma_verbs::AsyncEvent> {
    std::iter::from_fn(|| ctx.get_async_event(Some(Duration::from_millis(20)))).collect()
}

#[test]
fn evictions_raise_no_async_events() {
    let _serial = serial();
    // 40 DCTs through a 4-slot initiator table, two rounds: well over 70
    // graceful teardowns on each side, none of them an async error.
    const N: usize = 40;
    let srv = server(N, 2 * N + 16, 64, 0, KEY, 16);
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let dci = pd
        .create_dci(&cq, 16, opts(4, Duration::from_secs(10)))
        .unwrap();
    let mr = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let ah = pd.sdc_create_ah(LO);
    for round in 0..2u64 {
        for (i, d) in srv.dcts.iter().enumerate() {
            let id = round * N as u64 + i as u64;
            dci.post_send(send_wr(id, &mr, 0, 64, true), &ah, d.number(), KEY)
                .unwrap();
            let c = poll_n(&cq, 1)[0];
            assert_eq!((c.wc.wr_id, c.wc.status), (id, WcStatus::Success));
        }
    }
    assert_eq!(poll_n(&srv.cq, 2 * N).len(), 2 * N);
    let st = dci.stats();
    assert!(
        st.table.evictions + st.table.idle_closes >= (2 * N - 4) as u64,
        "{st:?}"
    );
    // The target side notices the closes (its reaper runs every 50 ms).
    let deadline = Instant::now() + WAIT;
    while srv.dcts[0].stats().live > 4 {
        assert!(Instant::now() < deadline, "{:?}", srv.dcts[0].stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    for (who, c) in [("initiator", &ctx), ("target", &srv._ctx)] {
        let evs = drain_events(c);
        assert!(
            evs.is_empty(),
            "{who}: {} async events after graceful DC teardowns, e.g. {:?}",
            evs.len(),
            evs.first()
        );
    }
}
