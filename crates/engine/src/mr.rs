//! Memory registration: the table of regions the application registered,
//! and the [`Memory`] view the protocol engines use to reach them.
//!
//! A region is application memory (a raw address range the caller keeps
//! alive until it deregisters). Each gets an STag: the upper 24 bits index
//! the table, the low 8 bits are a key drawn from a per-process random
//! sequence, so keys are not guessable from one another and a reused index
//! gets a new key. lkey = rkey = STag, as in siw.
//!
//! Like RDMA hardware, this code reads and writes registered memory while
//! the application may be touching it: the verbs contract (do not modify a
//! buffer while a work request on it is outstanding) is the application's
//! to keep, and racing accesses give unspecified *contents*, never accesses
//! outside the region. All raw accesses go through `copy_nonoverlapping` on
//! ranges checked against the region, or through slices whose lifetime
//! ends before the registry lock is released.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

use softrdma_proto::memory::{Access, AtomicOp, MemError, Memory};

/// Zeroed, page-aligned memory of the process's own (an anonymous private
/// mapping), for regions a library allocates itself (the verbs crate's
/// `ProtectionDomain::register`). Its pages become resident only when
/// first touched, so a large receive area that small messages use holds
/// only the pages they reached (an allocator's zeroed, page-aligned
/// allocation writes every page). Unmapped on drop.
#[derive(Debug)]
pub struct Pages {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value; the pointer is only handed out
// as an address.
unsafe impl Send for Pages {}
// SAFETY: as above; `Pages` itself never reads or writes the memory.
unsafe impl Sync for Pages {}

impl Pages {
    /// `len` zeroed octets (rounded up to whole pages by the kernel).
    pub fn zeroed(len: usize) -> std::io::Result<Pages> {
        if len == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        // A new anonymous mapping chosen by the kernel: no existing memory
        // is affected, and the result is checked.
        // SAFETY: no pointer of ours is passed; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p as *mut u8)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        Ok(Pages { ptr, len })
    }

    /// The first octet.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in octets (as asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a mapping has at least one octet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // Whoever registered the mapping deregistered it first (the owner's contract).
        // SAFETY: the mapping made in `zeroed`, unmapped once, here.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// One registered region.
#[derive(Debug, Clone, Copy)]
struct Region {
    /// Where the region starts in this process.
    ptr: usize,
    /// The address the application uses for the region (`ibv_mr.addr`); a
    /// work request's `addr` and a peer's tagged offset are in this space.
    iova: u64,
    len: u64,
    access: Access,
    pd: u32,
    key: u8,
    valid: bool,
}

/// The process's registration table, shared by every QP of a context.
#[derive(Debug, Default)]
pub struct Registry {
    table: RwLock<Table>,
}

#[derive(Debug, Default)]
struct Table {
    regions: Vec<Option<Region>>,
    free: Vec<u32>,
}

/// A random-looking 8-bit key sequence (splitmix64 over a per-process seed).
fn next_key() -> u8 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut s = STATE.load(Ordering::Relaxed);
    if s == 0 {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ (u64::from(std::process::id()) << 32)
            ^ (&STATE as *const _ as u64);
        s = seed | 1;
    }
    s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    STATE.store(s, Ordering::Relaxed);
    let mut z = s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u8
}

/// Why a registration was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegError {
    /// Null address with a non-zero length, or the range wraps.
    BadRange,
    /// REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE (verbs rule).
    BadAccess,
    /// The table is full (2^24 − 1 regions).
    TooMany,
    /// [`Registry::reregister`] of an STag that is not registered.
    NoSuchStag,
}

