//! SoftDC invitation protocol and connection table on a seeded, simulated
//! network with a virtual clock: invitations and answers are lost,
//! duplicated and reordered; RC connections and work requests are
//! simulated with delays. Checked at every step and at the end:
//!
//! * every work request completes exactly once: with the right key
//!   successfully, with the wrong key as rejected (bad key), never twice;
//! * no table ever holds more slots than its capacity;
//! * a connection is torn down only when idle (no work request of it
//!   is queued or in flight);
//! * duplicated invitations never make a second target connection: the
//!   target accepts exactly as many RC connections as initiators open;
//! * with direct connection attempts (RC connection request carrying the
//!   key, in parallel with the invitation; some fail, some arrive after
//!   the invitation, some after the initiator gave up), all of the above
//!   still hold and a connection has one target slot, whichever way it
//!   was made.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softrdma_proto::dc::{
    ConnId, DcConfig, DcEvent, DcTable, DcTarget, FailReason, RejectReason, Transmit,
};
use softrdma_proto::wr::DgramAddr;

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

const TARGET_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const RIGHT_KEY: u64 = 0xc0ffee;

fn ini_addr(i: usize) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, 1, i as u8 + 1)),
        port: 5000,
        qpn: 5000 << 8,
    }
}

fn dct_addr(d: u32) -> DgramAddr {
    let qpn = (6000 << 8) | d;
    DgramAddr {
        ip: TARGET_IP,
        port: 6000,
        qpn,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    BadKey,
}

struct Wr {
    ini: usize,
    conn: ConnId,
    expect: Outcome,
    done: u32,
    got: Option<Outcome>,
}

/// Things that happen later.
enum Ev {
    /// A datagram arrives: to the target host (`None`) or initiator `i`.
    Dgram {
        to_ini: Option<usize>,
        from: DgramAddr,
        local_qpn: u32,
        bytes: [u8; softrdma_proto::dc::MSG_LEN],
    },
    /// Initiator `i`'s RC connection request reaches the target.
    RcConnect {
        ini: usize,
        id: ConnId,
        cookie: u64,
        dct: u32,
    },
    /// Initiator `i`'s direct connection request reaches the target.
    DirectConnect {
        ini: usize,
        id: ConnId,
        dct: u32,
        key: u64,
    },
    /// Initiator `i`'s direct attempt fails before reaching the target
    /// (refused, reset).
    DirectFailed { ini: usize, id: ConnId },
    /// A work request in flight completes.
    WrDone(usize),
    /// The target learns that a connection closed.
    TargetClosed(ConnId),
}

struct Net {
    loss: f64,
    dup: f64,
    /// Extra random delay (reordering), in µs.
    jitter_us: u64,
    /// Direct connection attempts: `None` off; `Some(p)`: each fails
    /// with probability `p` before reaching the target.
    direct: Option<f64>,
}

struct World {
    rng: Rng,
    now: Instant,
    queue: BTreeMap<(Instant, u64), Ev>,
    seq: u64,
    inis: Vec<DcTable>,
    tgt: DcTable,
    cap_ini: usize,
    cap_tgt: usize,
    wrs: Vec<Wr>,
    /// Per initiator: connection → work requests queued or in flight.
    pending: Vec<HashMap<ConnId, VecDeque<usize>>>,
    /// Per initiator: connections with an RC connection up.
    up: Vec<HashMap<ConnId, ConnId>>,
    net: Net,
    rc_opened: u64,
    /// Direct attempts that reached the target, and connections they made.
    direct_tried: u64,
    direct_up: u64,
    /// The target's TCP listen port (sent in Accepts).
    listen_port: u16,
}

impl World {
    fn at(&mut self, delay: Duration, ev: Ev) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), ev);
    }

    fn check_capacity(&self) {
        for t in &self.inis {
            assert!(t.live() <= self.cap_ini, "initiator table over capacity");
        }
        assert!(
            self.tgt.live() <= self.cap_tgt,
            "target table over capacity"
        );
    }

    fn send(&mut self, from_ini: Option<usize>, tx: Transmit) {
        let copies = if self.rng.chance(self.net.loss) {
            0
        } else if self.rng.chance(self.net.dup) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = Duration::from_micros(20 + self.rng.below(self.net.jitter_us));
            let ev = match from_ini {
                // Initiator → target host.
                Some(i) => Ev::Dgram {
                    to_ini: None,
                    from: ini_addr(i),
                    local_qpn: tx.to.qpn,
                    bytes: tx.msg.encode(),
                },
                // Target → initiator (by its address).
                None => {
                    let i = usize::from(match tx.to.ip {
                        IpAddr::V4(v4) => v4.octets()[3],
                        IpAddr::V6(_) => unreachable!(),
                    }) - 1;
                    Ev::Dgram {
                        to_ini: Some(i),
                        from: dct_addr(tx.from_dct.expect("target replies name the DCT") & 0xff),
                        local_qpn: tx.to.qpn,
                        bytes: tx.msg.encode(),
                    }
                }
            };
            self.at(delay, ev);
        }
    }

    /// Moves every table's transmits and events into the world.
    fn pump(&mut self) {
        loop {
            let mut any = false;
            for i in 0..self.inis.len() {
                while let Some(tx) = self.inis[i].poll_transmit() {
                    any = true;
                    assert!(tx.from_dct.is_none());
                    self.send(Some(i), tx);
                }
                while let Some(ev) = self.inis[i].poll_event() {
                    any = true;
                    self.on_ini_event(i, ev);
                }
            }
            while let Some(tx) = self.tgt.poll_transmit() {
                any = true;
                self.send(None, tx);
            }
            while let Some(ev) = self.tgt.poll_event() {
                any = true;
                assert!(matches!(ev, DcEvent::KeyRejected { .. }), "{ev:?}");
            }
            self.check_capacity();
            if !any {
                return;
            }
        }
    }

    /// Initiator `ini`'s connection `id` is up (target connection `tid`):
    /// its queued work requests go out.
    fn up(&mut self, ini: usize, id: ConnId, tid: ConnId) {
        let now = self.now;
        self.rc_opened += 1;
        self.inis[ini].connected(id, now);
        assert!(self.inis[ini].is_live(id), "connected, but not live");
        self.up[ini].insert(id, tid);
        let ws: Vec<usize> = self.pending[ini]
            .get(&id)
            .map(|q| q.iter().copied().collect())
            .unwrap_or_default();
        for w in ws {
            let d = Duration::from_micros(10 + self.rng.below(40));
            self.at(d, Ev::WrDone(w));
        }
    }

    fn finish_wr(&mut self, w: usize, got: Outcome) {
        let wr = &mut self.wrs[w];
        wr.done += 1;
        assert_eq!(wr.done, 1, "work request {w} completed twice");
        wr.got = Some(got);
        let (i, conn) = (wr.ini, wr.conn);
        let now = self.now;
        self.inis[i].completed(conn, now);
    }

    fn on_ini_event(&mut self, i: usize, ev: DcEvent) {
        match ev {
            DcEvent::Connect {
                id,
                target,
                port,
                cookie,
            } => {
                assert_eq!(port, self.listen_port);
                let d = Duration::from_micros(50 + self.rng.below(100));
                self.at(
                    d,
                    Ev::RcConnect {
                        ini: i,
                        id,
                        cookie,
                        dct: target.addr.qpn,
                    },
                );
            }
            DcEvent::ConnectDirect { id, target, port } => {
                assert!(self.net.direct.is_some(), "direct attempts are off");
                assert_eq!(port, target.addr.port);
                let d = Duration::from_micros(20 + self.rng.below(200));
                // Nothing of ours listens on another port: refused.
                if port != self.listen_port || self.rng.chance(self.net.direct.unwrap_or(1.0)) {
                    self.at(d, Ev::DirectFailed { ini: i, id });
                } else {
                    self.direct_tried += 1;
                    self.at(
                        d,
                        Ev::DirectConnect {
                            ini: i,
                            id,
                            dct: target.addr.qpn,
                            key: target.key,
                        },
                    );
                }
            }
            DcEvent::Failed { id, reason, .. } => {
                assert_eq!(
                    reason,
                    FailReason::Rejected(RejectReason::BadKey),
                    "only wrong keys may fail here"
                );
                let ws: Vec<usize> = self.pending[i].remove(&id).unwrap_or_default().into();
                for w in ws {
                    self.finish_wr(w, Outcome::BadKey);
                }
            }
            DcEvent::Teardown { id } => {
                let q = self.pending[i].get(&id).map_or(0, |q| q.len());
                assert_eq!(q, 0, "teardown of a connection with work in flight");
                self.pending[i].remove(&id);
                if let Some(tid) = self.up[i].remove(&id) {
                    let d = Duration::from_micros(30);
                    self.at(d, Ev::TargetClosed(tid));
                }
            }
            DcEvent::KeyRejected { .. } => panic!("initiators get no invitations"),
            // Initiators here have no DCTs and accept no connections:
            // nothing to offer, nothing to bind.
            e => panic!("reverse-use event without reverse use: {e:?}"),
        }
    }

    fn post(&mut self, i: usize, dct: u32, key: u64) {
        let target = DcTarget {
            addr: dct_addr(dct),
            key,
            local: 0,
        };
        let now = self.now;
        let (conn, _) = self.inis[i].post(now, target);
        let w = self.wrs.len();
        self.wrs.push(Wr {
            ini: i,
            conn,
            expect: if key == RIGHT_KEY {
                Outcome::Ok
            } else {
                Outcome::BadKey
            },
            done: 0,
            got: None,
        });
        self.pending[i].entry(conn).or_default().push_back(w);
        if self.up[i].contains_key(&conn) {
            let d = Duration::from_micros(10 + self.rng.below(40));
            self.at(d, Ev::WrDone(w));
        }
        self.pump();
    }

    fn step(&mut self) -> bool {
        let next_timer = self
            .inis
            .iter()
            .filter_map(|t| t.poll_timeout())
            .chain(self.tgt.poll_timeout())
            .min();
        let next_ev = self.queue.keys().next().map(|k| k.0);
        let t = match (next_timer, next_ev) {
            (None, None) => return false,
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).expect("one"),
        };
        self.now = self.now.max(t);
        let now = self.now;
        if next_timer.is_some_and(|x| x <= now) {
            for t in &mut self.inis {
                t.handle_timeout(now);
            }
            self.tgt.handle_timeout(now);
            self.pump();
        }
        while let Some((&k, _)) = self.queue.iter().next() {
            if k.0 > now {
                break;
            }
            let ev = self.queue.remove(&k).expect("present");
            self.handle(ev);
            self.pump();
        }
        true
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Dgram {
                to_ini,
                from,
                local_qpn,
                bytes,
            } => match to_ini {
                None => self.tgt.handle_message(now, from, local_qpn, &bytes),
                Some(i) => self.inis[i].handle_message(now, from, local_qpn, &bytes),
            },
            Ev::RcConnect {
                ini,
                id,
                cookie,
                dct,
            } => match self.tgt.target_attach(cookie, dct, id.0) {
                Some(tid) => self.up(ini, id, tid),
                None => self.inis[ini].connect_failed(id, now),
            },
            Ev::DirectConnect { ini, id, dct, key } => {
                let gave_up = !self.pending[ini].contains_key(&id);
                match self.tgt.target_direct(now, ini_addr(ini), dct, key, id.0) {
                    // The initiator no longer wants it (its invitation
                    // failed), or its side of the set-up fails after the
                    // target accepted: the target learns of the close.
                    Some(tid) if gave_up || self.rng.chance(0.05) => {
                        self.rc_opened += 1;
                        self.at(Duration::from_micros(30), Ev::TargetClosed(tid));
                        self.inis[ini].direct_failed(id, now);
                    }
                    Some(tid) => {
                        self.direct_up += 1;
                        self.up(ini, id, tid);
                    }
                    None => self.inis[ini].direct_failed(id, now),
                }
            }
            Ev::DirectFailed { ini, id } => self.inis[ini].direct_failed(id, now),
            Ev::WrDone(w) => {
                let (i, conn) = (self.wrs[w].ini, self.wrs[w].conn);
                if let Some(q) = self.pending[i].get_mut(&conn) {
                    q.retain(|&x| x != w);
                }
                self.finish_wr(w, Outcome::Ok);
            }
            Ev::TargetClosed(tid) => self.tgt.closed(tid, now),
        }
    }
}

