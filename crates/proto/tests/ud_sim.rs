//! UD queue pairs on a seeded, simulated network (loss, reordering,
//! duplication, corruption, a virtual clock), checked for exact semantics:
//!
//! * UD loses only whole messages: every delivered message is byte-exact,
//!   nothing partial is delivered, each message is delivered at most once,
//!   and delivered + dropped (counted by reason) + never arrived = sent;
//! * Send with immediate carries imm and the source; the GRH layout;
//! * several QPs on one UDP socket, told apart by DQPN;
//! * Write-Record: CQ records and the validity map match exactly the octets
//!   that changed in target memory; duplicates are never recorded twice;
//! * hostile input (proptest): random and mutated datagrams never panic and
//!   never change memory they may not change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use softrdma_proto::memory::{Access, VecMemory};
use softrdma_proto::rc::{CqKind, SIGNALED};
use softrdma_proto::record::{PartialAction, RecordConfig, RecordMode};
use softrdma_proto::ud::{dqpn_of, gid_of, DatagramSink, UdConfig, UdQp, UdStats, GRH_LEN};
use softrdma_proto::wr::{
    DgramAddr, Payload, RecvWr, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};
use softrdma_wire::datagram;
use softrdma_wire::ddp::{DdpHeader, TaggedExt};
use softrdma_wire::rdmap::{Opcode, RdmapBody, SegmentRepr};

const TICK: Duration = Duration::from_micros(50);
const TX_BASE: u64 = 0x1000_0000;
const RX_BASE: u64 = 0x2000_0000;

// ----------------------------------------------------------------------
// Harness
// ----------------------------------------------------------------------

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

/// Nonzero octets from a seed (so "changed" is "written" in zeroed memory).
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed ^ 0x5eed);
    (0..len).map(|_| (r.next() as u8) | 1).collect()
}

/// A sink that takes datagrams and sometimes says `WouldBlock`.
struct SimSink<'r> {
    out: Vec<((IpAddr, u16), Vec<u8>)>,
    rng: &'r mut Rng,
    p_block: f64,
}

impl DatagramSink for SimSink<'_> {
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        if self.rng.chance(self.p_block) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut d = Vec::new();
        for b in bufs {
            d.extend_from_slice(b);
        }
        self.out.push((dest, d));
        Ok(())
    }
}

struct InFlight {
    at: u64,
    order: u64,
    from: (IpAddr, u16),
    to: (IpAddr, u16),
    data: Vec<u8>,
    corrupted: bool,
}

/// Network impairments.
#[derive(Clone, Copy)]
struct Impair {
    loss: f64,
    dup: f64,
    corrupt: f64,
    /// Delay is 1 + uniform(0..jitter) ticks: reordering.
    jitter: u64,
}

#[derive(Default, Debug)]
struct NetStats {
    sent: u64,
    lost: u64,
    duplicated: u64,
    corrupted_delivered: u64,
    unrouted_corrupted: u64,
}

struct Net {
    rng: Rng,
    imp: Impair,
    q: Vec<InFlight>,
    order: u64,
    stats: NetStats,
}

impl Net {
    fn new(seed: u64, imp: Impair) -> Net {
        Net {
            rng: Rng(seed),
            imp,
            q: Vec::new(),
            order: 0,
            stats: NetStats::default(),
        }
    }

    fn push(&mut self, tick: u64, from: (IpAddr, u16), to: (IpAddr, u16), data: Vec<u8>) {
        self.stats.sent += 1;
        let copies = if self.rng.chance(self.imp.dup) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            if self.rng.chance(self.imp.loss) {
                self.stats.lost += 1;
                continue;
            }
            let mut d = data.clone();
            let corrupted = self.rng.chance(self.imp.corrupt);
            if corrupted {
                // 1 to 3 bit flips: CRC32C catches them all.
                for _ in 0..=self.rng.below(3) {
                    let bit = self.rng.below(d.len() as u64 * 8) as usize;
                    d[bit / 8] ^= 1 << (bit % 8);
                }
            }
            let at = tick + 1 + self.rng.below(self.imp.jitter);
            self.order += 1;
            self.q.push(InFlight {
                at,
                order: self.order,
                from,
                to,
                data: d,
                corrupted,
            });
        }
    }

    fn due(&mut self, tick: u64) -> Vec<InFlight> {
        let (mut now, later): (Vec<_>, Vec<_>) = self.q.drain(..).partition(|f| f.at <= tick);
        self.q = later;
        now.sort_by_key(|f| (f.at, f.order));
        now
    }
}

struct Node {
    qp: UdQp,
    mem: VecMemory,
    addr: DgramAddr,
    tx: u32,
    rx: u32,
    grh: bool,
    /// Send work requests posted and not completed.
    outstanding: usize,
}

fn node(ip: [u8; 4], port: u16, slot: u32, f: impl FnOnce(&mut UdConfig)) -> Node {
    let qpn = (u32::from(port) << 8) | slot;
    let mut cfg = UdConfig {
        qpn,
        ..UdConfig::default()
    };
    f(&mut cfg);
    let mut mem = VecMemory::new();
    let tx = mem.register(0, TX_BASE, 4 << 20, Access::LOCAL_WRITE);
    let rx = mem.register(0, RX_BASE, 4 << 20, Access::LOCAL_WRITE);
    Node {
        grh: cfg.grh.is_some(),
        qp: UdQp::new(cfg).expect("config"),
        mem,
        addr: DgramAddr {
            ip: IpAddr::V4(Ipv4Addr::from(ip)),
            port,
            qpn,
        },
        tx,
        rx,
        outstanding: 0,
    }
}

/// The node a datagram reaches: by socket, then by DQPN.
fn route(nodes: &[Node], to: (IpAddr, u16), data: &[u8]) -> Option<usize> {
    let q = dqpn_of(data)?;
    nodes
        .iter()
        .position(|n| (n.addr.ip, n.addr.port) == to && n.addr.qpn == q)
}

