"""Local training of one run: the models' construction and the learning-rate budget shared by every
strategy (init-epochs + R x E epochs), and the keyed stream of each (key, round)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sized
from pathlib import Path

import torch
from torch import nn

from fedcli.core.errors import UserError
from fedcli.core.rng import keyed_global_rng, stream_seed, torch_stream
from fedcli.data.node_data import NodeData
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.config import architectures
from fedcli.models.classifier import build_classifier
from fedcli.training.fixmatch import Semi
from fedcli.training.local import Batches, LocalSettings, train_local
from fedcli.training.objectives import Objective

Compose = Callable[[TensorSource, "TensorSource | None", LocalSettings, torch.Generator], Sized]  # -> batches


@dataclasses.dataclass
class Budget:
    """How long and how fast every strategy trains: federate's local-training options under their own names
    (`of` reads them from the config), `init_epochs` and `node_batch` resolved."""

    epochs: int
    init_epochs: int
    rounds: int
    lr: float
    batch: int
    node_batch: dict[str, int] = dataclasses.field(default_factory=dict)
    lr_schedule: str = "constant"
    lr_step_epochs: int = 35
    lr_step_factor: float = 0.1
    optimizer: str = "adam"
    sgd_momentum: float = 0.9
    weight_decay: float = 0.0
    steps_per_round: int | None = None
    partial_batch: str | None = None  # --partial-batch: every strategy's rule for an epoch's last batch
    precision: str = "fp32"
    compile: bool = False

    @classmethod
    def of(cls, cfg) -> Budget:
        """A federate config's budget: each field is the option of its name."""
        resolved = {"init_epochs": cfg.init_epochs_resolved, "node_batch": cfg.batch_sizes()}
        return cls(**{f.name: resolved[f.name] if f.name in resolved else getattr(cfg, f.name)
                      for f in dataclasses.fields(cls)})

    @property
    def total_epochs(self) -> int:
        return self.init_epochs + self.rounds * self.epochs

    def span(self, round_: int, epochs: int) -> tuple[float, float]:
        """The fractions of the run's epochs (round 0's init-epochs, then R x E) done before and after
        `epochs` epochs of round `round_`: where a learning-rate schedule stands."""
        total = self.total_epochs
        start = 0 if round_ == 0 else self.init_epochs + (round_ - 1) * self.epochs
        return start / total, (start + epochs) / total


SHARED = [f.name for f in dataclasses.fields(LocalSettings)  # the options a call's settings copy from the budget
          if f.name in {g.name for g in dataclasses.fields(Budget)}]


class LocalTrainer:
    def __init__(self, data: NodeData, budget: Budget, seed: int, device: str = "cpu",
                 model: tuple[str, ...] | str = "cnn", pretrained: bool = False, model_weights: Path | None = None,
                 semi: Semi | None = None):
        self.data, self.budget, self.seed, self.device, self.semi = data, budget, seed, device, semi
        self.model_name, self.own_models = architectures(model)
        self.pretrained, self.model_weights = pretrained, model_weights
        self.spent: list[dict] = []  # one row per call of `train`: what it cost (the report's budget table)
        for option, given in (("--node-batch", budget.node_batch), ("--model", self.own_models)):
            unknown = sorted(set(given) - set(data.nodes))
            if unknown:
                raise UserError(f"{option} names {unknown[0]}, which is not a node; nodes: {', '.join(data.nodes)}")

    @property
    def epochs(self) -> int:
        return self.budget.epochs

    @property
    def init_epochs(self) -> int:
        return self.budget.init_epochs

    def batch_of(self, key: str) -> int:
        return self.budget.node_batch.get(key, self.budget.batch)

    def new_model(self, key: str) -> nn.Module:
        """A freshly initialised classifier; the same key always gives the same weights."""
        model = build_classifier(self.own_models.get(key, self.model_name), self.data.image_shape[0],
                                 self.data.num_classes, stream_seed(self.seed, "model-init", key), self.pretrained,
                                 self.model_weights)
        return model.to(self.device)

    def rebuild(self, key: str, state: dict[str, torch.Tensor]) -> nn.Module:
        """A model of `key`'s architecture holding `state`."""
        model = self.new_model(key)
        model.load_state_dict(state)
        return model

    def settings(self, key: str, round_: int, epochs: int) -> LocalSettings:
        budget = self.budget
        shared = {name: getattr(budget, name) for name in SHARED}
        return LocalSettings(**{**shared, "epochs": epochs, "batch": self.batch_of(key), "augment": self.data.augment,
                                "span": budget.span(round_, epochs), "budget_epochs": budget.total_epochs,
                                "steps_per_round": self.steps_per_round(key)})

    def steps_per_round(self, key: str) -> int | None:
        """--steps-per-round, else on a few-labels partition the steps of an epoch over all of a node's training
        images, labelled or not: the fully labelled upper bound's epoch, which the lower bounds and FixMatch then
        take too (over a few labels an epoch is a handful of steps, too few for any model to learn: issue 55);
        else None, an epoch over the labelled images."""
        if self.budget.steps_per_round or not (self.data.hides_labels and key in self.data.nodes):
            return self.budget.steps_per_round
        return math.ceil(self.data.training_images(key) / self.batch_of(key))

    def train(self, model: nn.Module, key: str, round_: int, primary: TensorSource, replay: TensorSource | None,
              epochs: int, objective: Objective | None = None, compose: Compose = Batches) -> int:
        """`epochs` epochs over `primary` (replaying `replay`) from the stream of (key, round); the steps taken.
        `compose` makes the batches from the sources (a strategy with other batches, such as two augmented
        views of unlabelled images, brings its own) and `objective` their loss."""
        settings = self.settings(key, round_, epochs)
        batches = compose(primary, replay, settings, torch_stream(self.seed, key, round_, "local-train"))
        if self.semi is not None and key in self.data.nodes:  # --ssl: the node's unlabelled images join
            batches, objective = self.semi.compose(batches, objective, self.data.unlabeled[key], self.data.augment,
                                                   torch_stream(self.seed, key, round_, "fixmatch"), settings)
        seen = {"real": 0, "replayed": 0}

        def count(images: torch.Tensor, labels: torch.Tensor, n_primary: int) -> None:
            seen["real"] += n_primary
            seen["replayed"] += len(labels) - n_primary

        with keyed_global_rng(self.seed, key, round_, "dropout", device=self.device):  # EfficientNet's dropout
            steps = train_local(model, batches, settings, self.device, objective, on_batch=count)
        self.spent.append({"round": round_, "key": key, "steps": steps, **seen})
        return steps
