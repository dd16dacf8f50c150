"""From the engine's tokens to OpenAI replies, for `vivace serve` (server.py is the HTTP side).

What: a `Job` is one choice to generate (the prompt, ids the reply is forced to begin with, the
sampling parameters, stop strings, how many alternatives to report per token); `generate` runs
one to an `Output`, `stream_choice` runs one as chat-completion chunks; `reply` turns an output
into an assistant message (content and parsed tool calls) and finish reason; `forced_call` gives
the ids that make a reply open a tool call (`tool_choice`); `completion_logprobs` gives a
/v1/completions choice's logprobs in OpenAI's legacy form (tokens, their offsets in the text).

Streamed and whole replies read tokens through the same `Reading` (incremental detokenization,
the first stop string), so they end at the same token with the same text, and a streamed reply's
content, tool calls, finish reason and logprobs are those of the whole reply.

Not covered: constrained decoding. A forced tool call fixes how the reply begins (the call's
markup, and for a named function its name); the arguments are the model's, and when they do not
parse the reply is the malformed-call one (the text as content, no tool calls).
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import json
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vivace.aio import cancel_and_wait
from vivace.harness.chat import TOOL_CALL_OPEN, ChatFormat
from vivace.harness.messages import Message, ToolCall
from vivace.harness.policy import Completion, SamplingParams
from vivace.inference.detokenize import ContentStream, Detokenizer, StopFinder, TokenBytes
from vivace.inference.engine import AsyncEngine, TopLogprobs


@dataclass(frozen=True)
class Job:
    """One choice to generate."""

    prompt: list[int]  # what the engine reads: the rendered request, then `forced`
    forced: list[int]  # ids the reply begins with, fed rather than sampled (tool_choice); part of the reply
    params: SamplingParams
    stops: list[str] = field(default_factory=list)  # stop strings: the reply ends before the first
    top_logprobs: int = 0  # alternatives to report per sampled token
    hidden: frozenset[int] = frozenset()  # ids the reply's text leaves out (special tokens, end tokens)


@dataclass(frozen=True)
class Output:
    """One generated choice."""

    completion: Completion  # the engine's: sampled ids (not the forced ones), their logprobs, finish reason
    forced: list[int]  # the job's forced ids: the reply is forced + sampled
    cut: str | None = None  # ended by a stop string: the reply's text before it (the forced text included)
    top: Sequence[TopLogprobs] = ()  # per sampled id, its most likely alternatives (when asked)
    # Ended by a stop string: how many sampled ids spell the text before it (Reading.covering); the
    # rest spell some of the stop string, which the reply leaves out. None: all of them.
    kept: int | None = None
    hidden: frozenset[int] = frozenset()  # the job's: ids the text leaves out

    @property
    def ids(self) -> list[int]:
        return self.forced + self.completion.token_ids

    def text(self, chat: ChatFormat) -> str:
        """The reply's text: before the stop string, else the decode of its ids but the hidden ones."""
        if self.cut is not None:
            return self.cut
        return chat.decode([t for t in self.ids if t not in self.hidden])

    @property
    def reply_output(self) -> list[int] | str:
        """What the reply is read from: the text before the stop string, else the ids."""
        return self.ids if self.cut is None else self.cut


