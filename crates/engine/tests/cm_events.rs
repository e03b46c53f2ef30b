//! The rdma_cm-style event channel over real TCP on loopback: listen,
//! connect, accept and reject with private data both ways, the pollable
//! descriptor, unreachable peers, disconnects seen at both ends, and many
//! requests on one listener at once.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::cm::ConnParams;
use softrdma_engine::cm_events::{CmEvent, CmEventKind, CmId, CmIdState, EventChannel};
use softrdma_engine::{Completion, Context, Cq, Qp, QpCaps, QpLinkState};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    InlineData, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
    WorkCompletion,
};

const WAIT: Duration = Duration::from_secs(10);

/// True if `fd` becomes readable within `ms` milliseconds (0: right now).
fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd; `fd` is an event channel the caller holds.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    r == 1 && p.revents & libc::POLLIN != 0
}

fn next(ch: &EventChannel, what: &str) -> CmEvent {
    ch.get_event(Some(WAIT))
        .unwrap_or_else(|| panic!("no {what} event within {WAIT:?}"))
}

fn params(pd: &[u8]) -> ConnParams {
    ConnParams {
        private_data: pd.to_vec(),
        ..Default::default()
    }
}

fn qp(ctx: &Context, qpn: u32) -> (Qp, Arc<Cq>) {
    let cq = ctx.create_cq(64, None);
    let qp = ctx.create_qp(
        qpn,
        ctx.alloc_pd(),
        QpCaps::default(),
        cq.clone(),
        cq.clone(),
    );
    (qp, cq)
}

