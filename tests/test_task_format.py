"""The task format (task directories, JSONL, error messages) and SWE-bench records as tasks.

The SWE-bench part builds a real git repository (base commit with a bug, a fix commit, a
commit adding tests, a later commit the clone is left on), derives `patch` and `test_patch`
with `git diff`, and checks the task end to end in a plain-backend workspace: the hidden
tests fail on the base and pass once the fix is written.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import make_backend
from vivace.sandbox.snapshot import SnapshotSource
from vivace.tasks import format as fmt
from vivace.tasks.format import Task, TaskFormatError, load_jsonl, load_task_dir, load_tasks, save_jsonl
from vivace.tasks.swebench import from_swebench, load_repo_runs, load_swebench_jsonl, sanitize_id

# --------------------------------------------------------------------------- task format

HIDDEN_TEST = "from pkg.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
REFERENCE_PATCH = (
    "--- a/pkg/calc.py\n+++ b/pkg/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
)


def minimal(**over) -> dict:
    data = {
        "id": "t1",
        "repo": {"path": "repo"},
        "request": "add() subtracts; make it add",
        "tests": {"fail_to_pass": ["tests/test_x.py::test_add"]},
    }
    data.update(over)
    return data


@pytest.fixture
def bundled(tmp_path, monkeypatch) -> Path:
    """A bundled-repository directory holding one repository, `demo` (independent of what ships)."""
    root = tmp_path / "bundled"
    (root / "demo").mkdir(parents=True)
    (root / "_private").mkdir()
    monkeypatch.setattr(fmt, "BUNDLED_REPOS", root)
    return root


def write_task_dir(root: Path, data: dict, patch: str | None = None, hidden: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "task.json").write_text(json.dumps(data, indent=2))
    if patch is not None:
        (root / "reference.patch").write_text(patch)
    for rel, text in (hidden or {}).items():
        p = root / "hidden" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_task_dir_round_trip(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    data = minimal(
        repo={"path": "../repo"},
        setup=["pip install -e ."],
        metadata={"kind": "mutation", "split": "train", "difficulty": 1},
        tests={"fail_to_pass": ["tests/test_x.py::test_add"], "pass_to_pass": ["tests/test_y.py"], "timeout_s": 60},
    )
    root = write_task_dir(
        tmp_path / "t1",
        data,
        patch=REFERENCE_PATCH,
        hidden={"tests/test_x.py": HIDDEN_TEST, "tests/__pycache__/test_x.cpython-311.pyc": "junk"},
    )

    task = load_task_dir(root)
    assert task.id == "t1"
    assert task.request == "add() subtracts; make it add"
    assert task.repo.path == "../repo" and task.repo.commit is None
    assert task.base_dir == root
    assert Path(task.source().path).resolve() == repo.resolve()
    assert task.source().commit is None
    assert task.tests.fail_to_pass == ["tests/test_x.py::test_add"]
    assert task.tests.pass_to_pass == ["tests/test_y.py"]
    assert task.tests.timeout_s == 60
    assert task.tests.command == fmt.DEFAULT_TEST_COMMAND
    assert task.tests.files == {"tests/test_x.py": HIDDEN_TEST}  # __pycache__ left out
    assert task.reference_patch == REFERENCE_PATCH
    assert task.setup == ["pip install -e ."]
    assert task.split == "train" and task.metadata["kind"] == "mutation"

    absolute = Task.model_validate(minimal(id="t2", repo={"path": str(repo), "commit": "abc123"}))
    out = tmp_path / "out" / "tasks.jsonl"
    out.parent.mkdir()
    save_jsonl([task, absolute], out)
    assert len(out.read_text().splitlines()) == 2
    loaded = load_jsonl(out)
    assert [t.model_dump() for t in loaded] == [task.model_dump(), absolute.model_dump()]
    assert loaded[0].tests.files == {"tests/test_x.py": HIDDEN_TEST}
    assert loaded[0].base_dir == out.parent  # relative paths now resolve from the JSONL file
    assert loaded[1].source() == absolute.source() == SnapshotSource(path=str(repo), commit="abc123")
    assert "base_dir" not in out.read_text()


def test_task_json_wins_over_files(tmp_path):
    """task.json's own reference_patch and test files are kept; the side files only fill gaps."""
    data = minimal(reference_patch="@@ inline", tests={"fail_to_pass": ["a"], "files": {"tests/test_x.py": "inline"}})
    root = write_task_dir(
        tmp_path / "t", data, patch="@@ file", hidden={"tests/test_x.py": "x", "tests/test_y.py": "y"}
    )
    task = load_task_dir(root)
    assert task.reference_patch == "@@ inline"
    assert task.tests.files == {"tests/test_x.py": "inline", "tests/test_y.py": "y"}


def test_bundled_repo_source(bundled):
    task = Task.model_validate(minimal(repo={"bundled": "demo"}))
    assert task.source() == SnapshotSource(path=str(bundled / "demo"))
    assert fmt.bundled_repos() == ["demo"]


def _lines(*records) -> str:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n"


def _without(data: dict, key: str) -> dict:
    return {k: v for k, v in data.items() if k != key}


