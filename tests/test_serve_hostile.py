"""`vivace serve` against hostile clients: input that reached the tokenizer, the template's recursion
or torch's seeding (a 500, or a stream cut off after its 200), a stop string that stalled every
request, a waiter leaving at the moment its request finished (the engine's thread died, and every
later request waited forever), and clients that leave mid-generation or while queued (nothing of
theirs may stay in the engine). The tiny model behind the real server, or the scripted engine of
test_serve_wire where a reply must be known or a failure injected."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from test_serve_wire import CHAT, USER, ScriptedEngine, openai_client, says
from vivace.config import EngineConfig
from vivace.harness.policy import SamplingParams
from vivace.inference.engine import Request
from vivace.inference.samplers import local_engine
from vivace.inference.server import create_app
from vivace.sandbox.background import BackgroundServer


@pytest.fixture(scope="module")
def tiny():
    """(url, engine): the tiny model served over HTTP, four sequences at a time."""
    engine, chat_format = local_engine("tiny", EngineConfig(max_batch=4, device="cpu"))
    server = BackgroundServer(create_app(engine, chat_format, "tiny")).start()
    yield server.url, engine
    server.stop()
    engine.close()


def chat(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={"model": "tiny", "max_tokens": 2, **body}, timeout=30)


def metrics_once(url: str, ready, timeout: float = 5) -> dict:
    """The engine's metrics once `ready(metrics)` (or the timeout): a client that left is let go at the
    engine's next step, a whole reply's client is found gone within a quarter second."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = httpx.get(f"{url}/metrics").json()
        if ready(metrics) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.02)


def idle(url: str) -> dict:
    return metrics_once(url, lambda m: m["running"] == m["waiting"] == 0)


def greedy(url: str) -> str:
    return chat(url, {"messages": USER, "temperature": 0, "max_tokens": 8}).json()["choices"][0]["message"]["content"]


ARGS = '{"a": "\\ud800"}'  # the arguments string a client sends: JSON whose string escapes a lone surrogate


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        ("chat/completions", '{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0]"),
        ("chat/completions", '{"messages": [{"role": "user", "content": "a\\udfff"}], "stream": true}', "messages[0]"),
        ("chat/completions", '{"messages": [{"role": "user", "content": "x"}], "tools": '
                 '[{"type": "function", "function": {"name": "\\udc00"}}]}', "tools[0]"),
        ("chat/completions", '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": '
                 '[{"id": "a", "type": "function", "function": {"name": "f", "arguments": ' + json.dumps(ARGS)
                 + "}}]}]}", "messages[1]"),
        ("completions", '{"prompt": "a\\ud800"}', "prompt"),
    ],
    ids=["content", "streamed", "tool-name", "call-arguments", "completion-prompt"],
)  # fmt: skip
def test_a_lone_surrogate_is_a_400_naming_where(tiny, path, body, where):
    """JSON can escape half a surrogate pair; no UTF-8 spells one, so the tokenizer raised a TypeError (a 500)."""
    url, _ = tiny
    content = '{"model": "tiny", "max_tokens": 2, ' + body[1:]
    r = httpx.post(f"{url}/v1/{path}", content=content.encode(),
                   headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(f"{where}: ") and "lone surrogate" in r.text
    assert chat(url, {"messages": [{"role": "user", "content": "a\U0001f642b"}]}).status_code == 200  # a pair is fine


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": nested(600)}}]},
         "tools[0]: arrays and objects nested over 64 deep"),
        ({"messages": [*USER, {"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
          "function": {"name": "f", "arguments": nested(600)}}]}]}, "messages[1]: arrays and objects"),
    ],
    ids=["tool-schema", "call-arguments"],
)  # fmt: skip
def test_deep_nesting_is_a_400(tiny, body, words):
    """Nesting the JSON parser takes but the template's recursion does not was a RecursionError (a 500)."""
    url, _ = tiny
    r = chat(url, {"messages": USER, **body})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    ok = {"type": "function", "function": {"name": "f", "parameters": nested(60)}}
    assert chat(url, {"messages": USER, "tools": [ok]}).status_code == 200


