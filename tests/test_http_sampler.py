"""HttpSampler (`--model tokens:URL#MODEL`) against a fake /v1/completions server that answers what
a broken or overloaded server answers: errors are one line, a server that fails on its side is
retried and then counts as unavailable (not as the model's failure), and a malformed reply is
refused instead of trained on. The happy path against `vivace serve` is in test_serve.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from vivace.harness.agent import run_episode
from vivace.harness.policy import PolicyError, PolicyUnavailable, SamplingParams, TokenPolicy
from vivace.inference.http_sampler import HttpSampler
from vivace.inference.samplers import token_policy

# An answer is (status, body, headers): body a dict/list (sent as JSON) or bytes (sent as is).
Answer = tuple[int, Any, dict[str, str]]
STOP = 9
PARAMS = SamplingParams(max_tokens=8, stop_token_ids=(STOP,))


def ok(ids=(5, 6, STOP), logprobs=(-0.1, -0.2, -0.3), **choice) -> Answer:
    return 200, {"choices": [{"token_ids": list(ids), "logprobs": {"token_logprobs": list(logprobs)},
                              "finish_reason": "stop", **choice}]}, {}  # fmt: skip


def status(code: int, **headers: str) -> Answer:
    return code, {"error": {"message": f"said {code}\nover two lines", "code": code}}, headers


class Fake:
    """A /v1/completions server whose answers the test sets; it records each request body."""

    def __init__(self) -> None:
        self.answers: list[Answer | Callable[[], Answer]] = []  # the last one repeats
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                fake.requests.append(
                    {"path": self.path, **json.loads(self.rfile.read(int(self.headers["content-length"])))}
                )
                answer = fake.answers[min(len(fake.requests), len(fake.answers)) - 1]
                code, body, headers = answer() if callable(answer) else answer
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                for k, v in {"content-type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting (a timeout test)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def server():
    fake = Fake()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def fake(server):
    server.answers, server.requests = [ok()], []
    return server


@pytest.fixture
async def sampler(fake):
    s = HttpSampler(fake.url, "tiny", timeout_s=5.0)
    s.vocab_size, s.retry_wait_s = 100, 0.01
    yield s
    await s.aclose()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


async def test_a_well_formed_reply_is_read_as_sent(sampler, fake):
    fake.answers = [ok(policy_version=4)]
    out = await sampler.generate([1, 2], PARAMS)
    assert out.token_ids == [5, 6, STOP] and out.logprobs == [-0.1, -0.2, -0.3]
    assert out.finish_reason == "stop" and out.policy_version == 4
    sent = fake.requests[0]
    assert sent["path"] == "/v1/completions" and sent["prompt"] == [1, 2] and sent["stop_token_ids"] == [STOP]
    assert sent["logprobs"] == 1 and sent["return_token_ids"] is True  # 1: SGLang returns none at 0


@pytest.mark.parametrize("code", [500, 502, 503, 429, 408])
async def test_a_server_failing_on_its_side_is_retried_then_unavailable(sampler, fake, code):
    fake.answers = [status(code)]
    with pytest.raises(PolicyUnavailable) as e:
        await sampler.generate([1], PARAMS)
    assert len(fake.requests) == 3  # 1 + max_retries
    message = str(e.value)
    assert "\n" not in message and f"HTTP {code}" in message and "after 3 attempts" in message
    assert "said" in message  # the server's own message, in one line


async def test_a_passing_failure_is_retried_and_the_turn_goes_on(sampler, fake):
    fake.answers = [status(503), status(429, **{"retry-after": "0.2"}), ok()]
    start = time.monotonic()
    out = await sampler.generate([1], PARAMS)
    assert out.token_ids == [5, 6, STOP] and len(fake.requests) == 3
    assert time.monotonic() - start >= 0.2  # Retry-After was honoured


async def test_a_retry_after_longer_than_a_minute_is_not_waited_for(sampler, fake):
    fake.answers = [status(429, **{"retry-after": "3600"})]
    with pytest.raises(PolicyUnavailable):
        await sampler.generate([1], PARAMS)
    assert len(fake.requests) == 1


@pytest.mark.parametrize("code", [400, 404, 422])
async def test_a_refused_request_is_the_models_error_and_not_retried(sampler, fake, code):
    fake.answers = [status(code)]
    with pytest.raises(PolicyError) as e:
        await sampler.generate([1], PARAMS)
    assert not isinstance(e.value, PolicyUnavailable) and len(fake.requests) == 1
    assert "\n" not in str(e.value) and f"HTTP {code}" in str(e.value)


async def test_a_404_without_v1_says_where_the_api_is(fake):
    fake.answers = [status(404)]
    sampler = HttpSampler(fake.url.removesuffix("/v1"), "tiny")
    try:
        with pytest.raises(PolicyError, match=r"under /v1: tokens:http://HOST:PORT/v1#MODEL"):
            await sampler.generate([1], PARAMS)
    finally:
        await sampler.aclose()


async def test_an_unreachable_server_is_unavailable_and_says_what_to_do():
    sampler = HttpSampler(closed_port_url(), "tiny")
    sampler.retry_wait_s = 0.01
    try:
        with pytest.raises(PolicyUnavailable) as e:
            await sampler.generate([1], PARAMS)
    finally:
        await sampler.aclose()
    message = str(e.value)
    assert "\n" not in message and "unreachable after 3 attempts" in message and "ConnectError" in message
    assert "start the server there" in message


async def test_a_slow_reply_times_out_once_and_is_unavailable(fake):
    fake.answers = [lambda: (time.sleep(1.5), ok())[1]]
    sampler = HttpSampler(fake.url, "tiny", timeout_s=0.3)
    try:
        with pytest.raises(PolicyUnavailable, match=r"did not answer within 0.3 s \(ReadTimeout\)"):
            await sampler.generate([1], PARAMS)
    finally:
        await sampler.aclose()
    assert len(fake.requests) == 1  # not retried: it would wait as long (a wall-clock bound here could flake)


def choice(**fields) -> Answer:
    return 200, {"choices": [{"finish_reason": "stop", **fields}]}, {}


def lp(*values) -> dict:
    return {"token_logprobs": list(values)}


MALFORMED = {
    "html": ((200, b"<html><body>\n<h1>Bad gateway</h1></body></html>", {"content-type": "text/html"}), "not JSON"),
    "a JSON list": ((200, [1, 2], {}), "no completion choice"),
    "an error object": ((200, {"error": {"message": "upstream\nfailed"}}, {}), "answered with an error: upstream"),
    "no choices": ((200, {"choices": []}, {}), "no completion choice"),
    "no token ids": (choice(text="hi", logprobs=lp(-0.1)), "no token ids"),
    "no logprobs": (choice(token_ids=[5, 6]), "2 token ids but 0 logprobs"),
    "too few logprobs": (choice(token_ids=[5, 6], logprobs=lp(-0.1)), "2 token ids but 1 logprobs"),
    "a null logprob": (choice(token_ids=[5, 6], logprobs=lp(None, -0.1)), "not finite"),
    "a NaN logprob": ((200, b'{"choices": [{"token_ids": [5], "logprobs": {"token_logprobs": [NaN]}}]}', {}),
                      "not finite"),
    "a positive logprob": (choice(token_ids=[5, 6], logprobs=lp(-0.1, 0.5)), "logprob above 0"),
    "a string id": (choice(token_ids=["5", 6], logprobs=lp(-0.1, -0.2)), "not a list of integers"),
    "a float id": (choice(token_ids=[5, 6.7], logprobs=lp(-0.1, -0.2)), "not a list of integers"),
    "a negative id": (choice(token_ids=[5, -1], logprobs=lp(-0.1, -0.2)), "outside the model's vocabulary"),
    "an id past the vocabulary": (choice(token_ids=[5, 100], logprobs=lp(-0.1, -0.2)), "vocabulary [0, 100)"),
    "longer than asked": (choice(token_ids=list(range(10)), logprobs=lp(*[-0.1] * 10)), "max_tokens was 8"),
    "past the stop token": (choice(token_ids=[5, STOP, 6], logprobs=lp(-0.1, -0.2, -0.3)), "ignored stop_token_ids"),
    "a string version": ((200, {"policy_version": "v2", **ok()[1]}, {}), "policy_version 'v2'"),
}  # fmt: skip


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
async def test_a_malformed_reply_is_refused_not_trained_on(sampler, fake, case):
    answer, words = MALFORMED[case]
    fake.answers = [answer]
    with pytest.raises(PolicyError) as e:
        await sampler.generate([1], PARAMS)
    assert not isinstance(e.value, PolicyUnavailable) and len(fake.requests) == 1
    assert words in str(e.value) and "\n" not in str(e.value)


async def test_an_empty_reply_needs_no_logprobs_and_an_aborted_one_is_unavailable(sampler, fake):
    fake.answers = [choice(token_ids=[], finish_reason="length")]
    out = await sampler.generate([1], PARAMS)
    assert out.token_ids == [] and out.logprobs == [] and out.finish_reason == "length"
    fake.answers = [ok(finish_reason="abort")]  # vLLM/SGLang dropped the request: not the model's doing
    with pytest.raises(PolicyUnavailable, match="aborted"):
        await sampler.generate([1], PARAMS)


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1:8000/v1", "127.0.0.1:8000/v1", "http:///v1", "localhost:8000", "http://[::1/v1"]
)
def test_a_url_that_is_not_http_is_refused_up_front(url):
    with pytest.raises(ValueError, match=r"tokens:http://HOST:PORT/v1#MODEL"):
        HttpSampler(url, "tiny")


def test_token_policy_checks_the_url_and_knows_the_vocabulary():
    with pytest.raises(ValueError, match="http:// or https://"):
        token_policy("tokens:ftp://127.0.0.1:8000/v1#tiny")
    policy = token_policy("tokens:http://127.0.0.1:8000/v1/#tiny")
    assert policy.sampler.base_url == "http://127.0.0.1:8000/v1"  # a trailing slash is fine
    assert policy.sampler.vocab_size == len(policy.chat.tokenizer)  # tiny: its config's vocab_size


async def test_an_unreachable_sampler_ends_the_episode_as_unavailable(plain_ws, chat_format):
    sampler = HttpSampler(closed_port_url(), "tiny")
    sampler.retry_wait_s = 0.01
    traj = await run_episode(TokenPolicy(sampler, chat_format, name="tokens:down"), plain_ws, "fix it")
    await sampler.aclose()
    assert traj.stop_reason == "error" and traj.unavailable and "unreachable" in traj.error


async def test_a_malformed_reply_ends_the_episode_as_the_models_error(plain_ws, chat_format, fake):
    fake.answers = [choice(token_ids=[5, 10**9], logprobs=lp(-0.1, -0.2))]
    sampler = HttpSampler(fake.url, "tiny", vocab_size=len(chat_format.tokenizer))
    traj = await run_episode(TokenPolicy(sampler, chat_format, name="tokens:fake"), plain_ws, "fix it")
    await sampler.aclose()
    assert traj.stop_reason == "error" and not traj.unavailable and "vocabulary" in traj.error
    assert traj.turns == [] and traj.tokens is not None and not any(traj.tokens.loss_mask)  # nothing to train on
