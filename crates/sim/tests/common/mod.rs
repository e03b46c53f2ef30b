//! Helpers shared by the integration tests.

#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;

/// Client endpoint used by the synthesized sessions.
pub fn client() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 40001)
}

/// Server endpoint (7174 is the iWARP port siw uses).
pub fn server() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 2), 7174)
}

/// Saves `bytes` as `<CARGO_TARGET_TMPDIR>/<name>.pcap` (kept for looking at
/// after a failure) and returns the path.
pub fn save_pcap(name: &str, bytes: &[u8]) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.pcap"));
    std::fs::write(&path, bytes).expect("write pcap");
    path
}

/// Parses a hex dump as in golden.txt: lines `  0000: 4d 50 ...`; anything
/// up to a colon is an offset and ignored.
pub fn hex(dump: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for line in dump.lines() {
        let data = match line.find(':') {
            Some(i) => &line[i + 1..],
            None => line,
        };
        for tok in data.split_whitespace() {
            out.push(u8::from_str_radix(tok, 16).unwrap_or_else(|_| panic!("bad hex {tok:?}")));
        }
    }
    out
}

// The golden vectors, copied from testdata/iwarp/golden.txt
// (hand-built from the RFC layouts; each decoded as Good CRC32 by tshark).

/// MPA Request rev2, C=1, enh, IRD=ORD=16, PD='ulp-hello' (33 octets).
pub const MPA_REQUEST: &str = "
  0000: 4d 50 41 20 49 44 20 52 65 71 20 46 72 61 6d 65
  0010: 50 02 00 0d 00 10 00 10 75 6c 70 2d 68 65 6c 6c
  0020: 6f
";

/// MPA Reply rev2, C=1, enh, IRD=ORD=16, PD='ulp-ok' (30 octets).
pub const MPA_REPLY: &str = "
  0000: 4d 50 41 20 49 44 20 52 65 70 20 46 72 61 6d 65
  0010: 50 02 00 0a 00 10 00 10 75 6c 70 2d 6f 6b
";

/// FPDU RDMA Write STag 0x3303 TO 0x0000560012340000 'RDMA-WRITE-13' (36 octets).
pub const FPDU_WRITE: &str = "
  0000: 00 1b c1 40 00 00 33 03 00 00 56 00 12 34 00 00
  0010: 52 44 4d 41 2d 57 52 49 54 45 2d 31 33 00 00 00
  0020: c3 27 06 ee
";

/// FPDU Send QN0 MSN1 MO0 'hello send' (36 octets).
pub const FPDU_SEND: &str = "
  0000: 00 1c 41 43 00 00 00 00 00 00 00 00 00 00 00 01
  0010: 00 00 00 00 68 65 6c 6c 6f 20 73 65 6e 64 00 00
  0020: 1d bb 43 13
";

/// FPDU Read Request QN1 MSN1 sink 0x12a01/0x7f0000001000 size 64
/// src 0x4c02/0x7f00abcd0000 (52 octets).
pub const FPDU_READ_REQUEST: &str = "
  0000: 00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 01
  0010: 00 00 00 00 00 01 2a 01 00 00 7f 00 00 00 10 00
  0020: 00 00 00 40 00 00 4c 02 00 00 7f 00 ab cd 00 00
  0030: e7 43 84 2d
";

/// FPDU Read Response STag 0x12a01 TO 0x7f0000001000 payload 00..3f (84 octets).
pub const FPDU_READ_RESPONSE: &str = "
  0000: 00 4e c1 42 00 01 2a 01 00 00 7f 00 00 00 10 00
  0010: 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f
  0020: 10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f
  0030: 20 21 22 23 24 25 26 27 28 29 2a 2b 2c 2d 2e 2f
  0040: 30 31 32 33 34 35 36 37 38 39 3a 3b 3c 3d 3e 3f
  0050: cc 15 c7 21
";

/// FPDU Terminate layer DDP(1) etype untagged(2) code 0x02, M+D, seg len 100
/// + untagged hdr (48 octets).
pub const FPDU_TERMINATE: &str = "
  0000: 00 2a 41 47 00 00 00 00 00 00 00 02 00 00 00 01
  0010: 00 00 00 00 12 02 c0 00 00 64 41 43 00 00 00 00
  0020: 00 00 00 00 00 00 00 05 00 00 00 00 71 0d 5e 50
";

/// FPDU zero-length RDMA Write (RTR style, STag 1, TO 0) (20 octets).
pub const FPDU_ZERO_WRITE: &str = "
  0000: 00 0e c1 40 00 00 00 01 00 00 00 00 00 00 00 00
  0010: eb d3 4c 5f
";

/// All golden vectors in golden.txt order, with their lengths.
pub fn golden_vectors() -> Vec<(&'static str, Vec<u8>, usize)> {
    vec![
        ("MPA Request", hex(MPA_REQUEST), 33),
        ("MPA Reply", hex(MPA_REPLY), 30),
        ("Write", hex(FPDU_WRITE), 36),
        ("Send", hex(FPDU_SEND), 36),
        ("Read Request", hex(FPDU_READ_REQUEST), 52),
        ("Read Response", hex(FPDU_READ_RESPONSE), 84),
        ("Terminate", hex(FPDU_TERMINATE), 48),
        ("Zero-length Write", hex(FPDU_ZERO_WRITE), 20),
    ]
}
