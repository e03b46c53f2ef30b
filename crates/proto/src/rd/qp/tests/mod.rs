//! Unit tests of the RD queue pair: two nodes over a vector "network"
//! with a controllable clock; helpers and the Send-path tests here,
//! RDMA operations and peer life in their own files.

use super::*;
use crate::memory::MemError;
use crate::memory::{Access, VecMemory};
use crate::rc::SIGNALED;
use crate::rd::RdEndpoint;
use crate::wr::SgList;
use crate::wr::{InlineData, SendFlags};
use softrdma_wire::rd::{Feedback, RdShimRepr};
use std::time::Duration;

mod peers;
mod rma;

const BASE: u64 = 0x10_0000;
const MEM: usize = 1 << 20;
/// IPv4 RD Send segment: 1500 − 28 − 26 − 22 − 4.
const ROOM_SEND: usize = 1420;
/// IPv4 RD tagged segment with X and Q: 1500 − 28 − 26 − 26 − 4.
const ROOM_TAGGED: usize = 1416;

#[derive(Default)]
struct VecSink {
    out: Vec<Vec<u8>>,
    budget: Option<usize>,
    fail_next: Option<io::ErrorKind>,
}

impl DatagramSink for VecSink {
    fn send(&mut self, _dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        if let Some(k) = self.fail_next.take() {
            return Err(k.into());
        }
        if let Some(b) = &mut self.budget {
            if *b == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            *b -= 1;
        }
        self.out
            .push(bufs.iter().flat_map(|b| b.iter().copied()).collect());
        Ok(())
    }
}

struct Node {
    qp: RdQp,
    mem: VecMemory,
    addr: DgramAddr,
    buf: u32,
}

fn node(i: u8, now: Instant, f: impl FnOnce(&mut RdQpConfig)) -> Node {
    let port = 4791;
    let qpn = (u32::from(port) << 8) | u32::from(i);
    let mut cfg = RdQpConfig {
        qpn,
        rd: RdConfig {
            epoch_seed: 1000 * u32::from(i),
            ..RdConfig::default()
        },
        ..RdQpConfig::default()
    };
    f(&mut cfg);
    let mut mem = VecMemory::new();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let buf = mem.register(0, BASE, MEM, all | Access::REMOTE_ATOMIC);
    Node {
        qp: RdQp::new(cfg, now).expect("valid config"),
        mem,
        addr: DgramAddr {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)),
            port,
            qpn,
        },
        buf,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

impl Node {
    fn fill(&mut self, off: usize, len: usize, seed: u8) -> Vec<u8> {
        let p = pattern(len, seed);
        self.mem.bytes_mut(self.buf)[off..off + len].copy_from_slice(&p);
        p
    }

    fn at(&self, off: usize, len: usize) -> &[u8] {
        &self.mem.bytes(self.buf)[off..off + len]
    }

    fn sgl(&self, off: usize, len: usize) -> Payload {
        Payload::Sgl(SgList::single(BASE + off as u64, len as u32, self.buf))
    }

    fn post(&mut self, id: u64, op: SendOp, off: usize, len: usize, to: DgramAddr) {
        let wr = SendWr {
            wr_id: id,
            op,
            payload: self.sgl(off, len),
            flags: SIGNALED,
        };
        self.qp.post_send(wr, to).expect("posted");
    }

    fn send(&mut self, id: u64, off: usize, len: usize, to: DgramAddr) {
        let op = SendOp::Send {
            imm: None,
            invalidate: None,
        };
        self.post(id, op, off, len, to);
    }

    fn recv(&mut self, id: u64, off: usize, len: usize) {
        let sgl = SgList::single(BASE + off as u64, len as u32, self.buf);
        self.qp
            .post_recv(RecvWr { wr_id: id, sgl })
            .expect("posted");
    }

    fn tx(&mut self) -> Vec<Vec<u8>> {
        let mut s = VecSink::default();
        self.qp.poll_transmit(&self.mem, &mut s).expect("sent");
        s.out
    }

    fn wcs(&mut self) -> Vec<(CqKind, WorkCompletion)> {
        std::iter::from_fn(|| self.qp.poll_completion()).collect()
    }

