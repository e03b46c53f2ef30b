//! UD transmit: the shortcut and staged batches against the general
//! path, sink push-back and errors, refused posts.

use super::*;

/// A sink that says which entry point a datagram came through
/// (`send`: only the transmit shortcut calls it directly) and can push
/// back or fail like a socket.
#[derive(Default)]
struct TraceSink {
    inner: VecSink,
    direct: usize,
}

impl DatagramSink for TraceSink {
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        self.direct += 1;
        self.inner.send(dest, bufs)
    }

    fn send_batch(&mut self, batch: &[Datagram<'_>]) -> io::Result<usize> {
        self.inner.send_batch(batch)
    }
}

#[test]
fn transmit_shortcut_matches_the_general_path() {
    // (name, work request, shortcut expected when the queue is empty).
    let n = a();
    let imm = |v| SendOp::Send {
        imm: v,
        invalidate: None,
    };
    let write = SendOp::Write {
        remote_addr: 0x40_0000,
        rkey: 0x1234,
        imm: None,
    };
    let record = SendOp::WriteRecord {
        remote_addr: 0x40_0000,
        rkey: 0x1234,
    };
    let three = SgList::from_slice(&[
        Sge {
            addr: BASE + 10,
            length: 7,
            lkey: n.buf,
        },
        Sge {
            addr: BASE + 900,
            length: 0,
            lkey: 0xdead_0000,
        },
        Sge {
            addr: BASE + 300,
            length: 50,
            lkey: n.buf,
        },
    ])
    .expect("three entries");
    let mut unsignaled = n.wr(6, imm(None), 0, 64);
    unsignaled.flags = SendFlags::default();
    let mut solicited = n.wr(7, imm(None), 0, 64);
    solicited.flags.solicited = true;
    let mut bad_key = n.wr(12, imm(None), 0, 64);
    bad_key.payload = Payload::Sgl(SgList::single(BASE, 64, n.buf ^ 0x100));
    let mut past_end = n.wr(13, imm(None), (1 << 20) - 32, 64);
    past_end.payload = Payload::Sgl(SgList::single(BASE + (1 << 20) - 32, 64, n.buf));
    let mut inline = n.wr(14, imm(None), 0, 0);
    inline.payload = Payload::Inline(InlineData::new(&pattern(40, 3)).expect("fits"));
    let mut sgl3 = n.wr(15, imm(None), 0, 0);
    sgl3.payload = Payload::Sgl(three);
    let cases: Vec<(&str, SendWr, bool)> = vec![
        ("send 64", n.wr(1, imm(None), 0, 64), true),
        ("send 0", n.wr(2, imm(None), 0, 0), true),
        ("send 512", n.wr(3, imm(None), 0, 512), true),
        ("send 513", n.wr(4, imm(None), 0, 513), false),
        ("imm, no payload", n.wr(5, imm(Some(9)), 0, 0), true),
        ("unsignaled", unsignaled, true),
        ("solicited", solicited, true),
        ("imm + payload", n.wr(8, imm(Some(9)), 0, 10), false),
        ("write 100", n.wr(9, write, 0, 100), true),
        ("write-record 100", n.wr(10, record, 0, 100), true),
        ("send 2 datagrams", n.wr(11, imm(None), 0, 2000), false),
        ("bad lkey", bad_key, false),
        ("past the region", past_end, false),
        ("inline", inline, true),
        ("three pieces", sgl3, true),
        (
            "read",
            n.wr(
                16,
                SendOp::Read {
                    remote_addr: 0,
                    rkey: 1,
                },
                0,
                8,
            ),
            false,
        ),
    ];
    let dest = b().addr;
    // How the sink treats the post's datagrams: takes all; pushes back
    // (then takes all on the next poll); fails the first.
    for mode in ["all", "would-block", "fail"] {
        let sink = || {
            let mut s = TraceSink::default();
            match mode {
                "would-block" => s.inner.budget = Some(0),
                "fail" => s.inner.fail_next = Some(io::ErrorKind::ConnectionRefused),
                _ => {}
            }
            s
        };
        let (mut fast, mut slow) = (a(), a());
        for node in [&mut fast, &mut slow] {
            node.fill(0, 4096, 5);
        }
        for (name, wr, qualifies) in &cases {
            let (mut fs, mut ss) = (sink(), sink());
            let fr = fast
                .qp
                .post_send_and_transmit(*wr, dest, &fast.mem, &mut fs);
            let sr = slow
                .qp
                .post_send(*wr, dest)
                .map(|()| slow.qp.poll_transmit(&slow.mem, &mut ss));
            let what = format!("{name} ({mode})");
            let kinds = |r: &Result<io::Result<usize>, PostError>| match r {
                Ok(Ok(k)) => Ok(Ok(*k)),
                Ok(Err(e)) => Ok(Err(e.kind())),
                Err(e) => Err(*e),
            };
            assert_eq!(kinds(&fr), kinds(&sr), "{what}: returns");
            assert_eq!(fs.inner.out, ss.inner.out, "{what}: datagrams");
            let took = fs.direct > 0;
            assert_eq!(took, *qualifies, "{what}: shortcut taken");
            assert_eq!(ss.direct, 0, "{what}: the general path batches");
            assert_eq!(fast.wcs(), slow.wcs(), "{what}: completions");
            assert_eq!(fast.qp.stats(), slow.qp.stats(), "{what}: counters");
            let wants = fast.qp.wants_transmit();
            assert_eq!(wants, slow.qp.wants_transmit(), "{what}: pending");
            if *qualifies {
                assert_eq!(wants, mode == "would-block", "{what}: pending");
            }
            // Whatever stayed queued goes the same way later.
            let (mut fs, mut ss) = (TraceSink::default(), TraceSink::default());
            let fr = fast
                .qp
                .poll_transmit(&fast.mem, &mut fs)
                .map_err(|e| e.kind());
            let sr = slow
                .qp
                .poll_transmit(&slow.mem, &mut ss)
                .map_err(|e| e.kind());
            assert_eq!(fr, sr, "{what}: later returns");
            assert_eq!(fs.inner.out, ss.inner.out, "{what}: later datagrams");
            assert_eq!(fast.wcs(), slow.wcs(), "{what}: later completions");
            assert_eq!(fast.qp.stats(), slow.qp.stats(), "{what}: later counters");
            assert!(!fast.qp.wants_transmit(), "{what}: all sent");
        }
    }
    // Behind a queued request the shortcut waits its turn.
    let mut q = a();
    q.qp.post_send(q.wr(1, imm(None), 0, 64), dest)
        .expect("posted");
    let mut s = TraceSink::default();
    let r =
        q.qp.post_send_and_transmit(q.wr(2, imm(None), 0, 64), dest, &q.mem, &mut s);
    assert_eq!(r.expect("posted").expect("sent"), 2);
    assert_eq!(s.direct, 0, "queued first: no shortcut");
    let ids: Vec<u64> = q.wcs().iter().map(|(_, wc)| wc.wr_id).collect();
    assert_eq!(ids, [1, 2], "in order");
}

