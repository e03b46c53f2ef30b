//! The project's Wireshark dissector for iWARP over UDP
//! (`tools/wireshark/softrdma_dgram.lua`) against datagrams this crate
//! emitted: every UD/Write-Record/Read/Atomic/Immediate/Terminate datagram
//! must be recognised as `srdma` with the fields we sent and a good CRC,
//! with no expert errors and nothing malformed; one flipped bit must give
//! exactly one expert error (the bad CRC); foreign UDP traffic on the same
//! port must be left alone. The heuristic (any port), the `port=` and
//! `follow=` script arguments and header violations under a good CRC are
//! checked as well. RD datagrams (`docs/datagram.md` §9): every shim field
//! of data, SYN, poll, ACK-only, NAK, reset and probe datagrams, the
//! segment behind the shim, retransmissions marked, corrupted RD datagrams
//! flagged (on the port and in a followed flow) and each §9.3 rule
//! violation one error naming the error kind of `rd::parse`.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};

use softrdma_sim::pcap::{Dir, PcapWriter, UdpFlow};
use softrdma_sim::tshark::Tshark;
use softrdma_wire::crc;
use softrdma_wire::datagram;
use softrdma_wire::ddp::{DdpHeader, Mode, TaggedExt};
use softrdma_wire::rd::{self, DataSeq, Feedback, RdShimRepr};
use softrdma_wire::rdmap::{
    AtomicOp, AtomicRequest, AtomicResponse, EchoedHeader, Opcode, RdmapBody, ReadRequest,
    SegmentRepr, TerminateCause, TerminateRepr,
};

/// The dissector, found from this crate's manifest directory.
fn dissector() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("tools")
        .join("wireshark")
        .join("softrdma_dgram.lua");
    assert!(p.is_file(), "dissector missing: {}", p.display());
    p
}

/// The heuristic's name, as `--disable-heuristic` wants it.
const HEURISTIC: &str = "srdma_udp";
/// The dissector's default port (rdma_cm's default, as in `rping`).
const DEFAULT_PORT: u16 = 7174;
/// A port nothing is registered on.
const OTHER_PORT: u16 = 50123;

/// One datagram of the script.
struct Sent {
    dir: Dir,
    repr: SegmentRepr,
    payload: Vec<u8>,
}

impl Sent {
    fn bytes(&self) -> Vec<u8> {
        self.repr
            .validate(Mode::Datagram)
            .unwrap_or_else(|e| panic!("{:?} is not a datagram header: {e}", self.repr));
        let mut out = vec![0u8; datagram::buffer_len(&self.repr, self.payload.len())];
        let n = datagram::emit_into(&self.repr, &self.payload, &mut out);
        assert_eq!(n, out.len());
        // Our own receiver accepts what we send.
        let (repr, payload) = datagram::parse(&out).expect("our datagram parses");
        assert_eq!(repr, self.repr);
        assert_eq!(payload, &self.payload[..]);
        out
    }
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

fn with_dqpn(mut r: SegmentRepr, dqpn: u32) -> SegmentRepr {
    r.dqpn = Some(dqpn);
    r
}

fn with_ext(mut r: SegmentRepr, msn: u32, mo: u32) -> SegmentRepr {
    if let DdpHeader::Tagged { ext, .. } = &mut r.ddp {
        *ext = Some(TaggedExt { msn, mo });
    }
    r
}

fn with_inval(mut r: SegmentRepr, stag: u32) -> SegmentRepr {
    if let DdpHeader::Untagged { rsvd_ulp, .. } = &mut r.ddp {
        *rsvd_ulp = stag;
    }
    r
}

/// Splits a message into datagram segments the way a sender sizes them for
/// a 1500-octet path (`datagram::max_payload`): `make(offset, last)` gives
/// each segment's header.
fn segments(dir: Dir, msg: &[u8], make: impl Fn(u32, bool) -> SegmentRepr, out: &mut Vec<Sent>) {
    let room = datagram::max_payload(1500, &make(0, false));
    assert!(room > 0);
    let mut off = 0;
    loop {
        let n = room.min(msg.len() - off);
        let last = off + n == msg.len();
        out.push(Sent {
            dir,
            repr: make(off as u32, last),
            payload: msg[off..off + n].to_vec(),
        });
        off += n;
        if last {
            break;
        }
    }
}

/// Destination QP numbers: `(port << 8) | slot` (`docs/datagram.md` §10).
const SERVER_QP: u32 = (DEFAULT_PORT as u32) << 8 | 1;
const CLIENT_QP: u32 = 40000 << 8 | 2;

/// The scripted exchange: every datagram kind the brief lists.
fn script() -> Vec<Sent> {
    use Dir::{ClientToServer as C, ServerToClient as S};
    let mut v = Vec::new();
    // UD Send, one segment, addressed by DQPN.
    v.push(Sent {
        dir: C,
        repr: with_dqpn(
            SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None),
            SERVER_QP,
        ),
        payload: data(64, 1),
    });
    // UD Send of 3000 octets: three segments, MO 0 / n / 2n.
    let msg = data(3000, 2);
    segments(
        C,
        &msg,
        |mo, last| {
            with_dqpn(
                SegmentRepr::untagged(Opcode::Send, 0, 2, mo, last, RdmapBody::None),
                SERVER_QP,
            )
        },
        &mut v,
    );
    // Send with Invalidate (plain header: no X, no Q) and Send with SE and
    // Invalidate (with Q).
    v.push(Sent {
        dir: C,
        repr: with_inval(
            SegmentRepr::untagged(Opcode::SendInvalidate, 0, 3, 0, true, RdmapBody::None),
            0x0012_3401,
        ),
        payload: data(16, 3),
    });
    v.push(Sent {
        dir: C,
        repr: with_dqpn(
            with_inval(
                SegmentRepr::untagged(Opcode::SendSeInvalidate, 0, 4, 0, true, RdmapBody::None),
                0x0012_3402,
            ),
            SERVER_QP,
        ),
        payload: data(8, 4),
    });
    // RDMA Write with X (no Q), two segments of T-MSN 1.
    let base = 0x5600_1234_0000u64;
    let msg = data(2000, 5);
    segments(
        C,
        &msg,
        |mo, last| {
            with_ext(
                SegmentRepr::tagged(Opcode::RdmaWrite, 0x3303, base + u64::from(mo), last),
                1,
                mo,
            )
        },
        &mut v,
    );
    // Write-Record with X and Q: three segments of T-MSN 2.
    let base = 0x7f00_0000_1000u64;
    let msg = data(4000, 6);
    segments(
        C,
        &msg,
        |mo, last| {
            with_dqpn(
                with_ext(
                    SegmentRepr::tagged(
                        Opcode::WriteRecord,
                        0x0001_2a01,
                        base + u64::from(mo),
                        last,
                    ),
                    2,
                    mo,
                ),
                SERVER_QP,
            )
        },
        &mut v,
    );
    // Read Request (QN 1, MSN 1) and its two-segment Read Response, whose
    // T-MSN echoes the request's MSN.
    let read = ReadRequest {
        sink_stag: 0x0000_4c02,
        sink_to: 0x7f00_abcd_0000,
        size: 2500,
        src_stag: 0x0001_2a01,
        src_to: 0x7f00_0000_1000,
    };
    v.push(Sent {
        dir: C,
        repr: with_dqpn(
            SegmentRepr::untagged(
                Opcode::ReadRequest,
                1,
                1,
                0,
                true,
                RdmapBody::ReadRequest(read),
            ),
            SERVER_QP,
        ),
        payload: vec![],
    });
    let msg = data(read.size as usize, 7);
    segments(
        S,
        &msg,
        |mo, last| {
            with_dqpn(
                with_ext(
                    SegmentRepr::tagged(
                        Opcode::ReadResponse,
                        read.sink_stag,
                        read.sink_to + u64::from(mo),
                        last,
                    ),
                    1,
                    mo,
                ),
                CLIENT_QP,
            )
        },
        &mut v,
    );
    // Atomic Request (QN 1, MSN 2, sharing the Read Request's MSN space) and
    // its response (QN 3).
    let atomic = AtomicRequest {
        op: AtomicOp::CompareSwap,
        req_id: 7,
        stag: 0x0001_2a01,
        to: 0x7f00_0000_1040,
        add_swap: 5,
        add_swap_mask: u64::MAX,
        compare: 4,
        compare_mask: u64::MAX,
    };
    v.push(Sent {
        dir: C,
        repr: with_dqpn(
            SegmentRepr::untagged(
                Opcode::AtomicRequest,
                1,
                2,
                0,
                true,
                RdmapBody::AtomicRequest(atomic),
            ),
            SERVER_QP,
        ),
        payload: vec![],
    });
    v.push(Sent {
        dir: S,
        repr: with_dqpn(
            SegmentRepr::untagged(
                Opcode::AtomicResponse,
                3,
                1,
                0,
                true,
                RdmapBody::AtomicResponse(AtomicResponse {
                    req_id: 7,
                    orig_value: 4,
                }),
            ),
            CLIENT_QP,
        ),
        payload: vec![],
    });
    // Immediate Data, plain and with SE (Q).
    v.push(Sent {
        dir: C,
        repr: SegmentRepr::untagged(
            Opcode::ImmediateData,
            0,
            5,
            0,
            true,
            RdmapBody::Immediate(0x1122_3344_5566_7788),
        ),
        payload: vec![],
    });
    v.push(Sent {
        dir: C,
        repr: with_dqpn(
            SegmentRepr::untagged(
                Opcode::ImmediateDataSe,
                0,
                6,
                0,
                true,
                RdmapBody::Immediate(42),
            ),
            SERVER_QP,
        ),
        payload: vec![],
    });
    // Terminate with M and D: the echoed header of a Write-Record segment
    // (14 standard octets; its control octet still shows X and Q).
    let offending = v
        .iter()
        .find(|s| s.repr.opcode == Opcode::WriteRecord)
        .map(Sent::bytes)
        .unwrap();
    let mut term = TerminateRepr::new(TerminateCause::DdpTaggedInvalidStag);
    term.segment_len = Some(1442);
    term.ddp_header = Some(EchoedHeader::from_segment(&offending).unwrap());
    v.push(Sent {
        dir: S,
        repr: with_dqpn(
            SegmentRepr::untagged(Opcode::Terminate, 2, 1, 0, true, RdmapBody::Terminate(term)),
            CLIENT_QP,
        ),
        payload: vec![],
    });
    // Terminate with M, D and R for a Read Request (18-octet echo + 28).
    let rr = v
        .iter()
        .find(|s| s.repr.opcode == Opcode::ReadRequest)
        .map(Sent::bytes)
        .unwrap();
    let mut term = TerminateRepr::new(TerminateCause::RdmapInvalidStag);
    term.segment_len = Some(0);
    term.ddp_header = Some(EchoedHeader::from_segment(&rr).unwrap());
    term.rdmap_header = Some(read.to_bytes());
    v.push(Sent {
        dir: C,
        repr: with_dqpn(
            SegmentRepr::untagged(Opcode::Terminate, 2, 1, 0, true, RdmapBody::Terminate(term)),
            SERVER_QP,
        ),
        payload: vec![],
    });
    v
}

