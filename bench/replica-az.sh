#!/usr/bin/env bash
# bench/replica-az.sh — the cost case of `--read-from`: where L1 misses are
# served, by availability zone, with each mode.
#
# A 3-master Redis Cluster with 2 replicas per master (9 redis-servers on
# loopback) laid out as ElastiCache spreads a cluster over three zones:
# the master of shard i in zone az-{a,b,c}[i], its two replicas in the two
# other zones. Zones are given to sidecache with --replica-az (Valkey 8+
# nodes would say them themselves). sidecache runs "in" az-a (--az az-a).
#
# For each mode (primary, az-affinity, az-affinity-replicas-and-primary): a
# fresh sidecache, CONFIG RESETSTAT on every node, then `redis-benchmark
# GET key:__rand_int__` (READS requests over KEYS keys of VALUE bytes, all
# loaded first) through it. Every GET that reaches a node is an L1 miss;
# the script counts them per node (INFO commandstats) with the bytes the
# nodes sent (INFO stats total_net_output_bytes: the miss replies, plus the
# probes' small INFO replies), and reports the share of misses and of reply
# bytes served in sidecache's zone, and the cross-zone bytes per million
# misses (AWS bills cross-AZ transfer in each direction, $0.01/GB each way
# in most regions).
#
# What it does not measure: latency. On one host every node is a loopback
# hop away; a cross-zone round trip (typically 0.5–1 ms against
# 0.1–0.3 ms within a zone) needs the nodes in real zones.
#
# Usage: bench/replica-az.sh [BINARY]   (default target/release/sidecache)
# Knobs: KEYS=20000 READS=100000 VALUE=512 CLIENTS=20
# Only the processes it started are stopped (by pid).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
BIN="${1:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache}"
KEYS="${KEYS:-20000}"; READS="${READS:-100000}"; VALUE="${VALUE:-512}"; CLIENTS="${CLIENTS:-20}"
[[ -x "$BIN" ]] || { echo "no binary at $BIN (cargo build --release -p sidecache)" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "redis-benchmark is needed (redis-tools)" >&2; exit 1; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sidecache-replica-az.XXXXXX")"
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
# A free port whose cluster bus port (+10000) is free too.
port() {
  python3 - <<'EOF'
import random, socket
while True:
    p = random.randint(20000, 29999)
    ok = True
    for q in (p, p + 10000):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", q))
        except OSError:
            ok = False
        finally:
            s.close()
    if ok:
        print(p)
        break
EOF
}

PORTS=()
for i in $(seq 0 8); do
  p=$(port)
  mkdir -p "$WORK/n$p"
  redis-server --bind 127.0.0.1 --port "$p" --dir "$WORK/n$p" --save '' --appendonly no \
    --cluster-enabled yes --cluster-config-file nodes.conf --repl-diskless-sync-delay 0 \
    >"$WORK/n$p.log" 2>&1 &
  PIDS+=($!)
  PORTS+=("$p")
done
for p in "${PORTS[@]}"; do
  until redis-cli -p "$p" ping >/dev/null 2>&1; do sleep 0.05; done
done
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${PORTS[@]}") --cluster-replicas 2 --cluster-yes >/dev/null
# Every replica synced, and the seed's CLUSTER SLOTS lists all 9 nodes.
for _ in $(seq 600); do
  ids=$(redis-cli -p "${PORTS[0]}" cluster slots | awk 'length($0) == 40' | wc -l)
  synced=0
  for p in "${PORTS[@]}"; do
    redis-cli -p "$p" info replication | grep -q 'master_link_status:up' && synced=$((synced + 1))
  done
  [[ $ids -ge 9 && $synced -ge 6 ]] && break
  sleep 0.1
done

# Zones: shards ordered by their master's port; master i in ZONES[i], its
# replicas in the two other zones.
ZONES=(az-a az-b az-c)
declare -A ZONE
MASTERS=($(for p in "${PORTS[@]}"; do if [[ $(redis-cli -p "$p" role | sed -n 1p) == master ]]; then echo "$p"; fi; done | sort -n))
for i in 0 1 2; do
  m=${MASTERS[i]}
  ZONE[$m]=${ZONES[i]}
  others=()
  for z in "${ZONES[@]}"; do if [[ $z != "${ZONES[i]}" ]]; then others+=("$z"); fi; done
  reps=($(for p in "${PORTS[@]}"; do
    r=$(redis-cli -p "$p" role | paste -sd' ')
    if [[ $r == slave*" $m "* ]]; then echo "$p"; fi
  done | sort -n))
  ZONE[${reps[0]}]=${others[0]}
  ZONE[${reps[1]}]=${others[1]}
done
AZ_FLAGS=()
for p in "${PORTS[@]}"; do AZ_FLAGS+=(--replica-az "127.0.0.1:$p=${ZONE[$p]}"); done

# The keys, loaded once through a sidecache (redis-benchmark's own
# cluster mode would put hash tags in the names).
lp=$(port)
"$BIN" --listen "127.0.0.1:$lp" --upstream "redis://127.0.0.1:${MASTERS[0]}" --log-level warn \
  --metrics-listen 127.0.0.1:0 >"$WORK/loader.log" 2>&1 &
lpid=$!
PIDS+=("$lpid")
until redis-cli -p "$lp" ping 2>/dev/null | grep -q PONG; do sleep 0.05; done
redis-benchmark -p "$lp" -t set -n $((KEYS * 4)) -r "$KEYS" -d "$VALUE" -c 20 -q >/dev/null
kill -TERM "$lpid"; wait "$lpid" 2>/dev/null || true

stat() { redis-cli -p "$1" info "$2"; }
field() { awk -F'[:,=]' -v f="$2" '$1 == f { print $2; exit }' <<<"$1"; }
gets() { local s; s=$(stat "$1" commandstats | tr -d '\r'); awk -F'[:=,]' '$1 == "cmdstat_get" { print $3; exit }' <<<"$s" | grep . || echo 0; }
outbytes() { field "$(stat "$1" stats | tr -d '\r')" total_net_output_bytes; }

echo "| --read-from | misses upstream | in az-a (sidecache's zone) | reply bytes in az-a | cross-zone MB per million misses | GETs per node (zone) |"
echo "|---|---|---|---|---|---|"
for mode in primary az-affinity az-affinity-replicas-and-primary; do
  sp=$(port)
  "$BIN" --listen "127.0.0.1:$sp" --upstream "redis://127.0.0.1:${MASTERS[0]}" --log-level warn \
    --metrics-listen 127.0.0.1:0 --read-from "$mode" --az az-a "${AZ_FLAGS[@]}" >"$WORK/sidecache-$mode.log" 2>&1 &
  spid=$!
  PIDS+=("$spid")
  until redis-cli -p "$sp" ping 2>/dev/null | grep -q PONG; do sleep 0.05; done
  sleep 1 # the replicas' first probes
  for p in "${PORTS[@]}"; do redis-cli -p "$p" config resetstat >/dev/null; done
  redis-benchmark -p "$sp" -t get -n "$READS" -r "$KEYS" -c "$CLIENTS" -q >/dev/null
  total=0; inaz=0; bytes=0; bytes_inaz=0; per=""
  for p in "${PORTS[@]}"; do
    g=$(gets "$p"); b=$(outbytes "$p")
    total=$((total + g)); bytes=$((bytes + b))
    if [[ ${ZONE[$p]} == az-a ]]; then inaz=$((inaz + g)); bytes_inaz=$((bytes_inaz + b)); fi
    role=$([[ " ${MASTERS[*]} " == *" $p "* ]] && echo M || echo r)
    per+="$role:$g(${ZONE[$p]#az-}) "
  done
  python3 - "$mode" "$total" "$inaz" "$bytes" "$bytes_inaz" "$per" <<'EOF'
import sys
mode, total, inaz, b, binaz, per = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
share = 100.0 * inaz / total if total else 0.0
bshare = 100.0 * binaz / b if b else 0.0
cross_mb = (b - binaz) / 1e6 / (total / 1e6) if total else 0.0
print(f"| {mode} | {total} | {share:.1f}% | {bshare:.1f}% | {cross_mb:.0f} | {per.strip()} |")
EOF
  kill -TERM "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
done
