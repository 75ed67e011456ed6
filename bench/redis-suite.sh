#!/usr/bin/env bash
# Runs units of Redis's own test suite (tests/unit/*.tcl, external-server
# mode) twice: once against a redis-server directly (the control: what
# fails there is due to the external-server mode itself), once through
# sidecache in front of an identical redis-server. Prints per unit the
# passed/failed counts both ways and the names of the tests that fail only
# through sidecache.
#
#   bench/redis-suite.sh [unit ...]          default: unit/multi
#   e.g. bench/redis-suite.sh unit/multi unit/type/incr unit/keyspace
#
# Each run gets a fresh redis-server (own port, temp dir,
# --save '' --appendonly no --enable-debug-command yes) and, for the proxied
# run, a fresh sidecache (--upstream redis://127.0.0.1:PORT, metrics on a
# random port, --log-level warn), so no run sees another's data or L1.
#
# The tests: those of the installed redis-server's version (redis-server
# --version, e.g. 7.0.15), taken with `git archive <tag> tests` from the git
# mirror at $REDIS_GIT (default /work/.mirror/redis+redis/repo; the closest
# older tag of the same minor version if the exact one is missing), or from
# $REDIS_TESTS (a directory holding tests/test_helper.tcl, e.g. a checkout
# of https://github.com/redis/redis at the server's tag). Without either it
# stops and says so: `git clone --branch 7.0.15 --depth 1
# https://github.com/redis/redis /tmp/redis-src && REDIS_TESTS=/tmp/redis-src
# bench/redis-suite.sh`.
#
# Replication stream: tests that check what Redis propagates
# (attach_to_replication_stream: a raw SYNC) cannot SYNC through sidecache
# (replication commands are refused: "-ERR replication commands cannot be
# proxied"). By default the script's copy of the tests reads the stream
# from the upstream redis-server directly (REDIS_SUITE_REPL_PORT), so those
# tests still check what sidecache's commands make Redis propagate;
# REPL_DIRECT=0 keeps the harness as is (they then fail with an exception).
#
# A test that raises a Tcl exception ends its whole unit in the harness;
# the script notes it ("exception", counted as failed), reruns the unit
# with --skiptest for it (and for the tests that failed before it in that
# run, which may have left the server broken), and goes on until the unit
# completes. Tests the
# harness itself skips for external servers (external:skip, needs:*
# options the harness cannot check, etc.) are not counted.
#
# Environment: SIDECACHE (binary; default target/release/sidecache, else
# target/debug/sidecache), SIDECACHE_ARGS (extra proxy flags),
# SUITE_ARGS (extra test_helper.tcl flags, e.g. "--tags -needs:repl"),
# SUITE_TIMEOUT (seconds per harness run, default 900), TEST_TIMEOUT
# (seconds the harness waits on one test, default 60: a test still waiting
# then is counted as failed, "timeout", and skipped on a rerun, as for an
# exception), KEEP=1 keeps the
# work directory (logs: <unit>.<mode>.<attempt>.log).
#
# Needs: tclsh 8.6, redis-server, redis-cli, git (for the mirror).
set -u

