//! One 64-octet UD Send at a time between two sans-IO queue pairs, nothing
//! else: no sockets, threads, clocks or locks. Its use is counting
//! instructions with callgrind, which, unlike a timed run, gives the same
//! figure on a noisy host:
//!
//! ```text
//! cargo build --release -p softrdma-proto --example ud_instr
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/ud.cg \
//!     target/release/examples/ud_instr 20000
//! callgrind_annotate --inclusive=yes /tmp/ud.cg | grep -E 'tx_one|rx_one'
//! ```
//!
//! `tx_one` is the sender's share of a message (post, frame, CRC, hand to
//! the sink, reap the send completion), `rx_one` the receiver's (parse,
//! CRC check, match, place, complete, repost the receive); divide their
//! inclusive counts by the message count. Natively it prints the message
//! count and the time per message, a sanity check only.

use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use softrdma_proto::memory::{Access, VecMemory};
use softrdma_proto::ud::{DatagramSink, UdConfig, UdQp};
use softrdma_proto::wr::{DgramAddr, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcStatus};

const SIZE: u32 = 64;
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
    let recv = RecvWr {
        wr_id: 7,
        sgl: SgList::single(rbase, 256, dst),
    };
    for _ in 0..8 {
        b.post_recv(recv).expect("receive");
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
        tx_one(&mut a, &mem, &mut sink, wr, to);
        let data = std::mem::take(&mut sink.buf);
        rx_one(&mut b, &mut mem, &data, now, recv);
        sink.buf = data;
    }
    let per = t0.elapsed().as_nanos() as f64 / n as f64;
    assert_eq!(
        mem.bytes(dst)[..SIZE as usize],
        mem.bytes(src)[..SIZE as usize]
    );
    println!("{n} messages, {per:.0} ns each (both ends, one thread)");
}
