//! The reliable-datagram (RD) reliability layer, sans-IO.
//!
//! [`RdEndpoint`] gives one local datagram QP reliable, in-order,
//! exactly-once delivery per source over UDP, with the RD shim of
//! `softrdma_wire::rd` (`docs/datagram.md` §9) in front of every DDP
//! segment. It knows nothing of DDP: what it sequences are caller-defined
//! `Copy` **tokens** (for instance "segment 3 of work request 17"). A token
//! is handed back by [`RdEndpoint::poll_transmit`] each time its segment
//! has to go on the wire, first transmission and retransmissions alike, so
//! the caller rebuilds the segment from the registered source buffer and
//! nothing is copied.
//!
//! * in: [`RdEndpoint::send`] (queue a token for a peer),
//!   [`RdEndpoint::handle_datagram`] (a CRC-checked shim from a peer; its
//!   [`Verdict`] says whether the segment behind it goes to the layer above),
//!   [`RdEndpoint::handle_timeout`];
//! * out: [`RdEndpoint::poll_transmit`] (peer, token or none, shim),
//!   [`RdEndpoint::poll_timeout`], [`RdEndpoint::poll_event`] (tokens acked,
//!   a peer failed and its tokens abandoned, sessions started, peers expired).
//!
//! Peers are keys of the caller's choosing ([`PeerKey`]; [`DgramAddr`]
//! is one: IP, port and the peer's QP number).
//!
//! # Sessions and epochs
//!
//! Each direction (this QP → a peer QP) runs as a *session* named by a
//! 32-bit **epoch** the sender picks; PSNs start at 0 in every session.
//! Epochs come from a per-endpoint counter started at
//! [`RdConfig::epoch_seed`] and compared in serial-number arithmetic (RFC
//! 1982), so a later session is "newer". A restarted process should seed
//! from the wall clock (milliseconds, truncated to 32 bits) so its epochs
//! are newer than its previous incarnation's; if they are not, the reset
//! mechanism below repairs it.
//!
//! A sender starts a session when it has a token for a peer and
//! * has no session with it (first traffic, after expiry, after failure), or
//! * its session is quiescent (everything acknowledged) and it has sent no
//!   data in it for `idle_timeout / 2` (the receiver may be about to forget
//!   it, see expiry).
//!
//! It sets **S (SYN)** on every data datagram until an ACK naming the epoch
//! arrives. The receiver of a data datagram with epoch `e`:
//!
//! | receiver state | datagram | action |
//! |---|---|---|
//! | session `e` | any | sequence check below |
//! | none, or older than `e` | SYN | start session `e` at PSN 0 ([`Event::SessionStarted`]), then the sequence check |
//! | none | no SYN | drop; reply **R** (reset) for `e` with floor `e` |
//! | older than `e` | no SYN | drop; reply R for `e`, floor = current epoch |
//! | newer than `e` | any | drop (stale); reply R for `e`, floor = current epoch |
//!
//! A sender that gets R for its *current* epoch starts a new session with
//! an epoch serially above the floor and its own counter, and re-sends
//! every unacknowledged token in it from PSN 0 with SYN
//! ([`Event::Resynced`]); an R for any other epoch is stale and ignored.
//! ACKs name the epoch they acknowledge and are ignored for any other, so an
//! ACK from an old session can never acknowledge a new one's PSNs.
//!
//! # Sequence check (receiver) — drop out of order
//!
//! Within the session, PSN `p` against the expected PSN `x`:
//! `p == x` → [`Verdict::Deliver`], `x += 1`; `p` before `x` →
//! [`Verdict::Duplicate`] and an ACK (ours was lost: at once for the first
//! duplicate since the last delivery, on the ACK timer for the rest of a
//! re-sent burst); `p` after
//! `x` → dropped, and the first such datagram per `x` sends an immediate
//! NAK (A+N with ack PSN `x`). Out-of-order datagrams are **not** buffered:
//! exactly-once and in-order delivery then need one comparison, a session
//! costs a few words and pins no receive buffer (10 000 peers cost 10 000
//! small entries, and a peer cannot make us hold datagrams), and UDP
//! between two hosts reorders rarely, so out of order almost always means
//! lost. The price is go-back-N: after a loss the sender re-sends from the
//! missing PSN, at most a window's worth. SACK blocks would only pay with
//! a reorder buffer, so the shim has none.
//!
//! # Acknowledgements
//!
//! Every datagram to a peer whose session we receive carries A with our
//! cumulative ACK (next expected PSN) and our window: data datagrams
//! piggyback it for free. An ACK-only datagram goes out when an ACK is
//! owed and no data is ready: after [`RdConfig::ack_every`] deliveries,
//! after [`RdConfig::ack_delay`] (delayed ACK timer), at once on a gap
//! (NAK), a P (poll) flag or a duplicate (the first of a re-sent burst). The sender sets P on the last
//! data datagram it can send before it stalls (queue drained or window
//! full), so the tail is acknowledged without waiting for the timer.
//!
//! # Retransmission, failure and flow control (sender)
//!
//! * Unacknowledged tokens stay queued; nothing else is kept.
//! * One retransmission timer per peer, RTO from RFC 6298 (SRTT/RTTVAR,
//!   Karn's rule: no sample from a re-sent PSN), clamped to
//!   `[rto_min, rto_max]`. On expiry the RTO doubles (until an ACK makes
//!   progress) and every unacknowledged token is re-sent from the oldest
//!   (go-back-N). A NAK for
//!   the oldest unacknowledged PSN does the same at once, once per gap.
//! * After [`RdConfig::retry_limit`] expiries without progress the peer
//!   fails: [`Event::PeerFailed`], then [`Event::Abandoned`] for each of its
//!   tokens, oldest first. Other peers are not affected. The next token for
//!   that peer starts a new session.
//! * At most `min(tx_window, peer's advertised window)` distinct PSNs are
//!   unacknowledged. The window is in datagrams; a peer advertising 0 stops
//!   us, and while it does we probe it (control datagram with P) on the
//!   retransmission timer; unanswered probes count as retries.
//!
//! # State expiry
//!
//! A peer entry is removed ([`Event::PeerExpired`]) when it is quiescent —
//! nothing queued or unacknowledged, no ACK owed — and nothing was sent to
//! or received from the peer for [`RdConfig::idle_timeout`]. Nothing of it
//! remains. Exactly-once across expiry rests on one rule, checked by
//! [`RdConfig::validate`]: `idle_timeout ≥ (retry_limit + 1) · rto_max +
//! max_datagram_lifetime`. Then a receiver keeps a session at least as
//! long as its sender can still (re)send a datagram of it and that
//! datagram can still be in the network, so a stale datagram always meets
//! its session and is recognised as a duplicate; a sender continues a
//! quiescent session only within `idle_timeout / 2` of its last data, when
//! the receiver still has it (and if not, the reset above renumbers tokens
//! the receiver never delivered).
//!
//! # Bounds
//!
//! [`RdConfig::max_peers`] entries (a SYN from a new peer beyond it is
//! dropped and counted; the sender retries), [`RdConfig::max_queue`] tokens
//! per peer ([`SendError::QueueFull`]), [`RdConfig::max_control`] queued
//! stateless replies (resets to unknown peers; overflow dropped and
//! counted). Memory follows the active peers: tables shrink as entries
//! expire, and the event and stateless-reply queues, once drained, give
//! back what a burst (every peer expiring at once) grew them to beyond
//! `1024 + 2 · peers` entries.
//!
//! # Layout
//!
//! This file holds the configuration, events, statistics and the
//! endpoint's state and API. Beside it: `peer` (per-peer sender and
//! receiver state), `transmit` (queueing tokens, building shims),
//! `receive` (acting on arriving shims), `timers` (deadlines, failure,
//! memory give-back).

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

