//! Retired messages, remembered in retirement order, so duplicates of a
//! finished message are never recorded twice.
//!
//! Contract: at most the configured number of messages are remembered;
//! the oldest are forgotten first.

use super::*;

/// Retired messages, remembered in retirement order.
#[derive(Debug, Default)]
pub(super) struct History {
    pub(super) fifo: VecDeque<(Key, u32)>,
    /// (key, MSN) → completed.
    pub(super) outcome: HashMap<(Key, u32), bool>,
    /// Newest retired MSN per key still in the window.
    pub(super) latest: HashMap<Key, u32>,
}

impl History {
    pub(super) fn insert(&mut self, cap: usize, key: Key, msn: u32, completed: bool) {
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

    pub(super) fn forget_stag(&mut self, stag: u32) {
        self.fifo.retain(|(k, _)| k.stag != stag);
        self.outcome.retain(|(k, _), _| k.stag != stag);
        self.latest.retain(|k, _| k.stag != stag);
    }
}
