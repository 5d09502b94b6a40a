"""What both engines do around a federate run: plan the (strategy, fold) runs and check their outputs,
load the buffers, resolve and record a run's options, log each round's events, and write a strategy's folder."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch

from fedcli.comm.transport import Transfer
from fedcli.core import console
from fedcli.core.errors import UserError
from fedcli.data.label_parts import hides_labels, labels_at_server, unlabelled_nodes
from fedcli.data.manifest import Manifest
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment import events
from fedcli.experiment.artifact_kinds import file_sha256, record_files
from fedcli.experiment.artifacts import (check_output_free, check_writable, json_sha256, provenance, save_tensors,
                                         staged_output, write_csv, write_json)
from fedcli.experiment.config import architectures, settled
from fedcli.experiment.names import check_not_reserved
from fedcli.experiment.paths import BUFFER, CODES, PREDICTIONS, federate_dir, gan_dir
from fedcli.federate.checkpoint import Checkpoint
from fedcli.federate.config import (ENGINE_OPTIONS, FederateConfig, inapplicable, resolved_options,
                                    without_strategy_options)
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.base import GLOBAL_TEST
from fedcli.federate.strategies.peer_learning import GATED, VALIDATED
from fedcli.generators.buffer import load_buffer_file
from fedcli.generators.record import read_gan_config
from fedcli.models import user_models
from fedcli.models.cuts import check_cut
from fedcli.training.batchnorm_check import DIAGNOSTIC, COLUMNS as BN_COLUMNS

if TYPE_CHECKING:
    from fedcli.federate.engine import RoundEnd


@dataclasses.dataclass
class StrategyRun:
    strategy: str
    fold: int | None
    out: Path
    rows: list[dict]
    nodes: list[str]


def own_site(rows: list[dict]) -> list[dict]:
    """The rows of the nodes' own test sets (metrics.csv's), the global test set's (global_test.csv's) aside."""
    return [row for row in rows if row["test_node"] != GLOBAL_TEST]


def load_buffer(exp: Path, manifest: Manifest, node: str, size: int | None, strategy: str) -> TensorSource:
    """The first `size` images of a node's buffer, after the checks of its artifact kind (its recorded
    hash, node and partition; image shape; one label per image, each a class of the node)."""
    folder = gan_dir(exp, node)
    if not (folder / BUFFER).is_file():
        raise UserError(f"strategy {strategy} needs node {node}'s synthetic buffer ({folder / BUFFER} is missing); "
                        f"run fedcli train-gan --exp {exp} first")
    saved = read_gan_config(exp, manifest, node)
    images, labels = load_buffer_file(folder, node, manifest, saved)
    size = len(labels) if size is None else size
    if size > len(labels):
        raise UserError(f"--buffer-size {size} exceeds node {node}'s buffer of {len(labels)} images; run "
                        f"fedcli train-gan --sample-only --buffer-size {size}")
    return TensorSource(images[:size].clone(), labels[:size].clone())


def buffer_user(cfg: FederateConfig) -> str | None:
    """The first strategy that reads the buffers, if any does (a replay of codes reads codes instead)."""
    return next((s for s in cfg.strategy if REGISTRY[s].needs_buffers and cfg.buffer_size != 0
                 and getattr(cfg.options_of(s), "replay_source", None) != "codes"), None)


def check_node_names(exp: Path, manifest: Manifest) -> None:
    """A partition made before node names were checked against the model keys is refused, not misread."""
    check_not_reserved(manifest.node_names, REGISTRY.reserved_names(), f"{exp}/partition",
                       "rename that site in the data and re-run fedcli partition --overwrite")


def planned_runs(cfg: FederateConfig, manifest: Manifest) -> list[tuple[str, int | None]]:
    """(strategy, fold) pairs, after the option checks every engine makes before training anything."""
    check_node_names(cfg.exp, manifest)
    if cfg.fold is not None and not 0 <= cfg.fold < manifest["folds"]:
        raise UserError(f"--fold {cfg.fold} is not a fold of this partition (0..{manifest['folds'] - 1})")
    folds = list(range(manifest["folds"])) if cfg.cv else [cfg.fold]
    check_against_partition(cfg, manifest)
    return [(name, fold) for name in cfg.strategy for fold in folds]


WITHOUT_LABELS = ("standalone", "fedavg", "fedprox", "fedmatch", "fedperl")  # FedPerl's family, scenarios 2 and 4


def check_against_partition(cfg: FederateConfig, manifest: Manifest) -> None:
    """What each strategy needs of the partition and the model: a shared set where it reads one, node options
    (a server's or an encoder's rank) naming one of the partition's nodes, a cut the model has, a user's model
    factory that imports."""
    nodes = manifest.node_names
    every_node, own = architectures(cfg.model)
    for architecture in {every_node, *own.values()}:
        if user_models.is_user_model(architecture):
            user_models.factory(architecture)  # a factory that cannot be imported is refused before any node trains
    labels = manifest.data.get("labels")
    unlabelled = unlabelled_nodes(labels, nodes)
    refused = [name for name in cfg.strategy if name not in WITHOUT_LABELS]
    if unlabelled and refused:
        raise UserError(f"node {unlabelled[0]} holds no labelled image (partition --labeled-nodes), and {refused[0]} "
                        f"trains on visible labels at every node; on FedPerl's scenarios 2 and 4 run "
                        f"{', '.join(WITHOUT_LABELS)}, or partition with every node labelled (--labeled-fraction)")
    if cfg.ssl == "none" and "standalone" in cfg.strategy and labels_at_server(labels):
        raise UserError("standalone without --ssl has no labelled image to train on at any node (every label is held "
                        "apart); add --ssl fixmatch, or run fedavg, whose server trains on the held-apart set")
    hides = hides_labels(labels, nodes)
    if cfg.ssl != "none" and not hides:
        raise UserError(f"--ssl {cfg.ssl} learns from unlabelled images, and this partition labels every training "
                        "image; re-run fedcli partition --overwrite with --labeled-fraction F")
    if cfg.labels == "all" and not hides:
        raise UserError("--labels all gives the unlabelled images their hidden labels, and this partition hides none; "
                        "drop --labels all (every label is already visible)")
    if labels and (cfg.cv or cfg.fold is not None):
        raise UserError("--fold/--cv select by folds drawn before the labels were hidden, so a fold of a node's few "
                        "labelled images can miss a class; select without folds on a few-labels partition")
    holder = ((labels or {}).get("held_apart") or {}).get("holder")
    for name in cfg.strategy:
        if REGISTRY[name].needs_shared_set and not manifest.data.get("shared_fraction"):
            raise UserError(f"{name} trains on a globally shared set, which this partition has none of; re-run "
                            "fedcli partition --overwrite with --shared-fraction F (the study's 0.05)")
        options = cfg.options_of(name)
        if getattr(options, "replay_source", None) == "codes" and (cfg.cv or cfg.fold is not None):
            raise UserError(f"{name} replays the codes of every training image, the validation fold's too, so a fold "
                            "would score reconstructions of its own images; select without --fold/--cv, or pass "
                            "--replay-source buffers")
        if getattr(options, "policy", None) in VALIDATED and not manifest.data.get("labels", {}).get("held_apart"):
            raise UserError(f"{name} --policy {options.policy} scores peers on the held-apart set, which this partition "
                            "has none of; re-run fedcli partition --overwrite with --held-apart-fraction F")
        if getattr(options, "policy", None) in VALIDATED and getattr(options, "anonymize", False) \
                and options.server_node not in (None, holder):
            raise UserError(f"{name} --anonymize --policy {options.policy}: the server validates the peers on the "
                            f"held-apart set, which {holder} holds, not --server-node {options.server_node}; drop "
                            f"--server-node or name {holder}")
        if getattr(options, "peers", 0) > len(nodes) - 1:  # else each node would learn from fewer than recorded
            default = "" if cfg.peers is not None else " (its default)"
            raise UserError(f"{name} --peers {options.peers}{default}: with {len(nodes)} nodes each node has "
                            f"{len(nodes) - 1} other{'s' if len(nodes) > 2 else ''} to learn from; pass --peers {len(nodes) - 1} or fewer")
        if getattr(options, "policy_threshold", None) is not None and options.policy not in GATED:
            raise UserError(f"--policy-threshold applies to the gated policies ({', '.join(GATED)}), not to "
                            f"--policy {options.policy}; drop it or choose a gated policy")
        if hasattr(options, "cut"):
            check_cut(architectures(cfg.model)[0], options.cut)
        for field in REGISTRY[name].option_fields():
            given = getattr(cfg, field.name)
            if field.metadata.get("node") and given is not None and given not in nodes:
                raise UserError(f"--{field.name.replace('_', '-')} {given} is not a node; nodes: {', '.join(nodes)}")


def run_outputs(cfg: FederateConfig, runs: list[tuple[str, int | None]]) -> list[Path]:
    return [federate_dir(cfg.exp, name, fold) for name, fold in runs]


def check_outputs(cfg: FederateConfig, runs: list[tuple[str, int | None]], nodes: list[str],
                  local: list[str] | None = None) -> None:
    """Before training, with the outputs locked: each can be written, and neither a finished output nor
    the checkpoint of an interrupted run is replaced unless asked (`local`: the nodes whose checkpoint
    parts this process holds; None: every node)."""
    for out in run_outputs(cfg, runs):
        check_writable(out.parent)
        checkpoint = Checkpoint(checkpoint_dir(out), nodes, local)
        if cfg.resume:
            if checkpoint.resume_point() is None:
                check_output_free(out, cfg.overwrite)
            continue
        held = checkpoint.rounds()
        if held and not cfg.overwrite:
            raise UserError(f"{out} was interrupted after round {max(held)} (checkpoint in {checkpoint.folder}); "
                            f"pass --resume to continue from round {max(held)}, or --overwrite to start over")
        if held:
            console.out.print(f"note: --overwrite: discarding the checkpoint of round {max(held)} in "
                              f"{checkpoint.folder}", markup=False, soft_wrap=True)
        check_output_free(out, cfg.overwrite)


def strategy_config(cfg: FederateConfig, manifest: Manifest, name: str, fold: int | None,
                    buffer_info: dict[str, dict]) -> dict:
    """The resolved options of one run, as config.json records them: the shared ones and those the strategy
    declares (given, or its defaults). `buffer_info`: every node's buffer hash and size, when buffers are used."""
    inputs = {"manifest": manifest.content_hash}
    options = resolved_options(cfg, name)
    if options.get("replay_source") == "codes":  # federate/strategies/code_replay.py: every code unless sized
        inputs |= {f"codes:{n}": file_sha256(gan_dir(cfg.exp, n) / CODES) for n in manifest.node_names
                   if (gan_dir(cfg.exp, n) / CODES).is_file()}
    elif REGISTRY[name].needs_buffers:
        inputs |= {f"buffer:{n}": buffer_info[n]["sha256"] for n in manifest.node_names if n in buffer_info}
        first = buffer_info[manifest.node_names[0]]["size"] if buffer_info else 0
        options["buffer_size"] = cfg.buffer_size if cfg.buffer_size is not None else first
    shared = {k: v for k, v in without_strategy_options(cfg).items() if k not in ("strategy", "resume", "overwrite")}
    return shared | options | {"strategy": name, "fold": fold, "seed": manifest.stage_seed(cfg.seed),
                               "init_epochs": cfg.init_epochs_resolved, "inputs": inputs}


