"""Evaluation of classifiers on test sets, with bootstrap 95% confidence intervals.

Metrics: accuracy, balanced accuracy, macro F1, AUROC (binary; macro one-vs-rest for several
classes, over the classes present), sensitivity and specificity (binary: of the positive class the
partition names; several classes: each class one-vs-rest, `sensitivity:<class>`, and their macro
mean), and the expected calibration error (ECE: top-label confidence in 15 equal-width bins,
(k/15, (k+1)/15], the first one closed at 0, as Guo et al. 2017; the sum over bins of the share of
images times |accuracy - mean confidence|). The predicted class is the first of the largest
probabilities (numpy's argmax), so tied probabilities go to the lower class index.

The bootstrap resamples the test set B times from a stream keyed by (seed, test node) only, so every
strategy, model and round is scored on the same resamples of one test set: two strategies'
differences are paired resample by resample (report/paired.py). All B resamples are computed at
once from resample counts (confusion matrices by bincount; AUROC as a weighted Mann-Whitney
statistic; ECE from weighted bin sums). A per-class value a resample leaves undefined (its class, or
every other class, absent) is left out of that resample's macro mean and of the percentiles.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedcli.data.dataset import to_float
from fedcli.rng import numpy_stream

METRICS = ("accuracy", "balanced_accuracy", "f1_macro", "auroc", "sensitivity", "specificity", "ece")
ECE_BINS = 15


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, device: str = "cpu", batch: int = 256) -> np.ndarray:
    """Softmax probabilities (N, C) for uint8 images."""
    model.eval()
    out = [torch.softmax(model(to_float(images[i:i + batch]).to(device)), dim=1).cpu()
           for i in range(0, len(images), batch)]
    return torch.cat(out).double().numpy()


def metric_values(y: np.ndarray, probs: np.ndarray, weights: np.ndarray, positive: int = 1,
                  class_names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Metrics for each row of resample counts `weights` (B, n); row of ones = the plain test set.
    `positive`: the positive class of a binary task; `class_names`: the per-class columns' names."""
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
    negatives = weights.sum(axis=1, keepdims=True) - true_per_class
    with np.errstate(invalid="ignore", divide="ignore"):
        specificity = np.where(negatives > 0, (negatives - (pred_per_class - hits)) / negatives, np.nan)
    out = {
        "accuracy": hits.sum(axis=1) / weights.sum(axis=1),
        "balanced_accuracy": mean_of_defined(recall, axis=1),
        "f1_macro": mean_of_defined(f1, axis=1),
        "auroc": auroc(y, probs, weights),
        "ece": calibration_error(y, probs, weights),
    }
    if n_classes == 2:
        out["sensitivity"], out["specificity"] = recall[:, positive], specificity[:, positive]
        return out
    out["sensitivity"], out["specificity"] = mean_of_defined(recall, axis=1), mean_of_defined(specificity, axis=1)
    names = class_names or [str(c) for c in range(n_classes)]
    for c, name in enumerate(names):
        out[f"sensitivity:{name}"], out[f"specificity:{name}"] = recall[:, c], specificity[:, c]
    return out


def calibration_error(y: np.ndarray, probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Expected calibration error per resample: top-label confidence in ECE_BINS equal-width bins."""
    confidence = probs.max(axis=1)
    correct = (probs.argmax(axis=1) == y).astype(float)
    bins = np.clip(np.ceil(confidence * ECE_BINS).astype(int) - 1, 0, ECE_BINS - 1)  # (k/15, (k+1)/15]
    onehot = np.zeros((len(y), ECE_BINS))
    onehot[np.arange(len(y)), bins] = 1.0
    gap = weights @ (onehot * correct[:, None]) - weights @ (onehot * confidence[:, None])  # (B, bins)
    return np.abs(gap).sum(axis=1) / weights.sum(axis=1)


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


def resample_counts(seed: int, test_node: str, n: int, boots: int) -> np.ndarray:
    """(B, n) bootstrap resample counts of a test set of n images; the same for every strategy, model and
    round scored on it (keyed by the seed and the test node only)."""
    return numpy_stream(seed, "bootstrap", test_node).multinomial(n, np.full(n, 1.0 / n), size=boots).astype(float)


def evaluate(y: np.ndarray, probs: np.ndarray, counts: np.ndarray, positive: int = 1,
             class_names: list[str] | None = None) -> dict[str, float]:
    """Point estimates and bootstrap percentile 95% intervals over the resample `counts`: `<metric>`,
    `<metric>_lo`, `<metric>_hi`."""
    point = metric_values(y, probs, np.ones((1, len(y))), positive, class_names)
    resampled = metric_values(y, probs, counts, positive, class_names)
    out = {}
    for name, value in point.items():
        out[name] = float(value[0])
        out[f"{name}_lo"], out[f"{name}_hi"] = percentile_interval(resampled[name])
    return out


def percentile_interval(values: np.ndarray) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the finite values (NaN, NaN when there are none)."""
    finite = values[np.isfinite(values)]
    lo, hi = np.percentile(finite, [2.5, 97.5]) if len(finite) else (np.nan, np.nan)
    return float(lo), float(hi)
