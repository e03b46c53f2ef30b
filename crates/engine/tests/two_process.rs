//! Every RC operation between two processes on loopback, sizes 0 B to
//! 64 MiB, data verified end to end. The test binary re-executes itself as
//! the peer (`peer_server`), which answers each request with a Send holding
//! what it observed (a hash of the bytes, the immediate, …).

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::cm::{self, ConnParams, Listener};
use softrdma_engine::{Completion, Context, Cq, Qp, QpCaps};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

const BIG: usize = 64 << 20;
const CTL: usize = 64;
const ALL: Access = Access(1 | 2 | 4 | 8);
const SIG: SendFlags = SendFlags {
    signaled: true,
    solicited: false,
    fence: false,
};
const SIZES: &[usize] = &[0, 1, 13, 1424, 1425, 65536, 1 << 20, BIG];

/// FNV-1a over a byte range.
fn hash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

fn pattern(i: usize, seed: u64) -> u8 {
    ((i as u64).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 7) as u8
}

struct Node {
    ctx: Context,
    cq: std::sync::Arc<Cq>,
    qp: Qp,
    big: Vec<u8>,
    big_key: u32,
    ctl: Vec<u8>,
    ctl_key: u32,
}

fn node() -> Node {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, None);
    let qp = ctx.create_qp(
        3,
        pd,
        QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
        },
        cq.clone(),
        cq.clone(),
    );
    let mut big = vec![0u8; BIG];
    let mut ctl = vec![0u8; 4 * CTL];
    // SAFETY: both buffers live in the Node as long as its context.
    let big_key = unsafe {
        ctx.registry()
            .register(big.as_mut_ptr(), BIG, big.as_ptr() as u64, ALL, pd)
    }
    .unwrap();
    // SAFETY: as above.
    let ctl_key = unsafe {
        ctx.registry()
            .register(ctl.as_mut_ptr(), ctl.len(), ctl.as_ptr() as u64, ALL, pd)
    }
    .unwrap();
    Node {
        ctx,
        cq,
        qp,
        big,
        big_key,
        ctl,
        ctl_key,
    }
}

impl Node {
    fn big_addr(&self) -> u64 {
        self.big.as_ptr() as u64
    }
    fn ctl_addr(&self, slot: usize) -> u64 {
        self.ctl.as_ptr() as u64 + (slot * CTL) as u64
    }
    fn wait(&self) -> Completion {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut out = [Completion {
            wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
            qp_num: 0,
        }];
        loop {
            if self.cq.poll(&mut out) == 1 {
                assert_eq!(out[0].wc.status, WcStatus::Success, "{:?}", out[0]);
                return out[0];
            }
            assert!(Instant::now() < deadline, "no completion within 60 s");
            thread::yield_now();
        }
    }
    fn wait_op(&self, op: WcOpcode, stash: &mut Vec<Completion>) -> Completion {
        if let Some(i) = stash.iter().position(|c| c.wc.opcode == op) {
            return stash.remove(i);
        }
        loop {
            let c = self.wait();
            if c.wc.opcode == op {
                return c;
            }
            stash.push(c);
        }
    }
    fn post_recv_slot(&self, slot: usize, wr_id: u64) {
        self.qp
            .post_recv(RecvWr {
                wr_id,
                sgl: SgList::single(self.ctl_addr(slot), CTL as u32, self.ctl_key),
            })
            .unwrap();
    }
    fn send_words(&self, words: &[u64]) {
        let mut b = [0u8; CTL];
        for (i, w) in words.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        // Slot 3 is the outgoing control buffer.
        let at = 3 * CTL;
        let base = self.ctl.as_ptr() as *mut u8;
        // SAFETY: slot 3 is inside `ctl`; no Rust reference to it is alive.
        unsafe { std::ptr::copy(b.as_ptr(), base.add(at), CTL) };
        self.qp
            .post_send(SendWr {
                wr_id: 9,
                op: SendOp::Send {
                    imm: None,
                    invalidate: None,
                },
                payload: Payload::Sgl(SgList::single(
                    self.ctl_addr(3),
                    8 * words.len() as u32,
                    self.ctl_key,
                )),
                flags: SIG,
            })
            .unwrap();
    }
    fn ctl_words(&self, slot: usize) -> [u64; 8] {
        let mut w = [0u64; 8];
        for (i, x) in w.iter_mut().enumerate() {
            let at = slot * CTL + i * 8;
            // SAFETY: reads inside `ctl` through a raw pointer (peers write it).
            *x = u64::from_le_bytes(unsafe {
                std::ptr::read_volatile(self.ctl.as_ptr().add(at) as *const [u8; 8])
            });
        }
        w
    }
    fn big_hash(&self, off: usize, len: usize) -> u64 {
        // SAFETY: the range is inside `big`; the peer is idle while we hash.
        let s = unsafe { std::slice::from_raw_parts(self.big.as_ptr().add(off), len) };
        hash(s)
    }
}

