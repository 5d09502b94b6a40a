"""The partition manifest: a versioned record of which images each node holds, and how to load them.

Schema `fedcli.manifest/1`:
  source, scheme, seed, image_size, channels, label_names, augment, data_root, data_file,
  test_fraction, folds, dropped, statistics, content_hash, bit_depth and value_range (the pixel scale of
  files deeper than 8 bits, data/pixelscale.py; absent in manifests written before it), preprocess (graham:
  every file is read through data/graham.py; absent: none),
  nodes: [{name, site, acquisition, train: [record], test: [record]}]
  record: {id, label, fold (train only), and path (relative to data_root) or index; group; nbytes}

The content hash covers everything that decides what pixels and labels a later stage sees
(records with ids, labels, paths, file sizes and folds; node transforms; image size and
channels), not where the data lies, so a moved data folder keeps its hash. A hash only shows the
file is as some tool wrote it, so loading also checks what later stages rely on: node, site and
class names (node names become folder names), labels that index the classes, folds in range.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from fedcli.core.errors import UserError
from fedcli.data.pixelscale import Scale
from fedcli.experiment.artifacts import json_sha256, read_json
from fedcli.experiment.config import MAX_IMAGE_SIZE
from fedcli.experiment.names import check_name, check_names

SCHEMA = "fedcli.manifest/1"
UNHASHED = ("content_hash", "data_root", "statistics", "dropped", "positive_class")  # none decides a pixel or label
SPLITS = ("train", "test", "shared", "unlabeled", "validation", "held_apart")
OPTIONAL_SPLITS = SPLITS[2:]  # the shared set's part, and the few-labels parts (data/label_parts.py)
ARRAY_SOURCES = ("digits", "medmnist")  # records index a row of an array; every other source's name a file
REQUIRED = ("source", "scheme", "seed", "image_size", "channels", "label_names", "nodes", "content_hash")


def content_hash(data: dict[str, Any]) -> str:
    hashed = {k: v for k, v in data.items() if k not in UNHASHED}
    return json_sha256(hashed)


def manifest_path(exp: Path) -> Path:
    return Path(exp) / "partition" / "manifest.json"


def check_content(data: dict[str, Any], path: Path, own: str | None = None) -> None:
    """Names, labels, folds, the image shape and where each record's image lies, as partition writes them;
    anything else is one UserError naming it. `own`: a node manifest's node, the one whose records it holds
    (the others' entries are counts, data/node_manifest.py)."""
    nodes, names = data["nodes"], data["label_names"]
    if not isinstance(nodes, list) or not nodes or not all(isinstance(n, dict) for n in nodes) \
            or not isinstance(names, list):
        raise UserError(f"{path} has no list of nodes and class names; re-run fedcli partition")
    check_shape(data, path)
    check_names("node", [n.get("name") for n in nodes], str(path))
    for node in nodes:
        check_name("site", node.get("site"), str(path))
    check_names("class", names, str(path))
    global_test = data.get("global_test", [])
    if not isinstance(global_test, list) or not all(isinstance(r, dict) and type(r.get("label")) is int
                                                    and 0 <= r["label"] < len(names) for r in global_test):
        raise UserError(f"{path}: the global test set is not a list of records with class indices 0..{len(names) - 1}; "
                        "re-run fedcli partition")
    for record in global_test:
        check_reference(record, data["source"], path, "the global test set's")
    folds = data.get("folds")
    for node in nodes:
        if own is not None and node["name"] != own:
            counts = [node.get("train_count"), node.get("unlabeled_count", 0)]
            if not all(type(n) is int and n >= 0 for n in counts) or not sum(counts):
                raise UserError(f"{path}: node {node['name']}'s entry has no count of training images; copy the "
                                "node manifest again from the partition")
            continue
        for split in SPLITS:
            records = node.get(split, [] if split in OPTIONAL_SPLITS else None)
            if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                raise UserError(f"{path}: node {node['name']} has no list of {split} records; re-run fedcli partition")
            for record in records:
                check_reference(record, data["source"], path, f"node {node['name']}'s {split}")
                label = record.get("label")
                if split == "unlabeled":
                    if label is not None:
                        raise UserError(f"{path}: node {node['name']}'s unlabeled record {record.get('id')!r} "
                                        "carries a label; re-run fedcli partition")
                    continue
                if type(label) is not int or not 0 <= label < len(names):
                    raise UserError(f"{path}: node {node['name']}'s {split} record {record.get('id')!r} has label "
                                    f"{label!r}, not a class index 0..{len(names) - 1}; re-run fedcli partition")
                fold = record.get("fold")
                if split == "train" and type(folds) is int and (type(fold) is not int or not 0 <= fold < folds):
                    raise UserError(f"{path}: node {node['name']}'s train record {record.get('id')!r} has fold "
                                    f"{fold!r}, not one of 0..{folds - 1}; re-run fedcli partition")
        if not node["train"] and not node.get("unlabeled"):
            raise UserError(f"{path}: node {node['name']} holds no training image; re-run fedcli partition")


def check_shape(data: dict[str, Any], path: Path) -> None:
    """The image size and channels every stage builds its models and tensors for, as partition allows them."""
    size, channels = data["image_size"], data["channels"]
    if type(size) is not int or not 16 <= size <= MAX_IMAGE_SIZE or size & (size - 1):
        raise UserError(f"{path}: image_size {size!r} is not a power of two in 16..{MAX_IMAGE_SIZE}; re-run fedcli "
                        "partition")
    if channels not in (1, 3) or type(channels) is not int:
        raise UserError(f"{path}: channels {channels!r} is neither 1 nor 3; re-run fedcli partition")


def check_reference(record: dict, source: str, path: Path, whose: str) -> None:
    """A record's image: a row index of the source's array (its upper bound is checked where the array is
    read, data/loading.py), or a file path that stays inside the data folder, so that no manifest makes a
    hospital read another file on its disk."""
    if source in ARRAY_SOURCES:
        index = record.get("index")
        if type(index) is not int or index < 0:
            raise UserError(f"{path}: {whose} record {record.get('id')!r} has index {index!r}, not a row number 0 "
                            "or more; re-run fedcli partition")
        return
    name = record.get("path")
    parts = PurePosixPath(name).parts if isinstance(name, str) else ()
    if not parts or name.startswith("/") or "\\" in name or ".." in parts or ":" in parts[0]:
        raise UserError(f"{path}: {whose} record {record.get('id')!r} has path {name!r}, not a file inside the data "
                        "folder; re-run fedcli partition")


class Manifest:
    """A validated manifest with accessors for nodes and records."""

    def __init__(self, data: dict[str, Any], path: Path | None = None):
        self.data = data
        self.path = path
        self.hidden: dict[str, list[int]] = {}  # hidden labels, held only by the partition that hid them

    @classmethod
    def load(cls, exp: Path) -> "Manifest":
        path = manifest_path(exp)
        if not path.is_file():
            raise UserError(f"no partition in {exp} ({path} is missing); run fedcli partition --exp {exp} first")
        data = read_json(path, "manifest")
        missing = [k for k in REQUIRED if k not in data] if isinstance(data, dict) else list(REQUIRED)
        if missing or data.get("schema") != SCHEMA:
            raise UserError(f"{path} is not a {SCHEMA} manifest; re-run fedcli partition")
        if content_hash(data) != data["content_hash"]:
            raise UserError(f"{path} was modified after it was written (content hash mismatch); re-run fedcli partition")
        check_content(data, path)
        return cls(data, path)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    @property
    def content_hash(self) -> str:
        return self.data["content_hash"]

    @property
    def node_names(self) -> list[str]:
        return [n["name"] for n in self.data["nodes"]]

    @property
    def num_classes(self) -> int:
        return len(self.data["label_names"])

    @property
    def positive_class(self) -> int:
        """A binary task's positive class (its sensitivity's): the one the partition names, else the second
        (a manifest written before partitions named it; every built-in binary source lists it second)."""
        names = self.data["label_names"]
        return names.index(self.data["positive_class"]) if self.data.get("positive_class") in names else 1

    @property
    def scale(self) -> Scale:
        """How files deeper than 8 bits decode: the one scale partition chose for the dataset."""
        return Scale.from_manifest(self.data, self.path)

    @property
    def root(self) -> Path | None:
        root = self.data.get("data_root")
        return Path(root) if root else None

    def node(self, name: str) -> dict[str, Any]:
        for node in self.data["nodes"]:
            if node["name"] == name:
                return node
        raise UserError(f"no node {name!r} in the partition; valid nodes: {', '.join(self.node_names)}")

    def chosen(self, node: str | None) -> list[str]:
        """The nodes a stage's `--node` names: that one (refused when unknown), or every node."""
        return [self.node(node)["name"]] if node else self.node_names

    def stage_seed(self, seed: int | None) -> int:
        """A stage's seed: its `--seed`, or the partition's."""
        return self["seed"] if seed is None else seed

    def train_count(self, node: str) -> int:
        """How many training images a node holds: its records' count, or the count a node manifest keeps of
        another node's (fedcli/data/node_manifest.py)."""
        entry = Manifest.node(self, node)  # not a node manifest's refusal: the count is what it holds of the others
        return len(entry["train"]) if "train" in entry else entry["train_count"]

    def records(self, node: str, split: str, folds: list[int] | None = None) -> list[dict[str, Any]]:
        """A node's train or test records, its part of the shared set, or (few labels, data/label_parts.py) its
        unlabelled part (labels null), validation part or the held-apart set it holds; none where the partition
        has no such part. `folds` keeps only train records of those folds."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
        records = self.node(node).get(split, [])
        if folds is not None:
            if split != "train":
                raise ValueError("folds select from the train split")
            wanted = set(folds)
            records = [r for r in records if r["fold"] in wanted]
        return records
