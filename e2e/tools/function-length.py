#!/usr/bin/env python3
"""Fails when a function outside the tests and the pure planners runs to
`--max` lines or more (body braces included).

Usage: function-length.py [--max N] [--list] DIR...

Functions inside `#[cfg(test)] mod tests` blocks are skipped, as are the
files named in PLANNERS (pure decision tables, long by nature of the cases
they enumerate). The parser is a brace counter that knows Rust's strings,
chars, raw strings and comments: enough for this code base, not a Rust
parser."""
import os
import re
import sys

# The pure planners: each function is one decision over many cases.
PLANNERS = ("src/rollout/", "src/upgrade/", "src/sip/", "src/drain/")
FN = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"C\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")


def strip(line, state):
    """The line with strings, chars and comments blanked; `state` carries a
    block comment or a raw string across lines."""
    out = []
    i = 0
    n = len(line)
    while i < n:
        if state.get("block"):
            end = line.find("*/", i)
            if end < 0:
                return "".join(out)
            state["block"] = False
            i = end + 2
            continue
        if state.get("raw") is not None:
            end = line.find('"' + "#" * state["raw"], i)
            if end < 0:
                return "".join(out)
            i = end + 1 + state["raw"]
            state["raw"] = None
            continue
        if state.get("str"):
            c = line[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                state["str"] = False
            i += 1
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["block"] = True
            i += 2
            continue
        m = re.match(r'b?r(#*)"', line[i:])
        if m and (i == 0 or not (line[i - 1].isalnum() or line[i - 1] == "_")):
            state["raw"] = len(m.group(1))
            i += m.end()
            continue
        if c == '"':
            state["str"] = True
            i += 1
            continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", line[i:])
            if m:
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    """(name, first line, line count) of each function outside test modules."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    state = {}
    depth = 0
    stack = []  # (name, start, depth at open) of open functions
    test_depth = None  # depth at which a cfg(test) module opened
    pending_test = False
    pending_fn = None
    found = []
    for no, raw in enumerate(lines, 1):
        code = strip(raw, state)
        if "#[cfg(test)]" in raw:
            pending_test = True
        m = FN.match(code)
        if m and test_depth is None:
            pending_fn = (m.group(1), no)
        for c in code:
            if c == "{":
                if pending_test and test_depth is None:
                    test_depth = depth
                    pending_test = False
                if pending_fn is not None:
                    stack.append((pending_fn[0], pending_fn[1], depth))
                    pending_fn = None
                depth += 1
            elif c == "}":
                depth -= 1
                if stack and stack[-1][2] == depth:
                    name, start, _ = stack.pop()
                    found.append((name, start, no - start + 1))
                if test_depth is not None and depth == test_depth:
                    test_depth = None
            elif c == ";":
                # A declaration without a body (a trait's required method).
                pending_fn = None
                if pending_test and "mod" not in code:
                    pending_test = False
    return found


def main(argv):
    limit = 80
    listing = False
    dirs = []
    args = iter(argv)
    for a in args:
        if a == "--max":
            limit = int(next(args))
        elif a == "--list":
            listing = True
        else:
            dirs.append(a)
    long = []
    for d in dirs or ["src", "crates"]:
        for root, _, files in os.walk(d):
            if "/tests" in root or root.endswith("tests") or "/testkit" in root or "target" in root:
                continue
            for name in files:
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(root, name)
                if any(path.startswith(p) or ("/" + p) in path for p in PLANNERS):
                    continue
                for fn, start, count in functions(path):
                    if count >= limit:
                        long.append((count, f"{path}:{start}", fn))
    long.sort(reverse=True)
    for count, where, fn in long:
        print(f"{count:5} {where} {fn}")
    if long and not listing:
        print(f"{len(long)} function(s) of {limit} lines or more", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
