#!/usr/bin/env bash
# What a waiting user costs in Redis. Fills a room in a private redis-server with N waiting users,
# writing what lua/enter.lua writes for a new place (`INCR {room}:seq`, `ZADD {room}:queue NX seq
# user`), pipelined through `redis-cli --pipe`, then reports `MEMORY USAGE` of the line and the
# growth of `INFO memory` used_memory, per user.
#
#   scripts/redis-memory.sh                      # 100k and 1M users, 36-character ids (a UUID)
#   SIZES="100000" ID_LEN=8 scripts/redis-memory.sh
#   ENFORCE=1 scripts/redis-memory.sh            # polling.enforce on: a poll clock key per user
#                                                # (lua/poll_clock.lua, start_poll_clock)
#   ABANDON=1 scripts/redis-memory.sh            # queue.abandon_after on: a heard-from entry per
#                                                # user (the {room}:heard sorted set)
#   AOF=1 scripts/redis-memory.sh                # also: AOF everysec, SIGKILL after each fill, and
#                                                # how long the restart takes to load the room
#
# The writes mirror the scripts rather than calling them, so the figures do not depend on the
# scripts' argument lists (which grow with features); keep them in step with the key layout in
# src/store/keys.rs (`Keys`) if it changes.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

SIZES=${SIZES:-"100000 1000000"}
ID_LEN=${ID_LEN:-36}
ENFORCE=${ENFORCE:-0}
ABANDON=${ABANDON:-0}
AOF=${AOF:-0}
PREFIX=mem

ensure_tools redis-server redis-cli
command -v awk >/dev/null 2>&1 || die "awk is needed"

dir=$(mktemp -d)
port=$(free_port)
if [ "$AOF" = 1 ]; then persistence=(--appendonly yes --appendfsync everysec); else persistence=(--appendonly no); fi
start_redis() {
  redis-server --port "$port" --bind 127.0.0.1 --save "" "${persistence[@]}" --dir "$dir" \
    --daemonize no >>"$dir/redis.log" 2>&1 &
  pid=$!
}
start_redis
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
cli() { redis-cli -p "$port" "$@"; }
# PONG, not LOADING: the data set is in memory.
loaded() { [ "$(cli ping 2>/dev/null)" = PONG ]; }
wait_until 10 "redis-server on $port" loaded || die "redis-server did not start"

# Per user, in the Redis protocol: the place in line, and the extra keys the options keep.
commands() {
  awk -v n="$1" -v p="{$PREFIX}" -v idlen="$ID_LEN" -v enforce="$ENFORCE" -v abandon="$ABANDON" '
    function bulk(s) { return "$" length(s) "\r\n" s "\r\n" }
    BEGIN {
      fmt = "u%0" (idlen - 1) "d"
      now = "1790000000000"
      for (i = 1; i <= n; i++) {
        u = sprintf(fmt, i)
        printf "*5\r\n%s%s%s%s%s", bulk("ZADD"), bulk(p ":queue"), bulk("NX"), bulk(i), bulk(u)
        # The poll clock: when the next status is on time; it expires by itself (1 h here, so
        # none expires while measuring).
        if (enforce == 1)
          printf "*5\r\n%s%s%s%s%s", bulk("SET"), bulk(p ":poll:" u), bulk(now), bulk("PX"), bulk("3600000")
        if (abandon == 1)
          printf "*4\r\n%s%s%s%s", bulk("ZADD"), bulk(p ":heard"), bulk(now), bulk(u)
      }
      printf "*3\r\n%s%s%s", bulk("SET"), bulk(p ":seq"), bulk(n)
    }'
}

field() { cli INFO memory | tr -d '\r' | awk -F: -v f="$1" '$1 == f { print $2 }'; }

printf '%-9s %-7s %-13s %-13s %-10s %-18s %-10s %s\n' users id_len zset_bytes zset/user keys used_memory_delta delta/user fill_s
for n in $SIZES; do
  cli FLUSHALL >/dev/null
  cli MEMORY PURGE >/dev/null 2>&1 || true
  before=$(field used_memory)
  start=$(date +%s.%N)
  out=$(commands "$n" | cli --pipe 2>&1)
  end=$(date +%s.%N)
  case "$out" in *"errors: 0,"*) ;; *) die "pipe reported errors: $out" ;; esac
  line=$(cli ZCARD "{$PREFIX}:queue")
  [ "$line" = "$n" ] || die "expected $n waiting users, the line holds $line"
  after=$(field used_memory)
  zset=$(cli MEMORY USAGE "{$PREFIX}:queue" SAMPLES 0)
  keys=$(cli DBSIZE)
  awk -v n="$n" -v idlen="$ID_LEN" -v zset="$zset" -v keys="$keys" -v b="$before" -v a="$after" \
    -v s="$start" -v e="$end" 'BEGIN {
      printf "%-9d %-7d %-13d %-13.1f %-10d %-18d %-10.1f %.1f\n", n, idlen, zset, zset / n, keys, a - b, (a - b) / n, e - s
    }'
  if [ "$AOF" = 1 ]; then
    # A crash with everysec loses at most the last second: wait it out, then kill and reload.
    sleep 1.5
    aof_bytes=$(du -sb "$dir/appendonlydir" | awk '{print $1}')
    kill -9 "$pid"
    wait "$pid" 2>/dev/null || true
    killed=$(date +%s.%N)
    start_redis
    wait_until 600 "redis-server to load the AOF" loaded || die "redis-server did not come back"
    back=$(date +%s.%N)
    kept=$(cli ZCARD "{$PREFIX}:queue")
    awk -v n="$n" -v kept="$kept" -v bytes="$aof_bytes" -v k="$killed" -v b="$back" 'BEGIN {
      printf "  AOF everysec: %d MB on disk; SIGKILL -> answering again after %.1f s; %d of %d waiting users back\n", bytes / 1e6, b - k, kept, n
    }'
  fi
done
say "redis-server $(redis-server --version | awk '{print $3}'), ENFORCE=$ENFORCE ABANDON=$ABANDON; line encoding $(cli OBJECT ENCODING "{$PREFIX}:queue")"
