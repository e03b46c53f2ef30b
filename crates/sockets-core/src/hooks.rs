//! One function per interposed C call, with the C call's signature and
//! contract. `crates/sockets` exports them under the C names.
//!
//! Each starts the same way: with softrdma's guard already up (softrdma's
//! own code calling), or on a descriptor softrdma does not carry, it is
//! the C library's call and nothing else. Only then does it look further.

use std::net::SocketAddr;
use std::sync::Arc;

use libc::{
    c_int, c_uint, c_ulong, c_void, epoll_event, fd_set, iovec, mmsghdr, msghdr, nfds_t, off_t,
    pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
};

use crate::guard;
use crate::real::real;
use crate::sock::{Dgram, Out, Sock};
use crate::stat::Kind;
use crate::table::{self, Obj};
use crate::wait::{self, EpollSet};

fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// The carried socket of `fd` (not a plain one).
fn carried(fd: c_int) -> Option<Arc<Sock>> {
    table::sock_if(fd, |s| !s.is_pass())
}

/// The socket of `fd` if a send on it may be softrdma's: a carried
/// stream, or any datagram socket (its destination decides).
fn sending(fd: c_int) -> Option<Arc<Sock>> {
    table::sock_if(fd, |s| s.kind == Kind::Dgram || !s.is_pass())
}

fn sigpipe(flags: c_int) {
    if flags & libc::MSG_NOSIGNAL == 0 {
        // SAFETY: raising SIGPIPE as the kernel would on this thread.
        unsafe { libc::raise(libc::SIGPIPE) };
    }
}

fn finish(r: Result<usize, c_int>, flags: c_int, send: bool) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            if send && e == libc::EPIPE {
                sigpipe(flags);
            }
            set_errno(e);
            -1
        }
    }
}

/// # Safety
/// Each `iovec` describes writable memory.
unsafe fn iov_mut<'a>(iov: *const iovec, n: c_int) -> Vec<&'a mut [u8]> {
    if iov.is_null() || n <= 0 {
        return Vec::new();
    }
    // SAFETY: the caller's iovec array of `n` entries.
    let v = unsafe { std::slice::from_raw_parts(iov, n as usize) };
    v.iter()
        .filter(|e| e.iov_len > 0 && !e.iov_base.is_null())
        // SAFETY: each entry is the caller's writable buffer.
        .map(|e| unsafe { std::slice::from_raw_parts_mut(e.iov_base as *mut u8, e.iov_len) })
        .collect()
}

/// # Safety
/// Each `iovec` describes readable memory.
unsafe fn iov_ref<'a>(iov: *const iovec, n: c_int) -> Vec<&'a [u8]> {
    if iov.is_null() || n <= 0 {
        return Vec::new();
    }
    // SAFETY: the caller's iovec array of `n` entries.
    let v = unsafe { std::slice::from_raw_parts(iov, n as usize) };
    v.iter()
        .filter(|e| e.iov_len > 0 && !e.iov_base.is_null())
        // SAFETY: each entry is the caller's readable buffer.
        .map(|e| unsafe { std::slice::from_raw_parts(e.iov_base as *const u8, e.iov_len) })
        .collect()
}

/// `socket(2)`.
pub unsafe fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    let fd = unsafe { (real().socket)(domain, ty, proto) };
    let Some(_g) = guard::enter() else { return fd };
    if fd >= 0 && crate::policy::enabled() {
        let nonblock = ty & libc::SOCK_NONBLOCK != 0;
        let inet = domain == libc::AF_INET || domain == libc::AF_INET6;
        if inet && ty & 0xf == libc::SOCK_STREAM && (proto == 0 || proto == libc::IPPROTO_TCP) {
            table::set(fd, Obj::Sock(Sock::new(fd, domain, nonblock)));
        } else if inet && ty & 0xf == libc::SOCK_DGRAM && (proto == 0 || proto == libc::IPPROTO_UDP)
        {
            let s = Sock::with_kind(fd, domain, nonblock, crate::stat::Kind::Dgram);
            table::set(fd, Obj::Sock(s));
        }
    }
    fd
}

/// `connect(2)`.
pub unsafe fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let g = guard::enter();
    match (g, table::sock(fd)) {
        // SAFETY: the caller's address.
        (Some(_g), Some(s)) if s.kind == Kind::Dgram => unsafe { s.connect_dgram(fd, addr, len) },
        // SAFETY: the caller's address.
        (Some(_g), Some(s)) => unsafe { s.connect(fd, addr, len) },
        // SAFETY: forwarding the caller's arguments.
        _ => unsafe { (real().connect)(fd, addr, len) },
    }
}

/// `bind(2)`: a datagram socket softrdma watches gets its UD QP once
/// bound.
pub unsafe fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { (real().bind)(fd, addr, len) };
    if r == 0 {
        if let (Some(_g), Some(s)) = (guard::enter(), table::sock(fd)) {
            s.after_bind(fd);
        }
    }
    r
}

