//! The RDMA model of `libexs` (`softrdma_exs_core::wire`): the control
//! messages and the connection exchange's private data from arbitrary
//! octets, and the sans-IO step that applies each received message to a
//! connection's counters (`wire::check` on a `wire::Window`), with the
//! credits this end returns in between.
//!
//! Holds: nothing panics; a message that decodes re-encodes to the same
//! octets and is at most `MSG_MAX` long; parsed private data has sane
//! numbers and re-encodes to what parses the same; the window's counters
//! never leave their bounds (credits spendable and credits held within the
//! negotiated window), and a message the step refuses leaves nothing
//! half-applied that a later message could exploit (the run stops there,
//! as the connection would be reset).
//!
//! Input: a window octet pair (credits, and which persistent blocks exist
//! with what length), then a sequence of operations: `0..=0x7f` a message
//! of that many octets follows; `0x80..=0xbf` this end returns the low
//! bits' count of held credits; `0xc0..` the following 16 octets are
//! private data.
//!
//! An input whose first octet is `0xff` drives the calls of the RDMA model
//! instead (`softrdma_exs_core::api`, the functions behind `libexs`'s
//! exports): on a freshly connected pair over 127.0.0.1, a listener and
//! an unconnected socket, calls with descriptors, pointers (NULL, unmapped,
//! an arena, the top of the address space), lengths, flags (persistent
//! ones included), offsets, queues and registration handles from the
//! input. Holds: no call crashes; each returns 0 or a documented errno.
//! The pair is replaced every 64 such inputs (closing it ends what is
//! still queued, freeing the queue's slots).
#![no_main]
use libc::{c_int, c_void, sockaddr, socklen_t};
use libfuzzer_sys::fuzz_target;
use softrdma_exs_core::abi::*;
use softrdma_exs_core::api;
use softrdma_exs_core::wire::{self, Msg, Params, Window, MAX_CREDITS, MSG_MAX, PARAMS_LEN};

/// Errno values the RDMA model's calls may fail with.
const ALLOWED: &[c_int] = &[
    libc::EBADF,
    libc::ENOTSOCK,
    libc::EINVAL,
    libc::EFAULT,
    libc::EAGAIN,
    libc::EOPNOTSUPP,
    libc::ENOTCONN,
    libc::EISCONN,
    libc::EALREADY,
    libc::EMSGSIZE,
    libc::EAFNOSUPPORT,
    libc::ECONNRESET,
    libc::EPIPE,
    libc::ENOMEM,
    libc::EADDRINUSE,
    libc::EPROTONOSUPPORT,
    libc::ESOCKTNOSUPPORT,
];

/// The memory every non-bogus pointer of the calls points into. The
/// library cannot tell a buffer that runs past its allocation into other
/// mapped memory from a good one (nor can the kernel), so the operands keep
/// every transfer inside: a pointer at most [`REGION`] − 1 octets in, a
/// length below [`LEN_MAX`], and room to spare for the `socklen_t` at the
/// end.
const ARENA: usize = 1 << 17;
/// The registered start of the arena (lengths reach past it, so the
/// registration's bounds are exercised).
const REGION: usize = 1 << 15;
/// Lengths drawn from the input stay below this (plus the huge ones that
/// overflow and must be refused before anything is touched).
const LEN_MAX: u32 = 70_000;
const _: () = assert!(REGION + LEN_MAX as usize + 16 <= ARENA);

fn arena() -> usize {
    static A: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *A.get_or_init(|| Box::leak(vec![0u8; ARENA].into_boxed_slice()).as_mut_ptr() as usize)
}

/// Operands; zeros once the input is used up.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

fn ok<T>(r: Result<T, c_int>, what: &str) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(ALLOWED.contains(&e), "{what}: errno {e}");
            None
        }
    }
}

fn loopback(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    }
}

/// Takes events until `n` were moved, none came for 10 ms (at once with
/// `n` 0), or 10 s passed.
fn drain(q: c_int, n: usize) -> usize {
    let mut ev = [exs_event_t::new(0, 0, 0, 0); 64];
    let mut got = 0;
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let t = libc::timespec {
            tv_sec: 0,
            tv_nsec: if n == 0 { 0 } else { 10_000_000 },
        };
        // SAFETY: a local event array and timespec.
        let k = unsafe { api::qdequeue(q, ev.as_mut_ptr(), ev.len() as c_int, &t) }.unwrap_or(0)
            as usize;
        got += k;
        if k == 0 || got >= n || std::time::Instant::now() >= end {
            return got;
        }
    }
}