def resolved_runs(cfg: FederateConfig, manifest: Manifest, runs: list[tuple[str, int | None]],
                  buffer_info: dict[str, dict]) -> dict[tuple[str, int | None], dict]:
    """Each run's resolved options (`strategy_config`), known before the first trains."""
    return {(name, fold): strategy_config(cfg, manifest, name, fold, buffer_info) for name, fold in runs}


def start_fields(resolved: dict[tuple[str, int | None], dict]) -> dict:
    """What the stage's `start` line says of its runs: each one's strategy and fold, the hash of the options that
    decide its numbers (`computed`, what its checkpoint compares: the same on either engine, or resumed) and that
    of the config its config.json records."""
    return {"runs": [{"strategy": name, "fold": fold, "options": json_sha256(computed(config)),
                      "config": json_sha256(config)} for (name, fold), config in resolved.items()]}


def computed(resolved: dict) -> dict:
    """What decides a run's numbers: the resolved options less where the experiment lies and how the
    run executes (engine, threads), so a moved experiment, or the other engine, resumes a checkpoint."""
    left_out = {*ENGINE_OPTIONS, "exp", *inapplicable(resolved)}
    return settled({k: v for k, v in resolved.items() if k not in left_out})


def run_label(name: str, fold: int | None) -> str:
    return name if fold is None else f"{name} fold {fold}"


