//! RD queue pairs on a seeded, simulated UDP network with a virtual clock:
//! loss (up to 10 %), reordering, duplication and corruption (caught by the
//! CRC). Every datagram goes through the real wire format, and every check
//! is exact:
//!
//! * Sends: delivered exactly once, in order per source, byte-exact, both
//!   ways at once (ACKs piggybacked);
//! * 64 MiB of RDMA Writes and Reads: memory equal at the end;
//! * atomics from several peers under heavy duplication: the exact counter,
//!   and every original value handed out exactly once;
//! * Write-Record: one exact record per message;
//! * a peer that goes silent fails only its own work (RetryExcErr);
//! * one server and 1 000 clients: the server's per-peer state returns to
//!   zero once they are idle;
//! * remote access violations fail exactly the offending requests, in both
//!   directions at once, and the QPs keep working;
//! * a peer that restarts (a new incarnation, new epochs, fresh memory):
//!   a message it had acknowledged in part, a Read or atomic whose request
//!   it had acknowledged, fail with `RetryExcErr` (never Success, never
//!   stuck), nothing of them reaches the new incarnation, and the requests
//!   behind them complete in order and reach it whole.
//!
//! `RDQP_SIM_SEED=n` shifts every seed (soak runs).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softrdma_proto::dgram::{DatagramQp, DgramEvent};
use softrdma_proto::memory::{Access, MemError, VecMemory};
use softrdma_proto::rc::{CqKind, SIGNALED};
use softrdma_proto::rdqp::{RdQp, RdQpConfig};
use softrdma_proto::record::RecordMode;
use softrdma_proto::ud::DatagramSink;
use softrdma_proto::wr::{
    DgramAddr, Payload, RecvWr, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};
use softrdma_wire::rdmap::Opcode;

// ----------------------------------------------------------------------
// Network
// ----------------------------------------------------------------------

/// splitmix64.
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

fn seed_offset() -> u64 {
    std::env::var("RDQP_SIM_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |n| n.wrapping_mul(0x1_0000))
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
    /// `loss` lost, a quarter as many corrupted and duplicated, 1 %
    /// overtaken by later datagrams (when `loss > 0`).
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

#[derive(Default)]
struct Collect {
    out: Vec<((IpAddr, u16), Vec<u8>)>,
}

impl DatagramSink for Collect {
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let mut d = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
        for b in bufs {
            d.extend_from_slice(b);
        }
        self.out.push((dest, d));
        Ok(())
    }
}

const PORT: u16 = 4791;
const BASE: u64 = 0x4000_0000;

fn addr(i: usize) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::new(
            10,
            (i >> 16) as u8,
            (i >> 8) as u8,
            (i & 0xff) as u8,
        )),
        port: PORT,
        qpn: (u32::from(PORT) << 8) | 1,
    }
}

struct Node {
    qp: RdQp,
    mem: VecMemory,
    addr: DgramAddr,
    /// The node's one region (LOCAL_WRITE and every remote right).
    buf: u32,
    wcs: Vec<(CqKind, WorkCompletion)>,
    events: Vec<DgramEvent>,
}

/// A datagram in flight: arrival, tie-break, destination node, source
/// node, octets.
type InFlight = (Instant, u64, usize, usize, Vec<u8>);

struct Sim {
    now: Instant,
    rng: Rng,
    link: Link,
    net: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// Last arrival per path: jitter alone keeps a path FIFO; only
    /// `reorder` lets a datagram be overtaken.
    fifo: HashMap<(usize, usize), Instant>,
    nodes: Vec<Node>,
    by_ip: HashMap<IpAddr, usize>,
    timers: BinaryHeap<Reverse<(Instant, usize)>>,
    /// Nodes whose traffic (both ways) vanishes.
    silent: HashSet<usize>,
    /// Nodes whose data datagrams vanish (their ACK-only ones pass).
    data_lost_from: HashSet<usize>,
    sent: u64,
}

