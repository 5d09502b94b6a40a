"""`audit-privacy --shared`: reconstruction attacks on what each federation in `<exp>/federate` shared besides
synthetic images, white box (the attacker holds the network that computed what it saw), as the journal version of
the generative-replay study attacks FedReplay (Qu et al.: 20,000 AdamW iterations; `--attack-iterations` caps them
for the CPU, with `--attack-restarts` starts per image instead).

- FedReplay's uploaded latents (`shared/latents.safetensors`): model inversion through the frozen encoder (the
  published model's bottom up to the cut, which every node received), eval mode, the first `--attack-images`
  latents of each node.
- SplitNN's cut-layer activations (`shared/activations.safetensors`): model inversion through the bottom as it
  was at that step, in training mode (BatchNorm normalised by the batch, as when the activations were computed),
  the whole batch jointly.
- One local step's gradient under a model-averaging strategy (one whose nodes' models meet in an all-reduce):
  Geiping et al.'s gradient inversion at batch 1, 4 and 8 of each node's first training images, on the published
  global model in training mode, as the reference study sets it; batch 1's label read off the bias gradient
  (iDLG), larger batches' labels given (Geiping et al.'s assumption). What a peer sees of a whole round is less:
  fedcli's all-reduce hands every node only the weighted sum of all updates, so with more than two nodes no
  single node's update is visible to anyone (summary.json says so); with two, a peer recovers the other's by
  subtracting its own. That round update is attacked too, for the first round, whose start every node knows (the
  common initial model): minus the first node's update (`shared/updates`) taken as the gradient of the mean loss
  over all of its training images at the start, with their labels (Geiping et al.'s approximation of a multi-step
  update; local Adam steps make it a loose one), at most ROUND_UPDATE_IMAGES images.
- Every strategy's final classifiers, for membership (audit/classifier_membership.py: the loss attack, and with
  `--classifier-references K` the LiRA game); a strategy that shares whole models alone (FedER's travelling ones)
  is attacked for membership only.
- A batch's reconstructions come out in no particular order: each is scored against the original the assignment
  of least total squared error gives it (Hungarian; Geiping et al. reorder so).

Each reconstruction is scored against its original and against the nearest real image of its node outside the
attacked set (PSNR, SSIM and LPIPS, audit/scores.py): "reconstructed" means closer to that patient than to any
other. Beside it, chance: the share that as many real images of other patients of the node (decoys, drawn by the
seed) reach under the same scoring, matched to a batch as its reconstructions are, so a failed attack's share is
read against what matching alone hands it. Writes `<exp>/attacks/<strategy>/`: reconstructions.csv, summary.json,
reconstructions.png, config.json.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from fedcli.audit import classifier_membership, figures, inversion, scores
from fedcli.audit.effects import clopper_pearson
from fedcli.core.errors import UserError
from fedcli.core.rng import stream_seed, torch_stream
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifact_kinds import file_sha256, record_files
from fedcli.experiment.artifacts import (check_output_free, load_tensors, provenance, read_json, staged_output,
                                         write_csv, write_json)
from fedcli.experiment.paths import attacks_dir, federate_dir
from fedcli.federate.strategies import REGISTRY
from fedcli.models.classifier import build_classifier
from fedcli.models.cuts import split

GRADIENT_BATCHES = (1, 4, 8)  # the reference study's
ROUND_UPDATE_IMAGES = 128  # a round update over more images is not attacked (the inversion's cost grows with them)
SCORES = ("psnr", "ssim", "lpips")


@dataclasses.dataclass
class Attack:
    """One attack on one node's shared data: what the attacker rebuilt, and the real images it came from."""

    node: str
    attack: str  # "latents", "activations", "gradient", "round update"
    batch: int  # images attacked jointly
    index: torch.Tensor  # positions in the node's training set
    reconstructions: torch.Tensor  # [-1, 1]
    seconds: float

    @property
    def matched(self) -> bool:
        """Whether its reconstructions were put in the order that matches the batch best (a gradient's come out in
        none)."""
        return self.attack in ("gradient", "round update") and self.batch > 1


