"""Refresh the shipped family tasks from the generator's current code, in place, without drawing new
projects: the scorer's copy of their tests (vivace.tasks.hidden) and their request (families.request_for).

Regenerating the tasks would draw other projects. This rebuilds each task's buggy and clean project from
what the task holds (the repository patch, then the reference patch, applied by git), runs the buggy
project's tests to rebuild the request in the task's own style, and adds the hidden tests; nothing else in
the task changes. With --check N, it runs pytest on the first N tasks of each split (and every test task),
clean and buggy, with the hidden tests in place: every listed test must pass on the clean project, and
every FAIL_TO_PASS test must fail on the buggy one.

    .venv/bin/python scripts/refresh_families.py src/vivace/tasks/data/families.jsonl [--check 50]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vivace.tasks.families import request_for, run_project
from vivace.tasks.format import Task
from vivace.tasks.hidden import hidden_tests


def projects(task: dict) -> tuple[dict[str, str], dict[str, str]]:
    """(buggy, clean) files of a family task, by git apply of its patches."""
    with tempfile.TemporaryDirectory(prefix="vivace-hidden-") as d:
        for name, patch in (("repo", task["repo"]["patch"]), ("ref", task["reference_patch"])):
            Path(d, f".{name}.patch").write_text(patch)
        subprocess.run(["git", "apply", ".repo.patch"], cwd=d, check=True)
        buggy = _files(d)
        subprocess.run(["git", "apply", ".ref.patch"], cwd=d, check=True)
        return buggy, _files(d)


def _files(root: str) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(Path(root).rglob("*"))
            if p.is_file() and not p.name.endswith(".patch")}  # fmt: skip


def refreshed(task: dict) -> tuple[dict, dict[str, str], dict[str, str]]:
    buggy, clean = projects(task)
    pkg = task["metadata"]["file"].split("/")[0]
    _, output = run_project(buggy)  # the repository as the agent gets it: its own tests, not the scorer's
    request = request_for(task["metadata"]["style"], task["tests"]["fail_to_pass"], output)
    # pytest prints a dict's differing items in hash order, which differs between runs: the same lines in
    # another order are the same request
    if sorted(request.splitlines()) != sorted(task["request"].splitlines()):
        task["request"] = request
    task["tests"]["files"] = hidden_tests(clean, pkg)
    return task, buggy, clean


def check(task: dict, buggy: dict[str, str], clean: dict[str, str]) -> str | None:
    hidden = task["tests"]["files"]
    if not hidden:
        return "no hidden tests"
    listed = task["tests"]["fail_to_pass"] + task["tests"]["pass_to_pass"]
    after, _ = run_project({**clean, **hidden}, timeout_s=120)
    if bad := [t for t in listed if after.get(t) != "PASSED"]:
        return f"clean project fails {bad}"
    before, _ = run_project({**buggy, **hidden}, timeout_s=120)
    if bad := [t for t in task["tests"]["fail_to_pass"] if before.get(t) == "PASSED"]:
        return f"buggy project passes {bad}"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--check", type=int, default=0, help="tasks per split run with pytest (all test tasks)")
    args = parser.parse_args()
    tasks = [json.loads(line) for line in args.path.read_text().splitlines() if line.strip()]
    before = {t["id"]: t["request"] for t in tasks}
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        done = list(pool.map(refreshed, tasks))
    changed = Counter(t["metadata"]["family"] for t, _, _ in done if t["request"] != before[t["id"]])
    without = [t["id"] for t, _, _ in done if not t["tests"]["files"]]
    problems: dict[str, str] = {}
    if args.check:
        taken: dict[str, int] = {}
        chosen = []
        for task, buggy, clean in done:
            split = task["metadata"]["split"]
            if split == "test" or taken.get(split, 0) < args.check:
                taken[split] = taken.get(split, 0) + 1
                chosen.append((task, buggy, clean))
        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            for (task, _, _), problem in zip(chosen, pool.map(lambda c: check(*c), chosen), strict=True):
                if problem:
                    problems[task["id"]] = problem
        print(json.dumps({"checked": len(chosen), "problems": problems}, indent=1), file=sys.stderr)
    tmp = args.path.with_name(args.path.name + ".partial")
    tmp.write_text("".join(Task.model_validate(t).model_dump_json() + "\n" for t, _, _ in done))
    tmp.replace(args.path)
    print(
        json.dumps(
            {"tasks": len(done), "requests_changed": changed, "without_hidden": without, "problems": len(problems)}
        )
    )


if __name__ == "__main__":
    main()