class Reading:
    """One choice's tokens as they arrive: ids, logprobs and alternatives, the text decoded
    incrementally (beginning with the forced ids' text), and where the first stop string starts."""

    def __init__(self, chat: ChatFormat, job: Job):
        self.job = job
        self.detok = Detokenizer(chat.decode, job.hidden)
        self.pieces = [self.detok.add(t) for t in job.forced]
        self.floor = sum(map(len, self.pieces))  # stop strings are searched for after the forced text
        self.length = self.floor  # the text's length so far
        self.finder = StopFinder(job.stops) if job.stops else None
        self.ids: list[int] = []
        self.ends: list[int] = []  # per sampled id, where its text ends in the text
        self.logprobs: list[float] = []
        self.top: list[TopLogprobs] = []
        self.cut: int | None = None  # where the first stop string starts in the text

    @property
    def forced_text(self) -> str:
        return "".join(self.pieces[: len(self.job.forced)])

    def add(self, item: tuple) -> str:
        """Takes one streamed (token, logprob[, alternatives]); returns the text it completes."""
        self.ids.append(item[0])
        self.logprobs.append(item[1])
        if len(item) > 2:
            self.top.append(item[2])
        delta = self.detok.add(item[0])
        self.pieces.append(delta)
        self.length += len(delta)
        self.ends.append(self.length)
        if self.finder is not None and delta:
            at = self.finder.feed(delta)
            if at is not None:
                self.cut = self.floor + at
        return delta

    def output(self, done: Completion | None, version: int) -> Output:
        """The engine's completion when it ended the choice, else the choice cut at a stop string."""
        if done is not None:
            return Output(done, self.job.forced, None, self.top, hidden=self.job.hidden)
        completion = Completion(list(self.ids), list(self.logprobs), "stop", version)
        text = "".join(self.pieces)[: self.cut]
        return Output(completion, self.job.forced, text, self.top, self.covering(self.cut), self.job.hidden)

    def covering(self, upto: int | None) -> int:
        """How many of the sampled ids spell text wholly before `upto` (a stop string's start; None:
        all): a token with part of a stop string is not the reply's, and a token with part of a
        character goes with the token that completes it."""
        if upto is None:
            return len(self.ids)
        k = bisect.bisect_right(self.ends, upto)
        while k and not self.pieces[len(self.job.forced) + k - 1]:
            k -= 1
        return k


async def generate(engine: AsyncEngine, chat: ChatFormat, job: Job) -> Output:
    """Runs one choice to its end: a stop token, the token limit or (read as it streams) a stop string."""
    if not job.stops:
        done = await engine.generate(job.prompt, job.params, top_logprobs=job.top_logprobs)
        return Output(done, job.forced, None, getattr(done, "top", ()), hidden=job.hidden)
    reading = Reading(chat, job)
    tokens = engine.stream(job.prompt, job.params, top_logprobs=job.top_logprobs)
    try:
        async for item in tokens:
            if isinstance(item, Completion):
                return reading.output(item, engine.version)
            reading.add(item)
            if reading.cut is not None:
                return reading.output(None, engine.version)
    finally:
        await tokens.aclose()  # stops the engine's request when a stop string ended it early
    raise RuntimeError("the engine's stream ended without a completion")


# -- replies -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    tools: bool  # parse tool calls (tools given and tool_choice is not "none")
    parallel: bool  # several calls may be returned (parallel_tool_calls)
    logprobs: bool = False  # report each sampled token's logprob (chat `logprobs`)
    names: frozenset[str] | None = None  # the functions the request declared; None: any name
    strict: Mapping[str, Any] = field(default_factory=dict)  # function name -> jsonschema validator of its arguments

    def declared(self, call: ToolCall) -> bool:
        """Whether a parsed call is to a declared function, with arguments its `strict` schema allows."""
        if self.names is None:
            return True
        check = self.strict.get(call.name)
        return call.name in self.names and (check is None or check.is_valid(call.arguments))


def reply(chat: ChatFormat, out: Output, shape: Shape) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason of a generated choice; the streamed reply ends the same."""
    output, finish_reason = out.reply_output, out.completion.finish_reason
    text = out.text(chat)
    if not shape.tools:
        return {"role": "assistant", "content": text.strip() or None}, "length" if finish_reason == "length" else "stop"
    message, _ = chat.parse(output, finish_reason=finish_reason)
    if any(c.error or not shape.declared(c) for c in message.tool_calls):
        # One malformed call (or one to a function the request did not declare, or against a strict
        # schema) makes the whole reply text, the good calls' markup included, as vLLM's tool parsers
        # answer: a client that parses the markup (OpenAIPolicy) gets every call and every error, and
        # none reads a good call twice (in tool_calls and in the content).
        return {"role": "assistant", "content": text.strip() or None}, "length" if finish_reason == "length" else "stop"
    answer: dict[str, Any] = {"role": "assistant", "content": message.content or None}
    calls = [{**c.to_openai(), "id": call_id()} for c in message.tool_calls]
    if not shape.parallel:
        calls = calls[:1]
    if calls:
        answer["tool_calls"] = calls
    finish = "length" if finish_reason == "length" else "tool_calls" if calls else "stop"
    return answer, finish


def call_id() -> str:
    """A tool call's id, unique across conversations as OpenAI's are ("call_" and 24 hex digits): a
    client may key results by id over a whole conversation. The chat template never sees it: the
    server numbers a request's calls again before rendering (server.numbered_calls)."""
    return "call_" + secrets.token_hex(12)


