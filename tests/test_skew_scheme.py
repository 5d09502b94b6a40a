"""--scheme skew --ks K: equal-sized nodes at a requested mean pairwise label skew (the generative-replay
study's splits), on digits (ten classes: total variation) and a binary task (KS)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from conftest import make_folders
from fedcli.core.errors import UserError
from fedcli.data import schemes
from fedcli.data.partition import make_manifest
from fedcli.data.records import Sample
from fedcli.data.skew import label_distributions, mean_pairwise_ks, mean_pairwise_tv
from fedcli.data.target_skew import equal_sizes, round_keeping_sums, sorted_split
from fedcli.experiment.config import PartitionConfig


def binary(positives: int, negatives: int) -> list[Sample]:
    labels = [1] * positives + [0] * negatives
    return [Sample(id=f"s{i}", label=y, site="x") for i, y in enumerate(labels)]


def counts(nodes, n_classes: int) -> np.ndarray:
    return np.array([[Counter(s.label for s in members)[c] for c in range(n_classes)] for _, members in nodes])


@pytest.mark.parametrize("target", [0.0, 0.3, 0.6, 0.9])
def test_digits_reach_the_requested_total_variation_with_equal_nodes(target, tmp_path):
    manifest, _ = make_manifest(PartitionConfig(exp=tmp_path / "e", scheme="skew", ks=target, nodes=4))
    assert abs(manifest["statistics"]["label_skew_tv"] - target) <= 0.02
    sizes = [len(node["train"]) + len(node["test"]) for node in manifest["nodes"]]
    assert sum(sizes) == 1797 and max(sizes) - min(sizes) <= 1
    assert manifest["ks"] == target


@pytest.mark.parametrize("target", [0.0, 0.3, 0.6])
def test_a_binary_task_reaches_the_requested_ks(target):
    nodes = schemes.skew(binary(400, 400), 4, target, seed=0)
    dists = label_distributions(counts(nodes, 2))
    assert abs(mean_pairwise_ks(dists) - target) <= 0.02
    assert mean_pairwise_ks(dists) == pytest.approx(mean_pairwise_tv(dists))  # one measure for two classes
    assert [len(m) for _, m in nodes] == [200] * 4


def test_ks_beyond_the_feasible_maximum_is_refused_with_the_maximum():
    with pytest.raises(UserError, match=r"--ks 0.9 is beyond .* 4 equal nodes \(mean pairwise KS 0.667\)"):
        schemes.skew(binary(400, 400), 4, 0.9, seed=0)  # K/(2(K-1)) = 2/3 for four nodes
    with pytest.raises(UserError, match=r"mean pairwise KS 0.5"):  # an imbalanced task reaches less
        schemes.skew(binary(200, 600), 4, 0.6, seed=0)


def test_the_split_is_a_function_of_the_seed_and_keeps_every_sample():
    data = binary(300, 500)
    ids = lambda nodes: [[s.id for s in m] for _, m in nodes]  # noqa: E731
    first, again, other = (schemes.skew(data, 4, 0.4, seed) for seed in (1, 1, 2))
    assert ids(first) == ids(again) and ids(first) != ids(other)
    assert sorted(s.id for _, m in first for s in m) == sorted(s.id for s in data)
    assert (counts(first, 2) == counts(other, 2)).all()  # the seed picks which images, not how many


def test_rounding_keeps_every_node_size_and_class_total():
    rng = np.random.default_rng(0)
    for _ in range(50):
        totals = rng.integers(1, 60, size=rng.integers(2, 9))
        sizes = equal_sizes(int(totals.sum()), int(rng.integers(2, 7)))
        mix = rng.uniform()
        target = (1 - mix) * sizes[:, None] * (totals / totals.sum())[None, :] + mix * sorted_split(totals, sizes)
        rounded = round_keeping_sums(target)
        assert (np.abs(rounded - target) < 1).all()
        assert (rounded.sum(axis=1) == sizes).all() and (rounded.sum(axis=0) == totals).all()


def test_skew_options_are_checked_as_one_line_each(cli, tmp_path):
    too_far = cli.user_error("partition", "--exp", tmp_path / "a", "--scheme", "skew", "--ks", "0.99", "--nodes", "4")
    assert "--ks 0.99 is beyond the most skewed training splits" in too_far and "total variation 0.94" in too_far
    assert "needs --ks" in cli.user_error("partition", "--exp", tmp_path / "b", "--scheme", "skew")
    assert "only to --scheme skew" in cli.user_error("partition", "--exp", tmp_path / "c", "--ks", "0.3")
    assert "--ks" in cli.user_error("partition", "--exp", tmp_path / "d", "--scheme", "skew", "--ks", "1.5")
    assert not any((tmp_path / name).exists() for name in "abcd")
    shown = cli.ok("partition", "--exp", tmp_path / "e", "--scheme", "skew", "--ks", "0.6", "--nodes", "4").stdout
    assert "total variation 0.60" in " ".join(shown.split())  # the measure reached, in the table's caption


def test_a_skew_that_leaves_a_node_with_one_class_is_refused_with_advice_for_the_skew(tmp_path):
    """Four nodes of 20 from 40 + 40 images at KS 0.66 (the maximum is 2/3): two nodes hold one class only."""
    data = make_folders(tmp_path / "data", {"site": {"neg": 40, "pos": 40}})
    with pytest.raises(UserError, match=r"--ks 0.66 leaves a node that cannot be tested .*; lower --ks"):
        make_manifest(PartitionConfig(exp=tmp_path / "e", source="folders", data_dir=data, scheme="skew", ks=0.66,
                                      nodes=4))
