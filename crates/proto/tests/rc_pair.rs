//! Two RC queue pairs joined by in-memory byte pipes that split the stream
//! at random points and accept partial writes, as TCP may. Every operation is
//! checked end to end: data placed, completions, and errors at both ends.

use std::io;

use softrdma_proto::memory::{Access, Memory, VecMemory};
use softrdma_proto::rc::{
    CqKind, DirectRx, RcConfig, RcEvent, RcQp, RcState, RecvQueue, RtrKind, RtrRole,
};
use softrdma_proto::wr::{
    InlineData, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};
use softrdma_wire::rdmap::TerminateCause;

/// xorshift64*: a small seeded generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A writer that takes a random number of octets per call, sometimes none.
struct Pipe<'r> {
    buf: Vec<u8>,
    rng: &'r mut Rng,
}
impl io::Write for Pipe<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self.rng.below(8) {
            0 => Err(io::ErrorKind::WouldBlock.into()),
            1 => {
                let n = (self.rng.below(7) as usize).min(b.len());
                self.buf.extend_from_slice(&b[..n]);
                Ok(n)
            }
            _ => {
                self.buf.extend_from_slice(b);
                Ok(b.len())
            }
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let limit = match self.rng.below(6) {
            0 => return Err(io::ErrorKind::WouldBlock.into()),
            1 => self.rng.below(total as u64 + 1) as usize,
            _ => total,
        };
        let mut n = 0;
        for b in bufs {
            let take = (limit - n).min(b.len());
            self.buf.extend_from_slice(&b[..take]);
            n += take;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct End {
    qp: RcQp,
    mem: VecMemory,
    wire_in: Vec<u8>,
    send_wc: Vec<WorkCompletion>,
    recv_wc: Vec<WorkCompletion>,
    events: Vec<RcEvent>,
}

impl End {
    fn new(cfg: RcConfig) -> End {
        End {
            qp: RcQp::new(cfg),
            mem: VecMemory::new(),
            wire_in: Vec::new(),
            send_wc: Vec::new(),
            recv_wc: Vec::new(),
            events: Vec::new(),
        }
    }
    fn drain(&mut self) {
        while let Some((k, wc)) = self.qp.poll_completion() {
            match k {
                CqKind::Send => self.send_wc.push(wc),
                CqKind::Recv => self.recv_wc.push(wc),
            }
        }
        while let Some(e) = self.qp.poll_event() {
            self.events.push(e);
        }
    }
}

struct Pair {
    a: End,
    b: End,
    rng: Rng,
    /// Receivers place payload directly where `RcQp::rx_direct` says (as
    /// the engine does from its socket) whenever it is offered.
    direct: bool,
    /// Octets placed that way.
    direct_octets: u64,
    /// Octets handed in through `RcQp::rx_stash_space` (CRC).
    stash_octets: u64,
}

/// Places `data` (a prefix of the octets `d` describes) into `mem`, as the
/// engine's direct receive does with one vectored read.
fn place_direct(mem: &mut VecMemory, d: &DirectRx, data: &[u8]) {
    let mut at = 0;
    for piece in d.pieces() {
        if at == data.len() {
            break;
        }
        let n = (piece.len as usize).min(data.len() - at);
        let r = if piece.remote {
            mem.remote_write(piece.key, piece.addr, &data[at..at + n])
        } else {
            mem.local_write(piece.key, piece.addr, &data[at..at + n])
        };
        r.expect("rx_direct offers only checked memory");
        at += n;
    }
    assert_eq!(at, data.len(), "pieces cover the payload");
}

impl Pair {
    fn new(seed: u64, a: RcConfig, b: RcConfig) -> Pair {
        Pair {
            a: End::new(a),
            b: End::new(b),
            rng: Rng(seed | 1),
            direct: false,
            direct_octets: 0,
            stash_octets: 0,
        }
    }

    /// A pair without CRC whose receivers place payload directly.
    fn direct(seed: u64) -> Pair {
        let cfg = RcConfig {
            crc: false,
            ..RcConfig::default()
        };
        let mut p = Pair::new(seed, cfg, cfg);
        p.direct = true;
        p
    }

    /// A pair with CRC whose receivers stream FPDUs that still lack 2 KiB
    /// or more and place their payload directly (as the engine does); 16
    /// KiB FPDUs, so there are such.
    fn direct_crc(seed: u64) -> Pair {
        let cfg = RcConfig {
            crc_direct_min: 2048,
            max_ulpdu: softrdma_wire::fpdu::max_ulpdu(16 << 10, false),
            ..RcConfig::default()
        };
        let mut p = Pair::new(seed, cfg, cfg);
        p.direct = true;
        p
    }

    fn rc(seed: u64) -> Pair {
        Pair::new(seed, RcConfig::default(), RcConfig::default())
    }

    /// A pair whose signaled Writes complete once placed
    /// (`RcConfig::write_placed`), with a small ORD so the probes contend
    /// with the Reads and atomics for it.
    fn write_placed(seed: u64) -> Pair {
        let cfg = RcConfig {
            write_placed: true,
            ord: 2,
            ird: 2,
            ..RcConfig::default()
        };
        Pair::new(seed, cfg, cfg)
    }

    /// Moves octets both ways until nothing moves any more.
    fn run(&mut self) {
        for _ in 0..1_000_000 {
            let mut moved = false;
            for dir in 0..2 {
                let (src, dst) = if dir == 0 {
                    (&mut self.a, &mut self.b)
                } else {
                    (&mut self.b, &mut self.a)
                };
                let mut pipe = Pipe {
                    buf: std::mem::take(&mut dst.wire_in),
                    rng: &mut self.rng,
                };
                src.qp
                    .poll_transmit(&mut src.mem, &mut pipe)
                    .expect("pipe never fails");
                dst.wire_in = pipe.buf;
                // Deliver a random prefix in random pieces.
                if !dst.wire_in.is_empty() {
                    let n = 1 + self.rng.below(dst.wire_in.len() as u64) as usize;
                    let chunk: Vec<u8> = dst.wire_in.drain(..n).collect();
                    let mut at = 0;
                    while at < chunk.len() {
                        if let Some(d) = dst.qp.rx_direct().filter(|_| self.direct) {
                            let n =
                                (1 + self.rng.below(d.len as u64) as usize).min(chunk.len() - at);
                            place_direct(&mut dst.mem, &d, &chunk[at..at + n]);
                            assert!(dst.qp.rx_direct_placed(n, &[&chunk[at..at + n]]));
                            self.direct_octets += n as u64;
                            at += n;
                            continue;
                        }
                        // With CRC, half the time the rest of a partial
                        // FPDU is read straight behind its start (as the
                        // engine does with a vectored read).
                        if self.rng.below(2) == 0 {
                            if let Some(space) = dst.qp.rx_stash_space() {
                                let n = (1 + self.rng.below(space.len() as u64) as usize)
                                    .min(chunk.len() - at);
                                space[..n].copy_from_slice(&chunk[at..at + n]);
                                assert!(dst.qp.rx_stash_filled(n, &mut dst.mem));
                                self.stash_octets += n as u64;
                                at += n;
                                continue;
                            }
                        }
                        let k = 1 + self.rng.below((chunk.len() - at) as u64) as usize;
                        dst.qp.handle_bytes(&chunk[at..at + k], &mut dst.mem);
                        at += k;
                    }
                    moved = true;
                }
                if src.qp.wants_transmit() {
                    moved = true;
                }
            }
            self.a.drain();
            self.b.drain();
            if !moved {
                return;
            }
        }
        panic!("pair did not settle");
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn signaled() -> SendFlags {
    SendFlags {
        signaled: true,
        ..SendFlags::default()
    }
}

fn send(wr_id: u64, lkey: u32, addr: u64, len: u32) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Sgl(SgList::single(addr, len, lkey)),
        flags: signaled(),
    }
}

const RW: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);

#[test]
fn sends_of_every_size_arrive_intact_under_random_splits() {
    for (seed, len) in [
        (1u64, 0usize),
        (2, 1),
        (3, 13),
        (4, 1424),
        (5, 1425),
        (6, 5000),
        (7, 300_000),
    ] {
        for cfg in [(true, false), (false, false), (true, true), (false, true)] {
            let c = RcConfig {
                crc: cfg.0,
                markers_tx: cfg.1,
                markers_rx: cfg.1,
                ..RcConfig::default()
            };
            let mut p = Pair::new(seed * 7 + cfg.0 as u64, c, c);
            let src = p.a.mem.register(0, 0x10000, len.max(1), RW);
            p.a.mem.bytes_mut(src)[..len].copy_from_slice(&pattern(len, seed as u8));
            let dst = p.b.mem.register(0, 0x20000, len + 16, RW);
            p.b.qp
                .post_recv(RecvWr {
                    wr_id: 77,
                    sgl: SgList::single(0x20000, len as u32 + 16, dst),
                })
                .unwrap();
            p.a.qp.post_send(send(5, src, 0x10000, len as u32)).unwrap();
            p.run();
            assert_eq!(
                p.a.send_wc,
                vec![WorkCompletion::new(
                    5,
                    WcStatus::Success,
                    WcOpcode::Send,
                    len as u32
                )]
            );
            assert_eq!(
                p.b.recv_wc,
                vec![WorkCompletion::new(
                    77,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    len as u32
                )]
            );
            assert_eq!(&p.b.mem.bytes(dst)[..len], &pattern(len, seed as u8)[..]);
            assert!(p.b.mem.bytes(dst)[len..].iter().all(|&x| x == 0));
            assert_eq!(p.a.qp.state(), RcState::Rts);
            assert_eq!(p.b.qp.state(), RcState::Rts);
        }
    }
}

#[test]
fn multi_sge_gather_and_scatter_and_inline() {
    multi_sge(Pair::rc(11));
    let p = multi_sge(Pair::direct(11));
    assert!(
        p.direct_octets > 0,
        "scattered directly: {}",
        p.direct_octets
    );
}

fn multi_sge(mut p: Pair) -> Pair {
    let a = p.a.mem.register(0, 0x1000, 4096, RW);
    p.a.mem.bytes_mut(a).copy_from_slice(&pattern(4096, 3));
    let b = p.b.mem.register(0, 0x9000, 4096, RW);
    // Gather 3 pieces, scatter into 4.
    let gather = SgList::from_slice(&[
        Sge {
            addr: 0x1000,
            length: 100,
            lkey: a,
        },
        Sge {
            addr: 0x1800,
            length: 0,
            lkey: a,
        },
        Sge {
            addr: 0x1100,
            length: 2000,
            lkey: a,
        },
        Sge {
            addr: 0x1010,
            length: 7,
            lkey: a,
        },
    ])
    .unwrap();
    let scatter = SgList::from_slice(&[
        Sge {
            addr: 0x9000,
            length: 50,
            lkey: b,
        },
        Sge {
            addr: 0x9100,
            length: 1000,
            lkey: b,
        },
        Sge {
            addr: 0x9800,
            length: 1057,
            lkey: b,
        },
        Sge {
            addr: 0x9f00,
            length: 200,
            lkey: b,
        },
    ])
    .unwrap();
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 1,
            sgl: scatter,
        })
        .unwrap();
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 2,
            sgl: SgList::single(0x9f00, 100, b),
        })
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 9,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(gather),
            flags: signaled(),
        })
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 10,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Inline(InlineData::new(b"inline!").unwrap()),
            flags: signaled(),
        })
        .unwrap();
    p.run();
    let src = p.a.mem.bytes(a).to_vec();
    let mut expect = Vec::new();
    expect.extend_from_slice(&src[0..100]);
    expect.extend_from_slice(&src[0x100..0x100 + 2000]);
    expect.extend_from_slice(&src[0x10..0x17]);
    let d = p.b.mem.bytes(b);
    let mut got = Vec::new();
    got.extend_from_slice(&d[0..50]);
    got.extend_from_slice(&d[0x100..0x100 + 1000]);
    got.extend_from_slice(&d[0x800..0x800 + 1057]);
    assert_eq!(got, expect);
    assert_eq!(&d[0xf00..0xf07], b"inline!");
    assert_eq!(p.b.recv_wc.len(), 2);
    assert_eq!(p.b.recv_wc[0].byte_len, 2107);
    assert_eq!(p.b.recv_wc[1].byte_len, 7);
    p
}

