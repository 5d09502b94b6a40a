"""The generative-replay study's federations: what SplitNN's per-batch exchange costs, and the bytes per epoch of
every strategy of issue 32 against FedAvg's.

1. SplitNN's exchange: one node's E epochs of split training (training/split.py) with the activations and
   gradients serialized, sent, validated and deserialized through the in-process transport every batch, against
   the same network trained whole by the local loop on the same batches (the same optimiser steps), and against
   split training whose node is the server (the same two optimisers, no serialization). Ratio = split / whole.
   The small CNN and ResNet-18 at 32 px, batch 32, cut at the stem; one thread; best of 3.
2. Bytes per epoch: each strategy runs init-epochs 0, 2 rounds of E = 1 on four 32 px digits nodes (cnn, batch
   32, a 5% shared set); its round-0 bytes (one-off: FedReplay's latents, FedAvg+Share's shared set) and its
   round-2 bytes (per round, so per epoch at E = 1) from comm.csv's records, training traffic only, against
   FedAvg's round-2 bytes.
Run: .venv/bin/python bench/split_exchange.py
"""

from __future__ import annotations

import copy
import tempfile
import time
from pathlib import Path

import torch

from fedcli.comm.transport import InProcessTransport
from fedcli.data import partition
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.config import PartitionConfig
from fedcli.federate import engine
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies import EVAL, REGISTRY
from fedcli.models.classifier import build_classifier
from fedcli.models.cuts import cut_shape, split
from fedcli.training.local import Batches, LocalSettings, batch_bounds, train_local
from fedcli.training.split import Link, train_split

REPEATS = 3
STRATEGIES = ("fedavg", "cwt", "splitnn", "fedreplay", "fedavg-share")


def best_of(fn) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def exchange_cost(architecture: str) -> None:
    generator = torch.Generator().manual_seed(0)
    source = TensorSource(torch.randint(0, 256, (640, 1, 32, 32), dtype=torch.uint8, generator=generator),
                          torch.randint(0, 2, (640,), generator=generator))
    settings = LocalSettings(epochs=1, lr=1e-3, batch=32)
    model = build_classifier(architecture, 1, 2, init_seed=0)
    steps = len(batch_bounds(len(source), settings.batch))

    def batches():
        return Batches(source, None, settings, torch.Generator().manual_seed(1))

    def whole():
        train_local(copy.deepcopy(model), batches(), settings)

    def split_run(server: str):
        transport = InProcessTransport(REGISTRY.transfer_kinds())
        bottom, top = split(copy.deepcopy(model), architecture, "stem")
        link = Link(transport, 1, "node", server, cut_shape(bottom, (1, 32, 32)), 2)
        train_split(bottom, top, batches(), steps, settings, link)
        return transport

    t_whole = best_of(whole)
    t_local = best_of(lambda: split_run("node"))
    t_remote = best_of(lambda: split_run("server"))
    sent = sum(t.bytes for t in split_run("server").transfers)
    print(f"{architecture:9s} {steps} steps: whole {t_whole:.3f} s, split in memory {t_local:.3f} s "
          f"({t_local / t_whole:.2f}x), split through the transport {t_remote:.3f} s ({t_remote / t_whole:.2f}x), "
          f"{sent / 1e6:.1f} MB exchanged ({sent / steps / 1e3:.0f} kB a step)")


def bytes_per_epoch() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        exp = Path(tmp) / "exp"
        manifest = partition.run(PartitionConfig(exp=exp, nodes=4, image_size=32, shared_fraction=0.05),
                                 REGISTRY.reserved_names())
        cfg = FederateConfig(exp=exp, model=("cnn",), epochs=1, init_epochs=0, batch=32, rounds=2, bootstrap=20)
        measured = {}
        for name in STRATEGIES:
            fed = engine.build(cfg, manifest, 0)
            strategy = REGISTRY.build(name, {})
            strategy.setup(fed)
            for round_ in (1, 2):
                strategy.run_round(fed, round_)
            sent = [t for t in fed.transport.transfers if t.kind != EVAL]
            measured[name] = (sum(t.bytes for t in sent if t.round == 0), sum(t.bytes for t in sent if t.round == 2))
    fedavg = measured["fedavg"][1]
    print("\nbytes per epoch (four 32 px digits nodes, cnn, batch 32, E = 1; training traffic, every node's sends):")
    for name, (once, per_epoch) in measured.items():
        print(f"{name:13s} once (round 0) {once / 1e6:8.2f} MB   per epoch {per_epoch / 1e6:8.2f} MB   "
              f"{per_epoch / fedavg:6.2f}x FedAvg's")


def main() -> None:
    torch.set_num_threads(1)
    print("SplitNN's per-batch exchange, one node's epoch of 640 images (best of 3):")
    for architecture in ("cnn", "resnet18"):
        exchange_cost(architecture)
    bytes_per_epoch()


if __name__ == "__main__":
    main()
