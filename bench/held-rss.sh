#!/usr/bin/env bash
# The proxy's RSS with 10,000 held status polls open (users within endpoints.hold of the front,
# each poll waiting for its admission), or with IDLE=1 with 10,000 keep-alive connections that were
# each answered once (a NOT_IN_QUEUE status) and now wait: what a held poll costs beyond a
# connection. Needs release builds of waitroom and wrbench (bench/run.sh builds both) and python3.
#
#   bench/held-rss.sh            # 10,000 held polls
#   IDLE=1 bench/held-rss.sh     # 10,000 idle keep-alive connections
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/waitroom}
WRB=${WRB:-$ROOT/target/release/wrbench}
OUT=$(mktemp -d); cd "$OUT"
P="" RP=""
# A failed step (set -e) still stops the proxy and Redis: left running, they also keep the
# caller's stdout open.
cleanup() {
  [ -z "$P" ] || kill "$P" 2>/dev/null || true
  [ -z "$RP" ] || redis-cli -p "$RP" shutdown nosave >/dev/null 2>&1 || true
  [ -n "${KEEP:-}" ] || rm -rf "$OUT"
}
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
[ "$(ulimit -n)" -ge 10100 ] || { echo "ulimit -n is $(ulimit -n): 10,000 connections need more" >&2; exit 1; }
# shellcheck source=../scripts/lib.sh
. "$ROOT/scripts/lib.sh"
read -r RP LP MP <<<"$(free_ports 3)"
redis-server --port $RP --save '' --appendonly no --daemonize yes --logfile $OUT/redis.log
sleep 0.5
cat > $OUT/w.yaml <<Y
listen: "127.0.0.1:$LP"
metrics_listen: "127.0.0.1:$MP"
upstream: "127.0.0.1:9"
redis: { url: "redis://127.0.0.1:$RP", key_prefix: held }
admission: { interval: 1h, batch_size: 10000 }
endpoints: { hold: 60s }
queue: { capacity: 2000000 }
limits: { max_connections: 30000 }
Y
RUST_LOG=info,waitroom::access=off $BIN --config $OUT/w.yaml >/dev/null 2>$OUT/w.log & P=$!
sleep 1.5
# Seeded after the first (empty) admission tick: nobody is admitted for an hour.
$WRB seed-queue --prefix held --count 10000 | redis-cli -p $RP --pipe >/dev/null
sleep 0.5
rss() { awk '/VmRSS/ {print $2}' /proc/$P/status; }
echo "rss at start: $(rss) kB"
# shellcheck disable=SC2046
python3 "$ROOT/bench/open_polls.py" --port "$LP" --metrics-port "$MP" --count 10000 --pid "$P" $([ "${IDLE:-0}" = 1 ] || echo --held)
