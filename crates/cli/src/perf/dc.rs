//! `--transport dc`: the DC (SoftDC) end of a softrdma cell.
//!
//! Each end has one DC initiator (DCI) and one DC target (DCT) bound to a
//! shared receive queue, both completing into the end's CQ, so every test
//! that runs over RC runs over DC unchanged: Sends go from A's DCI to B's
//! DCT and back from B's DCI to A's DCT; one-sided operations name the
//! peer's DCT. The ends learn each other's DCT number and IP address on
//! the control channel; the DC access key is fixed ([`KEY`]).
//!
//! **First-message latency** is reported apart from the steady-state
//! figure: before the measured test starts, A posts one 8-octet RDMA Read
//! to B's DCT — A has no connection to it yet, so the Read pays the
//! invitation round trip and the RC connection set-up — and times it from
//! post to completion ([`first_message`]). The result's `first_msg_us`
//! field holds it (µs, a number in the JSON line; the `note` says what it
//! measured, and the table shows it among the notes); the latency histogram and
//! the bandwidth figure of the cell cover only what follows, over the
//! connection that Read opened (B's first answer over its own new
//! connection to A falls in the warm-up of latency tests).

use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use softrdma_verbs::dc::{DcAddressHandle, DcInitiator, DcOptions, DcTarget};
use softrdma_verbs::{
    Completion, CompletionQueue, MemoryRegion, Payload, ProtectionDomain, QpCaps, RecvWr,
    SendFlags, SendOp, SendWr, SgList, SharedReceiveQueue, WcOpcode, WcStatus, WorkCompletion,
};

use super::ctrl::Msg;

/// The DC access key both ends use.
pub(crate) const KEY: u64 = 0x5eed_d0c5_0000_0007;

/// wr_id of the first-message probe.
const PROBE_ID: u64 = 1 << 41;

/// How long the first-message probe may take (invitation retransmission
/// gives up after 2 s).
const PROBE_LIMIT: Duration = Duration::from_secs(10);

fn err(msg: String) -> io::Error {
    io::Error::other(msg)
}

/// One end's DC objects and its peer's address.
pub(crate) struct DcQp {
    dci: DcInitiator,
    dct: DcTarget,
    srq: SharedReceiveQueue,
    ip: IpAddr,
    /// The peer's address handle and DCT number (after [`DcQp::learn`]).
    peer: Option<(DcAddressHandle, u32)>,
}

impl DcQp {
    /// A DCI and a DCT (with an SRQ of `caps.max_recv_wr` receives) of
    /// `pd`, both completing into `cq`, the DC service bound to `ip`.
    pub(crate) fn new(
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        caps: QpCaps,
        ip: IpAddr,
    ) -> io::Result<DcQp> {
        let opts = DcOptions {
            bind_ip: ip,
            ..DcOptions::default()
        };
        let srq = pd.create_srq(caps.max_recv_wr);
        let dct = pd
            .create_dct(cq, &srq, KEY, opts)
            .map_err(|e| err(format!("DCT: {e}")))?;
        let dci = pd
            .create_dci(cq, caps.max_send_wr, opts)
            .map_err(|e| err(format!("DCI: {e}")))?;
        Ok(DcQp {
            dci,
            dct,
            srq,
            ip,
            peer: None,
        })
    }

    /// Adds what the peer needs to reach our DCT to `m`.
    pub(crate) fn advert(&self, m: Msg) -> Msg {
        m.with("ip", self.ip).with("dct", self.dct.number())
    }

    /// Takes the peer's DCT address from `m` (sent by [`DcQp::advert`]).
    pub(crate) fn learn(&mut self, pd: &ProtectionDomain, m: &Msg) -> io::Result<()> {
        let ip: IpAddr = m.num("ip")?;
        let dct: u32 = m.num("dct")?;
        self.peer = Some((pd.sdc_create_ah(ip), dct));
        Ok(())
    }

    /// A receive for the DCT (its SRQ).
    pub(crate) fn post_recv(&self, wr: RecvWr) -> Result<(), String> {
        self.srq.post_recv(wr).map_err(|e| e.to_string())
    }

    /// A work request to the peer's DCT.
    pub(crate) fn post_send(&self, wr: SendWr) -> Result<(), String> {
        let (ah, dct) = self
            .peer
            .as_ref()
            .ok_or_else(|| "the peer's DCT is not known yet".to_string())?;
        self.dci
            .post_send(wr, ah, *dct, KEY)
            .map_err(|e| e.to_string())
    }
}

/// Times one 8-octet RDMA Read from `local` (offset in `mr`) to the
/// peer's `raddr`/`rkey` over a connection that does not exist yet: post
/// to completion, invitation and connection set-up included. Must be the
/// DCI's first work request (it polls `cq` for this completion alone).
pub(crate) fn first_message(
    q: &DcQp,
    cq: &CompletionQueue,
    mr: &MemoryRegion,
    local: usize,
    raddr: u64,
    rkey: u32,
) -> io::Result<Duration> {
    let s = mr.sge(local, 8);
    let wr = SendWr {
        wr_id: PROBE_ID,
        op: SendOp::Read {
            remote_addr: raddr,
            rkey,
        },
        payload: Payload::Sgl(SgList::single(s.addr, s.length, s.lkey)),
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    };
    let t0 = Instant::now();
    q.post_send(wr)
        .map_err(|e| err(format!("first message: post_send: {e}")))?;
    let mut out = [Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }; 8];
    loop {
        let n = cq.poll(&mut out);
        for c in &out[..n] {
            if c.wc.wr_id != PROBE_ID {
                continue;
            }
            if c.wc.status != WcStatus::Success {
                return Err(err(format!(
                    "first message: completion error {:?}",
                    c.wc.status
                )));
            }
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > PROBE_LIMIT {
            return Err(err(format!(
                "first message: no completion within {} s",
                PROBE_LIMIT.as_secs()
            )));
        }
        if n == 0 {
            std::hint::spin_loop();
        }
    }
}

/// A duration in µs, as the result's `first_msg_us` holds it.
pub(crate) fn micros(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1e3
}

/// The note of a DC cell: what `first_msg_us` measured, apart from the
/// steady-state figure. `other`: the runner's own note, kept after it.
pub(crate) fn note(other: &str) -> String {
    let mut s = String::from(
        "first_msg_us: 8 B Read to a new DCT, post to completion, invitation and \
         connection set-up included; the cell's figure is steady state",
    );
    if !other.is_empty() {
        s.push_str("; ");
        s.push_str(other);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn note_and_figure() {
        assert_eq!(micros(Duration::from_micros(1234)), 1234.0);
        let n = note("counted at A");
        assert!(n.starts_with("first_msg_us: "), "{n}");
        assert!(n.ends_with("; counted at A"), "{n}");
        assert_eq!(note("").matches(';').count(), 1);
    }
}
