"""Policies by spec string — one syntax for every command (`--model SPEC`).

    http://HOST:PORT/v1#MODEL     an OpenAI-compatible chat endpoint (tool calling through
                                  the `openai` client; the key comes from $OPENAI_API_KEY)
    scripted:null                 answers at once, calls no tool, changes nothing (a baseline)
    scripted:replay:FILE          replays a JSON list of assistant turns (tests, bug reports)
    scripted:oracle               the expert that applies a task's reference patch (bench, RL)
    scripted:random               one random operator edit (a floor for the benchmark)
    scripted:random-edit          one random mutation inside the function the failing test names

A replay file is a JSON list; each item is one assistant turn, either a message
`{"content": "...", "tool_calls": [{"name": "read_file", "arguments": {"path": "a.py"}}]}`
(arguments may also be a JSON string, as OpenAI sends them; a call may carry its "id") or raw
generated text `{"text": "I'll look.\\n<tool_call>\\n{...}\\n</tool_call>"}`, parsed exactly as a
model's output would be (so malformed output can be replayed), with an optional "finish_reason"
("stop" or "length"). Any other key is refused: a misspelt one would drop what it held. When the
list is exhausted the policy answers with an empty final message.

    tiny | PATH                   a model run by vivace's own engine in this process: the tiny
                                  preset, or a local Hugging Face checkpoint directory
    tokens:http://HOST:PORT/v1#MODEL  token-in/token-out over HTTP (vLLM, SGLang, `vivace serve`)

Spec parsing is lazy: nothing heavy is imported until a policy of that kind is made.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vivace.harness.messages import AssistantTurn, Message, ToolCall, decode_call
from vivace.harness.policy import CONTEXT_TOO_LONG, Conversation, Policy, PolicyError, http_failure
from vivace.model.spec import missing_checkpoint

if TYPE_CHECKING:
    from vivace.config import EngineConfig

SPEC_FORMS = ("http(s)://HOST:PORT/v1#MODEL", "scripted:null", "scripted:replay:FILE", "scripted:oracle",
              "scripted:random", "scripted:random-edit", "tiny", "tiny-init", "PATH (a checkpoint directory)", "tokens:http://HOST:PORT/v1#MODEL")  # fmt: skip
# Policies defined above the harness (they need a task), imported only when named.
_LAZY = {
    "scripted:oracle": "vivace.bench.baselines:OraclePolicy",
    "scripted:random": "vivace.bench.baselines:RandomPolicy",
    "scripted:random-edit": "vivace.bench.baselines:RandomEditPolicy",
}


def deterministic(spec: str) -> bool:
    """Whether a spec's policy acts the same in every episode of a task: the scripted ones do (the
    random ones seed from the task id), so more than one episode of a task repeats the first."""
    return spec == "scripted:null" or spec.startswith("scripted:replay:") or spec in _LAZY


def names_model(spec: str) -> bool:
    """Whether a spec names a model (an endpoint, `tiny`, a checkpoint directory), which loading
    starts or reaches, rather than a scripted policy."""
    return (
        spec.startswith(("http://", "https://", "tokens:"))
        or spec in ("tiny", "tiny-init")
        or (Path(spec).expanduser() / "config.json").is_file()
    )


def load_policy(spec: str, engine: EngineConfig | None = None) -> Policy:
    """The policy a spec names; an unknown spec raises ValueError listing the valid forms.
    `engine` sets how a token-level model is run and sampled (temperature...)."""
    if spec.startswith(("http://", "https://")):
        base_url, _, model = spec.partition("#")
        temperature = engine.temperature if engine is not None else None
        return OpenAIPolicy(base_url, model or None, name=spec, temperature=temperature)
    if spec == "scripted:null":
        return NullPolicy()
    if spec.startswith("scripted:replay:"):
        return ReplayPolicy.from_file(spec.removeprefix("scripted:replay:"))
    if spec in _LAZY:
        module, _, attr = _LAZY[spec].partition(":")
        return getattr(importlib.import_module(module), attr)()
    if names_model(spec):  # token level: tiny, a checkpoint directory, tokens:URL
        return importlib.import_module("vivace.inference.samplers").token_policy(spec, engine)
    if Path(spec).expanduser().is_dir():  # meant as a checkpoint: say what it lacks, not only the forms
        raise ValueError(f"{spec} is not a checkpoint (no config.json in {spec}); give a directory as "
                         "`vivace sft train` or any Hugging Face model saves it")  # fmt: skip
    if missing := missing_checkpoint(spec):  # reads as a path: say it is missing, not only the forms
        raise ValueError(f"{missing}, or another form: {', '.join(SPEC_FORMS)}")
    raise ValueError(f"unknown policy spec {spec!r}; valid forms: {', '.join(SPEC_FORMS)}")


class NullPolicy:
    """Does nothing: the floor every benchmark number is compared with."""

    name = "scripted:null"

    async def act(self, conversation: Conversation) -> AssistantTurn:
        return AssistantTurn(Message("assistant", "I made no changes."))


class ReplayPolicy:
    """Replays scripted assistant turns (see the module docstring for the file format)."""

    def __init__(self, turns: list[dict[str, Any]], name: str = "scripted:replay"):
        if problem := _replay_problem(turns):
            raise ValueError(f"replay script: {problem}")
        self.turns, self.name = turns, name

    @classmethod
    def from_file(cls, path: str) -> ReplayPolicy:
        try:
            data = json.loads(Path(path).read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise ValueError(
                f"{path}: the replay file does not exist; check the path in scripted:replay:FILE"
            ) from None
        except OSError as e:
            raise ValueError(f"{path}: cannot read the replay file ({e.strerror}); give a JSON file") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: the replay file is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: the replay file is not valid JSON ({e.msg} at line {e.lineno} column "
                             f"{e.colno}); fix its syntax") from None  # fmt: skip
        if problem := _replay_problem(data):
            raise ValueError(f"{path}: {problem}")
        return cls(data, name=f"scripted:replay:{path}")

    async def act(self, conversation: Conversation) -> AssistantTurn:
        # The turn to replay is the number of assistant messages so far (one policy, many episodes).
        n = sum(m.role == "assistant" for m in conversation.messages)
        if n >= len(self.turns):
            return AssistantTurn(Message("assistant", ""))
        item = self.turns[n]
        if "text" in item:
            from vivace.harness.chat import parse_text

            message, _ = parse_text(item["text"], finish_reason=item.get("finish_reason", "stop"))
            return AssistantTurn(message, finish_reason=item.get("finish_reason", "stop"))
        calls = tuple(
            decode_call(c.get("id") or f"call_{i}", c["name"], c.get("arguments", {}))
            for i, c in enumerate(item.get("tool_calls") or ())
        )
        return AssistantTurn(Message("assistant", str(item.get("content") or ""), calls))


def _replay_problem(turns: Any) -> str | None:
    """What is wrong with a replay script, as `turn N: ...` (N from 1), or None. Only the shape is
    checked: a call's arguments are replayed as given, so malformed ones still reach the agent."""
    if not isinstance(turns, list):
        return f"expected a JSON list of assistant turns, not {type(turns).__name__}"
    for n, item in enumerate(turns, 1):
        if not isinstance(item, dict) or not ({"content", "tool_calls", "text"} & item.keys()):
            return f"turn {n}: expected an object with 'content'/'tool_calls' or 'text'"
        if unknown := sorted(item.keys() - _TURN_KEYS):
            return f"turn {n}: unknown key {unknown[0]!r}; a turn has {', '.join(sorted(_TURN_KEYS))}"
        if "text" in item and not isinstance(item["text"], str):
            return f"turn {n}: 'text' must be a string (the raw generated output)"
        if item.get("finish_reason", "stop") not in ("stop", "length"):
            return f'turn {n}: \'finish_reason\' must be "stop" or "length", not {item["finish_reason"]!r:.40}'
        if not isinstance(item.get("content"), str | None):
            return f"turn {n}: 'content' must be a string"
        calls = item.get("tool_calls")
        if not isinstance(calls, list | None):
            return f"turn {n}: 'tool_calls' must be a list of calls, not {type(calls).__name__}"
        ids = set()
        for i, call in enumerate(calls or (), 1):
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
                return (
                    f"turn {n}: tool call {i} must be an object with a tool 'name' (and 'arguments'), got {call!r:.60}"
                )
            if unknown := sorted(call.keys() - _CALL_KEYS):
                return (
                    f"turn {n}: tool call {i}: unknown key {unknown[0]!r}; a call has {', '.join(sorted(_CALL_KEYS))}"
                )
            if "id" in call and (not isinstance(call["id"], str) or not call["id"] or call["id"] in ids):
                return f"turn {n}: tool call {i}: 'id' must be a string, not empty, unique in its turn; got {call['id']!r:.40}"
            ids.add(call.get("id"))
    return None


