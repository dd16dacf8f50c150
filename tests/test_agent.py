"""The agent loop: turns, stop reasons, limits, trajectories, and the OpenAI-endpoint policy
over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request

from vivace.config import AgentConfig
from vivace.harness.agent import result_budget, run_episode
from vivace.harness.messages import AssistantTurn, Message, ToolCall
from vivace.harness.policies import NullPolicy, ReplayPolicy, deterministic, load_policy
from vivace.harness.policy import Completion, Conversation, PolicyError, SamplingParams, TokenPolicy, close_policy
from vivace.harness.tools import default_tools
from vivace.harness.tools.base import tool_schema
from vivace.harness.trajectory import Trajectory


@pytest.fixture
def ws(plain_ws):
    return plain_ws


def call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


FIX_SUB = [
    {
        "content": "Reading both files.",
        "tool_calls": [call("read_file", path="pkg/calc.py"), call("grep", pattern="sub")],
    },
    {
        "content": "",
        "tool_calls": [call("edit_file", path="pkg/calc.py", old_string="return a - b", new_string="return b - a")],
    },
    {"content": "Swapped the operands of sub."},
]


async def test_replay_episode_records_everything(ws):
    traj = await run_episode(ReplayPolicy(FIX_SUB), ws, "fix sub", task_id="t1")
    assert traj.stop_reason == "done" and traj.error is None
    assert [len(t.tool_calls) for t in traj.turns] == [2, 1, 0]
    assert traj.final_message == "Swapped the operands of sub."
    assert "-    return a - b\n+    return b - a\n" in traj.diff
    read = traj.turns[0].tool_calls[0]
    assert read.name == "read_file" and "def sub(a, b):" in read.result and not read.is_error
    assert all(c.duration_s > 0 for t in traj.turns for c in t.tool_calls)
    assert traj.tool_calls == 3 and traj.format_errors == 0 and traj.tokens is None
    # JSON round trip and the OpenAI-style export.
    again = Trajectory.model_validate_json(traj.model_dump_json())
    assert again == traj
    messages = traj.to_messages()
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert json.loads(messages[2]["tool_calls"][0]["function"]["arguments"]) == {"path": "pkg/calc.py"}
    assert messages[3]["tool_call_id"] == messages[2]["tool_calls"][0]["id"]


async def test_null_policy_changes_nothing(ws):
    traj = await run_episode(NullPolicy(), ws, "do something")
    assert traj.stop_reason == "done" and traj.diff == "" and len(traj.turns) == 1


async def test_max_turns(ws):
    looping = [{"tool_calls": [call("list_dir")]}] * 10
    traj = await run_episode(ReplayPolicy(looping), ws, "loop", AgentConfig(max_turns=3))
    assert traj.stop_reason == "max_turns" and len(traj.turns) == 3


async def test_tool_calls_beyond_the_cap_are_refused_not_run(ws):
    many = [{"tool_calls": [call("write_file", path=f"f{i}.txt", content="x") for i in range(5)]}]
    traj = await run_episode(ReplayPolicy(many), ws, "write", AgentConfig(max_tool_calls_per_turn=3))
    results = traj.turns[0].tool_calls
    assert [r.is_error for r in results] == [False, False, False, True, True]
    assert "at most 3 run per turn" in results[3].result
    assert "f2.txt" in traj.diff and "f3.txt" not in traj.diff


class _Slow:
    name = "slow"

    async def act(self, conversation: Conversation) -> AssistantTurn:
        await asyncio.sleep(5)
        raise AssertionError("not reached")


class _ThenFail:
    """Replays `turns`, then raises `exc`."""

    name = "then-fail"

    def __init__(self, turns: list[dict], exc: Exception):
        self.replay, self.exc = ReplayPolicy(turns), exc

    async def act(self, conversation: Conversation) -> AssistantTurn:
        if sum(m.role == "assistant" for m in conversation.messages) < len(self.replay.turns):
            return await self.replay.act(conversation)
        raise self.exc


async def _read_a_long_file_then_sample(ws, room: int, declared: bool, limits: AgentConfig | None = None):
    """An untrained model whose context is the prompt plus `room` tokens: its first turn reads a
    40,000-character file (said, not sampled), then the engine samples. `declared`: its checkpoint declares
    that context (ChatFormat.context_tokens). Returns the trajectory and the context."""
    from transformers import AutoModelForCausalLM

    from vivace.harness.chat import ChatFormat
    from vivace.inference.engine import AsyncEngine, Engine
    from vivace.model.checkpoint import tiny_config
    from vivace.model.tokenizer import reference_tokenizer

    chat = ChatFormat(reference_tokenizer())
    tools = [tool_schema(t) for t in default_tools()]
    context = len(chat.prompt_ids([Message("system", "s"), Message("user", "x")], tools)) + room
    if declared:
        chat.context_tokens = context
    model = AutoModelForCausalLM.from_config(tiny_config(len(chat.tokenizer), max_position_embeddings=context))
    await ws.write_text("big.txt", "".join(f"line {i}: some words of a long log\n" for i in range(1_200)))
    read = chat.assistant_ids(Message("assistant", "", tool_calls=(ToolCall("c1", "read_file", {"path": "big.txt"}),)))

    class ReadsThenSamples:
        def __init__(self, engine):
            self.engine, self.said = engine, False

        async def generate(self, prompt_ids, params):
            if not self.said:
                self.said = True
                return Completion(read, [0.0] * len(read), "stop", 0)
            return await self.engine.generate(prompt_ids, params)

    engine = AsyncEngine(Engine(model.eval()))
    try:
        return await run_episode(TokenPolicy(ReadsThenSamples(engine), chat, "small"), ws, "x", limits), context
    finally:
        engine.close()


async def test_a_tool_result_past_the_models_context_ends_the_episode_at_its_token_limit(ws):
    """A tool result that filled a small model's context (pytest -rA on a real repository, for the tiny
    policy's 8,192) ended the episode as an "error" with the engine's ValueError. It is the episode's length
    limit, as max_tokens is: that stop reason, the engine's words as the reason, and the turn that read the
    file kept. (A model that declares no context gets the usual 20,000 characters.)"""
    traj, context = await _read_a_long_file_then_sample(ws, 1024, declared=False)
    assert traj.stop_reason == "max_tokens", traj.error
    assert f"the model's context is {context}" in traj.error
    assert len(traj.turns) == 1 and traj.turns[0].tool_calls[0].name == "read_file"
    assert not traj.turns[0].tool_calls[0].is_error


async def test_a_model_with_a_small_declared_context_gets_tool_results_it_can_hold(ws):
    """The episode above, with the model's context declared by its checkpoint: the 40,000-character read is
    cut to 3/4 of the context in characters, so the next turn still fits and the episode goes on."""
    limits = AgentConfig(max_turns=2, max_turn_tokens=16)
    traj, context = await _read_a_long_file_then_sample(ws, 3_000, declared=True, limits=limits)
    # The second turn was sampled (16 tokens of an untrained model: its turn cap, not the context).
    assert len(traj.turns) == 2 and traj.turns[1].completion_tokens == 16 and traj.error is None, traj.error
    result = traj.turns[0].tool_calls[0].result
    assert "characters omitted" in result and "line 0:" in result and "line 1199:" in result
    assert len(result) <= context * 3 // 4 + 200  # the budget, and the note saying what was cut


class _Sized:
    name = "sized"

    def __init__(self, context_tokens):
        self.context_tokens = context_tokens


@pytest.mark.parametrize(
    "context, configured, budget",
    [
        (None, None, 20_000),  # an endpoint or script: nothing known
        (8_192, None, 6_144),  # the tiny policy
        (26_666, None, 19_999),
        (131_072, None, 20_000),  # a large context: the usual budget
        (0, None, 20_000),
        (8_192, 12_000, 12_000),  # agent.max_result_chars decides when set
        (None, 1_000, 1_000),
    ],
)
def test_a_tool_results_budget_follows_the_models_context_unless_configured(context, configured, budget):
    assert result_budget(AgentConfig(max_result_chars=configured), _Sized(context)) == budget
    assert result_budget(AgentConfig(), NullPolicy()) == 20_000  # a policy that says nothing of its context


async def test_a_commands_output_is_cut_to_the_budget_shared_by_its_two_streams(ws):
    script = [{"tool_calls": [call("run_terminal_cmd", command="seq 1 3000; seq 1 3000 >&2")]}]
    traj = await run_episode(ReplayPolicy(script), ws, "x", AgentConfig(max_turns=1, max_result_chars=2_000))
    text = traj.turns[0].tool_calls[0].result
    assert text.startswith("Exit code: 0\n--- stdout ---\n1\n2\n") and "--- stderr ---\n1\n" in text
    assert text.count("characters omitted") == 2 and len(text) < 2_000 + 400, len(text)
    assert text.rstrip().endswith("3000")


async def test_wall_clock_limit(ws):
    t0 = time.monotonic()
    traj = await run_episode(_Slow(), ws, "x", AgentConfig(max_wall_s=0.3))
    assert traj.stop_reason == "timeout" and time.monotonic() - t0 < 2
    assert "wall-clock" in traj.error


async def test_a_cancel_that_lands_as_the_model_answers_stops_the_episode(ws):
    """A Ctrl-C or an aborted rollout may cancel the episode in the very step its model call returns:
    Python 3.11's wait_for then returned the reply and the cancel was lost (the episode went on)."""
    answered = asyncio.get_running_loop().create_future()
    acts = []

    class Waits:
        name = "waits"

        async def act(self, conv):
            acts.append(1)
            return await answered

    episode = asyncio.ensure_future(run_episode(Waits(), ws, "x", AgentConfig(max_turns=3)))
    while not acts:
        await asyncio.sleep(0.01)
    answered.set_result(AssistantTurn(Message("assistant", "", tool_calls=(ToolCall("c1", "list_dir", {}),))))
    episode.cancel()
    with pytest.raises(asyncio.CancelledError):
        await episode
    assert len(acts) == 1


