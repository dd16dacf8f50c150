"""The trainer: the policy's weights, a torch.distributed group, AdamW, one update per step.

What: `Trainer.train_step(samples)` turns scored rollouts (token ids, loss mask, the sampler's
logprobs, an advantage) into one optimizer step with the loss of rl/loss.py; `full_state_dict()`
gives the weights for the sampler; `save`/`load` checkpoint the weights (a Hugging Face
directory), the optimizer and the step.

How: the model is sharded with FSDP2 (`fully_shard` per decoder layer, then the root) over a
process group (gloo on CPU, NCCL on GPU) before it holds any weight, and each rank reads its own
shard's rows from the checkpoint (`load_sharded`; rank 0 reads it and broadcasts the shards where that
cannot be done), so no rank ever holds the whole model (a 30B model is 120 GB in fp32); with one
rank that is a group of one, so the same code runs on a laptop and across GPUs (each rank trains on
its slice of the batch; FSDP averages gradients; ranks with fewer micro-batches run empty ones so
their collectives stay in step).
With `param_dtype` bfloat16 each layer computes in bf16 (FSDP2's mixed precision) while the shards,
AdamW's state and the gradient reduction stay fp32.
Micro-batches are rows of about `micro_batch_tokens` tokens: several rollouts packed end to end,
each attending only to itself and to the prompt they all open with, which the row computes once
(rl/packing.py: restarted positions, no padding), with logits computed only at the generated tokens (an agent episode is mostly prompt
and tool output). Gradients accumulate; the loss is normalised by the rank's generated tokens, so
micro-batching does not change the update (and ranks with equal token counts give the
single-rank update).

One update per batch: the trainer's own logprobs before the update (`logp_old`) equal the
current ones, so the PPO ratio is 1 and only the truncated importance weight (sampler vs trainer)
acts (the loss's clipping would matter only for several updates per batch, which vivace does not make).

With `cfg.sft_data`, every update also takes `sft_episodes` expert episodes' mean cross-entropy,
weighted by `sft_coef`, packed into rows like the rollouts (their own micro-batches, in the same
backward pass and optimizer step): the policy gradient moves the policy, the supervised term holds
it near what the warm start learnt from those episodes.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import errno
import os
import pickle
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from vivace.config import TrainConfig
from vivace.inference.sampling import is_greedy
from vivace.model.checkpoint import load_model, load_tokenizer, model_config, require_weights, save_checkpoint
from vivace.model.rows import CheckpointRows
from vivace.model.stream_save import save_streamed, streamable
from vivace.rl.loss import LossConfig, policy_loss
from vivace.rl.packing import IGNORE, PACKED, Episode, forward_row, make_episode, pack, shared_prefix
from vivace.rl.sft_train import read_episodes


@dataclass
class Sample:
    """One rollout as the trainer sees it."""

    ids: list[int]
    mask: list[int]  # 1 on generated tokens
    logprobs: list[float]  # sampler logprobs (0 where mask is 0)
    versions: list[int]  # policy version per token (-1 where mask is 0)
    advantage: float

    @property
    def n_generated(self) -> int:
        return sum(self.mask)


_EMPTY = Sample(ids=[0, 0], mask=[0, 0], logprobs=[0.0, 0.0], versions=[-1, -1], advantage=0.0)  # a no-op micro-batch


def init_distributed(rank: int = 0, world_size: int = 1) -> None:
    """Joins (or makes) the trainer's process group: NCCL for GPU tensors, gloo for CPU ones."""
    if dist.is_initialized():
        return
    # Both on a GPU machine: a collective over CPU tensors (a flag, a pickled object, a shard read on the
    # CPU) then goes through gloo where NCCL alone refuses it ("no backend type associated with cpu").
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    # NCCL's default is 10 minutes, gloo's 30: the other ranks wait in a collective while rank 0 alone reads
    # the checkpoint (load_sharded), and a large one on a network filesystem takes longer than 10.
    timeout = datetime.timedelta(minutes=30)
    if world_size == 1:
        # One rank needs no rendezvous: an in-memory store cannot lose a race for a free port
        # to another process (a TCP store on a just-freed port sometimes did, beside Ray).
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)