def logprob_entry(chat: ChatFormat, token: int, logprob: float, top: TopLogprobs = ()) -> dict[str, Any]:
    """One sampled token in OpenAI's chat `logprobs.content` form."""

    def piece(t: int) -> dict[str, Any]:
        # Not the text's UTF-8: part of a character decodes to U+FFFD, its bytes are the token's own.
        return {"token": chat.decode([t]), "bytes": list(token_bytes(chat.tokenizer)(t))}

    return {**piece(token), "logprob": logprob, "top_logprobs": [{**piece(t), "logprob": lp} for t, lp in top]}


@functools.lru_cache(maxsize=4)
def token_bytes(tokenizer: Any) -> TokenBytes:
    """The tokenizer's TokenBytes, built once (a server has one tokenizer)."""
    return TokenBytes(tokenizer)


def chat_logprobs(chat: ChatFormat, out: Output) -> list[dict[str, Any]]:
    """The sampled tokens' entries: not the forced ids (not sampled), nor the end-of-turn token, nor
    the tokens of a stop string that ended the reply (its text is not in the reply)."""
    done, stop = out.completion, set(chat.stop_ids)
    top = list(out.top) or [()] * len(done.token_ids)
    rows = list(zip(done.token_ids, done.logprobs, top, strict=True))[: out.kept]
    return [logprob_entry(chat, t, lp, alts) for t, lp, alts in rows if t not in stop]


# -- /v1/completions' logprobs ------------------------------------------------------------------------


def completion_logprobs(chat: ChatFormat, out: Output, text: str, alternatives: bool) -> dict[str, Any]:
    """A choice's `logprobs` in OpenAI's legacy Completions form, `text` being its reply: each
    token named as `completion_token` names it, and its `text_offset` in `text`."""
    ids = out.completion.token_ids
    logprobs: dict[str, Any] = {
        "tokens": [completion_token(chat, t) for t in ids],
        "token_logprobs": out.completion.logprobs,
        "text_offset": text_offsets(chat, ids, text, out.hidden),
    }
    if alternatives:
        logprobs["top_logprobs"] = [top_by_token(chat, alts) for alts in out.top]
    return logprobs


def completion_token(chat: ChatFormat, token: int) -> str:
    """A token as the legacy `tokens` and `top_logprobs` name it: its text when its own bytes are
    UTF-8, else OpenAI's spelling of them, "bytes:\\xe9\\x80" (part of a character, which alone
    would decode to U+FFFD, so parts of different characters would look alike)."""
    data = token_bytes(chat.tokenizer)(token)
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def top_by_token(chat: ChatFormat, alternatives: TopLogprobs) -> dict[str, float]:
    """A legacy `top_logprobs` entry: {token: logprob}, the likelier kept where two ids read the same."""
    entry: dict[str, float] = {}
    for t, lp in alternatives:
        entry.setdefault(completion_token(chat, t), lp)
    return entry


def text_offsets(chat: ChatFormat, ids: Sequence[int], text: str, hidden: frozenset[int] = frozenset()) -> list[int]:
    """Where each token begins in `text`, the decode of `ids` (but the `hidden` ones, which take no
    text) or the part of it before a stop string: the character its first byte is part of, so the
    tokens of one character share its offset (as OpenAI's do), and a token past the end of `text`
    gets len(text)."""
    pieces = [b"" if t in hidden else token_bytes(chat.tokenizer)(t) for t in ids]
    if b"".join(pieces).decode(errors="replace") == chat.decode([t for t in ids if t not in hidden]):  # byte-level BPE
        offsets = _byte_offsets(pieces)
    else:  # a tokenizer whose single-token decode loses text (SentencePiece's leading space)
        offsets = _delta_offsets(chat, ids, hidden)
    return [min(at, len(text)) for at in offsets]


