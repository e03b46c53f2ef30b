//! The state the endpoint keeps per peer: the sender half (one session:
//! epoch, unacknowledged and queued tokens, RTT and RTO), the receiver
//! half (the expected sequence number, the held-back ACK), and what both
//! derive (window limit, the next deadline, the feedback to piggyback).
//!
//! Contract: a peer's entry answers every question the endpoint asks
//! about it without touching any other peer.

use super::*;

/// Sender half of a peer entry: one session.
#[derive(Debug)]
pub(super) struct Tx<T> {
    pub(super) epoch: u32,
    /// An ACK for `epoch` arrived: no more SYN.
    pub(super) confirmed: bool,
    /// PSN of `queue[0]`.
    pub(super) una: u32,
    /// Tokens from `una` on: sent or waiting.
    pub(super) queue: VecDeque<T>,
    /// Offset of the next token to (re)send.
    pub(super) next: usize,
    /// Offsets below `high` were sent at least once (= unacknowledged PSNs).
    pub(super) high: usize,
    /// Retransmission / probe timer.
    pub(super) rto_at: Option<Instant>,
    /// Expiries in a row without progress.
    pub(super) retries: u32,
    /// PSN timed for an RTT sample, and when it was sent.
    pub(super) sample: Option<(u32, Instant)>,
    /// Ack PSN of the last go-back-N rewind (one rewind per gap).
    pub(super) rewound_at: Option<u32>,
    /// A zero-window probe is to be sent.
    pub(super) probe_due: bool,
    /// Report tokens not yet sent (at offsets `high..high + urgent`); each
    /// may exceed the window once.
    pub(super) urgent: usize,
    /// Tokens acknowledged (drained from `queue`) in this session: the
    /// position of `queue[i]` is `base + i`.
    pub(super) base: u64,
    /// Last data datagram sent.
    pub(super) last_data: Instant,
    /// No data datagram went out in this session yet: its PSNs are not
    /// bound to tokens, so [`RdEndpoint::discard_unsent`] may drop some.
    pub(super) fresh: bool,
}

impl<T> Tx<T> {
    pub(super) fn new(epoch: u32, now: Instant) -> Self {
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
pub(super) struct Rx {
    pub(super) epoch: u32,
    pub(super) expected: u32,
    /// Deliveries since the last ACK sent.
    pub(super) unacked: u32,
    /// Delayed-ACK deadline.
    pub(super) ack_at: Option<Instant>,
    /// An ACK is owed now.
    pub(super) ack_now: bool,
    /// The next ACK carries N.
    pub(super) nak_pending: bool,
    /// Expected PSN a NAK was sent for.
    pub(super) nak_sent_for: Option<u32>,
    /// A duplicate got its immediate ACK since the last delivery (later
    /// duplicates of the same go-back-N burst wait for the ACK timer).
    pub(super) dup_acked: bool,
}

impl Rx {
    pub(super) fn new(epoch: u32) -> Rx {
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
pub(super) struct Hold {
    /// The peer's session (our receive side) it applies to.
    pub(super) rx_epoch: u32,
    /// The PSN of the reported datagram: ACKs subject to the hold name it
    /// as the next expected.
    pub(super) cap: u32,
    /// Position of the report token in our queue (see `Tx::base`).
    pub(super) pos: u64,
}

#[derive(Debug)]
pub(super) struct Peer<T> {
    pub(super) id: u64,
    pub(super) tx: Option<Tx<T>>,
    pub(super) rx: Option<Rx>,
    /// The peer's advertised window.
    pub(super) peer_window: u16,
    pub(super) srtt: Option<Duration>,
    pub(super) rttvar: Duration,
    /// RTO from the RTT estimate, before backoff.
    pub(super) rto: Duration,
    pub(super) last_activity: Instant,
    /// A control datagram is owed (probe answer, window update).
    pub(super) reply_due: bool,
    /// We last advertised window 0 to it.
    pub(super) told_zero: bool,
    /// In the ready queue.
    pub(super) ready: bool,
    /// Deadline registered in the timer heap.
    pub(super) timer_at: Option<Instant>,
    /// Unacknowledged reports, oldest first.
    pub(super) holds: VecDeque<Hold>,
}

impl<T: Copy> Peer<T> {
    pub(super) fn limit(&self, cfg: &RdConfig) -> usize {
        usize::from(cfg.tx_window.min(self.peer_window))
    }

    /// A token can go out: a re-send of one already sent (admitted by an
    /// earlier window, so a shrinking window cannot strand it), or a new one
    /// within the window.
    pub(super) fn can_send_data(&self, cfg: &RdConfig) -> bool {
        self.tx.as_ref().is_some_and(|t| {
            t.next < t.queue.len() && (t.next < t.high || t.next < self.limit(cfg) || t.urgent > 0)
        })
    }

    /// The queue offset of the latest report, if one holds back the ACK of
    /// the peer's current session and was sent already.
    pub(super) fn report_carrier(&self) -> Option<usize> {
        let (r, t) = (self.rx?, self.tx.as_ref()?);
        let h = self.holds.iter().rev().find(|h| h.rx_epoch == r.epoch)?;
        let off = usize::try_from(h.pos.checked_sub(t.base)?).ok()?;
        (off < t.high && off < t.queue.len()).then_some(off)
    }

    pub(super) fn owes_control(&self) -> bool {
        self.reply_due
            || self.rx.is_some_and(|r| r.ack_now)
            || self.tx.as_ref().is_some_and(|t| t.probe_due)
    }

    pub(super) fn has_work(&self, cfg: &RdConfig) -> bool {
        self.can_send_data(cfg) || self.owes_control()
    }

    pub(super) fn quiescent(&self) -> bool {
        self.tx.as_ref().is_none_or(|t| t.queue.is_empty())
            && self.rx.is_none_or(|r| !r.ack_now && r.ack_at.is_none())
            && !self.reply_due
            && !self.ready
    }

    pub(super) fn deadline(&self, cfg: &RdConfig) -> Option<Instant> {
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
    pub(super) fn backed_off_rto(&self, cfg: &RdConfig) -> Duration {
        let retries = self.tx.as_ref().map_or(0, |t| t.retries).min(20);
        self.rto.saturating_mul(1 << retries).min(cfg.rto_max)
    }

    pub(super) fn update_rtt(&mut self, r: Duration, cfg: &RdConfig) {
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
    pub(super) fn take_feedback(&mut self, stats: &mut RdStats, pos: Option<u64>) -> Feedback {
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
