"""`HttpSampler`: the Sampler of `--model tokens:URL#MODEL`, token-in/token-out over an OpenAI-style
/v1/completions (vLLM, SGLang, `vivace serve`), so a remote server's tokens and logprobs are the
ones the harness records and RL trains on. The checks and retries it makes are in its docstring."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx

from vivace.harness.policy import Completion, PolicyError, PolicyUnavailable, SamplingParams, http_failure

CONNECT_TIMEOUT_S = 10.0  # a host that drops packets fails in seconds, not after the whole read timeout
LONGEST_RETRY_AFTER_S = 60.0  # a server asking for a longer wait is not retried
LOGPROB_SLACK = 1e-3  # a log-probability is <= 0; this much above 0 is taken for rounding


class HttpSampler:
    """Token-in/token-out over HTTP: POST {base_url}/completions with token ids, read ids and logprobs back.

    Asks for what vLLM (`return_token_ids`), SGLang and `vivace serve` understand; a server that
    returns no token ids is refused with a clear error rather than re-tokenizing text. It sends
    `logprobs: 1` because SGLang returns none at 0; vLLM and `vivace serve` report the sampled
    token's logprob at any value, and the one alternative per token that 1 adds is ignored
    (`vivace serve`: a body ~1.7x larger, no measurable slowdown). Mind what the logprobs are:
    `vivace serve` reports them after temperature; vLLM reports the raw model's unless started with
    `--logprobs-mode processed_logprobs`.

    Failures: no answer (refused, dropped mid-reply, no connection in time) and HTTP 408, 429 and
    5xx are retried `max_retries` times with backoff (Retry-After honoured up to a minute), then
    raise PolicyUnavailable: the episode says nothing about the model. A reply that timed out is
    not retried (another try would wait as long), and other statuses raise PolicyError at once.
    A 200 that is not a well-formed completion (not JSON, no choices, token ids that are not ints
    in [0, vocab_size), logprobs missing, not finite or above 0, more tokens than `max_tokens`, a
    stop token before the end) raises PolicyError, so the turn is never trained on.

    Time: per attempt, CONNECT_TIMEOUT_S to connect and `timeout_s` for the reply (nothing is
    streamed, so that is the whole generation). The agent's wall-clock limit bounds a turn too:
    cancelling it closes the connection, and `vivace serve` then drops the generation.
    """

    retry_wait_s = 0.5  # first backoff; doubles per retry

    def __init__(
        self,
        base_url: str,
        model: str,
        timeout_s: float = 600.0,
        max_retries: int = 2,
        vocab_size: int | None = None,
    ):
        url = base_url.rstrip("/")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"sampler URL {base_url!r} is not a URL ({exc}); {_URL_FORM}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"sampler URL {base_url!r}: give http:// or https:// and a host; {_URL_FORM}")
        self.base_url, self.model, self.timeout_s, self.max_retries = url, model, timeout_s, max_retries
        self.vocab_size = vocab_size  # None: ids are checked for being ints only
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S)))
        self.version = -1

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
            "stop_token_ids": list(params.stop_token_ids),
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = params.seed
        resp = await self._post(body)
        return self._completion(resp, params)

    async def _post(self, body: dict[str, Any]) -> httpx.Response:
        """The 200 answer, after retrying what the server (not the request) failed at. A reply that
        timed out is not retried: the server is stuck or overloaded, and another try would wait as long."""
        for attempt in range(1 + self.max_retries):
            resp, status, retry = None, None, True
            tries = f"after {attempt + 1} attempt{'s' * (attempt > 0)}"
            try:
                resp = await self._client.post(f"{self.base_url}/completions", json=body)
            except (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout) as exc:
                retry = False
                what = (
                    f"did not answer within {self.timeout_s:g} s ({type(exc).__name__}): is it overloaded or "
                    "stuck? check its log, or lower the turn's token cap"
                )
            except httpx.TransportError as exc:  # refused, reset, dropped mid-reply, or no connection in time
                what = (
                    f"is unreachable {tries} ({type(exc).__name__}: {_clip(str(exc)) or 'no detail'}): start the "
                    "server there (e.g. vivace serve --model MODEL --port PORT) or fix the URL in tokens:URL#MODEL"
                )
            else:
                if resp.status_code == 200:
                    return resp
                status = resp.status_code
                what = f"answered HTTP {status} on /completions {tries}: {_said(resp)}{self._hint(resp)}"
            failure = http_failure(f"sampler at {self.base_url} {what}", status)
            wait = self._wait(attempt, resp)
            if not (retry and isinstance(failure, PolicyUnavailable)) or attempt == self.max_retries or wait is None:
                raise failure
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _wait(self, attempt: int, resp: httpx.Response | None) -> float | None:
        """Seconds before the next attempt: the server's Retry-After when it gives one (None: longer
        than this client waits), else exponential backoff."""
        asked = resp.headers.get("retry-after", "") if resp is not None else ""
        if asked.replace(".", "", 1).isdigit():
            return float(asked) if float(asked) <= LONGEST_RETRY_AFTER_S else None
        return self.retry_wait_s * 2**attempt

    def _hint(self, resp: httpx.Response) -> str:
        if resp.status_code == 404 and not self.base_url.endswith("/v1"):
            return "; OpenAI-compatible servers answer under /v1: tokens:http://HOST:PORT/v1#MODEL"
        if resp.is_redirect:
            return f"; it redirects to {resp.headers.get('location', '?')}: use that URL"
        return ""

    def _completion(self, resp: httpx.Response, params: SamplingParams) -> Completion:
        """The first choice of a 200 answer, checked token by token (see the class docstring)."""
        where = f"sampler at {self.base_url}"
        try:
            data = resp.json()
        except ValueError:  # UnicodeDecodeError is one
            kind = resp.headers.get("content-type", "no content type")
            raise PolicyError(
                f"{where} answered HTTP 200 with a body that is not JSON ({kind}): {_clip(resp.text)!r}; "
                "is the URL the server's OpenAI-compatible base (…/v1)?"
            ) from None
        if isinstance(data, dict) and data.get("error"):  # some proxies answer 200 with an error object
            raise PolicyError(f"{where} answered with an error: {_said(resp)}")
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise PolicyError(f"{where} answered no completion choice: {_clip(resp.text)}")
        choice = choices[0]
        if choice.get("finish_reason") == "abort":  # vLLM and SGLang: the server dropped the request
            raise PolicyUnavailable(f"{where} aborted the generation (finish_reason 'abort'); check its log")
        ids = choice.get("token_ids")
        if ids is None:
            raise PolicyError(f"{where} returned no token ids; it must support `return_token_ids`")
        logprobs = choice.get("logprobs")
        logprobs = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        if logprobs is None and ids == []:  # servers may leave out the logprobs of an empty reply
            logprobs = []
        version = data.get("policy_version", choice.get("policy_version", -1))
        problem = _malformed(ids, logprobs, version, params, self.vocab_size)
        if problem:
            raise PolicyError(f"{where} returned {problem}, so the turn is not used: {_clip(resp.text)}")
        self.version = version
        return Completion(
            token_ids=list(ids),
            logprobs=[float(x) for x in logprobs],
            finish_reason="stop" if choice.get("finish_reason") == "stop" else "length",
            policy_version=self.version,
        )

    async def aclose(self) -> None:
        await self._client.aclose()


_URL_FORM = "the form is tokens:http://HOST:PORT/v1#MODEL"


def _malformed(ids: Any, logprobs: Any, version: Any, params: SamplingParams, vocab_size: int | None) -> str | None:
    """What is wrong with a completion's token ids, logprobs and policy version; None: nothing."""

    def is_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if not isinstance(ids, list) or not all(is_int(t) for t in ids):
        return "token ids that are not a list of integers"
    bad = [t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)]
    if bad:
        return f"token ids outside the model's vocabulary [0, {vocab_size}): {bad[:5]}"
    if len(ids) > params.max_tokens:
        return f"{len(ids)} tokens where max_tokens was {params.max_tokens} (the server ignored max_tokens)"
    stops = set(params.stop_token_ids)
    early = next((i for i, t in enumerate(ids[:-1]) if t in stops), None)
    if early is not None:
        return f"tokens after the stop token {ids[early]} at position {early} (the server ignored stop_token_ids)"
    if not isinstance(logprobs, list) or len(logprobs) != len(ids):
        n = len(logprobs) if isinstance(logprobs, list) else 0
        return f"{len(ids)} token ids but {n} logprobs (`logprobs.token_logprobs`)"
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in logprobs):
        return "logprobs that are not finite numbers"
    if any(x > LOGPROB_SLACK for x in logprobs):
        return f"a logprob above 0 ({max(logprobs):g})"
    if not is_int(version):
        return f"policy_version {version!r}, not an integer"
    return None


def _said(resp: httpx.Response) -> str:
    """The server's message in one line: an OpenAI-style error's message, else the body."""
    try:
        error = resp.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return _clip(str(message) if message else resp.text) or "(empty body)"


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())  # one line: HTML error pages and tracebacks span many
    return text if len(text) <= limit else text[:limit] + "…"
