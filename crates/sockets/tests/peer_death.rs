//! Bad input and dying peers under the interposer, with Debian's socat:
//! a peer killed mid-stream ends the other side as the kernel would (end of
//! file for a reader, `EPIPE` for a writer) within a bound, and a plain
//! client's bytes — even ones that look like an MPA Request — reach an
//! interposed server untouched.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{free_tcp_port, wait_for, Scratch};

fn have_socat() -> bool {
    Command::new("socat")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// True if socat is there; without it the test is skipped with a note,
/// except in CI (`CI` set), where `scripts/install-test-deps.sh` installed
/// it and its absence is a failure.
fn need_socat() -> bool {
    if have_socat() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "socat is missing (scripts/install-test-deps.sh installs it)"
    );
    eprintln!("socat is not installed (scripts/install-test-deps.sh installs it); skipped");
    false
}

fn socat(tmp: &Scratch, interposed: bool, args: &[&str]) -> Child {
    tmp.command("socat", interposed)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("socat starts")
}

fn wait_listening(port: u16) {
    // The registry entry appears with the listener: wait for the port
    // without connecting (a probe connection would be the server's one
    // client).
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let needle = format!(":{port:04X} 00000000:0000 0A");
        if tcp.contains(&needle) {
            return;
        }
        assert!(Instant::now() < end, "nothing listened on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr_of(child: Child) -> String {
    let out = child.wait_with_output().expect("output");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An interposed socat reading a connection into `/dev/null` and another
/// writing `/dev/zero` into it, left streaming for 0.7 s: (reader, writer).
fn streaming_pair(tmp: &Scratch) -> (Child, Child) {
    let port = free_tcp_port();
    let listen = format!("TCP-LISTEN:{port},reuseaddr");
    let server = socat(tmp, true, &["-u", &listen, "OPEN:/dev/null"]);
    wait_listening(port);
    let client = socat(
        tmp,
        true,
        &["-u", "OPEN:/dev/zero", &format!("TCP:127.0.0.1:{port}")],
    );
    std::thread::sleep(Duration::from_millis(700));
    (server, client)
}

fn rc_conns(tmp: &Scratch) -> u64 {
    tmp.report_sum("rc_conns")
}

#[test]
fn a_killed_writer_ends_the_reader_with_end_of_file() {
    if !need_socat() {
        return;
    }
    let tmp = Scratch::new("peer-writer");
    let (mut server, mut client) = streaming_pair(&tmp);
    client.kill().expect("kill the writer");
    let _ = client.wait();
    let st = wait_for(&mut server, Duration::from_secs(10));
    assert!(
        st.is_some_and(|s| s.success()),
        "the reader did not end cleanly within 10 s: {st:?}, {}",
        stderr_of(server)
    );
    assert!(rc_conns(&tmp) >= 1, "the connection was carried over RC");
}

#[test]
fn a_killed_reader_fails_the_writer_with_epipe() {
    if !need_socat() {
        return;
    }
    let tmp = Scratch::new("peer-reader");
    let (mut server, mut client) = streaming_pair(&tmp);
    server.kill().expect("kill the reader");
    let _ = server.wait();
    let st = wait_for(&mut client, Duration::from_secs(10));
    assert!(st.is_some(), "the writer hung after its reader died");
    let err = stderr_of(client);
    assert!(
        err.contains("Broken pipe") || err.contains("Connection reset"),
        "the writer's error: {err}"
    );
}

#[test]
fn a_plain_clients_bytes_reach_an_interposed_server_untouched() {
    if !need_socat() {
        return;
    }
    let tmp = Scratch::new("peer-junk");
    let port = free_tcp_port();
    let out = tmp.dir.join("got");
    let listen = format!("TCP-LISTEN:{port},reuseaddr");
    let mut server = socat(
        &tmp,
        true,
        &[
            "-u",
            &listen,
            &format!("OPEN:{},creat,trunc", out.display()),
        ],
    );
    wait_listening(port);
    // An MPA Request's key first, then bytes of every value.
    let mut junk = b"MPA ID Req Frame".to_vec();
    junk.extend((0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.write_all(&junk).expect("send");
    drop(c);
    let st = wait_for(&mut server, Duration::from_secs(10));
    assert!(st.is_some_and(|s| s.success()), "server: {st:?}");
    let got = std::fs::read(&out).expect("the server's file");
    assert!(
        got == junk,
        "{} octets arrived of {}, or they differ",
        got.len(),
        junk.len()
    );
    assert_eq!(rc_conns(&tmp), 0, "a plain client's connection stays plain");
}