    fn events(&mut self) -> Vec<DgramEvent> {
        std::iter::from_fn(|| self.qp.poll_event()).collect()
    }
}

fn write(remote: u64, rkey: u32) -> SendOp {
    SendOp::Write {
        remote_addr: BASE + remote,
        rkey,
        imm: None,
    }
}

fn read(remote: u64, rkey: u32) -> SendOp {
    SendOp::Read {
        remote_addr: BASE + remote,
        rkey,
    }
}

fn fetch_add(remote: u64, rkey: u32, add: u64) -> SendOp {
    SendOp::FetchAdd {
        remote_addr: BASE + remote,
        rkey,
        add,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dir {
    AtoB,
    BtoA,
}

/// Two QPs on a perfect, zero-latency link with a virtual clock.
struct Pair {
    a: Node,
    b: Node,
    now: Instant,
}

impl Pair {
    fn new(fa: impl FnOnce(&mut RdQpConfig), fb: impl FnOnce(&mut RdQpConfig)) -> Pair {
        let now = Instant::now();
        Pair {
            a: node(1, now, fa),
            b: node(2, now, fb),
            now,
        }
    }

    fn deliver(&mut self, dir: Dir, d: &[u8]) {
        let now = self.now;
        let (from, to) = match dir {
            Dir::AtoB => (self.a.addr, &mut self.b),
            Dir::BtoA => (self.b.addr, &mut self.a),
        };
        to.qp
            .handle_datagram(from.ip, from.port, d, &mut to.mem, now);
    }

    /// Exchanges datagrams until both are quiet; `keep` may drop some.
    fn flow(&mut self, keep: &mut impl FnMut(Dir, &[u8]) -> bool) -> usize {
        let mut n = 0;
        loop {
            let (da, db) = (self.a.tx(), self.b.tx());
            if da.is_empty() && db.is_empty() {
                return n;
            }
            n += da.len() + db.len();
            for d in da {
                if keep(Dir::AtoB, &d) {
                    self.deliver(Dir::AtoB, &d);
                }
            }
            for d in db {
                if keep(Dir::BtoA, &d) {
                    self.deliver(Dir::BtoA, &d);
                }
            }
        }
    }

    /// Runs timers and traffic for `dur` of virtual time.
    fn run_with(&mut self, dur: Duration, mut keep: impl FnMut(Dir, &[u8]) -> bool) {
        let end = self.now + dur;
        loop {
            self.flow(&mut keep);
            let next = [self.a.qp.poll_timeout(), self.b.qp.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    let now = self.now;
                    self.a.qp.handle_timeout(now);
                    self.b.qp.handle_timeout(now);
                }
                _ => {
                    self.now = end;
                    return;
                }
            }
        }
    }

    fn run(&mut self, dur: Duration) {
        self.run_with(dur, |_, _| true);
    }
}

fn shim_of(d: &[u8]) -> RdShimRepr {
    wrd::split(d).expect("valid").0.expect("RD datagram")
}

fn seg_of(d: &[u8]) -> (SegmentRepr, Vec<u8>) {
    let (_, seg) = wrd::split(d).expect("valid");
    let (r, h) = SegmentRepr::parse(seg, datagram::MODE).expect("segment");
    (r, seg[h..].to_vec())
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn config_is_checked() {
    let t = Instant::now();
    let bad = |f: fn(&mut RdQpConfig)| {
        let mut c = RdQpConfig::default();
        f(&mut c);
        RdQp::new(c, t).unwrap_err()
    };
    assert_eq!(bad(|c| c.qpn = 1 << 24), RdQpConfigError::Qpn);
    assert_eq!(bad(|c| c.mtu = 100), RdQpConfigError::Mtu);
    assert_eq!(bad(|c| c.max_msg = 1 << 32), RdQpConfigError::MaxMsg);
    assert_eq!(bad(|c| c.ord = 0), RdQpConfigError::Depth);
    assert_eq!(bad(|c| c.max_inbound = 0), RdQpConfigError::Depth);
    assert!(matches!(
        bad(|c| c.rd.idle_timeout = Duration::from_millis(1)),
        RdQpConfigError::Rd(_)
    ));
    let q = RdQp::new(
        RdQpConfig {
            qpn: 77,
            ..Default::default()
        },
        t,
    )
    .unwrap();
    assert_eq!(q.config().rd.local_qpn, 77, "the RD layer gets the QPN");
}

#[test]
fn send_completes_on_ack_with_the_ud_segment_layout() {
    let mut p = Pair::new(|_| {}, |_| {});
    let data = p.a.fill(0, 100, 7);
    p.b.recv(9, 0x8000, 4096);
    p.a.send(1, 0, 100, p.b.addr);
    let d = p.a.tx();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0][0], wrd::MAGIC);
    let shim = shim_of(&d[0]);
    assert_eq!((shim.src_qpn, shim.dst_qpn), (p.a.addr.qpn, p.b.addr.qpn));
    let ds = shim.data.unwrap();
    assert!(ds.syn && ds.psn == 0);
    let (r, payload) = seg_of(&d[0]);
    assert_eq!(r.opcode, Opcode::Send);
    assert!(r.last);
    // §10: Q with the slot in the top octet, our QPN in RsvdULP, MSN 1.
    assert_eq!(r.dqpn, Some((1 << 24) | p.b.addr.qpn));
    assert_eq!(
        r.ddp,
        DdpHeader::Untagged {
            rsvd_ulp: p.a.addr.qpn,
            qn: 0,
            msn: 1,
            mo: 0
        }
    );
    assert_eq!(payload, data);
    assert_eq!(d[0].len(), SHIM_LEN + 22 + 100 + 4);
    // Not complete before the peer acknowledged it.
    assert!(p.a.wcs().is_empty());
    p.deliver(Dir::AtoB, &d[0]);
    let got = p.b.wcs();
    assert_eq!(got.len(), 1);
    let wc = got[0].1;
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 100)
    );
    assert_eq!(wc.src, Some(p.a.addr));
    assert_eq!(p.b.at(0x8000, 100), &data[..]);
    assert!(p.a.wcs().is_empty());
    p.run(ms(5));
    let got = p.a.wcs();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].0, got[0].1.status, got[0].1.opcode),
        (CqKind::Send, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(p.b.qp.stats().rx_delivered, 1);
}

