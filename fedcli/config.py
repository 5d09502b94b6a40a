"""Typed stage configurations: a TOML recipe plus CLI options resolve into one config.

Precedence: an option given on the command line, else the recipe's `[stage]` table, else the
option's default. Recipe keys are the command's option names (`test-fraction` or
`test_fraction`); an unknown key or table is an error that names the valid ones.

Numbers: every int and float field declares its range next to it (`ranged(default, low, high)`),
and every config's `__post_init__` starts with `check_ranges`, the one rule for every numeric
option, however it arrives (command line, recipe, `--set`, a sweep or a `[select]` grid): NaN is
refused (it passes any `x < low` test), so is +-inf (no option gives it a meaning), and so is any
value outside [low, high] (a typo such as `--rounds 1e20` or `--image-size 1048576` must not start
hours of work or a terabyte allocation). A keyword value (a string such as `auto`, declared in the
field's type) is not a number and skips the range; its meaning belongs in the option's help.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from fedcli.errors import UserError
from fedcli.layout import check_experiment_folder

STAGE_TABLES = ("partition", "train_gan", "federate", "audit", "report")
RECIPE_TABLES = (*STAGE_TABLES, "sweep", "select", "regime")  # the last three: `fedcli run` only

Source = Literal["digits", "tuberculosis", "isic2019", "medmnist", "folders", "csv", "retinopathy"]
Scheme = Literal["source", "iid", "dirichlet", "site-shift", "skew"]
Task = Literal["melanoma", "multiclass"]
Preprocess = Literal["none", "graham"]  # how each image is prepared before resizing (data/graham.py)

MAX_COUNT = 10**6  # iterations, steps, rounds, epochs, images: beyond any study run, below a typo's 1e20
MAX_SEED = 2**63 - 1  # seeds are hashed into keyed streams (rng.py); any int64 works
MAX_BATCH = 4096
MAX_THREADS = 1024
MAX_FOLDS = 100
# Every stage holds a node's images in memory as N x C x S x S uint8: 3 MiB per RGB image at 1024 px,
# so 10,000 images already need 30 GiB (and the GAN's activations grow with S x S too).
MAX_IMAGE_SIZE = 1024
RETINA_PER_CLASS = 6000  # the generative-replay study's per class: 3000 training + 1500 validation + 1500 test
BIT_DEPTHS = (8, 10, 12, 14, 16)  # --bit-depth: deeper-than-8-bit data's full scale is 2^N - 1 (data/pixelscale.py)


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric option accepts: low..high, either end open or closed; never NaN or +-inf."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    why: str = ""  # what the bounds mean, for the message
    inf_allowed: bool = False  # +inf is a value of its own (--dp-epsilon inf: no noise), named in `why`

    def check(self, flag: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return  # None (chosen later, e.g. the partition's seed) or a keyword value
        if math.isnan(value):
            raise UserError(f"{flag} must be a number, got {value}")
        if math.isinf(value) and not (self.inf_allowed and value > 0):
            raise UserError(f"{flag} must be a finite number, got {value}")
        below = value <= self.low if self.low_open else value < self.low
        above = not math.isinf(value) and (value >= self.high if self.high_open else value > self.high)
        if below or above:
            why = f" ({self.why})" if self.why else ""
            raise UserError(f"{flag} must {self.describe()}{why}, got {value}")

    def describe(self) -> str:
        low, high = (str(x) if isinstance(x, int) else f"{x:g}" for x in (self.low, self.high))
        if self.low == 0 and self.low_open:
            return f"be positive and {'below' if self.high_open else 'at most'} {high}"
        return f"lie in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


# Options added after experiments existed, at the value that reproduces those experiments' numbers: left out of
# fingerprints and checkpoint checks at that value, so adding an option never reruns or refuses an existing run.
UNCHANGED_AT = {"ks": None, "train_size": None, "class_mix": [], "shared_fraction": 0.0, "labeled_fraction": 1.0, "validation_fraction": 0.0,
                "labeled_nodes": None, "held_apart_fraction": 0.0, "held_apart_node": None, "communities": [], "scanners": [], "ssl": "none", "labels": "visible",
                "steps_per_round": None, "partial_batch": None, "global_test": 0, "participation": 1.0, "eval_statistics": "stored", "forgetting": False, "optimizer": "adam", "weight_decay": 0.0,
                "vq_lr": 4e-4, "vq_beta": 0.25, "vq_decay": 0.99, "vq_codebook": 64, "vq_dim": 32, "vq_channels": 64,
                "prior_iterations": 0, "prior_channels": 64, "prior_layers": 4, "dp_noise": "keyed",
                "retina_balanced": False, "retina_per_class": RETINA_PER_CLASS, "retina_preprocess": "none"}


def settled(values: dict[str, Any]) -> dict[str, Any]:
    """`values` less the options that are at the value every run had before they existed (UNCHANGED_AT)."""
    return {k: v for k, v in values.items() if not (k in UNCHANGED_AT and v == UNCHANGED_AT[k])}


def ranged(default: Any, low: float, high: float, **bounds: Any) -> Any:
    """A config field with its accepted range (see Range), kept in the field's metadata."""
    return dataclasses.field(default=default, metadata={"range": Range(low, high, **bounds)})


