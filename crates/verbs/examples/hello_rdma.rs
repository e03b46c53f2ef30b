//! A complete softrdma program: two queue pairs in one process, connected
//! over loopback with the connection manager, exchanging a Send and an RDMA
//! Write, then disconnecting.
//!
//! ```sh
//! cargo run -p softrdma-verbs --example hello_rdma
//! ```

use std::thread;
use std::time::Duration;

use softrdma_verbs::cm::{self, ConnParams, Listener};
use softrdma_verbs::{
    Access, Context, Payload, QpCaps, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The server: a context, a PD, a CQ, a QP, a buffer peers may write.
    let server = Context::open()?;
    let spd = server.alloc_pd();
    let scq = server.create_cq(16, None);
    let sqp = spd.create_qp(&scq, &scq, QpCaps::default());
    let smr = spd.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    sqp.post_recv(RecvWr {
        wr_id: 1,
        sgl: SgList::single(smr.addr(), 64, smr.lkey()),
    })?;
    let listener = Listener::bind(&server, "127.0.0.1:0")?;
    let addr = listener.local_addr()?;

    // The server tells the client where it may write, in its private data.
    let mut pd = smr.addr().to_be_bytes().to_vec();
    pd.extend_from_slice(&smr.rkey().to_be_bytes());
    let sqp2 = sqp.clone();
    let acceptor = thread::spawn(move || -> Result<(), cm::ConnectError> {
        let req = listener.get_request()?;
        println!(
            "server: request from {} saying {:?}",
            req.peer_addr(),
            String::from_utf8_lossy(req.private_data())
        );
        req.accept(
            &sqp2,
            &ConnParams {
                private_data: pd,
                ..ConnParams::default()
            },
        )
    });

    // The client.
    let client = Context::open()?;
    let cpd = client.alloc_pd();
    let ccq = client.create_cq(16, None);
    let cqp = cpd.create_qp(&ccq, &ccq, QpCaps::default());
    let cmr = cpd.register(4096, Access::LOCAL_WRITE)?;
    let reply = cm::connect(
        &cqp,
        addr,
        &ConnParams {
            private_data: b"hello".to_vec(),
            ..ConnParams::default()
        },
    )?;
    acceptor.join().expect("acceptor thread")?;
    let remote_addr = u64::from_be_bytes(reply[..8].try_into()?);
    let rkey = u32::from_be_bytes(reply[8..12].try_into()?);

    let flags = SendFlags {
        signaled: true,
        ..SendFlags::default()
    };
    // An RDMA Write into the server's buffer at offset 1024 …
    cmr.write_at(0, b"written by RDMA")?;
    cqp.post_send(SendWr {
        wr_id: 10,
        op: SendOp::Write {
            remote_addr: remote_addr + 1024,
            rkey,
            imm: None,
        },
        payload: Payload::Sgl(SgList::single(cmr.addr(), 15, cmr.lkey())),
        flags,
    })?;
    // … then a Send, which lands in the server's posted receive.
    cmr.write_at(100, b"hello, server")?;
    cqp.post_send(SendWr {
        wr_id: 11,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Sgl(SgList::single(cmr.addr() + 100, 13, cmr.lkey())),
        flags,
    })?;
    for _ in 0..2 {
        let c = ccq
            .wait_one(Duration::from_secs(5))
            .ok_or("no client completion")?;
        assert_eq!(c.wc.status, WcStatus::Success);
        println!("client: {:?} {} completed", c.wc.opcode, c.wc.wr_id);
    }
    let c = scq
        .wait_one(Duration::from_secs(5))
        .ok_or("no server completion")?;
    assert_eq!(
        (c.wc.opcode, c.wc.status),
        (WcOpcode::Recv, WcStatus::Success)
    );
    let mut got = vec![0u8; c.wc.byte_len as usize];
    smr.read_at(0, &mut got)?;
    let mut written = [0u8; 15];
    smr.read_at(1024, &mut written)?;
    println!(
        "server: received {:?}; memory at 1024 holds {:?}",
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&written)
    );
    cqp.disconnect();
    Ok(())
}
