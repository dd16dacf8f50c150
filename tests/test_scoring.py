"""The scorer on a small task (an injected bug in conftest's sample repo), through real
workspaces and real policies: the oracle earns full marks, doing nothing earns nothing,
editing the tests never helps, and claims are checked against what was done."""

from __future__ import annotations

import pytest

from conftest import benchmark_episodes, make_backend
from vivace.bench.baselines import OraclePolicy, RandomEditPolicy, RandomPolicy
from vivace.bench.patch import parse_patch
from vivace.bench.score import score, unsupported_claims
from vivace.harness.agent import run_episode
from vivace.harness.policies import NullPolicy, ReplayPolicy
from vivace.tasks.families import _new_file
from vivace.tasks.format import RepoSpec, Task, TestSpec
from vivace.tasks.generate import unified_diff

CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
BUGGY = CALC.replace("return a + b", "return a - b")


@pytest.fixture
def task(repo) -> Task:
    return Task(
        id="calc-add",
        repo=RepoSpec(path=str(repo), patch=unified_diff("pkg/calc.py", CALC, BUGGY)),
        request="add() returns the wrong result; fix it.",
        tests=TestSpec(
            fail_to_pass=["tests/test_calc.py::test_add", "tests/test_extra.py::test_add_negative"],
            files={
                "tests/test_extra.py": "from pkg.calc import add\n\n\ndef test_add_negative():\n    assert add(-2, -3) == -5\n"
            },
        ),
        reference_patch=unified_diff("pkg/calc.py", BUGGY, CALC),
    )


async def play(policy, task: Task, state_dir, kind: str = "plain"):
    backend = make_backend(kind, state_dir)
    try:
        ws = await backend.create(backend.snapshot(task.source(cache_dir=state_dir)))
        assert "return a - b" in (await ws.read_text("pkg/calc.py")).split("def sub")[0]  # the bug is there
        bound = policy.for_task(task) if hasattr(policy, "for_task") else policy
        traj = await run_episode(bound, ws, task.request, task_id=task.id)
        return traj, await score(task, traj, ws)
    finally:
        await backend.aclose()


@pytest.mark.parametrize("kind", ["plain", "isolated"])
async def test_oracle_gets_full_marks(task, state_dir, kind):
    traj, s = await play(OraclePolicy(), task, state_dir, kind)
    assert s.resolved and s.correctness == 1.0
    assert s.adherence == 1.0 and s.claims == 1.0 and s.format == 1.0
    assert s.details["fail_to_pass"] == [2, 2]
    # The request names no file: run the tests, read what they point to, edit, test + lint, answer.
    assert [len(t.tool_calls) for t in traj.turns] == [1, 1, 1, 2, 0]
    assert traj.turns[0].tool_calls[0].name == "run_terminal_cmd"
    assert "The tests pass" in traj.final_message and s.details["unsupported_claims"] == []
    assert s.total > 1.0
    named = task.model_copy(update={"request": task.request + " (in pkg/calc.py)"})
    traj, s = await play(OraclePolicy(), named, state_dir, kind)
    assert s.resolved and [len(t.tool_calls) for t in traj.turns] == [1, 1, 2, 0]  # no discovery run needed


async def test_doing_nothing_earns_nothing(task, state_dir):
    _, s = await play(NullPolicy(), task, state_dir)
    assert not s.resolved and s.total <= 0 and s.details["fail_to_pass"][0] == 0


async def test_random_edits_do_not_solve(task, state_dir):
    _, s = await play(RandomPolicy(), task, state_dir)
    assert not s.resolved


