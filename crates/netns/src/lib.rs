//! Two hosts on one machine: a pair of network namespaces joined by a veth
//! link, with kernel packet loss injected by nftables
//! (`numgen random mod 1000 < N drop`).
//!
//! `softrdma perf loss` runs its two ends in such a pair, and the engine's
//! datagram tests use it (through `softrdma_sim::netns`, which re-exports
//! this crate).
//!
//! Contract: everything a [`NetPair`] creates — the two namespaces, the
//! veth link, one nftables table per namespace — is removed when it is
//! dropped (deleting a namespace removes its devices and tables). Names
//! carry the process id and a per-process counter, so pairs made at once
//! by parallel tests or processes never share a namespace. The addresses
//! (10.231.k.1 and 10.231.k.2) exist only inside the namespaces this code
//! creates. The work is done by the `ip` and `nft` commands, which must be
//! installed; creating namespaces needs root (CAP_SYS_ADMIN and
//! CAP_NET_ADMIN). Where that fails, [`NetPair::create`] returns an error;
//! a test reports it as a skip ([`NetPair::for_test`]) — except under
//! `CI=true`, where such tests must run, so it fails instead.

#![forbid(unsafe_code)]

use std::net::Ipv4Addr;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Two namespaces, "a" and "b", joined by veth.
#[derive(Debug)]
pub struct NetPair {
    /// Namespace names.
    pub ns: [String; 2],
    /// Addresses of "a" and "b" on the veth link.
    pub addr: [Ipv4Addr; 2],
    /// The veth device in each namespace.
    veth: [String; 2],
    loss_permille: [u32; 2],
}

fn run(args: &[&str]) -> Result<Output, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out)
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl NetPair {
    /// Creates the pair with no loss.
    pub fn create() -> Result<NetPair, String> {
        // One number per pair, taken once: names built from a second
        // read of the counter could be the same for two pairs created at
        // once (parallel tests), and one pair's cleanup then removed the
        // other's namespaces ("Invalid netns value").
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let k = (std::process::id() % 200) * 7 + n % 7;
        let tag = format!("srdma{}x{}", std::process::id(), n + 1);
        let ns = [format!("{tag}a"), format!("{tag}b")];
        let subnet = (k % 250) as u8 + 1;
        let addr = [
            Ipv4Addr::new(10, 231, subnet, 1),
            Ipv4Addr::new(10, 231, subnet, 2),
        ];
        // Interface names are limited to 15 characters.
        let (va, vb) = (short(&format!("{tag}va")), short(&format!("{tag}vb")));
        let pair = NetPair {
            ns: ns.clone(),
            addr,
            veth: [va.clone(), vb.clone()],
            loss_permille: [0, 0],
        };
        // From here on, Drop cleans up whatever was made.
        run(&["ip", "netns", "add", &ns[0]])?;
        run(&["ip", "netns", "add", &ns[1]])?;
        run(&[
            "ip", "link", "add", &va, "netns", &ns[0], "type", "veth", "peer", "name", &vb,
            "netns", &ns[1],
        ])?;
        for (i, (n, v)) in [(&ns[0], &va), (&ns[1], &vb)].into_iter().enumerate() {
            let cidr = format!("{}/24", addr[i]);
            run(&["ip", "-n", n, "addr", "add", &cidr, "dev", v])?;
            run(&["ip", "-n", n, "link", "set", v, "up", "mtu", "1500"])?;
            run(&["ip", "-n", n, "link", "set", "lo", "up"])?;
            // An nftables table whose loss rule is set by set_loss.
            run(&[
                "ip", "netns", "exec", n, "nft", "add", "table", "inet", "srdma",
            ])?;
            run(&[
                "ip",
                "netns",
                "exec",
                n,
                "nft",
                "add",
                "chain",
                "inet",
                "srdma",
                "in",
                "{ type filter hook input priority 0 ; }",
            ])?;
        }
        Ok(pair)
    }

    /// For a test: the pair, or `None` with a printed reason when namespaces
    /// cannot be created here. Under `CI=true` it panics instead, because
    /// CI can create namespaces and these tests must run there.
    pub fn for_test(test: &str) -> Option<NetPair> {
        match NetPair::create() {
            Ok(p) => Some(p),
            Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
                eprintln!("{test}: SKIPPED: cannot create network namespaces here ({e})");
                None
            }
            Err(e) => panic!("{test}: cannot create network namespaces under CI: {e}"),
        }
    }

    /// Drops `permille`/1000 of the packets arriving in namespace `side`
    /// (0 = "a", 1 = "b"), chosen at random by the kernel.
    pub fn set_loss(&mut self, side: usize, permille: u32) -> Result<(), String> {
        let n = &self.ns[side];
        run(&[
            "ip", "netns", "exec", n, "nft", "flush", "chain", "inet", "srdma", "in",
        ])?;
        if permille > 0 {
            // numgen yields 0..=999, so 1000 ‰ is a plain drop.
            let rule = if permille >= 1000 {
                "counter drop".to_string()
            } else {
                format!("numgen random mod 1000 < {permille} counter drop")
            };
            run(&[
                "ip", "netns", "exec", n, "nft", "add", "rule", "inet", "srdma", "in", &rule,
            ])?;
        }
        self.loss_permille[side] = permille;
        Ok(())
    }

    /// Sets the MTU of `side`'s veth device (1500 when created). Set both
    /// sides alike: each end sizes what it sends by its own device.
    pub fn set_mtu(&mut self, side: usize, mtu: u32) -> Result<(), String> {
        let mtu = mtu.to_string();
        run(&[
            "ip",
            "-n",
            &self.ns[side],
            "link",
            "set",
            "dev",
            &self.veth[side],
            "mtu",
            &mtu,
        ])?;
        Ok(())
    }

    /// The veth device of `side` (in namespace `ns[side]`).
    pub fn veth(&self, side: usize) -> &str {
        &self.veth[side]
    }

    /// The loss set on `side`.
    pub fn loss(&self, side: usize) -> u32 {
        self.loss_permille[side]
    }

    /// Packets the loss rule of `side` dropped so far.
    pub fn dropped(&self, side: usize) -> u64 {
        let Ok(out) = run(&[
            "ip",
            "netns",
            "exec",
            &self.ns[side],
            "nft",
            "list",
            "chain",
            "inet",
            "srdma",
            "in",
        ]) else {
            return 0;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        text.split("packets ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// A command that runs `program` inside namespace `side`.
    pub fn command(&self, side: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns[side]]).arg(program);
        c
    }
}

