"""Transports move serialized bytes between nodes and record every transfer.

The in-process transport is a set of mailboxes; a torch.distributed transport can replace it
without changing the strategies. Every byte a strategy exchanges passes through `send`, so the
communication cost in `comm.csv` is measured, not estimated.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

SERVER = "server"
KINDS = ("model", "buffer", "global-model", "eval")


@dataclasses.dataclass(frozen=True)
class Transfer:
    round: int
    sender: str
    receiver: str
    kind: str
    bytes: int


class InProcessTransport:
    def __init__(self):
        self.transfers: list[Transfer] = []
        self._mailboxes: dict[tuple[str, str], list[bytes]] = defaultdict(list)

    def send(self, round_: int, sender: str, receiver: str, kind: str, payload: bytes) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown transfer kind {kind!r}")
        if sender == receiver:
            raise ValueError(f"{sender} cannot send to itself")
        self.transfers.append(Transfer(round_, sender, receiver, kind, len(payload)))
        self._mailboxes[(receiver, kind)].append(bytes(payload))

    def receive(self, receiver: str, kind: str) -> bytes:
        box = self._mailboxes[(receiver, kind)]
        if not box:
            raise RuntimeError(f"{receiver} expected a {kind} payload and none arrived")
        return box.pop(0)
