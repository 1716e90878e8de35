#!/usr/bin/env bash
# Run the interop checks of docs/interop.md against fresh slicex deployments and print a table of the results.
#
# Usage: scripts/interop-check.sh GENI_TOOLS_TREE [--redis redis://HOST:PORT/N] [--deployments embedded,distributed]
#          [--checks accept,loop,stitch,federation,vm] [--port-base P] [--cycles N] [--out DIR] [--sequential]
#
# GENI_TOOLS_TREE: a work tree of GENI-NSF/geni-tools (outside this checkout). Its Python 2 environment is
# PY2 (environment; default <parent of the tree>/py2/bin/python, which scripts/setup-interop.sh makes: it is
# run first when PY2 is missing). Every check starts what it needs in fresh homes under --out and stops it:
#
#   accept      geni-tools' AM API acceptance suite, am_api_accept.py -V3 (13 tests; ~15 minutes: its pauses)
#   loop        scripts/omni_loop.py, --cycles create-to-delete cycles of stock omni, inventory intact after
#   stitch      omni's stitcher over three aggregates (scripts/stitch-demo.sh, docs/stitching.md): -V3 allocate
#               sx1-sx3 across sx2, provision, start and status at each, delete; AM API v2 allocate sx1-sx2, delete
#   federation  two testbeds a.test and b.test joined by a cable, and the Slice Exchange Point
#               (docs/federation.md): omni through the SEP with a speaks-for credential, allocate to delete
#   vm          (only when asked: root, QEMU and the VM image) `slicex up --substrate netns`, a qemu-vm node and a
#               container on one link (docs/interop/request-vm.xml): allocate, provision, start, ssh into the VM
#               (its kernel is not the host's, `modprobe dummy`, ping the container), delete, nothing left
#
# on each deployment: embedded (`slicex up`, SQLite) and distributed (`slicex up --distributed`, Redis).
#   --redis URL        the distributed deployment's Redis (default $SLICEX_REDIS_URL); databases N..N+6 of it
#                      are EMPTIED (FLUSHDB) and used: the checks' aggregates (1 + 3 + 2) and the SEP's record
#   --port-base P      embedded uses ports P..P+79, distributed P+100..P+179 (default 27000)
#   --cycles N         omni loop cycles (default 10)
#   --out DIR          logs, homes and omni's files (default a new temporary directory); outside this checkout
#   --sequential       one deployment after the other (by default both run at once: their ports, homes and
#                      Redis databases are apart, and the wall time is about that of one, ~25 minutes)
# Prints a table (check x deployment: passed/failed, seconds); exits 1 when any check failed, 2 on bad usage.
set -uo pipefail

die() { echo "interop-check: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit "${1:-2}"; }

[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage 0 ;; esac
GT=$(cd "$1" 2>/dev/null && pwd) || die "no directory $1"
shift
[ -f "$GT/src/omni.py" ] || die "$GT is not a geni-tools work tree (no src/omni.py)"
REDIS=${SLICEX_REDIS_URL:-}
DEPLOYMENTS=embedded,distributed
CHECKS=accept,loop,stitch,federation
PORT_BASE=27000
CYCLES=10
OUT=
PARALLEL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --redis) REDIS=${2:?}; shift 2 ;;
    --deployments) DEPLOYMENTS=${2:?}; shift 2 ;;
    --checks) CHECKS=${2:?}; shift 2 ;;
    --port-base) PORT_BASE=${2:?}; shift 2 ;;
    --cycles) CYCLES=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --sequential) PARALLEL=; shift ;;
    -h|--help) usage 0 ;;
    *) die "unknown argument $1 (--help)" ;;
  esac
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
SLICEX=$REPO/.venv/bin/slicex
PY3=$REPO/.venv/bin/python
PY2=${PY2:-$(dirname "$GT")/py2/bin/python}
[ -x "$SLICEX" ] || die "no $SLICEX: run 'make venv' first"
if [ ! -x "$PY2" ]; then
  PY2_VENV=$(dirname "$(dirname "$PY2")") "$REPO/scripts/setup-interop.sh" "$GT" || die "setup-interop.sh failed"
