#!/usr/bin/env bash
# bench/workload.sh — a mixed read/write load with skewed key popularity,
# directly on Redis and through sidecache per tracking mode, side by side:
# throughput and latency, the L1 hit ratio, and what each operation costs
# Redis (commands it ran, CPU it used) and sidecache (CPU).
#
#   bench/workload.sh [run]      WRITE_PCTS workloads (KEYS, DIST, ZIPF_S, TYPE) × SIDES
#   bench/workload.sh matrix     zipf s ∈ {0.99, 1.2} × keys ∈ {10^4, 10^6} × writes ∈ {5, 20, 50} %
#                                strings, plus hashes at 20 % writes (s × keys): about 3 minutes
#   bench/workload.sh write-heavy  90 % SET of hot keys (Zipf 0.99 over 1,000 keys), 10 % GET:
#                                counters, rate limits, session touches; the SET's own
#                                p50 / p99 (the acknowledgement) beside the round trips'
#   bench/workload.sh staleness  one writer on Redis, readers through each side: how long
#                                a write takes to reach them, and stale reads
#   bench/workload.sh sides      N application processes (redis-py, node-redis) at Redis, at
#                                sidecache (TCP, Unix socket) and each with its own client-side
#                                cache; YCSB A/B/C/F and a session store, at 0.5 ms and on
#                                loopback, N = 1, 8, 32; tables and a chart: about 17 minutes
#                                (bench/workload-sides.sh lists what it does and its knobs)
#   bench/workload.sh curve      latency against offered load, warm, open loop (Poisson arrivals,
#                                latency from each operation's intended send): direct, sidecache
#                                (TCP, Unix socket), redis-py's client-side cache; YCSB B and A and
#                                the session store at 0.5 and 1 ms, N = 32 and 8; tables, SLO
#                                throughput and a chart (bench/workload-curve.sh: what, knobs)
#
# One redis-server (a free loopback port, a temporary directory, --save ''
# --appendonly no). For each workload, ROUNDS rounds, the side order
# rotating per round; for each side: sidecache stopped, FLUSHALL, every key
# written directly (`workload --populate`, pipelined batches of 1000), a
# fresh sidecache started (SIDECACHE_BIN --listen … --metrics-listen …
# --upstream redis://…, plus `--tracking bcast` for bcast, `--tracking off`
# for off, nothing for default; EXTRA_ARGS for all) and waited for (PING,
# /readyz, the tracking channel up), then `workload` (bench/src/bin/
# workload.rs: CONNS connections, OPS operations, WRITE_PCT % SET/HSET, the
# rest GET/HGETALL) through it — or straight at Redis for the direct side,
# with no sidecache running. With PROCS > 1, PROCS `workload` processes
# at once instead of one, each with CONNS connections and its share of OPS
# (OPS/PROCS; `--procs`/`--proc-index` number their connections apart, so
# their key draws differ and a --check-values key keeps one writer), all
# sending their first operation at one instant (`--start-at`, once
# connected) and each dumping its histogram (`--hist-out`); `workload
# --merge` then gives the run's line: total ops, ops/s over the wall time
# from the first process's first operation to the last one's last reply,
# percentiles from the merged histograms (exact, not averaged). The
# figures below are measured around the whole run, so they cover every
# process. Measured around the run (after the write-behind
# queue drained): ops/s and p50/p99/p99.9 per round trip (µs); the L1 hit
# ratio (Δ sidecache_l1_hits_total / Δ(hits + sidecache_l1_misses_total));
# sidecache's upstream commands per operation (Δ sum of
# sidecache_upstream_commands_total); Redis's own count per operation (Δ of
# the calls in INFO commandstats, less the snapshot's own INFO), with its
# breakdown by command in the raw CSV; Redis's and sidecache's CPU per
# operation (utime + stime from /proc/PID/stat). No warm-up by default: the
# L1 starts empty, so first reads of each key are misses (WARM_OPS runs
# that many operations of the same workload first, unmeasured, from one
# process).
#
# With RTT_MS set, bench's `relay` sits between everything and Redis
# (RTT_MS/2 each way, to Redis's Unix socket, as net.sh): the driver's
# direct side, sidecache's upstream and the staleness writer go through it;
# populating does not.
#
# Knobs: KEYS=10000 DIST=zipf|uniform ZIPF_S=0.99 WRITE_PCTS="20" TYPE=string|hash
#        CONNS=4 (per process) PROCS=1 (client processes; run and matrix)
#        OPS=80000 (in all) VALUE_SIZE=64 PIPELINE=1 WARM_OPS=0
#        SIDES="direct default bcast" (also: off)  ROUNDS=1  RTT_MS= (e.g. 0.5)
#        EXTRA_ARGS="" (sidecache flags, word-split)  WL_ARGS="" (workload flags)
#        matrix: MATRIX_S="0.99 1.2" MATRIX_KEYS="10000 1000000"
#                MATRIX_WRITES="5 20 50" MATRIX_HASH_WRITES="20"
#        staleness: STALE_SIDES="direct default bcast" WRITES=2000 READERS=2
#                   HOT_KEYS=4 PAUSE_MS=2 DEADLINE_MS=10
#        WORKLOAD_BIN=$REPO/target/release/workload
#        SIDECACHE_BIN=$REPO/target/release/sidecache  RELAY_BIN=(beside WORKLOAD_BIN)
#        RESULTS_DIR=bench/results  PREFIX=workload | workload-matrix | workload-staleness
#        KEEP_WORKDIR=1 (keeps logs; always kept on failure)
# Output: $RESULTS_DIR/$PREFIX.md (tables), $PREFIX-raw.csv (every run).
# Only processes this script started are stopped (by pid, on exit).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
CMD="${1:-run}"
case "$CMD" in run | matrix | write-heavy | staleness | sides | curve) ;; *)
  echo "usage: bench/workload.sh [run|matrix|write-heavy|staleness|sides|curve]" >&2
  exit 2
  ;;
