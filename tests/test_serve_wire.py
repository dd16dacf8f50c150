"""`vivace serve`'s OpenAI wire format against a scripted engine: every reply is known in advance,
so streamed and whole replies can be compared exactly, and bad requests are checked to be 4xx
errors with a message (never a 500, never a silently ignored field). The real model behind the
same server is tested in test_serve.py."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from vivace.harness.chat import ChatFormat
from vivace.harness.policy import Completion
from vivace.inference.server import create_app
from vivace.model.tokenizer import reference_tokenizer
from vivace.sandbox.background import BackgroundServer

CHAT = ChatFormat(reference_tokenizer())
END = CHAT.stop_ids[:1]
USER = [{"role": "user", "content": "x"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


class ScriptedEngine:
    """Answers every request with `ids`; `hold` makes a request wait until it is cancelled."""

    version = 0

    class engine:  # noqa: N801 - mirrors AsyncEngine.engine
        max_positions = 8192

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.prompts: list[list[int]] = []
        self.params: list = []
        self.hold = False
        self.cancelled = 0

    def metrics(self) -> dict:
        return {}

    def _completion(self, ids: list[int]) -> Completion:
        finish = "stop" if ids and ids[-1] in CHAT.stop_ids else "length"
        return Completion(list(ids), [-0.5] * len(ids), finish, 0)

    async def generate(self, prompt, sp) -> Completion:
        self.prompts.append(prompt)
        self.params.append(sp)
        if self.hold:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return self._completion(self.ids)

    async def stream(self, prompt, sp):
        self.prompts.append(prompt)
        done = 0
        try:
            for t in self.ids:
                done += 1
                yield (t, -0.5)
            yield self._completion(self.ids)
        finally:
            if done < len(self.ids):
                self.cancelled += 1


@pytest.fixture
def served():
    engine = ScriptedEngine()
    return engine, TestClient(create_app(engine, CHAT, "m"))


def says(engine: ScriptedEngine, text: str, end: bool = True) -> None:
    engine.ids = CHAT._encode_marked(text) + (END if end else [])


def whole(client, **body) -> dict:
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def streamed(client, **body) -> tuple[str, list[dict], str]:
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True, **body})
    assert r.status_code == 200, r.text
    lines = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    content, calls, finish = "", [], None
    for line in lines[:-1]:
        for choice in json.loads(line[6:])["choices"]:
            content += choice["delta"].get("content") or ""
            calls += choice["delta"].get("tool_calls") or []
            finish = choice["finish_reason"] or finish
    return content, [{k: v for k, v in c.items() if k != "index"} for c in calls], finish


OUTPUTS = [
    "\n\n  Hello world",  # leading whitespace
    "Hello   \n",  # trailing whitespace
    'Hi\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\nafter text',
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
    'Hi <tool_call>\n{"name": "f", "arguments": oops}\n</tool_call>',  # malformed: kept as text
    'Hi <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>\nbroken\n</tool_call>',
    "héllo 🙂 世界",
]


@pytest.mark.parametrize("text", OUTPUTS)
def test_streamed_reply_equals_whole_reply(served, text):
    engine, client = served
    says(engine, text)
    one = whole(client, tools=TOOLS)
    content, calls, finish = streamed(client, tools=TOOLS)
    assert content == (one["message"]["content"] or "")
    assert calls == one["message"].get("tool_calls", [])
    assert finish == one["finish_reason"]
    assert content == content.strip()


def test_malformed_call_keeps_its_text(served):
    engine, client = served
    says(engine, 'Hi <tool_call>\n{"name": "f", "arguments": oops}\n</tool_call>')
    reply = whole(client, tools=TOOLS)
    assert "oops" in reply["message"]["content"] and "tool_calls" not in reply["message"]
    assert reply["finish_reason"] == "stop"


def test_stop_strings_end_the_reply_before_them(served):
    engine, client = served
    says(engine, "one two three four five six")
    reply = whole(client, stop=["four", "zzz"])
    assert reply["message"]["content"] == "one two three" and reply["finish_reason"] == "stop"
    assert engine.cancelled == 1  # the engine was told to stop, not left generating
    content, _, finish = streamed(client, stop="thr")
    assert content == "one two" and finish == "stop"
    # a stop string split over tokens is held back while it may still complete, then dropped
    content, _, _ = streamed(client, stop="five six")
    assert content == "one two three four"
    r = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "stop": ["three"]}).json()
    assert r["choices"][0]["text"] == "one two " and r["choices"][0]["finish_reason"] == "stop"
    says(engine, 'ok <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> DONE')
    reply = whole(client, tools=TOOLS, stop=["DONE"])
    assert [c["function"]["name"] for c in reply["message"]["tool_calls"]] == ["f"]


def test_tool_choice_none_leaves_tools_out(served):
    engine, client = served
    says(engine, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    with_tools = whole(client, tools=TOOLS)
    assert with_tools["finish_reason"] == "tool_calls"
    n_with = len(engine.prompts[-1])
    reply = whole(client, tools=TOOLS, tool_choice="none")
    assert len(engine.prompts[-1]) < n_with  # the schemas were not rendered
    assert "tool_calls" not in reply["message"] and reply["finish_reason"] == "stop"
    assert whole(client, tools=TOOLS, tool_choice="auto")["finish_reason"] == "tool_calls"


def test_parallel_tool_calls_false_returns_one_call(served):
    engine, client = served
    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    says(engine, call + call)
    assert len(whole(client, tools=TOOLS)["message"]["tool_calls"]) == 2
    assert len(whole(client, tools=TOOLS, parallel_tool_calls=False)["message"]["tool_calls"]) == 1


def test_chat_logprobs(served):
    engine, client = served
    says(engine, "Hello world")
    reply = whole(client, logprobs=True)
    tokens = reply["logprobs"]["content"]
    assert "".join(t["token"] for t in tokens) == "Hello world"  # the end-of-turn token is not content
    assert all(t["logprob"] == -0.5 and bytes(t["bytes"]).decode() == t["token"] for t in tokens)
    assert "logprobs" not in whole(client)


def test_developer_role_is_the_system_turn(served):
    engine, client = served
    says(engine, "ok")
    for role in ("system", "developer"):
        whole(client, messages=[{"role": role, "content": "Be brief."}, *USER])
    assert engine.prompts[-1] == engine.prompts[-2]


def test_text_parts_are_joined(served):
    engine, client = served
    says(engine, "ok")
    whole(client, messages=[{"role": "user", "content": "ab"}])
    whole(
        client, messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    )
    assert engine.prompts[-1] == engine.prompts[-2]


BAD = [
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"messages": [{"role": 5, "content": "x"}]}, "role"),
    ({"messages": [{"role": None, "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": 123}]}, "content"),
    ({"messages": [{"role": "user", "content": {"a": 1}}]}, "content"),
    ({"messages": [{"role": "user", "content": ["hi"]}]}, "text parts"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "image_url"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": ["x"]}, *USER]}, "tool_calls[0]"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": "f"}]}]},
     "tool_calls[0]"),
    ({"messages": [{"role": "assistant", "tool_calls": {"a": 1}}]}, "tool_calls must be a list"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]}, "assistant"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]}, "tool_call_id"),
    ({"messages": USER, "tools": [{"type": "function", "function": "f"}]}, "tools[0]"),
    ({"messages": USER, "tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
    ({"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tool_choice"),
    ({"messages": USER, "top_logprobs": 3, "logprobs": True}, "top_logprobs"),
    ({"messages": USER, "logprobs": True, "stream": True}, "stream"),
    ({"messages": USER, "max_tokens": "5"}, "max_tokens"),
    ({"messages": USER, "stream": "no"}, "stream"),
    ({"messages": USER, "temperature": True}, "temperature"),
    ({"messages": USER, "temperature": 2.5}, "temperature"),
    ({"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": USER, "stop": [""]}, "stop"),
    ({"messages": USER, "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"messages": USER, "logit_bias": {"5": 10}}, "logit_bias"),
    ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "words"), BAD)
def test_bad_chat_requests_are_400_with_a_reason(served, body, words):
    engine, client = served
    says(engine, "ok")
    r = client.post("/v1/chat/completions", json={"model": "m", **body})
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "words"),
    [({"stream": True}, "stream"), ({"echo": True}, "echo"), ({"best_of": 2}, "best_of"), ({"suffix": "x"}, "suffix")],
)
def test_unsupported_completion_options_are_refused(served, body, words):
    _, client = served
    r = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], **body})
    assert r.status_code == 400 and words in r.json()["error"]["message"]


def test_errors_have_the_openai_shape(served):
    _, client = served
    for r, status in ((client.get("/v1/nothing"), 404), (client.get("/v1/chat/completions"), 405)):
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "code"}


def test_tiny_temperature_is_greedy(served):
    """1/T overflows float32 for T near 1e-38: such temperatures sample greedily instead of from NaNs."""
    engine, client = served
    says(engine, "ok")
    for t, sent in ((1e-300, 0.0), (0.5, 0.5)):
        r = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "temperature": t})
        assert r.status_code == 200 and engine.params[-1].temperature == sent


def test_a_client_that_leaves_cancels_its_request():
    engine = ScriptedEngine()
    engine.hold = True
    server = BackgroundServer(create_app(engine, CHAT, "m"))
    server.start()
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{server.url}/v1/chat/completions", json={"model": "m", "messages": USER}, timeout=0.5)
        deadline = time.monotonic() + 5
        while engine.cancelled == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.cancelled == 1
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("option", "words"),
    [(["--dtype", "foo"], "--dtype"), (["--max-batch", "0"], "--max-batch"), (["--device", "nonsense"], "device")],
)
def test_serve_refuses_bad_options_cleanly(option, words):
    from typer.testing import CliRunner

    from vivace.cli import app

    result = CliRunner().invoke(app, ["serve", "--model", "tiny", *option])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output