fi
for d in ${DEPLOYMENTS//,/ }; do
  case "$d" in embedded|distributed) ;; *) die "--deployments: embedded or distributed, not $d" ;; esac
done
for c in ${CHECKS//,/ }; do
  case "$c" in accept|loop|stitch|federation|vm) ;; *) die "--checks: accept, loop, stitch, federation, vm, not $c" ;; esac
done
if [[ ",$DEPLOYMENTS," == *,distributed,* ]]; then
  [[ "$REDIS" =~ ^redis://[^/]+/([0-9]+)$ ]] || die "distributed needs --redis redis://HOST:PORT/N (or SLICEX_REDIS_URL)"
  [ $((BASH_REMATCH[1] + 6)) -le 15 ] || die "--redis: databases N..N+6 must exist (N <= 9)"
  "$PY3" -c "import redis, sys; redis.Redis.from_url(sys.argv[1]).ping()" "$REDIS" 2>/dev/null ||
    die "no Redis answers at $REDIS"
fi
OUT=${OUT:-$(mktemp -d -t slicex-interop.XXXXXX)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
case "$OUT/" in "$REPO"/*) die "--out must be outside the repository" ;; esac
: > "$OUT/started"
: > "$OUT/results"

# What was started, one line each ("home DIR", "stitch DIR", "pid PID"), is stopped at exit in reverse order.
cleanup() {
  trap - EXIT INT TERM
  for p in ${WORKERS:-}; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  tac "$OUT/started" | while read -r kind arg; do
    case "$kind" in
      pid) kill "$arg" 2>/dev/null ;;
      home) SLICEX_HOME=$arg timeout 120 "$SLICEX" down >/dev/null 2>&1 ;;
      stitch) timeout 300 "$REPO/scripts/stitch-demo.sh" down "$arg" >/dev/null 2>&1 ;;
    esac
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "+ $*"; }
now() { date +%s.%N; }

# redis_db I: database N+I of --redis
redis_db() { echo "${REDIS%/*}/$(( ${REDIS##*/} + $1 ))"; }
flushdb() { "$PY3" -c "import redis, sys; redis.Redis.from_url(sys.argv[1]).flushdb()" "$1"; }

# omni CONFIG ARGS...: stock omni; fails on a non-zero exit or a failure in its result summary
# (the rule of scripts/omni_loop.py). HOME is the deployment's own, for omni's ~/.gcf files.
omni() {
  local cfg=$1 out rc; shift
  log omni "$@"
  out=$(HOME=$OMNI_HOME TMPDIR=$OMNI_HOME "$PY2" "$GT/src/omni.py" -c "$cfg" "$@" 2>&1); rc=$?
  printf '%s\n' "$out"
  [ $rc -eq 0 ] || { echo "FAILED: omni exited $rc"; return 1; }
  if grep -Eq 'Failed|ERROR|error code|geni_code\W+[1-9]' <<<"${out##*Result Summary}"; then
    echo "FAILED: omni reported a failure"; return 1
  fi
  LAST=$out
}
expect() { grep -q -- "$1" <<<"$LAST" || { echo "FAILED: expected '$1' in omni's output"; return 1; }; }

# up HOME [--distributed]: start a deployment in the background (stopped at exit)
up() {
  local home=$1; shift
  echo "home $home" >> "$OUT/started"
  log slicex up --detach "$@" "($home)"
  SLICEX_HOME=$home timeout 300 "$SLICEX" up --detach "$@"
}

# set_yaml HOME KEY VALUE: one top-level key of slicex.yaml
set_yaml() { sed -i "s|^$2:.*|$2: $3|" "$1/slicex.yaml"; }

