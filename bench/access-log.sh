#!/usr/bin/env bash
# What the access log costs: status of one waiting user (wrk/status_one.lua) through a proxy with
# the access log on (RUST_LOG=info, lines to a file) and one with it off, interleaved rounds; with
# OLD=<binary>, the same pair for that binary too, in the same rounds (a before/after).
#
#   bench/access-log.sh                              # target/release/waitroom
#   OLD=/path/to/older/waitroom bench/access-log.sh  # and an older build beside it
#
# Prints requests/s per round and proxy, then each binary's on/off ratio of the means.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NEW=${NEW:-$ROOT/target/release/waitroom}
ROUNDS=${ROUNDS:-4} SECONDS_EACH=${SECONDS_EACH:-6}
OUT=$(mktemp -d); cd "$OUT"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; redis-cli -p "$RP" shutdown nosave >/dev/null 2>&1; rm -rf "$OUT"' EXIT
# shellcheck source=../scripts/lib.sh
. "$ROOT/scripts/lib.sh"
RP=$(free_ports 1)
redis-server --port "$RP" --save '' --appendonly no --daemonize yes --logfile "$OUT/redis.log"
sleep 0.5
declare -A PORT
start() { # NAME BIN RUST_LOG [extra yaml]
  local port metrics
  read -r port metrics <<<"$(free_ports 2)"
  printf 'listen: "127.0.0.1:%s"\nmetrics_listen: "127.0.0.1:%s"\nupstream: "127.0.0.1:9"\nredis: { url: "redis://127.0.0.1:%s", key_prefix: alog }\nadmission: { interval: 1h, batch_size: 1 }\n%s\n' \
    "$port" "$metrics" "$RP" "${4:-}" >"$1.yaml"
  RUST_LOG=$3 "$2" --config "$1.yaml" 2>"$1.log" &
  PIDS+=($!) PORT[$1]=$port
}
# Held polls off where the binary knows them: the user measured is near enough the front to be held.
start new-on "$NEW" info 'endpoints: { hold: 0s }'
start new-off "$NEW" info,waitroom::access=off 'endpoints: { hold: 0s }'
names=(new-on new-off)
if [ -n "${OLD:-}" ]; then
  start old-on "$OLD" info; start old-off "$OLD" info,waitroom::access=off
  names+=(old-on old-off)
fi
sleep 2
for u in u1 u2 u3; do curl -s -XPOST -H "X-User-Id: $u" "http://127.0.0.1:${PORT[new-on]}/queue/enter" >/dev/null; done
declare -A SUM
for r in $(seq "$ROUNDS"); do
  for n in "${names[@]}"; do
    rps=$(WR_USER=u3 wrk -t2 -c64 -d"${SECONDS_EACH}s" -s "$ROOT/bench/wrk/status_one.lua" "http://127.0.0.1:${PORT[$n]}" | awk '/Requests\/sec/ {print $2}')
    echo "round $r $n $rps"
    SUM[$n]=$(echo "${SUM[$n]:-0} + $rps" | bc)
  done
done
for b in new old; do
  [ -n "${SUM[$b-on]:-}" ] && echo "$b: access log on / off = $(echo "scale=3; ${SUM[$b-on]} / ${SUM[$b-off]}" | bc)"
done
