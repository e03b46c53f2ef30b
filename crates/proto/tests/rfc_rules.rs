//! Script-style protocol tests: one test per RFC rule the RC engine relies
//! on (RFC 5040 RDMAP, RFC 5041 DDP, RFC 5044 MPA, RFC 6581 peer-to-peer,
//! and the ordering rule of `docs/wire.md` §7.3).
//!
//! Each test drives a single [`RcQp`] with hand-built FPDUs and checks, field
//! by field, what it transmits and what it reports:
//!
//! * bytes in: [`Qp::feed`] with FPDUs made by [`Qp::fpdu`] (a
//!   [`SegmentRepr`] + payload, framed with the QP's CRC setting);
//! * bytes out: [`Qp::transmitted`] runs everything `poll_transmit` wrote
//!   through a [`Deframer`] (which checks the CRC when it is on) and
//!   [`SegmentRepr::parse`], giving a list of `(SegmentRepr, payload)`;
//! * completions and events out: [`Qp::completions`], [`Qp::events`].
//!
//! Terminate checks always include the fixed DDP header of RFC 5040 §5.4 /
//! `docs/wire.md` §8.5 (QN 2, MSN 1, MO 0, L = 1) and the exact
//! layer / error type / code triple of the table in `docs/wire.md` §8.5.

use std::io;

use softrdma_proto::memory::{Access, VecMemory};
use softrdma_proto::rc::{CqKind, RcConfig, RcEvent, RcQp, RcState, RtrKind, RtrRole};
use softrdma_proto::wr::{
    InlineData, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
    WorkCompletion,
};
use softrdma_wire::ddp::{DdpHeader, Mode};
use softrdma_wire::fpdu::{self, Deframer, Event, Framer, LEN_FIELD};
use softrdma_wire::rdmap::{
    AtomicOp, AtomicRequest, AtomicResponse, Opcode, RdmapBody, ReadRequest, SegmentRepr,
    TerminateCause, TerminateRepr, TERM_D, TERM_M, TERM_R,
};

// ----------------------------------------------------------------------
// The harness
// ----------------------------------------------------------------------

/// One decoded FPDU the QP wrote: its DDP/RDMAP header and its payload.
type Seg = (SegmentRepr, Vec<u8>);

/// A single queue pair, its memory, and the script operations.
struct Qp {
    qp: RcQp,
    mem: VecMemory,
}

impl Qp {
    fn new(cfg: RcConfig) -> Qp {
        Qp {
            qp: RcQp::new(cfg),
            mem: VecMemory::new(),
        }
    }

    /// Registers `len` octets at `base` (protection domain 0); the STag.
    fn region(&mut self, base: u64, len: usize, access: Access) -> u32 {
        self.mem.register(0, base, len, access)
    }

    /// Frames one segment as an FPDU with the QP's CRC setting.
    fn fpdu(&self, repr: &SegmentRepr, payload: &[u8]) -> Vec<u8> {
        frame(self.qp.config().crc, repr, payload)
    }

    /// Bytes in: octets from the peer.
    fn feed(&mut self, bytes: &[u8]) {
        self.qp.handle_bytes(bytes, &mut self.mem);
    }

    /// Frames `repr` + `payload` and feeds it.
    fn feed_seg(&mut self, repr: &SegmentRepr, payload: &[u8]) {
        let b = self.fpdu(repr, payload);
        self.feed(&b);
    }

    /// Bytes out, raw: everything `poll_transmit` writes to a socket that
    /// takes all it is offered.
    fn wire(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        self.qp
            .poll_transmit(&mut self.mem, &mut out)
            .expect("a Vec never fails");
        out
    }

    /// Bytes out, decoded.
    fn transmitted(&mut self) -> Vec<Seg> {
        let crc = self.qp.config().crc;
        let w = self.wire();
        decode(crc, &w)
    }

    fn completions(&mut self) -> Vec<(CqKind, WorkCompletion)> {
        std::iter::from_fn(|| self.qp.poll_completion()).collect()
    }

    fn events(&mut self) -> Vec<RcEvent> {
        std::iter::from_fn(|| self.qp.poll_event()).collect()
    }

    fn post_recv(&mut self, wr_id: u64, stag: u32, addr: u64, len: u32) {
        self.qp
            .post_recv(RecvWr {
                wr_id,
                sgl: SgList::single(addr, len, stag),
            })
            .expect("receive queue has room");
    }

    fn post_send(&mut self, wr: SendWr) {
        self.qp.post_send(wr).expect("send queue has room");
    }
}

/// Frames a segment (header from `repr`, then `payload`) as one FPDU.
fn frame(crc: bool, repr: &SegmentRepr, payload: &[u8]) -> Vec<u8> {
    let mut hdr = vec![0u8; LEN_FIELD + repr.header_len()];
    repr.emit(&mut hdr[LEN_FIELD..]);
    fpdu::set_ulpdu_len(&mut hdr, payload.len()).expect("ULPDU fits");
    let mut out = Vec::new();
    Framer::new(crc, false)
        .frame_to_vec(&hdr, &[payload], &mut out)
        .expect("frame");
    out
}

/// Decodes a whole FPDU stream (no markers) into segments. Panics on a bad
/// CRC (when `crc`), a malformed segment, or a stream that ends mid-FPDU.
fn decode(crc: bool, mut stream: &[u8]) -> Vec<Seg> {
    let mut d = Deframer::new(crc, false);
    let mut out = Vec::new();
    let mut ulpdu = Vec::new();
    loop {
        let (n, ev) = d.decode(stream).expect("the QP wrote a valid FPDU stream");
        match ev {
            Some(Event::Header(h)) => {
                ulpdu.clear();
                ulpdu.extend_from_slice(h);
            }
            Some(Event::Payload(p)) => ulpdu.extend_from_slice(p),
            Some(Event::End { ulpdu_len }) => {
                assert_eq!(ulpdu.len(), ulpdu_len);
                let (repr, hlen) =
                    SegmentRepr::parse(&ulpdu, Mode::Stream).expect("the QP wrote a valid segment");
                out.push((repr, ulpdu[hlen..].to_vec()));
            }
            None if stream.is_empty() => break,
            None => assert!(n > 0, "deframer stuck"),
        }
        stream = &stream[n..];
    }
    assert!(d.at_boundary(), "the QP stopped writing inside an FPDU");
    out
}

/// A socket that accepts `room` more octets, then would block.
struct Budget {
    out: Vec<u8>,
    room: usize,
}

impl io::Write for Budget {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[io::IoSlice::new(b)])
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        if self.room == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(self.room - n);
            self.out.extend_from_slice(&b[..take]);
            n += take;
        }
        self.room -= n;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

// --- segments ---------------------------------------------------------

/// A Send segment (QN 0).
fn send_seg(msn: u32, mo: u32, last: bool) -> SegmentRepr {
    SegmentRepr::untagged(Opcode::Send, 0, msn, mo, last, RdmapBody::None)
}

/// A Read Request (QN 1, single segment).
fn read_request(msn: u32, req: ReadRequest) -> SegmentRepr {
    SegmentRepr::untagged(
        Opcode::ReadRequest,
        1,
        msn,
        0,
        true,
        RdmapBody::ReadRequest(req),
    )
}

fn untagged_hdr(qn: u32, msn: u32, mo: u32) -> DdpHeader {
    DdpHeader::Untagged {
        rsvd_ulp: 0,
        qn,
        msn,
        mo,
    }
}

fn tagged_hdr(stag: u32, to: u64) -> DdpHeader {
    DdpHeader::Tagged {
        stag,
        to,
        ext: None,
    }
}

/// The DDP header octets of `repr` as a Terminate must echo them (14 tagged,
/// 18 untagged).
fn ddp_octets(repr: &SegmentRepr) -> Vec<u8> {
    let mut b = vec![0u8; repr.header_len()];
    repr.emit(&mut b);
    b.truncate(repr.ddp.buffer_len());
    b
}

// --- work requests ----------------------------------------------------

fn signaled() -> SendFlags {
    SendFlags {
        signaled: true,
        ..SendFlags::default()
    }
}

fn send_wr(wr_id: u64, stag: u32, addr: u64, len: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Sgl(SgList::single(addr, len, stag)),
        flags: signaled(),
    }
}

fn write_wr(wr_id: u64, stag: u32, addr: u64, len: u32, rkey: u32, remote_addr: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Write {
            remote_addr,
            rkey,
            imm: None,
        },
        payload: Payload::Sgl(SgList::single(addr, len, stag)),
        flags: signaled(),
    }
}

