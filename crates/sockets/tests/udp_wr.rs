//! `SOFTRDMA_TRANSPORT_WR` on UDP sockets (`softrdma/sockets.h`): a C
//! program built against the header echoes 360 datagrams of 1 octet to
//! 64 KiB (ping-pong, then bursts of six in flight) between two
//! interposed ends. Ends that both choose Write-Record carry the
//! datagrams as RDMA Write-Records (`SOFTRDMA_RECORDS` counts them on
//! both sides, none partial), the option reads back 4 and the exit
//! report counts the octets as datagram octets; ends that disagree go
//! through the kernel, intact as well. Partial delivery needs datagrams
//! lost inside a message, which loopback does not lose and the engine
//! has no switch to inject, so it is not exercised here.

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
        let scratch = Scratch::new(&format!("udp-wr-{name}"));
        let exe = build_c(&scratch.dir, "udp_wr", &[]);
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

    /// Runs a server choosing `st` and a client choosing `ct` (`env`: the
    /// client's `SOFTRDMA_SOCKETS_UDP`); their outputs, both successful.
    fn pair(&self, st: &str, ct: &str, env: Option<&str>) -> (String, String) {
        let port = free_udp_port().to_string();
        let server = self
            .cmd(&["server", &port, st], true)
            .spawn()
            .expect("server starts");
        std::thread::sleep(Duration::from_millis(300));
        let mut cc = self.cmd(&["client", &port, ct], true);
        if let Some(v) = env {
            cc.env("SOFTRDMA_SOCKETS_UDP", v);
        }
        let client = cc.spawn().expect("client starts");
        let c = finish(client, Duration::from_secs(60), "client");
        let s = finish(server, Duration::from_secs(60), "server");
        let (so, co) = (text(&s), text(&c));
        assert!(c.status.success(), "client: {co}\nserver: {so}");
        assert!(s.status.success(), "server: {so}\nclient: {co}");
        assert!(co.contains("client: 360 datagrams intact, 0 lost"), "{co}");
        assert!(so.contains("server: echoed 360 datagrams"), "{so}");
        (so, co)
    }
}

/// The counts a `records` line of `who` shows: sent, received, partial.
fn records(out: &str, who: &str) -> (u64, u64, u64) {
    let l = out
        .lines()
        .find(|l| l.starts_with(&format!("{who}: records sent")))
        .unwrap_or_else(|| panic!("no records line for {who}: {out}"));
    let n: Vec<u64> = l
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(n.len(), 3, "{l}");
    (n[0], n[1], n[2])
}

#[test]
fn both_ends_choose_write_record() {
    let run = Run::new("wr");
    let (s, c) = run.pair("wr", "wr", None);
    assert!(s.contains("server: transport 4"), "{s}");
    assert!(c.contains("client: transport 4"), "{c}");
    let (cs, cr, cp) = records(&c, "client");
    let (ss, sr, sp) = records(&s, "server");
    // The first datagram goes as a UD Send (it asks for the ring); the
    // rest are Write-Records while the ring has room, and nothing here
    // outruns it by more than the ring.
    assert!(cs >= 350, "client sent {cs} Write-Records: {c}");
    assert!(ss >= 350, "server sent {ss} Write-Records: {s}");
    assert_eq!(sr, cs, "server received what the client wrote");
    assert!(cr >= ss - 1, "client received {cr} of {ss}");
    assert_eq!((cp, sp), (0, 0), "nothing partial without loss");
    assert!(run.ud_tx_bytes() > 0, "datagram octets counted");
}

/// A sender that outruns its receiver: datagrams are lost (the ring is
/// full and so are the UD buffers), as UDP's are, but none is corrupted:
/// the sink checks each one it gets (a partial one by its prefix).
#[test]
fn an_outrun_receiver_loses_but_never_corrupts() {
    let run = Run::new("wr-blast");
    let port = free_udp_port().to_string();
    let server = run
        .cmd(&["sink", &port, "wr"], true)
        .spawn()
        .expect("sink starts");
    std::thread::sleep(Duration::from_millis(300));
    let client = run
        .cmd(&["blast", &port, "wr"], true)
        .spawn()
        .expect("blast starts");
    let c = finish(client, Duration::from_secs(60), "blast");
    let s = finish(server, Duration::from_secs(60), "sink");
    let (so, co) = (text(&s), text(&c));
    assert!(c.status.success(), "blast: {co}\nsink: {so}");
    assert!(s.status.success(), "sink: {so}\nblast: {co}");
    let got: u64 = so
        .lines()
        .find_map(|l| l.strip_prefix("sink: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count: {so}"));
    assert!(got > 100, "{so}");
    let (cs, _, _) = records(&co, "client");
    let (_, sr, _) = records(&so, "server");
    assert!(cs > 0 && sr > 0 && sr <= cs, "{co}\n{so}");
}

#[test]
fn write_record_chosen_process_wide() {
    let run = Run::new("wr-env");
    let (s, c) = run.pair("wr", "default", Some("wr"));
    assert!(c.contains("client: transport 4"), "{c}");
    let (cs, _, _) = records(&c, "client");
    let (_, sr, _) = records(&s, "server");
    assert!(cs >= 350 && sr == cs, "{c}\n{s}");
}

#[test]
fn write_record_and_ud_go_through_the_kernel() {
    let run = Run::new("wr-ud");
    let (s, c) = run.pair("wr", "ud", None);
    assert!(s.contains("server: transport 4"), "{s}");
    assert!(c.contains("client: transport 2"), "{c}");
    assert_eq!(records(&s, "server"), (0, 0, 0), "{s}");
    assert_eq!(records(&c, "client"), (0, 0, 0), "{c}");
    assert_eq!(run.ud_tx_bytes(), 0, "nothing over a QP");
}

#[test]
fn ud_and_write_record_go_through_the_kernel() {
    let run = Run::new("ud-wr");
    let (s, c) = run.pair("ud", "wr", None);
    assert!(s.contains("server: transport 2"), "{s}");
    assert!(c.contains("client: transport 4"), "{c}");
    assert_eq!(run.ud_tx_bytes(), 0, "nothing over a QP");
}
