"""Paired bootstrap differences from FedER on the same test sets: Table 4's own intervals.

federate scores every strategy on the same bootstrap resamples of each test set (`resample_counts`,
keyed by the seed and the test node only) and keeps each final model's softmax on its own test set
(predictions.safetensors). So a strategy's score and FedER's on resample b are two measurements of
the same images, and their difference on resample b is one draw of the difference's sampling
distribution: the percentile interval of those B differences is the difference's own 95% interval,
narrower than the two scores' intervals would suggest when the strategies err on the same images.
The mean over nodes is differenced per resample too; with several seeds, each resample's differences
are averaged over the seeds (their test sets are independent draws).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedcli.core.errors import UserError
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifact_kinds import load_recorded
from fedcli.experiment.paths import PREDICTIONS
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.base import LABELS
from fedcli.metrics.scores import metric_values, percentile_interval, resample_counts
from fedcli.report.collect import Run, SubExperiment


def own_predictions(run: Run, nodes: list[str], classes: int) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """test node -> (labels, softmax of the node's own or the shared model); None for a run written before
    federate kept its predictions."""
    path = run.folder / PREDICTIONS
    if not path.is_file():
        return None
    fix = f"re-run fedcli federate --strategy {run.strategy}"
    tensors, _ = load_recorded(path, f"{run.strategy}'s test-set predictions", fix)
    out = {}
    for node in nodes:
        key = next((f"{k}/{node}" for k in (node, *REGISTRY.shared_model_keys()) if f"{k}/{node}" in tensors), None)
        labels = tensors.get(f"{LABELS}/{node}")
        if key is None or labels is None:
            return None  # a distributed run with this node elsewhere: nothing to pair on
        probs, y = tensors[key].double().numpy(), labels.long().numpy()
        if probs.shape != (len(y), classes) or ((y < 0) | (y >= classes)).any():
            raise UserError(f"{path} holds {tuple(probs.shape)} probabilities for {len(y)} labels of {classes} "
                            f"classes on node {node}; {fix}")
        out[node] = y, probs
    return out


def scores(run: Run, sub: SubExperiment, column: str) -> dict[str, np.ndarray] | None:
    """test node -> the metric on the whole test set (index 0) and on each bootstrap resample (1..B)."""
    manifest = Manifest(sub.manifest)
    names = manifest["label_names"]
    found = own_predictions(run, sub.nodes, len(names))
    if found is None:
        return None
    out = {}
    for node, (y, probs) in found.items():
        counts = resample_counts(run.config["seed"], node, len(y), int(run.config["bootstrap"]))
        weights = np.vstack([np.ones((1, len(y))), counts])
        out[node] = metric_values(y, probs, weights, manifest.positive_class, names)[column]
    return out


def with_mean(scored: dict[str, np.ndarray], nodes: list[str]) -> dict[str, np.ndarray]:
    """Per-node scores plus their mean over nodes, resample by resample."""
    return scored | {"mean": np.mean([scored[n] for n in nodes], axis=0)}


def differences(subs: list[SubExperiment], strategy: str, column: str,
                feder: list[dict[str, np.ndarray] | None]) -> tuple[dict[str, np.ndarray], int] | None:
    """Per node and for the mean over nodes: strategy minus FedER (`feder`: its scores in each sub), per
    resample, averaged over the seeds that ran both on the same resamples (index 0: the whole test sets);
    and how many seeds that is."""
    per_seed = []
    for sub, base in zip(subs, feder):
        run = sub.run(strategy)
        if run is None or base is None or run.config.get("bootstrap") != sub.run("feder").config.get("bootstrap"):
            continue
        scored = scores(run, sub, column)
        if scored is not None:
            other = with_mean(scored, sub.nodes)
            per_seed.append({key: other[key] - base[key] for key in base})
    if not per_seed:
        return None
    return {key: np.mean([d[key] for d in per_seed], axis=0) for key in per_seed[0]}, len(per_seed)


def cell(values: np.ndarray) -> str:
    lo, hi = percentile_interval(values[1:])
    return f"{values[0]:+.3f} [{lo:+.3f}, {hi:+.3f}]" if np.isfinite(values[0]) else "-"


def paired_bootstrap_frame(subs: list[SubExperiment], strategies: list[str], column: str) -> pd.DataFrame | None:
    feder = [None if (run := sub.run("feder")) is None or (scored := scores(run, sub, column)) is None
             else with_mean(scored, sub.nodes) for sub in subs]  # scored once, paired with every strategy
    rows = {}
    for name in strategies:
        if name == "feder" or (found := differences(subs, name, column, feder)) is None:
            continue
        diff, seeds = found
        rows[name] = {"seeds": seeds, **{key: cell(values) for key, values in diff.items()}}
    if not rows:
        return None
    frame = pd.DataFrame(rows).T
    frame.index.name = "strategy"
    return frame
