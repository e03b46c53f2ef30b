//! MPA golden frames: the wire crate's vectors and frames captured from
//! real siw.

use super::*;

// ---------------------------------------------------------------
// Golden frames: the wire vectors and real siw.
// ---------------------------------------------------------------

#[test]
fn golden_vectors_request_gets_golden_reply() {
    let (mut res, got) = responder_fed(MpaConfig::default(), &hex(GOLDEN_REQUEST));
    assert_eq!(got, Ok(33));
    let req = res.request().unwrap().clone();
    assert_eq!(req.private_data, b"ulp-hello");
    assert_eq!(req.ird_ord, Some(IrdOrd::new(16, 16)));
    res.accept(b"ulp-ok", 16, 16).unwrap();
    assert_eq!(res.poll_transmit().unwrap(), hex(GOLDEN_REPLY));
    // And the golden Reply, given to an initiator whose Request is the
    // golden Request.
    let icfg = MpaConfig {
        p2p: false,
        softrdma_ext: false,
        private_data: b"ulp-hello".to_vec(),
        ..MpaConfig::default()
    };
    let mut ini = Initiator::new(icfg, Instant::now()).unwrap();
    assert_eq!(ini.poll_transmit().unwrap(), hex(GOLDEN_REQUEST));
    ini.transmitted(33);
    ini.handle_bytes(&hex(GOLDEN_REPLY), Instant::now())
        .unwrap();
    let Some(Outcome::Negotiated(n)) = ini.poll_outcome() else {
        panic!()
    };
    assert_eq!(n.peer_private_data, b"ulp-ok");
    assert_eq!(
        (n.ird, n.ord, n.crc, n.rtr),
        (16, 16, true, Rtr::InitiatorSendsFirst)
    );
}

#[test]
fn siw_default_request_gets_a_reply_siw_accepts() {
    let request = hex(SIW_DEFAULT_REQUEST);
    assert_eq!(request[16], 0x10);
    // Our defaults (CRC wanted, extension on, IRD/ORD 16).
    let (mut res, got) = responder_fed(MpaConfig::default(), &request);
    assert_eq!(got, Ok(24));
    let req = res.request().unwrap();
    assert_eq!((req.rev, req.crc, req.markers), (2, false, false));
    assert_eq!(req.ird_ord, Some(IrdOrd::new(1, 1)));
    assert!(req.private_data.is_empty() && !req.peer_is_softrdma);
    assert_eq!(req.rtr, Rtr::InitiatorSendsFirst);
    res.accept(b"", 16, 16).unwrap();
    let reply = res.poll_transmit().unwrap().to_vec();
    assert_eq!(siw_accepts_reply(&request, &reply), Ok(()));
    let f = MpaFrame::new_checked(&reply[..]).unwrap();
    assert_eq!((f.flags(), f.rev(), f.pd_length()), (0x50, 2, 4));
    // IRD raised to 16 (>= siw's ORD 1), ORD lowered to siw's IRD 1.
    assert_eq!(f.ird_ord(), Some(IrdOrd::new(16, 1)));
    res.transmitted(reply.len());
    let Some(Outcome::Negotiated(n)) = res.poll_outcome() else {
        panic!()
    };
    assert_eq!(
        (n.crc, n.ird, n.ord, n.rtr),
        (true, 16, 1, Rtr::InitiatorSendsFirst)
    );
    assert!(!n.peer_is_softrdma && !n.markers_tx && !n.markers_rx);

    // Configured like siw (no CRC, IRD/ORD 1): byte-identical to siw's
    // own Reply.
    let rcfg = MpaConfig {
        crc: false,
        ..MpaConfig::default()
    };
    let (mut res, _) = responder_fed(rcfg, &request);
    res.accept(b"", 1, 1).unwrap();
    assert_eq!(res.poll_transmit().unwrap(), hex(SIW_DEFAULT_REPLY));
}

#[test]
fn siw_p2p_request_gets_siws_own_reply() {
    let request = hex(SIW_P2P_REQUEST);
    let (mut res, _) = responder_fed(MpaConfig::default(), &request);
    let req = res.request().unwrap();
    assert!(req.crc);
    assert_eq!(req.rtr, Rtr::ZeroLengthWrite);
    res.accept(b"", 1, 1).unwrap();
    let reply = res.poll_transmit().unwrap().to_vec();
    assert_eq!(reply, hex(SIW_P2P_REPLY));
    assert_eq!(siw_accepts_reply(&request, &reply), Ok(()));
    res.transmitted(reply.len());
    let Some(Outcome::Negotiated(n)) = res.poll_outcome() else {
        panic!()
    };
    assert_eq!(
        (n.crc, n.rtr, n.ird, n.ord),
        (true, Rtr::ZeroLengthWrite, 1, 1)
    );
}

#[test]
fn siw_p2p_reply_is_accepted_by_our_initiator() {
    let siw_like = MpaConfig {
        ird: 1,
        ord: 1,
        softrdma_ext: false,
        ..MpaConfig::default()
    };
    // We offer the Send RTR too; otherwise our Request is siw's.
    let ini = Initiator::new(siw_like.clone(), Instant::now()).unwrap();
    let mut expect = hex(SIW_P2P_REQUEST);
    expect[20] |= 0x40;
    assert_eq!(ini.poll_transmit().unwrap(), expect);
    assert_eq!(siw_accepts_request(&expect), Ok(()));
    let write_read = MpaConfig {
        rtr: RtrSupport {
            write: true,
            read: true,
            send: false,
        },
        ..siw_like.clone()
    };
    let ini = Initiator::new(write_read, Instant::now()).unwrap();
    assert_eq!(ini.poll_transmit().unwrap(), hex(SIW_P2P_REQUEST));

    for cfg in [siw_like, MpaConfig::default()] {
        let now = Instant::now();
        let mut ini = Initiator::new(cfg.clone(), now).unwrap();
        assert_eq!(siw_accepts_request(ini.poll_transmit().unwrap()), Ok(()));
        ini.transmitted(ini.poll_transmit().unwrap().len());
        assert_eq!(ini.handle_bytes(&hex(SIW_P2P_REPLY), now), Ok(24));
        let Some(Outcome::Negotiated(n)) = ini.poll_outcome() else {
            panic!()
        };
        assert_eq!((n.rev, n.enhanced, n.crc), (2, true, true));
        assert_eq!(n.rtr, Rtr::ZeroLengthWrite);
        assert_eq!((n.ird, n.ord), (1, 1));
        assert!(!n.markers_tx && !n.markers_rx && !n.peer_is_softrdma);
        assert!(n.peer_private_data.is_empty());
        assert_eq!(n.first_fpdu_not_before, Some(now + DEFAULT_RTR_HOLDOFF));
    }
    // siw's default (non-P2P) Reply to our default P2P Request: siw as
    // responder would echo P2P, but a declining Reply must work too.
    let (mut ini, got) = initiator_fed(MpaConfig::default(), &hex(SIW_DEFAULT_REPLY));
    assert_eq!(got, Ok(24));
    let Some(Outcome::Negotiated(n)) = ini.poll_outcome() else {
        panic!()
    };
    assert_eq!(
        (n.rtr, n.ird, n.ord, n.crc),
        (Rtr::InitiatorSendsFirst, 1, 1, true)
    );
}
