"""`vivace agent` and `vivace tools` as a user runs them: the repo changes only with --apply,
and then it holds exactly the diff the agent made."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ISOLATION_PROBLEM, unprivileged
from vivace.cli import app
from vivace.sandbox.diff import changed_paths, tree_diff, walk_files
from vivace.sandbox.local import LocalWorkspace
from vivace.sandbox.process import default_signals

BACKEND = "plain" if ISOLATION_PROBLEM else "isolated"

SCRIPT = [
    {
        "content": "Looking first.",
        "tool_calls": [
            {"name": "read_file", "arguments": {"path": "pkg/calc.py"}},
            {"name": "list_dir", "arguments": {"path": "pkg"}},
        ],
    },
    {
        "tool_calls": [
            {"name": "edit_file", "arguments": {"path": "pkg/calc.py", "old_string": "a - b", "new_string": "b - a"}},
            {"name": "write_file", "arguments": {"path": "pkg/new.py", "content": "X = 1\n"}},
            {"name": "delete_file", "arguments": {"path": "README.md"}},
        ]
    },
    {"content": "Changed sub, added pkg/new.py, removed the README."},
]


@pytest.fixture
def setup(repo, tmp_path, state_dir):
    work = tmp_path / "repo"
    shutil.copytree(repo, work, symlinks=True)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    args = ["--repo", str(work), "--model", f"scripted:replay:{script}", "--backend", BACKEND]
    return work, args + ["--state-dir", str(state_dir)]


def snapshot(root) -> dict[str, bytes]:
    return {p: (root / p).read_bytes() for p in walk_files(root) if not (root / p).is_symlink()}


def test_agent_shows_the_diff_and_leaves_the_repo_untouched(setup):
    work, args = setup
    before = snapshot(work)
    result = CliRunner().invoke(app, ["agent", "fix sub", *args])
    assert result.exit_code == 0, result.output
    assert "→ read_file" in result.output and "→ edit_file" in result.output
    assert "+    return b - a" in result.output and "deleted file mode" in result.output
    assert "Changed sub" in result.output and "stopped: done" in result.output
    assert "is unchanged" in " ".join(result.output.split())  # wrapped where the path ends, which varies
    assert snapshot(work) == before


def test_agent_apply_writes_exactly_the_diff(setup, tmp_path):
    work, args = setup
    original = tmp_path / "original"
    shutil.copytree(work, original, symlinks=True)
    result = CliRunner().invoke(app, ["agent", "fix sub", *args, "--apply", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["applied"] and report["not_applied"] == {} and report["merged"] == []
    assert report["sandbox"] == {"backend": BACKEND, "isolated": BACKEND == "isolated"}  # a saved result says so
    diff = report["trajectory"]["diff"]
    assert "pkg/new.py" in diff and "README.md" in diff
    candidates = set(walk_files(original)) | set(walk_files(work))
    assert tree_diff(original, work, candidates) == diff
    assert not (work / "README.md").exists() and (work / "pkg/new.py").read_text() == "X = 1\n"


def test_agent_json_says_when_it_ran_unisolated(setup):
    work, args = setup
    plain = [a if a != BACKEND else "plain" for a in args]
    result = CliRunner().invoke(app, ["agent", "fix sub", *plain, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sandbox"] == {"backend": "plain", "isolated": False}


def test_agent_bad_inputs(setup, tmp_path):
    work, args = setup
    result = CliRunner().invoke(app, ["agent", "x", "--repo", str(tmp_path / "nope"), "--model", "scripted:null"])
    assert result.exit_code == 2 and "not a directory" in result.output
    result = CliRunner().invoke(app, ["agent", "x", "--repo", str(work), "--model", "gpt-9"])
    assert result.exit_code == 2 and "valid forms" in result.output


def test_tools_lists_schemas():
    result = CliRunner().invoke(app, ["tools", "--json"])
    assert result.exit_code == 0
    schemas = json.loads(result.stdout)
    names = [s["function"]["name"] for s in schemas]
    assert names[:2] == ["read_file", "edit_file"] and "run_terminal_cmd" in names and len(names) == 11
    for s in schemas:
        assert s["function"]["parameters"]["type"] == "object" and s["function"]["description"]
    table = CliRunner().invoke(app, ["tools"], env={"COLUMNS": "400"})
    assert table.exit_code == 0 and "grep" in table.output
    assert "`[abc]`" in table.output  # the glob tool's own text, not eaten as rich markup


def test_only_ignored_output_is_no_change_to_apply(setup, tmp_path):
    """Build output the repository's .gitignore ignores is left out of the diff; a run that made
    nothing else has nothing to apply, and says nothing about applying."""
    import subprocess

    work, args = setup
    (work / ".gitignore").write_text("build/\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=work, check=True)
    script = tmp_path / "build.json"
    command = "mkdir -p build && echo o > build/out.o"
    script.write_text(json.dumps([{"tool_calls": [{"name": "run_terminal_cmd", "arguments": {"command": command}}]},
                                  {"content": "Built."}]))  # fmt: skip
    args[args.index("--model") + 1] = f"scripted:replay:{script}"
    before = snapshot(work)
    result = CliRunner().invoke(app, ["agent", "build", *args, "--apply"])
    assert result.exit_code == 0, result.output
    assert "1 new file left out" in " ".join(result.output.split()) and "applied to" not in result.output
    assert snapshot(work) == before


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_keeps_what_the_agent_did_so_far(setup, tmp_path, as_json):
    """Ctrl-C during a command kills it and shows the changes made so far instead of losing them; even
    with --apply they are applied only after a yes (not here: no terminal), and the exit is 130."""
    work, args = setup
    script = tmp_path / "slow.json"
    marker = f"sleep {60 + os.getpid() % 1000 / 1000:.3f}"  # unique on this machine
    slow = {"name": "run_terminal_cmd", "arguments": {"command": f"echo partial > half.py; {marker}"}}
    script.write_text(json.dumps([{"tool_calls": [slow]}, {"content": "never reached"}]))
    args[args.index("--model") + 1] = f"scripted:replay:{script}"
    before = snapshot(work)
    argv = [sys.executable, "-c", "from vivace.cli import main; main()", "agent", "go", *args, "--apply"]
    # As from a terminal: default signal handling, whatever ran the tests.
    proc = subprocess.Popen([*default_signals(), *argv, *(["--json"] if as_json else [])], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not _running(marker) and time.monotonic() < deadline:  # the command has started
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert snapshot(work) == before and not _running(marker)
    if as_json:
        report = json.loads(out)
        assert report["interrupted"] and not report["applied"] and "+partial" in report["diff"]
    else:
        assert "interrupted" in out and "+partial" in out and "applied only after a yes" in out


def test_ctrl_c_while_the_snapshot_is_taken_stops_at_once(setup, state_dir, monkeypatch):
    """A big repository's first snapshot takes seconds; a Ctrl-C then stops it there (exit 130, no
    half-built snapshot left in the cache) instead of being noticed after it, or lost."""
    import vivace.sandbox.snapshot as snapshot_mod

    work, args = setup
    copy_dir = snapshot_mod._copy_dir

    def interrupted(*a, **kw):  # the Ctrl-C lands in the middle of the copy
        signal.raise_signal(signal.SIGINT)
        return copy_dir(*a, **kw)

    monkeypatch.setattr(snapshot_mod, "_copy_dir", interrupted)
    before = snapshot(work)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
    try:
        result = CliRunner().invoke(app, ["agent", "go", *args, "--apply"])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.exit_code == 130, result.output
    assert "unchanged" in result.output and "stopped: done" not in result.output
    assert snapshot(work) == before
    assert not [p.name for p in (state_dir / "snapshots").iterdir() if ".tmp-" in p.name]


def test_ctrl_d_at_the_prompt_is_a_no(setup):
    """From a terminal the agent asks before applying; Ctrl-D (end of input) there answers no, as
    `n` does: the repository is unchanged and says so, exit 0, not click's "Aborted!" and 1."""
    import pty

    work, args = setup
    before = snapshot(work)
    main, tty = pty.openpty()
    argv = [sys.executable, "-c", "from vivace.cli import main; main()", "agent", "go", *args]
    try:
        proc = subprocess.Popen(argv, stdin=tty, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        os.write(main, b"\x04")  # the terminal's end of input, read when the prompt asks
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(main)
        os.close(tty)
    out = " ".join(out.split())  # wrapped where the path ends, which varies
    assert "Apply these changes" in out, out
    assert proc.returncode == 0 and "is unchanged" in out and "Aborted" not in out, out
    assert snapshot(work) == before


def _running(cmdline: str) -> bool:
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().replace(b"\0", b" ").strip() == cmdline.encode():
                return True
        except OSError:
            pass
    return False


def _plain(args: list[str]) -> list[str]:
    """`args` on the plain backend, whose commands can reach the repository as the developer does."""
    args = list(args)
    args[args.index("--backend") + 1] = "plain"
    return args


def test_apply_says_what_it_merged_and_what_it_left(setup, tmp_path):
    """While the agent runs, the developer edits the first line of calc.py (the agent edits the last)
    and the README (which the agent deletes): the apply merges the one, leaves the other, and says so."""
    work, args = setup
    developer = (
        f"sed -i 's/^def add(a, b):$/def add(a, b):  # mine/' {work}/pkg/calc.py && echo mine >> {work}/README.md"
    )
    script = tmp_path / "meanwhile.json"
    edits = SCRIPT[1]["tool_calls"] + [{"name": "run_terminal_cmd", "arguments": {"command": developer}}]
    script.write_text(json.dumps([{"tool_calls": edits}, {"content": "Done."}]))
    args = _plain(args)
    args[args.index("--model") + 1] = f"scripted:replay:{script}"
    result = CliRunner().invoke(app, ["agent", "fix sub", *args, "--apply"], env={"COLUMNS": "300"})
    assert result.exit_code == 1, result.output  # a path left: `--apply && git commit` must not go on
    out = " ".join(result.output.split())
    assert "applied 2 of 3 paths" in out and "README.md: changed in" in out
    assert "merged with the changes made there while the agent ran: pkg/calc.py" in out
    calc = (work / "pkg/calc.py").read_text()
    assert "def add(a, b): # mine" in " ".join(calc.split()) and "return b - a" in calc
    assert (work / "README.md").read_text() == "# demo\nmine\n" and (work / "pkg/new.py").exists()


def test_a_diff_that_fails_is_an_error_never_no_changes(setup, monkeypatch):
    """The episode's diff raised (RecursionError, on a tree 1,100 levels deep): the agent printed
    "(no changes)" and exited 0 with --apply, and the agent's edits were lost without a word."""
    work, args = setup
    before = snapshot(work)

    async def diff(self):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(LocalWorkspace, "diff", diff)
    result = CliRunner().invoke(app, ["agent", "fix sub", *args, "--apply"], env={"COLUMNS": "300"})
    assert result.exit_code == 1, result.output
    assert "(no changes)" not in result.output and "could not be computed" in result.output
    assert "error: could not compute the workspace diff: RecursionError" in result.output
    result = CliRunner().invoke(app, ["agent", "fix sub", *args, "--apply", "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout.splitlines()[0])
    assert report["trajectory"]["diff_failed"] and not report["applied"]
    assert snapshot(work) == before


def test_ctrl_c_while_applying_says_what_was_written(setup, monkeypatch):
    """A Ctrl-C in the middle of applying stops between two files: the paths written so far are named
    (not "unchanged"), and the rest of the diff is not applied."""
    work, args = setup
    real_diff, real_read, reads = LocalWorkspace.diff, LocalWorkspace.read_bytes, []

    async def diff(self):  # the episode's last call before the apply
        reads.append("applying")
        return await real_diff(self)

    async def read_bytes(self, path):
        if reads:
            reads.append(path)
        if len(reads) == 3:  # the apply's second file: Ctrl-C
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(10)
        return await real_read(self, path)

    monkeypatch.setattr(LocalWorkspace, "diff", diff)
    monkeypatch.setattr(LocalWorkspace, "read_bytes", read_bytes)
    result = CliRunner().invoke(app, ["agent", "fix sub", *_plain(args), "--apply"], env={"COLUMNS": "300"})
    assert result.exit_code == 130, result.output
    assert "is unchanged" not in result.output and "stopped while applying" in result.output
    written = result.output.split("before the stop:")[1].split("the rest of the diff")[0].split()
    assert written == ["README.md", "pkg/calc.py"] and "the rest of the diff above is not applied" in result.output
    assert not (work / "README.md").exists() and "b - a" in (work / "pkg/calc.py").read_text()
    assert not (work / "pkg/new.py").exists()


# -- repositories as developers have them ------------------------------------------------------
def _git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout


def _replay(tmp_path: Path, *commands: str) -> str:
    """A replay of an agent that reads and edits pkg/calc.py, then runs `commands`."""
    turns = [SCRIPT[0], {"tool_calls": [SCRIPT[1]["tool_calls"][0]]}]
    turns += [{"tool_calls": [{"name": "run_terminal_cmd", "arguments": {"command": c}}]} for c in commands]
    script = tmp_path / "turns.json"
    script.write_text(json.dumps([*turns, {"content": "Done."}]))
    return f"scripted:replay:{script}"


def _tool_results(report: dict) -> list[str]:
    return [call["result"] for turn in report["trajectory"]["turns"] for call in turn["tool_calls"]]


@pytest.mark.parametrize("backend", sorted({"plain", BACKEND}))
@pytest.mark.parametrize("apply", [False, True])
def test_agent_in_a_git_worktree(repo, tmp_path, state_dir, backend, apply):
    """In a linked worktree (`.git` a file naming main/.git/worktrees/wt), git in the sandbox failed
    ("fatal: not a git repository: .../main/.git/worktrees/wt") or, on the plain backend, worked on
    the real repository: `git status` rewrote the worktree's real index, `git add` staged into it.
    Now the snapshot has the worktree's git directory of its own."""
    main = tmp_path / "main"
    shutil.copytree(repo, main, symlinks=True)
    (main / ".gitignore").write_text("build/\n")
    _git(main, "init", "-q")
    _git(main, "add", "-A")
    _git(main, "commit", "-qm", "base")
    (main / ".git/info/exclude").write_text("*.log\n")
    _git(main, "worktree", "add", "-q", "-b", "feature", str(tmp_path / "wt"))
    wt = tmp_path / "wt"
    real = {p: p.read_bytes() for p in (main / ".git").rglob("*") if p.is_file()}
    before = snapshot(wt)
    model = _replay(tmp_path, "git status --short --branch && git add -A && mkdir build && touch build/o x.log")
    argv = ["agent", "fix", "--repo", str(wt), "--model", model, "--backend", backend, "--state-dir", str(state_dir)]
    result = CliRunner().invoke(app, [*argv, "--json", *(["--apply"] if apply else [])])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    shown = _tool_results(report)[-1].splitlines()
    assert shown[2:4] == ["## feature", " M pkg/calc.py"], shown  # the worktree's branch and index
    diff = report["trajectory"]["diff"]
    assert changed_paths(diff) == ["pkg/calc.py"] and diff.startswith("# 2 new files left out")  # build/, x.log
    assert {p: p.read_bytes() for p in (main / ".git").rglob("*") if p.is_file()} == real
    if apply:
        assert _git(wt, "status", "--short") == " M pkg/calc.py\n"
        assert "return b - a" in (wt / "pkg/calc.py").read_text()
    else:
        assert snapshot(wt) == before


def test_agent_with_paths_it_cannot_read(setup, tmp_path):
    """A file and a directory the developer cannot read (a container's output, say) stopped the run
    with a shutil.Error traceback. They are left out of the agent's copy, and named; an agent that
    then writes those paths finds --apply leaving them, named (it was a PermissionError traceback)."""
    work, args = setup
    (work / "locked").mkdir()
    (work / "locked/inner.txt").write_text("theirs\n")
    (work / "secret.txt").write_text("theirs\n")
    args[args.index("--model") + 1] = _replay(
        tmp_path, "echo mine > secret.txt && mkdir locked && echo mine > locked/inner.txt"
    )
    argv = [sys.executable, "-c", "from vivace.cli import main; main()", "agent", "go", *_plain(args), "--apply"]
    os.chmod(work / "secret.txt", 0)
    os.chmod(work / "locked", 0)
    try:
        done = subprocess.run([*unprivileged(), *argv], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "COLUMNS": "300"})  # fmt: skip
    finally:
        os.chmod(work / "locked", 0o755)
        os.chmod(work / "secret.txt", 0o644)
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1 and "Traceback" not in out, out
    assert "2 path(s) in" in out and "cannot be read and are left out of the agent's copy: locked/, secret.txt" in out
    assert "applied 1 of 3 paths" in out and "locked/inner.txt: not written" in out and "secret.txt: not written" in out
    assert "return b - a" in (work / "pkg/calc.py").read_text()
    assert (work / "secret.txt").read_text() == (work / "locked/inner.txt").read_text() == "theirs\n"


def test_agent_on_a_subdirectory_of_a_repository_says_what_it_lacks(setup, tmp_path):
    """--repo a subdirectory of a git repository: the snapshot has no .git, so git fails inside; that
    was silent. The repository's ignore rules still decide what the diff leaves out (they did not)."""
    work, args = setup
    (work / ".gitignore").write_text("build/\n")
    _git(work, "init", "-q")
    script = tmp_path / "build.json"
    command = {"name": "run_terminal_cmd", "arguments": {"command": "mkdir build && touch build/a.o new.py"}}
    script.write_text(json.dumps([{"tool_calls": [command]}, {"content": "Done."}]))
    args[args.index("--repo") + 1] = str(work / "pkg")
    args[args.index("--model") + 1] = f"scripted:replay:{script}"
    result = CliRunner().invoke(app, ["agent", "build", *args, "--json"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    out = " ".join(result.stderr.split())
    assert f"warning: {work / 'pkg'} is inside the git repository {work}, not its top" in out
    assert f"--repo {work} does not have that problem" in out
    diff = json.loads(result.stdout)["trajectory"]["diff"]
    assert changed_paths(diff) == ["new.py"] and diff.startswith("# 1 new file left out of this diff")
    args[args.index("--repo") + 1] = str(work)
    args[args.index("--model") + 1] = "scripted:null"
    result = CliRunner().invoke(app, ["agent", "nothing", *args])
    assert result.exit_code == 0 and "warning" not in result.output


def test_an_episode_the_endpoint_cut_short_is_not_applied_and_fails(setup, monkeypatch):
    """Turn 2 edited files, then the endpoint failed for good: --apply wrote the half-done diff and
    the run looked applied. An episode cut short is left unapplied (as an interrupted one is), exit 1."""
    from vivace.harness.policies import ReplayPolicy
    from vivace.harness.policy import PolicyError

    work, args = setup
    before = snapshot(work)
    replay = ReplayPolicy.act

    async def failing(self, conversation):
        if sum(m.role == "assistant" for m in conversation.messages) == 2:
            raise PolicyError("fake: the endpoint failed: HTTP 500 (InternalServerError) after 3 attempts")
        return await replay(self, conversation)

    monkeypatch.setattr(ReplayPolicy, "act", failing)
    result = CliRunner().invoke(app, ["agent", "fix sub", *args, "--apply"], env={"COLUMNS": "300"})
    assert result.exit_code == 1, result.output
    assert "the episode was cut short, so --apply left its changes" in result.output
    assert snapshot(work) == before
    result = CliRunner().invoke(app, ["agent", "fix sub", *args, "--apply", "--json"])
    report = json.loads(result.stdout.splitlines()[0])
    assert result.exit_code == 1 and report["trajectory"]["stop_reason"] == "error" and not report["applied"]
    assert snapshot(work) == before


def test_a_wall_clock_stop_waiting_for_the_endpoint_or_a_first_request_refused_is_a_failure():
    """A server that accepts and never answers ran the episode to its wall clock, and one that refused the
    first request as over the context ended it at once: both exited 0."""
    from vivace.cli import cut_short
    from vivace.harness.agent import WAITING_FOR_POLICY
    from vivace.harness.trajectory import Trajectory

    def traj(stop, error=None):
        return Trajectory(
            request="r", policy="p", system_prompt="s", system_prompt_version="1", stop_reason=stop, error=error
        )

    assert cut_short(traj("timeout", f"the episode's wall-clock limit ran out while {WAITING_FOR_POLICY}"))
    assert not cut_short(traj("timeout", "the episode's wall-clock limit ran out while running tools"))
    assert cut_short(traj("error", "x")) and not cut_short(traj("done")) and not cut_short(traj("max_turns"))
    assert cut_short(traj("max_tokens", "the first request does not fit the context"))  # no turn ran


def test_model_text_is_shown_as_written_not_as_emoji(setup, tmp_path):
    """rich read `a[0:x:2]` as an emoji code (`a[0❌2]`), in the model's text and in tool summaries."""
    work, args = setup
    script = tmp_path / "emoji.json"
    script.write_text(json.dumps([{"content": "Use a[0:x:2] and s[i:up:2].",
                                   "tool_calls": [{"name": "run_terminal_cmd", "arguments": {"command": "echo 1:ok:2"}}]},
                                  {"content": "ratio 1:ok:2"}]))  # fmt: skip
    args[args.index("--model") + 1] = f"scripted:replay:{script}"
    result = CliRunner().invoke(app, ["agent", "x", *args], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "a[0:x:2] and s[i:up:2]" in result.output and "1:ok:2" in result.output
    assert "❌" not in result.output and "🆗" not in result.output
