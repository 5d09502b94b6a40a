"""Partition schemes and splits as properties: disjoint, complete, balanced, skewed as asked."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from conftest import copy_pneumonia
from fedcli.core.errors import UserError
from fedcli.data import acquisition, schemes
from fedcli.data.loading import load_images
from fedcli.data.partition import make_manifest
from fedcli.data.records import Sample
from fedcli.data.skew import mean_pairwise_js, mean_pairwise_ks
from fedcli.data.splits import NodeError, split_node
from fedcli.experiment.config import PartitionConfig


def samples(labels, groups=None):
    return [Sample(id=f"s{i}", label=int(y), site="x", group=None if groups is None else groups[i])
            for i, y in enumerate(labels)]


def test_iid_gives_equal_stratified_nodes():
    labels = np.repeat(np.arange(4), 60)
    nodes = schemes.iid(samples(labels), 3, seed=0)
    sizes = [len(members) for _, members in nodes]
    assert sizes == [80, 80, 80]
    for _, members in nodes:
        assert Counter(s.label for s in members) == {0: 20, 1: 20, 2: 20, 3: 20}
    assert len({s.id for _, m in nodes for s in m}) == 240


def test_dirichlet_is_seed_determined_and_complete():
    labels = np.repeat(np.arange(5), 40)
    a = schemes.dirichlet(samples(labels), 4, alpha=0.3, seed=3, attempt=0)
    b = schemes.dirichlet(samples(labels), 4, alpha=0.3, seed=3, attempt=0)
    c = schemes.dirichlet(samples(labels), 4, alpha=0.3, seed=4, attempt=0)
    ids = lambda parts: [[s.id for s in m] for _, m in parts]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)
    assert sorted(s.id for _, m in a for s in m) == sorted(f"s{i}" for i in range(200))


def skew(manifest):
    return manifest["statistics"]


def test_small_alpha_dirichlet_is_measurably_more_skewed_than_iid(tmp_path):
    """On real binary data (PneumoniaMNIST) the KS statistic separates the schemes, as JS does on digits."""
    copy_pneumonia(tmp_path / "data")
    common = dict(exp=tmp_path / "e", source="medmnist", data_dir=tmp_path / "data", nodes=3)
    iid, _ = make_manifest(PartitionConfig(**common, scheme="iid"))
    skewed, _ = make_manifest(PartitionConfig(**common, scheme="dirichlet", alpha=0.1))
    assert skew(iid)["label_skew_ks"] < 0.02
    assert skew(skewed)["label_skew_ks"] > 0.2
    digits_iid, _ = make_manifest(PartitionConfig(exp=tmp_path / "d", scheme="iid", nodes=4))
    digits_dir, _ = make_manifest(PartitionConfig(exp=tmp_path / "d", scheme="dirichlet", alpha=0.1, nodes=4))
    assert skew(digits_iid)["label_skew_ks"] is None  # KS is for binary tasks
    assert skew(digits_dir)["label_skew_js"] > 10 * skew(digits_iid)["label_skew_js"]


def test_skewed_nodes_still_get_class_balanced_tests_and_keep_every_sample(tmp_path):
    m, _ = make_manifest(PartitionConfig(exp=tmp_path / "e", scheme="dirichlet", alpha=0.2, nodes=5))
    total = 0
    for node in m["nodes"]:
        counts = Counter(r["label"] for r in node["test"])
        assert len(counts) >= 2 and len(set(counts.values())) == 1
        total += len(node["train"]) + len(node["test"])
    assert total == 1797


def test_impossible_dirichlet_setting_is_reported():
    cfg = PartitionConfig(exp=None, scheme="dirichlet", alpha=0.001, nodes=40)
    with pytest.raises(UserError, match="every one of 100 Dirichlet draws"):
        make_manifest(cfg)


def test_js_and_ks_are_zero_for_equal_mixes_and_js_ignores_label_order():
    same = np.array([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])
    assert mean_pairwise_js(same) == pytest.approx(0) and mean_pairwise_ks(same) == pytest.approx(0)
    dists = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
    assert mean_pairwise_js(dists) == pytest.approx(mean_pairwise_js(dists[:, ::-1]))
    assert mean_pairwise_ks(np.array([[0.8, 0.2], [0.5, 0.5]])) == pytest.approx(0.3)


def test_split_puts_every_sample_on_exactly_one_side_with_rare_classes_in_train():
    labels = [0] * 50 + [1] * 30 + [2] * 6 + [3]  # class 3 has a single image
    train, test = split_node("n", samples(labels), list("abcd"), test_fraction=0.2, folds=3, seed=0)
    assert sorted(r["id"] for r in train + test) == sorted(f"s{i}" for i in range(len(labels)))
    counts = Counter(r["label"] for r in test)
    assert counts == {0: 3, 1: 3, 2: 3}  # capped at half the rarest testable class
    assert any(r["label"] == 3 for r in train)


def test_a_train_size_keeps_each_classs_share_of_a_smaller_train_set_and_leaves_the_test_set_alone():
    labels = [0] * 60 + [1] * 30 + [2] * 15
    full, test = split_node("n", samples(labels), list("abc"), test_fraction=0.2, folds=3, seed=0)
    smaller, same_test = split_node("n", samples(labels), list("abc"), 0.2, 3, seed=0, train_size=31)
    assert same_test == test and len(smaller) == 31
    assert {r["id"] for r in smaller} < {r["id"] for r in full}
    full_counts = Counter(r["label"] for r in full)
    exact = {c: 31 * n / len(full) for c, n in full_counts.items()}
    assert all(abs(n - exact[c]) < 1 for c, n in Counter(r["label"] for r in smaller).items())
    assert split_node("n", samples(labels), list("abc"), 0.2, 3, seed=0, train_size=31)[0] == smaller
    assert split_node("n", samples(labels), list("abc"), 0.2, 3, seed=1, train_size=31)[0] != smaller
    assert split_node("n", samples(labels), list("abc"), 0.2, 3, seed=0, train_size=500)[0] == full


def test_split_keeps_groups_together():
    labels = np.repeat([0, 1], 40)
    groups = [f"g{i // 4}" for i in range(80)]
    train, test = split_node("n", samples(labels, groups), ["a", "b"], 0.2, 4, seed=1)
    assert not {r["group"] for r in train} & {r["group"] for r in test}
    assert Counter(r["label"] for r in test) == {0: 8, 1: 8}


def test_single_class_and_too_small_nodes():
    # one image of class a: the message names b as the only testable class and a as the one-image class
    with pytest.raises(NodeError, match=r"such classes: b \(10 images\); a has one image"):
        split_node("n", samples([1] * 10 + [0]), ["a", "b"], 0.2, 2, seed=0)
    with pytest.raises(NodeError, match="--folds"):
        split_node("n", samples([0, 0, 1, 1, 0, 1]), ["a", "b"], 0.2, 5, seed=0)


def test_site_shift_scanners_change_the_images_deterministically(digits_manifest):
    names = digits_manifest.node_names
    specs = [digits_manifest.node(n)["acquisition"] for n in names]
    assert specs == [acquisition.for_node(i) for i in range(3)]
    node = names[0]
    records = digits_manifest.records(node, "train")[:16]
    shifted = load_images(digits_manifest, node, records).float() / 255
    plain = digits_manifest.data | {"nodes": [{**digits_manifest.node(node), "acquisition": None}]}
    from fedcli.data.manifest import Manifest

    raw = load_images(Manifest(plain), node, records).float() / 255
    bright = raw > 0.1  # sqrt magnifies the uint8 rounding of near-black pixels
    assert (shifted - raw ** 0.5)[bright].abs().max() < 0.01  # gamma 0.5 node
    assert (shifted - raw).abs().max() > 0.2


def test_noise_scanner_is_fixed_per_image():
    import torch

    images = torch.full((3, 1, 8, 8), 0.5)
    spec = {"name": "noise", "std": 0.15}
    a = acquisition.apply(images, spec, ["x", "y", "z"], seed=0, node="n")
    b = acquisition.apply(images[1:], spec, ["y", "z"], seed=0, node="n")
    assert torch.equal(a[1:], b) and not torch.equal(a[0], a[1])
