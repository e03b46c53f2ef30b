use super::*;
use crate::dgram::STAGE_MAX_DGRAM;
use crate::memory::MemError;
use crate::memory::{Access, VecMemory};
use crate::rc::SIGNALED;
use crate::wr::{InlineData, SendFlags};
use crate::wr::{SgList, Sge};
use std::net::{Ipv4Addr, Ipv6Addr};

const BASE: u64 = 0x10_0000;
/// IPv4, untagged + DQPN: 1500 − 28 − 22 − 4.
const ROOM_SEND: usize = 1446;
/// IPv4, tagged + X + DQPN: 1500 − 28 − 26 − 4.
const ROOM_TAGGED: usize = 1442;

#[derive(Default)]
struct VecSink {
    out: Vec<((IpAddr, u16), Vec<u8>)>,
    budget: Option<usize>,
    fail_next: Option<io::ErrorKind>,
}

impl DatagramSink for VecSink {
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        if let Some(k) = self.fail_next.take() {
            return Err(io::Error::from(k));
        }
        if let Some(b) = &mut self.budget {
            if *b == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            *b -= 1;
        }
        let mut d = Vec::new();
        for b in bufs {
            d.extend_from_slice(b);
        }
        self.out.push((dest, d));
        Ok(())
    }
}

struct Node {
    qp: UdQp,
    mem: VecMemory,
    addr: DgramAddr,
    buf: u32,
}

fn node(ip: [u8; 4], port: u16, slot: u32, f: impl FnOnce(&mut UdConfig)) -> Node {
    let qpn = (u32::from(port) << 8) | slot;
    let mut cfg = UdConfig {
        qpn,
        ..UdConfig::default()
    };
    f(&mut cfg);
    let mut mem = VecMemory::new();
    let buf = mem.register(0, BASE, 1 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    Node {
        qp: UdQp::new(cfg).expect("valid config"),
        mem,
        addr: DgramAddr {
            ip: IpAddr::V4(Ipv4Addr::from(ip)),
            port,
            qpn,
        },
        buf,
    }
}

fn a() -> Node {
    node([10, 0, 0, 1], 4791, 1, |_| {})
}

fn b() -> Node {
    node([10, 0, 0, 2], 4791, 2, |_| {})
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

    fn wr(&self, id: u64, op: SendOp, off: usize, len: usize) -> SendWr {
        SendWr {
            wr_id: id,
            op,
            payload: Payload::Sgl(SgList::single(BASE + off as u64, len as u32, self.buf)),
            flags: SIGNALED,
        }
    }

    fn send(&mut self, id: u64, off: usize, len: usize, imm: Option<u32>, to: DgramAddr) {
        let wr = self.wr(
            id,
            SendOp::Send {
                imm,
                invalidate: None,
            },
            off,
            len,
        );
        self.qp.post_send(wr, to).expect("posted");
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
        s.out.into_iter().map(|(_, d)| d).collect()
    }

    fn rx(&mut self, from: DgramAddr, d: &[u8], now: Instant) {
        self.qp
            .handle_datagram(from.ip, from.port, d, &mut self.mem, now);
    }

    fn wcs(&mut self) -> Vec<(CqKind, WorkCompletion)> {
        std::iter::from_fn(|| self.qp.poll_completion()).collect()
    }

    fn at(&self, off: usize, len: usize) -> &[u8] {
        &self.mem.bytes(self.buf)[off..off + len]
    }
}

fn repr_of(d: &[u8]) -> (SegmentRepr, usize) {
    let (r, p) = datagram::parse(d).expect("valid datagram");
    (r, p.len())
}

fn untagged(d: &[u8]) -> (u32, u32, u32, u32) {
    match repr_of(d).0.ddp {
        DdpHeader::Untagged {
            rsvd_ulp,
            qn,
            msn,
            mo,
        } => (rsvd_ulp, qn, msn, mo),
        _ => panic!("tagged"),
    }
}

/// Re-CRCs a datagram after a header edit.
fn fix_crc(d: &mut [u8]) {
    let n = d.len() - CRC_LEN;
    let t = datagram::trailer(&d[..n], &[]);
    d[n..].copy_from_slice(&t);
}

/// A sink that says which entry point a datagram came through
/// (`send`: only the transmit shortcut calls it directly) and can push
/// back or fail like a socket.
#[derive(Default)]
struct TraceSink {
    inner: VecSink,
    direct: usize,
}

impl DatagramSink for TraceSink {
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        self.direct += 1;
        self.inner.send(dest, bufs)
    }

    fn send_batch(&mut self, batch: &[Datagram<'_>]) -> io::Result<usize> {
        self.inner.send_batch(batch)
    }
}

#[test]
fn transmit_shortcut_matches_the_general_path() {
    // (name, work request, shortcut expected when the queue is empty).
    let n = a();
    let imm = |v| SendOp::Send {
        imm: v,
        invalidate: None,
    };
    let write = SendOp::Write {
        remote_addr: 0x40_0000,
        rkey: 0x1234,
        imm: None,
    };
    let record = SendOp::WriteRecord {
        remote_addr: 0x40_0000,
        rkey: 0x1234,
    };
    let three = SgList::from_slice(&[
        Sge {
            addr: BASE + 10,
            length: 7,
            lkey: n.buf,
        },
        Sge {
            addr: BASE + 900,
            length: 0,
            lkey: 0xdead_0000,
        },
        Sge {
            addr: BASE + 300,
            length: 50,
            lkey: n.buf,
        },
    ])
    .expect("three entries");
    let mut unsignaled = n.wr(6, imm(None), 0, 64);
    unsignaled.flags = SendFlags::default();
    let mut solicited = n.wr(7, imm(None), 0, 64);
    solicited.flags.solicited = true;
    let mut bad_key = n.wr(12, imm(None), 0, 64);
    bad_key.payload = Payload::Sgl(SgList::single(BASE, 64, n.buf ^ 0x100));
    let mut past_end = n.wr(13, imm(None), (1 << 20) - 32, 64);
    past_end.payload = Payload::Sgl(SgList::single(BASE + (1 << 20) - 32, 64, n.buf));
    let mut inline = n.wr(14, imm(None), 0, 0);
    inline.payload = Payload::Inline(InlineData::new(&pattern(40, 3)).expect("fits"));
    let mut sgl3 = n.wr(15, imm(None), 0, 0);
    sgl3.payload = Payload::Sgl(three);
    let cases: Vec<(&str, SendWr, bool)> = vec![
        ("send 64", n.wr(1, imm(None), 0, 64), true),
        ("send 0", n.wr(2, imm(None), 0, 0), true),
        ("send 512", n.wr(3, imm(None), 0, 512), true),
        ("send 513", n.wr(4, imm(None), 0, 513), false),
        ("imm, no payload", n.wr(5, imm(Some(9)), 0, 0), true),
        ("unsignaled", unsignaled, true),
        ("solicited", solicited, true),
        ("imm + payload", n.wr(8, imm(Some(9)), 0, 10), false),
        ("write 100", n.wr(9, write, 0, 100), true),
        ("write-record 100", n.wr(10, record, 0, 100), true),
        ("send 2 datagrams", n.wr(11, imm(None), 0, 2000), false),
        ("bad lkey", bad_key, false),
        ("past the region", past_end, false),
        ("inline", inline, true),
        ("three pieces", sgl3, true),
        (
            "read",
            n.wr(
                16,
                SendOp::Read {
                    remote_addr: 0,
                    rkey: 1,
                },
                0,
                8,
            ),
            false,
        ),
    ];
    let dest = b().addr;
    // How the sink treats the post's datagrams: takes all; pushes back
    // (then takes all on the next poll); fails the first.
    for mode in ["all", "would-block", "fail"] {
        let sink = || {
            let mut s = TraceSink::default();
            match mode {
                "would-block" => s.inner.budget = Some(0),
                "fail" => s.inner.fail_next = Some(io::ErrorKind::ConnectionRefused),
                _ => {}
            }
            s
        };
        let (mut fast, mut slow) = (a(), a());
        for node in [&mut fast, &mut slow] {
            node.fill(0, 4096, 5);
        }
        for (name, wr, qualifies) in &cases {
            let (mut fs, mut ss) = (sink(), sink());
            let fr = fast
                .qp
                .post_send_and_transmit(*wr, dest, &fast.mem, &mut fs);
            let sr = slow
                .qp
                .post_send(*wr, dest)
                .map(|()| slow.qp.poll_transmit(&slow.mem, &mut ss));
            let what = format!("{name} ({mode})");
            let kinds = |r: &Result<io::Result<usize>, PostError>| match r {
                Ok(Ok(k)) => Ok(Ok(*k)),
                Ok(Err(e)) => Ok(Err(e.kind())),
                Err(e) => Err(*e),
            };
            assert_eq!(kinds(&fr), kinds(&sr), "{what}: returns");
            assert_eq!(fs.inner.out, ss.inner.out, "{what}: datagrams");
            let took = fs.direct > 0;
            assert_eq!(took, *qualifies, "{what}: shortcut taken");
            assert_eq!(ss.direct, 0, "{what}: the general path batches");
            assert_eq!(fast.wcs(), slow.wcs(), "{what}: completions");
            assert_eq!(fast.qp.stats(), slow.qp.stats(), "{what}: counters");
            let wants = fast.qp.wants_transmit();
            assert_eq!(wants, slow.qp.wants_transmit(), "{what}: pending");
            if *qualifies {
                assert_eq!(wants, mode == "would-block", "{what}: pending");
            }
            // Whatever stayed queued goes the same way later.
            let (mut fs, mut ss) = (TraceSink::default(), TraceSink::default());
            let fr = fast
                .qp
                .poll_transmit(&fast.mem, &mut fs)
                .map_err(|e| e.kind());
            let sr = slow
                .qp
                .poll_transmit(&slow.mem, &mut ss)
                .map_err(|e| e.kind());
            assert_eq!(fr, sr, "{what}: later returns");
            assert_eq!(fs.inner.out, ss.inner.out, "{what}: later datagrams");
            assert_eq!(fast.wcs(), slow.wcs(), "{what}: later completions");
            assert_eq!(fast.qp.stats(), slow.qp.stats(), "{what}: later counters");
            assert!(!fast.qp.wants_transmit(), "{what}: all sent");
        }
    }
    // Behind a queued request the shortcut waits its turn.
    let mut q = a();
    q.qp.post_send(q.wr(1, imm(None), 0, 64), dest)
        .expect("posted");
    let mut s = TraceSink::default();
    let r =
        q.qp.post_send_and_transmit(q.wr(2, imm(None), 0, 64), dest, &q.mem, &mut s);
    assert_eq!(r.expect("posted").expect("sent"), 2);
    assert_eq!(s.direct, 0, "queued first: no shortcut");
    let ids: Vec<u64> = q.wcs().iter().map(|(_, wc)| wc.wr_id).collect();
    assert_eq!(ids, [1, 2], "in order");
}

/// Records each datagram's octets and how many buffers it came in.
#[derive(Default)]
struct PieceSink {
    inner: VecSink,
    pieces: Vec<usize>,
}

impl DatagramSink for PieceSink {
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        self.inner.send(dest, bufs)?;
        self.pieces.push(bufs.len());
        Ok(())
    }
}

