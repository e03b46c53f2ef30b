//! `softrdma perf loss`: goodput under random packet loss.
//!
//! Two network namespaces joined by veth ([`softrdma_sim::netns::NetPair`],
//! needs root), nftables dropping a given share of the packets entering
//! each namespace (both directions: data and acknowledgements), veth GSO
//! off (`gso_max_segs 1`) so a loss hits one datagram or TCP segment as it
//! would on a NIC. For each message size and loss rate, one sender process
//! in namespace "a" and one receiver process in namespace "b" (this binary
//! re-run with hidden `--role` arguments under `ip netns exec`) measure
//! the goodput of UD Send, UD Write-Record, RD Write and RC Write — octets
//! delivered intact to the application per second; how each is counted is
//! in `loss_roles.rs`.
//!
//! UD has no flow control: a UD sender that outruns its receiver measures
//! receive overrun, not loss. So UD Send and UD Write-Record are offered
//! the same paced rate (`--rate`, default half the lossless Write-Record
//! goodput measured at the start of the run); RD and RC are reliable and
//! self-clocked, so they run unpaced. Each transport's "kept" column is its
//! goodput as a share of its own lossless figure, which is what the seed
//! claim ("Write-Record keeps its bandwidth under loss where Send
//! collapses") is judged by.
//!
//! Output: the table on stdout, progress on stderr, and in `--out DIR`
//! `loss.md`, `loss.csv` and one PNG per message size. Namespaces are
//! removed at the end, on error, and when the process is killed (a guard
//! process). Exit status: 0 done (points that failed are listed as such),
//! 1 could not run (not root, no namespaces), 2 bad arguments.

#[path = "loss_proc.rs"]
pub(super) mod proc;
#[path = "loss_roles.rs"]
mod roles;

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use softrdma_sim::netns::NetPair;

use self::proc::{is_root, load_note, progress, role_command, Kv, NetnsGuard, Proc};
use self::roles::Kind;
use super::plot::{write_png, Chart, Series};

const USAGE: &str = "usage: softrdma perf loss [--quick] [--out DIR] [--losses P,P,…] \
[--sizes S,S,…] [--transports T,T,…] [--duration SECS] [--rate GBIT/S]

