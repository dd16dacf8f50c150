"""How far training moved the policy (rl.shift): the paired episodes' divergence point, and the KL of
the trained checkpoint from the starting one on the starting policy's sampled tokens."""

from __future__ import annotations

import random

import pytest
import torch

from vivace.config import EngineConfig
from vivace.harness.trajectory import Tokens, Trajectory
from vivace.model.checkpoint import load_model, save_checkpoint
from vivace.rl.evaluate import change_lines
from vivace.rl.shift import divergence, policy_shift


def _episode(ids: list[int], mask: list[int] | None = None) -> Trajectory:
    mask = mask if mask is not None else [0] * 3 + [1] * (len(ids) - 3)  # a 3-token prompt, then sampled
    tokens = Tokens(ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids), versions=[0] * len(ids))
    return Trajectory(request="r", policy="p", system_prompt="s", system_prompt_version="1", stop_reason="done",
                      tokens=tokens)  # fmt: skip


def test_divergence_counts_identical_pairs_and_where_the_others_part():
    same = _episode([5, 6, 7, 8, 9, 10])
    # the first three tokens are the prompt; after them, how many sampled tokens agree
    parts_after_two = (_episode([5, 6, 7, 8, 9, 10]), _episode([5, 6, 7, 8, 9, 12]))  # 8, 9 alike
    parts_at_once = (_episode([5, 6, 7, 8]), _episode([5, 6, 7, 9]))  # none alike
    longer = (_episode([5, 6, 7, 8]), _episode([5, 6, 7, 8, 9]))  # 8 alike; a prefix is not the same episode
    d = divergence([(same, same), parts_after_two, parts_at_once, longer])
    assert d == {"episodes": 4, "identical": 1, "sampled_before_divergence": 1}  # the median of 2, 0, 1
    assert divergence([parts_after_two])["sampled_before_divergence"] == 2


def test_divergence_needs_tokens():
    no_tokens = _episode([1, 2, 3, 4]).model_copy(update={"tokens": None})
    assert divergence([(no_tokens, no_tokens)]) is None
    assert divergence([]) is None


@pytest.fixture(scope="module")
def episodes():
    rng = random.Random(0)
    vocab = load_model("tiny").model.config.vocab_size
    return [_episode([rng.randrange(vocab) for _ in range(40)]) for _ in range(3)]


def test_a_policy_against_itself_has_not_moved(episodes):
    s = policy_shift("tiny", "tiny", episodes, EngineConfig(temperature=0.7))
    assert s["episodes"] == 3 and s["tokens"] == 3 * 37  # every sampled token (the prompt before it predicts it)
    assert s["kl_mean"] == pytest.approx(0.0, abs=1e-6) and s["top_changed"] == 0.0
    assert s["logprob_change"] == pytest.approx(0.0, abs=1e-6)


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    loaded = load_model("tiny")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return str(save_checkpoint(loaded.model, loaded.tokenizer, tmp_path_factory.mktemp("moved") / "moved"))


def _plain_kl(before: str, after: str, episodes, t: float) -> float:
    """The KL without the shared-prefix cache: each episode run whole through each model."""
    models = [load_model(before).model, load_model(after).model]
    total, n = 0.0, 0
    with torch.no_grad():
        for e in episodes:
            ids, at = torch.tensor(e.tokens.ids), torch.tensor(e.tokens.loss_mask[1:]).bool()
            lp = [torch.log_softmax(m(input_ids=ids[None, :-1]).logits[0][at] / t, -1) for m in models]
            total += float((lp[0].exp() * (lp[0] - lp[1])).sum())
            n += int(at.sum())
    return total / n


