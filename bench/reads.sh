#!/usr/bin/env bash
# bench/reads.sh — the L1 beyond GET on a session-store workload: HGETALL of
# session hashes, 80% reads and 20% writes (HSET of one field), through
# sidecache with only GET cached (`--l1-commands get`, as before reads
# beyond GET were cached) and with the default (`all`), side by side in one
# run, against the same Redis, beside the same load sent to Redis directly.
#
# For each setting and round: FLUSHALL, write KEYS session hashes of FIELDS
# fields, then run a reader (`redis-benchmark HGETALL session:__rand_int__`,
# READS requests) and a writer (`HSET session:__rand_int__ f1 …`, READS/4
# requests) at once through sidecache. Reports the reader's requests/s, the
# L1's read hit ratio (INFO l1_read_hits / (hits + misses)), and how many
# HGETALLs reached Redis per HGETALL asked (INFO commandstats), medians over
# ROUNDS.
#
# Usage: bench/reads.sh [BINARY]   (default target/release/sidecache)
# Knobs: ROUNDS=3 READS=200000 KEYS=10000 FIELDS=10 CLIENTS=50 P=1
# Only the processes it started are stopped (by pid).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
BIN="${1:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/sidecache}"
ROUNDS="${ROUNDS:-3}"; READS="${READS:-200000}"; KEYS="${KEYS:-10000}"
FIELDS="${FIELDS:-10}"; CLIENTS="${CLIENTS:-50}"; P="${P:-1}"
command -v redis-benchmark >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; }
[[ -x "$BIN" ]] || { echo "no binary at $BIN (cargo build --release -p sidecache)" >&2; exit 1; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sidecache-reads.XXXXXX")"
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
RP=$(port)
redis-server --bind 127.0.0.1 --port "$RP" --dir "$WORK" --save '' --appendonly no >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done

field() { awk -F: -v f="$2" '$1 == f {gsub("\r", "", $2); v = $2} END {print v + 0}' <<<"$1"; }
calls() { redis-cli -p "$RP" info commandstats | awk -F'[=,:]' '$1 == "cmdstat_hgetall" {print $3}'; }
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

declare -A RPS HIT UP
for setting in direct get all; do
  if [[ "$setting" == direct ]]; then
    SP=$RP
  else
  SP=$(port)
  "$BIN" --listen "127.0.0.1:$SP" --upstream "redis://127.0.0.1:$RP" --metrics-listen 127.0.0.1:0 \
    --log-level warn --l1-commands "$setting" >"$WORK/sidecache-$setting.log" 2>&1 &
  SPID=$!
  PIDS+=("$SPID")
  for _ in $(seq 100); do [[ "$(redis-cli -p "$SP" ping 2>/dev/null)" == PONG ]] && break; sleep 0.1; done
  fi
  for round in $(seq "$ROUNDS"); do
    redis-cli -p "$SP" flushall >/dev/null
    awk -v n="$KEYS" -v f="$FIELDS" 'BEGIN { for (i = 0; i < n; i++) {
        printf "HSET session:%012d", i; for (j = 1; j <= f; j++) printf " f%d value-%d-%d", j, j, i; printf "\r\n" } }' |
      redis-cli -p "$RP" --pipe >/dev/null
    redis-cli -p "$RP" config resetstat >/dev/null
    before="$(redis-cli -p "$SP" info l1)"
    redis-benchmark -p "$SP" -c "$CLIENTS" -P "$P" -n "$((READS / 4))" -r "$KEYS" -q \
      HSET session:__rand_int__ f1 changed >/dev/null &
    WPID=$!
    rps="$(redis-benchmark -p "$SP" -c "$CLIENTS" -P "$P" -n "$READS" -r "$KEYS" -q --csv \
      HGETALL session:__rand_int__ | awk -F'"' 'NR > 1 || /HGETALL/ {print $4; exit}')"
    wait "$WPID"
    after="$(redis-cli -p "$SP" info l1)"
    h=$(($(field "$after" l1_read_hits) - $(field "$before" l1_read_hits)))
    m=$(($(field "$after" l1_read_misses) - $(field "$before" l1_read_misses)))
    up="$(calls)"
    hit="$(awk -v h="$h" -v m="$m" 'BEGIN {printf "%.3f", (h + m) ? h / (h + m) : 0}')"
    per="$(awk -v u="${up:-0}" -v n="$READS" 'BEGIN {printf "%.3f", u / n}')"
    echo "round $round, $setting: HGETALL $rps req/s, read hit ratio $hit, HGETALLs reaching Redis per HGETALL $per"
    RPS[$setting]+="$rps "; HIT[$setting]+="$hit "; UP[$setting]+="$per "
  done
  [[ "$setting" == direct ]] || { kill -TERM "$SPID"; wait "$SPID" 2>/dev/null || true; }
done

echo
echo "session store: HGETALL of $KEYS hashes of $FIELDS fields, $READS reads + $((READS / 4)) HSETs at once, -c $CLIENTS -P $P, medians of $ROUNDS rounds"
echo "| target | HGETALL req/s | read hit ratio | HGETALLs reaching Redis per HGETALL |"
echo "|---|---:|---:|---:|"
for setting in direct get all; do
  label="sidecache \`--l1-commands $setting\`"
  [[ "$setting" == direct ]] && label="Redis directly"
  printf '| %s | %s | %s | %s |\n' "$label" \
    "$(tr ' ' '\n' <<<"${RPS[$setting]}" | grep . | median)" \
    "$(tr ' ' '\n' <<<"${HIT[$setting]}" | grep . | median)" \
    "$(tr ' ' '\n' <<<"${UP[$setting]}" | grep . | median)"
done
