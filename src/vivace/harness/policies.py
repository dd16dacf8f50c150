"""Policies by spec string — one syntax for every command (`--model SPEC`).

    http://HOST:PORT/v1#MODEL     an OpenAI-compatible chat endpoint (tool calling through
                                  the `openai` client; the key comes from $OPENAI_API_KEY)
    scripted:null                 answers at once, calls no tool, changes nothing (a baseline)
    scripted:replay:FILE          replays a JSON list of assistant turns (tests, bug reports)
    scripted:oracle               the expert that applies a task's reference patch (bench, RL)
    scripted:random               one random operator edit (a floor for the benchmark)
    scripted:random-edit          one random mutation inside the function the failing test names

A replay file is a JSON list; each item is one assistant turn, either a message
`{"content": "...", "tool_calls": [{"name": "read_file", "arguments": {"path": "a.py"}}]}`
(arguments may also be a JSON string, as OpenAI sends them) or raw generated text
`{"text": "I'll look.\\n<tool_call>\\n{...}\\n</tool_call>"}`, parsed exactly as a model's
output would be (so malformed output can be replayed). When the list is exhausted the
policy answers with an empty final message.

    tiny | PATH                   a model run by vivace's own engine in this process: the tiny
                                  preset, or a local Hugging Face checkpoint directory
    tokens:http://HOST:PORT/v1#MODEL  token-in/token-out over HTTP (vLLM, SGLang, `vivace serve`)

Spec parsing is lazy: nothing heavy is imported until a policy of that kind is made.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vivace.harness.messages import AssistantTurn, Message, decode_call
from vivace.harness.policy import Conversation, Policy, PolicyError

if TYPE_CHECKING:
    from vivace.config import EngineConfig

SPEC_FORMS = ("http(s)://HOST:PORT/v1#MODEL", "scripted:null", "scripted:replay:FILE", "scripted:oracle",
              "scripted:random", "scripted:random-edit", "tiny", "tiny-init", "PATH (a checkpoint directory)", "tokens:http://HOST:PORT/v1#MODEL")  # fmt: skip
# Policies defined above the harness (they need a task), imported only when named.
_LAZY = {
    "scripted:oracle": "vivace.bench.baselines:OraclePolicy",
    "scripted:random": "vivace.bench.baselines:RandomPolicy",
    "scripted:random-edit": "vivace.bench.baselines:RandomEditPolicy",
}


def deterministic(spec: str) -> bool:
    """Whether a spec's policy acts the same in every episode of a task: the scripted ones do (the
    random ones seed from the task id), so more than one episode of a task repeats the first."""
    return spec == "scripted:null" or spec.startswith("scripted:replay:") or spec in _LAZY


def load_policy(spec: str, engine: EngineConfig | None = None) -> Policy:
    """The policy a spec names; an unknown spec raises ValueError listing the valid forms.
    `engine` sets how a token-level model is run and sampled (temperature...)."""
    if spec.startswith(("http://", "https://")):
        base_url, _, model = spec.partition("#")
        return OpenAIPolicy(base_url, model or None, name=spec)
    if spec == "scripted:null":
        return NullPolicy()
    if spec.startswith("scripted:replay:"):
        return ReplayPolicy.from_file(spec.removeprefix("scripted:replay:"))
    if spec in _LAZY:
        module, _, attr = _LAZY[spec].partition(":")
        return getattr(importlib.import_module(module), attr)()
    if (
        spec in ("tiny", "tiny-init")
        or spec.startswith("tokens:")
        or (Path(spec).expanduser() / "config.json").is_file()
    ):
        return importlib.import_module("vivace.inference.samplers").token_policy(spec, engine)
    raise ValueError(f"unknown policy spec {spec!r}; valid forms: {', '.join(SPEC_FORMS)}")


class NullPolicy:
    """Does nothing: the floor every benchmark number is compared with."""

    name = "scripted:null"

    async def act(self, conversation: Conversation) -> AssistantTurn:
        return AssistantTurn(Message("assistant", "I made no changes."))


class ReplayPolicy:
    """Replays scripted assistant turns (see the module docstring for the file format)."""

    def __init__(self, turns: list[dict[str, Any]], name: str = "scripted:replay"):
        if problem := _replay_problem(turns):
            raise ValueError(f"replay script: {problem}")
        self.turns, self.name = turns, name

    @classmethod
    def from_file(cls, path: str) -> ReplayPolicy:
        try:
            data = json.loads(Path(path).read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise ValueError(
                f"{path}: the replay file does not exist; check the path in scripted:replay:FILE"
            ) from None
        except OSError as e:
            raise ValueError(f"{path}: cannot read the replay file ({e.strerror}); give a JSON file") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: the replay file is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: the replay file is not valid JSON ({e.msg} at line {e.lineno} column "
                             f"{e.colno}); fix its syntax") from None  # fmt: skip
        if problem := _replay_problem(data):
            raise ValueError(f"{path}: {problem}")
        return cls(data, name=f"scripted:replay:{path}")

    async def act(self, conversation: Conversation) -> AssistantTurn:
        # The turn to replay is the number of assistant messages so far (one policy, many episodes).
        n = sum(m.role == "assistant" for m in conversation.messages)
        if n >= len(self.turns):
            return AssistantTurn(Message("assistant", ""))
        item = self.turns[n]
        if "text" in item:
            from vivace.harness.chat import parse_text

            message, _ = parse_text(item["text"], finish_reason=item.get("finish_reason", "stop"))
            return AssistantTurn(message, finish_reason=item.get("finish_reason", "stop"))
        calls = tuple(
            decode_call(c.get("id") or f"call_{i}", c["name"], c.get("arguments", {}))
            for i, c in enumerate(item.get("tool_calls") or ())
        )
        return AssistantTurn(Message("assistant", str(item.get("content") or ""), calls))


def _replay_problem(turns: Any) -> str | None:
    """What is wrong with a replay script, as `turn N: ...` (N from 1), or None. Only the shape is
    checked: a call's arguments are replayed as given, so malformed ones still reach the agent."""
    if not isinstance(turns, list):
        return f"expected a JSON list of assistant turns, not {type(turns).__name__}"
    for n, item in enumerate(turns, 1):
        if not isinstance(item, dict) or not ({"content", "tool_calls", "text"} & item.keys()):
            return f"turn {n}: expected an object with 'content'/'tool_calls' or 'text'"
        if "text" in item and not isinstance(item["text"], str):
            return f"turn {n}: 'text' must be a string (the raw generated output)"
        if not isinstance(item.get("content"), str | None):
            return f"turn {n}: 'content' must be a string"
        calls = item.get("tool_calls")
        if not isinstance(calls, list | None):
            return f"turn {n}: 'tool_calls' must be a list of calls, not {type(calls).__name__}"
        for i, call in enumerate(calls or (), 1):
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
                return (
                    f"turn {n}: tool call {i} must be an object with a tool 'name' (and 'arguments'), got {call!r:.60}"
                )
    return None