# the deployment of the accept and loop checks: alice's home, started once
ensure_home() {
  HOME_DIR=$DIR/home
  [ -f "$HOME_DIR/.interop-up" ] && return 0
  SLICEX_HOME=$HOME_DIR "$SLICEX" ca init --port-base "$BASE" >/dev/null || return 1
  SLICEX_HOME=$HOME_DIR "$SLICEX" user add alice >/dev/null || return 1
  set_yaml "$HOME_DIR" dashboard_port null
  if [ "$DEP" = distributed ]; then set_yaml "$HOME_DIR" store "$(redis_db 0)"; flushdb "$(redis_db 0)"; fi
  up "$HOME_DIR" "${UP_ARGS[@]}" && touch "$HOME_DIR/.interop-up"
}

check_accept() {
  ensure_home || return 1
  local run=$DIR/accept
  mkdir -p "$run" && cp "$REPO"/docs/interop/request*.xml "$run/" &&
    cp "$GT"/acceptance_tests/AM_API/{untrusted-usercred.xml,logging.conf} "$run/" || return 1
  log am_api_accept.py -V3 -a slicex
  (cd "$run" && HOME=$OMNI_HOME PYTHONPATH=$GT/src:$GT/acceptance_tests/AM_API timeout 2700 \
     "$PY2" "$GT/acceptance_tests/AM_API/am_api_accept.py" -V3 -a slicex -c "$HOME_DIR/omni_config")
}

check_loop() {
  ensure_home || return 1
  log omni_loop.py --cycles "$CYCLES"
  HOME=$OMNI_HOME timeout 1800 "$PY3" "$REPO/scripts/omni_loop.py" --omni "$PY2 $GT/src/omni.py" \
    --config "$HOME_DIR/omni_config" --cycles "$CYCLES" --out "$DIR/omni-loop.json" --plot "$DIR/omni-loop.png"
}

check_stitch() {
  local sd=$DIR/stitch scs cfg
  echo "stitch $sd" >> "$OUT/started"
  if [ "$DEP" = distributed ]; then
    for i in 1 2 3; do flushdb "$(redis_db "$i")"; done
    export STITCH_REDIS; STITCH_REDIS=$(redis_db 1)
  fi
  log stitch-demo.sh up "$sd" $((BASE + 10))
  timeout 600 "$REPO/scripts/stitch-demo.sh" up "$sd" $((BASE + 10)) || return 1
  unset STITCH_REDIS
  scs=http://127.0.0.1:$(cat "$sd/scs.port")/geni/xmlrpc cfg=$sd/omni_config
  stitcher() {  # stitcher DIR ARGS...: omni's stitcher, its files in DIR; the last line must say Success
    local d=$sd/$1 out rc; shift; mkdir -p "$d"
    log stitcher.py "$@"
    out=$(HOME=$OMNI_HOME TMPDIR=$OMNI_HOME timeout 600 "$PY2" "$GT/src/stitcher.py" -c "$cfg" --noCacheFiles \
            --fileDir "$d" --scsURL "$scs" "$@" 2>&1); rc=$?
    printf '%s\n' "$out"
    [ $rc -eq 0 ] || { echo "FAILED: stitcher exited $rc"; return 1; }
    LAST=$out
  }
  omni "$cfg" createslice st3v3 &&
    stitcher v3 -V3 allocate st3v3 "$sd/request-3am.xml" &&
    expect "Success: Reserved resources in slice st3v3 at 3 Aggregates" || return 1
  for a in sx1 sx2 sx3; do
    omni "$cfg" -a $a -V3 provision st3v3 && omni "$cfg" -a $a -V3 poa st3v3 geni_start &&
      omni "$cfg" -a $a -V3 status st3v3 && expect "geni_ready" || return 1
  done
  stitcher v3 -V3 delete st3v3 && expect "Deleted" &&
    omni "$cfg" createslice st2v2 &&
    stitcher v2 allocate st2v2 "$sd/request-2am.xml" &&
    expect "Success: Reserved resources in slice st2v2 at 2 Aggregates" &&
    stitcher v2 delete st2v2 && expect "Deleted" &&
    timeout 300 "$REPO/scripts/stitch-demo.sh" down "$sd"
}

