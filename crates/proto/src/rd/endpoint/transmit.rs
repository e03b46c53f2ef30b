//! Sending: queueing tokens for a peer (data, or a report that must go
//! out at once), and building the next datagram's shim: data with the
//! feedback piggybacked, or control (ACK, NAK, reset).
//!
//! Contract: queued control datagrams go first; then the peers with work
//! take turns, one datagram each, none with more data unacknowledged
//! than its window allows.

use super::*;

impl<K: PeerKey, T: Copy> RdEndpoint<K, T> {
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

    pub(super) fn enqueue(
        &mut self,
        peer: K,
        token: T,
        now: Instant,
        urgent: bool,
    ) -> Result<(), SendError> {
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

    pub(super) fn build(
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
}