_TURN_KEYS = {"content", "tool_calls", "text", "finish_reason"}
_CALL_KEYS = {"id", "name", "arguments"}


class OpenAIPolicy:
    """A chat-completions endpoint with tool calling (vLLM, SGLang, `vivace serve`, hosted APIs).

    The reply is read from the raw JSON, leniently: servers differ (arguments as an object, calls
    without ids, null usage), and whatever is malformed in the *model's* output becomes a tool
    call with `error` set, which the loop answers with an error result. A server that answers
    nothing usable (an error status once the client's retries are spent, no choices, no message,
    a body that is not JSON) raises PolicyError naming what it said, which ends the episode.
    The client retries 408/409/429/5xx answers, timeouts and connection errors `max_retries`
    times with backoff (honouring Retry-After up to two minutes); nothing else is retried."""

    def __init__(
        self,
        base_url: str,
        model: str | None,
        name: str,
        timeout_s: float = 600.0,
        max_retries: int = 2,
        temperature: float | None = None,
    ) -> None:
        import openai  # lazy: only this policy needs the client

        self.name, self.model, self.timeout_s = name, model, timeout_s
        # Sent unless it is the API's own default (1), which some models refuse to be sent at all.
        self.temperature = None if temperature == 1.0 else temperature
        key = os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers accept any key
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=max_retries)
        self._openai = openai
        self.context_tokens: int | None = None  # from the server's model card, once asked (_learn_context)
        self._context_lookup: asyncio.Future | None = None

    async def aclose(self) -> None:
        await self.client.close()

    async def _model_name(self) -> str:
        if self.model is None:
            hint = "; name the model as URL#MODEL"
            try:
                models = [m.id async for m in self.client.models.list()]
            except self._openai.APIConnectionError as e:  # no answer at all (a timeout is one): not a naming matter
                port = self.client.base_url.port
                serve = "vivace serve --model tiny" + (f" --port {port}" if port else "")
                raise http_failure(f"{self.name}: could not list models: {_describe(e)}; the endpoint is unreachable: "
                                   f"check the URL, or start the server (e.g. `{serve}`)", None) from None  # fmt: skip
            except self._openai.OpenAIError as e:
                status = getattr(e, "status_code", None)
                raise http_failure(f"{self.name}: could not list models: {_describe(e)}{hint}", status) from None
            except (AttributeError, TypeError, ValueError) as e:  # a body that is not a model list
                raise PolicyError(
                    f"{self.name}: GET /models did not answer a model list ({type(e).__name__}: {e}){hint}"
                ) from None
            if len(models) != 1 or not isinstance(models[0], str) or not models[0]:
                raise PolicyError(f"{self.name}: the server lists {', '.join(map(str, models)) or 'no models'}{hint}")
            self.model = models[0]
        return self.model

    async def _learn_context(self) -> None:
        """Asks the server once, for every episode of this policy, for the model's context: the `max_model_len`
        of its model card (vLLM, SGLang and vivace serve list it; hosted APIs do not). Shielded, so an episode
        cancelled meanwhile does not cancel the others' answer (one cancelled with its event loop is asked again)."""
        if self._context_lookup is None or self._context_lookup.cancelled():
            self._context_lookup = asyncio.ensure_future(self._read_context())
        await asyncio.shield(self._context_lookup)

    async def _read_context(self) -> None:
        """Never raises: without an answer the context stays unknown (tool results get the usual budget)."""
        try:
            client = self.client.with_options(timeout=min(CONTEXT_LOOKUP_S, self.timeout_s), max_retries=0)
            async for card in client.models.list():
                length = getattr(card, "max_model_len", None)
                if card.id == self.model and isinstance(length, int) and not isinstance(length, bool) and length > 0:
                    self.context_tokens = length
        except (self._openai.OpenAIError, AttributeError, TypeError, ValueError):
            pass

    async def act(self, conversation: Conversation) -> AssistantTurn:
        model = await self._model_name()
        await self._learn_context()
        request: dict[str, Any] = {
            "model": model,
            "messages": [_for_api(m) for m in conversation.messages],
            "max_tokens": conversation.max_turn_tokens,
        }
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if conversation.tools:  # OpenAI refuses an empty list ("tools: expected at least 1 item")
            request["tools"] = conversation.tools
        try:
            raw = await self.client.chat.completions.with_raw_response.create(**request)
        except self._openai.OpenAIError as e:
            raise http_failure(
                f"{self.name}: the endpoint failed: {_describe(e)}", getattr(e, "status_code", None)
            ) from None
        response = raw.http_response
        try:
            # Leniently: a character cut in two (invalid UTF-8) is U+FFFD, not a body that is "not JSON".
            body = without_lone_surrogates(json.loads(response.content.decode("utf-8", "replace")))
        except (ValueError, RecursionError):
            kind = response.headers.get("content-type", "no content type")
            raise PolicyError(
                f"{self.name}: the endpoint's answer is not JSON (HTTP {response.status_code}, {kind}): "
                f"{_clip(response.text)!r}"
            ) from None
        return _completion_turn(body, self.name, bool(conversation.tools))


