//! Byte-exact iWARP wire formats for softrdma.
//!
//! This crate turns octets into headers and headers into octets, and nothing
//! else: no I/O, no allocation on parse, no `unsafe`. It covers
//!
//! * [`mpa`]: MPA Request/Reply frames (RFC 5044 §7, RFC 6581 IRD/ORD word);
//! * [`fpdu`]: FPDU framing (ULPDU length, pad, CRC32C, markers), a
//!   streaming deframer and a gather-friendly framer;
//! * [`ddp`]: DDP tagged/untagged headers (RFC 5041), including the softrdma
//!   datagram extension words;
//! * [`rdmap`]: RDMAP opcodes and opcode-specific headers (RFC 5040, RFC 7306),
//!   Terminate with its layer/type/code tables;
//! * [`datagram`]: the softrdma iWARP-over-UDP framing (`docs/datagram.md`);
//! * [`crc`]: CRC32C in the MPA byte order.
//!
//! # The contract every module keeps
//!
//! (In the manner of smoltcp's `wire`.)
//!
//! * **Views** (`Foo<T: AsRef<[u8]>>`) wrap a buffer. `Foo::new_unchecked`
//!   never fails; `Foo::new_checked` returns [`Error::Truncated`] unless the
//!   buffer holds every field the header's own fixed part says it has. Field
//!   accessors of a view built with `new_checked` never panic; on a view built
//!   with `new_unchecked` they may panic if the buffer is too short.
//! * **Reprs** (`FooRepr`) are plain, `Copy` where possible, structs holding
//!   the decoded fields. `FooRepr::parse` validates what the RFC requires a
//!   receiver to validate and returns an [`Error`]; it never panics and never
//!   allocates, whatever the input. `FooRepr::buffer_len` says how many octets
//!   `emit` writes; `emit` panics if given a shorter buffer (a caller bug, not
//!   an input error). `parse(emit(x)) == x` for every representable `x`.
//! * **Open enums**: every code point that the wire carries in a field wider
//!   than the set of known values is an enum with an `Unknown(raw)` variant,
//!   so unknown values survive a parse/emit round trip.
//! * All multi-octet fields are big-endian, except the CRC (see [`crc`]).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod crc;
pub mod datagram;
pub mod ddp;
pub mod fpdu;
pub mod mpa;
pub mod rd;
pub mod rdmap;

use core::fmt;

/// The one error type of the wire layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    /// The buffer ends before the header or a field it announces.
    Truncated,
    /// A field holds a value the layout does not allow here (bad MPA key,
    /// a reserved bit a receiver must check, an inconsistent length).
    Malformed,
    /// A length field is above what the protocol or the caller allows
    /// (MPA private data over 512 octets, a ULPDU larger than the limit).
    TooLong,
    /// The DDP or RDMAP version field is not the one this crate speaks.
    BadVersion,
    /// The CRC32C of an FPDU or datagram does not match its contents.
    BadCrc,
    /// A marker's FPDUPTR or reserved half is not what the stream position
    /// says it must be (RFC 5044 §5; Terminate LLP code 0x03).
    BadMarker,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Error::Truncated => "buffer truncated",
            Error::Malformed => "malformed header",
            Error::TooLong => "length above the limit",
            Error::BadVersion => "unsupported DDP/RDMAP version",
            Error::BadCrc => "CRC32C mismatch",
            Error::BadMarker => "MPA marker does not match the stream position",
        };
        f.write_str(s)
    }
}

impl std::error::Error for Error {}

/// Result type of the wire layer.
pub type Result<T> = core::result::Result<T, Error>;

/// Defines an open enum over an integer type: named code points plus an
/// `Unknown(raw)` variant that keeps any other value, so parse/emit round-trips.
#[macro_export]
#[doc(hidden)]
macro_rules! open_enum {
    (
        $(#[$attr:meta])*
        pub enum $name:ident($ty:ty) {
            $( $(#[$vattr:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vattr])* $variant, )+
            /// A code point this crate does not name; the raw value is kept.
            Unknown($ty),
        }

        impl ::core::convert::From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( v if v == $value => $name::$variant, )+
                    other => $name::Unknown(other),
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}

/// Big-endian field helpers shared by the modules. Callers check bounds first.
pub(crate) mod field {
    #[inline]
    pub fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }
    #[inline]
    pub fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
    #[inline]
    pub fn u64_at(b: &[u8], at: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(a)
    }
    #[inline]
    pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    #[inline]
    pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_be_bytes());
    }
}