#[test]
fn staged_batches_send_what_the_gather_sends() {
    // Batches of five or more datagrams are framed into the staging
    // buffer and offered one buffer per datagram; the octets,
    // completions and counters must be those of the gather path
    // (`send_planned_n`, driven here the way `poll_transmit` drives
    // it), for every MTU, gather list, mix of requests, and a sink
    // that takes only part of a batch.
    let dest = b().addr;
    let record = SendOp::WriteRecord {
        remote_addr: 0x40_0000,
        rkey: 0x1234,
    };
    let send = SendOp::Send {
        imm: None,
        invalidate: None,
    };
    let gather3 = |n: &Node| {
        // Pieces of 1 000, 5 and 40 000 octets: datagram boundaries
        // fall inside and across them.
        let sges = [(0u64, 1000u32), (70_000, 5), (100_000, 40_000)];
        let v: Vec<Sge> = sges
            .iter()
            .map(|&(off, length)| Sge {
                addr: BASE + off,
                length,
                lkey: n.buf,
            })
            .collect();
        Payload::Sgl(SgList::from_slice(&v).expect("three entries"))
    };
    // (name, MTU, requests as (op, offset, length), three-piece list).
    type Case = (&'static str, usize, Vec<(SendOp, usize, usize)>, bool);
    let cases: Vec<Case> = vec![
        ("send 20 000", 1500, vec![(send, 0, 20_000)], false),
        (
            "write-record 64 KiB",
            1500,
            vec![(record, 0, 65_536)],
            false,
        ),
        ("three pieces", 1500, vec![(record, 0, 0)], true),
        (
            "a mix in one batch",
            1500,
            vec![
                (send, 0, 3000),
                (send, 7, 100),
                (record, 9, 5000),
                (send, 0, 0),
            ],
            false,
        ),
        (
            "MTU 9000: seven per stage",
            9000,
            vec![(record, 0, 200_000)],
            false,
        ),
        (
            "MTU 65535: too big to stage",
            65_535,
            vec![(send, 0, 300_000)],
            false,
        ),
    ];
    for (name, mtu, reqs, three) in &cases {
        for budget in [None, Some(3)] {
            let what = format!("{name} (budget {budget:?})");
            let mk = || {
                let mut n = node([10, 0, 0, 1], 4791, 1, |c| {
                    c.mtu = *mtu;
                    c.max_msg = 1 << 20;
                });
                n.fill(0, 1 << 20, 9);
                for (i, &(op, off, len)) in reqs.iter().enumerate() {
                    let mut wr = n.wr(i as u64 + 1, op, off, len);
                    if *three {
                        wr.payload = gather3(&n);
                    }
                    n.qp.post_send(wr, dest).expect("posted");
                }
                n
            };
            let (mut staged, mut gathered) = (mk(), mk());
            // The staging path, through `poll_transmit`, with a sink
            // that pushes back after `budget` datagrams per poll.
            let mut ss = PieceSink::default();
            let mut polls = 0;
            while staged.qp.wants_transmit() {
                ss.inner.budget = budget;
                staged.qp.poll_transmit(&staged.mem, &mut ss).expect("sent");
                polls += 1;
                assert!(polls < 10_000, "{what}: no progress");
            }
            // A batch the staging buffer cut short is not a sink
            // pushing back: one poll sends all a willing sink takes.
            if budget.is_none() {
                assert_eq!(polls, 1, "{what}: polls to send everything");
            }
            // The gather path.
            let mut gs = PieceSink::default();
            let mut plan = [Planned::default(); TX_BATCH];
            loop {
                let n = gathered.qp.plan(&gathered.mem, &mut plan);
                if n == 0 {
                    break;
                }
                let k = gathered
                    .qp
                    .send_planned_n::<_, _, TX_BATCH, { TX_BATCH * IOV_PER }>(
                        &gathered.mem,
                        &mut gs,
                        &plan[..n],
                    )
                    .expect("sent");
                gathered.qp.commit(&plan[..k]);
            }
            assert!(!ss.inner.out.is_empty(), "{what}: sent something");
            assert_eq!(ss.inner.out.len(), gs.inner.out.len(), "{what}: datagrams");
            for (i, (x, y)) in ss.inner.out.iter().zip(&gs.inner.out).enumerate() {
                assert!(x == y, "{what}: datagram {i} differs");
            }
            assert_eq!(staged.wcs(), gathered.wcs(), "{what}: completions");
            assert_eq!(staged.qp.stats(), gathered.qp.stats(), "{what}: counters");
            // Which path framed them: one buffer per staged datagram,
            // header + pieces + trailer per gathered one.
            // (A Send without payload has no piece between the two.)
            assert!(gs.pieces.iter().all(|&p| p >= 2), "{what}: gathered");
            let too_big = *mtu > STAGE_MAX_DGRAM;
            let one_buffer = ss.pieces.iter().filter(|&&p| p == 1).count();
            if too_big {
                assert_eq!(one_buffer, 0, "{what}: nothing staged");
            } else if budget.is_none() {
                // Every datagram but those of a last batch of at most
                // four (sent without staging) came in one buffer.
                assert!(
                    one_buffer + 4 >= ss.pieces.len(),
                    "{what}: staged {one_buffer} of {}",
                    ss.pieces.len()
                );
                assert!(one_buffer > 0, "{what}: staged");
            }
        }
    }
}

#[test]
fn config_is_checked() {
    let bad = |f: fn(&mut UdConfig)| {
        let mut c = UdConfig::default();
        f(&mut c);
        UdQp::new(c).err()
    };
    assert_eq!(bad(|c| c.qpn = 1 << 24), Some(UdConfigError::Qpn));
    assert_eq!(bad(|c| c.mtu = MIN_MTU - 1), Some(UdConfigError::Mtu));
    assert_eq!(bad(|c| c.mtu = MAX_MTU + 1), Some(UdConfigError::Mtu));
    assert_eq!(
        bad(|c| c.max_msg = MAX_MSG_LIMIT + 1),
        Some(UdConfigError::MaxMsg)
    );
    assert_eq!(bad(|c| c.rq_depth = 0), Some(UdConfigError::Depth));
    assert_eq!(bad(|c| c.max_reassembly = 0), Some(UdConfigError::Depth));
    assert_eq!(bad(|_| {}), None);
    assert_eq!(bad(|c| c.max_msg = MAX_MSG_LIMIT), None);
}

#[test]
fn single_segment_send_and_wire_layout() {
    let (mut a, mut b) = (a(), b());
    let data = a.fill(0, 100, 7);
    b.recv(9, 0, 2000);
    a.send(1, 0, 100, None, b.addr);
    let d = a.tx();
    assert_eq!(d.len(), 1);
    let d = &d[0];
    assert_eq!(d.len(), 22 + 100 + 4);
    assert_eq!(d[0], 0x51, "T=0 L=1 X=0 Q=1 DV=1");
    assert_eq!(d[1], 0x43, "RV=1 Send");
    assert_eq!(&d[2..6], &a.addr.qpn.to_be_bytes(), "RsvdULP = source QPN");
    assert_eq!(untagged(d), (a.addr.qpn, 0, 1, 0));
    let dqpn = u32::from_be_bytes(d[18..22].try_into().unwrap());
    assert_eq!(dqpn, (1 << 24) | b.addr.qpn, "slot in the top octet");
    assert_eq!(dqpn_of(d), Some(b.addr.qpn));
    assert_eq!(&d[22..122], &data[..]);
    // The WR completed when the sink took the datagram.
    assert_eq!(
        a.wcs(),
        vec![(
            CqKind::Send,
            WorkCompletion::new(1, WcStatus::Success, WcOpcode::Send, 100)
        )]
    );
    assert!(!a.qp.wants_transmit());
    b.rx(a.addr, d, Instant::now());
    let wcs = b.wcs();
    assert_eq!(wcs.len(), 1);
    let (kind, wc) = wcs[0];
    assert_eq!(kind, CqKind::Recv);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (9, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!((wc.byte_len, wc.imm, wc.solicited), (100, None, false));
    assert_eq!(wc.src, Some(a.addr));
    assert_eq!(b.at(0, 100), &data[..]);
    assert_eq!(b.qp.stats().rx_delivered, 1);
    assert_eq!(a.qp.stats().tx_datagrams, 1);
}

/// The clock is asked for only by a datagram that starts a timer: not
/// by a Send in one datagram (nor a one-datagram Write), once per
/// datagram that opens or continues a message of several, and by
/// every Write-Record segment.
#[test]
fn the_clock_is_read_only_for_timers() {
    let (mut a, mut b) = (a(), b());
    let asked = std::cell::Cell::new(0u32);
    let rx = |b: &mut Node, from: DgramAddr, d: &[u8]| {
        b.qp.handle_datagram_lazy(from.ip, from.port, d, &mut b.mem, || {
            asked.set(asked.get() + 1);
            Instant::now()
        })
    };
    a.fill(0, 10_000, 5);
    b.recv(1, 0, 2000);
    a.send(1, 0, 64, None, b.addr);
    let d = a.tx();
    rx(&mut b, a.addr, &d[0]);
    assert_eq!(b.wcs().len(), 1, "delivered");
    let w = a.wr(
        2,
        SendOp::Write {
            remote_addr: BASE,
            rkey: b.buf,
            imm: None,
        },
        0,
        64,
    );
    a.qp.post_send(w, b.addr).unwrap();
    for s in a.tx() {
        rx(&mut b, a.addr, &s);
    }
    assert_eq!(
        asked.get(),
        0,
        "a one-datagram Send or Write reads no clock"
    );
    b.recv(3, 0, 16_000);
    a.send(3, 0, 3000, None, b.addr);
    let d = a.tx();
    assert_eq!(d.len(), 3);
    rx(&mut b, a.addr, &d[0]);
    assert_eq!(asked.get(), 1, "the first of three opens a reassembly");
    rx(&mut b, a.addr, &d[1]);
    rx(&mut b, a.addr, &d[2]);
    assert_eq!(asked.get(), 1, "continuing it needs no clock");
    assert_eq!(b.wcs().len(), 1, "reassembled");
    let r = a.wr(
        4,
        SendOp::WriteRecord {
            remote_addr: BASE + 0x1000,
            rkey: b.buf,
        },
        0,
        100,
    );
    a.qp.post_send(r, b.addr).unwrap();
    for s in a.tx() {
        rx(&mut b, a.addr, &s);
    }
    assert_eq!(
        asked.get(),
        2,
        "a Write-Record segment is logged with its time"
    );
}

#[test]
fn segmentation_and_reassembly_in_any_order() {
    let (mut a, mut b) = (a(), b());
    let data = a.fill(0, 10_000, 3);
    b.recv(1, 0, 16_000);
    a.send(1, 0, 10_000, None, b.addr);
    let d = a.tx();
    assert_eq!(d.len(), 10_000usize.div_ceil(ROOM_SEND));
    for (i, s) in d.iter().enumerate() {
        let (r, plen) = repr_of(s);
        let (_, qn, msn, mo) = untagged(s);
        assert_eq!((qn, msn, mo as usize), (0, 1, i * ROOM_SEND));
        assert_eq!(r.last, i + 1 == d.len());
        assert_eq!(plen, ROOM_SEND.min(10_000 - i * ROOM_SEND));
        assert!(s.len() + IPV4_UDP_OVERHEAD <= 1500);
    }
    let now = Instant::now();
    // Reversed, holding the first segment back: nothing completes.
    for s in d[1..].iter().rev() {
        b.rx(a.addr, s, now);
    }
    assert!(b.wcs().is_empty());
    assert_eq!(b.qp.in_reassembly(), 1);
    b.rx(a.addr, &d[0], now);
    let wcs = b.wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].1.byte_len, 10_000);
    assert_eq!(b.at(0, 10_000), &data[..]);
    assert_eq!(b.qp.in_reassembly(), 0);
    assert_eq!(b.qp.poll_timeout(), None);
}

