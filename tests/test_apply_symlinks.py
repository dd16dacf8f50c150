"""`vivace agent --apply` carries the agent's symlinks over as links, as `git apply` writes a link git
stores (mode 120000), but only those that lead to a place inside the repository: an absolute link,
one climbing out, one leading out through a link of the repository's, and special files are left
and named; a link the developer changed meanwhile is left; a directory the diff does not empty is
not replaced. Real trees in tmp_path throughout; the workspace is a directory read as the sandbox
backends read theirs (two tests use a real plain-backend workspace, one through `vivace agent`)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from conftest import DirWorkspace, git, make_backend
from vivace.cli import app
from vivace.sandbox.apply import export_changes
from vivace.sandbox.diff import tree_diff, walk_files
from vivace.sandbox.paths import ConfinedFS


class _RemoteLike:
    """A workspace on another machine: the file API only, no tree to read a link from."""

    def __init__(self, root: Path):
        self._fs = ConfinedFS(root)

    async def stat(self, path: str):
        return self._fs.stat(path)

    async def read_bytes(self, path: str) -> bytes:
        return self._fs.read_bytes(path)


def _tree(root: Path, files: dict[str, str]) -> None:
    """`files`: path -> content, or "-> TARGET" for a symlink, or "/" for an empty directory."""
    for rel, what in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if what == "/":
            p.mkdir()
        elif what.startswith("-> "):
            os.symlink(what[3:], p)
        else:
            p.write_text(what)


def _agent_ran(tmp_path: Path, files: dict[str, str], change: Callable[[Path], object]):
    """A repository holding `files`, its snapshot, and a copy `change(work)` edited: (repo, snapshot,
    workspace, diff), the diff as a workspace makes it."""
    repo, snapshot, work = tmp_path / "repo", tmp_path / "snapshot", tmp_path / "work"
    repo.mkdir()
    _tree(repo, files)
    shutil.copytree(repo, snapshot, symlinks=True)
    shutil.copytree(repo, work, symlinks=True)
    change(work)
    diff = tree_diff(snapshot, work, set(walk_files(snapshot)) | set(walk_files(work)), [".git", "__pycache__"])
    return repo, snapshot, DirWorkspace(work), diff


def _links(root: Path) -> dict[str, str]:
    return {rel: os.readlink(root / rel) for rel in walk_files(root) if (root / rel).is_symlink()}


def _state(root: Path) -> dict[str, str]:
    """Every non-directory path under `root` (.git aside): a link's target or a file's content."""
    out = {}
    for rel in walk_files(root):
        if rel.split("/")[0] != ".git":
            p = root / rel
            out[rel] = "-> " + os.readlink(p) if p.is_symlink() else p.read_text()
    return out


def _inside(repo: Path, rel: str) -> bool:
    """The link `rel`, followed as far as it goes (dangling or not), stays inside `repo`."""
    real = os.path.realpath(repo / rel)
    return real == str(repo.resolve()) or real.startswith(str(repo.resolve()) + os.sep)


BASE = {"a.py": "a\n", "b.py": "b\n", "old": "-> a.py", "gone": "-> a.py", "d/x.py": "x\n", "sub/s.py": "s\n"}


def _links_made(work: Path) -> None:
    """The agent: a new link, one in a new directory, a retargeted one, a deleted one, a dangling one
    and a directory replaced by a link."""
    os.symlink("a.py", work / "new")
    (work / "deep/er").mkdir(parents=True)
    os.symlink("../../sub/s.py", work / "deep/er/up")
    (work / "old").unlink()
    os.symlink("sub", work / "old")
    (work / "gone").unlink()
    os.symlink("not/yet/there.py", work / "dangling")
    shutil.rmtree(work / "d")
    os.symlink("./sub/", work / "d")


async def test_links_are_written_as_links_as_git_apply_writes_them(tmp_path):
    """New, retargeted, deleted, dangling links and a directory replaced by a link come out as `git
    apply` of the same diff makes them (they were all left: "a symlink or special file")."""
    repo, snapshot, ws, diff = _agent_ran(tmp_path, BASE, _links_made)
    reference = tmp_path / "reference"
    shutil.copytree(repo, reference, symlinks=True)
    git(reference, "init", "-q")
    applied = git(reference, "apply", "-", input=diff.encode())
    assert applied.returncode == 0, applied.stderr
    shutil.rmtree(reference / ".git")

    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.left == {} and sorted(report.applied) == [
        "d", "d/x.py", "dangling", "deep/er/up", "gone", "new", "old",
    ]  # fmt: skip
    assert _state(repo) == _state(reference)
    assert _links(repo) == {"d": "./sub/", "dangling": "not/yet/there.py", "deep/er/up": "../../sub/s.py",
                            "new": "a.py", "old": "sub"}  # fmt: skip
    assert (repo / "deep/er/up").read_text() == "s\n" and (repo / "d/s.py").read_text() == "s\n"


async def test_file_and_link_swapped_for_each_other(tmp_path):
    """A file the agent replaced by a link becomes that link (the hard link elsewhere keeps the old
    file, as with git), and a link it replaced by a file a file (its old target untouched)."""

    def change(work: Path) -> None:
        (work / "f.txt").unlink()
        os.symlink("a.py", work / "f.txt")
        (work / "l").unlink()
        (work / "l").write_text("a file now\n")

    repo, snapshot, ws, diff = _agent_ran(tmp_path, {"a.py": "a\n", "f.txt": "f\n", "l": "-> a.py"}, change)
    os.link(repo / "f.txt", tmp_path / "elsewhere.txt")
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.left == {} and sorted(report.applied) == ["f.txt", "l"]
    assert os.readlink(repo / "f.txt") == "a.py" and (tmp_path / "elsewhere.txt").read_text() == "f\n"
    assert not (repo / "l").is_symlink() and (repo / "l").read_text() == "a file now\n"
    assert (repo / "a.py").read_text() == "a\n"


async def test_absolute_links_are_left(tmp_path):
    """/workspace/x is the sandbox's mount point: here it is some other directory (a dev container's
    own /workspace), and /etc/passwd is the host's. Both are left and named; the rest is applied."""

    def change(work: Path) -> None:
        os.symlink("/workspace/a.py", work / "mounted")
        os.symlink("/etc/passwd", work / "passwd")
        (work / "old").unlink()
        os.symlink("/workspace/b.py", work / "old")
        (work / "b.py").write_text("b 2\n")

    repo, snapshot, ws, diff = _agent_ran(tmp_path, {"a.py": "a\n", "b.py": "b\n", "old": "-> a.py"}, change)
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.applied == ["b.py"] and sorted(report.left) == ["mounted", "old", "passwd"]
    assert all("absolute path" in why and "not carried over" in why for why in report.left.values())
    assert "/workspace/a.py" in report.left["mounted"]
    assert not os.path.lexists(repo / "mounted") and not os.path.lexists(repo / "passwd")
    assert os.readlink(repo / "old") == "a.py" and (repo / "b.py").read_text() == "b 2\n"


