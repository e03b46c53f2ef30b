#!/usr/bin/env bash
# scripts/siw/interop.sh - run one siwvm scenario against Linux kernel soft-iWARP
# (siw 6.12 in a qemu TCG guest) with a host-side peer of ours, and exit with
# the scenario's status.
#
# usage:
#   scripts/siw/interop.sh [options] SCENARIO [-- HOST-CMD [ARG...]]
#
#   SCENARIO      host-to-guest   the guest runs `rping -s -a 10.0.2.15 -p 7174 -v -C 1`;
#                                 HOST-CMD is an iWARP client: connect to 127.0.0.1:7174,
#                                 do one rping iteration, exit 0.
#                                 PASS = HOST-CMD exit 0 and the guest server printed
#                                 "server ping data: rdma-ping-0".
#                 guest-to-host   HOST-CMD is an iWARP server: listen on 127.0.0.1:27174,
#                                 serve one iteration of the guest's
#                                 `rping -c -a 10.0.2.2 -p 27174 -v -V -C 1`, exit 0.
#                                 PASS = guest rping exit 0 (it checks the echoed data)
#                                 and HOST-CMD exit 0.
#                 rping-local, rdmacm-local, perftest-local, all, info: guest only,
#                                 no HOST-CMD.
#   -- HOST-CMD   run as given (argv, no shell), in the caller's working directory,
#                 stdin /dev/null, output to RUN/host-cmd.log, killed after
#                 --host-timeout seconds. It sees these variables:
#                   SIWVM_OUT        the run directory
#                   SIWVM_SCENARIO   host-to-guest | guest-to-host
#                   SIWVM_ROLE       client (host-to-guest) | server (guest-to-host)
#                   SIWVM_CONNECT    127.0.0.1:7174          (host-to-guest)
#                   SIWVM_LISTEN     127.0.0.1:27174         (guest-to-host)
#                   SIWVM_READY_FILE $SIWVM_OUT/host-listening (guest-to-host)
#                   SIWVM_VARIANT, SIWVM_SIWOPTS  the guest's siw build and module options
#                 guest-to-host: the guest starts its client only once the ready file
#                 exists. HOST-CMD may create it itself; otherwise this script creates
#                 it as soon as a socket listens on port 27174 (it looks at
#                 /proc/net/tcp{,6}; it never connects to the port).
#
# options:
#   -v, --variant V      pristine (default; siw.ko exactly as in Debian's 6.12 source)
#                        | knobs (same source, compile-time constants as module params)
#   -o, --siwopts LIST   knobs module params, e.g. mpa_crc_required=1,peer_to_peer=1
#   -H, --host-shell STR HOST-CMD as one bash string instead of `-- argv`
#                        (expanded at run time, so "$SIWVM_OUT" etc. work in it)
#       --standin        host peer = kernel siw rping in a second siwvm guest reached
#                        through the host's 127.0.0.1 (checks this harness and the
#                        machine without any softrdma code; same variant/siwopts)
#   -t, --timeout S      bound for the guest run (run-guest.sh -t; default 240)
#   -T, --host-timeout S bound for HOST-CMD (default 100; the guest gives up after 120)
#   -b, --boot-timeout S kill a guest not 'siw ready' after S seconds (default 90)
#   -a, --accel A        tcg (default) | kvm (did not work on the machines tried)
#   -f, --fwd PORTS      host->guest TCP forwards (default: 7174 for host-to-guest,
#                        none otherwise)
#   -O, --out DIR        run directory (default $SIWVM_HOME/runs/<time>-<pid>-<scenario>)
#       --console        echo the guest console and run-guest.sh's progress
#       --no-build       never build: exit 3 if there is no image
#   -h, --help
#
# environment:
#   SIWVM_HOME            state dir, kept between runs (default /var/tmp/softrdma-siwvm;
#                         image ~100 MB + ~1.4 GB of build chroots, runs/ grows ~0.1 MB a run)
#   SIWVM_TOOL            the siwvm tool (default <repo>/../shared/tools/siwvm)
#   SIWVM_BUILD_TIMEOUT   bound for an image build (default 1200 s; ~150 s from scratch)
#   SIWVM_LOCK_TIMEOUT    wait at most this long for another interop.sh run on this
#                         machine (ports are fixed: one guest at a time; default 900 s)
#   SIWVM_BOOT_ATTEMPTS   boots tried when the guest kernel oopses/panics or hangs
#                         before 'siw ready' (so before any scenario step; default 3)
#
# exit status: the scenario's: 0 PASS, 1 FAIL, 124 time limit or boot watchdog,
#   125 guest gave no status; 2 usage error; 3 environment: no image and cannot
#   build one (not root / build failed), qemu or the accelerator unavailable,
#   ports busy, lock not obtained.
#
# The image is built on first use (root needed: debootstrap/chroot; needs the
# Debian archive) and kept in SIWVM_HOME; later builds are a no-op (<0.1 s).
set -uo pipefail

