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

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use libc::{c_int, epoll_event, pollfd};

use crate::real::real;
use crate::sock::{Ready, Sock};

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

/// Whether a blocking socket call interrupted by a signal handler
/// restarts (`SA_RESTART`) rather than failing with `EINTR`. softrdma's
/// blocking calls sleep in `poll`, which every handled signal interrupts,
/// and the signal that fired cannot be told apart: the call restarts when
/// every caught asynchronous signal's handler was installed with
/// `SA_RESTART`, and fails with `EINTR` when some handler was not (a
/// program that wants `EINTR` from one signal gets it). Fault signals are
/// left out: they do not arrive while a thread sleeps in a system call.
/// `poll`, `select` and `epoll_wait` themselves never restart, as in the
/// kernel.
pub fn signal_restarts() -> bool {
    let faults = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];
    !(1..libc::SIGRTMAX())
        .filter(|s| !faults.contains(s))
        .any(|sig| {
            // SAFETY: all-zero is a valid sigaction to be filled in.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: queries only (no new action); `old` is a live out-struct.
            let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
            r == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
                && old.sa_flags & libc::SA_RESTART == 0
        })
}

const ALWAYS: i16 = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;

/// What `poll` asks softrdma about rather than the kernel: a carried
/// socket, or an epoll set holding carried sockets or nested sets (an
/// epoll descriptor is readable when a wait on it would report something).
fn polled(fd: c_int) -> Option<Target> {
    if let Some(s) = crate::table::sock_if(fd, |s| !s.is_pass()) {
        return Some(Target::Sock(s));
    }
    match crate::table::get(fd).as_deref() {
        Some(crate::table::Obj::Epoll(e)) if e.has_shadow() => Some(Target::Set(e.clone())),
        _ => None,
    }
}

