"""OpenAIPolicy against a fake chat-completions server that answers what real servers answer,
odd replies included: malformed model output must come back to the model as an error result
(the episode goes on), a server that answers nothing usable must end the episode with a clear
reason, transient errors are retried a bounded number of times, and every request the policy
sends must pass a strict server's checks (`strict_problems`)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import socket
import time
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from vivace.config import AgentConfig
from vivace.harness.agent import run_episode
from vivace.harness.messages import Message, ToolCall
from vivace.harness.policies import OpenAIPolicy
from vivace.harness.policy import Conversation, PolicyError, PolicyUnavailable, close_policy
from vivace.sandbox.background import BackgroundServer

# --- the fake server --------------------------------------------------------------------------


def completion(message: dict | None, finish_reason: str | None = "stop", usage: Any = "default") -> dict:
    """A chat-completions body whose first choice holds `message` (left out when None)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason}
    if message is not None:
        choice["message"] = {"role": "assistant", **message}
    body: dict[str, Any] = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-1",
        "choices": [choice],
    }
    if usage == "default":
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if usage is not None:
        body["usage"] = usage
    return body


def calls(*tool_calls: dict, content: str | None = None, finish_reason: str | None = "tool_calls") -> dict:
    return completion({"content": content, "tool_calls": list(tool_calls)}, finish_reason)


def call(id_: Any, name: Any, arguments: Any) -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


DONE = completion({"content": "Done."})


def strict_problems(body: dict) -> list[str]:
    """What a strict server refuses in a request: OpenAI (an empty tools list, null fields, a tool
    message answering no call of the assistant message before it, repeated call ids) and older
    vLLM/SGLang (which json.loads every past call's arguments and need an object)."""
    problems = []
    if "tools" in body and not body["tools"]:
        problems.append("tools: empty array")
    pending: list[str] = []
    for i, m in enumerate(body["messages"]):
        problems += [f"messages[{i}].{k} is null" for k, v in m.items() if v is None]
        if m["role"] == "tool":
            if m.get("tool_call_id") not in pending:
                problems.append(f"messages[{i}]: tool_call_id {m.get('tool_call_id')!r} answers no pending call")
            else:
                pending.remove(m["tool_call_id"])
            continue
        pending = []
        for c in m.get("tool_calls") or ():
            args = c["function"]["arguments"]
            try:
                ok = isinstance(args, str) and isinstance(json.loads(args), dict)
            except ValueError:
                ok = False
            if not ok:
                problems.append(f"messages[{i}]: arguments {args!r} is not a JSON string of an object")
            if c["id"] in pending:
                problems.append(f"messages[{i}]: tool call id {c['id']!r} is repeated")
            pending.append(c["id"])
    return problems


class Endpoint:
    """Answers each chat request with the next scripted reply (the last one repeats): a dict is a
    200 JSON body, a Response is sent as it is, a callable is awaited for the Response. Requests
    a strict server would refuse get a 400 (and are recorded in `refused`)."""

    def __init__(self) -> None:
        self.replies: list[Any] = [DONE]
        self.requests: list[dict] = []
        self.refused: list[list[str]] = []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)
        self.app.post("/moved/v1/chat/completions")(lambda: DONE)
        self.app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": "fake-1", "object": "model"}]})

    async def complete(self, request: Request) -> Any:
        body = await request.json()
        self.requests.append(body)
        if problems := strict_problems(body):
            self.refused.append(problems)
            return JSONResponse({"error": {"message": "; ".join(problems), "type": "invalid_request_error"}}, 400)
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        if isinstance(reply, Response):
            return reply
        return await reply() if callable(reply) else JSONResponse(reply)


@pytest.fixture(scope="module")
def server():
    fake = Endpoint()
    background = BackgroundServer(fake.app).start()
    yield fake, background.url
    background.stop(10)


@pytest.fixture
async def endpoint(server):
    """The fake with an empty record, and a policy over it (short timeout, quick retries)."""
    fake, url = server
    fake.replies, fake.requests, fake.refused = [DONE], [], []
    policy = OpenAIPolicy(f"{url}/v1", "fake-1", name="fake", timeout_s=5.0)
    yield fake, policy
    await policy.aclose()


