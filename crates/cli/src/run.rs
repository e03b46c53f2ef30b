//! `softrdma run [--] PROG ARGS...`: runs an unmodified verbs program over
//! softrdma.
//!
//! It finds softrdma's drop-in `libibverbs.so` (and `librdmacm.so`, when
//! built), makes a directory whose `libibverbs.so.1`/`librdmacm.so.1` are
//! symbolic links to them (their SONAMEs, what the program's loader asks
//! for), puts that directory first on `LD_LIBRARY_PATH` and execs PROG.
//!
//! Where the libraries are looked for, first hit wins: `$SOFTRDMA_LIB_DIR`,
//! the directory of this executable (cargo puts the cdylibs beside it), its
//! `deps/` subdirectory, `../lib/softrdma` relative to it. The link
//! directory is `<that dir>/softrdma-ld` when writable, otherwise
//! `$XDG_RUNTIME_DIR` or the temporary directory
//! (`softrdma-ld-<uid>-<hash of the library dir>`).
//!
//! The system's provider libraries perftest links (`libmlx5.so.1`,
//! `libefa.so.1`) still load from the system; they import rdma-core's
//! private `IBVERBS_PRIVATE_34` interface, which our libibverbs.so.1
//! exports as harmless stubs, and they are never called for a softrdma
//! device.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: softrdma run [--] PROG [ARGS...]

Runs PROG with softrdma's libibverbs.so.1 and librdmacm.so.1 first on
LD_LIBRARY_PATH, so unmodified rdma-core programs (ibv_rc_pingpong, rping,
perftest, ...) run over softrdma. SOFTRDMA_LIB_DIR overrides where the
libraries are found.";

/// The libraries: (file cargo builds, SONAME the loader looks for).
const LIBS: &[(&str, &str)] = &[
    ("libibverbs.so", "libibverbs.so.1"),
    ("librdmacm.so", "librdmacm.so.1"),
];

/// Where softrdma's libibverbs.so is.
pub fn find_lib_dir() -> Option<PathBuf> {
    let mut cands: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("SOFTRDMA_LIB_DIR") {
        cands.push(PathBuf::from(d));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            cands.push(dir.to_path_buf());
            cands.push(dir.join("deps"));
            cands.push(dir.join("../lib/softrdma"));
        }
    }
    cands
        .into_iter()
        .find(|d| d.join(LIBS[0].0).is_file() || d.join(LIBS[0].1).is_file())
}

fn hash(p: &Path) -> u64 {
    // FNV-1a: stable across runs (the std hasher is seeded per process).
    p.as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// A directory holding SONAME links to the libraries of `lib_dir`.
pub fn link_dir(lib_dir: &Path) -> std::io::Result<PathBuf> {
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(0);
    let fallback_base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let fallback = fallback_base.join(format!("softrdma-ld-{uid}-{:016x}", hash(lib_dir)));
    let mut last_err = None;
    for dir in [lib_dir.join("softrdma-ld"), fallback] {
        match populate(&dir, lib_dir) {
            Ok(()) => return Ok(dir),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| std::io::Error::other("no directory for the library links")))
}

fn populate(dir: &Path, lib_dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (file, soname) in LIBS {
        let target = lib_dir.join(file);
        let target = if target.is_file() {
            target
        } else if lib_dir.join(soname).is_file() {
            lib_dir.join(soname)
        } else {
            continue;
        };
        let target = target.canonicalize()?;
        let link = dir.join(soname);
        if std::fs::read_link(&link).ok().as_deref() == Some(target.as_path()) {
            continue;
        }
        // Replace atomically: a concurrent `softrdma run` never sees a
        // missing link.
        let tmp = dir.join(format!(".{soname}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)?;
        std::fs::rename(&tmp, &link)?;
    }
    Ok(())
}

/// The environment value: `dir` first, then the old `LD_LIBRARY_PATH`.
pub fn library_path(dir: &Path, old: Option<OsString>) -> OsString {
    let mut v = dir.as_os_str().to_os_string();
    if let Some(old) = old.filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// `softrdma run`.
pub fn main(args: &[String]) -> ExitCode {
    let args = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        Some("-h") | Some("--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => args,
    };
    let Some(prog) = args.first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let Some(lib_dir) = find_lib_dir() else {
        eprintln!(
            "softrdma run: libibverbs.so not found beside {} (build it: cargo build -p softrdma-capi, or set SOFTRDMA_LIB_DIR)",
            std::env::current_exe()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        return ExitCode::from(127);
    };
    let dir = match link_dir(&lib_dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("softrdma run: cannot make the library links: {e}");
            return ExitCode::from(127);
        }
    };
    let err = Command::new(prog)
        .args(&args[1..])
        .env(
            "LD_LIBRARY_PATH",
            library_path(&dir, std::env::var_os("LD_LIBRARY_PATH")),
        )
        .exec();
    eprintln!("softrdma run: cannot run {prog}: {err}");
    ExitCode::from(127)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_puts_ours_first() {
        let d = Path::new("/x/softrdma-ld");
        assert_eq!(library_path(d, None), OsString::from("/x/softrdma-ld"));
        assert_eq!(
            library_path(d, Some("/a:/b".into())),
            OsString::from("/x/softrdma-ld:/a:/b")
        );
        assert_eq!(
            library_path(d, Some("".into())),
            OsString::from("/x/softrdma-ld")
        );
    }

    #[test]
    fn links_point_at_the_libraries() {
        let base = std::env::temp_dir().join(format!("softrdma-run-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(base.join("libibverbs.so"), b"x").unwrap();
        let dir = link_dir(&base).unwrap();
        let l = std::fs::read_link(dir.join("libibverbs.so.1")).unwrap();
        assert_eq!(l, base.join("libibverbs.so").canonicalize().unwrap());
        // No librdmacm.so: no dangling link for it.
        assert!(!dir.join("librdmacm.so.1").exists());
        // Idempotent.
        assert_eq!(link_dir(&base).unwrap(), dir);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
