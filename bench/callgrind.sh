#!/usr/bin/env bash
# Instructions per request on the hot paths, with valgrind's callgrind: repeatable on a busy
# machine, where wall-clock numbers are not (and `perf` records nothing in these VMs).
#
#   bench/callgrind.sh [--waitroom-bin PATH] [--n 2000] [--paths status,status_10k,pass,enter,enter_new,protected]
#                      [--out DIR (default bench/out/callgrind)] [--redis] [--rust-log FILTER]
#                      [--connections C] [--config-extra YAML]
#
# `enter` is the enter of a user already waiting (one of the 100,000 seeded), `enter_new` that of a
# user never seen before (a new id each request). `status` polls one waiting user, `status_10k`
# 10,000 of them in turn (`--n` at most 10,000), as the paths benchmark's two status rows do.
#
# --redis runs redis-server under callgrind too, and counts its instructions per waitroom
# request (Redis shares the proxy's cores: its work is part of a request's cost).
#
# --connections C deals the requests to C connections sending at once (default 1, one after
# another): requests that arrive together share Redis calls (grouped enters, claims and settles),
# which one connection never shows; `--connections 64 --paths protected` counts an order in
# groups.
#
# --config-extra appends YAML lines to the proxy's configuration, to count what a setting costs
# the paths when it is configured and does not apply (e.g. bypass rules that match no request;
# a secret_env it names must be set in the environment).
#
# --rust-log sets the proxy's RUST_LOG (default `warn`: the access log off); `--rust-log info`
# counts what the access log costs a request.
#
# Runs waitroom (WAITROOM_THREADS=1, access log off) and nginx (one worker) under callgrind, sends
# a fixed number of requests per path on one keep-alive connection (`wrbench fire`), after a
# warm-up, between `callgrind_control --zero` and `--dump`, so each dump holds exactly N requests
# (plus the room watcher's once-a-second Redis call: a few hundred instructions per request at
# most). Writes bench/out/callgrind/: one dump and one listing per path and process (`wrbench
# callgrind`: instructions, mallocs and socket calls per request, cost by area, top self costs),
# and summary.jsonl. Open a dump with `wrbench callgrind --file F --requests N --callers-of NAME`
# to see who calls NAME (e.g. memcpy).
set -euo pipefail

BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$ROOT/scripts/lib.sh"

N=2000 WARM=300 PATHS=status,pass,enter,protected OUT="" REDIS_CG=0 CONNS=1
WR_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/waitroom
TOP=20
RUST_LOG_WR=warn
CONFIG_EXTRA=""
while [ $# -gt 0 ]; do
  case "$1" in
    --waitroom-bin) WR_BIN=$2; shift ;;
    --n) N=$2; shift ;;
    --paths) PATHS=$2; shift ;;
    --top) TOP=$2; shift ;;
    --out) OUT=$2; shift ;;
    --redis) REDIS_CG=1 ;;
    --rust-log) RUST_LOG_WR=$2; shift ;;
    --connections) CONNS=$2; shift ;;
    --config-extra) CONFIG_EXTRA=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1" ;;
  esac
  shift
done
API_BIN=$(dirname "$WR_BIN")/demo-order-api
[ -x "$API_BIN" ] || API_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/demo-order-api
[ -x "$WR_BIN" ] || die "no waitroom binary at $WR_BIN (cargo build --release --bins)"

missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v curl >/dev/null || missing+=(curl)
[ "${#missing[@]}" -eq 0 ] || apt_install "${missing[@]}"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
WRBENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/wrbench
[ -x "$WRBENCH" ] || (cd "$ROOT" && cargo build --release --quiet -p waitroom-bench)

OUT=${OUT:-$BENCH/out/callgrind}
rm -rf "$OUT"
mkdir -p "$OUT"
PIDS=()
cleanup() { stop_all 0.5 "${PIDS[@]}"; }
trap cleanup EXIT

port() { local p; for _ in $(seq 1 100); do p=$((20000 + RANDOM % 12000)); port_in_use "$p" || { echo "$p"; return; }; done; die "no port"; }
P_REDIS=$(port) P_API=$(port) P_WR=$(port) P_WM=$(port) P_NG=$(port) P_NGR=$(port)
rcli() { redis-cli -h 127.0.0.1 -p "$P_REDIS" "$@"; }