fn run(seed: u64, n_ini: usize, cap_ini: usize, cap_tgt: usize, n_dct: u32, net: Net, wrs: usize) {
    let cfg = |cap: usize, s: u64| DcConfig {
        capacity: cap,
        idle_timeout: Duration::from_millis(5),
        invite_timeout: Duration::from_secs(60),
        seed: s,
        direct_connect: net.direct.is_some(),
        ..DcConfig::default()
    };
    let mut tgt = DcTable::new(cfg(cap_tgt, seed ^ 0xabc));
    // With direct attempts, the target mostly listens on the DCTs' port
    // (the attempt can succeed), sometimes elsewhere (it cannot).
    let listen_port = if net.direct.is_some() && seed % 3 != 2 {
        dct_addr(0).port
    } else {
        4791
    };
    tgt.set_listen_port(listen_port);
    for d in 0..n_dct {
        tgt.add_dct(dct_addr(d).qpn, RIGHT_KEY);
    }
    let mut w = World {
        rng: Rng(seed),
        now: Instant::now(),
        queue: BTreeMap::new(),
        seq: 0,
        inis: (0..n_ini)
            .map(|i| DcTable::new(cfg(cap_ini, seed + i as u64)))
            .collect(),
        tgt,
        cap_ini,
        cap_tgt,
        wrs: Vec::new(),
        pending: (0..n_ini).map(|_| HashMap::new()).collect(),
        up: (0..n_ini).map(|_| HashMap::new()).collect(),
        net,
        rc_opened: 0,
        direct_tried: 0,
        direct_up: 0,
        listen_port,
    };
    for _ in 0..wrs {
        // A few steps between posts: traffic overlaps set-up.
        for _ in 0..w.rng.below(4) {
            w.step();
        }
        let i = w.rng.below(n_ini as u64) as usize;
        let dct = w.rng.below(u64::from(n_dct)) as u32;
        let key = if w.rng.chance(0.05) {
            RIGHT_KEY + 1
        } else {
            RIGHT_KEY
        };
        w.post(i, dct, key);
    }
    let mut guard = 0u64;
    while w.step() {
        guard += 1;
        assert!(guard < 10_000_000, "simulation does not settle");
    }
    for (n, wr) in w.wrs.iter().enumerate() {
        assert_eq!(wr.done, 1, "work request {n} completed {} times", wr.done);
        assert_eq!(wr.got, Some(wr.expect), "work request {n}");
    }
    // Everything idle and closed at the end: no slot leaks.
    for t in &w.inis {
        assert_eq!(t.live(), 0);
        assert!(t.stats().max_live <= cap_ini);
    }
    assert_eq!(w.tgt.live(), 0, "target slots leaked");
    let st = w.tgt.stats();
    assert!(st.max_live <= cap_tgt);
    assert_eq!(st.target_accepts, w.rc_opened);
    // Connections started: by an Invite, or by a direct attempt (whose
    // Invite waits for it and is often never sent).
    let opened: u64 = w
        .inis
        .iter()
        .map(|t| t.stats().invites + t.stats().direct_attempts - t.stats().timeouts)
        .sum();
    assert!(w.rc_opened <= opened);
    let attempts: u64 = w.inis.iter().map(|t| t.stats().direct_attempts).sum();
    let connected: u64 = w.inis.iter().map(|t| t.stats().direct_connected).sum();
    assert_eq!(connected, w.direct_up);
    assert!(st.direct_accepts <= w.direct_tried);
    if w.net.direct.is_none() {
        assert_eq!(attempts, 0, "direct attempts while off");
    } else if w.listen_port == dct_addr(0).port {
        assert!(w.direct_up > 0, "direct path not exercised");
        assert!(attempts >= w.direct_tried);
        assert!(
            st.direct_refused > 0,
            "refused direct requests not exercised"
        );
    } else {
        assert!(attempts > 0, "direct path not tried");
        assert_eq!(w.direct_up, 0, "a direct attempt to another port connected");
    }
    if w.net.dup > 0.0 {
        assert!(st.duplicate_invites > 0, "duplication was not exercised");
    }
    if w.net.loss > 0.0 {
        let retx: u64 = w.inis.iter().map(|t| t.stats().retransmits).sum();
        assert!(retx > 0, "loss was not exercised");
    }
    assert!(st.rejected_bad_key > 0, "wrong keys were not exercised");
    let evicted: u64 = w.inis.iter().map(|t| t.stats().evictions).sum();
    assert!(evicted > 0, "LRU eviction was not exercised");
    if cap_tgt < n_ini * cap_ini {
        assert!(st.rejected_busy > 0, "busy targets were not exercised");
    }
}