check_federation() {
  local fd=$DIR/federation n peer i=0 sep_url sep_port=$((BASE + 70)) out
  declare -A am=([a]=https://127.0.0.1:$((BASE + 51))/ [b]=https://127.0.0.1:$((BASE + 61))/)
  mkdir -p "$fd"
  for n in a b; do
    peer=$([ $n = a ] && echo b || echo a)
    cat > "$fd/$n-substrate.yaml" <<EOF
authority: $n.test
switches:
  - {name: sw1, vlan_range: ["100-199"], ports: [{name: h1}, {name: h2}, {name: to-$peer}]}
hosts:
  - {name: pc, count: 2, cores: 8, memory_mb: 16384, interfaces: [{name: eth0, switch_port: "sw1:h{n}"}]}
external_links:
  - {name: to-$peer, switch: sw1, port: to-$peer, remote_aggregate: "urn:publicid:IDN+$peer.test+authority+am",
     remote_port: "urn:publicid:IDN+$peer.test+interface+sw1:to-$n", vlan_range: "100-103"}
EOF
    SLICEX_HOME=$fd/$n "$SLICEX" ca init --authority $n.test \
      --port-base $((BASE + $([ $n = a ] && echo 50 || echo 60))) >/dev/null || return 1
    set_yaml "$fd/$n" substrate "$fd/$n-substrate.yaml"
    set_yaml "$fd/$n" dashboard_port null
    if [ "$DEP" = distributed ]; then
      i=$((i + 1)); set_yaml "$fd/$n" store "$(redis_db $((3 + i)))"; flushdb "$(redis_db $((3 + i)))"
    fi
  done
  SLICEX_HOME=$fd/a "$SLICEX" user add alice >/dev/null &&
    SLICEX_HOME=$fd/b "$SLICEX" user add bob >/dev/null || return 1   # `up --detach` asks as a user of its own
  cp "$fd/a/ca/ca.pem" "$fd/b/trusted_roots/a.test-ca.pem"   # B accepts A's users (namespace a.test only)
  up "$fd/a" "${UP_ARGS[@]}" && up "$fd/b" "${UP_ARGS[@]}" || return 1
  local store=()
  if [ "$DEP" = distributed ]; then store=(--store "$(redis_db 6)"); flushdb "$(redis_db 6)"; fi
  log slicex sep init
  SLICEX_HOME=$fd/a "$SLICEX" sep init --config "$fd/sep/sep.yaml" --port "$sep_port" "${store[@]}" \
    --aggregate "urn:publicid:IDN+a.test+authority+am=${am[a]}" \
    --aggregate "urn:publicid:IDN+b.test+authority+am=${am[b]}" --trust "$fd/b/ca/ca.pem" || return 1
  SLICEX_HOME=$fd/a "$SLICEX" sep serve --config "$fd/sep/sep.yaml" > "$fd/sep.log" 2>&1 &
  echo "pid $!" >> "$OUT/started"
  "$PY3" - "$sep_port" <<'EOF' || { cat "$fd/sep.log"; return 1; }
import socket, sys, time
for _ in range(150):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit("the SEP did not answer")
EOF
  sep_url=https://127.0.0.1:$sep_port/
  SLICEX_HOME=$fd/a "$SLICEX" sep speaksfor --url "$sep_url" --user alice --out "$fd/alice-speaksfor-sep.xml" || return 1
  cat > "$fd/request.xml" <<EOF
<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="na" component_manager_id="urn:publicid:IDN+a.test+authority+cm" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="na:if0"/></node>
  <node client_id="nb" component_manager_id="urn:publicid:IDN+b.test+authority+am" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="nb:if0"/></node>
  <link client_id="xlink"><interface_ref client_id="na:if0"/><interface_ref client_id="nb:if0"/></link>
</rspec>
EOF
  local cfg=$fd/a/omni_config c=(-a "$sep_url" -V3 --cred "$fd/alice-speaksfor-sep.xml")
  omni "$cfg" createslice sep1 &&
    omni "$cfg" -a "$sep_url" -V3 getversion && expect "slicex-sep" &&
    omni "$cfg" "${c[@]}" allocate sep1 "$fd/request.xml" && expect "Allocated slivers" &&
    omni "$cfg" "${c[@]}" provision sep1 && expect "Provisioned slivers" &&
    omni "$cfg" "${c[@]}" poa sep1 geni_start &&
    omni "$cfg" "${c[@]}" status sep1 && expect "Retrieved Status on 4 slivers" &&
    omni "$cfg" "${c[@]}" describe sep1 && expect 'b.test+authority' &&
    omni "$cfg" "${c[@]}" renew sep1 "$(date -u -d '+2 days' +%Y-%m-%dT%H:%M:%SZ)" &&
    omni "$cfg" "${c[@]}" delete sep1 && expect "Deleted slivers" || return 1
  # afterwards neither testbed holds a sliver of the slice: Status asked of each AM directly is 12
  local slice=urn:publicid:IDN+a.test+slice+sep1
  for n in a b; do
    log omni -a "${am[$n]}" -V3 status sep1 "(expecting code 12)"
    out=$(HOME=$OMNI_HOME "$PY2" "$GT/src/omni.py" -c "$cfg" -a "${am[$n]}" -V3 status "$slice" 2>&1)
    printf '%s\n' "$out"
    grep -q "code 12" <<<"$out" || { echo "FAILED: testbed $n still answers Status for $slice"; return 1; }
  done
}

check_vm() {
  local vh=$DIR/vm cfg port addr ssh_ prefix host_kernel
  SLICEX_HOME=$vh "$SLICEX" ca init --port-base $((BASE + 40)) >/dev/null &&
    SLICEX_HOME=$vh "$SLICEX" user add alice >/dev/null || return 1
  set_yaml "$vh" dashboard_port null
  if [ "$DEP" = distributed ]; then set_yaml "$vh" store "$(redis_db 6)"; flushdb "$(redis_db 6)"; fi
  up "$vh" "${UP_ARGS[@]}" --substrate netns || return 1
  cfg=$vh/omni_config
  cp "$REPO/docs/interop/request-vm.xml" "$DIR/" || return 1
  omni "$cfg" -a slicex -V3 createslice vmcheck &&
    omni "$cfg" -a slicex -V3 allocate vmcheck "$DIR/request-vm.xml" && expect "Allocated slivers" &&
    omni "$cfg" -a slicex -V3 provision vmcheck && expect "Provisioned slivers" &&
    omni "$cfg" -a slicex -V3 poa vmcheck geni_start && expect "was successful" || return 1
  for _ in $(seq 60); do  # the VM is geni_configuring until its sshd answers
    omni "$cfg" -a slicex -V3 status vmcheck || return 1
    grep -q geni_configuring <<<"$LAST" || break
    sleep 5
  done
  expect "geni_ready" && ! grep -q geni_configuring <<<"$LAST" || { echo "FAILED: vm1 not ready"; return 1; }
  omni "$cfg" -a slicex -V3 describe vmcheck && expect 'machine=\\"qemu\\"' || return 1
  # vm1's login port and c1's address, from the manifest in omni's output
  port=$(grep -o 'client_id=\\"vm1\\".*' <<<"$LAST" | grep -o 'port=\\"[0-9]*' | head -1 | grep -o '[0-9]*$')
  addr=$(grep -o 'client_id=\\"c1\\".*' <<<"$LAST" | grep -o 'ip address=\\"[0-9.]*' | head -1 | grep -o '[0-9.]*$')
  [ -n "$port" ] && [ -n "$addr" ] || { echo "FAILED: no login port of vm1 or address of c1 in the manifest"; return 1; }
  chmod 600 "$vh/alice-ssh"
  ssh_=(ssh -i "$vh/alice-ssh" -p "$port" -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
        -o LogLevel=ERROR alice@127.0.0.1)
  host_kernel=$(uname -r)
  log ssh vm1 "uname -r; sudo modprobe dummy; ping $addr"
  out=$("${ssh_[@]}" "uname -r; sudo -n modprobe dummy && grep -c '^dummy ' /proc/modules; ping -c 3 -W 2 -q $addr >/dev/null && echo reached") ||
    { echo "FAILED: ssh to vm1: $out"; return 1; }
  printf '%s\n' "$out"
  [ "$(sed -n 1p <<<"$out")" != "$host_kernel" ] || { echo "FAILED: vm1 runs the host's kernel"; return 1; }
  [ "$(sed -n 2,3p <<<"$out" | tr '\n' ' ')" = "1 reached " ] || { echo "FAILED: no module or no ping"; return 1; }
  omni "$cfg" -a slicex -V3 delete vmcheck && expect "Deleted slivers" || return 1
  prefix=$(cd "$REPO" && "$PY3" -c 'import sys; from pathlib import Path; from slicex.home import Home
from deployment.service import netns_prefix; h = Home(Path(sys.argv[1])); print(netns_prefix(h.config(), h))' "$vh")
  if ip netns list | grep -q "^$prefix-" || pgrep -f "qemu-system-x86_64 -name $prefix-" >/dev/null; then
    echo "FAILED: a namespace or QEMU of $prefix is left after delete"; return 1
  fi
}

# run_deployment DEP: every check on one deployment, each logged to DIR/CHECK.log, results appended
run_deployment() {
  DEP=$1 DIR=$OUT/$1
  mkdir -p "$DIR/omni-home"
  OMNI_HOME=$DIR/omni-home
  if [ "$DEP" = embedded ]; then BASE=$PORT_BASE UP_ARGS=(); else BASE=$((PORT_BASE + 100)) UP_ARGS=(--distributed); fi
  for check in ${CHECKS//,/ }; do
    local t0 t1 status
    t0=$(now)
    echo "[$(date -u +%H:%M:%S)] $DEP: $check ..."
    if ( "check_$check" ) > "$DIR/$check.log" 2>&1; then status=passed; else status=failed; fi
    t1=$(now)
    printf '%s %s %s %.0f\n' "$DEP" "$check" "$status" "$(echo "$t1 - $t0" | bc)" >> "$OUT/results"
    echo "[$(date -u +%H:%M:%S)] $DEP: $check $status ($DIR/$check.log)"
  done
}

T0=$(now)
echo "interop-check: geni-tools $GT, output in $OUT"
WORKERS=
for dep in ${DEPLOYMENTS//,/ }; do
  if [ -n "$PARALLEL" ]; then run_deployment "$dep" & WORKERS="$WORKERS $!"; else run_deployment "$dep"; fi
done
for p in $WORKERS; do wait "$p"; done
WORKERS=
TOTAL=$(echo "$(now) - $T0" | bc)

# the table: one row per check, one column per deployment
{
  printf '| check |'; for dep in ${DEPLOYMENTS//,/ }; do printf ' %s |' "$dep"; done; echo
  printf '|---|'; for _ in ${DEPLOYMENTS//,/ }; do printf -- '---|'; done; echo
  for check in ${CHECKS//,/ }; do
    printf '| %s |' "$check"
    for dep in ${DEPLOYMENTS//,/ }; do
      read -r status secs < <(awk -v d="$dep" -v c="$check" '$1 == d && $2 == c {print $3, $4}' "$OUT/results")
      printf ' %s, %s s |' "${status:-not run}" "${secs:--}"
    done
    echo
  done
} | tee "$OUT/summary.md"
printf 'total: %.0f s; logs in %s\n' "$TOTAL" "$OUT"
grep -q ' failed ' "$OUT/results" && exit 1
[ "$(wc -l < "$OUT/results")" -gt 0 ] || exit 1
exit 0
