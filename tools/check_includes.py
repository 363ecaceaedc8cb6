#!/usr/bin/python3
"""Which folder may include which: every #include of the .c, .h and .cu
files under ROOT checked against the tables of docs/DESIGN.md's section
"Which folder may include which". Standard library only.

  tools/check_includes.py [--root DIR]     (default: this checkout)

The section's tables, read by the names in backticks of their cells:
  folder | may include | but not      a folder's own headers, the public
                                       headers of the folders it names (`*`:
                                       every folder), less the headers of its
                                       third cell
  test folder | ...                    the folders whose private headers the
                                       tests of a tests/ folder may include

A header named *_impl.h is private to its folder.

An include is resolved as the compiler does: beside the including file
first, else from ROOT (quoted names of a folder in the table that are not
in the tree, such as the generated rpc/shardrec.pb-c.h, count as that
folder's). Names of no folder in the table and not in the tree are system
and library headers, not checked. The files read are the tree's
(tools/tree_files.py: in a git checkout the files git carries).

Prints one line per include the tables do not allow (FILE:LINE: #include
"NAME": why) and exits 1 if there was any; 0 when every include is
allowed. Exit 2: the tables cannot be read.
"""
import argparse
import os
import re
import sys

from tree_files import tree_files

DESIGN = "docs/DESIGN.md"
SECTION = "### Which folder may include which"
SOURCES = (".c", ".h", ".cu")
PRIVATE_SUFFIX = "_impl.h"
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')
TICKS = re.compile(r"`([^`]+)`")


class TableError(Exception):
    pass


def section_tables(path):
    """The markdown tables of SECTION, up to the next heading of its level
    or above: a list of (header cells, [(line number, cells)])."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        raise TableError("%s: %s" % (path, e.strerror))
    try:
        start = lines.index(SECTION)
    except ValueError:
        raise TableError("%s: no section '%s'" % (DESIGN, SECTION))
    tables, cur = [], None
    for i in range(start + 1, len(lines)):
        line = lines[i].strip()
        if re.match(r"#{1,3} ", line):
            break
        if not line.startswith("|"):
            cur = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cur is None:
            cur = (cells, [])
            tables.append(cur)
        elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
            cur[1].append((i + 1, cells))
    return tables


def find_table(tables, first, ncells):
    for head, rows in tables:
        if head and head[0].lower() == first:
            for lineno, cells in rows:
                if len(cells) < ncells:
                    raise TableError("%s:%d: a row of the '%s' table needs %d cells"
                                     % (DESIGN, lineno, first, ncells))
            return rows
    raise TableError("%s: section '%s' has no table whose first column is '%s'"
                     % (DESIGN, SECTION, first))


def folder_name(name, lineno):
    if not name.endswith("/"):
        raise TableError("%s:%d: '%s' is not a folder (a folder ends with /)"
                         % (DESIGN, lineno, name))
    return name


class Rules:
    """The two tables of the section."""

    def __init__(self, root):
        tables = section_tables(os.path.join(root, DESIGN))
        self.allow, self.deny = {}, {}
        for lineno, cells in find_table(tables, "folder", 3):
            for f in TICKS.findall(cells[0]):
                f = folder_name(f, lineno)
                self.allow[f] = {t if t == "*" else folder_name(t, lineno)
                                 for t in TICKS.findall(cells[1])}
                self.deny[f] = set(TICKS.findall(cells[2]))
        if not self.allow:
            raise TableError("%s: the folder table lists no folder" % DESIGN)
        self.folders = sorted(self.allow, key=len, reverse=True)  # longest first
        for f, targets in self.allow.items():
            for t in targets - {"*"}:
                if t not in self.allow:
                    raise TableError("%s: %s may include %s, a folder the table does not list"
                                     % (DESIGN, f, t))
        self.tests = {}  # tests/X/ -> folders whose private headers it may include
        for lineno, cells in find_table(tables, "test folder", 2):
            targets = {folder_name(t, lineno) for t in TICKS.findall(cells[1])}
            for f in TICKS.findall(cells[0]):
                self.tests.setdefault(folder_name(f, lineno), set()).update(targets)

    def folder_of(self, path):
        for f in self.folders:
            if path.startswith(f):
                return f
        return None

    def is_private(self, header):
        return os.path.basename(header).endswith(PRIVATE_SUFFIX)

    def test_folder(self, path):
        parts = path.split("/")
        return parts[0] + "/" + parts[1] + "/" if len(parts) > 2 else None

    def why_not(self, path, folder, header, hfolder):
        """None when path (in folder) may include header (in hfolder), else why not."""
        if hfolder == folder:
            return None
        if self.is_private(header):
            if hfolder in self.tests.get(self.test_folder(path), ()):
                return None
            return "a private header of %s" % hfolder
        allowed = self.allow[folder]
        if "*" not in allowed and hfolder not in allowed:
            return "%s may not include headers of %s" % (folder, hfolder)
        if header in self.deny[folder]:
            return "%s may not include %s" % (folder, header)
        return None


def sources(root):
    """Relative paths of the source files of the tree at root, sorted."""
    return [p for p in tree_files(root) if p.endswith(SOURCES)]


def resolve(root, rules, path, kind, name):
    """The root-relative header an include names, or None when it is not
    shardrec's (a system or library header)."""
    if kind == '"':
        beside = os.path.normpath(os.path.join(os.path.dirname(path), name))
        if os.path.isfile(os.path.join(root, beside)):
            return beside.replace(os.sep, "/")
    header = os.path.normpath(name).replace(os.sep, "/")
    if header.startswith("../") or os.path.isabs(header):
        return None
    if os.path.isfile(os.path.join(root, header)):
        return header
    return header if kind == '"' and rules.folder_of(header) else None


def check(root):
    """Lines to print, one per fault found."""
    rules = Rules(root)
    faults = []
    paths = sources(root)
    for path in paths:
        folder = rules.folder_of(path)
        if folder is None:
            faults.append("%s: its folder is not in %s's table" % (path, DESIGN))
            continue
        try:
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                text = f.read().split("\n")
        except OSError as e:
            faults.append("%s: %s" % (path, e.strerror))
            continue
        for lineno, line in enumerate(text, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            header = resolve(root, rules, path, m.group(1), m.group(2))
            if header is None:
                continue
            hfolder = rules.folder_of(header)
            if hfolder is None:
                why = "a header of a folder that is not in %s's table" % DESIGN
            else:
                why = rules.why_not(path, folder, header, hfolder)
            if why is None:
                continue
            faults.append('%s:%d: #include %s%s%s: %s' % (
                path, lineno, m.group(1), m.group(2), '"' if m.group(1) == '"' else ">", why))
    return faults, len(paths)


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description="Check every #include against docs/DESIGN.md's "
                                 "table of which folder may include which.")
    ap.add_argument("--root", default=here, help="the tree to check (default: %(default)s)")
    args = ap.parse_args()
    try:
        faults, n = check(args.root)
    except TableError as e:
        print("check_includes: %s" % e, file=sys.stderr)
        return 2
    for f in faults:
        print(f)
    if faults:
        print("check_includes: %d fault(s) in %d files (the rules: %s, '%s')"
              % (len(faults), n, DESIGN, SECTION[4:]), file=sys.stderr)
        return 1
    print("check_includes: %d files, every include allowed" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
