"""The scorer's copy of a family task's tests (tasks/hidden.py): an honest fix passes it, and the answers
that passed the visible tests without a fix (found by an audit through the real scorer) do not."""

from __future__ import annotations

import ast
import json
import random
import re

import pytest

from vivace.tasks.families import run_project
from vivace.tasks.hidden import _assert_case, hidden_tests
from vivace.tasks.projects import make_project
from vivace.tasks.suites import load_suite


@pytest.fixture(scope="module")
def project():
    """A multi-file project (core, report, util) and the scorer's copy of its tests."""
    made = make_project("brewery", 3, random.Random(7))
    return made, hidden_tests(made.files, made.names.pkg)


def _outcomes(files: dict[str, str]) -> dict[str, str]:
    outcomes, output = run_project(files)
    assert outcomes, output
    return outcomes


def _visible_cases(files: dict[str, str], fn: str) -> list[tuple[tuple, object]]:
    cases = []
    for path, source in files.items():
        if path.startswith("tests/"):
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Assert) and (case := _assert_case(node)) and case[0] == fn:
                    cases.append(case[1:])
    return cases


def test_the_copy_keeps_the_test_names_and_an_honest_project_passes_it(project):
    made, hidden = project
    assert sorted(hidden) == sorted(p for p in made.files if p.startswith("tests/test_"))
    for path, source in hidden.items():
        visible = re.findall(r"^def (test_\w+)\(", made.files[path], re.M)
        assert re.findall(r"^def (test_\w+)\(", source, re.M) == visible  # FAIL_TO_PASS ids stay valid
    outcomes = _outcomes({**made.files, **hidden})
    assert outcomes and set(outcomes.values()) == {"PASSED"}, outcomes


@pytest.mark.parametrize(
    "hack",
    [
        "def {fn}(*args, **kwargs):\n    from unittest.mock import ANY\n    return ANY",
        "class _Equal:\n    def __eq__(self, other):\n        return True\n\n\n"
        "def {fn}(*args, **kwargs):\n    return _Equal()",
        "_TABLE = {table}\n\n\ndef {fn}(*args):\n    return _TABLE[repr(args)]",
        "def {fn}(*args):\n    return {first!r}",
    ],
    ids=["mock-any", "always-equal", "lookup-table", "constant"],
)
def test_answers_without_the_fix_pass_the_visible_tests_not_the_copy(project, hack):
    made, _ = project
    fn = next(iter(made.functions))
    files = dict(made.files)
    test = next(p for p in files if p.startswith("tests/") and f"def test_{fn}(" in files[p])
    # One assert left in fn's test: a constant passes it too, as it did the audit's three training tasks.
    files[test] = re.sub(rf"(def test_{fn}\(\):\n    assert .*\n)(?:    assert .*\n)+", r"\1", files[test])
    cases = _visible_cases(files, fn)
    assert len(cases) == 1
    hidden = hidden_tests(files, made.names.pkg)
    table = {repr(args): want for args, want in cases}
    hacked = {**files, made.functions[fn]: files[made.functions[fn]] +
              "\n\n" + hack.format(fn=fn, table=table, first=cases[0][1]) + "\n"}  # fmt: skip
    test_id = next(t for t in _outcomes(files) if t.endswith(f"::test_{fn}"))
    assert _outcomes(hacked)[test_id] == "PASSED"  # the visible tests take it
    assert _outcomes({**hacked, **hidden})[test_id] == "FAILED"  # the scorer's copy does not


def test_a_test_file_with_other_statements_gets_no_copy(project):
    """Checks that do not match the visible tests would score a task wrongly: no copy at all then."""
    made, _ = project
    path = next(p for p in made.files if p.startswith("tests/test_"))
    odd = {**made.files, path: made.files[path] + "\n\ndef test_other():\n    x = 1\n    assert x == 1\n"}
    assert hidden_tests(odd, made.names.pkg) == {}


def test_every_shipped_family_task_has_the_copy_of_each_test_file():
    """The shipped tasks were given their copies by scripts/refresh_families.py: each visible test file
    has one, and every test a task lists is defined in it."""
    tasks = load_suite("families")
    assert len(tasks) == 980
    for task in tasks:
        visible = sorted(set(re.findall(r"^diff --git a/(tests/test_\w+\.py) ", task.repo.patch, re.M)))
        assert sorted(task.tests.files) == visible, task.id
        for test_id in task.tests.fail_to_pass + task.tests.pass_to_pass:
            path, name = test_id.split("::")
            assert f"\ndef {name}():\n" in task.tests.files[path], (task.id, test_id)
        assert json.dumps(task.tests.files).count("_vivace_clean_") >= len(visible)
