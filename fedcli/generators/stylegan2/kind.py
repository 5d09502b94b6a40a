"""The StyleGAN2 generator kind (fedcli/generators/protocol.py): FedER's two-phase GAN with the privacy loss.

Per node: phase 1 (the standard generator), phase 2 (the released, privacy-preserving one) and its
alpha-0 control (fedcli/generators/stylegan2/train.py); under --dp-epsilon one DP-SGD run stands in all three roles.
With --controls also generator_reseeded.safetensors (the control from another random stream) and
generator_tiny.safetensors (a GAN trained as long on a tiny subset of the node: the audit's tiny-node
control); with --reference N generator_reference.safetensors (phase 1's recipe without the first N members
the audit scores: the calibrated attack's reference). Without DP also phase1_state.safetensors, the trainer
at the kept phase-1 snapshot, which `--phase1-from` starts another alpha from
(fedcli/generators/stylegan2/phase1_state.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from fedcli.core import console
from fedcli.core.errors import UserError
from fedcli.core.progress import StepProgress
from fedcli.core.rng import numpy_stream, stream_seed, torch_stream
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.config import recorded
from fedcli.experiment.paths import (GENERATOR, GENERATOR_CONTROL, GENERATOR_PHASE1, GENERATOR_REFERENCE,
                                     GENERATOR_RESEEDED, GENERATOR_TINY, PHASE1_STATE)
from fedcli.generators import fid, fidelity, private
from fedcli.generators.config import GanConfig
from fedcli.generators.groups import interleave, matched_groups
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.progress import TrainingProgress
from fedcli.generators.protocol import CONTROL, RELEASED, STANDARD, Trained
from fedcli.generators.stylegan2.lira_references import train_references
from fedcli.generators.stylegan2.networks import Architecture, Generator
from fedcli.generators.stylegan2.options import StyleGan2Options
from fedcli.generators.stylegan2.phase1_state import Phase1Source, state_file
from fedcli.generators.stylegan2.train import (GanTrainer, PhaseResult, TrainSettings, long_run, private_run,
                                               run_phases, standard_phase)


class StyleGan2:
    name = "stylegan2"
    projectable = True  # audit-privacy inverts it (fedcli/generators/protocol.py Invertible)
    transfers = ()  # each node trains alone
    options = StyleGan2Options

    def titles(self, cfg: GanConfig) -> dict[str, str]:
        if cfg.private:
            return {RELEASED: f"DP GAN, epsilon {cfg.dp_epsilon:g} (buffer)"}
        return {STANDARD: "standard GAN (phase 1)", RELEASED: "privacy-preserving GAN (phase 2, buffer)",
                CONTROL: "control (phase 2 at alpha 0)"}

    def plans(self, cfg: GanConfig, manifest: Manifest, nodes: Sequence[str], seed: int) -> dict:
        architecture(cfg, manifest)
        if cfg.private and cfg.phase1_from is not None:
            raise UserError("--phase1-from starts phase 2 from a standard phase 1; a DP generator trains neither "
                            "(one DP-SGD run), so drop --phase1-from")
        for node in nodes:
            reference_holdout(manifest, node, cfg.reference, seed)
        return {node: dp_plan(cfg, manifest, node) for node in nodes}

    def trainer(self, cfg: GanConfig, manifest: Manifest, nodes: Sequence[str], seed: int,
                device: str) -> NodeTraining:
        plans = self.plans(cfg, manifest, nodes, seed)
        sources = {node: Phase1Source(cfg.phase1_from, cfg, manifest, node, seed, device) for node in nodes
                   if cfg.phase1_from is not None}
        perceptual = Perceptual(cfg.lpips_net, cfg.lpips_weights).to(device)
        return NodeTraining(cfg, manifest, seed, device, architecture(cfg, manifest), perceptual,
                            fid.inception_space(cfg.fid_weights, device), plans, sources)

    def build(self, record: dict) -> Generator:
        return Generator(Architecture(**record["architecture"]))

    def image_size(self, record: dict) -> int:
        return record["architecture"]["resolution"]

    def latent_sizes(self, record: dict) -> tuple[int, int]:
        return record["architecture"]["z_dim"], record["architecture"]["w_dim"]


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


def node_feature_space(cfg: GanConfig, manifest: Manifest, node: str, seed: int, train: TensorSource,
                       device: str) -> fid.FeatureSpace:
    """FID's offline feature space: a SmallCNN trained on the node's training images with the fidelity
    score's lr, batch and epochs."""
    budget = dataclasses.replace(fidelity.config_budget(cfg, manifest), model="cnn")
    with StepProgress("train-gan", f"{node} FID features"):  # a classifier trained before the first iteration
        classifier, _ = fidelity.train_classifier(train, budget, len(train), manifest["channels"],
                                                  manifest.num_classes, (seed, node, "fid-features"), device)
    return fid.classifier_space(classifier)


