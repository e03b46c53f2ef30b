//! SoftDC with peers in other processes (`tests/child` harness):
//!
//! * `dct_peer_killed_mid_transfer`: a DCI streams 64 KiB RDMA Writes to a
//!   DCT in a child process and Sends to a DCT in this process; the child
//!   is killed mid-transfer. Every work request completes exactly once and
//!   in posting order; the killed target's work requests succeed up to a
//!   point and fail from there on; the other target's all succeed and
//!   its messages arrive in order.
//! * `invitations_lost_and_duplicated_netns`: client and server in two
//!   network namespaces; nftables drops 20 % of the UDP packets (the
//!   invitations and their answers) arriving on each side and duplicates
//!   20 % of those each side sends, and drops 0.5 % of all packets arriving
//!   at the server. A DCI cycles over 12 DCTs with a 4-slot table (so it
//!   reconnects all the time). Every work request completes exactly once,
//!   successfully, in order; every message arrives once and intact; the
//!   counters show that invitations were retransmitted and duplicates
//!   suppressed.
//! * `reverse_use_one_connection_both_ways` (two contexts in this
//!   process, each DCI and DCT of the other): with reverse use one RC
//!   connection carries a ping-pong both ways (two without it); a wrong
//!   key on the Bind fails that work request and is counted once; an
//!   idle close of the shared connection while the peer streams to it
//!   goes through the Unbind/Unbound handshake and loses nothing.
//!
//! Peer protocol (stdout `@peer WORD …`): `ready IP ADDR RKEY DCT…` from a
//! server; `got N` when a server received N messages (after the test's
//! `expect N`); `done RETX` from a client; `ok` at the end.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

mod child;

use softrdma_engine::dc::{DcOptions, DcService, Dci, Dct};
use softrdma_engine::{Completion, Context, Cq, Srq};
use softrdma_proto::dc::{DcConfig, DcTarget};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    DgramAddr, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
    WorkCompletion,
};
use softrdma_sim::netns::NetPair;

const PEER_ENV: &str = "SOFTRDMA_DC_PEER";
const PEER_WAIT: Duration = Duration::from_secs(40);
const MARK: &str = "@peer ";
const KEY: u64 = 0x5eed_0000_00dc;
const MSG: usize = 256;
const ALL: Access = Access(1 | 2 | 4 | 8);

// ---------------------------------------------------------------------
// Registered memory

/// A registered buffer (freed after deregistration).
struct Mem {
    ctx: Context,
    ptr: *mut u8,
    len: usize,
    stag: u32,
}

// SAFETY: the buffer is plain octets reached through raw pointers only;
// Mem is a handle like the engine's own registrations.
unsafe impl Send for Mem {}
// SAFETY: as above; all access copies through raw pointers.
unsafe impl Sync for Mem {}

impl Mem {
    fn new(ctx: &Context, pd: u32, len: usize) -> Mem {
        let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()) as *mut u8;
        // SAFETY: `ptr..ptr+len` is a live allocation freed only in Drop,
        // after the registration is removed.
        let stag = unsafe { ctx.registry().register(ptr, len, ptr as u64, ALL, pd) }.unwrap();
        Mem {
            ctx: ctx.clone(),
            ptr,
            len,
            stag,
        }
    }

    fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }

    fn sgl(&self, off: usize, len: usize) -> SgList {
        assert!(off + len <= self.len);
        SgList::single(self.addr(off), len as u32, self.stag)
    }

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds (checked); octets the engine is not placing
        // (the test writes only buffers not in use by a work request).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }

    fn read(&self, off: usize, out: &mut [u8]) {
        assert!(off + out.len() <= self.len);
        // SAFETY: in bounds (checked); read after the completion that
        // says the octets were placed.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), out.len()) };
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        self.ctx.registry().deregister(self.stag);
        // SAFETY: allocated in `new` as a boxed slice of `len` octets and
        // no longer registered.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

fn blank() -> Completion {
    Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }
}

fn poll_some(cq: &Cq, out: &mut Vec<Completion>, deadline: Instant, what: &str) {
    let mut buf = [blank(); 32];
    loop {
        let n = cq.poll(&mut buf);
        if n > 0 {
            out.extend_from_slice(&buf[..n]);
            return;
        }
        assert!(Instant::now() < deadline, "{what}: timed out");
        thread::yield_now();
    }
}

/// `direct`: connection requests in parallel with the invitations (the
/// default); off where the invitation path itself is under test.
fn opts(ip: IpAddr, capacity: usize, invite_timeout: Duration, direct: bool) -> DcOptions {
    DcOptions {
        table: DcConfig {
            capacity,
            invite_timeout,
            direct_connect: direct,
            ..DcConfig::default()
        },
        bind_ip: ip,
    }
}

