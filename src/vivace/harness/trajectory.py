"""The record of one episode: what the policy said, what each tool did and how long it took,
the tokens (when the policy is token-level), the final answer, the diff and why it stopped.

A Trajectory is what the scorer judges, what RL trains on and what the dashboard shows. It
round-trips through JSON (`model_dump_json` / `Trajectory.load`) and exports to OpenAI-style
chat messages (`to_messages`) for viewing or supervised fine-tuning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from pydantic_core import PydanticSerializationError

from vivace.harness.messages import Message, ToolCall

StopReason = Literal["done", "max_turns", "max_tokens", "timeout", "error"]


class ToolRecord(BaseModel):
    """One tool call of a turn and its result."""

    id: str
    name: str
    arguments: Any  # as the model gave them (a dict when well formed)
    result: str  # the text the model saw
    is_error: bool = False
    format_error: bool = False  # malformed call: unparseable, unknown tool or invalid arguments
    started_s: float = 0.0  # seconds after the turn's tools started
    duration_s: float = 0.0  # seconds the tool ran
    meta: dict[str, Any] = Field(default_factory=dict)


class Turn(BaseModel):
    """One assistant turn and the tool calls it made."""

    content: str  # the assistant's text outside tool calls
    tool_calls: list[ToolRecord] = Field(default_factory=list)
    finish_reason: str = "stop"
    model_s: float = 0.0  # seconds the policy took to produce the turn
    tools_s: float = 0.0  # seconds from the first tool start to the last tool end (parallel calls overlap)
    prompt_tokens: int = 0  # tokens the policy read for this turn (0 when the policy does not say)
    completion_tokens: int = 0  # tokens it generated
    policy_version: int | None = None
    reasoning: str | None = None  # the reasoning an endpoint sent beside the reply (reasoning_content)


class Tokens(BaseModel):
    """The whole token sequence of a token-level episode; one entry per token in each list."""

    ids: list[int]
    loss_mask: list[int]  # 1 on sampled tokens (trained on), 0 on prompt and tool-result tokens
    logprobs: list[float]  # sampler log-probabilities (0.0 where loss_mask is 0)
    versions: list[int]  # policy version per sampled token (-1 where loss_mask is 0)


class Trajectory(BaseModel):
    task_id: str | None = None
    request: str
    policy: str  # the policy spec
    system_prompt: str
    system_prompt_version: str
    turns: list[Turn] = Field(default_factory=list)
    final_message: str = ""  # the last assistant text (the answer shown to the user)
    diff: str = ""  # unified diff of the workspace against its base at the end
    stop_reason: StopReason
    error: str | None = None  # what went wrong when stop_reason is "error" (or the diff failed)
    diff_failed: bool = False  # the diff could not be computed: an empty `diff` then is no "no changes"
    unavailable: bool = False  # stopped by an "error" that was the policy's server failing (PolicyUnavailable)
    wall_s: float = 0.0
    tokens: Tokens | None = None  # token-level policies only

    @property
    def tool_calls(self) -> int:
        return sum(len(t.tool_calls) for t in self.turns)

    @property
    def format_errors(self) -> int:
        return sum(c.format_error for t in self.turns for c in t.tool_calls)

    @property
    def completion_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)

    def to_messages(self) -> list[dict[str, Any]]:
        """The episode as OpenAI-style chat messages (system, user, then assistant/tool turns)."""
        out = [Message("system", self.system_prompt).to_openai(), Message("user", self.request).to_openai()]
        for turn in self.turns:
            calls = tuple(ToolCall(c.id, c.name, c.arguments) for c in turn.tool_calls)
            out.append(Message("assistant", turn.content, calls).to_openai())
            for c in turn.tool_calls:
                out.append(Message("tool", c.result, tool_call_id=c.id, name=c.name).to_openai())
        return out

    def save(self, path: str | Path) -> None:
        try:
            text = self.model_dump_json(indent=1)
        except PydanticSerializationError:  # a lone surrogate (a file name's stray byte): written as its escape
            text = json.dumps(self.model_dump(mode="json"), indent=1)
        Path(path).write_text(text)

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        text = Path(path).read_text()
        try:
            return cls.model_validate_json(text)
        except ValidationError as e:  # pydantic's parser refuses a lone surrogate's escape, which json reads
            try:
                data = json.loads(text)
            except ValueError:
                raise e from None
            return cls.model_validate(data)
