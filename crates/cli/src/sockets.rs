//! `softrdma sockets stat PID` and `softrdma sockets list`: what the
//! sockets interposer (`softrdma run --sockets`) is doing in running
//! programs.
//!
//! Each interposed process keeps a statistics table in shared memory,
//! `<registry dir>/stat.<pid>` (`SOFTRDMA_SOCKETS_DIR`, default
//! `/dev/shm/softrdma-sockets`); these commands read it through
//! `softrdma_sockets_core::stat` without stopping or signalling the
//! process. `stat` prints one process's totals and its sockets; `list`
//! the processes that have a table, with their totals. Tables of
//! processes that are gone are removed on the way.

use std::io;
use std::process::ExitCode;

use softrdma_sockets_core::registry;
use softrdma_sockets_core::stat::{self, Row, Totals};

/// `softrdma sockets COMMAND`.
#[derive(Debug, clap::Args)]
#[command(
    about = "Show the sockets of programs running under softrdma run --sockets",
    long_about = "Reads the statistics tables that programs running under \
        `softrdma run --sockets` keep in shared memory (in the registry directory: \
        $SOFTRDMA_SOCKETS_DIR, default /dev/shm/softrdma-sockets; set it as the programs \
        had it). The programs are not stopped or signalled.",
    after_long_help = "Exit status: 0; 1 when `stat` finds no table for the process \
        (not running, not interposed, or statistics off with SOFTRDMA_SOCKETS_STATS=0)."
)]
pub(crate) struct SocketsArgs {
    #[command(subcommand)]
    command: SocketsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SocketsCommand {
    Stat(StatArgs),
    List(ListArgs),
}

/// `softrdma sockets stat PID [--json]`.
#[derive(Debug, clap::Args)]
#[command(
    about = "Print a process's socket totals and per-socket table",
    long_about = "Prints the totals of process PID (connections carried over RC, \
        connection ends left to the kernel, octets sent and received over RC, datagram \
        sockets given a UD queue pair and their octets) as one line of key=value pairs, then one row per live socket: descriptor, tcp or udp, \
        role, state (pending, kernel, handshake, rc, closed, inherited), why it is not \
        accelerated, addresses, octets and messages each way."
)]
struct StatArgs {
    /// The process (running under `softrdma run --sockets`).
    #[arg(value_name = "PID")]
    pid: u32,
    /// One JSON object instead: {"pid", "totals": {...}, "sockets": [...]}.
    #[arg(long)]
    json: bool,
}

/// `softrdma sockets list [--json]`.
#[derive(Debug, clap::Args)]
#[command(
    about = "List the interposed processes and their totals",
    long_about = "Prints, for every process that has a statistics table in the registry \
        directory, its totals line (pid=N rc_conns=N kernel_conns=N rc_tx_bytes=N \
        rc_rx_bytes=N ud_socks=N ud_tx_bytes=N ud_rx_bytes=N), by pid. Nothing when there is none."
)]
struct ListArgs {
    /// A JSON array instead: [{"pid", "totals": {...}}, ...].
    #[arg(long)]
    json: bool,
}

/// Entry point of `softrdma sockets`.
pub(crate) fn main(a: SocketsArgs) -> ExitCode {
    match a.command {
        SocketsCommand::Stat(s) => stat_main(&s),
        SocketsCommand::List(l) => list_main(&l),
    }
}

fn totals_json(t: &Totals) -> serde_json::Value {
    serde_json::json!({
        "rc_conns": t.rc_conns,
        "kernel_conns": t.kernel_conns,
        "rc_tx_bytes": t.rc_tx_bytes,
        "rc_rx_bytes": t.rc_rx_bytes,
        "ud_socks": t.ud_socks,
        "ud_tx_bytes": t.ud_tx_bytes,
        "ud_rx_bytes": t.ud_rx_bytes,
    })
}

fn row_json(r: &Row) -> serde_json::Value {
    serde_json::json!({
        "fd": r.fd,
        "kind": r.kind.as_str(),
        "role": r.role.as_str(),
        "state": r.state.as_str(),
        "reason": r.reason.as_str(),
        "local": r.local,
        "peer": r.peer,
        "tx_bytes": r.tx_bytes,
        "rx_bytes": r.rx_bytes,
        "tx_msgs": r.tx_msgs,
        "rx_msgs": r.rx_msgs,
    })
}

