#!/usr/bin/env bash
# bench/failover.sh — what an application sees when a Redis Cluster master
# is killed (SIGKILL) under its reads: straight at the cluster with
# redis-py's cluster client, and through sidecache with and without
# --l1-stale-if-error, side by side in one run.
#
# For each side in SIDES, in that order, a fresh cluster: 6 redis-servers
# on free loopback ports (3 masters, 1 replica each; --save ''
# --appendonly no, cluster-node-timeout NODE_TIMEOUT_MS, a temporary
# directory), `redis-cli --cluster create … --cluster-replicas 1`, waited
# for (cluster_state:ok and 6 known nodes, 3 masters and 3 replicas on
# every node, every replica's master_link_status:up), KEYS keys fo:0 …
# fo:KEYS-1 = v0 … written directly (redis-py, pipelined) and waited for on
# the replicas (offsets equal). Then:
#   cluster  bench/failover_reader.py with redis.cluster.RedisCluster
#            (redis-py's defaults) straight at the cluster;
#   default  SIDECACHE_BIN --listen … --upstream redis://<first node>
#            --metrics-listen … (default flags otherwise), waited for (PING,
#            /readyz 200, a tracking channel up per master); the reader
#            through it with a standalone redis.Redis (socket_timeout=15);
#   stale    the same with --l1-stale-if-error 30s.
# The reader GETs every key twice (sidecache's L1 then holds them), then
# for DURATION seconds GETs fo:0 … in turn, one at a time, checking each
# value. KILL_AT seconds into that loop it sends SIGKILL to the master
# holding the most of the keys (DBSIZE; the same node every side, as slot
# assignment is the same), and the script polls that master's replica
# (INFO replication) every 100 ms until it reports role:master: "failover
# took" is from the kill to that poll. Every exception the client raises
# is one error (its time since the kill, and its first 80 characters); a
# reply other than v{i} is a wrong value; GETs over 100 ms are counted
# with their total time (the stall the application sees). Sidecache
# sides: /metrics scraped at the end (sidecache_failover_held_requests_total,
# sidecache_failover_absorbed_total by kind, sidecache_l1_stale_served_total,
# sidecache_failover_hold_duration_seconds _sum/_count; "—" where a build
# lacks the family).
#
# Knobs: SIDES="cluster default stale"  KEYS=300  DURATION=20 (s, the read
#        loop)  KILL_AT=2 (s into it)  NODE_TIMEOUT_MS=5000
#        SIDECACHE_BIN=$REPO/target/release/sidecache
#        PYTHON= (an interpreter with redis-py; default python3 if it has
#        it, else a venv at FO_VENV=/tmp/fo-venv, made and `pip install
#        redis`-ed if missing)
#        RESULTS_DIR=bench/results  PREFIX=failover
#        KEEP_WORKDIR=1 (keeps logs; always kept on failure)
# Output: $RESULTS_DIR/$PREFIX.md (table), $PREFIX-raw.csv (a row per side).
# Only processes this script started are stopped (by pid, on exit).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
SIDECACHE_BIN="${SIDECACHE_BIN:-$REPO_ROOT/target/release/sidecache}"
SIDES="${SIDES:-cluster default stale}"
KEYS="${KEYS:-300}"
DURATION="${DURATION:-20}"
KILL_AT="${KILL_AT:-2}"
NODE_TIMEOUT_MS="${NODE_TIMEOUT_MS:-5000}"
PYTHON="${PYTHON:-}"
FO_VENV="${FO_VENV:-/tmp/fo-venv}"
RESULTS_DIR="${RESULTS_DIR:-$SCRIPT_DIR/results}"
PREFIX="${PREFIX:-failover}"
KEEP_WORKDIR="${KEEP_WORKDIR:-0}"
READER="$SCRIPT_DIR/failover_reader.py"
export RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0

log() { printf '[failover] %s\n' "$*" >&2; }
die() { printf '[failover] error: %s\n' "$*" >&2; exit 1; }

