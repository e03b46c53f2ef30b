//! The receive queue: a QP's own or a shared one (SRQ).
//!
//! Contract: receives are taken in the order they were posted; a queue
//! armed with a limit reports, once, when fewer than that many receives
//! remain.

use super::*;

/// A receive queue, private to a QP or shared by several (an SRQ).
#[derive(Debug, Clone)]
pub struct RecvQueue {
    pub(super) wrs: VecDeque<RecvWr>,
    pub(super) depth: usize,
    pub(super) limit: Option<usize>,
}

impl RecvQueue {
    /// A queue of at most `depth` receives.
    pub fn new(depth: usize) -> Self {
        RecvQueue {
            wrs: VecDeque::with_capacity(depth),
            depth,
            limit: None,
        }
    }

    /// Posts a receive.
    pub fn post(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.wrs.len() >= self.depth {
            return Err(PostError::QueueFull);
        }
        self.wrs.push_back(wr);
        Ok(())
    }

    /// Receives currently posted.
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    /// True if no receive is posted.
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// Takes the oldest receive without limit accounting (to move receives
    /// between queues).
    pub fn take_front(&mut self) -> Option<RecvWr> {
        self.wrs.pop_front()
    }

    /// Arms the limit event: it fires once when fewer than `limit` receives
    /// remain (`ibv_modify_srq` with `IBV_SRQ_LIMIT`); 0 disarms.
    pub fn arm_limit(&mut self, limit: usize) {
        self.limit = (limit > 0).then_some(limit);
    }

    /// Takes the oldest receive; the flag says the limit event fired.
    #[inline]
    pub(super) fn take(&mut self) -> (Option<RecvWr>, bool) {
        let wr = self.wrs.pop_front();
        let fired = match self.limit {
            Some(l) if self.wrs.len() < l => {
                self.limit = None;
                true
            }
            _ => false,
        };
        (wr, fired)
    }

    pub(super) fn drain(&mut self) -> impl Iterator<Item = RecvWr> + '_ {
        self.wrs.drain(..)
    }
}
