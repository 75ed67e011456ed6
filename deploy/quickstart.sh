#!/usr/bin/env bash
# deploy/quickstart.sh — try sidecache locally in one command.
#
#   deploy/quickstart.sh              3-master Redis Cluster + sidecache
#   deploy/quickstart.sh standalone   one redis-server + sidecache
#   deploy/quickstart.sh status       what is running, and does it answer
#   deploy/quickstart.sh stop         stop exactly the processes started here
#
# Environment:
#   SIDECACHE_QUICKSTART_DIR  work dir for pid files, logs, data, the socket
#                             (default /tmp/sidecache-quickstart)
#   BASE_PORT                 first Redis port (default 7000; cluster uses
#                             BASE_PORT..BASE_PORT+2 and +10000 for the bus)
#   SIDECACHE_PORT            sidecache's TCP port (default 6380)
#   SIDECACHE_BIN             binary to run (default <repo>/target/release/sidecache,
#                             built with cargo when missing)
#   SIDECACHE_ARGS            extra sidecache flags, word-split (e.g. "--log-level debug")
#   STOP_TIMEOUT              seconds `stop` waits per process before SIGKILL (default 40)
#
# Processes are only ever stopped by the pids recorded in the work dir.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
DIR="${SIDECACHE_QUICKSTART_DIR:-/tmp/sidecache-quickstart}"
BASE_PORT="${BASE_PORT:-7000}"
SIDECACHE_PORT="${SIDECACHE_PORT:-6380}"
SIDECACHE_BIN="${SIDECACHE_BIN:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache}"
SIDECACHE_ARGS="${SIDECACHE_ARGS:-}"
STOP_TIMEOUT="${STOP_TIMEOUT:-40}"
SOCKET="$DIR/sidecache.sock"

log() { printf '[quickstart] %s\n' "$*" >&2; }
die() { printf '[quickstart] error: %s\n' "$*" >&2; exit 1; }

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

if ! [[ "$BASE_PORT" =~ ^[1-9][0-9]{0,4}$ ]] || ((BASE_PORT + 2 + 10000 > 65535)); then
  die "BASE_PORT must be a port number up to 55533, not '$BASE_PORT'"
fi
if ! [[ "$SIDECACHE_PORT" =~ ^[1-9][0-9]{0,4}$ ]] || ((SIDECACHE_PORT > 65535)); then
  die "SIDECACHE_PORT must be a port number, not '$SIDECACHE_PORT'"
fi
[[ "$STOP_TIMEOUT" =~ ^[0-9]+$ ]] || die "STOP_TIMEOUT must be a number of seconds, not '$STOP_TIMEOUT'"

# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
ensure_packages() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  ((${#missing[@]} == 0)) && return 0
  command -v apt-get >/dev/null 2>&1 || die "please install ${missing[*]} (no apt-get here)"
  local sudo=()
  ((EUID == 0)) || sudo=(sudo)
  log "installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

ensure_binary() {
  [[ -x "$SIDECACHE_BIN" ]] && return 0
  command -v cargo >/dev/null 2>&1 ||
    die "$SIDECACHE_BIN is missing and cargo is not installed (install Rust from rustup.rs, or set SIDECACHE_BIN)"
  log "building sidecache (release; the first build takes a few minutes)"
  (cd "$REPO_ROOT" && cargo build --release -p sidecache)
  [[ -x "$SIDECACHE_BIN" ]] || die "build finished but $SIDECACHE_BIN is not there"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ping_port() { [[ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null || true)" == PONG ]]; }

pid_alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }

read_pid() { # read_pid FILE -> pid or ""
  local pid=""
  if [[ -f "$1" ]]; then read -r pid <"$1" 2>/dev/null || true; fi
  if [[ "$pid" =~ ^[0-9]+$ ]]; then echo "$pid"; fi
}

# A recorded pid is only signalled if it still runs the program we started
# there: pids are reused, and a stale file must never kill a stranger.
pid_runs() { # pid_runs PID NAME
  local cmd
  cmd="$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true)"
  [[ "$cmd" == *"$2"* ]]
}

pid_files() { # sidecache first, so it can drain its writes to a live upstream
  [[ -f "$DIR/sidecache.pid" ]] && echo "$DIR/sidecache.pid"
  compgen -G "$DIR/redis-*.pid" || true
}

running_anything() {
  local f pid
  while read -r f; do
    [[ -n "$f" ]] || continue
    pid="$(read_pid "$f")"
    pid_alive "$pid" && return 0
  done < <(pid_files)
  return 1
}

stop_all() {
  local f pid name i stopped=0
  while read -r f; do
    [[ -n "$f" ]] || continue
    pid="$(read_pid "$f")"
    name="redis-server"
    [[ "$(basename "$f")" == sidecache.pid ]] && name="sidecache"
    if pid_alive "$pid" && pid_runs "$pid" "$name"; then
      log "stopping $name (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        pid_alive "$pid" || break
        sleep 0.1
      done
      if pid_alive "$pid"; then
        log "$name (pid $pid) still running after ${STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
      fi
      stopped=$((stopped + 1))
    elif pid_alive "$pid"; then
      log "pid $pid from $f is no longer $name; leaving it alone"
    fi
    rm -f -- "$f"
  done < <(pid_files)
  rm -f -- "$SOCKET" "$DIR/topology"
  log "stopped $stopped process(es); logs stay in $DIR"
}

wait_until() { # wait_until SECONDS DESCRIPTION CMD... — poll CMD every 0.1s
  local secs="$1" what="$2" i
  shift 2
  for ((i = 0; i < secs * 10; i++)); do
    "$@" && return 0
    sleep 0.1
  done
  die "timed out after ${secs}s waiting for $what"
}

start_redis() { # start_redis PORT [extra redis-server args...]
  local port="$1"
  shift
  port_in_use "$port" && die "port $port is already in use (set BASE_PORT to use other ports)"
  mkdir -p "$DIR/redis-$port"
  redis-server --bind 127.0.0.1 --port "$port" --dir "$DIR/redis-$port" \
    --save '' --appendonly no --daemonize yes \
    --pidfile "$DIR/redis-$port.pid" --logfile "$DIR/redis-$port.log" "$@"
  wait_until 10 "redis-server on port $port (see $DIR/redis-$port.log)" ping_port "$port"
  log "redis-server 127.0.0.1:$port (pid $(read_pid "$DIR/redis-$port.pid"))"
}

cluster_ok() {
  local p
  for p in "$@"; do
    redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
  done
}

sidecache_ready() {
  local pid
  pid="$(read_pid "$DIR/sidecache.pid")"
  if ! pid_alive "$pid"; then
    log "sidecache exited during start-up; last lines of $DIR/sidecache.log:"
    tail -n 20 "$DIR/sidecache.log" >&2 || true
    exit 1
  fi
  ping_port "$SIDECACHE_PORT"
}

# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------
cmd_start() {
  local topology="$1" extra=() ports=() nodes=() p
  ensure_packages
  ensure_binary
  mkdir -p "$DIR"
  if running_anything; then
    die "a quickstart is already running in $DIR; run '$0 stop' first"
  fi
  port_in_use "$SIDECACHE_PORT" && die "port $SIDECACHE_PORT is already in use (set SIDECACHE_PORT)"
  if [[ "$topology" == cluster ]]; then
    for ((p = BASE_PORT; p < BASE_PORT + 3; p++)); do
      ports+=("$p")
      nodes+=("127.0.0.1:$p")
    done
  else
    ports=("$BASE_PORT")
  fi
  for p in "${ports[@]}"; do
    port_in_use "$p" && die "port $p is already in use (set BASE_PORT to use other ports)"
    if [[ "$topology" == cluster ]] && port_in_use $((p + 10000)); then
      die "cluster bus port $((p + 10000)) is already in use (set BASE_PORT to use other ports)"
    fi
  done
  # Fresh data every time: stale nodes.conf files would resurrect an old cluster.
  rm -rf -- "$DIR"/redis-* "$SOCKET"
  echo "$topology" >"$DIR/topology"

  # Whatever fails from here on, stop what was already started.
  trap 'rc=$?; if ((rc != 0)); then log "start failed; cleaning up"; stop_all; fi' EXIT

  if [[ "$topology" == cluster ]]; then
    for p in "${ports[@]}"; do
      start_redis "$p" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
    done
    log "creating the cluster"
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes \
      >"$DIR/cluster-create.log" 2>&1 ||
      { tail -n 20 "$DIR/cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
    wait_until 30 "cluster_state:ok" cluster_ok "${ports[@]}"
    log "cluster is up (cluster_state:ok)"
  else
    start_redis "$BASE_PORT"
  fi

  read -r -a extra <<<"$SIDECACHE_ARGS"
  log "starting sidecache"
  nohup "$SIDECACHE_BIN" \
    --upstream "redis://127.0.0.1:$BASE_PORT" \
    --listen "127.0.0.1:$SIDECACHE_PORT" \
    --unix-socket "$SOCKET" \
    "${extra[@]}" >"$DIR/sidecache.log" 2>&1 </dev/null &
  echo "$!" >"$DIR/sidecache.pid"
  wait_until 30 "sidecache to answer PING on port $SIDECACHE_PORT (see $DIR/sidecache.log)" sidecache_ready
  trap - EXIT

  if [[ -S "$SOCKET" ]] && [[ "$(redis-cli -s "$SOCKET" ping 2>/dev/null || true)" == PONG ]]; then
    log "unix socket $SOCKET answers PING"
  else
    log "warning: $SOCKET does not answer PING (yet); TCP works"
  fi

  cat <<EOF

sidecache is running (pid $(read_pid "$DIR/sidecache.pid")) in front of a local Redis $topology on port $BASE_PORT.

Connect:
  redis-cli -p $SIDECACHE_PORT
  redis-cli -s $SOCKET
  # in an app: redis://127.0.0.1:$SIDECACHE_PORT  or  unix://$SOCKET

Try:
  redis-cli -p $SIDECACHE_PORT set greeting hello
  redis-cli -p $SIDECACHE_PORT get greeting

Logs: $DIR/sidecache.log, $DIR/redis-*.log
Stop: $0 stop
EOF
}

cmd_status() {
  local f pid name any=0
  while read -r f; do
    [[ -n "$f" ]] || continue
    any=1
    pid="$(read_pid "$f")"
    name="$(basename "$f" .pid)"
    if pid_alive "$pid"; then echo "$name: running (pid $pid)"; else echo "$name: not running (stale $f)"; fi
  done < <(pid_files)
  ((any)) || { echo "nothing started from $DIR"; return 0; }
  if ping_port "$SIDECACHE_PORT"; then
    echo "sidecache 127.0.0.1:$SIDECACHE_PORT answers PING"
  else
    echo "sidecache 127.0.0.1:$SIDECACHE_PORT does not answer PING"
  fi
}

case "${1:-start}" in
  start | cluster) cmd_start cluster ;;
  standalone) cmd_start standalone ;;
  stop) stop_all ;;
  status) cmd_status ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