Goodput (octets delivered intact per second) of UD Send, UD Write-Record,
RD Write and RC Write between two network namespaces with nftables random
drop at each loss rate (percent, both directions). Needs root.

  --quick          losses 0,1,5 and 1 s per point (default: 0,0.1,0.5,1,2,5 and 2 s)
  --out DIR        write loss.md, loss.csv and PNG plots there (default perf-loss)
  --losses LIST    loss rates in percent, 0..100 in steps of 0.1
  --sizes LIST     message sizes in octets (k/m suffixes: 64k,1m; default 64k,1m)
  --transports LIST  of ud_send, ud_write_record, rd_write, rc_write, raw_tcp
                   (default all)
  --duration SECS  measuring window per point (the raw TCP baseline's is
                   longer, at most 5x, until it counted 8 messages: a TCP
                   retransmission stall can outlast a short window)
  --rate GBIT/S    offered rate of the UD senders (default: half the lossless
                   Write-Record goodput, measured first)
  --tcp-cc NAME|system  TCP congestion control of RC's and raw TCP's
                   connections (default cubic if the kernel allows it;
                   system keeps the host's default)";

/// One transport of the table (table-driven: add a row to add one).
struct Transport {
    kind: Kind,
    label: &'static str,
}

const TRANSPORTS: &[Transport] = &[
    Transport {
        kind: Kind::UdSend,
        label: "UD Send",
    },
    Transport {
        kind: Kind::UdWriteRecord,
        label: "UD Write-Record",
    },
    Transport {
        kind: Kind::RdWrite,
        label: "RD Write",
    },
    Transport {
        kind: Kind::RcWrite,
        label: "RC Write",
    },
    Transport {
        kind: Kind::RawTcp,
        label: "raw TCP (baseline)",
    },
];

#[derive(Debug)]
struct Args {
    quick: bool,
    out: PathBuf,
    losses_permille: Vec<u32>,
    sizes: Vec<usize>,
    kinds: Vec<Kind>,
    duration: f64,
    rate: Option<f64>,
}

/// Parses a size with an optional k/m suffix (binary).
pub(super) fn parse_size(s: &str) -> Result<usize, String> {
    let l = s.to_ascii_lowercase();
    let (num, mul) = if let Some(n) = l.strip_suffix('k') {
        (n, 1 << 10)
    } else if let Some(n) = l.strip_suffix('m') {
        (n, 1 << 20)
    } else {
        (l.as_str(), 1)
    };
    let n: usize = num.parse().map_err(|_| format!("bad size '{s}'"))?;
    match n.checked_mul(mul) {
        Some(v) if v > 0 => Ok(v),
        _ => Err(format!("bad size '{s}'")),
    }
}

fn parse(args: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args {
        quick: false,
        out: PathBuf::from("perf-loss"),
        losses_permille: Vec::new(),
        sizes: vec![64 << 10, 1 << 20],
        kinds: TRANSPORTS.iter().map(|t| t.kind).collect(),
        duration: 0.0,
        rate: None,
    };
    let (mut losses, mut duration) = (None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--quick" => a.quick = true,
            "--out" => a.out = PathBuf::from(val("--out")?),
            "--losses" => {
                let v = val("--losses")?;
                let mut l = Vec::new();
                for p in v.split(',') {
                    let pct: f64 = p
                        .trim()
                        .parse()
                        .map_err(|_| format!("bad loss rate '{p}'"))?;
                    if !(0.0..=100.0).contains(&pct) {
                        return Err(format!("loss rate {p} % outside 0..100"));
                    }
                    let pm = (pct * 10.0).round();
                    if (pm - pct * 10.0).abs() > 1e-6 {
                        return Err(format!("loss rate {p} %: steps of 0.1 % only"));
                    }
                    l.push(pm as u32);
                }
                losses = Some(l);
            }
            "--sizes" => {
                let v = val("--sizes")?;
                a.sizes = v
                    .split(',')
                    .map(|s| parse_size(s.trim()))
                    .collect::<Result<_, _>>()?;
                if let Some(&s) = a.sizes.iter().find(|&&s| s > 16 << 20) {
                    return Err(format!("size {s}: at most 16 MiB"));
                }
            }
            "--transports" => {
                let v = val("--transports")?;
                a.kinds = v
                    .split(',')
                    .map(|s| {
                        Kind::from_key(s.trim()).ok_or_else(|| {
                            format!(
                                "unknown transport '{s}' (one of {})",
                                TRANSPORTS
                                    .iter()
                                    .map(|t| t.kind.key())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        })
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--duration" => {
                let v = val("--duration")?;
                let d: f64 = v.parse().map_err(|_| format!("bad duration '{v}'"))?;
                if !(0.05..=600.0).contains(&d) {
                    return Err(format!("duration {v}: 0.05..600 seconds"));
                }
                duration = Some(d);
            }
            "--rate" => {
                let v = val("--rate")?;
                let r: f64 = v.parse().map_err(|_| format!("bad rate '{v}'"))?;
                if !(r > 0.0 && r < 1000.0) {
                    return Err(format!("rate {v}: Gbit/s, above 0 and below 1000"));
                }
                a.rate = Some(r * 1e9 / 8.0);
            }
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    a.losses_permille = losses.unwrap_or_else(|| {
        if a.quick {
            vec![0, 10, 50]
        } else {
            vec![0, 1, 5, 10, 20, 50]
        }
    });
    a.duration = duration.unwrap_or(if a.quick { 1.0 } else { 2.0 });
    Ok(Some(a))
}

/// Entry point of `softrdma perf loss ARGS`.
pub fn main(args: &[String]) -> ExitCode {
    if args.first().map(String::as_str) == Some("--role") {
        let role = args.get(1).map(String::as_str).unwrap_or("");
        let kv = Kv::parse(args.iter().skip(2).map(String::as_str));
        return if roles::run(role, &kv) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let a = match parse(args) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("softrdma perf loss: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if !is_root() {
        eprintln!(
            "softrdma perf loss: needs root (it creates network namespaces, a veth link and \
             nftables rules); run it with sudo"
        );
        return ExitCode::FAILURE;
    }
    match run(&a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("softrdma perf loss: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The measured figure of one point.
#[derive(Debug, Clone)]
struct Row {
    kind: Kind,
    size: usize,
    permille: u32,
    /// Octets per second, or why the point failed.
    goodput: Result<f64, String>,
    /// UD: the rate the sender offered.
    offered: Option<f64>,
    /// Packets the nftables rules dropped during the point.
    dropped: u64,
    detail: String,
}

struct Env {
    pair: NetPair,
}

impl Env {
    fn addr(&self, side: usize) -> Ipv4Addr {
        self.pair.addr[side]
    }

    fn spawn(&self, side: usize, role: &str, args: Vec<String>) -> Result<Proc, String> {
        let cmd = role_command(Some(&self.pair.ns[side]), None, "loss", role, &args)?;
        Proc::spawn(cmd, &format!("loss {role} ({})", args.join(" ")))
    }

    fn set_loss(&mut self, permille: u32) -> Result<(), String> {
        self.pair.set_loss(0, permille)?;
        self.pair.set_loss(1, permille)
    }

    fn dropped(&self) -> u64 {
        self.pair.dropped(0) + self.pair.dropped(1)
    }
}

fn gbit(octets_per_s: f64) -> f64 {
    octets_per_s * 8.0 / 1e9
}

fn size_name(size: usize) -> String {
    if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{} MiB", size >> 20)
    } else if size >= 1 << 10 && size.is_multiple_of(1 << 10) {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

fn pct(permille: u32) -> String {
    format!("{}", permille as f64 / 10.0)
}

fn label(kind: Kind) -> &'static str {
    TRANSPORTS
        .iter()
        .find(|t| t.kind == kind)
        .map_or("?", |t| t.label)
}

fn run(a: &Args) -> Result<(), String> {
    let start = Instant::now();
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let pair = NetPair::create().map_err(|e| format!("cannot create network namespaces: {e}"))?;
    let _guard = NetnsGuard::new(&pair.ns)?;
    for side in 0..2 {
        // One datagram or TCP segment per packet on the link, so a drop
        // hits one of them (veth would otherwise carry whole GSO runs).
        let out = Command::new("ip")
            .args(["-n", &pair.ns[side], "link", "set", "dev", pair.veth(side)])
            .args(["gso_max_segs", "1"])
            .output()
            .map_err(|e| format!("ip link set gso_max_segs: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ip link set gso_max_segs 1: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    let mut env = Env { pair };
    let load_before = load_note();
    progress(
        start,
        &format!(
            "namespaces {} / {} ready ({} / {}), {} points of {:.1} s",
            env.pair.ns[0],
            env.pair.ns[1],
            env.addr(0),
            env.addr(1),
            a.sizes.len() * a.losses_permille.len() * a.kinds.len(),
            a.duration
        ),
    );
    let mut rows = Vec::new();
    let mut rates = Vec::new();
    for &size in &a.sizes {
        let rate = match a.rate {
            Some(r) => r,
            None => {
                progress(
                    start,
                    &format!(
                        "{}: calibrating the UD offered rate (Write-Record, unpaced, 0 %)",
                        size_name(size)
                    ),
                );
                env.set_loss(0)?;
                let d = a.duration.min(1.0);
                match point(&env, Kind::UdWriteRecord, size, d, 0.0) {
                    Ok((g, _, _)) if g > 0.0 => g / 2.0,
                    Ok(_) => return Err("calibration: Write-Record delivered nothing".into()),
                    Err(e) => return Err(format!("calibration: {e}")),
                }
            }
        };
        rates.push((size, rate));
        progress(
            start,
            &format!(
                "{}: UD senders offered {:.2} Gbit/s",
                size_name(size),
                gbit(rate)
            ),
        );
        for &pm in &a.losses_permille {
            env.set_loss(pm)?;
            for &kind in &a.kinds {
                let before = env.dropped();
                let r = if kind.paced() { rate } else { 0.0 };
                let res = point(&env, kind, size, a.duration, r);
                let dropped = env.dropped().saturating_sub(before);
                let row = match res {
                    Ok((g, offered, detail)) => Row {
                        kind,
                        size,
                        permille: pm,
                        goodput: Ok(g),
                        offered,
                        dropped,
                        detail,
                    },
                    Err(e) => Row {
                        kind,
                        size,
                        permille: pm,
                        goodput: Err(e),
                        offered: None,
                        dropped,
                        detail: String::new(),
                    },
                };
                progress(
                    start,
                    &format!(
                        "{} {} at {} %: {} ({} packets dropped)",
                        label(kind),
                        size_name(size),
                        pct(pm),
                        match &row.goodput {
                            Ok(g) => format!("{:.3} Gbit/s", gbit(*g)),
                            Err(e) => format!("FAILED: {e}"),
                        },
                        dropped
                    ),
                );
                rows.push(row);
            }
        }
    }
    env.set_loss(0)?;
    drop(env);
    report(a, &rows, &rates, start, &load_before)
}

/// Runs one point; returns (goodput octets/s, offered octets/s, detail).
fn point(
    env: &Env,
    kind: Kind,
    size: usize,
    dur: f64,
    rate: f64,
) -> Result<(f64, Option<f64>, String), String> {
    let warm = 0.3;
    let base = vec![
        format!("kind={}", kind.key()),
        format!("size={size}"),
        format!("dur={dur}"),
        format!("warm={warm}"),
    ];
    let mut rargs = base.clone();
    rargs.push(format!("ip={}", env.addr(1)));
    let mut rx = env.spawn(1, "recv", rargs)?;
    let ready = rx.expect("ready", Duration::from_secs(30))?;
    let mut sargs = base;
    sargs.extend([
        format!("ip={}", env.addr(0)),
        format!("to={}", env.addr(1)),
        format!("port={}", ready.get::<u16>("port")?),
        format!("qpn={}", ready.get::<u32>("qpn")?),
        format!("stag={}", ready.get::<u32>("stag")?),
        format!("base={}", ready.get::<u64>("base")?),
        format!("rate={rate}"),
    ]);
    let mut tx = env.spawn(0, "send", sargs)?;
    let long = Duration::from_secs_f64(warm + 5.0 * dur + 150.0);
    if kind.receiver_measures() {
        tx.expect("started", Duration::from_secs(30))?;
        rx.tell("go")?;
        let res = rx.expect("result", long)?;
        // The sender may be gone already (raw TCP ends on the closed stream).
        let _ = tx.tell("stop");
        let sent = tx.expect("sent", Duration::from_secs(30))?;
        let bad: u64 = res.get("bad")?;
        if bad > 0 {
            return Err(format!("{bad} delivered messages had wrong contents"));
        }
        let g = res.get::<f64>("bytes")? / res.get::<f64>("secs")?;
        let mut detail = format!("{} msgs counted", res.get::<u64>("msgs")?);
        if let (Some(t), Some(e)) = (res.raw("reasm_timeouts"), res.raw("evicted")) {
            let _ = write!(detail, ", {t} reassembly timeouts, {e} evicted");
        }
        if let Some(p) = res.raw("partial") {
            let _ = write!(detail, ", {p} partial");
        }
        match res.raw("not_recorded") {
            Some(n) if n != "0" => {
                let _ = write!(
                    detail,
                    ", {n} segments placed but not recorded (a message with more holes than RecordConfig::max_fragments)"
                );
            }
            _ => {}
        }
        let errors: u64 = sent.get_or("errors", 0)?;
        if errors > 0 {
            let _ = write!(detail, ", {errors} send errors");
        }
        let offered = kind.paced().then_some(sent.get("rate")?);
        Ok((g, offered, detail))
    } else {
        let res = tx.expect("result", long)?;
        let _ = rx.tell("stop");
        let chk = rx.expect("checked", Duration::from_secs(30))?;
        if chk.get::<u8>("ok")? != 1 {
            return Err("the target's memory does not hold what was written".into());
        }
        let g = res.get::<f64>("bytes")? / res.get::<f64>("secs")?;
        Ok((
            g,
            None,
            format!("{} msgs before the final Read", res.get::<u64>("msgs")?),
        ))
    }
}

/// The goodput of `kind` at `size` without loss, if measured.
fn lossless(rows: &[Row], kind: Kind, size: usize) -> Option<f64> {
    rows.iter()
        .find(|r| r.kind == kind && r.size == size && r.permille == 0)
        .and_then(|r| r.goodput.as_ref().ok().copied())
}

/// The verdict on the seed claim, one line per size.
fn verdict(rows: &[Row], sizes: &[usize]) -> Vec<String> {
    let mut out = Vec::new();
    for &size in sizes {
        let (Some(w0), Some(s0)) = (
            lossless(rows, Kind::UdWriteRecord, size),
            lossless(rows, Kind::UdSend, size),
        ) else {
            out.push(format!(
                "{}: not judged (needs UD Send and UD Write-Record at 0 % loss)",
                size_name(size)
            ));
            continue;
        };
        let lossy: Vec<(u32, f64, f64)> = rows
            .iter()
            .filter(|r| r.size == size && r.kind == Kind::UdWriteRecord && r.permille >= 10)
            .filter_map(|w| {
                let s = rows.iter().find(|s| {
                    s.size == size && s.kind == Kind::UdSend && s.permille == w.permille
                })?;
                Some((
                    w.permille,
                    *w.goodput.as_ref().ok()? / w0,
                    *s.goodput.as_ref().ok()? / s0,
                ))
            })
            .collect();
        if lossy.is_empty() || w0 <= 0.0 || s0 <= 0.0 {
            out.push(format!(
                "{}: not judged (no loss point >= 1 % measured for both)",
                size_name(size)
            ));
            continue;
        }
        // Per point: Write-Record keeps >= 80 % of its lossless goodput and
        // Send keeps <= 50 % of its own.
        let holds = |&(_, w, s): &(u32, f64, f64)| w >= 0.8 && s <= 0.5;
        let at_worst = lossy.iter().max_by_key(|p| p.0).is_some_and(holds);
        let never_behind = lossy.iter().all(|&(_, w, s)| w >= s);
        let n_hold = lossy.iter().filter(|p| holds(p)).count();
        let word = if at_worst && never_behind {
            "REPRODUCED"
        } else if n_hold > 0 {
            "PARTLY REPRODUCED"
        } else {
            "REFUTED"
        };
        let figures: Vec<String> = lossy
            .iter()
            .map(|p| {
                format!(
                    "{} %: Write-Record keeps {:.0} %, Send {:.0} %{}",
                    pct(p.0),
                    p.1 * 100.0,
                    p.2 * 100.0,
                    if holds(p) {
                        " (holds)"
                    } else {
                        " (does not hold)"
                    }
                )
            })
            .collect();
        out.push(format!(
            "{}: claim {word} — {}",
            size_name(size),
            figures.join("; ")
        ));
    }
    out.push(
        "(holds = Write-Record keeps at least 80 % of its lossless goodput while UD Send keeps \
         at most 50 % of its own; REPRODUCED = holds at the highest loss measured and \
         Write-Record is never behind Send; PARTLY = holds at some loss points only)"
            .into(),
    );
    out
}

fn report(
    a: &Args,
    rows: &[Row],
    rates: &[(usize, f64)],
    start: Instant,
    load_before: &str,
) -> Result<(), String> {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# softrdma perf loss\n\nGoodput in Gbit/s (octets delivered intact to the application \
         per second) between two network namespaces over veth (MTU 1500, GSO off), nftables \
         random drop in both directions. UD senders paced at the offered rate; RD and RC \
         unpaced (reliable). `kept` = share of the same transport's lossless goodput. \
         RC's connections (and raw TCP's): {}.\n",
        super::tcp_cc::describe()
    );
    for &(size, rate) in rates {
        let _ = writeln!(
            md,
            "- {}: UD offered {:.2} Gbit/s",
            size_name(size),
            gbit(rate)
        );
    }
    let _ = writeln!(
        md,
        "\n| size | loss % | transport | goodput Gbit/s | kept | offered Gbit/s | drops | notes |\n\
         |---|---|---|---|---|---|---|---|"
    );
    let mut csv =
        String::from("size,loss_pct,transport,goodput_gbps,kept,offered_gbps,dropped,error\n");
    for r in rows {
        let base = lossless(rows, r.kind, r.size);
        let (g, kept) = match &r.goodput {
            Ok(g) => (
                format!("{:.3}", gbit(*g)),
                base.filter(|b| *b > 0.0)
                    .map_or("-".into(), |b| format!("{:.0} %", g / b * 100.0)),
            ),
            Err(_) => ("FAILED".into(), "-".into()),
        };
        let offered = r.offered.map_or("-".into(), |o| format!("{:.2}", gbit(o)));
        let note = match &r.goodput {
            Ok(_) => r.detail.clone(),
            Err(e) => e.clone(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {g} | {kept} | {offered} | {} | {} |",
            size_name(r.size),
            pct(r.permille),
            label(r.kind),
            r.dropped,
            note.replace('|', "/")
        );
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{}",
            r.size,
            pct(r.permille),
            r.kind.key(),
            r.goodput
                .as_ref()
                .map_or(String::new(), |g| format!("{:.4}", gbit(*g))),
            match (&r.goodput, base) {
                (Ok(g), Some(b)) if b > 0.0 => format!("{:.4}", g / b),
                _ => String::new(),
            },
            r.offered
                .map_or(String::new(), |o| format!("{:.4}", gbit(o))),
            r.dropped,
            r.goodput
                .as_ref()
                .err()
                .map_or(String::new(), |e| e.replace([',', '\n'], ";"))
        );
    }
    let verdicts = verdict(rows, &a.sizes);
    let _ = writeln!(
        md,
        "\n## Seed claim: Write-Record keeps its bandwidth under loss where Send collapses\n"
    );
    for v in &verdicts {
        let _ = writeln!(md, "- {v}");
    }
    let _ = writeln!(
        md,
        "\nBefore the run: {load_before}; after: {}.",
        load_note()
    );
    print!("{md}");
    write_file(&a.out.join("loss.md"), &md)?;
    write_file(&a.out.join("loss.csv"), &csv)?;
    for &size in &a.sizes {
        let series: Vec<Series> = a
            .kinds
            .iter()
            .map(|&k| Series {
                name: label(k).to_string(),
                points: rows
                    .iter()
                    .filter(|r| r.kind == k && r.size == size)
                    .filter_map(|r| {
                        Some((r.permille as f64 / 10.0, gbit(*r.goodput.as_ref().ok()?)))
                    })
                    .collect(),
            })
            .collect();
        let title = format!("Goodput vs loss, {} messages", size_name(size));
        let chart = Chart {
            title: &title,
            x_label: "loss (%)",
            y_label: "goodput (Gbit/s)",
            log_x: false,
            log_y: false,
            series: &series,
        };
        let path = a
            .out
            .join(format!("loss_{}.png", size_name(size).replace(' ', "")));
        match write_png(&chart, &path) {
            Ok(()) => progress(start, &format!("wrote {}", path.display())),
            Err(e) => progress(start, &format!("plot {}: FAILED: {e}", path.display())),
        }
    }
    progress(
        start,
        &format!("done; wrote {}/loss.md and loss.csv", a.out.display()),
    );
    Ok(())
}

pub(super) fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}
