//! Asynchronous operations on kernel sockets and the progress thread.
//!
//! One lock guards every descriptor's pending operations. A call queues
//! its operation and tries the descriptor at once in the caller's thread
//! (a send that fits the socket buffer completes before the call
//! returns); what cannot finish waits for the progress thread, which
//! sleeps in `epoll_wait` over the descriptors that have pending
//! operations (level-triggered; a descriptor leaves the epoll set when
//! nothing on it is pending) and resumes them in order.
//!
//! Per descriptor there are two FIFOs: sends (with sendmsg, sendfile,
//! shutdown and the asynchronous close) and receives (with recvmsg and
//! accept). Only the head of each makes progress, so completions keep
//! the order of the calls. A pending connect holds both back.
//!
//! The descriptor is the caller's: its flags are left alone (I/O uses
//! `MSG_DONTWAIT`; a connect sets `O_NONBLOCK` for the one call).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};

use libc::{c_int, c_short, socklen_t};

use crate::abi::*;
use crate::mem::Registry;
use crate::queue::Queue;
use crate::sys::{self, SockId};
use crate::Errno;

/// Descriptors whose entry (socket type, state) is kept while nothing is
/// pending on them; past this many, idle entries are dropped.
const IDLE_KEPT: usize = 1024;

/// Bytes of a file staged per `pread` by `exs_sendfile`.
const STAGE: usize = 64 * 1024;

/// Send flags a caller may pass (`MSG_NOSIGNAL` is always added).
pub const SEND_FLAGS: c_int =
    libc::MSG_OOB | libc::MSG_DONTROUTE | libc::MSG_EOR | libc::MSG_MORE | libc::MSG_NOSIGNAL;
/// Receive flags a caller may pass.
pub const RECV_FLAGS: c_int = libc::MSG_OOB | libc::MSG_PEEK | libc::MSG_WAITALL | libc::MSG_TRUNC;

/// One element of an `exs_sendfile` vector, copied.
#[derive(Debug, Clone, Copy)]
pub enum Elem {
    /// Bytes in memory.
    Mem(usize, usize),
    /// A range of a file.
    File {
        /// The file.
        fd: c_int,
        /// Offset.
        off: i64,
        /// Length.
        len: usize,
    },
}

/// What an operation does.
#[derive(Debug)]
pub enum Kind {
    /// `exs_send`.
    Send {
        /// Buffer.
        buf: usize,
        /// Length.
        len: usize,
        /// Flags.
        flags: c_int,
    },
    /// `exs_recv`.
    Recv {
        /// Buffer.
        buf: usize,
        /// Length.
        len: usize,
        /// Flags.
        flags: c_int,
    },
    /// `exs_sendmsg` / `exs_recvmsg`.
    Msg {
        /// Receive (else send).
        recv: bool,
        /// The caller's `exs_msghdr_t`.
        user: usize,
        /// The vector, copied.
        iov: Vec<(usize, usize)>,
        /// `msg_name`, `msg_namelen`.
        name: (usize, socklen_t),
        /// `msg_control`, `msg_controllen`.
        control: (usize, usize),
        /// Flags.
        flags: c_int,
        /// After a receive: namelen, controllen, msg_flags.
        out: (socklen_t, usize, c_int),
    },
    /// `exs_sendfile`.
    SendFile {
        /// The caller's vector.
        user: usize,
        /// Its count.
        count: c_int,
        /// The elements.
        elems: Vec<Elem>,
        /// Current element.
        idx: usize,
        /// Bytes of it consumed.
        off: usize,
        /// File bytes read and not yet sent.
        stage: Vec<u8>,
        /// Sent part of `stage`.
        stage_pos: usize,
    },
    /// `exs_accept`.
    Accept {
        /// The caller's `exs_acceptaddr_t` or 0.
        addr: usize,
        /// accept4 flags.
        flags: c_int,
        /// The new descriptor.
        newfd: c_int,
    },
    /// `exs_connect` to the caller's address (read during the call only).
    Connect {
        /// `struct sockaddr *`.
        addr: usize,
        /// Its length.
        len: usize,
    },
    /// `exs_shutdown`.
    Shutdown {
        /// SHUT_*.
        how: c_int,
    },
    /// `exs_aclose`.
    Close,
}

/// A queued operation.
#[derive(Debug)]
pub struct Op {
    q: Arc<Queue>,
    ah: usize,
    mhs: Vec<i32>,
    done: usize,
    kind: Kind,
}

impl Op {
    fn started(&self) -> bool {
        self.done > 0 || matches!(&self.kind, Kind::SendFile { stage, .. } if !stage.is_empty())
    }
}

/// A pending `exs_poll`.
#[derive(Debug)]
struct PollOp {
    q: Arc<Queue>,
    ah: usize,
    user: usize,
    fds: Vec<libc::pollfd>,
}

