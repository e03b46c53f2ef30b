//! Wireshark as the outside judge of the engine on a real TCP connection: a
//! live `tshark -i lo` capture of RC traffic between two engine contexts in
//! this process, judged with `softrdma_sim::tshark`'s base options.
//!
//! The traffic, on one connection (MPA Request/Reply with private data):
//!
//! 1. *Stepwise*: a 300-octet Send, a 700-octet RDMA Write, a 700-octet RDMA
//!    Read of it and a zero-length Send, each posted only once the previous
//!    one has been consumed, so that every FPDU travels alone in its TCP
//!    segment.
//! 2. *Bulk*, posted back to back: a 5000-octet Send, a 100 KiB RDMA Write
//!    (several FPDUs), an 80 KiB RDMA Read (several Read Response FPDUs) and
//!    a zero-length Send.
//!
//! What tshark must show: the MPA Request and Reply with C (and M) set and
//! our private data; a "Good CRC32" for every FPDU it found and no "Bad
//! CRC32" (one TCP segment may hold several FPDUs, so FPDUs are counted
//! from the per-FPDU fields, not from frames); nothing malformed; no expert
//! error; no Warn-level expert item except the two that MPA v2 always
//! raises (tshark checks MPA against revision 1) and TCP's own (window full, a retransmission:
//! the machine's business), but none saying a segment is missing from the
//! capture; the stepwise FPDUs in order (the peer-to-peer RTR, Send 0x03,
//! RDMA Write 0x00, Read Request 0x01, Read Response 0x02, Send 0x03) with
//! their exact lengths; and, with CRC only, every payload octet of the bulk
//! part accounted for.
//!
//! # Markers
//!
//! The second test negotiates markers in both directions. tshark 4.0's MPA
//! dissector handles markers only when a TCP segment holds exactly one whole
//! FPDU: it places the markers, sizes the FPDU and checks the ULPDU_Length
//! from the segment's own sequence numbers (`fpdu_total_length()` is
//! `nxtseq - seq`; a segment whose ULPDU_Length does not match is
//! skipped). Two things defeat that on a live connection, both seen in
//! captures of this test on loopback:
//!
//! * The kernel, not our `writev` calls, decides where segments begin. Once
//!   the receive window fills, queued data is coalesced and re-cut: one
//!   53760-octet segment carried a whole 32768-octet FPDU and the head of
//!   the next, the following segment the rest of it and two more FPDUs.
//!   That depends on timing, and a smaller `max_fpdu` does not prevent it.
//! * tshark 4.0.17 counts one marker too many when an FPDU starts on a
//!   marker position and its length is a multiple of 512:
//!   `number_of_markers()` is `(len - first) / 512 + 1`, which counts the
//!   marker at the very end of the segment, although that one belongs to
//!   the next FPDU (RFC 5044; tshark itself places it there when it
//!   decodes the next FPDU). A full FPDU at a 32 KiB EMSS (loopback's, before
//!   FPDUs there were sized from its path MTU) is 32768
//!   octets (64 markers, ULPDU_Length 32506); when such an FPDU opened the
//!   server's direction (a Read Response before any other server FPDU),
//!   tshark wanted 65 markers, took the FPDU for 4 octets longer than it
//!   is, and its TCP reassembly then also swallowed the FPDU after it. Our
//!   framing was right: the next segment began with the marker, FPDUPTR 0.
//!   In a hand-made capture (a 1024-octet FPDU on a marker position, then a
//!   68-octet one, each in its own segment) tshark even reports a "Bad
//!   CRC32" for the second, correct FPDU: its reassembly took that FPDU's
//!   leading marker. With this test's message sizes no FPDU starts on a
//!   marker position with a length that is a multiple of 512, at any EMSS
//!   but 1436 to 1439 octets (checked by replaying our framing arithmetic
//!   for EMSS 1000 to 65535); keep it so when changing the sizes.
//!
//! In the captures of this test such segments show as plain TCP data (no
//! FPDU, no CRC verdict), never as bad or malformed. So with markers the stepwise FPDUs (small, alone in
//! their segments, none of them a multiple of 512 octets) are checked as
//! strictly as without, plus the marker back pointers tshark shows in both
//! directions, and for the bulk part only what is reliable: every FPDU
//! tshark does decode has a Good CRC32, nothing is bad or malformed, and it
//! decodes no more payload than was sent. The bulk payload is made of octets
//! 0xfe and 0xff only, so no two payload octets read as an ULPDU_Length that
//! a segment of at most 64 KiB could match (that would be a "Bad CRC32"
//! tshark invented, not one we sent).
//!
//! # Capture timing
//!
//! No sleeps decide when the capture is live or complete: the capture
//! filter also takes a probe port, and the test opens probe TCP connections
//! to it until one of their SYNs shows up in the file dumpcap is writing
//! (it flushes about every 100 ms). One probe before connecting proves the
//! capture is running; one after the exchange is a barrier: everything the
//! exchange sent was on the wire before it (the last completions are only
//! seen once the peer has received everything), so once the probe is in
//! the file, so is the exchange. The probe connections are cut out of the
//! capture before it is judged.
//!
//! # Datagrams
//!
//! `live_capture_datagrams` captures softrdma's iWARP over UDP on `lo`
//! between two engine contexts and judges it with the project's dissector
//! (`tools/wireshark/softrdma_dgram.lua`): UD Sends (multi-segment, with
//! immediate) and a UD Write-Record; RD Sends (with immediate), an RDMA
//! Write, a Write-Record, an RDMA Read and a fetch-and-add, through a
//! relay that drops the first copy of two data datagrams so the capture
//! holds RD retransmissions (and the NAKs they cause), besides ACK-only
//! datagrams. Every UDP datagram captured must be `srdma` with a good
//! CRC32C, no expert error and nothing malformed; every opcode sent shows
//! up; a copy of the capture with one flipped payload bit gives exactly
//! one bad-CRC error. GSO is off in these contexts so that each captured
//! frame is one datagram.
//!
//! Needs tshark and the right to capture on `lo` (root or CAP_NET_RAW).
//! `SOFTRDMA_PCAP_DIR=dir` keeps the captures for a look by hand.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::cm::{self, ConnParams, Listener};
use softrdma_engine::config::Config;
use softrdma_engine::{Completion, Context, Cq, DgramQpHandle, Qp, QpCaps, RdOptions, UdOptions};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{
    DgramAddr, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
    WorkCompletion,
};
use softrdma_sim::pcap::{decode_frame, PcapFile, PcapWriter, TcpFlags, Transport};
use softrdma_sim::tshark::Tshark;

