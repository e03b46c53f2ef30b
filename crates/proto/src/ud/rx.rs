//! UD receive: checking a datagram, placing tagged segments (Write-Record),
//! reassembling untagged messages into posted receives, dropping
//! duplicates.
//!
//! Contract: a malformed or unexpected datagram is dropped and counted,
//! never answered; a message completes at most once, and its duplicates
//! are dropped.

use super::*;

impl UdQp {
    /// Takes one UDP payload that arrived from `src_ip:src_port`. Sends are
    /// scattered into posted receives, Writes and Write-Records placed;
    /// completions and events become visible through
    /// [`UdQp::poll_completion`] and [`UdQp::poll_event`]. Anything wrong
    /// is counted ([`UdQp::stats`]) and dropped; nothing stops the QP.
    pub fn handle_datagram<M: Memory>(
        &mut self,
        src_ip: IpAddr,
        src_port: u16,
        data: &[u8],
        mem: &mut M,
        now: Instant,
    ) {
        self.handle_datagram_lazy(src_ip, src_port, data, mem, || now)
    }

    /// [`UdQp::handle_datagram`], asking `now` for the time only when the
    /// datagram starts a timer: a message of several datagrams (its
    /// reassembly deadline) or a Write-Record segment (the record's
    /// partial-placement timeout). A Send or Write in one datagram — every
    /// 64 B message — reads no clock.
    pub fn handle_datagram_lazy<M: Memory, F: FnMut() -> Instant>(
        &mut self,
        src_ip: IpAddr,
        src_port: u16,
        data: &[u8],
        mem: &mut M,
        mut now: F,
    ) {
        self.stats.rx_datagrams += 1;
        let (repr, payload) = match datagram::parse(data) {
            Ok(x) => x,
            Err(WireError::BadCrc) => {
                self.stats.rx_bad_crc += 1;
                return;
            }
            Err(_) => {
                self.stats.rx_malformed += 1;
                return;
            }
        };
        let slot = match repr.dqpn {
            Some(w) if w & QPN_MASK == self.cfg.qpn || w & QPN_MASK == MCAST_QPN => (w >> 24) as u8,
            None if self.cfg.accept_without_dqpn => 0,
            _ => {
                self.stats.rx_bad_dqpn += 1;
                return;
            }
        };
        let ip = src_ip.to_canonical();
        match repr.opcode {
            Opcode::Send | Opcode::SendSe | Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                self.rx_untagged(ip, src_port, &repr, payload, mem, &mut now)
            }
            Opcode::RdmaWrite | Opcode::WriteRecord => {
                let src = DgramAddr {
                    ip,
                    port: src_port,
                    qpn: (u32::from(src_port) << 8) | u32::from(slot),
                };
                self.rx_tagged(src, &repr, payload, mem, &mut now)
            }
            _ => self.stats.rx_unsupported += 1,
        }
    }

    pub(super) fn rx_tagged<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        payload: &[u8],
        mem: &mut M,
        now: &mut impl FnMut() -> Instant,
    ) {
        let DdpHeader::Tagged { stag, to, ext } = repr.ddp else {
            self.stats.rx_malformed += 1;
            return;
        };
        let (msn, mo) = ext.map_or((0, 0), |e| (e.msn, e.mo));
        let record = repr.opcode == Opcode::WriteRecord;
        // A Write-Record segment the tracker will drop as stale (a late
        // segment of a message already retired) is checked, not placed:
        // memory changes only where the log says.
        let res = self
            .tracker
            .place_tagged(mem, record, src, stag, to, mo, msn, payload);
        if let Err(error) = res {
            self.stats.rx_access_errors += 1;
            self.push_event(UdEvent::RemoteAccess {
                src,
                opcode: repr.opcode,
                msn,
                stag,
                to,
                len: payload.len() as u32,
                error,
            });
            return;
        }
        if record {
            self.stats.rx_record_segments += 1;
            self.tracker.placed(
                src,
                stag,
                to,
                mo,
                msn,
                payload.len() as u32,
                repr.last,
                now(),
            );
            self.drain_tracker();
        } else {
            self.stats.rx_write_segments += 1;
        }
    }

    pub(super) fn rx_untagged<M: Memory>(
        &mut self,
        ip: IpAddr,
        port: u16,
        repr: &SegmentRepr,
        payload: &[u8],
        mem: &mut M,
        now: &mut impl FnMut() -> Instant,
    ) {
        let DdpHeader::Untagged {
            rsvd_ulp,
            qn,
            msn,
            mo,
        } = repr.ddp
        else {
            self.stats.rx_malformed += 1;
            return;
        };
        let imm_seg = matches!(repr.opcode, Opcode::ImmediateData | Opcode::ImmediateDataSe);
        let end = u64::from(mo) + payload.len() as u64;
        if qn != 0
            || rsvd_ulp & !QPN_MASK != 0
            || (imm_seg && !repr.last)
            || end > u64::from(u32::MAX)
        {
            self.stats.rx_malformed += 1;
            return;
        }
        let seg = RxSeg {
            mo,
            end: end as u32,
            last: repr.last,
            imm_seg,
            imm: match repr.body {
                RdmapBody::Immediate(v) if imm_seg => Some(v as u32),
                _ => None,
            },
            solicited: repr.opcode.is_solicited(),
        };
        let src = DgramAddr {
            ip,
            port,
            qpn: rsvd_ulp,
        };
        if let Some(&i) = self.slot_map.get(&(src, msn)) {
            self.rx_continue(i, &seg, payload, mem);
            return;
        }
        if self.is_done(src, msn) {
            self.stats.rx_duplicates += 1;
            return;
        }
        let whole = mo == 0 && repr.last;
        if !whole && self.free_slots.is_empty() {
            self.evict_oldest();
        }
        let Some((seq, wr)) = self.rq.take() else {
            self.stats.rx_no_recv += 1;
            self.mark_done(src, msn);
            return;
        };
        if wr.sgl.total_len() < self.grh_len() {
            // Not even room for the GRH.
            return self.finish_err(src, msn, &wr, WcStatus::LocLenErr);
        }
        let cap = self.capacity(&wr);
        if whole {
            if u64::from(seg.end) > cap {
                return self.finish_err(src, msn, &wr, WcStatus::LocLenErr);
            }
            if scatter(mem, &wr.sgl, self.grh_len() + u64::from(mo), payload).is_err() {
                return self.finish_err(src, msn, &wr, WcStatus::LocProtErr);
            }
            return self.finish_ok(src, msn, &wr, seg.end, seg.imm, seg.solicited, mem);
        }
        let Some(i) = self.free_slots.pop() else {
            // Not reached: a slot was freed above.
            self.rq.give_back(seq, wr);
            return;
        };
        self.slots[i] = Some(Reasm {
            src,
            msn,
            seq,
            wr,
            cap,
            deadline: now().checked_add(self.cfg.reassembly_timeout),
            total: None,
            last_imm: false,
            imm: None,
            solicited: false,
            frags: Frags::EMPTY,
        });
        self.slot_map.insert((src, msn), i);
        self.rx_continue(i, &seg, payload, mem);
    }

    /// A segment of the message in slot `i`.
    pub(super) fn rx_continue<M: Memory>(
        &mut self,
        i: usize,
        seg: &RxSeg,
        payload: &[u8],
        mem: &mut M,
    ) {
        let grh = self.grh_len();
        let Some(r) = self.slots[i].as_mut() else {
            return;
        };
        let inconsistent = match r.total {
            Some(t) => seg.end > t || (seg.last && (seg.end != t || seg.imm_seg != r.last_imm)),
            None => seg.last && seg.end < r.frags.end(),
        };
        if inconsistent {
            self.stats.rx_inconsistent += 1;
            return;
        }
        if u64::from(seg.end) > r.cap {
            let r = self.release_slot(i);
            return self.finish_err(r.src, r.msn, &r.wr, WcStatus::LocLenErr);
        }
        if r.frags.covers(seg.mo, seg.end) && (!seg.last || r.total.is_some()) {
            self.stats.rx_duplicates += 1;
            return;
        }
        if !r.frags.can_add(seg.mo, seg.end) {
            self.stats.rx_fragment_overflow += 1;
            return;
        }
        if !payload.is_empty() && scatter(mem, &r.wr.sgl, grh + u64::from(seg.mo), payload).is_err()
        {
            let r = self.release_slot(i);
            return self.finish_err(r.src, r.msn, &r.wr, WcStatus::LocProtErr);
        }
        r.frags.add(seg.mo, seg.end);
        if seg.last {
            r.total = Some(seg.end);
            r.last_imm = seg.imm_seg;
            r.imm = seg.imm;
            r.solicited = seg.solicited;
        }
        if r.total.is_some_and(|t| r.frags.complete(t)) {
            let r = self.release_slot(i);
            let total = r.total.unwrap_or(0);
            self.finish_ok(r.src, r.msn, &r.wr, total, r.imm, r.solicited, mem);
        }
    }

    /// Octets of message the receive can take.
    pub(super) fn capacity(&self, wr: &RecvWr) -> u64 {
        let room = wr.sgl.total_len().saturating_sub(self.grh_len());
        room.min(self.cfg.max_msg as u64)
            .min(u64::from(u32::MAX) - GRH_LEN as u64)
    }

    pub(super) fn grh_len(&self) -> u64 {
        if self.cfg.grh.is_some() {
            GRH_LEN as u64
        } else {
            0
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_ok<M: Memory>(
        &mut self,
        src: DgramAddr,
        msn: u32,
        wr: &RecvWr,
        total: u32,
        imm: Option<u32>,
        solicited: bool,
        mem: &mut M,
    ) {
        if let Some(ours) = self.cfg.grh {
            let h = grh_header(src.ip, ours, u64::from(total));
            if scatter(mem, &wr.sgl, 0, &h).is_err() {
                return self.finish_err(src, msn, wr, WcStatus::LocProtErr);
            }
        }
        self.rq.consumed();
        self.mark_done(src, msn);
        self.stats.rx_delivered += 1;
        let mut wc = WorkCompletion::new(
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            total + self.grh_len() as u32,
        );
        wc.imm = imm;
        wc.solicited = solicited;
        wc.src = Some(src);
        self.completions.push_back((CqKind::Recv, wc));
    }

    pub(super) fn finish_err(&mut self, src: DgramAddr, msn: u32, wr: &RecvWr, status: WcStatus) {
        self.rq.consumed();
        self.mark_done(src, msn);
        match status {
            WcStatus::LocLenErr => self.stats.rx_len_err += 1,
            _ => self.stats.rx_prot_err += 1,
        }
        let mut wc = WorkCompletion::new(wr.wr_id, status, WcOpcode::Recv, 0);
        wc.src = Some(src);
        self.completions.push_back((CqKind::Recv, wc));
    }

    /// Frees slot `i` and returns what it held.
    pub(super) fn release_slot(&mut self, i: usize) -> Reasm {
        let r = self.slots[i].take().expect("slot in use");
        self.slot_map.remove(&(r.src, r.msn));
        self.free_slots.push(i);
        r
    }

    /// Drops the incomplete message in slot `i`: its receive goes back to
    /// the queue and its late segments will be ignored.
    pub(super) fn drop_slot(&mut self, i: usize) {
        let r = self.release_slot(i);
        self.rq.give_back(r.seq, r.wr);
        self.mark_done(r.src, r.msn);
    }

    pub(super) fn evict_oldest(&mut self) {
        let oldest = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|r| (r.deadline, r.seq, i)))
            // `None` deadlines (never) sort first in Option's order; they
            // are the oldest in spirit too.
            .min()
            .map(|(_, _, i)| i);
        if let Some(i) = oldest {
            self.drop_slot(i);
            self.stats.rx_evicted += 1;
        }
    }

    /// The index of `src`'s window: the last source's without hashing
    /// (most traffic comes from the peer of the datagram before).
    pub(super) fn source_index(&self, src: DgramAddr) -> Option<usize> {
        if self
            .sources
            .get(self.last_source)
            .is_some_and(|w| w.addr == src)
        {
            return Some(self.last_source);
        }
        self.source_map.get(&src).copied()
    }

    pub(super) fn is_done(&self, src: DgramAddr, msn: u32) -> bool {
        self.source_index(src)
            .is_some_and(|i| self.sources[i].is_done(msn))
    }

    pub(super) fn mark_done(&mut self, src: DgramAddr, msn: u32) {
        self.use_clock += 1;
        let used = self.use_clock;
        if let Some(i) = self.source_index(src) {
            self.last_source = i;
            let w = &mut self.sources[i];
            w.used = used;
            w.mark(msn);
            return;
        }
        let mut w = SrcWin {
            addr: src,
            highest: msn,
            bits: [0; WIN_WORDS],
            used,
        };
        w.mark(msn);
        if self.sources.len() < self.cfg.max_sources {
            self.source_map.insert(src, self.sources.len());
            self.sources.push(w);
            return;
        }
        // Forget the least recently used source.
        let Some((i, _)) = self.sources.iter().enumerate().min_by_key(|(_, s)| s.used) else {
            return;
        };
        self.source_map.remove(&self.sources[i].addr);
        self.source_map.insert(src, i);
        self.sources[i] = w;
    }

    pub(super) fn push_event(&mut self, ev: UdEvent) {
        if self.events.len() >= self.cfg.event_depth {
            self.stats.events_lost += 1;
        } else {
            self.events.push_back(ev);
        }
    }

    /// Moves the tracker's completions behind ours, keeping their order.
    pub(super) fn drain_tracker(&mut self) {
        while let Some(wc) = self.tracker.poll_completion() {
            self.completions.push_back((CqKind::Recv, wc));
        }
    }
}