use softrdma_wire::rd::{DataSeq, Feedback, RdShimRepr, MAX_QPN};

use crate::util::peers::PeerTable;
use crate::wr::DgramAddr;

mod peer;
mod receive;
mod timers;
mod transmit;

use peer::{Hold, Peer, Rx, Tx};
use timers::{shrink_drained, TimerEntry};

/// What identifies a peer: any small key the caller derives from a
/// datagram's source (UDP address and the shim's SQPN).
pub trait PeerKey: Copy + Eq + Hash {
    /// The peer's QP number, written as DQPN in the shims sent to it.
    fn qpn(&self) -> u32;
}

impl PeerKey for DgramAddr {
    fn qpn(&self) -> u32 {
        self.qpn
    }
}

/// `a` is serially after `b` (RFC 1982 on 32 bits).
pub fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// Parameters of an [`RdEndpoint`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdConfig {
    /// This QP's number (SQPN of every shim sent; datagrams for another
    /// DQPN are dropped).
    pub local_qpn: u32,
    /// Most peer entries at once.
    pub max_peers: usize,
    /// Most tokens queued per peer (unacknowledged plus not yet sent).
    pub max_queue: usize,
    /// Most unacknowledged data datagrams per peer that we allow ourselves.
    pub tx_window: u16,
    /// The window we advertise (datagrams a peer may have unacknowledged
    /// towards us); see [`RdEndpoint::set_rx_window`].
    pub rx_window: u16,
    /// The window assumed for a peer until it advertises one.
    pub initial_peer_window: u16,
    /// Delayed-ACK timer.
    pub ack_delay: Duration,
    /// ACK at once after this many deliveries not yet acknowledged.
    pub ack_every: u32,
    /// RTO before the first RTT sample.
    pub rto_initial: Duration,
    /// Lower bound of the RTO (above `ack_delay`).
    pub rto_min: Duration,
    /// Upper bound of the RTO, also under backoff.
    pub rto_max: Duration,
    /// Retransmission timeouts in a row (without progress) before the peer
    /// fails.
    pub retry_limit: u32,
    /// A quiescent peer entry is removed after this long without traffic.
    pub idle_timeout: Duration,
    /// The longest a datagram may live in the network (the MSL assumption).
    pub max_datagram_lifetime: Duration,
    /// Most stateless replies (resets, probe answers to unknown peers)
    /// waiting for [`RdEndpoint::poll_transmit`].
    pub max_control: usize,
    /// First epoch this endpoint uses (see the module documentation).
    pub epoch_seed: u32,
}

