#!/usr/bin/env python3
"""Fails on a pipeline that ends in a reader which stops early (`grep -q`,
`grep -m`, `head`, an `awk` that exits) in the project's shell scripts.

Every script runs with `set -o pipefail`. A reader that exits at its first
match closes the pipe while the writer may still be writing; the writer then
dies of SIGPIPE, the pipeline exits 141 and `set -e` ends the script. Whether
the writer was still writing depends on how much it had left and on timing,
so such a line fails now and then: a CI run once ended in exit 141 on
`kubectl logs ... | grep -m1 ...` once the log had outgrown the pipe buffer.
Read a file, a here-string or a captured value instead.

Usage: early-exit-pipes.py FILE..."""
import re
import sys

# A pipe (not `||`) followed by a command that stops reading before EOF.
EARLY = re.compile(
    r"(?<!\|)\|(?!\|)\s*(?:grep\s+(?:-[A-Za-z]*[qm][A-Za-z0-9]*|--quiet|--silent|--max-count)"
    r"|head\b|awk\b[^|]*\bexit\b)"
)


def offences(path):
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            code = line.split(" #", 1)[0]
            if code.lstrip().startswith("#"):
                continue
            if EARLY.search(code):
                yield number, line.rstrip()


def main(paths):
    found = 0
    for path in paths:
        for number, line in offences(path):
            print(f"{path}:{number}: a pipe into a reader that stops early (SIGPIPE under pipefail): {line.strip()}")
            found += 1
    if found:
        print(f"{found} pipeline(s) can exit 141 at random; read a file, a here-string or a captured value instead")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
