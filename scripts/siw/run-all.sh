#!/usr/bin/env bash
# Kernel siw interop matrix for `softrdma rping` (issue 3): our client
# against the guest's rping server, and the guest's rping client against
# our server, with siw's defaults and with siw built to require CRC and use
# peer-to-peer mode, plus our client with CRC off; and (issue 6) Debian's
# unmodified rping over our librdmacm.so.1 in both directions.
#
#   scripts/siw/run-all.sh [SOFTRDMA_BINARY]
#
# The siw image is built once per machine and cached in SIWVM_HOME (see
# scripts/siw/interop.sh). Each scenario boots a qemu guest (~30-60 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/release/softrdma}
[ -x "$bin" ] || { echo "siw interop: $bin not built (cargo build --release -p softrdma-cli)" >&2; exit 1; }
bin=$(realpath "$bin")

client=("$bin" rping -c -a 127.0.0.1 -p 7174 -C 1 -v -V)
server=("$bin" rping -s -a 127.0.0.1 -p 27174 -v)
knobs=(-v knobs -o mpa_crc_required=1,peer_to_peer=1)

pass=0
fail=0
run() {
    local name=$1
    shift
    local t0=$SECONDS
    local log="target/siw-${name//\//-}.log"
    if "$@" >"$log" 2>&1; then
        pass=$((pass + 1))
        printf 'siw %-40s PASS (%ss)\n' "$name" $((SECONDS - t0))
    else
        fail=$((fail + 1))
        printf 'siw %-40s FAIL (%ss)\n' "$name" $((SECONDS - t0))
        tail -25 "$log" || true
    fi
}

run host-to-guest/siw-defaults scripts/siw/interop.sh host-to-guest -- "${client[@]}"
run guest-to-host/siw-defaults scripts/siw/interop.sh guest-to-host -- "${server[@]}"
run host-to-guest/crc-p2p-knobs scripts/siw/interop.sh "${knobs[@]}" host-to-guest -- "${client[@]}"
run guest-to-host/crc-p2p-knobs scripts/siw/interop.sh "${knobs[@]}" guest-to-host -- "${server[@]}"
run host-to-guest/our-crc-off env SOFTRDMA_MPA_CRC=0 scripts/siw/interop.sh host-to-guest -- "${client[@]}"

# Debian's own rping (rdmacm-utils, unmodified) over softrdma's
# librdmacm.so.1 + libibverbs.so.1 (`softrdma run`), both directions.
deb_client=("$bin" run -- rping -c -a 127.0.0.1 -p 7174 -C 1 -v)
deb_server=("$bin" run -- rping -s -a 127.0.0.1 -p 27174 -v -C 1)
run host-to-guest/debian-rping-over-softrdma scripts/siw/interop.sh host-to-guest -- "${deb_client[@]}"
run guest-to-host/debian-rping-over-softrdma scripts/siw/interop.sh guest-to-host -- "${deb_server[@]}"

echo "siw interop: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