def dp_plan(cfg: GanConfig, manifest: Manifest, node: str) -> private.DpPlan | None:
    """The node's DP-SGD plan under --dp-epsilon: one D step per iteration, on its training images."""
    if not cfg.private:
        return None
    return private.plan(cfg.dp_epsilon, cfg.dp_delta, cfg.dp_max_grad_norm, cfg.batch,
                        len(manifest.records(node, "train")), cfg.iterations, node, noise=cfg.dp_noise)


def side_trainer(main: GanTrainer, data: NodeDataset, index: list[int], seed: int, node: str,
                 purpose: str, judge: fidelity.SelectionJudge | None = None) -> GanTrainer:
    """A fresh GAN like `main` (architecture, settings, networks) on some of the node's images, from its own
    keyed initialisation and stream."""
    return GanTrainer(main.arch, main.s, to_float(data.images[index]), data.labels[index], main.perceptual,
                      main.features, torch_stream(seed, node, f"train-gan-{purpose}", device=main.device),
                      init_seed=stream_seed(seed, node, f"gan-init-{purpose}"), device=main.device, judge=judge)


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


@dataclasses.dataclass
class NodeTraining:
    """The StyleGAN kind's NodeTrainer: the run's options and the networks every node shares."""

    cfg: GanConfig
    manifest: Manifest
    seed: int
    device: str
    arch: Architecture
    perceptual: Perceptual
    inception: fid.FeatureSpace | None
    plans: dict[str, private.DpPlan | None]
    sources: dict[str, Phase1Source]  # --phase1-from's state of each node

    def judge(self, node: str, train: TensorSource) -> fidelity.SelectionJudge | None:
        """Under --select fidelity, the reading of a GAN trained on `train`."""
        if self.cfg.select != "fidelity":
            return None
        return fidelity.selection_judge(self.cfg, self.manifest, node, self.seed, train, self.device)

    def train(self, node: str, data: NodeDataset) -> Trained:
        cfg, seed, device, dp = self.cfg, self.seed, self.device, self.plans[node]
        train = TensorSource(data.images, data.labels)
        features = self.inception or node_feature_space(cfg, self.manifest, node, seed, train, device)
        trainer = GanTrainer(self.arch, settings(cfg, self.arch.resolution), to_float(data.images), data.labels,
                             self.perceptual, features, torch_stream(seed, node, "train-gan", device=device),
                             init_seed=stream_seed(seed, node, "gan-init"), device=device, dp=dp,
                             noise=torch_stream(seed, node, "train-gan-dp-noise", device=device),
                             judge=self.judge(node, train))
        rows: list[dict] = []
        tiny_index, tiny = tiny_node(data.labels, cfg.tiny_node, seed, node) if cfg.controls else [], None
        held_out = reference_holdout(self.manifest, node, cfg.reference, seed)
        reference = None
        with TrainingProgress(node, cfg.iterations, cfg.pp_iterations, cfg.controls, bool(cfg.reference)) as progress:
            log = lambda row: (rows.append(row), progress.update(row))  # noqa: E731
            reseed = stream_seed(seed, node, "train-gan-reseeded") if cfg.controls else None
            start = None if dp else self.phase1(node, trainer, log, rows, progress)
            phases = private_run(trainer, log) if dp else run_phases(trainer, log, reseed, start)
            if cfg.controls:
                tiny = long_run(side_trainer(trainer, data, tiny_index, seed, node, "tiny"), cfg.iterations, "tiny",
                                log)
            if cfg.lira_references:
                lira_files, lira = train_references(trainer, self.manifest, node, data, cfg.lira_references, seed,
                                                    dp is not None,
                                                    lambda images, labels: self.judge(node, TensorSource(images,
                                                                                                         labels)))
            if cfg.reference:
                kept = sorted(set(range(len(data))) - set(held_out))
                side = TensorSource(data.images[kept], data.labels[kept])
                reference, _ = standard_phase(side_trainer(trainer, data, kept, seed, node, "reference",
                                                           self.judge(node, side)), log, "reference")
        phase1, phase2, control, reseeded = phases
        if phase2.stopped == "fid-factor" and phase2.iteration == 0:
            console.warn(f"node {node}: the first phase-2 FID already exceeded {cfg.fid_factor} x the phase-1 FID, "
                         "so the privacy-preserving generator is the standard one; lower --alpha or --fid-every")
        generators = {}
        for role, result in ((STANDARD, phase1), (RELEASED, phase2), (CONTROL, control)):
            generators[role] = Generator(self.arch).to(device)
            generators[role].load_state_dict(result.generator)
        files = {GENERATOR: (phase2.generator, {"phase": "2", "node": node}),
                 GENERATOR_PHASE1: (phase1.generator, {"phase": "1", "node": node}),
                 GENERATOR_CONTROL: (control.generator, {"phase": "control", "node": node})}
        if reseeded is not None:
            files |= {GENERATOR_RESEEDED: (reseeded.generator, {"phase": "reseeded", "node": node}),
                      GENERATOR_TINY: (tiny, {"phase": "tiny", "node": node})}
        if reference is not None:
            files[GENERATOR_REFERENCE] = (reference.generator, {"phase": "reference", "node": node})
        if cfg.lira_references:
            files |= lira_files
        if start is not None:
            files[PHASE1_STATE] = state_file(cfg, self.manifest, node, seed, device, *start,
                                             [row for row in rows if row["phase"] == 1])
        names = metric_names(self.perceptual, features)
        record = {"architecture": dataclasses.asdict(self.arch), "train_images": len(data), "device": device,
                  "settings": recorded(dataclasses.asdict(trainer.s)), "lpips": self.perceptual.record(),
                  "fid": {"name": features.name, "calibrated": features.calibrated}, "metric_names": names,
                  **phases_record(cfg, trainer, phases)}
        if reseeded is not None:
            record["tiny"] = {"images": len(tiny_index), "iterations": cfg.iterations, "alpha": 0.0,
                              "stream": "train-gan-tiny", "member_ids": [data.records[i]["id"] for i in tiny_index]}
        if reference is not None:
            record["reference"] = {"fid": reference.fid, "best_iteration": reference.iteration,
                                   "iterations": reference.iterations_run, "stopped": reference.stopped,
                                   **reference.selection, "images": len(data) - len(held_out),
                                   "stream": "train-gan-reference",
                                   "held_out_ids": [data.records[i]["id"] for i in held_out]}
        if cfg.lira_references:
            record["lira"] = lira
        if dp:
            record["dp"] = dp.record()
        return Trained(generators, files, metrics_frame(rows, names), record)

    def phase1(self, node: str, trainer: GanTrainer, log: Callable[[dict], None], rows: list[dict],
               progress: TrainingProgress) -> tuple[PhaseResult, dict]:
        """Phase 1 and the trainer's state at its kept snapshot: trained here, or --phase1-from's (its rows
        joining this run's metrics)."""
        source = self.sources.get(node)
        if source is None:
            return standard_phase(trainer, log)
        phase1, state, earlier = source.restore(trainer)
        rows.extend(earlier)
        progress.reused(phase1.iterations_run, source.source)
        console.out.print(f"node {node}: phase 1 from {source.source} (the same options up to phase 2), not "
                          "retrained", soft_wrap=True, markup=False)
        return phase1, state


