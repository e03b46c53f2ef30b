//! `SOCK_DGRAM` sockets of the RDMA model (UD, RD and Write-Record)
//! between two processes of one C program (`tests/c/dgram_test.c`, built
//! against `include/sys/exs.h` and the library cargo just built). Every
//! run is bounded by a deadline.

use std::process::Command;
use std::time::Duration;

mod common;
use common::{compile, install_library, run, text, Tmp};

fn case(mode: &str) -> String {
    let tmp = Tmp::new(&format!("dgram-{mode}"));
    install_library(&tmp.0);
    let exe = tmp.0.join("dgram_test");
    compile("dgram_test.c", &exe, &tmp.0, &[]);
    let o = run(Command::new(&exe).arg(mode), Duration::from_secs(90), mode);
    let t = text(&o);
    drop(tmp);
    assert!(o.status.success(), "dgram_test {mode} failed:\n{t}");
    assert!(
        t.contains("client: ok")
            && t.contains("server: ok")
            && t.contains("sizes: 10 datagrams")
            && t.contains("many: 300 datagrams (client)")
            && t.contains("many: 300 datagrams (server)"),
        "missing verdicts:\n{t}"
    );
    t
}

/// Datagrams of 1 to 65536 octets with contents checked and echoed to
/// the reported source, `MSG_TRUNC`, connected sockets, refused calls,
/// `ECANCELED` at close: over UD.
#[test]
fn ud_datagrams_keep_boundaries_sources_and_truncation() {
    case("ud");
}

/// The same over RD queue pairs (`EXS_F_SETDGRAM`, `EXS_DGRAM_RD`).
#[test]
fn rd_datagrams_keep_boundaries_sources_and_truncation() {
    case("rd");
}

/// The same with `EXS_DGRAM_WR` at both ends: after the first exchange
/// every datagram is a Write-Record into the receiver's ring (the
/// program checks the counters); and a sender that outruns a receiver
/// reading nothing loses datagrams, none corrupted, and writes no more
/// records than the ring has slots.
#[test]
fn wr_datagrams_are_write_records_into_granted_rings() {
    let t = case("wr");
    assert!(
        t.contains("blast: records out") && t.contains("arrived intact"),
        "missing overrun verdicts:\n{t}"
    );
}

/// A Write-Record client and a UD server: the client's requests for a
/// ring are refused, every datagram goes as a UD Send both ways.
#[test]
fn wr_with_a_ud_peer_falls_back_to_sends() {
    let t = case("wrmix");
    assert!(t.contains("client wrmix: records out 0 in 0"), "{t}");
}
