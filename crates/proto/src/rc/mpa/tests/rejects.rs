//! MPA rejections (by the ULP, for RTR mismatches) and bad frames, as
//! the responder and as the initiator sees them, and invalid
//! configurations.

use super::*;

// ---------------------------------------------------------------
// Rejections.
// ---------------------------------------------------------------

#[test]
fn reject_with_private_data() {
    for rev in [1, 2] {
        let icfg = MpaConfig {
            rev,
            private_data: b"let me in".to_vec(),
            ..MpaConfig::default()
        };
        let rcfg = MpaConfig::default();
        let decision = Decision::Reject(b"go away".to_vec());
        let r = run(icfg, rcfg, &decision, &mut Splitter::seeded(77, 5));
        assert_eq!(
            r.initiator,
            Some(Outcome::Rejected {
                private_data: b"go away".to_vec()
            })
        );
        assert_eq!(
            r.responder,
            Some(Outcome::Rejected {
                private_data: b"go away".to_vec()
            })
        );
        assert_eq!(r.request.unwrap().private_data, b"let me in");
        let (rep, _) = MpaRepr::parse(&r.reply_bytes).unwrap();
        assert!(rep.reject);
        assert_eq!(rep.rev, rev);
        assert_eq!(rep.ird_ord.is_some(), rev == 2);
        assert_eq!(rep.private_data, b"go away");
    }
}

#[test]
fn no_matching_rtr_is_rejected_by_the_responder() {
    let icfg = MpaConfig {
        rtr: RtrSupport {
            write: false,
            read: false,
            send: true,
        },
        ..MpaConfig::default()
    };
    let rcfg = MpaConfig {
        rtr: RtrSupport {
            write: true,
            read: false,
            send: false,
        },
        ..MpaConfig::default()
    };
    let r = run(icfg, rcfg, &default_accept(), &mut Splitter::seeded(1, 9));
    assert_eq!(r.responder, Some(Outcome::Failed(MpaError::NoMatchingRtr)));
    assert_eq!(
        MpaError::NoMatchingRtr.terminate_cause(),
        Some(TerminateCause::MpaNoMatchingRtr)
    );
    assert_eq!(TerminateCause::MpaNoMatchingRtr.to_raw(), (2, 0, 7));
    assert_eq!(
        r.initiator,
        Some(Outcome::Rejected {
            private_data: vec![]
        })
    );
    let (rep, _) = MpaRepr::parse(&r.reply_bytes).unwrap();
    assert!(rep.reject && rep.ird_ord.is_some());
}

#[test]
fn responder_rtr_preference_and_decline() {
    let now = Instant::now();
    let request = |w: IrdOrd| raw(&KEY_REQUEST, 0x10, 2, &word(w));
    let p2p = |write, read, send, ord| IrdOrd {
        ird: 4,
        ord,
        p2p: true,
        rtr_write: write,
        rtr_read: read,
        rtr_send: send,
    };
    for (offer, expect) in [
        (p2p(true, true, true, 1), Rtr::ZeroLengthWrite),
        (p2p(false, true, true, 1), Rtr::ZeroLengthRead),
        (p2p(false, false, true, 1), Rtr::ZeroLengthSend),
        // A Read RTR offered with ORD 0: our IRD is raised to 1 for it.
        (p2p(false, true, false, 0), Rtr::ZeroLengthRead),
    ] {
        let mut res = Responder::new(MpaConfig::default(), now).unwrap();
        res.handle_bytes(&request(offer), now).unwrap();
        assert_eq!(res.request().unwrap().rtr, expect);
        res.accept(b"", 0, 0).unwrap();
        let reply = res.poll_transmit().unwrap().to_vec();
        let w = MpaFrame::new_unchecked(&reply[..]).ird_ord().unwrap();
        assert_eq!(w, expect.word(w.ird, w.ord));
        if expect == Rtr::ZeroLengthRead {
            assert!(w.ird >= 1);
        }
    }
    // A responder that does not do P2P declines it.
    let rcfg = MpaConfig {
        p2p: false,
        ..MpaConfig::default()
    };
    let mut res = Responder::new(rcfg, now).unwrap();
    res.handle_bytes(&request(p2p(true, true, true, 1)), now)
        .unwrap();
    assert_eq!(res.request().unwrap().rtr, Rtr::InitiatorSendsFirst);
    res.accept(b"", 2, 2).unwrap();
    let reply = res.poll_transmit().unwrap().to_vec();
    let w = MpaFrame::new_unchecked(&reply[..]).ird_ord().unwrap();
    assert!(!w.p2p && !w.rtr_write && !w.rtr_read && !w.rtr_send);
}

// ---------------------------------------------------------------
// Bad frames.
// ---------------------------------------------------------------

