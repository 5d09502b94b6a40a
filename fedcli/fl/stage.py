"""The `federate` stage: run strategies on the partition (and buffers), write their artifacts.

Per strategy, `<exp>/federate/<strategy>/`: metrics.csv (one row per round, model and test set),
comm.csv (every transfer with its measured bytes), models/<key>.safetensors, config.json.
With --fold k / --cv, training uses the other train folds and evaluates on fold k, under
`<exp>/federate/cv/<strategy>/fold<k>/`; the test sets are never touched. A hidden folder next
to the output holds the checkpoint of the last completed round until the run finishes.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pandas as pd
import torch

from fedcli.artifacts import check_output_free, load_tensors, provenance, save_tensors, sha256_file, \
    staged_output, write_csv, write_json
from fedcli.config import FederateConfig, to_json
from fedcli.data.manifest import Manifest
from fedcli.errors import UserError
from fedcli.fl.engine import Checkpoint, Federation, NodeImages, run_rounds
from fedcli.fl.local import TensorSource
from fedcli.fl.progress import RoundProgress
from fedcli.fl.strategies import NEEDS_BUFFERS, make_strategy
from fedcli.devices import resolve_device
from fedcli.gan.stage import read_gan_config
from fedcli.layout import BUFFER, federate_dir, gan_dir


@dataclasses.dataclass
class StrategyRun:
    strategy: str
    fold: int | None
    out: Path
    rows: list[dict]


def load_buffer(exp: Path, manifest: Manifest, node: str, size: int | None, strategy: str) -> TensorSource:
    """The first `size` images of a node's buffer, after checking it belongs to this partition."""
    folder = gan_dir(exp, node)
    if not (folder / BUFFER).is_file():
        raise UserError(f"strategy {strategy} needs node {node}'s synthetic buffer ({folder / BUFFER} is missing); "
                        f"run fedcli train-gan --exp {exp} first")
    read_gan_config(exp, manifest, node)
    tensors = load_tensors(folder / BUFFER, f"buffer of node {node}")
    images, labels = tensors.get("images"), tensors.get("labels")
    shape = (manifest["channels"], manifest["image_size"], manifest["image_size"])
    if images is None or labels is None or images.dtype != torch.uint8 or tuple(images.shape[1:]) != shape:
        raise UserError(f"buffer of node {node} is not uint8 images of shape {shape}; re-run fedcli train-gan")
    size = len(labels) if size is None else size
    if size > len(labels):
        raise UserError(f"--buffer-size {size} exceeds node {node}'s buffer of {len(labels)} images; run "
                        f"fedcli train-gan --sample-only --buffer-size {size}")
    return TensorSource(images[:size].clone(), labels[:size].clone())


def run(cfg: FederateConfig, after_round=None) -> list[StrategyRun]:
    manifest = Manifest.load(cfg.exp)
    seed = manifest["seed"] if cfg.seed is None else cfg.seed
    device = resolve_device(cfg.device)
    if cfg.fold is not None and not 0 <= cfg.fold < manifest["folds"]:
        raise UserError(f"--fold {cfg.fold} is not a fold of this partition (0..{manifest['folds'] - 1})")
    folds = list(range(manifest["folds"])) if cfg.cv else [cfg.fold]
    uses_buffers = [s for s in cfg.strategy if s in NEEDS_BUFFERS and cfg.buffer_size != 0]
    buffers = {node: load_buffer(cfg.exp, manifest, node, cfg.buffer_size, uses_buffers[0])
               for node in manifest.node_names} if uses_buffers else {}
    for name in ("feder-b", "central-synthetic", "central-mixed"):
        if name in cfg.strategy and cfg.buffer_size == 0:
            raise UserError(f"{name} trains on synthetic data, so it needs --buffer-size > 0")
    runs = [(name, fold) for name in cfg.strategy for fold in folds]
    for name, fold in runs:
        out = federate_dir(cfg.exp, name, fold)
        if not (cfg.resume and checkpoint_dir(out).is_dir()):
            check_output_free(out, cfg.overwrite)
    buffer_hashes = {node: sha256_file(gan_dir(cfg.exp, node) / BUFFER) for node in buffers}
    images = NodeImages(manifest)
    return [run_one(cfg, manifest, seed, device, name, fold, buffers, buffer_hashes, images, after_round)
            for name, fold in runs]


def run_one(cfg: FederateConfig, manifest: Manifest, seed: int, device: str, name: str, fold: int | None,
            buffers: dict[str, TensorSource], buffer_hashes: dict[str, str], images: NodeImages,
            after_round) -> StrategyRun:
    out = federate_dir(cfg.exp, name, fold)
    init_epochs = cfg.epochs if cfg.init_epochs is None else cfg.init_epochs
    fed = Federation(manifest, lambda node: buffers[node], seed=seed, model=cfg.model, epochs=cfg.epochs,
                     init_epochs=init_epochs, lr=cfg.lr, batch=cfg.batch, lam=cfg.lam, buffer_codec=cfg.buffer_codec,
                     fold=fold, device=device, bootstrap=cfg.bootstrap, pretrained=cfg.pretrained,
                     model_weights=cfg.model_weights, node_batch=cfg.batch_sizes(), images=images)
    buffer_size = cfg.buffer_size if cfg.buffer_size is not None else (len(next(iter(buffers.values())))
                                                                       if buffers else 0)
    strategy = make_strategy(name, cfg.mu, buffer_size)
    resolved = {k: v for k, v in to_json(cfg).items() if k not in ("strategy", "resume", "overwrite")}
    inputs = {"manifest": manifest.content_hash}
    inputs |= {f"buffer:{n}": h for n, h in buffer_hashes.items() if name in NEEDS_BUFFERS}
    resolved |= {"strategy": name, "fold": fold, "seed": seed, "init_epochs": init_epochs,
                 "buffer_size": buffer_size if name in NEEDS_BUFFERS else None, "inputs": inputs}
    work = checkpoint_dir(out)
    resuming = cfg.resume and work.is_dir()
    if not resuming and work.exists():
        shutil.rmtree(work)
    with RoundProgress(name if fold is None else f"{name} fold {fold}", cfg.rounds) as progress:
        def on_round(round_: int) -> None:
            progress.update(round_)
            if after_round is not None:
                after_round(name, round_)
        rows, transfers = run_rounds(fed, strategy, cfg.rounds, cfg.eval_every, Checkpoint(work), resolved,
                                     resuming, on_round)
    with staged_output(out, overwrite=cfg.overwrite or resuming) as stage:
        write_csv(stage / "metrics.csv", pd.DataFrame(rows))
        write_csv(stage / "comm.csv", pd.DataFrame([t.__dict__ for t in transfers],
                                                   columns=["round", "sender", "receiver", "kind", "bytes"]))
        for key, model in strategy.models().items():
            save_tensors(stage / "models" / f"{key}.safetensors", {k: v.detach().cpu()
                                                                    for k, v in model.state_dict().items()})
        meta = provenance("federate", resolved, seed, inputs)
        if fold is not None:
            meta["note"] = cv_note(fold)
        write_json(stage / "config.json", meta)
    shutil.rmtree(work, ignore_errors=True)
    return StrategyRun(name, fold, out, rows)


def checkpoint_dir(out: Path) -> Path:
    """The hidden folder next to a strategy's output that holds its last completed round."""
    return out.parent / f".{out.name}.checkpoint"


def cv_note(fold: int | None) -> str:
    return (f"validation on train fold {fold}: the GAN buffers were trained on all train folds, so they have "
            "seen this validation fold")

