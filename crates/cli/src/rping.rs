//! `softrdma rping`: rdma-core's rping over softrdma, interoperable with it.
//!
//! The protocol, per iteration (the client drives):
//! 1. the client fills its *start* buffer ("rdma-ping-N: " then a rotating
//!    A–z pattern, NUL-terminated) and Sends its address, rkey and size
//!    (16 octets: be64 address, be32 rkey, be32 size);
//! 2. the server RDMA-Reads the start buffer into its own buffer and Sends
//!    "go ahead";
//! 3. the client Sends the address/rkey/size of its *rdma* buffer;
//! 4. the server RDMA-Writes its buffer there and Sends "done";
//! 5. with `-V` the client checks that the rdma buffer equals the start
//!    buffer; with `-v` it prints "ping data: …".
//!
//! The server serves one client and exits when it disconnects.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use softrdma_verbs::cm::{self, ConnParams};
use softrdma_verbs::{
    Access, Completion, CompletionQueue, Context, MemoryRegion, Payload, QpCaps, QueuePair, RecvWr,
    SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
};

const INFO_LEN: usize = 16;
const MIN_SIZE: usize = 32;
/// How long one step may wait for the peer before rping gives up.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// `softrdma rping -s|-c [OPTIONS]`.
#[derive(Debug, clap::Args)]
#[command(
    about = "rping-compatible ping over an RC connection",
    long_about = "Pings over an RC connection the way rdma-core's rping does, and \
        interoperates with it: per iteration the client sends the address of its start \
        buffer, the server RDMA-Reads it, the client sends the address of its rdma buffer, \
        the server RDMA-Writes its copy there. The server serves one client and exits when \
        it disconnects. The options are rping's.",
    group(clap::ArgGroup::new("side").required(true).args(["server", "client"])),
    after_long_help = "Exit status: 0 done, 1 failed (the reason on stderr), 2 for a bad \
        command line."
)]
pub(crate) struct RpingArgs {
    /// Server: serve one client, exit when it disconnects.
    #[arg(short = 's')]
    server: bool,
    /// Client.
    #[arg(short = 'c')]
    client: bool,
    /// Server: the address to bind [default: all]; client: the server's
    /// address (required).
    #[arg(short = 'a', value_name = "ADDR", required_if_eq("client", "true"))]
    addr: Option<String>,
    /// Port.
    #[arg(short = 'p', value_name = "PORT", default_value_t = 7174)]
    port: u16,
    /// Iterations (client) [default: until interrupted].
    #[arg(short = 'C', value_name = "COUNT")]
    count: Option<u64>,
    /// Buffer size in octets, 32 to 1 GiB.
    #[arg(
        short = 'S',
        value_name = "SIZE",
        default_value_t = 64,
        value_parser = clap::value_parser!(u64).range(MIN_SIZE as u64..=1 << 30)
    )]
    size: u64,
    /// Print the ping data.
    #[arg(short = 'v')]
    verbose: bool,
    /// Verify the data (client).
    #[arg(short = 'V')]
    validate: bool,
    /// Debug output on stderr.
    #[arg(short = 'd')]
    debug: bool,
}

/// The options the two sides work with.
struct Args {
    server: bool,
    addr: Option<String>,
    port: u16,
    count: Option<u64>,
    size: usize,
    verbose: bool,
    validate: bool,
    debug: bool,
}

impl From<RpingArgs> for Args {
    fn from(r: RpingArgs) -> Args {
        Args {
            server: r.server,
            addr: r.addr,
            port: r.port,
            count: r.count,
            size: usize::try_from(r.size).expect("at most 1 GiB"),
            verbose: r.verbose,
            validate: r.validate,
            debug: r.debug,
        }
    }
}