def _portable(error: Exception) -> Exception:
    """`error` as it can cross broadcast_object_list (a pickle): itself when it pickles, else a
    RuntimeError with its type and message (an exception that does not pickle would fail rank 0's send
    and leave the other ranks waiting)."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _read_on_rank0(read: Callable[[], tuple[Any, Any]], device: str) -> tuple[Any, Any]:
    """Runs `read` on rank 0 alone; it returns (what rank 0 keeps, what every rank is sent). Returns that
    pair on rank 0 and (None, what was sent) on the others. An error in `read` is raised on every rank:
    the others wait for the broadcast and must hear of it."""
    kept, found = None, [None]
    if dist.get_rank() == 0:
        try:
            kept, sent = read()
            found = [sent]
        except Exception as e:
            if dist.get_world_size() == 1:
                raise
            found = [_portable(e)]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(found, src=0, device=torch.device(device))
    if isinstance(found[0], Exception):
        raise found[0]
    return kept, found[0]


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Modules built inside hold their parameters on the meta device (no memory) and their buffers for real:
    the rotary frequencies, which come from the config and which no checkpoint holds. It swaps
    torch.nn.Module.register_parameter for the duration (as accelerate's init_empty_weights does), so no
    other thread may build a model meanwhile: the trainer starts before any engine in its process."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":  # one already there is kept: a tied weight stays one
            module._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def load_sharded(
    spec: str, device: str, param_dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model `spec` names, sharded with FSDP2 over the trainer's group, and its tokenizer; every rank
    calls it. Each rank builds the model with its parameters on the meta device and shards it before any
    weight exists, so a rank never holds more than its shard. Then each rank reads its own shard's rows
    from the checkpoint's safetensors files (model/rows.py: 1/W of the checkpoint each); where that cannot
    be done on every rank (.bin weights, a conversion it does not reproduce, the files missing on some
    node), rank 0 alone reads the checkpoint (on CPU, with load_model's checks) and broadcasts the shards.
    Rank 0 checks the checkpoint first either way: one it refuses raises the same ValueError on every rank.
    The shards stay fp32; each layer computes in `param_dtype` (FSDP2's mixed precision: the gathered
    parameters cast, gradients reduced in fp32)."""

    def check():
        require_weights(spec)
        return None, model_config(spec)

    _, config = _read_on_rank0(check, device)
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    buffers = {name: value.clone() for name, value in model.named_buffers()}
    mixed = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mixed)
    fully_shard(model, mp_policy=mixed)
    model.to_empty(device=device)
    with torch.no_grad():
        for name, value in buffers.items():
            model.get_buffer(name).copy_(value)
    if not _read_rows_everywhere(model, spec, device):
        loaded, _ = _read_on_rank0(lambda: (load_model(spec), None), device)
        weights = loaded.model.state_dict() if loaded else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, weights, options=options)
    return model, load_tokenizer(spec)


def _read_rows_everywhere(model: PreTrainedModel, spec: str, device: str) -> bool:
    """Fills every rank's shards of `model` with its own rows of checkpoint `spec` and returns True; or,
    when any rank cannot plan them (CheckpointRows.open gives None: other names or shapes, .bin weights, the
    files missing on its node), reads nothing and returns False on every rank (an all-reduce decides)."""
    reader = CheckpointRows.open(spec, model)
    everywhere = torch.tensor([reader is not None], dtype=torch.int32, device=device)
    dist.all_reduce(everywhere, op=dist.ReduceOp.MIN)
    if not everywhere.item():
        return False
    error = None
    try:
        with torch.no_grad():
            _read_rows(model, reader, dist.get_rank(), dist.get_world_size())
    except Exception as e:  # raised on every rank: the others would wait for it in the next collective
        error = e
    done = torch.tensor([error is None], dtype=torch.int32, device=device)
    dist.all_reduce(done, op=dist.ReduceOp.MIN)
    if error is not None:
        raise error
    if not done.item():
        raise RuntimeError(f"another trainer rank could not read its rows of {spec}: its log says why")
    return True


