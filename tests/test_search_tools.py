"""Search tools and the terminal display, against an audit's findings.

glob_file_search names a missing directory or a file instead of "no files match", follows a
symlinked directory inside the workspace and searches an ignored directory named explicitly (as
grep does); the walker honours .gitignore where git cannot run (checked against `rg --files`);
`$` matches before CRLF in rg and the walker alike; a grep that times out says so and keeps what
it found; codebase_search names a missing target directory; the episode printer never passes a
control character from the repository, a tool or the model to the terminal.
"""

from __future__ import annotations

import asyncio
import io
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from conftest import make_backend
from vivace.harness.display import EpisodePrinter, colour_diff, visible
from vivace.harness.executor import ToolOutcome
from vivace.harness.messages import AssistantTurn, Message, ToolCall
from vivace.harness.tools import search
from vivace.harness.tools.base import ToolContext, ToolResult, parse_args
from vivace.harness.tools.search import CodebaseSearch, GlobFileSearch, Grep
from vivace.sandbox.base import ExecResult


async def _run(ctx: ToolContext, tool, **args) -> ToolResult:
    parsed = parse_args(tool, args)
    assert not isinstance(parsed, ToolResult), parsed.text
    return await tool.run(parsed, ctx)


@pytest.fixture(params=["plain", "isolated"])
async def ctx(request, repo, state_dir):
    backend = make_backend(request.param, state_dir)
    ws = await backend.create(backend.snapshot(str(repo)))
    yield ToolContext(workspace=ws)
    await backend.aclose()


@pytest.fixture
async def pctx(repo, state_dir):
    backend = make_backend("plain", state_dir)
    ws = await backend.create(backend.snapshot(str(repo)))
    yield ToolContext(workspace=ws)
    await backend.aclose()