esac
if [[ "$CMD" == write-heavy ]]; then # its own defaults
  KEYS="${KEYS:-1000}" WRITE_PCTS="${WRITE_PCTS:-90}"
fi
if [[ "$CMD" == sides || "$CMD" == curve ]]; then # its own defaults (bench/workload-sides.sh)
  KEYS="${KEYS:-1000000}" VALUE_SIZE="${VALUE_SIZE:-1024}" RTT_MS=""
fi
WORKLOAD_BIN="${WORKLOAD_BIN:-$REPO_ROOT/target/release/workload}"
SIDECACHE_BIN="${SIDECACHE_BIN:-$REPO_ROOT/target/release/sidecache}"
RELAY_BIN="${RELAY_BIN:-$(dirname "$WORKLOAD_BIN")/relay}"
KEYS="${KEYS:-10000}"
DIST="${DIST:-zipf}"
ZIPF_S="${ZIPF_S:-0.99}"
WRITE_PCTS="${WRITE_PCTS:-20}"
TYPE="${TYPE:-string}"
CONNS="${CONNS:-4}"
PROCS="${PROCS:-1}"
OPS="${OPS:-80000}"
VALUE_SIZE="${VALUE_SIZE:-64}"
PIPELINE="${PIPELINE:-1}"
WARM_OPS="${WARM_OPS:-0}"
SIDES="${SIDES:-direct default bcast}"
ROUNDS="${ROUNDS:-1}"
RTT_MS="${RTT_MS:-}"
EXTRA_ARGS="${EXTRA_ARGS:-}"
WL_ARGS="${WL_ARGS:-}"
MATRIX_S="${MATRIX_S:-0.99 1.2}"
MATRIX_KEYS="${MATRIX_KEYS:-10000 1000000}"
MATRIX_WRITES="${MATRIX_WRITES:-5 20 50}"
MATRIX_HASH_WRITES="${MATRIX_HASH_WRITES:-20}"
STALE_SIDES="${STALE_SIDES:-direct default bcast}"
WRITES="${WRITES:-2000}"
READERS="${READERS:-2}"
HOT_KEYS="${HOT_KEYS:-4}"
PAUSE_MS="${PAUSE_MS:-2}"
DEADLINE_MS="${DEADLINE_MS:-10}"
RESULTS_DIR="${RESULTS_DIR:-$SCRIPT_DIR/results}"
case "$CMD" in
  run) PREFIX="${PREFIX:-workload}" ;;
  matrix) PREFIX="${PREFIX:-workload-matrix}" ;;
  write-heavy) PREFIX="${PREFIX:-workload-write-heavy}" ;;
  staleness) PREFIX="${PREFIX:-workload-staleness}" ;;
  sides) PREFIX="${PREFIX:-workload-sides}" ;;
  curve) PREFIX="${PREFIX:-workload-curve}" ;;
esac
KEEP_WORKDIR="${KEEP_WORKDIR:-0}"
export RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0
read -r -a EXTRA <<<"$EXTRA_ARGS"
read -r -a WLX <<<"$WL_ARGS"

log() { printf '[workload] %s\n' "$*" >&2; }
die() { printf '[workload] error: %s\n' "$*" >&2; exit 1; }

