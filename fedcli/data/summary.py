"""Partition summaries: per-node class counts (CSV), label-skew statistics, a figure, a table."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from fedcli.data import acquisition
from fedcli.data.label_parts import HELD_APART, UNLABELED, VALIDATION, node_labels, training_count, training_labels
from fedcli.data.manifest import Manifest
from fedcli.data.skew import label_distributions, mean_pairwise_js, mean_pairwise_ks, mean_pairwise_tv
from fedcli.experiment.plotting import pyplot, save_figure


def class_counts(records: list[dict], n_classes: int) -> np.ndarray:
    return label_counts([r["label"] for r in records], n_classes)


def label_counts(labels: list[int], n_classes: int) -> np.ndarray:
    counts = Counter(labels)
    return np.array([counts.get(c, 0) for c in range(n_classes)])


def summary_frame(manifest: Manifest) -> pd.DataFrame:
    """One row per node and split: sizes and per-class counts."""
    names = manifest["label_names"]
    rows = []
    for node in manifest["nodes"]:
        for split in ("train", "test", VALIDATION, HELD_APART):
            if split not in node:
                continue
            counts = class_counts(node[split], len(names))
            rows.append({"node": node["name"], "site": node["site"], "split": split, "total": int(counts.sum()),
                         **{name: int(c) for name, c in zip(names, counts)}})
        if UNLABELED in node:  # hidden labels are not counted by class: their columns stay empty
            rows.append({"node": node["name"], "site": node["site"], "split": UNLABELED,
                         "total": len(node[UNLABELED])})
    return pd.DataFrame(rows).astype({name: "Int64" for name in names})


def skew_statistics(manifest: Manifest) -> dict[str, float | None]:
    """Label skew across nodes over the images they train on (data/label_parts.py `training_labels`): mean
    pairwise JS and total variation distances, the KS statistic for binary tasks (equal to total variation
    there); and, named `test_`, the same of the nodes' own test splits."""
    n_classes = manifest.num_classes
    train = skew_of([training_labels(n, manifest.hidden) for n in manifest["nodes"]], n_classes)
    test = skew_of([[r["label"] for r in n["test"]] for n in manifest["nodes"]], n_classes)
    return train | {f"test_{k}": v for k, v in test.items() if k != "label_skew_js"}


def skew_of(labels: list[list[int]], n_classes: int) -> dict[str, float | None]:
    """Mean pairwise JS, total variation and (two classes) KS of the nodes' label lists."""
    dists = label_distributions(np.stack([label_counts(y, n_classes) for y in labels]))
    return {"label_skew_js": round(mean_pairwise_js(dists), 6), "label_skew_tv": round(mean_pairwise_tv(dists), 6),
            "label_skew_ks": round(mean_pairwise_ks(dists), 6) if n_classes == 2 else None}


def node_rows(manifest: Manifest) -> list[dict]:
    """What the table shows per node, including the realised test fraction."""
    rows = []
    for node in manifest["nodes"]:
        test = class_counts(node["test"], manifest.num_classes)
        n_train, n_test = training_count(node), len(node["test"])
        per_class = sorted({int(c) for c in test if c})
        rows.append({
            "node": node["name"], "site": node["site"], "scanner": acquisition.describe(node.get("acquisition")),
            "train": n_train, "labelled": len(node["train"]), "test": n_test, "test_fraction": n_test / (n_train + n_test),
            "test_per_class": "/".join(map(str, per_class)), "test_classes": int((test > 0).sum()),
            "classes": int((label_counts(node_labels(node, manifest.hidden), manifest.num_classes) > 0).sum()),
        })
    return rows


