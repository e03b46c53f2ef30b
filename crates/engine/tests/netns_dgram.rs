//! Datagram QPs between two hosts: two network namespaces joined by a veth
//! link (`softrdma_sim::netns::NetPair`), each end a separate process of
//! this test binary, with kernel packet loss (nftables on the receiver's
//! input hook) and kernel-made duplicates (nftables `dup` on the sender's
//! output hook).
//!
//! * **UD Send/Recv under loss** (0.1 %, 1 %, 5 %): 16–64 KiB messages at
//!   MTU 1500 (12 to 46 datagrams each). Every message the receiver
//!   delivers is complete and byte-exact (receive buffers are poisoned
//!   before each post, so a hole would show), no message is delivered
//!   twice (duplicated datagrams are injected), every completion
//!   succeeds, and after draining `delivered + reassembly timeouts +
//!   evictions = sent` exactly (plus messages that found no receive
//!   posted, which with 256 posted does not happen in practice) — unless
//!   the receiver's socket overflowed (`UdpRcvbufErrors`), which can drop
//!   every datagram of a message; then only as many messages may be
//!   missing as those drops account for.
//! * **Write-Record under loss** (same levels): target memory is filled
//!   with a known background and each message writes octets that all
//!   differ from it, so "changed" and "written" are the same thing. After
//!   the run the validity map is exactly the set of changed octets, every
//!   message with a changed octet has exactly one CQ record (none for
//!   untouched ones, never two), `Success` iff the whole message changed,
//!   the listed ranges are exactly its changed octets (a subset when the
//!   record says its list is truncated), its `byte_len` counts them, and
//!   `RecordPartial` records appear. Duplicated datagrams are injected and
//!   must be recorded once.
//! * **Multicast**: one sender in namespace A, two attached QPs (plus one
//!   attached and detached again) in one process in namespace B and one
//!   attached QP in another process in namespace A (reached through
//!   `IP_MULTICAST_LOOP`). Every attached QP gets every message exactly
//!   once, byte-exact; the detached one gets nothing. No multicast route
//!   is needed: QP sockets bound to the veth address send with
//!   `IP_MULTICAST_IF` set to it, and join the group on it.
//! * **Live capture**: tshark on namespace B's veth while UD Sends (one of
//!   64 KiB), an RDMA Write and Write-Records flow; the capture, judged
//!   with `tools/wireshark/softrdma_dgram.lua`, must show every datagram
//!   as `srdma` with a good CRC, the opcodes and DQPNs sent and no expert
//!   error; a copy with one flipped bit gives exactly one bad-CRC error.
//!
//! # Processes
//!
//! The test (the coordinator, in the root namespace) starts each end with
//! `ip netns exec NS <this binary> --exact peer`; the `peer` test reads its
//! scenario from `SOFTRDMA_NETNS_PEER` (`scenario key=value …`) and does
//! nothing without it. A peer reports on stdout with lines
//! `@peer WORD key=value …` and takes commands on stdin (`drain`, `go`,
//! `probe K`). The data checks that need the memory are made in the peer
//! that owns it (a failed check panics it, and the test shows its output);
//! the accounting is asserted by the coordinator. Peers are killed and
//! reaped when the test ends, and exit by themselves after
//! [`PEER_LIFETIME`].
//!
//! # Why the veth links get `gso_max_segs 1`
//!
//! The engine sends runs of equal-sized datagrams as one UDP GSO message.
//! veth advertises UDP segmentation offload, so without this setting such
//! a run crosses the link as one super-packet: nftables then drops (or
//! duplicates) a whole run at once, which is not what a lossy network
//! does, and a capture shows one 64 KiB "datagram" where the wire would
//! carry 45. With `gso_max_segs 1` the kernel cuts runs into datagrams in
//! software before the device, as a NIC without USO does, so every loss,
//! duplicate and captured frame is one datagram. (The engine's GSO path
//! still runs.)
//!
//! Needs root (namespaces, nftables, capture) and tshark; without the
//! right to make namespaces the tests are skipped, except under `CI=true`.
//! `SOFTRDMA_PCAP_DIR=dir` keeps the live capture.

use std::collections::HashMap;
use std::fmt::Debug;
mod child;

use std::io::{BufRead, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::config::Config;
use softrdma_engine::dgram::ProtoStats;
use softrdma_engine::{Completion, Context, Cq, DgramQpHandle, QpCaps, QpError, UdOptions};
use softrdma_proto::memory::Access;
use softrdma_proto::ud::UdStats;
use softrdma_proto::wr::{
    DgramAddr, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
    WorkCompletion,
};
use softrdma_sim::netns::NetPair;
use softrdma_sim::pcap::{decode_frame, PcapFile, Transport};
use softrdma_sim::tshark::Tshark;

/// Names the peer's scenario.
const PEER_ENV: &str = "SOFTRDMA_NETNS_PEER";
/// Starts each protocol line of a peer (libtest may print before it).
const MARK: &str = "@peer ";
/// How long the coordinator waits for a line from a peer, or its exit.
const PEER_WAIT: Duration = Duration::from_secs(60);
/// A peer exits by itself after this long, whatever happens.
const PEER_LIFETIME: Duration = Duration::from_secs(150);
/// How long a receiving peer waits for the last messages after `drain`.
const DRAIN_LIMIT: Duration = Duration::from_secs(15);

/// The path MTU of the veth link (and of every QP).
const MTU: usize = 1500;
/// Payload octets per UD Send segment at MTU 1500: 1500 − 28 (IP, UDP) −
/// 22 (DDP untagged + DQPN) − 4 (CRC).
const UNTAGGED_ROOM: usize = 1446;
/// Per Write / Write-Record segment: 1500 − 28 − 26 (DDP tagged + X + DQPN)
/// − 4.
const TAGGED_ROOM: usize = 1442;
/// Message sizes of the loss tests.
const MIN_MSG: usize = 16 << 10;
const MAX_MSG: usize = 64 << 10;
/// Messages per loss test.
const LOSS_MESSAGES: u32 = 500;
/// Offered load of the loss tests, octets per second: the point is kernel
/// loss, not overload. Half in debug builds: on this project's 2-core CI
/// host a debug receiver sharing the cores with the sender and a parallel
/// test once fell behind at 40 MB/s and its socket overflowed.
const LOSS_RATE: u64 = if cfg!(debug_assertions) {
    20_000_000
} else {
    40_000_000
};
/// Output packets (GSO runs, before they are cut) duplicated by the kernel
/// in the loss tests, per mille.
const DUP_PERMILLE: u32 = 30;
/// Receives posted by the UD receiver (more than the reassembly table
/// holds, so no message ever finds none).
const UD_RQ: usize = 256;
/// The reassembly timeout and Write-Record partial timeout the receivers
/// run with (the defaults).
const RX_TIMEOUT: Duration = Duration::from_millis(100);
/// Untouched margin before and after the Write-Record messages.
const GUARD: usize = 64 << 10;

const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
const SIGNALED: SendFlags = SendFlags {
    signaled: true,
    solicited: false,
    fence: false,
};

// ---------------------------------------------------------------------
// Message contents
// ---------------------------------------------------------------------

/// SplitMix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Length of message `seq` of a loss test: 16 KiB … 64 KiB.
fn msg_len(seed: u64, seq: u32) -> usize {
    MIN_MSG + (mix((seed << 32) | u64::from(seq)) % (MAX_MSG - MIN_MSG + 1) as u64) as usize
}

/// Octet `i` of the pattern of message `seq`.
fn msg_byte(seq: u32, i: usize) -> u8 {
    let x = (i as u32).wrapping_mul(0x9E37_79B1) ^ seq.wrapping_mul(0x85EB_CA77).rotate_left(13);
    (((x ^ (x >> 15)).wrapping_mul(0x2C1B_3C6D)) >> 24) as u8
}

const MSG_MAGIC: [u8; 4] = *b"sRdM";
/// Magic, sequence number and length lead every Send payload.
const MSG_HEADER: usize = 12;

/// Fills `out` with message `seq` (header, then the pattern).
fn fill_msg(seq: u32, out: &mut [u8]) {
    assert!(out.len() >= MSG_HEADER);
    let len = out.len() as u32;
    out[..4].copy_from_slice(&MSG_MAGIC);
    out[4..8].copy_from_slice(&seq.to_be_bytes());
    out[8..12].copy_from_slice(&len.to_be_bytes());
    for (i, b) in out.iter_mut().enumerate().skip(MSG_HEADER) {
        *b = msg_byte(seq, i);
    }
}

/// The sequence number of a received message, if it is exactly a whole
/// message as [`fill_msg`] made it.
fn check_msg(data: &[u8]) -> Result<u32, String> {
    if data.len() < MSG_HEADER || data[..4] != MSG_MAGIC {
        return Err(format!(
            "no message header: {:02x?}",
            &data[..data.len().min(16)]
        ));
    }
    let seq = u32::from_be_bytes(data[4..8].try_into().unwrap());
    let len = u32::from_be_bytes(data[8..12].try_into().unwrap()) as usize;
    if len != data.len() {
        return Err(format!(
            "message {seq}: {} octets, its header says {len}",
            data.len()
        ));
    }
    if let Some(i) = (MSG_HEADER..len).find(|&i| data[i] != msg_byte(seq, i)) {
        return Err(format!(
            "message {seq} ({len} octets): octet {i} is {:#04x}, sent {:#04x}",
            data[i],
            msg_byte(seq, i)
        ));
    }
    Ok(seq)
}

/// The background of Write-Record target memory at region offset `off`.
fn bg_byte(off: usize) -> u8 {
    let x = (off as u32).wrapping_mul(0x9E37_79B1);
    ((x >> 24) ^ (x >> 11)) as u8
}

/// What message `msg` writes at region offset `off`: never the background.
fn wr_byte(msg: u32, off: usize) -> u8 {
    let m = ((off as u32).wrapping_mul(31) ^ msg.wrapping_mul(0x85EB_CA77)) % 255;
    bg_byte(off) ^ (1 + m as u8)
}

/// (region offset, length) of each Write-Record message: packed one after
/// the other after [`GUARD`] octets.
fn wr_layout(seed: u64, n: u32) -> Vec<(usize, usize)> {
    let mut at = GUARD;
    (0..n)
        .map(|i| {
            let len = msg_len(seed, i);
            at += len;
            (at - len, len)
        })
        .collect()
}

fn wr_region_len(layout: &[(usize, usize)]) -> usize {
    layout.last().map_or(GUARD, |&(o, l)| o + l) + GUARD
}

/// Probability that a message of `len` octets in segments of `room` loses
/// none of them at `permille` loss.
fn p_whole(len: usize, room: usize, permille: u32) -> f64 {
    (1.0 - f64::from(permille) / 1000.0).powi(len.div_ceil(room) as i32)
}

// ---------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------

/// Heap memory the engine may write while the test holds it: accessed only
/// through its raw pointer.
struct Mem {
    _backing: Vec<u8>,
    ptr: *mut u8,
    len: usize,
}

impl Mem {
    fn new(len: usize) -> Mem {
        let mut backing = vec![0u8; len];
        let ptr = backing.as_mut_ptr();
        Mem {
            _backing: backing,
            ptr,
            len,
        }
    }

    fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }

    /// Octets `[off, off + len)`: read them only once the engine is done
    /// with them (a completion, or the end of the run).
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.len);
        // SAFETY: inside the allocation, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    fn bytes_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.len);
        // SAFETY: as `bytes`; `&mut self` keeps this the only slice the test
        // holds.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }

    /// Registers the whole buffer (its address is its tagged offset).
    fn register(&self, ctx: &Context, pd: u32, access: Access) -> u32 {
        // SAFETY: every peer declares its `Mem` before its context, so the
        // memory outlives the context's use of it.
        unsafe {
            ctx.registry()
                .register(self.ptr, self.len, self.ptr as u64, access, pd)
        }
        .unwrap()
    }
}

