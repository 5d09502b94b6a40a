"""Evaluation of classifiers on test sets, with bootstrap 95% confidence intervals.

Metrics: accuracy, balanced accuracy, macro F1, AUROC (binary; macro one-vs-rest for several
classes, over the classes present), and sensitivity/specificity for binary tasks. The bootstrap
resamples the test set B times from a keyed stream; all B resamples are computed at once from
resample counts (confusion matrices by bincount; AUROC as a weighted Mann-Whitney statistic).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedcli.data.dataset import to_float

METRICS = ("accuracy", "balanced_accuracy", "f1_macro", "auroc")
BINARY_METRICS = ("sensitivity", "specificity")


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, device: str = "cpu", batch: int = 256) -> np.ndarray:
    """Softmax probabilities (N, C) for uint8 images."""
    model.eval()
    out = [torch.softmax(model(to_float(images[i:i + batch]).to(device)), dim=1).cpu()
           for i in range(0, len(images), batch)]
    return torch.cat(out).double().numpy()


def metric_values(y: np.ndarray, probs: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Metrics for each row of resample counts `weights` (B, n); row of ones = the plain test set."""
    n_classes = probs.shape[1]
    pred = probs.argmax(axis=1)
    boots = weights.shape[0]
    cells = (np.arange(boots)[:, None] * n_classes * n_classes + y[None, :] * n_classes + pred[None, :]).ravel()
    confusion = np.bincount(cells, weights=weights.ravel(), minlength=boots * n_classes * n_classes)
    confusion = confusion.reshape(boots, n_classes, n_classes)
    true_per_class, pred_per_class = confusion.sum(axis=2), confusion.sum(axis=1)
    hits = np.diagonal(confusion, axis1=1, axis2=2)
    present = true_per_class > 0
    seen = present | (pred_per_class > 0)  # macro F1 counts predicted-only classes (F1 = 0), as scikit-learn
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.where(present, hits / true_per_class, np.nan)
        precision = np.where(pred_per_class > 0, hits / pred_per_class, 0.0)
        f1 = np.where(seen, np.nan_to_num(2 * precision * np.nan_to_num(recall) / (precision + np.nan_to_num(recall))),
                      np.nan)
    out = {
        "accuracy": hits.sum(axis=1) / weights.sum(axis=1),
        "balanced_accuracy": mean_of_defined(recall, axis=1),
        "f1_macro": mean_of_defined(f1, axis=1),
        "auroc": auroc(y, probs, weights),
    }
    if n_classes == 2:
        out["sensitivity"], out["specificity"] = recall[:, 1], recall[:, 0]
    return out


def auroc(y: np.ndarray, probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Macro one-vs-rest AUROC (binary: of class 1) per resample, over classes with both sides present."""
    classes = [1] if probs.shape[1] == 2 else range(probs.shape[1])
    per_class = []
    for c in classes:
        pos, neg = y == c, y != c
        if not pos.any() or not neg.any():
            continue
        s_pos, s_neg = probs[pos, c], probs[neg, c]
        wins = (s_pos[:, None] > s_neg[None, :]) + 0.5 * (s_pos[:, None] == s_neg[None, :])
        w_pos, w_neg = weights[:, pos], weights[:, neg]
        with np.errstate(invalid="ignore", divide="ignore"):
            per_class.append(((w_pos @ wins) * w_neg).sum(axis=1) / (w_pos.sum(1) * w_neg.sum(1)))
    if not per_class:
        return np.full(weights.shape[0], np.nan)
    return mean_of_defined(np.stack(per_class), axis=0)


def mean_of_defined(values: np.ndarray, axis: int) -> np.ndarray:
    """The mean over the non-NaN entries along `axis`; NaN where there are none. np.nanmean gives the same
    numbers but warns on stderr for every resample that lacks a class, which small test sets often do."""
    defined = ~np.isnan(values)
    count = defined.sum(axis=axis)
    total = np.where(defined, values, 0.0).sum(axis=axis)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def evaluate(y: np.ndarray, probs: np.ndarray, rng: np.random.Generator, boots: int = 1000) -> dict[str, float]:
    """Point estimates and bootstrap percentile 95% intervals: `<metric>`, `<metric>_lo`, `<metric>_hi`."""
    n = len(y)
    point = metric_values(y, probs, np.ones((1, n)))
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=boots).astype(float)  # resample counts
    resampled = metric_values(y, probs, counts)
    out = {}
    for name, value in point.items():
        out[name] = float(value[0])
        finite = resampled[name][np.isfinite(resampled[name])]
        lo, hi = np.percentile(finite, [2.5, 97.5]) if len(finite) else (np.nan, np.nan)
        out[f"{name}_lo"], out[f"{name}_hi"] = float(lo), float(hi)
    return out
