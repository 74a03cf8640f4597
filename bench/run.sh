#!/usr/bin/env bash
# waitroom's benchmark suite, in one command:
#
#   bench/run.sh            full mode: 3 interleaved rounds of 10 s per path, a crowd of 20,000
#                           (about 25 minutes of measuring, plus the release build)
#   bench/run.sh --quick    smoke mode: 1 round of 2 s, a crowd of 500 (well under a minute once
#                           built; reuses existing binaries; no thresholds, but it fails when a
#                           load generator does: wrk, redis-benchmark or the idle connections)
#
# It installs what is missing (nginx, wrk, redis-server, redis-tools; apt-get), builds waitroom and
# the demo order API and pingora's smallest forwarder (bench/forwarder) in release (`cargo build
# --release --bins -p waitroom -p waitroom-tools -p waitroom-forwarder`) and the bench tools
# (`wrbench`, bench/, a workspace member left out of `cargo test`: `cargo build -p waitroom-bench`),
# then starts on free loopback ports: the demo order API, nginx as the baseline reverse proxy
# (proxy_pass, upstream keepalive) and, on a second port, answering a fixed response by itself,
# the forwarder in front of the demo order API, a fresh Redis without persistence, and waitroom
# (its own generated configuration); and measures:
#
#   paths    status / enter / pass-through / protected forward, each against nginx proxy_pass and
#            against its bound (nginx answering by itself for status and enter, the forwarder for
#            pass-through, waitroom's own pass-through for a protected order), interleaved
#            (nginx, bound, waitroom, nginx, bound, waitroom, ...) with wrk -t2 -c64; medians and
#            ratios; the access log's cost (a second waitroom with RUST_LOG=info) and any --variant
#   redis    the Redis ceiling for the same commands (redis-benchmark -P1 / -P16)
#   growth   status / enter latency with 1k, 100k and 1M users waiting; Redis memory per user
#   memory   proxy RSS with 10,000 idle keep-alive connections (nginx alongside)
#   crowd    N users arriving within a second: no room, 100 admitted per second, 10 per 100 ms,
#            and an adaptive room (up to 10 per 100 ms, the batch following the order API's p95)
#   rooms    several rooms in one proxy: a busy room's status / enter / protected alone and beside
#            49 idle rooms (interleaved, as paths); a crowd split over two rooms at once, each with
#            its own rate and order API; the Redis calls per second of an idle room (1 and 50)
#
# Everything lands in bench/out/ (gitignored): raw.jsonl, results.json, table.md, charts/*.svg,
# logs/. `--publish` copies the charts to bench/charts/ for BENCHMARKS.md.
#
# Options:
#   --quick                 the smoke mode above
#   --rounds N              rounds per path (default 3; quick 1)
#   --duration S            seconds per wrk run (default 10; quick 2)
#   --crowd-users N         users in the crowd (default 20000; quick 500)
#   --phases LIST           comma-separated subset of: paths,redis,growth,memory,crowd,rooms
#   --crowd-scenarios LIST  the crowd's scenarios, comma-separated subset of: no-room,
#                           room-100-per-1s,room-10-per-100ms,room-adaptive,
#                           room-10-per-100ms+front,room-adaptive+front (default: all)
#   --paths LIST            the paths phase's benches, comma-separated subset of: status_one,
#                           status_many,enter_requeue,enter_new,pass,protected
#   --variant NAME=BIN[,VAR=VALUE...][,paths=BENCH+BENCH...]
#                           also measure another waitroom binary (or the same one with other
#                           environment, e.g. WAITROOM_THREADS=1), interleaved, on every path or
#                           on the listed ones (status_one, status_many, enter_requeue,
#                           enter_new, pass, protected)
#   --waitroom-bin PATH     the waitroom binary to measure (default: target/release/waitroom, or
#                           under $CARGO_TARGET_DIR); the demo order API and the forwarder are
#                           taken from beside it when they are there, else from target/release
#   --no-build              build nothing; use the binaries that are there
#   --wait-calm             before measuring, wait (polling every 2 min, at most 40 min) until the
#                           1-minute load average is below 1.5
#   --publish               copy the charts to bench/charts/
#   --append                keep bench/out/'s earlier measurements and add this run's (e.g. to
#                           run the phases of one full run in two goes); the report covers both
set -euo pipefail

BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$ROOT/scripts/lib.sh"

QUICK=0 WAIT_CALM=0 BUILD=1 PUBLISH=0 APPEND=0
ROUNDS="" DURATION="" CROWD_USERS="" PHASES="paths,redis,growth,memory,crowd,rooms" WR_BIN=""
CROWD_SCENARIOS=""
BENCHES="status_one,status_many,enter_requeue,enter_new,pass,protected"
VARIANTS=()
COMMAND="bench/run.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    --duration) DURATION=$2; shift ;;
    --crowd-users) CROWD_USERS=$2; shift ;;
    --phases) PHASES=$2; shift ;;
    --crowd-scenarios) CROWD_SCENARIOS=$2; shift ;;
    --paths) BENCHES=$2; shift ;;
    --variant) VARIANTS+=("$2"); shift ;;
    --waitroom-bin) WR_BIN=$2; shift ;;
    --no-build) BUILD=0 ;;
    --wait-calm) WAIT_CALM=1 ;;
    --publish) PUBLISH=1 ;;
    --append) APPEND=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done

# The crowd's scenarios: label|room (its name and key prefix; empty: no room, straight at the API)|
# batch_size|interval|more YAML for its admission section|more flags for the simulated users. The
# adaptive room is the fixed 10-per-100ms one with the controller on: batch_size becomes its
# ceiling, so any gap between the two is what listening to the API costs or buys. The "+front"
# rooms are a what-if beyond the waiting page's polling: users within 250 places of the front poll every
# 100 ms, so they learn READY within about 100 ms of their admission (what a status held open for
# the front of the line would give) instead of up to pollAfter (2 s) later.
CROWD_SCENARIOS_ALL=(
  "no-room|||||"
  "room-100-per-1s|c100|100|1s||"
  "room-10-per-100ms|c10|10|100ms||"
  "room-adaptive|cadapt|10|100ms|adaptive: {target_p95: 300ms, min_batch: 1}|"
  "room-10-per-100ms+front|c10f|10|100ms||--front-positions 250 --front-poll-ms 100"
  "room-adaptive+front|cadaptf|10|100ms|adaptive: {target_p95: 300ms, min_batch: 1}|--front-positions 250 --front-poll-ms 100"
)
# A misspelt scenario fails now, not after the build and the other phases.
if [ -n "$CROWD_SCENARIOS" ]; then
  known=" "
  for entry in "${CROWD_SCENARIOS_ALL[@]}"; do known+="${entry%%|*} "; done
  IFS=, read -r -a wanted <<<"$CROWD_SCENARIOS"
  for label in "${wanted[@]}"; do
    [[ "$known" == *" $label "* ]] || die "unknown crowd scenario '$label' (known:$known)"
  done
fi

if [ "$QUICK" -eq 1 ]; then
  : "${ROUNDS:=1}" "${DURATION:=2}" "${CROWD_USERS:=500}"
  WARMUP=0 GROWTH_DURATION=1 IDLE_CONNS=1000 RB_N=50000 TOKENS_PER_S=40000
else
  : "${ROUNDS:=3}" "${DURATION:=10}" "${CROWD_USERS:=20000}"
  WARMUP=1 GROWTH_DURATION=5 IDLE_CONNS=10000 RB_N=1000000 TOKENS_PER_S=40000
fi
GROWTH_SIZES=(1000 100000 1000000)
[ "$QUICK" -eq 1 ] && GROWTH_SIZES=(1000 100000)
WRK_THREADS=2 WRK_CONNS=64
QUEUE_SIZE=100000          # the line the status / enter paths are measured against
STATUS_USER=u50000         # a user in the middle of it

