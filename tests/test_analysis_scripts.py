"""The measurement scripts' arithmetic: which tokens count as copied, and cosines of means from a
Gram matrix (scripts/gradient_signal.py, docs/benchmarks.md "Do the training groups share a direction?")."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import gradient_signal as gs  # noqa: E402


def test_copied_tokens_are_left_out_only_where_generated():
    ids = [5, 6, 7, 8, 9, 5, 6, 7, 1, 6, 7, 2]
    mask = [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    # With one token of context: (5,6) and (6,7) repeat spans of the prompt; (1,6) is new; the second
    # (6,7) repeats again; (7,2) is new. The prompt's own tokens stay out of the loss as they were.
    assert gs.without_copies(ids, mask, 1) == [0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 1]
    # With two: (9,5,6) is new, (5,6,7) repeats, (6,7,1) and (7,1,6) are new, (1,6,7) is new, (6,7,2) too.
    assert gs.without_copies(ids, mask, 2) == [0, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1]


def test_top_entropy_keeps_the_most_uncertain_positions():
    entropy = torch.tensor([0.1, 2.0, 0.5, 3.0, 0.0, 1.0, 0.2, 0.3, 0.4, 2.5])
    # The top fifth of ten positions: the two highest entropies, wherever they sit.
    assert gs.top_entropy(entropy, 0.2).tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 1]
    assert gs.top_entropy(entropy, 0.5).tolist() == [0, 1, 1, 1, 0, 1, 0, 0, 0, 1]
    assert gs.top_entropy(entropy, 1.0).tolist() == [1] * 10
    # Ties at the threshold are kept rather than broken by position.
    assert gs.top_entropy(torch.tensor([1.0, 1.0, 1.0, 0.0]), 0.25).tolist() == [1, 1, 1, 0]


def test_cosine_of_means_from_the_gram_matrix():
    g = torch.Generator().manual_seed(0)
    vectors = torch.randn(6, 50, generator=g, dtype=torch.float64)
    gram = vectors @ vectors.T
    a, b = [0, 2, 3], [1, 5]
    direct = torch.nn.functional.cosine_similarity(vectors[a].mean(0), vectors[b].mean(0), dim=0)
    assert abs(gs.mean_cos(gram, a, b) - float(direct)) < 1e-12
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0], dtype=torch.float64)
    flipped = vectors * sign[:, None]
    direct = torch.nn.functional.cosine_similarity(flipped[a].mean(0), flipped[b].mean(0), dim=0)
    assert abs(gs.mean_cos(gram, a, b, sign) - float(direct)) < 1e-12


def test_a_shared_direction_shows_in_rho():
    g = torch.Generator().manual_seed(1)
    shared = torch.randn(400, generator=g, dtype=torch.float64)
    noise = torch.randn(40, 400, generator=g, dtype=torch.float64)
    for weight, expected in ((0.0, 0.0), (1.0, 0.5)):  # rho = |shared|^2 / (|shared|^2 + |noise|^2)
        vectors = weight * shared + noise
        report = gs.analyse(vectors @ vectors.T, list(range(30)), list(range(30, 40)), draws=20)
        assert abs(report["rho"] - expected) < 4 * report["rho_se"] + 0.02


def test_by_theme_finds_the_kind_of_repository_that_shares_the_held_out_direction():
    g = torch.Generator().manual_seed(2)
    shared = torch.randn(400, generator=g, dtype=torch.float64)
    noise = torch.randn(36, 400, generator=g, dtype=torch.float64)
    ids = [f"bakery-t{i}" for i in range(12)] + [f"gen-{i}-t" for i in range(16)]
    with_held_out = torch.zeros(36, 1, dtype=torch.float64)
    with_held_out[:12] = with_held_out[28:] = 1.0  # real-word groups and the 8 held-out ones share a direction
    vectors = with_held_out * shared + noise
    report = gs.by_theme(vectors @ vectors.T, ids, list(range(28, 36)), draws=50)
    real, generated = report["real-word"], report["generated"]
    assert real["groups"] == 12 and generated["groups"] == 16
    assert real["pair_cos_with_test"] > 0.3 and abs(generated["pair_cos_with_test"]) < 0.1
    assert (
        real["mean_vs_test_mean"] > 0.7
        and abs(generated["mean_vs_test_mean"]) < 3 * generated["mean_vs_test_mean_null_sd"]
    )


def test_group_kinds_pick_split_or_all_solved_groups_with_differing_rewards():
    from vivace.rl.rollout import Rollout

    def group(task, *outcomes):
        return [Rollout(task, None, reward, resolved=solved) for solved, reward in outcomes]

    split = group("a", (True, 1.4), (False, 0.0))
    solved_alike = group("b", (True, 1.4), (True, 1.4))
    solved_differently = group("c", (True, 1.4), (True, 1.3))
    failed = group("d", (False, 0.0), (False, -0.1))
    groups = [split, solved_alike, solved_differently, failed, group("c", (True, 1.2), (True, 1.1))]
    assert gs.first_split(groups) == [split]
    assert gs.first_split(groups, gs.all_solved) == [solved_differently]  # one per task, the first
    # Held-out: a task's episodes from several runs merged, then judged as one group.
    merged = gs.merged_split([group("e", (True, 1.4)), group("e", (True, 1.3)), group("f", (True, 1.4))], gs.all_solved)
    assert [[r.reward for r in g] for g in merged] == [[1.4, 1.3]]
