"""Strategies whose nodes train on their own images joined with a set received once, in round 0 (FedAvg+Share's
shared set, the replay strategies' decoded codes or buffers): the join, made once per run, and its checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from fedcli.data.tensor_source import TensorSource

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation

HELD = "shared-set"  # the state key prefix of each node's received set


class TrainsOnUnion:
    """Mixed in before a Strategy: the received set's join, and its place in the checkpoint."""

    union: dict[str, TensorSource]  # each local node's received set, in node order
    joined: dict[str, TensorSource]

    def sources(self, fed: "Federation", node: str) -> TensorSource:
        """The node's images and the received set, joined once per run rather than every round."""
        if node not in self.joined:
            self.joined[node] = TensorSource.concat([fed.data.train[node], self.union[node]])
        return self.joined[node]

    def trained_on(self, fed: "Federation", node: str) -> tuple[TensorSource, TensorSource | None]:
        return self.sources(fed, node), None

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        return super().state() | {f"{HELD}:{node}": {"images": source.images, "labels": source.labels}
                                  for node, source in self.union.items()}

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, states)
        self.joined = {}
        self.union = {node: TensorSource(states[f"{HELD}:{node}"]["images"].cpu(),
                                         states[f"{HELD}:{node}"]["labels"].cpu()) for node in fed.local_nodes}


def all_to_all(fed: "Federation", kind: str, own: Callable[[str], TensorSource], encode: Callable[[str], bytes],
               decode: Callable[[str, str, bytes], TensorSource]) -> dict[str, TensorSource]:
    """Round 0: every node's payload (`encode(sender)`) to every other node, which decodes it
    (`decode(receiver, sender, bytes)`); each local node ends with every node's part, its own as `own` gives it,
    joined in node order."""
    parts: dict[str, dict[str, TensorSource]] = {node: {} for node in fed.local_nodes}
    for sender in fed.nodes:
        if sender in fed.local_nodes:
            parts[sender][sender] = own(sender)
            payload = encode(sender)
            for receiver in fed.nodes:
                if receiver != sender:
                    fed.transport.send(0, sender, receiver, kind, payload)
        for receiver in fed.local_nodes:
            if receiver != sender:
                parts[receiver][sender] = decode(receiver, sender, fed.transport.receive(0, sender, receiver, kind))
    fed.transport.flush()
    return {node: TensorSource.concat([held[n] for n in fed.nodes]) for node, held in parts.items()}
