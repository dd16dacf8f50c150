"""The conversation's data: messages and tool calls, as the harness, chat format and policies
exchange them.

These mirror OpenAI-style chat messages (the form `Trajectory.to_messages()` exports and the
form Hugging Face chat templates render), with one addition: a tool call that could not be
understood keeps its raw text and says why in `error`, so a model's broken output travels
through the loop as data and comes back to the model as an error result.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]
ROLES = ("system", "user", "assistant", "tool")
# A call's arguments nested deeper than this are a malformed call: no tool takes such arguments, and
# the chat template (and `vivace serve`, which refuses messages nested over 64 deep) recurses over them.
MAX_ARGUMENT_NESTING = 32


@dataclass(frozen=True)
class ToolCall:
    id: str  # the call id echoed with its result
    name: str  # "" when the model's block could not be parsed
    arguments: Any  # decoded JSON arguments (a dict when well formed); the raw text when not JSON
    error: str | None = None  # why the call is malformed (set by the parser); None when well formed

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI form; the arguments string is spelled as the model wrote it (SpelledArguments)."""
        args = self.arguments
        if isinstance(args, SpelledArguments):
            args = args.json_text
        elif not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}


class SpelledArguments(dict):
    """A call's JSON-object arguments that remember the text they were decoded from (`json_text`: key
    order, spacing, escapes, repeated keys). Over the chat API a past call comes back as that text,
    and the chat format renders it verbatim, not re-dumped: the model reads the call as it wrote it,
    as a token-level rollout holds it (training samples the exact tokens)."""

    def __init__(self, arguments: dict[str, Any], json_text: str):
        super().__init__(arguments)
        self.json_text = json_text


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
            # Given, not sampled: a lone surrogate stays in the decoded arguments for the reader to judge (the
            # server refuses it, as it does in any other field).
            calls.append(decode_call(c.get("id") or f"call_{i}", fn.get("name", ""), fn.get("arguments", {}),
                                     lone_surrogates_ok=True))  # fmt: skip
        return Message(
            role=d["role"],
            content=d.get("content") or "",
            tool_calls=tuple(calls),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
        )


def messages_from_openai(raw: Any, where: str = "messages") -> list[Message]:
    """Messages in the OpenAI form from an untrusted source (an API client, a data file), checked:
    a malformed one is a ValueError naming it (`where[i]…`), not an error deep in a template."""
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a list of message objects")
    out = []
    for i, m in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(m, dict):
            raise ValueError(f"{at} must be an object")
        role = "system" if m.get("role") == "developer" else m.get("role")  # OpenAI's newer name for system
        if role not in ROLES:
            raise ValueError(f"{at}.role must be one of system, developer, user, assistant, tool; got {role!r}")
        calls = m.get("tool_calls") or []
        if calls and role != "assistant":
            raise ValueError(f"{at}: only assistant messages carry tool_calls")
        if not isinstance(calls, list):
            raise ValueError(f"{at}.tool_calls must be a list")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError(f"{at}.tool_calls[{j}] must be {{'function': {{'name': ..., 'arguments': ...}}}}")
            if not isinstance(fn.get("arguments", "{}"), str | dict):
                raise ValueError(f"{at}.tool_calls[{j}].function.arguments must be a JSON string")
        for key in ("tool_call_id", "name"):
            if not isinstance(m.get(key), str | None):
                raise ValueError(f"{at}.{key} must be a string")
        out.append(Message.from_openai({**m, "role": role, "content": _text(m.get("content"), at, role)}))
    return out