fn localhost(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn wait_one(cq: &Cq) -> Completion {
    let deadline = Instant::now() + WAIT;
    let mut out = [Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }];
    loop {
        if cq.poll(&mut out) == 1 {
            return out[0];
        }
        assert!(Instant::now() < deadline, "no completion within {WAIT:?}");
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn event_kinds_use_rdma_cm_numbering() {
    let expect = [
        (
            CmEventKind::ConnectRequest,
            4,
            "RDMA_CM_EVENT_CONNECT_REQUEST",
        ),
        (
            CmEventKind::ConnectResponse,
            5,
            "RDMA_CM_EVENT_CONNECT_RESPONSE",
        ),
        (CmEventKind::ConnectError, 6, "RDMA_CM_EVENT_CONNECT_ERROR"),
        (CmEventKind::Unreachable, 7, "RDMA_CM_EVENT_UNREACHABLE"),
        (CmEventKind::Rejected, 8, "RDMA_CM_EVENT_REJECTED"),
        (CmEventKind::Established, 9, "RDMA_CM_EVENT_ESTABLISHED"),
        (CmEventKind::Disconnected, 10, "RDMA_CM_EVENT_DISCONNECTED"),
        (CmEventKind::TimewaitExit, 15, "RDMA_CM_EVENT_TIMEWAIT_EXIT"),
    ];
    for (k, code, name) in expect {
        assert_eq!((k.code(), k.name()), (code, name));
    }
    for c in 0..16 {
        assert_eq!(CmEventKind::from_code(c).unwrap().code(), c);
    }
    assert_eq!(CmEventKind::from_code(16), None);
}

#[test]
fn empty_channel_times_out_and_is_not_readable() {
    let ch = EventChannel::new().unwrap();
    assert!(!readable(ch.fd(), 0));
    assert!(ch.try_get_event().is_none());
    let t = Instant::now();
    assert!(ch.get_event(Some(Duration::from_millis(50))).is_none());
    assert!(t.elapsed() >= Duration::from_millis(50));
}

/// Listen, connect, accept; private data both ways; events in order on
/// both channels; the fd readable exactly while events are queued; the QPs
/// carry a Send; a local disconnect reaches both ends.
#[test]
fn connect_accept_private_data_and_disconnect() {
    let sctx = Context::new().unwrap();
    let cctx = Context::new().unwrap();
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let listener = sch.listen(&sctx, "127.0.0.1:0", 8).unwrap();
    assert_eq!(listener.state(), CmIdState::Listening);
    let addr = listener.local_addr().unwrap();
    assert!(!readable(sch.fd(), 0));

    let (cqp, ccq) = qp(&cctx, 1);
    let cid = cch
        .connect(&cctx, &cqp, addr, &params(b"hello from the client"))
        .unwrap();
    assert_eq!(cid.peer_addr(), Some(addr));

    // The request makes the server's fd readable.
    assert!(readable(sch.fd(), 10_000), "no readable fd for the request");
    let ev = sch.try_get_event().expect("readable fd, but no event");
    assert!(!readable(sch.fd(), 0), "fd readable with the queue empty");
    assert_eq!(ev.rdma_cm_event(), 4);
    let CmEvent::ConnectRequest {
        id: child,
        listener: from,
        private_data,
        peer,
        ird,
        ord,
    } = ev
    else {
        panic!("expected a connect request, got {ev:?}")
    };
    assert_eq!(from, listener);
    assert_ne!(child, listener);
    assert_eq!(private_data, b"hello from the client");
    assert_eq!(peer.ip(), addr.ip());
    assert_eq!(child.peer_addr(), Some(peer));
    assert_eq!(child.state(), CmIdState::ConnectRequest);
    assert!(ird > 0 && ord > 0, "MPA v2 depths: {ird}/{ord}");
    // The client hears nothing before the server decides.
    assert!(cch.try_get_event().is_none());

    // A receive for the Send below.
    let (sqp, scq) = qp(&sctx, 1);
    let mut buf = vec![0u8; 64];
    // SAFETY: `buf` outlives every use of the QP in this test (the receive
    // completes before the end, and the contexts are dropped after `buf`
    // is last read).
    let stag = unsafe {
        sctx.registry().register(
            buf.as_mut_ptr(),
            buf.len(),
            buf.as_ptr() as u64,
            Access::LOCAL_WRITE,
            sqp.pd(),
        )
    }
    .unwrap();
    sqp.post_recv(RecvWr {
        wr_id: 7,
        sgl: SgList::single(buf.as_ptr() as u64, 64, stag),
    })
    .unwrap();

    child.accept(&sqp, &params(b"welcome, client")).unwrap();
    assert_eq!(child.state(), CmIdState::Connected);
    assert!(child.qp().is_some_and(|q| q.qpn() == sqp.qpn()));
    let ev = next(&sch, "server established");
    assert_eq!((ev.kind(), ev.id()), (CmEventKind::Established, &child));
    assert_eq!(ev.status(), 0);

    let ev = next(&cch, "client established");
    assert_eq!(ev.rdma_cm_event(), 9);
    assert_eq!(ev.id(), &cid);
    assert_eq!(ev.private_data(), b"welcome, client");
    assert_eq!(cid.state(), CmIdState::Connected);
    assert!(!readable(cch.fd(), 0));

    // The connection works.
    cqp.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Inline(InlineData::new(b"ping over rdma_cm").unwrap()),
        flags: SendFlags {
            signaled: true,
            ..Default::default()
        },
    })
    .unwrap();
    assert_eq!(wait_one(&ccq).wc.status, WcStatus::Success);
    let r = wait_one(&scq);
    assert_eq!(
        (r.wc.wr_id, r.wc.status, r.wc.byte_len),
        (7, WcStatus::Success, 17)
    );
    assert_eq!(&buf[..17], b"ping over rdma_cm");

    // The client disconnects: Disconnected at once locally, and at the
    // server when its QP's connection goes down.
    cid.disconnect().unwrap();
    let ev = next(&cch, "client disconnected");
    assert_eq!((ev.rdma_cm_event(), ev.id()), (10, &cid));
    let ev = next(&sch, "server disconnected");
    assert_eq!((ev.rdma_cm_event(), ev.id()), (10, &child));
    assert_eq!(sqp.link_state(), QpLinkState::Error);
    assert_eq!(child.state(), CmIdState::Disconnected);
    // Disconnecting again (either end) is a no-op: no second event.
    cid.disconnect().unwrap();
    child.disconnect().unwrap();
    assert!(cch.get_event(Some(Duration::from_millis(100))).is_none());
    assert!(sch.get_event(Some(Duration::from_millis(100))).is_none());
}

