"""SplitNN in its peer-to-peer mode (Vepakomma et al. 2018), as the generative-replay study (Qu et al. 2022)
runs it: the network is cut (at the stem by default, the study's conv1); the nodes take turns in a fixed order
(the partition's), each training the bottom with the server's top batch by batch (training/split.py), then
passing the bottom's weights to the next node; the top stays at the server. A round is one cycle, as CWT's.

The server is a node (`--server-node`, default the last in the order, which then holds the whole model after a
cycle): it sees every node's activations and labels. Otherwise the last node sends it the bottom after each
cycle, only so that the whole model can be tested (an `eval` transfer).

Budget: each turn is E epochs (init-epochs in round 0) of ceil(|D_k|/b) steps (floor with --partial-batch drop), the
epochs every node takes
under any strategy; the server's top takes a step for every node's batch.

What travels: per batch, the activations with their labels (b x C x H x W x 4 + 8 b bytes) up and their
gradient (b x C x H x W x 4) down; per turn, the bottom's weights to the next node. Kept for an audit
(`shared/activations.safetensors`): each node's first batch of its last turn: the activations, labels and
gradients the server saw, and, recorded by the node, the batch's positions in its training set (`index`) and the
bottom's weights and statistics that computed them (`bottom/...`, the white-box attacker's encoder).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from fedcli.comm.payloads import decode_model, encode_model
from fedcli.core.rng import torch_stream
from fedcli.experiment.panels import SPLIT
from fedcli.federate.strategies.base import Declaration
from fedcli.federate.strategies.cwt import KEY, CyclicWeightTransfer
from fedcli.federate.strategies.split_options import Cut, cut, server_node
from fedcli.models.cuts import cut_shape, split
from fedcli.training.local import Batches, batch_bounds, primary_per_epoch
from fedcli.training.objectives import Batch
from fedcli.training.split import Link, train_split

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation

KEPT = "activations"


@dataclasses.dataclass(frozen=True)
class SplitOptions:
    cut: Cut = cut("stem")
    server_node: str | None = server_node()


class SplitLearning(CyclicWeightTransfer):
    name = "splitnn"

    def __init__(self, options: SplitOptions):
        super().__init__()
        self.options = options

    def build(self, fed: "Federation") -> None:
        self.model = fed.trainer.new_model(KEY)
        self.bottom, self.top = split(self.model, fed.trainer.model_name, self.options.cut)
        self.server = self.options.server_node or fed.nodes[-1]
        self.shape = cut_shape(self.bottom, fed.data.image_shape)
        self.sizes = fed.train_sizes()  # every rank, before any turn: the server counts each node's steps
        self.samples: dict[str, dict[str, torch.Tensor]] = {}  # by the node that recorded them (its rank has them)

    def travelling(self):
        return self.bottom

    def visit(self, fed: "Federation", node: str, round_: int, epochs: int) -> None:
        at_node, at_server = node in fed.local_nodes, self.server in fed.local_nodes
        if not (at_node or at_server):
            return
        settings = fed.trainer.settings(node, round_, epochs)
        per_epoch = primary_per_epoch(self.sizes[node], settings)
        steps = epochs * len(batch_bounds(per_epoch, settings.batch))
        if at_node:
            fed.trainer.spent.append({"round": round_, "key": node, "steps": steps, "real": epochs * per_epoch,
                                      "replayed": 0})
        batches = None
        if at_node:
            bottom = {f"{node}/bottom/{k}": v.detach().cpu().clone() for k, v in self.bottom.state_dict().items()}
            batches = first_recorded(Batches(fed.data.train[node], None, settings,
                                             torch_stream(fed.seed, node, round_, "local-train")),
                                     lambda index: self.samples.setdefault(node, {}).update(
                                         bottom | {f"{node}/index": index.clone()}))
        link = Link(fed.transport, round_, node, self.server, self.shape, fed.data.num_classes)

        def keep(step: int, activations: torch.Tensor, labels: torch.Tensor, gradient: torch.Tensor) -> None:
            if step == 0:
                self.samples.setdefault(self.server, {}).update({
                    f"{node}/activations": activations.cpu().contiguous(), f"{node}/labels": labels.cpu(),
                    f"{node}/gradients": gradient.cpu().contiguous()})

        train_split(self.bottom if at_node else None, self.top if at_server else None, batches, steps, settings, link,
                    fed.trainer.device, on_step=keep)

    def assemble(self, fed: "Federation", round_: int) -> str:
        """The server, once the last node's bottom has reached it."""
        last = fed.nodes[-1]
        if last != self.server:
            if last in fed.local_nodes:
                fed.transport.send(round_, last, self.server, "eval", encode_model(self.bottom.state_dict()))
            if self.server in fed.local_nodes:
                self.bottom.load_state_dict(decode_model(fed.transport.receive(round_, last, self.server, "eval"),
                                                         self.bottom.state_dict()))
            fed.transport.flush()
        return self.server

    def kept(self) -> dict[str, dict[str, torch.Tensor]]:
        merged = {k: v for sample in self.samples.values() for k, v in sample.items()}
        return {KEPT: merged} if merged else {}

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        return super().state() | {f"{KEPT}:{owner}": dict(sample) for owner, sample in self.samples.items()}

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, {KEY: states[KEY]})
        self.samples = {key.removeprefix(f"{KEPT}:"): dict(sample) for key, sample in states.items()
                        if key.startswith(f"{KEPT}:")}


def first_recorded(batches: Batches, record) -> Iterator[Batch]:
    """`batches`, calling `record` with the first batch's positions in the training set as it is drawn."""
    for i, batch in enumerate(batches):
        if i == 0:
            record(batches.drawn)
        yield batch


DECLARED = (
    Declaration("splitnn", "SplitNN, peer to peer: the nodes take turns training the bottom of the cut network "
                "with the server's top, activations and gradients per batch (Vepakomma et al.)",
                lambda o: SplitLearning(o), options=SplitOptions, model_key=KEY,
                transfers=("model", "activations", "gradients"), families=("federated",), published=True,
                discloses={"activations": "cut-layer activations of every batch, with labels"},
                bn_averaged="the last node's below the cut (its bottom's statistics), every node's batches above it "
                "(the server's top)", panel=SPLIT),
)