def _load_walker():
    import importlib.util

    spec = importlib.util.spec_from_file_location("walker_audit", Path(search.__file__).parent / "walker.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- glob_file_search: missing directories, files, symlinks, ignored directories ---------------------


async def test_glob_names_a_missing_directory_or_a_file(pctx):
    glob = GlobFileSearch()
    missing = await _run(pctx, glob, glob_pattern="*.py", path="src")
    assert missing.is_error and missing.text.startswith("Error: directory src does not exist"), missing.text
    a_file = await _run(pctx, glob, glob_pattern="*.md", path="pkg/calc.py")
    assert a_file.is_error and "pkg/calc.py is a file, not a directory" in a_file.text, a_file.text
    assert (await _run(pctx, glob, glob_pattern="*.py", path="pkg/calc.py")).text == "pkg/calc.py"
    assert (await _run(pctx, glob, glob_pattern="*.rs", path="pkg")).text == "No files match '*.rs' in pkg."


async def test_glob_agrees_with_grep_on_symlinked_and_ignored_directories(ctx, tmp_path):
    ws = ctx.workspace
    for rel, text in {
        "a/b/deep.py": "DEEP = 1\n",
        "node_modules/pkg/m.js": "DEEP = 2\n",
        "node_modules/pkg/m.secret": "DEEP = 3\n",
        ".gitignore": "node_modules/\n*.secret\n",
    }.items():
        await ws.write_text(rel, text)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.py").write_text("DEEP = 4\n")
    assert (await ws.exec(f"git init -q . && ln -s a/b link_dir && ln -s {outside} out_dir")).exit_code == 0
    glob = GlobFileSearch()
    assert (await _run(ctx, glob, glob_pattern="*.py", path="link_dir")).text == "link_dir/deep.py"
    assert (await _run(ctx, glob, glob_pattern="*.py", path="link_dir/")).text == "link_dir/deep.py"
    # Named explicitly, an ignored directory is searched; rules still apply below it (*.secret).
    assert (await _run(ctx, glob, glob_pattern="m.*", path="node_modules")).text == "node_modules/pkg/m.js"
    assert (await _run(ctx, glob, glob_pattern="*.js")).text == "No files match '*.js' in .."
    out = await _run(ctx, glob, glob_pattern="*.py", path="out_dir")
    seen = (await ws.exec(["test", "-d", str(outside)])).exit_code == 0  # the isolated sandbox cannot see it
    assert out.is_error and ("is outside the workspace" if seen else "does not exist") in out.text, out.text
    for use_rg in (True, False):
        if use_rg and (await ws.exec("command -v rg")).exit_code != 0:
            continue
        grep = Grep(use_rg=use_rg)
        assert (await _run(ctx, grep, pattern="DEEP", path="link_dir")).text == "link_dir/deep.py:1:DEEP = 1"
        got = await _run(ctx, grep, pattern="DEEP", path="node_modules")
        assert got.text == "node_modules/pkg/m.js:1:DEEP = 2", (use_rg, got.text)
        # A symlink named explicitly that leads outside is refused, by rg (which would follow it) too.
        got = await _run(ctx, grep, pattern="DEEP", path="out_dir")
        assert got.is_error and "DEEP = 4" not in got.text, (use_rg, got.text)


GITIGNORE_TREE = {
    ".gitignore": "node_modules/\n*.log\n!keep.log\n/build\ndocs/**/*.tmp\n\\#hash.txt\n# comment\nspace.txt\\ \n",
    "kept.py": "",
    "keep.log": "",
    "drop.log": "",
    "#hash.txt": "",
    "node_modules/pkg/m.js": "",
    "build/out.o": "",
    "src/build/kept.txt": "",  # /build is anchored to the root
    "docs/a/b/x.tmp": "",
    "docs/x.tmp": "",  # **/ also matches no directory at all
    "docs/x.md": "",
    "sub/.gitignore": "local.txt\n!*.log\n",
    "sub/local.txt": "",
    "sub/again.log": "",  # re-included by the deeper file
    "sub/deeper/local.txt": "",
    ".hidden/h.py": "",
}


def _make_tree(root: Path, tree: dict[str, str]) -> None:
    for rel, text in tree.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_walker_reads_gitignore_where_git_cannot_run(tmp_path, monkeypatch):
    walker = _load_walker()
    _make_tree(tmp_path, GITIGNORE_TREE)
    # A worktree checkout: .git is a file naming a directory outside the snapshot, so git fails.
    (tmp_path / ".git").write_text("gitdir: /nonexistent/.git/worktrees/wt\n")
    monkeypatch.chdir(tmp_path)
    assert walker.git_ls_files(".") is None
    want = ["docs/x.md", "keep.log", "kept.py", "src/build/kept.txt", "sub/again.log"]
    assert walker.files(".") == want
    if shutil.which("rg"):  # the reference: what ripgrep lists for the same tree
        rg = subprocess.run(["rg", "--files", "--no-config", "--sort", "path"], capture_output=True, text=True)
        assert sorted(rg.stdout.split(), key=lambda p: p.split("/")) == want
    assert walker.files("node_modules") == ["node_modules/pkg/m.js"]  # named explicitly: searched, as rg does
    (tmp_path / ".git").unlink()  # no repository at all: rg reads no .gitignore, nor does the walker
    assert "drop.log" in walker.files(".") and "node_modules/pkg/m.js" in walker.files(".")


def test_walker_gitignore_parser_agrees_with_git(tmp_path, monkeypatch):
    """The fallback's own .gitignore reading against git's, on the same tree."""
    walker = _load_walker()
    _make_tree(tmp_path, GITIGNORE_TREE)
    monkeypatch.chdir(tmp_path)
    assert subprocess.run(["git", "init", "-q", "."]).returncode == 0
    with_git = walker.files(".")
    monkeypatch.setattr(walker, "git_ls_files", lambda root, own_repo=False: None)
    assert walker.files(".") == with_git


# -- grep: CRLF and timeouts --------------------------------------------------------------------------


async def test_grep_dollar_matches_before_crlf(ctx):
    ws = ctx.workspace
    await ws.write_bytes("crlf.py", b"def f():\r\n    return 1\r\n\r\ndef g():\r\n    return 2\r\n")
    for use_rg in (True, False):
        if use_rg and (await ws.exec("command -v rg")).exit_code != 0:
            continue
        got = await _run(ctx, Grep(use_rg=use_rg), pattern="return 2$")
        assert got.text == "crlf.py:5:    return 2", (use_rg, got.text)
        got = await _run(ctx, Grep(use_rg=use_rg), pattern="^$", path="crlf.py", output_mode="count")
        assert got.text == "crlf.py:1", (use_rg, got.text)


async def test_grep_timeout_keeps_partial_results_and_says_so(pctx, monkeypatch):
    grep = Grep()

    async def killed(*args):  # what a search killed by the timeout hands back: exit 137, output so far
        return ExecResult("a.py:1:import x\nb.py:2:half a li", "", 137, 60.0, timed_out=True)

    monkeypatch.setattr(grep, "_search", killed)
    got = await _run(pctx, grep, pattern="import")
    assert not got.is_error and got.text.startswith("a.py:1:import x\n[grep timed out after 60 s"), got.text
    assert "half a li" not in got.text and "incomplete" in got.text and "narrow the path" in got.text

    async def killed_early(*args):
        return ExecResult("", "", 137, 60.0, timed_out=True)

    monkeypatch.setattr(grep, "_search", killed_early)
    got = await _run(pctx, grep, pattern="import")
    assert got.is_error and got.text.startswith("Error: grep timed out after 60 s"), got.text
    assert "exit code" not in got.text


async def test_walker_grep_timeout_hands_back_the_files_done(pctx, monkeypatch):
    ws = pctx.workspace
    await ws.write_text("a1.py", "import x\n")
    await ws.write_text("zz.txt", "x" * 40 + "\n")  # (x|x)+y backtracks for ages on it
    monkeypatch.setattr(search, "SEARCH_TIMEOUT_S", 1.0)
    # Overlapping alternatives: exponential, and not a nested repeat, which the walker refuses up front.
    got = await _run(pctx, Grep(use_rg=False), pattern="(x|x)+y|import x", path=".")
    assert not got.is_error, got.text
    assert got.text.startswith("a1.py:1:import x\n") and "timed out after 1 s" in got.text, got.text


async def test_grep_caps_the_pattern_and_the_walker_refuses_nested_repeats(pctx, monkeypatch):
    """rg took 7 s on a 30,000-character literal; Python's re in the walker ran `(a+)+$` on a 41-character
    line to the timeout. Both now answer at once with an error that says what to change."""
    await pctx.workspace.write_text("aaa.txt", "a" * 40 + "b\n")
    monkeypatch.setattr(search, "SEARCH_TIMEOUT_S", 3.0)
    for grep in (Grep(), Grep(use_rg=False)):
        bad = parse_args(grep, {"pattern": "a" * (search.MAX_PATTERN_CHARS + 1)})
        assert isinstance(bad, ToolResult) and bad.is_error, bad
        assert f"over the limit of {search.MAX_PATTERN_CHARS}; search for a shorter" in bad.text, bad.text
    got = await _run(pctx, Grep(use_rg=False), pattern="(a+)+$")
    assert got.is_error and "no ripgrep" in got.text and "without nested quantifiers" in got.text, got.text
    assert (await _run(pctx, Grep(use_rg=False), pattern="(ab{2})+|a+b$")).text == "aaa.txt:1:" + "a" * 40 + "b"
    assert [search.nested_repeat(p) for p in ("(x+x+)+y", r"(?:foo(\w*))*", "(a+){2}", "a+b*", "[(a+)+]")] == [
        True, True, False, False, False,
    ]  # fmt: skip


async def test_glob_with_many_wildcards_answers_at_once(pctx, monkeypatch):
    """Each `*` was a `[^/]*` for re to backtrack through: 28 stars took 2 minutes on one 25-character name.
    Runs of stars now merge, and a pattern with more choice points runs on an NFA (linear in the path)."""
    await pctx.workspace.write_text("a" * 40 + ".txt", "x\n")
    monkeypatch.setattr(search, "SEARCH_TIMEOUT_S", 5.0)
    for pattern in ("*" * 40 + "b", "*a" * 14 + "b", "**/a" * 14 + "b", "{,}" * 40 + "b", "*?" * 20 + "b"):
        got = await _run(pctx, GlobFileSearch(), glob_pattern=pattern)
        assert got.text == f"No files match {pattern!r} in ..", got.text
    got = await _run(pctx, GlobFileSearch(), glob_pattern="*a" * 14 + "*.txt")
    assert got.text == "a" * 40 + ".txt", got.text


def test_glob_nfa_agrees_with_the_regex_translation():
    """The NFA (many wildcards) against the plain regex of the same tokens, on small patterns where re is fast."""
    import random
    import re

    walker, rng = _load_walker(), random.Random(7)
    atoms = ["*", "**", "**/", "?", "a", "b", "/", ".", "[ab]", "[!a]", "{a,b*}", "{,}", "{*/,x}", "ab"]
    for _ in range(400):
        pat = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 6)))
        for gitignore in (False, True):
            toks = walker.glob_tokens(pat, gitignore)
            rx = re.compile(walker.tokens_re(toks), re.DOTALL)
            nfa = walker.Nfa(toks, re.DOTALL)
            for _ in range(20):
                name = "".join(rng.choice("ab/.x") for _ in range(rng.randint(0, 8)))
                assert nfa.fullmatch(name) == bool(rx.fullmatch(name)), (pat, gitignore, name)
    assert walker.pattern_re("**/**/**/*") == "(?:.*/)?[^/]*" and walker.pattern_re("a***b") == "a.*b"