fn read_wr(wr_id: u64, stag: u32, addr: u64, len: u32, rkey: u32, remote_addr: u64) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Read { remote_addr, rkey },
        payload: Payload::Sgl(SgList::single(addr, len, stag)),
        flags: signaled(),
    }
}

fn wc(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> WorkCompletion {
    WorkCompletion::new(wr_id, status, opcode, byte_len)
}

/// Completions of one queue, in order.
fn of(kind: CqKind, all: &[(CqKind, WorkCompletion)]) -> Vec<WorkCompletion> {
    all.iter()
        .filter(|(k, _)| *k == kind)
        .map(|(_, w)| *w)
        .collect()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

// --- Terminate checks -------------------------------------------------

/// The Terminate `seg` carries, after checking its fixed header: opcode 7,
/// L = 1, QN 2, MSN 1, MO 0, no payload after the attachments.
fn terminate_of(seg: &Seg) -> TerminateRepr {
    let (repr, payload) = seg;
    assert_eq!(repr.opcode, Opcode::Terminate, "{seg:?}");
    assert!(repr.last, "a Terminate is a single segment");
    assert_eq!(
        repr.ddp,
        untagged_hdr(2, 1, 0),
        "Terminate is QN 2, MSN 1, MO 0"
    );
    assert!(payload.is_empty(), "nothing after the attachments");
    let RdmapBody::Terminate(t) = repr.body else {
        panic!("Terminate body: {seg:?}");
    };
    t
}

/// The QP wrote exactly one FPDU, a Terminate; returns it.
fn only_terminate(segs: &[Seg]) -> TerminateRepr {
    assert_eq!(segs.len(), 1, "exactly one FPDU, the Terminate: {segs:?}");
    terminate_of(&segs[0])
}

/// Checks the cause both by name and by its (layer, etype, code) triple.
fn assert_cause(t: &TerminateRepr, cause: TerminateCause, raw: (u8, u8, u8)) {
    assert_eq!(t.cause, cause);
    assert_eq!(t.cause.to_raw(), raw, "{cause}");
}

/// The M, D and R bits of a Terminate's control word.
fn mdr(t: &TerminateRepr) -> u32 {
    t.control_word() & (TERM_M | TERM_D | TERM_R)
}

/// A Terminate about the segment `repr` (with `payload_len` payload
/// octets): M and D set, the segment's DDP header echoed, the segment
/// length its payload length, no RDMAP header.
fn assert_echoes(t: &TerminateRepr, repr: &SegmentRepr, payload_len: u16) {
    assert_eq!(mdr(t), TERM_M | TERM_D, "M and D, not R");
    assert_eq!(t.segment_len, Some(payload_len));
    let echoed = t.ddp_header.expect("D: DDP header attached");
    assert_eq!(echoed.as_bytes(), &ddp_octets(repr)[..]);
    assert_eq!(t.rdmap_header, None);
}

/// After the QP sent a Terminate for `cause`: the error event, then (once
/// the Terminate was written) TxClosed; the QP is in error; nothing more is
/// transmitted even when more bad input arrives.
fn assert_failed_locally(q: &mut Qp, cause: TerminateCause) {
    assert_eq!(
        q.events(),
        vec![
            RcEvent::Error {
                cause: Some(cause),
                remote: false
            },
            RcEvent::TxClosed
        ]
    );
    assert_eq!(q.qp.state(), RcState::Error);
    q.feed_seg(&send_seg(7, 0, true), b"late");
    q.feed_seg(
        &SegmentRepr::untagged(Opcode::Unknown(0xD), 0, 1, 0, true, RdmapBody::None),
        &[],
    );
    assert!(!q.qp.wants_transmit());
    assert!(
        q.wire().is_empty(),
        "one Terminate per stream, then silence"
    );
}

const LOCAL: Access = Access::LOCAL_WRITE;
const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);

/// A config whose FPDUs carry at most 64-octet ULPDUs: 46 payload octets
/// per Send segment, 50 per Write / Read Response segment.
fn small_fpdus() -> RcConfig {
    RcConfig {
        max_ulpdu: 64,
        ..RcConfig::default()
    }
}

// ----------------------------------------------------------------------
// RFC 5041 (DDP)
// ----------------------------------------------------------------------

/// RFC 5041 §4.3 / §5.2 (sender side): the MSN of the first untagged
/// message on each queue is 1, each later message on the same queue carries
/// the previous MSN + 1, and every segment of one message repeats its MSN
/// while MO counts the octets before the segment. Sends (QN 0) and Read
/// Requests (QN 1) are numbered independently; only the last segment has L.
#[test]
fn rfc5041_tx_msn_starts_at_one_per_queue_and_counts_messages() {
    let mut q = Qp::new(small_fpdus());
    let src = q.region(0x1000, 256, LOCAL);
    q.mem.bytes_mut(src).copy_from_slice(&pattern(256, 1));
    let sink = q.region(0x8000, 64, LOCAL);
    q.post_send(send_wr(1, src, 0x1000, 60)); // two segments: 46 + 14
    q.post_send(read_wr(2, sink, 0x8000, 8, 0x0ABC_DE01, 0x40));
    q.post_send(send_wr(3, src, 0x1000 + 100, 4));
    q.post_send(read_wr(4, sink, 0x8000 + 8, 16, 0x0ABC_DE01, 0x80));

    let segs = q.transmitted();
    let headers: Vec<(Opcode, bool, DdpHeader)> = segs
        .iter()
        .map(|(r, _)| (r.opcode, r.last, r.ddp))
        .collect();
    assert_eq!(
        headers,
        vec![
            (Opcode::Send, false, untagged_hdr(0, 1, 0)),
            (Opcode::Send, true, untagged_hdr(0, 1, 46)),
            (Opcode::ReadRequest, true, untagged_hdr(1, 1, 0)),
            (Opcode::Send, true, untagged_hdr(0, 2, 0)),
            (Opcode::ReadRequest, true, untagged_hdr(1, 2, 0)),
        ]
    );
    let src_bytes = pattern(256, 1);
    assert_eq!(segs[0].1, &src_bytes[..46]);
    assert_eq!(segs[1].1, &src_bytes[46..60]);
    assert_eq!(segs[3].1, &src_bytes[100..104]);
    assert_eq!(
        segs[2].0.body,
        RdmapBody::ReadRequest(ReadRequest {
            sink_stag: sink,
            sink_to: 0x8000,
            size: 8,
            src_stag: 0x0ABC_DE01,
            src_to: 0x40,
        })
    );
    assert_eq!(
        segs[4].0.body,
        RdmapBody::ReadRequest(ReadRequest {
            sink_stag: sink,
            sink_to: 0x8008,
            size: 16,
            src_stag: 0x0ABC_DE01,
            src_to: 0x80,
        })
    );
}

/// RFC 5041 §4.3 / §5.2 (receiver side): the receiver expects MSN 1 first on
/// each queue and then MSN + 1 per message, independently per queue; a
/// multi-segment message keeps one MSN. In-order MSNs are accepted silently.
#[test]
fn rfc5041_rx_msn_starts_at_one_per_queue_and_counts_messages() {
    let mut q = Qp::new(RcConfig::default());
    let buf = q.region(0, 64, LOCAL);
    let src = q.region(0x5000, 16, Access::REMOTE_READ);
    q.mem.bytes_mut(src).copy_from_slice(&pattern(16, 9));
    q.post_recv(10, buf, 0, 32);
    q.post_recv(11, buf, 32, 32);
    let req = |size: u32| ReadRequest {
        sink_stag: 0x77,
        sink_to: 0,
        size,
        src_stag: src,
        src_to: 0x5000,
    };

    q.feed_seg(&send_seg(1, 0, true), b"one");
    q.feed_seg(&read_request(1, req(4)), &[]);
    q.feed_seg(&send_seg(2, 0, false), b"tw");
    q.feed_seg(&send_seg(2, 2, true), b"o!");
    q.feed_seg(&read_request(2, req(8)), &[]);

    assert_eq!(
        q.completions(),
        vec![
            (CqKind::Recv, wc(10, WcStatus::Success, WcOpcode::Recv, 3)),
            (CqKind::Recv, wc(11, WcStatus::Success, WcOpcode::Recv, 4)),
        ]
    );
    assert_eq!(&q.mem.bytes(buf)[..3], b"one");
    assert_eq!(&q.mem.bytes(buf)[32..36], b"two!");
    let segs = q.transmitted();
    let got: Vec<(Opcode, DdpHeader, usize)> = segs
        .iter()
        .map(|(r, p)| (r.opcode, r.ddp, p.len()))
        .collect();
    assert_eq!(
        got,
        vec![
            (Opcode::ReadResponse, tagged_hdr(0x77, 0), 4),
            (Opcode::ReadResponse, tagged_hdr(0x77, 0), 8),
        ]
    );
    assert_eq!(segs[0].1, &pattern(16, 9)[..4]);
    assert_eq!(segs[1].1, &pattern(16, 9)[..8]);
    assert!(q.events().is_empty());
}

/// RFC 5041 §7.1 / §7.2: an untagged segment whose MSN is not the one the
/// queue expects (ahead of it, or a replay of a finished message) is
/// "invalid MSN, MSN range" — DDP layer, untagged buffer error, code 0x03.
/// The Terminate (RFC 5040 §4.8) echoes the offending DDP header and its
/// payload length; the untouched posted receive is flushed.
#[test]
fn rfc5041_msn_out_of_range_is_ddp_untagged_0x03() {
    // (name, script before the bad segment, bad segment, its payload,
    //  receives that are flushed afterwards)
    type Case = (
        &'static str,
        fn(&mut Qp),
        SegmentRepr,
        &'static [u8],
        &'static [u64],
    );
    let zero_read = ReadRequest {
        sink_stag: 1,
        sink_to: 0,
        size: 0,
        src_stag: 1,
        src_to: 0,
    };
    let cases: [Case; 4] = [
        (
            "first Send with MSN 2",
            |_| {},
            send_seg(2, 0, true),
            b"abcde",
            &[10, 11],
        ),
        (
            "replay of Send MSN 1",
            |q| {
                q.feed_seg(&send_seg(1, 0, true), b"first");
                assert_eq!(
                    q.completions(),
                    vec![(CqKind::Recv, wc(10, WcStatus::Success, WcOpcode::Recv, 5))]
                );
            },
            send_seg(1, 0, true),
            b"again",
            &[11],
        ),
        (
            "Send MSN 3 after MSN 1",
            |q| {
                q.feed_seg(&send_seg(1, 0, true), b"first");
                assert_eq!(q.completions().len(), 1);
            },
            send_seg(3, 0, true),
            b"skips",
            &[11],
        ),
        (
            "first Read Request with MSN 2",
            |_| {},
            read_request(2, zero_read),
            b"",
            &[10, 11],
        ),
    ];
    for (name, setup, bad, payload, flushed) in cases {
        let mut q = Qp::new(RcConfig::default());
        let buf = q.region(0, 64, LOCAL);
        q.post_recv(10, buf, 0, 32);
        q.post_recv(11, buf, 32, 32);
        setup(&mut q);
        q.feed_seg(&bad, payload);

        let t = only_terminate(&q.transmitted());
        assert_cause(&t, TerminateCause::DdpUntaggedMsnRange, (1, 2, 0x03));
        assert_echoes(&t, &bad, payload.len() as u16);
        let expect: Vec<(CqKind, WorkCompletion)> = flushed
            .iter()
            .map(|&id| {
                (
                    CqKind::Recv,
                    wc(id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
                )
            })
            .collect();
        assert_eq!(q.completions(), expect, "{name}");
        assert!(q.mem.bytes(buf)[32..].iter().all(|&b| b == 0), "{name}");
        assert_failed_locally(&mut q, TerminateCause::DdpUntaggedMsnRange);
    }
}

/// RFC 5041 §5.2 / §7.2: the MO of an untagged segment must equal the
/// octets of the message received so far (0 for a first segment); anything
/// else is "invalid MO", code 0x04. A receive already in progress fails
/// (it never completes successfully) and nothing of the bad segment is
/// placed.
#[test]
fn rfc5041_mo_must_equal_octets_received_else_0x04() {
    // A message that starts with MO 4.
    let mut q = Qp::new(RcConfig::default());
    let buf = q.region(0, 64, LOCAL);
    q.post_recv(10, buf, 0, 64);
    let bad = send_seg(1, 4, true);
    q.feed_seg(&bad, b"tail");
    let t = only_terminate(&q.transmitted());
    assert_cause(&t, TerminateCause::DdpUntaggedInvalidMo, (1, 2, 0x04));
    assert_echoes(&t, &bad, 4);
    assert_eq!(
        q.completions(),
        vec![(
            CqKind::Recv,
            wc(10, WcStatus::WrFlushErr, WcOpcode::Recv, 0)
        )]
    );
    assert!(q.mem.bytes(buf).iter().all(|&b| b == 0));
    assert_failed_locally(&mut q, TerminateCause::DdpUntaggedInvalidMo);

    // A continuation that skips octets: 8 received, MO 16 claimed.
    let mut q = Qp::new(RcConfig::default());
    let buf = q.region(0, 64, LOCAL);
    q.post_recv(10, buf, 0, 64);
    q.feed_seg(&send_seg(1, 0, false), b"01234567");
    assert!(q.wire().is_empty());
    let bad = send_seg(1, 16, true);
    q.feed_seg(&bad, b"89abcdef");
    let t = only_terminate(&q.transmitted());
    assert_cause(&t, TerminateCause::DdpUntaggedInvalidMo, (1, 2, 0x04));
    assert_echoes(&t, &bad, 8);
    assert_eq!(
        q.completions(),
        vec![(CqKind::Recv, wc(10, WcStatus::RemOpErr, WcOpcode::Recv, 0))]
    );
    assert_eq!(&q.mem.bytes(buf)[..8], b"01234567");
    assert!(q.mem.bytes(buf)[8..].iter().all(|&b| b == 0));
    assert_failed_locally(&mut q, TerminateCause::DdpUntaggedInvalidMo);
}

/// RFC 5040 §5 with RFC 5041 §7.2: each untagged RDMAP message travels on
/// its own DDP queue (Send on QN 0, Read Request on QN 1, `docs/wire.md`
/// §8.2); an untagged segment on another queue number is "invalid QN",
/// code 0x01.
#[test]
fn rfc5041_wrong_qn_for_opcode_is_ddp_untagged_0x01() {
    let rr = ReadRequest {
        sink_stag: 1,
        sink_to: 0,
        size: 0,
        src_stag: 1,
        src_to: 0,
    };
    let cases = [
        (
            "Send on QN 1",
            SegmentRepr::untagged(Opcode::Send, 1, 1, 0, true, RdmapBody::None),
            3usize,
        ),
        (
            "Send on QN 2",
            SegmentRepr::untagged(Opcode::Send, 2, 1, 0, true, RdmapBody::None),
            3,
        ),
        (
            "Read Request on QN 0",
            SegmentRepr::untagged(
                Opcode::ReadRequest,
                0,
                1,
                0,
                true,
                RdmapBody::ReadRequest(rr),
            ),
            0,
        ),
    ];
    for (name, bad, len) in cases {
        let mut q = Qp::new(RcConfig::default());
        let buf = q.region(0, 64, LOCAL);
        q.post_recv(10, buf, 0, 64);
        q.feed_seg(&bad, &b"xyz"[..len]);
        let t = only_terminate(&q.transmitted());
        assert_cause(&t, TerminateCause::DdpUntaggedInvalidQn, (1, 2, 0x01));
        assert_echoes(&t, &bad, len as u16);
        assert_eq!(
            q.completions(),
            vec![(
                CqKind::Recv,
                wc(10, WcStatus::WrFlushErr, WcOpcode::Recv, 0)
            )],
            "{name}"
        );
        assert_failed_locally(&mut q, TerminateCause::DdpUntaggedInvalidQn);
    }
}

/// RFC 5041 §7.2 (and `docs/wire.md` §7.3): a Send that finds no posted
/// receive is "invalid MSN, no buffer available", code 0x02. iWARP has no
/// receiver-not-ready retry: the stream is terminated.
#[test]
fn rfc5041_send_without_posted_receive_is_ddp_untagged_0x02() {
    let mut q = Qp::new(RcConfig::default());
    let bad = send_seg(1, 0, true);
    q.feed_seg(&bad, b"hello");
    let t = only_terminate(&q.transmitted());
    assert_cause(&t, TerminateCause::DdpUntaggedNoBuffer, (1, 2, 0x02));
    assert_echoes(&t, &bad, 5);
    assert!(q.completions().is_empty());
    assert_failed_locally(&mut q, TerminateCause::DdpUntaggedNoBuffer);
}

/// RFC 5041 §7.2: a message longer than the receive it landed in is
/// "message too long", code 0x05; that receive completes with a local
/// length error, nothing beyond the buffer is written, and later receives
/// are flushed.
#[test]
fn rfc5041_message_longer_than_receive_is_0x05_and_loc_len_err() {
    let mut q = Qp::new(RcConfig::default());
    let buf = q.region(0, 64, LOCAL);
    q.post_recv(10, buf, 0, 8);
    q.post_recv(11, buf, 32, 32);
    q.feed_seg(&send_seg(1, 0, false), b"012345");
    let bad = send_seg(1, 6, true);
    q.feed_seg(&bad, b"6789AB"); // 12 octets > 8
    let t = only_terminate(&q.transmitted());
    assert_cause(&t, TerminateCause::DdpUntaggedTooLong, (1, 2, 0x05));
    assert_echoes(&t, &bad, 6);
    assert_eq!(
        q.completions(),
        vec![
            (CqKind::Recv, wc(10, WcStatus::LocLenErr, WcOpcode::Recv, 0)),
            (
                CqKind::Recv,
                wc(11, WcStatus::WrFlushErr, WcOpcode::Recv, 0)
            ),
        ]
    );
    assert_eq!(&q.mem.bytes(buf)[..6], b"012345");
    assert!(q.mem.bytes(buf)[6..].iter().all(|&b| b == 0));
    assert_failed_locally(&mut q, TerminateCause::DdpUntaggedTooLong);
}

/// RFC 5041 §5.1 / §4.2 (and `docs/wire.md` §7.3): the segments of one
/// tagged message keep its STag, and each segment's TO is the previous TO
/// plus the previous payload. A continuation with another STag or a TO gap
/// is a DDP tagged-buffer error (the engine reports base/bounds, 0x01),
/// and nothing of that segment is placed.
#[test]
fn rfc5041_tagged_continuation_keeps_stag_and_contiguous_to() {
    // Contiguous: accepted and placed, nothing sent back.
    let mut q = Qp::new(RcConfig::default());
    let w = q.region(0x1000, 32, ALL);
    q.feed_seg(
        &SegmentRepr::tagged(Opcode::RdmaWrite, w, 0x1000, false),
        b"AAAAaaaa",
    );
    q.feed_seg(
        &SegmentRepr::tagged(Opcode::RdmaWrite, w, 0x1008, true),
        b"BBBBbbbb",
    );
    assert_eq!(&q.mem.bytes(w)[..16], b"AAAAaaaaBBBBbbbb");
    assert!(q.wire().is_empty());
    assert!(q.completions().is_empty() && q.events().is_empty());

    for (name, second_other_stag, second_to) in [
        ("TO gap", false, 0x1010u64),
        ("TO going back", false, 0x1004),
        ("other STag", true, 0x2000),
    ] {
        let mut q = Qp::new(RcConfig::default());
        let w = q.region(0x1000, 32, ALL);
        let w2 = q.region(0x2000, 32, ALL);
        q.feed_seg(
            &SegmentRepr::tagged(Opcode::RdmaWrite, w, 0x1000, false),
            b"AAAAaaaa",
        );
        let stag = if second_other_stag { w2 } else { w };
        let bad = SegmentRepr::tagged(Opcode::RdmaWrite, stag, second_to, true);
        q.feed_seg(&bad, b"BBBBbbbb");
        let t = only_terminate(&q.transmitted());
        assert_cause(&t, TerminateCause::DdpTaggedBaseBounds, (1, 1, 0x01));
        assert_echoes(&t, &bad, 8);
        assert_eq!(&q.mem.bytes(w)[..8], b"AAAAaaaa", "{name}");
        assert!(q.mem.bytes(w)[8..].iter().all(|&b| b == 0), "{name}");
        assert!(q.mem.bytes(w2).iter().all(|&b| b == 0), "{name}");
        assert_failed_locally(&mut q, TerminateCause::DdpTaggedBaseBounds);
    }
}

// ----------------------------------------------------------------------
// RFC 5040 (RDMAP)
// ----------------------------------------------------------------------

/// RFC 5040 §5.2 (and `docs/wire.md` §9 item 7): a Read Request is
/// answered by a Read Response message addressed to the request's Data
/// Sink STag and TO, carrying exactly the requested number of octets from
/// the Data Source; it is split into segments of at most `max_ulpdu`, with
/// contiguous TOs and L only on the last. The responder completes nothing.
#[test]
fn rfc5040_read_request_answered_to_sink_with_exact_length() {
    let mut q = Qp::new(small_fpdus());
    let src = q.region(0x5000, 200, Access::REMOTE_READ);
    q.mem.bytes_mut(src).copy_from_slice(&pattern(200, 3));
    let req = ReadRequest {
        sink_stag: 0xAABB_CC01,
        sink_to: 0x9000_0000_0000,
        size: 120,
        src_stag: src,
        src_to: 0x5000 + 10,
    };
    q.feed_seg(&read_request(1, req), &[]);
    let segs = q.transmitted();
    let got: Vec<(Opcode, bool, DdpHeader, usize)> = segs
        .iter()
        .map(|(r, p)| (r.opcode, r.last, r.ddp, p.len()))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                Opcode::ReadResponse,
                false,
                tagged_hdr(0xAABB_CC01, 0x9000_0000_0000),
                50
            ),
            (
                Opcode::ReadResponse,
                false,
                tagged_hdr(0xAABB_CC01, 0x9000_0000_0000 + 50),
                50
            ),
            (
                Opcode::ReadResponse,
                true,
                tagged_hdr(0xAABB_CC01, 0x9000_0000_0000 + 100),
                20
            ),
        ]
    );
    let data: Vec<u8> = segs.iter().flat_map(|(_, p)| p.clone()).collect();
    assert_eq!(data, &pattern(200, 3)[10..130]);
    assert!(q.completions().is_empty());
    assert!(q.events().is_empty());
    assert_eq!(q.qp.state(), RcState::Rts);
}

