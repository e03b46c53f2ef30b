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
    /// Reverse user → the offering side's DCT: bind the receive side of
    /// the connection with nonce `cookie` to DCT `dct`; `key` proves the
    /// right to. Answered by an Accept (echoing the nonce) or a Reject.
    Bind,
    /// Connection owner → the reverse user (to the DCT the connection
    /// goes to): stop using the connection with nonce `cookie`, answer
    /// when the work on it is done.
    Unbind,
    /// Reverse user → connection owner: nothing more will come over the
    /// connection with nonce `cookie`; it may close.
    Unbound,
    /// Offering side → reverse user: the Bind is accepted (the receive
    /// side is bound), `cookie` echoes the nonce.
    BindAccept,
    /// Offering side → reverse user: the Bind is refused (`reason`).
    BindReject,
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
    /// Bind: no connection with that nonce that may be bound to that DCT
    /// (gone, closing, bound to another DCT, not offered): use the
    /// normal path.
    NoConnection,
    /// A reason this implementation does not know (treated as final).
    Other(u8),
}

impl RejectReason {
    fn code(self) -> u8 {
        match self {
            RejectReason::BadKey => 1,
            RejectReason::NoSuchDct => 2,
            RejectReason::Busy => 3,
            RejectReason::NoConnection => 4,
            RejectReason::Other(c) => c,
        }
    }

    fn from_code(c: u8) -> RejectReason {
        match c {
            1 => RejectReason::BadKey,
            2 => RejectReason::NoSuchDct,
            3 => RejectReason::Busy,
            4 => RejectReason::NoConnection,
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
    /// Accept: the cookie. Bind, Unbind, Unbound, and the Accept of a
    /// Bind: the connection's reverse-offer nonce.
    pub cookie: u64,
}

/// Most DCT numbers one [`ReverseOffer`] names.
pub const MAX_OFFER_DCTS: usize = 16;
/// Version octet of the [`ReverseOffer`] encoding.
pub const OFFER_VERSION: u8 = 1;

/// What the side opening a connection offers for reverse use: the peer may
/// bind the connection's receive side (here) to one of `dcts` by a
/// [`MsgKind::Bind`] naming `nonce`, and then send over the connection
/// it accepted instead of opening one of its own (`docs/dc.md` §2).
///
/// Appended to the private data of a DC connection request, after the
/// fixed part: version (1 octet, [`OFFER_VERSION`]), count `n` (1 octet,
/// 1..=[`MAX_OFFER_DCTS`]), nonce (8), `n` DCT numbers (4 each),
/// big-endian: exactly `10 + 4 n` octets. Nothing after the fixed part:
/// an old-format request, no offer. Anything else after it (another
/// version, a wrong length) is ignored: no offer, the request itself
/// stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReverseOffer {
    /// Names the connection in Bind/Unbind/Unbound (random, never 0).
    pub nonce: u64,
    /// DCTs of the offering context (same protection domain as the
    /// connection) its receive side may be bound to.
    pub dcts: Vec<u32>,
}

impl ReverseOffer {
    /// Appends the wire form to `out` (at most [`MAX_OFFER_DCTS`] DCTs
    /// are written; none: nothing is).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let n = self.dcts.len().min(MAX_OFFER_DCTS);
        if n == 0 {
            return;
        }
        out.push(OFFER_VERSION);
        out.push(n as u8);
        out.extend_from_slice(&self.nonce.to_be_bytes());
        for d in &self.dcts[..n] {
            out.extend_from_slice(&d.to_be_bytes());
        }
    }

