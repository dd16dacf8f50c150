"""Who does the work of a training step: sampler replicas, rollout workers and the trainer.

Two placements behind one interface, so the pipeline (rl/pipeline.py) and the controller are
the same everywhere:

    start(version, checkpoint)   build everything, load a checkpoint, push weights `version`
    capacity() -> [slots, ...]   episodes each rollout worker runs at once
    episode(worker, task)        one episode attempt on that worker -> EpisodeResult;
                                 raises WorkerLost when the worker itself died
    replace_worker(worker)       a fresh worker in a dead one's place
    heal_samplers(version)       replace dead sampler replicas, give them weights `version`
    sampler_stats()              generated tokens and busy seconds, summed over replicas
    train_step(samples), sync(version), save(path), close()
    cluster_lost                 true while the cluster they run on does not answer (the run stops)

- `RayWorkers` (the default): Ray actors — `sampler_replicas` engines (`_EngineActor` from
  inference/samplers.py), `rollout_workers` rollout workers (each an agent loop beside its own
  workspace backend, routing each episode to the least-loaded replica), and the trainer (one rank
  per actor, a torch.distributed group among them). `ray.init()` starts a local cluster unless
  `address` names one to join. Weights go from the trainer to the samplers through the object
  store (trainer rank 0 `ray.put`s them in pieces as the ranks gather them, and every replica fetches
  the pieces and loads them as one update), or by
  collective broadcast from trainer rank 0 (rl/weight_sync.py: NCCL on GPUs, gloo on CPU).
  Actors of a cluster this process joins run in the working directory and environment of that
  cluster's `ray start`, not this process's: the paths they open (model, sft_data, state_dir,
  toolchain) are made absolute here first. Nothing else of the driver's environment is sent
  (no runtime_env): on other machines the project must be installed, and those paths must exist.
- `LocalWorkers`: all in this process (tests, debugging, machines without Ray).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vivace.config import EngineConfig, VivaceConfig
from vivace.harness.chat import ChatFormat
from vivace.inference.samplers import sampling_params
from vivace.rl.rollout import EpisodeResult, run_attempt
from vivace.rl.trainer import Sample, Trainer
from vivace.rl.weight_sync import STORE_PIECE_BYTES, store_pieces
from vivace.signals import blocked_in_children
from vivace.tasks.format import Task

if TYPE_CHECKING:
    import torch

ROLLOUT_CLOSE_TIMEOUT_S = 30.0


class WorkerLost(Exception):
    """The rollout worker running an episode died; the episode must be re-queued."""


class ClusterUnavailable(Exception):
    """The Ray cluster to join cannot be reached or refuses this process."""


def check_ray_installed() -> None:
    """Raises ClusterUnavailable when Ray, an optional dependency (`vivace[ray]`), is not installed: found
    only when the workers start, it failed after the run directory was made, in two tracebacks."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ClusterUnavailable("Ray is not installed: vivace trains on Ray actors by default; install it with "
                                 "`pip install 'vivace[ray]'` (or `pip install 'ray>=2.40'`), or pass --local to "
                                 "run sampler, rollouts and trainer in this process")  # fmt: skip


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Raises ClusterUnavailable unless a `host:port` cluster address accepts a TCP connection: Ray's own
    join retries an unresolvable or closed address for many minutes, printing only its own warnings.
    Other forms (`auto`, `ray://...`) are left to Ray."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ClusterUnavailable(f"cannot reach the Ray cluster at {address}: {e.strerror or e or 'timed out'}; give "
                                 "the address `ray start --head` printed (host:port of its GCS, 6379 by default)") from None  # fmt: skip


