"""Per-node train/test split with a class-balanced test set, and stratified folds over train.

The test set holds the same number t of images of every class present in the node:
t = round(test_fraction * n / classes), capped at half of the rarest class so that class keeps
training images. A class with a single image in the node cannot be on both sides; it stays in
train and is not counted as present. Groups (patient or lesion) stay on one side of the split
and of the folds. Every sample lands in exactly one of train or test.
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np

from fedcli.core.errors import UserError
from fedcli.core.rng import numpy_stream, stream_seed
from fedcli.data.records import Sample


class NodeError(UserError):
    """A node that cannot be trained and tested on (no samples, one class, too small for the folds)."""


def test_classes(samples: list[Sample]) -> dict[int, int]:
    """Classes that can appear in both train and test (two images or more), with their counts."""
    counts = Counter(s.label for s in samples)
    return {c: n for c, n in sorted(counts.items()) if n >= 2}


def per_class_test_size(n: int, present: dict[int, int], test_fraction: float) -> int:
    target = int(np.floor(test_fraction * n / len(present) + 0.5))
    return max(1, min(target, min(present.values()) // 2))


def check_node(name: str, samples: list[Sample], label_names: list[str], advice: str) -> dict[int, int]:
    """The node's testable classes; a node with fewer than two is refused with `advice`, what the user can
    change in the scheme that made it (data/partition.py, NODE_ADVICE)."""
    if not samples:
        raise NodeError(f"node {name} has no samples; {advice}")
    present = test_classes(samples)
    if len(present) < 2:
        counts = Counter(s.label for s in samples)
        testable = ", ".join(f"{label_names[c]} ({n} images)" for c, n in present.items()) or "none"
        singles = [label_names[c] for c, n in sorted(counts.items()) if n < 2]
        single = (f"; {', '.join(singles)} {'has' if len(singles) == 1 else 'have'} one image, which cannot be on "
                  "both sides of the split") if singles else ""
        raise NodeError(
            f"node {name} has fewer than two classes with two or more images (such classes: {testable}{single}), "
            f"so it cannot be tested; {advice}"
        )
    return present


def split_node(name: str, samples: list[Sample], label_names: list[str], test_fraction: float, folds: int,
               seed: int, train_size: int | None = None,
               advice: str = "use fewer --nodes") -> tuple[list[dict], list[dict]]:
    """Train records (with a `fold`) and test records of one node; `train_size`: at most that many train
    records, a class-stratified draw (`smaller_train`), the test records unchanged."""
    present = check_node(name, samples, label_names, advice)
    t = per_class_test_size(len(samples), present, test_fraction)
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.group_key, []).append(i)
    keys = sorted(groups)
    order = numpy_stream(seed, "test-split", name).permutation(len(keys))
    filled = Counter()
    in_test = np.zeros(len(samples), dtype=bool)
    for k in order:
        members = groups[keys[k]]
        counts = Counter(samples[i].label for i in members)
        if all(c in present and filled[c] + m <= t for c, m in counts.items()):
            filled.update(counts)
            in_test[members] = True
            if all(filled[c] >= t for c in present):
                break
    train = [s for s, test in zip(samples, in_test) if not test]
    if train_size is not None and train_size < len(train):
        train = smaller_train(name, train, train_size, seed)
    fold_of = assign_folds(name, train, folds, seed)
    return ([{**s.record(), "fold": f} for s, f in zip(train, fold_of)],
            [s.record() for s, test in zip(samples, in_test) if test])


def smaller_train(name: str, train: list[Sample], size: int, seed: int, purpose: str = "train-size") -> list[Sample]:
    """`size` of the train samples, each class keeping its share (largest remainders round), drawn by a stream
    keyed by the node and `purpose`, in their original order: a smaller hospital with the same case mix."""
    counts = Counter(s.label for s in train)
    exact = {c: size * n / len(train) for c, n in counts.items()}
    quota = {c: int(v) for c, v in exact.items()}
    for c in sorted(exact, key=lambda c: (quota[c] - exact[c], c))[:size - sum(quota.values())]:
        quota[c] += 1
    kept = np.zeros(len(train), dtype=bool)
    for i in numpy_stream(seed, purpose, name).permutation(len(train)):
        if quota[train[i].label] > 0:
            quota[train[i].label] -= 1
            kept[i] = True
    return [s for s, keep in zip(train, kept) if keep]


def assign_folds(name: str, train: list[Sample], folds: int, seed: int) -> list[int]:
    """Stratified (and group-aware) K-fold assignment of the train part."""
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    group_keys = [s.group_key for s in train]
    n_groups = len(set(group_keys))
    if n_groups < folds:
        raise NodeError(f"node {name} has only {n_groups} training samples/groups, fewer than --folds {folds}; "
                        "lower --folds")
    labels = np.array([s.label for s in train])
    largest = max(Counter(labels.tolist()).values())
    if largest < folds:  # scikit-learn's stratified splitters need one class with a member in every fold
        fewer = f"lower --folds to {largest}" if largest >= 2 else "use fewer --nodes or more data per site"
        raise NodeError(f"node {name} has at most {largest} training images of any class, fewer than --folds "
                        f"{folds}, so stratified folds cannot be made; {fewer}")
    random_state = stream_seed(seed, "folds", name) % 2**32
    grouped = any(s.group is not None for s in train)
    splitter = (StratifiedGroupKFold if grouped else StratifiedKFold)(folds, shuffle=True, random_state=random_state)
    fold_of = np.full(len(train), -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a rare class has fewer members than folds
        for k, (_, held_out) in enumerate(splitter.split(np.zeros(len(train)), labels, group_keys)):
            fold_of[held_out] = k
    return fold_of.tolist()
