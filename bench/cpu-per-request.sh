#!/usr/bin/env bash
# CPU time per request, of the proxy and of Redis, for two waitroom binaries in interleaved rounds
# (wrk -t2 -c64). Throughput on these small VMs moves 20-30 % from one round to the next with
# whatever else the host runs; the CPU a request costs moves far less, and it is what a change to
# the proxy's or the scripts' work changes. Also prints Redis's own execution time of the scripts
# per request and the calls per request (`INFO commandstats`), which show how large groups were.
#
#   NEW=<binary> OLD=<binary> bench/cpu-per-request.sh            # default paths: protected enter_new
#   NEW=... OLD=... PATHS="protected pass" ROUNDS=5 bench/cpu-per-request.sh
#   NEW=... OLD=... PATHS="status_one status_many" bench/cpu-per-request.sh   # and nginx's return 200
#
# Paths: protected (a fresh token each request, as wrk/protected.lua), enter_new (a new user each
# request), pass (forwarded, not protected), status_one (one waiting user polling) and
# status_many (users picked among 100,000 waiting, from each wrk thread's pool of 10,000, as the
# paths benchmark's "10k users cycling"). Both proxies forward to one demo order API, share one
# fresh Redis (no persistence) and subscribe to its spent tokens, as two proxies of one room do.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NEW=${NEW:-$ROOT/target/release/waitroom}
OLD=${OLD:?OLD=<binary> to compare against}
ROUNDS=${ROUNDS:-3} SECONDS_EACH=${SECONDS_EACH:-8} PATHS=${PATHS:-protected enter_new}
WRBENCH=${WRBENCH:-$ROOT/target/release/wrbench}
API_BIN=${API_BIN:-$ROOT/target/release/demo-order-api}
for bin in "$NEW" "$OLD" "$WRBENCH" "$API_BIN"; do
  [ -x "$bin" ] || { echo "no binary at $bin (cargo build --release -p waitroom-bench -p waitroom-tools)" >&2; exit 1; }
done
OUT=$(mktemp -d); cd "$OUT"
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; redis-cli -p "$RP" shutdown nosave >/dev/null 2>&1; rm -rf "$OUT"' EXIT
# shellcheck source=../scripts/lib.sh
. "$ROOT/scripts/lib.sh"
read -r RP AP <<<"$(free_ports 2)"
redis-server --port "$RP" --save '' --appendonly no --daemonize yes --pidfile "$OUT/redis.pid" --logfile "$OUT/redis.log"
"$API_BIN" --listen "127.0.0.1:$AP" >api.log 2>&1 &
PIDS+=($!)
sleep 0.5
declare -A PORT PID
start() { # NAME BIN
  local port metrics
  read -r port metrics <<<"$(free_ports 2)"
  bench_paths_room "$port" "$metrics" "$AP" "$RP" >"$1.yaml"
  RUST_LOG=info,waitroom::access=off "$2" --config "$1.yaml" 2>"$1.log" &
  PIDS+=($!) PORT[$1]=$port PID[$1]=$!
  wait_until 30 "waitroom $1" curl -fsS -o /dev/null "http://127.0.0.1:$metrics/readyz"
}
start new "$NEW"
start old "$OLD"
NAMES="new old"
# The status paths' bound, nginx answering by itself with the same body (bench/run.sh's `return
# 200`, two workers): its CPU a request beside waitroom's, under the same wrk.
case " $PATHS " in
  *" status_"*)
    NGINX=$(command -v nginx || echo /usr/sbin/nginx)
    read -r NP <<<"$(free_ports 1)"
    cat >nginx.conf <<EOF
$([ "$(id -u)" -eq 0 ] && echo "user root;")
worker_processes 2;
daemon off;
pid $OUT/nginx.pid;
error_log $OUT/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
$(bench_nginx_return "$NP")
}
EOF
    "$NGINX" -c "$OUT/nginx.conf" -p "$OUT/" &
    PIDS+=($!)
    wait_until 10 nginx curl -fsS -o /dev/null "http://127.0.0.1:$NP/"
    # The master and its workers: the workers do the work.
    PORT[nginx-return]=$NP PID[nginx-return]="$! $(pgrep -P $! | tr '\n' ' ')"
    NAMES="new old nginx-return" ;;
esac
for s in protected enter_new pass status_one users; do
  cat "$ROOT/bench/wrk/$s.lua" "$ROOT/bench/wrk/common.lua" >"$s.lua"
done
cp users.lua status_many.lua
case " $PATHS " in
  *" status_"*) "$WRBENCH" seed-queue --prefix bench --count 100000 | redis-cli -p "$RP" --pipe >/dev/null ;;
esac
# utime + stime of the processes given, in clock ticks.
ticks() {
  local pid total=0
  for pid in "$@"; do total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat"))); done
  echo "$total"
}
HZ=$(getconf CLK_TCK)
tag=0
echo "round proxy path req/s proxy_us/req redis_us/req scripts_us/req evalsha/req"
# Round 0 is a warm-up of 2 s, not printed: the first calls load the scripts and open connections.
for round in $(seq 0 "$ROUNDS"); do
  for name in $NAMES; do
    for path in $PATHS; do
      # nginx answers nothing but the status paths' body.
      [ "$name" != nginx-return ] || [[ "$path" == status_* ]] || continue
      tag=$((tag + 1))
      seconds=$SECONDS_EACH
      [ "$round" -eq 0 ] && seconds=2
      env=()
      case $path in
        protected)
          "$WRBENCH" mint-tokens --prefix bench --count $((40000 * seconds)) --tag "$tag" --pairs pairs.txt |
            redis-cli -p "$RP" --pipe >/dev/null
          env=(WR_PAIRS="$OUT/pairs.txt") ;;
        enter_new) env=(WR_TAG="$tag$name") ;;
      esac
      redis-cli -p "$RP" config resetstat >/dev/null
      # shellcheck disable=SC2086 # nginx's entry lists its processes
      p0=$(ticks ${PID[$name]}) r0=$(ticks "$(cat redis.pid)")
      report=$(env "${env[@]}" wrk -t2 -c64 -d"${seconds}s" -s "$path.lua" "http://127.0.0.1:${PORT[$name]}/")
      # shellcheck disable=SC2086
      p1=$(ticks ${PID[$name]}) r1=$(ticks "$(cat redis.pid)")
      requests=$(awk '/requests in/ { print $1 }' <<<"$report")
      stats=$(redis-cli -p "$RP" info commandstats | tr -d '\r' | awk -F'[=,]' '/^cmdstat_evalsha:/ { print $2, $4 }')
      [ "$round" -eq 0 ] || awk -v r="$round" -v n="$name" -v p="$path" -v q="$requests" -v s="$seconds" -v hz="$HZ" \
        -v pt=$((p1 - p0)) -v rt=$((r1 - r0)) -v st="${stats:-0 0}" 'BEGIN {
          split(st, e, " ")
          printf "%s %s %s %.0f %.1f %.1f %.1f %.3f\n", r, n, p, q / s, pt * 1e6 / hz / q, rt * 1e6 / hz / q, e[2] / q, e[1] / q
        }'
      case $path in
        protected) rm -f pairs.txt ;;
        enter_new) redis-cli -p "$RP" del '{bench}:queue' >/dev/null ;;
      esac
    done
  done
done