    /// Parses what follows the fixed part of a request's private data.
    /// `None`: no offer (nothing there, or not a valid version-1 offer).
    pub fn decode(tail: &[u8]) -> Option<ReverseOffer> {
        let (&ver, rest) = tail.split_first()?;
        let (&n, rest) = rest.split_first()?;
        let n = usize::from(n);
        if ver != OFFER_VERSION || n == 0 || n > MAX_OFFER_DCTS || rest.len() != 8 + 4 * n {
            return None;
        }
        let nonce = u64::from_be_bytes(rest[..8].try_into().ok()?);
        if nonce == 0 {
            return None;
        }
        let dcts = rest[8..]
            .chunks_exact(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Some(ReverseOffer { nonce, dcts })
    }
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
            MsgKind::Bind => 4,
            MsgKind::Unbind => 5,
            MsgKind::Unbound => 6,
            MsgKind::BindAccept => 7,
            MsgKind::BindReject => 8,
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
            4 => MsgKind::Bind,
            5 => MsgKind::Unbind,
            6 => MsgKind::Unbound,
            7 => MsgKind::BindAccept,
            8 => MsgKind::BindReject,
            k => return Err(DecodeError::Kind(k)),
        };
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 octets"));
        Ok(Message {
            kind,
            reason: matches!(kind, MsgKind::Reject | MsgKind::BindReject)
                .then(|| RejectReason::from_code(b[5])),
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
struct Rev {
    /// Initiator (offering side): the nonce offered (0: none), the DCTs
    /// offered, the DCT its receive side is bound to.
    nonce: u64,
    dcts: Vec<u32>,
    bound: Option<u32>,
    /// Target side: the peer's offer (nonce, DCTs), our protection
    /// domain, whether it may still be bound, the reverse-use entry, and
    /// where to answer an Unbind (its source, our DCT, its connection).
    peer: Option<(u64, Vec<u32>, u32)>,
    open: bool,
    user: Option<ConnId>,
    unbind_from: Option<(DgramAddr, u32, u64)>,
    /// Reverse-use entry: the target connection it runs over; asked to
    /// stop (no new work; Unbound once idle).
    via: Option<ConnId>,
    draining: bool,
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
    /// Reverse use.
    rev: Rev,
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
const MAX_RESTARTS: u8 = 4;

/// Wrong-key rejections remembered so that copies of one Invite or Bind
/// are counted once.
const RECENT_REJECTIONS: usize = 64;

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
    /// free its slot ([`DcEvent::Teardown`]). False if there is none. A
    /// connection whose receive side is bound (reverse use) is taken only
    /// if no other is idle, and only through the close handshake
    /// (`Closing`, one at a time): its slot is not free yet (false).
    fn evict_one(&mut self, now: Instant) -> bool {
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
    fn start_closing(&mut self, id: ConnId, now: Instant) {
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

    fn send_unbind(&mut self, id: ConnId, target: DcTarget, nonce: u64) {
        self.send_to_target(MsgKind::Unbind, id, target, 0, nonce);
    }

    fn remove(&mut self, id: ConnId) -> Option<Entry> {
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
        self.send_to_target(MsgKind::Invite, id, target, target.key, 0);
    }

    /// Queues an initiator's message about connection `id` to the UD QP
    /// of `target`'s DCT (Invite, Bind, Unbind: they differ in kind, key
    /// and cookie only).
    fn send_to_target(
        &mut self,
        kind: MsgKind,
        id: ConnId,
        target: DcTarget,
        key: u64,
        cookie: u64,
    ) {
        self.tx.push_back(Transmit {
            from_dct: None,
            to: target.addr,
            msg: Message {
                kind,
                reason: None,
                port: 0,
                dct: target.addr.qpn,
                conn: id.0,
                key,
                cookie,
            },
        });
    }

    /// Gives free slots to waiting connections, oldest first, evicting
    /// idle ones while some wait.
    fn admit_waiting(&mut self, now: Instant) {
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
        let via = if self.cfg.reverse {
            self.offered_to(&target)
        } else {
            None
        };
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
                rev: Rev::default(),
            },
        );
        self.by_target.insert(target, id);
        match via {
            Some((t, nonce)) => self.start_bind(id, t, nonce, now),
            None => {
                self.waiting.push_back(id);
                self.admit_waiting(now);
            }
        }
        (id, true)
    }

    /// A target connection whose peer offered reverse use for `target`'s
    /// DCT (same address, same protection domain, not in use or closing),
    /// with the offer's nonce.
    fn offered_to(&self, target: &DcTarget) -> Option<(ConnId, u64)> {
        let ip = target.addr.ip.to_canonical();
        self.entries.iter().find_map(|(&id, e)| {
            let (nonce, dcts, local) = e.rev.peer.as_ref()?;
            let ok = matches!(e.state, State::TargetLive)
                && e.rev.open
                && e.rev.user.is_none()
                && *local == target.local
                && e.target.addr.ip.to_canonical() == ip
                && dcts.contains(&target.addr.qpn);
            ok.then_some((id, *nonce))
        })
    }

    /// Reverse user: `id` (new, no slot) asks to run over target
    /// connection `t`: Bind now, retransmitted until answered or
    /// `bind_timeout` (then the normal path).
    fn start_bind(&mut self, id: ConnId, t: ConnId, nonce: u64, now: Instant) {
        let rto = self.cfg.rto_initial;
        if let Some(te) = self.entries.get_mut(&t) {
            te.rev.user = Some(id);
        }
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.rev.via = Some(t);
        e.state = State::Binding {
            next_tx: now + rto,
            rto,
            deadline: now + self.cfg.bind_timeout,
        };
        let target = e.target;
        self.stats.binds += 1;
        self.send_bind(id, target, nonce);
    }

    fn send_bind(&mut self, id: ConnId, target: DcTarget, nonce: u64) {
        self.send_to_target(MsgKind::Bind, id, target, target.key, nonce);
    }

    /// Reverse user: the Bind of `id` did not work out (refused, timed
    /// out, its connection closing): the connection it would have run
    /// over is not tried again, and `id` takes the normal path (a slot,
    /// a direct attempt, an invitation) with its work kept.
    fn bind_fallback(&mut self, id: ConnId, now: Instant) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let Some(t) = e.rev.via.take() else {
            return;
        };
        e.state = State::Waiting;
        if let Some(te) = self.entries.get_mut(&t) {
            te.rev.user = None;
            te.rev.open = false;
        }
        self.stats.bind_fallbacks += 1;
        self.waiting.push_back(id);
        self.admit_waiting(now);
    }

    /// Reverse user: `id` (running over a target connection) is done:
    /// gone from the table ([`DcEvent::Unbound`]); if its target
    /// connection was asked to unbind, [`DcEvent::Drained`] follows.
    fn finish_reverse(&mut self, id: ConnId) {
        let Some(e) = self.remove(id) else { return };
        self.events.push_back(DcEvent::Unbound { id });
        if let Some(t) = e.rev.via {
            if self
                .entries
                .get(&t)
                .is_some_and(|te| te.rev.unbind_from.is_some())
            {
                self.events.push_back(DcEvent::Drained { id: t });
            }
        }
    }

    /// Offering side: initiator connection `id` offers reverse use to
    /// its peer for `dcts` (this context's DCTs of the connection's
    /// protection domain). The offer to put in the connection request
    /// (`None`: `reverse` is off, no DCT, or `id` is not an initiator
    /// connection). The same nonce for every request of `id`.
    pub fn offer(&mut self, id: ConnId, dcts: &[u32]) -> Option<ReverseOffer> {
        if !self.cfg.reverse || dcts.is_empty() {
            return None;
        }
        let mut nonce = self.entries.get(&id).map(|e| e.rev.nonce)?;
        if nonce == 0 {
            nonce = self.rand();
            while nonce == 0 || self.nonces.contains_key(&nonce) {
                nonce = self.rand();
            }
            self.nonces.insert(nonce, id);
        }
        let e = self.entries.get_mut(&id)?;
        if e.remote.is_some() {
            self.nonces.remove(&nonce);
            return None;
        }
        e.rev.nonce = nonce;
        e.rev.dcts = dcts[..dcts.len().min(MAX_OFFER_DCTS)].to_vec();
        Some(ReverseOffer {
            nonce,
            dcts: e.rev.dcts.clone(),
        })
    }

    /// Target side: target connection `id` (just accepted) came with the
    /// peer's `offer`; `local` is the protection domain work sent back
    /// over it must have (the DCT's). Ignored with `reverse` off.
    pub fn accept_offer(&mut self, id: ConnId, offer: ReverseOffer, local: u32) {
        if !self.cfg.reverse || self.peer_nonces.contains_key(&offer.nonce) {
            return;
        }
        if let Some(e) = self.entries.get_mut(&id) {
            if matches!(e.state, State::TargetLive) && e.rev.peer.is_none() {
                self.peer_nonces.insert(offer.nonce, id);
                e.rev.peer = Some((offer.nonce, offer.dcts, local));
                e.rev.open = true;
            }
        }
    }

    /// Reverse user, after [`DcEvent::Drained`]: what was written over
    /// target connection `id` has been delivered: answer the Unbind
    /// (the peer may close it now).
    pub fn unbound_ready(&mut self, id: ConnId) {
        let Some(e) = self.entries.get(&id) else {
            return;
        };
        if e.rev.user.is_some() {
            return;
        }
        let (Some((to, dct, conn)), Some((nonce, ..))) = (e.rev.unbind_from, e.rev.peer.as_ref())
        else {
            return;
        };
        let nonce = *nonce;
        self.reply(
            dct,
            to,
            Message {
                kind: MsgKind::Unbound,
                reason: None,
                port: 0,
                dct,
                conn,
                key: 0,
                cookie: nonce,
            },
        );
    }

    /// Reverse user: the connection `id` runs over, if it is bound.
    pub fn bound_via(&self, id: ConnId) -> Option<ConnId> {
        self.entries
            .get(&id)
            .filter(|e| matches!(e.state, State::Live))
            .and_then(|e| e.rev.via)
    }

    /// Initiator: one work request of `id` completed (successfully or
    /// not).
    pub fn completed(&mut self, id: ConnId, now: Instant) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.busy = e.busy.saturating_sub(1);
            e.last_used = now;
            if e.busy == 0 && e.rev.draining {
                self.finish_reverse(id);
            }
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
        if let Some(e) = self.remove(id) {
            // A reverse user that failed: its connection is not offered
            // again (it is failing, or closing).
            if let Some(t) = e.rev.via {
                if let Some(te) = self.entries.get_mut(&t) {
                    te.rev.open = false;
                }
            }
            // A reverse user of a target connection that is gone: a Bind
            // under way takes the normal path; a bound one stops (its
            // work in flight fails with the QP, as a dead peer's).
            if let Some(r) = e.rev.user {
                if let Some(re) = self.entries.get(&r) {
                    if matches!(re.state, State::Binding { .. }) {
                        self.bind_fallback(r, now);
                    } else {
                        self.remove(r);
                        self.events.push_back(DcEvent::Unbound { id: r });
                    }
                }
            }
        }
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
            MsgKind::Bind => self.on_bind(src, local_qpn, msg),
            MsgKind::Unbind => self.on_unbind(now, src, local_qpn, msg),
            MsgKind::Unbound => self.on_unbound(now, msg),
            MsgKind::BindAccept => self.on_bind_answer(now, msg, None),
            MsgKind::BindReject => self.on_bind_answer(now, msg, msg.reason),
        }
    }