#[test]
fn ipv6_destinations_get_smaller_segments() {
    let mut a = a();
    a.fill(0, 3000, 1);
    let dest = DgramAddr {
        ip: IpAddr::V6(Ipv6Addr::LOCALHOST),
        port: 1,
        qpn: 0x100,
    };
    a.send(1, 0, 3000, None, dest);
    let d = a.tx();
    assert_eq!(repr_of(&d[0]).1, 1500 - 48 - 22 - 4);
    // An IPv4-mapped destination is IPv4.
    let dest = DgramAddr {
        ip: IpAddr::V6(Ipv4Addr::new(1, 2, 3, 4).to_ipv6_mapped()),
        ..dest
    };
    a.send(2, 0, 3000, None, dest);
    assert_eq!(repr_of(&a.tx()[0]).1, ROOM_SEND);
}

#[test]
fn send_with_immediate_is_data_then_immediate_segment() {
    let (mut a, mut b) = (a(), b());
    let data = a.fill(0, 3000, 5);
    b.recv(1, 0, 4000);
    b.recv(2, 4000, 100);
    a.send(1, 0, 3000, Some(0xdead_beef), b.addr);
    let d = a.tx();
    assert_eq!(d.len(), 3 + 1);
    for s in &d[..3] {
        let (r, _) = repr_of(s);
        assert_eq!((r.opcode, r.last), (Opcode::Send, false));
    }
    let (r, plen) = repr_of(&d[3]);
    assert_eq!((r.opcode, r.last, plen), (Opcode::ImmediateData, true, 0));
    assert_eq!(r.body, RdmapBody::Immediate(0xdead_beef));
    assert_eq!(untagged(&d[3]), (a.addr.qpn, 0, 1, 3000));
    let now = Instant::now();
    // The immediate first: the message is still incomplete.
    b.rx(a.addr, &d[3], now);
    b.rx(a.addr, &d[0], now);
    b.rx(a.addr, &d[2], now);
    assert!(b.wcs().is_empty());
    b.rx(a.addr, &d[1], now);
    let wc = b.wcs()[0].1;
    assert_eq!(
        (wc.wr_id, wc.byte_len, wc.imm),
        (1, 3000, Some(0xdead_beef))
    );
    assert_eq!(b.at(0, 3000), &data[..]);
    // Zero-length with immediate and solicited event: one datagram.
    let wr = SendWr {
        flags: SendFlags {
            solicited: true,
            ..SIGNALED
        },
        ..a.wr(
            2,
            SendOp::Send {
                imm: Some(7),
                invalidate: None,
            },
            0,
            0,
        )
    };
    a.qp.post_send(wr, b.addr).unwrap();
    let d = a.tx();
    assert_eq!(d.len(), 1);
    assert_eq!(repr_of(&d[0]).0.opcode, Opcode::ImmediateDataSe);
    b.rx(a.addr, &d[0], now);
    let wc = b.wcs()[0].1;
    assert_eq!(
        (wc.wr_id, wc.byte_len, wc.imm, wc.solicited),
        (2, 0, Some(7), true)
    );
}