REDIS_PID=""
if [ "$REDIS_CG" -eq 1 ]; then
  (cd "$OUT" && exec valgrind --tool=callgrind --callgrind-out-file="$OUT/redis.start.out" redis-server --port "$P_REDIS" \
    --bind 127.0.0.1 --save '' --appendonly no --logfile "$OUT/redis.log") 2>"$OUT/redis.valgrind.log" &
  REDIS_PID=$!
else
  redis-server --port "$P_REDIS" --bind 127.0.0.1 --save '' --appendonly no --logfile "$OUT/redis.log" &
fi
PIDS+=($!)
wait_until 60 redis rcli ping
"$API_BIN" --listen "127.0.0.1:$P_API" >/dev/null 2>"$OUT/demo-order-api.log" &
PIDS+=($!)
wait_until 10 demo-order-api curl -fsS -o /dev/null "http://127.0.0.1:$P_API/admin/stats"
"$WRBENCH" seed-queue --prefix bench --count 100000 | rcli --pipe >/dev/null

{
  bench_paths_room "$P_WR" "$P_WM" "$P_API" "$P_REDIS"
  echo "shutdown: { grace: 1s }"
  [ -z "$CONFIG_EXTRA" ] || printf '%s\n' "$CONFIG_EXTRA"
} >"$OUT/waitroom.yaml"
cat >"$OUT/nginx.conf" <<EOF
$([ "$(id -u)" -eq 0 ] && echo "user root;")
worker_processes 1;
master_process off;
daemon off;
pid $OUT/nginx.pid;
error_log $OUT/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream backend { server 127.0.0.1:$P_API; keepalive 64; keepalive_requests 1000000; }
  server {
    listen 127.0.0.1:$P_NG;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
  # The status paths' bound in bench/run.sh: nginx answering by itself.
$(bench_nginx_return "$P_NGR")
}
EOF

# Under callgrind both programs run some 50x slower: give them time.
say "waitroom under callgrind (threads=1)"
(cd "$OUT" && exec env RUST_LOG="$RUST_LOG_WR" WAITROOM_THREADS=1 valgrind --tool=callgrind \
  --callgrind-out-file="$OUT/waitroom.start.out" "$WR_BIN" --config "$OUT/waitroom.yaml") 2>"$OUT/waitroom.valgrind.log" &
WR_PID=$!
PIDS+=("$WR_PID")
wait_until 120 "waitroom under valgrind" curl -fsS -o /dev/null "http://127.0.0.1:$P_WM/readyz"
say "nginx under callgrind (one worker, no master)"
(cd "$OUT" && exec valgrind --tool=callgrind --callgrind-out-file="$OUT/nginx.start.out" \
  "$NGINX" -c "$OUT/nginx.conf" -p "$OUT/") 2>"$OUT/nginx.valgrind.log" &
NG_PID=$!
PIDS+=("$NG_PID")
wait_until 120 "nginx under valgrind" curl -fsS -o /dev/null "http://127.0.0.1:$P_NG/echo/ready"

SUMMARY=$OUT/summary.jsonl # one JSON line per (process, path)
: >"$SUMMARY"

