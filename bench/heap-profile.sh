#!/usr/bin/env bash
# Where an idle keep-alive connection's memory goes: the proxy, built with the system allocator
# (`--no-default-features`: mimalloc bypasses malloc, which heaptrack follows), runs under
# heaptrack while CONNS clients each send one status poll (a NOT_IN_QUEUE answer) and then stay
# connected. heaptrack's peak is reached with every client open, so the peak per allocation site,
# divided by CONNS, is what one idle connection holds there. Prints the total per connection and
# the largest sites (bench/heap_stacks.py).
#
#   bench/heap-profile.sh                        # this checkout
#   bench/heap-profile.sh --source /path/to/wt   # another checkout (a worktree of an older commit)
#   CONNS=5000 bench/heap-profile.sh            # at most 10,000 (the batch a held poll needs)
#   HELD=1 bench/heap-profile.sh                 # held status polls instead (endpoints.hold)
#   HEAP_BIN=bench/out/heap-profile/NAME.waitroom HELD=1 bench/heap-profile.sh --name NAME-held
#                                                # a binary built by an earlier run, not rebuilt
#
# With HELD=1 the room holds CONNS users near its front and admits nobody, and each client's poll
# is held open (contract section 13) for the whole measurement: the cost of a held poll.
#
# The build goes to $HEAP_TARGET (default target/heap-profile; release, without LTO, with line
# tables for the report): a few minutes the first time. Needs heaptrack (apt-get install
# heaptrack), redis-server and python3; with HELD=1 also wrbench ($WRB, default
# target/release/wrbench). Writes bench/out/heap-profile/<name>.{zst,txt,stacks} and the binary it profiled.
set -euo pipefail

BENCH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH/.." && pwd)
# shellcheck source=../scripts/lib.sh
. "$ROOT/scripts/lib.sh"

SOURCE=$ROOT NAME=""
CONNS=${CONNS:-2000}
HELD=${HELD:-0}
while [ $# -gt 0 ]; do
  case "$1" in
    --source) SOURCE=$(cd "$2" && pwd); shift 2 ;;
    --name) NAME=$2; shift 2 ;;
    *) die "unknown argument $1 (see the header of $0)" ;;
  esac
done
NAME=${NAME:-$(git -C "$SOURCE" rev-parse --short HEAD 2>/dev/null || echo source)}
for tool in heaptrack heaptrack_print redis-server redis-cli python3; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed"
done
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
[ "$(ulimit -n)" -ge $((CONNS + 100)) ] || die "ulimit -n is $(ulimit -n): $CONNS connections need more"

TARGET=${HEAP_TARGET:-$ROOT/target/heap-profile}
OUT=$ROOT/bench/out/heap-profile
mkdir -p "$OUT"
BIN=$OUT/$NAME.waitroom
if [ -n "${HEAP_BIN:-}" ]; then
  # A binary this script built before (bench/out/heap-profile/<name>.waitroom): the idle and the
  # held profile of one build, without building it twice.
  [ "$HEAP_BIN" -ef "$BIN" ] || cp "$HEAP_BIN" "$BIN"
else
  say "building $SOURCE with the system allocator into $TARGET"
  # Cargo fingerprints a workspace's own crates by their path inside the workspace, so another
  # checkout's older files look fresh against this target directory: the proxy's crate is cleaned
  # first (its dependencies stay built), and the binary copied out before another build replaces it.
  (cd "$SOURCE" && CARGO_TARGET_DIR=$TARGET cargo clean --release --quiet -p waitroom &&
    CARGO_TARGET_DIR=$TARGET cargo build --release --quiet --no-default-features --bin waitroom \
      --config 'profile.release.lto=false' --config 'profile.release.codegen-units=16' \
      --config 'profile.release.debug="line-tables-only"')
  cp "$TARGET/release/waitroom" "$BIN"
