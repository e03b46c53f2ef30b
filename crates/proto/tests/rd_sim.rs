//! The RD reliability layer on a seeded, simulated UDP network with a
//! virtual clock: loss, reordering, duplication and corruption (caught by
//! the datagram CRC), one-to-one and one server to 1 000 clients.
//!
//! Every datagram really goes through the wire format: the endpoint's shim
//! and a DDP Send segment whose payload is rebuilt from the token (the
//! message number) on every (re)transmission, CRC over both, parsed back
//! with `softrdma_wire::rd::parse` at the receiver.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softrdma_proto::rd::{Event, RdConfig, RdEndpoint, Transmit, Verdict};
use softrdma_proto::wr::DgramAddr;
use softrdma_wire::rd::{self as wrd, Datagram};
use softrdma_wire::rdmap::{Opcode, RdmapBody, SegmentRepr};

/// splitmix64: small, seedable, good enough for a network model.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Debug, Clone, Copy)]
struct Link {
    loss: f64,
    dup: f64,
    corrupt: f64,
    reorder: f64,
    delay: Duration,
    jitter: Duration,
}

impl Link {
    fn clean() -> Link {
        Link {
            loss: 0.0,
            dup: 0.0,
            corrupt: 0.0,
            reorder: 0.0,
            delay: Duration::from_micros(50),
            jitter: Duration::ZERO,
        }
    }
    /// `loss` of the datagrams lost, a quarter as many corrupted and as
    /// many duplicated, 1 % overtaken by later ones (when `loss > 0`).
    fn lossy(loss: f64) -> Link {
        Link {
            loss,
            dup: loss / 4.0,
            corrupt: loss / 4.0,
            reorder: if loss > 0.0 { 0.01 } else { 0.0 },
            delay: Duration::from_micros(50),
            jitter: Duration::from_micros(20),
        }
    }
}

/// Token = message: incarnation of the sender in the high half, sequence
/// number in the low half.
type Tok = u64;

const PORT: u16 = 4791;

fn addr(i: usize) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, (i >> 8) as u8, (i & 0xff) as u8)),
        port: PORT,
        qpn: (u32::from(PORT) << 8) | 1,
    }
}

struct Node {
    me: DgramAddr,
    cfg: RdConfig,
    ep: RdEndpoint<DgramAddr, Tok>,
    incarnation: u64,
    /// Delivered messages per source, in delivery order, with the
    /// receiver incarnation that got them.
    delivered: HashMap<DgramAddr, Vec<(u64, Tok)>>,
    acked: HashMap<DgramAddr, Vec<Tok>>,
    abandoned: HashMap<DgramAddr, Vec<Tok>>,
    failed: Vec<(DgramAddr, Instant)>,
    expired: usize,
    sessions: usize,
    resyncs: usize,
    /// Messages still to send, per destination.
    backlog: BTreeMap<usize, u64>,
    next_seq: HashMap<usize, u64>,
    /// Reply to every delivered message with one of our own.
    echo: bool,
    max_unacked: usize,
    /// Tokens given to `send` and tokens acked or abandoned since.
    tokens_sent: u64,
    tokens_done: u64,
}

impl Node {
    fn new(i: usize, cfg: RdConfig) -> Node {
        Node {
            me: addr(i),
            cfg,
            ep: RdEndpoint::new(cfg).unwrap(),
            incarnation: 0,
            delivered: HashMap::new(),
            acked: HashMap::new(),
            abandoned: HashMap::new(),
            failed: Vec::new(),
            expired: 0,
            sessions: 0,
            resyncs: 0,
            backlog: BTreeMap::new(),
            next_seq: HashMap::new(),
            echo: false,
            max_unacked: 0,
            tokens_sent: 0,
            tokens_done: 0,
        }
    }

    /// Forgets all protocol state, as a restarted process would; the
    /// application keeps counting its messages in a new incarnation.
    fn restart(&mut self, epoch_seed: u32) {
        self.cfg.epoch_seed = epoch_seed;
        self.ep = RdEndpoint::new(self.cfg).unwrap();
        self.incarnation += 1;
        self.next_seq.clear();
        self.tokens_sent = 0;
        self.tokens_done = 0;
    }
}

/// A datagram on the wire: arrival, tie-break, destination node, UDP
/// source, octets.
type InFlight = (Instant, u64, usize, DgramAddr, Vec<u8>);