# measure NAME PROC PID PORT FIRE-ARGS...: warm up, zero, N requests, dump, annotate.
measure() {
  local name=$1 proc=$2 pid=$3 port=$4
  shift 4
  "$WRBENCH" fire --addr "127.0.0.1:$port" --n "$WARM" --connections "$CONNS" "$@" >/dev/null
  callgrind_control --zero "$pid" >/dev/null
  [ -n "$REDIS_PID" ] && [ "$proc" = waitroom ] && callgrind_control --zero "$REDIS_PID" >/dev/null
  local fired
  fired=$("$WRBENCH" fire --addr "127.0.0.1:$port" --n "$N" --skip "$WARM" --connections "$CONNS" "$@")
  callgrind_control --dump="$name" "$pid" >/dev/null
  if [ -n "$REDIS_PID" ] && [ "$proc" = waitroom ]; then
    callgrind_control --dump="$name" "$REDIS_PID" >/dev/null
    sleep 1
    local rdump
    rdump=$(ls -t "$OUT"/redis.start.out.* | head -n 1)
    mv "$rdump" "$OUT/redis-$name.out"
    "$WRBENCH" callgrind --file "$OUT/redis-$name.out" --requests "$N" --top "$TOP" \
      --extra "{\"path\":\"$name\",\"process\":\"redis (for waitroom)\"}" >>"$SUMMARY" 2>"$OUT/redis-$name.txt"
  fi
  sleep 1
  local dump
  # DUMP names the process's callgrind file when PROC is one of its servers (nginx-return).
  local base=${DUMP:-$proc}
  dump=$(ls -t "$OUT"/"$base".start.out.* 2>/dev/null | head -n 1)
  [ -n "$dump" ] || dump=$(ls -t "$OUT"/"$base".start.out* | head -n 1)
  mv "$dump" "$OUT/$proc-$name.out"
  "$WRBENCH" callgrind --file "$OUT/$proc-$name.out" --requests "$N" --top "$TOP" \
    --extra "{\"path\":\"$name\",\"process\":\"$proc\",\"fire\":$fired}" \
    >>"$SUMMARY" 2>"$OUT/$proc-$name.txt"
  say "$proc $name ($fired)"
  cat "$OUT/$proc-$name.txt" >&2
}

pairs=$OUT/pairs.txt
"$WRBENCH" mint-tokens --prefix bench --count $((N + WARM)) --tag cg --pairs "$pairs" | rcli --pipe >/dev/null
IFS=, read -r -a paths <<<"$PATHS"
for p in "${paths[@]}"; do
  case "$p" in
    status)
      measure status waitroom "$WR_PID" "$P_WR" --path /queue/status --header "X-User-Id: u50000"
      measure status nginx "$NG_PID" "$P_NG" --path /queue/status --header "X-User-Id: u50000"
      DUMP=nginx measure status nginx-return "$NG_PID" "$P_NGR" --path /queue/status --header "X-User-Id: u50000" ;;
    status_10k)
      # The wrk run's 10k users cycling: the warm-up polls each of them once (a user's first
      # status learns their arrival number from Redis), the measured requests poll the first N
      # of them again, each from the proxy's memory.
      WARM=10000 measure status_10k waitroom "$WR_PID" "$P_WR" --path /queue/status --header "X-User-Id: u{n}" --users 10000
      WARM=10000 measure status_10k nginx "$NG_PID" "$P_NG" --path /queue/status --header "X-User-Id: u{n}" --users 10000
      WARM=10000 DUMP=nginx measure status_10k nginx-return "$NG_PID" "$P_NGR" --path /queue/status --header "X-User-Id: u{n}" --users 10000 ;;
    pass)
      measure pass waitroom "$WR_PID" "$P_WR" --path /echo/pass
      measure pass nginx "$NG_PID" "$P_NG" --path /echo/pass ;;
    enter)
      measure enter waitroom "$WR_PID" "$P_WR" --method POST --path /queue/enter --header "X-User-Id: u{n}" --users 100000
      measure enter nginx "$NG_PID" "$P_NG" --method POST --path /queue/enter --header "X-User-Id: u{n}" --users 100000 ;;
    enter_new)
      measure enter_new waitroom "$WR_PID" "$P_WR" --method POST --path /queue/enter --header "X-User-Id: new-{n}" --users 1000000000
      measure enter_new nginx "$NG_PID" "$P_NG" --method POST --path /queue/enter --header "X-User-Id: new-{n}" --users 1000000000 ;;
    protected)
      measure protected waitroom "$WR_PID" "$P_WR" --path /echo/protected --pairs "$pairs" \
        --header "X-User-Id: {user}" --header "X-Entry-Token: {token}"
      measure protected nginx "$NG_PID" "$P_NG" --path /echo/protected --pairs "$pairs" \
        --header "X-User-Id: {user}" --header "X-Entry-Token: {token}" ;;
    *) die "unknown path $p" ;;
  esac
done
say "summary: $SUMMARY (dumps and listings in $OUT)"
"$WRBENCH" callgrind-table "$SUMMARY"
