#!/usr/bin/env python3
"""Opens COUNT connections to a waitroom and leaves each one either idle after one answered status
poll (users nobody queued) or with its status poll held open (users u1..uCOUNT, queued near the
front by `wrbench seed-queue`), then holds them all open for a while and closes them.

  open_polls.py --port P --metrics-port M --count N [--held] [--pid PID] [--linger S] [--in-flight K]

At most K connections (500) are being opened and answered at once: a heap profile of idle
connections asks for few, so that requests in flight do not make the heap's peak.

With --held it waits until the proxy reports every poll held (`waitroom_held_polls`). It prints
one line: the held polls, and with --pid the process's RSS, once every connection is open. Used by
bench/held-rss.sh (RSS) and bench/heap-profile.sh (heap by allocation site).
"""
import argparse
import asyncio
import re
import urllib.request


def held_polls(metrics_port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    # One series a room (the `room` label): summed over the proxy's rooms.
    return sum(float(v) for v in re.findall(r"^waitroom_held_polls(?:\{[^}]*\})? (\S+)$", text, re.M))


def rss_kb(pid):
    return int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{pid}/status").read()).group(1))


async def main(args):
    writers = []
    limit = asyncio.Semaphore(args.in_flight)

    async def one(i):
        async with limit:
            reader, writer = await asyncio.open_connection("127.0.0.1", args.port)
            user = f"u{i}" if args.held else f"nobody{i}"
            writer.write(f"GET /queue/status HTTP/1.1\r\nHost: b\r\nX-User-Id: {user}\r\n\r\n".encode())
            await writer.drain()
            if not args.held:
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200"), head
            writers.append(writer)

    await asyncio.gather(*(one(i) for i in range(1, args.count + 1)))
    for _ in range(100):
        if not args.held or held_polls(args.metrics_port) >= args.count:
            break
        await asyncio.sleep(0.2)
    line = f"held polls: {held_polls(args.metrics_port):.0f}"
    if args.pid:
        line += f", rss: {rss_kb(args.pid)} kB"
    print(line, flush=True)
    await asyncio.sleep(args.linger)
    for writer in writers:
        writer.close()
    await asyncio.sleep(1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--held", action="store_true")
    parser.add_argument("--pid", type=int)
    parser.add_argument("--linger", type=float, default=0)
    parser.add_argument("--in-flight", type=int, default=500)
    asyncio.run(main(parser.parse_args()))
