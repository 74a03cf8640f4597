#!/usr/bin/env python3
"""Lists the import circles between the crate's source files (`use crate::...` and `crate::x::`
paths), so "no circle" is a command that prints nothing, not a claim.

    python3 scripts/import-circles.py          # circles, one per line; exit 1 if any
    python3 scripts/import-circles.py --edges  # every file -> file edge
A file's children (a `mod.rs`'s submodules, `foo.rs`'s `foo/`) are not edges to it: a parent
declaring its modules is how Rust is laid out. Test modules (`#[cfg(test)] mod tests`) are left out.
"""
import os, re, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")

def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)

files = {}
for dirpath, _, names in os.walk(ROOT):
    for n in names:
        if n.endswith(".rs"):
            p = os.path.join(dirpath, n)
            files[module_of(p)] = p

def strip_tests(text):
    m = re.search(r"#\[cfg\(test\)\]\s*mod tests", text)
    return text[: m.start()] if m else text

def resolve(parts):
    # the longest prefix of parts that is a file of the crate
    for i in range(len(parts), 0, -1):
        if tuple(parts[:i]) in files:
            return tuple(parts[:i])
    return None

edges = {m: set() for m in files}
for mod, path in files.items():
    text = strip_tests(open(path).read())
    text = re.sub(r"//[^\n]*", "", text)
    refs = []
    for m in re.finditer(r"\bcrate::((?:\w+::)*\w+)", text):
        refs.append(m.group(1).split("::"))
    # grouped imports: use crate::{a::B, c}
    for m in re.finditer(r"\bcrate::\{([^;]*?)\};", text, re.S):
        for item in re.split(r",(?![^{]*\})", m.group(1)):
            item = item.strip()
            if item:
                refs.append(re.split(r"::", item.split("{")[0].strip(":").strip()))
    # super:: inside a module points at its parent
    for m in re.finditer(r"\bsuper::((?:\w+::)*\w+)", text):
        base = list(mod[:-1]) if not path.endswith("mod.rs") else list(mod[:-1])
        refs.append(base + m.group(1).split("::"))
    for r in refs:
        target = resolve([p for p in r if p])
        if target is None or target == mod:
            continue
        # a parent naming its own child, or a child its ancestor's items through the parent
        if target[: len(mod)] == mod:
            continue
        edges[mod].add(target)

def name(m):
    return "::".join(m) or "crate"

if "--edges" in sys.argv:
    for m in sorted(edges):
        for t in sorted(edges[m]):
            print(f"{name(m)} -> {name(t)}")
    sys.exit(0)

# strongly connected components (Tarjan)
index, low, stack, on, sccs = {}, {}, [], set(), []
counter = [0]
sys.setrecursionlimit(10000)
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))
for v in edges:
    if v not in index:
        visit(v)
for c in sccs:
    print("circle: " + ", ".join(name(m) for m in c))
sys.exit(1 if sccs else 0)
