"""One torch.distributed process group per federated run: rendezvous, byte transfers, collectives,
and naming the node that went missing.

The rendezvous comes from the environment torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT); `--launch local` sets the same for processes on this machine. Collectives use NCCL
when every rank asks for it (a GPU each), else gloo; payload bytes always go over gloo. The key-value store of
the rendezvous also carries a heartbeat per rank and a counter of the exchanges each rank has
entered. When a transfer or collective fails (a peer died: the connection drops; a peer hangs: the
timeout expires), the rank compares heartbeats and counters to name the node that stopped or fell
behind, publishes that verdict in the store (the first one wins, so every rank reports the same
node), and stops with one line.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import threading
import time

import torch
import torch.distributed as dist

from fedcli.core.errors import UserError

HEARTBEAT_S = 0.5
ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class PeerLost(UserError):
    """A peer stopped or hung; the message names it."""


def hosted_store() -> bool:
    """Whether a launcher (torchrun's agent, or --launch local) hosts the store, not rank 0."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or os.environ.get("FEDCLI_STORE_HOSTED") == "1"


def connect_store(address: str, port: int, timeout: float, is_master: bool) -> dist.Store:
    store = dist.TCPStore(address, port, is_master=is_master, timeout=datetime.timedelta(seconds=timeout),
                          wait_for_workers=False)
    return dist.PrefixStore("fedcli", store)


def published_verdict(store: dist.Store) -> tuple[str, int] | None:
    """The verdict a rank published (`fedcli` keys), as (message, number of missing nodes)."""
    if not store.check(["verdict"]):
        return None
    return parse_verdict(store.get("verdict"))


def parse_verdict(stored: bytes) -> tuple[str, int]:
    count, _, message = stored.decode().partition(" ")  # stored as "<number of missing nodes> <message>"
    return message, int(count)


class Group:
    sealed = None  # bytes sealed per receiver: a relay's only (RelayGroup)

    def __init__(self, timeout: float, backend: str, device: str):
        missing = [name for name in ENV if name not in os.environ]
        if missing:
            raise UserError(f"--engine distributed needs a rendezvous but {', '.join(missing)} is not set: add "
                            "--launch local, or start each node with torchrun (see docs/distributed.md)")
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.address, self.port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        self.timeout = timeout
        self.names = [f"rank {r}" for r in range(self.world)]  # node names once assigned
        self._steps = 0
        self._lost: int | None = None  # how many nodes a failed exchange found missing
        try:
            self.store = connect_store(self.address, self.port, timeout, self.rank == 0 and not hosted_store())
            self.store.set(f"joined/{self.rank}", backend)
            self.store.wait([f"joined/{r}" for r in range(self.world)])
            wanted = {self.store.get(f"joined/{r}").decode() for r in range(self.world)}
            self.backend = "nccl" if wanted == {"nccl"} else "gloo"  # a hospital without a GPU: gloo everywhere
            self.device = torch.device(device if self.backend == "nccl" else "cpu")
            timedelta = datetime.timedelta(seconds=timeout)
            dist.init_process_group(self.backend, store=dist.PrefixStore("pg", self.store), rank=self.rank,
                                    world_size=self.world, timeout=timedelta)
            # payload bytes live on the CPU and go point to point: gloo, whatever the collectives use
            # (NCCL would queue a pair's send before its receive on one stream when N = 2)
            self.bytes_group = dist.new_group(backend="gloo", timeout=timedelta) if self.backend == "nccl" else None
        except RuntimeError as exc:
            raise UserError(f"rank {self.rank} could not join the rendezvous at {self.address}:{self.port} within "
                            f"{timeout:g} s ({self._absent()}); start every node with the same address and port "
                            "(and check the firewall or tunnel)") from exc
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)
        self._beat.start()

    def _absent(self) -> str:
        try:
            absent = [r for r in range(self.world) if not self.store.check([f"joined/{r}"])]
        except RuntimeError:
            return "the store did not answer"
        return f"missing: {', '.join(f'rank {r}' for r in absent)}" if absent else "every rank arrived"

    def _heartbeat(self) -> None:
        """Beat through a store connection of its own (the main one is busy in collectives)."""
        try:
            store = connect_store(self.address, self.port, self.timeout, False)
            while not self._stop.wait(HEARTBEAT_S):
                store.add(f"beat/{self.rank}", 1)
        except RuntimeError:
            return  # the store is gone: the run is ending, and the main thread reports why

    def assign(self, names: list[str]) -> None:
        self.names = list(names)

    def close(self, error: str | None = None) -> None:
        """Leave the group (peers learn of a failure, `error`, from its dropped connections). When rank 0's own process hosts the store (no launcher or torchrun agent
        does), after a failure it keeps the store up until the other surviving ranks have read the
        verdict, so they name the right node; peers blocked on this rank may then wait for their
        timeout, since the failed exchange still holds its connections."""
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.rank == 0 and self._lost is not None and not hosted_store():
            deadline = time.monotonic() + self.timeout
            with contextlib.suppress(RuntimeError):
                while self.store.add("reported", 0) < self.world - self._lost and time.monotonic() < deadline:
                    time.sleep(0.1)
        self._stop.set()
        # its store connection must close before interpreter exit: a beat thread still holding one then
        # aborted a finished node ("terminate called without an active exception", 1 run in ~10)
        self._beat.join(timeout=2 * HEARTBEAT_S)

    # --- failure diagnosis -------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, what: str, peer: int | None = None):
        """One exchange: counted in the store, and any failure inside becomes a PeerLost naming the node."""
        self._steps += 1
        with contextlib.suppress(RuntimeError):
            self.store.add(f"steps/{self.rank}", 1)
        try:
            yield
        except RuntimeError as exc:
            raise self.lost(*self.diagnose(what, peer)) from exc

    def lost(self, message: str, missing: int) -> PeerLost:
        self._lost = missing
        with contextlib.suppress(RuntimeError):
            self.store.add("reported", 1)
        return PeerLost(message)

    def post(self, key: str) -> None:
        """Count a payload posted under `key` in the store, for a receiver that waits for it (`await_posted`)."""
        self.store.add(key, 1)

    def await_posted(self, key: str, count: int, peers: list[int], what: str) -> None:
        """Until `count` posts under `key`, however long that takes while the `peers`' heartbeats go on; a peer
        silent for the timeout, or a verdict another rank published, stops the wait in one line naming the node.
        (A peer alive but hung is waited for: this cannot tell it from a long training.)"""
        beats, since = {}, {peer: time.monotonic() for peer in peers}
        while True:
            try:
                if self.store.add(key, 0) >= count:
                    return
                if (published := published_verdict(self.store)) is not None:
                    raise self.lost(*published)
                now = {peer: self.store.add(f"beat/{peer}", 0) for peer in peers}
            except RuntimeError:  # the store went with its host
                raise self.lost(*self.diagnose(what, peers[0] if len(peers) == 1 else None)) from None
            for peer in peers:
                if now[peer] != beats.get(peer):
                    beats[peer], since[peer] = now[peer], time.monotonic()
            silent = [peer for peer in peers if time.monotonic() - since[peer] > self.timeout]
            if silent:
                raise self.lost(*self._verdict(silent, f"its heartbeat stopped for {self.timeout:g} s", what))
            time.sleep(HEARTBEAT_S)

    def barrier_whenever(self, key: str, what: str) -> None:
        """Every rank reached `key`, however long each takes while it lives (`await_posted` on every peer)."""
        self.post(key)
        self.await_posted(key, self.world, [r for r in range(self.world) if r != self.rank], what)

    def diagnose(self, what: str, peer: int | None) -> tuple[str, int]:
        """Which node stopped, and how many: the published verdict, else silent heartbeats, else ranks
        that never reached this exchange, else the peer of the failed transfer."""
        try:
            if (published := published_verdict(self.store)) is not None:
                return published
            others = [r for r in range(self.world) if r != self.rank]
            before = {r: self.store.add(f"beat/{r}", 0) for r in others}
            time.sleep(3 * HEARTBEAT_S)
            if (published := published_verdict(self.store)) is not None:
                return published
            silent = [r for r in others if self.store.add(f"beat/{r}", 0) == before[r]]
            behind = [r for r in others if self.store.add(f"steps/{r}", 0) < self._steps]
        except RuntimeError:  # the store went with its host
            host = [] if hosted_store() else [0]
            return self._verdict(host or ([peer] if peer is not None else []), "the rendezvous store is unreachable",
                                 what, publish=False)
        if silent:
            return self._verdict(silent, "its process stopped", what)
        if behind:
            return self._verdict(behind, f"it did not reach this exchange within the {self.timeout:g} s timeout", what)
        return self._verdict([peer] if peer is not None else [], "the connection failed", what)

    def _verdict(self, ranks: list[int], reason: str, what: str, publish: bool = True) -> tuple[str, int]:
        who = ", ".join(self.names[r] if self.names[r] == f"rank {r}" else f"{self.names[r]} (rank {r})"
                        for r in ranks) or "a peer"
        message = f"lost {who} during {what}: {reason}"
        if publish:
            with contextlib.suppress(RuntimeError):
                return parse_verdict(self.store.compare_set("verdict", "", f"{len(ranks)} {message}"))
        return message, len(ranks)

    # --- transfers and collectives ---------------------------------------------------------------
    def send_bytes(self, dst: int, tag: int, payload: bytes) -> list:
        """Non-blocking send of a length, then the bytes; returns the works (they hold the tensors)."""
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        size = torch.tensor([len(payload)], dtype=torch.int64)
        group = self.bytes_group
        return [(dist.isend(size, dst, group=group, tag=2 * tag), size),
                (dist.isend(data, dst, group=group, tag=2 * tag + 1), data)]

    def wait(self, works: list) -> None:
        for work, _ in works:
            work.wait(timeout=datetime.timedelta(seconds=self.timeout))

    def recv_bytes(self, src: int, tag: int) -> bytes:
        size = torch.zeros(1, dtype=torch.int64)
        self.wait([(dist.irecv(size, src, group=self.bytes_group, tag=2 * tag), size)])
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        self.wait([(dist.irecv(data, src, group=self.bytes_group, tag=2 * tag + 1), data)])
        return data.numpy().tobytes()

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's bytes, in rank order (lengths first, then padded to the longest)."""
        size = torch.tensor([len(payload)], dtype=torch.int64)
        sizes = [torch.zeros_like(size) for _ in range(self.world)]
        dist.all_gather(sizes, size, group=self.bytes_group)
        longest = max(int(s.item()) for s in sizes)
        data = torch.zeros(longest, dtype=torch.uint8)
        data[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        out = [torch.empty_like(data) for _ in range(self.world)]
        dist.all_gather(out, data, group=self.bytes_group)
        return [o[:int(s.item())].numpy().tobytes() for o, s in zip(out, sizes)]

    def broadcast_bytes(self, src: int, payload: bytes | None) -> bytes:
        """Rank `src`'s bytes (given there, None elsewhere) on every rank."""
        size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
        dist.broadcast(size, src, group=self.bytes_group)
        data = (torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload is not None
                else torch.empty(int(size.item()), dtype=torch.uint8))
        dist.broadcast(data, src, group=self.bytes_group)
        return data.numpy().tobytes()

    def exchange(self, what: str, record) -> list:
        """Every rank's JSON-able record, in rank order; also a barrier."""
        with self.step(what):
            return [json.loads(b) for b in self.all_gather_bytes(json.dumps(record).encode())]

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        on_device = tensor.to(self.device)
        dist.all_reduce(on_device, op=op)
        return on_device.cpu()
