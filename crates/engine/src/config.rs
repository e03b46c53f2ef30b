//! Configuration from `SOFTRDMA_*` environment variables (documented in
//! README.md). Values are read once when a context is created; an invalid
//! value is an error that names the variable, never silently ignored.

use std::time::Duration;

/// How receive progress is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// Progress thread and inline from `poll_cq` (default).
    Both,
    /// Only the progress thread.
    Thread,
}

/// The knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `SOFTRDMA_MPA_CRC=0|1` (default 1): ask for CRC32C.
    pub mpa_crc: bool,
    /// `SOFTRDMA_MPA_CRC_DIRECT=0|1` (default 1): with CRC, read the
    /// payload of an FPDU that arrives in parts straight into place and
    /// check the CRC at its end, as siw and RNICs do (nothing of the FPDU
    /// completes before; a mismatch terminates the connection), instead of
    /// keeping every FPDU until whole and verified — which costs a copy.
    pub mpa_crc_direct: bool,
    /// `SOFTRDMA_MPA_MARKERS=0|1` (default 0): ask to receive markers.
    pub mpa_markers: bool,
    /// `SOFTRDMA_MPA_P2P=0|1` (default 1): offer/accept peer-to-peer mode.
    pub mpa_p2p: bool,
    /// `SOFTRDMA_MPA_REV=1|2` (default 2).
    pub mpa_rev: u8,
    /// `SOFTRDMA_MAX_FPDU=N` (default: from the connection's MSS): cap on
    /// the FPDU size we send, in octets (64 … 65535).
    pub max_fpdu: Option<usize>,
    /// `SOFTRDMA_PROGRESS=both|thread` (default both).
    pub progress: ProgressMode,
    /// `SOFTRDMA_MPA_TIMEOUT_MS=N` (default 10000).
    pub mpa_timeout: Duration,
    /// `SOFTRDMA_CONNECT_RETRY_MS=N` (default 1000): how long an active
    /// connect keeps trying while the peer refuses the TCP connection (no
    /// listener on the port, yet or any more) before it reports the
    /// refusal; 0 reports it at once, as a kernel iWARP stack does. A server
    /// that closes one listener and opens another on the same port (perftest
    /// `-R`: one for its parameter exchange, one for the test's QPs) leaves
    /// a gap a prompt client falls into, and clients that answer a refusal
    /// by retrying do not all survive it (`cm_events` module docs).
    pub connect_retry: Duration,
    /// `SOFTRDMA_RTR_HOLDOFF_US=N` (default 5000): after an MPA Reply from
    /// a peer that is not softrdma, wait this long before the first FPDU
    /// (siw switches its socket to the QP only after sending the Reply, so an
    /// FPDU sent at once can reach siw's connection manager instead).
    pub rtr_holdoff: Duration,
    /// `SOFTRDMA_DGRAM_MTU=N` (default 1500): the path MTU datagram QPs
    /// size their segments for (IP + UDP + header + payload + CRC ≤ N;
    /// 128 … 65535). Datagrams go out with DF set, so a value above the
    /// real path MTU makes large sends fail instead of fragmenting; on
    /// loopback (MTU 65536) 65535 is safe.
    pub dgram_mtu: usize,
    /// `SOFTRDMA_MCAST_PORT=N` (default 18516): the UDP port multicast
    /// groups are addressed on; every context with a QP attached to a
    /// group listens on it (`dgram` module documentation).
    pub mcast_port: u16,
    /// `SOFTRDMA_DGRAM_OFFLOAD=0|1` (default 1): send runs of equal-sized
    /// datagrams as UDP GSO messages and receive with UDP GRO.
    pub dgram_offload: bool,
    /// `SOFTRDMA_TCP_CONGESTION=NAME` (default: unset, the system's
    /// `net.ipv4.tcp_congestion_control`): the TCP congestion control
    /// algorithm of every connection an RC QP runs on (`TCP_CONGESTION`,
    /// set on a connecting socket before its SYN and on listening sockets,
    /// whose connections inherit it: a connection established under the
    /// system's default has run that algorithm's initialisation, and bbr's
    /// leaves the kernel's pacing on after a switch). The name must be one the kernel allows this process
    /// (`net.ipv4.tcp_allowed_congestion_control`, or any loaded one with
    /// `CAP_NET_ADMIN`): a context is not created otherwise.
    pub tcp_congestion: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mpa_crc: true,
            mpa_crc_direct: true,
            mpa_markers: false,
            mpa_p2p: true,
            mpa_rev: 2,
            max_fpdu: None,
            progress: ProgressMode::Both,
            mpa_timeout: Duration::from_secs(10),
            connect_retry: Duration::from_secs(1),
            rtr_holdoff: Duration::from_millis(5),
            dgram_mtu: 1500,
            mcast_port: 18516,
            dgram_offload: true,
            tcp_congestion: None,
        }
    }
}