def _for_actors(cfg: VivaceConfig) -> VivaceConfig:
    """A copy whose paths the actors open are absolute: on a joined cluster an actor's working directory
    is that of the cluster's `ray start`, where a relative path names something else or nothing."""
    from vivace.model.checkpoint import TINY_INIT

    cfg = cfg.model_copy(deep=True)
    tc, sandbox = cfg.train, cfg.sandbox
    if tc.model not in ("tiny", TINY_INIT) and Path(tc.model).expanduser().exists():
        tc.model = str(Path(tc.model).expanduser().resolve())
    if tc.sft_data is not None:
        tc.sft_data = tc.sft_data.expanduser().resolve()
    sandbox.state_dir = sandbox.state_dir.expanduser().resolve()
    sandbox.toolchain = [d.expanduser().resolve() for d in sandbox.toolchain]
    return cfg


def gpu_shares(gpus: float, trainers: int, samplers: int) -> tuple[float, float]:
    """GPUs per trainer rank and per sampler replica on a cluster of `gpus` GPUs ((0, 0) without any).
    Ray puts a fractional request on one GPU, the fullest that fits, so shares are 1/k of a GPU with k
    actors per GPU (equal shares always fit); and NCCL cannot put two ranks of one group on one GPU, so
    several trainer ranks each get a whole GPU and the replicas share the rest. A ValueError says what
    to change when there is no such layout."""
    whole = int(gpus + 1e-6)
    if whole <= 0:
        return 0.0, 0.0
    if whole >= trainers + samplers:
        return 1.0, 1.0
    if trainers == 1:  # the trainer and the replicas share the GPUs (one GPU: half each)
        share = 1 / math.ceil((1 + samplers) / whole)
        return share, share
    if whole <= trainers:
        raise ValueError(
            f"train.trainer_ranks {trainers} needs {trainers} GPUs of its own (NCCL cannot put two ranks of one "
            f"group on one GPU) and the sampler replicas at least one more; the cluster has {whole}: use at "
            f"most {max(1, whole - 1)} (one rank shares its GPU with the replicas)"
        )
    return 1.0, 1 / math.ceil(samplers / (whole - trainers))


def broadcast_sync(mode: str, trainer_gpu: float, sampler_gpu: float, engine_device: str) -> bool:
    """Whether weights go by collective broadcast (else the object store), given `train.weight_sync` and the
    actors' GPU shares (gpu_shares). On GPUs that is NCCL, which needs a GPU of its own for each member
    (trainer rank 0, every replica) and the same backend on all (an engine on the CPU would be gloo);
    `auto` takes the object store otherwise, and an explicit `broadcast` there is a ValueError. Without
    GPUs, broadcast is gloo, which has neither limit."""
    separate = trainer_gpu >= 1.0 and sampler_gpu >= 1.0 and engine_device != "cpu"
    if mode == "broadcast" and trainer_gpu > 0 and not separate:
        raise ValueError(
            "train.weight_sync broadcast needs NCCL between GPUs, a whole GPU each for trainer rank 0 and every "
            f"sampler replica with the engine on it; this run's trainer ranks get {trainer_gpu:g} GPU, its "
            f"replicas {sampler_gpu:g} (engine.device {engine_device}): use weight_sync auto or object_store"
        )
    return mode == "broadcast" or (mode == "auto" and separate)


def resources_short(total: dict[str, float], free: dict[str, float], need: dict[str, float]) -> str | None:
    """What a joined cluster lacks for this run's actors right now (it may be busy with another run),
    in words, or None when it has enough free."""
    short = [f"{free.get(r, 0.0):g} of {total.get(r, 0.0):g} {r}s free, {n:g} needed"
             for r, n in need.items() if n > free.get(r, 0.0) + 1e-6]  # fmt: skip
    return "; ".join(short) or None


def _engine_config(cfg: VivaceConfig, version: int, replica: int = 0) -> EngineConfig:
    """A sampler replica's engine settings; its seed moves with the step (a resumed run does not
    replay its first steps' samples) and with the replica (replicas do not sample alike)."""
    return cfg.engine.model_copy(update={"seed": cfg.train.seed + version + 1000 * replica})