fn target(ip: IpAddr, dct: u32) -> DcTarget {
    DcTarget {
        addr: DgramAddr {
            ip,
            port: (dct >> 8) as u16,
            qpn: dct,
        },
        key: KEY,
        local: 0,
    }
}

/// The message `i` of a run: its number, then a pattern.
fn message(i: u32) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[..4].copy_from_slice(&i.to_be_bytes());
    for (k, b) in m[4..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13) ^ (k as u8);
    }
    m
}

/// A server: DCTs on one SRQ; receives `MSG`-octet messages.
struct Server {
    ctx: Context,
    cq: Arc<Cq>,
    srq: Arc<Srq>,
    mem: Mem,
    dcts: Vec<Dct>,
    recvs: usize,
    seen: HashMap<u32, u32>,
}

impl Server {
    fn new(ip: IpAddr, n_dct: usize, recvs: usize, rdma: usize, capacity: usize) -> Server {
        let ctx = Context::new().unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(recvs + 64, None);
        let srq = ctx.create_srq(recvs);
        let mem = Mem::new(&ctx, pd, recvs * MSG + rdma);
        for i in 0..recvs {
            srq.post_recv(RecvWr {
                wr_id: i as u64,
                sgl: mem.sgl(i * MSG, MSG),
            })
            .unwrap();
        }
        let svc = DcService::of(&ctx, opts(ip, capacity, Duration::from_secs(10), true)).unwrap();
        let dcts = (0..n_dct)
            .map(|_| Dct::new(&svc, pd, cq.clone(), srq.clone(), KEY).unwrap())
            .collect();
        Server {
            ctx,
            cq,
            srq,
            mem,
            dcts,
            recvs,
            seen: HashMap::new(),
        }
    }

    /// Takes received messages (checking them) until `n` arrived in all.
    fn receive_until(&mut self, n: usize, deadline: Instant) {
        let mut got = Vec::new();
        while self.seen.len() < n {
            got.clear();
            poll_some(&self.cq, &mut got, deadline, "server receives");
            for c in &got {
                assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
                assert_eq!(c.wc.byte_len as usize, MSG);
                let slot = c.wc.wr_id as usize;
                assert!(slot < self.recvs);
                let mut m = [0u8; MSG];
                self.mem.read(slot * MSG, &mut m);
                let i = u32::from_be_bytes(m[..4].try_into().unwrap());
                assert_eq!(m, message(i), "message {i} damaged");
                *self.seen.entry(i).or_default() += 1;
                assert_eq!(self.seen[&i], 1, "message {i} delivered twice");
                self.srq
                    .post_recv(RecvWr {
                        wr_id: slot as u64,
                        sgl: self.mem.sgl(slot * MSG, MSG),
                    })
                    .unwrap();
            }
        }
    }
}

// ---------------------------------------------------------------------
// The peer process

fn say(line: &str) {
    println!("{MARK}{line}");
}

/// The peer: runs the scenario in the environment (nothing without it).
#[test]
fn peer() {
    let Ok(spec) = std::env::var(PEER_ENV) else {
        return;
    };
    thread::spawn(|| {
        thread::sleep(Duration::from_secs(90));
        eprintln!("peer: still running after 90 s, exiting");
        std::process::exit(3);
    });
    let w: Vec<&str> = spec.split_whitespace().collect();
    match w[0] {
        // server IP NDCT CAPACITY
        "server" => {
            let ip: IpAddr = w[1].parse().unwrap();
            let mut s = Server::new(
                ip,
                w[2].parse().unwrap(),
                512,
                1 << 20,
                w[3].parse().unwrap(),
            );
            let mut line = format!("ready {ip} {} {}", s.mem.addr(s.recvs * MSG), s.mem.stag);
            for d in &s.dcts {
                line.push_str(&format!(" {}", d.number()));
            }
            say(&line);
            let hold = w.get(4) == Some(&"hold");
            let stdin = std::io::stdin();
            let mut cmd = String::new();
            loop {
                cmd.clear();
                if stdin.read_line(&mut cmd).unwrap() == 0 {
                    if hold {
                        // Until killed.
                        thread::sleep(Duration::from_secs(80));
                    }
                    break;
                }
                let c: Vec<&str> = cmd.split_whitespace().collect();
                if c.first() == Some(&"expect") {
                    let n: usize = c[1].parse().unwrap();
                    s.receive_until(n, Instant::now() + Duration::from_secs(40));
                    let st = s.dcts[0].service().stats();
                    say(&format!(
                        "got {} dup_invites={} max_live={}",
                        s.seen.len(),
                        st.table.duplicate_invites,
                        st.table.max_live
                    ));
                }
            }
            drop(s.ctx);
        }
        // client SERVER_IP MY_IP CAPACITY WRS DCT…
        "client" => {
            let sip: IpAddr = w[1].parse().unwrap();
            let ip: IpAddr = w[2].parse().unwrap();
            let cap: usize = w[3].parse().unwrap();
            let n: usize = w[4].parse().unwrap();
            let dcts: Vec<u32> = w[5..].iter().map(|d| d.parse().unwrap()).collect();
            let retx = client_run(sip, ip, cap, n, &dcts);
            say(&format!("done {retx}"));
        }
        other => panic!("unknown scenario {other}"),
    }
    say("ok");
}

