//! CRC32C (Castagnoli) as MPA and the datagram extension use it.
//!
//! Parameters (RFC 3720 / RFC 5044): reflected polynomial 0x82F63B78,
//! initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF. The 32-bit value is stored
//! on the wire **least-significant octet first** (the iSCSI digest order;
//! `docs/wire.md` §6.2), unlike every other field. The computation is
//! delegated to the `crc32c` crate, which uses SSE4.2 / ARMv8 CRC instructions
//! when the CPU has them.

/// A running CRC32C, updated while a frame is gathered piece by piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc32c {
    /// The CRC of everything fed so far (already finalised, as the `crc32c`
    /// crate's append API expects).
    value: u32,
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32c {
    /// A CRC over zero octets.
    pub const fn new() -> Self {
        Crc32c { value: 0 }
    }

    /// Feeds more octets.
    #[inline]
    pub fn update(&mut self, data: &[u8]) {
        self.value = crc32c::crc32c_append(self.value, data);
    }

    /// The CRC value of everything fed so far.
    #[inline]
    pub fn value(&self) -> u32 {
        self.value
    }

    /// The four octets that go on the wire for the CRC so far.
    #[inline]
    pub fn wire_bytes(&self) -> [u8; 4] {
        to_wire(self.value)
    }
}

/// CRC32C of one contiguous buffer.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// The wire octets of a CRC value (least-significant octet first).
#[inline]
pub fn to_wire(value: u32) -> [u8; 4] {
    value.to_le_bytes()
}

/// The CRC value carried by four wire octets.
#[inline]
pub fn from_wire(octets: [u8; 4]) -> u32 {
    u32::from_le_bytes(octets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &[u8], value: u32, wire: [u8; 4]) {
        assert_eq!(crc32c(input), value);
        assert_eq!(to_wire(value), wire);
        assert_eq!(from_wire(wire), value);
        // Piecewise update gives the same value for every split point.
        for split in 0..=input.len() {
            let mut c = Crc32c::new();
            c.update(&input[..split]);
            c.update(&input[split..]);
            assert_eq!(c.value(), value, "split at {split}");
            assert_eq!(c.wire_bytes(), wire);
        }
    }

    #[test]
    fn rfc3720_vectors() {
        check(&[0u8; 32], 0x8A91_36AA, [0xaa, 0x36, 0x91, 0x8a]);
        check(&[0xffu8; 32], 0x62A8_AB43, [0x43, 0xab, 0xa8, 0x62]);
        let inc: Vec<u8> = (0u8..32).collect();
        check(&inc, 0x46DD_794E, [0x4e, 0x79, 0xdd, 0x46]);
        let dec: Vec<u8> = (0u8..32).rev().collect();
        check(&dec, 0x113F_DB5C, [0x5c, 0xdb, 0x3f, 0x11]);
        check(b"123456789", 0xE306_9283, [0x83, 0x92, 0x06, 0xe3]);
    }

    #[test]
    fn residue_over_data_and_wire_crc() {
        // Running the CRC over data || wire CRC gives the fixed residue.
        for data in [&b""[..], b"a", b"123456789", &[0u8; 77]] {
            let mut c = Crc32c::new();
            c.update(data);
            let w = c.wire_bytes();
            c.update(&w);
            assert_eq!(c.value(), 0x4867_4BC7);
        }
    }
}
