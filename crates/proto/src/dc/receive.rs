//! Messages in: invites, answers, binds and unbinds, for either side.
//!
//! Contract: a malformed message is counted and dropped; a wrong key is
//! refused, counted and reported (once per recent source and
//! connection).

use super::*;

impl DcTable {
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
    pub(super) fn on_bind(&mut self, src: DgramAddr, local_qpn: u32, m: Message) {
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
    pub(super) fn count_bad_key(&mut self, dct: u32, src: DgramAddr, conn: u64) {
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

    pub(super) fn bind_reject(&mut self, m: Message, to: DgramAddr, reason: RejectReason) {
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
    pub(super) fn on_unbind(&mut self, now: Instant, src: DgramAddr, local_qpn: u32, m: Message) {
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
    pub(super) fn on_unbound(&mut self, now: Instant, m: Message) {
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

    pub(super) fn reply(&mut self, dct: u32, to: DgramAddr, msg: Message) {
        self.tx.push_back(Transmit {
            from_dct: Some(dct),
            to,
            msg,
        });
    }

    pub(super) fn reject(&mut self, dct: u32, to: DgramAddr, conn: u64, reason: RejectReason) {
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

    pub(super) fn accept_msg(&self, dct: u32, conn: u64, cookie: u64) -> Message {
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

    pub(super) fn on_invite(&mut self, now: Instant, src: DgramAddr, local_qpn: u32, m: Message) {
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

    pub(super) fn on_answer(&mut self, now: Instant, m: Message, reject: Option<RejectReason>) {
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
    pub(super) fn on_bind_answer(&mut self, now: Instant, m: Message, r: Option<RejectReason>) {
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
}
