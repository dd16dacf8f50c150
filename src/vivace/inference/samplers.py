"""Sampler backends behind the harness's one `Sampler` interface, and the token-level policies
that `--model SPEC` names:

    tiny                              the tiny preset model, in-process engine
    PATH                              a local checkpoint directory, in-process engine
    tokens:http://HOST:PORT/v1#MODEL  an OpenAI-compatible server that returns token ids and
                                      logprobs (vLLM, SGLang, `vivace serve`); MODEL is sent as
                                      the model name and, being `tiny` or a local path, also
                                      gives the tokenizer for the chat format

Backends: `local_engine` (the engine on a background thread in this process), `RayEngine` (the
same engine as a Ray actor, for a sampler on another process or node) and `HttpSampler`
(inference/http_sampler.py).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import warnings
from pathlib import Path
from typing import Any

import torch

from vivace.config import EngineConfig, check_device
from vivace.harness.chat import ChatFormat
from vivace.harness.policy import Completion, ContextFull, SamplingParams, TokenPolicy
from vivace.inference.engine import AsyncEngine, Engine
from vivace.inference.http_sampler import HttpSampler
from vivace.model.checkpoint import LoadedModel, generation_eos_ids, load_model, load_tokenizer, model_config

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> str:
    """auto: cuda when one is visible, else cpu. A named device is checked here, so a typo or a
    missing GPU is a clear ValueError instead of a torch error from deep inside loading."""
    if check_device(device) == "auto":  # the forms config.py accepts for engine.device
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError as e:  # a type this torch was not built with
        raise ValueError(f"device {device!r}: this torch does not know it; use cpu, cuda, cuda:N or auto") from e
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA device is visible to torch here; use cpu or auto")
    return device


def load_for_engine(spec: str, config: EngineConfig) -> LoadedModel:
    device = resolve_device(config.device)
    if config.dtype != "float32" and torch.device(device).type == "cpu":
        # oneDNN builds (and keeps) kernels per input shape for bf16 and fp16, and an engine meets new shapes
        # all the time: tiny's engine grew 610 -> 1,266 MB over 30 batches where fp32 stayed at ~470.
        warnings.warn(
            f"engine.dtype {config.dtype} on a CPU: memory grows with every new batch shape (docs/benchmarks.md, "
            "'The trainer in bf16'), which a long-lived server or run may not survive; float32 stays flat on CPUs",
            RuntimeWarning,
            stacklevel=2,
        )
    return load_model(spec, dtype=DTYPES[config.dtype], device=device)


def local_engine(spec: str, config: EngineConfig | None = None) -> tuple[AsyncEngine, ChatFormat]:
    """The engine for a model spec on a background thread, and the chat format of its tokenizer."""
    config = config or EngineConfig()
    # A malformed generation_config.json is refused before the weights load (minutes, for a large model).
    if spec not in ("tiny", "tiny-init") and Path(spec).expanduser().is_dir():
        generation_eos_ids(spec)
    loaded = load_for_engine(spec, config)
    engine = Engine(
        loaded.model,
        max_batch=config.max_batch,
        max_step_tokens=config.max_step_tokens,
        prefix_cache_tokens=config.prefix_cache_tokens,
        seed=config.seed,
    )
    return AsyncEngine(engine, name=loaded.name), ChatFormat(loaded.tokenizer)


def sampling_params(config: EngineConfig) -> SamplingParams:
    """How agent turns are sampled (stop tokens and the token cap are set per turn by TokenPolicy)."""
    return SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)


def token_policy(spec: str, config: EngineConfig | None = None) -> TokenPolicy:
    config = config or EngineConfig()
    params = sampling_params(config)
    if spec.startswith("tokens:"):
        url, _, model = spec.removeprefix("tokens:").partition("#")
        if not model:
            raise ValueError(f"{spec!r}: name the model after '#' (tiny or a local checkpoint path, for its tokenizer)")
        tokenizer = load_tokenizer(model)
        sampler = HttpSampler(url, model, vocab_size=_vocab_size(model, tokenizer))
        return TokenPolicy(sampler, ChatFormat(tokenizer), name=spec, params=params)
    engine, chat = local_engine(spec, config)
    return TokenPolicy(engine, chat, name=spec, params=params)


def _vocab_size(model: str, tokenizer: Any) -> int:
    """How many token ids the model can emit: its config's vocab_size (the embedding rows, often
    padded past the tokenizer's ids), else (a tokenizer-only directory) the tokenizer's size."""
    try:
        config = model_config(model)
    except ValueError:
        return len(tokenizer)
    size = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    return size if isinstance(size, int) and size > 0 else len(tokenizer)


class RayEngine:
    """The engine in a Ray actor (its own process, or another node's GPU), as a `Sampler`.

    `RayEngine.remote_actor(spec, config)` starts the actor; this wrapper forwards `generate` and
    `update_weights` (weights travel through the Ray object store)."""

    def __init__(self, actor):
        self.actor = actor

    @staticmethod
    def remote_actor(spec: str, config: EngineConfig | None = None, **actor_options):
        import ray

        return RayEngine(ray.remote(_EngineActor).options(**actor_options).remote(spec, config or EngineConfig()))

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        import ray

        ref = self.actor.generate.remote(prompt_ids, params)
        try:
            return await ref
        except asyncio.CancelledError:
            ray.cancel(ref)  # the actor stops generating for an episode that was aborted
            raise
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, ContextFull):  # the episode's limit, said as the engine says it (not a traceback)
                raise e.cause from None
            raise

    async def load(self) -> int:
        return await self.actor.load.remote()

    async def update_weights(self, state: dict[str, torch.Tensor], version: int | None = None) -> int:
        return await self.actor.update_weights.remote(state, version)

    async def metrics(self) -> dict:
        return await self.actor.metrics.remote()


class _EngineActor:
    def __init__(self, spec: str, config: EngineConfig):
        self.engine, _ = local_engine(spec, config)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        return await self.engine.generate(prompt_ids, params)

    async def update_weights(self, state: dict[str, torch.Tensor], version: int | None = None) -> int:
        # From a thread: a sync method would hold the actor's event loop (every generate call waiting to be
        # submitted) while the update waits for the step in progress and copies the weights.
        return await asyncio.to_thread(self.engine.update_weights, state, version)

    async def update_weights_from_store(self, pieces: list, version: int | None = None) -> int:
        """Weights that the trainer put in the object store in pieces (rl/workers.py, `_TrainerActor.weights`):
        fetched, then loaded as one update, so no step samples from half of them."""
        from vivace.rl.weight_sync import from_store

        return await self.update_weights(from_store(await asyncio.gather(*pieces)), version)

    def join_weight_sync(self, address: str, rank: int, world_size: int) -> dict[str, torch.dtype]:
        """Joins the trainer's broadcast group (rl/weight_sync.py) as receiver `rank`; returns the dtype of each
        of the model's tensors, by name, for the sender to cast to (an fp32 trainer, a bf16 sampler)."""
        from vivace.rl.weight_sync import WeightBroadcast

        model = self.engine.engine.model
        self.sync = WeightBroadcast(address, rank, world_size, str(next(model.parameters()).device))
        tensors = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers())}
        return {name: t.dtype for name, t in tensors.items()}

    async def receive_weights(self, names: list[str], version: int) -> int:
        """Receives one broadcast into the model, between two engine steps; returns the bytes. From a thread,
        as update_weights: the actor's event loop goes on taking generate calls while the receive waits for the
        step in progress and then for the sender."""
        received = []

        def write(params: dict[str, torch.Tensor]) -> None:
            received.append(self.sync.receive(names, params))

        await asyncio.to_thread(self.engine.apply_weights, write, version)
        return received[0]

    def load(self) -> int:
        return self.engine.load()

    def metrics(self) -> dict:
        return self.engine.metrics()


