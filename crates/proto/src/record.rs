//! RDMA Write-Record bookkeeping at the target, sans-IO
//! (`docs/datagram.md` §3.1 and §3.3, design brief §4).
//!
//! A Write-Record message is placed like an RDMA Write, one datagram per
//! segment, in any order. The datagram QP writes each segment's payload to
//! memory and then reports it here with [`Tracker::placed`]. The tracker
//! logs what was placed, in two ways the application chooses between
//! ([`RecordMode`]):
//!
//! * **CQ entries**: one [`WorkCompletion`] per message (opcode
//!   [`WcOpcode::RecvWriteRecord`], `wr_id` 0, `src` and `record` filled),
//!   with status [`WcStatus::Success`] when the whole message was placed, or
//!   [`WcStatus::RecordPartial`] listing the placed ranges when it was not.
//!   No posted receive is consumed.
//! * **A validity map** per STag: the octets written by Write-Record
//!   segments, which the application queries ([`Tracker::valid_ranges`],
//!   [`Tracker::is_valid`]) and clears ([`Tracker::clear`]) when it has
//!   consumed them.
//!
//! # Rules
//!
//! * **Messages.** A message is identified by (source, STag, T-MSN). Its
//!   base TO is `TO − T-MO` of any segment; its length is known once the
//!   segment with L arrives: `total = T-MO(last) + length(last)`. It is
//!   complete when the union of its placed ranges covers `[0, total)`; every
//!   octet counts once, however often it is placed.
//! * **One message in progress per (source, STag).** A segment with a newer
//!   MSN (serial-number arithmetic on `u32`, RFC 1982: see [`msn_newer`])
//!   retires the message in progress, which is then reported as partial or
//!   discarded ([`PartialAction`]). A segment with an older MSN is
//!   [`Placed::Stale`]: not recorded.
//! * **Partial messages.** A message that has placed no new octet for
//!   [`RecordConfig::partial_timeout`] is retired by
//!   [`Tracker::handle_timeout`]: [`PartialAction::Deliver`] gives a
//!   `RecordPartial` completion listing the placed ranges;
//!   [`PartialAction::Discard`] gives none and counts it. At most
//!   [`RecordConfig::max_in_progress`] messages are tracked; starting one
//!   more retires the one idle longest the same way (counted as evicted).
//!   A late segment of a message already retired as partial is
//!   [`Placed::Stale`]: a message is reported at most once.
//! * **Duplicates.** A segment of a message already completed (the last
//!   [`RecordConfig::dedup_window`] retired messages are remembered) is
//!   [`Placed::Duplicate`]: recorded neither in the CQ nor in the validity
//!   map, so a duplicate arriving after the application cleared the data
//!   does not make it valid again — and [`Tracker::admits`] refuses it, so
//!   the datagram QPs do not place it either (it could only overwrite what
//!   the application wrote there since). Beyond the window a very late
//!   duplicate may start a message again.
//! * **Malformed segments** never panic and are ignored (returned as
//!   [`Placed::Stale`], counted in [`RecordStats::malformed`]): `TO < T-MO`,
//!   `TO + length` or `T-MO + length` overflowing, a base TO that differs
//!   from the message's, a segment ending beyond the known total, a last
//!   segment whose end differs from the known total, or one ending before
//!   octets already placed.
//!
//! # The validity map
//!
//! * It is updated as segments are recorded, not on completion: it says
//!   which octets hold data from a Write-Record, whole message or not. Only
//!   octets new to their message are added (the union of what the message
//!   placed), so neither duplicates nor stale segments touch it.
//! * Retiring a message (newer MSN, timeout, eviction, with either partial
//!   action) leaves its octets valid: they were written. [`PartialAction`]
//!   governs only the CQ.
//! * The datagram QPs ask [`Tracker::admits`] before they place a segment
//!   and only check the STag of one it refuses (an older MSN, a late
//!   segment of a retired message, a duplicate of a completed one, an
//!   impossible range): such a segment
//!   changes no memory, so after a reordering the map and the partial
//!   record still describe memory octet for octet. What `admits` cannot
//!   see (a range contradicting its message, the fragment bound) is placed
//!   and then refused by [`Tracker::placed`]: only then may memory hold
//!   octets the map does not.
//! * Per STag it is a sorted set of disjoint, non-adjacent `[start, end)`
//!   intervals of at most [`MAX_VALID_INTERVALS`]. In-order segments extend
//!   an interval in place (no allocation). A range that would need one more
//!   interval than that is not added (counted in
//!   [`RecordStats::validity_overflow`]); a [`Tracker::clear`] that would
//!   split an interval of a full set keeps only the longer piece. So the map
//!   may miss octets that were written, but never claims an octet that no
//!   recorded segment wrote since it was last cleared.
//! * In [`RecordMode::Cq`] there is no map: nothing is valid.
//!
//! # Bounds
//!
//! Per message, at most [`RecordConfig::max_fragments`] disjoint placed
//! ranges are held (default [`DEFAULT_MAX_FRAGMENTS`]: every loss pattern
//! of a 16 MiB message cut into segments of at least 1 KiB fits, since a
//! message of `s` segments has at most `⌈s / 2⌉` disjoint ranges). The
//! range sets are reused: a retired message's set goes back to a small
//! pool and the next message takes it, so a stream of messages allocates
//! nothing once the sets have grown to the fragmentation seen; a set
//! grows (amortised doubling) only when a message is more fragmented than
//! any before, up to the bound. A segment that would need one range more
//! than the bound is not recorded at all ([`Placed::Stale`], counted in
//! [`RecordStats::overflow`], its octets neither in the CQ entry nor in the
//! validity map), so what is recorded is always exactly a set of placed
//! octets; the message then ends as partial unless later segments fill its
//! gaps. Worst-case memory is `max_in_progress · max_fragments · 8` octets
//! (a sender deliberately placing every other tiny segment).
//!
//! The validity map holds at most [`MAX_VALID_INTERVALS`] intervals per
//! STag (see above). Pending CQ entries are capped at
//! [`MAX_PENDING_COMPLETIONS`] (the caller drains
//! [`Tracker::poll_completion`] after every call; beyond the cap entries
//! are dropped and counted). Messages in progress are capped by
//! `max_in_progress`, remembered messages by `dedup_window`.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use crate::memory::{MemError, Memory};
use crate::peers::PeerTable;
use crate::wr::{
    DgramAddr, WcOpcode, WcStatus, WorkCompletion, WriteRecordInfo, MAX_RECORD_RANGES,
};