impl Sim {
    /// Nodes with `mem[i]` octets of registered memory each.
    fn new(seed: u64, link: Link, cfgs: Vec<RdQpConfig>, mem: &[usize]) -> Sim {
        let now = Instant::now();
        let nodes: Vec<Node> = cfgs
            .into_iter()
            .enumerate()
            .map(|(i, mut c)| {
                c.qpn = addr(i).qpn;
                c.rd.epoch_seed = 1000 + 7919 * i as u32;
                let mut m = VecMemory::new();
                let all = Access::LOCAL_WRITE
                    | Access::REMOTE_WRITE
                    | Access::REMOTE_READ
                    | Access::REMOTE_ATOMIC;
                let buf = m.register(0, BASE, mem[i.min(mem.len() - 1)], all);
                Node {
                    qp: RdQp::new(c, now).expect("valid config"),
                    mem: m,
                    addr: addr(i),
                    buf,
                    wcs: Vec::new(),
                    events: Vec::new(),
                }
            })
            .collect();
        let by_ip = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.addr.ip, i))
            .collect();
        Sim {
            now,
            rng: Rng(seed ^ seed_offset()),
            link,
            net: BinaryHeap::new(),
            seq: 0,
            fifo: HashMap::new(),
            nodes,
            by_ip,
            timers: BinaryHeap::new(),
            silent: HashSet::new(),
            data_lost_from: HashSet::new(),
            sent: 0,
        }
    }

    /// Node `i`'s process restarts: a new QP (same address and QPN, epochs
    /// newer than the old incarnation's, as a wall-clock seed gives) and
    /// fresh zeroed memory. Datagrams already in flight to it arrive at
    /// the new incarnation.
    fn restart(&mut self, i: usize, mut c: RdQpConfig, mem_len: usize) {
        c.qpn = addr(i).qpn;
        c.rd.epoch_seed = 1_000_000 + 7919 * i as u32;
        let mut m = VecMemory::new();
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let buf = m.register(0, BASE, mem_len, all);
        let n = &mut self.nodes[i];
        n.qp = RdQp::new(c, self.now).expect("valid config");
        n.mem = m;
        n.buf = buf;
        n.wcs.clear();
        n.events.clear();
    }

    fn flush(&mut self, i: usize) {
        let mut sink = Collect::default();
        {
            let n = &mut self.nodes[i];
            n.qp.set_now(self.now);
            n.qp.poll_transmit(&n.mem, &mut sink)
                .expect("sink never fails");
        }
        for (dest, d) in sink.out {
            self.transmit(i, dest, d);
        }
        let n = &mut self.nodes[i];
        while let Some(c) = n.qp.poll_completion() {
            n.wcs.push(c);
        }
        while let Some(e) = n.qp.poll_event() {
            n.events.push(e);
        }
        if let Some(at) = DatagramQp::poll_timeout(&n.qp) {
            self.timers.push(Reverse((at, i)));
        }
    }

    fn transmit(&mut self, from: usize, dest: (IpAddr, u16), d: Vec<u8>) {
        let to = self.by_ip[&dest.0];
        self.sent += 1;
        let copies = if self.rng.chance(self.link.dup) { 2 } else { 1 };
        for _ in 0..copies {
            if self.silent.contains(&from) || self.silent.contains(&to) {
                continue;
            }
            let data = d.len() > 4 && d[0] == 0x52 && d[4] & 0x80 != 0;
            if data && self.data_lost_from.contains(&from) {
                continue;
            }
            if self.rng.chance(self.link.loss) {
                continue;
            }
            let mut d = d.clone();
            if self.rng.chance(self.link.corrupt) {
                let bit = self.rng.below(d.len() as u64 * 8) as usize;
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
                self.now + delay + self.link.delay * (1 + self.rng.below(8) as u32)
            } else {
                let last = self.fifo.entry((from, to)).or_insert(self.now);
                *last = (*last).max(self.now + delay);
                *last
            };
            self.seq += 1;
            self.net.push(Reverse((at, self.seq, to, from, d)));
        }
    }

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
                let Reverse((_, _, to, from, d)) = self.net.pop().unwrap();
                let src = self.nodes[from].addr;
                let now = self.now;
                let n = &mut self.nodes[to];
                n.qp.handle_datagram(src.ip, src.port, &d, &mut n.mem, now);
                self.flush(to);
            }
            let mut due = Vec::new();
            while self.timers.peek().is_some_and(|Reverse(e)| e.0 <= self.now) {
                due.push(self.timers.pop().unwrap().0 .1);
            }
            due.sort_unstable();
            due.dedup();
            for i in due {
                let now = self.now;
                self.nodes[i].qp.handle_timeout(now);
                self.flush(i);
            }
        }
    }

    fn run_for(&mut self, d: Duration) {
        let until = self.now + d;
        self.run_until(until);
    }

    /// Posts a work request at the current virtual time and sends what it
    /// produced. `false` if the send queue is full.
    fn post(&mut self, i: usize, wr: SendWr, dest: DgramAddr) -> bool {
        let now = self.now;
        match self.nodes[i].qp.post_send_at(wr, dest, now) {
            Ok(()) => {
                self.flush(i);
                true
            }
            Err(softrdma_proto::rc::PostError::QueueFull) => false,
            Err(e) => panic!("post: {e:?}"),
        }
    }

    fn recv(&mut self, i: usize, id: u64, off: u64, len: u32) {
        let n = &mut self.nodes[i];
        let sgl = SgList::single(BASE + off, len, n.buf);
        n.qp.post_recv(RecvWr { wr_id: id, sgl })
            .expect("receive posted");
    }

    fn take_wcs(&mut self, i: usize) -> Vec<(CqKind, WorkCompletion)> {
        std::mem::take(&mut self.nodes[i].wcs)
    }

    fn bytes(&self, i: usize, off: u64, len: usize) -> &[u8] {
        &self.nodes[i].mem.bytes(self.nodes[i].buf)[off as usize..off as usize + len]
    }

    fn fill(&mut self, i: usize, off: u64, data: &[u8]) {
        let b = self.nodes[i].buf;
        self.nodes[i].mem.bytes_mut(b)[off as usize..off as usize + data.len()]
            .copy_from_slice(data);
    }
}

fn sgl(n: &Node, off: u64, len: usize) -> Payload {
    Payload::Sgl(SgList::single(BASE + off, len as u32, n.buf))
}

fn wr(id: u64, op: SendOp, payload: Payload) -> SendWr {
    SendWr {
        wr_id: id,
        op,
        payload,
        flags: SIGNALED,
    }
}

fn send_op() -> SendOp {
    SendOp::Send {
        imm: None,
        invalidate: None,
    }
}