#[test]
fn segmented_send_with_immediate_and_solicited() {
    let mut p = Pair::new(|_| {}, |_| {});
    let len = 3 * ROOM_SEND + 5;
    let data = p.a.fill(0, len, 3);
    p.b.recv(1, 0x10000, 8192);
    let wr = SendWr {
        wr_id: 5,
        op: SendOp::Send {
            imm: Some(0xdead_beef),
            invalidate: None,
        },
        payload: p.a.sgl(0, len),
        flags: SendFlags {
            signaled: true,
            solicited: true,
            fence: false,
        },
    };
    p.a.qp.post_send(wr, p.b.addr).unwrap();
    let d = p.a.tx();
    assert_eq!(d.len(), 5, "four Send segments and Immediate Data");
    let segs: Vec<_> = d.iter().map(|x| seg_of(x)).collect();
    assert!(segs[..4]
        .iter()
        .all(|(r, _)| r.opcode == Opcode::SendSe && !r.last));
    assert_eq!(segs[0].1.len(), ROOM_SEND);
    let (imm, _) = &segs[4];
    assert_eq!(imm.opcode, Opcode::ImmediateDataSe);
    assert!(imm.last);
    assert!(matches!(imm.ddp, DdpHeader::Untagged { mo, .. } if mo as usize == len));
    for x in &d {
        p.deliver(Dir::AtoB, x);
    }
    let wc = p.b.wcs()[0].1;
    assert_eq!(wc.byte_len as usize, len);
    assert_eq!(wc.imm, Some(0xdead_beef));
    assert!(wc.solicited);
    assert_eq!(p.b.at(0x10000, len), &data[..]);
    // A zero-length Send with immediate is the Immediate Data segment.
    p.b.recv(2, 0x10000, 0);
    let wr = SendWr {
        wr_id: 6,
        op: SendOp::Send {
            imm: Some(7),
            invalidate: None,
        },
        payload: Payload::Inline(InlineData::new(&[]).unwrap()),
        flags: SIGNALED,
    };
    p.a.qp.post_send(wr, p.b.addr).unwrap();
    p.run(ms(5));
    let wc = p.b.wcs()[0].1;
    assert_eq!((wc.wr_id, wc.byte_len, wc.imm), (2, 0, Some(7)));
    assert_eq!(p.a.wcs().len(), 2);
}

