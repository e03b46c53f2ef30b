//! The validity map of an STag: a sorted set of disjoint, non-adjacent
//! octet intervals.
//!
//! Contract: an addition that would need more than
//! [`MAX_VALID_INTERVALS`] intervals changes nothing and says so.

use super::*;

/// Adds `[s, e)` (`s < e`) to a sorted set of disjoint, non-adjacent
/// intervals. Returns false, changing nothing, if it would need more than
/// [`MAX_VALID_INTERVALS`].
pub(super) fn set_add(v: &mut Vec<(u64, u64)>, s: u64, e: u64) -> bool {
    // A message placed in order extends the highest range (as in
    // `Frags::add`).
    if let Some(last) = v.last_mut() {
        if last.0 <= s && s <= last.1 {
            last.1 = last.1.max(e);
            return true;
        }
    }
    let i = v.partition_point(|r| r.1 < s);
    let j = i + v[i..].partition_point(|r| r.0 <= e);
    if i == j {
        if v.len() >= MAX_VALID_INTERVALS {
            return false;
        }
        v.insert(i, (s, e));
        return true;
    }
    v[i] = (s.min(v[i].0), e.max(v[j - 1].1));
    v.drain(i + 1..j);
    true
}

/// Removes `[s, e)` from the set. Returns false if a split of a full set
/// had to drop the shorter piece.
pub(super) fn set_remove(v: &mut Vec<(u64, u64)>, s: u64, e: u64) -> bool {
    if s >= e {
        return true;
    }
    let i = v.partition_point(|r| r.1 <= s);
    let j = i + v[i..].partition_point(|r| r.0 < e);
    if i == j {
        return true;
    }
    let left = (v[i].0 < s).then_some((v[i].0, s));
    let right = (v[j - 1].1 > e).then_some((e, v[j - 1].1));
    match (left, right) {
        (Some(l), Some(r)) if j - i == 1 => {
            if v.len() >= MAX_VALID_INTERVALS {
                v[i] = if l.1 - l.0 >= r.1 - r.0 { l } else { r };
                return false;
            }
            v[i] = l;
            v.insert(i + 1, r);
        }
        (Some(l), Some(r)) => {
            v[i] = l;
            v[i + 1] = r;
            v.drain(i + 2..j);
        }
        (Some(x), None) | (None, Some(x)) => {
            v[i] = x;
            v.drain(i + 1..j);
        }
        (None, None) => {
            v.drain(i..j);
        }
    }
    true
}
