"""What acts in an episode: the Policy protocol, the conversation it reads, and the
token-level policy that drives a sampler token-in/token-out.

Two kinds of policy share one protocol. Message-level policies (an OpenAI-compatible
endpoint, the scripted ones) read the messages and return a message. A token-level policy
(`TokenPolicy`, over any `Sampler`: the local engine, an HTTP server returning token ids)
keeps the episode's token sequence in `Conversation.tokens`: the prompt is rendered once,
every sampled token is kept exactly as sampled (with its logprob and policy version), and
each later turn only appends the rendering of the new messages — the past is never
re-tokenized, so what RL trains on is exactly what the sampler saw and produced.

Not covered: choosing a policy from a spec string (policies.py) and the loop (agent.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from vivace.harness.messages import AssistantTurn, Message


@dataclass
class TokenLog:
    """The token sequence of one episode, for token-level policies; all lists have one entry per token."""

    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 on tokens the policy sampled, 0 on prompt/tool tokens
    logprobs: list[float] = field(default_factory=list)  # sampler log-probability; 0.0 where loss_mask is 0
    versions: list[int] = field(default_factory=list)  # policy version that sampled the token; -1 where mask is 0
    n_messages: int = 0  # how many conversation messages the sequence already holds

    def add_context(self, ids: list[int]) -> None:
        self.ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def add_sampled(self, ids: list[int], logprobs: list[float], version: int, per_token: Sequence[int] = ()) -> None:
        if len(logprobs) != len(ids):
            raise ValueError(f"sampler returned {len(ids)} tokens but {len(logprobs)} logprobs")
        self.ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.versions += list(per_token) if len(per_token) == len(ids) else [version] * len(ids)


@dataclass
class Conversation:
    """What a policy reads: the messages so far, the tool schemas, and (token-level) the tokens."""

    messages: list[Message]
    tools: list[dict[str, Any]]  # OpenAI-style function schemas
    max_turn_tokens: int = 4096  # cap on one generation
    tokens: TokenLog | None = None  # set by token-level policies on their first turn
    # The episode's sampling seed: a token-level policy seeds each turn from it and the turn's
    # index, so two policies given the same seed draw the same random numbers (paired comparisons).
    seed: int | None = None


@runtime_checkable
class Policy(Protocol):
    """A policy that holds something (an HTTP client's connections, an engine's thread) also has
    `async aclose()`; whoever loaded it calls `close_policy` when done. One that knows its model's
    context has `context_tokens` (agent.result_budget sizes tool results by it)."""

    name: str  # the spec it was made from, for logs and reports

    async def act(self, conversation: Conversation) -> AssistantTurn:
        """The next assistant turn. Raises PolicyError when the policy cannot answer at all."""
        ...


async def close_policy(policy: Policy) -> None:
    """Let go of what `policy` holds, if anything: an HTTP client's pooled connections are closed
    on the event loop that opened them (left to the garbage collector, after the loop has closed,
    they are unclosed transports), an engine's thread is stopped."""
    if (aclose := getattr(policy, "aclose", None)) is not None:
        await aclose()


class PolicyError(RuntimeError):
    """The policy could not produce a turn (endpoint down, script exhausted badly, …); ends the episode."""


class PolicyUnavailable(PolicyError):
    """The policy's server could not be reached, or kept failing on its side (no HTTP answer, 408, 429 or 5xx
    once the client's retries were spent): the episode says nothing about the model, unlike a request the
    server refused (a context overflow, a 400) or an answer it gave."""


class ContextFull(PolicyError, ValueError):
    """The conversation no longer fits the model's context window. Not a failure of the policy but the
    episode's length limit, as max_tokens is: the loop ends the episode with that stop reason. A ValueError
    too, so what checks requests (the engine's check, the server) treats it as the bad input it is there."""


# How servers word a context overflow: OpenAI, vLLM, SGLang, TGI, llama.cpp, transformers, vivace serve.
CONTEXT_TOO_LONG = re.compile(
    r"context[ _](?:length|window|size)|maximum context|prompt is too long|longer than the model|"
    r"max_new_tokens` must be <=|context is \d",
    re.IGNORECASE,
)


def http_failure(message: str, status: int | None) -> PolicyError:
    """The error for a request to a policy's server that failed with HTTP `status` (None: no answer at
    all): PolicyUnavailable when the server, not the request, failed (408, 429, 5xx); ContextFull for a
    refusal that says the prompt is over the context."""
    if status is not None and 400 <= status < 500 and CONTEXT_TOO_LONG.search(message):
        return ContextFull(message)
    unavailable = status is None or status in (408, 429) or status >= 500
    return (PolicyUnavailable if unavailable else PolicyError)(message)


# --- token level ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 1024  # tokens to generate at most
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    stop_token_ids: tuple[int, ...] = ()  # generation ends after emitting one of these (kept in the output)
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]  # generated ids, including the stop token when one ended the turn
    logprobs: list[float]  # log-probability of each generated id under the sampling policy
    finish_reason: str  # "stop" or "length"
    policy_version: int  # oldest weights version among the tokens (all of them, unless weights changed mid-turn)
    token_versions: tuple[int, ...] = ()  # version per token, when the sampler reports it


