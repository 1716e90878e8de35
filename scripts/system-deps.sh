#!/usr/bin/env bash
# Install the Debian packages slicex's tests and demo use, if missing: redis-server, xmlsec1, iproute2; for the
# netns substrate (real slivers on one host) Open vSwitch (userspace datapath, started privately, never the
# system service), iperf3, ethtool, ping and openssh-server; chromium for the dashboard's browser test
# (tests/integration/test_dashboard_browser.py drives it with Playwright, no browser download).
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v xmlsec1 >/dev/null || need+=(xmlsec1)
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
command -v ovs-vswitchd >/dev/null || need+=(openvswitch-switch)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v ethtool >/dev/null || need+=(ethtool)
command -v ping >/dev/null || need+=(iputils-ping)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v chromium >/dev/null || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
echo "installing Debian packages: ${need[*]}"
$SUDO apt-get update -q >/dev/null
# policy-rc.d 101: the packages' own services (system Open vSwitch, sshd) are not started by the install;
# slicex starts private instances.
if [ ! -e /usr/sbin/policy-rc.d ] && [ -w /usr/sbin ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}" >/dev/null