struct Sim {
    now: Instant,
    rng: Rng,
    link: Link,
    net: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// Last arrival per (from, to): jitter alone keeps a path FIFO; only
    /// `reorder` lets a datagram be overtaken.
    fifo: HashMap<(usize, usize), Instant>,
    nodes: Vec<Node>,
    by_ip: HashMap<IpAddr, usize>,
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
    /// Nodes whose traffic (both ways) vanishes.
    silent: HashSet<usize>,
    crc_drops: u64,
    sent: u64,
}

/// `RD_SIM_SEED=n` shifts every seed, for soak runs over many networks.
fn seed_offset() -> u64 {
    std::env::var("RD_SIM_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |n| n.wrapping_mul(0x1_0000))
}

impl Sim {
    fn new(seed: u64, link: Link, cfgs: Vec<RdConfig>) -> Sim {
        let nodes: Vec<Node> = cfgs
            .into_iter()
            .enumerate()
            .map(|(i, c)| Node::new(i, c))
            .collect();
        let by_ip = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.me.ip, i))
            .collect();
        Sim {
            now: Instant::now(),
            rng: Rng(seed ^ seed_offset()),
            link,
            net: BinaryHeap::new(),
            seq: 0,
            fifo: HashMap::new(),
            nodes,
            by_ip,
            timers: BinaryHeap::new(),
            silent: HashSet::new(),
            crc_drops: 0,
            sent: 0,
        }
    }

    fn queue_msgs(&mut self, from: usize, to: usize, n: u64) {
        *self.nodes[from].backlog.entry(to).or_default() += n;
        self.flush(from);
    }

    /// Application: keep up to 64 tokens queued per destination.
    fn pump(&mut self, i: usize) {
        let now = self.now;
        let node = &mut self.nodes[i];
        let dests: Vec<usize> = node.backlog.keys().copied().collect();
        for d in dests {
            let peer = addr(d);
            while node.backlog[&d] > 0 && node.ep.queued(&peer) < 64 {
                let seq = node.next_seq.entry(d).or_default();
                let tok = (node.incarnation << 32) | *seq;
                match node.ep.send(peer, tok, now) {
                    Ok(()) => {
                        *seq += 1;
                        node.tokens_sent += 1;
                        *node.backlog.get_mut(&d).unwrap() -= 1;
                    }
                    Err(e) => panic!("send: {e}"),
                }
            }
            if node.backlog[&d] == 0 {
                node.backlog.remove(&d);
            }
        }
    }

    fn flush(&mut self, i: usize) {
        self.events(i);
        self.pump(i);
        while let Some(t) = self.nodes[i].ep.poll_transmit(self.now) {
            let u = self.nodes[i].ep.unacked(&t.peer);
            let node = &mut self.nodes[i];
            node.max_unacked = node.max_unacked.max(u);
            assert!(u <= usize::from(node.cfg.tx_window), "unacked {u}");
            self.transmit(i, t);
        }
        self.events(i);
        if let Some(at) = self.nodes[i].ep.poll_timeout() {
            self.timers.push(Reverse((at, i)));
        }
    }

    fn transmit(&mut self, from: usize, t: Transmit<DgramAddr, Tok>) {
        // Rebuild the segment from the token: nothing was kept but the token.
        let mut buf = [0u8; 128];
        let n = match t.token {
            Some(tok) => {
                let seg =
                    SegmentRepr::untagged(Opcode::Send, 0, tok as u32, 0, true, RdmapBody::None);
                wrd::emit_into(&t.shim, Some((&seg, &tok.to_be_bytes())), &mut buf)
            }
            None => wrd::emit_into(&t.shim, None, &mut buf),
        };
        let to = self.by_ip[&t.peer.ip];
        self.sent += 1;
        let copies = if self.rng.chance(self.link.dup) { 2 } else { 1 };
        for _ in 0..copies {
            if self.silent.contains(&from) || self.silent.contains(&to) {
                continue;
            }
            if self.rng.chance(self.link.loss) {
                continue;
            }
            let mut d = buf[..n].to_vec();
            if self.rng.chance(self.link.corrupt) {
                let bit = self.rng.below(n as u64 * 8) as usize;
                d[bit / 8] ^= 1 << (bit % 8);
            }
            let mut delay = self.link.delay;
            if !self.link.jitter.is_zero() {
                delay += self
                    .link
                    .jitter
                    .mul_f64(self.rng.below(1000) as f64 / 1000.0);
            }
            let at = if self.rng.chance(self.link.reorder) {
                // Held back: later datagrams overtake it.
                self.now + delay + self.link.delay * (1 + self.rng.below(8) as u32)
            } else {
                let last = self.fifo.entry((from, to)).or_insert(self.now);
                *last = (*last).max(self.now + delay);
                *last
            };
            self.seq += 1;
            let src = self.nodes[from].me;
            self.net.push(Reverse((at, self.seq, to, src, d)));
        }
    }

    fn events(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        while let Some(e) = node.ep.poll_event() {
            match e {
                Event::Acked { peer, token } => {
                    node.tokens_done += 1;
                    node.acked.entry(peer).or_default().push(token)
                }
                Event::Abandoned { peer, token } => {
                    node.tokens_done += 1;
                    node.abandoned.entry(peer).or_default().push(token)
                }
                Event::PeerFailed { peer, .. } => {
                    // The application stops talking to a failed peer.
                    node.backlog.remove(&self.by_ip[&peer.ip]);
                    node.failed.push((peer, self.now))
                }
                Event::PeerExpired { .. } => node.expired += 1,
                Event::SessionStarted { .. } => node.sessions += 1,
                Event::Resynced { .. } => node.resyncs += 1,
            }
        }
    }

    fn arrive(&mut self, to: usize, src_udp: DgramAddr, bytes: &[u8]) {
        let (shim, segment) = match wrd::parse(bytes) {
            Ok(Datagram::Rd { shim, segment }) => (shim, segment),
            Ok(Datagram::Ud { .. }) => panic!("UD datagram in an RD test"),
            Err(_) => {
                self.crc_drops += 1;
                return;
            }
        };
        let src = DgramAddr {
            qpn: shim.src_qpn,
            ..src_udp
        };
        let now = self.now;
        let v = self.nodes[to].ep.handle_datagram(src, &shim, now);
        if v == Verdict::Deliver {
            let (_, payload) = segment.expect("a delivered datagram has a segment");
            let tok = u64::from_be_bytes(payload.try_into().unwrap());
            let node = &mut self.nodes[to];
            let inc = node.incarnation;
            node.delivered.entry(src).or_default().push((inc, tok));
            if node.echo {
                let from = self.by_ip[&src.ip];
                *node.backlog.entry(from).or_default() += 1;
            }
        }
        self.flush(to);
    }

    /// Runs until nothing is scheduled or `until` passes.
    fn run_until(&mut self, until: Instant) {
        loop {
            let next_net = self.net.peek().map(|Reverse(e)| e.0);
            let next_timer = self.timers.peek().map(|Reverse(e)| e.0);
            let next = match (next_net, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(x) => x,
                    None => {
                        self.now = self.now.max(until);
                        return;
                    }
                },
            };
            if next > until {
                self.now = until;
                return;
            }
            self.now = self.now.max(next);
            while self.net.peek().is_some_and(|Reverse(e)| e.0 <= self.now) {
                let Reverse((_, _, to, src, d)) = self.net.pop().unwrap();
                self.arrive(to, src, &d);
            }
            let mut due = Vec::new();
            while self.timers.peek().is_some_and(|Reverse(e)| e.0 <= self.now) {
                due.push(self.timers.pop().unwrap().0 .1);
            }
            due.sort_unstable();
            due.dedup();
            for i in due {
                let now = self.now;
                self.nodes[i].ep.handle_timeout(now);
                self.flush(i);
            }
        }
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        self.run_until(until);
    }

    /// Runs until every node has sent and had acknowledged all it queued.
    fn run_to_completion(&mut self, limit: Duration) {
        let until = self.now + limit;
        while self.now < until {
            self.run_for(Duration::from_millis(50));
            let busy = self
                .nodes
                .iter()
                .any(|n| !n.backlog.is_empty() || n.tokens_sent > n.tokens_done);
            if !busy {
                return;
            }
        }
        panic!("not complete after {limit:?}");
    }

    fn delivered(&self, at: usize, from: usize) -> Vec<Tok> {
        self.nodes[at]
            .delivered
            .get(&addr(from))
            .map(|v| v.iter().map(|&(_, t)| t).collect())
            .unwrap_or_default()
    }
}