CONTEXT_LOOKUP_S = 5.0  # GET /models answers at once where it is served; a server that hangs there costs this once
_ERROR_CODE = re.compile(r"^Error code: \d+(?: - |$)")  # the openai client's prefix of the server's message
_LONGEST_RETRY_AFTER_S = 120  # openai._constants.MAX_RETRY_AFTER_DELAY: a longer wait is not retried
_TOOL_CALL_MARKUP = re.compile(r"<tool_call>\s*\{")  # chat.TOOL_CALL_OPEN and a JSON object, without transformers


def _describe(e: Exception) -> str:
    """What went wrong with a request, for the episode's error: the HTTP status and the server's
    message, how many attempts were made, and the cause when it is a common one (a context
    overflow, a redirect that turned the POST into a GET)."""
    request = getattr(e, "request", None)
    retries = request.headers.get("x-stainless-retry-count", "") if request is not None else ""
    tries = 1 + int(retries) if retries.isdigit() else 0  # the client numbers its retries in this header
    attempts = f"after {tries} attempt{'s' * (tries != 1)}" if tries else "after the client's retries"
    status = getattr(e, "status_code", None)
    if status is None:  # no HTTP answer: timeout, connection refused, too many redirects
        cause = f" ({type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ else ""
        return f"{type(e).__name__} {attempts}: {_clip(str(e))}{cause}"
    response = getattr(e, "response", None)
    said = _clip(_ERROR_CODE.sub("", str(getattr(e, "message", None) or e)))
    if 400 <= status < 500 and CONTEXT_TOO_LONG.search(said):
        return (
            f"HTTP {status}: the conversation no longer fits the model's context window (the prompt plus "
            f"max_turn_tokens for the reply); the server said: {said}"
        )
    text = f"HTTP {status} ({type(e).__name__}) {attempts}"
    wait = _retry_after_s(getattr(response, "headers", None) or {})
    if wait is not None and wait > _LONGEST_RETRY_AFTER_S:
        text += f" (it asked to retry after {wait:.0f} s, longer than the client waits, so it was not retried)"
    history = getattr(response, "history", None) or []
    if history:
        text += (
            f"; the request to {history[0].request.url} was redirected to {response.url} (a 301/302 turns the "
            "POST into a GET): use the URL it redirects to"
        )
    return f"{text}: {said}" if said else text


