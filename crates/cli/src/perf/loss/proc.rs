//! Child processes for `perf loss` and `perf scale`: a line protocol over
//! the child's stdin/stdout, `key=value` words, process facts read from
//! `/proc`, and a guard that removes network namespaces even when the
//! parent is killed.
//!
//! Contract: a role (a child started with `--role NAME key=value…`)
//! writes one line per event on stdout (`ready port=… qpn=…`,
//! `result …`), reads commands (`go`, `stop`) one per line on stdin, and
//! exits when its stdin closes. The parent's [`Proc`] kills and reaps the
//! child when dropped, so no role outlives a failed run.

use std::collections::HashMap;
use std::fmt::Display;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::str::FromStr;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// `key=value` words of one protocol line.
#[derive(Debug, Clone, Default)]
pub struct Kv(HashMap<String, String>);

impl Kv {
    /// Parses the `key=value` words of `words`; other words are ignored.
    pub fn parse<'a>(words: impl IntoIterator<Item = &'a str>) -> Kv {
        Kv(words
            .into_iter()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// The value of `key`, parsed; an error names the key.
    pub fn get<T: FromStr>(&self, key: &str) -> Result<T, String>
    where
        T::Err: Display,
    {
        let v = self
            .0
            .get(key)
            .ok_or_else(|| format!("missing `{key}=` (have {:?})", self.0))?;
        v.parse().map_err(|e| format!("`{key}={v}`: {e}"))
    }

    /// The value of `key` parsed, or `default` when absent.
    pub fn get_or<T: FromStr>(&self, key: &str, default: T) -> Result<T, String>
    where
        T::Err: Display,
    {
        if self.0.contains_key(key) {
            self.get(key)
        } else {
            Ok(default)
        }
    }

    /// The raw value of `key`.
    pub fn raw(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

/// A child process running one role; killed and reaped when dropped.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `cmd` with piped stdin/stdout (stderr inherited).
    pub fn spawn(mut cmd: Command, name: &str) -> Result<Proc, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("{name}: cannot start: {e}"))?;
        let out = child.stdout.take().ok_or("no stdout pipe")?;
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Proc {
            name: name.to_string(),
            stdin: child.stdin.take(),
            child,
            lines,
        })
    }

    /// Waits up to `timeout` for a line starting with `word`; other lines
    /// are ignored. An `error …` line, an exit or the timeout is an error.
    pub fn expect(&mut self, word: &str, timeout: Duration) -> Result<Kv, String> {
        self.poll(word, timeout)?.ok_or_else(|| {
            format!(
                "{}: no `{word}` within {:.0} s",
                self.name,
                timeout.as_secs_f64()
            )
        })
    }

    /// Reads the lines that come within `within` (none waited for when
    /// zero) until one starts with `word`: `Ok(None)` if none did in
    /// time; an `error …` line or an exit is an error naming the process.
    pub fn poll(&mut self, word: &str, within: Duration) -> Result<Option<Kv>, String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let mut w = line.split_whitespace();
                    match w.next() {
                        Some(first) if first == word => return Ok(Some(Kv::parse(w))),
                        Some("error") => {
                            return Err(format!(
                                "{}: {}",
                                self.name,
                                line.trim_start_matches("error").trim()
                            ))
                        }
                        _ => {}
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => return Ok(None),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().map(|s| s.to_string());
                    return Err(format!(
                        "{}: exited before `{word}` ({})",
                        self.name,
                        status.unwrap_or_else(|e| e.to_string())
                    ));
                }
            }
        }
    }

    /// Sends one command line.
    pub fn tell(&mut self, line: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("{}: {e}", self.name))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        // Give a well-behaved role a moment to exit on EOF, then kill it.
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ----------------------------------------------------------------------
// The child's side
// ----------------------------------------------------------------------

/// Writes one protocol line on stdout.
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Command lines from stdin, read by a thread; the channel closes at EOF
/// (the parent went away), which roles treat as `stop`.
pub fn commands() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line.trim().to_string()).is_err() {
                break;
            }
        }
    });
    rx
}

/// True when a command arrived or stdin closed.
pub fn stopped(cmds: &mpsc::Receiver<String>) -> bool {
    !matches!(cmds.try_recv(), Err(mpsc::TryRecvError::Empty))
}

/// True when stdin closed: the parent is gone (killed, or ended without
/// a word), so a role in the middle of its work stops instead of running
/// out its window orphaned. For loops that expect no command: one that
/// came is dropped.
pub fn orphaned(cmds: &mpsc::Receiver<String>) -> bool {
    matches!(cmds.try_recv(), Err(mpsc::TryRecvError::Disconnected))
}

// ----------------------------------------------------------------------
// Facts from /proc
// ----------------------------------------------------------------------

