#!/usr/bin/env bash
# bench/hop.sh — what sidecache's hop adds to a forwarded command, one
# client: direct Redis against one or more sidecache binaries (A/B), all
# behind bench's `relay` (RTT/2 each way) or on plain loopback, rounds
# interleaved with the order rotating, pinned as `bench/net.sh` pins
# (latbench and sidecache on APP_CPU, relay and Redises on REMOTE_CPU).
# Each target has a Redis of its own (sidecache's tracking costs the
# direct runs nothing). Reports, per test and target, the median p50 and
# the per-round difference to direct Redis (the same round's direct run).
#
#   bench/hop.sh LABEL=BIN[,ARG,ARG...] ...
#   e.g. bench/hop.sh before=/tmp/sidecache-old after=target/release/sidecache
#        bench/hop.sh on=target/release/sidecache off=target/release/sidecache,--tracking,off
#
# Knobs: RTT=0.5 (ms; "none": no relay, plain loopback)  ROUNDS=7  SECS=1
#        TESTS="incr get-miss set-wt" (set-wt: SET with --write-mode
#        write-through added to the sidecache targets)
#        NEIGHBOUR=none|dd  (dd: `dd if=/dev/zero of=/dev/null bs=32M` on
#        APP_CPU during the run, a cache-thrashing neighbour like a build)
#        APP_CPU=0 REMOTE_CPU=1  OUT=file (markdown table appended)
# Needs target/release/{latbench,relay} (cargo build --release -p sidecache-bench).
# Only processes this script started are stopped (by pid).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
T="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release"
RTT="${RTT:-0.5}"; ROUNDS="${ROUNDS:-7}"; SECS="${SECS:-1}"
TESTS="${TESTS:-incr get-miss set-wt}"; NEIGHBOUR="${NEIGHBOUR:-none}"
APP_CPU="${APP_CPU:-0}"; REMOTE_CPU="${REMOTE_CPU:-1}"; OUT="${OUT:-}"
(($# >= 1)) || { echo "usage: bench/hop.sh LABEL=BIN[,ARG...] ..." >&2; exit 2; }
for b in "$T/latbench" "$T/relay"; do [[ -x "$b" ]] || { echo "$b not built" >&2; exit 1; }; done
APP=(taskset -c "$APP_CPU"); REMOTE=(taskset -c "$REMOTE_CPU")
W="$(mktemp -d)"; PIDS=()
cleanup() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[i]}" 2>/dev/null || true
    wait "${PIDS[i]}" 2>/dev/null || true
  done
  rm -rf -- "$W"
}
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ready() { for _ in $(seq 100); do [[ "$(redis-cli -p "$1" ping 2>/dev/null)" == PONG ]] && return 0; sleep 0.1; done; echo "port $1 not ready" >&2; exit 1; }
redis() { # redis NAME: a Redis of its own on REMOTE_CPU
  local p; p="$(port)"; mkdir -p "$W/$1"
  "${REMOTE[@]}" redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$W/$1" >/dev/null 2>&1 &
  PIDS+=($!); ready "$p"; RPORT["$1"]="$p"
}
declare -A RPORT=() VIA=() ADDR=()
LABELS=(direct); ROUTES=()
redis direct
TARGETS=()
for v in "$@"; do
  l="${v%%=*}"; TARGETS+=("$l"); redis "$l"
  [[ " $TESTS " == *" set-wt "* ]] && redis "$l-wt"
done
for r in "${!RPORT[@]}"; do
  if [[ "$RTT" == none ]]; then VIA["$r"]="${RPORT[$r]}"; else
    p="$(port)"; VIA["$r"]="$p"; ROUTES+=(--route "127.0.0.1:$p=127.0.0.1:${RPORT[$r]}")
  fi
done
if [[ "$RTT" != none ]]; then
  "${REMOTE[@]}" "$T/relay" --delay-us "$(awk -v r="$RTT" 'BEGIN { printf "%d", r * 500 }')" "${ROUTES[@]}" >"$W/relay.log" 2>&1 &
  PIDS+=($!); ready "${VIA[direct]}"
fi
ADDR[direct]="${VIA[direct]}"
start() { # start LABEL REDIS BIN [ARGS...]
  local l="$1" r="$2" bin="$3" p; shift 3; p="$(port)"
  "${APP[@]}" "$bin" --listen "127.0.0.1:$p" --upstream "redis://127.0.0.1:${VIA[$r]}" --log-level warn \
    --metrics-listen 127.0.0.1:0 "$@" >"$W/$l.log" 2>&1 &
  PIDS+=($!); ready "$p"; ADDR["$l"]="$p"
}
for v in "$@"; do
  l="${v%%=*}"; IFS=, read -r -a parts <<<"${v#*=}"
  start "$l" "$l" "${parts[@]}"
  [[ " $TESTS " == *" set-wt "* ]] && start "$l-wt" "$l-wt" "${parts[@]}" --write-mode write-through
  LABELS+=("$l")
done
if [[ "$NEIGHBOUR" == dd ]]; then
  "${APP[@]}" dd if=/dev/zero of=/dev/null bs=32M 2>/dev/null &
  PIDS+=($!)
fi
RAW="$W/raw.csv"
for test in $TESTS; do
  args=(--test incr --keyspace 100000)
  case "$test" in
    incr) ;;
    get-miss) args=(--test get --keyspace 100000000) ;;
    set-wt) args=(--test set --keyspace 100000) ;;
    *) echo "unknown test $test" >&2; exit 2 ;;
  esac
  for ((round = 1; round <= ROUNDS; round++)); do
    for ((k = 0; k < ${#LABELS[@]}; k++)); do
      l="${LABELS[$(((k + round) % ${#LABELS[@]}))]}"; a="$l"
      [[ "$test" == set-wt && "$l" != direct ]] && a="$l-wt"
      line="$("${APP[@]}" "$T/latbench" --addr "127.0.0.1:${ADDR[$a]}" "${args[@]}" --clients 1 --seconds "$SECS")"
      echo "$test,$round,$l,$line" >>"$RAW"
      printf '[hop] %-8s round %d %-10s %s\n' "$test" "$round" "$l" "$line" >&2
    done
  done
done
HEADER="$(date -u +%Y-%m-%dT%H:%MZ), RTT=$RTT ms, ROUNDS=$ROUNDS, SECS=$SECS, NEIGHBOUR=$NEIGHBOUR, load average $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$RAW" "$HEADER" "${TARGETS[@]}" <<'PY' | tee -a "${OUT:-/dev/null}"
import sys, csv, statistics as st, collections
raw, header, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
d = collections.defaultdict(dict)
tests = []
for test, rnd, label, rps, p50, p99, mean, *_ in csv.reader(open(raw)):
    if test not in tests: tests.append(test)
    d[(test, label)][int(rnd)] = (float(p50), float(p99), float(mean))
print(f"\n{header}\n")
print("| test | direct p50 | " + " | ".join(f"{t} p50 | {t} − direct (per round)" for t in targets) + " |")
print("|---|---:|" + "---:|---:|" * len(targets))
for test in tests:
    base = d[(test, "direct")]
    row = [test, f"{st.median(v[0] for v in base.values()):.1f}"]
    for t in targets:
        v = d[(test, t)]
        diffs = sorted(v[r][0] - base[r][0] for r in v if r in base)
        row += [f"{st.median(x[0] for x in v.values()):.1f}",
                f"**{st.median(diffs):+.1f}** ({diffs[0]:+.0f} … {diffs[-1]:+.0f})"]
    print("| " + " | ".join(row) + " |")
PY
