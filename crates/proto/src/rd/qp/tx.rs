//! RD transmit: turning the endpoint's transmits into datagrams — shim,
//! RDMAP segment, payload — and offering them to a [`DatagramSink`],
//! gathered or staged.
//!
//! Contract: a segment's payload is checked readable before it is
//! framed; a datagram the sink refuses with `WouldBlock` is offered first
//! next time, one refused with another error is left to the reliability
//! layer's retransmission.

use super::*;

impl RdQp {
    /// Hands datagrams to `sink` in batches of up to [`TX_BATCH`] until
    /// nothing is left or the sink stops accepting (`WouldBlock`: the
    /// datagram stays pending and is offered first next time). Returns the
    /// number accepted. Another sink error drops the datagram it refused
    /// (the reliability layer will resend it) and is returned.
    pub fn poll_transmit<M: Memory, S: DatagramSink>(
        &mut self,
        mem: &M,
        sink: &mut S,
    ) -> io::Result<usize> {
        let mut total = 0;
        let res = loop {
            self.pump_all();
            let mut drained = false;
            while self.pending.len() < TX_BATCH {
                match self.ep.poll_transmit(self.now) {
                    Some(t) => self.pending.push_back(t),
                    None => {
                        drained = true;
                        break;
                    }
                }
            }
            let mut plans = std::mem::take(&mut self.plans);
            plans.clear();
            let mut i = 0;
            while i < self.pending.len() && plans.len() < TX_BATCH {
                let t = self.pending[i];
                match self.plan(&t, mem) {
                    Some(p) => {
                        plans.push(p);
                        i += 1;
                    }
                    None => {
                        self.pending.remove(i);
                        self.stats.tx_stale += 1;
                    }
                }
            }
            if plans.is_empty() {
                self.plans = plans;
                if drained {
                    self.maybe_tx = false;
                    break Ok(total);
                }
                continue;
            }
            let mut stage = std::mem::take(&mut self.stage);
            // `offered` may be fewer than `plans.len()` (the staging buffer
            // full): only a sink that took fewer than it was offered pushed
            // back. A lone datagram (a ping-pong's answer, an ACK) goes
            // with one-entry arrays: the batch's would be written whole.
            let (offered, sent) = if plans.len() == 1 {
                self.send_plans::<M, S, 1, IOV_PER>(mem, sink, &plans, &mut stage)
            } else {
                self.send_plans::<M, S, TX_BATCH, { TX_BATCH * IOV_PER }>(
                    mem, sink, &plans, &mut stage,
                )
            };
            self.stage = stage;
            self.plans = plans;
            match sent {
                Ok(k) => {
                    let k = k.min(offered);
                    for _ in 0..k {
                        self.pending.pop_front();
                    }
                    self.stats.tx_datagrams += k as u64;
                    total += k;
                    if k < offered {
                        break Ok(total);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break Ok(total),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.pending.pop_front();
                    self.stats.tx_socket_errors += 1;
                    break Err(e);
                }
            }
        };
        self.refresh();
        res
    }

    /// [`RdQp::set_now`], then [`RdQp::poll_transmit`].
    pub fn poll_transmit_at<M: Memory, S: DatagramSink>(
        &mut self,
        mem: &M,
        sink: &mut S,
        now: Instant,
    ) -> io::Result<usize> {
        self.set_now(now);
        self.poll_transmit(mem, sink)
    }

    /// The header and payload source of one datagram; `None` if its token
    /// is settled already (nothing to send).
    pub(super) fn plan<M: Memory>(
        &mut self,
        t: &Transmit<DgramAddr, Token>,
        mem: &M,
    ) -> Option<Plan> {
        let mut p = Plan {
            dest: (t.peer.ip, t.peer.port),
            ..Plan::EMPTY
        };
        match t.token {
            None => {
                p.hlen = wrd::emit_header(&t.shim, None, &mut p.hdr);
            }
            Some(tok) => {
                let (repr, body) = match tok.from {
                    Source::Sq => self.sq_segment_checked(tok, mem)?,
                    Source::Inbound => self.in_segment_checked(tok, mem)?,
                };
                p.hlen = wrd::emit_header(&t.shim, Some(&repr), &mut p.hdr);
                p.body = body;
            }
        }
        Some(p)
    }

    pub(super) fn sq_segment_checked<M: Memory>(
        &mut self,
        tok: Token,
        mem: &M,
    ) -> Option<(SegmentRepr, Body)> {
        let s = self.sq.get(tok.slot as usize)?;
        if s.gen != tok.gen {
            return None;
        }
        let e = s.e?;
        let (repr, body) = self.sq_segment(&e, tok.slot, tok.seg)?;
        let Body::Local { off, len, .. } = body else {
            return Some((repr, body));
        };
        if gather_ok(mem, &e.wr.payload, off, len) {
            return Some((repr, body));
        }
        // The source went away in flight: abort the request; this
        // datagram becomes a sender-abort Terminate.
        if !e.done {
            self.stats.tx_aborted += 1;
            self.complete(tok.slot, WcStatus::LocProtErr, 0);
        }
        let mut msn = e.abort_msn;
        if msn == 0 {
            msn = self.peers.get_mut(&e.dest).map_or(1, |p| p.next_term());
            if let Some(x) = self.sq[tok.slot as usize].e.as_mut() {
                x.abort_msn = msn;
            }
        }
        let spec = TermSpec {
            cause: TerminateCause::RdmapLocalCatastrophic,
            echo: echo_of(&repr),
            seg_len: None,
            rdmap: None,
            about: e.msn,
        };
        Some((self.terminate_repr(&spec, msn, e.dest.qpn), Body::None))
    }

    /// Segment `seg` of the request in send-queue slot `slot`.
    pub(super) fn sq_segment(
        &self,
        e: &SqEntry,
        slot: u32,
        seg: u32,
    ) -> Option<(SegmentRepr, Body)> {
        let dqpn = Some(self.dqpn_word(e.dest.qpn));
        let total = e.wr.payload.len();
        let last = seg + 1 >= e.nsegs;
        let solicited = e.wr.flags.solicited;
        let off = u64::from(seg) * u64::from(e.room);
        let len = u64::from(e.room).min(total.saturating_sub(off));
        let repr = match e.wr.op {
            SendOp::Send { imm, .. } => {
                if seg >= e.data_segs {
                    let op = if solicited {
                        Opcode::ImmediateDataSe
                    } else {
                        Opcode::ImmediateData
                    };
                    let mut r = SegmentRepr::untagged(
                        op,
                        0,
                        e.msn,
                        total as u32,
                        true,
                        RdmapBody::Immediate(u64::from(imm.unwrap_or(0))),
                    );
                    set_rsvd_ulp(&mut r, self.cfg.qpn);
                    r.dqpn = dqpn;
                    return Some((r, Body::None));
                }
                let op = if solicited {
                    Opcode::SendSe
                } else {
                    Opcode::Send
                };
                let mut r = SegmentRepr::untagged(
                    op,
                    0,
                    e.msn,
                    off as u32,
                    last && imm.is_none(),
                    RdmapBody::None,
                );
                set_rsvd_ulp(&mut r, self.cfg.qpn);
                r.dqpn = dqpn;
                r
            }
            SendOp::Write {
                remote_addr, rkey, ..
            }
            | SendOp::WriteRecord { remote_addr, rkey } => {
                let op = if e.kind == Kind::WriteRecord {
                    Opcode::WriteRecord
                } else {
                    Opcode::RdmaWrite
                };
                SegmentRepr {
                    ddp: DdpHeader::Tagged {
                        stag: rkey,
                        to: remote_addr.wrapping_add(off),
                        ext: Some(TaggedExt {
                            msn: e.msn,
                            mo: off as u32,
                        }),
                    },
                    dqpn,
                    ..SegmentRepr::tagged(op, rkey, 0, last)
                }
            }
            SendOp::Read { remote_addr, rkey } => {
                let first = match e.wr.payload {
                    Payload::Sgl(s) => s.as_slice().first().copied().unwrap_or_default(),
                    Payload::Inline(_) => Default::default(),
                };
                let req = ReadRequest {
                    sink_stag: first.lkey,
                    sink_to: first.addr,
                    size: total as u32,
                    src_stag: rkey,
                    src_to: remote_addr,
                };
                let mut r = SegmentRepr::untagged(
                    Opcode::ReadRequest,
                    1,
                    e.msn,
                    0,
                    true,
                    RdmapBody::ReadRequest(req),
                );
                r.dqpn = dqpn;
                return Some((r, Body::None));
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                let mut r = atomic_request(WireAtomicOp::CompareSwap, e.msn, rkey, remote_addr);
                if let RdmapBody::AtomicRequest(a) = &mut r.body {
                    a.add_swap = swap;
                    a.compare = compare;
                }
                r.dqpn = dqpn;
                return Some((r, Body::None));
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                let mut r = atomic_request(WireAtomicOp::FetchAdd, e.msn, rkey, remote_addr);
                if let RdmapBody::AtomicRequest(a) = &mut r.body {
                    a.add_swap = add;
                }
                r.dqpn = dqpn;
                return Some((r, Body::None));
            }
            SendOp::LocalInvalidate { .. } => return None,
        };
        Some((repr, Body::Local { slot, off, len }))
    }

    pub(super) fn in_segment_checked<M: Memory>(
        &mut self,
        tok: Token,
        mem: &M,
    ) -> Option<(SegmentRepr, Body)> {
        let s = self.inb.get(tok.slot as usize)?;
        if s.gen != tok.gen {
            return None;
        }
        let e = s.e?;
        let dqpn = Some(self.dqpn_word(e.peer.qpn));
        match e.kind {
            InKind::Read { req, msn } => {
                let off = u64::from(tok.seg) * u64::from(e.room);
                let len = u64::from(e.room).min(u64::from(req.size).saturating_sub(off));
                let src_to = req.src_to.wrapping_add(off);
                match mem.remote_read(req.src_stag, src_to, len) {
                    Ok(_) => {
                        let repr = SegmentRepr {
                            ddp: DdpHeader::Tagged {
                                stag: req.sink_stag,
                                to: req.sink_to.wrapping_add(off),
                                ext: Some(TaggedExt {
                                    msn,
                                    mo: off as u32,
                                }),
                            },
                            dqpn,
                            ..SegmentRepr::tagged(
                                Opcode::ReadResponse,
                                req.sink_stag,
                                0,
                                tok.seg + 1 >= e.nsegs,
                            )
                        };
                        Some((
                            repr,
                            Body::Remote {
                                stag: req.src_stag,
                                to: src_to,
                                len,
                            },
                        ))
                    }
                    Err(error) => {
                        // The source failed the checks after the request
                        // was accepted: the Read fails at the requester.
                        if !e.reported {
                            self.stats.rx_access_errors += 1;
                            self.push_event(DgramEvent::RemoteAccess {
                                src: e.peer,
                                opcode: Opcode::ReadRequest,
                                msn,
                                stag: req.src_stag,
                                to: src_to,
                                len: len as u32,
                                error,
                            });
                        }
                        let mut tmsn = e.abort_msn;
                        if tmsn == 0 {
                            tmsn = self.peers.get_mut(&e.peer).map_or(1, |p| p.next_term());
                        }
                        if let Some(x) = self.inb[tok.slot as usize].e.as_mut() {
                            x.reported = true;
                            x.abort_msn = tmsn;
                        }
                        self.kill_in(tok.slot);
                        let req_repr = SegmentRepr::untagged(
                            Opcode::ReadRequest,
                            1,
                            msn,
                            0,
                            true,
                            RdmapBody::ReadRequest(req),
                        );
                        let spec = TermSpec {
                            cause: error.terminate_cause(false),
                            echo: echo_of(&req_repr),
                            seg_len: None,
                            rdmap: Some(req.to_bytes()),
                            about: msn,
                        };
                        Some((self.terminate_repr(&spec, tmsn, e.peer.qpn), Body::None))
                    }
                }
            }
            InKind::Atomic { resp, msn } => {
                let mut r = SegmentRepr::untagged(
                    Opcode::AtomicResponse,
                    3,
                    msn,
                    0,
                    true,
                    RdmapBody::AtomicResponse(resp),
                );
                r.dqpn = dqpn;
                Some((r, Body::None))
            }
            InKind::Terminate {
                term, about, msn, ..
            } => {
                let mut r = SegmentRepr::untagged(
                    Opcode::Terminate,
                    2,
                    msn,
                    0,
                    true,
                    RdmapBody::Terminate(term),
                );
                set_rsvd_ulp(&mut r, about);
                r.dqpn = dqpn;
                Some((r, Body::None))
            }
        }
    }

    pub(super) fn terminate_repr(&self, spec: &TermSpec, msn: u32, dest_qpn: u32) -> SegmentRepr {
        let term = TerminateRepr {
            cause: spec.cause,
            segment_len: spec.seg_len,
            ddp_header: spec.echo,
            rdmap_header: spec.rdmap,
        };
        let mut r = SegmentRepr::untagged(
            Opcode::Terminate,
            2,
            msn,
            0,
            true,
            RdmapBody::Terminate(term),
        );
        set_rsvd_ulp(&mut r, spec.about);
        r.dqpn = Some(self.dqpn_word(dest_qpn));
        r
    }

    /// Frames the planned datagrams and offers them to the sink: from
    /// [`STAGE_MIN_BATCH`] on, as many as the staging buffer holds framed
    /// contiguously there (one io-vector each, as UD's batches, which
    /// the kernel copies more cheaply than a gather); otherwise gathered
    /// from memory. Returns
    /// how many were offered (a prefix of `plans`) and what the sink said.
    /// `B` sizes the arrays it fills (at most `B` plans are sent; `IOV` is
    /// `B * IOV_PER`): 1 for a lone datagram, whose arrays would otherwise
    /// be a whole batch's, written on every call.
    pub(super) fn send_plans<M: Memory, S: DatagramSink, const B: usize, const IOV: usize>(
        &self,
        mem: &M,
        sink: &mut S,
        plans: &[Plan],
        stage: &mut Vec<u8>,
    ) -> (usize, io::Result<usize>) {
        debug_assert!(IOV == B * IOV_PER && (1..=B).contains(&plans.len()));
        let plans = &plans[..plans.len().min(B)];
        let n = plans.len();
        let mut trailers = [[0u8; CRC_LEN]; B];
        let mut pieces: [[&[u8]; MAX_SGE]; B] = [[&[]; MAX_SGE]; B];
        let mut npieces = [0usize; B];
        for (j, p) in plans.iter().enumerate() {
            npieces[j] = match p.body {
                Body::None => 0,
                Body::Local { slot, off, len } => match self.sq[slot as usize].e.as_ref() {
                    Some(e) => payload_pieces(mem, &e.wr.payload, off, len, &mut pieces[j]),
                    None => 0,
                },
                Body::Remote { stag, to, len } => {
                    pieces[j][0] = mem.remote_read(stag, to, len).unwrap_or(&[]);
                    usize::from(len > 0)
                }
            };
        }
        if n >= STAGE_MIN_BATCH {
            let mut dests = [plans[0].dest; B];
            for (d, p) in dests.iter_mut().zip(plans) {
                *d = p.dest;
            }
            let staged = offer_staged(sink, stage, &dests[..n], |j, room| {
                let hdr = &plans[j].hdr[..plans[j].hlen];
                let body = &pieces[j][..npieces[j]];
                let len = hdr.len() + body.iter().map(|b| b.len()).sum::<usize>();
                if len > room.len() {
                    return None;
                }
                room[..hdr.len()].copy_from_slice(hdr);
                let mut at = hdr.len();
                for b in body {
                    room[at..at + b.len()].copy_from_slice(b);
                    at += b.len();
                }
                Some(len)
            });
            if let Some(r) = staged {
                return r;
            }
        }
        for (j, p) in plans.iter().enumerate() {
            trailers[j] = datagram::trailer(&p.hdr[..p.hlen], &pieces[j][..npieces[j]]);
        }
        let mut iov = [IoSlice::new(&[]); IOV];
        let mut bounds = [(0usize, 0usize); B];
        let mut k = 0;
        for j in 0..n {
            let start = k;
            iov[k] = IoSlice::new(&plans[j].hdr[..plans[j].hlen]);
            k += 1;
            for piece in &pieces[j][..npieces[j]] {
                iov[k] = IoSlice::new(piece);
                k += 1;
            }
            iov[k] = IoSlice::new(&trailers[j]);
            k += 1;
            bounds[j] = (start, k);
        }
        let mut dests = [plans[0].dest; B];
        for (d, p) in dests.iter_mut().zip(plans) {
            *d = p.dest;
        }
        (n, offer::<S, B>(sink, &dests[..n], &iov, &bounds[..n]))
    }

    // ------------------------------------------------------------------
    // Receive
    // ------------------------------------------------------------------
}

pub(super) fn atomic_request(op: WireAtomicOp, msn: u32, stag: u32, to: u64) -> SegmentRepr {
    SegmentRepr::untagged(
        Opcode::AtomicRequest,
        1,
        msn,
        0,
        true,
        RdmapBody::AtomicRequest(AtomicRequest {
            op,
            req_id: msn,
            stag,
            to,
            add_swap: 0,
            add_swap_mask: 0,
            compare: 0,
            compare_mask: 0,
        }),
    )
}

/// Whether octets `[off, off + len)` of a payload can be read.
pub(super) fn gather_ok<M: Memory>(mem: &M, payload: &Payload, off: u64, len: u64) -> bool {
    let Payload::Sgl(sgl) = payload else {
        return true;
    };
    let mut ok = true;
    let inside = sgl.for_range(off, len, |sge, o, n| {
        ok &= mem
            .local_read(sge.lkey, sge.addr.wrapping_add(o), n)
            .is_ok();
    });
    ok && inside
}
