//! The target side: attaching an incoming RC connection to the invite it
//! answers, and direct connections.
//!
//! Contract: an RC connection is accepted only with the cookie of an
//! awaited invite for its DCT.

use super::*;

impl DcTable {
    /// Target: an RC connection request presents `cookie` for DCT `dct`
    /// and initiator connection `conn`. The target connection's id if it
    /// matches an awaited one (which is then live); `None` otherwise
    /// (refuse the request).
    pub fn target_attach(&mut self, cookie: u64, dct: u32, conn: u64) -> Option<ConnId> {
        let id = *self.cookies.get(&cookie)?;
        let e = self.entries.get_mut(&id)?;
        match e.state {
            State::TargetPending { dct: d, .. }
                if d == dct && e.remote.map(|r| r.1) == Some(conn) =>
            {
                e.state = State::TargetLive;
                self.cookies.remove(&cookie);
                self.stats.target_accepts += 1;
                Some(id)
            }
            _ => None,
        }
    }

    /// Target: a direct RC connection request (no cookie) from the
    /// initiator whose invitations come from `src`, for its connection
    /// `conn`, presents `key` for DCT `dct`. The target connection's id
    /// (then live) if the key is right and a slot is free (or already
    /// reserved by that initiator's invitation); `None`: refuse the
    /// request (counted in `direct_refused` only — the invitation decides
    /// and reports wrong keys and busy tables).
    pub fn target_direct(
        &mut self,
        now: Instant,
        src: DgramAddr,
        dct: u32,
        key: u64,
        conn: u64,
    ) -> Option<ConnId> {
        if self.dcts.get(&dct) != Some(&key) {
            self.stats.direct_refused += 1;
            return None;
        }
        if let Some(&id) = self.seen.get(&(src, conn)) {
            // The invitation came first: take the slot it reserved.
            let e = self.entries.get_mut(&id)?;
            return match e.state {
                State::TargetPending { cookie, dct: d, .. } if d == dct => {
                    e.state = State::TargetLive;
                    e.last_used = now;
                    self.cookies.remove(&cookie);
                    self.stats.target_accepts += 1;
                    self.stats.direct_accepts += 1;
                    Some(id)
                }
                _ => {
                    self.stats.direct_refused += 1;
                    None
                }
            };
        }
        if self.live >= self.cfg.capacity && !self.evict_one(now) {
            self.stats.direct_refused += 1;
            return None;
        }
        let id = self.new_id();
        let stamp = self.stamp();
        self.entries.insert(
            id,
            Entry {
                target: DcTarget {
                    addr: src,
                    key: 0,
                    local: 0,
                },
                remote: Some((src, conn)),
                state: State::TargetLive,
                busy: 0,
                last_used: now,
                stamp,
                direct: Direct::Off,
                restarts: 0,
                rev: Rev::default(),
            },
        );
        self.take_slot();
        // A later (or duplicated) invitation for it is answered by
        // nothing: the initiator is connected.
        self.seen.insert((src, conn), id);
        self.stats.target_accepts += 1;
        self.stats.direct_accepts += 1;
        Some(id)
    }

    /// Ids of the target-side connections (to check which closed).
    pub fn target_connections(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.entries
            .iter()
            .filter(|(_, e)| matches!(e.state, State::TargetLive))
            .map(|(&id, _)| id)
    }
}
