//! RDMA Write-Record bookkeeping at the target, sans-IO
//! (`docs/datagram.md` §3.1 and §3.3, design brief §4).
//!
//! A Write-Record message is placed like an RDMA Write, one datagram per
//! segment, in any order. The datagram QP writes each segment's payload to
//! memory and then reports it here with [`Tracker::placed`]. The tracker
//! logs what was placed, in two ways the application chooses between
//! ([`RecordMode`]):
//!
//! * **CQ entries**: one [`WorkCompletion`] per message (opcode
//!   [`WcOpcode::RecvWriteRecord`], `wr_id` 0, `src` and `record` filled),
//!   with status [`WcStatus::Success`] when the whole message was placed, or
//!   [`WcStatus::RecordPartial`] listing the placed ranges when it was not.
//!   No posted receive is consumed.
//! * **A validity map** per STag: the octets written by Write-Record
//!   segments, which the application queries ([`Tracker::valid_ranges`],
//!   [`Tracker::is_valid`]) and clears ([`Tracker::clear`]) when it has
//!   consumed them.
//!
//! # Rules
//!
//! * **Messages.** A message is identified by (source, STag, T-MSN). Its
//!   base TO is `TO − T-MO` of any segment; its length is known once the
//!   segment with L arrives: `total = T-MO(last) + length(last)`. It is
//!   complete when the union of its placed ranges covers `[0, total)`; every
//!   octet counts once, however often it is placed.
//! * **One message in progress per (source, STag).** A segment with a newer
//!   MSN (serial-number arithmetic on `u32`, RFC 1982: see [`msn_newer`])
//!   retires the message in progress, which is then reported as partial or
//!   discarded ([`PartialAction`]). A segment with an older MSN is
//!   [`Placed::Stale`]: not recorded.
//! * **Partial messages.** A message that has placed no new octet for
//!   [`RecordConfig::partial_timeout`] is retired by
//!   [`Tracker::handle_timeout`]: [`PartialAction::Deliver`] gives a
//!   `RecordPartial` completion listing the placed ranges;
//!   [`PartialAction::Discard`] gives none and counts it. At most
//!   [`RecordConfig::max_in_progress`] messages are tracked; starting one
//!   more retires the one idle longest the same way (counted as evicted).
//!   A late segment of a message already retired as partial is
//!   [`Placed::Stale`]: a message is reported at most once.
//! * **Duplicates.** A segment of a message already completed (the last
//!   [`RecordConfig::dedup_window`] retired messages are remembered) is
//!   [`Placed::Duplicate`]: recorded neither in the CQ nor in the validity
//!   map, so a duplicate arriving after the application cleared the data
//!   does not make it valid again — and [`Tracker::admits`] refuses it, so
//!   the datagram QPs do not place it either (it could only overwrite what
//!   the application wrote there since). Beyond the window a very late
//!   duplicate may start a message again.
//! * **Malformed segments** never panic and are ignored (returned as
//!   [`Placed::Stale`], counted in [`RecordStats::malformed`]): `TO < T-MO`,
//!   `TO + length` or `T-MO + length` overflowing, a base TO that differs
//!   from the message's, a segment ending beyond the known total, a last
//!   segment whose end differs from the known total, or one ending before
//!   octets already placed.
//!
//! # The validity map
//!
//! * It is updated as segments are recorded, not on completion: it says
//!   which octets hold data from a Write-Record, whole message or not. Only
//!   octets new to their message are added (the union of what the message
//!   placed), so neither duplicates nor stale segments touch it.
//! * Retiring a message (newer MSN, timeout, eviction, with either partial
//!   action) leaves its octets valid: they were written. [`PartialAction`]
//!   governs only the CQ.
//! * The datagram QPs ask [`Tracker::admits`] before they place a segment
//!   and only check the STag of one it refuses (an older MSN, a late
//!   segment of a retired message, a duplicate of a completed one, an
//!   impossible range): such a segment
//!   changes no memory, so after a reordering the map and the partial
//!   record still describe memory octet for octet. What `admits` cannot
//!   see (a range contradicting its message, the fragment bound) is placed
//!   and then refused by [`Tracker::placed`]: only then may memory hold
//!   octets the map does not.
//! * Per STag it is a sorted set of disjoint, non-adjacent `[start, end)`
//!   intervals of at most [`MAX_VALID_INTERVALS`]. In-order segments extend
//!   an interval in place (no allocation). A range that would need one more
//!   interval than that is not added (counted in
//!   [`RecordStats::validity_overflow`]); a [`Tracker::clear`] that would
//!   split an interval of a full set keeps only the longer piece. So the map
//!   may miss octets that were written, but never claims an octet that no
//!   recorded segment wrote since it was last cleared.
//! * In [`RecordMode::Cq`] there is no map: nothing is valid.
//!
//! # Bounds
//!
//! Per message, at most [`RecordConfig::max_fragments`] disjoint placed
//! ranges are held (default [`DEFAULT_MAX_FRAGMENTS`]: every loss pattern
//! of a 16 MiB message cut into segments of at least 1 KiB fits, since a
//! message of `s` segments has at most `⌈s / 2⌉` disjoint ranges). The
//! range sets are reused: a retired message's set goes back to a small
//! pool and the next message takes it, so a stream of messages allocates
//! nothing once the sets have grown to the fragmentation seen; a set
//! grows (amortised doubling) only when a message is more fragmented than
//! any before, up to the bound. A segment that would need one range more
//! than the bound is not recorded at all ([`Placed::Stale`], counted in
//! [`RecordStats::overflow`], its octets neither in the CQ entry nor in the
//! validity map), so what is recorded is always exactly a set of placed
//! octets; the message then ends as partial unless later segments fill its
//! gaps. Worst-case memory is `max_in_progress · max_fragments · 8` octets
//! (a sender deliberately placing every other tiny segment).
//!
//! The validity map holds at most [`MAX_VALID_INTERVALS`] intervals per
//! STag (see above). Pending CQ entries are capped at
//! [`MAX_PENDING_COMPLETIONS`] (the caller drains
//! [`Tracker::poll_completion`] after every call; beyond the cap entries
//! are dropped and counted). Messages in progress are capped by
//! `max_in_progress`, remembered messages by `dedup_window`.
//!
//! # Layout
//!
//! This file holds the configuration, statistics and the rules' small
//! pieces. Beside it: `tracker` ([`Tracker`]), `message` (a message in
//! progress and its fragments), `validity` (the per-STag interval sets),
//! `history` (retired messages for duplicate detection).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use crate::memory::{MemError, Memory};
use crate::util::peers::PeerTable;
use crate::wr::{
    DgramAddr, WcOpcode, WcStatus, WorkCompletion, WriteRecordInfo, MAX_RECORD_RANGES,
};

