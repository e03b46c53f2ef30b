//! Unit tests of the Write-Record tracker: examples here, the reference
//! model and property tests in `model`.

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

mod model;

fn addr(n: u8) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)),
        port: 4791,
        qpn: 0x100 + u32::from(n),
    }
}

fn at(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

/// Segment `[mo, mo+len)` of the message at `base`.
#[allow(clippy::too_many_arguments)]
fn put(
    t: &mut Tracker,
    src: u8,
    stag: u32,
    base: u64,
    mo: u32,
    len: u32,
    msn: u32,
    last: bool,
    now: Instant,
) -> Placed {
    t.placed(
        addr(src),
        stag,
        base + u64::from(mo),
        mo,
        msn,
        len,
        last,
        now,
    )
}

fn ranges(t: &Tracker, stag: u32) -> Vec<(u64, u64)> {
    let mut out = [(0, 0); 64];
    let (n, more) = t.valid_ranges(stag, 0, u64::MAX, &mut out);
    assert!(!more);
    out[..n].to_vec()
}

fn rec(wc: &WorkCompletion) -> WriteRecordInfo {
    wc.record.expect("record info")
}

fn listed(r: &WriteRecordInfo) -> Vec<(u32, u32)> {
    r.ranges[..usize::from(r.n_ranges)].to_vec()
}

fn all(t: &mut Tracker) -> Vec<WorkCompletion> {
    std::iter::from_fn(|| t.poll_completion()).collect()
}

#[test]
fn msn_serial_arithmetic() {
    assert!(msn_newer(2, 1));
    assert!(!msn_newer(1, 2));
    assert!(!msn_newer(7, 7));
    assert!(msn_newer(0, u32::MAX));
    assert!(msn_newer(5, u32::MAX - 5));
    assert!(!msn_newer(u32::MAX, 0));
    assert!(!msn_newer(0x8000_0000, 0));
    assert!(!msn_newer(0, 0x8000_0000));
    assert!(msn_newer(0x7FFF_FFFF, 0));
}

#[test]
fn in_order_message_completes_once() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    let base = 0x1000;
    assert_eq!(
        put(&mut t, 1, 7, base, 0, 100, 1, false, t0),
        Placed::Started
    );
    assert_eq!(t.poll_completion(), None);
    assert!(t.poll_timeout().is_some());
    assert_eq!(
        put(&mut t, 1, 7, base, 100, 100, 1, false, t0),
        Placed::Continued
    );
    assert_eq!(
        put(&mut t, 1, 7, base, 200, 100, 1, false, t0),
        Placed::Continued
    );
    assert_eq!(
        put(&mut t, 1, 7, base, 300, 50, 1, true, t0),
        Placed::Completed
    );
    let wc = all(&mut t);
    assert_eq!(wc.len(), 1);
    let wc = wc[0];
    assert_eq!(wc.wr_id, 0);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.opcode, WcOpcode::RecvWriteRecord);
    assert_eq!(wc.byte_len, 350);
    assert_eq!(wc.src, Some(addr(1)));
    let r = rec(&wc);
    assert_eq!((r.stag, r.to, r.len, r.msn), (7, base, 350, 1));
    assert_eq!(listed(&r), vec![(0, 350)]);
    assert!(!r.ranges_truncated);
    assert_eq!(ranges(&t, 7), vec![(base, base + 350)]);
    assert!(t.is_valid(7, base, 350));
    assert!(!t.is_valid(7, base, 351));
    assert_eq!(t.poll_timeout(), None);
    assert_eq!(t.stats().completed, 1);
    // A single-segment message completes at once; zero length too.
    assert_eq!(put(&mut t, 1, 7, 0, 0, 8, 2, true, t0), Placed::Completed);
    assert_eq!(put(&mut t, 1, 7, 64, 0, 0, 3, true, t0), Placed::Completed);
    let wc = all(&mut t);
    assert_eq!(listed(&rec(&wc[0])), vec![(0, 8)]);
    assert_eq!(
        (rec(&wc[1]).len, rec(&wc[1]).n_ranges, wc[1].byte_len),
        (0, 0, 0)
    );
    assert_eq!(t.stats().completed, 3);
}

