"""The task format: what an agent is asked to do, where, and how the result is judged.

A task names a repository (a bundled one, or a directory/tarball/git repository at a commit),
the request, the hidden tests (a command, the tests that must go from failing to passing, the
tests that must keep passing, and test files written fresh at scoring time), the curated
reference patch, setup commands and free-form metadata (kind, split, difficulty, ...).

Two on-disk forms:
- a task directory: `task.json` (everything but the patch and the hidden files),
  `reference.patch` (optional) and `hidden/` (files mirrored into the workspace at scoring);
- JSONL: one complete task per line, hidden files and patch inline.

Errors name the file (and line) and the field. Not covered: SWE-bench records (swebench.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vivace.config import error_message
from vivace.files import write_atomic
from vivace.sandbox.base import check_env
from vivace.sandbox.snapshot import SnapshotSource

BUNDLED_REPOS = Path(__file__).parent / "repos"
# No -q: with one in the repository's addopts too (pytest's own documented `-ra -q`), pytest prints no
# final "N passed in Xs" line, which the outcomes are read by (testrun.read_summary). --color=no: an
# addopts --color=yes coloured every summary line.
DEFAULT_TEST_COMMAND = "python -m pytest -rA --tb=short -p no:cacheprovider --color=no"


class TaskFormatError(ValueError):
    """A task file is malformed; the message names the file and the field."""


SPLITS = ("train", "validation", "test")  # a task's metadata `split`
BOM = "\ufeff"  # a byte-order mark some editors put before JSON; JSON readers may drop it, and these do


def check_split(split: str | None) -> None:
    """A split to filter tasks by must be one tasks can have: any other keeps no task, silently."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use {', '.join(SPLITS)}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty or blank")
    return text


NonBlank = Annotated[str, AfterValidator(_not_blank)]  # a command or test id: a blank one can never run or match
DIFF_LINE_STARTS = ("diff --git ", "--- ", "@@")  # a patch without any of these holds no change


def _a_diff_or_nothing(patch: str) -> str:
    if patch and not any(line.startswith(DIFF_LINE_STARTS) for line in patch.split("\n")):
        raise ValueError("not a diff (no line starts with 'diff --git ', '--- ' or '@@'); leave it empty for none")
    return patch


class RepoSpec(_Strict):
    """Where the task's repository comes from: exactly one of `bundled` and `path`."""

    bundled: str | None = Field(None, description="Name of a repository shipped with vivace (vivace/tasks/repos).")
    path: str | None = Field(
        None, description="Directory, tarball or git repository; relative paths are relative to the task file."
    )
    commit: str | None = Field(None, description="Git revision when `path` is a git repository.")
    patch: str = Field(
        "", description="A git-style diff applied on top to make the task's starting point (e.g. an injected bug)."
    )

    _is_a_diff = field_validator("patch")(_a_diff_or_nothing)

    @model_validator(mode="after")
    def _one_source(self) -> RepoSpec:
        if (self.bundled is None) == (self.path is None):
            raise ValueError("give exactly one of 'bundled' (a shipped repository) and 'path'")
        # A plain name of a directory in BUNDLED_REPOS, nothing else: "", "." or ".." would be the repos
        # directory itself or the package, and a name with a separator any directory on the machine.
        if self.bundled is not None and not (_plain_name(self.bundled) and (BUNDLED_REPOS / self.bundled).is_dir()):
            known = ", ".join(bundled_repos())
            raise ValueError(f"no bundled repository {self.bundled!r} (a bundled repository's plain name, or "
                             f"'path' for any other directory); bundled: {known}")  # fmt: skip
        return self

    def source(self, base_dir: Path | None = None, cache_dir: Path | None = None) -> SnapshotSource:
        """The snapshot source of the task's starting point. With a `patch`, the patched tree is
        built once under `cache_dir` (content-keyed) and that directory is the source."""
        if self.bundled is not None:
            base = SnapshotSource(path=str(BUNDLED_REPOS / self.bundled))
        else:
            path = Path(self.path or "")
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            base = SnapshotSource(path=str(path), commit=self.commit)
        if not self.patch:
            return base
        if cache_dir is None:
            raise ValueError("a task whose repo has a patch needs a cache directory to build its starting tree")
        return SnapshotSource(path=str(_patched_tree(base, self.patch, cache_dir)))


