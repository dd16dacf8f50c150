"""`vivace serve`: the engine behind an OpenAI-compatible HTTP API.

Endpoints:
- POST /v1/chat/completions: messages (+ tools) rendered with the model's chat format, the
  output parsed into content and `tool_calls` (several per message); `stream: true` sends
  server-sent events (content deltas as tokens arrive, tool calls once parsed, then the
  finish reason, and usage when `stream_options.include_usage`).
- POST /v1/completions: `prompt` as token ids (or text); returns the generated `token_ids`, the
  sampled tokens' logprobs and the `policy_version` — what RL rollouts and `HttpSampler` use.
- GET /v1/models, GET /health, GET /metrics (tokens/s, batch occupancy, queue).

Bad requests (invalid JSON or fields, a prompt over the context, an unknown model) get a 4xx
with an OpenAI-style error body; the server goes on serving.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from vivace.harness.chat import ChatFormat
from vivace.harness.messages import Message
from vivace.harness.policy import Completion, SamplingParams
from vivace.inference.engine import AsyncEngine


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields are accepted and ignored

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = None
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    stream: bool = False
    stream_options: dict[str, Any] | None = None


class ChatBody(_Body):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionBody(_Body):
    prompt: list[int] | str
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None


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

    def check_model(name: str) -> None:
        if name != model_name:
            raise ApiError(404, f"model {name!r} is not served here; this server serves {model_name!r}", "not_found")

    def params(body: _Body, max_tokens: int | None, stops: list[int]) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens or 1024,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            stop_token_ids=tuple(stops),
            seed=body.seed,
        )

    async def run(prompt: list[int], sp: SamplingParams) -> Completion:
        try:
            return await engine.generate(prompt, sp)
        except ValueError as exc:  # prompt over the context, bad token ids
            raise ApiError(400, str(exc)) from exc

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
    async def completions(body: CompletionBody):
        check_model(body.model)
        prompt = body.prompt if isinstance(body.prompt, list) else chat.encode(body.prompt)
        sp = params(body, body.max_tokens or 16, body.stop_token_ids or [])
        out = await run(prompt, sp)
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "policy_version": out.policy_version,
            "choices": [
                {
                    "index": 0,
                    "text": chat.decode(out.token_ids),
                    "token_ids": out.token_ids,
                    "logprobs": {"token_logprobs": out.logprobs, "tokens": [chat.decode([t]) for t in out.token_ids]},
                    "finish_reason": out.finish_reason,
                    "policy_version": out.policy_version,
                }
            ],
            "usage": _usage(len(prompt), len(out.token_ids)),
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody):
        check_model(body.model)
        try:
            messages = [Message.from_openai(_flatten_content(m)) for m in body.messages]
        except (KeyError, TypeError, ValueError) as exc:
            raise ApiError(400, f"invalid messages: {exc}") from exc
        prompt = chat.prompt_ids(messages, body.tools or None)
        sp = params(body, body.max_completion_tokens or body.max_tokens, chat.stop_ids)
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if body.stream:
            if len(prompt) >= engine.engine.max_positions:  # fail before the 200 of a stream
                raise ApiError(
                    400, f"the prompt has {len(prompt)} tokens; the context is {engine.engine.max_positions}"
                )
            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(_stream_chat(engine, chat, prompt, sp, rid, model_name, include_usage),
                                     media_type="text/event-stream")  # fmt: skip
        out = await run(prompt, sp)
        message, _ = chat.parse(out.token_ids, finish_reason=out.finish_reason)
        reply = _openai_message(message)
        if any(c.error for c in message.tool_calls):  # keep what could not be parsed, as text
            reply["content"] = chat.decode([t for t in out.token_ids if t not in chat.stop_ids])
        return {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "message": reply, "finish_reason": _finish(out, message)}],
            "usage": _usage(len(prompt), len(out.token_ids)),
        }

    return app


async def _stream_chat(engine, chat: ChatFormat, prompt, sp, rid: str, model: str, include_usage: bool):
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
    sent = ""  # content already sent; trailing whitespace waits (the parser strips it before a call)
    in_calls = False  # content stops at the first tool call; calls are sent whole once parsed
    stops = set(sp.stop_token_ids)
    async for item in engine.stream(prompt, sp):
        if isinstance(item, Completion):
            message, _ = chat.parse(item.token_ids, finish_reason=item.finish_reason)
            if message.content.startswith(sent) and len(message.content) > len(sent):
                yield chunk({"content": message.content[len(sent) :]})
            for i, call in enumerate(_openai_message(message).get("tool_calls") or ()):
                yield chunk({"tool_calls": [{"index": i, **call}]})
            yield chunk({}, _finish(item, message))
            if include_usage:
                yield chunk({}, usage=_usage(len(prompt), len(item.token_ids)))
            break
        token, _ = item
        if in_calls or token in stops:
            continue
        ids.append(token)
        text = chat.decode(ids)
        cut = text.find("<tool_call>")
        if cut >= 0:
            text, in_calls = text[:cut], True
        text = text.rstrip()
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the rest
            continue
        if len(text) > len(sent) and text.startswith(sent):
            yield chunk({"content": text[len(sent) :]})
            sent = text
    yield "data: [DONE]\n\n"


def _flatten_content(m: dict[str, Any]) -> dict[str, Any]:
    """OpenAI allows content as a list of parts; the chat format reads text."""
    content = m.get("content")
    if isinstance(content, list):
        m = {**m, "content": "".join(p.get("text", "") for p in content if isinstance(p, dict))}
    return m


def _openai_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.content or None}
    calls = [c.to_openai() for c in message.tool_calls if c.error is None]
    if calls:
        out["tool_calls"] = calls
    return out


def _finish(out: Completion, message: Message) -> str:
    if out.finish_reason == "length":
        return "length"
    return "tool_calls" if any(c.error is None for c in message.tool_calls) else "stop"


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})