async def test_closing_the_policy_closes_its_connections(ws, endpoint):
    """Left open, the client's pooled connections outlive the event loop that opened them (the
    garbage collector then finds unclosed transports); the bench and the agent close it."""
    fake, policy = endpoint
    assert (await run_episode(policy, ws, "x")).stop_reason == "done"
    await close_policy(policy)
    assert policy.client.is_closed()


@pytest.fixture
def ws(plain_ws):
    return plain_ws


def conversation(tools: bool = True) -> Conversation:
    schema = {"type": "function", "function": {"name": "list_dir", "parameters": {"type": "object"}}}
    return Conversation([Message("system", "s"), Message("user", "u")], tools=[schema] if tools else [])


# --- malformed model output: an error result, and the episode goes on ---------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"id": "a", "type": "function", "function": None},
        {"id": "a", "type": "function"},
    ],
    ids=["function-null", "function-missing"],
)
async def test_call_without_a_function_is_an_error_result_not_the_final_answer(ws, endpoint, bad):
    fake, policy = endpoint
    fake.replies = [calls(bad, call("b", "read_file", '{"path": "pkg/calc.py"}')), DONE]
    traj = await run_episode(policy, ws, "read calc")
    assert traj.stop_reason == "done" and len(traj.turns) == 2 and traj.final_message == "Done."
    dropped, read = traj.turns[0].tool_calls
    assert dropped.format_error and "no function" in dropped.result and dropped.arguments == bad
    assert "def add" in read.result
    assert fake.refused == []


@pytest.mark.parametrize(
    "arguments,said",
    [('{"path": "pkg/calc.py"', "not valid JSON"), ("[1, 2]", "got list"), ('"pkg"', "got str"), ("3", "got int")],
    ids=["invalid-json", "array", "string", "number"],
)
async def test_malformed_arguments_are_answered_and_sent_back_as_an_object(ws, endpoint, arguments, said):
    fake, policy = endpoint
    fake.replies = [calls(call("a", "read_file", arguments)), DONE]
    traj = await run_episode(policy, ws, "read calc")
    assert traj.stop_reason == "done" and len(traj.turns) == 2, traj.error
    record = traj.turns[0].tool_calls[0]
    assert record.format_error and said in record.result
    assert record.arguments == (arguments if said == "not valid JSON" else json.loads(arguments))  # as said
    assert fake.refused == []  # a strict server took the next request
    sent = fake.requests[1]["messages"][2]["tool_calls"][0]
    assert sent == {"id": "a", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}


@pytest.mark.parametrize(
    "arguments",
    ["[" * 5000 + "]" * 5000, json.dumps({"a": json.loads("[" * 40 + "]" * 40)})],
    ids=["past-json", "deep"],
)
async def test_arguments_nested_too_deep_are_answered_not_the_end_of_the_episode(ws, endpoint, arguments):
    """A RecursionError out of decoding such arguments ended the episode: now an error result."""
    fake, policy = endpoint
    fake.replies = [calls(call("a", "read_file", arguments), call("b", "read_file", '{"path": "pkg/calc.py"}')), DONE]
    traj = await run_episode(policy, ws, "read calc")
    assert traj.stop_reason == "done" and len(traj.turns) == 2, traj.error
    deep, read = traj.turns[0].tool_calls
    assert deep.format_error and "nested too deep" in deep.result and "def add" in read.result
    assert fake.refused == [] and traj.format_errors == 1


async def test_repeated_call_ids_are_made_unique(ws, endpoint):
    fake, policy = endpoint
    fake.replies = [calls(call("a", "list_dir", "{}"), call("a", "read_file", '{"path": "README.md"}')), DONE]
    traj = await run_episode(policy, ws, "look")
    assert traj.stop_reason == "done" and fake.refused == [], traj.error
    first, second = traj.turns[0].tool_calls
    assert first.id == "a" and second.id not in ("a", "") and "# demo" in second.result
    answered = [m["tool_call_id"] for m in fake.requests[1]["messages"] if m["role"] == "tool"]
    assert answered == [first.id, second.id]


