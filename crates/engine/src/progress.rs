//! The per-context progress thread: one epoll loop over every connected
//! QP's socket and every datagram socket, plus the context's timers. It
//! makes receive progress (placement, Read Responses, completions) when
//! the application is not polling, resumes transmit when a socket that
//! pushed back becomes writable, and runs the protocol timers (datagram
//! reassembly, Write-Record partial timeouts, RD retransmission) when
//! they are due, whether or not anybody polls.
//!
//! What the thread drives is a [`Source`]: an RC QP, a datagram socket, or
//! a datagram QP (timers only), registered under a token.
//!
//! Timers: [`Progress::set_timer`] arms one deadline per token (a later
//! call replaces it), kept in a min-heap with lazy deletion. The thread
//! sleeps in `epoll_wait` until the nearest deadline (rounded up to the
//! next millisecond, capped at one second), then calls
//! [`Source::on_timer`] of every token whose deadline has passed (the
//! deadline is disarmed first; the source re-arms what it still needs).
//! Arming a deadline earlier than the one the thread sleeps until wakes it
//! (one eventfd write); any other arming costs no syscall.
//!
//! Busy-poll parking ([`Parking`]): while an application busy-polls a CQ
//! (inline progress, [`crate::Cq::poll`]), the thread would still wake for
//! every inbound message and fight the poller for the socket and, on a
//! small machine, for the CPU. A source that sees a poller spinning
//! ([`BusyPoll::spinning`]: at least [`SPIN_STREAK`] empty inline polls
//! since the last [`crate::Cq::req_notify`], the latest less than
//! [`SPIN_WINDOW`] ago) when it is woken readable *parks* its descriptor
//! instead of reading it: read interest is dropped (write interest stays,
//! except for an RC QP, whose poller transmits too and which parks write
//! interest as well, woken readable or writable:
//! [`Parking::park_if_spinning_rw`]; with neither, the descriptor leaves
//! the epoll set, because a socket with any waiter pays a wake-up walk
//! for every segment that arrives) and a
//! timer re-checks the poller after [`PARK_RECHECK`], then after twice as
//! long at every re-check that finds it still spinning, up to
//! [`PARK_RECHECK_MAX`] (each re-check wakes the thread, which on a small
//! machine takes a core from a poller for a few microseconds). The
//! descriptor is armed again when the poller has gone quiet (timer) or as
//! soon as anyone arms a CQ the source completes into (`req_notify`, i.e.
//! before blocking on a completion channel). Epoll is level-triggered, so
//! whatever arrived while parked is reported at once on re-arming:
//! nothing is lost, and the longest extra delay for a poller that stops
//! without arming a CQ is about two re-check periods (2 ms after a short
//! spin, 16 ms after one of 15 ms or more).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crate::qp::QpShared;
use crate::sys::{Epoll, EventFd, Interest};

/// Token of the wake-up eventfd.
const WAKE: u64 = u64::MAX;
/// Longest sleep without a timer.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// Something the progress thread drives.
pub(crate) trait Source: Send + Sync {
    /// Its descriptor is readable (or hung up) and/or writable.
    fn on_ready(&self, readable: bool, writable: bool);
    /// As reported by epoll: `hangup` (HUP, ERR, RDHUP) apart from
    /// `readable`. By default a hang-up counts as readable.
    fn on_event(&self, readable: bool, writable: bool, hangup: bool) {
        self.on_ready(readable || hangup, writable)
    }
    /// Its timer is due (`now` is at or after the deadline armed).
    fn on_timer(&self, _now: Instant) {}
}

impl Source for QpShared {
    fn on_ready(&self, readable: bool, writable: bool) {
        QpShared::on_ready(self, readable, writable, false)
    }
    fn on_event(&self, readable: bool, writable: bool, hangup: bool) {
        QpShared::on_ready(self, readable || hangup, writable, hangup)
    }
    fn on_timer(&self, _now: Instant) {
        QpShared::recheck_parked(self)
    }
}

