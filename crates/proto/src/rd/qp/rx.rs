//! RD receive: checking an arriving datagram, passing its shim to the
//! endpoint, and acting on the untagged segments it delivers in order
//! (Sends into posted receives); Terminates for what breaks the rules.
//!
//! Contract: a segment is acted on only after the endpoint delivered it,
//! so exactly once and in order per peer.

use super::*;

impl RdQp {
    /// Takes one UDP payload that arrived from `src_ip:src_port`. The shim
    /// goes to the reliability layer; a segment it delivers is acted on
    /// (placed, scattered, answered). Anything wrong is counted and
    /// dropped or answered with a Terminate; nothing stops the QP.
    pub fn handle_datagram<M: Memory>(
        &mut self,
        src_ip: IpAddr,
        src_port: u16,
        data: &[u8],
        mem: &mut M,
        now: Instant,
    ) {
        self.set_now(now);
        let now = self.now;
        self.stats.rx_datagrams += 1;
        let (shim, seg) = match wrd::split(data) {
            Ok((Some(s), seg)) => (s, seg),
            Ok((None, _)) => {
                self.stats.rx_not_rd += 1;
                return;
            }
            Err(WireError::BadCrc) => {
                self.stats.rx_bad_crc += 1;
                return;
            }
            Err(_) => {
                self.stats.rx_malformed += 1;
                return;
            }
        };
        let src = DgramAddr {
            ip: src_ip.to_canonical(),
            port: src_port,
            qpn: shim.src_qpn,
        };
        let mut shim_in = shim;
        let mut parsed = None;
        if shim.data.is_some() {
            match SegmentRepr::parse(seg, datagram::MODE) {
                Ok((repr, h)) if repr.dqpn.is_none_or(|q| q & MAX_QPN == shim.dst_qpn) => {
                    parsed = Some((repr, h));
                }
                _ => {
                    // Not acknowledged: the sender resends it, and a peer
                    // that keeps sending garbage fails by the retry limit.
                    self.stats.rx_malformed += 1;
                    shim_in.data = None;
                    shim_in.poll = false;
                }
            }
        }
        let verdict = self.ep.handle_datagram(src, &shim_in, now);
        self.maybe_tx = true;
        match verdict {
            Verdict::Deliver | Verdict::Control => {}
            Verdict::Duplicate => self.stats.rx_duplicates += 1,
            Verdict::Drop(crate::rd::DropReason::WrongQp) => self.stats.rx_wrong_qp += 1,
            Verdict::Drop(_) => self.stats.rx_not_delivered += 1,
        }
        // The events first (sessions, failures, acknowledged tokens), then
        // the segment, and only then do acknowledged requests succeed: a
        // Terminate carrying the ACK of the request it fails is acted on
        // first. An ACK on a datagram not delivered may have overtaken a
        // Terminate; its requests wait until that datagram is delivered.
        self.drain_rd_events();
        if verdict == Verdict::Deliver {
            if let Some((repr, h)) = parsed {
                self.peers.get_or_insert_with(src, PeerState::new);
                self.rx_segment(src, &repr, &seg[h..], seg, mem, now);
            }
            if let Some(d) = shim_in.data {
                self.release_gate(src, d.epoch, d.psn);
            }
        }
        let gate = match (verdict, shim_in.data) {
            (Verdict::Drop(_), Some(d)) => Some((src, d.epoch, d.psn)),
            _ => None,
        };
        self.finalize(gate);
        self.pump_all();
        self.refresh();
    }