def test_call_ids_keep_the_servers_where_unique():
    from vivace.harness.policies import _call_ids

    raw = [{"id": "call_1"}, {}, {"id": None}, {"id": "call_1"}, {"id": 7}, {"id": ["x"]}, "?", {"id": "x"}]
    ids = _call_ids(raw)
    assert ids[0] == "call_1" and ids[-1] == "x" and len(set(ids)) == len(ids)
    assert all(isinstance(i, str) and i for i in ids)
    t0 = time.perf_counter()  # 40,000 calls without ids: 10 s when taken ids were searched in a list
    assert len(set(_call_ids([{}] * 40_000))) == 40_000 and time.perf_counter() - t0 < 1.0


async def test_tool_call_markup_left_in_content_is_parsed_not_taken_for_the_answer(ws, endpoint):
    # vLLM's hermes parser passes a turn on as plain text when one block is broken (or when the
    # server runs without a tool parser): the calls must still run or be answered with an error.
    fake, policy = endpoint
    broken = '<tool_call>\n{"name": "read_file", "arguments": {"path": "pkg/calc.py"}\n</tool_call>'
    good = 'Reading.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "pkg/calc.py"}}\n</tool_call>'
    fake.replies = [completion({"content": broken}), completion({"content": good}), DONE]
    traj = await run_episode(policy, ws, "read calc")
    assert traj.stop_reason == "done" and len(traj.turns) == 3 and traj.final_message == "Done."
    assert traj.turns[0].tool_calls[0].format_error and "not valid JSON" in traj.turns[0].tool_calls[0].result
    assert traj.turns[1].content == "Reading." and "def add" in traj.turns[1].tool_calls[0].result
    assert fake.refused == []


async def test_an_answer_that_names_the_tool_call_tag_stays_the_answer(ws, endpoint):
    fake, policy = endpoint
    fake.replies = [completion({"content": "The parser now rejects a nested `<tool_call>` tag."})]
    traj = await run_episode(policy, ws, "fix the parser")
    assert traj.stop_reason == "done" and traj.final_message.endswith("nested `<tool_call>` tag.")


async def test_call_cut_off_by_the_token_limit_says_so(ws, endpoint):
    fake, policy = endpoint
    fake.replies = [calls(call("a", "read_file", '{"path": "pkg/ca'), finish_reason="length"), DONE]
    traj = await run_episode(policy, ws, "read calc")
    assert traj.stop_reason == "done" and traj.turns[0].finish_reason == "length"
    assert "cut off by the token limit" in traj.turns[0].tool_calls[0].result


async def test_null_arguments_mean_no_arguments(endpoint):
    fake, policy = endpoint
    fake.replies = [calls(call("a", "list_dir", None), {"id": "b", "type": "function", "function": {"name": "grep"}})]
    reply = await policy.act(conversation())
    assert [(c.name, c.arguments, c.error) for c in reply.message.tool_calls] == [
        ("list_dir", {}, None),
        ("grep", {}, None),
    ]


# --- odd but valid replies ----------------------------------------------------------------------


ODD_REPLIES = {
    "content-null-with-calls": calls(call("a", "list_dir", "{}")),
    "arguments-empty-string": calls(call("a", "list_dir", "")),
    "arguments-an-object": calls(call("a", "list_dir", {"path": "pkg"})),
    "ids-missing": calls(
        {"type": "function", "function": {"name": "list_dir", "arguments": "{}"}},
        {"id": None, "type": "function", "function": {"name": "list_dir", "arguments": '{"path": "pkg"}'}},
    ),
    "finish-reason-null": calls(call("a", "list_dir", "{}"), finish_reason=None),
    "name-missing": calls({"id": "a", "type": "function", "function": {"arguments": "{}"}}),
    "name-null": calls(call("a", None, "{}")),
    "unknown-tool": calls(call("a", "rm_rf", "{}")),
}


