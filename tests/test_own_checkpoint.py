"""A checkpoint the user brings (`--model DIR`): small random models of the architectures people
point vivace at (Qwen3, Qwen3-MoE, Qwen2.5, Llama 3, Mistral), saved the way such checkpoints
ship (bf16 weights, tied or padded embeddings, their own tokenizers and chat templates). The engine
must either generate what transformers generates or refuse the model by name, and the harness
must stop each turn where the model ends it, whatever the tokenizer calls its end of text."""

from __future__ import annotations

import asyncio
import json
import re

import openai
import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM as Auto
from transformers import (
    GenerationConfig,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from vivace.config import EngineConfig
from vivace.harness.chat import END_OF_TURN, QWEN_TEMPLATE, ChatFormat
from vivace.harness.messages import Message
from vivace.harness.policy import Conversation, SamplingParams
from vivace.inference.engine import Engine
from vivace.inference.samplers import local_engine, token_policy
from vivace.inference.server import create_app
from vivace.model.checkpoint import declared_context, generation_eos_ids, load_model, load_tokenizer
from vivace.model.tokenizer import QWEN_SPLIT, reference_tokenizer
from vivace.sandbox.background import BackgroundServer

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]  # fmt: skip
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512, initializer_range=0.2)  # fmt: skip
# Llama 3's chat template without its tool parts (what Llama-3-Instruct checkpoints ship).
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' "
    "+ m.content | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


