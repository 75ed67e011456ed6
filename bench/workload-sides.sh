# bench/workload-sides.sh — `bench/workload.sh sides`, sourced by
# bench/workload.sh (which owns Redis, the relay's start, sidecache's start
# and the helpers used here). What an application's N worker processes see
# and cost, side by side, in one run:
#
#   direct    N workers (CLIENT: redis-py, or node-redis) straight at Redis
#   sc-tcp    N workers at one sidecache over TCP (its L1 shared by all)
#   sc-unix   the same over sidecache's Unix socket
#   csc-py    N redis-py workers straight at Redis, each with its own
#             client-side cache (cache_config, RESP3; Redis >= 7.4)
#   csc-node  N node-redis workers, each with its own clientSideCache
#
# for each RTT of SIDES_RTTS (0.5 ms through bench's relay, 0 = loopback),
# each workload of SIDES_WORKLOADS (YCSB a, b, c, f and a session store;
# bench/clients/wl_client.py's docstring spells them) and each N of
# SIDES_NS. One Redis (7.4: the one redis-py's cache needs) for every side;
# KEYS strings of VALUE_SIZE bytes and KEYS 10-field hashes written once
# before the first run (writes overwrite them with values of the same
# size). With PIN=1 the application's host is CPU 0 (workers, sidecache)
# and the network and Redis's host CPU 1 (relay, Redis), as net.sh.
#
# A run: a fresh sidecache for sc-*, N workers started together
# (--start-at), WARM_SECS of the workload uncounted (every cache starts
# empty), then SECS measured; around the measured window (wall clock): Redis's
# commandstats and CPU, the CPU of every worker process and sidecache, their
# RSS at its end. Per operation: ops/s, latency p50/p99/p99.9 (`workload
# --merge` of the workers' histograms), the hit ratio (sidecache's L1
# metrics; for csc-*: 1 − GET/HGETALL Redis ran / reads the workers sent),
# Redis commands, Redis CPU, host CPU (workers + sidecache). Then, per side
# and N, the staleness probe: N readers poll one key through the side
# (every POLL_US), a writer straight at Redis SETs it STALE_WRITES times
# STALE_PAUSE_MS apart; per write, the time from the writer's
# acknowledgement until every reader had read the new value.
#
# Knobs: SIDES_RTTS="0.5 0" SIDES_WORKLOADS="a b c f session"
#        SIDES_SIDES="direct sc-tcp sc-unix csc-py csc-node" SIDES_NS="1 8 32"
#        CLIENT=py|node (the workers of direct/sc-*) KEYS=1000000 VALUE_SIZE=1024
#        ZIPF_S=0.99 WARM_SECS=1 SECS=2 TAIL_SECS=0.7 SESSION_WRITE_PCT=20
#        CSC_MAX_ENTRIES=10000 (per worker) STALE=1 (0: no staleness probe) SIDES_LOAD=1
#        (0: the staleness probe only) STALE_WRITES=40
#        STALE_PAUSE_MS=25 POLL_US=200 PIN=1 CHART=1 CHART_WORKLOAD=b
#        CHART_RTT=0.5 EXTRA_ARGS (sidecache flags)
# Output: $RESULTS_DIR/workload-sides.md, -raw.csv, -stale-raw.csv, .png

SIDES_RTTS="${SIDES_RTTS:-0.5 0}"
SIDES_WORKLOADS="${SIDES_WORKLOADS:-a b c f session}"
SIDES_SIDES="${SIDES_SIDES:-direct sc-tcp sc-unix csc-py csc-node}"
SIDES_NS="${SIDES_NS:-1 8 32}"
CLIENT="${CLIENT:-py}"
WARM_SECS="${WARM_SECS:-1}"
SECS="${SECS:-2}"
TAIL_SECS="${TAIL_SECS:-0.7}" # the load goes on, uncounted, while the window's end is read
SESSION_WRITE_PCT="${SESSION_WRITE_PCT:-20}"
CSC_MAX_ENTRIES="${CSC_MAX_ENTRIES:-10000}"
STALE="${STALE:-1}"
SIDES_LOAD="${SIDES_LOAD:-1}" # 0: the staleness probe only
STALE_WRITES="${STALE_WRITES:-40}"
STALE_PAUSE_MS="${STALE_PAUSE_MS:-25}"
POLL_US="${POLL_US:-200}"
PIN="${PIN:-1}"
CHART="${CHART:-1}"
CHART_WORKLOAD="${CHART_WORKLOAD:-b}"
CHART_RTT="${CHART_RTT:-0.5}"