/// Default of [`RecordConfig::max_fragments`]: a 16 MiB message (the
/// largest UD message) cut into segments of 1 KiB or more has at most
/// this many disjoint placed ranges, whatever was lost.
pub const DEFAULT_MAX_FRAGMENTS: usize = 8192;
/// Most disjoint valid intervals held for one STag in the validity map
/// (twice [`DEFAULT_MAX_FRAGMENTS`]: the holes of a maximally fragmented
/// message fit, with room for others not yet cleared).
pub const MAX_VALID_INTERVALS: usize = 2 * DEFAULT_MAX_FRAGMENTS;
/// Most idle range sets kept for reuse by later messages.
const SPARE_FRAGS: usize = 64;
/// Most CQ entries waiting in [`Tracker::poll_completion`].
pub const MAX_PENDING_COMPLETIONS: usize = 4096;

/// How Write-Record messages are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordMode {
    /// One CQ entry per message.
    Cq,
    /// The per-STag validity map only.
    ValidityMap,
    /// Both.
    Both,
}

impl RecordMode {
    fn cq(self) -> bool {
        matches!(self, RecordMode::Cq | RecordMode::Both)
    }

    fn map(self) -> bool {
        matches!(self, RecordMode::ValidityMap | RecordMode::Both)
    }
}

/// What becomes of a message retired before it was wholly placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartialAction {
    /// A [`WcStatus::RecordPartial`] CQ entry listing the placed ranges.
    Deliver,
    /// No CQ entry; counted in [`RecordStats::partial_discarded`].
    Discard,
}

/// Write-Record settings of a datagram QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordConfig {
    /// CQ entries, validity map, or both.
    pub mode: RecordMode,
    /// How long a message may place no new octet before it is retired as
    /// partial. `Duration::MAX` (or anything that overflows `Instant`)
    /// means never.
    pub partial_timeout: Duration,
    /// What a partial message gives.
    pub partial_action: PartialAction,
    /// Messages tracked at once; starting one more retires the one idle
    /// longest as partial. 0 is taken as 1.
    pub max_in_progress: usize,
    /// Retired (source, STag, MSN) remembered to tell duplicates and late
    /// segments from new messages. 0 disables duplicate suppression after
    /// a message is retired.
    pub dedup_window: usize,
    /// Most disjoint placed ranges held for one message in progress; a
    /// segment that would need one more is not recorded (counted in
    /// [`RecordStats::overflow`]). 0 is taken as 1.
    pub max_fragments: usize,
}

impl Default for RecordConfig {
    /// Both logs, 100 ms, deliver partials, 1024 messages, 4096 remembered,
    /// [`DEFAULT_MAX_FRAGMENTS`] ranges per message.
    fn default() -> Self {
        RecordConfig {
            mode: RecordMode::Both,
            partial_timeout: Duration::from_millis(100),
            partial_action: PartialAction::Deliver,
            max_in_progress: 1024,
            dedup_window: 4096,
            max_fragments: DEFAULT_MAX_FRAGMENTS,
        }
    }
}