/// Empty inline polls in a row (since the last `req_notify`) from which a
/// poller counts as busy-polling.
pub(crate) const SPIN_STREAK: u32 = 4;
/// A busy poller polled at most this long ago.
pub(crate) const SPIN_WINDOW: Duration = Duration::from_millis(1);
/// An inline poll stamps the clock once per this many polls. Not more: one
/// inline poll of a bandwidth receiver can drain two batches of GRO-merged
/// runs (hundreds of microseconds of placing), and a stamp older than
/// [`SPIN_WINDOW`] would let the progress thread take the socket from a
/// poller that is still there. (32 was tried: it saved ~8 ns a poll, no
/// measurable latency, at that risk.)
const STAMP_EVERY: u32 = 4;
/// How soon a parked descriptor's poller is first looked at again (also
/// the datagram QPs' look-again period for timers a poller runs inline).
pub(crate) const PARK_RECHECK: Duration = Duration::from_millis(1);
/// The longest period between looks at a parked descriptor's poller: the
/// period doubles from [`PARK_RECHECK`] at every look that finds it still
/// spinning, up to this.
pub(crate) const PARK_RECHECK_MAX: Duration = Duration::from_millis(8);

/// Nanoseconds since the first call (a cheap monotonic stamp for atomics).
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Tells whether some thread is busy-polling a source inline (see the
/// module docs). Lock-free; updated by every empty inline poll.
#[derive(Debug, Default)]
pub(crate) struct BusyPoll {
    streak: AtomicU32,
    last_ns: AtomicU64,
}

impl BusyPoll {
    /// An inline poll of the source is about to run (its CQ was empty).
    /// Reads the clock only every [`STAMP_EVERY`] polls: a stamp is at
    /// most that many polls old — microseconds while they find nothing,
    /// but a poll that places a backlog can take hundreds of them, so a
    /// bandwidth receiver's stamp can near [`SPIN_WINDOW`] (then the
    /// progress thread reads the socket too; nothing is lost).
    #[inline]
    pub(crate) fn polled(&self) {
        let s = self.streak.load(Ordering::Relaxed);
        self.streak.store(s.wrapping_add(1), Ordering::Relaxed);
        if s.is_multiple_of(STAMP_EVERY) || s < SPIN_STREAK {
            self.last_ns.store(now_ns(), Ordering::Relaxed);
        }
    }

    /// The poller is active now (after an inline poll that did long work).
    #[inline]
    pub(crate) fn stamp(&self) {
        self.last_ns.store(now_ns(), Ordering::Relaxed);
    }

    /// True if an inline poll stamped the clock within `d` (a poll is
    /// stamped at most [`STAMP_EVERY`] polls late).
    pub(crate) fn polled_within(&self, d: Duration) -> bool {
        let last = self.last_ns.load(Ordering::Relaxed);
        last != 0 && now_ns().saturating_sub(last) < d.as_nanos() as u64
    }

    /// A CQ of the source was armed: whoever polls may block next.
    pub(crate) fn reset(&self) {
        self.streak.store(0, Ordering::Relaxed);
    }

    /// True while a poller spins (enough empty polls, the latest recent).
    pub(crate) fn spinning(&self) -> bool {
        self.streak.load(Ordering::Relaxed) >= SPIN_STREAK
            && now_ns().saturating_sub(self.last_ns.load(Ordering::Relaxed))
                < SPIN_WINDOW.as_nanos() as u64
    }
}

#[derive(Debug, Default)]
struct ParkState {
    /// The descriptor and token while registered.
    fd: Option<(RawFd, u64)>,
    parked: bool,
    /// While parked: write interest is left to the poller too (RC, whose
    /// inline progress transmits; see [`Parking::park_if_spinning_rw`]).
    parked_write: bool,
    write: bool,
    /// The descriptor is in the epoll set (it leaves it while it waits
    /// for nothing: parked, no write interest).
    in_set: bool,
    /// While parked: the period of the re-check timer.
    every: Duration,
    /// Never read interest: the source's user reads the descriptor
    /// ([`Parking::register_quiet`]); only write interest is ever added.
    quiet: bool,
}

/// The epoll interest of one source's descriptor, with busy-poll parking
/// (module docs). Its lock is a leaf: held only around `epoll_ctl`.
#[derive(Debug, Default)]
pub(crate) struct Parking {
    /// Inline pollers' activity.
    pub(crate) busy: BusyPoll,
    st: Mutex<ParkState>,
    /// The registered descriptor (`-1`: none), readable without the lock
    /// ([`Parking::fd`]).
    fd: FdHint,
}

/// A descriptor number readable without a lock; `-1` when none.
#[derive(Debug)]
struct FdHint(AtomicI32);

impl Default for FdHint {
    fn default() -> Self {
        FdHint(AtomicI32::new(-1))
    }
}

impl Parking {
    fn state(&self) -> std::sync::MutexGuard<'_, ParkState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Brings the epoll set in line with `st`. A descriptor that waits for
    /// nothing (parked, no write interest) is taken out of the set rather
    /// than left in it with an empty mask: as long as a socket has any
    /// waiter, every segment that arrives walks its wait queue with
    /// interrupts off (`sock_def_readable`), some 100 ns per message on a
    /// virtual machine — on the sender's side of the critical path, since
    /// loopback delivers inside the sender's system call.
    fn apply(p: &Progress, st: &mut ParkState) -> io::Result<()> {
        let Some((fd, token)) = st.fd else {
            return Ok(());
        };
        let want = Interest {
            read: !st.parked && !st.quiet,
            write: st.write && !st.parked_write,
        };
        match (want.read || want.write, st.in_set) {
            (true, true) => p.epoll.modify(fd, token, want),
            (true, false) => {
                p.epoll.add(fd, token, want)?;
                st.in_set = true;
                Ok(())
            }
            (false, true) => {
                p.epoll.delete(fd);
                st.in_set = false;
                Ok(())
            }
            (false, false) => Ok(()),
        }
    }

    /// Starts watching `fd` (readable) under `token` for `src`.
    pub(crate) fn register<S: Source + 'static>(
        &self,
        p: &Progress,
        fd: RawFd,
        token: u64,
        src: Weak<S>,
    ) -> io::Result<()> {
        let mut st = self.state();
        st.parked = false;
        st.parked_write = false;
        st.write = false;
        p.register(fd, token, src)?;
        st.fd = Some((fd, token));
        st.in_set = true;
        self.fd.0.store(fd, Ordering::Release);
        Ok(())
    }

    /// Makes `src` reachable under `token` with `fd` as its descriptor, but
    /// outside the epoll set: the thread never reads it (a self-driven
    /// datagram socket, whose user reads it and waits on it). Write
    /// interest ([`Parking::watch_write`]) still brings it into the set
    /// while wanted; the token's timer works as for any source.
    pub(crate) fn register_quiet<S: Source + 'static>(
        &self,
        p: &Progress,
        fd: RawFd,
        token: u64,
        src: Weak<S>,
    ) {
        let mut st = self.state();
        st.parked = false;
        st.parked_write = false;
        st.write = false;
        st.quiet = true;
        p.add_source(token, src);
        st.fd = Some((fd, token));
        st.in_set = false;
        self.fd.0.store(fd, Ordering::Release);
    }

    /// The descriptor this source's progress reads, while registered (a
    /// CQ with many sources asks the kernel which of them are readable
    /// instead of reading each: [`crate::Cq::poll`]).
    pub(crate) fn fd(&self) -> Option<RawFd> {
        let fd = self.fd.0.load(Ordering::Acquire);
        (fd >= 0).then_some(fd)
    }

    /// Stops watching (the descriptor is about to be shut down).
    pub(crate) fn unregister(&self, p: &Progress) {
        let mut st = self.state();
        if let Some((fd, token)) = st.fd.take() {
            self.fd.0.store(-1, Ordering::Release);
            // Out of the set already or not, the token is forgotten.
            p.unregister(fd, token);
            st.in_set = false;
        }
    }

    /// Adds or removes interest in writability.
    pub(crate) fn watch_write(&self, p: &Progress, write: bool) -> io::Result<()> {
        let mut st = self.state();
        if st.write == write {
            return Ok(());
        }
        st.write = write;
        Self::apply(p, &mut st)
    }

    /// From the progress thread, woken readable: if a poller spins, drops
    /// read interest and arms the re-check timer; true if parked (the
    /// caller then leaves the descriptor to the poller).
    pub(crate) fn park_if_spinning(&self, p: &Progress) -> bool {
        self.park(p, false)
    }

    /// [`Parking::park_if_spinning`] for a source whose inline progress
    /// also transmits whatever it has queued (an RC QP): woken readable or
    /// writable, it parks read and write interest both, so a bulk sender's
    /// poller is not joined by this thread at every `EPOLLOUT` (on a small
    /// machine it took a core from a poller and the QP lock from the
    /// sender at each wake-up). Write interest returns with read interest.
    pub(crate) fn park_if_spinning_rw(&self, p: &Progress) -> bool {
        self.park(p, true)
    }

    fn park(&self, p: &Progress, writes: bool) -> bool {
        if !self.busy.spinning() {
            return false;
        }
        let mut st = self.state();
        let Some((_, token)) = st.fd else {
            return false;
        };
        if !st.parked || (writes && !st.parked_write) {
            let was = (st.parked, st.parked_write);
            st.parked = true;
            st.parked_write |= writes;
            if Self::apply(p, &mut st).is_err() {
                (st.parked, st.parked_write) = was;
                return false;
            }
            if !was.0 {
                st.every = PARK_RECHECK;
            }
        }
        p.set_timer(token, Instant::now() + st.every);
        true
    }

    /// From the progress thread's timer: re-arms read interest unless the
    /// poller still spins (then looks again later).
    pub(crate) fn recheck(&self, p: &Progress) {
        let mut st = self.state();
        let Some((_, token)) = st.fd else { return };
        if !st.parked {
            return;
        }
        if self.busy.spinning() {
            // Each look wakes this thread, and on a machine whose cores
            // the pollers fill it takes one from them for some
            // microseconds (1 000 looks a second showed as a 64 B
            // ping-pong's p99 at 3-4 times its p50): a poller that keeps
            // spinning is looked at less and less often.
            st.every = (st.every * 2).clamp(PARK_RECHECK, PARK_RECHECK_MAX);
            p.set_timer(token, Instant::now() + st.every);
            return;
        }
        st.parked = false;
        st.parked_write = false;
        let _ = Self::apply(p, &mut st);
    }

    /// A CQ of the source was armed (someone may block on it): counts the
    /// poller as idle and re-arms read interest at once.
    pub(crate) fn notify_armed<'p>(&self, progress: impl FnOnce() -> io::Result<&'p Progress>) {
        self.busy.reset();
        let mut st = self.state();
        let Some((_, token)) = st.fd else { return };
        if !st.parked {
            return;
        }
        // Registered, so the thread exists: this does not start one.
        let Ok(p) = progress() else { return };
        let was = st.parked_write;
        st.parked = false;
        st.parked_write = false;
        if Self::apply(p, &mut st).is_err() {
            st.parked = true;
            st.parked_write = was;
            return;
        }
        p.cancel_timer(token);
    }
}

