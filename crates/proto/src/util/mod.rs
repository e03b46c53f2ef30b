//! Small building blocks the transports share that belong to none of
//! them.
//!
//! * [`hash`]: a fast hasher for maps keyed by values this side chose
//!   (re-exported as `crate::dc::LocalHasher` / `LocalMap`);
//! * `peers`: the peer table of the datagram QPs, a hash index over a
//!   dense vector that remembers the last entry it found.
//!
//! Contract: nothing here knows about a wire format or a queue pair.

pub mod hash;
pub(crate) mod peers;
