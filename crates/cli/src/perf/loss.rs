//! `softrdma perf loss` (issue 5).

use std::process::ExitCode;

/// Entry point of `softrdma perf loss ARGS`.
pub fn main(args: &[String]) -> ExitCode {
    let _ = args;
    eprintln!("softrdma perf loss: not implemented yet");
    ExitCode::from(2)
}
