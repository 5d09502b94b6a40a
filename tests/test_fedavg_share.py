"""FedAvg+Share: the partition's globally shared set is class-balanced, of the stated size, apart from every
test set and from the nodes' training sets, and every node trains on the same union of it (resume and the
distributed engine: test_strategy_registry.py)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from fedcli.data.manifest import Manifest
from fedcli.federate import engine
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies import REGISTRY
from fedcli.training.settings import LocalTrainer


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    from conftest import Cli

    folder = tmp_path_factory.mktemp("share") / "exp"
    Cli().ok("partition", "--nodes", "3", "--image-size", "16", "--shared-fraction", "0.05", "--exp", folder)
    return folder


def key(record: dict) -> str:
    return json.dumps(record, sort_keys=True)


def test_the_shared_set_is_class_balanced_of_the_stated_size_and_apart_from_every_other_split(exp, cli, tmp_path):
    manifest = Manifest.load(exp)
    nodes = manifest["nodes"]
    shared = [r for node in nodes for r in node["shared"]]
    train = [r for node in nodes for r in node["train"]]
    per_class = round(0.05 * (len(shared) + len(train)) / 10)
    assert Counter(r["label"] for r in shared) == {label: per_class for label in range(10)}
    tests = {key(r) for node in nodes for r in node["test"]}
    assert not {key(r) for r in shared} & tests and not {key(r) for r in shared} & {key(r) for r in train}
    # the same draw again, and without the option nothing is set apart
    again = tmp_path / "again"
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--shared-fraction", "0.05", "--exp", again)
    assert Manifest.load(again)["nodes"] == nodes
    plain = tmp_path / "plain"
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--exp", plain)
    plain_nodes = Manifest.load(plain)["nodes"]
    assert all("shared" not in node for node in plain_nodes)
    assert [sorted(map(key, n["train"])) for n in plain_nodes] == \
        [sorted(map(key, n["train"] + n["shared"])) for n in nodes]
    # a node's own file holds its own part only
    view = json.loads((exp / "partition" / "nodes" / "node1.json").read_text())
    assert [("shared" in n, n.get("shared_count")) for n in view["nodes"]] == \
        [(False, len(nodes[0]["shared"])), (True, None), (False, len(nodes[2]["shared"]))]


def test_every_node_trains_on_its_images_and_the_same_union_of_the_shared_set(exp, monkeypatch):
    seen = []
    train = LocalTrainer.train

    def spy(self, model, key_, round_, primary, replay, epochs, objective=None, compose=None):
        seen.append((key_, primary))
        return train(self, model, key_, round_, primary, replay, epochs, objective)

    monkeypatch.setattr(LocalTrainer, "train", spy)
    cfg = FederateConfig(exp=exp, model=("cnn",), epochs=1, init_epochs=0, batch=64, bootstrap=20, rounds=1)
    fed = engine.build(cfg, Manifest.load(exp), 0)
    share = REGISTRY.build("fedavg-share", {})
    share.setup(fed)
    share.run_round(fed, 1)
    union = [fed.data.shared[n] for n in fed.nodes]
    n_shared = sum(len(s) for s in union)
    for node, primary in seen:
        own = len(fed.data.train[node])
        assert len(primary) == own + n_shared
        assert torch.equal(primary.images[own:], torch.cat([s.images for s in union]))
        assert torch.equal(primary.labels[own:], torch.cat([s.labels for s in union]))
    sent = [(t.sender, t.receiver) for t in fed.transport.transfers if t.kind == "shared-images"]
    assert sent == [(a, b) for a in fed.nodes for b in fed.nodes if a != b]


def test_bad_shared_sets_are_one_line(cli, exp, tmp_path):
    assert "--shared-fraction must lie in [0, 0.5]" in cli.user_error(
        "partition", "--nodes", "3", "--shared-fraction", "0.7", "--exp", tmp_path / "a")
    assert "is less than one image per class" in cli.user_error(
        "partition", "--nodes", "3", "--shared-fraction", "0.001", "--exp", tmp_path / "b")
    assert not (tmp_path / "b" / "partition").exists()
    plain = tmp_path / "plain"
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--exp", plain)
    assert "fedavg-share trains on a globally shared set, which this partition has none of" in cli.user_error(
        "federate", "--exp", plain, "--strategy", "fedavg-share", "--rounds", "1")


def test_averaging_keeps_the_first_node_s_update_of_every_round(exp, monkeypatch):
    trained = []
    train = LocalTrainer.train

    def spy(self, model, key_, round_, primary, replay, epochs, objective=None, compose=None):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        steps = train(self, model, key_, round_, primary, replay, epochs, objective)
        trained.append((key_, round_, before, {k: v.clone() for k, v in model.state_dict().items()}))
        return steps

    monkeypatch.setattr(LocalTrainer, "train", spy)
    cfg = FederateConfig(exp=exp, model=("cnn",), epochs=1, init_epochs=1, batch=64, bootstrap=20, rounds=2)
    fed = engine.build(cfg, Manifest.load(exp), 0)
    fedavg = REGISTRY.build("fedavg", {})
    fedavg.setup(fed)
    for round_ in (1, 2):
        fedavg.run_round(fed, round_)
    kept = fedavg.kept()["updates"]
    first = [(r, before, after) for key_, r, before, after in trained if key_ == "node0"]
    assert [r for r, _, _ in first] == [0, 1, 2]
    assert set(kept) == {f"round{r}/{k}" for r, _, after in first for k, v in after.items() if v.is_floating_point()}
    for round_, before, after in first:
        assert all(torch.equal(kept[f"round{round_}/{k}"], after[k] - before[k])
                   for k in after if after[k].is_floating_point())
