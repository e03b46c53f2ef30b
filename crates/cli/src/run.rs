//! `softrdma run [--sockets] [--] PROG ARGS...`: runs an unmodified verbs
//! program over softrdma, or with `--sockets` an unmodified TCP program
//! whose connections to other interposed programs are carried by iWARP.
//!
//! It finds softrdma's drop-in `libibverbs.so.1` and `librdmacm.so.1`
//! (the capi and capi-rdmacm crates), puts a directory holding them under
//! their SONAMEs (what the program's loader asks for) first on
//! `LD_LIBRARY_PATH` and execs PROG with ARGS, verbatim. With `--sockets`
//! it also puts the sockets interposer, `libsoftrdma-sockets.so.1` (the
//! sockets crate), first on `LD_PRELOAD`, before whatever that already
//! names.
//!
//! Where the libraries are looked for, in this order (the first place that
//! has the key library is taken: `libibverbs`, or with `--sockets` the
//! interposer; [`find_lib_dir`]):
//!
//! 1. `$SOFTRDMA_LIB_DIR`, when set and not empty: the only place looked
//!    at then (an explicit choice that does not hold the library is an
//!    error, not a reason to take another one);
//! 2. `<dir of this executable>/../lib/softrdma`, when it holds the key
//!    library under its SONAME: an installed tree, `PREFIX/bin/softrdma` beside
//!    `PREFIX/lib/softrdma/` (the executable's path with symbolic links
//!    resolved, so a link to it elsewhere finds the same tree);
//! 3. the directory of this executable, then its `deps/` subdirectory:
//!    cargo's `target/release` or `target/debug`, where the cdylibs
//!    (`libibverbs.so`, `libsoftrdma_sockets.so`) are built beside the
//!    binary.
//!
//! When none has it, `softrdma run` exits with status 127 and names the
//! places it looked. A directory that holds every library under its
//! SONAME (an installed one) goes on `LD_LIBRARY_PATH` as it is; for
//! cargo's output, which names them `libibverbs.so` and
//! `libsoftrdma_sockets.so`, a directory of SONAME links is made (and
//! `LD_PRELOAD` names the interposer's link there): `<lib dir>/softrdma-ld` when writable, otherwise
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