for t in redis-server redis-cli python3 curl timeout; do
  command -v "$t" >/dev/null || die "$t not found"
done
REDIS_SERVER=redis-server
PIN_HOST=(); PIN_REMOTE=() # taskset prefixes (sides, PIN=1)
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
if [[ "$CMD" == sides || "$CMD" == curve ]]; then
  # shellcheck source=bench/workload-sides.sh
  source "$SCRIPT_DIR/workload-sides.sh"
  if [[ "$CMD" == curve ]]; then
    # shellcheck source=bench/workload-curve.sh
    source "$SCRIPT_DIR/workload-curve.sh"
  fi
  sides_setup
  [[ -x "$RELAY_BIN" ]] || die "$CMD needs the relay at $RELAY_BIN (RELAY_BIN=…)"
  [[ -x "$SIDECACHE_BIN" ]] || die "no sidecache binary at $SIDECACHE_BIN (cargo build --release -p sidecache, or SIDECACHE_BIN=…)"
fi
[[ "$PROCS" =~ ^[1-9][0-9]*$ ]] || die "PROCS must be a positive integer (got '$PROCS')"
[[ -x "$WORKLOAD_BIN" ]] || die "no workload binary at $WORKLOAD_BIN (cargo build --release -p sidecache-bench, or WORKLOAD_BIN=…)"
[[ " $SIDES $STALE_SIDES " == *" default "* || " $SIDES $STALE_SIDES " == *" bcast "* || " $SIDES $STALE_SIDES " == *" off "* ]] &&
  { [[ -x "$SIDECACHE_BIN" ]] || die "no sidecache binary at $SIDECACHE_BIN (cargo build --release -p sidecache, or SIDECACHE_BIN=…)"; }
[[ -z "$RTT_MS" || -x "$RELAY_BIN" ]] || die "RTT_MS needs the relay at $RELAY_BIN (RELAY_BIN=…)"

WORK="$(mktemp -d)"
PIDS=()
FAILED=1
stop_pid() { # TERM, up to 10 s, then KILL; waits
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[i]}"; done
  if [[ "$KEEP_WORKDIR" == 1 || "$FAILED" == 1 ]]; then log "logs kept in $WORK"; else rm -rf -- "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
forget_pid() { # drop a stopped pid from PIDS
  local keep=() p
  for p in "${PIDS[@]}"; do [[ "$p" == "$1" ]] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}
# Free ports below the ephemeral range (as net.sh).
USED=" "
EPH_LOW="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
PICKED=""
pick_port() {
  local p
  for _ in $(seq 1 500); do
    p=$((10000 + RANDOM % (EPH_LOW - 10000)))
    [[ "$USED" == *" $p "* ]] && continue
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
    USED+="$p "; PICKED="$p"; return 0
  done
  die "no free port"
}
wait_ping() { # wait_ping NAME PID PORT
  for _ in $(seq 1 300); do
    kill -0 "$2" 2>/dev/null || { tail -n 20 "$WORK/$1.log" >&2; die "$1 exited during start-up"; }
    [[ "$(redis-cli -h 127.0.0.1 -p "$3" ping 2>/dev/null || true)" == PONG ]] && return 0
    sleep 0.1
  done
  die "$1 did not answer PING on $3"
}
TCK="$(getconf CLK_TCK)"
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# ns a process's threads spent on a CPU (schedstat: exact, where ticks are 10 ms).
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'; }
# Redis's commandstats as `cmd calls` lines.
cmdstats() {
  redis-cli -p "$RP" info commandstats | tr -d '\r' |
    awk -F'[:,=]' '/^cmdstat_/ { sub(/^cmdstat_/, "", $1); print $1, $3 }'
}
# Sum of a metric's samples (every label set).
metric() { # metric FILE NAME
  awk -v m="$2" '$1 == m || index($1, m "{") == 1 { s += $NF } END { printf "%d", s }' "$1"
}
kv() { tr ' ' '\n' <<<"$2" | awk -F= -v k="$1" '$1 == k { print $2 }'; }

# Redis, and the relay in front of it with RTT_MS.
pick_port; RP="$PICKED"
mkdir -p "$WORK/redis"
"${PIN_REMOTE[@]}" "$REDIS_SERVER" --bind 127.0.0.1 --port "$RP" --dir "$WORK/redis" --unixsocket "$WORK/redis.sock" \
  --unixsocketperm 700 --save '' --appendonly no --daemonize no >"$WORK/redis.log" 2>&1 &