async def test_wall_clock_limit_interrupts_tools(ws):
    script = [{"tool_calls": [call("run_terminal_cmd", command="sleep 5")]}]
    t0 = time.monotonic()
    traj = await run_episode(ReplayPolicy(script), ws, "x", AgentConfig(max_wall_s=0.5))
    assert traj.stop_reason == "timeout" and "running tools" in traj.error
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("exc", [PolicyError("endpoint down"), RuntimeError("bug in policy")])
async def test_policy_failure_ends_the_episode_with_a_record(ws, exc):
    policy = _ThenFail([{"tool_calls": [call("list_dir")]}], exc)
    traj = await run_episode(policy, ws, "x")
    assert traj.stop_reason == "error" and str(exc) in traj.error
    assert len(traj.turns) == 1 and traj.turns[0].tool_calls[0].name == "list_dir"


def test_unknown_spec_lists_the_valid_forms(tmp_path):
    with pytest.raises(ValueError, match="scripted:replay:FILE"):
        load_policy("gpt-9")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_policy(f"scripted:replay:{bad}")
    bad.write_text('[{"nothing": 1}]')
    with pytest.raises(ValueError, match="bad.json: turn 1: expected an object"):
        load_policy(f"scripted:replay:{bad}")
    with pytest.raises(ValueError, match="does not exist"):
        load_policy(f"scripted:replay:{tmp_path / 'missing.json'}")