@runtime_checkable
class Sampler(Protocol):
    """Token-in/token-out generation (the inference engine and HTTP backends implement it)."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion: ...


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (a base seed, a task id, an index): the same on every
    machine and run, unlike hash()."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _turn(conversation: Conversation) -> int:
    return sum(1 for m in conversation.messages if m.role == "assistant")


def _with_new_messages(conversation: Conversation, chat: Any) -> TokenLog:
    """The episode's token log, extended with the messages added since the last turn (the whole
    prompt on the first turn) and the generation prompt: the past is never re-tokenized."""
    log = conversation.tokens
    if log is None:
        log = conversation.tokens = TokenLog()
        log.add_context(chat.prompt_ids(conversation.messages, conversation.tools))
    else:
        log.add_context(chat.continuation_ids(conversation.messages, conversation.tools, log.n_messages))
    return log


class TokenPolicy:
    """A policy that renders with a ChatFormat and samples from a Sampler, token-in/token-out."""

    def __init__(self, sampler: Sampler, chat_format: Any, name: str, params: SamplingParams | None = None):
        self.sampler, self.chat, self.name = sampler, chat_format, name
        self.params = params or SamplingParams()

    @property
    def context_tokens(self) -> int | None:
        """The model's context, as its checkpoint declares it (None: unknown); the agent sizes tool results by it."""
        return self.chat.context_tokens

    async def aclose(self) -> None:
        """Close the sampler: an HTTP sampler's client, or a local engine's thread."""
        if (aclose := getattr(self.sampler, "aclose", None)) is not None:
            await aclose()
        elif (close := getattr(self.sampler, "close", None)) is not None:
            await asyncio.to_thread(close)  # joins the engine's thread

    async def act(self, conversation: Conversation) -> AssistantTurn:
        log = _with_new_messages(conversation, self.chat)
        stops = tuple(self.chat.stop_ids)
        params = SamplingParams(
            max_tokens=min(self.params.max_tokens, conversation.max_turn_tokens),
            temperature=self.params.temperature,
            top_p=self.params.top_p,
            top_k=self.params.top_k,
            stop_token_ids=stops,
            seed=self.params.seed if conversation.seed is None else derive_seed(conversation.seed, _turn(conversation)),
        )
        prompt_len = len(log.ids)
        out = await self.sampler.generate(list(log.ids), params)
        log.add_sampled(out.token_ids, out.logprobs, out.policy_version, out.token_versions)
        if not out.token_ids or out.token_ids[-1] not in stops:
            # Cut off by the token cap: close the turn (not a sampled token) so the sequence
            # stays a well-formed rendering that later turns can extend.
            log.add_context(self.chat.encode(self.chat.end_of_turn))
        log.n_messages = len(conversation.messages) + 1  # the assistant message the loop appends next
        message, _ = self.chat.parse(out.token_ids, finish_reason=out.finish_reason)
        return AssistantTurn(
            message=message,
            finish_reason=out.finish_reason,
            prompt_tokens=prompt_len,
            completion_tokens=len(out.token_ids),
            token_ids=list(out.token_ids),
            logprobs=list(out.logprobs),
            policy_version=out.policy_version,
        )


class TeacherTokens:
    """A message-level policy whose turns are recorded as the tokens a model would have to
    sample to say them (loss mask 1; prompt and tool results 0), rendered token-in/token-out
    exactly as TokenPolicy builds a sequence: expert data for supervised fine-tuning with the
    same masking RL uses. `logprobs` are 0 and `versions` -1 (nothing was sampled)."""

    def __init__(self, inner: Policy, chat_format: Any):
        self.inner, self.chat, self.name = inner, chat_format, inner.name

    @property
    def context_tokens(self) -> int | None:
        """As TokenPolicy's: expert episodes see tool results cut as the model's own rollouts do."""
        return self.chat.context_tokens

    async def act(self, conversation: Conversation) -> AssistantTurn:
        log = _with_new_messages(conversation, self.chat)
        reply = await self.inner.act(conversation)
        ids = self.chat.assistant_ids(reply.message)
        log.add_sampled(ids, [0.0] * len(ids), -1)
        log.n_messages = len(conversation.messages) + 1
        reply.token_ids, reply.prompt_tokens, reply.completion_tokens = ids, len(log.ids) - len(ids), len(ids)
        return reply


def render_conversation(
    chat: Any, messages: Sequence[Message], tools: Sequence[dict] | None
) -> tuple[list[int], list[int]]:
    """The token sequence a TokenPolicy (or TeacherTokens) builds over `messages` (system, user, then
    assistant turns and their tool results), with its loss mask (1 on assistant tokens): what an
    episode's recorded tokens would be had a model said those turns. For messages edited after the
    fact (renamed, cut short) that are to be trained on exactly as the harness renders them."""
    starts = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if not starts:
        raise ValueError("render_conversation needs at least one assistant message")
    ids = chat.prompt_ids(messages[: starts[0]], tools)
    mask = [0] * len(ids)
    for k, i in enumerate(starts):
        turn = chat.assistant_ids(messages[i])
        ids += turn
        mask += [1] * len(turn)
        if k + 1 < len(starts):
            more = chat.continuation_ids(messages[: starts[k + 1]], tools, i + 1)
            ids += more
            mask += [0] * len(more)
    return ids, mask
