//! The safe UD API over loopback: the `ibv_ud_pingpong` pattern (replies
//! addressed with `AddressHandle::from_completion`, GRH on), Send with
//! immediate, 64 KiB messages, Write-Record with the validity map queried
//! through `MemoryRegion` offsets, multicast to two receiving contexts, the
//! default `0.0.0.0` bind, and the errors; and the RD API: a round trip of
//! every operation between two contexts, replies by `from_completion`, the
//! Write-Record validity map, a failing request among good ones, and what
//! RD refuses.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use softrdma_verbs::dgram::{PartialAction, GRH_LEN, MCAST_QPN};
use softrdma_verbs::{
    Access, AddressHandle, AhError, AsyncEvent, Completion, CompletionQueue, Context, DgramAddr,
    DgramError, MemoryRegion, Payload, ProtectionDomain, QpCaps, RdPostError, RdQpOptions,
    RdQueuePair, RecvWr, SendFlags, SendOp, SendWr, SgList, UdPostError, UdQpOptions, UdQueuePair,
    WcOpcode, WcStatus, WorkCompletion,
};

const WAIT: Duration = Duration::from_secs(5);
const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);

struct End {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: UdQueuePair,
    mr: MemoryRegion,
}

fn loopback() -> UdQpOptions {
    UdQpOptions {
        bind: (Ipv4Addr::LOCALHOST, 0).into(),
        ..UdQpOptions::default()
    }
}

fn end(opts: UdQpOptions, mem: usize) -> End {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let qp = pd.create_ud_qp(&cq, &cq, QpCaps::default(), opts).unwrap();
    let mr = pd.register(mem, RW).unwrap();
    End {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

fn sgl(mr: &MemoryRegion, off: usize, len: usize) -> SgList {
    let s = mr.sge(off, len as u32);
    SgList::single(s.addr, s.length, s.lkey)
}

fn recv(mr: &MemoryRegion, wr_id: u64, off: usize, len: usize) -> RecvWr {
    RecvWr {
        wr_id,
        sgl: sgl(mr, off, len),
    }
}

fn send(wr_id: u64, payload: SgList, imm: Option<u32>) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            imm,
            invalidate: None,
        },
        payload: Payload::Sgl(payload),
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    }
}

