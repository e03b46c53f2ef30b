//! A context leaves nothing behind: after contexts with datagram QPs,
//! completion channels and an RC connection have been opened, used and
//! dropped many times, the process has the threads and descriptors it had
//! before (one test in this binary, so no other test's threads or
//! descriptors come and go meanwhile).

use std::net::{Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::cm::{self, ConnParams, Listener};
use softrdma_engine::{CompChannel, Context, QpCaps, RdOptions, UdOptions};

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).expect(dir).count()
}

/// Threads and descriptors now.
fn now() -> (usize, usize) {
    (count("/proc/self/task"), count("/proc/self/fd"))
}

/// Threads and descriptors once they equal `want`, or after 5 s (a thread
/// that was told to stop takes a moment to leave `/proc`).
fn settled(want: (usize, usize)) -> (usize, usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = now();
        if n == want || Instant::now() > deadline {
            return n;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn use_and_drop_a_context(round: usize) {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let ch = CompChannel::new().unwrap();
    let cq = ctx.create_cq(64, Some(ch.clone()));
    let opts = UdOptions {
        bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        ..Default::default()
    };
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
    };
    let ud = ctx
        .create_ud_qp(pd, caps, cq.clone(), cq.clone(), opts)
        .unwrap();
    let rd_opts = RdOptions {
        bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        ..Default::default()
    };
    let rd = ctx
        .create_rd_qp(pd, caps, cq.clone(), cq.clone(), rd_opts)
        .unwrap();
    // Arming the CQ makes the progress thread watch the sockets.
    cq.req_notify(false);
    // An RC connection to itself through the connection manager.
    let listener = Listener::bind(&ctx, "127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (sqp, cqp) = (
        ctx.create_qp(1, pd, caps, cq.clone(), cq.clone()),
        ctx.create_qp(2, pd, caps, cq.clone(), cq.clone()),
    );
    let acceptor = {
        let sqp = sqp.clone();
        thread::spawn(move || {
            let inc = listener.accept().unwrap();
            inc.accept(&sqp, &ConnParams::default()).unwrap();
        })
    };
    cm::connect(&ctx, &cqp, addr, &ConnParams::default())
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
    acceptor.join().unwrap();
    drop((sqp, cqp, ud, rd, cq, ch, ctx));
}

#[test]
fn contexts_leave_no_threads_or_descriptors_behind() {
    // One round first: whatever the process sets up once (the standard
    // library's own descriptors, lazily opened files) is there before
    // counting.
    use_and_drop_a_context(0);
    thread::sleep(Duration::from_millis(100));
    let before = now();
    for round in 1..=20 {
        use_and_drop_a_context(round);
    }
    let after = settled(before);
    assert_eq!(
        after, before,
        "(threads, descriptors) after 20 contexts, against before"
    );
}
