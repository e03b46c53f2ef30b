//! The SoftDC connection table (`softrdma_proto::dc::DcTable`) driven by
//! what the network, the peers, the application and the engine may do, in
//! any order: invitation-protocol datagrams from a few sources (well
//! formed, with fields drawn from small pools so that they match the
//! table's own connections, DCTs, cookies and nonces, or raw octets), the
//! application's posts, the engine's reports about RC connections
//! (connected, failed, closed, work completed, a request to attach or a
//! direct request, reverse offers) and the passing of time.
//!
//! Holds: nothing panics; the slots in use never exceed the capacity; a
//! datagram that decodes re-encodes to a message that decodes to the same
//! thing; an offer that decodes re-encodes to the same octets; every
//! datagram the table sends decodes.
//!
//! Input: a sequence of operations, each an opcode octet and its operand
//! octets (an exhausted input reads as zeros and ends the run).
#![no_main]
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use softrdma_proto::dc::{
    ConnId, DcConfig, DcEvent, DcTable, DcTarget, Message, MsgKind, RejectReason, ReverseOffer,
    MSG_LEN,
};
use softrdma_proto::wr::DgramAddr;

/// Reads operands; zeros once the input is used up.
struct Input<'a> {
    data: &'a [u8],
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.data.is_empty()
    }
    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |v, _| (v << 8) | u64::from(self.u8()))
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.data.len());
        let (b, rest) = self.data.split_at(n);
        self.data = rest;
        b.to_vec()
    }
    /// A word: even, one seen in `pool` (itself if `pool` is empty);
    /// odd, itself.
    fn word_or_seen(&mut self, pool: &[u64]) -> u64 {
        let w = self.u64();
        if w & 1 == 0 {
            self.pick(pool, w)
        } else {
            w
        }
    }
    /// One of `pool`, or (if empty) `fallback`.
    fn pick<T: Copy>(&mut self, pool: &[T], fallback: T) -> T {
        if pool.is_empty() {
            return fallback;
        }
        pool[usize::from(self.u8()) % pool.len()]
    }
}

/// This table's DCTs and their keys; a third number is unknown here.
const DCTS: [(u32, u64); 2] = [(0x0001_0100, 0xA11CE), (0x0002_0200, 0xB0B)];
const UNKNOWN_DCT: u32 = 0x0003_0300;
/// The number of the initiator's own UD QP (messages to DCIs arrive on it).
const CTL_QPN: u32 = 0x10;
const CAPACITY: usize = 4;

fn source(i: u8) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1 + i % 3)),
        port: 4791 + u16::from(i % 3),
        qpn: [CTL_QPN, DCTS[0].0, 0x0004_0400][usize::from(i / 3) % 3],
    }
}

/// Values seen so far, to send back at the table.
#[derive(Default)]
struct Seen {
    ids: Vec<ConnId>,
    /// Our connection ids as they appear on the wire, peers' ones we met.
    conns: Vec<u64>,
    /// Cookies and nonces (the `cookie` field of every message sent).
    cookies: Vec<u64>,
}

impl Seen {
    fn id(&mut self, id: ConnId) {
        if !self.ids.contains(&id) && self.ids.len() < 64 {
            self.ids.push(id);
        }
    }
    fn word(list: &mut Vec<u64>, w: u64) {
        if w != 0 && !list.contains(&w) && list.len() < 64 {
            list.push(w);
        }
    }
}

fn kind(b: u8) -> MsgKind {
    match b % 8 {
        0 => MsgKind::Invite,
        1 => MsgKind::Accept,
        2 => MsgKind::Reject,
        3 => MsgKind::Bind,
        4 => MsgKind::Unbind,
        5 => MsgKind::Unbound,
        6 => MsgKind::BindAccept,
        _ => MsgKind::BindReject,
    }
}