/// RFC 5040 §5.2 (and `docs/wire.md` §8.3): a zero-length Read Request is
/// legal and is answered by exactly one zero-length Read Response (L set)
/// to the sink STag/TO; no memory is touched, so the source STag is not
/// looked up (siw's RTR uses source STag 1).
#[test]
fn rfc5040_zero_length_read_gets_one_zero_length_response() {
    let mut q = Qp::new(RcConfig::default());
    q.feed_seg(
        &read_request(
            1,
            ReadRequest {
                sink_stag: 0x1234_5601,
                sink_to: 0x42,
                size: 0,
                src_stag: 1,
                src_to: 0,
            },
        ),
        &[],
    );
    let segs = q.transmitted();
    assert_eq!(
        segs,
        vec![(
            SegmentRepr::tagged(Opcode::ReadResponse, 0x1234_5601, 0x42, true),
            vec![]
        )]
    );
    assert!(q.completions().is_empty() && q.events().is_empty());
}

/// RFC 5040 §5.2 with the IRD of RFC 6581 (`docs/wire.md` §3, §8.3): a
/// Read Request that arrives while IRD requests are already outstanding is
/// a Terminate, RDMAP layer, remote operation error (siw: 0x07,
/// catastrophic local to the stream), carrying the Read Request's DDP header (D, M) and its RDMAP
/// header (R bit). Nothing else is sent: the stream ends there.
#[test]
fn rfc5040_read_request_beyond_ird_is_rdmap_remote_operation_terminate() {
    let mut q = Qp::new(RcConfig {
        ird: 1,
        ..RcConfig::default()
    });
    let src = q.region(0x5000, 64, Access::REMOTE_READ);
    let req = |sink_to: u64| ReadRequest {
        sink_stag: 0x99,
        sink_to,
        size: 8,
        src_stag: src,
        src_to: 0x5000,
    };
    // Two Reads arrive before the QP could answer the first: IRD = 1.
    let mut bytes = q.fpdu(&read_request(1, req(0)), &[]);
    let second = read_request(2, req(0x100));
    bytes.extend(q.fpdu(&second, &[]));
    q.feed(&bytes);

    let t = only_terminate(&q.transmitted());
    assert_cause(&t, TerminateCause::RdmapCatastrophicStream, (0, 2, 0x07));
    assert_eq!(mdr(&t), TERM_M | TERM_D | TERM_R);
    assert_eq!(t.segment_len, Some(0));
    assert_eq!(t.ddp_header.unwrap().as_bytes(), &ddp_octets(&second)[..]);
    assert_eq!(t.rdmap_header, Some(req(0x100).to_bytes()));
    assert_failed_locally(&mut q, TerminateCause::RdmapCatastrophicStream);
}

