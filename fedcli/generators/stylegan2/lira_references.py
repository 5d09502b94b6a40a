"""The LiRA game's reference generators (`train-gan --lira-references K`, read by audit-privacy's game,
fedcli/audit/lira.py).

The pool: the node's members as the audit draws them (generators/groups.py, every class-matched train image) and as many
class-matched test images. Reference k trains exactly as the node's released generator (phase 1 then phase 2 and its
alpha-0 control, or one DP-SGD run under the same plan) on the node's train images outside the pool plus half of
the pool, so it sees as many images as the released one; the halves come in complementary pairs, so every pooled
image is IN for exactly K/2 references. Each reference has its own keyed initialisation and streams. References are
audit artefacts, never released; under DP each is itself trained by DP-SGD.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from fedcli.core.progress import StepProgress
from fedcli.core.rng import numpy_stream, stream_seed, torch_stream
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.experiment.paths import lira_generator
from fedcli.generators.groups import complementary_halves, matched_groups
from fedcli.generators.stylegan2.train import GanTrainer, private_run, run_phases


def pool(manifest: Manifest, node: str, seed: int) -> tuple[list[int], list[int]]:
    """(member indices into the node's train split, non-member indices into its test split): the audit's groups
    when --max-images reaches the node's train images."""
    train = manifest.records(node, "train")
    return matched_groups(train, manifest.records(node, "test"), len(train), seed, node)


def train_references(main: GanTrainer, manifest: Manifest, node: str, data: NodeDataset, count: int, seed: int,
                     private: bool, judge) -> tuple[dict, dict]:
    """(files, record) of `count` references trained as `main` was: `files` as NodeTraining's (name -> (state,
    metadata)); the record names the pool by image id and each reference's IN flags over it. `judge(images,
    labels)`: the selection judge of a generator trained on them (None unless --select fidelity)."""
    test = NodeDataset(manifest, node, "test")
    members, non_members = pool(manifest, node, seed)
    images = torch.cat([data.images[members], test.images[non_members]])
    labels = torch.cat([data.labels[members], test.labels[non_members]])
    outside = sorted(set(range(len(data))) - set(members))  # train images every reference sees, as the released one
    inside = complementary_halves(len(images), count, numpy_stream(seed, node, "train-gan-lira-halves"))
    files, seconds = {}, []
    for k, half in enumerate(inside):
        began = time.perf_counter()
        chosen = np.flatnonzero(half)
        seen = torch.cat([data.images[outside], images[chosen]]), torch.cat([data.labels[outside], labels[chosen]])
        with StepProgress("train-gan", f"{node} LiRA reference {k + 1}/{count}"):
            trainer = GanTrainer(main.arch, main.s, to_float(seen[0]), seen[1], main.perceptual, main.features,
                                 torch_stream(seed, node, "train-gan-lira", k, device=main.device),
                                 init_seed=stream_seed(seed, node, "gan-init-lira", k), device=main.device,
                                 dp=main.dp, noise=torch_stream(seed, node, "train-gan-lira-dp-noise", k,
                                                                device=main.device),
                                 judge=judge(*seen))
            phases = private_run(trainer, lambda row: None) if private else run_phases(trainer, lambda row: None)
        files[lira_generator(k, "privacy")] = (phases.privacy.generator if not private else phases.phase1.generator,
                                               {"phase": f"lira-{k}", "node": node})
        if not private:  # under DP the released generator is its own control
            files[lira_generator(k, "control")] = (phases.control.generator, {"phase": f"lira-{k}-control",
                                                                               "node": node})
        seconds.append(time.perf_counter() - began)
    pooled_ids = [data.records[i]["id"] for i in members] + [test.records[i]["id"] for i in non_members]
    record = {"references": count, "pool_ids": pooled_ids, "members": len(members),
              "inside": inside.astype(int).tolist(), "images_each": len(outside) + len(images) // 2,
              "iterations": main.s.iterations, "stream": "train-gan-lira", "seconds": seconds,
              "roles": ["privacy"] if private else ["privacy", "control"]}
    return files, record
