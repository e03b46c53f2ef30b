#!/usr/bin/env bash
# The install step, checked as a user would use it: install into a
# temporary prefix that already holds files of its own, build C programs
# against the installed headers with pkg-config's flags, run them through the
# installed `softrdma run` (and a program under the installed sockets
# interposer, `softrdma run --sockets`), uninstall, and compare the prefix
# with what it was.
#
#   scripts/test-install.sh        (after cargo build --release; scripts/test.sh runs it)
#
# Prints one line per check and closes with "install: N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

work=$(mktemp -d "${TMPDIR:-/tmp}/softrdma-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
pass=0
fail=0
check() { # check NAME CMD...: runs CMD, output in $work/NAME.log
    local name=$1 log=$work/${1// /-}.log
    shift
    if "$@" >"$log" 2>&1; then
        pass=$((pass + 1))
        printf 'install %-52s ok\n' "$name"
    else
        fail=$((fail + 1))
        printf 'install %-52s FAILED\n' "$name"
        tail -n 30 "$log"
    fi
}
# out_has PATTERN CMD...: CMD succeeds and its output, read whole, matches
# PATTERN (grep -q in a pipeline could quit at its first match and fail the
# pipeline, under pipefail, through the writer's broken pipe). Shows the
# output when not.
out_has() {
    local pat=$1 out
    shift
    out=$("$@") || { printf '%s\n' "$out"; echo "failed: $*"; return 1; }
    grep -q -- "$pat" <<<"$out" || { printf '%s\n' "$out"; echo "no '$pat' in the output of: $*"; return 1; }
}
snapshot() { # every path under the prefix with its type, mode and content hash
    (cd "$prefix" && find . -printf '%y %m %p\n' | sort && find . -type f -exec sha256sum {} + | sort -k 2)
}

# A prefix that is not empty: what is already there must survive both steps.
mkdir -p "$prefix/bin" "$prefix/lib/pkgconfig" "$prefix/include"
echo '#!/bin/sh' >"$prefix/bin/someone-elses-tool"
echo 'Name: other' >"$prefix/lib/pkgconfig/other.pc"
snapshot >"$work/before.txt"

check "install into a temporary prefix" scripts/install.sh --no-build --prefix "$prefix"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig

installed_layout() {
    local f
    for f in bin/softrdma lib/softrdma/libibverbs.so.1 lib/softrdma/librdmacm.so.1 \
        lib/softrdma/libibverbs.so lib/softrdma/librdmacm.so include/softrdma/verbs.h \
        lib/pkgconfig/softrdma-verbs.pc lib/pkgconfig/softrdma-rdmacm.pc; do
        [ -e "$prefix/$f" ] || { echo "missing: $f"; return 1; }
    done
    # The drop-in libraries stay out of the prefix's own lib directory.
    [ ! -e "$prefix/lib/libibverbs.so.1" ] || { echo "lib/libibverbs.so.1 would shadow rdma-core"; return 1; }
    out_has 'SONAME.*\[libibverbs.so.1\]' readelf -d "$prefix/lib/softrdma/libibverbs.so.1"
}
check "layout: binary, private lib dir, headers, .pc files" installed_layout

pkgconfig_flags() {
    pkg-config --cflags --libs softrdma-verbs | tee /dev/stderr | grep -q -- "-L$prefix/lib/softrdma" &&
        pkg-config --cflags softrdma-verbs | grep -q -- "-I$prefix/include" &&
        pkg-config --libs softrdma-rdmacm | grep -q -- '-lrdmacm'
}
check "pkg-config names the installed paths" pkgconfig_flags

# The header's own example, built the way a user builds against an install.
build_and_run_example() {
    # shellcheck disable=SC2046 # pkg-config's output is a list of flags
    cc -Wall -Werror -o "$work/write_record" crates/capi/examples/c/write_record.c \
        $(pkg-config --cflags --libs softrdma-verbs) &&
        (cd "$work" && "$prefix/bin/softrdma" run -- ./write_record) | tee "$work/write_record.out" &&
        grep -q 'write_record: OK' "$work/write_record.out"
}
check "C program via pkg-config runs under softrdma run" build_and_run_example

rdmacm_program() {
    cat >"$work/cm.c" <<'EOF'
#include <stdio.h>
#include <rdma/rdma_cma.h>
int main(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch) { perror("rdma_create_event_channel"); return 1; }
	struct rdma_cm_id *id;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) { perror("rdma_create_id"); return 1; }
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	puts("cm: OK");
	return 0;
}
EOF
    # shellcheck disable=SC2046
    cc -Wall -Werror -o "$work/cm" "$work/cm.c" $(pkg-config --cflags --libs softrdma-rdmacm) &&
        out_has 'cm: OK' "$prefix/bin/softrdma" run -- "$work/cm" &&
        # It ran on softrdma's librdmacm, not the system's.
        out_has "$prefix/lib/softrdma/.*librdmacm.so.1" "$prefix/bin/softrdma" run -- sh -c "ldd '$work/cm'"
}
check "rdma_cm program via pkg-config, softrdma's librdmacm" rdmacm_program

