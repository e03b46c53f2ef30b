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
//! | 4 | kind: 1 Invite, 2 Accept, 3 Reject |
//! | 5 | reject reason: 1 bad key, 2 no such DCT, 3 busy |
//! | 6–7 | Accept: the target's TCP listen port |
//! | 8–11 | DCT number (the DCT's UD QPN) |
//! | 12–15 | reserved, 0 |
//! | 16–23 | connection id (chosen by the initiator) |
//! | 24–31 | Invite: DC access key |
//! | 32–39 | Accept: cookie the RC connection request must present |
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
//! # Capacity
//!
//! Every connection that is inviting, connecting, live, or (target)
//! accepted and awaited takes one slot; [`DcTable::live`] never exceeds
//! `capacity` (the high-water mark is [`DcStats::max_live`]).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::wr::DgramAddr;

/// Magic of every SoftDC message.
pub const MAGIC: [u8; 4] = *b"sDC1";
/// Size of every SoftDC message.
pub const MSG_LEN: usize = 40;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgKind {
    /// Initiator → target: please accept an RC connection.
    Invite,
    /// Target → initiator: connect to the listen port with the cookie.
    Accept,
    /// Target → initiator: no (see [`RejectReason`]).
    Reject,
}

/// Why a target refused an invitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The DC access key does not match the DCT's.
    BadKey,
    /// No DCT with that number here.
    NoSuchDct,
    /// The target's connection table is full of busy connections: try
    /// again (the invitation keeps retransmitting).
    Busy,
    /// A reason this implementation does not know (treated as final).
    Other(u8),
}

impl RejectReason {
    fn code(self) -> u8 {
        match self {
            RejectReason::BadKey => 1,
            RejectReason::NoSuchDct => 2,
            RejectReason::Busy => 3,
            RejectReason::Other(c) => c,
        }
    }

    fn from_code(c: u8) -> RejectReason {
        match c {
            1 => RejectReason::BadKey,
            2 => RejectReason::NoSuchDct,
            3 => RejectReason::Busy,
            c => RejectReason::Other(c),
        }
    }
}

/// One SoftDC message (see the module documentation for the layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// What it is.
    pub kind: MsgKind,
    /// Reject: why.
    pub reason: Option<RejectReason>,
    /// Accept: the target's TCP listen port.
    pub port: u16,
    /// The DCT number.
    pub dct: u32,
    /// The initiator's connection id.
    pub conn: u64,
    /// Invite: the DC access key.
    pub key: u64,
    /// Accept: the cookie.
    pub cookie: u64,
}

/// Why octets are not a SoftDC message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Not [`MSG_LEN`] octets.
    Length(usize),
    /// The magic is wrong.
    Magic,
    /// Unknown kind octet.
    Kind(u8),
}

impl Message {
    /// The wire form.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = match self.kind {
            MsgKind::Invite => 1,
            MsgKind::Accept => 2,
            MsgKind::Reject => 3,
        };
        b[5] = self.reason.map_or(0, RejectReason::code);
        b[6..8].copy_from_slice(&self.port.to_be_bytes());
        b[8..12].copy_from_slice(&self.dct.to_be_bytes());
        b[16..24].copy_from_slice(&self.conn.to_be_bytes());
        b[24..32].copy_from_slice(&self.key.to_be_bytes());
        b[32..40].copy_from_slice(&self.cookie.to_be_bytes());
        b
    }

    /// Parses the wire form (exactly [`MSG_LEN`] octets).
    pub fn decode(b: &[u8]) -> Result<Message, DecodeError> {
        if b.len() != MSG_LEN {
            return Err(DecodeError::Length(b.len()));
        }
        if b[..4] != MAGIC {
            return Err(DecodeError::Magic);
        }
        let kind = match b[4] {
            1 => MsgKind::Invite,
            2 => MsgKind::Accept,
            3 => MsgKind::Reject,
            k => return Err(DecodeError::Kind(k)),
        };
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 octets"));
        Ok(Message {
            kind,
            reason: (kind == MsgKind::Reject).then(|| RejectReason::from_code(b[5])),
            port: u16::from_be_bytes([b[6], b[7]]),
            dct: u32::from_be_bytes(b[8..12].try_into().expect("4 octets")),
            conn: u64_at(16),
            key: u64_at(24),
            cookie: u64_at(32),
        })
    }
}

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
    /// Invitations rejected for a wrong key.
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
}

