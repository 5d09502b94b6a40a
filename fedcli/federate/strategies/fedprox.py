"""FedProx (Li et al. 2020): FedAvg whose local objective adds (mu / 2) ||w - w_global||^2."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from fedcli.experiment.panels import SERVER
from fedcli.federate.strategies.averaging import SERVER_MODEL, SHARED_STATISTICS, ServerAveraging
from fedcli.federate.strategies.base import Declaration, option
from fedcli.training.objectives import Batch, Objective, Supervised, Wrapped


@dataclasses.dataclass(frozen=True)
class ProxOptions:
    mu: float = option(0.01, 0, 1000, help="FedProx proximal weight.", select=True)


class Proximal(Wrapped):
    """The base loss plus (mu / 2) ||w - anchor||^2 over the trainable parameters; nothing at mu 0."""

    def __init__(self, base: Objective, anchor: dict[str, torch.Tensor], mu: float):
        super().__init__(base)
        self.anchor, self.mu = anchor, mu

    def to(self, device: str) -> "Proximal":
        self.anchor = {k: v.to(device) for k, v in self.anchor.items()}
        return super().to(device)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        loss = super().loss(model, batch)
        return loss + proximal_term(model, self.anchor, self.mu) if self.mu > 0 else loss


def proximal_term(model: nn.Module, anchor: dict[str, torch.Tensor], mu: float) -> torch.Tensor:
    return (mu / 2) * sum((p - anchor[name]).square().sum() for name, p in model.named_parameters())


class FedProx(ServerAveraging):
    def objective(self, node: str, anchor: dict[str, torch.Tensor]) -> Objective:
        return Proximal(Supervised(), anchor, self.options.mu)


DECLARED = (
    Declaration("fedprox", "FedProx: FedAvg with a proximal term towards the global model",
                lambda o: FedProx("fedprox", o), options=ProxOptions, model_key="global",
                transfers=("all-reduce", SERVER_MODEL), families=("federated",), bn_averaged=SHARED_STATISTICS, semi_supervised=True, partial=True,
                panel=SERVER),
)