/// One socket with operations pending (or once reset).
#[derive(Debug)]
struct Fd {
    id: SockId,
    stream: bool,
    connecting: Option<Op>,
    sends: VecDeque<Op>,
    recvs: VecDeque<Op>,
    /// The error every later call fails with, once the connection died.
    dead: Option<Errno>,
    shut_wr: bool,
    closing: bool,
}

impl Fd {
    fn idle(&self) -> bool {
        self.connecting.is_none() && self.sends.is_empty() && self.recvs.is_empty()
    }
}

#[derive(Debug, Default)]
struct State {
    queues: HashMap<i32, Arc<Queue>>,
    next_q: i32,
    mem: Registry,
    fds: HashMap<c_int, Fd>,
    polls: Vec<PollOp>,
    /// epoll interest currently registered, per descriptor.
    registered: HashMap<c_int, u32>,
    /// `fds` is pruned of idle entries when it grows past this (or
    /// [`IDLE_KEPT`]).
    prune_at: usize,
}

/// The library's state and its epoll instance.
#[derive(Debug)]
pub struct Engine {
    st: Mutex<State>,
    epfd: OwnedFd,
}

static ENGINE: OnceLock<Result<Engine, Errno>> = OnceLock::new();
static STARTED: Once = Once::new();

/// The engine, created (with its progress thread) on first use.
pub fn engine() -> Result<&'static Engine, Errno> {
    let e = ENGINE
        .get_or_init(|| {
            // SAFETY: epoll_create1 has no pointer argument.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                return Err(sys::errno());
            }
            Ok(Engine {
                st: Mutex::new(State::default()),
                // SAFETY: a new descriptor owned by nobody else.
                epfd: unsafe { OwnedFd::from_raw_fd(fd) },
            })
        })
        .as_ref()
        .map_err(|e| *e)?;
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("exs-progress".into())
            .spawn(move || e.run());
    });
    Ok(e)
}

fn fill(ev: &mut exs_event_t, fd: c_int, op: &Op, errno: Errno) {
    let nbytes = op.done as libc::ssize_t;
    match &op.kind {
        Kind::Send { buf, len, flags } | Kind::Recv { buf, len, flags } => {
            ev.exs_evt_type = if matches!(op.kind, Kind::Send { .. }) {
                EXS_EVT_SEND
            } else {
                EXS_EVT_RECV
            };
            ev.exs_evt_union.exs_evt_xfer = exs_evt_xfer_t {
                exs_evt_buf: *buf as *mut libc::c_void,
                exs_evt_len: *len,
                exs_evt_nbytes: nbytes,
                exs_evt_flags: *flags,
            };
        }
        Kind::Msg {
            recv, user, flags, ..
        } => {
            ev.exs_evt_type = if *recv {
                EXS_EVT_RECVMSG
            } else {
                EXS_EVT_SENDMSG
            };
            ev.exs_evt_union.exs_evt_xfermsg = exs_evt_xfermsg_t {
                exs_evt_msg: *user as *mut exs_msghdr_t,
                exs_evt_nbytes: nbytes,
                exs_evt_flags: *flags,
            };
        }
        Kind::SendFile { user, count, .. } => {
            ev.exs_evt_type = EXS_EVT_SENDFILE;
            ev.exs_evt_union.exs_evt_xferfile = exs_evt_xferfile_t {
                exs_evt_vec: *user as *const exs_xferfile_t,
                exs_evt_count: *count,
                exs_evt_nbytes: nbytes,
            };
        }
        Kind::Accept { addr, newfd, .. } => {
            ev.exs_evt_type = EXS_EVT_ACCEPT;
            ev.exs_evt_union.exs_evt_accept = exs_evt_accept_t {
                exs_evt_newfd: if errno == 0 { *newfd } else { -1 },
                exs_evt_addr: *addr as *mut exs_acceptaddr_t,
            };
        }
        Kind::Connect { .. } => ev.exs_evt_type = EXS_EVT_CONNECT,
        Kind::Shutdown { .. } => ev.exs_evt_type = EXS_EVT_SHUTDOWN,
        Kind::Close => ev.exs_evt_type = EXS_EVT_CLOSE,
    }
    ev.exs_evt_fd = fd;
}

/// Queues `op`'s event with `errno` and releases its registrations.
fn finish(mem: &mut Registry, fd: c_int, op: Op, errno: Errno) {
    mem.release(&op.mhs);
    if errno == 0 {
        if let Kind::Msg {
            recv: true,
            user,
            out,
            ..
        } = &op.kind
        {
            let m = *user as *mut exs_msghdr_t;
            // SAFETY: the caller's exs_msghdr_t, checked mapped when
            // queued and to stay valid until the event (sys/exs.h).
            unsafe {
                std::ptr::addr_of_mut!((*m).msg_namelen).write(out.0);
                std::ptr::addr_of_mut!((*m).msg_controllen).write(out.1 as socklen_t);
                std::ptr::addr_of_mut!((*m).msg_flags).write(out.2);
            }
        }
    }
    let mut ev = exs_event_t::new(0, fd, op.ah, errno);
    fill(&mut ev, fd, &op, errno);
    op.q.push(ev);
}

