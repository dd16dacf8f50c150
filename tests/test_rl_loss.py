"""Group advantages and the policy-gradient loss against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from vivace.rl.advantages import group_advantages
from vivace.rl.loss import LossConfig, policy_loss


def test_group_advantages_by_hand():
    r = [1.0, 0.0, 0.0, 1.0]  # mean 0.5, sample std sqrt(1/3)
    assert group_advantages(r, "mean") == [0.5, -0.5, -0.5, 0.5]
    std = math.sqrt(1 / 3)
    assert group_advantages(r, "std") == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std], rel=1e-5)
    # leave-one-out: 1 - mean(0, 0, 1) = 2/3; 0 - mean(1, 0, 1) = -2/3
    assert group_advantages(r, "loo") == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert group_advantages([0.3, 0.3, 0.3], "std") is None  # no signal: dropped by the caller
    masked = group_advantages([1.0, 0.0, 0.5], "mean", truncated=[False, True, False], mask_truncated=True)
    assert masked[1] is None and masked[0] == pytest.approx(0.5) and masked[2] == pytest.approx(0.0)
    assert group_advantages([1.0, 0.0], "mean", truncated=[False, True]) == [0.5, -0.5]  # masking is opt-in
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages([1.0], "mean")
    with pytest.raises(ValueError, match="unknown"):
        group_advantages([1.0, 0.0], "median")  # type: ignore[arg-type]


def lp(*probs):
    return torch.tensor([math.log(p) for p in probs])


def test_on_policy_gradient_is_advantage_times_score():
    # logp = logp_old = logp_behav: ratio 1, weight 1, loss = -mean(A * logp) in value and gradient.
    logp = lp(0.5, 0.25, 0.8).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -2.0])
    loss, stats = policy_loss(logp, logp.detach(), logp.detach(), adv, torch.ones(3), LossConfig())
    loss.backward()
    assert loss.item() == pytest.approx(-(1.0 + 1.0 - 2.0) / 3)  # -sum(w * r * A) / 3 with r = w = 1
    assert logp.grad.tolist() == pytest.approx([-1 / 3, -1 / 3, 2 / 3])
    assert stats["clip_fraction"] == 0 and stats["is_weight_mean"] == pytest.approx(1.0)
    assert stats["kl_sampler_trainer_k1"] == pytest.approx(0.0) and stats["kl_sampler_trainer_k3"] == pytest.approx(0.0)


def test_clipping_uses_separate_low_and_high_ranges():
    cfg = LossConfig(clip_low=0.2, clip_high=0.28)
    old = lp(0.5, 0.5, 0.5, 0.5)
    new = torch.log(torch.tensor([0.5 * 1.5, 0.5 * 1.5, 0.5 * 0.5, 0.5 * 0.5])).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, stats = policy_loss(new, old, old, adv, torch.ones(4), cfg)
    loss.backward()
    # token 0: r=1.5, A>0 -> min(1.5, 1.28) = 1.28 (clipped, no gradient)
    # token 1: r=1.5, A<0 -> min(-1.5, -1.28) = -1.5 (unclipped: pessimistic bound keeps the gradient)
    # token 2: r=0.5, A>0 -> min(0.5, 0.8) = 0.5 (unclipped)
    # token 3: r=0.5, A<0 -> min(-0.5, -0.8) = -0.8 (clipped, no gradient)
    assert loss.item() == pytest.approx(-(1.28 - 1.5 + 0.5 - 0.8) / 4)
    assert new.grad.tolist() == pytest.approx([0.0, 1.5 / 4, -0.5 / 4, 0.0])  # d(-r*A)/dlogp = -r*A
    assert stats["clip_fraction"] == 1.0  # every ratio lies outside its range (the min decides the gradient)


def test_truncated_importance_weight_and_mask_and_denominator():
    cfg = LossConfig(is_cap=2.0)
    old = lp(0.6, 0.6, 0.6)
    behav = lp(0.2, 0.5, 0.6)  # trainer/sampler ratios 3.0 (capped to 2.0), 1.2, 1.0
    logp = old.clone().requires_grad_()
    adv = torch.tensor([1.0, 1.0, 1.0])
    mask = torch.tensor([1.0, 1.0, 0.0])  # the last token is a tool result
    loss, stats = policy_loss(logp, old, behav, adv, mask, cfg, n_tokens=4)
    loss.backward()
    assert loss.item() == pytest.approx(-(2.0 + 1.2) / 4)  # the batch has 4 generated tokens in all
    assert logp.grad.tolist() == pytest.approx([-2.0 / 4, -1.2 / 4, 0.0])
    assert stats["tokens"] == 2 and stats["is_truncated_fraction"] == 0.5
    assert stats["is_weight_mean"] == pytest.approx(1.6)
    # KL(sampler || trainer), k1 over the two masked tokens: mean(log .2 - log .6, log .5 - log .6)
    assert stats["kl_sampler_trainer_k1"] == pytest.approx((math.log(0.2 / 0.6) + math.log(0.5 / 0.6)) / 2)


def test_kl_to_reference_is_k3_and_off_by_default():
    logp = lp(0.5, 0.5).requires_grad_()
    ref = lp(0.25, 0.5)
    zero_adv = torch.zeros(2)
    off, _ = policy_loss(logp, logp.detach(), logp.detach(), zero_adv, torch.ones(2), LossConfig(), logp_ref=ref)
    assert off.item() == 0.0
    on, stats = policy_loss(
        logp, logp.detach(), logp.detach(), zero_adv, torch.ones(2), LossConfig(kl_coef=0.1), logp_ref=ref
    )
    d = math.log(0.25 / 0.5)  # k3 = e^d - d - 1 on token 0, 0 on token 1
    assert on.item() == pytest.approx(0.1 * (math.exp(d) - d - 1) / 2)
    assert stats["kl_reference_k3"] == pytest.approx((math.exp(d) - d - 1) / 2)  # reported, so a run shows its drift
    _, without = policy_loss(logp, logp.detach(), logp.detach(), zero_adv, torch.ones(2), LossConfig())
    assert "kl_reference_k3" not in without


def _rollout(reward: float, resolved: bool, generated: int = 2):
    from vivace.harness.trajectory import Tokens, Trajectory
    from vivace.rl.rollout import Rollout

    n = generated + 1
    tokens = Tokens(ids=list(range(1, n + 1)), loss_mask=[0] + [1] * generated, logprobs=[0.0] + [-0.5] * generated,
                    versions=[-1] + [0] * generated)  # fmt: skip
    traj = Trajectory(
        request="r", policy="p", system_prompt="s", system_prompt_version="v1", stop_reason="done", tokens=tokens
    )
    return Rollout("t", traj, reward, resolved=resolved)


def test_group_filter_keeps_split_groups_or_also_all_solved_ones():
    from vivace.config import load_preset
    from vivace.rl.rollout import to_samples

    cfg = load_preset("default")
    penalties = [_rollout(0.0, False), _rollout(-0.05, False)]  # both failed; one was penalised a little
    mixed = [_rollout(1.2, True), _rollout(-0.05, False)]
    samples, counts = to_samples([penalties, mixed], cfg, version=0)
    assert len(samples) == 4 and counts["groups_same_correctness"] == 0  # default: any reward difference trains
    cfg.train.group_filter = "correctness"
    samples, counts = to_samples([penalties, mixed], cfg, version=0)
    assert [round(s.advantage, 3) for s in samples] == [0.625, -0.625] and counts["groups_same_correctness"] == 1
    all_solved = [_rollout(1.2, True), _rollout(1.0, True)]
    assert to_samples([all_solved], cfg, version=0)[1]["groups_same_correctness"] == 1
    # solved: the split groups and the ones that all solved (how well), never the ones that all failed.
    cfg.train.group_filter = "solved"
    solved_alike = [_rollout(1.2, True), _rollout(1.2, True)]
    samples, counts = to_samples([penalties, mixed, all_solved, solved_alike], cfg, version=0)
    assert [round(s.advantage, 3) for s in samples] == [0.625, -0.625, 0.1, -0.1]
    assert counts["groups_same_correctness"] == 1 and counts["groups_zero_variance"] == 1
    # solved_mask_answer: an all-solved group's final turns leave the loss; a split group keeps them.
    cfg.train.solved_mask_answer = True
    two_turns = [0, 1, 1, 0, 0, 1, 1]
    for r in (*mixed, *all_solved):
        r.trajectory.tokens.ids, r.trajectory.tokens.loss_mask = list(range(1, 8)), list(two_turns)
        r.trajectory.tokens.logprobs, r.trajectory.tokens.versions = [0.0] * 7, [0] * 7
    samples, _ = to_samples([mixed, all_solved], cfg, version=0)
    assert [s.mask for s in samples] == [two_turns, two_turns, [0, 1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0, 0]]


def _calls_trajectory(*calls):
    from vivace.harness.trajectory import ToolRecord, Trajectory, Turn

    records = [ToolRecord(id=str(i), name=n, arguments=a, result="", is_error=e) for i, (n, a, e) in enumerate(calls)]
    return Trajectory(request="r", policy="p", system_prompt="s", system_prompt_version="v1", stop_reason="done",
                      turns=[Turn(content="", tool_calls=[r]) for r in records])  # fmt: skip


def test_milestones_count_only_successful_calls_on_code():
    from vivace.rl.metrics import milestones

    none = _calls_trajectory(
        ("read_file", {"path": "tests/test_core.py"}, False),  # a test file: the traceback already shows it
        ("read_file", {"path": "pkg/cor.py"}, True),  # a misspelled path: the tool said no such file
        ("edit_file", {"path": "pkg/core.py", "old_string": "x", "new_string": "y"}, True),  # not found
        ("edit_file", {"path": "tests/test_core.py", "old_string": "1", "new_string": "2"}, False),
        ("edit_file", '{"path": "pkg/core.py", "old_str', False),  # malformed arguments
        ("run_terminal_cmd", {"command": "cat pkg/core.py"}, False),
    )
    assert milestones(none) == {"read": False, "edit": False}
    both = _calls_trajectory(("read_file", {"path": "pkg/core.py"}, False),
                             ("edit_file", {"path": "pkg/core.py", "old_string": "x", "new_string": "y"}, False))  # fmt: skip
    assert milestones(both) == {"read": True, "edit": True}
    assert milestones(_calls_trajectory()) == {"read": False, "edit": False}


def test_milestones_reward_and_split_groups_only_when_configured():
    from vivace.config import load_preset
    from vivace.rl.rollout import to_samples

    cfg = load_preset("default")
    cfg.train.group_filter = "correctness"
    read, blind = _rollout(0.0, False), _rollout(0.0, False)  # both failed, same score
    read.milestones, blind.milestones = {"read": True, "edit": False}, {"read": False, "edit": False}
    assert to_samples([[read, blind]], cfg, version=0)[1]["groups_zero_variance"] == 1
    cfg.train.milestone_read = 0.1  # now the read is an outcome, and run_attempt adds its reward
    read.reward = 0.1
    samples, counts = to_samples([[read, blind]], cfg, version=0)
    assert [round(s.advantage, 3) for s in samples] == [0.05, -0.05] and counts["groups_same_correctness"] == 0
    penalised = _rollout(-0.05, False)  # same outcomes as `blind`, a little penalty: still filtered out
    penalised.milestones = dict(blind.milestones)
    assert to_samples([[blind, penalised]], cfg, version=0)[1]["groups_same_correctness"] == 1


async def test_run_attempt_adds_milestone_rewards_to_the_benchmark_score():
    from vivace.bench.score import Score
    from vivace.config import load_preset
    from vivace.rl.rollout import run_attempt

    traj = _calls_trajectory(("read_file", {"path": "pkg/core.py"}, False),
                             ("edit_file", {"path": "pkg/core.py", "old_string": "a", "new_string": "b"}, True))  # fmt: skip

    async def episode(policy, task, cfg, backend):
        return traj, Score(task_id="t", total=-0.05, correctness=0, adherence=0, efficiency=0, claims=1, format=0.5,
                           resolved=False)  # fmt: skip

    cfg = load_preset("default")
    cfg.train.milestone_read, cfg.train.milestone_edit = 0.1, 0.2
    task = type("T", (), {"id": "t"})()
    result = await run_attempt([object()], None, None, "p", task, cfg, None, episode=episode)
    assert result.rollout.reward == pytest.approx(0.05)  # the read earns 0.1; the edit did not apply
    assert result.rollout.milestones == {"read": True, "edit": False}
    assert result.rollout.components["format"] == 0.5  # the benchmark's own components are untouched

    # An episode cut short by the sampler's server failing (PolicyUnavailable) is re-queued, not trained as a failure.
    traj = traj.model_copy(update={"stop_reason": "error", "unavailable": True, "error": "sampler unreachable"})
    result = await run_attempt([object()], None, None, "p", task, cfg, None, episode=episode)
    assert (result.status, result.rollout, result.error) == ("env_failed", None, "sampler unreachable")

    # One whose workspace could not be diffed was not scored: nothing to train on either.
    traj = traj.model_copy(update={"unavailable": False, "diff_failed": True, "error": "could not compute the diff"})
    result = await run_attempt([object()], None, None, "p", task, cfg, None, episode=episode)
    assert (result.status, result.rollout, result.error) == ("env_failed", None, "could not compute the diff")


def test_negative_scale_shrinks_only_negative_advantages():
    from vivace.config import load_preset
    from vivace.rl.rollout import to_samples

    cfg = load_preset("default")
    group = [_rollout(1.0, True), _rollout(0.0, False), _rollout(0.0, False), _rollout(0.0, False)]
    plain = [s.advantage for s in to_samples([group], cfg, version=0)[0]]
    assert plain == [0.75, -0.25, -0.25, -0.25]
    cfg.train.negative_scale = 0.2
    assert [round(s.advantage, 3) for s in to_samples([group], cfg, version=0)[0]] == [0.75, -0.05, -0.05, -0.05]
    cfg.train.negative_scale = 0.0  # positive-only: the failures stay in the batch with no weight
    samples, counts = to_samples([group], cfg, version=0)
    assert [s.advantage for s in samples] == [0.75, 0.0, 0.0, 0.0] and counts["adv_min"] == 0.0


def _three_turn_rollout(reward: float, resolved: bool):
    """Turn 1 a good read, turn 2 a malformed call, turn 3 cut off at the turn's token limit."""
    from vivace.harness.trajectory import Tokens, ToolRecord, Trajectory, Turn
    from vivace.rl.rollout import Rollout

    mask = [0, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1]
    tokens = Tokens(ids=list(range(len(mask))), loss_mask=mask, logprobs=[-0.5 * m for m in mask],
                    versions=[0 if m else -1 for m in mask])  # fmt: skip
    read = ToolRecord(id="1", name="read_file", arguments={"path": "a.py"}, result="ok")
    bad = ToolRecord(
        id="2", name="edit_file", arguments="{bad", result="Error: bad JSON", is_error=True, format_error=True
    )
    cut = '<tool_call>{"name": "edit_file", "arguments": {"old_str'
    turns = [
        Turn(content="", tool_calls=[read]),
        Turn(content="", tool_calls=[bad]),
        Turn(content=cut, finish_reason="length"),
    ]
    traj = Trajectory(request="r", policy="p", system_prompt="s", system_prompt_version="v1", stop_reason="max_tokens",
                      tokens=tokens, turns=turns)  # fmt: skip
    return Rollout("t", traj, reward, resolved=resolved)


