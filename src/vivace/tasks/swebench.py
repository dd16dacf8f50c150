"""SWE-bench-style records as vivace tasks.

A SWE-bench record (one line of the published JSONL datasets, or a dict built the same way)
names a GitHub repository, the commit the issue was filed against, the issue text, the fix
(`patch`), a diff that adds or changes tests (`test_patch`) and the test ids that must go
from failing to passing (`FAIL_TO_PASS`) or keep passing (`PASS_TO_PASS`). `from_swebench`
turns one record plus a local git clone into a `Task`: the repository is the clone at
`base_commit`, the request is the problem statement, the reference patch is the fix, and the
hidden test files are the full contents, after `test_patch`, of every file it adds or
modifies (written fresh into the workspace at scoring, like any task's hidden files).

Why: the same tasks, scorer and training loop then serve both synthetic tasks and real
issues from real repositories.

The records do not say how a repository's tests run (the real harness keeps that per repository
and version): the caller gives a test command, setup commands and environment variables, for all
records or per repository (`RepoRun`, `load_repo_runs`; `vivace tasks swebench --repo-config`).

How the test files are computed: in a throwaway index and object directory (GIT_INDEX_FILE,
GIT_OBJECT_DIRECTORY with the clone's objects as an alternate) the base tree is read and the
test patch applied with `git apply --cached`; the clone's working tree, index, refs and
object store are never written.

Not covered: downloading datasets or cloning repositories (give local clones); the per-
instance Docker environments of the real SWE-bench harness (tests run with the workspace's
Python and whatever the task's `setup` commands install, so instances that need compiled
extensions or old dependency versions may not reproduce); test ids of non-pytest runners
(e.g. Django's `test_x (module.Class)`) need a matching `test_command`; files the test patch
deletes are not removed from the workspace (listed in metadata `test_patch_deleted`), and
non-UTF-8 files it adds are left out (listed in metadata `test_patch_binary`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vivace.bench.patch import parse_patch
from vivace.sandbox.base import check_env
from vivace.tasks.format import Task, TaskFormatError, _validate, problems

REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement", "FAIL_TO_PASS")
KEPT_METADATA = ("version", "environment_setup_commit", "hints_text", "created_at")
log = logging.getLogger(__name__)

_ID_BAD = re.compile(r"[^A-Za-z0-9._+-]+")
# Variables that would make our git calls look at another repository, index or object store.
_GIT_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
)


def from_swebench(
    record: dict[str, Any],
    repo_dir: str | Path,
    *,
    test_command: str | None = None,
    setup: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    split: str | None = None,
) -> Task:
    """The task of one SWE-bench record; `repo_dir` is a local git clone holding `base_commit`.

    The records say nothing of how to run a repository's tests; the real harness keeps that per
    repository and version. `test_command`, `setup` (commands run in the workspace first) and
    `env` (variables of every command in the workspace, e.g. a settings module) say it here, and
    `split` goes into the task's metadata."""
    if not isinstance(record, dict):
        raise TaskFormatError(f"SWE-bench record: must be a JSON object, got {type(record).__name__}")
    raw_id = record.get("instance_id")
    where = f"SWE-bench instance {raw_id!r}" if isinstance(raw_id, str) and raw_id else "SWE-bench record"
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise TaskFormatError(f"{where}: missing field(s) {', '.join(missing)}")
    for key in ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement"):
        if not isinstance(record[key], str):
            raise TaskFormatError(f"{where}: {key}: expected a string, got {type(record[key]).__name__}")
    for key in ("instance_id", "repo", "base_commit", "test_patch", "problem_statement"):
        if not record[key].strip():
            raise TaskFormatError(f"{where}: {key}: must not be empty")
    fail_to_pass = _test_ids(record["FAIL_TO_PASS"], where, "FAIL_TO_PASS")
    pass_to_pass = _test_ids(record.get("PASS_TO_PASS", []), where, "PASS_TO_PASS")
    if not fail_to_pass:
        raise TaskFormatError(f"{where}: FAIL_TO_PASS: must name at least one test")
    task_id = sanitize_id(record["instance_id"])
    if not task_id:
        raise TaskFormatError(f"{where}: instance_id: no usable characters for a task id")

    repo = _check_repo(Path(repo_dir), where)
    base = record["base_commit"].strip()
    found = _git(repo, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}")
    if base.startswith("-") or found.returncode != 0:
        raise TaskFormatError(f"{where}: base_commit: {base!r} is not a commit of the repository {repo}")
    commit = found.stdout.decode().strip()  # a ref (HEAD, a branch) would move on with the clone, and the task with it
    files, deleted, binary = _test_files(repo, commit, record["test_patch"], where)
    if overlap := sorted(set(files) & {change.path for change in parse_patch(record.get("patch") or "")}):
        raise TaskFormatError(f"{where}: test_patch and patch both change {', '.join(overlap)}: the hidden test files "
                              "are written whole over the workspace when it is scored, undoing the fix there; leave "
                              "this record out, or move its test changes out of those files")  # fmt: skip

    metadata: dict[str, Any] = {"kind": "swebench", "repo": record["repo"], "instance_id": record["instance_id"]}
    if base != commit:
        metadata["base_commit"] = base  # as the record gave it
    metadata.update({k: record[k] for k in KEPT_METADATA if record.get(k) not in (None, "")})
    if deleted:
        metadata["test_patch_deleted"] = deleted
    if binary:
        metadata["test_patch_binary"] = binary
    if split is not None:
        metadata["split"] = split
    tests: dict[str, Any] = {"fail_to_pass": fail_to_pass, "pass_to_pass": pass_to_pass, "files": files}
    if test_command is not None:
        tests["command"] = test_command
    data = {
        "id": task_id,
        "repo": {"path": str(repo), "commit": commit},
        "request": record["problem_statement"],
        "tests": tests,
        "reference_patch": record["patch"],
        "setup": list(setup),
        "env": dict(env or {}),
        "metadata": metadata,
    }
    return _validate(data, where, None)