ME=siw-interop
say() { printf '%s: %s\n' "$ME" "$*" >&2; }
die() { local rc=$1; shift; say "$*"; exit "$rc"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
usage() { sed -n '2,/^set -uo/{/^#/{s/^# \{0,1\}//;p}}' "$0"; }

T_START=$(now)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
TOOL=${SIWVM_TOOL:-$REPO/../shared/tools/siwvm}
export SIWVM_HOME=${SIWVM_HOME:-/var/tmp/softrdma-siwvm}
BUILD_TIMEOUT=${SIWVM_BUILD_TIMEOUT:-1200}
LOCK_TIMEOUT=${SIWVM_LOCK_TIMEOUT:-900}
export DEBIAN_FRONTEND=noninteractive

VARIANT=pristine SIWOPTS="" HOSTSHELL="" STANDIN=0 TIMEOUT=240 HTIMEOUT=100 BTIMEOUT=90
ACCEL=tcg FWD="" FWD_SET=0 OUT="" CONSOLE=0 NOBUILD=0 SCEN=""
HOSTARGV=()
while [ $# -gt 0 ]; do
  case $1 in
    -v|--variant) VARIANT=${2:?}; shift 2 ;;
    -o|--siwopts) SIWOPTS=${2?}; shift 2 ;;
    -H|--host-shell) HOSTSHELL=${2:?}; shift 2 ;;
    --standin) STANDIN=1; shift ;;
    -t|--timeout) TIMEOUT=${2:?}; shift 2 ;;
    -T|--host-timeout) HTIMEOUT=${2:?}; shift 2 ;;
    -b|--boot-timeout) BTIMEOUT=${2:?}; shift 2 ;;
    -a|--accel) ACCEL=${2:?}; shift 2 ;;
    -f|--fwd) FWD=${2?}; FWD_SET=1; shift 2 ;;
    -O|--out) OUT=${2:?}; shift 2 ;;
    --console) CONSOLE=1; shift ;;
    --no-build) NOBUILD=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; HOSTARGV=("$@"); break ;;
    -*) say "unknown option $1 (see --help)"; exit 2 ;;
    *) [ -z "$SCEN" ] || die 2 "more than one scenario ('$SCEN', '$1'); a host command goes after --"
       SCEN=$1; shift ;;
  esac
done

# ------------------------------------------------------------- arguments
[ -n "$SCEN" ] || { usage >&2; exit 2; }
[ -x "$TOOL/run-guest.sh" ] || die 3 "siwvm tool not found at $TOOL (expected ../shared/tools/siwvm beside the repo; set SIWVM_TOOL)"
TOOL=$(cd "$TOOL" && pwd)
[ -f "$TOOL/scenarios/$SCEN.sh" ] || die 2 "no scenario '$SCEN'; have: $(for f in "$TOOL"/scenarios/*.sh; do f=${f##*/}; [ "$f" = lib.sh ] || printf '%s ' "${f%.sh}"; done)"
for n in TIMEOUT HTIMEOUT BTIMEOUT; do
  [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die 2 "$n must be a positive number of seconds (got '${!n}')"
done
case $VARIANT in pristine|knobs) ;; *) die 2 "variant must be pristine or knobs" ;; esac
[ -z "$SIWOPTS" ] || [ "$VARIANT" = knobs ] || die 2 "-o/--siwopts needs -v knobs (the pristine siw has no module parameters)"
[[ $SIWOPTS =~ ^[a-z_]+=[0-9A-Za-z]+(,[a-z_]+=[0-9A-Za-z]+)*$ || -z $SIWOPTS ]] \
  || die 2 "siwopts must look like name=value[,name=value...] (got '$SIWOPTS')"
case $ACCEL in tcg|kvm) ;; *) die 2 "accel must be tcg or kvm" ;; esac

