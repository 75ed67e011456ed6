#!/usr/bin/env bash
# bench/ab.sh — two sidecache binaries (A = before, B = after) side by side
# against one throwaway Redis, with direct Redis as the reference, rounds
# interleaved (the order rotates every round). For "prove it before and
# after" on hot-path changes.
#
# Each target has a Redis of its own (same settings): direct Redis is
# measured with no sidecache attached, because an attached sidecache's
# tracking (Redis recording every written key for its broadcast, sidecache
# reading the invalidations) costs CPU on this shared machine during the
# direct run and would flatter the ratios.
#
#   bench/ab.sh /path/to/sidecache-before /path/to/sidecache-after
#
# Knobs: TESTS=set  PIPELINES="1 16"  ROUNDS=5  N=200000  CLIENTS=50
#        DATA_SIZE=64  KEYSPACE=100000  ARGS_A="" ARGS_B="" (extra flags)
# Prints one line per run and the medians: requests/s (and the ratio to
# direct Redis), redis-benchmark's p50 latency, and the CPU time the
# serving process used per million requests (redis-server for direct,
# sidecache for A and B; utime + stime from /proc/PID/stat), with the CPU
# of the Redis behind A and B per million requests beside it. Only
# processes it started are stopped (by pid).
set -euo pipefail
A="$1"; B="$2"
TESTS="${TESTS:-set}"; PIPELINES="${PIPELINES:-1 16}"; ROUNDS="${ROUNDS:-5}"
N="${N:-200000}"; CLIENTS="${CLIENTS:-50}"; DATA_SIZE="${DATA_SIZE:-64}"
KEYSPACE="${KEYSPACE:-100000}"
WORK="$(mktemp -d)"; PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
RP=$(port); RAP=$(port); RBP=$(port); AP=$(port); BP=$(port)
for p in "$RP" "$RAP" "$RBP"; do
  mkdir -p "$WORK/$p"
  redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/$p" >/dev/null 2>&1 & PIDS+=($!)
done
for p in "$RP" "$RAP" "$RBP"; do
  ok=0
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && { ok=1; break; }; sleep 0.1; done
  [ "$ok" = 1 ] || { echo "redis-server on port $p did not start" >&2; exit 1; }
done
# Two instances on one host: their metrics endpoints must not collide.
"$A" --listen "127.0.0.1:$AP" --upstream "redis://127.0.0.1:$RAP" --log-level warn \
  --metrics-listen 127.0.0.1:0 ${ARGS_A:-} >"$WORK/a.log" 2>&1 & PIDS+=($!)
"$B" --listen "127.0.0.1:$BP" --upstream "redis://127.0.0.1:$RBP" --log-level warn \
  --metrics-listen 127.0.0.1:0 ${ARGS_B:-} >"$WORK/b.log" 2>&1 & PIDS+=($!)
for p in "$AP" "$BP"; do
  ok=0
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && { ok=1; break; }; sleep 0.1; done
  if [ "$ok" != 1 ]; then
    echo "sidecache on port $p did not start:" >&2; cat "$WORK"/a.log "$WORK"/b.log >&2; exit 1
  fi
done
# Every key exists (GET measures hits, as bench/run.sh does), and before
# each GET run the target reads every key once (a warm L1).
VALUE="$(head -c "$DATA_SIZE" /dev/zero | tr '\0' x)"
awk -v n="$KEYSPACE" -v v="$VALUE" 'BEGIN { for (i = 0; i < n; i++) printf "SET key:%012d %s\r\n", i, v }' >"$WORK/fill.txt"
for p in "$RP" "$RAP" "$RBP"; do
  timeout 300 redis-cli -p "$p" --pipe <"$WORK/fill.txt" >/dev/null
done
awk -v n="$KEYSPACE" 'BEGIN { for (i = 0; i < n; i++) printf "GET key:%012d\r\n", i }' >"$WORK/warm.txt"
declare -A R L C U
names=(redis A B); ports=("$RP" "$AP" "$BP")
# pids: the serving process of each target, and the Redis behind it.
serving=("${PIDS[0]}" "${PIDS[3]}" "${PIDS[4]}"); behind=("${PIDS[0]}" "${PIDS[1]}" "${PIDS[2]}")
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ="$(getconf CLK_TCK)"
for round in $(seq "$ROUNDS"); do
  for t in ${TESTS//,/ }; do
    for P in $PIPELINES; do
      for i in 0 1 2; do
        j=$(( (i + round) % 3 ))
        if [ "$t" = get ]; then
          timeout 300 redis-cli -p "${ports[$j]}" --pipe <"$WORK/warm.txt" >/dev/null
        fi
        s0=$(ticks "${serving[$j]}"); b0=$(ticks "${behind[$j]}")
        csv=$(timeout 300 redis-benchmark -p "${ports[$j]}" -c "$CLIENTS" -d "$DATA_SIZE" -r "$KEYSPACE" \
              -n "$N" -P "$P" -t "$t" -q --csv 2>/dev/null | tail -1 | tr -d '"')
        # Write-behind: the CPU of landing the writes counts too.
        [ "$t" = set ] && [ "$j" != 0 ] && for _ in $(seq 50); do
          d=$(redis-cli -p "${ports[$j]}" info writebehind 2>/dev/null | awk -F: '/^write_queue_depth:/ {print $2+0}')
          [ "${d:-0}" = 0 ] && break; sleep 0.1
        done
        s1=$(ticks "${serving[$j]}"); b1=$(ticks "${behind[$j]}")
        rps=$(echo "$csv" | cut -d, -f2); p50=$(echo "$csv" | cut -d, -f5)
        cpu=$(awk -v a="$s0" -v b="$s1" -v n="$N" -v hz="$HZ" 'BEGIN {printf "%.2f", (b - a) / hz / n * 1e6}')
        up=$(awk -v a="$b0" -v b="$b1" -v n="$N" -v hz="$HZ" 'BEGIN {printf "%.2f", (b - a) / hz / n * 1e6}')
        echo "round $round ${names[$j]} $t -P $P: $rps rps, p50 $p50 ms, CPU s per 10^6: $cpu (its Redis $up)"
        R["${names[$j]}|$t|$P"]+="$rps "
        L["${names[$j]}|$t|$P"]+="$p50 "
        C["${names[$j]}|$t|$P"]+="$cpu "
        U["${names[$j]}|$t|$P"]+="$up "
        sleep 0.5
      done
    done
  done
done
echo
echo "medians: rps (ratio to redis) | p50 ms | CPU s per 10^6 requests of the serving process (of the Redis behind it)"
med() { echo "$1" | tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for t in ${TESTS//,/ }; do for P in $PIPELINES; do
  line="$t -P $P:"
  m_redis=$(med "${R["redis|$t|$P"]}")
  for n in redis A B; do
    m=$(med "${R["$n|$t|$P"]}")
    line+="  $n $m ($(python3 -c "print(f'{$m/$m_redis:.2f}')")x) | $(med "${L["$n|$t|$P"]}") | $(med "${C["$n|$t|$P"]}") ($(med "${U["$n|$t|$P"]}"))"
  done
  echo "$line"
done; done