def _byte_offsets(pieces: Sequence[bytes]) -> list[int]:
    """Each piece's first byte's character in the decode of them all, where invalid UTF-8 is a
    U+FFFD per maximal invalid run: the last character of the decode up to that byte. Decoded from
    the last byte that is not a continuation byte (a character or invalid run always ends before
    one), so each decode is a few bytes and the whole linear."""
    data = b"".join(pieces)
    offsets, start, sync, chars = [], 0, 0, 0  # chars: the decode's length up to `sync`
    for piece in pieces:
        if start == len(data):  # nothing follows (an empty token at the end)
            offsets.append(chars + len(data[sync:].decode(errors="replace")))
            continue
        at = start
        while at > sync and 0x80 <= data[at] < 0xC0:
            at -= 1
        chars += len(data[sync:at].decode(errors="replace"))
        sync = at
        offsets.append(chars + len(data[sync : start + 1].decode(errors="replace")) - 1)
        start += len(piece)
    return offsets


def _delta_offsets(chat: ChatFormat, ids: Sequence[int], hidden: frozenset[int]) -> list[int]:
    """Each token's offset as the length of the text before the delta it completes: exact, but for
    a token after a U+FFFD (invalid UTF-8), which the detokenizer holds back with that token, so
    the token is placed at the U+FFFD."""
    detok = Detokenizer(chat.decode, hidden)
    offsets, length = [], 0
    for t in ids:
        offsets.append(length)
        length += len(detok.add(t))
    return offsets


async def stream_choice(
    engine: AsyncEngine, chat: ChatFormat, job: Job, index: int, shape: Shape
) -> AsyncIterator[dict[str, Any] | Output]:
    """One choice as the `choices` items of chat-completion chunks (content deltas as they are
    sure, logprobs with them, tool calls once parsed, then the finish reason), then its Output."""

    def choice(delta: dict[str, Any], finish: str | None = None, entries: list | None = None) -> dict[str, Any]:
        item: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish}
        if entries:
            item["logprobs"] = {"content": entries}
        return item

    yield choice({"role": "assistant", "content": ""})
    reading = Reading(chat, job)
    content = ContentStream(job.stops, TOOL_CALL_OPEN if shape.tools else None)
    content.feed(reading.forced_text)
    stop_ids = set(chat.stop_ids)
    # Entries not sent yet, by sampled index: one is sent once the content sent holds all its text, so
    # the tokens of a stop string (which the reply leaves out) never are, as in chat_logprobs.
    entries: list[tuple[int, dict[str, Any]]] = []
    lead, sent = 0, 0  # the leading whitespace the content leaves out; the content's length sent

    def ready(upto: int) -> list[dict[str, Any]]:
        nonlocal entries
        out = [e for i, e in entries if i < upto]
        entries = [(i, e) for i, e in entries if i >= upto]
        return out

    final: Output | None = None
    tokens = engine.stream(job.prompt, job.params, top_logprobs=job.top_logprobs)
    try:
        async for item in tokens:
            if isinstance(item, Completion):
                final = reading.output(item, engine.version)
                break
            if shape.logprobs and item[0] not in stop_ids:
                entries.append((len(reading.ids), logprob_entry(chat, *item)))
            delta = reading.add(item)
            if reading.cut is not None:
                final = reading.output(None, engine.version)
                break
            if shown := content.feed(delta):
                if not sent:
                    text = "".join(reading.pieces)
                    lead = len(text) - len(text.lstrip())
                sent += len(shown)
                yield choice({"content": shown}, entries=ready(reading.covering(lead + sent)))
    finally:
        await tokens.aclose()
    if final is None:
        raise RuntimeError("the engine's stream ended without a completion")
    answer, finish = reply(chat, final, shape)
    whole, sent_text = answer.get("content") or "", content.sent
    rest = whole[len(sent_text) :] if whole.startswith(sent_text) else ""
    last = ready(reading.covering(None) if final.kept is None else final.kept)
    if rest or last:
        yield choice({"content": rest} if rest else {}, entries=last)
    for i, call in enumerate(answer.get("tool_calls") or ()):
        yield choice({"tool_calls": [{"index": i, **call}]})
    yield choice({}, finish)
    yield final


