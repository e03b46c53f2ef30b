//! Framing: choosing the next FPDU (RTR, Terminate, inbound Read
//! Responses, the send queue) and building it into the transmit ring.
//!
//! Contract: messages of one kind are never interleaved; the send queue
//! and inbound Read Responses alternate only at message boundaries;
//! every memory span is checked before it is framed.

use super::*;

impl RcQp {
    pub(super) fn build_rtr<M: Memory>(&mut self, mem: &mut M, kind: RtrKind) -> Built {
        let repr = match kind {
            RtrKind::Write => SegmentRepr::tagged(Opcode::RdmaWrite, 1, 0, true),
            RtrKind::Send => {
                let msn = self.bump_msn(0);
                SegmentRepr::untagged(Opcode::Send, 0, msn, 0, true, RdmapBody::None)
            }
            RtrKind::Read => {
                let msn = self.bump_msn(1);
                self.ord.push_back(OrdEntry {
                    seq: None,
                    kind: OrdKind::Read {
                        sink_stag: 0,
                        sink_to: 0,
                        size: 0,
                        received: 0,
                    },
                });
                SegmentRepr::untagged(
                    Opcode::ReadRequest,
                    1,
                    msn,
                    0,
                    true,
                    RdmapBody::ReadRequest(ReadRequest {
                        sink_stag: 0,
                        sink_to: 0,
                        size: 0,
                        src_stag: 1,
                        src_to: 0,
                    }),
                )
            }
        };
        self.build(mem, &repr, &Body::None, Done::Nothing)
    }

    pub(super) fn bump_msn(&mut self, qn: usize) -> u32 {
        let m = self.tx_msn[qn];
        self.tx_msn[qn] = m.wrapping_add(1);
        m
    }

    pub(super) fn next_ird_fpdu<M: Memory>(&mut self, mem: &mut M) -> Option<Built> {
        let entry = *self.ird.front()?;
        match entry {
            IrdEntry::Atomic { req_id, orig } => {
                self.ird.pop_front();
                self.ird_served_in_row += 1;
                let msn = self.bump_msn(3);
                let repr = SegmentRepr::untagged(
                    Opcode::AtomicResponse,
                    3,
                    msn,
                    0,
                    true,
                    RdmapBody::AtomicResponse(AtomicResponse {
                        req_id,
                        orig_value: orig,
                    }),
                );
                Some(self.build(mem, &repr, &Body::None, Done::Nothing))
            }
            IrdEntry::Read { req, sent } => {
                let room = (self.cfg.max_ulpdu - ddp::TAGGED_HEADER_LEN) as u64;
                let left = u64::from(req.size) - sent;
                let n = left.min(room);
                let last = n == left;
                let repr = SegmentRepr::tagged(
                    Opcode::ReadResponse,
                    req.sink_stag,
                    req.sink_to.wrapping_add(sent),
                    last,
                );
                let body = Body::Remote {
                    stag: req.src_stag,
                    to: req.src_to.wrapping_add(sent),
                    len: n,
                };
                let p = self.build(mem, &repr, &body, Done::Nothing);
                if self.state != RcState::Rts {
                    return None;
                }
                if last {
                    self.ird.pop_front();
                    self.in_ird_message = false;
                    self.ird_served_in_row += 1;
                } else {
                    self.in_ird_message = true;
                    if let Some(IrdEntry::Read { sent: s, .. }) = self.ird.front_mut() {
                        *s += n;
                    }
                }
                Some(p)
            }
        }
    }