#[test]
fn reject_with_private_data() {
    let sctx = Context::new().unwrap();
    let cctx = Context::new().unwrap();
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let listener = sch.listen(&sctx, "127.0.0.1:0", 0).unwrap();
    let addr = listener.local_addr().unwrap();
    let (cqp, _ccq) = qp(&cctx, 1);
    let cid = cch.connect(&cctx, &cqp, addr, &params(b"may I?")).unwrap();

    let ev = next(&sch, "connect request");
    assert_eq!(ev.kind(), CmEventKind::ConnectRequest);
    assert_eq!(ev.private_data(), b"may I?");
    let child = ev.id().clone();
    child.reject(b"no, go away").unwrap();
    assert_eq!(child.state(), CmIdState::Closed);
    // Rejecting or accepting again: no request left.
    assert!(child.reject(b"x").is_err());
    let (sqp, _scq) = qp(&sctx, 1);
    assert!(child.accept(&sqp, &ConnParams::default()).is_err());

    let ev = next(&cch, "rejected");
    assert_eq!(ev.rdma_cm_event(), 8);
    assert_eq!(ev.id(), &cid);
    assert_eq!(ev.private_data(), b"no, go away");
    assert_eq!(ev.status(), -libc::ECONNREFUSED);
    assert_eq!(cqp.link_state(), QpLinkState::Unconnected);
    // The active id is idle again; the server side queued nothing else.
    assert_eq!(cid.state(), CmIdState::Idle);
    assert!(sch.get_event(Some(Duration::from_millis(100))).is_none());
}

#[test]
fn connect_to_closed_port_is_rejected() {
    let ctx = Context::new().unwrap();
    let ch = EventChannel::new().unwrap();
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (q, _cq) = qp(&ctx, 1);
    let t = Instant::now();
    let id = ch
        .connect(&ctx, &q, localhost(port), &ConnParams::default())
        .unwrap();
    let ev = next(&ch, "rejected");
    assert!(t.elapsed() < WAIT);
    assert_eq!(ev.id(), &id);
    // As the kernel's iWARP CM: a refused TCP connection is REJECTED with
    // status -ECONNREFUSED and no private data.
    assert_eq!(ev.kind(), CmEventKind::Rejected, "{ev:?}");
    assert_eq!(ev.rdma_cm_event(), 8, "refused TCP is a rejection: {ev:?}");
    assert_eq!(ev.status(), -libc::ECONNREFUSED);
    assert!(ev.private_data().is_empty(), "{ev:?}");
    assert_eq!(id.state(), CmIdState::Idle);
}

/// A peer that takes the TCP connection and the MPA Request, then closes
/// without a Reply: `REJECTED`, status -ECONNRESET, no private data (siw
/// reports a close while it awaits the Reply as -ECONNRESET, which the
/// kernel's `cma_iw_handler` makes a rejection). Both ways a peer goes: with
/// part of the Request unread (the kernel answers with a reset) and after
/// reading all of it (an orderly close, end of stream).
#[test]
fn peer_closing_before_the_mpa_reply_is_rejected_with_reset() {
    use std::io::Read;
    for read_all in [false, true] {
        let ctx = Context::new().unwrap();
        let ch = EventChannel::new().unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            // The MPA Request header (20 octets), then maybe the rest.
            let mut hdr = [0u8; 20];
            s.read_exact(&mut hdr).unwrap();
            if read_all {
                s.set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                let mut rest = [0u8; 512];
                while matches!(s.read(&mut rest), Ok(n) if n > 0) {}
            }
            hdr
        });
        let (q, _cq) = qp(&ctx, 1);
        let id = ch.connect(&ctx, &q, addr, &ConnParams::default()).unwrap();
        let hdr = server.join().unwrap();
        assert_eq!(
            &hdr[..16],
            b"MPA ID Req Frame",
            "the request reached the peer"
        );
        let ev = next(&ch, "rejected");
        assert_eq!(ev.id(), &id);
        assert_eq!(
            ev.kind(),
            CmEventKind::Rejected,
            "read_all {read_all}: {ev:?}"
        );
        assert_eq!(
            ev.status(),
            -libc::ECONNRESET,
            "read_all {read_all}: {ev:?}"
        );
        assert!(ev.private_data().is_empty(), "{ev:?}");
        assert_eq!(q.link_state(), QpLinkState::Unconnected);
        assert_eq!(id.state(), CmIdState::Idle);
    }
}