impl Default for RdConfig {
    fn default() -> Self {
        RdConfig {
            local_qpn: 0,
            max_peers: 16 * 1024,
            max_queue: 1024,
            tx_window: 64,
            rx_window: 64,
            initial_peer_window: 16,
            ack_delay: Duration::from_micros(200),
            ack_every: 8,
            rto_initial: Duration::from_millis(10),
            rto_min: Duration::from_millis(2),
            rto_max: Duration::from_millis(500),
            retry_limit: 7,
            idle_timeout: Duration::from_secs(10),
            max_datagram_lifetime: Duration::from_secs(2),
            max_control: 1024,
            epoch_seed: 1,
        }
    }
}

impl RdConfig {
    /// The longest a sender keeps re-sending one datagram before its peer
    /// fails: `(retry_limit + 1) · rto_max`.
    pub fn give_up_span(&self) -> Duration {
        self.rto_max
            .saturating_mul(self.retry_limit.saturating_add(1))
    }

    /// Checks the bounds and the expiry rule
    /// `idle_timeout ≥ give_up_span + max_datagram_lifetime`.
    pub fn validate(&self) -> Result<(), RdConfigError> {
        let e = |s| Err(RdConfigError(s));
        if self.local_qpn > MAX_QPN {
            return e("local_qpn above 24 bits");
        }
        if self.max_peers == 0 || self.max_queue == 0 || self.max_control == 0 {
            return e("max_peers, max_queue and max_control must be positive");
        }
        if self.tx_window == 0 || self.ack_every == 0 {
            return e("tx_window and ack_every must be positive");
        }
        if self.rto_min.is_zero()
            || self.rto_min > self.rto_initial
            || self.rto_initial > self.rto_max
        {
            return e("need 0 < rto_min <= rto_initial <= rto_max");
        }
        if self.ack_delay >= self.rto_min {
            return e("ack_delay must be below rto_min");
        }
        if self.idle_timeout
            < self
                .give_up_span()
                .saturating_add(self.max_datagram_lifetime)
        {
            return e("idle_timeout below (retry_limit + 1) * rto_max + max_datagram_lifetime");
        }
        Ok(())
    }
}

