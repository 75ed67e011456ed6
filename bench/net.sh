#!/usr/bin/env bash
# bench/net.sh — what a sidecar is for: the same loads against Redis over a
# network round trip, side by side, in one run.
#
# Every Redis sits behind bench's `relay`, which adds RTT/2 each way (one
# thread with nanosecond epoll timeouts, see bench/src/relay.rs), so each
# target pays a real round trip to its Redis:
#
#   redis            latbench ──relay──▶ Redis A
#   twemproxy        latbench ──▶ nutcracker ──relay──▶ Redis A
#   sidecache        latbench ──▶ sidecache (TCP)         ──relay──▶ Redis B
#   sidecache-unix   latbench ──▶ the same, Unix socket    ──relay──▶ Redis B
#   (set-wt rows)    latbench ──▶ sidecache --write-mode write-through ──relay──▶ Redis C
#
# Everything reaches the relay over TCP, as it would reach Redis over a
# network; the relay reaches each Redis over its Unix socket
# (RELAY_UPSTREAM=unix, the default; tcp for loopback TCP), so its second
# hop costs the shared cores less: a network's hop costs the application's
# host nothing. Each run also records the CPU time (utime + stime, from
# /proc/PID/stat) the relay, the proxy and the Redis behind it used per
# request: on a machine whose cores every process shares, that is what
# bounds the many-client rows (see the report's CPU table).
#
# With PIN=1 (default) the client, sidecache and twemproxy share CPU 0 (the
# application's host) and the relay and the Redises CPU 1 (the network and
# the Redis host), so the relay's work never takes the client's core.
# (sidecache and the proxies run next to the client, as a sidecar does;
# sidecache has Redises of its own so its tracking costs the direct runs
# nothing, as in run.sh.) For each round trip in RTTS the relay, both
# sidecaches and twemproxy are started afresh; sidecache's L1 is warmed
# (every key read once); then ROUNDS rounds run every test against every
# target, the target order rotating per round, once with one client (p50 /
# p99 from latbench's 1 µs histogram) and once with MANY clients
# (throughput). Medians over the rounds are reported.
#
# Tests: get (hits: every key of the keyspace is written first), get-miss
# (keys out of a 10^8 space: misses, fetched upstream), set (write-behind
# through sidecache), set-wt (the write-through sidecache; redis and
# twemproxy repeat their SET rows), incr (forwarded), mget (10 hits),
# get-p16 / set-p16 (16 pipelined per round trip).
#
# Knobs: RTTS="0.2 0.5 1" (ms)  ROUNDS=5  SECS=1 (per run)  WARMUP=0.2
#        MANY=50  KEYSPACE=100000  DATA_SIZE=64  JITTER_US=0
#        TESTS="get get-miss set set-wt incr mget get-p16 set-p16"
#        MODES="1 many"  TARGETS="redis sidecache sidecache-unix twemproxy"
#        BASELINE_BIN=path  (adds target "baseline": another sidecache
#                            binary, TCP, with a Redis of its own; for A/B)
#        PIN=1 APP_CPU=0 REMOTE_CPU=1 REDIS_CPU=$REMOTE_CPU  SIDECACHE_BIN  SIDECACHE_ARGS
#        RELAY_UPSTREAM=unix|tcp
#        SKIP_BUILD=1  PAUSE=0.3
#        RESULTS_DIR=bench/results  PREFIX=net  KEEP_WORKDIR=1  CHART=1
# Output: $RESULTS_DIR/$PREFIX.md (table), $PREFIX-raw.csv (every run),
#         $PREFIX.png (chart), relay-selftest.md (with SELFTEST=1, default).
# Only processes this script started are stopped (by pid, on exit).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
RTTS="${RTTS:-0.2 0.5 1}"
ROUNDS="${ROUNDS:-5}"
SECS="${SECS:-1}"
WARMUP="${WARMUP:-0.2}"
MANY="${MANY:-50}"
KEYSPACE="${KEYSPACE:-100000}"
DATA_SIZE="${DATA_SIZE:-64}"
JITTER_US="${JITTER_US:-0}"
TESTS="${TESTS:-get get-miss set set-wt incr mget get-p16 set-p16}"
MODES="${MODES:-1 many}"
TARGETS="${TARGETS:-redis sidecache sidecache-unix twemproxy}"
BASELINE_BIN="${BASELINE_BIN:-}"
SIDECACHE_ARGS="${SIDECACHE_ARGS:-}"
PAUSE="${PAUSE:-0.3}"
RESULTS_DIR="${RESULTS_DIR:-$SCRIPT_DIR/results}"
PREFIX="${PREFIX:-net}"
KEEP_WORKDIR="${KEEP_WORKDIR:-0}"
CHART="${CHART:-1}"
SELFTEST="${SELFTEST:-1}"
RELAY_UPSTREAM="${RELAY_UPSTREAM:-unix}"
[[ "$RELAY_UPSTREAM" == unix || "$RELAY_UPSTREAM" == tcp ]] || { echo "RELAY_UPSTREAM must be unix or tcp" >&2; exit 2; }
# PIN=1: the application side (latbench, sidecache, twemproxy) on CPU
# APP_CPU, the "remote" side (relay, Redis) on REMOTE_CPU, as an app host
# and a Redis host would be; PIN=0 lets the scheduler place everything.
PIN="${PIN:-1}"
APP_CPU="${APP_CPU:-0}"
REMOTE_CPU="${REMOTE_CPU:-1}"
# REDIS_CPU: where the Redises run when pinned (default REMOTE_CPU; APP_CPU
# gives the relay a core of its own, a check of what the relay costs them).
REDIS_CPU="${REDIS_CPU:-$REMOTE_CPU}"
APP=()
REMOTE=()
REDIS_ON=()
if [[ "$PIN" == 1 ]] && (($(nproc) >= 2)) && command -v taskset >/dev/null; then
  APP=(taskset -c "$APP_CPU")
  REMOTE=(taskset -c "$REMOTE_CPU")
  REDIS_ON=(taskset -c "$REDIS_CPU")