// ----------------------------------------------------------------------
// Sends
// ----------------------------------------------------------------------

#[derive(Clone, Copy)]
struct SendParams {
    seed: u64,
    imp: Impair,
    p_block: f64,
    msgs_per_node: usize,
    max_len: usize,
    p_post: f64,
    rq_depth: usize,
    max_reassembly: usize,
    /// Ticks before a completed receive buffer is posted again.
    repost_delay: u64,
    timeout_ticks: u64,
}

struct Msg {
    from: usize,
    to: usize,
    data: Vec<u8>,
    imm: Option<u32>,
    /// Segment MO → first intact arrival tick.
    segs: BTreeMap<u32, Option<u64>>,
    first_arrival: Option<u64>,
    tx_done: bool,
    delivered: bool,
}

const SLOT: usize = 32 << 10;
const TX_SLOTS: usize = 64;

/// Runs three UD QPs — A and B on one socket, C (with GRH) on another —
/// sending Sends to each other; returns the per-node counters after
/// checking every delivery and the accounting.
fn run_sends(p: SendParams) -> Vec<UdStats> {
    let timeout = TICK * p.timeout_ticks as u32;
    let cfg = |c: &mut UdConfig| {
        c.rq_depth = p.rq_depth;
        c.sq_depth = TX_SLOTS / 2;
        c.max_reassembly = p.max_reassembly;
        c.reassembly_timeout = timeout;
        c.max_msg = p.max_len;
    };
    let c_ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let mut nodes = vec![
        node([10, 0, 0, 1], 4791, 1, cfg),
        node([10, 0, 0, 1], 4791, 2, cfg),
        node([10, 0, 0, 2], 4791, 1, |c| {
            cfg(c);
            c.grh = Some(c_ip);
        }),
    ];
    let mut rng = Rng(p.seed);
    let mut sink_rng = Rng(p.seed ^ 0xabcd);
    let mut net = Net::new(p.seed ^ 0x1234, p.imp);
    let t0 = Instant::now();
    let mut msgs: Vec<Msg> = Vec::new();
    // Per node, ids of its Sends in posting order (MSN = index + 1).
    let mut posted: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut reposts: Vec<(u64, usize, u64)> = Vec::new();
    // Receive buffers: wr_id = slot.
    for n in nodes.iter_mut() {
        for s in 0..p.rq_depth {
            let sgl = SgList::single(RX_BASE + (s * SLOT) as u64, SLOT as u32, n.rx);
            n.qp.post_recv(RecvWr {
                wr_id: s as u64,
                sgl,
            })
            .expect("post_recv");
        }
    }
    let mut tick = 0u64;
    loop {
        let now = t0 + TICK * tick as u32;
        // Deliver.
        for f in net.due(tick) {
            let Some(r) = route(&nodes, f.to, &f.data) else {
                assert!(f.corrupted, "an intact datagram must be routable");
                net.stats.unrouted_corrupted += 1;
                continue;
            };
            if f.corrupted {
                net.stats.corrupted_delivered += 1;
            } else {
                let (repr, _) = datagram::parse(&f.data).expect("intact");
                let DdpHeader::Untagged {
                    rsvd_ulp, msn, mo, ..
                } = repr.ddp
                else {
                    panic!("only Sends here")
                };
                let s = nodes
                    .iter()
                    .position(|n| (n.addr.ip, n.addr.port) == f.from && n.addr.qpn == rsvd_ulp)
                    .expect("the source QPN travels in RsvdULP");
                let m = &mut msgs[posted[s][msn as usize - 1]];
                let e = m.segs.get_mut(&mo).expect("a segment that was sent");
                e.get_or_insert(tick);
                m.first_arrival.get_or_insert(tick);
            }
            let n = &mut nodes[r];
            n.qp.handle_datagram(f.from.0, f.from.1, &f.data, &mut n.mem, now);
        }
        // Timeouts.
        for n in nodes.iter_mut() {
            if n.qp.poll_timeout().is_some_and(|d| d <= now) {
                n.qp.handle_timeout(now);
            }
        }
        // Completions.
        let addrs: Vec<DgramAddr> = nodes.iter().map(|n| n.addr).collect();
        for (r, n) in nodes.iter_mut().enumerate() {
            while let Some((kind, wc)) = n.qp.poll_completion() {
                match kind {
                    CqKind::Send => {
                        assert_eq!(wc.status, WcStatus::Success);
                        assert_eq!(wc.opcode, WcOpcode::Send);
                        n.outstanding -= 1;
                        let id = posted[r]
                            .iter()
                            .copied()
                            .find(|&i| !msgs[i].tx_done)
                            .expect("a posted send");
                        assert_eq!(wc.wr_id, id as u64, "send completions in order");
                        msgs[id].tx_done = true;
                    }
                    CqKind::Recv => {
                        check_delivery(r, n, &wc, &mut msgs, &addrs);
                        let slot = wc.wr_id as usize;
                        n.mem.bytes_mut(n.rx)[slot * SLOT..(slot + 1) * SLOT].fill(0);
                        reposts.push((tick + p.repost_delay, r, wc.wr_id));
                    }
                }
            }
        }
        reposts.retain(|&(at, r, slot)| {
            if at > tick {
                return true;
            }
            let n = &mut nodes[r];
            let sgl = SgList::single(RX_BASE + slot * SLOT as u64, SLOT as u32, n.rx);
            n.qp.post_recv(RecvWr { wr_id: slot, sgl }).expect("repost");
            false
        });
        // Post new sends.
        let posting = posted.iter().map(Vec::len).sum::<usize>() < p.msgs_per_node * nodes.len();
        if posting {
            for s in 0..nodes.len() {
                if posted[s].len() >= p.msgs_per_node
                    || nodes[s].outstanding >= TX_SLOTS / 2
                    || !rng.chance(p.p_post)
                {
                    continue;
                }
                let to = (s + 1 + rng.below(nodes.len() as u64 - 1) as usize) % nodes.len();
                let id = msgs.len();
                let len = 8 + rng.below((p.max_len - 8) as u64 + 1) as usize;
                let mut data = content(id as u64 ^ p.seed, len);
                data[..8].copy_from_slice(&(id as u64).to_le_bytes());
                let imm = rng.chance(0.3).then(|| rng.next() as u32);
                let n = &mut nodes[s];
                let off = (posted[s].len() % TX_SLOTS) * SLOT;
                n.mem.bytes_mut(n.tx)[off..off + len].copy_from_slice(&data);
                let wr = SendWr {
                    wr_id: id as u64,
                    op: SendOp::Send {
                        imm,
                        invalidate: None,
                    },
                    payload: Payload::Sgl(SgList::single(TX_BASE + off as u64, len as u32, n.tx)),
                    flags: SIGNALED,
                };
                let dest = nodes[to].addr;
                nodes[s].qp.post_send(wr, dest).expect("post_send");
                nodes[s].outstanding += 1;
                posted[s].push(id);
                msgs.push(Msg {
                    from: s,
                    to,
                    data,
                    imm,
                    segs: BTreeMap::new(),
                    first_arrival: None,
                    tx_done: false,
                    delivered: false,
                });
            }
        }
        // Transmit.
        for s in 0..nodes.len() {
            let mut sink = SimSink {
                out: Vec::new(),
                rng: &mut sink_rng,
                p_block: p.p_block,
            };
            let n = &mut nodes[s];
            n.qp.poll_transmit(&n.mem, &mut sink).expect("transmit");
            let from = (n.addr.ip, n.addr.port);
            for (dest, d) in sink.out {
                let (repr, _) = datagram::parse(&d).expect("we send valid datagrams");
                let DdpHeader::Untagged { msn, mo, .. } = repr.ddp else {
                    panic!("Sends only")
                };
                let id = posted[s][msn as usize - 1];
                assert_eq!(
                    dest,
                    (nodes[msgs[id].to].addr.ip, nodes[msgs[id].to].addr.port)
                );
                assert!(d.len() + 28 <= 1500, "fits the MTU");
                msgs[id].segs.insert(mo, None);
                net.push(tick, from, dest, d);
            }
        }
        let idle = !posting
            && net.q.is_empty()
            && nodes.iter().all(|n| !n.qp.wants_transmit())
            && reposts.is_empty();
        if idle {
            break;
        }
        tick += 1;
        assert!(tick < 1_000_000, "the simulation ends");
    }
    // Let every reassembly time out.
    let end = t0 + TICK * (tick + p.timeout_ticks + 1) as u32;
    for n in nodes.iter_mut() {
        n.qp.handle_timeout(end);
        assert_eq!(n.qp.in_reassembly(), 0);
        assert_eq!(n.qp.poll_timeout(), None);
    }
    let addrs: Vec<DgramAddr> = nodes.iter().map(|n| n.addr).collect();
    for (r, n) in nodes.iter_mut().enumerate() {
        while let Some((kind, wc)) = n.qp.poll_completion() {
            assert_eq!(kind, CqKind::Recv);
            check_delivery(r, n, &wc, &mut msgs, &addrs);
        }
    }
    // Accounting.
    let stats: Vec<UdStats> = nodes.iter().map(|n| n.qp.stats()).collect();
    let bad_crc: u64 = stats.iter().map(|s| s.rx_bad_crc).sum();
    assert_eq!(bad_crc, net.stats.corrupted_delivered, "{:?}", net.stats);
    for (r, st) in stats.iter().enumerate() {
        let to_r: Vec<&Msg> = msgs.iter().filter(|m| m.to == r).collect();
        assert!(to_r.iter().all(|m| m.tx_done), "every send completed");
        let delivered = to_r.iter().filter(|m| m.delivered).count() as u64;
        let arrived = to_r.iter().filter(|m| m.first_arrival.is_some()).count() as u64;
        assert_eq!(delivered, st.rx_delivered);
        assert_eq!(
            delivered + st.rx_timeouts + st.rx_evicted + st.rx_no_recv + st.rx_len_err,
            arrived,
            "every message that arrived at all is delivered or dropped once: {st:?}"
        );
        assert_eq!(
            (
                st.rx_len_err,
                st.rx_prot_err,
                st.rx_malformed,
                st.rx_inconsistent
            ),
            (0, 0, 0, 0)
        );
        assert_eq!((st.rx_bad_dqpn, st.rx_unsupported), (0, 0));
        if st.rx_evicted == 0 && st.rx_no_recv == 0 && st.rx_fragment_overflow == 0 {
            // Exactly the messages whose every segment arrived in time.
            for m in &to_r {
                let whole = m
                    .segs
                    .values()
                    .copied()
                    .collect::<Option<Vec<u64>>>()
                    .map(|v| v.into_iter().max().unwrap_or(0));
                let expect = match (whole, m.first_arrival) {
                    (Some(last), Some(first)) => last - first <= p.timeout_ticks,
                    _ => false,
                };
                assert_eq!(m.delivered, expect, "message to {r}");
            }
        }
    }
    let sent = msgs.len() as u64;
    let delivered: u64 = stats.iter().map(|s| s.rx_delivered).sum();
    let dropped: u64 = stats
        .iter()
        .map(|s| s.rx_timeouts + s.rx_evicted + s.rx_no_recv)
        .sum();
    let never = msgs.iter().filter(|m| m.first_arrival.is_none()).count() as u64;
    assert_eq!(delivered + dropped + never, sent);
    stats
}

