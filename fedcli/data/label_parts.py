"""Few labels (FedPerl's setting, Bdair et al.): each node's training images in a labelled, an unlabelled and a
validation part, and a labelled set held apart for a global model.

- `train` keeps the labelled part: every stage that trains on a node's images (train-gan's GAN, every strategy)
  sees the visible labels only, which is the lower bound.
- `unlabeled`: the rest of the node's training images, in a keyed random order, their records with
  `label: null`. Their true labels are not in the manifest (nor its hash, nor any node's manifest): partition
  writes them to `partition/hidden_labels.json`, which no stage reads but the upper bounds' oracle
  (`federate --labels all`, `read_hidden_labels`).
  (A file path can still name a class, as the `folders` source's `site/CLASS/file` does: such a source hides
  the label from fedcli, not from someone who reads the paths.)
- `validation`: per class present with three or more images, round(V n_c) of a node's training images with
  visible labels, apart from both (a class of one or two images keeps them for training).
- `held_apart`: a class-balanced share of every node's training images with visible labels, held by one named
  node (FedPerl's global validation set; the global model's labels in scenario 2), which therefore holds real
  labelled images from every node. Each keeps its `origin` node (and its scanner, under site-shift).

Per class present in a node: the validation part first, then max(1, round(F n_c')) of the rest labelled (so
every class present keeps a labelled image); a node outside `--labeled-nodes` has no label at all (no
labelled part, no validation part). Images are drawn one by one, not by patient group: a patient's images can
be split between the parts. Draws are keyed by the partition's seed and the node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from fedcli.core.errors import UserError
from fedcli.core.rng import numpy_stream
from fedcli.data.shared_set import balanced_draw
from fedcli.experiment.artifacts import read_json
from fedcli.experiment.paths import HIDDEN_LABELS, partition_dir

LABELED, UNLABELED, VALIDATION, HELD_APART = "train", "unlabeled", "validation", "held_apart"
NO_NODE = "none"  # --labeled-nodes none: labels only in the held-apart set


def node_labels(node: dict, hidden: dict[str, list[int]]) -> list[int]:
    """Every label of a node's images, the `hidden` ones included: partition's own summaries only (the oracle
    that hid them); any later stage reads the visible parts alone."""
    return [r["label"] for part in (LABELED, VALIDATION, "test") for r in node.get(part, [])] + \
        hidden.get(node["name"], [])


def training_labels(node: dict, hidden: dict[str, list[int]]) -> list[int]:
    """The labels of the images a node trains on: its labelled part and, `hidden`, its unlabelled part's (not
    its validation or test parts): where label skew is measured."""
    return [r["label"] for r in node.get(LABELED, [])] + hidden.get(node["name"], [])


def training_count(node: dict) -> int:
    """A node's training images in every part (labelled, unlabelled, validation)."""
    return sum(len(node.get(part, [])) for part in (LABELED, UNLABELED, VALIDATION))


