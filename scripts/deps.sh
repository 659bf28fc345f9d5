#!/usr/bin/env bash
# Installs quire's build and test dependencies from Debian 12's packages.
# Usage: scripts/deps.sh [build|test]   (test adds clang for the fuzzers, python3-venv, and
# chromium with its driver for the browser tests)
set -euo pipefail
want=(build-essential cmake pkg-config libwebsockets-dev libjansson-dev libpcre2-dev libsqlite3-dev)
if [ "${1:-build}" = test ]; then
  want+=(clang libclang-rt-dev python3 python3-venv chromium chromium-driver)
fi
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