#[test]
fn receive_too_small_is_loc_len_err_here_and_rem_inv_req_there() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.fill(0, 4000, 1);
    p.b.recv(1, 0x8000, 2000);
    p.b.recv(2, 0x9000, 8000);
    p.a.send(10, 0, 4000, p.b.addr);
    p.a.send(11, 0, 3000, p.b.addr);
    p.run(ms(20));
    let rx = p.b.wcs();
    assert_eq!(rx.len(), 2);
    assert_eq!((rx[0].1.wr_id, rx[0].1.status), (1, WcStatus::LocLenErr));
    assert_eq!((rx[1].1.wr_id, rx[1].1.status), (2, WcStatus::Success));
    assert_eq!(rx[1].1.byte_len, 3000);
    let tx = p.a.wcs();
    assert_eq!(tx.len(), 2);
    assert_eq!(
        (tx[0].1.wr_id, tx[0].1.status),
        (10, WcStatus::RemInvReqErr)
    );
    assert_eq!((tx[1].1.wr_id, tx[1].1.status), (11, WcStatus::Success));
    assert!(p.b.qp.stats().rx_skipped >= 1, "the rest of the message");
}

#[test]
fn no_receive_drops_the_message_and_fails_the_sender_with_rnr() {
    let mut p = Pair::new(|_| {}, |_| {});
    let data = p.a.fill(0, 2000, 5);
    p.a.send(1, 0, 2000, p.b.addr);
    p.run(ms(20));
    assert!(p.b.wcs().is_empty());
    assert_eq!(p.b.qp.stats().rx_no_recv, 1);
    let tx = p.a.wcs();
    assert_eq!(tx.len(), 1);
    assert_eq!(tx[0].1.status, WcStatus::RnrRetryExcErr);
    // The QP goes on: the next Send is received.
    p.b.recv(7, 0x8000, 4096);
    p.a.send(2, 0, 2000, p.b.addr);
    p.run(ms(20));
    assert_eq!(p.b.wcs()[0].1.status, WcStatus::Success);
    assert_eq!(p.b.at(0x8000, 2000), &data[..]);
    assert_eq!(p.a.wcs()[0].1.status, WcStatus::Success);
    assert!(p.a.events().is_empty());
}

