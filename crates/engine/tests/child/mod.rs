//! A test's peer process: this test binary re-run (maybe inside a network
//! namespace) as `--exact peer`, with its scenario in an environment
//! variable. The peer reports on stdout with lines `@peer WORD …` and takes
//! commands on stdin; everything it prints is kept for diagnostics. The
//! process is killed and reaped when the handle drops, and its output is
//! printed if the test is failing.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// What marks a protocol line in the peer's stdout (libtest may print
/// `test peer ... ` before it on the same line).
pub const MARK: &str = "@peer ";

/// A running peer process.
pub struct Peer {
    /// How the peer is named in failure messages.
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Protocol lines from its stdout, without the mark.
    lines: mpsc::Receiver<String>,
    /// Everything it printed.
    log: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    reaped: bool,
    /// Its output went into a panic message already.
    reported: bool,
    /// How long to wait for a line or for its exit.
    wait: Duration,
}

impl Peer {
    /// Runs `cmd` (this binary, maybe inside a namespace) as the `peer`
    /// test with `env=spec`.
    pub fn spawn(mut cmd: Command, env: &str, spec: &str, name: String, wait: Duration) -> Peer {
        let mut child = cmd
            .args(["--exact", "peer", "--nocapture", "--test-threads=1"])
            .env(env, spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let l = log.clone();
        let stdout_reader = thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                l.lock().unwrap().push_str(&format!("[stdout] {line}\n"));
                if let Some(i) = line.find(MARK) {
                    // The test may have stopped listening; keep draining.
                    let _ = tx.send(line[i + MARK.len()..].to_string());
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let l = log.clone();
        let stderr_reader = thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = err.read(&mut buf) {
                l.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Peer {
            name,
            stdin: child.stdin.take(),
            child,
            lines,
            log,
            readers: vec![stdout_reader, stderr_reader],
            reaped: false,
            reported: false,
            wait,
        }
    }

    /// Kills (unless it already exited) and reaps the peer, then collects
    /// all it printed.
    pub fn reap(&mut self) -> String {
        if !self.reaped {
            self.stdin = None;
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.reaped = true;
        }
        // The pipes are closed now that the peer is gone: readers finish.
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        self.log.lock().unwrap().clone()
    }

    /// Fails the test with `msg` and everything the peer printed.
    pub fn fail(&mut self, msg: &str) -> ! {
        let log = self.reap();
        self.reported = true;
        panic!(
            "peer `{}`: {msg}\n--- peer output ---\n{log}--- end of peer output ---",
            self.name
        );
    }

    /// Waits for the protocol line `word …`; returns the words after it.
    pub fn expect(&mut self, word: &str) -> Vec<String> {
        match self.lines.recv_timeout(self.wait) {
            Ok(line) => {
                let mut w = line.split_whitespace().map(str::to_string);
                if w.next().as_deref() == Some(word) {
                    return w.collect();
                }
                self.fail(&format!("expected `{word}`, got `{line}`"))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.fail(&format!("no `{word}` within {:?}", self.wait))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                self.fail(&format!("exited before `{word}`"))
            }
        }
    }

    /// Sends the peer one command line on its stdin.
    pub fn tell(&mut self, line: &str) {
        let r = self
            .stdin
            .as_mut()
            .map(|s| writeln!(s, "{line}").and_then(|()| s.flush()));
        if !matches!(r, Some(Ok(()))) {
            self.fail(&format!("could not tell it `{line}`: {r:?}"));
        }
    }

    /// Closes the peer's stdin.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the peer to exit (failing the test after the wait limit);
    /// it is reaped then.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + self.wait;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                Ok(None) => self.fail(&format!("did not exit within {:?}", self.wait)),
                Err(e) => self.fail(&format!("wait: {e}")),
            }
        };
        self.reaped = true;
        status
    }

    /// Protocol lines already received and not yet expected.
    pub fn pending_lines(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// Waits for `@peer ok` and a successful exit.
    pub fn finish_ok(&mut self) {
        self.expect("ok");
        // stdin stays open until it exited: a peer exits on its end.
        let status = self.wait_exit();
        if !status.success() {
            self.fail(&format!("exit {status}"));
        }
        self.reap();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let log = self.reap();
        if thread::panicking() && !self.reported {
            eprintln!(
                "peer `{}` output:\n{log}--- end of peer output ---",
                self.name
            );
        }
    }
}
