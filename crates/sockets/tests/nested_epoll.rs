//! Nested epoll sets and signals on a carried connection, from a C
//! program (`tests/c/nested_epoll.c`): the client waits for a carried
//! socket through an epoll set inside another (level-triggered,
//! edge-triggered, one-shot, three sets deep), through `poll` and
//! `select` on an epoll descriptor, checks loops, removal and closing,
//! and a blocking read interrupted by a signal. The same program runs
//! under the kernel alone, which shows its checks are the kernel's
//! semantics.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

mod common;
use common::{build_c, finish, free_tcp_port, text, Scratch};

struct Run {
    scratch: Scratch,
}

impl Run {
    fn new(name: &str) -> Run {
        Run {
            scratch: Scratch::new(&format!("nested-epoll-{name}")),
        }
    }

    fn build(&self) -> PathBuf {
        build_c(&self.scratch.dir, "nested_epoll", &["-pthread"])
    }

    fn cmd(&self, exe: &Path, args: &[&str], interposed: bool) -> Command {
        let mut c = self.scratch.command(exe, interposed);
        c.args(args).env_remove("SOFTRDMA_SOCKETS");
        c
    }

    /// The `rc_conns=` totals of the processes' exit reports.
    fn rc_conns(&self) -> u64 {
        self.scratch.report_sum("rc_conns")
    }
}

/// Runs server and client; returns their outputs.
fn pair(run: &Run, interposed: bool) -> (Output, Output) {
    let exe = run.build();
    let port = free_tcp_port().to_string();
    let mut server = run
        .cmd(&exe, &["server", &port], interposed)
        .spawn()
        .expect("server starts");
    // The client connects once the server listens (its first line).
    let mut first = [0u8; 10];
    use std::io::Read;
    server
        .stdout
        .as_mut()
        .expect("server stdout")
        .read_exact(&mut first)
        .expect("server says it listens");
    assert_eq!(&first, b"listening\n");
    let client = run
        .cmd(&exe, &["client", &port], interposed)
        .spawn()
        .expect("client starts");
    let c = finish(client, Duration::from_secs(60), "client");
    let s = finish(server, Duration::from_secs(30), "server");
    (c, s)
}

fn line_value(out: &str, key: &str) -> Option<i64> {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn nested_sets_report_a_carried_socket_and_signals_restart_as_in_the_kernel() {
    let run = Run::new("rc");
    let (c, s) = pair(&run, true);
    let (ct, st) = (text(&c), text(&s));
    assert!(c.status.success(), "client: {ct}");
    assert!(s.status.success(), "server: {st}");
    assert!(ct.contains("all checks passed"), "{ct}");
    assert!(st.contains("server: echoed 13 records"), "{st}");
    assert_eq!(
        line_value(&ct, "transport: "),
        Some(1),
        "the connection is carried over RC: {ct}"
    );
    // One level of the kernel's five goes to softrdma's own wait chain.
    assert_eq!(line_value(&ct, "depth: "), Some(4), "{ct}");
    assert_eq!(run.rc_conns(), 2, "both ends count one RC connection");
}

#[test]
fn the_same_checks_hold_under_the_kernel_alone() {
    let run = Run::new("kernel");
    let (c, s) = pair(&run, false);
    let (ct, st) = (text(&c), text(&s));
    assert!(c.status.success(), "client: {ct}");
    assert!(s.status.success(), "server: {st}");
    assert!(ct.contains("all checks passed"), "{ct}");
    assert_eq!(line_value(&ct, "transport: "), Some(0), "{ct}");
    assert_eq!(line_value(&ct, "depth: "), Some(5), "{ct}");
    assert_eq!(run.rc_conns(), 0, "no interposer, no report");
}
