//! The Write-Record tracker against a reference model (octet sets and
//! linear scans, no bounds), with generated segments and operations.

use super::*;

// -------------------------------------------------------------------
// Reference model: octet sets and linear scans, no bounds.
// -------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
struct MEntry {
    src: DgramAddr,
    status: WcStatus,
    stag: u32,
    to: u64,
    len: u32,
    msn: u32,
    ranges: Vec<(u32, u32)>,
    byte_len: u32,
}

impl MEntry {
    fn of(wc: &WorkCompletion) -> MEntry {
        let r = wc.record.unwrap();
        assert_eq!(wc.opcode, WcOpcode::RecvWriteRecord);
        assert_eq!(wc.wr_id, 0);
        MEntry {
            src: wc.src.unwrap(),
            status: wc.status,
            stag: r.stag,
            to: r.to,
            len: r.len,
            msn: r.msn,
            ranges: listed(&r),
            byte_len: wc.byte_len,
        }
    }
}

struct MMsg {
    msn: u32,
    base: u64,
    total: Option<u32>,
    octets: BTreeSet<u32>,
    active: Instant,
    seq: u64,
}

fn runs<T: Copy + std::ops::Add<Output = T> + PartialEq + From<u8>>(
    s: impl IntoIterator<Item = T>,
) -> Vec<(T, T)> {
    let mut v: Vec<(T, T)> = Vec::new();
    for x in s {
        match v.last_mut() {
            Some(r) if r.1 == x => r.1 = x + T::from(1),
            _ => v.push((x, x + T::from(1))),
        }
    }
    v
}

struct Model {
    cfg: RecordConfig,
    inprog: BTreeMap<(DgramAddr, u32), MMsg>,
    retired: BTreeMap<((DgramAddr, u32), u32), bool>,
    latest: BTreeMap<(DgramAddr, u32), u32>,
    valid: BTreeSet<(u32, u64)>,
    cq: Vec<MEntry>,
    stats: RecordStats,
    seq: u64,
}

impl Model {
    fn new(cfg: RecordConfig) -> Model {
        Model {
            cfg,
            inprog: BTreeMap::new(),
            retired: BTreeMap::new(),
            latest: BTreeMap::new(),
            valid: BTreeSet::new(),
            cq: Vec::new(),
            stats: RecordStats::default(),
            seq: 0,
        }
    }

    fn complete(m: &MMsg) -> bool {
        m.total
            .is_some_and(|t| m.octets.len() == t as usize && m.octets.iter().all(|&o| o < t))
    }

    fn retire(&mut self, key: (DgramAddr, u32), m: MMsg) {
        let complete = Self::complete(&m);
        let status = if complete {
            self.stats.completed += 1;
            WcStatus::Success
        } else if self.cfg.partial_action == PartialAction::Deliver {
            self.stats.partial_delivered += 1;
            WcStatus::RecordPartial
        } else {
            self.stats.partial_discarded += 1;
            self.retired.insert((key, m.msn), false);
            self.bump_latest(key, m.msn);
            return;
        };
        let r = runs(m.octets.iter().copied());
        self.cq.push(MEntry {
            src: key.0,
            status,
            stag: key.1,
            to: m.base,
            len: m.total.unwrap_or(r.last().map_or(0, |x| x.1)),
            msn: m.msn,
            ranges: r
                .iter()
                .take(MAX_RECORD_RANGES)
                .map(|&(a, b)| (a, b - a))
                .collect(),
            byte_len: m.octets.len() as u32,
        });
        self.retired.insert((key, m.msn), complete);
        self.bump_latest(key, m.msn);
    }

    fn bump_latest(&mut self, key: (DgramAddr, u32), msn: u32) {
        let l = self.latest.entry(key).or_insert(msn);
        if msn_newer(msn, *l) {
            *l = msn;
        }
    }

    fn timeout(&mut self, now: Instant) {
        let mut exp: Vec<_> = self
            .inprog
            .iter()
            .filter(|(_, m)| m.active + self.cfg.partial_timeout <= now)
            .map(|(k, m)| (m.active, m.seq, *k))
            .collect();
        exp.sort();
        for (_, _, k) in exp {
            let m = self.inprog.remove(&k).unwrap();
            self.retire(k, m);
        }
    }