@pytest.mark.parametrize("reply", ODD_REPLIES.values(), ids=ODD_REPLIES.keys())
async def test_odd_replies_go_on_and_every_request_is_strictly_valid(ws, endpoint, reply):
    fake, policy = endpoint
    fake.replies = [reply, DONE]
    traj = await run_episode(policy, ws, "look")
    assert traj.stop_reason == "done" and len(traj.turns) == 2 and traj.error is None, traj.error
    records = traj.turns[0].tool_calls
    assert records and len({r.id for r in records}) == len(records)
    broken = reply["choices"][0]["message"]["tool_calls"][0]["function"].get("name") in (None, "rm_rf")
    assert all(r.format_error == broken for r in records)
    assert fake.refused == []


async def test_content_filter_and_reasoning_are_recorded(endpoint):
    fake, policy = endpoint
    fake.replies = [completion({"content": None, "reasoning_content": "thinking"}, "content_filter")]
    reply = await policy.act(conversation())
    assert (reply.message.content, reply.finish_reason, reply.meta) == ("", "content_filter", {"reasoning": "thinking"})
    fake.replies = [completion({"content": "ok", "reasoning": "newer vLLM's field"})]
    assert (await policy.act(conversation())).meta == {"reasoning": "newer vLLM's field"}


async def test_the_reasoning_an_endpoint_sends_is_kept_in_the_trajectory(ws, endpoint):
    fake, policy = endpoint
    fake.replies = [completion({"content": "Done.", "reasoning_content": "first I looked"})]
    traj = await run_episode(policy, ws, "x")
    assert traj.turns[0].reasoning == "first I looked"


@pytest.mark.parametrize("finish", ["abort", "error"])
async def test_a_reply_the_server_dropped_is_an_error_not_the_answer(ws, endpoint, finish):
    """vLLM and SGLang end a request their engine dropped with finish_reason "abort": the partial
    text ("Now I will edit the fi") was taken for the final answer."""
    fake, policy = endpoint
    fake.replies = [completion({"content": "Now I will edit the fi"}, finish)]
    traj = await run_episode(policy, ws, "x")
    assert traj.stop_reason == "error" and f"finish_reason {finish!r}" in traj.error, traj.error


async def test_a_refusal_is_the_models_answer(ws, endpoint):
    fake, policy = endpoint
    fake.replies = [completion({"content": None, "refusal": "I cannot help with that."})]
    traj = await run_episode(policy, ws, "x")
    assert traj.stop_reason == "done" and traj.final_message == "I cannot help with that."


async def test_lone_surrogates_and_invalid_utf8_in_a_reply_are_read_as_replacement_characters(ws, endpoint):
    """A gateway that cuts a string mid-emoji sends half a UTF-16 pair ("\\ud83d"), or half a UTF-8
    character: one crashed the next request (and the terminal), the other was "not JSON"."""
    fake, policy = endpoint
    half_pair = json.dumps(calls(call("c1", "write_file", json.dumps({"path": "n.txt", "content": "hi \ud83d"})),
                                 content="Writing \ud83d"))  # fmt: skip
    half_utf8 = json.dumps(completion({"content": "Done \u00e9"}), ensure_ascii=False).encode()
    half_utf8 = half_utf8.replace("é".encode(), "é".encode()[:1])
    fake.replies = [
        Response(half_pair, media_type="application/json"),
        Response(half_utf8, media_type="application/json"),
    ]
    traj = await run_episode(policy, ws, "x")
    assert traj.stop_reason == "done" and fake.refused == [], (traj.error, fake.refused)
    assert traj.turns[0].content == "Writing \ufffd" and traj.final_message == "Done \ufffd"
    assert await ws.read_text("n.txt") == "hi \ufffd"


async def test_a_filtered_reply_ends_the_episode_as_an_error_not_an_answer(ws, endpoint):
    fake, policy = endpoint
    fake.replies = [completion({"content": "partial"}, "content_filter")]
    traj = await run_episode(policy, ws, "x")
    assert traj.stop_reason == "error" and "content filter" in traj.error


