#!/usr/bin/env bash
# bench/soak.sh — the abuse soak (issue #21, item 6): sidecache's peak RSS
# against its documented bound, its survival, and what the abuse costs a
# normal GET/SET workload.
#
# 1. Starts a standalone redis-server and a release sidecache with explicit
#    bounds (--l1-max-bytes, --write-queue-max-bytes,
#    --client-output-buffer-limit "normal OUTPUT 0 0", --maxclients) on free
#    loopback ports, and samples sidecache's VmRSS every 100 ms throughout.
# 2. The constant: sidecache's RSS with IDLE idle connections (one PING
#    each) and nothing cached (`soak --idle-only`), the maximum sample while
#    they are opened and held.
# 3. Preloads a VALUE_BYTES value (soak:big) through sidecache (so it is in
#    the L1), then runs `soak`: the normal workload alone for SECS seconds,
#    then with the abuse side by side (IDLE idle connections, SLOW slow
#    readers pipelining GETs of soak:big, GARBAGE connections of each garbage
#    kind, CHURN connects/s) for SECS seconds; CYCLES such pairs, alternated
#    (other users' load on a shared machine drifts; the ratio is over all
#    pairs), then the normal workload alone again for AFTER seconds.
# 4. Checks that sidecache is alive and answers PING, and prints peak RSS
#    (max of the samples and VmHWM) against
#      L1 + QUEUE + OUTPUT × SLOW + constant,
#    the normal workload's throughput and p99 with and without the abuse,
#    and pass/fail per target.
#
# Knobs: L1=64mb QUEUE=64mb OUTPUT=4mb MAXCLIENTS=4000 SECS=20 CYCLES=3 AFTER=10
#        IDLE=1000 SLOW=100 GARBAGE=8 CHURN=5000 NORMAL_CLIENTS=16
#        NORMAL_RATE=0 (requests/s of the normal workload; 0: closed loop)
#        SLOW_VALUE=cached (the slow readers' value stays in the L1,
#        --l1-ttl-cap 3600) | uncached (--l1-exclude-prefix soak:big: every
#        GET of it is forwarded)
#        VALUE_BYTES=1048576 SIDECACHE_ARGS= (extra flags) SOAK_ARGS=
#        (extra soak flags) SKIP_BUILD=0 SIDECACHE_BIN= SOAK_BIN=
#        RESULTS_DIR=bench/results KEEP_WORKDIR=0
# Output: $RESULTS_DIR/soak-last.md (also printed); the run's logs in the
# work dir when KEEP_WORKDIR=1. Exit status 0 only if every target passed.
# Only processes it started are stopped (by pid).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
L1="${L1:-64mb}"; QUEUE="${QUEUE:-64mb}"; OUTPUT="${OUTPUT:-4mb}"
MAXCLIENTS="${MAXCLIENTS:-4000}"; SECS="${SECS:-20}"; CYCLES="${CYCLES:-3}"; AFTER="${AFTER:-10}"
IDLE="${IDLE:-1000}"; SLOW="${SLOW:-100}"; GARBAGE="${GARBAGE:-8}"; CHURN="${CHURN:-5000}"
SLOW_VALUE="${SLOW_VALUE:-cached}"
case "$SLOW_VALUE" in
  # The value stays in the L1 the whole run (its reply size is known when
  # a GET is read), or is never cached (every GET forwarded; the size of a
  # forwarded reply is only estimated, see docs/commands.md's limits).
  cached) VALUE_ARGS=(--l1-ttl-cap 3600) ;;
  uncached) VALUE_ARGS=(--l1-exclude-prefix soak:big) ;;
  *) echo "SLOW_VALUE is cached or uncached" >&2; exit 1 ;;
esac
NORMAL_CLIENTS="${NORMAL_CLIENTS:-16}"; NORMAL_RATE="${NORMAL_RATE:-0}"; VALUE_BYTES="${VALUE_BYTES:-1048576}"
RESULTS_DIR="${RESULTS_DIR:-$SCRIPT_DIR/results}"
TARGET="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
BIN="${SIDECACHE_BIN:-$TARGET/release/sidecache}"
SOAK="${SOAK_BIN:-$TARGET/release/soak}"
[[ "${SKIP_BUILD:-0}" == 1 ]] || (cd "$REPO_ROOT" && nice -n 10 cargo build --release -p sidecache -p sidecache-bench)
[[ -x "$BIN" ]] || { echo "no sidecache binary at $BIN" >&2; exit 1; }
[[ -x "$SOAK" ]] || { echo "no soak binary at $SOAK" >&2; exit 1; }
for c in redis-server redis-cli; do
  command -v "$c" >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server redis-tools >/dev/null; break; }