RPID=$!; PIDS+=("$RPID")
wait_ping redis "$RPID" "$RP"
UP="$RP" # where the driver's direct side, sidecache and the writer reach Redis
RELAY_PID=""
if [[ -n "$RTT_MS" ]]; then
  pick_port; UP="$PICKED"
  one_way_us="$(awk -v r="$RTT_MS" 'BEGIN { printf "%d", r * 500 }')"
  "$RELAY_BIN" --delay-us "$one_way_us" --route "127.0.0.1:$UP=unix:$WORK/redis.sock" >"$WORK/relay.log" 2>&1 &
  RELAY_PID=$!; PIDS+=("$RELAY_PID")
  wait_ping relay "$RELAY_PID" "$UP"
  log "relay on $UP: +$one_way_us µs each way"
fi
log "redis $("$REDIS_SERVER" --version | awk '{print $3}' | tr -d 'v=') on $RP; sidecache $SIDECACHE_BIN; work dir $WORK"

# The sidecache of one side: SC_PID, SC_PORT, SC_MPORT.
SC_PID=""; SC_PORT=""; SC_MPORT=""; NSC=0; SC_UNIX="" # SC_UNIX: a Unix socket to listen on too
stop_sidecache() {
  [[ -n "$SC_PID" ]] || return 0
  stop_pid "$SC_PID"; forget_pid "$SC_PID"; SC_PID=""
}
start_sidecache() { # start_sidecache SIDE
  local args=()
  case "$1" in
    default) ;;
    bcast) args=(--tracking bcast) ;;
    off) args=(--tracking off) ;;
    *) die "unknown side $1 (direct, default, bcast, off)" ;;
  esac
  NSC=$((NSC + 1))
  pick_port; SC_PORT="$PICKED"; pick_port; SC_MPORT="$PICKED"
  [[ -n "$SC_UNIX" ]] && args+=(--unix-socket "$SC_UNIX")
  "${PIN_HOST[@]}" "$SIDECACHE_BIN" --listen "127.0.0.1:$SC_PORT" --metrics-listen "127.0.0.1:$SC_MPORT" \
    --upstream "redis://127.0.0.1:$UP" --log-level warn "${EXTRA[@]}" "${args[@]}" \
    >"$WORK/sidecache-$NSC.log" 2>&1 &
  SC_PID=$!; PIDS+=("$SC_PID")
  wait_ping "sidecache-$NSC" "$SC_PID" "$SC_PORT"
  local info
  for _ in $(seq 1 300); do
    if [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$SC_MPORT/readyz" || true)" == 200 ]]; then
      info="$(redis-cli -p "$SC_PORT" info coherence | tr -d '\r')"
      [[ "$info" == *"tracking_mode:off"* || "$info" =~ tracking_channels_up:[1-9] ]] && return 0
    fi
    sleep 0.1
  done
  die "sidecache-$NSC ($1) never ready (readyz, tracking channel)"
}
drain() { # waits until sidecache's write-behind queue is empty
  for _ in $(seq 1 600); do
    [[ "$(redis-cli -p "$SC_PORT" info writebehind | tr -d '\r' | awk -F: '/^write_queue_depth:/ { print $2 + 0 }')" == 0 ]] && return 0
    sleep 0.05
  done
  log "warning: write-behind queue not drained after 30 s"
}
populate() { # populate TYPE KEYS: FLUSHALL, then every key written directly
  [[ "$(redis-cli -p "$RP" flushall)" == OK ]] || die "FLUSHALL failed"
  "$WORKLOAD_BIN" --target "127.0.0.1:$RP" --populate --ops 0 --conns 4 \
    --type "$1" --keys "$2" --value-size "$VALUE_SIZE" 2>>"$WORK/populate.log" || die "populate failed (see $WORK/populate.log)"
}
rotate() { # rotate ROUND WORDS...: the words, rotated by ROUND-1
  local r="$1"; shift
  local a=("$@") i n=$#
  for ((i = 0; i < n; i++)); do printf '%s ' "${a[$(((i + r - 1) % n))]}"; done
}

RAW="$WORK/raw.csv"
REV="$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
[[ -n "$(git -C "$REPO_ROOT" status --porcelain -- proxy pool l1 2>/dev/null || true)" ]] && REV+="-dirty"
BINID="$(sha256sum "$SIDECACHE_BIN" 2>/dev/null | cut -c1-12 || echo none)"
HEADER="Run $(date -u +%Y-%m-%dT%H:%MZ), repo $REV, SIDECACHE_BIN=$SIDECACHE_BIN (sha256 $BINID), $(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), Redis $("$REDIS_SERVER" --version | awk '{print $3}' | tr -d 'v=')${RTT_MS:+, RTT_MS=$RTT_MS via relay}${EXTRA_ARGS:+, EXTRA_ARGS=\"$EXTRA_ARGS\"}."

