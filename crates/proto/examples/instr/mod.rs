//! What `ud_instr` and `rc_instr` share: the message count from the
//! command line, a source and a sink region, the 64-octet Send, the
//! receive reposted after each message and the closing check.

use std::time::Instant;

use softrdma_proto::memory::{Access, VecMemory};
use softrdma_proto::wr::{Payload, RecvWr, SendFlags, SendOp, SendWr, SgList};

/// Payload octets of every Send.
pub const SIZE: u32 = 64;

/// One run's memory and parameters.
pub struct Bench {
    /// Messages to pass (first argument, default 20 000).
    pub n: u64,
    /// Both ends' registered memory.
    pub mem: VecMemory,
    /// The receive the receiver posts (and reposts after each message).
    pub recv: RecvWr,
    src: u32,
    dst: u32,
    sbase: u64,
}

impl Bench {
    /// Reads the message count and registers a patterned source region and
    /// an empty sink region.
    pub fn new() -> Bench {
        let n = std::env::args()
            .nth(1)
            .map_or(20_000, |a| a.parse().expect("message count"));
        let mut mem = VecMemory::new();
        let rw = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
        let (sbase, rbase) = (0x10_0000u64, 0x20_0000u64);
        let src = mem.register(0, sbase, 4096, rw);
        let dst = mem.register(0, rbase, 4096, rw);
        for (i, b) in mem.bytes_mut(src).iter_mut().enumerate() {
            *b = i as u8;
        }
        let recv = RecvWr {
            wr_id: 7,
            sgl: SgList::single(rbase, 256, dst),
        };
        Bench {
            n,
            mem,
            recv,
            src,
            dst,
            sbase,
        }
    }

    /// The signaled 64-octet Send number `wr_id`.
    pub fn send(&self, wr_id: u64) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(self.sbase, SIZE, self.src)),
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        }
    }

    /// Checks the last message landed and prints the time per message.
    pub fn finish(&self, t0: Instant) {
        let per = t0.elapsed().as_nanos() as f64 / self.n as f64;
        assert_eq!(
            self.mem.bytes(self.dst)[..SIZE as usize],
            self.mem.bytes(self.src)[..SIZE as usize]
        );
        println!(
            "{} messages, {per:.0} ns each (both ends, one thread)",
            self.n
        );
    }
}
