//! Peer benchmarks run side by side with softrdma (filled in below).

use super::cell::{Kind, WaitMode};
use super::report::PerfResult;

/// Runs every installed peer at `sizes`; returns which were found and
/// their results.
pub(crate) fn run_all(
    sizes: &[usize],
    kind: Kind,
    wait: WaitMode,
    progress: &mut dyn FnMut(&str),
) -> (String, Vec<PerfResult>) {
    let _ = (sizes, kind, wait, progress);
    ("peers: not implemented yet".into(), Vec::new())
}
