//! rc_pathcost: the CPU cost of the RC data path against raw TCP, with no
//! waiting at all: one thread drives both ends of a loopback connection
//! in turn, so every poll finds its data already in the socket (loopback
//! TCP delivers inside the sender's `writev`). What is left is the work
//! per message — the figure that cross-core ping-pong latency adds to the
//! wire time — and it is repeatable enough for `perf stat -e
//! instructions:u` or `valgrind --tool=callgrind`.
//!
//! ```sh
//! cargo run --release -p softrdma-engine --example rc_pathcost -- [ITERS] [MSG]
//! ```
//!
//! Three loops of ITERS (default 200000) round trips of MSG (default 64)
//! octets each, timed: raw TCP (`write` + `read` on non-blocking sockets),
//! RC Send (post_send, poll the peer's CQ until the receive completes,
//! repost) and RC Write (post_send, poll the peer's CQ until the memory
//! shows it). Prints ns per one-way message and the ratio to raw TCP,
//! plus how many polls found nothing (should be 0 for Send, 1 per message
//! for Write: the poll that places it completes nothing). A third argument
//! picks loops (`tcp,send,write`), e.g. to count one with `perf stat`;
//! with `write` alone MSG may be up to 60000 (per-octet costs). `empty`
//! (not run by default) times one busy poll that finds nothing: a raw
//! non-blocking `read` against the RC CQ's `poll`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use softrdma_engine::cm::{self, ConnParams, Listener};
use softrdma_engine::config::Config;
use softrdma_engine::{Completion, Context, Cq, Qp, QpCaps};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

const NONE: Completion = Completion {
    wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
    qp_num: 0,
};

struct End {
    _ctx: Context,
    cq: Arc<Cq>,
    qp: Qp,
    _buf: Vec<u8>,
    ptr: *mut u8,
    stag: u32,
}

impl End {
    fn new(cfg: Config) -> End {
        let ctx = Context::with_config(cfg).expect("context");
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(1024, None);
        let caps = QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
        };
        let qp = ctx.create_qp(1, pd, caps, cq.clone(), cq.clone());
        let mut buf = vec![0u8; 1 << 17];
        let ptr = buf.as_mut_ptr();
        let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        // SAFETY: `buf` lives in the End and is never moved or resized; the
        // End is dropped (QP gone) only at the end of main.
        let stag = unsafe { ctx.registry().register(ptr, buf.len(), ptr as u64, acc, pd) }
            .expect("register");
        End {
            _ctx: ctx,
            cq,
            qp,
            _buf: buf,
            ptr,
            stag,
        }
    }

    fn sgl(&self, off: usize, len: usize) -> SgList {
        SgList::single(self.ptr as u64 + off as u64, len as u32, self.stag)
    }

    fn byte(&self, off: usize) -> u8 {
        // SAFETY: inside the live buffer; volatile: the engine places into it.
        unsafe { self.ptr.add(off).read_volatile() }
    }
}

