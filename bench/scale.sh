#!/usr/bin/env bash
# bench/scale.sh — what coherence costs Redis as sidecaches are added, per
# tracking mode (issue 18).
#
#   bench/scale.sh scale     [/path/to/sidecache]   one Redis, 0/1/10/50 sidecache processes
#   bench/scale.sh sustained [/path/to/sidecache]   600,000 SETs -P 16 through one sidecache vs direct
#   bench/scale.sh misses    [/path/to/sidecache]   L1 fills at 50 clients, 100k distinct keys, per mode
#   bench/scale.sh memory    [/path/to/sidecache]   Redis memory per tracked key (optin)
#   (default binary: target/release/sidecache)
#
# scale: one redis-server; COUNTS real sidecache processes attached (small
#   L1, one thread, metrics off, each waiting until its channel is up, each
#   having cached CACHED keys of its own); then a direct write load on Redis
#   (redis-benchmark -P $P -c $CLIENTS -n $N -r $KEYSPACE -d $DATA_SIZE -t set),
#   keys none of them cached. Per SET: Redis CPU (utime+stime from
#   /proc/PID/stat), bytes Redis sent to anyone but the benchmark
#   (INFO total_net_output_bytes less the 5-byte +OK per SET) and bytes the
#   sidecaches' connections to Redis received (`ss -ti` bytes_received of
#   their sockets, summed).
#   Knobs: MODES="bcast optin" COUNTS="0 1 10 50" N=400000 P=16 CLIENTS=50
#          KEYSPACE=100000 DATA_SIZE=64 CACHED=100 ROUNDS=1
#          CACHED_WRITTEN=0: each sidecache also reads that many of the keys
#          the load then writes (key:000000000000 …), so part of the writes
#          hit cached keys.
# sustained: 600,000 SETs at -P 16 (-c 50, -r 100000, -d 64): directly,
#   then through one sidecache per mode (with the default --write-queue-max
#   100000 the queue fills: beyond the bound), with Redis's CPU per SET in
#   each case (the mode's own-write cost is their ratio). Knobs: MODES="optin bcast off"
#   N=600000 P=16 ROUNDS=3 SIDECACHE_ARGS="" (extra flags).
# misses: L1 fills at 50 clients over distinct keys, per mode: KEYSPACE
#   keys written directly (redis-benchmark -t set -r KEYSPACE, 3 x KEYSPACE
#   SETs, so nearly all exist), then a fresh sidecache per mode reads
#   N=KEYSPACE GETs at -P 1 -c 50 -r KEYSPACE (about 63% first reads:
#   misses) and again (mostly hits); direct Redis alongside. Optin's fills
#   all travel on the master's one tracking connection, bcast's on the
#   client pool. Knobs: MODES="optin bcast" KEYSPACE=100000 ROUNDS=3
#   MISS_P=1 (the pipeline depth of the GETs).
# memory: Redis used_memory after populating KEYS_LIST keys (DEBUG
#   POPULATE: key:0 … with DATA_SIZE-byte values), after one sidecache read
#   them all (optin: each one is tracked; its L1 is 1 MB, which does not
#   matter to Redis), after a second one read them too; per key.
#   Knobs: KEYS_LIST="10000 1000000".
# Only processes it started are stopped (by pid).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PART="${1:-scale}"
BIN="${2:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache}"
[[ -x "$BIN" ]] || { echo "bench/scale.sh: no sidecache binary at $BIN (cargo build --release)" >&2; exit 1; }
for t in redis-server redis-cli redis-benchmark python3; do
  command -v "$t" >/dev/null || { echo "bench/scale.sh: $t not found" >&2; exit 1; }
