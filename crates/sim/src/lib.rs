//! Test-only support for softrdma.
//!
//! * [`pcap`]: writes classic pcap files with Ethernet + IPv4 framing and
//!   valid IPv4/TCP/UDP checksums, synthesizes whole TCP connections
//!   ([`pcap::TcpSession`]) and UDP flows ([`pcap::UdpFlow`]), and reads pcap
//!   files back ([`pcap::PcapFile`], [`pcap::decode_frame`]).
//! * [`tshark`]: drives the system `tshark` with the options from
//!   `shared/docs/wire.md` §12.3 and extracts what the tests check (fields,
//!   MPA CRC verdicts, expert errors, malformed frames).
//! * [`netns`]: two network namespaces joined by veth, with nftables loss
//!   (the `softrdma-netns` crate, which `softrdma perf loss` uses too).
//!
//! This crate deliberately does not depend on `softrdma-wire`: it is the
//! independent side of the check.

#![forbid(unsafe_code)]

/// Network namespace pairs ([`softrdma_netns`], re-exported here for the
/// tests that create two hosts on one machine).
pub use softrdma_netns as netns;
pub mod pcap;
pub mod tshark;

use std::path::PathBuf;

/// The project's `shared/` folder, which sits beside the repository root.
///
/// Located relative to this crate's manifest directory
/// (`<repo>/crates/sim/../../../shared`), so it works in any checkout that
/// has `shared/` next to the repository.
pub fn shared_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("..")
        .join("shared")
}

/// The golden iWARP captures and vectors: `shared/testdata/iwarp/`.
pub fn iwarp_testdata_dir() -> PathBuf {
    shared_dir().join("testdata").join("iwarp")
}

/// Path of one file in [`iwarp_testdata_dir`].
///
/// # Panics
///
/// Panics with a clear message if the file does not exist, since a test that
/// asks for golden data cannot do anything useful without it.
pub fn iwarp_testdata(name: &str) -> PathBuf {
    let path = iwarp_testdata_dir().join(name);
    assert!(
        path.is_file(),
        "golden test file {} is missing (expected shared/ beside the repository root)",
        path.display()
    );
    path
}
