//! Thin safe wrappers over the few Linux calls std does not offer: eventfd,
//! epoll, TCP writes that never raise SIGPIPE ([`NoSigPipe`]), and TCP
//! connects with the congestion control chosen before the SYN
//! ([`nb_connect`], [`connect_timeout`]). Every `unsafe` block here is a
//! single FFI call on a file descriptor this module owns or borrows for
//! the call (or fills a socket address for one).

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The writing side of a TCP stream that never raises SIGPIPE: `sendmsg`
/// with `MSG_NOSIGNAL`. Every TCP write of the engine goes through it. A
/// library must not kill its host when a peer closes: a C program has no
/// Rust runtime that set SIGPIPE to ignored, so a plain `write`/`writev`
/// on a connection the peer reset would terminate it. A closed peer is
/// `EPIPE` (`ErrorKind::BrokenPipe`) instead.
pub(crate) struct NoSigPipe<'a>(pub &'a std::net::TcpStream);

impl io::Write for NoSigPipe<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send_flat(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // One piece needs no msghdr. A small FPDU (header, payload,
        // trailer) is gathered here and sent as one piece too: the kernel's
        // per-io-vector work costs more than copying a few hundred octets
        // (rc_pathcost `tcpv`: ~100 ns per message less on loopback).
        if let [one] = bufs {
            return self.send_flat(one);
        }
        if bufs.len() > 1 {
            let mut flat = [0u8; GATHER_MAX];
            if let Some(one) = gather(bufs, &mut flat) {
                return self.send_flat(one);
            }
        }
        // SAFETY: all-zero is a valid msghdr.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is guaranteed ABI-compatible with iovec on Unix.
        h.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        h.msg_iovlen = bufs.len().min(1024) as _;
        loop {
            // The system call directly: libc's wrapper is a thread
            // cancellation point and brackets every call with switching
            // asynchronous cancellation on and off, which nothing here uses.
            // SAFETY: `h` points at the caller's io-vectors, which borrow live memory for the whole call; the descriptor is the borrowed stream's.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_sendmsg,
                    self.0.as_raw_fd(),
                    &h as *const libc::msghdr,
                    libc::MSG_NOSIGNAL,
                )
            };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            if !interrupted(&e) {
                return Err(e);
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Octets up to which a vectored send of a few small pieces (an FPDU's or
/// a datagram's header, payload and trailer) is gathered into one buffer
/// and sent as one piece ([`gather`]).
pub(crate) const GATHER_MAX: usize = 512;

/// Copies `bufs` back to back into `flat` if they fit: the gathered
/// octets, or `None` when they are more than [`GATHER_MAX`].
pub(crate) fn gather<'a>(
    bufs: &[io::IoSlice<'_>],
    flat: &'a mut [u8; GATHER_MAX],
) -> Option<&'a [u8]> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    if total > GATHER_MAX {
        return None;
    }
    let mut at = 0;
    for b in bufs {
        flat[at..at + b.len()].copy_from_slice(b);
        at += b.len();
    }
    Some(&flat[..total])
}

impl NoSigPipe<'_> {
    fn send_flat(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            // SAFETY: `buf` is live for the call; the descriptor is the borrowed stream's; no address is passed.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_sendto,
                    self.0.as_raw_fd(),
                    buf.as_ptr(),
                    buf.len(),
                    libc::MSG_NOSIGNAL,
                    std::ptr::null::<libc::sockaddr>(),
                    0 as libc::socklen_t,
                )
            };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            if !interrupted(&e) {
                return Err(e);
            }
        }
    }
}

/// Sets the TCP congestion control algorithm of socket `fd`
/// (`TCP_CONGESTION`). `ENOENT`: the kernel has no such algorithm;
/// `EPERM`: this process may not choose it.
pub(crate) fn set_tcp_congestion(fd: RawFd, name: &str) -> io::Result<()> {
    // SAFETY: `name` is live for the call, its length passed with it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr() as *const libc::c_void,
            name.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The TCP congestion control algorithm of socket `fd`
/// (`TCP_CONGESTION`).
pub(crate) fn tcp_congestion(fd: RawFd) -> io::Result<String> {
    let mut name = [0u8; 16];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: `name` and `len` are live; `len` states `name`'s size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = (len as usize).min(name.len());
    let end = name[..len].iter().position(|&b| b == 0).unwrap_or(len);
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// A new, unconnected, non-blocking TCP socket of address family `domain`.
fn tcp_socket(domain: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Checks that the kernel lets this process give its TCP sockets
/// congestion control `name`, on a socket made for the purpose; the error
/// says what is allowed.
pub(crate) fn probe_tcp_congestion(name: &str) -> io::Result<()> {
    let sock = tcp_socket(libc::AF_INET)?;
    set_tcp_congestion(sock.as_raw_fd(), name).map_err(|e| {
        let list = |what: &str| {
            std::fs::read_to_string(format!("/proc/sys/net/ipv4/tcp_{what}_congestion_control"))
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into())
        };
        // The allowed list is what an unprivileged process may set; with
        // CAP_NET_ADMIN any loaded algorithm is allowed, so both are named.
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "SOFTRDMA_TCP_CONGESTION={name}: the kernel refuses it ({e}); \
                 allowed to this process: {}; loaded (any of them with CAP_NET_ADMIN): {}",
                list("allowed"),
                list("available")
            ),
        )
    })
}

