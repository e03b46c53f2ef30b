//! Event queues: a bounded FIFO of completed events plus the slots
//! reserved by operations still outstanding, and the wait of
//! `exs_qdequeue`.
//!
//! Each queue owns an eventfd a waiter sleeps on in `ppoll` (a signal
//! ends that sleep with `EINTR`, which a condition variable would hide).
//! It is written only when an event arrives for a queue with a thread
//! asleep on it (or the queue is deleted) and read by the last sleeper to
//! leave, so an application that takes events as fast as they come costs
//! no system call per event.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::c_int;

use crate::abi::{exs_event_t, EXS_WAIT_ADAPTIVE, EXS_WAIT_BUSY_POLL, EXS_WAIT_NOTIFY};
use crate::Errno;

/// The mutable part of a queue.
#[derive(Debug)]
pub struct QInner {
    /// Most slots (outstanding operations plus ready events).
    pub depth: usize,
    /// Slots in use: outstanding operations plus ready events.
    pub reserved: usize,
    /// Ready events, oldest first.
    pub events: VecDeque<exs_event_t>,
    /// Signal raised on the process per queued event, if any.
    pub signal: Option<c_int>,
    /// `EXS_WAIT_*`.
    pub wait: c_int,
    /// Set by `exs_qdelete`: waiters return.
    pub deleted: bool,
    /// Threads asleep on the eventfd (or about to be).
    sleepers: usize,
    /// Whether the eventfd was made readable and not read since.
    kicked: bool,
}

/// One event queue.
#[derive(Debug)]
pub struct Queue {
    inner: Mutex<QInner>,
    efd: OwnedFd,
}

