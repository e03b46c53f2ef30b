//! The verbs state machine end to end: two QPs connected the way
//! `ibv_rc_pingpong` does it (INIT → RTR with the peer's GID and QPN → RTS),
//! a ping-pong over them, and the diagnostics of refused transitions.

use std::net::{IpAddr, Ipv4Addr};
use std::thread;
use std::time::Duration;

use softrdma_verbs::{
    Access, Context, Destination, ModifyError, Payload, PostError, QpAttr, QpCaps, QpState, RecvWr,
    SendFlags, SendOp, SendWr, SgList, WcStatus,
};

#[test]
fn rc_pingpong_style_connect_by_gid_and_qpn() {
    let (ca, cb) = (Context::open().unwrap(), Context::open().unwrap());
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (qa_cq, qb_cq) = (ca.create_cq(16, None), cb.create_cq(16, None));
    let qa = pa.create_qp(&qa_cq, &qa_cq, QpCaps::default());
    let qb = pb.create_qp(&qb_cq, &qb_cq, QpCaps::default());
    assert_eq!(qa.query_state(), QpState::Init);
    let ma = pa.register(4096, Access::LOCAL_WRITE).unwrap();
    let mb = pb.register(4096, Access::LOCAL_WRITE).unwrap();
    // Receives may be posted in INIT; sends may not.
    qb.post_recv(RecvWr {
        wr_id: 1,
        sgl: SgList::single(mb.addr(), 4096, mb.lkey()),
    })
    .unwrap();
    qa.post_recv(RecvWr {
        wr_id: 2,
        sgl: SgList::single(ma.addr(), 4096, ma.lkey()),
    })
    .unwrap();
    let send = |mr: &softrdma_verbs::MemoryRegion, id| SendWr {
        wr_id: id,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Sgl(SgList::single(mr.addr(), 100, mr.lkey())),
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    };
    assert_eq!(
        qa.post_send(send(&ma, 3)),
        Err(PostError::InvalidState(QpState::Init))
    );
    // INIT -> RTS is not in the table.
    assert_eq!(
        qa.modify(&QpAttr::to(QpState::Rts)),
        Err(ModifyError::InvalidTransition {
            from: QpState::Init,
            to: QpState::Rts
        })
    );
    // RTR needs the destination.
    assert!(matches!(
        qa.modify(&QpAttr::to(QpState::Rtr)),
        Err(ModifyError::MissingAttribute { .. })
    ));
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let rtr = |qpn| QpAttr {
        dest: Some(Destination { addr: lo, qpn }),
        ..QpAttr::to(QpState::Rtr)
    };
    qa.modify(&rtr(qb.qpn())).unwrap();
    qb.modify(&rtr(qa.qpn())).unwrap();
    assert_eq!(qa.query_state(), QpState::Rtr);
    let qb2 = qb.clone();
    let t = thread::spawn(move || qb2.modify(&QpAttr::to(QpState::Rts)).unwrap());
    qa.modify(&QpAttr::to(QpState::Rts)).unwrap();
    t.join().unwrap();
    assert_eq!(qb.query_state(), QpState::Rts);
    // Ping and pong.
    ma.write_at(0, &[7u8; 100]).unwrap();
    qa.post_send(send(&ma, 4)).unwrap();
    let c = qb_cq.wait_one(Duration::from_secs(10)).unwrap();
    assert_eq!(
        (c.wc.wr_id, c.wc.status, c.wc.byte_len),
        (1, WcStatus::Success, 100)
    );
    qb.post_send(send(&mb, 5)).unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let c = qa_cq.wait_one(Duration::from_secs(10)).unwrap();
        assert_eq!(c.wc.status, WcStatus::Success);
        seen.push(c.wc.wr_id);
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![2, 4]);
    let mut got = [0u8; 100];
    mb.read_at(0, &mut got).unwrap();
    assert_eq!(got, [7u8; 100]);
    // RTS <-> SQD, then ERR flushes; RESET of a connected QP is refused.
    qa.modify(&QpAttr::to(QpState::Sqd)).unwrap();
    qa.modify(&QpAttr::to(QpState::Rts)).unwrap();
    qa.modify(&QpAttr::to(QpState::Err)).unwrap();
    assert_eq!(qa.query_state(), QpState::Err);
    assert!(matches!(
        qa.modify(&QpAttr::to(QpState::Reset)),
        Err(ModifyError::Unsupported(_))
    ));
    assert_eq!(
        qa.modify(&QpAttr::to(QpState::Rts)),
        Err(ModifyError::InvalidTransition {
            from: QpState::Err,
            to: QpState::Rts
        })
    );
}

#[test]
fn reset_before_connection_and_post_rules() {
    let c = Context::open().unwrap();
    let pd = c.alloc_pd();
    let cq = c.create_cq(4, None);
    let qp = pd.create_qp(&cq, &cq, QpCaps::default());
    qp.modify(&QpAttr::to(QpState::Reset)).unwrap();
    let mr = pd.register(64, Access::LOCAL_WRITE).unwrap();
    let wr = RecvWr {
        wr_id: 1,
        sgl: SgList::single(mr.addr(), 64, mr.lkey()),
    };
    assert_eq!(
        qp.post_recv(wr),
        Err(PostError::InvalidState(QpState::Reset))
    );
    qp.modify(&QpAttr::to(QpState::Init)).unwrap();
    qp.post_recv(wr).unwrap();
}
