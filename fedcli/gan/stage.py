"""The `train-gan` stage: per node, train the GAN, keep both phases' generators, sample the buffer.

Writes `<exp>/gan/<node>/`: generator.safetensors (phase 2, privacy-preserving, EMA),
generator_phase1.safetensors (standard GAN), generator_control.safetensors (phase 2 at alpha = 0,
the privacy generator's compute-matched control), buffer.safetensors, metrics.csv, samples.png and
config.json (architecture, metric names, provenance). With --controls also generator_reseeded.safetensors
(the control from another random stream) and generator_tiny.safetensors (a GAN trained as long on a
tiny subset of the node: the audit's tiny-node control); with --reference N generator_reference.safetensors
(phase 1's recipe without the first N members the audit scores: the calibrated attack's reference).
Each node folder is staged and renamed into place when complete.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fedcli import console
from fedcli.artifact_kinds import file_record, file_sha256, load_module, record_files
from fedcli.artifacts import (check_output_free, provenance, read_json, save_tensors, staged_output,
                              write_csv, write_json)
from fedcli.config import GanConfig, to_json
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.devices import resolve_device, with_threads
from fedcli.layout import (BUFFER, GENERATOR, GENERATOR_CONTROL, GENERATOR_PHASE1, GENERATOR_REFERENCE,
                           GENERATOR_RESEEDED, GENERATOR_TINY, gan_dir)
from fedcli.locking import locked
from fedcli.errors import UserError
from fedcli.data.tensor_source import TensorSource
from fedcli.gan import fidelity
from fedcli.gan.buffer import sample_buffer
from fedcli.gan import fid
from fedcli.gan.networks import Architecture, Generator
from fedcli.gan.perceptual import Perceptual
from fedcli.gan.progress import TrainingProgress
from fedcli.gan.samples import write_samples
from fedcli.audit.groups import interleave, matched_groups
from fedcli.gan import private
from fedcli.gan.train import GanTrainer, TrainSettings, long_run, private_run, run_phases, standard_phase
from fedcli.rng import numpy_stream, stream_seed, torch_stream


def architecture(cfg: GanConfig, manifest: Manifest) -> Architecture:
    try:
        return Architecture(resolution=manifest["image_size"], channels=manifest["channels"],
                            num_classes=manifest.num_classes, z_dim=cfg.z_dim, w_dim=cfg.w_dim,
                            channel_base=cfg.channel_base, channel_max=cfg.channel_max)
    except ValueError as exc:
        raise UserError(f"the partition's image size cannot be a GAN resolution ({exc}); re-run fedcli partition "
                        "with --image-size 16, 32, 64, ...") from exc


def settings(cfg: GanConfig, resolution: int) -> TrainSettings:
    """The trainer's settings, with each `auto` resolved: R1 gamma by the StyleGAN2-ADA heuristic, ADA
    able to move p from 0 to 1 within a tenth of phase 1, the reference's EMA half-life."""
    names = {f.name for f in dataclasses.fields(TrainSettings)}
    values = {k: v for k, v in dataclasses.asdict(cfg).items() if k in names}
    auto = {"r1_gamma": r1_gamma_auto(resolution, cfg.batch), "ada_kimg": cfg.iterations * cfg.batch / 1000 / 10,
            "ema_kimg": 10 * cfg.batch / 32}
    return TrainSettings(**(values | {k: auto[k] for k, v in values.items() if v == "auto"}))


def r1_gamma_auto(resolution: int, batch: int) -> float:
    """StyleGAN2-ADA's heuristic: 0.0002 x resolution^2 / batch."""
    return 0.0002 * resolution ** 2 / batch


def fidelity_budget(cfg: GanConfig, manifest: Manifest) -> fidelity.Budget:
    return fidelity.Budget(model=cfg.fidelity_model, epochs=cfg.fidelity_epochs, lr=cfg.fidelity_lr,
                           batch=cfg.fidelity_batch, seeds=cfg.fidelity_seeds,
                           augment=tuple(manifest.data.get("augment", ())))


def node_feature_space(cfg: GanConfig, manifest: Manifest, node: str, seed: int, train: TensorSource,
                       device: str) -> fid.FeatureSpace:
    """FID's offline feature space: a SmallCNN trained on the node's training images with the fidelity
    score's lr, batch and epochs."""
    budget = dataclasses.replace(fidelity_budget(cfg, manifest), model="cnn")
    classifier, _ = fidelity.train_classifier(train, budget, len(train), manifest["channels"], manifest.num_classes,
                                              (seed, node, "fid-features"), device)
    return fid.classifier_space(classifier)


