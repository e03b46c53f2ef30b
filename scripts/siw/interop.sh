#!/usr/bin/env bash
# scripts/siw/interop.sh - one interop scenario between a host command and the
# Linux kernel's soft-iWARP driver (siw) in a qemu guest; exits with the verdict.
#
# usage: scripts/siw/interop.sh [options] SCENARIO -- HOST-CMD [ARG...]
#
#   host-to-guest  the guest runs `rping -s -a 10.0.2.15 -p 7174 -v -C 1`; the
#                  host's 127.0.0.1:7174 is forwarded to it. HOST-CMD is the
#                  client: connect to 127.0.0.1:7174, do one rping iteration.
#                  PASS = HOST-CMD exits 0 and the guest's server printed
#                  "server ping data: rdma-ping-0".
#   guest-to-host  HOST-CMD is the server: listen on 127.0.0.1:27174 and serve
#                  one iteration. Once a socket listens on port 27174 the guest
#                  runs `rping -c -a 10.0.2.2 -p 27174 -v -V -C 1` (10.0.2.2 is
#                  the host's 127.0.0.1 as qemu shows it to the guest).
#                  PASS = the guest's rping exits 0 and HOST-CMD exits 0.
#
# HOST-CMD runs as given (no shell) in the caller's directory, stdin
# /dev/null, output to RUN/host.log, after the guest is ready.
#
# options:
#   -v pristine|knobs  siw as Debian's source has it (default), or the build
#                      whose protocol constants are module parameters
#   -o NAME=V[,...]    module parameters for -v knobs, e.g.
#                      mpa_crc_required=1,peer_to_peer=1
#   -O DIR             run directory (default $SOFTRDMA_SIW_HOME/runs/TIME-PID-SCENARIO;
#                      the newest 100 of those are kept)
#   -c                 copy the guest console to stderr while it runs
#
# environment:
#   SOFTRDMA_SIW_HOME       image and runs (default /var/tmp/softrdma-siw)
#   SOFTRDMA_SIW_TIMEOUT    bound for one guest run, boot included (default 300 s)
#   SOFTRDMA_SIW_BOOT_TIMEOUT  a guest not "siw ready" by then is a failed boot
#                           (default 150 s)
#   SOFTRDMA_SIW_HOST_TIMEOUT  bound for HOST-CMD (default 120 s)
#   SOFTRDMA_SIW_BOOTS      boots tried when the guest kernel crashes or hangs
#                           before "siw ready" (default 3)
#   SOFTRDMA_SIW_LOCK_TIMEOUT  wait for another run on this machine (default 1200 s)
#
# exit: 0 PASS, 1 FAIL, 3 environment (no image and no way to build one,
#   ports busy, lock not obtained, qemu missing), 2 usage.
# The image is built on first use (scripts/siw/build-image.sh; root).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
export SOFTRDMA_SIW_HOME=${SOFTRDMA_SIW_HOME:-/var/tmp/softrdma-siw}
TIMEOUT=${SOFTRDMA_SIW_TIMEOUT:-300}
BOOT_TIMEOUT=${SOFTRDMA_SIW_BOOT_TIMEOUT:-150}
HOST_TIMEOUT=${SOFTRDMA_SIW_HOST_TIMEOUT:-120}
BOOTS=${SOFTRDMA_SIW_BOOTS:-3}
LOCK_TIMEOUT=${SOFTRDMA_SIW_LOCK_TIMEOUT:-1200}

say() { printf 'siw-interop: %s\n' "$*" >&2; }
die() { local rc=$1; shift; say "$*"; exit "$rc"; }
usage() { sed -n '2,/^set -uo/{/^#/{s/^# \{0,1\}//;p}}' "$0"; }

VARIANT=pristine SIWOPTS="" OUT="" CONSOLE=0 SCENARIO=""
while [ $# -gt 0 ]; do
  case $1 in
    -v) VARIANT=${2:?}; shift 2 ;;
    -o) SIWOPTS=${2:?}; shift 2 ;;
    -O) OUT=${2:?}; shift 2 ;;
    -c) CONSOLE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) die 2 "unknown option $1 (see --help)" ;;
    *) [ -z "$SCENARIO" ] || die 2 "one scenario only; the host command goes after --"
       SCENARIO=$1; shift ;;
  esac
done
[ $# -gt 0 ] || { usage >&2; exit 2; }
HOST_CMD=("$@")
case $SCENARIO in
  host-to-guest) FWD_PORT=7174 HOST_PORT="" ;;
  guest-to-host) FWD_PORT="" HOST_PORT=27174 ;;
  *) die 2 "scenario must be host-to-guest or guest-to-host" ;;
