//! Direct placement: the receiver reads the rest of an FPDU's payload
//! from the transport straight into registered memory.
//!
//! Contract: [`RcQp::rx_direct`] tells where the rest of the payload goes
//! once the segment's header passed every check (the caller still checks
//! each piece against its memory and falls back to
//! [`RcQp::handle_bytes`] if one fails); [`RcQp::rx_direct_placed`]
//! records octets placed as if they had arrived through `handle_bytes`.

use super::*;

/// One piece of memory a directly placed payload goes to (see
/// [`RcQp::rx_direct`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectPiece {
    /// STag (`remote`: needs REMOTE_WRITE) or lkey (needs LOCAL_WRITE).
    pub key: u32,
    /// Address in the region's address space.
    pub addr: u64,
    /// Octets.
    pub len: u64,
    /// A peer-supplied STag (RDMA Write) rather than a local key.
    pub remote: bool,
}

/// The rest of an FPDU's payload, for direct placement
/// ([`RcQp::rx_direct`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectRx {
    /// Where the octets go, in order.
    pub pieces: [DirectPiece; MAX_SGE],
    /// Pieces in use.
    pub npieces: usize,
    /// Payload octets left in the FPDU (the sum of the pieces).
    pub len: usize,
    /// Octets after the payload before the next FPDU (pad and CRC field).
    pub trailer: usize,
    /// Octets of the next FPDU's length field and header if it is of the
    /// same kind as this one (tagged or untagged): reading exactly
    /// `trailer + next_header` octets after the payload ends a read at the
    /// next payload, so it too can be placed directly.
    pub next_header: usize,
}

impl DirectRx {
    /// The pieces in use.
    pub fn pieces(&self) -> &[DirectPiece] {
        &self.pieces[..self.npieces]
    }
}

impl RcQp {
    /// Direct placement (RFC 5041 §2's "placement from the transport"):
    /// where the rest of the payload of the FPDU being received goes, for a
    /// receiver that can move it from the socket straight into memory
    /// instead of handing it to [`RcQp::handle_bytes`]. Offered only on a
    /// connection without markers, and with CRC only when
    /// `RcConfig::crc_direct_min` lets FPDUs stream (otherwise every FPDU
    /// is verified before it is placed), mid-payload of an RDMA Write, Read
    /// Response or Send segment whose header passed every check. The caller
    /// must still check each piece against its memory (the region may have
    /// gone since the header was checked) and fall back to `handle_bytes`
    /// if one fails — which then reports the error as usual.
    #[inline]
    pub fn rx_direct(&self) -> Option<DirectRx> {
        // The common refusals first, inline at the caller: this is asked
        // on every receive poll.
        if (self.cfg.crc && self.cfg.crc_direct_min == 0) || self.rx_seg.is_none() {
            return None;
        }
        self.rx_direct_resolve()
    }

    pub(super) fn rx_direct_resolve(&self) -> Option<DirectRx> {
        if self.state == RcState::Error || self.rx_deferred.is_some() {
            return None;
        }
        let (left, trailer) = self.deframer.direct_payload()?;
        let seg = self.rx_seg.as_ref()?;
        if left == 0 || seg.payload_len.checked_sub(seg.placed) != Some(left as u64) {
            return None;
        }
        let mut d = DirectRx {
            pieces: [DirectPiece::default(); MAX_SGE],
            npieces: 0,
            len: left,
            trailer,
            next_header: fpdu::LEN_FIELD + seg.repr.header_len(),
        };
        let at = seg.placed;
        let sgl = match seg.target {
            Target::Discard => return None,
            Target::Write { stag, to } => {
                d.pieces[0] = DirectPiece {
                    key: stag,
                    addr: to.wrapping_add(at),
                    len: left as u64,
                    remote: true,
                };
                d.npieces = 1;
                return Some(d);
            }
            Target::ReadResp { offset } => {
                let OrdEntry { seq: Some(seq), .. } = *self.ord.front()? else {
                    return None;
                };
                let e = self.sq.iter().find(|e| e.seq == seq)?;
                let Payload::Sgl(sgl) = e.wr.payload else {
                    return None;
                };
                (sgl, offset + at)
            }
            Target::Recv { offset } => (self.rx_recv?.wr.sgl, offset + at),
        };
        let (sgl, off) = sgl;
        let mut k = 0;
        let ok = sgl.for_range(off, left as u64, |sge, o, n| {
            d.pieces[k] = DirectPiece {
                key: sge.lkey,
                addr: sge.addr.wrapping_add(o),
                len: n,
                remote: false,
            };
            k += 1;
        });
        if !ok {
            return None;
        }
        d.npieces = k;
        Some(d)
    }

    /// Records that the first `n` octets described by [`RcQp::rx_direct`]
    /// were placed by the caller, as if they had arrived through
    /// [`RcQp::handle_bytes`]. With CRC, `placed` holds those octets as they
    /// now are in memory, in order (pieces of `n` octets in all), for the
    /// CRC to cover; without, it is not read (pass `&[]`). Refused
    /// (`false`, nothing changed) when `rx_direct` offers fewer than `n`
    /// octets, or, with CRC, `placed` does not hold `n`.
    pub fn rx_direct_placed(&mut self, n: usize, placed: &[&[u8]]) -> bool {
        if n == 0 {
            return true;
        }
        if self.rx_direct().is_none_or(|d| d.len < n) {
            return false;
        }
        let ok = if self.cfg.crc {
            placed.iter().map(|p| p.len()).sum::<usize>() == n
                && placed.iter().all(|p| self.deframer.placed_payload(p))
        } else {
            self.deframer.skip_payload(n)
        };
        if !ok {
            return false;
        }
        if let Some(seg) = &mut self.rx_seg {
            seg.placed += n as u64;
        }
        true
    }
}