/// Octets from a seed.
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed ^ 0x5eed_5eed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Defaults, except the RD retry policy: at 10 % loss (plus corruption)
/// a round trip fails about one time in four, and 8 failures in a row
/// (retry limit 7) happen now and then over a long soak; 13 in a row do
/// not. The limit is a policy, not the subject here (as in `rd_sim`).
fn cfg() -> RdQpConfig {
    let mut c = RdQpConfig::default();
    c.rd.retry_limit = 12;
    c.rd.rto_max = Duration::from_millis(200);
    c
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ----------------------------------------------------------------------
// Tests
// ----------------------------------------------------------------------

/// Length of message `seq` from `sender`: 0, around segment boundaries,
/// and up to four segments.
fn msg_len(sender: usize, seq: u64) -> usize {
    match seq % 11 {
        0 => 0,
        1 => 1420,
        2 => 1421,
        3 => 2840,
        _ => (Rng(sender as u64 * 7_000_003 + seq).next() % 6000) as usize,
    }
}

fn msg(sender: usize, seq: u64) -> Vec<u8> {
    content((sender as u64) << 32 | seq, msg_len(sender, seq))
}

#[test]
fn rdqp_sends_exactly_once_in_order_byte_exact_both_ways() {
    const N: u64 = 250;
    const NODES: usize = 4;
    const RBUF: u64 = 8192;
    const RQ: u64 = 256;
    const TX_AREA: u64 = RQ * RBUF;
    for (seed, loss) in [(1, 0.0), (2, 0.02), (3, 0.05), (4, 0.10)] {
        let c = RdQpConfig {
            rq_depth: RQ as usize,
            sq_depth: 64,
            ..cfg()
        };
        let mut sim = Sim::new(
            seed,
            Link::lossy(loss),
            vec![c; NODES],
            &[(TX_AREA + (8 << 20)) as usize],
        );
        for i in 0..NODES {
            for k in 0..RQ {
                sim.recv(i, k, k * RBUF, RBUF as u32);
            }
        }
        // Every node sends N messages to every other node.
        let mut next: HashMap<(usize, usize), u64> = HashMap::new();
        let mut expect: HashMap<(usize, usize), u64> = HashMap::new();
        let mut sent_ok = 0u64;
        let t0 = sim.now;
        let total = (NODES * (NODES - 1)) as u64 * N;
        let mut delivered = 0u64;
        while delivered < total || sent_ok < total {
            assert!(
                sim.now - t0 < Duration::from_secs(120),
                "stuck: {delivered}/{total}"
            );
            for i in 0..NODES {
                for j in (0..NODES).filter(|&j| j != i) {
                    loop {
                        let s = *next.get(&(i, j)).unwrap_or(&0);
                        if s >= N {
                            break;
                        }
                        // Each message has its own source area (write once,
                        // never touched again while in flight).
                        let data = msg(i, s);
                        let off = TX_AREA + ((j as u64 * N + s) * 8192) % (8 << 20);
                        sim.fill(i, off, &data);
                        let p = sgl(&sim.nodes[i], off, data.len());
                        let id = (j as u64) << 32 | s;
                        if !sim.post(i, wr(id, send_op(), p), addr(j)) {
                            break;
                        }
                        next.insert((i, j), s + 1);
                    }
                }
            }
            sim.run_for(ms(1));
            for i in 0..NODES {
                for (q, wc) in sim.take_wcs(i) {
                    match q {
                        CqKind::Send => {
                            assert_eq!(wc.status, WcStatus::Success, "node {i}: {wc:?}");
                            sent_ok += 1;
                        }
                        CqKind::Recv => {
                            assert_eq!(wc.status, WcStatus::Success, "node {i}: {wc:?}");
                            let src = wc.src.expect("source");
                            let from = sim.by_ip[&src.ip];
                            let s = expect.entry((from, i)).or_default();
                            let want = msg(from, *s);
                            let got = sim.bytes(i, wc.wr_id * RBUF, wc.byte_len as usize);
                            assert_eq!(got, &want[..], "{from}->{i} message {s}");
                            *s += 1;
                            delivered += 1;
                            sim.recv(i, wc.wr_id, wc.wr_id * RBUF, RBUF as u32);
                        }
                    }
                }
            }
        }
        for i in 0..NODES {
            assert!(sim.nodes[i].events.is_empty(), "{:?}", sim.nodes[i].events);
            let st = sim.nodes[i].qp.stats();
            assert_eq!(
                (st.rx_no_recv, st.rx_inconsistent, st.rx_skipped),
                (0, 0, 0)
            );
        }
        let rd: Vec<_> = sim.nodes.iter().map(|n| *n.qp.rd_stats()).collect();
        let crc: u64 = sim.nodes.iter().map(|n| n.qp.stats().rx_bad_crc).sum();
        let data: u64 = rd.iter().map(|s| s.data_sent).sum();
        let ctl: u64 = rd.iter().map(|s| s.control_sent).sum();
        let retx: u64 = rd.iter().map(|s| s.retransmitted).sum();
        let dups: u64 = sim.nodes.iter().map(|n| n.qp.stats().rx_duplicates).sum();
        println!(
            "loss {loss:4}: {total} messages, data {data} retx {retx} control {ctl} \
             crc drops {crc} dup {dups}, t = {:?}",
            sim.now - t0
        );
        if loss == 0.0 {
            assert_eq!(retx, 0);
            // Traffic both ways: most ACKs ride on data.
            assert!(ctl < data / 2, "control {ctl} vs data {data}");
        } else {
            assert!(crc > 0 && dups > 0, "corruption and duplication exercised");
        }
    }
}

/// Fills `len` octets at `off` of node `i` with content from `seed`.
fn fill_random(sim: &mut Sim, i: usize, off: u64, len: usize, seed: u64) {
    let data = content(seed, len);
    sim.fill(i, off, &data);
}

#[test]
fn rdqp_64_mib_of_writes_and_reads_land_exactly() {
    const HALF: u64 = 32 << 20;
    const CHUNK: u64 = 1 << 20;
    let c = RdQpConfig { mtu: 9000, ..cfg() };
    let mut sim = Sim::new(11, Link::lossy(0.05), vec![c, c], &[2 * HALF as usize]);
    // A: [0, 32 MiB) is written to B's [0, 32 MiB); A reads B's
    // [32, 64 MiB) into its own [32, 64 MiB).
    fill_random(&mut sim, 0, 0, HALF as usize, 1);
    fill_random(&mut sim, 1, HALF, HALF as usize, 2);
    let b = addr(1);
    let bkey = sim.nodes[1].buf;
    let mut next = 0u64;
    let mut done = 0u64;
    let n = 2 * HALF / CHUNK;
    let t0 = sim.now;
    while done < n {
        while next < n {
            let (op, off) = if next.is_multiple_of(2) {
                let off = (next / 2) * CHUNK;
                (
                    SendOp::Write {
                        remote_addr: BASE + off,
                        rkey: bkey,
                        imm: None,
                    },
                    off,
                )
            } else {
                let off = HALF + (next / 2) * CHUNK;
                (
                    SendOp::Read {
                        remote_addr: BASE + off,
                        rkey: bkey,
                    },
                    off,
                )
            };
            let p = sgl(&sim.nodes[0], off, CHUNK as usize);
            if !sim.post(0, wr(next, op, p), b) {
                break;
            }
            next += 1;
        }
        sim.run_for(ms(5));
        for (_, wc) in sim.take_wcs(0) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            assert_eq!(wc.byte_len as u64, CHUNK);
            done += 1;
        }
        assert!(
            sim.now - t0 < Duration::from_secs(300),
            "stuck at {done}/{n}"
        );
    }
    assert!(sim.bytes(1, 0, HALF as usize) == sim.bytes(0, 0, HALF as usize));
    assert!(sim.bytes(0, HALF, HALF as usize) == sim.bytes(1, HALF, HALF as usize));
    let st = sim.nodes[1].qp.stats();
    let rd0 = *sim.nodes[0].qp.rd_stats();
    let rd1 = *sim.nodes[1].qp.rd_stats();
    println!(
        "64 MiB: {} datagrams, A retx {} of {}, B retx {} of {}, read requests {}, t = {:?}",
        sim.sent,
        rd0.retransmitted,
        rd0.data_sent,
        rd1.retransmitted,
        rd1.data_sent,
        st.rx_read_requests,
        sim.now - t0
    );
    assert_eq!(st.rx_read_requests, n / 2);
    assert!(sim.nodes[1].events.is_empty() && sim.nodes[0].events.is_empty());
    sim.run_for(ms(100));
    assert_eq!(sim.nodes[1].qp.inbound_in_use(), 0);
    assert_eq!(sim.nodes[0].qp.sq_in_use(), 0);
}