RECONSTRUCTED_TRANSFERS = ("latents", "activations", "all-reduce")
ATTACKED_TRANSFERS = (*RECONSTRUCTED_TRANSFERS, "model")  # a model sent whole is attacked for membership


def may_share(strategy: str) -> bool:
    """Whether a strategy sends something these attacks read: latents, activations, models to an all-reduce, or
    models themselves."""
    return any(kind in REGISTRY[strategy].transfers for kind in ATTACKED_TRANSFERS)


def shared_strategies(exp: Path) -> list[str]:
    """The federated strategies whose outputs an attack reads, in the registry's order."""
    return [name for name in REGISTRY.names() if may_share(name) and attackable(exp, name)]


def attackable(exp: Path, strategy: str) -> bool:
    """Whether a strategy that may share left what an attack reads: kept latents or activations, or its models."""
    folder = federate_dir(exp, strategy)
    kept = (folder / "shared" / "latents.safetensors", folder / "shared" / "activations.safetensors")
    return any(path.is_file() for path in kept) or classifier_membership.has_final_models(exp, strategy)


def averaged_model(exp: Path, strategy: str) -> bool:
    """Whether a strategy's nodes' models meet in an all-reduce and it published the global model the gradient
    attacks run on."""
    return "all-reduce" in REGISTRY[strategy].transfers and (
        federate_dir(exp, strategy) / "models" / f"{REGISTRY[strategy].model_key}.safetensors").is_file()


def federate_config(exp: Path, strategy: str, manifest: Manifest) -> dict:
    folder = federate_dir(exp, strategy)
    meta = read_json(folder / "config.json", f"config of strategy {strategy}")
    if (meta.get("inputs") or {}).get("manifest") != manifest.content_hash:
        raise UserError(f"strategy {strategy} was trained on an earlier partition of {exp}; re-run fedcli federate "
                        f"--exp {exp} --strategy {strategy} --overwrite before auditing what it shared")
    if len(meta["config"]["model"]) != 1:
        raise UserError(f"strategy {strategy} trained several architectures ({', '.join(meta['config']['model'])}); "
                        "the shared-data attacks need one: audit a run with one --model")
    return meta["config"]


def kept_record(exp: Path, strategy: str, name: str, needed: str) -> dict[str, torch.Tensor]:
    """A federation's kept sample of what it sent, refused when it predates what the attack needs."""
    kept = load_tensors(federate_dir(exp, strategy) / "shared" / f"{name}.safetensors", f"{strategy}'s {name}")
    if needed not in kept:
        raise UserError(f"{strategy}'s kept {name} carry no {needed.rsplit('/', 1)[-1]} (an earlier fedcli kept less); "
                        f"re-run fedcli federate --exp {exp} --strategy {strategy} --overwrite")
    return kept


def global_model(exp: Path, strategy: str, config: dict, manifest: Manifest) -> nn.Module:
    """The published model, checked as predict loads it (on the CPU: the attacks run there)."""
    return classifier_membership.final_model(exp, strategy, REGISTRY[strategy].model_key, config, manifest)


def attack_latents(exp: Path, strategy: str, config: dict, manifest: Manifest, nodes: list[str], images: int,
                   settings: inversion.InversionSettings, seed: int) -> list[Attack]:
    kept = kept_record(exp, strategy, "latents", "index")
    encoder, _ = split(global_model(exp, strategy, config, manifest), config["model"][0], config["cut"])
    attacks = []
    for node in nodes:
        rows = torch.nonzero(kept["node"] == manifest.node_names.index(node)).flatten()[:images]
        index = kept["index"][rows]
        started = time.perf_counter()
        rebuilt = inversion.invert_features(encoder, kept["latents"][rows], image_shape(manifest), settings,
                                            [torch_stream(seed, node, "attack", strategy, int(i)) for i in index])
        attacks.append(Attack(node, "latents", 1, index, rebuilt, time.perf_counter() - started))
    return attacks