#[derive(Debug, Clone, Copy)]
enum State {
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
}

impl State {
    fn holds_slot(&self) -> bool {
        !matches!(self, State::Waiting)
    }
}

#[derive(Debug)]
struct Entry {
    /// Initiator: the target. Target side: the inviter's address and the
    /// DCT (key 0).
    target: DcTarget,
    /// Target side: (inviter, its connection id).
    remote: Option<(DgramAddr, u64)>,
    state: State,
    /// Work requests posted and not completed.
    busy: u32,
    last_used: Instant,
    /// LRU order: larger is more recent.
    stamp: u64,
    /// Initiator: the direct connection attempt.
    direct: Direct,
    /// Initiator: invitations started over after a direct attempt that
    /// may have used up the target's reservation ([`MAX_RESTARTS`]).
    restarts: u8,
}

/// How often an initiator connection whose direct attempt failed starts
/// its invitation over when an Accept's cookie does not work (a direct
/// attempt that reached the target used up the reservation that Accept
/// was for; a stale copy of it can come later).
const MAX_RESTARTS: u8 = 4;

/// An initiator connection's direct attempt ([`DcEvent::ConnectDirect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direct {
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

/// A fast hasher for maps keyed by values this side chose (connection
/// ids, DCT and DCI numbers, the application's targets): a multiply-rotate
/// mix, no per-map key, unlike `std`'s SipHash. Not for keys a peer
/// controls (those maps keep SipHash: collision flooding).
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalHasher(u64);