#[test]
fn rdqp_atomics_are_exact_under_duplication() {
    const CLIENTS: usize = 4;
    const ADDS: u64 = 200;
    const CAS: u64 = 25;
    let link = Link {
        loss: 0.05,
        dup: 0.25,
        corrupt: 0.02,
        reorder: 0.05,
        delay: Duration::from_micros(50),
        jitter: Duration::from_micros(30),
    };
    let mut sim = Sim::new(21, link, vec![cfg(); CLIENTS + 1], &[1 << 16]);
    let server = addr(0);
    let skey = sim.nodes[0].buf;
    let mut posted = [0u64; CLIENTS + 1];
    let mut originals = Vec::new();
    let t0 = sim.now;
    // Phase 1: fetch-and-add 1, many in flight per client.
    while originals.len() < CLIENTS * ADDS as usize {
        for (i, n) in posted.iter_mut().enumerate().skip(1) {
            while *n < ADDS {
                let op = SendOp::FetchAdd {
                    remote_addr: BASE,
                    rkey: skey,
                    add: 1,
                };
                let p = sgl(&sim.nodes[i], 8 * *n, 8);
                if !sim.post(i, wr(*n, op, p), server) {
                    break;
                }
                *n += 1;
            }
        }
        sim.run_for(ms(1));
        for i in 1..=CLIENTS {
            for (_, wc) in sim.take_wcs(i) {
                assert_eq!(
                    (wc.status, wc.opcode),
                    (WcStatus::Success, WcOpcode::FetchAdd)
                );
                let got = sim.bytes(i, 8 * wc.wr_id, 8);
                originals.push(u64::from_ne_bytes(got.try_into().unwrap()));
            }
        }
        assert!(sim.now - t0 < Duration::from_secs(60));
    }
    let total = CLIENTS as u64 * ADDS;
    let counter = |sim: &Sim| u64::from_ne_bytes(sim.bytes(0, 0, 8).try_into().unwrap());
    assert_eq!(counter(&sim), total);
    originals.sort_unstable();
    assert_eq!(originals, (0..total).collect::<Vec<_>>(), "each value once");
    // Phase 2: compare-and-swap increments, one at a time per client, all
    // clients contending: exactly CAS successes each.
    let mut guess = [0u64; CLIENTS + 1];
    let mut wins = [0u64; CLIENTS + 1];
    let mut busy = [false; CLIENTS + 1];
    let mut id = 1_000;
    while wins[1..].iter().any(|&w| w < CAS) {
        for i in 1..=CLIENTS {
            if !busy[i] && wins[i] < CAS {
                let op = SendOp::CompareSwap {
                    remote_addr: BASE,
                    rkey: skey,
                    compare: guess[i],
                    swap: guess[i] + 1,
                };
                let p = sgl(&sim.nodes[i], 0x4000, 8);
                id += 1;
                assert!(sim.post(i, wr(id, op, p), server));
                busy[i] = true;
            }
        }
        sim.run_for(ms(1));
        for i in 1..=CLIENTS {
            for (_, wc) in sim.take_wcs(i) {
                assert_eq!(
                    (wc.status, wc.opcode),
                    (WcStatus::Success, WcOpcode::CompSwap)
                );
                let orig = u64::from_ne_bytes(sim.bytes(i, 0x4000, 8).try_into().unwrap());
                if orig == guess[i] {
                    wins[i] += 1;
                    guess[i] += 1;
                } else {
                    guess[i] = orig;
                }
                busy[i] = false;
            }
        }
        assert!(sim.now - t0 < Duration::from_secs(120));
    }
    assert_eq!(counter(&sim), total + CLIENTS as u64 * CAS);
    let st = sim.nodes[0].qp.stats();
    println!(
        "atomics: executed {} duplicates seen {} crc drops {}",
        st.rx_atomics, st.rx_duplicates, st.rx_bad_crc
    );
    assert!(st.rx_duplicates > 100, "duplication exercised");
}

