//! `softrdma`: the command-line entry point.
//!
//! ```text
//! softrdma rping -s|-c [-a ADDR] [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V] [-d]
//! ```

mod perf;
mod rping;
mod run;

use std::process::ExitCode;

const USAGE: &str = "usage: softrdma COMMAND [ARGS]

commands:
  perf    benchmarks with same-run raw-socket baselines (softrdma perf -h)
  rping   rping-compatible ping over an RC connection (softrdma rping -h)
  run     run an unmodified verbs program over softrdma (softrdma run -- PROG ARGS)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("rping") => rping::main(&args[1..]),
        Some("perf") => perf::main(&args[1..]),
        Some("run") => run::main(&args[1..]),
        Some("-h") | Some("--help") | Some("help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some("--version") => {
            println!("softrdma {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("softrdma: unknown command '{other}'\n{USAGE}");
            ExitCode::from(2)
        }
        None => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
