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

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

use softrdma_wire::rd::{DataSeq, Feedback, RdShimRepr, MAX_QPN};

use crate::peers::PeerTable;
use crate::wr::DgramAddr;

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

/// Sender half of a peer entry: one session.
#[derive(Debug)]
struct Tx<T> {
    epoch: u32,
    /// An ACK for `epoch` arrived: no more SYN.
    confirmed: bool,
    /// PSN of `queue[0]`.
    una: u32,
    /// Tokens from `una` on: sent or waiting.
    queue: VecDeque<T>,
    /// Offset of the next token to (re)send.
    next: usize,
    /// Offsets below `high` were sent at least once (= unacknowledged PSNs).
    high: usize,
    /// Retransmission / probe timer.
    rto_at: Option<Instant>,
    /// Expiries in a row without progress.
    retries: u32,
    /// PSN timed for an RTT sample, and when it was sent.
    sample: Option<(u32, Instant)>,
    /// Ack PSN of the last go-back-N rewind (one rewind per gap).
    rewound_at: Option<u32>,
    /// A zero-window probe is to be sent.
    probe_due: bool,
    /// Report tokens not yet sent (at offsets `high..high + urgent`); each
    /// may exceed the window once.
    urgent: usize,
    /// Tokens acknowledged (drained from `queue`) in this session: the
    /// position of `queue[i]` is `base + i`.
    base: u64,
    /// Last data datagram sent.
    last_data: Instant,
    /// No data datagram went out in this session yet: its PSNs are not
    /// bound to tokens, so [`RdEndpoint::discard_unsent`] may drop some.
    fresh: bool,
}

impl<T> Tx<T> {
    fn new(epoch: u32, now: Instant) -> Self {
        Tx {
            epoch,
            confirmed: false,
            una: 0,
            queue: VecDeque::new(),
            next: 0,
            high: 0,
            rto_at: None,
            retries: 0,
            sample: None,
            rewound_at: None,
            probe_due: false,
            urgent: 0,
            base: 0,
            last_data: now,
            fresh: true,
        }
    }
}

/// Receiver half of a peer entry: the peer's session.
#[derive(Debug, Clone, Copy)]
struct Rx {
    epoch: u32,
    expected: u32,
    /// Deliveries since the last ACK sent.
    unacked: u32,
    /// Delayed-ACK deadline.
    ack_at: Option<Instant>,
    /// An ACK is owed now.
    ack_now: bool,
    /// The next ACK carries N.
    nak_pending: bool,
    /// Expected PSN a NAK was sent for.
    nak_sent_for: Option<u32>,
    /// A duplicate got its immediate ACK since the last delivery (later
    /// duplicates of the same go-back-N burst wait for the ACK timer).
    dup_acked: bool,
}

impl Rx {
    fn new(epoch: u32) -> Rx {
        Rx {
            epoch,
            expected: 0,
            unacked: 0,
            ack_at: None,
            ack_now: false,
            nak_pending: false,
            nak_sent_for: None,
            dup_acked: false,
        }
    }
}

/// A report's hold on our ACK of the peer's session
/// ([`RdEndpoint::send_report`]).
#[derive(Debug, Clone, Copy)]
struct Hold {
    /// The peer's session (our receive side) it applies to.
    rx_epoch: u32,
    /// The PSN of the reported datagram: ACKs subject to the hold name it
    /// as the next expected.
    cap: u32,
    /// Position of the report token in our queue (see `Tx::base`).
    pos: u64,
}

#[derive(Debug)]
struct Peer<T> {
    id: u64,
    tx: Option<Tx<T>>,
    rx: Option<Rx>,
    /// The peer's advertised window.
    peer_window: u16,
    srtt: Option<Duration>,
    rttvar: Duration,
    /// RTO from the RTT estimate, before backoff.
    rto: Duration,
    last_activity: Instant,
    /// A control datagram is owed (probe answer, window update).
    reply_due: bool,
    /// We last advertised window 0 to it.
    told_zero: bool,
    /// In the ready queue.
    ready: bool,
    /// Deadline registered in the timer heap.
    timer_at: Option<Instant>,
    /// Unacknowledged reports, oldest first.
    holds: VecDeque<Hold>,
}

impl<T: Copy> Peer<T> {
    fn limit(&self, cfg: &RdConfig) -> usize {
        usize::from(cfg.tx_window.min(self.peer_window))
    }

    /// A token can go out: a re-send of one already sent (admitted by an
    /// earlier window, so a shrinking window cannot strand it), or a new one
    /// within the window.
    fn can_send_data(&self, cfg: &RdConfig) -> bool {
        self.tx.as_ref().is_some_and(|t| {
            t.next < t.queue.len() && (t.next < t.high || t.next < self.limit(cfg) || t.urgent > 0)
        })
    }

    /// The queue offset of the latest report, if one holds back the ACK of
    /// the peer's current session and was sent already.
    fn report_carrier(&self) -> Option<usize> {
        let (r, t) = (self.rx?, self.tx.as_ref()?);
        let h = self.holds.iter().rev().find(|h| h.rx_epoch == r.epoch)?;
        let off = usize::try_from(h.pos.checked_sub(t.base)?).ok()?;
        (off < t.high && off < t.queue.len()).then_some(off)
    }

    fn owes_control(&self) -> bool {
        self.reply_due
            || self.rx.is_some_and(|r| r.ack_now)
            || self.tx.as_ref().is_some_and(|t| t.probe_due)
    }

    fn has_work(&self, cfg: &RdConfig) -> bool {
        self.can_send_data(cfg) || self.owes_control()
    }

    fn quiescent(&self) -> bool {
        self.tx.as_ref().is_none_or(|t| t.queue.is_empty())
            && self.rx.is_none_or(|r| !r.ack_now && r.ack_at.is_none())
            && !self.reply_due
            && !self.ready
    }