#[test]
fn rdqp_write_records_are_recorded_exactly_once() {
    const K: u64 = 200;
    let mut s = cfg();
    s.record.mode = RecordMode::Both;
    let mut sim = Sim::new(31, Link::lossy(0.10), vec![s, cfg()], &[4 << 20]);
    let server = addr(0);
    let skey = sim.nodes[0].buf;
    let mut layout = Vec::new();
    let mut at = 0u64;
    for k in 0..K {
        let len = 1 + (Rng(k).next() % 5000) as usize;
        layout.push((at, len));
        at += len as u64 + 64; // gaps between messages
    }
    for (k, &(off, len)) in layout.iter().enumerate() {
        fill_random(&mut sim, 1, off, len, 100 + k as u64);
    }
    let mut next = 0;
    let mut acked = 0;
    let t0 = sim.now;
    while acked < K as usize {
        while next < K as usize {
            let (off, len) = layout[next];
            let op = SendOp::WriteRecord {
                remote_addr: BASE + off,
                rkey: skey,
            };
            let p = sgl(&sim.nodes[1], off, len);
            if !sim.post(1, wr(next as u64, op, p), server) {
                break;
            }
            next += 1;
        }
        sim.run_for(ms(2));
        for (_, wc) in sim.take_wcs(1) {
            assert_eq!(
                (wc.status, wc.opcode),
                (WcStatus::Success, WcOpcode::WriteRecord)
            );
            acked += 1;
        }
        assert!(sim.now - t0 < Duration::from_secs(60));
    }
    sim.run_for(ms(50));
    let recs = sim.take_wcs(0);
    assert_eq!(recs.len(), K as usize, "one record per message");
    for (k, (q, wc)) in recs.iter().enumerate() {
        let (off, len) = layout[k];
        assert_eq!(*q, CqKind::Recv);
        assert_eq!(
            (wc.opcode, wc.status),
            (WcOpcode::RecvWriteRecord, WcStatus::Success)
        );
        assert_eq!(wc.src, Some(addr(1)));
        let info = wc.record.unwrap();
        assert_eq!(
            (info.stag, info.to, info.len as usize, info.msn),
            (skey, BASE + off, len, k as u32 + 1)
        );
        assert_eq!(info.ranges[..usize::from(info.n_ranges)], [(0, len as u32)]);
        assert_eq!(sim.bytes(0, off, len), sim.bytes(1, off, len));
        assert!(sim.nodes[0]
            .qp
            .record_tracker()
            .is_valid(skey, BASE + off, len as u64));
        assert!(!sim.nodes[0]
            .qp
            .record_tracker()
            .is_valid(skey, BASE + off + len as u64, 1));
    }
    let rs = sim.nodes[0].qp.record_stats();
    assert_eq!(
        (rs.completed, rs.partial_delivered, rs.duplicates),
        (K, 0, 0)
    );
}

#[test]
fn rdqp_silent_peer_fails_only_its_own_requests() {
    const N: u64 = 400;
    let mut sim = Sim::new(41, Link::lossy(0.02), vec![cfg(); 3], &[1 << 20]);
    for i in 1..=2 {
        for k in 0..128 {
            sim.recv(i, k, k * 4096, 4096);
        }
    }
    fill_random(&mut sim, 0, 0, 4096, 5);
    let mut next = [0u64; 3];
    let mut outcome: HashMap<(usize, u64), WcStatus> = HashMap::new();
    let mut got = [0u64; 3];
    let mut t_silent = None;
    let t0 = sim.now;
    // The application stops posting to client 2 once it failed.
    let failed = |sim: &Sim| !sim.nodes[0].events.is_empty();
    while outcome.len() < (N + next[2]) as usize || !failed(&sim) {
        for (j, n) in next.iter_mut().enumerate().skip(1) {
            while *n < N && !(j == 2 && failed(&sim)) {
                let id = (j as u64) << 32 | *n;
                let p = sgl(&sim.nodes[0], 0, 1000 + (*n % 3000) as usize);
                if !sim.post(0, wr(id, send_op(), p), addr(j)) {
                    break;
                }
                *n += 1;
            }
        }
        sim.run_for(ms(1));
        if t_silent.is_none() && got[2] >= 50 {
            sim.silent.insert(2);
            t_silent = Some(sim.now);
        }
        for (_, wc) in sim.take_wcs(0) {
            outcome.insert(
                ((wc.wr_id >> 32) as usize, wc.wr_id & 0xffff_ffff),
                wc.status,
            );
        }
        for (j, g) in got.iter_mut().enumerate().skip(1) {
            for (_, wc) in sim.take_wcs(j) {
                assert_eq!(wc.status, WcStatus::Success);
                *g += 1;
                sim.recv(j, wc.wr_id, wc.wr_id * 4096, 4096);
            }
        }
        assert!(sim.now - t0 < Duration::from_secs(60));
    }
    // Client 1: everything.
    assert!((0..N).all(|s| outcome[&(1, s)] == WcStatus::Success));
    assert_eq!(got[1], N);
    // Client 2: a prefix succeeded, every other request posted failed with
    // RetryExcErr; nothing else.
    let posted = next[2];
    let ok = (0..posted)
        .take_while(|&s| outcome[&(2, s)] == WcStatus::Success)
        .count() as u64;
    assert!(ok >= 50 && ok < posted, "{ok} of {posted}");
    assert!((ok..posted).all(|s| outcome[&(2, s)] == WcStatus::RetryExcErr));
    assert!(got[2] >= ok, "acknowledged means delivered");
    let ev = &sim.nodes[0].events;
    assert_eq!(ev, &[DgramEvent::PeerFailed { peer: addr(2) }]);
    let span = sim.nodes[0].qp.config().rd.give_up_span();
    let failed_after = sim.now - t_silent.unwrap();
    assert!(failed_after <= span + ms(50), "{failed_after:?}");
}

