//! Software dynamically connected transport (SoftDC), sans-IO part: the
//! connection-invitation protocol and the connection table
//! (`docs/dc.md`).
//!
//! A DC initiator (DCI) reaches any DC target (DCT) by (address, DCT
//! number, DC key). Data travels over RC connections; UD datagrams carry
//! the invitations that set them up. This module decides *what* happens;
//! the engine (`softrdma_engine::dc`) does the I/O: it sends the
//! [`Transmit`]s over its UD QPs, opens and accepts the RC connections the
//! [`DcEvent`]s ask for, and reports back ([`DcTable::connected`],
//! [`DcTable::closed`], …). No clocks: every input carries `now`, and
//! [`DcTable::poll_timeout`] says when [`DcTable::handle_timeout`] is due.
//!
//! # Messages
//!
//! Every message is one fixed-size [`Message`] of [`MSG_LEN`] octets (the
//! payload of one UD Send), big-endian:
//!
//! | octets | field |
//! |---|---|
//! | 0–3 | magic `sDC1` |
//! | 4 | kind: 1 Invite, 2 Accept, 3 Reject, 4 Bind, 5 Unbind, 6 Unbound, 7 BindAccept, 8 BindReject |
//! | 5 | reject reason: 1 bad key, 2 no such DCT, 3 busy, 4 no connection (Bind) |
//! | 6–7 | Accept: the target's TCP listen port |
//! | 8–11 | DCT number (the DCT's UD QPN) |
//! | 12–15 | reserved, 0 |
//! | 16–23 | connection id (chosen by the sender of the Invite, Bind or Unbind) |
//! | 24–31 | Invite, Bind: DC access key |
//! | 32–39 | Accept: cookie the RC connection request must present; Bind, BindAccept, BindReject, Unbind, Unbound: the connection's reverse-offer nonce |
//!
//! # Initiator
//!
//! [`DcTable::post`] is called for every work request: it finds the
//! connection to the target (marking it most recently used) or starts one.
//! A new connection takes a slot of the table if one is free, or the slot
//! of the least recently used *idle* initiator connection (which the
//! engine then closes: [`DcEvent::Teardown`]); with every slot busy it
//! waits (no slot, no invitation) until a connection becomes idle or
//! closes. With a slot, the Invite is sent and retransmitted with
//! exponential backoff (`rto_initial` doubling up to `rto_max`) until an
//! Accept or a Reject arrives or `invite_timeout` passes
//! ([`DcEvent::Failed`]). An Accept yields [`DcEvent::Connect`] (the
//! engine opens the RC connection to the target's listen port presenting
//! the cookie, then calls [`DcTable::connected`] or
//! [`DcTable::connect_failed`]). A "busy" Reject keeps the invitation
//! retransmitting (the next one `busy_retry` after the Reject, the
//! backoff unchanged); "bad key" and "no such DCT" fail it at once. Accepts and
//! Rejects for connections that are not inviting (duplicates, late
//! answers, answers to an earlier attempt) are ignored and counted:
//! connection ids are never reused.
//!
//! # Direct connection attempts
//!
//! With [`DcConfig::direct_connect`] (the default), a new connection that
//! gets a slot without evicting one (under eviction churn the target's
//! table is usually still full) also yields [`DcEvent::ConnectDirect`] at
//! once: the engine
//! opens the RC connection to the DCT's UDP port number presenting the DC
//! key instead of a cookie, and reports [`DcTable::connected`] or
//! [`DcTable::direct_failed`]. The first Invite waits
//! [`DcConfig::direct_grace`] for it (none is sent if the attempt
//! connects first; it goes at once if the attempt fails). An Accept that
//! arrives while the attempt runs is kept (same port: wait for the
//! attempt; another port: [`DcEvent::Connect`] with the cookie); if the
//! attempt then fails, the invitation starts over (the attempt may have
//! used the target's reservation up). The target takes a direct request
//! with [`DcTable::target_direct`]: right key and DCT, and the slot an
//! Invite of the same (source, connection id) reserved or a free one;
//! refusals are only counted (`direct_refused`) — the invitation decides
//! and reports wrong keys and busy tables, so the protocol's outcomes are
//! those of the invitation alone.
//!
//! # Target
//!
//! [`DcTable::add_dct`] registers a DCT's number and key. An Invite naming
//! an unknown DCT or carrying the wrong key is answered with a Reject and
//! counted ([`DcStats`], [`DcEvent::KeyRejected`]). A right one takes a
//! slot (evicting an idle initiator connection if needed; with none, a
//! "busy" Reject) and is answered with an Accept carrying a fresh cookie;
//! the slot is held for `accept_linger` for the RC connection request
//! ([`DcTable::target_attach`]). A duplicate Invite (same source and
//! connection id) gets the same Accept again and takes no second slot.
//! Target connections are never closed by the target's table: the
//! initiator, which knows whether work is in flight, closes them (and
//! the engine reports [`DcTable::closed`]).
//!
//! # Reverse use (`DcConfig::reverse`, default on)
//!
//! An RC connection carries data both ways, so when A's DCI opened a
//! connection to B's DCT, B's DCI may answer A's DCT over it instead of
//! opening a second connection (one TCP connection both ways: no
//! separate pure ACK per message). A offers it: [`DcTable::offer`]
//! gives the [`ReverseOffer`] (a random nonce and A's DCTs of the
//! connection's protection domain) the engine appends to the connection
//! request; B records it with [`DcTable::accept_offer`]. When B's
//! [`DcTable::post`] finds no connection for a target but a target
//! connection whose offer names that DCT (same address, same protection
//! domain), the new entry sends a **Bind** (DC key, nonce) to that DCT
//! over UD, retransmitted like an Invite. A checks the key exactly as for
//! an Invite (wrong: BindReject(bad key), counted once, B's work fails as
//! the invitation would have failed it), binds the connection's receive
//! side to the DCT ([`DcEvent::BindReceive`], before the answer goes
//! out) and answers BindAccept; B then sends over the target connection
//! ([`DcEvent::Bound`]). Any other refusal, a timeout
//! (`bind_timeout`) or the connection closing meanwhile: the entry takes
//! the normal path with its work (a slot, a direct attempt, an Invite);
//! no error that the normal path would not give.
//!
//! Closing: only A (which opened the connection) closes it. A bound
//! connection that A would close (idle timeout, eviction) first goes
//! `Closing`: no new work of A's goes to it, **Unbind** to B; B stops
//! putting new work on it (that goes the normal path), and when its work
//! on it has completed ([`DcEvent::Drained`]) and the engine saw its
//! octets acknowledged, [`DcTable::unbound_ready`] sends **Unbound**; A
//! then closes ([`DcEvent::Teardown`]), after `invite_timeout` without an
//! answer anyway. Evictions go through the handshake one at a time and
//! only when no unbound idle connection can go instead.
//!
//! # Capacity
//!
//! Every connection that is inviting, connecting, live, closing, or
//! (target) accepted and awaited takes one slot; [`DcTable::live`] never
//! exceeds `capacity` (the high-water mark is [`DcStats::max_live`]). A
//! connection used both ways takes one slot on each side: A's initiator
//! entry and B's target entry; B's reverse-use entry holds none (it lives
//! as long as the target connection and is never evicted or idle-closed
//! itself).
//!
//! # Layout
//!
//! This file holds the public types and the table's state, creation and
//! getters. Beside it: `message` (the wire messages), `table` (entries,
//! slots, eviction, removal), `initiator` (posting, inviting, binding,
//! connection life), `target` (accepting RC connections), `receive`
//! (messages in), `timers` (retries and idle close).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::wr::DgramAddr;