/// A `kB` field of `/proc/self/status` (e.g. `VmRSS`), in octets.
pub fn status_kb(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// Resident set size of this process in octets (0 if unknown).
pub fn rss() -> u64 {
    status_kb("VmRSS").unwrap_or(0)
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// The soft limit on open files (`Max open files` of `/proc/self/limits`).
pub fn fd_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// True if the effective user is root (the `Uid:` line's second field).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

// ----------------------------------------------------------------------
// Namespace cleanup that survives the parent
// ----------------------------------------------------------------------

/// Removes the named network namespaces when dropped, or when this process
/// dies in any way (ctrl-c, kill): a shell that ignores SIGINT/SIGTERM/SIGHUP
/// waits for EOF on a pipe only this process holds, then runs
/// `ip netns del` for each name.
#[derive(Debug)]
pub struct NetnsGuard {
    child: Option<Child>,
}

impl NetnsGuard {
    /// Arms the guard for `names`.
    pub fn new(names: &[String]) -> Result<NetnsGuard, String> {
        let mut script = String::from("trap '' INT TERM HUP; cat >/dev/null;");
        for n in names {
            if !n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("unexpected namespace name {n:?}"));
            }
            script.push_str(&format!(" ip netns del {n} 2>/dev/null;"));
        }
        script.push_str(" exit 0");
        let child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cleanup guard: {e}"))?;
        Ok(NetnsGuard { child: Some(child) })
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            drop(c.stdin.take());
            let _ = c.wait();
        }
    }
}

/// The command that re-runs this binary as `softrdma perf SUB --role ROLE
/// ARGS…`, optionally inside network namespace `ns`, with the soft limit
/// on open files raised to `nofile` first when given (by `ulimit -n` in a
/// shell that then `exec`s the role; if the limit cannot be raised the role
/// runs with the old one and reports it).
pub fn role_command(
    ns: Option<&str>,
    nofile: Option<u64>,
    sub: &str,
    role: &str,
    args: &[String],
) -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    if let Some(ns) = ns {
        for a in ["ip", "netns", "exec", ns] {
            argv.push(a.into());
        }
    }
    if let Some(n) = nofile {
        argv.push("sh".into());
        argv.push("-c".into());
        argv.push(format!("ulimit -n {n} 2>/dev/null; exec \"$0\" \"$@\"").into());
    }
    argv.push(exe.into_os_string());
    for a in ["perf", sub, "--role", role] {
        argv.push(a.into());
    }
    argv.extend(args.iter().map(Into::into));
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    Ok(cmd)
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`), and how
/// many CPUs this process may use: busy-polling ends want a core each, so
/// a loaded machine shows in the figures (setup times above all).
pub fn load_note() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let avg: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "load average {} on {} CPUs",
        avg.join(" "),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )
}

/// Prints a progress line on stderr, prefixed with the elapsed time; on
/// a terminal a spinner below the lines shows the step under way (see
/// [`crate::perf::report::Progress`]), cleared when the step starts with
/// `done`.
pub fn progress(start: Instant, what: &str) {
    use std::sync::OnceLock;
    static SPINNER: OnceLock<crate::perf::report::Progress> = OnceLock::new();
    let p = SPINNER.get_or_init(|| crate::perf::report::Progress::new(0));
    p.line(&format!("[{:6.1} s] {what}", start.elapsed().as_secs_f64()));
    if what.starts_with("done") {
        p.finish();
    } else {
        p.step(what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Proc {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        Proc::spawn(cmd, "child").expect("sh starts")
    }

    /// Polls until `poll` answers something other than "nothing yet", for
    /// at most 10 s: a test of the poll must not hang if it is broken.
    fn first_answer(p: &mut Proc, word: &str) -> Result<Kv, String> {
        for _ in 0..100 {
            if let Some(kv) = p.poll(word, Duration::from_millis(100))? {
                return Ok(kv);
            }
        }
        panic!("no answer within 10 s")
    }

    #[test]
    fn poll_finds_the_word_skips_other_lines_and_waits_no_longer_than_asked() {
        let mut p = sh("echo progress 1; echo done resent=3; sleep 30");
        let kv = first_answer(&mut p, "done").expect("no error");
        assert_eq!(kv.get::<u64>("resent").unwrap(), 3);
        let t = Instant::now();
        assert!(p.poll("done", Duration::ZERO).expect("alive").is_none());
        assert!(p
            .poll("done", Duration::from_millis(50))
            .expect("alive")
            .is_none());
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "waited {:?}",
            t.elapsed()
        );
    }

    #[test]
    fn poll_reports_an_error_line_or_an_exit_with_the_process_name() {
        let mut p = sh("echo error endpoint 7: no reply; sleep 30");
        let e = first_answer(&mut p, "done").expect_err("an error line");
        assert_eq!(e, "child: endpoint 7: no reply");
        let mut q = sh("exit 3");
        let e = first_answer(&mut q, "done").expect_err("an exit");
        assert!(e.starts_with("child: exited before `done`"), "{e}");
        assert!(e.contains('3'), "{e}");
    }
}
