//! What one benchmark cell is, table-driven: the tests ([`TESTS`], and the
//! raw-socket [`BASELINES`]), the transports ([`TRANSPORTS`]: which
//! operations each refuses and which baseline it is compared with), a
//! cell's parameters ([`Spec`], sent to the server end over the control
//! channel), and the pieces every runner shares: how ends wait
//! ([`WaitMode`]), a hang detector ([`Watch`]), the `--verify` pattern
//! ([`fill`], [`check`]).
//!
//! Adding a transport (DC) means: a [`TransportDef`] row here and its QP
//! set-up arm in `rdma.rs`.
//!
//! Session protocol (one control connection, client = measuring side):
//! `CELL <spec>` → server sets its end up → `READY …` (its addresses) →
//! client sets up, `CLIENT …` → server `GO` → both run → client `END` →
//! server `DONE …` (its counts). Then the next `CELL`, or `BYE`. A side
//! that fails sends `ERR msg=…` instead of its next message.

use std::io;
use std::time::{Duration, Instant};

use super::ctrl::{Ctrl, Msg};
use super::report::PerfResult;
use super::{baseline, rdma};

/// The operation a test measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Two-sided Send/Receive.
    Send,
    /// RDMA Write.
    Write,
    /// RDMA Read.
    Read,
    /// RDMA Write-Record (datagram transports only).
    WriteRecord,
    /// 8-octet fetch-and-add.
    Atomic,
    /// Raw TCP socket (baseline).
    Tcp,
    /// Raw UDP socket (baseline).
    Udp,
}

/// Latency (ping-pong, one way = round trip / 2) or bandwidth (stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Ping-pong.
    Lat,
    /// Stream.
    Bw,
}

/// A test.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TestDef {
    /// Its name on the command line and in results.
    pub name: &'static str,
    /// What it does.
    pub op: Op,
    /// How it measures.
    pub kind: Kind,
    /// The only message size it takes (atomics: 8).
    pub fixed_size: Option<usize>,
}

const fn t(name: &'static str, op: Op, kind: Kind) -> TestDef {
    TestDef {
        name,
        op,
        kind,
        fixed_size: None,
    }
}

/// The softrdma tests.
pub(crate) const TESTS: &[TestDef] = &[
    t("send_lat", Op::Send, Kind::Lat),
    t("send_bw", Op::Send, Kind::Bw),
    t("write_lat", Op::Write, Kind::Lat),
    t("write_bw", Op::Write, Kind::Bw),
    t("read_lat", Op::Read, Kind::Lat),
    t("read_bw", Op::Read, Kind::Bw),
    t("write_record_lat", Op::WriteRecord, Kind::Lat),
    t("write_record_bw", Op::WriteRecord, Kind::Bw),
    TestDef {
        name: "atomic_lat",
        op: Op::Atomic,
        kind: Kind::Lat,
        fixed_size: Some(8),
    },
];

/// The raw-socket baselines.
pub(crate) const BASELINES: &[TestDef] = &[
    t("tcp_lat", Op::Tcp, Kind::Lat),
    t("tcp_bw", Op::Tcp, Kind::Bw),
    // `tcp_lat` framed as RC Sends with softrdma's wire code alone: the
    // floor of RC latency over kernel sockets (see baseline.rs).
    t("tcp_mpa_lat", Op::Tcp, Kind::Lat),
    t("udp_lat", Op::Udp, Kind::Lat),
    // `udp_lat` framed as UD Sends with softrdma's wire code alone: the
    // floor of UD latency over kernel sockets (see baseline.rs).
    t("udp_dgram_lat", Op::Udp, Kind::Lat),
    t("udp_bw", Op::Udp, Kind::Bw),
    // `tcp_bw` framed as RC Writes without CRC, each FPDU's payload read
    // into place by its own readv: the floor of no-CRC RC Write bandwidth.
    t("tcp_mpa_bw", Op::Tcp, Kind::Bw),
    // The same with the MPA CRC at both ends (batched as RC batches it):
    // the floor of RC Write bandwidth with CRC.
    t("tcp_mpa_crc_bw", Op::Tcp, Kind::Bw),
    // `tcp_bw` plus CRC32C over every octet at both ends: the ceiling of
    // an MPA stream with CRC over kernel sockets (see baseline.rs).
    t("tcp_crc_bw", Op::Tcp, Kind::Bw),
    // `udp_bw` plus a CRC32C trailer per datagram and the receiver's
    // placement copy: the ceiling of datagram iWARP bandwidth.
    t("udp_crc_bw", Op::Udp, Kind::Bw),
];