mod initiator;
mod message;
mod receive;
mod table;
mod target;
mod timers;

pub use crate::util::hash::{LocalHasher, LocalMap};
pub use message::{
    DecodeError, Message, MsgKind, RejectReason, ReverseOffer, MAGIC, MAX_OFFER_DCTS, MSG_LEN,
    OFFER_VERSION,
};
use table::{Direct, Entry, Rev, State, MAX_RESTARTS, RECENT_REJECTIONS};

/// Where a DCI sends: the DCT's UD address (its QPN is the DCT number) and
/// the DC access key the work request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DcTarget {
    /// The DCT's UD address; `addr.qpn` is the DCT number.
    pub addr: DgramAddr,
    /// The DC access key.
    pub key: u64,
    /// Not sent: a local discriminator (the engine puts the protection
    /// domain here, so that connections are not shared across domains).
    pub local: u32,
}

/// A connection of the table (never reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// Table and protocol parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcConfig {
    /// Most connections at once (initiator and target side together).
    pub capacity: usize,
    /// An idle initiator connection is closed after this long unused.
    pub idle_timeout: Duration,
    /// First invitation retransmission timeout.
    pub rto_initial: Duration,
    /// Largest retransmission timeout (backoff doubles up to it).
    pub rto_max: Duration,
    /// An invitation unanswered this long fails its work requests.
    pub invite_timeout: Duration,
    /// How long a target holds an accepted slot for the RC connection.
    pub accept_linger: Duration,
    /// After a "busy" Reject, the invitation is repeated this soon.
    pub busy_retry: Duration,
    /// Seed of connection ids and cookies (the engine passes something
    /// unpredictable; tests a constant).
    pub seed: u64,
    /// Initiator: open the RC connection to the target's port (the
    /// DCT's UDP port, `target.addr.port`) presenting the DC key, in
    /// parallel with the invitation ([`DcEvent::ConnectDirect`]).
    pub direct_connect: bool,
    /// With `direct_connect`: the first Invite waits this long for the
    /// direct attempt (which usually connects first, and then no Invite
    /// is sent at all); it goes at once if the attempt fails.
    pub direct_grace: Duration,
    /// Reverse use of connections (`docs/dc.md` §2): a connection opened
    /// by this side offers the peer to send back over it
    /// ([`DcTable::offer`]), and work for a DCT that offered this side a
    /// connection goes over that one after a [`MsgKind::Bind`].
    pub reverse: bool,
    /// A Bind unanswered this long falls back to the normal path (a
    /// fresh connection); retransmitted meanwhile like an Invite.
    pub bind_timeout: Duration,
}

