#!/usr/bin/env bash
# scripts/siw/build-image.sh - build (or confirm) the qemu guest used by the
# kernel soft-iWARP interop tests: Debian's kernel, the kernel's siw driver
# compiled from Debian's linux-source of the same version, and a small
# initramfs root with rping (rdmacm-utils), ibverbs-utils and iproute2 whose
# /init is scripts/siw/guest/init.
#
# usage: scripts/siw/build-image.sh [--check | --refresh | --clean]
#   (none)     build whatever is missing or out of date; a no-op when the
#              image is current (no root and no network needed then)
#   --check    exit 0 if the image is current, 1 if a build is needed
#   --refresh  ask the archive again for the suite's current kernel (a new
#              Debian kernel version rebuilds everything that depends on it)
#   --clean    delete the image and all build state
#
# environment:
#   SOFTRDMA_SIW_HOME    state directory (default /var/tmp/softrdma-siw)
#   SOFTRDMA_SIW_SUITE   Debian suite of kernel and guest (default trixie)
#   SOFTRDMA_SIW_MIRROR  Debian mirror URL; default: the first URI ending in
#                        /debian in the host's apt sources
#
# Debian builds its kernels with CONFIG_RDMA_SIW unset, so siw.ko is compiled
# here, out of tree, in a debootstrapped chroot of the same suite (the
# compiler the kernel headers ask for). Two builds are packed: "pristine"
# (the source as Debian ships it) and "knobs" (siw_main.c's compile-time
# protocol constants turned into read-only module parameters, same defaults).
#
# Each step records the inputs it was built from in work/keys/STEP and runs
# again only when they change (guest/init, suite, mirror, kernel version,
# package lists). The result is image/{vmlinuz,initramfs.cpio,manifest.txt}.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
SIW_HOME=${SOFTRDMA_SIW_HOME:-/var/tmp/softrdma-siw}
SUITE=${SOFTRDMA_SIW_SUITE:-trixie}
MODE=build
case ${1:-} in
  "") ;;
  --check) MODE=check ;;
  --refresh) MODE=refresh ;;
  --clean) MODE=clean ;;
  -h|--help) sed -n '2,/^set -euo/{/^#/{s/^# \{0,1\}//;p}}' "$0"; exit 0 ;;
  *) echo "usage: $0 [--check | --refresh | --clean]" >&2; exit 2 ;;
esac

mkdir -p "$SIW_HOME"
SIW_HOME=$(cd "$SIW_HOME" && pwd)
W=$SIW_HOME/work
IMG=$SIW_HOME/image
if [ "$MODE" = clean ]; then
  rm -rf "$W" "$IMG"
  echo "removed $W and $IMG"
  exit 0
fi

# Packages of the guest root (rdma-core itself is not needed: it would pull
# in udev and systemd) and of the chroot siw is compiled in.
GUEST_PKGS=kmod,iproute2,ibverbs-providers,ibverbs-utils,rdmacm-utils
BUILD_PKGS=make,libc6-dev,kmod,libelf1t64,libssl3t64,zlib1g,pahole
# Modules the guest loads (modprobe resolves their dependencies at build time).
MODULES="siw ib_uverbs rdma_ucm rdma_cm iw_cm ib_cm ib_core crc32c_generic virtio_pci virtio_net 9p 9pnet_virtio"
# Bump when the way siw.ko is built changes.
SIW_RECIPE=1

say() { printf '[build-image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { say "error: $*"; exit 1; }

# Debian mirror: the host's apt configuration names it (deb822 files first).
host_mirror() {
  local f u
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    # shellcheck disable=SC2013 # one URI per word
    for u in $(sed -n 's/^URIs:[[:space:]]*//Ip' "$f"); do
      u=${u%/}
      case $u in *://*/debian) echo "$u"; return 0 ;; esac
    done
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    u=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { sub(/\/$/, "", $i); if ($i ~ /\/debian$/) { print $i; exit } } }' "$f")
    [ -n "$u" ] && { echo "$u"; return 0; }
  done
  return 1
}
MIRROR=${SOFTRDMA_SIW_MIRROR:-$(host_mirror || true)}
[ -n "$MIRROR" ] || die "no Debian mirror in the host's apt sources; set SOFTRDMA_SIW_MIRROR"