    fn deadline(&self, cfg: &RdConfig) -> Option<Instant> {
        let mut d = self.rx.and_then(|r| r.ack_at);
        if let Some(t) = self.tx.as_ref().and_then(|t| t.rto_at) {
            d = Some(d.map_or(t, |d| d.min(t)));
        }
        if self.quiescent() {
            let idle = self.last_activity + cfg.idle_timeout;
            d = Some(d.map_or(idle, |d| d.min(idle)));
        }
        d
    }

    /// The RTO with backoff: doubled for each expiry since the last
    /// progress (the retry count), capped at `rto_max`. Progress (an ACK that
    /// advances) ends the backoff, even without an RTT sample under Karn's
    /// rule, since it proves the path works.
    fn backed_off_rto(&self, cfg: &RdConfig) -> Duration {
        let retries = self.tx.as_ref().map_or(0, |t| t.retries).min(20);
        self.rto.saturating_mul(1 << retries).min(cfg.rto_max)
    }

    fn update_rtt(&mut self, r: Duration, cfg: &RdConfig) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let d = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + d) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
        let s = self.srtt.unwrap_or(r);
        let var = (self.rttvar * 4).max(Duration::from_micros(1));
        self.rto = (s + var).clamp(cfg.rto_min, cfg.rto_max);
    }

    /// The feedback for the next datagram to this peer, a data datagram
    /// carrying the token at position `pos` or a control datagram (`None`);
    /// clears what it owes. A report's hold caps the ACK on control
    /// datagrams and on data datagrams before the report.
    fn take_feedback(&mut self, stats: &mut RdStats, pos: Option<u64>) -> Feedback {
        let cap = self.rx.and_then(|r| {
            self.holds
                .iter()
                .find(|h| h.rx_epoch == r.epoch && pos.is_none_or(|x| h.pos > x))
                .map(|h| h.cap)
        });
        match self.rx.as_mut() {
            None => Feedback::None,
            Some(r) => {
                let nak = r.nak_pending;
                if nak {
                    stats.naks_sent += 1;
                }
                r.nak_pending = false;
                r.ack_now = false;
                r.ack_at = None;
                r.unacked = 0;
                Feedback::Ack {
                    epoch: r.epoch,
                    psn: cap.unwrap_or(r.expected),
                    nak,
                }
            }
        }
    }
}

/// A timer heap entry; ordered by time, then by peer id.
#[derive(Debug, Clone, Copy)]
struct TimerEntry<K> {
    at: Instant,
    id: u64,
    key: K,
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

    /// Queues `token` for `peer`. Creates the peer entry and, when needed, a
    /// new session (see the module documentation).
    pub fn send(&mut self, peer: K, token: T, now: Instant) -> Result<(), SendError> {
        self.enqueue(peer, token, now, false)
    }

    /// Queues `token` as a *report* about the datagram just delivered from
    /// `peer` (an error the layer above must tell the peer about before the
    /// peer may count that datagram as acknowledged):
    ///
    /// * it goes out before every token not yet sent, and even when the
    ///   window is full (each report may exceed it by one datagram);
    ///   [`RdConfig::max_queue`] does not apply, the caller bounds reports;
    /// * until it is acknowledged, the ACK covering the reported datagram
    ///   rides only on data datagrams at or after the report: control
    ///   datagrams and re-sent earlier datagrams name the reported PSN as
    ///   the next expected. A peer that processes segments before the ACK
    ///   they carry, and that waits until it has *delivered* up to a data
    ///   datagram whose ACK it used, always sees the report first.
    ///
    /// Without a session from `peer` it is queued the same way, with no
    /// hold.
    pub fn send_report(&mut self, peer: K, token: T, now: Instant) -> Result<(), SendError> {
        let rx = self
            .peers
            .get(&peer)
            .and_then(|p| p.rx)
            .map(|r| (r.epoch, r.expected.wrapping_sub(1)));
        self.enqueue(peer, token, now, true)?;
        let Some(p) = self.peers.get_mut(&peer) else {
            return Ok(());
        };
        if let (Some((rx_epoch, cap)), Some(t)) = (rx, p.tx.as_ref()) {
            let pos = t.base + (t.high + t.urgent - 1) as u64;
            p.holds.push_back(Hold { rx_epoch, cap, pos });
        }
        Ok(())
    }

    fn enqueue(&mut self, peer: K, token: T, now: Instant, urgent: bool) -> Result<(), SendError> {
        if !self.peers.contains_key(&peer) && !self.create_peer(peer, now) {
            return Err(SendError::TableFull);
        }
        let half_idle = self.cfg.idle_timeout / 2;
        let needs_session = match self.peers.get(&peer).and_then(|p| p.tx.as_ref()) {
            None => true,
            Some(t) => {
                t.queue.is_empty() && now.saturating_duration_since(t.last_data) >= half_idle
            }
        };
        if needs_session {
            let e = self.alloc_epoch(None);
            self.stats.tx_sessions += 1;
            if let Some(p) = self.peers.get_mut(&peer) {
                p.tx = Some(Tx::new(e, now));
                p.holds.clear();
            }
        }
        let max_queue = self.cfg.max_queue;
        let Some(p) = self.peers.get_mut(&peer) else {
            return Err(SendError::TableFull);
        };
        let Some(tx) = p.tx.as_mut() else {
            return Err(SendError::TableFull);
        };
        if urgent {
            tx.queue.insert(tx.high + tx.urgent, token);
            tx.urgent += 1;
        } else if tx.queue.len() >= max_queue {
            return Err(SendError::QueueFull);
        } else {
            tx.queue.push_back(token);
        }
        p.last_activity = now;
        Self::arm_probe(p, &self.cfg, now);
        self.touch(peer);
        Ok(())
    }

