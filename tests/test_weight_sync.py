"""Weight sync by collective broadcast (gloo here; NCCL takes the same path on GPUs): a trainer's
weights land in a running engine exactly, between two of its steps."""

from __future__ import annotations

import socket
import threading

import torch
from transformers import AutoModelForCausalLM

from vivace.harness.policy import SamplingParams
from vivace.inference.engine import Engine
from vivace.model.checkpoint import tiny_config
from vivace.rl.weight_sync import WeightBroadcast


def model(seed: int):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(512, max_position_embeddings=256)).eval()


def test_broadcast_into_a_running_engine():
    trainer, engine = model(1), Engine(model(0))
    state = {k: v for k, v in trainer.state_dict().items() if k != "lm_head.weight"}  # tied to the embedding
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    sent: list[int] = []
    sender = threading.Thread(target=lambda: sent.append(WeightBroadcast(address, 0, 2).send(state)))
    sender.start()
    receiver = WeightBroadcast(address, 1, 2)
    received: list[int] = []
    version = engine.apply_weights(lambda params: received.append(receiver.receive(list(state), params)), version=7)
    sender.join(timeout=60)
    assert version == 7 and sent == received and sent[0] == sum(t.numel() * 4 for t in state.values())
    for name, value in trainer.state_dict().items():
        assert torch.equal(dict(engine.model.named_parameters(remove_duplicate=False))[name], value), name
    p = list(range(1, 20))
    greedy = SamplingParams(max_tokens=8, temperature=0)
    assert engine.run([p], [greedy])[0].token_ids == Engine(trainer).run([p], [greedy])[0].token_ids


def test_broadcast_into_a_bf16_engine_sends_bf16():
    """A bf16 sampler of an fp32 trainer: the sender casts every tensor to the dtype the receiver reported
    (gloo aborts the receiving process on a size that differs; NCCL would garble the weights), so the engine
    holds the trainer's weights rounded to bf16, in half the bytes."""
    trainer, engine = model(1), Engine(model(0).to(torch.bfloat16))
    state = {k: v for k, v in trainer.state_dict().items() if k != "lm_head.weight"}
    dtypes = {n: p.dtype for n, p in engine.model.named_parameters(remove_duplicate=False)}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    sent: list[int] = []
    sender = threading.Thread(target=lambda: sent.append(WeightBroadcast(address, 0, 2).send(state, dtypes)))
    sender.start()
    receiver = WeightBroadcast(address, 1, 2)
    received: list[int] = []
    engine.apply_weights(lambda params: received.append(receiver.receive(list(state), params)), version=1)
    sender.join(timeout=60)
    assert sent == received and sent[0] == sum(t.numel() * 2 for t in state.values())
    held = dict(engine.model.named_parameters(remove_duplicate=False))
    for name, value in state.items():
        assert held[name].dtype == torch.bfloat16 and torch.equal(held[name], value.to(torch.bfloat16)), name


def test_the_trainer_streams_its_full_weights_one_tensor_at_a_time():
    """What the broadcast sends per step: every weight the trainer holds, unsharded, each equal to the
    gathered state's, in the sorted order the receivers take, and each a tensor of its own (gathered
    when asked for, not views into one gathered model)."""
    from vivace.config import TrainConfig
    from vivace.rl.trainer import Trainer

    trainer = Trainer("tiny-init", TrainConfig(model="tiny-init"))
    whole = trainer.full_state_dict()
    names = []
    for name, tensor in trainer.full_tensors():
        names.append(name)
        assert not isinstance(tensor, torch.distributed.tensor.DTensor) and torch.equal(tensor.cpu(), whole[name]), name
    assert names == sorted(whole) and "lm_head.weight" in names  # a tied weight under each of its names


def test_a_stream_out_of_name_order_is_refused():
    """The receivers take the names sorted: a sender's tensor out of that order would land in another's
    place, so the sender stops with an error instead of garbling every replica."""
    import pytest

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    alone = WeightBroadcast(address, 0, 1)  # a group of one: each broadcast returns at once
    assert alone.send(iter([("a", torch.ones(2)), ("b", torch.ones(3))])) == 20
    with pytest.raises(ValueError, match="'a' came after 'b'; send the tensors in sorted name order"):
        alone.send(iter([("b", torch.ones(2)), ("a", torch.ones(3))]))