/// What [`Tracker::placed`] did with a segment. The datagram QPs place
/// only what [`Tracker::admits`]: the payload is in memory for every
/// outcome but a [`Placed::Stale`] that `admits` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placed {
    /// It started a message (retiring an older one of the same source and
    /// STag, if any).
    Started,
    /// It belongs to the message in progress, which is not complete yet.
    Continued,
    /// It completed its message: a CQ entry is waiting (CQ modes).
    Completed,
    /// Its message was already completed: not recorded again.
    Duplicate,
    /// Not recorded: an older MSN, a late segment of a message already
    /// retired as partial, a malformed range, or beyond the per-message
    /// fragment bound [`RecordConfig::max_fragments`] ([`RecordStats`] says
    /// which).
    Stale,
}

/// Counters of a [`Tracker`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RecordStats {
    /// Messages wholly placed.
    pub completed: u64,
    /// Partial messages reported (`RecordPartial`), whatever retired them.
    pub partial_delivered: u64,
    /// Partial messages dropped without a CQ entry, whatever retired them.
    pub partial_discarded: u64,
    /// Of the partial ones: retired by a newer MSN of the same source and
    /// STag.
    pub retired_by_newer_msn: u64,
    /// Segments of already completed messages.
    pub duplicates: u64,
    /// Segments with an older MSN, or of a message already retired
    /// partial.
    pub stale_segments: u64,
    /// Of the partial ones: retired because `max_in_progress` were tracked.
    pub evicted: u64,
    /// Malformed segments ignored (see the module documentation).
    pub malformed: u64,
    /// Segments not recorded because their message already had
    /// [`RecordConfig::max_fragments`] disjoint ranges (their octets were
    /// placed but are in neither log).
    pub overflow: u64,
    /// Ranges the validity map could not hold ([`MAX_VALID_INTERVALS`]).
    pub validity_overflow: u64,
    /// CQ entries dropped because [`MAX_PENDING_COMPLETIONS`] were waiting.
    pub cq_overflow: u64,
}

/// A segment's message base (`TO − T-MO`) and end within its message
/// (`T-MO + length`); `None` for a range that cannot be a message's.
fn geometry(to: u64, mo: u32, len: u32) -> Option<(u64, u32)> {
    to.checked_add(u64::from(len))?;
    Some((to.checked_sub(u64::from(mo))?, mo.checked_add(len)?))
}

/// Where a segment stands against the messages of its source and STag
/// ([`Tracker::judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// Of the message in progress.
    InProgress,
    /// Of a message already completed.
    Duplicate,
    /// Of a message retired as partial, or older than the one in progress
    /// or the newest retired: dropped.
    Stale,
    /// Of a message newer than the one in progress, which it retires.
    Newer,
    /// Of a message that starts with it (none in progress).
    Fresh,
}

/// Whether MSN `a` is newer than `b` in serial-number arithmetic (RFC 1982
/// on 32 bits): `a ≠ b` and `a − b (mod 2³²) < 2³¹`. Two MSNs exactly 2³¹
/// apart are neither newer nor older.
pub fn msn_newer(a: u32, b: u32) -> bool {
    let d = a.wrapping_sub(b);
    d != 0 && d < 0x8000_0000
}

/// (source, STag): what a message in progress and the history are keyed
/// on (keyed SipHash: peers choose the keys). Every segment compares its
/// key with the in-progress table's remembered one, so the key is plain
/// aligned integers, built where it is compared ([`Tracker::judge`] and
/// the table's lookups are inlined): a key passed through memory right
/// after it was written stalled the load that compared it
/// (`docs/datagram.md` §12.15). The hash takes an IPv4 address as 32 bits,
/// so a key hashes as one SipHash block, as the derived hash of the
/// `DgramAddr` form did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    /// The source address's octets as one number (IPv4 in the low 32 bits).
    ip: u128,
    qpn: u32,
    stag: u32,
    port: u16,
    v6: bool,
}

impl Key {
    #[inline]
    fn new(src: DgramAddr, stag: u32) -> Key {
        let (ip, v6) = match src.ip {
            IpAddr::V4(a) => (u128::from(u32::from(a)), false),
            IpAddr::V6(a) => (u128::from(a), true),
        };
        Key {
            ip,
            qpn: src.qpn,
            stag,
            port: src.port,
            v6,
        }
    }

