#!/usr/bin/python3
"""tools/check_sizes.py against small trees it writes: files and functions
within the bounds pass; a function one line too long, a file one line too
long, each fails naming file and line; tests/ are not held to either bound,
benchmarks only to the function's."""
import os
import shutil
import subprocess
import tempfile
import unittest

SRC = os.environ.get("SHARDREC_SRC") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CHECK = os.path.join(SRC, "tools", "check_sizes.py")


def function(name, lines):
    """A definition of name of exactly lines lines, its braces included."""
    body = ["  x += %d;" % i for i in range(lines - 3)]
    return "\n".join(["static int %s(int x) {" % name] + body + ["  return x;", "}", ""])


class CheckSizes(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="shardrec-check-sizes-")

    def tearDown(self):
        shutil.rmtree(self.root)

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def run_check(self):
        p = subprocess.run(["/usr/bin/python3", CHECK, "--root", self.root],
                           capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout

    def test_within_bounds(self):
        self.write("rpc/a.c", "#include <stdio.h>\n\n" + function("f", 120) +
                   "int g(int);\nstatic int h(void) { return 1; }\n")
        rc, out = self.run_check()
        self.assertEqual(rc, 0, out)
        self.assertIn("longest function at rpc/a.c:3 (120 lines)", out)

    def test_function_too_long(self):
        self.write("train/b.c", "/* b */\n" + function("f", 60) + function("long_one", 121))
        rc, out = self.run_check()
        self.assertEqual(rc, 1, out)
        self.assertIn("train/b.c:62: a function of 121 lines, more than 120: "
                      "static int long_one(int x) {", out)

    def test_file_too_long(self):
        self.write("embedding/c.c", "".join(function("f%d" % i, 100) for i in range(10)) + "\n")
        rc, out = self.run_check()
        self.assertEqual(rc, 1, out)
        self.assertIn("embedding/c.c:1: 1001 lines, more than 1000", out)

    def test_tests_and_benchmarks(self):
        big = "".join(function("f%d" % i, 100) for i in range(11))
        self.write("tests/rpc/test_big.c", big + function("long_one", 300))
        self.write("tools/bench/bench_big.c", big)
        rc, out = self.run_check()
        self.assertEqual(rc, 0, out)
        self.write("tools/bench/bench_long.c", function("long_one", 121))
        rc, out = self.run_check()
        self.assertEqual(rc, 1, out)
        self.assertIn("tools/bench/bench_long.c:1: a function of 121 lines", out)


if __name__ == "__main__":
    unittest.main()