/// The datagram socket of `fd`, plain or not.
fn dgram(fd: c_int) -> Option<Arc<Sock>> {
    table::sock(fd).filter(|s| s.kind == Kind::Dgram)
}

/// Sends through a datagram socket: `Some` if softrdma carried it.
fn dgram_send(
    fd: c_int,
    bufs: Vec<&[u8]>,
    flags: c_int,
    dest: Option<SocketAddr>,
) -> Option<ssize_t> {
    let s = dgram(fd)?;
    match s.send_dgram(fd, &bufs, flags, dest) {
        Out::Pass => None,
        Out::Done(r) => Some(finish(r, flags, true)),
    }
}

/// Receives from a datagram socket softrdma took: `Some` if it did.
fn dgram_recv(fd: c_int, mut bufs: Vec<&mut [u8]>, flags: c_int) -> Option<Result<Dgram, c_int>> {
    let s = table::sock_if(fd, |s| s.kind == Kind::Dgram && !s.is_pass())?;
    match s.recv_dgram(fd, &mut bufs, flags) {
        Out::Pass => None,
        Out::Done(r) => Some(r),
    }
}

/// Writes `src` into the caller's address buffer as `recvfrom` does
/// (truncated to its length; the length set to the full one).
///
/// # Safety
/// `addr` is null or `*alen` writable octets; `alen` is null or valid.
unsafe fn put_addr(src: SocketAddr, family: c_int, addr: *mut sockaddr, alen: *mut socklen_t) {
    if addr.is_null() || alen.is_null() {
        return;
    }
    // An IPv6 socket reports IPv4 peers as IPv4-mapped addresses.
    let src = match src {
        SocketAddr::V4(a) if family == libc::AF_INET6 => {
            SocketAddr::new(std::net::IpAddr::V6(a.ip().to_ipv6_mapped()), a.port())
        }
        a => a,
    };
    let (ss, sl) = crate::addr::to_sockaddr(&src);
    // SAFETY: at most `*alen` octets into the caller's buffer.
    unsafe {
        let n = (*alen as usize).min(sl as usize);
        std::ptr::copy_nonoverlapping(&ss as *const _ as *const u8, addr as *mut u8, n);
        *alen = sl;
    }
}

/// The result of a datagram receive as the C call returns it.
fn dgram_result(r: Result<Dgram, c_int>, flags: c_int) -> ssize_t {
    match r {
        Ok(d) if flags & libc::MSG_TRUNC != 0 => d.len as ssize_t,
        Ok(d) => d.copied as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `listen(2)`.
pub unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    let g = guard::enter();
    match (g, table::sock(fd)) {
        (Some(_g), Some(s)) => s.listen(fd, backlog),
        // SAFETY: forwarding the caller's arguments.
        _ => unsafe { (real().listen)(fd, backlog) },
    }
}

/// `accept4(2)` (and `accept` with no flags).
pub unsafe fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    let g = guard::enter();
    match (g, table::sock(fd)) {
        (Some(_g), Some(s)) => {
            // SAFETY: the caller's address buffer.
            let (nfd, ns) = unsafe { s.accept(fd, addr, len, flags) };
            if let Some(ns) = ns {
                if !table::set(nfd, Obj::Sock(ns)) {
                    // Beyond the table: the connection is the kernel's.
                }
            }
            nfd
        }
        // SAFETY: forwarding the caller's arguments.
        _ => unsafe { (real().accept4)(fd, addr, len, flags) },
    }
}

/// `close(2)`.
pub unsafe fn close(fd: c_int) -> c_int {
    if let Some(_g) = guard::enter() {
        if let Some(obj) = table::take(fd) {
            match &*obj {
                Obj::Sock(s) => s.close_fd(),
                Obj::Epoll(e) => e.close_fd(),
            }
        }
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { (real().close)(fd) }
}

/// `shutdown(2)`.
pub unsafe fn shutdown(fd: c_int, how: c_int) -> c_int {
    let g = guard::enter();
    if let (Some(_g), Some(s)) = (g, carried(fd)) {
        match s.shutdown(fd, how) {
            Out::Done(Ok(())) => return 0,
            Out::Done(Err(e)) => {
                set_errno(e);
                return -1;
            }
            Out::Pass => {}
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().shutdown)(fd, how) }
}

fn do_recv(s: &Sock, fd: c_int, mut bufs: Vec<&mut [u8]>, flags: c_int) -> Option<ssize_t> {
    match s.recv(fd, &mut bufs, flags) {
        Out::Pass => None,
        Out::Done(r) => Some(finish(r, flags, false)),
    }
}

fn do_send(s: &Sock, fd: c_int, bufs: Vec<&[u8]>, flags: c_int) -> Option<ssize_t> {
    match s.send(fd, &bufs, flags) {
        Out::Pass => None,
        Out::Done(r) => Some(finish(r, flags, true)),
    }
}

/// `read(2)`.
pub unsafe fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    let g = guard::enter();
    if let (Some(_g), Some(s)) = (g, carried(fd)) {
        let b: Vec<&mut [u8]> = if n == 0 || buf.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller's buffer of `n` octets.
            vec![unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, n) }]
        };
        if s.kind == Kind::Dgram {
            if let Some(r) = dgram_recv(fd, b, 0) {
                return dgram_result(r, 0);
            }
            // SAFETY: forwarding the caller's arguments.
            return unsafe { (real().read)(fd, buf, n) };
        }
        if let Some(r) = do_recv(&s, fd, b, 0) {
            return r;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().read)(fd, buf, n) }
}