#[test]
fn write_read_and_atomics() {
    write_read_atomics(Pair::rc(21));
    let p = write_read_atomics(Pair::direct(21));
    // Payload of Write and Read Response segments whose header ended a
    // delivered piece (the random splits decide how much).
    assert!(p.direct_octets > 16 << 10, "{}", p.direct_octets);
    let p = write_read_atomics(Pair::direct_crc(21));
    assert!(p.direct_octets > 16 << 10, "with CRC: {}", p.direct_octets);
}

fn write_read_atomics(mut p: Pair) -> Pair {
    let a = p.a.mem.register(0, 0x1000, 1 << 20, RW);
    let b = p.b.mem.register(0, 0x5_0000, 1 << 20, RW);
    p.a.mem.bytes_mut(a).copy_from_slice(&pattern(1 << 20, 1));
    p.b.mem.bytes_mut(b).copy_from_slice(&pattern(1 << 20, 2));
    // Write 700 KiB to b at offset 100.
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: 0x5_0000 + 100,
                rkey: b,
                imm: None,
            },
            payload: Payload::Sgl(SgList::single(0x1000, 700 << 10, a)),
            flags: signaled(),
        })
        .unwrap();
    // Read 200 KiB from b into a at offset 800 KiB, two SGEs.
    let sink = SgList::from_slice(&[
        Sge {
            addr: 0x1000 + (800 << 10),
            length: 100 << 10,
            lkey: a,
        },
        Sge {
            addr: 0x1000 + (900 << 10),
            length: 100 << 10,
            lkey: a,
        },
    ])
    .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 2,
            op: SendOp::Read {
                remote_addr: 0x5_0000 + (724 << 10),
                rkey: b,
            },
            payload: Payload::Sgl(sink),
            flags: signaled(),
        })
        .unwrap();
    // Fetch-add and compare-swap on b's first word, results into a.
    p.a.qp
        .post_send(SendWr {
            wr_id: 3,
            op: SendOp::FetchAdd {
                remote_addr: 0x5_0000 + 8,
                rkey: b,
                add: 5,
            },
            payload: Payload::Sgl(SgList::single(0x1000, 8, a)),
            flags: signaled(),
        })
        .unwrap();
    p.run();
    let bw = pattern(1 << 20, 2);
    let aw = pattern(1 << 20, 1);
    assert_eq!(&p.b.mem.bytes(b)[100..100 + (700 << 10)], &aw[..700 << 10]);
    assert_eq!(&p.b.mem.bytes(b)[..8], &bw[..8]);
    assert_eq!(&p.b.mem.bytes(b)[16..100], &bw[16..100]);
    assert_eq!(
        &p.b.mem.bytes(b)[100 + (700 << 10)..],
        &bw[100 + (700 << 10)..]
    );
    // The write landed before the read (ordering within the connection).
    let b_now = p.b.mem.bytes(b).to_vec();
    let got = &p.a.mem.bytes(a)[800 << 10..1000 << 10];
    let want = &b_now[724 << 10..924 << 10];
    let first_bad = got.iter().zip(want).position(|(x, y)| x != y);
    assert_eq!(first_bad, None, "read data differs");
    let ops: Vec<_> =
        p.a.send_wc
            .iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect();
    assert_eq!(
        ops,
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite, 700 << 10),
            (2, WcStatus::Success, WcOpcode::RdmaRead, 200 << 10),
            (3, WcStatus::Success, WcOpcode::FetchAdd, 8)
        ]
    );
    let orig = u64::from_ne_bytes(b_now[8..16].try_into().unwrap()).wrapping_sub(5);
    assert_eq!(
        u64::from_ne_bytes(p.a.mem.bytes(a)[0..8].try_into().unwrap()),
        orig
    );
    assert!(
        p.b.recv_wc.is_empty(),
        "one-sided operations consume no receive"
    );
    p
}

