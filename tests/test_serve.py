"""`vivace serve` with real clients: the official `openai` package (chat completions with
several parsed tool calls, streaming), token-level completions through HttpSampler, bad
requests, and checkpoints that plain transformers loads.

The model is a small Qwen3-MoE taught (by overfitting, in a few seconds) to answer one
conversation with two parallel tool calls, so the whole path — template, engine, parser,
OpenAI wire format — is checked against a known answer."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import vivace_refusal
from vivace.harness.chat import ChatFormat, parse_text
from vivace.harness.messages import Message, ToolCall
from vivace.harness.policy import Completion, SamplingParams
from vivace.harness.tools import default_tools
from vivace.harness.tools.base import tool_schema
from vivace.inference.engine import AsyncEngine, Engine, TopCompletion
from vivace.inference.replies import completion_token
from vivace.inference.samplers import HttpSampler
from vivace.inference.server import create_app
from vivace.model.checkpoint import load_model, save_checkpoint, tiny_config
from vivace.model.tokenizer import reference_tokenizer
from vivace.sandbox.background import BackgroundServer

# One real tool schema, trimmed to its path argument so the prompt (and teaching) stays short.
READ = tool_schema(next(t for t in default_tools() if t.name == "read_file"))
TOOLS = [{"type": "function", "function": {**READ["function"], "description": "Read a file.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]  # fmt: skip
MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Compare a.py and b.py."},
]
ANSWER = Message(
    "assistant",
    "Reading both files.",
    (ToolCall("call_0", "read_file", {"path": "a.py"}), ToolCall("call_1", "read_file", {"path": "b.py"})),
)


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    """(checkpoint dir, chat format, prompt ids, answer ids): a model that gives ANSWER greedily."""
    tok = reference_tokenizer()
    chat = ChatFormat(tok)
    prompt = chat.prompt_ids([Message.from_openai(m) for m in MESSAGES], TOOLS)
    target = chat.assistant_ids(ANSWER)
    torch.manual_seed(0)
    cfg = tiny_config(len(tok), hidden_size=64, moe_intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32)  # fmt: skip
    model = AutoModelForCausalLM.from_config(cfg)
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(400):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 19:
            model.eval()
            greedy = SamplingParams(max_tokens=len(target) + 5, temperature=0, stop_token_ids=tuple(chat.stop_ids))
            got = Engine(model).run([prompt], [greedy])[0]
            model.train()
            if got.token_ids == target:
                break
    else:
        pytest.fail("could not teach the model its answer")
    path = save_checkpoint(model.eval(), tok, tmp_path_factory.mktemp("ckpt") / "taught")
    return path, chat, prompt, target


@pytest.fixture(scope="module")
def server(taught):
    path = taught[0]
    loaded = load_model(str(path))
    engine = AsyncEngine(Engine(loaded.model, max_batch=8))
    srv = BackgroundServer(create_app(engine, ChatFormat(loaded.tokenizer), "taught"))
    srv.start()
    yield srv
    srv.stop()
    engine.close()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_checkpoint_loads_with_plain_transformers(taught):
    path, chat, prompt, _ = taught
    ours = load_model(str(path)).model
    plain = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, plain(ids).logits)
    assert tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False, add_generation_prompt=True) == chat.render(
        [Message.from_openai(m) for m in MESSAGES], TOOLS, add_generation_prompt=True
    )
    assert {p.name for p in path.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_openai_client_gets_parallel_tool_calls(server):
    c = client(server)
    assert [m.id for m in c.models.list().data] == ["taught"]
    reply = c.chat.completions.create(model="taught", messages=MESSAGES, tools=TOOLS, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Reading both files."
    calls = [(t.function.name, json.loads(t.function.arguments)) for t in choice.message.tool_calls]
    assert calls == [("read_file", {"path": "a.py"}), ("read_file", {"path": "b.py"})]
    assert len({t.id for t in choice.message.tool_calls}) == 2
    assert reply.usage.completion_tokens > 10 and reply.usage.prompt_tokens > 100


def test_openai_client_streams(server):
    stream = client(server).chat.completions.create(
        model="taught", messages=MESSAGES, tools=TOOLS, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    content, calls, finish, usage, chunks = "", {}, None, None, 0
    for chunk in stream:
        chunks += 1
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or ():
                entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                entry["name"] += tc.function.name or ""
                entry["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert content == "Reading both files." and chunks > 5  # content arrives in pieces
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == [
        ("read_file", {"path": "a.py"}),
        ("read_file", {"path": "b.py"}),
    ]
    assert finish == "tool_calls" and usage.completion_tokens > 10


def collect(stream) -> tuple[dict[int, dict], object]:
    """Each streamed choice put together from the openai client's chunks, and the usage."""
    choices: dict[int, dict] = {}
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            got = choices.setdefault(c.index, {"content": "", "calls": {}, "finish": None, "logprobs": []})
            got["content"] += c.delta.content or ""
            for tc in c.delta.tool_calls or ():
                call = got["calls"].setdefault(tc.index, {"name": "", "arguments": ""})
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
            got["finish"] = c.finish_reason or got["finish"]
            got["logprobs"] += c.logprobs.content or [] if c.logprobs else []
    return choices, usage


