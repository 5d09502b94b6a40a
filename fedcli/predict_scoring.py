"""`fedcli predict` on a labelled set no node held (FedPerl's unseen client, ISIC 2020 scored as malignant against
benign): the model's classes merged into groups, and the predictions scored against the folders' labels.

- `--group NAME=CLASS+CLASS`: each of the model's classes in exactly one group; a group's probability is the sum
  of its classes', the predicted group the most probable (ties to the group given first).
- `--labels-from-folders`: an image's label is the first folder of its path under --data-dir (`benign/x.jpg`),
  a group's name with --group, else a class name. The scores are evaluation's metrics (metrics/scores.py) with their
  bootstrap 95% intervals (1,000 resamples keyed by the seed 0 and the folder's name); with two groups the first
  given is the positive one (sensitivity, specificity).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedcli.core.errors import UserError
from fedcli.metrics.scores import evaluate, resample_counts

RESAMPLES = 1000


def class_groups(specs: list[str], label_names: list[str]) -> dict[str, list[int]]:
    """--group specs as {group: class indices}, every class in exactly one group."""
    groups: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, members = spec.partition("=")
        classes = [m.strip() for m in members.split("+") if m.strip()]
        if not sep or not name.strip() or not classes:
            raise UserError(f"--group {spec!r} is not NAME=CLASS+CLASS (e.g. malignant=MEL+BCC+SCC)")
        unknown = [c for c in classes if c not in label_names]
        if unknown:
            raise UserError(f"--group {spec!r} names {unknown[0]!r}, which is not a class of the model; classes: "
                            f"{', '.join(label_names)}")
        if name.strip() in groups:
            raise UserError(f"--group {name.strip()} is given twice; give each group once")
        groups[name.strip()] = [label_names.index(c) for c in classes]
    placed = [i for members in groups.values() for i in members]
    twice = sorted({label_names[i] for i in placed if placed.count(i) > 1})
    missing = [name for i, name in enumerate(label_names) if i not in placed]
    if groups and (twice or missing):
        raise UserError(f"--group must put every class in exactly one group: {', '.join(twice)} in two" if twice else
                        f"--group must put every class in exactly one group: {', '.join(missing)} in none")
    return groups


def grouped(probs: np.ndarray, groups: dict[str, list[int]]) -> np.ndarray:
    return np.stack([probs[:, members].sum(axis=1) for members in groups.values()], axis=1)


def folder_labels(files: list[str], names: list[str]) -> np.ndarray:
    """Each file's label index from the first folder of its relative path."""
    labels = []
    for file in files:
        folder, sep, _ = file.partition("/")
        if not sep:
            raise UserError(f"--labels-from-folders reads an image's label from its folder, and {file} lies directly "
                            f"in --data-dir; put each image in a folder named after its label ({', '.join(names)})")
        if folder not in names:
            raise UserError(f"image {file} lies in folder {folder!r}, which names no label; folders must be named "
                            f"after {', '.join(names)}")
        labels.append(names.index(folder))
    return np.array(labels)


def scores(files: list[str], probs: np.ndarray, names: list[str], where: str) -> pd.DataFrame:
    """The metrics of `probs` against the folders' labels: one row per metric, with its 95% interval."""
    truth = folder_labels(files, names)
    counts = resample_counts(0, f"predict:{where}", len(truth), RESAMPLES)
    values = evaluate(truth, probs, counts, positive=0 if len(names) == 2 else 1, class_names=names)
    metrics = [k for k in values if not k.endswith(("_lo", "_hi"))]
    return pd.DataFrame({"metric": metrics, "value": [values[m] for m in metrics],
                         "lo": [values[f"{m}_lo"] for m in metrics], "hi": [values[f"{m}_hi"] for m in metrics],
                         "n": len(truth)})