#[test]
fn solicited_and_zero_length_sends() {
    let (mut a, mut b) = (a(), b());
    b.recv(1, 0, 10);
    b.recv(2, 10, 10);
    a.fill(0, 5, 1);
    let wr = SendWr {
        flags: SendFlags {
            solicited: true,
            signaled: false,
            fence: false,
        },
        ..a.wr(
            1,
            SendOp::Send {
                imm: None,
                invalidate: None,
            },
            0,
            5,
        )
    };
    a.qp.post_send(wr, b.addr).unwrap();
    a.send(2, 0, 0, None, b.addr);
    let d = a.tx();
    assert_eq!(d.len(), 2);
    assert_eq!(repr_of(&d[0]).0.opcode, Opcode::SendSe);
    assert_eq!(repr_of(&d[1]), (repr_of(&d[1]).0, 0));
    // Only the signaled one completes at the sender.
    assert_eq!(a.wcs().len(), 1);
    let now = Instant::now();
    b.rx(a.addr, &d[0], now);
    b.rx(a.addr, &d[1], now);
    let w = b.wcs();
    assert_eq!(
        (w[0].1.wr_id, w[0].1.solicited, w[0].1.byte_len),
        (1, true, 5)
    );
    assert_eq!(
        (w[1].1.wr_id, w[1].1.solicited, w[1].1.byte_len),
        (2, false, 0)
    );
}

#[test]
fn lost_segment_drops_the_message_and_returns_its_receive() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 4000, 9);
    for id in 1..=3 {
        b.recv(id, (id as usize) * 5000, 5000);
    }
    a.send(1, 0, 4000, None, b.addr); // M1: 3 segments
    a.send(2, 0, 10, None, b.addr); // M2: 1 segment
    let d = a.tx();
    assert_eq!(d.len(), 4);
    let t0 = Instant::now();
    b.rx(a.addr, &d[0], t0);
    b.rx(a.addr, &d[2], t0);
    b.rx(a.addr, &d[3], t0);
    let w = b.wcs();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].1.wr_id, 2, "M1 holds receive 1, M2 took receive 2");
    assert_eq!(b.qp.recv_posted(), 1);
    let deadline = t0 + Duration::from_millis(100);
    assert_eq!(b.qp.poll_timeout(), Some(deadline));
    b.qp.handle_timeout(deadline - Duration::from_millis(1));
    assert_eq!(b.qp.stats().rx_timeouts, 0);
    b.qp.handle_timeout(deadline);
    assert_eq!(b.qp.stats().rx_timeouts, 1);
    assert!(b.wcs().is_empty(), "nothing partial is delivered");
    assert_eq!(b.qp.recv_posted(), 2);
    // The late segment of M1 claims nothing.
    b.rx(a.addr, &d[1], deadline);
    assert!(b.wcs().is_empty());
    assert_eq!(b.qp.stats().rx_duplicates, 1);
    // Receive 1 is back at the head, ahead of receive 3.
    a.send(3, 0, 10, None, b.addr);
    a.send(4, 0, 10, None, b.addr);
    for s in a.tx() {
        b.rx(a.addr, &s, deadline);
    }
    let ids: Vec<u64> = b.wcs().iter().map(|w| w.1.wr_id).collect();
    assert_eq!(ids, vec![1, 3]);
}

#[test]
fn receive_queue_depth_counts_claimed_receives() {
    let (mut a, mut b) = (a(), node([10, 0, 0, 2], 4791, 2, |c| c.rq_depth = 2));
    a.fill(0, 3000, 1);
    b.recv(1, 0, 4000);
    b.recv(2, 4000, 4000);
    a.send(1, 0, 3000, None, b.addr);
    let d = a.tx();
    let now = Instant::now();
    b.rx(a.addr, &d[0], now);
    assert_eq!(b.qp.recv_posted(), 1);
    let sgl = SgList::single(BASE, 1, b.buf);
    assert_eq!(
        b.qp.post_recv(RecvWr { wr_id: 3, sgl }),
        Err(PostError::QueueFull)
    );
    b.rx(a.addr, &d[1], now);
    b.rx(a.addr, &d[2], now);
    assert_eq!(b.wcs().len(), 1);
    assert_eq!(b.qp.post_recv(RecvWr { wr_id: 3, sgl }), Ok(()));
}

#[test]
fn duplicates_are_delivered_once() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 4000, 2);
    for id in 1..=4 {
        b.recv(id, (id as usize) * 5000, 5000);
    }
    a.send(1, 0, 10, None, b.addr);
    a.send(2, 0, 4000, Some(1), b.addr);
    let d = a.tx();
    let now = Instant::now();
    for s in d.iter().chain(d.iter()).chain(d.iter().rev()) {
        b.rx(a.addr, s, now);
    }
    let w = b.wcs();
    assert_eq!(w.len(), 2);
    assert_eq!(b.qp.recv_posted(), 2);
    assert_eq!(b.qp.stats().rx_delivered, 2);
    assert_eq!(b.qp.stats().rx_duplicates, 2 * d.len() as u64);
    // A duplicate of an octet range within a message in progress.
    a.send(3, 0, 4000, None, b.addr);
    let d = a.tx();
    b.rx(a.addr, &d[0], now);
    b.rx(a.addr, &d[0], now);
    assert_eq!(b.qp.stats().rx_duplicates, 2 * 5 + 1);
    b.rx(a.addr, &d[2], now);
    b.rx(a.addr, &d[1], now);
    assert_eq!(b.wcs().len(), 1);
}

#[test]
fn message_longer_than_the_buffer_is_loc_len_err() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 3000, 2);
    b.recv(1, 0, 100);
    b.recv(2, 1000, 5000);
    a.send(1, 0, 3000, None, b.addr);
    a.send(2, 0, 50, None, b.addr);
    let d = a.tx();
    let now = Instant::now();
    // The last segment shows the length first.
    b.rx(a.addr, &d[2], now);
    let w = b.wcs();
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].1.wr_id, w[0].1.status), (1, WcStatus::LocLenErr));
    assert_eq!(w[0].1.src, Some(a.addr));
    // The rest of the message is ignored; the next one gets receive 2.
    for s in &d {
        b.rx(a.addr, s, now);
    }
    let w = b.wcs();
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].1.wr_id, w[0].1.byte_len), (2, 50));
    assert_eq!(b.qp.stats().rx_len_err, 1);
    assert_eq!(b.qp.in_reassembly(), 0);
    // A single-segment message too long for its buffer.
    b.recv(3, 0, 10);
    a.send(3, 0, 11, None, b.addr);
    b.rx(a.addr, &a.tx()[0], now);
    assert_eq!(b.wcs()[0].1.status, WcStatus::LocLenErr);
    // Longer than max_msg at the receiver.
    let mut c = node([10, 0, 0, 3], 4791, 3, |c| c.max_msg = 64);
    c.recv(1, 0, 1000);
    a.send(4, 0, 65, None, c.addr);
    c.rx(a.addr, &a.tx()[0], now);
    assert_eq!(c.wcs()[0].1.status, WcStatus::LocLenErr);
}

