"""FedAvgM (Hsu et al. 2019): FedAvg with momentum on the server's step, as Flower's `FedAvgM`.

Each round the nodes' weighted average gives the pseudo-gradient g = w - avg; the server keeps a
momentum v <- beta v + g (v = g at the first step: v starts at 0) and steps w <- w - eta v. With beta 0
and eta 1 this is FedAvg. The first step is round 0's average (the common initial model's, as for every
averaging strategy here). As fedcli's adaptive strategies and unlike Flower's (which steps every tensor
of the state), only trainable parameters take the step: BatchNorm's running statistics, which no gradient
moves, are averaged. Every node holds v (float64, so that beta 0 and eta 1 give the average exactly) and
takes the same step from the same all-reduced average: there is no server.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from fedcli.experiment.panels import SERVER
from fedcli.federate.strategies.averaging import SHARED_STATISTICS, ServerAveraging
from fedcli.federate.strategies.base import Declaration, option
from fedcli.federate.strategies.server_options import server_lr

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation


@dataclasses.dataclass(frozen=True)
class MomentumOptions:
    server_lr: float = server_lr(1.0)
    server_momentum: float = option(0.9, 0, 1, high_open=True, help="Server momentum beta on the averaged update "
                                    "(Hsu et al.'s 0.9; 0 with --server-lr 1 is FedAvg).")


class FedAvgM(ServerAveraging):
    def init_server(self, fed: "Federation") -> None:
        self.velocity: dict[str, torch.Tensor] = {}

    def merge(self, fed: "Federation", round_: int, averaged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        lr, beta = self.options.server_lr, self.options.server_momentum
        stepped = {}
        for name, parameter in self.global_model.named_parameters():
            start = parameter.detach().double()
            velocity = beta * self.velocity.get(name, torch.zeros_like(start)) + (start - averaged[name].double())
            self.velocity[name] = velocity
            stepped[name] = (start - lr * velocity).to(parameter.dtype)
        return {**averaged, **stepped}

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        return super().state() | {"server-velocity": dict(self.velocity)}

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, states)
        self.velocity = dict(states.get("server-velocity", {}))


DECLARED = (
    Declaration("fedavgm", "FedAvgM: FedAvg with server momentum on the averaged update",
                lambda o: FedAvgM("fedavgm", o), options=MomentumOptions, model_key="global",
                transfers=("all-reduce",), families=("federated",), bn_averaged=SHARED_STATISTICS,
                semi_supervised=True, partial=True, panel=SERVER),
)
