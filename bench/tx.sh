#!/usr/bin/env bash
# bench/tx.sh — pipelined transactions (MULTI; SET; INCR; EXEC) through
# sidecache beside direct Redis, rounds interleaved (the order alternates).
#
# Each target has a Redis of its own (same settings), so sidecache's
# invalidation channel does not cost the direct run anything. The load is
# bench's `txbench` (Rust, one thread): CLIENTS connections, each sending
# P transactions per round trip. As the reference for what forwarding costs
# on this machine, the same rounds also run `redis-benchmark -t incr` with
# 4 × P commands per round trip (as many forwarded commands per round trip
# as the transactions carry).
#
# Knobs: PIPELINES="1 16"  ROUNDS=5  N=100000 (transactions per run)
#        CLIENTS=50  SIDECACHE_ARGS=""  RESULTS_DIR=bench/results
# Output: $RESULTS_DIR/tx.md (also printed). Only processes it started are
# stopped (by pid).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
PIPELINES="${PIPELINES:-1 16}"; ROUNDS="${ROUNDS:-5}"; N="${N:-100000}"; CLIENTS="${CLIENTS:-50}"
RESULTS_DIR="${RESULTS_DIR:-$SCRIPT_DIR/results}"
TARGET="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release"
[[ "${SKIP_BUILD:-0}" == 1 ]] || (cd "$REPO_ROOT" && cargo build --release -p sidecache -p sidecache-bench)
BIN="${SIDECACHE_BIN:-$TARGET/sidecache}"; TX="$TARGET/txbench"
for c in redis-server redis-cli; do
  command -v "$c" >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null; break; }
done
WORK="$(mktemp -d)"; PIDS=()
cleanup() { for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; wait "${PIDS[i]}" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
RD=$(port); RS=$(port); SP=$(port)
for p in "$RD" "$RS"; do
  mkdir -p "$WORK/$p"
  redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/$p" >/dev/null 2>&1 & PIDS+=($!)
done
for p in "$RD" "$RS"; do for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done; done
"$BIN" --listen "127.0.0.1:$SP" --upstream "redis://127.0.0.1:$RS" --log-level warn --metrics-listen 127.0.0.1:0 \
  ${SIDECACHE_ARGS:-} >"$WORK/sc.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$SP" ping >/dev/null 2>&1 && break; sleep 0.1; done
run() { "$TX" --addr "127.0.0.1:$1" --clients "$CLIENTS" --pipeline "$2" --requests "$N"; }
incr() { redis-benchmark -p "$1" -c "$CLIENTS" -n $(( N * 4 )) -P $(( $2 * 4 )) -t incr -q --csv | tail -1 | cut -d, -f2 | tr -d '"'; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
declare -A RES
for p in $PIPELINES; do
  for r in $(seq "$ROUNDS"); do
    order="direct sidecache"; (( r % 2 == 0 )) && order="sidecache direct"
    for t in $order; do
      port=$RD; [[ $t == sidecache ]] && port=$SP
      line=$(run "$port" "$p")
      echo "P=$p round $r $t: $line (tx/s,p50 ms,p99 ms)"
      RES[$t,$p]+="${line%%,*}"$'\n'
      i=$(incr "$port" "$p")
      echo "P=$p round $r $t: INCR -P $(( p * 4 )) $i/s"
      RES[incr$t,$p]+="$i"$'\n'
    done
  done
done
out="$RESULTS_DIR/tx.md"; mkdir -p "$RESULTS_DIR"
{
  echo "# Transactions: MULTI; SET; INCR; EXEC ($(date -u +%Y-%m-%d), $(git -C "$REPO_ROOT" rev-parse --short HEAD))"
  echo
  echo "\`bench/tx.sh\`: $CLIENTS connections, $N transactions per run, median of $ROUNDS interleaved rounds, this machine ($(nproc) CPUs, client, Redis and sidecache on it)."
  echo
  echo "| pipeline | direct Redis (tx/s) | sidecache (tx/s) | ratio | reference: INCR at 4× the pipeline, direct / sidecache (req/s) | reference ratio |"
  echo "|---|---|---|---|---|---|"
  for p in $PIPELINES; do
    d=$(printf '%s' "${RES[direct,$p]}" | median); s=$(printf '%s' "${RES[sidecache,$p]}" | median)
    di=$(printf '%s' "${RES[incrdirect,$p]}" | median); si=$(printf '%s' "${RES[incrsidecache,$p]}" | median)
    echo "| -P $p | $d | $s | $(awk -v a="$s" -v b="$d" 'BEGIN {printf "%.2f", a / b}')× | $di / $si | $(awk -v a="$si" -v b="$di" 'BEGIN {printf "%.2f", a / b}')× |"
  done
} | tee "$out"