enum Step {
    Wait,
    Done(Errno),
}

fn io_errno<T: PartialOrd + Default>(r: T) -> Option<Errno> {
    if r < T::default() {
        Some(sys::errno())
    } else {
        None
    }
}

/// Builds iovecs for `iov` minus its first `skip` bytes.
fn iov_from(iov: &[(usize, usize)], mut skip: usize) -> Vec<libc::iovec> {
    let mut v = Vec::with_capacity(iov.len());
    for &(b, l) in iov {
        if skip >= l {
            skip -= l;
            continue;
        }
        v.push(libc::iovec {
            iov_base: (b + skip) as *mut libc::c_void,
            iov_len: l - skip,
        });
        skip = 0;
    }
    v
}

fn send_some(fd: c_int, p: *const u8, n: usize, flags: c_int) -> Result<usize, Errno> {
    loop {
        // SAFETY: the caller's buffer (or our stage), as queued; the
        // kernel reports EFAULT for memory that is not mapped.
        let r = unsafe {
            libc::send(
                fd,
                p.cast(),
                n,
                flags | libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        match io_errno(r) {
            None => return Ok(r as usize),
            Some(libc::EINTR) => continue,
            Some(e) => return Err(e),
        }
    }
}

fn would_block(e: Errno) -> bool {
    e == libc::EAGAIN || e == libc::EWOULDBLOCK
}

/// Moves `op` forward as far as the socket allows.
fn attempt(fd: c_int, stream: bool, op: &mut Op) -> Step {
    let done = &mut op.done;
    match &mut op.kind {
        Kind::Send { buf, len, flags } => loop {
            match send_some(fd, (*buf + *done) as *const u8, *len - *done, *flags) {
                Ok(n) => {
                    *done += n;
                    if !stream || *done >= *len || n == 0 {
                        return Step::Done(0);
                    }
                }
                Err(e) if would_block(e) => return Step::Wait,
                Err(e) => return Step::Done(e),
            }
        },
        Kind::Recv { buf, len, flags } => {
            let waitall = stream && *flags & libc::MSG_WAITALL != 0 && *flags & libc::MSG_PEEK == 0;
            loop {
                // SAFETY: the caller's buffer, as queued (EFAULT if unmapped).
                let r = unsafe {
                    libc::recv(
                        fd,
                        (*buf + *done) as *mut libc::c_void,
                        *len - *done,
                        (*flags & !libc::MSG_WAITALL) | libc::MSG_DONTWAIT,
                    )
                };
                match io_errno(r) {
                    None if r == 0 => return Step::Done(0),
                    None => {
                        *done += r as usize;
                        if !waitall || *done >= *len {
                            return Step::Done(0);
                        }
                    }
                    Some(libc::EINTR) => {}
                    Some(e) if would_block(e) => return Step::Wait,
                    Some(e) => return Step::Done(e),
                }
            }
        }
        Kind::Msg {
            recv,
            iov,
            name,
            control,
            flags,
            out,
            ..
        } => {
            let total: usize = iov.iter().map(|x| x.1).sum();
            let waitall =
                *recv && stream && *flags & libc::MSG_WAITALL != 0 && *flags & libc::MSG_PEEK == 0;
            loop {
                let mut v = iov_from(iov, *done);
                // SAFETY: a zeroed msghdr is valid; fields set below.
                let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
                m.msg_iov = v.as_mut_ptr();
                m.msg_iovlen = v.len() as _;
                if *done == 0 {
                    m.msg_name = name.0 as *mut libc::c_void;
                    m.msg_namelen = name.1;
                    m.msg_control = control.0 as *mut libc::c_void;
                    m.msg_controllen = control.1 as _;
                }
                // SAFETY: the caller's buffers, as queued; the kernel
                // reports EFAULT for unmapped memory.
                let r = unsafe {
                    if *recv {
                        libc::recvmsg(
                            fd,
                            &mut m,
                            (*flags & !libc::MSG_WAITALL) | libc::MSG_DONTWAIT,
                        )
                    } else {
                        libc::sendmsg(fd, &m, *flags | libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                    }
                };
                match io_errno(r) {
                    None => {
                        if *recv && *done == 0 {
                            *out = (m.msg_namelen, m.msg_controllen as usize, m.msg_flags);
                        }
                        *done += r as usize;
                        let more = if *recv { waitall } else { stream };
                        if r == 0 || !more || *done >= total {
                            return Step::Done(0);
                        }
                    }
                    Some(libc::EINTR) => {}
                    Some(e) if would_block(e) => return Step::Wait,
                    Some(e) => return Step::Done(e),
                }
            }
        }
        Kind::SendFile {
            elems,
            idx,
            off,
            stage,
            stage_pos,
            ..
        } => loop {
            if *stage_pos < stage.len() {
                match send_some(
                    fd,
                    stage[*stage_pos..].as_ptr(),
                    stage.len() - *stage_pos,
                    0,
                ) {
                    Ok(n) => {
                        *stage_pos += n;
                        *done += n;
                        if *stage_pos >= stage.len() {
                            stage.clear();
                            *stage_pos = 0;
                        }
                        continue;
                    }
                    Err(e) if would_block(e) => return Step::Wait,
                    Err(e) => return Step::Done(e),
                }
            }
            let Some(el) = elems.get(*idx).copied() else {
                return Step::Done(0);
            };
            match el {
                Elem::Mem(b, l) => {
                    if *off >= l {
                        *idx += 1;
                        *off = 0;
                        continue;
                    }
                    match send_some(fd, (b + *off) as *const u8, l - *off, 0) {
                        Ok(n) => {
                            *off += n;
                            *done += n;
                        }
                        Err(e) if would_block(e) => return Step::Wait,
                        Err(e) => return Step::Done(e),
                    }
                }
                Elem::File {
                    fd: ffd,
                    off: foff,
                    len,
                } => {
                    if *off >= len {
                        *idx += 1;
                        *off = 0;
                        continue;
                    }
                    let n = STAGE.min(len - *off);
                    stage.resize(n, 0);
                    // SAFETY: reads at most n bytes into stage, which has n.
                    let r = unsafe {
                        libc::pread(ffd, stage.as_mut_ptr().cast(), n, foff + *off as i64)
                    };
                    if r <= 0 {
                        stage.clear();
                        return Step::Done(if r == 0 { libc::EIO } else { sys::errno() });
                    }
                    stage.truncate(r as usize);
                    *stage_pos = 0;
                    *off += r as usize;
                }
            }
        },
        Kind::Accept { addr, flags, newfd } => loop {
            if sys::poll0(fd, libc::POLLIN) == 0 {
                return Step::Wait;
            }
            // SAFETY: zeroed sockaddr_storage is valid.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut sl = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
            // SAFETY: ss/sl are locals of the sizes given.
            let r = unsafe {
                libc::accept4(
                    fd,
                    (&mut ss as *mut libc::sockaddr_storage).cast(),
                    &mut sl,
                    *flags,
                )
            };
            match io_errno(r) {
                None => {
                    *newfd = r;
                    if *addr != 0 {
                        let a = *addr as *mut exs_acceptaddr_t;
                        // SAFETY: the caller's exs_acceptaddr_t, checked
                        // mapped when queued (sys/exs.h: valid until the event).
                        unsafe {
                            std::ptr::addr_of_mut!((*a).aa_addrlen).write(sl);
                            std::ptr::addr_of_mut!((*a).aa_addr).write(ss);
                        }
                    }
                    return Step::Done(0);
                }
                Some(libc::EINTR) | Some(libc::ECONNABORTED) => {}
                Some(e) if would_block(e) => return Step::Wait,
                Some(e) => return Step::Done(e),
            }
        },
        Kind::Shutdown { how } => {
            // SAFETY: no pointer arguments.
            let r = unsafe { libc::shutdown(fd, *how) };
            Step::Done(if r == 0 { 0 } else { sys::errno() })
        }
        // Connect is resolved by progress(); Close by progress() too.
        Kind::Connect { .. } | Kind::Close => Step::Done(0),
    }
}

/// The error the connection died of, if `e` says it did: an EPIPE we did
/// not cause by a shutdown is the peer's reset.
fn death(e: Errno, shut_wr: bool) -> Option<Errno> {
    match e {
        libc::ECONNRESET => Some(libc::ECONNRESET),
        libc::EPIPE if !shut_wr => Some(libc::ECONNRESET),
        libc::ECONNABORTED | libc::ETIMEDOUT => Some(e),
        _ => None,
    }
}

impl State {
    /// Completes every operation of `f` with `e` (the first with its bytes).
    fn fail_all(mem: &mut Registry, fd: c_int, f: &mut Fd, e: Errno) {
        if let Some(op) = f.connecting.take() {
            finish(mem, fd, op, e);
        }
        for op in f.sends.drain(..).chain(f.recvs.drain(..)) {
            finish(mem, fd, op, e);
        }
    }

    /// Moves every pending operation of `fd` forward.
    fn progress(&mut self, epfd: c_int, fd: c_int) {
        let State {
            fds,
            mem,
            registered,
            ..
        } = self;
        let closed = match fds.get_mut(&fd) {
            Some(f) => progress_fd(epfd, registered, mem, fd, f),
            None => false,
        };
        if closed {
            fds.remove(&fd);
        }
        self.sync(epfd, fd);
    }

    /// Completes the polls that are ready.
    fn progress_polls(&mut self, epfd: c_int) {
        let mut touched = Vec::new();
        let mut i = 0;
        while i < self.polls.len() {
            let p = &mut self.polls[i];
            let r = poll_now(&mut p.fds);
            if r > 0 {
                let p = self.polls.swap_remove(i);
                touched.extend(p.fds.iter().map(|x| x.fd));
                complete_poll(p, r);
            } else {
                i += 1;
            }
        }
        for fd in touched {
            self.sync(epfd, fd);
        }
    }

    /// Registers in epoll exactly the interest `fd`'s pending work needs.
    fn sync(&mut self, epfd: c_int, fd: c_int) {
        let mut want: u32 = 0;
        if let Some(f) = self.fds.get(&fd) {
            if f.connecting.is_some() {
                want |= libc::EPOLLOUT as u32;
            } else {
                if !f.sends.is_empty() {
                    want |= libc::EPOLLOUT as u32;
                }
                if !f.recvs.is_empty() {
                    want |= libc::EPOLLIN as u32;
                }
            }
        }
        // A descriptor of the RDMA model is an eventfd made readable when
        // its readiness changes: whatever the poll asks, epoll waits for that.
        let rdma = crate::rdma::is_fd(fd);
        for p in &self.polls {
            for x in &p.fds {
                if x.fd == fd && rdma {
                    want |= libc::EPOLLIN as u32;
                } else if x.fd == fd {
                    if x.events & libc::POLLIN != 0 {
                        want |= libc::EPOLLIN as u32;
                    }
                    if x.events & libc::POLLPRI != 0 {
                        want |= libc::EPOLLPRI as u32;
                    }
                    if x.events & libc::POLLOUT != 0 {
                        want |= libc::EPOLLOUT as u32;
                    }
                    // Errors and hang-ups are always reported.
                    want |= libc::EPOLLERR as u32;
                }
            }
        }
        // An idle descriptor keeps its entry (the next call on it then
        // needs no SO_TYPE lookup; a reused number is told apart by its
        // `SockId`), up to a bound past which idle entries are dropped.
        if self.fds.len() > self.prune_at.max(IDLE_KEPT) {
            self.fds
                .retain(|_, f| !f.idle() || f.dead.is_some() || f.shut_wr);
            self.prune_at = 2 * self.fds.len();
        }
        let have = self.registered.get(&fd).copied().unwrap_or(0);
        if want == have {
            return;
        }
        if want == 0 {
            epoll_del(epfd, &mut self.registered, fd);
            return;
        }
        let mut ev = libc::epoll_event {
            events: want,
            u64: fd as u64,
        };
        let op = if have == 0 {
            libc::EPOLL_CTL_ADD
        } else {
            libc::EPOLL_CTL_MOD
        };
        // SAFETY: ev is a local.
        let mut r = unsafe { libc::epoll_ctl(epfd, op, fd, &mut ev) };
        if r != 0 {
            let alt = match sys::errno() {
                libc::ENOENT => libc::EPOLL_CTL_ADD,
                libc::EEXIST => libc::EPOLL_CTL_MOD,
                _ => 0,
            };
            if alt != 0 {
                // SAFETY: as above.
                r = unsafe { libc::epoll_ctl(epfd, alt, fd, &mut ev) };
            }
        }
        if r == 0 {
            self.registered.insert(fd, want);
        } else {
            // Not pollable (closed under us, or a regular file): poll(2)
            // answers for such descriptors at once, so polls complete;
            // socket operations fail with the descriptor's error.
            self.registered.remove(&fd);
            let e = sys::errno();
            if let Some(mut f) = self.fds.remove(&fd) {
                Self::fail_all(&mut self.mem, fd, &mut f, e);
            }
        }
    }
}

/// Moves `f`'s operations forward in order; true when an asynchronous
/// close closed the descriptor.
fn progress_fd(
    epfd: c_int,
    registered: &mut HashMap<c_int, u32>,
    mem: &mut Registry,
    fd: c_int,
    f: &mut Fd,
) -> bool {
    if f.connecting.is_some() {
        if sys::poll0(fd, libc::POLLOUT) == 0 {
            return false;
        }
        let e = match sys::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) {
            Ok(e) => e,
            Err(e) => e,
        };
        if let Some(op) = f.connecting.take() {
            finish(mem, fd, op, e);
        }
        if e != 0 {
            State::fail_all(mem, fd, f, e);
            return false;
        }
    }
    while let Some(op) = f.sends.front_mut() {
        if matches!(op.kind, Kind::Close) {
            let op = f.sends.pop_front().expect("head");
            for r in f.recvs.drain(..).chain(f.sends.drain(..)) {
                finish(mem, fd, r, libc::ECANCELED);
            }
            epoll_del(epfd, registered, fd);
            // SAFETY: the caller asked for this close.
            let r = unsafe { libc::close(fd) };
            let e = if r == 0 { 0 } else { sys::errno() };
            finish(mem, fd, op, e);
            return true;
        }
        match attempt(fd, f.stream, op) {
            Step::Wait => break,
            Step::Done(e) => {
                let op = f.sends.pop_front().expect("head");
                if let Kind::Shutdown { how } = op.kind {
                    if e == 0 && how != libc::SHUT_RD {
                        f.shut_wr = true;
                    }
                }
                if let Some(d) = death(e, f.shut_wr) {
                    f.dead = Some(d);
                    finish(mem, fd, op, d);
                    State::fail_all(mem, fd, f, d);
                } else {
                    finish(mem, fd, op, e);
                }
            }
        }
    }
    while let Some(op) = f.recvs.front_mut() {
        match attempt(fd, f.stream, op) {
            Step::Wait => break,
            Step::Done(e) => {
                let op = f.recvs.pop_front().expect("head");
                if let Some(d) = death(e, f.shut_wr) {
                    f.dead = Some(d);
                    finish(mem, fd, op, d);
                    State::fail_all(mem, fd, f, d);
                } else {
                    finish(mem, fd, op, e);
                }
            }
        }
    }
    false
}

fn epoll_del(epfd: c_int, registered: &mut HashMap<c_int, u32>, fd: c_int) {
    if registered.remove(&fd).is_some() {
        // SAFETY: DEL ignores the event argument (non-NULL for old kernels).
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }
}

fn complete_poll(p: PollOp, nready: c_int) {
    let user = p.user as *mut exs_pollfd_t;
    for (i, x) in p.fds.iter().enumerate() {
        // SAFETY: the caller's array of p.fds.len() entries, checked mapped
        // when queued and to stay valid until the event (sys/exs.h).
        unsafe { std::ptr::addr_of_mut!((*user.add(i)).revents).write(x.revents) };
    }
    let mut ev = exs_event_t::new(EXS_EVT_POLL, -1, p.ah, 0);
    ev.exs_evt_union.exs_evt_poll = exs_evt_poll_t {
        exs_evt_fds: user,
        exs_evt_nfds: p.fds.len() as libc::c_uint,
        exs_evt_nready: nready,
    };
    p.q.push(ev);
}

/// Which FIFO an operation joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Sends, shutdown, close.
    Send,
    /// Receives, accept.
    Recv,
}

impl Engine {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn epfd(&self) -> c_int {
        self.epfd.as_raw_fd()
    }

    /// The progress thread's loop.
    fn run(&'static self) {
        // Signals are for the application's threads.
        // SAFETY: a full local set; pthread_sigmask on this thread.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
        }
        let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            // SAFETY: evs has 64 entries.
            let n = unsafe { libc::epoll_wait(self.epfd(), evs.as_mut_ptr(), 64, -1) };
            if n < 0 {
                if sys::errno() != libc::EINTR {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                continue;
            }
            let mut st = self.lock();
            for ev in &evs[..n as usize] {
                let fd = ev.u64 as c_int;
                st.progress(self.epfd(), fd);
            }
            if !st.polls.is_empty() {
                st.progress_polls(self.epfd());
            }
        }
    }

    /// `exs_qcreate`.
    pub fn qcreate(&self, depth: c_int) -> Result<c_int, Errno> {
        if !(1..=EXS_EVTVEC_MAX).contains(&depth) {
            return Err(libc::EINVAL);
        }
        let q = Arc::new(Queue::new(depth as usize)?);
        let mut st = self.lock();
        if st.queues.len() >= 1 << 20 {
            return Err(libc::ENOMEM);
        }
        loop {
            let h = st.next_q;
            st.next_q = if h == i32::MAX { 0 } else { h + 1 };
            if let std::collections::hash_map::Entry::Vacant(v) = st.queues.entry(h) {
                v.insert(q);
                return Ok(h);
            }
        }
    }

    /// `exs_qdelete`.
    pub fn qdelete(&self, qh: c_int) -> Result<(), Errno> {
        let mut st = self.lock();
        let q = st.queues.get(&qh).ok_or(libc::EINVAL)?;
        if q.lock().reserved > 0 {
            return Err(libc::EBUSY);
        }
        let q = st.queues.remove(&qh).expect("present");
        q.mark_deleted();
        Ok(())
    }

    /// The queue named `qh`.
    pub fn queue(&self, qh: c_int) -> Result<Arc<Queue>, Errno> {
        self.lock().queues.get(&qh).cloned().ok_or(libc::EINVAL)
    }

    /// `exs_mregister`.
    pub fn mregister(&self, addr: usize, len: usize, flags: c_int) -> Result<c_int, Errno> {
        if flags & !EXS_MRF_SHARED != 0 || len == 0 {
            return Err(libc::EINVAL);
        }
        if !sys::mapped(addr, len) {
            return Err(libc::EFAULT);
        }
        self.lock().mem.add(addr, len)
    }

    /// `exs_mderegister` (and the region's memory region of the RDMA
    /// model, if it has one).
    pub fn mderegister(&self, mh: c_int) -> Result<(), Errno> {
        let stag = self.lock().mem.remove(mh)?;
        if let Some(s) = stag {
            crate::rdma::deregister(s);
        }
        Ok(())
    }

    /// Checks `[buf, buf + len)` against `mh` (any buffer for
    /// `EXS_MHANDLE_UNREGISTERED`) and holds the handle until
    /// [`Engine::mem_release`].
    pub(crate) fn mem_hold(&self, mh: c_int, buf: usize, len: usize) -> Result<(), Errno> {
        let mut st = self.lock();
        st.mem.check(mh, buf, len)?;
        st.mem.hold(&[mh]);
        Ok(())
    }

    /// Undoes [`Engine::mem_hold`].
    pub(crate) fn mem_release(&self, mh: c_int) {
        self.lock().mem.release(&[mh]);
    }

    /// The engine STag of registered handle `mh`, registering its whole
    /// region with `reg(addr, len)` on first use.
    pub(crate) fn mem_stag(
        &self,
        mh: c_int,
        reg: impl FnOnce(usize, usize) -> Result<u32, Errno>,
    ) -> Result<u32, Errno> {
        let mut st = self.lock();
        let r = st.mem.get_mut(mh).ok_or(libc::EINVAL)?;
        if let Some(s) = r.stag {
            return Ok(s);
        }
        let s = reg(r.addr, r.len)?;
        r.stag = Some(s);
        Ok(s)
    }

    /// Queues `kind` on `fd` (checks done by the caller except the
    /// descriptor, the queue and the registrations `ranges`).
    pub fn submit(
        &self,
        fd: c_int,
        qh: c_int,
        ah: usize,
        ranges: &[(i32, usize, usize)],
        dir: Dir,
        kind: Kind,
    ) -> Result<(), Errno> {
        let id = sys::sock_id(fd)?;
        let epfd = self.epfd();
        let mut st = self.lock();
        let q = st.queues.get(&qh).cloned().ok_or(libc::EINVAL)?;
        for &(mh, b, l) in ranges {
            st.mem.check(mh, b, l)?;
        }
        let fresh = match st.fds.get(&fd) {
            Some(f) => f.id != id,
            None => true,
        };
        if fresh {
            if let Some(mut old) = st.fds.remove(&fd) {
                State::fail_all(&mut st.mem, fd, &mut old, libc::EBADF);
            }
            let ty = sys::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_TYPE)?;
            st.fds.insert(
                fd,
                Fd {
                    id,
                    stream: ty == libc::SOCK_STREAM,
                    connecting: None,
                    sends: VecDeque::new(),
                    recvs: VecDeque::new(),
                    dead: None,
                    shut_wr: false,
                    closing: false,
                },
            );
        }
        let f = st.fds.get(&fd).expect("inserted");
        if f.closing {
            return Err(libc::EBADF);
        }
        if let Some(e) = f.dead {
            return Err(e);
        }
        let target = match kind {
            Kind::Connect { addr, len } => Some((addr, len)),
            _ => None,
        };
        let is_connect = target.is_some();
        if is_connect && f.connecting.is_some() {
            return Err(libc::EALREADY);
        }
        q.reserve()?;
        let mhs: Vec<i32> = ranges
            .iter()
            .map(|r| r.0)
            .filter(|&h| h != EXS_MHANDLE_UNREGISTERED)
            .collect();
        st.mem.hold(&mhs);
        let is_close = matches!(kind, Kind::Close);
        let op = Op {
            q: q.clone(),
            ah,
            mhs,
            done: 0,
            kind,
        };
        let State { fds, mem, .. } = &mut *st;
        let f = fds.get_mut(&fd).expect("inserted");
        if let Some((addr, len)) = target {
            match start_connect(fd, addr, len) {
                Ok(true) => finish(mem, fd, op, 0),
                Ok(false) => f.connecting = Some(op),
                Err(e) => {
                    mem.release(&op.mhs);
                    q.unreserve();
                    st.sync(epfd, fd);
                    return Err(e);
                }
            }
        } else {
            if is_close {
                f.closing = true;
            }
            match dir {
                Dir::Send => f.sends.push_back(op),
                Dir::Recv => f.recvs.push_back(op),
            }
        }
        st.progress(epfd, fd);
        Ok(())
    }

    /// `exs_poll`: `fds` is a copy of the caller's array at `user`.
    pub fn poll(
        &self,
        user: usize,
        mut fds: Vec<libc::pollfd>,
        qh: c_int,
        ah: usize,
    ) -> Result<(), Errno> {
        let epfd = self.epfd();
        let mut st = self.lock();
        let q = st.queues.get(&qh).cloned().ok_or(libc::EINVAL)?;
        q.reserve()?;
        let r = poll_now(&mut fds);
        let p = PollOp { q, ah, user, fds };
        if r > 0 {
            complete_poll(p, r);
            return Ok(());
        }
        let list: Vec<c_int> = p.fds.iter().map(|x| x.fd).collect();
        st.polls.push(p);
        for fd in list {
            st.sync(epfd, fd);
        }
        // A descriptor epoll refused (a regular file) is ready for poll(2).
        st.progress_polls(epfd);
        Ok(())
    }

    /// Takes `fd` out of the epoll set (a descriptor of the RDMA model
    /// about to be closed).
    pub fn forget_fd(&self, fd: c_int) {
        let epfd = self.epfd();
        let mut st = self.lock();
        epoll_del(epfd, &mut st.registered, fd);
    }

    /// Looks at the pending polls again (a descriptor of the RDMA model
    /// was closed: poll(2) reports `POLLNVAL` for it).
    pub fn repoll(&self) {
        let epfd = self.epfd();
        let mut st = self.lock();
        if !st.polls.is_empty() {
            st.progress_polls(epfd);
        }
    }

    /// `exs_cancel`.
    pub fn cancel(&self, fd: c_int, ah: usize, flags: c_int) -> Result<c_int, Errno> {
        if flags == 0 || flags & !(EXS_CAF_FILDES | EXS_CAF_AHANDLE) != 0 {
            return Err(libc::EINVAL);
        }
        let by_fd = flags & EXS_CAF_FILDES != 0;
        let by_ah = flags & EXS_CAF_AHANDLE != 0;
        if by_fd && !sys::is_open(fd) {
            return Err(libc::EBADF);
        }
        let epfd = self.epfd();
        let mut st = self.lock();
        let mut n = 0;
        let keys: Vec<c_int> = st.fds.keys().copied().collect();
        for k in keys {
            if by_fd && k != fd {
                continue;
            }
            let State { fds, mem, .. } = &mut *st;
            let f = fds.get_mut(&k).expect("key");
            for list in [&mut f.sends, &mut f.recvs] {
                let mut keep = VecDeque::new();
                for op in list.drain(..) {
                    if !op.started() && (!by_ah || op.ah == ah) {
                        if matches!(op.kind, Kind::Close) {
                            f.closing = false;
                        }
                        finish(mem, k, op, libc::ECANCELED);
                        n += 1;
                    } else {
                        keep.push_back(op);
                    }
                }
                *list = keep;
            }
            st.progress(epfd, k);
        }
        if !by_fd {
            let mut i = 0;
            while i < st.polls.len() {
                if st.polls[i].ah == ah {
                    let p = st.polls.swap_remove(i);
                    let mut ev = exs_event_t::new(EXS_EVT_POLL, -1, p.ah, libc::ECANCELED);
                    ev.exs_evt_union.exs_evt_poll = exs_evt_poll_t {
                        exs_evt_fds: p.user as *mut exs_pollfd_t,
                        exs_evt_nfds: p.fds.len() as libc::c_uint,
                        exs_evt_nready: 0,
                    };
                    let fds: Vec<c_int> = p.fds.iter().map(|x| x.fd).collect();
                    p.q.push(ev);
                    for f in fds {
                        st.sync(epfd, f);
                    }
                    n += 1;
                } else {
                    i += 1;
                }
            }
        }
        Ok(n)
    }

    /// `exs_close`: cancels `fd`'s operations, then closes it.
    pub fn close(&self, fd: c_int) -> Result<(), Errno> {
        let epfd = self.epfd();
        let mut st = self.lock();
        let State {
            fds,
            mem,
            registered,
            ..
        } = &mut *st;
        if let Some(mut f) = fds.remove(&fd) {
            State::fail_all(mem, fd, &mut f, libc::ECANCELED);
        }
        epoll_del(epfd, registered, fd);
        // SAFETY: the caller asked for this close.
        let r = unsafe { libc::close(fd) };
        let e = if r == 0 { None } else { Some(sys::errno()) };
        st.progress_polls(epfd);
        match e {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// Starts a non-blocking connect to the caller's address: Ok(true)
/// connected at once, Ok(false) in progress, Err: connect(2)'s own error.
fn start_connect(fd: c_int, addr: usize, len: usize) -> Result<bool, Errno> {
    // SAFETY: no pointer arguments.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if fl < 0 {
        return Err(sys::errno());
    }
    if fl & libc::O_NONBLOCK == 0 {
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) };
    }
    // SAFETY: the caller's address of len bytes (checked mapped).
    let r = unsafe { libc::connect(fd, addr as *const libc::sockaddr, len as socklen_t) };
    let e = if r == 0 { 0 } else { sys::errno() };
    if fl & libc::O_NONBLOCK == 0 {
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETFL, fl) };
    }
    match e {
        0 => Ok(true),
        libc::EINPROGRESS => Ok(false),
        e => Err(e),
    }
}

/// poll(2) with a zero timeout over `fds`, the RDMA model answering for
/// its own descriptors; returns how many entries are ready.
fn poll_now(fds: &mut [libc::pollfd]) -> c_int {
    // SAFETY: the caller's (our own) array of fds.len() entries.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
    if !crate::rdma::active() || r < 0 {
        return r;
    }
    let mut mine = false;
    for x in fds.iter_mut() {
        if let Some(m) = crate::rdma::poll_state(x.fd) {
            x.revents = m & (x.events | libc::POLLHUP | libc::POLLERR);
            mine = true;
        }
    }
    if !mine {
        return r;
    }
    fds.iter().filter(|x| x.revents != 0).count() as c_int
}

/// Checks the poll bits a caller may request.
pub fn poll_events_ok(ev: c_short) -> bool {
    ev & !(libc::POLLIN | libc::POLLOUT | libc::POLLPRI) == 0
}
