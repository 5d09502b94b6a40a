"""Model passing: FedER and its variants (Sun et al.), and cyclic weight transfer.

Before round 1 every node trains its own model for init-epochs (FedER's M^0). Each round every node
sends to its successor on a ring and trains on what it receives from its predecessor:
`feder` (random ring; model and buffer travel; real images replaying the received buffer), `feder-a`
(only buffers travel), `feder-b` (models travel; training on its own buffer replaying the received
one, synthetic images only), `cyclic` (fixed ring, models only, no buffers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from fedcli.comm.payloads import decode_model, encode_model
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.panels import REPLAY
from fedcli.federate.strategies import topology
from fedcli.federate.strategies.base import Declaration, NoOptions, Strategy
from fedcli.federate.strategies.replay_options import ReplayOptions, SyntheticReplayOptions
from fedcli.training.objectives import Supervised

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation

REAL_AND_RECEIVED = "real + received buffer"


class ModelPassing(Strategy):
    def __init__(self, name: str, options: ReplayOptions | NoOptions, models_travel: bool, synthetic_only: bool,
                 ring: str):
        self.name, self.models_travel = name, models_travel
        self.replay_options = options if isinstance(options, ReplayOptions) and options.replay else None
        self.replay = self.replay_options is not None
        self.objective = Supervised(options.lam) if isinstance(options, ReplayOptions) else Supervised()
        self.synthetic_only, self.ring = synthetic_only, ring
        self.node_models: dict[str, nn.Module] = {}
        self.replayed: dict[str, TensorSource | None] = {}  # the buffer each node replayed in the last round

    def primary(self, fed: "Federation", node: str) -> TensorSource:
        return fed.data.buffers[node] if self.synthetic_only else fed.data.train[node]

    def setup(self, fed: "Federation", train: bool = True) -> None:
        for node in fed.local_nodes:
            model = fed.trainer.new_model(node)
            if train:
                fed.trainer.train(model, node, 0, self.primary(fed, node), None, fed.trainer.init_epochs, self.objective)
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
                payload = fed.exchange.payload(sender, self.replay_options.buffer_codec)
                fed.transport.send(round_, sender, successor[sender], "buffer", payload)
        received = {}
        for node in fed.local_nodes:
            model = self.node_models[node]
            if self.models_travel:
                data = fed.transport.receive(round_, predecessor[node], node, "model")
                model = fed.trainer.rebuild(node, decode_model(data, model.state_dict()))
            received[node] = model, fed.exchange.receive(round_, predecessor[node], node) if self.replay else None
        fed.transport.flush()
        for node, (model, replay) in received.items():
            fed.trainer.train(model, node, round_, self.primary(fed, node), replay, fed.trainer.epochs, self.objective)
        self.node_models = {node: model for node, (model, _) in received.items()}
        self.replayed = {node: replay for node, (_, replay) in received.items()}

    def trained_on(self, fed: "Federation", node: str) -> tuple[TensorSource, TensorSource | None]:
        return self.primary(fed, node), self.replayed.get(node)

    def models(self) -> dict[str, nn.Module]:
        return dict(self.node_models)


DECLARED = (
    Declaration("feder", "FedER: models and synthetic buffers travel a random ring; real images replay the "
                "received buffer", lambda o: ModelPassing("feder", o, True, False, "random"),
                options=ReplayOptions, transfers=("model", "buffer"), needs_buffers=True,
                families=("baselines", "convergence", "federated", "variants"), as_trained_on=REAL_AND_RECEIVED,
                semi_supervised=True, panel=REPLAY),
    Declaration("feder-a", "FedER-A: only buffers travel; each node keeps its own model",
                lambda o: ModelPassing("feder-a", o, False, False, "random"), options=ReplayOptions,
                transfers=("buffer",), needs_buffers=True, own_architectures=True, families=("variants",),
                as_trained_on=REAL_AND_RECEIVED, semi_supervised=True, panel=REPLAY),
    Declaration("feder-b", "FedER-B: models travel; training on synthetic images only (own and received "
                "buffer)", lambda o: ModelPassing("feder-b", o, True, True, "random"), options=SyntheticReplayOptions,
                transfers=("model", "buffer"), needs_buffers=True, families=("variants",),
                as_trained_on="own + received buffer", panel=REPLAY),
    Declaration("cyclic", "cyclic weight transfer: models travel a fixed ring, no buffers",
                lambda o: ModelPassing("cyclic", o, True, False, "fixed"), transfers=("model",), semi_supervised=True,
                panel=REPLAY),
)
