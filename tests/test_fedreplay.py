"""FedReplay: the encoder is trained at its node under a stated rule (until its training loss changes by under
1% over 3 epochs, at most --encoder-epochs; or exactly that many) and then frozen, no training at all only when
asked for by name, every node's latents are uploaded once with their exact bytes, and the head learns from latents
only (resume and the distributed engine: test_strategy_registry.py)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from conftest import copy_exp
from fedcli.comm.payloads import encode_features
from fedcli.core.errors import UserError
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import read_json
from fedcli.federate import engine, stage
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.fedreplay import plateaued
from fedcli.models.cuts import split
from fedcli.pipeline.runner import federate_key
from fedcli.report import notes
from fedcli.report.collect import load_experiment
from fedcli.training.settings import LocalTrainer

ONE_EPOCH = {"encoder_rule": "fixed", "encoder_epochs": 1}  # the encoder's training of these tests


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    from conftest import Cli

    folder = tmp_path_factory.mktemp("fedreplay") / "exp"
    Cli().ok("partition", "--nodes", "3", "--image-size", "16", "--exp", folder)
    return folder


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Three nodes of 96 training images: two batches an epoch, so that tens of encoder epochs stay cheap."""
    from conftest import Cli

    folder = tmp_path_factory.mktemp("fedreplay-small") / "exp"
    Cli().ok("partition", "--nodes", "3", "--image-size", "16", "--exp", folder, "--train-size", "96")
    return folder


def federation(exp, **changes):
    cfg = FederateConfig(exp=exp, model=("cnn",), epochs=1, init_epochs=1, lr=1e-3, batch=48, bootstrap=20, rounds=2)
    return engine.build(dataclasses.replace(cfg, **changes), Manifest.load(exp), 0)


def states_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_encoder_is_frozen_after_its_node_and_the_head_never_sees_an_image(exp, monkeypatch):
    trained = []
    train = LocalTrainer.train

    def spy(self, model, key, round_, primary, replay, epochs, objective=None, compose=None):
        trained.append((round_, key, primary.images.dtype, tuple(primary.images.shape[1:])))
        return train(self, model, key, round_, primary, replay, epochs, objective, *([compose] if compose else []))

    monkeypatch.setattr(LocalTrainer, "train", spy)
    fed = federation(exp)
    replay = REGISTRY.build("fedreplay", {"cut": "stage2"} | ONE_EPOCH)
    sizes = {node: len(fed.data.train[node]) for node in fed.nodes}
    replay.setup(fed)
    largest = max(fed.nodes, key=lambda n: (sizes[n], -fed.nodes.index(n)))
    assert replay.encoder_node == replay.server == largest
    encoder = {k: v.clone() for k, v in replay.encoder.state_dict().items()}
    seen = []
    replay.head[0].register_forward_pre_hook(lambda module, inputs: seen.append(tuple(inputs[0].shape[1:])))
    for round_ in (1, 2):
        replay.run_round(fed, round_)
    assert trained[0] == (0, largest, torch.uint8, (1, 16, 16))  # the whole network, at the encoder's node, once
    assert trained[1:] == [(r, largest, torch.float32, (64, 4, 4)) for r in (1, 2)]  # then latents only
    assert seen and set(seen) == {(64, 4, 4)}
    assert all(torch.equal(replay.encoder.state_dict()[k], v) for k, v in encoder.items())
    assert len(replay.latents) == sum(sizes.values())
    sent = [(t.round, t.sender, t.receiver, t.kind) for t in fed.transport.transfers]
    others = [n for n in fed.nodes if n != largest]
    assert sent == [*[(0, largest, n, "model") for n in others], *[(0, n, largest, "latents") for n in others]]
    for transfer in fed.transport.transfers:
        if transfer.kind == "latents":
            n = sizes[transfer.sender]
            payload = encode_features(torch.zeros(n, 64, 4, 4), torch.zeros(n, dtype=torch.int64))
            assert transfer.bytes == len(payload)
            assert transfer.bytes - 8 - int.from_bytes(payload[:8], "little") == n * 64 * 4 * 4 * 4 + 8 * n
    kept = replay.kept()["latents"]
    assert kept["latents"].shape[1:] == (64, 4, 4) and sorted(set(kept["node"].tolist())) == [0, 1, 2]


