#!/usr/bin/env bash
# Install the peer benchmarks `softrdma perf --peers` runs side by side with
# softrdma (Debian/Ubuntu): libfabric's fi_pingpong (package libfabric-bin)
# and UCX's ucx_perftest (package ucx-utils).
#
# Idempotent and non-interactive (never reads stdin; fine under CI=true):
# packages already installed are left alone and `apt-get update` runs only
# when something is missing. Runs as root, or through `sudo -n`.
set -euo pipefail

PACKAGES=(
    libfabric-bin # fi_pingpong: providers tcp, "tcp;ofi_rxm", "udp;ofi_rxd"
    ucx-utils     # ucx_perftest: UCX_TLS=tcp tag_lat / tag_bw
)
APT_OPTS=(-q -y -o DPkg::Lock::Timeout=600)

log() { printf 'install-perf-peers: %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    else
        sudo -n "$@"
    fi
}

command -v dpkg >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 || {
    log "apt-get/dpkg not found; install by hand: ${PACKAGES[*]}"
    exit 1
}

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
    log "already installed: ${PACKAGES[*]}"
    exit 0
fi
log "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
as_root env DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" update </dev/null
as_root env DEBIAN_FRONTEND=noninteractive apt-get "${APT_OPTS[@]}" install --no-install-recommends "${missing[@]}" </dev/null
for b in fi_pingpong ucx_perftest; do
    command -v "$b" >/dev/null 2>&1 && log "found $(command -v "$b")" || log "WARNING: $b not on PATH"
done
