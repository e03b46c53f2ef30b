//! The C entry points of rsockets, exported as `softrdma_r*` in the
//! private version node for librdmacm.so.1's forwarders (`r*` there).
//! Each runs in the panic boundary and returns -1 with `errno` on failure,
//! as rdma-core's rsockets do.

use std::ffi::{c_int, c_void};

use crate::export::{export, guard, guard_neg, set_errno};

use super::{sockaddr_read, sockaddr_write};

fn neg(r: super::Res<()>) -> Result<i32, i32> {
    r.map(|()| 0)
}

fn ssize(r: super::Res<usize>) -> isize {
    match r {
        Ok(n) => n as isize,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `rsocket`.
pub extern "C" fn softrdma_rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    guard_neg(|| super::socket(domain, ty, protocol))
}

/// `rbind`.
///
/// # Safety
/// `addr` points to `len` readable octets.
pub unsafe extern "C" fn softrdma_rbind(
    socket: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    // SAFETY: the caller's contract.
    guard_neg(|| neg(super::bind(socket, unsafe { sockaddr_read(addr, len) }?)))
}

/// `rlisten`.
pub extern "C" fn softrdma_rlisten(socket: c_int, backlog: c_int) -> c_int {
    guard_neg(|| neg(super::listen(socket, backlog)))
}

/// `raccept`.
///
/// # Safety
/// `addr`/`len` as for accept(2) (may be null).
pub unsafe extern "C" fn softrdma_raccept(
    socket: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    guard_neg(|| {
        let (fd, peer) = super::accept(socket)?;
        // SAFETY: the caller's contract.
        unsafe { sockaddr_write(&peer, addr, len) };
        Ok(fd)
    })
}

/// `rconnect`.
///
/// # Safety
/// `addr` points to `len` readable octets.
pub unsafe extern "C" fn softrdma_rconnect(
    socket: c_int,
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    // SAFETY: the caller's contract.
    guard_neg(|| neg(super::connect(socket, unsafe { sockaddr_read(addr, len) }?)))
}

/// `rshutdown`.
pub extern "C" fn softrdma_rshutdown(socket: c_int, how: c_int) -> c_int {
    guard_neg(|| neg(super::shutdown(socket, how)))
}

/// `rclose`.
pub extern "C" fn softrdma_rclose(socket: c_int) -> c_int {
    guard_neg(|| neg(super::close(socket)))
}

/// # Safety
/// `buf` points to `len` readable octets.
unsafe fn bytes<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8], i32> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(buf as *const u8, len) })
}

/// # Safety
/// `buf` points to `len` writable octets.
unsafe fn bytes_mut<'a>(buf: *mut c_void, len: usize) -> Result<&'a mut [u8], i32> {
    if len == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) })
}

/// `rsend`.
///
/// # Safety
/// `buf` points to `len` readable octets.
pub unsafe extern "C" fn softrdma_rsend(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
) -> isize {
    guard(-1, || {
        // SAFETY: the caller's contract.
        ssize(unsafe { bytes(buf, len) }.and_then(|b| super::send(socket, b, flags)))
    })
}

/// `rrecv`.
///
/// # Safety
/// `buf` points to `len` writable octets.
pub unsafe extern "C" fn softrdma_rrecv(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
) -> isize {
    guard(-1, || {
        // SAFETY: the caller's contract.
        ssize(unsafe { bytes_mut(buf, len) }.and_then(|b| super::recv(socket, b, flags)))
    })
}

/// `rread`.
///
/// # Safety
/// As `rrecv`.
pub unsafe extern "C" fn softrdma_rread(socket: c_int, buf: *mut c_void, len: usize) -> isize {
    // SAFETY: the caller's contract.
    guard(-1, || unsafe { softrdma_rrecv(socket, buf, len, 0) })
}

/// `rwrite`.
///
/// # Safety
/// As `rsend`.
pub unsafe extern "C" fn softrdma_rwrite(socket: c_int, buf: *const c_void, len: usize) -> isize {
    // SAFETY: the caller's contract.
    guard(-1, || unsafe { softrdma_rsend(socket, buf, len, 0) })
}

