"""Pick training tasks by how often a policy solves them (pass-rate filtering).

With group-relative advantages and the correctness filter, only groups whose rollouts differ in
outcome train. A warm start that solves 7% of the training tasks leaves most groups all-failed, so
a short run trains on a handful of samples. Measuring the policy's pass rate per task once
(`vivace bench --samples K` at the rollout temperature) and keeping the tasks it solves sometimes
gives every step groups that can train (`train.suite` = the file `vivace tasks select` writes).
The rates belong to the policy measured: a new checkpoint needs a new measurement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from vivace.bench.results import result_rows
from vivace.tasks.format import Task, TaskFormatError


@dataclass(frozen=True)
class PassRate:
    solved: int
    episodes: int

    @property
    def rate(self) -> float:
        return self.solved / self.episodes


def read_pass_rates(paths: list[Path], model: str | None = None) -> dict[str, PassRate]:
    """Per task id, solved and total episodes over benchmark results files (results.jsonl rows). Rows
    with an `error` (an episode that could not run: its endpoint down, its setup failing) are not
    episodes of the model and are left out."""
    counts: dict[str, list[int]] = {}
    models: set[str] = set()
    for i, path in enumerate(paths):  # one file twice counted each episode twice (and kept tasks solved once)
        if any(path.exists() and p.exists() and path.samefile(p) for p in paths[:i]):
            raise TaskFormatError(f"{path}: given twice; give each results file once")
        try:
            rows = list(result_rows(path))
        except (OSError, UnicodeDecodeError) as e:  # missing, a directory, unreadable, not text
            raise TaskFormatError(f"{path}: cannot read benchmark results ({e})") from None
        except ValueError as e:  # a line that is not a JSON object
            raise TaskFormatError(str(e)) from None
        for n, row in rows:
            if "task_id" not in row or "resolved" not in row:
                raise TaskFormatError(f"{path}:{n}: not a benchmark result row (want an object with task_id and "
                                      "resolved, as `vivace bench` writes to results.jsonl)")  # fmt: skip
            task_id, resolved, row_model = row["task_id"], row["resolved"], row.get("model", "")
            # bool("false") is True: a result only counts as solved when it says so as a JSON boolean
            for key, value, kind in (
                ("task_id", task_id, str),
                ("resolved", resolved, bool),
                ("model", row_model, str),
            ):
                if not isinstance(value, kind):
                    want = "a JSON boolean (true or false)" if kind is bool else "a string"
                    raise TaskFormatError(f"{path}:{n}: {key} must be {want}, got {json.dumps(value)}; give "
                                          "the results.jsonl `vivace bench` writes")  # fmt: skip
            models.add(row_model)
            if (model is not None and row_model != model) or "error" in row:  # an episode that could not run
                continue
            c = counts.setdefault(task_id, [0, 0])
            c[0] += resolved
            c[1] += 1
    if model is None and len(models) > 1:
        raise TaskFormatError(f"results mix several models ({', '.join(sorted(models))}); pick one with --model")
    return {task_id: PassRate(solved, total) for task_id, (solved, total) in counts.items()}


def select_tasks(
    tasks: list[Task], rates: dict[str, PassRate], min_solved: int = 1, max_rate: float = 1.0
) -> list[Task]:
    """Tasks measured at least `min_solved` times solved and at most `max_rate` of the time, in suite order.
    Unmeasured tasks are left out: nothing says the policy can learn from them."""
    return [t for t in tasks if (r := rates.get(t.id)) is not None and r.solved >= min_solved and r.rate <= max_rate]