#[test]
fn clean_network_one_initiator() {
    for direct in [None, Some(0.1)] {
        let net = Net {
            loss: 0.0,
            dup: 0.0,
            jitter_us: 1,
            direct,
        };
        run(1, 1, 4, 64, 12, net, 2000);
    }
}

#[test]
fn loss_duplication_reordering() {
    for seed in 0..6 {
        for direct in [None, Some(0.3)] {
            let net = Net {
                loss: 0.2,
                dup: 0.2,
                jitter_us: 3000,
                direct,
            };
            run(100 + seed, 2, 3, 64, 10, net, 1500);
        }
    }
}

#[test]
fn many_initiators_small_target_table_busy() {
    for seed in 0..3 {
        for direct in [None, Some(0.2)] {
            let net = Net {
                loss: 0.05,
                dup: 0.05,
                jitter_us: 500,
                direct,
            };
            run(200 + seed, 6, 2, 4, 5, net, 1500);
        }
    }
}

#[test]
fn invitation_timeout_fails_only_that_target() {
    let t0 = Instant::now();
    let cfg = DcConfig {
        invite_timeout: Duration::from_millis(100),
        direct_connect: false,
        ..DcConfig::default()
    };
    let mut ini = DcTable::new(cfg);
    let dead = DcTarget {
        addr: dct_addr(1),
        key: 1,
        local: 0,
    };
    let alive = DcTarget {
        addr: dct_addr(2),
        key: 1,
        local: 0,
    };
    let (d, _) = ini.post(t0, dead);
    let (a, _) = ini.post(t0, alive);
    // Answer only the live one.
    let mut now = t0;
    let mut sent_to_dead = 0;
    let mut backoff = Vec::new();
    let mut last = t0;
    loop {
        while let Some(tx) = ini.poll_transmit() {
            if tx.to == dead.addr {
                sent_to_dead += 1;
                backoff.push(now - last);
                last = now;
            } else if !ini.is_live(a) {
                let acc = softrdma_proto::dc::Message {
                    kind: softrdma_proto::dc::MsgKind::Accept,
                    reason: None,
                    port: 1,
                    dct: alive.addr.qpn,
                    conn: tx.msg.conn,
                    key: 0,
                    cookie: 9,
                };
                ini.handle_message(now, alive.addr, 0, &acc.encode());
            }
        }
        while let Some(ev) = ini.poll_event() {
            match ev {
                DcEvent::Connect { id, .. } => {
                    assert_eq!(id, a);
                    ini.connected(a, now);
                }
                DcEvent::Failed { id, reason, .. } => {
                    assert_eq!((id, reason), (d, FailReason::Timeout));
                    assert!(ini.is_live(a));
                    assert!(sent_to_dead >= 5, "{sent_to_dead} transmissions");
                    // Backoff: gaps never shrink.
                    assert!(
                        backoff.windows(2).skip(1).all(|w| w[1] >= w[0]),
                        "{backoff:?}"
                    );
                    return;
                }
                e => panic!("{e:?}"),
            }
        }
        let Some(t) = ini.poll_timeout() else { break };
        now = now.max(t);
        ini.handle_timeout(now);
    }
    panic!("the invitation never timed out");
}