#[test]
fn responder_bad_frames_without_reply() {
    let cases: [(Vec<u8>, MpaError); 4] = [
        (
            raw(&KEY_REPLY, 0x10, 2, &word(IrdOrd::new(1, 1))),
            MpaError::BadKey,
        ),
        // Garbage key, PD_Length 0xFFFF: fails after 20 octets.
        (
            [b"GET / HTTP/1.1\r\n".as_slice(), &[0x10, 2, 0xFF, 0xFF]].concat(),
            MpaError::BadKey,
        ),
        (
            raw(&KEY_REQUEST, 0x10, 3, &word(IrdOrd::new(1, 1))),
            MpaError::UnsupportedRevision(3),
        ),
        (
            raw(&KEY_REQUEST, 0x00, 1, &[0u8; 600])[..20].to_vec(),
            MpaError::PrivateDataTooLong { len: 600, max: 512 },
        ),
    ];
    for (frame, err) in cases {
        let (mut res, got) = responder_fed(MpaConfig::default(), &frame[..20]);
        assert_eq!(got, Err(err));
        assert_eq!(res.state(), State::Failed);
        assert_eq!(res.poll_transmit(), None, "no Reply for {err:?}");
        assert_eq!(res.poll_outcome(), Some(Outcome::Failed(err)));
        assert_eq!(
            err.terminate_cause(),
            Some(TerminateCause::MpaInvalidRequest)
        );
        assert_eq!(TerminateCause::MpaInvalidRequest.to_raw(), (2, 0, 4));
        // Further input gets the same answer.
        assert_eq!(res.handle_bytes(b"more", Instant::now()), Err(err));
        assert_eq!(res.poll_timeout(), None);
    }
}

#[test]
fn responder_bad_frames_with_rejecting_reply() {
    let cases = [
        // R=1 in a Request.
        (
            raw(&KEY_REQUEST, 0x30, 2, &word(IrdOrd::new(1, 1))),
            MpaError::InvalidFrame("R set in a Request"),
        ),
        // Enhanced flag, PD_Length 2: siw rejects this the same way.
        (
            raw(&KEY_REQUEST, 0x10, 2, &[0, 1]),
            MpaError::InvalidFrame("enhanced flag without IRD/ORD word"),
        ),
        // 300 octets: below the RFC's 512, above our 256.
        (
            raw(&KEY_REQUEST, 0x00, 1, &[7u8; 300]),
            MpaError::PrivateDataTooLong { len: 300, max: 256 },
        ),
    ];
    for (frame, err) in cases {
        let (mut res, got) = responder_fed(MpaConfig::default(), &frame);
        assert_eq!(got, Err(err));
        let reply = res.poll_transmit().unwrap().to_vec();
        assert_eq!(res.poll_outcome(), None, "outcome waits for the Reply");
        let f = MpaFrame::new_checked(&reply[..]).unwrap();
        assert_eq!(f.kind(), Some(FrameKind::Reply));
        assert!(f.reject());
        assert_eq!(f.rev(), MpaFrame::new_unchecked(&frame[..]).rev());
        res.transmitted(reply.len() - 1);
        assert_eq!(res.poll_outcome(), None);
        res.transmitted(1);
        assert_eq!(res.poll_outcome(), Some(Outcome::Failed(err)));
        assert_eq!(res.poll_outcome(), None, "handed out once");
    }
}

#[test]
fn responder_lenient_cases() {
    // Rev 1 with the (Rev-2-only) enhanced bit: reserved, ignored.
    let (res, got) = responder_fed(MpaConfig::default(), &raw(&KEY_REQUEST, 0x10, 1, b"abc"));
    assert_eq!(got, Ok(23));
    let req = res.request().unwrap();
    assert_eq!(
        (req.rev, req.ird_ord, &req.private_data[..]),
        (1, None, &b"abc"[..])
    );
    // Reserved bits (siw's GSO bit among them) are ignored.
    let (res, _) = responder_fed(
        MpaConfig::default(),
        &raw(&KEY_REQUEST, 0x1F, 2, &word(IrdOrd::new(2, 3))),
    );
    assert_eq!(res.request().unwrap().ird_ord, Some(IrdOrd::new(2, 3)));
    // M=1: we support markers, so it is accepted.
    let (mut res, _) = responder_fed(
        MpaConfig::default(),
        &raw(&KEY_REQUEST, 0x90, 2, &word(IrdOrd::new(2, 3))),
    );
    assert!(res.request().unwrap().markers);
    res.accept(b"", 4, 4).unwrap();
    let reply = res.poll_transmit().unwrap().to_vec();
    assert!(!MpaFrame::new_unchecked(&reply[..]).markers());
    res.transmitted(reply.len());
    let n = match res.poll_outcome() {
        Some(Outcome::Negotiated(n)) => n,
        other => panic!("{other:?}"),
    };
    assert!(n.markers_tx && !n.markers_rx);
    // Rev 0 (pre-RFC), which siw still accepts: answered with Rev 0.
    let (mut res, _) = responder_fed(MpaConfig::default(), &raw(&KEY_REQUEST, 0x40, 0, b"old"));
    res.accept(b"new", 4, 4).unwrap();
    let reply = res.poll_transmit().unwrap().to_vec();
    assert_eq!(reply, raw(&KEY_REPLY, 0x40, 0, b"new"));
    // A Rev-2 Request without the enhanced flag gets no word back.
    let (mut res, _) = responder_fed(MpaConfig::default(), &raw(&KEY_REQUEST, 0x00, 2, b"x"));
    res.accept(b"y", 4, 4).unwrap();
    assert_eq!(res.poll_transmit().unwrap(), raw(&KEY_REPLY, 0x40, 2, b"y"));
    // A Rev-1 responder answers a Rev-2 enhanced Request with Rev 1.
    let rcfg = MpaConfig {
        rev: 1,
        crc: false,
        ..MpaConfig::default()
    };
    let (mut res, _) = responder_fed(rcfg, &hex(SIW_P2P_REQUEST));
    assert_eq!(res.request().unwrap().rtr, Rtr::InitiatorSendsFirst);
    res.accept(b"", 4, 4).unwrap();
    assert_eq!(res.poll_transmit().unwrap(), raw(&KEY_REPLY, 0x40, 1, b""));
}

