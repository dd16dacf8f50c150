"""Parity of the chat API with token-in/token-out: a conversation that goes through `vivace serve`'s
/v1/chat/completions and OpenAIPolicy (the reply parsed into content and tool_calls, sent back as
messages, rendered again by the server) must reach the model as the same tokens a token-level
rollout holds (the prompt, the sampled ids, then `continuation_ids`). Otherwise the product shows
the model a context training never did.

What the API cannot carry is not tested here (see the limits in the report of this check): a
malformed call's raw text, a non-canonical tokenization of the same text, text spelled with no
newline before a <tool_call> block."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
from fastapi.testclient import TestClient

from vivace.harness.chat import ChatFormat
from vivace.harness.messages import Message
from vivace.harness.policies import OpenAIPolicy
from vivace.harness.policy import Completion, Conversation
from vivace.inference.server import create_app
from vivace.model.tokenizer import reference_tokenizer

CHAT = ChatFormat(reference_tokenizer())
END = CHAT.stop_ids[:1]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}},
    }
]
# Arguments as a model may spell them: no spaces, keys out of order, non-ASCII, a repeated key.
ODD_ARGUMENTS = '{"b":1,  "a": "é", "a":"x"}'
CALL_TURN = f'Looking.\n<tool_call>\n{{"name": "f", "arguments": {ODD_ARGUMENTS}}}\n</tool_call>'


class TurnEngine:
    """Answers the i-th request with `turns[i]` (ids), recording every prompt."""

    version = 0

    class engine:  # noqa: N801 - mirrors AsyncEngine.engine
        max_positions = 8192

        @staticmethod
        def request(prompt, params, top_logprobs=0):  # Engine.request's checks: every request passes here
            return None

    def __init__(self, turns: list[list[int]]) -> None:
        self.turns, self.prompts = turns, []

    def metrics(self) -> dict:
        return {}

    async def generate(self, prompt, sp, top_logprobs: int = 0) -> Completion:
        ids = self.turns[len(self.prompts)]
        self.prompts.append(list(prompt))
        return Completion(list(ids), [-0.5] * len(ids), "stop", 0)


def sampled(text: str) -> list[int]:
    return CHAT._encode_marked(text) + END


def test_a_round_tripped_call_renders_the_tokens_the_model_sampled():
    turn_ids = [sampled(CALL_TURN), sampled("Done.")]
    engine = TurnEngine(turn_ids)
    app = create_app(engine, CHAT, "m")
    policy = OpenAIPolicy("http://testserver/v1", "m", name="api")
    transport = httpx.ASGITransport(app=app)
    policy.client = openai.AsyncOpenAI(
        base_url="http://testserver/v1", api_key="x", http_client=httpx.AsyncClient(transport=transport)
    )
    conv = Conversation([Message("system", "Be brief."), Message("user", "Call f.")], TOOLS, max_turn_tokens=64)

    async def episode() -> None:
        first = await policy.act(conv)
        assert [c.name for c in first.message.tool_calls] == ["f"]
        assert first.message.tool_calls[0].arguments == {"b": 1, "a": "x"}
        conv.messages.append(Message("assistant", first.message.content, first.message.tool_calls))
        conv.messages.append(Message("tool", "ok", tool_call_id=first.message.tool_calls[0].id, name="f"))
        await policy.act(conv)
        await policy.aclose()

    asyncio.run(episode())
    # What a token-level rollout holds before the second turn: the prompt, the sampled ids, the rest.
    want = engine.prompts[0] + turn_ids[0] + CHAT.continuation_ids(conv.messages, TOOLS, 3)
    assert CHAT.decode(engine.prompts[1]) == CHAT.decode(want)
    assert engine.prompts[1] == want


def test_reply_arguments_are_the_models_spelling():
    engine = TurnEngine([sampled(CALL_TURN)])
    client = TestClient(create_app(engine, CHAT, "m"))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    (call,) = r.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == ODD_ARGUMENTS  # still a JSON string, as OpenAI's
    assert json.loads(call["function"]["arguments"]) == {"b": 1, "a": "x"}


def test_a_past_calls_arguments_string_is_rendered_as_sent():
    engine = TurnEngine([sampled("ok")])
    client = TestClient(create_app(engine, CHAT, "m"))
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": ODD_ARGUMENTS}}
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "done"},
    ]
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS})
    assert r.status_code == 200, r.text
    assert f'"arguments": {ODD_ARGUMENTS}}}' in CHAT.decode(engine.prompts[0])


MIXED_TURN = (
    'Reading two files.\n<tool_call>\n{"name": "f", "arguments": {"a": "x"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "f", "arguments": {"a": "y"\n</tool_call>'
)


def test_a_reply_with_a_good_and_a_malformed_call_gives_the_same_calls_served_and_in_process():
    """The server returned the good call in tool_calls and all the text as content: OpenAIPolicy took the
    calls and dropped the malformed one (no error result, no format error), and the next prompt showed
    the good call twice. Now the reply is the text, which the policy parses as a token-level rollout does."""
    turn_ids = [sampled(MIXED_TURN), sampled("Done.")]
    engine = TurnEngine(turn_ids)
    policy = OpenAIPolicy("http://testserver/v1", "m", name="api")
    transport = httpx.ASGITransport(app=create_app(engine, CHAT, "m"))
    policy.client = openai.AsyncOpenAI(
        base_url="http://testserver/v1", api_key="x", http_client=httpx.AsyncClient(transport=transport)
    )
    conv = Conversation([Message("user", "Read a and b.")], TOOLS, max_turn_tokens=64)
    in_process, errors = CHAT.parse(turn_ids[0])

    async def episode():
        first = await policy.act(conv)
        conv.messages.append(Message("assistant", first.message.content, first.message.tool_calls))
        for c in first.message.tool_calls:
            conv.messages.append(Message("tool", c.error or "ok", tool_call_id=c.id, name=c.name))
        await policy.act(conv)
        await policy.aclose()
        return first

    first = asyncio.run(episode())
    assert errors == 1 and first.message == in_process  # content, ids, names, arguments and errors
    good, bad = first.message.tool_calls
    assert good.error is None and "not valid JSON" in bad.error
    second = CHAT.decode(engine.prompts[1])
    assert second.count('"arguments": {"a": "x"}') == 1  # the good call is shown once
