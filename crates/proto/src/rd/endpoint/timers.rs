//! Timers: the heap of per-peer deadlines (retransmission, delayed ACK,
//! window probe, idle expiry), firing them, failing a peer at the retry
//! limit, and giving back memory after bursts.
//!
//! Contract: a heap entry may be stale (its peer's deadline moved); firing
//! checks the peer's current deadline, so stale entries do nothing.

use super::*;

/// A timer heap entry; ordered by time, then by peer id.
#[derive(Debug, Clone, Copy)]
pub(super) struct TimerEntry<K> {
    pub(super) at: Instant,
    pub(super) id: u64,
    pub(super) key: K,
}

impl<K> PartialEq for TimerEntry<K> {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at && self.id == o.id
    }
}
impl<K> Eq for TimerEntry<K> {}
impl<K> PartialOrd for TimerEntry<K> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<K> Ord for TimerEntry<K> {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.at, self.id).cmp(&(o.at, o.id))
    }
}

impl<K: PeerKey, T: Copy> RdEndpoint<K, T> {
    /// The earliest instant [`RdEndpoint::handle_timeout`] has work.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(Reverse(top)) = self.timers.peek() {
            let live = self
                .peers
                .get(&top.key)
                .is_some_and(|p| p.id == top.id && p.timer_at == Some(top.at));
            if live {
                return Some(top.at);
            }
            self.timers.pop();
        }
        None
    }

    /// Runs every timer due at `now`: delayed ACKs, retransmissions
    /// (failing peers past the retry limit), probes and idle expiry.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(Reverse(top)) = self.timers.peek().copied() {
            if top.at > now {
                break;
            }
            self.timers.pop();
            let Some(p) = self.peers.get_mut(&top.key) else {
                continue;
            };
            if p.id != top.id || p.timer_at != Some(top.at) {
                continue;
            }
            p.timer_at = None;
            self.fire(top.key, now);
        }
    }

    pub(super) fn fire(&mut self, key: K, now: Instant) {
        let cfg = self.cfg;
        let Some(p) = self.peers.get_mut(&key) else {
            return;
        };
        if let Some(r) = p.rx.as_mut() {
            if r.ack_at.is_some_and(|a| a <= now) {
                r.ack_at = None;
                r.ack_now = true;
            }
        }
        let limit = p.limit(&cfg);
        let base = p.rto;
        let mut failed = false;
        if let Some(t) = p.tx.as_mut() {
            if t.rto_at.is_some_and(|a| a <= now) {
                t.rto_at = None;
                let outstanding = t.high > 0;
                let probing = !outstanding && !t.queue.is_empty() && limit == 0;
                if outstanding || probing {
                    self.stats.timeouts += 1;
                    t.retries += 1;
                    if t.retries > cfg.retry_limit {
                        failed = true;
                    } else {
                        if outstanding {
                            t.next = 0;
                            t.sample = None;
                            t.rewound_at = Some(t.una);
                        } else {
                            t.probe_due = true;
                        }
                        let rto = base.saturating_mul(1 << t.retries.min(20));
                        t.rto_at = Some(now + rto.min(cfg.rto_max));
                    }
                }
            }
        }
        if failed {
            self.fail(key);
        } else if p.quiescent() && now >= p.last_activity + cfg.idle_timeout {
            self.peers.remove(&key);
            self.stats.peers_expired += 1;
            self.events.push_back(Event::PeerExpired { peer: key });
            self.shrink();
            return;
        }
        self.touch(key);
    }

    pub(super) fn fail(&mut self, key: K) {
        let Some(p) = self.peers.get_mut(&key) else {
            return;
        };
        let Some(t) = p.tx.take() else {
            return;
        };
        p.holds.clear();
        p.srtt = None;
        p.rttvar = Duration::ZERO;
        p.rto = self.cfg.rto_initial;
        self.stats.peers_failed += 1;
        self.events.push_back(Event::PeerFailed {
            peer: key,
            abandoned: t.queue.len(),
        });
        for token in t.queue {
            self.events.push_back(Event::Abandoned { peer: key, token });
        }
    }

    /// Re-registers the peer's deadline and ready state after a change.
    pub(super) fn touch(&mut self, key: K) {
        let cfg = self.cfg;
        let Some(p) = self.peers.get_mut(&key) else {
            return;
        };
        if !p.ready && p.has_work(&cfg) {
            p.ready = true;
            self.ready.push_back(key);
        }
        let d = p.deadline(&cfg);
        if d != p.timer_at {
            p.timer_at = d;
            if let Some(at) = d {
                self.timers.push(Reverse(TimerEntry { at, id: p.id, key }));
            }
        }
        if self.timers.len() > 2 * self.peers.len() + 64 {
            self.compact_timers();
        }
    }

    pub(super) fn compact_timers(&mut self) {
        let peers = &self.peers;
        self.timers.retain(|Reverse(e)| {
            peers
                .get(&e.key)
                .is_some_and(|p| p.id == e.id && p.timer_at == Some(e.at))
        });
    }

    pub(super) fn shrink(&mut self) {
        let n = self.peers.len();
        if self.peers.capacity() > 4 * n + 64 {
            self.peers.shrink_to(2 * n);
            self.compact_timers();
            self.timers.shrink_to(2 * n);
            self.ready.shrink_to(2 * n);
        }
    }
}

/// Capacity a drained output queue keeps whatever the number of peers: a
/// burst up to this size never reallocates.
pub(super) const QUEUE_FLOOR: usize = 1024;

/// Gives back the memory of an empty queue that a burst (every peer
/// expiring at once, a wave of resets) grew far beyond what the peers now
/// held need, so idle memory follows the peer count and not its peak.
pub(super) fn shrink_drained<X>(q: &mut VecDeque<X>, peers: usize) {
    let keep = QUEUE_FLOOR + 2 * peers;
    if q.is_empty() && q.capacity() > 2 * keep {
        q.shrink_to(keep);
    }
}