def _nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _split(total: int, parts: int) -> list[int]:
    """`total` slots over `parts` workers, as evenly as possible (every worker gets at least one)."""
    return [max(1, total // parts + (1 if i < total % parts else 0)) for i in range(parts)]


class ClusterWatch:
    """Probes a Ray cluster's GCS (`host:port`) with a TCP connect every `interval_s`, from a daemon
    thread. Ray's core ends a driver whose GCS has been gone for 60 s, from C++, where no Python
    handler runs: the step in flight is lost and nothing says how to resume. The watch tells the
    driver within seconds, so it can stop on its own terms first. `on_change(True)` is called after
    `failures` failed probes in a row, `on_change(False)` when a probe succeeds again; `down_since`
    is the monotonic time of the outage's first failed probe while it lasts, else None."""

    def __init__(self, address: str, on_change: Callable[[bool], None], interval_s: float = 2.0, failures: int = 3):
        self.address, self.on_change, self.interval_s, self.failures = address, on_change, interval_s, failures
        self.down_since: float | None = None
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="vivace-cluster-watch", daemon=True).start()

    def _answers(self) -> bool:
        host, _, port = self.address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=self.interval_s).close()
            return True
        except (OSError, ValueError):
            return False

    def _watch(self) -> None:
        failed, first_failure = 0, 0.0
        while not self._closed.wait(self.interval_s):
            if self._answers():
                failed = 0
                if self.down_since is not None:
                    self.down_since = None
                    self.on_change(False)
                continue
            failed += 1
            if failed == 1:
                first_failure = time.monotonic()
            if failed == self.failures:
                self.down_since = first_failure
                self.on_change(True)

    def close(self) -> None:
        self._closed.set()


class LocalWorkers:
    cluster_lost = False  # in-process: there is no cluster to lose

    def __init__(self, cfg: VivaceConfig, episode: Any = None):
        self.cfg, self.episode_fn = cfg, episode
        self.replaced: Counter[str] = Counter()  # nothing is ever replaced in-process

    async def start(self, version: int, checkpoint: Path | None) -> None:
        from vivace.inference.samplers import local_engine
        from vivace.sandbox import open_backend

        tc = self.cfg.train
        self.trainer = Trainer(tc.model, tc, temperature=self.cfg.engine.temperature)
        if checkpoint is not None:
            self.trainer.load(checkpoint)
        self.samplers = []
        for i in range(tc.sampler_replicas):
            engine, self.chat = local_engine(tc.model, _engine_config(self.cfg, version, i))
            self.samplers.append(engine)
        self.params = sampling_params(self.cfg.engine)
        self.backend = open_backend(self.cfg.sandbox)
        await self.sync(version)

    def capacity(self) -> list[int]:
        return _split(self.cfg.train.rollout_concurrency, self.cfg.train.rollout_workers)

    async def episode(self, worker: int, task: Task) -> EpisodeResult:
        return await run_attempt(self.samplers, self.chat, self.params, self.cfg.train.model, task, self.cfg,
                                 self.backend, episode=self.episode_fn)  # fmt: skip

    async def replace_worker(self, worker: int) -> None:
        pass  # in-process workers do not die on their own

    async def heal_samplers(self, version: int) -> int:
        return 0

    async def sampler_stats(self) -> dict[str, float]:
        stats = [s.engine.stats for s in self.samplers]
        return {"generated_tokens": sum(s.generated_tokens for s in stats), "busy_s": sum(s.busy_s for s in stats)}

    async def train_step(self, samples: list[Sample]) -> dict[str, float]:
        return await asyncio.to_thread(self.trainer.train_step, samples)

    async def sync(self, version: int) -> tuple[int, float]:
        def push() -> dict:
            state = self.trainer.full_state_dict()
            for s in self.samplers:
                s.update_weights(state, version=version)  # waits for each engine's step in progress
            return state

        t0 = time.perf_counter()
        state = await asyncio.to_thread(push)  # off the event loop: rollouts go on meanwhile (async mode)
        return _nbytes(state), time.perf_counter() - t0

    async def save(self, path: Path) -> None:
        await asyncio.to_thread(self.trainer.save, path)

    async def close(self) -> None:
        for s in getattr(self, "samplers", []):
            s.close()
        if hasattr(self, "backend"):
            await self.backend.aclose()


