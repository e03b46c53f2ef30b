//! How the protocol engines reach memory: only through [`Memory`], which
//! looks up an STag and checks protection domain, access rights, bounds and
//! STag state before a single octet moves.
//!
//! The engine crate implements [`Memory`] over the application's registered
//! memory; tests use [`VecMemory`], which keeps each region in a `Vec`.
//!
//! STags follow RFC 5040 and siw: the upper 24 bits index a region, the low 8
//! bits are a key that must match too. One `Memory` value stands for the
//! view of one protection domain: an STag of another domain is
//! [`MemError::WrongPd`] ("STag not associated with this RDMAP stream").

use softrdma_wire::rdmap::TerminateCause;

use crate::wr::{Payload, SgList, WcStatus, MAX_SGE};

/// Access rights of a memory region, with the `ibv_access_flags` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Access(pub u32);

impl Access {
    /// The local side may write (receives, Read sinks, atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA Write.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA Read.
    pub const REMOTE_READ: Access = Access(4);
    /// Peers may run atomics.
    pub const REMOTE_ATOMIC: Access = Access(8);

    /// True if every right in `other` is granted.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemError {
    /// No such STag, or its key does not match, or it was invalidated.
    InvalidStag,
    /// The range is not inside the region (or wraps).
    BaseBounds,
    /// The region does not grant the right needed.
    AccessRights,
    /// The STag belongs to another protection domain.
    WrongPd,
    /// The STag cannot be invalidated (not remotely invalidatable).
    CannotInvalidate,
    /// An atomic target is not 8-octet aligned.
    Misaligned,
}

impl MemError {
    /// The Terminate a remote access failure produces: RFC 5040 remote
    /// protection codes for untagged requests (Read Request, atomics,
    /// invalidate), RFC 5041 tagged-buffer codes for tagged placement.
    pub const fn terminate_cause(self, tagged: bool) -> TerminateCause {
        match (self, tagged) {
            (MemError::InvalidStag, true) => TerminateCause::DdpTaggedInvalidStag,
            (MemError::BaseBounds, true) => TerminateCause::DdpTaggedBaseBounds,
            (MemError::WrongPd, true) => TerminateCause::DdpTaggedStagNotAssociated,
            (MemError::AccessRights, true) => TerminateCause::RdmapAccessRights,
            (MemError::InvalidStag, false) => TerminateCause::RdmapInvalidStag,
            (MemError::BaseBounds, false) => TerminateCause::RdmapBaseBounds,
            (MemError::AccessRights, false) => TerminateCause::RdmapAccessRights,
            (MemError::WrongPd, false) => TerminateCause::RdmapStagNotAssociated,
            (MemError::CannotInvalidate, _) => TerminateCause::RdmapStagCannotInvalidate,
            (MemError::Misaligned, _) => TerminateCause::RdmapOperationUnspecified,
        }
    }

    /// The completion status of a local access failure (bad lkey etc.).
    pub const fn local_status(self) -> WcStatus {
        WcStatus::LocProtErr
    }
}

/// The 8-octet atomic operations of RFC 7306.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Add `0` to the target; return the original.
    FetchAdd(u64),
    /// If the target equals `compare`, store `swap`; return the original.
    CompareSwap {
        /// Compared value.
        compare: u64,
        /// Stored value.
        swap: u64,
    },
}