/// Longest congestion control name the kernel takes (`TCP_CA_NAME_MAX`
/// less its terminating NUL).
pub const TCP_CONGESTION_NAME_MAX: usize = 15;

/// Checks the form of a congestion control name (1 to
/// [`TCP_CONGESTION_NAME_MAX`] octets of letters, digits, `_` and `-`);
/// whether the kernel offers it is checked when a context is made.
fn congestion_name(name: &str, v: &str) -> Result<String, String> {
    let ok = (1..=TCP_CONGESTION_NAME_MAX).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!(
            "{name}={v:?}: expected the name of a TCP congestion control algorithm \
             (1 to {TCP_CONGESTION_NAME_MAX} letters, digits, '_' or '-'), e.g. cubic"
        ))
    }
}

fn flag(name: &str, v: &str) -> Result<bool, String> {
    match v {
        "0" | "false" | "off" | "no" => Ok(false),
        "1" | "true" | "on" | "yes" => Ok(true),
        _ => Err(format!("{name}={v}: expected 0 or 1")),
    }
}

fn number(name: &str, v: &str, lo: u64, hi: u64) -> Result<u64, String> {
    match v.parse::<u64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("{name}={v}: expected a number from {lo} to {hi}")),
    }
}

impl Config {
    /// Reads the environment.
    pub fn from_env() -> Result<Config, String> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads variables through `get` (for tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let mut c = Config::default();
        if let Some(v) = get("SOFTRDMA_MPA_CRC") {
            c.mpa_crc = flag("SOFTRDMA_MPA_CRC", &v)?;
        }
        if let Some(v) = get("SOFTRDMA_MPA_CRC_DIRECT") {
            c.mpa_crc_direct = flag("SOFTRDMA_MPA_CRC_DIRECT", &v)?;
        }
        if let Some(v) = get("SOFTRDMA_MPA_MARKERS") {
            c.mpa_markers = flag("SOFTRDMA_MPA_MARKERS", &v)?;
        }
        if let Some(v) = get("SOFTRDMA_MPA_P2P") {
            c.mpa_p2p = flag("SOFTRDMA_MPA_P2P", &v)?;
        }
        if let Some(v) = get("SOFTRDMA_MPA_REV") {
            c.mpa_rev = number("SOFTRDMA_MPA_REV", &v, 1, 2)? as u8;
        }
        if let Some(v) = get("SOFTRDMA_MAX_FPDU") {
            c.max_fpdu = Some(number("SOFTRDMA_MAX_FPDU", &v, 64, 65535)? as usize);
        }
        if let Some(v) = get("SOFTRDMA_PROGRESS") {
            c.progress = match v.as_str() {
                "both" => ProgressMode::Both,
                "thread" => ProgressMode::Thread,
                _ => return Err(format!("SOFTRDMA_PROGRESS={v}: expected both or thread")),
            };
        }
        if let Some(v) = get("SOFTRDMA_MPA_TIMEOUT_MS") {
            c.mpa_timeout =
                Duration::from_millis(number("SOFTRDMA_MPA_TIMEOUT_MS", &v, 1, 3_600_000)?);
        }
        if let Some(v) = get("SOFTRDMA_CONNECT_RETRY_MS") {
            c.connect_retry =
                Duration::from_millis(number("SOFTRDMA_CONNECT_RETRY_MS", &v, 0, 3_600_000)?);
        }
        if let Some(v) = get("SOFTRDMA_RTR_HOLDOFF_US") {
            c.rtr_holdoff =
                Duration::from_micros(number("SOFTRDMA_RTR_HOLDOFF_US", &v, 0, 10_000_000)?);
        }
        if let Some(v) = get("SOFTRDMA_DGRAM_MTU") {
            c.dgram_mtu = number(
                "SOFTRDMA_DGRAM_MTU",
                &v,
                softrdma_proto::ud::MIN_MTU as u64,
                softrdma_proto::ud::MAX_MTU as u64,
            )? as usize;
        }
        if let Some(v) = get("SOFTRDMA_DGRAM_OFFLOAD") {
            c.dgram_offload = flag("SOFTRDMA_DGRAM_OFFLOAD", &v)?;
        }
        if let Some(v) = get("SOFTRDMA_MCAST_PORT") {
            c.mcast_port = number("SOFTRDMA_MCAST_PORT", &v, 1, 65535)? as u16;
        }
        if let Some(v) = get("SOFTRDMA_TCP_CONGESTION") {
            c.tcp_congestion = Some(congestion_name("SOFTRDMA_TCP_CONGESTION", &v)?);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(Config::from_lookup(env(&[])).unwrap(), Config::default());
        let c = Config::from_lookup(env(&[
            ("SOFTRDMA_MPA_CRC", "0"),
            ("SOFTRDMA_MPA_CRC_DIRECT", "0"),
            ("SOFTRDMA_MPA_REV", "1"),
            ("SOFTRDMA_PROGRESS", "thread"),
        ]))
        .unwrap();
        assert!(!c.mpa_crc && !c.mpa_crc_direct);
        assert_eq!(c.mpa_rev, 1);
        assert_eq!(c.progress, ProgressMode::Thread);
        assert!(Config::from_lookup(env(&[("SOFTRDMA_MPA_REV", "3")]))
            .unwrap_err()
            .contains("SOFTRDMA_MPA_REV"));
        assert!(Config::from_lookup(env(&[("SOFTRDMA_MPA_CRC", "maybe")])).is_err());
        assert!(Config::from_lookup(env(&[("SOFTRDMA_MPA_CRC_DIRECT", "2")])).is_err());
        assert!(Config::from_lookup(env(&[("SOFTRDMA_MAX_FPDU", "10")])).is_err());
        let c = Config::from_lookup(env(&[
            ("SOFTRDMA_DGRAM_MTU", "9000"),
            ("SOFTRDMA_MCAST_PORT", "4791"),
        ]))
        .unwrap();
        assert_eq!((c.dgram_mtu, c.mcast_port), (9000, 4791));
        assert!(
            !Config::from_lookup(env(&[("SOFTRDMA_DGRAM_OFFLOAD", "0")]))
                .unwrap()
                .dgram_offload
        );
        for bad in ["127", "65536", "x", ""] {
            assert!(Config::from_lookup(
                |k: &str| (k == "SOFTRDMA_DGRAM_MTU").then(|| bad.to_string())
            )
            .unwrap_err()
            .contains("SOFTRDMA_DGRAM_MTU"));
        }
        assert!(Config::from_lookup(env(&[("SOFTRDMA_MCAST_PORT", "0")])).is_err());
        assert_eq!(
            Config::from_lookup(env(&[("SOFTRDMA_TCP_CONGESTION", "cubic")]))
                .unwrap()
                .tcp_congestion
                .as_deref(),
            Some("cubic")
        );
        for bad in ["", "a b", "cubic\n", "sixteen_octets_x", "c/ubic"] {
            assert!(Config::from_lookup(
                |k: &str| (k == "SOFTRDMA_TCP_CONGESTION").then(|| bad.to_string())
            )
            .unwrap_err()
            .contains("SOFTRDMA_TCP_CONGESTION"));
        }
    }
}