fn wait(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait_one(WAIT).expect("no completion within 5 s").wc
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn read(mr: &MemoryRegion, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    mr.read_at(off, &mut v).unwrap();
    v
}

fn assert_quiet(cq: &CompletionQueue, d: Duration) {
    let deadline = Instant::now() + d;
    let mut buf = [Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }];
    while Instant::now() < deadline {
        assert_eq!(cq.poll(&mut buf), 0, "unexpected {:?}", buf[0]);
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<UdQueuePair>();
    check::<RdQueuePair>();
    check::<AddressHandle>();
}

// ----------------------------------------------------------------------
// ibv_ud_pingpong
// ----------------------------------------------------------------------

#[test]
fn ud_pingpong_with_replies_from_completions_and_grh() {
    const SIZE: usize = 4096;
    const ITERS: u64 = 200;
    const SLOTS: usize = 8;
    // The server puts a GRH in front of every payload, as ibv_ud_pingpong
    // expects; the client does not.
    let server = end(
        UdQpOptions {
            grh: true,
            ..loopback()
        },
        2 * SLOTS * (SIZE + GRH_LEN),
    );
    let client = end(loopback(), 2 * SLOTS * SIZE);
    let stride = SIZE + GRH_LEN;
    for i in 0..SLOTS {
        server
            .qp
            .post_recv(recv(&server.mr, i as u64, i * stride, stride))
            .unwrap();
        client
            .qp
            .post_recv(recv(&client.mr, i as u64, i * SIZE, SIZE))
            .unwrap();
    }
    // Out of band, the client learns the server's IP and QPN (the port
    // follows from the QPN).
    let a = server.qp.address();
    assert_eq!((a.ip, a.qpn >> 8), (LOCAL, u32::from(a.port)));
    let to_server = client.pd.create_ah_by_qpn(a.ip, a.qpn).unwrap();
    assert_eq!(to_server.dest(), a);

    let out = SLOTS * SIZE; // the client's and server's send areas
    let sout = SLOTS * stride;
    for iter in 0..ITERS {
        let data = pattern(iter as u8, SIZE);
        client.mr.write_at(out, &data).unwrap();
        client
            .qp
            .post_send(
                send(1000 + iter, sgl(&client.mr, out, SIZE), None),
                &to_server,
            )
            .unwrap();
        // Server: receive, reply to the sender with the same data.
        let mut req = None;
        while req.is_none() {
            let wc = wait(&server.cq);
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::Recv {
                req = Some(wc);
            }
        }
        let req = req.unwrap();
        assert_eq!(req.byte_len as usize, GRH_LEN + SIZE);
        assert_eq!(req.src, Some(client.qp.address()));
        let at = req.wr_id as usize * stride;
        let got = read(&server.mr, at, GRH_LEN + SIZE);
        assert_eq!(got[0] >> 4, 6, "GRH IPVer");
        assert_eq!(&got[GRH_LEN..], &data[..]);
        server.mr.write_at(sout, &got[GRH_LEN..]).unwrap();
        server
            .qp
            .post_recv(recv(&server.mr, req.wr_id, at, stride))
            .unwrap();
        let back = AddressHandle::from_completion(&server.pd, &req).unwrap();
        assert_eq!(back.dest(), client.qp.address());
        server
            .qp
            .post_send(send(iter, sgl(&server.mr, sout, SIZE), None), &back)
            .unwrap();
        // Client: its send and the reply, in either order.
        let mut reply = None;
        let mut sent = false;
        while reply.is_none() || !sent {
            let wc = wait(&client.cq);
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            match wc.opcode {
                WcOpcode::Send => {
                    assert_eq!(wc.wr_id, 1000 + iter);
                    sent = true;
                }
                WcOpcode::Recv => reply = Some(wc),
                other => panic!("unexpected {other:?}"),
            }
        }
        let reply = reply.unwrap();
        assert_eq!(reply.byte_len as usize, SIZE);
        assert_eq!(reply.src, Some(server.qp.address()));
        let at = reply.wr_id as usize * SIZE;
        assert_eq!(read(&client.mr, at, SIZE), data);
        client
            .qp
            .post_recv(recv(&client.mr, reply.wr_id, at, SIZE))
            .unwrap();
    }
    let s = client.qp.stats();
    assert_eq!((s.ud.tx_messages, s.ud.rx_delivered), (ITERS, ITERS));
    let s = server.qp.stats();
    assert_eq!((s.ud.tx_messages, s.ud.rx_delivered), (ITERS, ITERS));
    assert_eq!(s.ud.rx_no_recv, 0);
}

// ----------------------------------------------------------------------
// Send with immediate, 64 KiB
// ----------------------------------------------------------------------

#[test]
fn send_with_immediate_and_solicited() {
    let a = end(loopback(), 4096);
    let b = end(loopback(), 4096);
    for i in 0..3 {
        b.qp.post_recv(recv(&b.mr, i, i as usize * 1024, 1024))
            .unwrap();
    }
    let ah = a.pd.create_ah(b.qp.address()).unwrap();
    a.mr.write_at(0, &pattern(3, 100)).unwrap();
    a.qp.post_send(send(1, sgl(&a.mr, 0, 100), Some(0xDEAD_BEEF)), &ah)
        .unwrap();
    // Zero-length, immediate only, solicited.
    let mut wr = send(2, SgList::new(), Some(7));
    wr.flags.solicited = true;
    a.qp.post_send(wr, &ah).unwrap();
    for _ in 0..2 {
        let wc = wait(&a.cq);
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Send));
    }
    let mut got = [wait(&b.cq), wait(&b.cq)];
    got.sort_by_key(|wc| wc.byte_len);
    assert_eq!(
        (got[0].byte_len, got[0].imm, got[0].solicited),
        (0, Some(7), true)
    );
    assert_eq!(
        (got[1].byte_len, got[1].imm, got[1].solicited),
        (100, Some(0xDEAD_BEEF), false)
    );
    assert!(got.iter().all(|wc| wc.opcode == WcOpcode::Recv
        && wc.status == WcStatus::Success
        && wc.src == Some(a.qp.address())));
    let at = got[1].wr_id as usize * 1024;
    assert_eq!(read(&b.mr, at, 100), pattern(3, 100));
}

