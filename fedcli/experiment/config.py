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
import re
import tomllib
import types
import typing
from pathlib import Path
from collections.abc import Callable
from typing import Any, Literal

from fedcli.core import plugins
from fedcli.core.errors import UserError
from fedcli.core.precision import PRECISION_HELP, Precision, check_precision
from fedcli.experiment.paths import check_experiment_folder

STAGE_TABLES = ("partition", "train_gan", "federate", "audit", "report")
RECIPE_TABLES = (*STAGE_TABLES, "sweep", "select", "regime")  # the last three: `fedcli run` only

SOURCES = ("digits", "tuberculosis", "isic2019", "medmnist", "folders", "csv", "retinopathy")
Source = Literal[(*SOURCES, *(p.name for p in plugins.checked("sources", SOURCES)))]  # a source plugin's too
Scheme = Literal["source", "iid", "dirichlet", "site-shift", "skew"]
Task = Literal["melanoma", "multiclass"]
Preprocess = Literal["none", "graham"]  # how each image is prepared before resizing (data/graham.py)

MAX_COUNT = 10**6  # iterations, steps, rounds, epochs, images: beyond any study run, below a typo's 1e20
MAX_SEED = 2**63 - 1  # seeds are hashed into keyed streams (core/rng.py); any int64 works
MAX_BATCH = 4096
MAX_THREADS = 1024
MAX_FOLDS = 100
# Every stage holds a node's images in memory as N x C x S x S uint8: 3 MiB per RGB image at 1024 px,
# so 10,000 images already need 30 GiB (and the GAN's activations grow with S x S too).
MAX_IMAGE_SIZE = 1024
RETINA_PER_CLASS = 6000  # the generative-replay study's per class: 3000 training + 1500 validation + 1500 test
EXP_HELP = "Experiment folder; the stage reads and writes only inside it."
THREADS_HELP = "CPU threads torch may use \\[default: torch's, every core]; CPU results depend on it."
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
# options config.json records only when set otherwise: at these values a run computes what it did before they
# existed, and its config.json stays byte for byte what it was
RECORDED_WHEN_SET = {"precision": "fp32", "compile": False}
UNCHANGED_AT |= RECORDED_WHEN_SET


def settled(values: dict[str, Any]) -> dict[str, Any]:
    """`values` less the options that are at the value every run had before they existed (UNCHANGED_AT)."""
    return {k: v for k, v in values.items() if not (k in UNCHANGED_AT and v == UNCHANGED_AT[k])}


def option(default: Any = dataclasses.MISSING, help: str = "", *, panel: str | None = None, flags: tuple[str, ...] = (),
           parser: Callable[[str], Any] | None = None, range: Range | None = None) -> Any:
    """A config field that is an option, declared once: its default, its help, the --help panel it is listed in,
    its command-line names beyond --<name> (`flags`), a parser of the value as typed (a number or a keyword) and,
    for a number, the range it accepts. fedcli/cli_options.py builds the command's option from it."""
    metadata = {"help": help, "panel": panel, "flags": flags, "parser": parser}
    return dataclasses.field(default=default, metadata=metadata | ({"range": range} if range else {}))


def ranged(default: Any, low: float, high: float, help: str = "", *, panel: str | None = None,
           flags: tuple[str, ...] = (), parser: Callable[[str], Any] | None = None, **bounds: Any) -> Any:
    """A numeric option with its accepted range (see Range), kept in the field's metadata."""
    return option(default, help, panel=panel, flags=flags, parser=parser, range=Range(low, high, **bounds))


