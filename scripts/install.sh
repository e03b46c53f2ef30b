#!/usr/bin/env bash
# Installs softrdma into a prefix, or removes exactly what an install put there.
#
#   scripts/install.sh [--prefix DIR] [--no-build]     install (default prefix /usr/local)
#   scripts/install.sh --uninstall [--prefix DIR]      remove that install again
#
# What goes where (PREFIX = --prefix, default /usr/local):
#   PREFIX/bin/softrdma                       the command-line tool
#   PREFIX/lib/softrdma/libibverbs.so.1       the drop-in verbs library (SONAME
#   PREFIX/lib/softrdma/librdmacm.so.1        libibverbs.so.1 / librdmacm.so.1), in a
#                                             private directory so they never shadow a
#                                             system rdma-core; `softrdma run` puts it
#                                             first on LD_LIBRARY_PATH for one program
#   PREFIX/lib/softrdma/lib{ibverbs,rdmacm}.so  links for the linker (-libverbs, -lrdmacm)
#   PREFIX/lib/softrdma/libsoftrdma-sockets.so.1  the sockets interposer (SONAME
#                                             libsoftrdma-sockets.so.1); `softrdma run
#                                             --sockets` puts it on LD_PRELOAD for one
#                                             program
#   PREFIX/include/softrdma/*.h               the public headers (verbs.h, sockets.h, ...)
#   PREFIX/lib/libexs.so.1, libexs.so         the Extended Sockets API (SONAME libexs.so.1;
#   PREFIX/include/sys/exs.h                  no other library has the name, so it sits in
#                                             lib/ where -lexs finds it: docs/exs.md)
#   PREFIX/lib/pkgconfig/exs.pc               pkg-config: -I.../include -L.../lib -lexs
#   PREFIX/lib/pkgconfig/softrdma-verbs.pc    pkg-config: -I.../include -L.../lib/softrdma -libverbs
#   PREFIX/lib/pkgconfig/softrdma-rdmacm.pc   pkg-config: the same with -lrdmacm
#   PREFIX/lib/softrdma/install-manifest.txt  every file and directory this install created
#
# A C program that uses softrdma's verbs (softrdma/verbs.h also includes
# rdma-core's <infiniband/verbs.h>: Debian's libibverbs-dev):
#   cc prog.c $(pkg-config --cflags --libs softrdma-verbs) -o prog
#   softrdma run -- ./prog
# (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig for a prefix pkg-config does not search.)
#
# --no-build installs what target/release holds without running cargo.
# --uninstall reads the manifest, removes the files it lists and then the
# directories it lists that are empty, so files that were in the prefix
# before (or were added to its directories since) stay. Installing over an
# earlier install first removes that one.
set -euo pipefail

