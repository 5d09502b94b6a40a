"""A node's VQ-VAE-2 as federate's replay strategies use it: the final VQ-VAE-2 that train-gan's serial chain
returned to the node (its decoder decodes every node's codes), and the node's own codes (gan/<node>/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from fedcli.core.errors import UserError
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.artifact_kinds import load_recorded
from fedcli.experiment.paths import GENERATOR, gan_dir
from fedcli.generators.buffer import to_uint8
from fedcli.generators.vqvae2.codes import CodeShape, NodeCodes, load_codes_file
from fedcli.generators.vqvae2.networks import VqArchitecture, VqVae2, code_shape, decode_all

PREFIX = "vqvae."  # the VQ-VAE-2's tensors in generator.safetensors (beside the priors')


@dataclasses.dataclass
class NodeCodec:
    vqvae: VqVae2
    codes: NodeCodes

    @property
    def shape(self) -> CodeShape:
        return code_shape(self.vqvae.arch)

    def decoded(self, codes: NodeCodes, device: str) -> TensorSource:
        """Codes (any node's) decoded by this node's decoder, as uint8 images."""
        arch = self.vqvae.arch
        if not len(codes):
            empty = torch.zeros((0, arch.channels, arch.resolution, arch.resolution), dtype=torch.uint8)
            return TensorSource(empty, codes.labels.clone())
        return TensorSource(to_uint8(decode_all(self.vqvae.to(device), codes, device)), codes.labels.clone())


def load_codec(exp: Path, manifest, node: str, saved: dict, strategy: str) -> NodeCodec:
    """`node`'s codec from its GAN folder, whose record `saved` names this kind."""
    folder = gan_dir(exp, node)
    if saved.get("dp"):
        raise UserError(f"strategy {strategy} replays VQ-VAE-2 codes, and node {node}'s VQ-VAE-2 was trained under "
                        "--dp-epsilon, which keeps its codes (encodings of real images) at the node; pass "
                        "--replay-source buffers to replay its prior's samples")
    fix = "re-run fedcli train-gan --generator vqvae2 --overwrite"
    state, _ = load_recorded(folder / GENERATOR, f"VQ-VAE-2 of node {node}", fix, expect={"node": node})
    with torch.random.fork_rng(devices=[]):  # its weights are the saved ones: the global generator stays untouched
        vqvae = VqVae2(VqArchitecture(**saved["architecture"]))
    try:
        vqvae.load_state_dict({k.removeprefix(PREFIX): v for k, v in state.items() if k.startswith(PREFIX)})
    except RuntimeError as exc:
        raise UserError(f"VQ-VAE-2 of node {node} at {folder / GENERATOR} does not fit its recorded architecture; "
                        f"{fix}") from exc
    return NodeCodec(vqvae.eval(), load_codes_file(folder, node, manifest, code_shape(vqvae.arch)))
