#!/usr/bin/env bash
# bench/cpu.sh — where the CPU goes, per request: the same redis-benchmark
# load against Redis directly and through sidecache, with the CPU time
# (user + system, from /proc/PID/stat and the client's rusage) of every
# process divided by the number of requests.
#
#   bench/cpu.sh [/path/to/sidecache]      (default: target/release/sidecache)
#
# Direct Redis and sidecache's upstream are two Redis servers with the same
# settings (no sidecache attached to the direct one, as in run.sh). On a
# machine whose cores client, proxy and Redis share, throughput is bounded by
# the sum of the per-request figures, so this shows what a ratio is made of.
#
# Knobs: TEST=set  P=1  N=200000  ROUNDS=3  CLIENTS=50  DATA_SIZE=64
#        KEYSPACE=100000 (TEST=get|mget: every key is written first and read
#        once through sidecache, so they read hits)  SIDECACHE_ARGS="" (extra flags, word-split; the
#        metrics endpoint is on, on a free port, unless they set --metrics-listen)
# Output, one line per run:
#   direct  rps …  client X  redis Y (kernel K)  µs/request
#   proxy   rps …  client X  sidecache Y (kernel K)  upstream Z  µs/request
# (K: the part of Y spent in the kernel: socket calls and wake-ups)
# Only processes it started are stopped (by pid).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache}"
[[ -x "$BIN" ]] || { echo "bench/cpu.sh: no sidecache binary at $BIN (cargo build --release)" >&2; exit 1; }
TEST="${TEST:-set}"; P="${P:-1}"; N="${N:-200000}"; ROUNDS="${ROUNDS:-3}"
CLIENTS="${CLIENTS:-50}"; DATA_SIZE="${DATA_SIZE:-64}"; KEYSPACE="${KEYSPACE:-100000}"
read -r -a EXTRA <<<"${SIDECACHE_ARGS:-}"
# The metrics endpoint is on by default; here on a free port.
[[ " ${SIDECACHE_ARGS:-} " == *" --metrics-listen "* ]] || EXTRA+=(--metrics-listen 127.0.0.1:0)
for t in redis-server redis-cli redis-benchmark python3; do
  command -v "$t" >/dev/null || { echo "bench/cpu.sh: $t not found" >&2; exit 1; }
done
WORK="$(mktemp -d)"; PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ready() {
  for _ in $(seq 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "bench/cpu.sh: nothing answers on port $1" >&2; exit 1
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Kernel-mode ticks only (socket calls, wake-ups): the rest of ticks is user space.
sys_ticks() { awk '{print $15}' "/proc/$1/stat"; }
HZ="$(getconf CLK_TCK)"
# run PORT -> "rps client_seconds"
run() {
  local out rps cpu
  out="$( { /usr/bin/env time -f 'CPU %U %S' timeout 300 redis-benchmark -p "$1" -c "$CLIENTS" \
    -d "$DATA_SIZE" -r "$KEYSPACE" -n "$N" -P "$P" -t "$TEST" -q --csv; } 2>&1 )"
  rps="$(echo "$out" | grep '^"' | tail -1 | cut -d, -f2 | tr -d '"')"
  cpu="$(echo "$out" | awk '/^CPU/ {print $2 + $3}')"
  echo "${rps:-0} ${cpu:-0}"
}
us() { python3 -c "print(f'{$1 / $N * 1e6:.2f}')"; }
[[ -x /usr/bin/time ]] || { echo "bench/cpu.sh: /usr/bin/time not found (apt-get install time)" >&2; exit 1; }
for round in $(seq "$ROUNDS"); do
  DP=$(port); UP=$(port); SP=$(port)
  mkdir -p "$WORK/$DP" "$WORK/$UP"
  redis-server --port "$DP" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/$DP" >/dev/null 2>&1 & dp=$!; PIDS+=("$dp")
  redis-server --port "$UP" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/$UP" >/dev/null 2>&1 & up=$!; PIDS+=("$up")
  ready "$DP"; ready "$UP"
  "$BIN" --listen "127.0.0.1:$SP" --upstream "redis://127.0.0.1:$UP" --log-level warn \
    "${EXTRA[@]}" >"$WORK/sidecache.log" 2>&1 & sp=$!; PIDS+=("$sp")
  ready "$SP"
  if [[ "$TEST" == get || "$TEST" == mget ]]; then
    # Reads of hits: every key of redis-benchmark's key space exists in
    # both Redises, and sidecache has read each once (a warm L1).
    value="$(head -c "$DATA_SIZE" /dev/zero | tr '\0' x)"
    for p in "$DP" "$UP"; do
      awk -v n="$KEYSPACE" -v v="$value" 'BEGIN { for (i = 0; i < n; i++) printf "SET key:%012d %s\r\n", i, v }' |
        redis-cli -p "$p" --pipe >/dev/null
    done
    awk -v n="$KEYSPACE" 'BEGIN { for (i = 0; i < n; i++) printf "GET key:%012d\r\n", i }' |
      redis-cli -p "$SP" --pipe >/dev/null
  fi
  d0=$(ticks "$dp"); ds0=$(sys_ticks "$dp")
  read -r rps cpu < <(run "$DP")
  d1=$(ticks "$dp"); ds1=$(sys_ticks "$dp")
  echo "round $round direct  rps $rps  client $(us "$cpu")  redis $(us "($d1 - $d0) / $HZ") (kernel $(us "($ds1 - $ds0) / $HZ"))  µs/request"
  sleep 0.5
  s0=$(ticks "$sp"); u0=$(ticks "$up"); ss0=$(sys_ticks "$sp")
  read -r rps cpu < <(run "$SP")
  # The write-behind queue drains before the upstream's share is read.
  for _ in $(seq 200); do
    depth="$(redis-cli -p "$SP" info writebehind | awk -F: '/^write_queue_depth:/ {print $2+0}')"
    [[ "$depth" == 0 ]] && break
    sleep 0.05
  done
  s1=$(ticks "$sp"); u1=$(ticks "$up"); ss1=$(sys_ticks "$sp")
  echo "round $round proxy   rps $rps  client $(us "$cpu")  sidecache $(us "($s1 - $s0) / $HZ") (kernel $(us "($ss1 - $ss0) / $HZ"))  upstream $(us "($u1 - $u0) / $HZ")  µs/request"
  kill "$sp" "$dp" "$up" 2>/dev/null || true
  wait "$sp" "$dp" "$up" 2>/dev/null || true
  PIDS=()
  sleep 0.5
done