/// An [`RdConfig`] that [`RdConfig::validate`] refused, with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdConfigError(pub &'static str);

impl std::fmt::Display for RdConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid RD configuration: {}", self.0)
    }
}

impl std::error::Error for RdConfigError {}

/// Why [`RdEndpoint::send`] refused a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The peer is new and the table holds [`RdConfig::max_peers`] entries.
    TableFull,
    /// The peer already has [`RdConfig::max_queue`] tokens queued.
    QueueFull,
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SendError::TableFull => "RD peer table full",
            SendError::QueueFull => "RD send queue for this peer full",
        })
    }
}

impl std::error::Error for SendError {}

/// What to do with the DDP segment behind a shim given to
/// [`RdEndpoint::handle_datagram`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The next datagram of the peer's session: hand the segment to the
    /// layer above now (this is its one and only delivery).
    Deliver,
    /// Delivered before: discard the segment (an ACK is on its way).
    Duplicate,
    /// No segment (control datagram); its feedback was processed.
    Control,
    /// Discard the segment; it was not delivered.
    Drop(DropReason),
}

/// Why a datagram's segment was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Its PSN is after the expected one (a datagram before it was lost).
    OutOfOrder,
    /// Its epoch is older than the peer's current session.
    StaleEpoch,
    /// No session with its epoch and no SYN (a reset was sent back).
    NoSession,
    /// A SYN from a new peer while the table was full.
    TableFull,
    /// Its DQPN is not this QP.
    WrongQp,
}

/// Something the layer above must learn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<K, T> {
    /// The peer acknowledged this token (tokens come in the order sent):
    /// its send work request may complete once all its tokens are acked.
    Acked {
        /// The peer.
        peer: K,
        /// The token.
        token: T,
    },
    /// The peer did not answer within the retry limit. [`Event::Abandoned`]
    /// follows for each of the `abandoned` tokens it had queued.
    PeerFailed {
        /// The peer.
        peer: K,
        /// Tokens that were not acknowledged (some may have arrived).
        abandoned: usize,
    },
    /// A token of a failed peer: fail its work request.
    Abandoned {
        /// The peer.
        peer: K,
        /// The token.
        token: T,
    },
    /// The peer started a new session towards us (first contact, after
    /// expiry, or it restarted / failed us and began again when `replaced`).
    /// Per-source state of the layer above (reassembly, MSNs) restarts.
    SessionStarted {
        /// The peer.
        peer: K,
        /// An older session of the same peer was replaced.
        replaced: bool,
    },
    /// The peer had lost our session (it restarted or expired it); the
    /// `resent` unacknowledged tokens are being re-sent in a new session.
    Resynced {
        /// The peer.
        peer: K,
        /// Tokens re-sent.
        resent: usize,
    },
    /// The peer's entry was removed after `idle_timeout` of quiet.
    PeerExpired {
        /// The peer.
        peer: K,
    },
}

/// One datagram to send: the shim, and the segment of `token` behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit<K, T> {
    /// Destination.
    pub peer: K,
    /// `Some`: build this token's segment (from its registered buffer) after
    /// the shim; `None`: a control datagram (shim and CRC only).
    pub token: Option<T>,
    /// The shim to put in front.
    pub shim: RdShimRepr,
    /// The token was sent before (statistics only).
    pub retransmission: bool,
}