// ---------------------------------------------------------------------
// The two hosts
// ---------------------------------------------------------------------

struct Net {
    pair: NetPair,
    /// The veth device of each side.
    veth: [String; 2],
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip_cmd(args: &[&str]) -> String {
    run(Command::new("ip").args(args))
}

/// The pair for `test`, veth links set to carry single datagrams (module
/// documentation); `None`: skipped.
fn net(test: &str) -> Option<Net> {
    let pair = NetPair::for_test(test)?;
    let veth = [0, 1].map(|side| {
        let ns = &pair.ns[side];
        let list = ip_cmd(&["-n", ns, "-o", "link", "show", "type", "veth"]);
        // "2: NAME@if3: <…"
        let name = list
            .split(": ")
            .nth(1)
            .and_then(|n| n.split('@').next())
            .unwrap_or_else(|| panic!("no veth in {ns}: {list}"))
            .to_string();
        ip_cmd(&["-n", ns, "link", "set", "dev", &name, "gso_max_segs", "1"]);
        name
    });
    Some(Net { pair, veth })
}

impl Net {
    fn nft(&self, side: usize, args: &[&str]) -> String {
        run(Command::new("ip")
            .args(["netns", "exec", &self.pair.ns[side], "nft"])
            .args(args))
    }

    /// Makes the kernel of `side` send a second copy of `permille` of the
    /// UDP packets it sends to `dst` (before GSO runs are cut: a copy is a
    /// whole run).
    fn duplicate(&self, side: usize, dst: Ipv4Addr, permille: u32) {
        self.nft(side, &["add", "table", "ip", "srdmadup"]);
        self.nft(
            side,
            &[
                "add",
                "chain",
                "ip",
                "srdmadup",
                "out",
                "{ type filter hook output priority 0 ; }",
            ],
        );
        let rule = format!(
            "ip daddr {dst} ip protocol udp numgen random mod 1000 < {permille} counter dup to {dst}"
        );
        self.nft(side, &["add", "rule", "ip", "srdmadup", "out", &rule]);
    }