class _TrainerActor:
    """A trainer rank, made in two steps: the actor, then (`start`) its Trainer, once rank 0's actor
    has said where the ranks meet (its node's address and a free port there: on a cluster the ranks
    may run on other machines than the driver)."""

    def __init__(self, cfg: VivaceConfig, rank: int, world_size: int):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size

    def start(self, master: str) -> None:
        cfg, rank, world_size = self.cfg, self.rank, self.world_size
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master.rsplit(":", 1)
        import torch

        if cfg.train.pipeline == "sync" and not torch.cuda.is_available():
            # Ray runs CPU actors on one thread; with the batch barrier the samplers idle while the
            # trainer works, so on CPU the trainer may use the node's cores.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        self.trainer = Trainer(cfg.train.model, cfg.train, rank=rank, world_size=world_size,
                               temperature=cfg.engine.temperature)  # fmt: skip

    def load(self, path: str) -> None:
        self.trainer.load(Path(path))

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        return self.trainer.train_step(samples)

    def sync_address(self) -> str:
        """This node's address and a port free on it (where the ranks meet, and the weight broadcast)."""
        import ray

        return f"{ray.util.get_node_ip_address()}:{_free_port()}"

    def join_weight_sync(self, address: str, world_size: int) -> list[str]:
        """Rank 0 joins the broadcast group as the sender; returns the names it will send."""
        from vivace.rl.weight_sync import WeightBroadcast

        names = sorted(self.trainer.model.state_dict())  # the full state's names, without gathering it
        if self.trainer.rank == 0:
            self.sync = WeightBroadcast(address, 0, world_size, self.trainer.device)
        return names

    def broadcast_weights(self, dtypes: dict[str, torch.dtype]) -> int:
        """Sends the weights in the replicas' `dtypes` (what they returned on joining); returns the bytes."""
        tensors = self.trainer.full_tensors()  # one all-gather per tensor: every rank takes part in each
        if self.trainer.rank == 0:
            return self.sync.send(tensors, dtypes)
        for _ in tensors:
            pass
        return 0

    def weights(self, piece_bytes: int = STORE_PIECE_BYTES) -> list:
        """[refs to the unsharded weights in the object store, their bytes] (rank 0; the other ranks take
        part in each tensor's gather and return [[], 0]). Rank 0 puts them in pieces as the ranks gather
        them (`store_pieces`), so it holds one piece, not the whole model (120 GB for a 30B model in fp32);
        the replicas load all the pieces as one update."""
        import ray

        tensors = self.trainer.full_tensors()
        refs, total = [], 0
        try:
            if self.trainer.rank == 0:
                for piece, nbytes in store_pieces(tensors, piece_bytes):
                    refs.append(ray.put(piece))  # a copy: the piece itself goes with the next one
                    total += nbytes
                    del piece
        finally:  # each tensor is an all-gather: a rank that stops early (a full object store) leaves the
            for _ in tensors:  # others waiting in one, so every rank takes the rest before it goes on or raises
                pass
        return [refs, total]

    def save(self, path: str) -> None:
        self.trainer.save(Path(path))


