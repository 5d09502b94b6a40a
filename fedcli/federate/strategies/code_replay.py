"""Generative replay with a VQ-VAE-2 (Qu et al. 2022): CWT+Replay, the study's method (its Algorithm 1's
classifier rounds), and FedAvg+Replay (its section 3.1/3.2, described there and not evaluated).

Algorithm 1's first round, the VQ-VAE-2 trained serially across the nodes, is `train-gan --generator vqvae2`:
it leaves every node with the final VQ-VAE-2 and its own codes. In round 0 here, every node sends its codes
and labels to every other node, and each decodes every node's codes, its own included, with its copy of the
final decoder: the replayed images x^r, reconstructions of every node's real images. With --replay-source
buffers, the nodes' buffers travel instead (a VQ-VAE-2 prior's samples, or any generator's buffer), as PNG.

- `cwt-replay`: cyclic weight transfer (fedcli/federate/strategies/cwt.py), each visit training on the node's images
  joined with x^r, as Algorithm 1 trains on x_k and x^r.
- `fedavg-replay`: FedAvg, each node training on its images joined with x^r.

Budget (--replay-mix): `batch`, the default, follows Algorithm 1, which iterates "for each local batch x_k" and
joins replayed images to it: a visit (cwt-replay) or local epoch (fedavg-replay) takes the steps its base
strategy takes over the node's real images, each real batch of n joined by round(n s / (1 - s)) images drawn
without replacement from x^r, s = --replay-share (the replayed share of a joined batch; the paper does not state
it, 0.5 is FedER's equal mix), and the loss is the mean cross-entropy over the joined batch. `union` draws
batches from |D_k| + |x^r| images joined, as fedavg-share's epochs: a node then takes more steps than its base
strategy (about 5x at four nodes), kept only to reproduce earlier runs. --buffer-size k replays the first k codes
(or buffer images) of each node; 0 replays nothing, so each is its base strategy (fedavg-replay at 0 is fedavg,
to the byte).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

import torch

from fedcli.comm.payloads import decode_buffer
from fedcli.core.errors import UserError
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.panels import REPLAY
from fedcli.federate.strategies.averaging import SHARED_STATISTICS
from fedcli.federate.strategies.base import Declaration, option
from fedcli.federate.strategies.cwt import CyclicWeightTransfer, forgetting_option
from fedcli.federate.strategies.fedavg_share import SharedDataAveraging
from fedcli.federate.strategies.replay_options import BufferCodec, buffer_size, codec
from fedcli.federate.strategies.union import TrainsOnUnion, all_to_all
from fedcli.generators.vqvae2.codes import decode_codes, encode_codes
from fedcli.training.local import Batches
from fedcli.training.objectives import Supervised

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation

CODES = "codes"
ReplaySource = Literal["codes", "buffers"]
ReplayMix = Literal["batch", "union"]
DISCLOSES = {CODES: "VQ-VAE-2 codes of every training image (reconstructions of them, to a holder of the decoder), "
                    "with labels"}


@dataclasses.dataclass(frozen=True)
class CodeReplayOptions:
    buffer_size: int | None = buffer_size()
    replay_source: ReplaySource = dataclasses.field(default="codes", metadata={
        "help": "What the replay strategies replay: every node's VQ-VAE-2 codes, decoded (reconstructions of its "
                "real images; train-gan --generator vqvae2), or buffers (every node's buffer: a VQ-VAE-2 prior's "
                "samples, or any generator's).", "select": False})
    buffer_codec: BufferCodec = codec()
    replay_mix: ReplayMix = dataclasses.field(default="batch", metadata={
        "help": "How the replay strategies mix replayed images in: batch joins each real batch with replayed "
                "images, so a visit or epoch takes the steps of the real images alone (Algorithm 1); union draws "
                "batches from the real and replayed images together, more steps (earlier runs).", "select": False})
    replay_share: float = option(0.5, 0, 1, help="--replay-mix batch: the replayed share of each joined batch "
                                 "(0.5: as many replayed images as real ones, FedER's mix).", high_open=True)

    @property
    def replay_ratio(self) -> float:
        """Replayed images per real image of a joined batch."""
        return self.replay_share / (1 - self.replay_share)

    def objective(self) -> Supervised:
        """Algorithm 1's loss over a joined batch: each part's cross-entropy weighted by its share (under union
        every image is primary, so there is no second part to weigh)."""
        return Supervised(lam=1 - self.replay_share)


def replayed(fed: "Federation", options: CodeReplayOptions) -> dict[str, TensorSource]:
    """Round 0: every node's codes (or buffer) to every other node; each local node's replayed images, every
    node's in node order."""
    k = options.buffer_size
    empty = TensorSource(torch.zeros((0, *fed.data.image_shape), dtype=torch.uint8), torch.zeros(0, dtype=torch.long))
    if k == 0:
        return {node: empty for node in fed.local_nodes}
    device = fed.trainer.device
    if options.replay_source == "buffers":
        return all_to_all(fed, "buffer", lambda node: fed.data.buffers[node],
                          lambda node: fed.exchange.payload(node, options.buffer_codec),
                          lambda node, sender, data: TensorSource(*decode_buffer(data, fed.data.image_shape,
                                                                                 fed.data.num_classes)))

    def own_codes(node: str):
        codes = fed.data.codecs[node].codes
        if k is not None and k > len(codes):
            raise UserError(f"--buffer-size {k} exceeds node {node}'s {len(codes)} codes; replay at most "
                            f"{len(codes)}, or leave --buffer-size out to replay every code")
        return codes if k is None else codes.first(k)

    def decode(node: str, sender: str, data: bytes) -> TensorSource:
        codec_ = fed.data.codecs[node]
        return codec_.decoded(decode_codes(data, codec_.shape, [sender])[sender], device)

    return all_to_all(fed, CODES, lambda node: fed.data.codecs[node].decoded(own_codes(node), device),
                      lambda node: encode_codes({node: own_codes(node)}), decode)


