//! Completion queues, completion channels and the context's async events.
//!
//! A [`Cq`] holds completions up to its capacity. One more is an overrun:
//! the completion is lost, the CQ is marked in error and an
//! [`AsyncEvent::CqError`] is raised, as verbs does. Arming with
//! [`Cq::req_notify`] makes the next matching completion (any, or only
//! solicited ones and errors) fire the CQ's [`CompChannel`] once; the channel
//! is a real pollable file descriptor (an eventfd).
//!
//! [`Cq::poll`] also drives receive progress inline: when the queue is empty
//! it drains the sockets of the QPs that complete into it (non-blocking), so
//! a busy-polling application does not wait for the progress thread. What
//! it drains is anything `InlineProgress`: RC QPs, and datagram QPs
//! (whose progress drains the UDP socket they share; a socket is drained
//! once per poll however many of its QPs complete here).
//!
//! With [`READY_SET_MIN`] sources or more, a poll first asks the kernel
//! which of their sockets are readable: the CQ keeps its own epoll set
//! (level-triggered, read interest; made by the first poll that sees that
//! many sources, each socket registered by the first poll that finds it
//! watched by the progress thread, and read by that poll), one
//! `epoll_wait` with no timeout per poll, and a source whose socket is not
//! reported is still driven but reads nothing
//! (`InlineProgress::progress_inline_ready`): it transmits, sends what a
//! receive deferred and runs due timers as before. A close or error is
//! reported as readable; a source whose socket the progress thread no
//! longer watches (a closed connection) leaves the set and is read at
//! every poll. Data that arrives after the `epoll_wait` is read
//! by the next poll, as if it had come a moment later. An empty poll of
//! 1 000 RC connections on one CQ: 340 µs before, 34 µs with the set (12
//! connections: 4.0 → 0.57 µs); what is left is the walk itself, some 30
//! ns per source.
//!
//! A completion that inline progress produces for the very CQ being
//! polled skips the CQ's queue when it can (a `Direct` hand-off): while
//! the queue is empty and the CQ is not armed, it is written straight into
//! the poller's output. Nothing older of the same QP can then be queued
//! (a QP's completions leave it in order, under its lock), so a QP's
//! completions are still returned in the order it made them; completions
//! of different QPs have no order between them, as in verbs. A completion
//! handed over never occupies the queue, so it does not count toward the
//! capacity: a burst that an inline poll takes whole into a large enough
//! output does not overrun a small CQ, where the same burst completed by
//! the progress thread (or for an armed CQ) would.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use softrdma_proto::memory::MemError;
use softrdma_proto::wr::{DgramAddr, WcStatus, WorkCompletion};
use softrdma_wire::rdmap::Opcode;

use crate::qp::QpShared;
use crate::sys::{Epoll, EventFd, Interest};

/// A completion with the number of the QP it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The completion.
    pub wc: WorkCompletion,
    /// The QP's number.
    pub qp_num: u32,
}

