"""What every strategy is: the hooks the engine calls, and a declaration of the facts the rest of
fedcli reads about it (option checks, help, fingerprints, the report's tables, checkpoints,
transfers, predict). A strategy module declares one or more `Declaration`s and nothing outside its
module lists its name.

Options are a small frozen dataclass per strategy whose fields are made by `option(...)`: a range,
a help line and a default. Two strategies may declare the same option name only with the same
meaning (type, range, help); their defaults may differ (the registry checks this).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.config import Range

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation

NODES = "nodes"  # the model key of a strategy with one model per node: each node's own name
ENSEMBLE = "ensemble"  # the key of the node models' mean softmax in metrics and predict
LABELS = "labels"  # the key of the test labels in predictions.safetensors (`labels/<test node>`)
GLOBAL_TEST = "global-test"  # the test node of the rows scored on the partition's global test set


def option(default: Any, low: float, high: float, help: str, select: bool = False, **bounds: Any) -> Any:
    """A strategy option: its default, accepted range and help; `select`: a [select] grid may vary it."""
    return dataclasses.field(default=default, metadata={"range": Range(low, high, **bounds), "help": help,
                                                        "select": select})


def flag(default: bool, help: str) -> Any:
    """An on/off strategy option."""
    return dataclasses.field(default=default, metadata={"help": help, "select": False})




@dataclasses.dataclass(frozen=True)
class NoOptions:
    """A strategy without options of its own."""


@dataclasses.dataclass(frozen=True)
class Declaration:
    """One strategy name and everything fedcli needs to know about it without running it."""

    name: str
    summary: str  # one line for `federate --help`
    build: Callable[[Any], "Strategy"]  # options -> a fresh strategy
    options: type = NoOptions
    model_key: str = NODES  # the models it produces: NODES, or one shared key (`global`, `central`)
    transfers: tuple[str, ...] = ()  # the transport kinds it sends in training
    needs_buffers: bool = False  # reads the nodes' synthetic buffers
    pooled: bool = False  # needs every node's data in one place: no distributed form
    own_architectures: bool = False  # node models never travel or merge, so --model NODE=ARCH is allowed
    families: tuple[str, ...] = ()  # the report's tables that compare it (report/feder_study.py)
    as_trained_on: str | None = None  # the BatchNorm table's batches, when not the node's real images
    bn_averaged: str | None = None  # the BatchNorm reading where the stored statistics are no single evaluating
    # node's own (averaged over nodes, or the last visited node's)
    discloses: dict[str, str] = dataclasses.field(default_factory=dict)  # transfer kind -> what it carries of
    # the nodes' images (the report names who received it)
    needs_shared_set: bool = False  # reads the partition's globally shared set (partition --shared-fraction)
    published: bool = False  # one node holds the shared model after a round; it is broadcast to be tested everywhere
    semi_supervised: bool = False  # its nodes train through LocalTrainer.train on their own images: --ssl applies
    partial: bool = False  # --participation applies: a round may leave nodes out of training and the average
    fixmatch: bool = False  # always trains with FixMatch (--ssl fixmatch implied): its peers label unlabelled images
    panel: str = "Strategy options"  # the `federate --help` panel of the options it declares first

    @property
    def distributed(self) -> bool:
        return not self.pooled

    def option_fields(self) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(self.options)


class Strategy(abc.ABC):
    """The hooks the engine calls; every strategy implements the three abstract ones."""

    name: str

    @abc.abstractmethod
    def setup(self, fed: "Federation", train: bool = True) -> None:
        """Initial models (round 0); `train=False` only builds them, for a resumed run."""

    @abc.abstractmethod
    def run_round(self, fed: "Federation", round_: int) -> None:
        """One exchange and E local epochs."""

    @abc.abstractmethod
    def models(self) -> dict[str, nn.Module]:
        """The models to evaluate, by `model_node` (a node name, or the declaration's shared key)."""

    def trained_on(self, fed: "Federation", node: str) -> tuple[TensorSource, TensorSource | None]:
        """The primary and replay sources `node` trained on in the last round (the BatchNorm diagnostic's
        as-trained batches)."""
        return fed.data.train[node], None

    def tables(self) -> dict[str, list[dict]]:
        """Measurements of its own beside metrics.csv (by file name: `<name>.csv`), every node's, gathered."""
        return {}

    def kept(self) -> dict[str, dict[str, torch.Tensor]]:
        """Samples of what the strategy sent, kept for an audit (by artifact name: `shared/<name>.safetensors`),
        as far as this process holds them; bounded in size."""
        return {}

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        """What a checkpoint holds; a key `<prefix>:<node>` is state only that node holds."""
        return {key: model.state_dict() for key, model in self.models().items()}

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        self.setup(fed, train=False)
        for key, model in self.models().items():
            model.load_state_dict(states[key])