/// Foreign UDP payloads: plain text, and octets whose first two look like
/// DDP/RDMAP control octets in DV but not in RV.
fn foreign() -> Vec<Vec<u8>> {
    vec![
        b"hello, this is not softrdma traffic\n".to_vec(),
        vec![0x41, 0x03, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x02, 0x03],
    ]
}

/// What one capture frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    /// Index into the script.
    Ours(usize),
    /// Index into [`foreign`].
    Foreign(usize),
}

/// Writes the script as a UDP flow between 10.0.0.1:40000 and
/// 10.0.0.2:`server_port`, with the foreign datagrams mixed in after the
/// first softrdma datagram. `mangle(frame, bytes)` may change a datagram.
fn capture(
    name: &str,
    server_port: u16,
    sent: &[Sent],
    mut mangle: impl FnMut(usize, &mut Vec<u8>),
) -> (Vec<u8>, Vec<Frame>) {
    let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
    let server = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), server_port);
    let mut flow = UdpFlow::new(PcapWriter::new(Vec::new()).unwrap(), client, server);
    let mut frames = Vec::new();
    for (i, s) in sent.iter().enumerate() {
        let mut b = s.bytes();
        mangle(i, &mut b);
        flow.send(s.dir, &b).unwrap();
        frames.push(Frame::Ours(i));
        if i == 0 {
            for (j, f) in foreign().iter().enumerate() {
                flow.send(Dir::ClientToServer, f).unwrap();
                frames.push(Frame::Foreign(j));
            }
        }
    }
    let pcap = flow.into_writer().into_inner();
    // For a look by hand: SOFTRDMA_PCAP_DIR=dir keeps the captures.
    if let Ok(dir) = std::env::var("SOFTRDMA_PCAP_DIR") {
        std::fs::write(
            std::path::Path::new(&dir).join(format!("{name}.pcap")),
            &pcap,
        )
        .unwrap();
    }
    (pcap, frames)
}

/// tshark for `test`, or `None` when the test is to be skipped (see
/// [`Tshark::for_test`]).
///
/// Wireshark loads its plugin folders before any `-X lua_script`, so an
/// installed copy of the dissector would shadow the repository's (ours then
/// steps aside, see the top of the script) and ignore the script arguments
/// these tests pass: that is refused here with a clear message.
fn tshark_plain(test: &str) -> Option<Tshark> {
    let ts = Tshark::for_test(test)?;
    let folders = ts.run_raw(&["-G", "folders"]).unwrap();
    for line in folders.lines() {
        let Some((kind, dir)) = line.split_once(':') else {
            continue;
        };
        if !kind.contains("Lua Plugins") {
            continue;
        }
        if let Some(copy) = find_named(Path::new(dir.trim()), "softrdma_dgram.lua", 3) {
            panic!(
                "{test}: an installed copy of the dissector ({}) would be tested instead of {}; \
                 move it away to run these tests",
                copy.display(),
                dissector().display()
            );
        }
    }
    Some(ts)
}

