"""The sampling engine: logprobs equal a full forward pass, continuous batching, chunked
prefill, prefix reuse, stop/length rules, seeded sampling, weight updates, the async front."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from vivace.harness.policy import SamplingParams
from vivace.inference import forward as ragged
from vivace.inference.engine import AsyncEngine, Engine
from vivace.inference.forward import RaggedForward, Segment
from vivace.inference.sampling import sample
from vivace.model.checkpoint import count_parameters, tiny_config

VOCAB = 512


def small_model(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = tiny_config(VOCAB, **{"max_position_embeddings": 512, **overrides})
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model():
    return small_model()


def prompts(n: int, seed: int = 1, lengths=(3, 40, 100, 1, 150, 17, 60, 9, 33, 70)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


def reference_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    return [logp[len(prompt) - 1 + i, t].item() for i, t in enumerate(output)]


def test_tiny_preset_shape():
    m = AutoModelForCausalLM.from_config(tiny_config(4096))
    counts = count_parameters(m)
    assert 5e6 <= counts["total"] <= 20e6 and counts["active"] < counts["total"]
    assert m.config.num_experts == 8 and m.config.num_experts_per_tok == 2
    assert m.config.max_position_embeddings >= 4096


def test_logprobs_match_a_full_forward_pass(model):
    # Small batch and step budget: requests wait, join mid-run and prompts prefill in chunks.
    engine = Engine(model, max_batch=4, max_step_tokens=48, prefix_cache_tokens=0)
    ps = prompts(10)
    params = [
        SamplingParams(max_tokens=m, temperature=t, top_p=p, top_k=k, seed=i)
        for i, (m, t, p, k) in enumerate(
            [(12, 1.0, 1.0, 0), (30, 0.7, 0.9, 0), (5, 0.0, 1.0, 0), (25, 1.3, 1.0, 50), (20, 1.0, 0.5, 0),
             (8, 1.0, 1.0, 0), (16, 0.0, 1.0, 0), (12, 1.0, 1.0, 5), (25, 1.0, 1.0, 0), (15, 0.8, 0.95, 20)]
        )
    ]  # fmt: skip
    outs = engine.run(ps, params)
    assert [len(o.token_ids) for o in outs] == [p.max_tokens for p in params]
    assert all(o.finish_reason == "length" and o.policy_version == 0 for o in outs)
    assert max(engine.stats.batch_sum / engine.stats.steps, 0) <= 4
    for p, sp, o in zip(ps, params, outs, strict=True):
        ref = reference_logprobs(model, p, o.token_ids, sp.temperature)
        assert max(abs(a - b) for a, b in zip(ref, o.logprobs, strict=True)) < 1e-4
        if sp.temperature == 0:  # greedy is the argmax of the full forward pass
            with torch.no_grad():
                logits = model(torch.tensor([p + o.token_ids])).logits[0]
            assert o.token_ids == logits[len(p) - 1 : -1].argmax(-1).tolist()


def test_seeded_requests_do_not_depend_on_the_batch(model):
    ps = prompts(6, seed=3)
    params = [SamplingParams(max_tokens=10, seed=100 + i) for i in range(6)]
    together = Engine(model, max_batch=6).run(ps, params)
    alone = [Engine(model, max_batch=1).run([p], [sp])[0] for p, sp in zip(ps, params, strict=True)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    other_seed = Engine(model).run([ps[0]], [SamplingParams(max_tokens=10, seed=7)])[0]
    assert other_seed.token_ids != together[0].token_ids


@pytest.mark.parametrize(
    "kv_heads, flash, dtype",
    [(2, True, torch.float32), (4, True, torch.float32), (2, False, torch.float32), (2, True, torch.bfloat16)],
)  # grouped-query and plain multi-head attention; PyTorch's CPU flash kernel or the plain fallback; bf16 weights
def test_decoding_sequences_read_their_shared_prefix_once(kv_heads, flash, dtype, monkeypatch):
    if not flash:
        monkeypatch.setattr(ragged, "_FLASH_CPU", None)
    m = small_model(num_key_value_heads=kv_heads).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    fwd = RaggedForward(m)
    g = torch.Generator().manual_seed(21)

    def rand(n):
        return torch.randint(0, VOCAB, (n,), generator=g).tolist()

    shared = rand(100)
    seqs = {"root": list(shared)}
    caches = {"root": fwd.new_cache(400)}
    fwd(shared, [Segment(caches["root"], 100)])
    # Copies of the root (all of it, or its first 80 positions), a copy of a copy (which still reads
    # the root's prefix), and an unrelated sequence.
    for name, source, n in [("a", "root", 100), ("b", "root", 80), ("c", "a", None), ("alone", None, 0)]:
        cache = caches[name] = fwd.new_cache(400)
        if source is not None:
            n = caches[source].length if n is None else n
            cache.copy_prefix(caches[source], n)
        own = rand(5 + 7 * len(caches))
        seqs[name] = seqs[source][:n] + own if source else own
        fwd(own, [Segment(cache, len(own))])
    assert caches["c"].origin == (caches["root"], 100) and caches["b"].origin == (caches["root"], 80)

    names = list(seqs)
    step = [rand(1)[0] for _ in names]
    segments = [Segment(caches[n], 1) for n in names]
    groups, alone = ragged._cascade_groups(segments)
    assert [(root is caches["root"], p, members) for root, p, members in groups] == [(True, 80, [0, 1, 2, 3])]
    assert alone == [4]
    cascade = fwd(step, segments)
    for n in names:
        caches[n].length -= 1  # the same step again, each sequence attending alone
    monkeypatch.setattr(ragged, "MIN_CASCADE_PREFIX", 10**9)
    assert ragged._cascade_groups(segments)[0] == []
    one_by_one = fwd(step, segments)
    assert torch.allclose(cascade, one_by_one, atol=tol), (cascade - one_by_one).abs().max()
    with torch.no_grad():
        full = torch.stack([m(torch.tensor([seqs[n] + [t]])).logits[0, -1] for n, t in zip(names, step, strict=True)])
    assert torch.allclose(cascade, full.float(), atol=10 * tol), (cascade - full.float()).abs().max()


@pytest.mark.parametrize("kv_heads, dtype", [(2, torch.float32), (4, torch.float32), (2, torch.bfloat16)])
def test_prompt_chunks_attend_over_their_past_and_causally_over_themselves(kv_heads, dtype, monkeypatch):
    """On CPU a prompt chunk is attended in two flash calls (the cached past, then the chunk itself, causal)
    merged by their log-sum-exp: the logits of one masked call, and of the model's own forward pass, for a
    first chunk and for one after 100 cached positions, in one step."""
    m = small_model(num_key_value_heads=kv_heads).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    fwd = RaggedForward(m)
    tokens = torch.randint(0, VOCAB, (250,), generator=torch.Generator().manual_seed(5)).tolist()
    n = ragged.MIN_SPLIT_CHUNK + 22

    def step():
        first, second = fwd.new_cache(400), fwd.new_cache(400)
        fwd(tokens[:100], [Segment(second, 100)])
        return fwd(tokens[:n] + tokens[100 : 100 + n], [Segment(first, n), Segment(second, n)])

    split = step()
    monkeypatch.setattr(ragged, "_FLASH_CPU", None)  # the single masked call
    masked = step()
    assert torch.allclose(split, masked, atol=tol), (split - masked).abs().max()
    with torch.no_grad():
        full = torch.stack([m(torch.tensor([tokens[:end]])).logits[0, -1] for end in (n, 100 + n)]).float()
    assert torch.allclose(split, full, atol=10 * tol), (split - full).abs().max()


def test_stop_tokens_and_context_limit(model):
    engine = Engine(model)
    p = prompts(1, seed=4)[0]
    first = engine.run([p], [SamplingParams(max_tokens=6, temperature=0)])[0]
    stop = first.token_ids[2]
    stopped = engine.run([p], [SamplingParams(max_tokens=6, temperature=0, stop_token_ids=(stop,))])[0]
    cut = first.token_ids.index(stop) + 1
    assert stopped.finish_reason == "stop" and stopped.token_ids == first.token_ids[:cut]  # stop token kept
    with pytest.raises(ValueError, match="context is 512"):
        engine.add([1] * 512, SamplingParams())
    with pytest.raises(ValueError, match="out of range"):
        engine.add([VOCAB], SamplingParams())
    for never in (VOCAB, -5):  # a stop id no token has: the request would never end at it, silently
        with pytest.raises(ValueError, match=rf"stop token ids out of range \[0, {VOCAB}\): \[{never}\]"):
            engine.add([1], SamplingParams(stop_token_ids=(3, never)))
    with pytest.raises(ValueError, match="empty"):
        engine.add([], SamplingParams())
    near = engine.run([[5] * 500], [SamplingParams(max_tokens=100)])[0]
    assert near.finish_reason == "length" and len(near.token_ids) == 12  # the context is full


def test_prefix_cache_reuses_a_conversation(model):
    engine = Engine(model, max_step_tokens=4096)
    p = prompts(1, seed=5, lengths=(120,))[0]
    first = engine.run([p], [SamplingParams(max_tokens=20, seed=1)])[0]
    follow = p + first.token_ids + [7, 8, 9, 10]  # the next turn appends tool results
    second = engine.run([follow], [SamplingParams(max_tokens=10, seed=2)])[0]
    assert engine.stats.reused_tokens == len(p) + len(first.token_ids) - 1  # all but the last sampled token
    ref = reference_logprobs(model, follow, second.token_ids)
    assert max(abs(a - b) for a, b in zip(ref, second.logprobs, strict=True)) < 1e-4
    fresh = Engine(model, prefix_cache_tokens=0).run([follow], [SamplingParams(max_tokens=10, seed=2)])[0]
    assert fresh.token_ids == second.token_ids


def test_finished_sequences_keep_only_the_positions_they_filled(model):
    """A request asks for most of the context and stops after a few tokens (an agent's turn): what the
    prefix cache keeps is its filled positions, not the allocation for max_tokens, and nothing of the
    cache it was copied from. The kept keys and values still serve the next turn exactly."""
    engine = Engine(model, max_step_tokens=4096)
    p = prompts(1, seed=7, lengths=(40,))[0]
    stop_all = SamplingParams(max_tokens=400, seed=1, stop_token_ids=tuple(range(VOCAB)))
    first = engine.run([p], [stop_all])[0]
    assert len(first.token_ids) == 1 and first.finish_reason == "stop"
    second = engine.run([p + first.token_ids + [5, 6]], [stop_all])[0]  # copied from the first one's cache
    assert engine.stats.reused_tokens == len(p)
    kept = [cache for _, cache in engine.prefix._entries.values()]
    assert [c.capacity for c in kept] == [c.length for c in kept] == [len(p), len(p) + 3]
    assert all(c.origin is None for c in kept)
    per_position = kept[0].nbytes() // kept[0].capacity
    assert sum(c.nbytes() for c in kept) == engine.prefix.size * per_position  # 400-position allocations are gone
    follow = p + first.token_ids + [5, 6] + second.token_ids + [9]
    third = engine.run([follow], [SamplingParams(max_tokens=6, seed=3)])[0]
    assert engine.stats.reused_tokens == 2 * len(p) + 3
    ref = reference_logprobs(model, follow, third.token_ids)
    assert max(abs(a - b) for a, b in zip(ref, third.logprobs, strict=True)) < 1e-4


def test_requests_arriving_together_share_their_common_prefix(model):
    g = torch.Generator().manual_seed(11)
    common = torch.randint(0, VOCAB, (200,), generator=g).tolist()
    tails = [[1 + i] + torch.randint(0, VOCAB, (4 * i,), generator=g).tolist() for i in range(4)]
    ps = [common + t for t in tails] + [torch.randint(0, VOCAB, (90,), generator=g).tolist()]
    params = [SamplingParams(max_tokens=12, seed=20 + i) for i in range(len(ps))]
    # A small step budget: the common prefix takes several steps to prefill, so the others must wait.
    engine = Engine(model, max_step_tokens=64)
    outs = engine.run(ps, params)
    assert engine.stats.prefill_tokens == sum(map(len, ps)) - 3 * len(common)  # computed once, not four times
    assert engine.stats.reused_tokens == 3 * len(common)
    for p, o in zip(ps, outs, strict=True):
        ref = reference_logprobs(model, p, o.token_ids)
        assert max(abs(a - b) for a, b in zip(ref, o.logprobs, strict=True)) < 1e-4
    unshared = Engine(model, max_step_tokens=64, prefix_cache_tokens=0)
    assert [o.token_ids for o in unshared.run(ps, params)] == [o.token_ids for o in outs]
    assert unshared.stats.reused_tokens == 0  # prefix reuse off means off


def test_no_prefix_is_shared_across_a_weight_update(model):
    engine = Engine(small_model(seed=0), max_step_tokens=64)
    p = prompts(1, seed=12, lengths=(150,))[0]
    first = engine.add(p, SamplingParams(max_tokens=4, seed=1))
    engine.step()  # part of its prompt is computed with the old weights
    other = small_model(seed=1)
    engine.update_weights(other.state_dict())
    second = engine.add(p + [3], SamplingParams(max_tokens=4, seed=2))
    while engine.has_work:
        engine.step()
    assert engine.stats.reused_tokens == 0 and engine.prefix.size == len(p) + 1 + 3  # only the new one is kept
    ref = reference_logprobs(other, p + [3], second.output)
    assert max(abs(a - b) for a, b in zip(ref, second.logprobs, strict=True)) < 1e-4
    assert first.finish_reason == "length"


def test_update_weights_swaps_without_restart(model):
    other = small_model(seed=1)
    engine = Engine(small_model(seed=0))
    p = prompts(1, seed=6)[0]
    before = engine.run([p], [SamplingParams(max_tokens=8, temperature=0)])[0]
    assert engine.update_weights(other.state_dict()) == 1
    assert engine.prefix.size == 0  # old keys/values are gone
    after = engine.run([p], [SamplingParams(max_tokens=8, temperature=0)])[0]
    expected = Engine(other).run([p], [SamplingParams(max_tokens=8, temperature=0)])[0]
    assert after.token_ids == expected.token_ids != before.token_ids and after.policy_version == 1
    assert (
        max(abs(a - b) for a, b in zip(reference_logprobs(other, p, after.token_ids), after.logprobs, strict=True))
        < 1e-4
    )
    with pytest.raises(ValueError, match="unknown parameter"):
        engine.update_weights({"nope": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights({"model.norm.weight": torch.zeros(3)})


def test_sampling_follows_the_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]])
    probs = torch.softmax(logits, -1)[0]
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    for _ in range(4000):
        (tok,), (lp,) = sample(logits, [SamplingParams()], [g])
        counts[tok] += 1
        assert abs(lp - probs[tok].log().item()) < 1e-5
    assert torch.allclose(counts / 4000, probs, atol=0.03)
    # top-k 2 and top-p 0.5 restrict the support; temperature 0 is the argmax
    for params, allowed in [(SamplingParams(top_k=2), {0, 1}), (SamplingParams(top_p=0.5), {0}),
                            (SamplingParams(temperature=0), {0})]:  # fmt: skip
        seen = {sample(logits, [params], [g])[0][0] for _ in range(300)}
        assert seen <= allowed and 0 in seen


async def test_async_engine_concurrency_streaming_and_versions(model):
    engine = AsyncEngine(Engine(small_model(seed=0), max_batch=8))
    try:
        ps = prompts(8, seed=7)
        outs = await asyncio.gather(
            *(engine.generate(p, SamplingParams(max_tokens=12, seed=i)) for i, p in enumerate(ps))
        )
        direct = Engine(small_model(seed=0)).run(ps, [SamplingParams(max_tokens=12, seed=i) for i in range(8)])
        assert [o.token_ids for o in outs] == [o.token_ids for o in direct]
        streamed, final = [], None
        async for item in engine.stream(ps[0], SamplingParams(max_tokens=12, seed=0)):
            if isinstance(item, tuple):
                streamed.append(item[0])
            else:
                final = item
        assert final is not None and streamed == final.token_ids == outs[0].token_ids
        # A cancelled request leaves the batch; the engine keeps serving.
        task = asyncio.ensure_future(engine.generate(ps[1], SamplingParams(max_tokens=400)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Weights change while a request generates: tokens record both versions. The update is made
        # on the engine thread at the 20th token (it holds the engine's lock there, so this is between
        # two forwards): from the reader's side the engine may already have finished the request.
        other = small_model(seed=1).state_dict()
        seen = []

        def swap_at_20(token: int, logprob: float) -> None:
            seen.append(token)
            if len(seen) == 20:
                engine.engine.update_weights(other)

        done = await asyncio.wrap_future(engine._submit(ps[2], SamplingParams(max_tokens=300), swap_at_20).future)
        assert len(done.token_ids) > 20, "the request ended before the update could land"
        assert done.policy_version == 0 and set(done.token_versions) == {0, 1}
        assert list(done.token_versions).index(1) == 20
        assert list(done.token_versions) == sorted(done.token_versions)
        metrics = engine.metrics()
        assert metrics["version"] == 1 and metrics["generated_tokens"] > 0 and 0 < metrics["batch_occupancy"] <= 1
        with pytest.raises(ValueError):
            await engine.generate([], SamplingParams())
    finally:
        engine.close()
    assert not any(t.name == "vivace-engine" and t.is_alive() for t in threading.enumerate())


def test_a_weight_update_lands_at_the_next_step_boundary():
    # The loop releases the engine's lock after each step and takes it straight back: an update that only
    # waited for the lock waited up to hundreds of steps, as the scheduler had it (in 20 runs, always within
    # 5 updates). Counted in steps, not seconds, so a slow machine passes no more easily than a fast one.
    engine = AsyncEngine(Engine(small_model(seed=0), max_batch=4))
    states = [small_model(seed=1).state_dict(), small_model(seed=0).state_dict()]
    seen: list[list[int]] = [[] for _ in range(4)]  # per request, its tokens so far (appended on the engine thread)
    reqs = [
        engine._submit(p, SamplingParams(max_tokens=400), lambda tok, lp, s=s: s.append(tok))
        for p, s in zip(prompts(4, seed=9, lengths=(3, 40, 100, 1)), seen, strict=True)
    ]
    marks = []  # per update: its version, each request's token count at the call and at the return
    try:
        while min(map(len, seen)) < 5:  # all four decoding
            time.sleep(0.001)
        for version in range(1, 41):
            last = engine.engine.stats.steps
            while engine.engine.stats.steps < last + 2 and not reqs[0].future.done():  # called mid-decoding
                time.sleep(0.0005)
            steps, at_call = engine.engine.stats.steps, [len(s) for s in seen]
            assert engine.update_weights(states[version % 2], version=version) == version
            waited = engine.engine.stats.steps - steps
            # The step in progress, and one that may begin between reading the count and the call.
            assert waited <= 2, f"update {version} waited {waited} steps"
            marks.append((version, at_call, [len(s) for s in seen]))
        with pytest.raises(ValueError, match="shape"):  # the write's error reaches the caller
            engine.update_weights({"model.norm.weight": torch.zeros(3)})
        outs = [r.future.result(timeout=60) for r in reqs]
    finally:
        engine.close()
    assert max(marks[-1][2]) < 400 and engine.version == 40  # every update landed mid-generation
    for version, at_call, at_return in marks:
        for o, before, after in zip(outs, at_call, at_return, strict=True):
            assert max(o.token_versions[:before]) < version <= min(o.token_versions[after:])


def test_closing_while_a_weight_update_waits_does_not_hang():
    engine = AsyncEngine(Engine(small_model(seed=0)))
    inside, release = threading.Event(), threading.Event()
    req = engine._submit([1, 2, 3], SamplingParams(max_tokens=400), lambda tok, lp: (inside.set(), release.wait(10)))
    assert inside.wait(10)  # the engine thread is inside a step, holding its lock
    state, got = small_model(seed=1).state_dict(), []
    update = threading.Thread(target=lambda: got.append(engine.update_weights(state)))
    closing = threading.Thread(target=engine.close)
    update.start()
    closing.start()
    time.sleep(0.05)  # most likely both wait by now; in any order, neither may hang
    release.set()
    update.join(10)
    closing.join(10)
    assert not update.is_alive() and not closing.is_alive() and not engine._thread.is_alive()
    assert got == [1]
    with pytest.raises(RuntimeError, match="closed"):
        req.future.result(timeout=1)


@pytest.mark.slow
async def test_ray_actor_engine(tmp_path):
    ray = pytest.importorskip("ray")
    import os

    from vivace.inference.samplers import RayEngine
    from vivace.model.checkpoint import save_checkpoint
    from vivace.model.tokenizer import reference_tokenizer

    path = save_checkpoint(small_model(seed=0), reference_tokenizer(), tmp_path / "ckpt")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.shutdown()  # a Ray run earlier in the session (RayWorkers) leaves its cluster up
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = RayEngine.remote_actor(str(path), num_cpus=1)
        p = prompts(1, seed=8)[0]
        params = SamplingParams(max_tokens=10, seed=5)
        got = await remote.generate(p, params)
        assert got.token_ids == Engine(small_model(seed=0)).run([p], [params])[0].token_ids
        assert await remote.update_weights(small_model(seed=1).state_dict()) == 1
        after = await remote.generate(p, params)
        assert (
            after.policy_version == 1 and after.token_ids == Engine(small_model(seed=1)).run([p], [params])[0].token_ids
        )
        assert (await remote.metrics())["generated_tokens"] == 20
        from vivace.harness.policy import ContextFull  # the engine's own words, not the actor's traceback

        with pytest.raises(ContextFull, match=r"^the prompt has 512 tokens; the model's context is 512"):
            await remote.generate([1] * 512, params)
    finally:
        ray.shutdown()


def test_a_low_precision_engine_on_a_cpu_warns_that_its_memory_grows():
    """bf16 and fp16 on a CPU: oneDNN keeps kernels per input shape, so a long-lived engine's memory grows
    (docs/benchmarks.md); loading one says so, and fp32 says nothing."""
    import warnings

    from vivace.config import EngineConfig
    from vivace.inference.samplers import load_for_engine

    with pytest.warns(RuntimeWarning, match="engine.dtype bfloat16 on a CPU: memory grows"):
        load_for_engine("tiny-init", EngineConfig(dtype="bfloat16", device="cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_for_engine("tiny-init", EngineConfig(dtype="float32", device="cpu"))


async def test_a_request_whose_cache_cannot_be_allocated_fails_alone(model):
    """Admission took a request off the queue before allocating its cache; an allocation that raised
    (a large max_tokens on a full GPU) left it in no queue, so its caller waited forever, and failed
    every request running beside it."""
    engine = Engine(model, max_batch=4)
    allocate = engine.forward.new_cache

    def new_cache(capacity):
        if capacity > 300:
            raise torch.OutOfMemoryError("simulated: out of memory for the cache")
        return allocate(capacity)

    engine.forward.new_cache = new_cache
    front = AsyncEngine(engine)
    try:
        running = asyncio.ensure_future(front.generate([1, 2, 3], SamplingParams(max_tokens=150, seed=1)))
        await asyncio.sleep(0.2)
        with pytest.raises(RuntimeError, match="generation failed: simulated"):
            await asyncio.wait_for(front.generate([4, 5], SamplingParams(max_tokens=400, seed=2)), 10)
        assert len((await asyncio.wait_for(running, 20)).token_ids) == 150
        assert not engine.running and not engine.waiting
    finally:
        front.close()
    with pytest.raises(RuntimeError, match="generation failed: simulated"):
        engine.run([[4, 5]], SamplingParams(max_tokens=400))


def test_a_stream_whose_event_loop_closed_fails_no_other_request(model):
    """A stream's tokens go to its reader's event loop; once that loop closed (asyncio.run in a thread,
    left mid-stream), handing over a token raised in the engine's step and failed every request in it."""
    front = AsyncEngine(Engine(model, max_batch=8))
    try:

        async def leave_mid_stream():
            async for _ in front.stream([7, 8, 9], SamplingParams(max_tokens=400, seed=3)):
                break

        loop = asyncio.new_event_loop()
        loop.run_until_complete(leave_mid_stream())
        loop.close()  # without the stream's cleanup having run

        async def others_beside_it():
            params = [SamplingParams(max_tokens=60, seed=i) for i in range(6)]
            return await asyncio.wait_for(
                asyncio.gather(*(front.generate([i + 1, 2], p) for i, p in enumerate(params))), 30
            )

        others = asyncio.run(others_beside_it())
        assert [len(c.token_ids) for c in others] == [60] * 6
    finally:
        front.close()


@pytest.mark.parametrize("temperature", [1e-39, 1e-30, 5e-5])
def test_a_temperature_near_zero_is_greedy(model, temperature):
    """1/T overflowed below ~1e-38: NaN logprobs, and the last token id drawn every time."""
    engine = Engine(model)
    prompt = prompts(1)[0]
    near = engine.run([prompt], SamplingParams(max_tokens=8, temperature=temperature, seed=0))[0]
    greedy = engine.run([prompt], SamplingParams(max_tokens=8, temperature=0))[0]
    assert near.token_ids == greedy.token_ids
    assert near.logprobs == pytest.approx(reference_logprobs(model, prompt, greedy.token_ids), abs=1e-4)