    /// The source it was made from.
    fn src(&self) -> DgramAddr {
        let ip = if self.v6 {
            IpAddr::V6(Ipv6Addr::from(self.ip))
        } else {
            IpAddr::V4(Ipv4Addr::from(self.ip as u32))
        };
        DgramAddr {
            ip,
            port: self.port,
            qpn: self.qpn,
        }
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // Equal keys have equal `v6` and `ip`, so this agrees with `Eq`.
        if self.v6 {
            h.write_u128(self.ip);
        } else {
            h.write_u32(self.ip as u32);
        }
        h.write_u32(self.qpn);
        h.write_u32(self.stag);
        h.write_u16(self.port);
    }
}

/// The placed ranges of one message: sorted, disjoint, non-adjacent
/// `[start, end)` offsets from the message base. The vector is reused
/// across messages (see [`Tracker`]'s pool).
#[derive(Debug, Clone, Default)]
struct Frags {
    iv: Vec<(u32, u32)>,
}

impl Frags {
    fn as_slice(&self) -> &[(u32, u32)] {
        &self.iv
    }

    /// End of the highest range (0 if none).
    fn end(&self) -> u32 {
        self.iv.last().map_or(0, |r| r.1)
    }

    fn octets(&self) -> u64 {
        self.iv.iter().map(|&(a, b)| u64::from(b - a)).sum()
    }

    /// Whether the ranges are exactly `[0, total)`.
    fn covers(&self, total: u32) -> bool {
        match self.as_slice() {
            [] => total == 0,
            [r] => *r == (0, total),
            _ => false,
        }
    }

    /// Adds `[s, e)` (`s < e`), calling `new(a, b)` for each piece not
    /// covered before, in order. Returns false, having changed nothing and
    /// called nothing, if that would need more than `max` ranges.
    fn add(&mut self, s: u32, e: u32, max: usize, mut new: impl FnMut(u32, u32)) -> bool {
        let iv = &mut self.iv;
        // In-order arrival, the common case: `[s, e)` starts inside or at
        // the end of the highest range, so it can only extend that one
        // (every lower range ends before the highest starts, minus one).
        if let Some(last) = iv.last_mut() {
            if last.0 <= s && s <= last.1 {
                if e > last.1 {
                    new(last.1, e);
                    last.1 = e;
                }
                return true;
            }
        }
        // First range ending at or after s (overlapping or touching), and
        // first range starting after e.
        let i = iv.partition_point(|r| r.1 < s);
        let j = i + iv[i..].partition_point(|r| r.0 <= e);
        if i == j {
            if iv.len() >= max.max(1) {
                return false;
            }
            iv.insert(i, (s, e));
            new(s, e);
            return true;
        }
        let mut cur = s;
        for &(a, b) in &iv[i..j] {
            if a > cur {
                new(cur, a);
            }
            cur = cur.max(b);
        }
        if cur < e {
            new(cur, e);
        }
        iv[i] = (s.min(iv[i].0), e.max(iv[j - 1].1));
        iv.drain(i + 1..j);
        true
    }
}

/// A message in progress.
#[derive(Debug, Clone)]
struct Msg {
    msn: u32,
    base: u64,
    total: Option<u32>,
    frags: Frags,
    /// When it last placed a new octet (or started).
    active: Instant,
    /// Start order, to break ties.
    seq: u64,
}

impl Msg {
    fn complete(&self) -> bool {
        self.total.is_some_and(|t| self.frags.covers(t))
    }
}

/// Why a segment was not recorded.
enum Reject {
    Malformed,
    Overflow,
}

/// Records a well-formed segment `[mo, end)` (base `base`) into `m`, and
/// its new octets into `map`.
#[allow(clippy::too_many_arguments)]
fn apply(
    m: &mut Msg,
    base: u64,
    mo: u32,
    end: u32,
    last: bool,
    now: Instant,
    max_fragments: usize,
    mut map: Option<&mut Vec<(u64, u64)>>,
    validity_overflow: &mut u64,
) -> Result<(), Reject> {
    if base != m.base {
        return Err(Reject::Malformed);
    }
    match m.total {
        Some(t) if end > t || (last && end != t) => return Err(Reject::Malformed),
        None if last && end < m.frags.end() => return Err(Reject::Malformed),
        _ => {}
    }
    if mo < end {
        let mut added = false;
        let ok = m.frags.add(mo, end, max_fragments, |a, b| {
            added = true;
            if let Some(v) = map.as_deref_mut() {
                // base + b <= TO + length, checked by the caller.
                if !set_add(v, base + u64::from(a), base + u64::from(b)) {
                    *validity_overflow += 1;
                }
            }
        });
        if !ok {
            return Err(Reject::Overflow);
        }
        if added {
            // Never earlier: a caller's clock going backwards cannot make
            // a deadline pass sooner.
            m.active = m.active.max(now);
        }
    }
    if last {
        m.total = Some(end);
    }
    Ok(())
}

