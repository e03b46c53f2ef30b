use super::*;
use proptest::prelude::*;
use softrdma_wire::mpa::{KEY_REPLY, KEY_REQUEST};

// ---------------------------------------------------------------
// Real siw frames, extracted from packet captures of Linux 6.12 siw
// (rping) with `tshark -r FILE -q -z follow,tcp,raw,0`.
// ---------------------------------------------------------------

/// siw-rping-default.pcap, initiator: Rev 2, octet 16 = 0x10 (enhanced
/// only), PD = IRD/ORD word (IRD 1, ORD 1), no P2P.
const SIW_DEFAULT_REQUEST: &str = "4d504120494420526571204672616d651002000400010001";
/// siw-rping-default.pcap, responder's Reply to it.
const SIW_DEFAULT_REPLY: &str = "4d504120494420526570204672616d651002000400010001";
/// siw-rping-default.pcap: the first 8 octets of the responder's first
/// FPDU (a Read Request), which follows the Reply in the same stream.
const SIW_DEFAULT_REPLY_NEXT: &str = "002e414100000000";
/// siw-rping-crc-p2p.pcap, initiator: C + enhanced, P2P, IRD 1,
/// Write + Read RTR, ORD 1.
const SIW_P2P_REQUEST: &str = "4d504120494420526571204672616d65500200048001c001";
/// siw-rping-crc-p2p.pcap, responder: C + enhanced, P2P, IRD 1, Write
/// RTR, ORD 1.
const SIW_P2P_REPLY: &str = "4d504120494420526570204672616d655002000480018001";
/// golden.txt: "MPA Request rev2, C=1, enh, IRD=ORD=16, PD='ulp-hello'".
const GOLDEN_REQUEST: &str = "4d504120494420526571204672616d655002000d00100010756c702d68656c6c6f";
/// golden.txt: "MPA Reply rev2, C=1, enh, IRD=ORD=16, PD='ulp-ok'".
const GOLDEN_REPLY: &str = "4d504120494420526570204672616d655002000a00100010756c702d6f6b";

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2));
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A raw frame, bypassing every invariant of the wire encoder.
fn raw(key: &[u8; 16], flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
    let mut b = key.to_vec();
    b.push(flags);
    b.push(rev);
    b.extend_from_slice(&u16::try_from(pd.len()).unwrap().to_be_bytes());
    b.extend_from_slice(pd);
    b
}

fn word(w: IrdOrd) -> Vec<u8> {
    w.to_bytes().to_vec()
}

/// What siw's `siw_proc_mpareply` (siw_cm.c, mainline defaults: CRC not
/// required, not strict, relaxed IRD negotiation, max IRD 128) demands
/// of the Reply to `request`.
fn siw_accepts_reply(request: &[u8], reply: &[u8]) -> Result<(), &'static str> {
    let len = frame_len(reply).ok_or("short")?;
    if len != reply.len() {
        return Err("octets after the Reply");
    }
    let f = MpaFrame::new_checked(reply).map_err(|_| "truncated")?;
    if usize::from(f.pd_length()) > SIW_MAX_PRIVATE_DATA {
        return Err("PD_Length above 256");
    }
    if f.rev() > 2 {
        return Err("rev > 2");
    }
    if f.key() != KEY_REPLY {
        return Err("bad key");
    }
    if f.reject() {
        return Err("rejected");
    }
    if f.markers() {
        return Err("M=1");
    }
    let req = MpaFrame::new_checked(request).unwrap();
    if req.rev() == 2 && req.enhanced() {
        if f.rev() < 2 || !f.enhanced() {
            return Err("not Rev 2 + enhanced");
        }
        let rep = f.ird_ord().ok_or("no IRD/ORD word")?;
        let sent = req.ird_ord().unwrap();
        if sent.ird < rep.ord && rep.ord > 128 {
            return Err("insufficient IRD");
        }
        if sent.p2p && (sent.rtr_write || sent.rtr_read) {
            let ok = (sent.rtr_write && rep.rtr_write) || (sent.rtr_read && rep.rtr_read);
            if !ok {
                return Err("no matching RTR");
            }
        }
    }
    Ok(())
}

