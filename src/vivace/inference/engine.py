"""The sampling engine: token-in/token-out generation with continuous batching.

What: `Engine` (synchronous core: `add` requests, `step` the running batch) and `AsyncEngine`
(the engine on a background thread; implements the harness's `Sampler` protocol, streams).
Each step is one ragged forward pass (inference/forward.py) over every running sequence: a
decode step feeds one token per sequence and prompts are prefilled in chunks within a per-step
token budget, so requests join and leave the batch at any step and a long prompt never stalls
the others' decoding.

A finished sequence's keys/values go to a prefix cache; the next request whose prompt starts
with the same tokens (the same conversation's next turn, or a group of rollouts from one
prompt) copies them instead of recomputing. Requests that arrive together with a long common
prefix (a step's rollouts: one system turn, one request per group) share it too: the first
prefills it and the others wait for those positions, then copy them. `update_weights` loads new
weights between two steps (no restart), bumps the policy version and drops the prefix cache (its
values came from the old weights); running sequences go on with the new weights and every
sampled token records the version that produced it, but their keys and values are neither
shared nor cached any more. A request may ask for each sampled token's `top_logprobs` most likely
alternatives (from the distribution its logprob is reported under); only the rows that ask pay for
the top-k.

Not covered: paged KV memory (each sequence preallocates prompt + max_tokens), speculative
decoding, tensor parallelism (use vLLM/SGLang through the HTTP sampler for those).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from vivace.harness.policy import Completion, ContextFull, SamplingParams
from vivace.inference.forward import KVCache, RaggedForward, Segment
from vivace.inference.sampling import most_likely, sample

# A sampled token's most likely alternatives, most likely first: ((token id, logprob), ...).
TopLogprobs = tuple[tuple[int, float], ...]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopCompletion(Completion):
    """A Completion of a request that asked for top_logprobs."""

    top: tuple[TopLogprobs, ...] = ()  # per generated id, its most likely alternatives


@dataclass
class Request:
    id: int
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator
    # Called on the engine thread with (token, logprob), and the token's TopLogprobs as a third
    # argument when the request asked for them (top_logprobs > 0).
    on_token: Callable[..., None] | None = None
    top_logprobs: int = 0  # alternatives to record per sampled token (0: none, and no cost)
    cache: KVCache | None = None
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top: list[TopLogprobs] = field(default_factory=list)  # per sampled token, when top_logprobs > 0
    reused: int = 0  # prompt tokens copied from another sequence's cache
    kv_version: int = -1  # weights version at admission: its keys/values are all of it while it stays current
    finish_reason: str | None = None
    cancelled: bool = False
    error: Exception | None = None  # why it failed on its own (its cache could not be allocated)
    future: concurrent.futures.Future | None = None

    @functools.cached_property
    def prompt_tensor(self) -> torch.Tensor:
        """The prompt as a tensor, for prefix matching (made once per request)."""
        return torch.tensor(self.prompt)

    @property
    def known(self) -> int:
        """Tokens the sequence has (prompt + sampled); the cache lags by the last sampled one."""
        return len(self.prompt) + len(self.output)

    def token(self, i: int) -> int:
        return self.prompt[i] if i < len(self.prompt) else self.output[i - len(self.prompt)]

    def completion(self) -> Completion:
        fields = {
            "token_ids": list(self.output),
            "logprobs": list(self.logprobs),
            "finish_reason": self.finish_reason or "length",
            "policy_version": min(self.versions) if self.versions else -1,
            "token_versions": tuple(self.versions),
        }
        return TopCompletion(**fields, top=tuple(self.top)) if self.top_logprobs else Completion(**fields)


def _common_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading tokens two 1-D token tensors share (rl.packing.common_prefix does this for
    lists; here the prompts are thousands of tokens, compared at every admission)."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """Finished sequences' caches, least recently used first out, bounded by total positions (each
    kept compact: holding the positions it counts, and nothing of the cache it was copied from)."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, tuple[torch.Tensor, KVCache]] = OrderedDict()
        self._ids = itertools.count()
        self.size = 0

    def put(self, tokens: Sequence[int], cache: KVCache) -> None:
        if self.max_tokens <= 0 or cache.length == 0:
            return
        self._entries[next(self._ids)] = (torch.tensor(tokens[: cache.length]), cache.compact())
        self.size += cache.length
        while self.size > self.max_tokens and self._entries:
            _, (_, old) = self._entries.popitem(last=False)
            self.size -= old.length

    def match(self, prompt: torch.Tensor) -> tuple[int, KVCache | None]:
        """The longest cached prefix of `prompt`, leaving at least its last token to compute."""
        if not self._entries or len(prompt) < 2:
            return 0, None
        query = prompt[:-1]
        best, best_key = 0, None
        for key, (tokens, _) in self._entries.items():
            common = _common_length(tokens, query)
            if common > best:
                best, best_key = common, key
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        return best, self._entries[best_key][1]

    def clear(self) -> None:
        self._entries.clear()
        self.size = 0