/// Records each datagram's octets and how many buffers it came in.
#[derive(Default)]
struct PieceSink {
    inner: VecSink,
    pieces: Vec<usize>,
}

impl DatagramSink for PieceSink {
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        self.inner.send(dest, bufs)?;
        self.pieces.push(bufs.len());
        Ok(())
    }
}

#[test]
fn staged_batches_send_what_the_gather_sends() {
    // Batches of five or more datagrams are framed into the staging
    // buffer and offered one buffer per datagram; the octets,
    // completions and counters must be those of the gather path
    // (`send_planned_n`, driven here the way `poll_transmit` drives
    // it), for every MTU, gather list, mix of requests, and a sink
    // that takes only part of a batch.
    let dest = b().addr;
    let record = SendOp::WriteRecord {
        remote_addr: 0x40_0000,
        rkey: 0x1234,
    };
    let send = SendOp::Send {
        imm: None,
        invalidate: None,
    };
    let gather3 = |n: &Node| {
        // Pieces of 1 000, 5 and 40 000 octets: datagram boundaries
        // fall inside and across them.
        let sges = [(0u64, 1000u32), (70_000, 5), (100_000, 40_000)];
        let v: Vec<Sge> = sges
            .iter()
            .map(|&(off, length)| Sge {
                addr: BASE + off,
                length,
                lkey: n.buf,
            })
            .collect();
        Payload::Sgl(SgList::from_slice(&v).expect("three entries"))
    };
    // (name, MTU, requests as (op, offset, length), three-piece list).
    type Case = (&'static str, usize, Vec<(SendOp, usize, usize)>, bool);
    let cases: Vec<Case> = vec![
        ("send 20 000", 1500, vec![(send, 0, 20_000)], false),
        (
            "write-record 64 KiB",
            1500,
            vec![(record, 0, 65_536)],
            false,
        ),
        ("three pieces", 1500, vec![(record, 0, 0)], true),
        (
            "a mix in one batch",
            1500,
            vec![
                (send, 0, 3000),
                (send, 7, 100),
                (record, 9, 5000),
                (send, 0, 0),
            ],
            false,
        ),
        (
            "MTU 9000: seven per stage",
            9000,
            vec![(record, 0, 200_000)],
            false,
        ),
        (
            "MTU 65535: too big to stage",
            65_535,
            vec![(send, 0, 300_000)],
            false,
        ),
    ];
    for (name, mtu, reqs, three) in &cases {
        for budget in [None, Some(3)] {
            let what = format!("{name} (budget {budget:?})");
            let mk = || {
                let mut n = node([10, 0, 0, 1], 4791, 1, |c| {
                    c.mtu = *mtu;
                    c.max_msg = 1 << 20;
                });
                n.fill(0, 1 << 20, 9);
                for (i, &(op, off, len)) in reqs.iter().enumerate() {
                    let mut wr = n.wr(i as u64 + 1, op, off, len);
                    if *three {
                        wr.payload = gather3(&n);
                    }
                    n.qp.post_send(wr, dest).expect("posted");
                }
                n
            };
            let (mut staged, mut gathered) = (mk(), mk());
            // The staging path, through `poll_transmit`, with a sink
            // that pushes back after `budget` datagrams per poll.
            let mut ss = PieceSink::default();
            let mut polls = 0;
            while staged.qp.wants_transmit() {
                ss.inner.budget = budget;
                staged.qp.poll_transmit(&staged.mem, &mut ss).expect("sent");
                polls += 1;
                assert!(polls < 10_000, "{what}: no progress");
            }
            // A batch the staging buffer cut short is not a sink
            // pushing back: one poll sends all a willing sink takes.
            if budget.is_none() {
                assert_eq!(polls, 1, "{what}: polls to send everything");
            }
            // The gather path.
            let mut gs = PieceSink::default();
            let mut plan = [Planned::default(); TX_BATCH];
            loop {
                let n = gathered.qp.plan(&gathered.mem, &mut plan);
                if n == 0 {
                    break;
                }
                let k = gathered
                    .qp
                    .send_planned_n::<_, _, TX_BATCH, { TX_BATCH * IOV_PER }>(
                        &gathered.mem,
                        &mut gs,
                        &plan[..n],
                    )
                    .expect("sent");
                gathered.qp.commit(&plan[..k]);
            }
            assert!(!ss.inner.out.is_empty(), "{what}: sent something");
            assert_eq!(ss.inner.out.len(), gs.inner.out.len(), "{what}: datagrams");
            for (i, (x, y)) in ss.inner.out.iter().zip(&gs.inner.out).enumerate() {
                assert!(x == y, "{what}: datagram {i} differs");
            }
            assert_eq!(staged.wcs(), gathered.wcs(), "{what}: completions");
            assert_eq!(staged.qp.stats(), gathered.qp.stats(), "{what}: counters");
            // Which path framed them: one buffer per staged datagram,
            // header + pieces + trailer per gathered one.
            // (A Send without payload has no piece between the two.)
            assert!(gs.pieces.iter().all(|&p| p >= 2), "{what}: gathered");
            let too_big = *mtu > STAGE_MAX_DGRAM;
            let one_buffer = ss.pieces.iter().filter(|&&p| p == 1).count();
            if too_big {
                assert_eq!(one_buffer, 0, "{what}: nothing staged");
            } else if budget.is_none() {
                // Every datagram but those of a last batch of at most
                // four (sent without staging) came in one buffer.
                assert!(
                    one_buffer + 4 >= ss.pieces.len(),
                    "{what}: staged {one_buffer} of {}",
                    ss.pieces.len()
                );
                assert!(one_buffer > 0, "{what}: staged");
            }
        }
    }
}

#[test]
fn would_block_keeps_segments_pending() {
    let (mut a, mut b) = (a(), b());
    let data = a.fill(0, 7000, 3);
    b.recv(1, 0, 8000);
    a.send(1, 0, 7000, None, b.addr);
    let mut sink = VecSink {
        budget: Some(2),
        ..VecSink::default()
    };
    assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 2);
    assert!(
        a.wcs().is_empty(),
        "not complete before every datagram left"
    );
    assert!(a.qp.wants_transmit());
    sink.budget = Some(0);
    assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 0);
    sink.budget = None;
    assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 3);
    assert_eq!(a.wcs().len(), 1);
    assert_eq!(sink.out.len(), 5);
    assert!(sink.out.iter().all(|(d, _)| *d == (b.addr.ip, b.addr.port)));
    for (_, s) in &sink.out {
        b.rx(a.addr, s, Instant::now());
    }
    assert_eq!(b.wcs()[0].1.byte_len, 7000);
    assert_eq!(b.at(0, 7000), &data[..]);
    assert_eq!(a.qp.stats().tx_datagrams, 5);
}

