//! One 64-octet UD Send at a time between two sans-IO queue pairs, nothing
//! else: no sockets, threads, clocks or locks. Its use is counting
//! instructions with callgrind, which, unlike a timed run, gives the same
//! figure on a noisy host:
//!
//! ```text
//! cargo build --release -p softrdma-proto --example ud_instr
//! valgrind --tool=callgrind --callgrind-out-file=ud.cg \
//!     target/release/examples/ud_instr 20000
//! callgrind_annotate --inclusive=yes ud.cg | grep -E 'tx_one|rx_one'
//! ```
//!
//! `tx_one` is the sender's share of a message (post, frame, CRC, hand to
//! the sink, reap the send completion), `rx_one` the receiver's (parse,
//! CRC check, match, place, complete, repost the receive); divide their
//! inclusive counts by the message count. Natively it prints the message
//! count and the time per message, a sanity check only.

mod instr;

use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use softrdma_proto::memory::VecMemory;
use softrdma_proto::ud::{DatagramSink, UdConfig, UdQp};
use softrdma_proto::wr::{DgramAddr, RecvWr, SendWr, WcStatus};

use instr::{Bench, SIZE};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Keeps the last datagram offered, as one buffer.
struct LastDatagram {
    buf: Vec<u8>,
}

impl DatagramSink for LastDatagram {
    fn send(&mut self, _dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        self.buf.clear();
        for b in bufs {
            self.buf.extend_from_slice(b);
        }
        Ok(())
    }
}

#[inline(never)]
fn tx_one(qp: &mut UdQp, mem: &VecMemory, sink: &mut LastDatagram, wr: SendWr, to: DgramAddr) {
    let sent = qp
        .post_send_and_transmit(wr, to, mem, sink)
        .expect("post")
        .expect("sink");
    assert_eq!(sent, 1);
    let (_, wc) = qp.poll_completion().expect("send completion");
    assert_eq!(wc.status, WcStatus::Success);
}

#[inline(never)]
fn rx_one(qp: &mut UdQp, mem: &mut VecMemory, data: &[u8], now: Instant, recv: RecvWr) {
    qp.handle_datagram(LO, 4791, data, mem, now);
    let (_, wc) = qp.poll_completion().expect("receive completion");
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, SIZE));
    qp.post_recv(recv).expect("repost");
}

fn main() {
    let mut bench = Bench::new();
    let mut a = UdQp::new(UdConfig {
        qpn: 0x11,
        ..UdConfig::default()
    })
    .expect("sender");
    let mut b = UdQp::new(UdConfig {
        qpn: 0x22,
        ..UdConfig::default()
    })
    .expect("receiver");
    for _ in 0..8 {
        b.post_recv(bench.recv).expect("receive");
    }
    let to = DgramAddr {
        ip: LO,
        port: 4791,
        qpn: 0x22,
    };
    let mut sink = LastDatagram {
        buf: Vec::with_capacity(2048),
    };
    let now = Instant::now();
    let t0 = Instant::now();
    for i in 0..bench.n {
        let wr = bench.send(i);
        tx_one(&mut a, &bench.mem, &mut sink, wr, to);
        let data = std::mem::take(&mut sink.buf);
        rx_one(&mut b, &mut bench.mem, &data, now, bench.recv);
        sink.buf = data;
    }
    bench.finish(t0);
}
