//! Receiving: acting on an arriving shim (data, ACK or NAK, window
//! update, reset) and telling the caller what to do with the datagram.
//!
//! Contract: every datagram gets a [`Verdict`]: deliver its segment (in
//! order; its one and only delivery), discard a duplicate, take a control
//! datagram's feedback, or drop it with a reason.

use super::*;

impl<K: PeerKey, T: Copy> RdEndpoint<K, T> {
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

    pub(super) fn queue_control(&mut self, peer: K, shim: RdShimRepr) {
        if self.control.len() >= self.cfg.max_control {
            self.stats.control_overflow += 1;
        } else {
            self.control.push_back((peer, shim));
        }
    }

    pub(super) fn queue_reset(&mut self, peer: K, epoch: u32, floor: u32) {
        let mut s = RdShimRepr::control(self.cfg.local_qpn, peer.qpn(), self.rx_window);
        s.feedback = Feedback::Reset { epoch, floor };
        self.queue_control(peer, s);
    }

    /// A datagram without an ACK: take its window (liveness for probes).
    pub(super) fn on_window(&mut self, peer: K, window: u16, now: Instant) {
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
    pub(super) fn after_window(p: &mut Peer<T>, cfg: &RdConfig, now: Instant) {
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
    pub(super) fn arm_probe(p: &mut Peer<T>, cfg: &RdConfig, now: Instant) {
        let limit = p.limit(cfg);
        let rto = p.backed_off_rto(cfg);
        if let Some(t) = p.tx.as_mut() {
            if t.high == 0 && !t.queue.is_empty() && limit == 0 && t.rto_at.is_none() {
                t.rto_at = Some(now + rto);
            }
        }
    }

    pub(super) fn on_ack(
        &mut self,
        peer: K,
        epoch: u32,
        psn: u32,
        nak: bool,
        window: u16,
        now: Instant,
    ) {
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

    pub(super) fn on_reset(&mut self, peer: K, epoch: u32, floor: u32) {
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

    pub(super) fn on_data(&mut self, peer: K, d: DataSeq, poll: bool, now: Instant) -> Verdict {
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
}
