"""One node's process of a distributed federate run (started by torchrun or by `--launch local`).

It reads only its own node's manifest, images and buffer; everything it learns about the other
nodes arrives through the transport (their payloads) or as counts and hashes. Before training, the
ranks check that they share one partition and one set of options. At the end, rank 0 writes the
strategy folder (metrics and comm of every node, and the models it can see: all of them when the
ranks share a file system, as with --launch local); a rank on a machine of its own writes its own
copy with its own models. Each rank logs to `<exp>/logs/<node>.log`; the ranks that write the strategy
folder also write the stage's events, one line per round with every node's metrics (fedcli/experiment/events.py).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import sys
import time
from pathlib import Path

from fedcli.comm.distributed_transport import TorchTransport
from fedcli.comm.group import Group
from fedcli.comm.node_process import joined, node_main
from fedcli.comm.rendezvous import claim_nodes
from fedcli.core.devices import torch_threads
from fedcli.data.node_data import NodeImages
from fedcli.data.node_manifest import NodeManifest
from fedcli.experiment import events
from fedcli.experiment.artifact_kinds import file_sha256
from fedcli.experiment.artifacts import load_tensors, save_tensors
from fedcli.experiment.config import to_json
from fedcli.experiment.locking import locked
from fedcli.experiment.paths import BUFFER, PREDICTIONS, federate_dir, gan_dir
from fedcli.federate import engine
from fedcli.federate.checkpoint import Checkpoint
from fedcli.federate.config import FederateConfig
from fedcli.federate.progress import RoundProgress
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategy_runs import (SHARED, StrategyRun, buffer_user, check_outputs, checkpoint_dir, computed,
                                           load_buffer, own_site, planned_runs, record_round, resolved_runs, run_label,
                                           run_outputs, start_fields, write_output)

FINAL = "final"  # a rank's final models, inside its checkpoint part, for rank 0 to collect


def run(cfg: FederateConfig) -> list[StrategyRun]:
    """This process's node of every strategy (and fold); rank 0 returns the runs, others []."""
    with joined(cfg) as (group, manifest, log, device), torch_threads(cfg.threads):
        return Rank(cfg, group, manifest, device, log).run_all()