GIVEN = dataclasses.field(default=frozenset(), compare=False, repr=False, metadata={"internal": True})
"""A config's record of the options given on the command line or in a recipe table (`resolve`,
pipeline/recipe.py), so that a check reads what the user set, not what differs from a default. Internal: no
option, no recipe key, never in config.json or a fingerprint; `dataclasses.replace` keeps it."""


def user_fields(cls: Any) -> list[dataclasses.Field]:
    """The fields that are options (every field but the internal record of what was given)."""
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def given_fields(cls: type, names) -> dict[str, frozenset[str]]:
    """`given=` for a config class that records what was given, else nothing."""
    return {"given": frozenset(names)} if "given" in {f.name for f in dataclasses.fields(cls)} else {}


def field_range(cls: type, name: str) -> Range:
    return next(f for f in dataclasses.fields(cls) if f.name == name).metadata["range"]


def check_ranges(cfg: Any) -> None:
    """The one numeric rule: each field's declared range, reported under its option name."""
    for field in dataclasses.fields(cfg):
        if "range" in field.metadata:
            field.metadata["range"].check(f"--{field.name.replace('_', '-')}", getattr(cfg, field.name))


@dataclasses.dataclass(frozen=True)
class PartitionConfig:
    exp: Path
    source: Source = "digits"
    data_dir: Path | None = None
    scheme: Scheme | None = None
    nodes: int | None = ranged(None, 2, MAX_COUNT)
    alpha: float = ranged(0.5, 0, 1000, low_open=True)
    ks: float | None = ranged(None, 0, 1)
    shared_fraction: float = ranged(0.0, 0, 0.5)
    global_test: int = ranged(0, 0, MAX_COUNT)  # a class-balanced test set set apart first (data/global_test.py)
    labeled_fraction: float = ranged(1.0, 0, 1, low_open=True, why="1: every training label visible")
    validation_fraction: float = ranged(0.0, 0, 0.5, high_open=True)
    labeled_nodes: tuple[str, ...] | None = None  # None: every node; ("none",): none (labels only held apart)
    held_apart_fraction: float = ranged(0.0, 0, 0.5, high_open=True)
    held_apart_node: str | None = None  # default: the first node
    communities: tuple[int, ...] = ranged((), 1, MAX_COUNT)  # site-shift: consecutive nodes sharing a scanner,
    # by group size (5 3 1 1)
    scanners: tuple[str, ...] = ()  # site-shift: the simulated scanners in order (acquisition.NAMES); (): all six
    site: str | None = None
    task: Task = "melanoma"
    retina_balanced: bool = False  # retinopathy: the study's selection, retina_per_class images of each class
    retina_per_class: int = ranged(RETINA_PER_CLASS, 1, MAX_COUNT)
    retina_preprocess: Preprocess = "none"
    positive_class: str | None = None  # a binary task's finding; default: the source's second class
    test_fraction: float = ranged(0.2, 0, 1, low_open=True, high_open=True)
    train_size: int | None = ranged(None, 2, MAX_COUNT)  # at most this many train images per node (a smaller site)
    class_mix: tuple[str, ...] = ()  # NODE=CLASS:SHARE: that node's images drawn to that share (data/class_mix.py)
    folds: int = ranged(5, 2, MAX_FOLDS)
    image_size: int = ranged(32, 16, MAX_IMAGE_SIZE, why="a power of two; each stage holds a node's images in "
                             "memory as N x C x S x S bytes")
    channels: int | None = ranged(None, 1, 3)
    bit_depth: int | Auto = ranged("auto", 8, 16, why="8, 10, 12, 14, 16 or auto")
    seed: int = ranged(0, 0, MAX_SEED)
    threads: int | None = ranged(None, 1, MAX_THREADS)
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_ranges(self)
        size = self.image_size
        if size & (size - 1):
            raise UserError(f"--image-size must be a power of two >= 16 (16, 32, 64, ...), got {size}")
        if self.channels not in (None, 1, 3):
            raise UserError(f"--channels must be 1 or 3, got {self.channels}")
        if self.source == "digits" and self.data_dir is not None:
            raise UserError("--data-dir is not used by --source digits (built-in data); drop it")
        if self.source != "digits" and self.data_dir is None:
            raise UserError(f"--source {self.source} reads real data: pass --data-dir DIR")
        check_retina(self)
        if self.scheme == "source" and self.nodes is not None:
            raise UserError("--nodes does not apply to --scheme source (one node per site); drop it")
        if self.scheme == "source" and self.site is not None:
            raise UserError("--site keeps one site, so --scheme source would give one node; use --scheme iid")
        if (self.scheme == "skew") != (self.ks is not None):
            raise UserError("--scheme skew needs --ks K (the mean pairwise label skew to reach)" if self.ks is None
                            else "--ks applies only to --scheme skew; drop it or add --scheme skew")
        if self.labeled_nodes is not None:  # none given (an empty list): every node; ("none",): no node
            object.__setattr__(self, "labeled_nodes", tuple(self.labeled_nodes) or None)
        object.__setattr__(self, "communities", tuple(self.communities))
        object.__setattr__(self, "scanners", tuple(self.scanners))
        object.__setattr__(self, "class_mix", tuple(self.class_mix))
        for size in self.communities:
            field_range(PartitionConfig, "communities").check("--communities", size)
        if self.held_apart_node is not None and not self.held_apart_fraction:
            raise UserError("--held-apart-node names who holds the set --held-apart-fraction sets apart; give both")
        if self.bit_depth != "auto":
            if isinstance(self.bit_depth, bool) or self.bit_depth not in BIT_DEPTHS:
                raise UserError(f"--bit-depth must be auto or one of {', '.join(map(str, BIT_DEPTHS))}, "
                                f"got {self.bit_depth!r}")
            object.__setattr__(self, "bit_depth", int(self.bit_depth))