#[test]
fn sources_of_either_family_are_told_apart_and_reported_as_they_came() {
    // The key holds an address as one number: an IPv4 source, the
    // same address IPv4-mapped in IPv6, and an IPv6 source whose low
    // 32 bits are that address are three sources, and each completion
    // names its own.
    let v4 = addr(7);
    let mapped = DgramAddr {
        ip: IpAddr::V6(Ipv4Addr::new(10, 0, 0, 7).to_ipv6_mapped()),
        ..v4
    };
    let v6 = DgramAddr {
        ip: IpAddr::V6(Ipv6Addr::from(u128::from(u32::from(Ipv4Addr::new(
            10, 0, 0, 7,
        ))))),
        ..v4
    };
    let mut t = Tracker::new(RecordConfig::default());
    let t0 = Instant::now();
    for (i, src) in [v4, mapped, v6].into_iter().enumerate() {
        // Each source's first half of message 1 of STag 3.
        let base = 0x1000 * (i as u64 + 1);
        assert_eq!(t.placed(src, 3, base, 0, 1, 8, false, t0), Placed::Started);
    }
    for (i, src) in [v6, mapped, v4].into_iter().enumerate() {
        let base = 0x1000 * (3 - i as u64);
        assert_eq!(
            t.placed(src, 3, base + 8, 8, 1, 8, true, t0),
            Placed::Completed
        );
        let wc = t.poll_completion().expect("a completion");
        assert_eq!(wc.src, Some(src));
        assert_eq!(wc.record.map(|r| (r.to, r.len)), Some((base, 16)));
    }
    assert_eq!(t.stats().completed, 3);
}

#[test]
fn reordered_and_duplicated_segments_complete_once() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    let order = [
        (300, 40, true),
        (100, 100, false),
        (100, 100, false),
        (0, 100, false),
    ];
    for (i, &(mo, len, last)) in order.iter().enumerate() {
        let want = if i == 0 {
            Placed::Started
        } else {
            Placed::Continued
        };
        assert_eq!(put(&mut t, 2, 9, 5000, mo, len, 42, last, t0), want);
    }
    assert_eq!(all(&mut t), vec![]);
    // An overlapping segment (a resegmented retransmission) finishes it.
    assert_eq!(
        put(&mut t, 2, 9, 5000, 150, 160, 42, false, t0),
        Placed::Completed
    );
    for (mo, len, last) in [(300, 40, true), (0, 100, false), (200, 100, false)] {
        assert_eq!(
            put(&mut t, 2, 9, 5000, mo, len, 42, last, t0),
            Placed::Duplicate
        );
    }
    let wc = all(&mut t);
    assert_eq!(wc.len(), 1);
    let r = rec(&wc[0]);
    assert_eq!((r.to, r.len, r.msn, wc[0].byte_len), (5000, 340, 42, 340));
    assert_eq!(listed(&r), vec![(0, 340)]);
    assert_eq!(ranges(&t, 9), vec![(5000, 5340)]);
    assert_eq!(t.stats().duplicates, 3);
    assert_eq!(t.stats().completed, 1);
}

#[test]
fn lost_middle_segment_is_delivered_partial_after_timeout() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    assert_eq!(put(&mut t, 1, 3, 0, 0, 100, 5, false, t0), Placed::Started);
    assert_eq!(
        put(&mut t, 1, 3, 0, 100, 100, 5, false, at(t0, 10)),
        Placed::Continued
    );
    assert_eq!(
        put(&mut t, 1, 3, 0, 300, 60, 5, true, at(t0, 20)),
        Placed::Continued
    );
    // The deadline runs from the last new octet.
    let deadline = at(t0, 120);
    assert!(t.poll_timeout().is_some_and(|d| d <= deadline));
    t.handle_timeout(at(t0, 119));
    assert_eq!(t.poll_completion(), None);
    assert_eq!(t.poll_timeout(), Some(deadline));
    t.handle_timeout(deadline);
    let wc = all(&mut t);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, WcStatus::RecordPartial);
    assert_eq!(wc[0].byte_len, 260);
    let r = rec(&wc[0]);
    assert_eq!((r.to, r.len, r.msn), (0, 360, 5));
    assert_eq!(listed(&r), vec![(0, 200), (300, 60)]);
    assert_eq!(t.poll_timeout(), None);
    assert_eq!(ranges(&t, 3), vec![(0, 200), (300, 360)]);
    // The lost segment, late: not recorded.
    assert_eq!(
        put(&mut t, 1, 3, 0, 200, 100, 5, false, at(t0, 130)),
        Placed::Stale
    );
    assert_eq!(ranges(&t, 3), vec![(0, 200), (300, 360)]);
    assert_eq!(t.poll_completion(), None);
    let s = t.stats();
    assert_eq!(
        (s.partial_delivered, s.stale_segments, s.completed),
        (1, 1, 0)
    );
}