#[test]
fn initiator_bad_replies() {
    let p2p = |write, read, send, ird, ord| IrdOrd {
        ird,
        ord,
        p2p: true,
        rtr_write: write,
        rtr_read: read,
        rtr_send: send,
    };
    let rev1 = MpaConfig { rev: 1, ..plain() };
    let no_p2p = MpaConfig {
        p2p: false,
        ..plain()
    };
    let write_only = MpaConfig {
        rtr: RtrSupport {
            write: true,
            read: false,
            send: false,
        },
        ..plain()
    };
    let cases: Vec<(MpaConfig, Vec<u8>, MpaError, bool)> = vec![
        (
            plain(),
            raw(&KEY_REQUEST, 0x10, 2, &word(IrdOrd::new(1, 1))),
            MpaError::BadKey,
            false,
        ),
        (
            plain(),
            raw(&KEY_REPLY, 0x10, 3, &word(IrdOrd::new(1, 1))),
            MpaError::UnsupportedRevision(3),
            false,
        ),
        (
            plain(),
            raw(&KEY_REPLY, 0x00, 2, &[0; 300])[..20].to_vec(),
            MpaError::PrivateDataTooLong { len: 300, max: 256 },
            false,
        ),
        (
            rev1,
            raw(&KEY_REPLY, 0x10, 2, &word(IrdOrd::new(1, 1))),
            MpaError::InvalidFrame("Reply Rev above the Request's"),
            false,
        ),
        (
            no_p2p,
            raw(&KEY_REPLY, 0x10, 2, &word(p2p(true, false, false, 1, 1))),
            MpaError::InvalidFrame("P2P accepted but not requested"),
            false,
        ),
        (
            plain(),
            raw(&KEY_REPLY, 0x10, 2, &[0, 1]),
            MpaError::InvalidFrame("enhanced flag without IRD/ORD word"),
            false,
        ),
        (
            plain(),
            raw(&KEY_REPLY, 0x10, 2, &word(p2p(false, false, false, 1, 1))),
            MpaError::NoMatchingRtr,
            true,
        ),
        (
            write_only,
            raw(&KEY_REPLY, 0x10, 2, &word(p2p(false, true, false, 1, 1))),
            MpaError::NoMatchingRtr,
            true,
        ),
        (
            plain(),
            raw(&KEY_REPLY, 0x50, 2, &word(p2p(true, false, false, 1, 200))),
            MpaError::InsufficientIrd {
                needed: 200,
                available: 128,
            },
            true,
        ),
    ];
    for (cfg, reply, err, framing) in cases {
        let (mut ini, got) = initiator_fed(cfg, &reply);
        assert_eq!(got, Err(err));
        assert_eq!(ini.state(), State::Failed);
        assert_eq!(ini.terminate_framing().is_some(), framing, "{err:?}");
        assert!(err.terminate_cause().is_some());
        assert_eq!(ini.poll_outcome(), Some(Outcome::Failed(err)));
    }
    assert_eq!(
        MpaError::InsufficientIrd {
            needed: 2,
            available: 1
        }
        .terminate_cause(),
        Some(TerminateCause::MpaInsufficientIrd)
    );
    // The framing a Terminate would use after a bad RTR choice.
    let (ini, _) = initiator_fed(
        plain(),
        &raw(&KEY_REPLY, 0x90, 2, &word(p2p(false, false, false, 1, 1))),
    );
    assert_eq!(
        ini.terminate_framing(),
        Some(Framing {
            crc: true,
            markers_tx: true,
            markers_rx: false
        })
    );
}

