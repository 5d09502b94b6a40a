"""`fedcli train-gan`'s resolved configuration: the options train-gan reads for every kind, plus every kind's own
options, each declared once in its sub-package's options dataclass (`options.py`, `OPTIONS`), found as the
registry finds the kinds. An option two kinds read (DP-SGD's) is one field both inherit; a name declared twice
with another meaning is refused. A kind refuses the options it does not read (generators/node_training.py)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
import typing
from pathlib import Path

import fedcli.generators as package
from fedcli.core import plugins
from fedcli.core.precision import COMPILE_HELP, PRECISION_HELP, Precision, check_precision
from fedcli.core.errors import UserError
from fedcli.experiment.config import (EXP_HELP, GIVEN, MAX_BATCH, MAX_COUNT, MAX_SEED, MAX_THREADS, THREADS_HELP,
                                      Device, Engine, Launch, ModelName, check_ranges, option, ranged)
from fedcli.experiment.panels import BUFFER, ENGINE, GENERATOR, OUTPUT

# how train-gan runs, or where it starts from, not what it makes (equal bytes)
GAN_ENGINE_OPTIONS = frozenset({"engine", "launch", "timeout", "phase1_from"})


@dataclasses.dataclass(frozen=True)
class CommonOptions:
    """What train-gan reads for every kind: where, which nodes, which kind, the buffer and its fidelity score,
    and how the run executes."""

    exp: Path = option(panel=OUTPUT, help=EXP_HELP)
    node: str | None = option(None, flags=("--node", "--node-name"), panel=OUTPUT, help=(
        "Train this node only (hospitals can run separately); distributed: the node this process is \\[default: by "
        "rank]. Default: every node in turn."))
    # a kind in fedcli/generators/registry.py, checked there
    generator: str = option("stylegan2", panel=GENERATOR, help=(
        "Kind of generator: stylegan2 (FedER's GAN, per node) or vqvae2 (the generative-replay study's VQ-VAE-2, "
        "trained serially across the nodes: --iterations steps at each, --batch; its own options say vqvae2). The "
        "options below are the stylegan2 kind's unless said otherwise." + plugins.listed("generators")))
    # default: the partition's seed
    seed: int | None = ranged(None, 0, MAX_SEED, panel=OUTPUT, help="Seed \\[default: the partition's].")
    iterations: int = ranged(400, 1, MAX_COUNT, panel=GENERATOR, help="Phase 1 (standard GAN) iteration cap.")
    batch: int = ranged(32, 2, MAX_BATCH, panel=GENERATOR, help=(
        "Real and synthetic images per step (L_PP grows with it)."))
    truncation: float = ranged(0.7, 0, 1, why="1: none, 0: every image is its class's mean", panel=BUFFER, help=(
        "Buffer sampling: pull each w towards its class's mean w (1: none, 0: the mean image of each class)."))
    buffer_size: int = ranged(512, 1, MAX_COUNT, panel=BUFFER, help=(
        "Synthetic images in the shared buffer (class-interleaved)."))
    fidelity_model: ModelName = option("cnn", panel=BUFFER, help=(
        "Fidelity score's classifier (use federate's --model)."))
    fidelity_epochs: int = ranged(11, 1, MAX_COUNT, panel=BUFFER, help=(
        "Fidelity classifier's epochs over the real training images (federate's init epochs + rounds x epochs); the "
        "buffer gets as many steps. vqvae2: at most, see --fidelity-seeds."))
    fidelity_lr: float = ranged(1e-3, 0, 1, low_open=True, panel=BUFFER, help=(
        "Fidelity classifier's learning rate (federate's --lr)."))
    fidelity_batch: int = ranged(32, 2, MAX_BATCH, why="the classifier has BatchNorm", panel=BUFFER, help=(
        "Fidelity classifier's batch (federate's --batch)."))
    fidelity_seeds: int = ranged(3, 0, 100, why="0 skips the fidelity score", panel=BUFFER, help=(
        "Classifier seeds the fidelity score averages over; 0 skips it. vqvae2: the score's classifiers take at most "
        "half the node's generator steps (--iterations + --prior-iterations) in all, seeds dropping first (to 1), "
        "then epochs (to 1); config.json's fidelity.classifier records what trained."))
    sample_only: bool = option(False, panel=OUTPUT, help=(
        "Only re-sample the buffer (e.g. another --buffer-size) from the saved generator."))
    device: Device = option("auto", panel=ENGINE, help="auto (CUDA when present), cpu or cuda.")
    precision: Precision = option("fp32", panel=ENGINE, help=PRECISION_HELP)
    compile: bool = option(False, panel=ENGINE, help=COMPILE_HELP)
    engine: Engine = option("inprocess", panel=ENGINE, help=(
        "vqvae2: inprocess (the chain runs here) or distributed (one torch.distributed process per node; each waits "
        "for its predecessor's training). stylegan2 trains each node alone: --node on each node's machine."))
    launch: Launch = option("none", panel=ENGINE, help=(
        "local: start one process per node on this machine (loopback); none: this process is one node, started by "
        "torchrun."))
    # per transfer or collective
    timeout: float = ranged(300.0, 0, 7 * 86400, low_open=True, why="seconds", panel=ENGINE, help=(
        "Distributed: seconds a transfer waits for a peer, and a peer's heartbeat may stay silent, before the run "
        "stops."))
    threads: int | None = ranged(None, 1, MAX_THREADS, panel=ENGINE, help=THREADS_HELP)
    overwrite: bool = option(False, panel=OUTPUT, help="Replace existing <exp>/gan/<node> folders.")
    given: frozenset[str] = GIVEN  # the options the user set, whatever their values (a kind refuses those it does
    # not read)

    def defaults(self) -> GanConfig:
        """Every option at its default, as resolved for this config's DP setting (which some defaults follow)."""
        return type(self)(exp=self.exp, dp_epsilon=self.dp_epsilon)

    def __post_init__(self) -> None:
        check_ranges(self)
        check_precision(self.precision, self.device)
        if self.launch != "none" and self.engine == "inprocess":
            raise UserError("--launch applies to --engine distributed (the in-process engine runs every node here)")
        if self.node is not None and self.launch == "local":
            raise UserError("--node names the node of a process started by torchrun; --launch local assigns nodes "
                            "itself, so drop --node")
        for check in CHECKS:
            check(self)

    @property
    def private(self) -> bool:
        """Trained under DP-SGD (--dp-epsilon, generators/shared_options.py)."""
        return getattr(self, "dp_epsilon", None) is not None


