//! Two `softrdma rping` processes on loopback: 10 000 verified iterations,
//! and the MPA knob variants (no CRC, markers, rev 1, no P2P) in both roles.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs a server and a client with the given environments; returns their
/// outputs after checking both exit 0 within the time limit.
fn rping(
    count: u32,
    size: u32,
    server_env: &[(&str, &str)],
    client_env: &[(&str, &str)],
) -> (String, String) {
    let bin = env!("CARGO_BIN_EXE_softrdma");
    let port = free_port().to_string();
    // The server's output goes to a file: nobody reads a pipe while it runs.
    let out_path =
        std::env::temp_dir().join(format!("softrdma-rping-{}-{port}.out", std::process::id()));
    let out_file = std::fs::File::create(&out_path).unwrap();
    let mut server = Command::new(bin)
        .args([
            "rping",
            "-s",
            "-a",
            "127.0.0.1",
            "-p",
            &port,
            "-S",
            &size.to_string(),
            "-v",
        ])
        .envs(server_env.iter().copied())
        .stdout(Stdio::from(out_file))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The server needs a moment to bind; the client is retried while it
    // gets "connection refused".
    let deadline = Instant::now() + Duration::from_secs(10);
    let client = loop {
        let out = Command::new(bin)
            .args([
                "rping",
                "-c",
                "-a",
                "127.0.0.1",
                "-p",
                &port,
                "-C",
                &count.to_string(),
                "-S",
                &size.to_string(),
                "-V",
                "-v",
            ])
            .envs(client_env.iter().copied())
            .output()
            .unwrap();
        let refused = String::from_utf8_lossy(&out.stderr).contains("refused");
        if !refused || Instant::now() > deadline {
            break out;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = server.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = server.kill();
            panic!("server did not exit after the client finished");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let sout = server.wait_with_output().unwrap();
    let c_out = String::from_utf8_lossy(&client.stdout).into_owned();
    let s_out = std::fs::read_to_string(&out_path).unwrap();
    let _ = std::fs::remove_file(&out_path);
    assert!(
        client.status.success(),
        "client failed: {}\n{}",
        String::from_utf8_lossy(&client.stderr),
        c_out
    );
    assert!(
        status.success(),
        "server failed: {}",
        String::from_utf8_lossy(&sout.stderr)
    );
    (c_out, s_out)
}

#[test]
fn ten_thousand_verified_iterations() {
    let (c, s) = rping(10_000, 64, &[], &[]);
    assert_eq!(c.lines().count(), 10_000);
    assert_eq!(s.lines().count(), 10_000);
    assert!(c
        .lines()
        .last()
        .unwrap()
        .starts_with("ping data: rdma-ping-9999: "));
    assert!(s
        .lines()
        .last()
        .unwrap()
        .starts_with("server ping data: rdma-ping-9999: "));
}

#[test]
fn mpa_knob_variants() {
    type Env = &'static [(&'static str, &'static str)];
    let variants: &[(Env, Env)] = &[
        (&[("SOFTRDMA_MPA_CRC", "0")], &[("SOFTRDMA_MPA_CRC", "0")]),
        (&[("SOFTRDMA_MPA_CRC", "0")], &[]),
        (
            &[("SOFTRDMA_MPA_MARKERS", "1")],
            &[("SOFTRDMA_MPA_MARKERS", "1")],
        ),
        (&[], &[("SOFTRDMA_MPA_MARKERS", "1")]),
        (&[("SOFTRDMA_MPA_REV", "1")], &[("SOFTRDMA_MPA_REV", "1")]),
        (&[("SOFTRDMA_MPA_P2P", "0")], &[]),
        (&[], &[("SOFTRDMA_MPA_P2P", "0")]),
        (
            &[("SOFTRDMA_MAX_FPDU", "200")],
            &[("SOFTRDMA_MAX_FPDU", "100")],
        ),
    ];
    for (s_env, c_env) in variants {
        let (c, _) = rping(200, 3000, s_env, c_env);
        assert_eq!(c.lines().count(), 200, "server {s_env:?} client {c_env:?}");
    }
}