def attack_activations(exp: Path, strategy: str, config: dict, manifest: Manifest, nodes: list[str],
                       settings: inversion.InversionSettings, seed: int) -> list[Attack]:
    kept = kept_record(exp, strategy, "activations", f"{manifest.node_names[0]}/index")
    attacks = []
    for node in nodes:
        bottom, _ = split(build_classifier(config["model"][0], manifest["channels"], manifest.num_classes,
                                           init_seed=0), config["model"][0], config["cut"])
        prefix = f"{node}/bottom/"
        bottom.load_state_dict({k.removeprefix(prefix): v for k, v in kept.items() if k.startswith(prefix)})
        index = kept[f"{node}/index"]
        started = time.perf_counter()
        rebuilt = inversion.invert_features(bottom, kept[f"{node}/activations"], image_shape(manifest), settings,
                                            [torch_stream(seed, node, "attack", strategy, int(i)) for i in index],
                                            batch_statistics=True)
        attacks.append(Attack(node, "activations", len(index), index, rebuilt, time.perf_counter() - started))
    return attacks


def attack_gradients(exp: Path, strategy: str, config: dict, manifest: Manifest, nodes: list[str],
                     settings: inversion.InversionSettings, seed: int) -> tuple[list[Attack], list[str]]:
    """One local step's gradient at each batch size and node, and the first round's update of a two-node
    federation; with the reasons a round update was not attacked."""
    model = global_model(exp, strategy, config, manifest).train()
    attacks, notes = [], []
    for node in nodes:
        train = NodeDataset(manifest, node, "train")
        for batch in [b for b in GRADIENT_BATCHES if b <= len(train)]:
            index = torch.arange(batch)
            originals = to_float(train.images[index])
            observed = inversion.batch_gradient(model, originals, train.labels[index])
            labels = inversion.labels_from_bias_gradient(observed[-1]) if batch == 1 else train.labels[index]
            started = time.perf_counter()
            rebuilt = inversion.invert_gradient(model, observed, labels, image_shape(manifest), settings,
                                                torch_stream(seed, node, "attack", strategy, "gradient", batch))
            attacks.append(Attack(node, "gradient", batch, index, in_matched_order(rebuilt, originals),
                                  time.perf_counter() - started))
    first = manifest.node_names[0]
    updates = federate_dir(exp, strategy) / "shared" / "updates.safetensors"
    if config.get("pretrained"):
        notes.append("round update: not attacked; its start is the pretrained backbone, which the audit does not load")
    elif len(manifest.node_names) != 2:
        notes.append(f"round update: not attacked; with {len(manifest.node_names)} nodes the all-reduce hands every "
                     "node only the sum of the others' updates, so no single node's update is seen by anyone")
    elif first in nodes and updates.is_file():
        train = NodeDataset(manifest, first, "train")
        if len(train) > ROUND_UPDATE_IMAGES:
            notes.append(f"round update: not attacked; node {first}'s update spans its {len(train)} training images, "
                         f"more than the {ROUND_UPDATE_IMAGES} this attack takes")
        else:
            attacks.append(attack_round_update(strategy, config, manifest, train, first,
                                               load_tensors(updates, f"{strategy}'s kept updates"), settings, seed))
    return attacks, notes


def attack_round_update(strategy: str, config: dict, manifest: Manifest, train: NodeDataset, node: str,
                        updates: dict[str, torch.Tensor], settings: inversion.InversionSettings, seed: int) -> Attack:
    """The first node's round-0 update, as its peer in a two-node FedAvg recovers it, inverted as one gradient of
    every training image's mean loss at the common initial model."""
    start = build_classifier(config["model"][0], manifest["channels"], manifest.num_classes,
                             stream_seed(config["seed"], "model-init", REGISTRY[strategy].model_key)).train()
    observed = [-updates[f"round0/{name}"] for name, _ in start.named_parameters()]
    started = time.perf_counter()
    rebuilt = inversion.invert_gradient(start, observed, train.labels, image_shape(manifest), settings,
                                        torch_stream(seed, node, "attack", strategy, "round-update"))
    return Attack(node, "round update", len(train), torch.arange(len(train)),
                  in_matched_order(rebuilt, to_float(train.images)), time.perf_counter() - started)


def image_shape(manifest: Manifest) -> tuple[int, int, int]:
    return manifest["channels"], manifest["image_size"], manifest["image_size"]