    /// Processes the shim of a datagram from `peer` that passed the CRC
    /// check (`softrdma_wire::rd::split`). ACK, NAK, reset and window are
    /// taken in whatever the verdict on the data part.
    pub fn handle_datagram(&mut self, peer: K, shim: &RdShimRepr, now: Instant) -> Verdict {
        self.stats.received += 1;
        if shim.dst_qpn != self.cfg.local_qpn {
            self.stats.wrong_qp += 1;
            return Verdict::Drop(DropReason::WrongQp);
        }
        if !self.peers.contains_key(&peer) {
            match shim.data {
                Some(d) if d.syn => {
                    if !self.create_peer(peer, now) {
                        return Verdict::Drop(DropReason::TableFull);
                    }
                }
                Some(d) => {
                    self.stats.no_session += 1;
                    self.queue_reset(peer, d.epoch, d.epoch);
                    return Verdict::Drop(DropReason::NoSession);
                }
                None => {
                    if shim.poll {
                        let s = RdShimRepr::control(self.cfg.local_qpn, peer.qpn(), self.rx_window);
                        self.queue_control(peer, s);
                    }
                    return Verdict::Control;
                }
            }
        }
        if let Some(p) = self.peers.get_mut(&peer) {
            p.last_activity = now;
        }
        match shim.feedback {
            Feedback::None => self.on_window(peer, shim.window, now),
            Feedback::Ack { epoch, psn, nak } => {
                self.on_ack(peer, epoch, psn, nak, shim.window, now)
            }
            Feedback::Reset { epoch, floor } => {
                self.on_reset(peer, epoch, floor);
                self.on_window(peer, shim.window, now);
            }
        }
        let verdict = match shim.data {
            None => {
                if shim.poll {
                    if let Some(p) = self.peers.get_mut(&peer) {
                        p.reply_due = true;
                    }
                }
                Verdict::Control
            }
            Some(d) => self.on_data(peer, d, shim.poll, now),
        };
        self.touch(peer);
        verdict
    }

    fn queue_control(&mut self, peer: K, shim: RdShimRepr) {
        if self.control.len() >= self.cfg.max_control {
            self.stats.control_overflow += 1;
        } else {
            self.control.push_back((peer, shim));
        }
    }

    fn queue_reset(&mut self, peer: K, epoch: u32, floor: u32) {
        let mut s = RdShimRepr::control(self.cfg.local_qpn, peer.qpn(), self.rx_window);
        s.feedback = Feedback::Reset { epoch, floor };
        self.queue_control(peer, s);
    }

    /// A datagram without an ACK: take its window (liveness for probes).
    fn on_window(&mut self, peer: K, window: u16, now: Instant) {
        let cfg = self.cfg;
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        p.peer_window = window;
        Self::after_window(p, &cfg, now);
    }

    /// After a datagram from the peer: with nothing outstanding, the peer is
    /// alive (probe retries reset) and the timer only runs to probe a zero
    /// window.
    fn after_window(p: &mut Peer<T>, cfg: &RdConfig, now: Instant) {
        if let Some(t) = p.tx.as_mut() {
            if t.high == 0 {
                t.retries = 0;
                t.probe_due = false;
                t.rto_at = None;
            }
        }
        Self::arm_probe(p, cfg, now);
    }

    /// Starts the probe timer if tokens wait behind a zero window.
    fn arm_probe(p: &mut Peer<T>, cfg: &RdConfig, now: Instant) {
        let limit = p.limit(cfg);
        let rto = p.backed_off_rto(cfg);
        if let Some(t) = p.tx.as_mut() {
            if t.high == 0 && !t.queue.is_empty() && limit == 0 && t.rto_at.is_none() {
                t.rto_at = Some(now + rto);
            }
        }
    }

    fn on_ack(&mut self, peer: K, epoch: u32, psn: u32, nak: bool, window: u16, now: Instant) {
        let cfg = self.cfg;
        let Self {
            peers,
            events,
            stats,
            ..
        } = self;
        let Some(p) = peers.get_mut(&peer) else {
            return;
        };
        let Some(t) = p.tx.as_mut() else {
            stats.stale_acks += 1;
            p.peer_window = window;
            return;
        };
        let adv = psn.wrapping_sub(t.una) as i32;
        if t.epoch != epoch || adv < 0 || adv as usize > t.high {
            stats.stale_acks += 1;
            return;
        }
        t.confirmed = true;
        let n = adv as usize;
        let mut sample = None;
        if n > 0 {
            for token in t.queue.drain(..n) {
                events.push_back(Event::Acked { peer, token });
            }
            stats.acked += n as u64;
            t.base += n as u64;
            let base = t.base;
            p.holds.retain(|h| h.pos >= base);
            t.una = psn;
            t.next = t.next.saturating_sub(n);
            t.high -= n;
            t.retries = 0;
            t.rewound_at = None;
            if let Some((s, at)) = t.sample {
                if !seq_after(s, psn.wrapping_sub(1)) {
                    sample = Some(now.saturating_duration_since(at));
                    t.sample = None;
                }
            }
        }
        if nak && t.high > 0 && t.rewound_at != Some(psn) {
            t.next = 0;
            t.rewound_at = Some(psn);
            t.sample = None;
            stats.fast_retransmits += 1;
        }
        if let Some(r) = sample {
            p.update_rtt(r, &cfg);
        }
        p.peer_window = window;
        let rto = p.backed_off_rto(&cfg);
        if let Some(t) = p.tx.as_mut() {
            if n > 0 {
                t.rto_at = (t.high > 0).then_some(now + rto);
            }
        }
        Self::after_window(p, &cfg, now);
    }

    fn on_reset(&mut self, peer: K, epoch: u32, floor: u32) {
        let current = self
            .peers
            .get(&peer)
            .and_then(|p| p.tx.as_ref())
            .map(|t| t.epoch);
        if current != Some(epoch) {
            self.stats.stale_acks += 1;
            return;
        }
        let e = self.alloc_epoch(Some(floor));
        self.stats.resyncs += 1;
        self.stats.tx_sessions += 1;
        let Some(t) = self.peers.get_mut(&peer).and_then(|p| p.tx.as_mut()) else {
            return;
        };
        t.epoch = e;
        t.confirmed = false;
        t.una = 0;
        t.next = 0;
        t.rto_at = None;
        t.retries = 0;
        t.sample = None;
        t.rewound_at = None;
        t.fresh = true;
        let resent = t.queue.len();
        if resent > 0 {
            self.events.push_back(Event::Resynced { peer, resent });
        }
    }