/// A peer that takes the TCP connection and never answers the MPA Request:
/// `UNREACHABLE`, status -ETIMEDOUT, after `Config::mpa_timeout` (siw's MPA
/// timer reports -ETIMEDOUT, which the kernel makes UNREACHABLE).
#[test]
fn silent_peer_is_unreachable_after_the_mpa_timeout() {
    let ctx = Context::with_config(softrdma_engine::config::Config {
        mpa_timeout: Duration::from_millis(300),
        ..Default::default()
    })
    .unwrap();
    let ch = EventChannel::new().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (q, _cq) = qp(&ctx, 1);
    let t = Instant::now();
    let id = ch.connect(&ctx, &q, addr, &ConnParams::default()).unwrap();
    // The connection waits in the listener's backlog, never read.
    let ev = next(&ch, "unreachable");
    let waited = t.elapsed();
    assert_eq!(ev.id(), &id);
    assert_eq!(ev.kind(), CmEventKind::Unreachable, "{ev:?}");
    assert_eq!(ev.rdma_cm_event(), 7);
    assert_eq!(ev.status(), -libc::ETIMEDOUT, "{ev:?}");
    assert!(
        waited >= Duration::from_millis(300),
        "reported after {waited:?}"
    );
    assert_eq!(q.link_state(), QpLinkState::Unconnected);
    assert_eq!(id.state(), CmIdState::Idle);
    drop(l);
}

/// A refused connect is tried again for `connect_retry` (default 1 s): a
/// listener that opens on the port meanwhile gets the connection (a server
/// closing one listener and opening the next on the same port, as perftest
/// `-R` does); with `connect_retry` 0 the refusal is reported at the first
/// try.
#[test]
fn refused_connect_is_retried_until_a_listener_opens() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let sctx = Context::new().unwrap();
    let cctx = Context::new().unwrap();
    assert_eq!(cctx.config().connect_retry, Duration::from_secs(1));
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let (cqp, _ccq) = qp(&cctx, 1);
    let cid = cch
        .connect(&cctx, &cqp, localhost(port), &params(b"early"))
        .unwrap();
    // Refused for a while: nothing is reported yet.
    thread::sleep(Duration::from_millis(150));
    assert!(cch.try_get_event().is_none(), "the refusal was reported");
    let listener = sch.listen(&sctx, localhost(port), 4).unwrap();
    let ev = next(&sch, "the request that waited");
    let CmEvent::ConnectRequest {
        id: child,
        private_data,
        ..
    } = ev
    else {
        panic!("expected a connect request, got {ev:?}")
    };
    assert_eq!(private_data, b"early");
    let (sqp, _scq) = qp(&sctx, 1);
    child.accept(&sqp, &params(b"")).unwrap();
    let ev = next(&cch, "client established");
    assert_eq!((ev.kind(), ev.id()), (CmEventKind::Established, &cid));
    listener.destroy();

    // Without the retry: refused at the first try.
    let quick = Context::with_config(softrdma_engine::config::Config {
        connect_retry: Duration::ZERO,
        ..Default::default()
    })
    .unwrap();
    let (q, _cq) = qp(&quick, 2);
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let id = cch
        .connect(&quick, &q, localhost(closed), &ConnParams::default())
        .unwrap();
    let ev = next(&cch, "refused");
    assert_eq!(ev.id(), &id);
    assert_eq!(ev.status(), -libc::ECONNREFUSED, "{ev:?}");
}

/// A destroyed listener refuses new connections at once and reports no
/// more requests.
#[test]
fn destroyed_listener_refuses() {
    let sctx = Context::new().unwrap();
    let cctx = Context::new().unwrap();
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let listener = sch.listen(&sctx, "127.0.0.1:0", 4).unwrap();
    let addr = listener.local_addr().unwrap();
    listener.destroy();
    assert_eq!(listener.state(), CmIdState::Closed);
    let (q, _cq) = qp(&cctx, 1);
    cch.connect(&cctx, &q, addr, &ConnParams::default())
        .unwrap();
    let ev = next(&cch, "refused");
    assert!(
        matches!(ev.kind(), CmEventKind::Rejected | CmEventKind::ConnectError),
        "{ev:?}"
    );
    assert!(sch.get_event(Some(Duration::from_millis(100))).is_none());
}