class TestSpec(_Strict):
    """How correctness is judged."""

    __test__ = False  # not a pytest test class

    command: NonBlank = Field(DEFAULT_TEST_COMMAND, description="Test command; the test files to run are appended.")
    fail_to_pass: list[NonBlank] = Field(min_length=1, description="Test ids that fail before the fix and must pass.")
    pass_to_pass: list[NonBlank] = Field(default_factory=list, description="Test ids that must keep passing.")
    files: dict[str, str] = Field(
        default_factory=dict, description="Hidden test files (workspace path -> content), written fresh at scoring."
    )
    timeout_s: float = Field(
        300.0, gt=0, allow_inf_nan=False, strict=True, description="Wall-clock limit of the test run."
    )  # strict: "60" or true is refused, naming the field, not read as 60 or 1

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            parts = path.split("/")
            if not path or path.startswith("/") or ".." in parts:
                raise ValueError(f"hidden file path {path!r} must be relative to the workspace root, without '..'")
            if "" in parts or "." in parts:  # "tests/" named a directory: every episode failed writing it
                raise ValueError(f"hidden file path {path!r} must name a file: no empty, '.' or trailing '/' parts")
        return files


class Task(_Strict):
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$", description="Unique id (file-name safe).")
    repo: RepoSpec
    request: str = Field(min_length=1, description="What the user asks, in their words.")
    tests: TestSpec
    reference_patch: str = Field("", description="The curated solution, a unified diff (git diff, diff -u).")
    setup: list[str] = Field(default_factory=list, description="Commands run in the workspace before the agent.")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables of every command in the task's workspace: setup, the agent's, the hidden tests'.",
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="kind, split, difficulty, mutation, ...")
    base_dir: Path | None = Field(None, exclude=True, description="Where relative repo paths are resolved.")

    _is_a_diff = field_validator("reference_patch")(_a_diff_or_nothing)

    @field_validator("metadata")
    @classmethod
    def _known_metadata(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        # A split of another type or spelling matched no --split and no held-out set: the task was dropped silently.
        if "split" in metadata and metadata["split"] not in SPLITS:
            raise ValueError(f"split {metadata['split']!r} is not one of {', '.join(SPLITS)}")
        # The expert reads these files before its edit; a bare string would be read a character at a time.
        context = metadata.get("context_files", [])
        if not isinstance(context, list) or not all(isinstance(p, str) and p.strip() for p in context):
            raise ValueError(f"context_files must be a list of workspace paths, got {context!r}")
        return metadata

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env)

    def source(self, cache_dir: Path | None = None) -> SnapshotSource:
        return self.repo.source(self.base_dir, cache_dir)

    @property
    def split(self) -> str | None:
        return self.metadata.get("split")

    @property
    def family(self) -> str:
        """The task's family (metadata `family`, else `kind`, else "other"): how reports group tasks."""
        return str(self.metadata.get("family") or self.metadata.get("kind") or "other")


def _patched_tree(base: SnapshotSource, patch: str, cache_dir: Path) -> Path:
    """The base tree with `patch` applied, built once per content (the base snapshot's key is
    content-derived, so a changed source or a moved branch gives a new tree)."""
    from vivace.sandbox.snapshot import cached_tree, materialize

    snap = materialize(base, cache_dir / "snapshots")
    key = hashlib.sha256(f"{snap.key}\0{patch}".encode()).hexdigest()[:24]

    def build(tmp: Path) -> None:
        shutil.copytree(snap.root, tmp, symlinks=True, dirs_exist_ok=True)
        done = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=tmp, input=patch.encode(),
                              capture_output=True)  # fmt: skip
        if done.returncode != 0:
            raise TaskFormatError(f"repo.patch does not apply to {base.path}: {done.stderr.decode().strip()}")

    return cached_tree(cache_dir / "task-trees", key, build)


def _plain_name(name: str) -> bool:
    """Whether `name` is one path component naming an entry inside its directory (not itself or its parent)."""
    return name not in ("", ".", "..") and not any(sep in name for sep in ("/", "\\", "\0"))