class Rank:
    def __init__(self, cfg: FederateConfig, group: Group, manifest: NodeManifest, device: str,
                 log: logging.Logger):
        self.cfg, self.group, self.manifest, self.device, self.log = cfg, group, manifest, device, log
        self.node = manifest.own
        self.assign_nodes()
        self.runs = planned_runs(cfg, manifest)
        user = buffer_user(cfg)
        self.buffers = {self.node: load_buffer(cfg.exp, manifest, self.node, cfg.buffer_size, user)} if user else {}
        own = {"sha256": file_sha256(gan_dir(cfg.exp, self.node) / BUFFER), "size": len(self.buffers[self.node])} \
            if user else None
        infos = self.group.exchange("sharing buffer hashes", own)
        buffer_info = {n: i for n, i in zip(group.names, infos) if i is not None}
        self.resolved = resolved_runs(cfg, manifest, self.runs, buffer_info)
        self.shared_disk = self.same_file_system()
        self.images = NodeImages(manifest)  # decoded once for every strategy and fold

    def assign_nodes(self) -> None:
        """Rank -> node, and one partition and one set of options across every rank."""
        # may differ between ranks: where things lie, the hardware, how patient, what to overwrite
        local = ("exp", "device", "model_weights", "threads", "timeout", "node", "bundle", "launch", "overwrite")
        claim_nodes(self.group, self.manifest, {k: v for k, v in to_json(self.cfg).items() if k not in local},
                    "federate")

    def same_file_system(self) -> bool:
        """Whether this rank sees rank 0's files (then rank 0 writes the one strategy folder)."""
        token = self.group.exchange("the file-system check", secrets.token_hex(8) if self.group.rank == 0 else None)[0]
        marker = Path(self.cfg.exp) / "logs" / f".rendezvous-{token}"
        if self.group.rank == 0:
            marker.touch()
        self.group.exchange("the file-system check", True)
        shared = marker.exists()
        self.group.exchange("the file-system check", True)
        if self.group.rank == 0:
            marker.unlink()
        return shared

    def run_all(self) -> list[StrategyRun]:
        """Under this node's locks: its launcher's (`--launch local`), or its own (started by hand)."""
        with locked(self.cfg.exp, run_outputs(self.cfg, self.runs), parts=[self.node]):
            check_outputs(self.cfg, self.runs, self.manifest.node_names, local=[self.node])
            with (events.stage_log(self.cfg.exp, "federate", **start_fields(self.resolved)) if self.writes_results
                  else contextlib.nullcontext()):
                runs = [self.run_one(name, fold) for name, fold in self.runs]
        return runs if self.group.rank == 0 else []

    @property
    def writes_results(self) -> bool:
        """Rank 0, and a rank on a machine of its own, write the strategy folders and the stage's events."""
        return self.group.rank == 0 or not self.shared_disk

    def run_one(self, name: str, fold: int | None) -> StrategyRun:
        cfg, node = self.cfg, self.node
        out = federate_dir(cfg.exp, name, fold)
        transport = TorchTransport(self.group, run_label(name, fold), REGISTRY.transfer_kinds())
        fed = engine.build(cfg, self.manifest, self.manifest.stage_seed(cfg.seed), name=name, device=self.device,
                           fold=fold, buffers=self.buffers, images=self.images, transport=transport,
                           local_nodes=[node], cross_eval=cfg.cross_eval)
        resolved = self.resolved[name, fold]
        strategy = REGISTRY.build(name, resolved)
        work = checkpoint_dir(out)
        self.log.info("%s: start (resume=%s)", run_label(name, fold), cfg.resume)
        started = time.perf_counter()
        with self.progress(name, fold) as on_round:
            rows, transfers, spent = engine.run_rounds(fed, strategy, cfg.rounds, cfg.eval_every,
                                                Checkpoint(work, fed.nodes, local=[node]), computed(resolved),
                                                cfg.resume, on_round)
        sent = sum(t.bytes for t in transfers if t.sender == node)
        self.log.info("%s: done in %.2f s, %d bytes sent", run_label(name, fold), time.perf_counter() - started, sent)
        final = work / node / FINAL
        for key, model in strategy.models().items():
            save_tensors(final / "models" / f"{key}.safetensors",
                         {k: v.detach().cpu() for k, v in model.state_dict().items()})
        save_tensors(final / PREDICTIONS, fed.evaluator.own_predictions(strategy.models(), cfg.rounds))
        for kept, tensors in strategy.kept().items():
            save_tensors(final / SHARED / f"{kept}.safetensors", tensors)
        self.group.exchange(f"{run_label(name, fold)}: writing the results", True)  # final models are on disk
        if self.writes_results:
            folders = sorted(work.glob(f"*/{FINAL}")) if self.group.rank == 0 else [final]
            states = {p.stem: load_tensors(p, "final model") for f in folders
                      for p in sorted((f / "models").glob("*.safetensors"))}
            predictions = {k: v for f in folders for k, v in load_tensors(f / PREDICTIONS, "predictions").items()}
            shared: dict[str, dict] = {}
            for f in folders:
                for p in sorted((f / SHARED).glob("*.safetensors")):
                    shared.setdefault(p.stem, {}).update(load_tensors(p, "shared sample"))
            write_output(out, rows, transfers, states, predictions, resolved, cfg.overwrite or cfg.resume, shared,
                         strategy.tables(), spent)
            shutil.rmtree(work if self.group.rank == 0 else work / node, ignore_errors=True)
        return StrategyRun(name, fold, out, own_site(rows), fed.nodes)

    @contextlib.contextmanager
    def progress(self, name: str, fold: int | None):
        """Rank 0 draws the round bar; every rank logs each round's time; the ranks that write results log
        each round's events (every node's metrics, gathered at the round's end)."""
        label = run_label(name, fold)
        bar = RoundProgress(label, self.cfg.rounds) if self.group.rank == 0 else contextlib.nullcontext()
        last = [time.perf_counter()]

        def update(end: engine.RoundEnd) -> None:
            now = time.perf_counter()
            self.log.info("%s: round %d done in %.3f s", label, end.round, now - last[0])
            last[0] = now
            record_round(name, fold, self.cfg.rounds, end)
            if self.group.rank == 0:
                bar.update(end.round)

        with bar:
            yield update


if __name__ == "__main__":
    node_main(sys.argv[1:], FederateConfig, "federate", run)
