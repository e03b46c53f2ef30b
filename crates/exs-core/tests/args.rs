//! Argument checking of the calls with arbitrary values: every call
//! either queues its operation or fails with one of the documented errno
//! values, never crashes, and a queued operation always produces exactly
//! one event.

use libc::{c_int, c_void};
use proptest::prelude::*;
use softrdma_exs_core::abi::*;
use softrdma_exs_core::api;

const ALLOWED: &[c_int] = &[
    libc::EBADF,
    libc::ENOTSOCK,
    libc::EINVAL,
    libc::EFAULT,
    libc::EAGAIN,
    libc::EOPNOTSUPP,
];

fn socketpair() -> (c_int, c_int) {
    let mut sv = [0; 2];
    // SAFETY: sv has two ints.
    let r = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) };
    assert_eq!(r, 0);
    (sv[0], sv[1])
}

/// A buffer that outlives every operation queued on it.
fn arena() -> usize {
    static A: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *A.get_or_init(|| Box::leak(vec![0u8; 1 << 16].into_boxed_slice()).as_mut_ptr() as usize)
}

fn pick_ptr(choice: u8, off: usize) -> usize {
    match choice % 4 {
        0 => 0,
        1 => arena() + off % (1 << 15),
        2 => 16,
        _ => usize::MAX - 4095,
    }
}

fn pick_fd(choice: u8, real: c_int) -> c_int {
    match choice % 4 {
        0 => real,
        1 => -1,
        2 => 1000 + choice as c_int,
        // A pipe end: open, not a socket.
        _ => PIPE.with(|p| *p),
    }
}

thread_local! {
    static PIPE: c_int = {
        let mut p = [0; 2];
        // SAFETY: p has two ints.
        unsafe { libc::pipe(p.as_mut_ptr()) };
        p[0]
    };
}

fn check(r: Result<(), c_int>, queued: &mut usize, what: &str) -> Result<(), TestCaseError> {
    match r {
        Ok(()) => *queued += 1,
        Err(e) => prop_assert!(ALLOWED.contains(&e), "{what}: errno {e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn calls_queue_or_fail_with_a_documented_errno(
        fdc in any::<u8>(), qc in -2i32..3, mc in -3i32..3,
        bufc in any::<u8>(), off in any::<usize>(), len in prop_oneof![Just(0usize), 1usize..4096, Just(usize::MAX)],
        flags in prop_oneof![Just(0), any::<i32>(), Just(libc::MSG_WAITALL), Just(EXS_PERSISTENT)],
        iovlen in -2i32..4, msgc in any::<u8>(), n in -3i32..4,
    ) {
        let q = api::qcreate(4).expect("queue");
        let (a, b) = socketpair();
        let fd = pick_fd(fdc, a);
        let qh = if qc == 0 { q } else { q + 1000 * qc };
        let region = api::mregister(arena() as *const c_void, 1 << 15, 0).expect("region");
        let mh = match mc { 0 => region, -1 => EXS_MHANDLE_UNREGISTERED, x => region + 100 * x };
        let buf = pick_ptr(bufc, off) as *mut c_void;
        let mut queued = 0usize;

        check(api::send(fd, buf, len, flags, qh, 7 as *mut c_void, mh), &mut queued, "send")?;
        check(api::recv(fd, buf, len, flags, qh, 8 as *mut c_void, mh), &mut queued, "recv")?;
        let mut iov = [exs_iovec_t { iov_base: buf, iov_len: len.min(64), iov_mhandle: mh }; 3];
        let mut m = exs_msghdr_t {
            msg_name: std::ptr::null_mut(), msg_namelen: 0,
            msg_iov: iov.as_mut_ptr(), msg_iovlen: iovlen,
            msg_control: std::ptr::null_mut(), msg_controllen: 0, msg_flags: 0,
        };
        let mp = match msgc % 3 { 0 => &mut m as *mut exs_msghdr_t, 1 => std::ptr::null_mut(), _ => 24 as *mut exs_msghdr_t };
        // SAFETY: mp is valid, NULL or garbage: what the call must survive.
        check(unsafe { api::msg(msgc % 2 == 0, fd, mp, flags, qh, 9 as *mut c_void) }, &mut queued, "msg")?;
        let mut pf = [exs_pollfd_t { fd, events: libc::POLLIN, revents: 0 }];
        let pp = if msgc % 2 == 0 { pf.as_mut_ptr() } else { 40 as *mut exs_pollfd_t };
        // SAFETY: as above.
        check(unsafe { api::poll(pp, (iovlen.max(0)) as u32, qh, 10 as *mut c_void) }, &mut queued, "poll")?;

        // Every queued operation ends: close both ends (a poll on the pipe
        // would wait for data forever: cancel it), then count events.
        let _ = api::close(a);
        let _ = api::close(b);
        let _ = api::cancel(-1, 10 as *mut c_void, EXS_CAF_AHANDLE);
        let mut evs = [exs_event_t::new(0, 0, 0, 0); 16];
        let mut got = 0usize;
        let ts = libc::timespec { tv_sec: 2, tv_nsec: 0 };
        while got < queued {
            // SAFETY: evs has 16 entries; ts is a local.
            let k = unsafe { api::qdequeue(q, evs.as_mut_ptr(), 16, &ts) }.expect("dequeue");
            prop_assert!(k > 0, "only {got} of {queued} events");
            got += k as usize;
        }
        prop_assert_eq!(got, queued);
        // A bad event array or count is refused, not written.
        // SAFETY: garbage on purpose.
        let r = unsafe { api::qdequeue(q, 32 as *mut exs_event_t, n.max(1), std::ptr::null()) };
        prop_assert_eq!(r, Err(libc::EFAULT));
        prop_assert_eq!(api::mderegister(region), Ok(()));
        prop_assert_eq!(api::qdelete(q), Ok(()));
    }
}
