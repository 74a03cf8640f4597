#!/usr/bin/env bash
# What a waiting user costs in Redis. Fills a room in a private redis-server with N waiting users
# through the proxy's own enter script (lua/enter.lua with lua/poll_clock.lua in front, as
# src/store/mod.rs builds it; EVALSHA pipelined through `redis-cli --pipe`), then reports
# `MEMORY USAGE` of the line and the growth of `INFO memory` used_memory, per user.
#
#   scripts/redis-memory.sh                      # 100k and 1M users, 36-character ids (a UUID)
#   SIZES="100000" ID_LEN=8 scripts/redis-memory.sh
#   ENFORCE=1 SIZES=100000 scripts/redis-memory.sh   # polling.enforce on: a poll clock per user
#   AOF=1 scripts/redis-memory.sh                # also: AOF everysec, SIGKILL after each fill, and
#                                                # how long the restart takes to load the room
#
# The call mirrors `Room::enter` (keys and arguments); if the script's interface changes, the
# check of the first reply below fails loudly instead of measuring something else.
# With ENFORCE=1 keep the sizes small: poll clocks expire after 2 x pollAfter + 1 s, so a fill
# slower than ~20 s measures fewer of them.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

SIZES=${SIZES:-"100000 1000000"}
ID_LEN=${ID_LEN:-36}
ENFORCE=${ENFORCE:-0}
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

# The enter script as the proxy sends it.
script="$dir/enter.lua"
if [ -f "$ROOT/lua/poll_clock.lua" ]; then
  { cat "$ROOT/lua/poll_clock.lua"; echo; cat "$ROOT/lua/enter.lua"; } >"$script"
else
  cat "$ROOT/lua/enter.lua" >"$script"
fi
sha=$(cli -x SCRIPT LOAD <"$script")
# The poll clock arguments: 0 = not enforced; else 1 - grace (20 %) and the default tiers as
# (first position, pollAfter ms) at the default rate of 100 users/s.
if [ "$ENFORCE" = 1 ]; then clock="0.8 6001 10000 1001 5000 1 2000"; else clock="0"; fi

# One EVALSHA per user in the Redis protocol: KEYS line, seq, token, poll clock, abuse counter;
# ARGV user, capacity, identities per address (0 = off), the poll clock.
commands() {
  awk -v n="$1" -v first="$2" -v sha="$sha" -v p="{$PREFIX}" -v idlen="$ID_LEN" -v clock="$clock" '
    function bulk(s) { return "$" length(s) "\r\n" s "\r\n" }
    BEGIN {
      nclock = split(clock, c, " ")
      fmt = "u%0" (idlen - 1) "d"
      head = bulk("EVALSHA") bulk(sha) bulk("5") bulk(p ":queue") bulk(p ":seq")
      tail = bulk("1000000000") bulk("0")
      for (i = 1; i <= nclock; i++) tail = tail bulk(c[i])
      argc = 3 + 5 + 3 + nclock
      for (i = first; i < first + n; i++) {
        u = sprintf(fmt, i)
        printf "*%d\r\n%s%s%s%s%s%s", argc, head, bulk(p ":token:" u), bulk(p ":poll:" u),
          bulk(p ":abuse:-"), bulk(u), tail
      }
    }'
}

field() { cli INFO memory | tr -d '\r' | awk -F: -v f="$1" '$1 == f { print $2 }'; }

# One call first: it must answer WAITING at place 1, or the interface changed.
# shellcheck disable=SC2086 # $clock is a list of arguments
reply=$(cli EVALSHA "$sha" 5 "{$PREFIX}:queue" "{$PREFIX}:seq" "{$PREFIX}:token:probe" \
  "{$PREFIX}:poll:probe" "{$PREFIX}:abuse:-" probe 1000000000 0 $clock | tr '\n' ' ')
case "$reply" in
  "WAITING 1 0 "*) ;;
  *) die "the enter script answered '$reply'; update this script to Room::enter's call" ;;
esac

printf '%-9s %-7s %-13s %-13s %-10s %-18s %-10s %s\n' users id_len zset_bytes zset/user keys used_memory_delta delta/user fill_s
for n in $SIZES; do
  cli FLUSHALL >/dev/null
  cli MEMORY PURGE >/dev/null 2>&1 || true
  cli -x SCRIPT LOAD <"$script" >/dev/null # a restarted server has forgotten it
  before=$(field used_memory)
  start=$(date +%s.%N)
  out=$(commands "$n" 1 | cli --pipe 2>&1)
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
say "redis-server $(redis-server --version | awk '{print $3}'), ENFORCE=$ENFORCE; encoding $(cli OBJECT ENCODING "{$PREFIX}:queue")"
