"""`vivace serve` with real clients: the official `openai` package (chat completions with
several parsed tool calls, streaming), token-level completions through HttpSampler, bad
requests, and checkpoints that plain transformers loads.

The model is a small Qwen3-MoE taught (by overfitting, in a few seconds) to answer one
conversation with two parallel tool calls, so the whole path — template, engine, parser,
OpenAI wire format — is checked against a known answer."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from vivace.harness.chat import ChatFormat
from vivace.harness.messages import Message, ToolCall
from vivace.harness.policy import SamplingParams
from vivace.harness.tools import default_tools
from vivace.harness.tools.base import tool_schema
from vivace.inference.engine import AsyncEngine, Engine
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


def test_bad_requests_get_clear_4xx_and_the_server_keeps_serving(server):
    url = f"{server.url}/v1/chat/completions"
    cases = [
        (b"{not json", 400, "invalid request"),
        (json.dumps({"model": "other", "messages": MESSAGES}).encode(), 404, "not served here"),
        (json.dumps({"model": "taught", "messages": []}).encode(), 400, "messages"),
        (json.dumps({"model": "taught", "messages": MESSAGES, "n": 3}).encode(), 400, "n"),
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
    bad = subprocess.run([*VIVACE, "serve", "--model", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "not a model" in bad.stderr


VIVACE = [sys.executable, "-c", "from vivace.cli import main; main()"]


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
