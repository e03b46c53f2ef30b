//! UD receive: loss, duplicates, receive-queue accounting, malformed
//! input, RDMA Write placement, access violations, the reassembly and
//! duplicate-window bounds.

use super::*;

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
