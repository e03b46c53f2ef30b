#!/usr/bin/env python3
"""Where a ping-pong's one-way latency goes, from system-call trace points.

Splits each one-way trip of a two-process ping-pong (softrdma's `perf
*_lat` or a raw baseline) into

* transit: the sender entering `sendto` until the receiver's next
  `recvfrom` returns with data (kernel path plus the receiver's polling
  delay), and
* turnaround: that `recvfrom` returning until the same thread enters its
  next `sendto` (everything user space does with a message before it
  answers: parsing, placing, completing, polling the CQ, reposting and
  posting the reply).

Receives are `recvfrom`, `readv`, `recvmsg`, `recvmmsg` returning data;
sends `sendto`, `sendmsg`, `sendmmsg` (x86_64 system call numbers). The
latency paths of softrdma's RC and UD and the raw ping-pongs use
`recvfrom`/`sendto`; RC reads with `readv` when it places a payload
straight into a receive buffer. Trace points cost every system call the same, so
compare runs with each other, not with untraced latencies.

Usage (root):

    softrdma perf send_lat --transport ud --size 64 --iters 400000 \
        --no-baseline &
    sleep 0.7
    perf record -e raw_syscalls:sys_enter,raw_syscalls:sys_exit -a \
        -o sc.data -- sleep 0.3
    perf script -i sc.data --ns -F comm,tid,time,event,trace \
        | scripts/turnaround.py [COMM_PREFIX]

COMM_PREFIX (default `softrdma`) selects the processes by name.
"""

import re
import sys
from collections import defaultdict

RECV = {45, 19, 47, 299}  # recvfrom, readv, recvmsg, recvmmsg
SEND = {44, 46, 307}  # sendto, sendmsg, sendmmsg
LINE = re.compile(
    r"\s*(\S+)\s+(\d+)\s+([\d.]+):\s+raw_syscalls:sys_(enter|exit):\s+NR (\d+)"
    r"(?: = (-?\d+))?"
)


def pct(v, q):
    return v[min(len(v) - 1, int(len(v) * q))]


def main():
    prefix = sys.argv[1] if len(sys.argv) > 1 else "softrdma"
    last_rx = {}  # tid -> time its last data-bearing receive returned
    sending = {}  # tid -> time it entered its last send
    turn = defaultdict(list)
    transit = []
    for line in sys.stdin:
        m = LINE.match(line)
        if not m or not m.group(1).startswith(prefix):
            continue
        _, tid, t, ev, nr, ret = m.groups()
        t, nr = float(t) * 1e9, int(nr)
        if ev == "enter":
            if nr in SEND:
                sending[tid] = t
                if tid in last_rx:
                    turn[tid].append(t - last_rx.pop(tid))
        elif nr in RECV and ret is not None and int(ret) > 0:
            last_rx[tid] = t
            peers = [k for k in sending if k != tid]
            if peers:
                transit.append(t - sending.pop(peers[0]))
    rows = [(tid, sorted(v)) for tid, v in turn.items() if len(v) >= 100]
    if not rows or len(transit) < 100:
        sys.exit("turnaround: fewer than 100 round trips found (wrong COMM_PREFIX?)")
    for tid, v in rows:
        print(f"thread {tid}: turnaround p10 {pct(v, 0.1):.0f} ns, p50 {pct(v, 0.5):.0f} ns ({len(v)} messages)")
    transit.sort()
    print(f"transit: p10 {pct(transit, 0.1):.0f} ns, p50 {pct(transit, 0.5):.0f} ns ({len(transit)} messages)")


if __name__ == "__main__":
    main()
