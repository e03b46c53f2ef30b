//! MPA private data at and beyond the siw limit, and the softrdma
//! trailer that discovers a softrdma peer.

use super::*;

// ---------------------------------------------------------------
// Private data and the softrdma trailer.
// ---------------------------------------------------------------

fn pd(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

#[test]
fn private_data_round_trip_at_the_siw_limit() {
    // 4 (word) + 244 + 8 (trailer) = 256: the trailer still fits.
    for (len, softrdma) in [
        (0, true),
        (1, true),
        (244, true),
        (245, false),
        (252, false),
    ] {
        let icfg = MpaConfig {
            private_data: pd(len),
            ..MpaConfig::default()
        };
        let rcfg = MpaConfig::default();
        let decision = Decision::Accept {
            pd: pd(len).into_iter().rev().collect(),
            ird: 8,
            ord: 8,
        };
        let r = run(
            icfg.clone(),
            rcfg.clone(),
            &decision,
            &mut Splitter::seeded(len as u64, 50),
        );
        check_pair(&icfg, &rcfg, &decision, &r);
        assert_eq!(
            negotiated(&r.initiator).peer_is_softrdma,
            softrdma,
            "len {len}"
        );
        let pd_len = MpaFrame::new_unchecked(&r.request_bytes[..]).pd_length();
        assert_eq!(usize::from(pd_len), 4 + len + if softrdma { 8 } else { 0 });
        assert!(siw_accepts_request(&r.request_bytes).is_ok());
    }
    // 253 octets do not fit next to the word.
    let icfg = MpaConfig {
        private_data: pd(253),
        ..MpaConfig::default()
    };
    assert_eq!(
        Initiator::new(icfg, Instant::now()).unwrap_err(),
        MpaError::UlpPrivateDataTooLong { len: 253, max: 252 }
    );
    // Rev 1 has no word: 256 octets fit (without the trailer).
    let icfg = MpaConfig {
        rev: 1,
        private_data: pd(256),
        ..MpaConfig::default()
    };
    let r = run(
        icfg.clone(),
        MpaConfig::default(),
        &default_accept(),
        &mut Splitter::seeded(3, 100),
    );
    check_pair(&icfg, &MpaConfig::default(), &default_accept(), &r);
}

#[test]
fn private_data_round_trip_with_the_limit_raised_to_512() {
    let big = |ext: bool, len: usize| MpaConfig {
        max_private_data: 512,
        softrdma_ext: ext,
        private_data: pd(len),
        ..MpaConfig::default()
    };
    for (ext, len) in [(true, 500), (false, 508), (true, 508)] {
        let (icfg, rcfg) = (big(ext, len), big(ext, 0));
        let decision = Decision::Accept {
            pd: pd(508),
            ird: 1,
            ord: 1,
        };
        let r = run(
            icfg.clone(),
            rcfg.clone(),
            &decision,
            &mut Splitter::seeded(len as u64, 200),
        );
        check_pair(&icfg, &rcfg, &decision, &r);
        assert_eq!(MpaFrame::new_unchecked(&r.reply_bytes[..]).pd_length(), 512);
    }
    assert_eq!(
        Initiator::new(big(true, 509), Instant::now()).unwrap_err(),
        MpaError::UlpPrivateDataTooLong { len: 509, max: 508 }
    );
    assert!(matches!(
        Initiator::new(
            MpaConfig {
                max_private_data: 513,
                ..MpaConfig::default()
            },
            Instant::now()
        ),
        Err(MpaError::InvalidConfig(_))
    ));
    // A 512-octet Request to a responder with the siw limit: it reads
    // the frame and rejects it.
    let r = run(
        big(false, 508),
        MpaConfig::default(),
        &default_accept(),
        &mut Splitter::seeded(9, 64),
    );
    assert_eq!(
        r.responder,
        Some(Outcome::Failed(MpaError::PrivateDataTooLong {
            len: 512,
            max: 256
        }))
    );
    assert_eq!(
        r.initiator,
        Some(Outcome::Rejected {
            private_data: vec![]
        })
    );
    assert!(r.i2r_left.is_empty());
}

#[test]
fn accept_with_too_much_private_data_can_be_retried() {
    let now = Instant::now();
    let mut res = Responder::new(MpaConfig::default(), now).unwrap();
    res.handle_bytes(&hex(SIW_DEFAULT_REQUEST), now).unwrap();
    assert_eq!(
        res.accept(&pd(253), 1, 1),
        Err(MpaError::UlpPrivateDataTooLong { len: 253, max: 252 })
    );
    assert_eq!(res.state(), State::RequestReceived);
    assert_eq!(
        res.reject(&pd(253)).unwrap_err(),
        MpaError::UlpPrivateDataTooLong { len: 253, max: 252 }
    );
    res.accept(&pd(252), 1, 1).unwrap();
    let reply = res.poll_transmit().unwrap().to_vec();
    assert_eq!(MpaFrame::new_unchecked(&reply[..]).pd_length(), 256);
    assert!(siw_accepts_reply(&hex(SIW_DEFAULT_REQUEST), &reply).is_ok());
    assert_eq!(res.accept(b"", 1, 1), Err(MpaError::InvalidState));
}

#[test]
fn softrdma_discovery_both_ways() {
    for (ext_i, ext_r) in [(true, true), (true, false), (false, true), (false, false)] {
        let icfg = MpaConfig {
            softrdma_ext: ext_i,
            private_data: b"hello".to_vec(),
            ..MpaConfig::default()
        };
        let rcfg = MpaConfig {
            softrdma_ext: ext_r,
            ..MpaConfig::default()
        };
        let decision = default_accept();
        let r = run(
            icfg.clone(),
            rcfg.clone(),
            &decision,
            &mut Splitter::seeded(5, 11),
        );
        check_pair(&icfg, &rcfg, &decision, &r);
        let (i, s) = (negotiated(&r.initiator), negotiated(&r.responder));
        let both = ext_i && ext_r;
        assert_eq!((i.peer_is_softrdma, s.peer_is_softrdma), (both, both));
        // The trailer is on the wire only where announced.
        let req_pd = MpaFrame::new_unchecked(&r.request_bytes[..])
            .private_data()
            .to_vec();
        let rep_pd = MpaFrame::new_unchecked(&r.reply_bytes[..])
            .private_data()
            .to_vec();
        assert_eq!(SoftrdmaTrailer::split(&req_pd).is_some(), ext_i);
        assert_eq!(SoftrdmaTrailer::split(&rep_pd).is_some(), both);
        if ext_i && !ext_r {
            // A plain responder's ULP sees the 8 octets, like siw's would.
            assert_eq!(
                s.peer_private_data,
                b"hello\x73\x52\x44\x4d\x41\x01\x00\x03"
            );
        } else {
            assert_eq!(s.peer_private_data, b"hello");
        }
        // Only toward a non-softrdma responder is the first FPDU held off.
        let expect = if both {
            r.now
        } else {
            r.now + DEFAULT_RTR_HOLDOFF
        };
        assert_eq!(i.first_fpdu_not_before, Some(expect));
    }
}

#[test]
fn trailer_layout() {
    assert_eq!(SoftrdmaTrailer::OURS.to_bytes(), *b"sRDMA\x01\x00\x03");
    let (ulp, t) = SoftrdmaTrailer::split(b"abcsRDMA\x07\x80\x01").unwrap();
    assert_eq!(ulp, b"abc");
    assert_eq!(
        t,
        SoftrdmaTrailer {
            version: 7,
            flags: 0x8001
        }
    );
    assert_eq!(SoftrdmaTrailer::split(b"RDMA\x01\x00\x03"), None);
    assert_eq!(SoftrdmaTrailer::split(b"xRDMA\x01\x00\x03"), None);
    // A peer with unknown flags: only the known ones are agreed.
    let now = Instant::now();
    let mut res = Responder::new(MpaConfig::default(), now).unwrap();
    let mut body = word(IrdOrd::new(4, 4));
    body.extend_from_slice(b"sRDMA\x02\xff\xf1");
    res.handle_bytes(&raw(&KEY_REQUEST, 0x10, 2, &body), now)
        .unwrap();
    assert!(res.request().unwrap().peer_is_softrdma);
    assert!(res.request().unwrap().private_data.is_empty());
    res.accept(b"", 4, 4).unwrap();
    res.transmitted(res.poll_transmit().unwrap().len());
    let n = match res.poll_outcome() {
        Some(Outcome::Negotiated(n)) => n,
        other => panic!("{other:?}"),
    };
    assert!(n.peer_is_softrdma);
    assert_eq!(n.ext_flags, EXT_ATOMICS);
}
