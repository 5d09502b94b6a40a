"""Evaluation of classifiers on test sets, with bootstrap 95% confidence intervals.

Metrics: accuracy, balanced accuracy, precision, recall and F1 (macro: the mean over the classes present
or predicted, an undefined value counting 0, as scikit-learn's; weighted: by each class's test images, FedPerl's
reading), AUROC and AUPRC (binary: of class 1; several classes: the macro mean one-vs-rest over the classes
present; AUPRC is scikit-learn's average precision, the sum over thresholds of precision times the recall it
adds), sensitivity and specificity (binary: of the positive class the partition names; several classes: each
class one-vs-rest, `sensitivity:<class>`, and their macro mean; per class also `precision:<class>` and
`f1:<class>`, and FedPerl's Tables 6-7, `auroc:<class>` and `auprc:<class>`), the expected calibration error (ECE:
top-label confidence in 15 equal-width bins, (k/15,
(k+1)/15], the first one closed at 0, as Guo et al. 2017; the sum over bins of the share of images times
|accuracy - mean confidence|), and the adaptive ECE and MCE (Ding et al. 2020, FedPerl's calibration: the
number and sizes of the bins chosen from the test set's confidences, metrics/adaptive_bins.py; ECE as above, MCE the
largest gap of a bin). The predicted class is the first of the largest probabilities
(numpy's argmax), so tied probabilities go to the lower class index.

The bootstrap resamples the test set B times from a stream keyed by (seed, test node) only, so every
strategy, model and round is scored on the same resamples of one test set: two strategies'
differences are paired resample by resample (report/paired.py). All B resamples are computed at
once from resample counts (confusion matrices by bincount; AUROC as a weighted Mann-Whitney
statistic; ECE from weighted bin sums; AUPRC from weighted cumulative sums in order of score). The adaptive
bins are the test set's, kept for its resamples (a resample's empty bin is left out of its MCE). A per-class
value a resample leaves undefined (its class, or every other class, absent) is left out of that resample's macro
mean and of the percentiles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedcli.core.rng import numpy_stream
from fedcli.data.dataset import to_float
from fedcli.metrics.adaptive_bins import adaptive_bins

if TYPE_CHECKING:
    from fedcli.data.tensor_source import TensorSource

METRICS = ("accuracy", "balanced_accuracy", "f1_macro", "f1_weighted", "precision_macro", "precision_weighted",
           "recall_macro", "recall_weighted", "auroc", "auprc", "sensitivity", "specificity", "ece", "adaptive_ece",
           "adaptive_mce")
ECE_BINS = 15


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, device: str = "cpu", batch: int = 256) -> np.ndarray:
    """Softmax probabilities (N, C) for uint8 images."""
    model.eval()
    out = [torch.softmax(model(to_float(images[i:i + batch]).to(device)), dim=1).cpu()
           for i in range(0, len(images), batch)]
    return torch.cat(out).double().numpy()


def correct(model: nn.Module, source: "TensorSource", device: str = "cpu") -> np.ndarray:
    """Per image of `source`: whether the model's most probable class is its label."""
    return predict(model, source.images, device).argmax(axis=1) == source.labels.numpy()


def accuracy(model: nn.Module, source: "TensorSource", device: str = "cpu") -> float:
    return float(correct(model, source, device).mean())


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
    share = true_per_class / weights.sum(axis=1, keepdims=True)  # the weighted averages' class weights
    areas, precisions = auroc(y, probs, weights), average_precision(y, probs, weights)  # per class
    out = {
        "accuracy": hits.sum(axis=1) / weights.sum(axis=1),
        "balanced_accuracy": mean_of_defined(recall, axis=1),
        "f1_macro": mean_of_defined(f1, axis=1),
        "f1_weighted": (share * np.nan_to_num(f1)).sum(axis=1),
        "precision_macro": mean_of_defined(np.where(seen, precision, np.nan), axis=1),
        "precision_weighted": (share * precision).sum(axis=1),
        "recall_macro": mean_of_defined(np.where(seen, np.nan_to_num(recall), np.nan), axis=1),
        "recall_weighted": (share * np.nan_to_num(recall)).sum(axis=1),  # = accuracy
        "auroc": macro(areas, boots),
        "auprc": macro(precisions, boots),
        "ece": calibration_error(y, probs, weights),
        **adaptive_calibration(y, probs, weights),
    }
    if n_classes == 2:
        out["sensitivity"], out["specificity"] = recall[:, positive], specificity[:, positive]
        return out
    out["sensitivity"], out["specificity"] = mean_of_defined(recall, axis=1), mean_of_defined(specificity, axis=1)
    names = class_names or [str(c) for c in range(n_classes)]
    for c, name in enumerate(names):
        out[f"sensitivity:{name}"], out[f"specificity:{name}"] = recall[:, c], specificity[:, c]
        out[f"precision:{name}"] = np.where(pred_per_class[:, c] > 0, precision[:, c], np.nan)
        out[f"f1:{name}"] = f1[:, c]
        out[f"auroc:{name}"] = areas.get(c, np.full(boots, np.nan))
        out[f"auprc:{name}"] = precisions.get(c, np.full(boots, np.nan))
    return out


