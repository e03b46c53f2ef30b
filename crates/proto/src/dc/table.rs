//! The connection table's bookkeeping: per-connection state, slots and
//! their eviction, ids, cookies and nonces, closing and removal, and
//! admitting connections waiting for a slot.
//!
//! Contract: [`DcTable::live`] never exceeds the configured capacity; a
//! removed connection leaves no cookie, nonce or index behind.

use super::*;

#[derive(Debug, Clone, Copy)]
pub(super) enum State {
    /// Initiator, no slot yet.
    Waiting,
    /// Initiator, invitation outstanding (`sent`: the first Invite has
    /// gone; not yet while a direct attempt has its grace period).
    Inviting {
        sent: bool,
        next_tx: Instant,
        rto: Duration,
        deadline: Instant,
    },
    /// Initiator, Accept received, RC connection being set up.
    Connecting,
    /// Initiator, connected.
    Live,
    /// Target, Accept sent, RC connection awaited.
    TargetPending {
        cookie: u64,
        expires: Instant,
        dct: u32,
    },
    /// Target, connected.
    TargetLive,
    /// Reverse user: Bind sent over UD, answer awaited.
    Binding {
        next_tx: Instant,
        rto: Duration,
        deadline: Instant,
    },
    /// Initiator whose receive side is bound: Unbind sent, the peer's
    /// Unbound awaited before the close.
    Closing {
        next_tx: Instant,
        rto: Duration,
        deadline: Instant,
    },
}

/// Reverse use of a connection (`docs/dc.md` §2).
#[derive(Debug, Default)]
pub(super) struct Rev {
    /// Initiator (offering side): the nonce offered (0: none), the DCTs
    /// offered, the DCT its receive side is bound to.
    pub(super) nonce: u64,
    pub(super) dcts: Vec<u32>,
    pub(super) bound: Option<u32>,
    /// Target side: the peer's offer (nonce, DCTs), our protection
    /// domain, whether it may still be bound, the reverse-use entry, and
    /// where to answer an Unbind (its source, our DCT, its connection).
    pub(super) peer: Option<(u64, Vec<u32>, u32)>,
    pub(super) open: bool,
    pub(super) user: Option<ConnId>,
    pub(super) unbind_from: Option<(DgramAddr, u32, u64)>,
    /// Reverse-use entry: the target connection it runs over; asked to
    /// stop (no new work; Unbound once idle).
    pub(super) via: Option<ConnId>,
    pub(super) draining: bool,
}

#[derive(Debug)]
pub(super) struct Entry {
    /// Initiator: the target. Target side: the inviter's address and the
    /// DCT (key 0).
    pub(super) target: DcTarget,
    /// Target side: (inviter, its connection id).
    pub(super) remote: Option<(DgramAddr, u64)>,
    pub(super) state: State,
    /// Work requests posted and not completed.
    pub(super) busy: u32,
    pub(super) last_used: Instant,
    /// LRU order: larger is more recent.
    pub(super) stamp: u64,
    /// Initiator: the direct connection attempt.
    pub(super) direct: Direct,
    /// Initiator: invitations started over after a direct attempt that
    /// may have used up the target's reservation ([`MAX_RESTARTS`]).
    pub(super) restarts: u8,
    /// Reverse use.
    pub(super) rev: Rev,
}

impl Entry {
    /// A reverse-use entry shares its target connection's slot.
    fn holds_slot(&self) -> bool {
        !matches!(self.state, State::Waiting) && self.rev.via.is_none()
    }
}

/// How often an initiator connection whose direct attempt failed starts
/// its invitation over when an Accept's cookie does not work (a direct
/// attempt that reached the target used up the reservation that Accept
/// was for; a stale copy of it can come later).
pub(super) const MAX_RESTARTS: u8 = 4;

/// Wrong-key rejections remembered so that copies of one Invite or Bind
/// are counted once.
pub(super) const RECENT_REJECTIONS: usize = 64;

/// An initiator connection's direct attempt ([`DcEvent::ConnectDirect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direct {
    /// None.
    Off,
    /// Under way, no answer to the invitation yet.
    Trying,
    /// Under way, and the target accepted the invitation (on the port
    /// tried): if the attempt fails, the invitation starts over (the
    /// attempt may have used up the target's reservation).
    Answered,
    /// It failed: a cookie connection that fails starts the invitation
    /// over (up to [`MAX_RESTARTS`] times).
    Failed,
}

