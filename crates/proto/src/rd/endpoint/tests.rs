use super::timers::QUEUE_FLOOR;
use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct P(u32);
impl PeerKey for P {
    fn qpn(&self) -> u32 {
        self.0
    }
}

const A: P = P(0x100);
const B: P = P(0x200);

fn cfg(local: u32) -> RdConfig {
    RdConfig {
        local_qpn: local,
        epoch_seed: local * 1000,
        ..RdConfig::default()
    }
}

fn ep(local: u32) -> RdEndpoint<P, u32> {
    RdEndpoint::new(cfg(local)).unwrap()
}

fn drain(e: &mut RdEndpoint<P, u32>, now: Instant) -> Vec<Transmit<P, u32>> {
    std::iter::from_fn(|| e.poll_transmit(now)).collect()
}

fn events(e: &mut RdEndpoint<P, u32>) -> Vec<Event<P, u32>> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

#[test]
fn config_rules() {
    let d = RdConfig::default();
    assert!(d.validate().is_ok());
    assert_eq!(d.give_up_span(), d.rto_max * (d.retry_limit + 1));
    let c = RdConfig {
        idle_timeout: Duration::from_secs(5),
        ..d
    };
    assert!(c.validate().is_err());
    let c = RdConfig {
        ack_delay: d.rto_min,
        ..d
    };
    assert!(c.validate().is_err());
    let c = RdConfig {
        local_qpn: MAX_QPN + 1,
        ..d
    };
    assert!(RdEndpoint::<P, u32>::new(c).is_err());
}

#[test]
fn send_ack_piggyback_and_delayed_ack() {
    let t0 = Instant::now();
    let (mut a, mut b) = (ep(A.0), ep(B.0));
    a.send(B, 1, t0).unwrap();
    a.send(B, 2, t0).unwrap();
    let tx = drain(&mut a, t0);
    assert_eq!(tx.len(), 2);
    let d0 = tx[0].shim.data.unwrap();
    assert!(d0.syn);
    assert_eq!((d0.psn, tx[1].shim.data.unwrap().psn), (0, 1));
    assert_eq!((tx[0].shim.src_qpn, tx[0].shim.dst_qpn), (A.0, B.0));
    assert!(!tx[0].shim.poll && tx[1].shim.poll, "P on the tail");
    assert_eq!(tx[0].shim.feedback, Feedback::None);
    assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Deliver);
    assert_eq!(
        events(&mut b),
        [Event::SessionStarted {
            peer: A,
            replaced: false
        }]
    );
    // No ACK yet: delayed.
    assert!(drain(&mut b, t0).is_empty());
    assert_eq!(b.poll_timeout(), Some(t0 + cfg(0).ack_delay));
    // B has data for A: the ACK rides on it.
    b.send(A, 7, t0).unwrap();
    let back = drain(&mut b, t0);
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].token, Some(7));
    assert_eq!(
        back[0].shim.feedback,
        Feedback::Ack {
            epoch: d0.epoch,
            psn: 1,
            nak: false
        }
    );
    assert_eq!(a.handle_datagram(B, &back[0].shim, t0), Verdict::Deliver);
    let ev = events(&mut a);
    assert!(ev.contains(&Event::Acked { peer: B, token: 1 }));
    assert_eq!(a.unacked(&B), 1);
    // The second datagram had P: B acks at once (ACK-only).
    assert_eq!(b.handle_datagram(A, &tx[1].shim, t0), Verdict::Deliver);
    let ack = drain(&mut b, t0);
    assert_eq!(ack.len(), 1);
    assert_eq!(ack[0].token, None);
    a.handle_datagram(B, &ack[0].shim, t0);
    assert_eq!(events(&mut a), [Event::Acked { peer: B, token: 2 }]);
    assert_eq!(a.unacked(&B), 0);
    // A's next data datagram is no longer SYN and carries A's ACK of 7.
    a.send(B, 3, t0).unwrap();
    let tx = drain(&mut a, t0);
    let s = tx.iter().find(|t| t.token == Some(3)).unwrap().shim;
    assert!(!s.data.unwrap().syn);
    assert!(matches!(s.feedback, Feedback::Ack { psn: 1, .. }));
}