impl LocalHasher {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl std::hash::Hasher for LocalHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.add(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map with [`LocalHasher`].
pub type LocalMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<LocalHasher>>;

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

    fn rand(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn new_id(&mut self) -> ConnId {
        // Unique per table; the high bits are random so that a restarted
        // peer's ids do not collide with answers still in the network.
        let id = ConnId(((self.rand() & 0xffff_ffff) << 32) | (self.next_id & 0xffff_ffff));
        self.next_id += 1;
        id
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    fn take_slot(&mut self) {
        self.live += 1;
        debug_assert!(self.live <= self.cfg.capacity);
        self.stats.max_live = self.stats.max_live.max(self.live);
    }

    /// The least recently used idle live initiator connection, closed to
    /// free its slot ([`DcEvent::Teardown`]). False if there is none.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.state, State::Live) && e.busy == 0)
            .min_by_key(|(_, e)| e.stamp)
            .map(|(&id, _)| id);
        match victim {
            Some(id) => {
                self.stats.evictions += 1;
                self.remove(id);
                self.events.push_back(DcEvent::Teardown { id });
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, id: ConnId) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        if e.state.holds_slot() {
            self.live -= 1;
        } else {
            self.waiting.retain(|w| *w != id);
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

    /// `direct_ok`: a direct attempt may go along (not when this table had
    /// to evict for the slot: under such churn the target's table is
    /// usually full too, until it sees the close, and a refused attempt
    /// only adds a TCP exchange before the invitation).
    fn start_invite(&mut self, id: ConnId, now: Instant, direct_ok: bool) {
        let (rto, deadline) = (self.cfg.rto_initial, now + self.cfg.invite_timeout);
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let target = e.target;
        let direct = direct_ok && self.cfg.direct_connect && target.addr.port != 0;
        e.state = State::Inviting {
            sent: !direct,
            next_tx: now + if direct { self.cfg.direct_grace } else { rto },
            rto,
            deadline,
        };
        if direct {
            e.direct = Direct::Trying;
        } else {
            self.stats.invites += 1;
            self.send_invite(id, target);
        }
        if direct {
            self.stats.direct_attempts += 1;
            self.events.push_back(DcEvent::ConnectDirect {
                id,
                target,
                port: target.addr.port,
            });
        }
    }

    fn send_invite(&mut self, id: ConnId, target: DcTarget) {
        self.tx.push_back(Transmit {
            from_dct: None,
            to: target.addr,
            msg: Message {
                kind: MsgKind::Invite,
                reason: None,
                port: 0,
                dct: target.addr.qpn,
                conn: id.0,
                key: target.key,
                cookie: 0,
            },
        });
    }

    /// Gives free slots to waiting connections, oldest first, evicting
    /// idle ones while some wait.
    fn admit_waiting(&mut self, now: Instant) {
        while let Some(&id) = self.waiting.front() {
            let full = self.live >= self.cfg.capacity;
            if full && !self.evict_one() {
                return;
            }
            self.waiting.pop_front();
            self.take_slot();
            self.start_invite(id, now, !full);
        }
    }

    /// Initiator: a work request for `target` is posted. Returns the
    /// connection it belongs to and whether that connection is new (then
    /// it is inviting, or waiting for a slot). Every call must be matched
    /// by one [`DcTable::completed`] (or the connection's failure/close).
    pub fn post(&mut self, now: Instant, target: DcTarget) -> (ConnId, bool) {
        let stamp = self.stamp();
        if let Some(&id) = self.by_target.get(&target) {
            if let Some(e) = self.entries.get_mut(&id) {
                e.busy += 1;
                e.last_used = now;
                e.stamp = stamp;
                return (id, false);
            }
        }
        let id = self.new_id();
        self.entries.insert(
            id,
            Entry {
                target,
                remote: None,
                state: State::Waiting,
                busy: 1,
                last_used: now,
                stamp,
                direct: Direct::Off,
                restarts: 0,
            },
        );
        self.by_target.insert(target, id);
        self.waiting.push_back(id);
        self.admit_waiting(now);
        (id, true)
    }

    /// Initiator: one work request of `id` completed (successfully or
    /// not).
    pub fn completed(&mut self, id: ConnId, now: Instant) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.busy = e.busy.saturating_sub(1);
            e.last_used = now;
        }
        if !self.waiting.is_empty() {
            self.admit_waiting(now);
        }
    }

    /// True if `id` is an initiator connection that is connected.
    pub fn is_live(&self, id: ConnId) -> bool {
        self.entries
            .get(&id)
            .is_some_and(|e| matches!(e.state, State::Live))
    }

    /// Initiator: the RC connection of `id` is up (opened after an
    /// Accept, or by the direct attempt: then the invitation ends).
    pub fn connected(&mut self, id: ConnId, now: Instant) {
        if let Some(e) = self.entries.get_mut(&id) {
            // Whatever the invitation's state: the engine has the
            // connection (a direct attempt that won late, after it was
            // given up for the invitation, counts too).
            let direct = matches!(e.direct, Direct::Trying | Direct::Answered);
            if matches!(e.state, State::Inviting { .. } | State::Connecting) {
                e.state = State::Live;
                e.last_used = now;
                e.direct = Direct::Off;
                if direct {
                    self.stats.direct_connected += 1;
                }
            }
        }
    }

    /// Initiator: the direct attempt of `id` failed (refused, reset, timed
    /// out). The invitation goes on; if the target had accepted it
    /// already, it starts over (a fresh Invite now, a fresh timeout): the
    /// attempt may have reached the target and used up its reservation.
    pub fn direct_failed(&mut self, id: ConnId, now: Instant) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if !matches!(e.direct, Direct::Trying | Direct::Answered) {
            return;
        }
        let was = std::mem::replace(&mut e.direct, Direct::Failed);
        match (e.state, was) {
            (State::Connecting, Direct::Answered) => self.restart_invite(id, now),
            (State::Inviting { sent: false, .. }, _) => {
                // The Invite was waiting for the attempt: it goes now.
                self.send_first_invite(id, now);
            }
            _ => {}
        }
    }

    /// Sends the first Invite of `id` (its direct attempt's grace period
    /// is cut short).
    fn send_first_invite(&mut self, id: ConnId, now: Instant) {
        let rto = self.cfg.rto_initial;
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if let State::Inviting {
            sent,
            next_tx,
            rto: r,
            ..
        } = &mut e.state
        {
            *sent = true;
            *next_tx = now + rto;
            *r = rto;
        }
        let target = e.target;
        self.stats.invites += 1;
        self.send_invite(id, target);
    }

    /// Starts the invitation of `id` over (fresh timeout, Invite now).
    fn restart_invite(&mut self, id: ConnId, now: Instant) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let rto = self.cfg.rto_initial;
        e.state = State::Inviting {
            sent: true,
            next_tx: now + rto,
            rto,
            deadline: now + self.cfg.invite_timeout,
        };
        e.restarts += 1;
        let target = e.target;
        self.stats.retransmits += 1;
        self.send_invite(id, target);
    }

    /// Initiator: the RC connection of `id` could not be set up: the entry
    /// goes ([`DcEvent::Failed`] with [`FailReason::ConnectFailed`]).
    pub fn connect_failed(&mut self, id: ConnId, now: Instant) {
        if self.entries.get(&id).is_some_and(|e| {
            e.direct == Direct::Failed
                && e.restarts < MAX_RESTARTS
                && matches!(e.state, State::Connecting)
        }) {
            // The cookie may have been used up by the direct attempt.
            self.restart_invite(id, now);
            return;
        }
        if let Some(e) = self.remove(id) {
            self.events.push_back(DcEvent::Failed {
                id,
                target: e.target,
                reason: FailReason::ConnectFailed,
            });
        }
        self.admit_waiting(now);
    }

    /// Either side: connection `id` is gone (closed by the peer, failed,
    /// or torn down). Its slot is freed; unknown ids are ignored.
    pub fn closed(&mut self, id: ConnId, now: Instant) {
        self.remove(id);
        self.admit_waiting(now);
    }

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
        if self.live >= self.cfg.capacity && !self.evict_one() {
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

    /// A message arrived from `src` on the UD QP numbered `local_qpn` (the
    /// initiator's, or a DCT's).
    pub fn handle_message(&mut self, now: Instant, src: DgramAddr, local_qpn: u32, data: &[u8]) {
        let msg = match Message::decode(data) {
            Ok(m) => m,
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        match msg.kind {
            MsgKind::Invite => self.on_invite(now, src, local_qpn, msg),
            MsgKind::Accept => self.on_answer(now, msg, None),
            MsgKind::Reject => self.on_answer(now, msg, msg.reason),
        }
    }

    fn reply(&mut self, dct: u32, to: DgramAddr, msg: Message) {
        self.tx.push_back(Transmit {
            from_dct: Some(dct),
            to,
            msg,
        });
    }

    fn reject(&mut self, dct: u32, to: DgramAddr, conn: u64, reason: RejectReason) {
        self.reply(
            dct,
            to,
            Message {
                kind: MsgKind::Reject,
                reason: Some(reason),
                port: 0,
                dct,
                conn,
                key: 0,
                cookie: 0,
            },
        );
    }

    fn accept_msg(&self, dct: u32, conn: u64, cookie: u64) -> Message {
        Message {
            kind: MsgKind::Accept,
            reason: None,
            port: self
                .dct_ports
                .get(&dct)
                .copied()
                .unwrap_or(self.listen_port),
            dct,
            conn,
            key: 0,
            cookie,
        }
    }

    fn on_invite(&mut self, now: Instant, src: DgramAddr, local_qpn: u32, m: Message) {
        if let Some(&id) = self.seen.get(&(src, m.conn)) {
            self.stats.duplicate_invites += 1;
            if let Some(Entry {
                state: State::TargetPending { cookie, dct, .. },
                ..
            }) = self.entries.get(&id)
            {
                let msg = self.accept_msg(*dct, m.conn, *cookie);
                self.reply(*dct, src, msg);
            }
            // Connected already: the Accept that was answered suffices.
            return;
        }
        let key = match self.dcts.get(&m.dct) {
            Some(&k) if m.dct == local_qpn => k,
            _ => {
                self.stats.rejected_no_dct += 1;
                self.reject(local_qpn, src, m.conn, RejectReason::NoSuchDct);
                return;
            }
        };
        if key != m.key {
            self.stats.rejected_bad_key += 1;
            self.events
                .push_back(DcEvent::KeyRejected { dct: m.dct, src });
            self.reject(m.dct, src, m.conn, RejectReason::BadKey);
            return;
        }
        if self.live >= self.cfg.capacity && !self.evict_one() {
            self.stats.rejected_busy += 1;
            self.reject(m.dct, src, m.conn, RejectReason::Busy);
            return;
        }
        let id = self.new_id();
        let mut cookie = self.rand();
        while cookie == 0 || self.cookies.contains_key(&cookie) {
            cookie = self.rand();
        }
        let stamp = self.stamp();
        self.entries.insert(
            id,
            Entry {
                target: DcTarget {
                    addr: src,
                    key: 0,
                    local: 0,
                },
                remote: Some((src, m.conn)),
                state: State::TargetPending {
                    cookie,
                    expires: now + self.cfg.accept_linger,
                    dct: m.dct,
                },
                busy: 0,
                last_used: now,
                stamp,
                direct: Direct::Off,
                restarts: 0,
            },
        );
        self.take_slot();
        self.seen.insert((src, m.conn), id);
        self.cookies.insert(cookie, id);
        let msg = self.accept_msg(m.dct, m.conn, cookie);
        self.reply(m.dct, src, msg);
    }

    fn on_answer(&mut self, now: Instant, m: Message, reject: Option<RejectReason>) {
        let id = ConnId(m.conn);
        let matches = self.entries.get(&id).is_some_and(|e| {
            e.remote.is_none()
                && matches!(e.state, State::Inviting { .. })
                && e.target.addr.qpn == m.dct
        });
        if !matches {
            self.stats.stale_answers += 1;
            return;
        }
        match reject {
            None => {
                let e = self.entries.get_mut(&id).expect("checked");
                e.state = State::Connecting;
                if e.direct == Direct::Trying {
                    if m.port == e.target.addr.port {
                        // The direct attempt goes to the same listener
                        // and usually wins: wait for it.
                        e.direct = Direct::Answered;
                        return;
                    }
                    // Another port: the engine drops the attempt and
                    // connects with the cookie (if the attempt reached
                    // the target and used the reservation up, the cookie
                    // fails and the invitation starts over).
                    e.direct = Direct::Failed;
                }
                let target = e.target;
                self.events.push_back(DcEvent::Connect {
                    id,
                    target,
                    port: m.port,
                    cookie: m.cookie,
                });
            }
            Some(RejectReason::Busy) => {
                // The target is freeing a slot (typically the one our own
                // eviction just closed): ask again soon, without doubling
                // the backoff; the deadline still bounds it.
                self.stats.busy_received += 1;
                let retry = self.cfg.busy_retry;
                if let Some(Entry {
                    state: State::Inviting { next_tx, .. },
                    ..
                }) = self.entries.get_mut(&id)
                {
                    *next_tx = (*next_tx).min(now + retry);
                }
            }
            Some(r) => {
                let e = self.remove(id).expect("checked");
                self.events.push_back(DcEvent::Failed {
                    id,
                    target: e.target,
                    reason: FailReason::Rejected(r),
                });
                self.admit_waiting(now);
            }
        }
    }

    /// Runs the timers due at `now`: invitation retransmission and
    /// timeout, idle close, expiry of awaited target connections.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut retx = Vec::new();
        let mut first = Vec::new();
        let mut gone = Vec::new();
        for (&id, e) in self.entries.iter_mut() {
            match &mut e.state {
                State::Inviting {
                    sent,
                    next_tx,
                    rto,
                    deadline,
                } => {
                    if now >= *deadline {
                        gone.push((id, 0u8));
                    } else if now >= *next_tx && !*sent {
                        // The direct attempt's grace period is over.
                        *sent = true;
                        *next_tx = now + *rto;
                        first.push((id, e.target));
                    } else if now >= *next_tx {
                        *rto = (*rto * 2).min(self.cfg.rto_max);
                        *next_tx = now + *rto;
                        retx.push((id, e.target));
                    }
                }
                State::Live if e.busy == 0 && now >= e.last_used + self.cfg.idle_timeout => {
                    gone.push((id, 1));
                }
                State::TargetPending { expires, .. } if now >= *expires => gone.push((id, 2)),
                _ => {}
            }
        }
        for (id, target) in first {
            self.stats.invites += 1;
            self.send_invite(id, target);
        }
        for (id, target) in retx {
            self.stats.retransmits += 1;
            self.send_invite(id, target);
        }
        gone.sort();
        for (id, why) in gone {
            let Some(e) = self.remove(id) else { continue };
            match why {
                0 => {
                    self.stats.timeouts += 1;
                    self.events.push_back(DcEvent::Failed {
                        id,
                        target: e.target,
                        reason: FailReason::Timeout,
                    });
                }
                1 => {
                    self.stats.idle_closes += 1;
                    self.events.push_back(DcEvent::Teardown { id });
                }
                _ => self.stats.accept_expired += 1,
            }
        }
        self.admit_waiting(now);
    }

    /// When [`DcTable::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| match e.state {
                State::Inviting {
                    next_tx, deadline, ..
                } => Some(next_tx.min(deadline)),
                State::Live if e.busy == 0 => Some(e.last_used + self.cfg.idle_timeout),
                State::TargetPending { expires, .. } => Some(expires),
                _ => None,
            })
            .min()
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
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    fn addr(q: u32) -> DgramAddr {
        DgramAddr {
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: (q >> 8) as u16,
            qpn: q,
        }
    }