def test_a_server_other_than_the_encoder_node_gets_the_head_and_every_latent(exp):
    fed = federation(exp)
    replay = REGISTRY.build("fedreplay", {"encoder_node": "node0", "server_node": "node1"} | ONE_EPOCH)
    replay.setup(fed)
    sent = [(t.sender, t.receiver, t.kind) for t in fed.transport.transfers]
    assert sent == [("node0", "node1", "model"), ("node0", "node2", "model"), ("node0", "node1", "model"),
                    ("node0", "node1", "latents"), ("node2", "node1", "latents")]


def test_an_encoder_node_that_is_not_a_node_is_one_line(cli, exp):
    assert "--encoder-node nodeX is not a node; nodes: node0, node1, node2" in cli.user_error(
        "federate", "--exp", exp, "--strategy", "fedreplay", "--encoder-node", "nodeX", "--rounds", "1")
    assert not (exp / "federate" / "fedreplay").exists()


def test_no_encoder_training_is_refused_in_one_line_unless_asked_for_by_name(cli, small):
    line = cli.user_error("federate", "--exp", small, "--strategy", "fedreplay", "--encoder-epochs", "0", "--rounds",
                          "1")
    assert line == ("error: fedreplay --encoder-epochs 0 trains no encoder: FedReplay would freeze and send the random "
                    "initialisation; give --encoder-epochs 1 or more, or ask for an untrained encoder by name with "
                    "--encoder-rule untrained")
    assert "--encoder-epochs 3 would go unused" in cli.user_error(
        "federate", "--exp", small, "--strategy", "fedreplay", "--encoder-rule", "untrained", "--encoder-epochs", "3")
    assert not (small / "federate").exists()
    with pytest.raises(UserError, match="trains no encoder"):
        REGISTRY.build("fedreplay", {"encoder_rule": "fixed", "encoder_epochs": 0})
    options = REGISTRY.resolved_options("fedreplay", {})
    assert (options.encoder_rule, options.encoder_epochs) == ("plateau", 50)  # the defaults: trained, to a rule
    assert REGISTRY.resolved_options("fedreplay", {"encoder_rule": "untrained"}).encoder_epochs == 0


def test_an_untrained_encoder_asked_for_by_name_is_the_initial_model_bit_for_bit(small, tmp_path):
    fed = federation(small, init_epochs=3)  # init-epochs trains nothing of FedReplay's
    replay = REGISTRY.build("fedreplay", {"encoder_rule": "untrained"})
    replay.setup(fed)
    initial, _ = split(fed.trainer.new_model("global"), "cnn", "stem")
    assert states_equal(replay.encoder.state_dict(), initial.state_dict())  # BatchNorm's statistics too
    assert {t.kind for t in fed.transport.transfers} == {"latents"}  # every node builds it alike: it does not travel
    replay.run_round(fed, 1)
    assert states_equal(replay.encoder.state_dict(), initial.state_dict())
    assert replay.tables() == {"encoder": [{"node": replay.encoder_node, "epoch": 0, "train_loss": pytest.approx(
        float("nan"), nan_ok=True), "rule": "untrained", "epochs": 0, "stopped": "untrained"}]}
    exp = copy_exp(small, tmp_path)  # the report names it
    stage.run(FederateConfig(exp=exp, strategy=("fedreplay",), rounds=1, bootstrap=20, threads=1,
                             encoder_rule="untrained"))
    assert "fedreplay: untrained encoder + 1 x 1 epochs (R x E of the head)" in notes.budget_note(load_experiment(exp))