@pytest.mark.parametrize(
    "arguments",
    [json.dumps(nested(600)), "[" * 900 + "]" * 900, "[" * 5000 + "]" * 5000],
    ids=["deep", "deep-list", "past-json"],  # a list decodes on every Python; 5,000 deep, from 3.12 on
)
def test_a_past_calls_arguments_too_deep_to_take_are_rendered_as_their_text(tiny, arguments):
    """Arguments (a JSON string) nested too deep to decode, or to render as JSON, are a malformed call, as
    any arguments that do not parse: the template writes their text as the client sent it (the model
    reads what it wrote), where they were a 400 (or, past json's recursion, a RecursionError)."""
    url, _ = tiny
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": arguments}}
    r = chat(url, {"messages": [*USER, {"role": "assistant", "tool_calls": [call]}], "max_tokens": 1})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_a_seed_outside_int64_is_a_400_naming_it(tiny, seed, stream):
    """torch seeds from int64 (uint64): past it the stream was cut off after its 200, the whole reply
    a 400 saying only "Overflow when unpacking long long"."""
    url, _ = tiny
    r = chat(url, {"messages": USER, "seed": seed, "stream": stream})
    assert r.status_code == 400 and "seed" in r.json()["error"]["message"], r.text
    assert chat(url, {"messages": USER, "seed": 2**63 - 1, "stream": stream}).status_code == 200


def test_a_stop_string_too_long_to_check_per_token_is_refused():
    """A streamed reply holds back what may begin a stop string, checked each token in time quadratic
    in its length: a 200,000-character stop made another client's 5-token request take 4.9 s (the
    event loop busy), and 4 MB (the body cap) would stall the server for hours."""
    engine = ScriptedEngine()
    says(engine, "ok")
    client = TestClient(create_app(engine, CHAT, "m"))
    for path, body in (
        ("/v1/chat/completions", {"messages": USER, "stream": True}),
        ("/v1/completions", {"prompt": [1]}),
    ):
        r = client.post(path, json={"model": "m", **body, "stop": ["ok", "x" * 1001]})
        assert r.status_code == 400 and "at most 1000 characters" in r.json()["error"]["message"]
        assert client.post(path, json={"model": "m", **body, "stop": ["x" * 1000]}).status_code == 200


async def test_a_waiter_leaving_as_its_request_finishes_does_not_stop_the_engine(monkeypatch):
    """The engine's thread checks a request's future is not done, then sets its result; a waiter that
    leaves cancels the future from its event loop's thread, which can land between the two. Setting a
    cancelled future raises, which ended the engine's thread: every later request waited forever."""
    engine, _ = local_engine("tiny", EngineConfig(max_batch=2, device="cpu"))
    try:
        completion = Request.completion

        def cancelled_meanwhile(self: Request):  # the waiter's cancel, landing after the done() check
            self.future.cancel()
            return completion(self)

        monkeypatch.setattr(Request, "completion", cancelled_meanwhile)
        with pytest.raises(asyncio.CancelledError):
            await engine.generate([5, 6, 7], SamplingParams(max_tokens=1))
        monkeypatch.undo()
        done = await asyncio.wait_for(engine.generate([5, 6, 7], SamplingParams(max_tokens=3)), timeout=10)
        assert len(done.token_ids) == 3
    finally:
        engine.close()


