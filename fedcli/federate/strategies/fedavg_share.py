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

from fedcli.comm.payloads import decode_buffer, encode_buffer
from fedcli.data.tensor_source import TensorSource
from fedcli.federate.strategies.averaging import SHARED_STATISTICS, ServerAveraging
from fedcli.federate.strategies.base import Declaration
from fedcli.federate.strategies.union import TrainsOnUnion, all_to_all

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation

KIND = "shared-images"


class SharedDataAveraging(TrainsOnUnion, ServerAveraging):
    def setup(self, fed: "Federation", train: bool = True) -> None:
        self.union: dict[str, TensorSource] = {}
        self.joined: dict[str, TensorSource] = {}
        if train:
            self.union = self.exchange(fed)
        super().setup(fed, train)

    def exchange(self, fed: "Federation") -> dict[str, TensorSource]:
        """Every node's part of the shared set to every other node; each ends with the union, in node order."""
        return all_to_all(fed, KIND, lambda node: fed.data.shared[node],
                          lambda node: encode_buffer(fed.data.shared[node].images, fed.data.shared[node].labels),
                          lambda node, sender, data: TensorSource(*decode_buffer(data, fed.data.image_shape,
                                                                                 fed.data.num_classes)))

    def train_node(self, fed: "Federation", node: str, round_: int, model: nn.Module, epochs: int,
                   anchor: dict[str, torch.Tensor]) -> int:
        return fed.trainer.train(model, node, round_, self.sources(fed, node), None, epochs,
                                 self.objective(node, anchor))


DECLARED = (
    Declaration("fedavg-share", "FedAvg+Share: FedAvg where every node also trains on a globally shared set of "
                "real images (Zhao et al.)", lambda o: SharedDataAveraging("fedavg-share", o), model_key="global",
                transfers=(KIND, "all-reduce"), families=("federated",), bn_averaged=SHARED_STATISTICS,
                needs_shared_set=True, discloses={KIND: "real training images of the shared set, with labels"}),
)