#[test]
fn batches_are_staged_whole_and_arrive_intact() {
    // A window's worth of datagrams (a 40 000-octet Write, then a
    // Send whose three-piece gather list puts datagram boundaries
    // inside and across pieces) leaves in batches of five or more:
    // each datagram framed into the staging buffer and offered as one
    // buffer. The target places every octet, and a lone datagram
    // (fewer than five) is still gathered.
    let mut p = Pair::new(|_| {}, |_| {});
    let wdata = p.a.fill(0, 40_000, 3);
    let sdata = p.a.fill(0x2_0000, 30_000, 5);
    p.b.recv(7, 0x8_0000, 64 << 10);
    p.a.post(1, write(0x4_0000, p.b.buf), 0, 40_000, p.b.addr);
    let three = [
        (0x2_0000u64, 1000u32),
        (0x2_0000 + 1000, 5),
        (0x2_0000 + 1005, 28_995),
    ];
    let sges: Vec<crate::wr::Sge> = three
        .iter()
        .map(|&(off, length)| crate::wr::Sge {
            addr: BASE + off,
            length,
            lkey: p.a.buf,
        })
        .collect();
    let wr = SendWr {
        wr_id: 2,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Sgl(SgList::from_slice(&sges).expect("three entries")),
        flags: SIGNALED,
    };
    p.a.qp.post_send(wr, p.b.addr).expect("posted");
    // Records, per batch offered, how many buffers each datagram came
    // in.
    #[derive(Default)]
    struct Pieces {
        inner: VecSink,
        batches: Vec<Vec<usize>>,
    }
    impl DatagramSink for Pieces {
        fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
            self.inner.send(dest, bufs)
        }
        fn send_batch(&mut self, batch: &[crate::ud::Datagram<'_>]) -> io::Result<usize> {
            self.batches
                .push(batch.iter().map(|d| d.bufs.len()).collect());
            for d in batch {
                self.inner.send(d.dest, d.bufs)?;
            }
            Ok(batch.len())
        }
    }
    let mut sent = 0;
    let mut staged = 0;
    for _ in 0..1000 {
        let mut s = Pieces::default();
        p.a.qp.poll_transmit(&p.a.mem, &mut s).expect("sent");
        for b in &s.batches {
            if b.len() >= STAGE_MIN_BATCH {
                staged += b.len();
                assert!(
                    b.iter().all(|&k| k == 1),
                    "a batch of {} staged whole",
                    b.len()
                );
            } else {
                assert!(b.iter().all(|&k| k >= 2), "a batch of {} gathered", b.len());
            }
        }
        sent += s.inner.out.len();
        for d in &s.inner.out {
            p.deliver(Dir::AtoB, d);
        }
        // B's ACKs open A's window.
        for d in p.b.tx() {
            p.deliver(Dir::BtoA, &d);
        }
        if !p.a.qp.wants_transmit() && p.a.wcs().len() == 2 {
            break;
        }
    }
    assert!(
        staged >= STAGE_MIN_BATCH,
        "some batches were staged ({staged} of {sent})"
    );
    assert_eq!(p.b.at(0x4_0000, 40_000), &wdata[..], "the Write placed");
    assert_eq!(p.b.at(0x8_0000, 30_000), &sdata[..], "the Send scattered");
    let wcs = p.b.wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!(
        (wcs[0].1.status, wcs[0].1.byte_len),
        (WcStatus::Success, 30_000)
    );
    assert_eq!(p.b.qp.stats().rx_bad_crc, 0);
}

#[test]
fn dqpn_of_reads_both_framings() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.send(1, 0, 10, p.b.addr);
    let d = p.a.tx();
    assert_eq!(dqpn_of(&d[0]), Some(p.b.addr.qpn));
    assert_eq!(dqpn_of(&d[0][..20]), None);
    let mut ud = [0u8; 64];
    let mut seg = SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None);
    seg.dqpn = Some((7 << 24) | 0x1234);
    let n = datagram::emit_into(&seg, b"x", &mut ud);
    assert_eq!(dqpn_of(&ud[..n]), Some(0x1234));
    assert_eq!(dqpn_of(&[0x53; 40]), None, "reserved framing");
    assert_eq!(dqpn_of(&[]), None);
}

#[test]
fn grh_in_front_of_the_payload() {
    let ours = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let mut p = Pair::new(|_| {}, |c| c.grh = Some(ours));
    let data = p.a.fill(0, 50, 3);
    p.b.recv(1, 0x1000, 40 + 50);
    p.a.send(1, 0, 50, p.b.addr);
    p.run(ms(5));
    let wc = p.b.wcs()[0].1;
    assert_eq!(wc.byte_len, 90);
    assert_eq!(p.b.at(0x1000, 40), grh_header(p.a.addr.ip, ours, 50));
    assert_eq!(p.b.at(0x1000 + 40, 50), &data[..]);
}