impl DcTable {
    pub(super) fn rand(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn new_id(&mut self) -> ConnId {
        // Unique per table; the high bits are random so that a restarted
        // peer's ids do not collide with answers still in the network.
        let id = ConnId(((self.rand() & 0xffff_ffff) << 32) | (self.next_id & 0xffff_ffff));
        self.next_id += 1;
        id
    }

    pub(super) fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    pub(super) fn take_slot(&mut self) {
        self.live += 1;
        debug_assert!(self.live <= self.cfg.capacity);
        self.stats.max_live = self.stats.max_live.max(self.live);
    }

    /// The least recently used idle live initiator connection, closed to
    /// free its slot ([`DcEvent::Teardown`]). False if there is none. A
    /// connection whose receive side is bound (reverse use) is taken only
    /// if no other is idle, and only through the close handshake
    /// (`Closing`, one at a time): its slot is not free yet (false).
    pub(super) fn evict_one(&mut self, now: Instant) -> bool {
        let idle = |e: &Entry| matches!(e.state, State::Live) && e.busy == 0 && e.rev.via.is_none();
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| idle(e) && e.rev.bound.is_none())
            .min_by_key(|(_, e)| e.stamp)
            .map(|(&id, _)| id);
        if let Some(id) = victim {
            self.stats.evictions += 1;
            self.remove(id);
            self.events.push_back(DcEvent::Teardown { id });
            return true;
        }
        if self
            .entries
            .values()
            .any(|e| matches!(e.state, State::Closing { .. }))
        {
            return false;
        }
        let bound = self
            .entries
            .iter()
            .filter(|(_, e)| idle(e))
            .min_by_key(|(_, e)| e.stamp)
            .map(|(&id, _)| id);
        if let Some(id) = bound {
            self.stats.evictions += 1;
            self.stats.bound_evictions += 1;
            self.start_closing(id, now);
        }
        false
    }

    /// Starts the close handshake of bound initiator connection `id`: no
    /// new work goes to it (its target gets a fresh connection), Unbind to
    /// the peer; it closes on the peer's Unbound or after
    /// `invite_timeout`.
    pub(super) fn start_closing(&mut self, id: ConnId, now: Instant) {
        let rto = self.cfg.rto_initial;
        let deadline = now + self.cfg.invite_timeout;
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.state = State::Closing {
            next_tx: now + rto,
            rto,
            deadline,
        };
        let (target, nonce) = (e.target, e.rev.nonce);
        if self.by_target.get(&target) == Some(&id) {
            self.by_target.remove(&target);
        }
        self.stats.unbinds += 1;
        self.send_unbind(id, target, nonce);
    }

    pub(super) fn send_unbind(&mut self, id: ConnId, target: DcTarget, nonce: u64) {
        self.send_to_target(MsgKind::Unbind, id, target, 0, nonce);
    }

    pub(super) fn remove(&mut self, id: ConnId) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        if e.holds_slot() {
            self.live -= 1;
        } else if matches!(e.state, State::Waiting) {
            self.waiting.retain(|w| *w != id);
        }
        if e.rev.nonce != 0 {
            self.nonces.remove(&e.rev.nonce);
        }
        if let Some((nonce, ..)) = e.rev.peer {
            if self.peer_nonces.get(&nonce) == Some(&id) {
                self.peer_nonces.remove(&nonce);
            }
        }
        if let Some(t) = e.rev.via {
            if let Some(te) = self.entries.get_mut(&t) {
                if te.rev.user == Some(id) {
                    te.rev.user = None;
                }
            }
        }
        if e.remote.is_none() {
            if self.by_target.get(&e.target) == Some(&id) {
                self.by_target.remove(&e.target);
            }
        } else if let Some(r) = e.remote {
            self.seen.remove(&r);
        }
        if let State::TargetPending { cookie, .. } = e.state {
            self.cookies.remove(&cookie);
        }
        Some(e)
    }

    /// Gives free slots to waiting connections, oldest first, evicting
    /// idle ones while some wait.
    pub(super) fn admit_waiting(&mut self, now: Instant) {
        while let Some(&id) = self.waiting.front() {
            let full = self.live >= self.cfg.capacity;
            if full && !self.evict_one(now) {
                return;
            }
            self.waiting.pop_front();
            self.take_slot();
            self.start_invite(id, now, !full);
        }
    }
}