@pytest.mark.parametrize(
    "usage", [None, {}, {"prompt_tokens": None, "completion_tokens": None}, {"prompt_tokens": "9"}]
)
async def test_usage_missing_or_null_counts_as_zero(ws, endpoint, usage):
    fake, policy = endpoint
    fake.replies = [completion({"content": "Done."}, usage=usage)]
    traj = await run_episode(policy, ws, "x")
    assert traj.stop_reason == "done" and traj.error is None, traj.error
    assert (traj.turns[0].prompt_tokens, traj.turns[0].completion_tokens) == (0, 0)


async def test_no_tools_sends_no_tools_field(ws, endpoint):
    fake, policy = endpoint
    traj = await run_episode(policy, ws, "just answer", tools=[])
    assert traj.stop_reason == "done" and fake.refused == [], traj.error
    assert "tools" not in fake.requests[0]


@pytest.mark.parametrize(("temperature", "sent"), [(0.0, 0.0), (0.7, 0.7), (1.0, None), (None, None)])
async def test_the_engine_temperature_is_sent_unless_it_is_the_apis_default(ws, server, temperature, sent):
    """`vivace bench --model URL#M --temperature 0` sampled at the server's default: the policy sent
    no temperature. The API's own default (1) stays unsent: some models refuse the field."""
    from vivace.config import EngineConfig
    from vivace.harness.policies import load_policy

    fake, url = server
    fake.replies, fake.requests, fake.refused = [DONE], [], []
    engine = EngineConfig() if temperature is None else EngineConfig(temperature=temperature)
    policy = load_policy(f"{url}/v1#fake-1", engine if temperature is not None else None)
    try:
        traj = await run_episode(policy, ws, "just answer")
    finally:
        await policy.aclose()
    assert traj.stop_reason == "done", traj.error
    assert fake.requests[0].get("temperature") == sent and ("temperature" in fake.requests[0]) == (sent is not None)


def test_request_form_for_strict_servers():
    from vivace.harness.policies import _for_api

    history = [
        Message("system", "s"),
        Message("user", "u"),
        Message("assistant", "", (ToolCall("a", "read_file", {"path": "x"}), ToolCall("b", "", "raw", "no name"))),
        Message("tool", "text", tool_call_id="a", name="read_file"),
        Message("tool", "Error: ...", tool_call_id="b", name=""),
    ]
    body = {"messages": [_for_api(m) for m in history], "tools": [{}]}
    assert strict_problems(body) == []
    assert body["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"path": "x"}'
    assert "name" not in body["messages"][3]


# --- a server that answers nothing usable: a clear stop -----------------------------------------


UNUSABLE = {
    "no-choices": ({**DONE, "choices": []}, "returned no choices"),
    "choices-missing": ({"id": "x", "object": "chat.completion"}, "returned no choices"),
    "message-missing": (completion(None), "choice has no message"),
    "message-null": ({**DONE, "choices": [{"index": 0, "message": None, "finish_reason": "stop"}]}, "has no message"),
    "error-object-200": (
        {"error": {"message": "upstream overloaded", "code": 502}},
        "with an error: upstream overloaded",
    ),
    "a-json-list": ([DONE], "answered a JSON list"),
    "html": (Response("<html>Bad Gateway</html>", media_type="text/html"), "answer is not JSON (HTTP 200, text/html"),
    "broken-json": (Response('{"choices": [', media_type="application/json"), "answer is not JSON"),
}


@pytest.mark.parametrize("reply,said", UNUSABLE.values(), ids=UNUSABLE.keys())
async def test_unusable_answer_ends_the_episode_with_a_clear_error(ws, endpoint, reply, said):
    fake, policy = endpoint
    fake.replies = [calls(call("a", "list_dir", "{}")), reply]
    traj = await run_episode(policy, ws, "look")
    assert traj.stop_reason == "error" and said in traj.error and traj.error.startswith("fake: "), traj.error
    assert len(traj.turns) == 1 and traj.turns[0].tool_calls[0].name == "list_dir"  # the turn before is kept


def _status(code: int, message: str, retry_after: str | None = None) -> JSONResponse:
    headers = {"Retry-After": retry_after} if retry_after is not None else None
    return JSONResponse({"error": {"message": message, "type": "server_error"}}, code, headers)


@pytest.mark.parametrize("code", [429, 500, 503])
async def test_transient_errors_are_retried_then_end_the_episode(ws, endpoint, code):
    fake, policy = endpoint
    fake.replies = [_status(code, "busy", retry_after="0.05")]
    traj = await run_episode(policy, ws, "x")
    assert len(fake.requests) == 3  # the first try and the client's two retries
    assert traj.stop_reason == "error" and f"HTTP {code}" in traj.error and "after 3 attempts: busy" in traj.error


async def test_retry_with_backoff_recovers(ws, endpoint):
    fake, policy = endpoint
    fake.replies = [_status(503, "loading"), _status(429, "slow down", retry_after="0.1"), DONE]
    t0 = time.monotonic()
    traj = await run_episode(policy, ws, "x")
    assert traj.stop_reason == "done" and len(fake.requests) == 3
    assert time.monotonic() - t0 >= 0.4  # backed off: ~0.5 s, then the 0.1 s the server asked for


@pytest.mark.parametrize(
    "headers, said",
    [
        (lambda: {"Retry-After": "3600"}, "3600"),
        (lambda: {"retry-after-ms": "500000"}, "500"),
        # an HTTP date a day ahead, made when the test runs (at collection it was minutes stale on a slow CI)
        (lambda: {"Retry-After": email.utils.formatdate(time.time() + 86400, usegmt=True)}, r"86[34]\d\d"),
    ],
)
async def test_retry_after_beyond_what_the_client_waits_is_not_waited_for(endpoint, headers, said):
    """In each form the client honours; the HTTP date and milliseconds forms went unexplained."""
    fake, policy = endpoint
    fake.replies = [JSONResponse({"error": {"message": "maintenance", "type": "server_error"}}, 503, headers())]
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=f"after 1 attempt .*retry after {said} s.*not retried"):
        await policy.act(conversation())
    assert len(fake.requests) == 1 and time.monotonic() - t0 < 2