#[test]
fn sixty_four_kib_message_in_mtu_1500_datagrams() {
    const LEN: usize = 64 << 10;
    let a = end(loopback(), LEN);
    let b = end(loopback(), LEN);
    let data = pattern(9, LEN);
    a.mr.write_at(0, &data).unwrap();
    b.qp.post_recv(recv(&b.mr, 5, 0, LEN)).unwrap();
    let ah = a.pd.create_ah(b.qp.address()).unwrap();
    a.qp.post_send(send(1, sgl(&a.mr, 0, LEN), Some(64)), &ah)
        .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let wc = wait(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len, wc.imm),
        (5, WcStatus::Success, LEN as u32, Some(64))
    );
    assert!(read(&b.mr, 0, LEN) == data);
    // 1500 − 28 (IP, UDP) − 22 (DDP + DQPN) − 4 (CRC) = 1446 octets per
    // datagram, plus the Immediate Data segment.
    let s = a.qp.stats();
    assert_eq!(s.ud.tx_datagrams, LEN.div_ceil(1446) as u64 + 1, "{s:?}");
    assert!(s.socket.tx_datagrams >= s.ud.tx_datagrams);
    // One octet more than max_msg is refused at post time.
    let big = end(loopback(), LEN + 1);
    let err = big
        .qp
        .post_send(
            send(2, sgl(&big.mr, 0, LEN + 1), None),
            &big.pd.create_ah(b.qp.address()).unwrap(),
        )
        .unwrap_err();
    assert_eq!(
        err,
        UdPostError::MessageTooLong {
            len: LEN as u64 + 1,
            max: LEN
        }
    );
    assert!(err.to_string().contains("65537-octet"), "{err}");
}

// ----------------------------------------------------------------------
// Write-Record
// ----------------------------------------------------------------------

#[test]
fn write_record_completion_and_validity_map_through_memory_regions() {
    const LEN: usize = 10_000;
    let a = end(loopback(), LEN);
    let b = end(loopback(), 64 << 10);
    b.qp.set_record_partial_timeout(Duration::from_millis(50));
    b.qp.set_record_partial_action(PartialAction::Deliver);
    let data = pattern(77, LEN);
    a.mr.write_at(0, &data).unwrap();
    let ah = a.pd.create_ah(b.qp.address()).unwrap();
    let record = |wr_id, off: usize, len: usize, at: usize| SendWr {
        wr_id,
        op: SendOp::WriteRecord {
            remote_addr: b.mr.addr() + at as u64,
            rkey: b.mr.rkey(),
        },
        payload: Payload::Sgl(sgl(&a.mr, off, len)),
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    };
    a.qp.post_send(record(1, 0, LEN, 4096), &ah).unwrap();
    let s = wait(&a.cq);
    assert_eq!(
        (s.status, s.opcode),
        (WcStatus::Success, WcOpcode::WriteRecord)
    );
    let r = wait(&b.cq);
    assert_eq!(
        (r.status, r.opcode, r.byte_len),
        (WcStatus::Success, WcOpcode::RecvWriteRecord, LEN as u32)
    );
    let info = r.record.unwrap();
    assert_eq!(
        (info.stag, info.to, info.len, info.n_ranges, info.ranges[0]),
        (
            b.mr.rkey(),
            b.mr.addr() + 4096,
            LEN as u32,
            1,
            (0, LEN as u32)
        )
    );
    // A reply to the writer is addressed from the record's source.
    assert_eq!(
        AddressHandle::from_completion(&b.pd, &r).unwrap().dest(),
        a.qp.address()
    );
    assert_eq!(read(&b.mr, 4096, LEN), data);

    // The validity map, in region offsets.
    let q = &b.qp;
    assert_eq!(
        q.record_valid_ranges(&b.mr, 0, 64 << 10).unwrap(),
        vec![4096..4096 + LEN]
    );
    assert_eq!(
        q.record_valid_ranges(&b.mr, 5000, 100).unwrap(),
        vec![5000..5100]
    );
    assert!(q.record_is_valid(&b.mr, 4096, LEN).unwrap());
    assert!(!q.record_is_valid(&b.mr, 4095, 2).unwrap());
    q.record_clear(&b.mr, 5096, 1000).unwrap();
    assert!(!q.record_is_valid(&b.mr, 4096, LEN).unwrap());
    assert_eq!(
        q.record_valid_ranges(&b.mr, 0, 64 << 10).unwrap(),
        vec![4096..5096, 6096..4096 + LEN]
    );
    // Bounds are the region's.
    assert!(q.record_valid_ranges(&b.mr, 60 << 10, 8 << 10).is_err());
    assert!(q.record_is_valid(&b.mr, usize::MAX, 2).is_err());
    assert!(q.record_clear(&b.mr, 64 << 10, 1).is_err());

    // Many small records: more ranges than one engine query returns.
    for i in 0..40u64 {
        a.qp.post_send(record(10 + i, 0, 10, 32768 + 100 * i as usize), &ah)
            .unwrap();
    }
    for _ in 0..40 {
        assert_eq!(wait(&a.cq).status, WcStatus::Success);
        assert_eq!(wait(&b.cq).opcode, WcOpcode::RecvWriteRecord);
    }
    let r = q.record_valid_ranges(&b.mr, 32768, 8192).unwrap();
    let want: Vec<_> = (0..40)
        .map(|i| 32768 + 100 * i..32768 + 100 * i + 10)
        .collect();
    assert_eq!(r, want);

    // A region's state can be forgotten.
    q.record_forget(&b.mr);
    assert_eq!(q.record_valid_ranges(&b.mr, 0, 64 << 10).unwrap(), vec![]);
    let st = q.stats();
    assert_eq!(st.record.completed, 41, "{st:?}");
    assert_eq!(st.ud.rx_record_segments, 7 + 40);
}

