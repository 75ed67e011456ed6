#!/usr/bin/env bash
# bench/metrics-overhead.sh — what per-command metrics cost on the hottest
# path: pipelined GET hits answered from the L1.
#
# One throwaway Redis; every key of the benchmark's key space is SET there
# directly, then read once through each sidecache (so every benchmark GET is
# an L1 hit). Targets, all in front of the same Redis:
#   on    sidecache --metrics-listen 127.0.0.1:PORT   (the default: metrics on)
#   off   sidecache --metrics-listen off              (endpoint and per-command
#                                                      tallying off)
#   base  $BASE_BIN, if given: a build without the metrics code at all
#         (e.g. of the commit before it), to see "compiled out"
# Rounds are interleaved (the starting target rotates each round); the
# median requests/second per target is reported with every round's figure.
#
#   redis-benchmark -p PORT -t get -c 50 -P 16 -n 1000000 -r 100000 -d 64 -q --csv
#
# Knobs: ROUNDS=5 N=1000000 CLIENTS=50 PIPELINE=16 KEYSPACE=100000
#        DATA_SIZE=64 SKIP_BUILD=1 SIDECACHE_BIN=... BASE_BIN=...
#        RESULT=bench/results/metrics-overhead.md
# Only processes this script started are stopped (by pid, on exit).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
ROUNDS="${ROUNDS:-5}"
N="${N:-1000000}"
CLIENTS="${CLIENTS:-50}"
PIPELINE="${PIPELINE:-16}"
KEYSPACE="${KEYSPACE:-100000}"
DATA_SIZE="${DATA_SIZE:-64}"
SIDECACHE_BIN="${SIDECACHE_BIN:-$REPO_ROOT/target/release/sidecache}"
BASE_BIN="${BASE_BIN:-}"
RESULT="${RESULT:-$SCRIPT_DIR/results/metrics-overhead.md}"

log() { printf '[metrics-overhead] %s\n' "$*" >&2; }

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  (cd "$REPO_ROOT" && cargo build --release -p sidecache --locked)
fi

WORK="$(mktemp -d /tmp/sidecache-metrics-overhead.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_port() {
  for _ in $(seq 200); do
    redis-cli -p "$1" ping >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  log "port $1 did not answer"; exit 1
}

REDIS_PORT="$(free_port)"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
wait_port "$REDIS_PORT"

# Every key redis-benchmark -r KEYSPACE can ask for: key:%012d.
python3 - "$KEYSPACE" "$DATA_SIZE" >"$WORK/set.txt" <<'EOF'
import sys
n, size = int(sys.argv[1]), int(sys.argv[2])
v = "x" * size
out = sys.stdout
for i in range(n):
    k = "key:%012d" % i
    out.write("*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(k), k, size, v))
EOF
python3 - "$KEYSPACE" >"$WORK/get.txt" <<'EOF'
import sys
for i in range(int(sys.argv[1])):
    k = "key:%012d" % i
    sys.stdout.write("*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
EOF
redis-cli -p "$REDIS_PORT" --pipe <"$WORK/set.txt" >/dev/null

declare -A PORT
start_target() { # name binary args...
  local name="$1" bin="$2"; shift 2
  local port; port="$(free_port)"
  "$bin" --listen "127.0.0.1:$port" --upstream "redis://127.0.0.1:$REDIS_PORT" \
    --log-level warn "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  wait_port "$port"
  redis-cli -p "$port" --pipe <"$WORK/get.txt" >/dev/null
  PORT[$name]="$port"
}

TARGETS=(on off)
start_target on "$SIDECACHE_BIN" --metrics-listen "127.0.0.1:$(free_port)"
start_target off "$SIDECACHE_BIN" --metrics-listen off
if [[ -n "$BASE_BIN" ]]; then
  TARGETS+=(base)
  start_target base "$BASE_BIN"
fi

declare -A RPS
for ((r = 0; r < ROUNDS; r++)); do
  n="${#TARGETS[@]}"
  for ((i = 0; i < n; i++)); do
    t="${TARGETS[$(((i + r) % n))]}"
    line="$(redis-benchmark -p "${PORT[$t]}" -t get -c "$CLIENTS" -P "$PIPELINE" \
      -n "$N" -r "$KEYSPACE" -d "$DATA_SIZE" -q --csv | grep '^"GET"')"
    rps="$(echo "$line" | cut -d, -f2 | tr -d '"')"
    RPS[$t]="${RPS[$t]:-} $rps"
    log "round $((r + 1)) $t: $rps rps"
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}'; }

mkdir -p "$(dirname "$RESULT")"
{
  echo "# Metrics overhead: pipelined GET hits"
  echo
  echo "\`bench/metrics-overhead.sh\` ($(date -u +%Y-%m-%d), $(nproc) cores, $ROUNDS interleaved rounds):"
  echo
  echo "    redis-benchmark -p PORT -t get -c $CLIENTS -P $PIPELINE -n $N -r $KEYSPACE -d $DATA_SIZE -q --csv"
  echo
  echo "Every key was read once through each target first (L1 hits only; misses per target below)."
  echo
  echo "| target | median rps | vs off | rounds (rps) | L1 misses during the run |"
  echo "|---|---|---|---|---|"
  off_med="$(echo "${RPS[off]}" | median)"
  for t in "${TARGETS[@]}"; do
    med="$(echo "${RPS[$t]}" | median)"
    ratio="$(awk -v a="$med" -v b="$off_med" 'BEGIN {printf "%.3f", a / b}')"
    misses="$(redis-cli -p "${PORT[$t]}" info | tr -d '\r' | awk -F: '/^l1_misses:/ {print $2}')"
    echo "| $t | $med | ${ratio}x | ${RPS[$t]# } | $((misses - KEYSPACE)) |"
  done
  echo
  echo "on: \`--metrics-listen 127.0.0.1:PORT\` (default; per-command counters and latency histograms kept);"
  echo "off: \`--metrics-listen off\`; base: \`${BASE_BIN:-not run}\`."
} | tee "$RESULT"