has_phase() { [[ ",$PHASES," == *",$1,"* ]]; }
load1() { cut -d' ' -f1 /proc/loadavg; }
now_s() { date +%s.%N; }

# ------------------------------------------------------------------------------------------------
# Tools and builds
# ------------------------------------------------------------------------------------------------
ensure_cargo
missing=()
command -v cc >/dev/null || missing+=(build-essential)
command -v cmake >/dev/null || missing+=(cmake)
command -v curl >/dev/null || missing+=(curl)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v wrk >/dev/null || missing+=(wrk)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null || missing+=(redis-tools)
[ "${#missing[@]}" -eq 0 ] || apt_install "${missing[@]}" ca-certificates
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
PROFILE=release
# The forwarder is a workspace member outside the default ones, built in the same cargo command
# as the proxy and the tools: feature unification then gives pingora's tree the features it has
# in `cargo build --bins`, and cargo links the build that is there instead of compiling pingora
# again for it (alone, it would resolve libmimalloc-sys and others with fewer features).
BUILD_PACKAGES=(--bins -p waitroom -p waitroom-tools -p waitroom-forwarder)
if [ -z "$WR_BIN" ]; then
  WR_BIN=$TARGET_DIR/release/waitroom API_BIN=$TARGET_DIR/release/demo-order-api
  FWD_BIN=$TARGET_DIR/release/waitroom-forwarder
  if [ "$QUICK" -eq 0 ]; then
    if [ "$BUILD" -eq 1 ]; then
      say "cargo build --release ${BUILD_PACKAGES[*]} (fat LTO: a few minutes)"
      (cd "$ROOT" && cargo build --release "${BUILD_PACKAGES[@]}")
    fi
  elif [ ! -x "$WR_BIN" ] || [ ! -x "$API_BIN" ] || [ ! -x "$FWD_BIN" ]; then
    # The smoke mode never waits for a fat-LTO release build: it takes the release binaries when
    # they are all there, else the debug ones (building them if need be: `cargo test` in CI
    # reuses them). Numbers from a debug build mean nothing; the smoke mode only proves the suite
    # runs.
    WR_BIN=$TARGET_DIR/debug/waitroom API_BIN=$TARGET_DIR/debug/demo-order-api PROFILE=debug
    FWD_BIN=$TARGET_DIR/debug/waitroom-forwarder
    # CI's `cargo build --bins` leaves the forwarder out (not a default member): this adds one
    # small crate and a link, never pingora.
    if [ "$BUILD" -eq 1 ] && { [ ! -x "$WR_BIN" ] || [ ! -x "$API_BIN" ] || [ ! -x "$FWD_BIN" ]; }; then
      say "cargo build ${BUILD_PACKAGES[*]} (debug: the smoke mode does not wait for a release build)"
      (cd "$ROOT" && cargo build "${BUILD_PACKAGES[@]}")
    fi
  fi
else
  API_BIN=$(dirname "$WR_BIN")/demo-order-api
  [ -x "$API_BIN" ] || API_BIN=$TARGET_DIR/release/demo-order-api
  FWD_BIN=$(dirname "$WR_BIN")/waitroom-forwarder
  [ -x "$FWD_BIN" ] || FWD_BIN=$TARGET_DIR/release/waitroom-forwarder
fi
[ -x "$WR_BIN" ] || die "no waitroom binary at $WR_BIN (build it, or drop --no-build)"
[ -x "$API_BIN" ] || die "no demo-order-api binary at $API_BIN"
if has_phase paths && [ ! -x "$FWD_BIN" ]; then
  die "no waitroom-forwarder binary at $FWD_BIN (cargo build --release ${BUILD_PACKAGES[*]}, or drop --no-build)"
fi
say "measuring $WR_BIN ($PROFILE, built $(date -r "$WR_BIN" '+%F %T'))"

# The smoke mode's wrbench is a debug build too: 500 users need no optimiser, and the debug build
# reuses much of what the test suite compiled just before in CI.
if [ "$QUICK" -eq 1 ]; then
  WRBENCH=$TARGET_DIR/debug/wrbench BENCH_PROFILE=()
else
  WRBENCH=$TARGET_DIR/release/wrbench BENCH_PROFILE=(--release)
fi
if [ "$BUILD" -eq 1 ] || [ ! -x "$WRBENCH" ]; then
  say "building the bench tools (cargo build${BENCH_PROFILE[*]:+ ${BENCH_PROFILE[*]}} -p waitroom-bench)"
  (cd "$ROOT" && cargo build "${BENCH_PROFILE[@]}" --quiet -p waitroom-bench)
fi

# ------------------------------------------------------------------------------------------------
# Output, processes, cleanup
# ------------------------------------------------------------------------------------------------
OUT=$BENCH/out
# This run's files only: bench/callgrind.sh keeps its own folders in out/ too.
PREVIOUS_COMMAND=""
if [ "$APPEND" -eq 1 ] && [ -f "$OUT/meta.json" ]; then
  PREVIOUS_COMMAND=$(sed -n 's/^  "command": "\(.*\)",$/\1/p' "$OUT/meta.json")
  PREVIOUS_LOAD=$(sed -n 's/^  "load_start": \(.*\),$/\1/p' "$OUT/meta.json")
  [ -n "$PREVIOUS_COMMAND" ] && COMMAND="$PREVIOUS_COMMAND; then $COMMAND"
  rm -rf "$OUT"/{results.json,table.md,logs,nginx,wrk,charts,tmp}
else
  rm -rf "$OUT"/{raw.jsonl,meta.json,results.json,table.md,crowd-*.json,rooms,logs,nginx,wrk,charts,tmp}
fi
mkdir -p "$OUT/logs" "$OUT/nginx" "$OUT/wrk" "$OUT/charts" "$OUT/tmp"
RAW=$OUT/raw.jsonl
[ "$APPEND" -eq 1 ] || : >"$RAW"

PIDS=()
cleanup() { stop_all 0.3 "${PIDS[@]}"; }
trap cleanup EXIT
stop_pid() {
  kill -INT "$1" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null || true
}

# 10,000 idle connections need descriptors in the load generator and in the proxies.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
if [ "$NOFILE" != unlimited ] && [ "$NOFILE" -lt $((IDLE_CONNS + 1000)) ]; then
  IDLE_CONNS=$((NOFILE - 1000))
  say "ulimit -n is $NOFILE: holding $IDLE_CONNS idle connections instead"
fi

if [ "$WAIT_CALM" -eq 1 ]; then
  for i in $(seq 0 20); do
    l=$(load1)
    if awk -v l="$l" 'BEGIN { exit !(l < 1.5) }'; then break; fi
    [ "$i" -eq 20 ] && { say "load is still $l after 40 minutes: measuring on a loaded machine"; break; }
    say "load average $l >= 1.5: waiting 2 minutes ($((i + 1))/20)"
    sleep 120
  done
fi
LOAD_START=$(load1)

# A free port below the kernel's ephemeral range (so no outgoing connection holds it, and none
# will grab it later: the 10,000 idle connections use a lot of them), unused in any TCP state.
EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
TAKEN_PORTS=" "
pick_port() { # sets PORT
  local port
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % (EPHEMERAL_LOW - 20000)))
    [[ "$TAKEN_PORTS" == *" $port "* ]] && continue
    if [ -z "$(ss -Htan "( sport = :$port )" 2>/dev/null)" ] && ! port_in_use "$port"; then
      TAKEN_PORTS+="$port "
      PORT=$port
      return
    fi
  done
  die "no free port found"
}
pick_port; P_REDIS=$PORT
pick_port; P_API=$PORT
pick_port; P_NGINX=$PORT
pick_port; P_NGINX_RETURN=$PORT
pick_port; P_FORWARDER=$PORT