for t in redis-server redis-cli python3 curl sha256sum timeout; do
  command -v "$t" >/dev/null || die "$t not found"
done
[[ -f "$READER" ]] || die "no reader at $READER"
for s in $SIDES; do
  case "$s" in cluster | default | stale) ;; *) die "unknown side $s (cluster, default, stale)" ;; esac
done
[[ "$KEYS" =~ ^[1-9][0-9]*$ ]] || die "KEYS must be a positive integer (got '$KEYS')"
awk -v d="$DURATION" -v k="$KILL_AT" 'BEGIN { exit !(k > 0 && d > k) }' || die "need 0 < KILL_AT < DURATION"
if [[ " $SIDES " == *" default "* || " $SIDES " == *" stale "* ]]; then
  [[ -x "$SIDECACHE_BIN" ]] || die "no sidecache binary at $SIDECACHE_BIN (cargo build --release -p sidecache, or SIDECACHE_BIN=…)"
fi
if [[ " $SIDES " == *" stale "* ]]; then
  "$SIDECACHE_BIN" --help 2>/dev/null | grep -q -- '--l1-stale-if-error' ||
    die "$SIDECACHE_BIN has no --l1-stale-if-error (leave stale out of SIDES)"
fi

# An interpreter with redis-py.
if [[ -z "$PYTHON" ]]; then
  if python3 -c 'import redis.cluster' 2>/dev/null; then
    PYTHON=python3
  else
    if ! "$FO_VENV/bin/python" -c 'import redis.cluster' 2>/dev/null; then
      log "redis-py missing: installing it in $FO_VENV"
      [[ -x "$FO_VENV/bin/python" ]] || python3 -m venv "$FO_VENV" || die "python3 -m venv $FO_VENV failed (python3-venv?)"
      "$FO_VENV/bin/pip" install -q redis >&2 || die "pip install redis failed"
    fi
    PYTHON="$FO_VENV/bin/python"
  fi
fi
"$PYTHON" -c 'import redis.cluster' 2>/dev/null || die "$PYTHON cannot import redis.cluster"
REDISPY="$("$PYTHON" -c 'import redis; print(redis.__version__)')"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/sidecache-failover.XXXXXX")"
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
# Free ports below the ephemeral range whose cluster bus port (+10000) is
# free too (as net.sh, replica-az.sh).
USED=" "
EPH_LOW="$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)"
PICKED=""
free_port() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick_port() {
  local p
  for _ in $(seq 1 500); do
    p=$((10000 + RANDOM % (EPH_LOW - 20000)))
    [[ "$USED" == *" $p "* || "$USED" == *" $((p + 10000)) "* ]] && continue
    free_port "$p" && free_port "$((p + 10000))" || continue
    USED+="$p $((p + 10000)) "; PICKED="$p"; return 0
  done
  die "no free port"
}
wait_ping() { # wait_ping NAME PID PORT LOG
  for _ in $(seq 1 300); do
    kill -0 "$2" 2>/dev/null || { tail -n 20 "$4" >&2; die "$1 exited during start-up"; }
    [[ "$(redis-cli -h 127.0.0.1 -p "$3" ping 2>/dev/null || true)" == PONG ]] && return 0
    sleep 0.1
  done
  die "$1 did not answer PING on $3"
}
info_field() { # info_field PORT SECTION FIELD
  redis-cli -h 127.0.0.1 -p "$1" info "$2" 2>/dev/null | tr -d '\r' | awk -F: -v f="$3" '$1 == f { print $2 }'
}
now_ms() { date +%s%3N; }

