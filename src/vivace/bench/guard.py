"""What is taken out of a task's test run so that the reward cannot be raised without the fix.

Correctness is also the RL reward, and a policy finds what raises it without fixing the code.
So, before the hidden tests run (`guard_runner`, one command in the workspace), what would take
pytest's place or its judgement without being the code under test is taken away, and the score's
details say what was, so that a reviewer sees a policy that tried:
- modules the agent added that shadow installed ones (a `pytest.py` or `argparse.py` that
  `python -m pytest` would import from the working directory, or a `pytest` symlink to a package
  of its own), that take the name of a standard module of another platform or a package the
  standard library tries (`msvcrt`, Jython's `org`: tried at startup, and run before any test), or
  that Python runs at startup (`sitecustomize.py`), set aside for the test run:
  `runner_files_set_aside` (a scratch `test.py` is one: the standard library has a `test`);
- the agent's edits to pytest's configuration files (`addopts = -p PLUGIN`), undone for the test
  run (they do not count as edited tests): `pytest_config_undone`;
- every bytecode file, which diffs leave out and Python or pytest's rewrite cache load in place of
  the source the diff shows, wherever it is and whatever it is (a symlink too), and every
  `__pycache__` that is a symlink (to a directory of forged caches): `bytecode_removed`.
The patches are applied and undone with a git that reads no repository or configuration of the
workspace's (SAFE_GIT): the agent can make a `.git` there, and a filter in its configuration would
run during scoring.
`unguard_runner` puts back the first two after the run, so the rest of scoring sees the workspace
as the agent left it. Outcomes come only from pytest's own final summary (tasks.testrun), not from
anything the code printed.

What stays possible: the code under test runs inside the test process, so it can in principle
forge any report there: patch pytest's objects, or write a complete summary (header, PASSED lines,
final count) to the saved stdout or at exit. Tests that read data files outside test directories
can be satisfied by editing those files; a new file that the repository's own ignore rules match is
left out of the diff (sandbox/diff.py), so a shadowing module there is not seen (the workspace's git
cannot say it is new: the agent can change it); with plugin autoload on (not vivace's tasks), a plugin
can be registered from distribution metadata in the working directory. These defenses close the
cheap holes a policy stumbles on, not a determined forger's.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex

from vivace.bench.patch import FileChange, is_test_path
from vivace.sandbox.base import Workspace

_CONFIG_PATCH = ".vivace-pytest-config.patch"
# Where pytest finds its configuration, by file name (pytest.toml since pytest 9).
_PYTEST_CONFIG = ("pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "pyproject.toml", "tox.ini", "setup.cfg")
# git for the scorer's patches: no repository (a `.git` the agent made, with a filter that runs a
# command, is not read), no configuration but the command line's.
SAFE_GIT = "GIT_DIR=/nonexistent GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null git"
_SECTION = "--vivace-shadows--"
_NEW_MODULES = ".vivace-new-modules.json"
_ASIDE = ".vivace-aside"  # a shadowing module's name during the test run: no module's
# Run in the workspace with the test command's interpreter, isolated (-I: neither the working
# directory nor PYTHONPATH on sys.path, so no module of the agent's runs in it): of the agent's new
# files (a JSON list in the file argv[1]; symlinks too), those that make a module found first in a
# directory of the workspace on the test run's sys.path (the working directory first, `python -m
# pytest`; PYTHONPATH; a .pth) that is also installed outside it, a standard module of any platform
# or a package the standard library tries (they import before any test runs), or that Python
# imports at startup, are renamed (_ASIDE) and printed. Shadowing one is never a fix.
_SHADOWS = """
import importlib.machinery as m, importlib.util as u, json, os, sys
root = os.path.realpath(".")
def inside(p):
    p = os.path.realpath(p or ".")
    return p == root or p.startswith(root + os.sep)
paths = ["."] + os.environ.get("PYTHONPATH", "").split(os.pathsep) + sys.path
dirs = sorted({os.path.relpath(os.path.realpath(p or "."), root) for p in paths if inside(p)})
sys.path[:] = [p for p in sys.path if not inside(p)]
with open(sys.argv[1]) as f:
    new = set(json.load(f))