class Stopped(Exception):
    """The server is stopping: `merge` ended its streams early (their generation cancelled)."""


IDLE = object()  # what `merge` yields after `idle_s` without an item


async def merge(
    streams: list[AsyncIterator],
    on_stop: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
    idle_s: float | None = None,
) -> AsyncIterator:
    """The items of several async iterators as they come; closing this closes them all. `on_stop`
    registers a callback (returning its unregistration) that the server calls when it stops: the
    iterators are then closed and this raises Stopped. With `idle_s`, IDLE comes after each `idle_s`
    seconds in which no iterator gave an item."""
    queue: asyncio.Queue = asyncio.Queue()
    end, stopped = object(), object()
    forget = on_stop(lambda: queue.put_nowait(stopped)) if on_stop is not None else (lambda: None)

    async def pump(stream: AsyncIterator) -> None:
        try:
            async for item in stream:
                await queue.put(item)
        except Exception as exc:  # re-raised by the reader
            await queue.put(exc)
        finally:
            await queue.put(end)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    try:
        running = len(tasks)
        while running:
            try:  # what is queued at once: wait_for would make a task per item
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                try:
                    item = await asyncio.wait_for(queue.get(), idle_s)  # None: no limit
                except TimeoutError:
                    yield IDLE
                    continue
            if item is end:
                running -= 1
            elif item is stopped:
                raise Stopped("the server is shutting down")
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        forget()
        await cancel_and_wait(tasks)  # a reader that left (or a failed choice) stops the others' generation


# -- forcing a tool call -----------------------------------------------------------------------------

# Arguments that stand in for a call's real ones while rendering, to find where they begin.
_ARGS_STAND_IN = {"vivace_arguments_here": 0}


def forced_call(chat: ChatFormat, name: str | None) -> list[int]:
    """The ids that make a reply open a tool call: the chat format's call markup (what the template
    writes before a call's JSON: "<tool_call>\\n" for Qwen), and for a named function the JSON up
    to its arguments ('{"name": "NAME", "arguments":'). They are the template's own rendering of a
    call, cut at a token boundary, so the model continues a tokenization it was trained on; the
    cut is past the markup, and past the name's closing quote, so both are fixed. ValueError when
    the template does not write calls that way, or no token boundary lies past them."""
    stand_in = name or "f"
    call = Message("assistant", "", (ToolCall("call_0", stand_in, dict(_ARGS_STAND_IN)),))
    text, ids = chat.assistant_text(call), chat.assistant_ids(call)
    opened = text.find(TOOL_CALL_OPEN)
    name_at, spelled = -1, ""
    # transformers' tojson keeps non-ASCII characters; a template's own JSON may escape them
    for spelled in (json.dumps(stand_in, ensure_ascii=False), json.dumps(stand_in)):
        if opened >= 0 and (name_at := text.find(spelled, opened)) >= 0:
            break
    args_at = text.find(json.dumps(_ARGS_STAND_IN))
    brace = text.rfind("{", opened, name_at)  # the call's JSON object opens here
    if name_at < 0 or args_at < name_at or brace < 0:
        raise ValueError(
            f"{chat.template_name} does not write a tool call as {TOOL_CALL_OPEN} followed by "
            '{"name": ..., "arguments": ...}, so a call cannot be forced'
        )
    if name is None:  # the markup: up to the call's JSON object
        target, needed = text[:brace], opened + len(TOOL_CALL_OPEN)
    else:
        target, needed = text[:args_at], name_at + len(spelled)
    cut = next(b for b in range(len(ids), -1, -1) if target.startswith(chat.decode(ids[:b])))
    if len(chat.decode(ids[:cut])) < needed:  # byte-level BPE pre-tokenizers split after both
        raise ValueError(
            f"this model's tokenizer joins the end of the call's {'markup' if name is None else 'name'} "
            "to what follows it in one token, so the call cannot be forced by its opening tokens"
        )
    return ids[:cut]
