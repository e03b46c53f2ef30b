use super::*;
use std::net::{IpAddr, Ipv4Addr};

fn addr(q: u32) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: (q >> 8) as u16,
        qpn: q,
    }
}

#[test]
fn message_round_trip_and_garbage() {
    let m = Message {
        kind: MsgKind::Reject,
        reason: Some(RejectReason::Busy),
        port: 7,
        dct: 0x12_3456,
        conn: 9,
        key: 0xdead,
        cookie: 5,
    };
    assert_eq!(Message::decode(&m.encode()), Ok(m));
    assert_eq!(Message::decode(&[0; 3]), Err(DecodeError::Length(3)));
    assert_eq!(Message::decode(&[0; MSG_LEN]), Err(DecodeError::Magic));
    let mut b = m.encode();
    b[4] = 9;
    assert_eq!(Message::decode(&b), Err(DecodeError::Kind(9)));
}

#[test]
fn wrong_key_rejected_and_counted() {
    let t0 = Instant::now();
    let mut ini = DcTable::new(DcConfig {
        direct_connect: false,
        ..DcConfig::default()
    });
    let mut tgt = DcTable::new(DcConfig::default());
    tgt.add_dct(0x100, 42);
    let target = DcTarget {
        addr: addr(0x100),
        key: 41,
        local: 0,
    };
    let (id, new) = ini.post(t0, target);
    assert!(new);
    let tx = ini.poll_transmit().unwrap();
    tgt.handle_message(t0, addr(0x200), 0x100, &tx.msg.encode());
    assert_eq!(tgt.stats().rejected_bad_key, 1);
    assert_eq!(tgt.live(), 0);
    assert!(matches!(
        tgt.poll_event(),
        Some(DcEvent::KeyRejected { dct: 0x100, .. })
    ));
    let rep = tgt.poll_transmit().unwrap();
    ini.handle_message(t0, addr(0x100), 0x200, &rep.msg.encode());
    assert_eq!(
        ini.poll_event(),
        Some(DcEvent::Failed {
            id,
            target,
            reason: FailReason::Rejected(RejectReason::BadKey)
        })
    );
    assert_eq!(ini.live(), 0);
}

#[test]
fn lru_idle_eviction_only() {
    let t0 = Instant::now();
    let mut ini = DcTable::new(DcConfig {
        capacity: 2,
        direct_connect: false,
        ..DcConfig::default()
    });
    let mut ids = Vec::new();
    for q in 1..=2u32 {
        let t = DcTarget {
            addr: addr(q << 8),
            key: 1,
            local: 0,
        };
        let (id, _) = ini.post(t0, t);
        let inv = ini.poll_transmit().unwrap();
        let acc = Message {
            kind: MsgKind::Accept,
            reason: None,
            port: 1,
            dct: q << 8,
            conn: inv.msg.conn,
            key: 0,
            cookie: 3,
        };
        ini.handle_message(t0, addr(q << 8), 9, &acc.encode());
        assert!(matches!(ini.poll_event(), Some(DcEvent::Connect { .. })));
        ini.connected(id, t0);
        ids.push(id);
    }
    // Both busy: a third target waits.
    let t3 = DcTarget {
        addr: addr(3 << 8),
        key: 1,
        local: 0,
    };
    let (id3, _) = ini.post(t0, t3);
    assert_eq!(ini.waiting(), 1);
    assert!(ini.poll_transmit().is_none());
    // The second becomes idle: it is evicted, the third invites.
    ini.completed(ids[1], t0);
    assert_eq!(ini.poll_event(), Some(DcEvent::Teardown { id: ids[1] }));
    assert_eq!(ini.poll_transmit().unwrap().msg.conn, id3.0);
    assert_eq!(ini.live(), 2);
    assert!(ini.is_live(ids[0]));
}