# (form, content, substrings the message must hold besides the file name)
MALFORMED = {
    "dir-invalid-json": ("dir", '{"id": "t1",', ["invalid JSON", "line 1"]),
    "dir-not-object": ("dir", "[1, 2]", ["JSON object", "list"]),
    "jsonl-invalid-json": ("jsonl", _lines(minimal(), '{"id": "t2", "request": '), [":2:", "invalid JSON"]),
    "jsonl-non-object-line": ("jsonl", _lines(minimal(), minimal(id="t2"), '"just a string"'), [":3:", "JSON object"]),
    "missing-request": ("dir", _without(minimal(), "request"), ["request", "Field required"]),
    "empty-request": ("dir", minimal(request=""), ["request", "at least 1 character"]),
    "missing-tests": ("jsonl", _lines(minimal(), _without(minimal(id="t2"), "tests")), [":2:", "tests"]),
    "empty-fail-to-pass": ("dir", minimal(tests={"fail_to_pass": []}), ["tests.fail_to_pass", "at least 1 item"]),
    "bundled-and-path": ("dir", minimal(repo={"bundled": "demo", "path": "x"}), ["repo", "exactly one"]),
    "neither-bundled-nor-path": ("jsonl", _lines(minimal(repo={"commit": "abc"})), [":1:", "repo", "exactly one"]),
    "unknown-bundled": ("dir", minimal(repo={"bundled": "nope"}), ["repo", "no bundled repository 'nope'", "demo"]),
    # Only a bundled repository's plain name: "", "." and ".." name the repos directory or its parent, and a
    # name with a separator reaches any directory (here one that exists: the bundled root's own demo).
    "bundled-empty": ("jsonl", _lines(minimal(repo={"bundled": ""})), [":1:", "no bundled repository ''"]),
    "bundled-dot": ("dir", minimal(repo={"bundled": "."}), ["repo", "no bundled repository '.'"]),
    "bundled-dotdot": ("dir", minimal(repo={"bundled": ".."}), ["repo", "no bundled repository '..'"]),
    "bundled-path": ("dir", minimal(repo={"bundled": "../bundled/demo"}), ["no bundled repository '../bundled/demo'"]),
    "bundled-nested": ("jsonl", _lines(minimal(repo={"bundled": "demo/."})), [":1:", "no bundled repository"]),
    "typo-top-level": ("dir", {**_without(minimal(), "request"), "reqest": "x"}, ["reqest", "Extra inputs"]),
    "typo-nested": ("jsonl", _lines(minimal(tests={"fail_to_pass": ["a"], "fail_to_pas": []})), ["fail_to_pas"]),
    "bad-id-characters": ("dir", minimal(id="fix/add bug"), ["id", "pattern"]),
    "id-leading-dot": ("jsonl", _lines(minimal(id=".hidden")), [":1:", "id"]),
    "id-not-string": ("dir", minimal(id=7), ["id", "string"]),
    "negative-timeout": ("dir", minimal(tests={"fail_to_pass": ["a"], "timeout_s": -1}), ["tests.timeout_s"]),
    "files-not-strings": ("jsonl", _lines(minimal(tests={"fail_to_pass": ["a"], "files": {"t.py": 1}})), ["files"]),
    "duplicate-ids": (
        "jsonl",
        _lines(minimal(), minimal(id="t2"), minimal()),
        [":3: duplicate task id 't1' (first at", ":1)"],
    ),
    "env-bad-name": ("dir", minimal(env={"A=B": "1"}), ["env", "'A=B'"]),
    "env-leading-digit": ("jsonl", _lines(minimal(env={"1X": "1"})), [":1:", "env", "'1X'"]),
    "env-nul-in-value": ("dir", minimal(env={"X": "a\u0000b"}), ["env", "NUL"]),
    "env-not-string": ("jsonl", _lines(minimal(env={"X": 1})), [":1:", "env.X"]),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_task_files(case, tmp_path, bundled):
    form, content, expected = MALFORMED[case]
    text = content if isinstance(content, str) else json.dumps(content)
    if form == "dir":
        root = tmp_path / "task"
        root.mkdir()
        (root / "task.json").write_text(text)
        where, load = str(root / "task.json"), lambda: load_task_dir(root)
    else:
        path = tmp_path / "tasks.jsonl"
        path.write_text(text)
        where, load = str(path), lambda: load_jsonl(path)
    with pytest.raises(TaskFormatError) as info:
        load()
    message = str(info.value)
    assert where in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_load_tasks(tmp_path):
    tasks_dir = tmp_path / "tasks"
    write_task_dir(tasks_dir / "b-task", minimal(id="b"), hidden={"tests/test_b.py": "x = 1\n"})
    write_task_dir(tasks_dir / "a-task", minimal(id="a"))
    (tasks_dir / "more.jsonl").write_text(_lines(minimal(id="c"), minimal(id="d")))
    (tasks_dir / "notes.txt").write_text("not a task")
    (tasks_dir / "empty-dir").mkdir()

    tasks = load_tasks(tasks_dir)
    assert [t.id for t in tasks] == ["a", "b", "c", "d"]  # sorted by entry name
    assert tasks[1].tests.files == {"tests/test_b.py": "x = 1\n"}
    assert tasks[0].base_dir == tasks_dir / "a-task" and tasks[2].base_dir == tasks_dir
    assert [t.id for t in load_tasks(tasks_dir / "more.jsonl")] == ["c", "d"]
    assert [t.id for t in load_tasks(tasks_dir / "b-task")] == ["b"]

    with pytest.raises(TaskFormatError, match="no such task file or directory"):
        load_tasks(tmp_path / "missing")
    with pytest.raises(TaskFormatError, match="no tasks found"):
        load_tasks(tasks_dir / "empty-dir")
    (tasks_dir / "dup.jsonl").write_text(_lines(minimal(id="a")))
    with pytest.raises(TaskFormatError, match=r"dup.jsonl:1: duplicate task id 'a' \(first at .*a-task\)"):
        load_tasks(tasks_dir)  # both places named: the directory alone left the user to search it
    with pytest.raises(TaskFormatError, match="not a task directory"):
        load_task_dir(tasks_dir / "empty-dir")
    (tmp_path / "blank.jsonl").write_text("\n \n")
    with pytest.raises(TaskFormatError, match=r"blank\.jsonl: no tasks \(the file is empty or blank\)"):
        load_tasks(tmp_path / "blank.jsonl")


# --------------------------------------------------------------------------- SWE-bench

OPS_BUGGY = '''def clamp(x, lo, hi):
    """x limited to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return lo
    return x
'''
OPS_FIXED = OPS_BUGGY.replace("        return lo\n    return x", "        return hi\n    return x")
TEST_OPS_BASE = "from calc.ops import clamp\n\n\ndef test_clamp_low():\n    assert clamp(-5, 0, 10) == 0\n"
TEST_OPS_NEW = TEST_OPS_BASE + "\n\ndef test_clamp_high():\n    assert clamp(50, 0, 10) == 10\n"
TEST_BOUNDS = (
    "import pytest\n\nfrom calc.ops import clamp\n\n\n@pytest.mark.parametrize('x', [11, 100])\n"
    "def test_above(x):\n    assert clamp(x, 0, 10) == 10\n"
)
FAIL_TO_PASS = ["tests/test_ops.py::test_clamp_high", "tests/test_bounds.py::test_above[11]"]
PASS_TO_PASS = ["tests/test_ops.py::test_clamp_low"]


def git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


@dataclass
class SweRepo:
    clone: Path
    base: str
    fix: str
    tests: str
    head: str
    record: dict


@pytest.fixture(scope="module")
def swe(tmp_path_factory) -> SweRepo:
    clones = tmp_path_factory.mktemp("clones")
    clone = clones / "acme__calc"
    clone.mkdir()
    git(clone, "init", "-q")
    base = commit(
        clone,
        {"calc/__init__.py": "", "calc/ops.py": OPS_BUGGY, "tests/test_ops.py": TEST_OPS_BASE, "README.md": "calc\n"},
        "base",
    )
    fix = commit(clone, {"calc/ops.py": OPS_FIXED}, "fix clamp above hi")
    tests = commit(clone, {"tests/test_ops.py": TEST_OPS_NEW, "tests/test_bounds.py": TEST_BOUNDS}, "tests")
    # The clone is left on a later commit with other test contents: the task must come from the base.
    head = commit(clone, {"tests/test_ops.py": TEST_OPS_NEW + "\n# later\n", "README.md": "calc v2\n"}, "later")
    record = {
        "repo": "acme/calc",
        "instance_id": "acme__calc-1",
        "base_commit": base,
        "patch": git(clone, "diff", base, fix),
        "test_patch": git(clone, "diff", fix, tests),
        "problem_statement": "clamp(50, 0, 10) returns 0; it should return 10.",
        "hints_text": "",
        "created_at": "2024-01-01T00:00:00Z",
        "version": "0.1",
        "environment_setup_commit": base,
        "FAIL_TO_PASS": json.dumps(FAIL_TO_PASS),
        "PASS_TO_PASS": json.dumps(PASS_TO_PASS),
    }
    return SweRepo(clone, base, fix, tests, head, record)


def repo_state(clone: Path) -> tuple:
    """Everything of the clone a loader could disturb: HEAD, status, refs, index, objects, worktrees."""
    git_dir = clone / ".git"
    objects = sorted(str(p.relative_to(git_dir)) for p in (git_dir / "objects").rglob("*") if p.is_file())
    return (
        git(clone, "rev-parse", "HEAD"),
        git(clone, "status", "--porcelain", "--ignored"),
        git(clone, "show-ref"),
        (git_dir / "index").read_bytes(),
        objects,
        (git_dir / "worktrees").exists(),
    )


def test_from_swebench(swe):
    before = repo_state(swe.clone)
    task = from_swebench(swe.record, swe.clone)
    assert repo_state(swe.clone) == before  # nothing written: working tree, index, refs or objects

    assert task.id == "acme__calc-1"
    assert task.repo.path == str(swe.clone.resolve()) and task.repo.commit == swe.base
    assert task.source() == SnapshotSource(path=str(swe.clone.resolve()), commit=swe.base)
    assert task.request == swe.record["problem_statement"]
    assert task.reference_patch == swe.record["patch"] and "+        return hi" in task.reference_patch
    assert task.tests.fail_to_pass == FAIL_TO_PASS
    assert task.tests.pass_to_pass == PASS_TO_PASS
    assert task.tests.command == fmt.DEFAULT_TEST_COMMAND
    assert task.tests.files == {"tests/test_ops.py": TEST_OPS_NEW, "tests/test_bounds.py": TEST_BOUNDS}
    assert task.metadata == {
        "kind": "swebench",
        "repo": "acme/calc",
        "instance_id": "acme__calc-1",
        "version": "0.1",
        "environment_setup_commit": swe.base,
        "created_at": "2024-01-01T00:00:00Z",
    }
    # A task survives JSONL like any other.
    assert Task.model_validate_json(task.model_dump_json()).model_dump() == task.model_dump()


def test_from_swebench_variants(swe):
    record = {**swe.record, "FAIL_TO_PASS": FAIL_TO_PASS, "instance_id": "acme/calc#1 (retry)"}
    del record["PASS_TO_PASS"]
    task = from_swebench(record, str(swe.clone), test_command="python -m pytest -x")
    assert task.id == "acme-calc-1-retry-" and task.metadata["instance_id"] == "acme/calc#1 (retry)"
    assert task.tests.fail_to_pass == FAIL_TO_PASS and task.tests.pass_to_pass == []
    assert task.tests.command == "python -m pytest -x"
    assert sanitize_id("django__django-11099") == "django__django-11099"
    assert sanitize_id("..a b") == "a-b"


def test_from_swebench_rename_and_delete(swe, tmp_path):
    """A test patch that renames one file and deletes another."""
    clone = tmp_path / "clone"
    git(swe.clone, "clone", "-q", str(swe.clone), str(clone))
    git(clone, "checkout", "-q", "--detach", swe.tests)
    git(clone, "mv", "tests/test_bounds.py", "tests/test_limits.py")
    git(clone, "rm", "-q", "tests/test_ops.py")
    git(clone, "commit", "-q", "-m", "move")
    record = {**swe.record, "base_commit": swe.tests, "test_patch": git(clone, "diff", "-M", swe.tests, "HEAD")}
    assert "rename from tests/test_bounds.py" in record["test_patch"]
    task = from_swebench(record, clone)
    assert task.tests.files == {"tests/test_limits.py": TEST_BOUNDS}
    assert task.metadata["test_patch_deleted"] == ["tests/test_bounds.py", "tests/test_ops.py"]


NEW_FILE_PATCH = (
    "diff --git a/tests/test_new.py b/tests/test_new.py\nnew file mode 100644\n--- /dev/null\n"
    "+++ b/tests/test_new.py\n@@ -0,0 +1,2 @@\n+# never committed anywhere\n+X = 'caf\u00e9'\n"
)


def test_from_swebench_writes_no_objects(swe):
    """Content that exists in no commit is hashed into a throwaway store, not the clone's."""
    before = repo_state(swe.clone)
    task = from_swebench({**swe.record, "test_patch": NEW_FILE_PATCH}, swe.clone)
    assert task.tests.files == {"tests/test_new.py": "# never committed anywhere\nX = 'caf\u00e9'\n"}
    assert repo_state(swe.clone) == before


def test_from_swebench_binary_test_file(swe, tmp_path):
    clone = tmp_path / "clone"
    git(swe.clone, "clone", "-q", str(swe.clone), str(clone))
    git(clone, "checkout", "-q", "--detach", swe.base)
    (clone / "tests" / "data.bin").write_bytes(b"\xff\xfe\x00binary")
    (clone / "tests" / "test_data.py").write_text("def test_data():\n    pass\n")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "data")
    record = {**swe.record, "test_patch": git(clone, "diff", "--binary", swe.base, "HEAD")}
    task = from_swebench(record, clone)
    assert task.tests.files == {"tests/test_data.py": "def test_data():\n    pass\n"}
    assert task.metadata["test_patch_binary"] == ["tests/data.bin"]