    /// Offering side: a Bind for connection nonce `m.cookie` to DCT
    /// `m.dct` (received on `local_qpn`). The key is checked exactly as
    /// an Invite's (a wrong one is rejected and counted once).
    fn on_bind(&mut self, src: DgramAddr, local_qpn: u32, m: Message) {
        let key = match self.dcts.get(&m.dct) {
            Some(&k) if m.dct == local_qpn => k,
            _ => {
                self.stats.rejected_no_dct += 1;
                self.bind_reject(
                    Message {
                        dct: local_qpn,
                        ..m
                    },
                    src,
                    RejectReason::NoSuchDct,
                );
                return;
            }
        };
        if key != m.key {
            self.count_bad_key(m.dct, src, m.conn);
            self.bind_reject(m, src, RejectReason::BadKey);
            return;
        }
        let id = self.nonces.get(&m.cookie).copied();
        let e = id.and_then(|id| self.entries.get_mut(&id).map(|e| (id, e)));
        let ok = match e {
            Some((id, e))
                if matches!(e.state, State::Live)
                    && e.rev.via.is_none()
                    && e.rev.dcts.contains(&m.dct) =>
            {
                match e.rev.bound {
                    None => {
                        e.rev.bound = Some(m.dct);
                        self.stats.binds_accepted += 1;
                        self.events
                            .push_back(DcEvent::BindReceive { id, dct: m.dct });
                        true
                    }
                    Some(d) if d == m.dct => {
                        self.stats.duplicate_binds += 1;
                        true
                    }
                    Some(_) => false,
                }
            }
            _ => false,
        };
        if !ok {
            self.stats.binds_refused += 1;
            self.bind_reject(m, src, RejectReason::NoConnection);
            return;
        }
        self.reply(
            m.dct,
            src,
            Message {
                kind: MsgKind::BindAccept,
                reason: None,
                port: 0,
                dct: m.dct,
                conn: m.conn,
                key: 0,
                cookie: m.cookie,
            },
        );
    }