done
N="${N:-}"; P="${P:-16}"; CLIENTS="${CLIENTS:-50}"; KEYSPACE="${KEYSPACE:-100000}"
DATA_SIZE="${DATA_SIZE:-64}"; ROUNDS="${ROUNDS:-}"; CACHED="${CACHED:-100}"
read -r -a EXTRA <<<"${SIDECACHE_ARGS:-}"
WORK="$(mktemp -d)"; PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ready() {
  for _ in $(seq 300); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "bench/scale.sh: nothing answers on port $1" >&2; exit 1
}
channel_up() {
  for _ in $(seq 300); do
    redis-cli -p "$1" info coherence 2>/dev/null | tr -d '\r' | grep -q '^tracking_channels_up:1$' && return 0
    sleep 0.1
  done
  echo "bench/scale.sh: sidecache on $1: channel never up" >&2; exit 1
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Bytes received by sidecache processes' sockets connected to port $1.
received() {
  ss -tinpH state established "( dport = :$1 )" 2>/dev/null | python3 -c '
import re, sys
total, owner = 0, False
for line in sys.stdin:
    if "users:" in line:
        owner = "sidecache" in line
    m = re.search(r"bytes_received:(\d+)", line)
    if m and owner:
        total += int(m.group(1))
print(total)'
}
netout() { redis-cli -p "$1" info stats | tr -d '\r' | awk -F: '/^total_net_output_bytes:/ {print $2}'; }
used() { redis-cli -p "$1" info memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}'; }
HZ="$(getconf CLK_TCK)"
start_redis() { # -> sets RP, RPID
  RP=$(port); mkdir -p "$WORK/$RP"
  redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/$RP" "$@" >/dev/null 2>&1 &
  RPID=$!; PIDS+=("$RPID"); ready "$RP"
}
# start_sidecaches COUNT MODE -> SPORTS[], SPIDS[]
start_sidecaches() {
  SPORTS=(); SPIDS=()
  local i sp
  for i in $(seq 1 "$1"); do
    sp=$(port)
    "$BIN" --listen "127.0.0.1:$sp" --upstream "redis://127.0.0.1:$RP" --tracking "$2" \
      --l1-max-bytes "${L1:-1mb}" --threads 1 --metrics-listen off --log-level warn "${EXTRA[@]}" \
      >"$WORK/sc-$sp.log" 2>&1 &
    SPIDS+=("$!"); PIDS+=("$!"); SPORTS+=("$sp")
  done
  for sp in "${SPORTS[@]}"; do ready "$sp"; [[ "$2" == off ]] || channel_up "$sp"; done
}
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
bench() { # PORT N -> rps
  redis-benchmark -p "$1" -P "$P" -c "$CLIENTS" -n "$2" -r "$KEYSPACE" -d "$DATA_SIZE" -t set -q --csv \
    | grep '^"SET' | cut -d, -f2 | tr -d '"'
}
f2() { python3 -c "print(f'{$1:.2f}')"; }

case "$PART" in
scale)
  N="${N:-400000}"; ROUNDS="${ROUNDS:-1}"
  echo "| mode | sidecaches | Redis µs CPU per SET | bytes Redis sent to others per SET | bytes the sidecaches read per SET | direct SET/s |"
  echo "|---|---|---|---|---|---|"
  for round in $(seq "$ROUNDS"); do
    for mode in ${MODES:-bcast optin}; do
      for count in ${COUNTS:-0 1 10 50}; do
        start_redis
        start_sidecaches "$count" "$mode"
        # Each sidecache caches keys of its own (never written below).
        for sp in "${SPORTS[@]}"; do
          for k in $(seq 1 "$CACHED"); do echo "GET cached:$sp:$k"; done | redis-cli -p "$sp" >/dev/null
          if (( ${CACHED_WRITTEN:-0} > 0 )); then
            for k in $(seq 0 $((CACHED_WRITTEN - 1))); do printf 'GET key:%012d\n' "$k"; done \
              | redis-cli -p "$sp" >/dev/null
          fi
        done
        sleep 0.3
        t0=$(ticks "$RPID"); o0=$(netout "$RP"); r0=$(received "$RP")
        rps=$(bench "$RP" "$N")
        sleep 0.5
        t1=$(ticks "$RPID"); o1=$(netout "$RP"); r1=$(received "$RP")
        # The INFO calls themselves are in o1 - o0: a few kB, negligible per SET.
        echo "| $mode | $count | $(f2 "($t1 - $t0) / $HZ / $N * 1e6") | $(f2 "($o1 - $o0) / $N - 5") | $(f2 "($r1 - $r0) / $N") | $rps |"
        stop_all
      done
    done
  done
  ;;
