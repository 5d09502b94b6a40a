"""A report table and what the study's tables share: the strategies of a family, their cells (mean +- std over seeds or
folds) and intervals. A builder returns a `ReportTable`, or a `Missing` that says what would produce it."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from fedcli.experiment.config import LOWER_IS_BETTER
from fedcli.federate.strategies import REGISTRY
from fedcli.report.collect import Stat, SubExperiment, cross_scores, own_scores

# the table families strategies declare (federate/strategies/): Tables 2, 4 and the paired table, 7, and 3
BASELINES, FEDERATED, VARIANTS, CONVERGENCE = "baselines", "federated", "variants", "convergence"
MB = 1e6


@dataclasses.dataclass
class ReportTable:
    key: str  # file stem of its CSV and LaTeX files
    title: str
    frame: pd.DataFrame  # index: row labels; cells: Stat or str
    note: str = ""
    mark_best: bool = False  # bold the best value of each Stat column
    lower_is_better: bool = False  # the best is the lowest (ECE)
    rows_are: str = "strategy"  # what the row labels name, when the frame's index has no name

    def __post_init__(self) -> None:
        if self.frame.index.name is None:
            self.frame = self.frame.rename_axis(self.rows_are)


@dataclasses.dataclass
class Missing:
    title: str
    needs: str


Built = ReportTable | Missing


def cross_evaluated(config: dict) -> bool:
    """Whether a run tested every node model on every test set (the distributed engine only with
    --cross-eval; the in-process simulation always)."""
    return config.get("engine", "inprocess") == "inprocess" or bool(config.get("cross_eval"))


def strategies_in(subs: list[SubExperiment], family: str) -> list[str]:
    """The strategies of a table family (federate/strategies/) that the sub-experiments ran, in the registry's order."""
    present = {r.strategy for s in subs for r in s.runs}
    return [name for name in REGISTRY.family(family) if name in present]


def distinct(subs: list[SubExperiment], strategy: str) -> list[SubExperiment]:
    """Sub-experiments with their own run of `strategy`: one that a sweep shared (a symlink) counts once."""
    seen, out = set(), []
    for s in subs:
        run = s.run(strategy)
        if run is not None and run.folder.resolve() not in seen:
            seen.add(run.folder.resolve())
            out.append(s)
    return out


def nodes_of(subs: list[SubExperiment]) -> list[str]:
    return next((s.nodes for s in subs if s.nodes), [])


def performance_cells(subs: list[SubExperiment], strategy: str, metric: str, nodes: list[str]) -> dict:
    """Own-model score per node and the per-task mean, each a Stat over the replicates."""
    scores = [own_scores(run.metrics, metric) for s in subs if (run := s.run(strategy)) is not None]
    cells = {node: Stat.of([sc.get(node) for sc in scores]) for node in nodes}
    cells["mean"] = Stat.of([np.mean([sc[n] for n in nodes if n in sc]) for sc in scores])
    return cells


def convergence_values(subs: list[SubExperiment], strategy: str, metric: str, nodes: list[str]) -> dict:
    """Per test set: every node model's score, pooled over replicates."""
    pooled: dict[str, list[float]] = defaultdict(list)
    for s in subs:
        if (run := s.run(strategy)) is not None and cross_evaluated(run.config):
            for node, values in cross_scores(run.metrics, metric, nodes).items():
                pooled[node] += values
    return pooled


def performance_table(key: str, title: str, subs, strategies, metric: str, mark_best: bool = False,
                      note: str = "") -> ReportTable:
    nodes = nodes_of(subs)
    frame = pd.DataFrame({name: performance_cells(subs, name, metric, nodes) for name in strategies}).T
    frame.index.name = "strategy"
    return ReportTable(key, title, frame, note, mark_best, lower_is_better=metric in LOWER_IS_BETTER)


def interval(differences: list[float]) -> str:
    """mean [low, high] of paired differences, the 95% t-interval over them; '-' with fewer than two."""
    if len(differences) < 2:
        return "-"
    mean, half = float(np.mean(differences)), t_half_width(float(np.std(differences, ddof=1)), len(differences))
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def t_half_width(std: float, n: int) -> float:
    """Half the width of the 95% t-interval of a mean of n values with sample std `std`."""
    return float(scipy_stats.t.ppf(0.975, n - 1)) * std / np.sqrt(n)
