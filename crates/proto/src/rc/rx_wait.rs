//! Receiver not ready (`RcConfig::rnr_wait`): a Send that finds no posted
//! receive waits for one instead of terminating the stream.
//!
//! Contract: the pause point is an FPDU boundary before anything of the
//! waiting message was acted on (no receive taken, MSN not advanced,
//! nothing placed or completed); every octet from that FPDU's first on is
//! held, in order, and handed to the receive path again once a receive is
//! posted ([`RcQp::rx_resume`]). Octets fed while paused are appended to
//! what is held (a driver stops reading instead: [`RcQp::rx_paused`]).

use super::*;

impl RcQp {
    /// True while the receive path waits for a receive (`RcConfig::rnr_wait`):
    /// a Send (or the Immediate Data message of a Write with immediate)
    /// found none posted and was not consumed. A driver stops reading the
    /// transport (its flow control then holds the sender back, as an
    /// InfiniBand RNR NAK does) and calls [`RcQp::rx_resume`] after posting
    /// receives. Transmit is unaffected.
    #[inline]
    pub fn rx_paused(&self) -> bool {
        self.rx_paused && self.state != RcState::Error
    }

    /// Octets held while paused (the waiting FPDU and what followed it),
    /// or the start of an FPDU too short to tell whether it must wait.
    pub fn rx_held(&self) -> usize {
        self.rx_held.len()
    }

    /// After receives were posted: hands the held octets to the receive
    /// path again (see [`RcQp::rx_paused`]); it may pause again at a later
    /// Send. Does nothing when not paused or still no receive is posted.
    pub fn rx_resume<M: Memory>(&mut self, mem: &mut M) {
        self.handle_bytes_from(&[], mem, None);
    }

    /// As [`RcQp::rx_resume`], for a QP taking its receives from `srq`.
    pub fn rx_resume_with_srq<M: Memory>(&mut self, mem: &mut M, srq: &mut RecvQueue) {
        self.handle_bytes_from(&[], mem, Some(srq));
    }

    /// Where an FPDU may have to wait: between FPDUs and messages, in RTS,
    /// without markers (the peek below reads the FPDU's octets as they
    /// are).
    #[inline]
    pub(super) fn rnr_point(&self) -> bool {
        self.cfg.rnr_wait
            && !self.cfg.markers_rx
            && self.state == RcState::Rts
            && self.awaiting_rtr.is_none()
            && self.rx_seg.is_none()
            && self.rx_stash_len == 0
            && self.deframer.at_boundary()
    }

    /// Whether the FPDU starting at `b` needs a receive that is not
    /// posted: a Send starting a message (QN 0, MO 0, the expected MSN) or
    /// a Write's Immediate Data message. `None`: too few octets to tell.
    /// A header breaking a rule is not held (the receive path reports it).
    pub(super) fn rnr_must_wait(&self, b: &[u8], srq: Option<&RecvQueue>) -> Option<bool> {
        let h = b.get(fpdu::LEN_FIELD..)?;
        let (&ddp_ctl, &rdmap_ctl) = (h.first()?, h.get(1)?);
        if ddp_ctl & ddp::FLAG_T != 0 || ddp_ctl & ddp::DV_MASK != ddp::DDP_VERSION {
            return Some(false);
        }
        let is = |o: Opcode| rdmap_ctl == o.control_octet();
        let send = is(Opcode::Send)
            || is(Opcode::SendSe)
            || is(Opcode::SendInvalidate)
            || is(Opcode::SendSeInvalidate);
        let imm =
            self.cfg.softrdma_ext && (is(Opcode::ImmediateData) || is(Opcode::ImmediateDataSe));
        if !send && !imm {
            return Some(false);
        }
        let hdr = h.get(..ddp::UNTAGGED_HEADER_LEN)?;
        let word = |at: usize| u32::from_be_bytes([hdr[at], hdr[at + 1], hdr[at + 2], hdr[at + 3]]);
        if word(6) != 0 || word(14) != 0 || word(10) != self.rx_msn[0] || self.rx_recv.is_some() {
            return Some(false);
        }
        if imm {
            // Bit 32 set: it belongs to the Send that follows (which waits
            // itself); clear: a Write with immediate, which takes a receive.
            let body = h.get(ddp::UNTAGGED_HEADER_LEN..ddp::UNTAGGED_HEADER_LEN + 8)?;
            if body[3] & 1 != 0 {
                return Some(false);
            }
        }
        Some(srq.map_or(self.rq.is_empty(), |q| q.is_empty()))
    }

    /// Keeps `data` (the rest of this input, from an FPDU's first octet)
    /// and pauses if `pause`.
    pub(super) fn rx_hold(&mut self, data: &[u8], pause: bool) {
        self.rx_held.extend_from_slice(data);
        self.rx_paused |= pause;
    }
}