    #[test]
    fn message_round_trip_and_garbage() {
        let m = Message {
            kind: MsgKind::Reject,
            reason: Some(RejectReason::Busy),
            port: 7,
            dct: 0x12_3456,
            conn: 9,
            key: 0xdead,
            cookie: 5,
        };
        assert_eq!(Message::decode(&m.encode()), Ok(m));
        assert_eq!(Message::decode(&[0; 3]), Err(DecodeError::Length(3)));
        assert_eq!(Message::decode(&[0; MSG_LEN]), Err(DecodeError::Magic));
        let mut b = m.encode();
        b[4] = 9;
        assert_eq!(Message::decode(&b), Err(DecodeError::Kind(9)));
    }

    #[test]
    fn wrong_key_rejected_and_counted() {
        let t0 = Instant::now();
        let mut ini = DcTable::new(DcConfig {
            direct_connect: false,
            ..DcConfig::default()
        });
        let mut tgt = DcTable::new(DcConfig::default());
        tgt.add_dct(0x100, 42);
        let target = DcTarget {
            addr: addr(0x100),
            key: 41,
            local: 0,
        };
        let (id, new) = ini.post(t0, target);
        assert!(new);
        let tx = ini.poll_transmit().unwrap();
        tgt.handle_message(t0, addr(0x200), 0x100, &tx.msg.encode());
        assert_eq!(tgt.stats().rejected_bad_key, 1);
        assert_eq!(tgt.live(), 0);
        assert!(matches!(
            tgt.poll_event(),
            Some(DcEvent::KeyRejected { dct: 0x100, .. })
        ));
        let rep = tgt.poll_transmit().unwrap();
        ini.handle_message(t0, addr(0x100), 0x200, &rep.msg.encode());
        assert_eq!(
            ini.poll_event(),
            Some(DcEvent::Failed {
                id,
                target,
                reason: FailReason::Rejected(RejectReason::BadKey)
            })
        );
        assert_eq!(ini.live(), 0);
    }

