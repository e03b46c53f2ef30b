//! One 64-octet RC Send at a time between two sans-IO queue pairs (MPA
//! with CRC, as `softrdma perf` runs RC by default), nothing else: no
//! sockets, threads, clocks or locks. Its use is counting instructions
//! with callgrind, which, unlike a timed run, gives the same figure on a
//! noisy host:
//!
//! ```text
//! cargo build --release -p softrdma-proto --example rc_instr
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/rc.cg \
//!     target/release/examples/rc_instr 20000
//! callgrind_annotate --inclusive=yes /tmp/rc.cg | grep -E 'tx_one|rx_one'
//! ```
//!
//! `tx_one` is the sender's share of a message (post, frame the FPDU, CRC,
//! write it to the stream, reap the send completion), `rx_one` the
//! receiver's (deframe, CRC check, parse, match, place, complete, repost
//! the receive); divide their inclusive counts by the message count.
//! Natively it prints the time per message, a sanity check only.

use std::time::Instant;

use softrdma_proto::memory::{Access, VecMemory};
use softrdma_proto::rc::{RcConfig, RcQp};
use softrdma_proto::wr::{Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcStatus};

const SIZE: u32 = 64;

#[inline(never)]
fn tx_one(qp: &mut RcQp, mem: &mut VecMemory, stream: &mut Vec<u8>, wr: SendWr) {
    qp.post_send_and_transmit(wr, mem, stream)
        .expect("post")
        .expect("write");
    let (_, wc) = qp.poll_completion().expect("send completion");
    assert_eq!(wc.status, WcStatus::Success);
}

#[inline(never)]
fn rx_one(qp: &mut RcQp, mem: &mut VecMemory, stream: &[u8], recv: RecvWr) {
    qp.handle_bytes(stream, mem);
    let (_, wc) = qp.poll_completion().expect("receive completion");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, SIZE));
    qp.post_recv(recv).expect("repost");
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(20_000, |a| a.parse().expect("message count"));
    let mut mem = VecMemory::new();
    let rw = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
    let (sbase, rbase) = (0x10_0000u64, 0x20_0000u64);
    let src = mem.register(0, sbase, 4096, rw);
    let dst = mem.register(0, rbase, 4096, rw);
    for (i, b) in mem.bytes_mut(src).iter_mut().enumerate() {
        *b = i as u8;
    }
    let mut a = RcQp::new(RcConfig::default());
    let mut b = RcQp::new(RcConfig::default());
    let recv = RecvWr {
        wr_id: 7,
        sgl: SgList::single(rbase, 256, dst),
    };
    for _ in 0..8 {
        b.post_recv(recv).expect("receive");
    }
    let mut stream = Vec::with_capacity(2048);
    let t0 = Instant::now();
    for i in 0..n {
        let wr = SendWr {
            wr_id: i,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(sbase, SIZE, src)),
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        };
        stream.clear();
        tx_one(&mut a, &mut mem, &mut stream, wr);
        rx_one(&mut b, &mut mem, &stream, recv);
    }
    let per = t0.elapsed().as_nanos() as f64 / n as f64;
    assert_eq!(
        mem.bytes(dst)[..SIZE as usize],
        mem.bytes(src)[..SIZE as usize]
    );
    println!("{n} messages, {per:.0} ns each (both ends, one thread)");
}