class OpenAIPolicy:
    """A chat-completions endpoint with tool calling (vLLM, SGLang, `vivace serve`, hosted APIs)."""

    def __init__(self, base_url: str, model: str | None, name: str, timeout_s: float = 600.0):
        import openai  # lazy: only this policy needs the client

        self.name, self.model = name, model
        key = os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers accept any key
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=2)
        self._openai = openai

    async def _model_name(self) -> str:
        if self.model is None:
            try:
                models = [m.id async for m in self.client.models.list()]
            except self._openai.OpenAIError as e:
                raise PolicyError(f"{self.name}: could not list models: {e}") from None
            if len(models) != 1:
                raise PolicyError(f"{self.name}: name the model as URL#MODEL; the server has: {', '.join(models)}")
            self.model = models[0]
        return self.model

    async def act(self, conversation: Conversation) -> AssistantTurn:
        model = await self._model_name()
        try:
            response = await self.client.chat.completions.create(
                model=model,
                messages=[_for_api(m) for m in conversation.messages],  # type: ignore[misc]
                tools=conversation.tools,  # type: ignore[arg-type]
                max_tokens=conversation.max_turn_tokens,
            )
        except self._openai.OpenAIError as e:
            raise PolicyError(f"{self.name}: the endpoint failed: {type(e).__name__}: {e}") from None
        if not response.choices:
            raise PolicyError(f"{self.name}: the endpoint returned no choices")
        choice = response.choices[0]
        calls = tuple(
            decode_call(c.id or f"call_{i}", c.function.name, c.function.arguments)
            for i, c in enumerate(choice.message.tool_calls or ())
            if getattr(c, "function", None) is not None
        )
        usage = response.usage
        return AssistantTurn(
            Message("assistant", choice.message.content or "", calls),
            finish_reason=choice.finish_reason or "stop",
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
        )


def _for_api(message: Message) -> dict[str, Any]:
    out = message.to_openai()
    if message.role == "tool":
        out.pop("name", None)  # not part of the chat-completions tool message; strict servers refuse it
    return out
