"""fedcli from Python: each stage as a function whose keywords are the command's options (`test_fraction=0.2` for
`--test-fraction 0.2`), checked and resolved by the rule the command line's options and recipe tables follow, so a
mistake raises the `UserError` the command prints, with the same message, and writes nothing. Each returns the
experiment's paths and its results as pandas frames, read from the artifacts the stage wrote: what the API and the
command line give for the same options is the same files.

Stable (changed only with notice): these functions, their keywords (the commands' options), the result classes
and their fields. Internal: every other module of fedcli, whose names may move. docs/python.md shows each."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from fedcli.core.errors import UserError
from fedcli.experiment import events
from fedcli.experiment.config import (AuditConfig, PartitionConfig, ReportConfig, USER_FACTORY, resolve,
                                      stage_values, user_fields)
from fedcli.experiment.paths import audit_dir, federate_dir, gan_dir, report_dir

__all__ = ["partition", "train_generators", "federate", "audit", "report", "run", "PartitionResult",
           "GeneratorsResult", "FederateResult", "AuditResult", "ReportResult", "RunResult"]


def config(cls: type, table: str, exp: Path | str, recipe: Path | str | None, options: dict[str, Any]):
    """`cls` from `options` (winning where given; None is not given), the recipe's [table], then the defaults, as the
    command line resolves it; a keyword the command has no option for is refused with the valid ones."""
    known = [f.name for f in user_fields(cls) if f.name != "exp"]
    unknown = [key for key in options if key not in known]
    if unknown:
        raise UserError(f"fedcli.api: {unknown[0]!r} is not an option of {table.replace('_', '-')}; its options: "
                        f"{', '.join(known)}")
    given = {key: as_toml(value) for key, value in options.items() if value is not None}  # None: the default
    values = stage_values(cls, table, given, f"fedcli.api.{table}")
    defaults = {f.name: None if f.default is dataclasses.MISSING else f.default for f in user_fields(cls)}
    return resolve(cls, defaults | values | {"exp": Path(exp)}, set(values),
                   None if recipe is None else Path(recipe), table)


def as_toml(value: Any) -> Any:
    """A keyword's value as a recipe would hold it: a tuple as a list, a path as text."""
    if isinstance(value, (tuple, list)):
        return [as_toml(item) for item in value]
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def frames(paths: dict[Any, Path], names: tuple[str, ...]) -> pd.DataFrame:
    """The CSV files at `paths` in one frame, each row keyed by its path's key under `names`, first (empty: none)."""
    read = []
    for key, path in paths.items():
        if path.is_file():
            frame = pd.read_csv(path)
            keys = pd.DataFrame(dict(zip(names, key if isinstance(key, tuple) else (key,))), index=frame.index)
            read.append(pd.concat([keys, frame.drop(columns=[n for n in names if n in frame])], axis=1))
    return pd.concat(read, ignore_index=True) if read else pd.DataFrame()


@dataclasses.dataclass(frozen=True)
class PartitionResult:
    exp: Path
    manifest: Path  # <exp>/partition/manifest.json
    nodes: tuple[str, ...]
    summary: pd.DataFrame  # summary.csv: images per node, split and class


def partition(exp: Path | str, *, config_file: Path | str | None = None, **options: Any) -> PartitionResult:
    """`fedcli partition`: split a dataset into nodes (options as `fedcli partition --help` lists them)."""
    from fedcli.data.partition import run as run_partition
    from fedcli.federate.strategies import REGISTRY

    cfg = config(PartitionConfig, "partition", exp, config_file, options)
    manifest = run_partition(cfg, REGISTRY.reserved_names())
    return PartitionResult(cfg.exp, manifest.path, tuple(manifest.node_names),
                           pd.read_csv(manifest.path.parent / "summary.csv"))


@dataclasses.dataclass(frozen=True)
class GeneratorsResult:
    exp: Path
    folders: dict[str, Path]  # node -> <exp>/gan/<node>/ (generator, buffer, config.json)
    summaries: list[dict]  # each node's summary, as train-gan prints it
    metrics: pd.DataFrame  # every node's metrics.csv, with a `node` column


def train_generators(exp: Path | str, *, config_file: Path | str | None = None, tensorboard: bool = False,
                     **options: Any) -> GeneratorsResult:
    """`fedcli train-gan`: each node's generators and shared buffer (`generator="vqvae2"`: the serial VQ-VAE-2)."""
    from fedcli.generators.config import GanConfig
    from fedcli.generators.stage import run as run_generators

    cfg = config(GanConfig, "train_gan", exp, config_file, options)
    with events.tensorboard(tensorboard):
        summaries = run_generators(cfg)
    folders = {s["node"]: gan_dir(cfg.exp, s["node"]) for s in summaries}
    return GeneratorsResult(cfg.exp, folders, summaries,
                            frames({node: folder / "metrics.csv" for node, folder in folders.items()}, ("node",)))


