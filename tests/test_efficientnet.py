"""EfficientNet-B0 (FedPerl's classifier): built for gray or RGB input with the dataset's classes, its dropout and
stochastic depth keyed by (seed, node, round), so a run does not depend on what drew from torch's global generator
before it (the other engine, a resumed process), and a resumed run equals the uninterrupted one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import Cli, copy_exp
from fedcli.core.errors import UserError
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import load_tensors
from fedcli.federate import engine, stage
from fedcli.federate.config import FederateConfig
from fedcli.models.classifier import build_classifier
from fedcli.models.cuts import check_cut

RUN = dict(model="efficientnet_b0", rounds=2, epochs=1, init_epochs=0, batch=16, bootstrap=10, threads=1,
           steps_per_round=1, eval_every=2)


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    exp = tmp_path_factory.mktemp("efficientnet") / "exp"
    Cli().ok("partition", "--nodes", "2", "--image-size", "16", "--labeled-fraction", "0.1", "--exp", exp)  # small sets
    return exp


def test_it_takes_the_images_channels_and_the_datasets_classes():
    for channels in (1, 3):
        model = build_classifier("efficientnet_b0", channels, 7, init_seed=0)
        assert model(torch.zeros(2, channels, 32, 32)).shape == (2, 7)
        assert any(isinstance(m, nn.Dropout) for m in model.modules())
    assert torch.equal(build_classifier("efficientnet_b0", 1, 7, 3).features[0][0].weight,
                       build_classifier("efficientnet_b0", 1, 7, 3).features[0][0].weight)
    with pytest.raises(UserError, match="efficientnet_b0 has no cut"):
        check_cut("efficientnet_b0", "stem")


def test_its_dropout_is_keyed_whatever_drew_from_the_global_generator_before(exp):
    fed = engine.build(FederateConfig(exp=exp, strategy=("fedavg",), **RUN), Manifest.load(exp), 0)
    node = fed.nodes[0]

    def trained(round_: int, drawn_before: int) -> dict[str, torch.Tensor]:
        torch.rand(drawn_before)  # another process, or this one after other work, stands elsewhere in the stream
        model = fed.trainer.new_model("global")
        fed.trainer.train(model, node, round_, fed.data.train[node], None, 1)
        return model.state_dict()

    first, again, other_round = trained(1, 0), trained(1, 1000), trained(2, 0)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other_round[k]) for k in first if first[k].is_floating_point())
    state = torch.random.get_rng_state()
    trained(1, 0)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator is left where it stood


def test_a_resumed_efficientnet_run_equals_the_uninterrupted_one(exp, tmp_path):
    runs = {}
    for name in ("whole", "resumed"):
        copy = copy_exp(exp, tmp_path / name)
        if name == "resumed":
            def crash(strategy, round_):
                if round_ == 1:
                    raise KeyboardInterrupt

            with pytest.raises(KeyboardInterrupt):
                stage.run(FederateConfig(exp=copy, strategy=("fedavg",), **RUN), after_round=crash)
        stage.run(FederateConfig(exp=copy, strategy=("fedavg",), resume=name == "resumed", **RUN))
        runs[name] = load_tensors(copy / "federate" / "fedavg" / "models" / "global.safetensors", "model")
    assert all(torch.equal(runs["whole"][k], runs["resumed"][k]) for k in runs["whole"])
