#!/usr/bin/env bash
# Prepare a Python 2.7 environment for geni-tools' omni and AM API acceptance suite (interop testing only).
# Usage: scripts/setup-interop.sh DIR   -> DIR/py2 (virtualenv). A geni-tools work tree is expected in
# DIR/geni-tools (bring it in with any git checkout of GENI-NSF/geni-tools; it is not part of slicex).
set -euo pipefail
dir=${1:-/work/interop}
py27=${PY27:-$HOME/.pyenv/versions/2.7.18/bin/python}
mkdir -p "$dir"
if [ "$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi
$SUDO apt-get install -y -q swig libssl-dev build-essential xmlsec1 >/dev/null
"$py27" -m pip install -q "virtualenv<20.22"
[ -x "$dir/py2/bin/python" ] || "$py27" -m virtualenv -q "$dir/py2"
"$dir/py2/bin/pip" install -q "pip<21" "setuptools<45"
"$dir/py2/bin/pip" install -q python-dateutil "pyOpenSSL==21.0.0" "lxml==4.9.4" six "M2Crypto==0.40.1"
if [ -f "$dir/geni-tools/src/omni.py" ]; then
  "$dir/py2/bin/python" "$dir/geni-tools/src/omni.py" --version 2>/dev/null | head -1
else
  echo "now put a geni-tools work tree in $dir/geni-tools"
fi