esac
case $VARIANT in pristine|knobs) ;; *) die 2 "-v takes pristine or knobs" ;; esac
[ -z "$SIWOPTS" ] || [ "$VARIANT" = knobs ] || die 2 "-o needs -v knobs (pristine siw has no parameters)"
[[ -z $SIWOPTS || $SIWOPTS =~ ^[a-z_]+=[0-9]+(,[a-z_]+=[0-9]+)*$ ]] || die 2 "-o takes name=number[,name=number...]"
command -v qemu-system-x86_64 >/dev/null || die 3 "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"

# ---------------------------------------------------- one run per machine
# (the ports are fixed, and two TCG guests on a small machine slow each other)
mkdir -p "$SOFTRDMA_SIW_HOME" || die 3 "cannot create $SOFTRDMA_SIW_HOME"
SOFTRDMA_SIW_HOME=$(cd "$SOFTRDMA_SIW_HOME" && pwd)
exec 9>"$SOFTRDMA_SIW_HOME/lock" || die 3 "cannot write $SOFTRDMA_SIW_HOME/lock"
if ! flock -n 9; then
  say "waiting up to ${LOCK_TIMEOUT}s for another siw run on this machine"
  flock -w "$LOCK_TIMEOUT" 9 || die 3 "another siw run holds $SOFTRDMA_SIW_HOME/lock"
fi

# ----------------------------------------------------------------- image
if ! "$HERE/build-image.sh" --check >/dev/null 2>&1; then
  mkdir -p "$SOFTRDMA_SIW_HOME/logs"
  blog=$SOFTRDMA_SIW_HOME/logs/build.log
  say "building the guest image (a few minutes; log $blog)"
  timeout -k 10 1800 "$HERE/build-image.sh" </dev/null >"$blog" 2>&1 \
    || { tail -n 20 "$blog" >&2; die 3 "image build failed (log $blog)"; }
fi
IMG=$SOFTRDMA_SIW_HOME/image

