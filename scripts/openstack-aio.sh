#!/usr/bin/env bash
# An all-in-one OpenStack Zed from Debian's packages, for trying and testing slicex's openstack substrate on one
# machine without a cloud: MariaDB, RabbitMQ, Keystone (uwsgi), Glance (file store), Placement (uwsgi), Nova with
# the libvirt driver (QEMU: KVM where a probe boot shows it works, else TCG; Glance holds the VM form of the host's
# slicex catalogue image, scripts/openstack-aio/guest_image.py), Neutron ML2 (flat + vlan, openvswitch mechanism
# driver, QoS) with a real neutron-openvswitch-agent on userspace (netdev) OVS bridges.
#
#   scripts/openstack-aio.sh install   Debian packages (debconf: configure nothing; no service is started)
#   scripts/openstack-aio.sh start     first time: databases, users, endpoints, flavors, images; then every daemon
#   scripts/openstack-aio.sh stop      every daemon, by the pid this script recorded
#   scripts/openstack-aio.sh status    which daemons run; exit 0 only when all of them do and the cloud answers
#   scripts/openstack-aio.sh clouds    print the path of the clouds.yaml (cloud `slicex-aio`, admin)
#   scripts/openstack-aio.sh purge     stop, then remove every state (databases, images, logs)
#   scripts/openstack-aio.sh run CMD   start, run CMD (SLICEX_OPENSTACK_AIO=1, OS_CLIENT_CONFIG_FILE set), stop
#
# Every command is idempotent. The daemons are started directly (packages' init scripts are not used: policy-rc.d
# may refuse them) with the configuration files of scripts/openstack-aio/, rendered into the state directory.
# Fixed ports, so one such cloud per machine: 3306 5672 4369 5000 8774 8778 9292 9696 (all on 127.0.0.1), and
# OVS 6640/6633 on localhost. Only one userspace ovs-vswitchd can run per host: hold `flock /tmp/slicex-ovs.lock`
# from start to stop when other OVS users share the machine. docs/substrate-openstack.md says more.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
TEMPLATES="$HERE/openstack-aio"
STATE="${SLICEX_OPENSTACK_STATE:-/var/lib/slicex-openstack}"
RUN="$STATE/run"
LOG="$STATE/log"
ETC="$STATE/etc"
OVS="$STATE/ovs"
PASSWORD="slicex-aio"          # every service's password: a throwaway cloud bound to 127.0.0.1
PHYSNET="physnet1"
VLANS="1:4094"

PACKAGES=(mariadb-server python3-pymysql rabbitmq-server keystone uwsgi-plugin-python3 glance-api placement-api
          nova-api nova-conductor nova-scheduler nova-compute nova-compute-qemu libvirt-daemon-system genisoimage neutron-server
          neutron-openvswitch-agent openvswitch-switch python3-openstackclient)

log() { printf '[openstack-aio %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "$*"; exit 1; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# ---- install ----------------------------------------------------------------------------------------------------
cmd_install() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then log "packages installed"; return 0; fi
  log "installing ${#missing[@]} Debian packages (and their dependencies): ${missing[*]}"
  # Configure nothing through debconf: this script writes every configuration itself.
  local q sel=""
  for q in keystone/configure_db keystone/create-admin-tenant keystone/register-endpoint glance/configure_db \
           glance/configure_ksat glance/configure_rabbit glance/configure_api-endpoint placement/configure_db \
           placement/configure_ksat placement/configure_api-endpoint nova/configure_db novaapi/configure_db \
           nova/configure_ksat nova/configure_rabbit nova/configure_api-endpoint nova/configure_neutron \
           nova/configure_placement neutron/configure_db neutron/configure_ksat neutron/configure_rabbit \
           neutron/configure_api-endpoint neutron/configure_nova; do
    sel+="${q%%/*} $q boolean false"$'\n'
  done
  printf '%s' "$sel" | as_root debconf-set-selections
  # policy-rc.d 101 for the install: the packages' own services must not start (this script starts its own).
  local made_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
    as_root chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  as_root apt-get update -q >/dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
    >"${TMPDIR:-/tmp}/openstack-aio-install.log" 2>&1 || { tail -30 "${TMPDIR:-/tmp}/openstack-aio-install.log"; \
    [ -n "$made_policy" ] && as_root rm -f /usr/sbin/policy-rc.d; die "apt-get install failed"; }
  [ -n "$made_policy" ] && as_root rm -f /usr/sbin/policy-rc.d
  log "packages installed"
}

