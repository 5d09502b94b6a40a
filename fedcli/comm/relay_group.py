"""The group of a `--engine flower` run: the torch.distributed group's transfers and collectives, carried as
sealed envelopes through Flower's SuperLink, so `TorchTransport` and fedcli's node code run on it unchanged.

This node's process serves a postbox on loopback. Its bridge (fedcli/comm/flower/bridge.py, in Flower's
environment, beside its SuperNode) connects once per Flower message: it hands over the envelopes the relay
(fedcli/comm/flower/server_app.py) routed here, with the relay's news of the nodes (which have gone, how long
each has been silent), and takes the envelopes this node has queued. Every envelope is sealed for its recipient
(fedcli/comm/sealing.py); the channel it belongs to (a point-to-point tag, a gather, a broadcast, a post) is
inside the seal, so the relay sees only who sends how many bytes to whom.

Collectives are relayed, not computed at the coordinator: an all-gather sends this node's bytes to every other
node; an all-reduce all-gathers each node's int64 fixed-point vector (fedcli/comm/exact_average.py) and sums it
here, in rank order, so every node ends with the torch.distributed engine's bits. The coordinator therefore sees
nothing of a model; each node sees every other node's weighted contribution (where gloo's ring shows partial
sums), as a FedAvg server would.
"""

from __future__ import annotations

import collections
import contextlib
import json
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from fedcli.comm.flower import wire
from fedcli.comm.group import PeerLost
from fedcli.comm.sealing import SealError, Sealer, load_private_key
from fedcli.core.errors import UserError

HOLD_S = 0.2  # the longest a bridge's message waits here for something to send
ANNOUNCE, SEALED = "announce", "sealed"


def read_bundle(bundle: Path) -> tuple[str, bytes, dict[str, str]]:
    """(node name, its authentication key's bytes, the allow-list) of a hospital's bundle (fedcli/comm/bundles.py)."""
    try:
        facts = json.loads((bundle / "node.json").read_text())
        allowed = json.loads((bundle / "allowlist.json").read_text())
        return facts["node"], (bundle / "node.key").read_bytes(), allowed
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{bundle} is not a fedcli node bundle ({exc}); make it with fedcli deploy") from exc


