"""Generative replay with a VQ-VAE-2 (Qu et al. 2022): CWT+Replay, the study's method (its Algorithm 1's
classifier rounds), and FedAvg+Replay (its section 3.1/3.2, described there and not evaluated).

Algorithm 1's first round, the VQ-VAE-2 trained serially across the nodes, is `train-gan --generator vqvae2`:
it leaves every node with the final VQ-VAE-2 and its own codes. In round 0 here, every node sends its codes
and labels to every other node, and each decodes every node's codes, its own included, with its copy of the
final decoder: the replayed images x^r, reconstructions of every node's real images. With --replay-source
buffers, the nodes' buffers travel instead (a VQ-VAE-2 prior's samples, or any generator's buffer), as PNG.

- `cwt-replay`: cyclic weight transfer (fedcli/fl/strategies/cwt.py), each visit training on the node's images
  joined with x^r, as Algorithm 1 trains on x_k and x^r.
- `fedavg-replay`: FedAvg, each node training on its images joined with x^r.

Budget: as fedavg-share's, the replayed images count: an epoch is |D_k| + |x^r| images. --buffer-size k
replays the first k codes (or buffer images) of each node; 0 replays nothing, so each is its base strategy
(fedavg-replay at 0 is fedavg, to the byte).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

import torch

from fedcli.data.tensor_source import TensorSource
from fedcli.errors import UserError
from fedcli.fl.payloads import decode_buffer, decode_codes, encode_codes
from fedcli.fl.strategies.averaging import SHARED_STATISTICS
from fedcli.fl.strategies.base import Declaration
from fedcli.fl.strategies.cwt import CyclicWeightTransfer, forgetting_option, full_batches
from fedcli.fl.strategies.fedavg_share import SharedDataAveraging
from fedcli.fl.strategies.replay_options import BufferCodec, buffer_size, codec
from fedcli.fl.strategies.union import TrainsOnUnion, all_to_all

if TYPE_CHECKING:
    from fedcli.fl.engine import Federation

CODES = "codes"
ReplaySource = Literal["codes", "buffers"]
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


class CwtReplay(TrainsOnUnion, CyclicWeightTransfer):
    def __init__(self, options: CodeReplayOptions):
        super().__init__(options)
        self.name = "cwt-replay"
        self.union, self.joined = {}, {}

    def setup(self, fed: "Federation", train: bool = True) -> None:
        self.union, self.joined = (replayed(fed, self.options) if train else {}), {}
        super().setup(fed, train)

    def visit(self, fed: "Federation", node: str, round_: int, epochs: int) -> None:
        if node in fed.local_nodes:
            fed.trainer.train(self.model, node, round_, self.sources(fed, node), None, epochs, compose=full_batches)


class FedAvgReplay(SharedDataAveraging):
    def exchange(self, fed: "Federation") -> dict[str, TensorSource]:
        return replayed(fed, self.options)


DECLARED = (
    Declaration("cwt-replay", 23, "CWT+Replay: CWT where every visit also trains on every node's decoded VQ-VAE-2 "
                "codes (Qu et al.; train-gan --generator vqvae2)", CwtReplay, options=CwtReplayOptions,
                model_key="global", transfers=(CODES, "buffer", "model"), needs_buffers=True,
                families=("federated",), published=True, discloses=DISCLOSES, as_trained_on="real + replayed",
                bn_averaged="the last node's: the statistics of the node the model visited last, not the evaluating "
                "node's"),
    Declaration("fedavg-replay", 33, "FedAvg+Replay: FedAvg where every node also trains on every node's decoded "
                "VQ-VAE-2 codes (Qu et al.)", lambda o: FedAvgReplay("fedavg-replay", o), options=CodeReplayOptions,
                model_key="global", transfers=(CODES, "buffer", "all-reduce"), needs_buffers=True,
                families=("federated",), bn_averaged=SHARED_STATISTICS, discloses=DISCLOSES,
                as_trained_on="real + replayed"),
)