/// RFC 5040 §5.2 / §7 (remote protection errors): a Read Request whose
/// source STag/TO/length the responder may not read is a Terminate, RDMAP
/// layer, remote protection error, with the Read Request's DDP header (D,
/// M) and RDMAP header (R) attached: 0x02 without REMOTE_READ, 0x01 outside
/// the region, 0x00 for an unknown STag. Nothing is read or sent.
#[test]
fn rfc5040_read_request_without_remote_read_is_access_rights_terminate() {
    for (name, access, to, stag_fix, cause, raw) in [
        (
            "no REMOTE_READ",
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            0x5000u64,
            0u32,
            TerminateCause::RdmapAccessRights,
            (0, 1, 0x02),
        ),
        (
            "beyond the region",
            Access::REMOTE_READ,
            0x5000 + 60,
            0,
            TerminateCause::RdmapBaseBounds,
            (0, 1, 0x01),
        ),
        (
            "wrong STag key",
            Access::REMOTE_READ,
            0x5000,
            0x80,
            TerminateCause::RdmapInvalidStag,
            (0, 1, 0x00),
        ),
    ] {
        let mut q = Qp::new(RcConfig::default());
        let src = q.region(0x5000, 64, access);
        let req = ReadRequest {
            sink_stag: 0x99,
            sink_to: 0,
            size: 8,
            src_stag: src ^ stag_fix,
            src_to: to,
        };
        let bad = read_request(1, req);
        q.feed_seg(&bad, &[]);
        let t = only_terminate(&q.transmitted());
        assert_cause(&t, cause, raw);
        assert_eq!(mdr(&t), TERM_M | TERM_D | TERM_R, "{name}");
        assert_eq!(t.segment_len, Some(0));
        assert_eq!(t.ddp_header.unwrap().as_bytes(), &ddp_octets(&bad)[..]);
        assert_eq!(t.rdmap_header, Some(req.to_bytes()), "{name}");
        assert!(q.completions().is_empty());
        assert_failed_locally(&mut q, cause);
    }
}