rcli() { redis-cli -h 127.0.0.1 -p "$P_REDIS" "$@"; }

say "redis-server on $P_REDIS (no persistence)"
redis-server --port "$P_REDIS" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
  --maxclients 20000 --logfile "$OUT/logs/redis.log" &
PIDS+=($!)
wait_until 10 "redis" rcli ping

# start_api PORT NAME: a demo order API (20 slots x 200 ms, its defaults).
start_api() {
  "$API_BIN" --listen "127.0.0.1:$1" >"$OUT/logs/$2.out" 2>"$OUT/logs/$2.log" &
  PIDS+=($!)
  wait_until 10 "$2" curl -fsS -o /dev/null "http://127.0.0.1:$1/admin/stats"
  say "$2 on $1 (20 slots x 200 ms)"
}
start_api "$P_API" demo-order-api

# nginx, the baseline: a plain reverse proxy with an upstream keepalive pool. keepalive_requests
# is raised on both sides so that nginx is not reconnecting every 1000 requests (pingora does not):
# the strongest fair baseline. The same nginx answers a fixed response by itself on a second
# port: the bound for what waitroom answers itself (status, enter), with the workers and the
# client-side keep-alive of the proxy_pass server, and no backend to move it. Its body is about
# the size of a status answer.
start_nginx() {
  local user_line=""
  [ "$(id -u)" -eq 0 ] && user_line="user root;"
  cat >"$OUT/nginx/nginx.conf" <<EOF
$user_line
worker_processes auto;
worker_rlimit_nofile 20000;
daemon off;
pid $OUT/nginx/nginx.pid;
error_log $OUT/logs/nginx-error.log warn;
events { worker_connections 16384; }
http {
  access_log off;
  client_body_temp_path $OUT/nginx/body;
  proxy_temp_path $OUT/nginx/proxy;
  keepalive_requests 1000000;
  keepalive_timeout 75s;
  upstream backend {
    server 127.0.0.1:$P_API;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$P_NGINX backlog=4096;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_read_timeout 300s;
    }
  }
$(bench_nginx_return "$P_NGINX_RETURN")
}
EOF
  say "nginx on $P_NGINX (proxy_pass, upstream keepalive 64, $(nproc) workers) and on $P_NGINX_RETURN (return 200)"
  "$NGINX" -c "$OUT/nginx/nginx.conf" -p "$OUT/nginx/" 2>>"$OUT/logs/nginx-error.log" &
  NGINX_PID=$!
  PIDS+=("$NGINX_PID")
  wait_until 10 "nginx" curl -fsS -o /dev/null "http://127.0.0.1:$P_NGINX/echo/ready"
  wait_until 10 "nginx return" curl -fsS -o /dev/null "http://127.0.0.1:$P_NGINX_RETURN/queue/status"
}

# pingora's smallest forwarder (bench/forwarder) in front of the demo order API: the bound for
# waitroom's pass-through.
start_forwarder() {
  "$FWD_BIN" "127.0.0.1:$P_FORWARDER" "127.0.0.1:$P_API" >"$OUT/logs/forwarder.out" 2>"$OUT/logs/forwarder.log" &
  FORWARDER_PID=$!
  PIDS+=("$FORWARDER_PID")
  wait_until 10 "forwarder" curl -fsS -o /dev/null "http://127.0.0.1:$P_FORWARDER/echo/ready"
  say "forwarder on $P_FORWARDER (pingora's smallest, in front of the demo order API)"
}

# start_waitroom NAME PREFIX BIN RUST_LOG BATCH INTERVAL [VAR=VALUE...]: one waitroom with its own
# configuration; WR_URL[NAME], WR_METRICS[NAME], WR_PID[NAME] tell where it is. Set for the call,
# WR_UPSTREAM is the port it forwards to (default: the demo order API's) and WR_ADMISSION holds more
# YAML for its `admission:` section, one key a line, unindented (e.g. `adaptive: {...}`), and
# WR_HOLD its endpoints.hold (absent: the default, 2 s). The path, growth and memory rooms run with
# hold 0s: they measure answers given at once, and a poll near the front would wait for its turn.
declare -A WR_URL WR_METRICS WR_PID
start_waitroom() {
  local name=$1 prefix=$2 bin=$3 log=$4 batch=$5 interval=$6
  shift 6
  local port metrics admission=""
  pick_port; port=$PORT
  pick_port; metrics=$PORT
  if [ -n "${WR_ADMISSION:-}" ]; then
    admission="  ${WR_ADMISSION//$'\n'/$'\n  '}"$'\n'
  fi
  cat >"$OUT/$name.yaml" <<EOF
# generated by bench/run.sh
listen: "127.0.0.1:$port"
metrics_listen: "127.0.0.1:$metrics"
upstream: "127.0.0.1:${WR_UPSTREAM:-$P_API}"
redis:
  url: "redis://127.0.0.1:$P_REDIS"
  key_prefix: "$prefix"
protected:
  - { method: POST, path: /api/orders }
  - { method: GET, path: /echo/protected }
admission:
  interval: $interval
  batch_size: $batch
${admission}${WR_HOLD:+endpoints:
  hold: $WR_HOLD
}queue:
  capacity: 2000000
shutdown:
  grace: 1s
EOF
  env RUST_LOG="$log" "$@" "$bin" --config "$OUT/$name.yaml" >"$OUT/logs/$name.out" 2>"$OUT/logs/$name.log" &
  local pid=$!
  PIDS+=("$pid")
  WR_URL[$name]="http://127.0.0.1:$port" WR_METRICS[$name]="http://127.0.0.1:$metrics" WR_PID[$name]=$pid
  ready() { kill -0 "$pid" 2>/dev/null || return 99; curl -fsS -o /dev/null "http://127.0.0.1:$metrics/readyz"; }
  wait_until 30 "waitroom $name" ready || { tail -n 20 "$OUT/logs/$name.log" >&2; die "waitroom $name did not start"; }
  say "waitroom '$name' on $port (prefix $prefix, batch $batch / $interval${WR_ADMISSION:+, $WR_ADMISSION}, RUST_LOG=$log${*:+, $*})"
}

# seed PREFIX COUNT: puts users u1..uCOUNT in the room's line (redis-cli --pipe).
seed() {
  local t0
  t0=$(now_s)
  "$WRBENCH" seed-queue --prefix "$1" --count "$2" | rcli --pipe >"$OUT/logs/seed-$1.log"
  say "seeded {$1}:queue with $2 users in $(awk -v a="$t0" -v b="$(now_s)" 'BEGIN { printf "%.1f", b - a }') s"
}

# mint PREFIX COUNT TAG [dry]: fresh tokens in Redis (dry: only the pairs file, for nginx, which
# checks nothing); prints the pairs file.
mint() {
  local pairs=$OUT/tmp/pairs-$3.txt
  if [ "${4:-}" = dry ]; then
    "$WRBENCH" mint-tokens --prefix "$1" --count "$2" --tag "$3" --pairs "$pairs" >/dev/null
  else
    "$WRBENCH" mint-tokens --prefix "$1" --count "$2" --tag "$3" --pairs "$pairs" | rcli --pipe >/dev/null
  fi
  echo "$pairs"
}

# ------------------------------------------------------------------------------------------------
# wrk
# ------------------------------------------------------------------------------------------------
for s in status_one users enter_new pass protected; do
  cat "$BENCH/wrk/$s.lua" "$BENCH/wrk/common.lua" >"$OUT/wrk/$s.lua"
done

# json_num KEY JSON: the number KEY holds in a flat JSON object (empty when absent).
json_num() { grep -o "\"$1\":[0-9.]*" <<<"$2" | head -n 1 | cut -d: -f2 || true; }

