//! Unreliable datagrams with the safe API: a server UD QP answers whoever
//! writes to it (the `ibv_ud_pingpong` pattern: the reply's address handle
//! comes from the request's completion), a client sends "hello" with
//! immediate data, then one RDMA Write-Record the server finds in its
//! validity map. Two contexts in one process, over loopback.
//!
//! ```sh
//! cargo run -p softrdma-verbs --example ud_hello
//! ```

use std::thread;
use std::time::Duration;

use softrdma_verbs::{
    Access, AddressHandle, Context, Payload, QpCaps, RecvWr, SendFlags, SendOp, SendWr, SgList,
    UdQpOptions, WcOpcode, WcStatus, WorkCompletion,
};

const WAIT: Duration = Duration::from_secs(5);

fn signaled(wr_id: u64, op: SendOp, sgl: SgList) -> SendWr {
    SendWr {
        wr_id,
        op,
        payload: Payload::Sgl(sgl),
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let loopback = UdQpOptions {
        bind: "127.0.0.1:0".parse()?,
        ..UdQpOptions::default()
    };

    // The server: a UD QP, a buffer for requests and one peers may
    // Write-Record into.
    let server = Context::open()?;
    let spd = server.alloc_pd();
    let scq = server.create_cq(16, None);
    let sqp = spd.create_ud_qp(&scq, &scq, QpCaps::default(), loopback)?;
    let smr = spd.register(8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let sge = smr.sge(0, 1024);
    sqp.post_recv(RecvWr {
        wr_id: 1,
        sgl: SgList::single(sge.addr, sge.length, sge.lkey),
    })?;
    // What the client is told out of band: address (IP, port, QPN), and
    // where it may Write-Record.
    let server_addr = sqp.address();
    let (record_at, rkey) = (smr.addr() + 4096, smr.rkey());
    println!(
        "server: UD QP {:#x} at {}:{}",
        server_addr.qpn, server_addr.ip, server_addr.port
    );

    let sqp2 = sqp.clone();
    let responder = thread::spawn(
        move || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            let req = scq.wait_one(WAIT).ok_or("no request")?.wc;
            if req.status != WcStatus::Success || req.opcode != WcOpcode::Recv {
                return Err(format!("bad request completion {req:?}").into());
            }
            let mut text = vec![0; req.byte_len as usize];
            smr.read_at(0, &mut text)?;
            println!(
                "server: {:?} (immediate {:?}) from {:?}",
                String::from_utf8_lossy(&text),
                req.imm,
                req.src
            );
            // Reply to the sender.
            let back = AddressHandle::from_completion(&spd, &req)?;
            smr.write_at(1024, b"hello back")?;
            let sge = smr.sge(1024, 10);
            let send = SendOp::Send {
                imm: None,
                invalidate: None,
            };
            sqp2.post_send(
                signaled(2, send, SgList::single(sge.addr, sge.length, sge.lkey)),
                &back,
            )?;
            // Its own send completion, then the Write-Record.
            let mut record: Option<WorkCompletion> = None;
            while record.is_none() {
                let wc = scq.wait_one(WAIT).ok_or("no Write-Record")?.wc;
                if wc.opcode == WcOpcode::RecvWriteRecord {
                    record = Some(wc);
                }
            }
            let info = record.and_then(|wc| wc.record).ok_or("no record info")?;
            println!(
                "server: Write-Record of {} octets at offset {}; valid ranges {:?}",
                info.len,
                info.to - smr.addr(),
                sqp2.record_valid_ranges(&smr, 0, smr.len())?
            );
            let mut text = vec![0; info.len as usize];
            smr.read_at(4096, &mut text)?;
            println!("server: recorded {:?}", String::from_utf8_lossy(&text));
            sqp2.record_clear(&smr, 4096, text.len())?;
            Ok(())
        },
    );

    // The client.
    let client = Context::open()?;
    let cpd = client.alloc_pd();
    let ccq = client.create_cq(16, None);
    let cqp = cpd.create_ud_qp(&ccq, &ccq, QpCaps::default(), loopback)?;
    let cmr = cpd.register(4096, Access::LOCAL_WRITE)?;
    let sge = cmr.sge(1024, 1024);
    cqp.post_recv(RecvWr {
        wr_id: 7,
        sgl: SgList::single(sge.addr, sge.length, sge.lkey),
    })?;
    let to_server = cpd.create_ah(server_addr)?;
    cmr.write_at(0, b"hello")?;
    let sge = cmr.sge(0, 5);
    let hello = SendOp::Send {
        imm: Some(0x1234),
        invalidate: None,
    };
    cqp.post_send(
        signaled(1, hello, SgList::single(sge.addr, sge.length, sge.lkey)),
        &to_server,
    )?;
    let mut reply = None;
    while reply.is_none() {
        let wc = ccq.wait_one(WAIT).ok_or("no reply")?.wc;
        if wc.opcode == WcOpcode::Recv {
            reply = Some(wc);
        }
    }
    let reply = reply.ok_or("no reply")?;
    let mut text = vec![0; reply.byte_len as usize];
    cmr.read_at(1024, &mut text)?;
    println!(
        "client: {:?} from {:?}",
        String::from_utf8_lossy(&text),
        reply.src
    );

    cmr.write_at(2048, b"recorded datagram")?;
    let sge = cmr.sge(2048, 17);
    let record = SendOp::WriteRecord {
        remote_addr: record_at,
        rkey,
    };
    cqp.post_send(
        signaled(3, record, SgList::single(sge.addr, sge.length, sge.lkey)),
        &to_server,
    )?;
    responder
        .join()
        .map_err(|_| "the server thread panicked")?
        .map_err(|e| e.to_string())?;
    println!("client: {} datagrams sent", cqp.stats().ud.tx_datagrams);
    Ok(())
}