async def test_random_edit_mutates_only_the_function_the_test_names(task, state_dir):
    outcomes = []
    for i in range(6):  # the policy's choice is seeded by the task id
        t = task.model_copy(update={"id": f"calc-add-{i}"})
        traj, s = await play(RandomEditPolicy(), t, state_dir)
        edits = [c for turn in traj.turns for c in turn.tool_calls if c.name == "edit_file"]
        assert [c.name for turn in traj.turns for c in turn.tool_calls] == ["grep", "read_file", "edit_file"]
        assert len(edits) == 1 and edits[0].arguments["path"] == "pkg/calc.py" and not edits[0].is_error
        assert "return a - b" in edits[0].arguments["old_string"]  # add's body, never sub's
        outcomes.append(s.resolved)
    assert any(outcomes) and not all(outcomes)  # sometimes the random mutation is the fix


async def test_editing_the_tests_instead_of_the_code_scores_zero(task, state_dir):
    cheat = ReplayPolicy([
        {"tool_calls": [
            {"name": "write_file", "arguments": {"path": "tests/test_calc.py", "content": "def test_add():\n    assert True\n"}},
            {"name": "write_file", "arguments": {"path": "tests/test_extra.py", "content": "def test_add_negative():\n    pass\n"}},
            {"name": "run_terminal_cmd", "arguments": {"command": "python -m pytest -q -p no:cacheprovider"}},
        ]},
        {"content": "All tests pass now."},
    ])  # fmt: skip
    traj, s = await play(cheat, task, state_dir)
    assert traj.turns[0].tool_calls[2].meta["exit_code"] == 0  # the cheat "worked" in the workspace
    assert s.correctness == 0.0 and not s.resolved and s.total <= 0
    assert s.details["test_files_edited"] == ["tests/test_calc.py", "tests/test_extra.py"]


async def test_claims_and_format_errors_are_penalised(task, state_dir):
    liar = ReplayPolicy([
        {"text": '<tool_call>\n{"name": "edit_file", "arguments": {"path": "pkg/calc.py"\n</tool_call>'},
        {"tool_calls": [{"name": "edit_file", "arguments": {
            "path": "pkg/calc.py", "old_string": "return a - b\n\n\ndef sub", "new_string": "return a + b\n\n\ndef sub"}}]},
        {"content": "Fixed pkg/calc.py and utils/helpers.py. I ran the suite and all tests pass."},
    ])  # fmt: skip
    traj, s = await play(liar, task, state_dir)
    assert s.resolved  # the fix is right ...
    assert set(s.details["unsupported_claims"]) >= {"utils/helpers.py"}  # ... but never touched that file
    assert any("pass" in c for c in s.details["unsupported_claims"])  # ... and ran no tests
    assert any(c.startswith("I ran") for c in s.details["unsupported_claims"])
    assert s.claims < 1 and s.format == 0.5
    full = await play(OraclePolicy(), task, state_dir)
    assert s.total < full[1].total


def test_claims_need_a_passing_test_run_after_the_last_edit(task):
    from vivace.harness.trajectory import ToolRecord, Trajectory, Turn

    def traj(*calls: ToolRecord, answer: str) -> Trajectory:
        turns = [Turn(content="", tool_calls=[c]) for c in calls]
        return Trajectory(request="x", policy="p", system_prompt="s", system_prompt_version="v", turns=turns,
                          final_message=answer, stop_reason="done")  # fmt: skip

    run_ok = ToolRecord(id="1", name="run_terminal_cmd", arguments={"command": "pytest -q"}, result="Exit code: 0",
                        meta={"exit_code": 0})  # fmt: skip
    run_bad = run_ok.model_copy(update={"meta": {"exit_code": 1}, "result": "Exit code: 1"})
    edit = ToolRecord(id="2", name="edit_file", arguments={"path": "pkg/calc.py"}, result="Edited pkg/calc.py")
    assert unsupported_claims(traj(edit, run_ok, answer="The tests pass.")) == ([], 1)
    assert unsupported_claims(traj(run_ok, edit, answer="The tests pass."))[0]  # ran before the edit
    assert unsupported_claims(traj(edit, run_bad, answer="All tests passed."))[0]  # the run failed
    assert unsupported_claims(traj(edit, run_ok, answer="Changed pkg/calc.py.")) == ([], 1)
    assert unsupported_claims(traj(answer="Nothing to do.")) == ([], 0)