def number_or_keyword(text: str) -> float | str:
    """A command-line value that is a number or a keyword (`auto`, `inf`, `off`)."""
    try:
        return float(text)
    except ValueError:
        return text


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
    exp: Path = option(help=EXP_HELP)
    source: Source = option("digits", help=(
        "Dataset reader: digits (built in, offline), tuberculosis, isic2019, medmnist, folders, csv, retinopathy "
        "(Kaggle DR, the generative-replay study's binary task)." + plugins.listed("sources")))
    data_dir: Path | None = option(None, help=(
        "Where the real data lies (a folder; a .npz or .csv file for medmnist/csv). Not used by digits."))
    scheme: Scheme | None = option(None, help=(
        "How samples become nodes. Default: site-shift for digits, iid for medmnist, source otherwise."))
    nodes: int | None = ranged(None, 2, MAX_COUNT, help=(
        "Number of nodes for iid, dirichlet, skew and site-shift \\[default: 3]."))
    alpha: float = ranged(0.5, 0, 1000, low_open=True, help="Dirichlet concentration; smaller = stronger label skew.")
    ks: float | None = ranged(None, 0, 1, help=(
        "--scheme skew: the mean pairwise label skew the equal-sized nodes reach within 0.02: the Kolmogorov-Smirnov "
        "statistic for two classes, total variation (KS's value for two classes, independent of class order) for "
        "more."))
    shared_fraction: float = ranged(0.0, 0, 0.5, help=(
        "Share of all training images set apart as a class-balanced globally shared set (fedavg-share gives it to "
        "every node; for every strategy those images leave their nodes' training sets). 0: none."))
    # a class-balanced test set set apart first (data/global_test.py)
    global_test: int = ranged(0, 0, MAX_COUNT, help=(
        "Images set apart first as a fixed, class-balanced global test set (the same images at every seed and --ks), "
        "held by every node for evaluation only; federate scores every model on it (global_test.csv) beside the nodes' "
        "own test sets. 0: none."))
    labeled_fraction: float = ranged(1.0, 0, 1, low_open=True, why="1: every training label visible", help=(
        "Few labels: share of each node's training images whose labels stay visible, per class, at least one per "
        "class present; the rest become its unlabelled part (labels hidden from every stage). 1: all visible."))
    validation_fraction: float = ranged(0.0, 0, 0.5, high_open=True, help=(
        "Few labels: share of each labelled node's training images, per class, set apart as its labelled validation "
        "part."))
    # None: every node; ("none",): none (labels only held apart)
    labeled_nodes: tuple[str, ...] | None = option(None, help=(
        "Few labels: only these nodes keep labels (repeat the option); none: no node does (labels only in the "
        "held-apart set) \\[default: every node]."))
    held_apart_fraction: float = ranged(0.0, 0, 0.5, high_open=True, help=(
        "Few labels: share of all training images set apart, class-balanced with their labels, as the global "
        "validation set (FedPerl's), held by --held-apart-node."))
    # default: the first node
    held_apart_node: str | None = option(None, help=(
        "The node that holds the held-apart set (real labelled images of every node) \\[default: the first]."))
    # site-shift: consecutive nodes sharing a scanner,
    communities: tuple[int, ...] = ranged((), 1, MAX_COUNT, help=(
        "site-shift: repeatable group sizes of consecutive nodes that share a simulated scanner, one option per "
        "group, e.g. --communities 5 --communities 3 --communities 1 --communities 1 (FedPerl's communities) "
        "\\[default: every node its own]."))
    # by group size (5 3 1 1)
    # site-shift: the simulated scanners in order (acquisition.NAMES); (): all six
    scanners: tuple[str, ...] = option((), help=(
        "site-shift: repeatable names of the simulated scanners, in the order nodes (or communities) take them: "
        "gamma0.5, blur, invert, noise, contrast, gamma2 \\[default: all six, in that order]."))
    site: str | None = option(None, help="Keep one site of a multi-site source before an iid split (e.g. shenzhen).")
    task: Task = option("melanoma", help="isic2019 only: melanoma (binary, FedER) or multiclass (8).")
    # retinopathy: the study's selection, retina_per_class images of each class
    retina_balanced: bool = option(False, help=(
        "retinopathy only: the generative-replay study's selection, --retina-per-class images of each class drawn at "
        "random (the same images for every --seed and --ks); the rest are counted as dropped. Default: every left-eye "
        "image of grade 0 and 2-4."))
    retina_per_class: int = ranged(RETINA_PER_CLASS, 1, MAX_COUNT, help=(
        "retinopathy only: the images of each class --retina-balanced keeps (the study's 3000 training + 1500 "
        "validation + 1500 test; the partition splits them)."))
    retina_preprocess: Preprocess = option("none", help=(
        "retinopathy only: graham (Graham's: the eye's radius scaled to 300 px, the local average colour subtracted, "
        "the rim masked and cropped, as the study) or none; applied whenever an image is read."))
    # a binary task's finding; default: the source's second class
    positive_class: str | None = option(None, help=(
        "A binary task's positive class, whose sensitivity and specificity federate reports \\[default: the second "
        "class: the finding of every built-in binary source]."))
    test_fraction: float = ranged(0.2, 0, 1, low_open=True, high_open=True, help=(
        "Share of each node held out as a class-balanced test set."))
    # at most this many train images per node (a smaller site)
    train_size: int | None = ranged(None, 2, MAX_COUNT, help=(
        "Keep at most this many training images per node, a class-stratified draw (a smaller hospital, its test set "
        "unchanged) \\[default: all]."))
    # NODE=CLASS:SHARE: that node's images drawn to that share (data/class_mix.py)
    class_mix: tuple[str, ...] = option((), help=(
        "NODE=CLASS:SHARE, repeatable: that node's images drawn, before its test split, so that CLASS makes SHARE of "
        "them (a node whose case mix differs, FedPerl's client 8), e.g. node8=normal:0.75."))
    folds: int = ranged(5, 2, MAX_FOLDS, help="Stratified cross-validation folds over each node's train part.")
    image_size: int = ranged(32, 16, MAX_IMAGE_SIZE, why="a power of two; each stage holds a node's images in "
                             "memory as N x C x S x S bytes", help=(
        "Image side in pixels for every later stage: a power of two from 16 to 1024 (every stage holds a node's "
        "images in memory)."))
    channels: int | None = ranged(None, 1, 3, help="1 (grayscale) or 3 (RGB). Default: what the images are.")
    bit_depth: int | Auto = ranged("auto", 8, 16, why="8, 10, 12, 14, 16 or auto", parser=number_or_keyword, help=(
        "Deeper-than-8-bit files' full scale, 2^N - 1, one for the whole dataset: 8, 10, 12, 14, 16, or auto (the "
        "smallest that holds the data's largest value). 8-bit and DICOM files keep their own."))
    seed: int = ranged(0, 0, MAX_SEED, help="Seed of every random choice.")
    threads: int | None = ranged(None, 1, MAX_THREADS, help=THREADS_HELP)
    overwrite: bool = option(False, help="Replace an existing <exp>/partition.")

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
    return recorded({k: plain(v) for k, v in dataclasses.asdict(cfg).items() if k in options})