def test_a_changed_checkpoint_has_moved(episodes, moved):
    s = policy_shift("tiny", moved, episodes, EngineConfig(temperature=1.0))
    assert s["kl_mean"] > 0.01 and 0 < s["top_changed"] <= 1 and s["kl_max"] >= s["kl_mean"]
    # the starting policy's own tokens were chosen by nothing here, so only the KL's sign is certain;
    # a scripted or remote policy, or episodes without tokens, cannot be measured
    assert policy_shift("tiny", "scripted:oracle", episodes) is None
    assert policy_shift("tiny", "tiny", [episodes[0].model_copy(update={"tokens": None})]) is None


def test_the_shared_prompt_is_run_once_without_changing_the_numbers(moved):
    rng = random.Random(1)
    prompt = [rng.randrange(2000) for _ in range(30)]  # the same opening, then each episode its own tokens
    eps = [_episode(prompt + [rng.randrange(2000) for _ in range(20)], [0] * 35 + [1] * 15) for _ in range(3)]
    s = policy_shift("tiny", moved, eps, EngineConfig(temperature=0.7))
    assert s["tokens"] == 3 * 15
    assert s["kl_mean"] == pytest.approx(_plain_kl("tiny", moved, eps, 0.7), rel=1e-4)


def _before_after() -> dict:
    from vivace.rl.evaluate import METRICS

    return {key: {"before": 0.1, "after": 0.2, "delta": 0.1} for key, _, _ in METRICS}


def test_the_report_shows_the_shift_and_old_reports_still_render():
    report = {"before_after": _before_after()}
    old = change_lines(report)
    report["shift"] = {
        "divergence": {"episodes": 112, "identical": 7, "sampled_before_divergence": 93},
        "kl": {"episodes": 56, "tokens": 19000, "temperature": 0.7, "kl_mean": 0.0047, "kl_max": 13.4,
               "top_changed": 0.0098, "logprob_change": -0.0042},
    }  # fmt: skip
    new = change_lines(report)
    assert new[: len(old)] == old
    assert "7 of 112" in new[-2] and "median of 93 sampled tokens" in new[-2]
    assert "KL(before ‖ after) 0.0047 nats/token" in new[-1] and "0.98%" in new[-1] and "-0.004" in new[-1]


async def test_the_run_report_measures_the_shift_of_a_real_checkpoint(moved, tmp_path, state_dir):
    """The whole path: the tiny policy and a changed copy play the same held-out episodes through the
    benchmark, and the report carries their divergence and KL."""
    from vivace.config import load_preset
    from vivace.rl.evaluate import evaluate_run
    from vivace.tasks.families import generate_families

    tasks = generate_families({"test": 2}, seed=0, families=("misspelled_name",))
    cfg = load_preset("tiny", sandbox={"backend": "plain", "state_dir": str(state_dir)},
                      agent={"max_turns": 2, "max_turn_tokens": 24}, train={"eval_samples": 1})  # fmt: skip
    (tmp_path / "run").mkdir()
    report = await evaluate_run(cfg, tmp_path / "run", "tiny", moved, tasks, baselines=(), concurrency=2)
    d, k = report["shift"]["divergence"], report["shift"]["kl"]
    assert d["episodes"] == 2 and d["identical"] < 2  # a 0.05 perturbation changes what it writes
    assert k["episodes"] == 2 and k["tokens"] > 0 and k["kl_mean"] > 0 and k["temperature"] == cfg.engine.temperature
    assert "KL(before ‖ after)" in (tmp_path / "run" / "report.md").read_text()


def test_a_shift_that_cannot_be_measured_does_not_lose_the_report(tmp_path, monkeypatch):
    import vivace.rl.evaluate as evaluate
    from vivace.config import load_preset

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(evaluate, "policy_shift", out_of_memory)
    shift = evaluate.measure_shift([], "tiny", "tiny", tmp_path, load_preset("tiny"))
    assert shift["kl"]["error"].startswith("RuntimeError: CUDA out of memory") and shift["divergence"] is None
    lines = change_lines({"before_after": _before_after(), "shift": shift})
    assert lines[-1] == "policy shift: not measured (RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB)"