mod history;
mod message;
mod tracker;
mod validity;

use history::History;
use message::{apply, Frags, Key, Msg, Reject};
pub use tracker::Tracker;
use validity::{set_add, set_remove};

/// Default of [`RecordConfig::max_fragments`]: a 16 MiB message (the
/// largest UD message) cut into segments of 1 KiB or more has at most
/// this many disjoint placed ranges, whatever was lost.
pub const DEFAULT_MAX_FRAGMENTS: usize = 8192;
/// Most disjoint valid intervals held for one STag in the validity map
/// (twice [`DEFAULT_MAX_FRAGMENTS`]: the holes of a maximally fragmented
/// message fit, with room for others not yet cleared).
pub const MAX_VALID_INTERVALS: usize = 2 * DEFAULT_MAX_FRAGMENTS;
/// Most idle range sets kept for reuse by later messages.
const SPARE_FRAGS: usize = 64;
/// Most CQ entries waiting in [`Tracker::poll_completion`].
pub const MAX_PENDING_COMPLETIONS: usize = 4096;

/// How Write-Record messages are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordMode {
    /// One CQ entry per message.
    Cq,
    /// The per-STag validity map only.
    ValidityMap,
    /// Both.
    Both,
}

impl RecordMode {
    fn cq(self) -> bool {
        matches!(self, RecordMode::Cq | RecordMode::Both)
    }

    fn map(self) -> bool {
        matches!(self, RecordMode::ValidityMap | RecordMode::Both)
    }
}

/// What becomes of a message retired before it was wholly placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PartialAction {
    /// A [`WcStatus::RecordPartial`] CQ entry listing the placed ranges.
    Deliver,
    /// No CQ entry; counted in [`RecordStats::partial_discarded`].
    Discard,
}