else
  PIN=0
fi
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release"
SIDECACHE_BIN="${SIDECACHE_BIN:-$TARGET_DIR/sidecache}"
LAT="$TARGET_DIR/latbench"
RELAY="$TARGET_DIR/relay"
[[ -n "$BASELINE_BIN" ]] && TARGETS+=" baseline"
export RUST_BACKTRACE=0

log() { printf '[net] %s\n' "$*" >&2; }
die() { printf '[net] error: %s\n' "$*" >&2; exit 1; }

# Tools (as run.sh: install what is missing from Debian).
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
[[ " $TARGETS " == *" twemproxy "* ]] && { command -v nutcracker >/dev/null || missing+=(nutcracker); }
[[ "$CHART" == 1 ]] && { command -v gnuplot >/dev/null || missing+=(gnuplot-nox); }
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  log "building sidecache and the bench tools (release)"
  (cd "$REPO_ROOT" && cargo build --release -p sidecache -p sidecache-bench)
fi
for b in "$SIDECACHE_BIN" "$LAT" "$RELAY"; do [[ -x "$b" ]] || die "$b not built"; done

# Processes: every pid started is recorded; stopped in reverse order.
PIDS=()
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sidecache-net.XXXXXX")"
FAILED=1
stop_pids() { # stop_pids PID... (SIGTERM, then SIGKILL after 10 s)
  local pid
  for pid in "$@"; do
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
cleanup() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pids "${PIDS[i]}"; done
  if [[ "$KEEP_WORKDIR" == 1 || "$FAILED" == 1 ]]; then log "logs kept in $WORK"; else rm -rf -- "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
LAST_PID=""
start_bg() { # start_bg NAME CMD...
  local name="$1"; shift
  "$@" >"$WORK/$name.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}
# Free ports below the ephemeral range (as run.sh).
USED=" "
EPH_LOW="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
PICKED=""
pick_port() {
  local p
  for _ in $(seq 1 500); do
    p=$((10000 + RANDOM % (EPH_LOW - 10000)))
    [[ "$USED" == *" $p "* ]] && continue
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
    USED+="$p "; PICKED="$p"; return 0
  done
  die "no free port"
}
wait_ready() { # wait_ready NAME PID PORT
  for _ in $(seq 1 300); do
    kill -0 "$2" 2>/dev/null || { tail -n 20 "$WORK/$1.log" >&2; die "$1 exited during start-up"; }
    [[ "$(redis-cli -h 127.0.0.1 -p "$3" ping 2>/dev/null || true)" == PONG ]] && return 0
    sleep 0.1
  done
  die "$1 did not answer PING on $3"
}

# Redises: A (direct, twemproxy), B (sidecache), C (write-through), D (baseline).
declare -A RPORT=() RPID=()
# The Redis behind each target (for its CPU per request).
declare -A BEHIND=([redis]=A [twemproxy]=A [sidecache]=B [sidecache-wt]=C [baseline]=D)
REDISES="A B C"
[[ -n "$BASELINE_BIN" ]] && REDISES+=" D"
value="$(head -c "$DATA_SIZE" /dev/zero | tr '\0' x)"
for r in $REDISES; do
  pick_port; RPORT[$r]="$PICKED"; mkdir -p "$WORK/redis-$r"
  start_bg "redis-$r" "${REDIS_ON[@]}" redis-server --bind 127.0.0.1 --port "$PICKED" --dir "$WORK/redis-$r" \
    --unixsocket "$WORK/redis-$r.sock" --unixsocketperm 700 \
    --save '' --appendonly no --daemonize no
  RPID[$r]="$LAST_PID"
  wait_ready "redis-$r" "$LAST_PID" "$PICKED"
  # Every key of the keyspace exists: GET and MGET read hits.
  awk -v n="$KEYSPACE" -v v="$value" 'BEGIN { for (i = 0; i < n; i++) printf "SET key:%012d %s\r\n", i, v }' |
    redis-cli -p "$PICKED" --pipe >/dev/null
done
log "redis A/B/C${BASELINE_BIN:+/D} on ${RPORT[*]}, $KEYSPACE keys each"

if [[ "$SELFTEST" == 1 ]]; then
  log "relay self-test"
  "${REMOTE[@]}" "$RELAY" --self-test --out "$WORK/relay-selftest.md" >&2
fi

RAW="$WORK/raw.csv"
echo "rtt_ms,round,clients,target,test,rps,p50_us,p99_us,mean_us,requests,errors,nils,relay_cpu_us,proxy_cpu_us,redis_cpu_us" >"$RAW"
TCK="$(getconf CLK_TCK)"
ticks() { # ticks PID: utime + stime of the process (all threads), clock ticks
  [[ -n "$1" ]] && awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo ""
}
per_req() { # per_req BEFORE AFTER REQUESTS: µs of CPU per request, or empty
  [[ -n "$1" && -n "$2" && "$3" -gt 0 ]] && awk -v a="$1" -v b="$2" -v n="$3" -v t="$TCK" 'BEGIN { printf "%.2f", (b - a) / t * 1e6 / n }' || true
}
read -r -a TARGET_LIST <<<"$TARGETS"
read -r -a EXTRA <<<"$SIDECACHE_ARGS"
WARM_FILE="$WORK/warm.txt"
awk -v n="$KEYSPACE" 'BEGIN { for (i = 0; i < n; i++) printf "GET key:%012d\r\n", i }' >"$WARM_FILE"

for rtt in $RTTS; do
  one_way_us="$(awk -v r="$rtt" 'BEGIN { printf "%d", r * 500 }')"
  log "round trip $rtt ms: relay +$one_way_us µs each way"
  STARTED=()
  routes=()
  declare -A VIA=()
  for r in $REDISES; do
    pick_port; VIA[$r]="$PICKED"
    if [[ "$RELAY_UPSTREAM" == unix ]]; then
      routes+=(--route "127.0.0.1:$PICKED=unix:$WORK/redis-$r.sock")
    else
      routes+=(--route "127.0.0.1:$PICKED=127.0.0.1:${RPORT[$r]}")
    fi
  done
  declare -A WHO=() DEAD=()
  start_bg "relay-$rtt" "${REMOTE[@]}" "$RELAY" --delay-us "$one_way_us" --jitter-us "$JITTER_US" "${routes[@]}"
  STARTED+=("$LAST_PID")
  WHO[$LAST_PID]=relay
  RELAY_PID="$LAST_PID"
  declare -A PPID_OF=()
  wait_ready "relay-$rtt" "$LAST_PID" "${VIA[A]}"
  declare -A PORT=() SOCK=()
  PORT[redis]="${VIA[A]}"
  start_sidecache() { # start_sidecache NAME BIN REDIS [args...]
    local name="$1" bin="$2" r="$3"; shift 3
    pick_port; local p="$PICKED"
    start_bg "$name-$rtt" "${APP[@]}" "$bin" --listen "127.0.0.1:$p" --unix-socket "$WORK/$name-$rtt.sock" \
      --metrics-listen 127.0.0.1:0 --upstream "redis://127.0.0.1:${VIA[$r]}" --log-level warn \
      "${EXTRA[@]}" "$@"
    STARTED+=("$LAST_PID")
    WHO[$LAST_PID]="$name"
    PPID_OF[$name]="$LAST_PID"
    wait_ready "$name-$rtt" "$LAST_PID" "$p"
    PORT[$name]="$p"; SOCK[$name]="$WORK/$name-$rtt.sock"
    # Warm: every key read once (pipelined, so quick at any round trip).
    redis-cli -p "$p" --pipe <"$WARM_FILE" >/dev/null 2>>"$WORK/warm.log" || log "warning: warm-up of $name failed"
  }
  start_sidecache sidecache "$SIDECACHE_BIN" B
  PORT[sidecache-unix]="${PORT[sidecache]}"; SOCK[sidecache-unix]="${SOCK[sidecache]}"
  start_sidecache sidecache-wt "$SIDECACHE_BIN" C --write-mode write-through
  [[ -n "$BASELINE_BIN" ]] && start_sidecache baseline "$BASELINE_BIN" D
  if [[ " $TARGETS " == *" twemproxy "* ]]; then
    pick_port; tp="$PICKED"
    cat >"$WORK/nutcracker-$rtt.yml" <<EOF
net_bench:
  listen: 127.0.0.1:$tp
  hash: fnv1a_64
  distribution: ketama
  redis: true
  server_connections: 1
  auto_eject_hosts: false
  preconnect: true
  servers:
    - 127.0.0.1:${VIA[A]}:1
EOF
    pick_port
    start_bg "nutcracker-$rtt" "${APP[@]}" nutcracker --conf-file="$WORK/nutcracker-$rtt.yml" --stats-port="$PICKED" --stats-addr=127.0.0.1
    STARTED+=("$LAST_PID")
    WHO[$LAST_PID]=twemproxy
    PPID_OF[twemproxy]="$LAST_PID"
    wait_ready "nutcracker-$rtt" "$LAST_PID" "$tp"
    PORT[twemproxy]="$tp"
  fi

  run_one() { # run_one ROUND CLIENTS TARGET TEST
    local round="$1" clients="$2" target="$3" test="$4" args=() where=() t="$3"
    # The write-through rows of the sidecache targets go to that instance.
    if [[ "$test" == set-wt ]]; then
      case "$target" in sidecache) t=sidecache-wt ;; sidecache-unix) t=sidecache-wt-unix ;; baseline) return 0 ;; esac
    fi
    # A process that exited is reported once and its targets left out.
    local pid rc
    for pid in "${STARTED[@]}"; do
      if [[ -z "${DEAD[$pid]:-}" ]] && ! kill -0 "$pid" 2>/dev/null; then
        DEAD[$pid]=1
        DEAD[${WHO[$pid]}]=1
        wait "$pid" 2>/dev/null && rc=0 || rc=$?
        log "  WARNING: ${WHO[$pid]} (pid $pid) exited (status $rc) at rtt $rtt round $round; its runs are left out from here on (logs in $WORK)"
        echo "${WHO[$pid]} exited (status $rc) at rtt $rtt ms, round $round, before $target $test c=$clients" >>"$WORK/exits.txt"
      fi
    done
    [[ -n "${DEAD[relay]:-}" ]] && return 0
    [[ -n "${DEAD[${t%-unix}]:-}" ]] && return 0
    case "$t" in
      *-unix) where=(--socket "${SOCK[${t%-unix}]}") ;;
      *) where=(--addr "127.0.0.1:${PORT[$t]}") ;;
    esac
    local keyspace="$KEYSPACE"
    case "$test" in
      get) args=(--test get) ;;
      get-miss) args=(--test get); keyspace=100000000 ;;
      set | set-wt) args=(--test set) ;;
      incr) args=(--test incr) ;;
      mget) args=(--test mget) ;;
      get-p16) args=(--test get --pipeline 16) ;;
      set-p16) args=(--test set --pipeline 16) ;;
      *) die "unknown test $test" ;;
    esac
    local line base="${t%-unix}"
    local rpid="${RPID[${BEHIND[$base]:-}]:-}" ppid="${PPID_OF[$base]:-}"
    local c0=("$(ticks "$RELAY_PID")" "$(ticks "$ppid")" "$(ticks "$rpid")")
    if ! line="$(timeout 120 "${APP[@]}" "$LAT" "${where[@]}" --keyspace "$keyspace" --data-size "$DATA_SIZE" \
      --clients "$clients" --seconds "$SECS" --warmup "$WARMUP" "${args[@]}" 2>>"$WORK/latbench.log")"; then
      log "  warning: $target $test -c $clients failed; not counted"
      return 0
    fi
    local c1=("$(ticks "$RELAY_PID")" "$(ticks "$ppid")" "$(ticks "$rpid")")
    # The CPU per request spans latbench's warm-up too: it counts the
    # warm-up's requests at the measured rate.
    local n
    n="$(awk -F, -v w="$WARMUP" -v s="$SECS" '{ printf "%d", $5 * (s + w) / s }' <<<"$line")"
    echo "$rtt,$round,$clients,$target,$test,$line,$(per_req "${c0[0]}" "${c1[0]}" "$n"),$(per_req "${c0[1]}" "${c1[1]}" "$n"),$(per_req "${c0[2]}" "${c1[2]}" "$n")" >>"$RAW"
    printf '[net]   rtt %-4s c=%-3s %-15s %-9s %s\n' "$rtt" "$clients" "$target" "$test" "$line" >&2
  }
  for ((round = 1; round <= ROUNDS; round++)); do
    log "rtt $rtt ms, round $round/$ROUNDS"
    for mode in $MODES; do
      clients=1; [[ "$mode" == many ]] && clients="$MANY"
      for test in $TESTS; do
        for ((k = 0; k < ${#TARGET_LIST[@]}; k++)); do
          target="${TARGET_LIST[$(((k + round - 1) % ${#TARGET_LIST[@]}))]}"
          run_one "$round" "$clients" "$target" "$test"
          sleep "$PAUSE"
        done
      done
    done
  done
  # This round trip's relay and proxies go; the Redises stay.
  for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do stop_pids "${STARTED[i]}"; done
  keep=()
  for pid in "${PIDS[@]}"; do [[ " ${STARTED[*]} " == *" $pid "* ]] || keep+=("$pid"); done
  PIDS=("${keep[@]}")
  unset VIA PORT SOCK WHO DEAD PPID_OF
done

mkdir -p "$RESULTS_DIR"
cp "$RAW" "$RESULTS_DIR/$PREFIX-raw.csv"
[[ -f "$WORK/relay-selftest.md" ]] && cp "$WORK/relay-selftest.md" "$RESULTS_DIR/relay-selftest.md"
REV="$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
[[ -n "$(git -C "$REPO_ROOT" status --porcelain -- proxy pool l1 2>/dev/null || true)" ]] && REV+="-dirty"
HEADER="Run $(date -u +%Y-%m-%dT%H:%MZ), sidecache $REV, $(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), Redis $(redis-server --version | awk '{print $3}' | tr -d 'v='); \`bench/net.sh\` RTTS=\"$RTTS\" ROUNDS=$ROUNDS SECS=$SECS MANY=$MANY PIN=$PIN$([[ "$PIN" == 1 && "$REDIS_CPU" != "$REMOTE_CPU" ]] && echo " REDIS_CPU=$REDIS_CPU" || true) KEYSPACE=$KEYSPACE DATA_SIZE=$DATA_SIZE JITTER_US=$JITTER_US RELAY_UPSTREAM=$RELAY_UPSTREAM${BASELINE_BIN:+ BASELINE_BIN=$BASELINE_BIN}."
[[ -f "$WORK/exits.txt" ]] && { log "processes that exited during the run:"; cat "$WORK/exits.txt" >&2; }
python3 "$SCRIPT_DIR/net_report.py" "$RAW" "$RESULTS_DIR/$PREFIX.md" "$HEADER" "$MANY" \
  "$([[ "$CHART" == 1 ]] && echo "$RESULTS_DIR/$PREFIX.png")" "$WORK"
cat "$RESULTS_DIR/$PREFIX.md"
FAILED=0
