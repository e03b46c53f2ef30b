//! RD RDMA operations: Write placement and access violations, the
//! ordering of ACKs behind Terminates, fences, Write-Record, Reads (MSN
//! echo, rights, ORD and IRD bounds) and atomics.

use super::*;

#[test]
fn write_placed_in_segments_completes_on_ack() {
    let mut p = Pair::new(|_| {}, |_| {});
    let len = 2 * ROOM_TAGGED + 1;
    let data = p.a.fill(0, len, 9);
    p.a.post(1, write(0x4_0000, p.b.buf), 0, len, p.b.addr);
    let d = p.a.tx();
    assert_eq!(d.len(), 3);
    let (r, pl) = seg_of(&d[1]);
    assert_eq!(pl.len(), ROOM_TAGGED);
    assert_eq!(
        r.ddp,
        DdpHeader::Tagged {
            stag: p.b.buf,
            to: BASE + 0x4_0000 + ROOM_TAGGED as u64,
            ext: Some(TaggedExt {
                msn: 1,
                mo: ROOM_TAGGED as u32
            })
        }
    );
    for x in &d {
        p.deliver(Dir::AtoB, x);
    }
    assert_eq!(p.b.at(0x4_0000, len), &data[..]);
    assert!(p.b.wcs().is_empty(), "no completion at the target");
    p.run(ms(5));
    let wc = p.a.wcs()[0].1;
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len as usize),
        (WcStatus::Success, WcOpcode::RdmaWrite, len)
    );
}

#[test]
fn write_access_violation_fails_that_request_only_and_its_ack_waits() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.fill(0, 100, 1);
    // W1 to a bad STag, W2 fine, both in one burst.
    p.a.post(1, write(0, p.b.buf ^ 0x40), 0, 100, p.b.addr);
    p.a.post(2, write(0x100, p.b.buf), 0, 100, p.b.addr);
    let d = p.a.tx();
    assert_eq!(d.len(), 2);
    p.deliver(Dir::AtoB, &d[0]);
    p.deliver(Dir::AtoB, &d[1]);
    let ev = p.b.events();
    assert_eq!(ev.len(), 1);
    assert!(matches!(
        ev[0],
        DgramEvent::RemoteAccess {
            opcode: Opcode::RdmaWrite,
            msn: 1,
            error: MemError::InvalidStag,
            ..
        }
    ));
    assert_eq!(p.b.at(0x100, 100), p.a.at(0, 100), "W2 placed");
    // Lose B's report once. Whatever B sends, an ACK covering W1
    // (PSN 0) only ever rides on a data datagram at or after the report.
    let mut report_psn = None;
    let mut dropped = false;
    let mut full_acks = 0;
    p.run_with(ms(50), |dir, d| {
        if dir != Dir::BtoA {
            return true;
        }
        let s = shim_of(d);
        if let Some(ds) = s.data {
            report_psn.get_or_insert(ds.psn);
        }
        if let Feedback::Ack { psn, .. } = s.feedback {
            if psn > 0 {
                full_acks += 1;
                let at = s.data.map(|ds| ds.psn);
                assert!(at.is_some() && at >= report_psn, "{s:?}");
            }
        }
        if s.data.is_some() && !dropped {
            dropped = true;
            return false;
        }
        true
    });
    assert!(dropped && full_acks >= 2);
    let tx = p.a.wcs();
    let st: Vec<_> = tx.iter().map(|c| (c.1.wr_id, c.1.status)).collect();
    assert_eq!(st, [(1, WcStatus::RemAccessErr), (2, WcStatus::Success)]);
    assert!(p.a.events().is_empty(), "no peer failure");
    assert_eq!(p.a.qp.sq_in_use(), 0);
    assert_eq!(p.b.qp.inbound_in_use(), 0);
}