def partition_table(manifest: Manifest):
    from rich.table import Table

    recorded = manifest.data.get("statistics") or {}
    stats = recorded if "test_label_skew_tv" in recorded else skew_statistics(manifest)  # older: over every split
    caption = f"label skew of the training splits: mean pairwise Jensen-Shannon distance {stats['label_skew_js']:.3f}"
    measure = ("Kolmogorov-Smirnov", "label_skew_ks") if stats["label_skew_ks"] is not None else \
        ("total variation", "label_skew_tv")
    caption += f", {measure[0]} {stats[measure[1]]:.3f} (the test splits': {stats['test_' + measure[1]]:.3f})"
    global_test = manifest.data.get("global_test")
    if global_test:
        caption += (f"; a global test set of {len(global_test)} images ({len(global_test) // manifest.num_classes} "
                    "per class) set apart before the nodes, held by every node for evaluation only")
    shared = sum(len(node.get("shared", [])) for node in manifest["nodes"])
    if shared:
        caption += (f"; a shared set of {shared} images ({shared // manifest.num_classes} per class) set apart from "
                    "the nodes' training images")
    table = Table(title=f"partition: {manifest['source']}, scheme {manifest['scheme']}, seed {manifest['seed']}",
                  caption=caption)
    labels = manifest.data.get("labels")
    if labels:
        held = labels["held_apart"]
        caption += (f"; few labels: {labels['fraction']:g} of each labelled node's training images labelled"
                    + (f", {held['fraction']:g} of all held apart with labels at {held['holder']}" if held else ""))
    columns = ("node", "site", "scanner", "train", *(("labelled",) if labels else ()), "test", "test %", "test/class",
               "classes")
    for column in columns:
        table.add_column(column, justify="right" if column not in ("node", "site", "scanner") else "left")
    for row in node_rows(manifest):
        table.add_row(row["node"], row["site"], row["scanner"], str(row["train"]),
                      *((str(row["labelled"]),) if labels else ()), str(row["test"]),
                      f"{100 * row['test_fraction']:.1f}", row["test_per_class"],
                      f"{row['classes']}/{manifest.num_classes}")
    return table


def short_test_notes(manifest: Manifest) -> list[str]:
    """Nodes whose realised test fraction fell short of the requested one (label skew)."""
    wanted = manifest["test_fraction"]
    return [f"node {r['node']}: test set is {100 * r['test_fraction']:.1f}% (asked {100 * wanted:.0f}%), "
            "limited by its rarest class so the test set stays class-balanced"
            for r in node_rows(manifest) if r["test_fraction"] < 0.9 * wanted]


def untested_class_notes(manifest: Manifest) -> list[str]:
    """Classes with no test image on any node (e.g. a stray label in a CSV): their accuracy is never measured."""
    names = manifest["label_names"]
    total = label_counts([y for node in manifest["nodes"] for y in node_labels(node, manifest.hidden)], len(names))
    tested = class_counts([r for node in manifest["nodes"] for r in node["test"]], len(names))
    return [f"class {names[c]!r} has {int(total[c])} image(s) and no test image on any node (a class needs two images "
            "in one node to be tested); check the labels if it is a typo"
            for c in range(len(names)) if tested[c] == 0]


def write_summary_png(manifest: Manifest, path: Path, per_node: int = 8) -> None:
    """Class-distribution bars per node, and a row of example training images per node."""
    from fedcli.data.loading import load_images

    plt = pyplot()

    nodes, names = manifest["nodes"], manifest["label_names"]
    fig = plt.figure(figsize=(12, 1.2 + 1.1 * len(nodes)), dpi=80)
    grid = fig.add_gridspec(len(nodes), 2, width_ratios=[1, 1.3])
    bars = fig.add_subplot(grid[:, 0])
    width = 0.8 / len(nodes)
    for i, node in enumerate(nodes):
        counts = label_counts(node_labels(node, manifest.hidden), len(names))
        bars.bar(np.arange(len(names)) + i * width, counts, width, label=node["name"])
    bars.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, rotation=45 if len(names) > 4 else 0,
                    ha="right" if len(names) > 4 else "center")
    bars.set_ylabel("images")
    bars.set_title("class distribution per node")
    bars.set_ylim(0, 1.25 * bars.get_ylim()[1])
    bars.legend(fontsize=8, ncol=min(len(nodes), 4), loc="upper center")
    for i, node in enumerate(nodes):
        axis = fig.add_subplot(grid[i, 1])
        picks = example_records(node["train"], per_node) or node.get(UNLABELED, [])[:per_node]
        images = load_images(manifest, node["name"], picks).numpy()
        strip = np.concatenate(list(images.transpose(0, 2, 3, 1)), axis=1)
        axis.imshow(strip.squeeze(-1) if strip.shape[-1] == 1 else strip, cmap="gray", vmin=0, vmax=255)
        axis.set_axis_off()
        axis.set_title(f"{node['name']}: " + " ".join("?" if r["label"] is None else names[r["label"]] for r in picks),
                       fontsize=8, loc="left")
    fig.tight_layout()
    save_figure(fig, path)


def example_records(records: list[dict], k: int) -> list[dict]:
    """Up to k records, cycling through the classes so each class shows."""
    by_class: dict[int, list[dict]] = {}
    for r in records:
        by_class.setdefault(r["label"], []).append(r)
    picks, depth = [], 0
    while len(picks) < min(k, len(records)):
        for label in sorted(by_class):
            if depth < len(by_class[label]) and len(picks) < k:
                picks.append(by_class[label][depth])
        depth += 1
    return picks