# strict WHAT DETAILS...: in the smoke mode, a load generator that failed fails the run. The smoke
# mode is CI's proof that the suite works, and a run that measured nothing proves nothing. The
# full mode keeps going: there a failed run shows as missing or odd numbers in a report that is
# read by a person, and a timeout on a busy machine is part of the measurement.
strict() {
  local what=$1
  shift
  [ "$QUICK" -eq 1 ] || return 0
  [ "$#" -eq 0 ] || printf '%s\n' "$@" >&2
  die "$what (the smoke mode stops on a failed load generator)"
}

# wrk_run KIND BENCH TARGET ROUND URL SCRIPT DURATION EXTRA_JSON [VAR=VALUE...]
wrk_run() {
  local kind=$1 bench=$2 target=$3 round=$4 url=$5 script=$6 dur=$7 extra=$8
  shift 8
  local out json l rc=0
  l=$(load1)
  out=$(env WR_THREADS=$WRK_THREADS "$@" wrk -t"$WRK_THREADS" -c"$WRK_CONNS" -d"${dur}s" --timeout 5s \
    -s "$OUT/wrk/$script.lua" "$url" 2>&1) || rc=$?
  json=$(grep '^WRKJSON ' <<<"$out" | sed 's/^WRKJSON //' || true)
  if [ -z "$json" ]; then
    printf '%s\n' "$out" >&2
    die "wrk gave no result for $bench on $target"
  fi
  # Socket errors (connect, read, write, timeout), not answers: non-2xx answers are counted apart
  # and can be deliberate (protected.lua's spent tokens once its pairs wrap around).
  local requests errors
  requests=$(json_num requests "$json") errors=$(json_num errors "$json")
  if [ "$rc" -ne 0 ] || [ "${requests:-0}" -eq 0 ] || [ "${errors:-0}" -gt 0 ]; then
    strict "wrk failed for $bench on $target: exit $rc, ${requests:-0} requests, ${errors:-?} socket errors" "$out"
  fi
  printf '{"kind":"%s","bench":"%s","target":"%s","round":%d,"load":%s%s,"wrk":%s}\n' \
    "$kind" "$bench" "$target" "$round" "$l" "$extra" "$json" >>"$RAW"
  awk -v j="$json" -v b="$bench" -v t="$target" -v r="$round" -v l="$l" 'BEGIN {
    match(j, /"rps":[0-9.]+/); rps = substr(j, RSTART + 6, RLENGTH - 6)
    match(j, /"p99_us":[0-9]+/); p99 = substr(j, RSTART + 9, RLENGTH - 9)
    match(j, /"non2xx":[0-9]+/); bad = substr(j, RSTART + 9, RLENGTH - 9)
    printf "    %-14s %-16s round %s  %9.0f req/s  p99 %7.2f ms  non-2xx %s  (load %s)\n", b, t, r, rps, p99 / 1000, bad, l
  }' >&2
}

# ------------------------------------------------------------------------------------------------
# Phase: paths against nginx and against their bounds
# ------------------------------------------------------------------------------------------------
TOKEN_TAG=0
# target_run BENCH TARGET ROUND: one wrk run of BENCH on TARGET, with the setup it needs.
target_run() {
  local bench=$1 target=$2 round=$3 url env=()
  case "$target" in
    nginx) url="http://127.0.0.1:$P_NGINX" ;;
    nginx-return) url="http://127.0.0.1:$P_NGINX_RETURN" ;;
    forwarder) url="http://127.0.0.1:$P_FORWARDER" ;;
    *) url=${WR_URL[$target]} ;;
  esac
  local dur=$DURATION kind=wrk
  [ "$round" -eq 0 ] && dur=2
  case "$bench" in
    status_one) env=(WR_USER=$STATUS_USER); script=status_one ;;
    status_many) env=(WR_QUEUE=$QUEUE_SIZE WR_METHOD=GET WR_PATH=/queue/status); script=users ;;
    enter_requeue) env=(WR_QUEUE=$QUEUE_SIZE WR_METHOD=POST WR_PATH=/queue/enter); script=users ;;
    enter_new) TOKEN_TAG=$((TOKEN_TAG + 1)); env=(WR_TAG="$TOKEN_TAG$target"); script=enter_new ;;
    pass) script=pass ;;
    protected)
      TOKEN_TAG=$((TOKEN_TAG + 1))
      local pairs
      pairs=$(mint bench $((TOKENS_PER_S * dur)) "$TOKEN_TAG" "$([ "$target" = nginx ] && echo dry)")
      env=(WR_PAIRS="$pairs"); script=protected ;;
  esac
  wrk_run "$kind" "$bench" "$target" "$round" "$url" "$script" "$dur" "" "${env[@]}"
  case "$bench" in
    # Back to a line of exactly QUEUE_SIZE: the new users queued behind the seeded ones leave, the
    # counter goes back to the seeded line's end and the room gets a new epoch (the proxies drop
    # the numbers they learned). Without that the line would have a gap at its back, and the
    # proxies would answer every later poll from Redis (src/room/line.rs).
    enter_new)
      rcli ZREMRANGEBYSCORE "{bench}:queue" "($QUEUE_SIZE" +inf >/dev/null
      rcli SET "{bench}:seq" "$QUEUE_SIZE" >/dev/null
      rcli DEL "{bench}:epoch" >/dev/null
      ;;
    protected) rm -f "$OUT/tmp/pairs-$TOKEN_TAG.txt" ;;
  esac
}

VARIANT_NAMES=()
declare -A VARIANT_PATHS
phase_paths() {
  say "== paths: nginx, the bounds and waitroom, $ROUNDS round(s) of ${DURATION}s, wrk -t$WRK_THREADS -c$WRK_CONNS"
  local bench round t
  local benches
  IFS=, read -r -a benches <<<"$BENCHES"
  for bench in "${benches[@]}"; do
    # Each path's bound in the same rounds as waitroom: what waitroom answers itself against nginx
    # answering by itself, what it forwards against pingora forwarding and nothing else. A
    # protected order's bound is waitroom's own pass-through, which the pass bench measures.
    local targets=(nginx)
    case "$bench" in
      status_one | status_many | enter_requeue | enter_new) targets+=(nginx-return) ;;
      pass) targets+=(forwarder) ;;
    esac
    targets+=(waitroom)
    # The access log's cost: the same binary with RUST_LOG=info (full mode only).
    if [ "$QUICK" -eq 0 ]; then
      case "$bench" in status_one | status_many | pass) targets+=(waitroom-log) ;; esac
    fi
    for t in "${VARIANT_NAMES[@]}"; do
      if [[ -z "${VARIANT_PATHS[$t]:-}" || "+${VARIANT_PATHS[$t]}+" == *"+$bench+"* ]]; then targets+=("$t"); fi
    done
    for round in $(seq $((1 - WARMUP)) "$ROUNDS"); do
      for t in "${targets[@]}"; do target_run "$bench" "$t" "$round"; done
    done
  done
}

# ------------------------------------------------------------------------------------------------
# Phase: the Redis ceiling
# ------------------------------------------------------------------------------------------------
# rb NAME PATH PIPELINE ARGS...: redis-benchmark of one command.
rb() {
  local name=$1 path=$2 p=$3 n=$RB_N out rps
  shift 3
  [ "$p" -eq 1 ] && n=$((RB_N / 4))
  out=$(redis-benchmark -h 127.0.0.1 -p "$P_REDIS" -c "$WRK_CONNS" -n "$n" -P "$p" -q "$@" 2>&1 | tr '\r' '\n' || true)
  rps=$(grep -o '[0-9.]* requests per second' <<<"$out" | tail -n 1 | cut -d' ' -f1 || true)
  if [ -z "$rps" ]; then
    printf '%s\n' "$out" | tail -n 3 >&2
    strict "redis-benchmark gave no result for $name"
    say "redis-benchmark gave no result for $name: skipped"
    return 0
  fi
  printf '{"kind":"redis","cmd":"%s","path":"%s","pipeline":%d,"rps":%s}\n' "$name" "$path" "$p" "$rps" >>"$RAW"
  printf '    %-26s -P%-3s %10.0f req/s\n' "$name" "$p" "$rps" >&2
}