    /// Frames the next FPDU of the send-queue entry at the cursor, or
    /// finishes a local operation (Local Invalidate) there. `None` if
    /// there is nothing to frame now (no entry, waiting for a response,
    /// or held by ORD or a fence).
    pub(super) fn next_sq_fpdu<M: Memory>(&mut self, mem: &mut M) -> Option<Built> {
        let idx = self.sq_cursor;
        // The entry's small fields only: its payload (up to some 270
        // octets) is read in place by `build` (Body::Sq).
        let e = self.sq.get(idx)?;
        let SqState::Sending { stage, framed } = e.state else {
            return None;
        };
        if self.blocked(&e.wr, stage) {
            return None;
        }
        let probe = self.cfg.write_placed && e.wr.flags.signaled;
        let total = e.wr.payload.len();
        let seq = e.seq;
        let pos = SqPos {
            idx,
            seq,
            stage,
            framed,
            total,
        };
        match e.wr.op {
            // Refused by post_send; never queued on an RC QP.
            SendOp::WriteRecord { .. } => {
                self.set_sq_state(idx, SqState::Done(WcStatus::LocQpOpErr, 0));
                self.sq_cursor += 1;
                self.reap_sq();
                None
            }
            SendOp::LocalInvalidate { stag } => {
                let st = match mem.invalidate(stag, false) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::LocProtErr,
                };
                self.sq_cursor += 1;
                if st != WcStatus::Success {
                    self.fail_wr(seq, st);
                } else {
                    self.set_sq_state(idx, SqState::Done(st, 0));
                    self.reap_sq();
                }
                None
            }
            SendOp::Send { imm: Some(imm), .. } if stage == 0 => {
                Some(self.frame_send_immediate(mem, idx, imm))
            }
            SendOp::Send { invalidate, .. } => {
                let solicited = e.wr.flags.solicited;
                Some(self.frame_send_segment(mem, pos, solicited, invalidate))
            }
            SendOp::Write {
                remote_addr,
                rkey,
                imm,
            } => Some(self.frame_write_segment(mem, pos, remote_addr, rkey, imm, probe)),
            SendOp::Read { remote_addr, rkey } => {
                let Payload::Sgl(sgl) = e.wr.payload else {
                    return None;
                };
                let first = sgl.as_slice().first().copied().unwrap_or_default();
                let req = ReadRequest {
                    sink_stag: first.lkey,
                    sink_to: first.addr,
                    size: total as u32,
                    src_stag: rkey,
                    src_to: remote_addr,
                };
                Some(self.frame_read_request(mem, pos, req))
            }
            SendOp::CompareSwap {
                remote_addr, rkey, ..
            }
            | SendOp::FetchAdd {
                remote_addr, rkey, ..
            } => {
                let (op, a, c) = match e.wr.op {
                    SendOp::CompareSwap { compare, swap, .. } => {
                        (WireAtomicOp::CompareSwap, swap, compare)
                    }
                    SendOp::FetchAdd { add, .. } => (WireAtomicOp::FetchAdd, add, 0),
                    _ => unreachable!("matched above"),
                };
                let req = AtomicRequest {
                    op,
                    req_id: 0,
                    stag: rkey,
                    to: remote_addr,
                    add_swap: a,
                    add_swap_mask: 0,
                    compare: c,
                    compare_mask: 0,
                };
                Some(self.frame_atomic_request(mem, pos, req))
            }
        }
    }

    /// Sets the state of the send-queue entry at `idx`, if it is there.
    #[inline]
    fn set_sq_state(&mut self, idx: usize, st: SqState) {
        if let Some(x) = self.sq.get_mut(idx) {
            x.state = st;
        }
    }

    /// After framing a segment of the entry at `pos`: if the QP is still
    /// sending (framing did not fail it), `last` moves the cursor past a
    /// framed entry, otherwise the entry records `next`, the stage and
    /// octets framed so far.
    #[inline]
    fn sq_framed(&mut self, idx: usize, last: bool, next: SqState) {
        if self.state == RcState::Rts {
            if last {
                self.set_sq_state(idx, SqState::Framed);
                self.sq_cursor += 1;
            } else {
                self.set_sq_state(idx, next);
            }
        }
    }

    /// Frames the Immediate Data message that announces a Send with
    /// immediate (the entry's first stage).
    #[inline]
    fn frame_send_immediate<M: Memory>(&mut self, mem: &mut M, idx: usize, imm: u32) -> Built {
        let msn = self.bump_msn(0);
        let repr = SegmentRepr::untagged(
            Opcode::ImmediateData,
            0,
            msn,
            0,
            true,
            RdmapBody::Immediate(u64::from(imm) | 1 << 32),
        );
        self.set_sq_state(
            idx,
            SqState::Sending {
                stage: 1,
                framed: 0,
            },
        );
        self.build(mem, &repr, &Body::None, Done::Nothing)
    }

    /// Frames the next segment of a Send (its payload read in place); the
    /// last one takes the MSN and completes the entry once written.
    #[inline]
    fn frame_send_segment<M: Memory>(
        &mut self,
        mem: &mut M,
        pos: SqPos,
        solicited: bool,
        invalidate: Option<u32>,
    ) -> Built {
        let SqPos {
            idx,
            seq,
            stage,
            framed,
            total,
        } = pos;
        let room = (self.cfg.max_ulpdu - ddp::UNTAGGED_HEADER_LEN) as u64;
        let n = (total - framed).min(room);
        let last = framed + n == total;
        let msn = self.tx_msn[0];
        if last {
            self.tx_msn[0] = msn.wrapping_add(1);
        }
        let opcode = match (solicited, invalidate.is_some()) {
            (false, false) => Opcode::Send,
            (true, false) => Opcode::SendSe,
            (false, true) => Opcode::SendInvalidate,
            (true, true) => Opcode::SendSeInvalidate,
        };
        let mut repr = SegmentRepr::untagged(opcode, 0, msn, framed as u32, last, RdmapBody::None);
        if let (Some(s), DdpHeader::Untagged { rsvd_ulp, .. }) = (invalidate, &mut repr.ddp) {
            *rsvd_ulp = s;
        }
        let body = Body::Sq {
            idx,
            offset: framed,
            len: n,
        };
        let done = if last {
            Done::SqComplete(seq)
        } else {
            Done::Nothing
        };
        let p = self.build(mem, &repr, &body, done);
        let next = SqState::Sending {
            stage,
            framed: framed + n,
        };
        self.sq_framed(idx, last, next);
        p
    }

    /// Frames the next segment of an RDMA Write, or (stage 1, after its
    /// last segment) the Immediate Data message of a Write with immediate,
    /// or (stage [`WRITE_PROBE_STAGE`], last, with `probe`) the zero-length
    /// Read Request whose response completes the Write
    /// (`RcConfig::write_placed`).
    #[inline]
    fn frame_write_segment<M: Memory>(
        &mut self,
        mem: &mut M,
        pos: SqPos,
        remote_addr: u64,
        rkey: u32,
        imm: Option<u32>,
        probe: bool,
    ) -> Built {
        let SqPos {
            idx,
            seq,
            stage,
            framed,
            total,
        } = pos;
        let probe_next = SqState::Sending {
            stage: WRITE_PROBE_STAGE,
            framed: total,
        };
        if stage == WRITE_PROBE_STAGE {
            let req = ReadRequest {
                sink_stag: 0,
                sink_to: 0,
                size: 0,
                src_stag: rkey,
                src_to: remote_addr,
            };
            return self.frame_read_request(mem, pos, req);
        }
        if stage == 1 && probe {
            let msn = self.bump_msn(0);
            let repr = SegmentRepr::untagged(
                Opcode::ImmediateData,
                0,
                msn,
                0,
                true,
                RdmapBody::Immediate(u64::from(imm.unwrap_or(0))),
            );
            self.set_sq_state(idx, probe_next);
            return self.build(mem, &repr, &Body::None, Done::Nothing);
        }
        if stage == 1 {
            let imm = imm.unwrap_or(0);
            let msn = self.bump_msn(0);
            let repr = SegmentRepr::untagged(
                Opcode::ImmediateData,
                0,
                msn,
                0,
                true,
                RdmapBody::Immediate(u64::from(imm)),
            );
            self.set_sq_state(idx, SqState::Framed);
            self.sq_cursor += 1;
            return self.build(mem, &repr, &Body::None, Done::SqComplete(seq));
        }
        let room = (self.cfg.max_ulpdu - ddp::TAGGED_HEADER_LEN) as u64;
        let n = (total - framed).min(room);
        let last = framed + n == total;
        let repr = SegmentRepr::tagged(
            Opcode::RdmaWrite,
            rkey,
            remote_addr.wrapping_add(framed),
            last,
        );
        let body = Body::Sq {
            idx,
            offset: framed,
            len: n,
        };
        let done = if last && imm.is_none() && !probe {
            Done::SqComplete(seq)
        } else {
            Done::Nothing
        };
        let p = self.build(mem, &repr, &body, done);
        // A Write with immediate goes on to its Immediate Data message, a
        // Write that completes once placed to its probe.
        let next = match (last, imm, probe) {
            (true, Some(_), _) => SqState::Sending {
                stage: 1,
                framed: total,
            },
            (true, None, true) => probe_next,
            _ => SqState::Sending {
                stage,
                framed: framed + n,
            },
        };
        self.sq_framed(idx, last && imm.is_none() && !probe, next);
        p
    }

    /// Frames a Read Request and records it for its response (ORD).
    #[inline]
    fn frame_read_request<M: Memory>(
        &mut self,
        mem: &mut M,
        pos: SqPos,
        req: ReadRequest,
    ) -> Built {
        let msn = self.bump_msn(1);
        self.ord.push_back(OrdEntry {
            seq: Some(pos.seq),
            kind: OrdKind::Read {
                sink_stag: req.sink_stag,
                sink_to: req.sink_to,
                size: req.size,
                received: 0,
            },
        });
        self.set_sq_state(pos.idx, SqState::AwaitResponse);
        self.sq_cursor += 1;
        let repr = SegmentRepr::untagged(
            Opcode::ReadRequest,
            1,
            msn,
            0,
            true,
            RdmapBody::ReadRequest(req),
        );
        self.build(mem, &repr, &Body::None, Done::Nothing)
    }

    /// Frames an Atomic Request (`req` without its id, which is assigned
    /// here) and records it for its response (ORD).
    #[inline]
    fn frame_atomic_request<M: Memory>(
        &mut self,
        mem: &mut M,
        pos: SqPos,
        mut req: AtomicRequest,
    ) -> Built {
        let req_id = self.next_atomic_id;
        self.next_atomic_id = self.next_atomic_id.wrapping_add(1);
        req.req_id = req_id;
        let msn = self.bump_msn(1);
        self.ord.push_back(OrdEntry {
            seq: Some(pos.seq),
            kind: OrdKind::Atomic { req_id },
        });
        self.set_sq_state(pos.idx, SqState::AwaitResponse);
        self.sq_cursor += 1;
        let repr = SegmentRepr::untagged(
            Opcode::AtomicRequest,
            1,
            msn,
            0,
            true,
            RdmapBody::AtomicRequest(req),
        );
        self.build(mem, &repr, &Body::None, Done::Nothing)
    }

    /// Frames one FPDU into the transmit ring: header from `repr`, payload
    /// from `body`. A local gather failure fails the QP (local protection
    /// error); a remote source failure (Read Response) terminates; either
    /// way nothing is added to the ring.
    pub(super) fn build<M: Memory>(
        &mut self,
        mem: &mut M,
        repr: &SegmentRepr,
        body: &Body,
        done: Done,
    ) -> Built {
        let cfg = self.cfg;
        let resolved;
        let mut seq = None;
        let body = match *body {
            Body::Sq { idx, offset, len } => {
                let Some(e) = self.sq.get(idx) else {
                    self.fail(None, false, Some(WcStatus::LocQpOpErr));
                    return Built;
                };
                seq = Some(e.seq);
                resolved = Body::Local {
                    payload: &e.wr.payload,
                    offset,
                    len,
                };
                &resolved
            }
            _ => body,
        };
        let p = self.pending.next_slot();
        match build_into(
            p,
            &cfg,
            &mut self.framer,
            &mut self.marker_buf,
            mem,
            repr,
            body,
            done,
        ) {
            Ok(()) => self.pending.commit(),
            Err((e, true)) => {
                // The region went away between the Read Request and now.
                let t = TerminateRepr::new(e.terminate_cause(false));
                self.fail(Some(t), false, None);
            }
            Err((e, false)) => match seq {
                Some(seq) => self.fail_wr(seq, e.local_status()),
                None => self.fail(None, false, Some(e.local_status())),
            },
        }
        Built
    }

    // ------------------------------------------------------------------
    // Receive
    // ------------------------------------------------------------------
}

