"""FedPerl's calibration figures from the final models' test-set predictions (predictions.safetensors), pooled over
a variant's clients and seeds: the reliability diagram (accuracy against top-label confidence in 15 equal-width
bins, as the ECE's) and the risk-coverage curve (the error rate among the most confident images as the share
kept grows; its area, AURC, lower is better: Geifman and El-Yaniv 2017)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcli.fl.evaluate import equal_width_bins
from fedcli.plotting import pyplot
from fedcli.report.collect import Run, SubExperiment
from fedcli.report.paired import own_predictions


def pooled(runs: list[tuple[Run, SubExperiment]]) -> tuple[np.ndarray, np.ndarray] | None:
    """(labels, softmax) of every client's own test set under its final model, over the runs; None without any."""
    labels, probs = [], []
    for run, sub in runs:
        found = own_predictions(run, sub.nodes, len(sub.manifest["label_names"]))
        for y, p in (found or {}).values():
            labels.append(y)
            probs.append(p)
    return (np.concatenate(labels), np.concatenate(probs)) if labels else None


def risk_coverage(labels: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(coverage k/n, error rate among the k most confident, AURC: the mean of the risks over k = 1..n)."""
    order = np.argsort(-probs.max(axis=1), kind="stable")
    errors = (probs.argmax(axis=1) != labels)[order]
    kept = np.arange(1, len(labels) + 1)
    risk = np.cumsum(errors) / kept
    return kept / len(labels), risk, float(risk.mean())


def reliability(labels: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per non-empty equal-width bin (k/15, (k+1)/15]: mean confidence, accuracy, images."""
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    bins = equal_width_bins(confidence)
    kept = sorted(set(bins.tolist()))
    return (np.array([confidence[bins == b].mean() for b in kept]), np.array([correct[bins == b].mean() for b in kept]),
            np.array([(bins == b).sum() for b in kept]))


def calibration_figure(variants: dict[str, list[tuple[Run, SubExperiment]]], path: Path) -> dict[str, float]:
    """The reliability diagram and the risk-coverage curve of every variant with predictions; its AURCs."""
    data = {name: found for name, runs in variants.items() if (found := pooled(runs)) is not None}
    if not data:
        return {}
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    left.plot([0, 1], [0, 1], color="gray", linewidth=0.8, linestyle=":")
    aurc = {}
    for i, (name, (labels, probs)) in enumerate(data.items()):
        style = "-" if i < 10 else "--"
        confidence, accuracy, _ = reliability(labels, probs)
        left.plot(confidence, accuracy, marker="o", markersize=3, linestyle=style, label=name)
        coverage, risk, aurc[name] = risk_coverage(labels, probs)
        right.plot(coverage, risk, linestyle=style, label=f"{name} (AURC {aurc[name]:.3f})")
    left.set(xlabel="top-label confidence (bin mean)", ylabel="accuracy", title="Reliability (15 equal-width bins)")
    right.set(xlabel="coverage (most confident share kept)", ylabel="risk (error rate)", title="Risk-coverage")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return aurc