// The message sizes decide where each FPDU starts relative to the markers;
// see the module comment before changing them.

/// Stepwise Send.
const STEP_SEND_LEN: usize = 300;
/// Stepwise RDMA Write, read back by the stepwise RDMA Read.
const STEP_RDMA_LEN: usize = 700;
/// Bulk Send.
const SEND_LEN: usize = 5000;
/// Bulk RDMA Write: several FPDUs even at the 64 KiB loopback MSS.
const WRITE_LEN: usize = 100 << 10;
/// Bulk RDMA Read: several Read Response FPDUs.
const READ_LEN: usize = 80 << 10;
/// Where the Writes land in the server's buffer (Sends land at 0).
const WRITE_AT: usize = 8192;
/// Where the Reads land in the client's buffer (the Writes come from 0).
const SINK_AT: usize = WRITE_LEN;

const CLIENT_PD: &[u8] = b"softrdma live capture: client";
const SERVER_PD: &[u8] = b"softrdma live capture: server";

/// Upper bound of one capture (`-a duration:`); the test stops it earlier.
const CAPTURE_SECONDS: u32 = 180;
/// How long to wait for the capture to start or to catch up.
const CAPTURE_WAIT: Duration = Duration::from_secs(60);

/// `ulpdu_length` of an untagged (Send, Read Request) and of a tagged
/// (Write, Read Response) DDP segment without payload.
const UNTAGGED_HDR: usize = 18;
const TAGGED_HDR: usize = 14;
/// A Read Request's RDMAP header after the DDP header.
const READ_REQ_BODY: usize = 28;

/// The Warn-level expert items MPA v2 always raises:
/// tshark checks only for RFC 5044 rev 1.
const MPA_V2_WARNINGS: [&str; 2] = [
    "Res field is NOT set to zero",
    "Rev field is NOT set to one",
];

// ---------------------------------------------------------------------------
// The live capture
// ---------------------------------------------------------------------------

/// A running `tshark -i lo` writing a classic pcap file.
struct LiveCapture {
    child: Option<Child>,
    path: PathBuf,
    stderr: Arc<Mutex<String>>,
    probe: TcpListener,
}

impl LiveCapture {
    /// Starts capturing `tcp port port` (and the probe port) into `path`,
    /// and returns once a probe connection has been seen in the file.
    fn start(ts: &Tshark, port: u16, path: PathBuf) -> LiveCapture {
        LiveCapture::start_filter(ts, &format!("tcp port {port}"), path)
    }

    /// Starts capturing what the capture filter `filter` takes (and the
    /// probe port) into `path`, and returns once a probe connection has
    /// been seen in the file.
    fn start_filter(ts: &Tshark, filter: &str, path: PathBuf) -> LiveCapture {
        let _ = std::fs::remove_file(&path);
        let probe = TcpListener::bind("127.0.0.1:0").expect("bind probe listener");
        let probe_port = probe.local_addr().unwrap().port();
        let filter = format!("({filter}) or tcp port {probe_port}");
        let duration = format!("duration:{CAPTURE_SECONDS}");
        let mut child = Command::new(ts.program())
            .args([
                "-n", "-i", "lo", "-f", &filter, "-F", "pcap", "-a", &duration,
            ])
            .arg("-w")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", ts.program().display()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr is piped");
        let sink = stderr.clone();
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut cap = LiveCapture {
            child: Some(child),
            path,
            stderr,
            probe,
        };
        cap.barrier("start");
        cap
    }

    fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Opens probe connections until one of them is in the capture file.
    fn barrier(&mut self, what: &str) {
        let probe_addr = self.probe.local_addr().unwrap();
        let deadline = Instant::now() + CAPTURE_WAIT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "tshark exited ({status}) before the capture was {what}; live capture on \
                     `lo` needs root or CAP_NET_RAW. stderr:\n{}",
                    self.stderr()
                );
            }
            let conn = TcpStream::connect(probe_addr).expect("probe connection");
            let local = conn.local_addr().unwrap().port();
            // Take it off the backlog so the listener never fills up.
            let _ = self.probe.accept();
            drop(conn);
            // dumpcap flushes its file about every 100 ms; give this probe
            // a few of those before opening the next one.
            let until = Instant::now() + Duration::from_millis(600);
            while Instant::now() < until {
                if syn_seen(&self.path, local, probe_addr.port()) {
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
            assert!(
                Instant::now() < deadline,
                "capture {what}: no probe seen in {} within {CAPTURE_WAIT:?}; tshark stderr:\n{}",
                self.path.display(),
                self.stderr()
            );
        }
    }

    /// Waits until everything sent so far is in the file, then stops tshark
    /// (SIGINT, so dumpcap closes the file cleanly) and returns the path.
    fn stop(mut self) -> PathBuf {
        self.barrier("complete");
        let mut child = self.child.take().expect("running");
        // SAFETY: kill(2) with a process id we spawned and still own (not yet
        // waited for, so the id cannot have been reused).
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
        self.path.clone()
    }
}

