#!/usr/bin/env bash
# Three slicex aggregates and the path service on 127.0.0.1, for omni's unmodified stitcher (docs/stitching.md).
#
#   scripts/stitch-demo.sh up OUT [PORT_BASE]   # homes, substrates, trust, omni_config, requests; start all
#   scripts/stitch-demo.sh down OUT             # stop what `up` started
#
# sx1.test (slice authority of user alice) -- sx2.test -- sx3.test: one cable sx1-sx2 and one sx2-sx3, each
# carrying VLANs 100-110, so a link sx1-sx3 crosses sx2 as a transit aggregate. Each aggregate trusts the
# others' CAs (each root vouches for its own authority only). Aggregate i listens on PORT_BASE+10*(i-1)+0..5
# (AM API v3 on +1, v2 on +5); the path service on PORT_BASE+30. OUT must be outside the repository.
#
# STITCH_MODE (environment) chooses the cables' tags, so that an sx1-sx3 link is one of the three kinds:
#   direct      (default) every cable 100-110: one tag end to end
#   translated  sx1-sx2 100-110, sx2-sx3 200-210 with sx2's port toward sx3 translating: no tag is common
#   qinq        the edges' ports carry 100-110 and push/pop an S-tag of 3000-3009; sx2 carries only 3000-3010
#
# STITCH_REDIS=redis://HOST:PORT/N (environment) runs each aggregate distributed (`slicex up --distributed`),
# sx1, sx2, sx3 on databases N, N+1, N+2 of that Redis; unset, each is embedded (SQLite in its home).
set -euo pipefail

cmd=${1:?usage: stitch-demo.sh up|down OUT [PORT_BASE]}
OUT=$(mkdir -p "${2:?usage: stitch-demo.sh up|down OUT [PORT_BASE]}" && cd "$2" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
SLICEX=${SLICEX:-$REPO/.venv/bin/slicex}
PYTHON=${PYTHON:-$REPO/.venv/bin/python}

if [ "$cmd" = down ]; then
  for i in 1 2 3; do [ -d "$OUT/sx$i" ] && SLICEX_HOME=$OUT/sx$i "$SLICEX" down || true; done
  if [ -f "$OUT/scs.pid" ]; then kill "$(cat "$OUT/scs.pid")" 2>/dev/null || true; rm -f "$OUT/scs.pid"; fi
  exit 0
fi
[ "$cmd" = up ] || { echo "usage: stitch-demo.sh up|down OUT [PORT_BASE]" >&2; exit 2; }
case "${STITCH_REDIS:-redis://h/0}" in redis://*/[0-9]|redis://*/[0-9][0-9]) ;;
  *) echo "STITCH_REDIS must be redis://HOST:PORT/N, not ${STITCH_REDIS}" >&2; exit 2 ;; esac
case "$OUT/" in "$REPO"/*) echo "OUT must be outside the repository" >&2; exit 2;; esac

# 31 consecutive free ports (tested by binding), from PORT_BASE or searched upward from 20000
BASE=$("$PYTHON" - "${3:-}" <<'EOF'
import socket, sys
def free(p):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            return False
    return True
start = int(sys.argv[1]) if sys.argv[1] else 20000
for base in range(start, 60000, 40):
    if all(free(base + i) for i in range(31)):
        print(base)
        break
    if sys.argv[1]:
        sys.exit(f"ports {base}..{base + 30} are not all free")
EOF
)
port() { echo $((BASE + 10 * ($1 - 1) + $2)); }
urn() { echo "urn:publicid:IDN+sx$1.test+$2"; }

tags() {  # tags I J: the tags (and what the port does with them) of aggregate I's cable toward J
  case "${STITCH_MODE:-direct}:$1$2" in
    direct:*|translated:12|translated:21) echo 'vlan_range: "100-110"' ;;
    translated:23) echo 'vlan_range: "200-210", vlan_translation: true' ;;
    translated:32) echo 'vlan_range: "200-210"' ;;
    qinq:12|qinq:32) echo 'vlan_range: "100-110", qinq: true, s_vlan_range: "3000-3009"' ;;
    qinq:21) echo 'vlan_range: "3005-3010"' ;;
    qinq:23) echo 'vlan_range: "3000-3010"' ;;
    *) echo "STITCH_MODE must be direct, translated or qinq, not ${STITCH_MODE}" >&2; exit 2 ;;
  esac
}

ext() {  # ext I J: the external link of aggregate I toward aggregate J
  cat <<EOF
  - {name: to-sx$2, switch: sw1, port: to-sx$2, remote_aggregate: "$(urn "$2" authority+am)",
     remote_port: "$(urn "$2" "interface+sw1:to-sx$1")", remote_aggregate_url: "https://127.0.0.1:$(port "$2" 1)/",
     $(tags "$1" "$2"), capacity_kbps: 1000000}
EOF
}

for i in 1 2 3; do
  home=$OUT/sx$i
  if [ ! -f "$home/slicex.yaml" ]; then
    SLICEX_HOME=$home "$SLICEX" ca init --authority "sx$i.test" --port-base "$(port "$i" 0)" >/dev/null
  fi
  peers=$([ "$i" = 2 ] && echo "1 3" || echo 2)
  {
    echo "authority: sx$i.test"
    echo "switches:"
    echo "  - {name: sw1, vlan_range: [$([ "${STITCH_MODE:-direct}" = direct ] && echo '"100-199"' || echo '"100-299", "3000-3010"')], ports: [{name: h1}, {name: h2}$(for j in $peers; do printf ', {name: to-sx%s}' "$j"; done)]}"
    echo "hosts:"
    echo "  - {name: pc, count: 2, cores: 8, memory_mb: 16384, interfaces: [{name: eth0, switch_port: \"sw1:h{n}\"}]}"
    echo "external_links:"
    for j in $peers; do ext "$i" "$j"; done
  } > "$OUT/sx$i-substrate.yaml"
  sed -i -e "s|^substrate:.*|substrate: $OUT/sx$i-substrate.yaml|" -e 's/^dashboard_port:.*/dashboard_port: null/' \
    "$home/slicex.yaml"
  if [ -n "${STITCH_REDIS:-}" ]; then
    sed -i "s|^store:.*|store: ${STITCH_REDIS%/*}/$(( ${STITCH_REDIS##*/} + i - 1 ))|" "$home/slicex.yaml"
  fi
  # alice at sx1 is the experimenter; `up --detach` checks that an aggregate answers with a user of its own
  user=$([ "$i" = 1 ] && echo alice || echo operator)
  [ -f "$home/$user-cert.pem" ] || SLICEX_HOME=$home "$SLICEX" user add "$user" >/dev/null