sides_setup() { # the clients and Redis 7.4; the CPU pinning
  local out
  out="$("$SCRIPT_DIR/clients/setup.sh")" || die "bench/clients/setup.sh failed"
  eval "$out"
  REDIS_SERVER="$REDIS74"
  command -v node >/dev/null || die "node not found"
  if [[ "$PIN" == 1 && "$(nproc)" -ge 2 ]]; then
    command -v taskset >/dev/null || die "taskset not found (PIN=0 to run unpinned)"
    PIN_HOST=(taskset -c 0); PIN_REMOTE=(taskset -c 1)
  fi
}

now_ms() { date +%s%3N; }

populate_both() { # KEYS strings and KEYS 10-field hashes, written once, straight to Redis
  log "populating $KEYS strings of $VALUE_SIZE bytes and $KEYS 10-field hashes"
  [[ "$(redis-cli -p "$RP" flushall)" == OK ]] || die "FLUSHALL failed"
  local t
  for t in string hash; do
    "$WORKLOAD_BIN" --target "127.0.0.1:$RP" --populate --ops 0 --conns 4 --type "$t" --keys "$KEYS" \
      --value-size "$VALUE_SIZE" 2>>"$WORK/populate.log" || die "populate failed (see $WORK/populate.log)"
  done
}

start_relay() { # start_relay RTT_MS: UP is where clients reach Redis (the relay, RTT_MS/2 each way; 0: Redis itself)
  UP="$RP"
  [[ "$1" != 0 ]] || return 0
  pick_port; UP="$PICKED"
  "${PIN_REMOTE[@]}" "$RELAY_BIN" --delay-us "$(awk -v r="$1" 'BEGIN { printf "%d", r * 500 }')" \
    --route "127.0.0.1:$UP=unix:$WORK/redis.sock" >"$WORK/relay-$1.log" 2>&1 &
  RELAY_PID=$!; PIDS+=("$RELAY_PID")
  wait_ping relay "$RELAY_PID" "$UP"
}
secs_ms() { awk -v s="$1" 'BEGIN { printf "%d", s * 1000 }'; } # (awk's %d stops at 2^31: no Unix ms through it)
sleep_until() { # sleep_until UNIX_MS
  local d
  d="$(awk -v t="$1" -v n="$(now_ms)" 'BEGIN { d = (t - n) / 1000; if (d > 0) printf "%.3f", d; else print 0 }')"
  sleep "$d"
}
# One read of every process's file (a fork per process took long enough,
# under 32 busy workers on the same core, that some had exited meanwhile).
sum_ticks() { # utime + stime of every pid
  local p f=(); for p in "$@"; do f+=("/proc/$p/stat"); done
  cat "${f[@]}" 2>/dev/null | awk '{ sub(/^.*\) /, ""); s += $12 + $13 } END { print s + 0 }'
}
sum_rss() { # VmRSS of every pid, kB
  local p f=(); for p in "$@"; do f+=("/proc/$p/status"); done
  cat "${f[@]}" 2>/dev/null | awk '/^VmRSS:/ { s += $2 } END { print s + 0 }'
}
sum_calls() { awk '{ s += $2 } END { print s + 0 }' "$1"; }
calls_of() { # calls_of FILE CMD...: calls of these commands in a cmdstats snapshot
  local f="$1"; shift
  awk -v want=" $* " 'index(want, " " $1 " ") { s += $2 } END { print s + 0 }' "$f"
}

# start_workers KIND N MODE START_MS ARGS...: N worker processes of the side's
# client (KIND py or node): every pid to measure in WPIDS, the ones this
# shell waits for in WCHILDREN (a py launcher, which reaps the workers it
# forked and fails if one did).
WPIDS=(); WCHILDREN=()
start_workers() {
  local kind="$1" n="$2" mode="$3" start="$4" i kids
  shift 4
  WPIDS=(); WCHILDREN=()
  if [[ "$kind" == py ]]; then
    : >"$WORK/launcher.out"
    "${PIN_HOST[@]}" "$CLIENT_PY" "$SCRIPT_DIR/clients/wl_client.py" "$mode" --procs "$n" --start-at "$start" "$@" \
      >"$WORK/launcher.out" 2>>"$WORK/clients.log" &
    WCHILDREN+=("$!"); PIDS+=("$!")
    for _ in $(seq 1 500); do [[ -s "$WORK/launcher.out" ]] && break; sleep 0.02; done
    read -r -a kids <"$WORK/launcher.out" || die "the Python launcher printed no pids (see $WORK/clients.log)"
    WPIDS=("${WCHILDREN[@]}" "${kids[@]}")
  else
    for ((i = 0; i < n; i++)); do
      (cd "$CLIENT_NODE_DIR" && exec "${PIN_HOST[@]}" node wl_client.mjs "$mode" --proc-index "$i" --start-at "$start" "$@") \
        2>>"$WORK/clients.log" &
      WCHILDREN+=("$!"); PIDS+=("$!")
    done
    WPIDS=("${WCHILDREN[@]}")
  fi
}
wait_workers() {
  local p rc=0
  for p in "${WCHILDREN[@]}"; do
    wait "$p" || rc=$?
    forget_pid "$p"
  done
  return "$rc"
}