def declared(module: str, name: str) -> list[tuple[typing.Any, plugins.Plugin | None]]:
    """What each kind sub-package (on any of fedcli.generators' paths), then each generator plugin's package,
    declares as `name` in its `module`, with the plugin it came from (None: fedcli's): the one discovery the
    config (OPTIONS in options.py) and the registry (KIND in kind.py) share."""
    found = []
    for sub in pkgutil.iter_modules(package.__path__):
        full = f"{package.__name__}.{sub.name}.{module}"
        if sub.ispkg and importlib.util.find_spec(full) is not None:
            found.append((getattr(importlib.import_module(full), name), None))
    for plugin in plugins.installed("generators"):
        part = dataclasses.replace(plugin, value=f"{plugin.value}.{module}:{name}")
        found.append((part.load(), plugin))
    return found


def merged_fields(classes: list[tuple[type, plugins.Plugin | None]]) -> list[tuple[str, typing.Any, dataclasses.Field]]:
    """GanConfig's fields from the kinds' options, once each: a name two kinds declare must be one declaration (a
    shared dataclass); a plugin's field must be an option (a default and help) and takes the generator panel unless
    it names one."""
    common = {field.name for field in dataclasses.fields(CommonOptions)}
    declared: dict[str, dataclasses.Field] = {}  # name -> the field as its dataclass declares it
    fields = []
    for cls, plugin in classes:
        if plugin is not None and not dataclasses.is_dataclass(cls):
            raise plugin.refuse(f"declares OPTIONS = {cls!r} in {plugin.value}.options, not a dataclass")
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if declared.get(field.name) is field:  # inherited from a dataclass another kind's options inherit too
                continue
            if plugin is not None:
                check_plugin_field(plugin, field, common | set(declared))
            elif field.name in declared:
                raise ValueError(f"option {field.name!r} is declared by two generator kinds; declare it once, in a "
                                 "dataclass both kinds' options inherit (generators/shared_options.py)")
            declared[field.name] = field
            panel = {} if plugin is None or field.metadata.get("panel") else {"panel": GENERATOR}
            fields.append((field.name, hints[field.name],
                           dataclasses.field(default=field.default, metadata={**field.metadata, **panel})))
    return fields


def check_plugin_field(plugin: plugins.Plugin, field: dataclasses.Field, taken: set[str]) -> None:
    if field.name in taken:
        raise plugin.refuse(f"declares option {field.name!r}, which train-gan or another generator kind declares; "
                            "rename it, or inherit the dataclass that declares it")
    if not field.metadata.get("help") or field.default is dataclasses.MISSING:
        raise plugin.refuse(f"declares option {field.name!r} without a default and help; declare it with "
                            "fedcli.experiment.config.option(default, help) or ranged(default, low, high, help)")


def checks(classes: list[type]) -> list[typing.Callable]:
    """Each options dataclass's own `check`, a shared one once, inherited ones first."""
    found = [vars(klass)["check"] for cls in classes for klass in reversed(cls.__mro__) if "check" in vars(klass)]
    return list(dict.fromkeys(found))


DECLARED_OPTIONS = declared("options", "OPTIONS")
CHECKS = checks([cls for cls, _ in DECLARED_OPTIONS])
GanConfig = dataclasses.make_dataclass(
    "GanConfig", merged_fields(DECLARED_OPTIONS), bases=(CommonOptions,), frozen=True, namespace={"__doc__": CommonOptions.__doc__, "__module__": __name__})
