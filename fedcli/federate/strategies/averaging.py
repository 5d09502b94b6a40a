"""Averaging: FedAvg (McMahan et al. 2017) and FedBN (Li et al. 2021, BatchNorm stays local).

Round 0 trains the common initial model for init-epochs on every node and averages it (FedER's M^0
budget). Each round every node trains from the global model and the transport averages what the nodes
share, weighted by train size or equally (`--weighting`) and summed exactly (a simulated server in
process, an all-reduce between processes: no server), so every node ends with the same global model.
Subclasses change one hook: the objective a node trains with (`objective`), what happens around a node's
training (`train_node`), or how the average becomes the new global model (`merge`).

FedPerl's scenario 2 (every label held apart at one node, `partition --labeled-nodes none --held-apart-fraction`):
"we use the global data to train the global model" (Bdair et al.): after each average the held-apart set's holder,
the server, trains the global model on it for a round's steps (key `global`) and sends it to every other node
(`server-model`), which is the model every node starts the next round from. Without --ssl the nodes have nothing to
train on, so the server's training alone is the run (the scenario's lower bound).

Kept for an audit (`shared/updates.safetensors`): the first node's update of each round (its trained shared
tensors minus the global ones it started from, what its contribution to the average reveals), the latest
rounds that fit in 64 MiB (every round for the small CNN; for a ResNet-18, about the last 5).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedcli.comm.payloads import decode_model, encode_model
from fedcli.federate.strategies.base import Declaration, Strategy
from fedcli.models.classifier import batchnorm_keys
from fedcli.training.objectives import Objective, Supervised

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation

GLOBAL, SERVER_MODEL = "global", "server-model"
SHARED_STATISTICS = "the average: one set of statistics shared by hospitals that differ"
KEPT_UPDATE_BYTES = 64 * 2**20
UPDATES = "updates"


class ServerAveraging(Strategy):
    def __init__(self, name: str, options: Any = None, local_bn: bool = False):
        self.name, self.options, self.local_bn = name, options, local_bn
        self.global_model: nn.Module | None = None
        self.bn_keys: set[str] = set()
        self.local_state: dict[str, dict[str, torch.Tensor]] = {}  # FedBN: each node's BN tensors
        self.updates: dict[int, dict[str, torch.Tensor]] = {}  # the first node's, by round

    def setup(self, fed: "Federation", train: bool = True) -> None:
        """The common initial model; trained, round 0 is a round of init_epochs (FedER's M^0 budget)."""
        self.first = fed.nodes[0]  # whose updates are kept
        self.global_model = fed.trainer.new_model("global")
        self.bn_keys = batchnorm_keys(self.global_model) if self.local_bn else set()
        bn_state = {k: v.clone() for k, v in self.global_model.state_dict().items() if k in self.bn_keys}
        self.local_state = {node: copy.deepcopy(bn_state) for node in fed.local_nodes} if self.local_bn else {}
        self.init_server(fed)
        if train and fed.trainer.init_epochs:
            self.train_and_average(fed, 0, fed.trainer.init_epochs)

    def shared(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v for k, v in state.items() if k not in self.bn_keys}

    def node_model(self, fed: "Federation", node: str, shared_state: dict[str, torch.Tensor]) -> nn.Module:
        model = fed.trainer.new_model(node)
        model.load_state_dict({**shared_state, **self.local_state.get(node, {})})
        return model

    def run_round(self, fed: "Federation", round_: int) -> None:
        self.train_and_average(fed, round_, fed.trainer.epochs)

    def train_and_average(self, fed: "Federation", round_: int, epochs: int) -> None:
        """Each participating node trains from the global model; the transport averages what they share. A node
        left out of the round (--participation) trains nothing and joins the all-reduce with weight 0, which is
        how it receives the new global model without a server."""
        global_shared = self.shared(self.global_model.state_dict())
        anchor = {k: v.detach().clone() for k, v in self.global_model.named_parameters()}
        participants = fed.participants(round_)
        states = {}
        for node in fed.local_nodes:
            if node not in participants:
                states[node] = global_shared
                continue
            model = self.node_model(fed, node, global_shared)
            self.train_node(fed, node, round_, model, epochs, anchor)
            state = model.state_dict()
            if self.local_bn:
                self.local_state[node] = {k: v.detach().clone() for k, v in state.items() if k in self.bn_keys}
            states[node] = self.shared(state)
            if node == fed.nodes[0]:
                self.keep_update(round_, states[node], global_shared)
        weights = {node: weight if node in participants else 0 for node, weight in fed.averaging_weights().items()}
        if any(weights.values()):  # none: no node had anything to train on (scenario 2 without --ssl)
            averaged = fed.transport.average(round_, states, weights)
            self.global_model.load_state_dict({**self.global_model.state_dict(), **self.merge(fed, round_, averaged)})
        if fed.data.labels_at_server:
            self.train_at_server(fed, round_, epochs)

    def train_at_server(self, fed: "Federation", round_: int, epochs: int) -> None:
        """Scenario 2: the held-apart set's holder trains the global model on it and sends it to every node."""
        server, template = fed.data.held_apart_holder, self.global_model.state_dict()
        if server in fed.local_nodes:
            fed.trainer.train(self.global_model, GLOBAL, round_, fed.data.held_apart(), None, epochs)
            payload = encode_model(self.global_model.state_dict())
            for node in fed.nodes:
                if node != server:
                    fed.transport.send(round_, server, node, SERVER_MODEL, payload)
        else:  # a distributed rank: its one node receives the model
            receiver = fed.local_nodes[0]
            self.global_model.load_state_dict(decode_model(fed.transport.receive(round_, server, receiver,
                                                                                 SERVER_MODEL), template))
        fed.transport.flush()

    def keep_update(self, round_: int, trained: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> None:
        self.updates[round_] = {k: (v - start[k]).detach().cpu().clone() for k, v in trained.items()
                                if v.is_floating_point()}
        while len(self.updates) > 1 and sum(t.numel() * t.element_size() for u in self.updates.values()
                                            for t in u.values()) > KEPT_UPDATE_BYTES:
            del self.updates[min(self.updates)]

    def kept(self) -> dict[str, dict[str, torch.Tensor]]:
        return {UPDATES: flat_updates(self.updates)} if self.updates else {}

    def init_server(self, fed: "Federation") -> None:
        """State kept beside the global model (server optimiser moments, control variates)."""

    def objective(self, node: str, anchor: dict[str, torch.Tensor]) -> Objective:
        """What `node` minimises in a round that started from the global parameters `anchor`."""
        return Supervised()

    def train_node(self, fed: "Federation", node: str, round_: int, model: nn.Module, epochs: int,
                   anchor: dict[str, torch.Tensor]) -> int:
        return fed.trainer.train(model, node, round_, fed.data.train[node], None, epochs, self.objective(node, anchor))

    def merge(self, fed: "Federation", round_: int, averaged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The new global state from the nodes' average: FedAvg takes the average itself."""
        return averaged

    def models(self) -> dict[str, nn.Module]:
        if not self.local_bn:
            return {"global": self.global_model}
        shared = self.shared(self.global_model.state_dict())
        return {node: self._personal(node, shared) for node in self.local_state}

    def _personal(self, node: str, shared: dict[str, torch.Tensor]) -> nn.Module:
        model = copy.deepcopy(self.global_model)
        model.load_state_dict({**shared, **self.local_state[node]})
        return model

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        states = {"global": self.global_model.state_dict()}
        states.update({f"bn:{node}": bn for node, bn in self.local_state.items()})
        if self.updates:
            states[f"{UPDATES}:{self.first}"] = flat_updates(self.updates)
        return states

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        self.setup(fed, train=False)
        self.global_model.load_state_dict(states["global"])
        for node in self.local_state:
            self.local_state[node] = states[f"bn:{node}"]
        self.updates = {}
        for name, tensor in states.get(f"{UPDATES}:{self.first}", {}).items():
            round_, _, key = name.partition("/")
            self.updates.setdefault(int(round_.removeprefix("round")), {})[key] = tensor


def flat_updates(updates: dict[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {f"round{r}/{k}": t for r, update in sorted(updates.items()) for k, t in update.items()}


DECLARED = (
    Declaration("fedavg", "FedAvg: the nodes' models averaged every round", lambda o: ServerAveraging("fedavg", o),
                model_key="global", transfers=("all-reduce", SERVER_MODEL), families=("federated",),
                bn_averaged=SHARED_STATISTICS, semi_supervised=True, partial=True),
    Declaration("fedbn", "FedBN: FedAvg with BatchNorm layers kept local",
                lambda o: ServerAveraging("fedbn", o, local_bn=True), transfers=("all-reduce",),
                families=("federated",), semi_supervised=True, partial=True,
                bn_averaged="the average: local statistics estimated under weights the last average moved"),
)