# -- codebase_search ---------------------------------------------------------------------------------


async def test_codebase_search_names_a_missing_target_directory(pctx):
    calls = []

    class Backend:
        async def search(self, workspace, query, target_directories, k):
            calls.append(target_directories)
            return []

    tool = CodebaseSearch(backend=Backend())
    got = await _run(pctx, tool, query="add", target_directories=["pkg", "nope"])
    assert got.is_error and got.text.startswith("Error: target directory 'nope' does not exist"), got.text
    got = await _run(pctx, tool, query="add", target_directories=["nope", "gone/deeper"])
    assert (
        got.text
        == "Error: target directories ['nope', 'gone/deeper'] do not exist; use list_dir to find the right path."
    )
    assert calls == []
    assert (await _run(pctx, tool, query="add", target_directories=["pkg"])).text == "No results for 'add'."


async def test_codebase_search_answers_with_term_matches_while_the_index_is_built(pctx, monkeypatch):
    """The first search of a workspace builds its semantic index: 66-212 s on CPU for repositories of
    342 to 20,000 files, with nothing for the agent meanwhile. Past the wait it answers by terms, and
    the build goes on for the next search."""
    from vivace.search import backend as semantic

    monkeypatch.setattr(semantic, "FIRST_BUILD_WAIT_S", 0.2)
    index = semantic.HybridSearch(cache=None)  # BM25 over the chunks: no model to load here
    opened = asyncio.Event()
    real_open = index.indexer.open

    async def slow_open(source):
        await asyncio.sleep(2.0)  # embedding every file
        state = await real_open(source)
        opened.set()
        return state

    monkeypatch.setattr(index.indexer, "open", slow_open)
    tool = CodebaseSearch(backend=index)
    got = await _run(pctx, tool, query="add")
    assert got.text.startswith("(the index of this workspace is still being built (0 s so far): these are term")
    assert "pkg/calc.py" in got.text  # the term match, from the lexical search
    await asyncio.wait_for(opened.wait(), 10)  # not cancelled: it finished in the background
    got = await _run(pctx, tool, query="add")
    assert "pkg/calc.py:1-6 (add)" in got.text and "still being built" not in got.text, got.text


