#!/usr/bin/env bash
# bench/callgrind.sh — instructions sidecache executes per request, counted
# by valgrind's callgrind (repeatable: they do not depend on the machine's
# load, unlike wall-clock figures on a shared machine).
#
# Starts a Redis and sidecache (`--threads 1`) under callgrind on free
# loopback ports, writes the keys, then for each test zeroes the counters
# (`callgrind_control -z`), runs `redis-benchmark -c CLIENTS -P P -n N -r
# KEYSPACE -t TEST`, and dumps them (`callgrind_control -d`): instructions
# of that load only, start-up excluded, divided by N. Everything sidecache
# does for a request is in the count: its connection task, the write-behind
# batcher and the upstream connection's tasks.
#
# Usage: bench/callgrind.sh [BINARY]   (default target/release/sidecache)
# Knobs: TESTS="get set"  N=20000  CLIENTS=1  P=1  KEYSPACE=1000  DATA_SIZE=64
#        (TESTS may also name hgetall, hget, smembers, zrange, strlen: reads
#        beyond GET on keys of their type, cached before the count)
#        SIDECACHE_ARGS=""  ANNOTATE=1 (keep callgrind_annotate's inclusive
#        listing per test in OUT)
#        REDIS_TOO=1: then the same loads straight at a second redis-server
#        under callgrind, for Redis's own instructions per request beside
#        sidecache's (user space only for both: the kernel's share, the
#        socket calls, is not counted by callgrind)
#        OUT=dir (keeps the callgrind files there)
#        READ_FIRST=0: the keys are written but not read through sidecache
#        before the loads (a write-only load: SET of keys nobody reads;
#        GET then misses)
#        TRACKING_CLIENT=1: a client that turned CLIENT TRACKING on (RESP3)
#        stays connected, idle, through the loads: what sidecache's own
#        bookkeeping for tracking clients costs the requests of others
# Only the processes it started are stopped (by pid).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
BIN="${1:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache}"
TESTS="${TESTS:-get set}"; N="${N:-20000}"; CLIENTS="${CLIENTS:-1}"; P="${P:-1}"
KEYSPACE="${KEYSPACE:-1000}"; DATA_SIZE="${DATA_SIZE:-64}"; ANNOTATE="${ANNOTATE:-1}"
command -v valgrind >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; }
command -v redis-benchmark >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; }
[[ -x "$BIN" ]] || { echo "no binary at $BIN (cargo build --release -p sidecache)" >&2; exit 1; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sidecache-callgrind.XXXXXX")"
OUT="${OUT:-$WORK}"; mkdir -p "$OUT"
PIDS=()
cleanup() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill -TERM "${PIDS[i]}" 2>/dev/null || true
    wait "${PIDS[i]}" 2>/dev/null || true
  done
  rm -rf -- "$WORK"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
RP=$(port); SP=$(port)
redis-server --bind 127.0.0.1 --port "$RP" --dir "$WORK" --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out.%p" \
  "$BIN" --threads 1 --listen "127.0.0.1:$SP" --upstream "redis://127.0.0.1:$RP" \
  --metrics-listen 127.0.0.1:0 --log-level warn ${SIDECACHE_ARGS:-} >"$WORK/sidecache.log" 2>&1 &
VPID=$!
PIDS+=("$VPID")
for _ in $(seq 600); do [[ "$(redis-cli -p "$SP" ping 2>/dev/null)" == PONG ]] && break; sleep 0.1; done
if [[ "${TRACKING_CLIENT:-0}" == 1 ]]; then
  python3 - "$SP" <<'PY' &
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"HELLO 3\r\nCLIENT TRACKING ON\r\n")
time.sleep(3600)
PY
  PIDS+=($!)
  sleep 0.5
fi
# Every key exists and is cached (a GET is a hit): written, then (under
# optin tracking, the default, a written value leaves the L1 once landed)
# read once.
# Every key of the keyspace (redis-benchmark's random draws left ~5% of
# them unwritten, so "GET hit" counted ~5% misses of absent keys).
populate() {
  awk -v n="$KEYSPACE" -v d="$DATA_SIZE" 'BEGIN { v = sprintf("%*s", d, ""); gsub(/ /, "x", v)
    for (i = 0; i < n; i++) printf "SET key:%012d %s\r\n", i, v }' |
    redis-cli -p "$1" --pipe >/dev/null
}
populate "$SP"
sleep 1
if [[ "${READ_FIRST:-1}" == 1 ]]; then
  awk -v n="$KEYSPACE" 'BEGIN { for (i = 0; i < n; i++) printf "GET key:%012d\r\n", i }' |
    redis-cli -p "$SP" --pipe >/dev/null
fi
# Reads beyond GET: the command redis-benchmark sends, and the keys of
# their type written and read once (cached) first.
read_cmd() {
  case "$1" in
    hgetall) echo "HGETALL hash:__rand_int__" ;;
    hget) echo "HGET hash:__rand_int__ f1" ;;
    smembers) echo "SMEMBERS set:__rand_int__" ;;
    zrange) echo "ZRANGE zset:__rand_int__ 0 -1 WITHSCORES" ;;
    strlen) echo "STRLEN key:__rand_int__" ;;
  esac
}
if [[ " $TESTS " =~ \ (hgetall|hget|smembers|zrange|strlen)\  ]]; then
  awk -v n="$KEYSPACE" 'BEGIN { for (i = 0; i < n; i++) {
      printf "HSET hash:%012d f1 v1 f2 v2 f3 v3 f4 v4 f5 v5\r\n", i
      printf "SADD set:%012d a b c d e\r\nZADD zset:%012d 1 a 2 b 3 c 4 d\r\n", i, i } }' |
    redis-cli -p "$SP" --pipe >/dev/null
  sleep 1
  awk -v n="$KEYSPACE" 'BEGIN { for (i = 0; i < n; i++) {
      printf "HGETALL hash:%012d\r\nHGET hash:%012d f1\r\nSMEMBERS set:%012d\r\n", i, i, i
      printf "ZRANGE zset:%012d 0 -1 WITHSCORES\r\nSTRLEN key:%012d\r\n", i, i } }' |
    redis-cli -p "$SP" --pipe >/dev/null
