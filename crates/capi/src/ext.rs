//! softrdma's own C calls (`include/softrdma/verbs.h`, version node
//! `SOFTRDMA_1.0`): the Write-Record validity map of a datagram QP.
//! Offsets are relative to the memory region (`mr->addr` is offset 0).
//!
//! The other extensions are values, not calls: `IBV_QPT_SOFTRDMA_RD`
//! ([`crate::verbs_api::IBV_QPT_SOFTRDMA_RD`]) for `ibv_create_qp`,
//! `IBV_WR_SOFTRDMA_WRITE_RECORD` ([`crate::datapath::IBV_WR_SOFTRDMA_WRITE_RECORD`])
//! for `ibv_post_send`, and the completion opcodes/status the engine
//! reports for Write-Records.

use std::ffi::c_int;
use std::time::Duration;

use crate::abi::*;
use crate::export::{export, guard};
use crate::objects::*;

/// `struct softrdma_range`: `length` octets at `offset` of the region.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct softrdma_range {
    /// Offset from the region's start.
    pub offset: u64,
    /// Octets.
    pub length: u64,
}

fn target<'a>(qp: *mut ibv_qp, mr: *mut ibv_mr) -> Result<(&'a QpObj, &'a MrObj), c_int> {
    // SAFETY: the application's QP and MR (verbs contract).
    let q = unsafe { qp_from_raw(qp) }.ok_or(libc::EINVAL)?;
    // SAFETY: as above.
    let m = unsafe { mr_from_raw(mr) }.ok_or(libc::EINVAL)?;
    if q.dgram().is_none() {
        return Err(libc::EOPNOTSUPP);
    }
    Ok((q, m))
}

fn in_region(m: &MrObj, offset: u64, len: u64) -> Result<u64, c_int> {
    match offset.checked_add(len) {
        Some(end) if end <= m.mr.length as u64 => Ok(m.mr.addr as u64 + offset),
        _ => Err(libc::ERANGE),
    }
}

/// `softrdma_record_valid_ranges`: the valid ranges of `[offset,
/// offset+len)` of `mr` at `qp`; writes up to `max` to `out`, their count
/// to `*n`; returns 0, `E2BIG` if more did not fit (the first `max` are
/// written), or an errno.
#[allow(non_camel_case_types)]
pub unsafe extern "C" fn softrdma_record_valid_ranges(
    qp: *mut ibv_qp,
    mr: *mut ibv_mr,
    offset: u64,
    len: u64,
    out: *mut softrdma_range,
    max: usize,
    n: *mut usize,
) -> c_int {
    guard(libc::EIO, || {
        let (q, m) = match target(qp, mr) {
            Ok(x) => x,
            Err(e) => return e,
        };
        let to = match in_region(m, offset, len) {
            Ok(t) => t,
            Err(e) => return e,
        };
        if max > 0 && out.is_null() {
            return libc::EINVAL;
        }
        let mut buf = vec![(0u64, 0u64); max];
        let (k, more) = q
            .dgram()
            .map_or((0, false), |d| d.valid_ranges(m.stag, to, len, &mut buf));
        let base = m.mr.addr as u64;
        for (i, (s, e)) in buf[..k].iter().enumerate() {
            // SAFETY: the application's array of max entries; i < k <= max.
            unsafe {
                *out.add(i) = softrdma_range {
                    offset: s - base,
                    length: e - s,
                }
            };
        }
        if !n.is_null() {
            // SAFETY: the application's out-count.
            unsafe { *n = k };
        }
        if more {
            libc::E2BIG
        } else {
            0
        }
    })
}

/// `softrdma_record_is_valid`: 1 if every octet of the range was placed
/// by Write-Records and not cleared since, 0 if not, a negative errno on
/// error.
pub unsafe extern "C" fn softrdma_record_is_valid(
    qp: *mut ibv_qp,
    mr: *mut ibv_mr,
    offset: u64,
    len: u64,
) -> c_int {
    guard(-libc::EIO, || {
        let (q, m) = match target(qp, mr) {
            Ok(x) => x,
            Err(e) => return -e,
        };
        match in_region(m, offset, len) {
            Ok(to) => c_int::from(q.dgram().is_some_and(|d| d.is_valid(m.stag, to, len))),
            Err(e) => -e,
        }
    })
}

/// `softrdma_record_clear`: marks the range not valid (its data was
/// used); 0 or an errno.
pub unsafe extern "C" fn softrdma_record_clear(
    qp: *mut ibv_qp,
    mr: *mut ibv_mr,
    offset: u64,
    len: u64,
) -> c_int {
    guard(libc::EIO, || {
        let (q, m) = match target(qp, mr) {
            Ok(x) => x,
            Err(e) => return e,
        };
        match in_region(m, offset, len) {
            Ok(to) => {
                if let Some(d) = q.dgram() {
                    d.clear(m.stag, to, len);
                }
                0
            }
            Err(e) => e,
        }
    })
}

/// `softrdma_record_set_partial_timeout`: how long (µs) a Write-Record
/// message may place nothing new before it is retired as partial.
pub unsafe extern "C" fn softrdma_record_set_partial_timeout(qp: *mut ibv_qp, usec: u64) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the application's QP.
        match unsafe { qp_from_raw(qp) }.and_then(|q| q.dgram()) {
            Some(d) => {
                d.set_record_partial_timeout(Duration::from_micros(usec));
                0
            }
            None => libc::EOPNOTSUPP,
        }
    })
}

export!(
    softrdma_record_valid_ranges,
    softrdma_record_is_valid,
    softrdma_record_clear,
    softrdma_record_set_partial_timeout,
);