    /// Counts and reports a wrong-key Invite or Bind once: a
    /// retransmitted or duplicated copy (same source, same connection
    /// id, among the last [`RECENT_REJECTIONS`]) is answered again but
    /// not counted again.
    fn count_bad_key(&mut self, dct: u32, src: DgramAddr, conn: u64) {
        if self.recent_rejections.contains(&(src, conn)) {
            return;
        }
        if self.recent_rejections.len() >= RECENT_REJECTIONS {
            self.recent_rejections.pop_front();
        }
        self.recent_rejections.push_back((src, conn));
        self.stats.rejected_bad_key += 1;
        self.events.push_back(DcEvent::KeyRejected { dct, src });
    }

    fn bind_reject(&mut self, m: Message, to: DgramAddr, reason: RejectReason) {
        self.reply(
            m.dct,
            to,
            Message {
                kind: MsgKind::BindReject,
                reason: Some(reason),
                port: 0,
                dct: m.dct,
                conn: m.conn,
                key: 0,
                cookie: m.cookie,
            },
        );
    }

    /// Reverse user: the owner of the connection with nonce `m.cookie`
    /// wants to close it. New work goes elsewhere at once; the answer
    /// (Unbound) waits for the work on it ([`DcEvent::Drained`]).
    fn on_unbind(&mut self, now: Instant, src: DgramAddr, local_qpn: u32, m: Message) {
        let Some(&t) = self.peer_nonces.get(&m.cookie) else {
            // Gone already (closed): nothing of ours is on it.
            self.reply(
                local_qpn,
                src,
                Message {
                    kind: MsgKind::Unbound,
                    reason: None,
                    port: 0,
                    dct: local_qpn,
                    conn: m.conn,
                    key: 0,
                    cookie: m.cookie,
                },
            );
            return;
        };
        let Some(te) = self.entries.get_mut(&t) else {
            return;
        };
        te.rev.open = false;
        te.rev.unbind_from = Some((src, local_qpn, m.conn));
        match te.rev.user {
            None => self.events.push_back(DcEvent::Drained { id: t }),
            Some(r) => {
                let Some(re) = self.entries.get_mut(&r) else {
                    return;
                };
                if matches!(re.state, State::Binding { .. }) {
                    self.bind_fallback(r, now);
                    self.events.push_back(DcEvent::Drained { id: t });
                    return;
                }
                re.rev.draining = true;
                let (busy, target) = (re.busy, re.target);
                if self.by_target.get(&target) == Some(&r) {
                    self.by_target.remove(&target);
                }
                if busy == 0 {
                    self.finish_reverse(r);
                }
            }
        }
    }