/// The listener, its address, and the current connected pair with the
/// inputs it has served (a pair is replaced every [`PAIR_RUNS`] inputs, so
/// operations that never complete do not fill the queue for good).
struct Fixture {
    q: c_int,
    lst: c_int,
    to: libc::sockaddr_in,
    pair: Option<(c_int, c_int)>,
    runs: u32,
    region: c_int,
}

const PAIR_RUNS: u32 = 64;

static FIX: std::sync::Mutex<Option<Fixture>> = std::sync::Mutex::new(None);

fn fixture() -> Fixture {
    let q = api::qcreate(EXS_EVTVEC_MAX as c_int).expect("queue");
    let lst = api::socket(libc::AF_INET, libc::SOCK_SEQPACKET, 0).expect("socket");
    let a = loopback(0);
    let alen = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
    api::bind(lst, &a as *const _ as *const sockaddr, alen).expect("bind");
    api::listen(lst, 4).expect("listen");
    let mut got = loopback(0);
    let mut gl = alen;
    api::sockname(false, lst, &mut got as *mut _ as *mut sockaddr, &mut gl).expect("name");
    Fixture {
        q,
        lst,
        to: loopback(u16::from_be(got.sin_port)),
        pair: None,
        runs: 0,
        region: api::mregister(arena() as *const c_void, REGION, 0).expect("region"),
    }
}

fn connect_pair(f: &Fixture) -> (c_int, c_int) {
    let q = f.q;
    let alen = std::mem::size_of::<libc::sockaddr_in>() as socklen_t;
    let cl = api::socket(libc::AF_INET, libc::SOCK_SEQPACKET, 0).expect("socket");
    api::connect(
        cl,
        &f.to as *const _ as *const sockaddr,
        alen,
        q,
        1 as *mut c_void,
    )
    .expect("connect");
    api::accept(f.lst, std::ptr::null_mut(), 0, q, 2 as *mut c_void).expect("accept");
    let mut ev = [exs_event_t::new(0, 0, 0, 0); 2];
    let mut n = 0;
    let mut sv = -1;
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while n < 2 && std::time::Instant::now() < end {
        let t = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: a local event array and timespec.
        let k = unsafe { api::qdequeue(q, ev.as_mut_ptr(), 2, &t) }.unwrap_or(0) as usize;
        for e in &ev[..k] {
            assert_eq!(e.exs_evt_errno, 0, "connect/accept");
            if e.exs_evt_type == EXS_EVT_ACCEPT {
                // SAFETY: an accept event's union member.
                sv = unsafe { e.exs_evt_union.exs_evt_accept.exs_evt_newfd };
            }
        }
        n += k;
    }
    assert!(n == 2 && sv >= 0, "connection");
    (cl, sv)
}

fn calls(mut inp: Input) {
    let mut g = FIX.lock().unwrap_or_else(|e| e.into_inner());
    let f = g.get_or_insert_with(fixture);
    let q = f.q;
    let lst = f.lst;
    if f.runs >= PAIR_RUNS {
        if let Some((a, b)) = f.pair.take() {
            ok(api::close(a), "close");
            ok(api::close(b), "close");
        }
        // Closing ended what was still queued: every slot comes back.
        drain(q, usize::MAX);
        f.runs = 0;
    }
    if f.pair.is_none() {
        f.pair = Some(connect_pair(f));
    }
    f.runs += 1;
    let (cl, sv) = f.pair.expect("pair");
    let lone = api::socket(libc::AF_INET, libc::SOCK_STREAM, 0).expect("socket");
    let region = f.region;
    for _ in 0..32 {
        let op = inp.u8();
        let fd = match inp.u8() % 6 {
            0 | 1 => cl,
            2 => sv,
            3 => lst,
            4 => lone,
            _ => [-1, 100_000][usize::from(inp.u8() & 1)],
        };
        let pc = inp.u8();
        let off = usize::from(inp.u8()) * 256 + usize::from(inp.u8());
        let ptr = match pc % 4 {
            0 => 0,
            1 => arena() + off % REGION,
            2 => 16,
            _ => usize::MAX - 4095,
        } as *mut c_void;
        let len = match inp.u8() % 4 {
            0 => 0,
            1 => usize::from(inp.u8()),
            2 => (inp.u32() % LEN_MAX) as usize,
            _ => usize::MAX - usize::from(inp.u8()),
        };
        let flags = match inp.u8() % 5 {
            0 => 0,
            1 => EXS_PERSISTENT,
            2 => EXS_PERSISTENT_NOTIFY,
            3 => libc::MSG_TRUNC,
            _ => inp.u32() as c_int,
        };
        let offset = match inp.u8() % 3 {
            0 => u64::from(inp.u8()),
            1 => u64::from(inp.u32() % 70_000),
            _ => inp.u64(),
        };
        let qh = match inp.u8() % 4 {
            0..=1 => q,
            2 => -1,
            _ => q + 1000,
        };
        let mh = match inp.u8() % 4 {
            0 => region,
            1 => EXS_MHANDLE_UNREGISTERED,
            2 => EXS_MHANDLE_INVALID,
            _ => inp.u32() as c_int,
        };
        let ah = 7 as *mut c_void;
        let r = match op % 10 {
            0 => api::send(fd, ptr, len, flags, qh, ah, mh),
            1 => api::recv(fd, ptr, len, flags, qh, ah, mh),
            2 => api::offset_xfer(false, fd, ptr as usize, len, flags, offset, qh, ah, mh),
            3 => api::offset_xfer(true, fd, ptr as usize, len, flags, offset, qh, ah, mh),
            4 => api::fcntl(fd, inp.u32() as c_int, offset as libc::c_ulong).map(|_| ()),
            5 => api::sockname(
                op & 0x10 != 0,
                fd,
                ptr as *mut sockaddr,
                if pc & 0x10 != 0 {
                    std::ptr::null_mut()
                } else {
                    (arena() + ARENA - 8) as *mut socklen_t
                },
            ),
            6 => api::bind(fd, ptr as *const sockaddr, len as socklen_t),
            7 => api::connect(fd, ptr as *const sockaddr, len as socklen_t, qh, ah),
            8 => api::accept(fd, ptr as *mut exs_acceptaddr_t, flags, qh, ah),
            _ => api::listen(fd, inp.u32() as c_int),
        };
        ok(r, "call");
    }
    ok(api::close(lone), "close");
    // Events of what finished so far; the rest ends when the pair is
    // replaced.
    drain(q, 0);
}

