//! Receive: stream octets in, FPDUs deframed, headers checked, payload
//! placed, messages completed.
//!
//! Contract: every rule a segment breaks becomes a Terminate; with CRC
//! an FPDU is verified before it is acted on unless direct placement of
//! a large FPDU was chosen (`RcConfig::crc_direct_min`), in which case
//! nothing of it completes before its CRC has been checked.

use super::*;

impl RcQp {
    /// Feeds octets received from the peer (any split). Placement happens
    /// as payload arrives; completions and errors become visible through
    /// [`RcQp::poll_completion`] and [`RcQp::poll_event`].
    pub fn handle_bytes<M: Memory>(&mut self, data: &[u8], mem: &mut M) {
        self.handle_bytes_from(data, mem, None);
    }

    /// As [`RcQp::handle_bytes`], taking receives from a shared receive
    /// queue instead of the QP's own.
    pub fn handle_bytes_with_srq<M: Memory>(
        &mut self,
        data: &[u8],
        mem: &mut M,
        srq: &mut RecvQueue,
    ) {
        self.handle_bytes_from(data, mem, Some(srq));
    }

    pub(super) fn handle_bytes_from<M: Memory>(
        &mut self,
        data: &[u8],
        mem: &mut M,
        srq: Option<&mut RecvQueue>,
    ) {
        if self.rx_held.is_empty() {
            return self.rx_feed(data, mem, srq);
        }
        // `RcConfig::rnr_wait`: octets held go first. While the Send at
        // their front still finds no receive, new ones join them.
        let no_recv = srq.as_deref().map_or(self.rq.is_empty(), |q| q.is_empty());
        if self.state == RcState::Error || (self.rx_paused && no_recv) {
            if self.state != RcState::Error {
                self.rx_held.extend_from_slice(data);
            }
            return;
        }
        let mut held = std::mem::take(&mut self.rx_held);
        self.rx_paused = false;
        held.extend_from_slice(data);
        self.rx_feed(&held, mem, srq);
        if self.rx_held.is_empty() && self.state != RcState::Error {
            // Its room is kept for the next pause.
            held.clear();
            self.rx_held = held;
        }
    }

    /// The receive path proper: `data` follows what was fed before.
    fn rx_feed<M: Memory>(
        &mut self,
        mut data: &[u8],
        mem: &mut M,
        mut srq: Option<&mut RecvQueue>,
    ) {
        loop {
            if self.state == RcState::Error || data.is_empty() {
                // Nothing more is accepted after an error; and empty input
                // cannot complete anything (every event is reported by the
                // call that consumed its last octet).
                return;
            }
            if self.rx_paused {
                // A stashed Send waits (`rx_stash_complete`): what follows
                // it waits too.
                self.rx_hold(data, false);
                return;
            }
            // A partial FPDU waits: complete it first.
            if self.rx_stash_len > 0 {
                let need = self.rx_stash_need();
                let take = need.min(data.len());
                self.stash(&data[..take]);
                data = &data[take..];
                self.rx_stash_complete(mem, srq.as_deref_mut());
                continue;
            }
            // Receiver not ready: a Send with no receive waits here, before
            // anything of it is acted on; a start too short to tell waits
            // for more, unless the stash keeps it whole anyway.
            if self.rnr_point() {
                match self.rnr_must_wait(data, srq.as_deref()) {
                    Some(true) => return self.rx_hold(data, true),
                    None if !self.stashes() || self.streams_crc(data) => {
                        return self.rx_hold(data, false)
                    }
                    _ => {}
                }
            }
            // Fast path: a whole FPDU at the front is verified (CRC) before
            // any of it is acted on, then handled in one go.
            match self.deframer.decode_whole(data) {
                Ok(Some((n, w))) => {
                    data = &data[n..];
                    if !self.rx_shortcut(&w, mem, srq.as_deref_mut()) {
                        self.rx_whole(w, mem, srq.as_deref_mut());
                    }
                    continue;
                }
                Ok(None) if self.stashes() && !self.streams_crc(data) => {
                    // Only part of an FPDU: kept until the rest arrives.
                    self.stash(data);
                    return;
                }
                Ok(None) => {}
                Err(e) => {
                    if e == WireError::BadCrc {
                        self.rx_crc_failed_send(data, srq.as_deref_mut());
                    }
                    self.rx_stream_error(e);
                    return;
                }
            }
            let (n, ev) = match self.deframer.decode(data) {
                Ok(x) => x,
                Err(e) => {
                    self.rx_stream_error(e);
                    return;
                }
            };
            // Copy the event out of the deframer's borrow.
            let ev = match ev {
                None => None,
                Some(Event::Header(h)) => {
                    let mut buf = [0u8; fpdu::MAX_HEADER];
                    buf[..h.len()].copy_from_slice(h);
                    Some(RxEv::Header(buf, h.len()))
                }
                // Payload octets are the tail of what this step consumed
                // (a marker, if any, comes before them).
                Some(Event::Payload(p)) => Some(RxEv::Payload(p.len())),
                Some(Event::End { .. }) => Some(RxEv::End),
            };
            let consumed = &data[..n];
            data = &data[n..];
            match ev {
                None if n == 0 => return,
                None => {}
                Some(RxEv::Header(buf, len)) => {
                    self.rx_any = true;
                    let ulpdu_len = self.deframer.ulpdu_len();
                    self.rx_header(&buf[..len], ulpdu_len, mem, srq.as_deref_mut());
                }
                Some(RxEv::Payload(len)) => self.rx_payload(&consumed[n - len..], mem),
                Some(RxEv::End) => self.rx_fpdu_end(mem, srq.as_deref_mut()),
            }
        }
    }

