"""FedReplay (Qu et al. 2022, Algorithm 2): one node (`--encoder-node`, default the one with the most training
images) trains the whole classifier on its images in round 0 (init-epochs); its bottom up to `--cut` (the stem
by default: conv1, BN, ReLU and max-pool, the journal version's encoder) is then frozen and sent to every
node; each node encodes its training images once (BatchNorm at its stored statistics) and uploads the
latents with their labels to the server (`--server-node`, default the encoder node), which trains the rest of
the network (the head, from the encoder node's weights) on the union of the latents, E epochs a round. One
upload, no averaging; the head never sees an image. The server publishes encoder + head after each round, to be
tested on every node's test set.

Budget: the encoder node's init-epochs on its images, then R x E epochs of the head over every node's latents
(as the central model's epochs span every node's images). With init-epochs 0 the encoder is the common initial
model, which every node builds alike, so it does not travel.

What travels: the encoder (round 0, to every other node), the head to the server when it is not the encoder
node, and each node's latents once (N x C x H x W x 4 bytes and 8 N for the labels, plus the safetensors
header). Kept for an audit (`shared/latents.safetensors`): the first 256 latents of each node, with labels, the node's
index in the partition's order and each latent's position in that node's training set (`index`).
The server keeps every node's latents in its checkpoint part, so a resumed run does not upload them again.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import nn

from fedcli.data.dataset import to_float
from fedcli.data.tensor_source import TensorSource
from fedcli.fl.local import LatentBatches
from fedcli.fl.payloads import decode_features, decode_model, encode_features, encode_model
from fedcli.fl.strategies.base import Declaration, Strategy
from fedcli.fl.strategies.split_options import Cut, cut, node as node_option, server_node
from fedcli.models.cuts import cut_shape, split

if TYPE_CHECKING:
    from fedcli.fl.engine import Federation

KEY = "global"
LATENTS = "latents"
KEPT_PER_NODE = 256
ENCODE_BATCH = 256


@dataclasses.dataclass(frozen=True)
class ReplayEncoderOptions:
    cut: Cut = cut("stem")
    encoder_node: str | None = node_option("The node that trains the classifier whose bottom becomes FedReplay's "
                                           "frozen, shared encoder (default: the one with the most training images).")
    server_node: str | None = server_node()


class FedReplay(Strategy):
    name = "fedreplay"

    def __init__(self, options: ReplayEncoderOptions):
        self.options = options
        self.latents: TensorSource | None = None  # at the server: every node's, in node order
        self.owners = torch.empty(0, dtype=torch.int64)  # the node index of each latent

    def setup(self, fed: "Federation", train: bool = True) -> None:
        self.model = fed.trainer.new_model(KEY)
        self.encoder, self.head = split(self.model, fed.trainer.model_name, self.options.cut)
        sizes = fed.train_sizes()
        self.encoder_node = self.options.encoder_node or max(fed.nodes, key=lambda n: (sizes[n], -fed.nodes.index(n)))
        self.server = self.options.server_node or self.encoder_node
        self.shape = cut_shape(self.encoder, fed.data.image_shape)
        if not train:
            return
        trained = fed.trainer.init_epochs > 0
        if trained and self.encoder_node in fed.local_nodes:
            fed.trainer.train(self.model, self.encoder_node, 0, fed.data.train[self.encoder_node], None,
                              fed.trainer.init_epochs)
        if trained:
            self.hand_over(fed)
        self.upload(fed)
        if trained:
            self.publish(fed, 0)

    def hand_over(self, fed: "Federation") -> None:
        """The trained encoder to every other node, the head to the server."""
        parts = [(other, self.encoder) for other in fed.nodes if other != self.encoder_node]
        parts += [(self.server, self.head)] if self.server != self.encoder_node else []
        for receiver, part in parts:
            if self.encoder_node in fed.local_nodes:
                fed.transport.send(0, self.encoder_node, receiver, "model", encode_model(part.state_dict()))
            if receiver in fed.local_nodes:
                part.load_state_dict(decode_model(fed.transport.receive(0, self.encoder_node, receiver, "model"),
                                                  part.state_dict()))
        fed.transport.flush()

    def encode(self, fed: "Federation", node: str) -> torch.Tensor:
        """The frozen encoder's output on every training image of `node`, in batches, in eval mode."""
        self.encoder.eval()
        images = fed.data.train[node].images
        with torch.no_grad():
            return torch.cat([self.encoder(to_float(images[i:i + ENCODE_BATCH]).to(fed.trainer.device)).cpu()
                              for i in range(0, len(images), ENCODE_BATCH)] or [torch.empty(0, *self.shape)])

    def upload(self, fed: "Federation") -> None:
        """Every node's latents and labels to the server, once."""
        parts = []
        for node in fed.nodes:
            if node in fed.local_nodes:
                latents = self.encode(fed, node)
                if node == self.server:
                    parts.append((latents, fed.data.train[node].labels))
                else:
                    fed.transport.send(0, node, self.server, LATENTS,
                                       encode_features(latents, fed.data.train[node].labels))
            if self.server in fed.local_nodes and node != self.server:
                data = fed.transport.receive(0, node, self.server, LATENTS)
                parts.append(decode_features(data, "latents", self.shape, fed.data.num_classes))
        fed.transport.flush()
        if self.server in fed.local_nodes:
            self.latents = TensorSource(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
            self.owners = torch.cat([torch.full((len(p[1]),), i, dtype=torch.int64) for i, p in enumerate(parts)])

    def run_round(self, fed: "Federation", round_: int) -> None:
        if self.server in fed.local_nodes:
            fed.trainer.train(self.head, self.server, round_, self.latents, None, fed.trainer.epochs,
                              compose=LatentBatches)
        self.publish(fed, round_)

    def publish(self, fed: "Federation", round_: int) -> None:
        here = self.server in fed.local_nodes
        payload = fed.transport.publish(round_, self.server, encode_model(self.model.state_dict()) if here else None)
        self.model.load_state_dict(decode_model(payload, self.model.state_dict()))

    def models(self) -> dict[str, nn.Module]:
        return {KEY: self.model}

    def kept(self) -> dict[str, dict[str, torch.Tensor]]:
        if self.latents is None:
            return {}
        rows = [torch.nonzero(self.owners == i).flatten()[:KEPT_PER_NODE] for i in range(int(self.owners.max()) + 1)] \
            if len(self.owners) else [self.owners]
        kept = torch.cat(rows)
        return {LATENTS: {"latents": self.latents.images[kept].contiguous(), "labels": self.latents.labels[kept],
                          "node": self.owners[kept], "index": torch.cat([torch.arange(len(r)) for r in rows])}}

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        held = {f"{LATENTS}:{self.server}": {"latents": self.latents.images, "labels": self.latents.labels,
                                             "node": self.owners}} if self.latents is not None else {}
        return super().state() | held

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, {KEY: states[KEY]})
        held = states.get(f"{LATENTS}:{self.server}")
        if held is not None:
            self.latents = TensorSource(held["latents"].cpu(), held["labels"].cpu())
            self.owners = held["node"].cpu()


DECLARED = (
    Declaration("fedreplay", 26, "FedReplay: one node's trained bottom becomes a frozen shared encoder; every node "
                "uploads its latents once and the server trains the head on their union (Qu et al.)",
                lambda o: FedReplay(o), options=ReplayEncoderOptions, model_key=KEY, transfers=("model", LATENTS),
                families=("federated",), published=True,
                discloses={LATENTS: "latents of every training image, with labels"},
                bn_averaged="the encoder node's below the cut (frozen), the union of every node's latents above it "
                "(the server's head)"),
)