    fn on_data(&mut self, peer: K, d: DataSeq, poll: bool, now: Instant) -> Verdict {
        let cfg = self.cfg;
        let Some(p) = self.peers.get_mut(&peer) else {
            return Verdict::Drop(DropReason::TableFull);
        };
        match p.rx {
            Some(r) if r.epoch == d.epoch => {}
            Some(r) if d.syn && seq_after(d.epoch, r.epoch) => {
                p.rx = Some(Rx::new(d.epoch));
                p.holds.clear();
                self.stats.rx_sessions += 1;
                self.events.push_back(Event::SessionStarted {
                    peer,
                    replaced: true,
                });
            }
            None if d.syn => {
                p.rx = Some(Rx::new(d.epoch));
                self.stats.rx_sessions += 1;
                self.events.push_back(Event::SessionStarted {
                    peer,
                    replaced: false,
                });
            }
            Some(r) => {
                let stale = seq_after(r.epoch, d.epoch);
                if stale {
                    self.stats.stale_epoch += 1;
                } else {
                    self.stats.no_session += 1;
                }
                self.queue_reset(peer, d.epoch, r.epoch);
                return Verdict::Drop(if stale {
                    DropReason::StaleEpoch
                } else {
                    DropReason::NoSession
                });
            }
            None => {
                self.stats.no_session += 1;
                self.queue_reset(peer, d.epoch, d.epoch);
                return Verdict::Drop(DropReason::NoSession);
            }
        }
        let Some(r) = p.rx.as_mut() else {
            return Verdict::Drop(DropReason::NoSession);
        };
        let diff = d.psn.wrapping_sub(r.expected) as i32;
        match diff.cmp(&0) {
            Ordering::Equal => {
                r.expected = r.expected.wrapping_add(1);
                r.unacked += 1;
                r.dup_acked = false;
                if poll || r.unacked >= cfg.ack_every {
                    r.ack_now = true;
                    r.ack_at = None;
                } else if r.ack_at.is_none() {
                    r.ack_at = Some(now + cfg.ack_delay);
                }
                self.stats.delivered += 1;
                Verdict::Deliver
            }
            Ordering::Less => {
                if poll || !r.dup_acked {
                    r.ack_now = true;
                    r.ack_at = None;
                    r.dup_acked = true;
                } else if !r.ack_now && r.ack_at.is_none() {
                    r.ack_at = Some(now + cfg.ack_delay);
                }
                self.stats.duplicates += 1;
                Verdict::Duplicate
            }
            Ordering::Greater => {
                if r.nak_sent_for != Some(r.expected) {
                    r.nak_sent_for = Some(r.expected);
                    r.nak_pending = true;
                    r.ack_now = true;
                } else if poll {
                    r.ack_now = true;
                }
                self.stats.out_of_order += 1;
                Verdict::Drop(DropReason::OutOfOrder)
            }
        }
    }

