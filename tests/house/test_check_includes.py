#!/usr/bin/python3
"""tools/check_includes.py against copies of the tree's sources and
docs/DESIGN.md with one include planted or removed: the copy as it is
passes, and each planted include fails naming file, line and header."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SRC = os.environ.get("SHARDREC_SRC") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CHECK = os.path.join(SRC, "tools", "check_includes.py")
sys.path.insert(0, os.path.join(SRC, "tools"))
from tree_files import tree_files  # noqa: E402  (the files the check reads)


def copy_sources(dst):
    """The files the check reads: the tree's .c/.h/.cu files and DESIGN.md."""
    for rel in tree_files(SRC):
        if rel.endswith((".c", ".h", ".cu")) or rel == "docs/DESIGN.md":
            os.makedirs(os.path.join(dst, os.path.dirname(rel)), exist_ok=True)
            shutil.copyfile(os.path.join(SRC, rel), os.path.join(dst, rel))


class CheckIncludes(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="shardrec-check-includes-")
        copy_sources(self.root)

    def tearDown(self):
        shutil.rmtree(self.root)

    def run_check(self):
        p = subprocess.run(["/usr/bin/python3", CHECK, "--root", self.root],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    def read(self, rel):
        with open(os.path.join(self.root, rel)) as f:
            return f.read()

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def design_line(self, start):
        """The line number of DESIGN.md's first line that starts with start."""
        lines = self.read("docs/DESIGN.md").split("\n")
        return 1 + next(i for i, l in enumerate(lines) if l.startswith(start))

    def plant(self, rel, line):
        """Append line to rel (made if missing); its line number."""
        text = self.read(rel) if os.path.exists(os.path.join(self.root, rel)) else ""
        if text and not text.endswith("\n"):
            text += "\n"
        text += line + "\n"
        self.write(rel, text)
        return text.count("\n")

    def assert_fails(self, want):
        rc, out, err = self.run_check()
        self.assertEqual(rc, 1, out + err)
        self.assertIn(want, out.splitlines(), out)
        self.assertEqual(len(out.splitlines()), 1, out)

    def test_tree_passes(self):
        rc, out, err = self.run_check()
        self.assertEqual(rc, 0, out + err)
        self.assertIn("every include allowed", out)

    def test_arrow_against_the_table(self):
        n = self.plant("embedding/plan.c", '#include "train/job.h"')
        self.assert_fails('embedding/plan.c:%d: #include "train/job.h": '
                          "embedding/ may not include headers of train/" % n)

    def test_library_includes_tools(self):
        n = self.plant("dense/model.c", '#  include "tools/cli.h"')
        self.assert_fails('dense/model.c:%d: #include "tools/cli.h": '
                          "dense/ may not include headers of tools/" % n)

    def test_generated_and_outside_headers(self):
        # A quoted header of no folder and not in the tree is a library's;
        # the generated rpc/shardrec.pb-c.h (not in the tree) is rpc/'s.
        self.plant("dense/metrics.c", '#include "cuda_fp16.h"')
        n = self.plant("dense/metrics.c", '#include "rpc/shardrec.pb-c.h"')
        self.assert_fails('dense/metrics.c:%d: #include "rpc/shardrec.pb-c.h": '
                          "dense/ may not include headers of rpc/" % n)

    def test_private_header_of_rpc(self):
        n = self.plant("tools/cli.c", '#include "rpc/grpc_impl.h"')
        self.assert_fails('tools/cli.c:%d: #include "rpc/grpc_impl.h": a private header of rpc/' % n)

    def test_private_header_by_name(self):
        self.plant("dense/pool_impl.h", "/* dense/pool.c's own */")
        n = self.plant("train/trainer.c", '#include "dense/pool_impl.h"')
        self.assert_fails('train/trainer.c:%d: #include "dense/pool_impl.h": '
                          "a private header of dense/" % n)

    def test_private_header_relative(self):
        n = self.plant("tools/cmd_plan.c", '#include "../storage/rocks_impl.h"')
        self.assert_fails('tools/cmd_plan.c:%d: #include "../storage/rocks_impl.h": '
                          "a private header of storage/" % n)

    def test_private_header_angled(self):
        n = self.plant("tools/cmd_plan.c", "#include <storage/rocks_impl.h>")
        self.assert_fails("tools/cmd_plan.c:%d: #include <storage/rocks_impl.h>: "
                          "a private header of storage/" % n)

    def test_private_header_of_another_folders_tests(self):
        # tests/rpc/ may include rpc/'s private headers; tests/storage/ may not.
        self.plant("tests/rpc/test_rpc_coord.c", '#include "rpc/codec_impl.h"')
        n = self.plant("tests/storage/test_sst.c", '#include "rpc/codec_impl.h"')
        self.assert_fails('tests/storage/test_sst.c:%d: #include "rpc/codec_impl.h": '
                          "a private header of rpc/" % n)

    def test_header_the_folder_may_not_see(self):
        n = self.plant("rpc/server.c", '#include "embedding/shard.h"')
        self.assert_fails('rpc/server.c:%d: #include "embedding/shard.h": '
                          "rpc/ may not include embedding/shard.h" % n)

    def test_folder_not_in_the_table(self):
        self.plant("engine/step.c", '#include "common/status.h"')
        self.assert_fails("engine/step.c: its folder is not in docs/DESIGN.md's table")

    def test_unreadable_table(self):
        self.write("docs/DESIGN.md", self.read("docs/DESIGN.md").replace(
            "### Which folder may include which", "### Includes"))
        rc, out, err = self.run_check()
        self.assertEqual(rc, 2, out + err)
        self.assertIn("no section '### Which folder may include which'", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
