"""FedAvg+Share (Zhao et al. 2018, a baseline of the generative-replay study): FedAvg where every node also
trains on a globally shared set of real images, the partition's (`partition --shared-fraction F`, class-balanced,
set apart from the nodes' training images for every strategy: fedcli/data/shared_set.py).

The shared set travels once, in round 0: each node sends its own images in it (lossless PNG, as buffers travel)
to every other node, so every node holds the same union. Real images leave their hospitals: the report says so.

Budget: E epochs a round, as FedAvg, each over the node's images and the shared set together (the shared images
count: an epoch is |D_k| + |S| images, so a node takes more steps than under FedAvg).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fedcli.data.tensor_source import TensorSource
from fedcli.fl.payloads import decode_buffer, encode_buffer
from fedcli.fl.strategies.averaging import SHARED_STATISTICS, ServerAveraging
from fedcli.fl.strategies.base import Declaration

if TYPE_CHECKING:
    from fedcli.fl.engine import Federation

KIND = "shared-images"
HELD = "shared-set"  # the state key prefix of each node's copy of the union


class SharedDataAveraging(ServerAveraging):
    def setup(self, fed: "Federation", train: bool = True) -> None:
        self.union: dict[str, TensorSource] = {}
        self.joined: dict[str, TensorSource] = {}
        if train:
            self.exchange(fed)
        super().setup(fed, train)

    def exchange(self, fed: "Federation") -> None:
        """Every node's part of the shared set to every other node; each ends with the union, in node order."""
        parts: dict[str, dict[str, TensorSource]] = {node: {} for node in fed.local_nodes}
        for sender in fed.nodes:
            if sender in fed.local_nodes:
                own = fed.data.shared[sender]
                parts[sender][sender] = own
                payload = encode_buffer(own.images, own.labels)
                for receiver in fed.nodes:
                    if receiver != sender:
                        fed.transport.send(0, sender, receiver, KIND, payload)
            for receiver in fed.local_nodes:
                if receiver != sender:
                    data = fed.transport.receive(0, sender, receiver, KIND)
                    parts[receiver][sender] = TensorSource(*decode_buffer(data, fed.data.image_shape,
                                                                          fed.data.num_classes))
        fed.transport.flush()
        self.union = {node: TensorSource.concat([held[n] for n in fed.nodes]) for node, held in parts.items()}

    def sources(self, fed: "Federation", node: str) -> TensorSource:
        """The node's images and the shared set, joined once per run rather than every round."""
        if node not in self.joined:
            self.joined[node] = TensorSource.concat([fed.data.train[node], self.union[node]])
        return self.joined[node]

    def train_node(self, fed: "Federation", node: str, round_: int, model: nn.Module, epochs: int,
                   anchor: dict[str, torch.Tensor]) -> int:
        return fed.trainer.train(model, node, round_, self.sources(fed, node), None, epochs,
                                 self.objective(node, anchor))

    def trained_on(self, fed: "Federation", node: str) -> tuple[TensorSource, TensorSource | None]:
        return self.sources(fed, node), None

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        return super().state() | {f"{HELD}:{node}": {"images": source.images, "labels": source.labels}
                                  for node, source in self.union.items()}

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, states)
        self.union = {node: TensorSource(states[f"{HELD}:{node}"]["images"].cpu(),
                                         states[f"{HELD}:{node}"]["labels"].cpu()) for node in fed.local_nodes}


DECLARED = (
    Declaration("fedavg-share", 31, "FedAvg+Share: FedAvg where every node also trains on a globally shared set of "
                "real images (Zhao et al.)", lambda o: SharedDataAveraging("fedavg-share", o), model_key="global",
                transfers=(KIND, "all-reduce"), families=("federated",), bn_averaged=SHARED_STATISTICS,
                needs_shared_set=True, discloses={KIND: "real training images of the shared set, with labels"}),
)
