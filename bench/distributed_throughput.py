"""The engines across processes against the in-process engine: wall time per round for 3 nodes, and bytes per round.

Every engine runs the same federate options (digits at 32x32 split over 3 site-shifted nodes, buffers
of 512 images from a tiny GAN, the CNN, R = 10, E = 1, evaluation at rounds 0 and R only):
- in process: one process with torch's default threads; a round's time is the gap between two
  `after_round` callbacks;
- distributed (`--launch local`): one process per node over loopback gloo, cores / 3 threads each
  (at least 1); a round's time comes from rank 0's log. Start-up (spawning, imports, rendezvous,
  loading data) is reported apart: it is paid once per run, not per round;
- flower (`--launch local`): the same node processes, every payload sealed and relayed by a SuperLink
  over loopback with TLS and node authentication (docs/deploy.md), timed as distributed; its start-up
  includes the SuperLink's and SuperNodes'. Needs FEDCLI_FLOWER_BIN (make test makes .venv-flower);
  without it the column is left out. The goal set for it: at most 1.5x torch.distributed per round.
The median is over rounds 2..R-1 (round 1 includes set-up, round R the evaluation). Bytes per round:
from comm.csv, the bytes each node sends per round (rounds 1..R, cross-evaluation excluded).
Run: FEDCLI_FLOWER_BIN=.venv-flower/bin .venv/bin/python bench/distributed_throughput.py
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd
import torch

from fedcli.data import partition
from fedcli.experiment.config import PartitionConfig
from fedcli.federate import stage
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategies import REGISTRY
from fedcli.generators import stage as gan_stage
from fedcli.generators.config import GanConfig

ROUNDS, STRATEGIES = 10, ("feder", "feder-a", "fedavg")


def in_process_rounds(cfg: FederateConfig) -> list[float]:
    stamps: list[float] = []
    stage.run(cfg, after_round=lambda name, round_: stamps.append(time.perf_counter()))
    return [b - a for a, b in zip(stamps, stamps[1:])][:-1]  # rounds 2..R-1


def node_rounds(cfg: FederateConfig, engine: str) -> tuple[list[float], float]:
    start = time.perf_counter()
    stage.run(dataclasses.replace(cfg, engine=engine, launch="local"))
    wall = time.perf_counter() - start
    log = (cfg.exp / "logs" / "node0.log").read_text()
    pattern = rf"{re.escape(cfg.strategy[0])}: round (\d+) done in ([\d.]+) s"
    times = {int(r): float(t) for r, t in re.findall(pattern, log)}
    return [times[r] for r in range(2, ROUNDS)], wall - sum(times.values())


def bytes_per_round(cfg: FederateConfig) -> float:
    comm = pd.read_csv(cfg.exp / "federate" / cfg.strategy[0] / "comm.csv")
    comm = comm[(comm["round"] >= 1) & (comm.kind != "eval")]
    return comm.bytes.sum() / ROUNDS / 3


def main() -> None:
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        exp = Path(tmp) / "exp"
        partition.run(PartitionConfig(exp=exp, nodes=3), REGISTRY.reserved_names())
        gan_stage.run(GanConfig(exp=exp, iterations=5, pp_iterations=2, fid_every=5, fid_images=16, batch=8,
                                channel_base=64, channel_max=8, buffer_size=512, device="cpu"))
        threads = max(1, (os.cpu_count() or 1) // 3)
        print(f"3 nodes, digits 32x32, buffer 512, CNN, R = {ROUNDS}, E = 1; {os.cpu_count()} cores; in process: "
              f"{torch.get_num_threads()} threads; distributed: 3 processes x {threads} thread(s), gloo over loopback")
        flower = bool(os.environ.get("FEDCLI_FLOWER_BIN"))
        print(f"{'strategy':9} {'in-process s/round':>19} {'distributed s/round':>20} {'ratio':>6} "
              f"{'start-up s':>10} {'KB sent/node/round':>19}" +
              (f" {'flower s/round':>15} {'/ distributed':>13} {'start-up s':>10}" if flower else ""))
        for name in STRATEGIES:
            cfg = FederateConfig(exp=exp, strategy=(name,), rounds=ROUNDS, epochs=1, eval_every=ROUNDS,
                                 device="cpu", bootstrap=100, overwrite=True)
            simulated = statistics.median(in_process_rounds(cfg))
            simulated_bytes = bytes_per_round(cfg)
            rounds, startup = node_rounds(cfg, "distributed")
            distributed = statistics.median(rounds)
            line = (f"{name:9} {simulated:19.3f} {distributed:20.3f} {distributed / simulated:6.2f} {startup:10.1f} "
                    f"{bytes_per_round(cfg) / 1e3:10.1f} (in process {simulated_bytes / 1e3:.1f})")
            if flower:
                relayed, relay_startup = node_rounds(cfg, "flower")
                line += f" {statistics.median(relayed):15.3f} {statistics.median(relayed) / distributed:13.2f} " \
                        f"{relay_startup:10.1f}"
            print(line)


if __name__ == "__main__":
    main()
