"""The report's own figures: the metric per round per strategy, scalability (the FedER study's Fig. 2) and
the metric against label skew (the generative-replay study's)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from fedcli.experiment.plotting import pyplot, save_figure
from fedcli.report.collect import Stat, SubExperiment, by_dp_setting, dp_label, own_rows, own_scores, variant_label
from fedcli.report.skew_study import on_global_test, skew_measure, skew_points


def save(fig, path: Path) -> None:
    save_figure(fig, path, dpi=110, bbox_inches="tight")


def per_round(metrics, metric: str) -> dict[int, float]:
    """Mean over nodes of each node's own model (or the shared model) on its own test set, per round."""
    return {int(r): float(v) for r, v in own_rows(metrics).groupby("round")[metric].mean().items()}


def rounds_figure(subs: list[SubExperiment], metric: str, path: Path, title: str) -> bool:
    plt = pyplot()
    curves: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for sub in subs:
        for run in sub.runs:
            for round_, value in per_round(run.metrics, metric).items():
                curves[run.strategy][round_].append(value)
    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (strategy, points) in enumerate(curves.items()):
        xs = sorted(points)
        means = np.array([np.mean(points[x]) for x in xs])
        ax.plot(xs, means, marker="o", markersize=3, label=strategy, linewidth=2.2 if strategy == "feder" else 1.2,
                linestyle="-" if i < 10 else "--")  # the colour cycle has 10 colours
        if any(len(points[x]) > 1 for x in xs):
            stds = np.array([np.std(points[x], ddof=1) if len(points[x]) > 1 else 0.0 for x in xs])
            ax.fill_between(xs, means - stds, means + stds, alpha=0.15)
    ax.set_xlabel("round (0 = before federation)")
    ax.set_ylabel(f"{metric} (mean over nodes, own test set)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    save(fig, path)
    return True


def final_scores(points, metric: str) -> dict[str, dict[float, list[float]]]:
    """strategy (a replay strategy's with its replay source) -> x -> each run's final own-test-set score, mean over
    nodes, from (x, run) pairs; a run shared between sweep points (a symlink) counts once."""
    values: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    seen = set()
    for x, run in points:
        if run.folder.resolve() not in seen:
            seen.add(run.folder.resolve())
            values[variant_label(run)][x].append(float(np.mean(list(own_scores(run.metrics, metric).values()))))
    return values


def strategy_lines(values: dict[str, dict[float, list[float]]], metric: str, path: Path, xlabel: str,
                   title: str, scored_on: str = "mean over nodes") -> bool:
    """One line per strategy, mean ± std at each x, each its own colour; drawn only when there are two x values or
    more."""
    if len({x for per in values.values() for x in per}) < 2:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.set_prop_cycle(color=[*plt.get_cmap("tab10").colors, *plt.get_cmap("Dark2").colors])
    for strategy, per in values.items():
        xs = sorted(per)
        stats = [Stat.of(per[x]) for x in xs]
        ax.errorbar(xs, [s.mean for s in stats], yerr=[s.std for s in stats], marker="o", capsize=3, label=strategy)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{metric} ({scored_on})")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)
    return True


def scalability_figure(subs: list[SubExperiment], metric: str, path: Path) -> bool:
    """Final mean node performance against the number of nodes, per strategy (needs >= 2 node counts)."""
    points = ((len(sub.nodes), run) for sub in subs for run in sub.runs)
    return strategy_lines(final_scores(points, metric), metric, path, "number of nodes", "Scalability")


def skew_figure(subs: list[SubExperiment], metric: str, path: Path) -> bool:
    """Each method's final score against the label skew asked of the training splits (the generative-replay
    study's Fig. 5/7; report/skew_study.py); needs two levels or more."""
    return strategy_lines(skew_points(subs, metric), metric, path,
                          f"label skew of the training splits (mean pairwise {skew_measure(subs)})", "Label skew",
                          "global test set" if on_global_test(subs) else "mean over nodes")


def dp_figure(subs: list[SubExperiment], metric: str, path: Path) -> bool:
    """Per DP setting (targets, inf, no DP): the buffer's fidelity ratio, FedER's score and the membership
    AUROC, each the mean over nodes (and seeds) with its std."""
    groups = by_dp_setting(subs)
    if len(groups) < 2 or not any(setting is not None for setting in groups):
        return False
    series = {"fidelity ratio": lambda s: [(g.get("fidelity") or {}).get("ratio") for g in s.gans],
              f"FedER {metric}": lambda s: list(own_scores(run.metrics, metric).values())
              if (run := s.run("feder")) is not None else [],
              "membership AUROC": lambda s: [a["generators"]["privacy"]["mia"]["auroc"] for a in s.audits]}
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = np.arange(len(groups))
    for name, values_of in series.items():
        stats = [Stat.of([v for s in reps for v in values_of(s)]) for reps in groups.values()]
        ax.errorbar(xs, [st.mean for st in stats], yerr=[st.std for st in stats], marker="o", capsize=3, label=name)
    ax.axhline(0.5, color="grey", linewidth=0.8, linestyle=":")  # AUROC of no leak
    ax.set_xticks(xs, [dp_label(setting) for setting in groups])
    ax.set_ylim(0, 1.05)
    ax.set_title("Privacy against utility (mean over nodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)
    return True
