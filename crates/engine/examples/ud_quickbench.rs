//! ud_quickbench: UD Send bandwidth over loopback, to see what UDP GSO/GRO
//! and the MTU do. Both contexts live in this process; one thread posts
//! Sends (at most 16 messages in flight) and busy-polls both CQs, the
//! progress threads help. Not a perftest: one run, no baseline.
//!
//! ```sh
//! cargo run --release -p softrdma-engine --example ud_quickbench -- [MTU] [MSG_LEN] [COUNT]
//! SOFTRDMA_DGRAM_OFFLOAD=0 cargo run --release … # without GSO/GRO
//! ```
//!
//! Defaults: MTU 1500, 65536-octet messages, 20000 of them. Prints the
//! goodput of messages delivered and what the sender's socket did.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use softrdma_engine::config::Config;
use softrdma_engine::dgram::ProtoStats;
use softrdma_engine::{Completion, Context, QpCaps, UdOptions};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .map(|s| s.parse().expect("a number"))
        .unwrap_or(default)
}

fn main() {
    let (mtu, len, count) = (arg(1, 1500), arg(2, 65536), arg(3, 20000));
    const RECVS: usize = 64;
    const WINDOW: usize = 16;
    let opts = UdOptions {
        bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        mtu: Some(mtu),
        ..Default::default()
    };
    let config = Config::from_env().expect("SOFTRDMA_* settings");
    let a = Context::with_config(config.clone()).unwrap();
    let b = Context::with_config(config.clone()).unwrap();
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(4096, None), b.create_cq(4096, None));
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
    };
    let qa = a
        .create_ud_qp(pa, caps, ca.clone(), ca.clone(), opts)
        .unwrap();
    let qb = b
        .create_ud_qp(pb, caps, cb.clone(), cb.clone(), opts)
        .unwrap();
    let mut src = vec![0x5Au8; len];
    let mut dst = vec![0u8; len * RECVS];
    let rw = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
    // SAFETY: both buffers outlive the contexts' use of them (the QPs are
    // dropped before them, at the end of main, in reverse order).
    let (sa, sb) = unsafe {
        (
            a.registry()
                .register(src.as_mut_ptr(), len, src.as_ptr() as u64, rw, pa)
                .unwrap(),
            b.registry()
                .register(dst.as_mut_ptr(), len * RECVS, dst.as_ptr() as u64, rw, pb)
                .unwrap(),
        )
    };
    let recv = |i: u64| RecvWr {
        wr_id: i,
        sgl: SgList::single(dst.as_ptr() as u64 + i * len as u64, len as u32, sb),
    };
    for i in 0..RECVS as u64 {
        qb.post_recv(recv(i)).unwrap();
    }
    let dest = qb.local_addr();
    let send = SendWr {
        wr_id: 0,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Sgl(SgList::single(src.as_ptr() as u64, len as u32, sa)),
        flags: SendFlags {
            signaled: true,
            ..Default::default()
        },
    };
    let blank = Completion {
        wc: WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0),
        qp_num: 0,
    };
    let mut buf = [blank; 64];
    let (mut sent, mut got, mut lost) = (0usize, 0usize, 0usize);
    let t0 = Instant::now();
    let give_up = t0 + Duration::from_secs(60);
    let mut idle = 0u32;
    while got + lost < count && Instant::now() < give_up {
        while sent < count && sent - got - lost < WINDOW {
            qa.post_send(send, dest).unwrap();
            sent += 1;
        }
        ca.poll(&mut buf);
        let k = cb.poll(&mut buf);
        for c in &buf[..k] {
            assert_eq!(c.wc.status, WcStatus::Success);
            got += 1;
            qb.post_recv(recv(c.wc.wr_id)).unwrap();
        }
        idle = if k == 0 { idle + 1 } else { 0 };
        if idle > 10_000 {
            // Stalled: count messages the receiver dropped.
            if let ProtoStats::Ud(s) = qb.stats().proto {
                lost = (s.rx_timeouts + s.rx_evicted + s.rx_no_recv) as usize;
            }
            idle = 0;
        }
    }
    let dt = t0.elapsed();
    let s = qa.socket_stats();
    println!(
        "MTU {mtu}, {len}-octet messages, offload {}: {got} of {count} delivered in {dt:.2?}: {:.2} GB/s; \
         sender: {} datagrams in {} send calls",
        config.dgram_offload,
        (got * len) as f64 / dt.as_secs_f64() / 1e9,
        s.tx_datagrams,
        s.tx_calls,
    );
    drop((qa, qb));
}
