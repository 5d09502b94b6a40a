"""`train-gan --engine distributed`: a serial kind's chain with one process per node over torch.distributed.

Each rank reads only its own node's manifest and images; what it learns of the others comes over the
transport (the chain's model and codes, fedcli/generators/vqvae2/kind.py). Institution k's process waits for k - 1's
training, however long, while k - 1's heartbeat goes on, then trains and sends on; the last returns the final
model and codes to every node, and each rank writes its own node's folder. The ranks check first that they
share one partition and one set of options. `--launch local` starts the ranks on this machine (as federate's
does); under torchrun each process is one node (`--node-name`, default by rank).
"""

from __future__ import annotations

import dataclasses
import sys

from fedcli.comm.distributed_transport import TorchTransport
from fedcli.comm.launcher import spawn
from fedcli.comm.node_process import joined, node_main
from fedcli.comm.rendezvous import claim_nodes
from fedcli.core.devices import torch_threads
from fedcli.core.errors import UserError
from fedcli.data.manifest import Manifest
from fedcli.experiment.config import to_json
from fedcli.experiment.locking import locked
from fedcli.experiment.paths import SERIAL, gan_dir, inside
from fedcli.generators import node_training
from fedcli.generators.config import GanConfig
from fedcli.generators.registry import generator_kind

RANK_LOCAL = node_training.RUN_LOCAL | {"device", "engine", "launch", "timeout", "lpips_weights", "fid_weights"}


def run(cfg: GanConfig, keep_finished: bool = False) -> list[dict]:
    """Every node's summary (--launch local, from the folders its ranks wrote), or this rank's node's."""
    kind = generator_kind(cfg.generator)
    if not getattr(kind, "serial", False):
        raise UserError(f"--engine distributed runs a serial generator's chain (vqvae2); a {kind.name} node trains "
                        "on its own images alone: run fedcli train-gan --node NAME on each node's machine")
    if cfg.sample_only:
        raise UserError(f"--sample-only re-samples per-node generators; a {kind.name} is trained serially with its "
                        "prior: drop --sample-only and re-run with --overwrite")
    node_training.check_options(cfg, kind)
    return launch(cfg, keep_finished) if cfg.launch == "local" else run_rank(cfg)


def launch(cfg: GanConfig, keep_finished: bool) -> list[dict]:
    """One process per node on this machine, under this launcher's locks of every node's folder. `keep_finished`
    (`fedcli run` after an interruption): when every node's folder is this configuration's, they are kept;
    otherwise the chain resumes from its checkpoints and rewrites every folder."""
    manifest = Manifest.load(cfg.exp)
    nodes = manifest.node_names
    with locked(cfg.exp, [gan_dir(cfg.exp, node) for node in nodes]):
        if keep_finished:
            kept = [summary for node in nodes if (summary := node_training.finished(cfg, node)) is not None]
            if len(kept) == len(nodes):
                return kept
            cfg = dataclasses.replace(cfg, overwrite=True)
        node_training.check_nodes_free(cfg, nodes, serial=True)
        ended = spawn(cfg, nodes, "fedcli.generators.distributed")
    if ended.failed:
        resumable = any(inside(cfg.exp, "gan", SERIAL).glob("after-*.safetensors"))
        raise UserError(ended.line(cfg.exp, cfg.timeout, "; the chain is checkpointed after the institutions that "
                                   "finished: rerun the same command to resume it" if resumable else ""))
    return [node_training.written(cfg, node) for node in nodes]


def run_rank(cfg: GanConfig) -> list[dict]:
    """This process's node: its part of the chain, then its folder."""
    with joined(cfg, "train-gan: ") as (group, manifest, _, device):
        claim_nodes(group, manifest, {k: v for k, v in to_json(cfg).items() if k not in RANK_LOCAL}, "train-gan")
        with torch_threads(cfg.threads), locked(cfg.exp, [gan_dir(cfg.exp, manifest.own)]):
            transport = TorchTransport(group, "train-gan", generator_kind(cfg.generator).transfers)
            return node_training.run_nodes(cfg, manifest, [manifest.own], False, transport, device)


if __name__ == "__main__":
    node_main(sys.argv[1:], GanConfig, "train-gan", run)