#[test]
fn immediate_data_invalidate_and_solicited() {
    let mut p = Pair::rc(31);
    let a = p.a.mem.register(0, 0, 4096, RW);
    let b = p.b.mem.register(0, 0x8000, 4096, RW);
    let victim = p.b.mem.register(0, 0xc000, 64, RW);
    for i in 0..4 {
        p.b.qp
            .post_recv(RecvWr {
                wr_id: 100 + i,
                sgl: SgList::single(0x8000 + i * 512, 512, b),
            })
            .unwrap();
    }
    p.a.qp
        .post_send(SendWr {
            wr_id: 1,
            op: SendOp::Send {
                imm: Some(0xdead_beef),
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(0, 10, a)),
            flags: signaled(),
        })
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 2,
            op: SendOp::Write {
                remote_addr: 0x8000 + 2048,
                rkey: b,
                imm: Some(7),
            },
            payload: Payload::Sgl(SgList::single(0, 33, a)),
            flags: signaled(),
        })
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 3,
            op: SendOp::Send {
                imm: None,
                invalidate: Some(victim),
            },
            payload: Payload::Sgl(SgList::single(0, 3, a)),
            flags: SendFlags {
                signaled: true,
                solicited: true,
                fence: false,
            },
        })
        .unwrap();
    p.run();
    let r = &p.b.recv_wc;
    assert_eq!(r.len(), 3, "{r:?}");
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len, r[0].imm),
        (100, WcOpcode::Recv, 10, Some(0xdead_beef))
    );
    assert_eq!(
        (r[1].wr_id, r[1].opcode, r[1].byte_len, r[1].imm),
        (101, WcOpcode::RecvRdmaWithImm, 33, Some(7))
    );
    assert_eq!(
        (r[2].wr_id, r[2].invalidated, r[2].solicited, r[2].imm),
        (102, Some(victim), true, None)
    );
    assert!(!p.b.mem.is_valid(victim));
    assert_eq!(p.a.send_wc.len(), 3);
}

#[test]
fn unsignaled_work_completes_silently_and_in_order() {
    let mut p = Pair::rc(41);
    let a = p.a.mem.register(0, 0, 64, RW);
    let b = p.b.mem.register(0, 0, 64, RW);
    for i in 0..10 {
        p.b.qp
            .post_recv(RecvWr {
                wr_id: i,
                sgl: SgList::single(0, 64, b),
            })
            .unwrap();
        let mut wr = send(i, a, 0, 8);
        wr.flags.signaled = i % 3 == 0;
        p.a.qp.post_send(wr).unwrap();
    }
    p.run();
    assert_eq!(
        p.a.send_wc.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![0, 3, 6, 9]
    );
    assert_eq!(p.b.recv_wc.len(), 10);
}

#[test]
fn ord_limits_outstanding_reads_and_fence_waits() {
    let c = RcConfig {
        ord: 2,
        ird: 2,
        ..RcConfig::default()
    };
    let mut p = Pair::new(51, c, c);
    let a = p.a.mem.register(0, 0, 1 << 16, RW);
    let b = p.b.mem.register(0, 0, 1 << 16, RW);
    p.b.mem.bytes_mut(b).copy_from_slice(&pattern(1 << 16, 9));
    for i in 0..20u64 {
        p.a.qp
            .post_send(SendWr {
                wr_id: i,
                op: SendOp::Read {
                    remote_addr: i * 1000,
                    rkey: b,
                },
                payload: Payload::Sgl(SgList::single(i * 1000, 1000, a)),
                flags: signaled(),
            })
            .unwrap();
    }
    let mut fenced = SendWr {
        wr_id: 99,
        op: SendOp::Write {
            remote_addr: 0,
            rkey: b,
            imm: None,
        },
        payload: Payload::Sgl(SgList::single(0, 16, a)),
        flags: signaled(),
    };
    fenced.flags.fence = true;
    p.a.qp.post_send(fenced).unwrap();
    p.run();
    assert_eq!(p.a.send_wc.len(), 21);
    assert!(p.a.send_wc.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(&p.a.mem.bytes(a)[..20_000], &pattern(1 << 16, 9)[..20_000]);
}

#[test]
fn bad_stag_bounds_and_rights_terminate_without_writing_outside() {
    for case in 0..4 {
        let mut p = Pair::rc(61 + case);
        let a = p.a.mem.register(0, 0, 4096, RW);
        let guard_lo = p.b.mem.register(0, 0x1000 - 64, 64, RW);
        let b = p.b.mem.register(
            0,
            0x1000,
            1024,
            Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        );
        let guard_hi = p.b.mem.register(0, 0x1400, 64, RW);
        p.b.qp
            .post_recv(RecvWr {
                wr_id: 500,
                sgl: SgList::single(0x1000, 8, b),
            })
            .unwrap();
        let op = match case {
            0 => SendOp::Write {
                remote_addr: 0x1000,
                rkey: b ^ 0x40,
                imm: None,
            }, // wrong key
            1 => SendOp::Write {
                remote_addr: 0x1000 + 1000,
                rkey: b,
                imm: None,
            }, // runs past the end
            2 => SendOp::Read {
                remote_addr: 0x1000,
                rkey: b,
            }, // no REMOTE_READ
            _ => SendOp::Write {
                remote_addr: 0x1000 - 10,
                rkey: b,
                imm: None,
            }, // starts before
        };
        p.a.mem.bytes_mut(a).fill(0xEE);
        p.a.qp
            .post_send(SendWr {
                wr_id: 1,
                op,
                payload: Payload::Sgl(SgList::single(0, 100, a)),
                flags: signaled(),
            })
            .unwrap();
        p.a.qp.post_send(send(2, a, 0, 10)).unwrap();
        p.run();
        assert!(
            p.b.mem.bytes(b).iter().all(|&x| x == 0),
            "case {case}: nothing placed"
        );
        assert!(p.b.mem.bytes(guard_lo).iter().all(|&x| x == 0));
        assert!(p.b.mem.bytes(guard_hi).iter().all(|&x| x == 0));
        assert_eq!(p.a.qp.state(), RcState::Error, "case {case}");
        assert_eq!(p.b.qp.state(), RcState::Error, "case {case}");
        // The requester: a Read fails itself; a Write completed when it was
        // handed to the stream (iWARP semantics, as siw), so the error
        // lands on the next outstanding work request.
        assert_eq!(p.a.send_wc.len(), 2, "case {case}: {:?}", p.a.send_wc);
        if case == 2 {
            assert_eq!(p.a.send_wc[0].status, WcStatus::RemAccessErr, "case {case}");
            assert_eq!(p.a.send_wc[1].status, WcStatus::WrFlushErr);
        } else {
            assert_eq!(p.a.send_wc[0].status, WcStatus::Success, "case {case}");
        }
        // Work posted after the Terminate arrived completes in error.
        p.a.qp.post_send(send(3, a, 0, 1)).unwrap();
        p.a.drain();
        assert_eq!(p.a.send_wc.last().unwrap().status, WcStatus::WrFlushErr);
        // The target: its receive flushes.
        assert_eq!(p.b.recv_wc.len(), 1);
        assert_eq!(p.b.recv_wc[0].status, WcStatus::WrFlushErr);
        let cause = p.b.events.iter().find_map(|e| match e {
            RcEvent::Error {
                cause,
                remote: false,
            } => *cause,
            _ => None,
        });
        let expect = match case {
            0 => TerminateCause::DdpTaggedInvalidStag,
            1 | 3 => TerminateCause::DdpTaggedBaseBounds,
            _ => TerminateCause::RdmapAccessRights,
        };
        assert_eq!(cause, Some(expect), "case {case}");
        assert!(p.a.events.contains(&RcEvent::Error {
            cause: Some(expect),
            remote: true
        }));
    }
}

#[test]
fn send_without_receive_is_a_terminate() {
    let mut p = Pair::rc(71);
    let a = p.a.mem.register(0, 0, 64, RW);
    p.a.qp.post_send(send(1, a, 0, 8)).unwrap();
    p.a.qp.post_send(send(2, a, 0, 8)).unwrap();
    p.run();
    // The Sends completed at hand-off; the Terminate puts the QP in error.
    assert_eq!(p.a.send_wc[0].status, WcStatus::Success);
    assert_eq!(p.a.qp.state(), RcState::Error);
    assert!(p.a.events.contains(&RcEvent::Error {
        cause: Some(TerminateCause::DdpUntaggedNoBuffer),
        remote: true
    }));
    assert!(p.b.events.contains(&RcEvent::Error {
        cause: Some(TerminateCause::DdpUntaggedNoBuffer),
        remote: false
    }));
}

#[test]
fn message_longer_than_the_receive_buffer() {
    let mut p = Pair::rc(72);
    let a = p.a.mem.register(0, 0, 64, RW);
    let b = p.b.mem.register(0, 0, 64, RW);
    let guard = p.b.mem.register(0, 64, 64, RW);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 3,
            sgl: SgList::single(0, 16, b),
        })
        .unwrap();
    p.a.qp.post_send(send(1, a, 0, 64)).unwrap();
    p.a.qp.post_send(send(2, a, 0, 1)).unwrap();
    p.run();
    assert_eq!(p.b.recv_wc[0].status, WcStatus::LocLenErr);
    assert!(p.a.events.contains(&RcEvent::Error {
        cause: Some(TerminateCause::DdpUntaggedTooLong),
        remote: true
    }));
    assert!(p.b.mem.bytes(guard).iter().all(|&x| x == 0));
}

