#!/usr/bin/python3
"""The product speaks of itself: fails when a file of the tree (code,
comments, help texts, tests, scripts, README.md, docs/) speaks of a work
tracker's items or of how the work on it was organised instead of the
product. Standard library only.

  tools/check_words.py [--root DIR]     (default: this checkout)

Every text file of the tree is read (tools/tree_files.py: in a git
checkout the files git carries), but files holding a NUL byte (binary:
fuzz seeds). Prints FILE:LINE: 'WORDS': what they speak of, for each
match of the patterns below, and exits 1 if there was any, 0 otherwise.

Each pattern is written with a character class or a group inside its word,
so that this file's own text does not match it and the check passes over
itself like any other file. Product words that share a spelling are let
through by the pattern or its allow rule: a TLS, SSL, gRPC or MPI
sess(ion) and its tickets, caches, keys, ids, folders; a lookup that
is issu(ed).
"""
import argparse
import os
import re
import sys

from tree_files import tree_files

I = re.IGNORECASE

# A product's sess(ion): a TLS, SSL, gRPC, HTTP or MPI one, or one's
# tickets, caches, keys, ids, folders, timeouts.
SESSION_BEFORE = re.compile(r"(?:TLS|SSL|gRPC|HTTPS?|MPI(?:['’]s)?)\s+$", I)
SESSION_AFTER = re.compile(r"\s+(?:tickets?|caches?|keys?|ids?|resumption|folders?|"
                           r"director(?:y|ies)|timeouts?|reuse)\b", I)


def product_session(line, m):
    """True when the match m in line is a product's sess(ion)."""
    return bool(SESSION_BEFORE.search(line[:m.start()]) or SESSION_AFTER.match(line[m.end():]))


# (pattern, what it speaks of, allow: None, or a function of (line, match)
# that is True for a product use)
PATTERNS = [
    (re.compile(r"\b(?:iss[u]e|tick[e]t|b[u]g)s?\s*#?\s*\d+(?:\s*/\s*\d+)*", I),
     "a tracker item by number", None),
    (re.compile(r"\biss[u]e['’]s\b|\b(?:the|this|that|these|those|our|an) iss[u]es?\b(?!\w)", I),
     "a tracker item", None),
    (re.compile(r"\bmust[- ]?shows?\b", I), "a list of results owed", None),
    (re.compile(r"\btest(?:er|ers)\b", I), "who checks the work", None),
    (re.compile(r"\brevi[e]w(?:s|ed|er|ers|ing)?\b", I), "an examination of the work", None),
    (re.compile(r"\b[Ss]t[o]p\s*#?\s*\d+\b"), "a numbered stop of the work", None),
    (re.compile(r"\bsess(?:ion|ions)\b", I), "a sitting of the work", product_session),
    (re.compile(r"\b(?:pull|merge)[- ]requ[e]sts?\b", I), "a tracker item", None),
]


COMMENT_LEAD = re.compile(r"^\s*(?:\*|//|#|--)?\s*")
# The words every pattern holds: a line without one is passed at once.
STEMS = re.compile(r"iss[u]e|tick[e]t|b[u]g|m[u]st|test[e]r|revi[e]w|st[o]p|sess[i]on|requ[e]st", I)


def check_text(path, text):
    """Lines to print for one file's text. Words broken over two lines
    (a comment's or a paragraph's) are matched too, reported on the first."""
    faults = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        nxt = COMMENT_LEAD.sub("", lines[i + 1]) if i + 1 < len(lines) else ""
        joined = line + " " + nxt
        if not STEMS.search(joined):
            continue
        for pat, what, allow in PATTERNS:
            for m in pat.finditer(joined):
                if m.start() >= len(line):
                    break  # the next line's own, found there
                if allow is None or not allow(joined, m):
                    faults.append("%s:%d: '%s': %s" % (path, i + 1, m.group(0), what))
    return faults


def check(root):
    faults, n = [], 0
    for path in tree_files(root):
        try:
            with open(os.path.join(root, path), "rb") as f:
                data = f.read()
        except OSError as e:
            faults.append("%s: %s" % (path, e.strerror))
            continue
        if b"\0" in data:
            continue
        n += 1
        faults += check_text(path, data.decode("utf-8", errors="replace"))
    return faults, n


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description="Fail when the tree speaks of a work tracker or "
                                 "of how the work was organised instead of the product.")
    ap.add_argument("--root", default=here, help="the tree to check (default: %(default)s)")
    args = ap.parse_args()
    faults, n = check(args.root)
    for f in faults:
        print(f)
    if faults:
        print("check_words: %d line(s) to reword in %d files: say what the product does"
              % (len(faults), n), file=sys.stderr)
        return 1
    print("check_words: %d files, none speaks of the work instead of the product" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