def check_retina(cfg: PartitionConfig) -> None:
    """The retinopathy reader's options, refused where no reader would read them."""
    given = [flag for flag, on in (("--retina-balanced", cfg.retina_balanced),
                                   ("--retina-per-class", cfg.retina_per_class != RETINA_PER_CLASS),
                                   ("--retina-preprocess", cfg.retina_preprocess != "none")) if on]
    if given and cfg.source != "retinopathy":
        raise UserError(f"{given[0]} applies to --source retinopathy only; drop it")
    if "--retina-per-class" in given and not cfg.retina_balanced:
        raise UserError("--retina-per-class is the count of --retina-balanced's selection; add --retina-balanced or "
                        "drop it")


def to_json(cfg) -> dict[str, Any]:
    """A resolved config as JSON values (paths as strings, tuples as lists), for config.json."""
    def plain(value: Any) -> Any:
        return str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value

    options = {f.name for f in user_fields(cfg)}
    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items() if k in options}


def read_recipe(path: Path) -> dict[str, Any]:
    """A recipe's tables, after checking the file parses and names only known tables."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"recipe {path} is a folder, not a TOML file; pass the recipe file itself")
    if not path.is_file():
        raise UserError(f"recipe {path} not found; check the path")
    try:
        recipe = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"recipe {path} is not valid TOML ({exc})") from exc
    except RecursionError as exc:
        raise UserError(f"recipe {path} nests arrays or tables deeper than Python can read; no option takes more "
                        "than a list of values: flatten it") from exc
    unknown_tables = sorted(set(recipe) - set(RECIPE_TABLES))
    if unknown_tables:
        raise UserError(f"recipe {path}: unknown table [{unknown_tables[0]}]; valid tables: {', '.join(RECIPE_TABLES)}")
    for name, table in recipe.items():
        if not isinstance(table, dict):
            raise UserError(f"recipe {path}: [{name}] must be a table of option = value")
    return recipe


def stage_values(cls: type, stage: str, table: dict[str, Any], origin: str,
                 unlisted: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A recipe table's values for `cls`, keyed by field name and checked against the field types; an unknown
    key's message lists the valid ones, less `unlisted` (those the caller refuses: `fedcli run` sets some itself)."""
    fields = {f.name for f in user_fields(cls)} - {"exp"}
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in fields:
            names = ", ".join(f.name.replace("_", "-") for f in user_fields(cls)
                              if f.name in fields - unlisted)
            raise UserError(f"{origin}: unknown key {stage}.{key}; valid keys: {names}")
        values[name] = coerce(value, hints[name], f"{origin}: {stage}.{name.replace('_', '-')}")
    return values


