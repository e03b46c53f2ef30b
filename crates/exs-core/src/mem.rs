//! Memory registrations: handle → region, and the check that an
//! operation's buffer lies inside the region its handle names.
//!
//! On kernel sockets a registration is bookkeeping only (the kernel copies
//! anyway); the RDMA model will attach a memory region of the protection
//! domain to the same entry.

use std::collections::HashMap;

use crate::abi::EXS_MHANDLE_UNREGISTERED;
use crate::Errno;

/// One registered region.
#[derive(Debug)]
pub struct Region {
    /// First byte.
    pub addr: usize,
    /// Length in bytes (> 0).
    pub len: usize,
    /// Queued operations naming this handle (deregistration waits for 0).
    pub inflight: usize,
    /// The engine's STag once an operation of the RDMA model used the
    /// region (registered on first use, deregistered with the handle).
    pub stag: Option<u32>,
}

/// Every live registration.
#[derive(Debug, Default)]
pub struct Registry {
    regions: HashMap<i32, Region>,
    next: i32,
}

/// Whether `[buf, buf + len)` lies inside `[addr, addr + rlen)`, without
/// overflow anywhere.
pub fn within(addr: usize, rlen: usize, buf: usize, len: usize) -> bool {
    let Some(rend) = addr.checked_add(rlen) else {
        return false;
    };
    let Some(end) = buf.checked_add(len) else {
        return false;
    };
    buf >= addr && end <= rend
}

impl Registry {
    /// Registers `[addr, addr + len)`; the caller checked the range.
    pub fn add(&mut self, addr: usize, len: usize) -> Result<i32, Errno> {
        if self.regions.len() >= i32::MAX as usize / 2 {
            return Err(libc::ENOMEM);
        }
        loop {
            let h = self.next;
            self.next = if self.next == i32::MAX {
                0
            } else {
                self.next + 1
            };
            if let std::collections::hash_map::Entry::Vacant(v) = self.regions.entry(h) {
                v.insert(Region {
                    addr,
                    len,
                    inflight: 0,
                    stag: None,
                });
                return Ok(h);
            }
        }
    }

    /// Removes `h`: EINVAL when unknown, EBUSY while operations name it.
    /// Returns the engine STag the region had, if any.
    pub fn remove(&mut self, h: i32) -> Result<Option<u32>, Errno> {
        match self.regions.get(&h) {
            None => Err(libc::EINVAL),
            Some(r) if r.inflight > 0 => Err(libc::EBUSY),
            Some(_) => Ok(self.regions.remove(&h).and_then(|r| r.stag)),
        }
    }

    /// The region of `h`, mutable (the RDMA model records its STag).
    pub fn get_mut(&mut self, h: i32) -> Option<&mut Region> {
        self.regions.get_mut(&h)
    }

    /// Checks that `[buf, buf + len)` lies inside `h`'s region (any buffer
    /// for `EXS_MHANDLE_UNREGISTERED`); EINVAL otherwise.
    pub fn check(&self, h: i32, buf: usize, len: usize) -> Result<(), Errno> {
        if h == EXS_MHANDLE_UNREGISTERED {
            return Ok(());
        }
        match self.regions.get(&h) {
            Some(r) if within(r.addr, r.len, buf, len) => Ok(()),
            _ => Err(libc::EINVAL),
        }
    }

    /// Counts one more queued operation on each registered handle of `hs`.
    pub fn hold(&mut self, hs: &[i32]) {
        for h in hs {
            if let Some(r) = self.regions.get_mut(h) {
                r.inflight += 1;
            }
        }
    }

    /// Undoes [`Registry::hold`] when the operation completes.
    pub fn release(&mut self, hs: &[i32]) {
        for h in hs {
            if let Some(r) = self.regions.get_mut(h) {
                r.inflight = r.inflight.saturating_sub(1);
            }
        }
    }

    /// The region of `h`, if registered.
    pub fn get(&self, h: i32) -> Option<&Region> {
        self.regions.get(&h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_edges_of_a_region() {
        assert!(within(100, 10, 100, 10));
        assert!(within(100, 10, 109, 1));
        assert!(within(100, 10, 110, 0));
        assert!(!within(100, 10, 99, 1));
        assert!(!within(100, 10, 105, 6));
        assert!(!within(usize::MAX - 1, 10, usize::MAX - 1, 1));
        assert!(!within(0, 10, usize::MAX, 2));
    }

    #[test]
    fn handles_are_checked_and_held() {
        let mut r = Registry::default();
        let h = r.add(4096, 8192).unwrap();
        assert_eq!(r.check(h, 4096, 8192), Ok(()));
        assert_eq!(r.check(h, 4095, 1), Err(libc::EINVAL));
        assert_eq!(r.check(h + 1, 4096, 1), Err(libc::EINVAL));
        assert_eq!(r.check(EXS_MHANDLE_UNREGISTERED, 1, 1), Ok(()));
        r.hold(&[h]);
        assert_eq!(r.remove(h), Err(libc::EBUSY));
        r.release(&[h]);
        assert_eq!(r.remove(h), Ok(None));
        assert_eq!(r.remove(h), Err(libc::EINVAL));
        assert_eq!(r.check(h, 4096, 1), Err(libc::EINVAL));
    }

    proptest! {
        /// `within` agrees with the same test done in 128-bit arithmetic.
        #[test]
        fn within_is_exact(addr: usize, rlen: usize, buf: usize, len: usize) {
            let wide = (buf as u128) >= (addr as u128)
                && (buf as u128) + (len as u128) <= (addr as u128) + (rlen as u128)
                && (addr as u128) + (rlen as u128) <= usize::MAX as u128;
            prop_assert_eq!(within(addr, rlen, buf, len), wide);
        }

        /// A buffer passes the check of a handle exactly when it lies
        /// inside its region; unknown handles never pass.
        #[test]
        fn check_is_the_region(addr in 1usize..1 << 40, rlen in 1usize..1 << 20,
                               off in -(1i64 << 21)..(1i64 << 21), len in 0usize..1 << 21,
                               other in 0i32..1000) {
            let mut r = Registry::default();
            let h = r.add(addr, rlen).unwrap();
            let buf = (addr as i64 + off).max(0) as usize;
            let inside = buf >= addr && buf + len <= addr + rlen;
            prop_assert_eq!(r.check(h, buf, len).is_ok(), inside);
            if other != h {
                prop_assert_eq!(r.check(other, buf, len), Err(libc::EINVAL));
            }
        }
    }
}