    /// Packets the duplicate rule of `side` copied.
    fn duplicated(&self, side: usize) -> u64 {
        let text = self.nft(side, &["list", "chain", "ip", "srdmadup", "out"]);
        text.split("packets ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

// ---------------------------------------------------------------------
// The coordinator's view of a peer
// ---------------------------------------------------------------------

/// `key=value` words.
#[derive(Debug, Clone, Default)]
struct Kv(HashMap<String, String>);

impl Kv {
    fn parse<'a>(words: impl IntoIterator<Item = &'a str>) -> Kv {
        Kv(words
            .into_iter()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    fn get<T: FromStr>(&self, key: &str) -> T
    where
        T::Err: Debug,
    {
        let v = self
            .0
            .get(key)
            .unwrap_or_else(|| panic!("no `{key}` in {:?}", self.0));
        v.parse().unwrap_or_else(|e| panic!("`{key}={v}`: {e:?}"))
    }
}

/// The peer process, with this test's protocol on top of [`child::Peer`].
struct Peer(child::Peer);

impl std::ops::Deref for Peer {
    type Target = child::Peer;
    fn deref(&self) -> &child::Peer {
        &self.0
    }
}

impl std::ops::DerefMut for Peer {
    fn deref_mut(&mut self) -> &mut child::Peer {
        &mut self.0
    }
}

impl Peer {
    /// Runs scenario `spec` (`name key=value …`) in namespace `side`.
    fn spawn(net: &Net, side: usize, spec: &str) -> Peer {
        let cmd = net.pair.command(side, std::env::current_exe().unwrap());
        let name = format!("{} in {}", spec, net.pair.ns[side]);
        Peer(child::Peer::spawn(cmd, PEER_ENV, spec, name, PEER_WAIT))
    }

    /// Waits for the line `word key=value …`.
    fn expect(&mut self, word: &str) -> Kv {
        let words = self.0.expect(word);
        Kv::parse(words.iter().map(String::as_str))
    }

    /// Waits for `@peer ok` and a successful exit.
    fn finish(mut self) {
        self.finish_ok();
    }
}

// ---------------------------------------------------------------------
// 1. UD Send/Recv under loss
// ---------------------------------------------------------------------

fn ud_under_loss(test: &str, permille: u32) {
    let Some(mut net) = net(test) else {
        return;
    };
    let [a, b] = net.pair.addr;
    net.pair.set_loss(1, permille).unwrap();
    net.duplicate(0, b, DUP_PERMILLE);
    let seed = u64::from(permille) + 1;
    let n = LOSS_MESSAGES;
    let mut rx = Peer::spawn(&net, 1, &format!("ud-recv ip={b} from={a} n={n}"));
    let r = rx.expect("ready");
    let (port, qpn): (u16, u32) = (r.get("port"), r.get("qpn"));
    let mut tx = Peer::spawn(
        &net,
        0,
        &format!("ud-send ip={a} to={b} port={port} qpn={qpn} n={n} seed={seed} rate={LOSS_RATE}"),
    );
    let s = tx.expect("sent");
    tx.finish();
    assert_eq!(s.get::<u32>("completed"), n, "every Send completed: {s:?}");
    rx.tell("drain");
    let r = rx.expect("result");
    rx.finish();
    let get = |k: &str| r.get::<u64>(k);
    let n = u64::from(n);
    let (delivered, timeouts, evicted) = (get("delivered"), get("timeouts"), get("evicted"));
    // The receiver asserted every delivery byte-exact, complete and unique;
    // its counters must tell what became of every other message. (A message
    // finding no receive posted is dropped whole too; with 256 posted it
    // happens only if the receiving process is starved for a long time.)
    // The one exception: a message whose every datagram was lost never
    // reached the receiver. The loss rule alone does that with probability
    // p^12 at least (under 1e-15 here); a receiving process starved long
    // enough for its socket's receive buffer to overflow (the kernel's
    // `UdpRcvbufErrors`; seen on a loaded CI host with a debug build) does
    // it to runs of datagrams. Such messages are allowed only then, and
    // only as many as those drops can account for.
    let no_recv = get("no_recv");
    let rcvbuf_errors = get("rcvbuf_errors");
    assert_eq!(get("stat_delivered"), delivered, "{r:?}");
    for k in [
        "len_err",
        "prot_err",
        "bad_crc",
        "malformed",
        "inconsistent",
    ] {
        assert_eq!(get(k), 0, "{k}: {r:?}");
    }
    let settled = delivered + timeouts + evicted + no_recv;
    let dropped = net.pair.dropped(1);
    if rcvbuf_errors == 0 {
        assert_eq!(
            settled, n,
            "delivered + timed out + evicted (+ no receive) = sent: {r:?}"
        );
    } else {
        assert!(settled <= n, "more messages settled than sent: {r:?}");
        let min_datagrams = MIN_MSG.div_ceil(UNTAGGED_ROOM) as u64;
        assert!(
            (n - settled) * min_datagrams <= rcvbuf_errors + dropped,
            "{} messages never seen, more than {rcvbuf_errors} receive-buffer drops and \
             {dropped} lost datagrams account for: {r:?}",
            n - settled
        );
    }
    let model: f64 = (0..n as u32)
        .map(|i| p_whole(msg_len(seed, i), UNTAGGED_ROOM, permille))
        .sum::<f64>()
        / n as f64;
    eprintln!(
        "{test}: loss {:.1} %: delivered {delivered}/{n} = {:.1} % (independent-loss model {:.1} %); \
         lost {} (reassembly timeouts {timeouts}, evictions {evicted}, no receive {no_recv}, \
         never seen {}); kernel dropped {dropped} packets, duplicated {} runs; receiver: {} \
         duplicate segments, {rcvbuf_errors} UDP receive-buffer errors",
        f64::from(permille) / 10.0,
        100.0 * delivered as f64 / n as f64,
        100.0 * model,
        n - delivered,
        n - settled,
        net.duplicated(0),
        get("duplicates"),
    );
    if permille > 0 {
        assert!(dropped > 0, "the loss rule dropped nothing");
    }
}

#[test]
fn ud_send_recv_under_loss_0_1_percent() {
    ud_under_loss("ud_send_recv_under_loss_0_1_percent", 1);
}

#[test]
fn ud_send_recv_under_loss_1_percent() {
    ud_under_loss("ud_send_recv_under_loss_1_percent", 10);
}

#[test]
fn ud_send_recv_under_loss_5_percent() {
    ud_under_loss("ud_send_recv_under_loss_5_percent", 50);
}

// ---------------------------------------------------------------------
// 2. Write-Record under loss
// ---------------------------------------------------------------------

fn write_record_under_loss(test: &str, permille: u32) {
    let Some(mut net) = net(test) else {
        return;
    };
    let [a, b] = net.pair.addr;
    net.pair.set_loss(1, permille).unwrap();
    net.duplicate(0, b, DUP_PERMILLE);
    let seed = u64::from(permille) + 100;
    let n = LOSS_MESSAGES;
    let mut target = Peer::spawn(
        &net,
        1,
        &format!("wr-target ip={b} from={a} n={n} seed={seed}"),
    );
    let r = target.expect("ready");
    let (port, qpn, stag, base): (u16, u32, u32, u64) =
        (r.get("port"), r.get("qpn"), r.get("stag"), r.get("base"));
    let mut src = Peer::spawn(
        &net,
        0,
        &format!(
            "wr-source ip={a} to={b} port={port} qpn={qpn} stag={stag} base={base} n={n} \
             seed={seed} rate={LOSS_RATE}"
        ),
    );
    let s = src.expect("sent");
    src.finish();
    assert_eq!(
        s.get::<u32>("completed"),
        n,
        "every Write-Record completed: {s:?}"
    );
    target.tell("drain");
    let r = target.expect("result");
    target.finish();
    let get = |k: &str| r.get::<u64>(k);
    let (complete, partial, untouched) = (get("complete"), get("partial"), get("untouched"));
    assert_eq!(complete + partial + untouched, u64::from(n), "{r:?}");
    assert_eq!(get("stat_completed"), complete, "{r:?}");
    assert_eq!(get("stat_partial"), partial, "{r:?}");
    if permille > 0 {
        assert!(partial > 0, "no partial record at {permille} ‰ loss: {r:?}");
    }
    let dups = net.duplicated(0);
    assert!(dups > 0, "the kernel duplicated nothing");
    if permille <= 10 {
        // Copies of the last segment of a message that had completed.
        assert!(get("stat_duplicates") > 0, "no duplicate seen: {r:?}");
    }
    let model: f64 = (0..n)
        .map(|i| p_whole(msg_len(seed, i), TAGGED_ROOM, permille))
        .sum::<f64>()
        / f64::from(n);
    eprintln!(
        "{test}: loss {:.1} %: {complete} complete, {partial} partial ({} with truncated range \
         lists), {untouched} untouched of {n} messages ({:.1} % complete, model {:.1} %); octets \
         recorded valid {:.2} % of {}; kernel dropped {} packets, duplicated {dups} runs; tracker: \
         {} duplicate segments, {} stale, {} retired by a newer MSN, {} fragment overflows",
        f64::from(permille) / 10.0,
        get("truncated"),
        100.0 * complete as f64 / f64::from(n),
        100.0 * model,
        100.0 * get("valid_octets") as f64 / get("octets") as f64,
        get("octets"),
        net.pair.dropped(1),
        get("stat_duplicates"),
        get("stat_stale"),
        get("stat_newer"),
        get("stat_overflow"),
    );
}

#[test]
fn write_record_under_loss_0_1_percent() {
    write_record_under_loss("write_record_under_loss_0_1_percent", 1);
}

#[test]
fn write_record_under_loss_1_percent() {
    write_record_under_loss("write_record_under_loss_1_percent", 10);
}

#[test]
fn write_record_under_loss_5_percent() {
    write_record_under_loss("write_record_under_loss_5_percent", 50);
}

// ---------------------------------------------------------------------
// 3. Multicast
// ---------------------------------------------------------------------

/// Messages the multicast sender sends, and their sizes (in turn).
const MC_MESSAGES: u32 = 25;
const MC_SIZES: [usize; 5] = [64, 1000, 3500, 20_000, 65_536];

#[test]
fn multicast_reaches_every_attached_qp_in_both_namespaces() {
    let Some(net) = net("multicast_reaches_every_attached_qp_in_both_namespaces") else {
        return;
    };
    let [a, b] = net.pair.addr;
    let group = Ipv4Addr::new(239, 77, 0, 1);
    let m = MC_MESSAGES;
    // Namespace B: two QPs attached, one attached and detached again.
    let mut rb = Peer::spawn(
        &net,
        1,
        &format!("mc-recv ip={b} group={group} attached=2 detached=1 m={m}"),
    );
    // Namespace A, another process than the sender: one QP.
    let mut ra = Peer::spawn(
        &net,
        0,
        &format!("mc-recv ip={a} group={group} attached=1 detached=0 m={m}"),
    );
    rb.expect("ready");
    ra.expect("ready");
    let mut tx = Peer::spawn(&net, 0, &format!("mc-send ip={a} group={group} m={m}"));
    let s = tx.expect("ready");
    let (port, qpn): (u16, u32) = (s.get("port"), s.get("qpn"));
    tx.tell("go");
    let sent = tx.expect("sent");
    tx.finish();
    assert_eq!(sent.get::<u32>("completed"), m);
    let mut results = Vec::new();
    for (name, p) in [("B", &mut rb), ("A", &mut ra)] {
        p.tell(&format!("drain src={a} port={port} qpn={qpn}"));
        results.push((name, p.expect("result")));
    }
    rb.finish();
    ra.finish();
    for (name, r) in &results {
        // The peers asserted each message once and byte-exact per QP.
        let attached: u32 = r.get("attached");
        for q in 0..attached {
            assert_eq!(
                r.get::<u32>(&format!("got{q}")),
                m,
                "namespace {name}: {r:?}"
            );
        }
        assert_eq!(
            r.get::<u64>("detached_datagrams"),
            0,
            "namespace {name}: {r:?}"
        );
    }
    eprintln!(
        "multicast: {m} messages ({MC_SIZES:?} octets in turn) to {group}: every one reached the \
         2 attached QPs in namespace B and the 1 in namespace A, none the detached QP; {results:?}"
    );
}

// ---------------------------------------------------------------------
// 4. Live capture, judged by the Lua dissector
// ---------------------------------------------------------------------

/// The capture test's traffic, in order: (opcode of every datagram, their
/// count, what).
fn capture_script() -> Vec<(u8, usize, &'static str)> {
    vec![
        (0x3, 5000usize.div_ceil(UNTAGGED_ROOM), "Send 5000"),
        (
            0x3,
            3000usize.div_ceil(UNTAGGED_ROOM),
            "Send 3000 with immediate",
        ),
        (0x8, 1, "its Immediate Data"),
        (
            0x5,
            3000usize.div_ceil(UNTAGGED_ROOM),
            "Send 3000 solicited",
        ),
        (0x0, 4000usize.div_ceil(TAGGED_ROOM), "RDMA Write 4000"),
        (0xc, 10_000usize.div_ceil(TAGGED_ROOM), "Write-Record 10000"),
        (0xc, 10_000usize.div_ceil(TAGGED_ROOM), "Write-Record 10000"),
        (0xc, 10_000usize.div_ceil(TAGGED_ROOM), "Write-Record 10000"),
        (0x3, 65_536usize.div_ceil(UNTAGGED_ROOM), "Send 65536"),
    ]
}

/// Port the capture barrier's probes go to (nothing listens there).
const PROBE_PORT: u16 = 9;
const CAPTURE_SECONDS: u32 = 120;
const CAPTURE_WAIT: Duration = Duration::from_secs(30);

/// tshark, refusing an installed copy of the dissector (Wireshark loads
/// it before `-X lua_script`, so the repository's would not be tested;
/// as `crates/wire/tests/wireshark_dgram.rs` does).
fn tshark(test: &str) -> Option<Tshark> {
    let ts = Tshark::for_test(test)?;
    let folders = ts.run_raw(&["-G", "folders"]).unwrap();
    for line in folders.lines() {
        let Some((kind, dir)) = line.split_once(':') else {
            continue;
        };
        if kind.contains("Lua Plugins") {
            let copy = Path::new(dir.trim()).join("softrdma_dgram.lua");
            assert!(
                !copy.exists(),
                "{test}: an installed copy of the dissector ({}) would be tested instead of {}",
                copy.display(),
                dissector().display()
            );
        }
    }
    Some(ts)
}

fn dissector() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("tools")
        .join("wireshark")
        .join("softrdma_dgram.lua");
    assert!(p.is_file(), "dissector missing: {}", p.display());
    p
}

/// A running `tshark -i VETH` inside a namespace.
struct LiveCapture {
    child: Option<Child>,
    path: PathBuf,
    stderr: Arc<Mutex<String>>,
}

impl LiveCapture {
    fn start(ts: &Tshark, net: &Net, side: usize, path: PathBuf) -> LiveCapture {
        let _ = std::fs::remove_file(&path);
        let mut child = net
            .pair
            .command(side, ts.program())
            .args(["-n", "-i", &net.veth[side], "-F", "pcap", "-a"])
            .arg(format!("duration:{CAPTURE_SECONDS}"))
            .arg("-w")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().unwrap();
        let sink = stderr.clone();
        thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            sink.lock().unwrap().push_str(&s);
        });
        LiveCapture {
            child: Some(child),
            path,
            stderr,
        }
    }

    /// Has `peer` send probe datagrams until one is in the file (dumpcap
    /// writes in arrival order, so everything seen on the link before the
    /// probe is in the file too).
    fn barrier(&mut self, peer: &mut Peer, what: &str) {
        let deadline = Instant::now() + CAPTURE_WAIT;
        for k in 0u32.. {
            if let Some(s) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "tshark exited ({s}) before the capture was {what}: {}",
                    self.stderr.lock().unwrap()
                );
            }
            let probe = format!("srdma-probe {k}");
            peer.tell(&format!("probe {k}"));
            let until = Instant::now() + Duration::from_millis(600);
            while Instant::now() < until {
                if probe_seen(&self.path, probe.as_bytes()) {
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
            assert!(
                Instant::now() < deadline,
                "capture {what}: no probe in {} within {CAPTURE_WAIT:?}; tshark: {}",
                self.path.display(),
                self.stderr.lock().unwrap()
            );
        }
    }

    /// Stops tshark (SIGINT, so the file is closed cleanly).
    fn stop(mut self) -> PathBuf {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on a child we spawned and have not waited for.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGINT);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            thread::sleep(Duration::from_millis(20));
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

/// The prefix of a classic pcap file that ends with a whole record.
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

fn probe_seen(path: &Path, probe: &[u8]) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    let Ok(file) = PcapFile::parse(complete_records(&bytes)) else {
        return false;
    };
    file.records.iter().any(|r| {
        matches!(decode_frame(&r.data).map(|p| p.transport),
            Some(Transport::Udp { dst_port, payload, .. }) if dst_port == PROBE_PORT && payload == probe)
    })
}

/// Record offsets (of the frame data) of every UDP datagram from `src` to
/// `dst` in a classic pcap file, in file order.
fn udp_frames(bytes: &[u8], src: SocketAddr, dst: SocketAddr) -> Vec<(usize, usize)> {
    let file = PcapFile::parse(bytes).unwrap();
    let mut out = Vec::new();
    let mut off = 24;
    for r in &file.records {
        off += 16;
        if let Some(p) = decode_frame(&r.data) {
            if let Transport::Udp {
                src_port, dst_port, ..
            } = p.transport
            {
                if SocketAddr::from((p.src, src_port)) == src
                    && SocketAddr::from((p.dst, dst_port)) == dst
                {
                    out.push((off, r.data.len()));
                }
            }
        }
        off += r.data.len();
    }
    out
}

fn hex_or_dec(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => s.parse().unwrap(),
    }
}

#[test]
fn live_capture_judged_by_the_lua_dissector() {
    let test = "live_capture_judged_by_the_lua_dissector";
    let Some(ts) = tshark(test) else {
        return;
    };
    let Some(net) = net(test) else {
        return;
    };
    let [a, b] = net.pair.addr;
    let mut rx = Peer::spawn(&net, 1, &format!("cap-recv ip={b} from={a}"));
    let r = rx.expect("ready");
    let (port, qpn, stag, base): (u16, u32, u32, u64) =
        (r.get("port"), r.get("qpn"), r.get("stag"), r.get("base"));
    let path = std::env::temp_dir().join(format!("softrdma-netns-{}.pcap", std::process::id()));
    let mut cap = LiveCapture::start(&ts, &net, 1, path);
    cap.barrier(&mut rx, "started");
    let mut tx = Peer::spawn(
        &net,
        0,
        &format!("cap-send ip={a} to={b} port={port} qpn={qpn} stag={stag} base={base}"),
    );
    let s = tx.expect("sent");
    let (src_port, src_qpn, tx_datagrams): (u16, u32, usize) =
        (s.get("port"), s.get("qpn"), s.get("tx_datagrams"));
    tx.finish();
    rx.tell("drain");
    rx.expect("result");
    cap.barrier(&mut rx, "complete");
    let path = cap.stop();
    rx.tell("exit");
    rx.finish();
    if let Ok(dir) = std::env::var("SOFTRDMA_PCAP_DIR") {
        let _ = std::fs::copy(&path, Path::new(&dir).join("netns_dgram_live.pcap"));
    }
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);

