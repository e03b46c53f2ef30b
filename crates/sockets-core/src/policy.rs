//! Which sockets softrdma takes: the environment's rules.
//!
//! * `SOFTRDMA_SOCKETS`: `auto` (the default) accelerates every TCP
//!   connection whose other end is interposed too; `ddpmode` touches only
//!   sockets the application switches with `SOFTRDMA_DDPMODE`
//!   (`softrdma/sockets.h`), everything else goes straight to the C
//!   library; `off` leaves every socket to the kernel (the library is
//!   loaded but does nothing).
//! * `SOFTRDMA_SOCKETS_PEERS`: comma-separated `ADDR[/PREFIX][:PORT]`
//!   destinations that run softrdma on other hosts (the registry only
//!   knows this host's listeners): a client connecting there sends an MPA
//!   Request without asking the registry. A plain server there would read
//!   that Request as data: list only peers that are interposed.
//! * `SOFTRDMA_SOCKETS_UDP`: `ud` (the default) carries datagram sockets
//!   over UD (loss as UDP's), `rd` over softrdma's reliable datagrams
//!   (acknowledged and retransmitted); both ends must use the same, else
//!   their datagrams go through the kernel.
//! * `SOFTRDMA_SOCKETS_EXCLUDE`: comma-separated `ADDR[/PREFIX][:PORT]` or
//!   `:PORT` that are never accelerated, as client (destination) or server
//!   (local address).

use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;

/// One `ADDR[/PREFIX][:PORT]` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    net: Option<(IpAddr, u8)>,
    port: Option<u16>,
}

impl Rule {
    /// Parses a rule; `None` if malformed.
    pub fn parse(s: &str) -> Option<Rule> {
        let s = s.trim();
        if let Some(p) = s.strip_prefix(':') {
            return Some(Rule {
                net: None,
                port: Some(p.parse().ok()?),
            });
        }
        // `[v6]:port`, `v4:port`, `addr/prefix:port`, or a bare address.
        let (addr_part, port) = if let Some(rest) = s.strip_prefix('[') {
            let (a, tail) = rest.split_once(']')?;
            let port = match tail.strip_prefix(':') {
                Some(p) => Some(p.parse().ok()?),
                None if tail.is_empty() => None,
                None => return None,
            };
            (a.to_string(), port)
        } else if s.matches(':').count() == 1 {
            let (a, p) = s.split_once(':')?;
            (a.to_string(), Some(p.parse().ok()?))
        } else {
            (s.to_string(), None)
        };
        let (ip, prefix) = match addr_part.split_once('/') {
            Some((a, p)) => (a.parse::<IpAddr>().ok()?, p.parse::<u8>().ok()?),
            None => {
                let ip = addr_part.parse::<IpAddr>().ok()?;
                (ip, if ip.is_ipv4() { 32 } else { 128 })
            }
        };
        let max = if ip.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Rule {
            net: Some((ip, prefix)),
            port,
        })
    }

    /// Whether `a` falls under the rule.
    pub fn matches(&self, a: SocketAddr) -> bool {
        if self.port.is_some_and(|p| p != a.port()) {
            return false;
        }
        let Some((net, prefix)) = self.net else {
            return true;
        };
        let ip = match a.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => {
                let mask = if prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - prefix)
                };
                u32::from(n) & mask == u32::from(i) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(i)) => {
                let mask = if prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - prefix)
                };
                u128::from(n) & mask == u128::from(i) & mask
            }
            _ => false,
        }
    }
}

/// Parses a comma-separated list, skipping malformed entries (reported
/// once on stderr).
pub fn parse_list(s: &str) -> Vec<Rule> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .filter_map(|x| {
            let r = Rule::parse(x);
            if r.is_none() {
                eprintln!("softrdma-sockets: ignoring the malformed rule {x:?}");
            }
            r
        })
        .collect()
}

struct Policy {
    on: bool,
    /// Only opted-in sockets (`ddpmode`).
    opt_in: bool,
    peers: Vec<Rule>,
    exclude: Vec<Rule>,
}

fn policy() -> &'static Policy {
    static P: OnceLock<Policy> = OnceLock::new();
    P.get_or_init(|| {
        let mode = std::env::var("SOFTRDMA_SOCKETS").unwrap_or_default();
        let (on, opt_in) = match mode.as_str() {
            "" | "auto" => (true, false),
            "ddpmode" => (true, true),
            "off" => (false, false),
            other => {
                eprintln!(
                    "softrdma-sockets: SOFTRDMA_SOCKETS={other:?} is not auto, ddpmode or off; using off"
                );
                (false, false)
            }
        };
        let list = |k: &str| std::env::var(k).map(|v| parse_list(&v)).unwrap_or_default();
        Policy {
            on,
            opt_in,
            peers: list("SOFTRDMA_SOCKETS_PEERS"),
            exclude: list("SOFTRDMA_SOCKETS_EXCLUDE"),
        }
    })
}

/// The datagram transport of this process's UDP sockets.
pub fn udp_transport() -> crate::udp::Transport {
    static T: OnceLock<crate::udp::Transport> = OnceLock::new();
    *T.get_or_init(|| match std::env::var("SOFTRDMA_SOCKETS_UDP").as_deref() {
        Ok("rd") => crate::udp::Transport::Rd,
        Ok("wr") => crate::udp::Transport::Wr,
        Ok("ud") | Ok("") | Err(_) => crate::udp::Transport::Ud,
        Ok(other) => {
            eprintln!(
                "softrdma-sockets: SOFTRDMA_SOCKETS_UDP={other:?} is not ud, rd or wr; using ud"
            );
            crate::udp::Transport::Ud
        }
    })
}

/// Whether softrdma takes sockets at all.
pub fn enabled() -> bool {
    policy().on
}

/// Whether this process accepts accelerated connections on its
/// listeners without the application asking (`auto`).
pub fn serve() -> bool {
    let p = policy();
    p.on && !p.opt_in
}

/// Whether a connection to `a` is accelerated at `connect` (`auto`, and
/// no exclusion matches).
pub fn connect_allowed(a: SocketAddr) -> bool {
    let p = policy();
    p.on && !p.opt_in && !p.exclude.iter().any(|r| r.matches(a))
}

/// Whether the end at `dest` runs softrdma (a rule, or the registry).
pub fn peer_is_softrdma(dest: SocketAddr) -> bool {
    policy().peers.iter().any(|r| r.matches(dest)) || crate::registry::listener_at(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_match() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let r = Rule::parse("10.0.0.0/8:5000").unwrap();
        assert!(r.matches(a("10.1.2.3:5000")));
        assert!(!r.matches(a("10.1.2.3:5001")));
        assert!(!r.matches(a("11.1.2.3:5000")));
        assert!(r.matches(a("[::ffff:10.1.2.3]:5000")));
        let p = Rule::parse(":6379").unwrap();
        assert!(p.matches(a("127.0.0.1:6379")));
        assert!(!p.matches(a("127.0.0.1:6380")));
        let h = Rule::parse("192.168.1.7").unwrap();
        assert!(h.matches(a("192.168.1.7:1")));
        assert!(!h.matches(a("192.168.1.8:1")));
        let v6 = Rule::parse("[fe80::/16]:22").unwrap();
        assert!(v6.matches(a("[fe80::1]:22")));
        assert!(!v6.matches(a("[fe81::1]:22")));
        assert!(Rule::parse("10.0.0.0/33").is_none());
        assert!(Rule::parse("nonsense").is_none());
        assert_eq!(parse_list("1.2.3.4, :80,bad").len(), 2);
    }
}
