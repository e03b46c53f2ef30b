//! Thin wrappers of the system calls the engine makes, each returning
//! `Result<_, Errno>`.

use libc::c_int;

use crate::Errno;

/// This thread's errno.
pub fn errno() -> Errno {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Sets this thread's errno.
pub fn set_errno(e: Errno) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// What the engine needs to know about a descriptor: that it is open, a
/// socket, and which socket (device and inode: a descriptor number reused
/// for another socket is another socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockId {
    /// Device of the socket's inode.
    pub dev: u64,
    /// The socket's inode.
    pub ino: u64,
}

/// `fstat`: EBADF when `fd` is not open, ENOTSOCK when it is not a socket.
pub fn sock_id(fd: c_int) -> Result<SockId, Errno> {
    if fd < 0 {
        return Err(libc::EBADF);
    }
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a local of the right type.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(errno());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(libc::ENOTSOCK);
    }
    Ok(SockId {
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// Whether `fd` is open (any kind of file).
pub fn is_open(fd: c_int) -> bool {
    // SAFETY: F_GETFD has no pointer argument.
    fd >= 0 && unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0
}

/// An int socket option.
pub fn sockopt_int(fd: c_int, level: c_int, name: c_int) -> Result<c_int, Errno> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: v and len are locals of the sizes given.
    let r = unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    if r != 0 {
        return Err(errno());
    }
    Ok(v)
}

/// `poll` on one descriptor without waiting: the returned events.
pub fn poll0(fd: c_int, events: libc::c_short) -> libc::c_short {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one local pollfd.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    if r == 1 {
        p.revents
    } else {
        0
    }
}

/// Whether every page of `[addr, addr + len)` is mapped (`mincore`).
/// A zero length is mapped wherever it is; NULL never is.
pub fn mapped(addr: usize, len: usize) -> bool {
    if addr == 0 {
        return false;
    }
    if len == 0 {
        return true;
    }
    // SAFETY: sysconf has no pointer argument.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let page = if page == 0 { 4096 } else { page };
    let start = addr & !(page - 1);
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let Some(span) = end.checked_sub(start) else {
        return false;
    };
    let pages = span.div_ceil(page);
    if pages > (1 << 28) {
        return false;
    }
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only inspects the mapping of the range and writes
    // one byte per page into vec, which has that many.
    let r = unsafe { libc::mincore(start as *mut libc::c_void, span, vec.as_mut_ptr()) };
    r == 0
}