// ----------------------------------------------------------------------
// Multicast
// ----------------------------------------------------------------------

#[test]
fn multicast_to_two_receiving_contexts() {
    let pid = std::process::id();
    let group = IpAddr::V4(Ipv4Addr::new(239, 78, (pid >> 8) as u8, pid as u8));
    let s = end(loopback(), 4096);
    let r1 = end(loopback(), 4096);
    let r2 = end(loopback(), 4096);
    for r in [&r1, &r2] {
        for i in 0..2 {
            r.qp.post_recv(recv(&r.mr, i, i as usize * 2048, 2048))
                .unwrap();
        }
        r.qp.attach_mcast(group).unwrap();
        r.qp.attach_mcast(group).unwrap(); // twice: a no-op
    }
    let ah = s.pd.create_mcast_ah(group).unwrap();
    assert!(ah.is_multicast());
    assert_eq!((ah.dest().ip, ah.dest().qpn), (group, MCAST_QPN));
    let data = pattern(5, 2000);
    s.mr.write_at(0, &data).unwrap();
    s.qp.post_send(send(1, sgl(&s.mr, 0, 2000), Some(42)), &ah)
        .unwrap();
    assert_eq!(wait(&s.cq).status, WcStatus::Success);
    for r in [&r1, &r2] {
        let wc = wait(&r.cq);
        assert_eq!(
            (wc.status, wc.byte_len, wc.imm, wc.src),
            (WcStatus::Success, 2000, Some(42), Some(s.qp.address()))
        );
        assert_eq!(read(&r.mr, wc.wr_id as usize * 2048, 2000), data);
        assert!(r.qp.stats().mcast_socket.rx_datagrams > 0);
    }
    // Detached, r2 gets no more; r1 still does.
    r2.qp.detach_mcast(group).unwrap();
    assert!(matches!(
        r2.qp.detach_mcast(group),
        Err(DgramError::NotAttached)
    ));
    s.qp.post_send(send(2, sgl(&s.mr, 0, 10), None), &ah)
        .unwrap();
    assert_eq!(wait(&s.cq).status, WcStatus::Success);
    assert_eq!(wait(&r1.cq).byte_len, 10);
    assert_quiet(&r2.cq, Duration::from_millis(100));
    // Group addresses are checked.
    let unicast: IpAddr = "10.1.2.3".parse().unwrap();
    assert_eq!(
        s.pd.create_mcast_ah(unicast).unwrap_err(),
        AhError::NotMulticast(unicast)
    );
    assert!(matches!(
        r1.qp.attach_mcast(unicast),
        Err(DgramError::NotMulticast)
    ));
    drop(r1.ctx);
}

// ----------------------------------------------------------------------
// Addresses
// ----------------------------------------------------------------------

