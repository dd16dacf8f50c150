"""`vivace serve`'s OpenAI wire format against a scripted engine: every reply is known in advance,
so streamed and whole replies can be compared exactly, and bad requests are checked to be 4xx
errors with a message (never a 500, never a silently ignored field). The real model behind the
same server is tested in test_serve.py."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from vivace.harness.chat import ChatFormat
from vivace.harness.policy import Completion, derive_seed
from vivace.inference.detokenize import Detokenizer, TokenBytes
from vivace.inference.engine import TopCompletion
from vivace.inference.server import ApiError, create_app
from vivace.model.tokenizer import reference_tokenizer
from vivace.sandbox.background import BackgroundServer

CHAT = ChatFormat(reference_tokenizer())
END = CHAT.stop_ids[:1]
USER = [{"role": "user", "content": "x"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


class ScriptedEngine:
    """Answers every request with `ids` (logprob -0.5 each; asked for alternatives, the token itself
    then the ids after it, at -0.5, -1.5, …); `hold` makes a request wait until it is cancelled."""

    version = 0

    class engine:  # noqa: N801 - mirrors AsyncEngine.engine
        max_positions = 8192

        @staticmethod
        def request(prompt, params, top_logprobs=0):  # Engine.request's checks: every request passes here
            return None

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.prompts: list[list[int]] = []
        self.params: list = []
        self.hold = False
        self.cancelled = 0

    def metrics(self) -> dict:
        return {}

    def _completion(self, ids: list[int], top: int = 0) -> Completion:
        finish = "stop" if ids and ids[-1] in CHAT.stop_ids else "length"
        if top:
            return TopCompletion(list(ids), [-0.5] * len(ids), finish, 0, top=tuple(alternatives(t, top) for t in ids))
        return Completion(list(ids), [-0.5] * len(ids), finish, 0)

    async def generate(self, prompt, sp, top_logprobs: int = 0) -> Completion:
        self.prompts.append(prompt)
        self.params.append(sp)
        if self.hold:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return self._completion(self.ids, top_logprobs)

    async def stream(self, prompt, sp, top_logprobs: int = 0):
        self.prompts.append(prompt)
        self.params.append(sp)
        done = 0
        try:
            for t in self.ids:
                done += 1
                yield (t, -0.5, alternatives(t, top_logprobs)) if top_logprobs else (t, -0.5)
            yield self._completion(self.ids, top_logprobs)
        finally:
            if done < len(self.ids):
                self.cancelled += 1


def alternatives(token: int, k: int) -> tuple[tuple[int, float], ...]:
    return tuple((token + i, -0.5 - i) for i in range(k))


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


def stream_choices(client, **body) -> tuple[dict[int, dict], dict | None]:
    """Each streamed choice put together ({index: content, calls, finish, logprobs, deltas}), and the usage."""
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True, **body})
    assert r.status_code == 200, r.text
    lines = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    choices: dict[int, dict] = {}
    usage = None
    for line in lines[:-1]:
        data = json.loads(line[6:])
        usage = data.get("usage") or usage
        for choice in data["choices"]:
            c = choices.setdefault(
                choice["index"], {"content": "", "calls": [], "finish": None, "logprobs": [], "deltas": []}
            )
            c["deltas"].append(choice["delta"].get("content") or "")
            c["content"] += c["deltas"][-1]
            c["calls"] += [
                {k: v for k, v in x.items() if k != "index"} for x in choice["delta"].get("tool_calls") or []
            ]
            c["finish"] = choice["finish_reason"] or c["finish"]
            c["logprobs"] += (choice.get("logprobs") or {}).get("content") or []
    return choices, usage


def streamed(client, **body) -> tuple[str, list[dict], str]:
    choices, _ = stream_choices(client, **body)
    assert list(choices) == [0]
    return choices[0]["content"], choices[0]["calls"], choices[0]["finish"]


def streamed_choice(client, **body) -> dict:
    choices, _ = stream_choices(client, **body)
    return choices[0]


CALL_ID = re.compile(r"call_[0-9a-f]{24}")


def without_ids(calls: list[dict]) -> list[dict]:
    """The calls less their ids, each checked to be a fresh one ("call_" and 24 hex digits, unique)."""
    assert all(CALL_ID.fullmatch(c["id"]) for c in calls) and len({c["id"] for c in calls}) == len(calls)
    return [{k: v for k, v in c.items() if k != "id"} for c in calls]


def assert_same_reply(whole_choice: dict, streamed_choice: dict) -> None:
    """A streamed choice says what the whole reply's choice says: content, calls (their ids drawn
    afresh for each reply), finish, logprobs."""
    message = whole_choice["message"]
    assert streamed_choice["content"] == (message["content"] or "")
    assert without_ids(streamed_choice["calls"]) == without_ids(message.get("tool_calls", []))
    assert streamed_choice["finish"] == whole_choice["finish_reason"]
    assert streamed_choice["logprobs"] == (whole_choice.get("logprobs") or {}).get("content", [])


def openai_client(client: TestClient) -> openai.OpenAI:
    """The official client, talking to the app in this process (TestClient is an httpx.Client)."""
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)


OUTPUTS = [
    "\n\n  Hello world",  # leading whitespace
    "Hello   \n",  # trailing whitespace
    'Hi\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\nafter text',
    '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
    'Hi <tool_call>\n{"name": "f", "arguments": oops}\n</tool_call>',  # malformed: kept as text
    'Hi <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>\nbroken\n</tool_call>',
    "héllo 🙂 世界",
]


@pytest.mark.parametrize("options", [{}, {"logprobs": True, "top_logprobs": 2}], ids=["plain", "logprobs"])
@pytest.mark.parametrize("text", OUTPUTS)
def test_streamed_reply_equals_whole_reply(served, text, options):
    engine, client = served
    says(engine, text)
    one = whole(client, tools=TOOLS, **options)
    choices, _ = stream_choices(client, tools=TOOLS, **options)
    assert_same_reply(one, choices[0])
    assert choices[0]["content"] == choices[0]["content"].strip()


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
    ({"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]}, "got 'refusal'"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "image_url"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": ["x"]}, *USER]}, "tool_calls[0]"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": "f"}]}]},
     "tool_calls[0]"),
    ({"messages": [{"role": "assistant", "tool_calls": {"a": 1}}]}, "tool_calls must be a list"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]}, "assistant"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]}, "tool_call_id"),
    ({"messages": USER, "tools": [{"type": "function", "function": "f"}]}, "tools[0]"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0]"),
    ({"messages": USER, "tools": [*TOOLS, {"type": "function", "function": {"name": "g", "parameters": "x"}}]},
     "tools[1]"),
    ({"messages": USER, "tools": [*TOOLS, {"type": "function", "function": {"name": "f"}}]},
     "tools[1] repeats the name 'f' of tools[0]"),
    ({"messages": USER, "tool_choice": "required"}, "needs tools"),
    ({"messages": USER, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice 'sometimes' is not supported"),
    ({"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "function 'g', which is not in tools (given: 'f')"),
    ({"messages": USER, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "not in tools"),
    ({"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "name": "f"}}, "tool_choice"),
    ({"messages": USER, "tools": TOOLS, "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}},
     "tool_choice"),
    ({"messages": USER, "top_logprobs": 3}, "top_logprobs needs logprobs"),
    ({"messages": USER, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"messages": USER, "n": 0}, "n"),
    ({"messages": USER, "n": 17}, "n: Input should be less than or equal to 16"),
    ({"messages": USER, "max_tokens": "5"}, "max_tokens"),
    ({"messages": USER, "stream": "no"}, "stream"),
    ({"messages": USER, "temperature": True}, "temperature"),
    ({"messages": USER, "temperature": 2.5}, "temperature"),
    ({"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": USER, "stop": [""]}, "stop"),
    ({"messages": USER, "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"messages": USER, "logit_bias": {"5": 10}}, "logit_bias"),
    ({"messages": USER, "repetition_penalty": 1.5}, "repetition_penalty"),  # vLLM's: were silently ignored
    ({"messages": USER, "min_p": 0.1}, "min_p"),
    ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": USER, "functions": [{"name": "f", "parameters": {}}]}, "give tools and tool_choice"),
    ({"messages": USER, "function_call": "auto"}, "give tools and tool_choice"),
    ({"messages": USER, "stream": True, "stream_options": {"include_usage": "no"}}, "stream_options.include_usage"),
    ({"messages": USER, "stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ({"messages": USER, "stream": True, "stream_options": {"usage": True}}, "stream_options.usage"),
    ({"messages": USER, "stream_options": {"include_usage": True}}, "stream_options is only allowed with stream"),
    ({"messages": USER, "modalities": ["text", "audio"]}, "text only"),
    ({"messages": USER, "audio": {"voice": "alloy", "format": "wav"}}, "text only"),
    ({"messages": USER, "web_search_options": {}}, "web_search_options"),
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


# -- tool_choice: "required" and a named function ------------------------------------------------------

TWO_TOOLS = [*TOOLS, {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}]


def forced_suffix(engine: ScriptedEngine, client, tools: list[dict]) -> list[int]:
    """What the last request's prompt has beyond the same request's prompt without forcing."""
    forced = engine.prompts[-1]
    whole(client, tools=tools)
    plain = engine.prompts[-1]
    assert forced[: len(plain)] == plain
    return forced[len(plain) :]


def test_tool_choice_required_opens_a_call(served):
    engine, client = served
    says(engine, '{"name": "g", "arguments": {"x": 1}}\n</tool_call>')
    reply = openai_client(client).chat.completions.create(
        model="m", messages=USER, tools=TWO_TOOLS, tool_choice="required", logprobs=True
    )
    choice = reply.choices[0]
    # the markup only: the model picks the function
    assert CHAT.decode(forced_suffix(engine, client, TWO_TOOLS)) == "<tool_call>\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [("g", {"x": 1})]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    forced = len(CHAT.encode("<tool_call>\n"))
    assert reply.usage.completion_tokens == forced + len(engine.ids)  # the forced tokens are part of the reply
    # logprobs cover the sampled tokens only (the forced ones were not sampled), the end of turn left out
    assert "".join(t.token for t in choice.logprobs.content) == '{"name": "g", "arguments": {"x": 1}}\n</tool_call>'
    one = whole(client, tools=TWO_TOOLS, tool_choice="required", logprobs=True)
    assert_same_reply(one, streamed_choice(client, tools=TWO_TOOLS, tool_choice="required", logprobs=True))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_a_call_to_a_function_not_in_tools_is_never_a_tool_call(served, tool_choice, stream):
    """With tool_choice "required" the tiny model called `run_terminal`, which the request never declared,
    and the reply said finish_reason "tool_calls": a client dispatching on the name got one it did not
    give. Such a call is now a malformed call: the reply is its text, with no tool calls."""
    engine, client = served
    text = 'Listing.\n<tool_call>\n{"name": "h", "arguments": {"x": 1}}\n</tool_call>'
    says(engine, text if tool_choice == "auto" else text.split("<tool_call>\n")[1])
    body = {"tools": TWO_TOOLS, "tool_choice": tool_choice}
    if stream:
        content, calls, finish = streamed(client, **body)
    else:
        choice = whole(client, **body)
        content, calls, finish = (
            choice["message"]["content"],
            choice["message"].get("tool_calls", []),
            choice["finish_reason"],
        )
    assert (calls, finish) == ([], "stop")
    assert '{"name": "h", "arguments": {"x": 1}}' in content


STRICT = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}},
                "required": ["cmd"],
                "additionalProperties": False,
            },
        },
    }
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("arguments", "kept"), [({"cmd": "ls"}, True), ({"path": "."}, False), ({"cmd": 5}, False)])
def test_a_strict_functions_calls_keep_to_its_schema(served, arguments, kept, stream):
    """`strict: true` was ignored: calls with arguments the schema refuses came back as tool calls. They
    are now malformed calls (the reply is text); calls the schema allows are tool calls as before."""
    engine, client = served
    says(engine, f'<tool_call>\n{{"name": "bash", "arguments": {json.dumps(arguments)}}}\n</tool_call>')
    if stream:
        content, calls, finish = streamed(client, tools=STRICT)
    else:
        choice = whole(client, tools=STRICT)
        content, calls, finish = (
            choice["message"]["content"],
            choice["message"].get("tool_calls", []),
            choice["finish_reason"],
        )
    if kept:
        assert finish == "tool_calls" and [json.loads(c["function"]["arguments"]) for c in calls] == [arguments]
    else:
        assert (calls, finish) == ([], "stop") and json.dumps(arguments) in content
    loose = [{"type": "function", "function": {**STRICT[0]["function"], "strict": False}}]
    assert whole(client, tools=loose)["finish_reason"] == "tool_calls"  # without strict, any arguments


def test_a_strict_function_needs_a_valid_schema(served):
    _, client = served
    bad = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "thing"}}}]
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, "tools": bad})
    assert r.status_code == 400 and "tools[0].function.parameters is not a valid JSON Schema" in r.text


def test_required_with_one_tool_names_it(served):
    """With a single tool, "required" can only mean a call to it: the reply's opening names it, as a named
    tool_choice does, so the model cannot call another."""
    engine, client = served
    says(engine, ' {"x": 1}}\n</tool_call>')
    choice = whole(client, tools=TOOLS, tool_choice="required")
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["f"]
    assert CHAT.decode(forced_suffix(engine, client, TOOLS)) == '<tool_call>\n{"name": "f", "arguments":'


@pytest.mark.parametrize("name", ["g", "a<|im_end|>b"])
def test_named_tool_choice_fixes_the_function(served, name):
    """The reply begins with the call's JSON up to its arguments, so the call is of `name` whatever
    the model would have preferred; a name spelling a control token stays text (no end of turn)."""
    engine, client = served
    tools = [*TOOLS, {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]
    says(engine, ' {"x": 1}}\n</tool_call>')
    choice = {"type": "function", "function": {"name": name}}
    reply = openai_client(client).chat.completions.create(model="m", messages=USER, tools=tools, tool_choice=choice)
    calls = reply.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [(name, {"x": 1})]
    suffix = forced_suffix(engine, client, tools)
    assert CHAT.decode(suffix) == f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments":'
    assert not set(suffix) & set(CHAT.stop_ids)
    one = whole(client, tools=tools, tool_choice=choice)
    assert_same_reply(one, streamed_choice(client, tools=tools, tool_choice=choice))


def test_forced_call_with_unparseable_arguments_is_the_malformed_reply(served):
    engine, client = served
    says(engine, " oops}\n</tool_call>")
    choice = {"type": "function", "function": {"name": "f"}}
    one = whole(client, tools=TOOLS, tool_choice=choice)
    assert "tool_calls" not in one["message"] and one["finish_reason"] == "stop"
    assert one["message"]["content"] == '<tool_call>\n{"name": "f", "arguments": oops}\n</tool_call>'
    assert_same_reply(one, streamed_choice(client, tools=TOOLS, tool_choice=choice))


def test_forced_call_counts_against_max_tokens(served):
    engine, client = served
    says(engine, "{}}\n</tool_call>")
    whole(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "f"}}, max_tokens=20)
    forced = len(CHAT.encode('<tool_call>\n{"name": "f", "arguments":'))
    assert engine.params[-1].max_tokens == 20 - forced


PLAIN_CALLS = (  # a chat template that writes tool calls without <tool_call> blocks
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + (m.content or '') }}"
    "{%- for c in m.tool_calls or [] %}{{ 'CALL ' + c.function.name + ' ' + (c.function.arguments | tojson) }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_tool_choice_that_the_template_cannot_force_is_refused():
    engine = ScriptedEngine()
    says(engine, "ok")
    client = TestClient(create_app(engine, ChatFormat(reference_tokenizer(), template=PLAIN_CALLS), "m"))
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        r = client.post(
            "/v1/chat/completions", json={"model": "m", "messages": USER, "tools": TOOLS, "tool_choice": choice}
        )
        assert r.status_code == 400 and "does not write a tool call as <tool_call>" in r.json()["error"]["message"]
    assert engine.prompts == []  # nothing was generated
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, "tools": TOOLS})
    assert r.status_code == 200  # "auto" needs no forcing


# -- n choices ------------------------------------------------------------------------------------------


def test_n_choices_whole_and_streamed(served):
    engine, client = served
    says(engine, "Hello world")
    reply = openai_client(client).chat.completions.create(model="m", messages=USER, n=3, seed=7)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.message.content for c in reply.choices] == ["Hello world"] * 3
    assert [p.seed for p in engine.params[-3:]] == [7, derive_seed(7, 1), derive_seed(7, 2)]  # each its own draw
    prompt = len(engine.prompts[-1])
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt, 3 * len(engine.ids))
    stream = openai_client(client).chat.completions.create(
        model="m", messages=USER, n=3, stream=True, stream_options={"include_usage": True}
    )
    content: dict[int, str] = {}
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            content[c.index] = content.get(c.index, "") + (c.delta.content or "")
    assert content == {0: "Hello world", 1: "Hello world", 2: "Hello world"}
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, 3 * len(engine.ids))
    r = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "n": 2}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1] and r["usage"]["completion_tokens"] == 2 * len(engine.ids)


def test_a_failing_choice_fails_the_request_and_stops_the_others():
    engine = ScriptedEngine()
    engine.hold = True
    calls = 0
    hold = engine.generate

    async def one_bad(prompt, sp, top_logprobs=0):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ValueError("bad choice")
        return await hold(prompt, sp, top_logprobs)

    engine.generate = one_bad
    client = TestClient(create_app(engine, CHAT, "m"))
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, "n": 3})
    assert r.status_code == 400 and "bad choice" in r.json()["error"]["message"]
    assert engine.cancelled == 2  # the two held choices were cancelled, not left generating


# -- logprobs -------------------------------------------------------------------------------------------


def test_top_logprobs_whole_and_streamed(served):
    engine, client = served
    says(engine, "Hello world")
    reply = openai_client(client).chat.completions.create(model="m", messages=USER, logprobs=True, top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == "Hello world"
    for e, t in zip(entries, engine.ids, strict=False):
        assert [(a.token, a.logprob) for a in e.top_logprobs] == [
            (CHAT.decode([x]), lp) for x, lp in alternatives(t, 3)
        ]
        assert e.top_logprobs[0].bytes == list(e.top_logprobs[0].token.encode())
    streamed_entries = [
        e
        for chunk in openai_client(client).chat.completions.create(
            model="m", messages=USER, logprobs=True, top_logprobs=3, stream=True
        )
        for c in chunk.choices
        for e in (c.logprobs.content if c.logprobs else ())
    ]
    assert streamed_entries == entries
    assert all(e["top_logprobs"] == [] for e in whole(client, logprobs=True)["logprobs"]["content"])


def test_completion_top_logprobs(served):
    engine, client = served
    says(engine, "Hello world")
    r = openai_client(client).completions.create(model="m", prompt=[1, 2], logprobs=2, max_tokens=5)
    logprobs = r.choices[0].logprobs
    assert logprobs.token_logprobs == [-0.5] * len(engine.ids)
    assert logprobs.top_logprobs == [{CHAT.decode([x]): lp for x, lp in alternatives(t, 2)} for t in engine.ids]
    # ASCII tokens are their text, each offset the length of the text before it (OpenAI's, vLLM's)
    assert logprobs.tokens == [CHAT.decode([t]) for t in engine.ids]
    assert logprobs.text_offset == [len(CHAT.decode(engine.ids[:i])) for i in range(len(engine.ids))]
    plain = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "logprobs": 0}).json()
    assert "top_logprobs" not in plain["choices"][0]["logprobs"]
    r = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "logprobs": 21})
    assert r.status_code == 400 and "logprobs" in r.json()["error"]["message"]


def spelled(token: str) -> bytes:
    """The bytes a legacy logprobs token names: OpenAI's "bytes:\\xe4\\xb8" form, else its text."""
    if not token.startswith("bytes:"):
        return token.encode()
    assert re.fullmatch(r"bytes:(\\x[0-9a-f]{2})+", token), token
    return bytes(int(h, 16) for h in token[len("bytes:") :].split("\\x")[1:])