#[test]
fn corrupted_octet_is_a_crc_terminate() {
    let mut p = Pair::rc(81);
    let a = p.a.mem.register(0, 0, 64, RW);
    let b = p.b.mem.register(0, 0, 64, RW);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 3,
            sgl: SgList::single(0, 64, b),
        })
        .unwrap();
    p.a.qp.post_send(send(1, a, 0, 40)).unwrap();
    let mut wire = Vec::new();
    p.a.qp.poll_transmit(&mut p.a.mem, &mut wire).unwrap();
    wire[25] ^= 0x04;
    p.b.qp.handle_bytes(&wire, &mut p.b.mem);
    p.b.drain();
    assert_eq!(p.b.qp.state(), RcState::Error);
    assert!(p.b.events.contains(&RcEvent::Error {
        cause: Some(TerminateCause::MpaCrcError),
        remote: false
    }));
    assert_eq!(p.b.recv_wc[0].status, WcStatus::RemOpErr);
    p.run();
    assert_eq!(p.a.qp.state(), RcState::Error);
}

#[test]
fn p2p_rtr_write_and_read() {
    for kind in [RtrKind::Write, RtrKind::Read] {
        let i = RcConfig {
            rtr: RtrRole::Send(kind),
            ..RcConfig::default()
        };
        let r = RcConfig {
            rtr: RtrRole::Await(Some(kind)),
            ..RcConfig::default()
        };
        let mut p = Pair::new(91, i, r);
        assert_eq!(p.b.qp.state(), RcState::AwaitingRtr);
        let a = p.a.mem.register(0, 0, 64, RW);
        let b = p.b.mem.register(0, 0, 64, RW);
        // The responder's Send waits for the RTR; the initiator's goes after it.
        p.a.qp
            .post_recv(RecvWr {
                wr_id: 1,
                sgl: SgList::single(0, 64, a),
            })
            .unwrap();
        p.b.qp.post_send(send(2, b, 0, 4)).unwrap();
        assert!(!p.b.qp.wants_transmit());
        p.b.qp
            .post_recv(RecvWr {
                wr_id: 3,
                sgl: SgList::single(0, 64, b),
            })
            .unwrap();
        p.a.qp.post_send(send(4, a, 0, 4)).unwrap();
        p.run();
        assert_eq!(p.b.qp.state(), RcState::Rts, "{kind:?}");
        assert_eq!(p.a.recv_wc.len(), 1);
        assert_eq!(p.b.recv_wc.len(), 1);
        assert_eq!(p.a.send_wc.len(), 1);
        assert_eq!(p.b.send_wc.len(), 1);
    }
}

#[test]
fn disconnect_flushes_everything() {
    let mut p = Pair::rc(101);
    let a = p.a.mem.register(0, 0, 1 << 20, RW);
    p.a.qp
        .post_recv(RecvWr {
            wr_id: 7,
            sgl: SgList::single(0, 64, a),
        })
        .unwrap();
    p.a.qp
        .post_send(SendWr {
            wr_id: 8,
            op: SendOp::Write {
                remote_addr: 0,
                rkey: 0x100,
                imm: None,
            },
            payload: Payload::Sgl(SgList::single(0, 1 << 20, a)),
            flags: SendFlags::default(),
        })
        .unwrap();
    p.a.qp.disconnect();
    p.a.drain();
    assert_eq!(p.a.send_wc[0].status, WcStatus::WrFlushErr);
    assert_eq!(p.a.recv_wc[0].status, WcStatus::WrFlushErr);
    assert!(p.a.events.contains(&RcEvent::TxClosed));
    // Posting in the error state completes at once with a flush error.
    p.a.qp.post_send(send(9, a, 0, 1)).unwrap();
    p.a.drain();
    assert_eq!(p.a.send_wc.last().unwrap().status, WcStatus::WrFlushErr);
}

#[test]
fn random_operation_mix_is_exact() {
    assert_eq!(random_mix(Pair::rc), 0);
}

#[test]
fn random_operation_mix_is_exact_when_writes_complete_once_placed() {
    assert_eq!(random_mix(Pair::write_placed), 0);
}

/// `RcConfig::write_placed`: a signaled Write written whole to the
/// transport has not completed; it completes (with its own length) once
/// the peer answered the zero-length Read behind it, and the peer holds
/// the data by then. A Write with immediate too. Without the option the
/// same Write completes as soon as it is written.
#[test]
fn a_write_completes_once_the_peer_placed_it() {
    for placed in [true, false] {
        let cfg = RcConfig {
            write_placed: placed,
            ..RcConfig::default()
        };
        let mut p = Pair::new(41, cfg, RcConfig::default());
        let a = p.a.mem.register(0, 0x1000, 8192, RW);
        let b = p.b.mem.register(0, 0x9000, 8192, RW);
        p.a.mem.bytes_mut(a).copy_from_slice(&pattern(8192, 7));
        let rb = p.b.mem.register(0, 0x20_000, 64, RW);
        p.b.qp
            .post_recv(RecvWr {
                wr_id: 9,
                sgl: SgList::single(0x20_000, 64, rb),
            })
            .unwrap();
        for (wr_id, imm) in [(1, None), (2, Some(0xfeed))] {
            p.a.qp
                .post_send(SendWr {
                    wr_id,
                    op: SendOp::Write {
                        remote_addr: 0x9000,
                        rkey: b,
                        imm,
                    },
                    payload: Payload::Sgl(SgList::single(0x1000, 5000, a)),
                    flags: signaled(),
                })
                .unwrap();
        }
        // Everything a has to send goes out; nothing reaches b yet.
        let mut wire = Vec::new();
        p.a.qp.poll_transmit(&mut p.a.mem, &mut wire).unwrap();
        p.a.drain();
        if placed {
            assert!(p.a.send_wc.is_empty(), "completed before placement");
        } else {
            assert_eq!(p.a.send_wc.len(), 2, "iWARP: complete once written");
        }
        p.b.wire_in = wire;
        p.run();
        assert_eq!(&p.b.mem.bytes(b)[..5000], &pattern(8192, 7)[..5000]);
        let ops: Vec<_> =
            p.a.send_wc
                .iter()
                .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
                .collect();
        assert_eq!(
            ops,
            vec![
                (1, WcStatus::Success, WcOpcode::RdmaWrite, 5000),
                (2, WcStatus::Success, WcOpcode::RdmaWrite, 5000)
            ]
        );
        assert_eq!(p.b.recv_wc.len(), 1, "the immediate consumed a receive");
    }
}

#[test]
fn partial_fpdus_with_crc_are_completed_in_place() {
    let mut p = write_read_atomics(Pair::rc(33));
    assert!(p.stash_octets > 0, "the stash path was taken");
    assert_eq!(p.direct_octets, 0, "no direct placement with CRC");
    assert!(p.a.qp.rx_stash_space().is_none() && p.b.qp.rx_stash_space().is_none());
}

#[test]
fn random_operation_mix_is_exact_with_direct_placement() {
    assert!(random_mix(Pair::direct) > 0);
}

#[test]
fn random_operation_mix_is_exact_with_crc_and_direct_placement() {
    assert!(random_mix(Pair::direct_crc) > 0);
}