# side_target SIDE: starts what the side needs; sets TARGET_ARGS and KIND.
side_target() {
  SC_UNIX=""
  case "$1" in
    direct) TARGET_ARGS=(--target "127.0.0.1:$UP"); KIND="$CLIENT" ;;
    sc-tcp) start_sidecache default; TARGET_ARGS=(--target "127.0.0.1:$SC_PORT"); KIND="$CLIENT" ;;
    sc-unix)
      SC_UNIX="$WORK/sc-$((NSC + 1)).sock"; start_sidecache default
      TARGET_ARGS=(--unix "$SC_UNIX"); KIND="$CLIENT" ;;
    csc-py) TARGET_ARGS=(--target "127.0.0.1:$UP" --csc --csc-max-entries "$CSC_MAX_ENTRIES"); KIND=py ;;
    csc-node) TARGET_ARGS=(--target "127.0.0.1:$UP" --csc --csc-max-entries "$CSC_MAX_ENTRIES"); KIND=node ;;
    *) die "unknown side $1 (direct sc-tcp sc-unix csc-py csc-node)" ;;
  esac
}
spawn_ms() { # spawn_ms KIND N: how far ahead to set --start-at
  if [[ "$1" == py ]]; then echo $((700 + 20 * $2)); else echo $((700 + 300 * $2)); fi
}