/// A file called `name` in `dir` or its subfolders, `depth` levels down.
fn find_named(dir: &Path, name: &str, depth: u32) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            if depth > 0 {
                if let Some(p) = find_named(&path, name, depth - 1) {
                    return Some(p);
                }
            }
        } else if e.file_name() == name {
            return Some(path);
        }
    }
    None
}

/// tshark with the repository's dissector loaded.
fn tshark(test: &str) -> Option<Tshark> {
    Some(tshark_plain(test)?.with_lua(dissector()))
}

/// `-T fields` rows of `fields` for every frame (no filter), plus
/// `frame.protocols` as the last column.
fn rows(ts: &Tshark, pcap: &[u8], fields: &[&str]) -> Vec<Vec<String>> {
    let mut all: Vec<&str> = fields.to_vec();
    all.push("frame.protocols");
    ts.fields(pcap, "", &all).unwrap()
}

fn is_srdma(row: &[String]) -> bool {
    row.last().unwrap().split(':').any(|p| p == "srdma")
}

fn hex32(v: u32) -> String {
    format!("0x{v:08x}")
}

/// Asserts that every column of `row` shows what `s` sent.
fn check_row(row: &[String], s: &Sent, wire: &[u8], what: &str) {
    let ctx = || format!("{what}: {:?} -> {row:?}", s.repr);
    assert!(is_srdma(row), "not recognised as srdma: {}", ctx());
    let r = &s.repr;
    // [opcode, t, l, x, q, stag, to, tmsn, tmo, qn, msn, mo, inval, dqpn,
    //  payload_len, hdr_len, crc, crc_status, iwarp_rdma.opcode, protocols]
    assert_eq!(
        row[0],
        format!("0x{:02x}", u8::from(r.opcode)),
        "opcode of {}",
        ctx()
    );
    let flag = |v: bool| if v { "1" } else { "0" };
    assert_eq!(row[1], flag(r.ddp.is_tagged()), "T of {}", ctx());
    assert_eq!(row[2], flag(r.last), "L of {}", ctx());
    let ext = match r.ddp {
        DdpHeader::Tagged { ext, .. } => ext,
        DdpHeader::Untagged { .. } => None,
    };
    assert_eq!(row[3], flag(ext.is_some()), "X of {}", ctx());
    assert_eq!(row[4], flag(r.dqpn.is_some()), "Q of {}", ctx());
    match r.ddp {
        DdpHeader::Tagged { stag, to, ext } => {
            assert_eq!(row[5], hex32(stag), "STag of {}", ctx());
            assert_eq!(row[6], format!("0x{to:016x}"), "TO of {}", ctx());
            let (msn, mo) = ext.map_or((String::new(), String::new()), |e| {
                (e.msn.to_string(), e.mo.to_string())
            });
            assert_eq!(row[7], msn, "T-MSN of {}", ctx());
            assert_eq!(row[8], mo, "T-MO of {}", ctx());
            for (i, f) in [(9, "QN"), (10, "MSN"), (11, "MO"), (12, "inval")] {
                assert_eq!(row[i], "", "{f} on a tagged segment: {}", ctx());
            }
        }
        DdpHeader::Untagged {
            rsvd_ulp,
            qn,
            msn,
            mo,
        } => {
            for (i, f) in [(5, "STag"), (6, "TO"), (7, "T-MSN"), (8, "T-MO")] {
                assert_eq!(row[i], "", "{f} on an untagged segment: {}", ctx());
            }
            assert_eq!(row[9], qn.to_string(), "QN of {}", ctx());
            assert_eq!(row[10], msn.to_string(), "MSN of {}", ctx());
            assert_eq!(row[11], mo.to_string(), "MO of {}", ctx());
            let inval = if r.opcode.has_invalidate() {
                hex32(rsvd_ulp)
            } else {
                String::new()
            };
            assert_eq!(row[12], inval, "Invalidate STag of {}", ctx());
        }
    }
    let dqpn = r.dqpn.map(hex32).unwrap_or_default();
    assert_eq!(row[13], dqpn, "DQPN of {}", ctx());
    assert_eq!(
        row[14],
        s.payload.len().to_string(),
        "payload length of {}",
        ctx()
    );
    assert_eq!(
        row[15],
        r.header_len().to_string(),
        "header length of {}",
        ctx()
    );
    // The CRC value is the trailer read least-significant octet first.
    let n = wire.len();
    let value = crc::crc32c(&wire[..n - 4]);
    assert_eq!(
        value,
        u32::from_le_bytes(wire[n - 4..].try_into().unwrap()),
        "our own trailer"
    );
    assert_eq!(row[16], hex32(value), "CRC value of {}", ctx());
    assert_eq!(row[17], "1", "CRC status of {}", ctx());
}

const FIELDS: [&str; 19] = [
    "srdma.opcode",
    "srdma.t",
    "srdma.l",
    "srdma.x",
    "srdma.q",
    "srdma.stag",
    "srdma.to",
    "srdma.tmsn",
    "srdma.tmo",
    "srdma.qn",
    "srdma.msn",
    "srdma.mo",
    "srdma.inval_stag",
    "srdma.dqpn",
    "srdma.payload_len",
    "srdma.hdr_len",
    "srdma.crc",
    "srdma.crc_status",
    "iwarp_rdma.opcode",
];

fn assert_clean(ts: &Tshark, pcap: &[u8]) {
    assert_eq!(
        ts.malformed_count(pcap).unwrap(),
        0,
        "{}",
        ts.verbose(pcap).unwrap()
    );
    assert_eq!(
        ts.expert_errors(pcap).unwrap(),
        0,
        "{}",
        ts.expert_error_report(pcap).unwrap()
    );
}

