//! A table of peers for the datagram QPs (and of the Write-Record
//! messages in progress, keyed by source and STag, and of their validity
//! maps, keyed by STag): a hash index over a
//! dense vector of entries that remembers where the last entry it handed
//! out for change was found.
//!
//! Contract: it behaves as a `HashMap<K, V>` for the operations it has
//! (`get`, `get_mut`, `get_or_insert_with`, `insert`, `insert_new`,
//! `remove`, `retain`, `contains_key`, `len`, `is_empty`, `iter`), with
//! iteration in no particular order.
//! What it adds is speed for runs of lookups of one key: one datagram to
//! or from a peer reaches its entry several times (RD: enqueue, pump,
//! transmit, ACK, window, timers, the QP's own per-peer state), a stream
//! goes to one peer, and the maps are keyed SipHash (peers choose the
//! keys) at ~5 ns a hash, which without the remembered slot came to a
//! fifth of RD's sender time. Lookups through `&self` use the remembered
//! slot but do not move it.

use std::collections::HashMap;
use std::hash::Hash;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct PeerTable<K, V> {
    index: HashMap<K, usize>,
    slots: Vec<(K, V)>,
    /// The key and slot of the last `get_mut` (or insertion) that found its
    /// peer; cleared when a removal moves entries.
    last: Option<(K, usize)>,
}

impl<K: Copy + Eq + Hash, V> PeerTable<K, V> {
    /// An empty table.
    pub(crate) fn new() -> Self {
        PeerTable {
            index: HashMap::new(),
            slots: Vec::new(),
            last: None,
        }
    }

    /// Peers in the table.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Entries the table has room for without growing.
    pub(crate) fn capacity(&self) -> usize {
        self.index.capacity().max(self.slots.capacity())
    }

    /// Gives back room beyond `n` entries (or the length, if larger).
    pub(crate) fn shrink_to(&mut self, n: usize) {
        self.index.shrink_to(n);
        self.slots.shrink_to(n);
    }

    #[inline(always)]
    fn slot(&self, key: &K) -> Option<usize> {
        match self.last {
            Some((k, i)) if k == *key => Some(i),
            _ => self.index.get(key).copied(),
        }
    }

    /// Whether `key` has an entry.
    #[inline]
    pub(crate) fn contains_key(&self, key: &K) -> bool {
        self.slot(key).is_some()
    }