fuzz_target!(|data: &[u8]| {
    if data.first() == Some(&0xff) {
        calls(Input(&data[1..]));
        return;
    }
    if data.len() < 3 {
        return;
    }
    let credits = u32::from(data[0]) % 16 + 1;
    let blocks = data[1];
    let len_of = |bits: u8| -> u64 {
        match bits & 3 {
            0 => 0,
            1 => 1,
            2 => 4096,
            _ => u64::from(u32::MAX),
        }
    };
    let mut w = Window {
        credits,
        send_credits: u32::from(data[2]) % (credits + 1),
        held: 0,
        psend_len: len_of(blocks),
        precv_len: len_of(blocks >> 2),
    };
    let mut rest = &data[3..];
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        if op < 0x80 {
            let n = (op as usize).min(rest.len());
            let (b, tail) = rest.split_at(n);
            rest = tail;
            // Longer messages than one octet can say: pad with the input's
            // start so every size up to and past MSG_MAX is reached.
            let mut m = b.to_vec();
            if op & 0x40 != 0 {
                m.extend(
                    data.iter()
                        .cycle()
                        .take(wire::HDR + (op as usize & 0x3f) * 4),
                );
            }
            let Some(msg) = Msg::decode(&m) else { continue };
            assert!(m.len() <= MSG_MAX);
            assert_eq!(msg.encode(), m, "decode/encode round trip");
            let before = w;
            match wire::check(&mut w, &msg) {
                Ok(()) => {
                    assert!(w.send_credits <= w.credits, "{before:?} -> {w:?}");
                    assert!(w.held <= w.credits, "{before:?} -> {w:?}");
                    assert!(w.send_credits >= before.send_credits);
                    if wire::spends_credit(msg.kind) {
                        assert_eq!(w.held, before.held + 1);
                        if msg.kind == wire::RNOTE {
                            assert!(msg.addr + u64::from(msg.len) <= w.psend_len);
                        }
                        if msg.kind == wire::WNOTE {
                            assert!(msg.addr + u64::from(msg.len) <= w.precv_len);
                        }
                    } else {
                        assert_eq!(w.held, before.held);
                    }
                }
                Err(()) => return,
            }
        } else if op < 0xc0 {
            // This end returns credits (piggybacked or in a CREDIT).
            let k = u32::from(op & 0x3f).min(w.held);
            w.held -= k;
        } else {
            let n = PARAMS_LEN.min(rest.len());
            let (b, tail) = rest.split_at(n);
            rest = tail;
            if let Some(p) = Params::parse(b) {
                assert!((1..=MAX_CREDITS).contains(&p.credits));
                assert!(p.small as usize <= wire::IMM_MAX);
                assert_eq!(Params::parse(&p.to_bytes()), Some(p));
            }
        }
    }
});