/// Frames one FPDU into `p` (a reset ring slot): header from `repr`,
/// payload from `body`, read in place (spans) unless inline or with
/// markers. `Err((error, remote source))` if the payload cannot be read.
#[allow(clippy::too_many_arguments)]
pub(super) fn build_into<M: Memory>(
    p: &mut PendingFpdu,
    cfg: &RcConfig,
    framer: &mut Framer,
    marker_buf: &mut Vec<u8>,
    mem: &M,
    repr: &SegmentRepr,
    body: &Body,
    done: Done,
) -> Result<(), (MemError, bool)> {
    p.done = done;
    let hlen = repr.header_len();
    repr.emit(&mut p.hdr[fpdu::LEN_FIELD..fpdu::LEN_FIELD + hlen]);
    p.hdr_len = fpdu::LEN_FIELD + hlen;
    // Resolve the payload into spans (or copy inline data).
    let mut payload_len = 0u64;
    let mut bad: Option<MemError> = None;
    let mut remote_bad = false;
    match *body {
        Body::None => {}
        // Resolved by the caller.
        Body::Sq { .. } => {}
        Body::Local {
            payload: Payload::Inline(d),
            offset,
            len,
        } => {
            let s = &d.as_slice()[offset as usize..(offset + len) as usize];
            p.hdr[p.hdr_len..p.hdr_len + s.len()].copy_from_slice(s);
            p.hdr_len += s.len();
            payload_len = len;
        }
        Body::Local {
            payload: Payload::Sgl(sgl),
            offset,
            len,
        } => {
            let spans = &mut p.spans;
            let mut k = 0;
            sgl.for_range(offset, len, |sge, off, n| {
                if bad.is_none() {
                    if let Err(e) = mem.local_read(sge.lkey, sge.addr.wrapping_add(off), n) {
                        bad = Some(e);
                    }
                }
                spans[k] = Span {
                    key: sge.lkey,
                    addr: sge.addr.wrapping_add(off),
                    len: n,
                    remote: false,
                };
                k += 1;
            });
            p.nspans = k;
            payload_len = len;
        }
        Body::Remote { stag, to, len } => {
            if len > 0 {
                if let Err(e) = mem.remote_read(stag, to, len) {
                    bad = Some(e);
                    remote_bad = true;
                }
                p.spans[0] = Span {
                    key: stag,
                    addr: to,
                    len,
                    remote: true,
                };
                p.nspans = 1;
            }
            payload_len = len;
        }
    }
    if let Some(e) = bad {
        return Err((e, remote_bad));
    }
    let ulpdu = hlen as u64 + payload_len;
    // The slot counts the header plus all payload, inline or gathered.
    fpdu::set_ulpdu_len(&mut p.hdr[..fpdu::LEN_FIELD + hlen], payload_len as usize)
        .expect("ULPDU within max_ulpdu");
    if cfg.markers_tx {
        // Markers: copy the FPDU through the framer into the buffer.
        let start = marker_buf.len();
        let mut pieces: [&[u8]; MAX_SGE + 1] = [&[]; MAX_SGE + 1];
        pieces[0] = &p.hdr[fpdu::LEN_FIELD + hlen..p.hdr_len];
        for (i, s) in p.spans[..p.nspans].iter().enumerate() {
            pieces[i + 1] = span_slice(mem, s);
        }
        let n = framer
            .frame_to_vec(
                &p.hdr[..fpdu::LEN_FIELD + hlen],
                &pieces[..p.nspans + 1],
                marker_buf,
            )
            .expect("valid FPDU");
        p.owned = Some(start);
        p.total = n;
        return Ok(());
    }
    // No markers: CRC over length, header, payload and pad; the payload
    // is read in place, never copied — except a small one, which is
    // gathered behind the header together with the pad: then the FPDU is
    // one CRC pass and two io-vectors (header+payload+pad, CRC), which
    // costs less than the span bookkeeping it saves.
    let pad = fpdu::pad_len(ulpdu as usize);
    if p.nspans > 0
        && payload_len <= SMALL_GATHER as u64
        && p.hdr_len + payload_len as usize + pad <= HDR_CAP
    {
        for i in 0..p.nspans {
            let d = span_slice(mem, &p.spans[i]);
            p.hdr[p.hdr_len..p.hdr_len + d.len()].copy_from_slice(d);
            p.hdr_len += d.len();
        }
        p.nspans = 0;
    }
    let mut crc = Crc32c::new();
    if p.nspans == 0 && p.hdr_len + pad <= HDR_CAP {
        p.hdr[p.hdr_len..p.hdr_len + pad].fill(0);
        p.hdr_len += pad;
        if cfg.crc {
            crc.update(&p.hdr[..p.hdr_len]);
        }
        p.trailer_len = 0;
    } else {
        if cfg.crc {
            crc.update(&p.hdr[..p.hdr_len]);
            for s in &p.spans[..p.nspans] {
                crc.update(span_slice(mem, s));
            }
            crc.update(&[0u8; 3][..pad]);
        }
        p.trailer[..pad].fill(0);
        p.trailer_len = pad;
    }
    let c = if cfg.crc { crc.wire_bytes() } else { [0; 4] };
    let at = p.trailer_len;
    p.trailer[at..at + 4].copy_from_slice(&c);
    p.trailer_len = at + fpdu::CRC_LEN;
    p.total = fpdu::fpdu_len(ulpdu as usize);
    // Keep the framer's stream position in step (markers are off, so
    // only the count matters to it).
    let _ = framer.stream_position();
    Ok(())
}

