"""The generative-replay study compared fairly: replay on the real images' step budget (counted from the local
loop, budget.csv), one rule for an epoch's last batch, skew measured on the training splits, and one fixed
global test set at every skew level and seed."""

from __future__ import annotations

import hashlib
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import ks_2samp

from conftest import copy_exp
from fedcli.data.manifest import Manifest
from fedcli.data.node_data import NodeData
from fedcli.data.partition import make_manifest
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.config import PartitionConfig
from fedcli.training.local import Batches, LocalSettings

FED = ["--rounds", "2", "--epochs", "1", "--init-epochs", "1", "--batch", "64", "--bootstrap", "10", "--threads", "1",
       "--replay-source", "buffers"]
CALLS = ["round", "key", "steps", "real"]


def budgets(exp, *names: str) -> dict[str, pd.DataFrame]:
    return {name: pd.read_csv(exp / "federate" / name / "budget.csv") for name in names}


def test_replay_visits_and_epochs_take_the_steps_of_the_real_images_alone(gan3_exp, tmp_path, cli):
    exp = copy_exp(gan3_exp, tmp_path)
    cli.ok("federate", "--exp", exp, *[a for s in ("cwt", "cwt-replay", "fedavg", "fedavg-replay")
                                       for a in ("--strategy", s)], *FED)
    spent = budgets(exp, "cwt", "cwt-replay", "fedavg", "fedavg-replay")
    for base in ("cwt", "fedavg"):
        replay = spent[f"{base}-replay"]
        pd.testing.assert_frame_equal(replay[CALLS], spent[base][CALLS])  # the same calls, steps and real images
        assert (spent[base]["replayed"] == 0).all()
        assert (replay["replayed"] == replay["real"]).all()  # --replay-share 0.5: one replayed image per real one
    sizes = {n: len(Manifest.load(exp).node(n)["train"]) for n in Manifest.load(exp).node_names}
    cwt, fedavg = spent["cwt"], spent["fedavg"]
    assert (cwt["steps"] == cwt["key"].map(lambda n: sizes[n] // 64)).all()  # floor: full batches only
    assert (fedavg["steps"] == fedavg["key"].map(lambda n: -(-sizes[n] // 64))).all()  # ceil: the last one kept


def test_the_union_draw_takes_more_steps_and_another_share_replays_in_proportion(gan3_exp, tmp_path, cli):
    exp = copy_exp(gan3_exp, tmp_path)
    cli.ok("federate", "--exp", exp, "--strategy", "cwt-replay", "--replay-mix", "union", *FED)
    union = budgets(exp, "cwt-replay")["cwt-replay"]
    assert (union["replayed"] == 0).all()  # replayed images are drawn as primary ones, one pool
    exp2 = copy_exp(gan3_exp, tmp_path / "b")
    cli.ok("federate", "--exp", exp2, "--strategy", "cwt-replay", "--replay-share", "0.25", *FED)
    quarter = budgets(exp2, "cwt-replay")["cwt-replay"]
    assert (union["steps"] > quarter["steps"]).all() and (union["real"] > quarter["real"]).all()
    share = quarter["replayed"] / (quarter["real"] + quarter["replayed"])
    assert np.allclose(share, 0.25, atol=0.01)
    assert "--replay-share must lie in [0, 1)" in cli.user_error("federate", "--exp", exp2, "--strategy",
                                                                 "cwt-replay", "--replay-share", "1", *FED)


def test_partial_batch_sets_one_rule_for_every_strategy():
    source = TensorSource(torch.zeros((70, 1, 4, 4), dtype=torch.uint8), torch.zeros(70, dtype=torch.long))
    steps = {}
    for rule in (None, "keep", "drop"):
        settings = LocalSettings(epochs=1, lr=1e-3, batch=32, partial_batch=rule)
        steps[rule] = [len(Batches(source, None, settings, torch.Generator(), partial=own)) for own in ("keep", "drop")]
    assert steps == {None: [3, 2], "keep": [3, 3], "drop": [2, 2]}  # each strategy's own rule unless set


def pneumonia(tmp_path, **options) -> Manifest:
    from conftest import copy_pneumonia

    data = copy_pneumonia(tmp_path)
    cfg = PartitionConfig(exp=tmp_path / "e", source="medmnist", data_dir=data, scheme="skew", nodes=4,
                          test_fraction=0.2, folds=2, **options)
    return make_manifest(cfg)[0]


def test_the_reached_ks_is_scipys_two_sample_ks_over_the_training_labels(tmp_path):
    manifest = pneumonia(tmp_path, ks=0.3, shared_fraction=0.05)
    labels = [np.array([r["label"] for r in node["train"]]) for node in manifest["nodes"]]
    expected = np.mean([ks_2samp(a, b).statistic for a, b in combinations(labels, 2)])
    assert manifest["statistics"]["label_skew_ks"] == pytest.approx(expected, abs=1e-6)
    assert abs(expected - 0.3) <= 0.02  # --ks is reached where models train
    tests = [np.array([r["label"] for r in node["test"]]) for node in manifest["nodes"]]
    assert manifest["statistics"]["test_label_skew_ks"] == pytest.approx(
        np.mean([ks_2samp(a, b).statistic for a, b in combinations(tests, 2)]), abs=1e-6)


def test_the_global_test_set_is_the_same_images_at_every_skew_level_and_seed(tmp_path):
    held = []
    for i, (ks, seed) in enumerate(((0.0, 0), (0.6, 0), (0.0, 1))):
        manifest = pneumonia(tmp_path / str(i), ks=ks, seed=seed, global_test=40)
        source = NodeData(manifest, lambda node: None).global_test()
        held.append(([hashlib.sha256(image.numpy().tobytes()).hexdigest() for image in source.images],
                     source.labels.tolist()))
        assert sorted(source.labels.tolist()) == [0] * 20 + [1] * 20
        ids = {r["id"] for r in manifest["global_test"]}
        for node in manifest["nodes"]:  # never trained on, nor in a node's own test set
            assert not ids & {r["id"] for part in ("train", "test") for r in node[part]}
    assert held[0] == held[1] == held[2]


def test_a_global_test_set_the_data_cannot_balance_is_refused_in_one_line(cli, tmp_path):
    assert "give a multiple of 10" in cli.user_error("partition", "--exp", tmp_path / "a", "--global-test", "25")
    assert "lower --global-test" in cli.user_error("partition", "--exp", tmp_path / "b", "--global-test", "1800")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_every_model_is_scored_once_on_the_global_test_set_apart_from_the_own_site_rows(cli, tmp_path):
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--global-test", "100", "--exp", exp)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", "--strategy", "standalone", "--rounds", "1",
           "--epochs", "1", "--batch", "64", "--bootstrap", "10", "--threads", "1")
    for name, keys in (("fedavg", ["global"]), ("standalone", ["node0", "node1", "node2", "ensemble"])):
        held = pd.read_csv(exp / "federate" / name / "global_test.csv")
        assert held[held["round"] == 1]["model_node"].tolist() == keys and set(held["n_test"]) == {100}
        assert set(held["round"]) == {0, 1} and (held["test_node"] == "global-test").all()
        metrics = pd.read_csv(exp / "federate" / name / "metrics.csv")
        assert "global-test" not in set(metrics["test_node"])


def test_with_few_labels_the_skew_is_met_on_the_labelled_and_unlabelled_images_that_train(tmp_path):
    manifest, _ = make_manifest(PartitionConfig(exp=tmp_path / "e", scheme="skew", ks=0.6, nodes=4,
                                                validation_fraction=0.3, held_apart_fraction=0.2))
    from fedcli.data.label_parts import training_labels
    from fedcli.data.summary import skew_of

    reached = skew_of([training_labels(n, manifest.hidden) for n in manifest["nodes"]], 10)["label_skew_tv"]
    assert reached == manifest["statistics"]["label_skew_tv"] and abs(reached - 0.6) <= 0.02