/// RFC 5040 §5.2 (and `docs/wire.md` §9 item 7), requester side: the
/// Read Response must go to the sink STag/TO of the outstanding request and
/// carry exactly its length. Another STag is "STag not associated" (DDP
/// tagged 0x02), more octets than requested a base/bounds error (0x01); the
/// Read fails and nothing is placed outside the request.
#[test]
fn rfc5040_read_response_must_match_the_request() {
    for (name, stag_fix, to_off, len, cause, raw) in [
        (
            "other STag",
            0x80u32,
            0u64,
            16usize,
            TerminateCause::DdpTaggedStagNotAssociated,
            (1, 1, 0x02),
        ),
        (
            "other TO",
            0,
            8,
            8,
            TerminateCause::DdpTaggedStagNotAssociated,
            (1, 1, 0x02),
        ),
        (
            "too long",
            0,
            0,
            20,
            TerminateCause::DdpTaggedBaseBounds,
            (1, 1, 0x01),
        ),
    ] {
        let mut q = Qp::new(RcConfig::default());
        let sink = q.region(0x8000, 64, LOCAL);
        q.post_send(read_wr(1, sink, 0x8000, 16, 0x4401, 0));
        assert_eq!(q.transmitted().len(), 1);
        let bad = SegmentRepr::tagged(Opcode::ReadResponse, sink ^ stag_fix, 0x8000 + to_off, true);
        q.feed_seg(&bad, &pattern(len, 5));
        let t = only_terminate(&q.transmitted());
        assert_cause(&t, cause, raw);
        assert_echoes(&t, &bad, len as u16);
        assert_eq!(
            q.completions(),
            vec![(
                CqKind::Send,
                wc(1, WcStatus::RemOpErr, WcOpcode::RdmaRead, 0)
            )],
            "{name}"
        );
        assert!(q.mem.bytes(sink).iter().all(|&b| b == 0), "{name}");
        assert_failed_locally(&mut q, cause);
    }
}

/// RFC 5040 §5.3 (Send with Invalidate): the receiver invalidates the STag
/// named in the header (RsvdULP, `docs/wire.md` §7.3) before it reports
/// the receive, and reports that STag in the completion; the STag is unusable
/// for the peer afterwards (a Write to it is a DDP invalid-STag Terminate).
#[test]
fn rfc5040_send_with_invalidate_invalidates_named_stag() {
    let mut q = Qp::new(RcConfig::default());
    let buf = q.region(0, 64, LOCAL);
    let mr = q.region(0x7000, 64, ALL);
    q.post_recv(10, buf, 0, 64);
    let mut inv = SegmentRepr::untagged(Opcode::SendInvalidate, 0, 1, 0, true, RdmapBody::None);
    if let DdpHeader::Untagged { rsvd_ulp, .. } = &mut inv.ddp {
        *rsvd_ulp = mr;
    }
    q.feed_seg(&inv, b"bye");
    let mut expect = wc(10, WcStatus::Success, WcOpcode::Recv, 3);
    expect.invalidated = Some(mr);
    assert_eq!(q.completions(), vec![(CqKind::Recv, expect)]);
    assert!(!q.mem.is_valid(mr));
    assert!(q.wire().is_empty());

    let bad = SegmentRepr::tagged(Opcode::RdmaWrite, mr, 0x7000, true);
    q.feed_seg(&bad, b"late");
    let t = only_terminate(&q.transmitted());
    assert_cause(&t, TerminateCause::DdpTaggedInvalidStag, (1, 1, 0x00));
    assert!(q.mem.bytes(mr).iter().all(|&b| b == 0));
}

/// RFC 5040 §4 (opcodes) and §7 (and `docs/wire.md` §8.2): an RDMAP opcode
/// the receiver does not implement (0xC–0xF in stream mode) is a Terminate,
/// RDMAP layer, remote operation error, 0x06 "unexpected opcode", echoing
/// the segment's DDP header. The segment consumes no receive.
#[test]
fn rfc5040_unknown_opcode_is_rdmap_unexpected_opcode_0x06() {
    for op in 0xCu8..=0xF {
        let mut q = Qp::new(RcConfig::default());
        let buf = q.region(0, 64, LOCAL);
        q.post_recv(10, buf, 0, 64);
        let bad = SegmentRepr::untagged(Opcode::from(op), 0, 1, 0, true, RdmapBody::None);
        q.feed_seg(&bad, b"??");
        let t = only_terminate(&q.transmitted());
        assert_cause(&t, TerminateCause::RdmapUnexpectedOpcode, (0, 2, 0x06));
        assert_echoes(&t, &bad, 2);
        assert_eq!(
            q.completions(),
            vec![(
                CqKind::Recv,
                wc(10, WcStatus::WrFlushErr, WcOpcode::Recv, 0)
            )],
            "opcode {op:#x}"
        );
        assert!(q.mem.bytes(buf).iter().all(|&b| b == 0));
        assert_failed_locally(&mut q, TerminateCause::RdmapUnexpectedOpcode);
    }
}

/// RFC 7306 with `docs/wire.md` §8.2 and §9 item 9: the RFC 7306 opcodes
/// (Immediate Data 0x8/0x9, Atomic Request 0xA, Atomic Response 0xB) are
/// only spoken between softrdma peers; toward a QP configured with
/// `softrdma_ext: false` they are unexpected opcodes (RDMAP 0x06), exactly
/// as siw answers them, and nothing they ask for is done.
#[test]
fn rfc7306_opcodes_without_softrdma_ext_are_unexpected_opcodes() {
    let ext_off = RcConfig {
        softrdma_ext: false,
        ..RcConfig::default()
    };
    // Each message, aimed (where it names memory) at the STag `target`.
    let message = |name: &str, target: u32| -> SegmentRepr {
        let body = match name {
            "Immediate Data" | "Immediate Data with SE" => RdmapBody::Immediate(7),
            "Atomic Request" => RdmapBody::AtomicRequest(AtomicRequest {
                op: AtomicOp::FetchAdd,
                req_id: 1,
                stag: target,
                to: 0x6000,
                add_swap: 5,
                add_swap_mask: 0,
                compare: 0,
                compare_mask: 0,
            }),
            _ => RdmapBody::AtomicResponse(AtomicResponse {
                req_id: 1,
                orig_value: 9,
            }),
        };
        let (opcode, qn) = match name {
            "Immediate Data" => (Opcode::ImmediateData, 0),
            "Immediate Data with SE" => (Opcode::ImmediateDataSe, 0),
            "Atomic Request" => (Opcode::AtomicRequest, 1),
            _ => (Opcode::AtomicResponse, 3),
        };
        SegmentRepr::untagged(opcode, qn, 1, 0, true, body)
    };
    for name in [
        "Immediate Data",
        "Immediate Data with SE",
        "Atomic Request",
        "Atomic Response",
    ] {
        let mut q = Qp::new(ext_off);
        let buf = q.region(0, 64, LOCAL);
        let target = q.region(0x6000, 8, ALL);
        q.post_recv(10, buf, 0, 64);
        let bad = message(name, target);
        q.feed_seg(&bad, &[]);
        let t = only_terminate(&q.transmitted());
        assert_cause(&t, TerminateCause::RdmapUnexpectedOpcode, (0, 2, 0x06));
        assert_echoes(&t, &bad, 0);
        assert_eq!(
            q.completions(),
            vec![(
                CqKind::Recv,
                wc(10, WcStatus::WrFlushErr, WcOpcode::Recv, 0)
            )],
            "{name}"
        );
        assert_eq!(q.mem.bytes(target), &[0u8; 8], "{name}: no atomic ran");
        assert_failed_locally(&mut q, TerminateCause::RdmapUnexpectedOpcode);
    }
}

