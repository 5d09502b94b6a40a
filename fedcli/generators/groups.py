"""Members and non-members for the audit: size-matched and class-stratified.

Members are a node's train images (the GAN saw them), non-members its test images (it did not).
Both groups get the same number of images of every class, so a score cannot come from class
balance; classes are filled round-robin up to `max_images` per group.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from fedcli.core.rng import numpy_stream


def matched_groups(train: list[dict], test: list[dict], max_images: int, seed: int, node: str
                   ) -> tuple[list[int], list[int]]:
    """Indices into `train` (members) and `test` (non-members)."""
    by_class = {"train": defaultdict(list), "test": defaultdict(list)}
    for split, records in (("train", train), ("test", test)):
        for i, r in enumerate(records):
            by_class[split][r["label"]].append(i)
    classes = sorted(set(by_class["train"]) & set(by_class["test"]))
    pools = {}
    for split in ("train", "test"):
        for c in classes:
            rng = numpy_stream(seed, "audit-groups", node, split, c)
            pools[split, c] = [by_class[split][c][k] for k in rng.permutation(len(by_class[split][c]))]
    capacity = {c: min(len(pools["train", c]), len(pools["test", c])) for c in classes}
    members, non_members = (interleave([pools[split, c][:capacity[c]] for c in classes])[:max_images]
                            for split in ("train", "test"))
    return members, non_members


def interleave(pools: list[list[int]]) -> list[int]:
    """One item of each pool in turn (the first of every pool, then the second, ...), until all are spent."""
    return [pool[depth] for depth in range(max(map(len, pools), default=0)) for pool in pools if depth < len(pool)]


def complementary_halves(pool: int, references: int, rng: np.random.Generator) -> np.ndarray:
    """(references, pool) IN flags: pairs of complementary halves, so every reference trains on exactly half the
    pool and every image is IN for exactly half the references. `references` must be even."""
    halves = []
    for _ in range(references // 2):
        half = np.zeros(pool, bool)
        half[rng.permutation(pool)[:pool // 2]] = True
        halves += [half, ~half]
    return np.array(halves)
