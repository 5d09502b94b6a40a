"""One manifest per node, for deployments where each hospital must see only its own records.

A manifest listing every hospital's files is itself a disclosure, so `fedcli partition` also writes
`partition/nodes/<node>.json` (schema `fedcli.node-manifest/1`): the partition's settings, this
node's records, and for every other node only its name, site and record counts. It keeps the hash
of the full partition, so GAN and federate artifacts stay tied to one partition, and carries its
own hash against edits. A distributed rank reads only this file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedcli.core.errors import UserError
from fedcli.data.manifest import REQUIRED, Manifest, check_content, content_hash, manifest_path
from fedcli.experiment.artifacts import read_json
from fedcli.experiment.paths import inside

NODE_SCHEMA = "fedcli.node-manifest/1"


def nodes_dir(exp: Path) -> Path:
    return inside(exp, "partition", "nodes")


def node_view(data: dict[str, Any], node: str) -> dict[str, Any]:
    """The part of a full manifest that node `node` may hold."""
    view = {k: v for k, v in data.items() if k not in ("schema", "nodes", "statistics", "content_hash")}
    view |= {"schema": NODE_SCHEMA, "node": node, "partition_hash": data["content_hash"],
             "nodes": [entry if entry["name"] == node else
                       {"name": entry["name"], "site": entry["site"], "train_count": len(entry["train"]),
                        "test_count": len(entry["test"]),
                        **({"shared_count": len(entry["shared"])} if "shared" in entry else {}),
                        **({"unlabeled_count": len(entry["unlabeled"])} if "unlabeled" in entry else {})}
                       for entry in data["nodes"]]}
    view["content_hash"] = content_hash(view)
    return view


class NodeManifest(Manifest):
    """A manifest that holds one node's records; asking for another node's is an error."""

    @property
    def content_hash(self) -> str:
        return self.data["partition_hash"]

    @property
    def own(self) -> str:
        return self.data["node"]

    def node(self, name: str) -> dict[str, Any]:
        if name != self.own and name in self.node_names:
            raise UserError(f"this process holds only node {self.own}'s records, not {name}'s")
        return super().node(name)


def load_node_manifest(exp: Path, node: str | None, rank: int) -> NodeManifest:
    """Node `node`'s manifest: its own file when there is one, else its part of the full manifest.
    Without a name, the only file in `partition/nodes/` (a hospital's machine), else the node at
    position `rank` of the full manifest (every node on one machine)."""
    folder = nodes_dir(exp)
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if node is None:
        if len(files) == 1:
            node = files[0].stem
        elif manifest_path(exp).is_file():
            names = Manifest.load(exp).node_names
            if rank >= len(names):
                raise UserError(f"rank {rank} has no node: the partition has {len(names)} nodes; start one process "
                                "per node")
            node = names[rank]
        else:
            raise UserError(f"{folder} holds {len(files)} node manifests and there is no full manifest to assign "
                            "nodes by rank; pass --node-name")
    path = inside(folder, f"{node}.json")
    if path.is_file():
        data = read_json(path, f"node manifest of {node}")
        if data.get("schema") != NODE_SCHEMA or data.get("node") != node or content_hash(data) != data.get(
                "content_hash"):
            raise UserError(f"{path} is not node {node}'s unmodified {NODE_SCHEMA} manifest; copy it again from "
                            "the partition")
        missing = [k for k in REQUIRED if k not in data]
        if missing:
            raise UserError(f"{path} lacks {missing[0]!r}; copy it again from the partition")
        check_content(data, path, own=node)
        return NodeManifest(data, path)
    if not manifest_path(exp).is_file():
        raise UserError(f"node {node} has no manifest ({path} is missing); copy it from the partition, or pass "
                        "--node-name with this hospital's node name")
    full = Manifest.load(exp)
    full.node(node)
    return NodeManifest(node_view(full.data, node), manifest_path(exp))