@dataclasses.dataclass(frozen=True)
class CwtReplayOptions(CodeReplayOptions):
    forgetting: bool = forgetting_option()


class ReplaysInBatches(TrainsOnUnion):
    """Mixed in before a TrainsOnUnion strategy: with --replay-mix batch, a node trains on its real images, each
    batch joined by replayed images from the received set, instead of on the two joined."""

    options: CodeReplayOptions

    def trained_on(self, fed: "Federation", node: str) -> tuple[TensorSource, TensorSource | None]:
        """The primary and replay sources: the joined set alone (union), or the real images and the received set."""
        if self.options.replay_mix == "union":
            return super().trained_on(fed, node)
        return fed.data.train[node], self.union[node]

    def replay_train(self, fed: "Federation", model, node: str, round_: int, epochs: int, partial: str = "keep") -> int:
        """`epochs` epochs of `node` on its sources as --replay-mix mixes them; `partial`: the base strategy's rule
        for an epoch's last batch."""
        primary, replay = self.trained_on(fed, node)
        ratio = self.options.replay_ratio
        compose = (lambda p, r, s, g: Batches(p, r, s, g, partial=partial, replay_ratio=ratio))
        return fed.trainer.train(model, node, round_, primary, replay, epochs, self.options.objective(), compose)


class CwtReplay(ReplaysInBatches, CyclicWeightTransfer):
    def __init__(self, options: CodeReplayOptions):
        super().__init__(options)
        self.name = "cwt-replay"
        self.union, self.joined = {}, {}

    def setup(self, fed: "Federation", train: bool = True) -> None:
        self.union, self.joined = (replayed(fed, self.options) if train else {}), {}
        super().setup(fed, train)

    def visit(self, fed: "Federation", node: str, round_: int, epochs: int) -> None:
        if node in fed.local_nodes:
            self.replay_train(fed, self.model, node, round_, epochs, partial="drop")


class FedAvgReplay(ReplaysInBatches, SharedDataAveraging):
    def exchange(self, fed: "Federation") -> dict[str, TensorSource]:
        return replayed(fed, self.options)

    def train_node(self, fed: "Federation", node: str, round_: int, model, epochs: int, anchor) -> int:
        return self.replay_train(fed, model, node, round_, epochs)


DECLARED = (
    Declaration("cwt-replay", "CWT+Replay: CWT where every visit also trains on every node's decoded VQ-VAE-2 "
                "codes (Qu et al.; train-gan --generator vqvae2)", CwtReplay, options=CwtReplayOptions,
                model_key="global", transfers=(CODES, "buffer", "model"), needs_buffers=True,
                families=("federated",), published=True, discloses=DISCLOSES, as_trained_on="real + replayed",
                bn_averaged="the last node's: the statistics of the node the model visited last, not the evaluating "
                "node's", panel=REPLAY),
    Declaration("fedavg-replay", "FedAvg+Replay: FedAvg where every node also trains on every node's decoded "
                "VQ-VAE-2 codes (Qu et al.)", lambda o: FedAvgReplay("fedavg-replay", o), options=CodeReplayOptions,
                model_key="global", transfers=(CODES, "buffer", "all-reduce"), needs_buffers=True,
                families=("federated",), bn_averaged=SHARED_STATISTICS, discloses=DISCLOSES,
                as_trained_on="real + replayed", panel=REPLAY),
)
