"""The partition manifest: a versioned record of which images each node holds, and how to load them.

Schema `fedcli.manifest/1`:
  source, scheme, seed, image_size, channels, label_names, augment, data_root, data_file,
  test_fraction, folds, dropped, statistics, content_hash,
  nodes: [{name, site, acquisition, train: [record], test: [record]}]
  record: {id, label, fold (train only), and path (relative to data_root) or index; group; nbytes}

The content hash covers everything that decides what pixels and labels a later stage sees
(records with ids, labels, paths, file sizes and folds; node transforms; image size and
channels), not where the data lies, so a moved data folder keeps its hash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedcli.artifacts import canonical_json, read_json, sha256_bytes
from fedcli.errors import UserError

SCHEMA = "fedcli.manifest/1"
UNHASHED = ("content_hash", "data_root", "statistics", "dropped")
REQUIRED = ("source", "scheme", "seed", "image_size", "channels", "label_names", "nodes", "content_hash")


def content_hash(data: dict[str, Any]) -> str:
    hashed = {k: v for k, v in data.items() if k not in UNHASHED}
    return sha256_bytes(canonical_json(hashed).encode())


def manifest_path(exp: Path) -> Path:
    return Path(exp) / "partition" / "manifest.json"


class Manifest:
    """A validated manifest with accessors for nodes and records."""

    def __init__(self, data: dict[str, Any], path: Path | None = None):
        self.data = data
        self.path = path

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
    def root(self) -> Path | None:
        root = self.data.get("data_root")
        return Path(root) if root else None

    def node(self, name: str) -> dict[str, Any]:
        for node in self.data["nodes"]:
            if node["name"] == name:
                return node
        raise UserError(f"no node {name!r} in the partition; valid nodes: {', '.join(self.node_names)}")

    def records(self, node: str, split: str, folds: list[int] | None = None) -> list[dict[str, Any]]:
        """A node's train or test records; `folds` keeps only train records of those folds."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be train or test, not {split!r}")
        records = self.node(node)[split]
        if folds is not None:
            if split != "train":
                raise ValueError("folds select from the train split")
            wanted = set(folds)
            records = [r for r in records if r["fold"] in wanted]
        return records