def resolve(cls: type, cli: dict[str, Any], given_on_cli: set[str], recipe_path: Path | None, stage: str):
    """Build `cls` from CLI values (winning where given), the recipe, and the defaults."""
    recipe = {} if recipe_path is None else read_recipe(recipe_path).get(stage, {})
    values = stage_values(cls, stage, recipe, f"recipe {recipe_path}")
    given = given_fields(cls, (given_on_cli | set(values)) - {"exp"})
    values = {name: values[name] if name in values and name not in given_on_cli else cli[name]
              for name in (f.name for f in user_fields(cls))}
    if values.get("exp") is None:
        raise UserError("no experiment folder: pass --exp DIR")
    if Path(values["exp"]).exists() and not Path(values["exp"]).is_dir():
        raise UserError(f"--exp {values['exp']} is a file, not a folder; pass a folder (it is created if missing)")
    check_experiment_folder(values["exp"])
    return cls(**values, **given)


def kind_name(annotation: Any) -> str:
    """`a number`, `"auto"`, ...: what a value of this type looks like, for messages."""
    if typing.get_origin(annotation) is Literal:
        return " or ".join(f'"{a}"' for a in typing.get_args(annotation))
    return "a number" if annotation in (int, float) else f"of type {getattr(annotation, '__name__', annotation)}"


def number_or_keyword(text: str) -> float | str:
    """A command-line value that is a number or a keyword such as `auto` (checked by the config)."""
    try:
        return float(text)
    except ValueError:
        return text


def coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check a TOML value against a config field's type, converting str to Path where needed."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return coerce(value, options[0], key)
        for option in options:
            try:
                return coerce(value, option, key)
            except UserError:
                pass
        raise UserError(f"{key} = {value!r} must be {' or '.join(map(kind_name, options))}")
    if origin is tuple:
        item = args[0] if args else str
        if not isinstance(value, list):
            raise UserError(f"{key} = {value!r} must be a list of {'numbers' if item in (int, float) else 'strings'}")
        return tuple(coerce(v, item, key) for v in value)
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


PrivacyLoss = Literal["all-pairs", "nearest"]
PrivacyScale = Literal["absolute", "relative"]
SelectRule = Literal["stable", "last", "fidelity"]  # phase 1's snapshot rule, fedcli/gan/selection.py
LpipsNet = Literal["vgg", "alex"]
Device = Literal["auto", "cpu", "cuda"]
Engine = Literal["inprocess", "distributed"]
Launch = Literal["none", "local"]
ModelName = Literal["cnn", "resnet18", "resnet34", "resnet50", "densenet121", "efficientnet_b0"]
Auto = Literal["auto"]
Off = Literal["off"]
DpNoise = Literal["keyed", "secure"]  # DP-SGD's noise from the run's seed, or from the OS (gan/secure_noise.py)


# how train-gan runs, or where it starts from, not what it makes (equal bytes)
GAN_ENGINE_OPTIONS = frozenset({"engine", "launch", "timeout", "phase1_from"})