ROUND_METRICS = ("accuracy", "balanced_accuracy", "f1_macro", "auroc", "ece")  # TensorBoard's means, every round
NODE_METRIC = "accuracy"  # and each node's


def record_round(name: str, fold: int | None, rounds: int, end: RoundEnd) -> None:
    """The round's line in the stage's events (fedcli/experiment/events.py): its metrics rows as metrics.csv holds them
    (less the run's columns) and its bytes; and, in the run's TensorBoard run, the same few tags whatever the
    strategy (so runs overlay), step the round (`round_scalars`)."""
    metrics = [{k: v for k, v in row.items() if k not in ("round", "strategy", *DIAGNOSTIC)} for row in end.rows]
    events.record("round", {"strategy": name, "fold": fold, "round": end.round, "rounds": rounds, "bytes": end.bytes,
                            "metrics": metrics}, board_run(name, fold), round_scalars(end), end.round)


def board_run(name: str, fold: int | None) -> str:
    """The run's TensorBoard run (fedcli/experiment/events.py)."""
    return run_label(name, fold).replace(" ", "-")


def round_scalars(end: RoundEnd) -> dict[str, float]:
    """`test/<metric>`, the mean over the nodes of each node's model (or the shared one) on its own test set, where
    defined; `node/<node>/accuracy`; `comm/bytes`. A round without evaluation has only the bytes."""
    own = [row for row in own_site(end.rows) if row["model_node"] in (row["test_node"], *REGISTRY.shared_model_keys())]
    scalars = {f"node/{row['test_node']}/{NODE_METRIC}": row[NODE_METRIC] for row in own}
    for metric in ROUND_METRICS:
        values = [row[metric] for row in own if math.isfinite(row[metric])]
        scalars[f"test/{metric}"] = sum(values) / len(values) if values else math.nan
    return events.scalars_of(scalars) | {"comm/bytes": float(end.bytes)}


