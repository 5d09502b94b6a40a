"""FedReplay: the encoder is trained at its node and then frozen, every node's latents are uploaded once with
their exact bytes, and the head learns from latents only (resume and the distributed engine:
test_strategy_registry.py)."""

from __future__ import annotations

import pytest
import torch

from fedcli.data.manifest import Manifest
from fedcli.fl import engine
from fedcli.fl.federate_config import FederateConfig
from fedcli.fl.payloads import encode_features
from fedcli.fl.strategies import REGISTRY
from fedcli.fl.trainer import LocalTrainer


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    from conftest import Cli

    folder = tmp_path_factory.mktemp("fedreplay") / "exp"
    Cli().ok("partition", "--nodes", "3", "--image-size", "16", "--exp", folder)
    return folder


def federation(exp):
    cfg = FederateConfig(exp=exp, model=("cnn",), epochs=1, init_epochs=1, lr=1e-3, batch=48, bootstrap=20, rounds=2)
    return engine.build(cfg, Manifest.load(exp), 0)


def test_the_encoder_is_frozen_after_its_node_and_the_head_never_sees_an_image(exp, monkeypatch):
    trained = []
    train = LocalTrainer.train

    def spy(self, model, key, round_, primary, replay, epochs, objective=None, compose=None):
        trained.append((round_, key, primary.images.dtype, tuple(primary.images.shape[1:])))
        return train(self, model, key, round_, primary, replay, epochs, objective, *([compose] if compose else []))

    monkeypatch.setattr(LocalTrainer, "train", spy)
    fed = federation(exp)
    replay = REGISTRY.build("fedreplay", {"cut": "stage2"})
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
    replay = REGISTRY.build("fedreplay", {"encoder_node": "node0", "server_node": "node1"})
    replay.setup(fed)
    sent = [(t.sender, t.receiver, t.kind) for t in fed.transport.transfers]
    assert sent == [("node0", "node1", "model"), ("node0", "node2", "model"), ("node0", "node1", "model"),
                    ("node0", "node1", "latents"), ("node2", "node1", "latents")]


def test_an_encoder_node_that_is_not_a_node_is_one_line(cli, exp):
    assert "--encoder-node nodeX is not a node; nodes: node0, node1, node2" in cli.user_error(
        "federate", "--exp", exp, "--strategy", "fedreplay", "--encoder-node", "nodeX", "--rounds", "1")
    assert not (exp / "federate" / "fedreplay").exists()
