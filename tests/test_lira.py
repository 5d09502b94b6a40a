"""The LiRA-style membership game: its score is the likelihood ratio it says, a memoriser is caught at a low false
positive rate with a large empirical epsilon, and a generator that saw none of the images gives a bound of 0."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedcli.audit import lira, scores
from fedcli.data.sources.digits import load_digit_images
from fedcli.generators.groups import complementary_halves
from fedcli.generators.perceptual import Perceptual


def test_the_score_equals_a_hand_computation_on_fixed_gaussian_statistics():
    statistics = np.array([[1.0, 4.0, 0.0],
                           [3.0, 2.0, 1.0],
                           [2.0, 5.0, 3.0],
                           [0.0, 3.0, 2.0],
                           [2.5, 3.5, 0.5]])  # the last row is the target
    inside = np.array([[1, 0, 1], [1, 1, 0], [0, 1, 1], [0, 0, 0], [1, 0, 1]], bool)
    # image 0: IN for rows 0, 1 (1, 3), OUT for rows 2, 3 (2, 0); image 1: IN row 1, 2 (2, 5), OUT 0, 3 (4, 3);
    # image 2: IN rows 0, 2 (0, 3), OUT rows 1, 3 (1, 2)
    mean_in, mean_out = np.array([2.0, 3.5, 1.5]), np.array([1.0, 3.5, 1.5])
    sd_in = math.sqrt((1 + 1 + 2.25 + 2.25 + 2.25 + 2.25) / 3)  # pooled within-image, 2 per image: 3 freedoms
    sd_out = math.sqrt((1 + 1 + 0.25 + 0.25 + 0.25 + 0.25) / 3)

    def log_density(x, mean, sd):
        return -0.5 * ((x - mean) / sd) ** 2 - math.log(sd * math.sqrt(2 * math.pi))

    target = statistics[4]
    expected = [log_density(x, a, sd_in) - log_density(x, b, sd_out) for x, a, b in zip(target, mean_in, mean_out)]
    assert lira.leave_one_out(statistics, inside)[4] == pytest.approx(expected)
    fitted = lira.fit(statistics[:4], inside[:4])
    assert fitted["sd_in"] == pytest.approx(sd_in) and fitted["sd_out"] == pytest.approx(sd_out)


def test_complementary_halves_put_every_image_in_half_the_references_and_half_the_pool_in_each():
    inside = complementary_halves(40, 6, np.random.default_rng(0))
    assert inside.shape == (6, 40)
    assert (inside.sum(axis=0) == 3).all() and (inside.sum(axis=1) == 20).all()
    assert not np.array_equal(inside[0], inside[2])


def test_a_generator_that_saw_none_of_the_images_gives_an_epsilon_bound_of_zero():
    """Statistics that do not depend on membership (models trained on none of the pooled images) in 20 seeded
    trials of the digits game's size: 8 references and the target, 80 pooled images."""
    zero = 0
    for trial in range(20):
        rng = np.random.default_rng(trial)
        inside = np.vstack([complementary_halves(80, 8, rng), rng.permutation(np.arange(80) < 40)[None]])
        statistics = rng.normal(size=(80,))[None] + rng.normal(scale=0.3, size=(9, 80))  # per-image difficulty
        result = lira.game(statistics, inside, 8, 1 / 400, rng)
        zero += result["empirical_epsilon"]["epsilon_lower_bound"] == 0
        assert result["skipped_trials"] == 0 and result["trials"] == 9 * 80
    assert zero >= 19


def test_the_bound_counts_a_reversed_signal():
    """Members further than non-members (statistic lower when IN) is as much a leak."""
    rng = np.random.default_rng(3)
    inside = np.vstack([complementary_halves(80, 8, rng), rng.permutation(np.arange(80) < 40)[None]])
    statistics = rng.normal(size=(80,))[None] - 3.0 * inside + rng.normal(scale=0.3, size=(9, 80))
    result = lira.game(statistics, inside, 8, 1 / 400, rng)
    assert result["empirical_epsilon"]["epsilon_lower_bound"] > 1
    assert result["target"]["strength"] > 0.9


def digits(n: int, size: int = 16) -> torch.Tensor:
    images = torch.from_numpy(load_digit_images()[0][:n]).unsqueeze(1)
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False) * 2 - 1


def test_a_memoriser_is_found_at_the_lowest_resolved_fpr_with_a_large_empirical_epsilon():
    """Target and references each return their own training half of the pool (a memoriser): an image's closest
    output is its nearest stored image, at LPIPS 0 when it was stored. (The audit's projection reaches most but not
    all of a softmax memoriser's members, test_audit's controls; here the attack is the exact one.)"""
    pool = digits(40)
    perceptual = Perceptual("alex")
    rng = np.random.default_rng(0)
    inside = np.vstack([complementary_halves(40, 6, rng), rng.permutation(np.arange(40) < 20)[None]])
    nearest = [scores.distance_matrix(perceptual, pool, pool[seen]).min(dim=1).values.numpy() for seen in inside]
    result = lira.game(-np.log(np.array(nearest) + 1e-12), inside, len(inside) - 1, 1 / 200, rng)
    lowest = result["low_fpr"]["at_min_fpr"]
    assert lowest["tpr"] > 0.95 and lowest["fpr"] <= lowest["min_fpr"]
    assert result["empirical_epsilon"]["epsilon_lower_bound"] > 2
    assert result["target"]["auroc"] > 0.95


def test_train_gan_trains_the_references_and_the_audit_plays_the_game_on_exactly_their_pool(cli, tmp_path):
    """Four references per node on complementary halves of the pool (the audited members and as many test images),
    each seeing as many images as the released generator; the audit reads them for both roles and every
    distance, and refuses to score another set of images."""
    import json

    from conftest import TINY_GAN

    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--train-size", "20", "--folds", "2", "--exp", exp)
    cli.ok("train-gan", "--exp", exp, "--node", "node0", *TINY_GAN, "--lira-references", "4")
    record = json.loads((exp / "gan" / "node0" / "config.json").read_text())
    lira_record = record["lira"]
    inside = np.array(lira_record["inside"], bool)
    assert inside.shape == (4, 2 * lira_record["members"]) and (inside.sum(axis=0) == 2).all()
    assert lira_record["images_each"] == record["train_images"]
    assert all((exp / "gan" / "node0" / f"generator_lira_{k}_{role}.safetensors").is_file()
               for k in range(4) for role in ("privacy", "control"))
    line = cli.user_error("audit-privacy", "--exp", exp, "--node", "node0", "--max-images", "10", "--steps", "2")
    assert "LiRA references were trained on a pool" in line and f"--max-images {lira_record['members']}" in line
    cli.ok("audit-privacy", "--exp", exp, "--node", "node0", "--max-images", "40", "--steps", "2")
    summary = json.loads((exp / "audit" / "node0" / "summary.json").read_text())
    assert set(summary["lira"]) == {"privacy", "control"}
    assert set(summary["lira"]["privacy"]) == set(lira.DISTANCES)
    game = summary["lira"]["privacy"]["lpips"]
    assert game["models"] == 5 and game["trials"] + game["skipped_trials"] == 5 * 2 * lira_record["members"]
    assert summary["generators"]["privacy"]["mia_lira"] == game["target"]
    assert "LiRA membership" in summary["verdict"]["attacks"]


def test_an_odd_or_too_small_number_of_references_is_refused_in_one_line(cli, tmp_path):
    for count in ("2", "3"):
        line = cli.user_error("train-gan", "--exp", tmp_path / "exp", "--lira-references", count)
        assert f"--lira-references {count}" in line and "at least 4" in line
