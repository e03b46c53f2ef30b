//! ud_pathcost: the CPU cost of the UD data path against raw UDP, with no
//! waiting: one thread drives both ends in turn, so every poll finds its
//! datagram already queued (loopback UDP delivers inside `sendmsg`). What
//! is left is the work per message, repeatable enough for
//! `valgrind --tool=callgrind` (the rc_pathcost of datagrams).
//!
//! ```sh
//! cargo run --release -p softrdma-engine --example ud_pathcost -- [ITERS] [MSG] [udp,ud,wr,empty,lat]
//! ```
//!
//! Prints ns per one-way message of raw UDP (`send_to` + `recv_from` on
//! non-blocking sockets) and of UD Send (post_send, poll the peer's CQ
//! until the receive completes, repost), the ratio, and the polls that
//! found nothing; `lat` (not run by default) the same in a ping-pong's
//! shape — each receiver polls once in vain before its message comes, as
//! a busy-polling ping-pong does between messages, so the batch sizer
//! offers one buffer and a poll is a `recvfrom` (the plain loop finds a
//! datagram at every poll and keeps full `recvmmsg` batches), raw UDP
//! reading once in vain likewise; then (`wr`) 64 KiB Write-Records one at a time, each
//! awaited at the target, in ns per message; `empty` (not run by
//! default) times one busy poll that finds nothing, raw `recv_from`
//! against the UD CQ's `poll` (its receive path first brought to the shape
//! a ping-pong's polls have).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Instant;

use softrdma_engine::config::Config;
use softrdma_engine::{Completion, Context, QpCaps, UdOptions};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

const NONE: Completion = Completion {
    wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
    qp_num: 0,
};