/// Access to registered memory, with every check a verbs provider makes.
///
/// Local calls take an lkey (the local side's own keys, checked against the
/// local access flags); remote calls take an STag that arrived from the
/// network and must be treated as hostile. No method may touch memory
/// outside a region, and a failed call changes nothing.
pub trait Memory {
    /// The `len` octets at `addr` of the region `lkey` (gather for a send).
    fn local_read(&self, lkey: u32, addr: u64, len: u64) -> Result<&[u8], MemError>;
    /// Writes `data` at `addr` of the region `lkey`; needs LOCAL_WRITE.
    fn local_write(&mut self, lkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError>;
    /// Checks that `len` octets at `to` of `stag` may be written by a peer
    /// (REMOTE_WRITE), without writing.
    fn check_remote_write(&self, stag: u32, to: u64, len: u64) -> Result<(), MemError>;
    /// Writes `data` at `to` of `stag` for a peer (RDMA Write placement).
    fn remote_write(&mut self, stag: u32, to: u64, data: &[u8]) -> Result<(), MemError>;
    /// The `len` octets at `to` of `stag` for a peer's RDMA Read
    /// (REMOTE_READ).
    fn remote_read(&self, stag: u32, to: u64, len: u64) -> Result<&[u8], MemError>;
    /// Runs an atomic on the 8 octets at `to` of `stag` (REMOTE_ATOMIC,
    /// 8-octet aligned); returns the original value.
    fn remote_atomic(&mut self, stag: u32, to: u64, op: AtomicOp) -> Result<u64, MemError>;
    /// Invalidates `stag`: `remote` for a peer's Send with Invalidate, else
    /// a local invalidate work request.
    fn invalidate(&mut self, stag: u32, remote: bool) -> Result<(), MemError>;
}

/// Writes `data` at octet `offset` of a scatter list (receive placement,
/// Read Response and atomic result sinks). `BaseBounds` if the range runs
/// past the list; a memory refusal stops at the first failing piece.
pub(crate) fn scatter<M: Memory>(
    mem: &mut M,
    sgl: &SgList,
    offset: u64,
    data: &[u8],
) -> Result<(), MemError> {
    // One entry (most receives): the same checks without the walk.
    if let [sge] = sgl.as_slice() {
        let fits = offset
            .checked_add(data.len() as u64)
            .is_some_and(|end| end <= u64::from(sge.length));
        return match (fits, data.is_empty()) {
            (false, _) => Err(MemError::BaseBounds),
            (true, true) => Ok(()),
            (true, false) => mem.local_write(sge.lkey, sge.addr.wrapping_add(offset), data),
        };
    }
    let mut res = Ok(());
    let mut at = 0usize;
    let ok = sgl.for_range(offset, data.len() as u64, |sge, off, n| {
        if res.is_ok() {
            let piece = &data[at..at + n as usize];
            res = mem.local_write(sge.lkey, sge.addr.wrapping_add(off), piece);
        }
        at += n as usize;
    });
    if !ok {
        return Err(MemError::BaseBounds);
    }
    res
}

/// Copies octets `[off, off + dst.len())` of a send payload into `dst`,
/// looking each lkey up once; false if the memory refuses a piece or the
/// payload is shorter (`dst` then holds what was copied before it).
pub(crate) fn gather_into<M: Memory>(mem: &M, payload: &Payload, off: u64, dst: &mut [u8]) -> bool {
    let len = dst.len() as u64;
    match payload {
        Payload::Inline(d) => {
            let s = d.as_slice();
            let Some(src) = usize::try_from(off)
                .ok()
                .and_then(|a| s.get(a..a.checked_add(dst.len())?))
            else {
                return false;
            };
            dst.copy_from_slice(src);
            true
        }
        Payload::Sgl(sgl) => {
            let (mut at, mut ok) = (0usize, true);
            let covered = sgl.for_range(off, len, |sge, o, n| {
                match mem.local_read(sge.lkey, sge.addr.wrapping_add(o), n) {
                    // `for_range` hands out pieces adding up to `len`.
                    Ok(piece) if ok && piece.len() as u64 == n => {
                        dst[at..at + piece.len()].copy_from_slice(piece);
                        at += piece.len();
                    }
                    _ => ok = false,
                }
            });
            covered && ok
        }
    }
}

/// The slices holding octets `[off, off + len)` of a send payload; returns
/// how many were written to `out`. The caller has checked the gather list
/// against the same `mem` (a piece it cannot read comes back empty).
pub(crate) fn payload_pieces<'a, M: Memory>(
    mem: &'a M,
    payload: &'a Payload,
    off: u64,
    len: u64,
    out: &mut [&'a [u8]; MAX_SGE],
) -> usize {
    match payload {
        Payload::Inline(d) => {
            let s = d.as_slice();
            let a = (off as usize).min(s.len());
            let b = (a + len as usize).min(s.len());
            out[0] = &s[a..b];
            usize::from(b > a)
        }
        Payload::Sgl(sgl) => {
            let mut k = 0;
            sgl.for_range(off, len, |sge, o, n| {
                if n > 0 && k < MAX_SGE {
                    out[k] = mem
                        .local_read(sge.lkey, sge.addr.wrapping_add(o), n)
                        .unwrap_or(&[]);
                    k += 1;
                }
            });
            k
        }
    }
}

/// One region of a [`VecMemory`].
#[derive(Debug, Clone)]
struct Region {
    key: u8,
    pd: u32,
    base: u64,
    access: Access,
    valid: bool,
    remote_invalidate: bool,
    data: Vec<u8>,
}

/// A `Vec`-backed [`Memory`] for tests and simulations: regions registered
/// with [`VecMemory::register`], viewed from one protection domain.
#[derive(Debug, Clone, Default)]
pub struct VecMemory {
    regions: Vec<Region>,
    pd: u32,
}

impl VecMemory {
    /// An empty registry viewed from protection domain 0.
    pub fn new() -> Self {
        VecMemory::default()
    }

