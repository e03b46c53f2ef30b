//! `libsoftrdma-sockets.so.1`: the `LD_PRELOAD` interposer (`softrdma run
//! --sockets`). It defines the C library's socket calls and forwards each
//! to `softrdma_sockets_core::hooks`, behind a panic boundary: a panic
//! inside softrdma fails the one call with `EIO` rather than unwinding
//! into C. The design is in `docs/sockets.md`.
//!
//! It exports the Extended Sockets calls (`exs_*`, the same as
//! `libexs.so.1`) as well: under `LD_PRELOAD` an application's `exs_*`
//! calls bind here, and a socket switched with `SOFTRDMA_DDPMODE` moves to
//! the EXS RDMA model on its own QP ([`exs`]; `docs/exs.md`, "DDPMODE
//! sockets").

// Every export here is a C entry point whose safety contract is the C
// library call's of the same name.
#![allow(clippy::missing_safety_doc)]

mod exs;

use libc::{
    c_int, c_uint, c_ulong, c_void, epoll_event, fd_set, iovec, mmsghdr, msghdr, nfds_t, off_t,
    pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
};
use softrdma_sockets_core::hooks;

/// Runs `f`; a panic becomes `fail` with `errno` EIO.
fn boundary<T>(fail: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = libc::EIO };
            fail
        }
    }
}

