//! Settling: what acknowledged, failed or expired tokens mean for the
//! work they belong to — completions, freed slots, released gates, and a
//! peer's failure, resynchronisation or expiry.
//!
//! Contract: every work request completes exactly once; when the
//! reliability layer gives up on a peer, everything of this QP towards it
//! fails and no other peer is touched.

use super::*;

impl RdQp {
    /// Decides a send work request's outcome (once); it leaves the pump
    /// list, its completion is reported once every earlier request to the
    /// same peer was, and its slot is freed when its last token is settled.
    pub(super) fn complete(&mut self, slot: u32, status: WcStatus, byte_len: u32) {
        let Some(e) = self.sq[slot as usize].e.as_mut() else {
            return;
        };
        if e.done {
            return;
        }
        e.done = true;
        e.outcome = (status, byte_len);
        let (dest, awaiting) = (e.dest, e.awaiting);
        e.awaiting = false;
        if awaiting {
            if let Some(p) = self.peers.get_mut(&dest) {
                p.ord_used = p.ord_used.saturating_sub(1);
            }
            self.mark_ready(dest);
        }
        self.sq_unlink(dest, slot);
        if status == WcStatus::Success {
            self.stats.tx_messages += 1;
        } else {
            self.stats.tx_errors += 1;
        }
        self.report(dest);
        self.maybe_drop_peer(dest);
    }

    /// Produces the completions of `peer`'s requests whose outcome is
    /// decided, in posting order up to the first undecided one.
    pub(super) fn report(&mut self, peer: DgramAddr) {
        loop {
            let Some(p) = self.peers.get_mut(&peer) else {
                return;
            };
            let head = p.all_head;
            let Some(e) = self.sq.get_mut(head as usize).and_then(|s| s.e.as_mut()) else {
                return;
            };
            if !e.done {
                return;
            }
            p.all_head = e.next_all;
            if p.all_head == NIL {
                p.all_tail = NIL;
            }
            e.reported = true;
            e.next_all = NIL;
            let ((status, len), wr) = (e.outcome, e.wr);
            if status != WcStatus::Success || wr.flags.signaled {
                self.completions.push_back((
                    CqKind::Send,
                    WorkCompletion::new(wr.wr_id, status, WcOpcode::of(&wr.op), len),
                ));
            }
            self.try_free_sq(head);
        }
    }

    pub(super) fn try_free_sq(&mut self, slot: u32) {
        let s = &mut self.sq[slot as usize];
        let Some(e) = s.e else {
            return;
        };
        if e.reported && e.resolved >= e.pumped && !e.in_fifo {
            s.e = None;
            s.gen = s.gen.wrapping_add(1);
            self.sq_free.push(slot);
        }
    }

    pub(super) fn try_free_in(&mut self, slot: u32) {
        let Some(e) = self.inb[slot as usize].e else {
            return;
        };
        if !(e.dead || e.pumped >= e.nsegs) || e.resolved < e.pumped || e.in_fifo {
            return;
        }
        if e.ird {
            if let Some(p) = self.peers.get_mut(&e.peer) {
                p.ird_used = p.ird_used.saturating_sub(1);
            }
        }
        let s = &mut self.inb[slot as usize];
        s.e = None;
        s.gen = s.gen.wrapping_add(1);
        self.in_free.push(slot);
        self.maybe_drop_peer(e.peer);
    }

    /// Stops sending an inbound slot; it is freed once its tokens settle.
    pub(super) fn kill_in(&mut self, slot: u32) {
        let Some(e) = self.inb[slot as usize].e.as_mut() else {
            return;
        };
        e.dead = true;
        let peer = e.peer;
        self.in_unlink(peer, slot);
        self.try_free_in(slot);
    }

    pub(super) fn alloc_in(&mut self, for_terminate: bool) -> Option<u32> {
        if !for_terminate && self.in_free.len() <= self.term_reserve {
            return None;
        }
        self.in_free.pop()
    }

    pub(super) fn push_event(&mut self, ev: DgramEvent) {
        if self.events.len() >= self.cfg.event_depth {
            self.stats.events_lost += 1;
        } else {
            self.events.push_back(ev);
        }
    }

    pub(super) fn drain_tracker(&mut self) {
        while let Some(wc) = self.tracker.poll_completion() {
            self.completions.push_back((CqKind::Recv, wc));
        }
    }

