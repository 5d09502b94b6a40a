"""Typed stage configurations: a TOML recipe plus CLI options resolve into one config.

Precedence: an option given on the command line, else the recipe's `[stage]` table, else the
option's default. Recipe keys are the command's option names (`test-fraction` or
`test_fraction`); an unknown key or table is an error that names the valid ones.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from fedcli.errors import UserError

STAGE_TABLES = ("partition", "train_gan", "federate", "audit", "report")
RECIPE_TABLES = (*STAGE_TABLES, "sweep", "select")  # the last two: `fedcli run` only

Source = Literal["digits", "tuberculosis", "isic2019", "medmnist", "folders", "csv"]
Scheme = Literal["source", "iid", "dirichlet", "site-shift"]
Task = Literal["melanoma", "multiclass"]


@dataclasses.dataclass(frozen=True)
class PartitionConfig:
    exp: Path
    source: Source = "digits"
    data_dir: Path | None = None
    scheme: Scheme | None = None
    nodes: int | None = None
    alpha: float = 0.5
    site: str | None = None
    task: Task = "melanoma"
    test_fraction: float = 0.2
    folds: int = 5
    image_size: int = 32
    channels: int | None = None
    seed: int = 0
    overwrite: bool = False

    def __post_init__(self) -> None:
        size = self.image_size
        if size < 16 or size & (size - 1):
            raise UserError(f"--image-size must be a power of two >= 16 (16, 32, 64, ...), got {size}")
        if not 0.0 < self.test_fraction < 1.0:
            raise UserError(f"--test-fraction must lie strictly between 0 and 1, got {self.test_fraction}")
        if self.folds < 2:
            raise UserError(f"--folds must be at least 2, got {self.folds}")
        if self.nodes is not None and self.nodes < 2:
            raise UserError(f"--nodes must be at least 2, got {self.nodes}")
        if self.alpha <= 0:
            raise UserError(f"--alpha must be positive, got {self.alpha}")
        if self.channels not in (None, 1, 3):
            raise UserError(f"--channels must be 1 or 3, got {self.channels}")
        if self.source == "digits" and self.data_dir is not None:
            raise UserError("--data-dir is not used by --source digits (built-in data); drop it")
        if self.source != "digits" and self.data_dir is None:
            raise UserError(f"--source {self.source} reads real data: pass --data-dir DIR")
        if self.scheme == "source" and self.nodes is not None:
            raise UserError("--nodes does not apply to --scheme source (one node per site); drop it")
        if self.scheme == "source" and self.site is not None:
            raise UserError("--site keeps one site, so --scheme source would give one node; use --scheme iid")

def to_json(cfg) -> dict[str, Any]:
    """A resolved config as JSON values (paths as strings, tuples as lists), for config.json."""
    def plain(value: Any) -> Any:
        return str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value

    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}


def read_recipe(path: Path) -> dict[str, Any]:
    """A recipe's tables, after checking the file parses and names only known tables."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"recipe {path} not found; check the path")
    try:
        recipe = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"recipe {path} is not valid TOML ({exc})") from exc
    unknown_tables = sorted(set(recipe) - set(RECIPE_TABLES))
    if unknown_tables:
        raise UserError(f"recipe {path}: unknown table [{unknown_tables[0]}]; valid tables: {', '.join(RECIPE_TABLES)}")
    for name, table in recipe.items():
        if not isinstance(table, dict):
            raise UserError(f"recipe {path}: [{name}] must be a table of option = value")
    return recipe


def stage_values(cls: type, stage: str, table: dict[str, Any], origin: str) -> dict[str, Any]:
    """A recipe table's values for `cls`, keyed by field name and checked against the field types."""
    fields = {f.name for f in dataclasses.fields(cls)} - {"exp"}
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in fields:
            names = ", ".join(f.name.replace("_", "-") for f in dataclasses.fields(cls) if f.name in fields)
            raise UserError(f"{origin}: unknown key {stage}.{key}; valid keys: {names}")
        values[name] = coerce(value, hints[name], f"{origin}: {stage}.{name.replace('_', '-')}")
    return values