def test_parse_patch_ends_lines_at_newline_only_and_reads_quoted_names():
    """A form feed or U+2028 inside a line is no line end (git's rule), and a C-quoted name (a tab in it)
    is read back: otherwise the added line numbers shift and the path is wrong."""

    quoted = (
        'diff --git "a/x\\ty.py" "b/x\\ty.py"\n--- "a/x\\ty.py"\n+++ "b/x\\ty.py"\n@@ -1,2 +1,2 @@\n a\x0cb\n-c\n+d\n'
    )
    separators = "diff --git a/f.py b/f.py\n--- a/f.py\n+++ b/f.py\n@@ -1,3 +1,3 @@\n x\u2028y\n-c\n+d\n"
    for patch, path in ((quoted, "x\ty.py"), (separators, "f.py")):
        (change,) = parse_patch(patch)
        assert (change.path, change.added, change.removed, change.added_lines) == (path, 1, 1, [2])


def _prefixed(diff: str, old: str, new: str) -> str:
    """`diff` (a/ b/ prefixes) as git writes it with other prefixes: `-R` swaps them (b/ a/), and
    `diff.mnemonicPrefix` names the sides (i/ index, w/ work tree, c/ commit, o/ object)."""
    for mark in (" ", '"'):  # before a plain name and a C-quoted one
        diff = diff.replace(f"{mark}a/", f"{mark}{old}/").replace(f"{mark}b/", f"{mark}{new}/")
    return diff


