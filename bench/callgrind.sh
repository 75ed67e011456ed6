#!/usr/bin/env bash
# Instructions per request in the sidecache process, counted by
# valgrind --tool=callgrind (repeatable whatever else the machine does).
#
#   bench/callgrind.sh BIN TEST [TEST ...]     TEST: get | set (redis-benchmark -t)
#   e.g. bench/callgrind.sh target/release/sidecache get set
#
# One redis-server and one sidecache (--threads 1, metrics off) under
# callgrind on free loopback ports; the key space (-r 1000) is written and
# read once, the counters are zeroed (callgrind_control -z), then N
# requests (default 200000) of `redis-benchmark -c 50 -P 16 -r 1000 -t TEST`
# are counted (callgrind_control -d). Prints: TEST total-instructions
# instructions-per-request. Needs valgrind, redis-server, redis-benchmark.
set -euo pipefail
BIN=$1; shift
N=${N:-200000}
D=$(mktemp -d)
RP="" VP=""
cleanup() {
  [ -n "$VP" ] && kill -TERM "$VP" 2>/dev/null && wait "$VP" 2>/dev/null || true
  [ -f "$D/r.pid" ] && kill "$(cat "$D/r.pid")" 2>/dev/null || true
  rm -rf "$D"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RP=$(free_port); SP=$(free_port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --pidfile "$D/r.pid" --dir "$D" >/dev/null
for _ in $(seq 50); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
valgrind --tool=callgrind --callgrind-out-file="$D/cg.%p" "$BIN" --listen "127.0.0.1:$SP" \
  --upstream "redis://127.0.0.1:$RP" --threads 1 --metrics-listen off --log-level warn 2>"$D/vg.log" &
VP=$!
for _ in $(seq 150); do redis-cli -p "$SP" ping >/dev/null 2>&1 && break; sleep 0.2; done
redis-benchmark -p "$SP" -c 50 -n 20000 -P 16 -r 1000 -q -t set >/dev/null
redis-benchmark -p "$SP" -c 50 -n 20000 -P 16 -r 1000 -q -t get >/dev/null
for t in "$@"; do
  sleep 1
  callgrind_control -z "$VP" >/dev/null
  redis-benchmark -p "$SP" -c 50 -n "$N" -P 16 -r 1000 -q -t "$t" >/dev/null
  callgrind_control -d "$VP" >/dev/null
  sleep 1
  f=$(ls -t "$D"/cg."$VP"* | head -1)
  ir=$(grep -E "^(summary|totals):" "$f" | head -1 | awk '{print $2}')
  echo "$t $ir $((ir / N))"
done
