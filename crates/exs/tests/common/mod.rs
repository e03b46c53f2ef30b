//! What the C-driven tests share: the library they load.
//!
//! `cargo test` compiles a cdylib-only package's library for its unit
//! tests but does not link `libexs.so` itself, so the first test to ask
//! builds it with `cargo build -p softrdma-exs` (same profile and target
//! directory), once per test process.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `target/<profile>`, from this test executable's path.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// `libexs.so` of this build, built first if need be.
pub fn library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = target_dir();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-q", "-p", "softrdma-exs"])
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if dir.file_name().is_some_and(|n| n == "release") {
                cmd.arg("--release");
            }
            if let Some(target) = dir.parent() {
                cmd.env("CARGO_TARGET_DIR", target);
            }
            let mut child = cmd.spawn().expect("running cargo to build softrdma-exs");
            let until = Instant::now() + Duration::from_secs(1200);
            let st = loop {
                if let Some(st) = child.try_wait().expect("wait for cargo") {
                    break st;
                }
                if Instant::now() >= until {
                    let _ = child.kill();
                    panic!("building softrdma-exs took more than 20 minutes");
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            assert!(st.success(), "cargo build -p softrdma-exs failed");
            let lib = dir.join("libexs.so");
            assert!(lib.is_file(), "{} missing after the build", lib.display());
            lib
        })
        .clone()
}
