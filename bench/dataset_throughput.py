"""Dataset loading throughput: NodeDataset from its cache against a bare tensor-indexing loop.

Both sides produce the same float batches in [-1, 1] from the same uint8 tensor, so the ratio
is the Dataset's own overhead. Also reports the one-off decode that fills the cache.
Run: .venv/bin/python bench/dataset_throughput.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from fedcli.data.dataset import NodeDataset
from fedcli.data.partition import run
from fedcli.experiment.config import PartitionConfig
from fedcli.federate.strategies import REGISTRY

REPEATS = 5


def best_of(fn, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = run(PartitionConfig(exp=Path(tmp) / "exp", nodes=3, image_size=64), REGISTRY.reserved_names())
        start = time.perf_counter()
        ds = NodeDataset(manifest, "node0", "train", cache_dir=Path(tmp) / "cache")
        decode = time.perf_counter() - start
        start = time.perf_counter()
        NodeDataset(manifest, "node0", "train", cache_dir=Path(tmp) / "cache")
        from_disk = time.perf_counter() - start
    images, labels, n = ds.images, ds.labels, len(ds)

    def bare_batches():
        order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
        for s in range(0, n, 64):
            index = order[s:s + 64]
            images[index].float().div_(127.5).sub_(1.0), labels[index]

    def dataset_batches():
        for _ in ds.batches(64, generator=torch.Generator().manual_seed(0)):
            pass

    def bare_items():
        for i in range(n):
            images[i].float().div_(127.5).sub_(1.0), int(labels[i])

    def dataset_items():
        for i in range(n):
            ds[i]

    rows = [("batches of 64", bare_batches, dataset_batches), ("single items", bare_items, dataset_items)]
    print(f"digits node0 train: {n} images of 1x64x64; best of {REPEATS}, 1 thread")
    print(f"first decode into the cache: {decode * 1e3:.0f} ms; reload from the disk cache: {from_disk * 1e3:.0f} ms")
    print(f"{'access':<14} {'bare img/s':>12} {'dataset img/s':>14} {'ratio (time)':>13}")
    for name, bare, dataset in rows:
        t_bare, t_ds = best_of(bare), best_of(dataset)
        print(f"{name:<14} {n / t_bare:>12,.0f} {n / t_ds:>14,.0f} {t_ds / t_bare:>13.2f}")


if __name__ == "__main__":
    main()