#[test]
fn default_bind_is_every_interface_with_a_reachable_address() {
    let b = end(UdQpOptions::default(), 4096);
    assert!(b.qp.local_addr().ip().is_unspecified());
    let addr = b.qp.address();
    assert!(!addr.ip.is_unspecified(), "{addr:?}");
    assert_eq!(addr.qpn >> 8, u32::from(addr.port));
    assert_eq!(
        b.qp.address_toward(LOCAL).unwrap(),
        DgramAddr { ip: LOCAL, ..addr }
    );
    // Reachable over loopback and at the host address.
    let a = end(loopback(), 4096);
    for (i, ip) in [LOCAL, addr.ip].into_iter().enumerate() {
        b.qp.post_recv(recv(&b.mr, i as u64, 0, 4096)).unwrap();
        let ah = a.pd.create_ah(DgramAddr { ip, ..addr }).unwrap();
        a.qp.post_send(send(i as u64, sgl(&a.mr, 0, 33), None), &ah)
            .unwrap();
        let wc = wait(&b.cq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 33));
        // The reply goes back to the loopback-bound sender.
        assert_eq!(wc.src, Some(a.qp.address()));
        assert_eq!(wait(&a.cq).status, WcStatus::Success);
    }
}

// ----------------------------------------------------------------------
// Errors
// ----------------------------------------------------------------------

#[test]
fn operations_ud_does_not_take_are_refused_with_a_clear_error() {
    let a = end(loopback(), 4096);
    let ah = a.pd.create_ah(a.qp.address()).unwrap();
    let wr = |op| SendWr {
        wr_id: 1,
        op,
        payload: Payload::Sgl(sgl(&a.mr, 0, 8)),
        flags: SendFlags::default(),
    };
    let read =
        a.qp.post_send(
            wr(SendOp::Read {
                remote_addr: 0,
                rkey: 1,
            }),
            &ah,
        )
        .unwrap_err();
    assert_eq!(read, UdPostError::Unsupported { op: "RDMA Read" });
    let msg = read.to_string();
    assert!(
        msg.contains("RDMA Read is not supported on UD"),
        "Display: {msg}"
    );
    for (op, name) in [
        (
            SendOp::Send {
                imm: None,
                invalidate: Some(3),
            },
            "Send with Invalidate",
        ),
        (
            SendOp::Write {
                remote_addr: 0,
                rkey: 1,
                imm: Some(1),
            },
            "RDMA Write with immediate",
        ),
        (
            SendOp::CompareSwap {
                remote_addr: 0,
                rkey: 1,
                compare: 0,
                swap: 1,
            },
            "atomic compare-and-swap",
        ),
        (
            SendOp::FetchAdd {
                remote_addr: 0,
                rkey: 1,
                add: 1,
            },
            "atomic fetch-and-add",
        ),
        (SendOp::LocalInvalidate { stag: 1 }, "local invalidate"),
    ] {
        let e = a.qp.post_send(wr(op), &ah).unwrap_err();
        assert_eq!(e, UdPostError::Unsupported { op: name });
        assert!(e.to_string().contains("not supported on UD"), "{e}");
    }
    // Nothing was queued.
    assert_quiet(&a.cq, Duration::from_millis(20));
    assert_eq!(a.qp.stats().ud.tx_datagrams, 0);

    // An address handle of another protection domain.
    let other = a.ctx.alloc_pd().create_ah(a.qp.address()).unwrap();
    let e = a.qp.post_send(send(1, SgList::new(), None), &other);
    assert_eq!(e, Err(UdPostError::ForeignAddressHandle));
    let elsewhere = end(loopback(), 4096);
    let foreign = elsewhere.pd.create_ah(a.qp.address()).unwrap();
    assert_eq!(
        a.qp.post_send(send(1, SgList::new(), None), &foreign),
        Err(UdPostError::ForeignAddressHandle)
    );
}