class _RolloutActor:
    """A rollout worker: runs episodes beside its own workspace backend, sampling from the replicas
    it is handed with each episode (so replaced replicas reach it without a restart)."""

    def __init__(self, cfg: VivaceConfig, episode: Any):
        from vivace.model.checkpoint import load_tokenizer
        from vivace.sandbox import open_backend

        self.cfg, self.episode_fn = cfg, episode
        self.chat = ChatFormat(load_tokenizer(cfg.train.model))
        self.params = sampling_params(cfg.engine)
        self.backend = open_backend(cfg.sandbox)

    async def episode_attempt(self, task: Task, samplers: list[Any]) -> EpisodeResult:
        import ray

        from vivace.inference.samplers import RayEngine

        replicas = [RayEngine(a) for a in samplers]
        return await run_attempt(replicas, self.chat, self.params, self.cfg.train.model, task, self.cfg, self.backend,
                                 episode=self.episode_fn, is_loss=lambda e: isinstance(e, ray.exceptions.RayActorError))  # fmt: skip

    def where(self) -> tuple[str, str | None]:
        """This worker's node, and why its sandbox runs commands unisolated when `auto` fell back to
        plain there (None otherwise): its own warning stays in its log, which the driver never shows."""
        import ray

        return ray.util.get_node_ip_address(), self.backend.fallback

    async def close(self) -> None:
        await self.backend.aclose()


