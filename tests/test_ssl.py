"""`federate --ssl fixmatch` on a few-labels partition: each node's steps join mu unlabelled images per labelled
one, a strategy's own terms wrap FixMatch, SSFL resumes to the same numbers (and runs distributed to them:
tests/test_peer_learning.py), every epoch is --steps-per-round batches, and what cannot take it is refused in one
line."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import Cli, copy_exp
from fedcli.core.rng import torch_stream
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.config import to_json
from fedcli.federate import stage
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies.fedprox import Proximal
from fedcli.pipeline.runner import federate_key
from fedcli.training.fixmatch import FixMatch, FixMatchSettings, with_fixmatch
from fedcli.training.local import Batches, LocalSettings
from fedcli.training.objectives import Supervised

RUN = dict(rounds=2, epochs=1, init_epochs=0, batch=8, bootstrap=10, threads=1, ssl="fixmatch", unlabeled_ratio=2,
           steps_per_round=4)


@pytest.fixture(scope="module")
def few(tmp_path_factory):
    exp = tmp_path_factory.mktemp("ssl") / "exp"
    Cli().ok("partition", "--nodes", "3", "--image-size", "16", "--labeled-fraction", "0.1", "--exp", exp)
    return exp


@pytest.fixture(scope="module")
def ssfl(few, tmp_path_factory):
    exp = copy_exp(few, tmp_path_factory.mktemp("ssfl"))
    stage.run(FederateConfig(exp=exp, strategy=("fedavg",), **RUN))
    return exp


def test_each_step_joins_mu_unlabelled_images_per_labelled_one(few, tmp_path, monkeypatch):
    exp = copy_exp(few, tmp_path)
    seen = []
    original = FixMatch.loss

    def recording(self, model, batch):
        seen.append((batch.n_primary, len(batch.weak), len(batch.strong), self.settings))
        return original(self, model, batch)

    monkeypatch.setattr(FixMatch, "loss", recording)
    stage.run(FederateConfig(exp=exp, strategy=("standalone",), **{**RUN, "rounds": 1, "confidence": 0.8}))
    assert seen and all(weak == strong == 2 * n for n, weak, strong, _ in seen)
    assert {s for *_, s in seen} == {FixMatchSettings(confidence=0.8, lambda_u=1.0)}


def test_a_strategys_own_terms_wrap_fixmatch():
    anchor = {"w": torch.zeros(1)}
    prox = Proximal(Supervised(0.3), anchor, 0.01)
    semi = with_fixmatch(prox, FixMatchSettings(confidence=0.9))
    assert isinstance(semi, Proximal) and semi.mu == 0.01 and semi.anchor is anchor
    assert isinstance(semi.base, FixMatch) and semi.base.settings == FixMatchSettings(confidence=0.9, lam=0.3)
    assert isinstance(prox.base, Supervised)  # the strategy's objective is left as it was


def test_ssfl_resumes_after_round_1_to_the_same_numbers(ssfl, few, tmp_path):
    exp = copy_exp(few, tmp_path)

    def crash(strategy, round_):
        if round_ == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stage.run(FederateConfig(exp=exp, strategy=("fedavg",), **RUN), after_round=crash)
    stage.run(FederateConfig(exp=exp, strategy=("fedavg",), resume=True, **RUN))
    for file in ("metrics.csv", "models/global.safetensors"):
        assert (exp / "federate" / "fedavg" / file).read_bytes() == (ssfl / "federate" / "fedavg" / file).read_bytes()


def test_fixmatch_changes_what_ssfl_learns(ssfl, few, tmp_path):
    exp = copy_exp(few, tmp_path)
    stage.run(FederateConfig(exp=exp, strategy=("fedavg",), **{**RUN, "ssl": "none"}))
    assert (exp / "federate" / "fedavg" / "models" / "global.safetensors").read_bytes() != \
        (ssfl / "federate" / "fedavg" / "models" / "global.safetensors").read_bytes()


def test_every_epoch_is_steps_per_round_batches_whatever_the_sources_size():
    source = TensorSource(torch.zeros(5, 1, 4, 4, dtype=torch.uint8), torch.zeros(5, dtype=torch.long))
    for epochs, steps in ((1, 7), (2, 3)):
        settings = LocalSettings(epochs=epochs, lr=0.1, batch=4, steps_per_round=steps)
        batches = list(Batches(source, None, settings, torch_stream(0, "steps")))
        assert len(batches) == epochs * steps and all(len(b.labels) == 4 for b in batches)


def test_the_new_options_leave_a_runs_fingerprint_unchanged_until_used(tmp_path):
    from fedcli.federate.strategy_runs import computed

    base = FederateConfig(exp=tmp_path, strategy=("fedavg",))
    new = {"ssl", "steps_per_round", "confidence", "lambda_u", "unlabeled_ratio"}
    assert not new & set(federate_key(base))  # a run made before they existed keeps its key
    assert not new & set(computed(to_json(base)))  # and its checkpoints
    assert federate_key(dataclasses.replace(base, confidence=0.5, lambda_u=0.5)) == federate_key(base)
    assert federate_key(dataclasses.replace(base, steps_per_round=5)) != federate_key(base)
    semi = dataclasses.replace(base, ssl="fixmatch")
    assert federate_key(semi) != federate_key(base)
    assert federate_key(dataclasses.replace(semi, confidence=0.5)) != federate_key(semi)


def test_the_strategies_terms_run_with_fixmatch_and_steps_per_round(few, tmp_path):
    exp = copy_exp(few, tmp_path)
    steps = []
    original = FixMatch.loss

    def counting(self, model, batch):
        steps.append(1)
        return original(self, model, batch)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(FixMatch, "loss", counting)
        stage.run(FederateConfig(exp=exp, strategy=("fedprox", "scaffold", "cwt"),
                                 **{**RUN, "rounds": 1, "steps_per_round": 2}))
    # fedprox and scaffold: 3 nodes x 2 steps; cwt: one model visiting 3 nodes x 2 steps
    assert len(steps) == 3 * 2 * 3
    for name in ("fedprox", "scaffold", "cwt"):
        assert (exp / "federate" / name / "metrics.csv").is_file()


@pytest.mark.parametrize("args, says", [
    (["--strategy", "central", "--ssl", "fixmatch"], "which central does not train on"),
    (["--strategy", "fedavg", "--ssl", "fixmatch", "--fold", "0"], "select without folds on a few-labels partition"),
])
def test_what_cannot_take_fixmatch_is_refused_in_one_line(few, cli, args, says):
    assert says in cli.user_error("federate", "--exp", few, *args, "--rounds", "1", "--threads", "1")


def test_fixmatch_on_a_fully_labelled_partition_is_refused_in_one_line(cli, tmp_path):
    exp = tmp_path / "full"
    cli.ok("partition", "--nodes", "3", "--image-size", "16", "--exp", exp)
    assert "this partition labels every training image" in cli.user_error(
        "federate", "--exp", exp, "--strategy", "fedavg", "--ssl", "fixmatch", "--rounds", "1", "--threads", "1")
