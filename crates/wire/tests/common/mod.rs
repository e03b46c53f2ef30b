//! Helpers shared by the wire integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use softrdma_sim::pcap::{decode_frame, PcapFile, Transport};
use softrdma_wire::ddp::Mode;
use softrdma_wire::fpdu::{self, Deframer, Event, Framer};
use softrdma_wire::rdmap::SegmentRepr;

/// One titled hex dump of `golden.txt`.
pub struct Vector {
    pub title: String,
    pub bytes: Vec<u8>,
}

/// Reads every vector of `testdata/iwarp/golden.txt`.
pub fn golden_vectors() -> Vec<Vector> {
    let path = softrdma_sim::iwarp_testdata("golden.txt");
    let text = std::fs::read_to_string(&path).expect("read golden.txt");
    let mut out: Vec<Vector> = Vec::new();
    for line in text.lines() {
        if line.starts_with("  ") && line.contains(':') {
            let hex = line.split_once(':').unwrap().1;
            let v = out.last_mut().expect("hex before any title");
            for h in hex.split_whitespace() {
                v.bytes.push(u8::from_str_radix(h, 16).expect("hex octet"));
            }
        } else if !line.trim().is_empty() {
            out.push(Vector {
                title: line.trim().to_string(),
                bytes: Vec::new(),
            });
        }
    }
    out
}

/// Everything the deframer reported for one FPDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deframed {
    pub header: Vec<u8>,
    pub payload: Vec<u8>,
    pub ulpdu_len: usize,
}

impl Deframed {
    /// The whole ULPDU (header then payload).
    pub fn ulpdu(&self) -> Vec<u8> {
        let mut u = self.header.clone();
        u.extend_from_slice(&self.payload);
        u
    }
}

/// Runs a whole stream through a deframer; panics on any error or leftover.
pub fn deframe_all(d: &mut Deframer, mut stream: &[u8]) -> Vec<Deframed> {
    let mut out = Vec::new();
    let mut cur = Deframed {
        header: Vec::new(),
        payload: Vec::new(),
        ulpdu_len: 0,
    };
    loop {
        let (n, ev) = d.decode(stream).expect("deframe");
        match ev {
            Some(Event::Header(h)) => cur.header = h.to_vec(),
            Some(Event::Payload(p)) => cur.payload.extend_from_slice(p),
            Some(Event::End { ulpdu_len }) => {
                cur.ulpdu_len = ulpdu_len;
                out.push(std::mem::replace(
                    &mut cur,
                    Deframed {
                        header: Vec::new(),
                        payload: Vec::new(),
                        ulpdu_len: 0,
                    },
                ));
            }
            None if stream.is_empty() => break,
            None => {}
        }
        stream = &stream[n..];
    }
    assert!(d.at_boundary(), "stream ends inside an FPDU");
    out
}

/// Frames a segment (header from `repr`, then `payload`) as one FPDU.
pub fn frame(framer: &mut Framer, repr: &SegmentRepr, payload: &[u8]) -> Vec<u8> {
    let mut hdr = vec![0u8; fpdu::LEN_FIELD + repr.header_len()];
    repr.emit(&mut hdr[fpdu::LEN_FIELD..]);
    fpdu::set_ulpdu_len(&mut hdr, payload.len()).expect("ULPDU fits");
    let mut out = Vec::new();
    framer
        .frame_to_vec(&hdr, &[payload], &mut out)
        .expect("frame");
    out
}

/// Parses a deframed ULPDU in stream mode; returns the repr and payload.
pub fn parse_segment(u: &[u8]) -> (SegmentRepr, Vec<u8>) {
    let (repr, hlen) = SegmentRepr::parse(u, Mode::Stream).expect("segment parses");
    (repr, u[hlen..].to_vec())
}

/// The two byte streams of the first TCP connection in a capture, as
/// (client → server, server → client), reassembled by sequence number
/// (retransmitted octets are dropped).
pub fn tcp_streams(pcap: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let file = PcapFile::parse(pcap).expect("pcap parses");
    type Key = (Ipv4Addr, u16, Ipv4Addr, u16);
    let mut flows: BTreeMap<Key, BTreeMap<u32, Vec<u8>>> = BTreeMap::new();
    let mut client: Option<Key> = None;
    for rec in &file.records {
        let Some(ip) = decode_frame(&rec.data) else {
            continue;
        };
        if let Transport::Tcp {
            src_port,
            dst_port,
            seq,
            flags,
            payload,
            ..
        } = ip.transport
        {
            let key = (ip.src, src_port, ip.dst, dst_port);
            // The SYN without ACK names the client.
            if flags.0 & 0x02 != 0 && flags.0 & 0x10 == 0 && client.is_none() {
                client = Some(key);
            }
            if !payload.is_empty() {
                flows.entry(key).or_default().entry(seq).or_insert(payload);
            }
        }
    }
    let c = client.expect("a SYN in the capture");
    let s = (c.2, c.3, c.0, c.1);
    let join = |segs: Option<&BTreeMap<u32, Vec<u8>>>| -> Vec<u8> {
        let mut out = Vec::new();
        let Some(segs) = segs else { return out };
        let mut next: Option<u32> = None;
        for (&seq, data) in segs {
            let start = next.unwrap_or(seq);
            let skip = start.wrapping_sub(seq) as usize;
            assert!(skip < 1 << 31, "gap in the capture before seq {seq}");
            if skip < data.len() {
                out.extend_from_slice(&data[skip..]);
            }
            next = Some(seq.wrapping_add(data.len() as u32).max(start));
        }
        out
    };
    (join(flows.get(&c)), join(flows.get(&s)))
}