class RepoRun(BaseModel):
    """How one repository's tests run: what a SWE-bench harness keeps per repository."""

    model_config = ConfigDict(extra="forbid")
    test_command: str | None = None
    setup: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env)


def load_repo_runs(path: str | Path) -> dict[str, RepoRun]:
    """A JSON object from "owner/name" to a RepoRun ({"test_command", "setup", "env"})."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as e:
        raise TaskFormatError(f"{p}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise TaskFormatError(f"{p}: invalid JSON: {e}") from None
    if not isinstance(data, dict):
        raise TaskFormatError(f'{p}: expected an object from "owner/name" to its test command, setup and env')
    runs: dict[str, RepoRun] = {}
    for repo, spec in data.items():
        try:
            runs[repo] = RepoRun.model_validate(spec)
        except ValidationError as e:
            raise TaskFormatError(f"{p}: {repo}: {problems(e, 'value')}") from None
    return runs


def _with_repo_run(options: dict[str, Any], run: RepoRun | None) -> dict[str, Any]:
    """The common options, then the repository's: its setup runs after the common setup, its
    variables and test command win."""
    if run is None:
        return options
    merged = {**options, "setup": [*options.get("setup", ()), *run.setup],
              "env": {**(options.get("env") or {}), **run.env}}  # fmt: skip
    if run.test_command is not None:
        merged["test_command"] = run.test_command
    return merged


def load_swebench_jsonl(
    path: str | Path,
    repo_dirs: Mapping[str, str | Path] | str | Path,
    *,
    repo_runs: Mapping[str, RepoRun] | None = None,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> list[Task]:
    """Tasks from a SWE-bench JSONL file. `repo_dirs` maps each record's `repo` ("owner/name") to
    its clone, or is one directory holding clones named `owner__name` or `name`. `options` are
    `from_swebench`'s keywords, the same for every record; `repo_runs` adds each repository's own
    (`_with_repo_run`); `progress(done, total)` is called after each record."""
    p = Path(path)
    try:
        # utf-8-sig: a byte-order mark (Windows editors, PowerShell) is dropped. Not splitlines(): U+2028 may
        # sit inside a string.
        lines = p.read_text(encoding="utf-8-sig").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskFormatError(f"{p}: cannot read: {e}") from None
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    total = sum(1 for line in lines if line.strip())
    # GitHub's names are case-insensitive: "acme/Calc" in the config is repo "acme/calc" of the records
    runs = {name.lower(): run for name, run in (repo_runs or {}).items()}
    unused = {name.lower(): name for name in repo_runs or {}}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p}:{n}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{where}: invalid JSON: {e}") from None
        try:
            if not isinstance(record, dict):
                raise TaskFormatError(f"SWE-bench record: must be a JSON object, got {type(record).__name__}")
            if not isinstance(record.get("repo"), str) or not record["repo"]:
                raise TaskFormatError("SWE-bench record: repo: missing or not a string")
            repo = record["repo"]
            unused.pop(repo.lower(), None)
            task = from_swebench(record, _clone_for(repo, repo_dirs), **_with_repo_run(options, runs.get(repo.lower())))
        except TaskFormatError as e:
            raise TaskFormatError(f"{where}: {e}") from None
        if task.id in seen:
            raise TaskFormatError(f"{where}: duplicate task id {task.id!r} (first on line {seen[task.id]})")
        seen[task.id] = n
        tasks.append(task)
        if progress is not None:
            progress(len(tasks), total)
    if unused:  # a typo would run the default test command without a word
        log.warning("the repository config names %s, which no record of %s is from", ", ".join(unused.values()), p)
    return tasks


def sanitize_id(instance_id: str) -> str:
    """`instance_id` with every run of characters a task id cannot hold replaced by '-'."""
    return _ID_BAD.sub("-", instance_id.strip()).lstrip("._+-")


def _test_ids(value: Any, where: str, key: str) -> list[str]:
    """A list of test ids, given as a list or as a JSON string of a list (as in the datasets)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{where}: {key}: a string must hold a JSON list of test ids ({e})") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskFormatError(f"{where}: {key}: expected a list of test ids (strings), got {value!r:.200}")
    return value