done
# Both sidecache and the load hold ~1,200 connections plus the churn.
ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
[[ "$(ulimit -n)" -ge $((IDLE + SLOW + 3 * GARBAGE + NORMAL_CLIENTS + 1024)) ]] ||
  echo "warning: ulimit -n is $(ulimit -n)" >&2

WORK="$(mktemp -d)"; PIDS=()
cleanup() {
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; wait "${PIDS[i]}" 2>/dev/null || true; done
  if [[ "${KEEP_WORKDIR:-0}" == 1 ]]; then echo "work dir: $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
tobytes() { # 64mb -> bytes, as sidecache reads sizes
  python3 -c 'import re,sys;m=re.fullmatch(r"(\d+)(b|k|kb|m|mb|g|gb)?",sys.argv[1].lower());u={"":1,"b":1,"k":1e3,"kb":1024,"m":1e6,"mb":1<<20,"g":1e9,"gb":1<<30}[m.group(2) or ""];print(int(int(m.group(1))*u))' "$1"; }
mb() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
now_ms() { date +%s%3N; }

RP=$(port); SP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" --maxclients 10000 >"$WORK/redis.log" 2>&1 & RS=$!; PIDS+=("$RS")
for _ in $(seq 100); do redis-cli -p "$RP" ping >/dev/null 2>&1 && break; sleep 0.1; done
# shellcheck disable=SC2086
"$BIN" --listen "127.0.0.1:$SP" --metrics-listen 127.0.0.1:0 --upstream "redis://127.0.0.1:$RP" --log-level warn \
  --l1-max-bytes "$L1" --write-queue-max-bytes "$QUEUE" --client-output-buffer-limit "normal $OUTPUT 0 0" \
  --maxclients "$MAXCLIENTS" "${VALUE_ARGS[@]}" ${SIDECACHE_ARGS:-} >"$WORK/sc.log" 2>&1 & SC=$!; PIDS+=("$SC")
for _ in $(seq 100); do redis-cli -p "$SP" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$SP" ping | grep -q PONG || { echo "sidecache did not start" >&2; cat "$WORK/sc.log" >&2; exit 1; }

# VmRSS every 100 ms: "epoch_ms bytes".
( while [[ -r /proc/$SC/status ]]; do
    r=$(awk '/^VmRSS/ {print $2 * 1024}' "/proc/$SC/status" 2>/dev/null) || break
    [[ -n "$r" ]] && echo "$(now_ms) $r"
    sleep 0.1
  done ) >"$WORK/rss.log" 2>/dev/null & PIDS+=("$!")
kb() { awk -v f="$1" '$1 == f":" {print $2 * 1024}' "/proc/$SC/status"; }
peak_between() { awk -v a="$1" -v b="$2" '$1 >= a && $1 <= b && $2 > m {m = $2} END {print m + 0}' "$WORK/rss.log"; }
info() { redis-cli -p "$SP" info proxy | tr -d '\r' | awk -F: -v f="$1" '$1 == f {print $2}'; }

sleep 0.5
rss_start=$(kb VmRSS)

# The constant: IDLE idle connections, nothing cached.
echo "[soak.sh] measuring the constant: $IDLE idle connections, nothing cached" >&2
t0=$(now_ms)
"$SOAK" --addr "127.0.0.1:$SP" --idle "$IDLE" --idle-only 4 >"$WORK/const.out" 2>"$WORK/const.err" & CP=$!; PIDS+=("$CP")
for _ in $(seq 300); do grep -q '^idle_open=' "$WORK/const.out" && break; sleep 0.1; done
sleep 1
clients_idle=$(info connected_clients)
wait "$CP" || true
t1=$(now_ms)
sleep 0.3
constant=$(peak_between "$t0" "$t1")
idle_opened=$(awk -F= '$1 == "idle_open" {print $2}' "$WORK/const.out")
rss_after_idle=$(kb VmRSS)

# The 1 MB value, through sidecache (write-behind puts it in the L1).
python3 -c "import sys; sys.stdout.write('v' * $VALUE_BYTES)" >"$WORK/big"
redis-cli -p "$SP" -x set soak:big <"$WORK/big" >/dev/null
for _ in $(seq 100); do [[ "$(info write_queue_depth)" == 0 ]] && break; sleep 0.1; done
[[ "$(redis-cli -p "$RP" strlen soak:big)" == "$VALUE_BYTES" ]] || { echo "preload failed" >&2; exit 1; }
redis-cli -p "$SP" get soak:big | wc -c >/dev/null
rss_loaded=$(kb VmRSS)
before_conns=$(info total_connections_received)

echo "[soak.sh] soak: ${SECS}s baseline, then ${SECS}s with the abuse (after a ramp), then ${AFTER}s after" >&2
# shellcheck disable=SC2086
"$SOAK" --addr "127.0.0.1:$SP" --seconds "$SECS" --cycles "$CYCLES" --after "$AFTER" --normal-clients "$NORMAL_CLIENTS" \
  --normal-rate "$NORMAL_RATE" --cpu-pids "sidecache=$SC,redis=$RS" \
  --idle "$IDLE" --slow "$SLOW" --garbage "$GARBAGE" --churn-rate "$CHURN" --slow-key soak:big \
  ${SOAK_ARGS:-} >"$WORK/soak.out" 2> >(tee "$WORK/soak.err" >&2) & LP=$!; PIDS+=("$LP")
soak_rc=0; wait "$LP" || soak_rc=$?
sleep 0.3

# Survival.
alive=no; kill -0 "$SC" 2>/dev/null && alive=yes
pong=$(redis-cli -p "$SP" ping 2>/dev/null || true)
hwm=0; [[ $alive == yes ]] && hwm=$(kb VmHWM)
peak_samples=$(peak_between 0 99999999999999)
v() { awk -F= -v k="$1" '$1 == k {print $2}' "$WORK/soak.out"; }
peak_base=$(peak_between "$(v mark_baseline_start_ms)" "$(v mark_abuse_start_c0_ms)")
peak_soak=$(peak_between "$(v mark_abuse_start_c0_ms)" "$(v "mark_soak_end_c$((CYCLES - 1))_ms")")
panics=$(info client_panics); protoerr=$(info protocol_errors); rejected=$(info rejected_connections)
conns=$(( $(info total_connections_received) - before_conns ))
clients_end=$(info connected_clients)
log_errors=$(grep -ciE 'panic|error' "$WORK/sc.log" || true)

l1b=$(tobytes "$L1"); qb=$(tobytes "$QUEUE"); ob=$(tobytes "$OUTPUT")
bound=$(( l1b + qb + ob * SLOW + constant ))
peak=$(( hwm > peak_samples ? hwm : peak_samples ))
ratio=$(awk -v a="$(v soak_rps)" -v b="$(v baseline_rps)" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')
pf() { if [[ "$1" == 1 ]]; then echo PASS; else echo FAIL; fi; }
crash_ok=0; [[ $alive == yes && $pong == PONG && "${panics:-1}" == 0 && $soak_rc == 0 ]] && crash_ok=1
rss_ok=0; (( peak <= bound )) && rss_ok=1
tp_ok=$(awk -v r="$ratio" 'BEGIN {print (r >= 0.7) ? 1 : 0}')

out="$RESULTS_DIR/soak-last.md"
mkdir -p "$RESULTS_DIR"
{
  echo "### Soak run $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git -C "$REPO_ROOT" rev-parse --short HEAD)$(git -C "$REPO_ROOT" diff --quiet HEAD -- proxy pool l1 bench/src || echo -dirty), $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"
  echo
  echo "sidecache \`--l1-max-bytes $L1 --write-queue-max-bytes $QUEUE --client-output-buffer-limit \"normal $OUTPUT 0 0\" --maxclients $MAXCLIENTS ${VALUE_ARGS[*]} ${SIDECACHE_ARGS:-}\` (release),"
  echo "Redis $(redis-server --version | awk '{print $3}' | tr -d 'v=') standalone. Normal workload: $NORMAL_CLIENTS connections, one request per round trip ($( [[ $NORMAL_RATE == 0 ]] && echo "closed loop, as fast as replies come" || echo "paced at $NORMAL_RATE requests/s in all")), 20% SET / 80% GET of 10,000 keys, 64-byte values."
  echo "Abuse: $IDLE idle connections (PING every ~5 s), $SLOW slow readers pipelining GETs of a $VALUE_BYTES-byte value, $SLOW_VALUE (half never read, half read 16 KB every 100 ms), $GARBAGE connections each of random bytes / truncated frames / 512 MB bulk headers, churn target $CHURN connects/s. Windows: $CYCLES × (${SECS} s baseline, the abuse's ramp, ${SECS} s soak), then ${AFTER} s after; throughput and percentiles are over all cycles' windows."
  echo
  echo "| | figure |"
  echo "|---|---|"
  echo "| RSS at start / with $idle_opened idle connections (the constant) / after preload | $(mb "$rss_start") / $(mb "$constant") / $(mb "$rss_loaded") MB |"
  echo "| peak RSS: baseline window / abuse (ramp + soak) / VmHWM | $(mb "$peak_base") / $(mb "$peak_soak") / $(mb "$hwm") MB |"
  echo "| bound: L1 + queue + output limit × slow readers + constant | $(mb "$l1b") + $(mb "$qb") + $(mb "$ob") × $SLOW + $(mb "$constant") = $(mb "$bound") MB |"
  echo "| normal throughput: baseline / soak / after (ratio soak/baseline) | $(v baseline_rps) / $(v soak_rps) / $(v after_rps) req/s ($ratio×) |"
  echo "| normal p50 / p99 / p99.9: baseline | $(v baseline_p50_us) / $(v baseline_p99_us) / $(v baseline_p999_us) µs |"
  echo "| normal p50 / p99 / p99.9: soak | $(v soak_p50_us) / $(v soak_p99_us) / $(v soak_p999_us) µs |"
  echo "| normal p50 / p99: after | $(v after_p50_us) / $(v after_p99_us) µs |"
  echo "| normal while the abuse starts (the ramps, $(v ramp_secs) s in all, not in the ratio): throughput, p99, max | $(v ramp_rps) req/s, $(v ramp_p99_us) µs, $(v ramp_max_us) µs |"
  echo "| normal throughput, lowest one-second count: baseline / ramp / soak / after | $(v baseline_lowest_1s) / $(v ramp_lowest_1s) / $(v soak_lowest_1s) / $(v after_lowest_1s) |"
  echo "| per cycle: baseline / ramp / soak req/s (ratio) | $(awk -F= '/^cycle_/ {sub(/^baseline /, "", $2); sub(/ ramp /, " / ", $2); sub(/ soak /, " / ", $2); sub(/ ratio /, " (", $2); printf "%s%s)", sep, $2; sep = "; "}' "$WORK/soak.out") |"
  echo "| normal errors: baseline / soak / after | $(v baseline_errors) / $(v soak_errors) / $(v after_errors) |"
  for w in baseline ramp soak after; do
    [[ -n "$(v ${w}_rps)" ]] || continue
    echo "| CPU, % of one core, $w: sidecache / redis / load generator normal, abuse / whole machine (of it niced: other users' background jobs) | $(v ${w}_cpu_sidecache_pct) / $(v ${w}_cpu_redis_pct) / $(v ${w}_cpu_load_normal_pct), $(v ${w}_cpu_load_abuse_pct) / $(v ${w}_cpu_machine_busy_pct) ($(v ${w}_cpu_machine_niced_pct)) |"
  done
  echo "| churn achieved (target $CHURN/s) | $(v churn_per_s)/s ($(v churn_done_soak) in the window; errors $(v churn_errors_soak), skipped at the in-flight cap $(v churn_skipped_soak)) |"
  echo "| idle connections open at soak start / end; dropped; PINGs answered in the window | $(v idle_open_soak_start) / $(v idle_open_soak_end); $(v idle_dropped); $(v idle_pings_soak) |"
  echo "| slow readers: GETs sent / bytes read in the window; errors | $(v slow_gets_sent_soak) / $(v slow_bytes_read_soak); $(v slow_errors) |"
  echo "| garbage connections in the window: random / truncated / bulk header (closed by sidecache) | $(v garbage_random_conns_soak) ($(v garbage_random_server_closed_soak)) / $(v garbage_truncated_conns_soak) ($(v garbage_truncated_server_closed_soak)) / $(v garbage_bulkhdr_conns_soak) ($(v garbage_bulkhdr_server_closed_soak)) |"
  echo "| sidecache: connections received during the soak run / rejected (maxclients) / protocol errors / client panics | $conns / $rejected / $protoerr / $panics |"
  echo "| sidecache: alive, PING, connected clients at the end, log lines with error/panic | $alive, $pong, $clients_end, $log_errors |"
  echo
  echo "| target | result |"
  echo "|---|---|"
  echo "| 0 crashes (alive, PONG, 0 client panics) | $(pf $crash_ok) |"
  echo "| peak RSS $(mb "$peak") MB ≤ bound $(mb "$bound") MB | $(pf $rss_ok) |"
  echo "| normal throughput during the soak ≥ 0.7× baseline ($ratio×) | $(pf "$tp_ok") |"
} | tee "$out"
(( crash_ok && rss_ok && tp_ok ))