# ---- the cluster ----
# NODE_PORTS, NODE_PID[port]; stop_cluster stops whatever of it is left.
NODE_PORTS=()
declare -A NODE_PID=()
start_cluster() { # start_cluster DIR
  local dir="$1" p i
  NODE_PORTS=(); NODE_PID=()
  for i in 0 1 2 3 4 5; do
    pick_port; p="$PICKED"
    mkdir -p "$dir/n$p"
    redis-server --bind 127.0.0.1 --port "$p" --dir "$dir/n$p" --save '' --appendonly no \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout "$NODE_TIMEOUT_MS" \
      --repl-diskless-sync-delay 0 --daemonize no >"$dir/n$p.log" 2>&1 &
    NODE_PID[$p]=$!; PIDS+=("$!"); NODE_PORTS+=("$p")
    disown "$!" # no "Killed" notice for the victim; stop_pid still stops it (bash reaps it)
  done
  for p in "${NODE_PORTS[@]}"; do wait_ping "redis-$p" "${NODE_PID[$p]}" "$p" "$dir/n$p.log"; done
  redis-cli --cluster create $(printf '127.0.0.1:%s ' "${NODE_PORTS[@]}") --cluster-replicas 1 --cluster-yes \
    >"$dir/create.log" 2>&1 || { tail -n 20 "$dir/create.log" >&2; die "redis-cli --cluster create failed"; }
  local ok nodes
  for _ in $(seq 1 600); do
    ok=1
    for p in "${NODE_PORTS[@]}"; do
      [[ "$(redis-cli -p "$p" cluster info 2>/dev/null | tr -d '\r')" == *"cluster_state:ok"*"cluster_known_nodes:6"* ]] || { ok=0; break; }
      nodes="$(redis-cli -p "$p" cluster nodes 2>/dev/null)"
      [[ "$(awk '$3 ~ /master/ && $3 !~ /fail|handshake|noaddr/' <<<"$nodes" | wc -l)" == 3 &&
        "$(awk '$3 ~ /slave/ && $3 !~ /fail|handshake|noaddr/' <<<"$nodes" | wc -l)" == 3 ]] || { ok=0; break; }
      if [[ "$(info_field "$p" replication role)" == slave ]]; then
        [[ "$(info_field "$p" replication master_link_status)" == up ]] || { ok=0; break; }
      fi
    done
    ((ok)) && return 0
    sleep 0.1
  done
  die "the cluster in $dir never became ok (every node ok, 3 masters + 3 replicas, links up)"
}
stop_cluster() {
  local p
  for p in "${NODE_PORTS[@]}"; do stop_pid "${NODE_PID[$p]}"; forget_pid "${NODE_PID[$p]}"; done
  NODE_PORTS=(); NODE_PID=()
}
node_id() { redis-cli -p "$1" cluster myid | tr -d '\r'; }
replica_of() { # replica_of MASTER_PORT: the port of its replica
  local id
  id="$(node_id "$1")"
  redis-cli -p "$1" cluster nodes | awk -v id="$id" '$3 ~ /slave/ && $4 == id { split($2, a, "[:@]"); print a[2]; exit }'
}
wait_replicated() { # every replica's offset equal to its master's
  local p r mo ro
  for p in "${NODE_PORTS[@]}"; do
    [[ "$(info_field "$p" replication role)" == master ]] || continue
    r="$(replica_of "$p")"
    for _ in $(seq 1 100); do
      mo="$(info_field "$p" replication master_repl_offset)"
      ro="$(info_field "$r" replication slave_repl_offset)"
      [[ -n "$mo" && "$mo" == "$ro" ]] && continue 2
      sleep 0.1
    done
    die "replica $r did not catch up with master $p"
  done
}

# ---- sidecache ----
SC_PID=""; SC_PORT=""; SC_MPORT=""
stop_sidecache() {
  [[ -n "$SC_PID" ]] || return 0
  stop_pid "$SC_PID"; forget_pid "$SC_PID"; SC_PID=""
}
start_sidecache() { # start_sidecache SIDE SEED_PORT LOG
  local args=()
  [[ "$1" == stale ]] && args=(--l1-stale-if-error 30s)
  pick_port; SC_PORT="$PICKED"; pick_port; SC_MPORT="$PICKED"
  "$SIDECACHE_BIN" --listen "127.0.0.1:$SC_PORT" --upstream "redis://127.0.0.1:$2" \
    --metrics-listen "127.0.0.1:$SC_MPORT" "${args[@]}" >"$3" 2>&1 &
  SC_PID=$!; PIDS+=("$SC_PID")
  wait_ping "sidecache ($1)" "$SC_PID" "$SC_PORT" "$3"
  local info
  for _ in $(seq 1 300); do
    if [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$SC_MPORT/readyz" || true)" == 200 ]]; then
      info="$(redis-cli -p "$SC_PORT" info coherence 2>/dev/null | tr -d '\r')"
      # A tracking channel per master (builds without the field: readyz alone).
      [[ "$info" != *"tracking_channels_up:"* || "$info" =~ tracking_channels_up:[3-9] ]] && return 0
    fi
    sleep 0.1
  done
  die "sidecache ($1) never ready (readyz, tracking channels)"
}