def as_streamed(choice) -> dict:
    """A whole reply's choice in `collect`'s form."""
    calls = choice.message.tool_calls or []
    return {
        "content": choice.message.content or "",
        "calls": {i: {"name": t.function.name, "arguments": t.function.arguments} for i, t in enumerate(calls)},
        "finish": choice.finish_reason,
        "logprobs": list(choice.logprobs.content or []) if choice.logprobs else [],
    }


def assert_same_choices(got: dict[int, dict], expected: dict[int, dict]) -> None:
    """`collect`'s choices equal, logprobs to 1e-5: a second run's batches differ (its prompt comes
    from the prefix cache), and so do the last bits of its logits."""

    def tokens(choices: dict[int, dict]) -> dict:
        return {i: {**c, "logprobs": [(e.token, [a.token for a in e.top_logprobs]) for e in c["logprobs"]]}
                for i, c in choices.items()}  # fmt: skip

    def logprobs(choices: dict[int, dict]) -> list[float]:
        return [
            x
            for c in choices.values()
            for e in c["logprobs"]
            for x in (e.logprob, *(a.logprob for a in e.top_logprobs))
        ]

    assert tokens(got) == tokens(expected)
    assert logprobs(got) == pytest.approx(logprobs(expected), abs=1e-5)


WRITE = {"type": "function", "function": {"name": "write_file", "description": "Write a file.",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}  # fmt: skip


@pytest.mark.parametrize(
    ("tools", "tool_choice", "opening"),
    [
        (TOOLS, "required", "<tool_call>\n"),
        (TOOLS, {"type": "function", "function": {"name": "read_file"}}, '<tool_call>\n{"name": "read_file", "arguments":'),
        ([*TOOLS, WRITE], {"type": "function", "function": {"name": "write_file"}},
         '<tool_call>\n{"name": "write_file", "arguments":'),
    ],
    ids=["required", "named", "named-unlikely"],
)  # fmt: skip
def test_openai_client_forces_a_tool_call(server, tools, tool_choice, opening):
    """The reply opens the call however unlikely the model finds it (the taught model answers with
    content first, and was never taught to call write_file). What follows is the model's: a parsed
    call (of the named function), or the malformed-call reply, which begins with the forced opening."""
    c = client(server)
    kw = {"model": "taught", "messages": MESSAGES, "tools": tools, "tool_choice": tool_choice, "temperature": 0,
          "max_tokens": 60}  # fmt: skip
    choice = c.chat.completions.create(**kw).choices[0]
    named = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls[0].function.name == (named or choice.message.tool_calls[0].function.name)
    else:
        assert choice.message.content.startswith(opening) and choice.finish_reason in ("stop", "length")
    if named == "read_file":  # what it was taught to call: the forced opening leads to a real call
        # The reply holds a malformed call too (the first; the taught model's arguments after the forced
        # opening do not parse), so it is the malformed-call reply: its calls are read from its text.
        calls = parse_text(choice.message.content)[0].tool_calls if choice.message.content else []
        if choice.message.tool_calls:
            calls = [ToolCall("", t.function.name, json.loads(t.function.arguments)) for t in choice.message.tool_calls]
        assert any((t.name, t.error, t.arguments) == good for t in calls for good in
                   [("read_file", None, {"path": "a.py"}), ("read_file", None, {"path": "b.py"})]), calls  # fmt: skip
    streamed, _ = collect(c.chat.completions.create(**kw, stream=True))
    assert streamed == {0: as_streamed(choice)}


def test_openai_client_n_choices_share_one_prefill(server):
    c = client(server)
    words = " ".join(f"w{i}" for i in range(80))  # a prompt no earlier request began with
    messages = [MESSAGES[0], {"role": "user", "content": f"Compare a.py and b.py. {words}"}]
    kw = {"model": "taught", "messages": messages, "tools": TOOLS, "n": 4, "temperature": 2.0, "seed": 11,
          "max_tokens": 12, "logprobs": True}  # fmt: skip
    before = httpx.get(f"{server.url}/metrics").json()["prefill_tokens"]
    reply = c.chat.completions.create(**kw)
    prefilled = httpx.get(f"{server.url}/metrics").json()["prefill_tokens"] - before
    assert [ch.index for ch in reply.choices] == [0, 1, 2, 3]
    assert prefilled <= reply.usage.prompt_tokens + 3  # once; the others copy it and compute their last token
    # every choice's sampled tokens (its end-of-turn token, when it ended with one, is not in logprobs)
    sampled = sum(len(ch.logprobs.content) + (ch.finish_reason != "length") for ch in reply.choices)
    assert reply.usage.completion_tokens == sampled
    # independent samples, not copies: the taught model is so sure of itself here (p > 0.94 a token at T 1) that
    # four samples at T 1 were often alike; at T 2 (the most the API allows) they hardly ever are
    assert len({ch.message.content for ch in reply.choices}) > 1
    streamed, usage = collect(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    # Seeded per choice, so the same tokens; the logprobs to float noise (this time the prompt's keys come
    # from the prefix cache, so the batches differ).
    assert_same_choices(streamed, {i: as_streamed(ch) for i, ch in enumerate(reply.choices)})
    assert (usage.prompt_tokens, usage.completion_tokens) == (reply.usage.prompt_tokens, sampled)


def test_openai_client_top_logprobs_are_the_models_distribution(server, taught):
    path, chat, prompt, target = taught
    c = client(server)
    kw = {"model": "taught", "messages": MESSAGES, "tools": TOOLS, "temperature": 0, "logprobs": True,
          "top_logprobs": 5}  # fmt: skip
    whole = c.chat.completions.create(**kw).choices[0]
    entries = whole.logprobs.content
    assert len(entries) == len(target) - 1  # every sampled token but the end of turn
    for e in entries:  # greedy: the chosen token is the likeliest alternative, with its logprob
        assert len(e.top_logprobs) == 5 and (e.top_logprobs[0].token, e.top_logprobs[0].logprob) == (e.token, e.logprob)
        assert [a.logprob for a in e.top_logprobs] == sorted((a.logprob for a in e.top_logprobs), reverse=True)
    streamed, _ = collect(c.chat.completions.create(**kw, stream=True))
    assert_same_choices(streamed, {0: as_streamed(whole)})
    # Sampled at T = 0.7: the alternatives are the top of log_softmax(logits / 0.7) of a plain forward pass.
    out = c.completions.create(model="taught", prompt=prompt, max_tokens=8, temperature=0.7, seed=2, logprobs=3)
    ids, logprobs = out.choices[0].token_ids, out.choices[0].logprobs
    with torch.no_grad():
        logits = load_model(str(path)).model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    ref = torch.log_softmax(logits / 0.7, dim=-1)
    by_text: dict[str, list[int]] = {}  # as the legacy API names a token (part of a character: its bytes)
    for t in range(ref.shape[-1]):
        by_text.setdefault(completion_token(chat, t), []).append(t)
    for i, (t, top) in enumerate(zip(ids, logprobs.top_logprobs, strict=True)):
        assert abs(logprobs.token_logprobs[i] - ref[i, t].item()) < 1e-4
        third = ref[i].topk(3).values[-1].item()
        assert len(top) <= 3 and max(top.values()) == pytest.approx(ref[i].max().item(), abs=1e-4)
        for text, lp in top.items():
            assert lp == pytest.approx(max(ref[i, by_text[text]]).item(), abs=1e-4) and lp >= third - 1e-4
    assert logprobs.tokens == [completion_token(chat, t) for t in ids]
    offsets = logprobs.text_offset  # where each token begins in the text
    assert len(offsets) == len(ids) and offsets == sorted(offsets) and offsets[-1] < len(out.choices[0].text)


def test_engine_top_logprobs_are_the_reported_distribution_and_change_nothing_else(taught):
    """(The engine's side of top_logprobs; here, not in test_engine.py, to share the taught model.)
    Alternatives asked by some requests of a batch: every request's tokens and logprobs are those of
    a run where none asked; each alternative's logprob is log_softmax(logits / T) of a plain forward
    pass, most likely first; a sampled token among them has its own logprob there."""
    path, _, prompt, _ = taught
    model = load_model(str(path)).model
    g = torch.Generator().manual_seed(5)
    ps = [prompt] + [torch.randint(0, 4096, (n,), generator=g).tolist() for n in (3, 40, 100, 17, 60)]
    temps = [1.0, 0.7, 0.0, 1.3, 1.0, 0.5]
    params = [SamplingParams(max_tokens=10, temperature=t, seed=i) for i, t in enumerate(temps)]
    asks = [4, 0, 1, 0, 20, 3]
    plain = Engine(model, max_batch=6).run(ps, params)
    engine = Engine(model, max_batch=6)
    reqs = [engine.add(p, sp, top_logprobs=k) for p, sp, k in zip(ps, params, asks, strict=True)]
    while engine.has_work:
        engine.step()
    for p, sp, k, req, ref in zip(ps, params, asks, reqs, plain, strict=True):
        done = req.completion()
        assert done.token_ids == ref.token_ids and done.logprobs == pytest.approx(ref.logprobs, abs=1e-6)
        if not k:
            assert type(done) is Completion and req.top == []
            continue
        assert isinstance(done, TopCompletion) and [len(t) for t in done.top] == [k] * len(done.token_ids)
        with torch.no_grad():
            logits = model(torch.tensor([p + done.token_ids])).logits[0, len(p) - 1 : -1].float()
        expected = torch.log_softmax(logits / (sp.temperature or 1.0), dim=-1)
        for i, (tok, lp, top) in enumerate(zip(done.token_ids, done.logprobs, done.top, strict=True)):
            values = [v for _, v in top]
            assert values == sorted(values, reverse=True)
            assert values == pytest.approx(expected[i].topk(k).values.tolist(), abs=1e-4)
            assert all(abs(v - expected[i, t].item()) < 1e-4 for t, v in top)
            if tok in dict(top):
                assert dict(top)[tok] == pytest.approx(lp, abs=1e-6)
            if sp.temperature == 0:
                assert top[0][0] == tok


async def test_token_completions_and_http_sampler(server, taught):
    _, _, prompt, target = taught
    sampler = HttpSampler(f"{server.url}/v1", "taught")
    try:
        greedy = await sampler.generate(prompt, SamplingParams(max_tokens=100, temperature=0, stop_token_ids=(1,)))
        assert greedy.token_ids == target and greedy.finish_reason == "stop" and greedy.policy_version == 0
        sampled = await sampler.generate(prompt, SamplingParams(max_tokens=20, seed=3))
        again = await sampler.generate(prompt, SamplingParams(max_tokens=20, seed=3))
        assert sampled.token_ids == again.token_ids and len(sampled.logprobs) == len(sampled.token_ids)
        assert all(lp <= 0 for lp in sampled.logprobs)
    finally:
        await sampler.aclose()


def test_token_completions_end_at_the_models_end_tokens_unless_ignore_eos(server, taught):
    """/v1/completions went on past the model's end of turn to max_tokens unless the client named the stop
    ids (vLLM stops at the eos); a raw prompt's reply now ends there, and `ignore_eos` (vLLM's) keeps going."""
    _, chat, prompt, target = taught
    url = f"{server.url}/v1/completions"
    body = {"model": "taught", "prompt": prompt, "max_tokens": len(target) + 20, "temperature": 0}
    ended = httpx.post(url, json=body, timeout=60).json()["choices"][0]
    assert ended["token_ids"] == target and ended["finish_reason"] == "stop", ended
    assert target[-1] in chat.stop_ids
    on = httpx.post(url, json={**body, "ignore_eos": True}, timeout=60).json()["choices"][0]
    assert on["token_ids"][: len(target)] == target and len(on["token_ids"]) == len(target) + 20, on
    assert on["finish_reason"] == "length"


def test_bad_requests_get_clear_4xx_and_the_server_keeps_serving(server):
    url = f"{server.url}/v1/chat/completions"
    cases = [
        (b"{not json", 400, "invalid request"),
        (json.dumps({"model": "other", "messages": MESSAGES}).encode(), 404, "not served here"),
        (json.dumps({"model": "taught", "messages": []}).encode(), 400, "messages"),
        (json.dumps({"model": "taught", "messages": MESSAGES, "n": 17}).encode(), 400, "n"),
        (json.dumps({"model": "taught", "messages": [{"content": "x"}]}).encode(), 400, "role"),
        (json.dumps({"model": "taught", "messages": [{"role": "user", "content": "word " * 9000}]}).encode(),
         400, "context"),
    ]  # fmt: skip
    for body, status, words in cases:
        r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == status, r.text
        assert words in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "taught", "prompt": [10**6]}, timeout=60)
    assert r.status_code == 400 and "out of range" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "taught", "prompt": [5], "stop_token_ids": [2**70]})
    assert r.status_code == 400 and "stop token ids out of range" in r.json()["error"]["message"]
    # Streamed, the engine's refusals come before the 200 too (a bad stop id was a 200 and then an internal error).
    for extra, words in (({"stop_token_ids": [2**70]}, "stop token ids out of range"),
                         ({"messages": [{"role": "user", "content": "word " * 9000}]}, "context")):  # fmt: skip
        r = httpx.post(url, json={"model": "taught", "messages": MESSAGES, "stream": True, **extra}, timeout=60)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"
    ok = client(server).chat.completions.create(model="taught", messages=MESSAGES, tools=TOOLS, temperature=0)
    assert ok.choices[0].finish_reason == "tool_calls"
    metrics = httpx.get(f"{server.url}/metrics").json()
    assert metrics["generated_tokens"] > 0 and metrics["tokens_per_s_busy"] > 0 and "batch_occupancy" in metrics