/// Checks one receive completion against the message it holds.
fn check_delivery(r: usize, n: &Node, wc: &WorkCompletion, msgs: &mut [Msg], addrs: &[DgramAddr]) {
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    assert_eq!(wc.opcode, WcOpcode::Recv);
    let slot = wc.wr_id as usize;
    let buf = &n.mem.bytes(n.rx)[slot * SLOT..(slot + 1) * SLOT];
    let off = if n.grh { GRH_LEN } else { 0 };
    let len = wc.byte_len as usize - off;
    let id = u64::from_le_bytes(buf[off..off + 8].try_into().unwrap()) as usize;
    let m = &mut msgs[id];
    assert_eq!(m.to, r, "delivered to its destination");
    assert!(!m.delivered, "message {id} delivered twice");
    assert_eq!(len, m.data.len(), "message {id} length");
    assert!(buf[off..off + len] == m.data[..], "message {id} intact");
    // Octets beyond byte_len are undefined: a receive that went back to
    // the queue after its message was dropped keeps what had arrived.
    assert_eq!(wc.imm, m.imm);
    let from = m.from;
    m.delivered = true;
    // The source travels: QPN in RsvdULP, IP and port from UDP.
    let src = wc.src.expect("source");
    assert_eq!(src, addrs[from], "the source of message {id}");
    if n.grh {
        let h = &buf[..GRH_LEN];
        assert_eq!(h[0] >> 4, 6);
        assert_eq!(
            u16::from_be_bytes([h[4], h[5]]),
            len.min(65535) as u16,
            "PayLen"
        );
        assert_eq!((h[6], h[7]), (0x1B, 64));
        assert_eq!(&h[8..24], &gid_of(src.ip));
        assert_eq!(&h[24..40], &gid_of(n.addr.ip));
    }
}