    pub(super) fn rx_segment<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        payload: &[u8],
        seg: &[u8],
        mem: &mut M,
        now: Instant,
    ) {
        match repr.opcode {
            Opcode::Send | Opcode::SendSe | Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                self.rx_send(src, repr, payload, seg, mem)
            }
            Opcode::RdmaWrite | Opcode::WriteRecord => {
                self.rx_tagged(src, repr, payload, seg, mem, now)
            }
            Opcode::ReadRequest => self.rx_read_request(src, repr, seg, mem),
            Opcode::AtomicRequest => self.rx_atomic_request(src, repr, seg, mem),
            Opcode::ReadResponse => self.rx_read_response(src, repr, payload, mem),
            Opcode::AtomicResponse => self.rx_atomic_response(src, repr, mem),
            Opcode::Terminate => self.rx_terminate(src, repr),
            _ => {
                // Send with Invalidate (not used on RD) and unknown opcodes.
                self.stats.rx_inconsistent += 1;
                let about = msn_of(repr);
                self.queue_terminate(
                    src,
                    TermSpec::about(TerminateCause::RdmapUnexpectedOpcode, seg, about),
                );
            }
        }
    }

    /// Queues a Terminate to `peer` about the datagram just delivered from
    /// it, as a report ([`RdEndpoint::send_report`]).
    pub(super) fn queue_terminate(&mut self, peer: DgramAddr, spec: TermSpec) {
        let Some(slot) = self.alloc_in(true) else {
            self.stats.terminates_dropped += 1;
            return;
        };
        let Some(p) = self.peers.get_mut(&peer) else {
            self.in_free.push(slot);
            return;
        };
        let msn = p.next_term();
        let term = TerminateRepr {
            cause: spec.cause,
            segment_len: spec.seg_len,
            ddp_header: spec.echo,
            rdmap_header: spec.rdmap,
        };
        self.inb[slot as usize].e = Some(InEntry {
            peer,
            kind: InKind::Terminate {
                term,
                about: spec.about,
                msn,
            },
            room: 0,
            nsegs: 1,
            pumped: 0,
            resolved: 0,
            ird: false,
            dead: false,
            reported: false,
            abort_msn: 0,
            in_fifo: false,
            next: NIL,
        });
        // A report to the reliability layer: ahead of everything unsent,
        // past a full window, and the ACK of the datagram it is about
        // travels only with it or after it.
        let token = Token {
            from: Source::Inbound,
            slot,
            gen: self.inb[slot as usize].gen,
            seg: 0,
        };
        if self.ep.send_report(peer, token, self.now).is_err() {
            self.stats.terminates_dropped += 1;
            self.kill_in(slot);
            return;
        }
        self.maybe_tx = true;
        self.stats.terminates_sent += 1;
        if let Some(e) = self.inb[slot as usize].e.as_mut() {
            e.pumped = 1;
        }
    }

    pub(super) fn rx_send<M: Memory>(
        &mut self,
        src: DgramAddr,
        repr: &SegmentRepr,
        payload: &[u8],
        seg: &[u8],
        mem: &mut M,
    ) {
        let DdpHeader::Untagged { qn, msn, mo, .. } = repr.ddp else {
            return;
        };
        let imm_seg = matches!(repr.opcode, Opcode::ImmediateData | Opcode::ImmediateDataSe);
        let end = u64::from(mo) + payload.len() as u64;
        let Some(p) = self.peers.get_mut(&src) else {
            return;
        };
        if p.skip_send == Some(msn) {
            self.stats.rx_skipped += 1;
            return;
        }
        p.skip_send = None;
        if qn != 0 || (imm_seg && !repr.last) || end > u64::from(u32::MAX) {
            let cause = if qn != 0 {
                TerminateCause::DdpUntaggedInvalidQn
            } else {
                TerminateCause::RdmapCatastrophicStream
            };
            return self.rx_send_fail(src, msn, repr.last, None, cause, seg);
        }
        if let Some(m) = p.rx {
            if m.msn != msn {
                // The previous message never ended (a misbehaving sender):
                // abandon it.
                self.stats.rx_inconsistent += 1;
                p.rx = None;
                self.rq.give_back(m.seq, m.wr);
            }
        }
        let Some(p) = self.peers.get_mut(&src) else {
            return;
        };
        let mut m = match p.rx {
            Some(m) => m,
            None => {
                if mo != 0 {
                    // Its beginning was not received here (this side or
                    // the sender restarted, or a hostile sender): never
                    // taken for a new message; the sender learns it.
                    self.stats.rx_orphan_segments += 1;
                    return self.rx_send_fail(
                        src,
                        msn,
                        repr.last,
                        None,
                        TerminateCause::DdpUntaggedInvalidMo,
                        seg,
                    );
                }
                let Some((seq, wr)) = self.rq.take() else {
                    self.stats.rx_no_recv += 1;
                    return self.rx_send_fail(
                        src,
                        msn,
                        repr.last,
                        None,
                        TerminateCause::DdpUntaggedNoBuffer,
                        seg,
                    );
                };
                let grh = self.grh_len();
                let cap = wr.sgl.total_len().saturating_sub(grh).min(self.cfg.max_msg);
                if wr.sgl.total_len() < grh {
                    self.stats.rx_len_err += 1;
                    return self.rx_send_fail(
                        src,
                        msn,
                        repr.last,
                        Some((wr, WcStatus::LocLenErr)),
                        TerminateCause::DdpUntaggedTooLong,
                        seg,
                    );
                }
                RxMsg {
                    msn,
                    seq,
                    wr,
                    cap,
                    received: 0,
                }
            }
        };
        if let Some(p) = self.peers.get_mut(&src) {
            p.rx = None;
        }
        if mo != m.received {
            self.stats.rx_inconsistent += 1;
            self.rq.give_back(m.seq, m.wr);
            return self.rx_send_fail(
                src,
                msn,
                repr.last,
                None,
                TerminateCause::DdpUntaggedInvalidMo,
                seg,
            );
        }
        if end > m.cap {
            self.stats.rx_len_err += 1;
            return self.rx_send_fail(
                src,
                msn,
                repr.last,
                Some((m.wr, WcStatus::LocLenErr)),
                TerminateCause::DdpUntaggedTooLong,
                seg,
            );
        }
        let grh = self.grh_len();
        if !payload.is_empty() && scatter(mem, &m.wr.sgl, grh + u64::from(mo), payload).is_err() {
            self.stats.rx_prot_err += 1;
            return self.rx_send_fail(
                src,
                msn,
                repr.last,
                Some((m.wr, WcStatus::LocProtErr)),
                TerminateCause::DdpLocalCatastrophic,
                seg,
            );
        }
        m.received = end as u32;
        if !repr.last {
            if let Some(p) = self.peers.get_mut(&src) {
                p.rx = Some(m);
            }
            return;
        }
        let imm = match repr.body {
            RdmapBody::Immediate(v) if imm_seg => Some(v as u32),
            _ => None,
        };
        self.finish_recv(src, m.wr, end as u32, imm, repr.opcode.is_solicited(), mem);
    }

    /// A Send message failed here: its receive (if it took one) completes
    /// with `recv`'s status, its later segments are dropped, and the sender
    /// gets a Terminate (a report: it cannot be overtaken by the ACK).
    pub(super) fn rx_send_fail(
        &mut self,
        src: DgramAddr,
        msn: u32,
        last: bool,
        recv: Option<(RecvWr, WcStatus)>,
        cause: TerminateCause,
        seg: &[u8],
    ) {
        if let Some(p) = self.peers.get_mut(&src) {
            if let Some(m) = p.rx.take() {
                self.rq.give_back(m.seq, m.wr);
            }
            if !last {
                p.skip_send = Some(msn);
            }
        }
        if let Some((wr, status)) = recv {
            self.rq.consumed();
            let mut wc = WorkCompletion::new(wr.wr_id, status, WcOpcode::Recv, 0);
            wc.src = Some(src);
            self.completions.push_back((CqKind::Recv, wc));
        }
        self.queue_terminate(src, TermSpec::about(cause, seg, msn));
    }

    pub(super) fn finish_recv<M: Memory>(
        &mut self,
        src: DgramAddr,
        wr: RecvWr,
        total: u32,
        imm: Option<u32>,
        solicited: bool,
        mem: &mut M,
    ) {
        if let Some(ours) = self.cfg.grh {
            let h = grh_header(src.ip, ours, u64::from(total));
            if scatter(mem, &wr.sgl, 0, &h).is_err() {
                self.stats.rx_prot_err += 1;
                self.rq.consumed();
                let mut wc = WorkCompletion::new(wr.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0);
                wc.src = Some(src);
                self.completions.push_back((CqKind::Recv, wc));
                return;
            }
        }
        self.rq.consumed();
        self.stats.rx_delivered += 1;
        let mut wc = WorkCompletion::new(
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            total.saturating_add(self.grh_len() as u32),
        );
        wc.imm = imm;
        wc.solicited = solicited;
        wc.src = Some(src);
        self.completions.push_back((CqKind::Recv, wc));
    }

    pub(super) fn grh_len(&self) -> u64 {
        if self.cfg.grh.is_some() {
            GRH_LEN as u64
        } else {
            0
        }
    }
}