def test_vivace_serve_command(taught, tmp_path):
    path = taught[0]
    port = _free_port()
    proc = subprocess.Popen(
        [*VIVACE, "serve", "--model", str(path), "--port", str(port), "--served-name", "m"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 90
        while time.time() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert proc.poll() is None, proc.stdout.read()
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        reply = c.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, temperature=0)
        assert [t.function.name for t in reply.choices[0].message.tool_calls] == ["read_file", "read_file"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
    bad = subprocess.run([*VIVACE, "serve", "--model", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "not a model" in bad.stderr


@pytest.mark.parametrize(
    ("command", "health", "healthy"),
    [(["serve", "--model", "tiny"], "/health", ("status", "ok")),
     (["sandbox", "serve", "--backend", "plain"], "/v1/health", ("ok", True))],
)  # fmt: skip
def test_servers_on_port_0_say_the_port_they_took(command, health, healthy, tmp_path):
    """uvicorn picked a free port and `serve` said `on http://127.0.0.1:0/v1`: nobody could reach it.
    Both commands bind the socket themselves, say its port, and serve on it."""
    extra = ["--state-dir", str(tmp_path / "state")] if command[0] == "sandbox" else []
    proc = subprocess.Popen([*VIVACE, *command, "--port", "0", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = next(line for line in proc.stderr if line.startswith("serving"))
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))
        assert port > 0, line
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                key, value = healthy
                assert httpx.get(f"http://127.0.0.1:{port}{health}", timeout=2).json()[key] == value
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            raise AssertionError(f"nothing answers on the port it said ({line.strip()})")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()


VIVACE = [sys.executable, "-c", "from vivace.cli import main; main()"]


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT], [signal.SIGINT, signal.SIGINT]],
                         ids=["sigterm", "ctrl-c", "ctrl-c-twice"])  # fmt: skip
def test_serve_stops_promptly_with_streams_open(signals):
    """With a stream open, SIGTERM left `vivace serve` waiting for its client forever, and a second
    Ctrl-C exited with CancelledError tracebacks. Now open streams, read or not, are ended (an error
    event, their generation cancelled) and the process exits within seconds, without a traceback."""
    proc = subprocess.Popen([*VIVACE, "serve", "--model", "tiny", "--port", "0", "--device", "cpu"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    socks = []
    try:
        line = next(line for line in proc.stderr if line.startswith("serving"))
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", line).group(1))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8000,
                           "temperature": 0, "stream": True}).encode()  # fmt: skip
        for stalled in (True, False):
            sock = socket.create_connection(("127.0.0.1", port))
            if stalled:  # a client that takes nothing: the server's sends back up
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
            socks.append(sock)
        reading, got = socks[1], b""
        while b"data: " not in got:
            got += reading.recv(65536)
        time.sleep(1)
        start = time.monotonic()
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.3)
        reading.settimeout(0.2)
        while proc.poll() is None and time.monotonic() - start < 15:
            with contextlib.suppress(OSError):
                got += reading.recv(65536)
        took = time.monotonic() - start
        assert proc.poll() is not None, "still running 15 s after the signal"
        assert took < 5, f"took {took:.1f} s to exit"  # 5.7-7.7 s after a Ctrl-C before gc.freeze (the teardown)
        errors = proc.stderr.read()
        assert "Traceback" not in errors and "CancelledError" not in errors, errors
        if len(signals) == 1:  # stopped gracefully: the reader was told why its reply ended
            with contextlib.suppress(OSError):
                got += reading.recv(1 << 20)
            assert b"shutting down" in got and got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), got[-300:]  # chunked
    finally:
        for sock in socks:
            sock.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stderr.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_agent_and_bench_run_a_local_checkpoint(taught, tmp_path):
    """`--model DIR` is a token-level policy on the in-process engine, for agent and bench alike."""
    path = taught[0]
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.py").write_text("A = 1\n")
    run = subprocess.run(
        [*VIVACE, "agent", "--model", str(path), "--repo", str(repo), "--preset", "smoke", "--max-turns", "2",
         "--json", "Compare a.py and b.py."],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    traj = json.loads(run.stdout)["trajectory"]
    assert traj["stop_reason"] in ("done", "max_turns", "max_tokens") and traj["turns"]
    tokens = traj["tokens"]
    assert len(tokens["ids"]) == len(tokens["loss_mask"]) == len(tokens["logprobs"]) and 1 in tokens["loss_mask"]
    out = tmp_path / "bench"
    bench = subprocess.run(
        [*VIVACE, "bench", "--model", str(path), "--tasks", "src/vivace/tasks/features/ledger-feature-1",
         "--preset", "smoke", "--out", str(out), "--state-dir", str(tmp_path / "state"), "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and "error" not in rows[0], rows
    assert rows[0]["resolved"] is False and rows[0]["correctness"] == 0.0  # it cannot solve it; it ran


@pytest.mark.parametrize("command", [["serve"], ["serve", "bench"]])
def test_serve_refuses_a_directory_without_a_model_before_importing_torch(command, tmp_path):
    """A wrong --model is said at once (exit 2), not after the seconds of importing torch and transformers."""
    code, torch_imported, stderr = vivace_refusal(*command, "--model", str(tmp_path))
    assert (code, torch_imported) == (2, False), stderr[-2000:]
    assert "is not a model" in stderr
