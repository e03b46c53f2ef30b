//! The pump: moving work from the per-peer FIFOs into the reliability
//! endpoint as tokens, one segment each, as far as the peer's window and
//! the ordering rules allow.
//!
//! Contract: requests to one peer start in posting order; a Read or
//! atomic starts only within ORD, and a fenced request only when no Read
//! or atomic of its peer is outstanding.

use super::*;

impl RdQp {
    pub(super) fn refresh(&mut self) {
        self.rd_deadline = self.ep.poll_timeout();
    }

    // ------------------------------------------------------------------
    // Peers and pumping tokens into the reliability layer
    // ------------------------------------------------------------------

    pub(super) fn mark_ready(&mut self, peer: DgramAddr) {
        if let Some(p) = self.peers.get_mut(&peer) {
            if !p.ready && (p.sq_head != NIL || p.in_head != NIL) {
                p.ready = true;
                self.ready.push_back(peer);
            }
        }
    }

    pub(super) fn pump_all(&mut self) {
        for _ in 0..self.ready.len() {
            let Some(peer) = self.ready.pop_front() else {
                break;
            };
            let Some(p) = self.peers.get_mut(&peer) else {
                continue;
            };
            p.ready = false;
            self.pump(peer);
        }
    }

    /// Gives the peer's next tokens to the reliability layer, keeping at
    /// most `pump_depth` queued there; responses and requests take turns.
    /// (Terminates do not come here: they go out as reports.)
    pub(super) fn pump(&mut self, peer: DgramAddr) {
        loop {
            if self.ep.queued(&peer) >= self.pump_depth {
                return;
            }
            let Some(p) = self.peers.get(&peer).copied() else {
                return;
            };
            let in_head = p.in_head;
            let sq_ok = p.sq_head != NIL && self.sq_can_start(p.sq_head, &p);
            let use_in = in_head != NIL && (!sq_ok || p.turn_in);
            if use_in {
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.turn_in = false;
                }
                self.pump_in(peer, in_head);
            } else if sq_ok {
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.turn_in = true;
                }
                self.pump_sq(peer, p.sq_head);
            } else {
                return;
            }
        }
    }

    pub(super) fn sq_can_start(&self, slot: u32, p: &PeerState) -> bool {
        let Some(e) = self.sq[slot as usize].e.as_ref() else {
            return true;
        };
        if e.started {
            return true;
        }
        let fenced = e.wr.flags.fence && p.ord_used > 0;
        match e.kind {
            Kind::Read | Kind::Atomic => !fenced && p.ord_used < self.cfg.ord,
            _ => !fenced,
        }
    }

    /// Fixes a request's numbering and segmentation when it starts.
    pub(super) fn start_sq(&mut self, slot: u32) {
        let Some(e) = self.sq[slot as usize].e else {
            return;
        };
        let room_send = self.room(e.dest.ip, false);
        let room_tagged = self.room(e.dest.ip, true);
        let Some(p) = self.peers.get_mut(&e.dest) else {
            return;
        };
        let len = e.wr.payload.len();
        let (msn, room, data_segs, nsegs, awaiting) = match e.wr.op {
            SendOp::Send { imm, .. } => {
                let data = if len == 0 {
                    u32::from(imm.is_none())
                } else {
                    len.div_ceil(u64::from(room_send)) as u32
                };
                let m = p.tx_msn;
                p.tx_msn = m.wrapping_add(1);
                (m, room_send, data, data + u32::from(imm.is_some()), false)
            }
            SendOp::Write { .. } | SendOp::WriteRecord { .. } => {
                let data = len.div_ceil(u64::from(room_tagged)).max(1) as u32;
                let m = p.tx_tmsn;
                p.tx_tmsn = m.wrapping_add(1);
                (m, room_tagged, data, data, false)
            }
            _ => {
                let m = p.tx_req;
                p.tx_req = m.wrapping_add(1);
                p.ord_used += 1;
                (m, 0, 1, 1, true)
            }
        };
        if let Some(e) = self.sq[slot as usize].e.as_mut() {
            e.started = true;
            e.msn = msn;
            e.room = room;
            e.data_segs = data_segs;
            e.nsegs = nsegs;
            e.awaiting = awaiting;
        }
    }

    pub(super) fn pump_sq(&mut self, peer: DgramAddr, slot: u32) {
        if self.sq[slot as usize].e.is_some_and(|e| !e.started) {
            self.start_sq(slot);
        }
        let gen = self.sq[slot as usize].gen;
        let Some(e) = self.sq[slot as usize].e else {
            self.sq_unlink(peer, slot);
            return;
        };
        if e.done || e.pumped >= e.nsegs {
            self.sq_unlink(peer, slot);
            self.try_free_sq(slot);
            return;
        }
        let token = Token {
            from: Source::Sq,
            slot,
            gen,
            seg: e.pumped,
        };
        match self.ep.send(peer, token, self.now) {
            Ok(()) => {
                self.maybe_tx = true;
                let mut finished = false;
                if let Some(e) = self.sq[slot as usize].e.as_mut() {
                    e.pumped += 1;
                    finished = e.pumped >= e.nsegs;
                }
                if finished {
                    self.sq_unlink(peer, slot);
                }
            }
            Err(SendError::TableFull) => {
                self.stats.tx_table_full += 1;
                self.complete(slot, WcStatus::GeneralErr, 0);
                self.maybe_drop_peer(peer);
            }
            Err(SendError::QueueFull) => {}
        }
    }

    pub(super) fn pump_in(&mut self, peer: DgramAddr, slot: u32) {
        let gen = self.inb[slot as usize].gen;
        let Some(e) = self.inb[slot as usize].e else {
            self.in_unlink(peer, slot);
            return;
        };
        if e.dead || e.pumped >= e.nsegs {
            self.in_unlink(peer, slot);
            self.try_free_in(slot);
            return;
        }
        let token = Token {
            from: Source::Inbound,
            slot,
            gen,
            seg: e.pumped,
        };
        match self.ep.send(peer, token, self.now) {
            Ok(()) => {
                self.maybe_tx = true;
                let mut finished = false;
                if let Some(e) = self.inb[slot as usize].e.as_mut() {
                    e.pumped += 1;
                    finished = e.pumped >= e.nsegs;
                }
                if finished {
                    self.in_unlink(peer, slot);
                }
            }
            Err(SendError::TableFull) => {
                self.kill_in(slot);
            }
            Err(SendError::QueueFull) => {}
        }
    }

    pub(super) fn sq_push(&mut self, peer: DgramAddr, slot: u32) {
        if let Some(p) = self.peers.get_mut(&peer) {
            fifo_push(&mut self.sq, &mut p.sq_head, &mut p.sq_tail, slot);
        }
    }

    pub(super) fn sq_unlink(&mut self, peer: DgramAddr, slot: u32) {
        let mut none = (NIL, NIL);
        let (head, tail) = match self.peers.get_mut(&peer) {
            Some(p) => (&mut p.sq_head, &mut p.sq_tail),
            None => (&mut none.0, &mut none.1),
        };
        fifo_unlink(&mut self.sq, head, tail, slot);
    }

    pub(super) fn in_push(&mut self, peer: DgramAddr, slot: u32) {
        if let Some(p) = self.peers.get_mut(&peer) {
            fifo_push(&mut self.inb, &mut p.in_head, &mut p.in_tail, slot);
        }
    }

    pub(super) fn in_unlink(&mut self, peer: DgramAddr, slot: u32) {
        let mut none = (NIL, NIL);
        let (head, tail) = match self.peers.get_mut(&peer) {
            Some(p) => (&mut p.in_head, &mut p.in_tail),
            None => (&mut none.0, &mut none.1),
        };
        fifo_unlink(&mut self.inb, head, tail, slot);
    }

    /// Removes the peer's state if nothing of it is left and the
    /// reliability layer has no entry for it either.
    pub(super) fn maybe_drop_peer(&mut self, peer: DgramAddr) {
        let idle = self.peers.get(&peer).is_some_and(|p| p.idle());
        if idle && !self.ep.has_peer(&peer) {
            self.peers.remove(&peer);
            let n = self.peers.len();
            if self.peers.capacity() > 4 * n + 64 {
                self.peers.shrink_to(2 * n);
            }
        }
    }

    /// Payload octets per segment towards `ip`.
    pub(super) fn room(&self, ip: IpAddr, tagged: bool) -> u32 {
        let template = if tagged {
            SegmentRepr {
                ddp: DdpHeader::Tagged {
                    stag: 0,
                    to: 0,
                    ext: Some(TaggedExt { msn: 0, mo: 0 }),
                },
                dqpn: Some(0),
                ..SegmentRepr::tagged(Opcode::RdmaWrite, 0, 0, true)
            }
        } else {
            SegmentRepr {
                dqpn: Some(0),
                ..SegmentRepr::untagged(Opcode::Send, 0, 0, 0, true, RdmapBody::None)
            }
        };
        let overhead = match ip.to_canonical() {
            IpAddr::V4(_) => IPV4_UDP_OVERHEAD,
            IpAddr::V6(_) => IPV6_UDP_OVERHEAD,
        };
        wrd::max_payload_with(self.cfg.mtu, overhead, &template).clamp(1, u32::MAX as usize) as u32
    }

    /// The DQPN word of §10: our slot in the top octet.
    pub(super) fn dqpn_word(&self, dest_qpn: u32) -> u32 {
        ((self.cfg.qpn & 0xFF) << 24) | (dest_qpn & MAX_QPN)
    }

    // ------------------------------------------------------------------
    // Completions and slots
    // ------------------------------------------------------------------
}