@pytest.mark.parametrize(
    "said",
    [
        "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens "
        "(35904 in the messages, 4096 in the completion).",  # vLLM
        "The input (40000 tokens) is longer than the model's context length (32768 tokens).",  # SGLang
        "the request exceeds the available context size, try increasing it",  # llama.cpp
    ],
)
async def test_context_overflow_ends_the_episode_at_once_with_a_clear_reason(ws, endpoint, said):
    fake, policy = endpoint
    fake.replies = [calls(call("a", "list_dir", "{}")), JSONResponse({"object": "error", "message": said}, 400)]
    traj = await run_episode(policy, ws, "x")
    assert len(fake.requests) == 2 and len(traj.turns) == 1  # a 400 is not retried
    assert traj.stop_reason == "max_tokens" and "no longer fits the model's context window" in traj.error
    assert said[:40] in traj.error


@pytest.mark.parametrize(
    ("status", "said", "kind"),
    [
        (400, "the prompt has 9000 tokens; the context is 8192", "ContextFull"),  # vivace serve
        (400, "the prompt has at least 9000 tokens (3 messages); the model's context is 8192", "ContextFull"),
        (400, "This model's maximum context length is 32768 tokens.", "ContextFull"),  # vLLM
        (400, "temperature must be non-negative", "PolicyError"),
        (503, "maximum context length", "PolicyUnavailable"),  # the server failed, whatever it says
    ],
)
def test_a_refusal_over_the_context_is_the_episodes_limit(status, said, kind):
    """A server's refusal of a prompt over the context (vivace serve words it "the context is N") is
    ContextFull, which the loop ends as max_tokens; other refusals stay the policy's errors."""
    from vivace.harness.policy import http_failure

    assert type(http_failure(f"sampler at http://x/v1 answered HTTP {status}: {said}", status)).__name__ == kind


