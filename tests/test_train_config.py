"""`vivace train`'s up-front checks: a configuration that can never train is refused before the run
directory and Ray (exit 2, one line naming the setting); one that is legal but likely useless trains
with a warning printed once at the start. Validation only: no run starts here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import vivace_refusal
from vivace.cli import app
from vivace.config import PRESETS, load_config, load_preset

STARTED = 99  # the exit code of a run that got past the checks (the run itself is not started here)


@pytest.fixture(autouse=True)
def _no_run(monkeypatch):
    """The run itself (Ray, rollouts) is replaced: a configuration that passes the checks exits STARTED."""
    import typer

    import vivace.cli_train as cli_train

    def started(*args, **kwargs):
        raise typer.Exit(STARTED)

    monkeypatch.setattr(cli_train, "_train_locked", started)


def _train(tmp_path: Path, sections: dict, *args: str) -> tuple[int, str]:
    """`vivace train --preset smoke` with `sections` merged over it; (exit code, output on one line)."""
    sections = {**sections, "train": {**sections.get("train", {}), "runs_dir": str(tmp_path / "runs")}}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(sections))
    result = CliRunner().invoke(app, ["train", "--preset", "smoke", "--config", str(config), "--name", "r", *args])
    return result.exit_code, " ".join(result.output.split())


def _refused(tmp_path: Path, sections: dict, *args: str) -> str:
    code, said = _train(tmp_path, sections, *args)
    assert code == 2, said  # not STARTED
    assert not (tmp_path / "runs").exists(), "refused after the run directory was made"
    return said


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_validate_and_pass_the_checks(name):
    from vivace.cli_train import check_train_config
    from vivace.rl.controller import training_tasks

    cfg = load_preset(name)
    assert check_train_config(cfg, training_tasks(cfg)) == []  # no refusal, no warning for a shipped preset


def test_steps_0_on_the_command_line_is_one_line(tmp_path):
    said = _refused(tmp_path, {}, "--steps", "0")
    assert "--steps 0: a run needs at least 1 step" in said
    assert "validation error" not in said and "pydantic" not in said


def test_a_model_directory_without_weights_is_refused_up_front(tmp_path):
    from vivace.model.checkpoint import TINY_DIR

    model = tmp_path / "model"
    model.mkdir()
    for f in TINY_DIR.iterdir():  # config and tokenizer, no weights
        if not f.name.endswith((".safetensors", ".bin")):
            (model / f.name).write_bytes(f.read_bytes())
    said = _refused(tmp_path, {"train": {"model": str(model)}})
    assert f"train.model: {model} has a config but no weights" in said


def test_an_unknown_model_names_the_setting(tmp_path):
    said = _refused(tmp_path, {"train": {"model": "gpt-4"}})
    assert "train.model: 'gpt-4' is not `tiny`, `tiny-init` or a checkpoint directory" in said


@pytest.mark.parametrize("model", ["path/to/hf-checkpoint", "./ckpt", "~/no-such-vivace-ckpt"])
def test_a_model_path_that_does_not_exist_is_said_to_be_missing(tmp_path, monkeypatch, model):
    """It was reported as a tokenizer problem: "'path/to/hf-checkpoint' has no tokenizer"."""
    monkeypatch.chdir(tmp_path)
    said = _refused(tmp_path, {"train": {"model": model}})
    assert f"train.model: {model}: no such checkpoint directory" in said and "tokenizer" not in said


def test_all_zero_score_weights_are_refused(tmp_path):
    zero = {k: 0 for k in ("correctness", "adherence", "efficiency", "claims", "format")}
    said = _refused(tmp_path, {"score": zero})
    assert "score: every weight is 0" in said and "score.correctness" in said


def test_zero_score_weights_with_a_milestone_still_train():
    from vivace.cli_train import check_train_config
    from vivace.rl.controller import training_tasks

    cfg = load_preset("smoke", score={k: 0 for k in ("correctness", "adherence", "efficiency", "claims", "format")},
                      train={"milestone_edit": 0.5})  # fmt: skip
    check_train_config(cfg, training_tasks(cfg))  # the milestone still makes rewards differ


def test_an_unknown_eval_baseline_is_refused_before_training(tmp_path):
    said = _refused(tmp_path, {"train": {"eval_tasks": 1, "eval_baselines": ["scripted:oracle", "nosuch:policy"]}})
    assert "train.eval_baselines: unknown policy spec 'nosuch:policy'" in said


def test_a_missing_replay_baseline_is_refused(tmp_path):
    said = _refused(tmp_path, {"train": {"eval_tasks": 1, "eval_baselines": [f"scripted:replay:{tmp_path}/no.json"]}})
    assert "train.eval_baselines:" in said


def _warnings(**sections) -> list[str]:
    from vivace.cli_train import check_train_config
    from vivace.rl.controller import training_tasks

    cfg = load_preset("smoke", **sections)
    return check_train_config(cfg, training_tasks(cfg))


@pytest.mark.parametrize("engine", [{"temperature": 0}, {"temperature": 1e-39}, {"top_k": 1}])
def test_greedy_rollouts_warn(engine):
    (said,) = _warnings(engine=engine)
    assert "rollouts are greedy" in said and "train nothing" in said


@pytest.mark.parametrize("engine", [{"top_p": 0.9}, {"top_k": 50}])
def test_cut_sampling_warns_that_importance_weights_are_off(engine):
    """The sampler reports (and the trainer computes) logprobs of the whole distribution, while top-p and
    top-k rollouts are drawn from the cut one: every importance weight was off by the kept mass, silently."""
    (said,) = _warnings(engine=engine)
    assert "importance weight is off" in said and "engine.top_p 1 and engine.top_k 0" in said


def test_bf16_training_on_a_cpu_warns(monkeypatch):
    import torch

    import vivace.cli_train as cli_train

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cli_train, "cpu_has_bf16", lambda: True)
    (said,) = _warnings(train={"param_dtype": "bfloat16"})
    assert said.startswith("train.param_dtype bfloat16 with no GPU here") and "use float32 on CPUs" in said
    assert "no bf16 instructions" not in said
    monkeypatch.setattr(cli_train, "cpu_has_bf16", lambda: False)  # an AVX2 CPU: 10x slower besides
    (said,) = _warnings(train={"param_dtype": "bfloat16"})
    assert "this CPU has no bf16 instructions (avx512_bf16, amx_bf16)" in said and "use float32 on CPUs" in said
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _warnings(train={"param_dtype": "bfloat16"}) == []


def test_bf16_instructions_are_read_from_the_cpu_flags():
    from vivace.cli_train import cpu_has_bf16

    zen4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 fma\n"
    sapphire_rapids = "flags\t\t: avx2 avx512f amx_bf16 amx_tile\n"
    epyc_avx2 = "model name\t: AMD EPYC\nflags\t\t: fpu avx avx2 fma\n"
    assert cpu_has_bf16(zen4) and cpu_has_bf16(sapphire_rapids) and cpu_has_bf16(epyc_avx2) is False
    assert cpu_has_bf16("model name\t: something\n") is None  # no flags line: not known


def test_max_tokens_below_the_system_turn_warns():
    (said,) = _warnings(agent={"max_tokens": 1024})
    assert said.startswith("agent.max_tokens 1024 is not above the") and "first turn" in said


def test_max_turn_tokens_beyond_the_context_warns():
    (said,) = _warnings(agent={"max_turn_tokens": 100_000})
    assert said.startswith("agent.max_turn_tokens 100000 is not below the model's context (8192 tokens)")


def test_async_without_staleness_warns():
    (said,) = _warnings(train={"pipeline": "async", "max_staleness": 0})
    assert "runs as sync" in said
    assert _warnings(train={"pipeline": "async", "max_staleness": 1}) == []


def test_more_tasks_per_step_than_tasks_warns():
    (said,) = _warnings(train={"tasks_per_step": 3, "task_ids": ["inventory-feature-1"]})
    assert said == "train.tasks_per_step 3 is more than the 1 training task: a step rolls out some tasks more than once"


def test_warnings_are_printed_once_before_the_run(tmp_path):
    """The CLI prints them (yellow `warning:` lines) after the checks, before the run starts."""
    code, said = _train(tmp_path, {"engine": {"temperature": 0}})
    assert code == STARTED and said.count("warning: engine.temperature is 0: rollouts are greedy") == 1


def test_a_run_that_trained_nothing_says_why(tmp_path):
    from vivace.cli_train import _nothing_trained

    rows = [{"step": s, "groups": 2, "groups_zero_variance": 2, "samples": 0} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    said = _nothing_trained(tmp_path, 2)
    assert said.startswith("no step trained anything (4 groups over 2 steps: groups_zero_variance 4)")


def test_config_file_errors_keep_their_style(tmp_path):
    """Field constraints already refuse these, naming the file and the setting (unchanged)."""
    for sections, where in [({"train": {"group_size": 1}}, "train.group_size"), ({"train": {"lr": 0}}, "train.lr"),
                            ({"agent": {"max_turns": 0}}, "agent.max_turns")]:  # fmt: skip
        f = tmp_path / "c.json"
        f.write_text(json.dumps(sections))
        with pytest.raises(ValueError, match=rf"^{f}: {where}: .*`vivace config show` lists every setting"):
            load_config("smoke", f)


def test_a_config_file_saved_with_a_byte_order_mark_loads(tmp_path):
    """Notepad and PowerShell start a UTF-8 file with U+FEFF: both formats refused it as bad syntax."""
    for name, text in [("c.json", '{"train": {"steps": 7}}'), ("c.toml", "[train]\nsteps = 7\n")]:
        f = tmp_path / name
        f.write_text("\ufeff" + text, encoding="utf-8")
        assert load_config("smoke", f).train.steps == 7


def _tiny_copy(tmp_path: Path) -> Path:
    import shutil

    from vivace.model.checkpoint import TINY_DIR

    return Path(shutil.copytree(TINY_DIR, tmp_path / "model"))


def _edit_config(model: Path, **changes) -> None:
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **changes}))


def test_weights_that_config_json_does_not_describe_are_refused_up_front(tmp_path):
    """An edited dimension: the tensor, both shapes and what to do, at most 3 of the 96 mismatches."""
    model = _tiny_copy(tmp_path)
    _edit_config(model, moe_intermediate_size=128)
    said = _refused(tmp_path, {"train": {"model": str(model)}})
    assert f"train.model: {model / 'model.safetensors'} does not hold the model its config.json describes" in said
    assert "model.layers.0.mlp.experts.0.down_proj.weight: the weights have shape (256, 256), config.json makes " \
           "(256, 128)" in said  # fmt: skip
    assert "; and 93 more. Fix config.json to match the weights, or save the checkpoint again" in said


@pytest.mark.parametrize(
    ("damage", "words"),
    [(lambda b: b[: len(b) - 1000], "cut short: {short:,} bytes where its header describes {size:,}"),
     (lambda b: b[:5000], "cut short: 5,000 bytes, inside its header of"),
     (lambda b: bytes(range(256)) * 40, "not a safetensors file"),
     (lambda b: b"", "not a safetensors file; copy it again"),
     (lambda b: b"version https://git-lfs.github.com/spec/v1\nsize 1\n", "a Git LFS pointer, not the weights")],
    ids=["truncated-data", "truncated-header", "garbage", "empty", "lfs-pointer"],
)  # fmt: skip
def test_a_damaged_weight_file_is_refused_up_front(tmp_path, damage, words):
    model = _tiny_copy(tmp_path)
    weights = model / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(damage(weights.read_bytes()))
    said = _refused(tmp_path, {"train": {"model": str(model)}})
    assert f"train.model: {weights}: {words.format(short=weights.stat().st_size, size=size)}" in said


def test_saved_checkpoints_pass_and_a_missing_shard_is_refused(tmp_path):
    """As save_checkpoint writes it, and in shards (an index and the shards' headers, read together);
    a shard the index lists must be there."""
    from vivace.model.checkpoint import load_model, require_weights, save_checkpoint

    tiny = load_model("tiny")
    require_weights(str(save_checkpoint(tiny.model, tiny.tokenizer, tmp_path / "single")))
    tiny.model.save_pretrained(tmp_path / "model", max_shard_size="4MB")
    tiny.tokenizer.save_pretrained(tmp_path / "model")
    shards = sorted((tmp_path / "model").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "model" / "model.safetensors.index.json").is_file()
    require_weights(str(tmp_path / "model"))
    shards[-1].unlink()
    said = _refused(tmp_path, {"train": {"model": str(tmp_path / "model")}})
    assert f"model.safetensors.index.json lists the shard {shards[-1].name}, which is not in" in said


def test_clip_low_of_1_or_more_is_refused(tmp_path):
    """Its lower bound 1 - clip_low would be 0 or below: no bound on a ratio of probabilities."""
    said = _refused(tmp_path, {"train": {"clip_low": 1.0}})
    assert "train.clip_low: Input should be less than 1" in said
    assert _train(tmp_path, {"train": {"clip_low": 0.99}})[0] == STARTED


async def test_a_model_that_stops_loading_after_the_checks_ends_the_run_in_one_line(tmp_path):
    """The weights changed between the check and the trainer's load: the trainer's ValueError, which
    names the file (unwrapped from Ray's remote traceback by RayWorkers), ends the run as StartFailed."""
    from vivace.rl.controller import StartFailed, train

    class Workers:
        closed = False

        async def start(self, version, checkpoint):
            raise ValueError("/m: cannot load the checkpoint's weights (truncated)")

        async def close(self):
            self.closed = True

    workers = Workers()
    with pytest.raises(StartFailed, match=r"^the run could not start: /m: cannot load the checkpoint's weights"):
        await train(load_preset("smoke"), tmp_path, workers=workers)
    assert workers.closed


def test_run_directory_refusals_come_before_the_training_stack_loads(tmp_path):
    """A name already taken, a --resume (or a report) of something that is no run, and a run already
    complete are said in about a second: before torch, the engine and Ray are imported (13 s on 2 cores)."""
    cfg = load_preset("smoke")
    cfg.train.runs_dir = tmp_path / "runs"
    taken = tmp_path / "runs" / "taken"
    (taken / "checkpoints" / f"step_{cfg.train.steps}").mkdir(parents=True)
    (taken / "config.json").write_text(cfg.model_dump_json())
    (taken / "metrics.jsonl").write_text("")
    (taken / "checkpoints" / f"step_{cfg.train.steps}" / "state.json").write_text("{}")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"train": {"runs_dir": str(cfg.train.runs_dir)}}))
    cases = [
        (["--preset", "smoke", "--config", str(config), "--name", "taken"], 2, "already holds a run"),
        (["--resume", str(tmp_path)], 2, "is not a run directory"),
        (["--resume", str(taken)], 0, "run already complete"),
        (["report", str(tmp_path)], 2, "is not a run directory"),
    ]
    for args, expected, words in cases:
        code, torch_imported, stderr = vivace_refusal("train", *args)
        assert (code, torch_imported) == (expected, False), stderr[-2000:]
        assert words in " ".join(stderr.split()), stderr[-2000:]


