"""Adaptive binning for calibration (Ding et al. 2020), as FedPerl computes its AECE and AMCE.

FedPerl's public code ships Ding et al.'s `AdaptiveBinning.py` (tbdair/FedPerlV1.0, `code/utils`, removed in its
history at b66b7c3); this is the same rule, written here, but for a slip in its last step
(3.):
1. The images in order of confidence, highest first (equal confidences keep their order).
2. One pass grows a bin image by image; once a bin holds more than its target size (z / (max - min))^2 / 4 for
   its confidences' range, z = 1.645, the next image opens a new bin, provided more than 40 images remain and the
   bin's lowest confidence is more than 0.05 above the lowest of all. A bin of equal confidences has no target.
3. If the last bin is still short of its target, `needed` = target - its size, and each earlier bin gives the
   last int(needed x n_b / N) images, n_b its own size and N every image's count (the runs shift down in
   order). The shipped code has n_last, the last bin's size, in place of n_b: where the last bin is short, that
   can take more images from a bin than it holds, a bin that never fills then keeps an unaveraged sum of
   confidences, and the AECE comes out negative (-16.7 on tests/test_adaptive_bins.py's short-last-bin input). Where the
   last bin is not
   short (every one of 400 random test sets of 120 and 300 images checked) the two agree. fedcli takes each
   bin's own size, the proportional share the rule evidently means, and two guards where the shipped code
   fails: a short last bin of equal confidences (an infinite target: `int(inf)` raises there) moves nothing,
   and no bin gives away its last image.
AECE is then the image-weighted mean over bins of |accuracy - mean confidence|, AMCE its largest value.
"""

from __future__ import annotations

import math

import numpy as np

Z, REMAINING, SPREAD = 1.645, 40, 0.05


def target_size(low: float, high: float) -> float:
    return math.inf if high == low else (Z / (high - low)) ** 2 * 0.25


def adaptive_bins(confidence: np.ndarray) -> np.ndarray:
    """Each image's bin (0 the most confident), in the images' own order."""
    n = len(confidence)
    order = np.argsort(-confidence, kind="stable")
    ordered = confidence[order]
    sizes, low, high, target = [0], 1.0, 0.0, math.inf
    lowest = float(ordered[-1]) if n else 0.0
    for i, value in enumerate(ordered.tolist()):
        if sizes[-1] > target and n - i > REMAINING and low - lowest > SPREAD:
            sizes.append(0)
            low, high, target = 1.0, 0.0, math.inf
        sizes[-1] += 1
        low, high = min(low, value), max(high, value)
        target = target_size(low, high)
    needed = target - sizes[-1]
    if 0 < needed < math.inf:
        for b in range(len(sizes) - 1):
            moved = min(int(needed * sizes[b] / n), sizes[b] - 1)
            sizes[b] -= moved
            sizes[-1] += moved
    bins = np.empty(n, dtype=int)
    bins[order] = np.repeat(np.arange(len(sizes)), sizes)
    return bins