sockets_interposer() {
    local lib=$prefix/lib/softrdma/libsoftrdma-sockets.so.1 h
    [ -f "$lib" ] || { echo "missing: lib/softrdma/libsoftrdma-sockets.so.1"; return 1; }
    [ ! -e "$prefix/lib/libsoftrdma-sockets.so.1" ] || { echo "the interposer is outside lib/softrdma"; return 1; }
    out_has 'SONAME.*\[libsoftrdma-sockets.so.1\]' readelf -d "$lib" || return 1
    for h in crates/*/include/softrdma/sockets.h; do
        [ -f "$h" ] || continue
        cmp "$h" "$prefix/include/softrdma/sockets.h" || { echo "include/softrdma/sockets.h not installed"; return 1; }
    done
    # The installed launcher finds the installed interposer, puts it first on
    # LD_PRELOAD (before what was there), and the program runs with it loaded.
    "$prefix/bin/softrdma" run --sockets -- true || { echo "softrdma run --sockets -- true failed"; return 1; }
    local got
    # shellcheck disable=SC2016 # $LD_PRELOAD is the child shell's
    got=$(LD_PRELOAD='' "$prefix/bin/softrdma" run --sockets -- sh -c 'printf %s "$LD_PRELOAD"')
    [ "$got" = "$lib" ] || { echo "LD_PRELOAD is '$got', not '$lib'"; return 1; }
    out_has "$lib" "$prefix/bin/softrdma" run --sockets -- cat /proc/self/maps ||
        { echo "the interposer is not mapped in a program run with --sockets"; return 1; }
    "$prefix/bin/softrdma" sockets list >/dev/null
}
check "sockets interposer installed, softrdma run --sockets" sockets_interposer

exs_library() {
    [ -f "$prefix/lib/libexs.so.1" ] && [ -L "$prefix/lib/libexs.so" ] &&
        [ -f "$prefix/include/sys/exs.h" ] || { echo "libexs.so.1, libexs.so or sys/exs.h missing"; return 1; }
    out_has 'SONAME.*\[libexs.so.1\]' readelf -d "$prefix/lib/libexs.so.1" || return 1
    # What netperf's configure --enable-exs checks: the header, and exs_init in -lexs.
    cat >"$work/exs.c" <<'EOF'
#include <stdio.h>
#include <sys/exs.h>
int main(void)
{
	if (exs_init(EXS_VERSION)) { perror("exs_init"); return 1; }
	exs_qhandle_t q = exs_qcreate(8);
	if (q == EXS_QHANDLE_INVALID) { perror("exs_qcreate"); return 1; }
	puts("exs: OK");
	return 0;
}
EOF
    # shellcheck disable=SC2046
    cc -Wall -Werror -o "$work/exs" "$work/exs.c" $(pkg-config --cflags --libs exs) &&
        out_has 'exs: OK' env LD_LIBRARY_PATH="$prefix/lib" "$work/exs"
}
check "libexs and its header installed, a program via pkg-config" exs_library

# The credit blast at its full size, 10^6 small messages with 256 queued per
# side, against the installed (release) library: a lost message or a Send
# that finds no posted receive (iWARP has no receiver-not-ready retry) ends
# the run. The cargo tests run it with 50 000 against their debug build.
exs_blast() {
    # shellcheck disable=SC2046
    cc -O1 -Wall -Werror -o "$work/rdma_test" crates/exs/tests/c/rdma_test.c \
        $(pkg-config --cflags --libs exs) -lpthread || return 1
    local out
    out=$(timeout -k 5 240 env LD_LIBRARY_PATH="$prefix/lib" "$work/rdma_test" credits 1000000 2>&1) ||
        { printf '%s\n' "$out"; echo "rdma_test credits 1000000 failed"; return 1; }
    printf '%s\n' "$out"
    grep -q 'blast: 1000000 messages' <<<"$out" && grep -q 'server: ok' <<<"$out" &&
        grep -q 'client: ok' <<<"$out"
}
check "libexs credit blast, 10^6 messages, no receiver overrun" exs_blast

help_text() {
    out_has 'Usage' "$prefix/bin/softrdma" --help &&
        out_has 'Usage' "$prefix/bin/softrdma" run --help &&
        out_has '--sockets' "$prefix/bin/softrdma" run --help &&
        out_has 'Usage' "$prefix/bin/softrdma" sockets stat --help &&
        out_has '^softrdma ' "$prefix/bin/softrdma" --version
}
check "installed softrdma answers --help and --version" help_text

check "uninstall" scripts/install.sh --uninstall --prefix "$prefix"
prefix_as_before() {
    snapshot >"$work/after.txt"
    diff -u "$work/before.txt" "$work/after.txt"
}
check "uninstall leaves the prefix as it was" prefix_as_before

echo "install: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