/// Payload source of an FPDU being built.
pub(super) enum Body<'a> {
    None,
    /// Octets of the send queue entry at index `idx` (resolved by
    /// `RcQp::build`, so the entry is not copied).
    Sq {
        idx: usize,
        offset: u64,
        len: u64,
    },
    /// As `Sq`, resolved.
    Local {
        payload: &'a Payload,
        offset: u64,
        len: u64,
    },
    Remote {
        stag: u32,
        to: u64,
        len: u64,
    },
}

pub(super) fn tagged_placeholder() -> SegmentRepr {
    SegmentRepr::tagged(Opcode::Unknown(0xF), 0, 0, true)
}

/// The memory a span refers to (validated when the FPDU was built; the
/// region cannot change in between because the caller holds `mem`).
pub(super) fn span_slice<'m, M: Memory>(mem: &'m M, s: &Span) -> &'m [u8] {
    let r = if s.remote {
        mem.remote_read(s.key, s.addr, s.len)
    } else {
        mem.local_read(s.key, s.addr, s.len)
    };
    r.unwrap_or(&[])
}

/// Where the send-queue entry being framed stands: its index in the
/// queue, sequence number, stage (0, or 1 for the Immediate Data message
/// of a Write with immediate), payload octets framed so far and in all.
#[derive(Debug, Clone, Copy)]
struct SqPos {
    idx: usize,
    seq: u64,
    stage: u8,
    framed: u64,
    total: u64,
}