def assert_legacy_logprobs(choice: dict, ids: list[int]) -> None:
    """A /v1/completions choice's logprobs of `ids`: each token named by its own bytes (its text
    where they are UTF-8 alone, else "bytes:\\x.."; no U+FFFD but a generated one), and each
    text_offset the character of the choice's text that the token's first byte is part of."""
    logprobs, text = choice["logprobs"], choice["text"]
    pieces = [TokenBytes(CHAT.tokenizer)(t) for t in ids]
    assert [spelled(t) for t in logprobs["tokens"]] == pieces
    for token, piece in zip(logprobs["tokens"], pieces, strict=True):
        assert token.startswith("bytes:") or token == piece.decode()
        assert "\ufffd" not in token or "\ufffd".encode() in piece  # only where the model generated one
    # the last character of the decode up to the first byte (U+FFFD for a character cut there)
    starts = [sum(map(len, pieces[:i])) for i in range(len(ids))]
    data = b"".join(pieces)
    assert data.decode(errors="replace").startswith(text)  # all of it, or the part before a stop string
    expected = [min(len(data[: k + 1].decode(errors="replace")) - 1, len(text)) for k in starts]
    assert logprobs["text_offset"] == expected


def test_completion_logprobs_name_parts_of_characters_by_their_bytes(served):
    """Byte-level BPE splits 🙂 and 世 over tokens that each decode alone to U+FFFD. /v1/completions
    names them as OpenAI's legacy API does, "bytes:\\xe4\\xb8" (in `tokens` and `top_logprobs`),
    and the tokens of one character share its text_offset, as OpenAI's do; every choice of n."""
    engine, client = served
    says(engine, TEXT)
    for skip in (False, True):  # the end token is never text (as vLLM's), whether special tokens are skipped or not
        r = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "logprobs": 2, "n": 2,
                                                 "max_tokens": 99, "skip_special_tokens": skip})  # fmt: skip
        assert r.status_code == 200, r.text
        for choice in r.json()["choices"]:
            assert choice["text"] == TEXT
            assert_legacy_logprobs(choice, engine.ids)
            tokens, offsets = choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"]
            assert sum(t.startswith("bytes:") for t in tokens) >= 6
            assert b"".join(map(spelled, tokens)).decode() == TEXT + "<|im_end|>"  # tokens name every id
            world = [t for t, at in zip(tokens, offsets, strict=True) if at == TEXT.index("世")]
            assert world == ["bytes:\\xe4", "bytes:\\xb8", "bytes:\\x96"]  # 世 is e4 b8 96
            for t, at in zip(tokens, offsets, strict=True):  # a whole token's text is where its offset says
                shown = t != "<|im_end|>"  # the end token takes no text: its offset is the text's end
                assert t.startswith("bytes:") or choice["text"][at : at + len(t)] == (t if shown else "")
            for top, t in zip(choice["logprobs"]["top_logprobs"], engine.ids, strict=True):
                assert [spelled(k) for k in top] == [TokenBytes(CHAT.tokenizer)(x) for x, _ in alternatives(t, 2)]
                assert "\ufffd" not in "".join(top)
    official = openai_client(client).completions.create(model="m", prompt=[1, 2], logprobs=2, max_tokens=99)
    assert official.choices[0].logprobs.model_dump() == r.json()["choices"][0]["logprobs"]


