"""FedAdagrad, FedAdam, FedYogi (Reddi et al. 2021): the average is a pseudo-gradient for a server
optimiser (federate/strategies/server_optimizers.py) that every node runs alike."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from fedcli.experiment.panels import SERVER
from fedcli.federate.strategies.averaging import ServerAveraging
from fedcli.federate.strategies.base import Declaration, flag, option
from fedcli.federate.strategies.server_optimizers import ServerOptimizer
from fedcli.federate.strategies.server_options import server_lr

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation


def beta1() -> float:
    return option(0.9, 0, 1, help="The server's first-moment decay.")


def tau() -> float:
    return option(1e-3, 0, 10, low_open=True, help="The adaptivity tau, added to the root of the second moment.",
                  why="it keeps the server step finite where the second moment is 0")


@dataclasses.dataclass(frozen=True)
class AdagradOptions:
    server_lr: float = server_lr(1e-2)
    beta1: float = beta1()
    tau: float = tau()


@dataclasses.dataclass(frozen=True)
class YogiOptions(AdagradOptions):
    beta2: float = option(0.99, 0, 1, help="The server's second-moment decay.")


@dataclasses.dataclass(frozen=True)
class AdamOptions(YogiOptions):
    bias_correction: bool = flag(False, "Adam's bias correction of the server step: lr sqrt(1 - beta2^t) / "
                                 "(1 - beta1^t), t = server steps taken, round 0's included (Flower's FedAdam: t = "
                                 "round + 1; Reddi et al.: none).")


class AdaptiveAveraging(ServerAveraging):
    def init_server(self, fed: "Federation") -> None:
        self.optimizer = ServerOptimizer(self.name, self.options)

    def merge(self, fed: "Federation", round_: int, averaged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        current = {k: v.detach() for k, v in self.global_model.named_parameters()}
        return {**averaged, **self.optimizer.step(current, averaged)}

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        return super().state() | self.optimizer.state()

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, states)
        self.optimizer.load_state(states)


DECLARED = tuple(
    Declaration(name, summary, lambda o, name=name: AdaptiveAveraging(name, o), options=options,
                model_key="global", transfers=("all-reduce",), families=("federated",), semi_supervised=True, partial=True,
                panel=SERVER)
    for name, options, summary in (
        ("fedadam", AdamOptions, "FedAdam: Adam on the server, the average as its pseudo-gradient"),
        ("fedyogi", YogiOptions, "FedYogi: Yogi on the server, the average as its pseudo-gradient"),
        ("fedadagrad", AdagradOptions, "FedAdagrad: Adagrad on the server, the average as its pseudo-gradient"),
    ))