/// With CRC and `crc_direct_min`, a Send that arrives in parts is placed
/// as it comes and checked at its end: octets damaged on the way are
/// placed, the CRC fails, and the receive completes in error — never as a
/// success — while the stream terminates; the same FPDU intact completes.
#[test]
fn a_damaged_payload_placed_directly_fails_its_crc() {
    for damage in [false, true] {
        let mut p = Pair::direct_crc(7);
        let len = 10_000usize;
        let a = p.a.mem.register(0, 0, len, RW);
        p.a.mem.bytes_mut(a).copy_from_slice(&pattern(len, 3));
        let b = p.b.mem.register(0, 0, len, RW);
        p.b.qp
            .post_recv(RecvWr {
                wr_id: 3,
                sgl: SgList::single(0, len as u32, b),
            })
            .unwrap();
        p.a.qp.post_send(send(1, a, 0, len as u32)).unwrap();
        let mut wire = Vec::new();
        p.a.qp.poll_transmit(&mut p.a.mem, &mut wire).unwrap();
        assert_eq!(wire.len(), 2 + 18 + len + 4, "one FPDU");
        // The header and 100 payload octets: streamed, not kept.
        p.b.qp.handle_bytes(&wire[..120], &mut p.b.mem);
        assert!(p.b.qp.rx_stash_space().is_none(), "not kept whole");
        let d = p.b.qp.rx_direct().expect("the rest is offered");
        assert_eq!((d.len, d.trailer), (len - 100, 4));
        let mut rest = wire[120..120 + d.len].to_vec();
        if damage {
            rest[5000] ^= 0x40;
        }
        place_direct(&mut p.b.mem, &d, &rest);
        assert!(!p.b.qp.rx_direct_placed(d.len, &[&rest[1..]]), "too few");
        assert!(p.b.qp.rx_direct_placed(d.len, &[&rest[..10], &rest[10..]]));
        p.b.drain();
        assert!(p.b.recv_wc.is_empty(), "nothing completes before the CRC");
        p.b.qp.handle_bytes(&wire[120 + d.len..], &mut p.b.mem);
        p.b.drain();
        if damage {
            assert_eq!(p.b.qp.state(), RcState::Error);
            assert!(p.b.events.contains(&RcEvent::Error {
                cause: Some(TerminateCause::MpaCrcError),
                remote: false
            }));
            assert_eq!(p.b.recv_wc.len(), 1);
            assert_eq!(p.b.recv_wc[0].status, WcStatus::RemOpErr);
        } else {
            assert_eq!(p.b.qp.state(), RcState::Rts);
            assert_eq!(
                p.b.recv_wc,
                vec![WorkCompletion::new(
                    3,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    len as u32
                )]
            );
            assert_eq!(p.b.mem.bytes(b), &pattern(len, 3)[..]);
        }
    }
}

fn random_mix(make: fn(u64) -> Pair) -> u64 {
    let mut direct = 0;
    for seed in 1..30u64 {
        let mut p = make(seed * 1_000_003);
        let mut rng = Rng(seed);
        let a = p.a.mem.register(0, 0, 1 << 18, RW);
        let b = p.b.mem.register(0, 1 << 32, 1 << 18, RW);
        p.a.mem
            .bytes_mut(a)
            .copy_from_slice(&pattern(1 << 18, seed as u8));
        let mut expect_b = p.b.mem.bytes(b).to_vec();
        let mut expect_recv = Vec::new();
        let mut n_ops = 0;
        for i in 0..40u64 {
            let big = rng.below(4) == 0;
            let len = rng.below(if big { 60_000 } else { 300 }) as usize;
            let off = rng.below((1 << 17) as u64) as usize;
            match rng.below(3) {
                0 => {
                    // Send into a fresh slot of the upper half of b.
                    let slot = (1 << 17) + (i as usize % 2) * 65536;
                    p.b.qp
                        .post_recv(RecvWr {
                            wr_id: i,
                            sgl: SgList::single((1 << 32) + slot as u64, 65536, b),
                        })
                        .unwrap();
                    p.a.qp
                        .post_send(send(i, a, off as u64, len as u32))
                        .unwrap();
                    expect_recv.push((i, len));
                }
                _ => {
                    let dst = rng.below((1 << 17) as u64 - len as u64) as usize;
                    p.a.qp
                        .post_send(SendWr {
                            wr_id: i,
                            op: SendOp::Write {
                                remote_addr: (1 << 32) + dst as u64,
                                rkey: b,
                                imm: None,
                            },
                            payload: Payload::Sgl(SgList::single(off as u64, len as u32, a)),
                            flags: signaled(),
                        })
                        .unwrap();
                    expect_b[dst..dst + len].copy_from_slice(&p.a.mem.bytes(a)[off..off + len]);
                }
            }
            n_ops += 1;
            if rng.below(5) == 0 {
                p.run();
            }
        }
        p.run();
        assert_eq!(p.a.send_wc.len(), n_ops);
        assert!(p.a.send_wc.iter().all(|w| w.status == WcStatus::Success));
        assert_eq!(
            &p.b.mem.bytes(b)[..1 << 17],
            &expect_b[..1 << 17],
            "seed {seed}"
        );
        let got: Vec<_> =
            p.b.recv_wc
                .iter()
                .map(|w| (w.wr_id, w.byte_len as usize))
                .collect();
        assert_eq!(got, expect_recv);
        direct += p.direct_octets;
    }
    direct
}

#[test]
fn local_protection_error_fails_the_qp() {
    let mut p = Pair::rc(111);
    let a = p.a.mem.register(0, 0x1000, 64, RW);
    p.a.qp.post_send(send(1, a, 0x1000 + 60, 8)).unwrap();
    p.a.qp.post_send(send(2, a, 0x1000, 8)).unwrap();
    p.run();
    assert_eq!(p.a.send_wc[0].status, WcStatus::LocProtErr);
    assert_eq!(p.a.send_wc[1].status, WcStatus::WrFlushErr);
    assert_eq!(p.a.qp.state(), RcState::Error);
}

#[test]
fn probe_is_a_harmless_zero_length_read() {
    let mut p = Pair::rc(121);
    let a = p.a.mem.register(0, 0, 64, RW);
    let b = p.b.mem.register(0, 0, 64, RW);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 5,
            sgl: SgList::single(0, 64, b),
        })
        .unwrap();
    p.a.qp.post_send(send(1, a, 0, 8)).unwrap();
    // Nothing has come back from b yet: a probe may go.
    assert!(p.a.qp.send_probe());
    assert!(!p.a.qp.send_probe(), "one probe at a time");
    p.run();
    assert_eq!(p.a.send_wc.len(), 1, "the probe completes nothing");
    assert_eq!(p.b.recv_wc.len(), 1, "the probe consumes no receive");
    assert_eq!(p.a.qp.state(), RcState::Rts);
    assert_eq!(p.b.qp.state(), RcState::Rts);
    // b answered the probe, so a has heard from it: no more probes.
    assert!(p.a.qp.received_any());
    assert!(!p.a.qp.send_probe());
}

/// One receiver of the fast-path comparison: its memory (receive region
/// `b` at 0x8000, a victim region for Send with Invalidate), its posted
/// receives or shared receive queue, and what it produced.
struct Rx {
    end: End,
    srq: Option<RecvQueue>,
    b: u32,
    victim: u32,
    sent_back: Vec<u8>,
}

impl Rx {
    fn new(crc: bool, case: u32) -> Rx {
        let mut end = End::new(RcConfig {
            crc,
            ..RcConfig::default()
        });
        let b = end.mem.register(0, 0x8000, 16384, RW);
        let victim = end.mem.register(0, 0x10000, 64, RW);
        let mut rx = Rx {
            end,
            srq: None,
            b,
            victim,
            sent_back: Vec::new(),
        };
        let one = |wr_id: u64, sgl: SgList| RecvWr { wr_id, sgl };
        match case {
            // Too small for the 64-octet Send.
            1 => rx.post(one(7, SgList::single(0x8000, 16, b))),
            // No receive at all.
            2 => {}
            // A receive whose key names no region.
            3 => rx.post(one(7, SgList::single(0x8000, 4096, 0xdead_0001))),
            // A shared receive queue with its limit armed.
            4 => {
                let mut q = RecvQueue::new(16);
                for k in 0..6 {
                    q.post(one(20 + k, SgList::single(0x8000 + k * 2048, 2048, b)))
                        .unwrap();
                }
                q.arm_limit(3);
                rx.srq = Some(q);
            }
            // A receive scattered over two pieces.
            8 => {
                let sgl = SgList::from_slice(&[
                    Sge {
                        addr: 0x8000,
                        length: 300,
                        lkey: b,
                    },
                    Sge {
                        addr: 0x9000,
                        length: 500,
                        lkey: b,
                    },
                ])
                .unwrap();
                rx.post(one(7, sgl));
                rx.post(one(8, SgList::single(0xa000, 4096, b)));
            }
            _ => {
                for k in 0..6 {
                    rx.post(one(10 + k, SgList::single(0x8000 + k * 2048, 2048, b)));
                }
            }
        }
        rx
    }

    fn post(&mut self, wr: RecvWr) {
        self.end.qp.post_recv(wr).unwrap();
    }

    fn feed(&mut self, data: &[u8]) {
        match &mut self.srq {
            Some(q) => self
                .end
                .qp
                .handle_bytes_with_srq(data, &mut self.end.mem, q),
            None => self.end.qp.handle_bytes(data, &mut self.end.mem),
        }
    }

    fn finish(&mut self) {
        self.end.drain();
        self.end
            .qp
            .poll_transmit(&mut self.end.mem, &mut self.sent_back)
            .unwrap();
    }
}