/// The plain baseline a baseline that does more than a raw socket is
/// compared with (`tcp_crc_bw` → `tcp_bw`), and `udp_lat` → `tcp_lat`:
/// the raw UDP ping-pong against the raw TCP one is the floor of the
/// "UD latency 15 % below RC" target. `None` for the other raw ones.
pub(crate) fn reference_of(test: &TestDef) -> Option<&'static TestDef> {
    match test.name {
        "tcp_crc_bw" => test_by_name("tcp_bw"),
        "udp_lat" => test_by_name("tcp_lat"),
        "tcp_mpa_lat" => test_by_name("tcp_lat"),
        "udp_dgram_lat" => test_by_name("udp_lat"),
        "tcp_mpa_bw" | "tcp_mpa_crc_bw" => test_by_name("tcp_bw"),
        "udp_crc_bw" => test_by_name("udp_bw"),
        _ => None,
    }
}

/// A test or baseline by name.
pub(crate) fn test_by_name(name: &str) -> Option<&'static TestDef> {
    TESTS.iter().chain(BASELINES).find(|t| t.name == name)
}

/// A transport.
#[derive(Debug)]
pub(crate) struct TransportDef {
    /// Its name (`--transport`).
    pub name: &'static str,
    /// Delivery is reliable (bandwidth timed at the sender, up to proof
    /// of delivery) or not (counted at the receiver).
    pub reliable: bool,
    /// Runs over TCP (compared with raw TCP) rather than UDP.
    pub stream: bool,
    /// Why an operation does not exist on it (`None`: it does).
    pub refuses: fn(Op) -> Option<&'static str>,
}

fn rc_refuses(op: Op) -> Option<&'static str> {
    match op {
        Op::WriteRecord => {
            Some("RDMA Write-Record is a datagram operation (UD, RD); RC refuses it")
        }
        Op::Tcp | Op::Udp => Some("not a softrdma operation"),
        _ => None,
    }
}

fn ud_refuses(op: Op) -> Option<&'static str> {
    match op {
        Op::Read => Some("RDMA Read is not an operation of unreliable datagrams (use rc or rd)"),
        Op::Atomic => Some("atomics are not operations of unreliable datagrams (use rc or rd)"),
        Op::Tcp | Op::Udp => Some("not a softrdma operation"),
        _ => None,
    }
}

fn rd_refuses(op: Op) -> Option<&'static str> {
    match op {
        Op::Tcp | Op::Udp => Some("not a softrdma operation"),
        _ => None,
    }
}

/// The transports, in table order.
pub(crate) const TRANSPORTS: &[TransportDef] = &[
    TransportDef {
        name: "rc",
        reliable: true,
        stream: true,
        refuses: rc_refuses,
    },
    TransportDef {
        name: "ud",
        reliable: false,
        stream: false,
        refuses: ud_refuses,
    },
    TransportDef {
        name: "rd",
        reliable: true,
        stream: false,
        refuses: rd_refuses,
    },
    // SoftDC: RC connections made on demand (perf/dc.rs).
    TransportDef {
        name: "dc",
        reliable: true,
        stream: true,
        refuses: rc_refuses,
    },
];

/// A transport by name.
pub(crate) fn transport_by_name(name: &str) -> Option<&'static TransportDef> {
    TRANSPORTS.iter().find(|t| t.name == name)
}

/// The baseline a softrdma test over `tr` is compared with.
pub(crate) fn baseline_for(test: &TestDef, tr: &TransportDef) -> &'static TestDef {
    let name = match (tr.stream, test.kind) {
        (true, Kind::Lat) => "tcp_lat",
        (true, Kind::Bw) => "tcp_bw",
        (false, Kind::Lat) => "udp_lat",
        (false, Kind::Bw) => "udp_bw",
    };
    test_by_name(name).expect("baseline in the table")
}