#[test]
fn no_posted_receive_drops_the_whole_message() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 3000, 2);
    a.send(1, 0, 3000, None, b.addr);
    let d = a.tx();
    let now = Instant::now();
    b.rx(a.addr, &d[1], now);
    assert_eq!(b.qp.stats().rx_no_recv, 1);
    b.recv(1, 0, 5000);
    b.rx(a.addr, &d[0], now);
    b.rx(a.addr, &d[2], now);
    assert!(b.wcs().is_empty());
    assert_eq!(b.qp.recv_posted(), 1);
    assert_eq!(b.qp.stats().rx_no_recv, 1);
    assert_eq!(b.qp.stats().rx_duplicates, 2);
}

#[test]
fn bad_input_is_counted_and_dropped() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 100, 2);
    b.recv(1, 0, 5000);
    a.send(1, 0, 100, None, b.addr);
    let good = a.tx().remove(0);
    let now = Instant::now();
    let s = |b: &Node| b.qp.stats();
    let mut d = good.clone();
    d[40] ^= 4;
    b.rx(a.addr, &d, now);
    assert_eq!(s(&b).rx_bad_crc, 1);
    b.rx(a.addr, &good[..5], now);
    assert_eq!(s(&b).rx_malformed, 1);
    // Another DQPN.
    let mut d = good.clone();
    d[21] ^= 1;
    fix_crc(&mut d);
    b.rx(a.addr, &d, now);
    assert_eq!(s(&b).rx_bad_dqpn, 1);
    // A different source slot does not matter for an untagged segment
    // but an RsvdULP above 24 bits does.
    let mut d = good.clone();
    d[2] = 1;
    fix_crc(&mut d);
    b.rx(a.addr, &d, now);
    assert_eq!(s(&b).rx_malformed, 2);
    // QN 1.
    let mut d = good.clone();
    d[9] = 1;
    fix_crc(&mut d);
    b.rx(a.addr, &d, now);
    assert_eq!(s(&b).rx_malformed, 3);
    // Send with Invalidate.
    let mut d = good.clone();
    d[1] = 0x44;
    fix_crc(&mut d);
    b.rx(a.addr, &d, now);
    assert_eq!(s(&b).rx_unsupported, 1);
    // Immediate Data without L.
    let mut repr = SegmentRepr::untagged(
        Opcode::ImmediateData,
        0,
        5,
        0,
        false,
        RdmapBody::Immediate(1),
    );
    repr.dqpn = Some(b.addr.qpn);
    let mut d = vec![0u8; 64];
    let n = datagram::emit_into(&repr, &[], &mut d);
    b.rx(a.addr, &d[..n], now);
    assert_eq!(s(&b).rx_malformed, 4);
    // A Read Request.
    let mut repr = SegmentRepr::untagged(
        Opcode::ReadRequest,
        1,
        1,
        0,
        true,
        RdmapBody::ReadRequest(softrdma_wire::rdmap::ReadRequest {
            sink_stag: 1,
            sink_to: 0,
            size: 8,
            src_stag: b.buf,
            src_to: BASE,
        }),
    );
    repr.dqpn = Some(b.addr.qpn);
    let n = datagram::emit_into(&repr, &[], &mut d);
    b.rx(a.addr, &d[..n], now);
    assert_eq!(s(&b).rx_unsupported, 2);
    // Without DQPN.
    let mut repr = SegmentRepr::untagged(Opcode::Send, 0, 9, 0, true, RdmapBody::None);
    set_rsvd_ulp(&mut repr, a.addr.qpn);
    let n = datagram::emit_into(&repr, b"hi", &mut d);
    b.rx(a.addr, &d[..n], now);
    assert_eq!(s(&b).rx_bad_dqpn, 2);
    assert!(b.wcs().is_empty());
    assert_eq!(s(&b).rx_datagrams, 9);
    // Still working.
    b.rx(a.addr, &good, now);
    assert_eq!(b.wcs().len(), 1);
    // A default QP takes segments without DQPN.
    let mut c = node([10, 0, 0, 3], 4791, 3, |c| c.accept_without_dqpn = true);
    c.recv(1, 0, 10);
    c.rx(a.addr, &d[..n], now);
    assert_eq!(c.wcs()[0].1.byte_len, 2);
}

#[test]
fn rdma_write_is_placed_in_any_order() {
    let (mut a, mut b) = (a(), b());
    let data = a.fill(0, 5000, 4);
    let wr = a.wr(
        1,
        SendOp::Write {
            remote_addr: BASE + 100,
            rkey: b.buf,
            imm: None,
        },
        0,
        5000,
    );
    a.qp.post_send(wr, b.addr).unwrap();
    let d = a.tx();
    assert_eq!(d.len(), 5000usize.div_ceil(ROOM_TAGGED));
    for (i, s) in d.iter().enumerate() {
        assert_eq!(s[0] & 0xF0, if i + 1 == d.len() { 0xF0 } else { 0xB0 });
        let (r, _) = repr_of(s);
        let DdpHeader::Tagged { stag, to, ext } = r.ddp else {
            panic!("untagged")
        };
        let off = (i * ROOM_TAGGED) as u64;
        assert_eq!((stag, to), (b.buf, BASE + 100 + off));
        assert_eq!(
            ext,
            Some(TaggedExt {
                msn: 1,
                mo: off as u32
            })
        );
        assert_eq!(r.dqpn, Some((1 << 24) | b.addr.qpn));
        assert_eq!(dqpn_of(s), Some(b.addr.qpn));
    }
    assert_eq!(a.wcs()[0].1.opcode, WcOpcode::RdmaWrite);
    let now = Instant::now();
    for s in d.iter().rev() {
        b.rx(a.addr, s, now);
    }
    assert_eq!(b.at(100, 5000), &data[..]);
    assert!(
        b.wcs().is_empty(),
        "a Write completes nothing at the target"
    );
    assert_eq!(b.qp.stats().rx_write_segments, d.len() as u64);
}

#[test]
fn remote_access_violations_are_events_and_the_qp_goes_on() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 64, 4);
    let ro = b.mem.register(0, 0x900_0000, 4096, Access::REMOTE_READ);
    let other_pd = b.mem.register(7, 0xA00_0000, 4096, Access::REMOTE_WRITE);
    let cases = [
        (b.buf ^ 0x80, BASE, MemError::InvalidStag),
        (b.buf, BASE + (1 << 20) - 10, MemError::BaseBounds),
        (ro, 0x900_0000, MemError::AccessRights),
        (other_pd, 0xA00_0000, MemError::WrongPd),
    ];
    let before = b.mem.clone();
    let now = Instant::now();
    for (i, &(rkey, to, err)) in cases.iter().enumerate() {
        let op = if i % 2 == 0 {
            SendOp::Write {
                remote_addr: to,
                rkey,
                imm: None,
            }
        } else {
            SendOp::WriteRecord {
                remote_addr: to,
                rkey,
            }
        };
        let wr = a.wr(i as u64, op, 0, 64);
        a.qp.post_send(wr, b.addr).unwrap();
        for s in a.tx() {
            b.rx(a.addr, &s, now);
        }
        let ev = b.qp.poll_event().expect("event");
        assert_eq!(
            ev,
            UdEvent::RemoteAccess {
                src: a.addr,
                opcode: if i % 2 == 0 {
                    Opcode::RdmaWrite
                } else {
                    Opcode::WriteRecord
                },
                msn: i as u32 + 1,
                stag: rkey,
                to,
                len: 64,
                error: err,
            }
        );
    }
    for s in [b.buf, ro, other_pd] {
        assert_eq!(b.mem.bytes(s), before.bytes(s));
    }
    assert_eq!(b.qp.stats().rx_access_errors, 4);
    assert!(b.wcs().is_empty());
    // The event queue is bounded.
    let mut c = node([10, 0, 0, 3], 4791, 3, |c| c.event_depth = 1);
    for i in 0..3 {
        let wr = a.wr(
            i,
            SendOp::Write {
                remote_addr: 0,
                rkey: 0,
                imm: None,
            },
            0,
            1,
        );
        a.qp.post_send(wr, c.addr).unwrap();
    }
    for s in a.tx() {
        c.rx(a.addr, &s, now);
    }
    assert_eq!(c.qp.stats().events_lost, 2);
    // Sends still work.
    b.recv(1, 0, 100);
    a.send(9, 0, 10, None, b.addr);
    b.rx(a.addr, &a.tx()[0], now);
    assert_eq!(b.wcs()[0].1.status, WcStatus::Success);
}