def write_output(out: Path, rows: list[dict], transfers: list[Transfer], states: dict[str, dict[str, torch.Tensor]],
                 predictions: dict[str, torch.Tensor], resolved: dict, overwrite: bool,
                 shared: dict[str, dict[str, torch.Tensor]] | None = None, tables: dict[str, list[dict]] | None = None,
                 spent: list[dict] = ()) -> None:
    """metrics.csv (own-site test sets), global_test.csv (the partition's global test set, where it has one),
    budget.csv (each training call's optimiser steps and real and replayed images), comm.csv,
    models/<key>.safetensors, predictions.safetensors (the final models' softmax on their own test sets, with the
    labels), shared/<name>.safetensors (samples of what the strategy sent, kept for an audit), the strategy's own
    tables (<name>.csv) and config.json, replacing `out` at once."""
    metrics = pd.DataFrame(own_site(rows))
    held = [row for row in rows if row["test_node"] == GLOBAL_TEST]  # no BatchNorm diagnostic: no node's test set
    with staged_output(out, overwrite=overwrite) as stage:
        write_csv(stage / "metrics.csv", metrics.drop(columns=list(DIAGNOSTIC), errors="ignore"))
        if held:
            write_csv(stage / GLOBAL_TEST_FILE, pd.DataFrame(held))
        write_csv(stage / BUDGET, pd.DataFrame(list(spent), columns=["round", "key", "steps", "real", "replayed"]))
        write_csv(stage / "bn_statistics.csv", batchnorm_frame(metrics))
        sealed = ["sealed_bytes"] if any(t.sealed_bytes is not None for t in transfers) else []  # relayed runs
        comm = pd.DataFrame([t.__dict__ for t in transfers], columns=["round", "sender", "receiver", "kind", "bytes",
                                                                       *sealed])
        write_csv(stage / "comm.csv", comm.astype({name: "Int64" for name in sealed}))
        for key, state in states.items():
            save_tensors(stage / "models" / f"{key}.safetensors", {k: v.detach().cpu() for k, v in state.items()})
        save_tensors(stage / PREDICTIONS, predictions)
        for name, rows_ in (tables or {}).items():
            write_csv(stage / f"{name}.csv", pd.DataFrame(rows_))
        for name, tensors in (shared or {}).items():
            save_tensors(stage / SHARED / f"{name}.safetensors", tensors)
        meta = provenance("federate", resolved, resolved["seed"], resolved["inputs"]) | {"files": record_files(stage)}
        if resolved["fold"] is not None:
            meta["note"] = cv_note(resolved["fold"])
        write_json(stage / "config.json", meta)


SHARED = "shared"
GLOBAL_TEST_FILE = "global_test.csv"
BUDGET = "budget.csv"


def batchnorm_frame(metrics: pd.DataFrame) -> pd.DataFrame:
    """The final round's BatchNorm diagnostic (training/batchnorm_check.py), one row per model and test set."""
    final = metrics[metrics["round"] == metrics["round"].max()].dropna(subset=list(DIAGNOSTIC))
    return final[list(BN_COLUMNS)].reset_index(drop=True)


def checkpoint_dir(out: Path) -> Path:
    """The hidden folder next to a strategy's output that holds its last completed round."""
    return out.parent / f".{out.name}.checkpoint"


def cv_note(fold: int | None) -> str:
    return (f"validation on train fold {fold}: the GAN buffers were trained on all train folds, so they have "
            "seen this validation fold")

