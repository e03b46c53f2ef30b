//! Test-only support for softrdma.
//!
//! * [`pcap`]: writes classic pcap files with Ethernet + IPv4 framing and
//!   valid IPv4/TCP/UDP checksums, synthesizes whole TCP connections
//!   ([`pcap::TcpSession`]) and UDP flows ([`pcap::UdpFlow`]), and reads pcap
//!   files back ([`pcap::PcapFile`], [`pcap::decode_frame`]).
//! * [`tshark`]: drives the system `tshark` with the options that make its
//!   iWARP dissector decode MPA/DDP/RDMAP reliably and extracts what the
//!   tests check (fields, MPA CRC verdicts, expert errors, malformed frames).
//! * [`iwarp_testdata`]: the golden vectors and captures in the
//!   repository's `testdata/iwarp/` (not produced by softrdma).
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

/// The golden iWARP captures and vectors: `testdata/iwarp/` at the
/// repository root, located from this crate's manifest directory.
pub fn iwarp_testdata_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("testdata")
        .join("iwarp")
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
        "golden test file {} is missing (it belongs in testdata/iwarp/ of the repository)",
        path.display()
    );
    path
}
