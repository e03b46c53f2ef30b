//! `SOFTRDMA_DDPMODE` (`softrdma/sockets.h`) from a C program built
//! against the header: with `SOFTRDMA_SOCKETS=ddpmode` a connected socket
//! is plain until both ends switch it, then carries its bytes over RC; a
//! peer that does not switch leaves the socket plain and its data intact;
//! without the interposer the option is refused with `ENOPROTOOPT`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{build_c, finish, free_tcp_port, text, Scratch};

struct Run {
    scratch: Scratch,
}

impl Run {
    fn new(name: &str) -> Run {
        Run {
            scratch: Scratch::new(&format!("ddpmode-{name}")),
        }
    }

    fn build(&self) -> PathBuf {
        build_c(&self.scratch.dir, "ddpmode", &[])
    }

    fn cmd(&self, exe: &Path, args: &[&str], interposed: bool) -> Command {
        let mut c = self.scratch.command(exe, interposed);
        c.args(args).env("SOFTRDMA_SOCKETS", "ddpmode");
        c
    }

    fn rc_conns(&self) -> u64 {
        self.scratch.report_sum("rc_conns")
    }

    /// Runs an interposed server and an interposed client started as
    /// `client`; their outputs, both successful.
    fn pair(&self, client: &str) -> (String, String) {
        let exe = self.build();
        let port = free_tcp_port().to_string();
        // The server accepts one connection: no probe, a pause instead.
        let server = self
            .cmd(&exe, &["server", &port], true)
            .spawn()
            .expect("server starts");
        std::thread::sleep(Duration::from_millis(300));
        let client = self
            .cmd(&exe, &[client, &port], true)
            .spawn()
            .expect("client starts");
        let c = finish(client, Duration::from_secs(30), "client");
        let s = finish(server, Duration::from_secs(30), "server");
        assert!(c.status.success(), "client: {}", text(&c));
        assert!(s.status.success(), "server: {}", text(&s));
        (text(&s), text(&c))
    }
}

#[test]
fn both_ends_switch_and_the_data_goes_over_rc() {
    let run = Run::new("both");
    let (s, c) = run.pair("client");
    assert!(s.contains("switch: ok, DDPMODE reads 1"), "{s}");
    assert!(s.contains("octets intact"), "{s}");
    assert!(c.contains("switch: ok, DDPMODE reads 1"), "{c}");
    assert_eq!(run.rc_conns(), 2, "both ends count one RC connection");
}

#[test]
fn a_peer_that_does_not_switch_leaves_the_socket_plain() {
    let run = Run::new("noswitch");
    let (s, _) = run.pair("noswitch-client");
    assert!(s.contains("peer did not switch; plain data intact"), "{s}");
    assert_eq!(run.rc_conns(), 0, "nothing went over RC");
}

#[test]
fn without_the_interposer_the_option_is_refused() {
    let run = Run::new("none");
    let exe = run.build();
    // A client alone: its switch fails with ENOPROTOOPT from the kernel.
    let port = free_tcp_port();
    let l = std::net::TcpListener::bind(("127.0.0.1", port)).expect("listener");
    let client = run
        .cmd(&exe, &["client", &port.to_string()], false)
        .spawn()
        .expect("client starts");
    let (mut conn, _) = l.accept().expect("accept");
    use std::io::{Read, Write};
    let mut hi = [0u8; 3];
    conn.read_exact(&mut hi).expect("hi");
    conn.write_all(b"ok\n").expect("ok");
    let c = finish(client, Duration::from_secs(30), "client");
    assert!(!c.status.success());
    assert!(
        text(&c).contains(&format!("errno {}", libc::ENOPROTOOPT)),
        "{}",
        text(&c)
    );
}