fn lock(m: &Mutex<QInner>) -> MutexGuard<'_, QInner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Queue {
    /// A queue of `depth` slots.
    pub fn new(depth: usize) -> Result<Queue, Errno> {
        // SAFETY: eventfd has no pointer arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(crate::sys::errno());
        }
        Ok(Queue {
            inner: Mutex::new(QInner {
                depth,
                reserved: 0,
                events: VecDeque::new(),
                signal: None,
                wait: EXS_WAIT_NOTIFY,
                deleted: false,
                sleepers: 0,
                kicked: false,
            }),
            // SAFETY: fd was just created and is owned by nobody else.
            efd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The queue's state, locked.
    pub fn lock(&self) -> MutexGuard<'_, QInner> {
        lock(&self.inner)
    }

    fn set_ready(&self, ready: bool) {
        if ready {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a local.
            unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        } else {
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a local (non-blocking eventfd).
            unsafe { libc::read(self.efd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        }
    }

    /// Reserves a slot for an operation about to be queued: EAGAIN when
    /// every slot is in use, EINVAL when the queue is being deleted.
    pub fn reserve(&self) -> Result<(), Errno> {
        let mut q = self.lock();
        if q.deleted {
            return Err(libc::EINVAL);
        }
        if q.reserved >= q.depth {
            return Err(libc::EAGAIN);
        }
        q.reserved += 1;
        Ok(())
    }

    /// Gives back a slot reserved for an operation that was not queued.
    pub fn unreserve(&self) {
        let mut q = self.lock();
        q.reserved = q.reserved.saturating_sub(1);
    }

    /// Queues the event of an operation that holds a reserved slot.
    pub fn push(&self, ev: exs_event_t) {
        let sig = {
            let mut q = self.lock();
            q.events.push_back(ev);
            if q.sleepers > 0 && !q.kicked {
                q.kicked = true;
                self.set_ready(true);
            }
            q.signal
        };
        if let Some(s) = sig {
            // SAFETY: kill with the process's own id and a checked signal.
            unsafe { libc::kill(libc::getpid(), s) };
        }
    }

    /// Marks the queue deleted and wakes its waiters.
    pub fn mark_deleted(&self) {
        let mut q = self.lock();
        q.deleted = true;
        if !q.kicked {
            q.kicked = true;
            self.set_ready(true);
        }
    }

    /// Moves up to `out.len()` ready events into `out`, freeing their slots.
    pub fn take(&self, out: &mut [exs_event_t]) -> usize {
        let mut q = self.lock();
        let mut n = 0;
        while n < out.len() {
            match q.events.pop_front() {
                Some(e) => {
                    out[n] = e;
                    n += 1;
                }
                None => break,
            }
        }
        q.reserved = q.reserved.saturating_sub(n);
        n
    }

    /// `exs_qdequeue` on this queue: `out.len()` is |n|; `all` is n < 0.
    pub fn dequeue(
        &self,
        out: &mut [exs_event_t],
        all: bool,
        timeout: Option<Duration>,
    ) -> Result<usize, Errno> {
        let want = out.len();
        if want == 0 {
            return Ok(0);
        }
        let at_least = if all { want } else { 1 };
        let start = Instant::now();
        let deadline = timeout.map(|t| start + t);
        let mut got = 0;
        // While the RDMA model has connections, the waiter first polls
        // their completion queues itself for `rdma_spin` (completing what
        // arrives in this thread: no hand-off through the progress
        // thread and the queue's eventfd), then re-arms them and sleeps.
        let rdma_spin = crate::rdma::spin();
        let mut polled = false;
        // While this thread is here the progress thread leaves the
        // completion channel to it (one thread woken per completion).
        let _waiter = crate::rdma::active().then(crate::rdma::Waiter::enter);
        let mut looked = false;
        loop {
            got += self.take(&mut out[got..]);
            if got >= at_least {
                return Ok(got);
            }
            let (deleted, mode) = {
                let q = self.lock();
                (q.deleted, q.wait)
            };
            if deleted {
                return if got > 0 { Ok(got) } else { Err(libc::EINVAL) };
            }
            let now = Instant::now();
            let remaining = match deadline {
                Some(d) if now >= d => {
                    // A bounded wait (also {0, 0}) looks at the
                    // connections once before giving up.
                    if !looked && crate::rdma::active() && crate::rdma::poll_inline(false) {
                        looked = true;
                        polled = true;
                        continue;
                    }
                    if polled {
                        crate::rdma::poll_inline(true);
                        got += self.take(&mut out[got..]);
                    }
                    return Ok(got);
                }
                Some(d) => Some(d - now),
                None => None,
            };
            let spin = match mode {
                EXS_WAIT_BUSY_POLL => true,
                EXS_WAIT_ADAPTIVE => now - start < Duration::from_micros(50),
                _ => false,
            };
            let rdma = crate::rdma::active();
            if rdma && now - start < rdma_spin {
                polled |= crate::rdma::poll_inline(false);
                std::thread::yield_now();
                continue;
            }
            if spin {
                // EXS_WAIT_BUSY_POLL / ADAPTIVE: this thread is a waiter
                // the progress thread relies on; it keeps polling.
                if rdma {
                    polled |= crate::rdma::poll_inline(false);
                }
                std::thread::yield_now();
                continue;
            }
            if polled {
                // Before sleeping: arm every CQ (taking back what was
                // left to this poller) and complete what came meanwhile.
                crate::rdma::poll_inline(true);
                polled = false;
                continue;
            }
            let chan = if crate::rdma::active() {
                crate::rdma::channel_fd()
            } else {
                None
            };
            match self.sleep(remaining, chan) {
                Ok(()) => {}
                Err(libc::EINTR) if got > 0 => return Ok(got),
                Err(e) => return Err(e),
            }
        }
    }

    /// Sleeps until events may be ready or `limit` passes; EINTR on a
    /// signal. With `chan` (the RDMA model's completion channel) it wakes
    /// when a connection's CQ fires too, and then drives the connections
    /// itself ([`crate::rdma::progress_channel`]): the completion becomes
    /// an event in this thread instead of through the progress thread and
    /// the queue's eventfd.
    fn sleep(&self, limit: Option<Duration>, chan: Option<c_int>) -> Result<(), Errno> {
        let mut p = [
            libc::pollfd {
                fd: self.efd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: chan.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        {
            let mut q = self.lock();
            if !q.events.is_empty() || q.deleted {
                return Ok(());
            }
            // From here on an event's push writes the eventfd.
            q.sleepers += 1;
        }
        let nfds = if chan.is_some() { 2 } else { 1 };
        let ts = limit.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: nfds pollfds and an optional timespec, all locals.
        let r = unsafe { libc::ppoll(p.as_mut_ptr(), nfds, tsp, std::ptr::null()) };
        // Taken before the lock and the eventfd read can change errno.
        let woke = if r < 0 {
            Err(crate::sys::errno())
        } else {
            Ok(())
        };
        {
            let mut q = self.lock();
            q.sleepers -= 1;
            if q.sleepers == 0 && q.kicked && !q.deleted {
                q.kicked = false;
                self.set_ready(false);
            }
        }
        woke?;
        if chan.is_some() && p[1].revents != 0 {
            crate::rdma::progress_channel();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::EXS_EVT_SEND;

    fn ev(i: usize) -> exs_event_t {
        exs_event_t::new(EXS_EVT_SEND, 3, i, 0)
    }

    #[test]
    fn slots_are_reserved_until_dequeued() {
        let q = Queue::new(2).unwrap();
        q.reserve().unwrap();
        q.reserve().unwrap();
        assert_eq!(q.reserve(), Err(libc::EAGAIN));
        q.push(ev(1));
        // The event still holds its slot.
        assert_eq!(q.reserve(), Err(libc::EAGAIN));
        let mut out = [ev(0); 4];
        assert_eq!(q.dequeue(&mut out, false, Some(Duration::ZERO)), Ok(1));
        assert_eq!(out[0].exs_evt_ahandle as usize, 1);
        q.reserve().unwrap();
    }

    #[test]
    fn zero_timeout_never_blocks_and_negative_n_waits_for_all() {
        let q = std::sync::Arc::new(Queue::new(8).unwrap());
        let mut out = [ev(0); 3];
        let t = Instant::now();
        assert_eq!(q.dequeue(&mut out, false, Some(Duration::ZERO)), Ok(0));
        assert_eq!(
            q.dequeue(&mut out, true, Some(Duration::from_millis(30))),
            Ok(0)
        );
        assert!(t.elapsed() >= Duration::from_millis(30));
        for _ in 0..3 {
            q.reserve().unwrap();
        }
        let q2 = q.clone();
        let h = std::thread::spawn(move || {
            for i in 0..3 {
                std::thread::sleep(Duration::from_millis(10));
                q2.push(ev(10 + i));
            }
        });
        assert_eq!(q.dequeue(&mut out, true, None), Ok(3));
        h.join().unwrap();
        let tags: Vec<usize> = out.iter().map(|e| e.exs_evt_ahandle as usize).collect();
        assert_eq!(tags, vec![10, 11, 12]);
    }

    /// Whether the queue's eventfd is readable now.
    fn readable(q: &Queue) -> bool {
        let mut p = libc::pollfd {
            fd: q.efd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one local pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn events_nobody_sleeps_for_cost_no_wake_up_and_sleepers_are_all_woken() {
        let q = std::sync::Arc::new(Queue::new(64).unwrap());
        for _ in 0..64 {
            q.reserve().unwrap();
        }
        // Taken as they come: the eventfd is never touched.
        let mut one = [ev(0); 1];
        for i in 0..8 {
            q.push(ev(i));
            assert!(!readable(&q));
            assert_eq!(q.dequeue(&mut one, false, None), Ok(1));
            assert_eq!(one[0].exs_evt_ahandle as usize, i);
        }
        // Three threads asleep, each wanting two events: pushes from a
        // fourth wake them all, each gets its two, nothing is lost, and the
        // last sleeper to leave reads the eventfd back.
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                std::thread::spawn(move || {
                    let mut out = [ev(0); 2];
                    let n = q.dequeue(&mut out, true, Some(Duration::from_secs(10)));
                    (n, out.map(|e| e.exs_evt_ahandle as usize))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(30));
        for i in 0..6 {
            q.push(ev(100 + i));
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut got: Vec<usize> = Vec::new();
        for w in waiters {
            let (n, tags) = w.join().unwrap();
            assert_eq!(n, Ok(2));
            got.extend(tags);
        }
        got.sort();
        assert_eq!(got, (100..106).collect::<Vec<_>>());
        assert!(!readable(&q));
        assert_eq!(q.lock().sleepers, 0);
    }

    #[test]
    fn a_deleted_queue_wakes_its_waiter() {
        let q = std::sync::Arc::new(Queue::new(1).unwrap());
        let q2 = q.clone();
        let h = std::thread::spawn(move || {
            let mut out = [ev(0); 1];
            q2.dequeue(&mut out, false, None)
        });
        std::thread::sleep(Duration::from_millis(20));
        q.mark_deleted();
        assert_eq!(h.join().unwrap(), Err(libc::EINVAL));
    }
}