/// The path MTU datagram QPs use (`SOFTRDMA_DGRAM_MTU`, default 1500).
pub(crate) fn dgram_mtu() -> usize {
    std::env::var("SOFTRDMA_DGRAM_MTU")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500)
}

/// Message octets per datagram softrdma carries for `op` over `tr` at
/// `mtu`: the MTU less IPv4 + UDP (28), the DDP header with the datagram
/// extension and destination QPN (tagged 26, untagged 30), the RD shim
/// (26, RD only) and the CRC (4). The UDP baselines cut messages into
/// datagrams of this payload.
pub(crate) fn dgram_payload(tr: &str, op: Op, mtu: usize) -> usize {
    let hdr = match op {
        Op::Send => 30,
        _ => 26,
    };
    let shim = if tr == "rd" { 26 } else { 0 };
    mtu.saturating_sub(28 + hdr + shim + 4).max(64)
}

/// How both ends wait for the next event (design.md §2: a comparison is
/// fair only when softrdma and its baseline wait the same way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitMode {
    /// Spin: `poll_cq` in a loop, non-blocking sockets.
    Poll,
    /// Sleep: completion channel events, blocking sockets.
    Event,
}

impl WaitMode {
    /// `poll` or `event`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            WaitMode::Poll => "poll",
            WaitMode::Event => "event",
        }
    }

    /// Parses `poll`/`busy` or `event`.
    pub(crate) fn parse(s: &str) -> Option<WaitMode> {
        match s {
            "poll" | "busy" | "busy-poll" => Some(WaitMode::Poll),
            "event" | "events" | "block" => Some(WaitMode::Event),
            _ => None,
        }
    }
}

/// The parameters of one cell.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    /// The test (softrdma or baseline).
    pub test: &'static TestDef,
    /// Transport name (`rc`, `ud`, `rd`; `tcp`/`udp` for baselines).
    pub transport: String,
    /// Message size, octets.
    pub size: usize,
    /// Measured iterations; 0: run for `duration` instead.
    pub iters: u64,
    /// Seconds to run when `iters` is 0.
    pub duration: f64,
    /// Unmeasured ping-pong round trips first (latency tests).
    pub warmup: u64,
    /// Fill and check every byte.
    pub verify: bool,
    /// How both ends wait.
    pub wait: WaitMode,
    /// Outstanding messages of a bandwidth test.
    pub window: usize,
    /// Datagram payload of the UDP baselines (message octets per datagram).
    pub payload: usize,
}

impl Spec {
    /// The control message announcing this cell.
    pub(crate) fn to_msg(&self) -> Msg {
        Msg::new("CELL")
            .with("test", self.test.name)
            .with("transport", &self.transport)
            .with("size", self.size)
            .with("iters", self.iters)
            .with("duration", self.duration)
            .with("warmup", self.warmup)
            .with("verify", self.verify as u8)
            .with("wait", self.wait.name())
            .with("window", self.window)
            .with("payload", self.payload)
    }

    /// Parses [`Spec::to_msg`].
    pub(crate) fn from_msg(m: &Msg) -> io::Result<Spec> {
        let bad = |w: String| io::Error::new(io::ErrorKind::InvalidData, w);
        let name = m.get("test").unwrap_or("");
        let test = test_by_name(name).ok_or_else(|| bad(format!("unknown test {name:?}")))?;
        let wait = m.get("wait").unwrap_or("");
        let s = Spec {
            test,
            transport: m.get("transport").unwrap_or("").to_string(),
            size: m.num("size")?,
            iters: m.num("iters")?,
            duration: m.num("duration")?,
            warmup: m.num("warmup")?,
            verify: m.num::<u8>("verify")? != 0,
            wait: WaitMode::parse(wait).ok_or_else(|| bad(format!("unknown wait {wait:?}")))?,
            window: m.num("window")?,
            payload: m.num("payload")?,
        };
        if s.size == 0 || s.size > MAX_SIZE || s.window == 0 || s.window > 1024 {
            return Err(bad(format!(
                "cell out of range: size {} (1..={MAX_SIZE}), window {} (1..=1024)",
                s.size, s.window
            )));
        }
        Ok(s)
    }

