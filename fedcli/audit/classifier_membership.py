"""`audit-privacy --shared`: membership inference on the classifiers a federation shares, at their last round.

Attacked: every model a node holds or received at the end of training whose training saw the node's images. A
shared model (FedAvg's `global`) for every node; a travelling one (FedER's, cyclic's: `models/<node>`, where it
stopped) for every node it trained at, traced back over the ring in comm.csv (with fewer rounds than nodes, a model
has not visited them all); a node's own model (FedBN's, averaged over every node) for that node. Per node the
pool: members, its class-matched train images (generators/groups.py, every one the test split can match), and as many
class-matched test images, which no model trained on. FedER-B's models train on buffers alone: there "members"
are the images the node's GAN trained on, so the attack reads what the buffers pass on.

- The loss attack (Yeom et al. 2018): each pooled image's cross-entropy of its true label under the model in eval
  mode, lower for members, read as effects.membership's AUROC (two-sided, with its direction).
- The LiRA game (`--classifier-references K`, audit/lira.py) on LiRA's statistic, the true class's logit-scaled
  confidence log(p / (1 - p)), computed stably as its logit minus the logsumexp of the other logits. K reference
  classifiers per node, each trained exactly as the standalone strategy trains a node's model (federate/strategies/
  pooled.py: training/settings.py's LocalTrainer under the federation's recorded model, optimiser, learning rate and its
  schedule, batch, init-epochs + R x E epochs), from its own keyed initialisation and streams, on the node's train
  images outside the pool plus one of complementary halves of the pool: as many images as the node holds, every
  pooled image IN for K / 2 of them. The target is the last row, IN for exactly the members; delta is
  1 / (10 x the node's train images).

What the references approximate: they train on one node's images alone, locally, whereas the target trained
federated (FedER: on the ring, replaying the received buffers, on every node it visited; FedAvg: averaged over the
nodes every round). Their IN and OUT distributions of the statistic match the target's only in how much one image
moves a model trained on it, not in the target's level of fit, so the game is a lower bound on what an attacker
with references trained as the target was (the other nodes' data, the ring, the buffers) would reach. A node's
references serve every strategy whose recorded training settings match (they depend on nothing else).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from fedcli.audit import lira
from fedcli.audit.effects import membership
from fedcli.core.rng import numpy_stream, stream_seed
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.data.node_data import NodeImages
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment.paths import federate_dir
from fedcli.federate import engine
from fedcli.federate.config import ENGINE_OPTIONS, FederateConfig, SharedOptions
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.base import NODES
from fedcli.generators.groups import complementary_halves, matched_groups
from fedcli.predict import load_model
from fedcli.training.settings import LocalTrainer

STATISTIC = "log(p / (1 - p)) of the true class: its logit minus the logsumexp of the other logits"
LOSS_ATTACK = "Yeom et al. 2018: the true label's cross-entropy under the model in eval mode, lower = member"
APPROXIMATE = ("per-node references, each trained as the standalone strategy trains (LocalTrainer, the federation's "
               "recorded settings) on the node's images alone; the target trained federated, so their IN/OUT "
               "distributions match its own only in how much one image moves a model trained on it: the game is a "
               "lower bound on what an attacker with references trained as the target was gets")
# recorded options that say where or how a run executed, not how a node trains
NOT_TRAINING = ("exp", "strategy", "fold", "cv", "seed", "device", "resume", "overwrite", *ENGINE_OPTIONS)
BATCH = 256  # images per forward pass


@dataclasses.dataclass
class Pool:
    """A node's audited images: `members` train images first, then as many class-matched test images; and its
    train images outside the pool, which every reference sees as the target did."""

    images: torch.Tensor  # uint8
    labels: torch.Tensor
    members: int
    outside: TensorSource
    train_images: int

    @property
    def is_member(self) -> np.ndarray:
        return (np.arange(len(self.labels)) < self.members).astype(int)


@dataclasses.dataclass
class References:
    """A node's reference classifiers' statistics on its pool, (K, pool), their IN flags, and what they cost."""

    statistics: np.ndarray
    inside: np.ndarray
    steps: list[int]
    seconds: list[float]
    images_each: int
    trained_for: str  # the strategy they were trained for first (others with the same settings reuse them)


def has_final_models(exp: Path, strategy: str) -> bool:
    return any((federate_dir(exp, strategy) / "models").glob("*.safetensors"))


def final_model(exp: Path, strategy: str, key: str, config: dict, manifest: Manifest) -> nn.Module:
    """A strategy's model `key` as it ended, checked as predict loads it (on the CPU: the attacks run there)."""
    path = federate_dir(exp, strategy) / "models" / f"{key}.safetensors"
    return load_model(path, f"{strategy}'s model {key}", config["model"][0], manifest, "cpu")