# capture NAME METHOD PATH [CURL ARGS...]: the Redis commands waitroom sends for one request, as
# `redis-cli MONITOR` shows them (one command a line, arguments separated by tabs), so that the
# ceiling replays exactly what the binary runs, whatever its scripts' signatures are today.
capture() {
  local name=$1 method=$2 path=$3 mon=$OUT/tmp/monitor-$1.txt
  shift 3
  curl -s -o /dev/null -X "$method" "$@" "${WR_URL[waitroom]}$path" # loads the scripts if needed
  # redis-cli itself in the background (not the rcli function's subshell), so that kill ends it.
  redis-cli -h 127.0.0.1 -p "$P_REDIS" MONITOR >"$mon" &
  local mpid=$!
  sleep 0.3
  curl -s -o /dev/null -X "$method" "$@" "${WR_URL[waitroom]}$path"
  sleep 0.3
  kill "$mpid" 2>/dev/null || true
  wait "$mpid" 2>/dev/null || true
  # Only what the proxy sends for this user: not the commands its scripts run inside Redis
  # (MONITOR shows them as from "lua"), nor the room watcher's and admitter's calls (no user).
  grep -F "$STATUS_USER" "$mon" | grep -vF ' lua]' | sed 's/^[^"]*//' >"$OUT/tmp/monitor-$name.lines" || true
  while IFS= read -r line; do
    grep -o '"[^"]*"' <<<"$line" | tr -d '"' | paste -sd '\t' -
  done <"$OUT/tmp/monitor-$name.lines" >"$OUT/tmp/commands-$name.txt"
  # The first command's arguments, one a line: empty arguments (there are some) survive.
  head -n 1 "$OUT/tmp/monitor-$name.lines" | grep -o '"[^"]*"' | tr -d '"' >"$OUT/tmp/args-$name.txt" || true
  printf '{"kind":"commands","path":"%s","commands":%d,"names":"%s"}\n' "$name" \
    "$(wc -l <"$OUT/tmp/commands-$name.txt")" "$(cut -f1 "$OUT/tmp/commands-$name.txt" | paste -sd ' ' -)" >>"$RAW"
  say "$name: waitroom sends $(wc -l <"$OUT/tmp/commands-$name.txt") Redis command(s) per request: $(cut -f1 "$OUT/tmp/commands-$name.txt" | paste -sd ' ' -)"
}

phase_redis() {
  say "== the Redis ceiling (redis-benchmark -c$WRK_CONNS)"
  local u=$STATUS_USER status enter
  capture status_one GET /queue/status -H "X-User-Id: $u"
  capture enter_requeue POST /queue/enter -H "X-User-Id: $u"
  mapfile -t status <"$OUT/tmp/args-status_one.txt"
  mapfile -t enter <"$OUT/tmp/args-enter_requeue.txt"
  for p in 1 16; do
    rb "ZRANK" status_one "$p" ZRANK "{bench}:queue" "$u"
    [ "${#status[@]}" -gt 0 ] && rb "${status[0]} status" status_one "$p" "${status[@]}"
    [ "${#enter[@]}" -gt 0 ] && rb "${enter[0]} enter (waiting)" enter_requeue "$p" "${enter[@]}"
    rb "GET token" protected "$p" GET "{bench}:token:t0-0"
  done
}

# ------------------------------------------------------------------------------------------------
# Phase: growth (1k / 100k / 1M waiting) and Redis memory per waiting user
# ------------------------------------------------------------------------------------------------
phase_growth() {
  say "== growth: status and enter with 1k, 100k and 1M waiting"
  local before after size round name
  declare -A room=([100000]=waitroom)
  WR_HOLD=0s start_waitroom g1k g1k "$WR_BIN" "info,waitroom::access=off" 1 1h
  WR_HOLD=0s start_waitroom g1m g1m "$WR_BIN" "info,waitroom::access=off" 1 1h
  room[1000]=g1k room[1000000]=g1m
  seed g1k 1000
  before=$(rcli INFO memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }')
  seed g1m 1000000
  after=$(rcli INFO memory | tr -d '\r' | awk -F: '$1 == "used_memory" { print $2 }')
  printf '{"kind":"memory","users":1000000,"before":%s,"after":%s}\n' "$before" "$after" >>"$RAW"
  say "Redis: $(((after - before) / 1000000)) bytes per waiting user"
  for round in $(seq 1 "$ROUNDS"); do
    for size in "${GROWTH_SIZES[@]}"; do
      name=${room[$size]}
      wrk_run growth status "$name" "$round" "${WR_URL[$name]}" users "$GROWTH_DURATION" ",\"size\":$size" \
        WR_QUEUE="$size" WR_METHOD=GET WR_PATH=/queue/status
      wrk_run growth enter "$name" "$round" "${WR_URL[$name]}" users "$GROWTH_DURATION" ",\"size\":$size" \
        WR_QUEUE="$size" WR_METHOD=POST WR_PATH=/queue/enter
    done
  done
  stop_pid "${WR_PID[g1k]}"
  stop_pid "${WR_PID[g1m]}"
  rcli UNLINK "{g1m}:queue" "{g1k}:queue" >/dev/null
}

# ------------------------------------------------------------------------------------------------
# Phase: RSS with idle keep-alive connections
# ------------------------------------------------------------------------------------------------
rss_kb() { # PID...: the summed VmRSS
  local pid sum=0 kb
  for pid in "$@"; do
    kb=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
    sum=$((sum + ${kb:-0}))
  done
  echo "$sum"
}

