"""`fedcli federate`'s resolved configuration: the options every strategy shares, plus one field per
option that some strategy declares (federate/strategies/), made from the registry so that the recipe,
`--set`, [select] and the range checks treat both alike.

A strategy option's field defaults to None, "the strategy's own default": two strategies may declare
one option with different defaults (`--server-lr`: 0.01 for the adaptive ones, 1 for FedAvgM), and
each run records its resolved value in its config.json (`resolved_options`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

from fedcli.core import plugins
from fedcli.core.precision import COMPILE_HELP, PRECISION_HELP, Precision, check_precision
from fedcli.core.errors import UserError
from fedcli.experiment.config import (EXP_HELP, MAX_BATCH, MAX_COUNT, MAX_FOLDS, MAX_SEED, MAX_THREADS, Device, FederateEngine,
                                      Launch, architectures, check_ranges, field_range, option, ranged, to_json)
from fedcli.experiment.panels import ENGINE, EVALUATION, FEW_LABELS, OUTPUT, TRAINING
from fedcli.federate.strategies import REGISTRY

LrSchedule = Literal["constant", "cosine", "step"]  # over init-epochs + R x E epochs (training/local.py)
Optimizer = Literal["adam", "sgd"]
Weighting = Literal["samples", "equal"]  # averaging weights: train-set sizes (FedAvg's paper), or equal (FedBN's code)
Ssl = Literal["none", "fixmatch"]  # --ssl: the local objective on a few-labels partition (training/fixmatch.py)
PartialBatch = Literal["keep", "drop"]  # an epoch's last partial batch (training/local.py epoch_images)
EvalStatistics = Literal["stored", "local"]  # BatchNorm statistics models are scored with (federate/evaluator.py)
Labels = Literal["visible", "all"]  # --labels all: the oracle of the upper bounds (partition/hidden_labels.json)
FIXMATCH_OPTIONS = ("confidence", "lambda_u", "unlabeled_ratio")
ENGINE_OPTIONS = ("engine", "launch", "node", "bundle", "timeout", "cross_eval", "threads")  # how a run executes, not what
SHARED_SELECT_KEYS = ("rounds", "epochs", "lr")  # what a [select] grid may vary for every strategy


@dataclasses.dataclass(frozen=True)
class SharedOptions:
    """`fedcli federate`'s options for every strategy. Defaults are a quick CPU configuration (small CNN,
    few rounds); the study used ResNet-18, R = 100, E = 100, lr 1e-4."""

    exp: Path = option(panel=OUTPUT, help=EXP_HELP)
    strategy: tuple[str, ...] = option(("feder",), panel=TRAINING,
                                       help=f"Repeatable: {', '.join(REGISTRY.names())} (listed above).")
    rounds: int = ranged(10, 1, MAX_COUNT, panel=TRAINING, help="Federated rounds R.")
    epochs: int = ranged(1, 1, MAX_COUNT, panel=TRAINING, help="Local epochs E per round.")
    # default: epochs
    init_epochs: int | None = ranged(None, 0, MAX_COUNT, panel=TRAINING, help=(
        "Epochs before round 1 (round 0): each node trains its own model (FedER's M^0), or the common initial model, "
        "then averaged (FedAvg, FedProx, FedBN) \\[default: E]."))
    lr: float = ranged(1e-3, 0, 1, low_open=True, panel=TRAINING, help="Learning rate (a fresh optimiser every round).")
    lr_schedule: LrSchedule = option("constant", panel=TRAINING, help=(
        "constant; cosine: from --lr down to 0, step by step, over the whole budget (init-epochs + R x E), the same "
        "for every strategy, so the final weights are at rest; step: --lr times --lr-step-factor every "
        "--lr-step-epochs epochs of that budget."))
    # step: lr x factor every this many epochs of the budget
    lr_step_epochs: int = ranged(35, 1, MAX_COUNT, panel=TRAINING, help=(
        "--lr-schedule step: epochs between decays (the generative-replay study: 35)."))
    lr_step_factor: float = ranged(0.1, 0, 1, low_open=True, panel=TRAINING, help=(
        "--lr-schedule step: the factor of each decay (the generative-replay study: 0.1)."))
    optimizer: Optimizer = option("adam", panel=TRAINING, help=(
        "adam (FedER's study), or sgd with --sgd-momentum (the generative-replay study's)."))
    sgd_momentum: float = ranged(0.9, 0, 1, high_open=True, panel=TRAINING, help="--optimizer sgd: momentum.")
    weight_decay: float = ranged(0.0, 0, 1, panel=TRAINING, help="L2 weight decay of either optimiser.")
    batch: int = ranged(32, 1, MAX_BATCH, panel=TRAINING, help=(
        "Real images per mini-batch (FedER adds as many buffer images)."))
    # NODE=B overrides, e.g. montgomery=8 (the study's per-node sizes)
    node_batch: tuple[str, ...] = option((), panel=TRAINING, help=(
        "Repeatable NODE=B: a node's own batch size (the study: shenzhen=32, montgomery=8)."))
    weighting: Weighting = option("samples", panel=TRAINING, help=(
        "Averaging strategies: weight each node's model by its train-set size (samples) or equally (equal, as "
        "FedBN's code and the study)."))
    ssl: Ssl = option("none", panel=FEW_LABELS, help=(
        "Few labels (partition --labeled-fraction): fixmatch trains each node also on its unlabelled images "
        "(FixMatch: standalone is local FixMatch, fedavg is SSFL); none: the visible labels only (the lower bound)."))
    labels: Labels = option("visible", panel=FEW_LABELS, help=(
        "Few labels: all gives every training image its hidden label (partition/hidden_labels.json), the oracle of "
        "the upper bounds; visible: only the labels the partition shows."))
    # FixMatch's tau
    confidence: float = ranged(0.95, 0, 1, low_open=True, panel=FEW_LABELS, help=(
        "FixMatch: the confidence a weak view's prediction needs to become a pseudo label (tau; FedPerl's code 0.6)."))
    lambda_u: float = ranged(1.0, 0, 100, panel=FEW_LABELS, help=(
        "FixMatch: the unlabelled loss's weight (FedPerl's code 0.5)."))
    # FixMatch's mu: unlabelled images per labelled one in a batch
    unlabeled_ratio: int = ranged(7, 1, 64, panel=FEW_LABELS, help=(
        "FixMatch: unlabelled images per labelled one in a batch (mu; FedPerl's code 1)."))
    # each local epoch this many batches (FedVC)
    steps_per_round: int | None = ranged(None, 1, MAX_COUNT, panel=TRAINING, help=(
        "Each local epoch is this many batches, the labelled images cycled without replacement, whatever a node's "
        "size (FedVC; FedPerl's 100) \\[default: one pass over them]."))
    # every strategy's rule for an epoch's last batch; None: each its own
    partial_batch: PartialBatch | None = option(None, panel=TRAINING, help=(
        "An epoch's last, partial batch for every strategy: keep (ceil(n/b) steps) or drop (floor(n/b), full batches "
        "only, the generative-replay study's) \\[default: each strategy's own: cwt, cwt-replay drop, the others "
        "keep]."))
    # share of the nodes that train each round (keyed)
    participation: float = ranged(1.0, 0, 1, low_open=True, panel=TRAINING, help=(
        "Averaging strategies: the share of the nodes that train in each round after round 0, round(share x nodes) "
        "of them (at least one), drawn per seed and round (FedPerl's 30%)."))
    # ARCH for every model, and NODE=ARCH: a node's own architecture
    model: tuple[str, ...] | str = option(("cnn",), panel=TRAINING, help=(
        "Repeatable. Classifier: cnn (quick), resnet18 (the FedER study), resnet34 (the generative-replay study), "
        "resnet50, densenet121, efficientnet_b0 (FedPerl's), or module:factory, your own "
        "(factory(in_channels, num_classes) returns the classifier; docs/python.md); NODE=ARCH gives a node its own "
        f"({' and '.join(d.name for d in REGISTRY if d.own_architectures)} only: their models never move)."
        + plugins.listed("models")))
    pretrained: bool = option(False, panel=TRAINING, help=(
        "Start from ImageNet weights (torch hub cache or --model-weights)."))
    model_weights: Path | None = option(None, panel=TRAINING, help="torchvision ImageNet state dict for --pretrained.")
    eval_every: int = ranged(1, 1, MAX_COUNT, panel=EVALUATION, help="Rounds between evaluations (and the last).")
    bootstrap: int = ranged(1000, 10, 100_000, why="resamples for the 95% intervals", panel=EVALUATION, help=(
        "Bootstrap resamples for 95% intervals."))
    eval_statistics: EvalStatistics = option("stored", panel=EVALUATION, help=(
        "BatchNorm statistics every model is scored with: stored (its running statistics, as trained and averaged) "
        "or local (re-estimated on the evaluating node's own training images, labels unread: a hospital calibrating a "
        "received model)."))
    fold: int | None = ranged(None, 0, MAX_FOLDS - 1, panel=EVALUATION, help=(
        "Train on the other train folds, evaluate on fold k (model selection without the test set)."))
    cv: bool = option(False, panel=EVALUATION, help="Run every fold and report mean and std.")
    seed: int | None = ranged(None, 0, MAX_SEED, panel=OUTPUT, help="Seed \\[default: the partition's].")
    device: Device = option("auto", panel=ENGINE, help="auto (CUDA when present), cpu or cuda.")
    precision: Precision = option("fp32", panel=ENGINE, help=PRECISION_HELP)
    compile: bool = option(False, panel=ENGINE, help=COMPILE_HELP)
    engine: FederateEngine = option("inprocess", panel=ENGINE, help=(
        "inprocess (every node simulated here), distributed (one torch.distributed process per node: gloo on CPU, "
        "nccl on CUDA) or flower (one process per node, its payloads sealed and relayed by a Flower SuperLink: "
        "docs/deploy.md)."))
    launch: Launch = option("none", panel=ENGINE, help=(
        "local: start one process per node on this machine (loopback); none: this process is one node, started by "
        "torchrun."))
    # distributed, one process per node: the node this process is
    node: str | None = option(None, flags=("--node", "--node-name"), panel=ENGINE, help=(
        "Distributed: the node this process is \\[default: by rank]. Under torchrun write --node-name (torchrun "
        "reads --node as its --node-rank)."))
    bundle: Path | None = option(None, panel=ENGINE, help=(
        "Flower: this node's bundle folder from fedcli deploy (its key, the allow-list, the CA certificate, the "
        "SuperLink's address)."))
    # per transfer or collective
    timeout: float = ranged(300.0, 0, 7 * 86400, low_open=True, why="seconds", panel=ENGINE, help=(
        "Distributed: seconds any transfer or collective waits for a peer before the run stops."))
    cross_eval: bool = option(False, panel=EVALUATION, help=(
        "Distributed: send every node's model to every node to fill the model x test-set matrix (counted as eval "
        "traffic)."))
    threads: int | None = ranged(None, 1, MAX_THREADS, panel=ENGINE, help=(
        "CPU threads per process \\[default: torch's; distributed local: cores / nodes]."))
    resume: bool = option(False, panel=OUTPUT, help=(
        "Continue from the last completed round (either engine's checkpoint)."))
    overwrite: bool = option(False, panel=OUTPUT, help="Replace existing strategy folders.")

    def __post_init__(self) -> None:
        check_ranges(self)
        check_precision(self.precision, self.device)
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
            for name, value in (("launch", self.launch != "none"), ("node", self.node), ("cross-eval", self.cross_eval),
                                ("bundle", self.bundle)):
                if value:
                    raise UserError(f"--{name} applies to --engine distributed or flower (the in-process engine runs "
                                    "every node and evaluates every model on every test set)")
        if self.bundle is not None and self.engine != "flower":
            raise UserError("--bundle is a Flower node's set-up: it applies to --engine flower")
        if self.engine == "flower" and self.launch == "none" and self.bundle is None:
            raise UserError("--engine flower needs this node's --bundle (made by fedcli deploy setup), or --launch "
                            "local to run every node here")
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
        if self.engine != "inprocess" and pooled:
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
