#!/usr/bin/env bash
# deploy/quickstart.sh as a user runs it, for deploy/check.sh: start a
# 3-master cluster and sidecache, use it, `status`, `stop`; then standalone.
# Run inside a network namespace of its own (`unshare --net`), so that the
# quickstart's fixed ports (7000-7002, 17000-17002, 6380, 9121) are its own.
#   quickstart.sh SIDECACHE_BIN WORK_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
export SIDECACHE_BIN=$1 SIDECACHE_QUICKSTART_DIR=$2/quickstart STOP_TIMEOUT=20
ok() { echo "ok   $*"; [ -z "${DEPLOY_CHECK_TALLY:-}" ] || echo >>"$DEPLOY_CHECK_TALLY"; }
die() { echo "FAIL: $*" >&2; exit 1; }
trap 'deploy/quickstart.sh stop >/dev/null 2>&1 || true' EXIT

for mode in cluster standalone; do
  deploy/quickstart.sh "$mode" >"$2/quickstart-$mode.out" 2>&1 \
    || { cat "$2/quickstart-$mode.out" >&2; die "quickstart.sh $mode"; }
  [ "$(redis-cli -p 6380 set check:quickstart "$mode")" = OK ] || die "$mode: SET through sidecache"
  [ "$(redis-cli -p 6380 get check:quickstart)" = "$mode" ] || die "$mode: GET through sidecache"
  [ "$(redis-cli -s "$SIDECACHE_QUICKSTART_DIR/sidecache.sock" ping)" = PONG ] || die "$mode: the socket"
  status=$(deploy/quickstart.sh status)
  grep -q "answers PING" <<<"$status" || die "$mode: status says: $status"
  pids=$(cat "$SIDECACHE_QUICKSTART_DIR"/*.pid)
  deploy/quickstart.sh stop >"$2/quickstart-stop.out" 2>&1 || die "quickstart.sh stop"
  for pid in $pids; do
    ! kill -0 "$pid" 2>/dev/null || die "$mode: pid $pid still running after stop"
  done
  ok "quickstart.sh $mode: cluster/server and sidecache up, SET/GET on :6380, the socket, status; stop ends all $(wc -w <<<"$pids") processes"
done
