//! UD transmit: planning the segments of the send queue's messages,
//! framing them, and offering them to a [`DatagramSink`] (gathered,
//! copied whole when small, or staged for large batches).
//!
//! Contract: a work request completes when its last datagram was accepted
//! by the sink; `WouldBlock` leaves the datagram pending, any other sink
//! error fails the work request whose datagram was refused.

use super::*;

impl UdQp {
    /// Builds datagrams for the queued work requests and hands them to
    /// `sink` in batches of up to [`TX_BATCH`], until the queue is empty or
    /// the sink stops accepting (`WouldBlock`: the datagram stays pending).
    /// Returns the number of datagrams accepted.
    ///
    /// Another error from the sink fails the work request whose datagram
    /// it refused ([`WcStatus::GeneralErr`]) and is returned; the QP keeps
    /// working and the next call carries on with the next request.
    pub fn poll_transmit<M: Memory, S: DatagramSink>(
        &mut self,
        mem: &M,
        sink: &mut S,
    ) -> io::Result<usize> {
        let mut total = 0;
        let mut plan = [Planned::default(); TX_BATCH];
        loop {
            let n = self.plan(mem, &mut plan);
            if n == 0 {
                return Ok(total);
            }
            let mut stage = std::mem::take(&mut self.stage);
            // `offered` may be fewer than `n` (the staging buffer full):
            // only a sink that took fewer than it was offered pushed back.
            let (offered, res) = self.send_planned(mem, sink, &plan[..n], &mut stage);
            self.stage = stage;
            match res {
                Ok(k) => {
                    let k = k.min(offered);
                    self.commit(&plan[..k]);
                    total += k;
                    if k < offered {
                        return Ok(total);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(total),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.fail_head(WcStatus::GeneralErr);
                    return Err(e);
                }
            }
        }
    }

    /// Chooses the next segments to send; fails a head request whose
    /// gather list the memory refuses.
    pub(super) fn plan<M: Memory>(&mut self, mem: &M, out: &mut [Planned; TX_BATCH]) -> usize {
        loop {
            let mut n = 0;
            let mut bad_head = false;
            for (idx, e) in self.sq.iter().enumerate() {
                if n == TX_BATCH {
                    break;
                }
                if !gather_ok(mem, &e.wr.payload) {
                    bad_head = idx == 0;
                    break;
                }
                let mut s = e.done;
                while s < e.nsegs && n < TX_BATCH {
                    out[n] = Planned { idx, seg: s };
                    n += 1;
                    s += 1;
                }
            }
            if !bad_head {
                return n;
            }
            self.fail_head(WcStatus::LocProtErr);
        }
    }

    /// The header and payload range of segment `i` of `e`.
    pub(super) fn segment<W: Borrow<SendWr>>(
        &self,
        e: &SqEntry<W>,
        i: u32,
    ) -> (SegmentRepr, u64, u64) {
        let wr = e.wr.borrow();
        let total = wr.payload.len();
        let last = i + 1 == e.nsegs;
        let dqpn = Some(((self.cfg.qpn & 0xFF) << 24) | (e.dest.qpn & QPN_MASK));
        let solicited = wr.flags.solicited;
        if i >= e.data_segs {
            // The Immediate Data segment that ends a Send with immediate.
            let imm = match wr.op {
                SendOp::Send { imm: Some(v), .. } => v,
                _ => 0,
            };
            let op = if solicited {
                Opcode::ImmediateDataSe
            } else {
                Opcode::ImmediateData
            };
            let mut repr = SegmentRepr::untagged(
                op,
                0,
                e.msn,
                total as u32,
                true,
                RdmapBody::Immediate(u64::from(imm)),
            );
            set_rsvd_ulp(&mut repr, self.cfg.qpn);
            repr.dqpn = dqpn;
            return (repr, total, 0);
        }
        let off = u64::from(i) * e.room;
        let len = e.room.min(total - off);
        let repr = match wr.op {
            SendOp::Write {
                remote_addr, rkey, ..
            }
            | SendOp::WriteRecord { remote_addr, rkey } => {
                let op = if matches!(wr.op, SendOp::WriteRecord { .. }) {
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
            _ => {
                let op = if solicited {
                    Opcode::SendSe
                } else {
                    Opcode::Send
                };
                let mut repr =
                    SegmentRepr::untagged(op, 0, e.msn, off as u32, last, RdmapBody::None);
                set_rsvd_ulp(&mut repr, self.cfg.qpn);
                repr.dqpn = dqpn;
                repr
            }
        };
        (repr, off, len)
    }

    /// Frames the planned segments and offers them to the sink: a lone
    /// small one copied behind its header; from [`STAGE_MIN_BATCH`] on, as
    /// many as the staging buffer holds framed there; the rest gathered
    /// from memory. Returns how many were offered (a prefix of the plan)
    /// and what the sink said.
    pub(super) fn send_planned<M: Memory, S: DatagramSink>(
        &self,
        mem: &M,
        sink: &mut S,
        plan: &[Planned],
        stage: &mut Vec<u8>,
    ) -> (usize, io::Result<usize>) {
        // Scratch arrays sized for the plan: a lone datagram (the latency
        // case) must not pay for initialising a full batch's kilobytes.
        const SMALL: usize = STAGE_MIN_BATCH - 1;
        match plan.len() {
            1 => match self.send_small(mem, sink, &plan[0]) {
                Some(r) => (1, r),
                None => (1, self.send_planned_n::<M, S, 1, IOV_PER>(mem, sink, plan)),
            },
            2..STAGE_MIN_BATCH => (
                plan.len(),
                self.send_planned_n::<M, S, SMALL, { SMALL * IOV_PER }>(mem, sink, plan),
            ),
            _ => match self.send_staged(mem, sink, plan, stage) {
                Some(r) => r,
                None => (
                    plan.len().min(TX_BATCH),
                    self.send_planned_n::<M, S, TX_BATCH, { TX_BATCH * IOV_PER }>(mem, sink, plan),
                ),
            },
        }
    }

    /// The datagrams of `plan` that fit in `STAGE_CAP` octets, each
    /// framed whole into `stage` behind the one before it and offered as
    /// one buffer (see [`offer_staged`]); `None` (nothing sent) if the
    /// first is larger than `STAGE_MAX_DGRAM` or its payload cannot be
    /// read. A later datagram that is too large, or whose payload cannot
    /// be read, ends the batch before it (the general path takes it when it
    /// reaches the head).
    pub(super) fn send_staged<M: Memory, S: DatagramSink>(
        &self,
        mem: &M,
        sink: &mut S,
        plan: &[Planned],
        stage: &mut Vec<u8>,
    ) -> Option<(usize, io::Result<usize>)> {
        let n = plan.len().min(TX_BATCH);
        let mut dests = [(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0u16); TX_BATCH];
        for (d, p) in dests.iter_mut().zip(&plan[..n]) {
            let e = &self.sq[p.idx];
            *d = (e.dest.ip, e.dest.port);
        }
        offer_staged(sink, stage, &dests[..n], |j, room| {
            let e = &self.sq[plan[j].idx];
            let (repr, off, len) = self.segment(e, plan[j].seg);
            let h = repr.header_len();
            let end = usize::try_from(len)
                .ok()
                .and_then(|l| h.checked_add(l))
                .filter(|&end| end <= room.len())?;
            datagram::emit_header(&repr, room);
            gather_into(mem, &e.wr.payload, off, &mut room[h..end]).then_some(end)
        })
    }

    /// A lone segment of at most [`SMALL_COPY`] payload octets, copied
    /// behind its header into one buffer and sealed there; `None` for a
    /// larger one.
    pub(super) fn send_small<M: Memory, S: DatagramSink>(
        &self,
        mem: &M,
        sink: &mut S,
        p: &Planned,
    ) -> Option<io::Result<usize>> {
        let e = &self.sq[p.idx];
        let mut buf = [0u8; SMALL_FRAME];
        // `plan` checked the gather list: a refused one cannot show here,
        // and if it did, the general path would send what it can read.
        let Framed::Ready(n) = self.frame_small(e, p.seg, mem, &mut buf) else {
            return None;
        };
        let bufs = [IoSlice::new(&buf[..n])];
        let batch = [Datagram {
            dest: (e.dest.ip, e.dest.port),
            bufs: &bufs,
        }];
        Some(sink.send_batch(&batch))
    }

    /// Segment `seg` of `e` framed whole into `buf` (header, payload
    /// copied behind it, CRC) if it carries at most [`SMALL_COPY`] payload
    /// octets and every one of them can be read.
    pub(super) fn frame_small<M: Memory, W: Borrow<SendWr>>(
        &self,
        e: &SqEntry<W>,
        seg: u32,
        mem: &M,
        buf: &mut [u8; SMALL_FRAME],
    ) -> Framed {
        let (repr, off, len) = self.segment(e, seg);
        if len > SMALL_COPY as u64 {
            return Framed::TooBig;
        }
        let at = datagram::emit_header(&repr, buf);
        // `len` ≤ SMALL_COPY octets fit behind a header of at most HDR_CAP.
        let end = at + len as usize;
        if !gather_into(mem, &e.wr.borrow().payload, off, &mut buf[at..end]) {
            return Framed::Unreadable;
        }
        Framed::Ready(datagram::seal(buf, end))
    }

    /// [`UdQp::send_planned`] for at most `N` datagrams (`I` = `N` ×
    /// `IOV_PER` io-vectors).
    pub(super) fn send_planned_n<M: Memory, S: DatagramSink, const N: usize, const I: usize>(
        &self,
        mem: &M,
        sink: &mut S,
        plan: &[Planned],
    ) -> io::Result<usize> {
        let n = plan.len().min(N);
        let plan = &plan[..n];
        let mut hdrs = [[0u8; HDR_CAP]; N];
        let mut hlens = [0usize; N];
        let mut trailers = [[0u8; CRC_LEN]; N];
        let mut pieces: [[&[u8]; MAX_SGE]; N] = [[&[]; MAX_SGE]; N];
        let mut npieces = [0usize; N];
        let mut dests = [(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0u16); N];
        for (j, p) in plan.iter().enumerate() {
            let e = &self.sq[p.idx];
            let (repr, off, len) = self.segment(e, p.seg);
            hlens[j] = datagram::emit_header(&repr, &mut hdrs[j]);
            npieces[j] = payload_pieces(mem, &e.wr.payload, off, len, &mut pieces[j]);
            trailers[j] = datagram::trailer(&hdrs[j][..hlens[j]], &pieces[j][..npieces[j]]);
            dests[j] = (e.dest.ip, e.dest.port);
        }
        let mut iov = [IoSlice::new(&[]); I];
        let mut bounds = [(0usize, 0usize); N];
        let mut k = 0;
        for j in 0..n {
            let start = k;
            iov[k] = IoSlice::new(&hdrs[j][..hlens[j]]);
            k += 1;
            for p in &pieces[j][..npieces[j]] {
                iov[k] = IoSlice::new(p);
                k += 1;
            }
            iov[k] = IoSlice::new(&trailers[j]);
            k += 1;
            bounds[j] = (start, k);
        }
        offer::<S, N>(sink, &dests[..n], &iov, &bounds[..n])
    }

    /// The sink accepted these segments (a prefix of the plan).
    pub(super) fn commit(&mut self, accepted: &[Planned]) {
        for p in accepted {
            if let Some(e) = self.sq.get_mut(p.idx) {
                e.done += 1;
            }
        }
        self.stats.tx_datagrams += accepted.len() as u64;
        while self.sq.front().is_some_and(|e| e.done >= e.nsegs) {
            let e = self.sq.pop_front().expect("front exists");
            self.retire(&e);
        }
    }

    /// A request all of whose datagrams the sink took: counted, and
    /// completed if signaled.
    pub(super) fn retire<W: Borrow<SendWr>>(&mut self, e: &SqEntry<W>) {
        let wr = e.wr.borrow();
        self.stats.tx_messages += 1;
        if wr.flags.signaled {
            self.completions.push_back((
                CqKind::Send,
                WorkCompletion::new(
                    wr.wr_id,
                    WcStatus::Success,
                    WcOpcode::of(&wr.op),
                    wr.payload.len() as u32,
                ),
            ));
        }
    }

    /// Completes the head send request with an error; its remaining
    /// datagrams are not sent.
    pub(super) fn fail_head(&mut self, status: WcStatus) {
        if let Some(e) = self.sq.pop_front() {
            self.stats.tx_errors += 1;
            self.completions.push_back((
                CqKind::Send,
                WorkCompletion::new(e.wr.wr_id, status, WcOpcode::of(&e.wr.op), 0),
            ));
        }
    }

    // ------------------------------------------------------------------
    // Receive
    // ------------------------------------------------------------------
}

/// Whether every octet of a gather list can be read.
pub(super) fn gather_ok<M: Memory>(mem: &M, payload: &Payload) -> bool {
    let Payload::Sgl(sgl) = payload else {
        return true;
    };
    let mut ok = true;
    sgl.for_range(0, sgl.total_len(), |sge, off, n| {
        ok &= mem
            .local_read(sge.lkey, sge.addr.wrapping_add(off), n)
            .is_ok();
    });
    ok
}