/// Counters since the endpoint was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdStats {
    /// Shims handled.
    pub received: u64,
    /// Segments delivered to the layer above.
    pub delivered: u64,
    /// Duplicate data datagrams.
    pub duplicates: u64,
    /// Out-of-order data datagrams dropped.
    pub out_of_order: u64,
    /// Data datagrams of an older session dropped.
    pub stale_epoch: u64,
    /// Data datagrams without a session dropped (reset sent).
    pub no_session: u64,
    /// ACKs ignored (other epoch, or beyond what was sent).
    pub stale_acks: u64,
    /// Datagrams for another QP.
    pub wrong_qp: u64,
    /// New peers refused because the table was full.
    pub table_full: u64,
    /// Stateless replies dropped because the control queue was full.
    pub control_overflow: u64,
    /// Data datagrams sent for the first time.
    pub data_sent: u64,
    /// Data datagrams re-sent.
    pub retransmitted: u64,
    /// Control datagrams sent (ACK-only, NAK, reset, probe).
    pub control_sent: u64,
    /// NAKs sent.
    pub naks_sent: u64,
    /// Resets sent.
    pub resets_sent: u64,
    /// Tokens acknowledged.
    pub acked: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// Go-back-N rewinds started by a NAK.
    pub fast_retransmits: u64,
    /// Sessions started by the sender side.
    pub tx_sessions: u64,
    /// Sessions started by peers.
    pub rx_sessions: u64,
    /// Resets of our current session honoured.
    pub resyncs: u64,
    /// Tokens the layer above dropped after a resync
    /// ([`RdEndpoint::discard_unsent`]).
    pub discarded: u64,
    /// Peer entries created.
    pub peers_created: u64,
    /// Peer entries removed for idleness.
    pub peers_expired: u64,
    /// Peers failed (retry limit).
    pub peers_failed: u64,
}

/// The RD reliability state of one local QP towards any number of peers.
#[derive(Debug)]
pub struct RdEndpoint<K: PeerKey, T: Copy> {
    cfg: RdConfig,
    rx_window: u16,
    peers: PeerTable<K, Peer<T>>,
    timers: BinaryHeap<Reverse<TimerEntry<K>>>,
    ready: VecDeque<K>,
    control: VecDeque<(K, RdShimRepr)>,
    events: VecDeque<Event<K, T>>,
    next_epoch: u32,
    next_id: u64,
    stats: RdStats,
}