/// What siw's `siw_proc_mpareq` demands of a Request before it accepts
/// (anything else: close, or a Reply with R=1).
fn siw_accepts_request(request: &[u8]) -> Result<(), &'static str> {
    let len = frame_len(request).ok_or("short")?;
    if len != request.len() {
        return Err("octets after the Request");
    }
    let f = MpaFrame::new_checked(request).map_err(|_| "truncated")?;
    if usize::from(f.pd_length()) > SIW_MAX_PRIVATE_DATA {
        return Err("PD_Length above 256");
    }
    if f.rev() > 2 {
        return Err("rev > 2");
    }
    if f.key() != KEY_REQUEST {
        return Err("bad key");
    }
    if f.rev() == 2 && f.enhanced() && f.pd_length() < 4 {
        return Err("enhanced without word");
    }
    if f.markers() {
        return Err("M=1");
    }
    Ok(())
}

// ---------------------------------------------------------------
// A driver: both ends against each other through split streams.
// ---------------------------------------------------------------

/// Chunk sizes for writes and reads, cycled.
struct Splitter {
    sizes: Vec<usize>,
    i: usize,
}

impl Splitter {
    fn new(sizes: Vec<usize>) -> Splitter {
        assert!(!sizes.is_empty());
        Splitter { sizes, i: 0 }
    }

    /// Pseudo-random sizes in 1..=max (xorshift, seeded).
    fn seeded(mut seed: u64, max: usize) -> Splitter {
        seed |= 1;
        let sizes = (0..97)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                1 + (seed % max as u64) as usize
            })
            .collect();
        Splitter::new(sizes)
    }

    fn next(&mut self) -> usize {
        let s = self.sizes[self.i % self.sizes.len()].max(1);
        self.i += 1;
        s
    }
}

#[derive(Debug, Clone)]
enum Decision {
    Accept { pd: Vec<u8>, ird: u16, ord: u16 },
    Reject(Vec<u8>),
}

#[derive(Debug)]
struct Run {
    now: Instant,
    initiator: Option<Outcome>,
    responder: Option<Outcome>,
    request: Option<PeerRequest>,
    request_bytes: Vec<u8>,
    reply_bytes: Vec<u8>,
    i2r_left: Vec<u8>,
    r2i_left: Vec<u8>,
}

fn run(icfg: MpaConfig, rcfg: MpaConfig, decision: &Decision, split: &mut Splitter) -> Run {
    let now = Instant::now();
    let mut ini = Initiator::new(icfg, now).unwrap();
    let mut res = Responder::new(rcfg, now).unwrap();
    let mut r = Run {
        now,
        initiator: None,
        responder: None,
        request: None,
        request_bytes: Vec::new(),
        reply_bytes: Vec::new(),
        i2r_left: Vec::new(),
        r2i_left: Vec::new(),
    };
    for _ in 0..100_000 {
        let mut progress = false;
        if let Some(p) = ini.poll_transmit() {
            let n = split.next().min(p.len());
            r.i2r_left.extend_from_slice(&p[..n]);
            r.request_bytes.extend_from_slice(&p[..n]);
            ini.transmitted(n);
            progress = true;
        }
        if !r.i2r_left.is_empty() {
            let n = split.next().min(r.i2r_left.len());
            // After a failure the connection is dead: drop the rest.
            let c = match res.handle_bytes(&r.i2r_left[..n], now) {
                Ok(c) => {
                    assert!(c <= n);
                    c
                }
                Err(_) => r.i2r_left.len(),
            };
            r.i2r_left.drain(..c);
            progress |= c > 0;
        }
        if res.state() == State::RequestReceived {
            r.request = res.request().cloned();
            match decision {
                Decision::Accept { pd, ird, ord } => res.accept(pd, *ird, *ord).unwrap(),
                Decision::Reject(pd) => res.reject(pd).unwrap(),
            }
            progress = true;
        }
        if let Some(p) = res.poll_transmit() {
            let n = split.next().min(p.len());
            r.r2i_left.extend_from_slice(&p[..n]);
            r.reply_bytes.extend_from_slice(&p[..n]);
            res.transmitted(n);
            progress = true;
        }
        if !r.r2i_left.is_empty() {
            let n = split.next().min(r.r2i_left.len());
            let c = match ini.handle_bytes(&r.r2i_left[..n], now) {
                Ok(c) => {
                    assert!(c <= n);
                    c
                }
                Err(_) => r.r2i_left.len(),
            };
            r.r2i_left.drain(..c);
            progress |= c > 0;
        }
        if r.initiator.is_none() {
            r.initiator = ini.poll_outcome();
            progress |= r.initiator.is_some();
        }
        if r.responder.is_none() {
            r.responder = res.poll_outcome();
            progress |= r.responder.is_some();
        }
        if !progress {
            break;
        }
    }
    assert_eq!(
        ini.poll_transmit(),
        None,
        "initiator sends only its Request"
    );
    assert_eq!(res.poll_transmit(), None);
    r
}

