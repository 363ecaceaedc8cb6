#!/usr/bin/python3
"""tools/check_words.py against a small copy of the tree (README.md, docs/,
tools/cli.c, tests/cluster/) with words planted: the copy as it is passes;
each word of a work tracker or of how the work was organised fails naming
file and line; the product's own uses of the same words pass.

The planted words are put together from pieces, so that this file speaks
of the product only and passes the check itself."""
import os
import shutil
import subprocess
import tempfile
import unittest

SRC = os.environ.get("SHARDREC_SRC") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CHECK = os.path.join(SRC, "tools", "check_words.py")
COPIED = ("README.md", "docs", "tools/cli.c", "tests/cluster")

ISSUE, TICKET, SESS = "iss" + "ue", "tick" + "et", "sess" + "ion"


class CheckWords(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="shardrec-check-words-")
        for rel in COPIED:
            src, dst = os.path.join(SRC, rel), os.path.join(self.root, rel)
            if os.path.isdir(src):
                shutil.copytree(src, dst)
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(src, dst)

    def tearDown(self):
        shutil.rmtree(self.root)

    def run_check(self):
        p = subprocess.run(["/usr/bin/python3", CHECK, "--root", self.root],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    def plant(self, rel, text):
        """Append text (one or more lines) to rel; the number of its first line."""
        path = os.path.join(self.root, rel)
        with open(path) as f:
            old = f.read()
        if not old.endswith("\n"):
            old += "\n"
        with open(path, "w") as f:
            f.write(old + text + "\n")
        return old.count("\n") + 1

    def assert_fails(self, rel, text, words):
        n = self.plant(rel, text)
        rc, out, err = self.run_check()
        self.assertEqual(rc, 1, out + err)
        lines = out.splitlines()
        self.assertEqual(len(lines), 1, out)
        self.assertTrue(lines[0].startswith("%s:%d: '%s': " % (rel, n, words)), out)

    def assert_passes(self, rel, text):
        self.plant(rel, text)
        rc, out, err = self.run_check()
        self.assertEqual(rc, 0, out + err)

    def test_copy_passes(self):
        rc, out, err = self.run_check()
        self.assertEqual(rc, 0, out + err)
        self.assertIn("none speaks of the work", out)

    def test_item_by_number_in_code(self):
        self.assert_fails("tools/cli.c", "/* one range per flag (%s 15) */" % ISSUE.capitalize(),
                          ISSUE.capitalize() + " 15")

    def test_item_by_number_in_a_script(self):
        self.assert_fails("tests/cluster/bed.sh", "# the bed (%ss 19/20)" % ISSUE, ISSUE + "s 19/20")

    def test_item_by_number_over_two_lines(self):
        self.assert_fails("tools/cli.c", "/* pinned rows, %s\n * 18), from outside */" % TICKET,
                          TICKET + " 18")

    def test_other_items(self):
        self.assert_fails("tools/cli.c", "/* the range check (b" + "ug #4) */", "b" + "ug #4")

    def test_change_request(self):
        self.assert_fails("docs/DESIGN.md", "As merged in the pull req" + "uest.", "pull req" + "uest")

    def test_the_item(self):
        self.assert_fails("README.md", "The defaults are as in %s's data." % ISSUE, ISSUE + "'s")

    def test_the_item_named(self):
        self.assert_fails("README.md", "Generated as the %s did." % ISSUE, "the " + ISSUE)

    def test_owed_results(self):
        self.assert_fails("docs/DESIGN.md", "The must" + "-show, with shard servers.", "must" + "-show")

    def test_who_checks(self):
        self.assert_fails("docs/SCALE.md", "As the test" + "er asked, a quiet machine.",
                          "test" + "er")

    def test_examination(self):
        self.assert_fails("tools/cli.c", "/* rev" + "iew mends: ranges checked */", "rev" + "iew")

    def test_numbered_stop(self):
        self.assert_fails("docs/DESIGN.md", "was ridden through (CI, st" + "op 26)", "st" + "op 26")

    def test_work_sitting(self):
        self.assert_fails("README.md", "Prepared for a %s that is lent a GPU." % SESS, SESS)

    def test_product_uses_pass(self):
        self.assert_passes("docs/DESIGN.md", "\n".join([
            "A TLS %s is resumed with its %s %s; a gRPC %s ends." % (SESS, SESS, TICKET, SESS),
            "Open MPI's %s folders go under TMPDIR." % SESS,
            "The next step's lookup is %sd early." % ISSUE,
            "kill -STOP 4242 stops a server; ranks stop, then go on.",
        ]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