    /// The next datagram to send, if any: stateless replies first, then the
    /// peers with work in round-robin order, one datagram each turn. Data
    /// datagrams carry the peer's ACK; a control datagram goes out only
    /// when something is owed and no data can be sent.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Transmit<K, T>> {
        let control = self.control.pop_front();
        if control.is_none() {
            shrink_drained(&mut self.control, self.peers.len());
        }
        if let Some((peer, shim)) = control {
            self.stats.control_sent += 1;
            if matches!(shim.feedback, Feedback::Reset { .. }) {
                self.stats.resets_sent += 1;
            }
            return Some(Transmit {
                peer,
                token: None,
                shim,
                retransmission: false,
            });
        }
        while let Some(key) = self.ready.pop_front() {
            let Some(p) = self.peers.get_mut(&key) else {
                continue;
            };
            p.ready = false;
            let out = Self::build(key, p, &self.cfg, self.rx_window, &mut self.stats, now);
            self.touch(key);
            if out.is_some() {
                return out;
            }
        }
        None
    }

    fn build(
        key: K,
        p: &mut Peer<T>,
        cfg: &RdConfig,
        window: u16,
        stats: &mut RdStats,
        now: Instant,
    ) -> Option<Transmit<K, T>> {
        let limit = p.limit(cfg);
        let rto = p.backed_off_rto(cfg);
        let mut shim = RdShimRepr::control(cfg.local_qpn, key.qpn(), window);
        let mut token = None;
        let mut retransmission = false;
        let mut pos = None;
        if p.can_send_data(cfg) {
            let t = p.tx.as_mut()?;
            let off = t.next;
            let psn = t.una.wrapping_add(off as u32);
            retransmission = off < t.high;
            if !retransmission && t.urgent > 0 {
                t.urgent -= 1;
            }
            pos = Some(t.base + off as u64);
            token = Some(t.queue[off]);
            t.next += 1;
            t.high = t.high.max(t.next);
            if !retransmission && t.sample.is_none() {
                t.sample = Some((psn, now));
            }
            if t.rto_at.is_none() {
                t.rto_at = Some(now + rto);
            }
            t.last_data = now;
            t.probe_due = false;
            t.fresh = false;
            shim.data = Some(DataSeq {
                epoch: t.epoch,
                psn,
                syn: !t.confirmed,
            });
            shim.poll = t.next >= t.queue.len() || t.next >= limit;
            if retransmission {
                stats.retransmitted += 1;
            } else {
                stats.data_sent += 1;
            }
        } else if p.owes_control() {
            let carrier = p.report_carrier();
            if let Some(t) = p.tx.as_mut() {
                shim.poll = t.probe_due;
                t.probe_due = false;
                // An ACK a report holds back on control datagrams rides in
                // full on that report, sent again.
                if let Some(off) = carrier {
                    t.fresh = false;
                    pos = Some(t.base + off as u64);
                    token = Some(t.queue[off]);
                    retransmission = true;
                    shim.data = Some(DataSeq {
                        epoch: t.epoch,
                        psn: t.una.wrapping_add(off as u32),
                        syn: !t.confirmed,
                    });
                }
            }
            p.reply_due = false;
            if carrier.is_some() {
                stats.retransmitted += 1;
            } else {
                stats.control_sent += 1;
            }
        } else {
            return None;
        }
        shim.feedback = p.take_feedback(stats, pos);
        p.told_zero = window == 0;
        p.last_activity = now;
        Some(Transmit {
            peer: key,
            token,
            shim,
            retransmission,
        })
    }

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

    fn fire(&mut self, key: K, now: Instant) {
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

    fn fail(&mut self, key: K) {
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

    /// Re-registers the peer's deadline and ready state after a change.
    fn touch(&mut self, key: K) {
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

    fn compact_timers(&mut self) {
        let peers = &self.peers;
        self.timers.retain(|Reverse(e)| {
            peers
                .get(&e.key)
                .is_some_and(|p| p.id == e.id && p.timer_at == Some(e.at))
        });
    }

    fn shrink(&mut self) {
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
const QUEUE_FLOOR: usize = 1024;

/// Gives back the memory of an empty queue that a burst (every peer
/// expiring at once, a wave of resets) grew far beyond what the peers now
/// held need, so idle memory follows the peer count and not its peak.
fn shrink_drained<X>(q: &mut VecDeque<X>, peers: usize) {
    let keep = QUEUE_FLOOR + 2 * peers;
    if q.is_empty() && q.capacity() > 2 * keep {
        q.shrink_to(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    struct P(u32);
    impl PeerKey for P {
        fn qpn(&self) -> u32 {
            self.0
        }
    }

    const A: P = P(0x100);
    const B: P = P(0x200);

    fn cfg(local: u32) -> RdConfig {
        RdConfig {
            local_qpn: local,
            epoch_seed: local * 1000,
            ..RdConfig::default()
        }
    }

    fn ep(local: u32) -> RdEndpoint<P, u32> {
        RdEndpoint::new(cfg(local)).unwrap()
    }

    fn drain(e: &mut RdEndpoint<P, u32>, now: Instant) -> Vec<Transmit<P, u32>> {
        std::iter::from_fn(|| e.poll_transmit(now)).collect()
    }

    fn events(e: &mut RdEndpoint<P, u32>) -> Vec<Event<P, u32>> {
        std::iter::from_fn(|| e.poll_event()).collect()
    }

    #[test]
    fn config_rules() {
        let d = RdConfig::default();
        assert!(d.validate().is_ok());
        assert_eq!(d.give_up_span(), d.rto_max * (d.retry_limit + 1));
        let c = RdConfig {
            idle_timeout: Duration::from_secs(5),
            ..d
        };
        assert!(c.validate().is_err());
        let c = RdConfig {
            ack_delay: d.rto_min,
            ..d
        };
        assert!(c.validate().is_err());
        let c = RdConfig {
            local_qpn: MAX_QPN + 1,
            ..d
        };
        assert!(RdEndpoint::<P, u32>::new(c).is_err());
    }

    #[test]
    fn send_ack_piggyback_and_delayed_ack() {
        let t0 = Instant::now();
        let (mut a, mut b) = (ep(A.0), ep(B.0));
        a.send(B, 1, t0).unwrap();
        a.send(B, 2, t0).unwrap();
        let tx = drain(&mut a, t0);
        assert_eq!(tx.len(), 2);
        let d0 = tx[0].shim.data.unwrap();
        assert!(d0.syn);
        assert_eq!((d0.psn, tx[1].shim.data.unwrap().psn), (0, 1));
        assert_eq!((tx[0].shim.src_qpn, tx[0].shim.dst_qpn), (A.0, B.0));
        assert!(!tx[0].shim.poll && tx[1].shim.poll, "P on the tail");
        assert_eq!(tx[0].shim.feedback, Feedback::None);
        assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Deliver);
        assert_eq!(
            events(&mut b),
            [Event::SessionStarted {
                peer: A,
                replaced: false
            }]
        );
        // No ACK yet: delayed.
        assert!(drain(&mut b, t0).is_empty());
        assert_eq!(b.poll_timeout(), Some(t0 + cfg(0).ack_delay));
        // B has data for A: the ACK rides on it.
        b.send(A, 7, t0).unwrap();
        let back = drain(&mut b, t0);
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].token, Some(7));
        assert_eq!(
            back[0].shim.feedback,
            Feedback::Ack {
                epoch: d0.epoch,
                psn: 1,
                nak: false
            }
        );
        assert_eq!(a.handle_datagram(B, &back[0].shim, t0), Verdict::Deliver);
        let ev = events(&mut a);
        assert!(ev.contains(&Event::Acked { peer: B, token: 1 }));
        assert_eq!(a.unacked(&B), 1);
        // The second datagram had P: B acks at once (ACK-only).
        assert_eq!(b.handle_datagram(A, &tx[1].shim, t0), Verdict::Deliver);
        let ack = drain(&mut b, t0);
        assert_eq!(ack.len(), 1);
        assert_eq!(ack[0].token, None);
        a.handle_datagram(B, &ack[0].shim, t0);
        assert_eq!(events(&mut a), [Event::Acked { peer: B, token: 2 }]);
        assert_eq!(a.unacked(&B), 0);
        // A's next data datagram is no longer SYN and carries A's ACK of 7.
        a.send(B, 3, t0).unwrap();
        let tx = drain(&mut a, t0);
        let s = tx.iter().find(|t| t.token == Some(3)).unwrap().shim;
        assert!(!s.data.unwrap().syn);
        assert!(matches!(s.feedback, Feedback::Ack { psn: 1, .. }));
    }

    #[test]
    fn duplicate_and_out_of_order() {
        let t0 = Instant::now();
        let (mut a, mut b) = (ep(A.0), ep(B.0));
        for i in 0..4 {
            a.send(B, i, t0).unwrap();
        }
        let tx = drain(&mut a, t0);
        assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Deliver);
        assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Duplicate);
        assert_eq!(
            b.handle_datagram(A, &tx[2].shim, t0),
            Verdict::Drop(DropReason::OutOfOrder)
        );
        assert_eq!(
            b.handle_datagram(A, &tx[3].shim, t0),
            Verdict::Drop(DropReason::OutOfOrder)
        );
        let fb = drain(&mut b, t0);
        assert_eq!(fb.len(), 1, "one NAK per gap");
        assert_eq!(
            fb[0].shim.feedback,
            Feedback::Ack {
                epoch: tx[0].shim.data.unwrap().epoch,
                psn: 1,
                nak: true
            }
        );
        // The NAK rewinds A to PSN 1: 1, 2, 3 again, once.
        a.handle_datagram(B, &fb[0].shim, t0);
        a.handle_datagram(B, &fb[0].shim, t0);
        let re = drain(&mut a, t0);
        let psns: Vec<u32> = re
            .iter()
            .filter_map(|t| t.shim.data.map(|d| d.psn))
            .collect();
        assert_eq!(psns, [1, 2, 3]);
        assert!(re.iter().all(|t| t.retransmission));
        assert_eq!(a.stats().fast_retransmits, 1);
        for t in &re {
            assert_eq!(b.handle_datagram(A, &t.shim, t0), Verdict::Deliver);
        }
    }

    #[test]
    fn window_limits_unacked() {
        let t0 = Instant::now();
        let mut c = cfg(A.0);
        c.tx_window = 3;
        let mut a: RdEndpoint<P, u32> = RdEndpoint::new(c).unwrap();
        for i in 0..10 {
            a.send(B, i, t0).unwrap();
        }
        let tx = drain(&mut a, t0);
        assert_eq!(tx.len(), 3);
        assert!(tx[2].shim.poll, "P when the window fills");
        assert_eq!(a.unacked(&B), 3);
        // The peer's advertised window is the tighter limit.
        let mut ack = RdShimRepr::control(B.0, A.0, 1);
        ack.feedback = Feedback::Ack {
            epoch: tx[0].shim.data.unwrap().epoch,
            psn: 3,
            nak: false,
        };
        a.handle_datagram(B, &ack, t0);
        assert_eq!(drain(&mut a, t0).len(), 1);
        assert_eq!(a.unacked(&B), 1);
    }

    #[test]
    fn zero_window_probe_and_reopen() {
        let t0 = Instant::now();
        let (mut a, mut b) = (ep(A.0), ep(B.0));
        // A stateless probe answer carries the window too.
        let mut probe = RdShimRepr::control(A.0, B.0, 64);
        probe.poll = true;
        assert_eq!(b.handle_datagram(P(0x999), &probe, t0), Verdict::Control);
        assert_eq!(drain(&mut b, t0).len(), 1);
        // B delivers one token, then closes its window; its ACK says 0.
        a.send(B, 0, t0).unwrap();
        let tx = drain(&mut a, t0);
        assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Deliver);
        b.set_rx_window(0);
        let ack = drain(&mut b, t0);
        assert_eq!(ack[0].shim.window, 0);
        a.handle_datagram(B, &ack[0].shim, t0);
        a.send(B, 1, t0).unwrap();
        assert!(drain(&mut a, t0).is_empty(), "window 0: nothing sent");
        // The retransmission timer probes.
        let t1 = a.poll_timeout().unwrap();
        a.handle_timeout(t1);
        let p = drain(&mut a, t1);
        assert_eq!(p.len(), 1);
        assert!(p[0].shim.poll && p[0].token.is_none());
        // B answers (still 0): A keeps waiting without failing.
        assert_eq!(b.handle_datagram(A, &p[0].shim, t1), Verdict::Control);
        let ans = drain(&mut b, t1);
        assert_eq!(ans.len(), 1);
        a.handle_datagram(B, &ans[0].shim, t1);
        assert!(drain(&mut a, t1).is_empty());
        // B reopens: a window update goes to A at once, and A sends.
        b.set_rx_window(8);
        let upd = drain(&mut b, t1);
        assert_eq!(upd.len(), 1);
        assert_eq!(upd[0].shim.window, 8);
        a.handle_datagram(B, &upd[0].shim, t1);
        let d = drain(&mut a, t1);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].token, Some(1));
    }

    #[test]
    fn rto_backoff_then_failure_of_one_peer() {
        let t0 = Instant::now();
        let mut a = ep(A.0);
        let c = *a.config();
        a.send(B, 1, t0).unwrap();
        a.send(B, 2, t0).unwrap();
        a.send(P(0x300), 9, t0).unwrap();
        assert_eq!(drain(&mut a, t0).len(), 3);
        let mut now = t0;
        let mut gaps = Vec::new();
        let mut sent_b = 0;
        for _ in 0..=c.retry_limit {
            let t = a.poll_timeout().unwrap();
            gaps.push(t - now);
            now = t;
            a.handle_timeout(now);
            sent_b += drain(&mut a, now).iter().filter(|t| t.peer == B).count();
        }
        // Exponential backoff, capped.
        assert_eq!(gaps[0], c.rto_initial);
        assert_eq!(gaps[1], c.rto_initial * 2);
        assert!(gaps.iter().all(|g| *g <= c.rto_max));
        assert_eq!(sent_b, 2 * c.retry_limit as usize);
        let ev = events(&mut a);
        assert_eq!(
            ev.iter()
                .filter(|e| matches!(e, Event::PeerFailed { .. }))
                .count(),
            2
        );
        assert!(ev.contains(&Event::PeerFailed {
            peer: B,
            abandoned: 2
        }));
        let ab: Vec<_> = ev
            .iter()
            .filter_map(|e| match e {
                Event::Abandoned { peer: B, token } => Some(*token),
                _ => None,
            })
            .collect();
        assert_eq!(ab, [1, 2]);
        // A new token starts a new session.
        let old = a.stats().tx_sessions;
        a.send(B, 3, now).unwrap();
        assert_eq!(a.stats().tx_sessions, old + 1);
        assert!(drain(&mut a, now)[0].shim.data.unwrap().syn);
    }

    #[test]
    fn expiry_removes_quiescent_peers() {
        let t0 = Instant::now();
        let (mut a, mut b) = (ep(A.0), ep(B.0));
        a.send(B, 1, t0).unwrap();
        let tx = drain(&mut a, t0);
        b.handle_datagram(A, &tx[0].shim, t0);
        let ack = drain(&mut b, t0);
        a.handle_datagram(B, &ack[0].shim, t0);
        assert_eq!((a.peer_count(), b.peer_count()), (1, 1));
        let idle = a.config().idle_timeout;
        a.handle_timeout(t0 + idle);
        b.handle_timeout(t0 + idle);
        assert_eq!((a.peer_count(), b.peer_count()), (0, 0));
        assert!(events(&mut a).contains(&Event::PeerExpired { peer: B }));
        assert_eq!(a.poll_timeout(), None);
    }

    #[test]
    fn memory_follows_the_peers_after_mass_expiry() {
        const N: u32 = 5000;
        let t0 = Instant::now();
        let mut b = ep(B.0);
        for i in 0..N {
            let mut c = ep(0x1000 + i);
            c.send(B, i, t0).unwrap();
            for t in drain(&mut c, t0) {
                b.handle_datagram(P(0x1000 + i), &t.shim, t0);
            }
        }
        assert_eq!(b.peer_count(), N as usize);
        assert_eq!(drain(&mut b, t0).len(), N as usize, "one ACK each");
        events(&mut b);
        let mut now = t0;
        while let Some(d) = b.poll_timeout() {
            now = now.max(d);
            b.handle_timeout(now);
            drain(&mut b, now);
            events(&mut b);
        }
        assert_eq!(b.peer_count(), 0);
        assert_eq!(b.stats().peers_expired, u64::from(N));
        // Nothing sized for the peak remains.
        assert!(b.peers.capacity() <= 64, "peers {}", b.peers.capacity());
        assert!(b.timers.capacity() <= 64, "timers {}", b.timers.capacity());
        assert!(b.ready.capacity() <= 64, "ready {}", b.ready.capacity());
        assert!(b.events.capacity() <= 2 * QUEUE_FLOOR);
        assert!(b.control.capacity() <= 2 * QUEUE_FLOOR);
    }

    #[test]
    fn reset_renumbers_for_a_restarted_receiver() {
        let t0 = Instant::now();
        let (mut a, mut b) = (ep(A.0), ep(B.0));
        a.send(B, 1, t0).unwrap();
        let tx = drain(&mut a, t0);
        b.handle_datagram(A, &tx[0].shim, t0);
        let ack = drain(&mut b, t0);
        a.handle_datagram(B, &ack[0].shim, t0);
        assert_eq!(events(&mut a), [Event::Acked { peer: B, token: 1 }]);
        let e1 = a.tx_epoch(&B).unwrap();
        // B restarts; A's next datagram (no SYN) meets no session.
        let mut b = ep(B.0);
        a.send(B, 2, t0).unwrap();
        let tx = drain(&mut a, t0);
        assert!(!tx[0].shim.data.unwrap().syn);
        assert_eq!(
            b.handle_datagram(A, &tx[0].shim, t0),
            Verdict::Drop(DropReason::NoSession)
        );
        assert_eq!(b.peer_count(), 0, "a reset costs no state");
        let rst = drain(&mut b, t0);
        assert_eq!(
            rst[0].shim.feedback,
            Feedback::Reset {
                epoch: e1,
                floor: e1
            }
        );
        a.handle_datagram(B, &rst[0].shim, t0);
        assert_eq!(events(&mut a), [Event::Resynced { peer: B, resent: 1 }]);
        let tx = drain(&mut a, t0);
        let d = tx[0].shim.data.unwrap();
        assert!(d.syn && d.psn == 0 && seq_after(d.epoch, e1));
        assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Deliver);
        // A stale reset (old epoch) is ignored.
        a.handle_datagram(B, &rst[0].shim, t0);
        assert!(events(&mut a).is_empty());
    }

    #[test]
    fn discard_unsent_drops_tokens_only_before_the_new_session_sends() {
        let t0 = Instant::now();
        let (mut a, mut b) = (ep(A.0), ep(B.0));
        a.send(B, 1, t0).unwrap();
        let tx = drain(&mut a, t0);
        b.handle_datagram(A, &tx[0].shim, t0);
        let ack = drain(&mut b, t0);
        a.handle_datagram(B, &ack[0].shim, t0);
        events(&mut a);
        // Tokens 2..=5 go out in the old session; B restarts.
        for k in 2..=5 {
            a.send(B, k, t0).unwrap();
        }
        let tx = drain(&mut a, t0);
        assert_eq!(tx.len(), 4);
        assert_eq!(a.discard_unsent(&B, |_| false), 0, "the session sent data");
        let mut b = ep(B.0);
        b.handle_datagram(A, &tx[0].shim, t0);
        let rst = drain(&mut b, t0);
        a.handle_datagram(B, &rst[0].shim, t0);
        assert_eq!(events(&mut a), [Event::Resynced { peer: B, resent: 4 }]);
        // The layer above drops 2 and 4: they are abandoned, 3 and 5 go out
        // as PSN 0 and 1 of the new session.
        assert_eq!(a.discard_unsent(&B, |&t| t % 2 == 1), 2);
        assert_eq!(
            events(&mut a),
            [
                Event::Abandoned { peer: B, token: 2 },
                Event::Abandoned { peer: B, token: 4 }
            ]
        );
        assert_eq!((a.queued(&B), a.unacked(&B)), (2, 2));
        let tx = drain(&mut a, t0);
        let sent: Vec<_> = tx
            .iter()
            .map(|t| (t.token, t.shim.data.map(|d| (d.psn, d.syn))))
            .collect();
        assert_eq!(
            sent,
            [(Some(3), Some((0, true))), (Some(5), Some((1, true)))]
        );
        for t in &tx {
            assert_eq!(b.handle_datagram(A, &t.shim, t0), Verdict::Deliver);
        }
        assert_eq!(
            a.discard_unsent(&B, |_| false),
            0,
            "the new session sent data"
        );
        for t in drain(&mut b, t0) {
            a.handle_datagram(B, &t.shim, t0);
        }
        assert_eq!(
            events(&mut a),
            [
                Event::Acked { peer: B, token: 3 },
                Event::Acked { peer: B, token: 5 }
            ]
        );
        assert_eq!(a.stats().discarded, 2);
    }

    #[test]
    fn restarted_sender_with_older_epoch_jumps_the_floor() {
        let t0 = Instant::now();
        let (mut a, mut b) = (ep(A.0), ep(B.0));
        for i in 0..3 {
            a.send(B, i, t0).unwrap();
        }
        for t in drain(&mut a, t0) {
            assert_eq!(b.handle_datagram(A, &t.shim, t0), Verdict::Deliver);
        }
        let e1 = a.tx_epoch(&B).unwrap();
        // A restarts with a seed *below* its old epochs.
        let mut c = cfg(A.0);
        c.epoch_seed = e1.wrapping_sub(100);
        let mut a: RdEndpoint<P, u32> = RdEndpoint::new(c).unwrap();
        a.send(B, 10, t0).unwrap();
        let tx = drain(&mut a, t0);
        assert_eq!(
            b.handle_datagram(A, &tx[0].shim, t0),
            Verdict::Drop(DropReason::StaleEpoch)
        );
        let rst: Vec<_> = drain(&mut b, t0)
            .into_iter()
            .filter(|t| matches!(t.shim.feedback, Feedback::Reset { .. }))
            .collect();
        a.handle_datagram(B, &rst[0].shim, t0);
        let tx = drain(&mut a, t0);
        assert!(seq_after(tx[0].shim.data.unwrap().epoch, e1));
        assert_eq!(b.handle_datagram(A, &tx[0].shim, t0), Verdict::Deliver);
        assert!(events(&mut b).contains(&Event::SessionStarted {
            peer: A,
            replaced: true
        }));
    }

    #[test]
    fn stale_epoch_and_old_ack_do_nothing() {
        let t0 = Instant::now();
        let (mut a, mut b) = (ep(A.0), ep(B.0));
        a.send(B, 1, t0).unwrap();
        let old = drain(&mut a, t0);
        b.handle_datagram(A, &old[0].shim, t0);
        let ack = drain(&mut b, t0);
        a.handle_datagram(B, &ack[0].shim, t0);
        // A's session goes quiet for idle/2: the next token starts a new one.
        let later = t0 + a.config().idle_timeout / 2;
        a.send(B, 2, later).unwrap();
        let new = drain(&mut a, later);
        assert!(new[0].shim.data.unwrap().syn);
        assert_eq!(b.handle_datagram(A, &new[0].shim, later), Verdict::Deliver);
        // A delayed copy of the old session's datagram is stale, not delivered.
        assert_eq!(
            b.handle_datagram(A, &old[0].shim, later),
            Verdict::Drop(DropReason::StaleEpoch)
        );
        // The old ACK (old epoch) acknowledges nothing now.
        a.handle_datagram(B, &ack[0].shim, later);
        assert_eq!(a.unacked(&B), 1);
    }

    #[test]
    fn bounds() {
        let t0 = Instant::now();
        let mut c = cfg(A.0);
        c.max_peers = 2;
        c.max_queue = 2;
        c.max_control = 1;
        let mut a: RdEndpoint<P, u32> = RdEndpoint::new(c).unwrap();
        a.send(P(1), 0, t0).unwrap();
        a.send(P(1), 1, t0).unwrap();
        assert_eq!(a.send(P(1), 2, t0), Err(SendError::QueueFull));
        a.send(P(2), 0, t0).unwrap();
        assert_eq!(a.send(P(3), 0, t0), Err(SendError::TableFull));
        let mut syn = RdShimRepr::control(3, A.0, 8);
        syn.data = Some(DataSeq {
            epoch: 5,
            psn: 0,
            syn: true,
        });
        assert_eq!(
            a.handle_datagram(P(3), &syn, t0),
            Verdict::Drop(DropReason::TableFull)
        );
        // Resets to unknown peers are bounded too.
        syn.data = Some(DataSeq {
            epoch: 5,
            psn: 0,
            syn: false,
        });
        a.handle_datagram(P(4), &syn, t0);
        a.handle_datagram(P(5), &syn, t0);
        assert_eq!(a.stats().control_overflow, 1);
        syn.dst_qpn = 77;
        assert_eq!(
            a.handle_datagram(P(4), &syn, t0),
            Verdict::Drop(DropReason::WrongQp)
        );
        assert_eq!(a.stats().table_full, 2);
    }

    #[test]
    fn abort_peer_abandons_tokens() {
        let t0 = Instant::now();
        let mut a = ep(A.0);
        a.send(B, 1, t0).unwrap();
        a.send(B, 2, t0).unwrap();
        a.abort_peer(B);
        assert_eq!(a.peer_count(), 0);
        assert_eq!(
            events(&mut a),
            [
                Event::PeerFailed {
                    peer: B,
                    abandoned: 2
                },
                Event::Abandoned { peer: B, token: 1 },
                Event::Abandoned { peer: B, token: 2 }
            ]
        );
        assert!(drain(&mut a, t0).is_empty());
    }

    #[test]
    fn rtt_sets_rto() {
        let t0 = Instant::now();
        let (mut a, mut b) = (ep(A.0), ep(B.0));
        let rtt = Duration::from_millis(3);
        for i in 0..20u32 {
            let t = t0 + rtt * i;
            a.send(B, i, t).unwrap();
            for x in drain(&mut a, t) {
                b.handle_datagram(A, &x.shim, t);
            }
            for x in drain(&mut b, t + rtt) {
                a.handle_datagram(B, &x.shim, t + rtt);
            }
        }
        let p = a.peers.get(&B).unwrap();
        assert!(p.srtt.unwrap() == rtt);
        assert!(p.rto >= rtt && p.rto <= a.config().rto_initial);
    }
}