SWE_ERRORS = {
    "missing-field": (lambda r, s: _without(r, "problem_statement"), ["acme__calc-1", "problem_statement"]),
    "missing-instance-id": (lambda r, s: _without(r, "instance_id"), ["SWE-bench record", "instance_id"]),
    "patch-not-string": (lambda r, s: {**r, "patch": None}, ["acme__calc-1", "patch", "string"]),
    "unknown-base-commit": (lambda r, s: {**r, "base_commit": "0" * 40}, ["acme__calc-1", "base_commit", "0000"]),
    "base-commit-not-a-rev": (lambda r, s: {**r, "base_commit": "--all"}, ["acme__calc-1", "base_commit"]),
    "test-patch-does-not-apply": (
        lambda r, s: {**r, "test_patch": git(s.clone, "diff", s.fix, s.base)},
        ["acme__calc-1", "test_patch", "does not apply"],
    ),
    "test-patch-garbage": (lambda r, s: {**r, "test_patch": "hello\n"}, ["acme__calc-1", "test_patch"]),
    "f2p-not-a-list": (lambda r, s: {**r, "FAIL_TO_PASS": '{"a": 1}'}, ["acme__calc-1", "FAIL_TO_PASS", "list"]),
    "f2p-not-json": (lambda r, s: {**r, "FAIL_TO_PASS": "tests/test_ops.py"}, ["acme__calc-1", "FAIL_TO_PASS"]),
    "f2p-empty": (lambda r, s: {**r, "FAIL_TO_PASS": "[]"}, ["acme__calc-1", "FAIL_TO_PASS", "at least one"]),
    "p2p-not-strings": (lambda r, s: {**r, "PASS_TO_PASS": [1]}, ["acme__calc-1", "PASS_TO_PASS"]),
    "id-unusable": (lambda r, s: {**r, "instance_id": "///"}, ["'///'", "instance_id"]),
}


