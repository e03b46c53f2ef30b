//! `softrdma perf suite` (filled in below).

use std::process::ExitCode;

/// Entry point of `softrdma perf suite ARGS`.
pub(crate) fn main(args: &[String]) -> ExitCode {
    let _ = args;
    eprintln!("softrdma perf suite: not implemented yet");
    ExitCode::from(2)
}
