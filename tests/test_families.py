"""The learnable task families: generated projects pass their own tests, each family's bug is
caught by them and named where the family says, the reference patch undoes it, splits are
theme-disjoint, and the task runs through the real benchmark (oracle solves it)."""

from __future__ import annotations

import random
import re
import subprocess

import pytest

from conftest import benchmark_episodes
from vivace.bench.patch import parse_patch
from vivace.tasks.families import FAMILIES, MULTI_FILE, _make_task, _misspell, bugs, generate_families, run_project
from vivace.tasks.projects import THEMES, generated_theme, make_project, split_of_theme
from vivace.tasks.testrun import failure_section


@pytest.mark.parametrize("level", [1, 2, 3])
def test_generated_projects_pass_their_tests_and_name_tests_after_functions(level):
    project = make_project("garden", level, random.Random(level))
    outcomes, output = run_project(project.files)
    assert outcomes and all(v == "PASSED" for v in outcomes.values()), output
    tested = {t.split("::")[-1].removeprefix("test_") for t in outcomes}
    assert tested == set(project.functions)
    for test_file in (p for p in project.files if p.startswith("tests/")):
        for line in project.files[test_file].splitlines():
            if line.startswith("def test_"):
                body = project.files[test_file].split(line, 1)[1].split("\ndef ", 1)[0]
                assert body.count("assert ") >= 2, f"{line}: too few asserts for lucky edits to fail"


