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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, Weak};
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
    /// Its timer is due (`now` is at or after the deadline armed).
    fn on_timer(&self, _now: Instant) {}
}

impl Source for QpShared {
    fn on_ready(&self, readable: bool, writable: bool) {
        QpShared::on_ready(self, readable, writable)
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

/// Handle to the progress thread.
#[derive(Debug)]
pub struct Progress {
    epoll: Arc<Epoll>,
    wake: Arc<EventFd>,
    sources: Arc<Sources>,
    timers: Arc<Mutex<Timers>>,
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
        let (e, w, q, t) = (epoll.clone(), wake.clone(), sources.clone(), timers.clone());
        thread::Builder::new()
            .name("softrdma-progress".into())
            .spawn(move || run(&e, &w, &q, &t))?;
        Ok(Progress {
            epoll,
            wake,
            sources,
            timers,
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

    /// Adds or removes interest in writability.
    pub(crate) fn watch_write(&self, fd: RawFd, token: u64, write: bool) -> io::Result<()> {
        self.epoll.modify(fd, token, Interest { read: true, write })
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

fn run(epoll: &Epoll, wake: &EventFd, sources: &Sources, timers: &Mutex<Timers>) {
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
                src.on_ready(r || hup, w);
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