/// RFC 5040 §5.4 / §6.2.2 (abortive termination): a received Terminate ends
/// the stream. The QP enters the error state, reports the peer's cause, the
/// oldest outstanding work request fails with the status the cause maps to
/// and every other send and receive is flushed; the QP sends nothing more —
/// in particular no Terminate back — and later posts flush at once.
#[test]
fn rfc5040_received_terminate_errors_flushes_and_sends_nothing() {
    let mut q = Qp::new(RcConfig::default());
    let buf = q.region(0, 64, LOCAL);
    let src = q.region(0x1000, 64, LOCAL);
    q.post_send(read_wr(1, buf, 0, 16, 0x3301, 0x40));
    q.post_send(send_wr(2, src, 0x1000, 8));
    let out = q.transmitted();
    assert_eq!(out.len(), 2, "Read Request and Send went out");
    q.post_send(send_wr(3, src, 0x1000, 8)); // posted, not yet transmitted
    q.post_recv(10, buf, 32, 32);

    // The peer refuses our Read: remote protection, access rights, with the
    // R-bit echo of our Read Request.
    let (rr, _) = &out[0];
    let RdmapBody::ReadRequest(req) = rr.body else {
        panic!("first FPDU is the Read Request");
    };
    let mut term = TerminateRepr::new(TerminateCause::RdmapAccessRights);
    term.segment_len = Some(0);
    term.ddp_header =
        Some(softrdma_wire::rdmap::EchoedHeader::from_segment(&ddp_octets(rr)).expect("18 octets"));
    term.rdmap_header = Some(req.to_bytes());
    q.feed_seg(
        &SegmentRepr::untagged(Opcode::Terminate, 2, 1, 0, true, RdmapBody::Terminate(term)),
        &[],
    );

    assert_eq!(q.qp.state(), RcState::Error);
    assert_eq!(
        q.events(),
        vec![
            RcEvent::Error {
                cause: Some(TerminateCause::RdmapAccessRights),
                remote: true
            },
            RcEvent::TxClosed
        ]
    );
    let all = q.completions();
    assert_eq!(
        of(CqKind::Send, &all),
        vec![
            wc(1, WcStatus::RemAccessErr, WcOpcode::RdmaRead, 0),
            wc(2, WcStatus::WrFlushErr, WcOpcode::Send, 0),
            wc(3, WcStatus::WrFlushErr, WcOpcode::Send, 0),
        ]
    );
    assert_eq!(
        of(CqKind::Recv, &all),
        vec![wc(10, WcStatus::WrFlushErr, WcOpcode::Recv, 0)]
    );
    assert!(!q.qp.wants_transmit());
    assert!(q.wire().is_empty(), "no Terminate back, nothing at all");

    // Later work flushes at once and still nothing is sent; input is ignored.
    q.post_send(send_wr(4, src, 0x1000, 8));
    q.post_recv(11, buf, 0, 8);
    q.feed_seg(&send_seg(1, 0, true), b"ignored");
    assert_eq!(
        q.completions(),
        vec![
            (CqKind::Send, wc(4, WcStatus::WrFlushErr, WcOpcode::Send, 0)),
            (
                CqKind::Recv,
                wc(11, WcStatus::WrFlushErr, WcOpcode::Recv, 0)
            ),
        ]
    );
    assert!(q.wire().is_empty());
    assert!(q.events().is_empty());
    assert!(q.mem.bytes(buf).iter().all(|&b| b == 0));
}

// ----------------------------------------------------------------------
// RFC 5044 (MPA)
// ----------------------------------------------------------------------

/// RFC 5044 §4 (CRC field) / §8 (errors): with CRC negotiated, an FPDU
/// whose CRC does not match is a Terminate, LLP layer, MPA error 0x02 (CRC
/// error), with nothing attached, and the stream ends.
///
/// What the engine guarantees (verify, then place): an FPDU that arrives in
/// pieces is kept until it is complete and its CRC checked before any of
/// it — header or payload — is acted on, so nothing of the corrupted FPDU
/// is placed; nothing more is placed or processed after it — neither the
/// octets handed in behind it nor later FPDUs — and no work request built
/// on that FPDU completes successfully (a receive it would have taken
/// completes with a remote operation error). Without a negotiated CRC
/// there is nothing to verify and payload is placed as it arrives.
#[test]
fn rfc5044_crc_error_is_llp_terminate_0x02() {
    // A Write whose payload octet 10 is corrupted, followed by a valid Send.
    let mut q = Qp::new(RcConfig::default());
    let w = q.region(0x1000, 32, ALL);
    let buf = q.region(0, 64, LOCAL);
    q.post_recv(10, buf, 0, 64);
    let data: Vec<u8> = (1..=16).collect();
    let mut bytes = q.fpdu(
        &SegmentRepr::tagged(Opcode::RdmaWrite, w, 0x1000, true),
        &data,
    );
    let hdr = LEN_FIELD + 14;
    bytes[hdr + 10] ^= 0x40;
    bytes.extend(q.fpdu(&send_seg(1, 0, true), b"behind"));

    // Header + 8 payload octets: kept until the FPDU is complete.
    q.feed(&bytes[..hdr + 8]);
    assert!(q.mem.bytes(w).iter().all(|&b| b == 0), "nothing placed yet");
    assert_eq!(q.qp.state(), RcState::Rts);
    assert!(q.events().is_empty());
    // The rest: the corrupted octet, the CRC, then the Send.
    q.feed(&bytes[hdr + 8..]);
    let t = only_terminate(&q.transmitted());
    assert_cause(&t, TerminateCause::MpaCrcError, (2, 0, 0x02));
    assert_eq!(mdr(&t), 0, "nothing attached to an LLP error");
    assert!(
        q.mem.bytes(w).iter().all(|&b| b == 0),
        "nothing of the corrupted FPDU placed"
    );
    assert!(
        q.mem.bytes(buf).iter().all(|&b| b == 0),
        "the Send behind is not processed"
    );
    assert_eq!(
        q.completions(),
        vec![(
            CqKind::Recv,
            wc(10, WcStatus::WrFlushErr, WcOpcode::Recv, 0)
        )]
    );
    assert_failed_locally(&mut q, TerminateCause::MpaCrcError);

    // A Send whose payload is corrupted: its receive fails, never succeeds.
    let mut q = Qp::new(RcConfig::default());
    let buf = q.region(0, 64, LOCAL);
    q.post_recv(10, buf, 0, 64);
    q.post_recv(11, buf, 0, 64);
    let mut bytes = q.fpdu(&send_seg(1, 0, true), b"corrupt me");
    bytes[LEN_FIELD + 18 + 3] ^= 0x01;
    // In two pieces: the receive is taken only once the FPDU is complete.
    q.feed(&bytes[..LEN_FIELD + 18 + 5]);
    assert!(q.completions().is_empty());
    q.feed(&bytes[LEN_FIELD + 18 + 5..]);
    let t = only_terminate(&q.transmitted());
    assert_cause(&t, TerminateCause::MpaCrcError, (2, 0, 0x02));
    assert_eq!(
        q.completions(),
        vec![
            (CqKind::Recv, wc(10, WcStatus::RemOpErr, WcOpcode::Recv, 0)),
            (
                CqKind::Recv,
                wc(11, WcStatus::WrFlushErr, WcOpcode::Recv, 0)
            ),
        ]
    );
    assert_failed_locally(&mut q, TerminateCause::MpaCrcError);
}

