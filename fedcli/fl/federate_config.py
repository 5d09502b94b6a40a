"""`fedcli federate`'s resolved configuration: the options every strategy shares, plus one field per
option that some strategy declares (fl/strategies/), made from the registry so that the recipe,
`--set`, [select] and the range checks treat both alike.

A strategy option's field defaults to None, "the strategy's own default": two strategies may declare
one option with different defaults (`--server-lr`: 0.01 for the adaptive ones, 1 for FedAvgM), and
each run records its resolved value in its config.json (`resolved_options`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from fedcli.config import (MAX_BATCH, MAX_COUNT, MAX_FOLDS, MAX_SEED, MAX_THREADS, Device, Engine, Launch,
                           architectures, check_ranges, field_range, ranged, to_json)
from fedcli.errors import UserError
from fedcli.fl.strategies import REGISTRY

LrSchedule = Literal["constant", "cosine", "step"]  # over init-epochs + R x E epochs (fl/local.py)
Optimizer = Literal["adam", "sgd"]
Weighting = Literal["samples", "equal"]  # averaging weights: train-set sizes (FedAvg's paper), or equal (FedBN's code)
Ssl = Literal["none", "fixmatch"]  # --ssl: the local objective on a few-labels partition (fl/fixmatch.py)
PartialBatch = Literal["keep", "drop"]  # an epoch's last partial batch (fl/local.py epoch_images)
EvalStatistics = Literal["stored", "local"]  # BatchNorm statistics models are scored with (fl/evaluator.py)
Labels = Literal["visible", "all"]  # --labels all: the oracle of the upper bounds (partition/hidden_labels.json)
FIXMATCH_OPTIONS = ("confidence", "lambda_u", "unlabeled_ratio")
ENGINE_OPTIONS = ("engine", "launch", "node", "timeout", "cross_eval", "threads")  # how a run executes, not what
SHARED_SELECT_KEYS = ("rounds", "epochs", "lr")  # what a [select] grid may vary for every strategy


@dataclasses.dataclass(frozen=True)
class SharedOptions:
    """`fedcli federate`'s options for every strategy. Defaults are a quick CPU configuration (small CNN,
    few rounds); the study used ResNet-18, R = 100, E = 100, lr 1e-4."""

    exp: Path
    strategy: tuple[str, ...] = ("feder",)
    rounds: int = ranged(10, 1, MAX_COUNT)
    epochs: int = ranged(1, 1, MAX_COUNT)
    init_epochs: int | None = ranged(None, 0, MAX_COUNT)  # default: epochs
    lr: float = ranged(1e-3, 0, 1, low_open=True)
    lr_schedule: LrSchedule = "constant"
    lr_step_epochs: int = ranged(35, 1, MAX_COUNT)  # step: lr x factor every this many epochs of the budget
    lr_step_factor: float = ranged(0.1, 0, 1, low_open=True)
    optimizer: Optimizer = "adam"
    sgd_momentum: float = ranged(0.9, 0, 1, high_open=True)
    weight_decay: float = ranged(0.0, 0, 1)
    batch: int = ranged(32, 1, MAX_BATCH)
    node_batch: tuple[str, ...] = ()  # NODE=B overrides, e.g. montgomery=8 (the study's per-node sizes)
    weighting: Weighting = "samples"
    ssl: Ssl = "none"
    labels: Labels = "visible"
    confidence: float = ranged(0.95, 0, 1, low_open=True)  # FixMatch's tau
    lambda_u: float = ranged(1.0, 0, 100)
    unlabeled_ratio: int = ranged(7, 1, 64)  # FixMatch's mu: unlabelled images per labelled one in a batch
    steps_per_round: int | None = ranged(None, 1, MAX_COUNT)  # each local epoch this many batches (FedVC)
    partial_batch: PartialBatch | None = None  # every strategy's rule for an epoch's last batch; None: each its own
    participation: float = ranged(1.0, 0, 1, low_open=True)  # share of the nodes that train each round (keyed)
    model: tuple[str, ...] | str = ("cnn",)  # ARCH for every model, and NODE=ARCH: a node's own architecture
    pretrained: bool = False
    model_weights: Path | None = None
    eval_every: int = ranged(1, 1, MAX_COUNT)
    bootstrap: int = ranged(1000, 10, 100_000, why="resamples for the 95% intervals")
    eval_statistics: EvalStatistics = "stored"
    fold: int | None = ranged(None, 0, MAX_FOLDS - 1)
    cv: bool = False
    seed: int | None = ranged(None, 0, MAX_SEED)
    device: Device = "auto"
    engine: Engine = "inprocess"
    launch: Launch = "none"
    node: str | None = None  # distributed, one process per node: the node this process is
    timeout: float = ranged(300.0, 0, 7 * 86400, low_open=True, why="seconds")  # per transfer or collective
    cross_eval: bool = False
    threads: int | None = ranged(None, 1, MAX_THREADS)
    resume: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_ranges(self)
        object.__setattr__(self, "strategy", tuple(dict.fromkeys(self.strategy)))
        declared = [REGISTRY[name] for name in self.strategy]  # an unknown name is refused here
        if not self.strategy:
            raise UserError("no --strategy given")
        for name in self.strategy:
            REGISTRY.resolved_options(name, self.strategy_values())
        if self.fold is not None and self.cv:
            raise UserError("--fold and --cv exclude each other: --cv already runs every fold")
        if self.model_weights is not None and not Path(self.model_weights).is_file():
            raise UserError(f"--model-weights {self.model_weights} does not exist")
        object.__setattr__(self, "node_batch", tuple(self.node_batch))
        self.batch_sizes()
        object.__setattr__(self, "model", (self.model,) if isinstance(self.model, str) else tuple(self.model))
        default, own = architectures(self.model)
        moving = [d.name for d in declared if not d.own_architectures]
        if any(arch != default for arch in own.values()) and moving:
            allowed = " and ".join(d.name for d in REGISTRY if d.own_architectures)
            raise UserError(f"--model {' '.join(self.model)} gives nodes different architectures, which only "
                            f"{allowed} allow (their models never move or merge); {moving[0]} moves models: run it "
                            "separately with one architecture")
        if self.engine == "inprocess":
            for name, value in (("launch", self.launch != "none"), ("node", self.node), ("cross-eval", self.cross_eval)):
                if value:
                    raise UserError(f"--{name} applies to --engine distributed (the in-process engine runs every "
                                    "node and evaluates every model on every test set)")
        if self.node is not None and self.launch == "local":
            raise UserError("--node names the node of a process started by torchrun; --launch local assigns nodes "
                            "itself, so drop --node")
        if self.ssl != "none":
            plain = [d.name for d in declared if not d.semi_supervised]
            if plain:
                takes = ", ".join(d.name for d in REGISTRY if d.semi_supervised)
                raise UserError(f"--ssl {self.ssl} trains each node on its own unlabelled images, which {plain[0]} "
                                f"does not train on; strategies that take it: {takes}")
        if self.labels == "all" and self.ssl != "none":
            raise UserError("--labels all labels every training image, which leaves none for --ssl; drop one of them")
        if self.participation < 1:
            whole = [d.name for d in declared if not d.partial]
            if whole:
                takes = ", ".join(d.name for d in REGISTRY if d.partial)
                raise UserError(f"--participation {self.participation:g} leaves nodes out of a round, which {whole[0]} "
                                f"has no rule for; strategies that take it: {takes}")
        pooled = [d.name for d in declared if not d.distributed]
        if self.engine == "distributed" and pooled:
            raise UserError(f"{pooled[0]} pools every node's data in one place, so it has no distributed form; run it "
                            "with --engine inprocess")

    def strategy_values(self) -> dict[str, Any]:
        """The strategy options as given (None: each strategy's default)."""
        return {name: getattr(self, name) for name in REGISTRY.options()}

    def options_of(self, strategy: str) -> Any:
        """`strategy`'s options dataclass, resolved."""
        return REGISTRY.resolved_options(strategy, self.strategy_values())

    def batch_sizes(self) -> dict[str, int]:
        """--node-batch NODE=B pairs as a dict."""
        sizes = {}
        for item in self.node_batch:
            node, _, size = item.partition("=")
            if not node or not (size.isascii() and size.isdigit()):
                raise UserError(f"--node-batch {item!r} is not NODE=B with a positive integer B (e.g. montgomery=8)")
            field_range(SharedOptions, "batch").check(f"--node-batch {node}=B", int(size))
            sizes[node] = int(size)
        return sizes

    @property
    def init_epochs_resolved(self) -> int:
        return self.epochs if self.init_epochs is None else self.init_epochs


def option_field(field: dataclasses.Field) -> tuple[str, Any, dataclasses.Field]:
    """A strategy option as a config field: the same range, None by default (the strategy's default)."""
    return field.name, REGISTRY.option_type(field.name) | None, dataclasses.field(default=None, metadata=field.metadata)


FederateConfig = dataclasses.make_dataclass(
    "FederateConfig", [option_field(f) for f in REGISTRY.options().values()], bases=(SharedOptions,), frozen=True,
    namespace={"__doc__": SharedOptions.__doc__, "__module__": __name__})


def inapplicable(values: dict[str, Any]) -> set[str]:
    """Shared options (of a run's resolved values) that its other choices leave unused (SGD's momentum under
    Adam, the step schedule's settings under another schedule): they change no result, so no fingerprint."""
    unused = set() if values.get("optimizer") == "sgd" else {"sgd_momentum"}
    unused |= set() if semi_supervised(values) else set(FIXMATCH_OPTIONS)
    return unused | (set() if values.get("lr_schedule") == "step" else {"lr_step_epochs", "lr_step_factor"})


def semi_supervised(values: dict[str, Any]) -> bool:
    """Whether a run (its resolved values, or a one-strategy config's) trains with FixMatch: --ssl, or a
    strategy that always does."""
    names = values.get("strategy", ())
    names = (names,) if isinstance(names, str) else names
    return values.get("ssl", "none") != "none" or any(REGISTRY[name].fixmatch for name in names)


def resolved_options(cfg: FederateConfig, strategy: str) -> dict[str, Any]:
    """The values of the options `strategy` declares (given, or its defaults), as config.json records them."""
    return to_json(cfg.options_of(strategy))


def without_strategy_options(cfg: FederateConfig) -> dict[str, Any]:
    """The shared options of `cfg` as JSON values."""
    options = REGISTRY.options()
    return {k: v for k, v in to_json(cfg).items() if k not in options}


def select_keys() -> tuple[str, ...]:
    """What a recipe's [select] grid may vary: the shared keys, then every selectable strategy option."""
    return (*SHARED_SELECT_KEYS, *REGISTRY.selectable())


def varies_for(key: str, strategy: str) -> bool:
    """Whether a [select] key can change `strategy`'s result."""
    return key in SHARED_SELECT_KEYS or any(d.name == strategy for d in REGISTRY.declaring(key))
