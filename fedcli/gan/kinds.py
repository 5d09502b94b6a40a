"""The generator kinds train-gan can make, by name (`--generator`), and a saved generator loaded as the kind
its node's record names. A kind is one module implementing fedcli/generators.py's GeneratorKind; adding
one is that module and its line here (or `register` from outside fedcli, as the tests do)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from fedcli.artifact_kinds import load_module
from fedcli.errors import UserError
from fedcli.gan.stylegan2 import StyleGan2
from fedcli.gan.vqvae2 import VqVae2Kind
from fedcli.generators import GeneratorKind
from fedcli.replay.record import kind_name

KINDS: dict[str, GeneratorKind] = {}


def register(kind: GeneratorKind) -> GeneratorKind:
    """Make `kind` available under its name; a name is taken once."""
    if KINDS.get(kind.name, kind) is not kind:
        raise ValueError(f"generator kind {kind.name!r} is registered already")
    KINDS[kind.name] = kind
    return kind


def generator_kind(name: str) -> GeneratorKind:
    if name not in KINDS:
        raise UserError(f"--generator {name} is not a generator kind; use one of {', '.join(sorted(KINDS))}")
    return KINDS[name]


def recorded_kind(record: dict) -> GeneratorKind:
    """The kind that made a node's generators, from its GAN config.json."""
    return generator_kind(kind_name(record))


def load_generator(folder: Path, filename: str, record: dict, device: str = "cpu") -> nn.Module:
    """Rebuild a saved generator from its node's record and safetensors file; refuse one that is not what
    train-gan wrote for this node (see artifact_kinds)."""
    generator = load_module(recorded_kind(record).build(record), folder / filename, "generator checkpoint",
                            f"re-run fedcli train-gan --node {folder.name} --overwrite", expect={"node": folder.name})
    return generator.to(device).eval()


register(StyleGan2())
register(VqVae2Kind())