async def test_a_failed_first_index_build_does_not_keep_its_workspace(plain_backend, repo, monkeypatch):
    """An episode's timeout cut the first search short and closed the workspace; the build went on and
    failed. Kept for a retry, its traceback held the workspace: 200 such episodes kept 200 workspaces."""
    import gc
    import weakref

    from vivace.sandbox import WorkspaceClosedError
    from vivace.search import backend as semantic

    index = semantic.HybridSearch(cache=None)

    async def closed_under_it(source):
        await asyncio.sleep(0.05)
        raise WorkspaceClosedError("the workspace was closed during the call")

    monkeypatch.setattr(index.indexer, "open", closed_under_it)
    ws = await plain_backend.create(plain_backend.snapshot(str(repo)))
    search = asyncio.ensure_future(index.search(ws, "add", None, 5))
    await asyncio.sleep(0.01)
    search.cancel()  # the tool call, cut short; the shielded build goes on
    await asyncio.gather(search, return_exceptions=True)
    await ws.close()
    await asyncio.sleep(0.1)  # the build fails
    alive = weakref.ref(ws)
    del ws, search
    gc.collect()
    assert alive() is None and not index._opening.weak


# -- the terminal display -----------------------------------------------------------------------------

HOSTILE = 'y = "\x1b]0;PWNED\x07\x1b[2J\x9b31m"'


