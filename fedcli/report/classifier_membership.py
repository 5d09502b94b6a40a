"""The privacy frontier's rows of the membership attacks on the classifiers each federation shares
(audit/classifier_membership.py: `membership` in `<exp>/attacks/<strategy>/summary.json`): one row per strategy,
pooled over its nodes, attacked models and sub-experiments, each distinct measurement once (collect.distinct_attacks)."""

from __future__ import annotations

from collections import defaultdict

from fedcli.report.collect import Stat, SubExperiment, distinct_attacks
from fedcli.report.table import nodes_of, performance_cells


def readings(summary: dict) -> list[dict]:
    """Every (node, attacked model) reading of one summary's membership section."""
    return [model for section in summary["membership"]["nodes"].values()
            for model in section.get("models", {}).values()]


def low_fpr_cell(games: list[dict]) -> str:
    """The games' TPR at the lowest FPR their OUT trials resolve, read as frontier.py's generator rows read theirs:
    the TPRs' mean ± std, at the coarsest such FPR, with the fewest OUT trials of a game."""
    points = [game["low_fpr"]["at_min_fpr"] for game in games if game["low_fpr"]["at_min_fpr"]]
    if not points:
        return "-"
    return (f"{Stat.of([p['tpr'] for p in points])} at FPR {max(p['min_fpr'] for p in points):.2g} "
            f"(n={min(game['low_fpr']['out_trials'] for game in games)})")


def classifier_rows(subs: list[SubExperiment], metric: str) -> dict[str, dict]:
    """Per strategy attacked for membership: the loss attack's AUROC, the LiRA game's target AUROC, TPR at low FPR
    and empirical epsilon lower bound (where references were trained), and its final-round `metric`."""
    measured = [(sub, strategy, summary) for sub, strategy, summary in distinct_attacks(subs)
                if "membership" in summary]
    pooled: dict[str, list[dict]] = defaultdict(list)
    targets = {}
    for _, strategy, summary in measured:
        pooled[strategy] += readings(summary)
        targets[strategy] = summary["membership"]["settings"]["target"]
    nodes = nodes_of(subs)
    rows = {}
    for strategy, found in pooled.items():
        games = [reading["lira"] for reading in found if "lira" in reading]
        rows[f"{strategy}: {targets[strategy]} (membership)"] = {
            "membership AUROC": Stat.of([reading["loss"]["auroc"] for reading in found]),
            "LiRA AUROC": Stat.of([game["target"]["auroc"] for game in games]),
            "LiRA TPR at low FPR": low_fpr_cell(games),
            "empirical epsilon": Stat.of([game["empirical_epsilon"]["epsilon_lower_bound"] for game in games]),
            metric: performance_cells([s for s, name, _ in measured if name == strategy], strategy, metric,
                                      nodes)["mean"]}
    return rows
