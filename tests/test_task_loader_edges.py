"""Edges of the task loader and the report it feeds: entries that are not regular files, task
fields that can never work, and a family that is not a string.

Each case is one the loader once let through to a traceback, a hang or a task no policy could
pass. The FIFO case runs the loader in a subprocess with a timeout, so a regression fails
instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

import vivace
from test_task_format import REFERENCE_PATCH as PATCH  # the format tests' minimal task, shared
from test_task_format import minimal as task
from vivace.bench.report import markdown, summarize
from vivace.tasks.format import Task, TaskFormatError, TestSpec, load_jsonl, load_tasks
from vivace.tasks.generate import unified_diff


def spec(**over) -> dict:
    return {"fail_to_pass": ["tests/test_x.py::test_add"], **over}


# --------------------------------------------------------------------------- entries that are not regular files


def test_a_directory_named_like_a_jsonl_file_is_refused_by_name(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(task()) + "\n")
    (tmp_path / "sub.jsonl").mkdir()
    with pytest.raises(TaskFormatError, match=r"sub\.jsonl: not a regular file \(a directory\)"):
        load_tasks(tmp_path)


_LOAD = """
import sys
from vivace.tasks.format import TaskFormatError, load_tasks
try:
    load_tasks(sys.argv[1])
except TaskFormatError as e:
    print("refused:", e)
else:
    print("loaded")
"""


def _load_in_subprocess(path: Path) -> str:
    """load_tasks(path) in a fresh interpreter on this vivace; a hang fails with TimeoutExpired."""
    src = str(Path(vivace.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, timeout=20, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(task()) + "\n")
    os.mkfifo(tmp_path / "f.jsonl")
    out = _load_in_subprocess(tmp_path)
    assert "refused:" in out and "f.jsonl: not a regular file (a FIFO)" in out
    out = _load_in_subprocess(tmp_path / "f.jsonl")  # named directly, too
    assert "refused:" in out and "f.jsonl: not a regular file (a FIFO)" in out

    (tmp_path / "f.jsonl").unlink()
    os.mkfifo(tmp_path / "notes")  # not a task file by its name: never opened
    assert _load_in_subprocess(tmp_path).strip() == "loaded"


# --------------------------------------------------------------------------- fields that can never work

# (task data, the field the message must name)
NEVER_WORK = {
    "empty-command": (task(tests=spec(command="")), "tests.command"),
    "blank-command": (task(tests=spec(command=" \t")), "tests.command"),
    "empty-fail-to-pass-id": (task(tests=spec(fail_to_pass=["a", ""])), "tests.fail_to_pass.1"),
    "blank-pass-to-pass-id": (task(tests=spec(pass_to_pass=["  "])), "tests.pass_to_pass.0"),
    "reference-not-a-diff": (task(reference_patch="not a diff"), "reference_patch"),
    "reference-blank": (task(reference_patch="\n"), "reference_patch"),
    "timeout-infinite": (task(tests=spec(timeout_s=float("inf"))), "tests.timeout_s"),
    "timeout-nan": (task(tests=spec(timeout_s=float("nan"))), "tests.timeout_s"),
    "timeout-a-string": (task(tests=spec(timeout_s="60")), "tests.timeout_s"),  # was read as 60
    "timeout-a-boolean": (task(tests=spec(timeout_s=True)), "tests.timeout_s"),  # was read as 1 second
    "repo-patch-not-a-diff": (task(repo={"path": "repo", "patch": "garbage\n"}), "repo.patch"),
    "split-a-list": (task(metadata={"split": ["test"]}), "metadata"),  # matched no --split: dropped silently
    "split-misspelt": (task(metadata={"split": "tset"}), "metadata"),
    # The expert would read a string's characters as files, and fail a task it can solve.
    "context-files-a-string": (task(metadata={"context_files": "pkg/util.py"}), "metadata"),
    "context-files-blank-path": (task(metadata={"context_files": ["pkg/util.py", " "]}), "metadata"),
}


@pytest.mark.parametrize("case", list(NEVER_WORK))
def test_fields_that_can_never_work_are_refused_by_file_line_and_field(case, tmp_path):
    data, field = NEVER_WORK[case]
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task(id="ok")) + "\n" + json.dumps(data) + "\n")  # json writes Infinity / NaN
    with pytest.raises(TaskFormatError) as info:
        load_jsonl(path)
    assert f"{path}:2: {field}:" in str(info.value)


def test_the_checks_hold_for_tasks_built_in_code_too():
    with pytest.raises(ValidationError, match="command"):
        TestSpec(command="  ", fail_to_pass=["a"])
    with pytest.raises(ValidationError, match="fail_to_pass"):
        TestSpec(fail_to_pass=[""])
    with pytest.raises(ValidationError, match="timeout_s"):
        TestSpec(fail_to_pass=["a"], timeout_s=float("inf"))


@pytest.mark.parametrize(
    "patch",
    [
        "",
        PATCH,
        "diff --git a/x b/x\nnew file mode 100644\n",
        "@@ -1 +1 @@\n-a\n+b\n",
        unified_diff("x.py", "a\n", "a\n"),
    ],
)
def test_a_reference_patch_that_is_a_diff_or_empty_is_kept(patch):
    assert Task.model_validate(task(reference_patch=patch)).reference_patch == patch


# --------------------------------------------------------------------------- the report


def test_the_report_names_a_family_that_is_not_a_string_as_the_task_does():
    """The row carries the raw metadata value; a dict there once failed the report after every episode ran."""
    family = {"a": 1}
    details = {"turns": 1, "tool_calls": 0, "tool_calls_per_turn": 0.0, "reference_tokens": 1, "wall_s": 1.0,
               "unsupported_claims": [], "format_errors": 0, "model_s": 0.0}  # fmt: skip
    row = {"model": "m", "task_id": "t1", "family": family, "resolved": False, "total": 0.0, "adherence": 0.0,
           "details": details}  # fmt: skip
    name = Task.model_validate(task(metadata={"family": family})).family
    s = summarize([row])["m"]
    assert s["success_by_family"] == {name: [0, 1]}
    assert f"| {name} | 0% (0/1) |" in markdown({"m": s}, "t")


def test_a_missing_path_is_named_missing_not_an_unknown_name(tmp_path):
    """A checkpoint path or a tasks file that does not exist read "unknown policy spec" / "unknown suite",
    listing the path form as valid (docs audit); it is now said to be missing."""
    from vivace.harness.policies import load_policy
    from vivace.tasks.suites import load_suite

    with pytest.raises(ValueError, match=r"no such checkpoint directory"):
        load_policy(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match=r"unknown policy spec 'nosuch'"):
        load_policy("nosuch")
    with pytest.raises(ValueError, match=r"my_tasks.jsonl: no such task file or directory"):
        load_suite("my_tasks.jsonl")
    with pytest.raises(ValueError, match=r"unknown suite 'nosuch'"):
        load_suite("nosuch")
