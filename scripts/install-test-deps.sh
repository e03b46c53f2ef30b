#!/usr/bin/env bash
# Install the system packages the softrdma test suites need (Debian/Ubuntu).
#
# Idempotent and non-interactive (never reads stdin; fine under CI=true):
# packages already installed (per `dpkg -s`) are left alone, and
# `apt-get update` runs only when something is missing. Runs as root, or
# through `sudo -n` when not root. apt's output goes to a log that is shown
# only if a step fails.
#
# To add a dependency, append the Debian package name to APT_PACKAGES below,
# with a comment saying which tests need it. Per-package setup (debconf
# preseeding and the like) goes in preseed().
set -euo pipefail

APT_PACKAGES=(
    tshark # softrdma-sim: decodes MPA/DDP/RDMAP captures, the outside check of the wire code
    iproute2 # softrdma-sim netns: two-host tests in network namespaces joined by veth
    nftables # softrdma-sim netns: kernel packet loss (numgen random drop rules)
    iputils-ping # softrdma-sim netns: checks the veth link
    ibverbs-utils # softrdma-capi: unmodified ibv_devices/ibv_devinfo/ibv_*_pingpong over our libibverbs.so.1
    rdmacm-utils # softrdma-capi: unmodified rping/ucmatose/udaddy/mckey/rdma_server/rstream over our librdmacm.so.1
    perftest # softrdma-capi: unmodified ib_{send,write,read}_{lat,bw}, ib_atomic_lat
    libibverbs-dev # softrdma-capi: layout test compiles C against Debian's infiniband/verbs.h
    librdmacm-dev # softrdma-capi: layout test compiles C against Debian's rdma/rdma_cma.h
    libfabric-bin # softrdma-capi-rdmacm: fi_info / fi_pingpong over libfabric's verbs provider
    openmpi-bin # softrdma-capi-rdmacm mpi: mpirun (Open MPI, ofi MTL over libfabric's verbs provider)
    libopenmpi-dev # softrdma-capi-rdmacm mpi: mpicc compiles tests/mpi/mpi_check.c
    qperf # softrdma-capi: unmodified qperf RC/UC/UD/RDMA/atomic tests over our libraries
    pkg-config # scripts/test-install.sh: builds C programs against an installed prefix
    gdb # softrdma-capi, softrdma-cli sockets_programs: a program killed at its deadline has its threads' stacks printed first
    # softrdma-cli sockets_programs: unmodified TCP programs under `softrdma run --sockets`
    # (server and client each interposed or not), and the capture of their connections.
    redis-server # sockets_programs: redis-server for redis-benchmark, a 1 MiB SET/GET, BGSAVE (fork) with a client connected
    redis-tools # sockets_programs: redis-benchmark and redis-cli, the clients
    socat # sockets_programs: a 100 MiB file byte-exact, and a forking echo server (EXEC:cat)
    netcat-openbsd # sockets_programs: nc -N, half-close (shutdown of one direction) both ways
    iperf3 # sockets_programs: throughput, reverse (-R) and parallel streams (-P 4), --json results
    nginx-light # sockets_programs: two worker processes with sendfile serving files to curl and wrk
    curl # sockets_programs: fetches a 10 MiB file from nginx, compared byte-exact
    memcached # sockets_programs: memcached over TCP (its UDP port stays on the kernel)
    libmemcached-tools # sockets_programs: memcaslap load, memccp/memccat of a value compared byte-exact
    sockperf # sockets_programs: TCP ping-pong and throughput with select/poll/epoll servers; UDP
    wrk # sockets_programs: HTTP load against nginx (request count, no socket errors)
    tcpdump # sockets_programs: captures each run on lo; tshark then finds (or not) DDP/RDMAP in it
)

# Wait up to 10 minutes if another apt/dpkg holds the lock.
APT_OPTS=(-q -y -o DPkg::Lock::Timeout=600)

log() { printf 'install-test-deps: %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 1
}

command -v dpkg >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 ||
    die "apt-get/dpkg not found; install these packages by hand: ${APT_PACKAGES[*]}"

is_installed() {
    dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed'
}

# Answers package questions in advance so nothing prompts.
preseed() {
    case "$1" in
        tshark)
            # Do not install dumpcap setuid (and do not ask about it).
            echo "wireshark-common wireshark-common/install-setuid boolean false" |
                as_root debconf-set-selections
            ;;
        iperf3)
            # No iperf3 daemon at boot (and no question about it).
            echo "iperf3 iperf3/start_daemon boolean false" |
                as_root debconf-set-selections
            ;;
    esac
}

as_root() {
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive "$@"
}

LOG="$(mktemp "${TMPDIR:-/tmp}/install-test-deps.XXXXXX")"
trap 'rm -f "$LOG"' EXIT

# Runs a command with its output in $LOG; shows the log if it fails.
quietly() {
    if ! "$@" >>"$LOG" 2>&1 </dev/null; then
        log "failed: $*"
        tail -n 40 "$LOG" >&2
        exit 1
    fi
}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    is_installed "$pkg" || missing+=("$pkg")
done

if [ "${#missing[@]}" -eq 0 ]; then
    log "already installed: ${APT_PACKAGES[*]}"
else
    if [ "$(id -u)" -eq 0 ]; then
        SUDO=()
    elif command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo -n)
    else
        die "not root and sudo is not available; cannot install: ${missing[*]}"
    fi
    log "installing: ${missing[*]}"
    for pkg in "${missing[@]}"; do
        quietly preseed "$pkg"
    done
    quietly as_root apt-get "${APT_OPTS[@]}" update
    quietly as_root apt-get "${APT_OPTS[@]}" install --no-install-recommends "${missing[@]}"
    for pkg in "${missing[@]}"; do
        is_installed "$pkg" || die "$pkg is still not installed"
    done
    log "installed: ${missing[*]}"
fi

# Cargo tools, from crates.io. cargo-fuzz drives the wire-layer fuzz targets
# (scripts/fuzz.sh); it builds from source, about two minutes the first time.
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    log "installing cargo-fuzz (cargo install --locked)"
    quietly cargo install --locked cargo-fuzz
    command -v cargo-fuzz >/dev/null 2>&1 || die "cargo-fuzz is not on PATH after installation (is ~/.cargo/bin on PATH?)"
fi

command -v tshark >/dev/null 2>&1 || die "tshark is not on PATH after installation"
# As root tshark warns "Running as user root" on stderr; only stdout matters.
tshark --version 2>/dev/null | head -n 1