    // Every datagram the sender's QP sent is in the capture.
    let from = SocketAddr::from((a, src_port));
    let to = SocketAddr::from((b, port));
    let frames = udp_frames(&bytes, from, to);
    let script = capture_script();
    let expected: Vec<u8> = script
        .iter()
        .flat_map(|&(op, n, _)| std::iter::repeat_n(op, n))
        .collect();
    assert_eq!(
        tx_datagrams,
        expected.len(),
        "the sender's count: {script:?}"
    );
    assert_eq!(frames.len(), expected.len(), "datagrams captured");

    let ts = ts.with_lua(dissector());
    let filter = format!(
        "ip.src == {a} && ip.dst == {b} && udp.srcport == {src_port} && udp.dstport == {port} && !icmp"
    );
    let rows = ts
        .fields(
            &bytes,
            &filter,
            &[
                "frame.number",
                "frame.protocols",
                "srdma.opcode",
                "srdma.dqpn",
                "srdma.crc_status",
            ],
        )
        .unwrap();
    assert_eq!(rows.len(), expected.len());
    let dqpn = ((src_qpn & 0xFF) << 24) | qpn;
    for (i, (row, &op)) in rows.iter().zip(&expected).enumerate() {
        assert!(
            row[1].split(':').any(|p| p == "srdma"),
            "datagram {i} not recognised as srdma: {row:?}"
        );
        assert_eq!(
            hex_or_dec(&row[2]),
            u64::from(op),
            "opcode of datagram {i}: {row:?}"
        );
        assert_eq!(
            hex_or_dec(&row[3]),
            u64::from(dqpn),
            "DQPN of datagram {i}: {row:?}"
        );
        assert_eq!(row[4], "1", "CRC of datagram {i}: {row:?}");
    }
    // Nothing else UDP on the link claimed or broken (the probes and the
    // ICMP answers to them are the rest).
    let errors = ts.expert_errors(&bytes).unwrap();
    assert_eq!(errors, 0, "{}", ts.expert_error_report(&bytes).unwrap());
    assert_eq!(ts.malformed_count(&bytes).unwrap(), 0);
    let bad = ts
        .fields(&bytes, "srdma.crc_status != 1", &["frame.number"])
        .unwrap();
    assert!(bad.is_empty(), "CRC not good in frames {bad:?}");
    // And no UDP datagram on the link but ours and the probes.
    let other = ts
        .fields(
            &bytes,
            &format!("udp && !icmp && udp.dstport != {PROBE_PORT} && !({filter})"),
            &["frame.number", "frame.protocols"],
        )
        .unwrap();
    assert!(other.is_empty(), "other UDP datagrams: {other:?}");