class StickyRouter:
    """One episode's view of several sampler replicas: its first turn goes to the replica with
    the fewest in-flight tokens, later turns stay there (its prefix cache holds the episode).

    `replicas` are Samplers with a `load()` (sync or async): AsyncEngine, RayEngine. When the
    chosen replica fails, `lost` names it so the caller can re-queue the episode and replace
    the replica rather than train on a cut-off episode."""

    def __init__(self, replicas: list[Any], is_loss: Any = lambda e: False):
        if not replicas:
            raise ValueError("no sampler replicas to route to")
        self.replicas, self.is_loss = replicas, is_loss
        self.chosen: int | None = None
        self.lost: int | None = None
        self.seen_dead: set[int] = set()  # replicas that did not answer a load query

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        if self.chosen is None:
            self.chosen = await self._least_loaded()
        try:
            return await self.replicas[self.chosen].generate(prompt_ids, params)
        except Exception as e:
            if self.is_loss(e):
                self.lost = self.chosen
            raise

    async def _least_loaded(self) -> int:
        if len(self.replicas) == 1:
            return 0

        async def load(i: int) -> float:
            try:
                value = self.replicas[i].load()
                return float(await value if inspect.isawaitable(value) else value)
            except Exception as e:  # a replica that cannot answer is not chosen
                if self.is_loss(e):
                    self.seen_dead.add(i)
                    return float("inf")
                raise

        loads = await asyncio.gather(*(load(i) for i in range(len(self.replicas))))
        best = min(loads)
        return random.choice([i for i, x in enumerate(loads) if x == best])  # ties: spread a burst of starts
