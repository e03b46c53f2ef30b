//! Unit tests of the UD queue pair: two nodes over a vector "network";
//! helpers here, the tests of each part in its own file.

use super::*;
use crate::dgram::STAGE_MAX_DGRAM;
use crate::memory::MemError;
use crate::memory::{Access, VecMemory};
use crate::rc::SIGNALED;
use crate::wr::{InlineData, SendFlags};
use crate::wr::{SgList, Sge};
use std::net::{Ipv4Addr, Ipv6Addr};

mod record;
mod rx;
mod tx;

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
