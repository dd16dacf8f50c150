"""`vivace serve`: the engine behind an OpenAI-compatible HTTP API.

Endpoints:
- POST /v1/chat/completions: messages (+ tools) rendered with the model's chat format, the
  output parsed into content and `tool_calls` (several per message); `stream: true` sends
  server-sent events (content deltas as tokens arrive, tool calls once parsed, then the
  finish reason, and usage when `stream_options.include_usage`).
  A reply in which any call is malformed (its JSON does not parse, it has no name, it was never
  closed, …) has no `tool_calls`: its whole text, the good calls' markup included, is the content
  and the finish reason "stop" (or "length"), as vLLM's tool parsers answer. A client that parses
  the markup (OpenAIPolicy does) then gets every call and every error, as a token-level rollout
  does, and none reads a good call twice. Each call's id is fresh ("call_" and 24 hex digits, as
  OpenAI's), unique across a conversation; the chat template never sees the ids a client sends:
  a request's calls are renamed call_0, call_1, … per turn, with the results answering them, before
  rendering (`numbered_calls`: the ids of a token-level rollout).
- POST /v1/completions: `prompt` as token ids (or text); returns the generated `token_ids`, the
  sampled tokens' logprobs and the `policy_version` — what RL rollouts and `HttpSampler` use.
- Both end generation at the model's end tokens (its end of turn, its eos and those its generation
  config names), as vLLM's does, and at any `stop_token_ids`; `ignore_eos: true` (vLLM's option)
  ends it only at `stop_token_ids`, `stop` or `max_tokens`. Without `max_tokens` (or chat's
  `max_completion_tokens`) a chat reply has at most 1,024 tokens and a completion 16, OpenAI's legacy
  default; vLLM's `top_k` is honoured, its `repetition_penalty`, `min_p` and `min_tokens` refused.
- The text (content, completion text) leaves out special tokens (`skip_special_tokens`, vLLM's option,
  true by default), but not the tool-call markup, and the end token that ended it unless
  `include_stop_str_in_output` (for stop tokens; refused with `stop` strings); streamed and whole alike.
- GET /v1/models, GET /v1/models/{model} (404 for another name; the card has vLLM's max_model_len),
  GET /health, GET /metrics (tokens/s, batch occupancy, queue).

Options honoured:
- `stop` strings (both endpoints; at most 4, of at most 1,000 characters: a streamed reply checks
  each token for the beginning of one): generation ends at the first, the text ends before it.
- `n` (1 to 16, both endpoints): independent samples of one prompt, `choices[i].index` = i, each
  with its own seed when `seed` is given (choice 0 keeps `seed`); streamed chunks carry their
  choice's index. The choices are submitted together, so the engine prefills a long prompt once
  and the others copy it (its shared-prefix admission; RL rollout groups use the same). Usage
  counts the prompt once and the completions summed.
- `tool_choice` "auto", "none" (no schemas rendered, no calls parsed), "required" and
  {"type": "function", "function": {"name": NAME}}. The last two feed the reply's first tokens
  instead of sampling them (replies.forced_call): the chat format's call markup, and for a named
  function, or "required" with one tool, '{"name": "NAME", "arguments":'. Guaranteed: the reply
  opens a tool call (of NAME); when the model's arguments then parse, the reply has at least one
  tool call (the first of NAME), else it is the malformed-call reply (the text as content, no tool
  calls). A call to a function not in `tools` is a malformed call, whatever the tool_choice: a
  client dispatching on the name never gets one it did not declare. So is a call to a function
  marked `strict` whose arguments its `parameters` schema refuses (checked after sampling with
  jsonschema; decoding is not constrained, so the reply is then text, where OpenAI's is a call). The forced
  tokens are part of the reply: counted in completion tokens and `max_tokens` (a limit that cannot
  hold them and one token of the model's is refused with 400, not exceeded), not in logprobs.
- `parallel_tool_calls` false: the first call only.
- `logprobs` (chat, streamed too: each chunk carries its tokens' entries) with `top_logprobs`
  0 to 20, the entries those of the reply's tokens (a stop string's tokens, and a token holding
  part of one, are left out, as its text is), each entry's `bytes` the token's own (a token holding part of a character gives its
  bytes, not U+FFFD's, so the entries' bytes join into the reply's UTF-8). /v1/completions
  always returns OpenAI's legacy `tokens`, `token_logprobs` and `text_offset` (each token's
  character offset in `text`; the tokens of one character share its offset, as OpenAI's do;
  offsets count from the reply, as vLLM's do, not from the prompt, as OpenAI's do), and with
  `logprobs` N (0 to 20) `top_logprobs` (a {token: logprob} per token; ids that read the same
  keep the likelier). A token there is its text, or where its bytes are part of a character
  (not UTF-8 alone) OpenAI's "bytes:\\xe9\\x80" spelling of them. Every
  logprob, the sampled token's and the alternatives', is from the distribution the engine samples
  from before top-k/top-p: `log_softmax(logits / temperature)`, the model's own at temperature 1
  (and at 0, greedy). OpenAI reports the model's own at any temperature.
A client that disconnects cancels its generation. `max_tokens` beyond the context is cut to it
(the reply ends with finish_reason "length"), where OpenAI and vLLM refuse the request.
Stopping (SIGTERM, Ctrl-C; `vivace serve` runs sandbox.background.ClosingServer over `Stopping`): new
requests are answered 503, running ones get SHUTDOWN_GRACE_S to finish, then a whole reply's request
is answered 503 and a stream ends with an error event, their generation cancelled; a client that
takes nothing is dropped; the process is gone within a few seconds, also when forced.

An option given as null takes its default, as OpenAI's API reads it (the openai client sends
`temperature=None` so). Bad requests (invalid JSON, a body not sent as application/json, a field of
the wrong type, a malformed message or tool, a prompt over the context, an unknown model,
`tool_choice` naming a function not in `tools`, a `seed` outside int64, a string holding a lone
surrogate, messages or tools nested over 64 deep) get a 4xx with an OpenAI-style error body; so do
OpenAI options this server cannot honour, which are refused rather than ignored: penalties,
`logit_bias`, `response_format` other than text, `best_of`, `echo`, `suffix`, streaming on
/v1/completions, `tool_choice` in other forms, the legacy `functions` and `function_call` (give
`tools` and `tool_choice`), audio (`audio`, `modalities` other than text), `web_search_options`,
`stream_options` without `stream` or with an option other than `include_usage` (a strict bool) and
`include_obfuscation`. The server goes on serving.
A request body larger than a prompt of the whole context could need (`body_cap`) is refused with
413 before it is read, so one request cannot take the server's memory. A stream that fails after
its 200 ends with an error event (`data: {"error": ...}`), which the openai client raises.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import jinja2
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from vivace.aio import cancel_and_wait
from vivace.body_limit import BodyLimit
from vivace.harness.chat import ChatFormat
from vivace.harness.messages import Message, messages_from_openai
from vivace.harness.policy import SamplingParams, derive_seed
from vivace.inference.engine import AsyncEngine
from vivace.inference.replies import (
    IDLE,
    Job,
    Output,
    Shape,
    Stopped,
    chat_logprobs,
    completion_logprobs,
    forced_call,
    generate,
    merge,
    reply,
    stream_choice,
)
from vivace.inference.sampling import MIN_TEMPERATURE

log = logging.getLogger(__name__)

MAX_STOPS = 4  # as OpenAI's API
MAX_STOP_CHARS = 1000  # per stop string: a streamed reply holds back what may begin one, checked per token
MAX_CHOICES = 16  # n
MAX_TOP_LOGPROBS = 20  # as OpenAI's chat API
MAX_NESTING = 64  # arrays and objects within one message or tool: the chat template recurses over them
# Once told to stop (SIGTERM, Ctrl-C), how long running requests may still finish before they are cut
# short; and uvicorn's own wait, a backstop (sandbox.background.ClosingServer runs the stop): well inside
# the 10 s that `docker stop` and Kubernetes give before SIGKILL.
SHUTDOWN_GRACE_S = 1.0
# A streamed reply sends nothing while it holds text back (a tool call is sent once parsed): a comment line
# after this long without a chunk keeps a proxy's idle timeout (nginx: 60 s) from cutting a long call.
STREAM_KEEPALIVE_S = 15.0
GRACEFUL_BACKSTOP_S = SHUTDOWN_GRACE_S + 4


class StreamOptions(BaseModel):
    """OpenAI's `stream_options`; an unknown option is refused, not ignored."""

    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False  # a last chunk with the usage and no choices
    # OpenAI pads a stream's chunks against length side channels unless told not to; these carry no
    # padding (the server binds loopback by default), which either value is content with.
    include_obfuscation: bool = True