fn negotiated(o: &Option<Outcome>) -> &Negotiated {
    match o {
        Some(Outcome::Negotiated(n)) => n,
        other => panic!("not negotiated: {other:?}"),
    }
}

fn default_accept() -> Decision {
    Decision::Accept {
        pd: b"responder-ulp".to_vec(),
        ird: 16,
        ord: 16,
    }
}

/// Checks everything two ends must agree on after a successful run.
fn check_pair(icfg: &MpaConfig, rcfg: &MpaConfig, decision: &Decision, r: &Run) {
    let Decision::Accept {
        pd: acc_pd,
        ird: acc_ird,
        ord: acc_ord,
    } = decision
    else {
        panic!("check_pair needs an acceptance")
    };
    let i = negotiated(&r.initiator);
    let s = negotiated(&r.responder);
    assert!(r.i2r_left.is_empty() && r.r2i_left.is_empty());

    // Both frames are valid for the (strict) wire decoder, exactly one
    // frame each.
    let (req, n) = MpaRepr::parse(&r.request_bytes).unwrap();
    assert_eq!(n, r.request_bytes.len());
    let (rep, n) = MpaRepr::parse(&r.reply_bytes).unwrap();
    assert_eq!(n, r.reply_bytes.len());
    assert!(!rep.reject);
    assert!(
        usize::from(MpaFrame::new_unchecked(&r.request_bytes[..]).pd_length())
            <= icfg.max_private_data
    );
    assert!(
        usize::from(MpaFrame::new_unchecked(&r.reply_bytes[..]).pd_length())
            <= rcfg.max_private_data
    );

    let rev = icfg.rev.min(rcfg.rev);
    assert_eq!((i.rev, s.rev), (rev, rev));
    assert_eq!(rep.rev, rev);
    assert_eq!(req.rev, icfg.rev);
    let enhanced = rev == 2;
    assert_eq!((i.enhanced, s.enhanced), (enhanced, enhanced));

    let crc = icfg.crc || rcfg.crc;
    assert_eq!((i.crc, s.crc), (crc, crc));
    assert_eq!(i.markers_rx, icfg.markers);
    assert_eq!(i.markers_tx, rcfg.markers);
    assert_eq!(s.markers_rx, rcfg.markers);
    assert_eq!(s.markers_tx, icfg.markers);
    assert_eq!(i.framing().markers_tx, s.framing().markers_rx);

    let p2p = enhanced && icfg.p2p && rcfg.p2p;
    let expected_rtr = if p2p {
        pick_rtr(
            &IrdOrd {
                rtr_write: icfg.rtr.write,
                rtr_read: icfg.rtr.read && icfg.ord.min(IRD_ORD_MAX) >= 1,
                rtr_send: icfg.rtr.send,
                ..IrdOrd::default()
            },
            rcfg.rtr,
        )
        .unwrap()
    } else {
        Rtr::InitiatorSendsFirst
    };
    assert_eq!((i.rtr, s.rtr), (expected_rtr, expected_rtr));

    let (iird, iord) = (icfg.ird.min(IRD_ORD_MAX), icfg.ord.min(IRD_ORD_MAX));
    let (aird, aord) = ((*acc_ird).min(IRD_ORD_MAX), (*acc_ord).min(IRD_ORD_MAX));
    if enhanced {
        let cap = aird.max(rcfg.max_ird);
        let mut rird = aird.max(iord).min(cap);
        if expected_rtr == Rtr::ZeroLengthRead {
            rird = rird.max(1);
        }
        assert_eq!(s.ord, aord.min(iird));
        assert_eq!(s.ird, rird);
        assert_eq!(i.ord, iord.min(s.ird));
        assert_eq!(i.ird, s.ord);
        assert!(i.ord <= s.ird && s.ord <= i.ird);
        assert_eq!(rep.ird_ord.map(|w| (w.ird, w.ord)), Some((s.ird, s.ord)));
    } else {
        assert_eq!((i.ird, i.ord), (iird, iord));
        assert_eq!((s.ird, s.ord), (aird, aord));
        assert!(rep.ird_ord.is_none());
    }

    // softrdma discovery.
    let wl = word_len(icfg.rev == 2);
    let i_trailer = icfg.softrdma_ext && wl + icfg.private_data.len() + 8 <= icfg.max_private_data;
    let r_trailer = i_trailer
        && rcfg.softrdma_ext
        && word_len(enhanced) + acc_pd.len() + 8 <= rcfg.max_private_data;
    assert_eq!(i.peer_is_softrdma, r_trailer);
    assert_eq!(s.peer_is_softrdma, r_trailer);
    let flags = if r_trailer { EXT_SUPPORTED } else { 0 };
    assert_eq!((i.ext_flags, s.ext_flags), (flags, flags));

    // Private data both ways; a responder without the extension hands
    // the trailer to its ULP like siw would.
    assert_eq!(&i.peer_private_data, acc_pd);
    let mut seen_by_responder = icfg.private_data.clone();
    if i_trailer && !rcfg.softrdma_ext {
        seen_by_responder.extend_from_slice(&SoftrdmaTrailer::OURS.to_bytes());
    }
    assert_eq!(s.peer_private_data, seen_by_responder);
    let request = r.request.as_ref().unwrap();
    assert_eq!(request.private_data, seen_by_responder);
    assert_eq!(request.peer_is_softrdma, i_trailer && rcfg.softrdma_ext);

    // Start rule and the hold-off.
    let holdoff = if r_trailer {
        Duration::ZERO
    } else {
        icfg.rtr_holdoff
    };
    assert_eq!(i.first_fpdu_not_before, Some(r.now + holdoff));
    assert_eq!(s.first_fpdu_not_before, None);
}