#[test]
fn write_record_is_logged_without_a_receive() {
    let (mut a, mut b) = (a(), b());
    let data = a.fill(0, 4000, 8);
    let wr = a.wr(
        5,
        SendOp::WriteRecord {
            remote_addr: BASE + 0x1000,
            rkey: b.buf,
        },
        0,
        4000,
    );
    a.qp.post_send(wr, b.addr).unwrap();
    let d = a.tx();
    assert_eq!(d.len(), 3);
    assert!(d.iter().all(|s| s[1] == 0x4C && s[0] & 0x30 == 0x30));
    assert_eq!(a.wcs()[0].1.opcode, WcOpcode::WriteRecord);
    let now = Instant::now();
    b.rx(a.addr, &d[2], now);
    b.rx(a.addr, &d[0], now);
    assert!(b.wcs().is_empty());
    assert!(b.qp.record_tracker().is_valid(b.buf, BASE + 0x1000, 1442));
    assert!(!b.qp.record_tracker().is_valid(b.buf, BASE + 0x1000, 1443));
    b.rx(a.addr, &d[1], now);
    let w = b.wcs();
    assert_eq!(w.len(), 1);
    let (kind, wc) = w[0];
    assert_eq!(kind, CqKind::Recv);
    assert_eq!(
        (wc.opcode, wc.status),
        (WcOpcode::RecvWriteRecord, WcStatus::Success)
    );
    assert_eq!(wc.src, Some(a.addr), "tagged source QPN = port << 8 | slot");
    let rec = wc.record.expect("record info");
    assert_eq!(
        (rec.stag, rec.to, rec.len, rec.msn),
        (b.buf, BASE + 0x1000, 4000, 1)
    );
    assert_eq!(b.at(0x1000, 4000), &data[..]);
    assert!(b.qp.record_tracker().is_valid(b.buf, BASE + 0x1000, 4000));
    assert_eq!(b.qp.stats().rx_record_segments, 3);
    // Duplicates are neither recorded twice nor placed again: what
    // the application wrote after the completion stays.
    let reused = b.fill(0x1000, 4000, 77);
    for s in &d {
        b.rx(a.addr, s, now);
    }
    assert!(b.wcs().is_empty());
    assert_eq!(b.qp.record_stats().duplicates, 3);
    assert_eq!(b.at(0x1000, 4000), &reused[..], "a duplicate was placed");
    assert_eq!(b.qp.stats().rx_no_recv, 0);
    // Zero-length Write-Record: one segment, one record.
    let wr = a.wr(
        6,
        SendOp::WriteRecord {
            remote_addr: BASE,
            rkey: b.buf,
        },
        0,
        0,
    );
    a.qp.post_send(wr, b.addr).unwrap();
    let d = a.tx();
    assert_eq!(d.len(), 1);
    b.rx(a.addr, &d[0], now);
    let wc = b.wcs()[0].1;
    assert_eq!(wc.record.map(|r| (r.len, r.msn)), Some((0, 2)));
}

#[test]
fn a_late_segment_of_a_retired_record_changes_no_memory() {
    // Reordering: the first segment of message 2 overtakes the tail of
    // message 1, which it retires (partial). The tail arrives next: the
    // tracker drops it as stale, and memory must not hold it either —
    // the validity map and the partial record describe memory exactly.
    let (mut a, mut b) = (a(), b());
    let data = a.fill(0, 4000, 8);
    let write = |a: &Node, id, off: u64| {
        a.wr(
            id,
            SendOp::WriteRecord {
                remote_addr: BASE + off,
                rkey: b.buf,
            },
            0,
            4000,
        )
    };
    a.qp.post_send(write(&a, 1, 0x1000), b.addr).unwrap();
    let m1 = a.tx();
    a.qp.post_send(write(&a, 2, 0x4000), b.addr).unwrap();
    let m2 = a.tx();
    assert_eq!((m1.len(), m2.len()), (3, 3));
    let before = b.at(0x1000, 4000).to_vec();
    let now = Instant::now();
    b.rx(a.addr, &m1[0], now);
    b.rx(a.addr, &m2[0], now);
    b.rx(a.addr, &m1[1], now);
    b.rx(a.addr, &m1[2], now);
    assert_eq!(b.qp.record_stats().retired_by_newer_msn, 1);
    assert_eq!(b.qp.record_stats().stale_segments, 2);
    assert_eq!(b.at(0x1000, 1442), &data[..1442], "the head was placed");
    assert_eq!(
        b.at(0x1000 + 1442, 4000 - 1442),
        &before[1442..],
        "the stale tail was not"
    );
    let t = b.qp.record_tracker();
    assert!(t.is_valid(b.buf, BASE + 0x1000, 1442));
    assert!(!t.is_valid(b.buf, BASE + 0x1000 + 1442, 1));
    let w = b.wcs();
    assert_eq!(w.len(), 1, "message 1 reported once, as partial");
    assert_eq!(w[0].1.status, WcStatus::RecordPartial);
    // Message 2 goes on as if nothing happened.
    b.rx(a.addr, &m2[1], now);
    b.rx(a.addr, &m2[2], now);
    assert_eq!(b.at(0x4000, 4000), &data[..]);
    assert_eq!(b.wcs()[0].1.status, WcStatus::Success);
}

#[test]
fn record_and_send_completions_keep_arrival_order() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 100, 1);
    b.recv(1, 0, 100);
    let rec = |id| a_wr_record(id, b.buf);
    a.qp.post_send(a.wr(1, rec(1), 0, 10), b.addr).unwrap();
    a.send(2, 0, 10, None, b.addr);
    a.qp.post_send(a.wr(3, rec(3), 0, 10), b.addr).unwrap();
    let now = Instant::now();
    for s in a.tx() {
        b.rx(a.addr, &s, now);
    }
    let ops: Vec<WcOpcode> = b.wcs().iter().map(|w| w.1.opcode).collect();
    assert_eq!(
        ops,
        vec![
            WcOpcode::RecvWriteRecord,
            WcOpcode::Recv,
            WcOpcode::RecvWriteRecord
        ]
    );
}

fn a_wr_record(id: u64, rkey: u32) -> SendOp {
    SendOp::WriteRecord {
        remote_addr: BASE + 0x1000 * id,
        rkey,
    }
}

#[test]
fn write_record_partial_after_timeout() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 4000, 8);
    let wr = a.wr(
        5,
        SendOp::WriteRecord {
            remote_addr: BASE,
            rkey: b.buf,
        },
        0,
        4000,
    );
    a.qp.post_send(wr, b.addr).unwrap();
    let d = a.tx();
    let t0 = Instant::now();
    b.rx(a.addr, &d[0], t0);
    b.rx(a.addr, &d[2], t0);
    let t = b.qp.poll_timeout().expect("tracker deadline");
    b.qp.handle_timeout(t);
    let wc = b.wcs()[0].1;
    assert_eq!(wc.status, WcStatus::RecordPartial);
    let rec = wc.record.unwrap();
    assert_eq!(
        &rec.ranges[..usize::from(rec.n_ranges)],
        &[(0, 1442), (2884, 4000 - 2884)]
    );
}

#[test]
fn qps_sharing_a_socket_are_told_apart() {
    let mut a1 = a();
    let mut a2 = node([10, 0, 0, 1], 4791, 7, |_| {});
    let mut b = b();
    let r1 = b.mem.register(0, 0x200_0000, 100, Access::REMOTE_WRITE);
    a1.fill(0, 10, 1);
    a2.fill(0, 10, 2);
    let now = Instant::now();
    for (n, stag) in [(&mut a1, b.buf), (&mut a2, r1)] {
        let to = if stag == b.buf { BASE } else { 0x200_0000 };
        let wr = n.wr(
            1,
            SendOp::WriteRecord {
                remote_addr: to,
                rkey: stag,
            },
            0,
            10,
        );
        n.qp.post_send(wr, b.addr).unwrap();
        let d = n.tx();
        let from = n.addr;
        b.rx(from, &d[0], now);
    }
    let w = b.wcs();
    assert_eq!(w.len(), 2, "same T-MSN, different source slots");
    assert_eq!(w[0].1.src, Some(a1.addr));
    assert_eq!(w[1].1.src, Some(a2.addr));
    // Sends from both, same MSN 1: two messages.
    b.recv(1, 0, 100);
    b.recv(2, 100, 100);
    a1.send(2, 0, 10, None, b.addr);
    a2.send(2, 0, 10, None, b.addr);
    let (d1, d2) = (a1.tx(), a2.tx());
    b.rx(a1.addr, &d1[0], now);
    b.rx(a2.addr, &d2[0], now);
    let srcs: Vec<_> = b.wcs().iter().map(|w| w.1.src).collect();
    assert_eq!(srcs, vec![Some(a1.addr), Some(a2.addr)]);
}