fn cfg() -> RdConfig {
    RdConfig {
        local_qpn: addr(0).qpn,
        tx_window: 32,
        rx_window: 32,
        ..RdConfig::default()
    }
}

fn cfgs(n: usize, c: RdConfig) -> Vec<RdConfig> {
    (0..n)
        .map(|i| RdConfig {
            epoch_seed: 1000 + 7919 * i as u32,
            ..c
        })
        .collect()
}

fn seqs(n: u64) -> Vec<Tok> {
    (0..n).collect()
}

#[test]
fn rd_one_to_one_exactly_once_in_order_under_loss() {
    const N: u64 = 1500;
    for (seed, loss) in [(1, 0.0), (2, 0.01), (3, 0.05), (4, 0.10), (5, 0.20)] {
        let mut c = cfg();
        // At 20 % loss per direction a retry limit of 7 is too short to be
        // sure of never failing; the limit is a policy, not the subject here.
        c.retry_limit = 12;
        c.rto_max = Duration::from_millis(200);
        let mut sim = Sim::new(seed, Link::lossy(loss), cfgs(2, c));
        let t0 = sim.now;
        sim.queue_msgs(0, 1, N);
        sim.queue_msgs(1, 0, N);
        sim.run_to_completion(Duration::from_secs(600));
        for (a, b) in [(0, 1), (1, 0)] {
            assert_eq!(sim.delivered(b, a), seqs(N), "loss {loss}: {a}->{b}");
            assert_eq!(sim.nodes[a].acked[&addr(b)], seqs(N), "acks {a}->{b}");
            assert!(sim.nodes[a].failed.is_empty());
        }
        let st: Vec<_> = sim.nodes.iter().map(|n| *n.ep.stats()).collect();
        let retx = st[0].retransmitted + st[1].retransmitted;
        let first = st[0].data_sent + st[1].data_sent;
        assert_eq!(first, 2 * N, "each token sent once, then only re-sent");
        // Go-back-N: each loss (or reordering) costs at most about a
        // window's worth of re-sends.
        let events = 2.0 * N as f64 * (loss + Link::lossy(loss).reorder);
        let bound = (events * 2.0 * f64::from(c.tx_window)) as u64 + 20;
        println!(
            "loss {loss:4}: retransmitted {retx:6} (bound {bound}), crc drops {}, \
             timeouts {}, fast {}, dup {} ooo {}, max unacked {}, t = {:?}",
            sim.crc_drops,
            st[0].timeouts + st[1].timeouts,
            st[0].fast_retransmits + st[1].fast_retransmits,
            st[0].duplicates + st[1].duplicates,
            st[0].out_of_order + st[1].out_of_order,
            sim.nodes[0].max_unacked.max(sim.nodes[1].max_unacked),
            sim.now - t0,
        );
        assert!(retx <= bound, "retransmitted {retx} > {bound}");
        if loss == 0.0 {
            assert_eq!(retx, 0);
            assert_eq!(sim.crc_drops, 0);
        } else {
            assert!(sim.crc_drops > 0, "corruption was exercised");
        }
        // Piggybacking: with traffic both ways, control datagrams are a
        // minority.
        if loss == 0.0 {
            let ctl = st[0].control_sent + st[1].control_sent;
            assert!(ctl < first / 2, "control {ctl} vs data {first}");
        }
    }
}