class _Body(BaseModel):
    # Unknown OpenAI fields are accepted and ignored; known ones are type-checked strictly ("5" is not 5),
    # and those this server cannot honour are refused by `refuse_unsupported`, never silently dropped.
    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        """An explicit null asks for the default, as OpenAI's API reads it: the openai client sends
        `temperature=None` as null, and code passing an unset setting through does that."""
        if not isinstance(data, dict):
            return data
        nulls = [
            k for k, v in data.items() if v is None and k in cls.model_fields and not cls.model_fields[k].is_required()
        ]
        return {k: v for k, v in data.items() if k not in nulls}

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # int64, as OpenAI's
    n: int = Field(1, ge=1, le=MAX_CHOICES, description="independent samples of the prompt")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # vLLM's options: its end-token rules are honoured; its other samplers' knobs are refused when they act.
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False  # generate past the model's end tokens
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    skip_special_tokens: bool = True  # the reply's text leaves out special tokens (not the tool markup)
    min_tokens: int = 0
    include_stop_str_in_output: bool = False

    def hidden_ids(self, chat: ChatFormat) -> frozenset[int]:
        """The ids a choice's text leaves out: special tokens unless `skip_special_tokens` is false, and
        then the end token that ends it unless `include_stop_str_in_output` (HttpSampler's raw text)."""
        if self.skip_special_tokens:
            return chat.special_ids
        return frozenset() if self.ignore_eos or self.include_stop_str_in_output else frozenset(chat.stop_ids)

    def stop_ids(self, chat: ChatFormat) -> list[int]:
        """The ids that end a choice: `stop_token_ids`, and the model's end tokens unless `ignore_eos`."""
        return list(dict.fromkeys([*(self.stop_token_ids or []), *([] if self.ignore_eos else chat.stop_ids)]))

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS or any(not 0 < len(s) <= MAX_STOP_CHARS for s in stops):
            raise ApiError(
                400, f"stop: give at most {MAX_STOPS} non-empty strings of at most {MAX_STOP_CHARS} characters"
            )
        return stops

    def refuse_unsupported(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "stream_options is only allowed with stream: true")
        if self.frequency_penalty or self.presence_penalty:
            raise ApiError(400, "frequency_penalty and presence_penalty are not supported here; leave them at 0")
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported here; leave it out")
        if self.repetition_penalty != 1.0 or self.min_p:
            raise ApiError(400, "repetition_penalty and min_p are not supported here; leave them at 1 and 0")
        if self.min_tokens:
            raise ApiError(400, "min_tokens is not supported here; leave it at 0")
        if self.include_stop_str_in_output and self.stop:
            raise ApiError(400, "include_stop_str_in_output is not supported with `stop` strings, only for stop tokens")