@dataclasses.dataclass(frozen=True)
class GanConfig:
    """`fedcli train-gan`. Defaults are the quick CPU configuration of the StyleGAN2 kind (about a minute
    per digits node); the study's values (batch 32, lr 0.0025, 256x256, patience 10,000, VGG) belong in
    recipes. Another kind reads its own subset of the options (fedcli/gan/kinds.py)."""

    exp: Path
    node: str | None = None
    generator: str = "stylegan2"  # a kind in fedcli/gan/kinds.py, checked there
    seed: int | None = ranged(None, 0, MAX_SEED)  # default: the partition's seed
    iterations: int = ranged(400, 1, MAX_COUNT)
    patience: int = ranged(200, 1, MAX_COUNT)
    select: SelectRule = "stable"
    pp_iterations: int | None = ranged(None, 0, MAX_COUNT, why="default 100; 0 under --dp-epsilon")
    fid_every: int = ranged(50, 1, MAX_COUNT)
    fid_images: int = ranged(512, 1, MAX_COUNT)
    fid_factor: float = ranged(2.5, 1, 1000)
    alpha: float = ranged(1.0, 0, 1000, why="0 disables the privacy loss")
    privacy_loss: PrivacyLoss = "all-pairs"
    privacy_scale: PrivacyScale = "absolute"
    batch: int = ranged(32, 2, MAX_BATCH)
    lr: float = ranged(0.0025, 0, 1, low_open=True)
    r1_gamma: float | Auto = ranged("auto", 0, 10_000, why="auto: 0.0002 x resolution^2 / batch")
    ada_target: float = ranged(0.6, 0, 1)
    ada_kimg: float | Auto = ranged("auto", 0, MAX_COUNT, low_open=True)
    ema_kimg: float | Auto = ranged("auto", 0, MAX_COUNT)
    style_mixing: float = ranged(0.9, 0, 1, why="the share of training batches with two latents")
    truncation: float = ranged(0.7, 0, 1, why="1: none, 0: every image is its class's mean")
    z_dim: int = ranged(64, 1, 4096)
    w_dim: int = ranged(64, 1, 4096)
    channel_base: int = ranged(512, 1, 2**16)
    channel_max: int = ranged(64, 1, 4096)
    lpips_net: LpipsNet = "alex"
    lpips_weights: Path | None = None
    fid_weights: Path | None = None
    buffer_size: int = ranged(512, 1, MAX_COUNT)
    fidelity_model: ModelName = "cnn"
    fidelity_epochs: int = ranged(11, 1, MAX_COUNT)
    fidelity_lr: float = ranged(1e-3, 0, 1, low_open=True)
    fidelity_batch: int = ranged(32, 2, MAX_BATCH, why="the classifier has BatchNorm")
    fidelity_seeds: int = ranged(3, 0, 100, why="0 skips the fidelity score")
    controls: bool = False
    tiny_node: int = ranged(40, 2, MAX_COUNT, why="the tiny-node control's training images")
    reference: int = ranged(0, 0, MAX_COUNT, why="0: no reference GAN")
    lira_references: int = ranged(0, 0, MAX_COUNT, why="0: no LiRA game")
    dp_epsilon: float | Off | None = ranged(None, 0, MAX_COUNT, low_open=True, inf_allowed=True,
                                            why="inf: the DP code path without noise; off: no DP")
    dp_delta: float | None = ranged(None, 0, 1, low_open=True, high_open=True, why="default 1 / (10 N)")
    dp_max_grad_norm: float = ranged(1.0, 0, MAX_COUNT, low_open=True)
    dp_noise: DpNoise = "keyed"
    vq_lr: float = ranged(4e-4, 0, 1, low_open=True)
    vq_beta: float = ranged(0.25, 0, 100)
    vq_decay: float = ranged(0.99, 0, 1, high_open=True)
    vq_codebook: int = ranged(64, 2, 2**15)
    vq_dim: int = ranged(32, 1, 4096)
    vq_channels: int = ranged(64, 2, 4096)
    prior_iterations: int = ranged(0, 0, MAX_COUNT, why="0: no prior; the buffer is the decoded codes")
    prior_channels: int = ranged(64, 1, 4096)
    prior_layers: int = ranged(4, 1, 64)
    sample_only: bool = False
    phase1_from: Path | None = None  # an experiment whose phase 1 this one's equals (gan/phase1_state.py)
    device: Device = "auto"
    engine: Engine = "inprocess"
    launch: Launch = "none"
    timeout: float = ranged(300.0, 0, 7 * 86400, low_open=True, why="seconds")  # per transfer or collective
    threads: int | None = ranged(None, 1, MAX_THREADS)
    overwrite: bool = False
    given: frozenset[str] = GIVEN  # the options the user set, whatever their values (a kind refuses those it does not read)

    def defaults(self) -> GanConfig:
        """Every option at its default, as resolved for this config's DP setting (which some defaults follow)."""
        return GanConfig(exp=self.exp, dp_epsilon=self.dp_epsilon)

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.launch != "none" and self.engine == "inprocess":
            raise UserError("--launch applies to --engine distributed (the in-process engine runs every node here)")
        if self.node is not None and self.launch == "local":
            raise UserError("--node names the node of a process started by torchrun; --launch local assigns nodes "
                            "itself, so drop --node")
        for name in ("r1_gamma", "ada_kimg", "ema_kimg"):
            value = getattr(self, name)
            if isinstance(value, str) and value != "auto":
                raise UserError(f"--{name.replace('_', '-')} must be a number or auto, got {value!r}")
        check_weights_file(self, "lpips_weights", "fid_weights")
        if self.lira_references % 2 or self.lira_references == 2:
            raise UserError(f"--lira-references {self.lira_references}: the references come in complementary halves "
                            "of the pool, and the game needs two IN and two OUT references per image to fit their "
                            "spread, so give an even number of at least 4 (or 0)")
        if self.phase1_from is not None and not (Path(self.phase1_from) / "gan").is_dir():
            raise UserError(f"--phase1-from {self.phase1_from} holds no trained GANs (no gan folder); name an "
                            "experiment that ran fedcli train-gan")
        if self.dp_epsilon == "off":
            object.__setattr__(self, "dp_epsilon", None)
        if self.dp_epsilon is not None:
            check_private(self)
        elif self.dp_delta is not None:
            raise UserError("--dp-delta needs --dp-epsilon; give both or neither")
        elif self.dp_noise != "keyed":
            raise UserError(f"--dp-noise {self.dp_noise} needs --dp-epsilon: it is where DP-SGD's noise comes from; "
                            "add --dp-epsilon or drop --dp-noise")
        if self.pp_iterations is None:
            object.__setattr__(self, "pp_iterations", 0 if self.private else 100)

    @property
    def private(self) -> bool:
        return self.dp_epsilon is not None