def test_special_tokens_are_left_out_of_the_text_unless_asked_for(served):
    """A sampled <|im_start|> or <|endoftext|> came back in the content and the /v1/completions text, which
    vLLM leaves out (`skip_special_tokens`, true by default); and with `ignore_eos` a stream held the
    <|endoftext|> its whole reply dropped. Now the special tokens but the tool markup are left out of every
    reply the same way, whole, streamed and completed, unless `skip_special_tokens` is false."""
    engine, client = served
    for text, extra in (("one<|im_start|>two <tool_response>three", {}),  # an end token would end it here
                        ("one<|im_start|>two<|endoftext|>three", {"ignore_eos": True})):  # fmt: skip
        says(engine, text)
        extra |= {"max_tokens": len(engine.ids)}
        for skip in (True, False):
            shown = text if not skip else text.replace("<|im_start|>", "").replace("<|endoftext|>", "")
            shown += "<|im_end|>" if "ignore_eos" in extra and not skip else ""  # an ignored end token is text
            body = {"skip_special_tokens": skip, **extra}
            one = whole(client, **body)
            assert one["message"]["content"] == shown, (skip, extra)
            assert_same_reply(one, streamed_choice(client, **body))
            r = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], **body})
            assert r.json()["choices"][0]["text"] == shown
    raw = {"skip_special_tokens": False, "include_stop_str_in_output": True}  # what HttpSampler asks for
    r = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], **raw})
    assert r.json()["choices"][0]["text"] == "one<|im_start|>two<|endoftext|>three<|im_end|>"  # every token
    for option in ({"min_tokens": 5}, {"include_stop_str_in_output": True, "stop": "x"}):  # were ignored
        r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, **option})
        assert r.status_code == 400 and "not supported" in r.json()["error"]["message"], r.text


