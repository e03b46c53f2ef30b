//! The initiator side: posting to a target, inviting (directly or by the
//! responder connecting back), binding a reverse use of an existing
//! connection, and following the RC connection through its life.
//!
//! Contract: every [`DcTable::post`] is matched by one
//! [`DcTable::completed`] or by the connection's failure or close.

use super::*;

impl DcTable {
    /// `direct_ok`: a direct attempt may go along (not when this table had
    /// to evict for the slot: under such churn the target's table is
    /// usually full too, until it sees the close, and a refused attempt
    /// only adds a TCP exchange before the invitation).
    pub(super) fn start_invite(&mut self, id: ConnId, now: Instant, direct_ok: bool) {
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

    pub(super) fn send_invite(&mut self, id: ConnId, target: DcTarget) {
        self.send_to_target(MsgKind::Invite, id, target, target.key, 0);
    }

    /// Queues an initiator's message about connection `id` to the UD QP
    /// of `target`'s DCT (Invite, Bind, Unbind: they differ in kind, key
    /// and cookie only).
    pub(super) fn send_to_target(
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
    pub(super) fn offered_to(&self, target: &DcTarget) -> Option<(ConnId, u64)> {
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
    pub(super) fn start_bind(&mut self, id: ConnId, t: ConnId, nonce: u64, now: Instant) {
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

    pub(super) fn send_bind(&mut self, id: ConnId, target: DcTarget, nonce: u64) {
        self.send_to_target(MsgKind::Bind, id, target, target.key, nonce);
    }

    /// Reverse user: the Bind of `id` did not work out (refused, timed
    /// out, its connection closing): the connection it would have run
    /// over is not tried again, and `id` takes the normal path (a slot,
    /// a direct attempt, an invitation) with its work kept.
    pub(super) fn bind_fallback(&mut self, id: ConnId, now: Instant) {
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
    pub(super) fn finish_reverse(&mut self, id: ConnId) {
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
    pub(super) fn send_first_invite(&mut self, id: ConnId, now: Instant) {
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
    pub(super) fn restart_invite(&mut self, id: ConnId, now: Instant) {
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
}
