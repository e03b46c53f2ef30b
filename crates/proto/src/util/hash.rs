//! A fast hasher for maps keyed by values this side chose.
//!
//! Contract: no per-map key, so it must never be used for keys a peer
//! controls (those maps keep SipHash against collision flooding).

use std::collections::HashMap;

/// A fast hasher for maps keyed by values this side chose (connection
/// ids, DCT and DCI numbers, the application's targets): a multiply-rotate
/// mix, no per-map key, unlike `std`'s SipHash. Not for keys a peer
/// controls (those maps keep SipHash: collision flooding).
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalHasher(u64);

impl LocalHasher {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl std::hash::Hasher for LocalHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.add(u64::from_le_bytes(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map with [`LocalHasher`].
pub type LocalMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<LocalHasher>>;
