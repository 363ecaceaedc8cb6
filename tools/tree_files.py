"""The files of a shardrec tree that the checks of tools/test read
(tools/check_includes.py, tools/check_words.py): in a git checkout, the
files git carries (tracked, and untracked ones .gitignore does not ignore),
so build trees, demo data and caches are left out as git leaves them;
elsewhere (a copy of some of the tree), every file under root but .git,
__pycache__ and build trees (a folder holding CMakeCache.txt)."""
import os
import subprocess


def _git_files(root):
    """The files git carries under root when root is the top of a git work
    tree; None when it is not (or git is not installed)."""
    try:
        top = subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True)
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(root):
            return None
        ls = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    names = {n for n in ls.stdout.decode("utf-8", "surrogateescape").split("\0") if n}
    return [n for n in names if os.path.isfile(os.path.join(root, n))]


def tree_files(root):
    """Relative paths ('/'-separated) of the files of the tree at root, sorted."""
    out = _git_files(root)
    if out is None:
        out = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in (".git", "__pycache__")
                       and not os.path.exists(os.path.join(d, x, "CMakeCache.txt"))]
            out += [os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/")
                    for n in names if n != ".git"]
    return sorted(out)