# ---- one side ----
run_side() { # run_side SIDE
  local side="$1" dir="$WORK/$1"
  mkdir -p "$dir"
  log "$side: starting a cluster (cluster-node-timeout $NODE_TIMEOUT_MS ms)"
  start_cluster "$dir"
  local seed="${NODE_PORTS[0]}"
  "$PYTHON" "$READER" populate --port "$seed" --keys "$KEYS" 2>"$dir/populate.log" ||
    { cat "$dir/populate.log" >&2; die "populate failed"; }
  wait_replicated
  # The master holding the most keys, and its replica.
  local p n victim="" most=-1 rep
  for p in "${NODE_PORTS[@]}"; do
    [[ "$(info_field "$p" replication role)" == master ]] || continue
    n="$(redis-cli -p "$p" dbsize | tr -d '\r')"
    if ((n > most)); then most="$n"; victim="$p"; fi
  done
  rep="$(replica_of "$victim")"
  [[ -n "$rep" ]] || die "no replica found for master $victim"
  log "$side: seed $seed; the victim: master $victim (pid ${NODE_PID[$victim]}, $most keys), replica $rep"

  local target client=standalone
  if [[ "$side" == cluster ]]; then
    target="$seed"; client=cluster
  else
    start_sidecache "$side" "$seed" "$dir/sidecache.log"
    target="$SC_PORT"
  fi
  local stamp="$dir/kill.ms" out="$dir/reader.json"
  rm -f -- "$stamp" "$out"
  timeout $((${DURATION%.*} + 120)) "$PYTHON" "$READER" read --client "$client" --port "$target" --keys "$KEYS" \
    --duration "$DURATION" --kill-at "$KILL_AT" --kill-pid "${NODE_PID[$victim]}" --kill-stamp "$stamp" \
    --out "$out" 2>"$dir/reader.log" &
  local rpid=$!; PIDS+=("$rpid")
  # From the kill: poll the replica every 100 ms until it is a master.
  local failover="" kill_ms t
  while [[ ! -s "$stamp" ]]; do
    kill -0 "$rpid" 2>/dev/null || break
    sleep 0.02
  done
  if [[ -s "$stamp" ]]; then
    kill_ms="$(cat "$stamp")"
    log "$side: master $victim killed; polling replica $rep"
    while kill -0 "$rpid" 2>/dev/null; do
      t="$(now_ms)"
      if [[ "$(info_field "$rep" replication role)" == master ]]; then
        failover="$(awk -v a="$t" -v b="$kill_ms" 'BEGIN { printf "%.1f", (a - b) / 1000 }')"
        log "$side: replica $rep is master ${failover} s after the kill"
        break
      fi
      sleep 0.1
    done
  fi
  local rc=0
  wait "$rpid" || rc=$?
  forget_pid "$rpid"
  ((rc == 0)) || { cat "$dir/reader.log" >&2; die "$side: the reader failed (exit $rc)"; }
  [[ -s "$out" ]] || die "$side: the reader wrote no summary"
  [[ -n "$failover" ]] || log "$side: warning: replica $rep was not master by the end of the reads"
  : >"$dir/metrics"
  if [[ -n "$SC_PID" ]]; then
    curl -fsS "http://127.0.0.1:$SC_MPORT/metrics" >"$dir/metrics" || log "$side: warning: /metrics scrape failed"
  fi
  stop_sidecache
  stop_cluster
  printf 'side=%s\nfailover_s=%s\nvictim=%s\nvictim_keys=%s\nreplica=%s\nseed=%s\n' \
    "$side" "$failover" "$victim" "$most" "$rep" "$seed" >"$dir/side.env"
  log "$side: $("$PYTHON" -c 'import json, sys; d = json.load(open(sys.argv[1])); print("%(reads)s reads, %(errors)s errors, %(wrong_values)s wrong values, longest read %(longest_read_s)s s" % d)' "$out")"
}