    // One flipped payload bit in the second datagram of the last
    // Write-Record (inside its flow, so the dissector follows it).
    let first_wr: usize = script
        .iter()
        .take_while(|s| s.2 != "Write-Record 10000")
        .map(|s| s.1)
        .sum();
    let victim = first_wr + 2 * 10_000usize.div_ceil(TAGGED_ROOM) + 1;
    let (off, len) = frames[victim];
    let at = off + 14 + 20 + 8 + 100;
    assert!(at < off + len);
    let mut flipped = bytes.clone();
    flipped[at] ^= 0x10;
    let errors = ts.expert_errors(&flipped).unwrap();
    assert_eq!(errors, 1, "{}", ts.expert_error_report(&flipped).unwrap());
    let bad = ts
        .fields(
            &flipped,
            "srdma.crc_bad",
            &["frame.number", "srdma.crc_status"],
        )
        .unwrap();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0][0], rows[victim][0], "the flipped frame");
    assert_eq!(bad[0][1], "0");
    eprintln!(
        "{test}: {} datagrams captured on {} ({:?}), all srdma with good CRCs and no expert \
         error; flipping one bit of frame {} gives exactly one bad-CRC error",
        frames.len(),
        net.veth[1],
        script.iter().map(|s| s.2).collect::<Vec<_>>(),
        rows[victim][0]
    );
}

// =====================================================================
// The peer processes
// =====================================================================

/// Runs the scenario named in the environment (nothing without it), then
/// prints `@peer ok`.
#[test]
fn peer() {
    let Ok(spec) = std::env::var(PEER_ENV) else {
        return;
    };
    thread::spawn(|| {
        thread::sleep(PEER_LIFETIME);
        eprintln!("peer: still running after {PEER_LIFETIME:?}, exiting");
        std::process::exit(3);
    });
    let mut words = spec.split_whitespace();
    let scenario = words.next().unwrap_or_default().to_string();
    let kv = Kv::parse(words);
    match scenario.as_str() {
        "ud-recv" => peer_ud_recv(&kv),
        "ud-send" => peer_ud_send(&kv),
        "wr-target" => peer_wr_target(&kv),
        "wr-source" => peer_wr_source(&kv),
        "mc-recv" => peer_mc_recv(&kv),
        "mc-send" => peer_mc_send(&kv),
        "cap-recv" => peer_cap_recv(&kv),
        "cap-send" => peer_cap_send(&kv),
        other => panic!("unknown scenario {other}"),
    }
    say("ok");
}

fn say(line: &str) {
    println!("{MARK}{line}");
}

/// Lines from the coordinator; the process exits when it goes away.
fn commands() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                return;
            }
        }
        eprintln!("peer: the coordinator went away");
        std::process::exit(4);
    });
    rx
}

fn blank() -> Completion {
    Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }
}

fn ud_stats(qp: &DgramQpHandle) -> UdStats {
    let ProtoStats::Ud(s) = qp.stats().proto else {
        panic!("not a UD QP")
    };
    s
}

/// A context with the built-in defaults (not the environment's).
fn context() -> Context {
    Context::with_config(Config {
        dgram_mtu: MTU,
        ..Config::default()
    })
    .unwrap()
}

fn ud_qp(ctx: &Context, pd: u32, cq: &Arc<Cq>, ip: Ipv4Addr, depth: usize) -> DgramQpHandle {
    ctx.create_ud_qp(
        pd,
        QpCaps {
            max_send_wr: depth,
            max_recv_wr: depth,
        },
        cq.clone(),
        cq.clone(),
        UdOptions {
            bind: SocketAddr::from((ip, 0)),
            mtu: Some(MTU),
            ..UdOptions::default()
        },
    )
    .unwrap()
}

/// `UdpRcvbufErrors` of this namespace (`/proc/net/snmp`).
fn rcvbuf_errors() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp: "));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Posts `wr` to `qp`, polling `cq` (counting successful send completions
/// in `done`) while the send queue is full.
fn post_send(qp: &DgramQpHandle, cq: &Cq, wr: SendWr, dest: DgramAddr, done: &mut u32) {
    loop {
        match qp.post_send(wr, dest) {
            Ok(()) => return,
            Err(QpError::QueueFull) => {
                reap_sends(cq, done);
                thread::yield_now();
            }
            Err(e) => panic!("post_send: {e:?}"),
        }
    }
}

fn reap_sends(cq: &Cq, done: &mut u32) {
    let mut buf = [blank(); 64];
    loop {
        let k = cq.poll(&mut buf);
        for c in &buf[..k] {
            assert_eq!(c.wc.status, WcStatus::Success, "send completion {c:?}");
            *done += 1;
        }
        if k < buf.len() {
            return;
        }
    }
}

/// Polls until `n` sends completed (within `PEER_WAIT`).
fn reap_all_sends(cq: &Cq, done: &mut u32, n: u32) {
    let deadline = Instant::now() + PEER_WAIT;
    while *done < n {
        reap_sends(cq, done);
        assert!(Instant::now() < deadline, "{done} of {n} sends completed");
        thread::yield_now();
    }
}

/// Sleeps until `sent` octets are due at `rate` octets/s since `start`.
fn pace(start: Instant, sent: usize, rate: u64) {
    let due = start + Duration::from_secs_f64(sent as f64 / rate as f64);
    let now = Instant::now();
    if due > now {
        thread::sleep(due - now);
    }
}

fn dest_of(kv: &Kv) -> DgramAddr {
    DgramAddr {
        ip: IpAddr::V4(kv.get("to")),
        port: kv.get("port"),
        qpn: kv.get("qpn"),
    }
}

// ---- UD Send/Recv ----------------------------------------------------

