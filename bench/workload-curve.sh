# bench/workload-curve.sh — `bench/workload.sh curve`, sourced by
# bench/workload.sh after bench/workload-sides.sh (whose sides, clients,
# pinning and relay it uses). Latency against offered load, warm, open
# loop, as caches and latency are judged (YCSB's -target, memtier's
# --rate-limiting, wrk2):
#
# For each RTT of CURVE_RTTS (through bench's relay; 0 = loopback), each
# workload of CURVE_WORKLOADS and each N of CURVE_NS:
#   1. direct Redis's saturation S: N redis-py workers at rates rising by
#      CURVE_SEARCH_STEP from CURVE_SEARCH_FROM ops/s, SEARCH_SECS a cell,
#      until the p99 passes 5 ms; S is the first rate that passed it;
#   2. for each side of CURVE_SIDES (direct, sc-tcp, sc-unix, csc-py), a
#      fresh sidecache where the side has one, the cache warmed in a closed
#      loop until its hit ratio holds within 1 point over 5 s (the time
#      this took is its own column), then cells of CELL_SECS at
#      CURVE_SHARES of S (10, 25, 50, 75 and 90 %, then on), until the
#      side's p99 passes 5 ms.
# bench/clients/curve.py runs one side (its docstring spells the open loop
# and what is measured around each cell); bench/workload-curve-report.py
# makes the tables and the chart of p99 against offered load.
#
# Placement (PIN=1): the application's host is CPU 0 (workers, sidecache),
# the network and Redis's host CPU 1 (relay, Redis). Data: KEYS strings
# of VALUE_SIZE bytes and KEYS 10-field hashes (session), written once;
# Zipf ZIPF_S over them; sidecache with its default flags (a 256 MiB L1,
# smaller than the 10^6 × 1 KB data set) plus EXTRA_ARGS.
#
# Knobs: CURVE_RTTS="0.5 1" CURVE_WORKLOADS="b a session" CURVE_NS="32 8"
#        CURVE_SIDES="direct sc-tcp sc-unix csc-py" CELL_SECS=20 SEARCH_SECS=5
#        CURVE_SEARCH_FROM=500 CURVE_SEARCH_STEP=1.25
#        CURVE_SHARES="0.1 0.25 0.5 0.75 0.9 1 1.25 1.5 2 2.5 3 4"
#        WARM_MAX_SECS=600 CSC_MAX_ENTRIES=10000 (per worker) KEYS=1000000
#        VALUE_SIZE=1024 ZIPF_S=0.99 SESSION_WRITE_PCT=20 PIN=1
#        CHART_WORKLOAD=b CHART_RTT=0.5 CHART_N=32 MAX_LOAD=1 (wait, up to
#        5 min, for the 1-minute load average to fall under it first)
#        CURVE_S= (direct's saturation rate from an earlier run: no search;
#        the report then has no search rows and takes S from CURVE_S)
# Output: $RESULTS_DIR/workload-curve.md, -raw.csv, .png. About 20 minutes
# per (RTT, workload, N) with the default sides.

CURVE_RTTS="${CURVE_RTTS:-0.5 1}"
CURVE_WORKLOADS="${CURVE_WORKLOADS:-b a session}"
CURVE_NS="${CURVE_NS:-32 8}"
CURVE_SIDES="${CURVE_SIDES:-direct sc-tcp sc-unix csc-py}"
CELL_SECS="${CELL_SECS:-20}"
SEARCH_SECS="${SEARCH_SECS:-5}"
CURVE_SEARCH_FROM="${CURVE_SEARCH_FROM:-500}"
CURVE_SEARCH_STEP="${CURVE_SEARCH_STEP:-1.25}"
CURVE_SHARES="${CURVE_SHARES:-0.1 0.25 0.5 0.75 0.9 1 1.25 1.5 2 2.5 3 4}"
WARM_MAX_SECS="${WARM_MAX_SECS:-600}"
CHART_N="${CHART_N:-32}"
MAX_LOAD="${MAX_LOAD:-1}"
CURVE_S="${CURVE_S:-}" # a saturation rate to use instead of searching (one RTT, workload and N)

quiet_machine() { # waits (up to 5 min) for the load average to fall under MAX_LOAD
  local l
  for _ in $(seq 1 60); do
    l="$(cut -d' ' -f1 /proc/loadavg)"
    awk -v l="$l" -v m="$MAX_LOAD" 'BEGIN { exit !(l < m) }' && return 0
    sleep 5
  done
  log "warning: load average still $l (MAX_LOAD=$MAX_LOAD); the run goes on, the load is in the CSV"
}