def attacks_on(exp: Path, strategy: str, manifest: Manifest, nodes: list[str], images: int,
               settings: inversion.InversionSettings, seed: int) -> tuple[list[Attack], list[str]]:
    """A strategy's attacks, and what was not attacked and why."""
    config = federate_config(exp, strategy, manifest)
    shared = federate_dir(exp, strategy) / "shared"
    if (shared / "latents.safetensors").is_file():
        return attack_latents(exp, strategy, config, manifest, nodes, images, settings, seed), []
    if (shared / "activations.safetensors").is_file():
        return attack_activations(exp, strategy, config, manifest, nodes, settings, seed), []
    if not averaged_model(exp, strategy):
        return [], [f"reconstruction: not attacked; {strategy} kept no latents or activations and published no "
                    "averaged global model for the gradient attacks; its final models are attacked for membership"]
    return attack_gradients(exp, strategy, config, manifest, nodes, settings, seed)


def in_matched_order(reconstructions: torch.Tensor, originals: torch.Tensor) -> torch.Tensor:
    """The reconstructions reordered so that the i-th faces the original the least-total-squared-error
    assignment gives it (a gradient attack's batch comes out in no particular order)."""
    from scipy.optimize import linear_sum_assignment

    errors = torch.cdist(reconstructions.flatten(1).double(), originals.flatten(1).double()).square()
    rows, columns = linear_sum_assignment(errors.numpy())
    order = torch.empty(len(columns), dtype=torch.long)
    order[torch.as_tensor(columns)] = torch.as_tensor(rows)
    return reconstructions[order]


def scored(attacks: list[Attack], manifest: Manifest, perceptual, seed: int) -> pd.DataFrame:
    """One row per reconstructed image: its scores against the original and the nearest real image of its node
    outside the attacked set, and whether its decoy (`chance_reconstructed_*`) reached its original so."""
    rows, datasets = [], {}
    for attack in attacks:
        if attack.node not in datasets:  # each node's images read once for all its attacks
            datasets[attack.node] = tuple(NodeDataset(manifest, attack.node, part) for part in ("train", "test"))
        train, test = datasets[attack.node]
        outside = torch.ones(len(train), dtype=torch.bool)
        outside[attack.index] = False
        others = to_float(torch.cat([train.images[outside], test.images]))
        originals = to_float(train.images[attack.index])
        result = scores.reconstruction_scores(perceptual, attack.reconstructions, originals, others)
        chance = decoy_scores(attack, originals, others, perceptual, seed)
        for k, i in enumerate(attack.index.tolist()):
            rows.append({"node": attack.node, "attack": attack.attack, "batch": attack.batch,
                         "id": train.records[i]["id"], "index": i}
                        | {name: float(value[k]) if value.is_floating_point() else int(value[k])
                           for name, value in result.items()}
                        | {f"chance_reconstructed_{name}": int(chance[f"reconstructed_{name}"][k]) for name in SCORES})
    return pd.DataFrame(rows)


def decoy_scores(attack: Attack, originals: torch.Tensor, others: torch.Tensor, perceptual,
                 seed: int) -> dict[str, torch.Tensor]:
    """As many of `others` (real images of other patients) as the attack rebuilt, drawn by the seed, matched to the
    originals as the attack's reconstructions were, and scored as they are against the rest of `others`."""
    if len(others) <= len(originals):
        raise UserError(f"node {attack.node} holds {len(others)} images outside the {len(originals)} its "
                        f"{attack.attack} attack rebuilt, too few to draw as many decoys and leave others to compare "
                        "with; lower --attack-images, or partition with more test images per node")
    order = torch.randperm(len(others), generator=torch_stream(seed, attack.node, "attack-decoys", attack.attack,
                                                                attack.batch))
    decoys, rest = others[order[:len(originals)]], others[order[len(originals):]]
    return scores.reconstruction_scores(perceptual, in_matched_order(decoys, originals) if attack.matched else decoys,
                                        originals, rest)


