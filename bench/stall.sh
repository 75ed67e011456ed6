#!/usr/bin/env bash
# bench/stall.sh — sidecache's memory while its upstream is stalled.
#
# Redis is stopped (SIGSTOP) while redis-benchmark writes 4 KB values
# through sidecache (SET, random keys, pipelined). Writes are acknowledged
# until the write-behind queue is full in bytes (--write-queue-max-bytes),
# then wait and are refused; the L1 holds at most --l1-max-bytes. Reports
# sidecache's peak RSS (VmHWM) against L1 max + queue max, then resumes Redis
# and waits for the queue to drain.
#
# Knobs: L1=64mb  QUEUE=64mb (--write-queue-max-bytes)  SECS=6 (stall)
#        CLIENTS=8  P=16  VALUE=4096  RESULTS_DIR=bench/results
# Output: $RESULTS_DIR/stall.md (also printed). Only processes it started
# are stopped (by pid).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
L1="${L1:-64mb}"; QUEUE="${QUEUE:-64mb}"; SECS="${SECS:-6}"
CLIENTS="${CLIENTS:-8}"; P="${P:-16}"; VALUE="${VALUE:-4096}"
RESULTS_DIR="${RESULTS_DIR:-$SCRIPT_DIR/results}"
BIN="${SIDECACHE_BIN:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache}"
[[ "${SKIP_BUILD:-0}" == 1 ]] || (cd "$REPO_ROOT" && cargo build --release -p sidecache)
[[ -x "$BIN" ]] || { echo "no sidecache binary at $BIN" >&2; exit 1; }
for c in redis-server redis-cli redis-benchmark; do
  command -v "$c" >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null; break; }
done

WORK="$(mktemp -d)"; PIDS=()
cleanup() {
  [[ -n "${RS:-}" ]] && kill -CONT "$RS" 2>/dev/null || true
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; wait "${PIDS[i]}" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
RP=$(port); SP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 & RS=$!; PIDS+=($RS)
for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$BIN" --listen "127.0.0.1:$SP" --metrics-listen 127.0.0.1:0 --upstream "redis://127.0.0.1:$RP" --log-level error \
  --l1-max-bytes "$L1" --write-queue-max-bytes "$QUEUE" --write-queue-timeout 1 >"$WORK/sc.log" 2>&1 & SC=$!; PIDS+=($SC)
for _ in $(seq 100); do redis-cli -p "$SP" ping >/dev/null 2>&1 && break; sleep 0.1; done
field() { redis-cli -p "$SP" info writebehind | tr -d '\r' | awk -F: -v f="$1" '$1 == f {print $2}'; }
mb() { awk -v b="$1" 'BEGIN {printf "%.0f", b / 1048576}'; }
kb() { awk -v f="$1" '$1 == f":" {print $2 * 1024}' "/proc/$SC/status"; }
tobytes() { # 64mb -> bytes, as sidecache reads sizes
  python3 -c 'import re,sys;m=re.fullmatch(r"(\d+)(b|k|kb|m|mb|g|gb)?",sys.argv[1].lower());u={"":1,"b":1,"k":1e3,"kb":1024,"m":1e6,"mb":1<<20,"g":1e9,"gb":1<<30}[m.group(2) or ""];print(int(int(m.group(1))*u))' "$1"; }

start=$(kb VmRSS)
# The load starts against a running Redis (redis-benchmark asks the server
# for its configuration first), then Redis stops under it.
redis-benchmark -p "$SP" -c "$CLIENTS" -P "$P" -t set -d "$VALUE" -r 10000000 -n 100000000 -q >"$WORK/bench.log" 2>&1 & RB=$!; PIDS+=($RB)
sleep 1
kill -STOP "$RS"
before=$(field writes_queued)
sleep "$SECS"
peak=$(kb VmHWM); queued=$(field write_queue_bytes); refused=$(field writes_refused); acked=$(( $(field writes_queued) - before ))
kill "$RB" 2>/dev/null || true; wait "$RB" 2>/dev/null || true
kill -CONT "$RS"
while [[ "$(field write_queue_depth)" != 0 ]]; do sleep 0.2; done
bound=$(( $(tobytes "$L1") + $(tobytes "$QUEUE") ))
out="$RESULTS_DIR/stall.md"
mkdir -p "$RESULTS_DIR"
{
  echo "# Memory with a stalled upstream ($(date -u +%Y-%m-%d), $(git -C "$REPO_ROOT" rev-parse --short HEAD))"
  echo
  echo "Redis stopped for ${SECS} s (after 1 s of load) under \`redis-benchmark -c $CLIENTS -P $P -t set -d $VALUE -r 10000000\` through sidecache"
  echo "(\`--l1-max-bytes $L1 --write-queue-max-bytes $QUEUE --write-queue-timeout 1\`, release build). \`bench/stall.sh\`."
  echo
  echo "| RSS at start | peak RSS | L1 max + queue max | peak − start − (L1 + queue) | queue bytes at the end | writes acknowledged while stalled | writes refused |"
  echo "|---|---|---|---|---|---|---|"
  echo "| $(mb "$start") MB | $(mb "$peak") MB | $(mb "$bound") MB | $(mb $(( peak - start - bound ))) MB | $(mb "$queued") MB | $acked | $refused |"
} | tee "$out"