#[test]
fn duplicate_and_out_of_order() {
    let t0 = Instant::now();
    let (mut a, mut b) = (ep(A.0), ep(B.0));
    for i in 0..4 {
        a.send(B, i, t0).unwrap();
    }
    let tx = drain(&mut a, t0);
    assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Deliver);
    assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Duplicate);
    assert_eq!(
        b.handle_datagram(A, &tx[2].shim, t0),
        Verdict::Drop(DropReason::OutOfOrder)
    );
    assert_eq!(
        b.handle_datagram(A, &tx[3].shim, t0),
        Verdict::Drop(DropReason::OutOfOrder)
    );
    let fb = drain(&mut b, t0);
    assert_eq!(fb.len(), 1, "one NAK per gap");
    assert_eq!(
        fb[0].shim.feedback,
        Feedback::Ack {
            epoch: tx[0].shim.data.unwrap().epoch,
            psn: 1,
            nak: true
        }
    );
    // The NAK rewinds A to PSN 1: 1, 2, 3 again, once.
    a.handle_datagram(B, &fb[0].shim, t0);
    a.handle_datagram(B, &fb[0].shim, t0);
    let re = drain(&mut a, t0);
    let psns: Vec<u32> = re
        .iter()
        .filter_map(|t| t.shim.data.map(|d| d.psn))
        .collect();
    assert_eq!(psns, [1, 2, 3]);
    assert!(re.iter().all(|t| t.retransmission));
    assert_eq!(a.stats().fast_retransmits, 1);
    for t in &re {
        assert_eq!(b.handle_datagram(A, &t.shim, t0), Verdict::Deliver);
    }
}

#[test]
fn window_limits_unacked() {
    let t0 = Instant::now();
    let mut c = cfg(A.0);
    c.tx_window = 3;
    let mut a: RdEndpoint<P, u32> = RdEndpoint::new(c).unwrap();
    for i in 0..10 {
        a.send(B, i, t0).unwrap();
    }
    let tx = drain(&mut a, t0);
    assert_eq!(tx.len(), 3);
    assert!(tx[2].shim.poll, "P when the window fills");
    assert_eq!(a.unacked(&B), 3);
    // The peer's advertised window is the tighter limit.
    let mut ack = RdShimRepr::control(B.0, A.0, 1);
    ack.feedback = Feedback::Ack {
        epoch: tx[0].shim.data.unwrap().epoch,
        psn: 3,
        nak: false,
    };
    a.handle_datagram(B, &ack, t0);
    assert_eq!(drain(&mut a, t0).len(), 1);
    assert_eq!(a.unacked(&B), 1);
}

#[test]
fn zero_window_probe_and_reopen() {
    let t0 = Instant::now();
    let (mut a, mut b) = (ep(A.0), ep(B.0));
    // A stateless probe answer carries the window too.
    let mut probe = RdShimRepr::control(A.0, B.0, 64);
    probe.poll = true;
    assert_eq!(b.handle_datagram(P(0x999), &probe, t0), Verdict::Control);
    assert_eq!(drain(&mut b, t0).len(), 1);
    // B delivers one token, then closes its window; its ACK says 0.
    a.send(B, 0, t0).unwrap();
    let tx = drain(&mut a, t0);
    assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Deliver);
    b.set_rx_window(0);
    let ack = drain(&mut b, t0);
    assert_eq!(ack[0].shim.window, 0);
    a.handle_datagram(B, &ack[0].shim, t0);
    a.send(B, 1, t0).unwrap();
    assert!(drain(&mut a, t0).is_empty(), "window 0: nothing sent");
    // The retransmission timer probes.
    let t1 = a.poll_timeout().unwrap();
    a.handle_timeout(t1);
    let p = drain(&mut a, t1);
    assert_eq!(p.len(), 1);
    assert!(p[0].shim.poll && p[0].token.is_none());
    // B answers (still 0): A keeps waiting without failing.
    assert_eq!(b.handle_datagram(A, &p[0].shim, t1), Verdict::Control);
    let ans = drain(&mut b, t1);
    assert_eq!(ans.len(), 1);
    a.handle_datagram(B, &ans[0].shim, t1);
    assert!(drain(&mut a, t1).is_empty());
    // B reopens: a window update goes to A at once, and A sends.
    b.set_rx_window(8);
    let upd = drain(&mut b, t1);
    assert_eq!(upd.len(), 1);
    assert_eq!(upd[0].shim.window, 8);
    a.handle_datagram(B, &upd[0].shim, t1);
    let d = drain(&mut a, t1);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].token, Some(1));
}