class RayWorkers:
    store_piece_bytes = STORE_PIECE_BYTES  # the object-store sync's pieces (tests make them small)

    def __init__(
        self,
        cfg: VivaceConfig,
        episode: Any = None,
        address: str | None = None,
        on_note: Callable[[str], None] | None = None,
        on_cluster: Callable[[bool], None] | None = None,
    ):
        """`on_cluster(down)` hears when the cluster stops answering and when it answers again (see
        ClusterWatch); the run stops after the step in flight while it is down (`cluster_lost`)."""
        self.cfg, self.episode_fn, self.address = cfg, episode, address
        self.on_note = on_note or (lambda note: print(note, file=sys.stderr))  # stdout may be --json lines
        self.on_cluster = on_cluster or (lambda down: None)
        self.watch: ClusterWatch | None = None
        self.unisolated_nodes: set[str] = set()
        self.trainer_ranks, self.rollout_workers = cfg.train.trainer_ranks, cfg.train.rollout_workers
        self.replaced: Counter[str] = Counter()  # workers_replaced, samplers_replaced

    async def start(self, version: int, checkpoint: Path | None) -> None:
        import ray

        self.cfg = _for_actors(self.cfg)  # here, not in __init__: train() may set sft_data in between
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not ray.is_initialized():
            # The local cluster's processes start with SIGINT and SIGTERM blocked: a terminal's Ctrl-C
            # goes to the whole foreground process group, and `timeout`, systemd and Slurm send SIGTERM
            # to every process of the job; either would kill the daemons and actors before the driver
            # (the CLI) could end the run cleanly after the step in flight. The driver itself keeps its
            # handlers: a Ctrl-C while Ray starts is not lost. Sandboxed commands start with default
            # signals (sandbox/process.py).
            try:
                with blocked_in_children((signal.SIGINT, signal.SIGTERM)):
                    ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
            except ConnectionError as e:  # an OSError, which the CLI would take for the run directory's
                if self.address is None:
                    raise ClusterUnavailable(f"cannot start a local Ray cluster: {e}") from e
                raise ClusterUnavailable(
                    f"cannot join the Ray cluster at {self.address}: {e}. A cluster with token authentication "
                    "(Ray's default for local clusters from 2.59, for all from 2.61) also needs RAY_AUTH_MODE=token and "
                    "its token (~/.ray/auth_token or RAY_AUTH_TOKEN) here"
                ) from e
        self.watch = ClusterWatch(ray.get_runtime_context().gcs_address, self.on_cluster)
        tc = self.cfg.train
        resources = ray.cluster_resources()
        # One CPU per trainer rank and sampler replica, or an even share of what the cluster has, and GPUs as
        # gpu_shares lays them out: asking for more than exists, or for shares that do not fit on one GPU,
        # would leave actors unscheduled and the run waiting forever (one GPU: trainer and sampler share it).
        wanted = tc.trainer_ranks + tc.sampler_replicas
        self.cpus = min(1.0, resources.get("CPU", 1.0) / wanted)
        self.trainer_gpu, self.sampler_gpu = gpu_shares(
            resources.get("GPU", 0.0), tc.trainer_ranks, tc.sampler_replicas
        )
        self.broadcast = broadcast_sync(tc.weight_sync, self.trainer_gpu, self.sampler_gpu, self.cfg.engine.device)
        gpus = self.trainer_gpu * tc.trainer_ranks + self.sampler_gpu * tc.sampler_replicas
        if short := resources_short(resources, ray.available_resources(), {"CPU": self.cpus * wanted, "GPU": gpus}):
            self.on_note(f"the Ray cluster has {short}: this run's actors wait until other work on it ends")
        self.trainers = [
            ray.remote(_TrainerActor)
            .options(num_cpus=self.cpus, num_gpus=self.trainer_gpu)
            .remote(self.cfg, r, self.trainer_ranks)
            for r in range(self.trainer_ranks)
        ]
        master = await self.trainers[0].sync_address.remote()  # rank 0's node, wherever the cluster put it
        await _unwrapped(*(t.start.remote(master) for t in self.trainers))  # ranks > 1 meet there together
        self.samplers = [self._new_sampler(version, i) for i in range(tc.sampler_replicas)]
        self.workers = [self._new_worker() for _ in range(self.rollout_workers)]
        await self._note_unisolated(self.workers)
        if checkpoint is not None:
            await _unwrapped(*(t.load.remote(str(checkpoint)) for t in self.trainers))
        if self.broadcast:
            await self._join_broadcast()
        await self.sync(version)

    def _new_sampler(self, version: int, replica: int) -> Any:
        import ray

        from vivace.inference.samplers import _EngineActor

        cfg = _engine_config(self.cfg, version, replica)
        # Async actor: many episodes' requests at once, batched by the engine.
        return (
            ray.remote(_EngineActor)
            .options(num_cpus=self.cpus, num_gpus=self.sampler_gpu, max_concurrency=1000)
            .remote(self.cfg.train.model, cfg)
        )

    def _new_worker(self) -> Any:
        import ray

        return ray.remote(_RolloutActor).options(num_cpus=0, max_concurrency=1000).remote(self.cfg, self.episode_fn)

    async def _join_broadcast(self) -> None:
        """(Re)forms the broadcast group: trainer rank 0 and every replica, on a fresh address."""
        address = await self.trainers[0].sync_address.remote()
        world = 1 + len(self.samplers)
        joined = await asyncio.gather(
            *(t.join_weight_sync.remote(address, world) for t in self.trainers),
            *(s.join_weight_sync.remote(address, i + 1, world) for i, s in enumerate(self.samplers)),
        )
        self.names = joined[0]
        self.dtypes = joined[len(self.trainers)]  # as the replicas hold the weights: they load them alike

    def capacity(self) -> list[int]:
        return _split(self.cfg.train.rollout_concurrency, len(self.workers))

    async def episode(self, worker: int, task: Task) -> EpisodeResult:
        import ray

        ref = self.workers[worker].episode_attempt.remote(task, self.samplers)
        try:
            return await ref
        except asyncio.CancelledError:
            ray.cancel(ref)  # aborted: the worker stops the episode and closes its workspace
            raise
        except ray.exceptions.RayActorError as e:
            raise WorkerLost(f"rollout worker {worker} died: {e}") from e

    async def replace_worker(self, worker: int) -> None:
        import ray

        ray.kill(self.workers[worker])
        self.workers[worker] = self._new_worker()
        await self._note_unisolated([self.workers[worker]])
        self.replaced["workers_replaced"] += 1

    async def _note_unisolated(self, workers: list[Any]) -> None:
        """Waits for `workers` to start; says once per node where they run commands unisolated."""
        for node, fallback in await asyncio.gather(*(w.where.remote() for w in workers)):
            if fallback is not None and node not in self.unisolated_nodes:
                self.unisolated_nodes.add(node)
                self.on_note(f"WARNING: rollouts on node {node} run commands NOT isolated (plain backend): {fallback}")

    async def heal_samplers(self, version: int) -> int:
        """Replaces every replica that does not answer and gives it weights `version`; returns how
        many were replaced."""
        dead = await self._replace_dead(version)
        if dead:
            await self._push(version)
        return dead

    async def _replace_dead(self, version: int) -> int:
        import ray

        async def alive(actor: Any) -> bool:
            try:
                await asyncio.wait_for(actor.load.remote(), timeout=60)
                return True
            except (ray.exceptions.RayActorError, TimeoutError):
                return False

        states = await asyncio.gather(*(alive(s) for s in self.samplers))
        dead = [i for i, ok in enumerate(states) if not ok]
        for i in dead:
            ray.kill(self.samplers[i])
            self.samplers[i] = self._new_sampler(version, i)
        if dead and self.broadcast:
            await self._join_broadcast()
        self.replaced["samplers_replaced"] += len(dead)
        return len(dead)

    async def sampler_stats(self) -> dict[str, float]:
        import ray

        totals = {"generated_tokens": 0.0, "busy_s": 0.0}
        for s in self.samplers:
            try:
                m = await s.metrics.remote()
            except ray.exceptions.RayActorError:
                continue  # a dead replica's numbers went with it
            totals["generated_tokens"] += m["generated_tokens"]
            totals["busy_s"] += m["busy_s"]
        return totals

    async def train_step(self, samples: list[Sample]) -> dict[str, float]:
        stats = await asyncio.gather(*(t.train_step.remote(samples) for t in self.trainers))
        return stats[0]

    async def sync(self, version: int) -> tuple[int, float]:
        """Weights `version` to every replica; a replica found dead is replaced first (a broadcast
        to a dead member would stall the whole group)."""
        await self._replace_dead(version)
        t0 = time.perf_counter()
        return await self._push(version), time.perf_counter() - t0

    async def _push(self, version: int) -> int:
        if self.broadcast:
            sent, _ = await asyncio.gather(
                asyncio.gather(*(t.broadcast_weights.remote(self.dtypes) for t in self.trainers)),
                asyncio.gather(*(s.receive_weights.remote(self.names, version) for s in self.samplers)),
            )
            return sent[0]
        results = await asyncio.gather(*(t.weights.remote(self.store_piece_bytes) for t in self.trainers))
        refs, nbytes = results[0]
        await asyncio.gather(*(s.update_weights_from_store.remote(refs, version) for s in self.samplers))
        return nbytes  # the pieces are freed once the last replica has loaded them and these refs go

    async def save(self, path: Path) -> None:
        await asyncio.gather(*(t.save.remote(str(path)) for t in self.trainers))

    @property
    def cluster_lost(self) -> bool:
        return self.watch is not None and self.watch.down_since is not None

    async def close(self) -> None:
        import ray

        if self.watch is not None:
            self.watch.close()
        # Rollout workers remove their workspaces first (a killed one leaves them for the next run's
        # sweep); a dead or stuck one is killed all the same.
        closing = [w.close.remote() for w in getattr(self, "workers", [])]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True), ROLLOUT_CLOSE_TIMEOUT_S)
        for actor in [*getattr(self, "workers", []), *getattr(self, "samplers", []), *getattr(self, "trainers", [])]:
            ray.kill(actor)


async def _unwrapped(*refs: Any) -> list:
    """The results of actor calls `refs`; an actor's ValueError (a model or checkpoint that does not load:
    load_model and Trainer.load say which and why) is raised as itself, without Ray's wrapper, whose
    message is the whole remote traceback."""
    import ray

    try:
        return await asyncio.gather(*refs)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, ValueError):
            raise e.cause from None
        raise


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