macro_rules! export {
    ($( fn $name:ident($($arg:ident : $ty:ty),*) -> $ret:ty = $target:ident; )*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`, interposed.")]
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: the caller's arguments, under the C call's contract.
                boundary(-1 as $ret, || unsafe { hooks::$target($($arg),*) })
            }
        )*
    };
}

export! {
    fn socket(d: c_int, t: c_int, p: c_int) -> c_int = socket;
    fn connect(fd: c_int, a: *const sockaddr, l: socklen_t) -> c_int = connect;
    fn bind(fd: c_int, a: *const sockaddr, l: socklen_t) -> c_int = bind;
    fn listen(fd: c_int, b: c_int) -> c_int = listen;
    fn accept4(fd: c_int, a: *mut sockaddr, l: *mut socklen_t, f: c_int) -> c_int = accept4;
    fn close(fd: c_int) -> c_int = close;
    fn shutdown(fd: c_int, how: c_int) -> c_int = shutdown;
    fn read(fd: c_int, b: *mut c_void, n: size_t) -> ssize_t = read;
    fn write(fd: c_int, b: *const c_void, n: size_t) -> ssize_t = write;
    fn readv(fd: c_int, v: *const iovec, n: c_int) -> ssize_t = readv;
    fn writev(fd: c_int, v: *const iovec, n: c_int) -> ssize_t = writev;
    fn recv(fd: c_int, b: *mut c_void, n: size_t, f: c_int) -> ssize_t = recv;
    fn recvfrom(fd: c_int, b: *mut c_void, n: size_t, f: c_int, a: *mut sockaddr, l: *mut socklen_t) -> ssize_t = recvfrom;
    fn recvmsg(fd: c_int, m: *mut msghdr, f: c_int) -> ssize_t = recvmsg;
    fn recvmmsg(fd: c_int, v: *mut mmsghdr, n: c_uint, f: c_int, t: *mut timespec) -> c_int = recvmmsg;
    fn send(fd: c_int, b: *const c_void, n: size_t, f: c_int) -> ssize_t = send;
    fn sendto(fd: c_int, b: *const c_void, n: size_t, f: c_int, a: *const sockaddr, l: socklen_t) -> ssize_t = sendto;
    fn sendmsg(fd: c_int, m: *const msghdr, f: c_int) -> ssize_t = sendmsg;
    fn sendmmsg(fd: c_int, v: *mut mmsghdr, n: c_uint, f: c_int) -> c_int = sendmmsg;
    fn sendfile(o: c_int, i: c_int, off: *mut off_t, n: size_t) -> ssize_t = sendfile;
    fn sendfile64(o: c_int, i: c_int, off: *mut off_t, n: size_t) -> ssize_t = sendfile;
    fn poll(f: *mut pollfd, n: nfds_t, t: c_int) -> c_int = poll;
    fn ppoll(f: *mut pollfd, n: nfds_t, t: *const timespec, m: *const sigset_t) -> c_int = ppoll;
    fn select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, t: *mut timeval) -> c_int = select;
    fn pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, t: *const timespec, m: *const sigset_t) -> c_int = pselect;
    fn epoll_create(s: c_int) -> c_int = epoll_create;
    fn epoll_create1(f: c_int) -> c_int = epoll_create1;
    fn epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int = epoll_ctl;
    fn epoll_wait(ep: c_int, ev: *mut epoll_event, n: c_int, t: c_int) -> c_int = epoll_wait;
    fn epoll_pwait(ep: c_int, ev: *mut epoll_event, n: c_int, t: c_int, m: *const sigset_t) -> c_int = epoll_pwait;
    fn dup(fd: c_int) -> c_int = dup;
    fn dup2(a: c_int, b: c_int) -> c_int = dup2;
    fn dup3(a: c_int, b: c_int, f: c_int) -> c_int = dup3;
    fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int = fcntl;
    fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int = fcntl;
    fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int = ioctl;
    fn getsockopt(fd: c_int, l: c_int, n: c_int, v: *mut c_void, len: *mut socklen_t) -> c_int = getsockopt;
    fn setsockopt(fd: c_int, l: c_int, n: c_int, v: *const c_void, len: socklen_t) -> c_int = setsockopt;
}

/// `accept`, interposed.
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments.
    boundary(-1, || unsafe { hooks::accept4(fd, a, l, 0) })
}

extern "C" {
    fn __chk_fail() -> !;
}

/// `__read_chk` (`_FORTIFY_SOURCE`), interposed.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: glibc's fortify failure, as its own __read_chk calls.
        unsafe { __chk_fail() }
    }
    // SAFETY: the caller's arguments.
    boundary(-1, || unsafe { hooks::read(fd, b, n) })
}

/// `__recv_chk`, interposed.
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
    f: c_int,
) -> ssize_t {
    if n > buflen {
        // SAFETY: as in __read_chk.
        unsafe { __chk_fail() }
    }
    // SAFETY: the caller's arguments.
    boundary(-1, || unsafe { hooks::recv(fd, b, n, f) })
}

/// `__recvfrom_chk`, interposed.
#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    b: *mut c_void,
    n: size_t,
    buflen: size_t,
    f: c_int,
    a: *mut sockaddr,
    l: *mut socklen_t,
) -> ssize_t {
    if n > buflen {
        // SAFETY: as in __read_chk.
        unsafe { __chk_fail() }
    }
    // SAFETY: the caller's arguments.
    boundary(-1, || unsafe { hooks::recvfrom(fd, b, n, f, a, l) })
}

/// `__poll_chk`, interposed.
#[no_mangle]
pub unsafe extern "C" fn __poll_chk(f: *mut pollfd, n: nfds_t, t: c_int, fdslen: size_t) -> c_int {
    if (fdslen / std::mem::size_of::<pollfd>()) < n as usize {
        // SAFETY: as in __read_chk.
        unsafe { __chk_fail() }
    }
    // SAFETY: the caller's arguments.
    boundary(-1, || unsafe { hooks::poll(f, n, t) })
}

/// `__ppoll_chk`, interposed.
#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    f: *mut pollfd,
    n: nfds_t,
    t: *const timespec,
    m: *const sigset_t,
    fdslen: size_t,
) -> c_int {
    if (fdslen / std::mem::size_of::<pollfd>()) < n as usize {
        // SAFETY: as in __read_chk.
        unsafe { __chk_fail() }
    }
    // SAFETY: the caller's arguments.
    boundary(-1, || unsafe { hooks::ppoll(f, n, t, m) })
}

extern "C" fn load() {
    softrdma_sockets_core::init();
    exs::init();
}

/// Runs [`load`] when the library is loaded.
#[used]
#[link_section = ".init_array"]
static LOAD: extern "C" fn() = load;