# ------------------------------------------------------------ step keys
mkdir -p "$W/keys"
# stale STEP KEY: true when STEP must run (its recorded inputs differ)
stale() {
  [ "$(cat "$W/keys/$1" 2>/dev/null)" != "$2" ] || return 1
  if [ "$MODE" = check ]; then
    echo "image out of date (step $1)"
    exit 1
  fi
  return 0
}
finish() { printf '%s\n' "$2" > "$W/keys/$1"; }

ROOT_CHECKED=0
need_root() {  # first step that really builds: root, host tools, log header
  [ "$ROOT_CHECKED" = 1 ] && return 0
  [ "$(id -u)" = 0 ] || die "building the image needs root (debootstrap, chroot); run: sudo $0"
  local miss=() t
  for t in debootstrap:debootstrap cpio:cpio xz:xz-utils dpkg-deb:dpkg qemu-system-x86_64:qemu-system-x86; do
    command -v "${t%%:*}" >/dev/null || miss+=("${t#*:}")
  done
  if [ ${#miss[@]} -gt 0 ]; then
    say "installing host packages: ${miss[*]}"
    apt-get -q update >&2
    DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=600 \
      install --no-install-recommends "${miss[@]}" >&2
  fi
  say "building in $SIW_HOME (suite $SUITE, mirror $MIRROR)"
  ROOT_CHECKED=1
}

# Private apt state for $SUITE: the host's own apt configuration and package
# lists stay untouched.
APTD=$W/apt
APT=(-o Dir::Etc::SourceList="$APTD/sources.list" -o Dir::Etc::SourceParts="$APTD/empty"
     -o Dir::State::Lists="$APTD/lists" -o Dir::State::status="$APTD/status"
     -o Dir::Cache="$APTD/cache" -o Dir::Etc::Preferences=/nonexistent
     -o Dir::Etc::PreferencesParts="$APTD/empty" -o APT::Sandbox::User=root)

T0=$SECONDS
[ "$MODE" = refresh ] && rm -f "$W/keys/kernel"

# ------------------------------------------- 1. kernel version and packages
K_KEY="suite=$SUITE mirror=$MIRROR"
if stale kernel "$K_KEY"; then
  need_root
  rm -rf "$APTD" "$W/debs" "$W/siw-src"
  mkdir -p "$APTD"/{lists/partial,cache/archives/partial,empty} "$W/debs" "$W/siw-src"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $SUITE main" > "$APTD/sources.list"
  : > "$APTD/status"
  say "apt-get update for $SUITE (private lists)"
  apt-get "${APT[@]}" -q update >&2
  img=$(apt-cache "${APT[@]}" depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n1)
  [ -n "$img" ] || die "linux-image-amd64 in $SUITE depends on no versioned kernel package"
  KVER=${img#linux-image-}                # e.g. 6.12.57+deb13-amd64
  KABI=${KVER%-amd64}                     # 6.12.57+deb13
  MAJMIN=$(cut -d. -f1-2 <<<"$KVER")      # 6.12
  PKGVER=$(apt-cache "${APT[@]}" show "$img" | sed -n 's/^Version: //p' | head -n1)
  GCC=$(apt-cache "${APT[@]}" depends "linux-headers-$KVER" "linux-kbuild-$KABI" \
        | grep -o 'gcc-[0-9][0-9]*' | head -n1)
  [ -n "$GCC" ] || die "cannot tell which gcc linux-headers-$KVER wants"
  say "kernel $KVER (Debian $PKGVER), compiler $GCC: downloading image, headers, kbuild, source"
  (cd "$W/debs" && apt-get "${APT[@]}" -q download "linux-image-$KVER=$PKGVER" \
      "linux-headers-$KVER=$PKGVER" "linux-headers-$KABI-common=$PKGVER" \
      "linux-kbuild-$KABI=$PKGVER" "linux-source-$MAJMIN=$PKGVER" >&2)
  # keep only drivers/infiniband/sw/siw of the source package (~150 MB)
  dpkg-deb --fsys-tarfile "$W/debs/linux-source-${MAJMIN}_"*.deb \
    | tar -xO "./usr/src/linux-source-$MAJMIN.tar.xz" \
    | tar -xJ -C "$W/siw-src" --strip-components=5 "linux-source-$MAJMIN/drivers/infiniband/sw/siw"
  rm -f "$W/debs/linux-source-${MAJMIN}_"*.deb
  [ -f "$W/siw-src/siw_main.c" ] || die "no siw source in linux-source-$MAJMIN"
  printf 'KVER=%s\nKABI=%s\nMAJMIN=%s\nPKGVER=%s\nGCC=%s\n' "$KVER" "$KABI" "$MAJMIN" "$PKGVER" "$GCC" > "$W/kernel.env"
  finish kernel "$K_KEY"
fi
# shellcheck source=/dev/null
. "$W/kernel.env"

# ------------------------------------------------ 2. chroot to compile in
B_KEY="$K_KEY kernel=$PKGVER/$KVER pkgs=$GCC,$BUILD_PKGS"
BR=$W/build-root
if stale build-root "$B_KEY"; then
  need_root
  rm -rf "$BR"
  say "debootstrap $SUITE build chroot (+ $GCC)"
  debootstrap --variant=minbase --include="$GCC,$BUILD_PKGS" "$SUITE" "$BR" "$MIRROR" > "$W/debootstrap-build.log" 2>&1 \
    || { tail -n 20 "$W/debootstrap-build.log" >&2; die "debootstrap failed (log $W/debootstrap-build.log)"; }
  for d in "$W"/debs/*.deb; do dpkg-deb -x "$d" "$BR"; done
  finish build-root "$B_KEY"
fi

# --------------------------------------------------------- 3. siw.ko x 2
S_KEY="$B_KEY recipe=$SIW_RECIPE"
if stale siw "$S_KEY"; then
  need_root
  rm -rf "$BR/opt/siw" "$W/siw"
  mkdir -p "$BR/opt/siw" "$W/siw"
  for v in pristine knobs; do
    mkdir "$BR/opt/siw/$v"
    cp "$W"/siw-src/*.[ch] "$W/siw-src/Makefile" "$BR/opt/siw/$v/"
  done
  # knobs: each `const bool NAME[ = VALUE];` of siw_main.c becomes a bool
  # module parameter (settable at load time, read-only later), mpa_version a
  # byte one; siw.h's extern declarations lose their const.
  k=$BR/opt/siw/knobs
  sed -i -e 's/^const bool \([a-z_]*\)\(.*\);$/bool \1\2;\nmodule_param(\1, bool, 0444);/' \
         -e 's/^u_char mpa_version\(.*\);$/u_char mpa_version\1;\nmodule_param(mpa_version, byte, 0444);/' \
         "$k/siw_main.c"
  sed -i 's/^extern const bool /extern bool /' "$k/siw.h"
  for p in mpa_crc_required peer_to_peer mpa_version; do
    grep -q "^module_param($p," "$k/siw_main.c" || die "knobs: siw_main.c has no constant '$p' any more"
  done
  for v in pristine knobs; do
    say "compiling siw.ko ($v) against linux-headers-$KVER"
    chroot "$BR" make -C "/usr/src/linux-headers-$KVER" M="/opt/siw/$v" CONFIG_RDMA_SIW=m CC="$GCC" modules \
      > "$W/siw-$v.log" 2>&1 || { tail -n 30 "$W/siw-$v.log" >&2; die "siw ($v) did not compile"; }
    chroot "$BR" strip --strip-debug "/opt/siw/$v/siw.ko"
    cp "$BR/opt/siw/$v/siw.ko" "$W/siw/siw-$v.ko"
  done
  finish siw "$S_KEY"
fi

# ------------------------------------------------------------ 4. guest root
G_KEY="$K_KEY pkgs=$GUEST_PKGS"
GR=$W/guest-root
if stale guest-root "$G_KEY"; then
  need_root
  rm -rf "$GR"
  say "debootstrap $SUITE guest root (+ $GUEST_PKGS)"
  debootstrap --variant=minbase --include="$GUEST_PKGS" "$SUITE" "$GR" "$MIRROR" > "$W/debootstrap-guest.log" 2>&1 \
    || { tail -n 20 "$W/debootstrap-guest.log" >&2; die "debootstrap failed (log $W/debootstrap-guest.log)"; }
  finish guest-root "$G_KEY"
fi

# ------------------------------------------------------------ 5. initramfs
I_KEY="$S_KEY | $G_KEY | modules=$MODULES | init=$(sha256sum < "$HERE/guest/init" | cut -c1-16)"
if stale image "$I_KEY" || [ ! -f "$IMG/initramfs.cpio" ]; then
  [ "$MODE" = check ] && { echo "image missing"; exit 1; }
  need_root
  ST=$W/staging
  rm -rf "$ST"
  mkdir -p "$ST"
  say "assembling the initramfs"
  # the guest root without what a diskless test guest never reads
  tar -C "$GR" -cf - --exclude=./usr/share/doc --exclude=./usr/share/man \
      --exclude=./usr/share/info --exclude=./usr/share/locale --exclude=./usr/share/i18n \
      --exclude=./usr/share/zoneinfo --exclude=./usr/share/common-licenses \
      --exclude=./var/cache/apt --exclude=./var/lib/apt/lists --exclude=./debootstrap \
      --exclude=./usr/share/perl5 --exclude=./usr/lib/x86_64-linux-gnu/perl-base \
      --exclude=./usr/lib/x86_64-linux-gnu/gconv . | tar -C "$ST" -xf -
  # siw (pristine) joins Debian's module tree; copy the modules we load and
  # their dependencies, uncompressed (xz under TCG costs seconds per boot)
  MD=usr/lib/modules/$KVER
  install -D -m 0644 "$W/siw/siw-pristine.ko" "$BR/$MD/updates/siw.ko"
  chroot "$BR" depmod "$KVER"
  # shellcheck disable=SC2086 # MODULES is a word list
  chroot "$BR" modprobe -S "$KVER" --show-depends -a $MODULES | awk '$1 == "insmod" { print $2 }' | sort -u > "$W/modules.list"
  grep -q /siw.ko "$W/modules.list" || die "siw.ko missing from the module list"
  (cd "$BR" && sed 's|^/||' "$W/modules.list" | cpio -pdm --quiet "$ST")
  cp "$BR/$MD"/modules.builtin "$BR/$MD"/modules.builtin.modinfo "$BR/$MD"/modules.order "$ST/$MD/"
  find "$ST/$MD" -name '*.ko.xz' -exec xz -d {} +
  chroot "$ST" depmod "$KVER"
  install -D -m 0644 "$W/siw/siw-knobs.ko" "$ST/opt/siw-knobs/siw.ko"
  install -m 0755 "$HERE/guest/init" "$ST/init"
  cp "$W/kernel.env" "$ST/etc/siw-guest.env"
  echo siw-guest > "$ST/etc/hostname"
  mkdir -p "$ST/out"
  mkdir -p "$IMG"
  (cd "$ST" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet --reproducible) > "$IMG/initramfs.cpio.new"
  cp "$BR/boot/vmlinuz-$KVER" "$IMG/vmlinuz"
  mv "$IMG/initramfs.cpio.new" "$IMG/initramfs.cpio"
  {
    echo "built:    $(date -u +%FT%TZ)"
    echo "suite:    $SUITE ($MIRROR)"
    echo "kernel:   linux-image-$KVER $PKGVER"
    echo "siw.ko:   linux-source-$MAJMIN $PKGVER drivers/infiniband/sw/siw, built with $GCC out of tree (pristine, knobs)"
    echo "modules:  $(wc -l < "$W/modules.list") ($MODULES and dependencies)"
    echo "guest:    debootstrap minbase + $GUEST_PKGS"
    # shellcheck disable=SC2016 # a dpkg-query format, not a shell expression
    chroot "$GR" dpkg-query -W -f '          ${Package} ${Version}\n' ibverbs-providers ibverbs-utils rdmacm-utils iproute2 libibverbs1 librdmacm1t64 2>/dev/null || true
    echo "init:     sha256 $(sha256sum < "$HERE/guest/init" | cut -d' ' -f1)"
    (cd "$IMG" && sha256sum vmlinuz initramfs.cpio)
  } > "$IMG/manifest.txt"
  rm -rf "$ST"
  finish image "$I_KEY"
  say "image ready in $((SECONDS - T0)) s: $IMG ($(du -sh "$IMG" | cut -f1))"
fi
[ "$MODE" = check ] && echo "image up to date"
exit 0