#[test]
fn grh_in_front_of_the_payload() {
    let mut a = a();
    let mut b = node([10, 0, 0, 2], 4791, 2, |c| {
        c.grh = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)))
    });
    let data = a.fill(0, 3000, 6);
    b.recv(1, 0, 3040);
    b.recv(2, 4000, 39);
    b.recv(3, 5000, 140);
    a.send(1, 0, 3000, Some(42), b.addr);
    a.send(2, 0, 0, None, b.addr);
    a.send(3, 0, 101, None, b.addr);
    // An IPv4-mapped source is reported as IPv4.
    let from = IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped());
    for s in a.tx() {
        b.qp.handle_datagram(from, a.addr.port, &s, &mut b.mem, Instant::now());
    }
    let w = b.wcs();
    assert_eq!(w.len(), 3);
    let wc = w[0].1;
    assert_eq!((wc.wr_id, wc.byte_len, wc.imm), (1, 3040, Some(42)));
    assert_eq!(wc.src, Some(a.addr));
    let h = b.at(0, 40);
    assert_eq!(h[0] >> 4, 6, "IPVer");
    assert_eq!(&h[1..4], &[0, 0, 0]);
    assert_eq!(u16::from_be_bytes([h[4], h[5]]), 3000, "PayLen");
    assert_eq!((h[6], h[7]), (0x1B, 64));
    assert_eq!(
        &h[8..24],
        &Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped().octets()
    );
    assert_eq!(
        &h[24..40],
        &Ipv4Addr::new(10, 0, 0, 2).to_ipv6_mapped().octets()
    );
    assert_eq!(b.at(40, 3000), &data[..]);
    // 39 octets cannot take the GRH; 140 cannot take 40 + 101.
    assert_eq!((w[1].1.wr_id, w[1].1.status), (2, WcStatus::LocLenErr));
    assert_eq!((w[2].1.wr_id, w[2].1.status), (3, WcStatus::LocLenErr));
    assert_eq!(grh_header(from, from, 1 << 20)[4..6], [0xFF, 0xFF]);
}

#[test]
fn reassembly_table_is_bounded() {
    let mut a = a();
    let mut b = node([10, 0, 0, 2], 4791, 2, |c| c.max_reassembly = 2);
    a.fill(0, 3000, 1);
    for id in 1..=3 {
        b.recv(id, id as usize * 4000, 4000);
        a.send(id, 0, 3000, None, b.addr);
    }
    let d = a.tx();
    let t0 = Instant::now();
    // First segment of each message: the third evicts the first.
    for (i, k) in [0usize, 3, 6].iter().enumerate() {
        b.rx(a.addr, &d[*k], t0 + Duration::from_millis(i as u64));
    }
    assert_eq!(b.qp.stats().rx_evicted, 1);
    assert_eq!(b.qp.in_reassembly(), 2);
    // Message 1's receive went back and message 3 took it.
    for k in [7, 8, 1, 2] {
        b.rx(a.addr, &d[k], t0);
    }
    let w = b.wcs();
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].1.wr_id, w[0].1.byte_len), (1, 3000));
    assert_eq!(b.qp.stats().rx_duplicates, 2);
}

#[test]
fn would_block_keeps_segments_pending() {
    let (mut a, mut b) = (a(), b());
    let data = a.fill(0, 7000, 3);
    b.recv(1, 0, 8000);
    a.send(1, 0, 7000, None, b.addr);
    let mut sink = VecSink {
        budget: Some(2),
        ..VecSink::default()
    };
    assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 2);
    assert!(
        a.wcs().is_empty(),
        "not complete before every datagram left"
    );
    assert!(a.qp.wants_transmit());
    sink.budget = Some(0);
    assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 0);
    sink.budget = None;
    assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 3);
    assert_eq!(a.wcs().len(), 1);
    assert_eq!(sink.out.len(), 5);
    assert!(sink.out.iter().all(|(d, _)| *d == (b.addr.ip, b.addr.port)));
    for (_, s) in &sink.out {
        b.rx(a.addr, s, Instant::now());
    }
    assert_eq!(b.wcs()[0].1.byte_len, 7000);
    assert_eq!(b.at(0, 7000), &data[..]);
    assert_eq!(a.qp.stats().tx_datagrams, 5);
}

#[test]
fn large_batches_span_requests() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 60_000, 3);
    for i in 0..4 {
        b.recv(i, i as usize * 60_000, 60_000);
        a.send(i, 0, 60_000, None, b.addr);
    }
    let d = a.tx();
    assert_eq!(d.len(), 4 * 60_000usize.div_ceil(ROOM_SEND));
    assert_eq!(a.wcs().len(), 4);
    for s in d.iter().rev() {
        b.rx(a.addr, s, Instant::now());
    }
    assert_eq!(b.wcs().len(), 4);
    assert_eq!(b.at(3 * 60_000, 60_000), a.at(0, 60_000));
}

#[test]
fn socket_errors_fail_one_request() {
    let (mut a, b) = (a(), b());
    a.fill(0, 3000, 3);
    a.send(1, 0, 3000, None, b.addr);
    a.send(2, 0, 10, None, b.addr);
    let mut sink = VecSink {
        fail_next: Some(io::ErrorKind::ConnectionRefused),
        ..VecSink::default()
    };
    assert!(a.qp.poll_transmit(&a.mem, &mut sink).is_err());
    assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 1);
    let w = a.wcs();
    assert_eq!((w[0].1.wr_id, w[0].1.status), (1, WcStatus::GeneralErr));
    assert_eq!((w[1].1.wr_id, w[1].1.status), (2, WcStatus::Success));
    assert_eq!(a.qp.stats().tx_errors, 1);
}

#[test]
fn bad_gather_list_is_loc_prot_err() {
    let (mut a, b) = (a(), b());
    a.fill(0, 10, 3);
    let mut wr = a.wr(
        1,
        SendOp::Send {
            imm: None,
            invalidate: None,
        },
        0,
        10,
    );
    wr.payload = Payload::Sgl(SgList::single(BASE, 10, a.buf ^ 0x80));
    wr.flags.signaled = false;
    a.qp.post_send(wr, b.addr).unwrap();
    a.send(2, 0, 10, None, b.addr);
    // Inline data needs no memory.
    let mut wr = a.wr(
        3,
        SendOp::Send {
            imm: None,
            invalidate: None,
        },
        0,
        0,
    );
    wr.payload = Payload::Inline(InlineData::new(b"inline!").unwrap());
    a.qp.post_send(wr, b.addr).unwrap();
    let d = a.tx();
    assert_eq!(d.len(), 2);
    assert_eq!(&d[1][22..29], b"inline!");
    let w = a.wcs();
    assert_eq!((w[0].1.wr_id, w[0].1.status), (1, WcStatus::LocProtErr));
    assert_eq!((w[1].1.wr_id, w[1].1.status), (2, WcStatus::Success));
    assert_eq!((w[2].1.wr_id, w[2].1.byte_len), (3, 7));
}

#[test]
fn bad_receive_buffer_is_loc_prot_err() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 10, 3);
    let sgl = SgList::single(BASE, 100, b.buf ^ 0x80);
    b.qp.post_recv(RecvWr { wr_id: 1, sgl }).unwrap();
    a.send(1, 0, 10, None, b.addr);
    b.rx(a.addr, &a.tx()[0], Instant::now());
    assert_eq!(b.wcs()[0].1.status, WcStatus::LocProtErr);
    assert_eq!(b.qp.stats().rx_prot_err, 1);
}

