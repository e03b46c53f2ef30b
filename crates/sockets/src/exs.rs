//! The Extended Sockets calls in the interposer: `exs_exports!` defines
//! them here as in `libexs.so.1`, and the glue below lets the EXS RDMA
//! model adopt a DDPMODE socket's QP (`softrdma_exs_core::ddp`) and the
//! socket hand it over (`softrdma_sockets_core::sock::Handover`).

use std::sync::{Arc, Mutex};

use libc::c_int;
use softrdma_exs_core::ddp;
use softrdma_sockets_core::conn::{Conn, Handover as Step};
use softrdma_sockets_core::guard;
use softrdma_sockets_core::sock::{self, ExsHooks, Handover};
use softrdma_verbs::{Context, ProtectionDomain, WorkCompletion};

softrdma_exs_core::exs_exports!();

struct Host;

impl ddp::Host for Host {
    fn device(&self) -> Option<(Context, ProtectionDomain)> {
        let _g = guard::enter();
        softrdma_sockets_core::device()
            .ok()
            .map(|d| (d.ctx().clone(), d.pd().clone()))
    }

    fn switch(&self, fd: c_int) -> Result<bool, c_int> {
        let _g = guard::enter();
        match softrdma_sockets_core::table::sock(fd) {
            Some(s) => s.exs_switch(fd),
            None => Ok(false),
        }
    }

    fn thread_start(&self) {
        guard::enter_forever();
    }
}

static HOST: Host = Host;

/// The stream protocol's side of an adopted connection.
struct Pre {
    conn: Arc<Mutex<Conn>>,
    started: bool,
}

impl Pre {
    fn conn(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ddp::Prelude for Pre {
    fn take(&mut self, wc: &WorkCompletion) -> ddp::Taken {
        match self.conn().handover(wc) {
            Step::NotOurs => ddp::Taken::No,
            Step::Taken => ddp::Taken::Yes,
            Step::Exs(b) => ddp::Taken::Msg(b),
        }
    }

    fn step(&mut self) -> ddp::Step {
        let started = self.started;
        let mut c = self.conn();
        c.handover_flush();
        if started {
            return ddp::Step::Wait;
        }
        if c.exs_receives_due() {
            return ddp::Step::PostReceives;
        }
        let Some(p) = c.switched().map(<[u8]>::to_vec) else {
            return ddp::Step::Wait;
        };
        drop(c);
        self.started = true;
        ddp::Step::Start(p)
    }

    fn posted(&mut self) {
        self.conn().exs_receives_posted();
    }
}

fn adopt(h: Handover) -> Result<Vec<u8>, c_int> {
    let (qp, cq, efd) = {
        let c = h.conn.lock().unwrap_or_else(|e| e.into_inner());
        (c.qp().clone(), c.cq().clone(), c.efd())
    };
    ddp::adopt(ddp::Adopt {
        fd: h.fd,
        family: h.family,
        qp,
        cq,
        efd,
        prelude: Box::new(Pre {
            conn: h.conn,
            started: false,
        }),
    })
}

/// Registers both sides (at load).
pub fn init() {
    ddp::set_host(&HOST);
    sock::set_exs_hooks(ExsHooks {
        adopt,
        closed: ddp::closed,
    });
}
