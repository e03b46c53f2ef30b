//! One Write-Record message in progress: its key (source and STag), the
//! octet ranges received, and how a segment is applied to them.
//!
//! Contract: ranges stay sorted, disjoint and non-adjacent, at most the
//! configured number of them; a segment that would need one more is
//! rejected and changes nothing.

use super::*;

/// (source, STag): what a message in progress and the history are keyed
/// on (keyed SipHash: peers choose the keys). Every segment compares its
/// key with the in-progress table's remembered one, so the key is plain
/// aligned integers, built where it is compared ([`Tracker::judge`] and
/// the table's lookups are inlined): a key passed through memory right
/// after it was written stalled the load that compared it (the wider
/// load cannot be forwarded from the narrower stores). The hash takes an IPv4 address as 32 bits,
/// so a key hashes as one SipHash block, as the derived hash of the
/// `DgramAddr` form did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Key {
    /// The source address's octets as one number (IPv4 in the low 32 bits).
    pub(super) ip: u128,
    pub(super) qpn: u32,
    pub(super) stag: u32,
    pub(super) port: u16,
    pub(super) v6: bool,
}

impl Key {
    #[inline]
    pub(super) fn new(src: DgramAddr, stag: u32) -> Key {
        let (ip, v6) = match src.ip {
            IpAddr::V4(a) => (u128::from(u32::from(a)), false),
            IpAddr::V6(a) => (u128::from(a), true),
        };
        Key {
            ip,
            qpn: src.qpn,
            stag,
            port: src.port,
            v6,
        }
    }

    /// The source it was made from.
    pub(super) fn src(&self) -> DgramAddr {
        let ip = if self.v6 {
            IpAddr::V6(Ipv6Addr::from(self.ip))
        } else {
            IpAddr::V4(Ipv4Addr::from(self.ip as u32))
        };
        DgramAddr {
            ip,
            port: self.port,
            qpn: self.qpn,
        }
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // Equal keys have equal `v6` and `ip`, so this agrees with `Eq`.
        if self.v6 {
            h.write_u128(self.ip);
        } else {
            h.write_u32(self.ip as u32);
        }
        h.write_u32(self.qpn);
        h.write_u32(self.stag);
        h.write_u16(self.port);
    }
}

/// The placed ranges of one message: sorted, disjoint, non-adjacent
/// `[start, end)` offsets from the message base. The vector is reused
/// across messages (see [`Tracker`]'s pool).
#[derive(Debug, Clone, Default)]
pub(super) struct Frags {
    pub(super) iv: Vec<(u32, u32)>,
}

impl Frags {
    pub(super) fn as_slice(&self) -> &[(u32, u32)] {
        &self.iv
    }

    /// End of the highest range (0 if none).
    pub(super) fn end(&self) -> u32 {
        self.iv.last().map_or(0, |r| r.1)
    }

    pub(super) fn octets(&self) -> u64 {
        self.iv.iter().map(|&(a, b)| u64::from(b - a)).sum()
    }

    /// Whether the ranges are exactly `[0, total)`.
    pub(super) fn covers(&self, total: u32) -> bool {
        match self.as_slice() {
            [] => total == 0,
            [r] => *r == (0, total),
            _ => false,
        }
    }

    /// Adds `[s, e)` (`s < e`), calling `new(a, b)` for each piece not
    /// covered before, in order. Returns false, having changed nothing and
    /// called nothing, if that would need more than `max` ranges.
    pub(super) fn add(
        &mut self,
        s: u32,
        e: u32,
        max: usize,
        mut new: impl FnMut(u32, u32),
    ) -> bool {
        let iv = &mut self.iv;
        // In-order arrival, the common case: `[s, e)` starts inside or at
        // the end of the highest range, so it can only extend that one
        // (every lower range ends before the highest starts, minus one).
        if let Some(last) = iv.last_mut() {
            if last.0 <= s && s <= last.1 {
                if e > last.1 {
                    new(last.1, e);
                    last.1 = e;
                }
                return true;
            }
        }
        // First range ending at or after s (overlapping or touching), and
        // first range starting after e.
        let i = iv.partition_point(|r| r.1 < s);
        let j = i + iv[i..].partition_point(|r| r.0 <= e);
        if i == j {
            if iv.len() >= max.max(1) {
                return false;
            }
            iv.insert(i, (s, e));
            new(s, e);
            return true;
        }
        let mut cur = s;
        for &(a, b) in &iv[i..j] {
            if a > cur {
                new(cur, a);
            }
            cur = cur.max(b);
        }
        if cur < e {
            new(cur, e);
        }
        iv[i] = (s.min(iv[i].0), e.max(iv[j - 1].1));
        iv.drain(i + 1..j);
        true
    }
}

/// A message in progress.
#[derive(Debug, Clone)]
pub(super) struct Msg {
    pub(super) msn: u32,
    pub(super) base: u64,
    pub(super) total: Option<u32>,
    pub(super) frags: Frags,
    /// When it last placed a new octet (or started).
    pub(super) active: Instant,
    /// Start order, to break ties.
    pub(super) seq: u64,
}

impl Msg {
    pub(super) fn complete(&self) -> bool {
        self.total.is_some_and(|t| self.frags.covers(t))
    }
}

/// Why a segment was not recorded.
pub(super) enum Reject {
    Malformed,
    Overflow,
}

/// Records a well-formed segment `[mo, end)` (base `base`) into `m`, and
/// its new octets into `map`.
#[allow(clippy::too_many_arguments)]
pub(super) fn apply(
    m: &mut Msg,
    base: u64,
    mo: u32,
    end: u32,
    last: bool,
    now: Instant,
    max_fragments: usize,
    mut map: Option<&mut Vec<(u64, u64)>>,
    validity_overflow: &mut u64,
) -> Result<(), Reject> {
    if base != m.base {
        return Err(Reject::Malformed);
    }
    match m.total {
        Some(t) if end > t || (last && end != t) => return Err(Reject::Malformed),
        None if last && end < m.frags.end() => return Err(Reject::Malformed),
        _ => {}
    }
    if mo < end {
        let mut added = false;
        let ok = m.frags.add(mo, end, max_fragments, |a, b| {
            added = true;
            if let Some(v) = map.as_deref_mut() {
                // base + b <= TO + length, checked by the caller.
                if !set_add(v, base + u64::from(a), base + u64::from(b)) {
                    *validity_overflow += 1;
                }
            }
        });
        if !ok {
            return Err(Reject::Overflow);
        }
        if added {
            // Never earlier: a caller's clock going backwards cannot make
            // a deadline pass sooner.
            m.active = m.active.max(now);
        }
    }
    if last {
        m.total = Some(end);
    }
    Ok(())
}