impl Drop for LiveCapture {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether the (possibly still growing) pcap file at `path` holds the SYN
/// of a connection from port `sport` to port `dport`.
fn syn_seen(path: &Path, sport: u16, dport: u16) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    let Ok(file) = PcapFile::parse(complete_records(&bytes)) else {
        return false;
    };
    file.records.iter().any(|r| {
        matches!(
            decode_frame(&r.data).map(|p| p.transport),
            Some(Transport::Tcp { src_port, dst_port, flags, .. })
                if src_port == sport && dst_port == dport && flags.contains(TcpFlags::SYN)
        )
    })
}

/// The prefix of a classic pcap file (native byte order, as dumpcap writes
/// it) that ends with a complete record: the writer may be mid-record.
fn complete_records(bytes: &[u8]) -> &[u8] {
    let mut off = 24;
    if bytes.len() < off {
        return bytes;
    }
    while bytes.len() >= off + 16 {
        let incl = u32::from_ne_bytes(bytes[off + 8..off + 12].try_into().unwrap()) as usize;
        if bytes.len() < off + 16 + incl {
            break;
        }
        off += 16 + incl;
    }
    &bytes[..off]
}

// ---------------------------------------------------------------------------
// The exchange
// ---------------------------------------------------------------------------

fn wait_one(cq: &Cq) -> Completion {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = [Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }];
    loop {
        if cq.poll(&mut out) == 1 {
            return out[0];
        }
        assert!(Instant::now() < deadline, "no completion within 30 s");
        thread::yield_now();
    }
}

struct Side {
    ctx: Context,
    cq: Arc<Cq>,
    qp: Qp,
    buf: Vec<u8>,
    stag: u32,
}

impl Side {
    fn new(cfg: Config, len: usize) -> Side {
        let ctx = Context::with_config(cfg).unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(64, None);
        let qp = ctx.create_qp(1, pd, QpCaps::default(), cq.clone(), cq.clone());
        let mut buf = vec![0u8; len];
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        // SAFETY: `buf` lives in the returned Side and is neither moved nor
        // resized while the context exists (both are dropped together at the
        // end of the test).
        let stag = unsafe {
            ctx.registry()
                .register(buf.as_mut_ptr(), len, buf.as_ptr() as u64, access, pd)
        }
        .unwrap();
        Side {
            ctx,
            cq,
            qp,
            buf,
            stag,
        }
    }

    fn addr(&self, offset: usize) -> u64 {
        self.buf.as_ptr() as u64 + offset as u64
    }

    fn sgl(&self, offset: usize, len: usize) -> Payload {
        if len == 0 {
            Payload::Sgl(SgList::new())
        } else {
            Payload::Sgl(SgList::single(self.addr(offset), len as u32, self.stag))
        }
    }

    /// Posts a signaled send work request.
    fn post(&self, wr_id: u64, op: SendOp, payload: Payload) {
        let flags = SendFlags {
            signaled: true,
            ..Default::default()
        };
        self.qp
            .post_send(SendWr {
                wr_id,
                op,
                payload,
                flags,
            })
            .unwrap();
    }

    /// Waits for the next completion and checks it.
    fn expect(&self, wr_id: u64, opcode: WcOpcode, len: Option<u32>) {
        let c = wait_one(&self.cq);
        assert_eq!(
            (c.wc.wr_id, c.wc.status, c.wc.opcode),
            (wr_id, WcStatus::Success, opcode),
            "completion"
        );
        if let Some(len) = len {
            assert_eq!(c.wc.byte_len, len, "byte_len of wr {wr_id}");
        }
    }
}

const SEND: SendOp = SendOp::Send {
    imm: None,
    invalidate: None,
};

fn write_op(server: &Side) -> SendOp {
    SendOp::Write {
        remote_addr: server.addr(WRITE_AT),
        rkey: server.stag,
        imm: None,
    }
}

fn read_op(server: &Side) -> SendOp {
    SendOp::Read {
        remote_addr: server.addr(WRITE_AT),
        rkey: server.stag,
    }
}

/// Payload octets: 0xfe and 0xff only (see the module comment), in a
/// pattern that never repeats with a short period (Thue-Morse).
fn pattern(i: usize) -> u8 {
    0xfe | (i.count_ones() & 1) as u8
}

