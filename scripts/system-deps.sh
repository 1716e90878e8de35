#!/usr/bin/env bash
# Install the Debian packages slicex's tests and demo use, if missing: redis-server, xmlsec1, iproute2; for the
# netns substrate (real slivers on one host) Open vSwitch (userspace datapath, started privately, never the
# system service), iperf3, ethtool, ping and openssh-server; chromium for the dashboard's browser test
# (tests/integration/test_dashboard_browser.py drives it with Playwright, no browser download); lxc, uidmap and
# debootstrap for the netns substrate's container nodes and their images; qemu-system-x86 and qemu-utils for its
# qemu-vm nodes; nftables and socat for the lab.
# With --bench (`make bench-deps`), also nginx: the C floor bench/tls_floor.py measures slicex against (run by
# the bench on its own configuration and ports; the package's own service is never started).
set -euo pipefail
bench=0
[ "${1:-}" = "--bench" ] && bench=1
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v xmlsec1 >/dev/null || need+=(xmlsec1)
command -v ip >/dev/null || need+=(iproute2)
command -v tc >/dev/null || need+=(iproute2)
command -v ovs-vswitchd >/dev/null || need+=(openvswitch-switch)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v ethtool >/dev/null || need+=(ethtool)
command -v ping >/dev/null || need+=(iputils-ping)
# the multi-host lab (docs/lab.md): NAT hosts and the Redis relay
command -v nft >/dev/null || need+=(nftables)
command -v socat >/dev/null || need+=(socat)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v chromium >/dev/null || need+=(chromium)
# container nodes of the netns substrate: unprivileged LXC, newuidmap, and debootstrap for node images
# (without recommends: no lxcfs, no LXC network of its own)
lean=()
command -v lxc-start >/dev/null || lean+=(lxc)
[ -e /usr/sbin/init.lxc.static ] || lean+=(lxc)
command -v newuidmap >/dev/null || lean+=(uidmap)
command -v debootstrap >/dev/null || lean+=(debootstrap)
# qemu-vm nodes of the netns substrate and their images' VM form (TCG where KVM is not usable)
command -v qemu-system-x86_64 >/dev/null || lean+=(qemu-system-x86)
command -v qemu-img >/dev/null || lean+=(qemu-utils)
if [ "$bench" -eq 1 ]; then
  [ -x /usr/sbin/nginx ] || lean+=(nginx)
fi
[ ${#need[@]} -eq 0 ] && [ ${#lean[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
[ ${#need[@]} -gt 0 ] && mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
[ ${#lean[@]} -gt 0 ] && mapfile -t lean < <(printf '%s\n' "${lean[@]}" | sort -u)
echo "installing Debian packages: ${need[*]} ${lean[*]}"
$SUDO apt-get update -q >/dev/null
# policy-rc.d 101: the packages' own services (system Open vSwitch, sshd, nginx) are not started by the install;
# slicex starts private instances.
if [ ! -e /usr/sbin/policy-rc.d ] && [ -w /usr/sbin ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}" >/dev/null
fi
if [ ${#lean[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${lean[@]}" >/dev/null
fi