def _retry_after_s(headers: Any) -> float | None:
    """The wait a refusal asked for, in any of the forms the openai client honours: retry-after-ms,
    retry-after in seconds, or retry-after as an HTTP date."""
    import email.utils

    ms, after = headers.get("retry-after-ms", ""), headers.get("retry-after", "")
    try:
        if ms:
            return float(ms) / 1000
        if after.replace(".", "", 1).isdigit():
            return float(after)
        if after:
            return email.utils.parsedate_to_datetime(after).timestamp() - time.time()
    except (ValueError, TypeError, OverflowError):
        pass
    return None


def _completion_turn(body: Any, name: str, tools_offered: bool) -> AssistantTurn:
    """The first choice of a chat-completions body as an AssistantTurn. What the server sends
    around the model's output must be there (a choice with a message); the model's output itself
    is taken as it comes, malformed calls becoming error calls."""
    if not isinstance(body, dict):
        raise PolicyError(f"{name}: the endpoint answered a JSON {type(body).__name__}, not a chat completion")
    if body.get("error"):  # some proxies answer HTTP 200 with an error object
        error = body["error"]
        said = error.get("message", error) if isinstance(error, dict) else error
        raise PolicyError(f"{name}: the endpoint answered with an error: {_clip(str(said))}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise PolicyError(f"{name}: the endpoint returned no choices: {_clip(json.dumps(body))}")
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message")
    if not isinstance(message, dict):
        raise PolicyError(f"{name}: the endpoint's choice has no message: {_clip(json.dumps(choices[0]))}")
    finish = choice.get("finish_reason")
    finish = finish if isinstance(finish, str) and finish else "stop"
    content = _content_text(message.get("content"))
    refusal = message.get("refusal")
    if not content and isinstance(refusal, str) and refusal:  # OpenAI's refusal: the model's answer, not nothing
        content = refusal
    raw_calls = message.get("tool_calls") or []
    raw_calls = raw_calls if isinstance(raw_calls, list) else [raw_calls]
    calls = tuple(_call(c, call_id, finish) for c, call_id in zip(raw_calls, _call_ids(raw_calls), strict=True))
    if not calls and tools_offered and _TOOL_CALL_MARKUP.search(content):
        # The server's tool parser gave up on the model's markup and passed it on as text (vLLM's
        # hermes parser does so for one bad block), or the server parses no calls at all: parse it
        # here, so a broken call is answered with an error instead of taken for the final answer
        # (a tag followed by JSON only: an answer that merely names the tag stays the answer).
        from vivace.harness.chat import parse_text  # lazy: imports transformers

        parsed, _ = parse_text(content, finish_reason=finish)
        content, calls = parsed.content, parsed.tool_calls
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    return AssistantTurn(
        Message("assistant", content, calls),
        finish_reason=finish,
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        meta={"reasoning": reasoning} if isinstance(reasoning, str) and reasoning else {},
    )


def without_lone_surrogates(body: Any) -> Any:
    """`body` with each lone UTF-16 surrogate in its strings as U+FFFD. JSON may escape half of a pair
    ("\\ud83d", a gateway cutting a string mid-emoji), which Python keeps as a str no UTF-8 can encode:
    the terminal's printing of it raised, and so did the next request that sent it back."""
    stack = [body]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if isinstance(value, str):
                if _SURROGATE.search(value):
                    node[key] = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            elif isinstance(value, dict | list):
                stack.append(value)
    return body


_SURROGATE = re.compile("[\ud800-\udfff]")


def _call(raw: Any, call_id: str, finish: str) -> ToolCall:
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict):
        return ToolCall(call_id, "", raw, "the tool call has no function (a name and arguments)")
    arguments = fn.get("arguments")
    call = decode_call(call_id, fn.get("name"), {} if arguments is None else arguments, lone_surrogates_ok=True)
    if call.error is None:  # "\\ud83d" alone in the arguments' JSON decodes to a str no file can hold
        without_lone_surrogates(call.arguments)  # (in place: a SpelledArguments keeps its text)
    if call.error is not None and finish == "length":
        return ToolCall(call.id, call.name, call.arguments, f"{call.error}; the reply was cut off by the token limit")
    return call


