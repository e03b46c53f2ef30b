//! The TCP congestion control algorithm of a `softrdma perf` run.
//!
//! Every TCP connection of a run — the raw-socket baselines' and the RC
//! QPs' (through `SOFTRDMA_TCP_CONGESTION`) — runs one algorithm, so a
//! ratio compares protocol work under the same congestion control. Both
//! set it before the connection exists ([`listen`], [`connect`], and the
//! engine's listeners and connects alike): set on an established
//! connection, a bbr default has already run its initialisation, which
//! leaves the kernel's pacing on. Which one:
//!
//! 1. `--tcp-cc NAME|system` on the command line;
//! 2. else what the parent process settled (`SOFTRDMA_PERF_TCP_CC`, set
//!    for the children it starts: servers, the suite's groups, the loss
//!    and scale roles);
//! 3. else `SOFTRDMA_TCP_CONGESTION` if the user set it;
//! 4. else `cubic` when the kernel allows it to this process, otherwise
//!    the system's default (`system`).
//!
//! Why not simply the system's default: on hosts whose default is `bbr`,
//! loopback TCP streams are bimodal. Measured on this project's 2-core VM,
//! eight raw `tcp_bw` runs of 4 066 messages of 64 KiB each: under cubic
//! 44.7-47.2 Gbit/s every time; under bbr 17.9-21.3 in three of six and
//! 43.2-45.2 in the others (pinning the two processes to separate CPUs
//! did not change it); 1 MiB streams 69-72 under cubic against 34-39.
//! Each side of a ratio lands in either mode, so under bbr a bandwidth
//! ratio reads anywhere from 0.4 to 2.5. Latency is the same under both.
//! `--tcp-cc system` keeps the host's default.
//!
//! The peers (`fi_pingpong`, `ucx_perftest`) open their own sockets and
//! run the system's default whatever this says; [`peers_note`] says so
//! when that differs.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// The engine's variable: the algorithm of every RC QP's connection.
const ENGINE_VAR: &str = "SOFTRDMA_TCP_CONGESTION";

/// The settled choice, handed to child processes: a name or `system`.
const SETTLED_VAR: &str = "SOFTRDMA_PERF_TCP_CC";

/// The algorithm chosen when nothing says otherwise and the kernel allows it.
pub(crate) const DEFAULT: &str = "cubic";

/// Reads `/proc/sys/net/ipv4/NAME`, trimmed (empty if unreadable).
fn sysctl(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The system's default algorithm (`net.ipv4.tcp_congestion_control`), if
/// readable.
pub(crate) fn system_default() -> Option<String> {
    Some(sysctl("tcp_congestion_control")).filter(|s| !s.is_empty())
}

/// Checks `--tcp-cc NAME`: `system`, or an algorithm the kernel lets this
/// process set; `Err` says why not (the kernel's reason, without the
/// engine's variable name).
pub(crate) fn check(name: &str) -> Result<(), String> {
    if name == "system" {
        return Ok(());
    }
    softrdma_engine::check_tcp_congestion(name).map_err(|e| {
        let e = e.to_string();
        e.split_once(": ")
            .map_or(e.as_str(), |(_, why)| why)
            .to_string()
    })
}

/// Settles the run's algorithm (module docs) and puts it in this process's
/// environment, for the engine's contexts and the children this process
/// starts. Call before any thread exists. `Err`: the kernel refuses the
/// algorithm asked for.
pub(crate) fn settle(asked: Option<&str>) -> Result<(), String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    // The choice and what asked for it (for an error message).
    let (choice, source) = if let Some(a) = asked {
        (a.to_string(), "--tcp-cc")
    } else if let Some(c) = env(SETTLED_VAR) {
        (c, SETTLED_VAR)
    } else if let Some(c) = env(ENGINE_VAR) {
        (c, ENGINE_VAR)
    } else if softrdma_engine::check_tcp_congestion(DEFAULT).is_ok() {
        (DEFAULT.to_string(), "the default")
    } else {
        ("system".to_string(), "the default")
    };
    if choice == "system" {
        std::env::remove_var(ENGINE_VAR);
    } else {
        check(&choice).map_err(|why| {
            // Say what asked for it.
            if source.starts_with("SOFTRDMA_") {
                format!("{source}={choice}: {why}")
            } else {
                format!("{source} {choice}: {why}")
            }
        })?;
        std::env::set_var(ENGINE_VAR, &choice);
    }
    std::env::set_var(SETTLED_VAR, &choice);
    Ok(())
}

/// The algorithm this run's connections use: the one settled, else the
/// system's default (`unknown` if unreadable).
pub(crate) fn current_name() -> String {
    chosen()
        .or_else(system_default)
        .unwrap_or_else(|| "unknown".into())
}

/// The algorithm this run sets on its sockets (`None`: it keeps the
/// system's default).
pub(crate) fn chosen() -> Option<String> {
    std::env::var(ENGINE_VAR).ok().filter(|v| !v.is_empty())
}