def recorded(values: dict[str, Any]) -> dict[str, Any]:
    """`values` less the options at their RECORDED_WHEN_SET value, as config.json records them."""
    return {k: v for k, v in values.items() if not (k in RECORDED_WHEN_SET and v == RECORDED_WHEN_SET[k])}


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


Device = Literal["auto", "cpu", "cuda"]
Engine = Literal["inprocess", "distributed"]
FederateEngine = Literal["inprocess", "distributed", "flower"]  # train-gan's chain has no Flower engine yet
Launch = Literal["none", "local"]
MODELS = ("cnn", "resnet18", "resnet34", "resnet50", "densenet121", "efficientnet_b0")  # models/classifier.py
ModelName = Literal[(*MODELS, *(p.name for p in plugins.checked("models", MODELS)))]  # a classifier plugin's too
USER_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # --model module:factory (models/user_models.py)
Auto = Literal["auto"]


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
        if not (arch in typing.get_args(ModelName) or USER_FACTORY.fullmatch(arch)) or (sep and not node):
            raise UserError(f"--model {item!r} is not ARCH or NODE=ARCH with ARCH one of "
                            f"{', '.join(typing.get_args(ModelName))} or module:factory (e.g. --model node0=resnet18)")
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

    exp: Path = option(help=EXP_HELP)
    node: str | None = option(None, help="Audit this node only \\[default: every node].")
    # per group (members, non-members)
    max_images: int = ranged(200, 1, MAX_COUNT, help=(
        "Images per group (members, non-members), size-matched and class-stratified."))
    steps: int = ranged(100, 1, MAX_COUNT, help="Projection steps per image (the study: 1000).")
    batch_size: int = ranged(32, 1, MAX_BATCH, help="Images projected at once.")
    lr: float = ranged(0.1, 0, 1, low_open=True, help="Peak Adam learning rate of the projector.")
    optimize_noise: bool = option(False, help="Also optimise per-layer noise (warns below 128 px).")
    lpips_weights: Path | None = option(None, help=(
        "The LPIPS backbone weights train-gan used \\[default: the torch hub cache, else the named random fallback]."))
    max_auroc: float = ranged(0.6, 0.5, 1, why="0.5 is chance", help=(
        "Verdict, two-sided: fail on a membership AUROC or buffer member share significantly beyond this or below 1 "
        "minus it (a reversed leak); pass needs their 95% intervals within [1 - this, this] (0.5 = no leak)."))
    min_distance: float = ranged(0.0, 0, 10, why="an LPIPS distance; 0 disables", help=(
        "Verdict: fail if members' median LPIPS to the buffer is below this (0 disables)."))
    standard: bool = option(False, help=(
        "Also project the standard (phase-1) generator: the study's comparison, which the control replaces because "
        "the control is trained as long as the privacy generator; half as much projection time again."))
    controls: bool = option(False, help=(
        "Also audit generators whose answer is known: a memoriser of the members (expected: fail), an untrained "
        "generator (not fail) and the reseeded control against the control (privacy effect none; needs train-gan "
        "--controls)."))
    strict: bool = option(False, help="Exit with code 1 when the verdict is fail.")
    # also attack what the federations shared (audit/shared_attacks.py)
    shared: bool = option(False, help=(
        "Also attack what the federations in <exp>/federate shared (white box): model inversion of FedReplay's "
        "latents and SplitNN's activations, gradient inversion of one local step of an averaging strategy at batch 1, "
        "4 and 8; writes <exp>/attacks/<strategy>/. Without generators, only these."))
    # latents attacked per node (FedReplay keeps 256)
    attack_images: int = ranged(8, 1, 256, help="--shared: latents attacked per node.")
    # the reference study: 20,000
    attack_iterations: int = ranged(2000, 1, MAX_COUNT, help=(
        "--shared: optimiser steps per attack and restart (the reference study: 20,000)."))
    attack_restarts: int = ranged(2, 1, 100, help="--shared: random starts per attack; the best match is kept.")
    # reference classifiers per node
    classifier_references: int = ranged(0, 0, 256, why="0: no LiRA game", help=(
        "--shared: reference classifiers per node for the LiRA membership game on the shared classifiers, each "
        "trained as a standalone node on half the node's audited images; even and at least 4, 0 = the loss attack "
        "alone (each costs about one standalone run of the node)."))
    seed: int | None = ranged(None, 0, MAX_SEED, help="Seed \\[default: the partition's].")
    device: Device = option("auto", help="auto (CUDA when present), cpu or cuda.")
    precision: Precision = option("fp32", help=PRECISION_HELP.replace("training steps", "projection's steps"))
    threads: int | None = ranged(None, 1, MAX_THREADS, help=THREADS_HELP)
    overwrite: bool = option(False, help=(
        "Replace existing <exp>/audit/<node> folders (and <exp>/attacks/<strategy> with --shared)."))

    def __post_init__(self) -> None:
        check_ranges(self)
        check_precision(self.precision, self.device)
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

    exp: Path = option(help=EXP_HELP)
    metric: Metric = option("accuracy", help=(
        "Metric of the tables and figures: accuracy (the study), balanced-accuracy, f1 (macro) or auroc."))
    threads: int | None = ranged(None, 1, MAX_THREADS, help=THREADS_HELP)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclasses.dataclass(frozen=True)