fn main() {
    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .map(|s| s.parse().expect("a number"))
            .unwrap_or(d)
    };
    let (iters, msg) = (arg(1, 200_000), arg(2, 64));
    assert!((1..=1024).contains(&msg), "MSG in 1..=1024");
    let which = std::env::args().nth(3).unwrap_or("udp,ud,wr".into());
    let run = |name: &str| which.split(',').any(|w| w == name);

    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let out = vec![7u8; msg];
    let mut inb = vec![0u8; 2048];
    let mut empty = 0u64;
    let mut one = |from: &UdpSocket, to: &UdpSocket, dest: SocketAddr, empty: &mut u64| {
        from.send_to(&out, dest).unwrap();
        while to.recv_from(&mut inb).is_err() {
            *empty += 1;
        }
    };
    for _ in 0..1000 {
        one(&a, &b, ba, &mut empty);
        one(&b, &a, aa, &mut empty);
    }
    let t = Instant::now();
    for _ in 0..if run("udp") { iters } else { 0 } {
        one(&a, &b, ba, &mut empty);
        one(&b, &a, aa, &mut empty);
    }
    let udp = t.elapsed().as_nanos() as f64 / (2 * iters) as f64;
    println!("raw UDP {msg} B        {udp:8.1} ns/msg  (empty reads {empty})");

    let cfg = Config::from_env().expect("SOFTRDMA_*");
    let opts = UdOptions {
        bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        ..Default::default()
    };
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 64,
    };
    let ends: Vec<_> = (0..2)
        .map(|_| {
            let ctx = Context::with_config(cfg.clone()).unwrap();
            let pd = ctx.alloc_pd();
            let cq = ctx.create_cq(1024, None);
            let qp = ctx
                .create_ud_qp(pd, caps, cq.clone(), cq.clone(), opts)
                .unwrap();
            let mut buf = vec![0u8; 64 * 2048];
            let rw = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
            // SAFETY: `buf` is kept in `ends` (never moved or resized) until
            // the end of main, after the QPs are dropped.
            let stag = unsafe {
                ctx.registry()
                    .register(buf.as_mut_ptr(), buf.len(), buf.as_ptr() as u64, rw, pd)
                    .unwrap()
            };
            (ctx, cq, qp, buf, stag)
        })
        .collect();
    let recv = |e: usize, k: u64| RecvWr {
        wr_id: k,
        sgl: SgList::single(ends[e].3.as_ptr() as u64 + 2048 + k * 2048, 2048, ends[e].4),
    };
    for (e, end) in ends.iter().enumerate() {
        for k in 0..32 {
            end.2.post_recv(recv(e, k)).unwrap();
        }
    }
    let dest = [ends[0].2.local_addr(), ends[1].2.local_addr()];
    let mut outc = [NONE; 16];
    let mut polls_empty = 0u64;
    let mut send = |from: usize, to: usize, signaled: bool, empty: &mut u64| {
        let wr = SendWr {
            wr_id: 1,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(
                ends[from].3.as_ptr() as u64,
                msg as u32,
                ends[from].4,
            )),
            flags: SendFlags {
                signaled,
                ..Default::default()
            },
        };
        ends[from].2.post_send(wr, dest[to]).unwrap();
        loop {
            let n = ends[to].1.poll(&mut outc);
            if n == 0 {
                *empty += 1;
                continue;
            }
            let mut got = false;
            for c in &outc[..n] {
                assert_eq!(c.wc.status, WcStatus::Success, "{:?}", c.wc);
                if c.wc.opcode == WcOpcode::Recv {
                    ends[to].2.post_recv(recv(to, c.wc.wr_id)).unwrap();
                    got = true;
                }
            }
            if got {
                break;
            }
        }
    };
    for i in 0..1000 {
        send(0, 1, i % 16 == 0, &mut polls_empty);
        send(1, 0, i % 16 == 0, &mut polls_empty);
    }
    polls_empty = 0;
    let t = Instant::now();
    for i in 0..if run("ud") { iters } else { 0 } {
        send(0, 1, i % 16 == 0, &mut polls_empty);
        send(1, 0, i % 16 == 0, &mut polls_empty);
    }
    let ud = t.elapsed().as_nanos() as f64 / (2 * iters) as f64;
    println!(
        "UD Send {msg} B        {ud:8.1} ns/msg  {:5.2}x  (empty polls {polls_empty})",
        ud / udp
    );

    // In a ping-pong's shape: the receiver polls once and finds nothing
    // before each message arrives (so the batch sizer stays at one buffer
    // and a poll is a `recvfrom`), raw UDP likewise reads once in vain.
    if run("lat") {
        let mut spare = [NONE; 16];
        let mut scratch = vec![0u8; 2048];
        let mut raw_empty = 0u64;
        let t = Instant::now();
        for _ in 0..iters {
            assert!(b.recv_from(&mut scratch).is_err());
            one(&a, &b, ba, &mut raw_empty);
            assert!(a.recv_from(&mut scratch).is_err());
            one(&b, &a, aa, &mut raw_empty);
        }
        let raw = t.elapsed().as_nanos() as f64 / (2 * iters) as f64;
        let mut lat_empty = 0u64;
        let t = Instant::now();
        // Polls until one finds nothing (a poll that hands over a Send
        // completion returns before it reads the socket), never a receive.
        let vain = |e: usize, spare: &mut [Completion]| loop {
            let n = ends[e].1.poll(spare);
            assert!(spare[..n].iter().all(|c| c.wc.opcode != WcOpcode::Recv));
            if n == 0 {
                break;
            }
        };
        for i in 0..iters {
            vain(1, &mut spare);
            send(0, 1, i % 16 == 0, &mut lat_empty);
            vain(0, &mut spare);
            send(1, 0, i % 16 == 0, &mut lat_empty);
        }
        let lat = t.elapsed().as_nanos() as f64 / (2 * iters) as f64;
        println!(
            "ping-pong shape: raw UDP {raw:8.1} ns/msg, UD Send {lat:8.1} ns/msg  {:5.2}x  \
             (+{:.0} ns; extra empty reads {raw_empty}, polls {lat_empty})",
            lat / raw,
            lat - raw
        );
    }

    // Empty polls: what one busy-poll round costs when nothing has come
    // (half of it, on average, is added to every message's latency).
    if run("empty") {
        // Receive as a ping-pong does, one datagram after an empty poll,
        // until the receive path is in its latency shape: the batch sizer
        // offering one buffer and GRO off and settled, so that a poll is
        // the `recvfrom` a ping-pong's polls are (the loop above finds a
        // datagram at every poll, which keeps the sizer at full batches,
        // i.e. `recvmmsg`).
        let mut spare = [NONE; 16];
        for _ in 0..32 {
            send(0, 1, false, &mut polls_empty);
            assert_eq!(ends[1].1.poll(&mut spare), 0);
        }
        let n = 1_000_000u32;
        let t = Instant::now();
        for _ in 0..n {
            let _ = a.recv_from(&mut inb);
        }
        let raw = t.elapsed().as_nanos() as f64 / f64::from(n);
        let t = Instant::now();
        for _ in 0..n {
            assert_eq!(ends[1].1.poll(&mut outc), 0);
        }
        let cq = t.elapsed().as_nanos() as f64 / f64::from(n);
        println!("empty poll: raw UDP recv_from {raw:6.1} ns, UD CQ poll {cq:6.1} ns");
    }

    // Write-Record of 64 KiB from 0 to 1 (into 1's buffer at 0), waiting
    // for the record at 1 each time: per-message cost of the segmented
    // one-sided path (45 full datagrams and one short at MTU 1500).
    if !run("wr") {
        return;
    }
    const WR: usize = 64 << 10;
    let rounds = (iters / 64).max(10);
    let rec = |i: u64| SendWr {
        wr_id: i,
        op: SendOp::WriteRecord {
            remote_addr: ends[1].3.as_ptr() as u64,
            rkey: ends[1].4,
        },
        payload: Payload::Sgl(SgList::single(
            ends[0].3.as_ptr() as u64,
            WR as u32,
            ends[0].4,
        )),
        flags: SendFlags {
            signaled: i.is_multiple_of(16),
            ..Default::default()
        },
    };
    let (mut partial, mut empty) = (0u64, 0u64);
    let t = Instant::now();
    for i in 0..rounds as u64 {
        ends[0].2.post_send(rec(i), dest[1]).unwrap();
        'wait: loop {
            let _ = ends[0].1.poll(&mut outc);
            let n = ends[1].1.poll(&mut outc);
            if n == 0 {
                empty += 1;
            }
            for c in &outc[..n] {
                if c.wc.opcode == WcOpcode::RecvWriteRecord {
                    partial += u64::from(c.wc.status != WcStatus::Success);
                    break 'wait;
                }
            }
        }
    }
    let per = t.elapsed().as_nanos() as f64 / rounds as f64;
    println!(
        "Write-Record 64 KiB  {per:8.1} ns/msg  {:.2} Gbit/s  (partial {partial}, empty polls {empty})",
        WR as f64 * 8.0 / per
    );
}