LLAMA3_SPECIALS = ["<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def llama3_tokenizer(specials: list[str] = LLAMA3_SPECIALS) -> PreTrainedTokenizerFast:
    """A byte-level BPE with Llama 3's control tokens (the first is id 0; by default its eos,
    <|end_of_text|>), no pad token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(["def read_file(path):\n    return open(path).read()\n"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                   chat_template=LLAMA3_TEMPLATE, clean_up_tokenization_spaces=False)  # fmt: skip


def save(
    path, config, tokenizer, dtype=torch.float32, silent: bool = False, generation: GenerationConfig | None = None
):
    """A checkpoint directory as save_pretrained writes it. `silent`: the final norm is zero, so
    every logit is 0 and greedy decoding picks id 0 at every step."""
    torch.manual_seed(0)
    model = Auto.from_config(config).to(dtype)
    if silent:
        torch.nn.init.zeros_(model.model.norm.weight)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if generation is not None:
        generation.save_pretrained(path)
    return path


def ref_vocab() -> int:
    return len(reference_tokenizer())


ARCHITECTURES = {
    "qwen3 (tied)": lambda: Qwen3Config(vocab_size=ref_vocab(), head_dim=8, tie_word_embeddings=True, **SMALL),
    "qwen3-moe": lambda: Qwen3MoeConfig(
        vocab_size=ref_vocab(), head_dim=8, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, **SMALL
    ),  # fmt: skip
    "qwen2.5 (bias, padded vocab)": lambda: Qwen2Config(vocab_size=ref_vocab() + 64, **SMALL),
    "llama 3 (rope scaling)": lambda: LlamaConfig(
        vocab_size=ref_vocab(),
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
        **SMALL,
    ),  # fmt: skip
    "mistral (no window)": lambda: MistralConfig(vocab_size=ref_vocab(), sliding_window=None, **SMALL),
}


@pytest.mark.parametrize("name", ARCHITECTURES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16-weights"])
def test_the_engine_generates_what_transformers_generates(tmp_path, name, dtype):
    path = save(tmp_path / "ckpt", ARCHITECTURES[name](), reference_tokenizer(), dtype)
    model = load_model(str(path)).model  # computes in fp32 whatever the weights' dtype
    prompts = [list(range(5, 45)), list(range(100, 103)), list(range(7, 90, 3))]
    engine = Engine(model, max_step_tokens=32)  # prompts prefill in chunks beside decoding sequences
    outs = engine.run(prompts, SamplingParams(max_tokens=12, temperature=0))
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                                 pad_token_id=0)[0, len(prompt) :].tolist()  # fmt: skip
        assert out.token_ids == ref


@pytest.mark.parametrize(
    "config",
    [
        lambda: MistralConfig(vocab_size=64, sliding_window=16, **SMALL),
        lambda: Qwen2Config(vocab_size=64, use_sliding_window=True, sliding_window=16, max_window_layers=1, **SMALL),
    ],
    ids=["mistral-v0.1", "qwen2-use_sliding_window"],
)
def test_a_sliding_window_model_is_refused_with_its_window(config):
    model = Auto.from_config(config())
    with pytest.raises(ValueError, match=r"sliding-window attention \(a window of 16 positions in a context of 512\)"):
        Engine(model)


@pytest.fixture(scope="module")
def llama3_ckpt(tmp_path_factory):
    """A Llama-3-style checkpoint whose model ends every turn at once with <|end_of_text|> (its eos,
    not the template's <|eot_id|>), a template without tools, bf16 weights and an eos list in
    generation_config.json."""
    tok = llama3_tokenizer()
    eot, eos = tok.convert_tokens_to_ids("<|eot_id|>"), tok.eos_token_id
    assert eos == 0 and tok.pad_token is None
    cfg = LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
        **{**SMALL, "max_position_embeddings": 4096},
    )
    generation = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=[eos, eot])
    return save(
        tmp_path_factory.mktemp("llama3") / "ckpt", cfg, tok, torch.bfloat16, silent=True, generation=generation
    )


def test_a_template_without_tools_falls_back_and_turns_end_at_the_models_eos(llama3_ckpt, caplog):
    with caplog.at_level("WARNING", logger="vivace.harness.chat"):
        policy = token_policy(str(llama3_ckpt), EngineConfig(device="cpu", temperature=0))
    chat = policy.chat
    assert "does not show the tools to the model" in caplog.text
    assert chat.template == QWEN_TEMPLATE.replace(END_OF_TURN, "<|end_of_text|>")
    eot = chat.tokenizer.convert_tokens_to_ids("<|eot_id|>")
    assert chat.end_of_turn == "<|end_of_text|>" and chat.stop_ids == [0, eot]  # eot: generation_config.json's
    conversation = Conversation([Message("user", "Read a.py.")], TOOLS, max_turn_tokens=50)
    turn = asyncio.run(policy.act(conversation))
    assert (turn.finish_reason, turn.token_ids, turn.message) == ("stop", [0], Message("assistant", ""))
    policy.sampler.close()


def test_serve_stops_at_the_models_eos(llama3_ckpt):
    engine, chat = local_engine(str(llama3_ckpt), EngineConfig(device="cpu"))
    srv = BackgroundServer(create_app(engine, chat, "llama3"))
    srv.start()
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
        args = dict(
            model="llama3", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, max_tokens=50, temperature=0
        )
        reply = client.chat.completions.create(**args)
        assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens == 1
        chunks = list(client.chat.completions.create(**args, stream=True))
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    finally:
        srv.stop()
        engine.close()


@pytest.fixture(scope="module")
def eot_ckpt(tmp_path_factory):
    """A Llama-3-Instruct-style checkpoint whose model ends every turn at once with <|eot_id|>
    (id 0), which only its generation_config.json's eos list names: the tokenizer's eos is
    <|end_of_text|> and the template (no tools: vivace's is used) ends turns with that."""
    tok = llama3_tokenizer(["<|eot_id|>", *(t for t in LLAMA3_SPECIALS if t != "<|eot_id|>")])
    eot, eos = tok.convert_tokens_to_ids("<|eot_id|>"), tok.eos_token_id
    assert eot == 0 and eos != 0
    cfg = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=eos,
                      **{**SMALL, "max_position_embeddings": 4096})  # fmt: skip
    generation = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=[eos, eot])
    return save(tmp_path_factory.mktemp("eot") / "ckpt", cfg, tok, silent=True, generation=generation)


def test_turns_end_at_an_eos_id_only_the_generation_config_names(eot_ckpt):
    """The agent and RL path (TokenPolicy) and `vivace serve` both stop at <|eot_id|>, rather than
    sampling it to max_tokens and showing it as content."""
    policy = token_policy(str(eot_ckpt), EngineConfig(device="cpu", temperature=0))
    try:
        assert policy.chat.stop_ids == [policy.chat.tokenizer.eos_token_id, 0]
        conversation = Conversation([Message("user", "Read a.py.")], TOOLS, max_turn_tokens=20)
        turn = asyncio.run(policy.act(conversation))
        assert (turn.finish_reason, turn.token_ids, turn.message) == ("stop", [0], Message("assistant", ""))
    finally:
        policy.sampler.close()
    engine, chat = local_engine(str(eot_ckpt), EngineConfig(device="cpu"))
    srv = BackgroundServer(create_app(engine, chat, "eot"))
    srv.start()
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)
        args = dict(model="eot", messages=[{"role": "user", "content": "hi"}], max_tokens=20, temperature=0)
        for tools in ([], TOOLS):
            reply = client.chat.completions.create(**args, **({"tools": tools} if tools else {}))
            assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens == 1
            assert not reply.choices[0].message.content
    finally:
        srv.stop()
        engine.close()


