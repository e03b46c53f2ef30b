//! Engine over real TCP on loopback, both ends in this process: connection
//! set-up with private data, and Send / Write / Read with data checked.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::cm::{self, ConnParams, Listener};
use softrdma_engine::qp::RxStats;
use softrdma_engine::{Completion, Context, Cq, Qp, QpCaps};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

fn wait_one(cq: &Cq) -> Completion {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = [Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }];
    loop {
        if cq.poll(&mut out) == 1 {
            return out[0];
        }
        assert!(Instant::now() < deadline, "no completion within 10 s");
        thread::yield_now();
    }
}

struct Side {
    ctx: Context,
    cq: Arc<Cq>,
    qp: Qp,
    buf: Vec<u8>,
    stag: u32,
}

fn side(len: usize) -> Side {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let qp = ctx.create_qp(1, pd, QpCaps::default(), cq.clone(), cq.clone());
    let mut buf = vec![0u8; len];
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: `buf` lives in the returned Side, which outlives the QP's use
    // of it in these tests (the contexts are dropped at the end of each).
    let stag = unsafe {
        ctx.registry()
            .register(buf.as_mut_ptr(), len, buf.as_ptr() as u64, access, pd)
    }
    .unwrap();
    Side {
        ctx,
        cq,
        qp,
        buf,
        stag,
    }
}