#[test]
fn rdqp_server_with_1000_clients_returns_to_zero_state() {
    const CLIENTS: usize = 1000;
    const M: u64 = 3;
    // Every client's Sends may arrive at once: one receive each (RD has
    // no receiver-not-ready retry).
    const RQ: u64 = CLIENTS as u64 * M;
    let server = RdQpConfig {
        rq_depth: RQ as usize,
        max_inbound: 4096,
        ..cfg()
    };
    let client = RdQpConfig {
        sq_depth: 8,
        rq_depth: 4,
        max_inbound: 4,
        event_depth: 4,
        ..cfg()
    };
    let mut cfgs = vec![client; CLIENTS + 1];
    cfgs[0] = server;
    let mut sim = Sim::new(
        51,
        Link::lossy(0.05),
        cfgs,
        &[0x10_0000 + (RQ << 10) as usize, 16 << 10],
    );
    for k in 0..RQ {
        sim.recv(0, k, 0x10_0000 + k * 1024, 1024);
    }
    fill_random(&mut sim, 0, 0x8_0000, 4096, 77);
    let skey = sim.nodes[0].buf;
    let t0 = sim.now;
    for i in 1..=CLIENTS {
        fill_random(&mut sim, i, 0, 512, i as u64);
        for s in 0..M {
            let p = sgl(&sim.nodes[i], 0, 100 + s as usize);
            assert!(sim.post(i, wr(s, send_op(), p), addr(0)));
        }
        let w = SendOp::Write {
            remote_addr: BASE + 16 * i as u64,
            rkey: skey,
            imm: None,
        };
        let p = sgl(&sim.nodes[i], 0, 16);
        assert!(sim.post(i, wr(10, w, p), addr(0)));
        let r = SendOp::Read {
            remote_addr: BASE + 0x8_0000 + (i as u64 % 64) * 64,
            rkey: skey,
        };
        let p = sgl(&sim.nodes[i], 0x1000, 64);
        assert!(sim.post(i, wr(11, r, p), addr(0)));
        let fa = SendOp::FetchAdd {
            remote_addr: BASE + 0x7_0000,
            rkey: skey,
            add: 1,
        };
        let p = sgl(&sim.nodes[i], 0x2000, 8);
        assert!(sim.post(i, wr(12, fa, p), addr(0)));
    }
    let mut received = 0;
    let mut client_done = 0;
    while received < CLIENTS * M as usize || client_done < CLIENTS * (M as usize + 3) {
        sim.run_for(ms(5));
        for (_, wc) in sim.take_wcs(0) {
            assert_eq!(wc.status, WcStatus::Success);
            received += 1;
            sim.recv(0, wc.wr_id, 0x10_0000 + wc.wr_id * 1024, 1024);
        }
        for i in 1..=CLIENTS {
            for (_, wc) in sim.take_wcs(i) {
                assert_eq!(wc.status, WcStatus::Success, "client {i}: {wc:?}");
                client_done += 1;
            }
        }
        assert!(
            sim.now - t0 < Duration::from_secs(120),
            "{received} {client_done}"
        );
    }
    for i in 1..=CLIENTS {
        assert_eq!(sim.bytes(0, 16 * i as u64, 16), sim.bytes(i, 0, 16));
        let src = 0x8_0000 + (i as u64 % 64) * 64;
        assert_eq!(sim.bytes(i, 0x1000, 64), sim.bytes(0, src, 64));
    }
    let counter = u64::from_ne_bytes(sim.bytes(0, 0x7_0000, 8).try_into().unwrap());
    assert_eq!(counter, CLIENTS as u64);
    let s = &sim.nodes[0].qp;
    println!(
        "server: peers {} (rd {}), inbound in use {}, delivered {}, retx {}",
        s.peer_count(),
        s.rd().peer_count(),
        s.inbound_in_use(),
        s.rd_stats().delivered,
        s.rd_stats().retransmitted
    );
    assert!(s.peer_count() > 0);
    // Idle: every per-peer entry goes, on both sides.
    let idle = s.config().rd.idle_timeout;
    sim.run_for(idle + Duration::from_secs(1));
    let s = &sim.nodes[0].qp;
    assert_eq!((s.peer_count(), s.rd().peer_count()), (0, 0));
    assert_eq!((s.inbound_in_use(), s.sq_in_use()), (0, 0));
    assert_eq!(DatagramQp::poll_timeout(s), None);
    assert!(sim.nodes[1..]
        .iter()
        .all(|n| n.qp.peer_count() == 0 && n.qp.rd().peer_count() == 0 && n.qp.sq_in_use() == 0));
    assert!(sim.nodes.iter().all(|n| n.events.is_empty()));
}

