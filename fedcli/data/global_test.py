"""A fixed, class-balanced global test set (`partition --global-test N`), the stand-in for a public benchmark
test set: the generative-replay study scores every split on one balanced test set (Retina: 1500 + 1500 images),
so that its label-skew levels differ only in how the training data is spread.

It is set apart from the pool before anything else (the nodes, their own test sets, the shared and held-apart
sets), N / C images of every class, in patient groups of one class, drawn by a stream keyed by the data alone:
neither the partition's seed nor its KS changes which images it holds, or their order. Every node holds it for
evaluation only; no node trains on it, so scoring on it sends nothing.
"""

from __future__ import annotations

from fedcli.core.errors import UserError
from fedcli.core.rng import numpy_stream
from fedcli.data.records import Sample

STREAM = (0, "global-test")  # the draw's key: fixed, not the partition's seed


def set_apart(samples: list[Sample], size: int, label_names: list[str]) -> tuple[list[Sample], list[Sample]]:
    """(the global test set, the samples left for the nodes): size / C images of every class, class by class in
    the draw's order."""
    classes = len(label_names)
    if size % classes:
        raise UserError(f"--global-test {size} cannot hold the same number of images of each of the {classes} "
                        f"classes; give a multiple of {classes}")
    per_class = size // classes
    groups: dict[str, list[Sample]] = {}
    for s in sorted(samples, key=lambda s: (s.group_key, s.id)):  # the draw does not depend on the pool's order
        groups.setdefault(s.group_key, []).append(s)
    chosen: list[Sample] = []
    for label, name in enumerate(label_names):
        pure = [members for members in groups.values() if all(s.label == label for s in members)]
        taken: list[Sample] = []
        for k in numpy_stream(*STREAM, label).permutation(len(pure)):
            if len(taken) + len(pure[k]) <= per_class:
                taken += pure[k]
            if len(taken) == per_class:
                break
        if len(taken) < per_class:
            available = sum(len(members) for members in pure)
            raise UserError(f"--global-test {size} needs {per_class} images of class {name}, and the data holds "
                            f"{available} (in patient groups of that class alone) that fill only {len(taken)}; "
                            "lower --global-test")
        chosen += taken
    held = {id(s) for s in chosen}
    return chosen, [s for s in samples if id(s) not in held]