/// Write-Record settings of a datagram QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordConfig {
    /// CQ entries, validity map, or both.
    pub mode: RecordMode,
    /// How long a message may place no new octet before it is retired as
    /// partial. `Duration::MAX` (or anything that overflows `Instant`)
    /// means never.
    pub partial_timeout: Duration,
    /// What a partial message gives.
    pub partial_action: PartialAction,
    /// Messages tracked at once; starting one more retires the one idle
    /// longest as partial. 0 is taken as 1.
    pub max_in_progress: usize,
    /// Retired (source, STag, MSN) remembered to tell duplicates and late
    /// segments from new messages. 0 disables duplicate suppression after
    /// a message is retired.
    pub dedup_window: usize,
    /// Most disjoint placed ranges held for one message in progress; a
    /// segment that would need one more is not recorded (counted in
    /// [`RecordStats::overflow`]). 0 is taken as 1.
    pub max_fragments: usize,
}

impl Default for RecordConfig {
    /// Both logs, 100 ms, deliver partials, 1024 messages, 4096 remembered,
    /// [`DEFAULT_MAX_FRAGMENTS`] ranges per message.
    fn default() -> Self {
        RecordConfig {
            mode: RecordMode::Both,
            partial_timeout: Duration::from_millis(100),
            partial_action: PartialAction::Deliver,
            max_in_progress: 1024,
            dedup_window: 4096,
            max_fragments: DEFAULT_MAX_FRAGMENTS,
        }
    }
}

/// What [`Tracker::placed`] did with a segment. The datagram QPs place
/// only what [`Tracker::admits`]: the payload is in memory for every
/// outcome but a [`Placed::Stale`] that `admits` refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placed {
    /// It started a message (retiring an older one of the same source and
    /// STag, if any).
    Started,
    /// It belongs to the message in progress, which is not complete yet.
    Continued,
    /// It completed its message: a CQ entry is waiting (CQ modes).
    Completed,
    /// Its message was already completed: not recorded again.
    Duplicate,
    /// Not recorded: an older MSN, a late segment of a message already
    /// retired as partial, a malformed range, or beyond the per-message
    /// fragment bound [`RecordConfig::max_fragments`] ([`RecordStats`] says
    /// which).
    Stale,
}

/// Counters of a [`Tracker`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RecordStats {
    /// Messages wholly placed.
    pub completed: u64,
    /// Partial messages reported (`RecordPartial`), whatever retired them.
    pub partial_delivered: u64,
    /// Partial messages dropped without a CQ entry, whatever retired them.
    pub partial_discarded: u64,
    /// Of the partial ones: retired by a newer MSN of the same source and
    /// STag.
    pub retired_by_newer_msn: u64,
    /// Segments of already completed messages.
    pub duplicates: u64,
    /// Segments with an older MSN, or of a message already retired
    /// partial.
    pub stale_segments: u64,
    /// Of the partial ones: retired because `max_in_progress` were tracked.
    pub evicted: u64,
    /// Malformed segments ignored (see the module documentation).
    pub malformed: u64,
    /// Segments not recorded because their message already had
    /// [`RecordConfig::max_fragments`] disjoint ranges (their octets were
    /// placed but are in neither log).
    pub overflow: u64,
    /// Ranges the validity map could not hold ([`MAX_VALID_INTERVALS`]).
    pub validity_overflow: u64,
    /// CQ entries dropped because [`MAX_PENDING_COMPLETIONS`] were waiting.
    pub cq_overflow: u64,
}

/// A segment's message base (`TO − T-MO`) and end within its message
/// (`T-MO + length`); `None` for a range that cannot be a message's.
fn geometry(to: u64, mo: u32, len: u32) -> Option<(u64, u32)> {
    to.checked_add(u64::from(len))?;
    Some((to.checked_sub(u64::from(mo))?, mo.checked_add(len)?))
}

/// Where a segment stands against the messages of its source and STag
/// ([`Tracker::judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Judged {
    /// Of the message in progress.
    InProgress,
    /// Of a message already completed.
    Duplicate,
    /// Of a message retired as partial, or older than the one in progress
    /// or the newest retired: dropped.
    Stale,
    /// Of a message newer than the one in progress, which it retires.
    Newer,
    /// Of a message that starts with it (none in progress).
    Fresh,
}

/// Whether MSN `a` is newer than `b` in serial-number arithmetic (RFC 1982
/// on 32 bits): `a ≠ b` and `a − b (mod 2³²) < 2³¹`. Two MSNs exactly 2³¹
/// apart are neither newer nor older.
pub fn msn_newer(a: u32, b: u32) -> bool {
    let d = a.wrapping_sub(b);
    d != 0 && d < 0x8000_0000
}

#[cfg(test)]
mod tests;