def bundled_repos() -> list[str]:
    return sorted(p.name for p in BUNDLED_REPOS.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def problems(e: ValidationError, whole: str) -> str:
    """pydantic's errors as "field.path: message; …" (`whole` names an error of the value itself)."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or whole}: {error_message(err)}" for err in e.errors())


def _validate(data: Any, where: str, base_dir: Path | None) -> Task:
    if not isinstance(data, dict):
        raise TaskFormatError(f"{where}: a task must be a JSON object, got {type(data).__name__}")
    try:
        task = Task.model_validate(data)
    except ValidationError as e:
        raise TaskFormatError(f"{where}: {problems(e, 'task')}") from None
    task.base_dir = base_dir
    return task


def load_task_dir(path: str | Path) -> Task:
    """A task directory: task.json, optional reference.patch, optional hidden/ tree."""
    root = Path(path)
    spec = root / "task.json"
    try:
        data = json.loads(_read(spec).removeprefix(BOM))
    except json.JSONDecodeError as e:
        raise TaskFormatError(f"{spec}: invalid JSON: {e}") from None
    if isinstance(data, dict):
        patch = root / "reference.patch"
        if patch.is_file():
            data.setdefault("reference_patch", _read(patch))
        hidden = root / "hidden"
        if hidden.is_dir() and isinstance(data.get("tests"), dict):
            files = data["tests"].setdefault("files", {})
            for f in sorted(hidden.rglob("*")):
                if f.is_file() and "__pycache__" not in f.parts:
                    files.setdefault(f.relative_to(hidden).as_posix(), _read(f))
    return _validate(data, str(spec), root)


def load_jsonl(path: str | Path) -> list[Task]:
    tasks, origins = _jsonl_with_origins(Path(path))
    _check_unique(tasks, origins)
    return tasks


def _jsonl_with_origins(p: Path) -> tuple[list[Task], list[str]]:
    """A .jsonl file's tasks, and where each is (file:line)."""
    tasks, origins = [], []
    # Lines end at "\n" only: JSON strings may hold U+2028, U+2029 and U+0085 unescaped (json.dumps with
    # ensure_ascii=False writes them), which str.splitlines() would break a record at.
    for n, line in enumerate(_read(p).removeprefix(BOM).split("\n"), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{p}:{n}: invalid JSON: {e}") from None
        tasks.append(_validate(data, f"{p}:{n}", p.parent))
        origins.append(f"{p}:{n}")
    return tasks, origins


def load_tasks(path: str | Path) -> list[Task]:
    """Tasks from a .jsonl file, a task directory, or a directory of task directories / .jsonl files."""
    p = Path(path)
    if p.name == "task.json" and p.is_file():
        return [load_task_dir(p.parent)]
    if p.exists() and not p.is_dir():  # a regular file; anything else is refused by _read
        tasks = load_jsonl(p)
        if not tasks:
            raise TaskFormatError(f"{p}: no tasks (the file is empty or blank); write one task per line as JSON")
        return tasks
    if (p / "task.json").is_file():
        return [load_task_dir(p)]
    if not p.is_dir():
        raise TaskFormatError(f"{p}: no such task file or directory")
    tasks: list[Task] = []
    origins: list[str] = []
    for child in sorted(p.iterdir()):
        if (child / "task.json").is_file():
            tasks.append(load_task_dir(child))
            origins.append(str(child))
        elif child.suffix == ".jsonl":  # a directory or FIFO of that name is refused by _read, not skipped
            more, where = _jsonl_with_origins(child)
            tasks, origins = tasks + more, origins + where
    if not tasks:
        raise TaskFormatError(f"{p}: no tasks found (expected task directories or .jsonl files)")
    try:
        _check_unique(tasks, origins)
    except TaskFormatError as e:
        copies = [f"{split}.jsonl" for split in SPLITS if (p / f"{split}.jsonl").is_file()]
        if (p / "tasks.jsonl").is_file() and copies:  # as `vivace tasks generate` writes: every task twice
            raise TaskFormatError(f"{e}; {p} holds tasks.jsonl and its per-split copies ({', '.join(copies)}): "
                                  f"give one of those files, e.g. {p / copies[-1]}") from None  # fmt: skip
        raise
    return tasks


def save_jsonl(tasks: list[Task], path: str | Path) -> None:
    """Writes tasks one per line (repository paths stay as given: keep them absolute or bundled)."""
    write_atomic(Path(path), "".join(t.model_dump_json() + "\n" for t in tasks))  # a kill leaves no half a file


_NOT_REGULAR = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket",
                stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}  # fmt: skip


def _read(path: Path) -> str:
    """A task file's text. Only a regular file is read: opening a directory fails and reading a FIFO or
    a device may never end, so the file is opened non-blocking (a FIFO without a writer opens at once)
    and its type checked on the open descriptor (no window for a swap between check and read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        what = "not a task directory (no task.json)" if path.name == "task.json" else "no such file"
        raise TaskFormatError(f"{path.parent if path.name == 'task.json' else path}: {what}") from None
    except OSError as e:
        raise TaskFormatError(f"{path}: cannot open: {e.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _NOT_REGULAR.items() if test(mode)), "an unusual file type")
            raise TaskFormatError(f"{path}: not a regular file ({kind}); task files must be regular files")
        with open(fd, encoding="utf-8", closefd=False) as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise TaskFormatError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    finally:
        os.close(fd)


def _check_unique(tasks: list[Task], origins: list[str]) -> None:
    """TaskFormatError naming both places of the first task id given twice (origins: where each task is)."""
    seen: dict[str, str] = {}
    for t, where in zip(tasks, origins, strict=True):
        if t.id in seen:
            raise TaskFormatError(f"{where}: duplicate task id {t.id!r} (first at {seen[t.id]})")
        seen[t.id] = where
