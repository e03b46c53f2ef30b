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
