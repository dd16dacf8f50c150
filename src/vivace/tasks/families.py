"""Learnable task families: bugs whose fix follows from what the tools show, in generated projects.

Families (each a one-site change in a project from projects.py):
- misspelled_name: a variable misspelled at one use -> NameError at file:line; the right
  name is in the same function;
- misspelled_method: a str/list/dict method misspelled -> AttributeError naming the type;
- self_comparison: one side of a comparison replaced by the other (`low <= low`) -> a failed
  assert; visible on reading the function;
- unused_loop_variable: the loop body uses `items[0]` instead of the loop variable;
- wrong_keyword (multi-file, level 3): a call passes a keyword the helper in util.py does not
  take -> TypeError; the right name is only in the other file;
- misspelled_import (multi-file, level 3): a name imported from another module misspelled
  at the import and its uses -> ImportError; the right name is in the other module;
- arithmetic (the harder families, reported apart): the generator's own mutations
  (mutate.py: comparison flips, off-by-one, operator swaps...), whose fix must be inferred
  from the assert's numbers.

A task is kept only if the clean project's tests pass and the buggy one's fail (run for real,
in a temporary directory: the code is generated here, not untrusted). The scorer runs its own
copy of the tests (tasks/hidden.py: strict, and on more inputs), which the agent never sees. The
task's repository is the `_blank` bundled repository plus a patch creating the project, so one
JSONL line holds it all; its request is the failing test's traceback (file:line) or, for `terse` requests, only
the failing test's name. Splits follow the project's theme (projects.THEME_SPLITS).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vivace.tasks.format import RepoSpec, Task, TestSpec
from vivace.tasks.generate import unified_diff
from vivace.tasks.hidden import hidden_tests
from vivace.tasks.mutate import mutations
from vivace.tasks.projects import Project, make_project, split_of_theme
from vivace.tasks.testrun import NO_PLUGIN_AUTOLOAD, parse_outcomes, shown_failure

LEARNABLE = ("misspelled_name", "misspelled_method", "self_comparison", "unused_loop_variable")
MULTI_FILE = ("wrong_keyword", "misspelled_import")
FAMILIES = (*LEARNABLE, *MULTI_FILE, "arithmetic")
# The plugin flag keeps a dev-only pytest plugin's warning out of every output.
# -X no_debug_ranges drops the ^^^ lines under each traceback line (tokens a small model has to read).
TEST_COMMAND = "python -X no_debug_ranges -m pytest -q -rA --tb=short -p no:cacheprovider -p no:asyncio"
METHODS = ("append", "get", "strip", "lower", "title")
KEYWORD_SWAPS = {"value": "number", "low": "start", "high": "stop", "part": "share", "whole": "of"}

# Share of training projects named from generated themes (projects.generated_theme), not the named ones.
GENERATED_THEMES = 0.8
Bug = tuple[str, str, str, list[str]]  # (family, file, mutated content, context files to read)


def bugs(project: Project, family: str, rng: random.Random) -> list[Bug]:
    """Every candidate bug of one family in a project (shuffled by rng)."""
    found: list[Bug] = []
    for path, source in project.files.items():
        if not path.startswith(project.names.pkg + "/") or not source:
            continue
        for mutated, context in _candidates(family, path, source, project):
            if mutated != source:
                found.append((family, path, mutated, context))
    rng.shuffle(found)
    return found


def _candidates(family: str, path: str, source: str, project: Project):
    tree = ast.parse(source)
    lines = source.split("\n")
    pkg = project.names.pkg
    if family == "arithmetic":
        for m in mutations(path, source):
            if m.kind not in ("removed_statement",):
                yield m.apply(source), []
        return
    for func in [n for n in tree.body if isinstance(n, ast.FunctionDef)]:
        local = {a.arg for a in func.args.args} | {
            t.id
            for n in ast.walk(func)
            for t in ast.walk(n)
            if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)
        }
        for node in ast.walk(func):
            if family == "misspelled_name" and isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id in local and len(node.id) >= 3:
                    wrong = _misspell(node.id, random.Random(f"{path}:{node.lineno}:{node.col_offset}"))
                    if wrong not in local and not hasattr(builtins, wrong):
                        yield _replace(lines, node, wrong), []
            elif family == "misspelled_method" and isinstance(node, ast.Attribute) and node.attr in METHODS:
                wrong = _misspell(node.attr, random.Random(f"{path}:{node.lineno}:{node.attr}"))
                line = lines[node.lineno - 1]
                at = line.find("." + node.attr + "(", node.col_offset)
                if at >= 0:
                    yield _with_line(lines, node.lineno, line[: at + 1] + wrong + line[at + 1 + len(node.attr) :]), []
            elif family == "self_comparison" and isinstance(node, ast.Compare):
                seg = [ast.get_source_segment(source, x) for x in (node.left, *node.comparators)]
                if len(set(seg)) == len(seg) and all(s and "\n" not in s for s in seg) and "None" not in seg:
                    line = lines[node.lineno - 1]
                    text = ast.get_source_segment(source, node) or ""
                    # the last operand only (`x["name"] == name` must not touch the "name" key)
                    broken = text[: -len(seg[-1])] + seg[0] if text.endswith(seg[-1]) else ""
                    if broken and text in line:
                        yield _with_line(lines, node.lineno, line.replace(text, broken, 1)), []
            elif family == "unused_loop_variable" and isinstance(node, ast.For):
                if isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Name):
                    var, seq = node.target.id, node.iter.id
                    body = range(node.body[0].lineno, node.end_lineno + 1)
                    new = list(lines)
                    for i in body:
                        new[i - 1] = re.sub(rf"\b{var}\b", f"{seq}[0]", new[i - 1])
                    yield "\n".join(new), []
            elif family == "wrong_keyword" and isinstance(node, ast.Call) and node.keywords:
                for kw in node.keywords:
                    role = next((r for r, v in project.names.local.items() if v == kw.arg and r in KEYWORD_SWAPS), None)
                    if role:
                        line = lines[kw.lineno - 1]
                        at = line.find(kw.arg + "=", kw.col_offset)
                        if at >= 0:
                            swap = KEYWORD_SWAPS[role] if KEYWORD_SWAPS[role] != kw.arg else kw.arg + "_value"
                            new_line = line[:at] + swap + line[at + len(kw.arg) :]
                            yield _with_line(lines, kw.lineno, new_line), [f"{pkg}/util.py"]
    if family == "misspelled_import":
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(pkg + "."):
                for alias in node.names:
                    wrong = _misspell(alias.name, random.Random(f"{path}:{alias.name}"))
                    other = node.module.replace(".", "/") + ".py"
                    yield re.sub(rf"\b{alias.name}\b", wrong, source), [other]


def _misspell(name: str, rng: random.Random) -> str:
    """One typo a person makes: a dropped, doubled or swapped letter (never the first)."""
    typos = set()
    for i in range(1, len(name)):
        if name[i].isalpha():
            typos |= {name[:i] + name[i + 1 :], name[:i] + name[i] + name[i:]}
            if i + 1 < len(name) and name[i + 1].isalpha():
                typos.add(name[:i] + name[i + 1] + name[i] + name[i + 2 :])
    typos.discard(name)
    return rng.choice(sorted(typos)) if typos else name + "s"


def _replace(lines: list[str], node: ast.Name, new: str) -> str:
    line = lines[node.lineno - 1]
    return _with_line(lines, node.lineno, line[: node.col_offset] + new + line[node.end_col_offset :])


def _with_line(lines: list[str], line_no: int, text: str) -> str:
    return "\n".join([*lines[: line_no - 1], text, *lines[line_no:]])


def run_project(files: dict[str, str], timeout_s: float = 30.0) -> tuple[dict[str, str], str]:
    """The project's test outcomes (id -> PASSED/FAILED/...) and pytest's output."""
    with tempfile.TemporaryDirectory(prefix="vivace-family-") as tmp:
        for path, content in files.items():
            (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / path).write_text(content)
        try:
            done = subprocess.run([sys.executable, *TEST_COMMAND.split()[1:]], cwd=tmp, capture_output=True,
                                  text=True, timeout=timeout_s, env={**os.environ, **NO_PLUGIN_AUTOLOAD})  # fmt: skip
        except subprocess.TimeoutExpired:
            return {}, "timed out"
    output = done.stdout.replace(tmp + "/", "")  # paths as the project sees them, not this machine's
    if not output.strip() and done.stderr.strip():  # pytest never ran (not installed, say): say why
        output = done.stderr.replace(tmp + "/", "")
    return parse_outcomes(output), output


def generate_families(
    per_split: dict[str, int],
    seed: int = 0,
    families: tuple[str, ...] = FAMILIES,
    workers: int = 2,
    progress: Callable[[int, int], None] = lambda kept, wanted: None,
) -> list[Task]:
    """`per_split[split]` tasks for each split, spread evenly over families and curriculum levels."""
    from vivace.tasks.projects import THEMES

    themes = {s: sorted(t for t in THEMES if split_of_theme(t) == s) for s in per_split}
    wanted = sum(per_split.values())
    tasks: list[Task] = []
    seen: set[str] = set()
    pool = ThreadPoolExecutor(workers)
    try:
        for split, n in per_split.items():
            rng = random.Random(f"{seed}-{split}")  # one stream per split: more training tasks keep the held-out ones
            plan = [(families[i % len(families)], i) for i in range(n)]
            while plan:
                jobs = [(fam, i, _project_for(fam, themes[split], rng)) for fam, i in plan[: workers * 4]]
                seeds = [rng.random() for _ in jobs]  # drawn here: worker threads would draw in a racy order
                results = list(pool.map(lambda job, s: _make_task(job[2], job[0], random.Random(s)), jobs, seeds))
                done = {i for (_, i, _), task in zip(jobs, results, strict=True) if task and task.id not in seen}
                for (_, i, _), task in zip(jobs, results, strict=True):
                    if task and i in done and task.id not in seen:
                        seen.add(task.id)
                        tasks.append(task)
                plan = [p for p in plan if p[1] not in done]
                progress(len(tasks), wanted)
    finally:
        # Stopped (Ctrl-C, or the CLI's SIGTERM made one): no queued job starts, and this waits for those
        # running, so each removes its temporary directory before the process ends.
        pool.shutdown(cancel_futures=True)
    return tasks


def _project_for(family: str, themes: list[str], rng: random.Random) -> Project:
    level = 3 if family in MULTI_FILE else rng.choice((1, 1, 2, 2, 3))
    theme = rng.choice(themes)
    if split_of_theme(theme) == "train" and rng.random() < GENERATED_THEMES:
        theme = f"gen-{rng.randrange(100_000)}"
    return make_project(theme, level, random.Random(rng.random()))


def _make_task(project: Project, family: str, rng: random.Random) -> Task | None:
    clean, output = run_project(project.files)
    if not clean or any(v != "PASSED" for v in clean.values()):
        tail = "\n".join(output.strip().splitlines()[-8:])
        raise RuntimeError(f"a generated {project.theme} project fails its own tests ({sys.executable} -m pytest): "
                           f"{clean or 'no test outcome'}\n{tail}")  # fmt: skip
    for fam, path, mutated, context in bugs(project, family, rng)[:3]:
        files = {**project.files, path: mutated}
        outcomes, output = run_project(files)
        failing = sorted(t for t in clean if outcomes.get(t) != "PASSED")
        if failing and output != "timed out":
            return _task(project, fam, path, mutated, context, failing, sorted(clean), output, rng)
    return None


def _task(project, family, path, mutated, context, failing, all_tests, output, rng) -> Task:
    files = {**project.files, path: mutated}
    created = "".join(_new_file(p, c) for p, c in sorted(files.items()))
    digest = hashlib.sha256(f"{created}".encode()).hexdigest()[:10]
    style = "terse" if rng.random() < 0.2 else "traceback"
    return Task(
        id=f"{project.theme}-{family.replace('_', '-')}-{digest}",
        repo=RepoSpec(bundled="_blank", patch=created),
        request=request_for(style, failing, output),
        tests=TestSpec(command=TEST_COMMAND, fail_to_pass=failing,
                       pass_to_pass=[t for t in all_tests if t not in failing], timeout_s=60.0,
                       files=hidden_tests(project.files, project.names.pkg)),  # fmt: skip
        reference_patch=unified_diff(path, mutated, project.files[path]),
        env=dict(NO_PLUGIN_AUTOLOAD),
        metadata={
            "kind": "bug", "family": family, "learnable": family != "arithmetic", "level": project.level,
            "theme": project.theme, "repo": project.theme, "split": project.split, "style": style,
            "difficulty": "hard" if family == "arithmetic" else "easy", "file": path, "context_files": context,
        },
    )  # fmt: skip


def _new_file(path: str, content: str) -> str:
    """A git diff creating `path` with `content` (what `git apply` needs: /dev/null, the mode)."""
    head = f"diff --git a/{path} b/{path}\nnew file mode 100644\n"
    if not content:
        return head
    lines = content.splitlines(keepends=True)
    body = "".join("+" + ln if ln.endswith("\n") else "+" + ln + "\n\\ No newline at end of file\n" for ln in lines)
    return f"{head}--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


def request_for(style: str, failing: list[str], output: str) -> str:
    test_id, section = shown_failure(output, failing)
    if style == "traceback" and section:
        return f"Running the tests fails:\n\n```\n{test_id}\n{section}\n```\n\nPlease fix the bug in the code (not the tests)."
    return f"The test {test_id} fails. Fix the code so it passes."
