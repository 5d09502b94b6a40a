"""SCAFFOLD (Karimireddy et al., 2020) with every node in every round and global step 1 (as in the
paper's experiments and FLamby).

After each local optimiser step the weights also move by -lr (c - c_i), the paper's correction of
the gradient, applied in weight space so that it holds for the Adam every strategy trains with (with
SGD the two are the same step). Option II then gives c_i+ = c_i - c + (x - y_i) / (sum of the local
step sizes), which is K lr for K steps at a constant rate; c is the weighted average of the c_i+ (the
same weights as the models), one more all-reduce: Scaffold moves twice the model each round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fedcli.federate.strategies.averaging import ServerAveraging
from fedcli.federate.strategies.base import Declaration
from fedcli.training.objectives import Objective, Supervised, Wrapped

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation


class Corrected(Wrapped):
    """The base objective; after each optimiser step every parameter also moves by -lr times its correction."""

    def __init__(self, base: Objective, correction: dict[str, torch.Tensor]):
        super().__init__(base)
        self.correction = correction

    def to(self, device: str) -> "Corrected":
        self.correction = {k: v.to(device) for k, v in self.correction.items()}
        return super().to(device)

    def after_step(self, model: nn.Module, lr: float) -> None:
        super().after_step(model, lr)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter.sub_(self.correction[name], alpha=lr)


class Scaffold(ServerAveraging):
    def init_server(self, fed: "Federation") -> None:
        zeros = {k: torch.zeros_like(v.detach()) for k, v in self.global_model.named_parameters()}
        self.control = zeros
        self.node_control = {node: {k: v.clone() for k, v in zeros.items()} for node in fed.local_nodes}
        self.updated: dict[str, dict[str, torch.Tensor]] = {}

    def objective(self, node: str, anchor: dict[str, torch.Tensor]) -> Objective:
        own = self.node_control[node]
        return Corrected(Supervised(), {k: self.control[k] - own[k] for k in own})

    def train_node(self, fed: "Federation", node: str, round_: int, model: nn.Module, epochs: int,
                   anchor: dict[str, torch.Tensor]) -> int:
        steps = super().train_node(fed, node, round_, model, epochs, anchor)
        step_sizes = fed.trainer.settings(node, round_, epochs).lr_sum(steps)
        own, trained = self.node_control[node], dict(model.named_parameters())
        self.updated[node] = {k: own[k] - self.control[k] + (anchor[k] - trained[k].detach()) / step_sizes
                              for k in own}
        return steps

    def merge(self, fed: "Federation", round_: int, averaged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.control = fed.transport.average(round_, self.updated, fed.averaging_weights())
        self.node_control, self.updated = self.updated, {}
        return averaged

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        return super().state() | {"control": self.control} | \
            {f"control:{node}": control for node, control in self.node_control.items()}

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, states)
        self.control = states["control"]
        self.node_control = {node: states[f"control:{node}"] for node in self.node_control}


DECLARED = (
    Declaration("scaffold", "Scaffold: FedAvg with control variates correcting each node's drift",
                lambda o: Scaffold("scaffold", o), model_key="global", transfers=("all-reduce",),
                families=("federated",), semi_supervised=True),
)