#[test]
fn rto_backoff_then_failure_of_one_peer() {
    let t0 = Instant::now();
    let mut a = ep(A.0);
    let c = *a.config();
    a.send(B, 1, t0).unwrap();
    a.send(B, 2, t0).unwrap();
    a.send(P(0x300), 9, t0).unwrap();
    assert_eq!(drain(&mut a, t0).len(), 3);
    let mut now = t0;
    let mut gaps = Vec::new();
    let mut sent_b = 0;
    for _ in 0..=c.retry_limit {
        let t = a.poll_timeout().unwrap();
        gaps.push(t - now);
        now = t;
        a.handle_timeout(now);
        sent_b += drain(&mut a, now).iter().filter(|t| t.peer == B).count();
    }
    // Exponential backoff, capped.
    assert_eq!(gaps[0], c.rto_initial);
    assert_eq!(gaps[1], c.rto_initial * 2);
    assert!(gaps.iter().all(|g| *g <= c.rto_max));
    assert_eq!(sent_b, 2 * c.retry_limit as usize);
    let ev = events(&mut a);
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(e, Event::PeerFailed { .. }))
            .count(),
        2
    );
    assert!(ev.contains(&Event::PeerFailed {
        peer: B,
        abandoned: 2
    }));
    let ab: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Abandoned { peer: B, token } => Some(*token),
            _ => None,
        })
        .collect();
    assert_eq!(ab, [1, 2]);
    // A new token starts a new session.
    let old = a.stats().tx_sessions;
    a.send(B, 3, now).unwrap();
    assert_eq!(a.stats().tx_sessions, old + 1);
    assert!(drain(&mut a, now)[0].shim.data.unwrap().syn);
}

#[test]
fn expiry_removes_quiescent_peers() {
    let t0 = Instant::now();
    let (mut a, mut b) = (ep(A.0), ep(B.0));
    a.send(B, 1, t0).unwrap();
    let tx = drain(&mut a, t0);
    b.handle_datagram(A, &tx[0].shim, t0);
    let ack = drain(&mut b, t0);
    a.handle_datagram(B, &ack[0].shim, t0);
    assert_eq!((a.peer_count(), b.peer_count()), (1, 1));
    let idle = a.config().idle_timeout;
    a.handle_timeout(t0 + idle);
    b.handle_timeout(t0 + idle);
    assert_eq!((a.peer_count(), b.peer_count()), (0, 0));
    assert!(events(&mut a).contains(&Event::PeerExpired { peer: B }));
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn memory_follows_the_peers_after_mass_expiry() {
    const N: u32 = 5000;
    let t0 = Instant::now();
    let mut b = ep(B.0);
    for i in 0..N {
        let mut c = ep(0x1000 + i);
        c.send(B, i, t0).unwrap();
        for t in drain(&mut c, t0) {
            b.handle_datagram(P(0x1000 + i), &t.shim, t0);
        }
    }
    assert_eq!(b.peer_count(), N as usize);
    assert_eq!(drain(&mut b, t0).len(), N as usize, "one ACK each");
    events(&mut b);
    let mut now = t0;
    while let Some(d) = b.poll_timeout() {
        now = now.max(d);
        b.handle_timeout(now);
        drain(&mut b, now);
        events(&mut b);
    }
    assert_eq!(b.peer_count(), 0);
    assert_eq!(b.stats().peers_expired, u64::from(N));
    // Nothing sized for the peak remains.
    assert!(b.peers.capacity() <= 64, "peers {}", b.peers.capacity());
    assert!(b.timers.capacity() <= 64, "timers {}", b.timers.capacity());
    assert!(b.ready.capacity() <= 64, "ready {}", b.ready.capacity());
    assert!(b.events.capacity() <= 2 * QUEUE_FLOOR);
    assert!(b.control.capacity() <= 2 * QUEUE_FLOOR);
}

#[test]
fn reset_renumbers_for_a_restarted_receiver() {
    let t0 = Instant::now();
    let (mut a, mut b) = (ep(A.0), ep(B.0));
    a.send(B, 1, t0).unwrap();
    let tx = drain(&mut a, t0);
    b.handle_datagram(A, &tx[0].shim, t0);
    let ack = drain(&mut b, t0);
    a.handle_datagram(B, &ack[0].shim, t0);
    assert_eq!(events(&mut a), [Event::Acked { peer: B, token: 1 }]);
    let e1 = a.tx_epoch(&B).unwrap();
    // B restarts; A's next datagram (no SYN) meets no session.
    let mut b = ep(B.0);
    a.send(B, 2, t0).unwrap();
    let tx = drain(&mut a, t0);
    assert!(!tx[0].shim.data.unwrap().syn);
    assert_eq!(
        b.handle_datagram(A, &tx[0].shim, t0),
        Verdict::Drop(DropReason::NoSession)
    );
    assert_eq!(b.peer_count(), 0, "a reset costs no state");
    let rst = drain(&mut b, t0);
    assert_eq!(
        rst[0].shim.feedback,
        Feedback::Reset {
            epoch: e1,
            floor: e1
        }
    );
    a.handle_datagram(B, &rst[0].shim, t0);
    assert_eq!(events(&mut a), [Event::Resynced { peer: B, resent: 1 }]);
    let tx = drain(&mut a, t0);
    let d = tx[0].shim.data.unwrap();
    assert!(d.syn && d.psn == 0 && seq_after(d.epoch, e1));
    assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Deliver);
    // A stale reset (old epoch) is ignored.
    a.handle_datagram(B, &rst[0].shim, t0);
    assert!(events(&mut a).is_empty());
}

