//! What the C-driven tests share: the library they load, a scratch
//! directory, compiling a C program against it and running programs
//! under a deadline.
//!
//! `cargo test` compiles a cdylib-only package's library for its unit
//! tests but does not link `libexs.so` itself, so the first test to ask
//! builds it with `cargo build -p softrdma-exs` (same profile and target
//! directory), once per test process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
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

/// This package's directory (headers in `include`, programs in `tests/c`).
pub fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A scratch directory under the system's temporary one, removed when
/// dropped.
pub struct Tmp(pub PathBuf);

impl Tmp {
    /// `softrdma-exs-<name>-<pid>`, emptied first.
    pub fn new(name: &str) -> Tmp {
        let p = std::env::temp_dir().join(format!("softrdma-exs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp dir");
        Tmp(p)
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Puts the library in `dir` as an install lays it out: `libexs.so.1`
/// (the SONAME, what programs load) and the `libexs.so` link (what
/// `-lexs` finds).
pub fn install_library(dir: &Path) {
    std::fs::copy(library(), dir.join("libexs.so.1")).expect("library");
    let _ = std::fs::remove_file(dir.join("libexs.so"));
    std::os::unix::fs::symlink("libexs.so.1", dir.join("libexs.so")).expect("link");
}

/// Compiles `tests/c/<source>` into `exe` against the header and the
/// library installed in `lib` (found there at run time too), with
/// warnings as errors; `extra` goes last on the command line.
pub fn compile(source: &str, exe: &Path, lib: &Path, extra: &[&str]) {
    let o = run(
        Command::new("cc")
            .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(exe)
            .arg(manifest().join("tests/c").join(source))
            .arg("-I")
            .arg(manifest().join("include"))
            .arg("-L")
            .arg(lib)
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lexs")
            .args(extra),
        Duration::from_secs(60),
        &format!("cc {source}"),
    );
    assert!(o.status.success(), "compiling {source}: {}", text(&o));
}

/// Runs `cmd` to completion within `limit`; fails past it.
pub fn run(cmd: &mut Command, limit: Duration, what: &str) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} does not start: {e}"));
    finish(child, limit, what)
}

/// Waits for `child` at most `limit`; kills it and fails past it.
pub fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
    let end = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what} did not finish in {limit:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A finished program's stdout followed by its stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