# -- incremental detokenization ---------------------------------------------------------------------------


def test_incremental_detokenizer_equals_a_whole_decode():
    """Deltas concatenate to the whole decode: multi-byte characters split over tokens, control
    tokens, and random ids (bytes that never form a character) alike."""
    import random

    rng = random.Random(0)
    vocab = len(CHAT.tokenizer)
    texts = ["héllo 🙂 世界", "<tool_call>\n{}</tool_call> ünïcödé 🙂🙂", "plain ascii", "\n\n  ", "界"]
    cases = [CHAT._encode_marked(t) for t in texts] + [CHAT.encode(t) for t in texts]
    cases += [[rng.randrange(vocab) for _ in range(rng.randrange(1, 60))] for _ in range(200)]
    cases += [rng.choice(cases[:10]) + c + rng.choice(cases[:10]) for c in cases[10:60]]
    skip = set(CHAT.stop_ids)
    for ids in cases:
        detok = Detokenizer(CHAT.decode, skip)
        deltas = [detok.add(t) for t in ids]
        assert "".join(deltas) + detok.flush() == CHAT.decode([t for t in ids if t not in skip]), ids
        assert not any(d.endswith("\ufffd") for d in deltas)


TEXT = "héllo 🙂 世界, 世界 again and 🙂 done"