os.unlink(sys.argv[1])
ASIDE = sys.argv[2]
for d in dirs:
    pre = "" if d == "." else d + "/"
    for top in sorted({p[len(pre):].split("/")[0] for p in new if p.startswith(pre)}):
        name = top.split(".")[0]
        spec = m.PathFinder.find_spec(name, [os.path.join(root, d)]) if name.isidentifier() else None
        if spec is None:
            continue
        # The agent's module: the entry itself is new (a file, or a symlink to a directory), or the
        # file it loads from is, or a namespace package holds new files.
        origin = os.path.relpath(spec.origin, root) if spec.origin else None
        if not (pre + top in new or origin in new or (origin is None and any(p.startswith(pre + top + "/") for p in new))):
            continue
        try:
            installed = u.find_spec(name) is not None
        except (ImportError, ValueError):
            installed = False
        if installed or name in sys.stdlib_module_names or name in ("sitecustomize", "usercustomize", "org", "java"):
            for p in sorted(x for x in new if x == pre + top or x.startswith(pre + top + "/")):
                if os.path.lexists(p):
                    os.replace(p, p + ASIDE)
                    print(p)
"""


def is_pytest_config(path: str) -> bool:
    """A file pytest may read its configuration from (addopts, plugins to load, what to collect)."""
    return posixpath.basename(path) in _PYTEST_CONFIG


async def guard_runner(ws: Workspace, agent: list[FileChange], command: str) -> dict[str, list[str]]:
    """Takes out of the test run what would run in place of pytest or its judgement and is not the
    code under test; says what it took, so a reviewer sees a policy that tried (module docstring).
    One command in the workspace: the agent's pytest configuration edits undone and the modules the
    agent added that shadow installed ones (pytest, the standard library) or run at startup
    (sitecustomize) set aside, both until the run is over (unguard_runner), and every bytecode
    file removed. Returns the score details; give them to unguard_runner after the run."""
    # Test files among them (a tests/setup.cfg) were undone with the other test edits already.
    config = [c for c in agent if is_pytest_config(c.path) and not is_test_path(c.path)]
    if config:
        await ws.write_text(_CONFIG_PATCH, "".join(c.text for c in config))
    new = sorted(c.path for c in agent if c.new_file and not c.deleted)
    steps = [f"{SAFE_GIT} apply -R --unsafe-paths {_CONFIG_PATCH} || exit 3"] if config else []
    # Bytecode is invisible in diffs (diff_ignore) and imports without its source (a `pytest.pyc`),
    # instead of it (an unchecked-hash pyc) or instead of a test (pytest's rewrite cache): the
    # source in the diff is what is judged. No directory is spared: one named `.git` or
    # `site-packages` can be the agent's, behind a symlinked `__pycache__` or package.
    steps.append(r"find . \( -name __pycache__ -type l -o -name '*.pyc' ! -type d \) -print -exec rm -f {} +")
    if new:  # listed in a file: thousands of paths would pass the kernel's limit on one argument
        await ws.write_text(_NEW_MODULES, json.dumps(new))
        python = _python_of(command)
        steps.append(f"echo {_SECTION}; {python} -I -c {shlex.quote(_SHADOWS)} {_NEW_MODULES} {_ASIDE}")
    done = await ws.exec("\n".join(steps))
    if done.exit_code == 3 and config:
        raise RuntimeError(f"could not undo the agent's pytest configuration edits: {done.stderr.strip()}")
    pyc, _, shadows = done.stdout.partition(_SECTION + "\n")
    removed = [line.removeprefix("./") for line in pyc.splitlines() if line]
    return {
        "runner_files_set_aside": [line for line in shadows.splitlines() if line],
        "pytest_config_undone": [c.path for c in config],
        "bytecode_removed": removed[:20] + ([f"... and {len(removed) - 20} more"] if len(removed) > 20 else []),
    }


async def unguard_runner(ws: Workspace, guarded: dict[str, list[str]]) -> None:
    """Puts back what guard_runner (which returned `guarded`) took for the test run only: the rest of
    scoring (adherence's lint reads ruff's configuration and the agent's files) sees the workspace
    as the agent left it."""
    aside = guarded["runner_files_set_aside"]
    steps = [f"mv -f -- {shlex.quote(p + _ASIDE)} {shlex.quote(p)} || true" for p in aside]
    if guarded["pytest_config_undone"]:
        steps.append(f"{SAFE_GIT} apply --unsafe-paths {_CONFIG_PATCH}; rc=$?; rm -f {_CONFIG_PATCH}; exit $rc")
    if steps and (done := await ws.exec("\n".join(steps))).exit_code != 0:
        raise RuntimeError(f"could not restore the agent's pytest configuration edits: {done.stderr.strip()}")


def _python_of(command: str) -> str:
    """The interpreter the test command starts (`python3.11 -m pytest`), else `python`."""
    first = (command.split() or ["python"])[0]
    return shlex.quote(first) if re.search(r"python[\d.]*$", posixpath.basename(first)) else "python"
