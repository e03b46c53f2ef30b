//! The C library's own functions, found with `dlsym(RTLD_NEXT, …)` the
//! first time they are needed: what every interposed call forwards to
//! when the socket is not softrdma's, and what softrdma's own code calls.

use libc::{
    c_int, c_uint, c_ulong, c_void, epoll_event, fd_set, iovec, mmsghdr, msghdr, nfds_t, off_t,
    pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
};
use std::sync::OnceLock;

macro_rules! real_table {
    ($( $name:ident : fn($($arg:ty),*) -> $ret:ty; )*) => {
        /// Pointers to the C library's functions.
        #[allow(missing_docs)]
        pub struct Real {
            $( pub $name: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        fn load() -> Real {
            Real {
                $( $name: {
                    let name = concat!(stringify!($name), "\0");
                    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT
                    // finds the next definition after this library.
                    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const libc::c_char) };
                    if p.is_null() {
                        // A libc without it: abort with a message rather
                        // than call a null pointer later.
                        let msg = concat!("softrdma-sockets: the C library has no ", stringify!($name), "\n");
                        // SAFETY: writing a static message to stderr.
                        unsafe { libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len()) };
                        std::process::abort();
                    }
                    // SAFETY: the symbol is the C library's function of
                    // this C signature.
                    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
                }, )*
            }
        }
    };
}

real_table! {
    socket: fn(c_int, c_int, c_int) -> c_int;
    connect: fn(c_int, *const sockaddr, socklen_t) -> c_int;
    bind: fn(c_int, *const sockaddr, socklen_t) -> c_int;
    listen: fn(c_int, c_int) -> c_int;
    accept: fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
    accept4: fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
    close: fn(c_int) -> c_int;
    shutdown: fn(c_int, c_int) -> c_int;
    read: fn(c_int, *mut c_void, size_t) -> ssize_t;
    write: fn(c_int, *const c_void, size_t) -> ssize_t;
    readv: fn(c_int, *const iovec, c_int) -> ssize_t;
    writev: fn(c_int, *const iovec, c_int) -> ssize_t;
    recv: fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
    recvfrom: fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t;
    recvmsg: fn(c_int, *mut msghdr, c_int) -> ssize_t;
    recvmmsg: fn(c_int, *mut mmsghdr, c_uint, c_int, *mut timespec) -> c_int;
    send: fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
    sendto: fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t;
    sendmsg: fn(c_int, *const msghdr, c_int) -> ssize_t;
    sendmmsg: fn(c_int, *mut mmsghdr, c_uint, c_int) -> c_int;
    sendfile: fn(c_int, c_int, *mut off_t, size_t) -> ssize_t;
    sendfile64: fn(c_int, c_int, *mut off_t, size_t) -> ssize_t;
    poll: fn(*mut pollfd, nfds_t, c_int) -> c_int;
    ppoll: fn(*mut pollfd, nfds_t, *const timespec, *const sigset_t) -> c_int;
    select: fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *mut timeval) -> c_int;
    pselect: fn(c_int, *mut fd_set, *mut fd_set, *mut fd_set, *const timespec, *const sigset_t) -> c_int;
    epoll_create: fn(c_int) -> c_int;
    epoll_create1: fn(c_int) -> c_int;
    epoll_ctl: fn(c_int, c_int, c_int, *mut epoll_event) -> c_int;
    epoll_wait: fn(c_int, *mut epoll_event, c_int, c_int) -> c_int;
    epoll_pwait: fn(c_int, *mut epoll_event, c_int, c_int, *const sigset_t) -> c_int;
    dup: fn(c_int) -> c_int;
    dup2: fn(c_int, c_int) -> c_int;
    dup3: fn(c_int, c_int, c_int) -> c_int;
    fcntl: fn(c_int, c_int, c_ulong) -> c_int;
    ioctl: fn(c_int, c_ulong, c_ulong) -> c_int;
    getsockopt: fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
    setsockopt: fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
    fork: fn() -> libc::pid_t;
}

/// The table (loaded on first use).
pub fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(load)
}
