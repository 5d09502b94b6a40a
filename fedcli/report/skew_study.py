"""The generative-replay study's readings (Qu et al. 2022, Fig. 5 and 7): each method against the label skew of
the training splits, its differences from CWT, FedAvg and central paired by seed, and what each method spent.

A method's score at a skew level is its final round's, on the partition's global test set where the partition
has one (partition --global-test: the same images at every level and seed, so levels differ only in how the
training data is spread), else the mean over nodes of its own-site test sets. Skew is the mean pairwise KS
statistic for two classes and total variation for more, named so in every column and axis.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from fedcli.comm.transport import EVERYONE
from fedcli.experiment.config import LOWER_IS_BETTER
from fedcli.federate.strategies import REGISTRY
from fedcli.report.collect import Run, Stat, SubExperiment, by_skew, global_score, own_scores, variant_label
from fedcli.report.table import Built, Missing, ReportTable, t_half_width

BASELINES = ("cwt", "fedavg", "central")  # what the replay methods are read against
REPLAY_METHODS = ("cwt-replay", "fedavg-replay", "fedreplay")
MB = 2**20


def skew_measure(subs: list[SubExperiment]) -> str:
    """The skew's name: KS for a two-class task, total variation for more."""
    classes = next((len(s.manifest["label_names"]) for s in subs if s.manifest), 2)
    return "KS" if classes == 2 else "total variation"


def on_global_test(subs: list[SubExperiment]) -> bool:
    """Whether every run is scored on a global test set (else every run on its own-site test sets)."""
    runs = [run for s in subs for run in s.runs]
    return bool(runs) and all(run.global_metrics is not None for run in runs)


def score(run: Run, metric: str, global_test: bool) -> float:
    """A run's final score: on the global test set, or the mean over nodes of its own-site test sets."""
    if global_test:
        return global_score(run, metric)
    return float(np.mean(list(own_scores(run.metrics, metric).values())))


def seed(sub: SubExperiment) -> int:
    return sub.manifest["seed"]


def scores_by_seed(reps: list[SubExperiment], metric: str, global_test: bool
                   ) -> dict[str, dict[int, float]]:
    """Column label (a replay strategy with its replay source) -> seed -> score, at one skew level; a run a sweep
    shared between sub-experiments (a symlink) counts once."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for sub in reps:
        for run in sub.runs:
            out[variant_label(run)][seed(sub)] = score(run, metric, global_test)
    return out


def columns(subs: list[SubExperiment]) -> list[str]:
    """Every method's column, in the registry's order, a replay method once per replay source."""
    labels = {variant_label(run): run.strategy for s in subs for run in s.runs}
    order = {name: i for i, name in enumerate(REGISTRY.names())}
    return sorted(labels, key=lambda label: (order[labels[label]], label))


def seed_interval(stat: Stat) -> str:
    """mean [low, high], the 95% t-interval of a mean over seeds; the mean alone from one seed."""
    if stat.n < 2:
        return str(stat)
    half = t_half_width(stat.std, stat.n)
    return f"{stat.mean:.3f} [{stat.mean - half:.3f}, {stat.mean + half:.3f}]"


def reached(sub: SubExperiment, key: str) -> float | None:
    """A partition's recorded skew statistic; None for a manifest from before the training splits were measured."""
    statistics = sub.manifest.get("statistics") or {}
    return statistics.get(key) if "test_label_skew_tv" in statistics else None


def test_set_words(global_test: bool) -> str:
    return ("on the partition's global test set (the same images at every level and seed; a method with node "
            "models: the mean of its node models' scores)" if global_test else
            "the mean over nodes of each method's final model on each node's own test set (a shared model on every "
            "node's)")


def skew_table(subs: list[SubExperiment], metric: str) -> Built:
    """Each method's score at every label-skew level, with the skew its training and test splits reached."""
    measure = skew_measure(subs)
    title = f"Label skew: performance against the mean pairwise {measure} of the training splits"
    groups = by_skew(subs)
    if len(groups) < 2:
        return Missing(title, "partitions at several --scheme skew --ks levels (a [sweep] over partition.ks)")
    global_test = on_global_test(subs)
    rows = {}
    for ks, reps in groups.items():
        by_seed = scores_by_seed(reps, metric, global_test)
        rows[f"{measure} {ks:g}"] = {
            f"reached ({measure}, training)": Stat.of([reached(s, "label_skew_tv") for s in reps]),
            f"test splits' {measure}": Stat.of([reached(s, "test_label_skew_tv") for s in reps]),
            **{label: seed_interval(Stat.of(list(by_seed.get(label, {}).values()))) for label in columns(reps)}}
    return ReportTable("label_skew", title, pd.DataFrame(rows).T,
                       f"{metric} at the final round, {test_set_words(global_test)}: the mean over seeds and its 95% "
                       f"t-interval [low, high] (one seed: the mean alone); reached: the mean pairwise {measure} of "
                       "the nodes' training labels (what --ks aims at), and of their own test splits (class-balanced), "
                       "mean ± std over seeds", lower_is_better=metric in LOWER_IS_BETTER, rows_are="skew")