/// `write(2)`.
pub unsafe fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    let g = guard::enter();
    if let (Some(_g), Some(s)) = (g, sending(fd)) {
        let b: Vec<&[u8]> = if n == 0 || buf.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller's buffer of `n` octets.
            vec![unsafe { std::slice::from_raw_parts(buf as *const u8, n) }]
        };
        if s.kind == Kind::Dgram {
            if let Some(r) = dgram_send(fd, b, 0, None) {
                return r;
            }
            // SAFETY: forwarding the caller's arguments.
            return unsafe { (real().write)(fd, buf, n) };
        }
        if s.is_pass() {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { (real().write)(fd, buf, n) };
        }
        if let Some(r) = do_send(&s, fd, b, 0) {
            return r;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().write)(fd, buf, n) }
}

/// `readv(2)`.
pub unsafe fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    let g = guard::enter();
    if let (Some(_g), Some(s)) = (g, carried(fd)) {
        if s.kind == Kind::Dgram {
            // SAFETY: the caller's iovecs.
            if let Some(r) = dgram_recv(fd, unsafe { iov_mut(iov, cnt) }, 0) {
                return dgram_result(r, 0);
            }
            // SAFETY: forwarding the caller's arguments.
            return unsafe { (real().readv)(fd, iov, cnt) };
        }
        // SAFETY: the caller's iovecs.
        if let Some(r) = do_recv(&s, fd, unsafe { iov_mut(iov, cnt) }, 0) {
            return r;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().readv)(fd, iov, cnt) }
}

/// `writev(2)`.
pub unsafe fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    let g = guard::enter();
    if let (Some(_g), Some(s)) = (g, sending(fd)) {
        if s.kind == Kind::Dgram {
            // SAFETY: the caller's iovecs.
            if let Some(r) = dgram_send(fd, unsafe { iov_ref(iov, cnt) }, 0, None) {
                return r;
            }
            // SAFETY: forwarding the caller's arguments.
            return unsafe { (real().writev)(fd, iov, cnt) };
        }
        if s.is_pass() {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { (real().writev)(fd, iov, cnt) };
        }
        // SAFETY: the caller's iovecs.
        if let Some(r) = do_send(&s, fd, unsafe { iov_ref(iov, cnt) }, 0) {
            return r;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().writev)(fd, iov, cnt) }
}

/// `recv(2)`.
pub unsafe fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: same contract.
    unsafe {
        recvfrom(
            fd,
            buf,
            n,
            flags,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
}

/// `recvfrom(2)`. A stream socket has no source address to report.
pub unsafe fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    let g = guard::enter();
    if let (Some(_g), Some(s)) = (g, carried(fd)) {
        let b: Vec<&mut [u8]> = if n == 0 || buf.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller's buffer of `n` octets.
            vec![unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, n) }]
        };
        if s.kind == Kind::Dgram {
            if let Some(r) = dgram_recv(fd, b, flags) {
                if let Ok(d) = &r {
                    // SAFETY: the caller's address buffer.
                    unsafe { put_addr(d.src, s.family, addr, alen) };
                }
                return dgram_result(r, flags);
            }
        } else if let Some(r) = do_recv(&s, fd, b, flags) {
            return r;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().recvfrom)(fd, buf, n, flags, addr, alen) }
}

/// `recvmsg(2)`: no ancillary data on a carried stream.
pub unsafe fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let g = guard::enter();
    if let (Some(_g), Some(s), false) = (g, carried(fd), msg.is_null()) {
        // SAFETY: the caller's msghdr.
        let m = unsafe { &mut *msg };
        // SAFETY: its iovecs.
        let bufs = unsafe { iov_mut(m.msg_iov, m.msg_iovlen as c_int) };
        if s.kind == Kind::Dgram {
            if let Some(r) = dgram_recv(fd, bufs, flags) {
                m.msg_controllen = 0;
                m.msg_flags = 0;
                if let Ok(d) = &r {
                    if d.len > d.copied {
                        m.msg_flags |= libc::MSG_TRUNC;
                    }
                    let mut l = m.msg_namelen;
                    // SAFETY: the caller's name buffer of `msg_namelen` octets.
                    unsafe { put_addr(d.src, s.family, m.msg_name as *mut sockaddr, &mut l) };
                    m.msg_namelen = l;
                }
                return dgram_result(r, flags);
            }
            // SAFETY: forwarding the caller's arguments.
            return unsafe { (real().recvmsg)(fd, msg, flags) };
        }
        if let Some(r) = do_recv(&s, fd, bufs, flags) {
            m.msg_controllen = 0;
            m.msg_flags = 0;
            m.msg_namelen = 0;
            return r;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().recvmsg)(fd, msg, flags) }
}

