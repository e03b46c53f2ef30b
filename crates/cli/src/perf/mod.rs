//! `softrdma perf`: perftest-style benchmarks whose every figure is a ratio
//! to a raw-socket baseline measured in the same run (issue 5).
//!
//! Sub-commands: `TEST` (send_lat, write_bw, …), `baseline`, `suite`,
//! `loss`, `scale`. Each returns an [`ExitCode`]; errors are printed on
//! stderr with the reason.

pub mod loss;
pub mod plot;
pub mod scale;

use std::process::ExitCode;

const USAGE: &str = "usage: softrdma perf suite|loss|scale|TEST [OPTIONS]";

/// Entry point of `softrdma perf ARGS`.
pub fn main(args: &[String]) -> ExitCode {
    match args.first().map(String::as_str) {
        Some("loss") => loss::main(&args[1..]),
        Some("scale") => scale::main(&args[1..]),
        Some("-h") | Some("--help") | None => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("softrdma perf: '{other}' is not implemented yet\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