impl Default for DcConfig {
    fn default() -> Self {
        DcConfig {
            capacity: 16,
            idle_timeout: Duration::from_secs(2),
            rto_initial: Duration::from_millis(2),
            rto_max: Duration::from_millis(200),
            invite_timeout: Duration::from_secs(2),
            accept_linger: Duration::from_secs(3),
            busy_retry: Duration::from_micros(200),
            seed: 0x5d_c0de,
            direct_connect: true,
            direct_grace: Duration::from_millis(2),
            reverse: true,
            bind_timeout: Duration::from_millis(500),
        }
    }
}

/// Why a connection attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    /// No answer within `invite_timeout`.
    Timeout,
    /// The target refused.
    Rejected(RejectReason),
    /// The RC connection could not be set up after the Accept.
    ConnectFailed,
}

/// What the engine must do, or learns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcEvent {
    /// Initiator: the target accepted; open the RC connection to
    /// `target.addr.ip` port `port`, presenting `cookie`, `dct` and `id`.
    Connect {
        /// The connection.
        id: ConnId,
        /// Its target.
        target: DcTarget,
        /// The target's TCP listen port.
        port: u16,
        /// The cookie to present.
        cookie: u64,
    },
    /// Initiator (with `direct_connect`): open the RC connection to
    /// `target.addr.ip` port `port` now, presenting the DC key, `dct` and
    /// `id` instead of a cookie, while the invitation goes on; then call
    /// [`DcTable::connected`] or [`DcTable::direct_failed`].
    ConnectDirect {
        /// The connection.
        id: ConnId,
        /// Its target.
        target: DcTarget,
        /// The port to try (the DCT's UDP port number).
        port: u16,
    },
    /// Initiator: the connection failed; its work requests complete in
    /// error. The entry is gone.
    Failed {
        /// The connection.
        id: ConnId,
        /// Its target.
        target: DcTarget,
        /// Why.
        reason: FailReason,
    },
    /// Initiator: close this idle connection gracefully (LRU eviction or
    /// idle timeout); its slot is free already.
    Teardown {
        /// The connection.
        id: ConnId,
    },
    /// Offering side: a Bind with the right key for `dct` arrived for
    /// initiator connection `id`: bind its RC QP's receive side to DCT
    /// `dct` (its SRQ and CQ) before the Accept that follows goes out.
    BindReceive {
        /// The initiator connection.
        id: ConnId,
        /// The DCT.
        dct: u32,
    },
    /// Reverse user: initiator connection `id` is bound: its work goes
    /// over the RC QP of target connection `via` (which stays the
    /// target's: `id` holds no slot of its own).
    Bound {
        /// The reverse-use connection (posted to like any initiator one).
        id: ConnId,
        /// The target connection it runs over.
        via: ConnId,
    },
    /// Reverse user: stop using `id` (the connection it ran over is
    /// closing or gone); do not close the QP, it is the target
    /// connection's. Its remaining queued work is flushed.
    Unbound {
        /// The reverse-use connection.
        id: ConnId,
    },
    /// Reverse user: target connection `id` was asked to unbind and no
    /// work of ours is left on it; once what was written on it has been
    /// delivered (acknowledged), call [`DcTable::unbound_ready`].
    Drained {
        /// The target connection.
        id: ConnId,
    },
    /// Target: an invitation with the wrong key was rejected.
    KeyRejected {
        /// The DCT it named.
        dct: u32,
        /// Who sent it.
        src: DgramAddr,
    },
}