/// Direct attempt that connects: no Invite is ever sent, one slot on
/// each side; a failed attempt sends the Invite at once; a wrong key
/// is refused by the direct path without being counted, and counted
/// once when the Invite is rejected.
#[test]
fn direct_connect_paths() {
    let t0 = Instant::now();
    let mut ini = DcTable::new(DcConfig::default());
    let mut tgt = DcTable::new(DcConfig::default());
    tgt.set_listen_port(4791);
    tgt.add_dct(0x100, 42);
    // Accepts for it name its own port (where direct attempts go).
    tgt.set_dct_listen_port(0x100, 1);
    let src = addr(0x200);
    let target = DcTarget {
        addr: addr(0x100),
        key: 42,
        local: 0,
    };
    // 1: the attempt wins.
    let (id, _) = ini.post(t0, target);
    assert!(
        ini.poll_transmit().is_none(),
        "Invite before the grace period"
    );
    assert_eq!(
        ini.poll_event(),
        Some(DcEvent::ConnectDirect {
            id,
            target,
            port: 1
        })
    );
    assert!(tgt.target_direct(t0, src, 0x100, 42, id.0).is_some());
    assert_eq!(tgt.live(), 1);
    ini.connected(id, t0);
    assert!(ini.is_live(id));
    ini.handle_timeout(t0 + Duration::from_millis(50));
    assert!(ini.poll_transmit().is_none(), "Invite after connecting");
    assert_eq!(ini.stats().invites, 0);
    assert_eq!(ini.stats().direct_connected, 1);
    // A late duplicate Invite for it takes no slot and gets no answer.
    let inv = Message {
        kind: MsgKind::Invite,
        reason: None,
        port: 0,
        dct: 0x100,
        conn: id.0,
        key: 42,
        cookie: 0,
    };
    tgt.handle_message(t0, src, 0x100, &inv.encode());
    assert_eq!(tgt.live(), 1);
    assert!(tgt.poll_transmit().is_none());

    // 2: a wrong key: the attempt is refused (not counted as a key
    // rejection), the Invite goes at once and is rejected, counted.
    let bad = DcTarget {
        addr: addr(0x101),
        key: 7,
        local: 0,
    };
    tgt.add_dct(0x101, 8);
    let (id2, _) = ini.post(t0, bad);
    assert!(matches!(
        ini.poll_event(),
        Some(DcEvent::ConnectDirect { .. })
    ));
    assert!(tgt.target_direct(t0, src, 0x101, 7, id2.0).is_none());
    assert_eq!(tgt.stats().direct_refused, 1);
    assert_eq!(tgt.stats().rejected_bad_key, 0);
    ini.direct_failed(id2, t0);
    let tx = ini
        .poll_transmit()
        .expect("Invite after the failed attempt");
    assert_eq!(tx.msg.kind, MsgKind::Invite);
    tgt.handle_message(t0, src, 0x101, &tx.msg.encode());
    assert_eq!(tgt.stats().rejected_bad_key, 1);
    let rep = tgt.poll_transmit().expect("Reject");
    ini.handle_message(t0, addr(0x101), 0x200, &rep.msg.encode());
    assert!(matches!(
        ini.poll_event(),
        Some(DcEvent::Failed {
            reason: FailReason::Rejected(RejectReason::BadKey),
            ..
        })
    ));

    // 3: the Invite comes first (grace period over), then the attempt
    // takes the slot the Invite reserved: still one slot.
    let t3 = DcTarget {
        addr: addr(0x100),
        key: 42,
        local: 9,
    };
    let (id3, _) = ini.post(t0, t3);
    assert!(matches!(
        ini.poll_event(),
        Some(DcEvent::ConnectDirect { .. })
    ));
    let t1 = t0 + Duration::from_millis(3);
    ini.handle_timeout(t1);
    let tx = ini.poll_transmit().expect("Invite after the grace period");
    tgt.handle_message(t1, src, 0x100, &tx.msg.encode());
    assert_eq!(tgt.live(), 2);
    let acc = tgt.poll_transmit().expect("Accept");
    assert_eq!(acc.msg.kind, MsgKind::Accept);
    ini.handle_message(t1, addr(0x100), 0x200, &acc.msg.encode());
    assert!(ini.poll_event().is_none(), "waits for the direct attempt");
    assert!(tgt.target_direct(t1, src, 0x100, 42, id3.0).is_some());
    assert_eq!(tgt.live(), 2);
    ini.connected(id3, t1);
    assert!(ini.is_live(id3));
    assert_eq!(tgt.stats().direct_accepts, 2);
}