def _task_for(family: str, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(20):  # a project may have no site for a family; the generator tries others the same way
        level = 3 if family in MULTI_FILE else rng.choice((1, 2, 3))
        task = _make_task(make_project("kitchen", level, random.Random(rng.random())), family, random.Random(seed))
        if task:
            return task
    raise AssertionError(f"no {family} task in 20 projects")


def _files_of(patch: str, base: dict[str, str] | None = None, tmp=None) -> dict[str, str]:
    """The tree a creating patch (plus an optional fix) describes, via git apply."""
    subprocess.run(["git", "init", "-q", str(tmp)], check=True)
    subprocess.run(["git", "apply", "-"], cwd=tmp, input=patch.encode(), check=True)
    return {
        p.relative_to(tmp).as_posix(): p.read_text() for p in tmp.rglob("*") if p.is_file() and ".git" not in p.parts
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_makes_a_caught_bug_that_the_reference_patch_fixes(family, tmp_path):
    task = _task_for(family)
    assert task.metadata["family"] == family and task.split == "test"  # kitchen is a test theme
    files = _files_of(task.repo.patch, tmp=tmp_path / "a")
    before, output = run_project(files)
    assert task.tests.fail_to_pass and all(before.get(t) != "PASSED" for t in task.tests.fail_to_pass), output
    # the request names a test whose failure pytest showed (a broken import stops collection: no test
    # runs, and a test in another module would pass), in the project's own paths
    named = re.search(r"tests/\S+\.py::\w+", task.request)
    assert named and named.group(0) in task.tests.fail_to_pass and failure_section(output, named.group(0))
    assert tmp_path.as_posix() not in task.request and "/tmp" not in task.request
    assert all(before.get(t) == "PASSED" for t in task.tests.pass_to_pass)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path / "a", input=task.reference_patch.encode(), check=True)
    fixed = {p: (tmp_path / "a" / p).read_text() for p in files}
    after, output = run_project(fixed)
    assert all(after[t] == "PASSED" for t in task.tests.fail_to_pass + task.tests.pass_to_pass), output
    changed = [c.path for c in parse_patch(task.reference_patch)]
    assert changed == [task.metadata["file"]] and not changed[0].startswith("tests/")
    if family in MULTI_FILE:  # the right name lives only in the other file
        (context,) = task.metadata["context_files"]
        assert context != changed[0] and context in files
    if task.metadata["style"] == "traceback" and family in (
        "misspelled_name", "misspelled_method", "wrong_keyword", "misspelled_import"
    ):  # fmt: skip
        assert f"{changed[0]}:" in task.request  # the traceback points at file:line


def test_misspellings_differ_from_the_name():
    rng = random.Random(0)
    for name in ("total", "plants", "get", "append", "ab", "x1"):
        for _ in range(20):
            assert _misspell(name, rng) != name


def test_splits_are_theme_disjoint_and_every_split_has_themes():
    splits = {split_of_theme(t) for t in THEMES}
    assert splits == {"train", "validation", "test"}
    train_words = {w for t, spec in THEMES.items() if split_of_theme(t) == "train" for w in (spec[0], spec[1], spec[2])}
    test_words = {w for t, spec in THEMES.items() if split_of_theme(t) == "test" for w in (spec[0], spec[1], spec[2])}
    assert not train_words & test_words
    generated = {w for n in range(2000) for w in (lambda s: (s[0], s[1], s[2], *s[3]))(generated_theme(n))}
    held_out = {w for t, spec in THEMES.items() if split_of_theme(t) != "train" for w in (*spec[:3], *spec[3])}
    assert not generated & held_out and split_of_theme("gen-7") == "train"
    assert len({generated_theme(n)[:3] for n in range(2000)}) > 1000  # names vary: copying beats remembering
    assert len({generated_theme(n)[0] for n in range(2000)}) > 1000  # packages too (mostly invented words)


def test_more_training_tasks_keep_the_held_out_tasks():
    few = generate_families({"train": 1, "validation": 2}, seed=3, families=("misspelled_name",))
    more = generate_families({"train": 3, "validation": 2}, seed=3, families=("misspelled_name",))
    held_out = [[t.id for t in tasks if t.split == "validation"] for tasks in (few, more)]
    assert len(held_out[0]) == 2 and held_out[0] == held_out[1]


def test_bug_candidates_stay_in_the_package():
    project = make_project("fleet", 3, random.Random(5))
    for family in FAMILIES:
        for _, path, mutated, _ in bugs(project, family, random.Random(0)):
            assert path.startswith("fleet/") and mutated != project.files[path]


async def test_oracle_solves_a_multi_file_task_and_random_edit_does_not_crash(state_dir):
    from vivace.bench.baselines import OraclePolicy, RandomEditPolicy

    task = _task_for("wrong_keyword", seed=3)
    (traj, score), (_, random_score) = await benchmark_episodes(
        state_dir, (OraclePolicy(), task), (RandomEditPolicy(), task)
    )
    assert score.resolved
    reads = [c for t in traj.turns for c in t.tool_calls if c.name == "read_file"]
    assert {c.arguments["path"] for c in reads} == {task.metadata["file"], *task.metadata["context_files"]}
    assert random_score is not None


def test_bench_summary_breaks_success_down_by_family():
    from vivace.bench.report import html_report, markdown, summarize

    details = {"turns": 2, "tool_calls": 2, "tool_calls_per_turn": 1.0, "reference_tokens": 10, "wall_s": 1.0,
               "unsupported_claims": [], "format_errors": 0, "model_s": 0.0}  # fmt: skip
    rows = [{"model": m, "task_id": f"t{i}", "family": fam, "resolved": ok, "total": 1.0 * ok, "adherence": 1.0,
             "details": details}
            for m, fam, ok, i in [("a", "typo", True, 1), ("a", "typo", False, 2), ("a", "arith", True, 3),
                                  ("b", "typo", False, 1), ("b", "typo", False, 2), ("b", "arith", False, 3)]]  # fmt: skip
    summary = summarize(rows)
    assert summary["a"]["success_by_family"] == {"arith": [1, 1], "typo": [1, 2]}
    assert summary["b"]["success_by_family"] == {"arith": [0, 1], "typo": [0, 2]}
    text = markdown(summary, "t")
    assert "| typo | 50% (1/2) | 0% (0/2) |" in text and "| arith | 100% (1/1) | 0% (0/1) |" in text
    page = html_report(summary, "t")  # the page had the overall table only
    assert "<tr><td>typo</td><td>50% (1/2)</td><td>0% (0/2)</td></tr>" in page


def test_minimal_edits_make_exactly_the_reference_fix_on_every_task():
    """The oracle's minimal old_string/new_string pairs (cut inside lines to the changed words, a
    word with the space before it) turn each buggy file into exactly the fixed one, every
    old_string unique when applied."""
    from vivace.bench.baselines import _edits
    from vivace.bench.patch import parse_patch
    from vivace.tasks.suites import load_suite

    tasks = load_suite("families")
    shorter = 0
    for task in tasks:
        created = {c.path: "".join(h.new for h in c.hunks) for c in parse_patch(task.repo.patch)}
        for change in parse_patch(task.reference_patch):
            buggy = created[change.path]
            whole = buggy
            for _, args in _edits(change):  # the reference's whole hunks
                whole = whole.replace(args["old_string"], args["new_string"], 1)
            cut = buggy
            for _, args in _edits(change, buggy, minimal=True):
                assert cut.count(args["old_string"]) == 1, (task.id, args)
                at = cut.find(args["old_string"])
                if args["old_string"][:1].isalnum():  # a word after a space keeps it (same tokens as the file)
                    assert cut[at - 1] != " ", (task.id, args)
                cut = cut.replace(args["old_string"], args["new_string"])
                shorter += not args["old_string"].endswith("\n")  # cut inside a line
            assert cut == whole, task.id
    assert shorter > len(tasks) * 3 // 4  # most fixes are cut inside a line


def test_a_hunk_changing_two_lines_becomes_two_short_edits_applied_in_order():
    """Two changed lines in one hunk: one short edit per line (no newline, indentation or quotes to
    escape in a JSON string), the second cut against the file as the first left it."""
    from vivace.bench.baselines import _edits
    from vivace.bench.patch import parse_patch

    buggy = 'def find(items, name):\n    for item in items:\n        if items[0]["name"] == name:\n            return items[0]\n'
    diff = ("@@ -1,4 +1,4 @@\n def find(items, name):\n     for item in items:\n"
            '-        if items[0]["name"] == name:\n-            return items[0]\n'
            '+        if item["name"] == name:\n+            return item\n')  # fmt: skip
    (change,) = parse_patch("--- a/m.py\n+++ b/m.py\n" + diff)
    calls = [args for _, args in _edits(change, buggy, minimal=True)]
    assert [(a["old_string"], a["new_string"]) for a in calls] == [(" items[0][", " item["), (" items[0]", " item")]
    fixed = buggy
    for a in calls:
        assert fixed.count(a["old_string"]) == 1
        fixed = fixed.replace(a["old_string"], a["new_string"])
    assert fixed == buggy.replace('items[0]["name"]', 'item["name"]').replace("return items[0]", "return item")
    # A hunk that adds a line is not one-for-one: it stays one edit.
    grow = "@@ -1,2 +1,3 @@\n def f():\n-    return 1\n+    x = 1\n+    return x\n"
    (change,) = parse_patch("--- a/m.py\n+++ b/m.py\n" + grow)
    assert len(_edits(change, "def f():\n    return 1\n", minimal=True)) == 1


def test_a_suite_can_be_a_tasks_file(tmp_path):
    """`train.suite` may name a user's tasks file: its tasks load, `split` filters them by their
    metadata, and a name that is neither a suite nor a path says what it accepts."""
    from vivace.tasks.suites import load_suite

    tasks = load_suite("families")
    picked = [t for t in tasks if t.split == "train"][:3] + [t for t in tasks if t.split == "test"][:2]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in picked))
    assert [t.id for t in load_suite(str(path))] == [t.id for t in picked]
    assert [t.id for t in load_suite(str(path), split="test")] == [t.id for t in picked[3:]]
    with pytest.raises(ValueError, match="missing.jsonl: no such task file or directory"):
        load_suite(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="or a path to a tasks file"):
        load_suite("nosuch")