    // ------------------------------------------------------------------
    // Reliability-layer events
    // ------------------------------------------------------------------

    pub(super) fn drain_rd_events(&mut self) {
        while let Some(ev) = self.ep.poll_event() {
            match ev {
                Event::Acked { peer, token } => self.token_settled(peer, token, true),
                Event::Abandoned { peer, token } => self.token_settled(peer, token, false),
                Event::PeerFailed { peer, .. } => self.peer_failed(peer),
                Event::SessionStarted { peer, replaced } => {
                    self.fail_gated(peer);
                    if replaced {
                        self.abort_rx(peer);
                    }
                }
                Event::Resynced { peer, .. } => self.peer_resynced(peer),
                Event::PeerExpired { peer } => self.peer_expired(peer),
            }
        }
    }

    pub(super) fn token_settled(&mut self, peer: DgramAddr, t: Token, acked: bool) {
        let slot = t.slot;
        match t.from {
            Source::Sq => {
                let Some(s) = self.sq.get_mut(slot as usize) else {
                    return;
                };
                if s.gen != t.gen {
                    return;
                }
                let Some(e) = s.e.as_mut() else {
                    return;
                };
                e.resolved += 1;
                if acked {
                    e.acked += 1;
                }
                if acked && !e.done && e.kind.acked_kind() && e.acked == e.nsegs {
                    self.candidates.push(slot);
                } else {
                    self.try_free_sq(slot);
                }
            }
            Source::Inbound => {
                let Some(s) = self.inb.get_mut(slot as usize) else {
                    return;
                };
                if s.gen != t.gen {
                    return;
                }
                let Some(e) = s.e.as_mut() else {
                    return;
                };
                e.resolved += 1;
                self.try_free_in(slot);
            }
        }
        self.mark_ready(peer);
    }

    /// Completes the requests acknowledged by the datagram just handled (or
    /// a timer): successfully, unless a Terminate failed them meanwhile, or
    /// later, when `gate` says the ACK came on a datagram not delivered (a
    /// Terminate before it may still be on its way).
    pub(super) fn finalize(&mut self, gate: Option<(DgramAddr, u32, u32)>) {
        let mut c = std::mem::take(&mut self.candidates);
        for slot in c.drain(..) {
            let Some(e) = self.sq[slot as usize].e.as_mut() else {
                continue;
            };
            if e.done {
                continue;
            }
            match gate {
                Some((peer, epoch, psn)) if e.dest == peer => {
                    e.gated = true;
                    self.stats.tx_gated += 1;
                    if let Some(p) = self.peers.get_mut(&peer) {
                        p.gate = match p.gate {
                            Some((ge, g)) if ge == epoch && seq_after(g, psn) => Some((ge, g)),
                            _ => Some((epoch, psn)),
                        };
                    }
                }
                _ => {
                    let len = e.wr.payload.len() as u32;
                    self.complete(slot, WcStatus::Success, len);
                }
            }
        }
        self.candidates = c;
    }

    /// The peer's datagram (epoch, psn) was delivered: gated requests up to
    /// it succeed.
    pub(super) fn release_gate(&mut self, peer: DgramAddr, epoch: u32, psn: u32) {
        let open = self
            .peers
            .get(&peer)
            .and_then(|p| p.gate)
            .is_some_and(|(ge, g)| ge == epoch && !seq_after(g, psn));
        if !open {
            return;
        }
        if let Some(p) = self.peers.get_mut(&peer) {
            p.gate = None;
        }
        self.settle_gated(peer, None);
    }