@pytest.mark.parametrize("old, new", [("a", "b"), ("b", "a"), ("i", "w"), ("c", "w"), ("o", "w")])
def test_parse_patch_reads_paths_as_git_apply_does(old, new):
    """A reference patch made with `git diff -R` (b/ a/) or `diff.mnemonicPrefix` applies with `git apply`:
    its paths are read as git reads them (-p1), not as the whole `i/x.py w/x.py` pair, which named a
    file that does not exist. The a/ b/ forms read as before."""

    modified = (
        "diff --git a/pkg/x.py b/pkg/x.py\nindex 1..2 100644\n--- a/pkg/x.py\n+++ b/pkg/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    )
    added = "diff --git a/n.py b/n.py\nnew file mode 100644\n--- /dev/null\n+++ b/n.py\n@@ -0,0 +1 @@\n+n\n"
    deleted = "diff --git a/d.py b/d.py\ndeleted file mode 100644\n--- a/d.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-d\n"
    mode = "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"
    binary = "diff --git a/b.dat b/b.dat\nnew file mode 100644\nindex 0..1\nBinary files /dev/null and b/b.dat differ\n"
    renamed = "diff --git a/old.py b/new.py\nsimilarity index 100%\nrename from old.py\nrename to new.py\n"
    # git ends a name holding a space with a tab on the ---/+++ lines; it quotes one holding non-ASCII.
    spaced = "diff --git a/my dir/f.py b/my dir/f.py\n--- a/my dir/f.py\t\n+++ b/my dir/f.py\t\n@@ -1 +1 @@\n-a\n+b\n"
    quoted = (
        'diff --git "a/my dir/caf\\303\\251.py" "b/my dir/caf\\303\\251.py"\n--- "a/my dir/caf\\303\\251.py"\n'
        '+++ "b/my dir/caf\\303\\251.py"\n@@ -1 +1 @@\n-a\n+b\n'
    )
    patch = _prefixed(modified + added + deleted + mode + binary + renamed + spaced + quoted, old, new)
    assert [(c.path, c.new_file, c.deleted, c.added, c.removed) for c in parse_patch(patch)] == [
        ("pkg/x.py", False, False, 1, 1), ("n.py", True, False, 1, 0), ("d.py", False, True, 0, 1),
        ("run.sh", False, False, 0, 0), ("b.dat", True, False, 0, 0), ("new.py", False, False, 0, 0),
        ("my dir/f.py", False, False, 1, 1), ("my dir/café.py", False, False, 1, 1),
    ]  # fmt: skip


def test_parse_patch_reads_a_reversed_patch_and_dashes_in_hunks():
    """`git diff -R` swaps old and new, so its added file is a deleted one; and inside a hunk a line
    reading "--- x" or "+++ x" is content ("-- x" removed, "++ x" added), not a file's header."""

    reverse = (
        "diff --git b/n.py a/n.py\ndeleted file mode 100644\n--- b/n.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-n\n--- x\n"
    )
    reverse += "diff --git b/pkg/x.py a/pkg/x.py\n--- b/pkg/x.py\n+++ a/pkg/x.py\n@@ -1 +1 @@\n-b\n+++ x\n"
    changes = parse_patch(reverse)
    assert [(c.path, c.deleted, c.added, c.removed) for c in changes] == [
        ("n.py", True, 0, 2),
        ("pkg/x.py", False, 1, 1),
    ]


def _traditional(old: str, new: str, tmp_path, name: str = "f.txt") -> str:
    """GNU `diff -u` of two texts, as `diff -ruN a b` names them (a/NAME, b/NAME, with timestamps)."""
    import subprocess

    for side, text in (("a", old), ("b", new)):
        (tmp_path / side).mkdir(exist_ok=True)
        (tmp_path / side / name).write_text(text)
    out = subprocess.run(["diff", "-u", f"a/{name}", f"b/{name}"], cwd=tmp_path, capture_output=True, text=True)
    return out.stdout


def _git_diff(old: str, new: str, tmp_path) -> str:
    import subprocess

    (tmp_path / "old").write_text(old)
    (tmp_path / "new").write_text(new)
    out = subprocess.run(["git", "diff", "--no-index", "--no-color", "old", "new"], cwd=tmp_path,
                         capture_output=True, text=True)  # fmt: skip
    return out.stdout


def _rebuilt(old: str, change) -> str:
    """`old` with the change's hunks applied where their @@ lines put them; each hunk's old text must be
    exactly what the file holds there."""
    lines, out, at = old.splitlines(keepends=True), [], 0
    for hunk in change.hunks:
        begin = hunk.line - 1 if hunk.old else hunk.line  # an empty old side (a pure addition) names the line before
        out += lines[at:begin]
        n = len(hunk.old.splitlines(keepends=True))
        assert "".join(lines[begin : begin + n]) == hunk.old
        out.append(hunk.new)
        at = begin + n
    return "".join(out + lines[at:])


def test_parse_patch_reads_every_hunk_of_real_diffs_line_for_line(tmp_path):
    """Random edits of files full of diff-like lines ("---", "+++ x", "-- y", "@@", blank lines, no final
    newline), diffed by GNU diff and by git: each hunk's old text is exactly the file's lines there, and
    the hunks rebuild the new file. A hunk ends where its @@ line says: the oracle used to skip any body
    line starting "---" or "+++" (a YAML or Markdown rule removed), and a traditional diff named no file."""
    import random

    pool = ["---", "--- a/x", "+++ b/x", "-- y", "++", "@@ -1 +1 @@", "", "a", "b", "c", "d", "\\ z", "diff --git a b"]
    rng = random.Random(7)
    for trial in range(60):
        old_lines = [rng.choice(pool) for _ in range(rng.randint(1, 30))]
        new_lines = list(old_lines)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(new_lines) + 1)
            op = rng.choice(("insert", "delete", "replace"))
            if op == "insert" or not new_lines[at:]:
                new_lines.insert(at, rng.choice(pool))
            elif op == "delete":
                del new_lines[at]
            else:
                new_lines[at] = rng.choice(pool)
        old = "\n".join(old_lines) + ("\n" if rng.random() < 0.7 else "")
        new = "\n".join(new_lines) + ("\n" if rng.random() < 0.7 else "")
        if old == new:
            continue
        for make in (_traditional, _git_diff):
            diff = make(old, new, tmp_path)
            (change,) = parse_patch(diff)
            assert change.path in ("f.txt", "new"), diff
            assert _rebuilt(old, change) == new, (trial, make.__name__, diff)
            assert change.added == sum(ln.startswith("+") for ln in diff.split("\n")[2:] if not ln.startswith("+++ "))