#[test]
fn our_datagrams_dissect_with_the_fields_we_sent_and_good_crcs() {
    let Some(ts) = tshark("our_datagrams_dissect_with_the_fields_we_sent_and_good_crcs") else {
        return;
    };
    let sent = script();
    let (pcap, frames) = capture("dgram-default-port", DEFAULT_PORT, &sent, |_, _| {});
    let rows = rows(&ts, &pcap, &FIELDS);
    assert_eq!(rows.len(), frames.len(), "one row per frame");
    for (row, frame) in rows.iter().zip(&frames) {
        match *frame {
            Frame::Ours(i) => {
                let s = &sent[i];
                check_row(row, s, &s.bytes(), "default port");
                // A plain segment (no X, no Q, standard opcode) is also
                // decoded by Wireshark's own iWARP dissector, which must
                // agree on the opcode.
                let plain = s.repr.dqpn.is_none()
                    && !matches!(s.repr.ddp, DdpHeader::Tagged { ext: Some(_), .. });
                let builtin = if plain {
                    format!("0x{:02x}", u8::from(s.repr.opcode))
                } else {
                    String::new()
                };
                assert_eq!(row[18], builtin, "iwarp_rdma.opcode of {:?}", s.repr);
            }
            Frame::Foreign(j) => {
                assert!(!is_srdma(row), "foreign datagram {j} claimed: {row:?}");
                assert!(row.iter().take(FIELDS.len()).all(String::is_empty));
            }
        }
    }
    assert_clean(&ts, &pcap);
    // The Info column names the extension opcode; the protocol column is ours.
    let summary = ts.summary(&pcap[..]).unwrap();
    assert!(summary.contains("SRDMA"), "{summary}");
    assert!(summary.contains("Write-Record"), "{summary}");

    // Opcode-specific parts.
    let one = |filter: &str, field: &str| -> Vec<String> {
        ts.field_values(&pcap[..], filter, field).unwrap()
    };
    assert_eq!(one("srdma.opcode == 0x1", "srdma.rr.size"), ["2500"]);
    assert_eq!(
        one("srdma.opcode == 0x1", "srdma.rr.sink_stag"),
        ["0x00004c02"]
    );
    assert_eq!(
        one("srdma.opcode == 0x1", "srdma.rr.src_to"),
        ["0x00007f0000001000"]
    );
    assert_eq!(one("srdma.opcode == 0xa", "srdma.atomic.opcode"), ["2"]);
    assert_eq!(
        one("srdma.opcode == 0xa", "srdma.atomic.req_id"),
        ["0x00000007"]
    );
    assert_eq!(
        one("srdma.opcode == 0xa", "srdma.atomic.compare_mask"),
        ["0xffffffffffffffff"]
    );
    assert_eq!(
        one("srdma.opcode == 0xb", "srdma.atomic.orig_req_id"),
        ["0x00000007"]
    );
    assert_eq!(
        one("srdma.opcode == 0xb", "srdma.atomic.orig_value"),
        ["0x0000000000000004"]
    );
    assert_eq!(
        one(
            "srdma.opcode == 0x8 || srdma.opcode == 0x9",
            "srdma.immediate"
        ),
        ["0x1122334455667788", "0x000000000000002a"]
    );
    // Read Response T-MSN echoes the Read Request's MSN.
    assert_eq!(one("srdma.opcode == 0x2", "srdma.tmsn"), ["1", "1"]);
    // Write-Record: base TO is the same for every segment.
    assert_eq!(
        one("srdma.opcode == 0xc", "srdma.base_to"),
        ["0x00007f0000001000"; 3]
    );
    // Terminates: cause, M/D/R, the echoed headers.
    let term = ts
        .fields(
            &pcap[..],
            "srdma.opcode == 0x7",
            &[
                "srdma.term.layer",
                "srdma.term.etype",
                "srdma.term.code",
                "srdma.term.m",
                "srdma.term.d",
                "srdma.term.r",
                "srdma.term.seg_len",
                "srdma.term.ddp.opcode",
                "srdma.term.ddp.x",
                "srdma.term.ddp.q",
                "srdma.term.ddp.stag",
                "srdma.term.ddp.msn",
                "srdma.term.rdmap.size",
            ],
        )
        .unwrap();
    assert_eq!(
        term,
        [
            [
                "1",
                "1",
                "0x00",
                "1",
                "1",
                "0",
                "1442",
                "0x0c",
                "1",
                "1",
                "0x00012a01",
                "",
                ""
            ],
            ["0", "1", "0x00", "1", "1", "1", "0", "0x01", "0", "1", "", "1", "2500"],
        ]
    );
    let causes = one("srdma.opcode == 0x7", "srdma.term.cause");
    assert_eq!(causes.len(), 2);
    assert!(causes[0].contains("Tagged Buffer") && causes[0].contains("invalid STag"));
    assert!(causes[1].contains("Remote Protection"));
}

/// Index in the script of the `nth` (from 0) datagram with opcode `op`.
fn index_of(sent: &[Sent], op: Opcode, nth: usize) -> usize {
    sent.iter()
        .enumerate()
        .filter(|(_, s)| s.repr.opcode == op)
        .nth(nth)
        .map(|(i, _)| i)
        .unwrap()
}

fn flip_payload_bit(sent: &[Sent], target: usize) -> impl FnMut(usize, &mut Vec<u8>) + '_ {
    move |i, b| {
        if i == target {
            let at = sent[i].repr.header_len() + 100;
            b[at] ^= 0x10;
        }
    }
}

#[test]
fn a_flipped_bit_is_one_expert_error() {
    let Some(ts) = tshark("a_flipped_bit_is_one_expert_error") else {
        return;
    };
    let sent = script();
    let target = index_of(&sent, Opcode::WriteRecord, 1);
    let (pcap, frames) = capture(
        "dgram-default-port-bad-crc",
        DEFAULT_PORT,
        &sent,
        flip_payload_bit(&sent, target),
    );
    let report = ts.expert_error_report(&pcap[..]).unwrap();
    assert_eq!(ts.expert_errors(&pcap[..]).unwrap(), 1, "{report}");
    assert!(report.contains("Bad CRC32C"), "{report}");
    assert_eq!(ts.malformed_count(&pcap[..]).unwrap(), 0);
    let rows = rows(&ts, &pcap, &["srdma.crc_status", "srdma.crc_computed"]);
    for (row, frame) in rows.iter().zip(&frames) {
        match *frame {
            Frame::Ours(i) if i == target => {
                assert!(is_srdma(row), "{row:?}");
                assert_eq!(row[0], "0", "bad CRC status: {row:?}");
                // The computed value is the CRC of what arrived.
                let mut b = sent[i].bytes();
                flip_payload_bit(&sent, target)(i, &mut b);
                let n = b.len();
                assert_eq!(row[1], hex32(crc::crc32c(&b[..n - 4])));
            }
            Frame::Ours(_) => {
                assert!(is_srdma(row), "{row:?}");
                assert_eq!(row[0], "1", "{row:?}");
                assert_eq!(row[1], "");
            }
            Frame::Foreign(_) => assert!(!is_srdma(row), "{row:?}"),
        }
    }
}