# ---- the load ----
# run_load ARGS...: the measured load (OPS operations) with workload ARGS,
# from one process or PROCS at once; its line (merged) in LINE. Not in a
# subshell: the processes must be in PIDS while they run.
LINE=""
run_load() {
  if ((PROCS == 1)); then
    LINE="$(timeout 600 "$WORKLOAD_BIN" "$@" --ops "$OPS" 2>>"$WORK/workload.log")"
    return
  fi
  local i p rc=0 share start pids=()
  rm -f -- "$WORK"/proc-*
  # Every process connects, builds its key table, then waits for this.
  start=$(($(date +%s%3N) + 200 + 50 * PROCS))
  for ((i = 0; i < PROCS; i++)); do
    share=$((OPS / PROCS + (i < OPS % PROCS ? 1 : 0)))
    timeout 600 "$WORKLOAD_BIN" "$@" --ops "$share" --procs "$PROCS" --proc-index "$i" \
      --start-at "$start" --hist-out "$WORK/proc-$i.hist" >"$WORK/proc-$i.out" 2>"$WORK/proc-$i.err" &
    pids+=("$!"); PIDS+=("$!")
  done
  for p in "${pids[@]}"; do
    wait "$p" || rc=$?
    forget_pid "$p"
  done
  for ((i = 0; i < PROCS; i++)); do
    cat "$WORK/proc-$i.err" >>"$WORK/workload.log"
    if grep -q 'after --start-at' "$WORK/proc-$i.err"; then
      log "  warning: process $i: $(grep -m1 'after --start-at' "$WORK/proc-$i.err")"
    fi
  done
  ((rc == 0)) || return "$rc"
  local hists=()
  for ((i = 0; i < PROCS; i++)); do hists+=("$WORK/proc-$i.hist"); done
  LINE="$("$WORKLOAD_BIN" --merge "${hists[@]}" 2>>"$WORK/workload.log")"
}