@pytest.mark.parametrize("stop", ["🙂 世", "界, 世", "ag", "n and 🙂", "o", "not there"])
def test_stop_strings_across_split_characters(served, stop):
    """Stop strings that begin or end inside a character's tokens, or span several tokens: whole,
    streamed and /v1/completions replies all end before the first one, and no streamed delta holds
    half a character."""
    engine, client = served
    says(engine, TEXT)
    assert sum(CHAT.decode([t]) == "\ufffd" for t in engine.ids) >= 6  # the characters are split over tokens
    expected = TEXT.split(stop, 1)[0]
    one = whole(client, stop=[stop, "zzz"], logprobs=True)
    assert one["message"]["content"] == expected.strip()
    assert one["finish_reason"] == "stop"
    choice = streamed_choice(client, stop=[stop, "zzz"], logprobs=True)
    assert_same_reply(one, choice)
    assert not any("\ufffd" in d for d in choice["deltas"])
    r = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "stop": stop, "max_tokens": 100})
    assert r.json()["choices"][0]["text"] == (expected if stop in TEXT else TEXT)  # the end token skipped
    sampled = r.json()["choices"][0]["token_ids"]  # up to the token that completed the stop string
    assert_legacy_logprobs(r.json()["choices"][0], sampled)


def test_logprob_bytes_are_each_tokens_own(served):
    """A token holding part of a character (byte-level BPE splits 🙂 and 世 over tokens that each
    decode to U+FFFD) reports its real bytes, as OpenAI does: joined, they are the reply's UTF-8.
    The alternatives' bytes too, streamed or whole."""
    engine, client = served
    says(engine, TEXT)
    reply = whole(client, logprobs=True, top_logprobs=2)
    entries = reply["logprobs"]["content"]
    assert sum(e["token"] == "\ufffd" for e in entries) >= 6  # the characters are split over tokens
    assert b"".join(bytes(e["bytes"]) for e in entries) == TEXT.encode()
    assert all(e["top_logprobs"][0]["bytes"] == e["bytes"] for e in entries)  # the first alternative: itself
    for e, t in zip(entries, engine.ids, strict=False):
        assert e["top_logprobs"][1]["bytes"] == list(TokenBytes(CHAT.tokenizer)(t + 1))
    assert streamed_choice(client, logprobs=True, top_logprobs=2)["logprobs"] == entries


def test_token_bytes_agree_with_the_tokenizers_decode():
    """Against a whole decode: every token that is whole characters is its text's UTF-8, any ids'
    bytes joined decode to the tokenizer's text of them, and control tokens are their text."""
    import random

    tok, token_bytes = CHAT.tokenizer, TokenBytes(CHAT.tokenizer)
    for t in range(len(tok)):
        text = CHAT.decode([t])
        if "\ufffd" not in text:
            assert token_bytes(t) == text.encode(), t
    rng = random.Random(0)
    for ids in [CHAT.encode(TEXT)] + [[rng.randrange(len(tok)) for _ in range(40)] for _ in range(100)]:
        assert b"".join(map(token_bytes, ids)).decode(errors="replace") == CHAT.decode(ids)
    assert token_bytes(CHAT.stop_ids[0]) == b"<|im_end|>"


def test_token_bytes_of_a_byte_fallback_tokenizer():
    """SentencePiece-style vocabularies (Llama 2, Mistral) spell bytes no token covers as <0xF0>."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": b + 1 for b in range(256)}}
    vocab.update((c, len(vocab) + i) for i, c in enumerate("ab▁"))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    ids = tok.encode("ab 🙂 a", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids[3]) == "<0xF0>"
    assert b"".join(map(TokenBytes(tok), ids)) == "ab 🙂 a".encode()


def test_text_offsets_of_any_ids():
    """Random ids (bytes that never form a character, control tokens): each offset is the character
    of the text, U+FFFD for invalid UTF-8, that the token's first byte is part of; cut texts too."""
    import random

    from vivace.inference.replies import Output, completion_logprobs

    rng = random.Random(1)
    for _ in range(200):
        ids = [rng.randrange(len(CHAT.tokenizer)) for _ in range(rng.randrange(0, 40))]
        text = CHAT.decode(ids)
        for cut in (text, text[: rng.randrange(len(text) + 1)]):
            logprobs = completion_logprobs(CHAT, Output(Completion(ids, [0.0] * len(ids), "stop", 0), []), cut, False)
            assert_legacy_logprobs({"text": cut, "logprobs": logprobs}, ids)


