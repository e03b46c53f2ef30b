//! `softrdma perf scale` (issue 5).

use std::process::ExitCode;

/// Entry point of `softrdma perf scale ARGS`.
pub fn main(args: &[String]) -> ExitCode {
    let _ = args;
    eprintln!("softrdma perf scale: not implemented yet");
    ExitCode::from(2)
}
