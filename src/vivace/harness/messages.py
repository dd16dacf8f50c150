"""The conversation's data: messages and tool calls, as the harness, chat format and policies
exchange them.

These mirror OpenAI-style chat messages (the form `Trajectory.to_messages()` exports and the
form Hugging Face chat templates render), with one addition: a tool call that could not be
understood keeps its raw text and says why in `error`, so a model's broken output travels
through the loop as data and comes back to the model as an error result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    id: str  # the call id echoed with its result
    name: str  # "" when the model's block could not be parsed
    arguments: Any  # decoded JSON arguments (a dict when well formed); the raw text when not JSON
    error: str | None = None  # why the call is malformed (set by the parser); None when well formed

    def to_openai(self) -> dict[str, Any]:
        args = self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments, ensure_ascii=False)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}


@dataclass(frozen=True)
class Message:
    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()  # assistant messages only
    tool_call_id: str | None = None  # tool messages only: the call this result answers
    name: str | None = None  # tool messages only: the tool's name

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat-completions form (also what Hugging Face chat templates take)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
            out["name"] = self.name
        return out

    @staticmethod
    def from_openai(d: dict[str, Any]) -> Message:
        calls = []
        for i, c in enumerate(d.get("tool_calls") or ()):
            fn = c.get("function", c)
            calls.append(decode_call(c.get("id") or f"call_{i}", fn.get("name", ""), fn.get("arguments", {})))
        return Message(
            role=d["role"],
            content=d.get("content") or "",
            tool_calls=tuple(calls),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
        )


def decode_call(call_id: str, name: Any, arguments: Any) -> ToolCall:
    """A ToolCall from a name and arguments that may be a JSON string (OpenAI) or an object."""
    if not isinstance(name, str) or not name:
        return ToolCall(call_id, "", arguments, "the tool call has no tool name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(call_id, name, arguments, f"the arguments are not valid JSON ({e})")
    if not isinstance(arguments, dict):
        return ToolCall(
            call_id, name, arguments, f"the arguments must be a JSON object, got {type(arguments).__name__}"
        )
    return ToolCall(call_id, name, arguments)


@dataclass
class AssistantTurn:
    """One generation by a policy: the parsed message plus, for token-level policies, exactly
    the tokens that were sampled (never re-tokenized)."""

    message: Message
    finish_reason: str = "stop"  # "stop" (end of turn), "length" (token cap), or the backend's word
    prompt_tokens: int = 0  # tokens the policy read for this turn (0 if unknown)
    completion_tokens: int = 0  # tokens it generated
    token_ids: list[int] | None = None  # sampled ids (incl. the end-of-turn token) when known
    logprobs: list[float] | None = None  # per sampled token, the sampler's log-probability
    policy_version: int | None = None  # weights version that sampled this turn
    meta: dict[str, Any] = field(default_factory=dict)