def _call_ids(raw_calls: list[Any]) -> list[str]:
    """One id per call, unique in the turn: the server's where it gave a new one, else `call_N`
    (each result must answer exactly one call, and strict servers refuse repeated ids)."""
    given = {c["id"] for c in raw_calls if isinstance(c, dict) and isinstance(c.get("id"), str)}
    ids: list[str] = []
    taken: set[str] = set()  # ids as a set: 40,000 calls took 10 s against the list
    for i, c in enumerate(raw_calls):
        call_id = c.get("id") if isinstance(c, dict) else None
        if not isinstance(call_id, str) or not call_id or call_id in taken:
            call_id, n = f"call_{i}", 0
            while call_id in given or call_id in taken:
                n += 1
                call_id = f"call_{i}_{n}"
        ids.append(call_id)
        taken.add(call_id)
    return ids


def _content_text(content: Any) -> str:
    """A message's content as text: a string, null, or a list of text parts (some servers)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _clip(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _for_api(message: Message) -> dict[str, Any]:
    """A message as the request sends it. Strict servers refuse what the harness keeps for its own
    record: a tool message's `name`, and arguments that are not a JSON object (older vLLM and
    SGLang parse every past call's arguments and fail the request, so one broken call would fail
    every later turn). A malformed call is sent with `{}`; its error result says what was wrong."""
    out = message.to_openai()
    if message.role == "tool":
        out.pop("name", None)
    for call, sent in zip(message.tool_calls, out.get("tool_calls", ()), strict=True):
        if call.error is not None or not isinstance(call.arguments, dict):
            sent["function"]["arguments"] = "{}"
    return out