/// Many requests on one listener at once, from separate threads: every one
/// is reported with its own private data and id; even ones are accepted,
/// odd ones rejected; then the server disconnects the accepted ones and the
/// clients see it.
#[test]
fn concurrent_requests_on_one_listener() {
    const N: u8 = 12;
    let sctx = Context::new().unwrap();
    let cctx = Context::new().unwrap();
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let listener = sch.listen(&sctx, "127.0.0.1:0", 0).unwrap();
    let addr = listener.local_addr().unwrap();

    let clients: Vec<(Qp, Arc<Cq>)> = (0..N).map(|i| qp(&cctx, u32::from(i) + 1)).collect();
    let by_id: HashMap<u64, u8> = thread::scope(|s| {
        let hs: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, (q, _))| {
                let (cch, cctx) = (&cch, &cctx);
                s.spawn(move || {
                    let id = cch
                        .connect(cctx, q, addr, &params(&[i as u8, 0x11]))
                        .unwrap();
                    (id.number(), i as u8)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(by_id.len(), usize::from(N));

    // Requests and the Established of children accepted earlier
    // interleave on the server's channel; per id, the request comes first.
    let mut children = HashMap::new();
    let mut server_qps = Vec::new();
    let mut accepted = Vec::new();
    let mut server_established = 0;
    let mut qpn = 0;
    while children.len() < usize::from(N) || server_established < N / 2 {
        match next(&sch, "server") {
            CmEvent::ConnectRequest {
                id, private_data, ..
            } => {
                assert_eq!(private_data.len(), 2);
                assert_eq!(private_data[1], 0x11);
                let i = private_data[0];
                assert!(children.insert(id.number(), i).is_none(), "duplicate id");
                if i % 2 == 0 {
                    qpn += 1;
                    let (q, cq) = qp(&sctx, qpn);
                    id.accept(&q, &params(&[i, 0xAA])).unwrap();
                    server_qps.push((q, cq));
                    accepted.push(id);
                } else {
                    id.reject(&[i, 0xEE]).unwrap();
                }
            }
            CmEvent::Established { id, .. } => {
                assert_eq!(children[&id.number()] % 2, 0, "established a rejected id");
                assert_eq!(id.state(), CmIdState::Connected);
                server_established += 1;
            }
            ev => panic!("unexpected {ev:?}"),
        }
    }
    let mut seen: Vec<u8> = children.values().copied().collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..N).collect::<Vec<_>>());

    let mut established = Vec::new();
    for _ in 0..N {
        let ev = next(&cch, "client outcome");
        let i = by_id[&ev.id().number()];
        if i.is_multiple_of(2) {
            assert_eq!(ev.kind(), CmEventKind::Established, "{ev:?}");
            assert_eq!(ev.private_data(), [i, 0xAA]);
            established.push(ev.id().clone());
        } else {
            assert_eq!(ev.kind(), CmEventKind::Rejected, "{ev:?}");
            assert_eq!(ev.private_data(), [i, 0xEE]);
        }
    }
    assert!(cch.try_get_event().is_none());

    // The server disconnects every accepted connection.
    for id in &accepted {
        id.disconnect().unwrap();
    }
    for _ in 0..N / 2 {
        let ev = next(&sch, "server disconnected");
        assert_eq!(ev.kind(), CmEventKind::Disconnected);
    }
    let mut down = Vec::new();
    for _ in 0..N / 2 {
        let ev = next(&cch, "client disconnected");
        assert_eq!(ev.kind(), CmEventKind::Disconnected, "{ev:?}");
        down.push(ev.id().clone());
    }
    down.sort_by_key(CmId::number);
    established.sort_by_key(CmId::number);
    assert_eq!(down, established);
    drop(server_qps);
}

/// Dropping the QP at one end (no disconnect call) tears the connection
/// down: both ids report Disconnected, even after the application dropped
/// its own handle of the id.
#[test]
fn dropped_qp_disconnects_both_ends() {
    let sctx = Context::new().unwrap();
    let cctx = Context::new().unwrap();
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let listener = sch.listen(&sctx, "127.0.0.1:0", 1).unwrap();
    let addr = listener.local_addr().unwrap();
    let (cqp, _ccq) = qp(&cctx, 1);
    let cid = cch
        .connect(&cctx, &cqp, addr, &ConnParams::default())
        .unwrap();
    let ev = next(&sch, "request");
    let (sqp, _scq) = qp(&sctx, 1);
    ev.id().accept(&sqp, &ConnParams::default()).unwrap();
    let child_number = ev.id().number();
    drop(ev);
    let ev = next(&sch, "server established");
    assert_eq!(ev.kind(), CmEventKind::Established);
    drop(ev);
    assert_eq!(
        next(&cch, "client established").kind(),
        CmEventKind::Established
    );

    drop(cqp);
    let ev = next(&cch, "client disconnected");
    assert_eq!((ev.kind(), ev.id()), (CmEventKind::Disconnected, &cid));
    let ev = next(&sch, "server disconnected");
    assert_eq!(ev.kind(), CmEventKind::Disconnected);
    assert_eq!(ev.id().number(), child_number);
}

/// An initiator that opens TCP and never sends its MPA Request holds up one
/// acceptor thread (for the MPA timeout), not the requests behind it.
#[test]
fn silent_initiator_does_not_block_other_requests() {
    let sctx = Context::new().unwrap();
    let cctx = Context::new().unwrap();
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let listener = sch.listen(&sctx, "127.0.0.1:0", 0).unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = std::net::TcpStream::connect(addr).unwrap();
    thread::sleep(Duration::from_millis(50));

    let (cqp, _ccq) = qp(&cctx, 1);
    let t = Instant::now();
    let cid = cch
        .connect(&cctx, &cqp, addr, &params(b"me first"))
        .unwrap();
    let ev = sch
        .get_event(Some(Duration::from_secs(2)))
        .expect("the request waited behind a silent initiator");
    assert_eq!(ev.private_data(), b"me first");
    let (sqp, _scq) = qp(&sctx, 1);
    ev.id().accept(&sqp, &ConnParams::default()).unwrap();
    let ev = next(&cch, "established");
    assert_eq!((ev.kind(), ev.id()), (CmEventKind::Established, &cid));
    assert!(t.elapsed() < Duration::from_secs(2));
    drop(silent);
}

/// Connects made one after the other from one thread reach the listener's
/// channel as requests in that order (perftest `-R -q N` pairs its QPs by
/// that order; crossed pairs sent each QP's iWARP credits to the other
/// one and both sides stalled). Several rounds, each with more requests
/// than there are acceptor threads.
#[test]
fn requests_arrive_in_connect_order() {
    const N: u8 = 8;
    let sctx = Context::new().unwrap();
    let cctx = Context::new().unwrap();
    let sch = EventChannel::new().unwrap();
    let cch = EventChannel::new().unwrap();
    let listener = sch.listen(&sctx, "127.0.0.1:0", 0).unwrap();
    let addr = listener.local_addr().unwrap();
    // Server ids of earlier rounds: their Disconnected may come late (the
    // watcher looks every 20 ms, and a loaded host is slower still).
    let mut earlier: Vec<CmId> = Vec::new();
    for round in 0..4u8 {
        let clients: Vec<(Qp, Arc<Cq>)> = (0..N)
            .map(|i| qp(&cctx, u32::from(round * N + i) + 1))
            .collect();
        let ids: Vec<CmId> = clients
            .iter()
            .enumerate()
            .map(|(i, (q, _))| {
                cch.connect(&cctx, q, addr, &params(&[round, i as u8]))
                    .unwrap()
            })
            .collect();
        let mut order = Vec::new();
        let mut server_qps = Vec::new();
        while order.len() < usize::from(N) {
            match next(&sch, "server") {
                CmEvent::ConnectRequest {
                    id, private_data, ..
                } => {
                    assert_eq!(private_data[0], round);
                    order.push(private_data[1]);
                    let (q, cq) = qp(&sctx, u32::from(round * N) + order.len() as u32);
                    id.accept(&q, &ConnParams::default()).unwrap();
                    server_qps.push((q, cq));
                    earlier.push(id);
                }
                CmEvent::Established { .. } => {}
                CmEvent::Disconnected { id }
                    if earlier[..earlier.len() - order.len()].contains(&id) => {}
                ev => panic!("unexpected {ev:?}"),
            }
        }
        assert_eq!(
            order,
            (0..N).collect::<Vec<_>>(),
            "round {round}: requests out of connect order"
        );
        for _ in 0..N {
            let ev = next(&cch, "client established");
            assert_eq!(ev.kind(), CmEventKind::Established, "{ev:?}");
        }
        for id in &ids {
            id.disconnect().unwrap();
        }
        // Drain the disconnects (and late server Established events).
        let deadline = Instant::now() + WAIT;
        let mut down = 0;
        while down < N && Instant::now() < deadline {
            if let Some(ev) = cch.get_event(Some(Duration::from_millis(100))) {
                if ev.kind() == CmEventKind::Disconnected {
                    down += 1;
                }
            }
        }
        while sch.get_event(Some(Duration::from_millis(50))).is_some() {}
        drop(server_qps);
    }
}