# run_side ROUND TYPE DIST S KEYS WPCT SIDE: one measured run, a CSV row.
run_side() {
  local round="$1" type="$2" dist="$3" s="$4" keys="$5" w="$6" side="$7" target
  stop_sidecache
  populate "$type" "$keys"
  if [[ "$side" == direct ]]; then
    target="$UP"
  else
    start_sidecache "$side"
    target="$SC_PORT"
  fi
  local args=(--target "127.0.0.1:$target" --conns "$CONNS" --keys "$keys" --dist "$dist" --zipf-s "$s"
    --write-pct "$w" --value-size "$VALUE_SIZE" --type "$type" --pipeline "$PIPELINE" "${WLX[@]}")
  if ((WARM_OPS > 0)); then
    timeout 600 "$WORKLOAD_BIN" "${args[@]}" --ops "$WARM_OPS" >/dev/null 2>>"$WORK/workload.log" || die "warm-up failed"
  fi
  [[ "$side" == direct ]] || drain
  local m0="$WORK/m0" m1="$WORK/m1" c0="$WORK/c0" c1="$WORK/c1"
  : >"$m0"; : >"$m1"
  cmdstats >"$c0"
  local r0 s0 r1 s1 line
  r0="$(cpu_ns "$RPID")"; s0="$( [[ -n "$SC_PID" ]] && cpu_ns "$SC_PID" || echo 0)"
  [[ -n "$SC_PID" ]] && curl -fsS "http://127.0.0.1:$SC_MPORT/metrics" >"$m0"
  run_load "${args[@]}" ||
    die "workload failed: $type $dist s=$s keys=$keys w=$w side=$side (see $WORK/workload.log)"
  line="$LINE"
  [[ -n "$SC_PID" ]] && drain
  [[ -n "$SC_PID" ]] && curl -fsS "http://127.0.0.1:$SC_MPORT/metrics" >"$m1"
  r1="$(cpu_ns "$RPID")"; s1="$( [[ -n "$SC_PID" ]] && cpu_ns "$SC_PID" || echo 0)"
  cmdstats >"$c1"
  local ops errors nils
  ops="$(kv ops "$line")"; errors="$(kv errors "$line")"; nils="$(kv nils "$line")"
  ((errors == 0 && nils == 0)) || log "  warning: $errors error and $nils nil replies"
  # Redis's commands: Δ calls by command, less the first snapshot's INFO.
  local bycmd total
  bycmd="$(awk -v n="$ops" 'NR == FNR { a[$1] = $2; next } { d = $2 - a[$1]; if ($1 == "info") d -= 1; if (d > 0) { t += d; if (d / n >= 0.001) printf "%s:%.3f\n", $1, d / n } }
    END { printf "total %d\n", t }' "$c0" "$c1" | sort -t: -k2 -rn)"
  total="$(awk '$1 == "total" { print $2 }' <<<"$bycmd")"
  bycmd="$(grep -v '^total ' <<<"$bycmd" | tr '\n' ' ' | sed 's/ $//')"
  local hits="" misses="" up="" ratio="" upper="" sccpu=""
  if [[ -s "$m1" ]]; then
    hits=$(($(metric "$m1" sidecache_l1_hits_total) - $(metric "$m0" sidecache_l1_hits_total)))
    misses=$(($(metric "$m1" sidecache_l1_misses_total) - $(metric "$m0" sidecache_l1_misses_total)))
    up=$(($(metric "$m1" sidecache_upstream_commands_total) - $(metric "$m0" sidecache_upstream_commands_total)))
    ratio="$(awk -v h="$hits" -v m="$misses" 'BEGIN { if (h + m > 0) printf "%.4f", h / (h + m) }')"
    upper="$(awk -v u="$up" -v n="$ops" 'BEGIN { printf "%.3f", u / n }')"
    sccpu="$(awk -v a="$s0" -v b="$s1" -v n="$ops" 'BEGIN { printf "%.2f", (b - a) / 1e3 / n }')"
  fi
  local rcmd rcpu
  rcmd="$(awk -v c="$total" -v n="$ops" 'BEGIN { printf "%.3f", c / n }')"
  rcpu="$(awk -v a="$r0" -v b="$r1" -v n="$ops" 'BEGIN { printf "%.3f", (b - a) / 1e3 / n }')"
  echo "$round,$type,$dist,$s,$keys,$w,$side,$ops,$(kv secs "$line"),$(kv ops_per_s "$line"),$(kv p50_us "$line"),$(kv p99_us "$line"),$(kv p999_us "$line"),$(kv reads "$line"),$(kv writes "$line"),$errors,$nils,$hits,$misses,$ratio,$upper,$rcmd,$rcpu,$sccpu,$(kv set_p50_us "$line"),$(kv set_p99_us "$line"),$bycmd" >>"$RAW"
  printf '[workload]   %-6s %-5s %-7s s=%-4s keys=%-7s w=%-3s %-7s %7s ops/s p50 %6s p99 %7s hit %-6s redis cmd/op %s cpu/op %s µs\n' \
    "r$round" "$type" "$dist" "$s" "$keys" "$w" "$side" "$(kv ops_per_s "$line")" "$(kv p50_us "$line")" \
    "$(kv p99_us "$line")" "${ratio:--}" "$rcmd" "$rcpu" >&2
}

run_workloads() { # reads "TYPE DIST S KEYS WPCT" lines on stdin (not a pipe: it must run in this shell)
  local wl=() type dist s keys w round side
  while read -r type dist s keys w; do wl+=("$type $dist $s $keys $w"); done
  echo "round,type,dist,zipf_s,keys,write_pct,side,ops,secs,ops_per_s,p50_us,p99_us,p999_us,reads,writes,errors,nils,l1_hits,l1_misses,hit_ratio,sc_upstream_cmds_per_op,redis_cmds_per_op,redis_cpu_us_per_op,sc_cpu_us_per_op,set_p50_us,set_p99_us,redis_cmds_by_command" >"$RAW"
  local i=0 procs_note=""
  if ((PROCS > 1)); then procs_note=" × $PROCS processes"; fi
  for x in "${wl[@]}"; do
    i=$((i + 1))
    read -r type dist s keys w <<<"$x"
    log "workload $i/${#wl[@]}: $type $dist s=$s keys=$keys writes=$w% ($OPS ops, $CONNS conns$procs_note)"
    for ((round = 1; round <= ROUNDS; round++)); do
      # shellcheck disable=SC2046
      for side in $(rotate "$round" $SIDES); do
        run_side "$round" "$type" "$dist" "$s" "$keys" "$w" "$side"
      done
    done
  done
  stop_sidecache
}

report_load() { # report_load MATRIX(0|1)
  python3 - "$RAW" "$RESULTS_DIR/$PREFIX.md" "$HEADER" "$1" "$SIDES" <<'EOF'
import csv, statistics, sys
raw, out, header, matrix, sides = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5].split()
rows = list(csv.DictReader(open(raw)))
num = ["ops_per_s", "p50_us", "p99_us", "p999_us", "hit_ratio", "sc_upstream_cmds_per_op",
       "redis_cmds_per_op", "redis_cpu_us_per_op", "sc_cpu_us_per_op", "set_p50_us", "set_p99_us"]