@pytest.mark.parametrize("case", list(SWE_ERRORS))
def test_from_swebench_errors(case, swe):
    make, expected = SWE_ERRORS[case]
    before = repo_state(swe.clone)
    with pytest.raises(TaskFormatError) as info:
        from_swebench(make(swe.record, swe), swe.clone)
    for part in expected:
        assert part in str(info.value), f"{part!r} not in {info.value}"
    assert repo_state(swe.clone) == before


def test_from_swebench_bad_repo_dir(swe, tmp_path):
    with pytest.raises(TaskFormatError, match="acme__calc-1.*not a git repository"):
        from_swebench(swe.record, tmp_path)
    with pytest.raises(TaskFormatError, match="acme__calc-1.*not a directory"):
        from_swebench(swe.record, tmp_path / "missing")
    with pytest.raises(TaskFormatError, match="acme__calc-1.*inside the git repository"):
        from_swebench(swe.record, swe.clone / "calc")


def test_load_swebench_jsonl(swe, tmp_path):
    second = {**swe.record, "instance_id": "acme__calc-2", "FAIL_TO_PASS": FAIL_TO_PASS[:1]}
    path = tmp_path / "swe.jsonl"
    path.write_text(_lines(swe.record, "", second))
    for repo_dirs in ({"acme/calc": swe.clone}, swe.clone.parent):
        tasks = load_swebench_jsonl(path, repo_dirs)
        assert [t.id for t in tasks] == ["acme__calc-1", "acme__calc-2"]
        assert tasks[1].tests.fail_to_pass == FAIL_TO_PASS[:1]
    by_name = tmp_path / "by-name"
    by_name.mkdir()
    (by_name / "calc").symlink_to(swe.clone)
    assert [t.id for t in load_swebench_jsonl(path, by_name)] == ["acme__calc-1", "acme__calc-2"]

    bad = {**swe.record, "instance_id": "acme__calc-3", "base_commit": "f" * 40}
    other_repo = {**second, "repo": "acme/other"}
    cases = [
        (_lines(swe.record, "{oops"), {"acme/calc": swe.clone}, [":2:", "invalid JSON"]),
        (_lines("[1]"), {"acme/calc": swe.clone}, [":1:", "JSON object"]),
        (_lines(swe.record, second, swe.record), {"acme/calc": swe.clone}, [":3:", "duplicate", "line 1"]),
        (_lines(swe.record, bad), {"acme/calc": swe.clone}, [":2:", "acme__calc-3", "base_commit"]),
        (_lines(other_repo), {"acme/calc": swe.clone}, [":1:", "acme/other", "acme/calc"]),
        (_lines(other_repo), swe.clone.parent, [":1:", "acme__other"]),
        (_lines(_without(swe.record, "repo")), swe.clone.parent, [":1:", "repo"]),
    ]
    for text, repo_dirs, expected in cases:
        path.write_text(text)
        with pytest.raises(TaskFormatError) as info:
            load_swebench_jsonl(path, repo_dirs)
        assert str(path) in str(info.value)
        for part in expected:
            assert part in str(info.value), f"{part!r} not in {info.value}"
    with pytest.raises(TaskFormatError, match="cannot read"):
        load_swebench_jsonl(tmp_path / "missing.jsonl", swe.clone.parent)


