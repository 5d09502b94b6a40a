"""FedPerl's calibration figures from the final models' test-set predictions (predictions.safetensors): per client
(its own test set, pooled over a variant's seeds), the reliability diagram on Ding et al.'s adaptive bins (those
of the adaptive ECE and MCE, metrics/adaptive_bins.py: accuracy against each bin's mean top-label confidence), as
FedPerl draws one per client; and per variant, pooled over clients and seeds, the risk-coverage curve (the error
rate among the most confident images as the share kept grows; its area, AURC, lower is better: Geifman and
El-Yaniv 2017)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcli.experiment.plotting import pyplot, save_figure
from fedcli.metrics.adaptive_bins import adaptive_bins
from fedcli.report.collect import Run, SubExperiment
from fedcli.report.paired import own_predictions


def by_client(runs: list[tuple[Run, SubExperiment]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each client's (labels, softmax) on its own test set under its final model, pooled over the runs (seeds)."""
    labels: dict[str, list[np.ndarray]] = {}
    probs: dict[str, list[np.ndarray]] = {}
    for run, sub in runs:
        for node, (y, p) in (own_predictions(run, sub.nodes, len(sub.manifest["label_names"])) or {}).items():
            labels.setdefault(node, []).append(y)
            probs.setdefault(node, []).append(p)
    return {node: (np.concatenate(labels[node]), np.concatenate(probs[node])) for node in labels}


def pooled(clients: dict[str, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Every client's (labels, softmax) in one."""
    return np.concatenate([y for y, _ in clients.values()]), np.concatenate([p for _, p in clients.values()])


def risk_coverage(labels: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(coverage k/n, error rate among the k most confident, AURC: the mean of the risks over k = 1..n)."""
    order = np.argsort(-probs.max(axis=1), kind="stable")
    errors = (probs.argmax(axis=1) != labels)[order]
    kept = np.arange(1, len(labels) + 1)
    risk = np.cumsum(errors) / kept
    return kept / len(labels), risk, float(risk.mean())


def reliability(labels: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per adaptive bin (the most confident first): mean confidence, accuracy, images."""
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    bins = adaptive_bins(confidence)
    kept = range(int(bins.max()) + 1) if len(bins) else range(0)
    return (np.array([confidence[bins == b].mean() for b in kept]), np.array([correct[bins == b].mean() for b in kept]),
            np.array([(bins == b).sum() for b in kept]))


def calibration_figure(variants: dict[str, list[tuple[Run, SubExperiment]]], path: Path) -> dict[str, float]:
    """Per client a reliability diagram with every variant's line, and every variant's risk-coverage curve (the
    last panel); its AURCs."""
    data = {name: found for name, runs in variants.items() if (found := by_client(runs))}
    if not data:
        return {}
    clients = sorted({node for found in data.values() for node in found}, key=lambda n: (len(n), n))
    plt = pyplot()
    columns = min(4, len(clients) + 1)
    rows = -(-(len(clients) + 1) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.3 * rows), squeeze=False)
    panels = list(axes.flat)
    aurc = {}
    for i, (name, found) in enumerate(data.items()):
        style = "-" if i < 10 else "--"
        for ax, node in zip(panels, clients):
            if node in found:
                confidence, accuracy, _ = reliability(*found[node])
                ax.plot(confidence, accuracy, marker="o", markersize=3, linestyle=style, label=name)
        labels, probs = pooled(found)
        coverage, risk, aurc[name] = risk_coverage(labels, probs)
        panels[len(clients)].plot(coverage, risk, linestyle=style, label=f"{name} (AURC {aurc[name]:.3f})")
    for ax, node in zip(panels, clients):
        ax.plot([0, 1], [0, 1], color="gray", linewidth=0.8, linestyle=":")
        ax.set(xlabel="top-label confidence (adaptive bin mean)", ylabel="accuracy", title=f"Reliability: {node}")
    panels[len(clients)].set(xlabel="coverage (most confident share kept)", ylabel="risk (error rate)",
                             title="Risk-coverage (clients pooled)")
    for ax in panels[len(clients) + 1:]:
        ax.axis("off")
    for ax in panels[:len(clients) + 1]:
        ax.grid(alpha=0.3)
    panels[0].legend(fontsize=5)
    panels[len(clients)].legend(fontsize=5)
    save_figure(fig, path, dpi=110, bbox_inches="tight")
    return aurc