def ckpt_tokenizer_dir(path, generation: str | None):
    """A directory with the reference tokenizer and (given) this generation_config.json text."""
    reference_tokenizer().save_pretrained(path)
    if generation is not None:
        (path / "generation_config.json").write_text(generation)
    return str(path)


@pytest.mark.parametrize(
    "text, ids",
    [(None, []), ("{}", []), ('{"eos_token_id": 6}', [6]), ('{"eos_token_id": [1, 6, 1], "top_p": 0.9}', [1, 6])],
    ids=["no file", "no field", "one id", "a list"],
)
def test_generation_eos_ids_reads_an_id_or_a_list(tmp_path, text, ids):
    assert generation_eos_ids(ckpt_tokenizer_dir(tmp_path, text)) == ids


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{not json", "cannot read it as JSON"),
        ("[6]", "expected a JSON object, got list"),
        ('{"eos_token_id": "<|im_end|>"}', 'eos_token_id must be a token id or a list of token ids, got "<|im_end|>"'),
        ('{"eos_token_id": [6, -1]}', "eos_token_id must be a token id or a list of token ids, got [6, -1]"),
    ],
)
def test_a_malformed_generation_config_is_refused_by_name(tmp_path, text, problem):
    path = ckpt_tokenizer_dir(tmp_path, text)
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'generation_config.json'}: {problem}")):
        ChatFormat(load_tokenizer(path))


def test_a_malformed_generation_config_is_refused_before_the_weights_load(tmp_path, monkeypatch):
    """The chat format is built after the weights; for a large model that is minutes before the error."""
    from vivace.inference import samplers

    path = ckpt_tokenizer_dir(tmp_path, "{not json")

    def load(*args, **kwargs):
        raise AssertionError("the weights were loaded first")

    monkeypatch.setattr(samplers, "load_for_engine", load)
    with pytest.raises(ValueError, match="generation_config.json: cannot read it as JSON"):
        samplers.local_engine(str(path))


def test_generation_eos_ids_outside_the_vocabulary_are_ignored_with_a_warning(tmp_path, caplog):
    path = ckpt_tokenizer_dir(tmp_path, '{"eos_token_id": [6, 99999]}')
    with caplog.at_level("WARNING", logger="vivace.harness.chat"):
        chat = ChatFormat(load_tokenizer(path))
    assert chat.stop_ids == [1, 6]
    assert f"{path}/generation_config.json's eos_token_id [99999] not in the tokenizer's" in caplog.text


@pytest.mark.parametrize(
    "text, context",
    [
        (None, None),
        ('{"max_position_embeddings": 4096}', 4096),
        ('{"text_config": {"max_position_embeddings": 32768}}', 32768),  # a multimodal config
        ('{"max_position_embeddings": 4096, "text_config": {"max_position_embeddings": 9}}', 4096),
        ("{}", None),
        ("{not json", None),  # load_tokenizer and load_model name a config.json that is not a JSON object
        ("[4096]", None),
        ('{"max_position_embeddings": true}', None),
        ('{"max_position_embeddings": -1}', None),
        ('{"max_position_embeddings": "4096"}', None),
        ('{"text_config": [1]}', None),
    ],
)
def test_the_chat_format_knows_the_context_its_checkpoint_declares(tmp_path, text, context):
    """The agent sizes tool results by it (agent.result_budget); a config.json that says nothing usable is
    an unknown context, never an error here."""
    path = ckpt_tokenizer_dir(tmp_path, None)
    if text is not None:
        (tmp_path / "config.json").write_text(text)
    assert declared_context(path) == context
    if text not in ("{not json", "[4096]"):
        assert ChatFormat(load_tokenizer(path)).context_tokens == context


def test_the_shipped_tiny_declares_its_8192_token_context():
    assert ChatFormat(load_tokenizer("tiny")).context_tokens == 8192
    assert ChatFormat(reference_tokenizer()).context_tokens is None  # no checkpoint beside it


@pytest.mark.parametrize("spec", ["tiny", "tiny-init"])
def test_the_shipped_models_stop_where_they_did(spec):
    """Their generation configs name no eos: their stop ids, template and end tags are the ones a
    ChatFormat without generation-config ids has."""
    tok = load_tokenizer(spec)
    chat, plain = ChatFormat(tok), ChatFormat(tok, eos_ids=[])
    assert chat.stop_ids == plain.stop_ids == [tok.convert_tokens_to_ids(t) for t in (END_OF_TURN, "<|endoftext|>")]
    assert (chat.template, chat.end_of_turn, chat._end_tags) == (QWEN_TEMPLATE, END_OF_TURN, plain._end_tags)


