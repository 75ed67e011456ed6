#!/usr/bin/env bash
# bench/memory.sh — what the L1 costs in memory, and how hit throughput
# changes with the number of cached keys.
#
# 1. Bytes of sidecache RSS per cached entry (16-byte keys, 64-byte values)
#    beside Redis's own used_memory per key for the same data.
# 2. GET-hit throughput (redis-benchmark -t get -r SIZE, -P 1 and -P 16)
#    through sidecache and direct, at each size in SIZES.
#
# Keys are redis-benchmark's own (key:%012d, 16 bytes), written through
# sidecache (write-behind: every value is cached as it is acknowledged), so
# the same keys are then read by redis-benchmark.
#
# Knobs: SIZES="10000 1000000 5000000"  N=500000 (GETs per run)  CLIENTS=50
#        L1=3gb (--l1-max-bytes)  RESULTS_DIR=bench/results
# Output: $RESULTS_DIR/memory.md (also printed). Only processes it started
# are stopped (by pid).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
SIZES="${SIZES:-10000 1000000 5000000}"
N="${N:-500000}"
CLIENTS="${CLIENTS:-50}"
L1="${L1:-3gb}"
RESULTS_DIR="${RESULTS_DIR:-$SCRIPT_DIR/results}"
BIN="${SIDECACHE_BIN:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache}"
[[ "${SKIP_BUILD:-0}" == 1 ]] || (cd "$REPO_ROOT" && cargo build --release -p sidecache)
[[ -x "$BIN" ]] || { echo "no sidecache binary at $BIN" >&2; exit 1; }
for c in redis-server redis-cli redis-benchmark; do
  command -v "$c" >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null; break; }
done

WORK="$(mktemp -d)"; PIDS=()
cleanup() { for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; wait "${PIDS[i]}" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
RP=$(port); SP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$BIN" --listen "127.0.0.1:$SP" --metrics-listen 127.0.0.1:0 --upstream "redis://127.0.0.1:$RP" --log-level warn \
  --l1-max-bytes "$L1" --l1-ttl-cap 3600 --write-queue-max 1000000 >"$WORK/sc.log" 2>&1 & SC=$!; PIDS+=($SC)
for _ in $(seq 100); do redis-cli -p "$SP" ping >/dev/null 2>&1 && break; sleep 0.1; done

rss() { awk '/^VmRSS/ {print $2 * 1024}' "/proc/$SC/status"; }
field() { redis-cli -p "$1" info "$2" | tr -d '\r' | awk -F: -v f="$3" '$1 == f {print $2}'; }
drain() { while [[ "$(field "$SP" proxy write_queue_depth)" != 0 ]]; do sleep 0.2; done; }
# load FROM TO: SET key:%012d <64 bytes> for FROM <= i < TO, through sidecache.
load() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    v = sprintf("%064d", 7)
    for (i = a; i < b; i++) printf "*3\r\n$3\r\nSET\r\n$16\r\nkey:%012d\r\n$64\r\n%s\r\n", i, v
  }' | redis-cli -p "$SP" --pipe >/dev/null
  drain
  # Under optin tracking (the default) a written value leaves the L1 once
  # its write landed; one read of each key caches it again.
  awk -v a="$1" -v b="$2" 'BEGIN {
    for (i = a; i < b; i++) printf "*2\r\n$3\r\nGET\r\n$16\r\nkey:%012d\r\n", i
  }' | redis-cli -p "$SP" --pipe >/dev/null
}
bench() { # bench PORT SIZE P -> rps
  redis-benchmark -p "$1" -c "$CLIENTS" -n "$N" -r "$2" -P "$3" -t get -q --csv | tail -1 | cut -d, -f2 | tr -d '"'
}

rss0=$(rss); used0=$(field "$RP" memory used_memory)
{
  echo "Run $(date -u +%Y-%m-%dT%H:%M:%SZ), sidecache $(git -C "$REPO_ROOT" rev-parse --short HEAD), $(nproc) CPUs, Redis $(redis-server --version | awk '{print $3}' | tr -d 'v=')."
  echo "Keys key:%012d (16 bytes), values 64 bytes, written through sidecache; GET-hit runs: redis-benchmark -c $CLIENTS -n $N -t get -r SIZE."
  echo
  echo "| cached keys | L1 entries | sidecache RSS growth | bytes/entry (sidecache RSS) | Redis used_memory growth | bytes/key (Redis) | GET -P 1 sidecache / redis | GET -P 16 sidecache / redis |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
} >"$WORK/memory.md"
loaded=0
for size in $SIZES; do
  echo "[memory] loading up to $size keys" >&2
  load "$loaded" "$size"; loaded=$size
  entries=$(field "$SP" l1 l1_entries)
  rss1=$(rss); used1=$(field "$RP" memory used_memory)
  keys=$(redis-cli -p "$RP" dbsize)
  d_rss=$((rss1 - rss0)); d_used=$((used1 - used0))
  per_sc=$(awk -v d="$d_rss" -v n="$entries" 'BEGIN { printf "%.0f", d / n }')
  per_r=$(awk -v d="$d_used" -v n="$keys" 'BEGIN { printf "%.0f", d / n }')
  s1=$(bench "$SP" "$size" 1); r1=$(bench "$RP" "$size" 1)
  s16=$(bench "$SP" "$size" 16); r16=$(bench "$RP" "$size" 16)
  hits=$(field "$SP" proxy l1_hit_ratio)
  echo "[memory] $size: entries $entries, rss +$d_rss, redis +$d_used, P1 $s1/$r1, P16 $s16/$r16, hit ratio $hits" >&2
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
  echo "| $size | $entries | $((d_rss / 1048576)) MiB | $per_sc | $((d_used / 1048576)) MiB | $per_r | ${s1%.*} / ${r1%.*} ($(ratio "$s1" "$r1")×) | ${s16%.*} / ${r16%.*} ($(ratio "$s16" "$r16")×) |" >>"$WORK/memory.md"
done
mkdir -p "$RESULTS_DIR"
cp "$WORK/memory.md" "$RESULTS_DIR/memory.md"
cat "$WORK/memory.md"