#[test]
fn initiator_lenient_replies() {
    let outcome = |cfg: MpaConfig, reply: Vec<u8>| {
        let (mut ini, got) = initiator_fed(cfg, &reply);
        assert_eq!(got, Ok(reply.len()));
        ini.poll_outcome().unwrap()
    };
    // siw's automatic reject: enhanced + R, PD_Length 0.
    assert_eq!(
        outcome(plain(), raw(&KEY_REPLY, 0x30, 2, b"")),
        Outcome::Rejected {
            private_data: vec![]
        }
    );
    // A Rev-1 answer to our Rev-2 Request: no word, no P2P.
    let o = outcome(plain(), raw(&KEY_REPLY, 0x00, 1, b"pd"));
    let Outcome::Negotiated(n) = o else { panic!() };
    assert_eq!(
        (n.rev, n.enhanced, n.rtr),
        (1, false, Rtr::InitiatorSendsFirst)
    );
    assert_eq!((n.ird, n.ord, n.crc), (16, 16, true));
    assert_eq!(n.peer_private_data, b"pd");
    // Rev 2 without the enhanced flag: the same.
    let Outcome::Negotiated(n) = outcome(plain(), raw(&KEY_REPLY, 0x00, 2, b"")) else {
        panic!()
    };
    assert!(!n.enhanced);
    // The responder declines P2P: RFC 5044's rule.
    let Outcome::Negotiated(n) =
        outcome(plain(), raw(&KEY_REPLY, 0x10, 2, &word(IrdOrd::new(3, 2))))
    else {
        panic!()
    };
    assert_eq!((n.rtr, n.ird, n.ord), (Rtr::InitiatorSendsFirst, 2, 3));
    // M=1 in the Reply: we insert markers.
    let Outcome::Negotiated(n) =
        outcome(plain(), raw(&KEY_REPLY, 0x90, 2, &word(IrdOrd::new(3, 2))))
    else {
        panic!()
    };
    assert!(n.markers_tx && !n.markers_rx && n.crc);
    // Several RTR bits: the preferred one among those we offered.
    let w = IrdOrd {
        p2p: true,
        rtr_read: true,
        rtr_send: true,
        ..IrdOrd::new(1, 1)
    };
    let Outcome::Negotiated(n) = outcome(plain(), raw(&KEY_REPLY, 0x10, 2, &word(w))) else {
        panic!()
    };
    assert_eq!(n.rtr, Rtr::ZeroLengthRead);
    // Relaxed: a Reply ORD above our IRD but within max_ird raises it.
    let Outcome::Negotiated(n) = outcome(
        plain(),
        raw(&KEY_REPLY, 0x10, 2, &word(IrdOrd::new(100, 100))),
    ) else {
        panic!()
    };
    assert_eq!((n.ird, n.ord), (100, 16));
    // A peer's trailer is not looked for if we did not send ours.
    let mut pd = word(IrdOrd::new(1, 1));
    pd.extend_from_slice(b"sRDMA\x01\x00\x03");
    let Outcome::Negotiated(n) = outcome(plain(), raw(&KEY_REPLY, 0x10, 2, &pd)) else {
        panic!()
    };
    assert!(!n.peer_is_softrdma);
    assert_eq!(n.peer_private_data, b"sRDMA\x01\x00\x03");
}

#[test]
fn config_errors() {
    let now = Instant::now();
    for rev in [0, 3] {
        let c = MpaConfig {
            rev,
            ..MpaConfig::default()
        };
        assert!(matches!(
            Initiator::new(c.clone(), now),
            Err(MpaError::InvalidConfig(_))
        ));
        assert!(matches!(
            Responder::new(c, now),
            Err(MpaError::InvalidConfig(_))
        ));
    }
    let c = MpaConfig {
        rtr: RtrSupport {
            write: false,
            read: true,
            send: false,
        },
        ord: 0,
        ..MpaConfig::default()
    };
    assert!(matches!(
        Initiator::new(c.clone(), now),
        Err(MpaError::InvalidConfig(_))
    ));
    // Without P2P the same is fine, and so is Rev 1.
    assert!(Initiator::new(
        MpaConfig {
            p2p: false,
            ..c.clone()
        },
        now
    )
    .is_ok());
    assert!(Initiator::new(MpaConfig { rev: 1, ..c }, now).is_ok());
    let mut res = Responder::new(MpaConfig::default(), now).unwrap();
    assert_eq!(res.accept(b"", 1, 1), Err(MpaError::InvalidState));
    assert_eq!(res.reject(b""), Err(MpaError::InvalidState));
    assert_eq!(MpaError::InvalidState.terminate_cause(), None);
    assert!(!MpaError::Timeout.to_string().is_empty());
}
