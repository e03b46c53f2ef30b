//! `softrdma run [--] PROG ARGS...`: runs an unmodified verbs program over
//! softrdma.
//!
//! It finds softrdma's drop-in `libibverbs.so.1` and `librdmacm.so.1`
//! (the capi and capi-rdmacm crates), puts a directory holding them under
//! their SONAMEs (what the program's loader asks for) first on
//! `LD_LIBRARY_PATH` and execs PROG with ARGS, verbatim.
//!
//! Where the libraries are looked for, in this order (the first place that
//! has `libibverbs` is taken; [`find_lib_dir`]):
//!
//! 1. `$SOFTRDMA_LIB_DIR`, when set and not empty: the only place looked
//!    at then (an explicit choice that does not hold the library is an
//!    error, not a reason to take another one);
//! 2. `<dir of this executable>/../lib/softrdma`, when it holds
//!    `libibverbs.so.1`: an installed tree, `PREFIX/bin/softrdma` beside
//!    `PREFIX/lib/softrdma/` (the executable's path with symbolic links
//!    resolved, so a link to it elsewhere finds the same tree);
//! 3. the directory of this executable, then its `deps/` subdirectory:
//!    cargo's `target/release` or `target/debug`, where the cdylibs
//!    (`libibverbs.so`) are built beside the binary.
//!
//! When none has it, `softrdma run` exits with status 127 and names the
//! places it looked. A directory that holds every library under its
//! SONAME (an installed one) goes on `LD_LIBRARY_PATH` as it is; for
//! cargo's output, which names them `libibverbs.so`, a directory of SONAME
//! links is made: `<lib dir>/softrdma-ld` when writable, otherwise
//! `$XDG_RUNTIME_DIR` or the temporary directory
//! (`softrdma-ld-<uid>-<hash of the lib dir>`).
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

/// `softrdma run [--] PROG [ARGS...]`.
#[derive(Debug, clap::Args)]
#[command(
    about = "Run an unmodified verbs program over softrdma",
    override_usage = "softrdma run [--] <PROG> [ARGS]...",
    long_about = "Runs PROG with softrdma's libibverbs.so.1 and librdmacm.so.1 first on \
        LD_LIBRARY_PATH, so unmodified rdma-core programs (ibv_rc_pingpong, rping, \
        perftest, ...) run over softrdma. Everything after PROG is passed to it verbatim; \
        put -- before PROG when it starts with a dash.",
    after_long_help = "Where the libraries are looked for, the first place holding \
        libibverbs wins:\n  \
        1. $SOFTRDMA_LIB_DIR, if set (then only there);\n  \
        2. <dir of the softrdma executable>/../lib/softrdma, if it holds libibverbs.so.1 \
        (an installed PREFIX/bin/softrdma with PREFIX/lib/softrdma/);\n  \
        3. the executable's own directory and its deps/ (cargo's target/release or \
        target/debug, after cargo build -p softrdma-capi -p softrdma-capi-rdmacm).\n\n\
        Exit status: PROG's; 127 when the libraries or PROG cannot be found."
)]
pub(crate) struct RunArgs {
    /// The program, looked up on PATH.
    #[arg(value_name = "PROG")]
    prog: OsString,
    /// Its arguments, passed verbatim (options and `--` included).
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    args: Vec<OsString>,
}

/// The libraries: (file cargo builds, SONAME the loader looks for).
const LIBS: &[(&str, &str)] = &[
    ("libibverbs.so", "libibverbs.so.1"),
    ("librdmacm.so", "librdmacm.so.1"),
];

/// Where softrdma's libraries are (module docs): the directory, or the
/// places looked at, in order, each with what was missing there.
pub fn find_lib_dir() -> Result<PathBuf, Vec<String>> {
    let env = std::env::var_os("SOFTRDMA_LIB_DIR").filter(|d| !d.is_empty());
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    lib_dir_among(env.map(PathBuf::from), exe_dir.as_deref())
}