/// `rrecvfrom` (a stream: the source is the peer).
///
/// # Safety
/// As `rrecv`; `src`/`len` as for recvfrom(2).
pub unsafe extern "C" fn softrdma_rrecvfrom(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut libc::sockaddr,
    srclen: *mut libc::socklen_t,
) -> isize {
    guard(-1, || {
        // SAFETY: the caller's contract.
        let n = unsafe { softrdma_rrecv(socket, buf, len, flags) };
        if n >= 0 {
            if let Ok(peer) = super::peername(socket) {
                // SAFETY: the caller's contract.
                unsafe { sockaddr_write(&peer, src, srclen) };
            }
        }
        n
    })
}

/// `rsendto` (a stream: the destination is ignored once connected, as
/// with TCP).
///
/// # Safety
/// As `rsend`.
pub unsafe extern "C" fn softrdma_rsendto(
    socket: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    _dst: *const libc::sockaddr,
    _dstlen: libc::socklen_t,
) -> isize {
    // SAFETY: the caller's contract.
    guard(-1, || unsafe { softrdma_rsend(socket, buf, len, flags) })
}

/// # Safety
/// `iov` points to `cnt` iovecs describing valid memory.
unsafe fn iovecs<'a>(iov: *const libc::iovec, cnt: c_int) -> Result<&'a [libc::iovec], i32> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

/// Gathers the iovecs through `rsend` until one is short.
///
/// # Safety
/// As `iovecs`.
unsafe fn writev(socket: c_int, iov: *const libc::iovec, cnt: c_int, flags: c_int) -> isize {
    guard(-1, || {
        // SAFETY: the caller's contract.
        let v = match unsafe { iovecs(iov, cnt) } {
            Ok(v) => v,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        };
        let mut total = 0isize;
        for e in v {
            // SAFETY: each iovec describes readable memory (caller).
            let n = unsafe { softrdma_rsend(socket, e.iov_base, e.iov_len, flags) };
            if n < 0 {
                return if total > 0 { total } else { n };
            }
            total += n;
            if (n as usize) < e.iov_len {
                break;
            }
        }
        total
    })
}

/// Scatters through `rrecv` until one is short.
///
/// # Safety
/// As `iovecs`, with writable memory.
unsafe fn readv(socket: c_int, iov: *const libc::iovec, cnt: c_int, flags: c_int) -> isize {
    guard(-1, || {
        // SAFETY: the caller's contract.
        let v = match unsafe { iovecs(iov, cnt) } {
            Ok(v) => v,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        };
        let mut total = 0isize;
        for e in v {
            // Only the first read may block.
            let f = if total > 0 {
                flags | libc::MSG_DONTWAIT
            } else {
                flags
            };
            // SAFETY: each iovec describes writable memory (caller).
            let n = unsafe { softrdma_rrecv(socket, e.iov_base, e.iov_len, f) };
            if n <= 0 {
                return if total > 0 { total } else { n };
            }
            total += n;
            if (n as usize) < e.iov_len {
                break;
            }
        }
        total
    })
}

/// `rreadv`.
///
/// # Safety
/// `iov` points to `cnt` iovecs of writable memory.
pub unsafe extern "C" fn softrdma_rreadv(
    socket: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
) -> isize {
    // SAFETY: the caller's contract.
    guard(-1, || unsafe { readv(socket, iov, cnt, 0) })
}

/// `rwritev`.
///
/// # Safety
/// `iov` points to `cnt` iovecs of readable memory.
pub unsafe extern "C" fn softrdma_rwritev(
    socket: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
) -> isize {
    // SAFETY: the caller's contract.
    guard(-1, || unsafe { writev(socket, iov, cnt, 0) })
}

