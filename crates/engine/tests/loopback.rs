//! Engine over real TCP on loopback, both ends in this process: connection
//! set-up with private data, and Send / Write / Read with data checked.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::cm::{self, ConnParams, Listener};
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
