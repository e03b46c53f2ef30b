//! MPA stream handling: consuming only the peer's frame, resuming
//! partial writes, timeouts.

use super::*;

// ---------------------------------------------------------------
// Stream handling, transmit, timeouts.
// ---------------------------------------------------------------

#[test]
fn consumes_only_the_peers_frame() {
    let now = Instant::now();
    // The initiator: siw's Reply and the responder's first FPDU octets
    // in one read.
    let mut ini = Initiator::new(plain(), now).unwrap();
    let stream = [hex(SIW_DEFAULT_REPLY), hex(SIW_DEFAULT_REPLY_NEXT)].concat();
    assert_eq!(ini.handle_bytes(&stream, now), Ok(24));
    assert_eq!(ini.handle_bytes(&stream[24..], now), Ok(0));
    assert_eq!(ini.state(), State::Negotiated);
    // The outcome waits until the Request is out.
    assert_eq!(ini.poll_outcome(), None);
    ini.transmitted(ini.poll_transmit().unwrap().len());
    assert!(matches!(ini.poll_outcome(), Some(Outcome::Negotiated(_))));
    // The responder, one octet at a time, with octets behind the Request.
    let mut res = Responder::new(MpaConfig::default(), now).unwrap();
    let stream = [hex(SIW_P2P_REQUEST), b"FPDU".to_vec()].concat();
    let mut used = 0;
    for b in stream.chunks(1) {
        used += res.handle_bytes(b, now).unwrap();
    }
    assert_eq!(used, 24);
    assert_eq!(res.state(), State::RequestReceived);
    assert_eq!(res.handle_bytes(b"more", now), Ok(0));
}

#[test]
fn partial_writes_resume() {
    let now = Instant::now();
    let mut ini = Initiator::new(MpaConfig::default(), now).unwrap();
    let whole = ini.poll_transmit().unwrap().to_vec();
    let mut out = Vec::new();
    while let Some(p) = ini.poll_transmit() {
        let n = p.len().min(3);
        out.extend_from_slice(&p[..n]);
        ini.transmitted(n);
    }
    assert_eq!(out, whole);
    assert_eq!(ini.poll_transmit(), None);
    ini.transmitted(0);
}

#[test]
fn timeouts() {
    let now = Instant::now();
    let short = MpaConfig {
        timeout: Duration::from_millis(50),
        ..MpaConfig::default()
    };
    let mut ini = Initiator::new(MpaConfig::default(), now).unwrap();
    assert_eq!(ini.poll_timeout(), Some(now + DEFAULT_TIMEOUT));
    ini.handle_timeout(now + Duration::from_millis(9_999));
    assert_eq!(ini.state(), State::AwaitingPeer);
    ini.handle_timeout(now + DEFAULT_TIMEOUT);
    assert_eq!(ini.state(), State::Failed);
    assert_eq!(
        ini.poll_transmit(),
        None,
        "nothing more to send after a failure"
    );
    assert_eq!(ini.poll_outcome(), Some(Outcome::Failed(MpaError::Timeout)));
    assert_eq!(ini.poll_timeout(), None);
    assert_eq!(MpaError::Timeout.terminate_cause(), None);
    assert_eq!(ini.terminate_framing(), None);
    assert_eq!(
        ini.handle_bytes(&hex(SIW_DEFAULT_REPLY), now),
        Err(MpaError::Timeout)
    );

    let mut res = Responder::new(short.clone(), now).unwrap();
    assert_eq!(res.poll_timeout(), Some(now + Duration::from_millis(50)));
    // Half a Request does not stop the timer.
    res.handle_bytes(&hex(SIW_DEFAULT_REQUEST)[..10], now)
        .unwrap();
    res.handle_timeout(now + Duration::from_millis(50));
    assert_eq!(res.poll_outcome(), Some(Outcome::Failed(MpaError::Timeout)));

    // Once the Request is in, the responder's timer stops; once the
    // Reply is in, the initiator's does.
    let mut res = Responder::new(short.clone(), now).unwrap();
    res.handle_bytes(&hex(SIW_DEFAULT_REQUEST), now).unwrap();
    assert_eq!(res.poll_timeout(), None);
    res.handle_timeout(now + Duration::from_secs(60));
    assert_eq!(res.state(), State::RequestReceived);
    let (mut ini, _) = initiator_fed(short, &hex(SIW_DEFAULT_REPLY));
    assert_eq!(ini.poll_timeout(), None);
    ini.handle_timeout(now + Duration::from_secs(60));
    assert_eq!(ini.state(), State::Negotiated);
    // A timeout too large for Instant: no deadline.
    let ini = Initiator::new(
        MpaConfig {
            timeout: Duration::MAX,
            ..MpaConfig::default()
        },
        now,
    )
    .unwrap();
    assert_eq!(ini.poll_timeout(), None);
}
