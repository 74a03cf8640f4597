#!/usr/bin/env bash
# The live demo in one command: a private Redis, the demo order API (20 slots, 200 ms an order),
# waitroom in front of it, and a crowd of simulated users whose line drains on screen.
#
#   scripts/demo.sh                       # 500 users
#   USERS=2000 scripts/demo.sh            # a longer line
#   KEEP_RUNNING=1 scripts/demo.sh        # leave everything up after the crowd, until Ctrl-C
#   DROP=1 scripts/demo.sh                # a drop: the crowd pre-queues, the opening draws them
#   PAGE=1 scripts/demo.sh                # also the waiting page in your browser (prints the URL)
#
# Settings (environment variables):
#   USERS=500          simulated users (0: no crowd)   SPREAD_MS=1000  their arrivals are spread over this
#   KEEP_RUNNING=0     1: keep the proxy up after the crowd finishes, until Ctrl-C
#   PAGE=0             1: start identity-front (tools/) on FRONT_PORT=8090 (or a free port) and print
#                      the URL of the waiting page to open in a browser. It names each browser with a
#                      random user id (a cookie), as the authentication layer in front of a real
#                      proxy would. Makes KEEP_RUNNING default to 1, so the page outlives the crowd
#   REDIS_URL=         use this Redis instead of starting a private one (keys under {waitroom-demo})
#   PORT=8080          preferred proxy port     METRICS_PORT=8079  preferred metrics port
#                      (either taken: another free port is used)
#   SLOTS=20  SERVICE_MS=200                    the demo order API's capacity
#   TIMEOUT_S=120      the crowd gives up after this
#   DROP=0             1: a scheduled event (README: "Running a drop") opening OPENS_IN_S seconds after
#                      the proxy starts, with a pre-queue from the start: the crowd arrives before
#                      the opening, is drawn at it in the HMAC order of the revealed seed, and the
#                      demo prints GET /queue/event before and after
#   OPENS_IN_S=10      DROP=1: seconds from the proxy's start to the opening
#
# Needs a Debian/Ubuntu machine with Rust; installs redis-server and cmake with apt-get when they
# are missing (sudo only when not root). It never touches a Redis it did not start: its own runs
# on a free port in a temporary directory. Every process it starts is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

USERS=${USERS:-500}
SPREAD_MS=${SPREAD_MS:-1000}
PAGE=${PAGE:-0}
FRONT_PORT=${FRONT_PORT:-8090}
KEEP_RUNNING=${KEEP_RUNNING:-$PAGE}
REDIS_URL=${REDIS_URL:-}
PORT=${PORT:-8080}
METRICS_PORT=${METRICS_PORT:-8079}
SLOTS=${SLOTS:-20}
SERVICE_MS=${SERVICE_MS:-200}
TIMEOUT_S=${TIMEOUT_S:-120}
DROP=${DROP:-0}
OPENS_IN_S=${OPENS_IN_S:-10}

# ---------------------------------------------------------------------------------------------
# Processes we start, stopped in reverse order on any exit (success, failure, Ctrl-C).
# ---------------------------------------------------------------------------------------------
PIDS=()
NAMES=()
WORKDIR=