#[test]
fn sends_lose_only_whole_messages() {
    for seed in 1..=6u64 {
        let stats = run_sends(SendParams {
            seed,
            imp: Impair {
                loss: 0.03,
                dup: 0.05,
                corrupt: 0.02,
                jitter: 12,
            },
            p_block: 0.05,
            msgs_per_node: 120,
            max_len: 20_000,
            p_post: 0.3,
            rq_depth: 128,
            max_reassembly: 128,
            repost_delay: 0,
            timeout_ticks: 40,
        });
        let total = |f: fn(&UdStats) -> u64| stats.iter().map(f).sum::<u64>();
        // The impairments did happen.
        assert!(
            total(|s| s.rx_timeouts) > 0,
            "seed {seed}: some messages lost a segment"
        );
        assert!(total(|s| s.rx_duplicates) > 0, "seed {seed}");
        assert!(total(|s| s.rx_bad_crc) > 0, "seed {seed}");
        assert!(total(|s| s.rx_delivered) > 200, "seed {seed}");
    }
}

#[test]
fn clean_network_delivers_everything() {
    let stats = run_sends(SendParams {
        seed: 77,
        imp: Impair {
            loss: 0.0,
            dup: 0.0,
            corrupt: 0.0,
            jitter: 20,
        },
        p_block: 0.2,
        msgs_per_node: 100,
        max_len: 30_000,
        p_post: 0.5,
        rq_depth: 128,
        max_reassembly: 128,
        repost_delay: 0,
        timeout_ticks: 200,
    });
    let delivered: u64 = stats.iter().map(|s| s.rx_delivered).sum();
    assert_eq!(delivered, 300);
}

#[test]
fn overload_drops_are_counted_whole() {
    for seed in 10..=13u64 {
        let stats = run_sends(SendParams {
            seed,
            imp: Impair {
                loss: 0.05,
                dup: 0.05,
                corrupt: 0.01,
                jitter: 30,
            },
            p_block: 0.0,
            msgs_per_node: 150,
            max_len: 12_000,
            p_post: 0.9,
            rq_depth: 6,
            max_reassembly: 3,
            repost_delay: 15,
            timeout_ticks: 60,
        });
        let total = |f: fn(&UdStats) -> u64| stats.iter().map(f).sum::<u64>();
        assert!(total(|s| s.rx_evicted) > 0, "seed {seed}: table overflowed");
        assert!(total(|s| s.rx_no_recv) > 0, "seed {seed}: receives ran out");
        assert!(total(|s| s.rx_delivered) > 0, "seed {seed}");
    }
}

// ----------------------------------------------------------------------
// Write-Record and Write
// ----------------------------------------------------------------------

const REGION: usize = 64 << 10;
const REGIONS: usize = 12;
const REC_BASE: u64 = 0x4000_0000;
const WRITE_BASE: u64 = 0x5000_0000;

/// A set of octets of the Write-Record regions (`REC_BASE`-relative).
struct Octets(Vec<bool>);

impl Octets {
    fn new() -> Octets {
        Octets(vec![false; 2 * REGIONS * REGION])
    }

    fn add(&mut self, a: u64, b: u64) {
        self.0[(a - REC_BASE) as usize..(b - REC_BASE) as usize].fill(true);
    }

    /// As sorted disjoint absolute intervals (for comparison messages).
    fn intervals(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = Vec::new();
        for (i, _) in self.0.iter().enumerate().filter(|(_, &b)| b) {
            let x = REC_BASE + i as u64;
            match v.last_mut() {
                Some(l) if l.1 == x => l.1 += 1,
                _ => v.push((x, x + 1)),
            }
        }
        v
    }
}

#[test]
fn write_record_logs_exactly_what_changed() {
    for seed in 1..=4u64 {
        write_record_run(seed);
    }
}

struct RecMsg {
    from: usize,
    stag: u32,
    to: u64,
    data: Vec<u8>,
    msn: u32,
    record: bool,
    /// T-MO → intact arrivals.
    segs: BTreeMap<u32, (usize, u64)>,
}