fi
WORK=$(mktemp -d -t waitroom-heap.XXXXXX)
PIDS=()
cleanup() {
  # heaptrack runs the proxy as its child, which outlives it when a step fails.
  pkill -TERM -f "^$BIN --config $WORK/proxy.yaml" 2>/dev/null || true
  stop_all 2 "${PIDS[@]}"
  rm -rf "$WORK"
}
trap cleanup EXIT

read -r RP LP MP <<<"$(free_ports 3)"
redis-server --port "$RP" --save '' --appendonly no --dir "$WORK" --logfile "$WORK/redis.log" &
PIDS+=($!)
wait_until 5 "redis-server" redis-cli -p "$RP" PING || die "redis-server did not start"
cat >"$WORK/proxy.yaml" <<YAML
listen: "127.0.0.1:$LP"
metrics_listen: "127.0.0.1:$MP"
upstream: "127.0.0.1:9"
redis: { url: "redis://127.0.0.1:$RP", key_prefix: heap }
limits: { max_connections: $((CONNS + 1000)) }
admission: { interval: 1h, batch_size: $CONNS }
endpoints: { hold: 60s }
queue: { capacity: $((CONNS * 10)) }
YAML
RUST_LOG=info,waitroom::access=off heaptrack -o "$WORK/heap" "$BIN" --config "$WORK/proxy.yaml" \
  >"$WORK/heaptrack.log" 2>&1 &
PIDS+=($!)
wait_until 60 "the proxy" curl -fs "http://127.0.0.1:$MP/readyz" || die "the proxy did not become ready: $(cat "$WORK/heaptrack.log")"
if [ "$HELD" = 1 ]; then
  # Seeded after the first (empty) admission tick, awaited: nobody is admitted for an hour.
  first_tick() { curl -fs "http://127.0.0.1:$MP/metrics" | grep -E '^waitroom_admission_ticks_total\{([^}]*,)?result="idle"[,}].* [1-9]' >/dev/null; }
  wait_until 30 "the first admission tick" first_tick || die "no admission tick within 30 s"
  WRBENCH=${WRB:-$ROOT/target/release/wrbench}
  [ -x "$WRBENCH" ] || (cd "$ROOT" && cargo build --release --quiet -p waitroom-bench)
  "$WRBENCH" seed-queue --prefix heap --count "$CONNS" | redis-cli -p "$RP" --pipe >/dev/null
fi

# Every connection open at once for 3 s: the heap's peak. Idle connections are opened 10 at a
# time, so the requests answered on the way (about 12 kB each while in flight) add at most 120 kB
# to the peak (60 B a connection of 2,000); held polls are all in flight by design.
# shellcheck disable=SC2046
python3 "$BENCH/open_polls.py" --port "$LP" --metrics-port "$MP" --count "$CONNS" --linger 3 \
  $([ "$HELD" = 1 ] && echo --held || echo --in-flight 10)

# heaptrack is a script that runs the proxy as its child: the proxy is stopped, and heaptrack,
# which writes its data as the proxy exits, is waited for.
kill -TERM "$(pgrep -f "^$BIN --config $WORK/proxy.yaml")"
wait "${PIDS[1]}" 2>/dev/null || true
PIDS=("${PIDS[0]}")
data=$(ls "$WORK"/heap*.zst 2>/dev/null | head -n 1)
[ -n "$data" ] || die "heaptrack wrote no data: $(cat "$WORK/heaptrack.log")"
cp "$data" "$OUT/$NAME.zst"
heaptrack_print --print-peaks 1 --peak-limit 40 --print-allocators 0 --print-temporary 0 \
  --print-leaks 0 "$data" >"$OUT/$NAME.txt" 2>/dev/null
heaptrack_print --flamegraph-cost-type peak -F "$OUT/$NAME.stacks" "$data" >/dev/null 2>&1
what=$([ "$HELD" = 1 ] && echo "held polls" || echo "idle connections")
say "$NAME: heap at its peak, by the first three frames of each stack that are not the allocator's or"
say "a container's, per connection ($CONNS $what; stacks: $OUT/$NAME.stacks)"
python3 "$BENCH/heap_stacks.py" "$OUT/$NAME.stacks" "$CONNS"