/// `rsendmsg` (no ancillary data).
///
/// # Safety
/// `msg` is a valid msghdr.
pub unsafe extern "C" fn softrdma_rsendmsg(
    socket: c_int,
    msg: *const libc::msghdr,
    flags: c_int,
) -> isize {
    guard(-1, || {
        // SAFETY: the caller's contract (NULL is checked).
        let Some(m) = (unsafe { msg.as_ref() }) else {
            set_errno(libc::EFAULT);
            return -1;
        };
        if m.msg_controllen != 0 {
            set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        // SAFETY: the caller's contract.
        unsafe { writev(socket, m.msg_iov, m.msg_iovlen as c_int, flags) }
    })
}

/// `rrecvmsg` (no ancillary data).
///
/// # Safety
/// `msg` is a valid msghdr.
pub unsafe extern "C" fn softrdma_rrecvmsg(
    socket: c_int,
    msg: *mut libc::msghdr,
    flags: c_int,
) -> isize {
    guard(-1, || {
        // SAFETY: the caller's contract (NULL is checked).
        let Some(m) = (unsafe { msg.as_mut() }) else {
            set_errno(libc::EFAULT);
            return -1;
        };
        m.msg_controllen = 0;
        m.msg_flags = 0;
        // SAFETY: the caller's contract.
        unsafe { readv(socket, m.msg_iov, m.msg_iovlen as c_int, flags) }
    })
}

/// `rpoll`.
///
/// # Safety
/// `fds` points to `nfds` pollfds.
pub unsafe extern "C" fn softrdma_rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    guard_neg(|| unsafe { super::poll(fds, nfds as usize, timeout) })
}

/// `rselect`, through `rpoll`.
///
/// # Safety
/// The sets are null or valid `fd_set`s; `timeout` null or valid.
pub unsafe extern "C" fn softrdma_rselect(
    nfds: c_int,
    readfds: *mut libc::fd_set,
    writefds: *mut libc::fd_set,
    exceptfds: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    guard_neg(|| {
        if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
            return Err(libc::EINVAL);
        }
        let mut p = Vec::new();
        for fd in 0..nfds {
            let mut events = 0;
            // SAFETY: the sets are valid when non-null (caller); fd < FD_SETSIZE.
            unsafe {
                if !readfds.is_null() && libc::FD_ISSET(fd, readfds) {
                    events |= libc::POLLIN;
                }
                if !writefds.is_null() && libc::FD_ISSET(fd, writefds) {
                    events |= libc::POLLOUT;
                }
                if !exceptfds.is_null() && libc::FD_ISSET(fd, exceptfds) {
                    events |= libc::POLLPRI;
                }
            }
            if events != 0 {
                p.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
            }
        }
        let ms = if timeout.is_null() {
            -1
        } else {
            // SAFETY: non-null, valid (caller).
            let t = unsafe { *timeout };
            (t.tv_sec.max(0) * 1000 + t.tv_usec.max(0) / 1000).min(i32::MAX as i64) as i32
        };
        // SAFETY: `p` is a live array of pollfds.
        unsafe { super::poll(p.as_mut_ptr(), p.len(), ms) }?;
        let mut n = 0;
        // SAFETY: as above.
        unsafe {
            for set in [readfds, writefds, exceptfds] {
                if !set.is_null() {
                    libc::FD_ZERO(set);
                }
            }
            for q in &p {
                if !readfds.is_null()
                    && q.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
                {
                    libc::FD_SET(q.fd, readfds);
                    n += 1;
                }
                if !writefds.is_null() && q.revents & (libc::POLLOUT | libc::POLLERR) != 0 {
                    libc::FD_SET(q.fd, writefds);
                    n += 1;
                }
                if !exceptfds.is_null() && q.revents & libc::POLLPRI != 0 {
                    libc::FD_SET(q.fd, exceptfds);
                    n += 1;
                }
            }
        }
        Ok(n)
    })
}

/// `rgetpeername`.
///
/// # Safety
/// As getpeername(2).
pub unsafe extern "C" fn softrdma_rgetpeername(
    socket: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    guard_neg(|| {
        let a = super::peername(socket)?;
        // SAFETY: the caller's contract.
        unsafe { sockaddr_write(&a, addr, len) };
        Ok(0)
    })
}

/// `rgetsockname`.
///
/// # Safety
/// As getsockname(2).
pub unsafe extern "C" fn softrdma_rgetsockname(
    socket: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    guard_neg(|| {
        let a = super::sockname(socket)?;
        // SAFETY: the caller's contract.
        unsafe { sockaddr_write(&a, addr, len) };
        Ok(0)
    })
}

/// `rsetsockopt` (`int`-sized options).
///
/// # Safety
/// `val` points to `len` readable octets.
pub unsafe extern "C" fn softrdma_rsetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    guard_neg(|| {
        let v = if !val.is_null() && len as usize >= std::mem::size_of::<c_int>() {
            // SAFETY: at least an int is readable (checked, caller).
            Some(unsafe { std::ptr::read_unaligned(val as *const c_int) })
        } else if !val.is_null() && len == 1 {
            // SAFETY: one octet is readable (caller).
            Some(c_int::from(unsafe { *(val as *const u8) }))
        } else {
            None
        };
        neg(super::setsockopt(socket, level, name, v))
    })
}