#[test]
fn mutual_access_violations_release_each_other() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.post(1, write(0, 0xbad01), 0, 10, p.b.addr);
    p.b.post(2, write(0, 0xbad01), 0, 10, p.a.addr);
    p.run(ms(20));
    assert_eq!(p.a.wcs()[0].1.status, WcStatus::RemAccessErr);
    assert_eq!(p.b.wcs()[0].1.status, WcStatus::RemAccessErr);
    // Both directions still work at once.
    p.a.fill(0, 10, 4);
    p.a.post(3, write(0x100, p.b.buf), 0, 10, p.b.addr);
    p.b.post(4, write(0x100, p.a.buf), 0, 10, p.a.addr);
    p.run(ms(20));
    assert_eq!(p.a.wcs()[0].1.status, WcStatus::Success);
    assert_eq!(p.b.wcs()[0].1.status, WcStatus::Success);
    assert_eq!(
        p.a.qp.rd_stats().peers_failed + p.b.qp.rd_stats().peers_failed,
        0
    );
    assert_eq!(p.a.qp.rd_stats().timeouts + p.b.qp.rd_stats().timeouts, 0);
}

#[test]
fn an_ack_overtaking_a_terminate_waits_for_it() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.a.fill(0, 100, 1);
    p.a.recv(5, 0x8000, 64);
    p.a.post(1, write(0, p.b.buf ^ 0x40), 0, 100, p.b.addr);
    p.a.post(2, write(0x100, p.b.buf), 0, 100, p.b.addr);
    for d in p.a.tx() {
        p.deliver(Dir::AtoB, &d);
    }
    // B has a Send for A as well: the Terminate goes first, the Send
    // after it carries the ACK of both Writes.
    p.b.send(7, 0, 10, p.a.addr);
    let out = p.b.tx();
    assert_eq!(out.len(), 2);
    assert_eq!(seg_of(&out[0]).0.opcode, Opcode::Terminate);
    assert!(matches!(
        shim_of(&out[1]).feedback,
        Feedback::Ack { psn: 2, .. }
    ));
    // The Terminate is lost; the Send arrives out of order with the ACK.
    p.deliver(Dir::BtoA, &out[1]);
    assert_eq!(p.a.qp.rd().unacked(&p.b.addr), 0, "RD took the ACK");
    assert!(p.a.wcs().is_empty(), "but nothing succeeds yet");
    assert_eq!(p.a.qp.stats().tx_gated, 2);
    p.run(ms(100));
    let wcs = p.a.wcs();
    let of = |q| -> Vec<_> {
        wcs.iter()
            .filter(|c| c.0 == q)
            .map(|c| (c.1.wr_id, c.1.status))
            .collect()
    };
    assert_eq!(
        of(CqKind::Send),
        [(1, WcStatus::RemAccessErr), (2, WcStatus::Success)]
    );
    assert_eq!(of(CqKind::Recv), [(5, WcStatus::Success)]);
}