def summarize(frame: pd.DataFrame) -> list[dict]:
    """Per node, attack and batch: the mean scores, and the share reconstructed under each score with its exact 95%
    interval."""
    out = []
    if frame.empty:  # a strategy attacked for membership only
        return out
    for (node, attack, batch), group in frame.groupby(["node", "attack", "batch"], sort=False):
        reconstructed, chance = {}, {}
        for name in SCORES:
            for shares, column in ((reconstructed, f"reconstructed_{name}"), (chance, f"chance_reconstructed_{name}")):
                hits, n = int(group[column].sum()), len(group)
                low, high = clopper_pearson(hits, n)
                shares[name] = {"share": hits / n, "ci_low": low, "ci_high": high}
        out.append({"node": node, "attack": attack, "batch": int(batch), "images": len(group)}
                   | {f"{name}_mean": float(group[name].mean()) for name in SCORES}
                   | {f"{name}_nearest_other_mean": float(group[f"{name}_nearest_other"].mean()) for name in SCORES}
                   | {"reconstructed": reconstructed, "chance": chance})
    return out


def write(out: Path, strategy: str, attacks: list[Attack], notes: list[str], frame: pd.DataFrame,
          manifest: Manifest, config: dict, settings: inversion.InversionSettings, inputs: dict, seed: int,
          membership: dict | None) -> dict:
    summary = {"strategy": strategy, "settings": dataclasses.asdict(settings), "attacks": summarize(frame),
               "notes": notes} | ({"membership": membership} if membership else {})
    write_csv(out / "reconstructions.csv", frame)
    write_json(out / "summary.json", summary)
    rows = []
    for attack in attacks:
        originals = to_float(NodeDataset(manifest, attack.node, "train").images[attack.index])
        label = f"{attack.node} {attack.attack}" + (f" ({attack.batch} images)" if attack.batch > 1 else "")
        rows += [(f"{label}: original", figures.to_display(originals[:8])),
                 (f"{label}: reconstruction", figures.to_display(attack.reconstructions[:8]))]
    if rows:
        figures.image_rows(out / "reconstructions.png", rows, f"{strategy}: what an attacker rebuilds from what it saw")
    costs = {f"{a.node}/{a.attack}/{a.batch}": round(a.seconds, 2) for a in attacks}
    write_json(out / "config.json", provenance("audit-privacy --shared", config, seed, inputs)
               | {"seconds": costs, "files": record_files(out)})
    return summary


def run_attacks(exp: Path, manifest: Manifest, nodes: list[str], images: int, settings: inversion.InversionSettings,
                seed: int, perceptual, overwrite: bool, classifier_references: int = 0) -> dict[str, dict]:
    """Every attackable strategy's attacks, each strategy's folder written whole once every attack has run (a
    refused input leaves no folder behind); their summaries by strategy. `classifier_references`: the LiRA
    game's reference classifiers per node (0: the loss attack alone)."""
    strategies = shared_strategies(exp)
    if not strategies:
        raise UserError(f"no federation in {exp / 'federate'} shared latents, activations or models an attack reads "
                        "(fedreplay, splitnn or a model-averaging strategy); run fedcli federate first, or drop "
                        "--shared")
    for strategy in strategies:
        check_output_free(attacks_dir(exp, strategy), overwrite)
    attacked = {strategy: attacks_on(exp, strategy, manifest, nodes, images, settings, seed) for strategy in strategies}
    frames = {strategy: scored(attacks, manifest, perceptual, seed) for strategy, (attacks, _) in attacked.items()}
    membership = classifier_membership.attack(exp, {s: federate_config(exp, s, manifest) for s in strategies},
                                              manifest, nodes, classifier_references, seed)
    summaries = {}
    for strategy, (attacks, notes) in attacked.items():
        frame = frames[strategy]
        folder = federate_dir(exp, strategy)
        inputs = {"manifest": manifest.content_hash, "federate": file_sha256(folder / "config.json")}
        with staged_output(attacks_dir(exp, strategy), overwrite) as out:
            summaries[strategy] = write(out, strategy, attacks, notes, frame, manifest,
                                        {"nodes": nodes, "images": images, "settings": dataclasses.asdict(settings),
                                         "classifier_references": classifier_references},
                                        settings, inputs, seed, membership.get(strategy))
    return summaries
