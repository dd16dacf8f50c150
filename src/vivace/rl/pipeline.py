"""The rollout pipeline: episodes flow from the task order through the rollout workers to the
trainer, with the samplers kept busy, stragglers bounded and failures re-queued.

A *group* is G episodes of one task (its advantages are relative to each other); an *attempt*
is one run of one member episode on one worker. The pipeline opens groups in the task order,
queues their members, and starts an attempt the moment a worker slot frees up (workers are
chosen by free capacity; inside a worker the episode's first turn picks the least-loaded sampler
replica and later turns stay there). The trainer asks for batches of `tasks_per_step` complete
groups.

Modes (`train.pipeline`):
- sync: a step's groups open together, and the next step's only after the weight update — the
  batch waits for its slowest episode and the samplers idle meanwhile (the barrier baseline).
- async: groups keep opening while the trainer trains, as far ahead as `max_staleness` allows
  (at version V, groups that will be trained by version V + max_staleness); the trainer takes
  the first groups to complete.

At a weight update, episodes in flight either continue on the new weights (each token records
the version that sampled it) or are aborted and re-queued (`partial_episodes`); either way an
episode that could no longer be trained within `max_staleness` is aborted and re-queued at once.

Failures: a dead rollout worker is replaced and its episodes re-queued; an episode whose sampler
replica died is re-queued and the replica replaced; an episode whose environment failed is
re-queued up to `max_attempts`, then kept as a failed rollout. Every attempt ends in exactly one
outcome, so the counts balance: started = finished + requeued + unfinished at the end, and
finished = trained + left in the buffer at the end. Each attempt's line in `timeline.jsonl`
(start, end, worker, sampler replica, versions, per-turn model and tool time, outcome) is what
the dashboard draws. A resumed run appends to it: `session` (when the pipeline started, Unix time)
tells the runs apart, their times are from their own start, and the counts balance per session.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vivace.config import VivaceConfig
from vivace.rl.rollout import Rollout
from vivace.rl.workers import WorkerLost
from vivace.tasks.format import Task

OUTCOMES = ("finished", "requeued", "unfinished_at_end")


@dataclass
class Group:
    seq: int  # position in the task order: the data position a checkpoint restores
    task: Task
    size: int
    opened_version: int
    members: dict[int, Rollout] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.members) == self.size

    def rollouts(self) -> list[Rollout]:
        return [self.members[i] for i in range(self.size)]


@dataclass
class Attempt:
    uid: int
    group: Group
    member: int
    attempt: int  # failed attempts of this member before this one
    worker: int
    worker_gen: int
    version: int  # sampler weights version when it started
    started: float
    task: asyncio.Task | None = None
    abort_reason: str | None = None


class Pipeline:
    def __init__(self, cfg: VivaceConfig, workers: Any, task_at: Any, *, version: int, position: int,
                 pending: list[int] = (), timeline: Path | None = None):  # fmt: skip
        tc = cfg.train
        self.cfg, self.workers, self.task_at = cfg, workers, task_at
        self.n, self.k, self.g = tc.tasks_per_step, tc.max_staleness, tc.group_size
        self.version, self.first_version = version, version
        self.position = position  # next task-order position to open
        self.reopen = deque(pending)  # positions opened before a resume but never trained
        self.opened = 0  # groups opened by this pipeline
        self.queue: deque[tuple[Group, int, int]] = deque()  # (group, member, failed attempts)
        self.groups: dict[int, Group] = {}  # open, not yet handed to the trainer
        self.ready: deque[Group] = deque()  # complete, in completion order
        self.in_flight: dict[int, Attempt] = {}
        self.free = list(workers.capacity())
        self.worker_gen = [0] * len(self.free)
        self.replacing: set[int] = set()
        self.counts: Counter[str] = Counter()
        self.timeline = timeline.open("a") if timeline else None
        self.t0 = time.time()
        self._uids = iter(range(1 << 62))
        self._wake = asyncio.Event()  # the producer has something to do
        self._progress = asyncio.Event()  # a group completed, or something failed
        self._error: BaseException | None = None
        self._heal_lock = asyncio.Lock()
        self._producer: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()

    # ---- what the trainer sees ------------------------------------------------------------------

    def start(self) -> None:
        self._producer = asyncio.create_task(self._produce())
        self._producer.add_done_callback(self._watch)

    async def next_batch(self) -> list[Group]:
        """The next `tasks_per_step` complete groups (first completed first), in task order."""
        while len(self.ready) < self.n:
            if self._error is not None:
                raise RuntimeError(f"the rollout pipeline failed: {self._error}") from self._error
            self._progress.clear()
            await self._progress.wait()
        batch = [self.ready.popleft() for _ in range(self.n)]
        for group in batch:
            self.counts["trained"] += group.size
        return sorted(batch, key=lambda gr: gr.seq)

    def set_version(self, version: int) -> None:
        """The samplers now hold weights `version`: abort what must be, let more groups open."""
        self.version = version
        abort_all = self.cfg.train.partial_episodes == "abort"
        for att in list(self.in_flight.values()):
            if abort_all:
                self._abort(att, "aborted_update")
            elif att.version < version - self.k:
                self._abort(att, "aborted_stale")
        self._wake.set()

    def _watch(self, task: asyncio.Task) -> None:
        """Background work that fails wakes the trainer with the error instead of hanging it."""
        if not task.cancelled() and task.exception() is not None:
            self._error = self._error or task.exception()
            self._progress.set()

    def pending_positions(self) -> list[int]:
        """Task-order positions opened but not yet trained (a checkpoint re-opens them on resume)."""
        return sorted([*self.groups, *(g.seq for g in self.ready), *self.reopen])

    def snapshot(self) -> dict[str, Any]:
        """Cumulative counts (episodes by outcome, failures, replacements) and what is in flight."""
        finished_waiting = sum(len(g.members) for g in self.groups.values()) + sum(g.size for g in self.ready)
        return {**{f"episodes_{k}": v for k, v in sorted(self.counts.items())},
                "episodes_in_flight": len(self.in_flight), "episodes_buffered": finished_waiting,
                **getattr(self.workers, "replaced", {})}  # fmt: skip

    async def close(self) -> dict[str, Any]:
        """Stops production; episodes still running are cancelled and counted as unfinished."""
        if self._producer is not None:
            self._producer.cancel()
        for att in list(self.in_flight.values()):
            self._abort(att, "unfinished_at_end")
        tasks = [a.task for a in self.in_flight.values() if a.task is not None] + list(self._background)
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._producer is not None:
            await asyncio.gather(self._producer, return_exceptions=True)
        if self.timeline:
            self.timeline.close()
        return self.snapshot()

    # ---- production ---------------------------------------------------------------------------

    def _budget(self) -> int:
        """How many groups this pipeline may have opened by now (see the module docstring)."""
        ahead = self.k if self.cfg.train.pipeline == "async" else 0
        # Async keeps producing up to the end, as in the middle of a run (the last batch is not
        # left waiting on the run's slowest episodes); what no step trains is cancelled at the end
        # (counted) and re-opened by a resume.
        last = self.cfg.train.steps + ahead
        return (min(self.version + 1 + ahead, last) - self.first_version) * self.n

    async def _produce(self) -> None:
        while True:
            while self.opened < self._budget():
                seq = self.reopen.popleft() if self.reopen else self._next_position()
                group = Group(seq, self.task_at(seq), self.g, self.version)
                self.groups[seq] = group
                self.opened += 1
                self.queue.extend((group, m, 0) for m in range(self.g))
            while self.queue and (w := self._free_worker()) is not None:
                group, member, failures = self.queue.popleft()
                self._launch(group, member, failures, w)
            self._wake.clear()
            await self._wake.wait()

    def _next_position(self) -> int:
        self.position += 1
        return self.position - 1

    def _free_worker(self) -> int | None:
        best = max((i for i in range(len(self.free)) if i not in self.replacing), key=lambda i: self.free[i],
                   default=None)  # fmt: skip
        return best if best is not None and self.free[best] > 0 else None

    def _launch(self, group: Group, member: int, failures: int, worker: int) -> None:
        att = Attempt(next(self._uids), group, member, failures, worker, self.worker_gen[worker], self.version,
                      time.time())  # fmt: skip
        self.free[worker] -= 1
        self.in_flight[att.uid] = att
        self.counts["started"] += 1
        att.task = asyncio.create_task(self._run(att))
        att.task.add_done_callback(self._watch)
        att.task.add_done_callback(lambda task: self._settle_unstarted(att, task))

    def _abort(self, att: Attempt, reason: str) -> None:
        if att.abort_reason is None and att.task is not None:
            att.abort_reason = reason
            att.task.cancel()

    async def _run(self, att: Attempt) -> None:
        outcome, result, error, failed = "requeued", None, None, False
        try:
            result = await self.workers.episode(att.worker, att.group.task)
        except asyncio.CancelledError:
            outcome = self._cancelled_outcome(att)
        except WorkerLost as e:
            self.counts["worker_lost"] += 1
            error = str(e)
            if att.worker_gen == self.worker_gen[att.worker]:  # the first of its episodes to notice
                self.worker_gen[att.worker] += 1  # its other attempts no longer hold slots
                self.replacing.add(att.worker)
                self._spawn(self._replace_worker(att.worker))
        else:
            error = result.error
            if result.dead_samplers and result.status != "sampler_lost":
                self._spawn(self._heal())  # a replica no episode was lost on, found dead by the router
            if result.status == "ok":
                outcome = "finished"
            elif result.status == "sampler_lost":
                self.counts["sampler_lost"] += 1
                self._spawn(self._heal())
            else:  # the environment failed: again, up to the attempt limit, then a failed rollout
                self.counts["env_failed"] += 1
                failed = True
                if att.attempt + 1 >= self.cfg.train.max_attempts:
                    result.rollout = Rollout(att.group.task.id, None, 0.0, error=result.error)
                    outcome = "finished"
        self._settle(att, outcome, result, error, failed)

    def _cancelled_outcome(self, att: Attempt) -> str:
        outcome = "unfinished_at_end" if att.abort_reason == "unfinished_at_end" else "requeued"
        if outcome == "requeued":
            self.counts[att.abort_reason or "cancelled"] += 1
        return outcome

    def _settle_unstarted(self, att: Attempt, task: asyncio.Task) -> None:
        """An attempt cancelled before its task's first step (aborted or closed right after its launch) never
        runs `_run`'s body: it is settled here as one cancelled while running, so it is still counted, its
        slot freed, and a requeued member goes back in line (its group would otherwise never complete)."""
        if task.cancelled() and att.uid in self.in_flight:
            self._settle(att, self._cancelled_outcome(att), None, None, False)

    def _settle(self, att: Attempt, outcome: str, result: Any, error: str | None, failed: bool) -> None:
        self.counts[outcome] += 1
        del self.in_flight[att.uid]
        if att.worker_gen == self.worker_gen[att.worker]:
            self.free[att.worker] += 1
        if outcome == "finished":
            self._finish(att, result.rollout)
        elif outcome == "requeued":  # first in line: its group waits on it
            self.queue.appendleft((att.group, att.member, att.attempt + int(failed)))
        self._log(att, outcome, result, error)
        self._wake.set()

    def _finish(self, att: Attempt, rollout: Rollout) -> None:
        group = att.group
        group.members[att.member] = rollout
        if group.complete:
            del self.groups[group.seq]
            self.ready.append(group)
            self._progress.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(self._watch)

    async def _replace_worker(self, worker: int) -> None:
        try:
            await self.workers.replace_worker(worker)
            self.free[worker] = self.workers.capacity()[worker]  # attempts of the dead one no longer count
        finally:
            self.replacing.discard(worker)
            self._wake.set()

    async def _heal(self) -> None:
        async with self._heal_lock:
            await self.workers.heal_samplers(self.version)

    def _log(self, att: Attempt, outcome: str, result: Any, error: str | None) -> None:
        if self.timeline is None:
            return
        traj = result.rollout.trajectory if result is not None and result.rollout is not None else None
        versions = [v for v in (traj.tokens.versions if traj and traj.tokens else []) if v >= 0]
        line = {
            "session": round(self.t0, 3), "uid": att.uid, "episode": f"{att.group.seq}.{att.member}",
            "task_id": att.group.task.id,
            "attempt": att.attempt, "worker": att.worker, "sampler": result.sampler if result else None,
            "start_s": round(att.started - self.t0, 3), "end_s": round(time.time() - self.t0, 3),
            "version_start": att.version, "version_min": min(versions, default=None),
            "version_max": max(versions, default=None), "outcome": outcome, "reason": att.abort_reason,
            "error": error, "turns": [[round(t.model_s, 3), round(t.tools_s, 3)] for t in traj.turns] if traj else [],
        }  # fmt: skip
        self.timeline.write(json.dumps(line) + "\n")
        self.timeline.flush()