REV="$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
BINID="$(sha256sum "$SIDECACHE_BIN" 2>/dev/null | cut -c1-12 || echo none)"
REDISV="$(redis-server --version | awk '{print $3}' | tr -d 'v=')"
HEADER="Run $(date -u +%Y-%m-%dT%H:%MZ), repo $REV, SIDECACHE_BIN=$SIDECACHE_BIN (sha256 $BINID), $(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), Redis $REDISV, redis-py $REDISPY. \`bench/failover.sh\` SIDES=\"$SIDES\" KEYS=$KEYS DURATION=$DURATION KILL_AT=$KILL_AT NODE_TIMEOUT_MS=$NODE_TIMEOUT_MS."
log "redis $REDISV, redis-py $REDISPY ($PYTHON), sidecache $SIDECACHE_BIN; work dir $WORK"

for side in $SIDES; do run_side "$side"; done

mkdir -p "$RESULTS_DIR"
"$PYTHON" - "$WORK" "$RESULTS_DIR/$PREFIX.md" "$RESULTS_DIR/$PREFIX-raw.csv" "$HEADER" $SIDES <<'EOF'
import csv, json, re, sys
work, md, raw, header, sides = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
ABSORB_KINDS = ["clusterdown", "tryagain", "loading", "unreachable", "connection_lost"]

def metrics(path):
    """Prometheus text: {name: [(labels dict, value)]}; None when empty (no sidecache)."""
    try:
        text = open(path).read()
    except OSError:
        return None
    if not text.strip():
        return None
    m = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        mm = re.match(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)', line)
        if not mm:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', mm.group(2) or ""))
        m.setdefault(mm.group(1), []).append((labels, float(mm.group(3))))
    return m

def total(m, name):
    if m is None or name not in m:
        return None
    s = sum(v for _, v in m[name])
    return int(s) if s == int(s) and not name.endswith("_sum") else s

def num(v, d=0):
    if v is None or v == "":
        return "—"
    return f"{v:.{d}f}" if d else f"{int(round(v))}"

fields = ["side", "reads", "errors", "wrong_values", "reads_per_s", "first_error_s", "last_error_s",
          "errors_before_kill", "longest_read_s", "longest_read_end_s", "slow_reads", "slow_read_s", "failover_s", "victim_port", "victim_keys",
          "replica_port", "seed_port", "held", "absorbed", "stale_served", "hold_sum_s", "hold_count",
          "distinct_errors", "top_errors", "errors_by_second", "wrong_examples"]
