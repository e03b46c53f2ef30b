//! Unit tests of MPA negotiation: real siw frames and a driver that
//! runs both ends against each other through split streams, the
//! negotiation matrix and its property test here; the other topics in
//! their own files.

use super::*;
use proptest::prelude::*;
use softrdma_wire::mpa::{KEY_REPLY, KEY_REQUEST};

mod golden;
mod private_data;
mod rejects;
mod stream;

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

/// Feeds `frame` to a fresh responder in one call.
fn responder_fed(cfg: MpaConfig, frame: &[u8]) -> (Responder, Result<usize, MpaError>) {
    let now = Instant::now();
    let mut res = Responder::new(cfg, now).unwrap();
    let got = res.handle_bytes(frame, now);
    (res, got)
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