/// `recvmmsg(2)`: one stream read per message.
pub unsafe fn recvmmsg(
    fd: c_int,
    v: *mut mmsghdr,
    vlen: c_uint,
    flags: c_int,
    t: *mut timespec,
) -> c_int {
    let g = guard::enter();
    if let (Some(_g), Some(s), false) = (g, carried(fd), v.is_null()) {
        drop(_g);
        let mut done = 0;
        for i in 0..vlen as usize {
            let f = if i == 0 {
                flags
            } else {
                flags | libc::MSG_DONTWAIT
            };
            // SAFETY: the caller's array of `vlen` entries.
            let r = unsafe { recvmsg(fd, &mut (*v.add(i)).msg_hdr, f & !libc::MSG_WAITFORONE) };
            if r < 0 {
                return if done > 0 { done } else { -1 };
            }
            // SAFETY: as above.
            unsafe { (*v.add(i)).msg_len = r as c_uint };
            done += 1;
            if r == 0 {
                break;
            }
        }
        let _ = s;
        return done;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().recvmmsg)(fd, v, vlen, flags, t) }
}

/// `send(2)`.
pub unsafe fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: same contract.
    unsafe { sendto(fd, buf, n, flags, std::ptr::null(), 0) }
}

/// `sendto(2)`: on a connected stream the address is ignored, as Linux
/// does.
pub unsafe fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    let g = guard::enter();
    if let (Some(_g), Some(s)) = (g, sending(fd)) {
        let b: Vec<&[u8]> = if n == 0 || buf.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller's buffer of `n` octets.
            vec![unsafe { std::slice::from_raw_parts(buf as *const u8, n) }]
        };
        if s.kind == Kind::Dgram {
            // SAFETY: the caller's address.
            let dest = unsafe { crate::addr::from_sockaddr(addr, alen) };
            if let Some(r) = dgram_send(fd, b, flags, dest) {
                return r;
            }
        } else if !s.is_pass() {
            if let Some(r) = do_send(&s, fd, b, flags) {
                return r;
            }
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().sendto)(fd, buf, n, flags, addr, alen) }
}

/// `sendmsg(2)`: the gather list goes out as one write; ancillary data
/// is refused (`EOPNOTSUPP`) on a carried stream.
pub unsafe fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let g = guard::enter();
    if let (Some(_g), Some(s), false) = (g, sending(fd), msg.is_null()) {
        // SAFETY: the caller's msghdr.
        let m = unsafe { &*msg };
        if s.kind == Kind::Dgram {
            if m.msg_controllen == 0 || m.msg_control.is_null() {
                // SAFETY: its iovecs and name.
                let bufs = unsafe { iov_ref(m.msg_iov, m.msg_iovlen as c_int) };
                // SAFETY: the caller's name buffer.
                let dest = unsafe {
                    crate::addr::from_sockaddr(m.msg_name as *const sockaddr, m.msg_namelen)
                };
                if let Some(r) = dgram_send(fd, bufs, flags, dest) {
                    return r;
                }
            }
            // SAFETY: forwarding the caller's arguments.
            return unsafe { (real().sendmsg)(fd, msg, flags) };
        }
        if s.is_pass() {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { (real().sendmsg)(fd, msg, flags) };
        }
        if m.msg_controllen > 0 && !m.msg_control.is_null() {
            set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        // SAFETY: its iovecs.
        let bufs = unsafe { iov_ref(m.msg_iov, m.msg_iovlen as c_int) };
        if let Some(r) = do_send(&s, fd, bufs, flags) {
            return r;
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().sendmsg)(fd, msg, flags) }
}

/// `sendmmsg(2)`: one stream write per message.
pub unsafe fn sendmmsg(fd: c_int, v: *mut mmsghdr, vlen: c_uint, flags: c_int) -> c_int {
    let g = guard::enter();
    let ours = sending(fd);
    if let (Some(_g), Some(_s), false) = (g, ours, v.is_null()) {
        drop(_g);
        let mut done = 0;
        for i in 0..vlen as usize {
            // SAFETY: the caller's array of `vlen` entries.
            let r = unsafe { sendmsg(fd, &(*v.add(i)).msg_hdr, flags) };
            if r < 0 {
                return if done > 0 { done } else { -1 };
            }
            // SAFETY: as above.
            unsafe { (*v.add(i)).msg_len = r as c_uint };
            done += 1;
        }
        return done;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().sendmmsg)(fd, v, vlen, flags) }
}