groups, order = {}, []
for r in rows:
    wl = (r["type"], r["dist"], r["zipf_s"], int(r["keys"]), float(r["write_pct"]))
    if wl not in order:
        order.append(wl)
    groups.setdefault((wl, r["side"]), []).append(r)
def med(rs, k):
    v = [float(r[k]) for r in rs if r.get(k, "") != ""]
    return statistics.median(v) if v else None
def f(v, d=1):
    return "—" if v is None else f"{v:.{d}f}"
def name(wl):
    t, d, s, k, w = wl
    return f"{t} {d}{' s=' + s if d == 'zipf' else ''} {k:,} keys {w:g}% writes"
rounds = max(int(r["round"]) for r in rows)
L = [header, "", f"Medians over {rounds} round(s); latencies per round trip, µs; per op = per application operation.", "",
     "| workload | side | ops/s | p50 | p99 | p99.9 | SET p50 / p99 | L1 hit ratio | sidecache upstream cmds/op | Redis cmds/op | Redis CPU µs/op | sidecache CPU µs/op |",
     "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
for wl in order:
    for side in sides:
        rs = groups.get((wl, side))
        if not rs:
            continue
        m = {k: med(rs, k) for k in num}
        L.append(f"| {name(wl)} | {side} | {f(m['ops_per_s'], 0)} | {f(m['p50_us'])} | {f(m['p99_us'])} | {f(m['p999_us'])} | "
                 f"{f(m['set_p50_us'])} / {f(m['set_p99_us'])} | {f(m['hit_ratio'], 3)} | {f(m['sc_upstream_cmds_per_op'], 3)} | {f(m['redis_cmds_per_op'], 3)} | "
                 f"{f(m['redis_cpu_us_per_op'], 2)} | {f(m['sc_cpu_us_per_op'], 2)} |")
if "default" in sides and "bcast" in sides:
    L += ["", "Side by side (default = optin tracking):", "",
          "| workload | hit ratio default | hit ratio bcast | default/bcast | Redis cmds/op direct / default / bcast | Redis CPU µs/op direct / default / bcast | ops/s direct / default / bcast |",
          "|---|---:|---:|---:|---|---|---|"]
    for wl in order:
        g = {s: groups.get((wl, s), []) for s in ("direct", "default", "bcast")}
        hd, hb = med(g["default"], "hit_ratio") if g["default"] else None, med(g["bcast"], "hit_ratio") if g["bcast"] else None
        rat = f"{hd / hb:.3f}" if hd is not None and hb else "—"
        trio = lambda k, d: " / ".join(f(med(g[s], k), d) if g[s] else "—" for s in ("direct", "default", "bcast"))
        L.append(f"| {name(wl)} | {f(hd, 3)} | {f(hb, 3)} | {rat} | {trio('redis_cmds_per_op', 3)} | "
                 f"{trio('redis_cpu_us_per_op', 2)} | {trio('ops_per_s', 0)} |")
L += ["", "Redis commands per operation by command (round 1):", ""]
for wl in order:
    for side in sides:
        rs = groups.get((wl, side))
        if rs:
            L.append(f"- {name(wl)}, {side}: {rs[0]['redis_cmds_by_command']}")
open(out, "w").write("\n".join(L) + "\n")
EOF
}

