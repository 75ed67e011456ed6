#!/usr/bin/env bash
# bench/journal.sh — what the write journal costs: SET throughput and
# acknowledgement latency through sidecache with `--write-journal` off,
# `everysec` and `always`, on tmpfs and on disk, beside Redis itself with
# `appendfsync everysec` and `always` (its AOF on the same filesystems),
# all in one run.
#
#   bench/journal.sh [/path/to/sidecache]      (default: target/release/sidecache)
#
# Every row is `redis-benchmark -t set -c CLIENTS -P P -n N -r KEYSPACE -d
# DATA_SIZE --csv` against one fresh server (and, for sidecache rows, a
# fresh upstream Redis without persistence); rounds are interleaved so a
# noisy neighbour hits every row alike. Latency is as the client sees it:
# for sidecache, the time to the acknowledgement (the write lands upstream
# later).
#
# Knobs: CLIENTS=50  P_LIST="1 16"  N=100000  ROUNDS=3  KEYSPACE=100000
#        DATA_SIZE=64  DISK_DIR=/var/tmp  TMPFS_DIR=/dev/shm
#        OUT=bench/results/journal-raw.csv
# Output: one CSV line per (round, row, P): fs,target,P,rps,avg_ms,p50_ms,p99_ms,max_ms
# Only processes it started are stopped (by pid).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache}"
[[ -x "$BIN" ]] || { echo "bench/journal.sh: no sidecache binary at $BIN (cargo build --release)" >&2; exit 1; }
CLIENTS="${CLIENTS:-50}"; P_LIST="${P_LIST:-1 16}"; N="${N:-100000}"; ROUNDS="${ROUNDS:-3}"
KEYSPACE="${KEYSPACE:-100000}"; DATA_SIZE="${DATA_SIZE:-64}"
DISK_DIR="${DISK_DIR:-/var/tmp}"; TMPFS_DIR="${TMPFS_DIR:-/dev/shm}"
OUT="${OUT:-$REPO_ROOT/bench/results/journal-raw.csv}"
for t in redis-server redis-cli redis-benchmark python3; do
  command -v "$t" >/dev/null || { echo "bench/journal.sh: $t not found" >&2; exit 1; }
done
PIDS=(); DIRS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for d in "${DIRS[@]}"; do rm -rf -- "$d"; done
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ready() {
  for _ in $(seq 200); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "bench/journal.sh: nothing answers on port $1" >&2; exit 1
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
fsname() { stat -f -c %T "$1"; }
# bench PORT P -> "rps,avg,p50,p99,max"
bench() {
  redis-benchmark -p "$1" -t set -c "$CLIENTS" -P "$2" -n "$N" -r "$KEYSPACE" -d "$DATA_SIZE" --csv 2>/dev/null |
    awk -F, '/^"SET"/ { gsub(/"/, ""); print $2 "," $3 "," $5 "," $7 "," $8 }'
}
# redis_row FSDIR FSYNC P: Redis alone with its AOF in FSDIR.
redis_row() {
  local dir port pid
  dir="$(mktemp -d "$1/sidecache-bench-aof.XXXXXX")"; DIRS+=("$dir")
  port=$(port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly yes --appendfsync "$2" \
    --dir "$dir" >/dev/null 2>&1 & pid=$!; PIDS+=("$pid")
  ready "$port"
  echo "$(fsname "$1"),redis aof $2,$3,$(bench "$port" "$3")"
  stop "$pid"; rm -rf -- "$dir"
}
# proxy_row FSDIR FSYNC P: sidecache (journal in FSDIR; FSYNC off: none).
proxy_row() {
  local dir up sp upid spid journal=()
  dir="$(mktemp -d "$1/sidecache-bench-journal.XXXXXX")"; DIRS+=("$dir")
  up=$(port); sp=$(port)
  redis-server --port "$up" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >/dev/null 2>&1 & upid=$!; PIDS+=("$upid")
  ready "$up"
  [[ "$2" == off ]] || journal=(--write-journal "$dir/journal" --write-journal-fsync "$2")
  "$BIN" --listen "127.0.0.1:$sp" --upstream "redis://127.0.0.1:$up" --log-level warn \
    --metrics-listen off "${journal[@]}" >"$dir/sidecache.log" 2>&1 & spid=$!; PIDS+=("$spid")
  ready "$sp"
  echo "$(fsname "$1"),sidecache journal $2,$3,$(bench "$sp" "$3")"
  stop "$spid"; stop "$upid"; rm -rf -- "$dir"
}
mkdir -p "$(dirname "$OUT")"
echo "round,fs,target,P,rps,avg_ms,p50_ms,p99_ms,max_ms" | tee "$OUT"
for round in $(seq "$ROUNDS"); do
  for P in $P_LIST; do
    for fsdir in "$TMPFS_DIR" "$DISK_DIR"; do
      for row in "redis everysec" "redis always" "proxy off" "proxy everysec" "proxy always"; do
        read -r kind fsync <<<"$row"
        if [[ "$kind" == redis ]]; then line="$(redis_row "$fsdir" "$fsync" "$P")"
        else
          # The no-journal row is the same on both filesystems: once.
          [[ "$fsync" == off && "$fsdir" == "$DISK_DIR" ]] && continue
          line="$(proxy_row "$fsdir" "$fsync" "$P")"
        fi
        echo "$round,$line" | tee -a "$OUT"
      done
    done
  done
done