SEPARATORS = "a\u2028b\u2029c\x85d"  # line separators str.splitlines() breaks at; JSON leaves them unescaped


def test_jsonl_strings_may_hold_unicode_line_separators(tmp_path, bundled, swe):
    """json.dumps(ensure_ascii=False) (`vivace tasks swebench` among the writers) leaves U+2028, U+2029 and
    U+0085 raw inside strings: a record is one line up to "\\n", as results.jsonl is read."""
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(minimal(request=SEPARATORS), ensure_ascii=False) + "\n", encoding="utf-8")
    assert [t.request for t in load_jsonl(path)] == [SEPARATORS]
    swe_path = tmp_path / "swe.jsonl"
    record = {**swe.record, "problem_statement": SEPARATORS}
    swe_path.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    assert SEPARATORS in load_swebench_jsonl(swe_path, {"acme/calc": swe.clone})[0].request


def test_a_byte_order_mark_before_the_json_is_dropped(tmp_path, swe):
    """A JSONL or task.json saved by a Windows editor or PowerShell starts with U+FEFF: every reader
    refused it ("invalid JSON: Unexpected UTF-8 BOM") on its first line. A BOM inside a hidden file is kept."""
    from vivace.bench.results import result_rows
    from vivace.rl.sft_train import jsonl_objects

    def bom_file(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text("\ufeff" + text, encoding="utf-8")
        return path

    (tmp_path / "repo").mkdir()
    tasks = bom_file("tasks.jsonl", json.dumps(minimal()) + "\n" + json.dumps(minimal(id="t2")) + "\n")
    assert [t.id for t in load_jsonl(tasks)] == ["t1", "t2"]
    root = write_task_dir(tmp_path / "dir" / "t1", minimal(repo={"path": str(tmp_path / "repo")}),
                          hidden={"tests/test_x.py": "\ufeffdef test_add(): pass\n"})  # fmt: skip
    (root / "task.json").write_text("\ufeff" + (root / "task.json").read_text(), encoding="utf-8")
    assert load_task_dir(root).tests.files == {"tests/test_x.py": "\ufeffdef test_add(): pass\n"}
    swe_path = bom_file("swe.jsonl", json.dumps(swe.record) + "\n")
    assert [t.id for t in load_swebench_jsonl(swe_path, {"acme/calc": swe.clone})] == ["acme__calc-1"]
    rows = bom_file("results.jsonl", '{"task_id": "t1", "resolved": true}\n')
    assert list(result_rows(rows)) == [(1, {"task_id": "t1", "resolved": True})]
    episodes = bom_file("episodes.jsonl", '{"messages": []}\n{"messages": [1]}\n')
    assert [row for _, row in jsonl_objects(episodes)] == [{"messages": []}, {"messages": [1]}]


async def test_swebench_task_in_sandbox(swe, state_dir):
    """The task's hidden tests fail at the base commit and pass with the reference fix."""
    task = from_swebench(swe.record, swe.clone)
    backend = make_backend("plain", state_dir)
    try:
        ws = await backend.create(backend.snapshot(task.source()))
        assert await ws.read_text("calc/ops.py") == OPS_BUGGY  # the base commit, not the clone's checkout
        assert await ws.read_text("README.md") == "calc\n"
        for rel, text in task.tests.files.items():
            await ws.write_text(rel, text)

        def run(ids: list[str]) -> str:
            return " ".join([task.tests.command, *map(shlex.quote, ids)])

        everything = await ws.exec("python -m pytest -q -p no:cacheprovider", timeout=120)
        assert everything.exit_code == 1, everything.stdout + everything.stderr
        assert "3 failed, 1 passed" in everything.stdout
        before = await ws.exec(run(task.tests.fail_to_pass), timeout=120)
        assert before.exit_code == 1 and "2 failed" in before.stdout, before.stdout + before.stderr
        kept = await ws.exec(run(task.tests.pass_to_pass), timeout=120)
        assert kept.exit_code == 0, kept.stdout + kept.stderr

        await ws.write_text("calc/ops.py", git(swe.clone, "show", f"{swe.fix}:calc/ops.py"))
        after = await ws.exec("python -m pytest -q -p no:cacheprovider", timeout=120)
        assert after.exit_code == 0 and "4 passed" in after.stdout, after.stdout + after.stderr
        fixed = await ws.exec(run(task.tests.fail_to_pass + task.tests.pass_to_pass), timeout=120)
        assert fixed.exit_code == 0 and "3 passed" in fixed.stdout, fixed.stdout + fixed.stderr
    finally:
        await backend.aclose()


def test_hidden_file_paths_must_stay_in_the_workspace(tmp_path):
    from vivace.tasks.format import TaskFormatError, load_jsonl

    for bad in ("/etc/passwd", "../x.py", "tests/../../x.py"):
        f = tmp_path / "t.jsonl"
        record = {
            "id": "t",
            "repo": {"path": "."},
            "request": "r",
            "tests": {"fail_to_pass": ["a"], "files": {bad: ""}},
        }
        f.write_text(json.dumps(record) + "\n")
        with pytest.raises(TaskFormatError, match=r"t\.jsonl:1: tests\.files"):
            load_jsonl(f)


async def test_oracle_solves_the_swebench_task(swe, state_dir):
    """Acceptance: a task loaded from a real fix commit is solved by the oracle, judged by the scorer."""
    from vivace.bench.baselines import OraclePolicy
    from vivace.bench.score import score
    from vivace.harness.agent import run_episode

    task = from_swebench(swe.record, swe.clone)
    backend = make_backend("plain", state_dir)
    try:
        ws = await backend.create(backend.snapshot(task.source(cache_dir=state_dir)))
        traj = await run_episode(OraclePolicy().for_task(task), ws, task.request, task_id=task.id)
        result = await score(task, traj, ws)
    finally:
        await backend.aclose()
    assert result.resolved and result.adherence == 1.0, result.details
    assert result.details["fail_to_pass"] == [len(task.tests.fail_to_pass)] * 2


async def test_task_env_reaches_setup_agent_and_hidden_tests(tmp_path, state_dir):
    """A task's `env` is in every command of its workspace; a command's own variables win."""
    from vivace.bench.runner import run_task
    from vivace.config import load_preset
    from vivace.harness.policies import ReplayPolicy
    from vivace.sandbox import open_backend

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    hidden = "import os\n\n\ndef test_env():\n    assert os.environ['TASK_FLAG'] == 'on'\n"
    task = Task.model_validate(minimal(
        repo={"path": str(repo)}, setup=['test "$TASK_FLAG" = on'], env={"TASK_FLAG": "on", "PYTHONHASHSEED": "7"},
        tests={"fail_to_pass": ["tests/test_env.py::test_env"], "files": {"tests/test_env.py": hidden}},
    ))  # fmt: skip
    policy = ReplayPolicy([{"tool_calls": [{"name": "run_terminal_cmd",
                                            "arguments": {"command": "echo flag=$TASK_FLAG seed=$PYTHONHASHSEED"}}]}])  # fmt: skip
    cfg = load_preset("default", sandbox={"backend": "plain", "state_dir": str(state_dir)},
                      agent={"reproducible_output": True})  # fmt: skip
    backend = open_backend(cfg.sandbox)
    try:
        traj, result = await run_task(policy, task, cfg, backend)
        plain = task.model_copy(update={"env": {}, "setup": []})
        _, without = await run_task(policy, plain, cfg, backend)
    finally:
        await backend.aclose()
    # reproducible_output sets PYTHONHASHSEED=0 for the agent's commands: the command's own value wins.
    assert "flag=on seed=0" in traj.turns[0].tool_calls[0].result
    assert result.details["fail_to_pass"] == [1, 1] and result.resolved  # the hidden test saw the variable
    assert without.details["fail_to_pass"] == [0, 1] and not without.resolved


def test_shipped_tasks_run_pytest_without_plugin_autoload():
    """vivace's own environment has pytest plugins (anyio's) that its tasks do not need and that
    made every test run about twice as slow (docs/benchmarks.md); the shipped suites turn them off."""
    from vivace.tasks.suites import load_suite
    from vivace.tasks.testrun import NO_PLUGIN_AUTOLOAD

    for suite in ("bundled", "families"):
        tasks = load_suite(suite)
        assert tasks and all(t.env == NO_PLUGIN_AUTOLOAD for t in tasks), suite


# --------------------------------------------------------------------------- `vivace tasks swebench`


def _cli(*args: str):
    from typer.testing import CliRunner

    from vivace.cli import app

    return CliRunner().invoke(app, ["tasks", "swebench", *args])


def test_cli_swebench_writes_tasks(swe, tmp_path):
    records = tmp_path / "swe.jsonl"
    records.write_text(_lines(swe.record, {**swe.record, "instance_id": "acme__calc-2"}))
    out = tmp_path / "out" / "tasks.jsonl"
    for repos in ([str(swe.clone.parent)], [f"acme/calc={swe.clone}"]):
        result = _cli(str(records), "--out", str(out), "--json", "--env", "MODE=strict", "--env", "EMPTY=",
                      "--setup", "pip --version", "--test-command", "python -m pytest -q", *sum((["--repos", r] for r in repos), []))  # fmt: skip
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"tasks": 2, "repos": {"acme/calc": 2}, "out": str(out)}
        tasks = load_tasks(out)
        assert [t.id for t in tasks] == ["acme__calc-1", "acme__calc-2"]
        assert all(t.env == {"MODE": "strict", "EMPTY": ""} and t.setup == ["pip --version"] for t in tasks)
        assert all(t.split == "test" and t.tests.command == "python -m pytest -q" for t in tasks)
        assert tasks[0].tests.files == from_swebench(swe.record, swe.clone).tests.files


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "1BAD=x"], "invalid environment variable '1BAD'"),
        (["--env", "NOEQUALS"], "--env: expected KEY=VALUE"),
        (["--env", "A=1", "--env", "A=2"], "'A' given twice"),
        (["--split", "dev"], "unknown split 'dev'"),
        (["--repos", "acme/calc=/nowhere"], "not a directory"),
        (["--repos", "acme/other=/x"], "no clone given for 'acme/calc'"),
        (["--repos", "/a", "--repos", "/b"], "one directory of clones"),
        (["--repos", "/nowhere/clones"], "--repos /nowhere/clones does not exist; give the directory holding the"),
    ],
)
def test_cli_swebench_errors(swe, tmp_path, args, message):
    records = tmp_path / "swe.jsonl"
    records.write_text(_lines(swe.record))
    out = tmp_path / "tasks.jsonl"
    if "--repos" not in args:
        args = [*args, "--repos", str(swe.clone.parent)]
    result = _cli(str(records), "--out", str(out), *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not out.exists()  # nothing half-written


def test_cli_swebench_empty_and_malformed(swe, tmp_path):
    out = tmp_path / "tasks.jsonl"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = _cli(str(empty), "--repos", str(swe.clone.parent), "--out", str(out))
    assert result.exit_code == 2 and "holds no records" in result.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_lines(swe.record, "{oops"))
    result = _cli(str(bad), "--repos", str(swe.clone.parent), "--out", str(out))
    assert result.exit_code == 2 and "bad.jsonl:2" in result.output and "invalid JSON" in result.output
    assert not out.exists()