sides_run_one() { # sides_run_one RTT WORKLOAD SIDE N
  local rtt="$1" wl="$2" side="$3" n="$4" start t1 t2 i
  stop_sidecache
  side_target "$side"
  rm -f -- "$WORK"/proc-*
  start=$(($(now_ms) + $(spawn_ms "$KIND" "$n")))
  t1=$((start + $(secs_ms "$WARM_SECS")))
  t2=$((t1 + $(secs_ms "$SECS")))
  start_workers "$KIND" "$n" load "$start" "${TARGET_ARGS[@]}" --workload "$wl" --keys "$KEYS" --zipf-s "$ZIPF_S" \
    --value-size "$VALUE_SIZE" --session-write-pct "$SESSION_WRITE_PCT" --warm-secs "$WARM_SECS" --secs "$SECS" --tail-secs "$TAIL_SECS" \
    --hist-dir "$WORK"
  local procs=("${WPIDS[@]}") c0="$WORK/c0" c1="$WORK/c1" m0="$WORK/m0" m1="$WORK/m1"
  [[ -n "$SC_PID" ]] && procs+=("$SC_PID")
  : >"$m0"; : >"$m1"
  sleep_until "$t1"
  local r0 h0 r1 h1 rss
  h0="$(sum_ticks "${procs[@]}")"; r0="$(ticks "$RPID")"; cmdstats >"$c0"
  [[ -n "$SC_PID" ]] && curl -fsS "http://127.0.0.1:$SC_MPORT/metrics" >"$m0"
  sleep_until "$t2"
  h1="$(sum_ticks "${procs[@]}")"; rss="$(sum_rss "${procs[@]}")"; r1="$(ticks "$RPID")"; cmdstats >"$c1"
  [[ -n "$SC_PID" ]] && curl -fsS "http://127.0.0.1:$SC_MPORT/metrics" >"$m1"
  wait_workers || die "a worker failed: $wl $side N=$n (see $WORK/clients.log)"
  local hists=() line
  for ((i = 0; i < n; i++)); do
    [[ -s "$WORK/proc-$i.hist" ]] || die "worker $i wrote no report ($wl $side N=$n; see $WORK/clients.log)"
    hists+=("$WORK/proc-$i.hist")
  done
  line="$("$WORKLOAD_BIN" --merge "${hists[@]}")"
  local ops rcmds rreads total rcalls late errors hit=""
  ops="$(kv ops "$line")"; errors="$(kv errors "$line")"
  rcmds="$(cat "$WORK"/proc-*.extra | tr ' ' '\n' | awk -F= '$1 == "read_cmds" { s += $2 } END { print s + 0 }')"
  late="$(cat "$WORK"/proc-*.extra | tr ' ' '\n' | awk -F= '$1 == "late_ms" && $2 > m { m = $2 } END { print m + 0 }')"
  awk -v l="$late" 'BEGIN { exit !(l > 50) }' && log "  warning: a worker started ${late} ms after --start-at"
  ((errors == 0)) || log "  warning: $errors errors"
  total=$(($(sum_calls "$c1") - $(sum_calls "$c0") - 1)) # less the first snapshot's INFO
  rreads=$(($(calls_of "$c1" get hgetall) - $(calls_of "$c0" get hgetall)))
  if [[ -s "$m1" ]]; then
    local hits misses
    hits=$(($(metric "$m1" sidecache_l1_hits_total) - $(metric "$m0" sidecache_l1_hits_total)))
    misses=$(($(metric "$m1" sidecache_l1_misses_total) - $(metric "$m0" sidecache_l1_misses_total)))
    hit="$(awk -v h="$hits" -v m="$misses" 'BEGIN { if (h + m > 0) printf "%.4f", h / (h + m) }')"
  elif [[ "$side" == csc-* ]]; then
    hit="$(awk -v r="$rreads" -v c="$rcmds" 'BEGIN { if (c > 0) { h = 1 - r / c; if (h < 0) h = 0; printf "%.4f", h } }')"
  else
    hit="0"
  fi
  local per="BEGIN { printf \"%.3f\", v / n }"
  local cpu="BEGIN { printf \"%.2f\", v / t * 1e6 / n }"
  echo "$rtt,$wl,$side,$KIND,$n,$ops,$(kv secs "$line"),$(kv ops_per_s "$line"),$(kv p50_us "$line"),$(kv p99_us "$line"),$(kv p999_us "$line"),$errors,$hit,$(awk -v v="$total" -v n="$ops" "$per"),$(awk -v v="$rreads" -v n="$ops" "$per"),$(awk -v v=$((r1 - r0)) -v n="$ops" -v t="$TCK" "$cpu"),$(awk -v v=$((h1 - h0)) -v n="$ops" -v t="$TCK" "$cpu"),$((rss / 1024)),$late" >>"$SRAW"
  printf '[workload]   rtt=%-3s %-7s %-8s N=%-2s %6s ops/s p50 %7s p99 %7s p99.9 %7s hit %-6s redis cmd/op %s\n' \
    "$rtt" "$wl" "$side" "$n" "$(kv ops_per_s "$line")" "$(kv p50_us "$line")" "$(kv p99_us "$line")" \
    "$(kv p999_us "$line")" "${hit:--}" "$(awk -v v="$total" -v n="$ops" "$per")" >&2
  [[ -n "$SC_PID" ]] && drain
  stop_sidecache
}

sides_stale_one() { # sides_stale_one RTT SIDE N
  local rtt="$1" side="$2" n="$3" start wstart until
  stop_sidecache
  side_target "$side"
  rm -rf -- "$WORK/stale" && mkdir -p "$WORK/stale"
  start=$(($(now_ms) + $(spawn_ms "$KIND" "$n")))
  wstart=$((start + 500))
  until=$((wstart + $(awk -v w="$STALE_WRITES" -v p="$STALE_PAUSE_MS" 'BEGIN { printf "%d", w * (p + 2) + 700 }')))
  start_workers "$KIND" "$n" stale-reader "$start" "${TARGET_ARGS[@]}" --until-ms "$until" --poll-us "$POLL_US" \
    --out-dir "$WORK/stale"
  "${PIN_HOST[@]}" "$CLIENT_PY" "$SCRIPT_DIR/clients/wl_client.py" stale-writer --target "127.0.0.1:$UP" \
    --start-at "$wstart" --writes "$STALE_WRITES" --pause-ms "$STALE_PAUSE_MS" --out "$WORK/stale/writes.txt" \
    2>>"$WORK/clients.log" || die "the staleness writer failed (see $WORK/clients.log)"
  wait_workers || die "a staleness reader failed: $side N=$n (see $WORK/clients.log)"
  local line
  line="$(python3 - "$WORK/stale" "$n" <<'EOF'
import glob, os, sys
d, n = sys.argv[1], int(sys.argv[2])
acks = [tuple(map(int, l.split())) for l in open(os.path.join(d, "writes.txt")) if l.strip()]
readers = []
for f in sorted(glob.glob(os.path.join(d, "reader-*.txt"))):
    readers.append([tuple(map(int, l.split())) for l in open(f) if l.strip()])
# Writes acknowledged before every reader's first read (a reader that
# started late) are left out: they would time the reader's start.
ready = max((tr[0][1] for tr in readers if tr), default=0)
worst, unseen, skipped = [], 0, 0
for seq, ack in acks:
    if ack < ready:
        skipped += 1
        continue
    w = 0
    for tr in readers:
        t = next((t for s, t in tr if s >= seq), None)
        if t is None:
            unseen += 1
            w = None
            break
        w = max(w, t - ack)
    if w is not None:
        worst.append(max(w, 0) / 1000)
worst.sort()
q = lambda p: worst[min(len(worst) - 1, int(p * len(worst)))] if worst else float("nan")
print(f"writes={len(acks) - skipped} readers={len(readers)} p50_us={q(0.5):.0f} p99_us={q(0.99):.0f} max_us={(worst[-1] if worst else float('nan')):.0f} unseen={unseen}")
EOF
)"
  echo "$rtt,$side,$KIND,$n,$(kv writes "$line"),$(kv readers "$line"),$(kv p50_us "$line"),$(kv p99_us "$line"),$(kv max_us "$line"),$(kv unseen "$line")" >>"$STRAW"
  log "  staleness rtt=$rtt $side N=$n: $line"
  stop_sidecache
}