#[test]
fn post_send_refusals() {
    let mut p = Pair::new(|c| c.sq_depth = 1, |_| {});
    let b = p.b.addr;
    let op_refused = |op| SendWr {
        wr_id: 0,
        op,
        payload: Payload::Inline(InlineData::new(&[1]).unwrap()),
        flags: SIGNALED,
    };
    for op in [
        SendOp::Send {
            imm: None,
            invalidate: Some(1),
        },
        SendOp::Write {
            remote_addr: 0,
            rkey: 1,
            imm: Some(1),
        },
        SendOp::LocalInvalidate { stag: 1 },
    ] {
        assert_eq!(
            p.a.qp.post_send(op_refused(op), b),
            Err(PostError::Unsupported)
        );
    }
    assert_eq!(
        p.a.qp.post_send(op_refused(read(0, 1)), b),
        Err(PostError::Invalid)
    );
    let fa = SendWr {
        payload: p.a.sgl(0, 4),
        ..op_refused(fetch_add(0, 1, 1))
    };
    assert_eq!(p.a.qp.post_send(fa, b), Err(PostError::Invalid));
    let far = DgramAddr { qpn: 1 << 24, ..b };
    let send = op_refused(SendOp::Send {
        imm: None,
        invalidate: None,
    });
    assert_eq!(p.a.qp.post_send(send, far), Err(PostError::Invalid));
    p.a.qp.post_send(send, b).unwrap();
    assert_eq!(p.a.qp.post_send(send, b), Err(PostError::QueueFull));
}

#[test]
fn would_block_keeps_datagrams_pending() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.fill(0, 5 * ROOM_TAGGED, 1);
    p.a.post(1, write(0, p.b.buf), 0, 5 * ROOM_TAGGED, p.b.addr);
    let mut s = VecSink {
        budget: Some(2),
        ..Default::default()
    };
    assert_eq!(p.a.qp.poll_transmit(&p.a.mem, &mut s).unwrap(), 2);
    assert!(p.a.qp.wants_transmit());
    s.budget = None;
    assert_eq!(p.a.qp.poll_transmit(&p.a.mem, &mut s).unwrap(), 3);
    let psns: Vec<u32> = s.out.iter().map(|d| shim_of(d).data.unwrap().psn).collect();
    assert_eq!(psns, [0, 1, 2, 3, 4]);
    // A hard socket error loses one datagram; retransmission covers it.
    p.a.post(2, write(0, p.b.buf), 0, 10, p.b.addr);
    let mut bad = VecSink {
        fail_next: Some(io::ErrorKind::ConnectionRefused),
        ..Default::default()
    };
    assert!(p.a.qp.poll_transmit(&p.a.mem, &mut bad).is_err());
    for d in &s.out {
        p.deliver(Dir::AtoB, d);
    }
    p.run(ms(100));
    assert_eq!(p.a.wcs().len(), 2);
    assert_eq!(p.a.qp.stats().tx_socket_errors, 1);
}

#[test]
fn bad_input_is_counted_and_acknowledges_nothing() {
    let mut p = Pair::new(|_| {}, |_| {});
    let now = p.now;
    let src = p.a.addr;
    let feed = |p: &mut Pair, d: &[u8]| {
        p.b.qp
            .handle_datagram(src.ip, src.port, d, &mut p.b.mem, now)
    };
    feed(&mut p, &[0x52]);
    let mut d = [0u8; 64];
    let n = wrd::emit_into(&RdShimRepr::control(1, p.b.addr.qpn, 8), None, &mut d);
    d[3] ^= 1;
    feed(&mut p, &d[..n]);
    // A UD datagram at an RD QP.
    let ud = SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None);
    let n = datagram::emit_into(&ud, b"x", &mut d);
    feed(&mut p, &d[..n]);
    // A data shim whose segment does not parse: not delivered.
    let mut shim = RdShimRepr::control(src.qpn, p.b.addr.qpn, 8);
    shim.data = Some(wrd::DataSeq {
        epoch: 5,
        psn: 0,
        syn: true,
    });
    let mut out = [0u8; 128];
    let n = wrd::emit_into(&shim, Some((&ud, b"abc")), &mut out);
    out[SHIM_LEN] = 0x4d; // DV = 1 but reserved DDP bits set
    let fixed = {
        let body = &out[..n - 4];
        let crc = softrdma_wire::crc::crc32c(body).to_le_bytes();
        let mut v = body.to_vec();
        v.extend_from_slice(&crc);
        v
    };
    feed(&mut p, &fixed);
    let st = p.b.qp.stats();
    assert_eq!(
        (st.rx_malformed, st.rx_bad_crc, st.rx_not_rd),
        (2, 1, 1),
        "{st:?}"
    );
    assert_eq!(p.b.qp.rd_stats().delivered, 0);
}