fn cfg(rev: u8, crc: bool, markers: bool, p2p: bool, ext: bool) -> MpaConfig {
    MpaConfig {
        rev,
        crc,
        markers,
        p2p,
        softrdma_ext: ext,
        ..MpaConfig::default()
    }
}

/// Rev 1/2 × CRC × markers × P2P × extension, on each side: 1024
/// combinations, each with its own stream splits (chunks of 1..=7
/// octets).
#[test]
fn negotiation_matrix() {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for bits in 0u32..1024 {
        let b = |k: u32| bits & (1 << k) != 0;
        let mut icfg = cfg(if b(0) { 2 } else { 1 }, b(1), b(2), b(3), b(4));
        let rcfg = cfg(if b(5) { 2 } else { 1 }, b(6), b(7), b(8), b(9));
        icfg.private_data = b"initiator-ulp".to_vec();
        let decision = default_accept();
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut split = Splitter::seeded(seed, 7);
        let r = run(icfg.clone(), rcfg.clone(), &decision, &mut split);
        check_pair(&icfg, &rcfg, &decision, &r);
    }
}

fn arb_rtr() -> impl Strategy<Value = RtrSupport> {
    (any::<bool>(), any::<bool>(), any::<bool>())
        .prop_map(|(write, read, send)| RtrSupport { write, read, send })
        .prop_filter("one kind at least", |r| !r.is_empty())
}