stop_pid() {
  local pid=$1 name=$2 i
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return; }
  kill -TERM "$pid" 2>/dev/null || true
  # waitroom drains in-flight requests first (shutdown.grace); the others stop at once.
  for ((i = 0; i < 150; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "$name (pid $pid) did not stop after SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$? i
  trap - EXIT INT TERM
  if [ "${#PIDS[@]}" -gt 0 ]; then
    say "stopping ${NAMES[*]}"
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
      stop_pid "${PIDS[i]}" "${NAMES[i]}"
    done
  fi
  if [ -n "$WORKDIR" ] && [ -d "$WORKDIR" ]; then
    if [ "$rc" -eq 0 ]; then
      rm -rf "$WORKDIR"
    else
      say "logs kept in $WORKDIR"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME LOGFILE COMMAND...: runs COMMAND in the background, remembered for cleanup.
start() {
  local name=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1 &
  PIDS+=("$!")
  NAMES+=("$name")
}

# alive_and PID COMMAND...: COMMAND succeeds and the process is still running; a dead process
# answers 99, which stops wait_until at once instead of at its timeout.
alive_and() {
  local pid=$1
  shift
  kill -0 "$pid" 2>/dev/null || return 99
  "$@"
}

# A raw PING, so the demo does not need redis-cli. A subshell, so a refused connection cannot
# end the script through `exec`.
redis_ping() (
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  printf 'PING\r\n' >&3
  read -r -t 1 reply <&3
  [[ $reply == +PONG* ]]
)

http_ok() { curl -fsS -o /dev/null --max-time 1 "$1"; }

show_log() {
  say "last lines of $1:"
  tail -n 20 "$1" >&2 || true
}

# ---------------------------------------------------------------------------------------------
# 1. Tools and build
# ---------------------------------------------------------------------------------------------
ensure_cargo
tools=(cc cmake curl)
[ -z "$REDIS_URL" ] && tools+=(redis-server)
ensure_tools "${tools[@]}"

cd "$ROOT"
say "building (cargo build --release --bins; the first build takes a few minutes)"
cargo build --release --bins
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release

WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/waitroom-demo.XXXXXX")

# ---------------------------------------------------------------------------------------------
# 2. Redis
# ---------------------------------------------------------------------------------------------
if [ -z "$REDIS_URL" ]; then
  redis_port=$(free_port)
  say "starting redis-server on 127.0.0.1:$redis_port (data in $WORKDIR, not persisted)"
  start redis-server "$WORKDIR/redis.log" \
    redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$WORKDIR" \
    --save '' --appendonly no --daemonize no
  REDIS_PID=${PIDS[-1]}
  wait_until 10 "redis-server" alive_and "$REDIS_PID" redis_ping "$redis_port" \
    || { show_log "$WORKDIR/redis.log"; die "redis-server did not start"; }
  REDIS_URL="redis://127.0.0.1:$redis_port"
fi

# ---------------------------------------------------------------------------------------------
# 3. The demo order API, on a port of its own choosing (it prints the address it got)
# ---------------------------------------------------------------------------------------------
say "starting demo-order-api ($SLOTS slots, ${SERVICE_MS} ms an order)"
# Without --client-delays: nothing here sends X-Demo-Delay-Ms, and with it anyone trying the demo
# by hand could make their own order outlast the proxy's upstream timeout.
start demo-order-api "$WORKDIR/order-api.log" \
  "$BIN/demo-order-api" --listen 127.0.0.1:0 --slots "$SLOTS" --service-time-ms "$SERVICE_MS"
API_PID=${PIDS[-1]}
wait_until 10 "demo-order-api" alive_and "$API_PID" grep -q 'listening on' "$WORKDIR/order-api.log" \
  || { show_log "$WORKDIR/order-api.log"; die "demo-order-api did not start"; }
API_ADDR=$(sed -n 's/^demo-order-api listening on //p' "$WORKDIR/order-api.log" | head -n 1)

# ---------------------------------------------------------------------------------------------
# 4. waitroom, with a generated configuration (every other key keeps its default)
# ---------------------------------------------------------------------------------------------
proxy_port=$(free_port "$PORT")
metrics_port=$(free_port "$METRICS_PORT")
[ "$metrics_port" = "$proxy_port" ] && metrics_port=$(free_port)
CONFIG="$WORKDIR/proxy.yaml"
cat >"$CONFIG" <<EOF
# Generated by scripts/demo.sh. Admission: 10 users every 100 ms = 100/s, what the demo order
# API can serve ($SLOTS slots / ${SERVICE_MS} ms an order).
listen: "127.0.0.1:$proxy_port"
metrics_listen: "127.0.0.1:$metrics_port"
upstream: "$API_ADDR"
redis:
  url: "$REDIS_URL"
  key_prefix: "waitroom-demo"
admission:
  interval: 100ms
  batch_size: 10
EOF
if [ "$DROP" = 1 ]; then
  # The demo's own Redis shares this machine's clock, which decides the phases.
  opens_at=$(date -u -d "@$(($(date +%s) + OPENS_IN_S))" +%Y-%m-%dT%H:%M:%SZ)
  cat >>"$CONFIG" <<EOF
event:
  opens_at: "$opens_at"
  prequeue: 1h
EOF
fi
"$BIN/waitroom" --config "$CONFIG" --check >/dev/null

say "starting waitroom on 127.0.0.1:$proxy_port"
# Access lines for thousands of polls would only fill the log; errors and lifecycle stay on.
RUST_LOG=${RUST_LOG:-info,waitroom::access=off} \
  start waitroom "$WORKDIR/waitroom.log" "$BIN/waitroom" --config "$CONFIG"
PROXY_PID=${PIDS[-1]}
PROXY="http://127.0.0.1:$proxy_port"
METRICS="http://127.0.0.1:$metrics_port"
wait_until 15 "waitroom /healthz" alive_and "$PROXY_PID" http_ok "$METRICS/healthz" \
  || { show_log "$WORKDIR/waitroom.log"; die "waitroom did not start"; }
wait_until 10 "waitroom /readyz (Redis reachable)" alive_and "$PROXY_PID" http_ok "$METRICS/readyz" \
  || { show_log "$WORKDIR/waitroom.log"; die "waitroom cannot reach Redis at $REDIS_URL"; }

cat <<EOF

waitroom is up
  proxy      $PROXY  ->  demo order API on $API_ADDR ($SLOTS slots, ${SERVICE_MS} ms an order)
  metrics    $METRICS/metrics   (also /healthz, /readyz)
  redis      $REDIS_URL   (keys under {waitroom-demo}:)
  config     $CONFIG
  logs       $WORKDIR/*.log

Try it by hand (run with KEEP_RUNNING=1 to keep it up after the crowd):
  curl -s -X POST -H 'X-User-Id: alice' $PROXY/queue/enter
  curl -s -H 'X-User-Id: alice' $PROXY/queue/status
  curl -s -X POST -H 'X-User-Id: alice' -H 'X-Entry-Token: <token from status>' $PROXY/api/orders
  curl -s $METRICS/metrics | grep '^waitroom_'

EOF
if [ "$PAGE" = 1 ]; then
  front_port=$(free_port "$FRONT_PORT")
  say "starting identity-front on 127.0.0.1:$front_port"
  start identity-front "$WORKDIR/identity-front.log" \
    "$BIN/identity-front" --listen "127.0.0.1:$front_port" --proxy "127.0.0.1:$proxy_port"
  FRONT_PID=${PIDS[-1]}
  wait_until 10 "identity-front" alive_and "$FRONT_PID" grep -q 'listening on' "$WORKDIR/identity-front.log" \
    || { show_log "$WORKDIR/identity-front.log"; die "identity-front did not start"; }
  cat <<EOF
The waiting page: open  http://127.0.0.1:$front_port/queue/  in a browser on this machine.
  identity-front gives each browser its own random user id (a cookie) and forwards to the proxy
  with X-User-Id set; a private window is another user. Opened straight on $PROXY/queue/,
  with nobody to name you, the page asks you to sign in.

EOF
fi
if [ "$USERS" -gt 0 ]; then
  cat <<EOF
Now $USERS users arrive within ${SPREAD_MS} ms. The room admits 10 every 100 ms, so about
100 orders a second reach the order API, however many wait ("line" is waitroom_queue_length).

EOF
fi
if [ "$DROP" = 1 ]; then
  cat <<EOF
A drop: the sale opens at $opens_at. The crowd arrives in the pre-queue first (state
PREQUEUED); at the opening the pre-queue is drawn to the front of the line in the order of
HMAC-SHA256(seed, user id), and the seed, committed now by its hash, is revealed. The event now:
  $(curl -fsS --max-time 2 "$PROXY/queue/event" || echo '(not available)')

EOF
fi

# ---------------------------------------------------------------------------------------------
# 5. The crowd
# ---------------------------------------------------------------------------------------------
crowd_rc=0
if [ "$USERS" -gt 0 ]; then
  "$BIN/crowd" --proxy "$PROXY" --metrics "$METRICS/metrics" \
    --users "$USERS" --spread-ms "$SPREAD_MS" --timeout-s "$TIMEOUT_S" || crowd_rc=$?
fi

stats=$(curl -fsS --max-time 2 "http://$API_ADDR/admin/stats" || echo '{}')
peak=$(grep -o '"peakInFlight":[0-9]*' <<<"$stats" | cut -d: -f2)
peak_waiting=$(grep -o '"peakWaiting":[0-9]*' <<<"$stats" | cut -d: -f2)
completed=$(grep -o '"completed":[0-9]*' <<<"$stats" | cut -d: -f2)
echo
echo "order API: ${completed:-?} orders, at most ${peak:-?} at once (of $SLOTS slots), at most ${peak_waiting:-?} queued inside it"
echo "waitroom metrics ($METRICS/metrics):"
curl -fsS --max-time 2 "$METRICS/metrics" \
  | grep -E '^waitroom_(queue_length|admitted_total|tokens_consumed_total|enter_total|status_total|protected_requests_total|redis_errors_total)' \
  | sed 's/^/  /' || true

if [ "$DROP" = 1 ]; then
  echo "the event after the draw ($PROXY/queue/event; the HMACs in drawn order: $PROXY/queue/event/draw):"
  echo "  $(curl -fsS --max-time 2 "$PROXY/queue/event" || echo '(not available)')"
fi

if [ "$crowd_rc" -ne 0 ]; then
  say "the crowd did not finish cleanly (exit $crowd_rc)"
  exit "$crowd_rc"
fi

if [ "$KEEP_RUNNING" = 1 ]; then
  echo
  echo "KEEP_RUNNING=1: waitroom stays up on $PROXY (metrics $METRICS). Ctrl-C stops everything."
  if [ "$PAGE" = 1 ]; then echo "The waiting page: http://127.0.0.1:$front_port/queue/"; fi
  trap 'exit 0' INT TERM
  # Returns when waitroom exits (it drains and exits on Ctrl-C too), or when a trapped signal
  # arrives; either way the EXIT trap stops the rest.
  proxy_rc=0
  wait "$PROXY_PID" || proxy_rc=$?
  say "waitroom exited with code $proxy_rc"
fi