// ----------------------------------------------------------------------
// Reverse use: two peers, each DCI and DCT of the other (docs/dc.md §2).
// ----------------------------------------------------------------------

use softrdma_proto::dc::ReverseOffer;

/// Peer `p`'s address of its initiator UD QP.
fn peer_ctl(p: usize) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, 2, p as u8 + 1)),
        port: 5000,
        qpn: 5000 << 8,
    }
}

/// Peer `p`'s DCT `d`.
fn peer_dct(p: usize, d: u32) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, 2, p as u8 + 1)),
        port: 6000,
        qpn: (6000 << 8) | d,
    }
}

fn peer_of(a: &DgramAddr) -> usize {
    match a.ip {
        IpAddr::V4(v4) => usize::from(v4.octets()[3]) - 1,
        IpAddr::V6(_) => unreachable!(),
    }
}

/// One simulated RC connection: opened by `opener` (initiator
/// connection `id`), accepted by the other peer (target connection
/// `tid`).
struct Link {
    opener: usize,
    tid: ConnId,
    /// The opener's receive side is bound to this DCT of the opener.
    bound: Option<u32>,
    open: bool,
    /// Work requests of the acceptor's reverse use in flight on it.
    reverse_inflight: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum POutcome {
    Ok,
    BadKey,
}

struct PWr {
    peer: usize,
    conn: ConnId,
    dct: u32,
    expect: POutcome,
    done: u32,
    got: Option<POutcome>,
    /// The link it went over and whether as reverse use.
    link: Option<(usize, bool)>,
}

enum PEv {
    Dgram {
        to: usize,
        from: DgramAddr,
        local_qpn: u32,
        bytes: [u8; softrdma_proto::dc::MSG_LEN],
    },
    /// `from`'s connection request (cookie or direct) reaches the other.
    Connect {
        from: usize,
        id: ConnId,
        dct: u32,
        cookie: Option<u64>,
        key: u64,
        offer: Option<ReverseOffer>,
    },
    ConnectFailed {
        from: usize,
        id: ConnId,
        direct: bool,
    },
    WrDone(usize),
    /// Peer `peer` learns that its target connection `tid` closed.
    Closed {
        peer: usize,
        tid: ConnId,
    },
    /// Peer `peer`'s written octets on `tid` are acknowledged.
    Acked {
        peer: usize,
        tid: ConnId,
    },
}

struct Pair {
    rng: Rng,
    now: Instant,
    queue: BTreeMap<(Instant, u64), PEv>,
    seq: u64,
    t: [DcTable; 2],
    cap: [usize; 2],
    n_dct: u32,
    loss: f64,
    dup: f64,
    jitter_us: u64,
    direct_fail: f64,
    wrs: Vec<PWr>,
    pending: [HashMap<ConnId, VecDeque<usize>>; 2],
    /// Per peer: initiator connection → link it runs over (own or, for
    /// reverse use, the peer's).
    up: [HashMap<ConnId, usize>; 2],
    links: Vec<Link>,
    /// Per peer: target connection → link.
    by_tid: [HashMap<ConnId, usize>; 2],
    key_rejections: u64,
    reverse_sent: u64,
    flushed: u64,
}

impl Pair {
    fn at(&mut self, delay: Duration, ev: PEv) {
        self.seq += 1;
        self.queue.insert((self.now + delay, self.seq), ev);
    }

