//! Timers: invite retries, bind fallbacks, idle close, awaited
//! connections that never came, and the next deadline.
//!
//! Contract: [`DcTable::poll_timeout`] is the earliest deadline of any
//! entry; firing acts only on entries whose deadline has passed.

use super::*;

impl DcTable {
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
            self.resend_bind(id);
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
            self.expire(id, why);
        }
        self.admit_waiting(now);
    }

    /// Retransmits the Bind of reverse user `id` (over the connection it
    /// binds to, with the peer's nonce), if both are still there.
    fn resend_bind(&mut self, id: ConnId) {
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

    /// Removes connection `id` whose timer ran out, counting it and
    /// reporting it by `why`: 0 an invitation that timed out, 1 idle, 2 an
    /// awaited target connection that never came, 3 an Unbind the peer
    /// never answered.
    fn expire(&mut self, id: ConnId, why: u8) {
        let Some(e) = self.remove(id) else { return };
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
}