    /// Connection owner: the peer answered the Unbind of `m.conn`.
    fn on_unbound(&mut self, now: Instant, m: Message) {
        let id = ConnId(m.conn);
        let ok = self
            .entries
            .get(&id)
            .is_some_and(|e| matches!(e.state, State::Closing { .. }) && e.rev.nonce == m.cookie);
        if !ok {
            self.stats.stale_answers += 1;
            return;
        }
        self.remove(id);
        self.events.push_back(DcEvent::Teardown { id });
        self.admit_waiting(now);
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
            self.count_bad_key(m.dct, src, m.conn);
            self.reject(m.dct, src, m.conn, RejectReason::BadKey);
            return;
        }
        if self.live >= self.cfg.capacity && !self.evict_one(now) {
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
                rev: Rev::default(),
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

    /// Reverse user: the answer to the Bind of `id`.
    fn on_bind_answer(&mut self, now: Instant, m: Message, r: Option<RejectReason>) {
        let id = ConnId(m.conn);
        let via = self
            .entries
            .get(&id)
            .filter(|e| matches!(e.state, State::Binding { .. }) && e.target.addr.qpn == m.dct)
            .and_then(|e| e.rev.via);
        let Some(via) = via else {
            self.stats.stale_answers += 1;
            return;
        };
        let nonce = self
            .entries
            .get(&via)
            .and_then(|t| t.rev.peer.as_ref())
            .map(|p| p.0);
        match r {
            None if nonce == Some(m.cookie) => {
                let e = self.entries.get_mut(&id).expect("checked");
                e.state = State::Live;
                e.last_used = now;
                self.stats.bound += 1;
                self.events.push_back(DcEvent::Bound { id, via });
            }
            None => self.stats.stale_answers += 1,
            Some(RejectReason::BadKey) => {
                // As the invitation would have: the key is wrong for the
                // DCT (counted once, by the target).
                let e = self.remove(id).expect("checked");
                self.events.push_back(DcEvent::Failed {
                    id,
                    target: e.target,
                    reason: FailReason::Rejected(RejectReason::BadKey),
                });
            }
            // Anything else: the normal path decides.
            Some(_) => self.bind_fallback(id, now),
        }
    }

    /// Runs the timers due at `now`: invitation retransmission and
    /// timeout, idle close, expiry of awaited target connections.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut retx = Vec::new();
        let mut first = Vec::new();
        let mut gone = Vec::new();
        let mut rebind = Vec::new();
        let mut unbind = Vec::new();
        let mut fallback = Vec::new();
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
                // A reverse user holds no slot: it lives as long as the
                // connection it runs over.
                State::Live
                    if e.busy == 0
                        && e.rev.via.is_none()
                        && now >= e.last_used + self.cfg.idle_timeout =>
                {
                    gone.push((id, 1));
                }
                State::TargetPending { expires, .. } if now >= *expires => gone.push((id, 2)),
                State::Binding {
                    next_tx,
                    rto,
                    deadline,
                } => {
                    if now >= *deadline {
                        fallback.push(id);
                    } else if now >= *next_tx {
                        *rto = (*rto * 2).min(self.cfg.rto_max);
                        *next_tx = now + *rto;
                        rebind.push(id);
                    }
                }
                State::Closing {
                    next_tx,
                    rto,
                    deadline,
                } => {
                    if now >= *deadline {
                        gone.push((id, 3));
                    } else if now >= *next_tx {
                        *rto = (*rto * 2).min(self.cfg.rto_max);
                        *next_tx = now + *rto;
                        unbind.push((id, e.target, e.rev.nonce));
                    }
                }
                _ => {}
            }
        }
        for id in rebind {
            let nonce = self
                .entries
                .get(&id)
                .and_then(|e| e.rev.via)
                .and_then(|t| self.entries.get(&t))
                .and_then(|t| t.rev.peer.as_ref())
                .map(|p| p.0);
            let target = self.entries.get(&id).map(|e| e.target);
            if let (Some(nonce), Some(target)) = (nonce, target) {
                self.stats.bind_retransmits += 1;
                self.send_bind(id, target, nonce);
            }
        }
        for (id, target, nonce) in unbind {
            self.send_unbind(id, target, nonce);
        }
        fallback.sort();
        for id in fallback {
            self.bind_fallback(id, now);
        }
        // Idle bound connections close through the handshake.
        let closing: Vec<ConnId> = gone
            .iter()
            .filter(|(id, why)| {
                *why == 1 && self.entries.get(id).is_some_and(|e| e.rev.bound.is_some())
            })
            .map(|(id, _)| *id)
            .collect();
        gone.retain(|(id, why)| !(*why == 1 && closing.contains(id)));
        for id in closing {
            self.stats.idle_closes += 1;
            self.start_closing(id, now);
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
                3 => {
                    // The peer did not answer the Unbind: closed anyway.
                    self.stats.unbind_timeouts += 1;
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
                State::Live if e.busy == 0 && e.rev.via.is_none() => {
                    Some(e.last_used + self.cfg.idle_timeout)
                }
                State::TargetPending { expires, .. } => Some(expires),
                State::Binding {
                    next_tx, deadline, ..
                }
                | State::Closing {
                    next_tx, deadline, ..
                } => Some(next_tx.min(deadline)),
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

    /// Reverse use, deterministic: A opens a connection to B offering its
    /// DCT; B's work for that DCT binds over it (Bind, key checked, A
    /// binds, BindAccept); a wrong key is refused and counted once and
    /// fails that work as the invitation would (no Invite follows); A's
    /// idle close goes through Unbind/Unbound; an old-format offer
    /// (none) means no Bind.
    #[test]
    fn reverse_bind_paths() {
        let t0 = Instant::now();
        let cfg = DcConfig {
            direct_connect: true,
            ..DcConfig::default()
        };
        let (a_ctl, b_ctl) = (addr(0x5000), addr(0x7000));
        let (a_dct, b_dct) = (0x6001u32, 0x8001u32);
        let mut a = DcTable::new(cfg);
        let mut b = DcTable::new(DcConfig { seed: 99, ..cfg });
        a.add_dct(a_dct, 11);
        b.add_dct(b_dct, 22);
        // A → B's DCT, direct, with the offer.
        let to_b = DcTarget {
            addr: addr(b_dct),
            key: 22,
            local: 3,
        };
        let (ia, _) = a.post(t0, to_b);
        assert!(matches!(
            a.poll_event(),
            Some(DcEvent::ConnectDirect { .. })
        ));
        let offer = a.offer(ia, &[a_dct]).expect("offer");
        let mut pd = Vec::new();
        offer.encode(&mut pd);
        assert_eq!(ReverseOffer::decode(&pd), Some(offer.clone()));
        assert_eq!(ReverseOffer::decode(&[]), None, "old format: no offer");
        assert_eq!(ReverseOffer::decode(&pd[..pd.len() - 1]), None);
        let tb = b
            .target_direct(t0, a_ctl, b_dct, 22, ia.0)
            .expect("accepted");
        b.accept_offer(tb, ReverseOffer::decode(&pd).unwrap(), 3);
        a.connected(ia, t0);
        a.completed(ia, t0);
        // B → A's DCT with a wrong key: Bind, refused, counted once.
        let bad = DcTarget {
            addr: addr(a_dct),
            key: 10,
            local: 3,
        };
        let (rb, new) = b.post(t0, bad);
        assert!(new);
        let tx = b.poll_transmit().expect("Bind");
        assert_eq!((tx.msg.kind, tx.msg.cookie), (MsgKind::Bind, offer.nonce));
        a.handle_message(t0, b_ctl, a_dct, &tx.msg.encode());
        assert_eq!(a.stats().rejected_bad_key, 1);
        assert!(matches!(a.poll_event(), Some(DcEvent::KeyRejected { .. })));
        let rep = a.poll_transmit().expect("BindReject");
        assert_eq!(rep.msg.kind, MsgKind::BindReject);
        b.handle_message(t0, addr(a_dct), 0x7000, &rep.msg.encode());
        assert_eq!(
            b.poll_event(),
            Some(DcEvent::Failed {
                id: rb,
                target: bad,
                reason: FailReason::Rejected(RejectReason::BadKey)
            })
        );
        assert!(b.poll_transmit().is_none(), "no Invite after a bad key");
        // The right key: bound, A's receive side first.
        let good = DcTarget { key: 11, ..bad };
        let (rg, _) = b.post(t0, good);
        let tx = b.poll_transmit().expect("Bind");
        // Duplicated on the way: answered twice, bound once.
        a.handle_message(t0, b_ctl, a_dct, &tx.msg.encode());
        a.handle_message(t0, b_ctl, a_dct, &tx.msg.encode());
        assert_eq!(
            a.poll_event(),
            Some(DcEvent::BindReceive { id: ia, dct: a_dct })
        );
        assert!(a.poll_event().is_none());
        assert_eq!(a.stats().duplicate_binds, 1);
        let acc = a.poll_transmit().expect("BindAccept");
        assert_eq!(acc.msg.kind, MsgKind::BindAccept);
        b.handle_message(t0, addr(a_dct), 0x7000, &acc.msg.encode());
        assert_eq!(b.poll_event(), Some(DcEvent::Bound { id: rg, via: tb }));
        let dup = a.poll_transmit().expect("second BindAccept");
        b.handle_message(t0, addr(a_dct), 0x7000, &dup.msg.encode());
        assert!(b.poll_event().is_none());
        assert_eq!(b.bound_via(rg), Some(tb));
        assert_eq!((a.live(), b.live()), (1, 1), "one slot each side");
        // B has work in flight; A goes idle: Unbind, no close yet.
        let t1 = t0 + Duration::from_secs(3);
        a.handle_timeout(t1);
        let ub = a.poll_transmit().expect("Unbind");
        assert_eq!(ub.msg.kind, MsgKind::Unbind);
        assert!(a.poll_event().is_none(), "closed before the Unbound");
        b.handle_message(t1, a_ctl, b_dct, &ub.msg.encode());
        assert!(b.poll_event().is_none(), "answered with work in flight");
        // New work for A's DCT goes elsewhere (normal path).
        let (other, new) = b.post(t1, good);
        assert!(new && other != rg);
        assert!(matches!(
            b.poll_event(),
            Some(DcEvent::ConnectDirect { id, .. }) if id == other
        ));
        b.completed(rg, t1);
        assert_eq!(b.poll_event(), Some(DcEvent::Unbound { id: rg }));
        assert_eq!(b.poll_event(), Some(DcEvent::Drained { id: tb }));
        b.unbound_ready(tb);
        let ud = loop {
            let tx = b.poll_transmit().expect("Unbound");
            if tx.msg.kind == MsgKind::Unbound {
                break tx;
            }
        };
        a.handle_message(t1, addr(b_dct), 0x5000, &ud.msg.encode());
        assert_eq!(a.poll_event(), Some(DcEvent::Teardown { id: ia }));
        assert_eq!(a.live(), 0);
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
