"""FedAvgM: FedAvg at momentum 0 and server lr 1; its server momentum by hand across a resume."""

from __future__ import annotations

import pytest
import torch

from conftest import copy_exp
from fedcli.comm.transport import InProcessTransport
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import load_tensors
from fedcli.federate import engine, stage
from fedcli.federate.config import FederateConfig

FAST = ["--rounds", "2", "--epochs", "1", "--bootstrap", "20", "--threads", "1"]
CHEAP = ["--init-epochs", "0", "--batch", "64"]  # two averages (rounds 1 and 2) show the identity as well as three


@pytest.fixture(scope="module")
def exp(gan3_exp):
    return gan3_exp


def global_model(exp, name):
    return load_tensors(exp / "federate" / name / "models" / "global.safetensors", "model")


def test_fedavgm_with_momentum_0_and_server_lr_1_is_fedavg_weight_for_weight(cli, exp, tmp_path):
    work = copy_exp(exp, tmp_path)
    cli.ok("federate", "--exp", work, "--strategy", "fedavg", "--strategy", "fedavgm", "--server-momentum", "0",
           *FAST, *CHEAP)
    fedavg, fedavgm = global_model(work, "fedavg"), global_model(work, "fedavgm")
    assert fedavg.keys() == fedavgm.keys() and all(torch.equal(fedavg[k], fedavgm[k]) for k in fedavg)
    cli.ok("federate", "--exp", work, "--strategy", "fedavgm", "--overwrite", *FAST, *CHEAP)  # default momentum 0.9
    moved = global_model(work, "fedavgm")
    assert not all(torch.equal(fedavg[k], moved[k]) for k in fedavg)


def test_momentum_0_9_over_3_rounds_across_a_resume_equals_a_hand_computation(exp, tmp_path, monkeypatch):
    work = copy_exp(exp, tmp_path)
    averages = []  # every all-reduced average of the run, in order: rounds 0 (init-epochs), 1, 2, 3
    average = InProcessTransport.average

    def recorded(self, round_, states, weights):
        result = average(self, round_, states, weights)
        averages.append({k: v.clone() for k, v in result.items()})
        return result

    monkeypatch.setattr(InProcessTransport, "average", recorded)
    cfg = dict(exp=work, strategy=("fedavgm",), rounds=3, epochs=1, bootstrap=20, threads=1, server_momentum=0.9,
               server_lr=0.7)

    def crash(strategy, round_):
        if round_ == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stage.run(FederateConfig(**cfg), after_round=crash)
    stage.run(FederateConfig(**cfg, resume=True))
    assert len(averages) == 4

    manifest = Manifest.load(work)
    w = {k: v.detach().double() for k, v in
         engine.build(FederateConfig(**cfg), manifest, manifest["seed"]).trainer.new_model("global").named_parameters()}
    v = {k: torch.zeros_like(t) for k, t in w.items()}
    for avg in averages:
        for k in w:
            v[k] = 0.9 * v[k] + (w[k] - avg[k].double())
            w[k] = (w[k] - 0.7 * v[k]).float().double()  # the global model is stored in float32
    final = global_model(work, "fedavgm")
    assert all(torch.allclose(final[k].double(), w[k], rtol=0, atol=1e-6) for k in w)
    assert any((w[k] - averages[-1][k].double()).abs().max() > 1e-3 for k in w)  # momentum moved it off the average
    buffers = set(final) - set(w)
    assert buffers and all(torch.equal(final[k], averages[-1][k]) for k in buffers)  # BatchNorm statistics: averaged