def resolve(cls: type, cli: dict[str, Any], given_on_cli: set[str], recipe_path: Path | None, stage: str):
    """Build `cls` from CLI values (winning where given), the recipe, and the defaults."""
    recipe = {} if recipe_path is None else read_recipe(recipe_path).get(stage, {})
    values = stage_values(cls, stage, recipe, f"recipe {recipe_path}")
    values = {name: values[name] if name in values and name not in given_on_cli else cli[name]
              for name in (f.name for f in dataclasses.fields(cls))}
    if values.get("exp") is None:
        raise UserError("no experiment folder: pass --exp DIR")
    return cls(**values)


def coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check a TOML value against a config field's type, converting str to Path where needed."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return coerce(value, options[0], key) if len(options) == 1 else value
    if origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UserError(f"{key} = {value!r} must be a list of strings")
        return tuple(value)
    if origin is Literal:
        if value not in args:
            raise UserError(f"{key} = {value!r} is not one of {', '.join(map(str, args))}")
        return value
    if annotation is Path and isinstance(value, str):
        return Path(value).expanduser()
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation in (int, float, str, bool) and type(value) is annotation:
        return value
    raise UserError(f"{key} = {value!r} must be of type {getattr(annotation, '__name__', annotation)}")


LpipsNet = Literal["vgg", "alex"]
Device = Literal["auto", "cpu", "cuda"]