#[test]
fn post_send_refusals() {
    let (mut a, b) = (a(), b());
    let refused = |a: &mut Node, op: SendOp| {
        let wr = a.wr(1, op, 0, 8);
        a.qp.post_send(wr, b.addr)
    };
    use PostError::{Invalid, Unsupported};
    let cases = [
        SendOp::Send {
            imm: None,
            invalidate: Some(1),
        },
        SendOp::Write {
            remote_addr: 0,
            rkey: 1,
            imm: Some(1),
        },
        SendOp::Read {
            remote_addr: 0,
            rkey: 1,
        },
        SendOp::FetchAdd {
            remote_addr: 0,
            rkey: 1,
            add: 1,
        },
        SendOp::CompareSwap {
            remote_addr: 0,
            rkey: 1,
            compare: 0,
            swap: 1,
        },
        SendOp::LocalInvalidate { stag: 1 },
    ];
    for op in cases {
        assert_eq!(refused(&mut a, op), Err(Unsupported), "{op:?}");
    }
    let send = SendOp::Send {
        imm: None,
        invalidate: None,
    };
    let wr = a.wr(1, send, 0, (64 << 10) + 1);
    assert_eq!(a.qp.post_send(wr, b.addr), Err(Invalid));
    let wr = a.wr(1, send, 0, 1);
    let far = DgramAddr {
        qpn: 1 << 24,
        ..b.addr
    };
    assert_eq!(a.qp.post_send(wr, far), Err(Invalid));
    let mut c = node([1, 1, 1, 1], 1, 1, |c| c.sq_depth = 1);
    let wr = c.wr(1, send, 0, 1);
    assert_eq!(c.qp.post_send(wr, b.addr), Ok(()));
    assert_eq!(c.qp.post_send(wr, b.addr), Err(PostError::QueueFull));
    assert!(a.tx().is_empty());
}

#[test]
fn dqpn_peek() {
    let mut out = [0u8; 128];
    for (tagged, x) in [(false, false), (true, false), (true, true)] {
        let mut repr = if tagged {
            SegmentRepr::tagged(Opcode::RdmaWrite, 1, 2, true)
        } else {
            SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None)
        };
        if x {
            repr.ddp = DdpHeader::Tagged {
                stag: 1,
                to: 2,
                ext: Some(TaggedExt { msn: 3, mo: 4 }),
            };
        }
        let n = datagram::emit_into(&repr, b"p", &mut out);
        assert_eq!(dqpn_of(&out[..n]), None);
        repr.dqpn = Some(0xAB12_3456);
        let n = datagram::emit_into(&repr, &[], &mut out);
        assert_eq!(dqpn_of(&out[..n]), Some(0x12_3456));
        assert_eq!(dqpn_of(&out[..n - 1]), None, "no room for the CRC");
        let mut v = out[..n].to_vec();
        v[0] = (v[0] & !0x03) | 2;
        assert_eq!(dqpn_of(&v), None, "DV 2");
    }
    assert_eq!(dqpn_of(&[]), None);
}

#[test]
fn source_window_marks_slides_and_restarts() {
    let addr = DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 1,
        qpn: 1,
    };
    let mut w = SrcWin {
        addr,
        highest: u32::MAX - 2,
        bits: [0; WIN_WORDS],
        used: 0,
    };
    w.mark(u32::MAX - 2);
    assert!(w.is_done(u32::MAX - 2));
    assert!(!w.is_done(u32::MAX - 1));
    w.mark(1); // across the wrap
    assert!(w.is_done(1) && w.is_done(u32::MAX - 2));
    assert!(!w.is_done(0) && !w.is_done(u32::MAX));
    w.mark(0);
    assert!(w.is_done(0));
    // Slide: the bit for an MSN that left the window is cleared.
    w.mark(1 + DEDUP_WINDOW - 1);
    assert!(w.is_done(1) && !w.is_done(u32::MAX - 2));
    w.mark(1 + DEDUP_WINDOW);
    assert!(!w.is_done(1), "left the window");
    assert!(!w.is_done(1 + DEDUP_WINDOW + 1));
    // Within the window behind: just marked.
    w.mark(5);
    assert_eq!(w.highest, 1 + DEDUP_WINDOW);
    // Far behind: a restarted sender.
    w.mark(u32::MAX - 10);
    assert!(w.is_done(u32::MAX - 10));
    assert!(!w.is_done(1 + DEDUP_WINDOW) && !w.is_done(5));
    assert_eq!(w.highest, u32::MAX - 10);
}

#[test]
fn sources_are_bounded_lru() {
    let mut a = a();
    let mut b = node([10, 0, 0, 2], 4791, 2, |c| c.max_sources = 2);
    a.fill(0, 10, 1);
    b.recv(1, 0, 100);
    a.send(1, 0, 10, None, b.addr);
    let d = a.tx().remove(0);
    let now = Instant::now();
    b.rx(a.addr, &d, now);
    b.rx(a.addr, &d, now);
    assert_eq!(b.qp.stats().rx_duplicates, 1);
    // Two more sources push the first out; its duplicate is new again.
    for port in [1, 2] {
        let mut c = node([10, 0, 0, 9], port, 1, |_| {});
        c.fill(0, 1, 1);
        b.recv(9, 200, 100);
        c.send(1, 0, 1, None, b.addr);
        b.rx(c.addr, &c.tx()[0], now);
    }
    b.recv(2, 0, 100);
    b.rx(a.addr, &d, now);
    assert_eq!(b.qp.stats().rx_delivered, 4);
    assert_eq!(b.qp.sources.len(), 2);
}

#[test]
fn frags_merge_and_bound() {
    let mut f = Frags::EMPTY;
    f.add(10, 20);
    f.add(30, 40);
    assert!(f.covers(12, 18) && !f.covers(15, 35) && f.covers(5, 5));
    f.add(20, 30);
    assert_eq!(f.as_slice(), &[(10, 40)]);
    f.add(0, 10);
    assert!(f.complete(40) && !f.complete(41));
    let mut f = Frags::EMPTY;
    for i in 0..MAX_REASM_FRAGMENTS as u32 {
        assert!(f.can_add(i * 10, i * 10 + 5));
        f.add(i * 10, i * 10 + 5);
    }
    assert!(!f.can_add(1000, 1001));
    assert!(f.can_add(5, 10), "fills a gap");
    f.add(5, 10);
    assert_eq!(f.n, MAX_REASM_FRAGMENTS - 1);
    assert!(Frags::EMPTY.complete(0));
}

#[test]
fn fragment_bound_drops_segments_not_messages() {
    let mut a = a();
    let mut b = node([10, 0, 0, 2], 4791, 2, |_| {});
    let data = a.fill(0, 200 * 100, 1);
    // A 200-octet MTU budget makes small segments.
    let mut a2 = node([10, 0, 0, 1], 4791, 1, |c| c.mtu = 28 + 22 + 4 + 100);
    a2.mem = a.mem.clone();
    a2.buf = a.buf;
    b.recv(1, 0, 20_000);
    a2.send(1, 0, 20_000, None, b.addr);
    let d = a2.tx();
    assert_eq!(d.len(), 200);
    let now = Instant::now();
    // Every other segment: 33rd disjoint range is refused.
    for s in d.iter().step_by(2).take(MAX_REASM_FRAGMENTS + 1) {
        b.rx(a.addr, s, now);
    }
    assert_eq!(b.qp.stats().rx_fragment_overflow, 1);
    for s in &d {
        b.rx(a.addr, s, now);
    }
    let w = b.wcs();
    assert_eq!(w.len(), 1);
    assert_eq!(b.at(0, 20_000), &data[..]);
}

#[test]
fn inconsistent_segments_are_ignored() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 3000, 1);
    b.recv(1, 0, 10_000);
    a.send(1, 0, 3000, None, b.addr);
    let d = a.tx();
    let now = Instant::now();
    b.rx(a.addr, &d[1], now);
    b.rx(a.addr, &d[2], now);
    // An L segment that ends elsewhere: the middle one with L set.
    let mut x = d[1].clone();
    x[0] |= 0x40;
    fix_crc(&mut x);
    b.rx(a.addr, &x, now);
    // An Immediate Data L segment after a Send L segment.
    let mut repr = SegmentRepr::untagged(
        Opcode::ImmediateData,
        0,
        1,
        3000,
        true,
        RdmapBody::Immediate(9),
    );
    set_rsvd_ulp(&mut repr, a.addr.qpn);
    repr.dqpn = Some(b.addr.qpn);
    let mut out = [0u8; 64];
    let n = datagram::emit_into(&repr, &[], &mut out);
    b.rx(a.addr, &out[..n], now);
    // A segment past the known end.
    let mut y = d[0].clone();
    y[14..18].copy_from_slice(&3000u32.to_be_bytes());
    fix_crc(&mut y);
    b.rx(a.addr, &y, now);
    assert_eq!(b.qp.stats().rx_inconsistent, 3);
    b.rx(a.addr, &d[0], now);
    let w = b.wcs();
    assert_eq!((w[0].1.byte_len, w[0].1.imm), (3000, None));
}