/// Sends `n` messages cycling over `dcts` in bursts of 5; checks that
/// they complete once each, successfully, in order. Returns the
/// invitation retransmissions.
fn client_run(sip: IpAddr, ip: IpAddr, cap: usize, n: usize, dcts: &[u32]) -> u64 {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    // Invitations only: their loss and duplication is what is tested.
    let svc = DcService::of(&ctx, opts(ip, cap, Duration::from_secs(20), false)).unwrap();
    let dci = Dci::new(&svc, pd, cq.clone(), 64);
    let mem = Mem::new(&ctx, pd, n * MSG);
    for i in 0..n {
        mem.write(i * MSG, &message(i as u32));
    }
    let deadline = Instant::now() + Duration::from_secs(45);
    let (mut posted, mut done) = (0usize, 0usize);
    let mut got = Vec::new();
    while done < n {
        // At most 64 outstanding: the CQ (256) never overruns.
        while posted < n && posted - done < 64 {
            let dct = dcts[(posted / 5) % dcts.len()];
            let wr = SendWr {
                wr_id: posted as u64,
                op: SendOp::Send {
                    imm: None,
                    invalidate: None,
                },
                payload: Payload::Sgl(mem.sgl(posted * MSG, MSG)),
                flags: SendFlags {
                    signaled: true,
                    ..SendFlags::default()
                },
            };
            match dci.post_send(wr, target(sip, dct)) {
                Ok(()) => posted += 1,
                Err(softrdma_engine::QpError::QueueFull) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
        got.clear();
        poll_some(&cq, &mut got, deadline, "client completions");
        for c in &got {
            assert_eq!(c.wc.status, WcStatus::Success, "{c:?}");
            assert_eq!(c.wc.wr_id, done as u64, "out of order or twice");
            done += 1;
        }
        let st = svc.stats();
        assert!(st.live <= cap && st.rc_qps <= cap, "{st:?}");
    }
    let st = svc.stats();
    eprintln!("client stats {st:?}");
    assert!(st.table.max_live <= cap);
    st.table.retransmits
}

/// The peer process, with this test's protocol on top of [`child::Peer`].
fn spawn(cmd: Command, spec: &str, name: &str) -> child::Peer {
    child::Peer::spawn(cmd, PEER_ENV, spec, name.to_string(), PEER_WAIT)
}

// ---------------------------------------------------------------------
// Tests

#[test]
fn dct_peer_killed_mid_transfer() {
    const N: usize = 400;
    const BIG: usize = 64 * 1024;
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut peer = spawn(
        Command::new(std::env::current_exe().unwrap()),
        "server 127.0.0.1 1 16 hold",
        "dct-server",
    );
    let w = peer.expect("ready");
    let (raddr, rkey, dct_a): (u64, u32, u32) = (
        w[1].parse().unwrap(),
        w[2].parse().unwrap(),
        w[3].parse().unwrap(),
    );
    let mut local = Server::new(lo, 1, 512, 0, 16);
    let dct_b = local.dcts[0].number();

    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let svc = DcService::of(&ctx, opts(lo, 16, Duration::from_millis(500), true)).unwrap();
    let dci = Dci::new(&svc, pd, cq.clone(), 64);
    let big = Mem::new(&ctx, pd, BIG);
    let small = Mem::new(&ctx, pd, N * MSG);
    // Even: 64 KiB Write to A (the child); odd: Send to B (here).
    let to_a = |i: usize| i.is_multiple_of(2);
    let mut sends_b = 0u32;
    let deadline = Instant::now() + Duration::from_secs(45);
    let (mut posted, mut done) = (0usize, 0usize);
    let mut statuses: Vec<WcStatus> = Vec::new();
    let mut got = Vec::new();
    let mut killed = false;
    while done < N {
        while posted < N && posted - done < 64 {
            let (wr, dest) = if to_a(posted) {
                let wr = SendWr {
                    wr_id: posted as u64,
                    op: SendOp::Write {
                        remote_addr: raddr + ((posted / 2 % 16) * BIG) as u64,
                        rkey,
                        imm: None,
                    },
                    payload: Payload::Sgl(big.sgl(0, BIG)),
                    flags: SendFlags {
                        signaled: true,
                        ..SendFlags::default()
                    },
                };
                (wr, target(lo, dct_a))
            } else {
                small.write(posted * MSG, &message(sends_b));
                sends_b += 1;
                let wr = SendWr {
                    wr_id: posted as u64,
                    op: SendOp::Send {
                        imm: None,
                        invalidate: None,
                    },
                    payload: Payload::Sgl(small.sgl(posted * MSG, MSG)),
                    flags: SendFlags {
                        signaled: true,
                        ..SendFlags::default()
                    },
                };
                (wr, target(lo, dct_b))
            };
            match dci.post_send(wr, dest) {
                Ok(()) => posted += 1,
                Err(softrdma_engine::QpError::QueueFull) => break,
                Err(e) => panic!("{e:?}"),
            }
        }
        got.clear();
        poll_some(&cq, &mut got, deadline, "DCI completions");
        for c in &got {
            assert_eq!(c.wc.wr_id, done as u64, "out of order or twice");
            statuses.push(c.wc.status);
            done += 1;
        }
        if !killed && done >= 100 {
            // Mid-transfer: 64 KiB Writes to it are queued and in flight.
            peer.reap();
            killed = true;
        }
    }
    assert!(killed);
    let a: Vec<WcStatus> = (0..N).filter(|&i| to_a(i)).map(|i| statuses[i]).collect();
    let b: Vec<WcStatus> = (0..N).filter(|&i| !to_a(i)).map(|i| statuses[i]).collect();
    assert!(
        b.iter().all(|&s| s == WcStatus::Success),
        "the other target was affected: {b:?}\n{:?}\n{:?}",
        svc.stats(),
        local.dcts[0].service().stats()
    );
    let ok_a = a.iter().take_while(|&&s| s == WcStatus::Success).count();
    assert!(ok_a >= 1 && ok_a < a.len(), "A: {a:?}");
    assert!(
        a[ok_a..].iter().all(|&s| s != WcStatus::Success),
        "A succeeded after failing: {a:?}"
    );
    // B got every message once, intact.
    local.receive_until(sends_b as usize, Instant::now() + Duration::from_secs(20));
    assert_eq!(local.seen.len(), sends_b as usize);
    let st = svc.stats();
    assert!(st.table.max_live <= 16, "{st:?}");
    // The connections were made by direct requests (the default).
    assert!(st.table.direct_connected > 0, "{st:?}");
}

#[test]
fn invitations_lost_and_duplicated_netns() {
    const N: usize = 300;
    let Some(mut pair) = NetPair::for_test("invitations_lost_and_duplicated_netns") else {
        return;
    };
    pair.set_loss(1, 5).unwrap();
    let ns = pair.ns.clone();
    let nft = |side: usize, args: &[&str]| {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns[side], "nft"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nft {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for side in 0..2 {
        let other = pair.addr[1 - side].to_string();
        nft(side, &["add", "table", "ip", "srdmadc"]);
        nft(
            side,
            &[
                "add",
                "chain",
                "ip",
                "srdmadc",
                "in",
                "{ type filter hook input priority 0 ; }",
            ],
        );
        nft(
            side,
            &[
                "add",
                "rule",
                "ip",
                "srdmadc",
                "in",
                "ip protocol udp numgen random mod 1000 < 200 counter drop",
            ],
        );
        nft(
            side,
            &[
                "add",
                "chain",
                "ip",
                "srdmadc",
                "out",
                "{ type filter hook output priority 0 ; }",
            ],
        );
        let dup = format!(
            "ip daddr {other} ip protocol udp numgen random mod 1000 < 200 counter dup to {other}"
        );
        nft(side, &["add", "rule", "ip", "srdmadc", "out", &dup]);
    }
    let exe = std::env::current_exe().unwrap();
    let (a, b) = (pair.addr[0], pair.addr[1]);
    let mut server = spawn(
        pair.command(1, &exe),
        &format!("server {b} 12 16"),
        "netns-server",
    );
    let w = server.expect("ready");
    let dcts = w[3..].join(" ");
    let mut client = spawn(
        pair.command(0, &exe),
        &format!("client {b} {a} 4 {N} {dcts}"),
        "netns-client",
    );
    let retx: u64 = client.expect("done")[0].parse().unwrap();
    client.finish_ok();
    server.tell(&format!("expect {N}"));
    let got = server.expect("got");
    assert_eq!(got[0], N.to_string());
    let dup_invites: u64 = got[1].trim_start_matches("dup_invites=").parse().unwrap();
    server.close_stdin();
    server.finish_ok();
    let counters = nft(0, &["list", "table", "ip", "srdmadc"]);
    assert!(retx > 0, "no invitation was retransmitted\n{counters}");
    assert!(dup_invites > 0, "no duplicate invitation was seen");
    eprintln!("retransmits {retx}, duplicate invitations {dup_invites}\n{counters}");
}

/// Writes a direct DC connection request (DC key in the private data) to
/// the listener on DCT `dct`'s UDP port number, the MPA frame in two
/// pieces `gap` apart, the first `split` octets long (0: the connection
/// stays silent first); the target answers once the Request is whole.
/// The initiator's view of the outcome.
fn direct_request(
    dct: u32,
    key: u64,
    conn: u64,
    split: usize,
    gap: Duration,
) -> softrdma_proto::mpa::Outcome {
    use softrdma_proto::mpa::{Initiator, MpaConfig};
    use std::io::{Read, Write};
    let mut pd = softrdma_engine::dc::PD_MAGIC_DIRECT.to_vec();
    pd.extend_from_slice(&key.to_be_bytes());
    pd.extend_from_slice(&dct.to_be_bytes());
    pd.extend_from_slice(&conn.to_be_bytes());
    pd.extend_from_slice(&0x0012_3400u32.to_be_bytes());
    pd.extend_from_slice(&0x1234u16.to_be_bytes());
    let now = Instant::now();
    let mut ini = Initiator::new(
        MpaConfig {
            private_data: pd,
            ..MpaConfig::default()
        },
        now,
    )
    .unwrap();
    let mut req = Vec::new();
    while let Some(b) = ini.poll_transmit() {
        req.extend_from_slice(b);
        let n = b.len();
        ini.transmitted(n);
    }
    let port = (dct >> 8) as u16;
    let mut s = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(&req[..split]).unwrap();
    thread::sleep(gap);
    s.write_all(&req[split..]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hdr = [0u8; softrdma_wire::mpa::HEADER_LEN];
    s.read_exact(&mut hdr).unwrap();
    let len = softrdma_wire::mpa::frame_len(&hdr).unwrap();
    let mut frame = hdr.to_vec();
    frame.resize(len, 0);
    s.read_exact(&mut frame[hdr.len()..]).unwrap();
    ini.handle_bytes(&frame, Instant::now()).unwrap();
    ini.poll_outcome().expect("an outcome")
}

/// A direct connection request that arrives late (the progress thread
/// waits for the socket) or in pieces (the slow-handshake thread) is
/// answered when whole; the right key is accepted (one slot each), a
/// wrong one refused without counting as a key rejection (the invitation
/// decides those).
#[test]
fn direct_request_split_right_and_wrong_key() {
    use softrdma_proto::mpa::Outcome;
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(64, None);
    let srq = ctx.create_srq(16);
    let svc = DcService::of(&ctx, opts(lo, 4, Duration::from_secs(2), true)).unwrap();
    let dct = Dct::new(&svc, pd, cq, srq, 77).unwrap();
    let gap = Duration::from_millis(30);
    let late = direct_request(dct.number(), 77, 1, 0, gap);
    assert!(matches!(late, Outcome::Negotiated(_)), "{late:?}");
    let pieces = direct_request(dct.number(), 77, 2, 7, gap);
    assert!(matches!(pieces, Outcome::Negotiated(_)), "{pieces:?}");
    let bad = direct_request(dct.number(), 78, 3, 0, gap);
    assert!(matches!(bad, Outcome::Rejected { .. }), "{bad:?}");
    let st = svc.stats().table;
    assert_eq!((st.direct_accepts, st.direct_refused), (2, 1), "{st:?}");
    assert_eq!(st.rejected_bad_key, 0);
    assert_eq!(dct.rejected(), 0);
}

// ---------------------------------------------------------------------
// Reverse use: A and B are each DCI and DCT of the other (one process,
// two contexts).

/// One side: a DCI, a DCT on an SRQ, receive buffers (`RECVS` messages)
/// and send buffers.
struct Side {
    svc: Arc<DcService>,
    dci: Dci,
    dct: Dct,
    dci_cq: Arc<Cq>,
    dct_cq: Arc<Cq>,
    srq: Arc<Srq>,
    mem: Mem,
    /// Messages received (their numbers), in arrival order.
    got: Vec<u32>,
    /// Completions of the DCI: (wr_id, status), in order.
    done: Vec<(u64, WcStatus)>,
    // Dropped last: the objects above hold parts of the context.
    _ctx: Context,
}

const RECVS: usize = 64;
const SENDS: usize = 64;

impl Side {
    fn new(reverse: bool, idle: Duration) -> Side {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let ctx = Context::new().unwrap();
        let pd = ctx.alloc_pd();
        let dci_cq = ctx.create_cq(1024, None);
        let dct_cq = ctx.create_cq(1024, None);
        let srq = ctx.create_srq(RECVS);
        let mem = Mem::new(&ctx, pd, (RECVS + SENDS) * MSG);
        for i in 0..RECVS {
            srq.post_recv(RecvWr {
                wr_id: i as u64,
                sgl: mem.sgl(i * MSG, MSG),
            })
            .unwrap();
        }
        let mut o = opts(lo, 16, Duration::from_secs(2), true);
        o.table.reverse = reverse;
        o.table.idle_timeout = idle;
        let svc = DcService::of(&ctx, o).unwrap();
        let dct = Dct::new(&svc, pd, dct_cq.clone(), srq.clone(), KEY).unwrap();
        let dci = Dci::new(&svc, pd, dci_cq.clone(), SENDS);
        Side {
            svc,
            dci,
            dct,
            dci_cq,
            dct_cq,
            srq,
            mem,
            got: Vec::new(),
            done: Vec::new(),
            _ctx: ctx,
        }
    }

    /// Sends message `i` to `dct` (with `key`), from send slot `i % SENDS`.
    fn send(&self, i: u32, dct: u32, key: u64) -> Result<(), softrdma_engine::QpError> {
        let slot = RECVS + i as usize % SENDS;
        self.mem.write(slot * MSG, &message(i));
        let wr = SendWr {
            wr_id: u64::from(i),
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(self.mem.sgl(slot * MSG, MSG)),
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        };
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        self.dci.post_send(
            wr,
            DcTarget {
                key,
                ..target(lo, dct)
            },
        )
    }

    /// Polls both CQs once: received messages are checked and their
    /// receives reposted; DCI completions recorded. True if anything.
    fn poll(&mut self) -> bool {
        let mut buf = [blank(); 32];
        let mut any = false;
        let n = self.dct_cq.poll(&mut buf);
        for c in &buf[..n] {
            any = true;
            assert_eq!(c.wc.status, WcStatus::Success, "{:?}", c.wc);
            assert_eq!(c.wc.byte_len as usize, MSG);
            let slot = c.wc.wr_id as usize;
            let mut m = [0u8; MSG];
            self.mem.read(slot * MSG, &mut m);
            let i = u32::from_be_bytes(m[..4].try_into().unwrap());
            assert_eq!(m, message(i), "message {i} corrupted");
            self.got.push(i);
            self.srq
                .post_recv(RecvWr {
                    wr_id: slot as u64,
                    sgl: self.mem.sgl(slot * MSG, MSG),
                })
                .unwrap();
        }
        let n = self.dci_cq.poll(&mut buf);
        for c in &buf[..n] {
            any = true;
            self.done.push((c.wc.wr_id, c.wc.status));
        }
        any
    }
}

/// Ping-pong of `n` round trips: A sends `i`, B answers `i` when it got
/// it. Both sides' messages intact and in order, DCI completions in
/// posting order.
fn ping_pong(a: &mut Side, b: &mut Side, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (da, db) = (a.dct.number(), b.dct.number());
    let (a0, b0) = (a.got.len(), b.got.len());
    for i in 0..n {
        a.send(i, db, KEY).unwrap();
        while b.got.len() < b0 + i as usize + 1 {
            b.poll();
            a.poll();
            assert!(Instant::now() < deadline, "B waits for {i}");
        }
        b.send(i, da, KEY).unwrap();
        while a.got.len() < a0 + i as usize + 1 {
            a.poll();
            b.poll();
            assert!(Instant::now() < deadline, "A waits for {i}");
        }
    }
    for s in [&mut *a, &mut *b] {
        while s.done.len() < n as usize {
            s.poll();
            assert!(Instant::now() < deadline, "completions");
        }
        let ids: Vec<u64> = s
            .done
            .drain(..)
            .map(|(id, st)| {
                assert_eq!(st, WcStatus::Success);
                id
            })
            .collect();
        assert_eq!(
            ids,
            (0..u64::from(n)).collect::<Vec<_>>(),
            "completion order"
        );
    }
    assert_eq!(a.got[a0..], (0..n).collect::<Vec<_>>()[..]);
    assert_eq!(b.got[b0..], (0..n).collect::<Vec<_>>()[..]);
}

/// Reverse use on (the default): B's answers travel over the connection
/// A opened, so one RC connection (one TCP socket) carries both
/// directions; with it off, each direction has its own. A wrong key on
/// the Bind is refused and counted once, failing only that work request.
/// Then A's idle close while B streams to it: the close handshake moves
/// B to a fresh connection and no message is lost.
#[test]
fn reverse_use_one_connection_both_ways() {
    // Off: two connections, as before.
    {
        let mut a = Side::new(false, Duration::from_secs(2));
        let mut b = Side::new(false, Duration::from_secs(2));
        ping_pong(&mut a, &mut b, 100);
        let (sa, sb) = (a.svc.stats(), b.svc.stats());
        assert_eq!((sa.rc_qps, sb.rc_qps), (2, 2), "{sa:?} {sb:?}");
        assert_eq!(sb.table.binds, 0);
    }
    let idle = Duration::from_millis(150);
    let mut a = Side::new(true, idle);
    let mut b = Side::new(true, idle);
    let (da, db) = (a.dct.number(), b.dct.number());
    // A opens the connection (offering its DCT).
    let deadline = Instant::now() + Duration::from_secs(10);
    a.send(5000, db, KEY).unwrap();
    while b.got.is_empty() || a.done.is_empty() {
        b.poll();
        a.poll();
        assert!(Instant::now() < deadline, "first message");
    }
    assert_eq!(a.done.remove(0), (5000, WcStatus::Success));
    // A wrong key for A's DCT: B binds over that connection, A refuses
    // and counts it once; B's work request fails RemAccessErr and no
    // connection of B's own is tried.
    b.send(5001, da, KEY + 1).unwrap();
    while b.done.is_empty() {
        b.poll();
        a.poll();
        assert!(Instant::now() < deadline, "wrong-key completion");
    }
    assert_eq!(b.done.remove(0), (5001, WcStatus::RemAccessErr));
    assert_eq!(a.dct.rejected(), 1);
    assert_eq!(a.svc.stats().table.rejected_bad_key, 1);
    assert_eq!(b.svc.stats().table.binds, 1);
    // (a) the ping-pong, B answering over A's connection.
    ping_pong(&mut a, &mut b, 200);
    let (sa, sb) = (a.svc.stats(), b.svc.stats());
    // (b) one connection, one slot each side, both directions over it;
    // B never opened one of its own.
    assert_eq!((sa.rc_qps, sb.rc_qps), (1, 1), "{sa:?} {sb:?}");
    assert_eq!((sa.live, sb.live), (1, 1));
    assert_eq!((sb.table.binds, sb.table.bound), (2, 1), "{sb:?}");
    assert_eq!(
        (sb.table.invites, sb.table.direct_attempts),
        (0, 0),
        "{sb:?}"
    );
    assert_eq!(sa.table.binds_accepted, 1, "{sa:?}");
    assert_eq!(a.dct.rejected(), 1, "counted once");

    // (c) B streams to A; A posts nothing, so its connection idles out
    // mid-stream: Unbind, B drains and answers, A closes; B's later
    // messages take a fresh connection. Every message arrives once.
    let total = 3000u32;
    let start = Instant::now();
    let mut posted = 0u32;
    let a0 = a.got.len();
    let deadline = Instant::now() + Duration::from_secs(30);
    while a.got.len() < a0 + total as usize {
        // Paced over several idle timeouts. A Send completes when written,
        // not when received, and iWARP has no receiver-not-ready retry: B
        // never has more messages unreceived than A has receives posted
        // (A reposts each as it takes the message), or a burst after a
        // stall of this thread would find A's SRQ empty and fail the
        // connection (`DdpUntaggedNoBuffer`), as it would between
        // processes.
        let due = ((start.elapsed().as_micros() / 200) as u32).min(total);
        let credit = (a.got.len() - a0 + RECVS) as u32;
        while posted < due && posted < credit && b.dci.outstanding() < SENDS {
            b.send(2000 + posted, a.dct.number(), KEY).unwrap();
            posted += 1;
        }
        a.poll();
        b.poll();
        assert!(
            Instant::now() < deadline,
            "stream stalled at {posted}: A got {}, B done {}, outstanding {}; A {:?}; B {:?}",
            a.got.len() - a0,
            b.done.len(),
            b.dci.outstanding(),
            a.svc.stats(),
            b.svc.stats()
        );
    }
    while b.done.len() < total as usize {
        b.poll();
        assert!(Instant::now() < deadline, "stream completions");
    }
    assert!(b.done.iter().all(|&(_, st)| st == WcStatus::Success));
    let ids: Vec<u64> = b.done.iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, (2000..2000 + u64::from(total)).collect::<Vec<_>>());
    let mut got = a.got[a0..].to_vec();
    let in_order = got.windows(2).filter(|w| w[1] > w[0]).count();
    got.sort_unstable();
    assert_eq!(
        got,
        (2000..2000 + total).collect::<Vec<_>>(),
        "lost or twice"
    );
    let (sa, sb) = (a.svc.stats(), b.svc.stats());
    assert!(sa.table.unbinds >= 1, "no close handshake ran: {sa:?}");
    assert_eq!(sa.table.unbind_timeouts, 0, "{sa:?}");
    assert!(sb.table.target_accepts >= 1);
    eprintln!(
        "reverse stream: {} of {} arrivals in order after the previous; A {:?}; B {:?}",
        in_order,
        total - 1,
        sa.table,
        sb.table
    );
}

/// A Send that finds the DCT's SRQ empty: iWARP has no receiver-not-ready
/// retry, so the connection fails. The target's application sees only the
/// messages that found receives, in order, and the DCT counts the lost
/// connection (or connections: A's later Sends may take fresh ones that
/// fail the same way); the initiator's work completes in order, the
/// first ones successfully (a Send completes when written: usually every
/// one here, the lost ones included), and once B has receives again A's
/// next message takes a fresh connection.
#[test]
fn a_send_finding_the_srq_empty_is_counted_at_the_dct() {
    let mut a = Side::new(false, Duration::from_secs(2));
    let mut b = Side::new(false, Duration::from_secs(2));
    let db = b.dct.number();
    let total = RECVS as u32 + 36;
    let deadline = Instant::now() + Duration::from_secs(20);
    // B takes nothing: its receives are not reposted. (A send slot is
    // written by `send` before the post: only with room in the queue.)
    let mut posted = 0;
    while posted < total {
        if a.dci.outstanding() < SENDS {
            a.send(posted, db, KEY).unwrap();
            posted += 1;
        }
        a.poll();
        assert!(Instant::now() < deadline, "posting: {posted}");
    }
    while a.done.len() < total as usize {
        a.poll();
        assert!(
            Instant::now() < deadline,
            "A's completions: {}",
            a.done.len()
        );
    }
    while b.dct.connections_lost_no_receive() == 0 {
        thread::sleep(Duration::from_millis(5));
        assert!(Instant::now() < deadline, "the DCT never counted the loss");
    }
    // Once A learns of the failure, its later Sends take fresh
    // connections, which fail the same way while B has no receives: one
    // or more connections, each counted once.
    let lost = b.dct.connections_lost_no_receive();
    assert!(
        (1..=u64::from(total - RECVS as u32)).contains(&lost),
        "{lost}"
    );
    assert_eq!(a.dct.connections_lost_no_receive(), 0);
    // In posting order; the first RECVS at least succeeded (a Send
    // completes when written: usually every one does here, the lost
    // ones included; a fresh connection's may fail later).
    let ids: Vec<u64> = a.done.iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, (0..u64::from(total)).collect::<Vec<_>>());
    let ok = a
        .done
        .iter()
        .take_while(|d| d.1 == WcStatus::Success)
        .count();
    assert!(ok >= RECVS, "{ok} successes: {:?}", a.done);
    // B got exactly the messages its receives took, in order.
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until {
        b.poll();
    }
    assert_eq!(b.got, (0..RECVS as u32).collect::<Vec<_>>());
    // B has receives again: A's next message takes a fresh connection.
    a.done.clear();
    a.send(9000, db, KEY).unwrap();
    while b.got.len() < RECVS + 1 || a.done.is_empty() {
        a.poll();
        b.poll();
        assert!(Instant::now() < deadline, "the message after the loss");
    }
    assert_eq!(b.got[RECVS], 9000);
    assert_eq!(a.done, vec![(9000, WcStatus::Success)]);
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until {
        a.poll();
        b.poll();
    }
    assert_eq!(b.dct.connections_lost_no_receive(), lost, "counted once");
}