    #[test]
    fn lru_idle_eviction_only() {
        let t0 = Instant::now();
        let mut ini = DcTable::new(DcConfig {
            capacity: 2,
            direct_connect: false,
            ..DcConfig::default()
        });
        let mut ids = Vec::new();
        for q in 1..=2u32 {
            let t = DcTarget {
                addr: addr(q << 8),
                key: 1,
                local: 0,
            };
            let (id, _) = ini.post(t0, t);
            let inv = ini.poll_transmit().unwrap();
            let acc = Message {
                kind: MsgKind::Accept,
                reason: None,
                port: 1,
                dct: q << 8,
                conn: inv.msg.conn,
                key: 0,
                cookie: 3,
            };
            ini.handle_message(t0, addr(q << 8), 9, &acc.encode());
            assert!(matches!(ini.poll_event(), Some(DcEvent::Connect { .. })));
            ini.connected(id, t0);
            ids.push(id);
        }
        // Both busy: a third target waits.
        let t3 = DcTarget {
            addr: addr(3 << 8),
            key: 1,
            local: 0,
        };
        let (id3, _) = ini.post(t0, t3);
        assert_eq!(ini.waiting(), 1);
        assert!(ini.poll_transmit().is_none());
        // The second becomes idle: it is evicted, the third invites.
        ini.completed(ids[1], t0);
        assert_eq!(ini.poll_event(), Some(DcEvent::Teardown { id: ids[1] }));
        assert_eq!(ini.poll_transmit().unwrap().msg.conn, id3.0);
        assert_eq!(ini.live(), 2);
        assert!(ini.is_live(ids[0]));
    }

