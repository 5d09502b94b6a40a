"""Membership inference on the classifiers a federation shares (audit/classifier_membership.py): the loss attack and
the LiRA game find a memoriser and nothing in a model that never saw the pool; the statistic is LiRA's; references
are deterministic and each trains on half the pool; `audit-privacy --shared` attacks FedAvg's global model and
FedER's travelling classifiers, and the report pools them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedcli.audit import classifier_membership as cm
from fedcli.core.devices import torch_threads
from fedcli.core.rng import numpy_stream, torch_stream
from fedcli.data.dataset import to_float
from fedcli.data.manifest import Manifest
from fedcli.data.tensor_source import TensorSource
from fedcli.generators.groups import complementary_halves

POOL = 40  # members, and as many non-members
CLASSES = 2


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is as fast, and waits on no other thread on a busy machine."""
    with torch_threads(1):
        yield


class Lookup(nn.Module):
    """Memorises its training images: a large margin for the label of an image it saw, uniform logits otherwise."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        super().__init__()
        self.images, self.labels = images.flatten(1).float(), labels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        matches = (x.flatten(1)[:, None] == self.images[None]).all(dim=2)
        seen = matches.any(dim=1)
        logits = torch.zeros(len(x), CLASSES)
        logits[seen, self.labels[matches.float().argmax(dim=1)[seen]]] = 12.0
        return logits


def tiny_pool() -> cm.Pool:
    images = torch.randint(0, 256, (2 * POOL, 1, 8, 8), generator=torch_stream(0, "pool"), dtype=torch.uint8)
    labels = torch.arange(2 * POOL) % CLASSES
    return cm.Pool(images, labels, POOL, TensorSource(images[:0], labels[:0]), POOL)


def lookup_of(pool: cm.Pool, inside: np.ndarray) -> Lookup:
    chosen = torch.from_numpy(np.flatnonzero(inside))
    return Lookup(to_float(pool.images[chosen]), pool.labels[chosen])


def lookup_references(pool: cm.Pool, count: int) -> cm.References:
    inside = complementary_halves(len(pool.labels), count, numpy_stream(0, "halves"))
    statistics = np.array([cm.true_class_scores(cm.logits_of(lookup_of(pool, half), pool.images), pool.labels)[1]
                           for half in inside])
    return cm.References(statistics, inside, [0] * count, [0.0] * count, POOL, "test")


def test_a_memoriser_is_found_by_the_loss_attack_and_the_game():
    pool = tiny_pool()
    target = lookup_of(pool, pool.is_member.astype(bool))
    result = cm.attack_model(target, pool, lookup_references(pool, 4), 0, "n", "test", "m")
    assert result["loss"]["auroc"] > 0.99 and result["loss"]["direction"] == "members closer"
    assert result["lira"]["target"]["auroc"] > 0.99
    lowest = result["lira"]["low_fpr"]["at_min_fpr"]
    assert lowest["min_fpr"] <= 0.1 and lowest["tpr"] > 0.9
    assert result["lira"]["empirical_epsilon"]["epsilon_lower_bound"] > 1


def test_a_model_that_never_saw_the_pool_reads_as_chance():
    pool = tiny_pool()
    generator = torch_stream(1, "untrained")
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, CLASSES))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    reading = cm.attack_model(model, pool, None, 0, "n", "test", "untrained")["loss"]
    assert reading["auroc_ci_low"] <= 0.5 <= reading["auroc_ci_high"]


def test_the_statistic_is_the_log_odds_of_the_true_class():
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.1, 0.2, 0.3], [40.0, 0.0, 0.0]])
    labels = torch.tensor([0, 2, 0])
    loss, statistic = cm.true_class_scores(logits, labels)
    p = torch.softmax(logits.double(), dim=1)[torch.arange(3), labels].numpy()
    assert np.allclose(statistic[:2], np.log(p[:2] / (1 - p[:2])))
    assert math.isclose(statistic[2], 40 - math.log(2), rel_tol=1e-12)  # where 1 - p rounds to 0
    assert np.allclose(loss, F.cross_entropy(logits, labels, reduction="none").numpy())


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    """Two 16 px digits nodes federated by FedAvg and FedER (no buffers), one round, and `audit-privacy --shared`."""
    from conftest import Cli

    exp = tmp_path_factory.mktemp("classifier-membership") / "exp"
    cli = Cli()
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--train-size", "24", "--folds", "2", "--exp", exp)
    cli.ok("federate", "--exp", exp, "--strategy", "fedavg", "--strategy", "feder", "--buffer-size", "0",
           "--rounds", "1", "--epochs", "1", "--bootstrap", "10", "--threads", "1")
    cli.ok("audit-privacy", "--exp", exp, "--shared", "--attack-images", "1", "--attack-iterations", "2",
           "--attack-restarts", "1", "--classifier-references", "4", "--threads", "1")
    return exp


def test_references_are_deterministic_and_each_trains_on_half_the_pool(exp, monkeypatch):
    manifest = Manifest.load(exp)
    config = json.loads((exp / "federate" / "fedavg" / "config.json").read_text())["config"]
    cfg = cm.standalone_config(exp, config)
    pool = cm.node_pool(manifest, "node0", 0)
    seen = []
    train = cm.train_standalone
    monkeypatch.setattr(cm, "train_standalone", lambda trainer, node, source: (seen.append(source), train(
        trainer, node, source))[1])
    first, second = (cm.train_references(cfg, manifest, "node0", pool, 4, 0, "fedavg") for _ in range(2))
    assert np.array_equal(first.statistics, second.statistics)
    assert (first.inside.sum(axis=1) == len(pool.labels) // 2).all()
    assert (first.inside[0::2] ^ first.inside[1::2]).all()  # complementary pairs
    for source, half in zip(seen, first.inside):
        pooled = pool.images[torch.from_numpy(np.flatnonzero(half))]
        assert torch.equal(source.images, torch.cat([pool.outside.images, pooled]))
    assert first.steps == [2] * 4  # 24 images, batch 32: one step in round 0, one in round 1


def test_the_shared_audit_attacks_fedavgs_global_model_and_feders_travelling_classifiers(exp):
    for strategy, target, keys in (("fedavg", "global model", {"global"}), ("feder", "travelling classifiers",
                                                                             {"node0", "node1"})):
        summary = json.loads((exp / "attacks" / strategy / "summary.json").read_text())
        assert summary["membership"]["settings"]["target"] == target
        for node, section in summary["membership"]["nodes"].items():
            assert set(section["models"]) == keys  # two nodes, one round: each travelling model visited both
            assert all(0 <= reading["loss"]["auroc"] <= 1 for reading in section["models"].values())
    feder = json.loads((exp / "attacks" / "feder" / "summary.json").read_text())
    assert feder["attacks"] == [] and feder["notes"]


def test_the_game_runs_on_the_shared_classifiers_and_the_report_pools_it(exp):
    from fedcli.report.classifier_membership import classifier_rows
    from fedcli.report.collect import load_experiment

    for strategy in ("fedavg", "feder"):
        summary = json.loads((exp / "attacks" / strategy / "summary.json").read_text())
        for section in summary["membership"]["nodes"].values():
            assert section["references"]["count"] == 4
            assert all(reading["lira"]["models"] == 5 for reading in section["models"].values())
    rows = classifier_rows(load_experiment(exp), "accuracy")
    assert set(rows) == {"fedavg: global model (membership)", "feder: travelling classifiers (membership)"}
    for row in rows.values():
        assert list(row) == ["membership AUROC", "LiRA AUROC", "LiRA TPR at low FPR", "empirical epsilon", "accuracy"]
        assert " at FPR " in row["LiRA TPR at low FPR"] and row["LiRA AUROC"].n > 0


def test_an_odd_or_too_small_number_of_references_is_one_line(cli, tmp_path):
    for count in ("3", "2"):
        line = cli.user_error("audit-privacy", "--exp", tmp_path / "exp", "--shared", "--classifier-references", count)
        assert "--classifier-references" in line
