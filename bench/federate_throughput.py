"""Federation cost: fedcli's FedER engine against a bare PyTorch loop, and bytes per node per round.

1. Wall time of `federate --strategy feder` at the quick defaults (R = 10, E = 1; in process; evaluated
   at round 0 and the last round, as `--eval-every 10` does) against
   a bare loop doing the identical optimiser steps (same models, same b real + b buffer batches,
   same number of steps) on the same tensors, without serialization, validation, PNG coding,
   checkpoints or evaluation. The digits file is read before both timings; fedcli's time still
   includes decoding the nodes' images. Ratio = fedcli / bare; target <= 1.10. The bare loop also
   runs in contiguous (NCHW) layout: channels-last / NCHW is what fedcli's training layout saves.
2. Bytes each node sends per round at the study's scale (256x256, buffer 512, ResNet-18), from the
   real payload encoders: FedAvg (model up + global model down), FedER (model + buffer), FedER-A
   (buffer). Buffers as PNG (lossless) and raw; the PNG size depends on the images, so real
   PneumoniaMNIST X-rays upsampled to 256x256 stand in for synthetic ones.
Run: .venv/bin/python bench/federate_throughput.py
"""

from __future__ import annotations

import math
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedcli.comm.payloads import encode_buffer, encode_model
from fedcli.data import partition
from fedcli.data.dataset import to_float
from fedcli.data.loading import digit_images
from fedcli.experiment.config import PartitionConfig
from fedcli.federate import engine, stage
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategy_runs import load_buffer
from fedcli.generators import stage as gan_stage
from fedcli.generators.config import GanConfig
from fedcli.models.classifier import build_classifier

SHARED_NPZ = Path(__file__).resolve().parents[2] / "shared" / "data" / "medmnist" / "pneumoniamnist.npz"


def bare_feder(fed_inputs, rounds: int, epochs: int, batch: int, lr: float,
               layout: torch.memory_format = torch.channels_last) -> None:
    """The same optimiser steps FedER takes, on plain tensors, with weights and batches in `layout`."""
    reals, buffers = fed_inputs
    nodes = list(reals)
    models = {n: build_classifier("cnn", 1, 10, init_seed=i).to(memory_format=layout) for i, n in enumerate(nodes)}

    def train(model, real, replay, n_epochs):
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        model.train()
        x_real, y_real = real
        steps = math.ceil(len(y_real) / batch)
        for _ in range(n_epochs):
            order = torch.randperm(len(y_real))
            for s in range(steps):
                index = order[s * batch:(s + 1) * batch]
                x, y = to_float(x_real[index]), y_real[index]
                if replay is not None:
                    r = torch.randint(0, len(replay[1]), (len(index),))
                    x, y = torch.cat([x, to_float(replay[0][r])]), torch.cat([y, replay[1][r]])
                logits = model(x.contiguous(memory_format=layout))
                n = len(index)
                loss = F.cross_entropy(logits[:n], y[:n])
                if replay is not None:
                    loss = 0.5 * loss + 0.5 * F.cross_entropy(logits[n:], y[n:])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()

    for n in nodes:
        train(models[n], reals[n], None, epochs)
    for r in range(rounds):
        successor = {n: nodes[(i + 1 + r) % len(nodes)] for i, n in enumerate(nodes)}
        received = {successor[n]: (models[n], buffers[n]) for n in nodes}
        for n in nodes:
            model, buffer = received[n]
            train(model, reals[n], buffer, epochs)
        models = {n: received[n][0] for n in nodes}


def bench_engine(rounds: int = 10, epochs: int = 1) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        exp = Path(tmp) / "exp"
        manifest = partition.run(PartitionConfig(exp=exp, nodes=3), REGISTRY.reserved_names())
        gan_stage.run(GanConfig(exp=exp, iterations=5, pp_iterations=2, fid_every=5, fid_images=16, batch=8,
                                channel_base=64, channel_max=8, buffer_size=512, device="cpu"))
        cfg = FederateConfig(exp=exp, strategy=("feder",), rounds=rounds, epochs=epochs, eval_every=rounds,
                             device="cpu", overwrite=True)
        digit_images()  # the raw file read and import both sides need, outside both timings
        start = time.perf_counter()
        stage.run(cfg)
        t_fedcli = time.perf_counter() - start
        train = engine.build(cfg, manifest, 0).data.train
        reals = {n: (train[n].images, train[n].labels) for n in manifest.node_names}
        buffers = {}
        for n in manifest.node_names:
            b = load_buffer(exp, manifest, n, None, "feder")
            buffers[n] = (b.images, b.labels)
        t_bare, t_nchw = (timed(lambda: bare_feder((reals, buffers), rounds, epochs, 32, 1e-3, layout))
                          for layout in (torch.channels_last, torch.contiguous_format))
    print(f"feder, 3 digits nodes, {rounds} rounds x {epochs} epoch, cnn, batch 32+32, 2 threads:")
    print(f"  bare loop {t_bare:.2f} s, fedcli federate {t_fedcli:.2f} s, ratio {t_fedcli / t_bare:.2f}")
    print(f"  layout: bare loop channels-last (fedcli's) {t_bare:.2f} s, contiguous NCHW {t_nchw:.2f} s, "
          f"ratio {t_bare / t_nchw:.2f}")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def xray_stand_ins(n: int, size: int, channels: int) -> torch.Tensor:
    if SHARED_NPZ.is_file():
        images = np.load(SHARED_NPZ)["train_images"][:n]
    else:
        from sklearn.datasets import load_digits
        images = (load_digits().images[:n] * 16).astype(np.uint8)
    x = torch.from_numpy(images).float().unsqueeze(1)
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).round().clamp(0, 255)
    return x.to(torch.uint8).expand(-1, channels, -1, -1).contiguous()


def bench_bytes() -> None:
    mb = 1e6
    print("bytes a node sends per round, ResNet-18, 256x256, buffer 512 (MB = 1e6 bytes):")
    for channels, label in ((1, "grayscale"), (3, "RGB")):
        model = len(encode_model(build_classifier("resnet18", channels, 2, init_seed=0).state_dict()))
        images = xray_stand_ins(512, 256, channels)
        labels = torch.arange(512) % 2
        png = len(encode_buffer(images, labels, "png"))
        raw = len(encode_buffer(images, labels, "raw"))
        print(f"  {label:9}: model {model / mb:5.1f}; buffer png {png / mb:5.1f} (raw {raw / mb:5.1f})")
        print(f"             fedavg {2 * model / mb:5.1f} (up {model / mb:.1f} + down {model / mb:.1f}), "
              f"feder {(model + png) / mb:5.1f}, feder-a {png / mb:5.1f}")
    print("  study: FedAvg 45 MB, FedER 65 MB grayscale / 105 MB RGB, FedER-A 20 MB / 60 MB")


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    bench_engine()
    bench_bytes()


if __name__ == "__main__":
    main()