def by_class(records: list[dict]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = defaultdict(list)
    for i, record in enumerate(records):
        members[record["label"]].append(i)
    return dict(sorted(members.items()))


def split_labels(node: dict, fraction: float, validation: float, labeled: bool, seed: int) -> list[int]:
    """Node `node`'s training records into its labelled, unlabelled and validation parts, in place; returns the
    hidden labels, in the order of its `unlabeled` records."""
    records = node["train"]
    rng = numpy_stream(seed, "label-parts", node["name"])
    to_validation, to_labeled = set(), set()
    for members in by_class(records).values():
        order = [members[k] for k in rng.permutation(len(members))]
        held = round(validation * len(members)) if labeled and len(members) > 2 else 0
        to_validation.update(order[:held])
        rest = order[held:]
        to_labeled.update(rest[:max(1, round(fraction * len(rest)))] if labeled else [])
    rest = [i for i in range(len(records)) if i not in to_validation and i not in to_labeled]
    unlabeled = [records[rest[k]] for k in rng.permutation(len(rest))]  # no class order to read labels from
    node[LABELED] = [r for i, r in enumerate(records) if i in to_labeled]
    node[VALIDATION] = [r for i, r in enumerate(records) if i in to_validation]
    node[UNLABELED] = [{**r, "label": None} for r in unlabeled]
    return [r["label"] for r in unlabeled]


def hold_apart(nodes: list[dict], fraction: float, holder: str, label_names: list[str], seed: int) -> None:
    """Move round(fraction N / C) training images of every class, drawn from every node, to `holder`'s
    `held_apart`."""
    names = [node["name"] for node in nodes]
    if holder not in names:
        raise UserError(f"--held-apart-node {holder} is not a node of the partition; nodes: {', '.join(names)}")
    drawn = balanced_draw(nodes, fraction, label_names, seed, "held-apart", "--held-apart-fraction")
    nodes[names.index(holder)][HELD_APART] = [
        {**record, "origin": node["name"], **({"acquisition": node["acquisition"]} if node.get("acquisition") else {})}
        for node, records in zip(nodes, drawn) for record in records]


def make_parts(nodes: list[dict], fraction: float, validation: float, labeled_nodes: Sequence[str] | None,
               held_apart: float, holder: str | None, label_names: list[str],
               seed: int) -> tuple[dict, dict[str, list[int]]]:
    """Every node's parts; the manifest's `labels` record of them, and each node's hidden labels."""
    names = [node["name"] for node in nodes]
    labeled = names if labeled_nodes is None else check_labeled_nodes(list(labeled_nodes), names)
    holder = holder or names[0]
    if held_apart:
        hold_apart(nodes, held_apart, holder, label_names, seed)
    hidden = {node["name"]: split_labels(node, fraction, validation, node["name"] in labeled, seed) for node in nodes}
    if not any(node[LABELED] for node in nodes) and not held_apart:
        raise UserError("no node has a labelled image and no set is held apart (--held-apart-fraction): nothing "
                        "could learn the classes; name --labeled-nodes or hold a labelled set apart")
    record = {"fraction": fraction, "validation_fraction": validation, "labeled_nodes": labeled,
              "held_apart": {"fraction": held_apart, "holder": holder} if held_apart else None}
    return record, hidden


def unlabelled_nodes(record: dict | None, nodes: list[str]) -> list[str]:
    """The nodes outside --labeled-nodes, given the manifest's `labels` record (None: every label visible)."""
    return [node for node in nodes if record and node not in record["labeled_nodes"]]


def hides_labels(record: dict | None, nodes: list[str]) -> bool:
    """Whether some training image is unlabelled: a labelled fraction under 1, or a node without labels."""
    return bool(record) and (record["fraction"] < 1 or bool(unlabelled_nodes(record, nodes)))


def labels_at_server(record: dict | None) -> bool:
    """FedPerl's scenario 2: every label in the held-apart set, none at a node."""
    return bool(record) and bool(record["held_apart"]) and not record["labeled_nodes"]


def oracle_file(manifest) -> dict:
    """`partition/hidden_labels.json`: each node's hidden labels in its `unlabeled` order, tied to the partition
    by its content hash."""
    return {"schema": "fedcli.hidden-labels/1", "partition": manifest.content_hash, "labels": manifest.hidden}


def read_hidden_labels(exp: Path, manifest) -> dict[str, list[int]]:
    """The oracle's labels (`federate --labels all`): each node's hidden labels in its `unlabeled` order, checked
    against the partition they were hidden from."""
    path = partition_dir(exp) / HIDDEN_LABELS
    fix = "re-run fedcli partition --overwrite"
    data = read_json(path, "the hidden labels (partition/hidden_labels.json)", fix)
    if not isinstance(data, dict) or data.get("partition") != manifest.content_hash:
        raise UserError(f"{path} was not written with this partition (its content hash differs); {fix}")
    labels = data.get("labels")
    for node in manifest.node_names:
        held = labels.get(node, []) if isinstance(labels, dict) else None
        expected = len(manifest.node(node).get(UNLABELED, []))
        if not isinstance(held, list) or len(held) != expected or not all(
                isinstance(y, int) and not isinstance(y, bool) and 0 <= y < manifest.num_classes for y in held):
            raise UserError(f"{path} does not hold {expected} class indices for node {node}'s unlabelled images; {fix}")
    return {node: labels.get(node, []) for node in manifest.node_names}


def check_labeled_nodes(given: list[str], names: list[str]) -> list[str]:
    """--labeled-nodes as given: node names once each, or `none` alone."""
    if NO_NODE in names:
        raise UserError(f"a node is named {NO_NODE}, which --labeled-nodes reads as no node; rename that site")
    if NO_NODE in given:
        if given != [NO_NODE]:
            raise UserError(f"--labeled-nodes {NO_NODE} means no node keeps labels; it takes no node name beside it")
        return []
    unknown = [n for n in given if n not in names]
    if unknown:
        raise UserError(f"--labeled-nodes names {unknown[0]}, not a node of the partition; nodes: {', '.join(names)}")
    twice = sorted({n for n in given if given.count(n) > 1})
    if twice:
        raise UserError(f"--labeled-nodes names {twice[0]} twice; name each node once")
    return given