def phases_record(cfg: GanConfig, trainer: GanTrainer, phases) -> dict:
    phase1, phase2, control, reseeded = phases
    return {"phase1": {"fid": phase1.fid, "best_iteration": phase1.iteration, "iterations": phase1.iterations_run,
                       "stopped": phase1.stopped, **phase1.selection},
            "phase2": {"fid": phase2.fid, "kept_iteration": phase2.iteration, "iterations": phase2.iterations_run,
                       "stopped": phase2.stopped, "fid_limit": cfg.fid_factor * phase1.fid,
                       "privacy_reference": trainer.privacy_reference},
            "control": {"fid": control.fid, "iterations": control.iterations_run, "alpha": 0.0},
            **({"reseeded": {"fid": reseeded.fid, "iterations": reseeded.iterations_run, "alpha": 0.0,
                             "stream": "train-gan-reseeded"}} if reseeded is not None else {})}


def metric_names(perceptual: Perceptual, features: fid.FeatureSpace) -> dict[str, str]:
    """Column names that carry the network behind each number, e.g. `fid[cnn-node]`."""
    return {"l_pp": f"l_pp[{perceptual.name}]", "lpips_mean": f"lpips_mean[{perceptual.name}]",
            "fid": f"fid[{features.name}]"}


def metrics_frame(rows: list[dict], names: dict[str, str]) -> pd.DataFrame:
    columns = ["phase", "iteration", "loss_g", "loss_d", "r1", "ada_p", "rt", "l_pp", "lpips_mean", "fid"]
    if any("selection_accuracy" in row for row in rows):
        columns.append("selection_accuracy")
    return pd.DataFrame(rows).reindex(columns=columns).rename(columns=names)


KIND = StyleGan2()
