//! Transmit: writing framed FPDUs through an `io::Write`, and the
//! shortcut for a lone small message posted to an idle QP.
//!
//! Contract: partial writes and `WouldBlock` are survived (the rest is
//! written on the next call); a send-queue entry completes only when
//! its last FPDU has been written completely.

use super::*;

impl RcQp {
    /// [`RcQp::post_send`] followed by [`RcQp::poll_transmit`], with the
    /// same effect on the queues, the wire and the completions, and the
    /// same returns (the outer error: the post was refused and nothing
    /// happened; the inner: what `poll_transmit` would return).
    ///
    /// The commonest latency case takes a shortcut (`tx_shortcut`):
    /// a plain Send/Send-SE or RDMA Write whose whole message is one small
    /// FPDU, posted to an idle QP in RTS, is framed into one contiguous
    /// buffer and written with a single `write`, and a signaled one
    /// completes at once — no send queue entry, no pending-FPDU ring, no
    /// io-vectors. Anything else, and any check that does not pass, goes
    /// the general way.
    pub fn post_send_and_transmit<M: Memory, W: io::Write>(
        &mut self,
        wr: SendWr,
        mem: &mut M,
        out: &mut W,
    ) -> Result<io::Result<usize>, PostError> {
        if let Some(r) = self.tx_shortcut(&wr, mem, out) {
            return Ok(r);
        }
        self.post_send(wr)?;
        Ok(self.poll_transmit(mem, out))
    }