fn peer_ud_recv(kv: &Kv) {
    let ip: Ipv4Addr = kv.get("ip");
    let from: Ipv4Addr = kv.get("from");
    let n: u32 = kv.get("n");
    const POISON: u8 = 0xEE;
    let mut mem = Mem::new(UD_RQ * MAX_MSG);
    let ctx = context();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4 * UD_RQ, None);
    let qp = ud_qp(&ctx, pd, &cq, ip, UD_RQ);
    let stag = mem.register(&ctx, pd, RW);
    let post = |mem: &mut Mem, slot: usize| {
        mem.bytes_mut(slot * MAX_MSG, MAX_MSG).fill(POISON);
        qp.post_recv(RecvWr {
            wr_id: slot as u64,
            sgl: SgList::single(mem.addr(slot * MAX_MSG), MAX_MSG as u32, stag),
        })
        .unwrap();
    };
    for slot in 0..UD_RQ {
        post(&mut mem, slot);
    }
    let me = qp.local_addr();
    say(&format!("ready port={} qpn={}", me.port, me.qpn));
    let cmds = commands();
    let mut seen = vec![false; n as usize];
    let mut delivered = 0u64;
    let mut drain_from: Option<Instant> = None;
    let (mut last, mut last_change) = ((0u64, 0u64), Instant::now());
    let mut buf = [blank(); 32];
    loop {
        let k = cq.poll(&mut buf);
        for c in &buf[..k] {
            let wc = &c.wc;
            assert_eq!(
                (wc.status, wc.opcode),
                (WcStatus::Success, WcOpcode::Recv),
                "receive completion {c:?}"
            );
            assert_eq!(wc.src.map(|s| s.ip), Some(IpAddr::V4(from)), "{c:?}");
            let slot = wc.wr_id as usize;
            let data = mem.bytes(slot * MAX_MSG, wc.byte_len as usize);
            let seq = check_msg(data).unwrap_or_else(|e| panic!("delivered: {e}"));
            assert!(seq < n, "message {seq} of {n}");
            assert!(!seen[seq as usize], "message {seq} delivered twice");
            seen[seq as usize] = true;
            delivered += 1;
            post(&mut mem, slot);
        }
        if k > 0 {
            continue;
        }
        if let Ok(line) = cmds.try_recv() {
            assert_eq!(line, "drain");
            drain_from = Some(Instant::now());
        }
        if let Some(t) = drain_from {
            let s = ud_stats(&qp);
            let settled = s.rx_delivered + s.rx_timeouts + s.rx_evicted + s.rx_no_recv;
            // A message the kernel dropped whole (receive buffer full) never
            // settles here: quiet for several reassembly timeouts, with
            // every delivery taken, ends the wait too.
            let seen = (s.rx_datagrams, settled);
            if seen != last {
                (last, last_change) = (seen, Instant::now());
            }
            let quiet = 4 * RX_TIMEOUT;
            let done = s.rx_delivered == delivered
                && (settled >= u64::from(n)
                    || (t.elapsed() > quiet && last_change.elapsed() > quiet));
            if done || t.elapsed() > DRAIN_LIMIT {
                break;
            }
        }
        thread::sleep(Duration::from_micros(200));
    }
    // Anything still arriving would be a bug: one more reassembly timeout.
    thread::sleep(2 * RX_TIMEOUT);
    assert_eq!(cq.poll(&mut buf), 0, "a completion after the drain");
    let s = ud_stats(&qp);
    say(&format!(
        "result delivered={delivered} stat_delivered={} timeouts={} evicted={} no_recv={} \
         len_err={} prot_err={} bad_crc={} malformed={} duplicates={} inconsistent={} \
         fragment_overflow={} rx_datagrams={} rcvbuf_errors={}",
        s.rx_delivered,
        s.rx_timeouts,
        s.rx_evicted,
        s.rx_no_recv,
        s.rx_len_err,
        s.rx_prot_err,
        s.rx_bad_crc,
        s.rx_malformed,
        s.rx_duplicates,
        s.rx_inconsistent,
        s.rx_fragment_overflow,
        s.rx_datagrams,
        rcvbuf_errors()
    ));
    drop(qp);
}

fn peer_ud_send(kv: &Kv) {
    let ip: Ipv4Addr = kv.get("ip");
    let n: u32 = kv.get("n");
    let seed: u64 = kv.get("seed");
    let rate: u64 = kv.get("rate");
    let dest = dest_of(kv);
    let lens: Vec<usize> = (0..n).map(|i| msg_len(seed, i)).collect();
    let total: usize = lens.iter().sum();
    let mut mem = Mem::new(total);
    let mut at = 0;
    for (i, &l) in lens.iter().enumerate() {
        fill_msg(i as u32, mem.bytes_mut(at, l));
        at += l;
    }
    let ctx = context();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(1024, None);
    let qp = ud_qp(&ctx, pd, &cq, ip, 256);
    let stag = mem.register(&ctx, pd, RW);
    let start = Instant::now();
    let (mut at, mut done) = (0, 0u32);
    for (i, &l) in lens.iter().enumerate() {
        pace(start, at, rate);
        let wr = SendWr {
            wr_id: i as u64,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(mem.addr(at), l as u32, stag)),
            flags: SIGNALED,
        };
        post_send(&qp, &cq, wr, dest, &mut done);
        at += l;
        reap_sends(&cq, &mut done);
    }
    reap_all_sends(&cq, &mut done, n);
    let s = ud_stats(&qp);
    say(&format!(
        "sent completed={done} tx_messages={} tx_errors={} tx_datagrams={} seconds={:.3}",
        s.tx_messages,
        s.tx_errors,
        s.tx_datagrams,
        start.elapsed().as_secs_f64()
    ));
    drop(qp);
}

// ---- Write-Record ----------------------------------------------------

/// Sorted disjoint `[start, end)` intervals of the offsets where `pred`
/// holds.
fn intervals(len: usize, mut pred: impl FnMut(usize) -> bool) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    let mut start = None;
    for i in 0..len {
        match (pred(i), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, len));
    }
    out
}

/// `iv` clipped to `[lo, hi)`, shifted to start at `lo`.
fn clip(iv: &[(usize, usize)], lo: usize, hi: usize) -> Vec<(usize, usize)> {
    iv.iter()
        .filter(|&&(a, b)| b > lo && a < hi)
        .map(|&(a, b)| (a.max(lo) - lo, b.min(hi) - lo))
        .collect()
}

fn peer_wr_target(kv: &Kv) {
    let ip: Ipv4Addr = kv.get("ip");
    let from: Ipv4Addr = kv.get("from");
    let n: u32 = kv.get("n");
    let seed: u64 = kv.get("seed");
    let layout = wr_layout(seed, n);
    let region = wr_region_len(&layout);
    let mut mem = Mem::new(region);
    for (i, b) in mem.bytes_mut(0, region).iter_mut().enumerate() {
        *b = bg_byte(i);
    }
    let ctx = context();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4 * n as usize + 64, None);
    let qp = ud_qp(&ctx, pd, &cq, ip, 64);
    let stag = mem.register(&ctx, pd, RW);
    let me = qp.local_addr();
    say(&format!(
        "ready port={} qpn={} stag={stag} base={}",
        me.port,
        me.qpn,
        mem.addr(0)
    ));
    let cmds = commands();
    let mut records: Vec<WorkCompletion> = Vec::new();
    let mut buf = [blank(); 32];
    let mut drain_from: Option<Instant> = None;
    let mut last_change = Instant::now();
    loop {
        let k = cq.poll(&mut buf);
        records.extend(buf[..k].iter().map(|c| c.wc));
        if k > 0 {
            last_change = Instant::now();
            continue;
        }
        if let Ok(line) = cmds.try_recv() {
            assert_eq!(line, "drain");
            drain_from = Some(Instant::now());
        }
        if let Some(t) = drain_from {
            // Quiet for several partial timeouts: the last message was
            // retired (the progress thread's timer) and reported.
            let quiet = 4 * RX_TIMEOUT;
            if (t.elapsed() > quiet && last_change.elapsed() > quiet) || t.elapsed() > DRAIN_LIMIT {
                break;
            }
        }
        thread::sleep(Duration::from_micros(200));
    }
    let stats = qp.stats().record;
    assert_eq!(
        (
            stats.overflow,
            stats.validity_overflow,
            stats.cq_overflow,
            stats.malformed
        ),
        (0, 0, 0, 0),
        "the tracker's bounds were reached, exactness is not promised: {stats:?}"
    );

    // What changed, octet by octet; nothing but the messages' own octets.
    let data = mem.bytes(0, region);
    let mut msg_of = vec![u32::MAX; region];
    for (i, &(o, l)) in layout.iter().enumerate() {
        msg_of[o..o + l].fill(i as u32);
    }
    for (off, &x) in data.iter().enumerate() {
        if x != bg_byte(off) {
            let m = msg_of[off];
            assert!(m != u32::MAX, "octet {off} outside every message changed");
            assert_eq!(x, wr_byte(m, off), "octet {off} of message {m} corrupted");
        }
    }
    let changed = intervals(region, |i| data[i] != bg_byte(i));

    // The validity map is exactly that.
    let mut out = vec![(0u64, 0u64); 4096];
    let (k, more) = qp.valid_ranges(stag, mem.addr(0), region as u64, &mut out);
    assert!(!more);
    let valid: Vec<(usize, usize)> = out[..k]
        .iter()
        .map(|&(s, e)| ((s - mem.addr(0)) as usize, (e - mem.addr(0)) as usize))
        .collect();
    assert_eq!(valid, changed, "validity map vs changed octets");

    // One record per touched message, none for the others, exact ranges.
    let (mut complete, mut partial, mut untouched, mut truncated) = (0u64, 0u64, 0u64, 0u64);
    let mut by_msg: HashMap<usize, WorkCompletion> = HashMap::new();
    let index: HashMap<u64, usize> = layout
        .iter()
        .enumerate()
        .map(|(i, &(o, _))| (mem.addr(o), i))
        .collect();
    for wc in &records {
        assert_eq!(wc.opcode, WcOpcode::RecvWriteRecord, "{wc:?}");
        assert_eq!(wc.src.map(|s| s.ip), Some(IpAddr::V4(from)), "{wc:?}");
        let info = wc.record.unwrap();
        assert_eq!(info.stag, stag);
        let i = *index
            .get(&info.to)
            .unwrap_or_else(|| panic!("a record at no message's base: {wc:?}"));
        assert_eq!(info.msn, i as u32 + 1, "T-MSN of message {i}");
        assert!(
            by_msg.insert(i, *wc).is_none(),
            "message {i} recorded twice: {wc:?}"
        );
    }
    for (i, &(o, l)) in layout.iter().enumerate() {
        let got = clip(&changed, o, o + l);
        let octets: usize = got.iter().map(|r| r.1 - r.0).sum();
        let Some(wc) = by_msg.get(&i) else {
            assert!(
                got.is_empty(),
                "message {i} changed {got:?} without a record"
            );
            untouched += 1;
            continue;
        };
        let info = wc.record.unwrap();
        assert_eq!(
            wc.byte_len as usize, octets,
            "octets of message {i}: {wc:?}"
        );
        let listed: Vec<(usize, usize)> = info.ranges[..usize::from(info.n_ranges)]
            .iter()
            .map(|&(a, n)| (a as usize, a as usize + n as usize))
            .collect();
        match wc.status {
            WcStatus::Success => {
                assert_eq!(
                    got,
                    vec![(0, l)],
                    "message {i} complete but changed {got:?}"
                );
                assert_eq!((info.len as usize, &listed[..]), (l, &[(0, l)][..]));
                complete += 1;
            }
            WcStatus::RecordPartial => {
                assert!(octets > 0 && octets < l, "message {i}: {got:?} {wc:?}");
                // The length is known once the last segment arrived.
                if got.last().is_some_and(|r| r.1 == l) {
                    assert_eq!(info.len as usize, l, "message {i}: {wc:?}");
                } else {
                    assert!((info.len as usize) < l, "message {i}: {wc:?}");
                }
                if info.ranges_truncated {
                    assert!(listed.len() == 4 && got.len() > 4, "{wc:?}");
                    for r in &listed {
                        assert!(
                            got.iter().any(|g| g.0 <= r.0 && r.1 <= g.1),
                            "message {i}: listed {r:?} not among the changed {got:?}"
                        );
                    }
                    truncated += 1;
                } else {
                    assert_eq!(listed, got, "ranges of message {i}: {wc:?}");
                }
                partial += 1;
            }
            s => panic!("message {i}: status {s:?}"),
        }
    }
    let octets: usize = layout.iter().map(|l| l.1).sum();
    let valid_octets: usize = changed.iter().map(|r| r.1 - r.0).sum();
    say(&format!(
        "result records={} complete={complete} partial={partial} untouched={untouched} \
         truncated={truncated} octets={octets} valid_octets={valid_octets} stat_completed={} \
         stat_partial={} stat_duplicates={} stat_stale={} stat_newer={} stat_evicted={} \
         stat_overflow={}",
        records.len(),
        stats.completed,
        stats.partial_delivered,
        stats.duplicates,
        stats.stale_segments,
        stats.retired_by_newer_msn,
        stats.evicted,
        stats.overflow
    ));
    drop(qp);
}

