//! RD receive of tagged and request segments: Write placement, Read and
//! atomic requests (answered through the inbound slots), Read and atomic
//! responses, and Terminates from the peer.
//!
//! Contract: every STag, bound and right is checked before an octet
//! moves; a Read or atomic request beyond IRD or the inbound slots is
//! answered with a Terminate.

use super::*;

impl RdQp {
    pub(super) fn rx_tagged<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        payload: &[u8],
        seg: &[u8],
        mem: &mut M,
        now: Instant,
    ) {
        let DdpHeader::Tagged { stag, to, ext } = repr.ddp else {
            return;
        };
        let (msn, mo) = ext.map_or((0, 0), |e| (e.msn, e.mo));
        let Some(p) = self.peers.get_mut(&src) else {
            return;
        };
        if ext.is_some() && p.skip_tagged == Some(msn) {
            self.stats.rx_skipped += 1;
            return;
        }
        p.skip_tagged = None;
        if ext.is_some() {
            if p.rx_tagged.is_some_and(|(m, _)| m != msn) {
                // The previous message never ended (its sender gave up
                // on it).
                self.stats.rx_inconsistent += 1;
                p.rx_tagged = None;
            }
            let expected = p.rx_tagged.map_or(0, |(_, next)| next);
            if mo != expected {
                // A segment from the middle of a message whose beginning
                // (or the segment before) was not received here: a restart
                // on either side, or a hostile sender. Not placed.
                self.stats.rx_orphan_segments += 1;
                p.rx_tagged = None;
                if !repr.last {
                    p.skip_tagged = Some(msn);
                }
                let cause = TerminateCause::RdmapCatastrophicStream;
                self.queue_terminate(src, TermSpec::about(cause, seg, msn));
                return;
            }
            let end = u64::from(mo) + payload.len() as u64;
            p.rx_tagged = match u32::try_from(end) {
                Ok(next) if !repr.last => Some((msn, next)),
                _ => None,
            };
        }
        let record = repr.opcode == Opcode::WriteRecord;
        // A Write-Record segment the tracker will drop as stale (a late
        // segment of a message already retired) is checked, not placed:
        // memory changes only where the log says.
        let res = self
            .tracker
            .place_tagged(mem, record, src, stag, to, mo, msn, payload);
        if let Err(error) = res {
            self.stats.rx_access_errors += 1;
            self.push_event(DgramEvent::RemoteAccess {
                src,
                opcode: repr.opcode,
                msn,
                stag,
                to,
                len: payload.len() as u32,
                error,
            });
            if let Some(p) = self.peers.get_mut(&src) {
                p.rx_tagged = None;
                if !repr.last && ext.is_some() {
                    p.skip_tagged = Some(msn);
                }
            }
            self.queue_terminate(src, TermSpec::about(error.terminate_cause(true), seg, msn));
            return;
        }
        if record {
            self.stats.rx_record_segments += 1;
            self.tracker
                .placed(src, stag, to, mo, msn, payload.len() as u32, repr.last, now);
            self.drain_tracker();
        } else {
            self.stats.rx_write_segments += 1;
        }
    }

    /// Whether a new Read / atomic from `src` fits IRD and the pool.
    pub(super) fn ird_room(&self, src: DgramAddr) -> bool {
        self.peers
            .get(&src)
            .is_some_and(|p| p.ird_used < self.cfg.ird)
            && self.in_free.len() > self.term_reserve
    }

    pub(super) fn rx_read_request<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        seg: &[u8],
        mem: &mut M,
    ) {
        let (DdpHeader::Untagged { qn, msn, .. }, RdmapBody::ReadRequest(req)) =
            (repr.ddp, repr.body)
        else {
            return;
        };
        let mut spec = TermSpec::about(TerminateCause::DdpUntaggedInvalidQn, seg, msn);
        spec.rdmap = Some(req.to_bytes());
        if qn != 1 {
            self.stats.rx_inconsistent += 1;
            return self.queue_terminate(src, spec);
        }
        if !self.ird_room(src) {
            self.stats.rx_ird_exceeded += 1;
            spec.cause = TerminateCause::MpaInsufficientIrd;
            return self.queue_terminate(src, spec);
        }
        if let Err(error) = mem.remote_read(req.src_stag, req.src_to, u64::from(req.size)) {
            self.stats.rx_access_errors += 1;
            self.push_event(DgramEvent::RemoteAccess {
                src,
                opcode: Opcode::ReadRequest,
                msn,
                stag: req.src_stag,
                to: req.src_to,
                len: req.size,
                error,
            });
            spec.cause = error.terminate_cause(false);
            return self.queue_terminate(src, spec);
        }
        let room = self.room(src.ip, true);
        let nsegs = u64::from(req.size).div_ceil(u64::from(room)).max(1) as u32;
        self.stats.rx_read_requests += 1;
        self.add_inbound(src, InKind::Read { req, msn }, room, nsegs);
    }

    pub(super) fn add_inbound(&mut self, src: DgramAddr, kind: InKind, room: u32, nsegs: u32) {
        let Some(slot) = self.alloc_in(false) else {
            return;
        };
        self.inb[slot as usize].e = Some(InEntry {
            peer: src,
            kind,
            room,
            nsegs,
            pumped: 0,
            resolved: 0,
            ird: true,
            dead: false,
            reported: false,
            abort_msn: 0,
            in_fifo: false,
            next: NIL,
        });
        if let Some(p) = self.peers.get_mut(&src) {
            p.ird_used += 1;
        }
        self.in_push(src, slot);
        self.mark_ready(src);
    }

    pub(super) fn rx_atomic_request<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        seg: &[u8],
        mem: &mut M,
    ) {
        let (DdpHeader::Untagged { qn, msn, .. }, RdmapBody::AtomicRequest(req)) =
            (repr.ddp, repr.body)
        else {
            return;
        };
        let mut spec = TermSpec::about(TerminateCause::DdpUntaggedInvalidQn, seg, msn);
        if qn != 1 {
            self.stats.rx_inconsistent += 1;
            return self.queue_terminate(src, spec);
        }
        let op = match req.op {
            WireAtomicOp::FetchAdd => AtomicOp::FetchAdd(req.add_swap),
            WireAtomicOp::CompareSwap => AtomicOp::CompareSwap {
                compare: req.compare,
                swap: req.add_swap,
            },
            _ => {
                self.stats.rx_inconsistent += 1;
                spec.cause = TerminateCause::RdmapOperationUnspecified;
                return self.queue_terminate(src, spec);
            }
        };
        if !self.ird_room(src) {
            self.stats.rx_ird_exceeded += 1;
            spec.cause = TerminateCause::MpaInsufficientIrd;
            return self.queue_terminate(src, spec);
        }
        match mem.remote_atomic(req.stag, req.to, op) {
            Ok(orig) => {
                self.stats.rx_atomics += 1;
                let rmsn = self.peers.get_mut(&src).map_or(1, |p| {
                    let m = p.tx_resp;
                    p.tx_resp = m.wrapping_add(1);
                    m
                });
                let resp = AtomicResponse {
                    req_id: req.req_id,
                    orig_value: orig,
                };
                self.add_inbound(src, InKind::Atomic { resp, msn: rmsn }, 0, 1);
            }
            Err(error) => {
                self.stats.rx_access_errors += 1;
                self.push_event(DgramEvent::RemoteAccess {
                    src,
                    opcode: Opcode::AtomicRequest,
                    msn,
                    stag: req.stag,
                    to: req.to,
                    len: 8,
                    error,
                });
                spec.cause = error.terminate_cause(false);
                self.queue_terminate(src, spec);
            }
        }
    }

    /// The oldest unfinished request to `peer` that `pred` accepts.
    pub(super) fn find_sq(&self, peer: DgramAddr, pred: impl Fn(&SqEntry) -> bool) -> Option<u32> {
        self.sq
            .iter()
            .enumerate()
            .find(|(_, s)| s.e.is_some_and(|e| e.dest == peer && !e.done && pred(&e)))
            .map(|(i, _)| i as u32)
    }

    pub(super) fn rx_read_response<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        payload: &[u8],
        mem: &mut M,
    ) {
        let DdpHeader::Tagged {
            stag,
            to,
            ext: Some(TaggedExt { msn, mo }),
        } = repr.ddp
        else {
            self.stats.rx_unmatched_responses += 1;
            return;
        };
        let is_it = |e: &SqEntry| e.kind == Kind::Read && e.awaiting && e.msn == msn;
        // The Read being answered is usually the one answered last.
        let hint = self.peers.get(&src).map_or(NIL, |p| p.read_hint);
        let hinted = self
            .sq
            .get(hint as usize)
            .and_then(|s| s.e)
            .is_some_and(|e| e.dest == src && !e.done && is_it(&e));
        let found = if hinted {
            Some(hint)
        } else {
            self.find_sq(src, is_it)
        };
        let Some(slot) = found else {
            self.stats.rx_unmatched_responses += 1;
            return;
        };
        if let Some(p) = self.peers.get_mut(&src) {
            p.read_hint = slot;
        }
        let Some(e) = self.sq[slot as usize].e else {
            return;
        };
        let Payload::Sgl(sgl) = e.wr.payload else {
            return;
        };
        let first = sgl.as_slice().first().copied().unwrap_or_default();
        let size = sgl.total_len();
        let end = u64::from(mo) + payload.len() as u64;
        let fits = stag == first.lkey
            && to.wrapping_sub(u64::from(mo)) == first.addr
            && mo == e.received
            && end <= size
            && (!repr.last || end == size);
        if !fits {
            self.stats.rx_inconsistent += 1;
            return self.complete(slot, WcStatus::RemOpErr, 0);
        }
        if !payload.is_empty() && scatter(mem, &sgl, u64::from(mo), payload).is_err() {
            return self.complete(slot, WcStatus::LocProtErr, 0);
        }
        self.stats.rx_read_segments += 1;
        if let Some(e) = self.sq[slot as usize].e.as_mut() {
            e.received = end as u32;
        }
        if repr.last {
            self.complete(slot, WcStatus::Success, size as u32);
        }
    }

    pub(super) fn rx_atomic_response<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        mem: &mut M,
    ) {
        let RdmapBody::AtomicResponse(resp) = repr.body else {
            return;
        };
        let Some(slot) = self.find_sq(src, |e| {
            e.kind == Kind::Atomic && e.awaiting && e.msn == resp.req_id
        }) else {
            self.stats.rx_unmatched_responses += 1;
            return;
        };
        let Some(Payload::Sgl(sgl)) = self.sq[slot as usize].e.map(|e| e.wr.payload) else {
            return;
        };
        match scatter(mem, &sgl, 0, &resp.orig_value.to_ne_bytes()) {
            Ok(()) => self.complete(slot, WcStatus::Success, 8),
            Err(_) => self.complete(slot, WcStatus::LocProtErr, 0),
        }
    }

    pub(super) fn rx_terminate(&mut self, src: DgramAddr, repr: &SegmentRepr) {
        self.stats.rx_terminates += 1;
        let (
            DdpHeader::Untagged {
                rsvd_ulp: about, ..
            },
            RdmapBody::Terminate(t),
        ) = (repr.ddp, repr.body)
        else {
            return;
        };
        let Some(echo) = t.ddp_header else {
            self.stats.rx_unmatched_terminates += 1;
            return;
        };
        let v = echo.view();
        let tagged = v.tagged();
        let qn = v.qn();
        if t.cause == TerminateCause::RdmapLocalCatastrophic {
            // The sender of a message we are receiving aborted it (one
            // such Terminate per datagram it had queued).
            if let Some(p) = self.peers.get_mut(&src) {
                if tagged {
                    p.skip_tagged = Some(about);
                    if p.rx_tagged.is_some_and(|(m, _)| m == about) {
                        p.rx_tagged = None;
                    }
                } else if qn == Some(0) {
                    if let Some(m) = p.rx.filter(|m| m.msn == about) {
                        p.rx = None;
                        self.rq.give_back(m.seq, m.wr);
                        self.stats.rx_aborted += 1;
                    }
                    if let Some(p) = self.peers.get_mut(&src) {
                        p.skip_send = Some(about);
                    }
                }
            }
            return;
        }
        // About a message of ours.
        let status = status_of(t.cause);
        let slot = if tagged {
            self.find_sq(src, |e| {
                matches!(e.kind, Kind::Write | Kind::WriteRecord) && e.started && e.msn == about
            })
        } else {
            match qn {
                Some(0) => {
                    self.find_sq(src, |e| e.kind == Kind::Send && e.started && e.msn == about)
                }
                Some(1) => self.find_sq(src, |e| {
                    matches!(e.kind, Kind::Read | Kind::Atomic) && e.started && e.msn == about
                }),
                _ => None,
            }
        };
        match slot {
            Some(s) => self.complete(s, status, 0),
            None => self.stats.rx_unmatched_terminates += 1,
        }
    }
}