fn arb_cfg() -> impl Strategy<Value = MpaConfig> {
    (
        1u8..=2,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        arb_rtr(),
        (0u16..300, 0u16..300, 0u16..200),
        proptest::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(
            |(rev, crc, markers, p2p, ext, rtr, (ird, ord, max_ird), pd)| MpaConfig {
                rev,
                crc,
                markers,
                p2p,
                rtr,
                ird,
                ord,
                max_ird,
                private_data: pd,
                softrdma_ext: ext,
                ..MpaConfig::default()
            },
        )
}

/// Whether the initiator config can offer an RTR kind the responder
/// takes (else the responder rejects: tested separately).
fn rtr_compatible(i: &MpaConfig, r: &MpaConfig) -> bool {
    if !(i.rev == 2 && r.rev == 2 && i.p2p && r.p2p) {
        return true;
    }
    let offer = IrdOrd {
        rtr_write: i.rtr.write,
        rtr_read: i.rtr.read && i.ord >= 1,
        rtr_send: i.rtr.send,
        ..IrdOrd::default()
    };
    pick_rtr(&offer, r.rtr).is_some()
}

proptest! {
    /// Random configurations, depths, private data and stream splits:
    /// both outcomes agree (or the responder rejects for lack of a
    /// common RTR, and then both ends say so).
    #[test]
    fn prop_negotiation_agrees(
        icfg in arb_cfg(),
        rcfg in arb_cfg(),
        acc_pd in proptest::collection::vec(any::<u8>(), 0..40),
        acc_ird in 0u16..300,
        acc_ord in 0u16..300,
        sizes in proptest::collection::vec(1usize..64, 1..20),
    ) {
        let icfg = if icfg.p2p && icfg.rev == 2 && !icfg.rtr.write && !icfg.rtr.send && icfg.ord == 0 {
            MpaConfig { ord: 1, ..icfg }
        } else {
            icfg
        };
        let decision = Decision::Accept { pd: acc_pd, ird: acc_ird, ord: acc_ord };
        let r = run(icfg.clone(), rcfg.clone(), &decision, &mut Splitter::new(sizes));
        if rtr_compatible(&icfg, &rcfg) {
            check_pair(&icfg, &rcfg, &decision, &r);
        } else {
            prop_assert_eq!(r.responder, Some(Outcome::Failed(MpaError::NoMatchingRtr)));
            prop_assert_eq!(r.initiator, Some(Outcome::Rejected { private_data: vec![] }));
        }
    }

    /// Garbage in any split never panics, never consumes more than it
    /// was given, and never consumes past a frame.
    #[test]
    fn prop_garbage_is_safe(
        data in proptest::collection::vec(any::<u8>(), 0..700),
        prefix_key in 0u8..3,
        sizes in proptest::collection::vec(1usize..80, 1..10),
    ) {
        let mut data = data;
        if data.len() >= 16 {
            match prefix_key {
                0 => data[..16].copy_from_slice(&KEY_REQUEST),
                1 => data[..16].copy_from_slice(&KEY_REPLY),
                _ => {}
            }
        }
        let now = Instant::now();
        let mut res = Responder::new(MpaConfig::default(), now).unwrap();
        let mut ini = Initiator::new(MpaConfig::default(), now).unwrap();
        for side in 0..2 {
            let mut split = Splitter::new(sizes.clone());
            let mut at = 0;
            let mut total = 0;
            while at < data.len() {
                let n = split.next().min(data.len() - at);
                let got = if side == 0 {
                    res.handle_bytes(&data[at..at + n], now)
                } else {
                    ini.handle_bytes(&data[at..at + n], now)
                };
                match got {
                    Ok(c) => { prop_assert!(c <= n); total += c; }
                    Err(_) => break,
                }
                at += n;
            }
            if let Some(len) = frame_len(&data) {
                prop_assert!(total <= len);
            }
        }
        if res.state() == State::RequestReceived {
            prop_assert!(res.accept(b"x", 4, 4).is_ok());
        }
        let _ = res.poll_outcome();
        let _ = ini.poll_outcome();
    }
}

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

/// Feeds `frame` to a fresh responder in one call.
fn responder_fed(cfg: MpaConfig, frame: &[u8]) -> (Responder, Result<usize, MpaError>) {
    let now = Instant::now();
    let mut res = Responder::new(cfg, now).unwrap();
    let got = res.handle_bytes(frame, now);
    (res, got)
}

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

/// Feeds `reply` to an initiator built from `cfg`.
fn initiator_fed(cfg: MpaConfig, reply: &[u8]) -> (Initiator, Result<usize, MpaError>) {
    let now = Instant::now();
    let mut ini = Initiator::new(cfg, now).unwrap();
    let n = ini.poll_transmit().unwrap().len();
    ini.transmitted(n);
    let got = ini.handle_bytes(reply, now);
    (ini, got)
}

fn plain() -> MpaConfig {
    MpaConfig {
        softrdma_ext: false,
        ..MpaConfig::default()
    }
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