#[test]
fn discard_unsent_drops_tokens_only_before_the_new_session_sends() {
    let t0 = Instant::now();
    let (mut a, mut b) = (ep(A.0), ep(B.0));
    a.send(B, 1, t0).unwrap();
    let tx = drain(&mut a, t0);
    b.handle_datagram(A, &tx[0].shim, t0);
    let ack = drain(&mut b, t0);
    a.handle_datagram(B, &ack[0].shim, t0);
    events(&mut a);
    // Tokens 2..=5 go out in the old session; B restarts.
    for k in 2..=5 {
        a.send(B, k, t0).unwrap();
    }
    let tx = drain(&mut a, t0);
    assert_eq!(tx.len(), 4);
    assert_eq!(a.discard_unsent(&B, |_| false), 0, "the session sent data");
    let mut b = ep(B.0);
    b.handle_datagram(A, &tx[0].shim, t0);
    let rst = drain(&mut b, t0);
    a.handle_datagram(B, &rst[0].shim, t0);
    assert_eq!(events(&mut a), [Event::Resynced { peer: B, resent: 4 }]);
    // The layer above drops 2 and 4: they are abandoned, 3 and 5 go out
    // as PSN 0 and 1 of the new session.
    assert_eq!(a.discard_unsent(&B, |&t| t % 2 == 1), 2);
    assert_eq!(
        events(&mut a),
        [
            Event::Abandoned { peer: B, token: 2 },
            Event::Abandoned { peer: B, token: 4 }
        ]
    );
    assert_eq!((a.queued(&B), a.unacked(&B)), (2, 2));
    let tx = drain(&mut a, t0);
    let sent: Vec<_> = tx
        .iter()
        .map(|t| (t.token, t.shim.data.map(|d| (d.psn, d.syn))))
        .collect();
    assert_eq!(
        sent,
        [(Some(3), Some((0, true))), (Some(5), Some((1, true)))]
    );
    for t in &tx {
        assert_eq!(b.handle_datagram(A, &t.shim, t0), Verdict::Deliver);
    }
    assert_eq!(
        a.discard_unsent(&B, |_| false),
        0,
        "the new session sent data"
    );
    for t in drain(&mut b, t0) {
        a.handle_datagram(B, &t.shim, t0);
    }
    assert_eq!(
        events(&mut a),
        [
            Event::Acked { peer: B, token: 3 },
            Event::Acked { peer: B, token: 5 }
        ]
    );
    assert_eq!(a.stats().discarded, 2);
}

#[test]
fn restarted_sender_with_older_epoch_jumps_the_floor() {
    let t0 = Instant::now();
    let (mut a, mut b) = (ep(A.0), ep(B.0));
    for i in 0..3 {
        a.send(B, i, t0).unwrap();
    }
    for t in drain(&mut a, t0) {
        assert_eq!(b.handle_datagram(A, &t.shim, t0), Verdict::Deliver);
    }
    let e1 = a.tx_epoch(&B).unwrap();
    // A restarts with a seed *below* its old epochs.
    let mut c = cfg(A.0);
    c.epoch_seed = e1.wrapping_sub(100);
    let mut a: RdEndpoint<P, u32> = RdEndpoint::new(c).unwrap();
    a.send(B, 10, t0).unwrap();
    let tx = drain(&mut a, t0);
    assert_eq!(
        b.handle_datagram(A, &tx[0].shim, t0),
        Verdict::Drop(DropReason::StaleEpoch)
    );
    let rst: Vec<_> = drain(&mut b, t0)
        .into_iter()
        .filter(|t| matches!(t.shim.feedback, Feedback::Reset { .. }))
        .collect();
    a.handle_datagram(B, &rst[0].shim, t0);
    let tx = drain(&mut a, t0);
    assert!(seq_after(tx[0].shim.data.unwrap().epoch, e1));
    assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Deliver);
    assert!(events(&mut b).contains(&Event::SessionStarted {
        peer: A,
        replaced: true
    }));
}