# idle_rss TARGET URL PID...: RSS before and while IDLE_CONNS served connections sit idle.
idle_rss() {
  local target=$1 addr=${2#http://} pids
  shift 2
  pids=("$@")
  local before after idle_pid result=$OUT/tmp/idle-$target.json
  before=$(rss_kb "${pids[@]}")
  "$WRBENCH" idle --addr "$addr" --conns "$IDLE_CONNS" --path /queue/status --header "X-User-Id: u{n}" \
    --users "$QUEUE_SIZE" --hold-s 55 >"$result" 2>"$OUT/logs/idle-$target.log" &
  idle_pid=$!
  PIDS+=("$idle_pid")
  wait_until 50 "$IDLE_CONNS idle connections to $target" test -s "$result" || true
  sleep 1
  after=$(rss_kb "${pids[@]}")
  stop_pid "$idle_pid"
  local idle
  idle=$(head -n 1 "$result")
  [ -n "$idle" ] || idle='{"opened":0}'
  if [ "$(json_num opened "$idle")" = 0 ] || [ "$(json_num failed "$idle")" != 0 ]; then
    strict "wrbench idle could not hold its connections to $target: $idle" "$(tail -n 5 "$OUT/logs/idle-$target.log")"
  fi
  printf '{"kind":"rss","target":"%s","conns":%d,"before_kb":%d,"after_kb":%d,"idle":%s}\n' \
    "$target" "$IDLE_CONNS" "$before" "$after" "$idle" >>"$RAW"
  say "$target RSS: $before kB idle, $after kB with $IDLE_CONNS idle connections ($idle)"
}

phase_memory() {
  say "== memory: RSS with $IDLE_CONNS idle keep-alive connections"
  local v
  for v in waitroom "${VARIANT_NAMES[@]}"; do idle_rss "$v" "${WR_URL[$v]}" "${WR_PID[$v]}"; done
  # nginx: the master and its workers.
  local workers
  mapfile -t workers < <(pgrep -P "$NGINX_PID")
  idle_rss nginx "http://127.0.0.1:$P_NGINX" "$NGINX_PID" "${workers[@]}"
}

# ------------------------------------------------------------------------------------------------
# Phase: the crowd
# ------------------------------------------------------------------------------------------------
CROWD_ORDER=()
phase_crowd() {
  local selected=() entry label
  for entry in "${CROWD_SCENARIOS_ALL[@]}"; do
    label=${entry%%|*}
    if [ -z "$CROWD_SCENARIOS" ] || [[ ",$CROWD_SCENARIOS," == *",$label,"* ]]; then selected+=("$entry"); fi
  done
  say "== the crowd: $CROWD_USERS users arriving within a second ($(printf '%s\n' "${selected[@]%%|*}" | paste -sd ' ' -))"
  # The microbenchmark rooms and nginx are done: give the crowd the machine.
  local name
  for name in "${!WR_PID[@]}"; do stop_pid "${WR_PID[$name]}"; done
  [ -n "${NGINX_PID:-}" ] && stop_pid "$NGINX_PID"
  [ -n "${FORWARDER_PID:-}" ] && stop_pid "$FORWARDER_PID"
  rcli FLUSHALL >/dev/null
  # Full mode runs the scenarios one after another on one backend (reset in between); the smoke
  # mode runs them side by side, a backend each, to stay within seconds. A backend each matters
  # doubly for the adaptive room: its controller would otherwise answer the other rooms' load.
  local common=(--users "$CROWD_USERS" --ideal-rate 100)
  local runs=() rooms=() n=0 room batch interval extra api args
  for entry in "${selected[@]}"; do
    IFS='|' read -r label room batch interval extra client <<<"$entry"
    api=$P_API
    if [ "$QUICK" -eq 1 ] && [ "$n" -gt 0 ]; then
      pick_port; api=$PORT
      start_api "$api" "demo-order-api-$n"
    fi
    n=$((n + 1))
    if [ -z "$room" ]; then
      runs+=("$label|--mode direct --target http://127.0.0.1:$api --backend http://127.0.0.1:$api")
      continue
    fi
    WR_UPSTREAM=$api WR_ADMISSION=$extra start_waitroom "$room" "$room" "$WR_BIN" "info,waitroom::access=off" "$batch" "$interval"
    rooms+=("$room")
    # The interval in milliseconds for the report: "1s" or "100ms".
    case "$interval" in
      *ms) interval=${interval%ms} ;;
      *s) interval=$((${interval%s} * 1000)) ;;
      *) die "crowd scenario $label: interval '$interval' is neither ms nor s" ;;
    esac
    runs+=("$label|--mode room --target ${WR_URL[$room]} --backend http://127.0.0.1:$api --redis 127.0.0.1:$P_REDIS --prefix $room --batch-size $batch --interval-ms $interval${client:+ $client}")
  done
  local pids=() run pid
  n=0
  for run in "${runs[@]}"; do
    n=$((n + 1))
    label=${run%%|*}
    read -r -a args <<<"${run#*|}"
    CROWD_ORDER+=("$label")
    say "scenario $label"
    if [ "$QUICK" -eq 1 ]; then
      "$WRBENCH" crowd --label "$label" "${args[@]}" "${common[@]}" --out "$OUT/crowd-$n-$label.json" &
      pids+=($!)
    else
      "$WRBENCH" crowd --label "$label" "${args[@]}" "${common[@]}" --out "$OUT/crowd-$n-$label.json"
    fi
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  for room in "${rooms[@]}"; do stop_pid "${WR_PID[$room]}"; done
}

# ------------------------------------------------------------------------------------------------
# Phase: several rooms in one proxy (contract section 17)
# ------------------------------------------------------------------------------------------------
# Its own key prefix, so that nothing it does touches the other phases' rooms.
ROOMS_PREFIX=rooms
# The crowd's rooms: name, batch and interval (ms). Each has an order API of its own sized to that
# rate (200 ms an order), and its share of the crowd follows its rate, so both rushes last as long
# and overlap from start to end. Both are adaptive rooms with that batch as their ceiling: an order
# p95 within 300 ms is what a room's controller aims at, and a fixed room run at its API's full
# capacity queues seconds there, with or without other rooms. drop-b's 50 orders a second are 10
# per 200 ms, not 5 per 100 ms: the controller moves a batch by one user, and at a batch of 5 that
# step is a fifth of the rate: the room swung between 4 (82 % of its API) and 5 (more than the API
# really serves, about 48.6 a second), and its order p95 sat at 296-302 ms, alone as beside drop-a
# (BENCHMARKS.md, "Several rooms in one proxy").
ROOMS_CROWD=("drop-a 10 100" "drop-b 10 200")
# An idle room turns quiet 5 s after the proxy starts (src/room/quiet.rs): the idle cost is read
# once they all have, over a minute (the smoke mode: a few seconds, enough to prove it counts).
if [ "$QUICK" -eq 1 ]; then
  ROOMS_SETTLE=6 ROOMS_IDLE_S=5
else
  ROOMS_SETTLE=10 ROOMS_IDLE_S=60
fi

# rooms_idle_yaml COUNT: the `rooms:` entries of COUNT rooms nobody uses, each with a prefix and an
# order path of its own, as distinct rooms on one proxy must have.
rooms_idle_yaml() {
  local i
  for i in $(seq 1 "$1"); do
    printf '  - name: idle-%02d\n    endpoints: { prefix: /idle/%02d/queue }\n    protected:\n      - { method: POST, path: /api/idle/%02d/orders }\n' "$i" "$i" "$i"
  done
}

# The paths phase's room, as a room under `rooms`: the same prefix, protected paths and frozen
# admission, so the same wrk scripts measure it.
rooms_busy_yaml() {
  cat <<EOF
  - name: busy
    endpoints: { prefix: /queue, hold: 0s }
    protected:
      - { method: POST, path: /api/orders }
      - { method: GET, path: /echo/protected }
    admission: { interval: 1h, batch_size: 1 }
EOF
}

# rooms_start NAME REDIS_PORT UPSTREAM_PORT ROOMS_YAML: a waitroom with the rooms given; like
# start_waitroom, WR_URL[NAME], WR_METRICS[NAME] and WR_PID[NAME] tell where it is.
rooms_start() {
  local name=$1 redis=$2 upstream=$3 rooms=$4 port metrics pid
  pick_port; port=$PORT
  pick_port; metrics=$PORT
  cat >"$OUT/$name.yaml" <<EOF
# generated by bench/run.sh (rooms phase)
listen: "127.0.0.1:$port"
metrics_listen: "127.0.0.1:$metrics"
upstream: "127.0.0.1:$upstream"
redis:
  url: "redis://127.0.0.1:$redis"
  key_prefix: "$ROOMS_PREFIX"
queue:
  capacity: 2000000
shutdown:
  grace: 1s
rooms:
$rooms
EOF
  env RUST_LOG="info,waitroom::access=off" "$WR_BIN" --config "$OUT/$name.yaml" >"$OUT/logs/$name.out" 2>"$OUT/logs/$name.log" &
  pid=$!
  PIDS+=("$pid")
  WR_URL[$name]="http://127.0.0.1:$port" WR_METRICS[$name]="http://127.0.0.1:$metrics" WR_PID[$name]=$pid
  rooms_ready() { kill -0 "$1" 2>/dev/null || return 99; curl -fsS -o /dev/null "http://127.0.0.1:$2/readyz"; }
  wait_until 30 "waitroom $name" rooms_ready "$pid" "$metrics" || { tail -n 20 "$OUT/logs/$name.log" >&2; die "waitroom $name did not start"; }
  say "waitroom '$name' on $port ($(grep -c '^  - name:' "$OUT/$name.yaml") room(s), Redis on $redis)"
}