#[test]
fn connect_send_write_read() {
    let len = 4 << 20;
    let mut server = side(len);
    let mut client = side(len);
    let listener = Listener::bind(&server.ctx, "127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();

    // The server posts a receive before accepting.
    let sbase = server.buf.as_ptr() as u64;
    server
        .qp
        .post_recv(RecvWr {
            wr_id: 1,
            sgl: SgList::single(sbase, 4096, server.stag),
        })
        .unwrap();
    let sqp = server.qp.clone();
    let acceptor = thread::spawn(move || {
        let inc = listener.accept().unwrap();
        assert_eq!(inc.private_data(), b"hello from client");
        inc.accept(
            &sqp,
            &ConnParams {
                private_data: b"welcome".to_vec(),
                ..Default::default()
            },
        )
        .unwrap();
    });
    let peer_pd = cm::connect(
        &client.ctx,
        &client.qp,
        addr,
        &ConnParams {
            private_data: b"hello from client".to_vec(),
            ..Default::default()
        },
    )
    .unwrap();
    acceptor.join().unwrap();
    assert_eq!(peer_pd, b"welcome");

    // Send 1000 octets.
    let cbase = client.buf.as_ptr() as u64;
    for (i, b) in client.buf.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let flags = SendFlags {
        signaled: true,
        ..Default::default()
    };
    client
        .qp
        .post_send(SendWr {
            wr_id: 10,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(cbase, 1000, client.stag)),
            flags,
        })
        .unwrap();
    assert_eq!(wait_one(&client.cq).wc.status, WcStatus::Success);
    let r = wait_one(&server.cq);
    assert_eq!(
        (r.wc.wr_id, r.wc.status, r.wc.byte_len),
        (1, WcStatus::Success, 1000)
    );
    assert_eq!(&server.buf[..1000], &client.buf[..1000]);

    // Write 3 MiB into the server, then read it back into the client's tail.
    client
        .qp
        .post_send(SendWr {
            wr_id: 11,
            op: SendOp::Write {
                remote_addr: sbase + 4096,
                rkey: server.stag,
                imm: None,
            },
            payload: Payload::Sgl(SgList::single(cbase, 3 << 20, client.stag)),
            flags,
        })
        .unwrap();
    client
        .qp
        .post_send(SendWr {
            wr_id: 12,
            op: SendOp::Read {
                remote_addr: sbase + 4096,
                rkey: server.stag,
            },
            payload: Payload::Sgl(SgList::single(cbase + (3 << 20), 1 << 20, client.stag)),
            flags,
        })
        .unwrap();
    let w = wait_one(&client.cq);
    assert_eq!((w.wc.wr_id, w.wc.status), (11, WcStatus::Success));
    let rd = wait_one(&client.cq);
    assert_eq!(
        (rd.wc.wr_id, rd.wc.status, rd.wc.opcode),
        (12, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert!(server.buf[4096..4096 + (3 << 20)] == client.buf[..3 << 20]);
    assert!(client.buf[3 << 20..] == client.buf[..1 << 20]);
    let _ = (&mut server.buf, &mut client.buf);
}

#[test]
fn reject_carries_private_data() {
    let server = side(64);
    let client = side(64);
    let listener = Listener::bind(&server.ctx, "127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = thread::spawn(move || listener.accept().unwrap().reject(b"go away").unwrap());
    let e = cm::connect(&client.ctx, &client.qp, addr, &ConnParams::default()).unwrap_err();
    t.join().unwrap();
    match e {
        cm::CmError::Rejected(pd) => assert_eq!(pd, b"go away"),
        other => panic!("expected a rejection, got {other}"),
    }
}

fn side_with(cfg: softrdma_engine::config::Config, len: usize) -> Side {
    let ctx = Context::with_config(cfg).unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let qp = ctx.create_qp(1, pd, QpCaps::default(), cq.clone(), cq.clone());
    let mut buf = vec![0u8; len];
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    // SAFETY: as in `side`.
    let stag = unsafe {
        ctx.registry()
            .register(buf.as_mut_ptr(), len, buf.as_ptr() as u64, access, pd)
    }
    .unwrap();
    Side {
        ctx,
        cq,
        qp,
        buf,
        stag,
    }
}

/// Large Write, Read Response and Send payloads are read from the socket
/// straight into registered memory (no copy through the receive buffer):
/// without CRC, and with CRC unless `SOFTRDMA_MPA_CRC_DIRECT=0` asks to
/// verify every FPDU before placing it — then nothing is. Data is checked
/// every time, including a Send scattered over three pieces.
///
/// Direct placement is opportunistic: it reads the rest of an FPDU whose
/// header arrived before its payload. A receiver that falls behind (a
/// loaded or stolen CPU) finds whole FPDUs queued, reads them through its
/// buffer up to 256 KiB at a time and places nothing directly — seen in
/// CI: the client read a whole 2 MiB Read Response that way. So each end
/// must place directly more than one such read's worth in at least one
/// of five exchanges (unloaded: every time, > 3 MiB at the server, > 1.5
/// MiB at the client); verifying first, never.
#[test]
fn direct_placement_unless_crc_is_verified_first() {
    let (s, c) = placement_exchange(true, false);
    assert_eq!(
        (s.direct_octets, c.direct_octets),
        (0, 0),
        "crc verified first"
    );
    for crc in [false, true] {
        let (mut server_direct, mut client_direct) = (false, false);
        let mut seen = Vec::new();
        for _ in 0..5 {
            let (s, c) = placement_exchange(crc, true);
            server_direct |= s.direct_octets > 256 << 10;
            client_direct |= c.direct_octets > 256 << 10;
            seen.push((s, c));
            if server_direct && client_direct {
                break;
            }
        }
        assert!(
            server_direct && client_direct,
            "crc {crc}: placed directly too little in five exchanges (server, client): {seen:?}"
        );
    }
}

/// One exchange of [`direct_placement_unless_crc_is_verified_first`]: two
/// Writes, a scattered Send and a Read over a fresh connection, every octet
/// checked; returns the (server, client) receive statistics.
fn placement_exchange(crc: bool, crc_direct: bool) -> (RxStats, RxStats) {
    let cfg = softrdma_engine::config::Config {
        mpa_crc: crc,
        mpa_crc_direct: crc_direct,
        ..Default::default()
    };
    let len = 8 << 20;
    let mut server = side_with(cfg.clone(), len);
    let mut client = side_with(cfg, len);
    let listener = Listener::bind(&server.ctx, "127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (sbase, cbase) = (server.buf.as_ptr() as u64, client.buf.as_ptr() as u64);
    // A receive in three pieces for a 300 000-octet Send.
    let pieces = [(0u64, 100_000u32), (1 << 20, 150_000), (2 << 20, 50_000)];
    let sges: Vec<_> = pieces
        .iter()
        .map(|&(o, l)| softrdma_proto::wr::Sge {
            addr: sbase + (5 << 20) + o,
            length: l,
            lkey: server.stag,
        })
        .collect();
    server
        .qp
        .post_recv(RecvWr {
            wr_id: 1,
            sgl: SgList::from_slice(&sges).unwrap(),
        })
        .unwrap();
    let sqp = server.qp.clone();
    let acceptor = thread::spawn(move || {
        let inc = listener.accept().unwrap();
        inc.accept(&sqp, &ConnParams::default()).unwrap();
    });
    cm::connect(&client.ctx, &client.qp, addr, &ConnParams::default()).unwrap();
    acceptor.join().unwrap();
    for (i, b) in client.buf.iter_mut().enumerate() {
        *b = (i * 13 + 5) as u8;
    }
    let flags = SendFlags {
        signaled: true,
        ..Default::default()
    };
    let write = |id: u64, off: u64, n: u64| SendWr {
        wr_id: id,
        op: SendOp::Write {
            remote_addr: sbase + off,
            rkey: server.stag,
            imm: None,
        },
        payload: Payload::Sgl(SgList::single(cbase + off, n as u32, client.stag)),
        flags,
    };
    client.qp.post_send(write(1, 0, 3 << 20)).unwrap();
    client.qp.post_send(write(2, 3 << 20, 1 << 20)).unwrap();
    client
        .qp
        .post_send(SendWr {
            wr_id: 3,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(cbase + 77, 300_000, client.stag)),
            flags,
        })
        .unwrap();
    // Read the first 2 MiB back into the client's upper half.
    client
        .qp
        .post_send(SendWr {
            wr_id: 4,
            op: SendOp::Read {
                remote_addr: sbase,
                rkey: server.stag,
            },
            payload: Payload::Sgl(SgList::single(cbase + (6 << 20), 2 << 20, client.stag)),
            flags,
        })
        .unwrap();
    for id in 1..=4 {
        let c = wait_one(&client.cq);
        assert_eq!((c.wc.wr_id, c.wc.status), (id, WcStatus::Success));
    }
    let r = wait_one(&server.cq);
    assert_eq!(
        (r.wc.wr_id, r.wc.status, r.wc.byte_len),
        (1, WcStatus::Success, 300_000)
    );
    assert!(server.buf[..4 << 20] == client.buf[..4 << 20], "crc {crc}");
    let mut at = 77;
    for &(o, l) in &pieces {
        let s = (5 << 20) + o as usize;
        assert!(
            server.buf[s..s + l as usize] == client.buf[at..at + l as usize],
            "send piece at {o}, crc {crc}"
        );
        at += l as usize;
    }
    assert!(client.buf[6 << 20..(6 << 20) + (2 << 20)] == client.buf[..2 << 20]);
    let stats = (server.qp.rx_stats(), client.qp.rx_stats());
    let _ = (&mut server.buf, &mut client.buf);
    stats
}

/// The TCP port of `fd`'s local (`peer` false) or peer address.
fn port_of(fd: i32, peer: bool) -> Option<u16> {
    // SAFETY: `sockaddr_in` is plain data; all zeros is a valid value.
    let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let p = &mut a as *mut libc::sockaddr_in as *mut libc::sockaddr;
    // SAFETY: `a` and `len` are live and `len` states `a`'s size.
    let r = unsafe {
        if peer {
            libc::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    (r == 0 && i32::from(a.sin_family) == libc::AF_INET).then(|| u16::from_be(a.sin_port))
}

/// `SOFTRDMA_TCP_CONGESTION`: both ends' connections run the algorithm
/// asked for (an allowed one other than the system's default, else reno,
/// which every kernel allows), found among this process's descriptors by
/// the listener's port; a name the kernel does not offer fails the context
/// with a message naming the variable.
#[test]
fn tcp_congestion_is_set_on_both_ends() {
    let sysctl = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}")).unwrap_or_default()
    };
    let default = sysctl("tcp_congestion_control");
    let want = sysctl("tcp_allowed_congestion_control")
        .split_whitespace()
        .find(|cc| *cc != default.trim())
        .unwrap_or("reno")
        .to_string();
    let cfg = softrdma_engine::config::Config {
        tcp_congestion: Some(want.clone()),
        ..Default::default()
    };
    let server = side_with(cfg.clone(), 4096);
    let client = side_with(cfg, 4096);
    let listener = Listener::bind(&server.ctx, "127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sqp = server.qp.clone();
    let acceptor = thread::spawn(move || {
        let inc = listener.accept().unwrap();
        inc.accept(&sqp, &ConnParams::default()).unwrap();
    });
    cm::connect(
        &client.ctx,
        &client.qp,
        ("127.0.0.1", port),
        &ConnParams::default(),
    )
    .unwrap();
    acceptor.join().unwrap();
    // The accepted socket has the listener's port as its own, the
    // client's as its peer's.
    let (mut accepted, mut connecting) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
        let Ok(fd) = entry.unwrap().file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: `fd` is open in this process for the call (read from
        // /proc/self/fd); the borrow ends with it.
        let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let Ok(cc) = softrdma_engine::tcp_congestion(&sock) else {
            continue;
        };
        if port_of(fd, true) == Some(port) {
            connecting.push(cc);
        } else if port_of(fd, false) == Some(port) && port_of(fd, true).is_some() {
            accepted.push(cc);
        }
    }
    assert_eq!(
        connecting,
        std::slice::from_ref(&want),
        "the client's connection"
    );
    assert_eq!(accepted, [want], "the server's connection");

    let e = Context::with_config(softrdma_engine::config::Config {
        tcp_congestion: Some("no_such_cc".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(
        e.to_string().contains("SOFTRDMA_TCP_CONGESTION=no_such_cc"),
        "{e}"
    );
}