    /// Direct attempt that connects: no Invite is ever sent, one slot on
    /// each side; a failed attempt sends the Invite at once; a wrong key
    /// is refused by the direct path without being counted, and counted
    /// once when the Invite is rejected.
    #[test]
    fn direct_connect_paths() {
        let t0 = Instant::now();
        let mut ini = DcTable::new(DcConfig::default());
        let mut tgt = DcTable::new(DcConfig::default());
        tgt.set_listen_port(4791);
        tgt.add_dct(0x100, 42);
        // Accepts for it name its own port (where direct attempts go).
        tgt.set_dct_listen_port(0x100, 1);
        let src = addr(0x200);
        let target = DcTarget {
            addr: addr(0x100),
            key: 42,
            local: 0,
        };
        // 1: the attempt wins.
        let (id, _) = ini.post(t0, target);
        assert!(
            ini.poll_transmit().is_none(),
            "Invite before the grace period"
        );
        assert_eq!(
            ini.poll_event(),
            Some(DcEvent::ConnectDirect {
                id,
                target,
                port: 1
            })
        );
        assert!(tgt.target_direct(t0, src, 0x100, 42, id.0).is_some());
        assert_eq!(tgt.live(), 1);
        ini.connected(id, t0);
        assert!(ini.is_live(id));
        ini.handle_timeout(t0 + Duration::from_millis(50));
        assert!(ini.poll_transmit().is_none(), "Invite after connecting");
        assert_eq!(ini.stats().invites, 0);
        assert_eq!(ini.stats().direct_connected, 1);
        // A late duplicate Invite for it takes no slot and gets no answer.
        let inv = Message {
            kind: MsgKind::Invite,
            reason: None,
            port: 0,
            dct: 0x100,
            conn: id.0,
            key: 42,
            cookie: 0,
        };
        tgt.handle_message(t0, src, 0x100, &inv.encode());
        assert_eq!(tgt.live(), 1);
        assert!(tgt.poll_transmit().is_none());

        // 2: a wrong key: the attempt is refused (not counted as a key
        // rejection), the Invite goes at once and is rejected, counted.
        let bad = DcTarget {
            addr: addr(0x101),
            key: 7,
            local: 0,
        };
        tgt.add_dct(0x101, 8);
        let (id2, _) = ini.post(t0, bad);
        assert!(matches!(
            ini.poll_event(),
            Some(DcEvent::ConnectDirect { .. })
        ));
        assert!(tgt.target_direct(t0, src, 0x101, 7, id2.0).is_none());
        assert_eq!(tgt.stats().direct_refused, 1);
        assert_eq!(tgt.stats().rejected_bad_key, 0);
        ini.direct_failed(id2, t0);
        let tx = ini
            .poll_transmit()
            .expect("Invite after the failed attempt");
        assert_eq!(tx.msg.kind, MsgKind::Invite);
        tgt.handle_message(t0, src, 0x101, &tx.msg.encode());
        assert_eq!(tgt.stats().rejected_bad_key, 1);
        let rep = tgt.poll_transmit().expect("Reject");
        ini.handle_message(t0, addr(0x101), 0x200, &rep.msg.encode());
        assert!(matches!(
            ini.poll_event(),
            Some(DcEvent::Failed {
                reason: FailReason::Rejected(RejectReason::BadKey),
                ..
            })
        ));

        // 3: the Invite comes first (grace period over), then the attempt
        // takes the slot the Invite reserved: still one slot.
        let t3 = DcTarget {
            addr: addr(0x100),
            key: 42,
            local: 9,
        };
        let (id3, _) = ini.post(t0, t3);
        assert!(matches!(
            ini.poll_event(),
            Some(DcEvent::ConnectDirect { .. })
        ));
        let t1 = t0 + Duration::from_millis(3);
        ini.handle_timeout(t1);
        let tx = ini.poll_transmit().expect("Invite after the grace period");
        tgt.handle_message(t1, src, 0x100, &tx.msg.encode());
        assert_eq!(tgt.live(), 2);
        let acc = tgt.poll_transmit().expect("Accept");
        assert_eq!(acc.msg.kind, MsgKind::Accept);
        ini.handle_message(t1, addr(0x100), 0x200, &acc.msg.encode());
        assert!(ini.poll_event().is_none(), "waits for the direct attempt");
        assert!(tgt.target_direct(t1, src, 0x100, 42, id3.0).is_some());
        assert_eq!(tgt.live(), 2);
        ini.connected(id3, t1);
        assert!(ini.is_live(id3));
        assert_eq!(tgt.stats().direct_accepts, 2);
    }

    /// A connection that needs an eviction for its slot makes no direct
    /// attempt: its Invite goes at once.
    #[test]
    fn no_direct_attempt_after_eviction() {
        let t0 = Instant::now();
        let mut ini = DcTable::new(DcConfig {
            capacity: 1,
            ..DcConfig::default()
        });
        let first = DcTarget {
            addr: addr(0x100),
            key: 1,
            local: 0,
        };
        let (a, _) = ini.post(t0, first);
        assert!(matches!(
            ini.poll_event(),
            Some(DcEvent::ConnectDirect { .. })
        ));
        ini.connected(a, t0);
        ini.completed(a, t0);
        let second = DcTarget {
            addr: addr(0x200),
            key: 1,
            local: 0,
        };
        let (b, _) = ini.post(t0, second);
        assert_eq!(ini.poll_event(), Some(DcEvent::Teardown { id: a }));
        assert!(
            ini.poll_event().is_none(),
            "a direct attempt after eviction"
        );
        let tx = ini.poll_transmit().expect("Invite at once");
        assert_eq!((tx.msg.kind, tx.msg.conn), (MsgKind::Invite, b.0));
    }
}