npeers=$(( ${#HOSTARGV[@]} > 0 ? 1 : 0 )); npeers=$((npeers + (${#HOSTSHELL} > 0 ? 1 : 0) + STANDIN))
HOSTSCEN=0
grep -q '^# SIWVM-HOST-CMD:' "$TOOL/scenarios/$SCEN.sh" && HOSTSCEN=1
if [ "$HOSTSCEN" = 1 ]; then
  [ "$npeers" = 1 ] || die 2 "scenario '$SCEN' needs exactly one host peer: '-- CMD [ARGS]', -H 'SHELL CMD' or --standin"
else
  [ "$npeers" = 0 ] || die 2 "scenario '$SCEN' runs in the guest only; it takes no host command"
fi

ROLE="" CONNECT="" LISTEN="" LISTEN_PORT=""
case $SCEN in
  host-to-guest) ROLE=client; CONNECT=127.0.0.1:7174; [ "$FWD_SET" = 1 ] || FWD=7174 ;;
  guest-to-host) ROLE=server; LISTEN=127.0.0.1:27174; LISTEN_PORT=27174 ;;
esac
if [ "$HOSTSCEN" = 1 ] && [ -z "$ROLE" ]; then
  die 2 "scenario '$SCEN' wants a host peer, but this wrapper knows only host-to-guest and guest-to-host"
fi

# ------------------------------------------------ one run at a time per machine
mkdir -p "$SIWVM_HOME" || die 3 "cannot create SIWVM_HOME=$SIWVM_HOME"
SIWVM_HOME=$(cd "$SIWVM_HOME" && pwd)
exec 9>"$SIWVM_HOME/interop.lock" || die 3 "cannot write $SIWVM_HOME/interop.lock"
if ! flock -n 9; then
  say "waiting (at most ${LOCK_TIMEOUT}s) for another siwvm run on this machine ($SIWVM_HOME/interop.lock)"
  flock -w "$LOCK_TIMEOUT" 9 || die 3 "lock not obtained within ${LOCK_TIMEOUT}s"
fi

# ------------------------------------------------------------- image
T_BUILD0=$(now)
BUILDLOG=$SIWVM_HOME/logs/interop-build.log
if [ "$(id -u)" = 0 ] && [ "$NOBUILD" = 0 ]; then
  # idempotent: < 0.1 s when the image is up to date (and repacks after a guest/init change)
  mkdir -p "$SIWVM_HOME/logs"
  [ -f "$SIWVM_HOME/images/initramfs.cpio" ] || say "building the siwvm image in $SIWVM_HOME (about 2-3 min; log $BUILDLOG)"
  if ! timeout -k 10 "$BUILD_TIMEOUT" "$TOOL/build-image.sh" < /dev/null > "$BUILDLOG" 2>&1; then
    tail -n 25 "$BUILDLOG" >&2
    die 3 "image build failed or exceeded ${BUILD_TIMEOUT}s (log: $BUILDLOG)"
  fi
elif [ ! -f "$SIWVM_HOME/images/initramfs.cpio" ]; then
  if [ "$NOBUILD" = 1 ]; then die 3 "no image in $SIWVM_HOME/images and --no-build given"; fi
  die 3 "no image in $SIWVM_HOME/images, and building one needs root (debootstrap/chroot): run $TOOL/build-image.sh as root with SIWVM_HOME=$SIWVM_HOME"
fi
T_BUILD=$(secs "$T_BUILD0" "$(now)")

# ------------------------------------------------------------- qemu / accelerator
if ! command -v qemu-system-x86_64 >/dev/null; then
  # build-image.sh installs it, but only on the first build (its step is stamped)
  if [ "$(id -u)" = 0 ] && [ "$NOBUILD" = 0 ] && command -v apt-get >/dev/null; then
    say "qemu-system-x86_64 missing; installing qemu-system-x86"
    timeout 600 apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends qemu-system-x86 \
      < /dev/null >> "$BUILDLOG" 2>&1
  fi
  command -v qemu-system-x86_64 >/dev/null || die 3 "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"
fi
for t in python3 bc; do command -v $t >/dev/null || die 3 "$t not found (run-guest.sh needs it)"; done
accels=$(qemu-system-x86_64 -accel help 2>/dev/null)
grep -qx "$ACCEL" <<<"$accels" || die 3 "qemu-system-x86_64 offers no '$ACCEL' accelerator (has: $(tr '\n' ' ' <<<"$accels"))"
if [ "$ACCEL" = kvm ]; then
  { [ -r /dev/kvm ] && [ -w /dev/kvm ]; } || die 3 "-a kvm: /dev/kvm missing or not accessible; use the default -a tcg"
fi

# ------------------------------------------------------------- ports
port_busy() {  # PORT -> 0 if a socket listens on it (any address)
  local hex; hex=$(printf '%04X' "$1")
  grep -qE ":$hex 0+:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
for p in $FWD $LISTEN_PORT; do
  port_busy "$p" && die 3 "TCP port $p is already in use on this host (fixed siwvm ports; is another guest or peer running?)"
done

# ------------------------------------------------------------- run directory
if [ -z "$OUT" ]; then OUT=$SIWVM_HOME/runs/$(date +%Y%m%d-%H%M%S)-$$-$SCEN; fi
mkdir -p "$OUT" || die 3 "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)

# ------------------------------------------------------------- host peer script
# Written to RUN/host-peer.sh (kept, so a run can be reproduced); run-guest.sh
# starts it once the guest is ready, under `timeout` (own process group, which
# is killed below if anything of it outlives the guest).
q() { printf '%q ' "$@"; }
HOSTCMD=""
if [ "$HOSTSCEN" = 1 ]; then
  HP=$OUT/host-peer.sh
  {
    echo "#!/bin/bash"
    echo "# host peer for siwvm scenario $SCEN, generated by scripts/siw/interop.sh"
    echo "export SIWVM_SCENARIO=$SCEN SIWVM_ROLE=$ROLE SIWVM_VARIANT=$VARIANT SIWVM_SIWOPTS=$(q "$SIWOPTS")"
    [ -n "$CONNECT" ] && echo "export SIWVM_CONNECT=$CONNECT"
    [ -n "$LISTEN" ] && echo "export SIWVM_LISTEN=$LISTEN SIWVM_READY_FILE=\"\$SIWVM_OUT/host-listening\""
    echo "cd $(q "$PWD")|| exit 125"
    if [ "$STANDIN" = 1 ]; then
      # a second guest (same image, private copy of the tool with two extra
      # scenarios) runs the kernel's rping; it reaches / is reached from the
      # scenario guest through the host's 127.0.0.1, exactly like our peer would
      ST=$SIWVM_HOME/standin-tool
      SG="$(q "$ST/run-guest.sh")-q -a $ACCEL -v $VARIANT -t $((HTIMEOUT - 5)) -b $BTIMEOUT -O \"\$SIWVM_OUT/standin\""
      [ -n "$SIWOPTS" ] && SG+=" -o $SIWOPTS"
      if [ "$ROLE" = client ]; then
        echo "exec $SG -f '' standin-rping-client 2>&1"
      else
        echo "$SG -f $LISTEN_PORT standin-rping-server 2>&1 & pid=\$!"
        echo "while kill -0 \$pid 2>/dev/null; do"
        echo "  [ -e \"\$SIWVM_OUT/standin/listening\" ] && { touch \"\$SIWVM_READY_FILE\"; break; }; sleep 0.1"
        echo "done"
        echo "wait \$pid"
      fi
    else
      if [ -n "$HOSTSHELL" ]; then cmd="bash -c $(q "$HOSTSHELL")"; else cmd=$(q "${HOSTARGV[@]}"); fi
      if [ "$ROLE" = client ]; then
        echo "exec $cmd"
      else
        hex=$(printf '%04X' "$LISTEN_PORT")
        echo "$cmd &"
        echo "pid=\$!"
        echo "# readiness: the command's own ready file, or a socket listening on $LISTEN_PORT"
        echo "while kill -0 \$pid 2>/dev/null; do"
        echo "  [ -e \"\$SIWVM_READY_FILE\" ] && break"
        echo "  if grep -qE ':$hex 0+:0000 0A' /proc/net/tcp /proc/net/tcp6 2>/dev/null; then"
        echo "    echo \"[host-peer] port $LISTEN_PORT listening: creating \$SIWVM_READY_FILE\"; touch \"\$SIWVM_READY_FILE\"; break"
        echo "  fi"
        echo "  sleep 0.05"
        echo "done"
        echo "wait \$pid"
      fi
    fi
  } > "$HP"
  chmod +x "$HP"
  if [ "$STANDIN" = 1 ]; then
    rm -rf "$ST"; mkdir -p "$ST"
    { cp -r "$TOOL/run-guest.sh" "$TOOL/host" "$TOOL/scenarios" "$ST/" && chmod -R u+w "$ST"; } \
      || die 3 "cannot copy the siwvm tool to $ST"
    cat > "$ST/scenarios/standin-rping-client.sh" <<'EOF'
# interop.sh --standin: kernel siw rping CLIENT playing the host peer of host-to-guest
# (10.0.2.2:7174 here = host 127.0.0.1:7174 = the scenario guest's rping server)
. /scenarios/lib.sh
step "stand-in host peer: rping -c -a $HOST_IP -p 7174 -v -V -C 1"
timeout 60 rping -c -a $HOST_IP -p 7174 -v -V -C 1; rc=$?
echo "RESULT standin-rping-client rc=$rc"
exit $rc
EOF
    cat > "$ST/scenarios/standin-rping-server.sh" <<'EOF'
# interop.sh --standin: kernel siw rping SERVER playing the host peer of guest-to-host
# (host 127.0.0.1:27174 is forwarded to this guest's 10.0.2.15:27174)
. /scenarios/lib.sh
step "stand-in host peer: rping -s -a $GUEST_IP -p 27174 -v -C 1"
rping -s -a $GUEST_IP -p 27174 -v -C 1 > /tmp/srv.log 2>&1 &
spid=$!
wait_listen 27174 $spid || exit 1
touch /out/listening
for i in $(seq 900); do kill -0 $spid 2>/dev/null || break; sleep 0.1; done
kill $spid 2>/dev/null; wait $spid; src=$?
cat /tmp/srv.log; echo "rping server rc=$src"
grep -q "server ping data: rdma-ping-0" /tmp/srv.log && { echo "RESULT standin-rping-server PASS"; exit 0; }
echo "RESULT standin-rping-server FAIL"; exit 1
EOF
  fi
  HOSTCMD="echo \$\$ > \"\$SIWVM_OUT/host-peer.pid\"; exec timeout -k 5 $HTIMEOUT bash $(q "$HP")"
fi

# ------------------------------------------------------------- run
RG=("$TOOL/run-guest.sh" -a "$ACCEL" -t "$TIMEOUT" -b "$BTIMEOUT" -v "$VARIANT" -f "$FWD" -O "$OUT")
[ -n "$SIWOPTS" ] && RG+=(-o "$SIWOPTS")
[ "$CONSOLE" = 1 ] || RG+=(-q)
[ -n "$HOSTCMD" ] && RG+=(-H "$HOSTCMD")
RG+=("$SCEN")
printf '%q ' "${RG[@]}" > "$OUT/interop-cmdline.txt"; echo >> "$OUT/interop-cmdline.txt"

kill_peer() {  # whatever is left of the host peer (its own process group, see HOSTCMD)
  local pg
  pg=$(cat "$OUT/host-peer.pid" 2>/dev/null) || return 0
  [[ $pg =~ ^[0-9]+$ ]] || return 0
  if kill -0 -- "-$pg" 2>/dev/null; then
    say "host peer still running after the guest stopped: killing its process group $pg"
    kill -TERM -- "-$pg" 2>/dev/null; sleep 2; kill -KILL -- "-$pg" 2>/dev/null
  fi
}
trap 'kill_peer; exit 130' INT TERM

say "scenario $SCEN, siw $VARIANT${SIWOPTS:+ ($SIWOPTS)}, accel $ACCEL, timeout ${TIMEOUT}s$( [ -n "$HOSTCMD" ] && echo ", host peer timeout ${HTIMEOUT}s"); run dir $OUT"
T_RUN0=$(now)
# A guest that never reached 'siw ready' and whose kernel oopsed or panicked,
# or which the boot watchdog killed, failed before any scenario step and before
# the host peer started (run-guest.sh starts it only once the scenario signals
# readiness), so nothing of ours was involved. The stock kernel under
# multi-threaded TCG does this now and then (about 1 boot in 100 here: an
# `Oops: int3` in sched_clock code while a static key is patched at boot).
# Such a boot is retried, at most BOOT_ATTEMPTS times in all; its console is
# kept as boot-failure-N.console.log. Anything after 'siw ready' is never retried.
BOOT_ATTEMPTS=${SIWVM_BOOT_ATTEMPTS:-3}
[[ $BOOT_ATTEMPTS =~ ^[1-9][0-9]*$ ]] || die 2 "SIWVM_BOOT_ATTEMPTS must be a positive number (got '$BOOT_ATTEMPTS')"
boot_failed() {  # -> 0 if the last run died in the guest's boot, before 'siw ready'
  [ -s "$OUT/console.log" ] || return 1
  grep -q 'siw ready' "$OUT/console.log" && return 1
  [ -e "$OUT/host-peer.pid" ] && return 1
  grep -qE 'Kernel panic|Oops: ' "$OUT/console.log" || [ -e "$OUT/boot-timeout" ]
}
attempt=1
while :; do
  # safety net on top of run-guest.sh's own qemu timeout
  if [ "$CONSOLE" = 1 ]; then
    timeout -k 10 $((TIMEOUT + 60)) "${RG[@]}" < /dev/null 2> >(tee "$OUT/run-guest.log" >&2); rc=$?
  else
    timeout -k 10 $((TIMEOUT + 60)) "${RG[@]}" < /dev/null > "$OUT/run-guest.log" 2>&1; rc=$?
  fi
  [ "$rc" != 0 ] && [ "$attempt" -lt "$BOOT_ATTEMPTS" ] && boot_failed || break
  why=$(grep -m1 -oE '(Kernel panic|Oops: )[^[:cntrl:]]*' "$OUT/console.log" | cut -c1-100)
  mv "$OUT/console.log" "$OUT/boot-failure-$attempt.console.log"
  say "guest boot $attempt of $BOOT_ATTEMPTS failed before 'siw ready' (${why:-boot watchdog}; console kept as $OUT/boot-failure-$attempt.console.log); booting again"
  attempt=$((attempt + 1))
done
T_RUN=$(secs "$T_RUN0" "$(now)")
kill_peer
trap - INT TERM

# ------------------------------------------------------------- summary
boot=$(sed -n 's/^guest_siw_ready_uptime_s=//p' "$OUT/result.txt" 2>/dev/null)
result=$(grep -h '^RESULT ' "$OUT/scenario.log" 2>/dev/null | tr '\n' ';' | sed 's/;$//; s/;/; /g')
hstatus=$(cat "$OUT/host-status" 2>/dev/null)
if [ "$rc" = 0 ]; then verdict=PASS
elif grep -qE 'kvm_buf_set_msrs|KVM internal error|failed to set MSR' "$OUT/console.log" 2>/dev/null; then
  verdict="ENV-ERROR (KVM cannot run this guest here; use the default -a tcg)"; rc=3
elif grep -q 'Could not set up host forwarding' "$OUT/console.log" 2>/dev/null; then
  verdict="ENV-ERROR (qemu could not forward a host port)"; rc=3
elif [ "$rc" = 124 ]; then
  if [ -e "$OUT/boot-timeout" ]; then verdict="TIMEOUT (guest not 'siw ready' within ${BTIMEOUT}s)"
  else verdict="TIMEOUT (${TIMEOUT}s)"; fi
elif boot_failed; then verdict="FAIL (the guest kernel crashed before 'siw ready', $attempt boot(s))"
else verdict=FAIL
fi
total=$(secs "$T_START" "$(now)")
say "$verdict $SCEN (siw $VARIANT${SIWOPTS:+ $SIWOPTS}, $ACCEL): rc=$rc, run ${T_RUN}s$( [ "$attempt" -gt 1 ] && echo " in $attempt boots") (guest 'siw ready' at ${boot:-?}s uptime), image check/build ${T_BUILD}s, total ${total}s"
[ -n "$result" ] && say "  guest:     $result"
[ -n "$hstatus" ] && say "  host peer: exit $hstatus (timeout ${HTIMEOUT}s => 124), log $OUT/host-cmd.log"
say "  run dir:   $OUT  (scenario.log, console.log, dmesg.txt, env.txt, result.txt)"
for p in "$OUT"/*.pcap; do
  [ -s "$p" ] && say "  capture:   $p  (decoded: ${p%.pcap}.mpa.txt)"
done
[ -d "$OUT/standin" ] && say "  stand-in:  $OUT/standin  (the second guest's run dir)"
if [ "$rc" != 0 ]; then
  logs="run-guest.log scenario.log host-cmd.log"
  [ -s "$OUT/scenario.log" ] || logs="run-guest.log console.log host-cmd.log"
  for f in $logs; do
    [ -s "$OUT/$f" ] || continue
    echo "----- last lines of $OUT/$f" >&2; tail -n 25 "$OUT/$f" >&2
  done
fi
exit "$rc"