def test_a_qwen3_template_checkpoint_runs_past_its_first_turn(tmp_path):
    """Qwen3's template writes an empty <think> block into the last assistant turn only, so the
    tokens sampled for one turn are not how it renders once a tool result follows; vivace's own
    template (the same format without <think>) is used instead of failing on the second turn."""
    tok = reference_tokenizer()
    qwen3 = QWEN_TEMPLATE.replace(
        "{{- '<|im_start|>assistant\\n' }}\n        {{- message.content }}",
        "{{- '<|im_start|>assistant\\n' }}\n        {%- if loop.last %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
        "\n        {{- message.content }}",
        1,
    )
    assert qwen3 != QWEN_TEMPLATE
    original = tok.chat_template
    try:
        tok.chat_template = qwen3
        path = save(tmp_path / "ckpt", ARCHITECTURES["qwen3 (tied)"](), tok, silent=True)
    finally:
        tok.chat_template = original  # the shared reference tokenizer
    policy = token_policy(str(path), EngineConfig(device="cpu", temperature=0))
    conversation = Conversation([Message("user", "Read a.py.")], TOOLS, max_turn_tokens=3)
    for _ in range(2):
        turn = asyncio.run(policy.act(conversation))
        assert turn.finish_reason == "length" and turn.message.tool_calls  # id 0 is <|im_start|>: a stray tag
        conversation.messages.append(turn.message)
        conversation.messages += [Message("tool", c.error or "", tool_call_id=c.id, name=c.name)
                                  for c in turn.message.tool_calls]  # fmt: skip
    assert len(conversation.tokens.ids) > 0
    policy.sampler.close()


@pytest.mark.parametrize("writer", ["save_checkpoint", "save_streamed"])
def test_a_trained_checkpoint_keeps_the_files_that_say_how_to_use_it(eot_ckpt, tmp_path, writer):
    """sft train (save_checkpoint) and the RL trainer (save_streamed) wrote the tokenizer and generation
    config anew: the RL output ended generation at one id of the eos list its source gave (so it no longer
    stopped at <|eot_id|>), and both rewrote tokenizer_config.json and dropped the license."""
    import shutil

    from vivace.model.checkpoint import save_checkpoint
    from vivace.model.stream_save import save_streamed

    source = tmp_path / "source"
    shutil.copytree(eot_ckpt, source)
    config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"}))
    (source / "chat_template.jinja").write_text(LLAMA3_TEMPLATE)
    (source / "LICENSE").write_text("the model's license\n")
    (source / "warm_start.json").write_text("{}")  # the source's own record: not the trained model's
    loaded = load_model(str(source))
    out = tmp_path / "out"
    if writer == "save_checkpoint":
        save_checkpoint(loaded.model, loaded.tokenizer, out)
    else:
        state = loaded.model.state_dict()
        save_streamed(loaded.model, loaded.tokenizer, ((n, state[n]) for n in sorted(state)), out)

    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "LICENSE"):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    assert not (out / "warm_start.json").exists()
    assert generation_eos_ids(out) == generation_eos_ids(source) == [loaded.tokenizer.eos_token_id, 0]
    reloaded = load_model(str(out))
    trained, again = ChatFormat(loaded.tokenizer), ChatFormat(reloaded.tokenizer)
    assert again.stop_ids == trained.stop_ids
    # The source's template cannot show tool calls, so the model was trained in vivace's format: the
    # checkpoint carries that one (a vLLM user would prompt it in Llama 3's), and vivace renders alike.
    assert not trained.own_template and reloaded.tokenizer.chat_template == trained.template != LLAMA3_TEMPLATE
    conversation = [Message("system", "Be brief."), Message("user", "Read a.py.")]
    assert again.prompt_ids(conversation, TOOLS) == trained.prompt_ids(conversation, TOOLS) and again.own_template
    for name, value in loaded.model.state_dict().items():
        assert torch.equal(reloaded.model.state_dict()[name], value), name


def test_a_trained_checkpoint_keeps_a_template_vivace_renders_with_as_it_is(tmp_path):
    """The shipped tiny's own template is the one the harness uses: saved, it is the same bytes."""
    from vivace.model.checkpoint import TINY_DIR, save_checkpoint

    loaded = load_model("tiny")
    assert ChatFormat(loaded.tokenizer).own_template
    save_checkpoint(loaded.model, loaded.tokenizer, tmp_path / "out")
    assert (tmp_path / "out" / "chat_template.jinja").read_bytes() == (TINY_DIR / "chat_template.jinja").read_bytes()