def _text(content: Any, where: str, role: str = "user") -> str:
    """A message's content as text: a string, null, or OpenAI's list of text parts (and, in an
    assistant's message, refusal parts: what the model said when it declined)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ValueError(f"{where}.content must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type", "text") if isinstance(part, dict) else type(part).__name__
        key = "refusal" if kind == "refusal" and role == "assistant" else "text"
        if not isinstance(part, dict) or kind != key or not isinstance(part.get(key), str):
            raise ValueError(
                f"{where}.content[{j}]: this model reads text parts only ({{'type': 'text', 'text': ...}}), got {kind!r}",
            )
        texts.append(part[key])
    return "".join(texts)


def decode_call(call_id: str, name: Any, arguments: Any, lone_surrogates_ok: bool = False) -> ToolCall:
    """A ToolCall from a name and arguments that may be a JSON string (OpenAI) or an object. Whatever
    cannot be taken as arguments is a malformed call (its `error` says why), never an exception:
    text that is not JSON, JSON nested deeper than the decoder recurses (RecursionError), and
    arguments nested over MAX_ARGUMENT_NESTING deep, which rendering them again would recurse over; and
    what a trajectory cannot record as it is: NaN or infinity, and a lone surrogate (unless
    `lone_surrogates_ok`, for a caller that deals with them)."""
    if not isinstance(name, str) or not name:
        return ToolCall(call_id, "", arguments, "the tool call has no tool name")
    text = arguments if isinstance(arguments, str) else None
    if not _recordable(name):
        return ToolCall(call_id, recordable(name), recordable(text if text is not None else json.dumps(arguments)),
                        f"the tool name holds {_LONE_SURROGATE}")  # fmt: skip
    if text is not None:
        try:
            arguments = json.loads(text, parse_constant=_not_json, parse_float=_finite) if text.strip() else {}
        except ValueError as e:  # JSONDecodeError, and a lone surrogate's UnicodeError
            return ToolCall(call_id, name, recordable(text), f"the arguments are not valid JSON ({e})")
        except RecursionError:
            return ToolCall(call_id, name, recordable(text), _too_deep())
    # Depth first, whatever the type: a list nested past the cap kept decoded would be rendered again,
    # recursing over it (from Python 3.12 json decodes 5,000 deep; 3.11 stops near 1,000).
    if nesting(arguments) > MAX_ARGUMENT_NESTING:
        return ToolCall(call_id, name, arguments if text is None else recordable(text), _too_deep())
    # What the record could not hold as it is: a lone surrogate made saving the trajectory fail (and with
    # it a whole benchmark run), and NaN or infinity was saved as null, so training read other arguments.
    if why := _unrecordable(arguments, lone_surrogates_ok):
        return ToolCall(call_id, name, recordable(text if text is not None else json.dumps(arguments)),
                        f"the arguments hold {why}")  # fmt: skip
    if not isinstance(arguments, dict):
        return ToolCall(
            call_id, name, arguments, f"the arguments must be a JSON object, got {type(arguments).__name__}"
        )
    if text is not None and text[:1] == "{" and text[-1:] == "}":  # the object as written: keep its spelling
        return ToolCall(call_id, name, SpelledArguments(arguments, text))
    return ToolCall(call_id, name, arguments)


def recordable(text: str) -> str:
    """`text` with any lone surrogate written as its escape (\\udXXX): what a trajectory can save."""
    return text if _recordable(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def _recordable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_LONE_SURROGATE = "a lone surrogate (a \\ud800-\\udfff escape), which is no character"


def _unrecordable(value: Any, lone_surrogates_ok: bool = False) -> str | None:
    """What in a decoded JSON value a trajectory cannot save as it is; None when nothing. Iterative.
    `lone_surrogates_ok`: the caller deals with them (an endpoint's reply, read as U+FFFD; messages a client
    gave, which the server refuses)."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str) and not lone_surrogates_ok and not _recordable(item):
            return _LONE_SURROGATE
        if isinstance(item, float) and not math.isfinite(item):
            return f"{item}, which is not a JSON number"
        if isinstance(item, dict):
            todo += [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):
            todo += item
    return None


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


def _finite(number: str) -> float:
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number[:40]} is too large for a number")
    return value


def nesting(value: Any) -> int:
    """How deep arrays and objects nest in a decoded JSON value ({} is 1, {"a": []} is 2). Iterative:
    any depth."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list | tuple):
            deepest = max(deepest, depth)
            todo += [(child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)]
    return deepest


def _too_deep() -> str:
    return (
        f"the arguments are nested too deep (arrays and objects at most {MAX_ARGUMENT_NESTING} deep); "
        "give the arguments as a flat JSON object"
    )


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
