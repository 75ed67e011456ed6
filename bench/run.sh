#!/usr/bin/env bash
# bench/run.sh — side-by-side macro benchmark of sidecache.
#
# Starts, on free loopback ports, a throwaway Redis (standalone, or a 3-master
# cluster with TOPOLOGY=cluster) that redis-benchmark talks to directly and,
# for standalone only, twemproxy (nutcracker) in front of it; and sidecache in
# front of a second Redis (or cluster) of its own, with the same settings.
# Sidecache gets its own upstream because its client tracking makes Redis
# record every written key for the broadcast and makes sidecache read the
# invalidations: on this shared machine that would cost CPU during the direct
# and twemproxy runs and flatter sidecache's ratios. Then runs
# the same redis-benchmark load against each target, interleaving the targets
# inside every round (the starting target rotates per round so no target
# always runs first or last) and reports the median requests/second per
# (target, test, pipeline depth).
#
# Outputs (in $RESULTS_DIR, default bench/results/):
#   latest.csv      one row per (test, pipeline): median rps and p50 latency
#                   of every target, and the ratios to direct Redis
#   latest-raw.csv  every single redis-benchmark row of the run
#   latest.md       the markdown table (also printed) plus the run's settings
#   latest.png      throughput ratio to direct Redis per test, P1 and P16
#                   (cluster runs: cluster-latest.*; --quick: quick-latest.*)
#
# Knobs (environment variables):
#   N=100000          requests per redis-benchmark run
#   TESTS=get,get-miss,set,incr,lpush,hset,mget,mset,lrange_100
#                     tests, one at a time in this order: redis-benchmark -t
#                     names, plus get-miss (GET of keys that do not exist:
#                     -r 100000000, so every GET misses the L1 and goes
#                     upstream) and mget (MGET of 10 random keys)
#   QUICK=1 (or --quick) a short run (N=20000, ROUNDS=1, TESTS=get,set,mget):
#                     checks the set-up in well under 2 minutes
#   WARM=1            before each GET run, read every key once through a
#                     sidecache target (redis-cli --pipe): its L1 is warm
#   ROUNDS=3          rounds; the median over rounds is reported
#   PIPELINES="1 16"  pipeline depths (-P) to run
#   CLIENTS=50        parallel connections (-c)
#   DATA_SIZE=64      value size in bytes (-d)
#   KEYSPACE=100000   random key space (-r)
#   TOPOLOGY=standalone|cluster|both   cluster: 3 masters, redis vs sidecache
#                     only; both: standalone, then cluster
#   THREADS=          redis-benchmark --threads for every target. Default:
#                     none for standalone; 1 for cluster, because
#                     `redis-benchmark --cluster` otherwise starts one thread
#                     per master, the sidecache run must get the same client
#                     power, and threaded runs are timed in 250 ms steps (too
#                     coarse for short runs; raise N if you raise THREADS)
#   SKIP_SIDECACHE=1  leave sidecache out (e.g. while the binary isn't ready)
#   SKIP_TWEMPROXY=1  leave twemproxy out
#   SKIP_UNIX=1       leave out sidecache over its Unix socket
#   CHART=1           also draw latest.png (gnuplot; installed when missing)
#   SKIP_BUILD=1      don't run cargo build (use the existing binary)
#   SIDECACHE_BIN=... binary to run (default: <repo>/target/release/sidecache)
#   SIDECACHE_ARGS="..." extra flags for sidecache (word-split)
#   PAUSE=0.5         seconds to idle between runs (lets write-behind drain)
#   RUN_TIMEOUT=600   seconds before one redis-benchmark run is abandoned
#   RESULTS_DIR=...   where to write results (default: bench/results)
#   KEEP_WORKDIR=1    keep the temp dir with configs and logs
#
# Only processes this script started are stopped (by pid, on exit).
set -euo pipefail

for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "bench/run.sh: unknown argument '$arg' (only --quick; the rest are environment variables)" >&2; exit 2 ;;
  esac
