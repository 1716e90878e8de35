#!/usr/bin/env bash
# Install the Debian packages slicex's tests and demo use (redis-server, xmlsec1, iproute2), if missing.
set -euo pipefail
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v xmlsec1 >/dev/null || need+=(xmlsec1)
command -v ip >/dev/null || need+=(iproute2)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo
else
  SUDO=
fi
echo "installing Debian packages: ${need[*]}"
$SUDO apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}" >/dev/null