@dataclasses.dataclass(frozen=True)
class GanConfig:
    """`fedcli train-gan`. Defaults are the quick CPU configuration (about a minute per digits node);
    the study's values (batch 32, lr 0.0025, 256x256, patience 10,000, VGG) belong in recipes."""

    exp: Path
    node: str | None = None
    seed: int | None = None  # default: the partition's seed
    iterations: int = 400
    patience: int = 200
    pp_iterations: int = 100
    fid_every: int = 50
    fid_images: int = 512
    fid_factor: float = 2.5
    alpha: float = 1.0
    batch: int = 32
    lr: float = 0.0025
    r1_gamma: float = 0.05
    ada_target: float = 0.6
    ada_kimg: float = 20.0
    z_dim: int = 64
    w_dim: int = 64
    channel_base: int = 512
    channel_max: int = 64
    lpips_net: LpipsNet = "alex"
    lpips_weights: Path | None = None
    fid_weights: Path | None = None
    buffer_size: int = 512
    sample_only: bool = False
    device: Device = "auto"
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.alpha < 0:
            raise UserError(f"--alpha must be >= 0 (0 disables the privacy loss), got {self.alpha}")
        for name in ("iterations", "fid_every", "fid_images", "batch", "buffer_size", "z_dim", "w_dim",
                     "channel_base", "channel_max"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.pp_iterations < 0 or self.patience < 1:
            raise UserError("--pp-iterations must be >= 0 and --patience >= 1")
        if self.fid_factor < 1:
            raise UserError(f"--fid-factor must be >= 1, got {self.fid_factor}")
        if self.batch < 2:
            raise UserError(f"--batch must be at least 2, got {self.batch}")
        for name in ("lpips_weights", "fid_weights"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise UserError(f"--{name.replace('_', '-')} {path} does not exist")


ModelName = Literal["cnn", "resnet18", "resnet50", "densenet121"]
BufferCodec = Literal["png", "raw"]
Engine = Literal["inprocess", "distributed"]
Launch = Literal["none", "local"]
ENGINE_OPTIONS = ("engine", "launch", "node", "timeout", "cross_eval", "threads")  # how a run executes, not what


@dataclasses.dataclass(frozen=True)
class FederateConfig:
    """`fedcli federate`. Defaults are a quick CPU configuration (small CNN, few rounds); the study
    used ResNet-18, R = 100, E = 100, lr 1e-4."""

    exp: Path
    strategy: tuple[str, ...] = ("feder",)
    rounds: int = 10
    epochs: int = 1
    init_epochs: int | None = None  # default: epochs
    lr: float = 1e-3
    batch: int = 32
    node_batch: tuple[str, ...] = ()  # NODE=B overrides, e.g. montgomery=8 (the study's per-node sizes)
    lam: float = 0.5
    mu: float = 0.01
    buffer_size: int | None = None  # default: the whole buffer
    buffer_codec: BufferCodec = "png"
    model: ModelName = "cnn"
    pretrained: bool = False
    model_weights: Path | None = None
    eval_every: int = 1
    bootstrap: int = 1000
    fold: int | None = None
    cv: bool = False
    seed: int | None = None
    device: Device = "auto"
    engine: Engine = "inprocess"
    launch: Launch = "none"
    node: str | None = None  # distributed, one process per node: the node this process is
    timeout: float = 300.0  # seconds any transfer or collective may wait for a peer
    cross_eval: bool = False
    threads: int | None = None
    resume: bool = False
    overwrite: bool = False

    def __post_init__(self) -> None:
        from fedcli.fl.strategies import POOLED, STRATEGIES

        object.__setattr__(self, "strategy", tuple(dict.fromkeys(self.strategy)))
        for name in self.strategy:
            if name not in STRATEGIES:
                raise UserError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
        if not self.strategy:
            raise UserError("no --strategy given")
        for name in ("rounds", "epochs", "batch", "eval_every"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.init_epochs is not None and self.init_epochs < 0:
            raise UserError(f"--init-epochs must be >= 0, got {self.init_epochs}")
        if self.mu < 0:
            raise UserError(f"--mu must be >= 0, got {self.mu}")
        if not 0.0 <= self.lam <= 1.0:
            raise UserError(f"--lam (lambda, the weight of the real-data loss) must lie in [0, 1], got {self.lam}")
        if self.buffer_size is not None and self.buffer_size < 0:
            raise UserError(f"--buffer-size must be >= 0, got {self.buffer_size}")
        if self.bootstrap < 10:
            raise UserError(f"--bootstrap needs at least 10 resamples, got {self.bootstrap}")
        if self.fold is not None and self.cv:
            raise UserError("--fold and --cv exclude each other: --cv already runs every fold")
        if self.model_weights is not None and not Path(self.model_weights).is_file():
            raise UserError(f"--model-weights {self.model_weights} does not exist")
        object.__setattr__(self, "node_batch", tuple(self.node_batch))
        self.batch_sizes()
        if self.engine == "inprocess":
            for name, value in (("launch", self.launch != "none"), ("node", self.node), ("cross-eval", self.cross_eval)):
                if value:
                    raise UserError(f"--{name} applies to --engine distributed (the in-process engine runs every "
                                    "node and evaluates every model on every test set)")
        if self.node is not None and self.launch == "local":
            raise UserError("--node names the node of a process started by torchrun; --launch local assigns nodes "
                            "itself, so drop --node")
        pooled = [name for name in self.strategy if name in POOLED]
        if self.engine == "distributed" and pooled:
            raise UserError(f"{pooled[0]} pools every node's data in one place, so it has no distributed form; run it "
                            "with --engine inprocess")
        if self.timeout <= 0:
            raise UserError(f"--timeout must be positive, got {self.timeout}")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"--threads must be at least 1, got {self.threads}")

    def batch_sizes(self) -> dict[str, int]:
        """--node-batch NODE=B pairs as a dict."""
        sizes = {}
        for item in self.node_batch:
            node, _, size = item.partition("=")
            if not node or not size.isdigit() or int(size) < 1:
                raise UserError(f"--node-batch {item!r} is not NODE=B with a positive integer B (e.g. montgomery=8)")
            sizes[node] = int(size)
        return sizes


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """`fedcli audit-privacy`. Defaults are quick (100 projection steps); the study used 1000."""

    exp: Path
    node: str | None = None
    max_images: int = 200  # per group (members, non-members)
    steps: int = 100
    batch_size: int = 32
    lr: float = 0.1
    optimize_noise: bool = False
    max_auroc: float = 0.6
    min_distance: float = 0.0
    strict: bool = False
    seed: int | None = None
    device: Device = "auto"
    overwrite: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "max_images"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0.5 <= self.max_auroc <= 1.0:
            raise UserError(f"--max-auroc must lie in [0.5, 1], got {self.max_auroc}")
        if self.min_distance < 0:
            raise UserError(f"--min-distance must be >= 0, got {self.min_distance}")


Metric = Literal["accuracy", "balanced-accuracy", "f1", "auroc"]
METRIC_COLUMNS = {"accuracy": "accuracy", "balanced-accuracy": "balanced_accuracy", "f1": "f1_macro", "auroc": "auroc"}


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """`fedcli report`: which metric the tables and figures show (the study: accuracy)."""

    exp: Path
    metric: Metric = "accuracy"