fn write_record_run(seed: u64) {
    let rec_cfg = RecordConfig {
        mode: RecordMode::Both,
        partial_timeout: Duration::from_millis(50),
        partial_action: PartialAction::Deliver,
        max_in_progress: 64,
        dedup_window: 4096,
        max_fragments: softrdma_proto::record::DEFAULT_MAX_FRAGMENTS,
    };
    // A and B share a socket; C is the target.
    let mut nodes = vec![
        node([10, 0, 0, 1], 4791, 1, |_| {}),
        node([10, 0, 0, 1], 4791, 2, |_| {}),
        node([10, 0, 0, 2], 4791, 1, |c| c.record = rec_cfg),
    ];
    let target = 2;
    let stags: Vec<u32> = (0..2 * REGIONS)
        .map(|i| {
            nodes[target].mem.register(
                0,
                REC_BASE + (i * REGION) as u64,
                REGION,
                Access::REMOTE_WRITE,
            )
        })
        .collect();
    let wstag = nodes[target]
        .mem
        .register(0, WRITE_BASE, REGION, Access::REMOTE_WRITE);
    let mut rng = Rng(seed);
    let mut sink_rng = Rng(seed ^ 99);
    let mut net = Net::new(
        seed ^ 7,
        Impair {
            loss: 0.05,
            dup: 0.08,
            corrupt: 0.02,
            jitter: 15,
        },
    );
    let t0 = Instant::now();
    let mut tick = 0u64;
    let mut seen: BTreeSet<(DgramAddr, u32, u32)> = BTreeSet::new();
    let (mut partial_seen, mut success_seen) = (0, 0);
    for round in 0..6 {
        // Fresh target memory and validity map.
        {
            let t = &mut nodes[target];
            for (i, &s) in stags.iter().enumerate() {
                t.mem.bytes_mut(s).fill(0);
                t.qp.record_tracker()
                    .clear(s, REC_BASE + (i * REGION) as u64, REGION as u64);
            }
            t.mem.bytes_mut(wstag).fill(0);
        }
        let mut msgs: Vec<RecMsg> = Vec::new();
        // Each of A and B writes a record to each of its regions (at most
        // one message per region and round), plus plain Writes.
        for s in 0..2 {
            for k in 0..REGIONS {
                let region = s * REGIONS + k;
                let len = 1 + rng.below(20_000) as usize;
                let at = rng.below((REGION - len) as u64 + 1);
                let to = REC_BASE + (region * REGION) as u64 + at;
                msgs.push(RecMsg {
                    from: s,
                    stag: stags[region],
                    to,
                    data: content(seed * 1000 + round * 100 + region as u64, len),
                    msn: 0,
                    record: true,
                    segs: BTreeMap::new(),
                });
            }
            for w in 0..2 {
                let len = 1 + rng.below(8000) as usize;
                let at = (s * 2 + w) * (REGION / 4);
                msgs.push(RecMsg {
                    from: s,
                    stag: wstag,
                    to: WRITE_BASE + at as u64,
                    data: content(seed * 7 + round * 13 + (s * 2 + w) as u64, len),
                    msn: 0,
                    record: false,
                    segs: BTreeMap::new(),
                });
            }
        }
        // Post them all (payloads at distinct places in the sender's tx region).
        let mut tx_off = [0usize; 2];
        for (id, m) in msgs.iter_mut().enumerate() {
            let n = &mut nodes[m.from];
            let off = tx_off[m.from];
            tx_off[m.from] += m.data.len();
            n.mem.bytes_mut(n.tx)[off..off + m.data.len()].copy_from_slice(&m.data);
            let op = if m.record {
                SendOp::WriteRecord {
                    remote_addr: m.to,
                    rkey: m.stag,
                }
            } else {
                SendOp::Write {
                    remote_addr: m.to,
                    rkey: m.stag,
                    imm: None,
                }
            };
            let wr = SendWr {
                wr_id: id as u64,
                op,
                payload: Payload::Sgl(SgList::single(
                    TX_BASE + off as u64,
                    m.data.len() as u32,
                    n.tx,
                )),
                flags: SIGNALED,
            };
            let dest = nodes[target].addr;
            nodes[m.from].qp.post_send(wr, dest).expect("post");
        }
        // Run until the network is drained.
        let mut by_msn: HashMap<(usize, u32), usize> = HashMap::new();
        let mut next_of = [0usize; 2];
        loop {
            let now = t0 + TICK * tick as u32;
            for f in net.due(tick) {
                let Some(r) = route(&nodes, f.to, &f.data) else {
                    assert!(f.corrupted);
                    continue;
                };
                assert_eq!(r, target);
                if !f.corrupted {
                    let (repr, _) = datagram::parse(&f.data).unwrap();
                    let DdpHeader::Tagged {
                        ext: Some(TaggedExt { msn, mo }),
                        ..
                    } = repr.ddp
                    else {
                        panic!("tagged with X")
                    };
                    let from = nodes
                        .iter()
                        .position(|n| (n.addr.ip, n.addr.port) == f.from);
                    let slot = repr.dqpn.unwrap() >> 24;
                    let s = (slot - 1) as usize;
                    assert_eq!(from, Some(0));
                    let id = by_msn[&(s, msn)];
                    msgs[id].segs.entry(mo).and_modify(|e| e.0 += 1);
                }
                let t = &mut nodes[target];
                t.qp.handle_datagram(f.from.0, f.from.1, &f.data, &mut t.mem, now);
            }
            for s in 0..2 {
                let mut sink = SimSink {
                    out: Vec::new(),
                    rng: &mut sink_rng,
                    p_block: 0.05,
                };
                let n = &mut nodes[s];
                n.qp.poll_transmit(&n.mem, &mut sink).unwrap();
                let from = (n.addr.ip, n.addr.port);
                for (dest, d) in sink.out {
                    let (repr, plen) = datagram::parse(&d).unwrap();
                    let DdpHeader::Tagged {
                        ext: Some(TaggedExt { msn, mo }),
                        ..
                    } = repr.ddp
                    else {
                        panic!("X always set")
                    };
                    let id = *by_msn.entry((s, msn)).or_insert_with(|| {
                        // Messages go out in posting order.
                        let id = (next_of[s]..msgs.len())
                            .find(|&i| msgs[i].from == s)
                            .unwrap();
                        next_of[s] = id + 1;
                        id
                    });
                    msgs[id].msn = msn;
                    msgs[id].segs.insert(mo, (0, plen.len() as u64));
                    net.push(tick, from, dest, d);
                }
                while let Some((_, wc)) = nodes[s].qp.poll_completion() {
                    assert_eq!(wc.status, WcStatus::Success);
                }
            }
            tick += 1;
            if net.q.is_empty() && nodes.iter().all(|n| !n.qp.wants_transmit()) {
                break;
            }
        }
        // Retire what is still partial.
        let later = t0 + TICK * tick as u32 + Duration::from_millis(60);
        nodes[target].qp.handle_timeout(later);
        tick += 60_000 / 50 + 1;
        // What changed, region by region.
        let t = &mut nodes[target];
        let mut changed = Octets::new();
        for (i, &s) in stags.iter().enumerate() {
            for (k, &b) in t.mem.bytes(s).iter().enumerate() {
                changed.0[i * REGION + k] = b != 0;
            }
        }
        // Expected from the arrivals: every intact segment placed.
        let mut expect = Octets::new();
        for m in msgs.iter().filter(|m| m.record) {
            for (&mo, &(n, len)) in &m.segs {
                if n > 0 {
                    expect.add(m.to + u64::from(mo), m.to + u64::from(mo) + len);
                }
            }
        }
        assert!(
            changed.0 == expect.0,
            "seed {seed} round {round}: changed {:?} expected {:?}",
            changed.intervals(),
            expect.intervals()
        );
        // Plain Writes landed exactly where their intact segments did.
        for m in msgs.iter().filter(|m| !m.record) {
            let at = (m.to - WRITE_BASE) as usize;
            let mem = &t.mem.bytes(wstag)[at..at + m.data.len()];
            let mut got = vec![false; m.data.len()];
            for (&mo, &(n, len)) in &m.segs {
                let (a, b) = (mo as usize, mo as usize + len as usize);
                if n > 0 {
                    assert_eq!(&mem[a..b], &m.data[a..b]);
                    got[a..b].fill(true);
                }
            }
            for (k, &b) in mem.iter().enumerate() {
                assert_eq!(b != 0, got[k], "Write octet {k}");
            }
        }
        // The validity map says exactly that.
        let mut valid = Octets::new();
        for (i, &s) in stags.iter().enumerate() {
            let base = REC_BASE + (i * REGION) as u64;
            let mut out = [(0u64, 0u64); 64];
            let (n, more) =
                t.qp.record_tracker()
                    .valid_ranges(s, base, REGION as u64, &mut out);
            assert!(!more);
            for &(a, b) in &out[..n] {
                valid.add(a, b);
            }
        }
        assert!(valid.0 == changed.0, "validity map {:?}", valid.intervals());
        // The CQ: one record per message that placed anything, never two.
        let mut logged = Octets::new();
        let mut records = 0;
        while let Some((kind, wc)) = t.qp.poll_completion() {
            assert_eq!(kind, CqKind::Recv);
            assert_eq!(wc.opcode, WcOpcode::RecvWriteRecord);
            let rec = wc.record.expect("record");
            let src = wc.src.expect("src");
            assert!(seen.insert((src, rec.stag, rec.msn)), "recorded twice");
            let m = msgs
                .iter()
                .find(|m| m.record && m.stag == rec.stag && m.msn == rec.msn)
                .expect("a message we sent");
            assert_eq!(src, nodes_addr(m.from), "source by slot");
            assert_eq!(rec.to, m.to);
            let all = m.segs.values().all(|&(n, _)| n > 0);
            match wc.status {
                WcStatus::Success => {
                    assert!(all);
                    assert_eq!(rec.len as usize, m.data.len());
                    logged.add(m.to, m.to + m.data.len() as u64);
                    success_seen += 1;
                }
                WcStatus::RecordPartial => {
                    assert!(!all);
                    assert!(!rec.ranges_truncated || rec.n_ranges == 4);
                    partial_seen += 1;
                    if rec.ranges_truncated {
                        // Only the validity map has every range.
                        for (mo, &(n, len)) in &m.segs {
                            if n > 0 {
                                let a = m.to + u64::from(*mo);
                                logged.add(a, a + len);
                            }
                        }
                    }
                    for &(off, len) in &rec.ranges[..usize::from(rec.n_ranges)] {
                        let a = rec.to + u64::from(off);
                        logged.add(a, a + u64::from(len));
                    }
                }
                s => panic!("status {s:?}"),
            }
            records += 1;
        }
        let arrived = msgs
            .iter()
            .filter(|m| m.record && m.segs.values().any(|&(n, _)| n > 0))
            .count();
        assert_eq!(
            records, arrived,
            "one record per message that placed octets"
        );
        assert!(logged.0 == changed.0, "CQ records {:?}", logged.intervals());
        assert_eq!(t.qp.stats().rx_no_recv, 0, "no receive consumed");
        assert_eq!(t.qp.recv_posted(), 0);
    }
    assert!(success_seen > 0 && partial_seen > 0, "seed {seed}");
}