#[test]
fn large_batches_span_requests() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 60_000, 3);
    for i in 0..4 {
        b.recv(i, i as usize * 60_000, 60_000);
        a.send(i, 0, 60_000, None, b.addr);
    }
    let d = a.tx();
    assert_eq!(d.len(), 4 * 60_000usize.div_ceil(ROOM_SEND));
    assert_eq!(a.wcs().len(), 4);
    for s in d.iter().rev() {
        b.rx(a.addr, s, Instant::now());
    }
    assert_eq!(b.wcs().len(), 4);
    assert_eq!(b.at(3 * 60_000, 60_000), a.at(0, 60_000));
}

#[test]
fn socket_errors_fail_one_request() {
    let (mut a, b) = (a(), b());
    a.fill(0, 3000, 3);
    a.send(1, 0, 3000, None, b.addr);
    a.send(2, 0, 10, None, b.addr);
    let mut sink = VecSink {
        fail_next: Some(io::ErrorKind::ConnectionRefused),
        ..VecSink::default()
    };
    assert!(a.qp.poll_transmit(&a.mem, &mut sink).is_err());
    assert_eq!(a.qp.poll_transmit(&a.mem, &mut sink).unwrap(), 1);
    let w = a.wcs();
    assert_eq!((w[0].1.wr_id, w[0].1.status), (1, WcStatus::GeneralErr));
    assert_eq!((w[1].1.wr_id, w[1].1.status), (2, WcStatus::Success));
    assert_eq!(a.qp.stats().tx_errors, 1);
}

