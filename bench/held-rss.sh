#!/usr/bin/env bash
# The proxy's RSS with 10,000 held status polls open (users within endpoints.hold of the front,
# each poll waiting for its admission), or with IDLE=1 with 10,000 keep-alive connections that were
# each answered once (a NOT_IN_QUEUE status) and now wait: what a held poll costs beyond a
# connection. Needs release builds of waitroom and wrbench (bench/run.sh builds both) and python3.
# It ends with the RSS per connection against issue 41's goals: <= 6 kB a held poll, <= 3 kB an idle
# keep-alive connection, at 10,000 of them.
#
#   bench/held-rss.sh            # 10,000 held polls
#   IDLE=1 bench/held-rss.sh     # 10,000 idle keep-alive connections
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/waitroom}
WRB=${WRB:-${CARGO_TARGET_DIR:-$ROOT/target}/release/wrbench}
OUT=$(mktemp -d); cd "$OUT"
# The proxy and Redis go too when a step fails half-way (set -e), not only at the end.
trap 'kill "${P:-}" 2>/dev/null; redis-cli -p "${RP:-0}" shutdown nosave >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$OUT"' EXIT
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
RUST_LOG=info,waitroom::access=off $BIN --config $OUT/w.yaml 2>$OUT/w.log & P=$!
sleep 1.5
# Seeded after the first (empty) admission tick: nobody is admitted for an hour.
$WRB seed-queue --prefix held --count 10000 | redis-cli -p $RP --pipe >/dev/null
sleep 0.5
rss() { awk '/VmRSS/ {print $2}' /proc/$P/status; }
START=$(rss)
echo "rss at start: $START kB"
# shellcheck disable=SC2046
LINE=$(python3 "$ROOT/bench/open_polls.py" --port "$LP" --metrics-port "$MP" --count 10000 --pid "$P" $([ "${IDLE:-0}" = 1 ] || echo --held))
echo "$LINE"
if [ "${IDLE:-0}" = 1 ]; then what="idle keep-alive connection" goal=3; else what="held poll" goal=6; fi
awk -v start="$START" -v line="$LINE" -v what="$what" -v goal="$goal" 'BEGIN {
  if (!match(line, /rss: [0-9]+/)) { print "no RSS in the line above" > "/dev/stderr"; exit 1 }
  per = (substr(line, RSTART + 5, RLENGTH - 5) - start) / 10000
  printf "per %s: %.2f kB of RSS (goal <= %d kB at 10,000: %s)\n", what, per, goal, per <= goal ? "✓" : "✗"
}'