# ----------------------------------------------------------------- ports
port_listening() {
  grep -qE ":$(printf %04X "$1") 0+:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
for p in 7174 27174; do
  port_listening $p && die 3 "TCP port $p is in use on this host (the scenarios need it)"
done

# keep the newest 100 run directories (about 70 KB each); names sort by time
shopt -s nullglob
old=("$SOFTRDMA_SIW_HOME"/runs/*/)
[ ${#old[@]} -gt 100 ] && rm -rf "${old[@]:0:${#old[@]}-100}"
shopt -u nullglob
[ -n "$OUT" ] || OUT=$SOFTRDMA_SIW_HOME/runs/$(date +%Y%m%d-%H%M%S)-$$-$SCENARIO
mkdir -p "$OUT" || die 3 "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)

# ------------------------------------------------------------------ qemu
APPEND="console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off tsc=reliable no_timer_check"
APPEND+=" i8042.noaux i8042.nokbd rdinit=/init softrdma.scenario=$SCENARIO softrdma.variant=$VARIANT"
[ -n "$SIWOPTS" ] && APPEND+=" softrdma.siwopts=$SIWOPTS"
NET="user,id=n0,net=10.0.2.0/24,host=10.0.2.2"
[ -n "$FWD_PORT" ] && NET+=",hostfwd=tcp:127.0.0.1:$FWD_PORT-10.0.2.15:$FWD_PORT"
# TCG: KVM is often unavailable (nested) and not needed at this scale.
QEMU=(qemu-system-x86_64 -accel tcg -M pc -cpu max -smp 2 -m 1024
  -nodefaults -no-user-config -nographic -no-reboot -serial stdio -monitor none
  -kernel "$IMG/vmlinuz" -initrd "$IMG/initramfs.cpio" -append "$APPEND"
  -netdev "$NET" -device "virtio-net-pci,netdev=n0,romfile="
  -object "filter-dump,id=cap,netdev=n0,file=$OUT/guest.pcap"
  -fsdev "local,id=out,path=$OUT,security_model=none"
  -device "virtio-9p-pci,fsdev=out,mount_tag=out")
printf '%q ' "${QEMU[@]}" >"$OUT/qemu.cmdline"
printf '%q ' "${HOST_CMD[@]}" >"$OUT/host.cmdline"

QPID="" HPID=""
stop_group() {  # PGID: TERM, then KILL what is left (timeout made it a group leader)
  [ -n "$1" ] || return 0
  kill -TERM -- "-$1" 2>/dev/null || return 0
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 -- "-$1" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL -- "-$1" 2>/dev/null
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() { stop_group "$HPID"; stop_group "$QPID"; }
trap cleanup EXIT
trap 'say interrupted; exit 130' INT TERM

now() { date +%s%N | cut -c1-13; }  # milliseconds
T_START=$(now)
ms() { local d=$(($(now) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

# run_guest: one boot. Sets BOOT_FAILED=1 when the guest died or hung before
# "siw ready" (nothing of the scenario ran: the boot may be retried).
run_guest() {
  local t0 ready=0 host_started=0 host_done=0 listening_sent=0 deadline boot_deadline hrc
  rm -f "$OUT"/{ready,status,host-listening,host-done,host-status,scenario.log,env.txt,dmesg.txt}
  BOOT_FAILED=0 HRC="" QPID="" HPID=""
  t0=$(now)
  deadline=$((t0 + TIMEOUT * 1000)) boot_deadline=$((t0 + BOOT_TIMEOUT * 1000))
  : >"$OUT/console.log"
  timeout -k 5 "$TIMEOUT" "${QEMU[@]}" </dev/null >"$OUT/console.log" 2>&1 &
  QPID=$!
  if [ "$CONSOLE" = 1 ]; then tail -n +1 -f --pid="$QPID" "$OUT/console.log" >&2 & fi
  while kill -0 "$QPID" 2>/dev/null; do
    if [ $ready = 0 ]; then
      if grep -q 'siw ready' "$OUT/console.log"; then
        ready=1
        BOOT_S=$(ms "$t0")
      elif grep -qE 'Kernel panic|Oops: ' "$OUT/console.log" || [ "$(now)" -gt $boot_deadline ]; then
        BOOT_FAILED=1
        stop_group "$QPID"
        break
      fi
    fi
    if [ $host_started = 0 ] && [ -e "$OUT/ready" ]; then
      timeout -k 5 "$HOST_TIMEOUT" "${HOST_CMD[@]}" </dev/null >"$OUT/host.log" 2>&1 &
      HPID=$!
      host_started=1
    fi
    if [ $host_started = 1 ] && [ $host_done = 0 ]; then
      if [ -n "$HOST_PORT" ] && [ $listening_sent = 0 ] && port_listening "$HOST_PORT"; then
        touch "$OUT/host-listening"
        listening_sent=1
      fi
      if ! kill -0 "$HPID" 2>/dev/null; then
        wait "$HPID"
        hrc=$?
        HRC=$hrc HPID=""
        echo "$hrc" >"$OUT/host-status"
        touch "$OUT/host-done"
        host_done=1
      fi
    fi
    [ "$(now)" -gt $((deadline + 10000)) ] && break  # timeout(1) failed to stop qemu
    sleep 0.1
  done
  stop_group "$QPID"
  wait "$QPID" 2>/dev/null
  QRC=$? QPID=""
  if [ -n "$HPID" ]; then  # the guest ended before the host command did
    kill -0 "$HPID" 2>/dev/null && say "the guest stopped first: ending the host command" && stop_group "$HPID"
    wait "$HPID" 2>/dev/null
    HRC=$? HPID=""
  fi
  [ $ready = 0 ] && ! grep -q 'siw FAILED' "$OUT/console.log" && BOOT_FAILED=1
  return 0
}

say "$SCENARIO, siw $VARIANT${SIWOPTS:+ ($SIWOPTS)}: run directory $OUT"
BOOT_S="" BOOT_FAILED=0 QRC=""
for ((boot = 1; boot <= BOOTS; boot++)); do
  run_guest
  [ $BOOT_FAILED = 1 ] || break
  mv "$OUT/console.log" "$OUT/failed-boot-$boot.console.log"
  say "boot $boot of $BOOTS did not reach 'siw ready' ($(grep -m1 -oE '(Kernel panic|Oops: )[^[:cntrl:]]{0,60}' "$OUT/failed-boot-$boot.console.log" || echo "no oops, timed out")); console kept"
done

GUEST=$(cat "$OUT/status" 2>/dev/null || echo none)
if [ $BOOT_FAILED = 1 ]; then
  VERDICT="FAIL (no boot of $BOOTS reached 'siw ready')"
elif [ "$GUEST" = 0 ] && [ "${HRC:-none}" = 0 ]; then
  VERDICT=PASS
else
  VERDICT=FAIL
fi
say "$VERDICT: guest status $GUEST, host command exit ${HRC:-not run}${BOOT_S:+, siw ready after ${BOOT_S}s}, total $(ms "$T_START")s"
[ "${HRC:-}" = 124 ] && say "  the host command hit its ${HOST_TIMEOUT}s limit"
[ "$QRC" = 124 ] && [ $BOOT_FAILED = 0 ] && say "  the guest hit its ${TIMEOUT}s limit (SOFTRDMA_SIW_TIMEOUT)"
say "  logs: $OUT/{host.log,scenario.log,console.log,env.txt,dmesg.txt}; capture: $OUT/guest.pcap"
if [ "$VERDICT" != PASS ]; then
  for f in host.log scenario.log console.log "failed-boot-$BOOTS.console.log"; do
    [ -s "$OUT/$f" ] || continue
    echo "----- $OUT/$f (last lines)" >&2
    tail -n 20 "$OUT/$f" >&2
  done
  exit 1
fi
exit 0
