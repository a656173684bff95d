#!/usr/bin/env python3
"""Prints, for each failed test in a `cargo test` log, where it panicked and
the end of its output, so a CI run's last lines say why, not only which.

    python3 e2e/tools/test-failures.py .run/test/cargo-test.log [LINES]
"""
import re
import sys

BLOCK = re.compile(r"^---- (\S+) stdout ----$")


def blocks(lines):
    """(test, its output lines) for each failure block of libtest's report."""
    name, body = None, []
    for line in lines:
        start = BLOCK.match(line)
        if start or (name and line.startswith("failures:")):
            if name:
                yield name, body
            name, body = (start.group(1), []) if start else (None, [])
        elif name:
            body.append(line)
    if name:
        yield name, body


LOUD = re.compile(r"^\S+\s+(WARN|ERROR)\b")


def summary(body, keep):
    """The last `keep` warnings and errors its operators logged before the
    panic, the `keep` lines the test printed before it panicked, then the
    whole panic message (not its backtrace); the last `keep` lines when it
    did not panic."""
    panic = next((i for i, line in enumerate(body) if "panicked at" in line), None)
    if panic is None:
        return body[-keep:]
    end = next(
        (i for i in range(panic + 1, len(body))
         if body[i].startswith(("stack backtrace:", "note: "))),
        len(body),
    )
    before = max(0, panic - keep)
    loud = [line for line in body[:before] if LOUD.match(line)][-keep:]
    if loud:
        loud = ["(warnings and errors logged before)"] + loud + ["(the last lines before the panic)"]
    return loud + body[before:panic] + body[panic:end]


def main():
    path = sys.argv[1]
    keep = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    with open(path, errors="replace") as log:
        lines = [line.rstrip("\n") for line in log]
    for name, body in blocks(lines):
        print(f"== {name}: what it printed last, and its panic ==")
        for line in summary([b for b in body if b.strip()], keep):
            print("  " + line[:4000])


if __name__ == "__main__":
    main()