here=$(cd "$(dirname "$0")/.." && pwd)
UNITS=("$@")
[ ${#UNITS[@]} -eq 0 ] && UNITS=(unit/multi)

SIDECACHE=${SIDECACHE:-}
if [ -z "$SIDECACHE" ]; then
    if [ -x "$here/target/release/sidecache" ]; then SIDECACHE=$here/target/release/sidecache
    else SIDECACHE=$here/target/debug/sidecache; fi
fi
echo "sidecache: $SIDECACHE ${SIDECACHE_ARGS:-}"
[ -x "$SIDECACHE" ] || { echo "no sidecache binary at $SIDECACHE (set SIDECACHE=...)" >&2; exit 2; }
for t in tclsh redis-server redis-cli; do
    command -v $t >/dev/null || { echo "$t not found on PATH" >&2; exit 2; }
done

work=$(mktemp -d /tmp/redis-suite.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the tests -------------------------------------------------------------
version=$(redis-server --version | sed -n 's/.*v=\([0-9.]*\).*/\1/p')
REDIS_GIT=${REDIS_GIT:-/work/.mirror/redis+redis/repo}
if [ -n "${REDIS_TESTS:-}" ]; then
    [ -f "$REDIS_TESTS/tests/test_helper.tcl" ] || { echo "REDIS_TESTS=$REDIS_TESTS has no tests/test_helper.tcl" >&2; exit 2; }
    suite=$work/redis-tests
    mkdir -p "$suite"
    cp -r "$REDIS_TESTS/tests" "$suite/" || exit 2
elif [ -d "$REDIS_GIT" ]; then
    tag=$version
    if ! git -C "$REDIS_GIT" rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
        minor=${version%.*}
        tag=$( (git -C "$REDIS_GIT" tag -l "$minor.*"; echo "$version") | sort -V | sed -n "/^$version\$/{x;p;q};h")
        [ -n "$tag" ] || { echo "no tag $version or older $minor.x in $REDIS_GIT" >&2; exit 2; }
    fi
    suite=$work/redis-tests
    mkdir -p "$suite"
    git -C "$REDIS_GIT" archive "$tag" tests | tar -x -C "$suite" || exit 2
    echo "tests of redis $tag (server $version) from $REDIS_GIT"
else
    cat >&2 <<EOF
No Redis test suite: set REDIS_TESTS to a Redis source tree of version $version, e.g.
  git clone --branch $version --depth 1 https://github.com/redis/redis /tmp/redis-src
  REDIS_TESTS=/tmp/redis-src $0 ${UNITS[*]}
EOF
    exit 2
fi

if [ "${REPL_DIRECT:-1}" = 1 ]; then
    # attach_to_replication_stream: SYNC on $REDIS_SUITE_REPL_PORT when set.
    sed -i 's|set s \[socket \[srv 0 "host"\] \[srv 0 "port"\]\]|set s [socket [srv 0 "host"] [expr {[info exists ::env(REDIS_SUITE_REPL_PORT)] ? $::env(REDIS_SUITE_REPL_PORT) : [srv 0 "port"]}]]|' \
        "$suite/tests/test_helper.tcl"
    grep -q REDIS_SUITE_REPL_PORT "$suite/tests/test_helper.tcl" ||
        echo "warning: could not redirect attach_to_replication_stream; replication-stream tests will fail through sidecache" >&2
fi

free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 20000))
        (echo >/dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo $p; return; }
    done
    return 1
}

wait_ping() { # port
    for _ in $(seq 100); do
        [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ] && return 0
        sleep 0.1
    done
    return 1
}

start_redis() { # dir -> sets RPORT, RPID
    RPORT=$(free_port)
    mkdir -p "$1"
    redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no \
        --enable-debug-command yes --dir "$1" --logfile "$1/redis.log" &
    RPID=$!
    pids+=("$RPID")
    wait_ping "$RPORT" || { echo "redis-server on $RPORT did not start" >&2; exit 1; }
}

start_sidecache() { # upstream port, dir -> sets SPORT, SPID
    SPORT=$(free_port)
    # shellcheck disable=SC2086
    "$SIDECACHE" --listen "127.0.0.1:$SPORT" --upstream "redis://127.0.0.1:$1" \
        --metrics-listen 127.0.0.1:0 --log-level warn ${SIDECACHE_ARGS:-} >"$2/sidecache.log" 2>&1 &
    SPID=$!
    pids+=("$SPID")
    wait_ping "$SPORT" || { echo "sidecache on $SPORT did not start" >&2; cat "$2/sidecache.log" >&2; exit 1; }
}

# SIGTERM, then SIGKILL after 5 s: a test may leave a server that does
# not shut down (a timed-out one, mid-command).
stop() {
    kill "$1" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}

