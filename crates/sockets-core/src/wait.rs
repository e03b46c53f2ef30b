//! `poll`, `select` and `epoll` over a mix of kernel descriptors and
//! sockets softrdma carries.
//!
//! A carried socket's readiness is softrdma's (octets buffered, send room,
//! end of stream), not its kernel socket's, whose traffic is iWARP. So
//! the calls ask each carried socket itself ([`Sock::ready`]), the kernel
//! for the rest, and to block they wait in the kernel on every kernel
//! descriptor plus each carried socket's wake-up descriptor (the
//! connection's own TCP socket: whatever arrives on it, or room to write
//! what the QP holds, is progress the next look makes), then ask again.
//!
//! An epoll set keeps carried sockets out of the kernel set: they live in
//! a shadow list ([`EpollSet`]) with the application's events and
//! `data`, and `epoll_wait` reports them itself, with level-triggered,
//! `EPOLLET` (a change of the socket since the last report, counted by
//! [`Sock::gen`]) and `EPOLLONESHOT` semantics. To block, it waits on a
//! private epoll set holding the application's set and the wake-up
//! descriptors. A shadowed socket that turns out plain moves into the
//! kernel set at the next `epoll_wait`.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use libc::{c_int, epoll_event, pollfd};

use crate::real::real;
use crate::sock::Sock;

fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn remaining_ms(deadline: Option<Instant>) -> c_int {
    match deadline {
        None => -1,
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            // Round up, so a wait never ends just before its deadline.
            (left.as_micros().div_ceil(1000)).min(i32::MAX as u128) as c_int
        }
    }
}

fn deadline_of(timeout_ms: c_int) -> Option<Instant> {
    (timeout_ms >= 0).then(|| Instant::now() + std::time::Duration::from_millis(timeout_ms as u64))
}

const ALWAYS: i16 = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;

/// `poll`/`ppoll` over `fds`; `block(fds, timeout_ms)` is the kernel's
/// call (with the caller's signal mask for `ppoll`).
pub fn poll(
    fds: &mut [pollfd],
    timeout_ms: c_int,
    block: &dyn Fn(&mut [pollfd], c_int) -> c_int,
) -> c_int {
    let carried: Vec<(usize, Arc<Sock>)> = fds
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            crate::table::sock(p.fd)
                .filter(|s| !s.is_pass())
                .map(|s| (i, s))
        })
        .collect();
    if carried.is_empty() {
        return block(fds, timeout_ms);
    }
    let deadline = deadline_of(timeout_ms);
    loop {
        // Carried sockets now; plain ones (and those that turned plain)
        // go to the kernel, with each carried socket's wake-up
        // descriptor when there is nothing to report yet.
        let mut kern: Vec<pollfd> = fds.to_vec();
        let mut mine = vec![0i16; fds.len()];
        let mut any = false;
        let mut extra = Vec::new();
        for (i, s) in &carried {
            if s.is_pass() {
                continue;
            }
            let r = s.ready(fds[*i].fd);
            kern[*i].fd = -1;
            mine[*i] = r.events & (fds[*i].events | ALWAYS);
            any |= mine[*i] != 0;
            if let Some((fd, ev)) = r.wait {
                extra.push(pollfd {
                    fd,
                    events: ev,
                    revents: 0,
                });
            }
        }
        let timeout = if any { 0 } else { remaining_ms(deadline) };
        if any {
            extra.clear();
        }
        kern.extend(extra);
        let r = block(&mut kern, timeout);
        if r < 0 {
            return r;
        }
        let mut count = 0;
        for i in 0..fds.len() {
            let rev = if kern[i].fd < 0 && fds[i].fd >= 0 {
                mine[i]
            } else {
                kern[i].revents
            };
            fds[i].revents = rev;
            if rev != 0 {
                count += 1;
            }
        }
        if count > 0 || timeout == 0 {
            return count;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
    }
}