def _clone_for(repo: str, repo_dirs: Mapping[str, str | Path] | str | Path) -> Path:
    if isinstance(repo_dirs, Mapping):
        if repo not in repo_dirs:
            known = ", ".join(sorted(repo_dirs)) or "none"
            raise TaskFormatError(f"repo: no clone given for {repo!r} (given: {known})")
        return Path(repo_dirs[repo])
    root = Path(repo_dirs)
    candidates = [root / repo.replace("/", "__"), root / repo.rsplit("/", 1)[-1]]
    for c in candidates:
        if c.is_dir():
            return c
    raise TaskFormatError(f"repo: no clone of {repo!r} found (looked for {', '.join(map(str, candidates))})")


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV}
    env.update({"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"})
    env.update(extra or {})
    return env


def _git(
    repo: Path, *args: str, env: Mapping[str, str] | None = None, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, env=_env(env))
    except FileNotFoundError:
        raise TaskFormatError("SWE-bench tasks need git, and no `git` executable was found") from None


def _check_repo(repo_dir: Path, where: str) -> Path:
    repo = repo_dir.expanduser().resolve()
    if not repo.is_dir():
        raise TaskFormatError(f"{where}: repo_dir {repo_dir} is not a directory")
    top = _git(repo, "rev-parse", "--show-toplevel")
    if top.returncode != 0:
        raise TaskFormatError(f"{where}: repo_dir {repo_dir} is not a git repository")
    toplevel = Path(top.stdout.decode().strip()).resolve()
    if toplevel != repo:  # git archive of a subdirectory would hold only that subdirectory
        raise TaskFormatError(f"{where}: repo_dir {repo_dir} is inside the git repository {toplevel}; give its top")
    return repo


def _test_files(repo: Path, base: str, test_patch: str, where: str) -> tuple[dict[str, str], list[str], list[str]]:
    """Contents after `test_patch` of the files it adds or modifies; paths it deletes; non-UTF-8 paths."""
    objects = _git(repo, "rev-parse", "--git-path", "objects")
    if objects.returncode != 0:
        raise TaskFormatError(f"{where}: cannot locate the object store of {repo}: {_err(objects)}")
    objects_dir = repo / objects.stdout.decode().strip()  # relative to the repository unless absolute
    with tempfile.TemporaryDirectory(prefix="vivace-swebench-") as tmp:
        (Path(tmp) / "objects").mkdir()
        alternates = [str(objects_dir)]
        if os.environ.get("GIT_ALTERNATE_OBJECT_DIRECTORIES"):
            alternates.append(os.environ["GIT_ALTERNATE_OBJECT_DIRECTORIES"])
        env = {
            "GIT_INDEX_FILE": str(Path(tmp) / "index"),
            "GIT_OBJECT_DIRECTORY": str(Path(tmp) / "objects"),
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": os.pathsep.join(alternates),
        }
        step = _git(repo, "read-tree", f"{base}^{{tree}}", env=env)
        if step.returncode != 0:
            raise TaskFormatError(f"{where}: base_commit: cannot read its tree: {_err(step)}")
        step = _git(repo, "apply", "--cached", "--whitespace=nowarn", "-", env=env, stdin=test_patch.encode())
        if step.returncode != 0:
            raise TaskFormatError(f"{where}: test_patch: does not apply to base_commit {base}: {_err(step)}")
        changed = _git(repo, "diff-index", "--cached", "--no-renames", "--name-status", "-z", base, env=env)
        if changed.returncode != 0:
            raise TaskFormatError(f"{where}: test_patch: cannot list the files it changes: {_err(changed)}")
        fields = changed.stdout.decode("utf-8", errors="surrogateescape").split("\0")
        files: dict[str, str] = {}
        deleted: list[str] = []
        binary: list[str] = []
        for status, path in zip(fields[0::2], fields[1::2], strict=False):
            if status == "D":
                deleted.append(path)
                continue
            blob = _git(repo, "cat-file", "blob", f":{path}", env=env)
            if blob.returncode != 0:
                raise TaskFormatError(f"{where}: test_patch: cannot read {path} after applying it: {_err(blob)}")
            try:
                files[path] = blob.stdout.decode("utf-8")
            except UnicodeDecodeError:
                binary.append(path)
    if not files and not deleted and not binary:
        raise TaskFormatError(f"{where}: test_patch: changes no file")
    return files, deleted, binary


def _err(proc: subprocess.CompletedProcess[bytes]) -> str:
    return proc.stderr.decode(errors="replace").strip() or f"git exited with {proc.returncode}"