/// [`find_lib_dir`] with the environment and the executable's directory
/// given.
fn lib_dir_among(env: Option<PathBuf>, exe_dir: Option<&Path>) -> Result<PathBuf, Vec<String>> {
    let has = |d: &Path, names: &[&str]| names.iter().any(|n| d.join(n).is_file());
    let ours = [LIBS[0].0, LIBS[0].1];
    if let Some(d) = env {
        if has(&d, &ours) {
            return Ok(d);
        }
        return Err(vec![format!(
            "{} (SOFTRDMA_LIB_DIR): no {} or {}",
            d.display(),
            ours[1],
            ours[0]
        )]);
    }
    let Some(exe_dir) = exe_dir else {
        return Err(vec![
            "SOFTRDMA_LIB_DIR: not set".into(),
            "the executable's directory: unknown".into(),
        ]);
    };
    let mut looked = vec!["SOFTRDMA_LIB_DIR: not set".to_string()];
    // `<exe dir>/../lib/softrdma`, spelled without the `..` (the
    // executable's path has no symbolic links left).
    let installed = exe_dir.parent().map_or_else(
        || exe_dir.join("../lib/softrdma"),
        |p| p.join("lib/softrdma"),
    );
    if has(&installed, &[LIBS[0].1]) {
        return Ok(installed);
    }
    looked.push(format!("{}: no {}", installed.display(), ours[1]));
    for d in [exe_dir.to_path_buf(), exe_dir.join("deps")] {
        if has(&d, &ours) {
            return Ok(d);
        }
        looked.push(format!("{}: no {} or {}", d.display(), ours[1], ours[0]));
    }
    Err(looked)
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

/// The directory to put on `LD_LIBRARY_PATH` for the libraries of
/// `lib_dir`: `lib_dir` itself when it holds each of them under its SONAME,
/// otherwise a directory of SONAME links to them (module docs).
pub fn link_dir(lib_dir: &Path) -> std::io::Result<PathBuf> {
    let named_by_soname = LIBS
        .iter()
        .all(|(file, soname)| lib_dir.join(soname).is_file() || !lib_dir.join(file).is_file());
    if named_by_soname {
        return Ok(lib_dir.to_path_buf());
    }
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

/// Entry point of `softrdma run`.
pub fn main(a: RunArgs) -> ExitCode {
    let (prog, args) = (&a.prog, &a.args);
    let lib_dir = match find_lib_dir() {
        Ok(d) => d,
        Err(looked) => {
            eprintln!(
                "softrdma run: softrdma's libibverbs not found; looked in:\n  {}\n\
                 (build it: cargo build -p softrdma-capi -p softrdma-capi-rdmacm; install it; \
                 or set SOFTRDMA_LIB_DIR)",
                looked.join("\n  ")
            );
            return ExitCode::from(127);
        }
    };
    let dir = match link_dir(&lib_dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("softrdma run: cannot make the library links: {e}");
            return ExitCode::from(127);
        }
    };
    let err = Command::new(prog)
        .args(args)
        .env(
            "LD_LIBRARY_PATH",
            library_path(&dir, std::env::var_os("LD_LIBRARY_PATH")),
        )
        .exec();
    eprintln!("softrdma run: cannot run {}: {err}", prog.to_string_lossy());
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

    /// The search order of the module docs: SOFTRDMA_LIB_DIR alone when
    /// set, then an installed `../lib/softrdma`, then the executable's
    /// directory and its `deps/`; a failure names every place.
    #[test]
    fn libraries_are_found_in_order() {
        let base = std::env::temp_dir().join(format!("softrdma-find-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (bin, inst, env) = (
            base.join("bin"),
            base.join("lib/softrdma"),
            base.join("env"),
        );
        for d in [&bin, &inst, &env] {
            std::fs::create_dir_all(d).unwrap();
        }
        let bin_dir = Some(bin.as_path());
        let looked = lib_dir_among(None, bin_dir).unwrap_err();
        assert_eq!(looked.len(), 4, "{looked:?}");
        assert!(looked[0].contains("SOFTRDMA_LIB_DIR"), "{looked:?}");
        assert!(looked[1].contains("lib/softrdma"), "{looked:?}");
        assert!(looked[3].contains("deps"), "{looked:?}");
        // cargo's output beside the binary.
        std::fs::write(bin.join("libibverbs.so"), b"x").unwrap();
        assert_eq!(lib_dir_among(None, bin_dir), Ok(bin.clone()));
        // An installed tree wins over it, but only with the SONAME file.
        std::fs::write(inst.join("libibverbs.so"), b"x").unwrap();
        assert_eq!(lib_dir_among(None, bin_dir), Ok(bin.clone()));
        std::fs::write(inst.join("libibverbs.so.1"), b"x").unwrap();
        assert_eq!(lib_dir_among(None, bin_dir), Ok(inst.clone()));
        // SOFTRDMA_LIB_DIR is the only place looked at when set.
        let e = lib_dir_among(Some(env.clone()), bin_dir).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("SOFTRDMA_LIB_DIR"), "{e:?}");
        std::fs::write(env.join("libibverbs.so.1"), b"x").unwrap();
        assert_eq!(lib_dir_among(Some(env.clone()), bin_dir), Ok(env));
        // The installed directory holds SONAMEs: no link directory.
        assert_eq!(link_dir(&inst).unwrap(), inst);
        assert!(!inst.join("softrdma-ld").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
