"""`federate --launch local`: the federate stage's nodes started on this machine (fedcli/comm/launcher.py),
after the launcher has checked what it can before starting anything, under its locks."""

from __future__ import annotations

import pandas as pd

from fedcli.comm import flower_launcher, launcher
from fedcli.comm.node_process import MISMATCH_EXIT
from fedcli.core.errors import UserError
from fedcli.data.manifest import Manifest
from fedcli.experiment.locking import locked
from fedcli.experiment.paths import federate_dir
from fedcli.federate.checkpoint import Checkpoint, CheckpointMismatch
from fedcli.federate.config import FederateConfig
from fedcli.federate.strategy_runs import (StrategyRun, buffer_user, check_outputs, checkpoint_dir, load_buffer,
                                           planned_runs, run_outputs)


def run(cfg: FederateConfig) -> list[StrategyRun]:
    """The nodes run under the launcher's locks: they accept locks held under its token."""
    manifest = Manifest.load(cfg.exp)
    runs = planned_runs(cfg, manifest)
    with locked(cfg.exp, run_outputs(cfg, runs), parts=manifest.node_names):
        check_outputs(cfg, runs, manifest.node_names)
        return start_nodes(cfg, manifest, runs)


def start_nodes(cfg: FederateConfig, manifest: Manifest, runs: list[tuple[str, int | None]]) -> list[StrategyRun]:
    if buffer_user(cfg):
        for node in manifest.node_names:
            load_buffer(cfg.exp, manifest, node, cfg.buffer_size, buffer_user(cfg))
    nodes = manifest.node_names
    ended = (flower_launcher if cfg.engine == "flower" else launcher).spawn(cfg, nodes, "fedcli.federate.node")
    if ended.failed:
        resumable = MISMATCH_EXIT not in ended.failed.values() and any(  # a round every node's part on disk holds
            Checkpoint(checkpoint_dir(federate_dir(cfg.exp, name, fold)), []).rounds() for name, fold in runs)
        line = ended.line(cfg.exp, cfg.timeout,
                          "; the last completed round is checkpointed: rerun with --resume" if resumable else "")
        raise CheckpointMismatch(line) if MISMATCH_EXIT in ended.failed.values() else UserError(line)
    return [StrategyRun(name, fold, federate_dir(cfg.exp, name, fold),
                        pd.read_csv(federate_dir(cfg.exp, name, fold) / "metrics.csv").to_dict("records"), nodes)
            for name, fold in runs]