    fn send(&mut self, from: usize, tx: Transmit) {
        let copies = if self.rng.chance(self.loss) {
            0
        } else if self.rng.chance(self.dup) {
            2
        } else {
            1
        };
        let src = match tx.from_dct {
            None => peer_ctl(from),
            Some(d) => peer_dct(from, d & 0xff),
        };
        let to = peer_of(&tx.to);
        assert_ne!(to, from);
        for _ in 0..copies {
            let d = Duration::from_micros(20 + self.rng.below(self.jitter_us));
            self.at(
                d,
                PEv::Dgram {
                    to,
                    from: src,
                    local_qpn: tx.to.qpn,
                    bytes: tx.msg.encode(),
                },
            );
        }
    }

    fn pump(&mut self) {
        loop {
            let mut any = false;
            for p in 0..2 {
                while let Some(tx) = self.t[p].poll_transmit() {
                    any = true;
                    self.send(p, tx);
                }
                while let Some(ev) = self.t[p].poll_event() {
                    any = true;
                    self.on_event(p, ev);
                }
                assert!(self.t[p].live() <= self.cap[p], "table over capacity");
            }
            if !any {
                return;
            }
        }
    }

    /// Work request `w` goes over link `l` now (completes later).
    fn start_wr(&mut self, w: usize, l: usize, reverse: bool) {
        let link = &mut self.links[l];
        assert!(link.open, "work request on a closed connection");
        if reverse {
            // The key was proven: the opener's receive side delivers
            // into exactly the DCT this work request names.
            assert_eq!(link.bound, Some(self.wrs[w].dct), "reverse use unbound");
            link.reverse_inflight += 1;
            self.reverse_sent += 1;
        }
        self.wrs[w].link = Some((l, reverse));
        let d = Duration::from_micros(10 + self.rng.below(40));
        self.at(d, PEv::WrDone(w));
    }

