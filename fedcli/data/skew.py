"""Label-skew statistics between nodes."""

from __future__ import annotations

from itertools import combinations

import numpy as np


def label_distributions(counts: np.ndarray) -> np.ndarray:
    """Rows of per-node class counts -> rows of class probabilities."""
    counts = np.asarray(counts, dtype=float)
    return counts / counts.sum(axis=1, keepdims=True)


def mean_pairwise_js(dists: np.ndarray) -> float:
    """Mean Jensen-Shannon distance (base 2, in [0, 1]) over node pairs; independent of label order."""
    from scipy.spatial.distance import jensenshannon

    pairs = list(combinations(range(len(dists)), 2))
    return float(np.mean([jensenshannon(dists[a], dists[b], base=2) for a, b in pairs])) if pairs else 0.0


def mean_pairwise_ks(dists: np.ndarray) -> float:
    """Mean Kolmogorov-Smirnov statistic over node pairs (max gap between label CDFs).

    For a binary task it is |p_a - p_b|, the difference in positive rates, as in FedReplay.
    """
    cdfs = np.cumsum(dists, axis=1)
    pairs = list(combinations(range(len(dists)), 2))
    return float(np.mean([np.abs(cdfs[a] - cdfs[b]).max() for a, b in pairs])) if pairs else 0.0


def mean_pairwise_tv(dists: np.ndarray) -> float:
    """Mean total variation distance (half the L1 gap) over node pairs: independent of the order of nominal
    classes, and equal to the KS statistic for two classes."""
    pairs = list(combinations(range(len(dists)), 2))
    return float(np.mean([0.5 * np.abs(dists[a] - dists[b]).sum() for a, b in pairs])) if pairs else 0.0
