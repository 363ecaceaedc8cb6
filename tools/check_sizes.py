#!/usr/bin/python3
"""Sizes that keep a file readable: no .c or .cu file over 1,000 lines
outside tests/ and tools/bench/, and no function over 120 lines outside
tests/. Standard library only.

  tools/check_sizes.py [--root DIR]     (default: this checkout)

A function is counted from the line that opens its definition (a line
starting in column 0 with a name and a parenthesis, not ending in ';') to
its closing brace in column 0, both included. The files read are the
tree's (tools/tree_files.py). Prints one line per fault (FILE:LINE: what),
then the largest file and the longest function, and exits 1 if there was a
fault, 0 otherwise.
"""
import argparse
import os
import re
import sys

from tree_files import tree_files

MAX_FILE, MAX_FUNCTION = 1000, 120
SOURCES = (".c", ".cu")
OPENS = re.compile(r"^[A-Za-z_].*\(")


def functions(lines):
    """(first line, length, head) of each function definition in lines."""
    out, start = [], None
    for i, line in enumerate(lines, 1):
        if start is None:
            if OPENS.match(line) and not line.rstrip().endswith(";") and \
                    not re.search(r"\{.*\}\s*$", line):
                start, head = i, line.strip()
        elif line.startswith("}"):
            out.append((start, i - start + 1, head))
            start = None
        elif OPENS.match(line) and line.rstrip().endswith(";"):
            start = None  # a declaration spread over lines, not a definition
    return out


def check(root):
    faults, biggest, longest = [], (0, ""), (0, "")
    for path in tree_files(root):
        if not path.endswith(SOURCES) or path.startswith("tests/"):
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        n = len(lines) - (1 if lines and lines[-1] == "" else 0)
        if not path.startswith("tools/bench/"):
            biggest = max(biggest, (n, path))
            if n > MAX_FILE:
                faults.append("%s:1: %d lines, more than %d" % (path, n, MAX_FILE))
        for start, length, head in functions(lines):
            longest = max(longest, (length, "%s:%d" % (path, start)))
            if length > MAX_FUNCTION:
                faults.append("%s:%d: a function of %d lines, more than %d: %s"
                              % (path, start, length, MAX_FUNCTION, head[:60]))
    return faults, biggest, longest


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description="Files of at most %d lines and functions of at "
                                 "most %d." % (MAX_FILE, MAX_FUNCTION))
    ap.add_argument("--root", default=here, help="the tree to check (default: %(default)s)")
    args = ap.parse_args()
    faults, biggest, longest = check(args.root)
    for f in faults:
        print(f)
    print("check_sizes: largest file %s (%d lines), longest function at %s (%d lines)%s"
          % (biggest[1], biggest[0], longest[1], longest[0],
             "" if faults else "; every file and function within bounds"))
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