done

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"

QUICK="${QUICK:-0}"
if [[ "$QUICK" == 1 ]]; then
  N="${N:-20000}"
  ROUNDS="${ROUNDS:-1}"
  TESTS="${TESTS:-get,set,mget}"
  PAUSE="${PAUSE:-0.3}"
fi
N="${N:-100000}"
TESTS="${TESTS:-get,get-miss,set,incr,lpush,hset,mget,mset,lrange_100}"
ROUNDS="${ROUNDS:-3}"
PIPELINES="${PIPELINES:-1 16}"
CLIENTS="${CLIENTS:-50}"
DATA_SIZE="${DATA_SIZE:-64}"
KEYSPACE="${KEYSPACE:-100000}"
TOPOLOGY="${TOPOLOGY:-standalone}"
SKIP_SIDECACHE="${SKIP_SIDECACHE:-0}"
SKIP_TWEMPROXY="${SKIP_TWEMPROXY:-0}"
SKIP_UNIX="${SKIP_UNIX:-0}"
CHART="${CHART:-1}"
SKIP_BUILD="${SKIP_BUILD:-0}"
SIDECACHE_ARGS="${SIDECACHE_ARGS:-}"
PAUSE="${PAUSE:-0.5}"
RUN_TIMEOUT="${RUN_TIMEOUT:-600}"
RESULTS_DIR="${RESULTS_DIR:-$SCRIPT_DIR/results}"
KEEP_WORKDIR="${KEEP_WORKDIR:-0}"
if [[ "$TOPOLOGY" == cluster ]]; then THREADS="${THREADS:-1}"; else THREADS="${THREADS:-}"; fi

log() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] error: %s\n' "$*" >&2; exit 1; }

case "$TOPOLOGY" in
  standalone | cluster) ;;
  both)
    # Both topologies, one after the other, in this one invocation.
    TOPOLOGY=standalone "$0" "$@" && TOPOLOGY=cluster SKIP_BUILD=1 "$0" "$@"
    exit $?
    ;;
  *) die "TOPOLOGY must be standalone, cluster or both, not '$TOPOLOGY'" ;;
