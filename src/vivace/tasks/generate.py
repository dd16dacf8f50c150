"""The bug-task generator: inject a bug into a bundled repository, keep it only if the tests
catch it, and write the task a user would file about it.

For each repository: its test suite must pass untouched (the baseline). Candidate
mutations (mutate.py) are shuffled by the seed and taken round-robin over mutation kinds
and repositories; each runs in a fresh sandboxed workspace. A mutant becomes a task when
at least one test fails with it; the failing tests are FAIL_TO_PASS, the rest PASS_TO_PASS,
and the reference patch is the mutation undone — which by the baseline fixes them all.

Requests come in three styles, deterministically by the seed: a failing test's traceback
(easy), an issue-like report of the failing assertion without test names (medium), and a
terse note (hard). Splits are by repository, so test repositories never appear in training.

Not covered: feature tasks (hand-written, vivace/tasks/features) and multi-bug tasks.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import random
import re
from collections.abc import Callable
from pathlib import Path

from vivace.sandbox.base import WithEnv, Workspace
from vivace.tasks.format import BUNDLED_REPOS, DEFAULT_TEST_COMMAND, RepoSpec, Task, TestSpec, bundled_repos
from vivace.tasks.mutate import Mutation, mutations
from vivace.tasks.testrun import NO_PLUGIN_AUTOLOAD, run_tests, shown_failure

# Test repositories never appear in training; validation is for model selection.
REPO_SPLITS = {
    "inventory": "train",
    "ledger": "train",
    "textkit": "train",
    "routes": "validation",
    "scheduler": "test",
    "confkit": "test",
}
STYLES = {"traceback": "easy", "issue": "medium", "terse": "hard"}
TEST_TIMEOUT_S = 120.0


def split_of(repo: str) -> str:
    return REPO_SPLITS.get(repo, "train")


def source_files(repo_dir: Path) -> list[str]:
    """The package's Python files (tests excluded), relative to the repository root."""
    return sorted(
        p.relative_to(repo_dir).as_posix()
        for p in repo_dir.rglob("*.py")
        if "tests" not in p.relative_to(repo_dir).parts and "__pycache__" not in p.parts
    )


def candidates(repos: list[str], seed: int) -> list[Mutation]:
    """All candidate mutations, shuffled by the seed and interleaved over (kind, repository)."""
    rng = random.Random(seed)
    buckets: dict[tuple[str, str], list[Mutation]] = {}
    for repo in dict.fromkeys(repos):  # a repository named twice would give each of its tasks twice
        root = BUNDLED_REPOS / repo
        for rel in source_files(root):
            for m in mutations(f"{repo}/{rel}", (root / rel).read_text()):
                buckets.setdefault((m.kind, repo), []).append(m)
    for bucket in buckets.values():
        rng.shuffle(bucket)
    order = sorted(buckets)
    rng.shuffle(order)
    out: list[Mutation] = []
    while any(buckets.values()):
        for key in order:
            if buckets[key]:
                out.append(buckets[key].pop())
    return out


async def generate(
    make_workspace: Callable[[str], object],
    n: int,
    seed: int = 0,
    repos: list[str] | None = None,
    concurrency: int = 2,
    progress: Callable[[int, int], None] | None = None,
) -> list[Task]:
    """Up to `n` validated bug tasks. `make_workspace(repo)` is an async context manager
    yielding a fresh workspace over the bundled repository `repo` (the caller owns the pool)."""
    repos = repos or bundled_repos()
    rng = random.Random(seed + 1)
    baselines = {repo: await _baseline(make_workspace, repo) for repo in repos}
    # A mutant that loops forever must not stall generation: a few times the clean run, at least 10 s.
    timeouts = {repo: max(10.0, 5 * seconds) for repo, (_, seconds) in baselines.items()}
    pool = candidates(repos, seed)
    tasks: list[Task] = []
    sem = asyncio.Semaphore(concurrency)
    tried = 0
    for start in range(0, len(pool), concurrency * 4):
        batch = pool[start : start + concurrency * 4]
        results = await asyncio.gather(*(_try(make_workspace, m, baselines, timeouts, sem) for m in batch))
        for m, failing_output in zip(batch, results, strict=True):
            tried += 1
            if failing_output is not None and len(tasks) < n:
                failing, output = failing_output
                tasks.append(_task(m, failing, baselines[m.path.split("/", 1)[0]][0], output, rng))
        if progress:
            progress(len(tasks), tried)
        if len(tasks) >= n:
            break
    return tasks