    /// True while a run that started at `t0` with `done` measured
    /// iterations should go on.
    #[inline]
    pub(crate) fn more(&self, done: u64, t0: Instant) -> bool {
        if self.iters > 0 {
            done < self.iters
        } else {
            done < MIN_SAMPLES || t0.elapsed().as_secs_f64() < self.duration
        }
    }

    /// A result skeleton for this cell.
    pub(crate) fn result(&self) -> PerfResult {
        let mut r = PerfResult::new(
            self.test.name,
            &self.transport,
            self.size as u64,
            self.wait.name(),
        );
        // The baselines carry no pattern: only softrdma cells are checked.
        r.verified = self.verify && !matches!(self.test.op, Op::Tcp | Op::Udp);
        r
    }
}

/// A run for a duration measures at least this many iterations.
pub(crate) const MIN_SAMPLES: u64 = 10;

/// Largest message size a cell takes (16 MiB, the datagram limit).
pub(crate) const MAX_SIZE: usize = 16 << 20;

/// A hang detector for spin and wait loops: fails when `timeout` passes
/// without [`Watch::progress`]. The clock is read only every 256 checks.
#[derive(Debug)]
pub(crate) struct Watch {
    timeout: Duration,
    deadline: Option<Instant>,
    spins: u32,
}

/// Default: 10 s without progress is a hang.
pub(crate) const HANG: Duration = Duration::from_secs(10);

impl Watch {
    /// A watch failing after `timeout` without progress.
    pub(crate) fn new(timeout: Duration) -> Watch {
        Watch {
            timeout,
            deadline: None,
            spins: 0,
        }
    }

    /// Something happened.
    #[inline]
    pub(crate) fn progress(&mut self) {
        self.deadline = None;
    }

    /// Nothing happened this time; an error after `timeout` of that.
    #[inline]
    pub(crate) fn check(&mut self, what: &str) -> io::Result<()> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins & 255 == 0 {
            let now = Instant::now();
            match self.deadline {
                None => self.deadline = Some(now + self.timeout),
                Some(d) if now > d => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no progress for {:?} waiting for {what}", self.timeout),
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// The `--verify` pattern: octets 0..8 carry `seq` (little endian) when
/// the message has room, the rest a function of (seq, side, offset).
pub(crate) fn fill(buf: &mut [u8], seq: u64, side: u8) {
    let h = buf.len().min(8);
    buf[..h].copy_from_slice(&seq.to_le_bytes()[..h]);
    for (j, b) in buf.iter_mut().enumerate().skip(8) {
        *b = pattern_byte(seq, side, j);
    }
}

#[inline]
fn pattern_byte(seq: u64, side: u8, j: usize) -> u8 {
    (seq.wrapping_mul(31) as usize)
        .wrapping_add(j.wrapping_mul(7))
        .wrapping_add((j >> 8).wrapping_mul(3))
        .wrapping_add(side as usize * 101) as u8
}

/// The seq a filled message carries (0 for messages under 8 octets).
pub(crate) fn seq_of(buf: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let h = buf.len().min(8);
    b[..h].copy_from_slice(&buf[..h]);
    if buf.len() < 8 {
        0
    } else {
        u64::from_le_bytes(b)
    }
}

/// Checks `buf` against the pattern of (`seq`, `side`); `skip_last`
/// leaves the last octet out (the write ping-pong's tag). The error names
/// the first wrong octet. `SOFTRDMA_PERF_CORRUPT=1` (a test hook) flips
/// an octet first, to prove the check catches it.
pub(crate) fn check(buf: &mut [u8], seq: u64, side: u8, skip_last: bool) -> io::Result<()> {
    if corrupt_hook() && !buf.is_empty() {
        let j = buf.len() / 2;
        buf[j] ^= 0x40;
    }
    let end = if skip_last {
        buf.len().saturating_sub(1)
    } else {
        buf.len()
    };
    let h = buf.len().min(8);
    let want = seq.to_le_bytes();
    for j in 0..end {
        let w = if j < h {
            want[j]
        } else {
            pattern_byte(seq, side, j)
        };
        if buf[j] != w {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "verify: message {seq} octet {j} of {} is {:#04x}, expected {w:#04x}",
                    buf.len(),
                    buf[j]
                ),
            ));
        }
    }
    Ok(())
}