def measure_fidelity(cfg: GanConfig, manifest: Manifest, node: str, seed: int, classes: list[int], generators: dict,
                     buffer: TensorSource, train: TensorSource, device: str) -> dict | None:
    """The released buffer's fidelity, with the standard (phase 1) generator's and the control's alongside
    under `phase1` and `control` (the same buffer draws from each); None when --fidelity-seeds is 0."""
    if not cfg.fidelity_seeds:
        return None
    test = NodeDataset(manifest, node, "test")
    others = {name: TensorSource(*sample_buffer(generators[name], classes, cfg.buffer_size, seed, node, device,
                                                cfg.truncation)) for name in ("phase1", "control")}
    budget = fidelity_budget(cfg, manifest)
    scores = fidelity.score({"released": buffer, **others}, train, TensorSource(test.images, test.labels),
                            budget, in_channels=manifest["channels"], num_classes=manifest.num_classes, seed=seed,
                            node=node, device=device)
    return scores["released"] | {name: scores[name] for name in others} | {
        "test_images": len(test), "classifier": dataclasses.asdict(budget)}


@with_threads
def run(cfg: GanConfig) -> list[dict]:
    """Train (or, with sample_only, re-sample) the chosen nodes; return one summary per node."""
    manifest = Manifest.load(cfg.exp)
    nodes = [manifest.node(cfg.node)["name"]] if cfg.node else manifest.node_names
    with locked(cfg.exp, [gan_dir(cfg.exp, node) for node in nodes]):
        return run_nodes(cfg, manifest, nodes)


def run_nodes(cfg: GanConfig, manifest: Manifest, nodes: list[str]) -> list[dict]:
    """`run`, with the nodes' folders locked."""
    seed = manifest["seed"] if cfg.seed is None else cfg.seed
    device = resolve_device(cfg.device)
    if cfg.sample_only:
        return [resample(cfg, manifest, node, seed, device) for node in nodes]
    arch = architecture(cfg, manifest)
    plans = {}
    for node in nodes:
        check_output_free(gan_dir(cfg.exp, node), cfg.overwrite)
        check_buffer_size(cfg.buffer_size, node_classes(manifest, node), node)
        reference_holdout(manifest, node, cfg.reference, seed)
        plans[node] = dp_plan(cfg, manifest, node)
    perceptual = Perceptual(cfg.lpips_net, cfg.lpips_weights).to(device)
    inception = fid.inception_space(cfg.fid_weights, device)
    return [train_node(cfg, manifest, node, seed, arch, perceptual, inception, device, plans[node]) for node in nodes]


def dp_plan(cfg: GanConfig, manifest: Manifest, node: str) -> private.DpPlan | None:
    """The node's DP-SGD plan under --dp-epsilon: one D step per iteration, on its training images."""
    if not cfg.private:
        return None
    return private.plan(cfg.dp_epsilon, cfg.dp_delta, cfg.dp_max_grad_norm, cfg.batch,
                        len(manifest.records(node, "train")), cfg.iterations, node)


def side_trainer(main: GanTrainer, data: NodeDataset, index: list[int], seed: int, node: str,
                 purpose: str) -> GanTrainer:
    """A fresh GAN like `main` (architecture, settings, networks) on some of the node's images, from its own
    keyed initialisation and stream."""
    return GanTrainer(main.arch, main.s, to_float(data.images[index]), data.labels[index], main.perceptual,
                      main.features, torch_stream(seed, node, f"train-gan-{purpose}", device=main.device),
                      init_seed=stream_seed(seed, node, f"gan-init-{purpose}"), device=main.device)


def reference_holdout(manifest: Manifest, node: str, count: int, seed: int) -> list[int]:
    """The train images the reference GAN must not see: the first `count` members the audit scores (its
    groups for --max-images up to `count` are these images' first ones, whatever --max-images is)."""
    if not count:
        return []
    train = manifest.records(node, "train")
    held_out = sorted(matched_groups(train, manifest.records(node, "test"), count, seed, node)[0])
    if len(train) - len(held_out) < 2:
        raise UserError(f"--reference {count} leaves node {node} fewer than 2 of its {len(train)} train images "
                        "for the reference GAN; lower --reference")
    return held_out