async def test_timeout_is_retried_a_bounded_number_of_times(ws, server):
    fake, url = server
    fake.replies, fake.requests, fake.refused = [lambda: asyncio.sleep(1.5)], [], []
    policy = OpenAIPolicy(f"{url}/v1", "fake-1", name="fake", timeout_s=0.2)
    t0 = time.monotonic()
    traj = await run_episode(policy, ws, "x")
    await policy.aclose()
    assert traj.stop_reason == "error" and "APITimeoutError after 3 attempts" in traj.error
    assert len(fake.requests) == 3 and time.monotonic() - t0 < 6


async def test_episode_wall_clock_bounds_a_slow_endpoint(ws, server):
    fake, url = server
    fake.replies, fake.requests, fake.refused = [lambda: asyncio.sleep(1.5)], [], []
    t0 = time.monotonic()
    policy = OpenAIPolicy(f"{url}/v1", "fake-1", name="fake")
    traj = await run_episode(policy, ws, "x", AgentConfig(max_wall_s=0.5))
    await policy.aclose()
    assert traj.stop_reason == "timeout" and time.monotonic() - t0 < 2


async def test_redirects(endpoint):
    fake, policy = endpoint
    fake.replies = [RedirectResponse("/moved/v1/chat/completions", 307)]  # keeps the POST: followed
    assert (await policy.act(conversation())).message.content == "Done."
    fake.replies = [RedirectResponse("/moved/v1/chat/completions", 302)]  # turns it into a GET
    with pytest.raises(PolicyError, match="HTTP 405.*redirected to http://.*/moved/v1/chat/completions"):
        await policy.act(conversation())


@pytest.mark.parametrize(
    "models,said",
    [([], "lists no models"), (["a", "b"], "lists a, b"), ([{"object": "model"}], "lists None")],
    ids=["none", "two", "no-id"],
)
async def test_model_must_be_named_unless_the_server_lists_exactly_one(models, said):
    app = FastAPI()
    app.get("/v1/models")(lambda: {"object": "list", "data": [m if isinstance(m, dict) else {"id": m} for m in models]})
    background = BackgroundServer(app).start()
    policy = OpenAIPolicy(f"{background.url}/v1", None, name="fake")
    try:
        with pytest.raises(PolicyError, match=f"{said}; name the model as URL#MODEL"):
            await policy.act(conversation())
    finally:
        await policy.aclose()
        background.stop(10)


async def test_an_endpoint_that_cannot_be_reached_is_said_to_be_unreachable_not_unnamed():
    """A server that was down got "could not list models: APIConnectionError …; name the model as
    URL#MODEL", as if naming the model would help."""
    with socket.socket() as held:  # a port nothing listens on
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
    policy = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", None, name="down", max_retries=0)
    try:
        with pytest.raises(PolicyUnavailable) as raised:
            await policy.act(conversation())
    finally:
        await policy.aclose()
    said = str(raised.value)
    assert "could not list models: APIConnectionError" in said and "URL#MODEL" not in said
    assert (
        f"the endpoint is unreachable: check the URL, or start the server (e.g. `vivace serve --model tiny --port {port}`)"
        in said
    )


@pytest.mark.parametrize(
    ("status", "unavailable"), [(503, True), (500, True), (429, True), (408, True), (400, False), (404, False)]
)
def test_a_server_failing_on_its_side_is_unavailable_and_a_refusal_is_not(status, unavailable):
    """Benchmarks count an episode whose endpoint was down or kept failing as an error, apart from
    success, and run it again on resume; a request the server refused (a context overflow: 400) is
    the model's episode."""
    import httpx
    import openai

    from vivace.harness.policy import PolicyUnavailable

    request = httpx.Request("POST", "http://x/v1/chat/completions")
    response = httpx.Response(status, request=request, json={"error": {"message": "maximum context length"}})
    failure = openai.APIStatusError(f"Error code: {status}", response=response, body=None)
    policy = OpenAIPolicy("http://x/v1", "m", "http://x/v1#m", max_retries=0)

    async def fail(**kw):
        raise failure

    policy.client.chat.completions.with_raw_response.create = fail
    conversation = Conversation(messages=[Message("user", "hi")], tools=[])
    with pytest.raises(PolicyError) as raised:
        asyncio.run(policy.act(conversation))
    assert isinstance(raised.value, PolicyUnavailable) is unavailable
    timeout = openai.APITimeoutError(request=request)  # no HTTP answer at all

    async def hang(**kw):
        raise timeout

    policy.client.chat.completions.with_raw_response.create = hang
    with pytest.raises(PolicyUnavailable):
        asyncio.run(policy.act(conversation))


