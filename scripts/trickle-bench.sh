#!/usr/bin/env bash
# Slow clients must not slow anyone else down (README: "Configuration", the `limits` keys): the p99 of ordinary status
# polls, measured with wrk, alone and then while TRICKLERS connections send a request head one
# byte at a time (reconnecting whenever the proxy closes them), plus how many of those the proxy
# closed at header_timeout and its resident memory.
#
#   scripts/trickle-bench.sh                    # release build, 1000 tricklers
#   PROFILE=debug TRICKLERS=200 scripts/trickle-bench.sh
#
# Settings: TRICKLERS=1000  BYTE_EVERY_MS=500 (each trickler's pace)  DURATION=20 (seconds per
# phase)  CONNS=16 (wrk connections)  HEADER_TIMEOUT=10s  PROFILE=release  WAITROOM_BIN= (a
# binary to measure instead of building one)
#
# Needs wrk, redis-server and python3 (the tricklers: asyncio, one process). Starts its own Redis
# on a free port in a temporary directory and stops everything it started on exit. Numbers from a
# machine that runs other work are noisy: compare the two phases of one run, not runs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

TRICKLERS=${TRICKLERS:-1000}
BYTE_EVERY_MS=${BYTE_EVERY_MS:-500}
DURATION=${DURATION:-20}
CONNS=${CONNS:-16}
HEADER_TIMEOUT=${HEADER_TIMEOUT:-10s}
PROFILE=${PROFILE:-release}

for tool in wrk redis-server python3 curl; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed"
done

WORKDIR=$(mktemp -d -t waitroom-trickle.XXXXXX)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORKDIR"
}
trap cleanup EXIT

if [ -n "${WAITROOM_BIN:-}" ]; then
  BIN=$WAITROOM_BIN
else
  say "building waitroom ($PROFILE)"
  if [ "$PROFILE" = release ]; then
    (cd "$ROOT" && cargo build --release --bin waitroom -q)
  else
    (cd "$ROOT" && cargo build --bin waitroom -q)
  fi
  BIN="$ROOT/target/$PROFILE/waitroom"
fi

REDIS_PORT=$(free_ports 1)
redis-server --port "$REDIS_PORT" --save '' --appendonly no --dir "$WORKDIR" >"$WORKDIR/redis.log" 2>&1 &
PIDS+=($!)

read -r PORT METRICS_PORT <<<"$(free_ports 2)"
cat >"$WORKDIR/proxy.yaml" <<EOF
listen: "127.0.0.1:$PORT"
metrics_listen: "127.0.0.1:$METRICS_PORT"
upstream: "127.0.0.1:1"
redis: {url: "redis://127.0.0.1:$REDIS_PORT", key_prefix: trickle-bench}
limits: {header_timeout: $HEADER_TIMEOUT, max_connections: $((TRICKLERS + CONNS + 100))}
EOF
RUST_LOG=warn "$BIN" --config "$WORKDIR/proxy.yaml" >"$WORKDIR/proxy.log" 2>&1 &
PROXY_PID=$!
PIDS+=("$PROXY_PID")
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fs "http://127.0.0.1:$METRICS_PORT/readyz" >/dev/null || die "waitroom did not get ready: $(cat "$WORKDIR/proxy.log")"

rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$PROXY_PID/status"; }
# CPU seconds the proxy has used so far (user + system).
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$PROXY_PID/stat"; }
metric() { curl -fs "http://127.0.0.1:$METRICS_PORT/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
# wrk's 99th percentile latency line, e.g. "99%    3.21ms", and the proxy's CPU meanwhile.
p99() {
  local cpu0
  cpu0=$(cpu_s)
  wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -H 'X-User-Id: bench-user' \
    "http://127.0.0.1:$PORT/queue/status" >"$WORKDIR/wrk.$1" 2>&1
  printf '%s: p99 %s, %s req/s, proxy CPU %s s\n' "$1" \
    "$(awk '$1 == "99%" {print $2}' "$WORKDIR/wrk.$1")" \
    "$(awk '/Requests\/sec/ {print $2}' "$WORKDIR/wrk.$1")" \
    "$(awk -v a="$cpu0" -v b="$(cpu_s)" 'BEGIN {printf "%.2f", b - a}')"
}

cat >"$WORKDIR/trickle.py" <<'EOF'
import asyncio, sys, time

host, port, n, every, duration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
HEAD = b"GET /queue/status HTTP/1.1\r\nHost: x\r\nX-User-Id: slow\r\nX-Pad: "
stats = {"opened": 0, "closed_by_proxy": 0, "answered": 0}

async def trickler(end):
    while time.monotonic() < end:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(every)
            continue
        stats["opened"] += 1
        closed = asyncio.ensure_future(reader.read(1))
        i = 0
        try:
            while time.monotonic() < end and not closed.done():
                writer.write(HEAD[i:i + 1] or b"a")
                i += 1
                await writer.drain()
                await asyncio.wait([closed], timeout=every)
        except OSError:
            pass
        if closed.done():
            data = closed.result() if not closed.exception() else b""
            stats["answered" if data else "closed_by_proxy"] += 1
        else:
            closed.cancel()
        writer.close()

async def main():
    end = time.monotonic() + duration
    # Open them over the first second rather than in one burst.
    tasks = []
    for k in range(n):
        tasks.append(asyncio.ensure_future(trickler(end)))
        if k % 100 == 99:
            await asyncio.sleep(0.1)
    await asyncio.gather(*tasks)
    print(f"tricklers: {stats['opened']} connections opened, {stats['closed_by_proxy']} closed by the proxy, {stats['answered']} answered")

asyncio.run(main())
EOF

say "phase 1: status polls alone ($CONNS connections, ${DURATION}s)"
RSS_BEFORE=$(rss_kb)
ALONE=$(p99 alone)

say "phase 2: the same, with $TRICKLERS connections trickling a head (a byte every ${BYTE_EVERY_MS} ms)"
python3 "$WORKDIR/trickle.py" 127.0.0.1 "$PORT" "$TRICKLERS" "$(awk -v ms="$BYTE_EVERY_MS" 'BEGIN {print ms / 1000}')" \
  "$((DURATION + 3))" >"$WORKDIR/trickle.out" 2>&1 &
TRICKLE_PID=$!
PIDS+=("$TRICKLE_PID")
sleep 2
OPEN_DURING=$(metric waitroom_open_connections)
RSS_DURING=$(rss_kb)
WITH=$(p99 "with-tricklers")
wait "$TRICKLE_PID" || true

echo "$ALONE"
echo "$WITH"
cat "$WORKDIR/trickle.out"
echo "open connections 2 s into phase 2: ${OPEN_DURING:-?}"
echo "closed at header_timeout ($HEADER_TIMEOUT): $(metric 'waitroom_connections_closed_total{limit="header_timeout"}')"
echo "proxy RSS: ${RSS_BEFORE} kB before, ${RSS_DURING} kB with the tricklers"