impl Registry {
    /// An empty table.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers `len` octets at `ptr`, known to peers and work requests as
    /// starting at `iova`, in protection domain `pd`. Returns the STag.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid for reads and writes until
    /// [`Registry::deregister`] returns for this STag.
    pub unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
        pd: u32,
    ) -> Result<u32, RegError> {
        if (ptr.is_null() && len > 0)
            || (ptr as usize).checked_add(len).is_none()
            || iova.checked_add(len as u64).is_none()
        {
            return Err(RegError::BadRange);
        }
        let needs_local_write =
            access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
        if needs_local_write && !access.contains(Access::LOCAL_WRITE) {
            return Err(RegError::BadAccess);
        }
        let mut t = self.table.write().unwrap_or_else(|e| e.into_inner());
        let index = match t.free.pop() {
            Some(i) => i,
            None => {
                if t.regions.len() >= (1 << 24) - 2 {
                    return Err(RegError::TooMany);
                }
                t.regions.push(None);
                t.regions.len() as u32
            }
        };
        let key = next_key();
        t.regions[index as usize - 1] = Some(Region {
            ptr: ptr as usize,
            iova,
            len: len as u64,
            access,
            pd,
            key,
            valid: true,
        });
        Ok((index << 8) | u32::from(key))
    }

    /// Changes a registration in place (`ibv_rereg_mr`): a new range
    /// (`Some((ptr, len, iova))`), new rights, a new protection domain,
    /// any of the three. The STag stays the same, so work requests and
    /// peers keep naming the region by it; an invalidated STag is valid
    /// again. Taken under the table's write lock, so no access through the
    /// old translation is in progress when this returns.
    ///
    /// # Safety
    /// A new range must stay valid for reads and writes until
    /// [`Registry::deregister`] returns for this STag (as for
    /// [`Registry::register`]).
    pub unsafe fn reregister(
        &self,
        stag: u32,
        range: Option<(*mut u8, usize, u64)>,
        access: Option<Access>,
        pd: Option<u32>,
    ) -> Result<(), RegError> {
        if let Some((ptr, len, iova)) = range {
            if (ptr.is_null() && len > 0)
                || (ptr as usize).checked_add(len).is_none()
                || iova.checked_add(len as u64).is_none()
            {
                return Err(RegError::BadRange);
            }
        }
        if let Some(access) = access {
            let needs_local_write =
                access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
            if needs_local_write && !access.contains(Access::LOCAL_WRITE) {
                return Err(RegError::BadAccess);
            }
        }
        let mut t = self.table.write().unwrap_or_else(|e| e.into_inner());
        let r = match (stag >> 8)
            .checked_sub(1)
            .and_then(|i| t.regions.get_mut(i as usize))
        {
            Some(Some(r)) if r.key == stag as u8 => r,
            _ => return Err(RegError::NoSuchStag),
        };
        if let Some((ptr, len, iova)) = range {
            r.ptr = ptr as usize;
            r.len = len as u64;
            r.iova = iova;
        }
        if let Some(access) = access {
            r.access = access;
        }
        if let Some(pd) = pd {
            r.pd = pd;
        }
        r.valid = true;
        Ok(())
    }

    /// Removes a registration; afterwards no access through the STag
    /// succeeds. Returns false if the STag was not registered.
    pub fn deregister(&self, stag: u32) -> bool {
        let mut t = self.table.write().unwrap_or_else(|e| e.into_inner());
        let index = stag >> 8;
        let slot = match index
            .checked_sub(1)
            .and_then(|i| t.regions.get_mut(i as usize))
        {
            Some(s) => s,
            None => return false,
        };
        match slot {
            Some(r) if r.key == stag as u8 => {
                *slot = None;
                t.free.push(index);
                true
            }
            _ => false,
        }
    }

    /// Runs `f` with a [`Memory`] view of protection domain `pd`. The table
    /// is read-locked for the duration, so regions cannot be deregistered
    /// while the view exists.
    pub fn with_view<R>(&self, pd: u32, f: impl FnOnce(&mut View<'_>) -> R) -> R {
        self.with_qp_view(pd, REMOTE_RIGHTS, f)
    }

    /// [`Registry::with_view`] for a QP that grants only the remote rights
    /// in `qp_rights`: a peer's access needs its right both in the region
    /// and here (verbs checks the QP's access flags and the MR's).
    pub fn with_qp_view<R>(
        &self,
        pd: u32,
        qp_rights: Access,
        f: impl FnOnce(&mut View<'_>) -> R,
    ) -> R {
        let t = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut v = View {
            table: &t,
            pd,
            qp_rights,
            invalidations: [0; 4],
            n_inval: 0,
        };
        let r = f(&mut v);
        let pending = v.invalidations;
        let n = v.n_inval;
        drop(t);
        if n > 0 {
            let mut t = self.table.write().unwrap_or_else(|e| e.into_inner());
            for stag in &pending[..n] {
                if let Some(Some(r)) = (stag >> 8)
                    .checked_sub(1)
                    .and_then(|i| t.regions.get_mut(i as usize))
                {
                    if r.key == *stag as u8 {
                        r.valid = false;
                    }
                }
            }
        }
        r
    }

    /// Makes an invalidated STag valid again (re-registration of the same
    /// memory with the same key is what `ibv_rereg_mr` amounts to here).
    pub fn revalidate(&self, stag: u32) -> bool {
        let mut t = self.table.write().unwrap_or_else(|e| e.into_inner());
        match (stag >> 8)
            .checked_sub(1)
            .and_then(|i| t.regions.get_mut(i as usize))
        {
            Some(Some(r)) if r.key == stag as u8 => {
                r.valid = true;
                true
            }
            _ => false,
        }
    }
}

/// Every remote right: what a view grants when no QP narrows it.
pub const REMOTE_RIGHTS: Access =
    Access(Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0 | Access::REMOTE_ATOMIC.0);

/// A [`Memory`] view of one protection domain, valid while the registry is
/// read-locked. Invalidations are recorded and applied when the view ends.
pub struct View<'t> {
    table: &'t Table,
    pd: u32,
    /// The remote rights of the QP this view serves.
    qp_rights: Access,
    invalidations: [u32; 4],
    n_inval: usize,
}