/// `sendfile(2)` (and `sendfile64`): a carried destination gets the file
/// through a buffer.
pub unsafe fn sendfile(out_fd: c_int, in_fd: c_int, offset: *mut off_t, count: size_t) -> ssize_t {
    let g = guard::enter();
    if let (Some(_g), Some(s)) = (g, carried(out_fd)) {
        let mut buf = vec![0u8; 256 * 1024];
        let mut done = 0usize;
        while done < count {
            let want = (count - done).min(buf.len());
            // SAFETY: reading the caller's file into our buffer.
            let n = unsafe {
                if offset.is_null() {
                    (real().read)(in_fd, buf.as_mut_ptr() as *mut c_void, want)
                } else {
                    libc::pread(in_fd, buf.as_mut_ptr() as *mut c_void, want, *offset)
                }
            };
            if n < 0 {
                return if done > 0 { done as ssize_t } else { -1 };
            }
            if n == 0 {
                break;
            }
            let n = n as usize;
            let r = match s.send(out_fd, &[&buf[..n]], 0) {
                Out::Done(r) => r,
                Out::Pass => {
                    // The socket turned plain mid-call: the kernel takes the rest.
                    let mut left = &buf[..n];
                    let mut r = Ok(0);
                    while !left.is_empty() {
                        // SAFETY: writing our buffer to the caller's socket.
                        let w = unsafe {
                            (real().write)(out_fd, left.as_ptr() as *const c_void, left.len())
                        };
                        if w < 0 {
                            r = Err(std::io::Error::last_os_error()
                                .raw_os_error()
                                .unwrap_or(libc::EIO));
                            break;
                        }
                        left = &left[w as usize..];
                    }
                    r.map(|_| n - left.len())
                }
            };
            let sent = match r {
                Ok(k) => k,
                Err(e) => {
                    if done > 0 {
                        break;
                    }
                    return finish(Err(e), 0, true);
                }
            };
            // SAFETY: the caller's offset, or its file's own.
            unsafe {
                if offset.is_null() {
                    if sent < n {
                        libc::lseek(in_fd, sent as off_t - n as off_t, libc::SEEK_CUR);
                    }
                } else {
                    *offset += sent as off_t;
                }
            }
            done += sent;
            if sent < n {
                break;
            }
        }
        return done as ssize_t;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().sendfile)(out_fd, in_fd, offset, count) }
}

/// `poll(2)`.
pub unsafe fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    let g = guard::enter();
    if let (Some(_g), false) = (g, fds.is_null() || n == 0) {
        // SAFETY: the caller's array.
        let v = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        // SAFETY: the kernel's poll on an array we pass.
        let block = |a: &mut [pollfd], t: c_int| unsafe {
            (real().poll)(a.as_mut_ptr(), a.len() as nfds_t, t)
        };
        return wait::poll(v, timeout, &block);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().poll)(fds, n, timeout) }
}

fn ts_ms(t: *const timespec) -> c_int {
    if t.is_null() {
        return -1;
    }
    // SAFETY: the caller's timespec.
    let t = unsafe { *t };
    let ms = (t.tv_sec as i128) * 1000
        + (t.tv_nsec as i128).div_euclid(1_000_000)
        + i128::from(t.tv_nsec % 1_000_000 != 0);
    ms.clamp(0, i32::MAX as i128) as c_int
}

/// `ppoll(2)`.
pub unsafe fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    t: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    let g = guard::enter();
    if let (Some(_g), false) = (g, fds.is_null() || n == 0) {
        // SAFETY: the caller's array.
        let v = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        let block = |a: &mut [pollfd], ms: c_int| {
            let ts = timespec {
                tv_sec: (ms / 1000) as libc::time_t,
                tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
            };
            let tp = if ms < 0 {
                std::ptr::null()
            } else {
                &ts as *const timespec
            };
            // SAFETY: the kernel's ppoll with the caller's signal mask.
            unsafe { (real().ppoll)(a.as_mut_ptr(), a.len() as nfds_t, tp, mask) }
        };
        return wait::poll(v, ts_ms(t), &block);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().ppoll)(fds, n, t, mask) }
}

/// `select(2)`.
pub unsafe fn select(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    t: *mut timeval,
) -> c_int {
    let g = guard::enter();
    // SAFETY: the caller's sets.
    if let (Some(_g), true) = (g, unsafe { wait::select_needed(nfds, r, w, e) }) {
        let ms = if t.is_null() {
            -1
        } else {
            // SAFETY: the caller's timeval.
            let tv = unsafe { *t };
            (tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000).clamp(0, i32::MAX as i64) as c_int
        };
        // SAFETY: the kernel's poll on an array we pass.
        let block = |a: &mut [pollfd], ms: c_int| unsafe {
            (real().poll)(a.as_mut_ptr(), a.len() as nfds_t, ms)
        };
        // SAFETY: the caller's sets.
        return unsafe { wait::select(nfds, r, w, e, ms, &block) };
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().select)(nfds, r, w, e, t) }
}