/// Reverse use, deterministic: A opens a connection to B offering its
/// DCT; B's work for that DCT binds over it (Bind, key checked, A
/// binds, BindAccept); a wrong key is refused and counted once and
/// fails that work as the invitation would (no Invite follows); A's
/// idle close goes through Unbind/Unbound; an old-format offer
/// (none) means no Bind.
#[test]
fn reverse_bind_paths() {
    let t0 = Instant::now();
    let cfg = DcConfig {
        direct_connect: true,
        ..DcConfig::default()
    };
    let (a_ctl, b_ctl) = (addr(0x5000), addr(0x7000));
    let (a_dct, b_dct) = (0x6001u32, 0x8001u32);
    let mut a = DcTable::new(cfg);
    let mut b = DcTable::new(DcConfig { seed: 99, ..cfg });
    a.add_dct(a_dct, 11);
    b.add_dct(b_dct, 22);
    // A → B's DCT, direct, with the offer.
    let to_b = DcTarget {
        addr: addr(b_dct),
        key: 22,
        local: 3,
    };
    let (ia, _) = a.post(t0, to_b);
    assert!(matches!(
        a.poll_event(),
        Some(DcEvent::ConnectDirect { .. })
    ));
    let offer = a.offer(ia, &[a_dct]).expect("offer");
    let mut pd = Vec::new();
    offer.encode(&mut pd);
    assert_eq!(ReverseOffer::decode(&pd), Some(offer.clone()));
    assert_eq!(ReverseOffer::decode(&[]), None, "old format: no offer");
    assert_eq!(ReverseOffer::decode(&pd[..pd.len() - 1]), None);
    let tb = b
        .target_direct(t0, a_ctl, b_dct, 22, ia.0)
        .expect("accepted");
    b.accept_offer(tb, ReverseOffer::decode(&pd).unwrap(), 3);
    a.connected(ia, t0);
    a.completed(ia, t0);
    // B → A's DCT with a wrong key: Bind, refused, counted once.
    let bad = DcTarget {
        addr: addr(a_dct),
        key: 10,
        local: 3,
    };
    let (rb, new) = b.post(t0, bad);
    assert!(new);
    let tx = b.poll_transmit().expect("Bind");
    assert_eq!((tx.msg.kind, tx.msg.cookie), (MsgKind::Bind, offer.nonce));
    a.handle_message(t0, b_ctl, a_dct, &tx.msg.encode());
    assert_eq!(a.stats().rejected_bad_key, 1);
    assert!(matches!(a.poll_event(), Some(DcEvent::KeyRejected { .. })));
    let rep = a.poll_transmit().expect("BindReject");
    assert_eq!(rep.msg.kind, MsgKind::BindReject);
    b.handle_message(t0, addr(a_dct), 0x7000, &rep.msg.encode());
    assert_eq!(
        b.poll_event(),
        Some(DcEvent::Failed {
            id: rb,
            target: bad,
            reason: FailReason::Rejected(RejectReason::BadKey)
        })
    );
    assert!(b.poll_transmit().is_none(), "no Invite after a bad key");
    // The right key: bound, A's receive side first.
    let good = DcTarget { key: 11, ..bad };
    let (rg, _) = b.post(t0, good);
    let tx = b.poll_transmit().expect("Bind");
    // Duplicated on the way: answered twice, bound once.
    a.handle_message(t0, b_ctl, a_dct, &tx.msg.encode());
    a.handle_message(t0, b_ctl, a_dct, &tx.msg.encode());
    assert_eq!(
        a.poll_event(),
        Some(DcEvent::BindReceive { id: ia, dct: a_dct })
    );
    assert!(a.poll_event().is_none());
    assert_eq!(a.stats().duplicate_binds, 1);
    let acc = a.poll_transmit().expect("BindAccept");
    assert_eq!(acc.msg.kind, MsgKind::BindAccept);
    b.handle_message(t0, addr(a_dct), 0x7000, &acc.msg.encode());
    assert_eq!(b.poll_event(), Some(DcEvent::Bound { id: rg, via: tb }));
    let dup = a.poll_transmit().expect("second BindAccept");
    b.handle_message(t0, addr(a_dct), 0x7000, &dup.msg.encode());
    assert!(b.poll_event().is_none());
    assert_eq!(b.bound_via(rg), Some(tb));
    assert_eq!((a.live(), b.live()), (1, 1), "one slot each side");
    // B has work in flight; A goes idle: Unbind, no close yet.
    let t1 = t0 + Duration::from_secs(3);
    a.handle_timeout(t1);
    let ub = a.poll_transmit().expect("Unbind");
    assert_eq!(ub.msg.kind, MsgKind::Unbind);
    assert!(a.poll_event().is_none(), "closed before the Unbound");
    b.handle_message(t1, a_ctl, b_dct, &ub.msg.encode());
    assert!(b.poll_event().is_none(), "answered with work in flight");
    // New work for A's DCT goes elsewhere (normal path).
    let (other, new) = b.post(t1, good);
    assert!(new && other != rg);
    assert!(matches!(
        b.poll_event(),
        Some(DcEvent::ConnectDirect { id, .. }) if id == other
    ));
    b.completed(rg, t1);
    assert_eq!(b.poll_event(), Some(DcEvent::Unbound { id: rg }));
    assert_eq!(b.poll_event(), Some(DcEvent::Drained { id: tb }));
    b.unbound_ready(tb);
    let ud = loop {
        let tx = b.poll_transmit().expect("Unbound");
        if tx.msg.kind == MsgKind::Unbound {
            break tx;
        }
    };
    a.handle_message(t1, addr(b_dct), 0x5000, &ud.msg.encode());
    assert_eq!(a.poll_event(), Some(DcEvent::Teardown { id: ia }));
    assert_eq!(a.live(), 0);
}

/// A connection that needs an eviction for its slot makes no direct
/// attempt: its Invite goes at once.
#[test]
fn no_direct_attempt_after_eviction() {
    let t0 = Instant::now();
    let mut ini = DcTable::new(DcConfig {
        capacity: 1,
        ..DcConfig::default()
    });
    let first = DcTarget {
        addr: addr(0x100),
        key: 1,
        local: 0,
    };
    let (a, _) = ini.post(t0, first);
    assert!(matches!(
        ini.poll_event(),
        Some(DcEvent::ConnectDirect { .. })
    ));
    ini.connected(a, t0);
    ini.completed(a, t0);
    let second = DcTarget {
        addr: addr(0x200),
        key: 1,
        local: 0,
    };
    let (b, _) = ini.post(t0, second);
    assert_eq!(ini.poll_event(), Some(DcEvent::Teardown { id: a }));
    assert!(
        ini.poll_event().is_none(),
        "a direct attempt after eviction"
    );
    let tx = ini.poll_transmit().expect("Invite at once");
    assert_eq!((tx.msg.kind, tx.msg.conn), (MsgKind::Invite, b.0));
}
