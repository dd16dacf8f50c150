"""`vivace serve`: the engine behind an OpenAI-compatible HTTP API.

Endpoints:
- POST /v1/chat/completions: messages (+ tools) rendered with the model's chat format, the
  output parsed into content and `tool_calls` (several per message); `stream: true` sends
  server-sent events (content deltas as tokens arrive, tool calls once parsed, then the
  finish reason, and usage when `stream_options.include_usage`).
- POST /v1/completions: `prompt` as token ids (or text); returns the generated `token_ids`, the
  sampled tokens' logprobs and the `policy_version` — what RL rollouts and `HttpSampler` use.
- GET /v1/models, GET /health, GET /metrics (tokens/s, batch occupancy, queue).

Chat requests may give `stop` strings (both endpoints: generation ends at the first, the text ends
before it), `tool_choice` "auto" or "none" (no schemas rendered, no calls parsed),
`parallel_tool_calls` false (the first call only) and `logprobs` (without streaming). A client that
disconnects cancels its generation.

Bad requests (invalid JSON, a field of the wrong type, a malformed message, a prompt over the
context, an unknown model) get a 4xx with an OpenAI-style error body; so do OpenAI options this
server cannot honour (`tool_choice` "required", `top_logprobs`, penalties, `logit_bias`, …), which
are refused rather than ignored. The server goes on serving.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import jinja2
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from vivace.harness.chat import ChatFormat
from vivace.harness.messages import messages_from_openai
from vivace.harness.policy import Completion, SamplingParams
from vivace.inference.engine import AsyncEngine

MAX_STOPS = 4  # as OpenAI's API
MIN_TEMPERATURE = 1e-4  # below this (and above 0) sampling is greedy: 1/T overflows float32 near 1e-38


class _Body(BaseModel):
    # Unknown OpenAI fields are accepted and ignored; known ones are type-checked strictly ("5" is not 5),
    # and those this server cannot honour are refused by `refuse_unsupported`, never silently dropped.
    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = None
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS or any(not s for s in stops):
            raise ApiError(400, f"stop: give at most {MAX_STOPS} non-empty strings")
        return stops

    def refuse_unsupported(self) -> None:
        if self.frequency_penalty or self.presence_penalty:
            raise ApiError(400, "frequency_penalty and presence_penalty are not supported here; leave them at 0")
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported here; leave it out")


class ChatBody(_Body):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=20)
    response_format: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.tool_choice not in (None, "auto", "none"):
            raise ApiError(
                400,
                f"tool_choice {self.tool_choice!r} is not supported: this server cannot force a tool call; "
                "use 'auto' or 'none'",
            )
        if self.top_logprobs:
            raise ApiError(400, "top_logprobs is not supported: only the sampled token's logprob is known")
        if self.logprobs and self.stream:
            raise ApiError(400, "logprobs are returned without streaming only; set stream to false")
        if (self.response_format or {}).get("type", "text") != "text":
            raise ApiError(400, "response_format: only {'type': 'text'} is supported")


class CompletionBody(_Body):
    prompt: list[int] | str
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int = Field(1, ge=1, le=1)

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.stream:
            raise ApiError(400, "stream is not supported on /v1/completions; use /v1/chat/completions to stream")
        if self.echo or self.suffix:
            raise ApiError(400, "echo and suffix are not supported on /v1/completions")


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def create_app(engine: AsyncEngine, chat: ChatFormat, model_name: str) -> FastAPI:
    app = FastAPI(title="vivace serve")
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors()
        )
        return _error(400, f"invalid request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:  # unknown route, wrong method
        return _error(
            exc.status_code, str(exc.detail), "not_found" if exc.status_code == 404 else "invalid_request_error"
        )

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:  # Starlette logs the traceback after this
        return _error(500, f"internal error ({type(exc).__name__}); the server log has the traceback", "server_error")

    def check_model(name: str) -> None:
        if name != model_name:
            raise ApiError(404, f"model {name!r} is not served here; this server serves {model_name!r}", "not_found")

    def params(body: _Body, max_tokens: int | None, stop_ids: list[int]) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens or 1024,
            temperature=body.temperature if body.temperature >= MIN_TEMPERATURE else 0.0,
            top_p=body.top_p,
            top_k=body.top_k,
            stop_token_ids=tuple(stop_ids),
            seed=body.seed,
        )

    async def run(
        request: Request, prompt: list[int], sp: SamplingParams, stops: list[str]
    ) -> tuple[Completion, str | None]:
        """Generate while the client waits; a client that leaves cancels its request."""
        task = asyncio.ensure_future(_generate(engine, chat, prompt, sp, stops))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=0.25)
                if not task.done() and await request.is_disconnected():
                    task.cancel()
                    raise ApiError(499, "the client closed the connection")
            return task.result()
        except ValueError as exc:  # prompt over the context, bad token ids
            raise ApiError(400, str(exc)) from exc
        finally:
            task.cancel()  # no-op when done

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_name, "version": engine.version}

    @app.get("/metrics")
    async def metrics() -> dict:
        return engine.metrics()

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": created, "owned_by": "vivace"}],
        }

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request):
        check_model(body.model)
        body.refuse_unsupported()
        stops = body.stops()
        prompt = body.prompt if isinstance(body.prompt, list) else await asyncio.to_thread(chat.encode, body.prompt)
        stop_ids = body.stop_token_ids or []
        out, cut = await run(request, prompt, params(body, body.max_tokens or 16, stop_ids), stops)
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "policy_version": out.policy_version,
            "choices": [
                {
                    "index": 0,
                    "text": chat.decode(out.token_ids) if cut is None else cut,
                    "token_ids": out.token_ids,
                    "logprobs": {"token_logprobs": out.logprobs, "tokens": [chat.decode([t]) for t in out.token_ids]},
                    "finish_reason": out.finish_reason,
                    "policy_version": out.policy_version,
                }
            ],
            "usage": _usage(len(prompt), len(out.token_ids)),
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request):
        check_model(body.model)
        body.refuse_unsupported()
        stops = body.stops()
        try:
            messages = messages_from_openai(body.messages)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc
        use_tools = bool(body.tools) and body.tool_choice != "none"
        tools = _tools(body.tools) if use_tools else None
        try:
            prompt = await asyncio.to_thread(chat.prompt_ids, messages, tools)
        except jinja2.TemplateError as exc:
            raise ApiError(400, f"the chat template cannot render these messages: {exc}") from exc
        sp = params(body, body.max_completion_tokens or body.max_tokens, chat.stop_ids)
        shape = _Shape(use_tools, body.parallel_tool_calls)
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if body.stream:
            if len(prompt) >= engine.engine.max_positions:  # fail before the 200 of a stream
                raise ApiError(
                    400, f"the prompt has {len(prompt)} tokens; the context is {engine.engine.max_positions}"
                )
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            events = _stream_chat(engine, chat, prompt, sp, stops, shape, rid, model_name, include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        out, cut = await run(request, prompt, sp, stops)
        reply, finish = _reply(chat, out.token_ids if cut is None else cut, out.finish_reason, shape)
        choice: dict[str, Any] = {"index": 0, "message": reply, "finish_reason": finish}
        if body.logprobs:
            choice["logprobs"] = {"content": _token_logprobs(chat, out)}
        return {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": _usage(len(prompt), len(out.token_ids)),
        }

    return app


# -- requests ----------------------------------------------------------------------------------------


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, t in enumerate(tools):
        fn = t.get("function")
        if t.get("type", "function") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError(
                400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}"
            )
    return tools


# -- generation --------------------------------------------------------------------------------------


async def _generate(engine: AsyncEngine, chat: ChatFormat, prompt, sp: SamplingParams, stops: list[str]):
    """(the completion, None); with stop strings, generation ends at the first one and the second
    item is the text before it (the token ids keep the token that completed the stop string)."""
    if not stops:
        return await engine.generate(prompt, sp), None
    ids: list[int] = []
    logprobs: list[float] = []
    finder = _StopFinder(stops)
    tokens = engine.stream(prompt, sp)
    try:
        async for item in tokens:
            if isinstance(item, Completion):
                return item, None
            ids.append(item[0])
            logprobs.append(item[1])
            text = _visible(chat, ids, sp)
            cut = finder.find(text)
            if cut is not None:
                return Completion(ids, logprobs, "stop", engine.version), text[:cut]
    finally:
        await tokens.aclose()  # stops the engine's request when a stop string ended it early
    raise RuntimeError("the engine's stream ended without a completion")


def _visible(chat: ChatFormat, ids: list[int], sp: SamplingParams) -> str:
    stop = set(sp.stop_token_ids)
    return chat.decode([t for t in ids if t not in stop])


class _StopFinder:
    """The first stop string in a growing text, searching only what is new since the last call."""

    def __init__(self, stops: list[str]):
        self.stops, self.longest, self.seen = stops, max(map(len, stops)), 0

    def find(self, text: str) -> int | None:
        start = max(0, self.seen - self.longest + 1)
        self.seen = len(text)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def held(self, text: str) -> int:
        """How many trailing characters could begin a stop string (not yet safe to stream)."""
        return max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


# -- replies -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    tools: bool  # parse tool calls (tools given and tool_choice is not "none")
    parallel: bool  # several calls may be returned (parallel_tool_calls)


def _reply(chat: ChatFormat, output: list[int] | str, finish_reason: str, shape: _Shape) -> tuple[dict[str, Any], str]:
    """The assistant message and finish reason for generated token ids (or, cut at a stop string,
    text); the streamed reply ends the same."""
    text = output if isinstance(output, str) else chat.decode([t for t in output if t not in chat.stop_ids])
    if not shape.tools:
        return {"role": "assistant", "content": text.strip() or None}, "length" if finish_reason == "length" else "stop"
    message, _ = chat.parse(output, finish_reason=finish_reason)
    reply: dict[str, Any] = {"role": "assistant", "content": message.content or None}
    calls = [c.to_openai() for c in message.tool_calls if c.error is None]
    if not shape.parallel:
        calls = calls[:1]
    if calls:
        reply["tool_calls"] = calls
    if any(c.error for c in message.tool_calls):  # keep what could not be parsed, as text
        reply["content"] = text.strip() or None
    finish = "length" if finish_reason == "length" else "tool_calls" if calls else "stop"
    return reply, finish


def _token_logprobs(chat: ChatFormat, out: Completion) -> list[dict[str, Any]]:
    stop = set(chat.stop_ids)
    return [
        {"token": (piece := chat.decode([t])), "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []}
        for t, lp in zip(out.token_ids, out.logprobs, strict=True)
        if t not in stop
    ]


async def _stream_chat(
    engine, chat: ChatFormat, prompt, sp, stops, shape: _Shape, rid: str, model: str, include_usage: bool
):
    def chunk(delta: dict, finish: str | None = None, usage: dict | None = None) -> str:
        data: dict[str, Any] = {
            "id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if usage is None else [],
        }  # fmt: skip
        if usage is not None:
            data["usage"] = usage
        return f"data: {json.dumps(data)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    ids: list[int] = []
    logprobs: list[float] = []
    sent = ""  # content already sent: always a prefix of the final reply's content
    finder = _StopFinder(stops) if stops else None
    final: Completion | None = None
    cut_text: str | None = None
    tokens = engine.stream(prompt, sp)
    try:
        async for item in tokens:
            if isinstance(item, Completion):
                final = item
                break
            ids.append(item[0])
            logprobs.append(item[1])
            text = _visible(chat, ids, sp)
            cut = finder.find(text) if finder else None
            if cut is not None:
                final, cut_text = Completion(ids, logprobs, "stop", engine.version), text[:cut]
                break
            shown = _streamable(text, shape, finder)
            if len(shown) > len(sent) and shown.startswith(sent):
                yield chunk({"content": shown[len(sent) :]})
                sent = shown
    finally:
        await tokens.aclose()
    if final is None:
        raise RuntimeError("the engine's stream ended without a completion")
    reply, finish = _reply(chat, final.token_ids if cut_text is None else cut_text, final.finish_reason, shape)
    content = reply.get("content") or ""
    if content.startswith(sent) and len(content) > len(sent):
        yield chunk({"content": content[len(sent) :]})
    for i, call in enumerate(reply.get("tool_calls") or ()):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, finish)
    if include_usage:
        yield chunk({}, usage=_usage(len(prompt), len(final.token_ids)))
    yield "data: [DONE]\n\n"


def _streamable(text: str, shape: _Shape, finder: _StopFinder | None) -> str:
    """The part of the text so far that is surely content: before any tool call, without the
    whitespace the reply strips, an incomplete character, or what may begin a stop string."""
    if shape.tools:
        text = text.split("<tool_call>", 1)[0]
    if finder:
        text = text[: len(text) - finder.held(text)]
    return text.rstrip("\ufffd").strip()


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})
