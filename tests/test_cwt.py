"""CWT (cyclic weight transfer): one model visits the nodes in order, floor(|D_k|/b) steps per epoch at each,
and equals that serial training done by hand (resume and the distributed engine: test_strategy_registry.py)."""

from __future__ import annotations

import pytest
import torch

from fedcli.data.manifest import Manifest
from fedcli.federate import engine
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.cwt import full_batches
from fedcli.training.local import LocalSettings
from fedcli.training.settings import LocalTrainer


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    from conftest import Cli

    folder = tmp_path_factory.mktemp("cwt") / "exp"
    Cli().ok("partition", "--nodes", "3", "--image-size", "16", "--exp", folder)
    return folder


def federation(exp, init_epochs):
    cfg = FederateConfig(exp=exp, model=("cnn",), epochs=1, init_epochs=init_epochs, lr=1e-3, batch=48, bootstrap=20,
                         rounds=2)
    return engine.build(cfg, Manifest.load(exp), 0)


def test_the_model_visits_the_nodes_in_order_with_floor_n_over_b_steps_and_equals_serial_training(exp, monkeypatch):
    visits = []
    train = LocalTrainer.train

    def spy(self, model, key, round_, primary, replay, epochs, objective=None, compose=None):
        steps = train(self, model, key, round_, primary, replay, epochs, objective, compose)
        visits.append((round_, key, steps))
        return steps

    monkeypatch.setattr(LocalTrainer, "train", spy)
    fed = federation(exp, init_epochs=1)
    cwt = REGISTRY.build("cwt", {})
    cwt.setup(fed)
    for round_ in (1, 2):
        cwt.run_round(fed, round_)
    nodes = fed.nodes
    assert [(r, k) for r, k, _ in visits] == [(r, node) for r in (0, 1, 2) for node in nodes]
    assert all(steps == len(fed.data.train[key]) // 48 for _, key, steps in visits)
    sent = [(t.round, t.sender, t.receiver) for t in fed.transport.transfers]
    assert sent == [(0, "node0", "node1"), (0, "node1", "node2"),
                    *[(r, a, b) for r in (1, 2) for a, b in (("node2", "node0"), ("node0", "node1"),
                                                               ("node1", "node2"))]]
    assert {(t.kind, t.bytes) for t in fed.transport.transfers} == {("model", fed.transport.transfers[0].bytes)}

    monkeypatch.setattr(LocalTrainer, "train", train)
    by_hand = federation(exp, init_epochs=1)
    model = by_hand.trainer.new_model("global")
    for round_ in (0, 1, 2):
        for node in nodes:
            by_hand.trainer.train(model, node, round_, by_hand.data.train[node], None, 1, compose=full_batches)
    got = cwt.models()["global"].state_dict()
    assert all(torch.equal(got[k], v) for k, v in model.state_dict().items())


def test_without_initial_epochs_round_1_starts_from_the_common_model_with_nothing_sent_before_it(exp):
    fed = federation(exp, init_epochs=0)
    cwt = REGISTRY.build("cwt", {})
    cwt.setup(fed)
    assert fed.transport.transfers == []
    cwt.run_round(fed, 1)
    assert [(t.sender, t.receiver) for t in fed.transport.transfers] == [("node0", "node1"), ("node1", "node2")]


def test_a_node_smaller_than_a_batch_trains_one_batch_of_all_its_images(exp):
    fed = federation(exp, init_epochs=0)
    batches = full_batches(fed.data.train["node0"], None, fed.trainer.settings("node0", 1, 2),
                           torch.Generator().manual_seed(0))
    n = len(fed.data.train["node0"])
    assert len(batches) == 2 * (n // 48)
    small = full_batches(fed.data.train["node0"], None, LocalSettings(epochs=1, lr=1e-3, batch=n + 5),
                         torch.Generator().manual_seed(0))
    assert len(small) == 1 and next(iter(small)).x.shape[0] == n


def test_forgetting_scores_every_node_s_training_data_after_each_visit_of_the_last_cycle(exp, cli, tmp_path):
    from conftest import copy_exp
    from fedcli.metrics.scores import predict
    from fedcli.report import skew_study
    from fedcli.report.collect import load_experiment

    fed = federation(exp, init_epochs=0)
    cwt = REGISTRY.build("cwt", {"forgetting": True})
    cwt.setup(fed)
    cwt.run_round(fed, 1)
    assert cwt.tables() == {}  # round 1 of 2: not the last cycle
    cwt.run_round(fed, 2)
    rows = cwt.tables()["forgetting"]
    assert [(r["after_visit"], r["visited"], r["data"]) for r in rows] == \
        [(v + 1, fed.nodes[v], node) for v in range(3) for node in fed.nodes]
    for row in rows[-3:]:  # after the last visit: the final model
        train = fed.data.train[row["data"]]
        expected = (predict(cwt.models()["global"], train.images).argmax(1) == train.labels.numpy()).mean()
        assert row["accuracy"] == pytest.approx(expected, abs=1e-12)
    assert rows[0]["accuracy"] > rows[6]["accuracy"]  # node0's data, once node2 has trained the model

    copied = copy_exp(exp, tmp_path)
    cli.ok("federate", "--exp", copied, "--strategy", "cwt", "--forgetting", "--rounds", "1", "--epochs", "1",
           "--init-epochs", "0", "--batch", "48", "--threads", "1")
    table = skew_study.forgetting_table(load_experiment(copied))
    assert list(table.frame.columns) == [f"after visit {i + 1} (node{i})" for i in range(3)]
    assert list(table.frame.index) == ["node0", "node1", "node2"]


def test_the_forgetting_scores_survive_a_resume_after_the_last_round(exp, tmp_path):
    from conftest import copy_exp
    from fedcli.federate import stage

    run = dict(strategy=("cwt",), forgetting=True, rounds=2, epochs=1, init_epochs=0, batch=48, bootstrap=20,
               threads=1)
    whole = copy_exp(exp, tmp_path / "whole")
    stage.run(FederateConfig(exp=whole, **run))
    resumed = copy_exp(exp, tmp_path / "resumed")

    def crash(strategy, round_):
        if round_ == 2:  # the last round is checkpointed, its outputs not yet written
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stage.run(FederateConfig(exp=resumed, **run), after_round=crash)
    stage.run(FederateConfig(exp=resumed, resume=True, **run))
    assert (resumed / "federate" / "cwt" / "forgetting.csv").read_bytes() == \
        (whole / "federate" / "cwt" / "forgetting.csv").read_bytes()
