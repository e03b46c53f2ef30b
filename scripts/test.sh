#!/usr/bin/env bash
# The whole softrdma test suite, as README.md documents it and .ci/run calls it.
#
#   scripts/test.sh            install what the tests need, then run everything
#   FUZZ_SECONDS=5 scripts/test.sh   shorter fuzzing (default 30 s per target)
#
# Steps: install test dependencies (tshark, cargo-fuzz, ...), rustfmt check,
# clippy with warnings denied, the workspace tests, the install step into a
# temporary prefix (scripts/test-install.sh), the kernel siw interop matrix in
# a qemu guest (scripts/siw/run-all.sh), then every fuzz target for a bounded
# time. Any failure stops the run with a non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "installing test dependencies"
scripts/install-test-deps.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked 2>&1 | tee target/test-output.txt
# cargo's own exit status is checked by pipefail; the result lines are summed
# at the end so the run closes on one plain total.

step "release build (the install test and the siw interop use it)"
cargo build --release --locked -p softrdma-cli -p softrdma-capi -p softrdma-capi-rdmacm -p softrdma-sockets -p softrdma-exs

step "install into a temporary prefix, build against it, uninstall"
scripts/test-install.sh | tee target/install-summary.txt

step "kernel siw interop (qemu guest; the image is built once per machine)"
scripts/siw/run-all.sh target/release/softrdma | tee target/siw-summary.txt

step "fuzzing (${FUZZ_SECONDS:-30} s per target)"
scripts/fuzz.sh "${FUZZ_SECONDS:-30}"

step "all tests passed"
# The closing total: cargo tests plus one per fuzz target that ran clean.
awk -v fuzz="$(ls fuzz/fuzz_targets/*.rs | wc -l)" \
    '/^test result:/ { p += $4; f += $6; i += $8 } /^siw interop:/ { p += $3; f += $5 } /^install:/ { p += $2; f += $4 } END { printf "summary: %d passed, %d failed, %d skipped\n", p + fuzz, f, i }' \
    target/test-output.txt target/install-summary.txt target/siw-summary.txt
