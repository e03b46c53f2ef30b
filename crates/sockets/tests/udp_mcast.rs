//! UDP multicast under the interposer (`tests/c/udp_mcast.c`): with
//! `SOFTRDMA_SOCKETS_MCAST=ud` on both ends the group's datagrams go over
//! UD multicast, each delivered once; without it they stay the kernel's,
//! also delivered once.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

mod common;
use common::{build_c, finish, text, Scratch};

struct Run {
    scratch: Scratch,
    exe: PathBuf,
}

impl Run {
    fn new(name: &str) -> Run {
        let scratch = Scratch::new(&format!("udp-mcast-{name}"));
        let exe = build_c(&scratch.dir, "udp_mcast", &[]);
        Run { scratch, exe }
    }

    fn cmd(&self, args: &[&str], mcast: bool) -> Command {
        let mut c = self.scratch.command(&self.exe, true);
        c.args(args)
            .env_remove("SOFTRDMA_SOCKETS")
            .env_remove("SOFTRDMA_SOCKETS_UDP");
        if mcast {
            c.env("SOFTRDMA_SOCKETS_MCAST", "ud");
        } else {
            c.env_remove("SOFTRDMA_SOCKETS_MCAST");
        }
        c
    }

    fn ud_tx_bytes(&self) -> u64 {
        self.scratch.report_sum("ud_tx_bytes")
    }

    /// One receiver and one sender on a group of their own; the
    /// receiver's output.
    fn exchange(&self, mcast: bool) -> String {
        let pid = std::process::id();
        let group = format!("239.77.{}.{}", (pid >> 8) as u8, pid as u8);
        let port = std::net::UdpSocket::bind("0.0.0.0:0")
            .and_then(|s| s.local_addr())
            .expect("a free port")
            .port()
            .to_string();
        let recv = self
            .cmd(&["recv", &group, &port], mcast)
            .spawn()
            .expect("receiver starts");
        std::thread::sleep(Duration::from_millis(500));
        let send = self
            .cmd(&["send", &group, &port], mcast)
            .spawn()
            .expect("sender starts");
        let s = finish(send, Duration::from_secs(30), "sender");
        let r = finish(recv, Duration::from_secs(30), "receiver");
        assert!(s.status.success(), "sender: {}", text(&s));
        assert!(r.status.success(), "receiver: {}", text(&r));
        text(&r)
    }
}

fn each_once(r: &str) {
    for i in 0..3 {
        let line = format!("got datagram-{i}\n");
        assert_eq!(r.matches(&line).count(), 1, "{r}");
    }
    assert!(r.contains("received 3"), "{r}");
}

#[test]
fn with_the_policy_the_group_goes_over_ud_once() {
    let run = Run::new("ud");
    let r = run.exchange(true);
    each_once(&r);
    assert_eq!(run.ud_tx_bytes(), 3 * 10, "the three datagrams over UD");
}

#[test]
fn without_it_the_kernel_carries_the_group() {
    let run = Run::new("kernel");
    let r = run.exchange(false);
    each_once(&r);
    assert_eq!(run.ud_tx_bytes(), 0, "nothing over UD");
}
