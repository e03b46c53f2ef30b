//! The calls of `sys/exs.h`, argument checking included, returning
//! `Result<_, Errno>`; `crates/exs` turns them into C returns and errno.
//!
//! Every pointer the call reads or keeps is checked first: NULL (with a
//! length) is EFAULT, and so is memory that is not mapped (`mincore`;
//! `exs_qdequeue`'s event array and timeout once per thread while they
//! stay where they were, so the hot loop pays no system call for them).
//! Buffers of data transfers are not probed: the kernel reads and writes
//! them in send/recv, so bad ones end as an event with EFAULT.

use std::time::Duration;

use libc::{c_int, c_short, c_void, size_t, sockaddr, socklen_t, timespec};

use crate::abi::*;
use crate::dgram;
use crate::engine::{engine, poll_events_ok, Dir, Elem, Kind, RECV_FLAGS, SEND_FLAGS};
use crate::rdma;
use crate::sys;
use crate::Errno;

type R<T> = Result<T, Errno>;

fn mapped<T>(p: *const T, n: usize) -> R<()> {
    let bytes = std::mem::size_of::<T>()
        .checked_mul(n)
        .ok_or(libc::EINVAL)?;
    if p.is_null() || !sys::mapped(p as usize, bytes) {
        return Err(libc::EFAULT);
    }
    Ok(())
}

/// [`mapped`] for arguments a thread passes again and again (the event
/// array and timeout of `exs_qdequeue`): the last two ranges found mapped
/// in this thread are trusted without asking the kernel again.
fn mapped_again<T>(p: *const T, n: usize) -> R<()> {
    use std::cell::Cell;
    thread_local! {
        static SEEN: Cell<[(usize, usize); 2]> = const { Cell::new([(0, 0); 2]) };
    }
    let start = p as usize;
    let end = std::mem::size_of::<T>()
        .checked_mul(n)
        .and_then(|b| start.checked_add(b))
        .ok_or(libc::EINVAL)?;
    let seen = SEEN.with(Cell::get);
    if start != 0 && seen.iter().any(|&(a, b)| a <= start && end <= b) {
        return Ok(());
    }
    mapped(p, n)?;
    SEEN.with(|c| c.set([(start, end), seen[0]]));
    Ok(())
}