def test_the_plateau_rule_stops_when_the_loss_stands_still_and_the_cap_binds_otherwise(small):
    assert plateaued([2.0, 1.0, 1.009, 0.995, 1.004])  # the last 3 within 1% of the one before them
    assert not plateaued([1.0, 1.0, 1.0])  # 3 epochs of change need 4 epochs
    assert not plateaued([1.0, 0.98, 1.0, 1.0]) and not plateaued([1.0, 1.0, 1.0, 1.02])

    def trained(lr: float, options: dict) -> list[dict]:
        replay = REGISTRY.build("fedreplay", options)
        replay.setup(federation(small, lr=lr))
        return replay.tables()["encoder"]

    still = trained(1e-8, {"encoder_epochs": 30})  # the loss stands still: the rule stops at its first chance
    assert [(r["epoch"], r["stopped"]) for r in still] == [(e, "plateau") for e in (1, 2, 3, 4)]
    assert plateaued([r["train_loss"] for r in still])
    learning = trained(1e-3, {"encoder_epochs": 3})  # still learning: the cap binds
    assert [(r["epoch"], r["stopped"], r["epochs"]) for r in learning] == [(e, "cap", 3) for e in (1, 2, 3)]
    assert learning[0]["train_loss"] > learning[-1]["train_loss"]
    fixed = trained(1e-8, {"encoder_rule": "fixed", "encoder_epochs": 6})  # fixed ignores the plateau
    assert [(r["epoch"], r["stopped"]) for r in fixed] == [(e, "fixed") for e in range(1, 7)]


def test_fixed_epochs_are_the_nodes_usual_local_training_and_init_epochs_changes_nothing(small):
    fed = federation(small)
    replay = REGISTRY.build("fedreplay", {"encoder_rule": "fixed", "encoder_epochs": 3})
    replay.setup(fed)
    node = replay.encoder_node
    usual = fed.trainer.new_model("global")  # 3 epochs of the node's local training, at a constant rate
    fed.trainer.train(usual, node, 0, fed.data.train[node], None, 3)
    assert states_equal(replay.model.state_dict(), usual.state_dict())
    finals = []
    for init_epochs in (0, 4):  # the encoder's epochs and the head's schedule (cosine) read no init-epochs
        fed = federation(small, init_epochs=init_epochs, lr_schedule="cosine")
        replay = REGISTRY.build("fedreplay", {"encoder_rule": "fixed", "encoder_epochs": 2})
        replay.setup(fed)
        for round_ in (1, 2):
            replay.run_round(fed, round_)
        finals.append(replay.model.state_dict())
    assert states_equal(*finals)


def test_the_rule_and_the_epochs_trained_are_written_kept_across_a_resume_and_fingerprinted(small, tmp_path):
    run = dict(strategy=("fedreplay",), rounds=2, epochs=1, batch=48, bootstrap=20, threads=1, encoder_epochs=5)
    whole = copy_exp(small, tmp_path / "whole")
    stage.run(FederateConfig(exp=whole, **run))
    folder = whole / "federate" / "fedreplay"
    config = read_json(folder / "config.json", "config")["config"]
    assert (config["encoder_rule"], config["encoder_epochs"]) == ("plateau", 5)
    written = pd.read_csv(folder / "encoder.csv")
    assert list(written.columns) == ["node", "epoch", "train_loss", "rule", "epochs", "stopped"]
    assert written.epoch.tolist() == [1, 2, 3, 4, 5] and set(written.stopped) == {"cap"}
    resumed = copy_exp(small, tmp_path / "resumed")

    def crash(strategy, round_):
        if round_ == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stage.run(FederateConfig(exp=resumed, **run), after_round=crash)
    stage.run(FederateConfig(exp=resumed, resume=True, **run))
    assert (resumed / "federate" / "fedreplay" / "encoder.csv").read_bytes() == (folder / "encoder.csv").read_bytes()
    key = federate_key(FederateConfig(exp=whole, **run))  # a run made before the rule existed is stale
    assert (key["encoder_rule"], key["encoder_epochs"]) == ("plateau", 5)
