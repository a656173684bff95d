#!/usr/bin/env python3
"""Fails when the nodewarden library's modules import each other in a cycle.

The nodes are the library's top-level modules (src/<m>.rs or src/<m>/) and the
controllers of src/controllers/ (each controller its own node, a file or a
directory); an edge A -> B is a reference to `crate::B` (or, between
controllers, `super::B` from src/controllers/ and `super::super::B` one level
below) in A's code,
its unit tests left out. Prints each cycle and exits 1 when there is one.
"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "src"
TESTS = re.compile(r"#\[cfg\(test\)\]\s*mod tests\b.*", re.S)


def code(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = TESTS.sub("", text)
    return re.sub(r"//[^\n]*", "", text)


top = sorted(
    n[:-3] if n.endswith(".rs") else n
    for n in os.listdir(src)
    if n not in ("lib.rs", "main.rs") and (n.endswith(".rs") or os.path.isdir(os.path.join(src, n)))
)
controllers_dir = os.path.join(src, "controllers")
controllers = sorted(
    n[:-3] if n.endswith(".rs") else n
    for n in os.listdir(controllers_dir)
    if (n.endswith(".rs") and n != "mod.rs") or os.path.isdir(os.path.join(controllers_dir, n))
)

files = {}  # node -> [paths]
for m in top:
    if m == "controllers":
        continue
    d = os.path.join(src, m)
    if os.path.isdir(d):
        files[m] = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith(".rs")]
    else:
        files[m] = [d + ".rs"]
files["controllers"] = [os.path.join(controllers_dir, "mod.rs")]
for c in controllers:
    d = os.path.join(controllers_dir, c)
    if os.path.isdir(d):
        files["controllers::" + c] = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith(".rs")]
    else:
        files["controllers::" + c] = [d + ".rs"]


def parent(path):
    """How a controller's file names src/controllers/: `super::` from
    controllers/<c>.rs and controllers/<c>/mod.rs, one `super::` more per
    level below."""
    rel = os.path.relpath(path, controllers_dir).split(os.sep)
    depth = len(rel) - (1 if rel[-1] == "mod.rs" else 0)
    return r"\b" + "super::" * depth

edges = {n: set() for n in files}
for node, paths in files.items():
    for p in paths:
        text = code(p)
        for m in set(re.findall(r"\bcrate::([a-z_]+)", text)):
            if m == "controllers":
                for c in set(re.findall(r"\bcrate::controllers::([a-z_]+)", text)):
                    target = "controllers::" + c if c in controllers else "controllers"
                    if target != node:
                        edges[node].add(target)
                if re.search(r"\bcrate::controllers::(?:[A-Z{]|[a-z_]+\b(?!::))", text):
                    if node != "controllers":
                        edges[node].add("controllers")
            elif m in files and m != node:
                edges[node].add(m)
        if node.startswith("controllers::"):
            up = parent(p)
            names = re.findall(up + r"([a-z_]+)", text)
            for group in re.findall(up + r"\{([^}]*)\}", text):
                names += re.findall(r"\b([a-z_]+)\b", group)
            for c in set(names):
                if c in controllers and "controllers::" + c != node:
                    edges[node].add("controllers::" + c)

# Cycles: strongly connected components of more than one node (Tarjan).
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(edges[v]):
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        scc = []
        while True:
            w = stack.pop()
            on.discard(w)
            scc.append(w)
            if w == v:
                break
        if len(scc) > 1:
            sccs.append(sorted(scc))


sys.setrecursionlimit(10000)
for v in sorted(edges):
    if v not in index:
        visit(v)
if sccs:
    for scc in sccs:
        inside = [f"{a} -> {b}" for a in scc for b in sorted(edges[a]) if b in scc]
        print("module cycle: " + ", ".join(scc) + " (" + "; ".join(inside) + ")")
    sys.exit(1)
print(f"no module cycle among {len(edges)} modules")