#[test]
fn heuristic_finds_our_datagrams_on_any_port_and_follows_the_flow() {
    let Some(ts) = tshark("heuristic_finds_our_datagrams_on_any_port_and_follows_the_flow") else {
        return;
    };
    let sent = script();
    let (pcap, frames) = capture("dgram-other-port", OTHER_PORT, &sent, |_, _| {});
    let rows = rows(&ts, &pcap, &FIELDS);
    assert_eq!(rows.len(), frames.len());
    for (row, frame) in rows.iter().zip(&frames) {
        match *frame {
            Frame::Ours(i) => check_row(row, &sent[i], &sent[i].bytes(), "heuristic"),
            Frame::Foreign(j) => assert!(!is_srdma(row), "foreign {j} claimed: {row:?}"),
        }
    }
    assert_clean(&ts, &pcap);

    // With the heuristic off, nothing on this port is ours.
    let off = ts
        .run(
            &pcap[..],
            &[
                "--disable-heuristic",
                HEURISTIC,
                "-Y",
                "srdma",
                "-T",
                "fields",
                "-e",
                "frame.number",
            ],
        )
        .unwrap();
    assert_eq!(off.trim(), "", "heuristic could not be disabled");

    // A corrupted datagram later in a flow the heuristic recognised is shown
    // with a bad CRC (the flow is followed) ...
    let target = index_of(&sent, Opcode::WriteRecord, 1);
    let (bad, _) = capture(
        "dgram-other-port-bad-crc",
        OTHER_PORT,
        &sent,
        flip_payload_bit(&sent, target),
    );
    let report = ts.expert_error_report(&bad[..]).unwrap();
    assert_eq!(ts.expert_errors(&bad[..]).unwrap(), 1, "{report}");
    assert!(report.contains("Bad CRC32C"), "{report}");
    // ... unless following is turned off (script argument follow=0): then
    // the heuristic alone decides, and it never claims a bad CRC.
    let nofollow = tshark_plain("nofollow")
        .unwrap()
        .with_lua(dissector())
        .with_lua_arg("follow=0");
    assert_eq!(nofollow.expert_errors(&bad[..]).unwrap(), 0);
    let claimed = nofollow
        .fields(&bad[..], "srdma", &["frame.number"])
        .unwrap();
    assert_eq!(claimed.len(), sent.len() - 1);
}

#[test]
fn port_argument_registers_the_port() {
    let Some(ts) = tshark_plain("port_argument_registers_the_port") else {
        return;
    };
    let sent = script();
    let (pcap, _) = capture("dgram-port-arg", OTHER_PORT, &sent, |_, _| {});
    let count = |ts: &Tshark| -> usize {
        ts.run(
            &pcap[..],
            &[
                "--disable-heuristic",
                HEURISTIC,
                "-Y",
                "srdma",
                "-T",
                "fields",
                "-e",
                "frame.number",
            ],
        )
        .unwrap()
        .lines()
        .count()
    };
    assert_eq!(count(&ts.clone().with_lua(dissector())), 0);
    let with_port = ts
        .with_lua(dissector())
        .with_lua_arg(&format!("port={OTHER_PORT}"));
    assert_eq!(count(&with_port), sent.len());
    assert_clean(&with_port, &pcap);
}

// ----------------------------------------------------------------------
// RD: the shim (docs/datagram.md §9) and the segment behind it
// ----------------------------------------------------------------------

/// One RD datagram of the RD script and what the dissector must show.
struct RdSent {
    dir: Dir,
    shim: RdShimRepr,
    segment: Option<(SegmentRepr, Vec<u8>)>,
    /// A re-send of an earlier datagram (same flow, epoch, PSN).
    retransmission: bool,
}

impl RdSent {
    fn bytes(&self) -> Vec<u8> {
        let seg = self.segment.as_ref().map(|(r, p)| (r, &p[..]));
        let mut out =
            vec![0u8; rd::buffer_len(seg.map(|(r, _)| r), seg.map_or(0, |(_, p)| p.len()))];
        let n = rd::emit_into(&self.shim, seg, &mut out);
        assert_eq!(n, out.len());
        // Our own receiver accepts what we send.
        match rd::parse(&out).expect("our RD datagram parses") {
            rd::Datagram::Rd { shim, segment } => {
                assert_eq!(shim, self.shim);
                assert_eq!(segment.map(|(r, p)| (r, p.to_vec())), self.segment.clone());
            }
            rd::Datagram::Ud { .. } => panic!("RD datagram taken for UD"),
        }
        out
    }
}

const RD_E1: u32 = 0x6553_0001;
const RD_E2: u32 = 0x6553_1001;