#[test]
fn partial_without_last_segment_reports_highest_end() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    put(&mut t, 1, 3, 0, 64, 64, 1, false, t0);
    put(&mut t, 1, 3, 0, 256, 64, 1, false, t0);
    t.handle_timeout(at(t0, 100));
    let r = rec(&all(&mut t)[0]);
    assert_eq!((r.len, listed(&r)), (320, vec![(64, 64), (256, 64)]));
}

#[test]
fn lost_middle_segment_is_discarded_and_counted() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig {
        partial_action: PartialAction::Discard,
        partial_timeout: Duration::from_millis(5),
        ..RecordConfig::default()
    });
    put(&mut t, 1, 3, 0, 0, 100, 5, false, t0);
    put(&mut t, 1, 3, 0, 200, 100, 5, true, t0);
    t.handle_timeout(at(t0, 5));
    assert_eq!(t.poll_completion(), None);
    assert_eq!(t.stats().partial_discarded, 1);
    assert_eq!(t.stats().partial_delivered, 0);
    // The octets were written: they stay valid.
    assert_eq!(ranges(&t, 3), vec![(0, 100), (200, 300)]);
}

#[test]
fn newer_msn_retires_older_partial_message() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    assert_eq!(put(&mut t, 1, 4, 0, 0, 50, 10, false, t0), Placed::Started);
    // Another source and another STag are independent.
    assert_eq!(
        put(&mut t, 2, 4, 1000, 0, 50, 10, false, t0),
        Placed::Started
    );
    assert_eq!(
        put(&mut t, 1, 5, 2000, 0, 50, 10, false, t0),
        Placed::Started
    );
    assert_eq!(
        put(&mut t, 1, 4, 100, 0, 50, 11, false, t0),
        Placed::Started
    );
    let wc = all(&mut t);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, WcStatus::RecordPartial);
    let r = rec(&wc[0]);
    assert_eq!((r.msn, r.to, r.len, listed(&r)), (10, 0, 50, vec![(0, 50)]));
    assert_eq!(wc[0].src, Some(addr(1)));
    assert_eq!(t.stats().retired_by_newer_msn, 1);
    // The retired message's octets stay valid.
    assert_eq!(ranges(&t, 4), vec![(0, 50), (100, 150), (1000, 1050)]);
    // Late segments of the retired message, and older MSNs, are stale.
    assert_eq!(put(&mut t, 1, 4, 0, 50, 50, 10, true, t0), Placed::Stale);
    assert_eq!(put(&mut t, 1, 4, 0, 0, 10, 9, true, t0), Placed::Stale);
    assert_eq!(ranges(&t, 4), vec![(0, 50), (100, 150), (1000, 1050)]);
    assert_eq!(t.stats().stale_segments, 2);
    assert_eq!(
        put(&mut t, 1, 4, 100, 50, 10, 11, true, t0),
        Placed::Completed
    );
    assert_eq!(rec(&all(&mut t)[0]).msn, 11);
    // After a completion, an older MSN is stale and a newer one starts.
    assert_eq!(put(&mut t, 1, 4, 0, 0, 10, 8, false, t0), Placed::Stale);
    assert_eq!(put(&mut t, 1, 4, 0, 0, 10, 12, false, t0), Placed::Started);
}

#[test]
fn msn_wraps() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    assert_eq!(
        put(&mut t, 1, 4, 0, 0, 10, u32::MAX, false, t0),
        Placed::Started
    );
    assert_eq!(put(&mut t, 1, 4, 0, 0, 10, 0, false, t0), Placed::Started);
    assert_eq!(t.stats().retired_by_newer_msn, 1);
    assert_eq!(
        put(&mut t, 1, 4, 0, 0, 10, u32::MAX, true, t0),
        Placed::Stale
    );
    // Exactly 2^31 apart: not newer.
    assert_eq!(
        put(&mut t, 1, 4, 0, 0, 10, 0x8000_0000, true, t0),
        Placed::Stale
    );
    assert_eq!(put(&mut t, 1, 4, 0, 10, 10, 0, true, t0), Placed::Completed);
}