/// `poll`/`ppoll` over `fds`; `block(fds, timeout_ms)` is the kernel's
/// call (with the caller's signal mask for `ppoll`).
pub fn poll(
    fds: &mut [pollfd],
    timeout_ms: c_int,
    block: &dyn Fn(&mut [pollfd], c_int) -> c_int,
) -> c_int {
    let carried: Vec<(usize, Target)> = fds
        .iter()
        .enumerate()
        .filter_map(|(i, p)| polled(p.fd).map(|t| (i, t)))
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
        if member && polled(fd).is_some() {
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

/// What a shadow entry watches: a socket softrdma carries, or an epoll set
/// registered in this one (a nested set).
#[derive(Clone)]
enum Target {
    Sock(Arc<Sock>),
    Set(Arc<EpollSet>),
}

impl Target {
    fn is_closed(&self) -> bool {
        match self {
            Target::Sock(s) => s.is_closed(),
            Target::Set(e) => e.closed.load(Ordering::Acquire),
        }
    }

    fn is_pass(&self) -> bool {
        match self {
            Target::Sock(s) => s.is_pass(),
            Target::Set(_) => false,
        }
    }

    /// Bumped whenever the target's readiness may have changed.
    fn gen(&self) -> u64 {
        match self {
            Target::Sock(s) => s.gen.load(Ordering::Relaxed),
            Target::Set(e) => e.gen(),
        }
    }

    fn ready(&self, fd: c_int) -> Ready {
        match self {
            Target::Sock(s) => s.ready(fd),
            Target::Set(e) => e.ready(),
        }
    }

    /// `fd` still names this object.
    fn named_by(&self, fd: c_int) -> bool {
        match self {
            Target::Sock(s) => crate::table::sock_if(fd, |t| std::ptr::eq(t, &**s)).is_some(),
            Target::Set(e) => crate::table::epoll(fd).is_some_and(|t| Arc::ptr_eq(&t, e)),
        }
    }

    /// The descriptor a waiter sleeps on for this target, with the events
    /// of the private registration (`None`: nothing to wait for).
    fn want(&self, wait: Option<(c_int, i16)>, events: u32) -> Option<(c_int, u32)> {
        let (fd, ev) = wait?;
        match self {
            Target::Sock(_) => Some((fd, ev as u16 as u32)),
            // A nested set only ever reports EPOLLIN. An edge-triggered
            // entry waits for the nested set's next wake-up, not for its
            // readiness, which may hold unreported for as long as the
            // application leaves it (a level-triggered wait would spin).
            Target::Set(_) if events & libc::EPOLLIN as u32 == 0 => None,
            Target::Set(_) => Some((fd, ev as u16 as u32 | (events & libc::EPOLLET as u32))),
        }
    }
}

struct Shadow {
    fd: c_int,
    target: Target,
    events: u32,
    data: u64,
    disabled: bool,
    last_gen: Option<u64>,
    /// The wake-up descriptor registered in the private set.
    q_reg: Option<(c_int, u32)>,
    /// The target's generation when last looked at, and whether it was
    /// ready then: a target that has not changed since, was not ready and
    /// whose wake-up descriptor is quiet is not looked at again.
    scanned_gen: Option<u64>,
    was_ready: bool,
}

impl Shadow {
    fn new(fd: c_int, target: Target, events: u32, data: u64) -> Shadow {
        Shadow {
            fd,
            target,
            events,
            data,
            disabled: false,
            last_gen: None,
            q_reg: None,
            scanned_gen: None,
            was_ready: false,
        }
    }
}

/// An application epoll set and its shadow list of carried sockets and
/// nested epoll sets.
#[derive(Debug)]
pub struct EpollSet {
    epfd: c_int,
    /// Private epoll set for blocking (-1 until first needed).
    q: AtomicI32,
    any: AtomicBool,
    shadow: Mutex<Vec<Shadow>>,
    /// Application descriptors naming the set (`dup`).
    fds: AtomicUsize,
    /// The application closed its last descriptor of the set.
    closed: AtomicBool,
    /// Bumped when the set's readiness may have changed in a way its
    /// entries' generations do not show: a registration changed, a wait
    /// reported something, the kernel part turned ready.
    changes: AtomicU64,
    /// The kernel part was ready when last looked at from outside.
    kernel_was_ready: AtomicBool,
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

/// Deletes `fd` from our private set `q`.
fn q_del(q: c_int, fd: c_int) {
    if q >= 0 {
        // SAFETY: removing our own registration.
        unsafe { (real().epoll_ctl)(q, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
    }
}

impl EpollSet {
    /// Shadows the application's epoll set `epfd`.
    pub fn new(epfd: c_int) -> EpollSet {
        EpollSet {
            epfd,
            q: AtomicI32::new(-1),
            any: AtomicBool::new(false),
            shadow: Mutex::new(Vec::new()),
            fds: AtomicUsize::new(1),
            closed: AtomicBool::new(false),
            changes: AtomicU64::new(0),
            kernel_was_ready: AtomicBool::new(false),
        }
    }

    /// True while the set holds carried sockets or nested sets (its
    /// readiness is then not the kernel's alone).
    pub fn has_shadow(&self) -> bool {
        self.any.load(Ordering::Acquire)
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

    /// `epoll_ctl` for a carried socket or a nested epoll set:
    /// `Some(result)` if handled here, `None` to pass to the kernel.
    ///
    /// # Safety
    /// `ev` is null or a readable event.
    pub unsafe fn ctl(&self, op: c_int, fd: c_int, ev: *const epoll_event) -> Option<c_int> {
        let mut sh = self.shadow.lock().unwrap_or_else(|e| e.into_inner());
        // The kernel forgets a closed file's registrations: so does the
        // shadow list (the descriptor may name another object by now).
        self.forget_closed(&mut sh, true);
        let pos = sh.iter().position(|s| s.fd == fd);
        let target = match crate::table::get(fd).as_deref() {
            Some(crate::table::Obj::Sock(s)) if !s.is_pass() => Some(Target::Sock(s.clone())),
            Some(crate::table::Obj::Epoll(e)) => Some(Target::Set(e.clone())),
            _ => None,
        };
        let read_ev = || -> Option<(u32, u64)> {
            if ev.is_null() {
                return None;
            }
            // SAFETY: the caller's event, non-null.
            let e = unsafe { std::ptr::read_unaligned(ev) };
            Some((e.events, e.u64))
        };
        let r = match (op, pos, target) {
            (libc::EPOLL_CTL_ADD, Some(_), _) => Some(Err(libc::EEXIST)),
            (libc::EPOLL_CTL_ADD, None, Some(Target::Sock(sock))) => match read_ev() {
                None => Some(Err(libc::EFAULT)),
                Some((events, data)) => {
                    sh.push(Shadow::new(fd, Target::Sock(sock), events, data));
                    Some(Ok(()))
                }
            },
            (libc::EPOLL_CTL_ADD, None, Some(Target::Set(inner))) => match read_ev() {
                None => Some(Err(libc::EFAULT)),
                Some((events, data)) => Some(self.add_set(fd, &inner, events).map(|reg| {
                    let mut s = Shadow::new(fd, Target::Set(inner), events, data);
                    s.q_reg = Some(reg);
                    sh.push(s);
                })),
            },
            (libc::EPOLL_CTL_MOD, Some(i), _) => match read_ev() {
                None => Some(Err(libc::EFAULT)),
                Some((events, _)) if events & libc::EPOLLEXCLUSIVE as u32 != 0 => {
                    Some(Err(libc::EINVAL))
                }
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
                    q_del(self.q.load(Ordering::Acquire), wfd);
                }
                if let Target::Set(_) = s.target {
                    // The kernel's silent entry (see `add_set`).
                    // SAFETY: the application's registration, removed as asked.
                    unsafe {
                        (real().epoll_ctl)(self.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut())
                    };
                }
                Some(Ok(()))
            }
            _ => None,
        };
        if matches!(r, Some(Ok(()))) {
            self.changes.fetch_add(1, Ordering::Relaxed);
        }
        self.any.store(!sh.is_empty(), Ordering::Release);
        r.map(|r| match r {
            Ok(()) => 0,
            Err(e) => {
                set_errno(e);
                -1
            }
        })
    }

    /// Registers the nested set `inner` (descriptor `fd`): the kernel set
    /// gets an entry that never reports (an epoll file is only ever
    /// readable, and the entry asks for nothing), so the kernel's own
    /// checks hold — a set in itself (`EINVAL`), a loop or a nesting too
    /// deep (`ELOOP`), `EPOLLEXCLUSIVE` (`EINVAL`) — and forgets the entry
    /// when the nested set's file closes. This set's private set then
    /// waits on the nested set's private set, which holds the nested
    /// set's kernel part and its sockets' wake-up descriptors; that chain
    /// is one epoll file longer than the application's, so the kernel
    /// refuses it (`ELOOP`) one level before the application's own
    /// nesting limit. Returns the private registration.
    fn add_set(
        &self,
        fd: c_int,
        inner: &Arc<EpollSet>,
        events: u32,
    ) -> Result<(c_int, u32), c_int> {
        let mut kev = epoll_event {
            events: events & libc::EPOLLEXCLUSIVE as u32,
            u64: 0,
        };
        // SAFETY: the application's descriptors, in its own set.
        if unsafe { (real().epoll_ctl)(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut kev) } != 0 {
            return Err(errno());
        }
        let undo = |e: c_int| {
            // SAFETY: removing the entry just added.
            unsafe { (real().epoll_ctl)(self.epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
            e
        };
        let (q, iq) = (self.q(), inner.q());
        if q < 0 || iq < 0 {
            return Err(undo(libc::ENOMEM));
        }
        let reg = (iq, libc::EPOLLIN as u32 | (events & libc::EPOLLET as u32));
        let mut pev = epoll_event {
            events: reg.1,
            u64: fd as u64,
        };
        // SAFETY: our private sets.
        if unsafe { (real().epoll_ctl)(q, libc::EPOLL_CTL_ADD, iq, &mut pev) } != 0 {
            return Err(undo(errno()));
        }
        Ok(reg)
    }

    /// Adds a socket softrdma just took to the shadow list (its kernel
    /// registration is gone).
    pub fn shadow_add(&self, fd: c_int, sock: Arc<Sock>, events: u32, data: u64) {
        let mut sh = self.shadow.lock().unwrap_or_else(|e| e.into_inner());
        let q = self.q.load(Ordering::Acquire);
        sh.retain(|s| {
            if s.fd == fd {
                if let Some((wfd, _)) = s.q_reg {
                    q_del(q, wfd);
                }
            }
            s.fd != fd
        });
        sh.push(Shadow::new(fd, Target::Sock(sock), events, data));
        self.changes.fetch_add(1, Ordering::Relaxed);
        self.any.store(true, Ordering::Release);
    }

    /// Drops entries of closed sockets and sets; with `names`, also those
    /// whose descriptor now names another object (`epoll_ctl` looks, a
    /// wait only checks closing, which costs no table lookup).
    fn forget_closed(&self, sh: &mut Vec<Shadow>, names: bool) {
        let q = self.q.load(Ordering::Acquire);
        sh.retain(|s| {
            let closed = s.target.is_closed();
            let live = !closed && (!names || s.target.named_by(s.fd));
            if !live {
                // A closed nested set's private set is closed too (the
                // kernel dropped its registration; its number may name
                // another file by now).
                let gone = closed && matches!(s.target, Target::Set(_));
                if let (Some((wfd, _)), false) = (s.q_reg, gone) {
                    q_del(q, wfd);
                }
            }
            live
        });
    }

    /// Looks at the shadow list: reports ready entries into `out` (`None`:
    /// only counts the entries a wait would report, changing nothing the
    /// application sees); moves sockets that turned plain into the kernel
    /// set. With `register`, brings each entry's wake-up descriptor in the
    /// private set up to date.
    ///
    /// `hints`: the entries whose wake-up descriptors hold (from the
    /// private set); with them, only those, the ones that changed, were
    /// ready or are not registered yet are looked at (`None`: all).
    fn scan(
        &self,
        mut out: Option<&mut [epoll_event]>,
        register: bool,
        hints: Option<&[c_int]>,
    ) -> usize {
        let mut sh = self.shadow.lock().unwrap_or_else(|e| e.into_inner());
        self.forget_closed(&mut sh, false);
        let mut n = 0;
        let q = if register { self.q() } else { -1 };
        let mut i = 0;
        while i < sh.len() {
            if sh[i].target.is_pass() {
                let s = sh.remove(i);
                if let Some((wfd, _)) = s.q_reg {
                    q_del(self.q.load(Ordering::Acquire), wfd);
                }
                let mut ev = epoll_event {
                    events: s.events,
                    u64: s.data,
                };
                // SAFETY: registering the application's socket in its own set.
                if unsafe { (real().epoll_ctl)(self.epfd, libc::EPOLL_CTL_ADD, s.fd, &mut ev) } == 0
                {
                    if let Target::Sock(sock) = &s.target {
                        sock.note_kernel_epoll(self.epfd, libc::EPOLL_CTL_ADD, s.events, s.data);
                    }
                }
                continue;
            }
            let s = &mut sh[i];
            i += 1;
            if s.disabled {
                // A one-shot entry that fired waits for `EPOLL_CTL_MOD`:
                // its wake-up descriptor would only keep the wait busy.
                if let (true, Some((wfd, _))) = (register && q >= 0, s.q_reg) {
                    q_del(q, wfd);
                    s.q_reg = None;
                }
                continue;
            }
            if let Some(h) = hints {
                let quiet = s.q_reg.is_some()
                    && !s.was_ready
                    && s.scanned_gen == Some(s.target.gen())
                    && !h.contains(&s.fd);
                if quiet {
                    continue;
                }
            }
            let et = s.events & libc::EPOLLET as u32 != 0;
            let r = s.target.ready(s.fd);
            let gen = s.target.gen();
            s.scanned_gen = Some(gen);
            let mask = (s.events as i16 as i32 | libc::EPOLLERR | libc::EPOLLHUP) as i16;
            let ev = r.events & mask;
            s.was_ready = ev != 0;
            let fresh = ev != 0 && !(et && s.last_gen == Some(gen));
            match out.as_deref_mut() {
                Some(out) if fresh && n < out.len() => {
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
                None if fresh => n += 1,
                _ => {}
            }
            if register && q >= 0 {
                let want = s.target.want(r.wait, s.events);
                if want != s.q_reg {
                    // SAFETY: our own private set and the targets' own
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

    /// The set's generation as an entry of another set: its own changes
    /// plus its entries' generations.
    fn gen(&self) -> u64 {
        let sh = self.shadow.lock().unwrap_or_else(|e| e.into_inner());
        sh.iter()
            .fold(self.changes.load(Ordering::Relaxed), |g, s| {
                g.wrapping_add(s.target.gen())
            })
    }

    /// The set's readiness as a descriptor (in `poll`/`select`, or as an
    /// entry of another set): readable when a wait on it would report
    /// something — a shadowed entry, or its kernel part. The wake-up
    /// descriptor is the private set, whose registrations this brings up
    /// to date: it holds the kernel part and every entry's wake-up
    /// descriptor.
    pub fn ready(&self) -> Ready {
        let (kernel, hints) = match self.hints() {
            Some((k, h)) => (Some(k), Some(h)),
            None => (None, None),
        };
        let n = self.scan(None, true, hints.as_deref());
        let kernel = kernel.unwrap_or_else(|| {
            let mut p = pollfd {
                fd: self.epfd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, no waiting.
            unsafe { (real().poll)(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 }
        });
        if kernel && !self.kernel_was_ready.load(Ordering::Relaxed) {
            self.changes.fetch_add(1, Ordering::Relaxed);
        }
        self.kernel_was_ready.store(kernel, Ordering::Relaxed);
        let q = self.q();
        Ready {
            events: if n > 0 || kernel { libc::POLLIN } else { 0 },
            wait: (q >= 0).then_some((q, libc::POLLIN)),
        }
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
        let r = self.wait_shadowed(out, max, timeout_ms, sigmask, &kernel);
        if r > 0 {
            // What was reported may no longer be (edge-triggered and
            // one-shot entries, the kernel's): a set holding this one
            // looks again.
            self.changes.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn wait_shadowed(
        &self,
        out: *mut epoll_event,
        max: c_int,
        timeout_ms: c_int,
        sigmask: *const libc::sigset_t,
        kernel: &dyn Fn(*mut epoll_event, c_int, c_int) -> c_int,
    ) -> c_int {
        // SAFETY: the caller's array of `max` events.
        let outs = unsafe { std::slice::from_raw_parts_mut(out, max as usize) };
        let deadline = deadline_of(timeout_ms);
        // What the last sleep returned: an edge-triggered registration (a
        // nested set's) reports its wake-up once, there and not to the
        // next look.
        let mut woke: Vec<c_int> = Vec::new();
        loop {
            let hints = self.hints().map(|(_, mut h)| {
                h.append(&mut woke);
                h
            });
            let n = self.scan(Some(&mut *outs), false, hints.as_deref());
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
            let n = self.scan(Some(&mut *outs), true, hints.as_deref());
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
            woke.clear();
            woke.extend(
                evs[..r as usize]
                    .iter()
                    .filter(|e| e.u64 != Q_APP)
                    .map(|e| e.u64 as c_int),
            );
            if r == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                return 0;
            }
        }
    }

    /// Asks the private set, without waiting, what holds now: whether the
    /// application's (kernel) set is readable, and the entries whose
    /// wake-up descriptors hold. `None` (look at every entry) before the
    /// private set exists or when more hold than one call returns.
    fn hints(&self) -> Option<(bool, Vec<c_int>)> {
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
        let evs = &evs[..r as usize];
        Some((
            evs.iter().any(|e| e.u64 == Q_APP),
            evs.iter()
                .filter(|e| e.u64 != Q_APP)
                .map(|e| e.u64 as c_int)
                .collect(),
        ))
    }

    /// Another application descriptor names the set (`dup`).
    pub fn add_fd(&self) {
        self.fds.fetch_add(1, Ordering::Relaxed);
    }

    /// The application closed one of its descriptors of the set; at the
    /// last, the private set is closed.
    pub fn close_fd(&self) {
        if self.fds.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.closed.store(true, Ordering::Release);
        let q = self.q.swap(-1, Ordering::AcqRel);
        if q >= 0 {
            // SAFETY: our own descriptor.
            unsafe { (real().close)(q) };
        }
    }
}