#[test]
fn rd_window_bounds_unacked() {
    const N: u64 = 400;
    for (seed, w) in [(8, 1u16), (9, 4), (10, 32)] {
        let mut c = cfg();
        c.tx_window = w;
        c.rx_window = 64;
        c.initial_peer_window = 64;
        let mut sim = Sim::new(seed, Link::lossy(0.05), cfgs(2, c));
        sim.queue_msgs(0, 1, N);
        sim.run_to_completion(Duration::from_secs(60));
        assert_eq!(sim.delivered(1, 0), seqs(N));
        // `flush` asserts `unacked <= tx_window` after every datagram.
        assert_eq!(sim.nodes[0].max_unacked, usize::from(w));
    }
    // The receiver's advertised window binds as well.
    let mut c = cfg();
    c.tx_window = 32;
    c.initial_peer_window = 2;
    let mut r = c;
    r.rx_window = 3;
    r.epoch_seed = 5;
    let mut sim = Sim::new(12, Link::lossy(0.05), vec![c, r]);
    sim.queue_msgs(0, 1, 200);
    sim.run_to_completion(Duration::from_secs(60));
    assert_eq!(sim.delivered(1, 0), seqs(200));
    assert_eq!(sim.nodes[0].max_unacked, 3);
}

#[test]
fn rd_window_throughput_scales_with_window() {
    // One message per RTT with W = 1; W per RTT with W > 1.
    const N: u64 = 256;
    let rtt = Duration::from_micros(100);
    let mut times = Vec::new();
    for w in [1u16, 8] {
        let mut c = cfg();
        c.tx_window = w;
        let mut sim = Sim::new(11, Link::clean(), cfgs(2, c));
        let t0 = sim.now;
        sim.queue_msgs(0, 1, N);
        // Step finely to find the moment the last ACK arrives.
        while sim.nodes[0].ep.stats().acked < N {
            sim.run_for(Duration::from_micros(10));
            assert!(sim.now - t0 < Duration::from_secs(10));
        }
        times.push(sim.now - t0);
        assert_eq!(sim.nodes[0].max_unacked, usize::from(w));
        assert_eq!(sim.nodes[0].ep.stats().retransmitted, 0);
    }
    // W = 1: each message waits for its ACK (P on the tail makes it
    // immediate), so about one RTT per message.
    assert!(times[0] >= rtt * (N as u32 - 1), "{times:?}");
    assert!(times[0] <= rtt * (N as u32 + 8), "{times:?}");
    // W = 8: at least 4x faster.
    assert!(times[1] * 4 <= times[0], "{times:?}");
}

