"""Who does the work of a training step: the sampler, the rollout workers and the trainer.

Two placements behind one interface (`start`, `rollout`, `sampled_tokens`, `train_step`, `sync`,
`save`, `close`), so the controller's loop is the same everywhere:

- `RayWorkers` (the default): Ray actors — one sampler replica (the engine, `_EngineActor` from
  inference/samplers.py), `rollout_workers` rollout workers (each an agent loop beside its own
  workspace backend, sampling through the sampler actor), and the trainer (one rank per actor,
  a torch.distributed group among them). `ray.init()` starts a local cluster unless `address`
  names one to join. Weights go from the trainer to the sampler through the object store (the
  trainer `ray.put`s its full state dict once and the sampler fetches it), or by collective
  broadcast from trainer rank 0 (rl/weight_sync.py: NCCL on GPUs, gloo on CPU).
- `LocalWorkers`: all in this process (tests, debugging, machines without Ray).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from vivace.config import EngineConfig, VivaceConfig
from vivace.harness.chat import ChatFormat
from vivace.harness.policy import TokenPolicy
from vivace.inference.samplers import sampling_params
from vivace.rl.rollout import Rollout, rollout_groups
from vivace.rl.trainer import Sample, Trainer
from vivace.tasks.format import Task


def _engine_config(cfg: VivaceConfig, version: int) -> EngineConfig:
    """The sampler's engine settings; its seed moves with the step so a resumed run does not
    replay the samples of its first steps."""
    return cfg.engine.model_copy(update={"seed": cfg.train.seed + version})


def _nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class LocalWorkers:
    def __init__(self, cfg: VivaceConfig, episode: Any = None):
        self.cfg, self.episode = cfg, episode

    async def start(self, version: int, checkpoint: Path | None) -> None:
        from vivace.inference.samplers import local_engine
        from vivace.sandbox import open_backend

        tc = self.cfg.train
        self.trainer = Trainer(tc.model, tc)
        if checkpoint is not None:
            self.trainer.load(checkpoint)
        self.sampler, chat = local_engine(tc.model, _engine_config(self.cfg, version))
        self.policy = TokenPolicy(self.sampler, chat, name=tc.model, params=sampling_params(self.cfg.engine))
        self.backend = open_backend(self.cfg.sandbox)
        await self.sync(version)

    async def rollout(self, tasks: list[Task]) -> list[list[Rollout]]:
        if self.episode is not None:
            return await rollout_groups(self.policy, tasks, self.cfg, self.backend, self.episode)
        return await rollout_groups(self.policy, tasks, self.cfg, self.backend)

    async def sampled_tokens(self) -> int:
        return self.sampler.engine.stats.generated_tokens

    async def train_step(self, samples: list[Sample]) -> dict[str, float]:
        return await asyncio.to_thread(self.trainer.train_step, samples)

    async def sync(self, version: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        state = self.trainer.full_state_dict()
        self.sampler.update_weights(state, version=version)
        return _nbytes(state), time.perf_counter() - t0

    async def save(self, path: Path) -> None:
        await asyncio.to_thread(self.trainer.save, path)

    async def close(self) -> None:
        if hasattr(self, "sampler"):
            self.sampler.close()
            await self.backend.aclose()


class _TrainerActor:
    def __init__(self, cfg: VivaceConfig, rank: int, world_size: int, master: str):
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master.split(":")
        self.trainer = Trainer(cfg.train.model, cfg.train, rank=rank, world_size=world_size)

    def load(self, path: str) -> None:
        self.trainer.load(Path(path))

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        return self.trainer.train_step(samples)

    def sync_address(self) -> str:
        import ray

        return f"{ray.util.get_node_ip_address()}:{_free_port()}"

    def join_weight_sync(self, address: str, world_size: int) -> list[str]:
        """Rank 0 joins the broadcast group as the sender; returns the names it will send."""
        from vivace.rl.weight_sync import WeightBroadcast

        names = sorted(self.trainer.full_state_dict())
        if self.trainer.rank == 0:
            self.sync = WeightBroadcast(address, 0, world_size, self.trainer.device)
        return names

    def broadcast_weights(self) -> int:
        state = self.trainer.full_state_dict()  # every rank takes part in the gather
        return self.sync.send(state) if self.trainer.rank == 0 else 0

    def weights(self) -> list:
        """[ref to the full state dict, its bytes] (rank 0; other ranks take part in the gather)."""
        import ray

        state = self.trainer.full_state_dict()
        return [ray.put(state), _nbytes(state)] if self.trainer.rank == 0 else [None, 0]

    def save(self, path: str) -> None:
        self.trainer.save(Path(path))


class _RolloutActor:
    def __init__(self, cfg: VivaceConfig, sampler: Any, episode: Any):
        from vivace.inference.samplers import RayEngine
        from vivace.model.checkpoint import load_tokenizer
        from vivace.sandbox import open_backend

        self.cfg, self.episode = cfg, episode
        chat = ChatFormat(load_tokenizer(cfg.train.model))
        self.policy = TokenPolicy(RayEngine(sampler), chat, name=cfg.train.model, params=sampling_params(cfg.engine))
        self.backend = open_backend(cfg.sandbox)

    async def rollout(self, tasks: list[Task]) -> list[list[Rollout]]:
        if self.episode is not None:
            return await rollout_groups(self.policy, tasks, self.cfg, self.backend, self.episode)
        return await rollout_groups(self.policy, tasks, self.cfg, self.backend)


class RayWorkers:
    def __init__(self, cfg: VivaceConfig, episode: Any = None, address: str | None = None):
        self.cfg, self.episode, self.address = cfg, episode, address
        self.trainer_ranks, self.rollout_workers = cfg.train.trainer_ranks, cfg.train.rollout_workers

    async def start(self, version: int, checkpoint: Path | None) -> None:
        import ray

        from vivace.inference.samplers import _EngineActor

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        master = f"127.0.0.1:{_free_port()}"
        tc = self.cfg.train
        gpu = 1 if ray.cluster_resources().get("GPU") else 0
        self.trainers = [
            ray.remote(_TrainerActor).options(num_cpus=1, num_gpus=gpu).remote(self.cfg, r, self.trainer_ranks, master)
            for r in range(self.trainer_ranks)
        ]
        engine_cfg = _engine_config(self.cfg, version)
        self.sampler = ray.remote(_EngineActor).options(num_cpus=1, num_gpus=gpu).remote(tc.model, engine_cfg)
        self.workers = [
            ray.remote(_RolloutActor).options(num_cpus=0).remote(self.cfg, self.sampler, self.episode)
            for _ in range(self.rollout_workers)
        ]
        if checkpoint is not None:
            await asyncio.gather(*(t.load.remote(str(checkpoint)) for t in self.trainers))
        mode = tc.weight_sync
        self.broadcast = mode == "broadcast" or (mode == "auto" and bool(gpu))
        if self.broadcast:
            address = await self.trainers[0].sync_address.remote()
            joined = await asyncio.gather(
                *(t.join_weight_sync.remote(address, 2) for t in self.trainers),
                self.sampler.join_weight_sync.remote(address, 1, 2),
            )
            self.names = joined[0]
        await self.sync(version)

    async def rollout(self, tasks: list[Task]) -> list[list[Rollout]]:
        shares = [tasks[i :: len(self.workers)] for i in range(len(self.workers))]
        parts = await asyncio.gather(*(w.rollout.remote(s) for w, s in zip(self.workers, shares, strict=True) if s))
        return [g for part in parts for g in part]

    async def sampled_tokens(self) -> int:
        return (await self.sampler.metrics.remote())["generated_tokens"]

    async def train_step(self, samples: list[Sample]) -> dict[str, float]:
        stats = await asyncio.gather(*(t.train_step.remote(samples) for t in self.trainers))
        return stats[0]

    async def sync(self, version: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        if self.broadcast:
            sent, _ = await asyncio.gather(
                asyncio.gather(*(t.broadcast_weights.remote() for t in self.trainers)),
                self.sampler.receive_weights.remote(self.names, version),
            )
            return sent[0], time.perf_counter() - t0
        results = await asyncio.gather(*(t.weights.remote() for t in self.trainers))
        ref, nbytes = results[0]
        await self.sampler.update_weights.remote(ref, version)
        return nbytes, time.perf_counter() - t0

    async def save(self, path: Path) -> None:
        await asyncio.gather(*(t.save.remote(str(path)) for t in self.trainers))

    async def close(self) -> None:
        import ray

        for actor in [*getattr(self, "workers", []), getattr(self, "sampler", None), *getattr(self, "trainers", [])]:
            if actor is not None:
                ray.kill(actor)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
