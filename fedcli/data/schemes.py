"""Partition schemes: which samples each node holds.

- source: one node per site (the FedER non-i.i.d. setting).
- iid: one pool split equally and stratified by label into N nodes (the FedER scalability setting).
- dirichlet: label skew; each class is spread over the nodes in proportions drawn from
  Dirichlet(alpha), the standard federated-learning benchmark (small alpha = strong skew).
- site-shift: iid, plus a simulated scanner per node (see `acquisition`).
- skew: equal-sized nodes at a requested mean pairwise label skew (`target_skew`), the
  generative-replay study's splits measured by the Kolmogorov-Smirnov statistic.
All are group-aware: a patient's or lesion's images go to one node.
"""

from __future__ import annotations

import warnings
from collections import Counter, defaultdict

import numpy as np

from fedcli.core.errors import UserError
from fedcli.core.rng import numpy_stream, stream_seed
from fedcli.data.records import Sample


def by_site(samples: list[Sample]) -> list[tuple[str, list[Sample]]]:
    sites: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        sites[s.site].append(s)
    return sorted(sites.items())


def node_names(n: int) -> list[str]:
    return [f"node{i}" for i in range(n)]


def group_labels(samples: list[Sample]) -> tuple[list[str], dict[str, list[Sample]], np.ndarray]:
    """Group keys in first-seen order, their samples, and each group's majority label."""
    groups: dict[str, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.group_key, []).append(s)
    keys = list(groups)
    labels = np.array([Counter(s.label for s in groups[k]).most_common(1)[0][0] for k in keys])
    return keys, groups, labels


def check_node_count(n: int, keys: list[str]) -> None:
    if n > len(keys):
        raise UserError(f"--nodes {n} is more than the {len(keys)} samples (or patient groups); lower --nodes")


def owned_nodes(owner: np.ndarray, keys: list[str], groups: dict[str, list[Sample]],
                n: int) -> list[tuple[str, list[Sample]]]:
    """The nodes' samples from each group's owning node (`owner[k]` for group `keys[k]`)."""
    return [(name, [s for k in np.flatnonzero(owner == i) for s in groups[keys[k]]])
            for i, name in enumerate(node_names(n))]


def iid(samples: list[Sample], n: int, seed: int) -> list[tuple[str, list[Sample]]]:
    from sklearn.model_selection import StratifiedKFold

    keys, groups, labels = group_labels(samples)
    check_node_count(n, keys)
    splitter = StratifiedKFold(n, shuffle=True, random_state=stream_seed(seed, "iid") % 2**32)
    parts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a class rarer than n is spread as far as it goes
        try:
            for _, chosen in splitter.split(np.zeros(len(keys)), labels):
                parts.append(sorted(chosen))
        except ValueError as exc:
            raise UserError(f"cannot split into {n} stratified nodes ({exc}); lower --nodes") from exc
    return [(name, [s for k in part for s in groups[keys[k]]]) for name, part in zip(node_names(n), parts)]


def dirichlet(samples: list[Sample], n: int, alpha: float, seed: int, attempt: int) -> list[tuple[str, list[Sample]]]:
    """One draw of the Dirichlet label-skew partition; `attempt` keys a fresh draw."""
    keys, groups, labels = group_labels(samples)
    check_node_count(n, keys)
    rng = numpy_stream(seed, "dirichlet", attempt)
    owner = np.empty(len(keys), dtype=int)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        shares = rng.dirichlet(np.full(n, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
        for node, part in enumerate(np.split(members, cuts)):
            owner[part] = node
    return owned_nodes(owner, keys, groups, n)


def most_skew(samples: list[Sample], n: int) -> float:
    """The largest mean pairwise skew `skew` can assign these samples' groups over n nodes."""
    from fedcli.data.target_skew import most_skew as most

    _, _, labels = group_labels(samples)
    return most(np.array([(labels == c).sum() for c in np.unique(labels)]), n)


def skew(samples: list[Sample], n: int, target: float, seed: int) -> list[tuple[str, list[Sample]]]:
    """Equal-sized nodes at mean pairwise label skew `target` (KS for two classes, total variation for
    more), counted in groups by their majority label; which groups of a class go where is keyed by seed."""
    from fedcli.data.target_skew import skewed_counts

    keys, groups, labels = group_labels(samples)
    check_node_count(n, keys)
    classes = np.unique(labels)
    counts = skewed_counts(np.array([(labels == c).sum() for c in classes]), n, target)
    owner = np.empty(len(keys), dtype=int)
    for j, c in enumerate(classes):
        members = numpy_stream(seed, "skew", int(c)).permutation(np.flatnonzero(labels == c))
        owner[members] = np.repeat(np.arange(n), counts[:, j])
    return owned_nodes(owner, keys, groups, n)
