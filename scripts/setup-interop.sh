#!/usr/bin/env bash
# Prepare a Python 2.7 environment in which geni-tools' omni and its GENI AM API acceptance suite
# (acceptance_tests/AM_API/am_api_accept.py) run, for interop testing of slicex. Idempotent.
#
# Usage: scripts/setup-interop.sh [GENI_TOOLS_TREE]      (default: $INTEROP/geni-tools, INTEROP defaulting to ~/interop)
#   GENI_TOOLS_TREE must ALREADY exist: a work tree of the public repo GENI-NSF/geni-tools (any checkout or
#   `git archive HEAD | tar -x`). This script does not fetch it and contains none of its code; it only
#   installs what that code needs. For compatibility, a directory holding geni-tools/ is also accepted.
# Environment: PY2_VENV  virtualenv to create   (default: <parent of GENI_TOOLS_TREE>/py2, i.e. $INTEROP/py2)
#              PY27      Python 2.7 interpreter (default: pyenv's ~/.pyenv/versions/2.7.18/bin/python)
# Afterwards:
#   $PY2_VENV/bin/python $GENI_TOOLS_TREE/src/omni.py --version
#   cd $GENI_TOOLS_TREE/acceptance_tests/AM_API && PYTHONPATH=../../src $PY2_VENV/bin/python am_api_accept.py --help
set -euo pipefail

tree=${1:-${INTEROP:-$HOME/interop}/geni-tools}
if [ ! -f "$tree/src/omni.py" ] && [ -f "$tree/geni-tools/src/omni.py" ]; then tree=$tree/geni-tools; fi
if [ ! -f "$tree/src/omni.py" ]; then
  echo "setup-interop: no geni-tools work tree at $tree (expected $tree/src/omni.py)." >&2
  echo "  Put a checkout of GENI-NSF/geni-tools there first; this script does not download it." >&2
  exit 1
fi
tree=$(cd "$tree" && pwd)
venv=${PY2_VENV:-$(dirname "$tree")/py2}
py27=${PY27:-$HOME/.pyenv/versions/2.7.18/bin/python}

# 1. Debian packages: xmlsec1 (credential signing/verification), and swig + OpenSSL headers + a C
#    toolchain to build M2Crypto from its sdist (there is no cp27 wheel on PyPI).
if [ "$(id -u)" -eq 0 ]; then SUDO=; else SUDO=sudo; fi
debs=(xmlsec1 swig libssl-dev build-essential)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-interop: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}" >/dev/null
fi

# 2. Python 2.7 (pyenv 2.7.18) and a virtualenv made with a py2-capable virtualenv (<20.22).
if [ ! -x "$py27" ]; then
  echo "setup-interop: no Python 2.7 at $py27 (set PY27, or 'pyenv install 2.7.18')." >&2
  exit 1
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONWARNINGS=ignore
"$py27" -c 'import virtualenv' 2>/dev/null || "$py27" -m pip install -q "virtualenv<20.22"
[ -x "$venv/bin/python" ] || "$py27" -m virtualenv -q "$venv"

# 3. Packages, pinned to the last releases that support Python 2.7:
#    pip 20.3.4 (last py2 pip), setuptools 44.x, cryptography 3.3.2 (cp27 manylinux wheel),
#    pyOpenSSL 21.0.0, lxml 4.9.4 (cp27 manylinux wheel), M2Crypto 0.40.1 (built from sdist with swig).
"$venv/bin/python" -m pip install -q "pip<21" "setuptools<45" "wheel<0.38"
"$venv/bin/python" -m pip install -q \
  "six" "python-dateutil==2.9.0.post0" "cryptography==3.3.2" "pyOpenSSL==21.0.0" \
  "lxml==4.9.4" "M2Crypto==0.40.1"

# 4. Check.
"$venv/bin/python" -c 'import M2Crypto, OpenSSL, lxml.etree, dateutil.parser'
"$venv/bin/python" "$tree/src/omni.py" --version 2>/dev/null | head -1
(cd "$tree/acceptance_tests/AM_API" &&
  PYTHONPATH="$tree/src" "$venv/bin/python" am_api_accept.py --help >/dev/null 2>&1) ||
  { echo "setup-interop: am_api_accept.py --help failed" >&2; exit 1; }
xmlsec1 --version | head -1
echo "setup-interop: ready: $venv/bin/python with geni-tools at $tree"
