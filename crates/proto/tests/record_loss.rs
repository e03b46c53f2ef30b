//! RDMA Write-Record of large messages under heavy loss, over UD queue
//! pairs on a seeded simulated network (loss, duplication, reordering):
//!
//! * with the default fragment bound, a 1 MiB message that loses 2 %, 5 %
//!   or 10 % of its datagrams is recorded exactly: the validity map equals
//!   the octets that changed in target memory, the CQ entry's `byte_len`
//!   counts exactly those octets and lists its first ranges, and nothing is
//!   counted as beyond the bound — although the message has far more holes
//!   than the 16 ranges the tracker once held;
//! * with a small bound ([`RecordConfig::max_fragments`] 8), what is
//!   recorded is still only octets that were placed, the CQ entry and the
//!   map agree, and every placed octet left unrecorded is accounted for by
//!   the segments counted in `RecordStats::overflow`.

use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softrdma_proto::memory::{Access, VecMemory};
use softrdma_proto::rc::{CqKind, SIGNALED};
use softrdma_proto::record::{RecordConfig, RecordMode, RecordStats, DEFAULT_MAX_FRAGMENTS};
use softrdma_proto::ud::{DatagramSink, UdConfig, UdQp};
use softrdma_proto::wr::{
    DgramAddr, Payload, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
    MAX_RECORD_RANGES,
};

const MSG: usize = 1 << 20;
const TX_BASE: u64 = 0x1000_0000;
const RX_BASE: u64 = 0x2000_0000;
const MTU: usize = 1500;

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

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Collects every datagram handed to it.
struct Collect(Vec<Vec<u8>>);

impl DatagramSink for Collect {
    fn send(&mut self, _dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        self.0
            .push(bufs.iter().flat_map(|b| b.iter().copied()).collect());
        Ok(())
    }
}

/// Maximal runs of `true`, as `[start, end)`.
fn runs(octets: &[bool]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, &b) in octets.iter().chain(std::iter::once(&false)).enumerate() {
        match (b, start) {
            (true, None) => start = Some(i as u64),
            (false, Some(s)) => {
                out.push((s, i as u64));
                start = None;
            }
            _ => {}
        }
    }
    out
}

fn octets(r: &[(u64, u64)]) -> u64 {
    r.iter().map(|&(a, b)| b - a).sum()
}

/// What one lossy transfer left at the target.
struct Outcome {
    /// Runs of changed octets, offsets from the region base.
    changed: Vec<(u64, u64)>,
    /// Validity map of the region, offsets from the region base.
    map: Vec<(u64, u64)>,
    /// The message's CQ entry.
    wc: WorkCompletion,
    stats: RecordStats,
    /// Largest segment payload sent.
    max_seg: u64,
    lost: usize,
}

/// One 1 MiB Write-Record from a sender to a target through a network
/// that loses `loss` of the datagrams, duplicates 1 % and delivers them
/// in a shuffled order (every datagram may overtake any other).
fn transfer(seed: u64, loss: f64, max_fragments: usize) -> Outcome {
    let t0 = Instant::now();
    let (s_addr, t_addr) = (
        DgramAddr {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            port: 4791,
            qpn: (4791 << 8) | 1,
        },
        DgramAddr {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            port: 4791,
            qpn: (4791 << 8) | 1,
        },
    );
    let mut sender = UdQp::new(UdConfig {
        qpn: s_addr.qpn,
        mtu: MTU,
        max_msg: MSG,
        ..UdConfig::default()
    })
    .expect("sender config");
    let mut target = UdQp::new(UdConfig {
        qpn: t_addr.qpn,
        mtu: MTU,
        max_msg: MSG,
        record: RecordConfig {
            mode: RecordMode::Both,
            max_fragments,
            ..RecordConfig::default()
        },
        ..UdConfig::default()
    })
    .expect("target config");
    let mut smem = VecMemory::new();
    let tx = smem.register(0, TX_BASE, MSG, Access::LOCAL_WRITE);
    let mut rng = Rng(seed);
    // Nonzero content, so "changed" is "written" in zeroed memory.
    for b in smem.bytes_mut(tx) {
        *b = (rng.next() as u8) | 1;
    }
    let mut tmem = VecMemory::new();
    let rx = tmem.register(0, RX_BASE, MSG, Access::REMOTE_WRITE);
    let wr = SendWr {
        wr_id: 7,
        op: SendOp::WriteRecord {
            remote_addr: RX_BASE,
            rkey: rx,
        },
        payload: Payload::Sgl(SgList::single(TX_BASE, MSG as u32, tx)),
        flags: SIGNALED,
    };
    sender.post_send(wr, t_addr).expect("post");
    let mut sink = Collect(Vec::new());
    while sender.wants_transmit() {
        sender.poll_transmit(&smem, &mut sink).expect("transmit");
    }
    let (_, swc) = sender.poll_completion().expect("send completion");
    assert_eq!(swc.status, WcStatus::Success);
    let sent = sink.0;
    assert!(sent.len() > 700, "1 MiB at MTU 1500 is ~730 segments");
    let max_seg = sent.iter().map(Vec::len).max().unwrap_or(0) as u64;
    // Loss, duplication, then a full shuffle.
    let mut wire = Vec::new();
    let mut lost = 0;
    for d in &sent {
        if rng.chance(loss) {
            lost += 1;
            continue;
        }
        wire.push(d.clone());
        if rng.chance(0.01) {
            wire.push(d.clone());
        }
    }
    for i in (1..wire.len()).rev() {
        let j = rng.below(i + 1);
        wire.swap(i, j);
    }
    for (k, d) in wire.iter().enumerate() {
        let now = t0 + Duration::from_micros(k as u64);
        target.handle_datagram(s_addr.ip, s_addr.port, d, &mut tmem, now);
    }
    // Retire the message (partial unless nothing was lost).
    let later = t0 + Duration::from_secs(1);
    if target.poll_timeout().is_some_and(|d| d <= later) {
        target.handle_timeout(later);
    }
    let mut records = Vec::new();
    while let Some((kind, wc)) = target.poll_completion() {
        assert_eq!(kind, CqKind::Recv);
        records.push(wc);
    }
    assert_eq!(records.len(), 1, "one CQ entry per message");
    let wc = records[0];
    let changed: Vec<bool> = tmem.bytes(rx).iter().map(|&b| b != 0).collect();
    let mut out = vec![(0u64, 0u64); MSG];
    let (n, more) = target
        .record_tracker()
        .valid_ranges(rx, RX_BASE, MSG as u64, &mut out);
    assert!(!more);
    Outcome {
        changed: runs(&changed),
        map: out[..n]
            .iter()
            .map(|&(a, b)| (a - RX_BASE, b - RX_BASE))
            .collect(),
        wc,
        stats: target.record_stats(),
        max_seg,
        lost,
    }
}

