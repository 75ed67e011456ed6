#!/usr/bin/env bash
# bench/churn.sh — sidecache's resident memory against --l1-max-bytes while
# the L1 churns: far more distinct keys are read than it holds, so it fills,
# evicts and refills for the whole run (issue #60's measurement).
#
# One redis-server on a free loopback port holds KEYS keys (key:%012d,
# written straight to it). sidecache starts with --l1-max-bytes BOUND; its
# idle RSS is read once it answers. Then redis-benchmark GETs uniformly
# random keys through it (-c 50 -P 16) for SECS seconds, and every SAMPLE
# seconds the script records sidecache's RSS (/proc/PID/status VmRSS), its
# own count (sidecache_l1_bytes as INFO l1_bytes) and entries.
#
# Knobs: KEYS=1000000  BOUND=64mb  SECS=120  SAMPLE=10  VALUES=64
#        (VALUES: 64, 1024, or mix: 80% 64 B, 15% 1 KB, 5% 16-64 KB)
#        SIDECACHE_BIN=target/release/sidecache  SIDECACHE_ARGS=""
# Prints one line per sample and a summary: idle RSS, peak and last RSS,
# and (RSS - idle) ÷ bound at the peak and at the end. Only processes it
# started are stopped (by pid).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
KEYS="${KEYS:-1000000}"; BOUND="${BOUND:-64mb}"; SECS="${SECS:-120}"
SAMPLE="${SAMPLE:-10}"; VALUES="${VALUES:-64}"
BIN="${SIDECACHE_BIN:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache}"
[[ -x "$BIN" ]] || { echo "no sidecache binary at $BIN (cargo build --release -p sidecache)" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sidecache-churn.XXXXXX")"; PIDS=()
cleanup() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[i]}" 2>/dev/null || true
    wait "${PIDS[i]}" 2>/dev/null || true
  done
  rm -rf -- "$WORK"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
field() { redis-cli -p "$1" info "$2" | tr -d '\r' | awk -F: -v f="$3" '$1 == f {print $2}'; }
RP=$(port); SP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
echo "[churn] writing $KEYS keys (values: $VALUES) to Redis" >&2
awk -v n="$KEYS" -v mode="$VALUES" 'BEGIN {
  srand(7)
  small = sprintf("%064d", 7); kb = sprintf("%01024d", 7)
  big = kb; while (length(big) < 65536) big = big big
  for (i = 0; i < n; i++) {
    if (mode == "mix") {
      r = rand()
      if (r < 0.80) v = small
      else if (r < 0.95) v = kb
      else v = substr(big, 1, 16384 + int(rand() * 49152))
    } else if (mode == 1024) v = kb
    else v = small
    printf "*3\r\n$3\r\nSET\r\n$16\r\nkey:%012d\r\n$%d\r\n%s\r\n", i, length(v), v
  }
}' | redis-cli -p "$RP" --pipe >/dev/null
"$BIN" --listen "127.0.0.1:$SP" --metrics-listen 127.0.0.1:0 --upstream "redis://127.0.0.1:$RP" \
  --log-level warn --l1-max-bytes "$BOUND" ${SIDECACHE_ARGS:-} >"$WORK/sc.log" 2>&1 &
SC=$!; PIDS+=($SC)
for _ in $(seq 100); do redis-cli -p "$SP" ping >/dev/null 2>&1 && break; sleep 0.1; done
rss() { awk '/^VmRSS/ {print $2 * 1024}' "/proc/$SC/status"; }
bound=$(field "$SP" l1 l1_max_bytes)
idle=$(rss)
echo "[churn] $(basename "$BIN"): bound $bound bytes, idle RSS $idle bytes; churning for ${SECS}s" >&2
(
  while :; do
    redis-benchmark -p "$SP" -c 50 -P 16 -n 2000000 -r "$KEYS" -t get -q >/dev/null 2>&1 || true
  done
) &
LOAD=$!; PIDS+=($LOAD)
peak=0; start=$(date +%s)
printf '%6s %14s %14s %10s %10s\n' secs rss l1_bytes entries ratio
while (($(date +%s) - start < SECS)); do
  sleep "$SAMPLE"
  r=$(rss); b=$(field "$SP" l1 l1_bytes); e=$(field "$SP" l1 l1_entries)
  ((r > peak)) && peak=$r
  printf '%6d %14d %14d %10d %10.3f\n' "$(($(date +%s) - start))" "$r" "$b" "$e" \
    "$(awk -v r="$r" -v i="$idle" -v b="$bound" 'BEGIN {print (r - i) / b}')"
done
kill "$LOAD" 2>/dev/null || true
last=$(rss); hits=$(field "$SP" l1 l1_hit_ratio)
awk -v i="$idle" -v p="$peak" -v l="$last" -v b="$bound" -v h="$hits" -v v="$VALUES" -v k="$KEYS" 'BEGIN {
  printf "keys %d, values %s, bound %.1f MiB: idle RSS %.1f MiB, peak %.1f MiB, last %.1f MiB; (RSS - idle) / bound: peak %.3f, last %.3f; hit ratio %s\n",
    k, v, b / 1048576, i / 1048576, p / 1048576, l / 1048576, (p - i) / b, (l - i) / b, h }'