/// The receive shortcut for whole one-segment Sends and RDMA Writes
/// (`RcQp::rx_shortcut`) changes nothing a peer or the application can see: the same stream is
/// fed to two receivers, all at once (whole FPDUs: the shortcut wherever
/// it applies) and one octet at a time (never a whole FPDU: the general
/// path), with and without CRC, and both must end with the same
/// completions, events, state, memory and answer on the wire — for the
/// Sends the shortcut takes and for every case it must leave alone (too
/// small or missing receive, a bad key, an SRQ whose limit fires, Send
/// with Immediate, Send with Invalidate, multi-FPDU and zero-length Sends,
/// a receive of two pieces; Writes of one and several FPDUs, empty, with
/// immediate data, to a bad STag and out of bounds).
#[test]
fn receive_shortcut_matches_the_general_path() {
    for crc in [true, false] {
        for case in 0..12u32 {
            let mut tx = End::new(RcConfig {
                crc,
                ..RcConfig::default()
            });
            let a = tx.mem.register(0, 0, 8192, RW);
            tx.mem
                .bytes_mut(a)
                .copy_from_slice(&pattern(8192, case as u8));
            let rx_probe = Rx::new(crc, case);
            let (victim, rkey) = (rx_probe.victim, rx_probe.b);
            let write = |wr_id: u64, len: u32, raddr: u64, rkey: u32, imm: Option<u32>| SendWr {
                op: SendOp::Write {
                    remote_addr: raddr,
                    rkey,
                    imm,
                },
                ..send(wr_id, a, 200, len)
            };
            let mut wrs = vec![send(1, a, 0, 64)];
            match case {
                0 | 4 => {
                    for (k, len) in [0u32, 1, 700, 1400, 1436, 1500].into_iter().enumerate() {
                        let mut w = send(2 + k as u64, a, 64 * k as u64, len);
                        w.flags.solicited = k % 2 == 1;
                        wrs.push(w);
                    }
                }
                5 => wrs.insert(
                    0,
                    SendWr {
                        op: SendOp::Send {
                            imm: Some(0x1234_5678),
                            invalidate: None,
                        },
                        ..send(9, a, 100, 40)
                    },
                ),
                6 => wrs.insert(
                    0,
                    SendWr {
                        op: SendOp::Send {
                            imm: None,
                            invalidate: Some(victim),
                        },
                        ..send(9, a, 100, 40)
                    },
                ),
                8 => wrs = vec![send(1, a, 0, 700), send(2, a, 1000, 64)],
                9 => {
                    wrs = vec![
                        write(1, 64, 0x8000 + 100, rkey, None),
                        write(2, 0, 0x8000, rkey, None),
                        write(3, 3000, 0x9000, rkey, None),
                        write(4, 200, 0xa000, rkey, Some(77)),
                        write(5, 1400, 0xb000, rkey, None),
                        send(6, a, 0, 64),
                    ]
                }
                10 => wrs = vec![write(1, 64, 0x8000, 0xdead_0001, None), send(2, a, 0, 8)],
                11 => wrs = vec![write(1, 64, 0x8000 + 16380, rkey, None), send(2, a, 0, 8)],
                _ => {}
            }
            for w in wrs {
                tx.qp.post_send(w).unwrap();
            }
            let mut wire = Vec::new();
            tx.qp.poll_transmit(&mut tx.mem, &mut wire).unwrap();
            assert!(!wire.is_empty());

            let mut whole = Rx::new(crc, case);
            whole.feed(&wire);
            whole.finish();
            let mut octets = Rx::new(crc, case);
            for b in wire.chunks(1) {
                octets.feed(b);
            }
            octets.finish();

            let what = format!("crc {crc}, case {case}");
            assert_eq!(whole.end.recv_wc, octets.end.recv_wc, "{what}");
            assert_eq!(whole.end.events, octets.end.events, "{what}");
            assert_eq!(whole.end.qp.state(), octets.end.qp.state(), "{what}");
            assert_eq!(
                whole.sent_back, octets.sent_back,
                "{what}: answer on the wire"
            );
            assert_eq!(
                whole.end.mem.bytes(whole.b),
                octets.end.mem.bytes(octets.b),
                "{what}: receive memory"
            );
            assert_eq!(
                whole.srq.as_ref().map(|q| q.len()),
                octets.srq.as_ref().map(|q| q.len()),
                "{what}"
            );
            // The cases the shortcut takes did complete successfully.
            if matches!(case, 0 | 4 | 8 | 9) {
                assert!(
                    whole
                        .end
                        .recv_wc
                        .iter()
                        .all(|c| c.status == WcStatus::Success)
                        && !whole.end.recv_wc.is_empty(),
                    "{what}: {:?}",
                    whole.end.recv_wc
                );
            }
            if matches!(case, 1 | 2 | 3 | 10 | 11) {
                assert_eq!(whole.end.qp.state(), RcState::Error, "{what}");
            }
            if case == 4 {
                assert!(
                    whole.end.events.contains(&RcEvent::RecvLimitReached),
                    "{what}"
                );
            }
        }
    }
}