def test_a_run_directory_in_use_is_refused_before_its_files_are_touched(tmp_path):
    """A second `vivace train --name R` while R ran wrote its own config.json over R's, then was refused:
    R's `--resume` then went on with the other command's settings. The lock now comes first."""
    from vivace.locks import lock_exclusively

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.json").write_text("the live run's")
    with lock_exclusively(run / ".lock"):  # a live run (flock: this process's own second open conflicts too)
        code, said = _train(tmp_path, {})
    assert code == 2 and "is in use by another `vivace train`" in said, said
    assert (run / "config.json").read_text() == "the live run's"


def test_unnamed_runs_started_in_one_second_get_directories_of_their_own(tmp_path):
    """Two unnamed runs started in one second both took train-DATE-TIME: one was refused about a directory
    it never named, and the other ran with the first one's config.json."""
    from vivace.rl.runs import RunInUse, claim_run_dir, run_path

    cfg = load_preset("smoke")
    cfg.train.runs_dir = tmp_path
    first = run_path(cfg, None)
    a, lock_a = claim_run_dir(first, cfg, unnamed=True)
    cfg.train.seed = 7
    b, lock_b = claim_run_dir(first, cfg, unnamed=True)
    assert (a, b) == (first, first.with_name(first.name + "-2"))
    assert (
        json.loads((b / "config.json").read_text())["train"]["seed"]
        == 7
        != json.loads((a / "config.json").read_text())["train"]["seed"]
    )
    with pytest.raises(RunInUse, match="in use by another"):
        claim_run_dir(first, cfg, unnamed=False)  # a name given: refused, never renamed
    lock_a.close()
    lock_b.close()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(OSError, match="cannot make the run directory .* set train.runs_dir"):
        claim_run_dir(blocker / "runs" / "x", cfg, unnamed=False)


