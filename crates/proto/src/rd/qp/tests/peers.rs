//! RD peers over time: new sender sessions, segments from the middle of
//! a message, retransmission, silent, expired and lost peers.

use super::*;

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