# run_unit UNIT MODE -> writes $work/<tag>.<mode>.{ok,err}
run_unit() {
    local unit=$1 mode=$2 tag=${1//\//_} dir port attempt=0 log
    local skips=() skipargs=()
    : >"$work/$tag.$mode.ok"; : >"$work/$tag.$mode.err"; : >"$work/$tag.$mode.exc"
    while :; do
        attempt=$((attempt + 1))
        dir=$work/$tag.$mode.$attempt
        start_redis "$dir"
        port=$RPORT
        local spid= repl=()
        if [ "$mode" = sidecache ]; then
            start_sidecache "$RPORT" "$dir"; port=$SPORT; spid=$SPID
            [ "${REPL_DIRECT:-1}" = 1 ] && repl=(env "REDIS_SUITE_REPL_PORT=$RPORT")
        fi
        log=$work/$tag.$mode.$attempt.log
        skipargs=()
        for s in "${skips[@]}"; do skipargs+=(--skiptest "$s"); done
        # shellcheck disable=SC2086
        (cd "$suite" && "${repl[@]}" timeout "${SUITE_TIMEOUT:-900}" tclsh tests/test_helper.tcl \
            --host 127.0.0.1 --port "$port" --single "$unit" --clients 1 \
            --timeout "${TEST_TIMEOUT:-60}" ${SUITE_ARGS:-} "${skipargs[@]}") \
            2>&1 | sed 's/\x1b\[[0-9;]*m//g' >"$log"
        # SIGKILL: a sidecache would otherwise spend --shutdown-timeout
        # draining writes to a server a test left broken.
        [ -n "$spid" ] && { kill -9 "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; }
        stop "$RPID"
        # Counts of the last attempt (it reran everything before the
        # skipped tests), plus the tests skipped for their exceptions.
        sed -n 's/^\[ok\]: \(.*\) ([0-9]* ms)$/\1/p' "$log" >"$work/$tag.$mode.ok"
        sed -n 's/^\[err\]: \(.*\) in tests\/.*$/\1/p' "$log" >"$work/$tag.$mode.err"
        cat "$work/$tag.$mode.exc" >>"$work/$tag.$mode.err"
        if grep -q '^\[exception\]' "$log"; then
            # The test that raised it: the first `test {NAME} ...` frame.
            local name
            name=$(sed -n 's/^"test {\(.*\)} {.*$/\1/p; s/^"test {\(.*\)}$/\1/p' "$log" | head -1)
            if [ -z "$name" ] || [ $attempt -ge 40 ]; then
                echo "  $unit ($mode): exception outside a test, unit not completed; see $log" >&2
                echo "(exception outside a test; unit not completed)" >>"$work/$tag.$mode.err"
                KEEP=1
                return
            fi
            echo "$name (exception: $(sed -n 's/^\[exception\]: Executing test client: //p' "$log" | head -1 | cut -c1-120))" >>"$work/$tag.$mode.exc"
            skips+=("$name")
            # A test that failed before it may have left the server broken
            # (e.g. a replica) and caused the exception: skipped as well
            # on the rerun, and still counted as failed.
            while IFS= read -r t; do
                [ -n "$t" ] || continue
                echo "$t" >>"$work/$tag.$mode.exc"
                skips+=("$t")
            done < <(sed -n 's/^\[err\]: \(.*\) in tests\/.*$/\1/p' "$log")
            continue
        fi
        if grep -q '^\[TIMEOUT\]' "$log"; then
            # A test that waited past TEST_TIMEOUT for a reply that never
            # came: the harness names it "(IN PROGRESS)"; skipped on the
            # rerun, counted as failed.
            local name
            name=$(sed -n 's/^.* => (IN PROGRESS) \(.*\)$/\1/p' "$log" | head -1)
            if [ -z "$name" ] || [ $attempt -ge 40 ]; then
                echo "  $unit ($mode): timeout outside a test, unit not completed; see $log" >&2
                echo "(timeout outside a test; unit not completed)" >>"$work/$tag.$mode.err"
                KEEP=1
                return
            fi
            echo "$name (timeout: no reply in ${TEST_TIMEOUT:-60} s)" >>"$work/$tag.$mode.exc"
            skips+=("$name")
            continue
        fi
        if ! grep -q 'All tests passed\|\[[0-9]*/[0-9]* done\]' "$log" && ! grep -q '^\[err\]' "$log"; then
            echo "  $unit ($mode): the harness did not finish (timeout?); see $log" >&2
            KEEP=1
        fi
        return
    done
}

# Test names of an .err file, without the exception note.
names() { sed 's/ (\(exception\|timeout\): .*)$//' "$1" | sort -u; }

status=0
for unit in "${UNITS[@]}"; do
    [ -f "$suite/tests/$unit.tcl" ] || { echo "no such unit: $unit" >&2; status=2; continue; }
    echo "== $unit"
    run_unit "$unit" direct
    run_unit "$unit" sidecache
    tag=${unit//\//_}
    for mode in direct sidecache; do
        printf '  %-9s passed %3d  failed %3d\n' "$mode" \
            "$(sort -u "$work/$tag.$mode.ok" | grep -c .)" "$(names "$work/$tag.$mode.err" | grep -c .)"
    done
    only=$(comm -13 <(names "$work/$tag.direct.err") <(names "$work/$tag.sidecache.err"))
    if [ -n "$only" ]; then
        status=1
        echo "  failing only through sidecache:"
        while IFS= read -r t; do
            line=$(grep -F -m1 -- "$t" "$work/$tag.sidecache.err")
            echo "    - $line"
        done <<<"$only"
    fi
    only=$(comm -23 <(names "$work/$tag.direct.err") <(names "$work/$tag.sidecache.err"))
    [ -n "$only" ] && { echo "  failing only directly:"; sed 's/^/    - /' <<<"$only"; }
done
exit $status
