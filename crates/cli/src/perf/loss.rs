//! `softrdma perf loss`: goodput under random packet loss.
//!
//! Two network namespaces joined by veth ([`softrdma_netns::NetPair`],
//! needs root), nftables dropping a given share of the packets entering
//! each namespace (both directions: data and acknowledgements), veth GSO
//! off (`gso_max_segs 1`) so a loss hits one datagram or TCP segment as it
//! would on a NIC. For each message size and loss rate, one sender process
//! in namespace "a" and one receiver process in namespace "b" (this binary
//! re-run with hidden `--role` arguments under `ip netns exec`) measure
//! the goodput of UD Send, UD Write-Record, RD Write and RC Write — octets
//! delivered intact to the application per second; how each is counted is
//! in `loss/roles.rs`.
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

pub(super) mod proc;
mod roles;

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use softrdma_netns::NetPair;

use self::proc::{is_root, load_note, progress, role_command, Kv, NetnsGuard, Proc};
use self::roles::Kind;
use super::plot::{write_png, Chart, Series};

/// What `softrdma perf loss --help` says first.
pub(crate) const ABOUT: &str = "Measures the goodput (octets delivered intact to the \
    application per second) of UD Send, UD Write-Record, RD Write and RC Write, and of raw \
    TCP as the baseline, between two network namespaces joined by veth, with nftables \
    dropping the given share of the packets entering each namespace (both directions). \
    Each point runs a sender and a receiver process, one in each namespace.\n\n\
    UD has no flow control, so UD Send and UD Write-Record are offered the same paced rate \
    (--rate); RD and RC are reliable and run unpaced. Each transport's \"kept\" column is its \
    goodput as a share of its own lossless figure.\n\n\
    Needs root (it creates network namespaces, a veth link and nftables rules; the ip and \
    nft commands must be installed). The namespaces are removed at the end, on error, and \
    when the run is killed.";

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

/// `softrdma perf loss [OPTIONS]`.
#[derive(Debug, clap::Args)]
#[command(
    after_long_help = "Output: the table on stdout, progress on stderr; loss.md, \
    loss.csv and one PNG per message size in --out DIR.\n\n\
    Exit status: 0 done (points that failed are listed as such), 1 could not run (not root, \
    no namespaces), 2 for a bad command line."
)]
pub(crate) struct LossArgs {
    /// A short run: losses 0, 1 and 5 % and 1 s per point.
    #[arg(long)]
    quick: bool,
    /// Where loss.md, loss.csv and the PNG plots go (created if missing).
    #[arg(long, value_name = "DIR", default_value = "perf-loss")]
    out: PathBuf,
    /// Loss rates in percent, comma-separated, 0 to 100 in steps of 0.1
    /// [default: 0,0.1,0.5,1,2,5; with --quick 0,1,5].
    #[arg(long, value_name = "P,P,...", value_delimiter = ',', value_parser = loss_arg)]
    losses: Vec<u32>,
    /// Message sizes, comma-separated: octets with an optional binary suffix
    /// (64k, 1m, 64Ki), at most 16 MiB [default: 64k,1m].
    #[arg(
        long,
        value_name = "S,S,...",
        value_delimiter = ',',
        default_values = ["64k", "1m"],
        hide_default_value = true,
        value_parser = super::cli::size_arg
    )]
    sizes: Vec<usize>,
    /// Transports, comma-separated [default: all].
    #[arg(long, value_name = "T,T,...", value_delimiter = ',', value_parser = kind_names())]
    transports: Vec<Kind>,
    /// Measuring window per point in seconds, 0.05 to 600 [default: 2; with
    /// --quick 1].
    ///
    /// The raw TCP baseline's is longer, at most 5 times, until it counted 8
    /// messages: a TCP retransmission stall can outlast a short window.
    #[arg(long, value_name = "SECONDS", value_parser = duration_arg)]
    duration: Option<f64>,
    /// Offered rate of the UD senders in Gbit/s, above 0 and below 1000
    /// [default: half the lossless Write-Record goodput, measured first].
    #[arg(long, value_name = "GBIT/S", value_parser = rate_arg)]
    rate: Option<f64>,
    /// Runs one end of a point (a child of the run): `--role ROLE
    /// key=value...`.
    #[arg(long, hide = true, num_args = 1.., value_name = "ROLE KEY=VALUE")]
    role: Option<Vec<String>>,
}

/// The options `run` works with, defaults filled in.
#[derive(Debug)]
struct Args {
    out: PathBuf,
    losses_permille: Vec<u32>,
    sizes: Vec<usize>,
    kinds: Vec<Kind>,
    duration: f64,
    rate: Option<f64>,
}

impl LossArgs {
    fn resolve(self) -> Args {
        let quick = self.quick;
        Args {
            out: self.out,
            losses_permille: if self.losses.is_empty() {
                if quick {
                    vec![0, 10, 50]
                } else {
                    vec![0, 1, 5, 10, 20, 50]
                }
            } else {
                self.losses
            },
            sizes: self.sizes,
            kinds: if self.transports.is_empty() {
                TRANSPORTS.iter().map(|t| t.kind).collect()
            } else {
                self.transports
            },
            duration: self.duration.unwrap_or(if quick { 1.0 } else { 2.0 }),
            // Gbit/s to octets per second.
            rate: self.rate.map(|r| r * 1e9 / 8.0),
        }
    }
}

/// A loss rate in percent, in steps of 0.1 %, as permille.
fn loss_arg(p: &str) -> Result<u32, String> {
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
    Ok(pm as u32)
}

/// The transports of [`TRANSPORTS`] by their keys.
fn kind_names() -> impl clap::builder::TypedValueParser<Value = Kind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(
        TRANSPORTS
            .iter()
            .map(|t| PossibleValue::new(t.kind.key()).help(t.label)),
    )
    .map(|s| Kind::from_key(&s).expect("a possible value"))
}

/// Seconds per point, 0.05 to 600.
fn duration_arg(v: &str) -> Result<f64, String> {
    let d: f64 = v.parse().map_err(|_| format!("bad duration '{v}'"))?;
    if !(0.05..=600.0).contains(&d) {
        return Err(format!("duration {v}: 0.05..600 seconds"));
    }
    Ok(d)
}

/// Gbit/s, above 0 and below 1000.
fn rate_arg(v: &str) -> Result<f64, String> {
    let r: f64 = v.parse().map_err(|_| format!("bad rate '{v}'"))?;
    if !(r > 0.0 && r < 1000.0) {
        return Err(format!("rate {v}: Gbit/s, above 0 and below 1000"));
    }
    Ok(r)
}

/// Entry point of `softrdma perf loss`.
pub(crate) fn main(args: LossArgs) -> ExitCode {
    if let Some(role) = &args.role {
        let kv = Kv::parse(role.iter().skip(1).map(String::as_str));
        return if roles::run(&role[0], &kv) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let a = args.resolve();
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