def test_parse_patch_is_linear_in_the_diff():
    """An agent's diff that rewrites a 50,000-line file (1.6 MB) took 27 s to read (each line added to
    the section's text one at a time; 59 s once hunks were kept the same way): now ~0.1 s."""
    import time

    n = 50_000
    patch = f"diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,{n} +1,{n} @@\n"
    patch += "".join(f"-old line {i}\n+new line {i}\n" for i in range(n))
    t0 = time.perf_counter()
    (change,) = parse_patch(patch)
    assert time.perf_counter() - t0 < 5
    assert change.text == patch and change.added == change.removed == n and len(change.hunks) == 1


def test_parse_patch_reads_a_traditional_multi_file_diff():
    """`diff -ruN a b` output (no `diff --git` lines; a file absent on one side has the epoch as its time)
    and a plain `diff -u x.orig x`: `git apply` takes them, so the oracle and the scorer read them too."""

    patch = (
        "diff -ruN a/pkg/x.py b/pkg/x.py\n--- a/pkg/x.py\t2026-11-30 10:00:00.000000000 +0000\n"
        "+++ b/pkg/x.py\t2026-12-01 10:00:00.000000000 +0000\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
        "diff -ruN a/n.py b/n.py\n--- a/n.py\t1970-01-01 00:00:00.000000000 +0000\n"
        "+++ b/n.py\t2026-12-01 10:00:00.000000000 +0000\n@@ -0,0 +1,2 @@\n+n\n+m\n"
        "diff -ruN a/d.py b/d.py\n--- a/d.py\t2026-11-30 10:00:00.000000000 +0000\n"
        "+++ b/d.py\t1970-01-01 00:00:00.000000000 +0000\n@@ -1 +0,0 @@\n-d\n"
    )
    got = [(c.path, c.new_file, c.deleted, c.added, c.removed, c.hunks) for c in parse_patch(patch)]
    assert got == [
        ("pkg/x.py", False, False, 1, 1, [("a\nb\n", "a\nc\n", 1)]),
        ("n.py", True, False, 2, 0, [("", "n\nm\n", 0)]),
        ("d.py", False, True, 0, 1, [("d\n", "", 1)]),
    ]
    assert [c.path for c in parse_patch("--- lib/x.py.orig\n+++ lib/x.py\n@@ -1 +1 @@\n-a\n+b\n")] == ["x.py"]


async def test_oracle_solves_a_task_whose_reference_patch_is_a_traditional_diff(task, state_dir):
    """A reference patch without `diff --git` lines (made with `diff -u`) gave the oracle nothing to do,
    so the task was judged unsound and the scorer had no reference files."""
    traditional = "".join(
        line for line in task.reference_patch.splitlines(keepends=True) if not line.startswith(("diff --git", "index "))
    )
    assert traditional.startswith("--- a/pkg/calc.py\n")
    _, s = await play(OraclePolicy(), task.model_copy(update={"reference_patch": traditional}), state_dir)
    assert s.resolved and s.adherence == 1.0


