"""Did-you-mean hints (harness/tools/suggest.py): which paths and lines the file tools' errors name."""

from __future__ import annotations

import random

from vivace.harness.tools import suggest
from vivace.harness.tools.suggest import closest_lines, path_hint, similar_paths, workspace_files
from vivace.sandbox.base import DirEntry, WorkspaceFileNotFound

FILES = ["museum/__init__.py", "museum/core.py", "museum/report.py", "tests/test_core.py", "pyproject.toml"]


def test_same_file_name_first_then_close_paths():
    assert similar_paths("museing/core.py", FILES) == ["museum/core.py"]
    assert similar_paths("bru/core.py", FILES) == ["museum/core.py"]  # the only core.py, however far the dir
    assert similar_paths("museum/reprot.py", FILES)[0] == "museum/report.py"
    assert similar_paths("museum/core.py", FILES) == []  # it exists: nothing to suggest
    assert similar_paths("./museum//core.py", FILES) == []
    assert similar_paths("kitchen/oven.rs", FILES) == []
    two = ["a/util.py", "b/util.py", "c/util.py", "d/util.py"]
    assert similar_paths("b/utl.py", two)[0] == "b/util.py"  # by overall likeness once no name matches
    assert similar_paths("e/util.py", two) == two[:3]  # at most three
    assert path_hint("e/util.py", two) == ' Did you mean one of "a/util.py", "b/util.py", "c/util.py"?'
    assert path_hint("x/nothing.c", two) == ""


def test_closest_lines():
    text = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
    assert closest_lines(text, "retrun a - b") == (6, ["    return a - b"])
    assert closest_lines(text, "\n  def sbu(a, b):\n    x") == (5, ["def sub(a, b):", "    return a - b"])
    assert closest_lines(text, "zzzzqqqq") is None
    assert closest_lines(text, "   \n") is None
    assert closest_lines("", "x") is None


def test_closest_lines_finds_a_target_anywhere_in_a_big_file():
    text = "".join(f"line {i} " + "x" * 40 + "\n" for i in range(100_000))  # 5 MB, 100,000 lines
    assert len(text.split("\n")) > 5 * suggest.MAX_LINES_SCANNED
    found = closest_lines(text, "line 50000 yyyy\nline 50001 xxxx")
    assert found is not None and found[0] == 50_001, found  # not line 5,001 in the part once scanned
    assert closest_lines(text, "line 99999 " + "x" * 39 + "\n")[0] == 100_000
    assert closest_lines(text, "lnie 7777 xxxx")[0] == 7_778
    assert closest_lines(text, "qqq zzz") is None


def test_closest_lines_on_a_long_file_agrees_with_the_full_scan():
    """The candidate path (long files) against comparing every line, for one-letter slips."""
    rng = random.Random(0)
    words = ["total", "price", "items", "self", "cart", "return", "value", "compute", "tax", "rate", "user", "order"]
    lines = []
    for i in range(suggest.MAX_LINES_SCANNED + 1_000):
        a, b, c = rng.sample(words, 3)
        lines.append(f"    {a}_{i % 611} = {b}.{c}({rng.choice(words)}, {i % 37})")
    text = "\n".join(lines) + "\n"
    for _ in range(8):
        i = rng.randrange(len(lines))
        s = lines[i].strip()
        j = rng.randrange(len(s) - 1)
        slip = s[:j] + s[j + 1] + s[j] + s[j + 2 :]  # two letters swapped
        at, _score = suggest._best_line(slip, text.split("\n"), range(len(lines)))
        assert closest_lines(text, slip)[0] == at + 1, slip


class _FakeWorkspace:
    """A directory tree as the workspace file API lists it."""

    def __init__(self, tree: dict[str, list[DirEntry]]):
        self.tree, self.listed = tree, 0

    async def list(self, path: str = ".") -> list[DirEntry]:
        self.listed += 1
        if path not in self.tree:
            raise WorkspaceFileNotFound(path)
        return self.tree[path]


async def test_workspace_files_skips_hidden_and_build_dirs_and_is_bounded():
    d, f = (lambda n: DirEntry(n, "dir", 0)), (lambda n: DirEntry(n, "file", 1))
    tree = {
        ".": [d(".git"), d("node_modules"), d("pkg"), f("setup.py"), DirEntry("link", "symlink", 3)],
        "pkg": [f("core.py"), d("sub"), f(".hidden.py")],
        "pkg/sub": [f("deep.py")],
        ".git": [f("HEAD")],
        "node_modules": [f("x.js")],
    }
    ws = _FakeWorkspace(tree)
    assert await workspace_files(ws) == ["setup.py", "pkg/core.py", "pkg/sub/deep.py"]
    assert ws.listed == 3  # .git and node_modules never opened
    assert await workspace_files(_FakeWorkspace(tree), limit=5) == ["setup.py"]  # stops after 5 entries
    wide = {".": [f(f"m{i}.py") for i in range(50)]}
    assert len(await workspace_files(_FakeWorkspace(wide), limit=10)) == 50  # one listing is kept whole
