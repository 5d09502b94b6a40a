"""Transports move serialized bytes between nodes and record every transfer.

Strategies only talk to a `Transport`: point-to-point `send`/`receive` of safetensors bytes, a
weighted `average` of the shared parameters, `share` of models for cross-evaluation, and `gather`
of small JSON records (sizes, checkpoint rounds, metrics). The in-process transport simulates every
node in one process; `fedcli.comm.distributed_transport` runs one node per process on
torch.distributed. Neither has a server: averaging is an all-reduce, computed in process as the
sum it would produce. Every transfer is recorded with its bytes (an all-reduce's from its volume),
so both engines write the same `comm.csv` for the same run.
"""

from __future__ import annotations

import abc
import dataclasses
from collections import defaultdict
from collections.abc import Sequence

import torch

from fedcli.comm.exact_average import weighted_average
from fedcli.comm.payloads import PayloadError

EVERYONE = "all"  # the receiver of a collective (all-reduce) contribution


@dataclasses.dataclass(frozen=True)
class Transfer:
    round: int
    sender: str
    receiver: str
    kind: str
    bytes: int
    sealed_bytes: int | None = None  # what its sealed envelopes put on a relay (--engine flower), beside `bytes`


class Transport(abc.ABC):
    def __init__(self, kinds: Sequence[str]):
        """`kinds`: every kind of transfer its users may send (the strategies' or a generator chain's), in an
        order every process gives alike."""
        self.kinds = tuple(kinds)
        self.transfers: list[Transfer] = []

    def record(self, round_: int, sender: str, receiver: str, kind: str, size: int, sealed: int | None = None) -> None:
        if kind not in self.kinds:
            raise ValueError(f"unknown transfer kind {kind!r}")
        if sender == receiver:
            raise ValueError(f"{sender} cannot send to itself")
        self.transfers.append(Transfer(round_, sender, receiver, kind, size, sealed))

    @abc.abstractmethod
    def send(self, round_: int, sender: str, receiver: str, kind: str, payload: bytes) -> None:
        """Queue `payload` for `receiver`; it may leave after this returns (see `flush`)."""

    @abc.abstractmethod
    def receive(self, round_: int, sender: str, receiver: str, kind: str) -> bytes:
        """The next `kind` payload from `sender` to `receiver`, waiting for it if need be."""

    def send_whenever(self, round_: int, sender: str, receiver: str, kind: str, payload: bytes) -> None:
        """`send`, for a payload its receiver takes with `receive_whenever`."""
        self.send(round_, sender, receiver, kind, payload)

    def receive_whenever(self, round_: int, sender: str, receiver: str, kind: str) -> bytes:
        """`receive`, for a payload sent only after work of unbounded length (a serial chain's training): it
        waits past the timeout while the sender lives."""
        return self.receive(round_, sender, receiver, kind)

    def barrier_whenever(self, what: str) -> None:
        """Wait until every process reached this point, however long each takes while it lives."""

    def flush(self) -> None:
        """Wait until every queued send has been delivered."""

    @abc.abstractmethod
    def average(self, round_: int, states: dict[str, dict[str, torch.Tensor]],
                weights: dict[str, int]) -> dict[str, torch.Tensor]:
        """The mean of every node's state weighted by `weights` (all nodes), given the states of the
        nodes this process holds; every node ends with the same result."""

    @abc.abstractmethod
    def share(self, round_: int, payloads: dict[str, bytes]) -> dict[str, bytes]:
        """Every node's model payloads (by model key), given this process's: cross-evaluation."""

    @abc.abstractmethod
    def publish(self, round_: int, holder: str, payload: bytes | None) -> bytes:
        """`holder`'s model payload on every node, to be tested there (given where `holder` is local,
        None elsewhere): a model that one node holds and every test set needs."""

    @abc.abstractmethod
    def gather(self, record, what: str) -> list:
        """One JSON-able record from each process, in rank order (metadata only, never tensors); also
        a barrier. `what` names the exchange in an error."""


class InProcessTransport(Transport):
    """Every node in this process: mailboxes, and the distributed engine's all-reduce, computed here."""

    def __init__(self, kinds: Sequence[str]):
        super().__init__(kinds)
        self._mailboxes: dict[tuple[str, str, str], list[bytes]] = defaultdict(list)

    def send(self, round_: int, sender: str, receiver: str, kind: str, payload: bytes) -> None:
        self.record(round_, sender, receiver, kind, len(payload))
        self._mailboxes[(sender, receiver, kind)].append(bytes(payload))

    def receive(self, round_: int, sender: str, receiver: str, kind: str) -> bytes:
        box = self._mailboxes[(sender, receiver, kind)]
        if not box:
            raise RuntimeError(f"{receiver} expected a {kind} payload from {sender} and none arrived")
        return box.pop(0)

    def average(self, round_: int, states: dict[str, dict[str, torch.Tensor]],
                weights: dict[str, int]) -> dict[str, torch.Tensor]:
        """The sum an all-reduce computes (the same fixed point, so the same bits), and for each node the
        volume the distributed engine records for it: both engines give the same comm.csv."""
        for node, state in states.items():
            check_finite(node, state, round_)
            self.record(round_, node, EVERYONE, "all-reduce", all_reduce_bytes(state, len(weights)))
        nodes = list(states)
        return weighted_average([states[node] for node in nodes], [weights[node] for node in nodes])

    def share(self, round_: int, payloads: dict[str, bytes]) -> dict[str, bytes]:
        return dict(payloads)  # every model already lives here

    def publish(self, round_: int, holder: str, payload: bytes | None) -> bytes:
        return payload  # every test set already lives here

    def gather(self, record, what: str) -> list:
        return [record]


def check_finite(node: str, state: dict[str, torch.Tensor], round_: int) -> None:
    for name, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise PayloadError(f"node {node}'s model tensor {name!r} holds non-finite values after round {round_}")


def all_reduce_bytes(state: dict[str, torch.Tensor], world: int) -> int:
    """What a ring all-reduce sends per node for `state`: 2 (N - 1) / N times its int64 fixed-point vector
    and its exponents (computed from their size: gloo does not report what it sent)."""
    volume = (sum(tensor.numel() for tensor in state.values()) + len(state)) * 8
    return round(2 * (world - 1) / world * volume)
