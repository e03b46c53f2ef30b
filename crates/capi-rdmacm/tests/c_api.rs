//! `tests/c/rdmacm_api.c`, compiled against Debian's `rdma/rdma_cma.h`
//! and `rdma/rsocket.h` and linked with softrdma's librdmacm.so and
//! libibverbs.so, run through `softrdma run`: the edge cases the example
//! programs do not reach (reject with private data on RC and UD, UD
//! accept with reply private data, `param.ud` contents, `rdma_getaddrinfo`,
//! a non-blocking event channel, an rsocket stream of odd-sized sends with
//! end of stream, `rpoll` over rsockets and pipes, `O_NONBLOCK`,
//! `SO_ERROR`, `riomap`/`riowrite` errors, double `rclose`).

#[path = "../../capi/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn rdmacm_api_edge_cases() {
    common::softrdma();
    let dir = common::target_dir();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/rdmacm_api.c");
    let out = std::env::temp_dir().join(format!("softrdma-rdmacm-api-{}", std::process::id()));
    let cc = Command::new("cc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-L")
        .arg(&dir)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("cc (scripts/install-test-deps.sh installs librdmacm-dev)");
    assert!(
        cc.status.success(),
        "compiling {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&cc.stderr)
    );
    // Three different free ports (free_port may hand out one twice).
    let mut ports: Vec<String> = Vec::new();
    while ports.len() < 3 {
        let p = common::free_port().to_string();
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    let args: Vec<&str> = ports.iter().map(String::as_str).collect();
    let d = common::run(out.to_str().expect("utf-8 path"), &args);
    let _ = std::fs::remove_file(&out);
    d.assert_ok(
        "rdmacm_api",
        &[
            "ok: active: REJECTED with the passive side's private data",
            "ok: active: UD ESTABLISHED: qkey, QPN, AV, reply private data",
            "ok: active: rpoll mixes rsockets and ordinary descriptors",
            "ok: main: rpoll on a fresh rsocket reports a hang-up at once; SOCK_DGRAM refused",
            "ok: passive: rpoll on an idle listener times out",
            "ok: passive: stream intact up to the peer's shutdown, then end of stream",
            "ok: active: sent everything, shut down, got the answer and end of stream",
            "rdmacm_api: OK",
        ],
    );
    // The UD QPN the passive side used is the one the active side saw.
    let qpn = |prefix: &str| {
        d.stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
    };
    assert_eq!(qpn("server qpn "), qpn("client saw qpn "), "{}", d.stdout);
    assert_eq!(
        d.stdout
            .matches("REJECTED with the passive side's private data")
            .count(),
        2
    );
}