def tiny_node(labels: torch.Tensor, size: int, seed: int, node: str) -> list[int]:
    """The tiny-node control's training images: `size` of the node's (at most a quarter of them), drawn
    class by class in turn from keyed permutations, so every class the node holds is in it."""
    count = min(size, len(labels) // 4)
    pools = [list(numpy_stream(seed, node, "tiny-node", c).permutation(np.flatnonzero(labels.numpy() == c)))
             for c in sorted(set(labels.tolist()))]
    return sorted(int(i) for i in interleave(pools)[:count])


def node_classes(manifest: Manifest, node: str) -> list[int]:
    return sorted({r["label"] for r in manifest.records(node, "train")})


def check_buffer_size(size: int, classes: list[int], node: str) -> None:
    if size < len(classes):
        raise UserError(f"--buffer-size {size} is smaller than node {node}'s {len(classes)} classes; "
                        f"use at least {len(classes)} so every class appears")


def train_node(cfg: GanConfig, manifest: Manifest, node: str, seed: int, arch: Architecture,
               perceptual: Perceptual, inception: fid.FeatureSpace | None, device: str,
               dp: private.DpPlan | None) -> dict:
    data = NodeDataset(manifest, node, "train")
    classes = node_classes(manifest, node)
    train = TensorSource(data.images, data.labels)
    features = inception or node_feature_space(cfg, manifest, node, seed, train, device)
    trainer = GanTrainer(arch, settings(cfg, arch.resolution), to_float(data.images), data.labels, perceptual,
                         features, torch_stream(seed, node, "train-gan", device=device),
                         init_seed=stream_seed(seed, node, "gan-init"), device=device, dp=dp,
                         noise=torch_stream(seed, node, "train-gan-dp-noise", device=device))
    rows: list[dict] = []
    tiny_index, tiny = tiny_node(data.labels, cfg.tiny_node, seed, node) if cfg.controls else [], None
    held_out = reference_holdout(manifest, node, cfg.reference, seed)
    reference = None
    with TrainingProgress(node, cfg.iterations, cfg.pp_iterations, cfg.controls, bool(cfg.reference)) as progress:
        log = lambda row: (rows.append(row), progress.update(row))  # noqa: E731
        reseed = stream_seed(seed, node, "train-gan-reseeded") if cfg.controls else None
        phase1, phase2, control, reseeded = private_run(trainer, log) if dp else run_phases(trainer, log, reseed)
        if cfg.controls:
            tiny = long_run(side_trainer(trainer, data, tiny_index, seed, node, "tiny"), cfg.iterations, "tiny", log)
        if cfg.reference:
            kept = sorted(set(range(len(data))) - set(held_out))
            reference, _ = standard_phase(side_trainer(trainer, data, kept, seed, node, "reference"), log,
                                          "reference")
    if phase2.stopped == "fid-factor" and phase2.iteration == 0:
        console.warn(f"node {node}: the first phase-2 FID already exceeded {cfg.fid_factor} x the phase-1 FID, so "
                     "the privacy-preserving generator is the standard one; lower --alpha or --fid-every")
    generators = {}
    for name, result in (("phase1", phase1), ("phase2", phase2), ("control", control)):
        generators[name] = Generator(arch).to(device)
        generators[name].load_state_dict(result.generator)
    images, labels = sample_buffer(generators["phase2"], classes, cfg.buffer_size, seed, node, device, cfg.truncation)
    fidelity_scores = measure_fidelity(cfg, manifest, node, seed, classes, generators, TensorSource(images, labels),
                                       train, device)
    names = metric_names(perceptual, features)
    with staged_output(gan_dir(cfg.exp, node), cfg.overwrite) as out:
        save_tensors(out / GENERATOR, phase2.generator, {"phase": "2", "node": node})
        save_tensors(out / GENERATOR_PHASE1, phase1.generator, {"phase": "1", "node": node})
        save_tensors(out / GENERATOR_CONTROL, control.generator, {"phase": "control", "node": node})
        if reseeded is not None:
            save_tensors(out / GENERATOR_RESEEDED, reseeded.generator, {"phase": "reseeded", "node": node})
            save_tensors(out / GENERATOR_TINY, tiny, {"phase": "tiny", "node": node})
        if reference is not None:
            save_tensors(out / GENERATOR_REFERENCE, reference.generator, {"phase": "reference", "node": node})
        save_tensors(out / BUFFER, {"images": images, "labels": labels}, buffer_metadata(node, manifest))
        write_csv(out / "metrics.csv", metrics_frame(rows, names))
        write_samples(out / "samples.png", generators, classes, manifest["label_names"], seed, node, device,
                      cfg.truncation)
        summary = {
            "node": node, "classes": classes, "architecture": dataclasses.asdict(arch),
            "train_images": len(data), "device": device,
            "settings": dataclasses.asdict(trainer.s),
            "lpips": {"net": cfg.lpips_net, "name": perceptual.name, "calibrated": perceptual.calibrated,
                      "weights_sha256": perceptual.weights_sha256},
            "fid": {"name": features.name, "calibrated": features.calibrated},
            "metric_names": names,
            "phase1": {"fid": phase1.fid, "best_iteration": phase1.iteration, "iterations": phase1.iterations_run,
                       "stopped": phase1.stopped},
            "phase2": {"fid": phase2.fid, "kept_iteration": phase2.iteration,
                       "iterations": phase2.iterations_run, "stopped": phase2.stopped,
                       "fid_limit": cfg.fid_factor * phase1.fid,
                       "privacy_reference": trainer.privacy_reference},
            "control": {"fid": control.fid, "iterations": control.iterations_run, "alpha": 0.0},
            **({"reseeded": {"fid": reseeded.fid, "iterations": reseeded.iterations_run, "alpha": 0.0,
                             "stream": "train-gan-reseeded"},
                "tiny": {"images": len(tiny_index), "iterations": cfg.iterations, "alpha": 0.0,
                         "stream": "train-gan-tiny", "member_ids": [data.records[i]["id"] for i in tiny_index]}}
               if reseeded is not None else {}),
            **({"reference": {"fid": reference.fid, "best_iteration": reference.iteration,
                              "iterations": reference.iterations_run, "stopped": reference.stopped,
                              "images": len(data) - len(held_out), "stream": "train-gan-reference",
                              "held_out_ids": [data.records[i]["id"] for i in held_out]}}
               if reference is not None else {}),
            "buffer": {"size": cfg.buffer_size, "truncation": cfg.truncation, "sha256": file_sha256(out / BUFFER)},
            "fidelity": fidelity_scores,
            **({"dp": dp.record()} if dp else {}),
        }
        write_json(out / "config.json", provenance("train-gan", to_json(cfg), seed,
                                                   {"manifest": manifest.content_hash}) | summary
                   | {"files": record_files(out)})
    return summary



def metric_names(perceptual: Perceptual, features: fid.FeatureSpace) -> dict[str, str]:
    """Column names that carry the network behind each number, e.g. `fid[cnn-node]`."""
    return {"l_pp": f"l_pp[{perceptual.name}]", "lpips_mean": f"lpips_mean[{perceptual.name}]",
            "fid": f"fid[{features.name}]"}


def metrics_frame(rows: list[dict], names: dict[str, str]) -> pd.DataFrame:
    columns = ["phase", "iteration", "loss_g", "loss_d", "r1", "ada_p", "rt", "l_pp", "lpips_mean", "fid"]
    return pd.DataFrame(rows).reindex(columns=columns).rename(columns=names)


def buffer_metadata(node: str, manifest: Manifest) -> dict[str, str]:
    return {"node": node, "manifest": manifest.content_hash, "layout": "images uint8 NCHW, labels int64"}


def load_generator(folder: Path, filename: str, arch: Architecture, device: str = "cpu") -> Generator:
    """Rebuild a saved generator from its config and safetensors file; refuse one that is not what
    train-gan wrote for this node (see artifact_kinds)."""
    generator = load_module(Generator(arch), folder / filename, "generator checkpoint",
                            f"re-run fedcli train-gan --node {folder.name} --overwrite", expect={"node": folder.name})
    return generator.to(device).eval()


def read_gan_config(exp: Path, manifest: Manifest, node: str) -> dict:
    """A node's GAN config.json, refused when its generators came from another partition."""
    saved = read_json(gan_dir(exp, node) / "config.json", f"GAN config of node {node} (run fedcli train-gan first)")
    if saved.get("inputs", {}).get("manifest") != manifest.content_hash:
        raise UserError(f"node {node}'s generators and buffer were made from another partition (stale manifest "
                        "hash); re-run fedcli train-gan --overwrite")
    return saved


def resample(cfg: GanConfig, manifest: Manifest, node: str, seed: int, device: str) -> dict:
    """Write a buffer of another size or truncation from the saved privacy-preserving generator, and
    score its fidelity again."""
    folder = gan_dir(cfg.exp, node)
    saved = read_gan_config(cfg.exp, manifest, node)
    classes = saved["classes"]
    check_buffer_size(cfg.buffer_size, classes, node)
    arch = Architecture(**saved["architecture"])
    generators = {name: load_generator(folder, filename, arch, device)
                  for name, filename in (("phase2", GENERATOR), ("phase1", GENERATOR_PHASE1),
                                         ("control", GENERATOR_CONTROL))}
    images, labels = sample_buffer(generators["phase2"], classes, cfg.buffer_size, saved["seed"], node, device,
                                   cfg.truncation)
    data = NodeDataset(manifest, node, "train")
    saved["fidelity"] = measure_fidelity(cfg, manifest, node, saved["seed"], classes, generators,
                                         TensorSource(images, labels), TensorSource(data.images, data.labels), device)
    save_tensors(folder / BUFFER, {"images": images, "labels": labels}, buffer_metadata(node, manifest))
    record = file_record(folder / BUFFER)
    saved["buffer"] = {"size": cfg.buffer_size, "truncation": cfg.truncation, "sha256": record["sha256"]}
    saved["files"] = {**saved.get("files", {}), BUFFER: record}
    write_json(folder / "config.json", saved)
    console.out.print(f"node {node}: wrote a buffer of {cfg.buffer_size} images")
    return saved