/// True if any descriptor of the sets below `nfds` is a socket softrdma
/// carries.
///
/// # Safety
/// The sets are null or valid `fd_set`s.
pub unsafe fn select_needed(
    nfds: c_int,
    r: *const libc::fd_set,
    w: *const libc::fd_set,
    e: *const libc::fd_set,
) -> bool {
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        // SAFETY: the caller's sets, read below FD_SETSIZE.
        let member = unsafe {
            (!r.is_null() && libc::FD_ISSET(fd, r))
                || (!w.is_null() && libc::FD_ISSET(fd, w))
                || (!e.is_null() && libc::FD_ISSET(fd, e))
        };
        if member && crate::table::sock(fd).is_some_and(|s| !s.is_pass()) {
            return true;
        }
    }
    false
}

/// `select`/`pselect` through [`poll`].
///
/// # Safety
/// The sets are null or valid `fd_set`s.
pub unsafe fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout_ms: c_int,
    block: &dyn Fn(&mut [pollfd], c_int) -> c_int,
) -> c_int {
    let mut fds = Vec::new();
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut ev = 0;
        // SAFETY: the caller's sets, read below FD_SETSIZE.
        unsafe {
            if !r.is_null() && libc::FD_ISSET(fd, r) {
                ev |= libc::POLLIN;
            }
            if !w.is_null() && libc::FD_ISSET(fd, w) {
                ev |= libc::POLLOUT;
            }
            if !e.is_null() && libc::FD_ISSET(fd, e) {
                ev |= libc::POLLPRI;
            }
        }
        if ev != 0 {
            fds.push(pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    let n = poll(&mut fds, timeout_ms, block);
    if n < 0 {
        return n;
    }
    if fds.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        set_errno(libc::EBADF);
        return -1;
    }
    let mut count = 0;
    // SAFETY: the caller's sets.
    unsafe {
        for s in [r, w, e] {
            if !s.is_null() {
                libc::FD_ZERO(s);
            }
        }
        for p in &fds {
            if !r.is_null()
                && p.events & libc::POLLIN != 0
                && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
            {
                libc::FD_SET(p.fd, r);
                count += 1;
            }
            if !w.is_null()
                && p.events & libc::POLLOUT != 0
                && p.revents & (libc::POLLOUT | libc::POLLERR) != 0
            {
                libc::FD_SET(p.fd, w);
                count += 1;
            }
            if !e.is_null() && p.events & libc::POLLPRI != 0 && p.revents & libc::POLLPRI != 0 {
                libc::FD_SET(p.fd, e);
                count += 1;
            }
        }
    }
    count
}

struct Shadow {
    fd: c_int,
    sock: Arc<Sock>,
    events: u32,
    data: u64,
    disabled: bool,
    last_gen: Option<u64>,
    /// The wake-up descriptor registered in the private set.
    q_reg: Option<(c_int, u32)>,
    /// The socket's [`Sock::gen`] when last looked at, and whether it was
    /// ready then: a socket that has not changed since, was not ready and
    /// whose wake-up descriptor is quiet is not looked at again.
    scanned_gen: Option<u64>,
    was_ready: bool,
}

/// An application epoll set and its shadow list of carried sockets.
#[derive(Debug)]
pub struct EpollSet {
    epfd: c_int,
    /// Private epoll set for blocking (-1 until first needed).
    q: AtomicI32,
    any: AtomicBool,
    shadow: Mutex<Vec<Shadow>>,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow")
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

/// `data` of the application's set inside the private one.
const Q_APP: u64 = u64::MAX;

impl EpollSet {
    /// Shadows the application's epoll set `epfd`.
    pub fn new(epfd: c_int) -> EpollSet {
        EpollSet {
            epfd,
            q: AtomicI32::new(-1),
            any: AtomicBool::new(false),
            shadow: Mutex::new(Vec::new()),
        }
    }

    fn q(&self) -> c_int {
        let q = self.q.load(Ordering::Acquire);
        if q >= 0 {
            return q;
        }
        // SAFETY: plain epoll calls on descriptors we own.
        unsafe {
            let q = (real().epoll_create1)(libc::EPOLL_CLOEXEC);
            if q < 0 {
                return -1;
            }
            let mut ev = epoll_event {
                events: libc::EPOLLIN as u32,
                u64: Q_APP,
            };
            (real().epoll_ctl)(q, libc::EPOLL_CTL_ADD, self.epfd, &mut ev);
            match self
                .q
                .compare_exchange(-1, q, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => q,
                Err(other) => {
                    (real().close)(q);
                    other
                }
            }
        }
    }

    /// `epoll_ctl` for a carried socket: `Some(result)` if handled here,
    /// `None` to pass to the kernel.
    ///
    /// # Safety
    /// `ev` is null or a readable event.
    pub unsafe fn ctl(&self, op: c_int, fd: c_int, ev: *const epoll_event) -> Option<c_int> {
        let mut sh = self.shadow.lock().unwrap_or_else(|e| e.into_inner());
        // The kernel forgets a closed file's registrations: so does the
        // shadow list (the descriptor may name another socket by now).
        self.forget_closed(&mut sh);
        let pos = sh.iter().position(|s| s.fd == fd);
        let sock = crate::table::sock(fd).filter(|s| !s.is_pass());
        let read_ev = || -> Option<(u32, u64)> {
            if ev.is_null() {
                return None;
            }
            // SAFETY: the caller's event, non-null.
            let e = unsafe { std::ptr::read_unaligned(ev) };
            Some((e.events, e.u64))
        };
        let r = match (op, pos, sock) {
            (libc::EPOLL_CTL_ADD, Some(_), _) => Some(Err(libc::EEXIST)),
            (libc::EPOLL_CTL_ADD, None, Some(sock)) => match read_ev() {
                None => Some(Err(libc::EFAULT)),
                Some((events, data)) => {
                    sh.push(Shadow {
                        fd,
                        sock,
                        events,
                        data,
                        disabled: false,
                        last_gen: None,
                        q_reg: None,
                        scanned_gen: None,
                        was_ready: false,
                    });
                    Some(Ok(()))
                }
            },
            (libc::EPOLL_CTL_MOD, Some(i), _) => match read_ev() {
                None => Some(Err(libc::EFAULT)),
                Some((events, data)) => {
                    let s = &mut sh[i];
                    s.events = events;
                    s.data = data;
                    s.disabled = false;
                    s.last_gen = None;
                    s.scanned_gen = None;
                    Some(Ok(()))
                }
            },
            (libc::EPOLL_CTL_DEL, Some(i), _) => {
                let s = sh.remove(i);
                if let Some((wfd, _)) = s.q_reg {
                    let q = self.q.load(Ordering::Acquire);
                    // SAFETY: removing our own registration.
                    unsafe {
                        (real().epoll_ctl)(q, libc::EPOLL_CTL_DEL, wfd, std::ptr::null_mut())
                    };
                }
                Some(Ok(()))
            }
            _ => None,
        };
        self.any.store(!sh.is_empty(), Ordering::Release);
        r.map(|r| match r {
            Ok(()) => 0,
            Err(e) => {
                set_errno(e);
                -1
            }
        })
    }

    /// Adds a socket softrdma just took to the shadow list (its kernel
    /// registration is gone).
    pub fn shadow_add(&self, fd: c_int, sock: Arc<Sock>, events: u32, data: u64) {
        let mut sh = self.shadow.lock().unwrap_or_else(|e| e.into_inner());
        sh.retain(|s| s.fd != fd);
        sh.push(Shadow {
            fd,
            sock,
            events,
            data,
            disabled: false,
            last_gen: None,
            q_reg: None,
            scanned_gen: None,
            was_ready: false,
        });
        self.any.store(true, Ordering::Release);
    }

    fn forget_closed(&self, sh: &mut Vec<Shadow>) {
        let q = self.q.load(Ordering::Acquire);
        sh.retain(|s| {
            let live = !s.sock.is_closed()
                && crate::table::sock(s.fd).is_some_and(|t| Arc::ptr_eq(&t, &s.sock));
            if !live {
                if let (Some((wfd, _)), true) = (s.q_reg, q >= 0) {
                    // SAFETY: removing our own registration.
                    unsafe {
                        (real().epoll_ctl)(q, libc::EPOLL_CTL_DEL, wfd, std::ptr::null_mut())
                    };
                }
            }
            live
        });
    }

    /// Reports ready shadowed sockets into `out`; moves sockets that
    /// turned plain into the kernel set. With `register`, brings each
    /// socket's wake-up descriptor in the private set up to date.
    ///
    /// `hints`: the sockets whose wake-up descriptors hold (from the
    /// private set); with them, only those, the ones that changed, were
    /// ready or are not registered yet are looked at (`None`: all).
    fn scan(&self, out: &mut [epoll_event], register: bool, hints: Option<&[c_int]>) -> usize {
        let mut sh = self.shadow.lock().unwrap_or_else(|e| e.into_inner());
        self.forget_closed(&mut sh);
        let mut n = 0;
        let q = if register { self.q() } else { -1 };
        let mut i = 0;
        while i < sh.len() {
            if sh[i].sock.is_pass() {
                let s = sh.remove(i);
                if let Some((wfd, _)) = s.q_reg {
                    let qq = self.q.load(Ordering::Acquire);
                    // SAFETY: removing our own registration.
                    unsafe {
                        (real().epoll_ctl)(qq, libc::EPOLL_CTL_DEL, wfd, std::ptr::null_mut())
                    };
                }
                let mut ev = epoll_event {
                    events: s.events,
                    u64: s.data,
                };
                // SAFETY: registering the application's socket in its own set.
                if unsafe { (real().epoll_ctl)(self.epfd, libc::EPOLL_CTL_ADD, s.fd, &mut ev) } == 0
                {
                    s.sock
                        .note_kernel_epoll(self.epfd, libc::EPOLL_CTL_ADD, s.events, s.data);
                }
                continue;
            }
            let s = &mut sh[i];
            i += 1;
            if s.disabled {
                continue;
            }
            if let Some(h) = hints {
                let quiet = s.q_reg.is_some()
                    && !s.was_ready
                    && s.scanned_gen == Some(s.sock.gen.load(Ordering::Relaxed))
                    && !h.contains(&s.fd);
                if quiet {
                    continue;
                }
            }
            let et = s.events & libc::EPOLLET as u32 != 0;
            let r = s.sock.ready(s.fd);
            let gen = s.sock.gen.load(Ordering::Relaxed);
            s.scanned_gen = Some(gen);
            let mask = (s.events as i16 as i32 | libc::EPOLLERR | libc::EPOLLHUP) as i16;
            let ev = r.events & mask;
            s.was_ready = ev != 0;
            if ev != 0 && n < out.len() && !(et && s.last_gen == Some(gen)) {
                out[n] = epoll_event {
                    events: ev as u16 as u32,
                    u64: s.data,
                };
                n += 1;
                s.last_gen = Some(gen);
                if s.events & libc::EPOLLONESHOT as u32 != 0 {
                    s.disabled = true;
                }
            }
            if register && q >= 0 {
                let want = r.wait.map(|(fd, e)| (fd, e as u16 as u32));
                if want != s.q_reg {
                    // SAFETY: our own private set and the sockets' own
                    // wake-up descriptors.
                    unsafe {
                        if let Some((old, _)) = s.q_reg {
                            (real().epoll_ctl)(q, libc::EPOLL_CTL_DEL, old, std::ptr::null_mut());
                        }
                        if let Some((fd, e)) = want {
                            let mut ev = epoll_event {
                                events: e,
                                u64: s.fd as u64,
                            };
                            (real().epoll_ctl)(q, libc::EPOLL_CTL_ADD, fd, &mut ev);
                        }
                    }
                    s.q_reg = want;
                }
            }
        }
        self.any.store(!sh.is_empty(), Ordering::Release);
        n
    }

    /// `epoll_wait`/`epoll_pwait`.
    ///
    /// # Safety
    /// `out` points to `max` writable events; `sigmask` is null or valid.
    pub unsafe fn wait(
        &self,
        out: *mut epoll_event,
        max: c_int,
        timeout_ms: c_int,
        sigmask: *const libc::sigset_t,
    ) -> c_int {
        // SAFETY: forwarding the application's arguments.
        let kernel = |o: *mut epoll_event, m: c_int, t: c_int| unsafe {
            if sigmask.is_null() {
                (real().epoll_wait)(self.epfd, o, m, t)
            } else {
                (real().epoll_pwait)(self.epfd, o, m, t, sigmask)
            }
        };
        if !self.any.load(Ordering::Acquire) || max <= 0 {
            return kernel(out, max, timeout_ms);
        }
        // SAFETY: the caller's array of `max` events.
        let outs = unsafe { std::slice::from_raw_parts_mut(out, max as usize) };
        let deadline = deadline_of(timeout_ms);
        loop {
            let hints = self.hints();
            let n = self.scan(outs, false, hints.as_deref());
            if (n as c_int) < max {
                // SAFETY: the rest of the caller's array.
                let m = kernel(unsafe { out.add(n) }, max - n as c_int, 0);
                if m < 0 && n == 0 {
                    return m;
                }
                if m > 0 {
                    return n as c_int + m;
                }
            }
            if n > 0 || timeout_ms == 0 {
                return n as c_int;
            }
            // Register the wake-up descriptors (level-triggered: one
            // that holds wakes the wait at once), looking once more.
            let n = self.scan(outs, true, hints.as_deref());
            if n > 0 {
                return n as c_int;
            }
            let q = self.q();
            let mut evs = [epoll_event { events: 0, u64: 0 }; 16];
            let t = remaining_ms(deadline);
            // SAFETY: our private set and a local array.
            let r = unsafe {
                if sigmask.is_null() {
                    (real().epoll_wait)(q, evs.as_mut_ptr(), 16, t)
                } else {
                    (real().epoll_pwait)(q, evs.as_mut_ptr(), 16, t, sigmask)
                }
            };
            if r < 0 {
                let e = errno();
                set_errno(e);
                return -1;
            }
            if r == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                return 0;
            }
        }
    }

    /// The sockets whose wake-up descriptors hold now, asked of the
    /// private set without waiting; `None` (look at every socket) before
    /// the set exists or when more hold than one call returns.
    fn hints(&self) -> Option<Vec<c_int>> {
        let q = self.q.load(Ordering::Acquire);
        if q < 0 {
            return None;
        }
        const CAP: usize = 256;
        let mut evs = [epoll_event { events: 0, u64: 0 }; CAP];
        // SAFETY: our private set and a local array.
        let r = unsafe { (real().epoll_wait)(q, evs.as_mut_ptr(), CAP as c_int, 0) };
        if r < 0 || r as usize == CAP {
            return None;
        }
        Some(
            evs[..r as usize]
                .iter()
                .filter(|e| e.u64 != Q_APP)
                .map(|e| e.u64 as c_int)
                .collect(),
        )
    }

    /// Closes the private set (the application closed its set).
    pub fn close(&self) {
        let q = self.q.swap(-1, Ordering::AcqRel);
        if q >= 0 {
            // SAFETY: our own descriptor.
            unsafe { (real().close)(q) };
        }
    }
}
