"""Read whatever artifacts an experiment folder holds, for the report. Nothing is recomputed.

An experiment is its own folder plus, after a sweep, every `runs/<key=value,...>/` below it.
Sub-experiments that differ only in their seed are replicates: the report shows mean +- std
over them. A GAN, federate or audit folder made from inputs the experiment no longer holds (the
partition was remade, a GAN retrained; see `stale_inputs`) is left out and listed as stale, so
the report never shows results of two partitions side by side.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedcli.core.errors import UserError
from fedcli.experiment.artifact_kinds import CONFIG, stale_inputs
from fedcli.experiment.subexperiments import key_values, point_values
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.base import ENSEMBLE

SEED_KEY = "partition.seed"


@dataclasses.dataclass(frozen=True)
class Stat:
    """Mean, sample std and count of a set of numbers, printed as `mean ± std` when n > 1."""

    mean: float
    std: float
    n: int

    @classmethod
    def of(cls, values) -> Stat:
        values = [float(v) for v in values if v is not None and not math.isnan(float(v))]
        if not values:
            return cls(float("nan"), float("nan"), 0)
        std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        return cls(float(np.mean(values)), std, len(values))

    def __str__(self) -> str:
        if self.n == 0:
            return "-"
        small = 0 < abs(self.mean) < 0.1  # LPIPS distances: three significant digits, not three decimals
        mean = f"{self.mean:#.3g}" if small else f"{self.mean:.3f}"
        std = f"{self.std:#.2g}" if small else f"{self.std:.3f}"
        return f"{mean} ± {std}" if self.n > 1 else mean


@dataclasses.dataclass
class Run:
    """One strategy's federate output (a final run, or one cross-validation fold)."""

    strategy: str
    fold: int | None
    config: dict[str, Any]
    metrics: pd.DataFrame
    comm: pd.DataFrame | None
    folder: Path
    batchnorm: pd.DataFrame | None = None  # the final round's BatchNorm diagnostic (bn_statistics.csv)
    global_metrics: pd.DataFrame | None = None  # the partition's global test set's rows (global_test.csv)
    budget: pd.DataFrame | None = None  # each training call's steps and images (budget.csv)


@dataclasses.dataclass(frozen=True)
class Stale:
    """An artifact folder left out of the report: the stage that wrote it, and the inputs it was made
    from that the experiment no longer holds."""

    folder: Path
    stage: str
    inputs: list[str]


@dataclasses.dataclass
class SubExperiment:
    folder: Path
    point: dict[str, Any]
    manifest: dict | None
    runs: list[Run]
    cv_runs: list[Run]
    gans: list[dict]
    audits: list[dict]
    stale: list[Stale] = dataclasses.field(default_factory=list)
    attacks: dict[str, dict] = dataclasses.field(default_factory=dict)  # strategy -> its shared data's attacks

    @property
    def nodes(self) -> list[str]:
        return [n["name"] for n in self.manifest["nodes"]] if self.manifest else []

    @property
    def gan_nodes(self) -> list[str]:
        """Nodes, in partition order, whose GAN outputs are in the report."""
        made = {g.get("node") for g in self.gans}
        return [n for n in self.nodes if n in made]

    def run(self, strategy: str) -> Run | None:
        return next((r for r in self.runs if r.strategy == strategy), None)

    @property
    def empty(self) -> bool:
        return not (self.manifest or self.runs or self.cv_runs or self.gans or self.audits or self.attacks)


def load_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not readable JSON ({exc}); re-run the stage that wrote it") from exc


def load_metrics(folder: Path) -> pd.DataFrame:
    path = Path(folder) / "metrics.csv"
    if not path.is_file():
        raise UserError(f"{path} is missing; re-run fedcli federate")
    return pd.read_csv(path)


def load_run(folder: Path) -> Run:
    config = load_json(folder / "config.json")["config"]
    comm, batchnorm, global_metrics, budget = (pd.read_csv(folder / name) if (folder / name).is_file() else None
                                               for name in ("comm.csv", "bn_statistics.csv", "global_test.csv",
                                                            "budget.csv"))
    return Run(config["strategy"], config.get("fold"), config, load_metrics(folder), comm, folder, batchnorm,
               global_metrics, budget)