class ChatBody(_Body):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: dict[str, Any] | None = None
    # OpenAI options that would change the reply and that this server cannot honour: refused when given.
    functions: Any = None  # the legacy form of `tools`
    function_call: Any = None  # the legacy form of `tool_choice`
    modalities: list[str] | None = None
    audio: Any = None
    web_search_options: Any = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true")
        if (self.response_format or {}).get("type", "text") != "text":
            raise ApiError(400, "response_format: only {'type': 'text'} is supported")
        if self.functions is not None or self.function_call is not None:
            raise ApiError(
                400, "functions and function_call (OpenAI's legacy form) are not supported; give tools and tool_choice"
            )
        if self.audio is not None or self.modalities not in (None, ["text"]):
            raise ApiError(400, "this server answers text only: leave out audio, and modalities other than ['text']")
        if self.web_search_options is not None:
            raise ApiError(400, "web_search_options is not supported: this server does not search the web")

    def forced_function(self) -> tuple[bool, str | None]:
        """(whether a call is forced, the function it must call: None for any), from tool_choice."""
        choice = self.tool_choice
        if choice in (None, "auto", "none"):
            return False, None
        names = [t["function"]["name"] for t in self.tools or ()]  # checked by _tools
        if choice == "required":
            if not names:
                raise ApiError(400, "tool_choice 'required' needs tools: give at least one in `tools`")
            return True, names[0] if len(names) == 1 else None  # one tool: the call can only be to it
        fn = choice.get("function") if isinstance(choice, dict) else None
        if not (isinstance(fn, dict) and choice.get("type") == "function" and isinstance(fn.get("name"), str)):
            raise ApiError(
                400,
                f"tool_choice {choice!r} is not supported: use 'auto', 'none', 'required' or "
                "{'type': 'function', 'function': {'name': NAME}}",
            )
        if fn["name"] not in names:
            given = ", ".join(map(repr, names)) or "none"
            raise ApiError(400, f"tool_choice names function {fn['name']!r}, which is not in tools (given: {given})")
        return True, fn["name"]