fn peer_wr_source(kv: &Kv) {
    let ip: Ipv4Addr = kv.get("ip");
    let n: u32 = kv.get("n");
    let seed: u64 = kv.get("seed");
    let rate: u64 = kv.get("rate");
    let stag_remote: u32 = kv.get("stag");
    let base: u64 = kv.get("base");
    let dest = dest_of(kv);
    let layout = wr_layout(seed, n);
    let region = wr_region_len(&layout);
    // The same layout locally: message i's octets at its region offset.
    let mut mem = Mem::new(region);
    for (i, &(o, l)) in layout.iter().enumerate() {
        for (j, b) in mem.bytes_mut(o, l).iter_mut().enumerate() {
            *b = wr_byte(i as u32, o + j);
        }
    }
    let ctx = context();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(1024, None);
    let qp = ud_qp(&ctx, pd, &cq, ip, 256);
    let stag = mem.register(&ctx, pd, RW);
    let start = Instant::now();
    let (mut sent, mut done) = (0, 0u32);
    for (i, &(o, l)) in layout.iter().enumerate() {
        pace(start, sent, rate);
        let wr = SendWr {
            wr_id: i as u64,
            op: SendOp::WriteRecord {
                remote_addr: base + o as u64,
                rkey: stag_remote,
            },
            payload: Payload::Sgl(SgList::single(mem.addr(o), l as u32, stag)),
            flags: SIGNALED,
        };
        post_send(&qp, &cq, wr, dest, &mut done);
        sent += l;
        reap_sends(&cq, &mut done);
    }
    reap_all_sends(&cq, &mut done, n);
    let s = ud_stats(&qp);
    say(&format!(
        "sent completed={done} tx_errors={} tx_datagrams={} seconds={:.3}",
        s.tx_errors,
        s.tx_datagrams,
        start.elapsed().as_secs_f64()
    ));
    drop(qp);
}

// ---- Multicast -------------------------------------------------------

fn mc_len(seq: u32) -> usize {
    MC_SIZES[seq as usize % MC_SIZES.len()]
}

fn peer_mc_recv(kv: &Kv) {
    let ip: Ipv4Addr = kv.get("ip");
    let group: Ipv4Addr = kv.get("group");
    let attached: usize = kv.get("attached");
    let detached: usize = kv.get("detached");
    let m: u32 = kv.get("m");
    let nq = attached + detached;
    let per = m as usize;
    let mut mem = Mem::new(nq * per * MAX_MSG);
    let ctx = context();
    let pd = ctx.alloc_pd();
    let stag = mem.register(&ctx, pd, RW);
    let mut qps = Vec::new();
    for q in 0..nq {
        let cq = ctx.create_cq(4 * per, None);
        let qp = ud_qp(&ctx, pd, &cq, ip, per);
        for j in 0..per {
            let at = (q * per + j) * MAX_MSG;
            mem.bytes_mut(at, MAX_MSG).fill(0xEE);
            qp.post_recv(RecvWr {
                wr_id: j as u64,
                sgl: SgList::single(mem.addr(at), MAX_MSG as u32, stag),
            })
            .unwrap();
        }
        qp.attach_mcast(IpAddr::V4(group)).unwrap();
        qps.push((qp, cq));
    }
    for (qp, _) in &qps[attached..] {
        qp.detach_mcast(IpAddr::V4(group)).unwrap();
    }
    say("ready");
    let cmds = commands();
    let line = cmds.recv().unwrap();
    let words = line.strip_prefix("drain ").expect("drain");
    let src = Kv::parse(words.split_whitespace());
    let src = DgramAddr {
        ip: IpAddr::V4(src.get("src")),
        port: src.get("port"),
        qpn: src.get("qpn"),
    };
    let mut seen = vec![vec![false; per]; nq];
    let mut got = vec![0u32; nq];
    let mut buf = [blank(); 32];
    let deadline = Instant::now() + DRAIN_LIMIT;
    let mut quiet_from: Option<Instant> = None;
    loop {
        let mut any = false;
        for (q, (qp, cq)) in qps.iter().enumerate() {
            let k = cq.poll(&mut buf);
            any |= k > 0;
            for c in &buf[..k] {
                assert!(
                    q < attached,
                    "the detached QP {:#x} received {c:?}",
                    qp.qpn()
                );
                assert_eq!(
                    (c.wc.status, c.wc.opcode, c.wc.src, c.qp_num),
                    (WcStatus::Success, WcOpcode::Recv, Some(src), qp.qpn()),
                    "{c:?}"
                );
                let at = (q * per + c.wc.wr_id as usize) * MAX_MSG;
                let seq = check_msg(mem.bytes(at, c.wc.byte_len as usize))
                    .unwrap_or_else(|e| panic!("QP {q}: {e}"));
                assert_eq!(c.wc.byte_len as usize, mc_len(seq));
                assert!(!seen[q][seq as usize], "QP {q}: message {seq} twice");
                seen[q][seq as usize] = true;
                got[q] += 1;
            }
        }
        if got[..attached].iter().all(|&g| g == m) {
            // Then a while longer for anything the detached QP (or a
            // duplicate) might still get.
            let t = *quiet_from.get_or_insert_with(Instant::now);
            if t.elapsed() > 3 * RX_TIMEOUT {
                break;
            }
        }
        if Instant::now() > deadline {
            break;
        }
        if !any {
            thread::sleep(Duration::from_micros(200));
        }
    }
    let detached_datagrams: u64 = qps[attached..]
        .iter()
        .map(|(qp, _)| ud_stats(qp).rx_datagrams)
        .sum();
    let mcast = qps[0].0.mcast_socket_stats();
    let mut line = format!(
        "result attached={attached} detached_datagrams={detached_datagrams} \
         mcast_rx={} mcast_no_qp={} mcast_not_group={}",
        mcast.rx_datagrams, mcast.rx_no_qp, mcast.rx_not_group
    );
    for (q, g) in got.iter().enumerate().take(attached) {
        line.push_str(&format!(" got{q}={g}"));
    }
    say(&line);
    drop(qps);
}