    /// The peer's session changed while requests were gated: their ACK
    /// can no longer be confirmed; they fail.
    pub(super) fn fail_gated(&mut self, peer: DgramAddr) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if p.gate.take().is_some() {
            self.settle_gated(peer, Some(WcStatus::RetryExcErr));
        }
    }

    pub(super) fn settle_gated(&mut self, peer: DgramAddr, error: Option<WcStatus>) {
        for i in 0..self.sq.len() {
            let Some(e) = self.sq[i].e.as_mut() else {
                continue;
            };
            if e.dest != peer || !e.gated {
                continue;
            }
            e.gated = false;
            let len = e.wr.payload.len() as u32;
            match error {
                None => self.complete(i as u32, WcStatus::Success, len),
                Some(st) => self.complete(i as u32, st, 0),
            }
        }
    }

    /// The reliability layer gave up on `peer`: everything of ours towards
    /// it fails; other peers are not touched.
    pub(super) fn peer_failed(&mut self, peer: DgramAddr) {
        self.push_event(DgramEvent::PeerFailed { peer });
        self.fail_gated(peer);
        for i in 0..self.sq.len() {
            let hit = self.sq[i].e.is_some_and(|e| e.dest == peer && !e.done);
            if hit {
                self.complete(i as u32, WcStatus::RetryExcErr, 0);
            }
        }
        self.kill_inbound_of(peer);
    }

    pub(super) fn kill_inbound_of(&mut self, peer: DgramAddr) {
        for i in 0..self.inb.len() {
            if self.inb[i].e.is_some_and(|e| e.peer == peer) {
                self.kill_in(i as u32);
            }
        }
    }

    /// The peer answered our session with a reset: it lost the session
    /// (a new incarnation of the process, or it forgot us), and the
    /// reliability layer re-sends our unacknowledged tokens in a new one.
    /// What the old session acknowledged went to a peer state that is
    /// gone, so:
    ///
    /// * a Send, Write or Write-Record acknowledged in part fails with
    ///   RetryExcErr (its rest would reach a receiver that never saw its
    ///   beginning); one acknowledged in none of its datagrams is simply
    ///   sent again, whole;
    /// * a Read or atomic whose request was acknowledged (or whose
    ///   response had begun) fails with RetryExcErr: the response will
    ///   never come, and completions are reported in posting order;
    /// * requests waiting for a gate fail (their ACK cannot be confirmed),
    ///   responses and Terminates to the old session are dropped, and the
    ///   message being received from the peer is abandoned;
    /// * nothing of the failed requests or dropped responses is sent in the
    ///   new session ([`RdEndpoint::discard_unsent`]).
    pub(super) fn peer_resynced(&mut self, peer: DgramAddr) {
        self.fail_gated(peer);
        for i in 0..self.sq.len() {
            let Some(e) = self.sq[i].e else {
                continue;
            };
            if e.dest != peer || e.done || !e.started {
                continue;
            }
            let broken = if e.kind.acked_kind() {
                e.acked > 0 && e.acked < e.nsegs
            } else {
                e.awaiting && (e.acked > 0 || e.received > 0)
            };
            if broken {
                self.stats.tx_resync_failed += 1;
                self.complete(i as u32, WcStatus::RetryExcErr, 0);
            }
        }
        self.kill_inbound_of(peer);
        self.abort_rx(peer);
        let (sq, inb) = (&self.sq, &self.inb);
        self.ep.discard_unsent(&peer, |t| match t.from {
            Source::Sq => sq
                .get(t.slot as usize)
                .is_some_and(|s| s.gen == t.gen && s.e.is_some_and(|e| !e.done)),
            Source::Inbound => inb
                .get(t.slot as usize)
                .is_some_and(|s| s.gen == t.gen && s.e.is_some_and(|e| !e.dead)),
        });
        self.mark_ready(peer);
    }

    /// The reliability layer forgot `peer` after idle_timeout of quiet.
    pub(super) fn peer_expired(&mut self, peer: DgramAddr) {
        self.abort_rx(peer);
        for i in 0..self.sq.len() {
            let hit = self.sq[i]
                .e
                .is_some_and(|e| e.dest == peer && e.awaiting && !e.done);
            if hit {
                self.complete(i as u32, WcStatus::RetryExcErr, 0);
            }
        }
        self.kill_inbound_of(peer);
        self.fail_gated(peer);
        if let Some(p) = self.peers.get_mut(&peer) {
            p.skip_send = None;
            p.skip_tagged = None;
            p.rx_tagged = None;
        }
        self.maybe_drop_peer(peer);
        self.mark_ready(peer);
    }

    /// The message being received from `peer` is abandoned: its receive
    /// returns to the queue at its posting position.
    pub(super) fn abort_rx(&mut self, peer: DgramAddr) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        p.skip_send = None;
        p.skip_tagged = None;
        p.rx_tagged = None;
        if let Some(m) = p.rx.take() {
            self.rq.give_back(m.seq, m.wr);
        }
    }

    // ------------------------------------------------------------------
    // Transmit
    // ------------------------------------------------------------------
}