# rooms_run BENCH TARGET ROUND: one wrk run of the busy room's BENCH on TARGET (rooms-1 or
# rooms-50), with what target_run does around it, for the busy room's keys in TARGET's Redis.
rooms_run() {
  local bench=$1 target=$2 round=$3 dur=$DURATION env=() script pairs=""
  local redis=(redis-cli -h 127.0.0.1 -p "${ROOMS_REDIS[$target]}")
  [ "$round" -eq 0 ] && dur=2
  case "$bench" in
    status_one) env=(WR_USER=$STATUS_USER); script=status_one ;;
    enter_new) TOKEN_TAG=$((TOKEN_TAG + 1)); env=(WR_TAG="r$TOKEN_TAG"); script=enter_new ;;
    protected)
      TOKEN_TAG=$((TOKEN_TAG + 1))
      pairs=$OUT/tmp/pairs-$TOKEN_TAG.txt
      "$WRBENCH" mint-tokens --prefix "$ROOMS_PREFIX" --room busy --count $((TOKENS_PER_S * dur)) \
        --tag "$TOKEN_TAG" --pairs "$pairs" | "${redis[@]}" --pipe >/dev/null
      env=(WR_PAIRS="$pairs"); script=protected ;;
    *) die "rooms: no bench $bench" ;;
  esac
  wrk_run rooms "$bench" "$target" "$round" "${WR_URL[$target]}" "$script" "$dur" "" "${env[@]}"
  # Back to the seeded line, as target_run does for the paths' room (see there).
  if [ "$bench" = enter_new ]; then
    "${redis[@]}" ZREMRANGEBYSCORE "{$ROOMS_PREFIX:busy}:queue" "($QUEUE_SIZE" +inf >/dev/null
    "${redis[@]}" SET "{$ROOMS_PREFIX:busy}:seq" "$QUEUE_SIZE" >/dev/null
    "${redis[@]}" DEL "{$ROOMS_PREFIX:busy}:epoch" >/dev/null
  fi
  [ -z "$pairs" ] || rm -f "$pairs"
}

# Part 1: the busy room served by a proxy that has only it, and by one that has 49 idle rooms
# besides. Each proxy has a Redis of its own, seeded alike: on one shared Redis each proxy would
# also hear every token the other spends (section 5's announcements), so a protected run would
# load the proxy not measured as well, and its spent tokens would pile up in both.
declare -A ROOMS_REDIS ROOMS_REDIS_PID
rooms_busy_beside_idle() {
  say "== rooms: one busy room alone and beside 49 idle rooms, $ROUNDS round(s) of ${DURATION}s, wrk -t$WRK_THREADS -c$WRK_CONNS"
  local started target
  started=$(now_s)
  for target in rooms-50 rooms-1; do
    pick_port; ROOMS_REDIS[$target]=$PORT
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
      --maxclients 20000 --logfile "$OUT/logs/redis-$target.log" &
    PIDS+=($!)
    ROOMS_REDIS_PID[$target]=$!
    wait_until 10 "redis ($target)" redis-cli -h 127.0.0.1 -p "$PORT" ping
    "$WRBENCH" seed-queue --prefix "$ROOMS_PREFIX" --room busy --count "$QUEUE_SIZE" \
      | redis-cli -h 127.0.0.1 -p "$PORT" --pipe >"$OUT/logs/seed-$target.log"
  done
  # The busy room last: every request to it is first offered to the 49 idle rooms.
  rooms_start rooms-50 "${ROOMS_REDIS[rooms-50]}" "$P_API" "$(rooms_idle_yaml 49; rooms_busy_yaml)"
  rooms_start rooms-1 "${ROOMS_REDIS[rooms-1]}" "$P_API" "$(rooms_busy_yaml)"
  # The idle rooms as they stay: quiet. The smoke mode does not wait for it: its numbers are not
  # read, only that it runs.
  if [ "$QUICK" -eq 0 ]; then
    sleep "$(awk -v a="$started" -v b="$(now_s)" -v s="$ROOMS_SETTLE" 'BEGIN { w = s - (b - a); print (w > 0 ? w : 0) }')"
  fi
  local bench round targets
  for bench in status_one enter_new protected; do
    for round in $(seq $((1 - WARMUP)) "$ROUNDS"); do
      # Each goes first every other round: whatever the first run leaves behind (a warmer
      # cache, a busier machine) falls on both.
      targets=(rooms-1 rooms-50)
      [ $((round % 2)) -eq 0 ] && targets=(rooms-50 rooms-1)
      for t in "${targets[@]}"; do rooms_run "$bench" "$t" "$round"; done
    done
  done
  for target in rooms-1 rooms-50; do
    stop_pid "${WR_PID[$target]}"
    stop_pid "${ROOMS_REDIS_PID[$target]}"
  done
}

# Part 2: the crowd split over two rooms of one proxy at once, each room with its own rate and its
# own order API.
rooms_two_crowds() {
  local entry name batch interval rate total=0 given=0 users api n=0 yaml="" pids=() runs=() pid
  # Rates in orders a second; a 200 ms order takes rate / 5 slots.
  for entry in "${ROOMS_CROWD[@]}"; do
    read -r name batch interval <<<"$entry"
    total=$((total + batch * 1000 / interval))
  done
  say "== rooms: a crowd of $CROWD_USERS split over ${#ROOMS_CROWD[@]} rooms at once"
  mkdir -p "$OUT/rooms"
  for entry in "${ROOMS_CROWD[@]}"; do
    read -r name batch interval <<<"$entry"
    rate=$((batch * 1000 / interval))
    pick_port; api=$PORT
    "$API_BIN" --listen "127.0.0.1:$api" --slots $((rate / 5)) >"$OUT/logs/api-$name.out" 2>"$OUT/logs/api-$name.log" &
    PIDS+=($!)
    wait_until 10 "api-$name" curl -fsS -o /dev/null "http://127.0.0.1:$api/admin/stats"
    say "order API of $name on $api ($((rate / 5)) slots x 200 ms)"
    # Told apart by Host alone: both protect the demo API's one order path.
    yaml+="  - name: $name
    host: $name.rooms.bench
    endpoints: { prefix: /$name/queue }
    protected:
      - { method: POST, path: /api/orders }
    admission: { interval: ${interval}ms, batch_size: $batch, adaptive: { target_p95: 300ms, min_batch: 1 } }
    upstream: \"127.0.0.1:$api\"
"
    # The last room takes what rounding left over, so the crowd stays whole.
    n=$((n + 1))
    users=$((CROWD_USERS * rate / total))
    [ "$n" -eq "${#ROOMS_CROWD[@]}" ] && users=$((CROWD_USERS - given))
    given=$((given + users))
    runs+=("$name|$users|$batch|$interval|$api")
  done
  rooms_start rooms-crowd "$P_REDIS" "$P_API" "$yaml"
  n=0
  for entry in "${runs[@]}"; do
    IFS='|' read -r name users batch interval api <<<"$entry"
    n=$((n + 1))
    "$WRBENCH" crowd --label "$name" --mode room --target "${WR_URL[rooms-crowd]}" --host "$name.rooms.bench" \
      --endpoints "/$name/queue" --backend "http://127.0.0.1:$api" --redis "127.0.0.1:$P_REDIS" \
      --prefix "$ROOMS_PREFIX" --room "$name" --batch-size "$batch" --interval-ms "$interval" \
      --users "$users" --ideal-rate $((batch * 1000 / interval)) --out "$OUT/rooms/crowd-$n-$name.json" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || strict "wrbench crowd failed in the rooms phase"; done
  stop_pid "${WR_PID[rooms-crowd]}"
}