sustained)
  N="${N:-600000}"; ROUNDS="${ROUNDS:-3}"
  echo "| round | mode | direct SET/s | through sidecache SET/s | ratio | Redis µs CPU per SET, direct | Redis µs CPU per SET through sidecache | CPU ratio |"
  echo "|---|---|---|---|---|---|---|---|"
  for round in $(seq "$ROUNDS"); do
    for mode in ${MODES:-optin bcast off}; do
      start_redis; t0=$(ticks "$RPID"); d=$(bench "$RP" "$N"); t1=$(ticks "$RPID"); stop_all
      dcpu=$(f2 "($t1 - $t0) / $HZ / $N * 1e6")
      start_redis; start_sidecaches 1 "$mode"
      t0=$(ticks "$RPID")
      s=$(bench "${SPORTS[0]}" "$N")
      for _ in $(seq 600); do
        depth="$(redis-cli -p "${SPORTS[0]}" info writebehind | tr -d '\r' | awk -F: '/^write_queue_depth:/ {print $2+0}')"
        [[ "$depth" == 0 ]] && break; sleep 0.05
      done
      t1=$(ticks "$RPID")
      scpu=$(f2 "($t1 - $t0) / $HZ / $N * 1e6")
      echo "| $round | $mode | $d | $s | $(f2 "$s / $d") | $dcpu | $scpu | $(f2 "$scpu / $dcpu") |"
      stop_all
    done
  done
  ;;
misses)
  ROUNDS="${ROUNDS:-3}"; MP="${MISS_P:-1}"; L1="${L1:-64mb}"
  getbench() { # PORT -> rps
    redis-benchmark -p "$1" -P "$MP" -c 50 -n "$KEYSPACE" -r "$KEYSPACE" -t get -q --csv \
      | grep '^"GET' | cut -d, -f2 | tr -d '"'
  }
  misses() { redis-cli -p "$1" info l1 | tr -d '\r' | awk -F: '/^l1_misses:/ {print $2}'; }
  echo "| round | target | first pass GET/s (mostly misses) | L1 misses | second pass GET/s |"
  echo "|---|---|---|---|---|"
  for round in $(seq "$ROUNDS"); do
    start_redis
    redis-benchmark -p "$RP" -P 16 -c 50 -n $((3 * KEYSPACE)) -r "$KEYSPACE" -d "$DATA_SIZE" -t set -q >/dev/null
    echo "| $round | direct Redis | $(getbench "$RP") | — | $(getbench "$RP") |"
    for mode in ${MODES:-optin bcast}; do
      start_sidecaches 1 "$mode"
      a=$(getbench "${SPORTS[0]}"); m=$(misses "${SPORTS[0]}"); b=$(getbench "${SPORTS[0]}")
      echo "| $round | sidecache $mode | $a | $m | $b |"
      kill "${SPIDS[0]}"; wait "${SPIDS[0]}" 2>/dev/null || true
    done
    stop_all
  done
  ;;
memory)
  echo "| keys | Redis used_memory after populate | + one sidecache read them all (optin) | per key | + a second sidecache | per key | tracking_total_keys / items |"
  echo "|---|---|---|---|---|---|---|"
  for n in ${KEYS_LIST:-10000 1000000}; do
    start_redis --enable-debug-command local
    [[ "$(redis-cli -p "$RP" debug populate "$n" key "$DATA_SIZE")" == OK ]] \
      || { echo "bench/scale.sh: DEBUG POPULATE refused" >&2; exit 1; }
    start_sidecaches 2 optin
    python3 - "$n" >"$WORK/gets.resp" <<'EOF'
import sys
n = int(sys.argv[1])
out = sys.stdout.buffer
for i in range(n):
    k = b"key:%d" % i
    out.write(b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(k), k))
EOF
    sleep 0.5; m0=$(used "$RP")
    redis-cli -p "${SPORTS[0]}" --pipe <"$WORK/gets.resp" >/dev/null
    sleep 0.5; m1=$(used "$RP")
    redis-cli -p "${SPORTS[1]}" --pipe <"$WORK/gets.resp" >/dev/null
    sleep 0.5; m2=$(used "$RP")
    tk=$(redis-cli -p "$RP" info stats | tr -d '\r' | awk -F: '/^tracking_total_keys:/ {print $2}')
    ti=$(redis-cli -p "$RP" info stats | tr -d '\r' | awk -F: '/^tracking_total_items:/ {print $2}')
    echo "| $n | $m0 | $((m1 - m0)) | $(f2 "($m1 - $m0) / $n") | $((m2 - m1)) | $(f2 "($m2 - $m1) / $n") | $tk / $ti |"
    stop_all
  done
  ;;
*) echo "bench/scale.sh: scale, sustained, misses or memory" >&2; exit 2 ;;
esac
