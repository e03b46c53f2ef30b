//! `SOFTRDMA_TRANSPORT` on UDP sockets (`softrdma/sockets.h`) from a C
//! program built against the header: each end chooses its socket's
//! transport before the socket is bound or used; ends that agree carry
//! their datagrams over that queue pair (the option reads it back, the
//! exit report counts UD octets), ends that disagree or choose the kernel
//! go through the kernel, and the echo arrives intact either way.
//! Without the interposer the option is refused with `ENOPROTOOPT`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

mod common;
use common::{build_c, finish, free_udp_port, text, Scratch};

struct Run {
    scratch: Scratch,
    exe: PathBuf,
}

impl Run {
    fn new(name: &str) -> Run {
        let scratch = Scratch::new(&format!("udp-transport-{name}"));
        let exe = build_c(&scratch.dir, "udp_transport", &[]);
        Run { scratch, exe }
    }

    fn cmd(&self, args: &[&str], interposed: bool) -> Command {
        let mut c = self.scratch.command(&self.exe, interposed);
        c.args(args)
            .env_remove("SOFTRDMA_SOCKETS")
            .env_remove("SOFTRDMA_SOCKETS_UDP");
        c
    }

    /// UD octets sent, summed over the processes' exit reports.
    fn ud_tx_bytes(&self) -> u64 {
        self.scratch.report_sum("ud_tx_bytes")
    }

    /// Runs a server choosing `st` and a client choosing `ct`; their
    /// outputs.
    fn pair(&self, st: &str, ct: &str) -> (String, String) {
        let port = free_udp_port().to_string();
        let server = self
            .cmd(&["server", &port, st], true)
            .spawn()
            .expect("server starts");
        std::thread::sleep(Duration::from_millis(300));
        let client = self
            .cmd(&["client", &port, ct], true)
            .spawn()
            .expect("client starts");
        let c = finish(client, Duration::from_secs(30), "client");
        let s = finish(server, Duration::from_secs(30), "server");
        assert!(c.status.success(), "client: {}", text(&c));
        assert!(s.status.success(), "server: {}", text(&s));
        let (s, c) = (text(&s), text(&c));
        assert!(s.contains("echoed 23 octets"), "{s}");
        assert!(c.contains("echo intact"), "{c}");
        (s, c)
    }
}

#[test]
fn both_ends_choose_rd_over_a_ud_default() {
    let run = Run::new("rd");
    let (s, c) = run.pair("rd", "rd");
    for out in [&s, &c] {
        assert!(out.contains("rc refused: EINVAL"), "{out}");
        assert!(out.contains("before: transport 0"), "{out}");
        assert!(out.contains("late change refused: EBUSY"), "{out}");
    }
    assert!(s.contains("server: transport 3"), "{s}");
    assert!(c.contains("client: transport 3"), "{c}");
    assert_eq!(run.ud_tx_bytes(), 2 * 23, "both datagrams over the QPs");
}

#[test]
fn both_ends_choose_ud() {
    let run = Run::new("ud");
    let (s, c) = run.pair("ud", "default");
    assert!(s.contains("server: transport 2"), "{s}");
    assert!(c.contains("client: transport 2"), "{c}");
    assert_eq!(run.ud_tx_bytes(), 2 * 23, "both datagrams over the QPs");
}

#[test]
fn ends_that_disagree_go_through_the_kernel() {
    let run = Run::new("mismatch");
    let (s, c) = run.pair("rd", "ud");
    assert!(s.contains("server: transport 3"), "{s}");
    assert!(c.contains("client: transport 2"), "{c}");
    assert_eq!(run.ud_tx_bytes(), 0, "nothing over a QP");
}

#[test]
fn a_socket_left_to_the_kernel() {
    let run = Run::new("kernel");
    let (s, c) = run.pair("kernel", "default");
    assert!(s.contains("server: transport 0"), "{s}");
    assert!(!s.contains("late change"), "{s}");
    assert!(c.contains("client: transport 0"), "{c}");
    assert_eq!(run.ud_tx_bytes(), 0, "nothing over a QP");
}

#[test]
fn without_the_interposer_the_option_is_refused() {
    let run = Run::new("none");
    let out = run
        .cmd(&["client", &free_udp_port().to_string(), "ud"], false)
        .output()
        .expect("runs");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("option refused: ENOPROTOOPT"), "{t}");
}