esac
for v in N ROUNDS CLIENTS DATA_SIZE KEYSPACE RUN_TIMEOUT; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer, not '${!v}'"
done
read -r -a PIPELINE_LIST <<<"$PIPELINES"
((${#PIPELINE_LIST[@]} > 0)) || die "PIPELINES is empty"
for p in "${PIPELINE_LIST[@]}"; do
  [[ "$p" =~ ^[1-9][0-9]*$ ]] || die "PIPELINES entries must be positive integers, not '$p'"
done
read -r -a EXTRA_SIDECACHE_ARGS <<<"$SIDECACHE_ARGS"
BENCH_COMMON=(-c "$CLIENTS" -d "$DATA_SIZE" -r "$KEYSPACE" -n "$N" -q --csv)
if [[ -n "$THREADS" ]]; then
  [[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || die "THREADS must be a positive integer, not '$THREADS'"
  BENCH_COMMON+=(--threads "$THREADS")
fi

# --------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------
ensure_packages() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  if ! command -v redis-cli >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1; then
    missing+=(redis-tools)
  fi
  if [[ "$TOPOLOGY" == standalone && "$SKIP_TWEMPROXY" != 1 ]]; then
    command -v nutcracker >/dev/null 2>&1 || missing+=(nutcracker)
  fi
  if [[ "$CHART" == 1 ]]; then
    command -v gnuplot >/dev/null 2>&1 || missing+=(gnuplot-nox)
  fi
  ((${#missing[@]} == 0)) && return 0
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them"
  local sudo=()
  ((EUID == 0)) || sudo=(sudo)
  log "installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

SIDECACHE_BIN_DEFAULT="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache"
SIDECACHE_BIN="${SIDECACHE_BIN:-$SIDECACHE_BIN_DEFAULT}"

build_sidecache() {
  [[ "$SKIP_SIDECACHE" == 1 ]] && return 0
  if [[ "$SKIP_BUILD" != 1 ]]; then
    command -v cargo >/dev/null 2>&1 || die "cargo not found (install Rust, or set SIDECACHE_BIN and SKIP_BUILD=1)"
    log "building sidecache (release)"
    (cd "$REPO_ROOT" && cargo build --release -p sidecache)
  fi
  [[ -x "$SIDECACHE_BIN" ]] || die "sidecache binary not found at $SIDECACHE_BIN"
}

# --------------------------------------------------------------------------
# Processes: everything we start is recorded here and stopped on exit.
# --------------------------------------------------------------------------
PIDS=()
WORKDIR=""
FAILED=1

BENCH_PID=""
cleanup() {
  local pid i
  # A running redis-benchmark first (timeout passes the signal on to it).
  if [[ -n "$BENCH_PID" ]]; then
    kill -TERM "$BENCH_PID" 2>/dev/null || true
    wait "$BENCH_PID" 2>/dev/null || true
  fi
  # Stop in reverse start order: proxies before the Redis they talk to, so a
  # draining sidecache can still flush to its upstream.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    pid="${PIDS[i]}"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "pid $pid did not stop within 10s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  if [[ -n "$WORKDIR" && -d "$WORKDIR" ]]; then
    if [[ "$KEEP_WORKDIR" == 1 || "$FAILED" == 1 ]]; then
      log "configs and logs kept in $WORKDIR"
    else
      rm -rf -- "$WORKDIR"
    fi
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start_bg NAME CMD... — runs CMD in the background, logging to $WORKDIR/NAME.log.
# Sets LAST_PID.
LAST_PID=""
start_bg() {
  local name="$1"
  shift
  "$@" >"$WORKDIR/$name.log" 2>&1 &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}

# A port is free if nothing accepts a connection on it (and we haven't handed
# it out already). Cluster nodes also need port+10000 for the bus.
USED_PORTS=" "
port_in_use() {
  [[ "$USED_PORTS" == *" $1 "* ]] && return 0
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
# Sets PICKED (not echoed: a $(...) subshell would lose USED_PORTS, and a
# cluster node's bus port could then be handed out again).
PICKED=""
# Ports come from below the kernel's ephemeral range (a client connection's
# local port there, even one the probe cannot see, would make a listener's
# bind fail; a cluster node's bus port is its port + 10000).
EPHEMERAL_LOW="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
pick_port() { # pick_port [needs_bus]
  local needs_bus="${1:-0}" p tries top="$EPHEMERAL_LOW"
  [[ "$needs_bus" == 1 ]] && top=$((EPHEMERAL_LOW - 10000))
  ((top > 11000)) || die "the ephemeral port range starts too low ($EPHEMERAL_LOW) for free ports below it"
  for ((tries = 0; tries < 500; tries++)); do
    p=$((10000 + RANDOM % (top - 10000)))
    port_in_use "$p" && continue
    if [[ "$needs_bus" == 1 ]]; then
      port_in_use $((p + 10000)) && continue
      USED_PORTS+="$((p + 10000)) "
    fi
    USED_PORTS+="$p "
    PICKED="$p"
    return 0
  done
  die "no free loopback port found"
}

show_log() {
  local f="$WORKDIR/$1.log"
  [[ -f "$f" ]] && { log "last lines of $f:"; tail -n 20 "$f" >&2; }
  return 0
}

# wait_ready NAME PID PORT — until PING on PORT answers PONG (30s).
wait_ready() {
  local name="$1" pid="$2" port="$3"
  for _ in $(seq 1 300); do
    if ! kill -0 "$pid" 2>/dev/null; then
      show_log "$name"
      die "$name (pid $pid) exited during start-up"
    fi
    if [[ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null || true)" == PONG ]]; then
      return 0
    fi
    sleep 0.1
  done
  show_log "$name"
  die "$name did not answer PING on port $port within 30s"
}

start_redis() { # start_redis NAME PORT [extra args...]; sets LAST_PID
  local name="$1" port="$2"
  shift 2
  mkdir -p "$WORKDIR/$name"
  start_bg "$name" redis-server --bind 127.0.0.1 --port "$port" --dir "$WORKDIR/$name" \
    --save '' --appendonly no --daemonize no "$@"
  wait_ready "$name" "$LAST_PID" "$port"
}

# start_cluster NAME — a 3-master cluster, nodes NAME-0..2; sets CLUSTER_PORTS.
start_cluster() {
  local name="$1" i p ok nodes=()
  CLUSTER_PORTS=()
  for i in 0 1 2; do
    pick_port 1
    p="$PICKED"
    CLUSTER_PORTS+=("$p")
    start_redis "$name-$i" "$p" --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 5000
  done
  for p in "${CLUSTER_PORTS[@]}"; do nodes+=("127.0.0.1:$p"); done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes \
    >"$WORKDIR/$name-cluster-create.log" 2>&1 || { show_log "$name-cluster-create"; die "cluster create failed"; }
  for _ in $(seq 1 300); do
    ok=1
    for p in "${CLUSTER_PORTS[@]}"; do
      redis-cli -h 127.0.0.1 -p "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || ok=0
    done
    ((ok)) && break
    sleep 0.1
  done
  ((ok)) || die "cluster did not reach cluster_state:ok within 30s"
}

# --------------------------------------------------------------------------
# Set-up
# --------------------------------------------------------------------------
ensure_packages
build_sidecache

WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/sidecache-bench.XXXXXX")"
log "work dir $WORKDIR"

declare -A PORT=()   # target -> port redis-benchmark talks to
declare -A BENCH_EXTRA=() # target -> extra redis-benchmark flags
TARGETS=()

if [[ "$TOPOLOGY" == standalone ]]; then
  pick_port
  REDIS_PORT="$PICKED"
  start_redis redis "$REDIS_PORT"
  log "redis      127.0.0.1:$REDIS_PORT (pid $LAST_PID)"
  TARGETS+=(redis)
  PORT[redis]="$REDIS_PORT"
  BENCH_EXTRA[redis]=""
else
  start_cluster redis
  REDIS_PORT="${CLUSTER_PORTS[0]}"
  log "redis      cluster 127.0.0.1:${CLUSTER_PORTS[*]}"
  TARGETS+=(redis)
  PORT[redis]="$REDIS_PORT"
  BENCH_EXTRA[redis]="--cluster"
fi

declare -A SOCKET=() # target -> Unix socket redis-benchmark talks to instead
if [[ "$SKIP_SIDECACHE" != 1 ]]; then
  # sidecache's own upstream, like the direct one.
  if [[ "$TOPOLOGY" == standalone ]]; then
    pick_port
    UPSTREAM_PORT="$PICKED"
    start_redis upstream "$UPSTREAM_PORT"
    log "upstream   127.0.0.1:$UPSTREAM_PORT (pid $LAST_PID), sidecache's"
  else
    start_cluster upstream
    UPSTREAM_PORT="${CLUSTER_PORTS[0]}"
    log "upstream   cluster 127.0.0.1:${CLUSTER_PORTS[*]}, sidecache's"
  fi
  pick_port
  SC_PORT="$PICKED"
  pick_port
  SC_METRICS_PORT="$PICKED"
  SC_SOCKET="$WORKDIR/sidecache.sock"
  start_bg sidecache "$SIDECACHE_BIN" --listen "127.0.0.1:$SC_PORT" --unix-socket "$SC_SOCKET" \
    --metrics-listen "127.0.0.1:$SC_METRICS_PORT" \
    --upstream "redis://127.0.0.1:$UPSTREAM_PORT" --log-level warn "${EXTRA_SIDECACHE_ARGS[@]}"
  wait_ready sidecache "$LAST_PID" "$SC_PORT"
  log "sidecache  127.0.0.1:$SC_PORT and $SC_SOCKET (pid $LAST_PID)"
  TARGETS+=(sidecache)
  PORT[sidecache]="$SC_PORT"
  BENCH_EXTRA[sidecache]=""
  if [[ "$SKIP_UNIX" != 1 ]]; then
    # The same process, over its Unix socket.
    TARGETS+=(sidecache-unix)
    PORT[sidecache-unix]="$SC_PORT"
    SOCKET[sidecache-unix]="$SC_SOCKET"
    BENCH_EXTRA[sidecache-unix]=""
  fi
fi

if [[ "$TOPOLOGY" == standalone && "$SKIP_TWEMPROXY" != 1 ]]; then
  pick_port
  TW_PORT="$PICKED"
  pick_port
  TW_STATS_PORT="$PICKED"
  cat >"$WORKDIR/nutcracker.yml" <<EOF
sidecache_bench:
  listen: 127.0.0.1:$TW_PORT
  hash: fnv1a_64
  distribution: ketama
  redis: true
  server_connections: 1
  auto_eject_hosts: false
  preconnect: true
  servers:
    - 127.0.0.1:$REDIS_PORT:1
EOF
  nutcracker --test-conf --conf-file="$WORKDIR/nutcracker.yml" >"$WORKDIR/nutcracker-test.log" 2>&1 ||
    { show_log nutcracker-test; die "nutcracker rejected its config"; }
  start_bg nutcracker nutcracker --conf-file="$WORKDIR/nutcracker.yml" \
    --stats-addr=127.0.0.1 --stats-port="$TW_STATS_PORT"
  wait_ready nutcracker "$LAST_PID" "$TW_PORT"
  log "twemproxy  127.0.0.1:$TW_PORT (pid $LAST_PID)"
  TARGETS+=(twemproxy)
  PORT[twemproxy]="$TW_PORT"
  BENCH_EXTRA[twemproxy]=""
fi

# --------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------
RAW="$WORKDIR/raw.csv"
echo "round,target,pipeline,test,rps,avg_ms,min_ms,p50_ms,p95_ms,p99_ms,max_ms" >"$RAW"

WARM="${WARM:-1}"
WARM_FILE="$WORKDIR/warm.txt"
if [[ "$WARM" == 1 ]]; then
  # One GET of every key in the keyspace, in redis-benchmark's key format.
  awk -v n="$KEYSPACE" 'BEGIN { for (i = 0; i < n; i++) printf "GET key:%012d\r\n", i }' >"$WARM_FILE"
fi

# Every key of the keyspace exists before the first run, so GET and MGET
# measure hits (a GET of a missing key is a miss for a cache: it goes
# upstream every time) and every target reads the same data. Written to
# Redis directly (per key with redirects followed, for a cluster).
populate() { # populate PORT
  local value
  value="$(head -c "$DATA_SIZE" /dev/zero | tr '\0' x)"
  if [[ "$TOPOLOGY" == cluster ]]; then
    awk -v n="$KEYSPACE" -v v="$value" 'BEGIN { for (i = 0; i < n; i++) printf "SET key:%012d %s\n", i, v }' |
      timeout "$RUN_TIMEOUT" redis-cli -c -p "$1" >/dev/null
  else
    awk -v n="$KEYSPACE" -v v="$value" 'BEGIN { for (i = 0; i < n; i++) printf "SET key:%012d %s\r\n", i, v }' |
      timeout "$RUN_TIMEOUT" redis-cli -p "$1" --pipe >/dev/null
  fi
}
log "writing the $KEYSPACE keys of the keyspace to Redis"
populate "$REDIS_PORT" || die "could not write the keyspace to Redis"
if [[ "$SKIP_SIDECACHE" != 1 ]]; then
  populate "$UPSTREAM_PORT" || die "could not write the keyspace to sidecache's upstream"
fi

# warm TARGET: read every key once through a sidecache target before a GET
# run, so that the cache is measured warm (as its users run it).
warm() {
  [[ "$WARM" == 1 ]] || return 0
  # Only a cache has anything to warm (twemproxy also refuses the ECHO
  # that ends redis-cli --pipe).
  [[ "$1" == sidecache* ]] || return 0
  local where=(-h 127.0.0.1 -p "${PORT[$1]}")
  [[ -n "${SOCKET[$1]:-}" ]] && where=(-s "${SOCKET[$1]}")
  timeout "$RUN_TIMEOUT" redis-cli "${where[@]}" --pipe <"$WARM_FILE" >/dev/null 2>>"$WORKDIR/redis-benchmark.log" ||
    log "  WARNING: warm-up of $1 failed"
}

# test_args TEST -> the redis-benchmark arguments that run it (after the
# common ones; a later -r overrides the common one).
test_args() {
  local tag=""
  [[ "$TOPOLOGY" == cluster ]] && tag="{tag}"
  case "$1" in
    get-miss) echo "-t get -r 100000000" ;;
    mget)
      local keys=() i
      for i in 1 2 3 4 5 6 7 8 9 10; do keys+=("key:${tag}__rand_int__"); done
      echo "MGET ${keys[*]}"
      ;;
    *) echo "-t $1" ;;
  esac
}

run_one() { # run_one ROUND TARGET PIPELINE TEST
  local round="$1" target="$2" pipeline="$3" test="$4" out extra=() targs=() where
  out="$WORKDIR/run-$round-$target-P$pipeline-$test.csv"
  read -r -a extra <<<"${BENCH_EXTRA[$target]}"
  read -r -a targs <<<"$(test_args "$test")"
  where=(-h 127.0.0.1 -p "${PORT[$target]}")
  [[ -n "${SOCKET[$target]:-}" ]] && where=(-s "${SOCKET[$target]}")
  # In the background + wait, so that a signal to this script is handled at
  # once (bash runs traps only between foreground commands).
  timeout "$RUN_TIMEOUT" redis-benchmark "${where[@]}" "${extra[@]}" \
    "${BENCH_COMMON[@]}" -P "$pipeline" "${targs[@]}" >"$out" 2>>"$WORKDIR/redis-benchmark.log" &
  BENCH_PID=$!
  local rc=0
  wait "$BENCH_PID" || rc=$?
  BENCH_PID=""
  if ((rc != 0)); then
    log "  WARNING: redis-benchmark against $target -P $pipeline failed or timed out; run not counted"
    return 0
  fi
  # "SET","555555.56","1.240",... -> round,target,pipeline,TEST,555555.56,1.240,...
  # (the row is named by our test name: get-miss, mget, not by redis-benchmark's)
  awk -F'","|^"|"$' -v r="$round" -v t="$target" -v p="$pipeline" -v x="$test" \
    'NF >= 9 && $2 != "test" { printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", r, t, p, x, $3, $4, $5, $6, $7, $8, $9 }' \
    "$out" | head -n 1 | tee -a "$RAW" |
    awk -F, '{ printf "[bench]   %-14s -P %-3s %-10s %12.0f rps  p50 %s ms  p99 %s ms\n", $2, $3, $4, $5, $8, $10 }' >&2
}

IFS=, read -r -a TEST_LIST <<<"$TESTS"
log "targets: ${TARGETS[*]}; tests: $TESTS; warm L1 before GET: $WARM; pipelines: ${PIPELINE_LIST[*]}; rounds: $ROUNDS; n=$N c=$CLIENTS d=$DATA_SIZE r=$KEYSPACE threads=${THREADS:-1}"
for ((round = 1; round <= ROUNDS; round++)); do
  log "round $round/$ROUNDS"
  for pipeline in "${PIPELINE_LIST[@]}"; do
    for ((k = 0; k < ${#TARGETS[@]}; k++)); do
      target="${TARGETS[$(((k + round - 1) % ${#TARGETS[@]}))]}"
      # A proxy that died mid-run must not be reported as merely slow.
      for pid in "${PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null || die "a benchmarked process (pid $pid) has exited; see logs in $WORKDIR"
      done
      for test in "${TEST_LIST[@]}"; do
        [[ "$test" == get || "$test" == mget ]] && warm "$target"
        run_one "$round" "$target" "$pipeline" "$test"
        sleep "$PAUSE"
      done
    done
  done
done

# --------------------------------------------------------------------------
# Medians and report
# --------------------------------------------------------------------------
# median FIELD TARGET TEST PIPELINE [DECIMALS] -> median of that column over
# rounds, or "" when there is no value.
median() {
  local field="$1" target="$2" test="$3" pipeline="$4" decimals="${5:-2}"
  awk -F, -v f="$field" -v t="$target" -v x="$test" -v p="$pipeline" \
    'NR > 1 && $2 == t && $4 == x && $3 == p { print $f }' "$RAW" | sort -g |
    awk -v d="$decimals" '{ v[NR] = $1 } END {
      if (NR == 0) exit
      m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
      printf "%.*f\n", d, m }'
}
ratio() { # ratio A B -> A/B with 2 decimals, or ""
  [[ -n "$1" && -n "$2" ]] || return 0
  awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f\n", a / b }'
}
fmt_rps() { if [[ -n "$1" ]]; then printf '%.0f' "$1"; else printf 'n/a'; fi; }
fmt_ratio() { if [[ -n "$1" ]]; then printf '%s×' "$1"; else printf 'n/a'; fi; }

mkdir -p "$RESULTS_DIR"
PREFIX=""
[[ "$TOPOLOGY" == cluster ]] && PREFIX="cluster-"
# A quick run never replaces a full run's results.
[[ "$QUICK" == 1 ]] && PREFIX="quick-$PREFIX"
CSV="$WORKDIR/latest.csv"
MD="$WORKDIR/latest.md"
# Columns: per target rps, p50, p99; per proxy its ratio to direct Redis.
PROXIES=()
for t in "${TARGETS[@]}"; do [[ "$t" != redis ]] && PROXIES+=("$t"); done
{
  printf 'test,pipeline'
  for t in "${TARGETS[@]}"; do printf ',%s_rps,%s_p50_ms,%s_p99_ms' "$t" "$t" "$t"; done
  for t in "${PROXIES[@]}"; do printf ',%s_redis_ratio' "$t"; done
  echo
} >"$CSV"

GIT_REV="$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$REPO_ROOT" status --porcelain -- proxy pool l1 Cargo.toml Cargo.lock 2>/dev/null || true)" ]]; then
  GIT_REV+="-dirty"
fi
if [[ "$SKIP_SIDECACHE" == 1 ]]; then
  GIT_REV+=" (not benchmarked)"
elif [[ "$SKIP_BUILD" == 1 || "$SIDECACHE_BIN" != "$SIDECACHE_BIN_DEFAULT" ]]; then
  GIT_REV+=" (binary $SIDECACHE_BIN, not built by this run)"
fi
{
  echo "Run $(date -u +%Y-%m-%dT%H:%M:%SZ), sidecache $GIT_REV, topology $TOPOLOGY, $(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), Redis $(redis-server --version | awk '{print $3}' | tr -d 'v=')."
  echo "redis-benchmark ${BENCH_COMMON[*]} -P {${PIPELINE_LIST[*]}}, tests {$TESTS}; median of $ROUNDS rounds; warm-up read of every key before GET/MGET runs: $WARM. Latency: median over rounds of redis-benchmark's p50 / p99, ms."
  echo
  printf '| test | P |'
  for t in "${TARGETS[@]}"; do printf ' %s rps |' "$t"; done
  for t in "${PROXIES[@]}"; do printf ' %s/redis |' "$t"; done
  for t in "${TARGETS[@]}"; do printf ' %s p50/p99 |' "$t"; done
  echo
  printf '|---|---:|'
  for _ in "${TARGETS[@]}" "${PROXIES[@]}" "${TARGETS[@]}"; do printf -- '---:|'; done
  echo
} >"$MD"

mapfile -t TEST_NAMES < <(awk -F, 'NR > 1 && !seen[$4]++ { print $4 }' "$RAW")
((${#TEST_NAMES[@]} > 0)) || die "no benchmark run produced results; see $WORKDIR"
CHART_DATA="$WORKDIR/chart.dat"
: >"$CHART_DATA"
for test in "${TEST_NAMES[@]}"; do
  for pipeline in "${PIPELINE_LIST[@]}"; do
    r="$(median 5 redis "$test" "$pipeline")"
    row="$test,$pipeline"
    md="| $test | $pipeline |"
    lat=""
    for t in "${TARGETS[@]}"; do
      v="$(median 5 "$t" "$test" "$pipeline")"
      p50="$(median 8 "$t" "$test" "$pipeline" 3)"
      p99="$(median 10 "$t" "$test" "$pipeline" 3)"
      row+=",$v,$p50,$p99"
      md+=" $(fmt_rps "$v") |"
      lat+=" ${p50:-n/a} / ${p99:-n/a} |"
    done
    chart_row="$test-P$pipeline"
    for t in "${PROXIES[@]}"; do
      q="$(ratio "$(median 5 "$t" "$test" "$pipeline")" "$r")"
      row+=",$q"
      md+=" $(fmt_ratio "$q") |"
      chart_row+=" ${q:-0}"
    done
    echo "$row" >>"$CSV"
    echo "$md$lat" >>"$MD"
    echo "$chart_row" >>"$CHART_DATA"
  done
done

cp "$CSV" "$RESULTS_DIR/${PREFIX}latest.csv"
cp "$RAW" "$RESULTS_DIR/${PREFIX}latest-raw.csv"
cp "$MD" "$RESULTS_DIR/${PREFIX}latest.md"

if [[ "$CHART" == 1 ]] && command -v gnuplot >/dev/null 2>&1 && ((${#PROXIES[@]} > 0)); then
  PNG="$RESULTS_DIR/${PREFIX}latest.png"
  {
    echo "set terminal pngcairo size 1400,600 font ',10' noenhanced"
    echo "set output '$PNG'"
    echo "set title 'Throughput relative to direct Redis ($TOPOLOGY, -c $CLIENTS -d $DATA_SIZE, median of $ROUNDS rounds; 1.0 = direct Redis)'"
    echo "set style data histograms"
    echo "set style histogram clustered gap 1"
    echo "set style fill solid 0.8 border -1"
    echo "set boxwidth 0.9"
    echo "set yrange [0:*]"
    echo "set ylabel 'requests/s ÷ direct Redis requests/s'"
    echo "set xtics rotate by -40 scale 0"
    echo "set grid ytics"
    echo "set key top left"
    echo "set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lw 2 lc rgb 'black'"
    printf "plot "
    for ((k = 0; k < ${#PROXIES[@]}; k++)); do
      ((k > 0)) && printf ", "
      printf "'%s' using %d:xtic(1) title '%s'" "$CHART_DATA" $((k + 2)) "${PROXIES[k]}"
    done
    echo
  } >"$WORKDIR/chart.gp"
  if gnuplot "$WORKDIR/chart.gp" 2>"$WORKDIR/gnuplot.log"; then
    log "wrote $PNG"
  else
    show_log gnuplot
    log "  WARNING: chart not drawn"
  fi
fi
echo
cat "$MD"
echo
log "wrote $RESULTS_DIR/${PREFIX}latest.csv, ${PREFIX}latest-raw.csv, ${PREFIX}latest.md"
FAILED=0