prefix=/usr/local
build=1
uninstall=0
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        --no-build) build=0; shift ;;
        --uninstall) uninstall=1; shift ;;
        -h | --help) sed -n '2,/^set -e/{/^#/{s/^# \{0,1\}//;p}}' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case $prefix in
    /*) ;;
    *) prefix=$(pwd)/$prefix ;;
esac
prefix=${prefix%/}

libdir=$prefix/lib/softrdma
manifest=$libdir/install-manifest.txt

log() { printf 'install.sh: %s\n' "$*" >&2; }

# Removes what $manifest lists: its files and links, then the directories
# the install created, deepest first, where nothing else is in them. Only
# paths inside the prefix are touched.
remove_installed() {
    local line kind path i dirs=()
    [ -f "$manifest" ] || return 0
    while IFS= read -r line; do
        kind=${line%% *} path=${line#* }
        case $path in
            "$prefix"/*) ;;
            *) log "manifest line outside $prefix ignored: $line"; continue ;;
        esac
        case $kind in
            f | l) rm -f -- "$path" ;;
            d) dirs+=("$path") ;;
        esac
    done <"$manifest"
    rm -f -- "$manifest"
    for ((i = ${#dirs[@]} - 1; i >= 0; i--)); do
        rmdir -- "${dirs[i]}" 2>/dev/null || true
    done
}

if [ "$uninstall" = 1 ]; then
    [ -f "$manifest" ] || { log "no softrdma install in $prefix ($manifest not found)"; exit 1; }
    remove_installed
    log "removed softrdma from $prefix"
    exit 0
fi

cd "$(dirname "$0")/.."
repo=$(pwd)
if [ "$build" = 1 ]; then
    log "building (cargo build --release)"
    cargo build --release --locked -p softrdma-cli -p softrdma-capi -p softrdma-capi-rdmacm \
        -p softrdma-sockets -p softrdma-exs >&2
fi
rel=$repo/target/release
for f in softrdma libibverbs.so librdmacm.so libsoftrdma_sockets.so libexs.so; do
    [ -f "$rel/$f" ] || { log "$rel/$f is missing (run without --no-build)"; exit 1; }
done
version=$("$rel/softrdma" --version | awk '{ print $2 }')

[ -f "$manifest" ] && { log "replacing the earlier install in $prefix"; remove_installed; }

# The directories are created one level at a time so that the manifest knows
# which ones did not exist before.
new_dirs=()
make_dir() {
    local d=$1
    [ -d "$d" ] && return 0
    make_dir "$(dirname "$d")"
    mkdir -- "$d"
    new_dirs+=("$d")
}
files=()
put() { # put MODE SRC DEST
    make_dir "$(dirname "$3")"
    install -m "$1" -- "$2" "$3"
    files+=("f $3")
}
link() { # link TARGET NAME
    make_dir "$(dirname "$2")"
    ln -sfn -- "$1" "$2"
    files+=("l $2")
}
pc() { # pc NAME DESCRIPTION LIB [REQUIRES]
    local tmp
    tmp=$(mktemp)
    cat >"$tmp" <<EOF
prefix=$prefix
includedir=\${prefix}/include
libdir=\${prefix}/lib/softrdma

Name: $1
Description: $2
Version: $version
${4:+Requires: $4
}Cflags: -I\${includedir}
Libs: -L\${libdir} -l$3
EOF
    put 0644 "$tmp" "$prefix/lib/pkgconfig/$1.pc"
    rm -f "$tmp"
}

put 0755 "$rel/softrdma" "$prefix/bin/softrdma"
put 0755 "$rel/libibverbs.so" "$libdir/libibverbs.so.1"
put 0755 "$rel/librdmacm.so" "$libdir/librdmacm.so.1"
link libibverbs.so.1 "$libdir/libibverbs.so"
link librdmacm.so.1 "$libdir/librdmacm.so"
put 0755 "$rel/libsoftrdma_sockets.so" "$libdir/libsoftrdma-sockets.so.1"
for h in crates/*/include/softrdma/*.h; do
    put 0644 "$h" "$prefix/include/softrdma/$(basename "$h")"
done
put 0755 "$rel/libexs.so" "$prefix/lib/libexs.so.1"
link libexs.so.1 "$prefix/lib/libexs.so"
put 0644 crates/exs/include/sys/exs.h "$prefix/include/sys/exs.h"
exs_pc=$(mktemp)
cat >"$exs_pc" <<EOF
prefix=$prefix
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: exs
Description: softrdma's Extended Sockets API (sys/exs.h): asynchronous socket I/O with event queues and memory registration
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -lexs
EOF
put 0644 "$exs_pc" "$prefix/lib/pkgconfig/exs.pc"
rm -f "$exs_pc"
pc softrdma-verbs "softrdma's drop-in libibverbs (rdma-core 44 ABI) and its extensions in softrdma/verbs.h; run programs with 'softrdma run'" ibverbs
pc softrdma-rdmacm "softrdma's drop-in librdmacm (rdma-core 44 ABI); run programs with 'softrdma run'" rdmacm softrdma-verbs

{
    for d in "${new_dirs[@]+"${new_dirs[@]}"}"; do printf 'd %s\n' "$d"; done
    printf '%s\n' "${files[@]}"
} >"$manifest"
log "installed softrdma $version into $prefix (${#files[@]} files; manifest $manifest)"