def test_cli_swebench_env_and_setup_reach_the_tests(tmp_path, state_dir):
    """End to end: records → `vivace tasks swebench` → `vivace bench` with the oracle. The
    hidden test needs the variable and the setup's file, so the oracle's fix passes only when
    both options reach the workspace."""
    from typer.testing import CliRunner

    from conftest import ISOLATION_PROBLEM
    from vivace.cli import app

    clone = tmp_path / "clones" / "acme__modes"
    clone.mkdir(parents=True)
    git(clone, "init", "-q")
    base = commit(clone, {"modes/__init__.py": "", "modes/core.py": "def mode():\n    return 'lax'\n"}, "base")
    fix = commit(clone, {"modes/core.py": "import os\n\n\ndef mode():\n    return os.environ['MODE']\n"}, "fix")
    test = ("import os\n\nfrom modes.core import mode\n\n\ndef test_mode():\n"
            "    assert os.path.exists('.prepared') and mode() == 'strict'\n")  # fmt: skip
    tests = commit(clone, {"tests/test_modes.py": test}, "tests")
    record = {
        "repo": "acme/modes", "instance_id": "acme__modes-1", "base_commit": base,
        "patch": git(clone, "diff", base, fix), "test_patch": git(clone, "diff", fix, tests),
        "problem_statement": "mode() ignores $MODE.", "FAIL_TO_PASS": ["tests/test_modes.py::test_mode"],
    }  # fmt: skip
    records = tmp_path / "swe.jsonl"
    records.write_text(_lines(record))
    backend = "plain" if ISOLATION_PROBLEM else "isolated"
    success = {}
    for name, extra in {"bare": [], "with": ["--env", "MODE=strict", "--setup", "touch .prepared"]}.items():
        tasks = tmp_path / f"{name}.jsonl"
        result = _cli(str(records), "--repos", str(clone.parent), "--out", str(tasks), *extra)
        assert result.exit_code == 0, result.output
        args = ["bench", "--model", "scripted:oracle", "--tasks", str(tasks), "--out", str(tmp_path / f"run-{name}")]
        result = CliRunner().invoke(app, [*args, "--json", "--backend", backend, "--state-dir", str(state_dir)])
        assert result.exit_code == 0, result.output
        success[name] = json.loads(result.stdout)["summary"]["scripted:oracle"]["success"]
    assert success == {"bare": 0.0, "with": 1.0}