fn corrupt_hook() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SOFTRDMA_PERF_CORRUPT").is_ok_and(|v| v == "1"))
}

/// What a client-side runner measured.
#[derive(Debug, Default)]
pub(crate) struct Measured {
    /// One-way latency samples (latency tests).
    pub hist: Option<super::hist::Histogram>,
    /// Message octets delivered (bandwidth tests).
    pub octets: u64,
    /// Messages delivered.
    pub msgs: u64,
    /// Seconds the octets took.
    pub secs: f64,
    /// Messages lost.
    pub lost: u64,
    /// DC: the first message's latency, µs (see `PerfResult::first_msg_us`).
    pub first_msg_us: Option<f64>,
    /// Framed TCP baselines: FPDUs per message.
    pub fpdus_per_msg: Option<u64>,
    /// Raw UDP baselines: message octets per datagram.
    pub dgram_payload: Option<u64>,
    /// How it was counted.
    pub note: String,
    /// MPA CRC in effect (RC).
    pub crc: Option<bool>,
    /// The congestion control the measured TCP socket ran (raw TCP
    /// baselines, read from the socket).
    pub tcp_cc: Option<String>,
}

impl Measured {
    /// Adds another round of the same cell.
    pub(crate) fn merge(&mut self, o: Measured) {
        match (&mut self.hist, o.hist) {
            (Some(h), Some(g)) => h.merge(&g),
            (h @ None, g) => *h = g,
            (Some(_), None) => {}
        }
        self.octets += o.octets;
        self.msgs += o.msgs;
        self.secs += o.secs;
        self.lost += o.lost;
        self.first_msg_us = self.first_msg_us.or(o.first_msg_us);
        self.fpdus_per_msg = self.fpdus_per_msg.or(o.fpdus_per_msg);
        self.dgram_payload = self.dgram_payload.or(o.dgram_payload);
        if self.note.is_empty() {
            self.note = o.note;
        }
        self.crc = self.crc.or(o.crc);
        self.tcp_cc = self.tcp_cc.take().or(o.tcp_cc);
    }

    /// The cell's result.
    pub(crate) fn into_result(self, spec: &Spec) -> PerfResult {
        let mut r = spec.result();
        match &self.hist {
            Some(h) if h.count() == 0 => r.error = Some("no round trip was measured".into()),
            Some(h) => r.set_latency(h),
            None if self.msgs == 0 || self.secs <= 0.0 => {
                r.error = Some("nothing was measured (no message, or no time)".into())
            }
            None => r.set_bandwidth(self.octets, self.msgs, self.secs),
        }
        r.lost = self.lost;
        r.first_msg_us = self.first_msg_us;
        r.fpdus_per_msg = self.fpdus_per_msg;
        r.dgram_payload = self.dgram_payload;
        r.note = self.note;
        r.crc = self.crc;
        if self.tcp_cc.is_some() {
            r.tcp_cc = self.tcp_cc;
        }
        r
    }
}