def test_text_offsets_where_one_tokens_decode_loses_text():
    """Llama 2's SentencePiece decoder drops a decode's leading space, so a token's own bytes lose
    it and do not join into the text: the offsets then come from the incremental decode, and
    still point into the text."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    from vivace.inference.replies import text_offsets

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": b + 1 for b in range(256)}}
    vocab.update((c, len(vocab) + i) for i, c in enumerate("ab▁"))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    sp = SimpleNamespace(tokenizer=tok, decode=lambda ids: tok.decode(ids, clean_up_tokenization_spaces=False))
    ids = tok.encode("ab 🙂 ab", add_special_tokens=False)
    text = sp.decode(ids)
    # Each token keeps its own space, which its decode alone drops; the text's first one is stripped.
    assert text == "ab 🙂 ab" and b"".join(map(TokenBytes(tok), ids)) == b" " + text.encode()
    offsets = text_offsets(sp, ids, text)
    assert [text[at] for at in offsets] == list("aab " + "🙂" * 4 + " ab")  # the first ▁ is stripped: at the start
    assert text_offsets(sp, ids, text[:4]) == [min(at, 4) for at in offsets]


def test_stop_strings_read_the_output_in_linear_time():
    """Watching for stop strings decodes a bounded window per token, not the whole output again."""
    chat = ChatFormat(reference_tokenizer())
    decoded = []
    plain_decode = chat.decode
    chat.decode = lambda ids: (decoded.append(len(ids)), plain_decode(ids))[1]
    engine = ScriptedEngine()
    engine.ids = chat.encode("tick tock héllo 🙂 " * 300)
    client = TestClient(create_app(engine, chat, "m"))
    n = len(engine.ids)
    for stream in (False, True):
        decoded.clear()
        r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stop": "zzz", "stream": stream})
        assert r.status_code == 200
        assert sum(decoded) < 20 * n, f"{sum(decoded)} ids decoded for {n} tokens"  # quadratic: ~n * n / 2


def test_a_body_larger_than_any_prompt_is_refused_before_it_is_read(served):
    """A 47 MB chat request used to grow the server from 0.5 to 4.4 GB and hold a core for 34 s before its
    prompt was found too long; a body over `body_cap(context)` is now a 413, declared or chunked."""
    from vivace.inference.server import body_cap

    engine, client = served
    cap = body_cap(engine.engine.max_positions)
    assert cap == 4 << 20  # 8,192 tokens: the 4 MiB floor
    says(engine, "fine")
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * (cap - 1000)}]}
    assert client.post("/v1/chat/completions", json=body).status_code in (200, 400)  # under the cap: read
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * cap}]}).encode()
    r = client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and f"over {cap} bytes" in r.json()["error"]["message"], r.text

    def chunks():
        for start in range(0, len(big), 1 << 16):
            yield big[start : start + (1 << 16)]

    r = client.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error", r.text


# -- what the audit of the served API found -------------------------------------------------------------


def test_known_options_that_are_honoured_pass_and_the_refused_ones_are_listed(served):
    """Every OpenAI option the request model names is honoured or refused; those accepted as given."""
    engine, client = served
    says(engine, "ok")
    ok = {"modalities": ["text"], "stream_options": {"include_usage": False, "include_obfuscation": False}}
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True, **ok})
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    assert '"usage"' not in r.text  # include_usage false: no usage chunk


def test_a_reply_with_a_malformed_call_is_all_text(served):
    """One good and one malformed call: the good one was returned in tool_calls and again, with the
    malformed one, in the content, so a client parsing the content read the good call twice; now the
    reply is the malformed-call reply, its text holding both (as vLLM's parsers answer)."""
    engine, client = served
    good = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    text = f'Two.\n{good}\n<tool_call>\n{{"name": "f", "arguments": {{"a": 2}}\n</tool_call>'
    says(engine, text)
    for parallel in (True, False):
        one = whole(client, tools=TOOLS, parallel_tool_calls=parallel)
        assert one["message"] == {"role": "assistant", "content": text} and one["finish_reason"] == "stop"
        assert_same_reply(one, streamed_choice(client, tools=TOOLS, parallel_tool_calls=parallel))


def test_arguments_too_deep_to_decode_are_a_malformed_reply_not_a_500(served):
    engine, client = served
    for arguments in (json.dumps("[" * 3000 + "]" * 3000), '{"a": ' + "[" * 40 + "]" * 40 + "}"):
        text = f'<tool_call>\n{{"name": "f", "arguments": {arguments}}}\n</tool_call>'
        says(engine, text)
        one = whole(client, tools=TOOLS)
        assert one["message"] == {"role": "assistant", "content": text} and one["finish_reason"] == "stop"
        assert_same_reply(one, streamed_choice(client, tools=TOOLS))


def test_call_ids_are_unique_across_replies_and_choices(served):
    """Every reply numbered its calls call_0, call_1, …, so two turns (or two choices) repeated ids, and
    a client keying results by id over a conversation mixed them up: ids are now drawn afresh."""
    engine, client = served
    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    says(engine, call + call)
    ids = [c["id"] for _ in range(2) for c in whole(client, tools=TOOLS)["message"]["tool_calls"]]
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, "tools": TOOLS, "n": 2})
    ids += [c["id"] for choice in r.json()["choices"] for c in choice["message"]["tool_calls"]]
    ids += [c["id"] for c in streamed_choice(client, tools=TOOLS)["calls"]]
    assert len(ids) == 10 and len(set(ids)) == 10 and all(CALL_ID.fullmatch(i) for i in ids)


SHOWS_IDS = (  # a chat template that writes call ids into the prompt
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + (m.content or '') }}"
    "{%- for c in m.tool_calls or [] %}{{ '\\n<tool_call>\\n{\"name\": ' + (c.function.name | tojson) }}"
    "{{ ', \"id\": ' + (c.id | tojson) + ', \"arguments\": ' + (c.function.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{%- if m.role == 'tool' %}{{ ' for ' + m.tool_call_id }}{%- endif %}{{ '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_that_shows_call_ids_renders_the_same_whatever_ids_the_client_sends():
    """The ids a client sends back (this server's, OpenAI's: random) are renamed call_0, call_1, … per
    turn, with the results that answer them, before rendering: the ids a token-level rollout gives
    (ChatFormat.parse), so the model sees what it saw in training whatever the client's ids."""
    engine = ScriptedEngine()
    says(engine, "ok")
    client = TestClient(create_app(engine, ChatFormat(reference_tokenizer(), template=SHOWS_IDS), "m"))

    def conversation(a: str, b: str, c: str) -> list[dict]:
        def calls(*ids: str) -> dict:
            made = [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids]
            return {"role": "assistant", "content": None, "tool_calls": made}

        return [*USER, calls(a, b), {"role": "tool", "tool_call_id": b, "content": "B"},
                {"role": "tool", "tool_call_id": a, "content": "A"}, calls(c),
                {"role": "tool", "tool_call_id": c, "content": "C"}]  # fmt: skip

    for ids in (("call_0", "call_1", "call_0"), ("call_9f3a", "call_77", "call_c1"), ("x", "y", "z")):
        r = client.post("/v1/chat/completions", json={"model": "m", "messages": conversation(*ids), "tools": TOOLS})
        assert r.status_code == 200, r.text
    assert engine.prompts[0] == engine.prompts[1] == engine.prompts[2]
    shown = CHAT.decode(engine.prompts[0])
    assert '"id": "call_1"' in shown and "B for call_1" in shown and "A for call_0" in shown and "C for call_0" in shown


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_forced_call_needs_room_in_max_tokens(served, field):
    """max_tokens 1 with a forced call gave a reply of the call's opening and a sampled token (13 tokens):
    the forced tokens count in max_tokens, so a limit that cannot hold them and one more is a 400."""
    engine, client = served
    says(engine, "{}}\n</tool_call>")
    choice = {"type": "function", "function": {"name": "f"}}
    forced = len(CHAT.encode('<tool_call>\n{"name": "f", "arguments":'))
    for limit in (1, forced):
        body = {"model": "m", "messages": USER, "tools": TOOLS, "tool_choice": choice, field: limit}
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and f"{field} of at least {forced + 1}" in r.json()["error"]["message"], r.text
    assert engine.prompts == []
    one = whole(client, tools=TOOLS, tool_choice=choice, **{field: forced + 1})
    assert engine.params[-1].max_tokens == 1
    assert one["finish_reason"] in ("length", "tool_calls")