class RelayGroup:
    """The `Group` interface (fedcli/comm/group.py) over the relay: ranks are the partition's node order."""

    backend = "relay"
    device = torch.device("cpu")

    def __init__(self, timeout: float, node: str, names: list[str], bundle: Path, port: int):
        own, key, allowed = read_bundle(bundle)
        if own != node:
            raise UserError(f"the bundle {bundle} is node {own}'s, not {node}'s; give each node its own bundle")
        self.sealer = Sealer(node, load_private_key(key, f"{bundle / 'node.key'}"), allowed)
        missing = [name for name in names if name not in allowed]
        if missing:
            raise UserError(f"node {missing[0]} is in the partition but not on the federation's allow-list; have the "
                            "coordinator make the bundles for this partition")
        self.timeout, self.node = timeout, node
        self.names = list(names)
        self.rank, self.world = names.index(node), len(names)
        self._what = "the start of the run"
        self._state, self._error = "running", None
        self._changed = threading.Condition()
        self._outbox: list[tuple[str, str, bytes]] = []  # (receiver, kind, blob)
        self._inbox: dict[tuple[str, str], collections.deque] = collections.defaultdict(collections.deque)
        self._posted: collections.Counter = collections.Counter()
        self._deliveries: dict[int, tuple[dict, list[bytes]]] = {}  # out of order, kept until their turn
        self._next_delivery = 0
        self._gone: list[str] = []
        self._ages: dict[str, float] = {}
        self._refused: SealError | None = None
        self._heard = time.monotonic()  # the bridge's last message
        self._waiting = False
        self._told = False  # whether the bridge has taken this node's final state
        self._answers = 0
        self.sealed: collections.Counter = collections.Counter()  # bytes of the envelopes sealed per receiver
        self._listener = socket.create_server(("127.0.0.1", port))
        self._serving = threading.Thread(target=self._serve, daemon=True)
        self._serving.start()
        for other in self._others():
            self._queue(other, ANNOUNCE, self.sealer.announcement())
        self._await(lambda: all(other in self.sealer.admitted for other in self._others()), None,
                    "the exchange of the nodes' keys")

    def _others(self) -> list[str]:
        return [name for name in self.names if name != self.node]

    # --- the postbox, served to the bridge ---------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            with connection:
                with contextlib.suppress(OSError, ValueError):
                    self._visit(connection)

    def _visit(self, connection: socket.socket) -> None:
        """One Flower message: take what the relay brought, answer with what is queued (waiting briefly for it)."""
        header, blobs = wire.receive_frame(connection)
        with self._changed:
            self._heard = time.monotonic()
            if header["n"] >= 0:  # -1: the relay's news only
                self._deliveries[int(header["n"])] = (header, blobs)
            while self._next_delivery in self._deliveries:
                self._deliver(*self._deliveries.pop(self._next_delivery))
                self._next_delivery += 1
            self._gone, self._ages = list(header.get("gone", [])), dict(header.get("ages", {}))
            self._changed.notify_all()
            self._changed.wait_for(lambda: self._outbox or self._waiting or self._state != "running", HOLD_S)
            outbox, self._outbox = self._outbox, []
            state, error = self._state, self._error
        wire.send_frame(connection, {"items": [{"to": to, "kind": kind} for to, kind, _ in outbox], "state": state,
                                     "error": error, "m": self._answers}, [blob for _, _, blob in outbox])
        with self._changed:
            self._answers += 1  # numbered: the relay may pull two answers at once, in either order
            self._told = state != "running"
            self._changed.notify_all()

    def _deliver(self, header: dict, blobs: list[bytes]) -> None:
        for item, blob in zip(header["items"], blobs):
            sender = item["from"]
            try:
                if item["kind"] == ANNOUNCE:
                    self.sealer.admit(blob)
                    continue
                plain = self.sealer.open(sender, blob)
            except SealError as exc:
                self._refused = self._refused or exc
                continue
            (size,) = struct.unpack_from(">H", plain)
            channel = plain[2:2 + size].decode()
            if channel.startswith("post/"):
                self._posted[channel.removeprefix("post/")] += 1
            else:
                self._inbox[(sender, channel)].append(plain[2 + size:])

    # --- waiting, and naming who is missing -------------------------------------------------------------
    def _await(self, ready, peer: str | None, what: str, patient: bool = False):
        """Until `ready()` holds; a refused envelope, a node the relay reports gone, a silent relay, or (unless
        `patient`, which waits while `peer` is heard from) the timeout stops the wait in one line."""
        started = time.monotonic()
        with self._changed:
            self._waiting = True
            self._changed.notify_all()
            try:
                while not ready():
                    if self._refused is not None:
                        raise self._refused
                    if self._gone:
                        raise self.lost(f"lost {', '.join(self._gone)} during {what}: its process stopped")
                    now = time.monotonic()
                    if now - self._heard > self.timeout:
                        raise self.lost(f"lost the relay during {what}: no message from the SuperLink for "
                                        f"{self.timeout:g} s")
                    if peer is not None and self._ages.get(peer, 0.0) > self.timeout:
                        raise self.lost(f"lost {peer} during {what}: the relay has not heard from it for "
                                        f"{self.timeout:g} s")
                    if not patient and now - started > self.timeout:
                        who = peer or "a peer"
                        raise self.lost(f"lost {who} during {what}: it did not reach this exchange within the "
                                        f"{self.timeout:g} s timeout")
                    self._changed.wait(0.1)
            finally:
                self._waiting = False

    def lost(self, message: str) -> PeerLost:
        return PeerLost(message)

    def _take(self, sender: str, channel: str) -> bytes:
        box = self._inbox[(sender, channel)]
        self._await(lambda: bool(box), sender, self._what)
        return box.popleft()

    def _queue(self, receiver: str, kind: str, blob: bytes) -> None:
        with self._changed:
            self._outbox.append((receiver, kind, blob))
            self._changed.notify_all()

    def _send(self, receiver: str, channel: str, payload: bytes) -> None:
        name = channel.encode()
        envelope = self.sealer.seal(receiver, struct.pack(">H", len(name)) + name + payload)
        self.sealed[receiver] += len(envelope)
        self._queue(receiver, SEALED, envelope)

    # --- the Group interface ----------------------------------------------------------------------------
    def assign(self, names: list[str]) -> None:
        if list(names) != self.names:
            raise UserError(f"the nodes claim {', '.join(names)} in the partition's order {', '.join(self.names)}")

    @contextlib.contextmanager
    def step(self, what: str, peer: int | None = None):
        self._what = what
        yield

    def send_bytes(self, dst: int, tag: int, payload: bytes) -> list:
        self._send(self.names[dst], f"tag/{tag}", payload)
        return []

    def wait(self, works: list) -> None:
        """Until every queued envelope has left with the bridge."""
        self._await(lambda: not self._outbox, None, self._what)

    def recv_bytes(self, src: int, tag: int) -> bytes:
        return self._take(self.names[src], f"tag/{tag}")

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        for other in self._others():
            self._send(other, "gather", payload)
        return [payload if name == self.node else self._take(name, "gather") for name in self.names]

    def broadcast_bytes(self, src: int, payload: bytes | None) -> bytes:
        if self.names[src] == self.node:
            for other in self._others():
                self._send(other, "broadcast", payload)
            return payload
        return self._take(self.names[src], "broadcast")

    def exchange(self, what: str, record) -> list:
        self._what = what
        return [json.loads(b) for b in self.all_gather_bytes(json.dumps(record).encode())]

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """Every node's tensor, reduced here in rank order (int64 sums are exact: gloo's bits)."""
        array = tensor.detach().cpu().contiguous().numpy()
        parts = [np.frombuffer(blob, dtype=array.dtype).reshape(array.shape)
                 for blob in self.all_gather_bytes(array.tobytes())]
        total = parts[0].copy()
        for part in parts[1:]:
            total = np.maximum(total, part) if op == dist.ReduceOp.MAX else total + part
        return torch.from_numpy(total)

    def post(self, key: str) -> None:
        self._posted[key] += 1
        for other in self._others():
            self._send(other, f"post/{key}", b"")

    def await_posted(self, key: str, count: int, peers: list[int], what: str) -> None:
        """Until `count` posts of `key`, however long, while the relay hears from the peers."""
        self._await(lambda: self._posted[key] >= count, self.names[peers[0]] if len(peers) == 1 else None, what,
                    patient=True)

    def barrier_whenever(self, key: str, what: str) -> None:
        self.post(key)
        self.await_posted(key, self.world, [r for r in range(self.world) if r != self.rank], what)

    def close(self, error: str | None = None) -> None:
        """Tell the relay this node has ended (with `error`, the others stop naming it), after what it queued
        has left; then stop serving."""
        with self._changed:
            self._state, self._error = ("failed", error) if error is not None else ("done", None)
            self._changed.notify_all()
            deadline = time.monotonic() + min(self.timeout, 30.0)
            self._changed.wait_for(lambda: not self._outbox and self._told, max(0.0, deadline - time.monotonic()))
        self._listener.close()