    /// Records `[mo, end)` into `m` (the rules of the module doc).
    #[allow(clippy::too_many_arguments)]
    fn apply(
        m: &mut MMsg,
        self_max_fragments: usize,
        valid: &mut BTreeSet<(u32, u64)>,
        stag: u32,
        base: u64,
        mo: u32,
        end: u32,
        last: bool,
        now: Instant,
    ) -> Result<(), bool> {
        let max_end = m.octets.iter().next_back().map_or(0, |&o| o + 1);
        if base != m.base
            || m.total.is_some_and(|t| end > t || (last && end != t))
            || (m.total.is_none() && last && end < max_end)
        {
            return Err(true);
        }
        let mut after = m.octets.clone();
        after.extend(mo..end);
        if runs(after.iter().copied()).len() > self_max_fragments.max(1) {
            return Err(false);
        }
        let new: Vec<u32> = (mo..end).filter(|o| !m.octets.contains(o)).collect();
        if !new.is_empty() {
            m.active = m.active.max(now);
        }
        for o in new {
            valid.insert((stag, base + u64::from(o)));
        }
        m.octets = after;
        if last {
            m.total = Some(end);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn placed(
        &mut self,
        src: DgramAddr,
        stag: u32,
        to: u64,
        mo: u32,
        msn: u32,
        len: u32,
        last: bool,
        now: Instant,
    ) -> Placed {
        let (Some(base), Some(_), Some(end)) = (
            to.checked_sub(u64::from(mo)),
            to.checked_add(u64::from(len)),
            mo.checked_add(len),
        ) else {
            self.stats.malformed += 1;
            return Placed::Stale;
        };
        let key = (src, stag);
        if let Some(&c) = self.retired.get(&(key, msn)) {
            if c {
                self.stats.duplicates += 1;
                return Placed::Duplicate;
            }
            self.stats.stale_segments += 1;
            return Placed::Stale;
        }
        let start = match self.inprog.get(&key).map(|m| m.msn) {
            Some(cur) if cur == msn => false,
            Some(cur) if msn_newer(msn, cur) => {
                let old = self.inprog.remove(&key).unwrap();
                self.stats.retired_by_newer_msn += 1;
                self.retire(key, old);
                true
            }
            Some(_) => {
                self.stats.stale_segments += 1;
                return Placed::Stale;
            }
            None => {
                if self.latest.get(&key).is_some_and(|&l| !msn_newer(msn, l)) {
                    self.stats.stale_segments += 1;
                    return Placed::Stale;
                }
                true
            }
        };
        let mut m = if start {
            self.seq += 1;
            MMsg {
                msn,
                base,
                total: None,
                octets: BTreeSet::new(),
                active: now,
                seq: self.seq,
            }
        } else {
            self.inprog.remove(&key).unwrap()
        };
        if let Err(malformed) = Self::apply(
            &mut m,
            self.cfg.max_fragments,
            &mut self.valid,
            stag,
            base,
            mo,
            end,
            last,
            now,
        ) {
            if malformed {
                self.stats.malformed += 1;
            } else {
                self.stats.overflow += 1;
            }
            self.inprog.insert(key, m);
            return Placed::Stale;
        }
        if Self::complete(&m) {
            self.retire(key, m);
            return Placed::Completed;
        }
        if start {
            while self.inprog.len() >= self.cfg.max_in_progress.max(1) {
                let k = *self
                    .inprog
                    .iter()
                    .min_by_key(|(_, m)| (m.active, m.seq))
                    .unwrap()
                    .0;
                let old = self.inprog.remove(&k).unwrap();
                self.stats.evicted += 1;
                self.retire(k, old);
            }
        }
        self.inprog.insert(key, m);
        if start {
            Placed::Started
        } else {
            Placed::Continued
        }
    }

    fn clear(&mut self, stag: u32, to: u64, len: u64) {
        let end = to.saturating_add(len);
        self.valid.retain(|&(s, o)| s != stag || o < to || o >= end);
    }

    fn ranges(&self, stag: u32) -> Vec<(u64, u64)> {
        runs(
            self.valid
                .range((stag, 0)..=(stag, u64::MAX))
                .map(|&(_, o)| o),
        )
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// Segment `seg` of the generated list, possibly corrupted.
    Seg {
        idx: usize,
        corrupt: Option<(u32, bool)>,
    },
    Advance(u64),
    Clear {
        stag: u32,
        to: u64,
        len: u64,
    },
}

/// One generated segment: (source, STag, base, mo, len, msn, last).
type Seg = (u8, u32, u64, u32, u32, u32, bool);

/// Messages from several sources to several STags, cut into segments.
fn messages() -> impl Strategy<Value = Vec<Seg>> {
    let msg = (
        0u8..3,
        0u32..3,
        0u64..8,
        prop_oneof![
            4 => prop::collection::vec(1u32..12, 1..7),
            1 => prop::collection::vec(1u32..4, 20..45),
        ],
    );
    (prop::collection::vec(msg, 1..10), prop::bool::ANY).prop_map(|(msgs, wrap)| {
        let mut next_msn: BTreeMap<u8, u32> = BTreeMap::new();
        let mut segs = Vec::new();
        for (src, stag, slot, sizes) in msgs {
            let msn = next_msn
                .entry(src)
                .or_insert(if wrap { u32::MAX - 2 } else { 1 });
            let m = *msn;
            *msn = msn.wrapping_add(1);
            let base = 40 * slot;
            let mut mo = 0;
            for (i, &len) in sizes.iter().enumerate() {
                segs.push((src, stag, base, mo, len, m, i + 1 == sizes.len()));
                mo += len;
            }
        }
        segs
    })
}

fn scenario() -> impl Strategy<Value = (Vec<Seg>, Vec<Op>)> {
    messages().prop_flat_map(|segs| {
        let n = segs.len();
        let op = prop_oneof![
            6 => (0..n, prop::option::weighted(0.1, (0u32..600, prop::bool::ANY)))
                .prop_map(|(idx, corrupt)| Op::Seg { idx, corrupt }),
            2 => (0u64..40).prop_map(Op::Advance),
            1 => (0u32..3, 0u64..450, 0u64..60)
                .prop_map(|(stag, to, len)| Op::Clear { stag, to, len }),
        ];
        // Mostly each segment once, in a shuffled order, plus random
        // extra ops (duplicates, time, clears); some segments lost.
        // Sometimes every other segment first, which leaves many holes
        // (beyond a small max_fragments in long messages).
        let seg = |idx| Op::Seg { idx, corrupt: None };
        let shuffled = Just((0..n).map(seg).collect::<Vec<_>>()).prop_shuffle();
        let strided = (0..n)
            .step_by(2)
            .chain((1..n).step_by(2))
            .map(seg)
            .collect();
        (
            Just(segs),
            prop_oneof![3 => shuffled, 1 => Just(strided)],
            prop::collection::vec(prop::bool::weighted(0.15), n),
            prop::collection::vec((0usize..1000, op), 0..30),
        )
            .prop_map(|(segs, mut ops, lost, extra)| {
                ops.retain(|o| !matches!(o, Op::Seg { idx, .. } if lost[*idx]));
                for (pos, op) in extra {
                    let p = pos % (ops.len() + 1);
                    ops.insert(p, op);
                }
                (segs, ops)
            })
    })
}

fn run_model(cfg: RecordConfig, segs: &[Seg], ops: &[Op]) -> Result<(), TestCaseError> {
    let t0 = Instant::now();
    let mut now = t0;
    let mut t = Tracker::new(cfg);
    let mut m = Model::new(cfg);
    let mut got = Vec::new();
    let step = |t: &mut Tracker, m: &mut Model, now: Instant| {
        if t.poll_timeout().is_some_and(|d| d <= now) {
            t.handle_timeout(now);
        }
        m.timeout(now);
    };
    for op in ops {
        match *op {
            Op::Seg { idx, corrupt } => {
                step(&mut t, &mut m, now);
                let (src, stag, base, mut mo, mut len, msn, mut last) = segs[idx];
                let mut to = base + u64::from(mo);
                if let Some((x, l)) = corrupt {
                    // Another range of the same message (same base)
                    // half the time, any base otherwise.
                    mo = x % 60;
                    len = (x / 60) % 9;
                    last = l;
                    to = base + u64::from(mo);
                    if x % 2 == 1 {
                        to = to.wrapping_add(u64::from(x % 5)).wrapping_sub(2);
                    }
                }
                let admitted = t.admits(addr(src), stag, to, mo, msn, len);
                let a = t.placed(addr(src), stag, to, mo, msn, len, last, now);
                let b = m.placed(addr(src), stag, to, mo, msn, len, last, now);
                prop_assert_eq!(a, b, "segment {:?}", segs[idx]);
                // What is refused would have been stale or a
                // duplicate; what is recorded was admitted, and no
                // duplicate is.
                prop_assert!(
                    admitted || matches!(a, Placed::Stale | Placed::Duplicate),
                    "{:?} refused",
                    a
                );
                prop_assert!(!admitted || a != Placed::Duplicate, "duplicate admitted");
            }
            Op::Advance(ms) => {
                now += Duration::from_millis(ms);
                step(&mut t, &mut m, now);
            }
            Op::Clear { stag, to, len } => {
                t.clear(stag, to, len);
                m.clear(stag, to, len);
            }
        }
        got.extend(std::iter::from_fn(|| t.poll_completion()).map(|w| MEntry::of(&w)));
        prop_assert_eq!(&got, &m.cq);
        for stag in 0..3 {
            prop_assert_eq!(ranges(&t, stag), m.ranges(stag));
        }
        t.check();
    }
    now += Duration::from_secs(1);
    step(&mut t, &mut m, now);
    got.extend(std::iter::from_fn(|| t.poll_completion()).map(|w| MEntry::of(&w)));
    prop_assert_eq!(&got, &m.cq);
    prop_assert_eq!(t.stats(), m.stats);
    prop_assert!(t.inprog.is_empty());
    prop_assert_eq!(t.poll_timeout(), None);
    Ok(())
}

impl Tracker {
    /// Structural invariants.
    fn check(&self) {
        assert!(self.inprog.len() <= self.cfg.max_in_progress.max(1));
        assert!(self.history.fifo.len() <= self.cfg.dedup_window);
        assert_eq!(self.history.fifo.len(), self.history.outcome.len());
        assert!(self.history.latest.len() <= self.history.fifo.len());
        assert!(self.cq.len() <= MAX_PENDING_COMPLETIONS);
        for (_, v) in self.valid.iter() {
            assert!(v.len() <= MAX_VALID_INTERVALS);
            assert!(v.iter().all(|r| r.0 < r.1));
            assert!(v.windows(2).all(|w| w[0].1 < w[1].0));
        }
        for (k, m) in self.inprog.iter() {
            let f = m.frags.as_slice();
            assert!(f.len() <= self.cfg.max_fragments.max(1));
            assert!(f.iter().all(|r| r.0 < r.1));
            assert!(f.windows(2).all(|w| w[0].1 < w[1].0));
            assert!(m.total.is_none_or(|t| m.frags.end() <= t));
            assert!(!m.complete());
            assert!(!self.history.outcome.contains_key(&(*k, m.msn)));
            if let (Some(d), Some(n)) = (
                m.active.checked_add(self.cfg.partial_timeout),
                self.next_deadline,
            ) {
                assert!(n <= d, "poll_timeout later than a deadline");
            }
            if m.active.checked_add(self.cfg.partial_timeout).is_some() {
                assert!(self.next_deadline.is_some());
            }
        }
    }
}

/// The set positions of `bits`.
fn ones(bits: &[bool]) -> impl Iterator<Item = u64> + '_ {
    (0..bits.len() as u64).filter(|&k| bits[k as usize])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `Frags::add` and `set_add`, in-order fast paths included, against
    /// a bitmap: the ranges are its runs (sorted, disjoint, not
    /// adjacent), `new` is called once for each maximal piece not
    /// covered before, in order, and a refused add (over `max` ranges)
    /// changes nothing. Runs of adjacent segments take the fast path,
    /// the rest the general one.
    #[test]
    fn interval_adds_match_a_bitmap(
        adds in prop::collection::vec(
            (0u32..200, 1u32..40, prop::bool::weighted(0.6)),
            0..60,
        ),
        max in prop_oneof![Just(usize::MAX), 1usize..6],
    ) {
        let mut f = Frags::default();
        let mut v: Vec<(u64, u64)> = Vec::new();
        let mut bits = [false; 240];
        let mut next = 0u32;
        for (s, len, in_order) in adds {
            // Often the segment right after the previous one.
            let s = if in_order { next.min(199) } else { s };
            let e = s + len;
            next = e;
            let before = f.iv.clone();
            let mut fresh = Vec::new();
            if !f.add(s, e, max, |a, b| fresh.push((u64::from(a), u64::from(b)))) {
                prop_assert_eq!(&f.iv, &before);
                prop_assert!(fresh.is_empty());
                prop_assert!(before.len() >= max.max(1));
                continue;
            }
            let mut gaps = vec![false; 240];
            for k in s..e {
                gaps[k as usize] = !bits[k as usize];
                bits[k as usize] = true;
            }
            prop_assert_eq!(fresh, runs(ones(&gaps)));
            let want = runs(ones(&bits));
            let got: Vec<(u64, u64)> =
                f.iv.iter().map(|&(a, b)| (u64::from(a), u64::from(b))).collect();
            prop_assert_eq!(&got, &want);
            prop_assert!(set_add(&mut v, u64::from(s), u64::from(e)));
            prop_assert_eq!(&v, &want);
        }
    }

    /// Random segmentation, loss, duplication, reordering, corruption,
    /// clears and time of several messages from several sources: the CQ
    /// entries, the validity map and the counters equal the model's.
    #[test]
    fn matches_reference_model(
        (segs, ops) in scenario(),
        discard in prop::bool::ANY,
        max_in_progress in prop_oneof![Just(1024usize), 1usize..4],
        timeout_ms in 1u64..60,
        max_fragments in prop_oneof![Just(DEFAULT_MAX_FRAGMENTS), Just(16usize), 0usize..4],
    ) {
        let cfg = RecordConfig {
            mode: RecordMode::Both,
            partial_timeout: Duration::from_millis(timeout_ms),
            partial_action: if discard { PartialAction::Discard } else { PartialAction::Deliver },
            max_in_progress,
            dedup_window: 4096,
            max_fragments,
        };
        run_model(cfg, &segs, &ops)?;
    }

    /// Arbitrary inputs and settings: no panic, invariants hold.
    #[test]
    fn arbitrary_inputs_never_panic(
        ops in prop::collection::vec(
            (0u8..6, any::<u64>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<bool>(), 0u64..50),
            0..80,
        ),
        mode in prop_oneof![Just(RecordMode::Cq), Just(RecordMode::ValidityMap), Just(RecordMode::Both)],
        timeout in prop_oneof![Just(Duration::MAX), Just(Duration::ZERO), (0u64..20).prop_map(Duration::from_millis)],
        max_in_progress in 0usize..4,
        dedup_window in 0usize..4,
        max_fragments in 0usize..5,
    ) {
        let t0 = Instant::now();
        let mut now = t0;
        let mut t = Tracker::new(RecordConfig {
            mode,
            partial_timeout: timeout,
            partial_action: PartialAction::Deliver,
            max_in_progress,
            dedup_window,
            max_fragments,
        });
        let mut out = [(0u64, 0u64); 3];
        for (kind, to, mo, msn, len, last, dt) in ops {
            now += Duration::from_millis(dt);
            let stag = msn % 3;
            match kind {
                0 | 1 => {
                    t.placed(addr((mo % 3) as u8), stag, to, mo, msn % 5, len, last, now);
                }
                2 => {
                    // Near-valid geometry: small offsets around a base.
                    let mo = mo % 64;
                    t.placed(addr(1), stag, (to % 128) + u64::from(mo), mo, msn % 4, len % 32, last, now);
                }
                3 => t.clear(stag, to, u64::from(len)),
                4 => {
                    t.valid_ranges(stag, to, u64::from(len), &mut out);
                    t.is_valid(stag, to, u64::from(len));
                    if t.poll_timeout().is_some_and(|d| d <= now) {
                        t.handle_timeout(now);
                    }
                }
                _ => {
                    if last {
                        t.forget_stag(stag);
                    } else {
                        t.handle_timeout(now);
                    }
                }
            }
            while let Some(wc) = t.poll_completion() {
                let r = wc.record.unwrap();
                prop_assert!(usize::from(r.n_ranges) <= MAX_RECORD_RANGES);
                prop_assert!(mode != RecordMode::ValidityMap);
            }
            t.check();
        }
    }
}