def finished(folder: Path) -> list[Path]:
    """Strategy folders below `folder` that a completed federate run wrote (hidden ones are work in progress)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and (p / "config.json").is_file())


def strategy_order(name: str) -> int:
    names = REGISTRY.names()
    return names.index(name) if name in names else len(names)


RULES_SINCE = {"replay_mix": "replay on the real images' steps (--replay-mix)",
               "encoder_rule": "FedReplay's trained encoder (--encoder-rule)"}  # options whose absence is another rule


def earlier_rules(meta: dict) -> list[str]:
    """The rules a federate run predates: options its strategy declares whose absence from its config means
    numbers made another way (issue 54), so that the report never pairs them with today's."""
    config = meta.get("config") or {}
    declaration = REGISTRY.get(config.get("strategy")) if meta.get("stage") == "federate" else None
    declared = {f.name for f in declaration.option_fields()} if declaration else set()
    return [f"the rule before {why}" for name, why in RULES_SINCE.items() if name in declared and name not in config]


def load_sub(folder: Path) -> SubExperiment:
    manifest_path = folder / "partition" / "manifest.json"
    manifest = load_json(manifest_path) if manifest_path.is_file() else None
    stale: list[Stale] = []

    def current(artifact: Path) -> bool:
        """Whether an artifact folder was made from what the experiment holds now, by today's rules (else noted as
        stale)."""
        outdated = stale_inputs(artifact / CONFIG) or earlier_rules(load_json(artifact / CONFIG))
        if outdated:
            stage = load_json(artifact / CONFIG).get("stage", "the stage that wrote it")
            stale.append(Stale(artifact, stage, outdated))
        return not outdated

    runs = sorted((load_run(p) for p in finished(folder / "federate") if current(p)),
                  key=lambda r: strategy_order(r.strategy))
    cv_roots = [folder / "federate" / "cv", *sorted((folder / "select").glob("*/federate/cv"))]
    cv_runs = [load_run(fold) for root in cv_roots if root.is_dir() for strategy in sorted(root.iterdir())
               if strategy.is_dir() and not strategy.name.startswith(".") for fold in finished(strategy)
               if current(fold)]
    gans = [load_json(p / CONFIG) for p in finished(folder / "gan") if current(p)]
    audits = [load_json(p / "summary.json") for p in finished(folder / "audit")
              if (p / "summary.json").is_file() and current(p)]
    attacks = {p.name: load_json(p / "summary.json") for p in finished(folder / "attacks")
               if (p / "summary.json").is_file() and current(p)}
    return SubExperiment(folder, point_values(folder), manifest, runs, cv_runs, gans, audits, stale, attacks)


def load_experiment(exp: Path) -> list[SubExperiment]:
    """The experiment's sub-experiments with artifacts; a folder with none at all is an error."""
    exp = Path(exp)
    if not exp.is_dir():
        raise UserError(f"experiment folder {exp} does not exist; pass the --exp of an earlier stage")
    subs = [load_sub(exp)] + [load_sub(p) for p in sorted((exp / "runs").glob("*")) if p.is_dir()]
    subs = [s for s in subs if not s.empty]
    if not subs:
        raise UserError(f"{exp} holds no fedcli artifacts (no partition, gan, federate or audit folder); run "
                        f"fedcli run RECIPE --exp {exp} or the stages first")
    return subs


def replicate_groups(subs: list[SubExperiment]) -> dict[str, list[SubExperiment]]:
    """Sub-experiments keyed by their sweep values without the seed ('' when nothing but seeds varies)."""
    groups: dict[str, list[SubExperiment]] = {}
    for sub in subs:
        name = key_values((k.split(".", 1)[1], v) for k, v in sub.point.items() if k != SEED_KEY)
        groups.setdefault(name, []).append(sub)
    return groups


def stylegan_subs(subs: list[SubExperiment]) -> list[SubExperiment]:
    """The sub-experiments whose generators are all StyleGAN2s: what the tables over its settings (alpha, DP)
    compare (a VQ-VAE-2 has neither setting)."""
    return [s for s in subs if all(g["config"].get("generator", "stylegan2") == "stylegan2" for g in s.gans)]