def test_stop_messages_carry_no_markup(tmp_path):
    """They are printed with markup off: a literal "[/]" showed in every stop message."""
    from vivace.cli_train import _stopped_at

    assert _stopped_at(tmp_path, load_preset("smoke")) == "at step 0/2: the last checkpoint is None"


def test_a_run_keeps_the_files_it_names_as_absolute_paths(tmp_path, monkeypatch):
    """config.json kept `train.suite` as given (`tasks.jsonl`), so `--resume` from another directory said
    "tasks.jsonl: no such task file or directory": a tasks file, a model directory and sft_data named
    relative to the working directory are kept absolute; named suites and models stay names."""
    from vivace.tasks.suites import load_suite

    work = tmp_path / "work"
    work.mkdir()
    tasks = load_suite("families", split="train")[:4]
    (work / "tasks.jsonl").write_text("".join(t.model_dump_json(exclude={"base_dir"}) + "\n" for t in tasks))
    monkeypatch.chdir(work)
    code, said = _train(tmp_path, {"train": {"suite": "tasks.jsonl", "families": None, "eval_suite": "families"}})
    assert code == STARTED, said
    saved = json.loads((tmp_path / "runs" / "r" / "config.json").read_text())["train"]
    assert saved["suite"] == str(work / "tasks.jsonl") and saved["eval_suite"] == "families"
    assert saved["model"] == "tiny"