/// Entry point of `softrdma rping`.
pub fn main(r: RpingArgs) -> ExitCode {
    let a = Args::from(r);
    let r = if a.server { server(&a) } else { client(&a) };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rping: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The resources of one side.
struct Ping {
    cq: CompletionQueue,
    qp: QueuePair,
    recv: MemoryRegion,
    send: MemoryRegion,
    /// Client: the start buffer (peer reads it). Server: unused.
    start: MemoryRegion,
    /// Client: the sink the server writes. Server: its read/write buffer.
    rdma: MemoryRegion,
    debug: bool,
    /// Completions that arrived while another kind was awaited.
    stash: std::cell::RefCell<std::collections::VecDeque<Completion>>,
}

impl Ping {
    fn new(ctx: &Context, size: usize, debug: bool) -> Result<Ping, String> {
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16, None);
        let qp = pd.create_qp(
            &cq,
            &cq,
            QpCaps {
                max_send_wr: 8,
                max_recv_wr: 4,
            },
        );
        let reg = |len, acc| {
            pd.register(len, acc)
                .map_err(|e| format!("memory registration: {e:?}"))
        };
        let p = Ping {
            recv: reg(INFO_LEN, Access::LOCAL_WRITE)?,
            send: reg(INFO_LEN, Access(0))?,
            start: reg(size, Access::REMOTE_READ)?,
            rdma: reg(
                size,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )?,
            cq,
            qp,
            debug,
            stash: Default::default(),
        };
        p.post_recv()?;
        Ok(p)
    }

    fn post_recv(&self) -> Result<(), String> {
        self.qp
            .post_recv(RecvWr {
                wr_id: 1,
                sgl: SgList::single(self.recv.addr(), INFO_LEN as u32, self.recv.lkey()),
            })
            .map_err(|e| format!("post_recv: {e:?}"))
    }

    fn post(&self, wr_id: u64, op: SendOp, sgl: SgList) -> Result<(), String> {
        let flags = SendFlags {
            signaled: true,
            ..SendFlags::default()
        };
        self.qp
            .post_send(SendWr {
                wr_id,
                op,
                payload: Payload::Sgl(sgl),
                flags,
            })
            .map_err(|e| format!("post_send: {e:?}"))
    }

    /// Waits for the completion of the given opcode (completions of the
    /// other queue are kept for later); any error ends rping.
    fn wait(&self, want: WcOpcode) -> Result<Completion, String> {
        let stashed = {
            let mut st = self.stash.borrow_mut();
            st.iter()
                .position(|c| c.wc.opcode == want || c.wc.status != WcStatus::Success)
                .and_then(|i| st.remove(i))
        };
        let c = match stashed {
            Some(c) => c,
            None => loop {
                let c = self
                    .cq
                    .wait_one(STEP_TIMEOUT)
                    .ok_or_else(|| format!("no {want:?} completion within {STEP_TIMEOUT:?}"))?;
                if self.debug {
                    eprintln!(
                        "rping: completion {:?} {:?} len {}",
                        c.wc.opcode, c.wc.status, c.wc.byte_len
                    );
                }
                if c.wc.opcode == want || c.wc.status != WcStatus::Success {
                    break c;
                }
                self.stash.borrow_mut().push_back(c);
            },
        };
        if c.wc.status != WcStatus::Success {
            return Err(format!(
                "{:?} completed with {:?}",
                c.wc.opcode, c.wc.status
            ));
        }
        Ok(c)
    }

    fn send_info(&self, addr: u64, rkey: u32, size: u32) -> Result<(), String> {
        let mut info = [0u8; INFO_LEN];
        info[..8].copy_from_slice(&addr.to_be_bytes());
        info[8..12].copy_from_slice(&rkey.to_be_bytes());
        info[12..].copy_from_slice(&size.to_be_bytes());
        self.send.write_at(0, &info).map_err(|_| "send buffer")?;
        self.post(
            2,
            SendOp::Send {
                imm: None,
                invalidate: None,
            },
            SgList::single(self.send.addr(), INFO_LEN as u32, self.send.lkey()),
        )?;
        self.wait(WcOpcode::Send).map(|_| ())
    }

    /// Receives one info message (and reposts the receive).
    fn recv_info(&self) -> Result<(u64, u32, u32), String> {
        let c = self.wait(WcOpcode::Recv)?;
        let mut info = [0u8; INFO_LEN];
        self.recv.read_at(0, &mut info).map_err(|_| "recv buffer")?;
        self.post_recv()?;
        if (c.wc.byte_len as usize) < INFO_LEN {
            return Err(format!("short message ({} octets)", c.wc.byte_len));
        }
        let addr = u64::from_be_bytes(info[..8].try_into().expect("8 octets"));
        let rkey = u32::from_be_bytes(info[8..12].try_into().expect("4 octets"));
        let size = u32::from_be_bytes(info[12..].try_into().expect("4 octets"));
        Ok((addr, rkey, size))
    }
}

/// The pattern rping puts in the start buffer for iteration `n`.
fn fill_pattern(buf: &mut [u8], n: u64) {
    let head = format!("rdma-ping-{n}: ");
    let k = head.len().min(buf.len());
    buf[..k].copy_from_slice(&head.as_bytes()[..k]);
    // rping starts the pattern one character later on each iteration.
    let mut c = b'A' + (n % 58) as u8;
    for b in &mut buf[k..] {
        *b = c;
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    if let Some(last) = buf.last_mut() {
        *last = 0;
    }
}

/// The printable part of a ping buffer (up to the NUL).
fn as_text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn resolve(addr: &str, port: u16) -> Result<SocketAddr, String> {
    (addr, port)
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr}: no address"))
}

