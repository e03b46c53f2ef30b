#!/usr/bin/env bash
# Runs every fuzz target (the wire layer's parsers, the DC connection table)
# for a bounded time; fails on any crash.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 30)
#
# Seeds come from the golden vectors in testdata/iwarp/golden.txt, written fresh into target/fuzz-seeds/ each run.
# A crash leaves its input in fuzz/artifacts/<target>/ and stops the script.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
targets=(mpa_frame fpdu_deframer segment datagram dc_table exs_wire)

command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz missing: run scripts/install-test-deps.sh" >&2; exit 1; }

# libFuzzer instrumentation needs nightly flags: use the nightly toolchain if
# rustup has one, otherwise let stable accept them.
if rustup run nightly rustc --version >/dev/null 2>&1; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi

golden=testdata/iwarp/golden.txt
seeds=target/fuzz-seeds
rm -rf "$seeds"
python3 scripts/fuzz-seeds.py "$golden" "$seeds"
mkdir -p "$seeds/exs_wire" # no golden vectors for libexs messages: it starts from fuzz/corpus/exs_wire

echo "building fuzz targets"
"${fuzz[@]}" build --sanitizer none --debug-assertions
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    printf 'fuzz %-14s %3ss ... ' "$t" "$secs"
    log="target/fuzz-$t.log"
    if "${fuzz[@]}" run --sanitizer none --debug-assertions "$t" "fuzz/corpus/$t" "$seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
        echo "ok ($runs runs)"
    else
        echo "FAILED"
        # What went wrong (a panic's message, or libFuzzer's report of a
        # signal) comes before the corpus statistics: show both.
        grep -m1 -B4 -A20 -E "panicked|ERROR: libFuzzer|==[0-9]+== ERROR" "$log" || true
        echo "..."
        tail -30 "$log"
        exit 1
    fi
done