impl View<'_> {
    fn lookup(&self, stag: u32) -> Result<&Region, MemError> {
        let r = (stag >> 8)
            .checked_sub(1)
            .and_then(|i| self.table.regions.get(i as usize))
            .and_then(|r| r.as_ref())
            .ok_or(MemError::InvalidStag)?;
        let pending = self.invalidations[..self.n_inval].contains(&stag);
        if r.key != stag as u8 || !r.valid || pending {
            return Err(MemError::InvalidStag);
        }
        if r.pd != self.pd {
            return Err(MemError::WrongPd);
        }
        Ok(r)
    }

    /// The process address of `len` octets at `addr` in region `stag`,
    /// after every check.
    fn resolve(&self, stag: u32, addr: u64, len: u64, need: Access) -> Result<*mut u8, MemError> {
        let r = self.lookup(stag)?;
        let remote = Access(need.0 & REMOTE_RIGHTS.0);
        if !r.access.contains(need) || !self.qp_rights.contains(remote) {
            return Err(MemError::AccessRights);
        }
        let off = addr.checked_sub(r.iova).ok_or(MemError::BaseBounds)?;
        let end = off.checked_add(len).ok_or(MemError::BaseBounds)?;
        if end > r.len {
            return Err(MemError::BaseBounds);
        }
        Ok((r.ptr + off as usize) as *mut u8)
    }
}

impl View<'_> {
    /// Direct placement: the process address of `len` octets at `addr` of
    /// region `key` that the engine may fill straight from a socket —
    /// REMOTE_WRITE for a peer's STag (`remote`), LOCAL_WRITE for a local
    /// key — after every check [`Memory::remote_write`] /
    /// [`Memory::local_write`] would make. The address stays valid while
    /// this view exists (the registry is read-locked, so the region cannot
    /// be deregistered); writing through it is the caller's `unsafe`.
    pub(crate) fn place_ptr(
        &self,
        key: u32,
        addr: u64,
        len: u64,
        remote: bool,
    ) -> Result<*mut u8, MemError> {
        let need = if remote {
            Access::REMOTE_WRITE
        } else {
            Access::LOCAL_WRITE
        };
        self.resolve(key, addr, len, need)
    }
}