#[test]
fn rd_server_and_1000_clients() {
    const CLIENTS: usize = 1000;
    const M: u64 = 10;
    let mut c = cfg();
    c.max_peers = 2000;
    let mut sim = Sim::new(21, Link::lossy(0.05), cfgs(CLIENTS + 1, c));
    sim.nodes[0].echo = true;
    for i in 1..=CLIENTS {
        sim.queue_msgs(i, 0, M);
    }
    sim.run_to_completion(Duration::from_secs(600));
    for i in 1..=CLIENTS {
        assert_eq!(sim.delivered(0, i), seqs(M), "server from {i}");
        assert_eq!(sim.delivered(i, 0), seqs(M), "client {i} from server");
        assert_eq!(sim.nodes[i].acked[&addr(0)], seqs(M));
    }
    assert!(sim.nodes.iter().all(|n| n.failed.is_empty()));
    let server = &sim.nodes[0];
    assert_eq!(server.ep.peer_count(), CLIENTS);
    assert_eq!(server.sessions, CLIENTS, "one session per client");
    let st = server.ep.stats();
    println!(
        "server: delivered {} dup {} ooo {} retx {} of {} control {} crc drops {}",
        st.delivered,
        st.duplicates,
        st.out_of_order,
        st.retransmitted,
        st.data_sent,
        st.control_sent,
        sim.crc_drops
    );
    assert!(st.retransmitted < st.data_sent, "retransmissions sane");

    // Ten clients stay busy; the other 990 go quiet and their entries expire.
    let idle = c.idle_timeout;
    let t_end = sim.now + idle * 2;
    while sim.now < t_end {
        for i in 1..=10 {
            sim.queue_msgs(i, 0, 1);
        }
        sim.run_for(Duration::from_millis(100));
    }
    sim.run_for(Duration::from_millis(50));
    let server = &sim.nodes[0];
    assert_eq!(server.ep.peer_count(), 10, "only the active peers remain");
    assert_eq!(server.expired, CLIENTS - 10);
    for i in 1..=10 {
        assert!(server.ep.has_peer(&addr(i)));
        let d = sim.delivered(0, i);
        assert_eq!(d, seqs(d.len() as u64), "client {i} still in order");
    }
    for i in 11..=CLIENTS {
        assert_eq!(
            sim.nodes[i].ep.peer_count(),
            0,
            "client {i} forgot the server"
        );
    }
    // And when everyone is quiet, nothing is left.
    sim.run_for(idle + Duration::from_secs(1));
    assert_eq!(sim.nodes[0].ep.peer_count(), 0);
    assert!(sim.nodes.iter().all(|n| n.ep.peer_count() == 0));
}