REPLAY_SHAPES = [  # (file content, what the error says after "FILE: ")
    ('[{"tool_calls": "read_file"}]', "turn 1: 'tool_calls' must be a list of calls, not str"),
    ('[{"tool_calls": 5}]', "turn 1: 'tool_calls' must be a list of calls, not int"),
    ('[{"content": "a"}, {"tool_calls": [{"nme": "read_file"}]}]', "turn 2: tool call 1 must be an object with a"),
    ('[{"tool_calls": ["read_file"]}]', "turn 1: tool call 1 must be an object"),
    ('[{"text": 5}]', "turn 1: 'text' must be a string"),
    ('[{"content": "a"}, "oops"]', "turn 2: expected an object"),
    ('{"content": "hi"}', "expected a JSON list of assistant turns, not dict"),
    # a misspelt key would silently drop what it holds (the calls, here)
    ('[{"content": "a", "toolcalls": [{"name": "read_file"}]}]', "turn 1: unknown key 'toolcalls'; a turn has"),
    ('[{"tool_calls": [{"name": "read_file", "args": {}}]}]', "turn 1: tool call 1: unknown key 'args'"),
    ('[{"tool_calls": [{"name": "read_file", "id": 5}]}]', "turn 1: tool call 1: 'id' must be a string"),
    ('[{"tool_calls": [{"name": "glob", "id": "x"}, {"name": "glob", "id": "x"}]}]', "turn 1: tool call 2: 'id' must"),
    ('[{"text": "hi", "finish_reason": 42}]', "turn 1: 'finish_reason' must be \"stop\" or \"length\", not 42"),
]  # fmt: skip