def by_dp_setting(subs: list[SubExperiment]) -> dict[float | None, list[SubExperiment]]:
    """StyleGAN sub-experiments by their GANs' --dp-epsilon (None: no DP; inf: the DP path without noise), targets
    in increasing order, then inf, then no DP; a sub-experiment whose nodes differ, or without GANs, is left out."""
    groups: dict[float | None, list[SubExperiment]] = {}
    for sub in stylegan_subs(subs):
        settings = {g["config"].get("dp_epsilon") for g in sub.gans}
        if len(settings) == 1:
            groups.setdefault(settings.pop(), []).append(sub)
    return dict(sorted(groups.items(), key=lambda kv: (2, 0) if kv[0] is None else (int(math.isinf(kv[0])), kv[0])))


def by_skew(subs: list[SubExperiment]) -> dict[float, list[SubExperiment]]:
    """Sub-experiments by the label skew their partition was asked for (`--scheme skew --ks`), in order."""
    groups: dict[float, list[SubExperiment]] = {}
    for sub in subs:
        if sub.manifest and sub.manifest.get("ks") is not None:
            groups.setdefault(sub.manifest["ks"], []).append(sub)
    return dict(sorted(groups.items()))


def decoded_fidelity(gan: dict) -> dict | None:
    """A VQ-VAE-2 node's fidelity score of its decoded codes: scored beside a prior's samples, or the buffer's own
    where the buffer is its decoded codes; None where none was scored (under DP no codes are decoded)."""
    fidelity = gan.get("fidelity")
    if not fidelity:
        return None
    if "decoded" in fidelity:
        return fidelity["decoded"]
    return fidelity if gan.get("buffer_kind") == "decoded codes" else None


def dp_label(epsilon: float | None) -> str:
    return "no DP" if epsilon is None else f"epsilon {epsilon:g}"


def final_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    return metrics[metrics["round"] == metrics["round"].max()]


def own_rows(metrics: pd.DataFrame) -> pd.DataFrame:
    """Rows of each node's model (or the one shared model) on that node's own test set."""
    return metrics[(metrics.model_node == metrics.test_node) | metrics.model_node.isin(REGISTRY.shared_model_keys())]


def own_scores(metrics: pd.DataFrame, metric: str) -> dict[str, float]:
    """Each node's own-test-set score at the final round."""
    return {str(r.test_node): float(getattr(r, metric)) for r in own_rows(final_rows(metrics)).itertuples()}


def best_validation_scores(metrics: pd.DataFrame, metric: str) -> dict[str, float]:
    """Each node's own-test-set score under its model of the evaluated round with the best accuracy on the node's
    validation part (the first such round), as FedPerl's authors report; {} without validation accuracies."""
    if "validation_accuracy" not in metrics:
        return {}
    rows = own_rows(metrics).dropna(subset=["validation_accuracy"]).sort_values("round", kind="stable")
    best = rows.loc[rows.groupby("test_node").validation_accuracy.idxmax()]
    return {str(r.test_node): float(getattr(r, metric)) for r in best.itertuples()}


def cross_scores(metrics: pd.DataFrame, metric: str, nodes: list[str]) -> dict[str, list[float]]:
    """For each test set: every node model's score on it, final round (node convergence)."""
    rows = final_rows(metrics)
    rows = rows[rows.model_node.isin(nodes)]
    return {node: rows[rows.test_node == node][metric].astype(float).tolist() for node in nodes}


def global_score(run: Run, metric: str) -> float | None:
    """The run's final score on the global test set: its one shared model's, or the mean of its node models' (the
    ensemble aside); None where the run has no global test rows."""
    if run.global_metrics is None:
        return None
    rows = final_rows(run.global_metrics)
    return float(rows[rows.model_node != ENSEMBLE][metric].astype(float).mean())


def source_of(run: Run) -> str | None:
    return run.config.get("replay_source")


def variant_label(run: Run) -> str:
    """A run's column or line: its strategy, and for a replay strategy what it replayed (`cwt-replay [codes]`)."""
    source = source_of(run)
    return run.strategy if source is None else f"{run.strategy} [{source}]"


def distinct_attacks(subs: list[SubExperiment]) -> list[tuple[SubExperiment, str, dict]]:
    """(sub-experiment, strategy, attack summary), each measurement once: a summary that repeats another bitwise is
    the same federation attacked again in another sub-experiment (fedcli is deterministic), not another sample."""
    seen, found = set(), []
    for sub in subs:
        for strategy, summary in sub.attacks.items():
            if (key := (strategy, json.dumps(summary, sort_keys=True))) not in seen:
                seen.add(key)
                found.append((sub, strategy, summary))
    return found