#[test]
fn reports_jump_the_window_and_carry_the_ack_they_hold_back() {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    struct K(u32);
    impl crate::rd::PeerKey for K {
        fn qpn(&self) -> u32 {
            self.0
        }
    }
    let t = Instant::now();
    let cfg = |q| RdConfig {
        local_qpn: q,
        epoch_seed: q,
        tx_window: 2,
        ..RdConfig::default()
    };
    let mut a: RdEndpoint<K, u32> = RdEndpoint::new(cfg(1)).unwrap();
    let mut b: RdEndpoint<K, u32> = RdEndpoint::new(cfg(2)).unwrap();
    for i in 0..3 {
        a.send(K(2), i, t).unwrap();
    }
    let tx: Vec<_> = std::iter::from_fn(|| a.poll_transmit(t)).collect();
    assert_eq!(tx.len(), 2, "window 2");
    // B fills its window towards A, then delivers A's PSN 0 and 1 and
    // reports on PSN 1.
    for i in 10..14 {
        b.send(K(1), i, t).unwrap();
    }
    let old: Vec<_> = std::iter::from_fn(|| b.poll_transmit(t)).collect();
    assert_eq!(old.len(), 2);
    b.handle_datagram(K(1), &tx[0].shim, t);
    b.handle_datagram(K(1), &tx[1].shim, t);
    b.send_report(K(1), 99, t).unwrap();
    let out: Vec<_> = std::iter::from_fn(|| b.poll_transmit(t)).collect();
    assert_eq!(out.len(), 1, "past the full window");
    assert_eq!(out[0].token, Some(99));
    assert_eq!(out[0].shim.data.unwrap().psn, 2, "before the unsent tokens");
    assert!(
        matches!(out[0].shim.feedback, Feedback::Ack { psn: 2, .. }),
        "the report carries the full ACK"
    );
    // An ACK owed (here for a duplicate) rides on the report, sent
    // again, rather than on a control datagram.
    b.handle_datagram(K(1), &tx[1].shim, t);
    let dup_ack = b.poll_transmit(t).unwrap();
    assert_eq!(dup_ack.token, Some(99));
    assert!(dup_ack.retransmission);
    assert_eq!(dup_ack.shim.data.unwrap().psn, 2);
    assert!(matches!(
        dup_ack.shim.feedback,
        Feedback::Ack { psn: 2, .. }
    ));
    // Earlier datagrams re-sent still name PSN 1 as the next expected.
    b.handle_timeout(t + Duration::from_millis(20));
    let resent: Vec<_> =
        std::iter::from_fn(|| b.poll_transmit(t + Duration::from_millis(20))).collect();
    assert_eq!(resent[0].shim.data.unwrap().psn, 0);
    assert!(matches!(
        resent[0].shim.feedback,
        Feedback::Ack { psn: 1, .. }
    ));
    assert!(matches!(
        resent[2].shim.feedback,
        Feedback::Ack { psn: 2, .. }
    ));
    // Once A acknowledges the report, the hold is gone.
    for x in &resent {
        a.handle_datagram(K(2), &x.shim, t);
    }
    let t2 = t + Duration::from_millis(21);
    a.handle_timeout(t2);
    let acks: Vec<_> = std::iter::from_fn(|| a.poll_transmit(t2)).collect();
    assert!(acks
        .iter()
        .all(|x| matches!(x.shim.feedback, Feedback::Ack { psn: 3, .. })));
    b.handle_datagram(K(1), &acks[0].shim, t2);
    b.handle_datagram(K(1), &tx[1].shim, t2);
    let next: Vec<_> = std::iter::from_fn(|| b.poll_transmit(t2)).collect();
    assert!(!next.is_empty());
    assert!(
        next.iter().all(|x| x.token != Some(99)),
        "no carrier needed"
    );
    assert!(next.iter().all(|x| matches!(
        x.shim.feedback,
        Feedback::Ack { psn, .. } if psn >= 2
    )));
}