/// Adds `[s, e)` (`s < e`) to a sorted set of disjoint, non-adjacent
/// intervals. Returns false, changing nothing, if it would need more than
/// [`MAX_VALID_INTERVALS`].
fn set_add(v: &mut Vec<(u64, u64)>, s: u64, e: u64) -> bool {
    // A message placed in order extends the highest range (as in
    // `Frags::add`).
    if let Some(last) = v.last_mut() {
        if last.0 <= s && s <= last.1 {
            last.1 = last.1.max(e);
            return true;
        }
    }
    let i = v.partition_point(|r| r.1 < s);
    let j = i + v[i..].partition_point(|r| r.0 <= e);
    if i == j {
        if v.len() >= MAX_VALID_INTERVALS {
            return false;
        }
        v.insert(i, (s, e));
        return true;
    }
    v[i] = (s.min(v[i].0), e.max(v[j - 1].1));
    v.drain(i + 1..j);
    true
}

/// Removes `[s, e)` from the set. Returns false if a split of a full set
/// had to drop the shorter piece.
fn set_remove(v: &mut Vec<(u64, u64)>, s: u64, e: u64) -> bool {
    if s >= e {
        return true;
    }
    let i = v.partition_point(|r| r.1 <= s);
    let j = i + v[i..].partition_point(|r| r.0 < e);
    if i == j {
        return true;
    }
    let left = (v[i].0 < s).then_some((v[i].0, s));
    let right = (v[j - 1].1 > e).then_some((e, v[j - 1].1));
    match (left, right) {
        (Some(l), Some(r)) if j - i == 1 => {
            if v.len() >= MAX_VALID_INTERVALS {
                v[i] = if l.1 - l.0 >= r.1 - r.0 { l } else { r };
                return false;
            }
            v[i] = l;
            v.insert(i + 1, r);
        }
        (Some(l), Some(r)) => {
            v[i] = l;
            v[i + 1] = r;
            v.drain(i + 2..j);
        }
        (Some(x), None) | (None, Some(x)) => {
            v[i] = x;
            v.drain(i + 1..j);
        }
        (None, None) => {
            v.drain(i..j);
        }
    }
    true
}

/// Retired messages, remembered in retirement order.
#[derive(Debug, Default)]
struct History {
    fifo: VecDeque<(Key, u32)>,
    /// (key, MSN) → completed.
    outcome: HashMap<(Key, u32), bool>,
    /// Newest retired MSN per key still in the window.
    latest: HashMap<Key, u32>,
}

impl History {
    fn insert(&mut self, cap: usize, key: Key, msn: u32, completed: bool) {
        if cap == 0 {
            return;
        }
        // One lookup of (key, MSN): known already, or inserted here; the
        // oldest entries are forgotten afterwards (never the one just
        // inserted: it is at the back of a FIFO longer than one).
        match self.outcome.entry((key, msn)) {
            Entry::Occupied(mut o) => {
                *o.get_mut() |= completed;
                return;
            }
            Entry::Vacant(v) => {
                v.insert(completed);
            }
        }
        self.fifo.push_back((key, msn));
        while self.fifo.len() > cap {
            let Some((k, m)) = self.fifo.pop_front() else {
                break;
            };
            self.outcome.remove(&(k, m));
            if let Entry::Occupied(o) = self.latest.entry(k) {
                if *o.get() == m {
                    o.remove();
                }
            }
        }
        match self.latest.entry(key) {
            Entry::Occupied(mut o) => {
                if msn_newer(msn, *o.get()) {
                    *o.get_mut() = msn;
                }
            }
            Entry::Vacant(v) => {
                v.insert(msn);
            }
        }
    }

    fn forget_stag(&mut self, stag: u32) {
        self.fifo.retain(|(k, _)| k.stag != stag);
        self.outcome.retain(|(k, _), _| k.stag != stag);
        self.latest.retain(|k, _| k.stag != stag);
    }
}

/// Write-Record bookkeeping for one datagram QP (module documentation has
/// the rules).
#[derive(Debug)]
pub struct Tracker {
    cfg: RecordConfig,
    /// Messages in progress; a stream's segments reach the same entry
    /// one after another, which the table finds without hashing.
    inprog: PeerTable<Key, Msg>,
    history: History,
    /// Validity maps by STag; a stream's segments reach the same one one
    /// after another, which the table finds without hashing.
    valid: PeerTable<u32, Vec<(u64, u64)>>,
    cq: VecDeque<WorkCompletion>,
    /// No message in progress times out before this (a lower bound).
    next_deadline: Option<Instant>,
    seq: u64,
    stats: RecordStats,
    /// Reused by `handle_timeout`.
    scratch: Vec<(Instant, u64, Key)>,
    /// Empty range sets of retired messages, taken by new ones (at most
    /// `SPARE_FRAGS`).
    spare: Vec<Vec<(u32, u32)>>,
}