/// The server side of a session: answers `CELL`s until `BYE` or the
/// control connection closes. A failed cell is reported to the client
/// (`ERR`) and the session goes on when the control channel still works.
pub(crate) fn serve_session(ctrl: &mut Ctrl) -> io::Result<()> {
    loop {
        ctrl.set_timeout(Duration::from_secs(600));
        let m = match ctrl.recv() {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        ctrl.set_timeout(super::ctrl::DEFAULT_TIMEOUT);
        match m.kind.as_str() {
            "BYE" => return Ok(()),
            "CELL" => {
                let r = Spec::from_msg(&m).and_then(|spec| match spec.test.op {
                    Op::Tcp | Op::Udp => baseline::serve(&spec, ctrl),
                    _ => rdma::serve(&spec, ctrl),
                });
                if let Err(e) = r {
                    eprintln!("softrdma perf server: {e}");
                    ctrl.send_err(&e.to_string());
                    // Let the client read the ERR before anything else.
                    if matches!(
                        e.kind(),
                        io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe
                    ) {
                        return Err(e);
                    }
                }
            }
            "ABORT" => ctrl.send_err(super::ctrl::ABORTED),
            other => {
                ctrl.send_err(&format!("unexpected control message {other}"));
            }
        }
    }
}

/// The client side of one cell: runs it against the server and returns
/// its result (failed cells carry the reason).
pub(crate) fn run_cell(ctrl: &mut Ctrl, spec: &Spec) -> PerfResult {
    match measure(ctrl, spec) {
        Ok(m) => m.into_result(spec),
        Err(why) => {
            let mut r = spec.result();
            r.error = Some(why);
            r
        }
    }
}

/// The client side of one cell, unprocessed; on failure the session is
/// resynchronised and the reason (ours and the peer's) returned.
pub(crate) fn measure(ctrl: &mut Ctrl, spec: &Spec) -> Result<Measured, String> {
    let res = (|| {
        ctrl.send(&spec.to_msg())?;
        match spec.test.op {
            Op::Tcp | Op::Udp => baseline::run(spec, ctrl),
            _ => rdma::run(spec, ctrl),
        }
    })();
    res.map_err(|e| {
        let mut why = e.to_string();
        match ctrl.resync() {
            None => why.push_str(" (control session lost)"),
            Some(p) if !p.is_empty() && !why.contains(&p) => {
                why = format!("{why} ({p})");
            }
            Some(_) => {}
        }
        why
    })
}

/// Runs `a` and `b` alternately for `rounds` rounds (each round with
/// `1/rounds` of the iterations or duration), so that a burst of load
/// from elsewhere hits both alike; returns their merged results.
pub(crate) fn run_interleaved(
    ctrl: &mut Ctrl,
    a: &Spec,
    b: &Spec,
    rounds: u32,
) -> (PerfResult, PerfResult) {
    let rounds = rounds.max(1);
    let part = |s: &Spec| {
        let mut p = s.clone();
        if p.iters > 0 {
            p.iters = p.iters.div_ceil(rounds as u64);
        } else {
            p.duration /= rounds as f64;
        }
        p
    };
    let (pa, pb) = (part(a), part(b));
    let mut ma: Result<Measured, String> = Ok(Measured::default());
    let mut mb: Result<Measured, String> = Ok(Measured::default());
    for _ in 0..rounds {
        for (m, spec) in [(&mut ma, &pa), (&mut mb, &pb)] {
            if let Ok(acc) = m {
                match measure(ctrl, spec) {
                    Ok(x) => acc.merge(x),
                    Err(e) => *m = Err(e),
                }
            }
        }
    }
    let done = |m: Result<Measured, String>, spec: &Spec| match m {
        Ok(m) => m.into_result(spec),
        Err(why) => {
            let mut r = spec.result();
            r.error = Some(why);
            r
        }
    };
    (done(ma, a), done(mb, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_checks_and_catches() {
        for len in [1usize, 7, 8, 9, 64, 4096] {
            let mut b = vec![0u8; len];
            fill(&mut b, 77, 1);
            check(&mut b.clone(), 77, 1, false).unwrap();
            if len >= 8 {
                assert_eq!(seq_of(&b), 77);
            }
            let mut c = b.clone();
            c[len - 1] ^= 1;
            assert!(check(&mut c.clone(), 77, 1, false).is_err());
            check(&mut c, 77, 1, true).unwrap();
            assert!(check(&mut b.clone(), 77, 2, false).is_err() || len < 9);
        }
    }

    #[test]
    fn tables_are_consistent() {
        for t in TESTS {
            assert_eq!(test_by_name(t.name), Some(t));
        }
        let rc = transport_by_name("rc").unwrap();
        let ud = transport_by_name("ud").unwrap();
        assert!((ud.refuses)(Op::Read).is_some());
        assert!((ud.refuses)(Op::WriteRecord).is_none());
        assert!((rc.refuses)(Op::WriteRecord).is_some());
        assert_eq!(baseline_for(&TESTS[0], rc).name, "tcp_lat");
        assert_eq!(baseline_for(&TESTS[7], ud).name, "udp_bw");
        assert_eq!(dgram_payload("ud", Op::WriteRecord, 1500), 1442);
        assert_eq!(dgram_payload("ud", Op::Send, 1500), 1438);
        assert_eq!(dgram_payload("rd", Op::WriteRecord, 1500), 1416);
    }
}