# curve_side RTT WORKLOAD N SIDE LABEL RATES CELL_SECS: one launcher run.
curve_side() {
  local rtt="$1" wl="$2" n="$3" side="$4" label="$5" rates="$6" secs="$7" out="$8" sc=()
  [[ "$side" == csc-node ]] && die "curve: csc-node has no open-loop worker (bench/clients/curve.py is redis-py)"
  stop_sidecache
  side_target "$side"
  [[ -n "$SC_PID" ]] && sc=(--sc-pid "$SC_PID" --sc-metrics "http://127.0.0.1:$SC_MPORT/metrics")
  rm -rf -- "$WORK/curve-hist" && mkdir -p "$WORK/curve-hist"
  quiet_machine
  "${PIN_HOST[@]}" "$CLIENT_PY" "$SCRIPT_DIR/clients/curve.py" "${TARGET_ARGS[@]}" --procs "$n" --workload "$wl" \
    --keys "$KEYS" --zipf-s "$ZIPF_S" --value-size "$VALUE_SIZE" --session-write-pct "$SESSION_WRITE_PCT" \
    --rates "$rates" --cell-secs "$secs" --warm-max-secs "$WARM_MAX_SECS" --redis-port "$RP" --redis-pid "$RPID" \
    "${sc[@]}" --label "$label" --side "$side" --rtt-ms "$rtt" --hist-dir "$WORK/curve-hist" --out "$out" \
    --merge-bin "$WORKLOAD_BIN" \
    2>>"$WORK/clients.log" || { tail -n 20 "$WORK/clients.log" >&2; die "curve: $label failed (see $WORK/clients.log)"; }
  grep "^\[curve\] $label" "$WORK/clients.log" | tail -n 30 >&2 || true
  [[ -n "$SC_PID" ]] && drain
  stop_sidecache
}

run_curve() {
  local raw="$WORK/curve-raw.csv" search="$WORK/curve-search.csv" rtt wl n side s rates
  : >"$raw"; : >"$search"
  populate_both
  for rtt in $CURVE_RTTS; do
    start_relay "$rtt"
    for wl in $CURVE_WORKLOADS; do
      for n in $CURVE_NS; do
        if [[ -n "$CURVE_S" ]]; then
          s="$CURVE_S"
          log "rtt=$rtt ms, workload $wl, N=$n: S=$s ops/s (CURVE_S, no search)"
          printf '%s\n' "$(head -n 1 "$RESULTS_DIR/$PREFIX-search.csv" 2>/dev/null || true)" >"$search"
        else
          rates="$(awk -v f="$CURVE_SEARCH_FROM" -v s="$CURVE_SEARCH_STEP" 'BEGIN { r = f; for (i = 0; i < 40 && r < 1e6; i++) { printf "%.0f ", r; r *= s } }')"
          log "rtt=$rtt ms, workload $wl, N=$n: direct's saturation (cells of $SEARCH_SECS s from $CURVE_SEARCH_FROM ops/s, ×$CURVE_SEARCH_STEP)"
          curve_side "$rtt" "$wl" "$n" direct search "$rates" "$SEARCH_SECS" "$search"
          s="$(awk -F, -v r="$rtt" -v w="$wl" -v n="$n" '$1 == "search" && $5 == r && $3 == w && $4 == n && $12 > 5000 { print $7; exit }' "$search")"
          [[ -n "$s" ]] || die "direct never passed a p99 of 5 ms (raise CURVE_SEARCH_FROM or the step)"
          log "  direct's p99 passes 5 ms at $s ops/s offered"
        fi
        rates="$(awk -v s="$s" -v sh="$CURVE_SHARES" 'BEGIN { n = split(sh, a, " "); for (i = 1; i <= n; i++) printf "%.0f ", s * a[i] }')"
        for side in $CURVE_SIDES; do
          log "  $side: warm-up, then $rates ops/s, $CELL_SECS s each"
          curve_side "$rtt" "$wl" "$n" "$side" "$side" "$rates" "$CELL_SECS" "$raw"
        done
      done
    done
    if [[ -n "$RELAY_PID" ]]; then stop_pid "$RELAY_PID"; forget_pid "$RELAY_PID"; RELAY_PID=""; fi
  done
  cp "$raw" "$RESULTS_DIR/$PREFIX-raw.csv"
  cp "$search" "$RESULTS_DIR/$PREFIX-search.csv"
  HEADER+=" \`bench/workload.sh curve\` CURVE_RTTS=\"$CURVE_RTTS\" CURVE_WORKLOADS=\"$CURVE_WORKLOADS\" CURVE_NS=\"$CURVE_NS\" CELL_SECS=$CELL_SECS SEARCH_SECS=$SEARCH_SECS KEYS=$KEYS VALUE_SIZE=$VALUE_SIZE ZIPF_S=$ZIPF_S SESSION_WRITE_PCT=$SESSION_WRITE_PCT CSC_MAX_ENTRIES=$CSC_MAX_ENTRIES PIN=$PIN; redis-py $("$CLIENT_PY" -c 'import redis; print(redis.__version__)'); load average before the run $LOAD_BEFORE."
  python3 "$SCRIPT_DIR/workload-curve-report.py" --raw "$raw" --search "$search" --header "$HEADER" \
    --out "$RESULTS_DIR/$PREFIX.md" --chart "$RESULTS_DIR/$PREFIX.png" --chart-workload "$CHART_WORKLOAD" \
    --chart-rtt "$CHART_RTT" --chart-n "$CHART_N" ${CURVE_S:+--s "$CURVE_S"} || die "report failed"
}