/// Gives a baseline's listening socket algorithm `cc`, which every
/// connection it accepts inherits from its first packet (as the engine's
/// listeners do).
pub(crate) fn listen(l: &TcpListener, cc: Option<&str>) -> io::Result<()> {
    match cc {
        Some(cc) => softrdma_engine::set_tcp_congestion(l, cc),
        None => Ok(()),
    }
}

/// Connects a baseline's TCP socket with algorithm `cc` set before its SYN
/// (as the engine's connects do: set afterwards, a bbr default would have
/// been initialised on the connection and left the kernel's pacing on).
pub(crate) fn connect(
    to: &SocketAddr,
    timeout: Duration,
    cc: Option<&str>,
) -> io::Result<TcpStream> {
    softrdma_engine::tcp_connect(to, timeout, cc)
}

/// What the run's connections use and how it relates to the system's
/// default: `cubic (system default bbr)`, `bbr (the system default)`,
/// `the system's (unreadable)`.
pub(crate) fn summary() -> String {
    let cc = current_name();
    match system_default() {
        Some(sys) if sys != cc => format!("{cc} (system default {sys})"),
        Some(_) => format!("{cc} (the system default)"),
        None if cc == "unknown" => "the system's (unreadable)".into(),
        None => format!("{cc} (system default unreadable)"),
    }
}

/// For a header line: `TCP congestion control cubic (system default
/// bbr)` ([`summary`]).
pub(crate) fn describe() -> String {
    let s = summary();
    let sep = if s.starts_with("the system's") {
        ": "
    } else {
        " "
    };
    format!("TCP congestion control{sep}{s}")
}

/// A note for peer results when the peers run another algorithm than the
/// run's own connections (they keep the system's default); `None` when
/// they are the same.
pub(crate) fn peers_note() -> Option<String> {
    let sys = system_default()?;
    let cc = chosen()?;
    (cc != sys).then(|| {
        format!(
            "the peers ran the system's TCP congestion control ({sys}), softrdma and raw \
             sockets {cc}; --tcp-cc system runs everything under {sys}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A baseline's pair of sockets both run the algorithm asked for: the
    /// connecting one from before its SYN, the accepted one from its
    /// listener (an allowed algorithm other than the system's default,
    /// else reno, which every kernel allows).
    #[test]
    fn listen_and_connect_give_both_ends_the_algorithm() {
        let default = system_default().unwrap_or_default();
        let allowed = sysctl("tcp_allowed_congestion_control");
        let want = allowed
            .split_whitespace()
            .find(|cc| *cc != default)
            .unwrap_or("reno");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        listen(&l, Some(want)).unwrap();
        let c = connect(&l.local_addr().unwrap(), Duration::from_secs(5), Some(want)).unwrap();
        let (a, _) = l.accept().unwrap();
        assert_eq!(softrdma_engine::tcp_congestion(&c).unwrap(), want);
        assert_eq!(softrdma_engine::tcp_congestion(&a).unwrap(), want);
        // Without a choice both keep the system's default.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        listen(&l, None).unwrap();
        let c = connect(&l.local_addr().unwrap(), Duration::from_secs(5), None).unwrap();
        let (a, _) = l.accept().unwrap();
        if !default.is_empty() {
            assert_eq!(softrdma_engine::tcp_congestion(&c).unwrap(), default);
            assert_eq!(softrdma_engine::tcp_congestion(&a).unwrap(), default);
        }
        // Refused: the error is the kernel's.
        let port = l.local_addr().unwrap().port();
        drop(l);
        let e = connect(
            &SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(5),
            Some(want),
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    }

    /// `--tcp-cc` is an option of `softrdma perf` taken before or after
    /// the sub-command; it needs a value (another option is none) and
    /// comes once.
    #[test]
    fn the_option_is_taken_wherever_it_is() {
        use clap::Parser;
        let cc = |args: &[&str]| {
            let argv = ["softrdma", "perf"].iter().chain(args);
            match crate::Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(crate::Command::Perf(p)) => Ok(p.tcp_cc),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.to_string()),
            }
        };
        assert_eq!(
            cc(&["suite", "--tcp-cc", "system", "--quick"]),
            Ok(vec!["system".to_string()])
        );
        assert_eq!(
            cc(&["--tcp-cc", "system", "suite"]),
            Ok(vec!["system".to_string()])
        );
        assert_eq!(cc(&["write_bw", "--size", "1Mi"]), Ok(vec![]));
        // Twice is refused after parsing (`perf::main`): both are kept.
        assert_eq!(
            cc(&["suite", "--tcp-cc", "system", "--tcp-cc", "reno"]),
            Ok(vec!["system".to_string(), "reno".to_string()])
        );
        for bad in [
            &["suite", "--tcp-cc"][..],
            &["suite", "--tcp-cc", "--quick"],
            &["suite", "--tcp-cc", "no_such_algorithm"],
        ] {
            let e = cc(bad).unwrap_err();
            assert!(e.contains("--tcp-cc"), "{bad:?}: {e}");
        }
    }
}
