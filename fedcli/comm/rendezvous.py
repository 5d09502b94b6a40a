"""The first exchange of a distributed stage (federate, or train-gan's serial chain): which node each rank
is, and one partition and one set of options across the ranks."""

from __future__ import annotations

import hashlib

from fedcli.comm.group import Group
from fedcli.core.errors import UserError
from fedcli.data.node_manifest import NodeManifest
from fedcli.experiment.artifacts import canonical_json


def claim_nodes(group: Group, manifest: NodeManifest, options: dict, stage: str) -> None:
    """Rank -> node in `group`; refuse a world that is not one process per node of one partition, all started
    with the same `options` (those that decide the numbers, not where or how fast)."""
    nodes = manifest.node_names
    digest = hashlib.sha256(canonical_json(options).encode()).hexdigest()
    claims = group.exchange("the rendezvous", [manifest.own, manifest.content_hash, digest])
    names = [c[0] for c in claims]
    group.assign(names)
    if group.world != len(nodes):
        raise UserError(f"{group.world} processes joined but the partition has {len(nodes)} nodes; start "
                        "exactly one process per node")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(f"two processes claim node {twice[0]}; give each process its own --node")
    for name, partition, theirs in claims:
        if partition != manifest.content_hash:
            raise UserError(f"node {name} holds another partition than node {manifest.own}; give every node its "
                            "manifest from the same fedcli partition run")
        if theirs != digest:
            raise UserError(f"node {name} was started with other {stage} options than node {manifest.own}; start "
                            "every node with the same options")
