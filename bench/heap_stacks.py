#!/usr/bin/env python3
"""Sums a heaptrack peak-cost stack file (heaptrack_print --flamegraph-cost-type peak -F FILE) by
allocation site, per connection: usage `heap_stacks.py FILE CONNS [ROWS]`.

A site is named by the first three frames, counted from the allocation, that belong to neither the
allocator nor a container (Box, Vec, Arc, BytesMut, hash maps...), each with its source file:
`{async_block#0} (limits.rs) <- process_new_http (lib.rs)` is a box that pingora's
`process_new_http` makes, called from our connection loop. Symbols are demangled with c++filt.
"""
import collections
import re
import subprocess
import sys

# Frames that only say how memory was taken, not who wanted it.
PLUMBING = re.compile(
    r"\((alloc|boxed|raw_vec.*|mod|vec.*|spec_.*|function|string|arc|rc|bytes_mut|bytes|map|unix"
    r"|convert|sync|hash.*|macros)\.rs\)$"
    r"|^(alloc|malloc|realloc|calloc|alloc_zeroed|0x[0-9a-f]+)( |$)"
)


def main():
    path, conns = sys.argv[1], int(sys.argv[2])
    rows_wanted = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    rows = []
    for line in open(path, encoding="utf-8", errors="replace").read().splitlines():
        stack, _, cost = line.rpartition(" ")
        rows.append((stack.split(";"), int(cost)))
    frames = sorted({f for stack, _ in rows for f in stack})
    parts = [f.rsplit(" (", 1) for f in frames]
    demangled = subprocess.run(
        ["c++filt"], input="\n".join(p[0] for p in parts), capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert len(demangled) == len(frames)
    name = {
        f: re.sub(r"\[[0-9a-f]{16}\]", "", d).replace("<>", "") + (" (" + p[1] if len(p) > 1 else "")
        for f, d, p in zip(frames, demangled, parts)
    }
    sites = collections.Counter()
    total = 0
    for stack, cost in rows:
        total += cost
        owners = [name[f] for f in reversed(stack) if name[f].strip() and not PLUMBING.search(name[f])][:3]
        sites[" <- ".join(o[:70] for o in owners)] += cost
    print(f"  total {total / 1e6:.2f} MB at the peak: {total / conns:.0f} B a connection")
    for site, cost in sites.most_common(rows_wanted):
        print(f"  {cost / conns:7.0f} B  {site}")


if __name__ == "__main__":
    main()
