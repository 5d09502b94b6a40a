"""The generator kinds train-gan can make, by name (`--generator`), and a saved generator loaded as the kind
its node's record names. A kind is one sub-package of fedcli/generators whose kind.py declares `KIND`, an
object implementing fedcli/generators/protocol.py's GeneratorKind; the registry discovers them, as the strategy
registry discovers strategy modules, so adding one touches nothing else."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torch import nn

from fedcli.core.errors import UserError
from fedcli.experiment.artifact_kinds import load_module
from fedcli.experiment.paths import gan_dir
from fedcli.generators.config import declared
from fedcli.generators.protocol import CodeSharing, GeneratorKind
from fedcli.generators.record import kind_name, read_gan_config


def own_options(kind: GeneratorKind) -> frozenset[str]:
    """The options `kind` reads beyond train-gan's common ones: its options dataclass's fields."""
    return frozenset(field.name for field in dataclasses.fields(kind.options))


def discover() -> dict[str, GeneratorKind]:
    """Every kind a sub-package of fedcli.generators declares in its kind.py (on any of the package's paths), then
    every generator plugin's (core/plugins.py), by name."""
    kinds: dict[str, GeneratorKind] = {}
    for kind, plugin in declared("kind", "KIND"):
        name = getattr(kind, "name", None)
        if plugin is None:
            if name in kinds:
                raise ValueError(f"generator kind {name!r} is declared by two sub-packages")
        elif name != plugin.name:
            raise plugin.refuse(f"declares KIND named {name!r} in {plugin.value}.kind, not {plugin.name!r} as its "
                                "entry point")
        elif name in kinds:
            raise plugin.refuse(f"takes the name of fedcli's generator kind {name!r}; rename it")
        elif not dataclasses.is_dataclass(getattr(kind, "options", None)):
            raise plugin.refuse("declares KIND without an options dataclass (its `options`)")
        kinds[name] = kind
    return kinds


KINDS = discover()


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


def node_codec(exp: Path, manifest, node: str, strategy: str):
    """What a code-replay strategy decodes with at `node`: its generator's codec (the decoder the kind's training
    handed the node, and the node's own codes), from the kind its record names."""
    folder = gan_dir(exp, node)
    if not (folder / "config.json").is_file():
        raise UserError(f"strategy {strategy} replays node {node}'s generator codes, and {folder} has none; run "
                        f"fedcli train-gan --exp {exp} --generator {code_sharing()} first")
    saved = read_gan_config(exp, manifest, node)
    kind = recorded_kind(saved)
    if not isinstance(kind, CodeSharing):
        raise UserError(f"strategy {strategy} replays codes, and node {node}'s generator is a {kind.name}, which "
                        f"shares none; run fedcli train-gan --generator {code_sharing()} --overwrite, or pass "
                        "--replay-source buffers to replay its buffer")
    return kind.node_codec(exp, manifest, node, saved, strategy)


def code_sharing() -> str:
    """The kinds whose nodes share codes, as --generator values."""
    return " or ".join(sorted(name for name, kind in KINDS.items() if isinstance(kind, CodeSharing)))