fn nodes_addr(from: usize) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        port: 4791,
        qpn: (4791 << 8) | (from as u32 + 1),
    }
}

// ----------------------------------------------------------------------
// Hostile input
// ----------------------------------------------------------------------

struct Victim {
    qp: UdQp,
    mem: VecMemory,
    recv: u32,
    rw: u32,
    protected: Vec<u32>,
    posted: BTreeSet<u64>,
}

const V_QPN: u32 = (4791 << 8) | 1;

fn victim(grh: bool) -> Victim {
    let mut mem = VecMemory::new();
    let recv = mem.register(0, 0x1000, 8192, Access::LOCAL_WRITE);
    let rw = mem.register(0, 0x10_0000, 4096, Access::REMOTE_WRITE);
    let ro = mem.register(0, 0x20_0000, 4096, Access::REMOTE_READ);
    let local = mem.register(0, 0x30_0000, 4096, Access::LOCAL_WRITE);
    let other = mem.register(
        1,
        0x40_0000,
        4096,
        Access::REMOTE_WRITE | Access::LOCAL_WRITE,
    );
    for s in [recv, rw, ro, local, other] {
        mem.bytes_mut(s).fill(0xEE);
    }
    let qp = UdQp::new(UdConfig {
        qpn: V_QPN,
        max_reassembly: 4,
        rq_depth: 8,
        max_sources: 4,
        event_depth: 4,
        reassembly_timeout: Duration::from_millis(1),
        grh: grh.then_some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ..UdConfig::default()
    })
    .unwrap();
    Victim {
        qp,
        mem,
        recv,
        rw,
        protected: vec![ro, local, other],
        posted: BTreeSet::new(),
    }
}