class CompletionBody(_Body):
    prompt: list[int] | str
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int = Field(1, ge=1, le=1)

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        """A batch (a list of strings or of id lists, which OpenAI takes) is named as such, not as a
        list whose first item is not an int."""
        if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
            raise ValueError(
                "one prompt per request here (a string or a list of token ids): send a batch as "
                "separate requests, or use `n` for samples of one prompt"
            )
        return prompt

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.stream:
            raise ApiError(400, "stream is not supported on /v1/completions; use /v1/chat/completions to stream")
        if self.echo or self.suffix:
            raise ApiError(400, "echo and suffix are not supported on /v1/completions")


def _problem(error: dict, request: Request) -> str:
    """One validation error as "field: what is wrong"; the body's own errors say how to mend the body."""
    if error["type"] == "json_invalid":  # its loc holds the character offset, not a field
        reason = error.get("ctx", {}).get("error", error["msg"])
        return f"the body is not valid JSON: {reason} (at character {error['loc'][-1]})"
    if error["loc"] == ("body",) and isinstance(error.get("input"), bytes | str):  # not read as JSON at all
        kind = request.headers.get("content-type") or "none"
        if kind.split(";")[0].strip().lower() == "application/json":  # JSON, but a string: not an object
            return "the body must be a JSON object, not a JSON string"
        return f"the body must be a JSON object sent with content-type: application/json (this one's: {kind})"
    return f"{'.'.join(str(p) for p in error['loc'] if p != 'body') or 'body'}: {error['msg']}"


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class Stopping:
    """The app's side of a prompt stop, through sandbox.background.ClosingServer's hooks (`drain`,
    `stop_now`, `close_all`): once told to stop, new generation requests are answered 503; those
    running get `grace_s` to finish, then end: a whole reply's request with 503, a stream with an
    error event; either way the engine's requests are cancelled, freeing their slots. No asyncio
    primitive is kept (a TestClient runs each request in a loop of its own): a flag and callbacks."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.draining = False  # new requests are refused
        self.stopped = False  # the grace is over: running ones end
        self.running: set[asyncio.Task] = set()  # the requests generating now
        self._callbacks: dict[int, Callable[[], None]] = {}

    def admit(self) -> None:
        """Takes a generation request (the current task), or refuses it while stopping."""
        if self.draining:
            raise ApiError(503, "the server is shutting down and takes no new requests", "server_error")
        task = asyncio.current_task()
        if task is not None:
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    def on_stop(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls `callback` when the grace is over (at once if it is); returns its unregistration."""
        if self.stopped:
            callback()
            return lambda: None
        key = id(callback)
        self._callbacks[key] = callback
        return lambda: self._callbacks.pop(key, None)

    async def drain(self) -> None:
        self.draining = True
        if self.running:
            await asyncio.wait(set(self.running), timeout=self.grace_s)
        self.stop_now()

    def stop_now(self) -> None:
        self.draining = self.stopped = True
        callbacks, self._callbacks = list(self._callbacks.values()), {}
        for callback in callbacks:
            callback()


