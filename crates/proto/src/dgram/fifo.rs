//! The receive queue of a datagram QP: posted receives in posting order,
//! with the count of receives claimed by messages still in reassembly.
//!
//! Contract: receives are taken in posting order; a receive given back
//! (its message failed before it completed) returns to its place in
//! posting order.

use std::collections::VecDeque;

use crate::wr::{PostError, RecvWr};

/// The receive queue: posted receives in posting order, with the count of
/// receives claimed by messages in reassembly.
#[derive(Debug)]
pub(crate) struct RecvFifo {
    wrs: VecDeque<(u64, RecvWr)>,
    depth: usize,
    claimed: usize,
    next_seq: u64,
}

impl RecvFifo {
    pub(crate) fn new(depth: usize) -> Self {
        RecvFifo {
            wrs: VecDeque::with_capacity(depth),
            depth,
            claimed: 0,
            next_seq: 0,
        }
    }

    pub(crate) fn post(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.wrs.len() + self.claimed >= self.depth {
            return Err(PostError::QueueFull);
        }
        self.wrs.push_back((self.next_seq, wr));
        self.next_seq += 1;
        Ok(())
    }

    #[inline]
    pub(crate) fn take(&mut self) -> Option<(u64, RecvWr)> {
        let x = self.wrs.pop_front()?;
        self.claimed += 1;
        Some(x)
    }

    /// A claimed receive returns to its posting position.
    pub(crate) fn give_back(&mut self, seq: u64, wr: RecvWr) {
        self.claimed = self.claimed.saturating_sub(1);
        let at = self.wrs.partition_point(|&(s, _)| s < seq);
        self.wrs.insert(at, (seq, wr));
    }

    /// Receives posted and not claimed.
    pub(crate) fn len(&self) -> usize {
        self.wrs.len()
    }

    /// A claimed receive completed.
    pub(crate) fn consumed(&mut self) {
        self.claimed = self.claimed.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wr::SgList;

    #[test]
    fn returned_receives_keep_posting_order() {
        let mut f = RecvFifo::new(8);
        let wr = |id| RecvWr {
            wr_id: id,
            sgl: SgList::new(),
        };
        for id in 0..5 {
            f.post(wr(id)).unwrap();
        }
        let (s0, w0) = f.take().unwrap();
        let (s1, w1) = f.take().unwrap();
        let (s2, w2) = f.take().unwrap();
        f.give_back(s0, w0);
        f.give_back(s2, w2);
        f.consumed();
        let _ = (s1, w1);
        let ids: Vec<u64> = f.wrs.iter().map(|(_, w)| w.wr_id).collect();
        assert_eq!(ids, vec![0, 2, 3, 4]);
        assert_eq!(f.claimed, 0);
    }
}