    /// Registers `len` zeroed octets at virtual address `base` in
    /// protection domain `pd`; returns the STag (= lkey = rkey).
    pub fn register(&mut self, pd: u32, base: u64, len: usize, access: Access) -> u32 {
        let index = self.regions.len() as u32 + 1;
        // A key that is not simply zero, so tests notice key mix-ups.
        let key = (index.wrapping_mul(0x9e) as u8) | 1;
        self.regions.push(Region {
            key,
            pd,
            base,
            access,
            valid: true,
            remote_invalidate: true,
            data: vec![0; len],
        });
        (index << 8) | u32::from(key)
    }

    /// Views the registry from protection domain `pd`.
    pub fn set_pd(&mut self, pd: u32) {
        self.pd = pd;
    }

    /// The contents of a region (for assertions), regardless of state.
    pub fn bytes(&self, stag: u32) -> &[u8] {
        &self.regions[(stag >> 8) as usize - 1].data
    }

    /// Mutable contents of a region (to fill test data).
    pub fn bytes_mut(&mut self, stag: u32) -> &mut [u8] {
        &mut self.regions[(stag >> 8) as usize - 1].data
    }

    /// Whether the STag is currently valid.
    pub fn is_valid(&self, stag: u32) -> bool {
        self.lookup(stag).is_ok()
    }

    fn lookup(&self, stag: u32) -> Result<&Region, MemError> {
        let index = (stag >> 8) as usize;
        let r = index
            .checked_sub(1)
            .and_then(|i| self.regions.get(i))
            .ok_or(MemError::InvalidStag)?;
        if r.key != stag as u8 || !r.valid {
            return Err(MemError::InvalidStag);
        }
        if r.pd != self.pd {
            return Err(MemError::WrongPd);
        }
        Ok(r)
    }

    fn range(r: &Region, addr: u64, len: u64) -> Result<core::ops::Range<usize>, MemError> {
        let start = addr.checked_sub(r.base).ok_or(MemError::BaseBounds)?;
        let end = start.checked_add(len).ok_or(MemError::BaseBounds)?;
        if end > r.data.len() as u64 {
            return Err(MemError::BaseBounds);
        }
        Ok(start as usize..end as usize)
    }

    fn checked(
        &self,
        stag: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(usize, core::ops::Range<usize>), MemError> {
        let r = self.lookup(stag)?;
        if !r.access.contains(need) {
            return Err(MemError::AccessRights);
        }
        let range = Self::range(r, addr, len)?;
        Ok(((stag >> 8) as usize - 1, range))
    }
}

impl Memory for VecMemory {
    fn local_read(&self, lkey: u32, addr: u64, len: u64) -> Result<&[u8], MemError> {
        let (i, range) = self.checked(lkey, addr, len, Access(0))?;
        Ok(&self.regions[i].data[range])
    }

    fn local_write(&mut self, lkey: u32, addr: u64, data: &[u8]) -> Result<(), MemError> {
        let (i, range) = self.checked(lkey, addr, data.len() as u64, Access::LOCAL_WRITE)?;
        self.regions[i].data[range].copy_from_slice(data);
        Ok(())
    }

    fn check_remote_write(&self, stag: u32, to: u64, len: u64) -> Result<(), MemError> {
        self.checked(stag, to, len, Access::REMOTE_WRITE)
            .map(|_| ())
    }

    fn remote_write(&mut self, stag: u32, to: u64, data: &[u8]) -> Result<(), MemError> {
        let (i, range) = self.checked(stag, to, data.len() as u64, Access::REMOTE_WRITE)?;
        self.regions[i].data[range].copy_from_slice(data);
        Ok(())
    }

    fn remote_read(&self, stag: u32, to: u64, len: u64) -> Result<&[u8], MemError> {
        let (i, range) = self.checked(stag, to, len, Access::REMOTE_READ)?;
        Ok(&self.regions[i].data[range])
    }