REPLAY_SHAPE_IDS = ["calls-str", "calls-int", "call-no-name", "call-str", "text-int", "turn-str", "not-a-list",
                    "turn-key-misspelt", "call-key-misspelt", "id-int", "id-twice", "finish-int"]  # fmt: skip


@pytest.mark.parametrize("content,said", REPLAY_SHAPES, ids=REPLAY_SHAPE_IDS)
def test_replay_files_are_checked_when_loaded(tmp_path, content, said):
    script = tmp_path / "turns.json"
    script.write_text(content)
    with pytest.raises(ValueError) as info:
        load_policy(f"scripted:replay:{script}")
    assert str(info.value).startswith(f"{script}: {said}"), str(info.value)


def test_replay_file_that_cannot_be_read_is_named(tmp_path):
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "latin1.json").write_bytes(b'\xff[{"content": "hi"}]')
    for name, said in [("dir.json", "cannot read the replay file"), ("latin1.json", "not UTF-8 text")]:
        with pytest.raises(ValueError, match=f"{name}: .*{said}"):
            load_policy(f"scripted:replay:{tmp_path / name}")
    # Every documented form still loads: a message with calls (arguments an object or a JSON string,
    # tool_calls null), raw text, and an id'd call.
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps([
        {"content": "Reading.", "tool_calls": [{"name": "read_file", "arguments": {"path": "a.py"}}]},
        {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": '{"path": "a.py"}'}]},
        {"content": None, "tool_calls": None, "text": "I'll look."},
        {"content": "done"},
    ]))  # fmt: skip
    assert len(load_policy(f"scripted:replay:{ok}").turns) == 4


def test_only_scripted_policies_count_as_deterministic():
    for spec in ("scripted:null", "scripted:oracle", "scripted:random-edit", "scripted:replay:turns.json"):
        assert deterministic(spec), spec
    for spec in ("tiny", "runs/x/model", "http://127.0.0.1:8000/v1#m", "tokens:http://127.0.0.1:8000/v1#m",
                 "scripted:nonsense"):  # fmt: skip
        assert not deterministic(spec), spec


# --- the OpenAI-compatible endpoint, through the real client over HTTP -----------------------


class FakeOpenAI:
    """A chat-completions server that answers from a script and records the requests."""

    def __init__(self, replies: list[dict]):
        self.replies, self.requests = replies, []
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)
        self.app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": "fake-1", "object": "model"}]})

    async def complete(self, request: Request) -> dict:
        body = await request.json()
        self.requests.append(body)
        message = self.replies[min(len(self.requests), len(self.replies)) - 1]
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
            ],
            "usage": {"prompt_tokens": 100 * len(self.requests), "completion_tokens": 7, "total_tokens": 0},
        }


