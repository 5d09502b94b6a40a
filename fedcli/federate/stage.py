"""The `federate` stage: run strategies on the partition (and buffers), write their artifacts.

Per strategy, `<exp>/federate/<strategy>/`: metrics.csv (one row per round, model and test set),
bn_statistics.csv (the final round's BatchNorm diagnostic), comm.csv (every transfer with its
measured bytes), models/<key>.safetensors, predictions.safetensors, config.json.
With --fold k / --cv, training uses the other train folds and evaluates on fold k, under
`<exp>/federate/cv/<strategy>/fold<k>/`; the test sets are never touched. A hidden folder next
to the output holds the checkpoints of the last completed rounds until the run finishes; each round's
metrics are also logged as it ends, in `<exp>/logs/federate/events.jsonl` (fedcli/experiment/events.py).
With `--engine distributed` the same runs happen with one process per node (`federate/launch.py`, `federate/node.py`, over `comm/`).
"""

from __future__ import annotations

import shutil

from fedcli.comm import flower_launcher
from fedcli.core.devices import resolve_device, torch_threads
from fedcli.data.manifest import Manifest
from fedcli.data.node_data import NodeImages
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment import events
from fedcli.experiment.artifact_kinds import file_sha256
from fedcli.experiment.locking import locked
from fedcli.experiment.paths import BUFFER, federate_dir, gan_dir
from fedcli.federate import engine, launch, node as worker
from fedcli.federate.checkpoint import Checkpoint
from fedcli.federate.config import FederateConfig
from fedcli.federate.progress import RoundProgress
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategy_runs import (StrategyRun, buffer_user, check_outputs, checkpoint_dir, computed,
                                           load_buffer, own_site, planned_runs, record_round, resolved_runs, run_label,
                                           run_outputs, start_fields, write_output)


def run(cfg: FederateConfig, after_round=None) -> list[StrategyRun]:
    """Every strategy (and fold) of `cfg`: simulated here, or one process per node (distributed)."""
    if cfg.engine != "inprocess":
        if cfg.launch == "local":
            return launch.run(cfg)
        if cfg.engine == "flower":  # a hospital: its SuperNode and bridge beside this node
            with flower_launcher.hospital(cfg) as own:
                return worker.run(own)
        return worker.run(cfg)
    manifest = Manifest.load(cfg.exp)
    runs = planned_runs(cfg, manifest)
    with locked(cfg.exp, run_outputs(cfg, runs), parts=manifest.node_names):
        check_outputs(cfg, runs, manifest.node_names)
        buffers = {node: load_buffer(cfg.exp, manifest, node, cfg.buffer_size, buffer_user(cfg))
                   for node in manifest.node_names} if buffer_user(cfg) else {}
        buffer_info = {node: {"sha256": file_sha256(gan_dir(cfg.exp, node) / BUFFER), "size": len(buffers[node])}
                       for node in buffers}
        images = NodeImages(manifest)
        device = resolve_device(cfg.device)
        resolved = resolved_runs(cfg, manifest, runs, buffer_info)
        with torch_threads(cfg.threads), events.stage_log(cfg.exp, "federate", **start_fields(resolved)):
            return [run_one(cfg, manifest, device, name, fold, buffers, resolved[name, fold], images, after_round)
                    for name, fold in runs]


def run_one(cfg: FederateConfig, manifest: Manifest, device: str, name: str, fold: int | None,
            buffers: dict[str, TensorSource], resolved: dict, images: NodeImages, after_round) -> StrategyRun:
    out = federate_dir(cfg.exp, name, fold)
    fed = engine.build(cfg, manifest, manifest.stage_seed(cfg.seed), name=name, device=device, fold=fold,
                       buffers=buffers, images=images)
    strategy = REGISTRY.build(name, resolved)
    work = checkpoint_dir(out)
    with RoundProgress(run_label(name, fold), cfg.rounds) as progress:
        def on_round(end: engine.RoundEnd) -> None:
            progress.update(end.round)
            record_round(name, fold, cfg.rounds, end)
            if after_round is not None:
                after_round(name, end.round)
        rows, transfers, spent = engine.run_rounds(fed, strategy, cfg.rounds, cfg.eval_every, Checkpoint(work, fed.nodes),
                                            computed(resolved), cfg.resume, on_round)
    states = {key: model.state_dict() for key, model in strategy.models().items()}
    write_output(out, rows, transfers, states, fed.evaluator.own_predictions(strategy.models(), cfg.rounds), resolved,
                 cfg.overwrite or cfg.resume, strategy.kept(), strategy.tables(), spent)
    shutil.rmtree(work, ignore_errors=True)
    return StrategyRun(name, fold, out, own_site(rows), fed.nodes)