async def _baseline(make_workspace: Callable[[str], object], repo: str) -> tuple[list[str], float]:
    """The repository's test ids (all must pass untouched) and how long the run took."""
    async with make_workspace(repo) as ws:  # type: ignore[attr-defined]
        run = await run_tests(WithEnv(ws, NO_PLUGIN_AUTOLOAD), DEFAULT_TEST_COMMAND, None, TEST_TIMEOUT_S)
    if run.failing or not run.outcomes:
        raise RuntimeError(f"bundled repository {repo!r}: its own tests do not pass:\n{run.output[-2000:]}")
    return sorted(run.outcomes), run.duration_s


async def _try(make_workspace, m: Mutation, baselines: dict, timeouts: dict[str, float], sem: asyncio.Semaphore):
    repo, rel = m.path.split("/", 1)
    async with sem, make_workspace(repo) as ws:
        ws: Workspace
        await ws.write_text(rel, m.apply(await ws.read_text(rel)))
        run = await run_tests(WithEnv(ws, NO_PLUGIN_AUTOLOAD), DEFAULT_TEST_COMMAND, None, timeouts[repo])
    failing = [t for t in baselines[repo][0] if not run.passed(t)]
    if not failing or run.timed_out:
        return None
    return failing, run.output


def _task(m: Mutation, failing: list[str], all_tests: list[str], output: str, rng: random.Random) -> Task:
    repo, rel = m.path.split("/", 1)
    original = (BUNDLED_REPOS / repo / rel).read_text()
    mutated = m.apply(original)
    style = rng.choice(sorted(STYLES))
    digest = hashlib.sha256(f"{m.path}:{m.line}:{m.after}".encode()).hexdigest()[:8]
    return Task(
        id=f"{repo}-{m.kind.replace('_', '-')}-{digest}",
        repo=RepoSpec(bundled=repo, patch=unified_diff(rel, original, mutated)),
        request=_request(style, repo, failing, output),
        tests=TestSpec(fail_to_pass=failing, pass_to_pass=[t for t in all_tests if t not in failing]),
        reference_patch=unified_diff(rel, mutated, original),
        env=dict(NO_PLUGIN_AUTOLOAD),
        metadata={
            "kind": "bug",
            "repo": repo,
            "split": split_of(repo),
            "style": style,
            "difficulty": STYLES[style],
            "mutation": m.kind,
            "file": rel,
            "line": m.line,
            "function": m.function,
            "description": m.description,
        },
    )


def unified_diff(rel: str, before: str, after: str) -> str:
    """A git-style diff of one file (what `git apply` and the scorer read)."""
    body = difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}", n=3)
    return f"diff --git a/{rel} b/{rel}\n" + "".join(line if line.endswith("\n") else line + "\n" for line in body)


def _request(style: str, repo: str, failing: list[str], output: str) -> str:
    first, section = shown_failure(output, failing)
    if style == "traceback" and section:
        return f"Running the tests fails:\n\n```\n{first}\n{section}\n```\n\nPlease fix the bug in the code (not the tests)."
    if style in ("traceback", "issue") and section:
        evidence = [ln for ln in section.splitlines() if ln.startswith((">", "E "))][:8]
        evidence = [re.sub(r"tests?/\S+", "", ln).rstrip() for ln in evidence]
        if evidence:
            shown = "\n".join(evidence)
            return (
                f"Something in {repo} gives wrong results. This check fails:\n\n```\n{shown}\n```\n\n"
                "It used to work. Could you find the cause and fix it?"
            )
    test_file = first.split("::", 1)[0]
    return f"Tests in {test_file} are failing. Fix the code so they pass again."