/// Everything the table wants to send or tell, taken and remembered.
fn drain(t: &mut DcTable, seen: &mut Seen) {
    while let Some(tx) = t.poll_transmit() {
        let b = tx.msg.encode();
        assert_eq!(Message::decode(&b), Ok(tx.msg), "a sent message decodes");
        Seen::word(&mut seen.conns, tx.msg.conn);
        Seen::word(&mut seen.cookies, tx.msg.cookie);
    }
    while let Some(ev) = t.poll_event() {
        match ev {
            DcEvent::Connect { id, cookie, .. } => {
                seen.id(id);
                Seen::word(&mut seen.cookies, cookie);
            }
            DcEvent::ConnectDirect { id, .. }
            | DcEvent::Failed { id, .. }
            | DcEvent::Teardown { id }
            | DcEvent::BindReceive { id, .. }
            | DcEvent::Unbound { id }
            | DcEvent::Drained { id } => seen.id(id),
            DcEvent::Bound { id, via } => {
                seen.id(id);
                seen.id(via);
            }
            DcEvent::KeyRejected { .. } => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input { data };
    let flags = input.u8();
    let mut t = DcTable::new(DcConfig {
        capacity: CAPACITY,
        direct_connect: flags & 1 != 0,
        reverse: flags & 2 == 0,
        seed: u64::from(flags),
        ..DcConfig::default()
    });
    for (dct, key) in DCTS {
        t.add_dct(dct, key);
    }
    t.set_listen_port(7000);
    let start = Instant::now();
    let mut now = start;
    let mut seen = Seen::default();
    let keys = [DCTS[0].1, DCTS[1].1, 7];
    let dcts = [DCTS[0].0, DCTS[1].0, UNKNOWN_DCT];
    let mut steps = 0;
    while !input.done() && steps < 512 {
        steps += 1;
        match input.u8() % 12 {
            // The application posts to a target.
            0 => {
                let s = input.u8();
                let dct = input.pick(&dcts, 0);
                let target = DcTarget {
                    addr: DgramAddr {
                        qpn: dct,
                        ..source(s)
                    },
                    key: input.pick(&keys, 0),
                    local: u32::from(input.u8() % 2),
                };
                let (id, _new) = t.post(now, target);
                seen.id(id);
            }
            // A well-formed message from a peer, fields from the pools.
            1 => {
                let src = source(input.u8());
                let k = kind(input.u8());
                let r = input.u8();
                let msg = Message {
                    kind: k,
                    reason: matches!(k, MsgKind::Reject | MsgKind::BindReject).then(|| {
                        match r % 5 {
                            0 => RejectReason::BadKey,
                            1 => RejectReason::NoSuchDct,
                            2 => RejectReason::Busy,
                            3 => RejectReason::NoConnection,
                            _ => RejectReason::Other(r),
                        }
                    }),
                    port: input.u16(),
                    dct: input.pick(&dcts, 0),
                    conn: input.word_or_seen(&seen.conns),
                    key: input.pick(&keys, 0),
                    cookie: input.word_or_seen(&seen.cookies),
                };
                let local = if input.u8() & 1 == 0 { CTL_QPN } else { msg.dct };
                t.handle_message(now, src, local, &msg.encode());
            }
            // Raw octets from a peer.
            2 => {
                let src = source(input.u8());
                let local = input.pick(&[CTL_QPN, DCTS[0].0, DCTS[1].0], CTL_QPN);
                let n = usize::from(input.u8()) % (MSG_LEN + 8);
                let b = input.bytes(n);
                if let Ok(m) = Message::decode(&b) {
                    assert_eq!(Message::decode(&m.encode()), Ok(m), "decode, encode, decode");
                }
                t.handle_message(now, src, local, &b);
            }
            // Time passes.
            3 => {
                let step = u64::from(input.u8());
                now += Duration::from_micros(step * step * 10);
                t.handle_timeout(now);
            }
            // The engine: an RC connection came up, or failed.
            4 => {
                let id = input.pick(&seen.ids, ConnId(0));
                match input.u8() % 3 {
                    0 => t.connected(id, now),
                    1 => t.connect_failed(id, now),
                    _ => t.direct_failed(id, now),
                }
            }
            // The engine: a connection closed; work completed.
            5 => {
                let id = input.pick(&seen.ids, ConnId(0));
                if input.u8() & 1 == 0 {
                    t.closed(id, now);
                } else {
                    t.completed(id, now);
                }
            }
            // A connection request presenting a cookie.
            6 => {
                let cookie = input.pick(&seen.cookies, 1);
                let dct = input.pick(&dcts, 0);
                let conn = input.pick(&seen.conns, 1);
                if let Some(id) = t.target_attach(cookie, dct, conn) {
                    seen.id(id);
                }
            }
            // A direct connection request.
            7 => {
                let src = source(input.u8());
                let dct = input.pick(&dcts, 0);
                let key = input.pick(&keys, 0);
                let conn = input.u64();
                if let Some(id) = t.target_direct(now, src, dct, key, conn) {
                    seen.id(id);
                }
            }
            // Reverse use: this side offers its DCTs over a connection.
            8 => {
                let id = input.pick(&seen.ids, ConnId(0));
                let n = usize::from(input.u8()) % 20;
                let offered: Vec<u32> = (0..n).map(|i| dcts[i % dcts.len()]).collect();
                if let Some(offer) = t.offer(id, &offered) {
                    Seen::word(&mut seen.cookies, offer.nonce);
                }
            }
            // Reverse use: a peer's offer on a connection, as raw octets
            // or naming DCTs this input posts to.
            9 => {
                let id = input.pick(&seen.ids, ConnId(0));
                let n = usize::from(input.u8());
                let offer = if n & 1 == 0 {
                    let tail = input.bytes(n % 80);
                    let offer = ReverseOffer::decode(&tail);
                    if let Some(o) = &offer {
                        let mut again = Vec::new();
                        o.encode(&mut again);
                        assert_eq!(again, tail, "an offer re-encodes to its octets");
                    }
                    offer
                } else {
                    Some(ReverseOffer {
                        nonce: input.u64() | 1,
                        dcts: (0..1 + n % 3).map(|i| dcts[(n / 4 + i) % dcts.len()]).collect(),
                    })
                };
                if let Some(offer) = offer {
                    Seen::word(&mut seen.cookies, offer.nonce);
                    t.accept_offer(id, offer, u32::from(input.u8() % 2));
                }
            }
            // Reverse use: the work on a connection being unbound is done.
            10 => {
                let id = input.pick(&seen.ids, ConnId(0));
                t.unbound_ready(id);
                let _ = t.bound_via(id);
                let _ = t.is_live(id);
            }
            // DCTs come and go.
            _ => {
                let (dct, key) = DCTS[usize::from(input.u8()) % DCTS.len()];
                if input.u8() & 1 == 0 {
                    t.remove_dct(dct);
                } else {
                    t.add_dct(dct, key);
                }
            }
        }
        drain(&mut t, &mut seen);
        assert!(
            t.live() <= CAPACITY,
            "{} slots in use, capacity {CAPACITY}",
            t.live()
        );
        let _ = t.target_connections().count();
        let _ = t.poll_timeout();
    }
});