def create_app(
    engine: AsyncEngine,
    chat: ChatFormat,
    model_name: str,
    max_body_bytes: int | None = None,
    shutdown_grace_s: float = SHUTDOWN_GRACE_S,
) -> FastAPI:
    """`max_body_bytes`: the largest request body read (413 beyond); default `body_cap(context)`.
    `shutdown_grace_s`: how long running requests may finish once the server stops (`Stopping`)."""
    app = FastAPI(title="vivace serve")
    created = int(time.time())
    stopping = Stopping(shutdown_grace_s)
    app.state.stopping = stopping
    # sandbox.background.ClosingServer's hooks; the engine is the caller's to close

    async def let_go() -> None:
        """Waits (3 s at most) for the engine to drop the requests the stop cancelled: one it dropped
        after the event loop closed would call into the closed loop (a traceback at exit)."""
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            load = engine.metrics()
            if not load.get("running") and not load.get("waiting"):
                return
            await asyncio.sleep(0.02)

    app.state.drain, app.state.stop_now, app.state.close_all = stopping.drain, stopping.stop_now, let_go
    cap = max_body_bytes or body_cap(engine.engine.max_positions)
    app.add_middleware(BodyLimit, max_bytes=cap, too_large=lambda message: _error(413, message), what="vivace serve")

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, f"invalid request: {'; '.join(_problem(e, request) for e in exc.errors())}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:  # unknown route, wrong method
        return _error(
            exc.status_code, str(exc.detail), "not_found" if exc.status_code == 404 else "invalid_request_error"
        )

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:  # Starlette logs the traceback after this
        return _error(500, f"internal error ({type(exc).__name__}); the server log has the traceback", "server_error")

    async def check_length(chars: int, messages: int) -> None:
        """Refuses a prompt sure to be over the context before it is rendered and tokenized: each message
        takes at least a token, and a token covers at most the tokenizer's longest token of text. Near the
        body cap that work took a core 7-12 s (a 3.9 MB text, 120,000 empty messages) while streams waited."""
        longest = await asyncio.to_thread(_longest_token, chat.tokenizer)
        least = messages + -(-chars // longest)
        if least > engine.engine.max_positions:
            raise ApiError(400, f"the prompt has at least {least} tokens ({messages} messages and {chars} characters "
                                f"of text); the model's context is {engine.engine.max_positions}")  # fmt: skip

    def check_model(name: str) -> None:
        if name != model_name:
            raise ApiError(404, f"model {name!r} is not served here; this server serves {model_name!r}", "not_found")

    def jobs(body: _Body, prompt: list[int], max_tokens: int, stop_ids: list[int], forced: list[int], top: int):
        """One Job per choice; choice i > 0 gets a seed of its own, so seeded choices differ."""

        def params(i: int) -> SamplingParams:
            return SamplingParams(
                max_tokens=max_tokens - len(forced),  # the forced tokens are part of the reply
                temperature=body.temperature if body.temperature >= MIN_TEMPERATURE else 0.0,
                top_p=body.top_p,
                top_k=body.top_k,
                stop_token_ids=tuple(stop_ids),
                seed=body.seed if body.seed is None or i == 0 else derive_seed(body.seed, i),
            )

        stops = body.stops()
        hidden = body.hidden_ids(chat)
        return [Job(prompt + forced, forced, params(i), stops, top, hidden) for i in range(body.n)]

    async def run(request: Request, todo: list[Job]) -> list[Output]:
        """Generates every choice while the client waits; a client that leaves cancels them."""
        tasks = [asyncio.ensure_future(generate(engine, chat, job)) for job in todo]
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, timeout=0.25, return_when=asyncio.FIRST_EXCEPTION)
                failed = next((t.exception() for t in done if t.exception() is not None), None)
                if failed is not None:
                    raise failed
                if pending and stopping.stopped:
                    raise ApiError(503, "the server is shutting down: the request was cancelled", "server_error")
                if pending and await request.is_disconnected():
                    raise ApiError(499, "the client closed the connection")
            return [t.result() for t in tasks]
        except ValueError as exc:  # prompt over the context, bad token ids
            raise ApiError(400, str(exc)) from exc
        finally:
            await cancel_and_wait(tasks)  # the engine has dropped them before we answer

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_name, "version": engine.version}

    @app.get("/metrics")
    async def metrics() -> dict:
        return engine.metrics()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [await model(model_name)]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict:
        check_model(name)
        # max_model_len as vLLM says it: a client sizes what it sends by it (vivace's agent, its tool results).
        return {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "vivace",
            "max_model_len": engine.engine.max_positions,
        }

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        check_model(body.model)
        body.refuse_unsupported()
        stopping.admit()
        if isinstance(body.prompt, str):
            _check_renderable(body.prompt, "prompt")
            await check_length(len(body.prompt), 0)
        prompt = body.prompt if isinstance(body.prompt, list) else await asyncio.to_thread(chat.encode, body.prompt)
        outs = await run(
            request, jobs(body, prompt, body.max_tokens or 16, body.stop_ids(chat), [], body.logprobs or 0)
        )
        choices = []
        for i, out in enumerate(outs):
            done = out.completion
            text = out.text(chat)
            choices.append({
                "index": i,
                "text": text,
                "token_ids": done.token_ids,
                "logprobs": completion_logprobs(chat, out, text, bool(body.logprobs)),
                "finish_reason": done.finish_reason,
                "policy_version": done.policy_version,
            })  # fmt: skip
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "policy_version": min(o.completion.policy_version for o in outs),
            "choices": choices,
            "usage": _usage(len(prompt), outs),
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request):
        check_model(body.model)
        body.refuse_unsupported()
        stopping.admit()

        def read_messages() -> list[Message]:
            try:
                messages = numbered_calls(messages_from_openai(body.messages))
            except ValueError as exc:
                raise ApiError(400, str(exc)) from exc
            for i, m in enumerate(messages):  # what the template renders of them
                calls = [[c.id, c.name, c.arguments] for c in m.tool_calls]
                _check_renderable([m.content, m.name, m.tool_call_id, calls], f"messages[{i}]")
            for i, tool in enumerate(body.tools or ()):
                _check_renderable(tool, f"tools[{i}]")
            return messages

        # Off the event loop: 120,000 messages took ~1 s, and every open stream waited.
        messages = await asyncio.to_thread(read_messages)
        await check_length(sum(len(m.content) for m in messages), len(messages))
        use_tools = bool(body.tools) and body.tool_choice != "none"
        tools = _tools(body.tools) if use_tools else None
        forcing, name = body.forced_function()
        try:
            prompt = await asyncio.to_thread(chat.prompt_ids, messages, tools)
        except jinja2.TemplateError as exc:
            raise ApiError(400, f"the chat template cannot render these messages: {exc}") from exc
        try:
            forced = await asyncio.to_thread(forced_call, chat, name) if forcing else []
        except (ValueError, jinja2.TemplateError) as exc:  # a template that cannot force a call
            raise ApiError(400, f"tool_choice: {exc}") from exc
        top = body.top_logprobs if body.logprobs else 0
        limit = body.max_completion_tokens or body.max_tokens or 1024
        if forced and limit <= len(forced):
            field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
            raise ApiError(
                400,
                f"{field} {limit} cannot hold the forced tool call: its opening {chat.decode(forced)!r} is "
                f"{len(forced)} tokens of the reply, and the model must write at least one more; give {field} "
                f"of at least {len(forced) + 1}",
            )
        todo = jobs(body, prompt, limit, body.stop_ids(chat), forced, top)
        names = frozenset(t["function"]["name"] for t in tools or ())
        shape = Shape(use_tools, body.parallel_tool_calls, body.logprobs, names, _strict_schemas(tools or []))
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if body.stream:
            for job in todo:  # the engine's checks, before the 200 of a stream: after it, a refusal is an event
                try:
                    engine.engine.request(job.prompt, job.params, top_logprobs=job.top_logprobs)
                except ValueError as exc:  # prompt over the context, stop token ids out of the vocabulary
                    raise ApiError(400, str(exc)) from exc
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            streams = [stream_choice(engine, chat, job, i, shape) for i, job in enumerate(todo)]
            items = merge(streams, stopping.on_stop, idle_s=STREAM_KEEPALIVE_S)
            events = _stream_chat(items, rid, model_name, len(prompt), include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        outs = await run(request, todo)
        choices = []
        for i, out in enumerate(outs):
            message, finish = reply(chat, out, shape)
            choice: dict[str, Any] = {"index": i, "message": message, "finish_reason": finish}
            if body.logprobs:
                choice["logprobs"] = {"content": chat_logprobs(chat, out)}
            choices.append(choice)
        return {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": _usage(len(prompt), outs),
        }

    return app


def numbered_calls(messages: list[Message]) -> list[Message]:
    """The messages with each assistant turn's calls named call_0, call_1, … and the tool results that
    answer them named to match: the ids a token-level rollout gives them (ChatFormat.parse). The ids
    a client sends (this server's, OpenAI's: random, unique in the conversation) are its own; a chat
    template that writes ids into the prompt then shows the model what it saw in training."""
    out, renamed = [], {}
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            renamed = {}
            for j, call in enumerate(m.tool_calls):
                renamed.setdefault(call.id, f"call_{j}")
            m = dataclasses.replace(m, tool_calls=tuple(dataclasses.replace(c, id=f"call_{j}")
                                                        for j, c in enumerate(m.tool_calls)))  # fmt: skip
        elif m.role == "tool" and m.tool_call_id in renamed:
            m = dataclasses.replace(m, tool_call_id=renamed[m.tool_call_id])
        out.append(m)
    return out


@functools.lru_cache(maxsize=4)
def _longest_token(tokenizer: Any) -> int:
    """The most characters of text one token stands for (a server has one tokenizer: computed once)."""
    return max(1, *(len(tokenizer.decode([i])) for i in range(len(tokenizer))))


def _check_renderable(value: Any, where: str) -> None:
    """Refuses (400) what the chat template and tokenizer would fail on (a 500): a string, key or
    value, holding a lone surrogate (JSON's "\\ud800" outside a pair; no UTF-8 spells it), and arrays
    and objects nested over MAX_NESTING deep (rendering recurses over them). Iterative: any depth."""
    todo = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError as exc:
                raise ApiError(400, f"{where}: {item[exc.start]!a} is a lone surrogate, not a character") from None
        elif isinstance(item, dict | list):
            if depth == MAX_NESTING:
                raise ApiError(400, f"{where}: arrays and objects nested over {MAX_NESTING} deep")
            children = [*item, *item.values()] if isinstance(item, dict) else item
            todo += [(child, depth + 1) for child in children]


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools, each a function with a name of its own (a call names only its function) and (when given)
    a JSON Schema object of parameters."""
    first: dict[str, int] = {}
    for i, t in enumerate(tools):
        fn = t.get("function")
        named = isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]
        if t.get("type", "function") != "function" or not named or not isinstance(fn.get("parameters"), dict | None):
            raise ApiError(
                400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}"
            )
        if fn["name"] in first:
            raise ApiError(400, f"tools[{i}] repeats the name {fn['name']!r} of tools[{first[fn['name']]}]: a call "
                                "names only its function, so give each function a name of its own")  # fmt: skip
        first[fn["name"]] = i
    return tools


def _strict_schemas(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A validator of each `strict` function's parameters (OpenAI's structured outputs). The model is not
    constrained as it writes; a call its schema refuses is a malformed call, so a client never gets one."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    checks = {}
    for i, t in enumerate(tools):
        fn = t["function"]
        if fn.get("strict") is not True:
            continue
        schema = fn.get("parameters") or {"type": "object", "properties": {}, "additionalProperties": False}
        cls = validator_for(schema)
        try:
            cls.check_schema(schema)
        except SchemaError as exc:
            raise ApiError(400, f"tools[{i}].function.parameters is not a valid JSON Schema: {exc.message}") from exc
        checks[fn["name"]] = cls(schema)
    return checks


async def _stream_chat(items: AsyncIterator, rid: str, model: str, prompt_tokens: int, include_usage: bool):
    """Server-sent events of every choice's chunks (`merge`'s items) as they come, then usage (when
    asked) and [DONE]; a stream the server's stop ends gets an error event saying so."""

    def chunk(choices: list[dict[str, Any]], usage: dict | None = None) -> str:
        data: dict[str, Any] = {
            "id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": choices,
        }  # fmt: skip
        if usage is not None:
            data["usage"] = usage
        return f"data: {json.dumps(data)}\n\n"

    outs: list[Output] = []
    try:
        async for item in items:
            if item is IDLE:  # an SSE comment, which clients skip: the connection is alive
                yield ": keep-alive\n\n"
            elif isinstance(item, Output):
                outs.append(item)
            else:
                yield chunk([item])
    except Stopped:
        error = {"message": "the server is shutting down: the reply was cut short", "type": "server_error", "code": 503}
        yield f"data: {json.dumps({'error': error})}\n\n"
        yield "data: [DONE]\n\n"
        return
    except Exception as exc:  # past the 200: an error event, which the openai client raises, as vLLM's streams do
        log.exception("a streamed chat completion failed")
        message = f"internal error ({type(exc).__name__}); the server log has the traceback"  # as a 500's
        error = {"message": message, "type": "server_error", "code": 500}
        yield f"data: {json.dumps({'error': error})}\n\n"
        yield "data: [DONE]\n\n"
        return
    if include_usage:
        yield chunk([], usage=_usage(prompt_tokens, outs))
    yield "data: [DONE]\n\n"


def _usage(prompt: int, outs: list[Output]) -> dict[str, int]:
    """OpenAI's usage: the prompt once, every choice's reply (forced tokens included) summed."""
    completion = sum(len(o.ids) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def body_cap(context: int) -> int:
    """The request body size that can still hold a prompt of `context` tokens, with room to spare: 64
    bytes a token (JSON escapes make a character up to 6 bytes, or 12 outside the BMP; token ids take
    about 7), and at least 4 MiB."""
    return max(4 << 20, 64 * context)


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})
