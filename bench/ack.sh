#!/usr/bin/env bash
# bench/ack.sh — write-behind acknowledgement latency against offered write
# rate, side by side with direct Redis (issue #57): an open-loop SET load
# (latbench --rate: Poisson arrivals, latency from each SET's intended send
# time) at fixed shares of the rate direct Redis sustains.
#
# One Redis for direct, one behind sidecache (default flags but the ports),
# on free loopback ports. First the saturation rate: a closed-loop SET load
# of CLIENTS connections straight at Redis (latbench, SECS seconds; the
# median of 3). Then for each share in SHARES (percent of that rate) and
# each target, the open-loop load at that rate for SECS seconds after
# WARMUP, the targets alternating, ROUNDS rounds; medians of p50, p99 and
# p99.9 (µs), and what sidecache's INFO says of the queue (writes that
# waited for room, the deepest queue seen in the polls).
#
# Knobs: CLIENTS=8 SECS=5 WARMUP=1 ROUNDS=3 SHARES="25 50 80 100"
#        KEYSPACE=100000 DATA_SIZE=64 SIDECACHE_BIN=target/release/sidecache
#        LATBENCH_BIN=target/release/latbench ARGS="" (extra sidecache flags)
# Output: a markdown table on stdout. Only processes it started are stopped
# (by pid).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release"
SC="${SIDECACHE_BIN:-$TARGET/sidecache}"; LB="${LATBENCH_BIN:-$TARGET/latbench}"
CLIENTS="${CLIENTS:-8}"; SECS="${SECS:-5}"; WARMUP="${WARMUP:-1}"; ROUNDS="${ROUNDS:-3}"
SHARES="${SHARES:-25 50 80 100}"; KEYSPACE="${KEYSPACE:-100000}"; DATA_SIZE="${DATA_SIZE:-64}"
for b in "$SC" "$LB"; do
  [[ -x "$b" ]] || { echo "no binary at $b (cargo build --release -p sidecache -p sidecache-bench)" >&2; exit 1; }
done
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sidecache-ack.XXXXXX")"; PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf -- "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
up() { for _ in $(seq 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "port $1 did not answer" >&2; exit 1; }
RD=$(port); RS=$(port); SP=$(port)
for p in "$RD" "$RS"; do
  mkdir -p "$WORK/$p"
  redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/$p" >/dev/null 2>&1 &
  PIDS+=($!)
  up "$p"
done
# shellcheck disable=SC2086 # ARGS is word-split on purpose
"$SC" --listen "127.0.0.1:$SP" --upstream "redis://127.0.0.1:$RS" --metrics-listen 127.0.0.1:0 \
  --log-level warn ${ARGS:-} >"$WORK/sidecache.log" 2>&1 &
PIDS+=($!)
up "$SP"
lb() { "$LB" --test set --clients "$CLIENTS" --keyspace "$KEYSPACE" --data-size "$DATA_SIZE" \
  --seconds "$SECS" --warmup "$WARMUP" "$@"; }
med() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
sat=""
for _ in 1 2 3; do sat+="$(lb --addr "127.0.0.1:$RD" | cut -d, -f1) "; done
SAT="$(echo "$sat" | med)"
echo "direct Redis sustains $SAT SET/s closed-loop ($CLIENTS connections, one SET per round trip)"
echo
echo "| offered SET/s | share of direct's | direct p50 / p99 / p99.9 µs | sidecache p50 / p99 / p99.9 µs | sidecache writes that waited for room | deepest queue seen |"
echo "|---:|---:|---|---|---:|---:|"
for share in $SHARES; do
  rate=$(awk -v s="$SAT" -v p="$share" 'BEGIN {printf "%.0f", s * p / 100}')
  declare -A P50=() P99=() P999=()
  waits0=$(redis-cli -p "$SP" info writebehind | awk -F: '/^write_backpressure_waits:/ {print $2+0}')
  deepest=0
  for r in $(seq "$ROUNDS"); do
    order=(direct sidecache); ((r % 2 == 0)) && order=(sidecache direct)
    for t in "${order[@]}"; do
      p=$RD; [[ "$t" == sidecache ]] && p=$SP
      if [[ "$t" == sidecache ]]; then
        ( while sleep 0.2; do redis-cli -p "$SP" info writebehind 2>/dev/null |
            awk -F: '/^write_queue_depth:/ {print $2+0}'; done ) >"$WORK/depth" &
        poller=$!
      fi
      line="$(lb --addr "127.0.0.1:$p" --rate "$rate")"
      if [[ "$t" == sidecache ]]; then
        kill "$poller" 2>/dev/null || true; wait "$poller" 2>/dev/null || true
        d=$(sort -g "$WORK/depth" | tail -1); d=${d:-0}; ((d > deepest)) && deepest=$d
      fi
      P50[$t]+="$(echo "$line" | cut -d, -f2) "; P99[$t]+="$(echo "$line" | cut -d, -f3) "
      P999[$t]+="$(echo "$line" | cut -d, -f8) "
      # Let the write-behind queue drain between runs.
      for _ in $(seq 50); do
        q=$(redis-cli -p "$SP" info writebehind | awk -F: '/^write_queue_depth:/ {print $2+0}')
        [[ "${q:-0}" == 0 ]] && break; sleep 0.1
      done
    done
  done
  waits1=$(redis-cli -p "$SP" info writebehind | awk -F: '/^write_backpressure_waits:/ {print $2+0}')
  printf '| %s | %s%% | %s / %s / %s | %s / %s / %s | %s | %s |\n' "$rate" "$share" \
    "$(echo "${P50[direct]}" | med)" "$(echo "${P99[direct]}" | med)" "$(echo "${P999[direct]}" | med)" \
    "$(echo "${P50[sidecache]}" | med)" "$(echo "${P99[sidecache]}" | med)" "$(echo "${P999[sidecache]}" | med)" \
    "$((waits1 - waits0))" "$deepest"
done
