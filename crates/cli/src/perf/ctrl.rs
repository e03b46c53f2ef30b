//! The out-of-band control channel between the two ends of a benchmark: a
//! plain TCP connection carrying one message per line,
//! `KIND key=value key=value…`, with `%`-escaped values. It carries the
//! test parameters, the QP numbers, addresses, rkeys and ports each side
//! needs, the end of a run and the receiver's counts — never benchmark
//! data.
//!
//! Every read has a deadline ([`Ctrl::set_timeout`]), so a dead peer is an
//! error, not a hang. A peer that hits an error sends `ERR msg=…`;
//! [`Ctrl::recv`] turns that into an error carrying the peer's reason.

use std::fmt::Display;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::time::{Duration, Instant};

/// What a server answers to `ABORT`.
pub(crate) const ABORTED: &str = "cell aborted by the client";

/// Default deadline of a control read.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// One control message.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Msg {
    /// The first word.
    pub kind: String,
    fields: Vec<(String, String)>,
}

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => o.push_str("%25"),
            ' ' => o.push_str("%20"),
            '\n' => o.push_str("%0A"),
            '\r' => o.push_str("%0D"),
            '=' => o.push_str("%3D"),
            c => o.push(c),
        }
    }
    o
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Msg {
    /// A message of kind `kind` without fields.
    pub(crate) fn new(kind: &str) -> Msg {
        Msg {
            kind: kind.to_string(),
            fields: Vec::new(),
        }
    }

    /// Adds `key=value`.
    pub(crate) fn with(mut self, key: &str, value: impl Display) -> Msg {
        self.fields.push((key.to_string(), value.to_string()));
        self
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key`, parsed; an error names the key.
    pub(crate) fn num<T: FromStr>(&self, key: &str) -> io::Result<T> {
        let v = self
            .get(key)
            .ok_or_else(|| bad(format!("control message {} lacks field {key:?}", self.kind)))?;
        v.parse()
            .map_err(|_| bad(format!("control field {key}={v:?} is not valid")))
    }

    fn encode(&self) -> String {
        let mut s = escape(&self.kind);
        for (k, v) in &self.fields {
            s.push(' ');
            s.push_str(&escape(k));
            s.push('=');
            s.push_str(&escape(v));
        }
        s.push('\n');
        s
    }

    fn decode(line: &str) -> io::Result<Msg> {
        let mut words = line.split_ascii_whitespace();
        let kind = words
            .next()
            .ok_or_else(|| bad("empty control message".into()))?;
        let mut m = Msg::new(&unescape(kind));
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| bad(format!("control field without '=': {w:?}")))?;
            m.fields.push((unescape(k), unescape(v)));
        }
        Ok(m)
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// One end of a control connection.
#[derive(Debug)]
pub(crate) struct Ctrl {
    r: BufReader<TcpStream>,
    w: TcpStream,
    timeout: Duration,
}

impl Ctrl {
    /// Wraps an accepted or connected stream.
    pub(crate) fn new(s: TcpStream) -> io::Result<Ctrl> {
        s.set_nodelay(true)?;
        let w = s.try_clone()?;
        Ok(Ctrl {
            r: BufReader::new(s),
            w,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Connects to `addr`, retrying for up to `within` (the server may
    /// still be starting).
    pub(crate) fn connect(addr: impl ToSocketAddrs, within: Duration) -> io::Result<Ctrl> {
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        let deadline = Instant::now() + within;
        loop {
            let mut last = io::Error::new(io::ErrorKind::NotFound, "no address to connect to");
            for a in &addrs {
                match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                    Ok(s) => return Ctrl::new(s),
                    Err(e) => last = e,
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    last.kind(),
                    format!("control connection to {addrs:?}: {last}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Deadline of each [`Ctrl::recv`].
    pub(crate) fn set_timeout(&mut self, t: Duration) {
        self.timeout = t;
    }

    /// The peer's address.
    pub(crate) fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.w.peer_addr()
    }

    /// Our address on this connection (the interface facing the peer).
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.w.local_addr()
    }

    /// Sends one message.
    pub(crate) fn send(&mut self, m: &Msg) -> io::Result<()> {
        self.w.write_all(m.encode().as_bytes())
    }

    /// Tells the peer we failed, and why (best effort).
    pub(crate) fn send_err(&mut self, why: &str) {
        let _ = self.send(&Msg::new("ERR").with("msg", why));
    }

    /// Receives one message; `ERR` from the peer and EOF are errors.
    pub(crate) fn recv(&mut self) -> io::Result<Msg> {
        self.w.set_read_timeout(Some(self.timeout))?;
        let mut line = String::new();
        match self.r.read_line(&mut line) {
            Ok(0) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the control connection",
            )),
            Ok(_) => {
                let m = Msg::decode(line.trim_end())?;
                if m.kind == "ERR" {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("peer: {}", m.get("msg").unwrap_or("unspecified error")),
                    ));
                }
                Ok(m)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no control message from the peer for {:?}", self.timeout),
                ))
            }
            Err(e) => Err(e),
        }
    }

    /// After a failed cell on our side: tells the peer (`ABORT`) and reads
    /// until its `ERR` answer, so the next cell starts in step. Returns the
    /// peer's reason (`Some("")` when it only acknowledged the abort), or
    /// `None` if the session is lost.
    pub(crate) fn resync(&mut self) -> Option<String> {
        if self.send(&Msg::new("ABORT")).is_err() {
            return None;
        }
        let saved = self.timeout;
        self.timeout = Duration::from_secs(15);
        let r = loop {
            match self.recv() {
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {
                    let why = e.to_string();
                    if why.contains(ABORTED) {
                        break Some(String::new());
                    }
                    // The peer's own failure came first; its answer to the
                    // ABORT follows.
                    let _ = self.recv();
                    break Some(why);
                }
                Err(_) => break None,
            }
        };
        self.timeout = saved;
        r
    }

    /// Receives a message that must be of kind `kind`.
    pub(crate) fn expect(&mut self, kind: &str) -> io::Result<Msg> {
        let m = self.recv()?;
        if m.kind == "ABORT" && kind != "ABORT" {
            return Err(io::Error::other(ABORTED));
        }
        if m.kind != kind {
            return Err(bad(format!("control: expected {kind}, got {}", m.kind)));
        }
        Ok(m)
    }

    /// True if a message (or EOF) is waiting, without blocking: what a
    /// busy-polling loop calls now and then to learn that the run is over.
    pub(crate) fn ready(&mut self) -> bool {
        if !self.r.buffer().is_empty() {
            return true;
        }
        let s = self.r.get_ref();
        if s.set_nonblocking(true).is_err() {
            return true;
        }
        let mut b = [0u8; 1];
        let r = s.peek(&mut b);
        let _ = s.set_nonblocking(false);
        match r {
            Ok(_) => true,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn messages_round_trip_with_escapes() {
        let m = Msg::new("CELL")
            .with("test", "send_lat")
            .with("msg", "a b=c%d\ne")
            .with("n", 42);
        let d = Msg::decode(m.encode().trim_end()).unwrap();
        assert_eq!(d, m);
        assert_eq!(d.num::<u32>("n").unwrap(), 42);
        assert!(d.num::<u32>("test").is_err());
        assert!(d.num::<u32>("missing").is_err());
        assert!(Msg::decode("").is_err());
        assert!(Msg::decode("X novalue").is_err());
        assert_eq!(unescape("%"), "%");
        assert_eq!(unescape("%4"), "%4");
    }

    #[test]
    fn err_and_eof_are_errors_and_ready_sees_data() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = Ctrl::connect(l.local_addr().unwrap(), Duration::from_secs(5)).unwrap();
        let mut b = Ctrl::new(l.accept().unwrap().0).unwrap();
        assert!(!b.ready());
        a.send(&Msg::new("HELLO").with("x", 1)).unwrap();
        assert_eq!(b.expect("HELLO").unwrap().num::<u8>("x").unwrap(), 1);
        a.send_err("broken pipe dream");
        std::thread::sleep(Duration::from_millis(20));
        assert!(b.ready());
        let e = b.recv().unwrap_err().to_string();
        assert!(e.contains("broken pipe dream"), "{e}");
        b.set_timeout(Duration::from_millis(50));
        assert_eq!(b.recv().unwrap_err().kind(), io::ErrorKind::TimedOut);
        drop(a);
        assert!(b.ready());
        assert_eq!(b.recv().unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