    fn conn_up(&mut self, p: usize, id: ConnId, l: usize, reverse: bool) {
        self.up[p].insert(id, l);
        let ws: Vec<usize> = self.pending[p]
            .get(&id)
            .map(|q| q.iter().copied().collect())
            .unwrap_or_default();
        for w in ws {
            self.start_wr(w, l, reverse);
        }
    }

    fn finish(&mut self, w: usize, got: POutcome) {
        let wr = &mut self.wrs[w];
        wr.done += 1;
        assert_eq!(wr.done, 1, "work request {w} completed twice");
        wr.got = Some(got);
        let (p, conn) = (wr.peer, wr.conn);
        if let Some((l, true)) = wr.link {
            self.links[l].reverse_inflight -= 1;
        }
        if let Some(q) = self.pending[p].get_mut(&conn) {
            q.retain(|&x| x != w);
        }
        let now = self.now;
        self.t[p].completed(conn, now);
    }

    fn offer_of(&mut self, p: usize, id: ConnId) -> Option<ReverseOffer> {
        let dcts: Vec<u32> = (0..self.n_dct).map(|d| peer_dct(p, d).qpn).collect();
        self.t[p].offer(id, &dcts)
    }

    fn on_event(&mut self, p: usize, ev: DcEvent) {
        match ev {
            DcEvent::Connect {
                id, target, cookie, ..
            } => {
                let offer = self.offer_of(p, id);
                let d = Duration::from_micros(50 + self.rng.below(100));
                self.at(
                    d,
                    PEv::Connect {
                        from: p,
                        id,
                        dct: target.addr.qpn,
                        cookie: Some(cookie),
                        key: target.key,
                        offer,
                    },
                );
            }
            DcEvent::ConnectDirect { id, target, .. } => {
                let offer = self.offer_of(p, id);
                let d = Duration::from_micros(20 + self.rng.below(200));
                if self.rng.chance(self.direct_fail) {
                    self.at(
                        d,
                        PEv::ConnectFailed {
                            from: p,
                            id,
                            direct: true,
                        },
                    );
                } else {
                    self.at(
                        d,
                        PEv::Connect {
                            from: p,
                            id,
                            dct: target.addr.qpn,
                            cookie: None,
                            key: target.key,
                            offer,
                        },
                    );
                }
            }
            DcEvent::Failed { id, reason, .. } => {
                assert_eq!(
                    reason,
                    FailReason::Rejected(RejectReason::BadKey),
                    "only wrong keys may fail here"
                );
                let ws: Vec<usize> = self.pending[p].remove(&id).unwrap_or_default().into();
                for w in ws {
                    self.finish(w, POutcome::BadKey);
                }
            }
            DcEvent::Teardown { id } => {
                let q = self.pending[p].get(&id).map_or(0, |q| q.len());
                assert_eq!(q, 0, "teardown of a connection with work in flight");
                self.pending[p].remove(&id);
                if let Some(l) = self.up[p].remove(&id) {
                    let link = &mut self.links[l];
                    assert_eq!(link.opener, p);
                    assert_eq!(
                        link.reverse_inflight, 0,
                        "closed while the peer's reverse work was in flight"
                    );
                    link.open = false;
                    let tid = link.tid;
                    self.at(Duration::from_micros(30), PEv::Closed { peer: 1 - p, tid });
                }
            }
            DcEvent::KeyRejected { .. } => self.key_rejections += 1,
            DcEvent::BindReceive { id, dct } => {
                let l = *self.up[p].get(&id).expect("bound connection is up");
                let link = &mut self.links[l];
                assert_eq!(link.opener, p);
                assert_eq!(link.bound, None, "bound twice");
                assert!(link.open);
                link.bound = Some(dct);
            }
            DcEvent::Bound { id, via } => {
                let l = *self.by_tid[p].get(&via).expect("via a known connection");
                self.conn_up(p, id, l, true);
            }
            DcEvent::Unbound { id } => {
                self.up[p].remove(&id);
                let ws: Vec<usize> = self.pending[p].remove(&id).unwrap_or_default().into();
                for w in ws {
                    // Lost work: the checks at the end fail on it.
                    self.flushed += 1;
                    self.wrs[w].done += 1;
                }
            }
            DcEvent::Drained { id } => {
                let d = Duration::from_micros(5 + self.rng.below(50));
                self.at(d, PEv::Acked { peer: p, tid: id });
            }
        }
    }

