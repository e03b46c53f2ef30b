//! A peer that goes away never kills the process with SIGPIPE.
//!
//! In its own test binary: SIGPIPE is put back to its default action (as
//! in a C program using the drop-in libibverbs, where no Rust runtime set
//! it to ignored), so a plain `write`/`writev` by the engine on a
//! connection the peer reset would end this process and fail the test.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_engine::{Completion, Context, Cq, Qp, QpCaps};
use softrdma_proto::memory::Access;
use softrdma_proto::rc::RcConfig;
use softrdma_proto::wr::{
    Payload, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

const ALL: Access = Access(1 | 2 | 4 | 8);
const CHUNK: usize = 64 << 10;
const LEN: usize = 64 * CHUNK;

struct End {
    ctx: Context,
    pd: u32,
    cq: Arc<Cq>,
    qp: Qp,
}

fn end(qpn: u32) -> End {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(1024, None);
    let qp = ctx.create_qp(
        qpn,
        pd,
        QpCaps {
            max_send_wr: 512,
            max_recv_wr: 16,
        },
        cq.clone(),
        cq.clone(),
    );
    End { ctx, pd, cq, qp }
}

#[test]
fn writes_to_a_closed_peer_are_errors_not_sigpipe() {
    // SAFETY: restoring the default disposition of one signal; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    for round in 0..20u32 {
        let mut buf = vec![7u8; LEN];
        let a = end(10 + round);
        // SAFETY: `buf` outlives the context (dropped at the end of the round).
        let akey = unsafe {
            a.ctx
                .registry()
                .register(buf.as_mut_ptr(), LEN, buf.as_ptr() as u64, ALL, a.pd)
                .unwrap()
        };
        // The peer is a plain socket that closes at once: the first octets
        // the QP sends after that draw a reset, later writes EPIPE.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (peer, _) = l.accept().unwrap();
        a.qp.attach(s, RcConfig::default(), None).unwrap();
        drop(peer);
        let write = |i: u64| SendWr {
            wr_id: i,
            op: SendOp::Write {
                remote_addr: 0,
                rkey: 1,
                imm: None,
            },
            payload: Payload::Sgl(SgList::single(
                buf.as_ptr() as u64 + (i % 64) * CHUNK as u64,
                CHUNK as u32,
                akey,
            )),
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        };
        let mut out = [Completion {
            wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
            qp_num: 0,
        }; 64];
        let (mut posted, mut done, mut errors) = (0u64, 0u64, 0u64);
        let deadline = Instant::now() + Duration::from_secs(20);
        while posted < 256 || done < posted {
            if posted < 256 {
                match a.qp.post_send(write(posted)) {
                    Ok(()) => posted += 1,
                    Err(_) => posted = 256.max(posted),
                }
            }
            let n = a.cq.poll(&mut out);
            for c in &out[..n] {
                done += 1;
                if c.wc.status != WcStatus::Success {
                    errors += 1;
                }
            }
            if posted >= 256 && done >= posted {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: {done} of {posted} Writes completed"
            );
        }
        // Still here (no SIGPIPE), and the lost peer showed as errors.
        assert!(
            errors > 0,
            "round {round}: every Write to a closed peer succeeded"
        );
        drop(a);
        drop(buf);
    }
}