    /// `key`'s entry.
    #[inline]
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.slot(key).map(|i| &self.slots[i].1)
    }

    /// [`PeerTable::get`], always inlined: for a caller that builds `key`
    /// just before the lookup. Through a call, the key goes to memory and
    /// is read back at once by wider loads than wrote it, which the CPU
    /// cannot forward (a stall of tens of cycles). Not the default: inlining every lookup of the RD tables
    /// made RD's latency worse.
    #[inline(always)]
    pub(crate) fn get_inlined(&self, key: &K) -> Option<&V> {
        self.slot(key).map(|i| &self.slots[i].1)
    }

    /// `key`'s entry, to change; remembered for the next lookup.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        // The remembered entry needs no store (most lookups: one
        // datagram reaches its peer many times).
        let i = match self.last {
            Some((k, i)) if k == *key => i,
            _ => {
                let i = *self.index.get(key)?;
                self.last = Some((*key, i));
                i
            }
        };
        Some(&mut self.slots[i].1)
    }

    /// `key`'s entry, made by `make` if it has none.
    #[inline]
    pub(crate) fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let i = match self.slot(&key) {
            Some(i) => i,
            None => {
                self.index.insert(key, self.slots.len());
                self.slots.push((key, make()));
                self.slots.len() - 1
            }
        };
        self.last = Some((key, i));
        &mut self.slots[i].1
    }

    /// Adds an entry for a key that has none (the caller checked).
    pub(crate) fn insert_new(&mut self, key: K, value: V) {
        debug_assert!(!self.contains_key(&key), "insert_new of a known key");
        self.get_or_insert_with(key, || value);
    }

    /// Sets `key`'s entry to `value`; the previous one, if any (as
    /// `HashMap::insert`).
    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        if let Some(i) = self.slot(&key) {
            self.last = Some((key, i));
            return Some(std::mem::replace(&mut self.slots[i].1, value));
        }
        self.index.insert(key, self.slots.len());
        self.slots.push((key, value));
        self.last = Some((key, self.slots.len() - 1));
        None
    }

    /// True if the table has no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Keeps only the entries `keep` accepts (as `HashMap::retain`).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        let mut i = 0;
        while i < self.slots.len() {
            let (k, v) = &mut self.slots[i];
            if keep(k, v) {
                i += 1;
            } else {
                let k = *k;
                // The last entry moves into slot `i`, which is looked at next.
                self.remove(&k);
            }
        }
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.slots.iter().map(|(k, v)| (k, v))
    }

    /// Takes `key`'s entry out; the last entry moves into its slot.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.index.remove(key)?;
        self.last = None;
        let (_, v) = self.slots.swap_remove(i);
        if let Some((moved, _)) = self.slots.get(i) {
            if let Some(at) = self.index.get_mut(moved) {
                *at = i;
            }
        }
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, u32),
        Remove(u8),
        Get(u8),
        Bump(u8),
        Replace(u8, u32),
        RetainOver(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Eight keys, so that lookups, removals and re-insertions of one
        // key follow each other often.
        prop_oneof![
            (0u8..8, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (0u8..8).prop_map(Op::Remove),
            (0u8..8).prop_map(Op::Get),
            (0u8..8).prop_map(Op::Bump),
            (0u8..8, any::<u32>()).prop_map(|(k, v)| Op::Replace(k, v)),
            any::<u32>().prop_map(Op::RetainOver),
        ]
    }

    proptest! {
        /// Every operation answers as a HashMap does, whatever the
        /// remembered slot and however removals moved entries.
        #[test]
        fn behaves_as_a_hash_map(ops in proptest::collection::vec(op(), 0..200)) {
            let mut t: PeerTable<u8, u32> = PeerTable::new();
            let mut m: HashMap<u8, u32> = HashMap::new();
            for o in ops {
                match o {
                    Op::Insert(k, v) => {
                        *t.get_or_insert_with(k, || v) = v;
                        m.insert(k, v);
                    }
                    Op::Remove(k) => prop_assert_eq!(t.remove(&k), m.remove(&k)),
                    Op::Get(k) => {
                        prop_assert_eq!(t.get(&k), m.get(&k));
                        prop_assert_eq!(t.get_inlined(&k), m.get(&k));
                        prop_assert_eq!(t.contains_key(&k), m.contains_key(&k));
                    }
                    Op::Bump(k) => {
                        let a = t.get_mut(&k).map(|v| { *v = v.wrapping_add(1); *v });
                        let b = m.get_mut(&k).map(|v| { *v = v.wrapping_add(1); *v });
                        prop_assert_eq!(a, b);
                    }
                    Op::Replace(k, v) => prop_assert_eq!(t.insert(k, v), m.insert(k, v)),
                    Op::RetainOver(x) => {
                        t.retain(|_, v| *v > x);
                        m.retain(|_, v| *v > x);
                    }
                }
                prop_assert_eq!(t.len(), m.len());
                prop_assert_eq!(t.is_empty(), m.is_empty());
                let mut seen: Vec<(u8, u32)> = t.iter().map(|(k, v)| (*k, *v)).collect();
                let mut want: Vec<(u8, u32)> = m.iter().map(|(k, v)| (*k, *v)).collect();
                seen.sort_unstable();
                want.sort_unstable();
                prop_assert_eq!(seen, want);
            }
        }
    }

    #[test]
    fn removal_moves_the_last_entry_and_forgets_the_remembered_slot() {
        let mut t: PeerTable<u8, &str> = PeerTable::new();
        t.insert_new(1, "a");
        t.insert_new(2, "b");
        t.insert_new(3, "c");
        assert_eq!(t.get_mut(&3).copied(), Some("c"));
        assert_eq!(t.remove(&1), Some("a"));
        // 3 moved into slot 0: the remembered slot must not answer for it.
        assert_eq!(t.get(&3), Some(&"c"));
        assert_eq!(t.get(&2), Some(&"b"));
        assert_eq!(t.get(&1), None);
        assert_eq!(t.remove(&1), None);
        t.shrink_to(0);
        assert_eq!(t.len(), 2);
    }
}