/// `addr` as the kernel takes it: a sockaddr_storage and its length.
pub fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero octets are a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `ss` is our local sockaddr_storage, larger and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// A TCP socket bound to `addr` with `SO_REUSEADDR`, not listening: it
/// holds the port (port 0: one the kernel chooses) against other programs,
/// while a listener of ours with `SO_REUSEADDR` may still bind it.
pub(crate) fn bound_tcp_socket(addr: SocketAddr) -> io::Result<TcpListener> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let sock = tcp_socket(domain)?;
    crate::udp::set_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    let (ss, len) = sockaddr_of(addr);
    // SAFETY: `ss` holds a sockaddr of `len` octets of the socket's family.
    if unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&ss as *const libc::sockaddr_storage).cast(),
            len,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    // Never listened on: the std type only serves `local_addr`.
    Ok(TcpListener::from(sock))
}

/// A TCP socket connecting to `addr` without blocking (`EINPROGRESS`),
/// with congestion control `cc` set before its SYN (so the system's
/// default is never initialised on it: bbr, once initialised, leaves the
/// kernel's pacing on after a switch).
pub(crate) fn nb_connect(addr: SocketAddr, cc: Option<&str>) -> io::Result<TcpStream> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let sock = TcpStream::from(tcp_socket(domain)?);
    let fd = sock.as_raw_fd();
    if let Some(cc) = cc {
        set_tcp_congestion(fd, cc)?;
    }
    let (ss, len) = sockaddr_of(addr);
    // SAFETY: `ss` holds a sockaddr of `len` octets of `fd`'s family.
    let r = unsafe { libc::connect(fd, (&ss as *const libc::sockaddr_storage).cast(), len) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    Ok(sock)
}

/// `TcpStream::connect_timeout` with congestion control `cc` set before
/// the SYN ([`nb_connect`]); the stream is blocking, as std's is.
pub(crate) fn connect_timeout(
    addr: &SocketAddr,
    timeout: std::time::Duration,
    cc: Option<&str>,
) -> io::Result<TcpStream> {
    let Some(cc) = cc else {
        return TcpStream::connect_timeout(addr, timeout);
    };
    let sock = nb_connect(*addr, Some(cc))?;
    let end = std::time::Instant::now() + timeout;
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection timed out",
            ));
        }
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one live pollfd for the call.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if interrupted(&e) {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            continue;
        }
        // Connected, or failed: SO_ERROR says which.
        if let Some(e) = sock.take_error()? {
            return Err(e);
        }
        sock.set_nonblocking(false)?;
        return Ok(sock);
    }
}

/// `poll` for `POLLOUT` on `fd` without waiting: false only if the
/// kernel says the socket has no room (see [`crate::tcp_has_room`]); a
/// failed `poll`, an error or a hang-up read as room.
pub(crate) fn has_room(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one live pollfd; a zero timeout never blocks.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r != 0
}

/// True for `EAGAIN`/`EWOULDBLOCK`: a non-blocking call found nothing. A
/// comparison of the raw code, not [`io::Error::kind`] (an out-of-line
/// decoding of every errno that every empty busy poll would pay).
#[inline]
pub(crate) fn would_block(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EAGAIN)
}

/// True for `EINTR` (as [`would_block`], without decoding the kind).
#[inline]
pub(crate) fn interrupted(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINTR)
}