/// Valid datagrams for the victim, as seeds for mutation.
fn seed_datagrams(v: &Victim) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut emit = |repr: SegmentRepr, payload: &[u8]| {
        let mut b = vec![0u8; datagram::buffer_len(&repr, payload.len())];
        datagram::emit_into(&repr, payload, &mut b);
        out.push(b);
    };
    let dq = Some((3 << 24) | V_QPN);
    for (msn, mo, last) in [(1, 0, true), (2, 0, false), (2, 100, true), (3, 4000, true)] {
        let mut r = SegmentRepr::untagged(Opcode::Send, 0, msn, mo, last, RdmapBody::None);
        if let DdpHeader::Untagged { rsvd_ulp, .. } = &mut r.ddp {
            *rsvd_ulp = 0x1234;
        }
        r.dqpn = dq;
        emit(r, &[0xAB; 100]);
    }
    let mut r = SegmentRepr::untagged(
        Opcode::ImmediateData,
        0,
        2,
        200,
        true,
        RdmapBody::Immediate(5),
    );
    r.dqpn = dq;
    emit(r, &[]);
    for (op, stag, to) in [
        (Opcode::RdmaWrite, v.rw, 0x10_0000u64),
        (Opcode::WriteRecord, v.rw, 0x10_0F00),
        (Opcode::WriteRecord, v.protected[0], 0x20_0000),
        (Opcode::RdmaWrite, v.protected[2], 0x40_0000),
        (Opcode::RdmaWrite, v.recv, 0x1000),
    ] {
        let r = SegmentRepr {
            ddp: DdpHeader::Tagged {
                stag,
                to,
                ext: Some(TaggedExt { msn: 1, mo: 0 }),
            },
            dqpn: dq,
            ..SegmentRepr::tagged(op, stag, to, true)
        };
        emit(r, &[0xCD; 300]);
    }
    out
}

#[derive(Debug, Clone)]
enum Op {
    Random(Vec<u8>, bool),
    Mutate(usize, Vec<(usize, u8)>, Option<usize>, bool),
    Recv(u8, u16),
    Tick(u8),
    Poll,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (proptest::collection::vec(any::<u8>(), 0..120), any::<bool>())
            .prop_map(|(d, c)| Op::Random(d, c)),
        5 => (
            0usize..10,
            proptest::collection::vec((0usize..400, any::<u8>()), 0..4),
            proptest::option::of(0usize..400),
            any::<bool>()
        )
            .prop_map(|(i, m, t, c)| Op::Mutate(i, m, t, c)),
        2 => (0u8..8, 0u16..1100).prop_map(|(s, l)| Op::Recv(s, l)),
        1 => (0u8..4).prop_map(Op::Tick),
        1 => Just(Op::Poll),
    ]
}