    fn remote_atomic(&mut self, stag: u32, to: u64, op: AtomicOp) -> Result<u64, MemError> {
        let (i, range) = self.checked(stag, to, 8, Access::REMOTE_ATOMIC)?;
        if !to.is_multiple_of(8) {
            return Err(MemError::Misaligned);
        }
        let cell = &mut self.regions[i].data[range];
        let old = u64::from_ne_bytes(cell.try_into().expect("8 octets"));
        let new = match op {
            AtomicOp::FetchAdd(add) => old.wrapping_add(add),
            AtomicOp::CompareSwap { compare, swap } => {
                if old == compare {
                    swap
                } else {
                    old
                }
            }
        };
        cell.copy_from_slice(&new.to_ne_bytes());
        Ok(old)
    }

    fn invalidate(&mut self, stag: u32, remote: bool) -> Result<(), MemError> {
        self.lookup(stag)?;
        let r = &mut self.regions[(stag >> 8) as usize - 1];
        if remote && !r.remote_invalidate {
            return Err(MemError::CannotInvalidate);
        }
        r.valid = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::Sge;

    #[test]
    fn checks_key_pd_access_bounds() {
        let mut m = VecMemory::new();
        let a = m.register(0, 0x1000, 64, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
        let b = m.register(1, 0x1000, 64, Access::REMOTE_WRITE);
        assert_eq!(m.remote_write(a, 0x1000, &[1; 64]), Ok(()));
        assert_eq!(
            m.remote_write(a, 0x1001, &[1; 64]),
            Err(MemError::BaseBounds)
        );
        assert_eq!(m.remote_write(a, 0xfff, &[1]), Err(MemError::BaseBounds));
        assert_eq!(
            m.remote_write(a, u64::MAX, &[1; 2]),
            Err(MemError::BaseBounds)
        );
        assert_eq!(
            m.remote_write(a ^ 0x01, 0x1000, &[1]),
            Err(MemError::InvalidStag)
        );
        assert_eq!(m.remote_write(b, 0x1000, &[1]), Err(MemError::WrongPd));
        assert_eq!(m.remote_read(a, 0x1000, 1), Err(MemError::AccessRights));
        assert_eq!(m.remote_write(0, 0, &[]), Err(MemError::InvalidStag));
        assert_eq!(m.invalidate(a, true), Ok(()));
        assert_eq!(m.remote_write(a, 0x1000, &[1]), Err(MemError::InvalidStag));
        assert!(m.bytes(a).iter().all(|&x| x == 1));
    }

    #[test]
    fn atomics() {
        let mut m = VecMemory::new();
        let a = m.register(0, 0, 16, Access::REMOTE_ATOMIC);
        assert_eq!(m.remote_atomic(a, 8, AtomicOp::FetchAdd(5)), Ok(0));
        assert_eq!(
            m.remote_atomic(
                a,
                8,
                AtomicOp::CompareSwap {
                    compare: 5,
                    swap: 9
                }
            ),
            Ok(5)
        );
        assert_eq!(
            m.remote_atomic(
                a,
                8,
                AtomicOp::CompareSwap {
                    compare: 5,
                    swap: 1
                }
            ),
            Ok(9)
        );
        assert_eq!(
            m.remote_atomic(a, 4, AtomicOp::FetchAdd(1)),
            Err(MemError::Misaligned)
        );
        assert_eq!(
            m.remote_atomic(a, 16, AtomicOp::FetchAdd(1)),
            Err(MemError::BaseBounds)
        );
    }

    proptest::proptest! {
        /// A one-entry list's shortcut in `scatter` does what the walk
        /// over the entries does (the same entry followed by an empty
        /// one takes the walk): same result, same memory, whatever the
        /// offset, length, key and access.
        #[test]
        fn one_entry_scatter_is_the_walk(
            sge_off in 0u64..80,
            sge_len in 0u32..80,
            off in 0u64..100,
            len in 0usize..100,
            good_key in proptest::bool::ANY,
            writable in proptest::bool::ANY,
        ) {
            let run = |two: bool| {
                let mut m = VecMemory::new();
                let access = if writable { Access::LOCAL_WRITE } else { Access::REMOTE_READ };
                let k = m.register(0, 0x1000, 128, access);
                let lkey = if good_key { k } else { k ^ 0x01 };
                let sge = Sge { addr: 0x1000 + sge_off, length: sge_len, lkey };
                let empty = Sge { addr: 0x1000, length: 0, lkey };
                let sgl = if two {
                    SgList::from_slice(&[sge, empty]).unwrap()
                } else {
                    SgList::single(sge.addr, sge.length, sge.lkey)
                };
                let data: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a).collect();
                let r = scatter(&mut m, &sgl, off, &data);
                (r, m.bytes(k).to_vec())
            };
            proptest::prop_assert_eq!(run(false), run(true));
        }
    }
}
