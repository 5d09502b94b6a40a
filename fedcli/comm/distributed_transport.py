"""The torch.distributed transport: one node per process, no server.

Models and buffers go point to point (isend/irecv of their safetensors bytes) and are validated on
receipt by the same code as in process; averaging all-reduces each node's weighted parameters in
fixed point (`transport.fixed_point`), so every rank ends with the same global model, bit for bit
the in-process one; cross-evaluation all-gathers model bytes, and a model one node holds is
broadcast to be tested everywhere (`publish`); small JSON records (sizes, checkpoint rounds,
metrics rows) are all-gathered.

Bytes in `comm.csv`: point-to-point and eval rows are the payloads' lengths; an all-reduce row is
`transport.all_reduce_bytes`, as the in-process engine records it. Over a relay (`--engine flower`) each row
also has `sealed_bytes`: what its sealed envelopes put on the relay (`RelayGroup.sealed`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch
import torch.distributed as dist

from fedcli.comm.exact_average import fixed_point, from_fixed_point, precision_bits, scale_exponents
from fedcli.comm.group import Group
from fedcli.comm.transport import EVERYONE, Transport, all_reduce_bytes, check_finite

class TorchTransport(Transport):
    def __init__(self, group: Group, strategy: str, kinds: Sequence[str]):
        super().__init__(kinds)
        self.tags = {kind: i + 1 for i, kind in enumerate(self.kinds)}  # every rank numbers them alike
        self.group, self.strategy = group, strategy
        self.rank_of = {name: rank for rank, name in enumerate(group.names)}
        self._pending: list = []
        self._taken: dict[str, int] = {}  # posted payloads received, per sender, receiver and kind

    @staticmethod
    def _key(sender: str, receiver: str, kind: str) -> str:
        return f"posted/{sender}>{receiver}/{kind}"

    def _where(self, round_: int, detail: str) -> str:
        return f"round {round_} of {self.strategy} ({detail})"

    def _sealed(self) -> Counter | None:
        """The bytes sealed for each receiver so far, where the group is a relay's."""
        return None if self.group.sealed is None else Counter(self.group.sealed)

    def _since(self, before: Counter | None, receivers: list[str]) -> int | None:
        return None if before is None else sum(self.group.sealed[r] - before[r] for r in receivers)

    def send(self, round_: int, sender: str, receiver: str, kind: str, payload: bytes) -> None:
        before = self._sealed()
        with self.group.step(self._where(round_, f"sending the {kind} to {receiver}"), self.rank_of[receiver]):
            self._pending += self.group.send_bytes(self.rank_of[receiver], self.tags[kind], payload)
        self.record(round_, sender, receiver, kind, len(payload), self._since(before, [receiver]))

    def send_whenever(self, round_: int, sender: str, receiver: str, kind: str, payload: bytes) -> None:
        self.send(round_, sender, receiver, kind, payload)
        self.group.post(self._key(sender, receiver, kind))  # only here: federate's sends keep no store round trip

    def receive(self, round_: int, sender: str, receiver: str, kind: str) -> bytes:
        with self.group.step(self._where(round_, f"waiting for the {kind} from {sender}"), self.rank_of[sender]):
            return self.group.recv_bytes(self.rank_of[sender], self.tags[kind])

    def receive_whenever(self, round_: int, sender: str, receiver: str, kind: str) -> bytes:
        key = self._key(sender, receiver, kind)
        self._taken[key] = self._taken.get(key, 0) + 1
        self.group.await_posted(key, self._taken[key], [self.rank_of[sender]],
                                self._where(round_, f"waiting for {sender} to train and send the {kind}"))
        return self.receive(round_, sender, receiver, kind)

    def barrier_whenever(self, what: str) -> None:
        self.group.barrier_whenever(f"reached/{self.strategy}/{what}", f"{self.strategy}: {what}")

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        with self.group.step(f"{self.strategy}: delivering this round's payloads"):
            self.group.wait(pending)

    def average(self, round_: int, states: dict[str, dict[str, torch.Tensor]],
                weights: dict[str, int]) -> dict[str, torch.Tensor]:
        """Two all-reduces: the largest exponent of each tensor (max), then the fixed-point weighted
        states (sum), exactly as the in-process server computes them."""
        (node, state), = states.items()
        check_finite(node, state, round_)
        names, total_weight = list(state), sum(weights.values())
        where, before = self._where(round_, "all-reduce of the shared parameters"), self._sealed()
        with self.group.step(where):
            exponents = self.group.all_reduce(scale_exponents(state, names), dist.ReduceOp.MAX)
        bits = precision_bits(total_weight)
        vector = fixed_point(state, names, weights[node], exponents, bits)
        with self.group.step(where):
            total = self.group.all_reduce(vector)
        self.record(round_, node, EVERYONE, "all-reduce", all_reduce_bytes(state, self.group.world),
                    self._since(before, [other for other in self.group.names if other != node]))
        return from_fixed_point(total, state, exponents, bits, total_weight)

    def share(self, round_: int, payloads: dict[str, bytes]) -> dict[str, bytes]:
        (node, payload), = payloads.items()
        before = self._sealed()
        with self.group.step(self._where(round_, "cross-evaluation: all-gather of the models")):
            blobs = self.group.all_gather_bytes(payload)
        for other in self.group.names:
            if other != node:
                self.record(round_, node, other, "eval", len(payload), self._since(before, [other]))
        return dict(zip(self.group.names, blobs))

    def publish(self, round_: int, holder: str, payload: bytes | None) -> bytes:
        before = self._sealed()
        with self.group.step(self._where(round_, f"broadcasting {holder}'s model to test it everywhere")):
            received = self.group.broadcast_bytes(self.rank_of[holder], payload)
        if payload is not None:
            for other in self.group.names:
                if other != holder:
                    self.record(round_, holder, other, "eval", len(payload), self._since(before, [other]))
        return received

    def gather(self, record, what: str) -> list:
        return self.group.exchange(f"{self.strategy}: {what}", record)