def test_cli_swebench_check_leaves_out_unsound_tasks(swe, tmp_path, state_dir):
    """--check runs the reference fix and no change on each task: a task whose fix does not pass
    here, and one whose FAIL_TO_PASS tests already pass, are left out and named; the sound one stays."""
    from conftest import ISOLATION_PROBLEM

    backend = "plain" if ISOLATION_PROBLEM else "isolated"
    passes_already = {**swe.record, "instance_id": "acme__calc-passes", "FAIL_TO_PASS": PASS_TO_PASS}
    wrong_fix = {**swe.record, "instance_id": "acme__calc-wrongfix", "patch": ""}
    records = tmp_path / "swe.jsonl"
    records.write_text(_lines(swe.record, passes_already, wrong_fix))
    out = tmp_path / "tasks.jsonl"
    result = _cli(str(records), "--repos", str(swe.clone.parent), "--out", str(out), "--check", "--json",
                  "--backend", backend, "--state-dir", str(state_dir))  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tasks"] == 1 and [t.id for t in load_tasks(out)] == ["acme__calc-1"]
    left_out = report["left_out"]
    assert set(left_out) == {"acme__calc-passes", "acme__calc-wrongfix"}
    assert "pass without any change" in left_out["acme__calc-passes"]
    assert (
        "reference fix does not pass" in left_out["acme__calc-wrongfix"]
        and "FAIL_TO_PASS 0/2" in left_out["acme__calc-wrongfix"]
    )
    assert (tmp_path / "tasks-check" / "results.jsonl").is_file()
    # A setup that fails ends every episode in an error: nothing passes, nothing is written.
    result = _cli(str(records), "--repos", str(swe.clone.parent), "--out", str(tmp_path / "none.jsonl"), "--check",
                  "--setup", "exit 3", "--backend", backend, "--state-dir", str(state_dir))  # fmt: skip
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "no task passed the check" in said, said
    assert "left out acme__calc-1: the scripted:oracle episode failed" in said and "exit 3" in said
    assert not (tmp_path / "none.jsonl").exists()
    result = _cli(str(records), "--repos", str(swe.clone.parent), "--out", str(tmp_path / "none.jsonl"), "--check",
                  "--setup", "exit 3", "--backend", backend, "--state-dir", str(state_dir), "--json")  # fmt: skip
    report = json.loads(result.stdout)  # stdout said nothing: a script learnt nothing of why
    assert result.exit_code == 1 and report["tasks"] == 0 and "exit 3" in report["left_out"]["acme__calc-1"]