rows = []
for side in sides:
    env = dict(l.split("=", 1) for l in open(f"{work}/{side}/side.env").read().splitlines() if "=" in l)
    r = json.load(open(f"{work}/{side}/reader.json"))
    m = metrics(f"{work}/{side}/metrics")
    held = total(m, "sidecache_failover_held_requests_total")
    if m is not None and "sidecache_failover_absorbed_total" in m:
        by = {l.get("kind", "?"): v for l, v in m["sidecache_failover_absorbed_total"]}
        kinds = ABSORB_KINDS + sorted(k for k in by if k not in ABSORB_KINDS)
        absorbed = " ".join(f"{k}={int(by.get(k, 0))}" for k in kinds)
    else:
        absorbed = None
    rows.append({
        "side": side, "reads": r["reads"], "errors": r["errors"], "wrong_values": r["wrong_values"],
        "reads_per_s": r["reads_per_s"], "first_error_s": r["first_error_s"], "last_error_s": r["last_error_s"],
        "errors_before_kill": r["errors_before_kill"], "longest_read_s": r["longest_read_s"],
        "longest_read_end_s": r["longest_read_end_s"], "slow_reads": r["slow_reads"], "slow_read_s": r["slow_read_s"],
        "failover_s": env.get("failover_s", ""),
        "victim_port": env["victim"], "victim_keys": env["victim_keys"], "replica_port": env["replica"],
        "seed_port": env["seed"], "held": held, "absorbed": absorbed,
        "stale_served": total(m, "sidecache_l1_stale_served_total"),
        "hold_sum_s": total(m, "sidecache_failover_hold_duration_seconds_sum"),
        "hold_count": total(m, "sidecache_failover_hold_duration_seconds_count"),
        "distinct_errors": r["distinct_errors"],
        "top_errors": " | ".join(f"{n}× {t}" for t, n in r["top_errors"]),
        "errors_by_second": " ".join(f"{s}:{n}" for s, n in r["errors_by_second"]),
        "wrong_examples": " ".join(r["wrong_examples"]),
    })

with open(raw, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    for row in rows:
        w.writerow({k: ("" if row[k] is None else row[k]) for k in fields})

def cell(t):
    return "—" if not t else t.replace("|", "\\|")

victims = "; ".join(f"{r['side']}: port {r['victim_port']}, {r['victim_keys']} keys, "
                    f"{'the seed' if r['victim_port'] == r['seed_port'] else 'seed ' + r['seed_port']}, replica {r['replica_port']}"
                    for r in rows)
L = [header, "",
     "A 3-master cluster (1 replica each, cluster-node-timeout as above), fresh for each side; the master holding the "
     f"most keys ({victims}; the seed is the cluster client's startup node and sidecache's --upstream) is SIGKILLed "
     "KILL_AT seconds into a loop of GETs, one at a time. Error times are "
     "seconds after the kill, when the client raised them; \"failover took\": from the kill until the replica reports "
     "role:master (polled every 100 ms). held: sidecache_failover_held_requests_total (hold duration sum / count); "
     "absorbed: sidecache_failover_absorbed_total by kind; stale served: sidecache_l1_stale_served_total; "
     "\"—\": no sidecache, or a build without the metric.", "",
     "| side | reads | errors | first error (s after kill) | last error | failover took (s) | held | absorbed | stale served | top errors |",
     "|---|---:|---:|---:|---:|---:|---|---|---:|---|"]
for r in rows:
    held = num(r["held"])
    if r["held"] is not None and r["hold_count"] is not None:
        held += f" ({num(r['hold_sum_s'], 2)} s / {num(r['hold_count'])})"
    L.append(f"| {r['side']} | {r['reads']} | {r['errors']} | {num(r['first_error_s'], 2)} | {num(r['last_error_s'], 2)} | "
             f"{r['failover_s'] or '—'} | {held} | {cell(r['absorbed'])} | {num(r['stale_served'])} | {cell(r['top_errors'])} |")
L += ["", "The reader's side of it (reads/s over the whole loop; the longest single GET, and when it ended, s after the kill; "
      "GETs over 100 ms, errors or not, and the time they took together; errors per second after the kill, as second:count):", "",
      "| side | reads/s | wrong values | errors before the kill | longest read (s) | ended at (s) | reads > 100 ms (total s) | errors by second |",
      "|---|---:|---:|---:|---:|---:|---:|---|"]
for r in rows:
    L.append(f"| {r['side']} | {r['reads_per_s']} | {r['wrong_values']}{(' (' + r['wrong_examples'] + ')') if r['wrong_examples'] else ''} | "
             f"{r['errors_before_kill']} | {r['longest_read_s']} | {r['longest_read_end_s']} | {r['slow_reads']} ({r['slow_read_s']}) | "
             f"{cell(r['errors_by_second'])} |")
open(md, "w").write("\n".join(L) + "\n")
EOF
cat "$RESULTS_DIR/$PREFIX.md"
FAILED=0