#[test]
fn rd_silent_peer_fails_alone() {
    const CLIENTS: usize = 50;
    const M: u64 = 1000;
    let c = cfg();
    let mut sim = Sim::new(31, Link::lossy(0.02), cfgs(CLIENTS + 1, c));
    for i in 1..=CLIENTS {
        sim.queue_msgs(0, i, M);
    }
    sim.run_for(Duration::from_millis(1));
    let t_silent = sim.now;
    sim.silent.insert(7);
    sim.run_to_completion(Duration::from_secs(60));
    let server = &sim.nodes[0];
    assert_eq!(server.failed.len(), 1);
    let (who, when) = server.failed[0];
    assert_eq!(who, addr(7));
    let span = c.give_up_span();
    assert!(
        when - t_silent <= span + Duration::from_millis(100),
        "{:?}",
        when - t_silent
    );
    // Every token of the failed peer was either acked or abandoned, in order.
    let acked = server.acked.get(&addr(7)).cloned().unwrap_or_default();
    let abandoned = &server.abandoned[&addr(7)];
    let mut all = acked.clone();
    all.extend_from_slice(abandoned);
    assert_eq!(all, seqs(all.len() as u64));
    assert!(!abandoned.is_empty());
    // Client 7 got a prefix of what the server sent (exactly once, in order).
    let got = sim.delivered(7, 0);
    assert_eq!(got, seqs(got.len() as u64));
    assert!(got.len() >= acked.len());
    // Everyone else got everything.
    for i in (1..=CLIENTS).filter(|&i| i != 7) {
        assert_eq!(sim.delivered(i, 0), seqs(M), "client {i}");
        assert_eq!(server.acked[&addr(i)], seqs(M));
    }
}

/// Checks what one receiver incarnation got from one sender: strictly
/// increasing within each sender incarnation, and sender incarnations in
/// order (nothing of an older one after a newer one started).
fn check_stream(got: &[Tok]) {
    let mut last: Option<Tok> = None;
    for &t in got {
        if let Some(l) = last {
            let (li, ls) = (l >> 32, l & 0xffff_ffff);
            let (ti, ts) = (t >> 32, t & 0xffff_ffff);
            assert!(ti > li || (ti == li && ts == ls + 1), "{l:#x} then {t:#x}");
            if ti > li {
                assert_eq!(ts, 0, "a new sender incarnation starts at 0");
            }
        } else {
            assert_eq!(t & 0xffff_ffff, 0, "starts at the first message");
        }
        last = Some(t);
    }
}

#[test]
fn rd_restarted_sender_resynchronises() {
    // Newer epoch seed (the normal case) and an older one (clock went back):
    // the second goes through a reset and the floor.
    for (seed, epoch_seed) in [(41, 1_000_000u32), (42, 3)] {
        let mut sim = Sim::new(seed, Link::lossy(0.05), cfgs(2, cfg()));
        sim.queue_msgs(0, 1, 300);
        while sim.delivered(1, 0).len() < 20 {
            sim.run_for(Duration::from_micros(100));
        }
        // Node 0 crashes and comes back with no state; its application
        // starts a new stream of messages.
        sim.nodes[0].backlog.clear();
        sim.nodes[0].restart(epoch_seed);
        sim.queue_msgs(0, 1, 200);
        sim.run_to_completion(Duration::from_secs(60));
        let got = sim.delivered(1, 0);
        check_stream(&got);
        let new: Vec<Tok> = got.iter().copied().filter(|t| t >> 32 == 1).collect();
        assert_eq!(new, (0..200).map(|s| (1 << 32) | s).collect::<Vec<_>>());
        assert!(
            got.iter().any(|t| t >> 32 == 0),
            "old stream partly through"
        );
        assert_eq!(sim.nodes[1].sessions, 2, "the restart is a new session");
        assert!(sim.nodes[0].failed.is_empty());
        if epoch_seed == 3 {
            assert!(
                sim.nodes[0].resyncs >= 1,
                "older epoch went through a reset"
            );
        }
    }
}

