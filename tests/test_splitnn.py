"""Cutting a classifier in two, and SplitNN: split training equals training the whole network, activations
and gradients travel every batch with their exact bytes, the bottom goes round the nodes in order (resume
and the distributed engine: test_strategy_registry.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from fedcli.comm.payloads import encode_features
from fedcli.comm.transport import InProcessTransport
from fedcli.data.manifest import Manifest
from fedcli.data.tensor_source import TensorSource
from fedcli.federate import engine
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies import REGISTRY
from fedcli.models.classifier import build_classifier
from fedcli.models.cuts import CUTS, split
from fedcli.training.local import Batches, LocalSettings, batch_bounds, train_local
from fedcli.training.split import Link, train_split


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    from conftest import Cli

    folder = tmp_path_factory.mktemp("splitnn") / "exp"
    Cli().ok("partition", "--nodes", "3", "--image-size", "16", "--exp", folder)
    return folder


@pytest.mark.parametrize("architecture", sorted(CUTS))
def test_every_cut_of_every_classifier_computes_the_classifier(architecture):
    model = build_classifier(architecture, 1, 3, init_seed=0).eval()
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        whole = model(x)
        for cut in CUTS[architecture]:
            bottom, top = split(model, architecture, cut)
            assert torch.equal(top(bottom(x)), whole), cut
            names = {id(p) for p in model.parameters()}
            assert {id(p) for p in [*bottom.parameters(), *top.parameters()]} == names  # its own modules, all


def header(payload: bytes) -> int:
    return 8 + int.from_bytes(payload[:8], "little")


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_split_training_of_one_institution_equals_training_the_whole_network(optimizer):
    generator = torch.Generator().manual_seed(1)
    source = TensorSource(torch.randint(0, 256, (70, 1, 16, 16), dtype=torch.uint8, generator=generator),
                          torch.randint(0, 3, (70,), generator=generator))
    settings = LocalSettings(epochs=2, lr=0.01, batch=16, augment=("hflip",), lr_schedule="cosine",
                             optimizer=optimizer, sgd_momentum=0.9, weight_decay=1e-3)
    whole = build_classifier("cnn", 1, 3, init_seed=0)
    model = copy.deepcopy(whole)
    bottom, top = split(model, "cnn", "stem")
    transport = InProcessTransport(REGISTRY.transfer_kinds())
    link = Link(transport, 1, "hospital", "server", (32, 8, 8), 3)
    steps = train_split(bottom, top, Batches(source, None, settings, torch.Generator().manual_seed(5)),
                        2 * len(batch_bounds(70, 16)), settings, link)
    train_local(whole, Batches(source, None, settings, torch.Generator().manual_seed(5)), settings)
    assert steps == 10
    for (name, got), expected in zip(model.state_dict().items(), whole.state_dict().values()):
        assert torch.allclose(got.float(), expected.float(), rtol=0, atol=1e-6), name
    # every batch: activations with labels up, their gradient down; the last batch of an epoch holds 70 - 64 = 6
    sizes = [16, 16, 16, 16, 6] * 2
    up = [t for t in transport.transfers if t.kind == "activations"]
    down = [t for t in transport.transfers if t.kind == "gradients"]
    assert [(t.sender, t.receiver) for t in up] == [("hospital", "server")] * 10
    assert [(t.sender, t.receiver) for t in down] == [("server", "hospital")] * 10
    for transfer, b in zip(up, sizes):
        payload = encode_features(torch.zeros(b, 32, 8, 8), torch.zeros(b, dtype=torch.int64))
        assert transfer.bytes == len(payload) and transfer.bytes - header(payload) == b * 32 * 8 * 8 * 4 + 8 * b
    for transfer, b in zip(down, sizes):
        payload = encode_features(torch.zeros(b, 32, 8, 8))
        assert transfer.bytes == len(payload) and transfer.bytes - header(payload) == b * 32 * 8 * 8 * 4


def federation(exp, **given):
    cfg = FederateConfig(exp=exp, model=("cnn",), epochs=1, init_epochs=0, lr=1e-3, batch=48, bootstrap=20, rounds=2)
    return engine.build(cfg, Manifest.load(exp), 0)


def test_the_bottom_goes_round_in_order_and_every_batch_reaches_the_server(exp):
    fed = federation(exp)
    splitnn = REGISTRY.build("splitnn", {})
    splitnn.setup(fed)
    splitnn.run_round(fed, 1)
    nodes = fed.nodes
    assert splitnn.server == nodes[-1]
    models = [(t.sender, t.receiver) for t in fed.transport.transfers if t.kind == "model"]
    assert models == [(nodes[0], nodes[1]), (nodes[1], nodes[2])]
    up = [t.sender for t in fed.transport.transfers if t.kind == "activations"]
    steps = {node: len(batch_bounds(len(fed.data.train[node]), 48)) for node in nodes}
    assert up == [node for node in nodes[:-1] for _ in range(steps[node])]  # the server's own batches stay
    kept = splitnn.kept()["activations"]
    bottom = [f"bottom/{k}" for k in splitnn.bottom.state_dict()]  # the bottom that computed them, with its node
    assert sorted(kept) == sorted(f"{n}/{k}" for n in nodes for k in ("activations", "gradients", "labels", "index",
                                                                        *bottom))
    assert kept[f"{nodes[0]}/activations"].shape == kept[f"{nodes[0]}/gradients"].shape == (48, 32, 8, 8)


def test_a_server_that_is_not_the_last_node_receives_the_bottom_only_to_test_it(exp):
    fed = federation(exp)
    splitnn = REGISTRY.build("splitnn", {"server_node": "node0"})
    splitnn.setup(fed)
    splitnn.run_round(fed, 1)
    evals = [(t.sender, t.receiver) for t in fed.transport.transfers if t.kind == "eval"]
    assert evals == [("node2", "node0")]
    assert {t.sender for t in fed.transport.transfers if t.kind == "activations"} == {"node1", "node2"}


def test_a_server_node_or_cut_that_does_not_exist_is_one_line(cli, exp):
    assert "--server-node nodeX is not a node; nodes: node0, node1, node2" in cli.user_error(
        "federate", "--exp", exp, "--strategy", "splitnn", "--server-node", "nodeX", "--rounds", "1")
    assert "--cut layer2 is not a cut of cnn; choose from stem, stage2, stage3" in cli.user_error(
        "federate", "--exp", exp, "--strategy", "fedavg", "--strategy", "splitnn", "--cut", "layer2", "--rounds", "1")
    assert not (exp / "federate").exists()  # refused before any strategy ran