class PredictConfig:
    """`fedcli predict`'s options (it reads no recipe; predict.run checks what needs the experiment)."""

    exp: Path = option(help=EXP_HELP)
    strategy: str = option(help=(
        "The federated strategy whose trained model(s) to apply (a folder under <exp>/federate)."))
    data_dir: Path = option(help="Folder of images to classify (searched recursively).")
    node: str | None = option(None, help=(
        "Use this node's model (strategies with one model per node). Default: the shared global/central model."))
    ensemble: bool = option(False, help="Average the softmax of every node's model, as federate's ensemble rows do.")
    out: Path | None = option(None, help="CSV to write \\[default: <exp>/predict/<strategy>_<model>.csv].")
    device: Device = option("auto", help="auto (CUDA when present), cpu or cuda.")
    batch: int = ranged(64, 1, MAX_BATCH, help="Images per forward pass.")
    threads: int | None = ranged(None, 1, MAX_THREADS, help=THREADS_HELP)
    skip_bad: bool = option(False, flags=("--skip-bad",), help=(
        "Leave out files that are not usable images (unreadable, corrupt, too many pixels), listing each, instead of "
        "stopping."))
    group: tuple[str, ...] = option((), help=(
        "Repeatable NAME=CLASS+CLASS: merge the model's classes into groups (every class in one; e.g. "
        "malignant=MEL+BCC+SCC), each group's probability the sum of its classes'."))
    labels_from_folders: bool = option(False, flags=("--labels-from-folders",), help=(
        "Score the predictions: each image's label is its first folder under --data-dir (a group's name with "
        "--group, else a class name); writes <out>_scores.csv with 95% intervals."))

    def __post_init__(self) -> None:
        check_ranges(self)