fn peer_mc_send(kv: &Kv) {
    let ip: Ipv4Addr = kv.get("ip");
    let group: Ipv4Addr = kv.get("group");
    let m: u32 = kv.get("m");
    let mut mem = Mem::new(m as usize * MAX_MSG);
    for seq in 0..m {
        fill_msg(seq, mem.bytes_mut(seq as usize * MAX_MSG, mc_len(seq)));
    }
    let ctx = context();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let qp = ud_qp(&ctx, pd, &cq, ip, 64);
    let stag = mem.register(&ctx, pd, RW);
    let me = qp.local_addr();
    say(&format!("ready port={} qpn={}", me.port, me.qpn));
    let cmds = commands();
    assert_eq!(cmds.recv().unwrap(), "go");
    let dest = ctx.mcast_dest(IpAddr::V4(group));
    let mut done = 0u32;
    for seq in 0..m {
        let wr = SendWr {
            wr_id: u64::from(seq),
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(
                mem.addr(seq as usize * MAX_MSG),
                mc_len(seq) as u32,
                stag,
            )),
            flags: SIGNALED,
        };
        post_send(&qp, &cq, wr, dest, &mut done);
        // No loss is configured: only the receivers' socket buffers could
        // drop, so give them time.
        thread::sleep(Duration::from_millis(5));
    }
    reap_all_sends(&cq, &mut done, m);
    let s = ud_stats(&qp);
    say(&format!(
        "sent completed={done} tx_datagrams={} tx_errors={}",
        s.tx_datagrams, s.tx_errors
    ));
    drop(qp);
}

// ---- Live capture ----------------------------------------------------

const CAP_TARGET: usize = 64 << 10;

fn peer_cap_recv(kv: &Kv) {
    let ip: Ipv4Addr = kv.get("ip");
    let from: Ipv4Addr = kv.get("from");
    let mut rxmem = Mem::new(4 * MAX_MSG);
    let target = Mem::new(CAP_TARGET);
    let ctx = context();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let qp = ud_qp(&ctx, pd, &cq, ip, 64);
    let rstag = rxmem.register(&ctx, pd, RW);
    let tstag = target.register(&ctx, pd, RW);
    for slot in 0..4 {
        rxmem.bytes_mut(slot * MAX_MSG, MAX_MSG).fill(0xEE);
        qp.post_recv(RecvWr {
            wr_id: slot as u64,
            sgl: SgList::single(rxmem.addr(slot * MAX_MSG), MAX_MSG as u32, rstag),
        })
        .unwrap();
    }
    let me = qp.local_addr();
    say(&format!(
        "ready port={} qpn={} stag={tstag} base={}",
        me.port,
        me.qpn,
        target.addr(0)
    ));
    let probe = UdpSocket::bind((ip, 0)).unwrap();
    let cmds = commands();
    let mut got = Vec::new();
    loop {
        let line = cmds.recv().unwrap();
        if let Some(k) = line.strip_prefix("probe ") {
            probe
                .send_to(format!("srdma-probe {k}").as_bytes(), (from, PROBE_PORT))
                .unwrap();
            continue;
        }
        if line == "exit" {
            break;
        }
        assert_eq!(line, "drain");
        // Four receives and three Write-Records.
        let deadline = Instant::now() + DRAIN_LIMIT;
        let mut buf = [blank(); 16];
        while got.len() < 7 {
            let k = cq.poll(&mut buf);
            got.extend_from_slice(&buf[..k]);
            assert!(Instant::now() < deadline, "only {got:?}");
            thread::sleep(Duration::from_micros(200));
        }
        let recvs: Vec<&Completion> = got
            .iter()
            .filter(|c| c.wc.opcode == WcOpcode::Recv)
            .collect();
        let records: Vec<&Completion> = got
            .iter()
            .filter(|c| c.wc.opcode == WcOpcode::RecvWriteRecord)
            .collect();
        assert_eq!((recvs.len(), records.len()), (4, 3), "{got:?}");
        let lens: Vec<(u32, Option<u32>, bool)> = recvs
            .iter()
            .map(|c| (c.wc.byte_len, c.wc.imm, c.wc.solicited))
            .collect();
        assert_eq!(
            lens,
            [
                (5000, None, false),
                (3000, Some(0xC0DE), false),
                (3000, None, true),
                (65536, None, false)
            ]
        );
        for c in &recvs {
            assert_eq!(c.wc.status, WcStatus::Success);
            let data = rxmem.bytes(c.wc.wr_id as usize * MAX_MSG, c.wc.byte_len as usize);
            check_msg(data).unwrap();
        }
        for (i, c) in records.iter().enumerate() {
            let info = c.wc.record.unwrap();
            assert_eq!(
                (c.wc.status, info.to, info.len),
                (WcStatus::Success, target.addr(8192 + i * 10_000), 10_000)
            );
        }
        // The RDMA Write at 0, the Write-Records after it.
        let t = target.bytes(0, CAP_TARGET);
        assert!(t[..4000]
            .iter()
            .enumerate()
            .all(|(i, &x)| x == wr_byte(99, i)));
        for i in 0..3 {
            let o = 8192 + i * 10_000;
            assert!((o..o + 10_000).all(|j| t[j] == wr_byte(i as u32, j)));
        }
        say("result");
    }
    drop(qp);
}

fn peer_cap_send(kv: &Kv) {
    let ip: Ipv4Addr = kv.get("ip");
    let rstag: u32 = kv.get("stag");
    let base: u64 = kv.get("base");
    let dest = dest_of(kv);
    // Sends from 0 (one buffer each), the Write's and Write-Records'
    // octets at their target offsets + 4 × 64 KiB.
    let src_at = 4 * MAX_MSG;
    let mut mem = Mem::new(src_at + CAP_TARGET);
    for (i, len) in [5000, 3000, 3000, 65536].into_iter().enumerate() {
        fill_msg(i as u32, mem.bytes_mut(i * MAX_MSG, len));
    }
    for (j, b) in mem.bytes_mut(src_at, 4000).iter_mut().enumerate() {
        *b = wr_byte(99, j);
    }
    for i in 0..3 {
        let o = 8192 + i * 10_000;
        for (j, b) in mem.bytes_mut(src_at + o, 10_000).iter_mut().enumerate() {
            *b = wr_byte(i as u32, o + j);
        }
    }
    let ctx = context();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(256, None);
    let qp = ud_qp(&ctx, pd, &cq, ip, 64);
    let stag = mem.register(&ctx, pd, RW);
    let send = |i: usize, len: usize, imm: Option<u32>, solicited: bool| SendWr {
        wr_id: i as u64,
        op: SendOp::Send {
            imm,
            invalidate: None,
        },
        payload: Payload::Sgl(SgList::single(mem.addr(i * MAX_MSG), len as u32, stag)),
        flags: SendFlags {
            solicited,
            ..SIGNALED
        },
    };
    let tagged = |id: u64, op: SendOp, off: usize, len: usize| SendWr {
        wr_id: id,
        op,
        payload: Payload::Sgl(SgList::single(mem.addr(src_at + off), len as u32, stag)),
        flags: SIGNALED,
    };
    let mut wrs = vec![
        send(0, 5000, None, false),
        send(1, 3000, Some(0xC0DE), false),
        send(2, 3000, None, true),
        tagged(
            10,
            SendOp::Write {
                remote_addr: base,
                rkey: rstag,
                imm: None,
            },
            0,
            4000,
        ),
    ];
    for i in 0..3 {
        let o = 8192 + i * 10_000;
        wrs.push(tagged(
            20 + i as u64,
            SendOp::WriteRecord {
                remote_addr: base + o as u64,
                rkey: rstag,
            },
            o,
            10_000,
        ));
    }
    wrs.push(send(3, 65536, None, false));
    let mut done = 0u32;
    for wr in wrs {
        post_send(&qp, &cq, wr, dest, &mut done);
        // One message at a time on the wire.
        thread::sleep(Duration::from_millis(2));
    }
    reap_all_sends(&cq, &mut done, 8);
    let s = ud_stats(&qp);
    let me = qp.local_addr();
    say(&format!(
        "sent port={} qpn={} tx_datagrams={} tx_errors={}",
        me.port, me.qpn, s.tx_datagrams, s.tx_errors
    ));
    drop(qp);
}