/// An RD exchange between CLIENT_QP and SERVER_QP with every kind of shim:
/// data with and without SYN, P on the last datagram before a stall, an
/// ACK-only datagram, a NAK and the retransmission it causes, a data
/// datagram carrying an ACK, a reset, a zero-window probe, and the
/// segments UD carries plus Read/Atomic/Terminate.
fn rd_script() -> Vec<RdSent> {
    use Dir::{ClientToServer as C, ServerToClient as S};
    let mut v = Vec::new();
    let data = |epoch: u32, psn: u32, syn: bool, from: u32, to: u32| RdShimRepr {
        data: Some(DataSeq { epoch, psn, syn }),
        ..RdShimRepr::control(from, to, 64)
    };
    // A 3000-octet Send as three segments, PSN 0..2 of session E1 (SYN),
    // P on the last.
    let msg = data_bytes(3000, 1);
    let room = rd::max_payload(
        1500,
        &with_dqpn(
            SegmentRepr::untagged(Opcode::Send, 0, 1, 0, false, RdmapBody::None),
            SERVER_QP,
        ),
    );
    let mut psn = 0;
    for (k, chunk) in msg.chunks(room).enumerate() {
        let last = (k + 1) * room >= msg.len();
        let mut r = with_dqpn(
            SegmentRepr::untagged(Opcode::Send, 0, 1, (k * room) as u32, last, RdmapBody::None),
            SERVER_QP,
        );
        r.ddp = match r.ddp {
            DdpHeader::Untagged { qn, msn, mo, .. } => DdpHeader::Untagged {
                rsvd_ulp: CLIENT_QP,
                qn,
                msn,
                mo,
            },
            t => t,
        };
        let mut shim = data(RD_E1, psn, true, CLIENT_QP, SERVER_QP);
        shim.poll = last;
        v.push(RdSent {
            dir: C,
            shim,
            segment: Some((r, chunk.to_vec())),
            retransmission: false,
        });
        psn += 1;
    }
    // The server's ACK-only datagram: everything before PSN 3 of E1.
    v.push(RdSent {
        dir: S,
        shim: RdShimRepr {
            feedback: Feedback::Ack {
                epoch: RD_E1,
                psn: 3,
                nak: false,
            },
            ..RdShimRepr::control(SERVER_QP, CLIENT_QP, 64)
        },
        segment: None,
        retransmission: false,
    });
    // A Write-Record of two segments, PSN 3 and 4 (SYN no longer).
    let wr = data_bytes(2000, 2);
    let troom = rd::max_payload(
        1500,
        &with_dqpn(
            with_ext(
                SegmentRepr::tagged(Opcode::WriteRecord, 0x2a01, 0, false),
                1,
                0,
            ),
            SERVER_QP,
        ),
    );
    let mut wr_datagrams = Vec::new();
    for (k, chunk) in wr.chunks(troom).enumerate() {
        let off = (k * troom) as u32;
        let last = off as usize + chunk.len() == wr.len();
        let r = with_dqpn(
            with_ext(
                SegmentRepr::tagged(
                    Opcode::WriteRecord,
                    0x2a01,
                    0x7f00_0000_1000 + u64::from(off),
                    last,
                ),
                1,
                off,
            ),
            SERVER_QP,
        );
        let d = RdSent {
            dir: C,
            shim: data(RD_E1, psn, false, CLIENT_QP, SERVER_QP),
            segment: Some((r, chunk.to_vec())),
            retransmission: false,
        };
        wr_datagrams.push(RdSent {
            retransmission: true,
            shim: d.shim,
            segment: d.segment.clone(),
            dir: C,
        });
        v.push(d);
        psn += 1;
    }
    // PSN 3 was lost: NAK for it, and go-back-N re-sends 3 and 4.
    v.push(RdSent {
        dir: S,
        shim: RdShimRepr {
            feedback: Feedback::Ack {
                epoch: RD_E1,
                psn: 3,
                nak: true,
            },
            ..RdShimRepr::control(SERVER_QP, CLIENT_QP, 64)
        },
        segment: None,
        retransmission: false,
    });
    v.extend(wr_datagrams);
    // A Read Request (PSN 5, P) and its response from the server's own
    // session E2 (SYN), carrying the ACK of E1.
    let read = ReadRequest {
        sink_stag: 0x4c02,
        sink_to: 0x7f00_0000_2000,
        size: 100,
        src_stag: 0x2a01,
        src_to: 0x7f00_0000_1000,
    };
    let mut shim = data(RD_E1, psn, false, CLIENT_QP, SERVER_QP);
    shim.poll = true;
    v.push(RdSent {
        dir: C,
        shim,
        segment: Some((
            with_dqpn(
                SegmentRepr::untagged(
                    Opcode::ReadRequest,
                    1,
                    1,
                    0,
                    true,
                    RdmapBody::ReadRequest(read),
                ),
                SERVER_QP,
            ),
            Vec::new(),
        )),
        retransmission: false,
    });
    psn += 1;
    v.push(RdSent {
        dir: S,
        shim: RdShimRepr {
            feedback: Feedback::Ack {
                epoch: RD_E1,
                psn,
                nak: false,
            },
            ..data(RD_E2, 0, true, SERVER_QP, CLIENT_QP)
        },
        segment: Some((
            with_dqpn(
                with_ext(
                    SegmentRepr::tagged(Opcode::ReadResponse, 0x4c02, 0x7f00_0000_2000, true),
                    1,
                    0,
                ),
                CLIENT_QP,
            ),
            data_bytes(100, 3),
        )),
        retransmission: false,
    });
    // An Atomic Request and a Terminate about it.
    let atomic = AtomicRequest {
        op: AtomicOp::FetchAdd,
        req_id: 2,
        stag: 0x2a01,
        to: 0x7f00_0000_1000,
        add_swap: 1,
        add_swap_mask: 0,
        compare: 0,
        compare_mask: 0,
    };
    v.push(RdSent {
        dir: C,
        shim: RdShimRepr {
            feedback: Feedback::Ack {
                epoch: RD_E2,
                psn: 1,
                nak: false,
            },
            ..data(RD_E1, psn, false, CLIENT_QP, SERVER_QP)
        },
        segment: Some((
            with_dqpn(
                SegmentRepr::untagged(
                    Opcode::AtomicRequest,
                    1,
                    2,
                    0,
                    true,
                    RdmapBody::AtomicRequest(atomic),
                ),
                SERVER_QP,
            ),
            Vec::new(),
        )),
        retransmission: false,
    });
    psn += 1;
    let term = TerminateRepr {
        cause: TerminateCause::RdmapAccessRights,
        segment_len: None,
        ddp_header: None,
        rdmap_header: None,
    };
    v.push(RdSent {
        dir: S,
        shim: RdShimRepr {
            feedback: Feedback::Ack {
                epoch: RD_E1,
                psn,
                nak: false,
            },
            ..data(RD_E2, 1, false, SERVER_QP, CLIENT_QP)
        },
        segment: Some((
            with_dqpn(
                SegmentRepr::untagged(Opcode::Terminate, 2, 1, 0, true, RdmapBody::Terminate(term)),
                CLIENT_QP,
            ),
            Vec::new(),
        )),
        retransmission: false,
    });
    // The server refuses an older session of the client (reset, floor E1),
    // and the client, stalled by a window of 0, probes.
    v.push(RdSent {
        dir: S,
        shim: RdShimRepr {
            feedback: Feedback::Reset {
                epoch: RD_E1 - 5,
                floor: RD_E1,
            },
            ..RdShimRepr::control(SERVER_QP, CLIENT_QP, 0)
        },
        segment: None,
        retransmission: false,
    });
    v.push(RdSent {
        dir: C,
        shim: RdShimRepr {
            poll: true,
            ..RdShimRepr::control(CLIENT_QP, SERVER_QP, 64)
        },
        segment: None,
        retransmission: false,
    });
    v
}

fn data_bytes(n: usize, seed: u8) -> Vec<u8> {
    data(n, seed)
}

fn rd_capture(
    name: &str,
    port: u16,
    sent: &[RdSent],
    mut mangle: impl FnMut(usize, &mut Vec<u8>),
) -> Vec<u8> {
    let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
    let server = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), port);
    let mut flow = UdpFlow::new(PcapWriter::new(Vec::new()).unwrap(), client, server);
    for (i, s) in sent.iter().enumerate() {
        let mut b = s.bytes();
        mangle(i, &mut b);
        flow.send(s.dir, &b).unwrap();
    }
    let pcap = flow.into_writer().into_inner();
    if let Ok(dir) = std::env::var("SOFTRDMA_PCAP_DIR") {
        std::fs::write(Path::new(&dir).join(format!("{name}.pcap")), &pcap).unwrap();
    }
    pcap
}

const RD_FIELDS: [&str; 20] = [
    "srdma.rd.magic",
    "srdma.rd.dqpn",
    "srdma.rd.d",
    "srdma.rd.s",
    "srdma.rd.a",
    "srdma.rd.n",
    "srdma.rd.r",
    "srdma.rd.p",
    "srdma.rd.rsvd",
    "srdma.rd.sqpn",
    "srdma.rd.epoch",
    "srdma.rd.psn",
    "srdma.rd.ack_epoch",
    "srdma.rd.ack_psn",
    "srdma.rd.floor",
    "srdma.rd.window",
    "srdma.rd.retransmission",
    "srdma.opcode",
    "srdma.payload_len",
    "srdma.crc_status",
];