async def test_links_climbing_out_of_the_repository_are_left(tmp_path):
    """Taken from the link's own directory: `sub/ok -> ../a.py` is inside, `sub/out -> ../../x` and
    `esc -> ../../etc/passwd` are not, nor is a link in a new directory that climbs past its top."""
    (tmp_path / "x").write_text("outside\n")

    def change(work: Path) -> None:
        os.symlink("../a.py", work / "sub/ok")
        os.symlink("../../x", work / "sub/out")
        os.symlink("../../etc/passwd", work / "esc")
        (work / "n1/n2").mkdir(parents=True)
        os.symlink("../../../x", work / "n1/n2/out")
        os.symlink("../../a.py", work / "n1/n2/ok")

    repo, snapshot, ws, diff = _agent_ran(tmp_path, {"a.py": "a\n", "sub/s.py": "s\n"}, change)
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert sorted(report.applied) == ["n1/n2/ok", "sub/ok"]
    assert sorted(report.left) == ["esc", "n1/n2/out", "sub/out"]
    assert all("climbs out of" in why for why in report.left.values())
    assert _links(repo) == {"n1/n2/ok": "../../a.py", "sub/ok": "../a.py"}
    assert all(_inside(repo, rel) for rel in _links(repo))


async def test_link_chains_leading_out_are_left(tmp_path):
    """A target inside on paper that leads out through a link: the repository's own (`vendor`, to a
    directory outside, in the snapshot too) or one the developer made meanwhile; a link to a link
    of the agent's that is itself left dangles inside. No link written leads outside."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s\n")

    def change(work: Path) -> None:
        os.symlink("vendor/secret", work / "lib")
        os.symlink("up", work / "via_up")
        os.symlink("vendor", work / "whole")
        os.symlink("mine", work / "via_mine")
        os.symlink("hop2", work / "hop1")
        os.symlink("..", work / "hop2")

    files = {"a.py": "a\n", "vendor": f"-> {outside}", "up": "-> ../outside"}
    repo, snapshot, ws, diff = _agent_ran(tmp_path, files, change)
    os.symlink("../outside/secret", repo / "mine")  # the developer's, made meanwhile
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert sorted(report.left) == ["hop2", "lib", "via_mine", "via_up", "whole"]
    assert all("leads outside" in report.left[rel] for rel in ("lib", "via_mine", "via_up", "whole"))
    assert "climbs out of" in report.left["hop2"]
    assert report.applied == ["hop1"] and os.readlink(repo / "hop1") == "hop2"
    assert not os.path.lexists(repo / "hop2")  # so hop1 dangles, inside
    assert all(_inside(repo, rel) for rel in ["hop1", "a.py"])


async def test_dot_dot_after_a_name_is_left(tmp_path):
    """`x -> d/..` leads inside while d is a directory, but this apply makes d a link to `.`, and then
    x would lead to the repository's parent: a `..` after a name is left whatever the order."""

    def change(work: Path) -> None:
        shutil.rmtree(work / "d")
        os.symlink(".", work / "d")
        os.symlink("d/../a.py", work / "x")
        os.symlink("sub/../a.py", work / "y")

    repo, snapshot, ws, diff = _agent_ran(tmp_path, {"a.py": "a\n", "d/k.py": "k\n", "sub/s.py": "s\n"}, change)
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert sorted(report.left) == ["x", "y"] and all("`..` after a name" in why for why in report.left.values())
    assert os.readlink(repo / "d") == "." and not os.path.lexists(repo / "x")