def test_object_store_pieces_hold_every_weight_once_and_stay_bounded():
    """The object-store sync puts the weights in pieces: in the trainer's order, every tensor once, no piece
    past the bound unless one tensor alone is larger; read back, each is the weight, bf16 and 0-d included."""
    from vivace.rl.weight_sync import from_store, store_pieces

    state = {**model(1).state_dict(), "half": torch.randn(3, 5).bfloat16(), "scalar": torch.tensor(7)}
    sizes = {name: t.numel() * t.element_size() for name, t in state.items()}
    bound = 64 << 10
    pieces = list(store_pieces(state.items(), bound))
    assert len(pieces) > 3 and [n for p, _ in pieces for n in p] == list(state)
    for piece, nbytes in pieces:
        assert nbytes == sum(sizes[n] for n in piece) and (nbytes <= bound or len(piece) == 1)
    back = from_store(p for p, _ in pieces)
    assert all(back[n].dtype == t.dtype and torch.equal(back[n], t) for n, t in state.items())
    assert [len(p) for p, _ in store_pieces(state.items(), 1)] == [1] * len(state)


class _Gathering:
    """A trainer rank whose full_tensors counts the tensors taken (each is an all-gather on real ranks)."""

    def __init__(self, rank: int, tensors: dict):
        self.rank, self.tensors, self.taken = rank, tensors, 0

    def full_tensors(self):
        for item in self.tensors.items():
            self.taken += 1
            yield item


def test_the_trainer_puts_its_weights_in_pieces_and_a_failed_put_takes_every_tensor(monkeypatch):
    """Rank 0 returns a ref per piece and the bytes; the other ranks take every tensor and return none. A put
    that fails (a full object store) still takes every tensor before it raises: the other ranks would
    otherwise wait in the next all-gather until the group's timeout."""
    import pytest
    import ray

    from vivace.rl.workers import _TrainerActor

    state = dict(model(1).state_dict())
    put: list[dict] = []
    monkeypatch.setattr(ray, "put", lambda piece: put.append(piece) or f"ref{len(put)}")
    actor = _TrainerActor.__new__(_TrainerActor)
    actor.trainer = _Gathering(0, state)
    refs, nbytes = actor.weights(piece_bytes=64 << 10)
    assert refs == [f"ref{i + 1}" for i in range(len(put))] and len(put) > 3
    assert nbytes == sum(t.numel() * t.element_size() for t in state.values()) and actor.trainer.taken == len(state)
    assert {n for p in put for n in p} == set(state)
    actor.trainer = _Gathering(1, state)
    assert actor.weights(piece_bytes=64 << 10) == [[], 0] and actor.trainer.taken == len(state)

    def full(piece):
        raise ray.exceptions.ObjectStoreFullError("the object store is full")

    monkeypatch.setattr(ray, "put", full)
    actor.trainer = _Gathering(0, state)
    with pytest.raises(ray.exceptions.ObjectStoreFullError):
        actor.weights(piece_bytes=64 << 10)
    assert actor.trainer.taken == len(state)


async def test_a_replica_receiving_a_broadcast_keeps_its_event_loop():
    """The replica actor's receive waits for the engine's step in progress and then for the sender; it does
    so on a thread, so the actor's event loop goes on (its generate calls are taken meanwhile)."""
    import asyncio
    import time

    from vivace.config import EngineConfig
    from vivace.inference.samplers import _EngineActor

    class SlowSender:  # a receive that waits on the sender, as a collective does
        def receive(self, names, params):
            time.sleep(0.5)
            return 123

    actor = _EngineActor("tiny-init", EngineConfig())
    actor.sync = SlowSender()
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        assert await actor.receive_weights(["model.norm.weight"], 7) == 123
    finally:
        ticker.cancel()
        actor.engine.close()
    assert ticks >= 10 and actor.engine.engine.version == 7  # ~25 ticks in the 0.5 s; none if the loop was held