#[test]
fn a_fenced_request_waits_for_earlier_reads() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.b.recv(1, 0x9000, 64);
    p.a.post(1, read(0, p.b.buf), 0, 32, p.b.addr);
    let wr = SendWr {
        wr_id: 2,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: p.a.sgl(0x100, 8),
        flags: SendFlags {
            signaled: true,
            solicited: false,
            fence: true,
        },
    };
    p.a.qp.post_send(wr, p.b.addr).unwrap();
    let d = p.a.tx();
    assert_eq!(d.len(), 1, "only the Read Request");
    assert_eq!(seg_of(&d[0]).0.opcode, Opcode::ReadRequest);
    p.deliver(Dir::AtoB, &d[0]);
    for x in p.b.tx() {
        p.deliver(Dir::BtoA, &x);
    }
    let d = p.a.tx();
    assert_eq!(
        seg_of(&d[0]).0.opcode,
        Opcode::Send,
        "after the Read completed"
    );
    p.run(ms(10));
    let st: Vec<_> = p.a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
    assert_eq!(st, [(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn write_record_is_logged_at_the_target() {
    let mut p = Pair::new(|_| {}, |_| {});
    let len = ROOM_TAGGED + 10;
    let data = p.a.fill(0, len, 2);
    let op = SendOp::WriteRecord {
        remote_addr: BASE + 0x2000,
        rkey: p.b.buf,
    };
    p.a.post(1, op, 0, len, p.b.addr);
    p.run(ms(5));
    assert_eq!(p.b.at(0x2000, len), &data[..]);
    let rec = p.b.wcs();
    assert_eq!(rec.len(), 1);
    let wc = rec[0].1;
    assert_eq!(
        (wc.opcode, wc.status),
        (WcOpcode::RecvWriteRecord, WcStatus::Success)
    );
    let info = wc.record.unwrap();
    assert_eq!(
        (info.stag, info.to, info.len as usize, info.msn),
        (p.b.buf, BASE + 0x2000, len, 1)
    );
    assert_eq!(wc.src, Some(p.a.addr));
    assert!(p
        .b
        .qp
        .record_tracker()
        .is_valid(p.b.buf, BASE + 0x2000, len as u64));
    assert_eq!(p.a.wcs()[0].1.opcode, WcOpcode::WriteRecord);
}

#[test]
fn read_response_echoes_the_request_msn() {
    let mut p = Pair::new(|_| {}, |_| {});
    let len = 3 * ROOM_TAGGED;
    let data = p.b.fill(0x1000, len, 8);
    p.a.post(1, read(0x1000, p.b.buf), 0x5000, len, p.b.addr);
    p.a.post(2, read(0x1000, p.b.buf), 0x20000, 10, p.b.addr);
    let req = p.a.tx();
    assert_eq!(req.len(), 2);
    let (r, _) = seg_of(&req[1]);
    let RdmapBody::ReadRequest(rr) = r.body else {
        panic!("read request")
    };
    assert_eq!(
        (rr.sink_stag, rr.sink_to, rr.size),
        (p.a.buf, BASE + 0x20000, 10)
    );
    assert!(matches!(r.ddp, DdpHeader::Untagged { qn: 1, msn: 2, .. }));
    for x in &req {
        p.deliver(Dir::AtoB, x);
    }
    let resp = p.b.tx();
    assert_eq!(resp.len(), 4);
    let tmsns: Vec<u32> = resp
        .iter()
        .map(|x| match seg_of(x).0.ddp {
            DdpHeader::Tagged { ext: Some(e), .. } => e.msn,
            _ => panic!("tagged"),
        })
        .collect();
    assert_eq!(tmsns, [1, 1, 1, 2]);
    // Deliver the responses; the Reads complete on placement.
    for x in &resp {
        p.deliver(Dir::BtoA, x);
    }
    let wcs = p.a.wcs();
    assert_eq!(wcs.len(), 2);
    assert_eq!(
        (wcs[0].1.wr_id, wcs[0].1.status, wcs[0].1.byte_len as usize),
        (1, WcStatus::Success, len)
    );
    assert_eq!(wcs[1].1.opcode, WcOpcode::RdmaRead);
    assert_eq!(p.a.at(0x5000, len), &data[..]);
    assert_eq!(p.a.at(0x20000, 10), &data[..10]);
    p.run(ms(20));
    assert_eq!(p.b.qp.inbound_in_use(), 0, "responses acknowledged");
    assert_eq!(p.a.qp.sq_in_use(), 0);
}

#[test]
fn read_without_the_right_fails_with_rem_access_err() {
    let mut p = Pair::new(|_| {}, |_| {});
    let wo = p.b.mem.register(0, 0x900_0000, 4096, Access::REMOTE_WRITE);
    p.a.post(1, read(0, wo), 0, 100, p.b.addr);
    // Out of bounds too.
    p.a.post(2, read(MEM as u64 - 10, p.b.buf), 0, 100, p.b.addr);
    p.b.fill(0, 100, 1);
    p.a.post(3, read(0, p.b.buf), 0x100, 100, p.b.addr);
    p.run(ms(20));
    let st: Vec<_> = p.a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
    assert_eq!(
        st,
        [
            (1, WcStatus::RemAccessErr),
            (2, WcStatus::RemAccessErr),
            (3, WcStatus::Success)
        ]
    );
    let ev = p.b.events();
    assert_eq!(ev.len(), 2);
    assert!(matches!(
        ev[0],
        DgramEvent::RemoteAccess {
            opcode: Opcode::ReadRequest,
            error: MemError::AccessRights,
            msn: 1,
            ..
        }
    ));
    assert!(matches!(
        ev[1],
        DgramEvent::RemoteAccess {
            error: MemError::BaseBounds,
            msn: 2,
            ..
        }
    ));
}

#[test]
fn ord_bounds_outstanding_reads_per_peer() {
    let mut p = Pair::new(|c| c.ord = 2, |_| {});
    for i in 0..5 {
        p.a.post(i, read(0, p.b.buf), 0x100 * i as usize, 16, p.b.addr);
    }
    let d = p.a.tx();
    assert_eq!(d.len(), 2, "only ORD requests go out");
    for x in &d {
        p.deliver(Dir::AtoB, x);
    }
    for x in p.b.tx() {
        p.deliver(Dir::BtoA, &x);
    }
    assert_eq!(p.a.wcs().len(), 2);
    assert_eq!(p.a.tx().len(), 2, "two more once two completed");
    p.run(ms(20));
    assert_eq!(p.a.wcs().len(), 3);
}

#[test]
fn ird_exceeded_is_rem_op_err() {
    let mut p = Pair::new(|_| {}, |c| c.ird = 1);
    p.a.post(1, read(0, p.b.buf), 0, 16, p.b.addr);
    p.a.post(2, read(0, p.b.buf), 0x100, 16, p.b.addr);
    p.run(ms(20));
    let st: Vec<_> = p.a.wcs().iter().map(|c| (c.1.wr_id, c.1.status)).collect();
    assert_eq!(st, [(1, WcStatus::Success), (2, WcStatus::RemOpErr)]);
    assert_eq!(p.b.qp.stats().rx_ird_exceeded, 1);
}

#[test]
fn atomics_run_once_and_responses_are_rebuilt() {
    let mut p = Pair::new(|_| {}, |_| {});
    p.b.mem.bytes_mut(p.b.buf)[0x40..0x48].copy_from_slice(&5u64.to_ne_bytes());
    p.a.post(1, fetch_add(0x40, p.b.buf, 10), 0x100, 8, p.b.addr);
    let req = p.a.tx();
    assert_eq!(req.len(), 1);
    // The request arrives twice: executed once.
    p.deliver(Dir::AtoB, &req[0]);
    p.deliver(Dir::AtoB, &req[0]);
    assert_eq!(p.b.qp.stats().rx_atomics, 1);
    assert_eq!(p.b.qp.stats().rx_duplicates, 1);
    // The response is lost; its retransmission carries the kept
    // original value.
    let resp = p.b.tx();
    let (r1, _) = seg_of(&resp[0]);
    assert!(matches!(
        r1.body,
        RdmapBody::AtomicResponse(AtomicResponse {
            req_id: 1,
            orig_value: 5
        })
    ));
    p.now += ms(600);
    let now = p.now;
    p.b.qp.handle_timeout(now);
    let again = p.b.tx();
    let (r2, _) = seg_of(&again[0]);
    assert_eq!(r1, r2, "same segment from the kept value");
    p.deliver(Dir::BtoA, &again[0]);
    let wc = p.a.wcs()[0].1;
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::FetchAdd, 8)
    );
    assert_eq!(p.a.at(0x100, 8), 5u64.to_ne_bytes());
    assert_eq!(p.b.at(0x40, 8), 15u64.to_ne_bytes());
    // Compare-and-swap, then a mismatch.
    let cas = |compare, swap| SendOp::CompareSwap {
        remote_addr: BASE + 0x40,
        rkey: p.b.buf,
        compare,
        swap,
    };
    let (c1, c2) = (cas(15, 99), cas(15, 7));
    p.a.post(2, c1, 0x108, 8, p.b.addr);
    p.a.post(3, c2, 0x110, 8, p.b.addr);
    p.run(ms(20));
    assert_eq!(p.a.wcs().len(), 2);
    assert_eq!(p.a.at(0x108, 8), 15u64.to_ne_bytes());
    assert_eq!(p.a.at(0x110, 8), 99u64.to_ne_bytes());
    assert_eq!(p.b.at(0x40, 8), 99u64.to_ne_bytes());
    // Misaligned: an error for that request.
    p.a.post(4, fetch_add(0x41, p.b.buf, 1), 0x118, 8, p.b.addr);
    p.run(ms(20));
    assert_eq!(p.a.wcs()[0].1.status, WcStatus::RemOpErr);
    assert!(matches!(
        p.b.events()[..],
        [DgramEvent::RemoteAccess {
            error: MemError::Misaligned,
            ..
        }]
    ));
}