@dataclasses.dataclass(frozen=True)
class FederateResult:
    exp: Path
    folders: dict[tuple[str, int | None], Path]  # (strategy, fold) -> <exp>/federate/<strategy>/
    metrics: pd.DataFrame  # every run's metrics.csv, with `strategy` and `fold` columns
    comm: pd.DataFrame  # every run's comm.csv: what was sent, between whom, in bytes


def federate(exp: Path | str, *, model: str | Callable | tuple[str, ...] | None = None,
             config_file: Path | str | None = None, tensorboard: bool = False, **options: Any) -> FederateResult:
    """`fedcli federate`: `strategy=("feder", "fedavg")` and the other options of `fedcli federate --help`;
    `model` also takes your own factory function (defined in an importable module, as `--model module:factory`)."""
    from fedcli.federate.config import FederateConfig
    from fedcli.federate.stage import run as run_federate

    if model is not None:
        options["model"] = model_name(model) if callable(model) else model
    cfg = config(FederateConfig, "federate", exp, config_file, options)
    with events.tensorboard(tensorboard):
        runs = run_federate(cfg)
    folders = {(r.strategy, r.fold): federate_dir(cfg.exp, r.strategy, r.fold) for r in runs}
    return FederateResult(cfg.exp, folders, frames({k: f / "metrics.csv" for k, f in folders.items()},
                                                   ("strategy", "fold")),
                          frames({k: f / "comm.csv" for k, f in folders.items()}, ("strategy", "fold")))


def model_name(factory: Callable) -> str:
    """`module:factory` of a function every node process and `fedcli predict` can import again."""
    name = f"{getattr(factory, '__module__', '')}:{getattr(factory, '__qualname__', '')}"
    if factory.__module__ == "__main__" or not USER_FACTORY.fullmatch(name):
        raise UserError(f"model={name} cannot be imported again by the nodes and by fedcli predict; define the "
                        "factory at the top level of a module on the Python path (a notebook can write one with "
                        "%%writefile) and pass it, or its 'module:factory' name")
    return name


@dataclasses.dataclass(frozen=True)
class AuditResult:
    exp: Path
    summaries: list[dict]  # each node's summary.json: the attacks' scores and the verdict
    attacks: dict[str, dict]  # audit-privacy --shared: each attacked strategy's summary
    distances: pd.DataFrame  # every audited node's distances.csv, with a `node` column


def audit(exp: Path | str, *, config_file: Path | str | None = None, **options: Any) -> AuditResult:
    """`fedcli audit-privacy`: what the shared buffers (and, with `shared=...`, the shared models) reveal."""
    from fedcli.audit.stage import audit as run_audit

    cfg = config(AuditConfig, "audit", exp, config_file, options)
    summaries, attacked = run_audit(cfg)
    return AuditResult(cfg.exp, summaries, attacked,
                       frames({s["node"]: audit_dir(cfg.exp, s["node"]) / "distances.csv" for s in summaries}, ("node",)))


@dataclasses.dataclass(frozen=True)
class ReportResult:
    path: Path  # <exp>/report/report.md; the tables it could not make are listed at its end
    tables: dict[str, pd.DataFrame]  # each table's CSV, by its file's stem


def report(exp: Path | str, *, config_file: Path | str | None = None, **options: Any) -> ReportResult:
    """`fedcli report`: the study's tables and figures from whatever the experiment holds."""
    from fedcli.report.build import run as run_report

    run_report(config(ReportConfig, "report", exp, config_file, options))
    return report_result(Path(exp))


def report_result(exp: Path) -> ReportResult:
    folder = report_dir(exp)
    return ReportResult(folder / "report.md", {p.stem: pd.read_csv(p) for p in sorted(folder.glob("*.csv"))})


@dataclasses.dataclass(frozen=True)
class RunResult:
    exp: Path
    counts: dict[str, int]  # units ran, skipped (up to date) and shared with another sub-experiment
    report: ReportResult


def run(recipe: Path | str, *, exp: Path | str | None = None, set: tuple[str, ...] | list[str] = (),
        threads: int | None = None, yes: bool = False, tensorboard: bool = False) -> RunResult:
    """`fedcli run`: a recipe's stages (a file, or a shipped recipe's name such as "quickstart"), skipping what is
    up to date; `set` as `--set table.key=value`."""
    from fedcli.pipeline.recipe import RunOptions
    from fedcli.pipeline.runner import Runner, prepared

    loaded, folder = prepared(Path(recipe), RunOptions(exp=None if exp is None else Path(exp), set=tuple(set),
                                                       threads=threads, yes=yes))
    loaded.check_size(yes)
    runner = Runner(loaded, folder)
    with events.tensorboard(tensorboard):
        counts = runner.run()
    return RunResult(folder, {status: counts[status] for status in ("ran", "skipped", "shared")},
                     report_result(folder))