#[test]
fn duplicates_of_completed_message_never_recorded_twice() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    put(&mut t, 1, 4, 0, 0, 64, 1, false, t0);
    assert_eq!(put(&mut t, 1, 4, 0, 64, 64, 1, true, t0), Placed::Completed);
    assert_eq!(all(&mut t).len(), 1);
    // The application consumes the data.
    t.clear(4, 0, 128);
    assert_eq!(ranges(&t, 4), vec![]);
    for _ in 0..3 {
        assert_eq!(put(&mut t, 1, 4, 0, 0, 64, 1, false, t0), Placed::Duplicate);
        assert_eq!(put(&mut t, 1, 4, 0, 64, 64, 1, true, t0), Placed::Duplicate);
    }
    assert_eq!(t.poll_completion(), None);
    assert_eq!(ranges(&t, 4), vec![]);
    assert_eq!(t.stats().duplicates, 6);
    assert_eq!(t.stats().completed, 1);
}

#[test]
fn dedup_window_is_bounded() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig {
        dedup_window: 2,
        ..RecordConfig::default()
    });
    for msn in 1..=3 {
        assert_eq!(put(&mut t, 1, 4, 0, 0, 8, msn, true, t0), Placed::Completed);
    }
    assert_eq!(put(&mut t, 1, 4, 0, 0, 8, 3, true, t0), Placed::Duplicate);
    assert_eq!(put(&mut t, 1, 4, 0, 0, 8, 2, true, t0), Placed::Duplicate);
    // Forgotten, but older than the newest remembered: stale.
    assert_eq!(put(&mut t, 1, 4, 0, 0, 8, 1, true, t0), Placed::Stale);
    assert!(t.history.fifo.len() <= 2 && t.history.outcome.len() <= 2);
    assert!(t.history.latest.len() <= 2);
    // dedup_window 0: nothing remembered.
    let mut t = Tracker::new(RecordConfig {
        dedup_window: 0,
        ..RecordConfig::default()
    });
    assert_eq!(put(&mut t, 1, 4, 0, 0, 8, 1, true, t0), Placed::Completed);
    assert_eq!(put(&mut t, 1, 4, 0, 0, 8, 1, true, t0), Placed::Completed);
}

#[test]
fn validity_map_and_clear() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    put(&mut t, 1, 4, 1000, 0, 100, 1, false, t0);
    put(&mut t, 1, 4, 1000, 200, 100, 1, false, t0);
    put(&mut t, 1, 4, 1000, 400, 100, 1, true, t0);
    assert_eq!(
        ranges(&t, 4),
        vec![(1000, 1100), (1200, 1300), (1400, 1500)]
    );
    let mut out = [(0, 0); 2];
    assert_eq!(t.valid_ranges(4, 1050, 1000, &mut out), (2, true));
    assert_eq!(out, [(1050, 1100), (1200, 1300)]);
    let mut out = [(0, 0); 4];
    assert_eq!(t.valid_ranges(4, 1250, 200, &mut out), (2, false));
    assert_eq!(&out[..2], &[(1250, 1300), (1400, 1450)]);
    assert_eq!(t.valid_ranges(4, 1100, 100, &mut out), (0, false));
    assert_eq!(t.valid_ranges(4, 1100, 0, &mut out), (0, false));
    assert_eq!(t.valid_ranges(5, 0, u64::MAX, &mut out), (0, false));
    assert_eq!(t.valid_ranges(4, 0, u64::MAX, &mut []), (0, true));
    assert!(t.is_valid(4, 1200, 100));
    assert!(t.is_valid(4, 1250, 0));
    assert!(!t.is_valid(4, 1199, 2));
    assert!(!t.is_valid(4, 1000, 500));
    assert!(!t.is_valid(4, u64::MAX, 2));
    assert!(!t.is_valid(5, 0, 1));
    // Filling a gap joins the intervals.
    put(&mut t, 1, 4, 1000, 100, 100, 1, false, t0);
    assert_eq!(ranges(&t, 4), vec![(1000, 1300), (1400, 1500)]);
    // Clears: a split, an edge, a span across intervals, nothing.
    t.clear(4, 1100, 10);
    assert_eq!(
        ranges(&t, 4),
        vec![(1000, 1100), (1110, 1300), (1400, 1500)]
    );
    t.clear(4, 1000, 50);
    assert_eq!(
        ranges(&t, 4),
        vec![(1050, 1100), (1110, 1300), (1400, 1500)]
    );
    t.clear(4, 1090, 350);
    assert_eq!(ranges(&t, 4), vec![(1050, 1090), (1440, 1500)]);
    t.clear(4, 0, 0);
    t.clear(9, 0, 100);
    t.clear(4, 1500, u64::MAX);
    assert_eq!(ranges(&t, 4), vec![(1050, 1090), (1440, 1500)]);
    t.clear(4, 0, u64::MAX);
    assert_eq!(ranges(&t, 4), vec![]);
    // Completing after the clear: only octets new to the message are
    // recorded (an overlapping resend does not revalidate cleared ones).
    put(&mut t, 1, 4, 1000, 250, 100, 1, false, t0);
    assert_eq!(ranges(&t, 4), vec![(1300, 1350)]);
    assert_eq!(
        put(&mut t, 1, 4, 1000, 300, 100, 1, false, t0),
        Placed::Completed
    );
    assert_eq!(ranges(&t, 4), vec![(1300, 1400)]);
}