fn main() {
    let iters: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("ITERS"))
        .unwrap_or(200_000);
    let msg: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().expect("MSG"))
        .unwrap_or(64);
    // Which loops to time: any of "tcp,send,write" (default all), so that
    // `perf stat` can count one of them.
    let which = std::env::args().nth(3).unwrap_or("tcp,send,write".into());
    let run = |name: &str| which.split(',').any(|w| w == name);
    let cap = if run("tcp") || run("send") {
        4096
    } else {
        60_000
    };
    assert!(
        (1..=cap).contains(&msg),
        "MSG in 1..={cap} (60000 with write only)"
    );
    let cfg = Config::from_env().expect("SOFTRDMA_*");

    // Raw TCP.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut b, _) = l.accept().unwrap();
    for s in [&a, &b] {
        s.set_nodelay(true).unwrap();
        s.set_nonblocking(true).unwrap();
    }
    let out = vec![7u8; msg];
    let mut inb = vec![0u8; msg];
    let mut empty = 0u64;
    let mut one = |from: &mut TcpStream, to: &mut TcpStream, empty: &mut u64| {
        from.write_all(&out).unwrap();
        let mut got = 0;
        while got < msg {
            match to.read(&mut inb[got..]) {
                Ok(n) => got += n,
                Err(_) => *empty += 1,
            }
        }
    };
    for _ in 0..if run("tcp") { 1000 } else { 0 } {
        one(&mut a, &mut b, &mut empty);
        one(&mut b, &mut a, &mut empty);
    }
    let t = Instant::now();
    for _ in 0..if run("tcp") { iters } else { 0 } {
        one(&mut a, &mut b, &mut empty);
        one(&mut b, &mut a, &mut empty);
    }
    let tcp = t.elapsed().as_nanos() as f64 / (2 * iters) as f64;
    println!("raw TCP {msg} B        {tcp:8.1} ns/msg  (empty reads {empty})");

    // Raw TCP framed like an FPDU: one sendmsg(MSG_NOSIGNAL) of three
    // io-vectors (20-octet header, payload, 4-octet trailer) against one
    // write of the same octets gathered first: what the vectored write
    // itself costs in the kernel.
    for (label, gather) in [("sendmsg x3", false), ("gather+send", true)] {
        if !run("tcpv") {
            break;
        }
        let hdr = [1u8; 20];
        let trl = [2u8; 4];
        let total = 20 + msg + 4;
        let mut flat = vec![0u8; total];
        let mut inb = vec![0u8; 256 * 1024];
        let mut onev = |from: &TcpStream, to: &mut TcpStream| {
            let n = if gather {
                flat[..20].copy_from_slice(&hdr);
                flat[20..20 + msg].copy_from_slice(&out);
                flat[20 + msg..].copy_from_slice(&trl);
                // SAFETY: `flat` is live for the call; the fd is the stream's.
                unsafe {
                    libc::send(
                        std::os::fd::AsRawFd::as_raw_fd(from),
                        flat.as_ptr().cast(),
                        total,
                        libc::MSG_NOSIGNAL,
                    )
                }
            } else {
                let iov = [
                    std::io::IoSlice::new(&hdr),
                    std::io::IoSlice::new(&out),
                    std::io::IoSlice::new(&trl),
                ];
                // SAFETY: all-zero is a valid msghdr.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_iov = iov.as_ptr() as *mut libc::iovec;
                h.msg_iovlen = 3;
                // SAFETY: `h` points at live io-vectors; the fd is the stream's.
                unsafe {
                    libc::sendmsg(
                        std::os::fd::AsRawFd::as_raw_fd(from),
                        &h,
                        libc::MSG_NOSIGNAL,
                    )
                }
            };
            assert_eq!(n as usize, total);
            let mut got = 0;
            while got < total {
                if let Ok(n) = to.read(&mut inb[..]) {
                    got += n;
                }
            }
        };
        for _ in 0..1000 {
            onev(&a, &mut b);
            onev(&b, &mut a);
        }
        let t = Instant::now();
        for _ in 0..iters {
            onev(&a, &mut b);
            onev(&b, &mut a);
        }
        let v = t.elapsed().as_nanos() as f64 / (2 * iters) as f64;
        println!("raw TCP {label} {msg} B {v:8.1} ns/msg");
    }

    // RC: A listens, B connects from a helper thread.
    let ea = End::new(cfg.clone());
    let eb = End::new(cfg);
    let lis = Listener::bind(&ea._ctx, "127.0.0.1:0").unwrap();
    let addr = lis.local_addr().unwrap();
    for k in 0..16 {
        ea.qp
            .post_recv(RecvWr {
                wr_id: k,
                sgl: ea.sgl(4096 + k as usize * 4096, 4096),
            })
            .unwrap();
        eb.qp
            .post_recv(RecvWr {
                wr_id: k,
                sgl: eb.sgl(4096 + k as usize * 4096, 4096),
            })
            .unwrap();
    }
    let (bqp, bctx) = (eb.qp.clone(), eb._ctx.clone());
    let h = thread::spawn(move || {
        cm::connect(&bctx, &bqp, addr, &ConnParams::default()).expect("connect");
    });
    lis.accept()
        .expect("incoming")
        .accept(&ea.qp, &ConnParams::default())
        .expect("accept");
    h.join().unwrap();

    let mut outc = [NONE; 16];
    let mut polls_empty = 0u64;
    let send = |from: &End, to: &End, signaled: bool, empty: &mut u64, outc: &mut [Completion]| {
        from.qp
            .post_send(SendWr {
                wr_id: 1,
                op: SendOp::Send {
                    imm: None,
                    invalidate: None,
                },
                payload: Payload::Sgl(from.sgl(0, msg)),
                flags: SendFlags {
                    signaled,
                    ..Default::default()
                },
            })
            .unwrap();
        loop {
            let n = to.cq.poll(outc);
            if n == 0 {
                *empty += 1;
                continue;
            }
            let mut got = false;
            for c in &outc[..n] {
                assert_eq!(c.wc.status, WcStatus::Success, "{:?}", c.wc);
                if c.wc.opcode == WcOpcode::Recv {
                    to.qp
                        .post_recv(RecvWr {
                            wr_id: c.wc.wr_id,
                            sgl: to.sgl(4096 + c.wc.wr_id as usize * 4096, 4096),
                        })
                        .unwrap();
                    got = true;
                }
            }
            if got {
                break;
            }
        }
    };
    // Drain send completions of `e` (signaled every 16th).
    let reap = |e: &End, outc: &mut [Completion]| while e.cq.poll(outc) > 0 {};
    for i in 0..if run("send") { 1000 } else { 0 } {
        send(&ea, &eb, i % 16 == 0, &mut polls_empty, &mut outc);
        send(&eb, &ea, i % 16 == 0, &mut polls_empty, &mut outc);
    }
    reap(&ea, &mut outc);
    reap(&eb, &mut outc);
    polls_empty = 0;
    let t = Instant::now();
    for i in 0..if run("send") { iters } else { 0 } {
        send(&ea, &eb, i % 16 == 0, &mut polls_empty, &mut outc);
        send(&eb, &ea, i % 16 == 0, &mut polls_empty, &mut outc);
    }
    let rc = t.elapsed().as_nanos() as f64 / (2 * iters) as f64;
    println!(
        "RC Send {msg} B        {rc:8.1} ns/msg  {:5.2}x  (empty polls {polls_empty})",
        rc / tcp
    );

    // Empty polls (`empty`, not run by default): what one busy poll that
    // finds nothing costs, a raw non-blocking `read` against the RC CQ's
    // `poll` (half of it, on average, is added to every message's wait).
    if run("empty") {
        let n = 1_000_000u32;
        let mut rb = [0u8; 64];
        let t = Instant::now();
        for _ in 0..n {
            assert!(a.read(&mut rb).is_err());
        }
        let raw = t.elapsed().as_nanos() as f64 / f64::from(n);
        let t = Instant::now();
        for _ in 0..n {
            assert_eq!(ea.cq.poll(&mut outc), 0);
        }
        let cq = t.elapsed().as_nanos() as f64 / f64::from(n);
        println!("empty poll: raw TCP read {raw:6.1} ns, RC CQ poll {cq:6.1} ns");
    }

    // RC Write: each side writes into the other's buffer at [0, msg);
    // the last octet carries a tag the target watches (ib_write_lat).
    let (a_addr, b_addr) = (ea.ptr as u64, eb.ptr as u64);
    let write = |from: &End, to: &End, raddr: u64, tag: u8, signaled: bool, empty: &mut u64| {
        // SAFETY: inside `from`'s live buffer; no WR reads it now.
        unsafe { from.ptr.add(8192 + msg - 1).write_volatile(tag) };
        from.qp
            .post_send(SendWr {
                wr_id: 2,
                op: SendOp::Write {
                    remote_addr: raddr,
                    rkey: to.stag,
                    imm: None,
                },
                payload: Payload::Sgl(from.sgl(8192, msg)),
                flags: SendFlags {
                    signaled,
                    ..Default::default()
                },
            })
            .unwrap();
        let mut outc = [NONE; 4];
        while to.byte(msg - 1) != tag {
            if to.cq.poll(&mut outc) == 0 {
                *empty += 1;
            }
        }
    };
    let mut tag = 0u8;
    for i in 0..1000 {
        tag = tag.wrapping_add(1);
        write(&ea, &eb, b_addr, tag, i % 16 == 0, &mut polls_empty);
        write(&eb, &ea, a_addr, tag, i % 16 == 0, &mut polls_empty);
    }
    reap(&ea, &mut outc);
    reap(&eb, &mut outc);
    polls_empty = 0;
    let t = Instant::now();
    for i in 0..if run("write") { iters } else { 0 } {
        tag = tag.wrapping_add(1);
        write(&ea, &eb, b_addr, tag, i % 16 == 0, &mut polls_empty);
        write(&eb, &ea, a_addr, tag, i % 16 == 0, &mut polls_empty);
        if i % 16 == 15 {
            reap(&ea, &mut outc);
            reap(&eb, &mut outc);
        }
    }
    let wr = t.elapsed().as_nanos() as f64 / (2 * iters) as f64;
    println!(
        "RC Write {msg} B       {wr:8.1} ns/msg  {:5.2}x  (empty polls {polls_empty})",
        wr / tcp
    );
}