def check_private(cfg: GanConfig) -> None:
    """Under --dp-epsilon every path from real images to the released generator and buffer must be
    closed (gan/private.py): refuse what would open one, or train a GAN outside the accounting."""
    epsilon = cfg.dp_epsilon  # a number's range is checked with the others
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise UserError(f"--dp-epsilon must be a positive number, inf (the DP code path without noise) or off, "
                        f"got {epsilon!r}")
    if cfg.pp_iterations:
        raise UserError(f"--pp-iterations {cfg.pp_iterations} with --dp-epsilon: phase 2's privacy loss reads real "
                        "images in the generator's gradient, outside the DP accounting; drop --pp-iterations "
                        "(0 under DP)")
    for flag, on, reads, remedy in (
            ("--controls", cfg.controls, "its GANs would train on", "run --controls without --dp-epsilon"),
            ("--reference", cfg.reference, "its GANs would train on", "run --reference without --dp-epsilon"),
            ("--select fidelity", cfg.select == "fidelity", "its readings score",
             "drop --select (under DP the last snapshot is released)")):
        if on:
            raise UserError(f"{flag} with --dp-epsilon: {reads} real images outside the DP accounting; {remedy}")


def check_weights_file(cfg, *names: str) -> None:
    for name in names:
        path = getattr(cfg, name)
        if path is not None and not Path(path).is_file():
            raise UserError(f"--{name.replace('_', '-')} {path} does not exist")


