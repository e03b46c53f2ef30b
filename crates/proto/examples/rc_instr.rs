//! One 64-octet RC Send at a time between two sans-IO queue pairs (MPA
//! with CRC, as `softrdma perf` runs RC by default), nothing else: no
//! sockets, threads, clocks or locks. Its use is counting instructions
//! with callgrind, which, unlike a timed run, gives the same figure on a
//! noisy host:
//!
//! ```text
//! cargo build --release -p softrdma-proto --example rc_instr
//! valgrind --tool=callgrind --callgrind-out-file=rc.cg \
//!     target/release/examples/rc_instr 20000
//! callgrind_annotate --inclusive=yes rc.cg | grep -E 'tx_one|rx_one'
//! ```
//!
//! `tx_one` is the sender's share of a message (post, frame the FPDU, CRC,
//! write it to the stream, reap the send completion), `rx_one` the
//! receiver's (deframe, CRC check, parse, match, place, complete, repost
//! the receive); divide their inclusive counts by the message count.
//! Natively it prints the time per message, a sanity check only.

mod instr;

use std::time::Instant;

use softrdma_proto::memory::VecMemory;
use softrdma_proto::rc::{RcConfig, RcQp};
use softrdma_proto::wr::{RecvWr, SendWr, WcStatus};

use instr::{Bench, SIZE};

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
    let mut bench = Bench::new();
    let mut a = RcQp::new(RcConfig::default());
    let mut b = RcQp::new(RcConfig::default());
    for _ in 0..8 {
        b.post_recv(bench.recv).expect("receive");
    }
    let mut stream = Vec::with_capacity(2048);
    let t0 = Instant::now();
    for i in 0..bench.n {
        let wr = bench.send(i);
        stream.clear();
        tx_one(&mut a, &mut bench.mem, &mut stream, wr);
        rx_one(&mut b, &mut bench.mem, &stream, bench.recv);
    }
    bench.finish(t0);
}