#[test]
fn address_handle_and_creation_errors() {
    let a = end(loopback(), 4096);
    let pd = &a.pd;
    assert_eq!(
        pd.create_ah_to(LOCAL, 100, 1 << 24).unwrap_err(),
        AhError::InvalidQpn(1 << 24)
    );
    assert_eq!(
        pd.create_ah_by_qpn(LOCAL, 0x0100_0000).unwrap_err(),
        AhError::InvalidQpn(0x0100_0000)
    );
    assert_eq!(
        pd.create_ah_to(LOCAL, 0, 5).unwrap_err(),
        AhError::InvalidPort
    );
    assert_eq!(
        pd.create_ah_to(Ipv4Addr::UNSPECIFIED.into(), 100, 100 << 8)
            .unwrap_err(),
        AhError::UnspecifiedAddress
    );
    let rc = WorkCompletion::new(1, WcStatus::Success, WcOpcode::Recv, 4);
    let e = AddressHandle::from_completion(pd, &rc).unwrap_err();
    assert_eq!(e, AhError::NoSource);
    assert!(e.to_string().contains("no source"), "{e}");
    // Settings the engine refuses.
    let cq = a.ctx.create_cq(4, None);
    let bad_mtu = UdQpOptions {
        mtu: Some(64),
        ..loopback()
    };
    let e = pd
        .create_ud_qp(&cq, &cq, QpCaps::default(), bad_mtu)
        .unwrap_err();
    assert!(matches!(e, DgramError::Config(_)), "{e}");
    assert!(e.to_string().contains("MTU"), "{e}");
    let zero = QpCaps {
        max_send_wr: 0,
        max_recv_wr: 1,
    };
    assert!(pd.create_ud_qp(&cq, &cq, zero, loopback()).is_err());
    // A full receive queue.
    let small = pd
        .create_ud_qp(
            &cq,
            &cq,
            QpCaps {
                max_send_wr: 1,
                max_recv_wr: 2,
            },
            loopback(),
        )
        .unwrap();
    small.post_recv(recv(&a.mr, 1, 0, 16)).unwrap();
    small.post_recv(recv(&a.mr, 2, 16, 16)).unwrap();
    assert_eq!(
        small.post_recv(recv(&a.mr, 3, 32, 16)),
        Err(UdPostError::QueueFull)
    );
    // QPs of one context and address share a socket: QPNs differ by slot.
    assert_eq!(small.qpn() >> 8, a.qp.qpn() >> 8);
    assert_ne!(small.qpn(), a.qp.qpn());
}

// ----------------------------------------------------------------------
// RD
// ----------------------------------------------------------------------

struct RdEnd {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: RdQueuePair,
    mr: MemoryRegion,
}