type Sources = Mutex<HashMap<u64, Weak<dyn Source>>>;

/// The deadlines, and what the thread is sleeping until.
#[derive(Debug, Default)]
struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    /// The deadline in force per token; heap entries that disagree are
    /// stale and skipped.
    armed: HashMap<u64, Instant>,
    /// `Some(t)`: the thread sleeps until `t` at the latest; `None`: it
    /// is awake and will look at the heap before it sleeps again.
    sleeping_until: Option<Instant>,
}

impl Timers {
    /// Drops stale entries at the top; the nearest live deadline.
    fn nearest(&mut self) -> Option<Instant> {
        while let Some(&Reverse((at, token))) = self.heap.peek() {
            if self.armed.get(&token) == Some(&at) {
                return Some(at);
            }
            self.heap.pop();
        }
        None
    }

    /// Rebuilds the heap when stale entries dominate (bounded memory).
    fn compact(&mut self) {
        if self.heap.len() > 2 * self.armed.len() + 64 {
            self.heap = self
                .armed
                .iter()
                .map(|(&t, &at)| Reverse((at, t)))
                .collect();
        }
    }
}

/// Handle to the progress thread. Dropping it (with the context that owns
/// it) stops the thread and waits for it to end, so its epoll set and
/// eventfd are closed and no thread outlives its context.
#[derive(Debug)]
pub struct Progress {
    epoll: Arc<Epoll>,
    wake: Arc<EventFd>,
    sources: Arc<Sources>,
    timers: Arc<Mutex<Timers>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.wake.signal();
        if let Some(h) = self.thread.take() {
            // The last reference to a context can go away on the progress
            // thread itself (a source it holds for a callback); it ends by
            // itself then, on its next wake-up, which the signal above is.
            if h.thread().id() != thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

impl Progress {
    /// Starts the thread.
    pub(crate) fn start() -> io::Result<Progress> {
        let epoll = Arc::new(Epoll::new()?);
        let wake = Arc::new(EventFd::new()?);
        epoll.add(
            wake.as_raw_fd(),
            WAKE,
            Interest {
                read: true,
                write: false,
            },
        )?;
        let sources: Arc<Sources> = Arc::new(Mutex::new(HashMap::new()));
        let timers = Arc::new(Mutex::new(Timers {
            heap: BinaryHeap::with_capacity(256),
            armed: HashMap::with_capacity(256),
            sleeping_until: None,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (e, w, q, t, s) = (
            epoll.clone(),
            wake.clone(),
            sources.clone(),
            timers.clone(),
            stop.clone(),
        );
        let thread = thread::Builder::new()
            .name("softrdma-progress".into())
            .spawn(move || run(&e, &w, &q, &t, &s))?;
        Ok(Progress {
            epoll,
            wake,
            sources,
            timers,
            stop,
            thread: Some(thread),
        })
    }

    /// Watches `fd` for `src` under `token`.
    pub(crate) fn register<S: Source + 'static>(
        &self,
        fd: RawFd,
        token: u64,
        src: Weak<S>,
    ) -> io::Result<()> {
        self.add_source(token, src);
        self.epoll.add(
            fd,
            token,
            Interest {
                read: true,
                write: false,
            },
        )
    }

    /// Makes `src` reachable under `token` without a descriptor (for
    /// timers).
    pub(crate) fn add_source<S: Source + 'static>(&self, token: u64, src: Weak<S>) {
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token, src as Weak<dyn Source>);
    }

    /// Forgets `token` and its timer.
    pub(crate) fn remove_source(&self, token: u64) {
        self.cancel_timer(token);
        self.sources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&token);
    }

    /// Stops watching.
    pub(crate) fn unregister(&self, fd: RawFd, token: u64) {
        self.epoll.delete(fd);
        self.remove_source(token);
        self.wake.signal();
    }

    /// Arms `token`'s timer for `at`, replacing the one armed before.
    pub(crate) fn set_timer(&self, token: u64, at: Instant) {
        let mut t = self.timers.lock().unwrap_or_else(|p| p.into_inner());
        if t.armed.insert(token, at) == Some(at) {
            return;
        }
        t.heap.push(Reverse((at, token)));
        t.compact();
        if t.sleeping_until.is_some_and(|s| at < s) {
            // The thread would sleep past this deadline: wake it once.
            t.sleeping_until = None;
            drop(t);
            self.wake.signal();
        }
    }

    /// Disarms `token`'s timer.
    pub(crate) fn cancel_timer(&self, token: u64) {
        let mut t = self.timers.lock().unwrap_or_else(|p| p.into_inner());
        t.armed.remove(&token);
    }
}

fn lookup(sources: &Sources, token: u64) -> Option<Arc<dyn Source>> {
    let mut map = sources.lock().unwrap_or_else(|p| p.into_inner());
    let s = map.get(&token).and_then(|w| w.upgrade());
    if s.is_none() {
        map.remove(&token);
    }
    s
}

fn run(
    epoll: &Epoll,
    wake: &EventFd,
    sources: &Sources,
    timers: &Mutex<Timers>,
    stop: &AtomicBool,
) {
    let mut evs = [(0u64, false, false, false); 64];
    let mut due: Vec<u64> = Vec::with_capacity(64);
    loop {
        let timeout_ms = {
            let mut t = timers.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let until = t
                .nearest()
                .map_or(now + IDLE_WAIT, |d| d.min(now + IDLE_WAIT));
            let wait = until.saturating_duration_since(now);
            // Round up: waking a little late is fine, early would spin.
            let ms = wait.as_nanos().div_ceil(1_000_000) as i32;
            t.sleeping_until = Some(now + Duration::from_millis(ms as u64));
            ms
        };
        let n = match epoll.wait(&mut evs, timeout_ms) {
            Ok(n) => n,
            Err(_) => return,
        };
        if stop.load(Ordering::Acquire) {
            return;
        }
        timers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .sleeping_until = None;
        for &(token, r, w, hup) in &evs[..n] {
            if token == WAKE {
                wake.drain();
                continue;
            }
            if let Some(src) = lookup(sources, token) {
                src.on_event(r, w, hup);
            }
        }
        let now = Instant::now();
        {
            let mut t = timers.lock().unwrap_or_else(|p| p.into_inner());
            while let Some(&Reverse((at, token))) = t.heap.peek() {
                if at > now {
                    break;
                }
                t.heap.pop();
                if t.armed.get(&token) == Some(&at) {
                    t.armed.remove(&token);
                    due.push(token);
                }
            }
        }
        for token in due.drain(..) {
            if let Some(src) = lookup(sources, token) {
                src.on_timer(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nothing;
    impl Source for Nothing {
        fn on_ready(&self, _readable: bool, _writable: bool) {}
    }

    /// Enough empty inline polls for `park`'s poller to count as spinning.
    fn spin(park: &Parking) {
        for _ in 0..=SPIN_STREAK {
            park.busy.polled();
        }
    }

    /// The re-check period of a parked descriptor doubles while its poller
    /// keeps spinning, up to `PARK_RECHECK_MAX`, and starts again from
    /// `PARK_RECHECK` after the descriptor was taken back.
    #[test]
    fn a_spinning_poller_is_looked_at_less_and_less_often() {
        let p = Progress::start().unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let src = Arc::new(Nothing);
        let park = Parking::default();
        park.register(&p, sock.as_raw_fd(), 78, Arc::downgrade(&src))
            .unwrap();
        // Whether `arm` arms the timer `want` ahead: the deadline is the
        // clock read inside the call plus the period, so it lies between
        // `want` after the clock before the call and `want` after it.
        let arms = |arm: &dyn Fn(), want: Duration| {
            let before = Instant::now();
            arm();
            let after = Instant::now();
            let at = p.timers.lock().unwrap().armed[&78];
            (before + want..=after + want).contains(&at)
        };
        let ms = Duration::from_millis;
        spin(&park);
        let first = arms(&|| assert!(park.park_if_spinning(&p)), PARK_RECHECK);
        assert!(first, "first look after 1 ms");
        for want in [2, 4, 8, 8, 8] {
            spin(&park);
            assert!(arms(&|| park.recheck(&p), ms(want)), "then after {want} ms");
        }
        assert_eq!(PARK_RECHECK_MAX, ms(8));
        // Taken back (the poller armed its CQ), parked again: 1 ms.
        park.notify_armed(|| Ok(&p));
        spin(&park);
        let again = arms(&|| assert!(park.park_if_spinning(&p)), PARK_RECHECK);
        assert!(again, "after re-arming: 1 ms again");
        park.unregister(&p);
    }

    /// Dropping the handle ends the thread, which then lets go of its
    /// epoll set and eventfd (before: every context left a thread blocked
    /// in `epoll_wait` forever, with both descriptors open).
    #[test]
    fn dropping_the_handle_ends_the_thread() {
        let p = Progress::start().unwrap();
        let (epoll, wake) = (Arc::downgrade(&p.epoll), Arc::downgrade(&p.wake));
        let src = Arc::new(Nothing);
        p.add_source(5, Arc::downgrade(&src));
        p.set_timer(5, Instant::now() + Duration::from_secs(3600));
        let (tx, rx) = std::sync::mpsc::channel();
        thread::spawn(move || {
            drop(p);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("dropping the handle returned (the thread ended)");
        assert!(epoll.upgrade().is_none(), "the epoll set is closed");
        assert!(wake.upgrade().is_none(), "the eventfd is closed");
    }

    /// The epoll mask `fd` is watched with in `p`'s set, from the kernel's
    /// own listing (`/proc/self/fdinfo`), or `None` if it is not in it.
    fn watched(p: &Progress, fd: RawFd) -> Option<u32> {
        let path = format!("/proc/self/fdinfo/{}", p.epoll.as_raw_fd());
        let info = std::fs::read_to_string(path).expect("fdinfo of the epoll set");
        info.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("tfd:") && w.next()?.parse::<RawFd>().ok()? == fd)
                .then(|| {
                    let mut w = w.skip_while(|x| *x != "events:").skip(1);
                    u32::from_str_radix(w.next()?, 16).ok()
                })
                .flatten()
        })
    }

    const IN: u32 = libc::EPOLLIN as u32;
    const OUT: u32 = libc::EPOLLOUT as u32;

    /// Parking drops read interest; a descriptor left waiting for nothing
    /// leaves the epoll set (no wake-up walk per arriving segment), comes
    /// back for write interest alone, and with read interest when the
    /// poller arms a CQ; unregistering takes it out whatever its state.
    #[test]
    fn a_parked_descriptor_waiting_for_nothing_leaves_the_epoll_set() {
        let p = Progress::start().unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = sock.as_raw_fd();
        let src = Arc::new(Nothing);
        let park = Parking::default();
        park.register(&p, fd, 77, Arc::downgrade(&src)).unwrap();
        assert_eq!(watched(&p, fd).map(|m| m & (IN | OUT)), Some(IN));
        // Nobody spins yet: not parked.
        assert!(!park.park_if_spinning(&p));
        assert_eq!(watched(&p, fd).map(|m| m & (IN | OUT)), Some(IN));
        spin(&park);
        assert!(park.park_if_spinning(&p));
        assert_eq!(watched(&p, fd), None, "parked, nothing to wait for");
        park.watch_write(&p, true).unwrap();
        assert_eq!(watched(&p, fd).map(|m| m & (IN | OUT)), Some(OUT));
        park.watch_write(&p, false).unwrap();
        assert_eq!(watched(&p, fd), None);
        // Still spinning (it polls again — a stamp left from before the
        // checks above may be older than SPIN_WINDOW on a loaded host):
        // parking again changes nothing.
        for _ in 0..STAMP_EVERY {
            park.busy.polled();
        }
        assert!(park.park_if_spinning(&p));
        assert_eq!(watched(&p, fd), None);
        // The poller arms a CQ: read interest is back at once.
        park.notify_armed(|| Ok(&p));
        assert_eq!(watched(&p, fd).map(|m| m & (IN | OUT)), Some(IN));
        // Parked again, then unregistered while out of the set.
        spin(&park);
        assert!(park.park_if_spinning(&p));
        assert_eq!(watched(&p, fd), None);
        park.unregister(&p);
        assert_eq!(watched(&p, fd), None);
        park.notify_armed(|| Ok(&p));
        assert_eq!(watched(&p, fd), None, "unregistered stays out");
    }

    /// An RC source parks write interest too: while its poller spins the
    /// descriptor leaves the set even with write interest, which comes
    /// back with read interest when the poller arms a CQ or, at a
    /// re-check, has stopped; a datagram socket's parking keeps it.
    #[test]
    fn a_transmitting_poller_takes_write_interest_too() {
        let p = Progress::start().unwrap();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = sock.as_raw_fd();
        let src = Arc::new(Nothing);
        let park = Parking::default();
        park.register(&p, fd, 79, Arc::downgrade(&src)).unwrap();
        park.watch_write(&p, true).unwrap();
        assert_eq!(watched(&p, fd).map(|m| m & (IN | OUT)), Some(IN | OUT));
        // Nobody spins: nothing is parked.
        assert!(!park.park_if_spinning_rw(&p));
        assert_eq!(watched(&p, fd).map(|m| m & (IN | OUT)), Some(IN | OUT));
        // Parked for reading only: write interest stays.
        spin(&park);
        assert!(park.park_if_spinning(&p));
        assert_eq!(watched(&p, fd).map(|m| m & (IN | OUT)), Some(OUT));
        // Then for both: out of the set, and write interest changing
        // while parked does not bring it back.
        spin(&park);
        assert!(park.park_if_spinning_rw(&p));
        assert_eq!(watched(&p, fd), None);
        park.watch_write(&p, false).unwrap();
        park.watch_write(&p, true).unwrap();
        assert_eq!(watched(&p, fd), None, "the poller transmits");
        // The poller arms a CQ: both are back at once.
        park.notify_armed(|| Ok(&p));
        assert_eq!(watched(&p, fd).map(|m| m & (IN | OUT)), Some(IN | OUT));
        // Parked for both again; a re-check that finds the poller gone
        // (its CQ armed resets the streak) takes both back too.
        spin(&park);
        assert!(park.park_if_spinning_rw(&p));
        assert_eq!(watched(&p, fd), None);
        park.busy.reset();
        park.recheck(&p);
        assert_eq!(watched(&p, fd).map(|m| m & (IN | OUT)), Some(IN | OUT));
        park.unregister(&p);
    }
}
