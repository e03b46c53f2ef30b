//! `softrdma`: the command-line entry point.
//!
//! The command line is declared with clap's derive API: [`Cli`] and its
//! [`Command`]s here, each command's options beside the code that runs it
//! ([`perf::PerfArgs`], [`rping::RpingArgs`], [`run::RunArgs`],
//! [`sockets::SocketsArgs`]). Every
//! option carries its doc comment as help; `softrdma help COMMAND` and
//! `--help` print the long form. A bad command line prints the error and
//! the command's usage on stderr and exits with status 2; `--help` and
//! `--version` print on stdout and exit 0.

mod perf;
mod rping;
mod run;
mod sockets;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// RDMA in user space: benchmarks, an rping, and a launcher for verbs
/// and TCP programs.
#[derive(Debug, Parser)]
#[command(
    name = "softrdma",
    version,
    // An option given twice takes the last value (as a script that adds
    // to a common set of options expects); --tcp-cc is the exception.
    args_override_self = true,
    long_about = "RDMA in user space, over the kernel's TCP and UDP sockets: iWARP RC \
        (reliable connections over TCP), UD and RD datagrams over UDP, and SoftDC \
        (dynamically connected). This tool measures softrdma against raw sockets \
        (perf), pings a peer the way rdma-core's rping does (rping), and runs \
        unmodified verbs programs over softrdma's drop-in libibverbs.so.1 and \
        librdmacm.so.1 (run), or unmodified TCP programs over its sockets interposer \
        (run --sockets), whose sockets it shows (sockets).",
    after_long_help = "Exit status: 0 on success, 1 when the command ran and failed, 2 for \
        a bad command line (run: 127 when the program or the libraries cannot be found).\n\n\
        `softrdma help COMMAND` or `softrdma COMMAND --help` describes a command."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
enum Command {
    Perf(perf::PerfArgs),
    Rping(rping::RpingArgs),
    Run(run::RunArgs),
    Sockets(sockets::SocketsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::try_parse().unwrap_or_else(|e| with_usage(e, std::env::args_os()).exit());
    match cli.command {
        Command::Perf(a) => perf::main(a),
        Command::Rping(a) => rping::main(a),
        Command::Run(a) => run::main(a),
        Command::Sockets(a) => sockets::main(a),
    }
}

/// Adds to a parse error that lacks it (a bad value, a missing value) the
/// usage line of the sub-command it is about, so that every error names
/// its command (`Usage: softrdma perf send_lat [OPTIONS]`). The
/// sub-command is the deepest one `argv` names.
fn with_usage(mut e: clap::Error, argv: impl IntoIterator<Item = OsString>) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    if !e.use_stderr() || e.get(ContextKind::Usage).is_some() {
        return e;
    }
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    let mut at = &mut cmd;
    for word in argv.into_iter().skip(1) {
        let Some(word) = word.to_str() else { continue };
        if at.get_subcommands().any(|c| c.get_name() == word) {
            at = at.find_subcommand_mut(word).expect("just found");
        }
    }
    let usage = at.render_usage();
    e.insert(ContextKind::Usage, ContextValue::StyledStr(usage));
    e
}

/// Prints a usage error about the command at `path` below `softrdma`
/// (`["perf", "send_lat"]`) in clap's own format, with that command's
/// usage line, and returns exit status 2. For the checks that need more
/// than one option or the test's own table (a transport that refuses the
/// test, `--versus` against itself, ...).
pub(crate) fn usage_error(path: &[&str], msg: &str) -> ExitCode {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    let mut at = &mut cmd;
    for name in path {
        at = at
            .find_subcommand_mut(name)
            .expect("usage_error: a command of this binary");
    }
    let _ = at
        .error(clap::error::ErrorKind::ValueValidation, msg)
        .print();
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap's own consistency checks (duplicate names, bad defaults,
    /// conflicts naming arguments that do not exist).
    #[test]
    fn the_command_line_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }
}
