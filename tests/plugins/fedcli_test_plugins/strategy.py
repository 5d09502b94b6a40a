"""A strategy plugin: FedAvg with a global step size. Each round the server moves the global model a fraction
eta of the way to the nodes' average, w <- w - eta (w - avg), in float64 as FedAvgM does (which it equals at
momentum 0); eta 1 is FedAvg. Only trainable parameters step: BatchNorm's statistics are averaged."""

from __future__ import annotations

import dataclasses

from fedcli.experiment.panels import SERVER
from fedcli.federate.strategies.averaging import SHARED_STATISTICS, ServerAveraging
from fedcli.federate.strategies.base import Declaration
from fedcli.federate.strategies.server_options import server_lr


@dataclasses.dataclass(frozen=True)
class StepOptions:
    server_lr: float = server_lr(0.8)  # the built-in option of that name: one meaning, its own default


class FedAvgStep(ServerAveraging):
    def merge(self, fed, round_, averaged):
        eta = self.options.server_lr
        stepped = {name: (p.detach().double() - eta * (p.detach().double() - averaged[name].double())).to(p.dtype)
                   for name, p in self.global_model.named_parameters()}
        return {**averaged, **stepped}


DECLARED = (
    Declaration("fedavg-step", "FedAvg-step: FedAvg with a global step size (a plugin)",
                lambda o: FedAvgStep("fedavg-step", o), options=StepOptions, model_key="global",
                transfers=("all-reduce",), families=("federated",), bn_averaged=SHARED_STATISTICS,
                semi_supervised=True, partial=True, panel=SERVER),
)
