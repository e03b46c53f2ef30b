//! Running the two ends of a benchmark as two processes: this binary
//! re-executes itself (`current_exe`) with hidden arguments.
//!
//! * [`ServerChild::spawn`] starts `softrdma perf __server --port 0
//!   --announce …`, which binds its control port, prints `LISTENING
//!   <port>` on stdout and then serves one control session (the loopback
//!   mode of `softrdma perf TEST`).
//! * [`run_self`] runs `softrdma ARGS` to completion with a deadline and
//!   collects its stdout and stderr (the suite runs every group of cells
//!   that way, so a crash of one group is a failed cell, not a failed
//!   suite).
//!
//! Children never outlive their parent's interest: a [`ServerChild`] is
//! killed when dropped, and a server gives up when its control connection
//! closes or does not come.

use std::io::{self, BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// A `Command` for this very binary.
pub(crate) fn self_command() -> io::Result<Command> {
    Ok(Command::new(std::env::current_exe()?))
}

/// A server end running in a child process.
#[derive(Debug)]
pub(crate) struct ServerChild {
    child: Option<Child>,
    /// The control port it listens on (127.0.0.1 and every other address).
    pub port: u16,
}

impl ServerChild {
    /// Starts `softrdma perf __server --port 0 --announce EXTRA…` with
    /// `envs` added to the environment and waits (up to `within`) for it to
    /// announce its port.
    pub(crate) fn spawn(
        extra: &[String],
        envs: &[(String, String)],
        within: Duration,
    ) -> io::Result<ServerChild> {
        let mut cmd = self_command()?;
        cmd.args(["perf", "__server", "--port", "0", "--announce"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn()?;
        let out = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut line = String::new();
            let res = r.read_line(&mut line).map(|_| line);
            let _ = tx.send(res);
            // Keep draining so the child never blocks on a full pipe.
            let mut sink = Vec::new();
            let _ = r.read_to_end(&mut sink);
        });
        let mut sc = ServerChild {
            child: Some(child),
            port: 0,
        };
        let line = match rx.recv_timeout(within) {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the server process did not announce its port",
                ))
            }
        };
        let port = line
            .trim()
            .strip_prefix("LISTENING ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| {
                let st = sc.reap(Duration::from_millis(500));
                io::Error::other(format!(
                    "the server process did not start (said {:?}, {})",
                    line.trim(),
                    st.map(|s| s.to_string())
                        .unwrap_or_else(|| "still running".into())
                ))
            })?;
        sc.port = port;
        Ok(sc)
    }

    fn reap(&mut self, within: Duration) -> Option<ExitStatus> {
        let c = self.child.as_mut()?;
        let deadline = Instant::now() + within;
        loop {
            match c.try_wait() {
                Ok(Some(st)) => {
                    self.child = None;
                    return Some(st);
                }
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                _ => {
                    let _ = c.kill();
                    let st = c.wait().ok();
                    self.child = None;
                    return st;
                }
            }
        }
    }

    /// Waits up to `within` for the server to exit (it should be exiting);
    /// kills it after that. An unsuccessful exit is an error.
    pub(crate) fn finish(mut self, within: Duration) -> io::Result<()> {
        match self.reap(within) {
            Some(st) if st.success() => Ok(()),
            Some(st) => Err(io::Error::other(format!(
                "the server process failed ({st})"
            ))),
            None => Err(io::Error::other(
                "the server process could not be waited for",
            )),
        }
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What [`run_self`] collected.
#[derive(Debug)]
pub(crate) struct Output {
    /// Exit status (`None`: killed at the deadline).
    pub status: Option<ExitStatus>,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Everything it printed on stderr.
    pub stderr: String,
}

/// Runs this binary with `args` and `envs`, killing it after `deadline`;
/// `on_stderr_line` sees its stderr lines as they come (progress).
pub(crate) fn run_self(
    args: &[String],
    envs: &[(String, String)],
    deadline: Duration,
    on_stderr_line: &mut dyn FnMut(&str),
) -> io::Result<Output> {
    let mut cmd = self_command()?;
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    run_command(cmd, deadline, on_stderr_line)
}

/// Runs `cmd` (stdout and stderr piped) with a deadline; see [`run_self`].
pub(crate) fn run_command(
    mut cmd: Command,
    deadline: Duration,
    on_stderr_line: &mut dyn FnMut(&str),
) -> io::Result<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let mut out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    let out_t = thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let (tx, rx) = mpsc::channel::<String>();
    let err_t = thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            match line {
                Ok(l) => {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    });
    let end = Instant::now() + deadline;
    let mut stderr = String::new();
    let status = loop {
        while let Ok(l) = rx.try_recv() {
            on_stderr_line(&l);
            stderr.push_str(&l);
            stderr.push('\n');
        }
        match child.try_wait()? {
            Some(st) => break Some(st),
            None if Instant::now() >= end => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => {
                if let Ok(l) = rx.recv_timeout(Duration::from_millis(20)) {
                    on_stderr_line(&l);
                    stderr.push_str(&l);
                    stderr.push('\n');
                }
            }
        }
    };
    let _ = err_t.join();
    while let Ok(l) = rx.try_recv() {
        on_stderr_line(&l);
        stderr.push_str(&l);
        stderr.push('\n');
    }
    let stdout = out_t.join().unwrap_or_default();
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}
