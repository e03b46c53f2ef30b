//! `softrdma`: the command-line entry point (grown by later issues).
fn main() {
    eprintln!("softrdma {}: no subcommands yet", env!("CARGO_PKG_VERSION"));
    std::process::exit(2);
}