fn buf_ok(buf: usize, len: usize) -> R<()> {
    if buf == 0 && len > 0 {
        return Err(libc::EFAULT);
    }
    if buf.checked_add(len).is_none() || len > isize::MAX as usize {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// `exs_init`.
pub fn init(version: c_int) -> R<()> {
    if version != EXS_VERSION1 {
        return Err(libc::EINVAL);
    }
    engine().map(|_| ())
}

/// `exs_qcreate`.
pub fn qcreate(depth: c_int) -> R<c_int> {
    engine()?.qcreate(depth)
}

/// `exs_qdelete`.
pub fn qdelete(qh: c_int) -> R<()> {
    engine()?.qdelete(qh)
}

fn duration(t: &timespec) -> R<Duration> {
    if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
        return Err(libc::EINVAL);
    }
    Ok(Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
}

/// `exs_qdequeue`.
///
/// # Safety
/// `events` has room for |n| events; `timeout` is NULL or a timespec.
pub unsafe fn qdequeue(
    qh: c_int,
    events: *mut exs_event_t,
    n: c_int,
    timeout: *const timespec,
) -> R<c_int> {
    let q = engine()?.queue(qh)?;
    if n == 0 {
        return Ok(0);
    }
    let want = n.unsigned_abs() as usize;
    if want > EXS_EVTVEC_MAX as usize {
        return Err(libc::EINVAL);
    }
    mapped_again(events as *const exs_event_t, want)?;
    let limit = if timeout.is_null() {
        None
    } else {
        mapped_again(timeout, 1)?;
        // SAFETY: checked mapped; the caller's timespec.
        Some(duration(unsafe { &*timeout })?)
    };
    // SAFETY: the caller's array of |n| events, checked mapped; every bit
    // pattern is a valid exs_event_t (integers, pointers and their union).
    let out = unsafe { std::slice::from_raw_parts_mut(events, want) };
    q.dequeue(out, n < 0, limit).map(|k| k as c_int)
}

/// `exs_qgetattr`.
///
/// # Safety
/// `value` points to the attribute's type (int or exs_signal_t).
pub unsafe fn qgetattr(qh: c_int, attr: c_int, value: *mut c_void) -> R<()> {
    let q = engine()?.queue(qh)?;
    let g = q.lock();
    match attr {
        EXS_QATTR_DEPTH | EXS_QATTR_EVENTS | EXS_QATTR_WAIT => {
            mapped(value as *const c_int, 1)?;
            let v = match attr {
                EXS_QATTR_DEPTH => g.depth as c_int,
                EXS_QATTR_EVENTS => g.events.len() as c_int,
                _ => g.wait,
            };
            // SAFETY: checked mapped, an int by the attribute's type.
            unsafe { (value as *mut c_int).write_unaligned(v) };
        }
        EXS_QATTR_SIGNAL => {
            mapped(value as *const exs_signal_t, 1)?;
            let v = match g.signal {
                Some(s) => exs_signal_t {
                    exs_sig_mode: EXS_SIG_ENABLE,
                    exs_sig_signo: s,
                },
                None => exs_signal_t {
                    exs_sig_mode: EXS_SIG_DISABLE,
                    exs_sig_signo: 0,
                },
            };
            // SAFETY: checked mapped, an exs_signal_t by the attribute's type.
            unsafe { (value as *mut exs_signal_t).write_unaligned(v) };
        }
        _ => return Err(libc::EINVAL),
    }
    Ok(())
}

/// `exs_qsetattr`.
///
/// # Safety
/// `value` points to the attribute's type (int or exs_signal_t).
pub unsafe fn qsetattr(qh: c_int, attr: c_int, value: *const c_void) -> R<()> {
    let q = engine()?.queue(qh)?;
    let mut g = q.lock();
    match attr {
        EXS_QATTR_DEPTH | EXS_QATTR_WAIT => {
            mapped(value as *const c_int, 1)?;
            // SAFETY: checked mapped, an int.
            let v = unsafe { (value as *const c_int).read_unaligned() };
            if attr == EXS_QATTR_WAIT {
                if !(EXS_WAIT_NOTIFY..=EXS_WAIT_BUSY_POLL).contains(&v) {
                    return Err(libc::EINVAL);
                }
                g.wait = v;
            } else {
                if !(1..=EXS_EVTVEC_MAX).contains(&v) {
                    return Err(libc::EINVAL);
                }
                if (v as usize) < g.reserved {
                    return Err(libc::EBUSY);
                }
                g.depth = v as usize;
            }
        }
        EXS_QATTR_SIGNAL => {
            mapped(value as *const exs_signal_t, 1)?;
            // SAFETY: checked mapped, an exs_signal_t.
            let v = unsafe { (value as *const exs_signal_t).read_unaligned() };
            match v.exs_sig_mode {
                EXS_SIG_DISABLE => g.signal = None,
                EXS_SIG_ENABLE if (1..=libc::SIGRTMAX()).contains(&v.exs_sig_signo) => {
                    g.signal = Some(v.exs_sig_signo)
                }
                _ => return Err(libc::EINVAL),
            }
        }
        _ => return Err(libc::EINVAL),
    }
    Ok(())
}

/// `exs_mregister`.
pub fn mregister(addr: *const c_void, len: size_t, flags: c_int) -> R<c_int> {
    if addr.is_null() {
        return Err(libc::EFAULT);
    }
    engine()?.mregister(addr as usize, len, flags)
}

/// `exs_mderegister`.
pub fn mderegister(mh: c_int) -> R<()> {
    engine()?.mderegister(mh)
}

fn send_flags(flags: c_int) -> R<()> {
    if flags & (EXS_PERSISTENT | EXS_PERSISTENT_NOTIFY) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if flags & !SEND_FLAGS != 0 {
        return Err(libc::EINVAL);
    }
    Ok(())
}

fn recv_flags(flags: c_int) -> R<()> {
    if flags & (EXS_PERSISTENT | EXS_PERSISTENT_NOTIFY) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if flags & !RECV_FLAGS != 0 {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// `exs_send`.
pub fn send(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    qh: c_int,
    ah: *mut c_void,
    mh: c_int,
) -> R<()> {
    // A DDPMODE socket under the sockets interposer moves to the RDMA model.
    crate::ddp::route(fd)?;
    if dgram::owns(fd) {
        let q = engine()?.queue(qh)?;
        let iov = [(mh, buf as usize, len)];
        return dgram::xfer(false, fd, &iov, flags, q, ah as usize, None, None);
    }
    if rdma::owns(fd) {
        let q = engine()?.queue(qh)?;
        return rdma::xfer(
            false,
            fd,
            buf as usize,
            len,
            flags,
            q,
            ah as usize,
            mh,
            None,
        );
    }
    send_flags(flags)?;
    let b = buf as usize;
    buf_ok(b, len)?;
    let kind = Kind::Send { buf: b, len, flags };
    engine()?.submit(fd, qh, ah as usize, &[(mh, b, len)], Dir::Send, kind)
}

/// `exs_recv`.
pub fn recv(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    qh: c_int,
    ah: *mut c_void,
    mh: c_int,
) -> R<()> {
    // A DDPMODE socket under the sockets interposer moves to the RDMA model.
    crate::ddp::route(fd)?;
    if dgram::owns(fd) {
        let q = engine()?.queue(qh)?;
        let iov = [(mh, buf as usize, len)];
        return dgram::xfer(true, fd, &iov, flags, q, ah as usize, None, None);
    }
    if rdma::owns(fd) {
        let q = engine()?.queue(qh)?;
        return rdma::xfer(true, fd, buf as usize, len, flags, q, ah as usize, mh, None);
    }
    recv_flags(flags)?;
    let b = buf as usize;
    buf_ok(b, len)?;
    let kind = Kind::Recv { buf: b, len, flags };
    engine()?.submit(fd, qh, ah as usize, &[(mh, b, len)], Dir::Recv, kind)
}

/// `exs_sendmsg` (`recv` false) and `exs_recvmsg` (`recv` true).
///
/// # Safety
/// `msg` is NULL or an `exs_msghdr_t` whose vector has `msg_iovlen`
/// entries; for a receive it stays valid until the event.
pub unsafe fn msg(
    recv: bool,
    fd: c_int,
    msg: *mut exs_msghdr_t,
    flags: c_int,
    qh: c_int,
    ah: *mut c_void,
) -> R<()> {
    // A DDPMODE socket under the sockets interposer moves to the RDMA model.
    crate::ddp::route(fd)?;
    let rd = rdma::owns(fd);
    if dgram::owns(fd) || rd {
        // The datagram and RDMA models check their own flags.
    } else if recv {
        recv_flags(flags)?;
    } else {
        send_flags(flags)?;
    }
    mapped(msg as *const exs_msghdr_t, 1)?;
    // SAFETY: checked mapped.
    let m = unsafe { msg.read_unaligned() };
    if m.msg_iovlen < 0 || m.msg_iovlen > EXS_IOV_MAX {
        return Err(libc::EINVAL);
    }
    let n = m.msg_iovlen as usize;
    let mut iov = Vec::with_capacity(n);
    let mut ranges = Vec::with_capacity(n);
    if n > 0 {
        mapped(m.msg_iov as *const exs_iovec_t, n)?;
        let mut total: usize = 0;
        for i in 0..n {
            // SAFETY: checked mapped, n entries.
            let v = unsafe { m.msg_iov.add(i).read_unaligned() };
            let b = v.iov_base as usize;
            buf_ok(b, v.iov_len)?;
            total = total.checked_add(v.iov_len).ok_or(libc::EINVAL)?;
            iov.push((b, v.iov_len));
            ranges.push((v.iov_mhandle, b, v.iov_len));
        }
        if total > isize::MAX as usize {
            return Err(libc::EINVAL);
        }
    }
    buf_ok(m.msg_name as usize, m.msg_namelen as usize)?;
    buf_ok(m.msg_control as usize, m.msg_controllen as usize)?;
    if rd {
        // A connection: msg_name and msg_control are not used.
        let q = engine()?.queue(qh)?;
        return rdma::xfer_msg(recv, fd, &ranges, msg as usize, flags, q, ah as usize);
    }
    if dgram::owns(fd) {
        let q = engine()?.queue(qh)?;
        if recv && !m.msg_name.is_null() {
            mapped(m.msg_name as *const u8, m.msg_namelen as usize)?;
        }
        let name = (m.msg_name as usize, m.msg_namelen);
        return dgram::xfer(
            recv,
            fd,
            &ranges,
            flags,
            q,
            ah as usize,
            Some(msg as usize),
            Some(name),
        );
    }
    let kind = Kind::Msg {
        recv,
        user: msg as usize,
        iov,
        name: (m.msg_name as usize, m.msg_namelen),
        control: (m.msg_control as usize, m.msg_controllen as usize),
        flags,
        out: (0, 0, 0),
    };
    let dir = if recv { Dir::Recv } else { Dir::Send };
    engine()?.submit(fd, qh, ah as usize, &ranges, dir, kind)
}

/// `exs_sendfile`.
///
/// # Safety
/// `vec` is NULL or has `count` elements.
pub unsafe fn sendfile(
    fd: c_int,
    vec: *const exs_xferfile_t,
    count: c_int,
    flags: c_int,
    qh: c_int,
    ah: *mut c_void,
) -> R<()> {
    if dgram::owns(fd) {
        return Err(libc::EOPNOTSUPP);
    }
    if flags != 0 || count <= 0 || count > EXS_IOV_MAX {
        return Err(libc::EINVAL);
    }
    mapped(vec, count as usize)?;
    let mut elems = Vec::with_capacity(count as usize);
    let mut ranges = Vec::new();
    for i in 0..count as usize {
        // SAFETY: checked mapped, count elements.
        let x = unsafe { vec.add(i).read_unaligned() };
        match x.xf_type {
            EXS_IOVEC => {
                // SAFETY: the member xf_type names.
                let v = unsafe { x.xf_u.xf_iov };
                let b = v.iov_base as usize;
                buf_ok(b, v.iov_len)?;
                ranges.push((v.iov_mhandle, b, v.iov_len));
                elems.push(Elem::Mem(b, v.iov_len));
            }
            EXS_FDVEC => {
                // SAFETY: the member xf_type names.
                let v = unsafe { x.xf_u.xf_fdv };
                if !sys::is_open(v.fdv_fd) {
                    return Err(libc::EBADF);
                }
                if v.fdv_offset < 0
                    || (v.fdv_offset as u64)
                        .checked_add(v.fdv_len as u64)
                        .is_none()
                {
                    return Err(libc::EINVAL);
                }
                elems.push(Elem::File {
                    fd: v.fdv_fd,
                    off: v.fdv_offset,
                    len: v.fdv_len,
                });
            }
            _ => return Err(libc::EINVAL),
        }
    }
    if rdma::owns(fd) {
        let q = engine()?.queue(qh)?;
        return rdma::sendfile(fd, &elems, &ranges, vec as usize, count, q, ah as usize);
    }
    let kind = Kind::SendFile {
        user: vec as usize,
        count,
        elems,
        idx: 0,
        off: 0,
        stage: Vec::new(),
        stage_pos: 0,
    };
    engine()?.submit(fd, qh, ah as usize, &ranges, Dir::Send, kind)
}

/// `exs_connect`.
pub fn connect(
    fd: c_int,
    addr: *const sockaddr,
    len: socklen_t,
    qh: c_int,
    ah: *mut c_void,
) -> R<()> {
    if rdma::owns(fd) {
        let q = engine()?.queue(qh)?;
        return rdma::connect(fd, addr, len, q, ah as usize);
    }
    if dgram::owns(fd) {
        let q = engine()?.queue(qh)?;
        return dgram::connect(fd, addr, len, q, ah as usize);
    }
    if len == 0 || len as usize > std::mem::size_of::<libc::sockaddr_storage>() {
        return Err(libc::EINVAL);
    }
    mapped(addr as *const u8, len as usize)?;
    let kind = Kind::Connect {
        addr: addr as usize,
        len: len as usize,
    };
    engine()?.submit(fd, qh, ah as usize, &[], Dir::Send, kind)
}

/// `exs_accept`.
pub fn accept(
    fd: c_int,
    addr: *mut exs_acceptaddr_t,
    flags: c_int,
    qh: c_int,
    ah: *mut c_void,
) -> R<()> {
    if flags & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0 {
        return Err(libc::EINVAL);
    }
    if !addr.is_null() {
        mapped(addr as *const exs_acceptaddr_t, 1)?;
    }
    if rdma::owns(fd) {
        let q = engine()?.queue(qh)?;
        return rdma::accept(fd, addr, flags, q, ah as usize);
    }
    if dgram::owns(fd) {
        return Err(libc::EOPNOTSUPP);
    }
    let kind = Kind::Accept {
        addr: addr as usize,
        flags,
        newfd: -1,
    };
    engine()?.submit(fd, qh, ah as usize, &[], Dir::Recv, kind)
}

/// `exs_poll`.
///
/// # Safety
/// `fds` is NULL or has `nfds` entries, valid until the event.
pub unsafe fn poll(
    fds: *mut exs_pollfd_t,
    nfds: libc::c_uint,
    qh: c_int,
    ah: *mut c_void,
) -> R<()> {
    if nfds == 0 || nfds > EXS_IOV_MAX as libc::c_uint {
        return Err(libc::EINVAL);
    }
    mapped(fds as *const exs_pollfd_t, nfds as usize)?;
    let mut copy = Vec::with_capacity(nfds as usize);
    for i in 0..nfds as usize {
        // SAFETY: checked mapped, nfds entries.
        let p = unsafe { fds.add(i).read_unaligned() };
        if !poll_events_ok(p.events as c_short) {
            return Err(libc::EINVAL);
        }
        copy.push(libc::pollfd {
            fd: p.fd,
            events: p.events,
            revents: 0,
        });
    }
    engine()?.poll(fds as usize, copy, qh, ah as usize)
}

/// `exs_shutdown`.
pub fn shutdown(fd: c_int, how: c_int, qh: c_int, ah: *mut c_void) -> R<()> {
    // A DDPMODE socket under the sockets interposer moves to the RDMA model.
    crate::ddp::route(fd)?;
    if dgram::owns(fd) {
        return Err(libc::EOPNOTSUPP);
    }
    if !(libc::SHUT_RD..=libc::SHUT_RDWR).contains(&how) {
        return Err(libc::EINVAL);
    }
    if rdma::owns(fd) {
        let q = engine()?.queue(qh)?;
        return rdma::shutdown(fd, how, q, ah as usize);
    }
    engine()?.submit(fd, qh, ah as usize, &[], Dir::Send, Kind::Shutdown { how })
}

/// `exs_aclose`.
pub fn aclose(fd: c_int, qh: c_int, ah: *mut c_void) -> R<()> {
    // A DDPMODE socket under the sockets interposer moves to the RDMA model.
    crate::ddp::route(fd)?;
    if rdma::owns(fd) {
        let q = engine()?.queue(qh)?;
        return rdma::aclose(fd, q, ah as usize);
    }
    if dgram::owns(fd) {
        let q = engine()?.queue(qh)?;
        q.reserve()?;
        if let Err(e) = close(fd) {
            q.unreserve();
            return Err(e);
        }
        q.push(exs_event_t::new(EXS_EVT_CLOSE, fd, ah as usize, 0));
        return Ok(());
    }
    engine()?.submit(fd, qh, ah as usize, &[], Dir::Send, Kind::Close)
}

/// `exs_cancel`.
pub fn cancel(fd: c_int, ah: *mut c_void, flags: c_int) -> R<c_int> {
    let by_fd = flags & EXS_CAF_FILDES != 0;
    let by_ah = flags & EXS_CAF_AHANDLE != 0;
    let valid = flags != 0 && flags & !(EXS_CAF_FILDES | EXS_CAF_AHANDLE) == 0;
    if valid && by_fd && rdma::owns(fd) {
        return rdma::cancel(Some(fd), by_ah.then_some(ah as usize));
    }
    if valid && by_fd && dgram::owns(fd) {
        return dgram::cancel(Some(fd), by_ah.then_some(ah as usize));
    }
    let mut n = engine()?.cancel(fd, ah as usize, flags)?;
    if !by_fd && rdma::active() {
        n += rdma::cancel(None, Some(ah as usize))?;
    }
    if !by_fd && dgram::active() {
        n += dgram::cancel(None, Some(ah as usize))?;
    }
    Ok(n)
}

/// `exs_close`.
pub fn close(fd: c_int) -> R<()> {
    if fd < 0 {
        return Err(libc::EBADF);
    }
    if rdma::owns(fd) {
        return rdma::close(fd);
    }
    if dgram::owns(fd) {
        return dgram::close(fd);
    }
    engine()?.close(fd)
}

/// `exs_setsockopt`.
///
/// # Safety
/// As setsockopt(2).
pub unsafe fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *const c_void,
    len: socklen_t,
) -> R<()> {
    if level == libc::SOL_SOCKET {
        match name {
            SO_ASYNC_RECV_ORDERED => {
                sys::sock_id(fd)?;
                if (len as usize) < std::mem::size_of::<c_int>() {
                    return Err(libc::EINVAL);
                }
                mapped(value as *const c_int, 1)?;
                return Ok(());
            }
            SO_ASYNC_SEND_TIMEOUT | SO_ASYNC_RECV_TIMEOUT => {
                sys::sock_id(fd)?;
                return Err(libc::ENOPROTOOPT);
            }
            _ => {}
        }
    }
    // SAFETY: the caller's arguments, under setsockopt(2)'s contract.
    if unsafe { libc::setsockopt(fd, level, name, value, len) } != 0 {
        return Err(sys::errno());
    }
    Ok(())
}

/// `exs_getsockopt`.
///
/// # Safety
/// As getsockopt(2).
pub unsafe fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    value: *mut c_void,
    len: *mut socklen_t,
) -> R<()> {
    if level == libc::SOL_SOCKET {
        match name {
            SO_ASYNC_RECV_ORDERED => {
                sys::sock_id(fd)?;
                mapped(len as *const socklen_t, 1)?;
                // SAFETY: checked mapped.
                if (unsafe { len.read_unaligned() } as usize) < std::mem::size_of::<c_int>() {
                    return Err(libc::EINVAL);
                }
                mapped(value as *const c_int, 1)?;
                // SAFETY: both checked mapped.
                unsafe {
                    (value as *mut c_int).write_unaligned(1);
                    len.write_unaligned(std::mem::size_of::<c_int>() as socklen_t);
                }
                return Ok(());
            }
            SO_ASYNC_SEND_TIMEOUT | SO_ASYNC_RECV_TIMEOUT => {
                sys::sock_id(fd)?;
                return Err(libc::ENOPROTOOPT);
            }
            _ => {}
        }
    }
    // SAFETY: the caller's arguments, under getsockopt(2)'s contract.
    if unsafe { libc::getsockopt(fd, level, name, value, len) } != 0 {
        return Err(sys::errno());
    }
    Ok(())
}

fn rdma_fd(fd: c_int) -> R<()> {
    if rdma::owns(fd) || dgram::owns(fd) {
        Ok(())
    } else if sys::is_open(fd) {
        Err(libc::ENOTSOCK)
    } else {
        Err(libc::EBADF)
    }
}

/// `exs_socket`.
pub fn socket(domain: c_int, ty: c_int, protocol: c_int) -> R<c_int> {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    if base == libc::SOCK_DGRAM
        && (domain == libc::AF_INET || domain == libc::AF_INET6)
        && (protocol == 0 || protocol == libc::IPPROTO_UDP)
    {
        return dgram::socket(domain, ty);
    }
    rdma::socket(domain, ty, protocol)
}

/// `exs_bind`.
pub fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> R<()> {
    rdma_fd(fd)?;
    if dgram::owns(fd) {
        return dgram::bind(fd, addr, len);
    }
    rdma::bind(fd, addr, len)
}

/// `exs_listen`.
pub fn listen(fd: c_int, backlog: c_int) -> R<()> {
    rdma_fd(fd)?;
    if dgram::owns(fd) {
        return Err(libc::EOPNOTSUPP);
    }
    rdma::listen(fd, backlog)
}

/// `exs_fcntl`.
pub fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> R<c_int> {
    // A DDPMODE socket under the sockets interposer moves to the RDMA model.
    crate::ddp::route(fd)?;
    rdma_fd(fd)?;
    if dgram::owns(fd) {
        return dgram::fcntl(fd, cmd, arg);
    }
    rdma::fcntl(fd, cmd, arg)
}

/// `exs_getsockname` (`peer` false) and `exs_getpeername`.
pub fn sockname(peer: bool, fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> R<()> {
    // A DDPMODE socket under the sockets interposer moves to the RDMA model.
    crate::ddp::route(fd)?;
    rdma_fd(fd)?;
    if dgram::owns(fd) {
        return if peer {
            dgram::getpeername(fd, addr, len)
        } else {
            dgram::getsockname(fd, addr, len)
        };
    }
    if peer {
        rdma::getpeername(fd, addr, len)
    } else {
        rdma::getsockname(fd, addr, len)
    }
}

/// `exs_send_offset` (`recv` false) / `exs_recv_offset`: octets
/// [`offset`, `offset + len`) of the peer's persistent block (receive
/// block for a send, send block for a receive), one RDMA Write or Read;
/// `EINVAL` when the peer has no such block or the range leaves it.
#[allow(clippy::too_many_arguments)]
pub fn offset_xfer(
    recv: bool,
    fd: c_int,
    buf: usize,
    len: size_t,
    flags: c_int,
    offset: u64,
    qh: c_int,
    ah: *mut c_void,
    mh: c_int,
) -> R<()> {
    // A DDPMODE socket under the sockets interposer moves to the RDMA model.
    crate::ddp::route(fd)?;
    rdma_fd(fd)?;
    if dgram::owns(fd) {
        return Err(libc::EOPNOTSUPP);
    }
    if flags & (EXS_PERSISTENT | EXS_PERSISTENT_NOTIFY) != 0 {
        return Err(libc::EINVAL);
    }
    let q = engine()?.queue(qh)?;
    rdma::xfer(recv, fd, buf, len, flags, q, ah as usize, mh, Some(offset))
}