/// `softrdma run [--sockets] [--] PROG [ARGS...]`.
#[derive(Debug, clap::Args)]
#[command(
    about = "Run an unmodified verbs program (or, with --sockets, TCP program) over softrdma",
    override_usage = "softrdma run [--sockets] [--] <PROG> [ARGS]...",
    long_about = "Runs PROG with softrdma's libibverbs.so.1 and librdmacm.so.1 first on \
        LD_LIBRARY_PATH, so unmodified rdma-core programs (ibv_rc_pingpong, rping, \
        perftest, ...) run over softrdma. Everything after PROG is passed to it verbatim; \
        put -- before PROG when it starts with a dash.\n\n\
        With --sockets, PROG also runs with the sockets interposer \
        (libsoftrdma-sockets.so.1) first on LD_PRELOAD, before anything LD_PRELOAD already \
        names: an unmodified TCP program (socat, redis, nginx, iperf3, ...) whose peer on \
        this host runs under softrdma run --sockets too has that connection's bytes carried \
        by iWARP (MPA/DDP/RDMAP) on the same TCP connection; a connection to any other \
        peer stays a plain kernel TCP socket. The programs it starts inherit LD_PRELOAD, \
        so they are interposed too. `softrdma sockets stat PID` shows a running \
        program's sockets.",
    after_long_help = "Where the libraries are looked for, the first place holding \
        libibverbs (with --sockets: the interposer) wins:\n  \
        1. $SOFTRDMA_LIB_DIR, if set (then only there);\n  \
        2. <dir of the softrdma executable>/../lib/softrdma, if it holds libibverbs.so.1 \
        (with --sockets: libsoftrdma-sockets.so.1) (an installed PREFIX/bin/softrdma with \
        PREFIX/lib/softrdma/);\n  \
        3. the executable's own directory and its deps/ (cargo's target/release or \
        target/debug, after cargo build -p softrdma-capi -p softrdma-capi-rdmacm, \
        and -p softrdma-sockets for --sockets).\n\n\
        Environment the interposer reads: SOFTRDMA_SOCKETS_DIR (the same-host registry \
        and statistics directory, default /dev/shm/softrdma-sockets; programs meant to \
        find each other use the same one), SOFTRDMA_SOCKETS_REPORT (a file to which each \
        interposed process appends its totals at exit), SOFTRDMA_SOCKETS_STATS=0 (keep no \
        statistics).\n\n\
        Exit status: PROG's; 127 when the libraries or PROG cannot be found."
)]
pub(crate) struct RunArgs {
    /// Also preload the sockets interposer: TCP connections between
    /// interposed programs on this host are carried by iWARP.
    #[arg(long)]
    sockets: bool,
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

/// A library: (file cargo builds, SONAME the loader looks for).
pub type Lib = (&'static str, &'static str);

/// The verbs library, the key of a plain `softrdma run`.
pub const VERBS: Lib = ("libibverbs.so", "libibverbs.so.1");
/// The sockets interposer, the key of `softrdma run --sockets`.
pub const SOCKETS: Lib = ("libsoftrdma_sockets.so", "libsoftrdma-sockets.so.1");

/// The libraries a lib directory may hold (each gets a SONAME link).
const LIBS: &[Lib] = &[VERBS, ("librdmacm.so", "librdmacm.so.1"), SOCKETS];

/// Where softrdma's libraries are (module docs): the first place holding
/// `key`, or the places looked at, in order, each with what was missing
/// there.
pub fn find_lib_dir(key: Lib) -> Result<PathBuf, Vec<String>> {
    let env = std::env::var_os("SOFTRDMA_LIB_DIR").filter(|d| !d.is_empty());
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    lib_dir_among(env.map(PathBuf::from), exe_dir.as_deref(), key)
}

/// [`find_lib_dir`] with the environment and the executable's directory
/// given.
fn lib_dir_among(
    env: Option<PathBuf>,
    exe_dir: Option<&Path>,
    key: Lib,
) -> Result<PathBuf, Vec<String>> {
    let has = |d: &Path, names: &[&str]| names.iter().any(|n| d.join(n).is_file());
    let ours = [key.0, key.1];
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
    if has(&installed, &[key.1]) {
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

/// The sockets interposer to preload, found as `softrdma run --sockets`
/// finds it (a SONAME link in the link directory); `Err`: the places
/// looked at, or why the link could not be made.
pub fn find_interposer() -> Result<PathBuf, Vec<String>> {
    let dir = find_lib_dir(SOCKETS)?;
    let links = link_dir(&dir).map_err(|e| vec![format!("{}: {e}", dir.display())])?;
    let lib = links.join(SOCKETS.1);
    if lib.is_file() {
        Ok(lib)
    } else {
        Err(vec![format!("{}: no {}", links.display(), SOCKETS.1)])
    }
}

/// The `LD_PRELOAD` value: `lib` first, then the old value (whose
/// entries the loader separates by spaces or colons).
pub fn preload(lib: &Path, old: Option<OsString>) -> OsString {
    let mut v = lib.as_os_str().to_os_string();
    if let Some(old) = old.filter(|o| !o.to_string_lossy().trim().is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// Entry point of `softrdma run`.
pub fn main(a: RunArgs) -> ExitCode {
    let (prog, args) = (&a.prog, &a.args);
    let key = if a.sockets { SOCKETS } else { VERBS };
    let lib_dir = match find_lib_dir(key) {
        Ok(d) => d,
        Err(looked) if a.sockets => {
            eprintln!(
                "softrdma run --sockets: the sockets interposer ({} or {}) not found; \
                 looked in:\n  {}\n\
                 (build it: cargo build -p softrdma-sockets; install it with \
                 scripts/install.sh; or set SOFTRDMA_LIB_DIR)",
                SOCKETS.1,
                SOCKETS.0,
                looked.join("\n  ")
            );
            return ExitCode::from(127);
        }
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
    let mut cmd = Command::new(prog);
    cmd.args(args).env(
        "LD_LIBRARY_PATH",
        library_path(&dir, std::env::var_os("LD_LIBRARY_PATH")),
    );
    if a.sockets {
        let lib = dir.join(SOCKETS.1);
        if !lib.is_file() {
            eprintln!(
                "softrdma run --sockets: {} is missing (a broken link to {}?)",
                lib.display(),
                lib_dir.display()
            );
            return ExitCode::from(127);
        }
        cmd.env("LD_PRELOAD", preload(&lib, std::env::var_os("LD_PRELOAD")));
    }
    let err = cmd.exec();
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
        let looked = lib_dir_among(None, bin_dir, VERBS).unwrap_err();
        assert_eq!(looked.len(), 4, "{looked:?}");
        assert!(looked[0].contains("SOFTRDMA_LIB_DIR"), "{looked:?}");
        assert!(looked[1].contains("lib/softrdma"), "{looked:?}");
        assert!(looked[3].contains("deps"), "{looked:?}");
        // cargo's output beside the binary.
        std::fs::write(bin.join("libibverbs.so"), b"x").unwrap();
        assert_eq!(lib_dir_among(None, bin_dir, VERBS), Ok(bin.clone()));
        // An installed tree wins over it, but only with the SONAME file.
        std::fs::write(inst.join("libibverbs.so"), b"x").unwrap();
        assert_eq!(lib_dir_among(None, bin_dir, VERBS), Ok(bin.clone()));
        std::fs::write(inst.join("libibverbs.so.1"), b"x").unwrap();
        assert_eq!(lib_dir_among(None, bin_dir, VERBS), Ok(inst.clone()));
        // SOFTRDMA_LIB_DIR is the only place looked at when set.
        let e = lib_dir_among(Some(env.clone()), bin_dir, VERBS).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].contains("SOFTRDMA_LIB_DIR"), "{e:?}");
        std::fs::write(env.join("libibverbs.so.1"), b"x").unwrap();
        assert_eq!(lib_dir_among(Some(env.clone()), bin_dir, VERBS), Ok(env));
        // The installed directory holds SONAMEs: no link directory.
        assert_eq!(link_dir(&inst).unwrap(), inst);
        assert!(!inst.join("softrdma-ld").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// `--sockets` looks for the interposer the same way: cargo's
    /// `libsoftrdma_sockets.so` (found without any verbs library), an
    /// installed `libsoftrdma-sockets.so.1`, each named in a failure.
    #[test]
    fn the_interposer_is_found_and_linked() {
        let base = std::env::temp_dir().join(format!("softrdma-sock-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (bin, inst) = (base.join("bin"), base.join("lib/softrdma"));
        for d in [&bin, &inst] {
            std::fs::create_dir_all(d).unwrap();
        }
        let bin_dir = Some(bin.as_path());
        let looked = lib_dir_among(None, bin_dir, SOCKETS).unwrap_err();
        assert_eq!(looked.len(), 4, "{looked:?}");
        assert!(looked[1].contains("libsoftrdma-sockets.so.1"), "{looked:?}");
        assert!(looked[2].contains("libsoftrdma_sockets.so"), "{looked:?}");
        std::fs::write(bin.join("libsoftrdma_sockets.so"), b"x").unwrap();
        assert_eq!(lib_dir_among(None, bin_dir, SOCKETS), Ok(bin.clone()));
        // The verbs library is still missing there.
        assert!(lib_dir_among(None, bin_dir, VERBS).is_err());
        let dir = link_dir(&bin).unwrap();
        assert_eq!(
            std::fs::read_link(dir.join("libsoftrdma-sockets.so.1")).unwrap(),
            bin.join("libsoftrdma_sockets.so").canonicalize().unwrap()
        );
        assert!(!dir.join("libibverbs.so.1").exists());
        std::fs::write(inst.join("libsoftrdma-sockets.so.1"), b"x").unwrap();
        assert_eq!(lib_dir_among(None, bin_dir, SOCKETS), Ok(inst.clone()));
        assert_eq!(link_dir(&inst).unwrap(), inst);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn preload_puts_the_interposer_first() {
        let l = Path::new("/p/libsoftrdma-sockets.so.1");
        assert_eq!(
            preload(l, None),
            OsString::from("/p/libsoftrdma-sockets.so.1")
        );
        assert_eq!(
            preload(l, Some(" ".into())),
            OsString::from("/p/libsoftrdma-sockets.so.1")
        );
        assert_eq!(
            preload(l, Some("/a.so /b.so".into())),
            OsString::from("/p/libsoftrdma-sockets.so.1:/a.so /b.so")
        );
    }
}
