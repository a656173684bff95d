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


def summary(body, keep):
    """The last `keep` lines of the output, after the panic's first lines
    when it panicked before them."""
    start = max(0, len(body) - keep)
    panic = [i for i, line in enumerate(body) if "panicked at" in line]
    if panic and panic[0] < start:
        return body[panic[0]:panic[0] + 4] + ["..."] + body[start:]
    return body[start:]


def main():
    path = sys.argv[1]
    keep = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    with open(path, errors="replace") as log:
        lines = [line.rstrip("\n") for line in log]
    for name, body in blocks(lines):
        print(f"== {name}: where it panicked, and the end of its output ==")
        for line in summary([b for b in body if b.strip()], keep):
            print("  " + line[:300])


if __name__ == "__main__":
    main()
