#!/usr/bin/env bash
# Kernel soft-iWARP interop matrix for softrdma: `softrdma rping` as client
# against the guest's rping server and as server for the guest's rping
# client, with siw's defaults and with siw requiring CRC in peer-to-peer mode,
# plus our client with CRC off; and Debian's unmodified rping over softrdma's
# libibverbs.so.1/librdmacm.so.1 (`softrdma run`) in both directions.
#
#   scripts/siw/run-all.sh [SOFTRDMA_BINARY]    (default target/release/softrdma)
#
# Prints `siw NAME PASS|FAIL (Ns)` per scenario and, last,
# `siw interop: N passed, M failed`; exits non-zero if any failed. Each
# scenario boots its own guest (scripts/siw/interop.sh); its output goes to
# target/siw-NAME.log. The guest image is built first if needed (root; see
# scripts/siw/README.md) and cached in SOFTRDMA_SIW_HOME.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/release/softrdma}
[ -x "$bin" ] || { echo "siw interop: $bin not built (cargo build --release -p softrdma-cli)" >&2; exit 1; }
bin=$(realpath "$bin")
mkdir -p target

client=("$bin" rping -c -a 127.0.0.1 -p 7174 -C 1 -v -V)
server=("$bin" rping -s -a 127.0.0.1 -p 27174 -v)
deb_client=("$bin" run -- rping -c -a 127.0.0.1 -p 7174 -C 1 -v)
deb_server=("$bin" run -- rping -s -a 127.0.0.1 -p 27174 -v -C 1)
knobs=(-v knobs -o "mpa_crc_required=1,peer_to_peer=1")
names=(
    host-to-guest/siw-defaults guest-to-host/siw-defaults
    host-to-guest/crc-p2p-knobs guest-to-host/crc-p2p-knobs
    host-to-guest/our-crc-off
    host-to-guest/debian-rping-over-softrdma guest-to-host/debian-rping-over-softrdma
)

t0=$SECONDS
if ! scripts/siw/build-image.sh --check >/dev/null 2>&1; then
    if ! timeout -k 10 1800 scripts/siw/build-image.sh </dev/null >target/siw-build.log 2>&1; then
        echo "siw image build FAILED ($((SECONDS - t0))s); log target/siw-build.log" >&2
        tail -n 20 target/siw-build.log >&2 || true
        for n in "${names[@]}"; do printf 'siw %-40s FAIL (0s)\n' "$n"; done
        echo "siw interop: 0 passed, ${#names[@]} failed"
        exit 1
    fi
    echo "siw image built ($((SECONDS - t0))s; log target/siw-build.log)"
fi

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

i=scripts/siw/interop.sh
run "${names[0]}" $i host-to-guest -- "${client[@]}"
run "${names[1]}" $i guest-to-host -- "${server[@]}"
run "${names[2]}" $i "${knobs[@]}" host-to-guest -- "${client[@]}"
run "${names[3]}" $i "${knobs[@]}" guest-to-host -- "${server[@]}"
run "${names[4]}" $i host-to-guest -- env SOFTRDMA_MPA_CRC=0 "${client[@]}"
run "${names[5]}" $i host-to-guest -- "${deb_client[@]}"
run "${names[6]}" $i guest-to-host -- "${deb_server[@]}"

echo "siw interop: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