fn short(name: &str) -> String {
    // Keep the distinguishing tail within the 15-character limit.
    let n = name.len();
    if n <= 15 {
        name.to_string()
    } else {
        name[n - 15..].to_string()
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        for n in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_loss_and_cleanup() {
        let Some(mut p) = NetPair::for_test("pair_loss_and_cleanup") else {
            return;
        };
        let ns = p.ns.clone();
        // b reaches a over the veth link.
        let ping = |p: &NetPair, count: &str| {
            p.command(1, "ping")
                .args([
                    "-c",
                    count,
                    "-i",
                    "0.01",
                    "-W",
                    "1",
                    "-q",
                    &p.addr[0].to_string(),
                ])
                .output()
                .unwrap()
        };
        if Command::new("ping").arg("-V").output().is_err() {
            eprintln!("ping not installed: only the loss-rule plumbing is checked");
        } else {
            assert!(ping(&p, "3").status.success(), "veth link works");
        }
        p.set_loss(0, 1000).unwrap();
        assert_eq!(p.loss(0), 1000);
        if Command::new("ping").arg("-V").output().is_ok() {
            assert!(
                !ping(&p, "2").status.success(),
                "100 % loss drops everything"
            );
            assert!(p.dropped(0) >= 2, "the rule counted its drops");
        }
        p.set_loss(0, 0).unwrap();
        p.set_mtu(0, 9000).unwrap();
        let show = p
            .command(0, "ip")
            .args(["link", "show", "dev", p.veth(0)])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&show.stdout).contains("mtu 9000"));
        drop(p);
        let list = String::from_utf8_lossy(
            &Command::new("ip")
                .args(["netns", "list"])
                .output()
                .unwrap()
                .stdout,
        )
        .into_owned();
        assert!(
            !list.contains(&ns[0]) && !list.contains(&ns[1]),
            "namespaces removed: {list}"
        );
    }
}