/// Events not tied to a work request (`ibv_get_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A CQ overran and lost a completion (`IBV_EVENT_CQ_ERR`).
    CqError {
        /// The CQ.
        cq: u64,
    },
    /// A QP entered the error state because of a protocol or transport
    /// error (`IBV_EVENT_QP_FATAL`).
    QpFatal {
        /// The QP number.
        qpn: u32,
    },
    /// A QP entered the error state on a remote access violation
    /// (`IBV_EVENT_QP_ACCESS_ERR`).
    QpAccessError {
        /// The QP number.
        qpn: u32,
    },
    /// A receive queue fell below its armed limit
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`, or QP_LAST_WQE style for own RQs).
    SrqLimitReached {
        /// The QP number whose receive queue (or the SRQ id).
        id: u64,
    },
    /// A QP's connection is established (`IBV_EVENT_COMM_EST`).
    CommEstablished {
        /// The QP number.
        qpn: u32,
    },
    /// A datagram QP received an RDMA Write or Write-Record segment that
    /// failed the remote access checks (STag, PD, rights, bounds): nothing
    /// of it was placed. Unlike [`AsyncEvent::QpAccessError`] the QP keeps
    /// working (a datagram QP has no connection to tear down).
    DgramRemoteAccessError {
        /// The datagram QP that received it.
        qpn: u32,
        /// Who sent it (for tagged segments the QPN follows the
        /// `(port << 8) | slot` convention, `docs/datagram.md` §10).
        src: DgramAddr,
        /// RDMA Write or Write-Record.
        opcode: Opcode,
        /// Its T-MSN (0 for a Write without one).
        msn: u32,
        /// The STag it named.
        stag: u32,
        /// Its tagged offset.
        to: u64,
        /// Its payload length.
        len: u32,
        /// Why the memory refused it.
        error: MemError,
    },
    /// A reliable-datagram QP gave up on a peer (retry limit): the work
    /// toward that peer failed; other peers and the QP carry on.
    DgramPeerFailed {
        /// The RD QP.
        qpn: u32,
        /// The peer that stopped answering.
        peer: DgramAddr,
    },
}

/// Events queued beyond which datagram QPs drop theirs (counted in
/// [`crate::DgramQpStats::events_dropped`]).
pub const MAX_LOSSY_EVENTS: usize = 4096;

/// The context's async event queue: a pollable fd plus the events.
#[derive(Debug)]
pub struct AsyncEvents {
    efd: EventFd,
    queue: Mutex<VecDeque<AsyncEvent>>,
}

impl AsyncEvents {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(AsyncEvents {
            efd: EventFd::new()?,
            queue: Mutex::new(VecDeque::new()),
        })
    }

    pub(crate) fn raise(&self, e: AsyncEvent) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(e);
        self.efd.signal();
    }

    /// Queues `e` unless [`MAX_LOSSY_EVENTS`] events are waiting already;
    /// false if it was dropped. For events a remote peer can provoke at
    /// will (datagram QPs), so an application that does not read its
    /// events cannot be made to grow the queue without bound.
    pub(crate) fn raise_lossy(&self, e: AsyncEvent) -> bool {
        {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.len() >= MAX_LOSSY_EVENTS {
                return false;
            }
            q.push_back(e);
        }
        self.efd.signal();
        true
    }

    /// The next event, waiting up to `timeout` (`None`: for ever).
    pub fn get(&self, timeout: Option<Duration>) -> Option<AsyncEvent> {
        loop {
            if let Some(e) = self.try_get() {
                return Some(e);
            }
            if !self.efd.wait(timeout) {
                return None;
            }
        }
    }

    /// The next event, if one is queued.
    pub fn try_get(&self) -> Option<AsyncEvent> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// The pollable descriptor.
    pub fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }
}

/// A completion channel (`ibv_comp_channel`): a pollable fd that says which
/// armed CQs have fired.
#[derive(Debug)]
pub struct CompChannel {
    efd: EventFd,
    fired: Mutex<VecDeque<u64>>,
}

impl CompChannel {
    /// A new channel.
    pub fn new() -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(CompChannel {
            efd: EventFd::new()?,
            fired: Mutex::new(VecDeque::new()),
        }))
    }

    fn fire(&self, cq: u64) {
        self.fired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(cq);
        self.efd.signal();
    }

    /// The id of the next CQ that fired, waiting up to `timeout`
    /// (`ibv_get_cq_event`); `None` on timeout.
    pub fn get_event(&self, timeout: Option<Duration>) -> Option<u64> {
        loop {
            if let Some(c) = self.try_get_event() {
                return Some(c);
            }
            if !self.efd.wait(timeout) {
                return None;
            }
        }
    }

    /// The id of the next CQ that fired, waiting for ever unless a signal
    /// arrives first: then an [`std::io::ErrorKind::Interrupted`] error
    /// (what `ibv_get_cq_event` reports as `EINTR`).
    pub fn get_event_interruptible(&self) -> std::io::Result<u64> {
        loop {
            if let Some(c) = self.try_get_event() {
                return Ok(c);
            }
            self.efd.wait_interruptible(None)?;
        }
    }

    /// The id of the next CQ that fired, without waiting.
    pub fn try_get_event(&self) -> Option<u64> {
        let mut q = self.fired.lock().unwrap_or_else(|p| p.into_inner());
        let c = q.pop_front();
        if q.is_empty() {
            self.efd.drain();
        }
        c
    }

    /// The pollable descriptor.
    pub fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }
}

/// The poller's output, offered to the QPs that [`Cq::poll`] drives
/// inline: completions for that CQ go straight into it while the CQ's
/// queue is empty and nothing stands in their way (module docs), instead
/// of through the queue's lock twice.
pub(crate) struct Direct<'a> {
    cq: &'a Cq,
    out: &'a mut [Completion],
    n: usize,
}

impl Direct<'_> {
    /// Hands `wc`, bound for `cq`, to the poller's output (`direct`) if it
    /// can go there now, else stages it in `staged`: the completing QP's
    /// flush vector for `cq`, pushed to the CQ under the QP's lock. Once
    /// anything is staged, the rest of that vector's completions are
    /// staged behind it (their order): a refusal (another CQ, no room, the
    /// CQ armed or holding any completion) may not last, as another
    /// thread can take or arm meanwhile.
    #[inline]
    pub(crate) fn hand_or_stage(
        direct: Option<&mut Direct<'_>>,
        cq: &Cq,
        staged: &mut Vec<Completion>,
        wc: Completion,
    ) {
        match direct {
            Some(d) if staged.is_empty() && d.can_take(cq) => {
                d.out[d.n] = wc;
                d.n += 1;
            }
            _ => staged.push(wc),
        }
    }

    fn can_take(&self, cq: &Cq) -> bool {
        std::ptr::eq(cq, self.cq)
            && self.n < self.out.len()
            && cq.queued.load(Ordering::Acquire) == 0
            && !cq.armed.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
struct CqInner {
    entries: VecDeque<Completion>,
    capacity: usize,
    overrun: bool,
    /// Armed: `Some(solicited_only)`.
    armed: Option<bool>,
}

/// Something whose receive progress [`Cq::poll`] drives when the CQ is
/// empty. Implementations only try-lock what another thread may hold for
/// long (the progress thread is making progress then), never take a CQ's
/// QP list, and never call [`Cq::poll`].
pub(crate) trait InlineProgress: Send + Sync {
    /// Drains what is readable, without blocking; completions for the
    /// polled CQ may go to `direct` ([`Direct::hand_or_stage`]).
    fn progress_inline(&self, direct: &mut Direct<'_>);
    /// Identifies what `progress_inline` drains: of several entries with
    /// the same key, one poll progresses only the first.
    fn progress_key(&self) -> usize;
    /// The CQ was armed ([`Cq::req_notify`]): its poller may block next,
    /// so a source parked for a busy poller must be watched again now.
    fn notify_armed(&self) {}
    /// The descriptor `progress_inline` reads, if any: a CQ with many
    /// sources registers it in its readiness set ([`Cq::poll`]).
    fn progress_fd(&self) -> Option<RawFd> {
        None
    }
    /// [`InlineProgress::progress_inline`], told whether
    /// [`InlineProgress::progress_fd`] is readable: when it is not, the
    /// source skips reading it (a system call that would find nothing)
    /// but does the rest (transmit, what a receive deferred, due timers).
    fn progress_inline_ready(&self, direct: &mut Direct<'_>, readable: bool) {
        let _ = readable;
        self.progress_inline(direct)
    }
}

impl InlineProgress for QpShared {
    fn progress_inline(&self, direct: &mut Direct<'_>) {
        QpShared::progress_inline_to(self, Some(direct))
    }
    fn progress_key(&self) -> usize {
        self as *const QpShared as usize
    }
    fn notify_armed(&self) {
        QpShared::notify_armed(self)
    }
    fn progress_fd(&self) -> Option<RawFd> {
        QpShared::progress_fd(self)
    }
    fn progress_inline_ready(&self, direct: &mut Direct<'_>, readable: bool) {
        QpShared::progress_inline_ready(self, direct, readable)
    }
}

/// From this many sources on, a CQ's inline poll asks the kernel which of
/// their descriptors are readable (one `epoll_wait`) instead of reading
/// every one (a `recv` each, ~0.3 µs even when it finds nothing: 0.3 ms
/// per empty poll with 1 000 connections on one CQ). Below it, reading
/// each is cheaper than asking, and a socket with an epoll waiter costs
/// every arriving segment a wake-up walk (`progress.rs`, `Parking`).
pub const READY_SET_MIN: usize = 5;

/// Ready descriptors one poll takes from the readiness set; a poll that
/// finds this many reads every source.
const READY_KEYS: usize = 64;

/// The sources a CQ's inline poll drives ([`InlineProgress`]).
#[derive(Default)]
struct Sources {
    list: Vec<Source>,
    /// Their descriptors' readiness; made at the first poll that sees
    /// [`READY_SET_MIN`] sources.
    ready: Option<ReadySet>,
    /// The epoll instance could not be made (descriptors exhausted): not
    /// tried again; every poll reads every source.
    ready_failed: bool,
}

/// One readiness event as [`Epoll::wait`] reports it.
type ReadyEvent = (u64, bool, bool, bool);

/// A CQ's readiness set: its sources' descriptors, level-triggered, read
/// interest, keyed by [`InlineProgress::progress_key`], and the buffer a
/// poll's `epoll_wait` fills (kept, so that a poll neither allocates nor
/// clears one).
struct ReadySet {
    ep: Epoll,
    events: Vec<ReadyEvent>,
}

impl ReadySet {
    /// The readiness set in `slot` and what it reports now, for a CQ with
    /// `sources` sources, at least [`READY_SET_MIN`] (made on first use;
    /// `failed` once it could not be); `None`: every source reads (fewer
    /// sources, no epoll instance, or [`READY_KEYS`] or more ready).
    fn poll<'a>(
        slot: &'a mut Option<ReadySet>,
        failed: &mut bool,
        sources: usize,
    ) -> Option<(&'a Epoll, &'a [ReadyEvent])> {
        if sources < READY_SET_MIN || *failed {
            return None;
        }
        if slot.is_none() {
            *slot = Epoll::new().ok().map(|ep| ReadySet {
                ep,
                events: vec![(0, false, false, false); READY_KEYS],
            });
            *failed = slot.is_none();
        }
        let set = slot.as_mut()?;
        match set.ep.wait(&mut set.events, 0) {
            Ok(n) if n < READY_KEYS => Some((&set.ep, &set.events[..n])),
            _ => None,
        }
    }
}

impl Source {
    /// Whether this source, `q` under `key`, reads in a poll whose
    /// readiness set `ep` reported `ready`; registers its descriptor the
    /// first time (and reads then: what came before is not in `ready`),
    /// and takes out one the progress thread no longer watches.
    fn can_read(
        &mut self,
        ep: &Epoll,
        ready: &[ReadyEvent],
        q: &dyn InlineProgress,
        key: usize,
    ) -> bool {
        if self.unwatchable {
            return true;
        }
        match q.progress_fd() {
            Some(fd) if self.fd == Some(fd) => ready.iter().any(|e| e.0 == key as u64),
            Some(fd) => {
                let read = Interest {
                    read: true,
                    write: false,
                };
                match ep.add(fd, key as u64, read) {
                    Ok(()) => self.fd = Some(fd),
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                        // Same descriptor, possibly under a key of a
                        // source now gone: this one's.
                        if ep.modify(fd, key as u64, read).is_ok() {
                            self.fd = Some(fd);
                        }
                    }
                    Err(_) => self.unwatchable = true,
                }
                true
            }
            None => {
                // No longer watched by the progress thread (a closed
                // connection, its socket still open until the QP goes):
                // out of the set, or its hang-up would be reported at
                // every poll.
                if let Some(fd) = self.fd.take() {
                    ep.delete(fd);
                }
                true
            }
        }
    }
}

struct Source {
    q: Weak<dyn InlineProgress>,
    /// The descriptor registered in [`Sources::ready`] for it.
    fd: Option<RawFd>,
    /// Its descriptor could not be registered (the kernel's watch limit):
    /// read at every poll, not tried again.
    unwatchable: bool,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("sources", &self.list.len())
            .field("ready_set", &self.ready.is_some())
            .finish()
    }
}

/// A completion queue.
#[derive(Debug)]
pub struct Cq {
    id: u64,
    inner: Mutex<CqInner>,
    channel: Option<Arc<CompChannel>>,
    events: Arc<AsyncEvents>,
    /// QPs completing here, for inline progress from `poll`.
    qps: Mutex<Sources>,
    /// Threads waiting to add a QP to `qps`: a busy poller leaves the list
    /// alone while one is, or it would take the lock again at once, spin
    /// after spin, and starve the waiter (with 1 000 connections on one
    /// CQ each new one waited ~85 ms; `docs/engine.md`, "Inline progress from CQ
    /// polling").
    attaching: AtomicUsize,
    inline_progress: AtomicBool,
    /// `entries.len()` as of the last change (written under `inner`'s
    /// lock): an empty poll reads it instead of taking the lock, twice per
    /// spin of a busy poller. A completion pushed meanwhile is seen by the
    /// next poll, as if it had come a moment later.
    queued: AtomicUsize,
    /// Polls that asked the kernel which sources are readable
    /// ([`Cq::ready_set_polls`]).
    ready_polls: AtomicU64,
    /// `armed.is_some()` (written under `inner`'s lock): a completion
    /// for an armed CQ is queued, so that it fires the channel
    /// ([`Direct::hand_or_stage`]).
    armed: AtomicBool,
}

impl Cq {
    pub(crate) fn new(
        id: u64,
        capacity: usize,
        channel: Option<Arc<CompChannel>>,
        events: Arc<AsyncEvents>,
        inline_progress: bool,
    ) -> Arc<Cq> {
        Arc::new(Cq {
            id,
            inner: Mutex::new(CqInner {
                entries: VecDeque::with_capacity(capacity),
                capacity,
                overrun: false,
                armed: None,
            }),
            channel,
            events,
            qps: Mutex::new(Sources::default()),
            attaching: AtomicUsize::new(0),
            inline_progress: AtomicBool::new(inline_progress),
            queued: AtomicUsize::new(0),
            ready_polls: AtomicU64::new(0),
            armed: AtomicBool::new(false),
        })
    }

    /// Inline polls so far that asked the kernel which of the CQ's sockets
    /// are readable instead of reading each (module docs: a CQ with
    /// [`READY_SET_MIN`] or more sources).
    pub fn ready_set_polls(&self) -> u64 {
        self.ready_polls.load(Ordering::Relaxed)
    }

    /// The CQ's id (what [`CompChannel::get_event`] returns).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Capacity in completions.
    pub fn capacity(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capacity
    }

    /// Changes the capacity to `capacity` completions (`ibv_resize_cq`).
    /// Refused (returning the completions held) when fewer than those the
    /// CQ holds now; the completions keep their order.
    pub fn resize(&self, capacity: usize) -> Result<(), usize> {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if capacity == 0 || capacity < c.entries.len() {
            return Err(c.entries.len());
        }
        c.capacity = capacity;
        let more = capacity.saturating_sub(c.entries.len());
        c.entries.reserve(more);
        Ok(())
    }

    /// True once a completion was lost to an overrun.
    pub fn overrun(&self) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).overrun
    }

    pub(crate) fn attach<Q: InlineProgress + 'static>(&self, qp: Weak<Q>) {
        // Announced before the lock is asked for: pollers step aside.
        self.attaching.fetch_add(1, Ordering::SeqCst);
        {
            let mut v = self.qps.lock().unwrap_or_else(|p| p.into_inner());
            v.list.retain(|s| s.q.strong_count() > 0);
            v.list.push(Source {
                q: qp as Weak<dyn InlineProgress>,
                fd: None,
                unwatchable: false,
            });
        }
        self.attaching.fetch_sub(1, Ordering::SeqCst);
    }

    /// Adds completions (from a QP's progress).
    #[inline]
    pub(crate) fn push(&self, batch: &[Completion]) {
        // Inline: most flushes (every busy poll) have nothing to push.
        if !batch.is_empty() {
            self.push_batch(batch);
        }
    }

    /// Adds completions that a layer above the engine held back and now
    /// hands over, firing the channel of an armed CQ as a QP's would.
    pub fn inject(&self, batch: &[Completion]) {
        self.push(batch);
    }

    fn push_batch(&self, batch: &[Completion]) {
        let mut fire = false;
        {
            let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            for wc in batch {
                if c.entries.len() >= c.capacity {
                    if !c.overrun {
                        c.overrun = true;
                        self.events.raise(AsyncEvent::CqError { cq: self.id });
                    }
                    continue;
                }
                c.entries.push_back(*wc);
                if let Some(solicited_only) = c.armed {
                    if !solicited_only || wc.wc.solicited || wc.wc.status != WcStatus::Success {
                        c.armed = None;
                        self.armed.store(false, Ordering::Relaxed);
                        fire = true;
                    }
                }
            }
            self.queued.store(c.entries.len(), Ordering::Release);
        }
        if fire {
            if let Some(ch) = &self.channel {
                ch.fire(self.id);
            }
        }
    }

    /// Takes up to `out.len()` completions, oldest first. If none are
    /// queued, first drives receive progress of the attached QPs.
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        let n = self.take(out);
        if n > 0 || out.is_empty() || !self.inline_progress.load(Ordering::Relaxed) {
            return n;
        }
        // A QP is being attached: this poll makes no progress of its own
        // (the progress thread still does) and lets the attach have the
        // list; the next poll walks it again.
        if self.attaching.load(Ordering::Relaxed) > 0 {
            return 0;
        }
        let mut direct = Direct {
            cq: self,
            out: &mut *out,
            n: 0,
        };
        // Walk the QPs under the list lock: no allocation on this busy-poll
        // path. Progress locks only the QP and the CQs' entry queues, never
        // a QP list, so this cannot deadlock.
        {
            let mut v = self.qps.lock().unwrap_or_else(|p| p.into_inner());
            let Sources {
                list,
                ready,
                ready_failed,
            } = &mut *v;
            // With many sources, which descriptors are readable: one
            // system call instead of a read of each.
            let readable = ReadySet::poll(ready, ready_failed, list.len());
            if readable.is_some() {
                self.ready_polls.fetch_add(1, Ordering::Relaxed);
            }
            // Keys progressed in this poll (QPs sharing a datagram socket
            // drain it once); past the array's size, repeats are allowed.
            let mut seen = [0usize; 8];
            let mut ns = 0;
            for src in list.iter_mut() {
                let Some(q) = src.q.upgrade() else { continue };
                let key = q.progress_key();
                if seen[..ns].contains(&key) {
                    continue;
                }
                if ns < seen.len() {
                    seen[ns] = key;
                    ns += 1;
                }
                let can_read = readable.is_none_or(|(ep, ready)| src.can_read(ep, ready, &*q, key));
                q.progress_inline_ready(&mut direct, can_read);
            }
        }
        // Handed over first: anything queued meanwhile is of other QPs, or
        // came after (module docs).
        let n = direct.n;
        n + self.take(&mut out[n..])
    }

    fn take(&self, out: &mut [Completion]) -> usize {
        if out.is_empty() || self.queued.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let n = out.len().min(c.entries.len());
        for (slot, wc) in out.iter_mut().zip(c.entries.drain(..n)) {
            *slot = wc;
        }
        self.queued.store(c.entries.len(), Ordering::Release);
        n
    }

    /// Arms the CQ: the next completion (or, with `solicited_only`, the next
    /// solicited or error completion) fires the channel once.
    pub fn req_notify(&self, solicited_only: bool) {
        {
            let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            c.armed = Some(solicited_only);
            self.armed.store(true, Ordering::Relaxed);
        }
        // The progress thread must take over sockets parked for a busy
        // poller before this CQ's user blocks (progress module docs).
        let v = self.qps.lock().unwrap_or_else(|p| p.into_inner());
        for q in v.list.iter().filter_map(|s| s.q.upgrade()) {
            q.notify_armed();
        }
    }

    /// Completions currently queued.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .len()
    }

    /// True if no completion is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QP stand-in with nothing to do.
    struct Idle;
    impl InlineProgress for Idle {
        fn progress_inline(&self, _direct: &mut Direct<'_>) {}
        fn progress_key(&self) -> usize {
            self as *const Idle as usize
        }
    }

    /// A stand-in with a UDP socket as its descriptor: records how each
    /// poll drove it, and reads what is there when told it is readable.
    struct Sock {
        sock: std::net::UdpSocket,
        calls: std::sync::Mutex<Vec<bool>>,
        got: AtomicUsize,
    }
    impl InlineProgress for Sock {
        fn progress_inline(&self, direct: &mut Direct<'_>) {
            self.progress_inline_ready(direct, true)
        }
        fn progress_key(&self) -> usize {
            self as *const Sock as usize
        }
        fn progress_fd(&self) -> Option<RawFd> {
            Some(self.sock.as_raw_fd())
        }
        fn progress_inline_ready(&self, _direct: &mut Direct<'_>, readable: bool) {
            self.calls.lock().unwrap().push(readable);
            if readable {
                let mut b = [0u8; 16];
                while self.sock.recv(&mut b).is_ok() {
                    self.got.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    fn blank() -> Completion {
        Completion {
            wc: WorkCompletion::new(0, WcStatus::Success, softrdma_proto::wr::WcOpcode::Send, 0),
            qp_num: 0,
        }
    }

    /// With [`READY_SET_MIN`] sources or more, a poll asks the kernel which
    /// descriptors are readable and reads only those (the others are still
    /// driven, told there is nothing to read); below it, every source
    /// reads. A source is read at the poll that registers it, so nothing
    /// that came before is missed.
    #[test]
    fn a_poll_of_many_sources_reads_only_the_readable_ones() {
        let make = |n: usize| {
            let events = Arc::new(AsyncEvents::new().unwrap());
            let cq = Cq::new(1, 16, None, events, true);
            let srcs: Vec<Arc<Sock>> = (0..n)
                .map(|_| {
                    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                    sock.set_nonblocking(true).unwrap();
                    Arc::new(Sock {
                        sock,
                        calls: Default::default(),
                        got: AtomicUsize::new(0),
                    })
                })
                .collect();
            for s in &srcs {
                cq.attach(Arc::downgrade(s));
            }
            (cq, srcs)
        };
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let last = |s: &Sock| *s.calls.lock().unwrap().last().unwrap();
        // Loopback delivers inside `send_to` here, but need not: wait
        // until the datagram is in the socket (without taking it).
        let arrived = |s: &Sock| {
            let end = std::time::Instant::now() + Duration::from_secs(5);
            while s.sock.peek(&mut [0u8; 8]).is_err() {
                assert!(std::time::Instant::now() < end, "the datagram never came");
                std::thread::yield_now();
            }
        };
        let mut out = [blank()];

        let (cq, srcs) = make(READY_SET_MIN + 3);
        // Sent before the first poll: read by the registering poll.
        tx.send_to(b"early", srcs[2].sock.local_addr().unwrap())
            .unwrap();
        arrived(&srcs[2]);
        assert_eq!(cq.poll(&mut out), 0);
        assert!(srcs.iter().all(|s| last(s)), "the first poll reads all");
        assert_eq!(cq.ready_set_polls(), 1);
        assert_eq!(srcs[2].got.load(Ordering::Relaxed), 1);
        // Nothing arrived: every source driven, none read.
        assert_eq!(cq.poll(&mut out), 0);
        assert!(srcs.iter().all(|s| !last(s)), "an empty poll read a socket");
        // One datagram for source 5: it alone reads, and gets it.
        tx.send_to(b"x", srcs[5].sock.local_addr().unwrap())
            .unwrap();
        arrived(&srcs[5]);
        assert_eq!(cq.poll(&mut out), 0);
        for (i, s) in srcs.iter().enumerate() {
            assert_eq!(last(s), i == 5, "source {i}");
            assert_eq!(s.calls.lock().unwrap().len(), 3, "source {i}");
        }
        assert_eq!(srcs[5].got.load(Ordering::Relaxed), 1);
        // A source gone: the rest go on as before.
        let mut srcs = srcs;
        drop(srcs.remove(0));
        tx.send_to(b"y", srcs[0].sock.local_addr().unwrap())
            .unwrap();
        arrived(&srcs[0]);
        assert_eq!(cq.poll(&mut out), 0);
        assert!(last(&srcs[0]) && srcs[1..].iter().all(|s| !last(s)));
        assert_eq!(srcs[0].got.load(Ordering::Relaxed), 1);

        // Below the threshold every poll reads every source.
        let (cq, srcs) = make(READY_SET_MIN - 1);
        for _ in 0..3 {
            assert_eq!(cq.poll(&mut out), 0);
        }
        for s in &srcs {
            assert_eq!(*s.calls.lock().unwrap(), vec![true; 3]);
        }
        assert!(cq.qps.lock().unwrap().ready.is_none());
        assert_eq!(cq.ready_set_polls(), 0);
    }

    /// While a thread attaches a QP, a poll leaves the QP list alone (and
    /// returns with nothing) instead of waiting for the list: a busy poller
    /// that took the list again after every walk starved the attaching
    /// thread (1 000 RC connections on one CQ took 85-91 s to set up, 0.57 s
    /// with this). Here the attach holds the list; a poll that waited for
    /// the list would block below.
    #[test]
    fn a_poll_leaves_the_list_to_a_waiting_attach() {
        let events = Arc::new(AsyncEvents::new().unwrap());
        let cq = Cq::new(1, 16, None, events, true);
        let idle = Arc::new(Idle);
        cq.attach(Arc::downgrade(&idle));
        // An attach under way: announced, and holding the list.
        cq.attaching.fetch_add(1, Ordering::SeqCst);
        let list = cq.qps.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let poller = {
            let cq = cq.clone();
            std::thread::spawn(move || {
                let mut out = [Completion {
                    wc: WorkCompletion::new(
                        0,
                        WcStatus::Success,
                        softrdma_proto::wr::WcOpcode::Send,
                        0,
                    ),
                    qp_num: 0,
                }];
                let _ = tx.send(cq.poll(&mut out));
            })
        };
        let polled = rx.recv_timeout(Duration::from_secs(5));
        drop(list);
        cq.attaching.fetch_sub(1, Ordering::SeqCst);
        poller.join().unwrap();
        assert_eq!(polled, Ok(0), "the poll waited for the list an attach held");
        // With no attach under way, a poll walks the list again.
        let mut out = [Completion {
            wc: WorkCompletion::new(0, WcStatus::Success, softrdma_proto::wr::WcOpcode::Send, 0),
            qp_num: 0,
        }];
        assert_eq!(cq.poll(&mut out), 0);
        assert_eq!(cq.qps.lock().unwrap().list.len(), 1);
    }
}