#[test]
fn rdqp_remote_access_violations_fail_exactly_those_requests() {
    const N: u64 = 300;
    let mut sim = Sim::new(61, Link::lossy(0.10), vec![cfg(); 2], &[4 << 20]);
    fill_random(&mut sim, 0, 0, 1 << 20, 1);
    fill_random(&mut sim, 1, 0, 1 << 20, 2);
    let keys = [sim.nodes[0].buf, sim.nodes[1].buf];
    // Request k from node i to the other: every 7th names a bad STag,
    // every 11th runs past the end of the region; lengths up to 4 segments.
    let bad = |k: u64| k % 7 == 3 || k % 11 == 5;
    let spec = |i: usize, k: u64| {
        let len = 1 + Rng(k * 31 + i as u64).next() % 5000;
        let off = (k * 8192) % (1 << 20);
        let (rkey, to) = if k % 7 == 3 {
            (keys[1 - i] ^ 0x40, off)
        } else if k % 11 == 5 {
            (keys[1 - i], (4 << 20) - len / 2)
        } else {
            (keys[1 - i], (1 << 20) + off)
        };
        (off, len, rkey, to)
    };
    let mut next = [0u64; 2];
    let mut status: HashMap<(usize, u64), WcStatus> = HashMap::new();
    let t0 = sim.now;
    while status.len() < 2 * N as usize {
        for (i, n) in next.iter_mut().enumerate() {
            while *n < N {
                let k = *n;
                let (off, len, rkey, to) = spec(i, k);
                let op = if k % 2 == 0 {
                    SendOp::Write {
                        remote_addr: BASE + to,
                        rkey,
                        imm: None,
                    }
                } else {
                    SendOp::WriteRecord {
                        remote_addr: BASE + to,
                        rkey,
                    }
                };
                let p = sgl(&sim.nodes[i], off, len as usize);
                if !sim.post(i, wr(k, op, p), addr(1 - i)) {
                    break;
                }
                *n += 1;
            }
        }
        sim.run_for(ms(2));
        for i in 0..2 {
            for (q, wc) in sim.take_wcs(i) {
                if q == CqKind::Send {
                    assert!(status.insert((i, wc.wr_id), wc.status).is_none());
                }
            }
        }
        assert!(sim.now - t0 < Duration::from_secs(120));
    }
    for i in 0..2 {
        for k in 0..N {
            let want = if bad(k) {
                WcStatus::RemAccessErr
            } else {
                WcStatus::Success
            };
            assert_eq!(status[&(i, k)], want, "node {i} request {k}");
            if !bad(k) {
                let (off, len, _, to) = spec(i, k);
                assert_eq!(
                    sim.bytes(1 - i, to, len as usize),
                    sim.bytes(i, off, len as usize)
                );
            }
        }
        // One event per failed message at the target, with the right cause.
        let ev = &sim.nodes[1 - i].events;
        assert_eq!(ev.len() as u64, (0..N).filter(|&k| bad(k)).count() as u64);
        for e in ev {
            let DgramEvent::RemoteAccess {
                src,
                opcode,
                msn,
                error,
                ..
            } = *e
            else {
                panic!("{e:?}")
            };
            assert_eq!(src, addr(i));
            let k = u64::from(msn) - 1;
            assert_eq!(opcode == Opcode::RdmaWrite, k % 2 == 0);
            let want = if k % 7 == 3 {
                MemError::InvalidStag
            } else {
                MemError::BaseBounds
            };
            assert_eq!(error, want, "request {k}");
        }
        assert_eq!(sim.nodes[i].qp.rd_stats().peers_failed, 0);
    }
    let gated: u64 = sim.nodes.iter().map(|n| n.qp.stats().tx_gated).sum();
    println!(
        "access violations: gated completions {gated}, t = {:?}",
        sim.now - t0
    );
    // Both still talk.
    sim.recv(1, 1, 0, 64);
    let p = sgl(&sim.nodes[0], 0, 64);
    assert!(sim.post(0, wr(9999, send_op(), p), addr(1)));
    sim.run_for(ms(200));
    assert_eq!(sim.take_wcs(1)[0].1.status, WcStatus::Success);
}

// ----------------------------------------------------------------------
// A peer restarts
// ----------------------------------------------------------------------

const RESTART_MEM: usize = 1 << 21;