    fn post(&mut self, p: usize, dct: u32, key: u64) {
        let target = DcTarget {
            addr: peer_dct(1 - p, dct),
            key,
            local: 0,
        };
        let now = self.now;
        let (conn, _) = self.t[p].post(now, target);
        let w = self.wrs.len();
        self.wrs.push(PWr {
            peer: p,
            conn,
            dct: target.addr.qpn,
            expect: if key == RIGHT_KEY {
                POutcome::Ok
            } else {
                POutcome::BadKey
            },
            done: 0,
            got: None,
            link: None,
        });
        self.pending[p].entry(conn).or_default().push_back(w);
        if let Some(&l) = self.up[p].get(&conn) {
            let reverse = self.links[l].opener != p;
            self.start_wr(w, l, reverse);
        }
        self.pump();
    }

    fn step(&mut self) -> bool {
        let next_timer = self.t.iter().filter_map(|t| t.poll_timeout()).min();
        let next_ev = self.queue.keys().next().map(|k| k.0);
        let t = match (next_timer, next_ev) {
            (None, None) => return false,
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).expect("one"),
        };
        self.now = self.now.max(t);
        let now = self.now;
        if next_timer.is_some_and(|x| x <= now) {
            for t in &mut self.t {
                t.handle_timeout(now);
            }
            self.pump();
        }
        while let Some((&k, _)) = self.queue.iter().next() {
            if k.0 > now {
                break;
            }
            let ev = self.queue.remove(&k).expect("present");
            self.handle(ev);
            self.pump();
        }
        true
    }

    fn handle(&mut self, ev: PEv) {
        let now = self.now;
        match ev {
            PEv::Dgram {
                to,
                from,
                local_qpn,
                bytes,
            } => self.t[to].handle_message(now, from, local_qpn, &bytes),
            PEv::Connect {
                from,
                id,
                dct,
                cookie,
                key,
                offer,
            } => {
                let q = 1 - from;
                let gave_up = !self.pending[from].contains_key(&id);
                let tid = match cookie {
                    Some(c) => self.t[q].target_attach(c, dct, id.0),
                    None => self.t[q].target_direct(now, peer_ctl(from), dct, key, id.0),
                };
                match tid {
                    Some(tid) if gave_up => {
                        self.at(Duration::from_micros(30), PEv::Closed { peer: q, tid });
                        if cookie.is_none() {
                            self.t[from].direct_failed(id, now);
                        }
                    }
                    Some(tid) => {
                        if let Some(o) = offer {
                            self.t[q].accept_offer(tid, o, 0);
                        }
                        let l = self.links.len();
                        self.links.push(Link {
                            opener: from,
                            tid,
                            bound: None,
                            open: true,
                            reverse_inflight: 0,
                        });
                        self.by_tid[q].insert(tid, l);
                        self.t[from].connected(id, now);
                        assert!(self.t[from].is_live(id));
                        self.conn_up(from, id, l, false);
                    }
                    None if cookie.is_some() => self.t[from].connect_failed(id, now),
                    None => self.t[from].direct_failed(id, now),
                }
            }
            PEv::ConnectFailed { from, id, direct } => {
                if direct {
                    self.t[from].direct_failed(id, now);
                } else {
                    self.t[from].connect_failed(id, now);
                }
            }
            PEv::WrDone(w) => {
                if self.wrs[w].done == 0 {
                    self.finish(w, POutcome::Ok);
                }
            }
            PEv::Closed { peer, tid } => {
                self.by_tid[peer].remove(&tid);
                self.t[peer].closed(tid, now);
            }
            PEv::Acked { peer, tid } => self.t[peer].unbound_ready(tid),
        }
    }
}