impl Memory for View<'_> {
    fn local_read(&self, lkey: u32, addr: u64, len: u64) -> Result<&[u8], MemError> {
        let p = self.resolve(lkey, addr, len, Access(0))?;
        // `resolve` checked that [p, p+len) lies inside a region the
        // application registered and keeps alive until deregistration, which
        // the read lock held by this view excludes.
        // SAFETY: in bounds of a live registered region (above).
        Ok(unsafe { std::slice::from_raw_parts(p, len as usize) })
    }

    fn local_write(&mut self, lkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError> {
        let p = self.resolve(lkey, addr, data.len() as u64, Access::LOCAL_WRITE)?;
        // As in `local_read`; `data` is ours and cannot overlap registered
        // memory handed out as a slice at the same time (the protocol
        // engine never writes from a slice of the same view).
        // SAFETY: in bounds of a live registered region, no overlap (above).
        unsafe { std::ptr::copy(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    fn check_remote_write(&self, stag: u32, to: u64, len: u64) -> Result<(), MemError> {
        self.resolve(stag, to, len, Access::REMOTE_WRITE)
            .map(|_| ())
    }

    fn remote_write(&mut self, stag: u32, to: u64, data: &[u8]) -> Result<(), MemError> {
        let p = self.resolve(stag, to, data.len() as u64, Access::REMOTE_WRITE)?;
        let Some((&last, head)) = data.split_last() else {
            return Ok(());
        };
        // A peer's Write is placed front to back with its final octet
        // stored once and last: programs that watch the last octet of a
        // Write's target (a common RDMA idiom, rsockets' riostream) must
        // not see it before the rest, nor see it stored again after they
        // have reset it. `memcpy` gives neither promise (small copies store
        // overlapping head and tail words), hence the head first, a release
        // fence, then one store of the last octet.
        // SAFETY: as in `local_write`; `head` and `p + head.len()` are in
        // bounds of the resolved range of `data.len()` octets.
        unsafe {
            std::ptr::copy(head.as_ptr(), p, head.len());
            std::sync::atomic::fence(Ordering::Release);
            std::ptr::write_volatile(p.add(head.len()), last);
        }
        Ok(())
    }

    fn remote_read(&self, stag: u32, to: u64, len: u64) -> Result<&[u8], MemError> {
        let p = self.resolve(stag, to, len, Access::REMOTE_READ)?;
        // SAFETY: as in `local_read`.
        Ok(unsafe { std::slice::from_raw_parts(p, len as usize) })
    }

    fn remote_atomic(&mut self, stag: u32, to: u64, op: AtomicOp) -> Result<u64, MemError> {
        let p = self.resolve(stag, to, 8, Access::REMOTE_ATOMIC)?;
        if !to.is_multiple_of(8) || !(p as usize).is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        // SAFETY: `p` is 8-aligned and 8 octets inside a live region; an AtomicU64 view makes the update atomic against other QPs of this process operating on the same word.
        let cell = unsafe { &*(p as *const std::sync::atomic::AtomicU64) };
        let old = match op {
            AtomicOp::FetchAdd(add) => cell.fetch_add(add, Ordering::SeqCst),
            AtomicOp::CompareSwap { compare, swap } => {
                match cell.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
        };
        Ok(old)
    }

    fn invalidate(&mut self, stag: u32, _remote: bool) -> Result<(), MemError> {
        self.lookup(stag)?;
        if self.n_inval == self.invalidations.len() {
            return Err(MemError::CannotInvalidate);
        }
        self.invalidations[self.n_inval] = stag;
        self.n_inval += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_check_deregister() {
        let reg = Registry::new();
        let mut buf = vec![0u8; 64];
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // SAFETY: `buf` outlives the registration (deregistered below).
        let stag = unsafe { reg.register(buf.as_mut_ptr(), 64, 0x1000, rw, 7) }.unwrap();
        reg.with_view(7, |v| {
            v.remote_write(stag, 0x1000 + 60, &[1, 2, 3, 4]).unwrap();
            assert_eq!(
                v.remote_write(stag, 0x1000 + 61, &[1, 2, 3, 4]),
                Err(MemError::BaseBounds)
            );
            assert_eq!(v.remote_read(stag, 0x1000, 4), Err(MemError::AccessRights));
            assert_eq!(
                v.remote_write(stag ^ 0xff, 0x1000, &[1]),
                Err(MemError::InvalidStag)
            );
        });
        reg.with_view(8, |v| {
            assert_eq!(v.remote_write(stag, 0x1000, &[1]), Err(MemError::WrongPd))
        });
        assert_eq!(&buf[60..], &[1, 2, 3, 4]);
        assert!(reg.deregister(stag));
        assert!(!reg.deregister(stag));
        reg.with_view(7, |v| {
            assert_eq!(
                v.remote_write(stag, 0x1000, &[1]),
                Err(MemError::InvalidStag)
            )
        });
        assert_eq!(
            // SAFETY: a null pointer is refused before anything is recorded.
            unsafe { reg.register(std::ptr::null_mut(), 1, 0, rw, 7) },
            Err(RegError::BadRange)
        );
        assert_eq!(
            // SAFETY: as above; refused for the access flags.
            unsafe { reg.register(buf.as_mut_ptr(), 1, 0, Access::REMOTE_WRITE, 7) },
            Err(RegError::BadAccess)
        );
    }

    #[test]
    fn reregister_moves_the_region_keeping_its_stag() {
        let reg = Registry::new();
        let mut a = vec![0u8; 16];
        let mut b = vec![0u8; 32];
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // SAFETY: `a` and `b` outlive the registration (deregistered below).
        let stag = unsafe { reg.register(a.as_mut_ptr(), 16, 0x1000, rw, 7) }.unwrap();
        // SAFETY: as above.
        let moved = unsafe { reg.reregister(stag, Some((b.as_mut_ptr(), 32, 0x2000)), None, None) };
        assert_eq!(moved, Ok(()));
        reg.with_view(7, |v| {
            assert_eq!(
                v.remote_write(stag, 0x1000, &[1]),
                Err(MemError::BaseBounds)
            );
            v.remote_write(stag, 0x2000 + 28, &[5, 6, 7, 8]).unwrap();
        });
        assert_eq!(&b[28..], &[5, 6, 7, 8]);
        assert!(a.iter().all(|&x| x == 0));
        // New rights and PD: the old PD no longer reaches it, writes are refused.
        // SAFETY: no new range.
        let r = unsafe { reg.reregister(stag, None, Some(Access::REMOTE_READ), Some(9)) };
        assert_eq!(r, Ok(()));
        reg.with_view(7, |v| {
            assert_eq!(
                v.remote_read(stag, 0x2000, 1).err(),
                Some(MemError::WrongPd)
            )
        });
        reg.with_view(9, |v| {
            assert_eq!(v.remote_read(stag, 0x2000 + 28, 1).unwrap(), &[5]);
            assert_eq!(
                v.remote_write(stag, 0x2000, &[1]),
                Err(MemError::AccessRights)
            );
        });
        // SAFETY: refused before anything changes.
        let bad = unsafe { reg.reregister(stag, None, Some(Access::REMOTE_WRITE), None) };
        assert_eq!(bad, Err(RegError::BadAccess));
        assert!(reg.deregister(stag));
        // SAFETY: refused: the STag is gone.
        let gone = unsafe { reg.reregister(stag, None, Some(rw), None) };
        assert_eq!(gone, Err(RegError::NoSuchStag));
    }

    #[test]
    fn pages_are_zeroed_writable_and_resident_only_when_touched() {
        let len = 8 << 20;
        let p = Pages::zeroed(len).unwrap();
        assert_eq!(p.len(), len);
        assert_eq!(p.as_ptr() as usize % 4096, 0, "page aligned");
        let rss = || {
            std::fs::read_to_string("/proc/self/statm")
                .ok()
                .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
                .unwrap_or(0)
        };
        let before = rss();
        // SAFETY: `p` is a live mapping of `len` octets; the reads and the
        // write are in bounds and nothing else uses it.
        unsafe {
            assert_eq!(*p.as_ptr(), 0);
            assert_eq!(*p.as_ptr().add(len - 1), 0);
            *p.as_ptr().add(4096) = 7;
            assert_eq!(*p.as_ptr().add(4096), 7);
        }
        // Touching 3 pages of 2048 makes a few resident, not 8 MiB.
        assert!(rss() < before + 256, "rss {before} -> {} pages", rss());
        assert!(Pages::zeroed(0).is_err());
    }

    #[test]
    fn a_remote_write_ends_with_its_last_octet() {
        let reg = Registry::new();
        let mut buf = vec![0u8; 8];
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // SAFETY: `buf` outlives the registration.
        let stag = unsafe { reg.register(buf.as_mut_ptr(), 8, 0, rw, 1) }.unwrap();
        reg.with_view(1, |v| {
            v.remote_write(stag, 0, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
            v.remote_write(stag, 7, &[9]).unwrap();
            v.remote_write(stag, 0, &[]).unwrap();
        });
        assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 9]);
        assert!(reg.deregister(stag));
    }

    #[test]
    fn a_qp_view_needs_the_qp_right_too() {
        let reg = Registry::new();
        let mut buf = vec![0u8; 16];
        let all = Access::LOCAL_WRITE | REMOTE_RIGHTS;
        // SAFETY: `buf` outlives the registration (the registry is dropped first).
        let s = unsafe { reg.register(buf.as_mut_ptr(), 16, 0, all, 0) }.unwrap();
        // The QP grants remote write and read, not atomics.
        let rw = Access::REMOTE_WRITE | Access::REMOTE_READ;
        reg.with_qp_view(0, rw, |v| {
            assert_eq!(
                v.remote_atomic(s, 8, AtomicOp::FetchAdd(1)),
                Err(MemError::AccessRights)
            );
            v.remote_write(s, 0, &[7]).unwrap();
            assert_eq!(v.remote_read(s, 0, 1).map(|d| d[0]), Ok(7));
            // Local access does not depend on the QP's remote rights.
            v.local_write(s, 1, &[9]).unwrap();
        });
        reg.with_qp_view(0, Access(0), |v| {
            assert_eq!(v.remote_write(s, 0, &[1]), Err(MemError::AccessRights));
            assert_eq!(v.remote_read(s, 0, 1).err(), Some(MemError::AccessRights));
            assert_eq!(v.local_read(s, 1, 1).map(|d| d[0]), Ok(9));
        });
        reg.with_view(0, |v| {
            assert_eq!(v.remote_atomic(s, 8, AtomicOp::FetchAdd(1)), Ok(0));
        });
        drop(reg);
        assert_eq!(buf[0], 7);
    }

    #[test]
    fn keys_differ_on_reuse_and_invalidate_applies() {
        let reg = Registry::new();
        let mut buf = vec![0u8; 16];
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        let mut keys = std::collections::HashSet::new();
        for _ in 0..32 {
            // SAFETY: `buf` outlives each registration.
            let s = unsafe { reg.register(buf.as_mut_ptr(), 16, 0, rw, 0) }.unwrap();
            keys.insert(s & 0xff);
            assert!(reg.deregister(s));
        }
        assert!(keys.len() > 8, "keys vary: {keys:?}");
        // SAFETY: as above.
        let s = unsafe { reg.register(buf.as_mut_ptr(), 16, 0, rw, 0) }.unwrap();
        reg.with_view(0, |v| {
            assert_eq!(v.remote_atomic(s, 8, AtomicOp::FetchAdd(3)), Ok(0));
            v.invalidate(s, true).unwrap();
            assert_eq!(v.remote_write(s, 0, &[1]), Err(MemError::InvalidStag));
        });
        reg.with_view(0, |v| {
            assert_eq!(v.remote_write(s, 0, &[1]), Err(MemError::InvalidStag))
        });
        assert!(reg.revalidate(s));
        assert_eq!(u64::from_ne_bytes(buf[8..16].try_into().unwrap()), 3);
    }
}
