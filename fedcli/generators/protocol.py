"""What train-gan, federate and the audit need from a kind of generator, as typed protocols.

A kind (StyleGAN2 in fedcli/generators/stylegan2/, the VQ-VAE-2 in fedcli/generators/vqvae2/, each a sub-package
that fedcli/generators/registry.py discovers) trains each node's generators in the roles the later stages rely on: the
released
generator (its buffer is what the node shares), and for StyleGAN the standard one (trained without any privacy
measure) and the control (trained as long as the released one, without the privacy measure: the audit's paired
comparison); the fidelity score scores every role a kind makes. Federate reads the buffers
(fedcli/generators/buffer.py), and a code-replay strategy a kind's codes through its CodeSharing protocol. The audit
inverts the generators: the kind gives each
image a starting latent, renders latents, and names the extra per-image inputs worth optimising.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pandas as pd
import torch
from torch import nn

if TYPE_CHECKING:
    from fedcli.generators.config import GanConfig
    from fedcli.data.dataset import NodeDataset
    from fedcli.data.manifest import Manifest
    from fedcli.comm.transport import Transport

RELEASED, STANDARD, CONTROL = "phase2", "phase1", "control"  # the roles, as config.json and samples.png name them


class Sampler(Protocol):
    """A generator that draws labelled samples: what a buffer, samples.png and the fidelity score use."""

    def sample(self, labels: torch.Tensor, stream: torch.Generator, truncation: float = 1.0) -> torch.Tensor:
        """Images in [-1, 1] of `labels` (on the generator's device), every random draw from `stream` (CPU),
        so a buffer is a pure function of its keyed streams; `truncation` < 1 pulls samples towards their
        class's typical one (a kind without the notion ignores it)."""


class Invertible(Protocol):
    """What the audit's projection optimises: per image a latent, and the extra inputs `render` accepts."""

    def start(self, labels: torch.Tensor, stream: torch.Generator) -> tuple[torch.Tensor, float]:
        """Each image's starting latent from its label alone (never from the image), and the latents' spread,
        which scales the projector's exploration noise; every draw from `stream`."""

    def render(self, latents: torch.Tensor, noise: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Images in [-1, 1] from latents, deterministically; `noise`: one map per `noise_shapes` entry."""

    def noise_shapes(self) -> list[tuple[int, ...]]:
        """The per-image shapes of the extra inputs `render` takes, optimised with --optimize-noise ([]: none)."""


class Codec(Protocol):
    """A generator that encodes real images into codes and decodes codes into images (the VQ-VAE-2 kind,
    fedcli/generators/vqvae2/kind.py): its buffer may be the decoded codes of the node's real images (`Trained.decoded`)
    rather than class-balanced samples."""

    def encode(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Codes (one index map per level) of images in [-1, 1]."""

    def decode(self, *codes: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] from codes."""


@runtime_checkable
class CodeSharing(Protocol):
    """A kind whose nodes can replay each other's codes (the VQ-VAE-2's: the generative-replay study's
    CWT+Replay and FedAvg+Replay send codes, each node decoding them with the decoder the chain handed it)."""

    def node_codec(self, exp: Path, manifest: Manifest, node: str, record: dict, strategy: str) -> Any:
        """The node's decoder and own codes (`shape`, `codes`, `decoded(codes, device)`), or one line refusing
        what its record rules out."""


@dataclasses.dataclass
class Trained:
    """One node's training, as train-gan writes it."""

    generators: dict[str, Sampler]  # by role (RELEASED, STANDARD, CONTROL), in samples.png's order
    files: dict[str, tuple[dict[str, torch.Tensor], dict[str, str]]]  # generator file -> (state, metadata)
    metrics: pd.DataFrame  # metrics.csv
    record: dict  # the kind's part of config.json
    decoded: tuple[torch.Tensor, torch.Tensor] | None = None  # a buffer of decoded codes (uint8 images, labels)


class NodeTrainer(Protocol):
    def train(self, node: str, data: NodeDataset) -> Trained:
        """Train `node`'s generators on its train split `data`, every draw keyed by (seed, node)."""


class GeneratorKind(Protocol):
    """A kind of generator, registered by its `name` (`train-gan --generator NAME`)."""

    name: str
    projectable: bool  # audit-privacy can invert its generators (Invertible); else it attacks the buffer alone
    transfers: tuple[str, ...]  # the transport kinds its training sends between nodes
    options: type  # its options dataclass (options.py): the GanConfig fields it reads beyond the common ones

    def titles(self, cfg: GanConfig) -> dict[str, str]:
        """samples.png's panels: the title of each role it shows, for what `cfg` trains (a DP GAN's roles all hold
        its one released generator, so it shows that one)."""

    def plans(self, cfg: GanConfig, manifest: Manifest, nodes: Sequence[str], seed: int) -> dict:
        """Refuse in one line what cannot train on any of `nodes` (architecture, held-out images, a DP plan),
        before any trains; returns each node's DP plan where `cfg` asks for DP."""

    def trainer(self, cfg: GanConfig, manifest: Manifest, nodes: Sequence[str], seed: int,
                device: str) -> NodeTrainer:
        """Check the options against every node (`plans`) before any trains, and build what the nodes share
        once."""

    def build(self, record: dict) -> nn.Module:
        """A freshly initialised generator (a Sampler and Invertible module) of the architecture `record`
        (a node's config.json) describes: what a saved state loads into, and the audit's untrained control."""

    def image_size(self, record: dict) -> int:
        """The side of the images the recorded generators make."""

    def latent_sizes(self, record: dict) -> tuple[int, int]:
        """(the noise a sample draws, the latent the audit optimises): the audit's memoriser takes the same."""


class SerialKind(GeneratorKind, Protocol):
    """A kind trained once across the nodes in turn rather than per node (cyclic weight transfer, as the
    generative-replay study trains its VQ-VAE-2): its `trainer` runs the chain over every node of the partition,
    passing the generator over a transport (serialized bytes, measured as federate's transfers are), before any
    node's `train` hands that node its share; a trainer with `finish` is told when every node folder is written."""

    serial: bool

    def trainer(self, cfg: GanConfig, manifest: Manifest, nodes: Sequence[str], seed: int, device: str,
                local: Sequence[str] = (), transport: Transport | None = None) -> NodeTrainer:
        """The chain over `nodes`, of which this process holds `local` (default: all), over `transport` (default:
        in process; a distributed rank's holds its own node)."""