SHAPES = (
    "class Square:\n    def __init__(self, size):\n        self.size = size\n\n    def scaled(self, k):\n"
    "        return self.size + k\n\n\nclass Circle:\n    def __init__(self, size):\n        self.size = size\n\n"
    "    def scaled(self, k):\n        return self.size + k\n"
)
SHAPES_TESTS = (
    "from pkg.shapes import Circle, Square\n\n\ndef test_circle_scales():\n    assert Circle(3).scaled(2) == 6\n\n\n"
    "def test_square_adds():\n    assert Square(3).scaled(2) == 5\n"
)


def _shapes_task(repo, fixed: str, path: str = "pkg/shapes.py", test_file: str = "tests/test_shapes.py") -> Task:
    module = path.removesuffix(".py").replace("/", ".")
    return Task(
        id="shapes",
        repo=RepoSpec(path=str(repo), patch=_new_file(path, SHAPES)),
        request="Circle.scaled is wrong; fix it.",
        tests=TestSpec(
            fail_to_pass=[f"{test_file}::test_circle_scales"],
            pass_to_pass=[f"{test_file}::test_square_adds"],
            files={test_file: SHAPES_TESTS.replace("pkg.shapes", module)},
        ),
        reference_patch=unified_diff(path, SHAPES, fixed),
    )


async def _run(policy, task: Task, state_dir):
    backend = make_backend("plain", state_dir)
    try:
        ws = await backend.create(backend.snapshot(task.source(cache_dir=state_dir)))
        traj = await run_episode(policy.for_task(task), ws, task.request, task_id=task.id)
        return traj, await score(task, traj, ws)
    finally:
        await backend.aclose()


@pytest.mark.parametrize("style", ["efficient", "serial"])
@pytest.mark.parametrize("minimal", [False, True])
async def test_oracle_changes_the_one_of_two_identical_blocks_its_patch_names(repo, state_dir, style, minimal):
    """git apply goes by line number, so a reference patch may change one of two identical blocks (its
    context and all); the oracle's edit_file needs a unique old_string, so it failed ("occurs 2 times")
    and the task was judged unsound. It now widens the hunk with the file's lines around it."""
    from vivace.bench.baselines import _Oracle

    fixed = SHAPES[: SHAPES.rindex("+ k")] + "* k\n"
    task = _shapes_task(repo, fixed)
    ((hunk,),) = [c.hunks for c in parse_patch(task.reference_patch)]
    assert SHAPES.count(hunk.old) == 2  # the hunk alone names both blocks

    class Oracle:
        def for_task(self, t):
            return _Oracle(t, style, minimal)

    traj, s = await _run(Oracle(), task, state_dir)
    assert s.resolved and s.details["pass_to_pass"] == [1, 1], traj.final_message
    assert not any(c.is_error for t in traj.turns for c in t.tool_calls)


def test_test_paths_are_the_conventions_not_every_directory_named_test():
    """A library's own test helpers (django/test/, numpy/testing/) are code a fix may change: the scorer
    undid the agent's fix there and the oracle dropped it from the reference, so no fix could pass."""
    from vivace.bench.patch import is_test_path

    tests = ["tests/test_x.py", "pkg/tests/helpers.py", "test/support.py", "testing/util.py", "pkg/test_x.py",
             "pkg/x_test.py", "pkg/conftest.py", "conftest.py"]  # fmt: skip
    code = ["django/test/utils.py", "numpy/testing/_private.py", "pkg/testing/factories.py", "pkg/x.py", "test.py",
            "pkg/latest.py", "contest.py"]  # fmt: skip
    assert [p for p in tests if not is_test_path(p)] == [] and [p for p in code if is_test_path(p)] == []