async def test_a_link_whose_directory_leads_outside_is_left(tmp_path):
    """Meanwhile the developer made `out` a link to a directory outside the repository: the agent's
    new link in out/ is left, and nothing is made there."""
    outside = tmp_path / "outside"
    outside.mkdir()
    repo, snapshot, ws, diff = _agent_ran(
        tmp_path, {"a.py": "a\n", "out/x.py": "x\n"}, lambda work: os.symlink("x.py", work / "out/l")
    )
    shutil.rmtree(repo / "out")
    os.symlink(outside, repo / "out")
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.applied == [] and "leads outside" in report.left["out/l"]
    assert os.listdir(outside) == []


async def test_links_the_developer_changed_meanwhile_are_left(tmp_path):
    """The rule for files holds for links: anything at the path other than the snapshot had (a link
    retargeted or removed, a file edited or made) is left and named; the same link on both sides
    is applied."""

    def change(work: Path) -> None:
        for rel, to in [("cfg", "b.py"), ("f.txt", "a.py"), ("n", "a.py"), ("same", "a.py"), ("gone", "b.py")]:
            (work / rel).unlink(missing_ok=True)
            os.symlink(to, work / rel)
        (work / "del").unlink()
        (work / "l2f").unlink()
        (work / "l2f").write_text("agent's file\n")

    files = {"a.py": "a\n", "b.py": "b\n", "c.py": "c\n", "cfg": "-> a.py", "f.txt": "f\n", "gone": "-> a.py",
             "del": "-> a.py", "l2f": "-> a.py"}  # fmt: skip
    repo, snapshot, ws, diff = _agent_ran(tmp_path, files, change)
    (repo / "cfg").unlink()
    os.symlink("c.py", repo / "cfg")  # retargeted
    (repo / "f.txt").write_text("f, edited\n")  # edited
    (repo / "n").write_text("the developer's n\n")  # made
    os.symlink("a.py", repo / "same")  # the agent's very link
    (repo / "gone").unlink()  # removed
    (repo / "del").unlink()
    os.symlink("c.py", repo / "del")  # retargeted, where the agent removed it
    (repo / "l2f").unlink()
    os.symlink("c.py", repo / "l2f")  # retargeted, where the agent made a file
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.applied == ["same"]
    assert sorted(report.left) == ["cfg", "del", "f.txt", "gone", "l2f", "n"]
    assert all("changed in" in why for why in report.left.values())
    assert _links(repo) == {"cfg": "c.py", "del": "c.py", "l2f": "c.py", "same": "a.py"}
    assert (repo / "f.txt").read_text() == "f, edited\n" and (repo / "n").read_text() == "the developer's n\n"


