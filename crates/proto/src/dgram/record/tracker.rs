//! The Write-Record [`Tracker`] of one datagram QP: placement checks,
//! messages in progress, partial-message timeouts, the completion log and
//! the validity maps.

use super::*;

/// Write-Record bookkeeping for one datagram QP (module documentation has
/// the rules).
#[derive(Debug)]
pub struct Tracker {
    pub(super) cfg: RecordConfig,
    /// Messages in progress; a stream's segments reach the same entry
    /// one after another, which the table finds without hashing.
    pub(super) inprog: PeerTable<Key, Msg>,
    pub(super) history: History,
    /// Validity maps by STag; a stream's segments reach the same one one
    /// after another, which the table finds without hashing.
    pub(super) valid: PeerTable<u32, Vec<(u64, u64)>>,
    pub(super) cq: VecDeque<WorkCompletion>,
    /// No message in progress times out before this (a lower bound).
    pub(super) next_deadline: Option<Instant>,
    pub(super) seq: u64,
    pub(super) stats: RecordStats,
    /// Reused by `handle_timeout`.
    pub(super) scratch: Vec<(Instant, u64, Key)>,
    /// Empty range sets of retired messages, taken by new ones (at most
    /// `SPARE_FRAGS`).
    pub(super) spare: Vec<Vec<(u32, u32)>>,
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