fi
echo "instructions per request in sidecache (callgrind), redis-benchmark -c $CLIENTS -P $P -n $N -r $KEYSPACE -d $DATA_SIZE, $(basename "$BIN") $("$BIN" --version 2>/dev/null | head -1)"
for t in $TESTS; do
  callgrind_control -z "$VPID" >/dev/null
  if [[ -n "$(read_cmd "$t")" ]]; then
    # shellcheck disable=SC2046 # the command's words
    redis-benchmark -p "$SP" -c "$CLIENTS" -P "$P" -n "$N" -r "$KEYSPACE" -q $(read_cmd "$t") >/dev/null
  else
    redis-benchmark -p "$SP" -c "$CLIENTS" -P "$P" -n "$N" -r "$KEYSPACE" -d "$DATA_SIZE" -t "$t" -q >/dev/null
  fi
  # The write-behind batcher's last batch is flushed and settled: a fixed
  # pause was not always enough under valgrind on a loaded machine (writes
  # that settled after the dump went uncounted: SET read ~10% low), so the
  # queue's depth is polled too (one INFO section, a few instructions per
  # request).
  sleep 1
  for _ in $(seq 100); do
    depth="$(redis-cli -p "$SP" info writebehind 2>/dev/null | awk -F: '/^write_queue_depth:/ {print $2+0}')"
    [[ "${depth:-0}" == 0 ]] && break
    sleep 0.2
  done
  before=$(ls "$OUT" | wc -l)
  callgrind_control -d "$t" "$VPID" >/dev/null
  for _ in $(seq 50); do (($(ls "$OUT" | wc -l) > before)) && break; sleep 0.1; done
  f="$(ls -t "$OUT"/callgrind.out.* | head -1)"
  ir="$(awk '/^(summary|totals):/ {print $2; exit}' "$f")"
  # Split: the client's connection task (parse, dispatch, reply: the
  # acknowledgement path) and the write-behind batcher task (inclusive).
  callgrind_annotate --inclusive=yes "$f" >"$OUT/annotate-$t.txt" 2>/dev/null || true
  part() { { grep -F "$1" "$OUT/annotate-$t.txt" || true; } | head -1 | awk -v n="$N" '{gsub(",", "", $1); printf "%.0f", $1 / n}'; }
  conn="$(part 'connection::serve::serve::{{closure}} [')"
  # (write_behind::batcher in builds before pool's tasks/ layer)
  batcher="$(part 'tasks::write_batcher::spawn::{{closure}} [')"
  [[ -n "$batcher" ]] || batcher="$(part 'write_behind::batcher::spawn::{{closure}} [')"
  printf '%-5s %12s instructions: %6.0f per request; connection task %6s, write-behind batcher %6s\n' \
    "$t" "$ir" "$(awk -v a="$ir" -v n="$N" 'BEGIN {print a / n}')" "${conn:-0}" "${batcher:-0}"
  [[ "$ANNOTATE" == 1 ]] || rm -f "$OUT/annotate-$t.txt"
done

# Redis's own count for the same loads, sent to it directly.
if [[ "${REDIS_TOO:-0}" == 1 ]]; then
  DP=$(port)
  valgrind --tool=callgrind --callgrind-out-file="$OUT/redis.callgrind.out.%p" \
    redis-server --bind 127.0.0.1 --port "$DP" --dir "$WORK" --save '' --appendonly no \
    >"$WORK/redis-direct.log" 2>&1 &
  RPID=$!
  PIDS+=("$RPID")
  for _ in $(seq 600); do [[ "$(redis-cli -p "$DP" ping 2>/dev/null)" == PONG ]] && break; sleep 0.1; done
  populate "$DP"
  echo "instructions per request in redis-server (callgrind), the same loads sent to it directly, $(redis-server --version | awk '{print $3}')"
  for t in $TESTS; do
    [[ -z "$(read_cmd "$t")" ]] || continue
    callgrind_control -z "$RPID" >/dev/null
    redis-benchmark -p "$DP" -c "$CLIENTS" -P "$P" -n "$N" -r "$KEYSPACE" -d "$DATA_SIZE" -t "$t" -q >/dev/null
    before=$(ls "$OUT" | wc -l)
    callgrind_control -d "redis-$t" "$RPID" >/dev/null
    for _ in $(seq 50); do (($(ls "$OUT" | wc -l) > before)) && break; sleep 0.1; done
    f="$(ls -t "$OUT"/redis.callgrind.out.* | head -1)"
    ir="$(awk '/^(summary|totals):/ {print $2; exit}' "$f")"
    printf '%-5s %12s instructions: %6.0f per request (redis-server)\n' \
      "$t" "$ir" "$(awk -v a="$ir" -v n="$N" 'BEGIN {print a / n}')"
  done
fi
