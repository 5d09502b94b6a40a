"""train-gan's work on the nodes this process trains: the checks before training (the kind's options, the
nodes' labels and folders), training and writing each node's folder, resampling a trained node's buffer, and
what `fedcli run` checks before anything trains (`preflight`). The stage's entry, which chooses the engine, is
fedcli/generators/stage.py; the distributed engine's chain, fedcli/generators/distributed.py, calls this module too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from fedcli.comm.transport import Transport
from fedcli.core import console
from fedcli.core.devices import resolve_device
from fedcli.core.errors import UserError
from fedcli.core.progress import StepProgress
from fedcli.data.dataset import NodeDataset
from fedcli.data.label_parts import unlabelled_nodes
from fedcli.data.manifest import Manifest
from fedcli.data.tensor_source import TensorSource
from fedcli.experiment import events
from fedcli.experiment.artifact_kinds import CONFIG, file_record, file_sha256, record_files, stale_inputs
from fedcli.experiment.artifacts import provenance, read_json, save_tensors, staged_output, write_csv, write_json
from fedcli.experiment.config import settled, to_json, user_fields
from fedcli.experiment.paths import BUFFER, GENERATOR, GENERATOR_CONTROL, GENERATOR_PHASE1, gan_dir
from fedcli.generators import fidelity
from fedcli.generators.buffer import buffer_metadata, sample_buffer
from fedcli.generators.config import GAN_ENGINE_OPTIONS, CommonOptions, GanConfig
from fedcli.generators.protocol import CONTROL, RELEASED, STANDARD, GeneratorKind, NodeTrainer, Sampler, Trained
from fedcli.generators.record import kind_name, read_gan_config
from fedcli.generators.registry import generator_kind, load_generator, own_options
from fedcli.generators.samples import write_samples

ROLE_FILES = {RELEASED: GENERATOR, STANDARD: GENERATOR_PHASE1, CONTROL: GENERATOR_CONTROL}
COMMON_OPTIONS = frozenset(f.name for f in dataclasses.fields(CommonOptions))  # what train-gan reads, every kind


RUN_LOCAL = frozenset({"exp", "node", "overwrite", "threads"}) | GAN_ENGINE_OPTIONS  # where and how fast, not what


def run_nodes(cfg: GanConfig, manifest: Manifest, nodes: list[str], keep_finished: bool,
              transport: Transport | None = None, device: str | None = None) -> list[dict]:
    """`run`, with the nodes' folders locked; a distributed rank (fedcli/generators/distributed.py) gives its node, its
    transport and its device."""
    seed = manifest.stage_seed(cfg.seed)
    device = device or resolve_device(cfg.device)
    if cfg.sample_only:
        return [resample(cfg, manifest, node, seed, device) for node in nodes]
    kind = check_settings(cfg, manifest, nodes)
    check_nodes_free(cfg, nodes, getattr(kind, "serial", False))
    kept = {node: summary for node in nodes if keep_finished and (summary := finished(cfg, node)) is not None}
    todo = [node for node in nodes if node not in kept]
    for node in kept:
        console.out.print(f"node {node}: kept, made by this same configuration before an interruption")
    trainer = node_trainer(cfg, manifest, kind, nodes, todo, seed, device, transport)
    with events.stage_log(cfg.exp, "train-gan", nodes=todo):  # the FID checks, as they come (generators/progress.py)
        summaries = [kept[node] if node in kept else train_node(cfg, manifest, kind, trainer, node, seed, device)
                     for node in nodes]
    if hasattr(trainer, "finish"):
        trainer.finish()
    return summaries


def node_trainer(cfg: GanConfig, manifest: Manifest, kind: GeneratorKind, nodes: list[str], todo: list[str], seed: int,
                 device: str, transport: Transport | None) -> NodeTrainer | None:
    """The kind's trainer of the nodes still `todo` (None when none is), built before the stage's log opens: what it
    refuses (a weights file, a DP plan) leaves the experiment as it was."""
    if not todo:
        return None
    if getattr(kind, "serial", False):  # one chain over every node; this process holds `nodes`
        return kind.trainer(cfg, manifest, manifest.node_names, seed, device, nodes, transport)
    return kind.trainer(cfg, manifest, todo, seed, device)


def check_settings(cfg: GanConfig, manifest: Manifest, nodes: list[str]) -> GeneratorKind:
    """Refuse options the kind does not read, a buffer without room for every class and unlabelled nodes;
    returns the kind."""
    kind = generator_kind(cfg.generator)
    check_options(cfg, kind)
    for node in nodes:
        check_buffer_size(cfg.buffer_size, node_classes(manifest, node), node)
    check_labelled(manifest, trained_nodes(kind, manifest, nodes))
    return kind


def trained_nodes(kind: GeneratorKind, manifest: Manifest, nodes: list[str]) -> list[str]:
    """The nodes whose images train the chosen ones' generators: a serial kind's chain runs over every node."""
    return manifest.node_names if getattr(kind, "serial", False) else nodes


def preflight(cfg: GanConfig) -> None:
    """What train-gan on this partitioned experiment would refuse before training, checked without training
    (`fedcli run` checks every sub-experiment's before the first trains)."""
    manifest = Manifest.load(cfg.exp)
    nodes = manifest.chosen(cfg.node)
    kind = check_settings(cfg, manifest, nodes)
    kind.plans(cfg, manifest, trained_nodes(kind, manifest, nodes), manifest.stage_seed(cfg.seed))


def check_nodes_free(cfg: GanConfig, nodes: list[str], serial: bool = False) -> None:
    """Without --overwrite, no node's folder exists; after an interrupted run, the line names the nodes still to
    train (`--node` trains one; a serial kind trains them all) as well as --overwrite."""
    done = [node for node in nodes if gan_dir(cfg.exp, node).exists()]
    if not done or cfg.overwrite:
        return
    rest = [node for node in nodes if node not in done]
    left = (f"; train the nodes without one ({', '.join(rest)}) with fedcli train-gan --node NAME each, or pass "
            "--overwrite to retrain every node") if rest and not serial else "; pass --overwrite to replace it"
    others = f" (as do those of {', '.join(done[1:])})" if done[1:] else ""
    raise UserError(f"{gan_dir(cfg.exp, done[0])} already exists{others}{left}")


def finished(cfg: GanConfig, node: str) -> dict | None:
    """The summary of a node folder made by this configuration (up to where and how fast), whose files still
    hash to its record and whose partition is this one; None otherwise."""
    folder = gan_dir(cfg.exp, node)
    try:
        saved = read_json(folder / CONFIG, "GAN config")
    except UserError:
        return None
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
        return None
    ours = settled({k: v for k, v in to_json(cfg).items() if k not in RUN_LOCAL})
    theirs = settled({k: v for k, v in saved["config"].items() if k not in RUN_LOCAL})
    if ours != theirs or saved.get("files") != record_files(folder) or stale_inputs(folder / CONFIG):
        return None
    return summary(saved)


def summary(saved: dict) -> dict:
    """A node's summary: its config.json less provenance and files."""
    return {k: v for k, v in saved.items() if k not in {*provenance("train-gan", {}, 0, {}), "files"}}


def written(cfg: GanConfig, node: str) -> dict:
    """The summary of the node folder a process of this run wrote."""
    return summary(read_json(gan_dir(cfg.exp, node) / CONFIG, "GAN config"))


def check_options(cfg: GanConfig, kind: GeneratorKind) -> None:
    """Refuse an option the chosen kind does not read: one the user gave (at any value, its default too), or,
    in a config built in code, one changed from its default."""
    defaults = cfg.defaults()
    reads = COMMON_OPTIONS | own_options(kind)
    foreign = [f.name for f in user_fields(cfg) if f.name not in reads
               and (f.name in cfg.given or getattr(cfg, f.name) != getattr(defaults, f.name))]
    if foreign:
        flag = f"--{foreign[0].replace('_', '-')}"
        raise UserError(f"{flag} is not an option of generator kind {kind.name}; drop it")


def node_classes(manifest: Manifest, node: str) -> list[int]:
    return sorted({r["label"] for r in manifest.records(node, "train")})


def check_labelled(manifest: Manifest, nodes: list[str]) -> None:
    """Every node that trains (a serial kind: every node of the chain) holds labelled images."""
    labels = manifest.data.get("labels")
    unlabelled = unlabelled_nodes(labels, nodes)
    if unlabelled:
        raise UserError(f"node {unlabelled[0]} holds no labelled training image (partition --labeled-nodes), and a "
                        "class-conditional generator learns from labels; partition with every node labelled")


def check_buffer_size(size: int, classes: list[int], node: str) -> None:
    if size < len(classes):
        raise UserError(f"--buffer-size {size} is smaller than node {node}'s {len(classes)} classes; "
                        f"use at least {len(classes)} so every class appears")


def train_node(cfg: GanConfig, manifest: Manifest, kind: GeneratorKind, trainer: NodeTrainer, node: str,
               seed: int, device: str) -> dict:
    """One node, in named steps: train its generators, sample (or take the decoded) buffer, score the buffer's
    fidelity, write the folder. Returns the node's summary (config.json less provenance and files)."""
    data = NodeDataset(manifest, node, "train")
    classes = node_classes(manifest, node)
    trained = trainer.train(node, data)
    buffer = trained.decoded or sample_buffer(trained.generators[RELEASED], classes, cfg.buffer_size, seed, node,
                                              device, cfg.truncation)
    scores = measure_fidelity(cfg, manifest, kind, node, seed, classes, trained.generators, TensorSource(*buffer),
                              TensorSource(data.images, data.labels), device)
    return write_node(cfg, manifest, kind, node, seed, device, classes, trained, buffer, scores)


def write_node(cfg: GanConfig, manifest: Manifest, kind: GeneratorKind, node: str, seed: int, device: str,
               classes: list[int], trained: Trained, buffer: tuple[torch.Tensor, torch.Tensor],
               scores: dict | None) -> dict:
    """The node's folder, staged and renamed into place; its summary (config.json less provenance and files)."""
    images, labels = buffer
    summary = {"node": node, "classes": classes} | trained.record
    with staged_output(gan_dir(cfg.exp, node), cfg.overwrite) as out:
        for filename, (state, metadata) in trained.files.items():
            save_tensors(out / filename, state, metadata)
        save_tensors(out / BUFFER, {"images": images, "labels": labels},
                     buffer_metadata(node, manifest.content_hash, trained.decoded is not None))
        write_csv(out / "metrics.csv", trained.metrics)
        titles = kind.titles(cfg)
        write_samples(out / "samples.png", {role: trained.generators[role] for role in titles}, titles, classes,
                      manifest["label_names"], seed, node, device, cfg.truncation)
        summary |= {"buffer": buffer_record(cfg, trained, out), "fidelity": scores}
        write_json(out / "config.json", provenance("train-gan", to_json(cfg), seed, {"manifest": manifest.content_hash})
                   | summary | {"files": record_files(out)})
    return summary


def buffer_record(cfg: GanConfig, trained: Trained, folder: Path) -> dict:
    """config.json's `buffer`: how it was made, and its hash."""
    if trained.decoded is not None:
        return {"size": len(trained.decoded[1]), "decoded": True, "sha256": file_sha256(folder / BUFFER)}
    return {"size": cfg.buffer_size, "truncation": cfg.truncation, "sha256": file_sha256(folder / BUFFER)}


def measure_fidelity(cfg: GanConfig, manifest: Manifest, kind: GeneratorKind, node: str, seed: int,
                     classes: list[int], generators: dict[str, Sampler], buffer: TensorSource, train: TensorSource,
                     device: str) -> dict | None:
    """The released buffer's fidelity, with every other generator's of the kind alongside under its role (StyleGAN:
    `phase1` and `control`; VQ-VAE-2 with a prior: `decoded`), the same buffer draws from each; None when
    --fidelity-seeds is 0. A kind with `fidelity_budget(cfg, budget, train_images, buffers)` bounds the
    `--fidelity-*` budget by what its generator costs (VQ-VAE-2: fedcli/generators/vqvae2/kind.py); config.json's
    `classifier` records the budget the score trained."""
    if not cfg.fidelity_seeds:
        return None
    test = NodeDataset(manifest, node, "test")
    others = {role: TensorSource(*sample_buffer(generator, classes, cfg.buffer_size, seed, node, device,
                                                cfg.truncation)) for role, generator in generators.items()
              if role != RELEASED}
    budget = fidelity.config_budget(cfg, manifest)
    if hasattr(kind, "fidelity_budget"):
        budget = kind.fidelity_budget(cfg, budget, len(train), 1 + len(others))
    with StepProgress("train-gan", f"{node} fidelity score"):  # classifiers to train: a log goes on saying so
        scores = fidelity.score({"released": buffer, **others}, train, TensorSource(test.images, test.labels),
                                budget, in_channels=manifest["channels"], num_classes=manifest.num_classes,
                                seed=seed, node=node, device=device)
    chance = fidelity.chance_accuracy(test.labels)
    return scores["released"] | {name: scores[name] for name in others} | {
        "test_images": len(test), "classifier": dataclasses.asdict(budget)} | fidelity.shortfalls(
        scores["released"], scores.get(CONTROL), chance, len(test))


def resample(cfg: GanConfig, manifest: Manifest, node: str, seed: int, device: str) -> dict:
    """Write a buffer of another size or truncation from the saved released generator, and score its
    fidelity again."""
    folder = gan_dir(cfg.exp, node)
    saved = read_gan_config(cfg.exp, manifest, node)
    if saved.get("buffer", {}).get("decoded"):
        raise UserError(f"node {node}'s buffer is decoded codes of its real images, not samples; re-run fedcli "
                        "train-gan --overwrite instead of --sample-only")
    kind = generator_kind(kind_name(saved))
    if getattr(kind, "serial", False):
        raise UserError(f"--sample-only re-samples per-node generators; node {node}'s {kind_name(saved)} was trained "
                        "serially with its prior: re-run fedcli train-gan --overwrite with the new --buffer-size")
    classes = saved["classes"]
    check_buffer_size(cfg.buffer_size, classes, node)
    generators = {role: load_generator(folder, filename, saved, device) for role, filename in ROLE_FILES.items()}
    images, labels = sample_buffer(generators[RELEASED], classes, cfg.buffer_size, saved["seed"], node, device,
                                   cfg.truncation)
    data = NodeDataset(manifest, node, "train")
    saved["fidelity"] = measure_fidelity(cfg, manifest, kind, node, saved["seed"], classes, generators,
                                         TensorSource(images, labels), TensorSource(data.images, data.labels), device)
    save_tensors(folder / BUFFER, {"images": images, "labels": labels}, buffer_metadata(node, manifest.content_hash))
    record = file_record(folder / BUFFER)
    saved["buffer"] = {"size": cfg.buffer_size, "truncation": cfg.truncation, "sha256": record["sha256"]}
    saved["files"] = {**saved.get("files", {}), BUFFER: record}
    write_json(folder / "config.json", saved)
    console.out.print(f"node {node}: wrote a buffer of {cfg.buffer_size} images")
    return saved