#[test]
fn modes_select_the_logs() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig {
        mode: RecordMode::Cq,
        ..RecordConfig::default()
    });
    assert_eq!(put(&mut t, 1, 4, 0, 0, 8, 1, true, t0), Placed::Completed);
    assert_eq!(all(&mut t).len(), 1);
    assert!(!t.is_valid(4, 0, 8));
    assert_eq!(ranges(&t, 4), vec![]);
    let mut t = Tracker::new(RecordConfig {
        mode: RecordMode::ValidityMap,
        ..RecordConfig::default()
    });
    assert_eq!(put(&mut t, 1, 4, 0, 0, 8, 1, true, t0), Placed::Completed);
    put(&mut t, 1, 4, 0, 0, 8, 2, false, t0);
    t.handle_timeout(at(t0, 1000));
    assert_eq!(t.poll_completion(), None);
    assert!(t.is_valid(4, 0, 8));
    let s = t.stats();
    assert_eq!((s.completed, s.partial_delivered), (1, 1));
}

#[test]
fn malformed_segments_are_ignored() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    let s = addr(1);
    // TO < T-MO, TO + length and T-MO + length overflowing.
    assert_eq!(t.placed(s, 4, 5, 10, 1, 1, false, t0), Placed::Stale);
    assert_eq!(t.placed(s, 4, u64::MAX, 0, 1, 1, false, t0), Placed::Stale);
    assert_eq!(
        t.placed(s, 4, u64::MAX - 1, u32::MAX, 1, 1, true, t0),
        Placed::Stale
    );
    assert_eq!(t.stats().malformed, 3);
    assert_eq!(
        put(&mut t, 1, 4, 1000, 100, 100, 1, false, t0),
        Placed::Started
    );
    // Another base for the same message.
    assert_eq!(put(&mut t, 1, 4, 1001, 0, 100, 1, false, t0), Placed::Stale);
    // A last segment ending before octets already placed.
    assert_eq!(put(&mut t, 1, 4, 1000, 0, 150, 1, true, t0), Placed::Stale);
    assert_eq!(
        put(&mut t, 1, 4, 1000, 200, 50, 1, true, t0),
        Placed::Continued
    );
    // Beyond the known total; a second, different last segment.
    assert_eq!(
        put(&mut t, 1, 4, 1000, 240, 20, 1, false, t0),
        Placed::Stale
    );
    assert_eq!(put(&mut t, 1, 4, 1000, 0, 10, 1, true, t0), Placed::Stale);
    assert_eq!(t.stats().malformed, 7);
    assert_eq!(ranges(&t, 4), vec![(1100, 1250)]);
    assert_eq!(
        put(&mut t, 1, 4, 1000, 0, 100, 1, false, t0),
        Placed::Completed
    );
    assert_eq!(listed(&rec(&all(&mut t)[0])), vec![(0, 250)]);
    // The highest octet: TO + length may be exactly u64::MAX.
    assert_eq!(
        t.placed(s, 4, u64::MAX - 4, 0, 2, 4, true, t0),
        Placed::Completed
    );
    assert!(t.is_valid(4, u64::MAX - 4, 4));
    // A 4 GiB message at the top of the offset space.
    let base = u64::MAX - u64::from(u32::MAX);
    assert_eq!(
        t.placed(s, 4, base + 1, 1, 3, u32::MAX - 1, true, t0),
        Placed::Started
    );
    assert_eq!(t.placed(s, 4, base, 0, 3, 1, false, t0), Placed::Completed);
    let r = rec(&all(&mut t)[1]);
    assert_eq!(
        (r.to, r.len, listed(&r)),
        (base, u32::MAX, vec![(0, u32::MAX)])
    );
}