@dataclass
class EngineStats:
    steps: int = 0
    generated_tokens: int = 0
    prefill_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens served from the prefix cache
    finished: int = 0
    busy_s: float = 0.0  # time inside step()
    batch_sum: int = 0  # running sequences summed over steps (occupancy = batch_sum / steps / max_batch)


class Engine:
    """Continuous batching over one model. Not thread-safe: AsyncEngine serialises access."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_batch: int = 32,
        max_step_tokens: int = 2048,
        prefix_cache_tokens: int = 65536,
        min_shared_prefix: int = 64,
        seed: int = 0,
        version: int = 0,
    ):
        self.model = model.eval()
        self.forward = RaggedForward(model)
        self.vocab_size = model.config.vocab_size
        self.max_positions = self.forward.max_positions
        self.max_batch, self.max_step_tokens = max_batch, max_step_tokens
        self.prefix = PrefixCache(prefix_cache_tokens)
        # A shorter prefix shared with a running prefill is not worth waiting for (a chat template's
        # opening is shared by every prompt).
        self.min_shared_prefix = min_shared_prefix
        self.version = version
        self.generator = torch.Generator().manual_seed(seed)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._failed: list[Request] = []  # failed while being admitted: returned by the step
        self.stats = EngineStats()
        self._ids = itertools.count()

    # ---- requests ---------------------------------------------------------------------------

    def add(self, prompt_ids: Sequence[int], params: SamplingParams, on_token=None, top_logprobs: int = 0) -> Request:
        """Queues a request; bad input raises ValueError saying what is wrong. With `top_logprobs`
        > 0 every sampled token also records that many most likely alternatives (`Request.top`)."""
        req = self.request(prompt_ids, params, on_token, top_logprobs)
        self.waiting.append(req)
        return req

    def request(
        self, prompt_ids: Sequence[int], params: SamplingParams, on_token=None, top_logprobs: int = 0
    ) -> Request:
        """The checked request `add` queues, not queued; reads nothing a step changes, so any thread may call it."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token id")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        if len(prompt) >= self.max_positions:
            raise ContextFull(
                f"the prompt has {len(prompt)} tokens; the model's context is {self.max_positions} "
                "(and at least one token must be left to generate)"
            )
        if params.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if bad := [t for t in params.stop_token_ids if not 0 <= t < self.vocab_size]:  # could never end it
            raise ValueError(f"stop token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        if not 0 <= top_logprobs <= self.vocab_size:
            raise ValueError(f"top_logprobs must be in [0, {self.vocab_size}], got {top_logprobs}")
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else self.generator
        return Request(next(self._ids), prompt, params, gen, on_token, top_logprobs)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def cancel(self, req: Request) -> None:
        req.cancelled = True

    # ---- stepping -----------------------------------------------------------------------------

    def step(self) -> list[Request]:
        """One forward pass over the running batch; returns the requests that finished."""
        t0 = time.perf_counter()
        finished = [r for r in self.running if r.cancelled] + [r for r in self.waiting if r.cancelled]
        self.running = [r for r in self.running if not r.cancelled]
        self.waiting = deque(r for r in self.waiting if not r.cancelled)
        for r in finished:
            r.finish_reason = "cancelled"
        self._admit()
        tokens: list[int] = []
        segments: list[Segment] = []
        rows: list[tuple[Request, bool]] = []  # (request, samples after this step)
        budget = self.max_step_tokens
        # Decoding sequences first (one token each), then prompt chunks with what is left.
        for req in sorted(self.running, key=lambda r: r.cache.length < len(r.prompt)):
            pending = req.known - req.cache.length
            n = min(pending, budget) if req.cache.length < len(req.prompt) else 1
            if n <= 0:
                continue
            start = req.cache.length
            tokens += [req.token(i) for i in range(start, start + n)]
            segments.append(Segment(req.cache, n))
            rows.append((req, n == pending))
            budget -= n
            if start < len(req.prompt):
                self.stats.prefill_tokens += n
        if segments:
            logits = self.forward(tokens, segments)
            ready = [i for i, (_, samples) in enumerate(rows) if samples]
            if ready:
                reqs = [rows[i][0] for i in ready]
                last = logits[ready]
                picked, logps = sample(last, [r.params for r in reqs], [r.generator for r in reqs])
                tops = self._top_logprobs(last, reqs)
                for i, (req, tok, lp) in enumerate(zip(reqs, picked, logps, strict=True)):
                    self._append(req, tok, lp, tops.get(i))
        done = [r for r in self.running if r.finish_reason]
        self.running = [r for r in self.running if not r.finish_reason]
        for r in done:
            if r.kv_version == self.version:  # not one whose keys/values span a weight update
                self.prefix.put([r.token(i) for i in range(r.cache.length)], r.cache)
            r.cache = None
        self.stats.steps += 1
        self.stats.batch_sum += len(rows)
        self.stats.finished += len(done)
        self.stats.busy_s += time.perf_counter() - t0
        failed, self._failed = self._failed, []
        return finished + done + failed

    def _admit(self) -> None:
        """Moves waiting requests into the batch, each starting from the longest prefix it can copy:
        a finished sequence's (the prefix cache) or a running one's. A request that shares a longer
        prefix with a running sequence still prefilling it waits until those positions are computed,
        rather than computing them a second time alongside (a group of rollouts, or a batch of
        episodes with one system turn, arriving at once)."""
        deferred: deque[Request] = deque()
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting.popleft()
            try:
                if not self._start(req):
                    deferred.append(req)
            except Exception as e:  # its cache could not be had (out of memory): it fails alone
                req.cache, req.error, req.finish_reason = None, e, "error"
                self._failed.append(req)
        self.waiting.extendleft(reversed(deferred))  # in their order, ahead of later arrivals

    def _start(self, req: Request) -> bool:
        """Gives `req` its cache, copying the longest prefix it can, and runs it; False: it must wait
        for a running sequence to compute the prefix they share."""
        n, cached = self.prefix.match(req.prompt_tensor)
        shared, leader = self._running_prefix(req)
        if shared >= n + self.min_shared_prefix:
            if leader.cache.length < shared:
                return False
            n, cached = shared, leader.cache
        capacity = min(len(req.prompt) + req.params.max_tokens, self.max_positions)
        req.cache, req.kv_version = self.forward.new_cache(capacity), self.version
        if cached is not None:
            req.cache.copy_prefix(cached, n)
            req.reused = n
            self.stats.reused_tokens += n
        self.running.append(req)
        return True

    def _running_prefix(self, req: Request) -> tuple[int, Request | None]:
        """The longest prompt prefix `req` shares with a running request (at most all but its last
        token, which must be computed to sample from), and that request."""
        if self.prefix.max_tokens <= 0:  # prefix reuse is off
            return 0, None
        query = req.prompt_tensor[:-1]
        best, leader = 0, None
        for other in self.running:
            if other.kv_version != self.version:  # computed (in part) by older weights
                continue
            common = _common_length(other.prompt_tensor, query)
            if common > best:
                best, leader = common, other
        return best, leader

    @staticmethod
    def _top_logprobs(logits: torch.Tensor, reqs: list[Request]) -> dict[int, TopLogprobs]:
        """The alternatives of the rows whose requests asked for them (none asked: no work)."""
        asking = [i for i, r in enumerate(reqs) if r.top_logprobs]
        if not asking:
            return {}
        found = most_likely(logits[asking], [reqs[i].params for i in asking], [reqs[i].top_logprobs for i in asking])
        return dict(zip(asking, found, strict=True))

    def _append(self, req: Request, tok: int, logprob: float, top: TopLogprobs | None = None) -> None:
        req.output.append(tok)
        req.logprobs.append(logprob)
        req.versions.append(self.version)
        self.stats.generated_tokens += 1
        if req.top_logprobs:
            req.top.append(top or ())
        if req.on_token is not None and not req.cancelled:
            try:
                if req.top_logprobs:
                    req.on_token(tok, logprob, top or ())
                else:
                    req.on_token(tok, logprob)
            except Exception as e:  # its reader is gone (a closed event loop): it ends, not the whole batch
                log.debug("request %s: on_token failed (%s); cancelling it", req.id, e)
                req.cancelled = True
        if tok in req.params.stop_token_ids:
            req.finish_reason = "stop"
        elif len(req.output) >= req.params.max_tokens or req.known >= req.cache.capacity:
            req.finish_reason = "length"

    def run(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Completion]:
        """Generates for every prompt (continuously batched) and returns completions in order."""
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        reqs = [self.add(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        while self.has_work:
            self.step()
        if failed := next((r for r in reqs if r.error is not None), None):
            raise RuntimeError(f"generation failed: {failed.error}") from failed.error
        return [r.completion() for r in reqs]

    # ---- weights ------------------------------------------------------------------------------

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Copies new weights in place (all of them, or a subset by name); returns the new version."""

        def copy(params: dict[str, torch.Tensor]) -> None:
            unknown = [n for n in state if n not in params]
            if unknown:
                raise ValueError(f"update_weights: unknown parameter names {unknown[:5]}")
            for name, value in state.items():
                target = params[name]
                if tuple(value.shape) != tuple(target.shape):
                    raise ValueError(
                        f"update_weights: {name} has shape {tuple(value.shape)}, expected {tuple(target.shape)}"
                    )
                target.copy_(value)

        return self.apply_weights(copy, version)

    def apply_weights(self, write: Callable[[dict[str, torch.Tensor]], None], version: int | None = None) -> int:
        """Lets `write` change the weights in place (a collective receive, a copy), given the
        model's tensors by name (tied names included); then drops the prefix cache and sets the version."""
        params = dict(self.model.named_parameters(remove_duplicate=False))  # tied names too (lm_head)
        params.update(dict(self.model.named_buffers()))
        with torch.no_grad():
            write(params)
        self.prefix.clear()
        self.version = self.version + 1 if version is None else version
        return self.version


def _post(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item: object) -> None:
    """Hands `item` to a stream's reader on its event loop; nothing when that loop has closed (the
    reader left without the stream's cleanup)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(queue.put_nowait, item)


class AsyncEngine:
    """The engine on a background thread: an asyncio `Sampler` with streaming and metrics."""

    def __init__(self, engine: Engine, name: str = "local"):
        self.engine, self.name = engine, name
        # `_lock` is held through each step and each weight update (which so lands between two steps).
        # The loop releases it and takes it straight back, which starves a thread waiting for it (an event
        # loop submitting a request there froze for seconds), so submitting takes only `_wake`, held for moments,
        # and a weight update first says it waits (`_updates`): the loop starts no step until none does.
        self._lock = threading.Lock()
        self._wake = threading.Condition()
        self._inbox: list[Request] = []  # submitted, not yet in the engine's queue (under `_wake`)
        self._updates = 0  # weight updates waiting for `_lock` or holding it (under `_wake`)
        self._closed = False
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._loop, name="vivace-engine", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self.engine.version

    async def generate(self, prompt_ids: list[int], params: SamplingParams, top_logprobs: int = 0) -> Completion:
        """The Completion (a TopCompletion with `top_logprobs` > 0)."""
        req = self._submit(prompt_ids, params, None, top_logprobs)
        try:
            return await asyncio.wrap_future(req.future)
        except asyncio.CancelledError:
            req.cancelled = True  # the engine drops it at its next step
            raise

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams, top_logprobs: int = 0
    ) -> AsyncIterator[tuple | Completion]:
        """Yields (token, logprob) as they are sampled — (token, logprob, TopLogprobs) with
        `top_logprobs` > 0 — then the Completion (a TopCompletion with `top_logprobs` > 0)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        req = self._submit(
            prompt_ids, params, lambda *item: loop.call_soon_threadsafe(queue.put_nowait, item), top_logprobs
        )
        req.future.add_done_callback(functools.partial(_post, loop, queue))
        try:
            while True:
                item = await queue.get()
                if isinstance(item, concurrent.futures.Future):
                    yield item.result()
                    return
                yield item
        finally:
            req.cancelled = True  # no-op when finished; stops generation when the reader left

    def _submit(self, prompt_ids, params, on_token, top_logprobs: int = 0) -> Request:
        req = self.engine.request(prompt_ids, params, on_token, top_logprobs)
        req.future = concurrent.futures.Future()
        with self._wake:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._inbox.append(req)
            self._wake.notify()
        return req

    @contextlib.contextmanager
    def _between_steps(self):
        """Holds `_lock` from the end of the step in progress: the loop starts no step while an update waits."""
        with self._wake:
            self._updates += 1
        try:
            with self._lock:
                yield
        finally:
            with self._wake:
                self._updates -= 1
                self._wake.notify()

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        with self._between_steps():
            return self.engine.update_weights(state, version)

    def apply_weights(self, write: Callable[[dict[str, torch.Tensor]], None], version: int | None = None) -> int:
        # `write` runs on the calling thread while the engine's waits at the step boundary: a collective receive
        # runs where its caller set up the group (the CUDA device and stream are per thread), and what it
        # raises reaches the caller as it is.
        with self._between_steps():
            return self.engine.apply_weights(write, version)

    def load(self) -> int:
        """In-flight tokens (prompt + generated so far, over running and waiting requests): what a
        router balances replicas by. Read without waiting for the step in progress, so a request
        the step is admitting may be missed or counted twice."""
        with self._wake:
            inbox = list(self._inbox)
        return sum(r.known for r in (*self.engine.running, *self.engine.waiting, *inbox))

    def metrics(self) -> dict:
        s, e = self.engine.stats, self.engine
        return {
            "version": e.version,
            "running": len(e.running),
            "waiting": len(e.waiting) + len(self._inbox),
            "in_flight_tokens": self.load(),
            "steps": s.steps,
            "generated_tokens": s.generated_tokens,
            "prefill_tokens": s.prefill_tokens,
            "reused_prefix_tokens": s.reused_tokens,
            "finished_requests": s.finished,
            "busy_s": round(s.busy_s, 3),
            "tokens_per_s_busy": round(s.generated_tokens / s.busy_s, 1) if s.busy_s else 0.0,
            "batch_occupancy": round(s.batch_sum / s.steps / e.max_batch, 3) if s.steps else 0.0,
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._closed and (self._updates or (not self._inbox and not self.engine.has_work)):
                    self._wake.wait()
                closed, arrived, self._inbox = self._closed, self._inbox, []
            with self._lock:
                self.engine.waiting.extend(arrived)
                if closed:
                    pending = list(self.engine.running) + list(self.engine.waiting)
                    for r in pending:
                        if r.future and not r.future.done():
                            with contextlib.suppress(concurrent.futures.InvalidStateError):  # see below
                                r.future.set_exception(RuntimeError("the engine was closed"))
                    return
                try:
                    finished = self.engine.step()
                    error = None
                except Exception as exc:  # a bad step fails its requests, not the engine
                    finished = list(self.engine.running) + self.engine._failed
                    self.engine.running, self.engine._failed = [], []
                    error = exc
            for r in finished:
                if r.future is None or r.future.done():
                    continue
                # A waiter that leaves cancels the future from its event loop's thread, which can land after
                # done() above; setting it then raises, and that must not end this thread (every later request
                # would wait forever).
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    if error is not None or r.error is not None:
                        r.future.set_exception(RuntimeError(f"generation failed: {error or r.error}"))
                    elif r.finish_reason == "cancelled":
                        r.future.cancel()
                    else:
                        r.future.set_result(r.completion())