#[test]
fn bad_gather_list_is_loc_prot_err() {
    let (mut a, b) = (a(), b());
    a.fill(0, 10, 3);
    let mut wr = a.wr(
        1,
        SendOp::Send {
            imm: None,
            invalidate: None,
        },
        0,
        10,
    );
    wr.payload = Payload::Sgl(SgList::single(BASE, 10, a.buf ^ 0x80));
    wr.flags.signaled = false;
    a.qp.post_send(wr, b.addr).unwrap();
    a.send(2, 0, 10, None, b.addr);
    // Inline data needs no memory.
    let mut wr = a.wr(
        3,
        SendOp::Send {
            imm: None,
            invalidate: None,
        },
        0,
        0,
    );
    wr.payload = Payload::Inline(InlineData::new(b"inline!").unwrap());
    a.qp.post_send(wr, b.addr).unwrap();
    let d = a.tx();
    assert_eq!(d.len(), 2);
    assert_eq!(&d[1][22..29], b"inline!");
    let w = a.wcs();
    assert_eq!((w[0].1.wr_id, w[0].1.status), (1, WcStatus::LocProtErr));
    assert_eq!((w[1].1.wr_id, w[1].1.status), (2, WcStatus::Success));
    assert_eq!((w[2].1.wr_id, w[2].1.byte_len), (3, 7));
}

#[test]
fn bad_receive_buffer_is_loc_prot_err() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 10, 3);
    let sgl = SgList::single(BASE, 100, b.buf ^ 0x80);
    b.qp.post_recv(RecvWr { wr_id: 1, sgl }).unwrap();
    a.send(1, 0, 10, None, b.addr);
    b.rx(a.addr, &a.tx()[0], Instant::now());
    assert_eq!(b.wcs()[0].1.status, WcStatus::LocProtErr);
    assert_eq!(b.qp.stats().rx_prot_err, 1);
}

#[test]
fn post_send_refusals() {
    let (mut a, b) = (a(), b());
    let refused = |a: &mut Node, op: SendOp| {
        let wr = a.wr(1, op, 0, 8);
        a.qp.post_send(wr, b.addr)
    };
    use PostError::{Invalid, Unsupported};
    let cases = [
        SendOp::Send {
            imm: None,
            invalidate: Some(1),
        },
        SendOp::Write {
            remote_addr: 0,
            rkey: 1,
            imm: Some(1),
        },
        SendOp::Read {
            remote_addr: 0,
            rkey: 1,
        },
        SendOp::FetchAdd {
            remote_addr: 0,
            rkey: 1,
            add: 1,
        },
        SendOp::CompareSwap {
            remote_addr: 0,
            rkey: 1,
            compare: 0,
            swap: 1,
        },
        SendOp::LocalInvalidate { stag: 1 },
    ];
    for op in cases {
        assert_eq!(refused(&mut a, op), Err(Unsupported), "{op:?}");
    }
    let send = SendOp::Send {
        imm: None,
        invalidate: None,
    };
    let wr = a.wr(1, send, 0, (64 << 10) + 1);
    assert_eq!(a.qp.post_send(wr, b.addr), Err(Invalid));
    let wr = a.wr(1, send, 0, 1);
    let far = DgramAddr {
        qpn: 1 << 24,
        ..b.addr
    };
    assert_eq!(a.qp.post_send(wr, far), Err(Invalid));
    let mut c = node([1, 1, 1, 1], 1, 1, |c| c.sq_depth = 1);
    let wr = c.wr(1, send, 0, 1);
    assert_eq!(c.qp.post_send(wr, b.addr), Ok(()));
    assert_eq!(c.qp.post_send(wr, b.addr), Err(PostError::QueueFull));
    assert!(a.tx().is_empty());
}