# ---- daemons ----------------------------------------------------------------------------------------------------
# Each daemon runs in its own session (setsid), its pid (= its process group) in $RUN/NAME.pid; stop signals the
# group, so workers a daemon forked go with it.
running() { local f="$RUN/$1.pid"; [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; }

launch() {  # launch NAME [env VAR=...] CMD...: start unless running, output to $LOG/NAME.log
  local name="$1"; shift
  if running "$name"; then return 0; fi
  setsid "$@" >>"$LOG/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
  log "started $name (pid $!)"
  disown $!  # not this shell's job: its end is stop's business
}

halt() {  # halt NAME...: TERM their process groups together, KILL what is left after 10 s (the OVS agent ignores TERM)
  local name pid i alive=()
  for name in "$@"; do
    [ -s "$RUN/$name.pid" ] || continue
    pid="$(cat "$RUN/$name.pid")"
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      alive+=("$name:$pid")
    else
      rm -f "$RUN/$name.pid"
    fi
  done
  for i in $(seq 1 50); do
    still_alive "${alive[@]}" || break
    sleep 0.2
  done
  for name in "${alive[@]}"; do
    pid="${name#*:}"
    if kill -0 "$pid" 2>/dev/null; then kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; fi
  done
  for i in $(seq 1 25); do still_alive "${alive[@]}" || break; sleep 0.2; done
  for name in "${alive[@]}"; do rm -f "$RUN/${name%%:*}.pid"; log "stopped ${name%%:*} (pid ${name#*:})"; done
}

still_alive() { local x; for x in "$@"; do kill -0 "${x#*:}" 2>/dev/null && return 0; done; return 1; }

wait_for() {  # wait_for WHAT SECONDS CMD...: until CMD succeeds
  local what="$1" secs="$2" i; shift 2
  for i in $(seq 1 $((secs * 2))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  die "$what did not come up in ${secs}s (logs: $LOG)"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
http_ok() { curl -s -o /dev/null -m 3 -w '%{http_code}' "$1" | grep -q '^[23]'; }
sql() { mariadb --socket="$STATE/mysql-run/mysqld.sock" -uroot -N -e "$1"; }

DAEMONS=(ovsdb-server ovs-vswitchd mariadb epmd rabbitmq keystone glance-api placement virtlogd libvirtd nova-api
         nova-conductor nova-scheduler nova-compute neutron-server neutron-openvswitch-agent)

render() {  # the repo's configuration files, with this machine's state directory and password
  mkdir -p "$ETC"
  local f
  for f in "$TEMPLATES"/*.conf "$TEMPLATES"/*.ini; do
    sed -e "s|@STATE@|$STATE|g" -e "s|@PASSWORD@|$PASSWORD|g" -e "s|@PHYSNET@|$PHYSNET|g" -e "s|@VLANS@|$VLANS|g" \
      -e "s|@VIRT_TYPE@|$VIRT_TYPE|g" \
      "$f" >"$ETC/$(basename "$f")"
  done
  mkdir -p "$ETC/placement"; cp "$ETC/placement.conf" "$ETC/placement/placement.conf"
  cat >"$STATE/clouds.yaml" <<YAML
# The all-in-one cloud's admin (slicex's openstack substrate needs it: provider VLAN networks are admin-only).
clouds:
  slicex-aio:
    auth:
      auth_url: http://127.0.0.1:5000/v3
      username: admin
      password: $PASSWORD
      project_name: admin
      user_domain_name: Default
      project_domain_name: Default
    region_name: RegionOne
    identity_api_version: 3
YAML
}

start_ovs() {
  mkdir -p "$OVS"
  [ -s "$OVS/conf.db" ] || ovsdb-tool create "$OVS/conf.db" /usr/share/openvswitch/vswitch.ovsschema
  launch ovsdb-server env OVS_RUNDIR="$OVS" OVS_DBDIR="$OVS" ovsdb-server "$OVS/conf.db" --remote="punix:$OVS/db.sock" --remote=ptcp:6640:127.0.0.1 \
    --pidfile="$OVS/ovsdb-server.pid" --unixctl="$OVS/ovsdb-server.ctl"
  wait_for ovsdb-server 20 test -S "$OVS/db.sock"
  ovs-vsctl --db="unix:$OVS/db.sock" --no-wait init
  launch ovs-vswitchd env OVS_RUNDIR="$OVS" OVS_DBDIR="$OVS" ovs-vswitchd "unix:$OVS/db.sock" --pidfile="$OVS/ovs-vswitchd.pid" \
    --unixctl="$OVS/ovs-vswitchd.ctl"
  ovs-vsctl --db="unix:$OVS/db.sock" --timeout=20 --may-exist add-br "br-$PHYSNET" \
    -- set bridge "br-$PHYSNET" datapath_type=netdev
}

start_mariadb() {
  local data="$STATE/mysql" sock="$STATE/mysql-run"
  mkdir -p "$sock"; chown mysql:mysql "$sock"
  if [ ! -d "$data/mysql" ]; then
    mkdir -p "$data"; chown mysql:mysql "$data"
    mariadb-install-db --user=mysql --datadir="$data" --auth-root-authentication-method=socket \
      --skip-test-db >>"$LOG/mariadb.log" 2>&1
  fi
  launch mariadb mariadbd --no-defaults --user=mysql --datadir="$data" --socket="$sock/mysqld.sock" \
    --bind-address=127.0.0.1 --port=3306 --skip-log-bin --innodb-buffer-pool-size=128M --max-connections=1000 \
    --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci
  wait_for mariadb 60 sql "SELECT 1"
  local db
  for db in keystone glance placement nova_api nova nova_cell0 neutron; do
    sql "CREATE DATABASE IF NOT EXISTS $db"
  done
  sql "CREATE USER IF NOT EXISTS 'slicex'@'127.0.0.1' IDENTIFIED BY '$PASSWORD'; GRANT ALL ON *.* TO 'slicex'@'127.0.0.1'"
}

start_rabbitmq() {
  mkdir -p "$STATE/rabbitmq"
  local erl=(env HOME="$STATE/rabbitmq" ERL_EPMD_ADDRESS=127.0.0.1)
  launch epmd "${erl[@]}" epmd
  launch rabbitmq "${erl[@]}" RABBITMQ_NODENAME=rabbit@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_MNESIA_BASE="$STATE/rabbitmq/mnesia" RABBITMQ_LOG_BASE="$LOG" RABBITMQ_PID_FILE="$RUN/rabbitmq-beam.pid" \
    /usr/lib/rabbitmq/bin/rabbitmq-server
  wait_for rabbitmq 90 port_open 5672
}

start_keystone() {
  mkdir -p "$STATE/keystone"
  if [ ! -e "$STATE/keystone/.bootstrapped" ]; then
    local k=(keystone-manage --config-file "$ETC/keystone.conf")
    once keystone-db "${k[@]}" db_sync
    once keystone-fernet "${k[@]}" fernet_setup --keystone-user root --keystone-group root
    once keystone-credential "${k[@]}" credential_setup --keystone-user root --keystone-group root
    once keystone-bootstrap "${k[@]}" bootstrap --bootstrap-password "$PASSWORD" \
      --bootstrap-admin-url http://127.0.0.1:5000/v3/ --bootstrap-internal-url http://127.0.0.1:5000/v3/ \
      --bootstrap-public-url http://127.0.0.1:5000/v3/ --bootstrap-region-id RegionOne
    touch "$STATE/keystone/.bootstrapped"
  fi
  # `Connection: close`: uwsgi resets reused connections otherwise (ConnectionResetError in openstacksdk)
  launch keystone env OS_KEYSTONE_CONFIG_FILES="$ETC/keystone.conf" uwsgi --plugin python3 \
    --http-socket 127.0.0.1:5000 --wsgi-file /usr/bin/keystone-wsgi-public --master --processes 2 --threads 1 \
    --add-header "Connection: close" --die-on-term --need-app
  wait_for keystone 60 http_ok http://127.0.0.1:5000/v3
  if [ ! -e "$STATE/keystone/.catalogue" ]; then
    /usr/bin/python3 "$TEMPLATES/bootstrap.py" catalogue "$STATE/clouds.yaml" "$PASSWORD"
    touch "$STATE/keystone/.catalogue"
  fi
}

once() {  # once NAME CMD...: run CMD the first time only (database schemas)
  local stamp="$STATE/.$1"; shift
  [ -e "$stamp" ] && return 0
  "$@" >>"$LOG/db-sync.log" 2>&1 || die "failed: $* (log: $LOG/db-sync.log)"
  touch "$stamp"
}

start_services() {
  mkdir -p "$STATE/glance/images" "$STATE/glance/lock" "$STATE/nova/lock" "$STATE/neutron/lock"
  local nova=(--config-file "$ETC/nova.conf")
  local neutron=(--config-file "$ETC/neutron.conf" --config-file "$ETC/ml2_conf.ini")
  once glance-db glance-manage --config-file "$ETC/glance-api.conf" db_sync
  once placement-db placement-manage --config-file "$ETC/placement.conf" db sync
  once nova-api-db nova-manage "${nova[@]}" api_db sync
  once nova-cell0 nova-manage "${nova[@]}" cell_v2 map_cell0
  once nova-cell1 nova-manage "${nova[@]}" cell_v2 create_cell --name cell1
  once nova-db nova-manage "${nova[@]}" db sync
  once neutron-db neutron-db-manage "${neutron[@]}" upgrade heads
  launch glance-api glance-api --config-file "$ETC/glance-api.conf"
  launch placement env OS_PLACEMENT_CONFIG_DIR="$ETC/placement" uwsgi --plugin python3 \
    --http-socket 127.0.0.1:8778 --wsgi-file /usr/bin/placement-api --master --processes 1 --threads 2 \
    --add-header "Connection: close" --die-on-term --need-app
  start_libvirt
  launch nova-api nova-api "${nova[@]}"
  launch nova-conductor nova-conductor "${nova[@]}"
  launch nova-scheduler nova-scheduler "${nova[@]}"
  launch nova-compute nova-compute "${nova[@]}"
  launch neutron-server neutron-server "${neutron[@]}"
  start_ovs
  launch neutron-openvswitch-agent env OVS_RUNDIR="$OVS" neutron-openvswitch-agent --config-file "$ETC/neutron.conf" \
    --config-file "$ETC/openvswitch_agent.ini"
  wait_for glance-api 60 http_ok http://127.0.0.1:9292/
  wait_for placement 60 http_ok http://127.0.0.1:8778/
  wait_for nova-api 90 http_ok http://127.0.0.1:8774/
  wait_for neutron-server 90 http_ok http://127.0.0.1:9696/
  if [ ! -e "$STATE/.flavors" ]; then
    /usr/bin/python3 "$TEMPLATES/bootstrap.py" flavors "$STATE/clouds.yaml"
    touch "$STATE/.flavors"
  fi
}

start_libvirt() {  # libvirt's daemons, directly (their init scripts may be refused); QEMU's console logs need virtlogd
  mkdir -p "$STATE/nova/instances"
  launch virtlogd virtlogd
  launch libvirtd libvirtd
  wait_for libvirtd 30 virsh -c qemu:///system version
}

guest_image() {  # guest_image accel|upload ...: scripts/openstack-aio/guest_image.py with the repository's venv
  local py="$HERE/../.venv/bin/python"
  [ -x "$py" ] || py=python3
  "$py" "$TEMPLATES/guest_image.py" "$@"
}

cloud_ready() {  # the compute host is up and mapped, and the OVS agent reports alive
  OS_CLIENT_CONFIG_FILE="$STATE/clouds.yaml" /usr/bin/python3 - <<'PY'
import sys, warnings
warnings.simplefilter("ignore")
import openstack
c = openstack.connect(cloud="slicex-aio")
up = [s for s in c.compute.services() if s.binary == "nova-compute" and s.state == "up"]
hyp = list(c.compute.hypervisors())
agents = [a for a in c.network.agents() if a.agent_type == "Open vSwitch agent" and a.is_alive]
sys.exit(0 if up and hyp and agents else 1)
PY
}

cmd_start() {
  command -v nova-api >/dev/null || die "packages missing: run $0 install first"
  mkdir -p "$RUN" "$LOG"
  VIRT_TYPE="$(guest_image accel "$STATE")" || die "cannot probe KVM (scripts/openstack-aio/guest_image.py)"
  log "libvirt virt_type $VIRT_TYPE"
  render
  local t0=$SECONDS
  start_mariadb
  start_rabbitmq
  start_keystone
  start_services
  nova-manage --config-file "$ETC/nova.conf" cell_v2 discover_hosts >>"$LOG/db-sync.log" 2>&1 || true
  wait_for "the compute host and the OVS agent" 120 cloud_ready
  guest_image upload "$STATE" "$STATE/clouds.yaml" || die "the VM image did not reach Glance"
  log "cloud up in $((SECONDS - t0))s; clouds.yaml: $STATE/clouds.yaml (cloud slicex-aio, physical network $PHYSNET)"
}

cmd_stop() {  # the OpenStack services together, then what they use
  halt neutron-openvswitch-agent neutron-server nova-compute nova-scheduler nova-conductor nova-api placement \
    glance-api keystone
  stop_guests
  halt libvirtd virtlogd
  halt rabbitmq epmd mariadb
  halt ovs-vswitchd
  halt ovsdb-server
}

stop_guests() {  # QEMU processes libvirt started outlive libvirtd: destroy every domain first
  running libvirtd || return 0
  local d
  for d in $(virsh -c qemu:///system list --name 2>/dev/null); do
    virsh -c qemu:///system destroy "$d" >/dev/null 2>&1 && log "destroyed guest $d"
  done
}

cmd_status() {
  local d bad=0
  for d in "${DAEMONS[@]}"; do
    if running "$d"; then echo "$d running (pid $(cat "$RUN/$d.pid"))"; else echo "$d stopped"; bad=1; fi
  done
  return $bad
}

cmd_run() {  # run CMD...: start the cloud, run CMD against it, stop the cloud (always); CMD's exit status
  # The cloud's ovs-vswitchd is the host's one userspace switch while it runs: hold the lock slicex's netns
  # tests take (authority/substrate/hostnet.py host_lock) from start to stop.
  exec 9>>/run/lock/slicex-host-network.lock
  flock 9
  local rc=0
  trap cmd_stop EXIT
  cmd_start
  SLICEX_OPENSTACK_AIO=1 OS_CLIENT_CONFIG_FILE="$STATE/clouds.yaml" "$@" || rc=$?
  trap - EXIT
  cmd_stop
  return $rc
}

cmd_purge() {
  cmd_stop
  rm -rf "$STATE"
  log "removed $STATE"
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  clouds) echo "$STATE/clouds.yaml" ;;
  purge) cmd_purge ;;
  run) shift; cmd_run "$@" ;;
  *) echo "usage: $0 install|start|stop|status|clouds|purge|run CMD..." >&2; exit 2 ;;
esac
