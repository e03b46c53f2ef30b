//! Bad input and dying peers under the interposer, with Debian's socat:
//! a peer killed mid-stream ends the other side as the kernel would (end of
//! file for a reader, `EPIPE` for a writer) within a bound, and a plain
//! client's bytes — even ones that look like an MPA Request — reach an
//! interposed server untouched.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

fn interposer() -> PathBuf {
    let p = target_dir().join("libsoftrdma_sockets.so");
    assert!(p.is_file(), "{} is missing", p.display());
    p
}

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

struct Tmp(PathBuf);

impl Tmp {
    fn new(name: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!("softrdma-peer-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(p.join("registry")).expect("temp dir");
        Tmp(p)
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn socat(tmp: &Tmp, interposed: bool, args: &[&str]) -> Child {
    let mut c = Command::new("socat");
    c.args(args)
        .env("SOFTRDMA_SOCKETS_DIR", tmp.0.join("registry"))
        .env("SOFTRDMA_SOCKETS_REPORT", tmp.0.join("report"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if interposed {
        c.env("LD_PRELOAD", interposer());
    }
    c.spawn().expect("socat starts")
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

/// Waits for `child` at most `limit`; `None` (and killed) past it.
fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return Some(s);
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr_of(child: Child) -> String {
    let out = child.wait_with_output().expect("output");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn rc_conns(tmp: &Tmp) -> u64 {
    std::fs::read_to_string(tmp.0.join("report"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix("rc_conns="))
        })
        .map(|v| v.parse::<u64>().expect("a count"))
        .sum()
}

#[test]
fn a_killed_writer_ends_the_reader_with_end_of_file() {
    if !need_socat() {
        return;
    }
    let tmp = Tmp::new("writer");
    let port = free_port();
    let listen = format!("TCP-LISTEN:{port},reuseaddr");
    let mut server = socat(&tmp, true, &["-u", &listen, "OPEN:/dev/null"]);
    wait_listening(port);
    let mut client = socat(
        &tmp,
        true,
        &["-u", "OPEN:/dev/zero", &format!("TCP:127.0.0.1:{port}")],
    );
    std::thread::sleep(Duration::from_millis(700));
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
    let tmp = Tmp::new("reader");
    let port = free_port();
    let listen = format!("TCP-LISTEN:{port},reuseaddr");
    let mut server = socat(&tmp, true, &["-u", &listen, "OPEN:/dev/null"]);
    wait_listening(port);
    let mut client = socat(
        &tmp,
        true,
        &["-u", "OPEN:/dev/zero", &format!("TCP:127.0.0.1:{port}")],
    );
    std::thread::sleep(Duration::from_millis(700));
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
    let tmp = Tmp::new("junk");
    let port = free_port();
    let out = tmp.0.join("got");
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
