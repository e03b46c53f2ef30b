//! The Open Group model of `libexs.so` from C programs built against
//! `include/sys/exs.h` and the library cargo just built: every call, the
//! error cases, transfers both ways with a plain TCP peer (a Python
//! socket program), a netperf-like send loop, a peer killed mid-transfer,
//! and netperf's configure check against an install-style layout. Every
//! program runs under a deadline.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use softrdma_exs_core::abi;

mod common;
use common::{compile, install_library, manifest, run, text, Tmp};

/// `tmp/lib` as an install lays it out (see [`install_library`]).
fn lib_dir(tmp: &Path) -> PathBuf {
    let dir = tmp.join("lib");
    std::fs::create_dir_all(&dir).expect("lib dir");
    install_library(&dir);
    dir
}

/// Compiles `tests/c/exs_test.c` against the header and libexs.so.
fn build_test(tmp: &Path) -> PathBuf {
    let out = tmp.join("exs_test");
    compile("exs_test.c", &out, &lib_dir(tmp), &[]);
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A child whose stdout lines arrive on a channel.
struct Lines {
    child: Child,
    rx: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn spawn(cmd: &mut Command) -> Lines {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Lines {
            child,
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits (at most 20 s) for a line containing `want`.
    fn wait_for(&mut self, want: &str) {
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            if let Ok(l) = self.rx.recv_timeout(Duration::from_millis(100)) {
                let hit = l.contains(want);
                self.seen.push(l);
                if hit {
                    return;
                }
            }
        }
        let _ = self.child.kill();
        panic!("no line with {want:?}; saw {:?}", self.seen);
    }

    /// Waits for the exit (at most `limit`): status and every line.
    fn finish(mut self, limit: Duration, what: &str) -> (bool, String) {
        let end = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                std::thread::sleep(Duration::from_millis(50));
                self.seen.extend(self.rx.try_iter());
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                return (st.success(), format!("{}\n{err}", self.seen.join("\n")));
            }
            if Instant::now() >= end {
                let _ = self.child.kill();
                self.seen.extend(self.rx.try_iter());
                panic!("{what} did not finish in {limit:?}; saw {:?}", self.seen);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Python's socket module as the plain TCP peer. The byte at offset i of
/// every stream is (i * 7 + 3) & 255, as in exs_test.c.
const PEER: &str = r#"
import socket, sys, time
mode, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def pattern(n):
    base = bytes((i * 7 + 3) & 255 for i in range(256))
    return (base * (n // 256 + 1))[:n]
def serve():
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port))
    l.listen(1)
    print("listening", flush=True)
    c, _ = l.accept()
    return c
def drain(c):
    chunks, n = [], 0
    while True:
        b = c.recv(1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)
if mode == "sink":
    c = serve()
    data = drain(c)
    ok = data == pattern(len(data)) and len(data) == total
    c.sendall((("ok %d" if ok else "bad %d") % len(data)).encode())
    c.close()
    print("sink got %d bytes, pattern %s" % (len(data), "ok" if ok else "bad"), flush=True)
    sys.exit(0 if ok else 1)
elif mode in ("source", "client"):
    if mode == "source":
        c = serve()
    else:
        c = socket.create_connection(("127.0.0.1", port))
    c.sendall(pattern(total))
    c.shutdown(socket.SHUT_WR)
    reply = drain(c)
    print("reply %r" % reply, flush=True)
    sys.exit(0 if reply == b"thanks\n" else 1)
elif mode == "stall":
    c = serve()
    got = 0
    while got < total:
        got += len(c.recv(total - got))
    print("ready", flush=True)
    time.sleep(3600)
"#;

fn python(mode: &str, port: u16, total: usize) -> Command {
    let mut c = Command::new("python3");
    c.args(["-c", PEER, mode, &port.to_string(), &total.to_string()]);
    c
}

#[test]
fn the_header_compiles_as_c_and_cxx_with_warnings_as_errors() {
    let tmp = Tmp::new("header");
    let inc = manifest().join("include");
    for std in ["c99", "c11", "gnu17"] {
        let o = run(
            Command::new("cc")
                .args(["-Wall", "-Wextra", "-Werror", "-pedantic"])
                .arg(format!("-std={std}"))
                .arg("-I")
                .arg(&inc)
                .arg("-c")
                .arg(manifest().join("tests/c/conftest.c"))
                .arg("-o")
                .arg(tmp.0.join("c.o")),
            Duration::from_secs(60),
            "cc",
        );
        assert!(o.status.success(), "C ({std}): {}", text(&o));
    }
    let o = run(
        Command::new("c++")
            .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-std=c++11"])
            .arg("-I")
            .arg(&inc)
            .arg("-c")
            .arg(manifest().join("tests/c/header.cc"))
            .arg("-o")
            .arg(tmp.0.join("cc.o")),
        Duration::from_secs(60),
        "c++",
    );
    assert!(o.status.success(), "C++: {}", text(&o));
}

#[test]
fn the_c_layout_is_the_librarys() {
    let tmp = Tmp::new("layout");
    let exe = tmp.0.join("layout");
    let o = run(
        Command::new("cc")
            .args(["-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(manifest().join("tests/c/layout.c"))
            .arg("-I")
            .arg(manifest().join("include")),
        Duration::from_secs(60),
        "cc layout.c",
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&mut Command::new(&exe), Duration::from_secs(10), "layout");
    let c: Vec<(String, usize)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("name value");
            (k.to_string(), v.parse().expect("number"))
        })
        .collect();
    let mut rust: Vec<(String, usize)> = abi::layout()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    for (k, v) in [
        ("EXS_VERSION", abi::EXS_VERSION1),
        ("EXS_EVT_CLOSE", abi::EXS_EVT_CLOSE),
        ("EXS_POLLIN", libc::POLLIN as i32),
        ("EXS_POLLOUT", libc::POLLOUT as i32),
        ("SO_ASYNC_RECV_ORDERED", abi::SO_ASYNC_RECV_ORDERED),
        ("EXS_PERSISTENT", abi::EXS_PERSISTENT),
        ("EXS_PERSISTENT_NOTIFY", abi::EXS_PERSISTENT_NOTIFY),
    ] {
        rust.push((k.to_string(), v as usize));
    }
    assert_eq!(c, rust, "sys/exs.h and softrdma_exs_core::abi disagree");
    assert_eq!(c[0].1, 72, "exs_event_t is 72 bytes (frozen)");
}

#[test]
fn every_open_group_call_on_kernel_sockets() {
    let tmp = Tmp::new("calls");
    let exe = build_test(&tmp.0);
    let o = run(
        Command::new(&exe).arg("calls"),
        Duration::from_secs(60),
        "exs_test calls",
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for step in [
        "accept/connect: ok",
        "send/recv: ok",
        "order: ok",
        "sendmsg/recvmsg: ok",
        "sendfile: ok",
        "poll: ok",
        "cancel: ok",
        "attributes: ok",
        "sockopt: ok",
        "shutdown: ok",
        "aclose: ok",
        "close: ok",
        "deregister/qdelete: ok",
        "rdma model on kernel descriptors: ok",
        "calls: all ok",
    ] {
        assert!(t.contains(step), "missing {step:?} in\n{t}");
    }
}

#[test]
fn bad_arguments_fail_cleanly_and_late_failures_arrive_as_events() {
    let tmp = Tmp::new("errors");
    let exe = build_test(&tmp.0);
    let o = run(
        Command::new(&exe).arg("errors"),
        Duration::from_secs(60),
        "exs_test errors",
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for step in [
        "bad arguments: ok",
        "qdequeue: ok",
        "queue full: ok",
        "late failures: ok",
        "errors: all ok",
    ] {
        assert!(t.contains(step), "missing {step:?} in\n{t}");
    }
}

/// exs_send with 16 in flight and exs_qdequeue(-(pending / 2)) to a
/// Python sink that checks every byte.
fn blast(size: usize) {
    let tmp = Tmp::new(&format!("blast{size}"));
    let exe = build_test(&tmp.0);
    let port = free_port();
    let total = 16 << 20;
    let mut sink = Lines::spawn(&mut python("sink", port, total));
    sink.wait_for("listening");
    let o = run(
        Command::new(&exe).args([
            "send-to",
            &port.to_string(),
            &total.to_string(),
            &size.to_string(),
        ]),
        Duration::from_secs(120),
        "exs_test send-to",
    );
    let (ok, st) = sink.finish(Duration::from_secs(60), "python sink");
    let t = text(&o);
    assert!(o.status.success(), "{t}\nsink: {st}");
    assert!(ok, "sink: {st}");
    assert!(
        st.contains(&format!("sink got {total} bytes, pattern ok")),
        "{st}"
    );
    assert!(t.contains(&format!("sink says: ok {total}")), "{t}");
}

#[test]
fn a_netperf_like_blast_reaches_a_plain_tcp_sink_intact() {
    blast(64 * 1024);
}

#[test]
fn small_sends_in_flight_keep_their_order() {
    blast(1000);
}

#[test]
fn receives_from_a_plain_tcp_source_arrive_in_order() {
    let tmp = Tmp::new("source");
    let exe = build_test(&tmp.0);
    let port = free_port();
    let total = 8 << 20;
    let mut src = Lines::spawn(&mut python("source", port, total));
    src.wait_for("listening");
    let o = run(
        Command::new(&exe).args(["recv-from", &port.to_string(), &total.to_string()]),
        Duration::from_secs(120),
        "exs_test recv-from",
    );
    let (ok, st) = src.finish(Duration::from_secs(60), "python source");
    let t = text(&o);
    assert!(o.status.success(), "{t}\nsource: {st}");
    assert!(t.contains(&format!("received {total} bytes intact")), "{t}");
    assert!(ok && st.contains("reply b'thanks\\n'"), "{st}");
}

#[test]
fn exs_accept_takes_a_plain_tcp_client() {
    let tmp = Tmp::new("accept");
    let exe = build_test(&tmp.0);
    let port = free_port();
    let total = 3 << 20;
    let mut srv = Lines::spawn(Command::new(&exe).args([
        "accept-from",
        &port.to_string(),
        &total.to_string(),
    ]));
    srv.wait_for("listening");
    let o = run(
        &mut python("client", port, total),
        Duration::from_secs(60),
        "python client",
    );
    let (ok, t) = srv.finish(Duration::from_secs(60), "exs_test accept-from");
    assert!(ok, "{t}");
    assert!(t.contains(&format!("received {total} bytes intact")), "{t}");
    assert!(o.status.success(), "client: {}", text(&o));
}

#[test]
fn a_peer_killed_mid_transfer_ends_every_outstanding_operation_with_econnreset() {
    let tmp = Tmp::new("killed");
    let exe = build_test(&tmp.0);
    let port = free_port();
    let mut peer = Lines::spawn(&mut python("stall", port, 100_000));
    peer.wait_for("listening");
    let mut prog = Lines::spawn(Command::new(&exe).args(["killed", &port.to_string()]));
    prog.wait_for("queued");
    peer.wait_for("ready");
    // The peer has unread bytes in its receive buffer: its death is a reset.
    let _ = peer.child.kill();
    let _ = peer.child.wait();
    let (ok, t) = prog.finish(Duration::from_secs(60), "exs_test killed");
    assert!(ok, "{t}");
    assert!(t.contains("peer killed:"), "{t}");
}

#[test]
fn a_configure_style_check_links_with_lexs_from_an_install_layout() {
    let tmp = Tmp::new("configure");
    let prefix = tmp.0.join("prefix");
    std::fs::create_dir_all(prefix.join("include/sys")).expect("dirs");
    std::fs::copy(
        manifest().join("include/sys/exs.h"),
        prefix.join("include/sys/exs.h"),
    )
    .expect("header");
    lib_dir(&prefix);
    let exe = tmp.0.join("conftest");
    let o = run(
        Command::new("cc")
            .arg(manifest().join("tests/c/conftest.c"))
            .arg(format!("-I{}", prefix.join("include").display()))
            .arg(format!("-L{}", prefix.join("lib").display()))
            .arg("-lexs")
            .arg("-o")
            .arg(&exe),
        Duration::from_secs(60),
        "cc conftest.c -lexs",
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = run(
        Command::new("readelf").arg("-d").arg(&exe),
        Duration::from_secs(10),
        "readelf",
    );
    assert!(
        text(&o).contains("Shared library: [libexs.so.1]"),
        "the program needs the SONAME: {}",
        text(&o)
    );
    let o = run(
        Command::new(&exe).env("LD_LIBRARY_PATH", prefix.join("lib")),
        Duration::from_secs(10),
        "conftest",
    );
    assert!(
        o.status.success(),
        "exs_init(EXS_VERSION) failed: {}",
        text(&o)
    );
}