fn check_rd_row(row: &[String], s: &RdSent, what: &str) {
    let ctx = || format!("{what}: {:?} -> {row:?}", s.shim);
    assert!(is_srdma(row), "not recognised as srdma: {}", ctx());
    let num = |i: usize| hex_or_dec(&row[i]);
    let flag = |v: bool| if v { "1" } else { "0" };
    let sh = &s.shim;
    assert_eq!(num(0), 0x52, "magic of {}", ctx());
    assert_eq!(num(1), u64::from(sh.dst_qpn), "DQPN of {}", ctx());
    assert_eq!(row[2], flag(sh.data.is_some()), "D of {}", ctx());
    assert_eq!(
        row[3],
        flag(sh.data.is_some_and(|d| d.syn)),
        "S of {}",
        ctx()
    );
    let (a, n, r) = match sh.feedback {
        Feedback::None => (false, false, false),
        Feedback::Ack { nak, .. } => (true, nak, false),
        Feedback::Reset { .. } => (false, false, true),
    };
    assert_eq!(row[4], flag(a), "A of {}", ctx());
    assert_eq!(row[5], flag(n), "N of {}", ctx());
    assert_eq!(row[6], flag(r), "R of {}", ctx());
    assert_eq!(row[7], flag(sh.poll), "P of {}", ctx());
    assert_eq!(num(8), 0, "reserved flags of {}", ctx());
    assert_eq!(num(9), u64::from(sh.src_qpn), "SQPN of {}", ctx());
    let (epoch, psn) = sh.data.map_or((0, 0), |d| (d.epoch, d.psn));
    assert_eq!(num(10), u64::from(epoch), "epoch of {}", ctx());
    assert_eq!(num(11), u64::from(psn), "PSN of {}", ctx());
    match sh.feedback {
        Feedback::None => {
            assert_eq!((num(12), num(13)), (0, 0), "no ACK in {}", ctx());
            assert_eq!(row[14], "", "no floor in {}", ctx());
        }
        Feedback::Ack { epoch, psn, .. } => {
            assert_eq!(num(12), u64::from(epoch), "ack epoch of {}", ctx());
            assert_eq!(num(13), u64::from(psn), "ack PSN of {}", ctx());
            assert_eq!(row[14], "", "no floor in {}", ctx());
        }
        Feedback::Reset { epoch, floor } => {
            assert_eq!(num(12), u64::from(epoch), "reset epoch of {}", ctx());
            assert_eq!(row[13], "", "no ack PSN in a reset: {}", ctx());
            assert_eq!(num(14), u64::from(floor), "floor of {}", ctx());
        }
    }
    assert_eq!(num(15), u64::from(sh.window), "window of {}", ctx());
    match &s.segment {
        Some((r, p)) => {
            assert_eq!(
                row[16],
                flag(s.retransmission),
                "retransmission mark of {}",
                ctx()
            );
            assert_eq!(
                num(17),
                u64::from(u8::from(r.opcode)),
                "opcode of {}",
                ctx()
            );
            assert_eq!(num(18), p.len() as u64, "payload length of {}", ctx());
        }
        None => {
            assert_eq!(row[16], "", "no retransmission mark on control: {}", ctx());
            assert_eq!(row[17], "", "no segment in a control datagram: {}", ctx());
        }
    }
    assert_eq!(row[19], "1", "CRC status of {}", ctx());
}

fn hex_or_dec(s: &str) -> u64 {
    let s = s.split_whitespace().next().unwrap_or("");
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("hex {s:?}")),
        None => s.parse().unwrap_or_else(|_| panic!("number {s:?}")),
    }
}

#[test]
fn rd_datagrams_decode_shim_and_segment_with_good_crcs() {
    let Some(ts) = tshark("rd_datagrams_decode_shim_and_segment_with_good_crcs") else {
        return;
    };
    let sent = rd_script();
    for (port, how) in [(DEFAULT_PORT, "default port"), (OTHER_PORT, "heuristic")] {
        let pcap = rd_capture(&format!("rd-{port}"), port, &sent, |_, _| {});
        let rows = rows(&ts, &pcap, &RD_FIELDS);
        assert_eq!(rows.len(), sent.len(), "one row per frame");
        for (row, s) in rows.iter().zip(&sent) {
            check_rd_row(row, s, how);
        }
        assert_clean(&ts, &pcap);
        // The segment fields behind the shim are the UD ones.
        let one = |filter: &str, field: &str| -> Vec<String> {
            ts.field_values(&pcap[..], filter, field).unwrap()
        };
        assert_eq!(one("srdma.opcode == 0x1", "srdma.rr.size"), ["100"]);
        assert_eq!(one("srdma.opcode == 0x2", "srdma.tmsn"), ["1"]);
        assert_eq!(
            one("srdma.opcode == 0xc", "srdma.base_to"),
            ["0x00007f0000001000"; 4]
        );
        assert_eq!(one("srdma.opcode == 0x7", "srdma.term.code"), ["0x02"]);
        assert_eq!(
            one("srdma.rd.kind", "srdma.rd.kind")
                .iter()
                .filter(|k| *k != "data")
                .cloned()
                .collect::<Vec<_>>(),
            ["ACK", "NAK", "reset", "probe"]
        );
        let summary = ts.summary(&pcap[..]).unwrap();
        assert!(summary.contains("RD SYN PSN=0"), "{summary}");
        assert!(summary.contains("[Retransmission]"), "{summary}");
        assert!(summary.contains("Write-Record"), "{summary}");
    }
}