def calibration_error(y: np.ndarray, probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Expected calibration error per resample: top-label confidence in ECE_BINS equal-width bins."""
    _, gap = binned_gaps(y, probs, weights, equal_width_bins(probs.max(axis=1)))
    return gap.sum(axis=1) / weights.sum(axis=1)


def adaptive_calibration(y: np.ndarray, probs: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Adaptive ECE and MCE per resample, on Ding et al.'s bins of the test set's top-label confidences."""
    mass, gap = binned_gaps(y, probs, weights, adaptive_bins(probs.max(axis=1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        per_bin = np.where(mass > 0, gap / mass, -np.inf)  # a resample's empty bin is no bin of its MCE
    return {"adaptive_ece": gap.sum(axis=1) / weights.sum(axis=1), "adaptive_mce": per_bin.max(axis=1)}


def equal_width_bins(confidence: np.ndarray) -> np.ndarray:
    """Each confidence's bin among ECE_BINS equal-width bins (k/15, (k+1)/15], the first closed at 0."""
    return np.clip(np.ceil(confidence * ECE_BINS).astype(int) - 1, 0, ECE_BINS - 1)


def binned_gaps(y: np.ndarray, probs: np.ndarray, weights: np.ndarray, bins: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per resample and bin (B, bins): the weighted images, and |sum of correct - sum of top-label confidence|."""
    confidence, correct = probs.max(axis=1), (probs.argmax(axis=1) == y).astype(float)
    onehot = np.zeros((len(y), bins.max() + 1 if len(y) else 1))
    onehot[np.arange(len(y)), bins] = 1.0
    return weights @ onehot, np.abs(weights @ (onehot * correct[:, None]) - weights @ (onehot * confidence[:, None]))


PAIRS_IMAGES_PER_CLASS, PAIRS_MAX_IMAGES = 200, 2048  # where average precision is computed by pairs


def one_vs_rest_classes(probs: np.ndarray) -> list[int] | range:
    """The classes a one-vs-rest metric averages over: class 1 alone for a binary task."""
    return [1] if probs.shape[1] == 2 else range(probs.shape[1])


def macro(per_class: dict[int, np.ndarray], boots: int) -> np.ndarray:
    """The mean over the classes of their per-resample values (NaN where none is defined)."""
    return mean_of_defined(np.stack(list(per_class.values())), axis=0) if per_class else np.full(boots, np.nan)


def average_precision(y: np.ndarray, probs: np.ndarray, weights: np.ndarray) -> dict[int, np.ndarray]:
    """One-vs-rest average precision per class present (binary: class 1 alone) per resample: scikit-learn's
    sum over distinct thresholds of (recall step) x precision, with resample counts as sample weights. Two equal
    computations: by pairs (B n^2, in matrix products) and by sorting (B n per class, in cumulative sums); the
    pairs are faster up to about 200 images per class (measured: 120 images of 10 classes 2.6 against 23 ms for
    1,000 resamples; 600 of 2 classes 34 against 18 ms) and bounded to keep the n x n matrix small."""
    if len(y) <= min(PAIRS_MAX_IMAGES, PAIRS_IMAGES_PER_CLASS * probs.shape[1]):
        return average_precision_by_pairs(y, probs, weights)
    return average_precision_by_sorting(y, probs, weights)


def average_precision_by_pairs(y: np.ndarray, probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AP of class c = sum over its images j of w_j TP(s_j) / P(s_j), over their total weight: TP and P the weights
    of the class's images and of all images scoring c at least s_j, image j's score for its own class c (a
    threshold's recall step is the weight of the positives at it, ties included)."""
    own = probs[np.arange(len(y)), y]
    at_least = probs[:, y] >= own[None, :]  # (i, j): image i scores class y_j at least as high as image j does
    predicted = weights @ at_least
    true_positives = weights @ (at_least & (y[:, None] == y[None, :]))
    with np.errstate(invalid="ignore", divide="ignore"):
        weighted_precision = np.where(predicted > 0, true_positives / predicted, 0.0) * weights
    per_class = {}
    for c in one_vs_rest_classes(probs):
        images = y == c
        if not images.any():
            continue
        total = weights[:, images].sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            per_class[c] = np.where(total > 0, weighted_precision[:, images].sum(axis=1) / total, np.nan)
    return per_class


def average_precision_by_sorting(y: np.ndarray, probs: np.ndarray, weights: np.ndarray) -> dict[int, np.ndarray]:
    """Per class: the images sorted by score, cumulative weights read at each distinct threshold."""
    per_class = {}
    for c in one_vs_rest_classes(probs):
        positive = (y == c).astype(float)
        if not positive.any():
            continue
        order = np.argsort(-probs[:, c], kind="stable")
        scores = probs[order, c]
        last = np.r_[scores[1:] != scores[:-1], True]  # the last image of each distinct score: a threshold
        w = weights[:, order]
        true_positives = np.cumsum(w * positive[order], axis=1)[:, last]
        predicted = np.cumsum(w, axis=1)[:, last]
        total = true_positives[:, -1:]
        with np.errstate(invalid="ignore", divide="ignore"):
            precision = np.where(predicted > 0, true_positives / predicted, 0.0)
            recall = true_positives / total
        steps = np.diff(np.concatenate([np.zeros((len(w), 1)), recall], axis=1), axis=1)
        per_class[c] = np.where(total[:, 0] > 0, (steps * precision).sum(axis=1), np.nan)
    return per_class


def auroc(y: np.ndarray, probs: np.ndarray, weights: np.ndarray) -> dict[int, np.ndarray]:
    """One-vs-rest AUROC (binary: of class 1 alone) per resample, per class with both sides present."""
    per_class = {}
    for c in one_vs_rest_classes(probs):
        pos, neg = y == c, y != c
        if not pos.any() or not neg.any():
            continue
        s_pos, s_neg = probs[pos, c], probs[neg, c]
        wins = (s_pos[:, None] > s_neg[None, :]) + 0.5 * (s_pos[:, None] == s_neg[None, :])
        w_pos, w_neg = weights[:, pos], weights[:, neg]
        with np.errstate(invalid="ignore", divide="ignore"):
            per_class[c] = ((w_pos @ wins) * w_neg).sum(axis=1) / (w_pos.sum(1) * w_neg.sum(1))
    return per_class


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
