"""Class counts per node that reach a requested label skew (the generative-replay study's splits).

Skew is the mean pairwise total variation (TV) of the nodes' label distributions: the study's KS
statistic |p_i - p_j| for two classes, and for several classes a measure that does not depend on the
order of nominal classes. Every node holds the same number of samples.

Two extreme splits span the family. In the even one every node holds the pool's class mix, so TV is 0.
In the sorted one the classes are laid end to end in label order and node i takes the i-th equal
stretch: each node holds as few classes as equal sizes allow, which for two classes is the largest
mean pairwise gap (K/(2(K-1)) for K nodes when the classes are balanced). Node i's counts at mix t are
(1 - t) * even + t * sorted; TV is linear in t, so t = target / TV(sorted) reaches the target exactly,
and the counts are then rounded to integers that keep every node's size and every class's total.
"""

from __future__ import annotations

import numpy as np

from fedcli.core.errors import UserError
from fedcli.data.skew import label_distributions, mean_pairwise_tv


def equal_sizes(total: int, n: int) -> np.ndarray:
    return np.array([total // n + (i < total % n) for i in range(n)])


def sorted_split(class_totals: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Counts (nodes x classes) of the classes laid end to end and cut into the nodes' stretches."""
    class_ends, node_ends = np.cumsum(class_totals), np.cumsum(sizes)
    class_starts, node_starts = class_ends - class_totals, node_ends - sizes
    overlap = (np.minimum(node_ends[:, None], class_ends[None, :])
               - np.maximum(node_starts[:, None], class_starts[None, :]))
    return np.clip(overlap, 0, None)


def most_skew(class_totals: np.ndarray, n: int) -> float:
    """The largest mean pairwise TV this construction reaches for these classes and n nodes."""
    return mean_pairwise_tv(label_distributions(sorted_split(class_totals, equal_sizes(int(class_totals.sum()), n))))


def round_keeping_sums(target: np.ndarray) -> np.ndarray:
    """Integers within one of `target` whose row and column sums equal target's (integers themselves): the
    floors plus a 0/1 matrix on the fractional cells, found as a maximum flow (rows -> cells -> columns)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    floors = np.floor(target + 1e-9).astype(np.int64)
    fractional = (target - floors) > 1e-9
    row_need = np.rint(target.sum(axis=1)).astype(np.int64) - floors.sum(axis=1)
    col_need = np.rint(target.sum(axis=0)).astype(np.int64) - floors.sum(axis=0)
    n, c = target.shape
    source, sink = n + c, n + c + 1
    rows, cols = np.nonzero(fractional)
    tails = np.concatenate([np.full(n, source), rows, n + np.arange(c)])
    heads = np.concatenate([np.arange(n), n + cols, np.full(c, sink)])
    capacity = np.concatenate([row_need, np.ones(len(rows), dtype=np.int64), col_need]).astype(np.int32)
    graph = csr_matrix((capacity, (tails, heads)), shape=(n + c + 2, n + c + 2))
    flow = maximum_flow(graph, source, sink)
    if flow.flow_value != row_need.sum():
        raise AssertionError("a fractional transportation matrix always has an integer rounding")
    extra = flow.flow.toarray()[rows, n + cols] > 0
    floors[rows[extra], cols[extra]] += 1
    return floors


def skewed_counts(class_totals: np.ndarray, n: int, target: float) -> np.ndarray:
    """Per-node class counts (nodes x classes) of equal-sized nodes at mean pairwise TV `target`."""
    class_totals = np.asarray(class_totals, dtype=np.int64)
    sizes = equal_sizes(int(class_totals.sum()), n)
    extreme = sorted_split(class_totals, sizes)
    reachable = mean_pairwise_tv(label_distributions(extreme))
    if target > reachable + 1e-9:
        measure = "KS" if len(class_totals) == 2 else "total variation"
        raise UserError(f"--ks {target} is beyond the most skewed split this scheme makes of this data into {n} "
                        f"equal nodes (mean pairwise {measure} {reachable:.3f}); lower --ks or change --nodes")
    mix = target / reachable if reachable > 0 else 0.0
    even = sizes[:, None] * (class_totals / class_totals.sum())[None, :]
    return round_keeping_sums((1 - mix) * even + mix * extreme)