/// `pselect(2)`.
pub unsafe fn pselect(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    t: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    let g = guard::enter();
    // SAFETY: the caller's sets.
    if let (Some(_g), true) = (g, unsafe { wait::select_needed(nfds, r, w, e) }) {
        let block = |a: &mut [pollfd], ms: c_int| {
            let ts = timespec {
                tv_sec: (ms / 1000) as libc::time_t,
                tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
            };
            let tp = if ms < 0 {
                std::ptr::null()
            } else {
                &ts as *const timespec
            };
            // SAFETY: the kernel's ppoll with the caller's signal mask.
            unsafe { (real().ppoll)(a.as_mut_ptr(), a.len() as nfds_t, tp, mask) }
        };
        // SAFETY: the caller's sets.
        return unsafe { wait::select(nfds, r, w, e, ts_ms(t), &block) };
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().pselect)(nfds, r, w, e, t, mask) }
}

fn track_epoll(fd: c_int) -> c_int {
    if fd >= 0 {
        if let Some(_g) = guard::enter() {
            table::set(fd, Obj::Epoll(Arc::new(EpollSet::new(fd))));
        }
    }
    fd
}

/// `epoll_create(2)`.
pub unsafe fn epoll_create(size: c_int) -> c_int {
    // SAFETY: forwarding the caller's argument.
    track_epoll(unsafe { (real().epoll_create)(size) })
}

/// `epoll_create1(2)`.
pub unsafe fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: forwarding the caller's argument.
    track_epoll(unsafe { (real().epoll_create1)(flags) })
}

/// `epoll_ctl(2)`.
pub unsafe fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int {
    let g = guard::enter();
    if let (Some(_g), Some(set)) = (g, table::epoll(epfd)) {
        // SAFETY: the caller's event (or null).
        if let Some(r) = unsafe { set.ctl(op, fd, ev) } {
            return r;
        }
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { (real().epoll_ctl)(epfd, op, fd, ev) };
        if r == 0 {
            if let Some(s) = table::sock(fd) {
                let (events, data) = if ev.is_null() {
                    (0, 0)
                } else {
                    // SAFETY: the caller's event, non-null.
                    let e = unsafe { std::ptr::read_unaligned(ev) };
                    (e.events, e.u64)
                };
                s.note_kernel_epoll(epfd, op, events, data);
            }
        }
        return r;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().epoll_ctl)(epfd, op, fd, ev) }
}

/// `epoll_wait(2)`.
pub unsafe fn epoll_wait(epfd: c_int, ev: *mut epoll_event, max: c_int, t: c_int) -> c_int {
    // SAFETY: same contract.
    unsafe { epoll_pwait(epfd, ev, max, t, std::ptr::null()) }
}

/// `epoll_pwait(2)`.
pub unsafe fn epoll_pwait(
    epfd: c_int,
    ev: *mut epoll_event,
    max: c_int,
    t: c_int,
    mask: *const sigset_t,
) -> c_int {
    let g = guard::enter();
    if let (Some(_g), Some(set)) = (g, table::epoll(epfd)) {
        // SAFETY: the caller's array and mask.
        return unsafe { set.wait(ev, max, t, mask) };
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe {
        if mask.is_null() {
            (real().epoll_wait)(epfd, ev, max, t)
        } else {
            (real().epoll_pwait)(epfd, ev, max, t, mask)
        }
    }
}

/// After a successful duplication `old` → `new`: `new` names the same
/// socket.
fn dup_track(old: c_int, new: c_int) {
    if new < 0 || old == new {
        return;
    }
    if let Some(obj) = table::get(old) {
        match &*obj {
            Obj::Sock(s) => s.add_fd(),
            Obj::Epoll(e) => e.add_fd(),
        }
        table::set_arc(new, obj);
    }
}

fn drop_target(new: c_int) {
    if let Some(obj) = table::take(new) {
        match &*obj {
            Obj::Sock(s) => s.close_fd(),
            Obj::Epoll(e) => e.close_fd(),
        }
    }
}

/// `dup(2)`.
pub unsafe fn dup(fd: c_int) -> c_int {
    // SAFETY: forwarding the caller's argument.
    let n = unsafe { (real().dup)(fd) };
    if let Some(_g) = guard::enter() {
        dup_track(fd, n);
    }
    n
}

/// `dup2(2)`.
pub unsafe fn dup2(old: c_int, new: c_int) -> c_int {
    let g = guard::enter();
    if g.is_some() && old != new {
        drop_target(new);
    }
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { (real().dup2)(old, new) };
    if g.is_some() && r >= 0 {
        dup_track(old, r);
    }
    r
}

/// `dup3(2)`.
pub unsafe fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let g = guard::enter();
    if g.is_some() && old != new {
        drop_target(new);
    }
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { (real().dup3)(old, new, flags) };
    if g.is_some() && r >= 0 {
        dup_track(old, r);
    }
    r
}