def _cards_server(cards: Any, replies: list[dict]) -> tuple[BackgroundServer, list[str]]:
    """A server listing `cards` (a body, or a status to answer) and replying `replies` in turn; the paths
    it was asked, in order."""
    app, asked = FastAPI(), []

    @app.get("/v1/models")
    async def models():
        asked.append("models")
        return JSONResponse({"error": {"message": "no"}}, cards) if isinstance(cards, int) else cards

    @app.post("/v1/chat/completions")
    async def complete():
        asked.append("chat")
        return replies[min(asked.count("chat"), len(replies)) - 1]

    return BackgroundServer(app).start(), asked


@pytest.mark.parametrize(
    "cards, context",
    [
        ({"object": "list", "data": [{"id": "other", "max_model_len": 9}, {"id": "m", "max_model_len": 4096}]}, 4096),
        ({"object": "list", "data": [{"id": "m"}]}, None),  # a hosted API's card: no length
        ({"object": "list", "data": [{"id": "m", "max_model_len": "4096"}]}, None),
        ({"object": "list", "data": [{"id": "m", "max_model_len": True}]}, None),
        ({"object": "list", "data": "m"}, None),
        (404, None),
        (500, None),  # asked once, not retried: the episode goes on with the usual budget
    ],
)
async def test_an_endpoint_policy_learns_its_models_context_from_the_model_card(ws, cards, context):
    """vLLM lists max_model_len with each model: tool results then fit it (3/4 of it in characters), as they
    do for a local checkpoint. Asked once per policy, never failing an episode."""
    reads = calls(call("c1", "run_terminal_cmd", json.dumps({"command": "seq -f %050g 1 300"})))
    background, asked = _cards_server(cards, [reads, DONE])
    policy = OpenAIPolicy(f"{background.url}/v1", "m", name="fake", timeout_s=5.0)
    try:
        traj = await run_episode(policy, ws, "x", AgentConfig(max_turns=3))
        again = await run_episode(policy, ws, "x", AgentConfig(max_turns=3))
    finally:
        await policy.aclose()
        background.stop(10)
    assert traj.stop_reason == again.stop_reason == "done", (traj.error, again.error)
    assert policy.context_tokens == context and asked.count("models") == 1, asked
    result = traj.turns[0].tool_calls[0].result
    if context is None:
        assert "omitted" not in result and result.endswith("300")  # 15,300 characters: under 20,000
    else:
        assert "characters omitted" in result and len(result) < 3_072 + 300, len(result)


async def test_a_model_card_that_never_answers_costs_one_short_wait():
    """GET /models hanging (a proxy that only forwards chat) delays the first turn by CONTEXT_LOOKUP_S, once."""
    from vivace.harness import policies

    app, asked = FastAPI(), []

    @app.get("/v1/models")
    async def models():
        asked.append("models")
        await asyncio.sleep(4)  # past the lookup's 0.5 s; short, as stopping the server waits for it

    app.post("/v1/chat/completions")(lambda: DONE)
    background = BackgroundServer(app).start()
    policy = OpenAIPolicy(f"{background.url}/v1", "m", name="fake", timeout_s=20.0)
    old, policies.CONTEXT_LOOKUP_S = policies.CONTEXT_LOOKUP_S, 0.5
    try:
        start = time.monotonic()
        await asyncio.gather(*(policy.act(conversation()) for _ in range(3)))
        first = time.monotonic() - start
        await policy.act(conversation())
    finally:
        policies.CONTEXT_LOOKUP_S = old
        await policy.aclose()
        background.stop(10)
    assert policy.context_tokens is None and asked == ["models"]  # asked once, for all four turns
    assert 0.5 <= first < 3.5, first  # the lookup's own timeout, not the client's (20 s) or the server's (4 s)