#[test]
fn stale_epoch_and_old_ack_do_nothing() {
    let t0 = Instant::now();
    let (mut a, mut b) = (ep(A.0), ep(B.0));
    a.send(B, 1, t0).unwrap();
    let old = drain(&mut a, t0);
    b.handle_datagram(A, &old[0].shim, t0);
    let ack = drain(&mut b, t0);
    a.handle_datagram(B, &ack[0].shim, t0);
    // A's session goes quiet for idle/2: the next token starts a new one.
    let later = t0 + a.config().idle_timeout / 2;
    a.send(B, 2, later).unwrap();
    let new = drain(&mut a, later);
    assert!(new[0].shim.data.unwrap().syn);
    assert_eq!(b.handle_datagram(A, &new[0].shim, later), Verdict::Deliver);
    // A delayed copy of the old session's datagram is stale, not delivered.
    assert_eq!(
        b.handle_datagram(A, &old[0].shim, later),
        Verdict::Drop(DropReason::StaleEpoch)
    );
    // The old ACK (old epoch) acknowledges nothing now.
    a.handle_datagram(B, &ack[0].shim, later);
    assert_eq!(a.unacked(&B), 1);
}

#[test]
fn bounds() {
    let t0 = Instant::now();
    let mut c = cfg(A.0);
    c.max_peers = 2;
    c.max_queue = 2;
    c.max_control = 1;
    let mut a: RdEndpoint<P, u32> = RdEndpoint::new(c).unwrap();
    a.send(P(1), 0, t0).unwrap();
    a.send(P(1), 1, t0).unwrap();
    assert_eq!(a.send(P(1), 2, t0), Err(SendError::QueueFull));
    a.send(P(2), 0, t0).unwrap();
    assert_eq!(a.send(P(3), 0, t0), Err(SendError::TableFull));
    let mut syn = RdShimRepr::control(3, A.0, 8);
    syn.data = Some(DataSeq {
        epoch: 5,
        psn: 0,
        syn: true,
    });
    assert_eq!(
        a.handle_datagram(P(3), &syn, t0),
        Verdict::Drop(DropReason::TableFull)
    );
    // Resets to unknown peers are bounded too.
    syn.data = Some(DataSeq {
        epoch: 5,
        psn: 0,
        syn: false,
    });
    a.handle_datagram(P(4), &syn, t0);
    a.handle_datagram(P(5), &syn, t0);
    assert_eq!(a.stats().control_overflow, 1);
    syn.dst_qpn = 77;
    assert_eq!(
        a.handle_datagram(P(4), &syn, t0),
        Verdict::Drop(DropReason::WrongQp)
    );
    assert_eq!(a.stats().table_full, 2);
}

#[test]
fn abort_peer_abandons_tokens() {
    let t0 = Instant::now();
    let mut a = ep(A.0);
    a.send(B, 1, t0).unwrap();
    a.send(B, 2, t0).unwrap();
    a.abort_peer(B);
    assert_eq!(a.peer_count(), 0);
    assert_eq!(
        events(&mut a),
        [
            Event::PeerFailed {
                peer: B,
                abandoned: 2
            },
            Event::Abandoned { peer: B, token: 1 },
            Event::Abandoned { peer: B, token: 2 }
        ]
    );
    assert!(drain(&mut a, t0).is_empty());
}

#[test]
fn rtt_sets_rto() {
    let t0 = Instant::now();
    let (mut a, mut b) = (ep(A.0), ep(B.0));
    let rtt = Duration::from_millis(3);
    for i in 0..20u32 {
        let t = t0 + rtt * i;
        a.send(B, i, t).unwrap();
        for x in drain(&mut a, t) {
            b.handle_datagram(A, &x.shim, t);
        }
        for x in drain(&mut b, t + rtt) {
            a.handle_datagram(B, &x.shim, t + rtt);
        }
    }
    let p = a.peers.get(&B).unwrap();
    assert!(p.srtt.unwrap() == rtt);
    assert!(p.rto >= rtt && p.rto <= a.config().rto_initial);
}
