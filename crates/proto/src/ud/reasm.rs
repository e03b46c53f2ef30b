//! Reassembly state: the octet ranges received of one message, the
//! message itself, and the window of finished MSNs per source.
//!
//! Contract: ranges stay disjoint and non-adjacent, at most
//! [`MAX_REASM_FRAGMENTS`] of them; the window answers "already
//! finished?" for the last [`DEDUP_WINDOW`] MSNs of a source.

use super::*;

/// Disjoint, non-adjacent `[start, end)` ranges received of one message.
#[derive(Debug, Clone, Copy)]
pub(super) struct Frags {
    pub(super) iv: [(u32, u32); MAX_REASM_FRAGMENTS],
    pub(super) n: usize,
}

impl Frags {
    pub(super) const EMPTY: Frags = Frags {
        iv: [(0, 0); MAX_REASM_FRAGMENTS],
        n: 0,
    };

    pub(super) fn as_slice(&self) -> &[(u32, u32)] {
        &self.iv[..self.n]
    }

    pub(super) fn end(&self) -> u32 {
        self.as_slice().last().map_or(0, |r| r.1)
    }

    /// Every octet of `[s, e)` is present (true when empty).
    pub(super) fn covers(&self, s: u32, e: u32) -> bool {
        s >= e || self.as_slice().iter().any(|&(a, b)| a <= s && e <= b)
    }

    /// Exactly `[0, total)` is present.
    pub(super) fn complete(&self, total: u32) -> bool {
        match self.as_slice() {
            [] => total == 0,
            [r] => *r == (0, total),
            _ => false,
        }
    }

    /// The first range touching or overlapping `[s, e]`, and the first
    /// range after it that does not.
    pub(super) fn span(&self, s: u32, e: u32) -> (usize, usize) {
        let n = self.n;
        let i = self.iv[..n].iter().position(|r| r.1 >= s).unwrap_or(n);
        let j = i + self.iv[i..n].iter().position(|r| r.0 > e).unwrap_or(n - i);
        (i, j)
    }

    /// Whether `[s, e)` can be added without exceeding the bound.
    pub(super) fn can_add(&self, s: u32, e: u32) -> bool {
        if s >= e {
            return true;
        }
        let (i, j) = self.span(s, e);
        i != j || self.n < MAX_REASM_FRAGMENTS
    }

    /// Adds `[s, e)`; the caller checked [`Frags::can_add`].
    pub(super) fn add(&mut self, s: u32, e: u32) {
        if s >= e {
            return;
        }
        let n = self.n;
        let (i, j) = self.span(s, e);
        if i == j {
            if n == MAX_REASM_FRAGMENTS {
                return;
            }
            self.iv.copy_within(i..n, i + 1);
            self.iv[i] = (s, e);
            self.n += 1;
            return;
        }
        self.iv[i] = (s.min(self.iv[i].0), e.max(self.iv[j - 1].1));
        self.iv.copy_within(j..n, i + 1);
        self.n -= j - i - 1;
    }
}

/// A Send message in reassembly.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reasm {
    pub(super) src: DgramAddr,
    pub(super) msn: u32,
    /// Posting sequence of the claimed receive.
    pub(super) seq: u64,
    pub(super) wr: RecvWr,
    /// Octets of payload the receive takes (after the GRH, within max_msg).
    pub(super) cap: u64,
    /// `None`: never times out (the timeout overflowed `Instant`).
    pub(super) deadline: Option<Instant>,
    /// Known once the L segment arrived.
    pub(super) total: Option<u32>,
    /// The L segment was Immediate Data.
    pub(super) last_imm: bool,
    pub(super) imm: Option<u32>,
    pub(super) solicited: bool,
    pub(super) frags: Frags,
}

/// One received Send-family segment, decoded.
#[derive(Debug, Clone, Copy)]
pub(super) struct RxSeg {
    pub(super) mo: u32,
    pub(super) end: u32,
    pub(super) last: bool,
    pub(super) imm_seg: bool,
    pub(super) imm: Option<u32>,
    pub(super) solicited: bool,
}

/// Finished MSNs of one source: a ring of [`DEDUP_WINDOW`] bits below and
/// including `highest`.
#[derive(Debug, Clone, Copy)]
pub(super) struct SrcWin {
    pub(super) addr: DgramAddr,
    pub(super) highest: u32,
    pub(super) bits: [u64; WIN_WORDS],
    pub(super) used: u64,
}

impl SrcWin {
    pub(super) fn bit(msn: u32) -> (usize, u64) {
        let b = (msn % DEDUP_WINDOW) as usize;
        (b / 64, 1u64 << (b % 64))
    }

    pub(super) fn is_done(&self, msn: u32) -> bool {
        if self.highest.wrapping_sub(msn) >= DEDUP_WINDOW {
            // Newer than anything seen, or so old it means a restart.
            return false;
        }
        let (w, m) = Self::bit(msn);
        self.bits[w] & m != 0
    }

    pub(super) fn mark(&mut self, msn: u32) {
        let behind = self.highest.wrapping_sub(msn);
        if behind >= DEDUP_WINDOW {
            let ahead = msn.wrapping_sub(self.highest);
            if ahead < DEDUP_WINDOW {
                // Slide forward: forget the bits the window leaves.
                for k in 1..=ahead {
                    let (w, m) = Self::bit(self.highest.wrapping_add(k));
                    self.bits[w] &= !m;
                }
            } else {
                // Far ahead, or far behind (a restarted sender).
                self.bits = [0; WIN_WORDS];
            }
            self.highest = msn;
        }
        let (w, m) = Self::bit(msn);
        self.bits[w] |= m;
    }
}