impl<K: PeerKey, T: Copy> RdEndpoint<K, T> {
    /// An endpoint with no peers.
    pub fn new(cfg: RdConfig) -> Result<Self, RdConfigError> {
        cfg.validate()?;
        Ok(RdEndpoint {
            cfg,
            rx_window: cfg.rx_window,
            peers: PeerTable::new(),
            timers: BinaryHeap::new(),
            ready: VecDeque::new(),
            control: VecDeque::new(),
            events: VecDeque::new(),
            next_epoch: cfg.epoch_seed,
            next_id: 0,
            stats: RdStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RdConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> &RdStats {
        &self.stats
    }

    /// Peer entries held now.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Whether an entry for `peer` exists.
    pub fn has_peer(&self, peer: &K) -> bool {
        self.peers.contains_key(peer)
    }

    /// Distinct PSNs sent to `peer` and not yet acknowledged.
    pub fn unacked(&self, peer: &K) -> usize {
        self.peers
            .get(peer)
            .and_then(|p| p.tx.as_ref())
            .map_or(0, |t| t.high)
    }

    /// Tokens queued for `peer` (unacknowledged plus not yet sent).
    pub fn queued(&self, peer: &K) -> usize {
        self.peers
            .get(peer)
            .and_then(|p| p.tx.as_ref())
            .map_or(0, |t| t.queue.len())
    }

    /// The epoch of our current session towards `peer`.
    pub fn tx_epoch(&self, peer: &K) -> Option<u32> {
        self.peers.get(peer)?.tx.as_ref().map(|t| t.epoch)
    }

    /// The window we advertise.
    pub fn rx_window(&self) -> u16 {
        self.rx_window
    }

    /// Changes the window we advertise (for instance from the receive
    /// queue's free entries). Reopening from 0 sends a window update to the
    /// peers that were told 0.
    pub fn set_rx_window(&mut self, window: u16) {
        let reopen = self.rx_window == 0 && window > 0;
        self.rx_window = window;
        if reopen {
            let keys: Vec<K> = self
                .peers
                .iter()
                .filter(|(_, p)| p.told_zero)
                .map(|(k, _)| *k)
                .collect();
            for k in keys {
                if let Some(p) = self.peers.get_mut(&k) {
                    p.told_zero = false;
                    p.reply_due = true;
                }
                self.touch(k);
            }
        }
    }

    fn alloc_epoch(&mut self, floor: Option<u32>) -> u32 {
        let mut e = self.next_epoch;
        if let Some(f) = floor {
            if !seq_after(e, f) {
                e = f.wrapping_add(1);
            }
        }
        self.next_epoch = e.wrapping_add(1);
        e
    }

    fn create_peer(&mut self, key: K, now: Instant) -> bool {
        if self.peers.len() >= self.cfg.max_peers {
            self.stats.table_full += 1;
            return false;
        }
        self.next_id += 1;
        self.stats.peers_created += 1;
        self.peers.insert_new(
            key,
            Peer {
                id: self.next_id,
                tx: None,
                rx: None,
                peer_window: self.cfg.initial_peer_window,
                srtt: None,
                rttvar: Duration::ZERO,
                rto: self.cfg.rto_initial,
                last_activity: now,
                reply_due: false,
                told_zero: false,
                ready: false,
                timer_at: None,
                holds: VecDeque::new(),
            },
        );
        true
    }

    /// Drops from `peer`'s queue every token `keep` refuses, while the
    /// current session has sent no data datagram yet (right after
    /// [`Event::Resynced`], before the next [`RdEndpoint::poll_transmit`]):
    /// no PSN of the session is bound to a token then, so the tokens kept
    /// are simply numbered from 0 without the dropped ones. Each dropped
    /// token is reported as [`Event::Abandoned`] (oldest first); a report's
    /// hold on our ACK goes with its token. Returns the number dropped; 0
    /// (nothing changed) once the session has sent data.
    ///
    /// For the layer above: after a resync the peer has lost our old
    /// session, so the rest of a message it acknowledged in part, or a
    /// response to a request of its old incarnation, must not reach the
    /// new incarnation as if it were new.
    pub fn discard_unsent(&mut self, peer: &K, mut keep: impl FnMut(&T) -> bool) -> usize {
        let Some(p) = self.peers.get_mut(peer) else {
            return 0;
        };
        let Some(t) = p.tx.as_mut() else {
            return 0;
        };
        if !t.fresh || t.next != 0 {
            return 0;
        }
        let old = std::mem::take(&mut t.queue);
        let (old_high, old_urgent) = (t.high, t.urgent);
        let (mut high, mut urgent) = (0, 0);
        // Offsets dropped, ascending (a rare path: a peer restarted).
        let mut dropped: Vec<usize> = Vec::new();
        for (i, token) in old.into_iter().enumerate() {
            if keep(&token) {
                if i < old_high {
                    high += 1;
                } else if i < old_high + old_urgent {
                    urgent += 1;
                }
                t.queue.push_back(token);
            } else {
                dropped.push(i);
                self.events
                    .push_back(Event::Abandoned { peer: *peer, token });
            }
        }
        if dropped.is_empty() {
            return 0;
        }
        t.high = high;
        t.urgent = urgent;
        if t.queue.is_empty() {
            t.rto_at = None;
        }
        let base = t.base;
        p.holds.retain_mut(|h| {
            let Some(off) = h
                .pos
                .checked_sub(base)
                .and_then(|o| usize::try_from(o).ok())
            else {
                return true;
            };
            match dropped.binary_search(&off) {
                Ok(_) => false,
                Err(before) => {
                    h.pos -= before as u64;
                    true
                }
            }
        });
        let n = dropped.len();
        self.stats.discarded += n as u64;
        n
    }

    /// Gives up on `peer` now, as if its retry limit had passed (for
    /// instance when the layer above destroys the address handle): emits
    /// [`Event::PeerFailed`] and [`Event::Abandoned`] for its tokens, and
    /// drops the entry.
    pub fn abort_peer(&mut self, peer: K) {
        self.fail(peer);
        if self.peers.remove(&peer).is_some() {
            self.shrink();
        }
    }

    /// The next event, oldest first.
    pub fn poll_event(&mut self) -> Option<Event<K, T>> {
        let ev = self.events.pop_front();
        if ev.is_none() {
            shrink_drained(&mut self.events, self.peers.len());
        }
        ev
    }
}

#[cfg(test)]
mod tests;