    /// The transmit shortcut of [`RcQp::post_send_and_transmit`], or `None`
    /// (having changed nothing) when `wr` does not qualify: the QP in RTS
    /// with nothing queued or in flight in either direction (send queue,
    /// pending FPDUs, Read/atomic responses owed or awaited, Terminate,
    /// RTR), no markers; `wr` a Send/Send-SE without Immediate Data or
    /// Invalidate, or an RDMA Write without Immediate Data, whose payload
    /// is readable (lkeys, bounds) and fits one FPDU of at most
    /// [`HDR_CAP`] octets.
    ///
    /// The FPDU is built in the free slot of the pending ring — header,
    /// payload, pad, then the CRC behind them — and written from there. If
    /// the socket takes all of it, the message is done: MSN advanced (Send),
    /// completion queued if signaled. If it takes less, or nothing
    /// (`WouldBlock`), or fails, the slot is committed exactly as the
    /// general path leaves a partly written FPDU (CRC in the trailer) and
    /// the work request enters the send queue as framed, so the rest is
    /// written, completed or flushed the usual way.
    pub(super) fn tx_shortcut<M: Memory, W: io::Write>(
        &mut self,
        wr: &SendWr,
        mem: &M,
        out: &mut W,
    ) -> Option<io::Result<usize>> {
        if self.state != RcState::Rts
            || self.tx_closed
            || self.cfg.markers_tx
            || self.cfg.sq_depth == 0
            || self.terminate.is_some()
            || self.rtr_to_send.is_some()
            || self.in_ird_message
            || !self.pending.is_empty()
            || !self.sq.is_empty()
            || !self.ird.is_empty()
            || !self.ord.is_empty()
        {
            return None;
        }
        let is_send = match wr.op {
            SendOp::Send {
                imm: None,
                invalidate: None,
            } => true,
            // A Write that completes once placed needs its probe.
            SendOp::Write { imm: None, .. } if !(self.cfg.write_placed && wr.flags.signaled) => {
                false
            }
            _ => return None,
        };
        let len = wr.payload.len();
        // The header lengths are fixed: untagged Send 18, tagged Write 14.
        let hlen = if is_send {
            ddp::UNTAGGED_HEADER_LEN
        } else {
            ddp::TAGGED_HEADER_LEN
        };
        let ulpdu = hlen + usize::try_from(len).ok()?;
        let end = fpdu::LEN_FIELD + ulpdu + fpdu::pad_len(ulpdu);
        if ulpdu > self.cfg.max_ulpdu || end + fpdu::CRC_LEN > HDR_CAP {
            return None;
        }
        let repr = match wr.op {
            SendOp::Write {
                remote_addr, rkey, ..
            } => SegmentRepr::tagged(Opcode::RdmaWrite, rkey, remote_addr, true),
            _ => {
                let op = if wr.flags.solicited {
                    Opcode::SendSe
                } else {
                    Opcode::Send
                };
                SegmentRepr::untagged(op, 0, self.tx_msn[0], 0, true, RdmapBody::None)
            }
        };
        debug_assert_eq!(repr.header_len(), hlen);
        let p = self.pending.next_slot();
        let mut at = fpdu::LEN_FIELD + hlen;
        match &wr.payload {
            Payload::Inline(d) => {
                let d = d.as_slice();
                p.hdr[at..at + d.len()].copy_from_slice(d);
                at += d.len();
            }
            Payload::Sgl(sgl) => {
                for sge in sgl.as_slice().iter().filter(|s| s.length > 0) {
                    // A failed check: the general path reports it.
                    let d = mem
                        .local_read(sge.lkey, sge.addr, u64::from(sge.length))
                        .ok()?;
                    p.hdr[at..at + d.len()].copy_from_slice(d);
                    at += d.len();
                }
            }
        }
        repr.emit(&mut p.hdr[fpdu::LEN_FIELD..fpdu::LEN_FIELD + hlen]);
        fpdu::set_ulpdu_len(&mut p.hdr[..fpdu::LEN_FIELD + hlen], len as usize)
            .expect("ULPDU within max_ulpdu");
        p.hdr[at..end].fill(0);
        let crc = if self.cfg.crc {
            let mut c = Crc32c::new();
            c.update(&p.hdr[..end]);
            c.wire_bytes()
        } else {
            [0; 4]
        };
        let total = end + fpdu::CRC_LEN;
        p.hdr[end..total].copy_from_slice(&crc);
        let r = loop {
            match out.write(&p.hdr[..total]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let (n, res) = match r {
            Ok(n) => (n.min(total), Ok(n.min(total))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => (0, Ok(0)),
            Err(e) => (0, Err(e)),
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        if is_send {
            self.tx_msn[0] = self.tx_msn[0].wrapping_add(1);
        }
        self.ird_served_in_row = 0;
        if n == total {
            if wr.flags.signaled {
                self.completions.push_back((
                    CqKind::Send,
                    WorkCompletion::new(
                        wr.wr_id,
                        WcStatus::Success,
                        WcOpcode::of(&wr.op),
                        len as u32,
                    ),
                ));
            }
            return Some(res);
        }
        // The rest goes the general way: the state it would be in now.
        p.hdr_len = end;
        p.trailer[..fpdu::CRC_LEN].copy_from_slice(&crc);
        p.trailer_len = fpdu::CRC_LEN;
        p.total = total;
        p.written = n;
        p.done = Done::SqComplete(seq);
        self.pending.commit();
        self.sq.push_back(SqEntry {
            wr: *wr,
            state: SqState::Framed,
            seq,
        });
        self.sq_cursor += 1;
        Some(res)
    }

    /// Frames what can be sent and writes it to `out` with vectored writes,
    /// until everything is written, `out` takes less than offered, or it
    /// returns `WouldBlock` (reported as `Ok`). Other I/O errors are
    /// returned as they are; the caller should then call
    /// [`RcQp::handle_llp_closed`]. Returns the octets written.
    pub fn poll_transmit<M: Memory, W: io::Write>(
        &mut self,
        mem: &mut M,
        out: &mut W,
    ) -> io::Result<usize> {
        let mut total = 0;
        loop {
            if self.tx_closed {
                return Ok(total);
            }
            self.fill_pending(mem);
            if self.pending.is_empty() {
                return Ok(total);
            }
            // The smallest io-vector array that holds the batch: one FPDU
            // (the latency case), FPDUs of one span each (bulk data), or
            // the worst case. Its initialisation is paid on every attempt,
            // also the ones a full socket refuses.
            let r = if self.pending.len() == 1 {
                write_pending::<M, W, IOV_ONE>(&self.pending, &self.marker_buf, mem, out)
            } else if self.pending.iter().all(|p| p.nspans <= 1) {
                write_pending::<M, W, IOV_MID>(&self.pending, &self.marker_buf, mem, out)
            } else {
                write_pending::<M, W, IOV_CAP>(&self.pending, &self.marker_buf, mem, out)
            };
            let (n, offered) = match r {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(total),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            total += n;
            self.advance_written(n);
            if n < offered {
                return Ok(total);
            }
        }
    }

    pub(super) fn advance_written(&mut self, mut n: usize) {
        while n > 0 {
            let Some(p) = self.pending.front_mut() else {
                break;
            };
            let take = (p.total - p.written).min(n);
            p.written += take;
            n -= take;
            if p.written == p.total {
                let (done, owned) = (p.done, p.owned);
                self.pending.pop_front();
                match done {
                    Done::Nothing => {}
                    Done::SqComplete(seq) => {
                        let len = self
                            .sq_entry_mut(seq)
                            .map(|e| e.wr.payload.len() as u32)
                            .unwrap_or(0);
                        self.complete_seq(seq, WcStatus::Success, len);
                    }
                    Done::Terminate => {}
                }
                if owned.is_some() && self.pending.iter().all(|q| q.owned.is_none()) {
                    self.marker_buf.clear();
                }
            }
        }
        if self.state == RcState::Error
            && self.pending.is_empty()
            && self.terminate.is_none()
            && !self.tx_closed
        {
            self.tx_closed = true;
            self.events.push_back(RcEvent::TxClosed);
        }
    }

    /// Frames FPDUs into the pending batch.
    pub(super) fn fill_pending<M: Memory>(&mut self, mem: &mut M) {
        let mut bytes: usize = self.pending.iter().map(|p| p.total - p.written).sum();
        // With markers every FPDU is copied into one buffer; keep one at a
        // time so the buffer never moves under a pending FPDU.
        let cap = if self.cfg.markers_tx { 1 } else { TX_BATCH };
        // The octet bound keeps a CRC'd batch in cache until written.
        let max_bytes = if self.cfg.crc {
            TX_BATCH_BYTES
        } else {
            usize::MAX
        };
        while self.pending.len() < cap && bytes < max_bytes {
            let before = self.pending.len();
            if self.next_fpdu(mem).is_none() {
                break;
            }
            match self.pending.back() {
                Some(p) if self.pending.len() == before + 1 => bytes += p.total - p.written,
                // Framing failed (the QP dropped FPDUs not yet started).
                _ => bytes = self.pending.iter().map(|p| p.total - p.written).sum(),
            }
        }
    }

    /// The queued Terminate as an FPDU (QN 2, MSN 1, MO 0, L), if any.
    pub(super) fn terminate_fpdu<M: Memory>(&mut self, mem: &mut M) -> Option<Built> {
        let t = self.terminate.take()?;
        let repr = SegmentRepr::untagged(Opcode::Terminate, 2, 1, 0, true, RdmapBody::Terminate(t));
        Some(self.build(mem, &repr, &Body::None, Done::Terminate))
    }

    /// Builds the next FPDU to send, if any.
    pub(super) fn next_fpdu<M: Memory>(&mut self, mem: &mut M) -> Option<Built> {
        if let Some(p) = self.terminate_fpdu(mem) {
            return Some(p);
        }
        if self.state != RcState::Rts {
            return None;
        }
        if let Some(kind) = self.rtr_to_send.take() {
            return Some(self.build_rtr(mem, kind));
        }
        loop {
            // Continue the message in progress, then choose a source.
            let use_ird = if self.in_ird_message {
                true
            } else if self.sq_mid_message() {
                // Finish the Send/Write in progress first: two messages of
                // the same kind must not interleave (wire.md §7.3).
                false
            } else {
                let ird_ready = !self.ird.is_empty();
                let sq_ready = self.sq_has_work();
                match (ird_ready, sq_ready) {
                    (false, false) => return None,
                    (true, false) => true,
                    (false, true) => false,
                    (true, true) => self.ird_served_in_row < self.cfg.read_burst.max(1),
                }
            };
            let r = if use_ird {
                self.next_ird_fpdu(mem)
            } else {
                self.ird_served_in_row = 0;
                self.next_sq_fpdu(mem)
            };
            match r {
                Some(p) => return Some(p),
                None if self.state != RcState::Rts => {
                    return self.terminate_fpdu(mem);
                }
                // A work request that needed no FPDU (local invalidate).
                None => continue,
            }
        }
    }
}

/// Writes the unwritten part of as many of `pending` as fit in `N`
/// io-vectors with one vectored write; returns (octets written, octets
/// offered).
pub(super) fn write_pending<M: Memory, W: io::Write, const N: usize>(
    pending: &TxRing,
    marker_buf: &[u8],
    mem: &M,
    out: &mut W,
) -> io::Result<(usize, usize)> {
    let mut iov: [IoSlice<'_>; N] = [IoSlice::new(&[]); N];
    let mut k = 0;
    let mut offered = 0;
    for p in pending.iter() {
        if k + p.nspans + 2 > N {
            break;
        }
        offered += push_iov(p, marker_buf, mem, &mut iov, &mut k);
    }
    out.write_vectored(&iov[..k]).map(|n| (n, offered))
}

/// Appends the unwritten part of `p` to `iov`; returns the octets added.
pub(super) fn push_iov<'a, M: Memory>(
    p: &'a PendingFpdu,
    marker_buf: &'a [u8],
    mem: &'a M,
    iov: &mut [IoSlice<'a>],
    k: &mut usize,
) -> usize {
    let mut skip = p.written;
    let mut added = 0;
    let mut push = |s: &'a [u8], iov: &mut [IoSlice<'a>], k: &mut usize| {
        if skip >= s.len() {
            skip -= s.len();
            return;
        }
        let s = &s[skip..];
        skip = 0;
        if !s.is_empty() {
            iov[*k] = IoSlice::new(s);
            *k += 1;
            added += s.len();
        }
    };
    if let Some(start) = p.owned {
        push(&marker_buf[start..start + p.total], iov, k);
        return added;
    }
    push(&p.hdr[..p.hdr_len], iov, k);
    for s in &p.spans[..p.nspans] {
        push(span_slice(mem, s), iov, k);
    }
    push(&p.trailer[..p.trailer_len], iov, k);
    added
}