/// `rgetsockopt` (`int`-sized options, and `TCP_INFO`).
///
/// # Safety
/// `val` points to `*len` writable octets.
pub unsafe extern "C" fn softrdma_rgetsockopt(
    socket: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    guard_neg(|| {
        if val.is_null() || len.is_null() {
            return Err(libc::EFAULT);
        }
        if level == libc::IPPROTO_TCP && name == libc::TCP_INFO {
            let ti = super::tcp_info(socket)?;
            // SAFETY: `len` is valid (caller).
            let room = unsafe { *len } as usize;
            let n = room.min(std::mem::size_of::<libc::tcp_info>());
            // SAFETY: `val` has `room` writable octets (caller), `n` <= room.
            unsafe {
                std::ptr::copy_nonoverlapping(&ti as *const _ as *const u8, val as *mut u8, n);
                *len = n as libc::socklen_t;
            }
            return Ok(0);
        }
        let v = super::getsockopt(socket, level, name)?;
        // SAFETY: `len` is valid (caller).
        let room = unsafe { *len } as usize;
        if room < std::mem::size_of::<c_int>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: room for an int (checked, caller); unaligned write.
        unsafe {
            std::ptr::write_unaligned(val as *mut c_int, v);
            *len = std::mem::size_of::<c_int>() as libc::socklen_t;
        }
        Ok(0)
    })
}

/// `rfcntl(socket, cmd, ...)`: the variadic argument is read as one
/// integer (on x86_64 a variadic integer travels like a fixed one).
pub extern "C" fn softrdma_rfcntl(socket: c_int, cmd: c_int, arg: libc::c_long) -> c_int {
    guard_neg(|| super::fcntl(socket, cmd, arg))
}

/// `riomap`.
///
/// # Safety
/// `buf..buf+len` stays valid until `riounmap` or `rclose`.
pub unsafe extern "C" fn softrdma_riomap(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    guard(-1, || {
        // SAFETY: the caller's contract.
        match unsafe { super::iomap(socket, buf as *mut u8, len, prot, offset) } {
            Ok(o) => o as libc::off_t,
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

/// `riounmap`.
pub extern "C" fn softrdma_riounmap(socket: c_int, buf: *mut c_void, _len: usize) -> c_int {
    guard_neg(|| neg(super::iounmap(socket, buf as *mut u8)))
}

/// `riowrite`: octets queued, or `(size_t)-1` with `errno`.
///
/// # Safety
/// `buf` points to `count` readable octets.
pub unsafe extern "C" fn softrdma_riowrite(
    socket: c_int,
    buf: *const c_void,
    count: usize,
    offset: libc::off_t,
    flags: c_int,
) -> usize {
    guard(usize::MAX, || {
        // SAFETY: the caller's contract.
        let r = unsafe { bytes(buf, count) }.and_then(|b| {
            if offset < 0 {
                return Err(libc::EINVAL);
            }
            super::iowrite(socket, b, offset as u64, flags)
        });
        match r {
            Ok(n) => n,
            Err(e) => {
                set_errno(e);
                usize::MAX
            }
        }
    })
}

export!(
    softrdma_rsocket,
    softrdma_rbind,
    softrdma_rlisten,
    softrdma_raccept,
    softrdma_rconnect,
    softrdma_rshutdown,
    softrdma_rclose,
    softrdma_rsend,
    softrdma_rrecv,
    softrdma_rread,
    softrdma_rwrite,
    softrdma_rrecvfrom,
    softrdma_rsendto,
    softrdma_rreadv,
    softrdma_rwritev,
    softrdma_rsendmsg,
    softrdma_rrecvmsg,
    softrdma_rpoll,
    softrdma_rselect,
    softrdma_rgetpeername,
    softrdma_rgetsockname,
    softrdma_rsetsockopt,
    softrdma_rgetsockopt,
    softrdma_rfcntl,
    softrdma_riomap,
    softrdma_riounmap,
    softrdma_riowrite,
);