#[test]
fn fragment_bound_per_message() {
    const MAX: usize = 16;
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig {
        max_fragments: MAX,
        ..RecordConfig::default()
    });
    for k in 0..MAX as u32 {
        let last = k == 0;
        let mo = 1000 - 2 * k;
        put(&mut t, 1, 4, 0, mo, 1, 1, last, t0);
    }
    // One more disjoint range: not recorded.
    assert_eq!(put(&mut t, 1, 4, 0, 0, 1, 1, false, t0), Placed::Stale);
    assert_eq!(t.stats().overflow, 1);
    assert_eq!(ranges(&t, 4).len(), MAX);
    // One that joins two ranges is.
    assert_eq!(
        put(&mut t, 1, 4, 0, 999, 1, 1, false, t0),
        Placed::Continued
    );
    t.handle_timeout(at(t0, 100));
    let wc = all(&mut t);
    let r = rec(&wc[0]);
    assert_eq!(wc[0].status, WcStatus::RecordPartial);
    assert_eq!(usize::from(r.n_ranges), MAX_RECORD_RANGES);
    assert!(r.ranges_truncated);
    assert_eq!(r.ranges[0], (970, 1));
    assert_eq!(wc[0].byte_len, MAX as u32 + 1);
}

#[test]
fn validity_interval_bound() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    let mut cq = 0;
    for k in 0..=MAX_VALID_INTERVALS as u32 {
        let p = put(&mut t, 1, 4, 10 * u64::from(k), 0, 1, k + 1, true, t0);
        assert_eq!(p, Placed::Completed);
        cq += all(&mut t).len();
    }
    // The CQ has them all; the map drops the one it cannot hold.
    assert_eq!(cq, MAX_VALID_INTERVALS + 1);
    assert_eq!(t.stats().validity_overflow, 1);
    let v = t.valid.get(&4).expect("a map for STag 4");
    assert_eq!(v.len(), MAX_VALID_INTERVALS);
    assert!(!t.is_valid(4, 10 * MAX_VALID_INTERVALS as u64, 1));
    // Extending an interval still works when full.
    let msn = MAX_VALID_INTERVALS as u32 + 10;
    put(&mut t, 1, 4, 1, 0, 1, msn, true, t0);
    assert!(t.is_valid(4, 0, 2));
    // A split of a full set keeps the longer piece.
    t.clear(4, 0, 1);
    assert_eq!(t.stats().validity_overflow, 1);
    assert!(t.is_valid(4, 1, 1));
    put(&mut t, 1, 4, 11, 0, 3, msn + 1, true, t0);
    assert!(t.is_valid(4, 10, 4));
    t.clear(4, 11, 1);
    assert_eq!(t.stats().validity_overflow, 2);
    assert!(t.is_valid(4, 12, 2) && !t.is_valid(4, 10, 1));
    assert_eq!(t.valid.get(&4).unwrap().len(), MAX_VALID_INTERVALS);
}

