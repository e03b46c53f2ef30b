//! The receive stash: with CRC, the start of an FPDU that arrived only
//! in part, kept until the FPDU is complete so it is verified before any
//! of it is acted on.
//!
//! Contract: the stash only grows (to the largest FPDU seen); a receiver
//! may read the rest of the FPDU straight into it
//! ([`RcQp::rx_stash_space`], [`RcQp::rx_stash_filled`]).

use super::*;

impl RcQp {
    /// Partial FPDUs are kept until complete (verify, then place) rather
    /// than streamed: with CRC and without markers. (Markers are rare —
    /// siw interoperation — and keep the streaming path.)
    pub(super) fn stashes(&self) -> bool {
        self.cfg.crc && !self.cfg.markers_rx && self.deframer.at_boundary()
    }

    /// With CRC and `crc_direct_min`: the partial FPDU at the front of
    /// `data` (its length field there) lacks so many octets that it is
    /// streamed (and its payload offered to `rx_direct`) rather than kept.
    pub(super) fn streams_crc(&self, data: &[u8]) -> bool {
        let min = self.cfg.crc_direct_min;
        if min == 0 || data.len() < fpdu::LEN_FIELD {
            return false;
        }
        let ulpdu = usize::from(u16::from_be_bytes([data[0], data[1]]));
        fpdu::fpdu_len(ulpdu).saturating_sub(data.len()) >= min
    }

    /// Octets the stashed partial FPDU still lacks (to learn its length:
    /// up to the length field; then to its end). 0 when nothing is kept.
    pub(super) fn rx_stash_need(&self) -> usize {
        let have = self.rx_stash_len;
        if have == 0 {
            return 0;
        }
        if have < fpdu::LEN_FIELD {
            return fpdu::LEN_FIELD - have;
        }
        let ulpdu = usize::from(u16::from_be_bytes([self.rx_stash[0], self.rx_stash[1]]));
        fpdu::fpdu_len(ulpdu).saturating_sub(have)
    }

    /// Makes room for `n` more stashed octets (the vector only grows).
    pub(super) fn stash_reserve(&mut self, n: usize) {
        let end = self.rx_stash_len + n;
        if self.rx_stash.len() < end {
            self.rx_stash.resize(end, 0);
        }
    }

    pub(super) fn stash(&mut self, bytes: &[u8]) {
        self.stash_reserve(bytes.len());
        let at = self.rx_stash_len;
        self.rx_stash[at..at + bytes.len()].copy_from_slice(bytes);
        self.rx_stash_len += bytes.len();
    }

    /// If the stashed FPDU is complete, verifies and handles it.
    pub(super) fn rx_stash_complete<M: Memory>(
        &mut self,
        mem: &mut M,
        srq: Option<&mut RecvQueue>,
    ) {
        if self.rx_stash_len < fpdu::LEN_FIELD || self.rx_stash_need() > 0 {
            return;
        }
        let len = self.rx_stash_len;
        // A Send without a receive waits, whole and unverified yet
        // (`RcConfig::rnr_wait`).
        if self.cfg.rnr_wait && self.state == RcState::Rts {
            self.rx_stash_len = 0;
            let wait = self.rnr_point()
                && self.rnr_must_wait(&self.rx_stash[..len], srq.as_deref()) == Some(true);
            if wait {
                let stash = std::mem::take(&mut self.rx_stash);
                self.rx_hold(&stash[..len], true);
                self.rx_stash = stash;
                return;
            }
            self.rx_stash_len = len;
        }
        let stash = std::mem::take(&mut self.rx_stash);
        self.rx_stash_len = 0;
        let mut srq = srq;
        match self.deframer.decode_whole(&stash[..len]) {
            Ok(Some((n, w))) => {
                debug_assert_eq!(n, len, "the stash holds exactly one FPDU");
                self.rx_whole(w, mem, srq.as_deref_mut());
            }
            Ok(None) => {
                // Cannot happen (complete, at a boundary, no markers); fail
                // safe rather than act on unverified octets.
                self.rx_stream_error(WireError::Truncated);
            }
            Err(e) => {
                if e == WireError::BadCrc {
                    self.rx_crc_failed_send(&stash[..len], srq);
                }
                self.rx_stream_error(e);
            }
        }
        self.rx_stash = stash;
    }

    /// With CRC: the room for the rest of a partial FPDU kept by
    /// [`RcQp::handle_bytes`] (`None` if none is kept, or its length is
    /// not known yet), so a receiver can read the rest of it straight into
    /// place; report the octets read with [`RcQp::rx_stash_filled`].
    #[inline]
    pub fn rx_stash_space(&mut self) -> Option<&mut [u8]> {
        if self.rx_stash_len < fpdu::LEN_FIELD || self.state == RcState::Error {
            return None;
        }
        let need = self.rx_stash_need();
        if need == 0 {
            return None;
        }
        self.stash_reserve(need);
        let at = self.rx_stash_len;
        Some(&mut self.rx_stash[at..at + need])
    }

    /// The length of the FPDU kept in part (see [`RcQp::rx_stash_space`]),
    /// once known. FPDUs of a bulk transfer are usually of one length, so a
    /// receiver that reads whole multiples of it splits none.
    #[inline]
    pub fn rx_stash_fpdu_len(&self) -> Option<usize> {
        (self.rx_stash_len >= fpdu::LEN_FIELD).then(|| self.rx_stash_len + self.rx_stash_need())
    }

    /// `n` octets were written at the start of [`RcQp::rx_stash_space`]:
    /// as if they had arrived through [`RcQp::handle_bytes`]. Refused
    /// (`false`, nothing changed) if more than the space.
    pub fn rx_stash_filled<M: Memory>(&mut self, n: usize, mem: &mut M) -> bool {
        self.rx_stash_filled_from(n, mem, None)
    }

    /// As [`RcQp::rx_stash_filled`], taking receives from a shared receive
    /// queue.
    pub fn rx_stash_filled_with_srq<M: Memory>(
        &mut self,
        n: usize,
        mem: &mut M,
        srq: &mut RecvQueue,
    ) -> bool {
        self.rx_stash_filled_from(n, mem, Some(srq))
    }

    pub(super) fn rx_stash_filled_from<M: Memory>(
        &mut self,
        n: usize,
        mem: &mut M,
        srq: Option<&mut RecvQueue>,
    ) -> bool {
        if n == 0 {
            return true;
        }
        if self.rx_stash_len < fpdu::LEN_FIELD
            || self.state == RcState::Error
            || n > self.rx_stash_need()
            || self.rx_stash.len() < self.rx_stash_len + n
        {
            return false;
        }
        self.rx_stash_len += n;
        self.rx_stash_complete(mem, srq);
        true
    }
}
