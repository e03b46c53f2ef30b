//! Daemonless IB-style connection: two QPs that know only each other's
//! address and QP number connect at RTR/RTS, in either order, and a request
//! naming the wrong peer is refused.

use std::net::{IpAddr, Ipv4Addr};
use std::thread;
use std::time::Duration;

use softrdma_engine::{Completion, Context, QpCaps};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus, WorkCompletion,
};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

#[test]
fn connect_by_qp_number_both_orders() {
    for order in 0..2 {
        let (a, b) = (Context::new().unwrap(), Context::new().unwrap());
        let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
        let (ca, cb) = (a.create_cq(16, None), b.create_cq(16, None));
        let qa = a
            .create_rc_qp(pa, QpCaps::default(), ca.clone(), ca.clone())
            .unwrap();
        let qb = b
            .create_rc_qp(pb, QpCaps::default(), cb.clone(), cb.clone())
            .unwrap();
        assert_ne!(qa.qpn() >> 8, 0, "the QPN carries the port");
        let mut buf = vec![0u8; 64];
        // SAFETY: `buf` outlives the contexts' use of it in this test.
        let kb = unsafe {
            b.registry().register(
                buf.as_mut_ptr(),
                64,
                buf.as_ptr() as u64,
                Access::LOCAL_WRITE,
                pb,
            )
        }
        .unwrap();
        qb.post_recv(RecvWr {
            wr_id: 1,
            sgl: SgList::single(buf.as_ptr() as u64, 64, kb),
        })
        .unwrap();
        let (ia, ib) = (a.ib_conn(), b.ib_conn());
        // RTR on both sides, in either order, then RTS (wait) on both.
        if order == 0 {
            ia.start(&qa, qa.qpn(), LO, qb.qpn(), 1, 1).unwrap();
            thread::sleep(Duration::from_millis(100));
            ib.start(&qb, qb.qpn(), LO, qa.qpn(), 1, 1).unwrap();
        } else {
            ib.start(&qb, qb.qpn(), LO, qa.qpn(), 1, 1).unwrap();
            thread::sleep(Duration::from_millis(100));
            ia.start(&qa, qa.qpn(), LO, qb.qpn(), 1, 1).unwrap();
        }
        ia.wait_connected(&qa, qa.qpn(), Duration::from_secs(10))
            .unwrap();
        ib.wait_connected(&qb, qb.qpn(), Duration::from_secs(10))
            .unwrap();
        let flags = SendFlags {
            signaled: true,
            ..SendFlags::default()
        };
        let msg = softrdma_proto::wr::InlineData::new(b"by number").unwrap();
        qa.post_send(SendWr {
            wr_id: 2,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Inline(msg),
            flags,
        })
        .unwrap();
        let mut out = [Completion {
            wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
            qp_num: 0,
        }];
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while cb.poll(&mut out) == 0 {
            assert!(std::time::Instant::now() < deadline);
            thread::yield_now();
        }
        assert_eq!(
            (out[0].wc.status, out[0].wc.byte_len),
            (WcStatus::Success, 9)
        );
        assert_eq!(&buf[..9], b"by number");
    }
}

#[test]
fn wrong_peer_is_refused() {
    let (a, b) = (Context::new().unwrap(), Context::new().unwrap());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(16, None), b.create_cq(16, None));
    let qa = a
        .create_rc_qp(pa, QpCaps::default(), ca.clone(), ca.clone())
        .unwrap();
    let qb = b
        .create_rc_qp(pb, QpCaps::default(), cb.clone(), cb)
        .unwrap();
    // b expects some other QP; whichever side connects is refused.
    b.ib_conn()
        .start(&qb, qb.qpn(), LO, qa.qpn() ^ 0x1, 1, 1)
        .unwrap();
    a.ib_conn()
        .start(&qa, qa.qpn(), LO, qb.qpn(), 1, 1)
        .unwrap();
    assert!(a
        .ib_conn()
        .wait_connected(&qa, qa.qpn(), Duration::from_secs(3))
        .is_err());
    assert!(b
        .ib_conn()
        .wait_connected(&qb, qb.qpn(), Duration::from_millis(200))
        .is_err());
}
