"""A node's VQ-VAE-2 as federate's replay strategies use it: the final decoder that train-gan's serial chain
returned to the node, and the node's codes (gan/<node>/)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from fedcli.data.tensor_source import TensorSource
from fedcli.errors import UserError
from fedcli.gan.kinds import load_generator
from fedcli.gan.vqvae2 import VqGenerator, code_shape, decode_all
from fedcli.layout import GENERATOR, gan_dir
from fedcli.replay.buffer import to_uint8
from fedcli.replay.codes import CodeShape, NodeCodes, load_codes_file
from fedcli.replay.record import kind_name, read_gan_config


@dataclasses.dataclass
class NodeCodec:
    generator: VqGenerator
    codes: NodeCodes

    @property
    def shape(self) -> CodeShape:
        return code_shape(self.generator.vqvae.arch)

    def decoded(self, codes: NodeCodes, device: str) -> TensorSource:
        """Codes (any node's) decoded by this node's decoder, as uint8 images."""
        images = decode_all(self.generator.vqvae.to(device), codes, device)
        return TensorSource(to_uint8(images) if len(codes) else torch.zeros((0, *self.image_shape), dtype=torch.uint8),
                            codes.labels.clone())

    @property
    def image_shape(self) -> tuple[int, int, int]:
        arch = self.generator.vqvae.arch
        return arch.channels, arch.resolution, arch.resolution


def load_codec(exp: Path, manifest, node: str, strategy: str) -> NodeCodec:
    folder = gan_dir(exp, node)
    if not (folder / "config.json").is_file():
        raise UserError(f"strategy {strategy} replays node {node}'s VQ-VAE-2 codes, and {folder} has none; run "
                        f"fedcli train-gan --exp {exp} --generator vqvae2 first")
    saved = read_gan_config(exp, manifest, node)
    if kind_name(saved) != "vqvae2":
        raise UserError(f"strategy {strategy} replays VQ-VAE-2 codes, and node {node}'s generator is a "
                        f"{kind_name(saved)}; run fedcli train-gan --generator vqvae2 --overwrite, or pass "
                        "--replay-source buffers to replay its buffer")
    generator = load_generator(folder, GENERATOR, saved)
    codes = load_codes_file(folder, node, manifest, code_shape(generator.vqvae.arch))
    return NodeCodec(generator, codes)
