use super::*;
use crate::memory::MemError;
use crate::memory::{Access, VecMemory};
use crate::rc::SIGNALED;
use crate::rd::RdEndpoint;
use crate::wr::SgList;
use crate::wr::{InlineData, SendFlags};
use softrdma_wire::rd::{Feedback, RdShimRepr};
use std::time::Duration;

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
fn write_placed_in_segments_completes_on_ack() {
    let mut p = Pair::new(|_| {}, |_| {});
    let len = 2 * ROOM_TAGGED + 1;
    let data = p.a.fill(0, len, 9);
    p.a.post(1, write(0x4_0000, p.b.buf), 0, len, p.b.addr);
    let d = p.a.tx();
    assert_eq!(d.len(), 3);
    let (r, pl) = seg_of(&d[1]);
    assert_eq!(pl.len(), ROOM_TAGGED);
    assert_eq!(
        r.ddp,
        DdpHeader::Tagged {
            stag: p.b.buf,
            to: BASE + 0x4_0000 + ROOM_TAGGED as u64,
            ext: Some(TaggedExt {
                msn: 1,
                mo: ROOM_TAGGED as u32
            })
        }
    );
    for x in &d {
        p.deliver(Dir::AtoB, x);
    }
    assert_eq!(p.b.at(0x4_0000, len), &data[..]);
    assert!(p.b.wcs().is_empty(), "no completion at the target");
    p.run(ms(5));
    let wc = p.a.wcs()[0].1;
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len as usize),
        (WcStatus::Success, WcOpcode::RdmaWrite, len)
    );
}

#[test]
fn write_access_violation_fails_that_request_only_and_its_ack_waits() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.fill(0, 100, 1);
    // W1 to a bad STag, W2 fine, both in one burst.
    p.a.post(1, write(0, p.b.buf ^ 0x40), 0, 100, p.b.addr);
    p.a.post(2, write(0x100, p.b.buf), 0, 100, p.b.addr);
    let d = p.a.tx();
    assert_eq!(d.len(), 2);
    p.deliver(Dir::AtoB, &d[0]);
    p.deliver(Dir::AtoB, &d[1]);
    let ev = p.b.events();
    assert_eq!(ev.len(), 1);
    assert!(matches!(
        ev[0],
        DgramEvent::RemoteAccess {
            opcode: Opcode::RdmaWrite,
            msn: 1,
            error: MemError::InvalidStag,
            ..
        }
    ));
    assert_eq!(p.b.at(0x100, 100), p.a.at(0, 100), "W2 placed");
    // Lose B's report once. Whatever B sends, an ACK covering W1
    // (PSN 0) only ever rides on a data datagram at or after the report.
    let mut report_psn = None;
    let mut dropped = false;
    let mut full_acks = 0;
    p.run_with(ms(50), |dir, d| {
        if dir != Dir::BtoA {
            return true;
        }
        let s = shim_of(d);
        if let Some(ds) = s.data {
            report_psn.get_or_insert(ds.psn);
        }
        if let Feedback::Ack { psn, .. } = s.feedback {
            if psn > 0 {
                full_acks += 1;
                let at = s.data.map(|ds| ds.psn);
                assert!(at.is_some() && at >= report_psn, "{s:?}");
            }
        }
        if s.data.is_some() && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    assert!(dropped && full_acks >= 2);
    let tx = p.a.wcs();
    let st: Vec<_> = tx.iter().map(|c| (c.1.wr_id, c.1.status)).collect();
    assert_eq!(st, [(1, WcStatus::RemAccessErr), (2, WcStatus::Success)]);
    assert!(p.a.events().is_empty(), "no peer failure");
    assert_eq!(p.a.qp.sq_in_use(), 0);
    assert_eq!(p.b.qp.inbound_in_use(), 0);
}

#[test]
fn mutual_access_violations_release_each_other() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.post(1, write(0, 0xbad01), 0, 10, p.b.addr);
    p.b.post(2, write(0, 0xbad01), 0, 10, p.a.addr);
    p.run(ms(20));
    assert_eq!(p.a.wcs()[0].1.status, WcStatus::RemAccessErr);
    assert_eq!(p.b.wcs()[0].1.status, WcStatus::RemAccessErr);
    // Both directions still work at once.
    p.a.fill(0, 10, 4);
    p.a.post(3, write(0x100, p.b.buf), 0, 10, p.b.addr);
    p.b.post(4, write(0x100, p.a.buf), 0, 10, p.a.addr);
    p.run(ms(20));
    assert_eq!(p.a.wcs()[0].1.status, WcStatus::Success);
    assert_eq!(p.b.wcs()[0].1.status, WcStatus::Success);
    assert_eq!(
        p.a.qp.rd_stats().peers_failed + p.b.qp.rd_stats().peers_failed,
        0
    );
    assert_eq!(p.a.qp.rd_stats().timeouts + p.b.qp.rd_stats().timeouts, 0);
}