    /// The commonest FPDUs, handled without the general receive machinery
    /// (header representation, segment and receive state, deferred
    /// errors), when they arrive whole and verified between messages in
    /// the RTS state:
    ///
    /// * a plain Send or Send with Solicited Event in one segment (DDP
    ///   control exactly T=0 L=1 DV=1, RDMAP control exactly RV=1 and the
    ///   opcode, Invalidate STag 0, QN 0, MO 0, the expected MSN), with no
    ///   Immediate Data pending and a posted receive large enough whose
    ///   memory takes the payload: the receive is taken, the payload
    ///   placed, the MSN advanced, a successful receive completion queued
    ///   (and the receive limit event, if it fires);
    /// * an RDMA Write in one segment (T=1 L=1 DV=1, RV=1) that continues
    ///   no earlier segment and whose STag, offset and rights pass: the
    ///   payload is placed.
    ///
    /// The outcome is the general path's. Returns false when the FPDU is
    /// anything else, or its receive or memory is missing, too small or
    /// refuses it; nothing is changed then (beyond memory already written
    /// with the octets the general path writes there again), and the
    /// caller hands the FPDU to the general path, which reports every error
    /// as it always has.
    pub(super) fn rx_shortcut<M: Memory>(
        &mut self,
        w: &fpdu::WholeFpdu<'_>,
        mem: &mut M,
        srq: Option<&mut RecvQueue>,
    ) -> bool {
        const LAST_UNTAGGED: u8 = ddp::FLAG_L | ddp::DDP_VERSION;
        const LAST_TAGGED: u8 = ddp::FLAG_T | ddp::FLAG_L | ddp::DDP_VERSION;
        if self.state != RcState::Rts
            || self.awaiting_rtr.is_some()
            || self.rx_seg.is_some()
            || self.rx_deferred.is_some()
        {
            return false;
        }
        let h = w.header;
        let word = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let write = Opcode::RdmaWrite.control_octet();
        if h.len() == ddp::TAGGED_HEADER_LEN && h[0] == LAST_TAGGED && h[1] == write {
            if self.rx_tagged.is_some() || self.rx_write_open {
                return false;
            }
            let (stag, to) = (word(2), u64::from(word(6)) << 32 | u64::from(word(10)));
            let len = w.payload.len() as u64;
            // `remote_write` checks STag, bounds and rights before it
            // writes anything.
            if len > 0 && mem.remote_write(stag, to, w.payload).is_err() {
                return false;
            }
            self.rx_any = true;
            self.rx_write_len = len;
            return true;
        }
        if h.len() != ddp::UNTAGGED_HEADER_LEN
            || self.rx_recv.is_some()
            || self.rx_pending_imm.is_some()
        {
            return false;
        }
        let solicited = match (h[0], h[1]) {
            (LAST_UNTAGGED, c) if c == Opcode::Send.control_octet() => false,
            (LAST_UNTAGGED, c) if c == Opcode::SendSe.control_octet() => true,
            _ => return false,
        };
        // Invalidate STag, QN, MSN, MO.
        if word(2) != 0 || word(6) != 0 || word(10) != self.rx_msn[0] || word(14) != 0 {
            return false;
        }
        let q = match srq {
            Some(q) => q,
            None => &mut self.rq,
        };
        let Some(front) = q.wrs.front() else {
            return false;
        };
        if w.payload.len() as u64 > front.sgl.total_len()
            || scatter(mem, &front.sgl, 0, w.payload).is_err()
        {
            return false;
        }
        let (Some(wr), fired) = q.take() else {
            return false;
        };
        self.rx_any = true;
        if fired {
            self.events.push_back(RcEvent::RecvLimitReached);
        }
        self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
        let mut wc = WorkCompletion::new(
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            w.payload.len() as u32,
        );
        wc.solicited = solicited;
        self.completions.push_back((CqKind::Recv, wc));
        true
    }