async def test_a_fix_in_a_packages_testing_module_counts_and_the_tasks_own_test_files_are_undone(repo, state_dir):
    """The oracle fixes pkg/testing/shapes.py (no longer taken for a test file) and solves the task; an agent
    that edits the task's own test file, whatever its name (checks/check_shapes.py), has that edit undone
    before the hidden tests run, as it is for test_*.py."""
    fixed = SHAPES[: SHAPES.rindex("+ k")] + "* k\n"
    task = _shapes_task(repo, fixed, path="pkg/testing/shapes.py", test_file="checks/check_shapes.py")
    task = task.model_copy(update={"repo": task.repo.model_copy(update={
        "patch": task.repo.patch + _new_file("pkg/testing/__init__.py", "") + _new_file(
            "checks/check_shapes.py", SHAPES_TESTS.replace("pkg.shapes", "pkg.testing.shapes"))})})  # fmt: skip
    _, s = await _run(OraclePolicy(), task, state_dir)
    assert s.resolved and s.details["test_files_edited"] == []
    cheat = "def test_circle_scales():\n    pass\n\n\ndef test_square_adds():\n    pass\n"
    replay = ReplayPolicy([{"tool_calls": [{"name": "write_file", "arguments": {
        "path": "checks/check_shapes.py", "content": cheat}}]}])  # fmt: skip
    replay.for_task = lambda t: replay
    task = task.model_copy(update={"tests": task.tests.model_copy(update={"files": {}})})  # the repo's file judges
    _, s = await _run(replay, task, state_dir)
    assert not s.resolved and s.details["test_files_edited"] == ["checks/check_shapes.py"]


async def test_a_doctest_ids_module_is_code_the_fix_changes_not_a_test_file_to_undo(repo, state_dir):
    """A doctest's id names the module under test (pkg/shapes.py::pkg.shapes.Circle.scaled): the task's own
    test files leave out those its reference fix changes, or the oracle's fix would be undone."""
    from vivace.tasks.format import DEFAULT_TEST_COMMAND

    doc = '        """\n        >>> Circle(3).scaled(2)\n        6\n        """\n'
    buggy = SHAPES[: SHAPES.rindex("        return")] + doc + SHAPES[SHAPES.rindex("        return") :]
    fixed = buggy[: buggy.rindex("+ k")] + "* k\n"
    task = Task(
        id="doctest",
        repo=RepoSpec(path=str(repo), patch=_new_file("pkg/shapes.py", buggy)),
        request="Circle.scaled is wrong; fix it.",
        tests=TestSpec(
            command=DEFAULT_TEST_COMMAND + " --doctest-modules",
            fail_to_pass=["pkg/shapes.py::pkg.shapes.Circle.scaled"],
        ),  # fmt: skip
        reference_patch=unified_diff("pkg/shapes.py", buggy, fixed),
    )
    _, s = await _run(OraclePolicy(), task, state_dir)
    assert s.resolved and s.details["test_files_edited"] == [], s.details


async def test_a_reference_patch_that_does_not_apply_is_named_as_the_tasks_problem(repo, state_dir):
    """A reference patch whose context the file does not hold was reported as a wrong fix ("FAIL_TO_PASS
    0/1 passed"): the oracle's rejected edit is now in the score's details and the reason names the patch."""
    from vivace.bench.report import task_problems

    fixed = SHAPES[: SHAPES.rindex("+ k")] + "* k\n"
    task = _shapes_task(repo, fixed)
    task = task.model_copy(update={"reference_patch": task.reference_patch.replace(" def scaled", " def sclaed")})
    _, s = await _run(OraclePolicy(), task, state_dir)
    assert not s.resolved and s.details["edits_rejected"] == 1
    assert s.details["first_rejected_edit"].startswith("edit_file pkg/shapes.py: old_string was not found")
    row = {"model": "scripted:oracle", "task_id": task.id, "resolved": False, "details": s.details}
    why = task_problems([row], [task])[task.id]
    assert why.startswith("the reference_patch does not apply here (edit_file pkg/shapes.py: old_string"), why