SRAW=""; STRAW="" # the CSVs, in the work directory
run_sides() {
  SRAW="$WORK/sides-raw.csv"; STRAW="$WORK/sides-stale-raw.csv"
  echo "rtt_ms,workload,side,client,procs,ops,secs,ops_per_s,p50_us,p99_us,p999_us,errors,hit_ratio,redis_cmds_per_op,redis_reads_per_op,redis_cpu_us_per_op,host_cpu_us_per_op,host_rss_mb,late_ms" >"$SRAW"
  echo "rtt_ms,side,client,procs,writes,readers,p50_us,p99_us,max_us,unseen" >"$STRAW"
  if [[ "$SIDES_LOAD" == 0 ]]; then SIDES_WORKLOADS=""; CHART=0; fi
  populate_both
  local rtt wl n side k=0
  for rtt in $SIDES_RTTS; do
    start_relay "$rtt"
    for wl in $SIDES_WORKLOADS; do
      for n in $SIDES_NS; do
        k=$((k + 1))
        log "rtt=$rtt ms, workload $wl, N=$n"
        # shellcheck disable=SC2046
        for side in $(rotate "$k" $SIDES_SIDES); do sides_run_one "$rtt" "$wl" "$side" "$n"; done
      done
    done
    if [[ "$STALE" == 1 ]]; then
      for n in $SIDES_NS; do
        for side in $SIDES_SIDES; do sides_stale_one "$rtt" "$side" "$n"; done
      done
    fi
    if [[ -n "$RELAY_PID" ]]; then stop_pid "$RELAY_PID"; forget_pid "$RELAY_PID"; RELAY_PID=""; fi
  done
  cp "$SRAW" "$RESULTS_DIR/$PREFIX-raw.csv"
  [[ "$STALE" == 1 ]] && cp "$STRAW" "$RESULTS_DIR/$PREFIX-stale-raw.csv"
  RAW="$SRAW"
  HEADER+=" \`bench/workload.sh sides\` SIDES_RTTS=\"$SIDES_RTTS\" SIDES_NS=\"$SIDES_NS\" KEYS=$KEYS VALUE_SIZE=$VALUE_SIZE ZIPF_S=$ZIPF_S WARM_SECS=$WARM_SECS SECS=$SECS CLIENT=$CLIENT PIN=$PIN SESSION_WRITE_PCT=$SESSION_WRITE_PCT CSC_MAX_ENTRIES=$CSC_MAX_ENTRIES STALE_WRITES=$STALE_WRITES STALE_PAUSE_MS=$STALE_PAUSE_MS POLL_US=$POLL_US; redis-py $("$CLIENT_PY" -c 'import redis; print(redis.__version__)'), node-redis $(node -p "require('$CLIENT_NODE_DIR/node_modules/redis/package.json').version"), node $(node --version)."
  python3 "$SCRIPT_DIR/workload-sides-report.py" --header "$HEADER" --raw "$SRAW" --stale "$STRAW" \
    --out "$RESULTS_DIR/$PREFIX.md" || die "report failed"
  if [[ "$CHART" == 1 ]]; then
    python3 "$SCRIPT_DIR/workload-sides-report.py" --raw "$SRAW" --stale "$STRAW" --chart "$RESULTS_DIR/$PREFIX.png" \
      --chart-workload "$CHART_WORKLOAD" --chart-rtt "$CHART_RTT" --header "$HEADER" || log "warning: no chart (gnuplot?)"
  fi
}