impl Tracker {
    /// A tracker with nothing recorded.
    pub fn new(cfg: RecordConfig) -> Tracker {
        Tracker {
            cfg,
            inprog: PeerTable::new(),
            history: History::default(),
            valid: PeerTable::new(),
            cq: VecDeque::new(),
            next_deadline: None,
            seq: 0,
            stats: RecordStats::default(),
            scratch: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &RecordConfig {
        &self.cfg
    }

    /// Changes the partial-message timeout; it applies to the messages in
    /// progress too (measured from their last new octet).
    pub fn set_partial_timeout(&mut self, timeout: Duration) {
        self.cfg.partial_timeout = timeout;
        self.next_deadline = self
            .inprog
            .iter()
            .filter_map(|(_, m)| m.active.checked_add(timeout))
            .min();
    }

    /// Changes what partial messages retired from now on give.
    pub fn set_partial_action(&mut self, action: PartialAction) {
        self.cfg.partial_action = action;
    }

    /// A Write-Record segment whose payload the caller has ALREADY written
    /// to memory. `to` is the segment's TO, `mo` its T-MO (so the message
    /// base is `to - mo`), `msn` its T-MSN, `len` its payload length, `last`
    /// its L bit.
    ///
    /// Returns what happened (new message / continued / completed /
    /// duplicate / stale older MSN ignored…) so the caller can count it.
    #[allow(clippy::too_many_arguments)]
    pub fn placed(
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
        let Some((base, end)) = geometry(to, mo, len) else {
            self.stats.malformed += 1;
            return Placed::Stale;
        };
        let key = Key::new(src, stag);
        match self.judge(key, msn) {
            Judged::InProgress => {
                let Some(m) = self.inprog.get_mut(&key) else {
                    return Placed::Stale; // not reached: judged in progress
                };
                let map = if self.cfg.mode.map() {
                    Some(self.valid.get_or_insert_with(stag, Vec::new))
                } else {
                    None
                };
                let r = apply(
                    m,
                    base,
                    mo,
                    end,
                    last,
                    now,
                    self.cfg.max_fragments,
                    map,
                    &mut self.stats.validity_overflow,
                );
                let done = r.is_ok() && m.complete();
                match r {
                    Err(r) => self.rejected(r),
                    Ok(()) if done => {
                        if let Some(m) = self.inprog.remove(&key) {
                            self.retire(key, m);
                        }
                        Placed::Completed
                    }
                    Ok(()) => Placed::Continued,
                }
            }
            Judged::Duplicate => {
                self.stats.duplicates += 1;
                Placed::Duplicate
            }
            Judged::Stale => {
                self.stats.stale_segments += 1;
                Placed::Stale
            }
            Judged::Newer => {
                if let Some(old) = self.inprog.remove(&key) {
                    self.stats.retired_by_newer_msn += 1;
                    self.retire(key, old);
                }
                self.start(key, base, mo, end, msn, last, now)
            }
            Judged::Fresh => self.start(key, base, mo, end, msn, last, now),
        }
    }

    /// Where a segment of message `msn` of `key` stands, before its ranges
    /// are looked at: [`Tracker::placed`] acts on it, [`Tracker::admits`]
    /// answers with it. The message in progress first (an MSN in progress
    /// is never in the history: `start` is reached only past it), then the
    /// history of retired messages, then the MSN order.
    #[inline(always)]
    fn judge(&self, key: Key, msn: u32) -> Judged {
        let cur = self.inprog.get_inlined(&key).map(|m| m.msn);
        if cur == Some(msn) {
            return Judged::InProgress;
        }
        if let Some(&completed) = self.history.outcome.get(&(key, msn)) {
            return if completed {
                Judged::Duplicate
            } else {
                Judged::Stale
            };
        }
        match cur {
            Some(cur) if msn_newer(msn, cur) => Judged::Newer,
            Some(_) => Judged::Stale,
            None => match self.history.latest.get(&key) {
                Some(&l) if !msn_newer(msn, l) => Judged::Stale,
                _ => Judged::Fresh,
            },
        }
    }

    /// Whether a segment of message `msn` from `src` to `stag` (at `to`,
    /// `mo`, `len` octets) may be placed: false exactly when
    /// [`Tracker::placed`] would drop it as stale without looking at the
    /// message's ranges — a range that cannot be a message's (`TO < T-MO`,
    /// an overflow), an MSN older than the message in progress or than the
    /// newest retired one, a late segment of a message already retired as
    /// partial. A caller places only what this admits, so that memory
    /// changes only where the log says: after a reordering (a segment of
    /// the next message first), the late tail of the message it retired
    /// leaves memory as the partial record and the validity map describe
    /// it. A duplicate of a message already completed is refused too:
    /// every octet of it was placed once, and placing it again could only
    /// overwrite what the application wrote there since. The rejections
    /// that need the message's ranges (a base or an end contradicting it,
    /// the fragment bound) are still found by `placed` after placement.
    pub fn admits(&self, src: DgramAddr, stag: u32, to: u64, mo: u32, msn: u32, len: u32) -> bool {
        geometry(to, mo, len).is_some()
            && !matches!(
                self.judge(Key::new(src, stag), msn),
                Judged::Stale | Judged::Duplicate
            )
    }

    /// Places a tagged segment's payload as a datagram QP does, before it
    /// reports a Write-Record segment with [`Tracker::placed`]: an RDMA
    /// Write (`record` false) is written; a Write-Record segment is written
    /// only if [`Tracker::admits`] it, else (and when empty) its STag is
    /// only checked. What the memory said (an access error is the caller's
    /// to report).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn place_tagged<M: Memory>(
        &self,
        mem: &mut M,
        record: bool,
        src: DgramAddr,
        stag: u32,
        to: u64,
        mo: u32,
        msn: u32,
        payload: &[u8],
    ) -> Result<(), MemError> {
        let len = payload.len() as u32;
        if record && (payload.is_empty() || !self.admits(src, stag, to, mo, msn, len)) {
            mem.check_remote_write(stag, to, u64::from(len))
        } else if payload.is_empty() {
            Ok(())
        } else {
            mem.remote_write(stag, to, payload)
        }
    }

    fn rejected(&mut self, r: Reject) -> Placed {
        match r {
            Reject::Malformed => self.stats.malformed += 1,
            Reject::Overflow => self.stats.overflow += 1,
        }
        Placed::Stale
    }

    /// Starts message `msn` of `key` with a well-formed first segment.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        key: Key,
        base: u64,
        mo: u32,
        end: u32,
        msn: u32,
        last: bool,
        now: Instant,
    ) -> Placed {
        let mut m = Msg {
            msn,
            base,
            total: None,
            frags: Frags {
                iv: self.spare.pop().unwrap_or_default(),
            },
            active: now,
            seq: self.seq,
        };
        self.seq += 1;
        let map = if self.cfg.mode.map() {
            Some(self.valid.get_or_insert_with(key.stag, Vec::new))
        } else {
            None
        };
        // A fresh message takes any well-formed segment.
        if let Err(r) = apply(
            &mut m,
            base,
            mo,
            end,
            last,
            now,
            self.cfg.max_fragments,
            map,
            &mut self.stats.validity_overflow,
        ) {
            self.recycle(m.frags);
            return self.rejected(r);
        }
        if m.complete() {
            self.retire(key, m);
            return Placed::Completed;
        }
        while self.inprog.len() >= self.cfg.max_in_progress.max(1) {
            let oldest = self
                .inprog
                .iter()
                .min_by_key(|(_, m)| (m.active, m.seq))
                .map(|(k, _)| *k);
            let Some(old) = oldest.and_then(|k| self.inprog.remove(&k).map(|m| (k, m))) else {
                break;
            };
            self.stats.evicted += 1;
            self.retire(old.0, old.1);
        }
        self.inprog.insert(key, m);
        if let Some(d) = now.checked_add(self.cfg.partial_timeout) {
            self.next_deadline = Some(self.next_deadline.map_or(d, |n| n.min(d)));
        }
        Placed::Started
    }