/// The CQ entry describes `recorded` (offsets from the base) exactly, as
/// far as it lists ranges.
fn check_entry(o: &Outcome, recorded: &[(u64, u64)]) {
    let wc = &o.wc;
    let r = wc.record.expect("record info");
    assert_eq!(wc.opcode, WcOpcode::RecvWriteRecord);
    assert_eq!(u64::from(wc.byte_len), octets(recorded));
    let want_status = if recorded == [(0, MSG as u64)] {
        WcStatus::Success
    } else {
        WcStatus::RecordPartial
    };
    assert_eq!(wc.status, want_status);
    assert_eq!(r.to, RX_BASE);
    let listed: Vec<(u64, u64)> = r.ranges[..usize::from(r.n_ranges)]
        .iter()
        .map(|&(mo, len)| (u64::from(mo), u64::from(mo) + u64::from(len)))
        .collect();
    let n = recorded.len().min(MAX_RECORD_RANGES);
    assert_eq!(listed, recorded[..n].to_vec());
    assert_eq!(r.ranges_truncated, recorded.len() > MAX_RECORD_RANGES);
}

#[test]
fn one_mib_under_heavy_loss_is_recorded_exactly() {
    for (seed, loss) in [(1u64, 0.02), (2, 0.05), (3, 0.10), (4, 0.10), (5, 0.20)] {
        let o = transfer(seed, loss, DEFAULT_MAX_FRAGMENTS);
        assert!(o.lost > 0);
        // Far more holes than the 16 ranges once held per message.
        assert!(
            o.changed.len() > 16 || loss < 0.05,
            "seed {seed}: only {} runs",
            o.changed.len()
        );
        assert_eq!(o.map, o.changed, "seed {seed} loss {loss}: map != changed");
        check_entry(&o, &o.changed);
        assert_eq!(o.stats.overflow, 0);
        assert_eq!(o.stats.validity_overflow, 0);
        assert_eq!(o.stats.partial_delivered, 1);
    }
}

#[test]
fn lossless_one_mib_completes() {
    let o = transfer(9, 0.0, DEFAULT_MAX_FRAGMENTS);
    assert_eq!(o.changed, vec![(0, MSG as u64)]);
    assert_eq!(o.map, o.changed);
    check_entry(&o, &o.changed);
    assert_eq!(o.stats.completed, 1);
}

#[test]
fn at_the_fragment_bound_records_only_placed_octets_and_counts_the_rest() {
    const BOUND: usize = 8;
    for (seed, loss) in [(11u64, 0.05), (12, 0.10)] {
        let o = transfer(seed, loss, BOUND);
        assert!(o.changed.len() > BOUND, "the bound must be reached");
        // The map holds only octets that were written, within the bound.
        assert!(o.map.len() <= BOUND);
        for &(a, b) in &o.map {
            assert!(
                o.changed.iter().any(|&(c, d)| c <= a && b <= d),
                "seed {seed}: recorded [{a}, {b}) was not placed"
            );
        }
        // The CQ entry and the map say the same.
        check_entry(&o, &o.map);
        // Every placed octet left out is in a segment counted as beyond
        // the bound.
        let missing = octets(&o.changed) - octets(&o.map);
        assert!(missing > 0);
        assert!(o.stats.overflow > 0);
        assert!(missing <= o.stats.overflow * o.max_seg);
        assert_eq!(o.stats.validity_overflow, 0);
    }
}