/// `fcntl(2)` (and `fcntl64`): duplications are tracked; a carried
/// socket's `O_NONBLOCK` is the application's own view (softrdma keeps
/// the shared kernel socket non-blocking under it).
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    let g = guard::enter();
    let Some(_g) = g else {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { (real().fcntl)(fd, cmd, arg) };
    };
    let s = table::sock(fd);
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: forwarding the caller's arguments.
            let n = unsafe { (real().fcntl)(fd, cmd, arg) };
            dup_track(fd, n);
            n
        }
        libc::F_GETFL => {
            // SAFETY: forwarding the caller's arguments.
            let r = unsafe { (real().fcntl)(fd, cmd, arg) };
            match s {
                Some(s) if r >= 0 && s.flags_shadowed() => {
                    (r & !libc::O_NONBLOCK) | if s.nonblocking() { libc::O_NONBLOCK } else { 0 }
                }
                _ => r,
            }
        }
        libc::F_SETFL => match s {
            Some(s) => {
                s.set_nonblocking(arg as c_int & libc::O_NONBLOCK != 0);
                let arg = if s.flags_shadowed() {
                    arg | libc::O_NONBLOCK as c_ulong
                } else {
                    arg
                };
                // SAFETY: the caller's flags (non-blocking kept for softrdma).
                unsafe { (real().fcntl)(fd, cmd, arg) }
            }
            // SAFETY: forwarding the caller's arguments.
            None => unsafe { (real().fcntl)(fd, cmd, arg) },
        },
        // SAFETY: forwarding the caller's arguments.
        _ => unsafe { (real().fcntl)(fd, cmd, arg) },
    }
}

/// `ioctl(2)`: `FIONBIO` sets the application's `O_NONBLOCK` view of a
/// socket; `FIONREAD` of a carried socket counts softrdma's buffered
/// octets.
pub unsafe fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    let g = guard::enter();
    if let (Some(_g), Some(s)) = (g, table::sock(fd)) {
        match req {
            libc::FIONBIO if arg != 0 => {
                // SAFETY: FIONBIO's argument is an int pointer.
                let on = unsafe { *(arg as *const c_int) } != 0;
                s.set_nonblocking(on);
                if s.flags_shadowed() {
                    return 0;
                }
            }
            libc::FIONREAD if arg != 0 && !s.is_pass() => {
                if let Some(n) = s.readable_bytes(fd) {
                    // SAFETY: FIONREAD's argument is an int pointer.
                    unsafe { *(arg as *mut c_int) = n.min(i32::MAX as usize) as c_int };
                    return 0;
                }
            }
            _ => {}
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().ioctl)(fd, req, arg) }
}

/// `getsockopt(2)`: `SO_ERROR` of a connection softrdma lost reports why.
pub unsafe fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if level == SOL_SOFTRDMA {
        if let Some(_g) = guard::enter() {
            let Some(s) = table::sock(fd) else {
                set_errno(libc::ENOPROTOOPT);
                return -1;
            };
            return match name {
                SOFTRDMA_DDPMODE => put_int(val, len, s.ddpmode()),
                SOFTRDMA_TRANSPORT => put_int(val, len, s.transport().as_int()),
                SOFTRDMA_RECORDS => {
                    let (a, b, c) = s.record_counts();
                    put_u64s(val, len, &[a, b, c])
                }
                _ => {
                    set_errno(libc::ENOPROTOOPT);
                    -1
                }
            };
        }
    }
    let g = guard::enter();
    if let (Some(_g), Some(s)) = (g, carried(fd)) {
        if level == libc::SOL_SOCKET && name == libc::SO_ERROR && !val.is_null() && !len.is_null() {
            // SAFETY: the caller's buffer and length.
            unsafe {
                if (*len as usize) >= std::mem::size_of::<c_int>() {
                    if let Some(e) = s.pending_error() {
                        *(val as *mut c_int) = e;
                        *len = std::mem::size_of::<c_int>() as socklen_t;
                        return 0;
                    }
                }
            }
        }
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { (real().getsockopt)(fd, level, name, val, len) }
}