    /// Acts on a whole FPDU whose CRC was verified.
    pub(super) fn rx_whole<M: Memory>(
        &mut self,
        w: fpdu::WholeFpdu<'_>,
        mem: &mut M,
        mut srq: Option<&mut RecvQueue>,
    ) {
        self.rx_any = true;
        self.rx_header(w.header, w.ulpdu_len, mem, srq.as_deref_mut());
        if self.state == RcState::Error {
            return;
        }
        if !w.payload.is_empty() {
            self.rx_payload(w.payload, mem);
            if self.state == RcState::Error {
                return;
            }
        }
        self.rx_fpdu_end(mem, srq);
    }

    /// The FPDU ended (CRC checked): a rule its header broke is reported
    /// now, otherwise the segment completes.
    pub(super) fn rx_fpdu_end<M: Memory>(&mut self, mem: &mut M, srq: Option<&mut RecvQueue>) {
        match self.rx_deferred.take() {
            Some((cause, rr)) => {
                self.rx_error(cause, rr);
                self.rx_seg = None;
            }
            None => self.rx_end(mem, srq),
        }
    }

    /// A whole FPDU at the front of `fpdu` failed its CRC before anything
    /// of it was acted on. If its (unverified) header starts a Send, the
    /// receive it would have taken completes with a remote operation error
    /// — as when a Send streamed in fails its CRC at the end (the receive
    /// was taken by then) — instead of merely flushing.
    pub(super) fn rx_crc_failed_send(&mut self, fpdu: &[u8], srq: Option<&mut RecvQueue>) {
        if self.rx_recv.is_some() || fpdu.len() < fpdu::LEN_FIELD {
            return;
        }
        let ulpdu = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
        let end = (fpdu::LEN_FIELD + ulpdu).min(fpdu.len());
        let Ok((repr, _)) = SegmentRepr::parse(&fpdu[fpdu::LEN_FIELD..end], Mode::Stream) else {
            return;
        };
        let send = matches!(
            repr.opcode,
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate
        );
        if !send || !matches!(repr.ddp, DdpHeader::Untagged { qn: 0, mo: 0, .. }) {
            return;
        }
        let (wr, fired) = match srq {
            Some(q) => q.take(),
            None => self.rq.take(),
        };
        if fired {
            self.events.push_back(RcEvent::RecvLimitReached);
        }
        if let Some(wr) = wr {
            self.completions.push_back((
                CqKind::Recv,
                WorkCompletion::new(wr.wr_id, WcStatus::RemOpErr, WcOpcode::Recv, 0),
            ));
        }
    }

    /// The MPA stream broke (CRC, marker): Terminate, and the stream ends.
    pub(super) fn rx_stream_error(&mut self, e: WireError) {
        let cause = match e {
            WireError::BadCrc => TerminateCause::MpaCrcError,
            WireError::BadMarker => TerminateCause::MpaMarkerMismatch,
            _ => TerminateCause::MpaLocalCatastrophic,
        };
        self.rx_seg = None;
        self.fail_rx_recv();
        self.fail(
            Some(TerminateRepr::new(cause)),
            false,
            Some(WcStatus::RemOpErr),
        );
    }