@pytest.mark.parametrize("stop", ["four", "fo", "ur fi", "e f"])
def test_chat_logprobs_leave_out_the_stop_strings_tokens(served, stop):
    """The entries held the tokens of the stop string that ended the reply: they are the tokens of the
    text before it, streamed or whole (a token holding part of the stop string is left out)."""
    engine, client = served
    says(engine, "one two three four five six")
    one = whole(client, stop=[stop], logprobs=True)
    content = one["message"]["content"]
    joined = "".join(e["token"] for e in one["logprobs"]["content"])
    assert content == "one two three four five six".split(stop)[0].strip()
    assert content.startswith(joined.strip()) and stop not in joined
    pieces = [CHAT.decode([t]) for t in engine.ids]
    whole_tokens = [p for k, p in enumerate(pieces) if len("".join(pieces[: k + 1])) <= len(content)]
    assert joined == "".join(whole_tokens)  # every token wholly before the stop string
    assert_same_reply(one, streamed_choice(client, stop=[stop], logprobs=True))


class EndlessEngine(ScriptedEngine):
    """Streams "a" tokens every 10 ms until cancelled (counted), as a long generation does."""

    async def stream(self, prompt, sp, top_logprobs: int = 0):
        self.prompts.append(prompt)
        try:
            while True:
                await asyncio.sleep(0.01)
                yield (CHAT.encode("a")[0], -0.5)
        finally:
            self.cancelled += 1

    async def generate(self, prompt, sp, top_logprobs: int = 0):
        self.hold = True
        return await super().generate(prompt, sp, top_logprobs)


def test_a_stopping_server_ends_open_requests_within_its_grace():
    """Stopped with a stream open, `vivace serve` waited for the client forever. Under ClosingServer (as
    `serve` runs it) running requests get the grace, then a stream ends with an error event and a whole
    reply with 503, their generation cancelled; a new request is refused; the server is down in seconds."""
    from vivace.inference.server import GRACEFUL_BACKSTOP_S
    from vivace.sandbox.background import ClosingServer

    engine = EndlessEngine()
    app = create_app(engine, CHAT, "m", shutdown_grace_s=0.5)
    server = BackgroundServer(app, server_class=ClosingServer, graceful_s=GRACEFUL_BACKSTOP_S).start()
    body = {"model": "m", "messages": USER}
    got: dict[str, object] = {}

    def read_stream() -> None:
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=30) as r:
            got["events"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    def wait_whole() -> None:
        got["whole"] = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)

    clients = [threading.Thread(target=read_stream), threading.Thread(target=wait_whole)]
    for t in clients:
        t.start()
    deadline = time.monotonic() + 10
    while (len(engine.prompts) < 2 or not app.state.stopping.running) and time.monotonic() < deadline:
        time.sleep(0.02)
    started = time.monotonic()
    server.stop(timeout=30)
    took = time.monotonic() - started
    for t in clients:
        t.join(10)
    assert took < 3, f"the server took {took:.1f} s to stop"
    events = got["events"]
    assert json.loads(events[-2][6:])["error"]["code"] == 503 and events[-1] == "data: [DONE]"
    assert got["whole"].status_code == 503 and "shutting down" in got["whole"].json()["error"]["message"]
    assert engine.cancelled == 2  # both generations were stopped, their slots freed
    with pytest.raises(ApiError, match="shutting down"):
        app.state.stopping.admit()


def test_null_options_take_their_defaults(served):
    """OpenAI reads an explicit null as "the default", and the openai client sends `temperature=None` as
    one: every option that has a default was refused with 400 when given null. A required field's null is
    still refused."""
    engine, client = served
    says(engine, "ok")
    sdk = openai_client(client)
    nulls = {name: None for name in ("temperature", "top_p", "n", "stream", "logprobs", "top_logprobs",
                                     "parallel_tool_calls", "presence_penalty", "frequency_penalty")}  # fmt: skip
    reply = sdk.chat.completions.create(model="m", messages=USER, tools=TOOLS, **nulls, extra_body={"top_k": None})
    assert reply.choices[0].message.content == "ok" and len(reply.choices) == 1
    assert (engine.params[-1].temperature, engine.params[-1].top_p, engine.params[-1].top_k) == (1.0, 1.0, 0)
    r = client.post("/v1/completions", json={"model": "m", "prompt": [1, 2], "echo": None, "best_of": None, "n": None})
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == engine.ids, r.text
    r = client.post("/v1/chat/completions", json={"model": None, "messages": USER})
    assert r.status_code == 400 and "model" in r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": None})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