done
for i in 1 2 3; do for j in 1 2 3; do
  [ "$i" = "$j" ] || cp "$OUT/sx$j/ca/ca.pem" "$OUT/sx$i/trusted_roots/sx$j.pem"
done; done

{
  echo "aggregates:"
  for i in 1 2 3; do echo "  - {substrate: sx$i-substrate.yaml, url: \"https://127.0.0.1:$(port "$i" 1)/\"}"; done
} > "$OUT/topology.yaml"

UP_ARGS=(--detach); [ -z "${STITCH_REDIS:-}" ] || UP_ARGS+=(--distributed)
for i in 1 2 3; do SLICEX_HOME=$OUT/sx$i "$SLICEX" up "${UP_ARGS[@]}" >"$OUT/sx$i-up.log" 2>&1 || { cat "$OUT/sx$i-up.log"; exit 1; }; done
SCS_PORT=$(port 4 0)
nohup "$SLICEX" scs --topology "$OUT/topology.yaml" --port "$SCS_PORT" >"$OUT/scs.log" 2>&1 &
echo $! > "$OUT/scs.pid"

# omni: alice at sx1's slice authority (framework gcf), nicknames for the three aggregates
sed '/^\[aggregate_nicknames\]/q' "$OUT/sx1/omni_config" > "$OUT/omni_config"
for i in 1 2 3; do echo "sx$i = $(urn "$i" authority+am),https://127.0.0.1:$(port "$i" 1)/" >> "$OUT/omni_config"; done

request() {  # request NAME AM_A AM_B: two VMs, one at each aggregate, and a stitched link between them
  cat > "$OUT/$1" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<rspec xmlns="http://www.geni.net/resources/rspec/3" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
       xsi:schemaLocation="http://www.geni.net/resources/rspec/3 http://www.geni.net/resources/rspec/3/request.xsd"
       type="request">
  <node client_id="a" component_manager_id="$(urn "$2" authority+cm)" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="a:if0"/></node>
  <node client_id="b" component_manager_id="$(urn "$3" authority+am)" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="b:if0"/></node>
  <link client_id="stitched0"><interface_ref client_id="a:if0"/><interface_ref client_id="b:if0"/></link>
</rspec>
EOF
}
request request-2am.xml 1 2
request request-3am.xml 1 3
# for a forced tag conflict: another slice's LAN holding VLAN 100 on sx2's switch
cat > "$OUT/hold-100-at-sx2.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<rspec xmlns="http://www.geni.net/resources/rspec/3" type="request">
  <node client_id="h1" component_manager_id="$(urn 2 authority+am)" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="h1:if0"/></node>
  <node client_id="h2" component_manager_id="$(urn 2 authority+am)" exclusive="false">
    <sliver_type name="default-vm"/><interface client_id="h2:if0"/></node>
  <link client_id="lan100" vlantag="100"><interface_ref client_id="h1:if0"/><interface_ref client_id="h2:if0"/></link>
</rspec>
EOF

for _ in $(seq 50); do
  "$PYTHON" -c "import socket,sys; socket.create_connection(('127.0.0.1', $SCS_PORT), 0.2)" 2>/dev/null && break
  sleep 0.2
done
cat <<EOF
aggregates: sx1 https://127.0.0.1:$(port 1 1)/  sx2 https://127.0.0.1:$(port 2 1)/  sx3 https://127.0.0.1:$(port 3 1)/
path service: http://127.0.0.1:$SCS_PORT/geni/xmlrpc
omni config: $OUT/omni_config   requests: $OUT/request-2am.xml $OUT/request-3am.xml
EOF
echo "$SCS_PORT" > "$OUT/scs.port"
