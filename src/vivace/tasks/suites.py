"""Named task suites shipped with vivace (`--suite NAME`).

- bugs: bug tasks generated from the bundled repositories, stored in vivace/tasks/data/bugs.jsonl
  (made with `vivace tasks generate --n 120 --seed 0 --out DIR`, then DIR/tasks.jsonl copied there);
- features: the hand-written feature tasks (vivace/tasks/features/*);
- bundled: both;
- families: the learnable task families in generated projects (vivace/tasks/families.py), stored
  in vivace/tasks/data/families.jsonl (made with `vivace tasks families --out FILE --train 700`, seed 0:
  700 train, 70 validation, 210 test; the warm start and `make train` use it).

Feature tasks come first, so `--n N` always includes them. `split` keeps one split (train / validation / test), which is decided by repository.

A name that is no suite but an existing path loads tasks from there (a .jsonl file, a task directory or a
directory of them: `format.load_tasks`), so `vivace train` can run on a user's own tasks.
"""

from __future__ import annotations

from pathlib import Path

from vivace.tasks.format import Task, check_split, load_jsonl, load_tasks
from vivace.tasks.generate import split_of

HERE = Path(__file__).parent
BUGS_FILE = HERE / "data" / "bugs.jsonl"
FAMILIES_FILE = HERE / "data" / "families.jsonl"
FEATURES_DIR = HERE / "features"
SUITES = ("bundled", "bugs", "features", "families")


def _with_split(tasks: list[Task]) -> list[Task]:
    """Tasks whose metadata names no split get their repository's."""
    for task in tasks:
        task.metadata.setdefault("split", split_of(task.metadata.get("repo") or task.repo.bundled or ""))
    return tasks


def load_suite(name: str, split: str | None = None) -> list[Task]:
    check_split(split)
    tasks: list[Task] = []
    if name not in SUITES:
        if not Path(name).exists():
            if "/" in name or name.endswith((".jsonl", ".json")):  # meant as a path: say it is missing
                raise ValueError(f"{name}: no such task file or directory (suites: {', '.join(SUITES)})")
            raise ValueError(
                f"unknown suite {name!r}; suites: {', '.join(SUITES)}, or a path to a tasks file or directory"
            )
        tasks = _with_split(load_tasks(name))
    if name in ("bundled", "features") and FEATURES_DIR.is_dir() and any(FEATURES_DIR.iterdir()):
        tasks += _with_split(load_tasks(FEATURES_DIR))
    if name in ("bundled", "bugs"):
        if not BUGS_FILE.is_file():
            raise ValueError(f"{BUGS_FILE} is missing; make it with `vivace tasks generate --out DIR` (see above)")
        tasks += load_jsonl(BUGS_FILE)
    if name == "families":
        if not FAMILIES_FILE.is_file():
            raise ValueError(f"{FAMILIES_FILE} is missing; make it with `vivace tasks families --out {FAMILIES_FILE}`")
        tasks += load_jsonl(FAMILIES_FILE)
    if split is not None:
        tasks = [t for t in tasks if t.split == split]
    return tasks