    /// Retires `m` (already out of `inprog`): counts it, queues its CQ
    /// entry, remembers it.
    fn retire(&mut self, key: Key, m: Msg) {
        let complete = m.complete();
        let status = if complete {
            self.stats.completed += 1;
            Some(WcStatus::Success)
        } else {
            match self.cfg.partial_action {
                PartialAction::Deliver => {
                    self.stats.partial_delivered += 1;
                    Some(WcStatus::RecordPartial)
                }
                PartialAction::Discard => {
                    self.stats.partial_discarded += 1;
                    None
                }
            }
        };
        if let Some(status) = status.filter(|_| self.cfg.mode.cq()) {
            if self.cq.len() >= MAX_PENDING_COMPLETIONS {
                self.stats.cq_overflow += 1;
            } else {
                self.cq.push_back(entry(key, &m, status));
            }
        }
        self.history
            .insert(self.cfg.dedup_window, key, m.msn, complete);
        self.recycle(m.frags);
        if self.inprog.is_empty() {
            self.next_deadline = None;
        }
    }

    /// Keeps a retired message's range set for the next message.
    fn recycle(&mut self, mut f: Frags) {
        if self.spare.len() < SPARE_FRAGS && f.iv.capacity() > 0 {
            f.iv.clear();
            self.spare.push(f.iv);
        }
    }