def true_class_scores(logits: torch.Tensor, labels: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(cross-entropy of the true class, LiRA's statistic log(p / (1 - p)) of it), per row, in float64: the
    statistic as the true logit minus the logsumexp of the others never forms 1 - p, which rounds to 0."""
    logits = logits.double()
    rows = torch.arange(len(labels))
    true = logits[rows, labels]
    others = logits.clone()
    others[rows, labels] = -torch.inf
    loss = torch.logsumexp(logits, dim=1) - true
    return loss.numpy(), (true - torch.logsumexp(others, dim=1)).numpy()


@torch.no_grad()
def logits_of(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    model.eval()
    return torch.cat([model(to_float(images[start:start + BATCH])) for start in range(0, len(images), BATCH)])


def node_pool(manifest: Manifest, node: str, seed: int) -> Pool:
    train, test = NodeDataset(manifest, node, "train"), NodeDataset(manifest, node, "test")
    members, non_members = matched_groups(train.records, test.records, len(train), seed, node)
    outside = sorted(set(range(len(train))) - set(members))
    return Pool(torch.cat([train.images[members], test.images[non_members]]),
                torch.cat([train.labels[members], test.labels[non_members]]), len(members),
                TensorSource(train.images[outside], train.labels[outside]), len(train))


def candidate_models(exp: Path, strategy: str, nodes: list[str]) -> dict[str, dict[str, list[str]]]:
    """Per node, the final models it holds or received, each with the nodes it trained at: a shared model, every
    travelling model (node_section keeps those that visited the node), or its own, averaged over every node
    (FedBN's)."""
    declared = REGISTRY[strategy]
    if declared.model_key != NODES:
        return {node: {declared.model_key: list(nodes)} for node in nodes}
    if "model" not in declared.transfers:
        return {node: {node: list(nodes)} for node in nodes}
    paths = ring_paths(pd.read_csv(federate_dir(exp, strategy) / "comm.csv"), nodes)
    return {node: paths for node in nodes}


def ring_paths(comm: pd.DataFrame, nodes: list[str]) -> dict[str, list[str]]:
    """Each node's final model's path, from the node it was initialised at to the one it ended at: traced back
    over the rounds' model transfers (the receiver trains what its sender held)."""
    sent = comm[comm.kind == "model"]
    paths = {}
    for key in nodes:
        path = [key]
        for round_ in sorted(sent["round"].unique(), reverse=True):
            sender = sent[(sent["round"] == round_) & (sent.receiver == path[0])].sender
            if len(sender):
                path.insert(0, sender.iloc[0])
        paths[key] = path
    return paths


def standalone_config(exp: Path, config: dict) -> FederateConfig:
    """The federation's recorded training settings as a standalone run of them (what a node trains locally)."""
    shared = {f.name: config[f.name] for f in dataclasses.fields(SharedOptions)
              if f.name in config and f.name not in NOT_TRAINING}
    return FederateConfig(exp=exp, strategy=("standalone",), **shared)


def reference_trainer(cfg: FederateConfig, manifest: Manifest, images: NodeImages, seed: int, node: str,
                      k: int) -> LocalTrainer:
    """The standalone strategy's trainer, under the keyed seed of node `node`'s k-th reference."""
    return engine.build(cfg, manifest, stream_seed(seed, node, "classifier-lira-reference", k), name="standalone",
                        images=images, cross_eval=False).trainer


def train_standalone(trainer: LocalTrainer, node: str, source: TensorSource) -> tuple[nn.Module, int]:
    """A model trained as pooled.Pooled trains a standalone node's: init-epochs in round 0, then E epochs in
    each of the R rounds; with its optimiser steps."""
    model = trainer.new_model(node)
    steps = trainer.train(model, node, 0, source, None, trainer.init_epochs)
    for round_ in range(1, trainer.budget.rounds + 1):
        steps += trainer.train(model, node, round_, source, None, trainer.epochs)
    return model.eval(), steps


def train_references(cfg: FederateConfig, manifest: Manifest, node: str, pool: Pool, count: int, seed: int,
                     strategy: str) -> References:
    """`count` references of `node`, reference k on the pool's k-th half and the train images outside the pool;
    their statistics on the whole pool."""
    inside = complementary_halves(len(pool.labels), count, numpy_stream(seed, node, "classifier-lira-halves"))
    statistics, steps, seconds, images = [], [], [], NodeImages(manifest)
    for k, half in enumerate(inside):
        began = time.perf_counter()
        chosen = torch.from_numpy(np.flatnonzero(half))
        source = TensorSource.concat([pool.outside, TensorSource(pool.images[chosen], pool.labels[chosen])])
        model, taken = train_standalone(reference_trainer(cfg, manifest, images, seed, node, k), node, source)
        statistics.append(true_class_scores(logits_of(model, pool.images), pool.labels)[1])
        steps.append(taken)
        seconds.append(round(time.perf_counter() - began, 3))
    return References(np.array(statistics), inside, steps, seconds, len(pool.outside) + len(pool.labels) // 2,
                      strategy)


def attack_model(model: nn.Module, pool: Pool, references: References | None, seed: int, node: str,
                 strategy: str, key: str) -> dict:
    """The loss attack's reading of one model on a node's pool, and the LiRA game's where references exist."""
    loss, statistic = true_class_scores(logits_of(model, pool.images), pool.labels)
    out = {"loss": membership(loss, pool.is_member, numpy_stream(seed, node, "classifier-membership", strategy, key))}
    if references is not None:
        rows = np.vstack([references.statistics, statistic[None]])
        inside = np.vstack([references.inside, pool.is_member.astype(bool)[None]])
        out["lira"] = lira.game(rows, inside, len(references.statistics), 1 / (10 * pool.train_images),
                                numpy_stream(seed, node, "classifier-lira-game", strategy, key))
    return out


def target_kind(strategy: str) -> str:
    declared = REGISTRY[strategy]
    if declared.model_key != NODES:
        return f"{declared.model_key} model"
    return "travelling classifiers" if "model" in declared.transfers else "node models"


def attack(exp: Path, configs: dict[str, dict], manifest: Manifest, nodes: list[str], count: int,
           seed: int) -> dict[str, dict]:
    """Each strategy of `configs` (its recorded federate config) with final models: the `membership` section of
    its attacks summary. References are trained once per node and training settings."""
    pools = {node: node_pool(manifest, node, seed) for node in nodes}
    trained: dict[tuple[str, str], References] = {}
    out = {}
    for strategy, config in configs.items():
        if not has_final_models(exp, strategy):
            continue
        cfg = standalone_config(exp, config)
        settings = json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str)
        held = candidate_models(exp, strategy, manifest.node_names)
        section = {}
        for node in nodes:
            pool = pools[node]
            if count and pool.members and (node, settings) not in trained:
                trained[node, settings] = train_references(cfg, manifest, node, pool, count, seed, strategy)
            section[node] = node_section(exp, strategy, config, manifest, node, pool, held[node],
                                         trained.get((node, settings)), seed)
        out[strategy] = {"settings": membership_settings(strategy, count), "nodes": section}
    return out


def node_section(exp: Path, strategy: str, config: dict, manifest: Manifest, node: str, pool: Pool,
                 candidates: dict[str, list[str]], references: References | None, seed: int) -> dict:
    """One node's readings: every candidate model that trained at the node attacked on its pool; the others named
    with their path (a travelling model that never reached the node: its members are none of the node's)."""
    section = {"members": pool.members, "non_members": pool.members, "train_images": pool.train_images}
    if not pool.members:
        return section | {"not_attacked": "no class its train and test splits share: no class-matched pool"}
    section["delta"] = 1 / (10 * pool.train_images)
    section["models"] = {key: {"trained_at": path} | attack_model(final_model(exp, strategy, key, config, manifest),
                                                                  pool, references, seed, node, strategy, key)
                         for key, path in candidates.items() if node in path}
    section["not_trained_here"] = {key: path for key, path in candidates.items() if node not in path}
    if references is not None:
        section["references"] = {"count": len(references.steps), "steps": references.steps,
                                 "seconds": references.seconds, "images_each": references.images_each,
                                 "trained_for": references.trained_for}
    return section


def membership_settings(strategy: str, count: int) -> dict:
    return {"references": count, "target": target_kind(strategy), "statistic": STATISTIC, "loss_attack": LOSS_ATTACK,
            "references_approximate": APPROXIMATE if count else None,
            "pool": "members: the node's class-matched train images; non-members: as many class-matched test images"}