/// RFC 5044 §4 / §8: the CRC covers the whole FPDU, header included, so a
/// corrupted header octet is a CRC error too (LLP 0x02), not whatever the
/// corrupted field happens to mean: here a Send's MSN octet is flipped
/// (1 -> 3), which must not be reported as a DDP MSN error.
#[test]
fn rfc5044_crc_error_in_header_is_still_a_crc_error() {
    let mut q = Qp::new(RcConfig::default());
    let buf = q.region(0, 64, LOCAL);
    q.post_recv(10, buf, 0, 64);
    let mut bytes = q.fpdu(&send_seg(1, 0, true), b"hello");
    bytes[LEN_FIELD + 13] ^= 0x02; // ULPDU octet 13: low octet of the MSN
    q.feed(&bytes);
    let t = only_terminate(&q.transmitted());
    assert_cause(&t, TerminateCause::MpaCrcError, (2, 0, 0x02));
    assert_eq!(mdr(&t), 0);
    assert_failed_locally(&mut q, TerminateCause::MpaCrcError);
}

/// RFC 5044 §4 / §8 with RFC 5041 §3 (DDP relies on the LLP to catch
/// corrupted segments): payload must not be placed through a header whose
/// CRC has not been verified. A Write to TO 0x1000 whose TO octet is corrupted to
/// 0x1010 (still inside the region) must place nothing at 0x1010 — whole,
/// and split at every point (a partial FPDU is kept until complete).
#[test]
fn rfc5044_corrupted_header_places_nothing() {
    let mut probe = Qp::new(RcConfig::default());
    let w = probe.region(0x1000, 64, ALL);
    let mut bytes = probe.fpdu(
        &SegmentRepr::tagged(Opcode::RdmaWrite, w, 0x1000, true),
        b"ABCDEFGH",
    );
    bytes[LEN_FIELD + 13] ^= 0x10; // ULPDU octet 13: low octet of the TO
    for cut in 0..bytes.len() {
        let mut q = Qp::new(RcConfig::default());
        let w = q.region(0x1000, 64, ALL);
        q.feed(&bytes[..cut]);
        assert!(q.transmitted().is_empty(), "cut {cut}: nothing yet");
        q.feed(&bytes[cut..]);
        let t = only_terminate(&q.transmitted());
        assert_cause(&t, TerminateCause::MpaCrcError, (2, 0, 0x02));
        assert!(
            q.mem.bytes(w).iter().all(|&b| b == 0),
            "cut {cut}: nothing placed through an unverified header"
        );
    }
}

/// RFC 5044 §4 (CRC field) and `docs/wire.md` §4 / §9 item 2: without a
/// negotiated CRC the 4-octet field is still present; the sender fills it
/// with zeros and the receiver ignores whatever it holds.
#[test]
fn rfc5044_without_crc_field_is_zero_on_send_and_ignored_on_receive() {
    let mut q = Qp::new(RcConfig {
        crc: false,
        ..RcConfig::default()
    });
    let buf = q.region(0, 64, LOCAL);
    q.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Inline(InlineData::new(b"abcde").unwrap()),
        flags: signaled(),
    });
    let w = q.wire();
    // 2 + 18 + 5 + pad 3 + CRC 4.
    assert_eq!(w.len(), fpdu::fpdu_len(18 + 5));
    assert_eq!(&w[w.len() - 4..], &[0, 0, 0, 0]);
    assert_eq!(&w[w.len() - 7..w.len() - 4], &[0, 0, 0], "pad is zero");
    assert_eq!(
        decode(false, &w),
        vec![(send_seg(1, 0, true), b"abcde".to_vec())]
    );

    // Received: a garbage CRC field, then a real CRC value; both ignored.
    q.post_recv(10, buf, 0, 32);
    q.post_recv(11, buf, 32, 32);
    let mut a = frame(false, &send_seg(1, 0, true), b"first");
    let n = a.len();
    a[n - 4..].copy_from_slice(&[0xDE, 0xAD, 0xBE, 0xEF]);
    q.feed(&a);
    q.feed(&frame(true, &send_seg(2, 0, true), b"second"));
    let all = q.completions();
    assert_eq!(
        of(CqKind::Recv, &all),
        vec![
            wc(10, WcStatus::Success, WcOpcode::Recv, 5),
            wc(11, WcStatus::Success, WcOpcode::Recv, 6),
        ]
    );
    assert_eq!(&q.mem.bytes(buf)[..5], b"first");
    assert_eq!(&q.mem.bytes(buf)[32..38], b"second");
    assert!(q.wire().is_empty());
    assert!(q.events().is_empty());
}

// ----------------------------------------------------------------------
// RFC 6581 (peer-to-peer RTR)
// ----------------------------------------------------------------------

/// RFC 6581 peer-to-peer mode (`docs/wire.md` §3): the P2P responder sends
/// nothing until the initiator's agreed RTR message (here a zero-length RDMA
/// Write to STag 1, TO 0) has arrived, even with work posted; the RTR itself
/// is absorbed (no placement, no completion, no MSN used) and then data
/// flows.
#[test]
fn rfc6581_responder_sends_nothing_before_rtr() {
    let mut q = Qp::new(RcConfig {
        rtr: RtrRole::Await(Some(RtrKind::Write)),
        ..RcConfig::default()
    });
    let src = q.region(0x1000, 64, LOCAL);
    let buf = q.region(0, 64, LOCAL);
    q.mem.bytes_mut(src)[..4].copy_from_slice(b"ping");
    q.post_send(send_wr(1, src, 0x1000, 4));
    q.post_recv(10, buf, 0, 64);
    assert_eq!(q.qp.state(), RcState::AwaitingRtr);
    assert!(!q.qp.wants_transmit());
    assert!(q.wire().is_empty());

    q.feed_seg(&SegmentRepr::tagged(Opcode::RdmaWrite, 1, 0, true), &[]);
    assert_eq!(q.qp.state(), RcState::Rts);
    assert!(q.completions().is_empty() && q.events().is_empty());
    assert_eq!(
        q.transmitted(),
        vec![(send_seg(1, 0, true), b"ping".to_vec())]
    );
    assert_eq!(
        q.completions(),
        vec![(CqKind::Send, wc(1, WcStatus::Success, WcOpcode::Send, 4))]
    );
    // The peer's first Send is still MSN 1.
    q.feed_seg(&send_seg(1, 0, true), b"pong");
    assert_eq!(
        q.completions(),
        vec![(CqKind::Recv, wc(10, WcStatus::Success, WcOpcode::Recv, 4))]
    );
    assert!(q.events().is_empty());
}

/// RFC 6581 peer-to-peer mode (`docs/wire.md` §3): the P2P initiator with
/// the Read RTR sends a zero-length Read Request (QN 1, MSN 1, sink STag 0,
/// source STag 1) before anything else, then its posted work. The
/// zero-length Read Response that answers it is absorbed without completing
/// anything, and the RTR used up MSN 1 of queue 1 (the first real Read is
/// MSN 2).
#[test]
fn rfc6581_initiator_sends_zero_length_read_first_and_absorbs_response() {
    let mut q = Qp::new(RcConfig {
        rtr: RtrRole::Send(RtrKind::Read),
        ..RcConfig::default()
    });
    let src = q.region(0x1000, 64, LOCAL);
    let sink = q.region(0x8000, 64, LOCAL);
    q.mem.bytes_mut(src)[..4].copy_from_slice(b"data");
    q.post_send(send_wr(1, src, 0x1000, 4));
    assert_eq!(
        q.transmitted(),
        vec![
            (
                read_request(
                    1,
                    ReadRequest {
                        sink_stag: 0,
                        sink_to: 0,
                        size: 0,
                        src_stag: 1,
                        src_to: 0,
                    }
                ),
                vec![]
            ),
            (send_seg(1, 0, true), b"data".to_vec()),
        ]
    );
    assert_eq!(
        q.completions(),
        vec![(CqKind::Send, wc(1, WcStatus::Success, WcOpcode::Send, 4))]
    );

    q.feed_seg(&SegmentRepr::tagged(Opcode::ReadResponse, 0, 0, true), &[]);
    assert!(q.completions().is_empty() && q.events().is_empty());
    assert!(q.wire().is_empty());
    assert_eq!(q.qp.state(), RcState::Rts);

    q.post_send(read_wr(2, sink, 0x8000, 4, 0x5501, 0x10));
    let segs = q.transmitted();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].0.ddp, untagged_hdr(1, 2, 0), "RTR took MSN 1");
    q.feed_seg(
        &SegmentRepr::tagged(Opcode::ReadResponse, sink, 0x8000, true),
        b"READ",
    );
    assert_eq!(
        q.completions(),
        vec![(
            CqKind::Send,
            wc(2, WcStatus::Success, WcOpcode::RdmaRead, 4)
        )]
    );
    assert_eq!(&q.mem.bytes(sink)[..4], b"READ");
}