def test_a_body_that_is_not_json_says_how_to_mend_it(served):
    """Invalid JSON said "invalid request: 27: JSON decode error" (a character offset shown as a field, the
    reason dropped); JSON sent as a form (curl -d without a content-type) said the body was not a dictionary."""
    _, client = served
    r = client.post("/v1/chat/completions", content=b'{"model": "m", "messages": [],}',
                    headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "invalid request: the body is not valid JSON: Expecting property name enclosed in double quotes "
        "(at character 30)"
    )
    body = json.dumps({"model": "m", "messages": USER}).encode()
    r = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400
    assert "sent with content-type: application/json (this one's: application/x-www-form-urlencoded)" in r.text
    r = client.post("/v1/chat/completions", content=b'"hi"', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"].endswith("must be a JSON object, not a JSON string")


def test_a_model_is_retrieved_by_its_name(served):
    """The openai client's models.retrieve (GET /v1/models/{model}) was a 404 for the model served."""
    _, client = served
    sdk = openai_client(client)
    assert sdk.models.retrieve("m").id == "m" == sdk.models.list().data[0].id
    with pytest.raises(openai.NotFoundError, match="not served here"):
        sdk.models.retrieve("gpt-4o")


def test_the_model_card_says_the_context_as_vllm_does(served):
    """max_model_len: what vivace's own endpoint policy (and any client) sizes its requests by."""
    engine, client = served
    card = openai_client(client).models.list().data[0]
    assert card.max_model_len == engine.engine.max_positions > 0
    assert client.get("/v1/models/m").json()["max_model_len"] == engine.engine.max_positions


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}] * 120_000}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "ab " * 1_300_000}]}),
        ("/v1/completions", {"prompt": "ab " * 1_300_000}),
    ],
    ids=["many-messages", "long-message", "long-prompt"],
)
def test_a_prompt_sure_to_be_over_the_context_is_refused_before_it_is_tokenized(served, path, body, monkeypatch):
    """Under the 4 MiB body cap, 120,000 empty messages or a 3.9 MB text took a core 7-12 s to render and
    tokenize before the context check refused them, while other clients' streams waited. A lower bound
    (a token a message, the tokenizer's longest token of text per token) now refuses them first: neither
    tokenizing entry point runs. (A wall-clock bound here failed once in CI under load: 3.7 s > 3 s.)"""
    engine, client = served
    says(engine, "ok")

    def tokenized(*_args, **_kwargs):
        raise AssertionError("the prompt was tokenized before the length check refused it")

    monkeypatch.setattr(CHAT, "encode", tokenized)
    monkeypatch.setattr(CHAT, "prompt_ids", tokenized)
    r = client.post(path, json={"model": "m", **body})
    assert r.status_code == 400 and "the prompt has at least" in r.text and "context is 8192" in r.text, r.text
    assert not engine.prompts  # nothing reached the engine


def test_a_prompt_the_bound_cannot_rule_out_is_tokenized(served):
    """30,000 characters may be fewer tokens than the context: tokenized, the engine's exact check decides
    (this scripted engine has none; its prompt is 30,008 one-character tokens)."""
    engine, client = served
    says(engine, "ok")
    messages = [{"role": "user", "content": "x" * 30_000}]
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": messages})
    assert r.status_code == 200 and len(engine.prompts[-1]) > 30_000, r.text


def test_an_assistants_refusal_parts_are_its_text(served):
    """OpenAI allows refusal parts in an assistant's message (what it said when it declined); they were 400."""
    engine, client = served
    says(engine, "ok")
    refused = [{"type": "text", "text": "Sorry: "}, {"type": "refusal", "refusal": "I cannot do that."}]
    history = [*USER, {"role": "assistant", "content": refused}, *USER]
    whole(client, messages=history)
    as_text = [*USER, {"role": "assistant", "content": "Sorry: I cannot do that."}, *USER]
    whole(client, messages=as_text)
    assert engine.prompts[-1] == engine.prompts[-2]


def test_chat_ends_at_stop_token_ids_too(served):
    """vLLM's stop_token_ids and ignore_eos were honoured on /v1/completions and silently ignored on chat."""
    engine, client = served
    says(engine, "ok")
    whole(client, stop_token_ids=[7])
    assert engine.params[-1].stop_token_ids == (7, *CHAT.stop_ids)
    whole(client, stop_token_ids=[7], ignore_eos=True, repetition_penalty=1.0, min_p=0.0)  # the neutral values pass
    assert engine.params[-1].stop_token_ids == (7,)


def test_messages_are_read_off_the_event_loop(served, monkeypatch):
    """Reading and checking 120,000 messages (a 4 MiB body) took ~1 s on the event loop, and every open
    stream of the server stalled that long; a bad message is still a 400."""
    import vivace.inference.server as server

    on_loop, read = [], server.messages_from_openai

    def reading(messages):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return read(messages)

    monkeypatch.setattr(server, "messages_from_openai", reading)
    engine, client = served
    says(engine, "hello")
    assert whole(client)["message"]["content"] == "hello" and on_loop == [False]
    body = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'  # JSON's escape: no UTF-8 has it
    r = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"]


def test_a_silent_stream_sends_keep_alive_comments_that_clients_skip(monkeypatch):
    """A streamed tool call is sent once parsed, so its stream is silent while the model writes it: 2,000
    tokens were 48 s of nothing on the tiny model, past what an idle-timeout proxy allows."""
    import vivace.inference.server as server

    class SlowEngine(ScriptedEngine):
        async def stream(self, prompt, sp, top_logprobs: int = 0):
            await asyncio.sleep(1.0)  # the model writing, with nothing to send yet
            async for item in super().stream(prompt, sp, top_logprobs):
                yield item

    monkeypatch.setattr(server, "STREAM_KEEPALIVE_S", 0.1)
    engine = SlowEngine()
    says(engine, '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>')
    srv = BackgroundServer(create_app(engine, CHAT, "m"))
    srv.start()
    try:
        body = {"model": "m", "messages": USER, "tools": TOOLS, "stream": True}
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body, timeout=30) as r:
            lines = [line for line in r.iter_lines() if line]
        assert 1 <= lines.count(": keep-alive") <= 12, lines  # ~10: 1 s of silence at one per 0.1 s
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
        chunks = list(client.chat.completions.create(**body))  # the openai client skips the comments
        calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
        assert calls and calls[0][0].function.name == "f"
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    finally:
        srv.stop()


@pytest.mark.parametrize("prompt", [["one", "two"], [[1, 2], [3]]], ids=["strings", "id-lists"])
def test_a_batch_of_prompts_is_refused_as_one(served, prompt):
    """OpenAI's /v1/completions takes a list of prompts; refused here with pydantic's raw "prompt.list[int].0:
    Input should be a valid integer", which did not say a batch was the problem."""
    _, client = served
    r = client.post("/v1/completions", json={"model": "m", "prompt": prompt})
    assert r.status_code == 400 and "one prompt per request" in r.json()["error"]["message"], r.text