/// `stat`'s JSON object.
fn stat_json(pid: u32, t: &Totals, rows: &[Row]) -> serde_json::Value {
    serde_json::json!({
        "pid": pid,
        "totals": totals_json(t),
        "sockets": rows.iter().map(row_json).collect::<Vec<_>>(),
    })
}

fn stat_main(a: &StatArgs) -> ExitCode {
    match stat::snapshot(a.pid) {
        Ok((t, rows)) => {
            if a.json {
                println!("{}", stat_json(a.pid, &t, &rows));
            } else {
                println!("{}", t.line(a.pid));
                print!("{}", stat::format_table(&rows));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            // The error names the process or its table file.
            eprintln!("softrdma sockets stat: {e}");
            ExitCode::from(1)
        }
    }
}

/// The pids that have a `stat.<pid>` file in the registry directory, in
/// order (none when the directory does not exist).
fn table_pids() -> io::Result<Vec<u32>> {
    let entries = match std::fs::read_dir(registry::dir()) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("stat."))
                .and_then(|p| p.parse().ok())
        })
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

fn list_main(a: &ListArgs) -> ExitCode {
    let pids = match table_pids() {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "softrdma sockets list: cannot read {}: {e}",
                registry::dir().display()
            );
            return ExitCode::from(1);
        }
    };
    let mut found = Vec::new();
    for pid in pids {
        match stat::snapshot(pid) {
            Ok((t, _)) => found.push((pid, t)),
            // Gone since the directory was read (its file is removed).
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => eprintln!("softrdma sockets list: process {pid}: {e}"),
        }
    }
    if a.json {
        let v: Vec<_> = found
            .iter()
            .map(|(pid, t)| serde_json::json!({ "pid": pid, "totals": totals_json(t) }))
            .collect();
        println!("{}", serde_json::Value::Array(v));
    } else {
        for (pid, t) in &found {
            println!("{}", t.line(*pid));
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_sockets_core::stat::{Kind, Reason, Role, State};

    #[test]
    fn json_carries_every_field() {
        let t = Totals {
            rc_conns: 2,
            kernel_conns: 1,
            rc_tx_bytes: 300,
            rc_rx_bytes: 400,
            ud_socks: 5,
            ud_tx_bytes: 600,
            ud_rx_bytes: 700,
        };
        let row = Row {
            fd: 7,
            kind: Kind::Stream,
            role: Role::Client,
            state: State::Rc,
            reason: Reason::None,
            local: "127.0.0.1:40000".into(),
            peer: "127.0.0.1:6379".into(),
            tx_bytes: 300,
            rx_bytes: 400,
            tx_msgs: 3,
            rx_msgs: 4,
        };
        let v = stat_json(42, &t, &[row]);
        assert_eq!(v["pid"], 42);
        assert_eq!(v["totals"]["rc_conns"], 2);
        assert_eq!(v["totals"]["kernel_conns"], 1);
        assert_eq!(v["totals"]["rc_tx_bytes"], 300);
        assert_eq!(v["totals"]["rc_rx_bytes"], 400);
        assert_eq!(v["totals"]["ud_socks"], 5);
        assert_eq!(v["totals"]["ud_tx_bytes"], 600);
        assert_eq!(v["totals"]["ud_rx_bytes"], 700);
        let s = &v["sockets"][0];
        assert_eq!(s["fd"], 7);
        assert_eq!(s["kind"], "tcp");
        assert_eq!(s["role"], "client");
        assert_eq!(s["state"], "rc");
        assert_eq!(s["reason"], "-");
        assert_eq!(s["local"], "127.0.0.1:40000");
        assert_eq!(s["peer"], "127.0.0.1:6379");
        assert_eq!(s["tx_msgs"], 3);
        assert_eq!(s["rx_msgs"], 4);
        assert_eq!(v["sockets"].as_array().map(Vec::len), Some(1));
    }
}