/// Connects `client` to `server` through `listener`, runs the stepwise and
/// the bulk part, and checks every completion and the data moved.
fn exchange(server: &mut Side, client: &mut Side, listener: Listener, addr: SocketAddr) {
    for (i, b) in client.buf[..SINK_AT].iter_mut().enumerate() {
        *b = pattern(i);
    }
    // Receives for the two stepwise and the two bulk Sends.
    for wr_id in 1..=4 {
        server
            .qp
            .post_recv(RecvWr {
                wr_id,
                sgl: SgList::single(server.addr(0), SEND_LEN as u32, server.stag),
            })
            .unwrap();
    }
    let sqp = server.qp.clone();
    let acceptor = thread::spawn(move || {
        let inc = listener.accept().unwrap();
        assert_eq!(inc.private_data(), CLIENT_PD);
        inc.accept(
            &sqp,
            &ConnParams {
                private_data: SERVER_PD.to_vec(),
                ..Default::default()
            },
        )
        .unwrap();
    });
    let peer_pd = cm::connect(
        &client.ctx,
        &client.qp,
        addr,
        &ConnParams {
            private_data: CLIENT_PD.to_vec(),
            ..Default::default()
        },
    )
    .unwrap();
    acceptor.join().unwrap();
    assert_eq!(peer_pd, SERVER_PD);

    // Stepwise: each FPDU is written by itself into an idle connection.
    client.post(10, SEND, client.sgl(0, STEP_SEND_LEN));
    client.expect(10, WcOpcode::Send, None);
    server.expect(1, WcOpcode::Recv, Some(STEP_SEND_LEN as u32));
    assert!(server.buf[..STEP_SEND_LEN] == client.buf[..STEP_SEND_LEN]);
    client.post(11, write_op(server), client.sgl(0, STEP_RDMA_LEN));
    client.expect(11, WcOpcode::RdmaWrite, None);
    client.post(12, read_op(server), client.sgl(SINK_AT, STEP_RDMA_LEN));
    client.expect(12, WcOpcode::RdmaRead, None);
    assert!(client.buf[SINK_AT..SINK_AT + STEP_RDMA_LEN] == client.buf[..STEP_RDMA_LEN]);
    client.post(13, SEND, client.sgl(0, 0));
    client.expect(13, WcOpcode::Send, None);
    server.expect(2, WcOpcode::Recv, Some(0));

    // Bulk: everything at once.
    client.buf[SINK_AT..].fill(0);
    client.post(20, SEND, client.sgl(0, SEND_LEN));
    client.post(21, write_op(server), client.sgl(0, WRITE_LEN));
    client.post(22, read_op(server), client.sgl(SINK_AT, READ_LEN));
    client.post(23, SEND, client.sgl(0, 0));
    client.expect(20, WcOpcode::Send, None);
    client.expect(21, WcOpcode::RdmaWrite, None);
    client.expect(22, WcOpcode::RdmaRead, None);
    client.expect(23, WcOpcode::Send, None);
    server.expect(3, WcOpcode::Recv, Some(SEND_LEN as u32));
    server.expect(4, WcOpcode::Recv, Some(0));
    assert!(
        server.buf[..SEND_LEN] == client.buf[..SEND_LEN],
        "Send data"
    );
    assert!(
        server.buf[WRITE_AT..WRITE_AT + WRITE_LEN] == client.buf[..WRITE_LEN],
        "Write data"
    );
    assert!(
        client.buf[SINK_AT..SINK_AT + READ_LEN] == client.buf[..READ_LEN],
        "Read data"
    );
}

// ---------------------------------------------------------------------------
// The verdict
// ---------------------------------------------------------------------------

/// One FPDU as tshark decoded it.
#[derive(Debug)]
struct Fpdu {
    frame: u64,
    from_client: bool,
    opcode: String,
    ulpdu_len: usize,
    /// Marker back pointers of the frame (meaningful when the frame holds
    /// this FPDU only, as with markers it always does).
    markers: Vec<u16>,
}

impl Fpdu {
    /// Payload octets, for the four opcodes of this test.
    fn payload(&self) -> usize {
        let hdr = match self.opcode.as_str() {
            "0x00" | "0x02" => TAGGED_HDR,
            "0x01" => UNTAGGED_HDR + READ_REQ_BODY,
            _ => UNTAGGED_HDR,
        };
        assert!(
            self.ulpdu_len >= hdr,
            "FPDU shorter than its headers: {self:?}"
        );
        self.ulpdu_len - hdr
    }
}

