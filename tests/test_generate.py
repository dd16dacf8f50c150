"""The bug generator: mutation kinds, determinism, and that every kept task is real — its
FAIL_TO_PASS tests fail on the starting tree and the reference patch makes all tests pass."""

from __future__ import annotations

import ast
from contextlib import asynccontextmanager

import pytest

from conftest import make_backend
from vivace.tasks.format import BUNDLED_REPOS, bundled_repos
from vivace.tasks.generate import REPO_SPLITS, candidates, generate
from vivace.tasks.mutate import KINDS, mutations
from vivace.tasks.testrun import run_tests

SAMPLE = '''
class Account:
    def withdraw(self, amount, fee):
        """Take money out."""
        total = amount + fee
        if total > self.balance and not self.overdraft:
            raise ValueError("insufficient funds")
        self.balance -= total
        for i in range(0, 3):
            self.log(i, total)
        return self.balance * 2
'''


def test_every_kind_is_found_and_parses():
    found = mutations("bank.py", SAMPLE)
    assert {m.kind for m in found} == set(KINDS)
    for m in found:
        ast.parse(m.apply(SAMPLE))  # every mutant is valid Python
        assert m.function == "Account.withdraw"
    by_kind = {m.kind: m for m in found}
    assert by_kind["comparison_flip"].after.strip().startswith("if total >= self.balance")
    assert by_kind["removed_statement"].after == ""
    assert "docstring" not in [m.description for m in found if "Take money" in m.before]


def test_a_line_is_checked_in_its_function_and_in_the_file_when_that_fails():
    """mutate._parses reads the function holding the line first (fast), and the whole file when that does
    not parse: a quote the change opens may close in a later statement, and the file then parses."""
    from vivace.tasks import mutate

    lines = ["class A:", "    def f(self):", "        return 1", 'X = 2  # """', "Y = 3"]
    blocks = [(1, 3, 0), (2, 3, 4)]
    assert mutate._parses(lines, 3, "        return 2", blocks)  # in the indented method alone
    assert mutate._parses(lines, 3, '        return """', blocks)  # the string ends on line 4: the file parses
    assert not mutate._parses(lines, 3, "        return (", blocks)
    assert not mutate._parses(lines, 3, "    return 1", blocks)  # the method's body dedented: not Python


def test_mutations_are_those_a_whole_file_parse_keeps(monkeypatch):
    """The fast check keeps exactly the mutants that parsing each mutated file whole keeps (which is what
    it replaced, so the generated tasks stay the same), on real files of every bundled repository."""
    from vivace.tasks import mutate
    from vivace.tasks.generate import source_files

    files = [(BUNDLED_REPOS / r / f).read_text() for r in bundled_repos() for f in source_files(BUNDLED_REPOS / r)[:2]]
    fast = [mutations("x.py", text) for text in files]

    def whole(lines, line_no, new_line, blocks):
        try:
            ast.parse("\n".join(lines[: line_no - 1] + [new_line] + lines[line_no:]))
        except SyntaxError:
            return False
        return True

    monkeypatch.setattr(mutate, "_parses", whole)
    assert fast == [mutations("x.py", text) for text in files] and sum(map(len, fast)) > 100


def test_candidates_are_deterministic_and_balanced():
    repos = bundled_repos()
    assert len(repos) >= 6 and set(repos) <= set(REPO_SPLITS)
    first, again, other = candidates(repos, 0), candidates(repos, 0), candidates(repos, 1)
    assert [(m.path, m.line, m.after) for m in first] == [(m.path, m.line, m.after) for m in again]
    assert [(m.path, m.line) for m in first[:50]] != [(m.path, m.line) for m in other[:50]]
    head = first[: 4 * len(KINDS)]
    assert len({m.kind for m in head}) >= 8  # round-robin: early candidates cover the kinds
    assert {REPO_SPLITS[r] for r in repos} == {"train", "validation", "test"}


async def test_generated_tasks_are_real(state_dir):
    repo = "ledger" if "ledger" in bundled_repos() else bundled_repos()[0]
    backend = make_backend("plain", state_dir)

    @asynccontextmanager
    async def workspace(name: str):
        ws = await backend.create(backend.snapshot(str(BUNDLED_REPOS / name)))
        try:
            yield ws
        finally:
            await ws.close()

    try:
        tasks = await generate(workspace, n=3, seed=7, repos=[repo])
        assert len(tasks) == 3 and len({t.id for t in tasks}) == 3
        for task in tasks:
            assert task.metadata["split"] == REPO_SPLITS[repo] and task.metadata["mutation"] in KINDS
            assert task.request and task.reference_patch.startswith("diff --git a/")
            ws = await backend.create(backend.snapshot(task.source(cache_dir=state_dir)))
            ids = task.tests.fail_to_pass + task.tests.pass_to_pass
            broken = await run_tests(ws, task.tests.command, ids, 120)
            assert not any(broken.passed(t) for t in task.tests.fail_to_pass)
            assert all(broken.passed(t) for t in task.tests.pass_to_pass)
            rel = task.metadata["file"]
            await ws.write_text(rel, (BUNDLED_REPOS / repo / rel).read_text())  # the reference fix
            fixed = await run_tests(ws, task.tests.command, ids, 120)
            assert all(fixed.passed(t) for t in ids), fixed.output[-2000:]
            await ws.close()
    finally:
        await backend.aclose()


@pytest.mark.parametrize("repo", sorted(REPO_SPLITS))
def test_bundled_repository_shape(repo):
    root = BUNDLED_REPOS / repo
    if not root.is_dir():
        pytest.skip(f"{repo} is not bundled")
    source = [p for p in root.rglob("*.py") if "tests" not in p.relative_to(root).parts]
    lines = sum(len(p.read_text().splitlines()) for p in source)
    assert 300 <= lines <= 1500, lines
    assert len({p.parent for p in source}) >= 1 and len(source) >= 4
    assert list((root / "tests").glob("test_*.py"))


def test_a_repository_named_twice_gives_its_tasks_once():
    """`--repos textkit,textkit` wrote each task twice: a file no loader accepts (duplicate task ids)."""
    from vivace.tasks.generate import candidates

    once, twice = candidates(["textkit"], 0), candidates(["textkit", "textkit"], 0)
    assert len(twice) == len(once) and len({(m.path, m.line, m.kind, m.after) for m in twice}) == len(twice)