/// A message to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// `None`: from the initiator's UD QP; `Some(n)`: from DCT `n`'s.
    pub from_dct: Option<u32>,
    /// Destination.
    pub to: DgramAddr,
    /// The message.
    pub msg: Message,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DcStats {
    /// Invitations sent (first transmissions).
    pub invites: u64,
    /// Invitation retransmissions.
    pub retransmits: u64,
    /// Invitations that timed out.
    pub timeouts: u64,
    /// Accepts and Rejects that matched no inviting connection.
    pub stale_answers: u64,
    /// Duplicate invitations answered again without a new slot.
    pub duplicate_invites: u64,
    /// Invitations and Binds rejected for a wrong key (copies of one
    /// counted once).
    pub rejected_bad_key: u64,
    /// Invitations rejected for an unknown DCT.
    pub rejected_no_dct: u64,
    /// Invitations rejected because every slot was busy.
    pub rejected_busy: u64,
    /// Busy rejections received (the invitation keeps trying).
    pub busy_received: u64,
    /// Idle connections closed to make room.
    pub evictions: u64,
    /// Idle connections closed after the idle timeout.
    pub idle_closes: u64,
    /// Target slots given up because no RC connection came.
    pub accept_expired: u64,
    /// Messages that did not parse.
    pub malformed: u64,
    /// Connections accepted on the target side (by cookie or direct).
    pub target_accepts: u64,
    /// Initiator: direct connection attempts started.
    pub direct_attempts: u64,
    /// Initiator: connections that came up by the direct attempt.
    pub direct_connected: u64,
    /// Target: direct connection requests accepted (counted in
    /// `target_accepts` too).
    pub direct_accepts: u64,
    /// Target: direct connection requests refused (wrong key, no such
    /// DCT, no free slot, not expected); not counted as key rejections:
    /// the invitation running in parallel decides and reports those.
    pub direct_refused: u64,
    /// Highest number of slots in use at once.
    pub max_live: usize,
    /// Reverse user: Binds sent (first transmissions).
    pub binds: u64,
    /// Reverse user: Bind retransmissions.
    pub bind_retransmits: u64,
    /// Reverse user: connections bound (Accept received).
    pub bound: u64,
    /// Reverse user: Binds that fell back to the normal path (refused,
    /// timed out, or the connection closing meanwhile).
    pub bind_fallbacks: u64,
    /// Offering side: Binds accepted (first time; duplicates are
    /// answered again and counted in `duplicate_binds`).
    pub binds_accepted: u64,
    /// Offering side: duplicate Binds answered again.
    pub duplicate_binds: u64,
    /// Offering side: Binds refused for no bindable connection.
    pub binds_refused: u64,
    /// Connection owner: close handshakes started (Unbind sent).
    pub unbinds: u64,
    /// Connection owner: Unbinds unanswered (closed anyway).
    pub unbind_timeouts: u64,
    /// Evictions of bound connections (through the close handshake;
    /// counted in `evictions` too).
    pub bound_evictions: u64,
}