fn split(cell: &str) -> Vec<&str> {
    if cell.is_empty() {
        Vec::new()
    } else {
        cell.split('|').collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// Runs the exchange under a live capture and judges the capture.
fn live_session(name: &str, markers: bool) {
    let Some(ts) = Tshark::for_test(name) else {
        return;
    };
    let cfg = Config {
        mpa_crc: true,
        mpa_markers: markers,
        ..Config::default()
    };
    let mut server = Side::new(cfg.clone(), WRITE_AT + WRITE_LEN);
    let mut client = Side::new(cfg, SINK_AT + READ_LEN);
    let listener = Listener::bind(&server.ctx, "127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let port = addr.port();

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let raw = dir.join(format!("{name}-{}-raw.pcap", std::process::id()));
    let pcap = dir.join(format!("{name}-{}.pcap", std::process::id()));
    let capture = LiveCapture::start(&ts, port, raw);
    exchange(&mut server, &mut client, listener, addr);
    let raw = capture.stop();

    // Only the engine's connection: the probes go.
    let filter = format!("tcp.port == {port}");
    ts.run_raw(&[
        "-n",
        "-r",
        path_str(&raw),
        "-Y",
        &filter,
        "-F",
        "pcap",
        "-w",
        path_str(&pcap),
    ])
    .unwrap();
    let _ = std::fs::remove_file(&raw);
    if let Ok(keep) = std::env::var("SOFTRDMA_PCAP_DIR") {
        std::fs::copy(&pcap, Path::new(&keep).join(format!("{name}.pcap"))).unwrap();
    }
    let summary = ts.summary(&pcap).unwrap();
    let ctx = format!("capture {}:\n{summary}", pcap.display());

    // The MPA Request and Reply, with the flags asked for and our private
    // data (after the MPA v2 IRD/ORD word).
    let mpa = ts
        .fields(
            &pcap,
            "iwarp_mpa.req || iwarp_mpa.rep",
            &[
                "iwarp_mpa.key.req",
                "iwarp_mpa.key.rep",
                "iwarp_mpa.crc_flag",
                "iwarp_mpa.marker_flag",
                "iwarp_mpa.rej_flag",
                "iwarp_mpa.privatedata",
                "tcp.dstport",
            ],
        )
        .unwrap();
    assert_eq!(mpa.len(), 2, "one MPA Request and one Reply; {ctx}");
    let (req, rep) = (&mpa[0], &mpa[1]);
    assert!(
        !req[0].is_empty() && req[1].is_empty() && req[6] == port.to_string(),
        "the first is the Request, to the listener: {req:?}; {ctx}"
    );
    assert!(
        rep[0].is_empty() && !rep[1].is_empty(),
        "the second is the Reply: {rep:?}; {ctx}"
    );
    let yes = ["1", "True"];
    let no = ["0", "False"];
    for (frame, pd) in [(req, CLIENT_PD), (rep, SERVER_PD)] {
        assert!(yes.contains(&frame[2].as_str()), "C flag: {frame:?}");
        let m = if markers { &yes } else { &no };
        assert!(m.contains(&frame[3].as_str()), "M flag: {frame:?}");
        assert!(no.contains(&frame[4].as_str()), "R flag: {frame:?}");
        let shown = frame[5].replace(':', "").to_ascii_lowercase();
        assert!(shown.contains(&hex(pd)), "private data {pd:?} in {frame:?}");
    }

    // Every FPDU tshark found.
    let rows = ts
        .fields(
            &pcap,
            "iwarp_mpa.fpdu",
            &[
                "frame.number",
                "tcp.dstport",
                "iwarp_mpa.crc_check",
                "iwarp_mpa.ulpdulength",
                "iwarp_rdma.opcode",
                "iwarp_mpa.marker_fpduptr",
            ],
        )
        .unwrap();
    let mut fpdus = Vec::new();
    let mut crc_fields = 0;
    for row in &rows {
        let (crc, lens, ops) = (split(&row[2]), split(&row[3]), split(&row[4]));
        assert!(
            crc.len() == lens.len() && lens.len() == ops.len(),
            "frame {}: {} CRCs, {} lengths, {} opcodes; {ctx}",
            row[0],
            crc.len(),
            lens.len(),
            ops.len()
        );
        crc_fields += crc.len();
        let ptrs: Vec<u16> = split(&row[5]).iter().map(|p| p.parse().unwrap()).collect();
        for (len, op) in lens.iter().zip(&ops) {
            fpdus.push(Fpdu {
                frame: row[0].parse().unwrap(),
                from_client: row[1] == port.to_string(),
                opcode: op.to_string(),
                ulpdu_len: len.parse().unwrap(),
                markers: ptrs.clone(),
            });
        }
    }

    // CRC verdicts: all good, one per FPDU.
    let checks = ts.crc_checks(&pcap).unwrap();
    let bad: Vec<_> = checks.iter().filter(|c| !c.good).collect();
    assert!(bad.is_empty(), "Bad CRC32: {bad:#?}; {ctx}");
    assert_eq!(
        checks.len(),
        crc_fields,
        "CRC verdicts vs CRC fields; {ctx}"
    );
    assert_eq!(checks.len(), fpdus.len(), "a Good CRC32 per FPDU; {ctx}");

    // Nothing malformed, no expert errors, only the expected warnings.
    assert_eq!(
        ts.malformed_count(&pcap).unwrap(),
        0,
        "{}",
        ts.verbose(&pcap).unwrap()
    );
    assert_eq!(
        ts.expert_errors(&pcap).unwrap(),
        0,
        "{}",
        ts.expert_error_report(&pcap).unwrap()
    );
    // Warn level and above, as `-z expert` counts them (the MPA items are
    // attached to no tree item, so `_ws.expert` fields miss them): only the
    // MPA v2 ones, and TCP's own. TCP warns about what a busy machine does
    // to a connection (window full, a tail loss probe answered with a
    // D-SACK, ...), which is not ours to judge, but not about segments
    // missing from the capture: the FPDUs would be incomplete.
    let report = ts.run(&pcap, &["-q", "-z", "expert,warn"]).unwrap();
    for line in report.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 4 || cols[0].parse::<u64>().is_err() {
            continue;
        }
        let expected = MPA_V2_WARNINGS.iter().any(|w| line.contains(w))
            || (cols[2] == "TCP" && !line.contains("not captured"));
        assert!(
            expected,
            "unexpected expert item: {line:?}\n{report}\n{ctx}"
        );
    }
    assert!(
        report.contains(MPA_V2_WARNINGS[1]),
        "MPA v2 Request/Reply seen by the expert system:\n{report}\n{ctx}"
    );

    // The stepwise FPDUs come first, in order, each alone in its segment:
    // the peer-to-peer RTR (a zero-length Write), then the four messages.
    let step: [(bool, &str, usize); 6] = [
        (true, "0x00", 0),
        (true, "0x03", STEP_SEND_LEN),
        (true, "0x00", STEP_RDMA_LEN),
        (true, "0x01", 0),
        (false, "0x02", STEP_RDMA_LEN),
        (true, "0x03", 0),
    ];
    assert!(fpdus.len() >= step.len(), "FPDUs found: {fpdus:#?}; {ctx}");
    for (f, (from_client, opcode, payload)) in fpdus.iter().zip(step) {
        assert!(
            f.from_client == from_client && f.opcode == opcode && f.payload() == payload,
            "stepwise FPDU {f:?}: expected {opcode} of {payload} octets from the {}; {ctx}",
            if from_client { "client" } else { "server" }
        );
    }
    let (stepwise, bulk) = fpdus.split_at(step.len());

    let opcodes = ["0x00", "0x01", "0x02", "0x03"];
    for f in bulk {
        assert!(
            opcodes.contains(&f.opcode.as_str()),
            "unexpected opcode in {f:?}; {ctx}"
        );
    }
    let octets = |fs: &[Fpdu], from_client: bool, opcode: &str| -> (usize, usize) {
        fs.iter()
            .filter(|f| f.from_client == from_client && f.opcode == opcode)
            .fold((0, 0), |(n, o), f| (n + 1, o + f.payload()))
    };
    let (sends, send_octets) = octets(bulk, true, "0x03");
    let (writes, write_octets) = octets(bulk, true, "0x00");
    let (read_reqs, _) = octets(bulk, true, "0x01");
    let (read_resps, read_octets) = octets(bulk, false, "0x02");

    if markers {
        // (tshark decodes an FPDU with markers only when it is alone in its
        // segment, so the stepwise ones were.)
        let frames: Vec<u64> = stepwise.iter().map(|f| f.frame).collect();
        assert!(
            frames.windows(2).all(|w| w[0] < w[1]),
            "one stepwise FPDU per frame: {frames:?}; {ctx}"
        );
        // Markers in the stepwise FPDUs, both directions, on 4-octet
        // boundaries.
        for from_client in [true, false] {
            let ptrs: Vec<u16> = stepwise
                .iter()
                .filter(|f| f.from_client == from_client)
                .flat_map(|f| f.markers.iter().copied())
                .collect();
            assert!(
                !ptrs.is_empty() && ptrs.iter().all(|p| p % 4 == 0),
                "marker back pointers from the {}: {ptrs:?}; {ctx}",
                if from_client { "client" } else { "server" }
            );
        }
        // Bulk: whatever tshark could decode (see the module comment) is
        // good (checked above) and within what was sent.
        assert!(read_reqs <= 1, "Read Requests; {ctx}");
        assert!(send_octets <= SEND_LEN && sends <= 2, "Send; {ctx}");
        assert!(write_octets <= WRITE_LEN, "Write; {ctx}");
        assert!(read_octets <= READ_LEN, "Read Response; {ctx}");
        eprintln!(
            "{name}: tshark followed {} of the bulk FPDUs (sends {sends}, writes {writes}, \
             read requests {read_reqs}, read responses {read_resps})",
            bulk.len()
        );
    } else {
        // Every payload octet of the bulk part, in FPDUs tshark decoded.
        assert_eq!((sends, send_octets), (2, SEND_LEN), "bulk Sends; {ctx}");
        assert!(writes >= 2, "a multi-FPDU RDMA Write: {writes}; {ctx}");
        assert_eq!(write_octets, WRITE_LEN, "bulk Write octets; {ctx}");
        assert_eq!(read_reqs, 1, "bulk Read Request; {ctx}");
        assert!(
            read_resps >= 2,
            "multi-FPDU Read Response: {read_resps}; {ctx}"
        );
        assert_eq!(read_octets, READ_LEN, "bulk Read Response octets; {ctx}");
    }

    let _ = std::fs::remove_file(&pcap);
    let _ = (&mut server.buf, &mut client.buf);
}

#[test]
fn live_capture_crc() {
    live_session("live_capture_crc", false);
}

#[test]
fn live_capture_crc_and_markers() {
    live_session("live_capture_crc_and_markers", true);
}

// ---------------------------------------------------------------------------
// Datagrams: UD, RD and Write-Record, judged by the Lua dissector
// ---------------------------------------------------------------------------

/// The repository's dissector.
fn dgram_dissector() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("tools")
        .join("wireshark")
        .join("softrdma_dgram.lua");
    assert!(p.is_file(), "dissector missing: {}", p.display());
    p
}

/// Registered heap memory of a datagram end.
struct DBuf {
    mem: Vec<u8>,
    stag: u32,
}

impl DBuf {
    fn new(ctx: &Context, pd: u32, len: usize) -> DBuf {
        let mut mem: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        // SAFETY: `mem`'s heap block does not move when the Vec does; the
        // DBuf outlives the contexts' use of it (dropped after them at the
        // end of the test).
        let stag = unsafe {
            ctx.registry()
                .register(mem.as_mut_ptr(), len, mem.as_ptr() as u64, access, pd)
        }
        .unwrap();
        DBuf { mem, stag }
    }
    fn addr(&self, off: usize) -> u64 {
        self.mem.as_ptr() as u64 + off as u64
    }
    fn sgl(&self, off: usize, len: usize) -> Payload {
        Payload::Sgl(SgList::single(self.addr(off), len as u32, self.stag))
    }
}

fn signaled(wr_id: u64, op: SendOp, payload: Payload) -> SendWr {
    SendWr {
        wr_id,
        op,
        payload,
        flags: SendFlags {
            signaled: true,
            ..Default::default()
        },
    }
}

/// Collects `n` completions of `cq`, all successful.
fn successes(cq: &Cq, n: usize, what: &str) -> Vec<Completion> {
    (0..n)
        .map(|_| {
            let c = wait_one(cq);
            assert_eq!(c.wc.status, WcStatus::Success, "{what}: {c:?}");
            c
        })
        .collect()
}

/// A UDP relay between an RD QP (`near`) and its peer (`far`): datagrams
/// from `near` to the relay's first socket go to `far` from the second,
/// and back. The first copy of each RD data datagram whose PSN is in
/// `drop_psns` (towards `far`) is dropped, so the sender retransmits it.
struct Relay {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<thread::JoinHandle<usize>>,
    ports: [u16; 2],
}

impl Relay {
    fn start(near: SocketAddr, far: SocketAddr, drop_psns: &'static [u32]) -> Relay {
        use std::net::UdpSocket;
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
        b.set_read_timeout(Some(Duration::from_millis(2))).unwrap();
        let ports = [
            a.local_addr().unwrap().port(),
            b.local_addr().unwrap().port(),
        ];
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (sa, sb, st) = (a, b, stop.clone());
        let thread = thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            let mut dropped = std::collections::HashSet::new();
            while !st.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((n, from)) = sa.recv_from(&mut buf) {
                    let d = &buf[..n];
                    let data = n > 16 && d[0] == 0x52 && d[4] & 0x80 != 0;
                    if from == near && data {
                        let epoch = u32::from_be_bytes(d[8..12].try_into().unwrap());
                        let psn = u32::from_be_bytes(d[12..16].try_into().unwrap());
                        if drop_psns.contains(&psn) && dropped.insert((epoch, psn)) {
                            continue;
                        }
                    }
                    if from == near {
                        let _ = sb.send_to(d, far);
                    }
                }
                if let Ok((n, from)) = sb.recv_from(&mut buf) {
                    if from == far {
                        let _ = sa.send_to(&buf[..n], near);
                    }
                }
            }
            dropped.len()
        });
        Relay {
            stop,
            thread: Some(thread),
            ports,
        }
    }

    /// Stops it; returns how many datagrams it dropped.
    fn stop(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct DEnd {
    ctx: Context,
    pd: u32,
    cq: Arc<Cq>,
}

fn dgram_end() -> DEnd {
    let ctx = Context::with_config(Config {
        dgram_offload: false,
        ..Config::default()
    })
    .unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    DEnd { ctx, pd, cq }
}

fn lo_any() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn ud_qp(e: &DEnd) -> DgramQpHandle {
    e.ctx
        .create_ud_qp(
            e.pd,
            QpCaps::default(),
            e.cq.clone(),
            e.cq.clone(),
            UdOptions {
                mtu: Some(1500),
                bind: lo_any(),
                ..UdOptions::default()
            },
        )
        .unwrap()
}

fn rd_qp(e: &DEnd, cq: Arc<Cq>) -> DgramQpHandle {
    e.ctx
        .create_rd_qp(
            e.pd,
            QpCaps::default(),
            cq.clone(),
            cq,
            RdOptions {
                mtu: Some(1500),
                bind: lo_any(),
                ..RdOptions::default()
            },
        )
        .unwrap()
}

fn sock(a: DgramAddr) -> SocketAddr {
    SocketAddr::from((a.ip, a.port))
}

/// The UDP frames of a classic pcap file (the probe connections cut out),
/// as a new pcap file.
fn udp_only(bytes: &[u8]) -> (Vec<u8>, usize) {
    let file = PcapFile::parse(bytes).unwrap();
    assert_eq!(file.linktype, 1, "Ethernet link type on lo");
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    let mut n = 0;
    for r in &file.records {
        if matches!(
            decode_frame(&r.data).map(|p| p.transport),
            Some(Transport::Udp { .. })
        ) {
            assert_eq!(r.data.len() as u32, r.orig_len, "frame captured whole");
            w.write_frame_at(r.timestamp, &r.data).unwrap();
            n += 1;
        }
    }
    (w.into_inner(), n)
}

#[test]
fn live_capture_datagrams() {
    let test = "live_capture_datagrams";
    let Some(ts) = Tshark::for_test(test) else {
        return;
    };
    // An installed copy of the dissector would be loaded instead of the
    // repository's (Wireshark loads plugin folders first).
    let folders = ts.run_raw(&["-G", "folders"]).unwrap();
    for line in folders.lines() {
        if let Some((kind, dir)) = line.split_once(':') {
            if kind.contains("Lua Plugins") {
                let copy = Path::new(dir.trim()).join("softrdma_dgram.lua");
                assert!(!copy.exists(), "{test}: installed copy {}", copy.display());
            }
        }
    }
    let (a, b) = (dgram_end(), dgram_end());
    let (ua, ub) = (ud_qp(&a), ud_qp(&b));
    let (rcq_a, rcq_b) = (a.ctx.create_cq(256, None), b.ctx.create_cq(256, None));
    let (ra, rb) = (rd_qp(&a, rcq_a.clone()), rd_qp(&b, rcq_b.clone()));
    let (ma, mb) = (
        DBuf::new(&a.ctx, a.pd, 1 << 16),
        DBuf::new(&b.ctx, b.pd, 1 << 16),
    );
    // RD from ra to rb through the relay: PSN 2 and 7 are lost once.
    let relay = Relay::start(sock(ra.local_addr()), sock(rb.local_addr()), &[2, 7]);
    let rb_via_relay = DgramAddr {
        ip: ra.local_addr().ip,
        port: relay.ports[0],
        qpn: rb.qpn(),
    };
    let mut ports: Vec<u16> = [&ua, &ub, &ra, &rb]
        .iter()
        .map(|q| q.local_addr().port)
        .chain(relay.ports)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    let filter = ports
        .iter()
        .map(|p| format!("udp port {p}"))
        .collect::<Vec<_>>()
        .join(" or ");
    let path =
        std::env::temp_dir().join(format!("softrdma-live-dgram-{}.pcap", std::process::id()));
    let cap = LiveCapture::start_filter(&ts, &filter, path);

    // UD: a 5000-octet Send (4 segments), a Send with immediate, a
    // 6000-octet Write-Record into b's region.
    for k in 0..2 {
        ub.post_recv(RecvWr {
            wr_id: 100 + k,
            sgl: SgList::single(mb.addr(k as usize * 8192), 8192, mb.stag),
        })
        .unwrap();
    }
    let to_ub = ub.local_addr();
    ua.post_send(signaled(1, SEND, ma.sgl(0, 5000)), to_ub)
        .unwrap();
    let imm = SendOp::Send {
        imm: Some(0xC0FFEE),
        invalidate: None,
    };
    ua.post_send(signaled(2, imm, ma.sgl(0, 300)), to_ub)
        .unwrap();
    let ud_record = SendOp::WriteRecord {
        remote_addr: mb.addr(20_000),
        rkey: mb.stag,
    };
    ua.post_send(signaled(3, ud_record, ma.sgl(0, 6000)), to_ub)
        .unwrap();
    successes(&a.cq, 3, "UD sends");
    let got = successes(&b.cq, 2, "UD receives");
    assert_eq!(got[1].wc.imm, Some(0xC0FFEE));

    // RD: Send, Send with immediate, Write, Write-Record, Read, atomic.
    for k in 0..2 {
        rb.post_recv(RecvWr {
            wr_id: 200 + k,
            sgl: SgList::single(mb.addr(40_000 + k as usize * 8192), 8192, mb.stag),
        })
        .unwrap();
    }
    let ops: Vec<(SendOp, Payload)> = vec![
        (SEND, ma.sgl(0, 3000)),
        (imm, ma.sgl(0, 100)),
        (
            SendOp::Write {
                remote_addr: mb.addr(10_000),
                rkey: mb.stag,
                imm: None,
            },
            ma.sgl(0, 4000),
        ),
        (
            SendOp::WriteRecord {
                remote_addr: mb.addr(30_000),
                rkey: mb.stag,
            },
            ma.sgl(0, 5000),
        ),
        (
            SendOp::Read {
                remote_addr: mb.addr(0),
                rkey: mb.stag,
            },
            ma.sgl(30_000, 3000),
        ),
        (
            SendOp::FetchAdd {
                remote_addr: mb.addr(60_000),
                rkey: mb.stag,
                add: 1,
            },
            ma.sgl(60_000, 8),
        ),
    ];
    let n_rd = ops.len();
    for (k, (op, payload)) in ops.into_iter().enumerate() {
        ra.post_send(signaled(10 + k as u64, op, payload), rb_via_relay)
            .unwrap();
    }
    let done = successes(&rcq_a, n_rd, "RD requests");
    let ids: Vec<u64> = done.iter().map(|c| c.wc.wr_id).collect();
    assert_eq!(
        ids,
        (10..10 + n_rd as u64).collect::<Vec<_>>(),
        "posting order"
    );
    let got = successes(&rcq_b, 2, "RD receives");
    assert_eq!(got[1].wc.imm, Some(0xC0FFEE));
    // Let the last ACK-only datagrams go out (delayed ACKs).
    thread::sleep(Duration::from_millis(100));
    let path = cap.stop();
    let dropped = relay.stop();
    assert_eq!(dropped, 2, "the relay dropped PSN 2 and 7 once each");

    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let (pcap, frames) = udp_only(&bytes);
    if let Ok(dir) = std::env::var("SOFTRDMA_PCAP_DIR") {
        let _ = std::fs::write(Path::new(&dir).join("live_capture_datagrams.pcap"), &pcap);
    }
    let ts = ts.with_lua(dgram_dissector());
    let rows = ts
        .fields(
            &pcap[..],
            "",
            &[
                "frame.protocols",
                "srdma.crc_status",
                "srdma.rd.kind",
                "srdma.opcode",
                "srdma.rd.retransmission",
            ],
        )
        .unwrap();
    assert_eq!(rows.len(), frames, "one row per captured datagram");
    let mut ud_ops = std::collections::BTreeSet::new();
    let mut rd_ops = std::collections::BTreeSet::new();
    let (mut acks, mut retrans, mut naks) = (0, 0, 0);
    for (i, row) in rows.iter().enumerate() {
        assert!(
            row[0].split(':').any(|p| p == "srdma"),
            "datagram {} not recognised: {row:?}",
            i + 1
        );
        assert_eq!(row[1], "1", "CRC of datagram {}: {row:?}", i + 1);
        match row[2].as_str() {
            "" => {
                ud_ops.insert(row[3].clone());
            }
            "data" => {
                rd_ops.insert(row[3].clone());
                retrans += usize::from(row[4] == "1");
            }
            "ACK" => acks += 1,
            "NAK" => naks += 1,
            other => panic!("datagram {}: unexpected RD kind {other}: {row:?}", i + 1),
        }
    }
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    assert_eq!(ud_ops, set(&["0x03", "0x08", "0x0c"]), "UD opcodes");
    assert_eq!(
        rd_ops,
        set(&["0x00", "0x01", "0x02", "0x03", "0x08", "0x0a", "0x0b", "0x0c"]),
        "RD opcodes"
    );
    assert!(acks > 0, "no RD ACK-only datagram captured");
    assert!(retrans >= 2, "RD retransmissions marked: {retrans}");
    assert_eq!(ts.malformed_count(&pcap[..]).unwrap(), 0);
    assert_eq!(
        ts.expert_errors(&pcap[..]).unwrap(),
        0,
        "{}",
        ts.expert_error_report(&pcap[..]).unwrap()
    );
    eprintln!(
        "{test}: {frames} datagrams, UD opcodes {ud_ops:?}, RD opcodes {rd_ops:?}, \
         {acks} ACK-only, {naks} NAK, {retrans} retransmissions"
    );

    // One flipped payload bit in the last RD data datagram of the capture:
    // exactly one bad-CRC error.
    let file = PcapFile::parse(&pcap).unwrap();
    let target = rows
        .iter()
        .rposition(|r| r[2] == "data")
        .expect("an RD data datagram");
    let mut w = PcapWriter::new(Vec::new()).unwrap();
    for (i, r) in file.records.iter().enumerate() {
        let mut d = r.data.clone();
        if i == target {
            // Ethernet 14 + IPv4 20 + UDP 8 + the RD shim 26 + 10.
            d[14 + 20 + 8 + 26 + 10] ^= 0x01;
        }
        w.write_frame_at(r.timestamp, &d).unwrap();
    }
    let bad = w.into_inner();
    let report = ts.expert_error_report(&bad[..]).unwrap();
    assert_eq!(ts.expert_errors(&bad[..]).unwrap(), 1, "{report}");
    assert!(report.contains("Bad CRC32C"), "{report}");
    drop((ua, ub, ra, rb));
    drop((a, b));
    drop((ma, mb));
}