async def test_test_ids_pytest_never_reported_are_named(repo, state_dir):
    """A FAIL_TO_PASS id that is not how pytest names the test (a class left out) was blamed on the test
    command ("no pytest -rA summary"), and one wrong id among right ones went unnamed ("FAIL_TO_PASS 1/2").
    An id written with a parameter's own characters (`[café]`, which pytest prints escaped) is matched."""
    from vivace.bench.report import task_problems

    fixed = SHAPES[: SHAPES.rindex("+ k")] + "* k\n"
    base = _shapes_task(repo, fixed)
    wrong = base.model_copy(update={"tests": base.tests.model_copy(update={
        "fail_to_pass": ["tests/test_shapes.py::test_circle_scale"], "pass_to_pass": []})})  # fmt: skip
    _, s = await _run(OraclePolicy(), wrong, state_dir)
    assert s.details["tests_not_run"] == (
        "pytest reported 2 tests but none by the task's 1 ids; the closest it reported to "
        "tests/test_shapes.py::test_circle_scale: tests/test_shapes.py::test_circle_scales; an id is "
        "FILE::[CLASS::]NAME[PARAMS] as pytest -rA prints it"
    )
    unicode_test = SHAPES_TESTS + (
        '\n\nimport pytest\n\n\n@pytest.mark.parametrize("name", ["café"])\ndef test_named(name):\n'
        "    assert Circle(1).scaled(2) == 2\n"
    )
    one_wrong = base.model_copy(update={"tests": base.tests.model_copy(update={
        "fail_to_pass": ["tests/test_shapes.py::test_circle_scales", "tests/test_shapes.py::test_named[café]",
                         "tests/test_shapes.py::Circle::test_circle_scales"],
        "files": {"tests/test_shapes.py": unicode_test}})})  # fmt: skip
    _, s = await _run(OraclePolicy(), one_wrong, state_dir)
    assert s.details["fail_to_pass"] == [2, 3] and "tests_not_run" not in s.details
    assert s.details["ids_without_outcome"] == ["tests/test_shapes.py::Circle::test_circle_scales"]
    row = {"model": "scripted:oracle", "task_id": base.id, "resolved": False, "details": s.details}
    assert task_problems([row], [one_wrong])[base.id] == (
        "the reference fix does not pass the tests (FAIL_TO_PASS 2/3, PASS_TO_PASS 1/1 passed; pytest reported "
        "nothing for tests/test_shapes.py::Circle::test_circle_scales: check those ids)"
    )


async def test_oracle_applies_a_reference_patch_with_mnemonic_prefixes(task, state_dir):
    """The oracle edits the file the reference patch names, whatever its prefixes; it used to edit
    `i/pkg/calc.py w/pkg/calc.py`, so the task was judged unsound."""
    mnemonic = task.model_copy(update={"reference_patch": _prefixed(task.reference_patch, "i", "w")})
    _, s = await play(OraclePolicy(), mnemonic, state_dir)
    assert s.resolved and s.adherence == 1.0


async def test_what_the_setup_changed_is_not_the_agents(task, state_dir):
    """A task's setup commands run in the workspace before the agent, so what they changed was in the
    episode's diff and scored as the agent's: a build's egg-info as stray files, a touched file in the
    Jaccard, a generated pytest.ini undone for the test run as the agent's configuration."""
    setup = (
        "mkdir pkg.egg-info && echo x > pkg.egg-info/PKG-INFO && printf '[pytest]\\n' > pytest.ini && echo >> README.md"
    )
    with_setup = task.model_copy(update={"setup": [setup]})
    (_, plain), (traj, built) = await benchmark_episodes(
        state_dir, (OraclePolicy(), task), (OraclePolicy(), with_setup)
    )
    assert "pkg.egg-info/PKG-INFO" in traj.diff  # the workspace's diff still shows all of it
    assert built.resolved and (built.adherence, built.total) == (plain.adherence, plain.total) == (1.0, plain.total)
    assert built.details["setup_changes_left_out"] == ["README.md", "pkg.egg-info/PKG-INFO", "pytest.ini"]
    assert built.details["pytest_config_undone"] == [] and "setup_changes_left_out" not in plain.details