def test_cli_swebench_repo_config(swe, tmp_path):
    """Each repository's own test command, setup and env come from --repo-config, after the common
    options: its setup runs after theirs, its variables and command win; other repositories get
    the common options alone."""
    records = tmp_path / "swe.jsonl"
    other = {**swe.record, "instance_id": "other__calc-1", "repo": "other/calc"}
    records.write_text(_lines(swe.record, other))
    config = tmp_path / "repos.json"
    config.write_text(json.dumps({"acme/calc": {"test_command": "python -m pytest -x", "setup": ["pip --version"],
                                                "env": {"MODE": "repo", "ONLY_ACME": "1"}}}))  # fmt: skip
    out = tmp_path / "tasks.jsonl"
    common = ["--env", "MODE=common", "--env", "SHARED=1", "--setup", "true"]
    args = [str(records), "--repos", f"acme/calc={swe.clone}", "--repos", f"other/calc={swe.clone}", "--out", str(out)]
    result = _cli(*args, *common, "--repo-config", str(config))
    assert result.exit_code == 0, result.output
    acme, other_task = load_tasks(out)
    assert acme.setup == ["true", "pip --version"] and acme.tests.command == "python -m pytest -x"
    assert acme.env == {"MODE": "repo", "SHARED": "1", "ONLY_ACME": "1"}
    assert other_task.setup == ["true"] and other_task.env == {"MODE": "common", "SHARED": "1"}
    assert other_task.tests.command == fmt.DEFAULT_TEST_COMMAND

    for text, said in [("{oops", "invalid JSON"), ("[1]", "expected an object"),
                       ('{"acme/calc": {"setup": "pip"}}', "acme/calc: setup"),
                       ('{"acme/calc": {"tests": "x"}}', "acme/calc: tests: Extra inputs"),
                       ('{"acme/calc": {"env": {"1X": "y"}}}', "invalid environment variable '1X'")]:  # fmt: skip
        config.write_text(text)
        result = _cli(*args, "--repo-config", str(config), "--out", str(tmp_path / "bad.jsonl"))
        message = " ".join(result.output.split())
        assert result.exit_code == 2 and str(config) in message and said in message, message
        assert not (tmp_path / "bad.jsonl").exists()


def test_patched_trees_are_a_cache_the_least_recently_used_leave(tmp_path, monkeypatch):
    """A task with a patch has its starting tree built once under the state directory; those trees were
    kept forever (a copy of the repository per generated task). Past the cache's size the least
    recently used go at the next build, and one that went is built again, the same, when next used."""
    from vivace.sandbox import snapshot as snapshot_mod
    from vivace.tasks.generate import unified_diff

    monkeypatch.setattr(snapshot_mod, "evict", functools.partial(snapshot_mod.evict, max_bytes=0, min_idle_s=60))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("X = 0\n")
    tasks = [fmt.RepoSpec(path=str(repo), patch=unified_diff("calc.py", "X = 0\n", f"X = {n}\n")) for n in (1, 2)]
    state = tmp_path / "state"

    def tree(task: fmt.RepoSpec) -> Path:
        path = Path(task.source(cache_dir=state).path)
        past = time.time() - 120  # then idle for two minutes
        os.utime(path.parent / f"{path.name}.used", (past, past))
        return path

    first = tree(tasks[0])
    assert (first / "calc.py").read_text() == "X = 1\n"
    second = tree(tasks[1])
    assert (second / "calc.py").read_text() == "X = 2\n" and not first.exists()  # the older one went
    assert tree(tasks[0]) == first and (first / "calc.py").read_text() == "X = 1\n"
    assert not second.exists() and [p.name for p in (state / "task-trees").iterdir() if p.is_dir()] == [first.name]


def test_from_swebench_pins_a_ref_to_its_commit(swe):
    """A base_commit given as a ref (HEAD, a branch, a short SHA) was stored as given, so the task moved on with
    the clone: once the fix was committed there, scripted:null solved it."""
    task = from_swebench({**swe.record, "base_commit": swe.base[:10]}, swe.clone)
    assert task.repo.commit == swe.base and task.metadata["base_commit"] == swe.base[:10]
    assert from_swebench(swe.record, swe.clone).metadata.get("base_commit") is None  # a full SHA is the commit


def test_from_swebench_refuses_a_test_patch_over_the_files_the_fix_changes(swe):
    """The hidden test files are written whole at scoring: a test_patch that also changes a file the fix changes
    wrote the unfixed file back over the agent's fix, and even the oracle failed."""
    from vivace.tasks.format import TaskFormatError

    test_patch = swe.record["test_patch"] + swe.record["patch"].replace("return hi", "return hi  # checked")
    with pytest.raises(TaskFormatError, match=r"test_patch and patch both change calc/ops.py: .* leave this record"):
        from_swebench({**swe.record, "test_patch": test_patch}, swe.clone)


def test_cli_swebench_and_select_refuse_to_write_over_their_input(swe, tmp_path):
    from typer.testing import CliRunner

    from vivace.cli import app

    records = tmp_path / "swe.jsonl"
    records.write_text(_lines(swe.record))
    before = records.read_text()
    result = _cli(str(records), "--repos", f"acme/calc={swe.clone}", "--out", str(records))
    assert result.exit_code == 2 and "is an input of this command" in " ".join(result.output.split())
    assert records.read_text() == before
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"task_id": "t", "resolved": True, "model": "m"}) + "\n")
    kept = results.read_text()
    for args in (["--results", str(results), "--out", str(results)],
                 ["--results", str(results), "--results", str(results), "--out", str(tmp_path / "o.jsonl")]):  # fmt: skip
        result = CliRunner().invoke(app, ["tasks", "select", *args])
        said = " ".join(result.output.split())
        assert result.exit_code == 2 and ("is an input" in said or "given twice" in said), said
    assert results.read_text() == kept


def test_cli_swebench_repo_config_names_match_as_github_does_and_strays_are_named(swe, tmp_path, caplog):
    records = tmp_path / "swe.jsonl"
    records.write_text(_lines(swe.record))
    config = tmp_path / "repos.json"
    config.write_text(json.dumps({"Acme/Calc": {"test_command": "python -m pytest -x"}, "acme/calx": {}}))
    tasks = load_swebench_jsonl(records, {"acme/calc": swe.clone}, repo_runs=load_repo_runs(config))
    assert tasks[0].tests.command == "python -m pytest -x"  # GitHub's names are case-insensitive
    assert "names acme/calx, which no record" in caplog.text


def test_hidden_file_paths_must_name_files(tmp_path):
    from vivace.tasks.format import TaskFormatError, load_jsonl

    for bad in ("tests/", "tests//a.py", "./a.py"):
        f = tmp_path / "t.jsonl"
        f.write_text(json.dumps({"id": "t", "repo": {"path": "."}, "request": "r",
                                 "tests": {"fail_to_pass": ["a"], "files": {bad: ""}}}) + "\n")  # fmt: skip
        with pytest.raises(TaskFormatError, match="must name a file"):
            load_jsonl(f)