fn rd_end(mem: usize) -> RdEnd {
    let ctx = Context::open().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let opts = RdQpOptions {
        bind: (Ipv4Addr::LOCALHOST, 0).into(),
        mtu: Some(1500),
        ..RdQpOptions::default()
    };
    let qp = pd.create_rd_qp(&cq, &cq, QpCaps::default(), opts).unwrap();
    let mr = pd.register(mem, Access(1 | 2 | 4 | 8)).unwrap();
    RdEnd {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

fn signaled(wr_id: u64, op: SendOp, payload: SgList) -> SendWr {
    SendWr {
        wr_id,
        op,
        payload: Payload::Sgl(payload),
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    }
}

#[test]
fn rd_round_trip_of_every_operation_through_the_verbs_api() {
    const K: usize = 1024;
    let a = rd_end(256 * K);
    let b = rd_end(256 * K);
    // Memory: a's [0, 64K) is the source, [64K, 128K) the Read sink,
    // [128K, ...) the reply receive and the atomic result; b's [0, 64K)
    // receives, [64K, 128K) takes the Write, [128K, 192K) is read from,
    // [192K, ...) the Write-Record target and the atomic word.
    let data = pattern(7, 64 * K);
    a.mr.write_at(0, &data).unwrap();
    let readable = pattern(9, 64 * K);
    b.mr.write_at(128 * K, &readable).unwrap();
    b.mr.write_at(250 * K, &41u64.to_ne_bytes()).unwrap();
    b.qp.post_recv(recv(&b.mr, 1, 0, 64 * K)).unwrap();
    a.qp.post_recv(recv(&a.mr, 2, 128 * K, 4 * K)).unwrap();
    let to_b = a.pd.create_ah(b.qp.address()).unwrap();
    let remote = |off: usize| b.mr.addr() + off as u64;
    let rkey = b.mr.rkey();

    // A 40 KiB Send with immediate (29 datagrams), a Write, a Read, an
    // atomic, a Write-Record.
    let ops = [
        (
            10,
            send(10, sgl(&a.mr, 0, 40 * K), Some(0xabcd)).op,
            40 * K,
            0,
        ),
        (
            11,
            SendOp::Write {
                remote_addr: remote(64 * K),
                rkey,
                imm: None,
            },
            20 * K,
            0,
        ),
        (
            12,
            SendOp::Read {
                remote_addr: remote(128 * K + 5),
                rkey,
            },
            30 * K,
            64 * K,
        ),
        (
            13,
            SendOp::FetchAdd {
                remote_addr: remote(250 * K),
                rkey,
                add: 1,
            },
            8,
            132 * K,
        ),
        (
            14,
            SendOp::WriteRecord {
                remote_addr: remote(192 * K + 100),
                rkey,
            },
            5000,
            1000,
        ),
    ];
    for (wr_id, op, len, off) in ops {
        a.qp.post_send(signaled(wr_id, op, sgl(&a.mr, off, len)), &to_b)
            .unwrap();
    }
    let mut done: Vec<_> = (0..5).map(|_| wait(&a.cq)).collect();
    // The target got the Send and the Write-Record record.
    let req = wait(&b.cq);
    assert_eq!(
        (req.wr_id, req.status, req.opcode, req.byte_len, req.imm),
        (
            1,
            WcStatus::Success,
            WcOpcode::Recv,
            40 * K as u32,
            Some(0xabcd)
        )
    );
    assert_eq!(read(&b.mr, 0, 40 * K), data[..40 * K]);
    let rec = wait(&b.cq);
    assert_eq!(
        (rec.status, rec.opcode, rec.byte_len),
        (WcStatus::Success, WcOpcode::RecvWriteRecord, 5000)
    );
    // Reply to whoever sent the request.
    let back = AddressHandle::from_completion(&b.pd, &req).unwrap();
    assert_eq!(back.dest(), a.qp.address());
    b.qp.post_send(send(20, sgl(&b.mr, 64 * K, 100), None), &back)
        .unwrap();
    assert_eq!(
        (wait(&b.cq).wr_id, WcStatus::Success),
        (20, WcStatus::Success)
    );
    done.push(wait(&a.cq));
    let summary: Vec<_> = done
        .iter()
        .map(|wc| (wc.wr_id, wc.status, wc.opcode, wc.byte_len))
        .collect();
    let ok = WcStatus::Success;
    assert_eq!(
        summary,
        vec![
            (10, ok, WcOpcode::Send, 40 * K as u32),
            (11, ok, WcOpcode::RdmaWrite, 20 * K as u32),
            (12, ok, WcOpcode::RdmaRead, 30 * K as u32),
            (13, ok, WcOpcode::FetchAdd, 8),
            (14, ok, WcOpcode::WriteRecord, 5000),
            (2, ok, WcOpcode::Recv, 100),
        ]
    );
    assert_eq!(done[5].src, Some(b.qp.address()));
    assert_eq!(read(&b.mr, 64 * K, 20 * K), data[..20 * K]);
    assert_eq!(read(&a.mr, 64 * K, 30 * K), readable[5..5 + 30 * K]);
    assert_eq!(read(&a.mr, 128 * K, 100), data[..100]);
    assert_eq!(read(&a.mr, 132 * K, 8), 41u64.to_ne_bytes());
    assert_eq!(read(&b.mr, 250 * K, 8), 42u64.to_ne_bytes());
    assert_eq!(read(&b.mr, 192 * K + 100, 5000), data[1000..6000]);
    // The Write-Record validity map in region offsets.
    let valid = b.qp.record_valid_ranges(&b.mr, 192 * K, 64 * K).unwrap();
    assert_eq!(valid.len(), 1, "{valid:?}");
    assert_eq!(valid[0], 192 * K + 100..192 * K + 5100);
    assert_eq!(b.qp.record_is_valid(&b.mr, 192 * K + 100, 5000), Ok(true));
    b.qp.record_clear(&b.mr, 192 * K + 100, 1000).unwrap();
    assert_eq!(b.qp.record_is_valid(&b.mr, 192 * K + 100, 5000), Ok(false));
    assert!(b.qp.record_valid_ranges(&b.mr, 256 * K, 1).is_err());

    // The counters.
    let sa = a.qp.stats();
    let sb = b.qp.stats();
    assert_eq!((sa.rd.tx_messages, sa.rd.tx_errors), (5, 0), "{sa:?}");
    assert_eq!(sb.rd.rx_delivered, 1, "{sb:?}");
    assert!(sa.reliability.data_sent >= 29 + 15 + 1 + 1 + 4, "{sa:?}");
    assert_eq!(sb.reliability.peers_failed, 0);
    assert!(sb.socket.rx_datagrams > 0);
    assert_eq!(sb.record.completed, 1, "{sb:?}");
    assert_quiet(&a.cq, Duration::from_millis(20));
    assert_quiet(&b.cq, Duration::from_millis(20));
}

#[test]
fn rd_failed_request_fails_alone_and_refusals_are_clear() {
    let a = rd_end(64 * 1024);
    let b = rd_end(64 * 1024);
    let to_b = a.pd.create_ah(b.qp.address()).unwrap();
    b.qp.post_recv(recv(&b.mr, 1, 0, 4096)).unwrap();
    // A Write with a wrong rkey between two Sends; the second Send finds
    // no receive posted (RD does not retry that).
    let bad = SendOp::Write {
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey() ^ 0x100,
        imm: None,
    };
    a.qp.post_send(send(1, sgl(&a.mr, 0, 100), None), &to_b)
        .unwrap();
    a.qp.post_send(signaled(2, bad, sgl(&a.mr, 0, 100)), &to_b)
        .unwrap();
    a.qp.post_send(send(3, sgl(&a.mr, 0, 100), None), &to_b)
        .unwrap();
    let got: Vec<_> = (0..3)
        .map(|_| wait(&a.cq))
        .map(|wc| (wc.wr_id, wc.status))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::RemAccessErr),
            (3, WcStatus::RnrRetryExcErr)
        ]
    );
    assert_eq!(wait(&b.cq).wr_id, 1);
    let mut saw = false;
    while let Some(e) = b.ctx.get_async_event(Some(WAIT)) {
        if matches!(e, AsyncEvent::DgramRemoteAccessError { qpn, .. } if qpn == b.qp.qpn()) {
            saw = true;
            break;
        }
    }
    assert!(saw, "the target raised a remote access event");
    assert_eq!(b.qp.stats().rd.rx_no_recv, 1);

    // What RD refuses, before anything is queued.
    let wr = |op| signaled(9, op, sgl(&a.mr, 0, 8));
    for (op, name) in [
        (
            SendOp::Send {
                imm: None,
                invalidate: Some(3),
            },
            "Send with Invalidate",
        ),
        (
            SendOp::Write {
                remote_addr: 0,
                rkey: 1,
                imm: Some(1),
            },
            "RDMA Write with immediate",
        ),
        (SendOp::LocalInvalidate { stag: 1 }, "local invalidate"),
    ] {
        let e = a.qp.post_send(wr(op), &to_b).unwrap_err();
        assert_eq!(e, RdPostError::Unsupported { op: name });
        assert!(e.to_string().contains("not supported on RD"), "{e}");
    }
    let fadd = SendOp::FetchAdd {
        remote_addr: 0,
        rkey: 1,
        add: 1,
    };
    assert_eq!(
        a.qp.post_send(signaled(9, fadd, sgl(&a.mr, 0, 4)), &to_b),
        Err(RdPostError::Invalid)
    );
    let group = a.pd.create_mcast_ah("239.1.2.3".parse().unwrap()).unwrap();
    assert_eq!(
        a.qp.post_send(send(9, sgl(&a.mr, 0, 8), None), &group),
        Err(RdPostError::MulticastAddressHandle)
    );
    let foreign = b.pd.create_ah(b.qp.address()).unwrap();
    assert_eq!(
        a.qp.post_send(send(9, sgl(&a.mr, 0, 8), None), &foreign),
        Err(RdPostError::ForeignAddressHandle)
    );
    let small = RdQpOptions {
        max_msg: 1000,
        bind: (Ipv4Addr::LOCALHOST, 0).into(),
        ..RdQpOptions::default()
    };
    let c =
        a.pd.create_rd_qp(&a.cq, &a.cq, QpCaps::default(), small)
            .unwrap();
    assert_eq!(
        c.post_send(send(9, sgl(&a.mr, 0, 1001), None), &to_b),
        Err(RdPostError::MessageTooLong {
            len: 1001,
            max: 1000
        })
    );
    // Settings the engine refuses.
    let bad = RdQpOptions {
        mtu: Some(64),
        ..RdQpOptions::default()
    };
    let e =
        a.pd.create_rd_qp(&a.cq, &a.cq, QpCaps::default(), bad)
            .unwrap_err();
    assert!(matches!(e, DgramError::RdConfig(_)), "{e}");
    assert_quiet(&a.cq, Duration::from_millis(20));
    assert_eq!(a.qp.stats().rd.tx_messages, 1);
}