#[test]
fn rd_corrupted_datagrams_and_rule_violations_are_flagged() {
    let Some(ts) = tshark("rd_corrupted_datagrams_and_rule_violations_are_flagged") else {
        return;
    };
    let sent = rd_script();
    // A flipped payload bit in the first Write-Record segment, and one in
    // the shim of the ACK-only datagram: each is one bad-CRC error, on the
    // default port and in a flow the heuristic follows.
    let wr = sent
        .iter()
        .position(|s| {
            s.segment
                .as_ref()
                .is_some_and(|(r, _)| r.opcode == Opcode::WriteRecord)
        })
        .unwrap();
    let ack = sent.iter().position(|s| s.segment.is_none()).unwrap();
    let mangle = |i: usize, b: &mut Vec<u8>| {
        if i == wr {
            b[rd::SHIM_LEN + 26 + 10] ^= 0x04;
        }
        if i == ack {
            b[21] ^= 0x80;
        }
    };
    for port in [DEFAULT_PORT, OTHER_PORT] {
        let pcap = rd_capture(&format!("rd-bad-{port}"), port, &sent, mangle);
        let report = ts.expert_error_report(&pcap[..]).unwrap();
        assert_eq!(ts.expert_errors(&pcap[..]).unwrap(), 2, "{report}");
        assert!(report.contains("Bad CRC32C"), "{report}");
        assert_eq!(ts.malformed_count(&pcap[..]).unwrap(), 0);
        let rows = rows(&ts, &pcap, &["srdma.crc_status", "srdma.rd.kind"]);
        for (i, row) in rows.iter().enumerate() {
            assert!(is_srdma(row), "frame {i}: {row:?}");
            let want = if i == wr || i == ack { "0" } else { "1" };
            assert_eq!(row[0], want, "frame {i}: {row:?}");
        }
    }

    // §9.3 rule violations under a good CRC: one error each, naming the
    // error kind our receiver gives.
    let send = with_dqpn(
        SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None),
        SERVER_QP,
    );
    let good = RdSent {
        dir: Dir::ClientToServer,
        shim: RdShimRepr {
            data: Some(DataSeq {
                epoch: RD_E1,
                psn: 0,
                syn: true,
            }),
            ..RdShimRepr::control(CLIENT_QP, SERVER_QP, 64)
        },
        segment: Some((send, data_bytes(40, 5))),
        retransmission: false,
    }
    .bytes();
    let control = RdSent {
        dir: Dir::ClientToServer,
        shim: RdShimRepr::control(CLIENT_QP, SERVER_QP, 64),
        segment: None,
        retransmission: false,
    }
    .bytes();
    let body = |d: &[u8]| d[..d.len() - 4].to_vec();
    let mut cases: Vec<(Vec<u8>, &str)> = Vec::new();
    let mut b = body(&good);
    b[4] |= 0x01;
    cases.push((b, "reserved RD flag bits"));
    let mut b = body(&control);
    b[4] |= 0x28;
    cases.push((b, "A and R together"));
    let mut b = body(&control);
    b[4] |= 0x10;
    cases.push((b, "N without A"));
    let mut b = body(&control);
    b[4] |= 0x40;
    cases.push((b, "S without D"));
    let mut b = body(&control);
    b[4] |= 0x80;
    cases.push((b, "no DDP segment after the shim"));
    let mut b = body(&control);
    b.extend_from_slice(b"xyz");
    cases.push((b, "after a control shim"));
    let mut b = body(&good);
    b[rd::SHIM_LEN + 18 + 3] ^= 0x01;
    cases.push((b, "differs from the RD shim's DQPN"));
    let mut b = body(&good);
    b[0] = 0x56;
    cases.push((b, "RD shim version other than 0x52"));
    let mut b = body(&good);
    b[rd::SHIM_LEN] |= 0x20;
    cases.push((b, "X is set on an untagged segment"));
    let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
    let server = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), DEFAULT_PORT);
    let mut flow = UdpFlow::new(PcapWriter::new(Vec::new()).unwrap(), client, server);
    let mut kinds = Vec::new();
    for (b, what) in &cases {
        let d = with_crc(b);
        let err = rd::parse(&d)
            .err()
            .unwrap_or_else(|| panic!("{what} parses"));
        kinds.push(format!("({err:?})"));
        flow.send(Dir::ClientToServer, &d).unwrap();
    }
    let pcap = flow.into_writer().into_inner();
    let rows = rows(
        &ts,
        &pcap,
        &[
            "srdma.crc_status",
            "_ws.expert.message",
            "_ws.expert.severity",
        ],
    );
    assert_eq!(rows.len(), cases.len());
    let error = softrdma_sim::tshark::SEVERITY_ERROR.to_string();
    for ((row, (_, what)), kind) in rows.iter().zip(&cases).zip(&kinds) {
        assert!(is_srdma(row), "{what}: {row:?}");
        assert_eq!(row[0], "1", "{what}: CRC is good: {row:?}");
        let errors: Vec<&str> = row[1]
            .split('|')
            .zip(row[2].split('|'))
            .filter(|(_, s)| *s == error)
            .map(|(m, _)| m)
            .collect();
        assert_eq!(errors.len(), 1, "{what}: one error: {row:?}");
        assert!(errors[0].contains(what), "{what}: {errors:?}");
        assert!(
            errors[0].ends_with(kind.as_str()),
            "{what}: {kind} {errors:?}"
        );
    }
}

/// A datagram made of `segment` and a correct CRC.
fn with_crc(segment: &[u8]) -> Vec<u8> {
    let mut d = segment.to_vec();
    d.extend_from_slice(&crc::to_wire(crc::crc32c(segment)));
    d
}

/// The header octets `repr` emits followed by `payload`, without any check.
fn raw_segment(repr: &SegmentRepr, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; repr.header_len()];
    repr.emit(&mut b);
    b.extend_from_slice(payload);
    b
}

#[test]
fn header_violations_with_a_good_crc_are_one_error_each() {
    let Some(ts) = tshark("header_violations_with_a_good_crc_are_one_error_each") else {
        return;
    };
    let send = with_dqpn(
        SegmentRepr::untagged(Opcode::Send, 0, 1, 0, true, RdmapBody::None),
        SERVER_QP,
    );
    let read = ReadRequest {
        sink_stag: 1,
        sink_to: 0x1000,
        size: 64,
        src_stag: 2,
        src_to: 0x2000,
    };
    let rr = SegmentRepr::untagged(
        Opcode::ReadRequest,
        1,
        1,
        0,
        true,
        RdmapBody::ReadRequest(read),
    );
    let wr = with_dqpn(
        with_ext(
            SegmentRepr::tagged(Opcode::WriteRecord, 0x2a01, 0x1000, true),
            1,
            0,
        ),
        SERVER_QP,
    );
    let mut cases: Vec<(Vec<u8>, &str)> = Vec::new();
    let mut b = raw_segment(&send, b"data");
    b[0] |= 0x04;
    cases.push((b, "reserved DDP control bits"));
    let mut b = raw_segment(&send, b"data");
    b[0] |= 0x20;
    cases.push((b, "X is set on an untagged segment"));
    let b = raw_segment(
        &SegmentRepr::tagged(Opcode::ReadResponse, 1, 0x1000, true),
        b"data",
    );
    cases.push((b, "without X"));
    let b = raw_segment(&rr, b"more");
    cases.push((b, "octets follow"));
    let b = raw_segment(&wr, b"")[..20].to_vec();
    cases.push((b, "ends inside the 26-octet DDP header"));
    let mut b = raw_segment(&send, b"data");
    b[1] &= 0x3F;
    cases.push((b, "RV = 0"));
    let mut b = raw_segment(&send, b"data");
    b[0] |= 0x80;
    cases.push((b, "wrong buffer model"));

    let client = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 40000);
    let server = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), DEFAULT_PORT);
    let mut flow = UdpFlow::new(PcapWriter::new(Vec::new()).unwrap(), client, server);
    let mut kinds = Vec::new();
    for (seg, _) in &cases {
        let d = with_crc(seg);
        // Our receiver drops each of them; the dissector names the same kind.
        let err = datagram::parse(&d).expect_err("a violation parses");
        kinds.push(format!("({err:?})"));
        flow.send(Dir::ClientToServer, &d).unwrap();
    }
    let pcap = flow.into_writer().into_inner();
    let rows = rows(
        &ts,
        &pcap,
        &[
            "srdma.crc_status",
            "_ws.expert.message",
            "_ws.expert.severity",
        ],
    );
    assert_eq!(rows.len(), cases.len());
    let error = softrdma_sim::tshark::SEVERITY_ERROR.to_string();
    for ((row, (_, what)), kind) in rows.iter().zip(&cases).zip(&kinds) {
        assert!(is_srdma(row), "{what}: {row:?}");
        assert_eq!(row[0], "1", "{what}: CRC is good: {row:?}");
        let messages: Vec<&str> = row[1].split('|').collect();
        let severities: Vec<&str> = row[2].split('|').collect();
        let errors: Vec<&str> = messages
            .iter()
            .zip(&severities)
            .filter(|(_, s)| **s == error)
            .map(|(m, _)| *m)
            .collect();
        assert_eq!(errors.len(), 1, "{what}: one error: {row:?}");
        assert!(errors[0].contains(what), "{what}: {errors:?}");
        assert!(
            errors[0].ends_with(kind.as_str()),
            "{what}: {kind} {errors:?}"
        );
    }
    assert_eq!(ts.expert_errors(&pcap[..]).unwrap(), cases.len());
}
