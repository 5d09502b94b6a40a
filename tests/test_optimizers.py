"""The generative-replay study's training settings: --optimizer sgd (momentum, weight decay) and a step
learning-rate schedule over the run's whole budget, which Scaffold's sum of step sizes follows."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedcli.federate.config import FederateConfig
from fedcli.pipeline.runner import federate_key
from fedcli.training.local import LocalSettings
from fedcli.training.settings import Budget


def settings_of(budget: Budget, round_: int, epochs: int, **extra) -> LocalSettings:
    return LocalSettings(epochs=epochs, lr=budget.lr, batch=8, lr_schedule=budget.lr_schedule,
                         span=budget.span(round_, epochs), budget_epochs=budget.total_epochs,
                         lr_step_epochs=budget.lr_step_epochs, lr_step_factor=budget.lr_step_factor, **extra)


def test_the_step_schedule_decays_by_the_factor_every_step_epochs_of_the_whole_budget():
    """Budget 10 + 10 x 10 = 110 epochs, decay x 0.1 every 35: epochs 0-34 at lr, 35-69 at lr/10, 70-104 at
    lr/100, 105-109 at lr/1000, wherever a round's call falls."""
    budget = Budget(epochs=10, init_epochs=10, rounds=10, lr=1e-3, batch=8, lr_schedule="step", lr_step_epochs=35,
                    lr_step_factor=0.1)
    steps_per_epoch = 4

    def lr_of_epoch(epoch: int) -> float:
        round_, within = (0, epoch) if epoch < 10 else ((epoch - 10) // 10 + 1, (epoch - 10) % 10)
        settings = settings_of(budget, round_, 10)
        return settings.lr_at(within * steps_per_epoch, 10 * steps_per_epoch)

    assert [lr_of_epoch(e) for e in (0, 34, 35, 69, 70, 104, 105, 109)] == pytest.approx(
        [1e-3, 1e-3, 1e-4, 1e-4, 1e-5, 1e-5, 1e-6, 1e-6], rel=1e-9)
    third_round = settings_of(budget, 3, 10)  # epochs 30-39: five at lr, five at lr/10
    assert third_round.lr_sum(10 * steps_per_epoch) == pytest.approx(5 * 4 * 1e-3 + 5 * 4 * 1e-4, rel=1e-9)


def test_sgd_takes_its_momentum_and_weight_decay_and_adam_stays_the_default():
    parameters = [torch.nn.Parameter(torch.ones(3))]
    sgd = LocalSettings(epochs=1, lr=0.01, batch=8, optimizer="sgd", sgd_momentum=0.8,
                        weight_decay=1e-4).new_optimizer(parameters)
    assert isinstance(sgd, torch.optim.SGD)
    assert (sgd.defaults["momentum"], sgd.defaults["weight_decay"], sgd.defaults["lr"]) == (0.8, 1e-4, 0.01)
    assert isinstance(LocalSettings(epochs=1, lr=0.01, batch=8).new_optimizer(parameters), torch.optim.Adam)
    parameters[0].grad = torch.tensor([1.0, -2.0, 0.5])
    sgd.step()  # first SGD step with momentum: p - lr (g + wd p)
    expected = 1 - 0.01 * (torch.tensor([1.0, -2.0, 0.5]) + 1e-4)
    assert torch.allclose(parameters[0].detach(), expected)


def test_settings_that_the_run_does_not_use_leave_its_fingerprint_alone(tmp_path):
    base = FederateConfig(exp=tmp_path, strategy=("fedavg",))
    key = federate_key(base)
    assert federate_key(dataclasses.replace(base, sgd_momentum=0.5)) == key  # Adam has no such momentum
    assert federate_key(dataclasses.replace(base, lr_step_epochs=7, lr_step_factor=0.5)) == key  # not the step schedule
    sgd = dataclasses.replace(base, optimizer="sgd")
    assert federate_key(sgd) != key
    assert federate_key(dataclasses.replace(sgd, sgd_momentum=0.5)) != federate_key(sgd)
    step = dataclasses.replace(base, lr_schedule="step")
    assert federate_key(dataclasses.replace(step, lr_step_epochs=7)) != federate_key(step)


def test_options_added_later_leave_existing_fingerprints_and_checkpoints_alone(tmp_path):
    """At the value every earlier run had (Adam, no weight decay, no --ks), a new option is in no fingerprint, so
    fedcli run neither reruns an earlier experiment nor refuses to resume its checkpoint."""
    from fedcli.experiment.config import PartitionConfig
    from fedcli.federate.strategy_runs import computed
    from fedcli.pipeline.runner import plain

    base = FederateConfig(exp=tmp_path, strategy=("fedavg",))
    added = {"optimizer", "weight_decay", "sgd_momentum", "lr_step_epochs", "lr_step_factor"}
    assert not added & federate_key(base).keys()
    assert "ks" not in plain(PartitionConfig(exp=tmp_path))
    assert plain(PartitionConfig(exp=tmp_path, scheme="skew", ks=0.3))["ks"] == 0.3
    resolved = {"lr": 1e-3, "optimizer": "adam", "weight_decay": 0.0, "sgd_momentum": 0.9, "lr_schedule": "cosine",
                "lr_step_epochs": 35, "lr_step_factor": 0.1, "threads": 2, "exp": "x"}
    assert computed(resolved) == {"lr": 1e-3, "lr_schedule": "cosine"}
    assert computed(resolved | {"optimizer": "sgd"})["sgd_momentum"] == 0.9