/// `SOL_SOFTRDMA` (`softrdma/sockets.h`): softrdma's own socket options.
pub const SOL_SOFTRDMA: c_int = 0x5352;
/// `SOFTRDMA_DDPMODE`: set 1 to switch a connected socket to DDP; read:
/// 1 while the socket's bytes go over RC.
pub const SOFTRDMA_DDPMODE: c_int = 1;
/// `SOFTRDMA_TRANSPORT`: what carries the socket
/// ([`SOFTRDMA_TRANSPORT_KERNEL`] ... [`SOFTRDMA_TRANSPORT_WR`]); set on
/// a UDP socket before softrdma takes it, it chooses its QP's transport.
pub const SOFTRDMA_TRANSPORT: c_int = 2;
/// `SOFTRDMA_TRANSPORT` value: the kernel.
pub const SOFTRDMA_TRANSPORT_KERNEL: c_int = 0;
/// `SOFTRDMA_TRANSPORT` value: an RC queue pair (TCP sockets).
pub const SOFTRDMA_TRANSPORT_RC: c_int = 1;
/// `SOFTRDMA_TRANSPORT` value: a UD queue pair (UDP sockets).
pub const SOFTRDMA_TRANSPORT_UD: c_int = 2;
/// `SOFTRDMA_TRANSPORT` value: an RD (reliable datagram) queue pair (UDP
/// sockets).
pub const SOFTRDMA_TRANSPORT_RD: c_int = 3;
/// `SOFTRDMA_TRANSPORT` value: a UD queue pair whose datagrams are RDMA
/// Write-Records (UDP sockets; partial delivery under loss).
pub const SOFTRDMA_TRANSPORT_WR: c_int = 4;
/// `SOFTRDMA_RECORDS` (read only): three `uint64_t`, the socket's
/// datagrams sent as Write-Records, received as Write-Records, and of
/// those delivered partly.
pub const SOFTRDMA_RECORDS: c_int = 3;

fn put_u64s(val: *mut c_void, len: *mut socklen_t, v: &[u64]) -> c_int {
    let n = std::mem::size_of_val(v);
    if val.is_null() || len.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller's buffer of `*len` octets, checked non-null.
    unsafe {
        if (*len as usize) < n {
            set_errno(libc::EINVAL);
            return -1;
        }
        std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, val as *mut u8, n);
        *len = n as socklen_t;
    }
    0
}

fn put_int(val: *mut c_void, len: *mut socklen_t, v: c_int) -> c_int {
    if val.is_null() || len.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller's buffer and length, checked non-null.
    unsafe {
        if (*len as usize) < std::mem::size_of::<c_int>() {
            set_errno(libc::EINVAL);
            return -1;
        }
        std::ptr::write_unaligned(val as *mut c_int, v);
        *len = std::mem::size_of::<c_int>() as socklen_t;
    }
    0
}

/// `setsockopt(2)`: every option reaches the kernel socket; softrdma
/// notes the ones it honours itself (`SO_RCVLOWAT`, `SO_RCVTIMEO`,
/// `SO_SNDTIMEO`). `SOL_SOFTRDMA` options are softrdma's alone.
pub unsafe fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if level == SOL_SOFTRDMA {
        if let Some(_g) = guard::enter() {
            let Some(s) = table::sock(fd) else {
                set_errno(libc::ENOPROTOOPT);
                return -1;
            };
            if name != SOFTRDMA_DDPMODE && name != SOFTRDMA_TRANSPORT {
                set_errno(libc::ENOPROTOOPT);
                return -1;
            }
            if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
                set_errno(libc::EINVAL);
                return -1;
            }
            if name == SOFTRDMA_TRANSPORT {
                // SAFETY: the caller's int, checked non-null and long enough.
                let v = unsafe { std::ptr::read_unaligned(val as *const c_int) };
                let r = match crate::udp::SockTransport::from_int(v) {
                    Some(t) => s.set_transport(t),
                    None => Err(libc::EINVAL),
                };
                return match r {
                    Ok(()) => 0,
                    Err(e) => {
                        set_errno(e);
                        -1
                    }
                };
            }
            // SAFETY: the caller's int, checked non-null and long enough.
            let on = unsafe { std::ptr::read_unaligned(val as *const c_int) } != 0;
            if !on {
                // Back to the kernel mid-stream is not offered.
                set_errno(if s.ddpmode() != 0 {
                    libc::EOPNOTSUPP
                } else {
                    0
                });
                return if s.ddpmode() != 0 { -1 } else { 0 };
            }
            return match s.set_ddpmode(fd) {
                Ok(()) => 0,
                Err(e) => {
                    set_errno(e);
                    -1
                }
            };
        }
    }
    // SAFETY: forwarding the caller's arguments.
    let r = unsafe { (real().setsockopt)(fd, level, name, val, len) };
    if r == 0 && !val.is_null() {
        if let (Some(_g), Some(s)) = (guard::enter(), table::sock(fd)) {
            // SAFETY: the caller's option value of `len` octets.
            let v = unsafe { std::slice::from_raw_parts(val as *const u8, len as usize) };
            // `ip_mreq` and `ip_mreqn` both start with the group address.
            if level == libc::IPPROTO_IP
                && (name == libc::IP_ADD_MEMBERSHIP || name == libc::IP_DROP_MEMBERSHIP)
                && v.len() >= 8
            {
                let group = std::net::Ipv4Addr::new(v[0], v[1], v[2], v[3]);
                s.mcast_membership(fd, group, name == libc::IP_ADD_MEMBERSHIP);
            }
            s.note_option(level, name, v);
        }
    }
    r
}