#[test]
fn eviction_retires_the_idlest_message() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig {
        max_in_progress: 2,
        ..RecordConfig::default()
    });
    put(&mut t, 1, 4, 0, 0, 8, 1, false, t0);
    put(&mut t, 2, 4, 100, 0, 8, 1, false, at(t0, 1));
    put(&mut t, 1, 4, 0, 8, 8, 1, false, at(t0, 2));
    assert_eq!(
        put(&mut t, 3, 4, 200, 0, 8, 1, false, at(t0, 3)),
        Placed::Started
    );
    let wc = all(&mut t);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].src, Some(addr(2)));
    assert_eq!(wc[0].status, WcStatus::RecordPartial);
    assert_eq!(t.stats().evicted, 1);
    assert_eq!(t.inprog.len(), 2);
    // max_in_progress 0 acts as 1.
    let mut t = Tracker::new(RecordConfig {
        max_in_progress: 0,
        ..RecordConfig::default()
    });
    put(&mut t, 1, 4, 0, 0, 8, 1, false, t0);
    put(&mut t, 2, 4, 0, 0, 8, 1, false, t0);
    assert_eq!(t.inprog.len(), 1);
    assert_eq!(t.stats().evicted, 1);
}

#[test]
fn timeouts_order_and_extremes() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    put(&mut t, 2, 4, 0, 0, 8, 1, false, at(t0, 5));
    put(&mut t, 1, 4, 0, 0, 8, 1, false, at(t0, 0));
    put(&mut t, 3, 4, 0, 0, 8, 1, false, at(t0, 50));
    assert_eq!(t.poll_timeout(), Some(at(t0, 100)));
    t.handle_timeout(at(t0, 105));
    let srcs: Vec<_> = all(&mut t).iter().map(|w| w.src).collect();
    assert_eq!(srcs, vec![Some(addr(1)), Some(addr(2))]);
    assert_eq!(t.poll_timeout(), Some(at(t0, 150)));
    // A shorter timeout applies to messages in progress.
    t.set_partial_timeout(Duration::from_millis(10));
    assert_eq!(t.poll_timeout(), Some(at(t0, 60)));
    t.set_partial_action(PartialAction::Discard);
    t.handle_timeout(at(t0, 60));
    assert_eq!(t.poll_completion(), None);
    assert_eq!(t.stats().partial_discarded, 1);
    // Never time out; time going backwards.
    t.set_partial_timeout(Duration::MAX);
    put(&mut t, 1, 4, 0, 0, 8, 2, false, t0);
    assert_eq!(t.poll_timeout(), None);
    t.handle_timeout(at(t0, 1_000_000));
    assert_eq!(t.inprog.len(), 1);
    let mut t = Tracker::new(RecordConfig {
        partial_timeout: Duration::ZERO,
        ..RecordConfig::default()
    });
    put(&mut t, 1, 4, 0, 0, 8, 1, false, at(t0, 10));
    put(&mut t, 1, 4, 0, 8, 8, 1, false, t0);
    t.handle_timeout(t0);
    assert_eq!(t.inprog.len(), 1);
    t.handle_timeout(at(t0, 10));
    assert_eq!(all(&mut t).len(), 1);
}

#[test]
fn forget_stag_drops_its_state() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    put(&mut t, 1, 4, 0, 0, 8, 1, true, t0);
    put(&mut t, 1, 4, 0, 0, 8, 2, false, t0);
    put(&mut t, 1, 5, 0, 0, 8, 2, false, t0);
    t.forget_stag(4);
    assert!(!t.is_valid(4, 0, 8));
    assert!(t.is_valid(5, 0, 8));
    assert_eq!(t.inprog.len(), 1);
    assert_eq!(all(&mut t).len(), 1);
    // A re-registered STag starts afresh.
    assert_eq!(put(&mut t, 1, 4, 0, 0, 8, 1, true, t0), Placed::Completed);
    t.forget_stag(5);
    assert_eq!(t.poll_timeout(), None);
}

#[test]
fn no_allocation_growth_on_in_order_stream() {
    let t0 = Instant::now();
    let mut t = Tracker::new(RecordConfig::default());
    for msn in 1..200u32 {
        let base = u64::from(msn - 1) * 4096;
        for k in 0..4 {
            put(&mut t, 1, 4, base, k * 1024, 1024, msn, k == 3, t0);
        }
        assert!(t.poll_completion().is_some());
    }
    // Back-to-back messages make one interval.
    assert_eq!(ranges(&t, 4), vec![(0, 199 * 4096)]);
    assert_eq!(t.valid.get(&4).unwrap().capacity(), 4);
    // One range set, taken by each message in turn.
    assert_eq!(t.spare.len(), 1);
    assert_eq!(t.spare[0].capacity(), 4);
}