impl TermSpec {
    /// A Terminate about the segment `seg` (DDP header first).
    pub(super) fn about(cause: TerminateCause, seg: &[u8], about: u32) -> TermSpec {
        TermSpec {
            cause,
            echo: EchoedHeader::from_segment(seg).ok(),
            seg_len: Some(seg.len().min(usize::from(u16::MAX)) as u16),
            rdmap: None,
            about,
        }
    }
}

/// The completion status a Terminate's cause gives the request it names
/// (as on RC).
pub(super) fn status_of(cause: TerminateCause) -> WcStatus {
    match cause.layer() {
        rdmap::Layer::Rdmap if cause.etype() == 1 => WcStatus::RemAccessErr,
        rdmap::Layer::Ddp if cause.etype() == 1 => WcStatus::RemAccessErr,
        rdmap::Layer::Ddp if cause == TerminateCause::DdpUntaggedNoBuffer => {
            WcStatus::RnrRetryExcErr
        }
        rdmap::Layer::Ddp if cause.etype() == 2 => WcStatus::RemInvReqErr,
        _ => WcStatus::RemOpErr,
    }
}

/// MSN (untagged) or T-MSN (tagged, 0 without X) of a segment.
pub(super) fn msn_of(repr: &SegmentRepr) -> u32 {
    match repr.ddp {
        DdpHeader::Untagged { msn, .. } => msn,
        DdpHeader::Tagged { ext, .. } => ext.map_or(0, |e| e.msn),
    }
}

/// The D echo of a segment we build ourselves.
pub(super) fn echo_of(repr: &SegmentRepr) -> Option<EchoedHeader> {
    let mut b = [0u8; HDR_CAP];
    let n = datagram::emit_header(repr, &mut b);
    EchoedHeader::from_segment(&b[..n]).ok()
}