# Part 3: the Redis calls of rooms nobody uses. A proxy with 1 idle room and one with 50, each on
# a Redis of its own, so that each Redis counts one proxy's calls; they settle and are counted
# side by side. INFO commandstats also counts the commands a script runs; MONITOR tells those
# (from "lua") apart from what the proxy sent itself.
rooms_idle_cost() {
  local n sizes=(1 50)
  local -A port rpid mon t0 t1
  say "== rooms: Redis calls of idle rooms (1 and 50), ${ROOMS_IDLE_S}s once quiet"
  for n in "${sizes[@]}"; do
    pick_port; port[$n]=$PORT
    redis-server --port "${port[$n]}" --bind 127.0.0.1 --save '' --appendonly no --protected-mode no \
      --logfile "$OUT/logs/redis-idle-$n.log" &
    PIDS+=($!)
    rpid[$n]=$!
    wait_until 10 "redis (idle $n)" redis-cli -h 127.0.0.1 -p "${port[$n]}" ping
    rooms_start "rooms-idle-$n" "${port[$n]}" "$P_API" "$(rooms_idle_yaml "$n")"
  done
  sleep "$ROOMS_SETTLE"
  for n in "${sizes[@]}"; do
    redis-cli -h 127.0.0.1 -p "${port[$n]}" MONITOR >"$OUT/tmp/monitor-idle-$n.txt" &
    mon[$n]=$!
  done
  sleep 0.3
  for n in "${sizes[@]}"; do
    redis-cli -h 127.0.0.1 -p "${port[$n]}" CONFIG RESETSTAT >/dev/null
    t0[$n]=$(now_s)
  done
  sleep "$ROOMS_IDLE_S"
  for n in "${sizes[@]}"; do
    redis-cli -h 127.0.0.1 -p "${port[$n]}" INFO commandstats | tr -d '\r' >"$OUT/tmp/commandstats-idle-$n.txt"
    t1[$n]=$(now_s)
  done
  for n in "${sizes[@]}"; do
    kill "${mon[$n]}" 2>/dev/null || true
    wait "${mon[$n]}" 2>/dev/null || true
    stop_pid "${WR_PID[rooms-idle-$n]}"
    stop_pid "${rpid[$n]}"
    # commandstats without the benchmark's own CONFIG and INFO; MONITOR's lines within the
    # counted window, from the proxy's connections (by command) or from scripts.
    local commands all calls sent
    commands=$(awk -F'[:,=]' '/^cmdstat_/ { c = substr($1, 9); if (c !~ /^(config|info)/) printf "%s\"%s\":%s", k++ ? "," : "", c, $3 }' \
      "$OUT/tmp/commandstats-idle-$n.txt")
    all=$(awk -F'[:,=]' '/^cmdstat_/ { c = substr($1, 9); if (c !~ /^(config|info)/) s += $3 } END { print s + 0 }' \
      "$OUT/tmp/commandstats-idle-$n.txt")
    calls=$(awk -v a="${t0[$n]}" -v b="${t1[$n]}" '
      $1 + 0 >= a && $1 + 0 <= b && toupper($4) != "\"INFO\"" { if ($3 == "lua]") lua++; else sent++ }
      END { printf "%d %d", sent, lua }' "$OUT/tmp/monitor-idle-$n.txt")
    sent=$(awk -v a="${t0[$n]}" -v b="${t1[$n]}" '
      $1 + 0 >= a && $1 + 0 <= b && $3 != "lua]" && toupper($4) != "\"INFO\"" { c = toupper($4); gsub(/"/, "", c); by[c]++ }
      END { for (c in by) printf "%s\"%s\":%d", k++ ? "," : "", c, by[c] }' "$OUT/tmp/monitor-idle-$n.txt")
    printf '{"kind":"rooms_idle","rooms":%d,"seconds":%s,"settle_s":%s,"all_calls":%d,"proxy_calls":%d,"script_calls":%d,"sent":{%s},"commands":{%s}}\n' \
      "$n" "$(awk -v a="${t0[$n]}" -v b="${t1[$n]}" 'BEGIN { printf "%.3f", b - a }')" "$ROOMS_SETTLE" \
      "$all" "${calls% *}" "${calls#* }" "$sent" "$commands" >>"$RAW"
    say "$n idle room(s): the proxy sent ${calls% *} command(s), scripts ran ${calls#* }, commandstats counted $all, in ${ROOMS_IDLE_S}s"
  done
}

phase_rooms() {
  rooms_busy_beside_idle
  rooms_two_crowds
  rooms_idle_cost
}

# ------------------------------------------------------------------------------------------------
# Run
# ------------------------------------------------------------------------------------------------
STARTED=$(date -u '+%Y-%m-%dT%H:%M:%SZ')
if has_phase paths || has_phase redis || has_phase growth || has_phase memory; then
  start_nginx
  has_phase paths && start_forwarder
  WR_HOLD=0s start_waitroom waitroom bench "$WR_BIN" "info,waitroom::access=off" 1 1h
  seed bench "$QUEUE_SIZE"
  if has_phase paths; then
    if [ "$QUICK" -eq 0 ]; then WR_HOLD=0s start_waitroom waitroom-log bench "$WR_BIN" info 1 1h; fi
  fi
  if has_phase paths || has_phase memory; then
    for v in "${VARIANTS[@]}"; do
      vname=${v%%=*} spec=${v#*=}
      IFS=, read -r -a parts <<<"$spec"
      envs=()
      for part in "${parts[@]:1}"; do
        case "$part" in
          paths=*) VARIANT_PATHS[$vname]=${part#paths=} ;;
          *) envs+=("$part") ;;
        esac
      done
      # No WR_HOLD: a variant is usually an older binary, which knows no endpoints.hold (and holds nothing).
      start_waitroom "$vname" bench "${parts[0]}" "info,waitroom::access=off" 1 1h "${envs[@]}"
      VARIANT_NAMES+=("$vname")
    done
  fi
fi
has_phase paths && phase_paths
has_phase redis && phase_redis
has_phase growth && phase_growth
has_phase memory && phase_memory
has_phase crowd && phase_crowd
has_phase rooms && phase_rooms
LOAD_END=$(load1)

json_list() { local out="" x; for x in "$@"; do out+="${out:+,}\"$x\""; done; printf '[%s]' "$out"; }
cat >"$OUT/meta.json" <<EOF
{
  "started": "$STARTED",
  "finished": "$(date -u '+%Y-%m-%dT%H:%M:%SZ')",
  "command": "$COMMAND",
  "mode": "$([ "$QUICK" -eq 1 ] && echo quick || echo full)",
  "rounds": $ROUNDS,
  "duration_s": $DURATION,
  "wrk": "-t$WRK_THREADS -c$WRK_CONNS",
  "crowd_users": $CROWD_USERS,
  "crowd_order": $(json_list "${CROWD_ORDER[@]}"),
  "idle_conns": $IDLE_CONNS,
  "waitroom_bin": "$WR_BIN",
  "forwarder_bin": "$FWD_BIN",
  "waitroom_profile": "$PROFILE",
  "variants": $(json_list "${VARIANTS[@]}"),
  "load_start": $LOAD_START,
  "load_end": $LOAD_END,
  "machine": {
    "nproc": $(nproc),
    "cpu": "$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)",
    "mem_total_kb": $(awk '/^MemTotal:/ { print $2 }' /proc/meminfo),
    "kernel": "$(uname -sr)"
  },
  "versions": {
    "nginx": "$("$NGINX" -v 2>&1 | sed 's/.*nginx\///')",
    "wrk": "$(wrk -v 2>&1 | head -n 1 | awk '{ print $2 }')",
    "redis": "$(redis-server --version | sed 's/.* v=\([^ ]*\).*/\1/')"
  }
}
EOF

say "report (bench/out/results.json, bench/out/table.md, bench/out/charts/)"
"$WRBENCH" report --dir "$OUT"
say "load average: $LOAD_START at the start, $LOAD_END at the end"
if [ "$PUBLISH" -eq 1 ]; then
  cp "$OUT"/charts/*.svg "$BENCH/charts/"
  say "charts copied to bench/charts/"
fi
