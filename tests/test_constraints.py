"""Tool-argument constraints: which tokens may come next while a read_file path or an edit_file
old_string is written, the sampler's mask (logprobs stay unmasked), and the agent loop's wiring."""

from __future__ import annotations

import pytest
import torch

from conftest import make_backend
from test_agent import ScriptedSampler
from test_engine import reference_logprobs, small_model
from vivace.config import AgentConfig
from vivace.harness.agent import argument_values, run_episode
from vivace.harness.constraints import ArgumentConstraint, ArgumentValues, token_texts
from vivace.harness.messages import Message, ToolCall
from vivace.harness.policy import PolicyError, SamplingParams, TokenPolicy
from vivace.inference.engine import Engine
from vivace.inference.samplers import HttpSampler
from vivace.inference.sampling import sample

CORE = 'def average(xs):\n    if not xs:\n        return "none"\n    return sum(xs) / len(xz)\n'
VALUES = ArgumentValues(("shop/core.py", "shop/util.py", "tests/test_core.py"), {"shop/core.py": CORE})
READ = '<tool_call>\n{"name": "read_file", "arguments": {"path": "'
EDIT = '<tool_call>\n{"name": "edit_file", "arguments": {"path": "shop/core.py", "old_string": "'


@pytest.fixture(scope="module")
def texts(chat_format):
    return token_texts(chat_format.tokenizer)


def allowed_texts(chat_format, texts, written: str, values: ArgumentValues = VALUES) -> set[str] | None:
    ids = chat_format.encode(written)
    allowed = ArgumentConstraint(values, texts).allowed(ids)
    return None if allowed is None else {texts[i] for i in allowed}


def test_read_file_path_must_be_an_existing_file(chat_format, texts):
    start = allowed_texts(chat_format, texts, "Reading.\n" + READ)
    assert {"s", "t"} <= start and all(any(p.startswith(t) for p in VALUES.paths) for t in start)
    # Inside the name only a continuation of an existing path; the quote closes a whole path only.
    assert all("shop/core.py"[4:].startswith(t) or "shop/util.py"[4:].startswith(t) for t in
               allowed_texts(chat_format, texts, READ + "shop"))  # fmt: skip
    closing = allowed_texts(chat_format, texts, READ + "shop/core.py")
    assert closing and all(t.startswith('"') for t in closing) and '"' in closing
    assert allowed_texts(chat_format, texts, READ + "shop/co") and '"' not in allowed_texts(
        chat_format, texts, READ + "shop/co"
    )


def test_old_string_must_be_in_the_file_and_the_json_must_go_on(chat_format, texts):
    inside = allowed_texts(chat_format, texts, EDIT + "    if not x")
    assert inside and all(("    if not x" + t.split('"')[0]) in CORE for t in inside)
    assert '"' in inside  # any substring may end the old_string
    assert "z" not in inside  # "if not xz" is not in the file
    # A closing quote must be followed by what JSON allows after a value.
    after = allowed_texts(chat_format, texts, EDIT + "sum(xs)")
    assert all(t.split('"', 1)[1].lstrip()[:1] in ("", ",", "}") for t in after if '"' in t)
    # Escapes: the file's quotes and newlines are written as the template writes them (\" and \n).
    assert allowed_texts(chat_format, texts, EDIT + 'return \\"no') >= {"n"}
    assert allowed_texts(chat_format, texts, EDIT + "xs:\\n") and "x" not in allowed_texts(
        chat_format, texts, EDIT + "xs:\\n"
    )


def test_no_constraint_where_none_applies(chat_format, texts):
    assert allowed_texts(chat_format, texts, "I will read the file.") is None  # no call open
    assert allowed_texts(chat_format, texts, EDIT + 'x", "new_string": "') is None  # the fix is free
    assert allowed_texts(chat_format, texts, '<tool_call>\n{"name": "grep", "arguments": {"path": "') is None
    unread = EDIT.replace("shop/core.py", "shop/util.py")
    assert allowed_texts(chat_format, texts, unread) is None  # a file not read in the episode
    closed = READ + 'shop/core.py"}}\n</tool_call>\nand "path": "'
    assert allowed_texts(chat_format, texts, closed) is None
    # A value already off the allowed set (nothing fits) leaves the policy free rather than stuck.
    assert allowed_texts(chat_format, texts, READ + "zz") is None


