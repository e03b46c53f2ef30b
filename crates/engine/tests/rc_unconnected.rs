//! An RC queue pair that never connected: disconnecting it completes the
//! receives posted to it with flush errors, in order (as moving a verbs QP
//! to the error state does), and nothing is lost on the way to the CQ.

use softrdma_engine::{Completion, Context, QpCaps};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{RecvWr, SgList, WcOpcode, WcStatus, WorkCompletion};

const NONE: Completion = Completion {
    wc: WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0),
    qp_num: 0,
};

#[test]
fn disconnecting_an_unconnected_qp_flushes_its_receives() {
    let ctx = Context::new().expect("context");
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(16, None);
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
    };
    let qp = ctx.create_qp(7, pd, caps, cq.clone(), cq.clone());
    let mut buf = vec![0u8; 256];
    // SAFETY: `buf` stays where it is, unresized, until the STag is
    // deregistered at the end of the test (the QP is dropped first).
    let stag = unsafe {
        ctx.registry()
            .register(
                buf.as_mut_ptr(),
                buf.len(),
                buf.as_ptr() as u64,
                Access::LOCAL_WRITE,
                pd,
            )
            .expect("registered")
    };
    for k in 0..3u64 {
        let sgl = SgList::single(buf.as_ptr() as u64 + k * 64, 64, stag);
        qp.post_recv(RecvWr { wr_id: 10 + k, sgl }).expect("posted");
    }
    let mut out = [NONE; 8];
    assert_eq!(
        cq.poll(&mut out),
        0,
        "nothing completes before the disconnect"
    );
    qp.disconnect();
    let n = cq.poll(&mut out);
    assert_eq!(
        n,
        3,
        "one flush completion per posted receive: {:?}",
        &out[..n]
    );
    for (k, c) in out[..n].iter().enumerate() {
        assert_eq!(c.wc.wr_id, 10 + k as u64);
        assert_eq!(c.wc.status, WcStatus::WrFlushErr);
        assert_eq!(c.wc.opcode, WcOpcode::Recv);
        assert_eq!(c.qp_num, 7);
    }
    drop(qp);
    assert!(ctx.registry().deregister(stag));
    drop(buf);
}