/// `recv` on a socket with the system call directly (not libc's wrapper,
/// a thread cancellation point that costs every busy poll two extra
/// calls into the C library). Retries on `EINTR`.
pub(crate) fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: the kernel writes at most `buf.len()` octets into the live `buf`; no address is asked for.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvfrom,
                fd,
                buf.as_mut_ptr(),
                buf.len(),
                0,
                std::ptr::null_mut::<libc::sockaddr>(),
                std::ptr::null_mut::<libc::socklen_t>(),
            )
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if !interrupted(&e) {
            return Err(e);
        }
    }
}

/// `readv` into `bufs` with the system call directly (see [`recv`]).
/// Retries on `EINTR`.
pub(crate) fn readv(fd: RawFd, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
    loop {
        // SAFETY: IoSliceMut is ABI-compatible with iovec on Unix; each points at live memory the kernel writes at most its length of.
        let r = unsafe {
            libc::syscall(
                libc::SYS_readv,
                fd,
                bufs.as_mut_ptr() as *mut libc::iovec,
                bufs.len().min(1024) as libc::c_int,
            )
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if !interrupted(&e) {
            return Err(e);
        }
    }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A non-blocking eventfd: the pollable "something happened" counter behind
/// completion channels and event channels.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new eventfd (non-blocking, close-on-exec).
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; the result is checked.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        Ok(EventFd {
            // SAFETY: `fd` is a fresh descriptor nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Adds one to the counter (wakes pollers).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 octets from a live u64 to our own descriptor. A full counter (EAGAIN) still leaves the fd readable: ignore.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }

    /// Reads and clears the counter; 0 if nothing was pending.
    pub fn drain(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 octets into a live u64 from our own descriptor.
        let r = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                &mut v as *mut u64 as *mut libc::c_void,
                8,
            )
        };
        if r == 8 {
            v
        } else {
            0
        }
    }

    /// Blocks until the counter is non-zero (or `timeout` passes; `None`
    /// waits for ever), then clears it. Returns false on timeout.
    pub fn wait(&self, timeout: Option<std::time::Duration>) -> bool {
        loop {
            match self.wait_interruptible(timeout) {
                Ok(got) => return got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }

    /// Like [`EventFd::wait`], but a signal delivered while waiting ends
    /// the wait with an [`io::ErrorKind::Interrupted`] error (as a blocking
    /// `read(2)` on the descriptor would for a handler installed without
    /// `SA_RESTART`). `Ok(false)` on timeout.
    pub fn wait_interruptible(&self, timeout: Option<std::time::Duration>) -> io::Result<bool> {
        let ms = timeout
            .map(|d| d.as_millis().min(i32::MAX as u128) as i32)
            .unwrap_or(-1);
        loop {
            if self.drain() > 0 {
                return Ok(true);
            }
            let mut p = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            let r = unsafe { libc::poll(&mut p, 1, ms) };
            if r == 0 {
                return Ok(false);
            }
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Readiness interest for [`Epoll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
}

/// A level-triggered epoll instance.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Epoll {
    /// A new epoll instance.
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: no pointers; result checked.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Epoll {
            // SAFETY: fresh descriptor.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, i: Interest) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (if i.read {
                libc::EPOLLIN | libc::EPOLLRDHUP
            } else {
                0
            } | if i.write { libc::EPOLLOUT } else { 0 }) as u32,
            u64: token,
        };
        // SAFETY: `ev` is a live epoll_event; `fd` is the caller's open fd.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) }).map(|_| ())
    }

    /// Starts watching `fd`.
    pub fn add(&self, fd: RawFd, token: u64, i: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, i)
    }

    /// Changes the interest of `fd`.
    pub fn modify(&self, fd: RawFd, token: u64, i: Interest) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, i)
    }

    /// Stops watching `fd`.
    pub fn delete(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: as in `ctl`; failure (fd already gone) is harmless.
        let _ = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    /// Waits for events; fills `out` with (token, readable, writable,
    /// hangup). Returns the count.
    pub fn wait(&self, out: &mut [(u64, bool, bool, bool)], timeout_ms: i32) -> io::Result<usize> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        let max = out.len().min(evs.len()) as libc::c_int;
        // SAFETY: `evs` has room for `max` entries.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), evs.as_mut_ptr(), max, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e);
        }
        for (o, e) in out.iter_mut().zip(&evs[..n as usize]) {
            let f = e.events as libc::c_int;
            *o = (
                e.u64,
                f & libc::EPOLLIN != 0,
                f & libc::EPOLLOUT != 0,
                f & (libc::EPOLLHUP | libc::EPOLLERR | libc::EPOLLRDHUP) != 0,
            );
        }
        Ok(n as usize)
    }
}