async def test_a_link_never_replaces_a_directory_the_diff_does_not_empty(tmp_path):
    """The agent replaced `d` and `e` by links. `d` still holds a file the developer added meanwhile
    and `e` ignored __pycache__: both stay directories, with those, and the links are left; `f`,
    emptied by the diff, becomes the link."""

    def change(work: Path) -> None:
        for name in ("d", "e", "f"):
            shutil.rmtree(work / name)
            os.symlink("sub", work / name)

    files = {"d/a.py": "a\n", "e/b.py": "b\n", "e/__pycache__/b.pyc": "c", "f/c.py": "c\n", "sub/s.py": "s\n"}
    repo, snapshot, ws, diff = _agent_ran(tmp_path, files, change)
    (repo / "d/mine.py").write_text("the developer's\n")
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert sorted(report.left) == ["d", "e"] and all("still holds files" in why for why in report.left.values())
    assert sorted(report.applied) == ["d/a.py", "e/b.py", "f", "f/c.py"]
    assert sorted(walk_files(repo / "d")) == ["mine.py"] and sorted(walk_files(repo / "e")) == ["__pycache__/b.pyc"]
    assert os.readlink(repo / "f") == "sub" and (repo / "sub/s.py").read_text() == "s\n"


async def test_a_link_is_written_over_a_link_never_through_it(tmp_path):
    """Without a snapshot to compare with, the repository's `l` is a link to a file outside: the
    agent's link replaces the link itself, and the file outside is not touched."""
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")

    def change(work: Path) -> None:
        (work / "l").unlink()
        os.symlink("a.py", work / "l")

    repo, _, ws, diff = _agent_ran(tmp_path, {"a.py": "a\n", "l": f"-> {victim}"}, change)
    report = await export_changes(ws, diff, repo)
    assert report.applied == ["l"] and os.readlink(repo / "l") == "a.py"
    assert victim.read_text() == "untouched\n" and not victim.is_symlink()
    assert [n for n in os.listdir(repo) if "vivace" in n] == []  # no temporary name left behind