fn client(a: &Args) -> Result<(), String> {
    let ctx = Context::open().map_err(|e| e.to_string())?;
    let p = Ping::new(&ctx, a.size, a.debug)?;
    let addr = resolve(a.addr.as_deref().expect("checked in parse"), a.port)?;
    if a.debug {
        eprintln!("rping: connecting to {addr}");
    }
    cm::connect(
        &p.qp,
        addr,
        &ConnParams {
            private_data: Vec::new(),
            ird: 1,
            ord: 1,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut start = vec![0u8; a.size];
    let mut got = vec![0u8; a.size];
    let mut n = 0u64;
    while a.count.is_none_or(|c| n < c) {
        fill_pattern(&mut start, n);
        p.start.write_at(0, &start).map_err(|_| "start buffer")?;
        p.send_info(p.start.addr(), p.start.rkey(), a.size as u32)?;
        p.recv_info()?; // go ahead
        p.send_info(p.rdma.addr(), p.rdma.rkey(), a.size as u32)?;
        p.recv_info()?; // done
        p.rdma.read_at(0, &mut got).map_err(|_| "rdma buffer")?;
        if a.validate && got != start {
            return Err(format!("data mismatch in iteration {n}"));
        }
        if a.verbose {
            println!("ping data: {}", as_text(&got));
        }
        n += 1;
    }
    p.qp.disconnect();
    Ok(())
}

fn server(a: &Args) -> Result<(), String> {
    let ctx = Context::open().map_err(|e| e.to_string())?;
    let bind = match &a.addr {
        Some(h) => resolve(h, a.port)?,
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), a.port),
    };
    let listener = cm::Listener::bind(&ctx, bind).map_err(|e| format!("bind {bind}: {e}"))?;
    if a.debug {
        eprintln!("rping: listening on {bind}");
    }
    let req = listener.get_request().map_err(|e| e.to_string())?;
    let p = Ping::new(&ctx, a.size, a.debug)?;
    req.accept(
        &p.qp,
        &ConnParams {
            private_data: Vec::new(),
            ird: 1,
            ord: 1,
        },
    )
    .map_err(|e| e.to_string())?;
    drop(listener);
    let mut buf = vec![0u8; a.size];
    loop {
        // The client's start buffer, or its disconnect (a flushed receive).
        let (addr, rkey, len) = match p.recv_info() {
            Ok(x) => x,
            Err(e) if e.contains("WrFlushErr") || e.contains("completed with") => break,
            Err(e) => return Err(e),
        };
        let len = (len as usize).min(a.size) as u32;
        p.post(
            3,
            SendOp::Read {
                remote_addr: addr,
                rkey,
            },
            SgList::single(p.rdma.addr(), len, p.rdma.lkey()),
        )?;
        p.wait(WcOpcode::RdmaRead)?;
        if a.verbose {
            p.rdma.read_at(0, &mut buf).map_err(|_| "rdma buffer")?;
            println!("server ping data: {}", as_text(&buf));
        }
        p.send_info(0, 0, 0)?; // go ahead
        let (addr, rkey, len) = p.recv_info()?;
        let len = (len as usize).min(a.size) as u32;
        p.post(
            4,
            SendOp::Write {
                remote_addr: addr,
                rkey,
                imm: None,
            },
            SgList::single(p.rdma.addr(), len, p.rdma.lkey()),
        )?;
        p.wait(WcOpcode::RdmaWrite)?;
        p.send_info(0, 0, 0)?; // done
    }
    p.qp.disconnect();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_matches_rping() {
        let mut b = vec![0u8; 64];
        fill_pattern(&mut b, 3);
        assert_eq!(
            as_text(&b),
            "rdma-ping-3: DEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstu"
        );
        assert_eq!(b[63], 0);
    }

    /// `softrdma rping ARGS` as `main` gets it, or the error.
    fn parse(args: &[String]) -> Result<Args, String> {
        use clap::Parser;
        let argv = ["softrdma", "rping"].into_iter().map(String::from);
        match crate::Cli::try_parse_from(argv.chain(args.iter().cloned())) {
            Ok(crate::Cli {
                command: crate::Command::Rping(r),
            }) => Ok(Args::from(r)),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn arguments() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(parse(&s(&["-c"])).is_err());
        assert!(parse(&s(&["-s", "-S", "8"])).is_err());
        let a = parse(&s(&[
            "-c",
            "-a",
            "127.0.0.1",
            "-C",
            "5",
            "-S",
            "100",
            "-V",
            "-v",
        ]))
        .unwrap();
        assert_eq!(
            (a.server, a.count, a.size, a.validate, a.verbose),
            (false, Some(5), 100, true, true)
        );
        assert!(parse(&s(&["-x"])).is_err());
        assert!(parse(&s(&["-s", "-c", "-a", "x"])).is_err());
        assert!(parse(&s(&["-a", "x"])).is_err());
        let a = parse(&s(&["-s"])).unwrap();
        assert_eq!((a.server, a.addr, a.port, a.size), (true, None, 7174, 64));
    }
}