/// Node 0 posts `first` (id 1, many segments or a response of many) and a
/// small Send (id 2) to node 1; once node 1 has acknowledged part of the
/// work (`started` says when), node 1 restarts. Node 0 then posts
/// another small Send (id 3). Returns node 0's send completions and node
/// 1's (new incarnation's) receive completions after a while.
fn restart_mid_request(
    seed: u64,
    first: impl FnOnce(&Sim) -> SendOp,
    first_len: usize,
    setup: impl FnOnce(&mut Sim),
    started: impl Fn(&Sim) -> bool,
) -> (Sim, Vec<(u64, WcStatus)>, Vec<WorkCompletion>) {
    let mut sim = Sim::new(seed, Link::lossy(0.0), vec![cfg(); 2], &[RESTART_MEM]);
    for k in 0..4 {
        sim.recv(1, 100 + k, k * 65536, 65536);
    }
    fill_random(&mut sim, 0, 0, 256 * 1024, 11);
    fill_random(&mut sim, 1, 0, RESTART_MEM, 12);
    setup(&mut sim);
    let op = first(&sim);
    let p = sgl(&sim.nodes[0], 0, first_len);
    assert!(sim.post(0, wr(1, op, p), addr(1)));
    let small = content(2, 3000);
    sim.fill(0, 512 * 1024, &small);
    let p = sgl(&sim.nodes[0], 512 * 1024, small.len());
    assert!(sim.post(0, wr(2, send_op(), p), addr(1)));
    let t0 = sim.now;
    while !started(&sim) {
        sim.run_for(Duration::from_micros(5));
        assert!(sim.now - t0 < ms(500), "the request never got going");
    }
    assert!(
        sim.nodes[0].wcs.iter().all(|(_, wc)| wc.wr_id != 1),
        "request 1 finished before the restart: {:?}",
        sim.nodes[0].wcs
    );
    sim.data_lost_from.clear();
    sim.restart(1, cfg(), RESTART_MEM);
    for k in 0..4 {
        sim.recv(1, 200 + k, k * 65536, 65536);
    }
    let third = content(3, 5000);
    sim.fill(0, 600 * 1024, &third);
    let p = sgl(&sim.nodes[0], 600 * 1024, third.len());
    assert!(sim.post(0, wr(3, send_op(), p), addr(1)));
    // Far less than idle_timeout: nothing may wait for the peer entry to
    // expire.
    sim.run_for(ms(2000));
    let sends = sim
        .take_wcs(0)
        .into_iter()
        .map(|(q, wc)| {
            assert_eq!(q, CqKind::Send);
            (wc.wr_id, wc.status)
        })
        .collect();
    let recvs = sim.take_wcs(1).into_iter().map(|(_, wc)| wc).collect();
    (sim, sends, recvs)
}

/// The new incarnation got exactly Send 3 (and Send 2 unless the old one
/// took it), whole.
fn check_new_incarnation(sim: &Sim, recvs: &[WorkCompletion], with_2: bool) {
    let want: Vec<Vec<u8>> = if with_2 {
        vec![content(2, 3000), content(3, 5000)]
    } else {
        vec![content(3, 5000)]
    };
    assert_eq!(recvs.len(), want.len(), "{recvs:?}");
    for (k, (wc, data)) in recvs.iter().zip(&want).enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len as usize),
            (200 + k as u64, WcStatus::Success, data.len())
        );
        assert_eq!(sim.bytes(1, k as u64 * 65536, data.len()), &data[..]);
    }
}

const FAIL_1_THEN_OK: [(u64, WcStatus); 3] = [
    (1, WcStatus::RetryExcErr),
    (2, WcStatus::Success),
    (3, WcStatus::Success),
];

#[test]
fn rdqp_restarted_peer_fails_a_half_acknowledged_send() {
    // 60 000 octets: 43 segments; the restart comes after the first ACK.
    let (sim, sends, recvs) = restart_mid_request(
        81,
        |_| send_op(),
        60_000,
        |_| {},
        |s| s.nodes[0].qp.rd_stats().acked > 0,
    );
    assert_eq!(sends, FAIL_1_THEN_OK);
    // Nothing of Send 1 was taken for a message by the new incarnation;
    // Send 2, not acknowledged before, reached it whole.
    check_new_incarnation(&sim, &recvs, true);
}

#[test]
fn rdqp_restarted_peer_fails_a_half_acknowledged_write_and_places_none_of_it() {
    let target = 1 << 20;
    let (sim, sends, recvs) = restart_mid_request(
        82,
        |s| SendOp::Write {
            remote_addr: BASE + target,
            rkey: s.nodes[1].buf,
            imm: None,
        },
        60_000,
        |_| {},
        |s| s.nodes[0].qp.rd_stats().acked > 0,
    );
    assert_eq!(sends, FAIL_1_THEN_OK);
    assert!(
        sim.bytes(1, target, 60_000).iter().all(|&b| b == 0),
        "the rest of the Write was placed in the new incarnation"
    );
    check_new_incarnation(&sim, &recvs, true);
}

#[test]
fn rdqp_restarted_peer_fails_an_answered_read_and_frees_later_completions() {
    // A 200 KiB Read: the restart comes once part of the response has
    // been placed (its request was acknowledged). Send 2 went to the old
    // incarnation; Send 3 goes to the new one.
    let (sim, sends, recvs) = restart_mid_request(
        83,
        |s| SendOp::Read {
            remote_addr: BASE,
            rkey: s.nodes[1].buf,
        },
        200 * 1024,
        |_| {},
        |s| s.nodes[0].qp.stats().rx_read_segments > 0,
    );
    assert_eq!(sends, FAIL_1_THEN_OK);
    check_new_incarnation(&sim, &recvs, false);
}

#[test]
fn rdqp_restarted_peer_fails_an_acknowledged_atomic_and_frees_later_completions() {
    // The old incarnation's data datagrams (the Atomic Response) are lost,
    // its ACK-only datagrams arrive: the request is acknowledged, the
    // response never comes.
    let (sim, sends, recvs) = restart_mid_request(
        84,
        |s| SendOp::FetchAdd {
            remote_addr: BASE,
            rkey: s.nodes[1].buf,
            add: 5,
        },
        8,
        |s| {
            s.data_lost_from.insert(1);
        },
        |s| s.nodes[0].qp.rd_stats().acked > 0,
    );
    assert_eq!(sends, FAIL_1_THEN_OK);
    check_new_incarnation(&sim, &recvs, false);
}
