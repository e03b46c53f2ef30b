//! Shared receive queues (`ibv_srq`).
//!
//! An [`Srq`] is a pool of receives that any number of QPs draw from: a QP
//! created with one ([`crate::Context::create_qp_with_srq`]) takes the
//! receive for every incoming Send (and Write with immediate) from the SRQ,
//! oldest first, whichever connection the message came in on. Receives may
//! be posted before any QP exists or connects; they wait in the SRQ.
//!
//! The limit event follows verbs (`ibv_modify_srq` with `IBV_SRQ_LIMIT`):
//! [`Srq::arm_limit`] arms it, and the first time a QP takes a receive that
//! leaves fewer than `limit` posted, [`crate::AsyncEvent::SrqLimitReached`]
//! is raised once with the SRQ's [`Srq::id`] and the limit is disarmed. An
//! SRQ that runs empty is like a QP without receives: the QP the Send
//! arrived on sends a Terminate (DDP untagged, "no buffer") and enters the
//! error state; the SRQ and its other QPs carry on.
//!
//! Receives in an SRQ belong to no QP, so a QP that fails or disconnects
//! leaves them in place (only the receive it was filling completes in
//! error), as in verbs. Their buffers are checked against the protection
//! domain of the QP the message arrives on: the SRQ and its QPs share one.
//!
//! Locking: the SRQ has one mutex around its [`RecvQueue`]. A QP's receive
//! path takes it while holding the QP's core lock (QP core, then SRQ, then
//! the registration table's read lock). Nothing takes a QP lock while
//! holding an SRQ lock, so many QPs can share one SRQ without deadlock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use softrdma_proto::rc::RecvQueue;
use softrdma_proto::wr::RecvWr;

use crate::qp::QpError;

/// SRQ ids: unique in the process, never 0.
static NEXT_SRQ: AtomicU64 = AtomicU64::new(1);

/// A shared receive queue.
#[derive(Debug)]
pub struct Srq {
    id: u64,
    depth: usize,
    queue: Mutex<RecvQueue>,
}

impl Srq {
    /// An SRQ holding at most `depth` receives (at least 1).
    pub(crate) fn new(depth: usize) -> Srq {
        let depth = depth.max(1);
        Srq {
            id: NEXT_SRQ.fetch_add(1, Ordering::Relaxed),
            depth,
            queue: Mutex::new(RecvQueue::new(depth)),
        }
    }

    /// The SRQ's id, as reported by [`crate::AsyncEvent::SrqLimitReached`].
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The most receives it holds (`max_wr`).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Posts a receive (`ibv_post_srq_recv`); [`QpError::QueueFull`] when
    /// `depth` receives are posted already.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), QpError> {
        Ok(self.lock().post(wr)?)
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): it is
    /// raised once, when a QP takes a receive that leaves fewer than
    /// `limit` posted, then the limit is disarmed until armed again. 0
    /// disarms; more than [`Srq::depth`] is [`QpError::Invalid`].
    pub fn arm_limit(&self, limit: usize) -> Result<(), QpError> {
        if limit > self.depth {
            return Err(QpError::Invalid);
        }
        self.lock().arm_limit(limit);
        Ok(())
    }

    /// Receives currently posted.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True if no receive is posted.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The queue. Lock order: a QP's core lock (if any) before this one;
    /// never a QP lock while this is held.
    pub(crate) fn lock(&self) -> MutexGuard<'_, RecvQueue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}