#[test]
fn rd_restarted_receiver_resynchronises_without_loss() {
    let mut sim = Sim::new(51, Link::lossy(0.05), cfgs(2, cfg()));
    sim.queue_msgs(0, 1, 600);
    while sim.delivered(1, 0).len() < 50 {
        sim.run_for(Duration::from_micros(100));
    }
    let before = sim.delivered(1, 0).len();
    assert!(before > 0 && before < 600);
    sim.nodes[1].restart(777);
    sim.run_to_completion(Duration::from_secs(60));
    let all = &sim.nodes[1].delivered[&addr(0)];
    let old: Vec<Tok> = all.iter().filter(|e| e.0 == 0).map(|e| e.1).collect();
    let new: Vec<Tok> = all.iter().filter(|e| e.0 == 1).map(|e| e.1).collect();
    // Each incarnation saw an exactly-once, in-order run; together they
    // cover every message (the sender re-sent what the old one had not
    // acknowledged) and leave no gap.
    assert_eq!(old, seqs(old.len() as u64));
    assert!(!new.is_empty());
    let first = new[0];
    assert!(
        first <= old.len() as u64,
        "no gap: {first} after {}",
        old.len()
    );
    assert_eq!(new, (first..600).collect::<Vec<_>>());
    assert_eq!(sim.nodes[0].acked[&addr(1)], seqs(600));
    assert!(sim.nodes[0].resyncs >= 1);
    assert!(sim.nodes[0].failed.is_empty());
}

#[test]
fn rd_expired_state_resynchronises_without_duplicates() {
    let c = cfg();
    let mut sim = Sim::new(61, Link::lossy(0.05), cfgs(2, c));
    sim.queue_msgs(0, 1, 100);
    sim.queue_msgs(1, 0, 100);
    sim.run_to_completion(Duration::from_secs(60));
    // Both forget each other, then talk again.
    sim.run_for(c.idle_timeout + Duration::from_secs(1));
    assert_eq!(sim.nodes[0].ep.peer_count(), 0);
    assert_eq!(sim.nodes[1].ep.peer_count(), 0);
    sim.queue_msgs(0, 1, 100);
    sim.run_to_completion(Duration::from_secs(60));
    assert_eq!(sim.delivered(1, 0), seqs(200));
    assert_eq!(sim.nodes[0].acked[&addr(1)], seqs(200));
    // A session paused for more than idle/2 restarts cleanly too.
    sim.run_for(c.idle_timeout / 2 + Duration::from_millis(1));
    assert_eq!(sim.nodes[1].ep.peer_count(), 1);
    sim.queue_msgs(0, 1, 100);
    sim.run_to_completion(Duration::from_secs(60));
    assert_eq!(sim.delivered(1, 0), seqs(300));
    assert_eq!(sim.nodes[1].sessions, 3);
}

#[test]
fn rd_zero_window_stalls_then_resumes() {
    let mut sim = Sim::new(71, Link::lossy(0.02), cfgs(2, cfg()));
    sim.queue_msgs(0, 1, 300);
    sim.run_for(Duration::from_millis(2));
    sim.nodes[1].ep.set_rx_window(0);
    sim.run_for(Duration::from_millis(5));
    let stalled = sim.delivered(1, 0).len();
    // Closed for much longer than the give-up span: probes are answered,
    // so the sender does not fail.
    sim.run_for(Duration::from_secs(8));
    assert!(sim.delivered(1, 0).len() <= stalled + 1);
    assert!(sim.nodes[0].failed.is_empty());
    sim.nodes[1].ep.set_rx_window(32);
    sim.flush(1);
    sim.run_to_completion(Duration::from_secs(60));
    assert_eq!(sim.delivered(1, 0), seqs(300));
}

#[test]
fn rd_heavy_reordering_and_duplication_stay_exactly_once() {
    // Far beyond what a real path does: a third of the datagrams held back,
    // a third duplicated. Correctness must not depend on the network being
    // kind; efficiency may.
    let link = Link {
        loss: 0.05,
        dup: 0.3,
        corrupt: 0.02,
        reorder: 0.3,
        delay: Duration::from_micros(50),
        jitter: Duration::from_micros(20),
    };
    let mut c = cfg();
    c.retry_limit = 12;
    let mut sim = Sim::new(81, link, cfgs(3, c));
    sim.nodes[0].echo = true;
    sim.queue_msgs(1, 0, 500);
    sim.queue_msgs(2, 0, 500);
    sim.run_to_completion(Duration::from_secs(120));
    for i in 1..=2 {
        assert_eq!(sim.delivered(0, i), seqs(500));
        assert_eq!(sim.delivered(i, 0), seqs(500));
        assert_eq!(sim.nodes[i].acked[&addr(0)], seqs(500));
    }
    let st = sim.nodes[0].ep.stats();
    assert!(st.duplicates > 0 && st.out_of_order > 0);
}