# ---- staleness ----
run_staleness() {
  echo "round,side,writes,readers,samples,p50_us,p99_us,p999_us,max_us,mean_us,unseen,timeouts,before_ack,reads,stale_reads,stale_late,deadline_ms,backwards,nils,write_p50_us,read_p50_us,read_p99_us,read_p999_us,secs" >"$RAW"
  local round side target line
  for ((round = 1; round <= ROUNDS; round++)); do
    # shellcheck disable=SC2046
    for side in $(rotate "$round" $STALE_SIDES); do
      stop_sidecache
      [[ "$(redis-cli -p "$RP" flushall)" == OK ]] || die "FLUSHALL failed"
      if [[ "$side" == direct ]]; then
        target="$UP"
      else
        start_sidecache "$side"
        target="$SC_PORT"
      fi
      line="$(timeout 600 "$WORKLOAD_BIN" --staleness --target "127.0.0.1:$target" --writer "127.0.0.1:$UP" \
        --writes "$WRITES" --readers "$READERS" --hot-keys "$HOT_KEYS" --pause-ms "$PAUSE_MS" \
        --deadline-ms "$DEADLINE_MS" --value-size "$VALUE_SIZE" "${WLX[@]}" 2>>"$WORK/workload.log")" ||
        die "staleness run failed: side=$side (see $WORK/workload.log)"
      local row="$round,$side" k
      for k in writes readers samples p50_us p99_us p999_us max_us mean_us unseen timeouts before_ack reads stale_reads stale_late deadline_ms backwards nils write_p50_us read_p50_us read_p99_us read_p999_us secs; do
        row+=",$(kv "$k" "$line")"
      done
      echo "$row" >>"$RAW"
      log "  r$round $side: $line"
    done
  done
  stop_sidecache
  python3 - "$RAW" "$RESULTS_DIR/$PREFIX.md" "$HEADER" "$STALE_SIDES" <<'EOF'
import csv, sys
raw, out, header, sides = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
rows = list(csv.DictReader(open(raw)))
r0 = rows[0]
L = [header, "",
     f"One writer straight at Redis writes {r0['writes']} times, in turn over the hot keys (each value holds a sequence number); "
     f"{r0['readers']} readers poll the key being written through the side (GET, one at a time). After each acknowledgement "
     "the writer waits until every reader has seen the new value (at most 1 s), then pauses. Propagation: from the writer's "
     "acknowledgement to the end of a reader's first read returning the new value (0 if it came back before the acknowledgement; "
     "`before ack` counts those), one sample per write and reader. A stale read started after a newer write of its key was "
     "acknowledged yet returned an older value; `late` ones started more than "
     f"{r0['deadline_ms']} ms after that acknowledgement. `direct` (readers on Redis too) is the harness's own floor.", "",
     "| round | side | samples | propagation p50 µs | p99 µs | p99.9 µs | max µs | before ack | unseen | reads | stale reads | stale late | backwards | writer SET p50 µs | reader GET p50 / p99 / p99.9 µs |",
     "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
for r in rows:
    L.append(f"| {r['round']} | {r['side']} | {r['samples']} | {r['p50_us']} | {r['p99_us']} | {r['p999_us']} | {r['max_us']} | "
             f"{r['before_ack']} | {r['unseen']} | {r['reads']} | {r['stale_reads']} | {r['stale_late']} | {r['backwards']} | {r['write_p50_us']} | {r['read_p50_us']} / {r['read_p99_us']} / {r['read_p999_us']} |")
open(out, "w").write("\n".join(L) + "\n")
EOF
}

mkdir -p "$RESULTS_DIR"
case "$CMD" in
  run | write-heavy)
    run_workloads < <(for w in $WRITE_PCTS; do echo "$TYPE $DIST $ZIPF_S $KEYS $w"; done)
    HEADER+=" \`bench/workload.sh $CMD\` KEYS=$KEYS DIST=$DIST ZIPF_S=$ZIPF_S OPS=$OPS CONNS=$CONNS PROCS=$PROCS PIPELINE=$PIPELINE VALUE_SIZE=$VALUE_SIZE WARM_OPS=$WARM_OPS ROUNDS=$ROUNDS."
    report_load 0
    ;;
  matrix)
    run_workloads < <(
      for k in $MATRIX_KEYS; do for s in $MATRIX_S; do for w in $MATRIX_WRITES; do echo "string zipf $s $k $w"; done; done; done
      for k in $MATRIX_KEYS; do for s in $MATRIX_S; do for w in $MATRIX_HASH_WRITES; do echo "hash zipf $s $k $w"; done; done; done
    )
    HEADER+=" \`bench/workload.sh matrix\` OPS=$OPS CONNS=$CONNS PROCS=$PROCS PIPELINE=$PIPELINE VALUE_SIZE=$VALUE_SIZE WARM_OPS=$WARM_OPS ROUNDS=$ROUNDS."
    report_load 1
    ;;
  staleness)
    HEADER+=" \`bench/workload.sh staleness\` WRITES=$WRITES READERS=$READERS HOT_KEYS=$HOT_KEYS PAUSE_MS=$PAUSE_MS DEADLINE_MS=$DEADLINE_MS ROUNDS=$ROUNDS."
    run_staleness
    ;;
  sides)
    run_sides
    ;;
  curve)
    run_curve
    ;;
esac
[[ "$CMD" == sides || "$CMD" == curve ]] || cp "$RAW" "$RESULTS_DIR/$PREFIX-raw.csv"
cat "$RESULTS_DIR/$PREFIX.md"
FAILED=0