/// The peer: answers requests until the client disconnects.
#[test]
fn peer_server() {
    let Ok(port) = std::env::var("SOFTRDMA_TWO_PROCESS_PORT") else {
        return;
    };
    let n = node();
    let mut stash = Vec::new();
    // SAFETY: fills our own buffer before any peer can touch it.
    unsafe {
        for i in 0..BIG {
            *(n.big.as_ptr() as *mut u8).add(i) = pattern(i, 2);
        }
    }
    let l = Listener::bind(&n.ctx, ("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    // Exactly one control receive is posted at a time, so a receive posted
    // for a data Send is the next one the peer's Send consumes.
    n.post_recv_slot(0, 0);
    // Private data: our big buffer's address and rkey.
    let mut pd = n.big_addr().to_le_bytes().to_vec();
    pd.extend_from_slice(&n.big_key.to_le_bytes());
    let inc = l.accept().unwrap();
    inc.accept(
        &n.qp,
        &ConnParams {
            private_data: pd,
            ..Default::default()
        },
    )
    .unwrap();
    loop {
        let c = {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut out = [Completion {
                wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
                qp_num: 0,
            }];
            loop {
                if n.cq.poll(&mut out) == 1 {
                    break out[0];
                }
                assert!(Instant::now() < deadline);
                thread::yield_now();
            }
        };
        if c.wc.status == WcStatus::WrFlushErr {
            return; // the client disconnected
        }
        assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
        match c.wc.opcode {
            WcOpcode::Send => continue,
            WcOpcode::RecvRdmaWithImm => {
                // Write with immediate landed: report hash of [0, len) and imm.
                let len = c.wc.byte_len as usize;
                n.post_recv_slot(c.wc.wr_id as usize, c.wc.wr_id);
                n.send_words(&[
                    n.big_hash(0, len),
                    u64::from(c.wc.imm.unwrap_or(0)),
                    len as u64,
                ]);
                n.wait_op(WcOpcode::Send, &mut stash);
            }
            WcOpcode::Recv => {
                let slot = c.wc.wr_id as usize;
                let w = n.ctl_words(slot);
                if w[0] != 2 {
                    n.post_recv_slot(slot, c.wc.wr_id);
                }
                match w[0] {
                    // [1, len]: hash the first `len` octets of big.
                    1 => n.send_words(&[n.big_hash(0, w[1] as usize), 0, w[1]]),
                    // [2, len]: post a receive of `len` into big, then ack;
                    // the next Send lands there and is answered with its hash.
                    2 => {
                        n.qp.post_recv(RecvWr {
                            wr_id: 7,
                            sgl: SgList::single(n.big_addr(), BIG as u32, n.big_key),
                        })
                        .unwrap();
                        n.send_words(&[0]);
                        n.wait_op(WcOpcode::Send, &mut stash);
                        let d = n.wait_op(WcOpcode::Recv, &mut stash);
                        assert_eq!(d.wc.wr_id, 7);
                        n.post_recv_slot(slot, c.wc.wr_id);
                        n.send_words(&[
                            n.big_hash(0, d.wc.byte_len as usize),
                            u64::from(d.wc.imm.unwrap_or(0)),
                            u64::from(d.wc.byte_len),
                        ]);
                    }
                    // [3, off]: report the 8-octet word at `off`.
                    3 => {
                        let mut b = [0u8; 8];
                        // SAFETY: reads inside `big`.
                        unsafe {
                            std::ptr::copy(n.big.as_ptr().add(w[1] as usize), b.as_mut_ptr(), 8)
                        };
                        n.send_words(&[u64::from_ne_bytes(b)]);
                    }
                    other => panic!("unknown request {other}"),
                }
                n.wait_op(WcOpcode::Send, &mut stash);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn every_operation_every_size_between_two_processes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "peer_server", "--nocapture", "--test-threads=1"])
        .env("SOFTRDMA_TWO_PROCESS_PORT", port.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let n = node();
    let mut stash = Vec::new();
    // SAFETY: fills our own buffer before it is registered remotely visible
    // to any peer operation.
    unsafe {
        for i in 0..BIG {
            *(n.big.as_ptr() as *mut u8).add(i) = pattern(i, 1);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let peer_pd = loop {
        match cm::connect(&n.ctx, &n.qp, ("127.0.0.1", port), &ConnParams::default()) {
            Ok(pd) => break pd,
            Err(e) => {
                assert!(Instant::now() < deadline, "peer not reachable: {e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let raddr = u64::from_le_bytes(peer_pd[..8].try_into().unwrap());
    let rkey = u32::from_le_bytes(peer_pd[8..12].try_into().unwrap());
    n.post_recv_slot(0, 0);
    n.post_recv_slot(1, 1);
    let reply = |stash: &mut Vec<Completion>| -> [u64; 8] {
        let c = n.wait_op(WcOpcode::Recv, stash);
        let w = n.ctl_words(c.wc.wr_id as usize);
        n.post_recv_slot(c.wc.wr_id as usize, c.wc.wr_id);
        w
    };
    let big_sgl = |len: usize| SgList::single(n.big_addr(), len as u32, n.big_key);
    for &len in SIZES {
        let mine = n.big_hash(0, len);
        // RDMA Write, then ask the peer to hash what landed.
        n.qp.post_send(SendWr {
            wr_id: 1,
            op: SendOp::Write {
                remote_addr: raddr,
                rkey,
                imm: None,
            },
            payload: Payload::Sgl(big_sgl(len)),
            flags: SIG,
        })
        .unwrap();
        n.wait_op(WcOpcode::RdmaWrite, &mut stash);
        n.send_words(&[1, len as u64]);
        n.wait_op(WcOpcode::Send, &mut stash);
        assert_eq!(reply(&mut stash)[0], mine, "Write of {len}");
        // RDMA Write with immediate.
        n.qp.post_send(SendWr {
            wr_id: 2,
            op: SendOp::Write {
                remote_addr: raddr,
                rkey,
                imm: Some(len as u32 ^ 0xabcd),
            },
            payload: Payload::Sgl(big_sgl(len)),
            flags: SIG,
        })
        .unwrap();
        n.wait_op(WcOpcode::RdmaWrite, &mut stash);
        let r = reply(&mut stash);
        assert_eq!(
            (r[0], r[1], r[2]),
            (mine, u64::from(len as u32 ^ 0xabcd), len as u64),
            "Write with imm of {len}"
        );
        // Send (with immediate) into a receive the peer posts on request.
        for imm in [None, Some(77u32)] {
            n.send_words(&[2]);
            n.wait_op(WcOpcode::Send, &mut stash);
            reply(&mut stash); // the peer's receive is posted
            n.qp.post_send(SendWr {
                wr_id: 3,
                op: SendOp::Send {
                    imm,
                    invalidate: None,
                },
                payload: Payload::Sgl(big_sgl(len)),
                flags: SIG,
            })
            .unwrap();
            n.wait_op(WcOpcode::Send, &mut stash);
            let r = reply(&mut stash);
            assert_eq!(
                (r[0], r[1], r[2]),
                (mine, u64::from(imm.unwrap_or(0)), len as u64),
                "Send {imm:?} of {len}"
            );
        }
        // RDMA Read of the peer's (just overwritten) buffer into our tail
        // half: it must equal what we wrote.
        let half = BIG / 2;
        let rlen = len.min(half);
        n.qp.post_send(SendWr {
            wr_id: 4,
            op: SendOp::Read {
                remote_addr: raddr,
                rkey,
            },
            payload: Payload::Sgl(SgList::single(
                n.big_addr() + half as u64,
                rlen as u32,
                n.big_key,
            )),
            flags: SIG,
        })
        .unwrap();
        n.wait_op(WcOpcode::RdmaRead, &mut stash);
        assert_eq!(
            n.big_hash(half, rlen),
            n.big_hash(0, rlen),
            "Read of {rlen}"
        );
    }
    // Atomics on a word of the peer's buffer.
    let word = raddr + 4096;
    n.send_words(&[3, 4096]);
    n.wait_op(WcOpcode::Send, &mut stash);
    let before = reply(&mut stash)[0];
    n.qp.post_send(SendWr {
        wr_id: 5,
        op: SendOp::FetchAdd {
            remote_addr: word,
            rkey,
            add: 10,
        },
        payload: Payload::Sgl(SgList::single(n.ctl_addr(2), 8, n.ctl_key)),
        flags: SIG,
    })
    .unwrap();
    n.wait_op(WcOpcode::FetchAdd, &mut stash);
    assert_eq!(n.ctl_words(2)[0], before);
    n.qp.post_send(SendWr {
        wr_id: 6,
        op: SendOp::CompareSwap {
            remote_addr: word,
            rkey,
            compare: before.wrapping_add(10),
            swap: 42,
        },
        payload: Payload::Sgl(SgList::single(n.ctl_addr(2), 8, n.ctl_key)),
        flags: SIG,
    })
    .unwrap();
    n.wait_op(WcOpcode::CompSwap, &mut stash);
    assert_eq!(n.ctl_words(2)[0], before.wrapping_add(10));
    n.send_words(&[3, 4096]);
    n.wait_op(WcOpcode::Send, &mut stash);
    assert_eq!(reply(&mut stash)[0], 42);
    n.qp.disconnect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            assert!(s.success(), "peer failed: {s}");
            break;
        }
        assert!(Instant::now() < deadline, "peer did not exit");
        thread::sleep(Duration::from_millis(20));
    }
}