def test_shipped_requests_point_at_the_bug_the_tests_show():
    """Each shipped task's request names one of its failing tests; a traceback request of a family whose
    error names the wrong identifier points at the buggy file's line. A misspelled import stops pytest's
    collection, so its tasks name a test of the module that could not import, and show why."""
    from vivace.tasks.suites import load_suite

    for task in load_suite("families"):
        named = re.search(r"tests/\S+\.py::\w+", task.request)
        assert named and named.group(0) in task.tests.fail_to_pass, task.id
        assert "/tmp" not in task.request and "/root" not in task.request, task.id
        family, style = task.metadata["family"], task.metadata["style"]
        if style == "traceback" and family in ("misspelled_name", "misspelled_method", "wrong_keyword",
                                               "misspelled_import"):  # fmt: skip
            assert f"{task.metadata['file']}:" in task.request, task.id
        if family == "misspelled_import":
            assert named.group(0).startswith("tests/test_report.py::"), task.id  # what imports the broken file
            if style == "traceback":
                assert "ERROR collecting tests/test_report.py" in task.request and "ImportError" in task.request


def test_a_python_without_pytest_is_named_not_reported_as_a_broken_project(tmp_path, monkeypatch):
    """Generating tasks runs each project's tests with this Python; where it has no pytest (an install
    without the test tools), the error said only `fails its own tests: {}`."""
    import sys
    import venv

    venv.create(tmp_path / "bare", with_pip=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bare" / "bin" / "python"))
    with pytest.raises(RuntimeError, match="No module named pytest"):
        generate_families({"train": 1}, seed=0, workers=1)


def test_unsound_tasks_for_want_of_pytest_get_advice_about_the_environment():
    from vivace.bench.report import unsound_advice

    why = "the reference fix does not pass the tests (exit code 1: /venv/bin/python: No module named pytest)"
    advice = unsound_advice([{"task_id": "t", "kind": None}], {"t": why})
    assert advice.startswith("the sandbox's Python has no pytest") and "pip install pytest" in advice
    assert "no pytest" not in unsound_advice([{"task_id": "t", "kind": None}], {"t": "FAIL_TO_PASS 0/1 passed"})