def architectures(entries: tuple[str, ...] | str) -> tuple[str, dict[str, str]]:
    """--model entries as (the architecture of every model, {node: its own architecture}); a config.json
    written before NODE=ARCH existed holds one name."""
    default, own = None, {}
    for item in (entries,) if isinstance(entries, str) else entries:
        node, sep, arch = str(item).rpartition("=")
        if arch not in typing.get_args(ModelName) or (sep and not node):
            raise UserError(f"--model {item!r} is not ARCH or NODE=ARCH with ARCH one of "
                            f"{', '.join(typing.get_args(ModelName))} (e.g. --model node0=resnet18)")
        if sep:
            own[node] = arch
        elif default not in (None, arch):
            raise UserError(f"--model names two architectures for every node ({default}, {arch}); give one, and "
                            "NODE=ARCH for a node's own")
        else:
            default = arch
    return default or "cnn", own


# what only `audit-privacy --shared` reads: the generator audit's fingerprint leaves them out, the attacks' holds
# them (with the node and seed)
ATTACK_OPTIONS = frozenset({"shared", "attack_images", "attack_iterations", "attack_restarts",
                            "classifier_references"})


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """`fedcli audit-privacy`. Defaults are quick (100 projection steps); the study used 1000."""

    exp: Path
    node: str | None = None
    max_images: int = ranged(200, 1, MAX_COUNT)  # per group (members, non-members)
    steps: int = ranged(100, 1, MAX_COUNT)
    batch_size: int = ranged(32, 1, MAX_BATCH)
    lr: float = ranged(0.1, 0, 1, low_open=True)
    optimize_noise: bool = False
    lpips_weights: Path | None = None
    max_auroc: float = ranged(0.6, 0.5, 1, why="0.5 is chance")
    min_distance: float = ranged(0.0, 0, 10, why="an LPIPS distance; 0 disables")
    standard: bool = False
    controls: bool = False
    strict: bool = False
    shared: bool = False  # also attack what the federations shared (audit/shared_attacks.py)
    attack_images: int = ranged(8, 1, 256)  # latents attacked per node (FedReplay keeps 256)
    attack_iterations: int = ranged(2000, 1, MAX_COUNT)  # the reference study: 20,000
    attack_restarts: int = ranged(2, 1, 100)
    classifier_references: int = ranged(0, 0, 256, why="0: no LiRA game")  # reference classifiers per node
    seed: int | None = ranged(None, 0, MAX_SEED)
    device: Device = "auto"
    threads: int | None = ranged(None, 1, MAX_THREADS)
    overwrite: bool = False

    def __post_init__(self) -> None:
        check_ranges(self)
        check_weights_file(self, "lpips_weights")
        if self.classifier_references % 2:
            raise UserError(f"--classifier-references {self.classifier_references} is odd; the LiRA game trains its "
                            "references in complementary pairs: pass an even number of at least 4, or 0 for no game")
        if self.classifier_references == 2:
            raise UserError("--classifier-references 2 is too few: with one reference IN and one OUT per image the "
                            "game cannot estimate the target's IN and OUT spreads; pass 4 or more, or 0 for no game")


Metric = Literal["accuracy", "balanced-accuracy", "f1", "f1-weighted", "precision", "precision-weighted", "auroc",
                 "auprc", "sensitivity", "specificity", "ece", "adaptive-ece", "adaptive-mce"]
METRIC_COLUMNS = {"accuracy": "accuracy", "balanced-accuracy": "balanced_accuracy", "f1": "f1_macro",
                  "f1-weighted": "f1_weighted", "precision": "precision_macro", "precision-weighted": "precision_weighted",
                  "auroc": "auroc", "auprc": "auprc", "sensitivity": "sensitivity", "specificity": "specificity",
                  "ece": "ece", "adaptive-ece": "adaptive_ece", "adaptive-mce": "adaptive_mce"}
LOWER_IS_BETTER = {"ece", "adaptive_ece", "adaptive_mce"}  # metrics.csv columns where the best value is the lowest


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    """`fedcli report`: which metric the tables and figures show (the study: accuracy)."""

    exp: Path
    metric: Metric = "accuracy"
    threads: int | None = ranged(None, 1, MAX_THREADS)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclasses.dataclass(frozen=True)
class PredictConfig:
    """`fedcli predict`'s numeric options (it reads no recipe; predict.run checks the others)."""

    batch: int = ranged(64, 1, MAX_BATCH)
    threads: int | None = ranged(None, 1, MAX_THREADS)

    def __post_init__(self) -> None:
        check_ranges(self)