    /// Acts on the header of a segment (`h`, of an ULPDU of `ulpdu_len`
    /// octets): checks it against the rules of its opcode and chooses where
    /// its payload goes. A broken rule is reported at the segment's end.
    pub(super) fn rx_header<M: Memory>(
        &mut self,
        h: &[u8],
        ulpdu_len: usize,
        mem: &mut M,
        srq: Option<&mut RecvQueue>,
    ) {
        let echo = EchoedHeader::from_segment(h).ok();
        let repr = match SegmentRepr::parse(h, Mode::Stream) {
            Ok((r, hlen)) if hlen == h.len() || matches!(r.body, RdmapBody::Terminate(_)) => r,
            Ok((r, _)) => {
                // An opcode-specific header with trailing payload where none
                // is allowed is caught below by the per-opcode rules.
                r
            }
            Err(e) => return self.rx_header_unparsable(h, echo, e),
        };
        let payload_len = (ulpdu_len - repr.header_len().min(ulpdu_len)) as u64;
        self.rx_seg = Some(RxSeg {
            repr,
            echo,
            payload_len,
            target: Target::Discard,
            placed: 0,
        });
        if let Some(expect) = self.awaiting_rtr {
            if self.rx_awaited_rtr(expect, &repr, payload_len) {
                return;
            }
        }
        let untagged = match repr.ddp {
            DdpHeader::Untagged {
                qn,
                msn,
                mo,
                rsvd_ulp,
            } => Some((qn, msn, mo, rsvd_ulp)),
            DdpHeader::Tagged { .. } => None,
        };
        let ext = self.cfg.softrdma_ext;
        match repr.opcode {
            Opcode::RdmaWrite | Opcode::ReadResponse => {
                self.rx_tagged_header(&repr, payload_len, mem)
            }
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate => {
                let (qn, msn, mo, _) = untagged.expect("untagged opcode");
                self.rx_send_header(repr.opcode, qn, msn, mo, payload_len, srq)
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe if ext => {
                let (qn, msn, mo, _) = untagged.expect("untagged opcode");
                if qn != 0 || mo != 0 || payload_len != 0 {
                    return self.defer_error(TerminateCause::DdpUntaggedInvalidQn, false);
                }
                if msn != self.rx_msn[0] || self.rx_recv.is_some() {
                    self.defer_error(TerminateCause::DdpUntaggedMsnRange, false)
                }
            }
            Opcode::ReadRequest => {
                let (qn, msn, _, _) = untagged.expect("untagged opcode");
                self.rx_read_request_header(&repr, qn, msn, payload_len, mem)
            }
            Opcode::AtomicRequest if ext => {
                let (qn, msn, _, _) = untagged.expect("untagged opcode");
                if qn != 1 {
                    return self.defer_error(TerminateCause::DdpUntaggedInvalidQn, false);
                }
                if msn != self.rx_msn[1] || payload_len != 0 {
                    return self.defer_error(TerminateCause::DdpUntaggedMsnRange, false);
                }
                if self.ird.len() >= usize::from(self.cfg.ird) {
                    self.defer_error(TerminateCause::RdmapCatastrophicStream, false)
                }
            }
            Opcode::AtomicResponse if ext => {
                let (qn, msn, _, _) = untagged.expect("untagged opcode");
                self.rx_atomic_response_header(&repr, qn, msn, payload_len)
            }
            Opcode::Terminate => {}
            _ => self.defer_error(TerminateCause::RdmapUnexpectedOpcode, false),
        }
    }

    /// A header that does not parse: the segment is discarded and the
    /// Terminate (bad DDP or RDMAP version, or a damaged stream) is
    /// reported at its end.
    fn rx_header_unparsable(&mut self, h: &[u8], echo: Option<EchoedHeader>, e: WireError) {
        let tagged = h.first().is_some_and(|b| b & ddp::FLAG_T != 0);
        let cause = match e {
            WireError::BadVersion if h[0] & ddp::DV_MASK != ddp::DDP_VERSION => {
                if tagged {
                    TerminateCause::DdpTaggedInvalidVersion
                } else {
                    TerminateCause::DdpUntaggedInvalidVersion
                }
            }
            WireError::BadVersion => TerminateCause::RdmapInvalidVersion,
            _ => TerminateCause::RdmapCatastrophicStream,
        };
        self.rx_seg = Some(RxSeg {
            repr: tagged_placeholder(),
            echo,
            payload_len: 0,
            target: Target::Discard,
            placed: 0,
        });
        self.defer_error(cause, false);
    }

    /// The first segment a P2P responder receives must be the RTR it
    /// awaits (`expect`; `None`: any). Data may flow from now on. Returns
    /// true if the segment needs no further processing (a zero-length
    /// Write or Send RTR, or a mismatch, which is reported); a Read RTR is
    /// answered like any zero-length Read.
    fn rx_awaited_rtr(&mut self, expect: Option<RtrKind>, repr: &SegmentRepr, len: u64) -> bool {
        self.awaiting_rtr = None;
        self.state = RcState::Rts;
        let is_rtr = match (expect, repr.opcode, repr.ddp) {
            (Some(RtrKind::Write), Opcode::RdmaWrite, _) => len == 0,
            (Some(RtrKind::Send), Opcode::Send, _) => len == 0,
            (Some(RtrKind::Read), Opcode::ReadRequest, _) => {
                matches!(repr.body, RdmapBody::ReadRequest(r) if r.size == 0)
            }
            _ => false,
        };
        if is_rtr {
            match repr.opcode {
                Opcode::ReadRequest => false,
                Opcode::Send => {
                    self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
                    true
                }
                _ => true,
            }
        } else if expect.is_some() {
            self.defer_error(TerminateCause::MpaNoMatchingRtr, false);
            true
        } else {
            false
        }
    }

    /// The header of an RDMA Write or Read Response segment: it must
    /// continue the tagged message in progress, and its target must be
    /// writable (Write) or exactly the awaited Read's sink (Read Response).
    #[inline]
    fn rx_tagged_header<M: Memory>(&mut self, repr: &SegmentRepr, payload_len: u64, mem: &mut M) {
        let DdpHeader::Tagged { stag, to, .. } = repr.ddp else {
            return self.defer_error(TerminateCause::RdmapUnexpectedOpcode, false);
        };
        // A continuation must follow on from the previous segment.
        if let Some((s, next)) = self.rx_tagged {
            if s != stag || next != to {
                return self.defer_error(TerminateCause::DdpTaggedBaseBounds, false);
            }
        }
        if repr.opcode == Opcode::RdmaWrite {
            if !self.rx_write_open {
                self.rx_write_open = true;
                self.rx_write_len = 0;
            }
            if payload_len > 0 {
                if let Err(e) = mem.check_remote_write(stag, to, payload_len) {
                    return self.defer_error(e.terminate_cause(true), false);
                }
                self.set_target(Target::Write { stag, to });
            }
        } else {
            let Some(OrdEntry {
                kind:
                    OrdKind::Read {
                        sink_stag,
                        sink_to,
                        size,
                        received,
                    },
                ..
            }) = self.ord.front().copied()
            else {
                return self.defer_error(TerminateCause::RdmapUnexpectedOpcode, false);
            };
            if stag != sink_stag || to != sink_to.wrapping_add(received) {
                return self.defer_error(TerminateCause::DdpTaggedStagNotAssociated, false);
            }
            if received + payload_len > u64::from(size) {
                return self.defer_error(TerminateCause::DdpTaggedBaseBounds, false);
            }
            self.set_target(Target::ReadResp { offset: received });
        }
        self.rx_tagged = if repr.last {
            None
        } else {
            Some((stag, to.wrapping_add(payload_len)))
        };
    }

    /// The header of a Send segment: the first takes a posted receive
    /// (from the SRQ if there is one), every one must continue the
    /// message in order and fit the receive.
    #[inline]
    fn rx_send_header(
        &mut self,
        opcode: Opcode,
        qn: u32,
        msn: u32,
        mo: u32,
        payload_len: u64,
        srq: Option<&mut RecvQueue>,
    ) {
        if qn != 0 {
            return self.defer_error(TerminateCause::DdpUntaggedInvalidQn, false);
        }
        if mo == 0 && self.rx_recv.is_none() {
            if msn != self.rx_msn[0] {
                return self.defer_error(TerminateCause::DdpUntaggedMsnRange, false);
            }
            let (wr, fired) = match srq {
                Some(q) => q.take(),
                None => self.rq.take(),
            };
            if fired {
                self.events.push_back(RcEvent::RecvLimitReached);
            }
            let Some(wr) = wr else {
                return self.defer_error(TerminateCause::DdpUntaggedNoBuffer, false);
            };
            self.rx_recv = Some(RxRecv {
                wr,
                msn,
                received: 0,
                opcode,
            });
        }
        // By reference: a receive is some 170 octets.
        let Some(r) = &self.rx_recv else {
            return self.defer_error(TerminateCause::DdpUntaggedInvalidMo, false);
        };
        let (r_msn, received, room) = (r.msn, r.received, r.wr.sgl.total_len());
        if msn != r_msn {
            return self.defer_error(TerminateCause::DdpUntaggedMsnRange, false);
        }
        if u64::from(mo) != received {
            return self.defer_error(TerminateCause::DdpUntaggedInvalidMo, false);
        }
        if received + payload_len > room {
            if let Some(r) = self.rx_recv.take() {
                self.completions.push_back((
                    CqKind::Recv,
                    WorkCompletion::new(r.wr.wr_id, WcStatus::LocLenErr, WcOpcode::Recv, 0),
                ));
            }
            return self.defer_error(TerminateCause::DdpUntaggedTooLong, false);
        }
        self.set_target(Target::Recv { offset: received });
    }

    /// The header of a Read Request: in order on QN 1, within IRD, and
    /// (if not zero-length) naming memory the peer may read.
    fn rx_read_request_header<M: Memory>(
        &mut self,
        repr: &SegmentRepr,
        qn: u32,
        msn: u32,
        payload_len: u64,
        mem: &mut M,
    ) {
        let RdmapBody::ReadRequest(req) = repr.body else {
            return self.defer_error(TerminateCause::RdmapCatastrophicStream, false);
        };
        if qn != 1 {
            return self.defer_error(TerminateCause::DdpUntaggedInvalidQn, false);
        }
        if msn != self.rx_msn[1] {
            return self.defer_error(TerminateCause::DdpUntaggedMsnRange, false);
        }
        if payload_len != 0 {
            return self.defer_error(TerminateCause::RdmapCatastrophicStream, false);
        }
        if self.ird.len() >= usize::from(self.cfg.ird) {
            return self.defer_error(TerminateCause::RdmapCatastrophicStream, true);
        }
        if req.size > 0 {
            if let Err(e) = mem.remote_read(req.src_stag, req.src_to, u64::from(req.size)) {
                self.defer_error(e.terminate_cause(false), true)
            }
        }
    }

    /// The header of an Atomic Response: in order on QN 3 and answering
    /// the atomic at the head of ORD.
    fn rx_atomic_response_header(&mut self, repr: &SegmentRepr, qn: u32, msn: u32, len: u64) {
        if qn != 3 || msn != self.rx_msn[3] || len != 0 {
            return self.defer_error(TerminateCause::DdpUntaggedMsnRange, false);
        }
        let RdmapBody::AtomicResponse(resp) = repr.body else {
            return self.defer_error(TerminateCause::RdmapCatastrophicStream, false);
        };
        match self.ord.front() {
            Some(OrdEntry {
                kind: OrdKind::Atomic { req_id },
                ..
            }) if *req_id == resp.req_id => {}
            _ => self.defer_error(TerminateCause::RdmapUnexpectedOpcode, false),
        }
    }

    /// A header broke a rule: discard the segment's payload and send the
    /// Terminate once the FPDU's CRC has verified (a CRC failure takes
    /// precedence: the header itself may be what was corrupted).
    pub(super) fn defer_error(&mut self, cause: TerminateCause, with_read_request: bool) {
        self.set_target(Target::Discard);
        self.rx_deferred = Some((cause, with_read_request));
    }

    pub(super) fn set_target(&mut self, t: Target) {
        if let Some(seg) = &mut self.rx_seg {
            seg.target = t;
        }
    }

    pub(super) fn rx_payload<M: Memory>(&mut self, chunk: &[u8], mem: &mut M) {
        // Only the placement state is copied out (the segment's header
        // representation is not needed here).
        let Some(seg) = &mut self.rx_seg else { return };
        let (at, target) = (seg.placed, seg.target);
        seg.placed += chunk.len() as u64;
        let res: Result<(), MemError> = match target {
            Target::Discard => Ok(()),
            Target::Write { stag, to } => mem.remote_write(stag, to.wrapping_add(at), chunk),
            Target::ReadResp { offset } => {
                let Some(OrdEntry { seq: Some(seq), .. }) = self.ord.front().copied() else {
                    return;
                };
                let Some(Payload::Sgl(sgl)) = self.sq_entry_mut(seq).map(|e| &e.wr.payload) else {
                    return;
                };
                scatter(mem, sgl, offset + at, chunk)
            }
            Target::Recv { offset } => {
                let Some(r) = &self.rx_recv else { return };
                scatter(mem, &r.wr.sgl, offset + at, chunk)
            }
        };
        if let Err(e) = res {
            match target {
                Target::Write { .. } => self.rx_error(e.terminate_cause(true), false),
                Target::ReadResp { .. } => {
                    self.set_target(Target::Discard);
                    self.fail(None, false, Some(WcStatus::LocProtErr));
                }
                _ => {
                    if let Some(r) = self.rx_recv.take() {
                        self.completions.push_back((
                            CqKind::Recv,
                            WorkCompletion::new(
                                r.wr.wr_id,
                                WcStatus::LocProtErr,
                                WcOpcode::Recv,
                                0,
                            ),
                        ));
                    }
                    self.rx_error(TerminateCause::DdpLocalCatastrophic, false);
                }
            }
        }
    }

    /// Acts on the end of the segment in progress (its payload placed):
    /// completes what it finishes and answers or queues what it asks for.
    pub(super) fn rx_end<M: Memory>(&mut self, mem: &mut M, srq: Option<&mut RecvQueue>) {
        let Some(seg) = self.rx_seg.take() else {
            return;
        };
        if self.state == RcState::Error {
            return;
        }
        let repr = seg.repr;
        match repr.opcode {
            Opcode::RdmaWrite => {
                self.rx_write_len += seg.payload_len;
                if repr.last {
                    self.rx_write_open = false;
                }
            }
            Opcode::ReadResponse => self.rx_end_read_response(seg.payload_len, repr.last),
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate => {
                self.rx_end_send(seg, mem)
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe => self.rx_end_immediate(seg, srq),
            Opcode::ReadRequest => {
                let RdmapBody::ReadRequest(req) = repr.body else {
                    return;
                };
                self.rx_msn[1] = self.rx_msn[1].wrapping_add(1);
                self.ird.push_back(IrdEntry::Read { req, sent: 0 });
            }
            Opcode::AtomicRequest => self.rx_end_atomic_request(seg, mem),
            Opcode::AtomicResponse => self.rx_end_atomic_response(&repr, mem),
            Opcode::Terminate => {
                let RdmapBody::Terminate(t) = repr.body else {
                    return;
                };
                self.rx_end_terminate(t);
            }
            _ => {}
        }
    }

    /// Reports the segment `seg` broke a rule found at its end: the
    /// Terminate echoes its header.
    fn rx_end_error(&mut self, seg: RxSeg, cause: TerminateCause) {
        self.rx_seg = Some(seg);
        self.rx_error(cause, false);
        self.rx_seg = None;
    }

    /// The end of a Read Response segment: the last one completes the
    /// Read at the head of ORD if it filled the sink exactly.
    #[inline]
    fn rx_end_read_response(&mut self, payload_len: u64, last: bool) {
        let Some(front) = self.ord.front_mut() else {
            return;
        };
        let OrdKind::Read { size, received, .. } = &mut front.kind else {
            return;
        };
        *received += payload_len;
        if last {
            let (size, received) = (*size, *received);
            let seq = front.seq;
            self.ord.pop_front();
            if received != u64::from(size) {
                return self.rx_error(TerminateCause::DdpTaggedBaseBounds, false);
            }
            if let Some(seq) = seq {
                // A Write's placement probe completes the Write, whose
                // length is its own.
                let len = match self.sq_entry_mut(seq) {
                    Some(e) if matches!(e.wr.op, SendOp::Write { .. }) => e.wr.payload.len() as u32,
                    _ => size,
                };
                self.complete_seq(seq, WcStatus::Success, len);
            }
        }
    }

    /// The end of a Send segment: the last one completes the receive
    /// (with the immediate data announced for it, and after invalidating
    /// the STag of a Send with Invalidate).
    #[inline]
    fn rx_end_send<M: Memory>(&mut self, seg: RxSeg, mem: &mut M) {
        let repr = seg.repr;
        let Some(r) = &mut self.rx_recv else { return };
        r.received += seg.payload_len;
        if !repr.last {
            return;
        }
        let r = self.rx_recv.take().expect("receive in progress");
        self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
        let mut wc = WorkCompletion::new(
            r.wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            r.received as u32,
        );
        wc.solicited = matches!(r.opcode, Opcode::SendSe | Opcode::SendSeInvalidate);
        wc.imm = self.rx_pending_imm.take();
        if matches!(r.opcode, Opcode::SendInvalidate | Opcode::SendSeInvalidate) {
            let DdpHeader::Untagged { rsvd_ulp: stag, .. } = repr.ddp else {
                return;
            };
            if let Err(e) = mem.invalidate(stag, true) {
                self.completions.push_back((
                    CqKind::Recv,
                    WorkCompletion::new(r.wr.wr_id, WcStatus::RemInvReqErr, WcOpcode::Recv, 0),
                ));
                let mut seg = seg;
                seg.target = Target::Discard;
                return self.rx_end_error(seg, e.terminate_cause(false));
            }
            wc.invalidated = Some(stag);
        }
        self.completions.push_back((CqKind::Recv, wc));
    }

    /// The end of an Immediate Data message: it either belongs to the
    /// Send that follows, or (after an RDMA Write) consumes a receive and
    /// completes as a Write with immediate.
    fn rx_end_immediate(&mut self, seg: RxSeg, srq: Option<&mut RecvQueue>) {
        let repr = seg.repr;
        let RdmapBody::Immediate(v) = repr.body else {
            return;
        };
        self.rx_msn[0] = self.rx_msn[0].wrapping_add(1);
        let imm = v as u32;
        if v & (1 << 32) != 0 {
            self.rx_pending_imm = Some(imm);
            return;
        }
        // Write with immediate: consumes a receive.
        let (wr, fired) = match srq {
            Some(q) => q.take(),
            None => self.rq.take(),
        };
        if fired {
            self.events.push_back(RcEvent::RecvLimitReached);
        }
        let Some(wr) = wr else {
            return self.rx_end_error(seg, TerminateCause::DdpUntaggedNoBuffer);
        };
        let mut wc = WorkCompletion::new(
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            self.rx_write_len.min(u64::from(u32::MAX)) as u32,
        );
        wc.imm = Some(imm);
        wc.solicited = repr.opcode == Opcode::ImmediateDataSe;
        self.completions.push_back((CqKind::Recv, wc));
    }

    /// The end of an Atomic Request: executes it on local memory and
    /// queues the response (IRD).
    fn rx_end_atomic_request<M: Memory>(&mut self, seg: RxSeg, mem: &mut M) {
        let RdmapBody::AtomicRequest(req) = seg.repr.body else {
            return;
        };
        self.rx_msn[1] = self.rx_msn[1].wrapping_add(1);
        let op = match req.op {
            WireAtomicOp::FetchAdd => AtomicOp::FetchAdd(req.add_swap),
            WireAtomicOp::CompareSwap => AtomicOp::CompareSwap {
                compare: req.compare,
                swap: req.add_swap,
            },
            _ => return self.rx_end_error(seg, TerminateCause::RdmapOperationUnspecified),
        };
        match mem.remote_atomic(req.stag, req.to, op) {
            Ok(orig) => self.ird.push_back(IrdEntry::Atomic {
                req_id: req.req_id,
                orig,
            }),
            Err(e) => self.rx_end_error(seg, e.terminate_cause(false)),
        }
    }

    /// The end of an Atomic Response: the original value goes to the
    /// requesting work request's buffer, which then completes.
    fn rx_end_atomic_response<M: Memory>(&mut self, repr: &SegmentRepr, mem: &mut M) {
        let RdmapBody::AtomicResponse(resp) = repr.body else {
            return;
        };
        self.rx_msn[3] = self.rx_msn[3].wrapping_add(1);
        let Some(front) = self.ord.pop_front() else {
            return;
        };
        let Some(seq) = front.seq else { return };
        let Some(Payload::Sgl(sgl)) = self.sq_entry_mut(seq).map(|e| e.wr.payload) else {
            return;
        };
        match scatter(mem, &sgl, 0, &resp.orig_value.to_ne_bytes()) {
            Ok(()) => self.complete_seq(seq, WcStatus::Success, 8),
            Err(_) => self.fail(None, false, Some(WcStatus::LocProtErr)),
        }
    }

    /// A Terminate from the peer: the QP fails with the status its cause
    /// maps to, and nothing more will be sent.
    fn rx_end_terminate(&mut self, t: TerminateRepr) {
        let status = match t.cause.layer() {
            rdmap::Layer::Rdmap if t.cause.etype() == 1 => WcStatus::RemAccessErr,
            rdmap::Layer::Ddp if t.cause.etype() == 1 => WcStatus::RemAccessErr,
            rdmap::Layer::Ddp if t.cause == TerminateCause::DdpUntaggedNoBuffer => {
                WcStatus::RnrRetryExcErr
            }
            rdmap::Layer::Ddp if t.cause.etype() == 2 => WcStatus::RemInvReqErr,
            _ => WcStatus::RemOpErr,
        };
        self.fail(Some(t), true, Some(status));
        if !self.tx_closed && self.pending.is_empty() {
            self.tx_closed = true;
            self.events.push_back(RcEvent::TxClosed);
        }
    }
}

pub(super) enum RxEv {
    Header([u8; fpdu::MAX_HEADER], usize),
    Payload(usize),
    End,
}
