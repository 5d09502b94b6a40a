"""Federated strategies: what each node sends, how it merges what it receives, how it trains.

Every strategy has rounds 0..R: round 0 is the state before the first exchange, each later round
one exchange plus E local epochs. Every model or buffer that moves goes through the transport as
safetensors bytes and is rebuilt and validated by the receiver, so no tensor storage is shared.

- Model passing: `feder` (random ring, models and buffers travel, local training on private
  data replaying the received buffer), `feder-a` (only buffers travel), `feder-b` (models travel,
  training on synthetic data only: own buffer plus received buffer), `cyclic` (fixed ring, no
  buffers). Before round 1 every node trains its own model for `init_epochs`.
- Averaging: `fedavg`, `fedprox` (proximal term mu), `fedbn` (BatchNorm stays local), `fedadam`,
  `fedyogi`, `fedadagrad` (a server optimiser on the average), `scaffold` (control variates). Round 0 trains
  the common initial model for `init_epochs` on every node and averages it; the transport averages,
  weighted by train size or equally (`--weighting`) and summed exactly (a simulated server in
  process, an all-reduce between processes: no server).
- Pooled: `standalone` (each node alone), `central` (real train data pooled), `central-synthetic`
  (buffers pooled), `central-mixed` (both).

Equal budget: every strategy takes init_epochs + R x E epochs of optimiser steps over each node's
real images (FedER's replayed images ride in the same steps; FedER-B's steps are on synthetic ones).
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedcli.fl import topology
from fedcli.data.tensor_source import TensorSource
from fedcli.fl.payloads import decode_model, encode_model
from fedcli.fl.server_optimizers import ServerOptimizer, ServerSettings
from fedcli.models.classifier import batchnorm_keys

if TYPE_CHECKING:
    from fedcli.fl.engine import Federation

STRATEGIES = ("feder", "feder-a", "feder-b", "cyclic", "fedavg", "fedprox", "fedbn", "fedadam", "fedyogi",
              "fedadagrad", "scaffold", "standalone", "central", "central-synthetic", "central-mixed")
NEEDS_BUFFERS = {"feder", "feder-a", "feder-b", "central-synthetic", "central-mixed"}
SHARED_MODELS = ("global", "central")  # model keys of strategies whose every node uses one model
POOLED = ("central", "central-synthetic", "central-mixed")  # need every node's data in one place


class Strategy(abc.ABC):
    """The hooks the engine calls; every strategy below implements the three abstract ones."""

    name: str

    @abc.abstractmethod
    def setup(self, fed: "Federation", train: bool = True) -> None:
        """Initial models (round 0); `train=False` only builds them, for a resumed run."""

    @abc.abstractmethod
    def run_round(self, fed: "Federation", round_: int) -> None:
        """One exchange and E local epochs."""

    @abc.abstractmethod
    def models(self) -> dict[str, nn.Module]:
        """The models to evaluate, by `model_node` (a node name, `global` or `central`)."""

    def trained_on(self, fed: "Federation", node: str) -> tuple[TensorSource, TensorSource | None]:
        """The primary and replay sources `node` trained on in the last round (the BatchNorm diagnostic's
        as-trained batches)."""
        return fed.train[node], None

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        return {key: model.state_dict() for key, model in self.models().items()}

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        self.setup(fed, train=False)
        for key, model in self.models().items():
            model.load_state_dict(states[key])


def rebuild(fed: "Federation", key: str, state: dict[str, torch.Tensor]) -> nn.Module:
    model = fed.new_model(key)
    model.load_state_dict(state)
    return model


class ModelPassing(Strategy):
    def __init__(self, name: str, models_travel: bool, replay: bool, synthetic_only: bool, ring: str):
        self.name, self.models_travel, self.replay = name, models_travel, replay
        self.synthetic_only, self.ring = synthetic_only, ring
        self.node_models: dict[str, nn.Module] = {}
        self.replayed: dict[str, TensorSource | None] = {}  # the buffer each node replayed in the last round

    def primary(self, fed: "Federation", node: str) -> TensorSource:
        return fed.buffers[node] if self.synthetic_only else fed.train[node]

    def setup(self, fed: "Federation", train: bool = True) -> None:
        for node in fed.local_nodes:
            model = fed.new_model(node)
            if train:
                fed.train_local(model, node, 0, self.primary(fed, node), None, epochs=fed.init_epochs)
            self.node_models[node] = model

    def run_round(self, fed: "Federation", round_: int) -> None:
        """Every node sends to its successor, then receives from its predecessor and trains."""
        successor = (topology.random_ring(fed.nodes, fed.seed, round_) if self.ring == "random"
                     else topology.fixed_ring(fed.nodes))
        predecessor = topology.predecessors(successor)
        for sender in fed.local_nodes:
            if self.models_travel:
                fed.transport.send(round_, sender, successor[sender], "model",
                                   encode_model(self.node_models[sender].state_dict()))
            if self.replay:
                fed.transport.send(round_, sender, successor[sender], "buffer", fed.buffer_payload(sender))
        received = {}
        for node in fed.local_nodes:
            model = self.node_models[node]
            if self.models_travel:
                data = fed.transport.receive(round_, predecessor[node], node, "model")
                model = rebuild(fed, node, decode_model(data, model.state_dict()))
            received[node] = model, fed.receive_buffer(round_, predecessor[node], node) if self.replay else None
        fed.transport.flush()
        for node, (model, replay) in received.items():
            fed.train_local(model, node, round_, self.primary(fed, node), replay, epochs=fed.epochs)
        self.node_models = {node: model for node, (model, _) in received.items()}
        self.replayed = {node: replay for node, (_, replay) in received.items()}

    def trained_on(self, fed: "Federation", node: str) -> tuple[TensorSource, TensorSource | None]:
        return self.primary(fed, node), self.replayed.get(node)

    def models(self) -> dict[str, nn.Module]:
        return dict(self.node_models)


class ServerAveraging(Strategy):
    def __init__(self, name: str, mu: float = 0.0, local_bn: bool = False):
        self.name, self.mu, self.local_bn = name, mu, local_bn
        self.global_model: nn.Module | None = None
        self.bn_keys: set[str] = set()
        self.local_state: dict[str, dict[str, torch.Tensor]] = {}  # FedBN: each node's BN tensors

    def setup(self, fed: "Federation", train: bool = True) -> None:
        """The common initial model; trained, round 0 is a round of init_epochs (FedER's M^0 budget)."""
        self.global_model = fed.new_model("global")
        self.bn_keys = batchnorm_keys(self.global_model) if self.local_bn else set()
        bn_state = {k: v.clone() for k, v in self.global_model.state_dict().items() if k in self.bn_keys}
        self.local_state = {node: copy.deepcopy(bn_state) for node in fed.local_nodes} if self.local_bn else {}
        self.init_server(fed)
        if train and fed.init_epochs:
            self.train_and_average(fed, 0, fed.init_epochs)

    def shared(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v for k, v in state.items() if k not in self.bn_keys}

    def node_model(self, fed: "Federation", node: str, shared_state: dict[str, torch.Tensor]) -> nn.Module:
        model = fed.new_model(node)
        model.load_state_dict({**shared_state, **self.local_state.get(node, {})})
        return model

    def run_round(self, fed: "Federation", round_: int) -> None:
        self.train_and_average(fed, round_, fed.epochs)

    def train_and_average(self, fed: "Federation", round_: int, epochs: int) -> None:
        """Each node trains from the global model; the transport averages what they share (a server in
        process, an all-reduce across processes), so every node ends with the same global model."""
        global_shared = self.shared(self.global_model.state_dict())
        anchor = {k: v.detach().clone() for k, v in self.global_model.named_parameters()}
        states = {}
        for node in fed.local_nodes:
            model = self.node_model(fed, node, global_shared)
            self.train_node(fed, node, round_, model, epochs, anchor)
            state = model.state_dict()
            if self.local_bn:
                self.local_state[node] = {k: v.detach().clone() for k, v in state.items() if k in self.bn_keys}
            states[node] = self.shared(state)
        averaged = fed.transport.average(round_, states, fed.averaging_weights())
        self.global_model.load_state_dict({**self.global_model.state_dict(), **self.merge(fed, round_, averaged)})

    def init_server(self, fed: "Federation") -> None:
        """State kept beside the global model (server optimiser moments, control variates)."""

    def train_node(self, fed: "Federation", node: str, round_: int, model: nn.Module, epochs: int,
                   anchor: dict[str, torch.Tensor]) -> None:
        fed.train_local(model, node, round_, fed.train[node], None, epochs=epochs, anchor=anchor, mu=self.mu)

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
        return states

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        self.setup(fed, train=False)
        self.global_model.load_state_dict(states["global"])
        for node in self.local_state:
            self.local_state[node] = states[f"bn:{node}"]


class AdaptiveAveraging(ServerAveraging):
    """FedAdagrad, FedAdam, FedYogi: the average is a pseudo-gradient for a server optimiser
    (fl/server_optimizers.py) that every node runs alike."""

    def __init__(self, name: str, settings: ServerSettings):
        super().__init__(name)
        self.settings = settings

    def init_server(self, fed: "Federation") -> None:
        self.optimizer = ServerOptimizer(self.name, self.settings)

    def merge(self, fed: "Federation", round_: int, averaged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        current = {k: v.detach() for k, v in self.global_model.named_parameters()}
        return {**averaged, **self.optimizer.step(current, averaged)}

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        return super().state() | self.optimizer.state()

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, states)
        self.optimizer.load_state(states)


class Scaffold(ServerAveraging):
    """SCAFFOLD (Karimireddy et al., 2020) with every node in every round and global step 1 (as in the
    paper's experiments and FLamby). After each local optimiser step the weights also move by
    -lr (c - c_i), the paper's correction of the gradient, applied in weight space so that it holds
    for the Adam every strategy trains with (with SGD the two are the same step). Option II then
    gives c_i+ = c_i - c + (x - y_i) / (sum of the local step sizes), which is K lr for K steps at a
    constant rate; c is the weighted average of the c_i+ (the same weights as the models), one more
    all-reduce: Scaffold moves twice the model each round."""

    def init_server(self, fed: "Federation") -> None:
        zeros = {k: torch.zeros_like(v.detach()) for k, v in self.global_model.named_parameters()}
        self.control = zeros
        self.node_control = {node: {k: v.clone() for k, v in zeros.items()} for node in fed.local_nodes}
        self.updated: dict[str, dict[str, torch.Tensor]] = {}

    def train_node(self, fed: "Federation", node: str, round_: int, model: nn.Module, epochs: int,
                   anchor: dict[str, torch.Tensor]) -> None:
        own = self.node_control[node]
        correction = {k: self.control[k] - own[k] for k in own}
        steps = fed.train_local(model, node, round_, fed.train[node], None, epochs=epochs, correction=correction)
        step_sizes = fed.local_settings(node, round_, epochs).lr_sum(steps)
        trained = dict(model.named_parameters())
        self.updated[node] = {k: own[k] - self.control[k] + (anchor[k] - trained[k].detach()) / step_sizes
                              for k in own}

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


@dataclasses.dataclass
class Pooled(Strategy):
    name: str
    real: bool
    synthetic: bool
    per_node: bool

    def __post_init__(self):
        self.trained: dict[str, nn.Module] = {}

    def sources(self, fed: "Federation") -> dict[str, TensorSource]:
        if self.per_node:
            return {node: fed.train[node] for node in fed.local_nodes}
        parts = ([fed.train[n] for n in fed.nodes] if self.real else []) + \
                ([fed.buffers[n] for n in fed.nodes] if self.synthetic else [])
        return {"central": TensorSource.concat(parts)}

    def setup(self, fed: "Federation", train: bool = True) -> None:
        self.data = self.sources(fed)
        for key, source in self.data.items():
            model = fed.new_model(key)
            if train:
                fed.train_local(model, key, 0, source, None, epochs=fed.init_epochs)
            self.trained[key] = model

    def run_round(self, fed: "Federation", round_: int) -> None:
        for key, model in self.trained.items():
            fed.train_local(model, key, round_, self.data[key], None, epochs=fed.epochs)

    def trained_on(self, fed: "Federation", node: str) -> tuple[TensorSource, TensorSource | None]:
        return self.data[node if self.per_node else "central"], None

    def models(self) -> dict[str, nn.Module]:
        return dict(self.trained)


def make_strategy(name: str, mu: float, buffer_size: int, server: ServerSettings = ServerSettings()) -> Strategy:
    replay = buffer_size > 0
    return {
        "feder": lambda: ModelPassing(name, models_travel=True, replay=replay, synthetic_only=False, ring="random"),
        "feder-a": lambda: ModelPassing(name, models_travel=False, replay=replay, synthetic_only=False,
                                        ring="random"),
        "feder-b": lambda: ModelPassing(name, models_travel=True, replay=replay, synthetic_only=True, ring="random"),
        "cyclic": lambda: ModelPassing(name, models_travel=True, replay=False, synthetic_only=False, ring="fixed"),
        "fedavg": lambda: ServerAveraging(name),
        "fedprox": lambda: ServerAveraging(name, mu=mu),
        "fedbn": lambda: ServerAveraging(name, local_bn=True),
        "fedadam": lambda: AdaptiveAveraging(name, server),
        "fedyogi": lambda: AdaptiveAveraging(name, server),
        "fedadagrad": lambda: AdaptiveAveraging(name, server),
        "scaffold": lambda: Scaffold(name),
        "standalone": lambda: Pooled(name, real=True, synthetic=False, per_node=True),
        "central": lambda: Pooled(name, real=True, synthetic=False, per_node=False),
        "central-synthetic": lambda: Pooled(name, real=False, synthetic=True, per_node=False),
        "central-mixed": lambda: Pooled(name, real=True, synthetic=True, per_node=False),
    }[name]()