@pytest.fixture
def openai_server():
    fake = FakeOpenAI([])
    server = uvicorn.Server(uvicorn.Config(fake.app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield fake, f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(5)


def _tool_call(id_: str, name: str, arguments: str) -> dict:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


async def test_openai_endpoint_policy(ws, openai_server):
    fake, url = openai_server
    fake.replies = [
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            _tool_call("a", "read_file", '{"path": "pkg/calc.py"}'),
            _tool_call("b", "read_file", '{"path": "pkg/calc.py"'),  # broken JSON from the model
        ]},
        {"role": "assistant", "content": "Done reading."},
    ]  # fmt: skip
    policy = load_policy(url)  # no #model: the server's only model
    traj = await run_episode(policy, ws, "read calc")
    await close_policy(policy)
    assert traj.stop_reason == "done" and traj.final_message == "Done reading."
    first = traj.turns[0]
    assert not first.tool_calls[0].is_error and "def add" in first.tool_calls[0].result
    assert first.tool_calls[1].format_error and "not valid JSON" in first.tool_calls[1].result
    assert traj.format_errors == 1
    assert (first.prompt_tokens, first.completion_tokens) == (100, 7)
    # The second request carried the tool results in OpenAI form, answering the right call ids.
    second = fake.requests[1]
    assert second["model"] == "fake-1" and len(second["tools"]) >= 10
    tool_msgs = [m for m in second["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["a", "b"]


async def test_openai_endpoint_down_is_an_error_stop(ws):
    policy = load_policy("http://127.0.0.1:9/v1#m")
    traj = await run_episode(policy, ws, "x")
    await close_policy(policy)
    assert traj.stop_reason == "error" and "endpoint failed" in traj.error


# --- token level: the sequence RL trains on ------------------------------------------------


class ScriptedSampler:
    """Generates, per call, the canonical ids of the next scripted assistant message."""

    def __init__(self, chat, messages: list[Message], version: int = 3):
        self.chat, self.messages, self.version = chat, messages, version
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        self.prompts.append(list(prompt_ids))
        self.params.append(params)
        ids = self.chat.assistant_ids(self.messages[len(self.prompts) - 1])
        finish = "stop"
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        return Completion(ids, [-0.5] * len(ids), finish, self.version)


SCHEMAS = [tool_schema(t) for t in default_tools()]  # what run_episode gives the policy by default
TOKEN_SCRIPT = [
    Message("assistant", "Both at once.", (
        ToolCall("call_0", "read_file", {"path": "pkg/calc.py"}),
        ToolCall("call_1", "grep", {"pattern": "def ", "path": "pkg"}),
        ToolCall("call_2", "read_file", {"path": "missing.py"}),  # an error result in the sequence
    )),
    Message("assistant", "", (ToolCall("call_0", "edit_file", {"path": "pkg/calc.py", "old_string": "a - b", "new_string": "b - a"}),)),
    Message("assistant", "Fixed sub."),
]  # fmt: skip


async def test_token_policy_episode_is_token_exact(ws, chat_format):
    sampler = ScriptedSampler(chat_format, TOKEN_SCRIPT)
    policy = TokenPolicy(sampler, chat_format, name="scripted-tokens")
    traj = await run_episode(policy, ws, "fix sub")
    assert traj.stop_reason == "done" and len(traj.turns) == 3 and "+    return b - a" in traj.diff
    assert traj.turns[0].tool_calls[2].is_error

    # Every prompt the sampler saw equals a full rendering of the conversation so far: the
    # incremental token sequence never diverges from re-rendering (prefix property, end to end).
    messages = [Message.from_openai(m) for m in traj.to_messages()]
    assistant_at = [i for i, m in enumerate(messages) if m.role == "assistant"]
    for prompt, k in zip(sampler.prompts, assistant_at, strict=True):
        assert prompt == chat_format.prompt_ids(messages[:k], SCHEMAS)

    # The loss mask covers exactly the sampled tokens, with their logprobs and version.
    t = traj.tokens
    assert len(t.ids) == len(t.loss_mask) == len(t.logprobs) == len(t.versions)
    sampled = [i for i, m in zip(t.ids, t.loss_mask, strict=True) if m]
    assert sampled == [i for m in TOKEN_SCRIPT for i in chat_format.assistant_ids(m)]
    assert {lp for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m} == {-0.5}
    assert {v for v, m in zip(t.versions, t.loss_mask, strict=True) if not m} == {-1}
    assert {v for v, m in zip(t.versions, t.loss_mask, strict=True) if m} == {3}
    assert [turn.policy_version for turn in traj.turns] == [3, 3, 3]
    assert traj.turns[1].prompt_tokens == len(sampler.prompts[1])


async def test_episode_seed_seeds_every_turn_apart_and_the_same_for_every_policy(ws, chat_format):
    from vivace.harness.policy import derive_seed

    def scripted(policy_seed=None):
        sampler = ScriptedSampler(chat_format, TOKEN_SCRIPT)
        return sampler, TokenPolicy(sampler, chat_format, "t", SamplingParams(seed=policy_seed))

    sampler, policy = scripted()
    await run_episode(policy, ws, "fix sub", seed=7)
    first = [p.seed for p in sampler.params]
    assert first == [derive_seed(7, k) for k in range(3)] and len(set(first)) == 3  # one per turn
    sampler, policy = scripted()
    await run_episode(policy, ws, "fix sub", seed=7)
    assert [p.seed for p in sampler.params] == first  # another policy, the same episode seed: same draws
    assert derive_seed(8, 0) != first[0] and derive_seed("a", 1) == derive_seed("a", 1)
    sampler, policy = scripted(policy_seed=3)
    await run_episode(policy, ws, "fix sub")  # no episode seed: the policy's own (here fixed) seed
    assert [p.seed for p in sampler.params] == [3, 3, 3]


async def test_token_policy_truncated_turn_is_closed_and_the_episode_goes_on(ws, chat_format):
    long_call = Message("assistant", "x " * 40, (ToolCall("call_0", "list_dir", {"path": "."}),))
    sampler = ScriptedSampler(chat_format, [long_call, Message("assistant", "ok")])
    traj = await run_episode(TokenPolicy(sampler, chat_format, "t"), ws, "go", AgentConfig(max_turn_tokens=16))
    first = traj.turns[0]
    assert first.finish_reason == "length" and first.completion_tokens == 16
    # Cut inside the text: no tool call, so it ends the episode as a truncated answer.
    assert traj.stop_reason == "max_tokens"
    t = traj.tokens
    eot = chat_format.stop_ids[0]
    n_prompt = len(sampler.prompts[0])
    assert t.loss_mask[n_prompt : n_prompt + 16] == [1] * 16
    assert t.ids[n_prompt + 16] == eot and t.loss_mask[n_prompt + 16] == 0  # closed, not trained on


async def test_a_file_name_that_is_not_utf8_is_shown_escaped_and_taken_back(ws, chat_format):
    """A latin-1 name (old archives, Windows zips) came back from list_dir as a lone surrogate, which no
    tokenizer or HTTP body can encode: the next turn ended the episode. It is shown as `\\xNN`, and a
    path argument in that spelling names the file."""
    name = os.fsdecode(b"caf\xe9.txt")
    await ws.write_text(name, "price = 1\n")
    script = [
        Message("assistant", "", (ToolCall("c0", "list_dir", {"path": "."}), ToolCall("c1", "glob_file_search", {"glob_pattern": "*.txt"}))),
        Message("assistant", "", (ToolCall("c0", "read_file", {"path": "caf\\xe9.txt"}),)),
        Message("assistant", "", (ToolCall("c0", "edit_file", {"path": "caf\\xe9.txt", "old_string": "1", "new_string": "2"}),)),
        Message("assistant", "Raised the price."),
    ]  # fmt: skip
    policy = TokenPolicy(ScriptedSampler(chat_format, script), chat_format, name="scripted-tokens")
    traj = await run_episode(policy, ws, "raise the price")
    assert traj.stop_reason == "done" and traj.error is None, traj.error
    results = [c.result for t in traj.turns for c in t.tool_calls]
    assert "caf\\xe9.txt (10 B)" in results[0] and "caf\\xe9.txt" in results[1], results[:2]
    assert "price = 1" in results[2] and not any(c.is_error for t in traj.turns for c in t.tool_calls), results
    assert await ws.read_text(name) == "price = 2\n"
    json.loads(traj.model_dump_json()).__str__().encode()  # valid Unicode all the way to the saved trajectory