def test_mask_restricts_the_pick_but_not_the_logprob():
    logits = torch.tensor([[3.0, 1.0, 0.5, -1.0], [3.0, 1.0, 0.5, -1.0]])
    g = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)]
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=0.7), SamplingParams(top_k=1)):
        for _ in range(50):
            (a, b), (lpa, _) = sample(logits, [params, params], g, [[1, 3], None])
            assert a in (1, 3)
            t = params.temperature if params.temperature > 0 else 1.0
            assert lpa == pytest.approx(torch.log_softmax(logits[0] / t, -1)[a].item(), abs=1e-6)
        if params.temperature == 0 or params.top_k == 1:
            assert a == 1 and b == 0  # the best allowed token; the unconstrained row keeps its argmax


def test_engine_applies_the_hook_per_request():
    model = small_model()
    engine = Engine(model, max_batch=4)
    free = SamplingParams(max_tokens=6, temperature=1.0, seed=1)
    seen: list[list[int]] = []

    def only_seven(generated):
        seen.append(list(generated))
        return [7]

    forced = SamplingParams(max_tokens=6, temperature=1.0, seed=1, allowed=only_seven)
    out_free, out_forced = engine.run([[1, 2, 3], [1, 2, 3]], [free, forced])
    assert out_forced.token_ids == [7] * 6 and out_free.token_ids != [7] * 6
    assert seen == [[7] * k for k in range(6)]  # called with the tokens so far, once per token
    ref = reference_logprobs(model, [1, 2, 3], [7] * 6)
    assert out_forced.logprobs == pytest.approx(ref, abs=1e-4)  # the model's own logprobs, unmasked


async def test_http_sampler_refuses_a_constraint():
    sampler = HttpSampler("http://127.0.0.1:9/v1", "m")
    with pytest.raises(PolicyError, match="constrain_arguments"):
        await sampler.generate([1, 2], SamplingParams(allowed=lambda generated: None))
    await sampler.aclose()


async def test_argument_values_list_files_and_what_was_read(repo, state_dir):
    backend = make_backend("plain", state_dir)
    ws = await backend.create(backend.snapshot(str(repo)))
    try:
        asked = Message("assistant", "", (
            ToolCall("a", "read_file", {"path": "pkg/calc.py"}),
            ToolCall("b", "read_file", {"path": "gone.py"}),  # missing: skipped
            ToolCall("c", "read_file", "not json"),  # malformed: skipped
        ))  # fmt: skip
        values = await argument_values(ws, [Message("user", "x"), asked])
        assert "pkg/calc.py" in values.paths and "tests/test_calc.py" in values.paths
        assert set(values.contents) == {"pkg/calc.py"} and "def sub(a, b)" in values.contents["pkg/calc.py"]
    finally:
        await backend.aclose()


async def test_episode_passes_the_constraint_to_the_sampler(repo, state_dir, chat_format):
    backend = make_backend("plain", state_dir)
    script = [
        Message("assistant", "", (ToolCall("c0", "read_file", {"path": "pkg/calc.py"}),)),
        Message("assistant", "Done."),
    ]
    try:
        for on in (True, False):
            ws = await backend.create(backend.snapshot(str(repo)))
            sampler = ScriptedSampler(chat_format, script)
            policy = TokenPolicy(sampler, chat_format, "t")
            await run_episode(policy, ws, "fix it", AgentConfig(constrain_arguments=on))
            first, second = sampler.params
            if not on:
                assert first.allowed is None and second.allowed is None
                continue
            edit = chat_format.encode(EDIT.replace("shop/core.py", "pkg/calc.py") + "return a")
            allowed = {chat_format.decode([i]) for i in second.allowed(edit)}
            assert allowed and all(
                ("return a" + t.split('"')[0]) in "    return a + b\n    return a - b" for t in allowed
            )
            assert first.allowed(edit) is None  # before the read, pkg/calc.py's text was not offered
            await ws.close()
    finally:
        await backend.aclose()