def test_mask_truncated_solved_spares_the_failures():
    from vivace.config import load_preset
    from vivace.rl.rollout import to_samples

    cfg = load_preset("default")
    solved_loop, solved, failed_loop = _rollout(1.4, True), _rollout(1.5, True), _rollout(0.0, False)
    for r in (solved_loop, failed_loop):
        r.trajectory.stop_reason = "max_turns"
    group = [solved_loop, solved, failed_loop]
    cfg.train.mask_truncated = True  # every rollout cut off by a limit: only the clean solve trains
    samples, counts = to_samples([group], cfg, version=0)
    assert [round(s.advantage, 3) for s in samples] == [0.533] and counts["samples_masked_truncated"] == 2
    cfg.train.mask_truncated = "solved"  # the looping solve sits out; the looping failure is pushed down
    samples, counts = to_samples([group], cfg, version=0)
    assert [round(s.advantage, 3) for s in samples] == [0.533, -0.967] and counts["samples_masked_truncated"] == 1


def test_successes_are_not_trained_on_their_malformed_turns():
    from vivace.config import load_preset
    from vivace.rl.rollout import to_samples, without_malformed_turns

    cfg = load_preset("default")
    win, loss = _three_turn_rollout(1.0, True), _three_turn_rollout(0.0, False)
    assert without_malformed_turns(win.trajectory) == ([0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0], 2)
    samples, counts = to_samples([[win, loss]], cfg, version=0)
    assert samples[0].advantage > 0 and samples[0].mask == [0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert samples[1].advantage < 0 and samples[1].mask == loss.trajectory.tokens.loss_mask  # still pushed down
    assert counts["turns_masked_malformed"] == 2
    cfg.train.mask_malformed = False
    assert to_samples([[win, loss]], cfg, version=0)[0][0].mask == win.trajectory.tokens.loss_mask


def test_solved_mask_answer_masks_the_episodes_own_last_turn_after_malformed_masking():
    from vivace.config import load_preset
    from vivace.rl.rollout import to_samples

    cfg = load_preset("default")
    cfg.train.group_filter, cfg.train.solved_mask_answer = "solved", True
    faster, slower = _three_turn_rollout(1.0, True), _three_turn_rollout(0.9, True)  # all solved, rewards differ
    samples, _ = to_samples([[faster, slower]], cfg, version=0)
    # The faster one's malformed turns 2 and 3 are out already; its answer turn is turn 3, so the read
    # (turn 1) still trains. Masking "the last turn left" would have dropped the read and the sample.
    assert samples[0].advantage > 0 and samples[0].mask == [0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    # Pushed down: the malformed turns stay in; only the episode's own final turn leaves.
    assert samples[1].advantage < 0 and samples[1].mask == [0, 0, 1, 1, 0, 1, 1, 1, 0, 0, 0]


def test_malformed_masking_leaves_a_mask_it_cannot_align():
    from vivace.rl.rollout import without_malformed_turns

    r = _three_turn_rollout(1.0, True)
    r.trajectory.turns.pop()  # three sampled runs, two recorded turns: which run is which is unknown
    assert without_malformed_turns(r.trajectory) == (r.trajectory.tokens.loss_mask, 0)


def test_a_success_made_only_of_malformed_turns_is_dropped():
    from vivace.config import load_preset
    from vivace.rl.rollout import to_samples

    win, loss = _three_turn_rollout(1.0, True), _three_turn_rollout(0.0, False)
    win.trajectory.turns[0].tool_calls[0].format_error = True
    samples, counts = to_samples([[win, loss]], load_preset("default"), version=0)
    assert [s.advantage < 0 for s in samples] == [True] and counts["samples_without_tokens"] == 1


def test_training_tasks_by_family(tmp_path):
    from vivace.config import load_preset
    from vivace.rl.controller import training_tasks

    cfg = load_preset("tiny")
    every = training_tasks(cfg)
    cfg.train.families = ["wrong_keyword", "misspelled_method"]
    some = training_tasks(cfg)
    assert {t.family for t in some} == {"wrong_keyword", "misspelled_method"} and len(some) == 200 < len(every)
    assert all(t.split == "train" for t in some)
    cfg.train.families = ["wrong_keyword", "nope"]
    with pytest.raises(ValueError, match="train.families: nope not in suite 'families'.*misspelled_method"):
        training_tasks(cfg)
    # A user's tasks file under the tiny preset, which names the built-in families: say to unset them.
    cfg.train.suite, cfg.train.families = str(_users_tasks(tmp_path)), load_preset("tiny").train.families
    with pytest.raises(ValueError, match="set train.families to null for all"):
        training_tasks(cfg)
    cfg.train.families = None
    assert len(training_tasks(cfg)) == 2  # no split named: train
    from vivace.rl.evaluate import held_out_tasks

    with pytest.raises(ValueError, match="metadata.split; train when it names none.*train.eval_tasks to 0"):
        held_out_tasks(cfg, 1)


def _users_tasks(tmp_path):
    """Two tasks as a user writes them: no family, no split."""
    from vivace.tasks.suites import load_suite

    tasks = load_suite("families", split="train")[:2]
    for t in tasks:
        t.metadata = {}
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(t.model_dump_json(exclude={"base_dir"}) + "\n" for t in tasks))
    return path


def test_training_tasks_by_id():
    from vivace.config import load_preset
    from vivace.rl.controller import training_tasks
    from vivace.tasks.suites import load_suite

    cfg = load_preset("tiny", train={"families": None})
    every = training_tasks(cfg)
    picked = [every[5].id, every[0].id, every[5].id]
    cfg.train.task_ids = picked
    assert [t.id for t in training_tasks(cfg)] == picked[:2]  # in the order given, each once
    validation = next(t for t in load_suite("families", split="validation"))
    cfg.train.task_ids = [every[0].id, validation.id]  # another split's task is not a training task
    with pytest.raises(ValueError, match=f"train.task_ids: {validation.id} not among"):
        training_tasks(cfg)


def test_adam_eps_keeps_tiny_gradient_parameters_still():
    """Adam's first steps move every parameter with a gradient by about lr; an epsilon above the
    typical per-parameter gradient (train.adam_eps) leaves those with tiny gradients where they were."""
    from vivace.config import load_preset
    from vivace.rl.trainer import Sample, Trainer

    ids = list(range(40, 80))
    mask = [0] * 20 + [1] * 20
    sample = Sample(ids, mask, [-1.0 * m for m in mask], [0 if m else -1 for m in mask], advantage=1.0)
    moved = {}
    for eps in (1e-8, 1.0):
        cfg = load_preset("tiny").train
        cfg.lr, cfg.adam_eps = 1e-3, eps
        trainer = Trainer("tiny-init", cfg)
        assert all(g["eps"] == eps for g in trainer.optimizer.param_groups)
        before = [p.detach().clone() for p in trainer.model.parameters()]
        trainer.train_step([sample])
        after = trainer.model.parameters()
        changed = torch.cat([(p.detach() - b).abs().flatten() for p, b in zip(after, before, strict=True)])
        moved[eps] = float((changed > cfg.lr / 2).float().mean())
    assert moved[1e-8] > 0.3 and moved[1.0] < 0.001


def test_trainer_reports_the_kl_to_its_starting_policy_when_anchored():
    """With train.kl_coef the trainer keeps a frozen copy of the starting policy and reports the k3 KL
    to it: 0 on the first step (nothing has moved yet), above 0 once an update has moved the policy."""
    from vivace.config import load_preset
    from vivace.rl.trainer import Sample, Trainer

    ids = list(range(40, 80))
    mask = [0] * 20 + [1] * 20
    sample = Sample(ids, mask, [-1.0 * m for m in mask], [0 if m else -1 for m in mask], advantage=1.0)
    cfg = load_preset("tiny").train
    cfg.lr, cfg.kl_coef = 1e-3, 0.1
    trainer = Trainer("tiny-init", cfg)
    first = trainer.train_step([sample])
    second = trainer.train_step([sample])
    assert first["kl_reference_k3"] == pytest.approx(0.0, abs=1e-9)
    assert second["kl_reference_k3"] > 1e-6
    cfg.kl_coef = 0.0
    assert "kl_reference_k3" not in Trainer("tiny-init", cfg).train_step([sample])


def test_sequence_aggregation_weighs_each_rollout_alike():
    """A short success and long failures: with token weighting the failures' shared tokens outweigh the
    success's (the group's advantages sum to 0 but its token-weighted advantages do not)."""
    from vivace.config import load_preset
    from vivace.rl.rollout import to_samples

    cfg = load_preset("default")
    group = [_rollout(1.0, True, generated=10), _rollout(0.0, False, generated=30), _rollout(0.0, False, generated=20)]

    def push(samples):  # the summed advantage over all trained tokens: what a token every rollout writes gets
        return sum(s.advantage * sum(s.mask) for s in samples)

    token = to_samples([group], cfg, version=0)[0]
    assert push(token) == pytest.approx(10 * 2 / 3 - 50 / 3)  # net push down
    cfg.train.loss_aggregation = "sequence"
    seq = to_samples([group], cfg, version=0)[0]
    assert push(seq) == pytest.approx(0.0)
    assert [round(s.advantage * sum(s.mask), 6) for s in seq] == [round(a * 20, 6) for a in (2 / 3, -1 / 3, -1 / 3)]