/// A socket with `space` octets of room: takes what fits, `WouldBlock`
/// when full, or fails every call (`broken`). Counts its plain `write`
/// calls (the transmit shortcut's) apart from vectored ones.
struct Sock {
    buf: Vec<u8>,
    space: usize,
    broken: bool,
    plain_writes: usize,
}
impl Sock {
    fn new(space: usize, broken: bool) -> Sock {
        Sock {
            buf: Vec::new(),
            space,
            broken,
            plain_writes: 0,
        }
    }
}
impl io::Write for Sock {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.plain_writes += 1;
        self.write_vectored(&[io::IoSlice::new(b)])
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        if self.broken {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        if self.space == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut n = 0;
        for b in bufs {
            let take = self.space.min(b.len());
            self.buf.extend_from_slice(&b[..take]);
            self.space -= take;
            n += take;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `post_send_and_transmit` (whose shortcut frames a lone small Send or
/// Write into one buffer and writes it with one call) leaves exactly what
/// `post_send` + `poll_transmit` leave: the same octets on the wire, the
/// same completions, events, state and wish to transmit, after every post
/// and every later `poll_transmit` — with and without CRC, on a socket
/// with room for everything, one that takes a few octets at a time, one
/// that is full at first, and one that fails. The work requests mix what
/// the shortcut takes (Sends of 0-304 octets, SE, unsignaled, inline,
/// two-piece, Writes) with what it must leave alone (too large for one
/// small FPDU, a bad lkey, Immediate Data, Invalidate, a Read, a Send
/// behind a Read still waiting for its response). A bad lkey then reports
/// on its own work request, not on the Read outstanding ahead of it.
#[test]
fn transmit_shortcut_matches_the_general_path() {
    for crc in [true, false] {
        // (room at first, room added per step, broken)
        for (space, step, broken) in [
            (usize::MAX, 0, false),
            (5, 7, false),
            (0, 40, false),
            (usize::MAX, 0, true),
        ] {
            let cfg = RcConfig {
                crc,
                softrdma_ext: true,
                ..RcConfig::default()
            };
            let mut short = End::new(cfg);
            let mut general = End::new(cfg);
            let mut keys = (0, 0);
            for e in [&mut short, &mut general] {
                let a = e.mem.register(0, 0, 4096, RW);
                e.mem.bytes_mut(a).copy_from_slice(&pattern(4096, 9));
                let i = e.mem.register(0, 0x10000, 64, RW);
                keys = (a, i);
            }
            let (a, _) = keys;
            let two = SgList::from_slice(&[
                Sge {
                    addr: 10,
                    length: 30,
                    lkey: a,
                },
                Sge {
                    addr: 100,
                    length: 0,
                    lkey: 0xdead,
                },
                Sge {
                    addr: 500,
                    length: 70,
                    lkey: a,
                },
            ])
            .unwrap();
            let write = |wr_id: u64, len: u32| SendWr {
                op: SendOp::Write {
                    remote_addr: 0x8000 + u64::from(len),
                    rkey: 0x77,
                    imm: None,
                },
                ..send(wr_id, a, 40, len)
            };
            let mut wrs = vec![
                send(1, a, 0, 64),
                send(2, a, 1, 0),
                send(3, a, 2, 1),
                SendWr {
                    flags: SendFlags {
                        solicited: true,
                        ..signaled()
                    },
                    ..send(4, a, 3, 64)
                },
                SendWr {
                    flags: SendFlags::default(),
                    ..send(5, a, 4, 200)
                },
                // The largest Send that fits the shortcut's buffer, and
                // one octet more.
                send(6, a, 5, 304),
                send(7, a, 6, 305),
                send(8, a, 7, 1000),
                SendWr {
                    payload: Payload::Inline(InlineData::new(&pattern(100, 3)).unwrap()),
                    ..send(9, a, 0, 0)
                },
                SendWr {
                    payload: Payload::Sgl(two),
                    ..send(10, a, 0, 0)
                },
                write(11, 64),
                write(12, 0),
                write(13, 310),
                SendWr {
                    op: SendOp::Send {
                        imm: Some(5),
                        invalidate: None,
                    },
                    ..send(14, a, 8, 16)
                },
                SendWr {
                    op: SendOp::Send {
                        imm: None,
                        invalidate: Some(0x1234),
                    },
                    ..send(15, a, 9, 16)
                },
                SendWr {
                    op: SendOp::Read {
                        remote_addr: 0x9000,
                        rkey: 0x55,
                    },
                    ..send(16, a, 3000, 32)
                },
                // Behind a Read still outstanding: the general way.
                send(17, a, 10, 8),
            ];
            if !broken {
                // A bad lkey fails the QP: last.
                wrs.push(send(18, 0xbad, 0, 8));
                wrs.push(send(19, a, 0, 8));
            }
            let mut s_sock = Sock::new(space, broken);
            let mut g_sock = Sock::new(space, broken);
            let mut taken = Vec::new();
            for (k, wr) in wrs.into_iter().enumerate() {
                let what = format!("crc {crc}, space {space}/{step}, broken {broken}, wr {k}");
                let before = s_sock.plain_writes;
                let rs = short
                    .qp
                    .post_send_and_transmit(wr, &mut short.mem, &mut s_sock)
                    .unwrap();
                if s_sock.plain_writes > before {
                    taken.push(wr.wr_id);
                }
                general.qp.post_send(wr).unwrap();
                let rg = general.qp.poll_transmit(&mut general.mem, &mut g_sock);
                assert_eq!(
                    rs.as_ref().map_err(|e| e.kind()),
                    rg.as_ref().map_err(|e| e.kind()),
                    "{what}"
                );
                if rs.is_err() {
                    short.qp.handle_llp_closed();
                    general.qp.handle_llp_closed();
                }
                for _ in 0..3 {
                    short.drain();
                    general.drain();
                    assert_eq!(s_sock.buf, g_sock.buf, "{what}: wire");
                    assert_eq!(short.send_wc, general.send_wc, "{what}: completions");
                    assert_eq!(short.events, general.events, "{what}: events");
                    assert_eq!(short.qp.state(), general.qp.state(), "{what}");
                    assert_eq!(
                        short.qp.wants_transmit(),
                        general.qp.wants_transmit(),
                        "{what}"
                    );
                    // The socket drains a little; both ends write on.
                    s_sock.space = s_sock.space.saturating_add(step);
                    g_sock.space = g_sock.space.saturating_add(step);
                    let rs = short.qp.poll_transmit(&mut short.mem, &mut s_sock);
                    let rg = general.qp.poll_transmit(&mut general.mem, &mut g_sock);
                    assert_eq!(rs.is_ok(), rg.is_ok(), "{what}");
                }
            }
            // Everything written in the end (unless broken).
            for _ in 0..1000 {
                s_sock.space = s_sock.space.saturating_add(step);
                g_sock.space = g_sock.space.saturating_add(step);
                let _ = short.qp.poll_transmit(&mut short.mem, &mut s_sock);
                let _ = general.qp.poll_transmit(&mut general.mem, &mut g_sock);
            }
            short.drain();
            general.drain();
            let what = format!("crc {crc}, space {space}/{step}, broken {broken}");
            assert_eq!(s_sock.buf, g_sock.buf, "{what}: wire");
            assert_eq!(short.send_wc, general.send_wc, "{what}: completions");
            assert_eq!(short.events, general.events, "{what}: events");
            // The shortcut took the small plain Sends and Writes before the
            // Read — only those, and only while the QP was idle: on a socket
            // that keeps up, all of them; on one that is full at first but
            // soon drains, those after the first message went out; on one
            // that takes a few octets at a time (or fails), the first only.
            let expect: &[u64] = match (broken, space, step) {
                (false, usize::MAX, _) => &[1, 2, 3, 4, 5, 6, 9, 10, 11, 12],
                (false, 0, _) => &[1, 2, 3, 4, 5, 6],
                _ => &[1],
            };
            assert_eq!(taken, expect, "{what}: taken by the shortcut");
            if broken {
                assert!(short
                    .send_wc
                    .iter()
                    .all(|c| c.status == WcStatus::WrFlushErr));
                assert!(s_sock.buf.is_empty());
                continue;
            }
            // A receiver takes the stream: every message arrives intact up
            // to the bad lkey, which failed the QP.
            assert_eq!(short.qp.state(), RcState::Error, "{what}");
            let statuses: Vec<(u64, WcStatus)> =
                short.send_wc.iter().map(|c| (c.wr_id, c.status)).collect();
            // The bad lkey's own work request reports it; the Read still
            // waiting for its response, and what follows, are flushed. (On
            // a slow socket the bad one is framed while earlier messages
            // still wait to be written: those are flushed too.)
            assert!(statuses.contains(&(18, WcStatus::LocProtErr)), "{what}");
            assert!(statuses.contains(&(16, WcStatus::WrFlushErr)), "{what}");
            if space != usize::MAX {
                continue;
            }
            let mut expect: Vec<(u64, WcStatus)> = [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
                .into_iter()
                .map(|id| (id, WcStatus::Success))
                .collect();
            expect.extend([
                (16, WcStatus::WrFlushErr),
                (17, WcStatus::WrFlushErr),
                (18, WcStatus::LocProtErr),
                (19, WcStatus::WrFlushErr),
            ]);
            assert_eq!(statuses, expect, "{what}");
        }
    }
}

/// A sink that takes everything and records the octets of each call.
#[derive(Default)]
struct Batches(Vec<usize>);
impl io::Write for Batches {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[io::IoSlice::new(b)])
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let n = bufs.iter().map(|b| b.len()).sum();
        self.0.push(n);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One vectored write carries at most 16 FPDUs; with CRC also at most
/// 256 KiB of them (a batch is read by its CRC when framed and by the
/// kernel's copy when written, and stays in cache between the two), while
/// without CRC nothing is read twice and a 1 MiB Write of 17 FPDUs of
/// 64 986 octets goes in two calls, 16 FPDUs and one — fewer system calls
/// for the same octets (RC `write_bw` 1 MiB without CRC: faster in 8 of 8
/// alternated runs; `docs/engine.md`, "RC: transmit and receive").
#[test]
fn transmit_batches_are_bounded_in_octets_only_with_crc() {
    const MSG: u32 = 1 << 20;
    for crc in [true, false] {
        let cfg = RcConfig {
            crc,
            max_ulpdu: 65_000,
            ..RcConfig::default()
        };
        let mut e = End::new(cfg);
        let a = e.mem.register(0, 0, MSG as usize, RW);
        let wr = SendWr {
            op: SendOp::Write {
                remote_addr: 0x1_0000_0000,
                rkey: 0x77,
                imm: None,
            },
            ..send(1, a, 0, MSG)
        };
        e.qp.post_send(wr).unwrap();
        let mut out = Batches::default();
        let total = e.qp.poll_transmit(&mut e.mem, &mut out).unwrap();
        let payload = 65_000 - 14;
        assert_eq!((MSG as usize).div_ceil(payload), 17);
        assert!(total > MSG as usize, "crc {crc}: the whole Write went out");
        assert_eq!(out.0.iter().sum::<usize>(), total);
        if crc {
            assert!(
                out.0.len() >= 4
                    && out.0[..out.0.len() - 1]
                        .iter()
                        .all(|&n| (1 << 17..=(1 << 18) + 65_536).contains(&n)),
                "with CRC batches of about 256 KiB: {:?}",
                out.0
            );
        } else {
            assert_eq!(out.0.len(), 2, "16 FPDUs, then one: {:?}", out.0);
            assert!(out.0[0] >= 16 * payload && out.0[1] < 65_536, "{:?}", out.0);
        }
    }
}

/// As [`Pair::run`], but a receiver paused for want of a receive
/// (`RcConfig::rnr_wait`) is not fed (as the engine stops reading its
/// socket): what is in flight to it stays on the wire.
fn run_holding_back(p: &mut Pair) {
    for _ in 0..1_000_000 {
        let mut moved = false;
        for dir in 0..2 {
            let (src, dst) = if dir == 0 {
                (&mut p.a, &mut p.b)
            } else {
                (&mut p.b, &mut p.a)
            };
            let mut pipe = Pipe {
                buf: std::mem::take(&mut dst.wire_in),
                rng: &mut p.rng,
            };
            src.qp
                .poll_transmit(&mut src.mem, &mut pipe)
                .expect("pipe never fails");
            dst.wire_in = pipe.buf;
            if src.qp.wants_transmit() {
                moved = true;
            }
            while !dst.wire_in.is_empty() && !dst.qp.rx_paused() {
                moved = true;
                let n = 1 + p.rng.below(dst.wire_in.len().min(3000) as u64) as usize;
                if let Some(d) = dst.qp.rx_direct().filter(|_| p.direct) {
                    let n = n.min(d.len);
                    let chunk: Vec<u8> = dst.wire_in.drain(..n).collect();
                    place_direct(&mut dst.mem, &d, &chunk);
                    assert!(dst.qp.rx_direct_placed(n, &[&chunk]));
                    continue;
                }
                if let Some(space) = dst.qp.rx_stash_space() {
                    let n = n.min(space.len());
                    space[..n].copy_from_slice(&dst.wire_in[..n]);
                    dst.wire_in.drain(..n);
                    assert!(dst.qp.rx_stash_filled(n, &mut dst.mem));
                    continue;
                }
                let chunk: Vec<u8> = dst.wire_in.drain(..n).collect();
                dst.qp.handle_bytes(&chunk, &mut dst.mem);
            }
        }
        p.a.drain();
        p.b.drain();
        if !moved {
            return;
        }
    }
    panic!("pair did not settle");
}

/// 100 messages that each take a receive (Sends, Sends with immediate,
/// Writes with immediate; one FPDU or several) against one posted
/// receive: with `rnr_wait` the receiver pauses instead of terminating,
/// and receives posted one at a time take every message, in order, intact.
#[test]
fn a_send_without_receive_waits_for_one_with_rnr_wait() {
    const N: u64 = 100;
    for (k, held_back) in [(0u64, false), (1, true)] {
        for make in [Pair::rc as fn(u64) -> Pair, Pair::direct, Pair::direct_crc] {
            for len in [8usize, 5000] {
                let mut p = make(900 + k * 10 + len as u64);
                p.a.qp = RcQp::new(RcConfig {
                    rnr_wait: true,
                    ..*p.a.qp.config()
                });
                p.b.qp = RcQp::new(RcConfig {
                    rnr_wait: true,
                    ..*p.b.qp.config()
                });
                let total = N as usize * len;
                let a = p.a.mem.register(0, 0, total, RW);
                for i in 0..N as usize {
                    p.a.mem.bytes_mut(a)[i * len..(i + 1) * len]
                        .copy_from_slice(&pattern(len, i as u8));
                }
                let b = p.b.mem.register(0, 0x100_0000, total, RW);
                let wr = |i: u64| RecvWr {
                    wr_id: 1000 + i,
                    sgl: SgList::single(0x100_0000 + i * len as u64, len as u32, b),
                };
                p.b.qp.post_recv(wr(0)).unwrap();
                for i in 0..N {
                    let at = i * len as u64;
                    let op = match i % 3 {
                        0 => SendOp::Send {
                            imm: None,
                            invalidate: None,
                        },
                        1 => SendOp::Send {
                            imm: Some(i as u32),
                            invalidate: None,
                        },
                        _ => SendOp::Write {
                            remote_addr: 0x100_0000 + at,
                            rkey: b,
                            imm: Some(i as u32),
                        },
                    };
                    p.a.qp
                        .post_send(SendWr {
                            wr_id: i,
                            op,
                            payload: Payload::Sgl(SgList::single(at, len as u32, a)),
                            flags: signaled(),
                        })
                        .unwrap();
                }
                let step = |p: &mut Pair| {
                    if held_back {
                        run_holding_back(p)
                    } else {
                        p.run()
                    }
                };
                step(&mut p);
                assert!(p.b.qp.rx_paused(), "the second message waits");
                assert_eq!(p.b.recv_wc.len(), 1);
                for i in 1..N {
                    assert!(p.b.qp.rx_paused());
                    p.b.qp.post_recv(wr(i)).unwrap();
                    p.b.qp.rx_resume(&mut p.b.mem);
                    step(&mut p);
                    assert_eq!(p.b.recv_wc.len() as u64, i + 1, "one message per receive");
                }
                assert!(!p.b.qp.rx_paused());
                assert_eq!(p.b.qp.rx_held(), 0);
                for (i, wc) in p.b.recv_wc.iter().enumerate() {
                    let i = i as u64;
                    let (opcode, imm) = match i % 3 {
                        0 => (WcOpcode::Recv, None),
                        1 => (WcOpcode::Recv, Some(i as u32)),
                        _ => (WcOpcode::RecvRdmaWithImm, Some(i as u32)),
                    };
                    assert_eq!(
                        (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.imm),
                        (1000 + i, WcStatus::Success, opcode, len as u32, imm),
                        "message {i}"
                    );
                }
                assert_eq!(p.b.mem.bytes(b), p.a.mem.bytes(a), "every octet in place");
                assert_eq!(p.a.send_wc.len() as u64, N);
                assert!(p.a.send_wc.iter().all(|w| w.status == WcStatus::Success));
                assert!(p.a.events.is_empty() && p.b.events.is_empty());
                assert_eq!(p.a.qp.state(), RcState::Rts);
                assert_eq!(p.b.qp.state(), RcState::Rts);
            }
        }
    }
}

/// While paused for a receive, a Read Request that arrived before the
/// waiting Send is answered, and one behind it waits for the Send.
#[test]
fn reads_before_a_waiting_send_are_answered_and_later_ones_wait() {
    let cfg = RcConfig {
        rnr_wait: true,
        ..RcConfig::default()
    };
    let mut p = Pair::new(77, cfg, cfg);
    let a = p.a.mem.register(0, 0, 4096, RW);
    let b = p.b.mem.register(0, 0x8000, 4096, RW);
    p.b.mem.bytes_mut(b).copy_from_slice(&pattern(4096, 9));
    let read = |wr_id: u64, at: u64| SendWr {
        wr_id,
        op: SendOp::Read {
            remote_addr: 0x8000 + at,
            rkey: b,
        },
        payload: Payload::Sgl(SgList::single(at, 100, a)),
        flags: signaled(),
    };
    p.a.qp.post_send(read(1, 0)).unwrap();
    p.a.qp.post_send(send(2, a, 2048, 16)).unwrap();
    p.a.qp.post_send(read(3, 1000)).unwrap();
    run_holding_back(&mut p);
    assert!(p.b.qp.rx_paused());
    let ids: Vec<u64> = p.a.send_wc.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![1, 2], "the Read before the Send completed");
    assert_eq!(p.a.mem.bytes(a)[..100], pattern(4096, 9)[..100]);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 50,
            sgl: SgList::single(0x8000 + 3000, 16, b),
        })
        .unwrap();
    p.b.qp.rx_resume(&mut p.b.mem);
    run_holding_back(&mut p);
    assert!(!p.b.qp.rx_paused());
    let ids: Vec<u64> = p.a.send_wc.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![1, 2, 3]);
    assert_eq!(p.b.recv_wc.len(), 1);
    assert_eq!(p.a.mem.bytes(a)[1000..1100], pattern(4096, 9)[1000..1100]);
    assert!(p.a.events.is_empty() && p.b.events.is_empty());
}

/// Without `rnr_wait` the same stream still ends with the Terminate.
#[test]
fn without_rnr_wait_a_send_without_receive_still_terminates() {
    let mut p = Pair::rc(79);
    assert!(!p.b.qp.config().rnr_wait);
    let a = p.a.mem.register(0, 0, 64, RW);
    let b = p.b.mem.register(0, 0x8000, 64, RW);
    p.b.qp
        .post_recv(RecvWr {
            wr_id: 9,
            sgl: SgList::single(0x8000, 64, b),
        })
        .unwrap();
    for i in 0..10 {
        p.a.qp.post_send(send(i, a, 0, 8)).unwrap();
    }
    run_holding_back(&mut p);
    assert!(!p.b.qp.rx_paused());
    assert_eq!(p.b.recv_wc.len(), 1);
    assert_eq!(p.b.recv_wc[0].status, WcStatus::Success);
    assert_eq!(p.b.qp.state(), RcState::Error);
    assert!(p.b.events.contains(&RcEvent::Error {
        cause: Some(TerminateCause::DdpUntaggedNoBuffer),
        remote: false
    }));
}