/// The connection table of one context with the invitation protocol of
/// both roles.
#[derive(Debug)]
pub struct DcTable {
    cfg: DcConfig,
    entries: LocalMap<ConnId, Entry>,
    by_target: LocalMap<DcTarget, ConnId>,
    waiting: VecDeque<ConnId>,
    /// Target side: (inviter, its connection id) → our entry.
    seen: HashMap<(DgramAddr, u64), ConnId>,
    cookies: HashMap<u64, ConnId>,
    /// Wrong-key (source, connection id)s counted lately.
    recent_rejections: VecDeque<(DgramAddr, u64)>,
    /// Nonces this side offered → its initiator connection.
    nonces: LocalMap<u64, ConnId>,
    /// Nonces peers offered → our target connection (peer-chosen keys:
    /// SipHash).
    peer_nonces: HashMap<u64, ConnId>,
    dcts: LocalMap<u32, u64>,
    dct_ports: LocalMap<u32, u16>,
    listen_port: u16,
    live: usize,
    next_stamp: u64,
    rng: u64,
    next_id: u64,
    tx: VecDeque<Transmit>,
    events: VecDeque<DcEvent>,
    stats: DcStats,
}

impl DcTable {
    /// An empty table (capacity at least 1).
    pub fn new(cfg: DcConfig) -> DcTable {
        let cfg = DcConfig {
            capacity: cfg.capacity.max(1),
            ..cfg
        };
        DcTable {
            cfg,
            entries: LocalMap::default(),
            by_target: LocalMap::default(),
            waiting: VecDeque::new(),
            seen: HashMap::new(),
            cookies: HashMap::new(),
            recent_rejections: VecDeque::new(),
            nonces: LocalMap::default(),
            peer_nonces: HashMap::new(),
            dcts: LocalMap::default(),
            dct_ports: LocalMap::default(),
            listen_port: 0,
            live: 0,
            next_stamp: 1,
            rng: cfg.seed | 1,
            next_id: 1,
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: DcStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &DcConfig {
        &self.cfg
    }

    /// Slots in use (never above `capacity`).
    pub fn live(&self) -> usize {
        self.live
    }

    /// Counters.
    pub fn stats(&self) -> DcStats {
        self.stats
    }

    /// Initiator connections waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The TCP port the target's RC connections are accepted on (sent in
    /// Accepts).
    pub fn set_listen_port(&mut self, port: u16) {
        self.listen_port = port;
    }

    /// Registers DCT `dct` with its access key.
    pub fn add_dct(&mut self, dct: u32, key: u64) {
        self.dcts.insert(dct, key);
    }

    /// The TCP port Accepts for DCT `dct` name, if not the one of
    /// [`DcTable::set_listen_port`] (a listener on the DCT's own port,
    /// where direct requests go).
    pub fn set_dct_listen_port(&mut self, dct: u32, port: u16) {
        self.dct_ports.insert(dct, port);
    }

    /// Forgets DCT `dct` (its connections stay until closed).
    pub fn remove_dct(&mut self, dct: u32) {
        self.dcts.remove(&dct);
        self.dct_ports.remove(&dct);
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<DcEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests;