async def test_special_files_are_still_left(tmp_path):
    """A fifo the agent put where a file was: the diff shows the file removed (a diff has no fifos), and
    the file is left, not removed, with why."""

    def change(work: Path) -> None:
        (work / "fifo").unlink()
        os.mkfifo(work / "fifo")
        os.symlink("a.py", work / "l")

    repo, snapshot, ws, diff = _agent_ran(tmp_path, {"a.py": "a\n", "fifo": "f\n"}, change)
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.applied == ["l"] and list(report.left) == ["fifo"]
    assert "special file" in report.left["fifo"] and "cannot be carried over" in report.left["fifo"]
    assert (repo / "fifo").read_text() == "f\n"


async def test_a_workspace_that_cannot_read_a_link_leaves_it(tmp_path):
    repo, snapshot, ws, diff = _agent_ran(tmp_path, {"a.py": "a\n"}, lambda work: os.symlink("a.py", work / "l"))
    report = await export_changes(_RemoteLike(ws.fs.root), diff, repo, base=snapshot)
    assert report.applied == [] and "cannot say where it points" in report.left["l"]
    assert not os.path.lexists(repo / "l")


async def test_links_made_in_a_real_workspace_are_applied(tmp_path, state_dir):
    """End to end on the plain backend: a command makes the links, the workspace diffs them, and the
    apply writes the inside ones and leaves the others."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _tree(repo, {"a.py": "a\n", "pkg/m.py": "m\n"})
    backend = make_backend("plain", state_dir)
    try:
        ws = await backend.create(backend.snapshot(str(repo)))
        await ws.exec("ln -s ../a.py pkg/alias.py && ln -s /workspace/a.py abs.py && ln -s ../../.. up")
        diff = await ws.diff()
        report = await export_changes(ws, diff, repo, base=ws.snapshot.root)
    finally:
        await backend.aclose()
    assert report.applied == ["pkg/alias.py"] and sorted(report.left) == ["abs.py", "up"]
    assert os.readlink(repo / "pkg/alias.py") == "../a.py" and (repo / "pkg/alias.py").read_text() == "a\n"


def test_agent_apply_carries_inside_links_and_names_the_rest(tmp_path, state_dir):
    """`vivace agent --apply` as a user runs it: the inside link is written, the absolute and the
    escaping one are named with why, and the exit is 1."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _tree(repo, {"a.py": "a\n", "pkg/m.py": "m\n"})
    command = "ln -s ../a.py pkg/alias.py && ln -s /workspace/a.py abs.py && ln -s ../x out"
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"tool_calls": [{"name": "run_terminal_cmd", "arguments": {"command": command}}]},
                                  {"content": "Linked."}]))  # fmt: skip
    args = ["--repo", str(repo), "--model", f"scripted:replay:{script}", "--backend", "plain"]
    result = CliRunner().invoke(app, ["agent", "link", *args, "--state-dir", str(state_dir), "--apply"])
    assert result.exit_code == 1, result.output
    output = " ".join(result.output.split())
    assert "applied 1 of 3 paths" in output and "absolute path /workspace/a.py" in output
    assert "out: a symlink to ../x, which climbs out of" in output
    assert _links(repo) == {"pkg/alias.py": "../a.py"}


async def test_a_directory_replaced_by_a_link_to_one_with_the_same_names_is_replaced(tmp_path):
    """d -> other, where other/x.py exists too: the diff read d/x.py through the link (changed to
    other/x.py's content), so the apply wrote that content into the real d/x.py and then left `d`
    as "a directory that holds files". Now d/x.py is deleted and d becomes the link, as git has it."""

    def change(work: Path) -> None:
        shutil.rmtree(work / "d")
        (work / "other").mkdir()
        (work / "other/x.py").write_text("other\n")
        os.symlink("other", work / "d")

    repo, snapshot, ws, diff = _agent_ran(tmp_path, BASE, change)
    report = await export_changes(ws, diff, repo, base=snapshot)
    assert report.left == {} and sorted(report.applied) == ["d", "d/x.py", "other/x.py"]
    assert os.readlink(repo / "d") == "other" and (repo / "d/x.py").read_text() == "other\n"