async def test_submitting_and_reading_the_load_never_wait_for_the_engines_steps():
    """Both took the lock the engine's thread holds through each step (a long prefill chunk on a large
    model) and takes back at once after one, so an event loop submitting a request (every request) or
    reading the load (/metrics, the replica router) waited out the step in progress, often many: up
    to 8 s with the tiny model busy. Here each step takes 0.5 s: waiting out the rest of one would pass the
    0.25 s bound in 10 tries with odds of 1,023 in 1,024, and a loaded machine has room below it."""
    engine, _ = local_engine("tiny", EngineConfig(max_batch=8, device="cpu"))
    step = engine.engine.step

    def slow_step():
        time.sleep(0.5)
        return step()

    engine.engine.step = slow_step
    busy = asyncio.ensure_future(engine.generate([5, 6, 7], SamplingParams(max_tokens=1000)))
    try:
        while engine.metrics()["running"] < 1:
            await asyncio.sleep(0.01)
        waits = []
        for i in range(10):
            start = time.perf_counter()
            engine.load() if i % 2 else engine._submit([5], SamplingParams(max_tokens=1), None)
            waits.append(round(time.perf_counter() - start, 3))
            await asyncio.sleep(0.03)
        assert max(waits) < 0.25, waits
    finally:
        busy.cancel()
        await asyncio.gather(busy, return_exceptions=True)
        engine.close()


def test_a_stream_that_fails_ends_with_an_error_event():
    """Past its 200 a failing stream was cut off (the client saw a dropped connection); now it ends with
    an error event, which the openai client raises as the server's error, as it does for vLLM's."""
    engine = ScriptedEngine()
    says(engine, "Hello world")
    stream = engine.stream

    async def failing(prompt, sp, top_logprobs=0):
        async for item in stream(prompt, sp, top_logprobs):
            yield item
            raise RuntimeError("generation failed: the device ran out of memory")

    engine.stream = failing
    client = TestClient(create_app(engine, CHAT, "m"))
    with pytest.raises(openai.APIError, match="internal error"):
        for _ in openai_client(client).chat.completions.create(model="m", messages=USER, stream=True):
            pass
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True})
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert json.loads(events[-2][6:])["error"]["type"] == "server_error" and events[-1] == "data: [DONE]"


def test_clients_that_leave_anywhere_leave_nothing_behind(tiny):
    """Streams dropped after a few chunks, whole replies given up on, requests given up while queued
    behind a full batch: the engine is back to idle each time, and answers as it did before."""
    url, _ = tiny
    before = greedy(url)
    long = {"model": "tiny", "messages": USER, "max_tokens": 4000}
    for n in (1, 3):
        for _ in range(5):
            with httpx.stream("POST", f"{url}/v1/chat/completions", json={**long, "stream": True, "n": n}) as r:
                events = (line for line in r.iter_lines() if line.startswith("data: "))
                next(events), next(events), next(events)
    # ignore_eos: it runs to the end (sampled at temperature 1, an end token came within 0.3 s once in a full run)
    tokens = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4000, "ignore_eos": True}
    for body in ({**tokens, "stop": ["zzz"], "n": 2}, tokens):  # read as it streams (stop strings), or whole
        for _ in range(3):
            with pytest.raises(httpx.TimeoutException):
                httpx.post(f"{url}/v1/completions", json=body, timeout=0.3)
    assert idle(url)["running"] == 0

    async def queued() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            batch = [asyncio.ensure_future(client.post(f"{url}/v1/completions", json=tokens)) for _ in range(4)]
            try:
                await asyncio.to_thread(metrics_once, url, lambda m: m["running"] == 4)
                behind = [client.post(f"{url}/v1/chat/completions", json={**long, "stream": s}, timeout=0.3)
                          for s in (False, True, False, True)]  # fmt: skip
                results = await asyncio.gather(*behind, return_exceptions=True)
                assert all(isinstance(r, httpx.TimeoutException) for r in results), results
                metrics = await asyncio.to_thread(metrics_once, url, lambda m: m["waiting"] == 0)
                assert (metrics["running"], metrics["waiting"]) == (4, 0)  # dropped before their prefill
            finally:
                for task in batch:
                    task.cancel()
                await asyncio.gather(*batch, return_exceptions=True)

    asyncio.run(queued())
    metrics = idle(url)
    assert (metrics["running"], metrics["waiting"], metrics["in_flight_tokens"]) == (0, 0, 0)
    assert greedy(url) == before