def _read_rows(model: PreTrainedModel, reader: CheckpointRows, rank: int, world: int) -> None:
    """Every parameter's shard filled with this rank's rows of it from the checkpoint, and the buffers the
    checkpoint holds. FSDP2 shards a parameter into torch.chunk's blocks of dim 0: ceil(N / world) rows
    each, the last ones short or empty."""
    for name, param in model.named_parameters():
        local = param.to_local()
        start = min(param.shape[0], rank * -(-param.shape[0] // world))
        if local.shape[0]:
            local.copy_(reader.rows(name, start, start + local.shape[0]))
    persistent = model.state_dict().keys() & dict(model.named_buffers()).keys()
    for name in persistent & reader.plans.keys():
        buffer = model.get_buffer(name)
        buffer.copy_(reader.rows(name, 0, buffer.shape[0] if buffer.dim() else None))


@contextlib.contextmanager
def failed_writes_as_oserror(path: Path) -> Iterator[None]:
    """A checkpoint write that fails (a full disk, a read-only mount) as an OSError naming `path`, which
    the CLI reports in one line with the resume command. torch's zip writer says a full disk as a
    RuntimeError ("unexpected pos"), and dcp wraps any rank's failure in a CheckpointException: a
    BaseException, which no `except Exception` sees, so it ended the run with every rank's traceback."""
    try:
        yield
    except CheckpointException as e:
        causes = [exc for exc, _ in e.failures.values()]
        os_error = next((c for c in causes if isinstance(c, OSError)), None)
        if os_error is not None:
            raise os_error from None
        first = f"{type(causes[0]).__name__}: {causes[0]}".splitlines()[0] if causes else "no cause given"
        raise OSError(errno.EIO, f"the write failed ({first}); a full disk does this", str(path)) from None
    except RuntimeError as e:
        if "inline_container" not in str(e):  # not torch's zip writer: a real error, not a write that failed
            raise
        raise OSError(
            errno.EIO, "the write failed (torch's writer stopped short); a full disk does this", str(path)
        ) from None


class Trainer:
    def __init__(
        self,
        model_spec: str,
        cfg: TrainConfig,
        rank: int = 0,
        world_size: int = 1,
        temperature: float = 1.0,
    ):
        init_distributed(rank, world_size)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        # The policy being trained is the one the sampler draws from: logits / temperature
        # (greedy, below MIN_TEMPERATURE, has no logprobs to train on and counts as 1, as in the sampler).
        self.temperature = 1.0 if is_greedy(temperature) else temperature
        self.device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        param_dtype = getattr(torch, cfg.param_dtype)
        self.model, self.tokenizer = load_sharded(model_spec, self.device, param_dtype)
        self.config = copy.deepcopy(self.model.config)  # as loaded: what a saved checkpoint describes
        self.model.train().set_attn_implementation(PACKED)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, eps=cfg.adam_eps
        )
        self.loss_cfg = LossConfig(cfg.clip_low, cfg.clip_high, cfg.is_cap, cfg.kl_coef)
        self.reference = None
        if cfg.kl_coef > 0:  # a frozen copy of the starting policy
            self.reference = load_sharded(model_spec, self.device, param_dtype)[0].eval().requires_grad_(False)
            self.reference.set_attn_implementation(PACKED)
        # Expert episodes for the supervised term (cfg.sft_data), visited in one seeded shuffled order
        # that every rank shares; the step number says where the cycle is, so a resumed run continues it.
        self.expert: list[Episode] = []
        if cfg.sft_data is not None and cfg.sft_coef > 0:
            self.expert = read_episodes(Path(cfg.sft_data), self.model.config.vocab_size)
            self.expert_order = list(range(len(self.expert)))
            random.Random(cfg.seed).shuffle(self.expert_order)
        self.step = 0

    # ---- training -------------------------------------------------------------------------------

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        """One step on this rank's samples; returns the step's statistics."""
        t0 = time.perf_counter()
        mine = samples[self.rank :: self.world_size]
        totals = self._update(mine)
        self.step += 1
        tokens = sum(len(s.ids) for s in mine)
        totals["train_s"] = time.perf_counter() - t0
        totals["train_tokens_per_s"] = tokens / totals["train_s"]
        return totals

    def _update(self, samples: list[Sample]) -> dict[str, float]:
        n_tokens = sum(s.n_generated for s in samples)
        stats_sum: dict[str, float] = {}
        weight_sum = 0.0
        entropy_sum = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        expert_rows = self._expert_rows()
        expert_tokens = sum(t != IGNORE for row in expert_rows for e in row for t in e.labels)
        micros: list = expert_rows + self._micro_batches(samples)
        if self.world_size > 1:
            # FSDP's forward and backward are collectives: every rank runs as many micro-batches
            # (padding with empty ones, loss 0) and syncs gradients on the last backward only.
            count = torch.tensor([len(micros)], device=self.device)  # NCCL reduces only GPU tensors
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
            micros += [[_EMPTY]] * (int(count) - len(micros))
        for i, micro in enumerate(micros):
            if self.world_size > 1:
                self.model.set_requires_gradient_sync(i == len(micros) - 1)
            if isinstance(micro[0], Episode):  # the supervised term: mean cross-entropy over expert tokens
                out, labels = forward_row(self.model, micro, trained_only=True)
                if self.reference is not None and self.world_size > 1:
                    # The sharded reference's forward is a collective too: ranks on a rollout row run it
                    # here, so this rank runs it as well (unused), or the ranks' all-gathers would pair wrongly.
                    with torch.no_grad():
                        forward_row(self.reference, micro, trained_only=True)
                ce = F.cross_entropy(out.logits[0].float(), labels, reduction="sum") / max(expert_tokens, 1)
                (self.cfg.sft_coef * ce).backward()
                stats_sum["sft_loss"] = stats_sum.get("sft_loss", 0.0) + float(ce.detach())
                continue
            logp, entropy, mask, behav, adv = self._forward(micro)
            ref = self._reference_logprobs(micro) if self.reference is not None else None
            loss, stats = policy_loss(logp, logp.detach(), behav, adv, mask, self.loss_cfg, max(n_tokens, 1), ref)
            loss.backward()
            w = stats["tokens"]
            weight_sum += w
            entropy_sum += float((entropy * mask).sum())
            stats_sum["loss"] = stats_sum.get("loss", 0.0) + float(loss.detach())
            for k, v in stats.items():  # per-token means, weighted by each micro-batch's tokens
                if k != "tokens":
                    stats_sum[k] = stats_sum.get(k, 0.0) + v * w
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        out = {k: (v if k in ("loss", "sft_loss") else v / max(weight_sum, 1.0)) for k, v in stats_sum.items()}
        out["grad_norm"] = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        out["entropy"] = entropy_sum / max(weight_sum, 1.0)
        out["trained_tokens"] = weight_sum
        return out

    def _expert_rows(self) -> list[list[Episode]]:
        """This update's expert episodes (this rank's share), packed like rollouts."""
        if not self.expert:
            return []
        n = len(self.expert)
        k = min(self.cfg.sft_episodes, n)  # more would repeat episodes in one update: their gradient again
        start = self.step * k
        picked = [self.expert[self.expert_order[(start + j) % n]] for j in range(k)][self.rank :: self.world_size]
        return self._rows(picked, picked)

    def _micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        """Rollouts packed into rows of at most `micro_batch_tokens` computed positions (the prompt they
        all open with counted once per row; a longer rollout gets its own row)."""
        return self._rows(samples, [make_episode(s.ids, s.mask) for s in samples])

    def _rows(self, items: list, episodes: list[Episode]) -> list[list]:
        """`items` grouped into rows of at most `micro_batch_tokens` computed positions (`episodes`: their
        token sequences; the opening they share counted once per row)."""
        if not items:
            return []
        rows = pack([len(e.ids) for e in episodes], self.cfg.micro_batch_tokens, shared=shared_prefix(episodes))
        return [[items[i] for i in row] for row in rows]

    def _forward(self, micro: list[Sample], model: torch.nn.Module | None = None):
        """Logprobs (with grad unless `model` is the frozen reference) and entropies of the
        generated tokens of one packed row, flattened in sample order, with their mask (all ones),
        sampler logprobs and advantages."""
        out, targets = forward_row(model or self.model, [make_episode(s.ids, s.mask) for s in micro], trained_only=True)
        logps = torch.log_softmax(out.logits[0].float() / self.temperature, dim=-1)
        logp = logps.gather(-1, targets[:, None])[:, 0]
        with torch.no_grad():
            entropy = -(logps.exp() * logps).sum(-1)
        generated = [[j for j in range(1, len(s.ids)) if s.mask[j]] for s in micro]
        behav = torch.tensor(
            [s.logprobs[j] for s, js in zip(micro, generated, strict=True) for j in js], dtype=torch.float32
        )
        adv = torch.tensor(
            [s.advantage for s, js in zip(micro, generated, strict=True) for _ in js], dtype=torch.float32
        )
        return logp, entropy, torch.ones_like(logp), behav.to(self.device), adv.to(self.device)

    @torch.no_grad()
    def _reference_logprobs(self, micro: list[Sample]) -> torch.Tensor:
        return self._forward(micro, self.reference)[0]

    # ---- weights and checkpoints ------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded weights on CPU (every rank must call; rank 0 uses them)."""
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The unsharded weights one at a time, in sorted name order, on the trainer's device: each is an
        all-gather, so every rank must take every one, and none holds more than one unsharded tensor at a
        time (full_state_dict holds the whole model on rank 0's host: 120 GB for a 30B model in fp32)."""
        state = self.model.state_dict()  # the shards' names (a tied weight under each of its names)
        for name in sorted(state):
            value = state[name]
            yield name, value.full_tensor() if isinstance(value, DTensor) else value

    def save(self, path: Path) -> None:
        """Weights as a Hugging Face directory (path/model, written by rank 0 one file at a time as the ranks
        gather each tensor: model/stream_save.py), the optimizer as a distributed checkpoint (path/optimizer:
        every rank writes its own shard, so no rank gathers Adam's two copies of the model) and the step
        (path/trainer.pt). Every rank calls it; the ranks must share `path`. A model whose weights cannot be
        written file by file is gathered whole on rank 0 and written by save_pretrained."""
        path.mkdir(parents=True, exist_ok=True)
        with failed_writes_as_oserror(path / "optimizer"):
            dcp.save(
                {"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}, checkpoint_id=path / "optimizer"
            )
        with torch.device("meta"):  # an unsharded twin: the config, conversions and tied names the files need
            plain = AutoModelForCausalLM.from_config(self.config, dtype=torch.float32)
        file_bytes = self.cfg.checkpoint_file_mb * 2**20
        if streamable(plain, file_bytes):
            tensors = self.full_tensors()
            try:
                if self.rank == 0:
                    save_streamed(plain, self.tokenizer, tensors, path / "model", file_bytes)
            finally:  # each tensor is an all-gather: a rank that stops early (a write error) leaves the others
                for _ in tensors:  # waiting in one, so every rank takes the rest before it goes on or raises
                    pass
        else:
            weights = self.full_state_dict()
            if self.rank == 0:
                plain.load_state_dict(weights, strict=False, assign=True)
                plain.tie_weights()  # tied weights (lm_head) follow the embedding
                save_checkpoint(plain, self.tokenizer, path / "model")
        if self.rank == 0:
            with failed_writes_as_oserror(path / "trainer.pt"):
                torch.save({"step": self.step}, path / "trainer.pt")

    def load(self, path: Path) -> None:
        """Weights, optimizer and step of checkpoint `path` (as `save` wrote them); a ValueError naming it
        and saying why when it does not load, on every rank. Each rank reads its own shard of the weights
        (its rows, as load_sharded does) and of the optimizer. Where the weights' rows cannot be read on
        every rank (another model's names or shapes, a node without the files), rank 0 alone reads them
        (load_model, with its checks) and broadcasts them into the other ranks' shards. A checkpoint from
        before the optimizer was sharded (trainer.pt holding it whole) loads too, from rank 0 by broadcast."""
        weights_dir = str(path / "model")

        def read_state():
            require_weights(weights_dir)  # damaged files: the same ValueError on every rank, before any read
            saved = torch.load(path / "trainer.pt", weights_only=True)  # tensors and plain values; never code
            return saved, (int(saved["step"]), "optimizer" in saved)

        def read_weights():
            weights = load_model(weights_dir).model.state_dict()
            return weights, self._mismatch(weights)

        try:
            saved, (step, whole_optimizer) = _read_on_rank0(read_state, self.device)
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
            if not _read_rows_everywhere(self.model, weights_dir, self.device):
                weights, mismatch = _read_on_rank0(read_weights, self.device)
                if mismatch:
                    raise ValueError(mismatch)
                set_model_state_dict(self.model, weights or {}, options=options)
            if whole_optimizer:
                set_optimizer_state_dict(
                    self.model, self.optimizer, (saved or {}).get("optimizer", {}), options=options
                )
            else:
                state = {"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}  # the shapes to fill
                dcp.load(state, checkpoint_id=path / "optimizer")
                set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
            self.step = step
        except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError,
                CheckpointException) as e:  # fmt: skip
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise ValueError(f"{path}: cannot resume from this checkpoint ({type(e).__name__}: {first}); it is "
                             "damaged or of another model: move it out of checkpoints/ to resume from the one "
                             "before") from e  # fmt: skip

    def _mismatch(self, weights: dict[str, torch.Tensor]) -> str:
        """How a checkpoint's weights differ in names or shapes from the policy's ('' when they fit): found
        before the broadcast, which a mismatch would leave half done on some ranks."""
        own = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}  # global shapes of the shards
        wrong = sorted(k for k in weights.keys() & own.keys() if tuple(weights[k].shape) != own[k])
        missing = sorted(own.keys() - weights.keys())
        extra = sorted(weights.keys() - own.keys())
        parts = [f"{what}: {', '.join(keys[:3])}" for what, keys in
                 (("other shapes", wrong), ("missing", missing), ("not in this model", extra)) if keys]  # fmt: skip
        return "; ".join(parts)