/// Two peers with tables of `cap` slots and `n_dct` DCTs each, posting
/// to each other's DCTs at random. Each connection takes a slot on both
/// sides, so peers that both fill their tables with invitations to each
/// other would reject each other as busy until the invitations time out
/// (a limit of the table, with or without reverse use): at least one
/// table has room for every connection (`2 n_dct` slots).
fn run_pair(seed: u64, cap: [usize; 2], n_dct: u32, loss: f64, dup: f64, wrs: usize) -> Pair {
    assert!(cap.iter().any(|&c| c >= 2 * n_dct as usize));
    let cfg = |s: u64, p: usize| DcConfig {
        capacity: cap[p],
        idle_timeout: Duration::from_millis(5),
        invite_timeout: Duration::from_secs(60),
        bind_timeout: Duration::from_millis(50),
        seed: s,
        ..DcConfig::default()
    };
    let mk = |p: usize| {
        let mut t = DcTable::new(cfg(seed * 2 + p as u64, p));
        t.set_listen_port(6000);
        for d in 0..n_dct {
            t.add_dct(peer_dct(p, d).qpn, RIGHT_KEY);
        }
        t
    };
    let mut w = Pair {
        rng: Rng(seed),
        now: Instant::now(),
        queue: BTreeMap::new(),
        seq: 0,
        t: [mk(0), mk(1)],
        cap,
        n_dct,
        loss,
        dup,
        jitter_us: if loss > 0.0 { 3000 } else { 1 },
        direct_fail: 0.1,
        wrs: Vec::new(),
        pending: [HashMap::new(), HashMap::new()],
        up: [HashMap::new(), HashMap::new()],
        links: Vec::new(),
        by_tid: [HashMap::new(), HashMap::new()],
        key_rejections: 0,
        reverse_sent: 0,
        flushed: 0,
    };
    for _ in 0..wrs {
        for _ in 0..w.rng.below(4) {
            w.step();
        }
        // Mostly answers to the other side's traffic (ping-pong), so the
        // peer's connection is there to be reused.
        let p = w.rng.below(2) as usize;
        let dct = w.rng.below(u64::from(n_dct)) as u32;
        let key = if w.rng.chance(0.03) {
            RIGHT_KEY + 1
        } else {
            RIGHT_KEY
        };
        w.post(p, dct, key);
    }
    let mut guard = 0u64;
    while w.step() {
        guard += 1;
        assert!(guard < 10_000_000, "simulation does not settle");
    }
    assert_eq!(w.flushed, 0, "work lost to an unbind");
    for (n, wr) in w.wrs.iter().enumerate() {
        assert_eq!(wr.done, 1, "work request {n} completed {} times", wr.done);
        assert_eq!(wr.got, Some(wr.expect), "work request {n}");
    }
    for (p, t) in w.t.iter().enumerate() {
        assert_eq!(t.live(), 0, "slots leaked");
        assert!(t.stats().max_live <= cap[p]);
    }
    assert!(w.links.iter().all(|l| !l.open), "a connection stayed open");
    w
}

/// Sums a counter of both tables.
fn both(w: &Pair, f: impl Fn(&softrdma_proto::dc::DcStats) -> u64) -> u64 {
    w.t.iter().map(|t| f(&t.stats())).sum()
}

#[test]
fn reverse_use_clean_network() {
    let w = run_pair(7, [6, 6], 3, 0.0, 0.0, 3000);
    assert!(both(&w, |s| s.bound) > 0, "reverse use not exercised");
    assert!(w.reverse_sent > 0);
    assert!(both(&w, |s| s.unbinds) > 0, "close handshake not exercised");
    assert!(w.key_rejections > 0, "wrong keys not exercised");
    let fallbacks: u64 = w.t.iter().map(|t| t.stats().bind_fallbacks).sum();
    let refused: u64 = w.t.iter().map(|t| t.stats().binds_refused).sum();
    // Without loss a Bind falls back only when it raced a close.
    assert!(fallbacks <= refused + w.t.iter().map(|t| t.stats().unbinds).sum::<u64>());
}

#[test]
fn reverse_use_loss_duplication_reordering() {
    let (mut bound, mut retx, mut dups, mut unbinds, mut fallbacks) = (0, 0, 0, 0, 0);
    for seed in 0..6 {
        let w = run_pair(300 + seed, [6, 6], 3, 0.2, 0.2, 1500);
        bound += both(&w, |s| s.bound);
        retx += both(&w, |s| s.bind_retransmits);
        dups += both(&w, |s| s.duplicate_binds);
        unbinds += both(&w, |s| s.unbinds);
        fallbacks += both(&w, |s| s.bind_fallbacks);
    }
    assert!(bound > 0, "reverse use not exercised");
    assert!(retx > 0, "Bind loss not exercised");
    assert!(dups > 0, "Bind duplication not exercised");
    assert!(unbinds > 0, "close handshake not exercised");
    assert!(fallbacks > 0, "Bind fallback not exercised");
}

#[test]
fn reverse_use_small_tables_evict_through_handshake() {
    let (mut closing_evictions, mut bound) = (0, 0);
    for seed in 0..6 {
        let w = run_pair(400 + seed, [2, 6], 3, 0.05, 0.05, 1500);
        // Evictions on the small side that went through the handshake.
        closing_evictions += w.t[0].stats().bound_evictions;
        bound += both(&w, |s| s.bound);
    }
    assert!(bound > 0, "reverse use not exercised");
    assert!(closing_evictions > 0, "no eviction of a bound connection");
}