def test_config_show_checks_a_file_merged_over_a_preset(tmp_path):
    """A config file could be checked only by starting a run: `vivace config show --config FILE` prints the
    merged configuration, or says what is wrong in one line (exit 2)."""
    good = tmp_path / "good.toml"
    good.write_text("[train]\nsteps = 3\nlr = 1e-5\n")
    result = CliRunner().invoke(app, ["config", "show", "--preset", "tiny", "--config", str(good)])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["train"]["steps"] == 3 and shown["train"]["lr"] == 1e-5 and shown["train"]["suite"] == "families"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train": {"stpes": 3}}))
    result = CliRunner().invoke(app, ["config", "show", "--config", str(bad)])
    assert result.exit_code == 2 and "stpes" in result.output and "Traceback" not in result.output


def test_without_ray_train_says_to_install_it_or_pass_local_before_making_the_run(tmp_path, monkeypatch):
    """Ray is optional (`vivace[ray]`); a plain install found out only when the workers started, after the
    run directory was made, in two tracebacks."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    said = _refused(tmp_path, {})
    assert "Ray is not installed" in said and "pip install 'vivace[ray]'" in said and "--local" in said
    code, said = _train(tmp_path, {}, "--local")  # needs no Ray
    assert code == STARTED, said
    result = CliRunner().invoke(app, ["train", "bench-pipeline", "--work-dir", str(tmp_path / "bench")])
    assert result.exit_code == 2 and "Ray is not installed" in result.output


def _small_checkpoint(path: Path, config) -> Path:
    from transformers import AutoModelForCausalLM

    from vivace.model.tokenizer import reference_tokenizer

    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    reference_tokenizer().save_pretrained(path)
    return path


SMALL_DIMS = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=4096)  # fmt: skip


@pytest.mark.parametrize("kind", ["gpt2", "sliding window", "vocab smaller than the tokenizer"])
def test_a_model_the_engine_cannot_run_is_refused_before_the_run(tmp_path, kind):
    """Each trained on until the actors started (~50 s), then failed in a Ray traceback (an architecture or
    window the engine refuses) or ran every episode into an engine error that read as the policy failing."""
    from transformers import GPT2Config, MistralConfig, Qwen3Config

    from vivace.model.tokenizer import reference_tokenizer

    vocab = len(reference_tokenizer())
    config = {
        "gpt2": lambda: GPT2Config(vocab_size=vocab, n_embd=32, n_layer=1, n_head=2, n_positions=4096),
        "sliding window": lambda: MistralConfig(vocab_size=vocab, sliding_window=512, **SMALL_DIMS),
        "vocab smaller than the tokenizer": lambda: Qwen3Config(vocab_size=vocab - 96, head_dim=8, **SMALL_DIMS),
    }[kind]()
    model = _small_checkpoint(tmp_path / "model", config)
    said = _refused(tmp_path, {"train": {"model": str(model)}})
    expected = {
        "gpt2": "train.model: the engine runs Qwen3MoeForCausalLM, Qwen3ForCausalLM, Qwen2ForCausalLM, "
        "Qwen2MoeForCausalLM, LlamaForCausalLM, MistralForCausalLM; GPT2LMHeadModel is not supported",
        "sliding window": "train.model: MistralForCausalLM with sliding-window attention (a window of 512 positions",
        "vocab smaller than the tokenizer": f"train.model: its tokenizer makes ids up to {vocab - 1} but the model's "
        f"vocab_size (config.json) is {vocab - 96}",
    }[kind]
    assert expected in said, said


def test_bench_and_serve_refuse_a_model_whose_vocab_is_smaller_than_its_tokenizer(tmp_path):
    from transformers import Qwen3Config

    from vivace.model.checkpoint import load_model
    from vivace.model.tokenizer import reference_tokenizer

    vocab = len(reference_tokenizer())
    model = _small_checkpoint(tmp_path / "model", Qwen3Config(vocab_size=vocab - 1, head_dim=8, **SMALL_DIMS))
    with pytest.raises(ValueError, match=f"its tokenizer makes ids up to {vocab - 1} but the model's vocab_size"):
        load_model(str(model))  # what bench, serve, the agent and sft train load with
    padded = _small_checkpoint(tmp_path / "padded", Qwen3Config(vocab_size=vocab + 64, head_dim=8, **SMALL_DIMS))
    assert load_model(str(padded)).model.config.vocab_size == vocab + 64  # more rows than ids: fine


def test_config_files_no_parser_reads_are_refused_naming_the_file(tmp_path):
    """Arrays nested 3,000 deep gave a RecursionError traceback; a 5,000-digit integer an error naming no file;
    a NUL in a path passed, to fail later as "embedded null byte"."""
    cases = [("deep.json", "[" * 3000 + "]" * 3000, "nested too deeply"),
             ("big.json", '{"train": {"steps": ' + "9" * 5000 + "}}", "cannot read it"),
             ("nul.json", json.dumps({"sandbox": {"state_dir": "/tmp/a\u0000b"}}), "sandbox.state_dir: .*NUL")]  # fmt: skip
    for name, text, said in cases:
        f = tmp_path / name
        f.write_text(text)
        with pytest.raises(ValueError, match=rf"^{f}: .*{said}"):
            load_config("smoke", f)