    /// When [`Tracker::handle_timeout`] should next be called (it may be
    /// early; never late).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.next_deadline
    }

    /// Retires, as partial, every message that has placed no new octet for
    /// the partial timeout as of `now`, oldest first.
    pub fn handle_timeout(&mut self, now: Instant) {
        let timeout = self.cfg.partial_timeout;
        let mut expired = std::mem::take(&mut self.scratch);
        expired.clear();
        let mut next: Option<Instant> = None;
        for (k, m) in self.inprog.iter() {
            match m.active.checked_add(timeout) {
                Some(d) if d <= now => expired.push((m.active, m.seq, *k)),
                Some(d) => next = Some(next.map_or(d, |n| n.min(d))),
                None => {}
            }
        }
        expired.sort_unstable_by_key(|&(a, s, _)| (a, s));
        for &(_, _, k) in &expired {
            if let Some(m) = self.inprog.remove(&k) {
                self.retire(k, m);
            }
        }
        expired.clear();
        self.scratch = expired;
        self.next_deadline = next;
    }

    /// Next CQ entry to hand to the QP's receive CQ (opcode
    /// `RecvWriteRecord`, `wr_id` 0, `src` and `record` filled, status
    /// `Success` or `RecordPartial`).
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.cq.pop_front()
    }

    /// Validity map: the valid octet ranges (absolute TOs, `[start, end)`)
    /// of `stag` that intersect `[to, to+len)`, clipped to it, in order;
    /// writes into `out`, returns the count (and whether more exist).
    pub fn valid_ranges(
        &self,
        stag: u32,
        to: u64,
        len: u64,
        out: &mut [(u64, u64)],
    ) -> (usize, bool) {
        let Some(v) = self.valid.get(&stag) else {
            return (0, false);
        };
        if len == 0 {
            return (0, false);
        }
        let end = to.saturating_add(len);
        let i = v.partition_point(|r| r.1 <= to);
        let mut n = 0;
        for &(a, b) in v[i..].iter().take_while(|r| r.0 < end) {
            let Some(slot) = out.get_mut(n) else {
                return (n, true);
            };
            *slot = (a.max(to), b.min(end));
            n += 1;
        }
        (n, false)
    }

    /// Whether every octet of `[to, to+len)` of `stag` is valid (true for
    /// `len` 0).
    pub fn is_valid(&self, stag: u32, to: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        let (Some(v), Some(end)) = (self.valid.get(&stag), to.checked_add(len)) else {
            return false;
        };
        let i = v.partition_point(|r| r.1 <= to);
        v.get(i).is_some_and(|&(a, b)| a <= to && end <= b)
    }

    /// Clears validity of `[to, to+len)` of `stag` (the application
    /// consumed the data). The end saturates at `u64::MAX`.
    pub fn clear(&mut self, stag: u32, to: u64, len: u64) {
        if let Some(v) = self.valid.get_mut(&stag) {
            if !set_remove(v, to, to.saturating_add(len)) {
                self.stats.validity_overflow += 1;
            }
        }
    }

    /// Drops all state for `stag` (its region was deregistered): messages
    /// in progress (without CQ entries), remembered messages and the
    /// validity map. CQ entries already queued stay.
    pub fn forget_stag(&mut self, stag: u32) {
        self.inprog.retain(|k, _| k.stag != stag);
        self.valid.remove(&stag);
        self.history.forget_stag(stag);
        if self.inprog.is_empty() {
            self.next_deadline = None;
        }
    }

    /// The counters.
    pub fn stats(&self) -> RecordStats {
        self.stats
    }
}

/// The CQ entry of a retired message.
fn entry(key: Key, m: &Msg, status: WcStatus) -> WorkCompletion {
    let frags = m.frags.as_slice();
    let mut ranges = [(0u32, 0u32); MAX_RECORD_RANGES];
    let mut n = 0u8;
    for (slot, &(a, b)) in ranges.iter_mut().zip(frags) {
        *slot = (a, b - a);
        n += 1;
    }
    let octets = u32::try_from(m.frags.octets()).unwrap_or(u32::MAX);
    let mut wc = WorkCompletion::new(0, status, WcOpcode::RecvWriteRecord, octets);
    wc.src = Some(key.src());
    wc.record = Some(WriteRecordInfo {
        stag: key.stag,
        to: m.base,
        len: m.total.unwrap_or(m.frags.end()),
        msn: m.msn,
        ranges,
        n_ranges: n,
        ranges_truncated: frags.len() > MAX_RECORD_RANGES,
    });
    wc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

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
}