def test_visible_escapes_every_control_but_newline_and_tab():
    assert visible("a\tb\nc") == "a\tb\nc"
    assert visible(HOSTILE) == 'y = "\\x1b]0;PWNED\\x07\\x1b[2J\\x9b31m"'
    assert visible("x\r\n\x00\x7f\x85") == "x\\r\n\\x00\\x7f\\x85"
    assert colour_diff("+a\x1b[2J\r\n-b\x0cc\n").plain == "+a\\x1b[2J\\r\n-b\\x0cc\n"


def test_the_apply_report_lists_each_path_on_one_line():
    """A path holding a newline ("a\\n  b.py") printed raw read as two paths applied."""
    from vivace.harness.display import print_apply_report
    from vivace.sandbox.apply import ApplyReport

    buf = io.StringIO()
    report = ApplyReport(applied=["ok.py", "a\n  b.py"], left={"c\td.py": "binary"})
    print_apply_report(Console(file=buf, width=300), report, "/repo\nx", stopped=True)
    assert buf.getvalue().splitlines() == [
        "stopped while applying; changed in /repo\\nx before the stop:", "  ok.py", "  a\\n  b.py",
        "not applied (the diff above has them):", "  c\\td.py: binary", "the rest of the diff above is not applied",
    ]  # fmt: skip


def test_a_huge_diff_is_shown_cut_with_a_note():
    """`rm -rf` of a large directory plus one edit in a minified bundle printed a 3.5 MB diff whole."""
    from vivace.harness.display import SHOWN_LINE_CHARS

    files = [f"diff --git a/f{i} b/f{i}\n--- a/f{i}\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n" for i in range(1000)]
    bundle = "diff --git a/b.js b/b.js\n@@ -1 +1 @@\n-" + "a" * 500_000 + "\n+" + "b" * 500_000 + "\n"
    shown = colour_diff(bundle + "".join(files), max_lines=100).plain
    lines = shown.splitlines()
    assert len(lines) == 101 and max(map(len, lines)) < SHOWN_LINE_CHARS + 40
    assert lines[2] == "-" + "a" * (SHOWN_LINE_CHARS - 1) + f"… ({500_001 - SHOWN_LINE_CHARS:,} more characters)"
    assert lines[-1] == "… 4,904 more lines of the diff not shown (980 more files); --json prints it whole"
    assert colour_diff(bundle).plain == bundle  # not cut unless asked


def test_printer_passes_no_control_character_to_the_terminal():
    buf = io.StringIO()
    printer = EpisodePrinter(Console(file=buf, force_terminal=True, color_system="truecolor", width=300))
    call = ToolCall("1", "run_terminal_cmd", {"command": HOSTILE})
    printer("assistant", AssistantTurn(Message("assistant", f"look: {HOSTILE}", (call,))))
    printer("tool", ToolOutcome(call, ToolResult(HOSTILE + "\nmore"), 0.0, 0.01))
    edit = ToolCall("2", "edit_file", {"path": "a.py", "old_string": "x = 1\n", "new_string": HOSTILE + "\n"})
    printer("tool", ToolOutcome(edit, ToolResult("ok"), 0.0, 0.01))
    diff = f"--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+{HOSTILE}\n"
    traj = SimpleNamespace(
        diff=diff, error=HOSTILE, turns=[1], tool_calls=2, format_errors=0, wall_s=0.1, stop_reason="done"
    )
    printer("end", traj)
    out = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())  # rich's own colours; nothing else may be left
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out), out
    # The reply, both calls' arguments, the first result, the edit's diff, the final diff and the error.
    assert out.count("\\x1b]0;PWNED\\x07\\x1b[2J") == 7, out


def test_codebase_search_refuses_a_blank_query_before_searching():
    from vivace.harness.tools import default_tools
    from vivace.harness.tools.base import parse_args

    tool = next(t for t in default_tools() if t.name == "codebase_search")
    for query in ("", "   \n"):
        result = parse_args(tool, {"query": query})
        assert result.is_error and "the query is empty" in result.text


async def test_codebase_search_quotes_a_huge_query_cut(pctx):
    class Backend:
        async def search(self, workspace, query, target_directories, k):
            return []

    query = "qqqqzzzz " * 120_000
    got = await _run(pctx, CodebaseSearch(backend=Backend()), query=query)
    assert got.text == f"No results for {query[:200] + '…'!r}."