/// RFC 6581 peer-to-peer mode and its LLP error codes (`docs/wire.md` §3,
/// §8.5): if the responder's first FPDU is not the RTR agreed in the MPA
/// exchange, it answers with a Terminate, LLP layer, MPA error 0x07 "no
/// matching RTR option"; none of its posted work is ever sent (the posted
/// Send fails, the receive is flushed).
#[test]
fn rfc6581_first_fpdu_not_the_agreed_rtr_is_llp_0x07() {
    let cases: [(&str, SegmentRepr, &[u8]); 3] = [
        ("a Send", send_seg(1, 0, true), b"hi"),
        (
            "a zero-length Read Request",
            read_request(
                1,
                ReadRequest {
                    sink_stag: 0,
                    sink_to: 0,
                    size: 0,
                    src_stag: 1,
                    src_to: 0,
                },
            ),
            b"",
        ),
        (
            "a non-empty Write",
            SegmentRepr::tagged(Opcode::RdmaWrite, 1, 0, true),
            b"data",
        ),
    ];
    for (name, first, payload) in cases {
        let mut q = Qp::new(RcConfig {
            rtr: RtrRole::Await(Some(RtrKind::Write)),
            ..RcConfig::default()
        });
        let src = q.region(0x1000, 64, LOCAL);
        let buf = q.region(0, 64, ALL);
        q.post_send(send_wr(1, src, 0x1000, 4));
        q.post_recv(10, buf, 0, 64);
        q.feed_seg(&first, payload);
        let t = only_terminate(&q.transmitted());
        assert_cause(&t, TerminateCause::MpaNoMatchingRtr, (2, 0, 0x07));
        let all = q.completions();
        // The never-sent Send fails (the engine gives the oldest outstanding
        // send work request a remote-operation status, the rest flush).
        let sends = of(CqKind::Send, &all);
        assert_eq!(sends.len(), 1, "{name}");
        assert_eq!((sends[0].wr_id, sends[0].opcode), (1, WcOpcode::Send));
        assert_ne!(sends[0].status, WcStatus::Success, "{name}");
        assert_eq!(
            of(CqKind::Recv, &all),
            vec![wc(10, WcStatus::WrFlushErr, WcOpcode::Recv, 0)],
            "{name}"
        );
        assert!(q.mem.bytes(buf).iter().all(|&b| b == 0), "{name}");
        assert_failed_locally(&mut q, TerminateCause::MpaNoMatchingRtr);
    }
}

// ----------------------------------------------------------------------
// Ordering (docs/wire.md §7.3, RFC 5040 §5.5)
// ----------------------------------------------------------------------

/// Sends a long message from the send queue while a Read Request arrives
/// after its first FPDU went out; returns the whole transmitted sequence.
fn long_message_with_read_arriving_midway(op: fn(u32, u32) -> SendWr, len: u32) -> Vec<Seg> {
    let mut q = Qp::new(small_fpdus());
    let src = q.region(0x1_0000, len as usize, LOCAL);
    q.mem
        .bytes_mut(src)
        .copy_from_slice(&pattern(len as usize, 7));
    let rsrc = q.region(0x5000, 16, Access::REMOTE_READ);
    q.post_send(op(src, len));
    // The socket takes one full-size FPDU, then would block.
    let mut sock = Budget {
        out: Vec::new(),
        room: fpdu::fpdu_len(64),
    };
    q.qp.poll_transmit(&mut q.mem, &mut sock).unwrap();
    q.feed_seg(
        &read_request(
            1,
            ReadRequest {
                sink_stag: 0x77,
                sink_to: 0,
                size: 16,
                src_stag: rsrc,
                src_to: 0x5000,
            },
        ),
        &[],
    );
    sock.room = usize::MAX;
    q.qp.poll_transmit(&mut q.mem, &mut sock).unwrap();
    assert!(!q.qp.wants_transmit());
    decode(true, &sock.out)
}

/// `docs/wire.md` §7.3 / §9 item 6 (RFC 5040 §5.5): a message is finished
/// before the transmitter starts another; while a multi-FPDU Send is being
/// sent, an inbound Read Request is answered only after the Send's last
/// segment. (siw tolerates one tagged message inside one untagged message,
/// but the engine documents — and relies on — switching between the send
/// queue and Read Responses only at message boundaries.)
#[test]
fn ordering_read_response_waits_for_end_of_multi_fpdu_send() {
    const SEGS: u32 = 40;
    let segs = long_message_with_read_arriving_midway(
        |src, len| send_wr(1, src, 0x1_0000, len),
        SEGS * 46,
    );
    let kinds: Vec<(Opcode, bool)> = segs.iter().map(|(r, _)| (r.opcode, r.last)).collect();
    let mut expect: Vec<(Opcode, bool)> = (1..=SEGS).map(|i| (Opcode::Send, i == SEGS)).collect();
    expect.push((Opcode::ReadResponse, true));
    let at = kinds.iter().position(|k| k.0 == Opcode::ReadResponse);
    assert_eq!(
        at,
        Some(SEGS as usize),
        "Read Response among the {SEGS} segments"
    );
    assert_eq!(kinds, expect);
    for (i, (r, _)) in segs[..SEGS as usize].iter().enumerate() {
        assert_eq!(r.ddp, untagged_hdr(0, 1, i as u32 * 46));
    }
}

/// `docs/wire.md` §7.3 / §9 item 6 (RFC 5041 §5.3): two tagged messages
/// must not interleave (siw rejects it as a "packet intersection"): while a
/// multi-FPDU RDMA Write is being sent, the Read Response to an inbound
/// Read Request waits for the Write's last segment.
#[test]
fn ordering_read_response_does_not_interleave_with_multi_fpdu_write() {
    const SEGS: u32 = 40;
    let segs = long_message_with_read_arriving_midway(
        |src, len| write_wr(1, src, 0x1_0000, len, 0x6601, 0x100),
        SEGS * 50,
    );
    let kinds: Vec<(Opcode, bool)> = segs.iter().map(|(r, _)| (r.opcode, r.last)).collect();
    let mut expect: Vec<(Opcode, bool)> =
        (1..=SEGS).map(|i| (Opcode::RdmaWrite, i == SEGS)).collect();
    expect.push((Opcode::ReadResponse, true));
    let at = kinds.iter().position(|k| k.0 == Opcode::ReadResponse);
    assert_eq!(
        at,
        Some(SEGS as usize),
        "Read Response among the {SEGS} segments"
    );
    assert_eq!(kinds, expect);
    for (i, (r, _)) in segs[..SEGS as usize].iter().enumerate() {
        assert_eq!(r.ddp, tagged_hdr(0x6601, 0x100 + u64::from(i as u32 * 50)));
    }
}

/// `docs/wire.md` §7.3 / §9 item 6 and the `rc` module's fairness rule:
/// after `read_burst` Read Responses the send queue gets a turn, and that
/// turn is a whole message — with six Read Requests queued and a two-FPDU
/// RDMA Write posted, the transmitter sends four Read Responses, both Write
/// segments, then the last two Read Responses. (No partial write is needed
/// to reach this: it is the plain batch the QP frames.)
#[test]
fn ordering_read_burst_gives_the_send_queue_whole_messages() {
    let mut q = Qp::new(small_fpdus());
    assert_eq!(q.qp.config().read_burst, 4);
    let src = q.region(0x1_0000, 100, LOCAL);
    let rsrc = q.region(0x5000, 16, Access::REMOTE_READ);
    let mut bytes = Vec::new();
    for msn in 1..=6 {
        let req = ReadRequest {
            sink_stag: 0x77,
            sink_to: u64::from(msn) * 0x100,
            size: 4,
            src_stag: rsrc,
            src_to: 0x5000,
        };
        bytes.extend(q.fpdu(&read_request(msn, req), &[]));
    }
    q.feed(&bytes);
    q.post_send(write_wr(1, src, 0x1_0000, 100, 0x6601, 0)); // 50 + 50
    let segs = q.transmitted();
    let kinds: Vec<(Opcode, bool)> = segs.iter().map(|(r, _)| (r.opcode, r.last)).collect();
    let rr = (Opcode::ReadResponse, true);
    assert_eq!(
        kinds,
        vec![
            rr,
            rr,
            rr,
            rr,
            (Opcode::RdmaWrite, false),
            (Opcode::RdmaWrite, true),
            rr,
            rr
        ]
    );
}