fn hostile_run(grh: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut v = victim(grh);
    let seeds = seed_datagrams(&v);
    let before = v.mem.clone();
    let t0 = Instant::now();
    let mut now = t0;
    let mut buffers: HashMap<u64, (u64, u64)> = HashMap::new();
    // Every buffer ever posted: where receives may have written.
    let mut ever: Vec<(u64, u64)> = Vec::new();
    let src = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    for op in ops {
        let data = match op {
            Op::Random(d, crc) => {
                let mut d = d.clone();
                if *crc {
                    let t = datagram::trailer(&d, &[]);
                    d.extend_from_slice(&t);
                }
                Some(d)
            }
            Op::Mutate(i, muts, trunc, crc) => {
                let mut d = seeds[i % seeds.len()].clone();
                let body = d.len() - 4;
                for &(at, x) in muts {
                    d[at % body] ^= x;
                }
                if let Some(t) = trunc {
                    d.truncate(t % (body + 1));
                }
                if *crc && !muts.is_empty() {
                    let n = d.len().saturating_sub(4);
                    let t = datagram::trailer(&d[..n], &[]);
                    if d.len() >= 4 {
                        d[n..].copy_from_slice(&t);
                    }
                }
                Some(d)
            }
            Op::Recv(slot, len) => {
                let id = u64::from(*slot);
                if !v.posted.contains(&id) {
                    let addr = 0x1000 + u64::from(*slot) * 512;
                    let len = u64::from(*len).min(0x1000 + 4096 - addr);
                    let sgl = SgList::single(addr, len as u32, v.recv);
                    if v.qp.post_recv(RecvWr { wr_id: id, sgl }).is_ok() {
                        v.posted.insert(id);
                        buffers.insert(id, (addr, len));
                        ever.push((addr, len));
                    }
                }
                None
            }
            Op::Tick(n) => {
                now += Duration::from_micros(400) * u32::from(*n);
                v.qp.handle_timeout(now);
                None
            }
            Op::Poll => None,
        };
        if let Some(d) = data {
            v.qp.handle_datagram(src, 9, &d, &mut v.mem, now);
        }
        while let Some((kind, wc)) = v.qp.poll_completion() {
            prop_assert_eq!(kind, CqKind::Recv);
            if wc.opcode == WcOpcode::RecvWriteRecord {
                let rec = wc.record.unwrap();
                prop_assert_eq!(rec.stag, v.rw, "only the writable region is recorded");
                continue;
            }
            prop_assert!(
                v.posted.remove(&wc.wr_id),
                "completes a posted receive once"
            );
            let (_, len) = buffers[&wc.wr_id];
            prop_assert!(u64::from(wc.byte_len) <= len);
        }
        while v.qp.poll_event().is_some() {}
        // Memory that may not change did not.
        for &s in &v.protected {
            prop_assert!(v.mem.bytes(s) == before.bytes(s));
        }
        // The receive region changes only inside posted buffers.
        for (k, (&a, &b)) in v
            .mem
            .bytes(v.recv)
            .iter()
            .zip(before.bytes(v.recv))
            .enumerate()
        {
            if a != b {
                let addr = 0x1000 + k as u64;
                prop_assert!(ever.iter().any(|&(s, l)| addr >= s && addr < s + l));
            }
        }
        prop_assert!(v.qp.in_reassembly() <= 4);
        prop_assert!(v.qp.recv_posted() <= v.posted.len());
    }
    let st = v.qp.stats();
    let handled = ops
        .iter()
        .filter(|o| matches!(o, Op::Random(..) | Op::Mutate(..)))
        .count() as u64;
    prop_assert_eq!(st.rx_datagrams, handled);
    // The QP still works: a fresh source's message completes a receive.
    let mut fresh = SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None);
    if let DdpHeader::Untagged { rsvd_ulp, .. } = &mut fresh.ddp {
        *rsvd_ulp = 0x77;
    }
    fresh.dqpn = Some(V_QPN);
    let mut d = vec![0u8; datagram::buffer_len(&fresh, 0)];
    datagram::emit_into(&fresh, &[], &mut d);
    if v.qp.recv_posted() == 0 {
        let sgl = SgList::single(0x1000 + 7 * 512, 512, v.recv);
        let _ = v.qp.post_recv(RecvWr { wr_id: 99, sgl });
    }
    if v.qp.recv_posted() > 0 {
        let other = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1));
        v.qp.handle_datagram(other, 1, &d, &mut v.mem, now);
        let wc = v.qp.poll_completion().map(|c| c.1);
        prop_assert!(wc.is_some_and(|w| w.src.map(|s| s.ip) == Some(other)));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn hostile_datagrams_never_escape(ops in proptest::collection::vec(op(), 1..60), grh in any::<bool>()) {
        hostile_run(grh, &ops)?;
    }
}

// ----------------------------------------------------------------------
// No allocation per message
// ----------------------------------------------------------------------

mod counting {
    //! Counts heap allocations per thread (test only).
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub struct Counting;

    thread_local! {
        pub static ALLOCS: Cell<u64> = const { Cell::new(0) };
    }

    fn count() {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    }

    // SAFETY: forwards to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            count();
            // SAFETY: same contract as ours.
            unsafe { System.alloc(l) }
        }

        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: same contract as ours.
            unsafe { System.dealloc(p, l) }
        }

        unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
            count();
            // SAFETY: same contract as ours.
            unsafe { System.realloc(p, l, n) }
        }
    }
}

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

fn allocations() -> u64 {
    counting::ALLOCS.with(|c| c.get())
}

/// Copies datagrams into buffers allocated up front.
struct PoolSink {
    bufs: Vec<Vec<u8>>,
    n: usize,
}

impl DatagramSink for PoolSink {
    fn send(&mut self, _: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let Some(b) = self.bufs.get_mut(self.n) else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        b.clear();
        for s in bufs {
            b.extend_from_slice(s);
        }
        self.n += 1;
        Ok(())
    }
}

#[test]
fn steady_state_sends_do_not_allocate() {
    let mut a = node([10, 0, 0, 1], 4791, 1, |_| {});
    let mut b = node([10, 0, 0, 2], 4791, 1, |c| {
        c.grh = Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)))
    });
    let data = content(1, 5000);
    a.mem.bytes_mut(a.tx)[..5000].copy_from_slice(&data);
    let mut pool = PoolSink {
        bufs: (0..16).map(|_| Vec::with_capacity(2048)).collect(),
        n: 0,
    };
    let t0 = Instant::now();
    let round = |a: &mut Node, b: &mut Node, pool: &mut PoolSink, i: u32| {
        for (id, len, imm) in [(1u64, 100u32, None), (2, 5000, Some(i))] {
            let sgl = SgList::single(RX_BASE + id * 8192, 8192, b.rx);
            b.qp.post_recv(RecvWr { wr_id: id, sgl }).unwrap();
            let wr = SendWr {
                wr_id: id,
                op: SendOp::Send {
                    imm,
                    invalidate: None,
                },
                payload: Payload::Sgl(SgList::single(TX_BASE, len, a.tx)),
                flags: SIGNALED,
            };
            a.qp.post_send(wr, b.addr).unwrap();
        }
        pool.n = 0;
        a.qp.poll_transmit(&a.mem, pool).unwrap();
        let now = t0 + TICK * i;
        // Reversed: reassembly in any order.
        for d in pool.bufs[..pool.n].iter().rev() {
            b.qp.handle_datagram(a.addr.ip, a.addr.port, d, &mut b.mem, now);
        }
        let mut got = 0;
        while let Some((_, wc)) = b.qp.poll_completion() {
            assert_eq!(wc.status, WcStatus::Success);
            got += 1;
        }
        while a.qp.poll_completion().is_some() {}
        assert_eq!(got, 2);
    };
    for i in 0..10 {
        round(&mut a, &mut b, &mut pool, i);
    }
    let probe = allocations();
    drop(std::hint::black_box(vec![0u8; 8]));
    assert!(allocations() > probe, "the counter counts");
    let before = allocations();
    for i in 10..210 {
        round(&mut a, &mut b, &mut pool, i);
    }
    assert_eq!(allocations() - before, 0, "allocations on the data path");
    assert_eq!(b.qp.stats().rx_delivered, 420);
}