def paired_table(subs: list[SubExperiment], metric: str) -> Built:
    """Each replay method minus CWT, FedAvg and central at every skew level, paired by seed."""
    measure = skew_measure(subs)
    title = f"Label skew: replay methods minus CWT, FedAvg and central, paired by seed, per {measure} level"
    groups = by_skew(subs)
    labels = [label for label in columns(subs) if label.split(" [")[0] in REPLAY_METHODS]
    present = {label for label in columns(subs) if label in BASELINES}
    if len(groups) < 2 or not labels or not present:
        return Missing(title, "replay methods and cwt, fedavg or central at several --ks levels")
    global_test = on_global_test(subs)
    rows = {}
    for ks, reps in groups.items():
        by_seed = scores_by_seed(reps, metric, global_test)
        for label in labels:
            cells = {}
            for base in BASELINES:
                seeds = sorted(set(by_seed.get(label, {})) & set(by_seed.get(base, {})))
                cells[f"minus {base}"] = seed_interval(Stat.of([by_seed[label][k] - by_seed[base][k] for k in seeds]))
            rows[f"{measure} {ks:g}: {label}"] = cells | {"seeds": len(by_seed.get(label, {}))}
    return ReportTable("label_skew_paired", title, pd.DataFrame(rows).T,
                       f"{metric} at the final round, {test_set_words(global_test)}: the method's score minus the "
                       "baseline's of the same seed (same partition and test set), the mean over seeds and its 95% "
                       "t-interval; positive: the replay method scores higher",
                       lower_is_better=metric in LOWER_IS_BETTER, rows_are="skew level and method")


def budget_table(subs: list[SubExperiment]) -> Built:
    """What each method spent per node: optimiser steps per round, real and replayed images seen, bytes sent."""
    title = "Label skew: optimiser steps, images seen and bytes per node, by method"
    groups = by_skew(subs)
    if len(groups) < 2:
        return Missing(title, "partitions at several --scheme skew --ks levels")
    per_label: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    seen = set()
    for sub in subs:
        nodes = sub.nodes
        for run in sub.runs:
            if run.budget is None or run.folder.resolve() in seen:
                continue
            seen.add(run.folder.resolve())
            cells = per_label[variant_label(run)]
            spent = run.budget
            later = spent[spent["round"] > 0].groupby(["round", "key"])["steps"].sum()
            cells["steps/node/round (rounds >= 1)"].append(later.sum() / len(nodes) / max(1, spent["round"].max()))
            cells["steps/node in round 0"].append(spent[spent["round"] == 0]["steps"].sum() / len(nodes))
            cells["real images seen/node"].append(spent["real"].sum() / len(nodes))
            cells["replayed images seen/node"].append(spent["replayed"].sum() / len(nodes))
            if run.comm is not None:
                training = run.comm[(run.comm.kind != "eval") & run.comm.sender.isin([*nodes, EVERYONE])]
                cells["sent/node (MB)"].append(training.bytes.sum() / len(nodes) / MB)
    if not per_label:
        return Missing(title, "federate runs with budget.csv")
    order = columns(subs)
    frame = pd.DataFrame({label: {k: Stat.of(v) for k, v in per_label[label].items()}
                          for label in order if label in per_label}).T
    return ReportTable("label_skew_budget", title, frame,
                       "counted from the local training loop of every run (budget.csv), mean ± std over the skew "
                       "levels and seeds: steps summed over a round's training calls of each node (a cyclic method's "
                       "visits, FedReplay's server head and central counted under the node or model that trained), "
                       "divided by the nodes; images seen: over the whole run; sent: training traffic (eval aside)",
                       rows_are="method")


def skew_points(subs: list[SubExperiment], metric: str) -> dict[str, dict[float, list[float]]]:
    """The figure's points: method -> skew level -> each seed's score."""
    global_test = on_global_test(subs)
    values: dict[str, dict[float, list[float]]] = defaultdict(dict)
    for ks, reps in by_skew(subs).items():
        for label, per_seed in scores_by_seed(reps, metric, global_test).items():
            values[label][ks] = list(per_seed.values())
    return values


def forgetting_table(subs: list[SubExperiment]) -> Built:
    """The generative-replay study's Table 1: during CWT's last cycle, each node's training data scored by the
    model after each visit (rows: the data; columns: the model after visiting each node in turn), at the highest
    label skew of the experiment; a run a sweep shared between sub-experiments counts once."""
    title = "CWT forgetting: each node's training data under the model after each visit of the last cycle"
    groups = by_skew(subs)
    level = max(groups) if groups else None
    chosen = groups[level] if groups else subs
    folders = {r.folder.resolve(): r.folder for s in chosen for r in s.runs if r.strategy == "cwt" and r.fold is None}
    frames = [pd.read_csv(folder / "forgetting.csv") for folder in folders.values()
              if (folder / "forgetting.csv").is_file()]
    if not frames:
        return Missing(title, "a cwt run with --forgetting")
    scores = pd.concat(frames)
    visits = scores.drop_duplicates("after_visit").sort_values("after_visit")
    columns = {v: f"after visit {v} ({node})" for v, node in zip(visits.after_visit, visits.visited)}
    rows = {data: {columns[v]: Stat.of(part[part.after_visit == v].accuracy.tolist()) for v in columns}
            for data, part in scores.groupby("data", sort=False)}
    where = f" at {skew_measure(subs)} {level:g}" if level is not None else ""
    return ReportTable("cwt_forgetting", title, pd.DataFrame(rows).T,
                       f"accuracy on each node's own training data{where}, mean ± std over {len(frames)} run(s); the "
                       "diagonal is the model just trained there, the cells to its right what it kept after moving on",
                       rows_are="training data of")