#[test]
fn an_ack_overtaking_a_terminate_waits_for_it() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.fill(0, 100, 1);
    p.a.recv(5, 0x8000, 64);
    p.a.post(1, write(0, p.b.buf ^ 0x40), 0, 100, p.b.addr);
    p.a.post(2, write(0x100, p.b.buf), 0, 100, p.b.addr);
    for d in p.a.tx() {
        p.deliver(Dir::AtoB, &d);
    }
    // B has a Send for A as well: the Terminate goes first, the Send
    // after it carries the ACK of both Writes.
    p.b.send(7, 0, 10, p.a.addr);
    let out = p.b.tx();
    assert_eq!(out.len(), 2);
    assert_eq!(seg_of(&out[0]).0.opcode, Opcode::Terminate);
    assert!(matches!(
        shim_of(&out[1]).feedback,
        Feedback::Ack { psn: 2, .. }
    ));
    // The Terminate is lost; the Send arrives out of order with the ACK.
    p.deliver(Dir::BtoA, &out[1]);
    assert_eq!(p.a.qp.rd().unacked(&p.b.addr), 0, "RD took the ACK");
    assert!(p.a.wcs().is_empty(), "but nothing succeeds yet");
    assert_eq!(p.a.qp.stats().tx_gated, 2);
    p.run(ms(100));
    let wcs = p.a.wcs();
    let of = |q| -> Vec<_> {
        wcs.iter()
            .filter(|c| c.0 == q)
            .map(|c| (c.1.wr_id, c.1.status))
            .collect()
    };
    assert_eq!(
        of(CqKind::Send),
        [(1, WcStatus::RemAccessErr), (2, WcStatus::Success)]
    );
    assert_eq!(of(CqKind::Recv), [(5, WcStatus::Success)]);
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
fn a_fenced_request_waits_for_earlier_reads() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.b.recv(1, 0x9000, 64);
    p.a.post(1, read(0, p.b.buf), 0, 32, p.b.addr);
    let wr = SendWr {
        wr_id: 2,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: p.a.sgl(0x100, 8),
        flags: SendFlags {
            signaled: true,
            solicited: false,
            fence: true,
        },
    };
    p.a.qp.post_send(wr, p.b.addr).unwrap();
    let d = p.a.tx();
    assert_eq!(d.len(), 1, "only the Read Request");
    assert_eq!(seg_of(&d[0]).0.opcode, Opcode::ReadRequest);
    p.deliver(Dir::AtoB, &d[0]);
    for x in p.b.tx() {
        p.deliver(Dir::BtoA, &x);
    }
    let d = p.a.tx();
    assert_eq!(
        seg_of(&d[0]).0.opcode,
        Opcode::Send,
        "after the Read completed"
    );
    p.run(ms(10));
    let st: Vec<_> = p.a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
    assert_eq!(st, [(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn a_new_session_of_the_sender_returns_the_claimed_receive() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.fill(0, 3 * ROOM_SEND, 1);
    p.b.recv(1, 0, 8192);
    p.a.send(1, 0, 3 * ROOM_SEND, p.b.addr);
    let d = p.a.tx();
    p.deliver(Dir::AtoB, &d[0]);
    assert_eq!(p.b.qp.recv_posted(), 0, "claimed by the message");
    // A restarts (newer epochs) and sends another message.
    let now = p.now;
    p.a = node(1, now, |c| c.rd.epoch_seed = 1_000_000);
    let data = p.a.fill(0, 10, 9);
    p.a.send(2, 0, 10, p.b.addr);
    p.run(ms(10));
    let rx = p.b.wcs();
    assert_eq!(rx.len(), 1);
    assert_eq!((rx[0].1.wr_id, rx[0].1.byte_len), (1, 10));
    assert_eq!(p.b.at(0, 10), &data[..]);
    assert_eq!(p.a.wcs()[0].1.status, WcStatus::Success);
}

/// `d` with its shim PSN replaced (and the CRC made right again).
fn with_psn(d: &[u8], psn: u32) -> Vec<u8> {
    let mut d = d.to_vec();
    d[12..16].copy_from_slice(&psn.to_be_bytes());
    let n = d.len();
    let t = datagram::trailer(&d[..n - CRC_LEN], &[]);
    d[n - CRC_LEN..].copy_from_slice(&t);
    d
}

/// The Terminates among B's data datagrams.
fn terminates(out: &[Vec<u8>]) -> Vec<(TerminateCause, u32)> {
    out.iter()
        .filter(|d| shim_of(d).data.is_some())
        .filter_map(|d| match seg_of(d).0 {
            SegmentRepr {
                ddp: DdpHeader::Untagged { rsvd_ulp, .. },
                body: RdmapBody::Terminate(t),
                ..
            } => Some((t.cause, rsvd_ulp)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_send_segment_from_the_middle_of_a_message_is_never_taken_for_one() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.fill(0, 3 * ROOM_SEND, 1);
    p.b.recv(1, 0, 8192);
    p.a.send(1, 0, 3 * ROOM_SEND, p.b.addr);
    let d = p.a.tx();
    assert_eq!(d.len(), 3);
    // B never saw the first segment (say B restarted after it): the
    // second and third come as the first datagrams of a session.
    p.deliver(Dir::AtoB, &with_psn(&d[1], 0));
    p.deliver(Dir::AtoB, &with_psn(&d[2], 1));
    let s = p.b.qp.stats();
    assert_eq!((s.rx_orphan_segments, s.rx_skipped), (1, 1));
    assert_eq!(p.b.qp.recv_posted(), 1, "no receive taken");
    assert!(p.b.wcs().is_empty());
    assert!(p.b.at(0, 8192).iter().all(|&x| x == 0), "nothing placed");
    // One Terminate, about MSN 1: invalid MO.
    let out = p.b.tx();
    assert_eq!(
        terminates(&out),
        [(TerminateCause::DdpUntaggedInvalidMo, 1)]
    );
    // A whole message after it is received normally.
    let data = p.a.fill(5000, 100, 2);
    p.a.send(2, 5000, 100, p.b.addr);
    let d = p.a.tx();
    let last = d.last().expect("datagram");
    p.deliver(Dir::AtoB, &with_psn(last, 2));
    let rx = p.b.wcs();
    assert_eq!(rx.len(), 1);
    assert_eq!(
        (rx[0].1.wr_id, rx[0].1.status, rx[0].1.byte_len),
        (1, WcStatus::Success, 100)
    );
    assert_eq!(p.b.at(0, 100), &data[..]);
}

#[test]
fn a_write_segment_from_the_middle_of_a_message_is_never_placed() {
    for record in [false, true] {
        let mut p = Pair::new(|_| {}, |_| {});
        p.a.fill(0, 3 * ROOM_TAGGED, 1);
        let op = if record {
            SendOp::WriteRecord {
                remote_addr: BASE + 100_000,
                rkey: p.b.buf,
            }
        } else {
            write(100_000, p.b.buf)
        };
        p.a.post(1, op, 0, 3 * ROOM_TAGGED, p.b.addr);
        let d = p.a.tx();
        assert_eq!(d.len(), 3);
        p.deliver(Dir::AtoB, &with_psn(&d[1], 0));
        p.deliver(Dir::AtoB, &with_psn(&d[2], 1));
        let s = p.b.qp.stats();
        assert_eq!((s.rx_orphan_segments, s.rx_skipped), (1, 1));
        assert_eq!(s.rx_write_segments + s.rx_record_segments, 0);
        assert!(p.b.at(100_000, 3 * ROOM_TAGGED).iter().all(|&x| x == 0));
        assert_eq!(p.b.qp.record_stats(), RecordStats::default());
        let out = p.b.tx();
        assert_eq!(
            terminates(&out),
            [(TerminateCause::RdmapCatastrophicStream, 1)]
        );
        // A whole Write after it is placed.
        let data = p.a.fill(5000, 100, 2);
        p.a.post(2, write(200_000, p.b.buf), 5000, 100, p.b.addr);
        let d = p.a.tx();
        p.deliver(Dir::AtoB, &with_psn(d.last().expect("datagram"), 2));
        assert_eq!(p.b.at(200_000, 100), &data[..]);
        // A segment out of place inside a message in progress is an
        // orphan too.
        p.a.post(3, write(300_000, p.b.buf), 0, 3 * ROOM_TAGGED, p.b.addr);
        let d = p.a.tx();
        p.deliver(Dir::AtoB, &with_psn(&d[0], 3));
        p.deliver(Dir::AtoB, &with_psn(&d[2], 4));
        assert_eq!(p.b.qp.stats().rx_orphan_segments, 2);
        assert!(p
            .b
            .at(300_000 + ROOM_TAGGED, 2 * ROOM_TAGGED)
            .iter()
            .all(|&x| x == 0));
    }
}

#[test]
fn write_record_is_logged_at_the_target() {
    let mut p = Pair::new(|_| {}, |_| {});
    let len = ROOM_TAGGED + 10;
    let data = p.a.fill(0, len, 2);
    let op = SendOp::WriteRecord {
        remote_addr: BASE + 0x2000,
        rkey: p.b.buf,
    };
    p.a.post(1, op, 0, len, p.b.addr);
    p.run(ms(5));
    assert_eq!(p.b.at(0x2000, len), &data[..]);
    let rec = p.b.wcs();
    assert_eq!(rec.len(), 1);
    let wc = rec[0].1;
    assert_eq!(
        (wc.opcode, wc.status),
        (WcOpcode::RecvWriteRecord, WcStatus::Success)
    );
    let info = wc.record.unwrap();
    assert_eq!(
        (info.stag, info.to, info.len as usize, info.msn),
        (p.b.buf, BASE + 0x2000, len, 1)
    );
    assert_eq!(wc.src, Some(p.a.addr));
    assert!(p
        .b
        .qp
        .record_tracker()
        .is_valid(p.b.buf, BASE + 0x2000, len as u64));
    assert_eq!(p.a.wcs()[0].1.opcode, WcOpcode::WriteRecord);
}

#[test]
fn read_response_echoes_the_request_msn() {
    let mut p = Pair::new(|_| {}, |_| {});
    let len = 3 * ROOM_TAGGED;
    let data = p.b.fill(0x1000, len, 8);
    p.a.post(1, read(0x1000, p.b.buf), 0x5000, len, p.b.addr);
    p.a.post(2, read(0x1000, p.b.buf), 0x20000, 10, p.b.addr);
    let req = p.a.tx();
    assert_eq!(req.len(), 2);
    let (r, _) = seg_of(&req[1]);
    let RdmapBody::ReadRequest(rr) = r.body else {
        panic!("read request")
    };
    assert_eq!(
        (rr.sink_stag, rr.sink_to, rr.size),
        (p.a.buf, BASE + 0x20000, 10)
    );
    assert!(matches!(r.ddp, DdpHeader::Untagged { qn: 1, msn: 2, .. }));
    for x in &req {
        p.deliver(Dir::AtoB, x);
    }
    let resp = p.b.tx();
    assert_eq!(resp.len(), 4);
    let tmsns: Vec<u32> = resp
        .iter()
        .map(|x| match seg_of(x).0.ddp {
            DdpHeader::Tagged { ext: Some(e), .. } => e.msn,
            _ => panic!("tagged"),
        })
        .collect();
    assert_eq!(tmsns, [1, 1, 1, 2]);
    // Deliver the responses; the Reads complete on placement.
    for x in &resp {
        p.deliver(Dir::BtoA, x);
    }
    let wcs = p.a.wcs();
    assert_eq!(wcs.len(), 2);
    assert_eq!(
        (wcs[0].1.wr_id, wcs[0].1.status, wcs[0].1.byte_len as usize),
        (1, WcStatus::Success, len)
    );
    assert_eq!(wcs[1].1.opcode, WcOpcode::RdmaRead);
    assert_eq!(p.a.at(0x5000, len), &data[..]);
    assert_eq!(p.a.at(0x20000, 10), &data[..10]);
    p.run(ms(20));
    assert_eq!(p.b.qp.inbound_in_use(), 0, "responses acknowledged");
    assert_eq!(p.a.qp.sq_in_use(), 0);
}

#[test]
fn read_without_the_right_fails_with_rem_access_err() {
    let mut p = Pair::new(|_| {}, |_| {});
    let wo = p.b.mem.register(0, 0x900_0000, 4096, Access::REMOTE_WRITE);
    p.a.post(1, read(0, wo), 0, 100, p.b.addr);
    // Out of bounds too.
    p.a.post(2, read(MEM as u64 - 10, p.b.buf), 0, 100, p.b.addr);
    p.b.fill(0, 100, 1);
    p.a.post(3, read(0, p.b.buf), 0x100, 100, p.b.addr);
    p.run(ms(20));
    let st: Vec<_> = p.a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
    assert_eq!(
        st,
        [
            (1, WcStatus::RemAccessErr),
            (2, WcStatus::RemAccessErr),
            (3, WcStatus::Success)
        ]
    );
    let ev = p.b.events();
    assert_eq!(ev.len(), 2);
    assert!(matches!(
        ev[0],
        DgramEvent::RemoteAccess {
            opcode: Opcode::ReadRequest,
            error: MemError::AccessRights,
            msn: 1,
            ..
        }
    ));
    assert!(matches!(
        ev[1],
        DgramEvent::RemoteAccess {
            error: MemError::BaseBounds,
            msn: 2,
            ..
        }
    ));
}

#[test]
fn ord_bounds_outstanding_reads_per_peer() {
    let mut p = Pair::new(|c| c.ord = 2, |_| {});
    for i in 0..5 {
        p.a.post(i, read(0, p.b.buf), 0x100 * i as usize, 16, p.b.addr);
    }
    let d = p.a.tx();
    assert_eq!(d.len(), 2, "only ORD requests go out");
    for x in &d {
        p.deliver(Dir::AtoB, x);
    }
    for x in p.b.tx() {
        p.deliver(Dir::BtoA, &x);
    }
    assert_eq!(p.a.wcs().len(), 2);
    assert_eq!(p.a.tx().len(), 2, "two more once two completed");
    p.run(ms(20));
    assert_eq!(p.a.wcs().len(), 3);
}

#[test]
fn ird_exceeded_is_rem_op_err() {
    let mut p = Pair::new(|_| {}, |c| c.ird = 1);
    p.a.post(1, read(0, p.b.buf), 0, 16, p.b.addr);
    p.a.post(2, read(0, p.b.buf), 0x100, 16, p.b.addr);
    p.run(ms(20));
    let st: Vec<_> = p.a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
    assert_eq!(st, [(1, WcStatus::Success), (2, WcStatus::RemOpErr)]);
    assert_eq!(p.b.qp.stats().rx_ird_exceeded, 1);
}

#[test]
fn atomics_run_once_and_responses_are_rebuilt() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.b.mem.bytes_mut(p.b.buf)[0x40..0x48].copy_from_slice(&5u64.to_ne_bytes());
    p.a.post(1, fetch_add(0x40, p.b.buf, 10), 0x100, 8, p.b.addr);
    let req = p.a.tx();
    assert_eq!(req.len(), 1);
    // The request arrives twice: executed once.
    p.deliver(Dir::AtoB, &req[0]);
    p.deliver(Dir::AtoB, &req[0]);
    assert_eq!(p.b.qp.stats().rx_atomics, 1);
    assert_eq!(p.b.qp.stats().rx_duplicates, 1);
    // The response is lost; its retransmission carries the kept
    // original value.
    let resp = p.b.tx();
    let (r1, _) = seg_of(&resp[0]);
    assert!(matches!(
        r1.body,
        RdmapBody::AtomicResponse(AtomicResponse {
            req_id: 1,
            orig_value: 5
        })
    ));
    p.now += ms(600);
    let now = p.now;
    p.b.qp.handle_timeout(now);
    let again = p.b.tx();
    let (r2, _) = seg_of(&again[0]);
    assert_eq!(r1, r2, "same segment from the kept value");
    p.deliver(Dir::BtoA, &again[0]);
    let wc = p.a.wcs()[0].1;
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::FetchAdd, 8)
    );
    assert_eq!(p.a.at(0x100, 8), 5u64.to_ne_bytes());
    assert_eq!(p.b.at(0x40, 8), 15u64.to_ne_bytes());
    // Compare-and-swap, then a mismatch.
    let cas = |compare, swap| SendOp::CompareSwap {
        remote_addr: BASE + 0x40,
        rkey: p.b.buf,
        compare,
        swap,
    };
    let (c1, c2) = (cas(15, 99), cas(15, 7));
    p.a.post(2, c1, 0x108, 8, p.b.addr);
    p.a.post(3, c2, 0x110, 8, p.b.addr);
    p.run(ms(20));
    assert_eq!(p.a.wcs().len(), 2);
    assert_eq!(p.a.at(0x108, 8), 15u64.to_ne_bytes());
    assert_eq!(p.a.at(0x110, 8), 99u64.to_ne_bytes());
    assert_eq!(p.b.at(0x40, 8), 99u64.to_ne_bytes());
    // Misaligned: an error for that request.
    p.a.post(4, fetch_add(0x41, p.b.buf, 1), 0x118, 8, p.b.addr);
    p.run(ms(20));
    assert_eq!(p.a.wcs()[0].1.status, WcStatus::RemOpErr);
    assert!(matches!(
        p.b.events()[..],
        [DgramEvent::RemoteAccess {
            error: MemError::Misaligned,
            ..
        }]
    ));
}

#[test]
fn retransmission_rebuilds_the_same_segment_from_memory() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.fill(0, 3000, 6);
    p.a.post(1, write(0, p.b.buf), 0, 3000, p.b.addr);
    let first = p.a.tx();
    p.now += ms(20);
    let now = p.now;
    p.a.qp.handle_timeout(now);
    let again = p.a.tx();
    assert_eq!(first.len(), again.len());
    for (x, y) in first.iter().zip(&again) {
        // Same PSN, same segment octets; the shim's ACK/flags may differ.
        assert_eq!(shim_of(x).data, shim_of(y).data);
        assert_eq!(x[SHIM_LEN..x.len() - 4], y[SHIM_LEN..y.len() - 4]);
    }
    assert_eq!(p.a.qp.rd_stats().retransmitted, first.len() as u64);
    assert_eq!(first.len(), 3);
}

#[test]
fn a_silent_peer_fails_only_its_own_requests() {
    let t = Instant::now();
    let mut a = node(1, t, |_| {});
    let mut b = node(2, t, |_| {});
    let c = node(3, t, |_| {});
    a.fill(0, 100, 1);
    b.recv(1, 0, 4096);
    a.send(10, 0, 100, b.addr);
    a.send(11, 0, 100, c.addr);
    a.post(12, read(0, c.buf), 0x100, 8, c.addr);
    let mut now = t;
    let mut failed_at = None;
    for _ in 0..20_000 {
        for d in a.tx() {
            let s = shim_of(&d);
            if s.dst_qpn == b.addr.qpn {
                b.qp.handle_datagram(a.addr.ip, a.addr.port, &d, &mut b.mem, now);
            }
        }
        for d in b.tx() {
            a.qp.handle_datagram(b.addr.ip, b.addr.port, &d, &mut a.mem, now);
        }
        let next = [a.qp.poll_timeout(), b.qp.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(n) = next else { break };
        now = n;
        a.qp.handle_timeout(now);
        b.qp.handle_timeout(now);
        if failed_at.is_none()
            && a.events()
                .contains(&DgramEvent::PeerFailed { peer: c.addr })
        {
            failed_at = Some(now - t);
        }
        if a.qp.peer_count() == 0 {
            break;
        }
    }
    let span = a.qp.config().rd.give_up_span();
    assert!(failed_at.unwrap() <= span + ms(10));
    let mut st: Vec<_> = a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
    st.sort_by_key(|x| x.0);
    assert_eq!(
        st,
        [
            (10, WcStatus::Success),
            (11, WcStatus::RetryExcErr),
            (12, WcStatus::RetryExcErr)
        ]
    );
    assert_eq!(b.qp.stats().rx_delivered, 1);
    // Everything expired in the end: no per-peer state left.
    assert_eq!((a.qp.peer_count(), a.qp.rd().peer_count()), (0, 0));
    assert_eq!((b.qp.peer_count(), b.qp.rd().peer_count()), (0, 0));
    assert_eq!(a.qp.sq_in_use(), 0);
}

#[test]
fn per_peer_state_is_dropped_when_the_peer_expires() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.b.recv(1, 0, 64);
    p.a.send(1, 0, 10, p.b.addr);
    p.a.post(2, read(0, p.b.buf), 0x100, 64, p.b.addr);
    p.run(ms(50));
    assert_eq!(p.a.wcs().len(), 2);
    assert_eq!((p.a.qp.peer_count(), p.b.qp.peer_count()), (1, 1));
    let idle = p.a.qp.config().rd.idle_timeout;
    p.run(idle + ms(10));
    assert_eq!((p.a.qp.peer_count(), p.b.qp.peer_count()), (0, 0));
    assert_eq!((p.a.qp.rd().peer_count(), p.b.qp.rd().peer_count()), (0, 0));
    assert_eq!(p.a.qp.poll_timeout(), None);
    // And a new conversation starts from scratch (MSN 1 again).
    p.b.recv(2, 0, 64);
    p.a.send(3, 0, 10, p.b.addr);
    let d = p.a.tx();
    assert!(matches!(
        seg_of(&d[0]).0.ddp,
        DdpHeader::Untagged { msn: 1, .. }
    ));
}

#[test]
fn a_source_lost_in_flight_aborts_the_send_and_frees_the_receive() {
    let mut p = Pair::new(|_| {}, |_| {});
    let src =
        p.a.mem
            .register(0, 0x800_0000, 4 * ROOM_SEND, Access::LOCAL_WRITE);
    p.b.recv(1, 0, 8192);
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Sgl(SgList::single(0x800_0000, 4 * ROOM_SEND as u32, src)),
        flags: SIGNALED,
    };
    p.a.qp.post_send(wr, p.b.addr).unwrap();
    let mut s = VecSink {
        budget: Some(2),
        ..Default::default()
    };
    p.a.qp.poll_transmit(&p.a.mem, &mut s).unwrap();
    for d in &s.out {
        p.deliver(Dir::AtoB, d);
    }
    assert_eq!(p.b.qp.recv_posted(), 0, "claimed by the message");
    p.a.mem.invalidate(src, false).unwrap();
    p.run(ms(50));
    assert_eq!(p.a.wcs()[0].1.status, WcStatus::LocProtErr);
    assert_eq!(p.a.qp.stats().tx_aborted, 1);
    assert!(p.b.wcs().is_empty());
    assert_eq!(p.b.qp.stats().rx_aborted, 1);
    assert_eq!(p.b.qp.recv_posted(), 1, "the receive went back");
    assert_eq!(p.a.qp.sq_in_use(), 0);
}

#[test]
fn a_read_source_lost_in_flight_fails_the_read() {
    let mut p = Pair::new(|_| {}, |_| {});
    let src =
        p.b.mem
            .register(0, 0x800_0000, 4 * ROOM_TAGGED, Access::REMOTE_READ);
    p.a.post(
        1,
        read(0x800_0000 - BASE, src),
        0,
        4 * ROOM_TAGGED,
        p.b.addr,
    );
    for d in p.a.tx() {
        p.deliver(Dir::AtoB, &d);
    }
    p.b.mem.invalidate(src, false).unwrap();
    p.run(ms(50));
    assert_eq!(p.a.wcs()[0].1.status, WcStatus::RemAccessErr);
    assert!(matches!(
        p.b.events()[..],
        [DgramEvent::RemoteAccess {
            error: MemError::InvalidStag,
            ..
        }]
    ));
    assert_eq!(p.b.qp.inbound_in_use(), 0);
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
