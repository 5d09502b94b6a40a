"""The `audit-privacy` stage: how much of a node's real patients its generators and buffer reveal.

For each node: members (train images, seen by the GAN) and size-matched, class-stratified
non-members (test images); the privacy-preserving generator (phase 2) and its alpha-0 control (and,
with --standard, the phase-1 generator) project every image from the same start (the standard
generator's start for the image's class: StyleGAN's class-mean w) and the same per-image random stream,
keyed by the image's id, through their kind's Invertible protocol (fedcli/generators/protocol.py). The privacy
loss's effect is the paired per-image ratio of the privacy generator's distance to the control's,
in the training LPIPS, in pixels and in an audit-only LPIPS network that shares no weights with the
loss (fedcli/audit/effects.py); projection distances also feed membership inference and
reconstruction shares (and, when train-gan made a reference GAN without the scored members, the
calibrated attack GAN-Leaks-cal: the distance under a generator minus under the reference), and the
buffer is audited by its distance to closest record and by membership from each image's nearest buffer image. A
kind with no latent (the VQ-VAE-2) is attacked through its buffer alone: each image's nearest buffer image stands
for its projection. These are empirical attack scores, not a formal privacy guarantee.

Writes `<exp>/audit/<node>/`: distances.csv, summary.json, histogram.png, pairs.png,
nearest.png, roc.png, config.json. With --shared, also the reconstruction attacks on what each federation
shared besides synthetic images (audit/shared_attacks.py, `<exp>/attacks/<strategy>/`); on an experiment
without generators, only those.
"""

from __future__ import annotations


import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from fedcli.audit import controls, effects, figures, lira, scores
from fedcli.audit.inversion import InversionSettings
from fedcli.audit.progress import ProjectionProgress
from fedcli.audit.projection import ProjectionSettings, project
from fedcli.audit.shared_attacks import run_attacks, shared_strategies
from fedcli.core import console
from fedcli.core.devices import resolve_device, with_threads
from fedcli.core.errors import UserError
from fedcli.core.rng import numpy_stream, torch_stream
from fedcli.core.weights import hub_checkpoint
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifact_kinds import AUDITED, AUDITED_CONTROLS, file_sha256, record_files
from fedcli.experiment.artifacts import check_output_free, provenance, staged_output, write_csv, write_json
from fedcli.experiment.config import AuditConfig, to_json
from fedcli.experiment.locking import locked
from fedcli.experiment.paths import BUFFER, GENERATOR_REFERENCE, attacks_dir, audit_dir, gan_dir, lira_generator
from fedcli.generators.buffer import load_buffer_file, sample_buffer
from fedcli.generators.groups import matched_groups
from fedcli.generators.perceptual import HUB_FILES, Perceptual
from fedcli.generators.private import default_delta
from fedcli.generators.record import read_gan_config
from fedcli.generators.registry import load_generator, recorded_kind

GENERATORS = {name: file for name, file in AUDITED.items() if name != "buffer"}
INDEPENDENT_SEED = 1  # the audit-only LPIPS network's backbone seed (training's random backbone uses 0)
MIN_GROUP = 200  # the audit asks for at least this many images per group where a node has them


@dataclasses.dataclass
class NodeInputs:
    """What a node's audit reads, loaded and checked before any node's projections run."""

    saved: dict  # the node's GAN config.json
    generators: dict[str, nn.Module]  # "standard", "control" and "privacy" (Invertible), on the CPU
    buffer: torch.Tensor  # uint8 images
    reseeded: nn.Module | None  # the reseeded control, with --controls
    tiny: nn.Module | None  # the tiny-node control, with --controls
    reference: nn.Module | None  # GAN-Leaks-cal's reference, when train-gan made one (--reference)
    lira: dict[str, list[nn.Module]] | None = None  # role -> the LiRA references, when train-gan made them


def check_inputs(cfg: AuditConfig, manifest: Manifest, node: str, seed: int) -> NodeInputs:
    folder = gan_dir(cfg.exp, node)
    kind = recorded_kind(read_gan_config(cfg.exp, manifest, node)) if (folder / "config.json").is_file() else None
    if kind is not None and not getattr(kind, "projectable", True):
        return check_buffer_inputs(cfg, manifest, node, kind.name)
    for name in (*GENERATORS.values(), BUFFER):
        if not (folder / name).is_file():
            raise UserError(f"node {node} has no {name} in {folder} (the audit needs the standard, control and "
                            f"privacy generators and the buffer); run fedcli train-gan --exp {cfg.exp} --overwrite")
    saved = read_gan_config(cfg.exp, manifest, node)
    check_lpips(cfg, saved, node)
    size = recorded_kind(saved).image_size(saved)
    if size != manifest["image_size"]:
        raise UserError(f"node {node}'s generator makes {size} px images but the partition has "
                        f"{manifest['image_size']} px; re-run fedcli train-gan")
    if cfg.controls and (not all((folder / f).is_file() for f in AUDITED_CONTROLS.values()) or "tiny" not in saved):
        raise UserError(f"node {node} has no {' or '.join(AUDITED_CONTROLS.values())}, which --controls audits; run "
                        f"fedcli train-gan --exp {cfg.exp} --controls --overwrite")
    generators = {name: load_generator(folder, file, saved) for name, file in GENERATORS.items()}
    reseeded, tiny = ((load_generator(folder, f, saved) for f in AUDITED_CONTROLS.values()) if cfg.controls
                      else (None, None))
    return NodeInputs(saved, generators, load_buffer_file(folder, node, manifest, saved)[0], reseeded,
                      tiny, check_reference(cfg, manifest, node, seed, saved), check_lira(cfg, manifest, node, seed, saved))


def check_buffer_inputs(cfg: AuditConfig, manifest: Manifest, node: str, kind: str) -> NodeInputs:
    """A kind with no latent to project (the VQ-VAE-2) is audited by its buffer alone: no generator is read."""
    for flag, asked in (("--standard", cfg.standard), ("--controls", cfg.controls)):
        if asked:
            raise UserError(f"{flag} projects images into GAN generators, and node {node}'s generator is a {kind} with "
                            f"no latent; drop it (a {kind} is audited by its released buffer alone)")
    folder = gan_dir(cfg.exp, node)
    if not (folder / BUFFER).is_file():
        raise UserError(f"node {node} has no {BUFFER} in {folder}; run fedcli train-gan --exp {cfg.exp} --overwrite")
    saved = read_gan_config(cfg.exp, manifest, node)
    return NodeInputs(saved, {}, load_buffer_file(folder, node, manifest, saved)[0], None, None, None)


def check_reference(cfg: AuditConfig, manifest: Manifest, node: str, seed: int, saved: dict) -> nn.Module | None:
    """The reference generator, when train-gan made one, refused if it saw any member the audit will score."""
    if "reference" not in saved:
        return None
    train = manifest.records(node, "train")
    members = matched_groups(train, manifest.records(node, "test"), cfg.max_images, seed, node)[0]
    if not {train[i]["id"] for i in members} <= set(saved["reference"]["held_out_ids"]):
        raise UserError(f"node {node}'s reference GAN was trained on some of the {len(members)} members this audit "
                        f"scores (it held out {len(saved['reference']['held_out_ids'])}, with the partition's seed); "
                        f"lower --max-images, or re-run fedcli train-gan --reference {cfg.max_images} --overwrite")
    return load_generator(gan_dir(cfg.exp, node), GENERATOR_REFERENCE, saved)


def check_lira(cfg: AuditConfig, manifest: Manifest, node: str, seed: int, saved: dict) -> dict | None:
    """The LiRA game's references by role, when train-gan made them, refused unless the audit scores exactly
    their pool (the game needs every pooled image's statistic under every reference)."""
    if "lira" not in saved:
        return None
    lira = saved["lira"]
    train, test = manifest.records(node, "train"), manifest.records(node, "test")
    members, non_members = matched_groups(train, test, cfg.max_images, seed, node)
    if [train[i]["id"] for i in members] + [test[i]["id"] for i in non_members] != lira["pool_ids"]:
        raise UserError(f"node {node}'s LiRA references were trained on a pool of {lira['members']} members and as "
                        f"many non-members, but this audit scores {len(members)} of each; pass --max-images "
                        f"{lira['members']} (or re-run fedcli train-gan --lira-references with this partition)")
    folder = gan_dir(cfg.exp, node)
    return {role: [load_generator(folder, lira_generator(k, role), saved) for k in range(lira["references"])]
            for role in lira["roles"]}


def check_lpips(cfg: AuditConfig, saved: dict, node: str) -> None:
    """The audit measures in the LPIPS network the GAN was trained against: same backbone, same weights."""
    trained = saved.get("lpips", {})
    if trained.get("net") not in HUB_FILES:
        raise UserError(f"node {node}'s GAN config names no known LPIPS backbone; re-run fedcli train-gan --overwrite")
    weights = cfg.lpips_weights or hub_checkpoint(HUB_FILES[trained["net"]])
    found = file_sha256(Path(weights)) if weights else None
    if trained.get("weights_sha256", "absent") != found:
        had = f"the {trained.get('net')} backbone with " + (f"weights {str(trained.get('weights_sha256'))[:12]}"
                                                            if trained.get("weights_sha256") else "no ImageNet weights")
        now = f"weights {found[:12]}" if found else "no ImageNet weights"
        raise UserError(f"node {node}'s GAN was trained against LPIPS {had}, but the audit has {now}; pass the "
                        "train-gan run's --lpips-weights (or put the same file in the torch hub cache), or re-run "
                        "fedcli train-gan --overwrite")


@with_threads
def run(cfg: AuditConfig) -> list[dict]:
    """The nodes' generator audits; with --shared, also the attacks on what the federations shared (`audit`
    returns both)."""
    return audit(cfg)[0]


@with_threads
def audit(cfg: AuditConfig) -> tuple[list[dict], dict[str, dict]]:
    """(each node's generator audit, each attacked strategy's attacks); --shared on an experiment where no node has
    a generator runs the attacks alone."""
    manifest = Manifest.load(cfg.exp)
    nodes = manifest.chosen(cfg.node)
    summaries = []
    if not cfg.shared or any((gan_dir(cfg.exp, node) / "config.json").is_file() for node in nodes):
        with locked(cfg.exp, [audit_dir(cfg.exp, node) for node in nodes]):
            summaries = audit_nodes(cfg, manifest, nodes)
    return summaries, attack(cfg) if cfg.shared else {}


@with_threads
def attack(cfg: AuditConfig) -> dict[str, dict]:
    """The reconstruction attacks on what the federations shared (audit/shared_attacks.py), by strategy."""
    manifest = Manifest.load(cfg.exp)
    with locked(cfg.exp, [attacks_dir(cfg.exp, strategy) for strategy in shared_strategies(cfg.exp)]):
        settings = InversionSettings(iterations=cfg.attack_iterations, restarts=cfg.attack_restarts)
        seed = manifest.stage_seed(cfg.seed)
        return run_attacks(cfg.exp, manifest, manifest.chosen(cfg.node), cfg.attack_images, settings, seed,
                           Perceptual("alex", cfg.lpips_weights), cfg.overwrite,
                           classifier_references=cfg.classifier_references)


def audit_nodes(cfg: AuditConfig, manifest: Manifest, nodes: list[str]) -> list[dict]:
    """`run`, with the nodes' folders locked."""
    seed = manifest.stage_seed(cfg.seed)
    inputs = {node: check_inputs(cfg, manifest, node, seed) for node in nodes}
    for node in nodes:
        check_output_free(audit_dir(cfg.exp, node), cfg.overwrite)
    device = resolve_device(cfg.device)
    if cfg.optimize_noise and manifest["image_size"] < 128:
        console.warn(f"--optimize-noise at {manifest['image_size']} px: free noise maps can rebuild any image, "
                     "so projection distances say little about memorisation below 128 px")
    networks = {net: (fast_layout(Perceptual(net, cfg.lpips_weights), device),
                      fast_layout(Perceptual(net, random_seed=INDEPENDENT_SEED), device))
                for net in {lpips_net(inputs[node]) for node in nodes}}
    return [audit_node(cfg, manifest, node, inputs[node], seed, networks[lpips_net(inputs[node])], device)
            for node in nodes]


def lpips_net(inputs: NodeInputs) -> str:
    """The LPIPS backbone a node is measured in: its GAN's training one; alex (the attacks') for a kind trained
    without LPIPS."""
    return inputs.saved.get("lpips", {}).get("net", "alex")


def fast_layout(module: torch.nn.Module, device: str) -> torch.nn.Module:
    """channels-last: oneDNN's fast layout, 20% less per projection step on a CPU (bench/projection_throughput)."""
    return module.to(device, memory_format=torch.channels_last)


@dataclasses.dataclass
class Audited:
    """A node's audited images: members first, then the size-matched non-members."""

    images: torch.Tensor  # [-1, 1]
    labels: torch.Tensor
    ids: list[str]
    is_member: np.ndarray
    # for the verdict's scores, not for projection: each image's LPIPS to its nearest other real image of
    # the node, and each non-member's to its nearest member
    nearest_other: torch.Tensor | None = None
    non_members_to_members: torch.Tensor | None = None

    @property
    def members(self) -> int:
        return int(self.is_member.sum())


def audit_node(cfg: AuditConfig, manifest: Manifest, node: str, inputs: NodeInputs, seed: int,
               networks: tuple[Perceptual, Perceptual], device: str) -> dict:
    """One node, in named steps: the audited images, their projections into each generator, the scores,
    the folder. `networks`: the LPIPS the node's generators were trained against, and the audit-only one. A kind
    with no latent (no generator in `inputs`) is attacked through its buffer alone (`buffer_attack`)."""
    train, test = NodeDataset(manifest, node, "train"), NodeDataset(manifest, node, "test")
    audited = audited_images(cfg, train, test, networks[0], seed, node, device)
    buffer_images = to_float(inputs.buffer).to(device)
    buffer_distances = distances_to_buffer(networks[0], buffer_images, audited)
    projected = bool(inputs.generators)
    lira_frame = None
    if projected:
        start, frame, reconstructions = project_node(cfg, inputs, audited, networks, seed, node, device)
        lira_frame = project_lira(cfg, inputs, audited, networks, seed, node, device)
    else:
        frame, reconstructions = buffer_attack(buffer_images, audited, buffer_distances, networks[1])
    summary = score_node(cfg, inputs, frame, audited, buffer_distances, networks, seed, node, lira_frame)
    if cfg.controls:
        summary["controls"] = audit_controls(cfg, inputs, frame, audited, start, networks, seed, node, device)
        summary["controls"]["tiny-node"] = tiny_node_control(cfg, inputs, train, test, networks, seed, node, device)
    with staged_output(audit_dir(cfg.exp, node), cfg.overwrite) as out:
        write_csv(out / "distances.csv", frame)
        if lira_frame is not None:
            write_csv(out / "lira_distances.csv", lira_frame)
        write_json(out / "summary.json", summary)
        if "privacy_effect" in summary:
            figures.histogram(out / "histogram.png", frame, node, networks[0].name, summary["privacy_effect"])
        figures.pairs(out / "pairs.png", audited.images[:audited.members], reconstructions, node,
                      "best projections" if projected else "nearest buffer images")
        figures.nearest(out / "nearest.png", buffer_images, audited.images,
                        *(torch.from_numpy(buffer_distances[k]) for k in ("buffer_to_real", "nearest_real")), node)
        figures.roc(out / "roc.png", frame if projected else frame.assign(generator="buffer"), node,
                    "projection LPIPS" if projected else "LPIPS to the nearest buffer image")
        write_json(out / "config.json", provenance("audit-privacy", to_json(cfg), seed,
                                                   audited_hashes(cfg, manifest, node, inputs))
                   | {"files": record_files(out)})
    return summary


def audited_images(cfg: AuditConfig, train: NodeDataset, test: NodeDataset, perceptual: Perceptual, seed: int,
                   node: str, device: str) -> Audited:
    """The node's matched members and non-members, with their real-to-real nearest distances."""
    member_idx, non_member_idx = matched_groups(train.records, test.records, cfg.max_images, seed, node)
    if len(member_idx) < min(MIN_GROUP, cfg.max_images):
        console.warn(f"node {node}: {len(member_idx)} images per group (members and non-members), fewer than "
                     f"{MIN_GROUP}: the scores are noisy")
    images = to_float(torch.cat([train.images[member_idx], test.images[non_member_idx]])).to(device)
    # one LPIPS matrix, audited images to all of the node's real images (train then test), serves
    # every real-to-real nearest-neighbour distance
    real = scores.distance_matrix(perceptual, images, to_float(torch.cat([train.images, test.images])).to(device))
    own = torch.tensor(list(member_idx) + [len(train) + i for i in non_member_idx], device=device)
    return Audited(images, torch.cat([train.labels[member_idx], test.labels[non_member_idx]]).to(device),
                   [train.records[i]["id"] for i in member_idx] + [test.records[i]["id"] for i in non_member_idx],
                   np.array([1] * len(member_idx) + [0] * len(non_member_idx)),
                   scores.nearest(real, exclude=own)[0], real[len(member_idx):, member_idx].min(dim=1).values)


def project_node(cfg: AuditConfig, inputs: NodeInputs, audited: Audited, networks: tuple[Perceptual, Perceptual],
                 seed: int, node: str, device: str) -> tuple[tuple[torch.Tensor, float], pd.DataFrame, dict]:
    """The shared start, and every audited image projected into the privacy generator, its control (and,
    with --standard, the standard one; and the reference from its own start): distances and reconstructions."""
    generators = {name: fast_layout(generator, device) for name, generator in inputs.generators.items()}
    start = projection_start(generators["standard"], audited, seed, node)
    projected = {name: g for name, g in generators.items() if name != "standard" or cfg.standard}
    same = same_weights(projected["control"], projected["privacy"])  # DP: no phase 2, one generator
    if same:
        del projected["control"]
    frame, reconstructions = project_generators(cfg, projected, audited, start, networks, seed, node)
    if same:
        frame = pd.concat([frame, frame[frame.generator == "privacy"].assign(generator="control")], ignore_index=True)
        reconstructions["control"] = reconstructions["privacy"]
    if inputs.reference is not None:  # its own mapping: its own start
        reference = fast_layout(inputs.reference, device)
        frame = pd.concat([frame, project_generators(cfg, {"reference": reference}, audited,
                                                     projection_start(reference, audited, seed, node), networks,
                                                     seed, node)[0]], ignore_index=True)
    return start, frame, reconstructions


def project_lira(cfg: AuditConfig, inputs: NodeInputs, audited: Audited, networks: tuple[Perceptual, Perceptual],
                 seed: int, node: str, device: str) -> pd.DataFrame | None:
    """Every audited image (the references' pool) projected into every LiRA reference of each role, each from its
    own start, as the audited generators are: rows as distances.csv's, `generator` "<role>", `reference` k."""
    if inputs.lira is None:
        return None
    frames = []
    for role, references in inputs.lira.items():
        for k, reference in enumerate(references):
            reference = fast_layout(reference, device)
            found, _ = project_generators(cfg, {role: reference}, audited,
                                          projection_start(reference, audited, seed, node), networks, seed, node)
            frames.append(found.assign(reference=k))
    return pd.concat(frames, ignore_index=True)


def lira_games(frame: pd.DataFrame, lira_frame: pd.DataFrame, record: dict, delta: float, seed: int,
               node: str) -> dict[str, dict]:
    """The LiRA game of each audited role (its generator the target, the role's references the rest), in each of
    lira.DISTANCES; `record`: train-gan's `lira` (the references' IN flags over the pool, the audited images)."""
    inside = np.array(record["inside"], bool)
    games = {}
    for role, found in lira_frame.groupby("generator", sort=False):
        target = frame[frame.generator == role]
        references = {d: np.vstack([found[found.reference == k][d].to_numpy() for k in range(len(inside))])
                      for d in lira.DISTANCES}
        games[role] = lira.distance_games({d: target[d].to_numpy() for d in lira.DISTANCES}, references, inside,
                                          target.member.to_numpy(), delta, numpy_stream(seed, node, "audit-lira", role))
    return games


def score_node(cfg: AuditConfig, inputs: NodeInputs, frame: pd.DataFrame, audited: Audited,
               buffer_distances: dict[str, np.ndarray], networks: tuple[Perceptual, Perceptual], seed: int,
               node: str, lira_frame: pd.DataFrame | None = None) -> dict:
    """summary.json less the controls: the attacks' scores, the buffer's, the LiRA game's where train-gan made its
    references, the verdict, what was measured how."""
    perceptual, independent = networks
    games = None
    if lira_frame is not None:
        delta = inputs.saved.get("dp", {}).get("delta") or default_delta(inputs.saved["train_images"])
        games = lira_games(frame, lira_frame, inputs.saved["lira"], delta, seed, node)
    summary = summarize(frame, audited, buffer_distances, cfg, seed, node, games)
    summary |= {"node": node, "members": audited.members, "non_members": len(audited.ids) - audited.members,
                "lpips_network": perceptual.name, "lpips_calibrated": perceptual.calibrated,
                "lpips_weights_sha256": perceptual.weights_sha256, "independent_network": independent.name,
                "steps": cfg.steps, "optimize_noise": cfg.optimize_noise,
                "phase2_kept_iteration": inputs.saved.get("phase2", {}).get("kept_iteration"),  # StyleGAN's record
                "attack": "latent projection" if inputs.generators else "nearest buffer image",
                "note": "empirical attack scores, not a formal privacy guarantee"}
    if "dp" in inputs.saved:  # train-gan --dp-epsilon: the formal guarantee, and the attack's sanity bound
        dp = inputs.saved["dp"]
        summary["dp"] = dp | {"audit_bound": effects.dp_bound(summary["generators"]["privacy"]["mia"], dp["epsilon"],
                                                                dp["delta"], summary["non_members"]),
                              "scope": "the generator and its buffer; FedER's travelling classifiers are not DP"}
        summary["note"] = (f"({dp['epsilon']:.3g}, {dp['delta']:.2g})-DP per training image for the generator and "
                           f"buffer by {dp.get('privatised', 'a DP-SGD discriminator')}; the attack scores are "
                           "empirical")
    return summary


def audited_hashes(cfg: AuditConfig, manifest: Manifest, node: str, inputs: NodeInputs) -> dict[str, str]:
    """The inputs config.json names: the partition and every generator file audited, and the buffer."""
    folder = gan_dir(cfg.exp, node)
    audited_files = {"buffer": BUFFER}  # a kind with no latent: its buffer alone
    if inputs.generators:
        audited_files = (AUDITED | (AUDITED_CONTROLS if cfg.controls else {})
                         | ({"reference": GENERATOR_REFERENCE} if inputs.reference is not None else {}))
    if inputs.lira is not None:
        audited_files |= {f"lira-{k}-{role}": lira_generator(k, role) for role in inputs.lira
                          for k in range(len(inputs.lira[role]))}
    return {"manifest": manifest.content_hash} | {name: file_sha256(folder / f) for name, f in audited_files.items()}


def projection_start(generator, audited: Audited, seed: int, node: str) -> tuple[torch.Tensor, float]:
    """Each image's starting latent from `generator` (Invertible), and the latents' spread."""
    return generator.start(audited.labels, torch_stream(seed, node, "audit-w-mean"))


def project_generators(cfg: AuditConfig, generators: dict, audited: Audited, start: tuple[torch.Tensor, float],
                       networks: tuple[Perceptual, Perceptual], seed: int,
                       node: str) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
    """Every audited image projected into each generator from the same start and its own stream: one
    row per (generator, image) with its distances, and each generator's reconstructions."""
    perceptual, independent = networks
    w_start, spread = start
    settings = ProjectionSettings(steps=cfg.steps, lr=cfg.lr, precision=cfg.precision)
    rows, reconstructions = [], {}
    for name, generator in generators.items():
        generator.requires_grad_(False)
        recon, lpips = [], []
        with ProjectionProgress(f"{node} {name}", len(audited.images), cfg.steps) as progress:
            for begin in range(0, len(audited.images), cfg.batch_size):
                chunk = slice(begin, begin + cfg.batch_size)
                streams = [torch_stream(seed, node, "audit-project", image_id) for image_id in audited.ids[chunk]]
                shapes = (generator.noise_shapes() or None) if cfg.optimize_noise else None
                result = project(generator.render, audited.images[chunk], w_start[chunk], perceptual, settings,
                                 streams, spread, shapes, on_step=progress.step)
                recon.append(result.images)
                lpips.append(result.lpips)
                progress.batch_done(len(result.lpips))
        reconstructions[name] = torch.cat(recon)
        rows += distance_rows(name, reconstructions[name], torch.cat(lpips), audited, independent, cfg.steps)
    return pd.DataFrame(rows), reconstructions


def distance_rows(name: str, reconstructions: torch.Tensor, lpips: torch.Tensor, audited: Audited,
                  independent: Perceptual, steps: int) -> list[dict]:
    """One row per audited image: its reconstruction's distances to it in the training LPIPS (`lpips`, given),
    the audit-only network, pixels and SSIM."""
    with torch.no_grad():
        other = independent(reconstructions, audited.images).cpu()
    l2 = scores.pixel_l2(reconstructions, audited.images).cpu()
    ss = scores.ssim(reconstructions, audited.images).cpu()
    return [{"image_id": i, "member": int(m), "label": int(y), "generator": name, "lpips": float(a),
             "lpips_independent": float(o), "l2": float(b), "ssim": float(c), "steps": steps}
            for i, m, y, a, o, b, c in zip(audited.ids, audited.is_member, audited.labels.tolist(), lpips.cpu(), other,
                                           l2, ss)]


def buffer_attack(buffer_images: torch.Tensor, audited: Audited, distances: dict[str, np.ndarray],
                  independent: Perceptual) -> tuple[pd.DataFrame, dict[str, torch.Tensor]]:
    """The attack on a kind with no latent to project: an attacker who holds the released buffer takes each audited
    image's nearest buffer image (training LPIPS) as its reconstruction, so a member closer to the buffer than the
    non-members is the membership signal, and a buffer of decoded codes (a reconstruction of every training image)
    rebuilds its members. Rows as a projection's, under the released generator's name ("privacy")."""
    nearest = buffer_images[torch.from_numpy(distances["nearest_buffer"]).to(buffer_images.device)]
    rows = distance_rows("privacy", nearest, torch.from_numpy(distances["real_to_buffer"]), audited, independent, 0)
    return pd.DataFrame(rows), {"buffer": nearest}


def same_weights(first: torch.nn.Module, second: torch.nn.Module) -> bool:
    """Whether two generators hold identical tensors (then projecting one is projecting both)."""
    a, b = first.state_dict(), second.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def distances_to_buffer(perceptual: Perceptual, buffer_images: torch.Tensor, audited: Audited) -> dict[str, np.ndarray]:
    """From one LPIPS matrix, buffer to audited images (members first): each synthetic image's nearest
    audited image and its distance, each audited image's distance to the buffer (and in pixels, to its nearest
    buffer image in pixels: an attack outside the defence's metric), and each synthetic image's distance to the
    nearest member; with the real-to-real distances the buffer scores use."""
    synthetic = scores.distance_matrix(perceptual, buffer_images, audited.images)
    buffer_to_real, nearest_real = scores.nearest(synthetic)
    to_buffer = synthetic.min(dim=0)
    pixels = audited.images[0].numel()
    in_pixels = torch.cdist(audited.images.flatten(1), buffer_images.flatten(1)) / pixels ** 0.5  # pixel_l2's RMS
    distances = {"real_to_buffer": to_buffer.values, "nearest_buffer": to_buffer.indices,
                 "real_to_buffer_l2": in_pixels.min(dim=1).values,
                 "buffer_to_real": buffer_to_real,
                 "nearest_real": nearest_real, "buffer_to_members": synthetic[:, :audited.members].min(dim=1).values,
                 "non_members_to_members": audited.non_members_to_members}
    return {k: v.cpu().numpy() for k, v in distances.items()}


def audit_controls(cfg: AuditConfig, inputs: NodeInputs, frame: pd.DataFrame, audited: Audited,
                   start: tuple[torch.Tensor, float], networks: tuple[Perceptual, Perceptual], seed: int, node: str,
                   device: str) -> dict:
    """The controls of fedcli/audit/controls.py, each audited as the node's own generators are."""
    kind = recorded_kind(inputs.saved)
    members = audited.images[:audited.members]
    out = {}
    for name, generator in (("memoriser", controls.memoriser(members, kind.latent_sizes(inputs.saved), seed, node)),
                            ("data-free", controls.data_free(kind, inputs.saved, seed, node))):
        generator = fast_layout(generator, device)
        own_frame, _ = project_generators(cfg, {"privacy": generator}, audited,
                                          projection_start(generator, audited, seed, node), networks, seed, node)
        buffer = sample_buffer(generator, sorted(set(inputs.saved["classes"])), len(inputs.buffer), seed, node,
                               device)[0]
        summary = summarize(own_frame, audited, distances_to_buffer(networks[0], to_float(buffer).to(device), audited),
                            cfg, seed, node)
        out[name] = controls.outcome(name, summary) | {"verdict": summary["verdict"],
                                                       "mia": summary["generators"]["privacy"]["mia"]}
    reseeded_frame, _ = project_generators(cfg, {"reseeded": fast_layout(inputs.reseeded, device)}, audited, start,
                                           networks, seed, node)
    pair = pd.concat([frame[frame.generator == "control"], reseeded_frame.assign(generator="privacy")])
    effect = {"privacy_effect": paired_effects(pair, audited.is_member, seed, node, "control-reseeded")}
    out["reseeded"] = controls.outcome("reseeded", effect) | effect
    return out


def tiny_node_control(cfg: AuditConfig, inputs: NodeInputs, train: NodeDataset, test: NodeDataset,
                      networks: tuple[Perceptual, Perceptual], seed: int, node: str, device: str) -> dict:
    """The tiny-node GAN's training images and as many class-matched test images, projected into it and
    into the node's standard generator (trained on all the node's images, those included): the GAN that
    saw tens of images many times over must be the easier to attack, by membership AUROC."""
    position = {r["id"]: i for i, r in enumerate(train.records)}
    tiny = [position[image_id] for image_id in inputs.saved["tiny"]["member_ids"]]
    picked, non_member_idx = matched_groups([train.records[i] for i in tiny], test.records, len(tiny), seed, node)
    member_idx = [tiny[i] for i in picked]
    group = Audited(to_float(torch.cat([train.images[member_idx], test.images[non_member_idx]])).to(device),
                    torch.cat([train.labels[member_idx], test.labels[non_member_idx]]).to(device),
                    [train.records[i]["id"] for i in member_idx] + [test.records[i]["id"] for i in non_member_idx],
                    np.array([1] * len(member_idx) + [0] * len(non_member_idx)))
    distances = {}
    for name, generator in (("tiny", inputs.tiny), ("standard", inputs.generators["standard"])):
        generator = fast_layout(generator, device)
        frame, _ = project_generators(cfg, {name: generator}, group, projection_start(generator, group, seed, node),
                                      networks, seed, node)
        distances[name] = frame.lpips.to_numpy()
    mia = {name: effects.membership(d, group.is_member, numpy_stream(seed, node, "audit-tiny-node", name))
           for name, d in distances.items()}
    gap = effects.auroc_difference(distances["tiny"], distances["standard"], group.is_member,
                                   numpy_stream(seed, node, "audit-tiny-node", "difference"))
    return controls.outcome("tiny-node", {"auroc": {k: m["auroc"] for k, m in mia.items()}, "difference": gap}) | {
        "images": len(member_idx), "iterations": inputs.saved["tiny"]["iterations"],
        "mia": {k: {"auroc": m["auroc"], "ci_low": m["auroc_ci_low"], "ci_high": m["auroc_ci_high"],
                    "p_value": m["p_value"]} for k, m in mia.items()}, "auroc_difference": gap}


def summarize(frame: pd.DataFrame, audited: Audited, distances: dict[str, np.ndarray], cfg: AuditConfig,
              seed: int, node: str, games: dict[str, dict] | None = None) -> dict:
    """Per generator in `frame`: projection distances, membership inference (with the LiRA game of `games`, by
    role, where it ran: the training LPIPS's as `mia_lira`) and reconstruction shares; the paired privacy effect
    when it holds both the privacy generator and its control; the buffer's records; and the verdict."""
    is_member = audited.is_member
    nearest_other = audited.nearest_other.cpu().numpy()
    out: dict = {"generators": {}}
    for name, group in frame.groupby("generator", sort=False):
        members, others = group[group.member == 1], group[group.member == 0]
        out["generators"][name] = {
            "member_lpips_mean": float(members.lpips.mean()), "member_lpips_median": float(members.lpips.median()),
            "non_member_lpips_mean": float(others.lpips.mean()),
            "member_l2_mean": float(members.l2.mean()), "member_ssim_mean": float(members.ssim.mean()),
            "mia": effects.membership(group.lpips.to_numpy(), is_member,
                                      numpy_stream(seed, node, "audit-bootstrap", name, "lpips")),
            "mia_l2": effects.membership(group.l2.to_numpy(), is_member,
                                         numpy_stream(seed, node, "audit-bootstrap", name, "l2")),
            "mia_independent": effects.membership(group.lpips_independent.to_numpy(), is_member,
                                                  numpy_stream(seed, node, "audit-bootstrap", name, "independent")),
            "reconstruction_share": effects.reconstruction_share(group.lpips.to_numpy(), nearest_other, is_member),
        }
    for role, game in (games or {}).items():
        out["generators"][role]["mia_lira"] = game["lpips"]["target"]
    if games:
        out["lira"] = games
    if "reference" in out["generators"]:  # GAN-Leaks-cal: distance under the target minus under the reference
        reference = frame[frame.generator == "reference"].lpips.to_numpy()
        for name in [name for name in out["generators"] if name != "reference"]:
            out["generators"][name]["mia_calibrated"] = effects.membership(
                frame[frame.generator == name].lpips.to_numpy() - reference, is_member,
                numpy_stream(seed, node, "audit-bootstrap", name, "calibrated"))
    if {"privacy", "control"} <= set(frame.generator):
        out["privacy_effect"] = paired_effects(frame, is_member, seed, node, "effect")
    real_to_buffer = distances["real_to_buffer"]
    out["buffer"] = {
        "member_nearest_lpips_mean": float(real_to_buffer[is_member == 1].mean()),
        "member_nearest_lpips_median": float(np.median(real_to_buffer[is_member == 1])),
        "non_member_nearest_lpips_mean": float(real_to_buffer[is_member == 0].mean()),
        "synthetic_nearest_real_lpips_mean": float(distances["buffer_to_real"].mean()),
        # every kind's one common attack: an audited image's distance to its nearest buffer image as the score
        "mia": effects.membership(real_to_buffer, is_member, numpy_stream(seed, node, "audit-buffer", "membership")),
        "mia_l2": effects.membership(distances["real_to_buffer_l2"], is_member,
                                     numpy_stream(seed, node, "audit-buffer", "membership", "l2")),
        **effects.buffer_records(distances["nearest_real"], is_member, distances["buffer_to_members"],
                                 distances["non_members_to_members"], numpy_stream(seed, node, "audit-buffer")),
    }
    out["verdict"] = verdict(out, cfg)
    return out


def paired_effects(frame: pd.DataFrame, is_member: np.ndarray, seed: int, node: str, purpose: str) -> dict:
    """The privacy generator's per-image effect against the control's, in the training LPIPS, in pixels
    (`pixel`) and in the audit-only network (`independent`)."""
    privacy = frame[frame.generator == "privacy"].reset_index(drop=True)
    control = frame[frame.generator == "control"].reset_index(drop=True)
    effect = {}
    for key, column in (("lpips", "lpips"), ("l2", "l2"), ("independent", "lpips_independent")):
        effect[key] = effects.privacy_effect(privacy[column].to_numpy(), control[column].to_numpy(), is_member,
                                             numpy_stream(seed, node, "audit-bootstrap", purpose, key))
    return effect.pop("lpips") | {"pixel": effect["l2"], "independent": effect["independent"]}


def verdict(summary: dict, cfg: AuditConfig) -> dict:
    """fail on evidence of a leak, pass on evidence against one, inconclusive otherwise; every test two-sided (a
    reversed signal, members further than non-members, fails and is named reversed). A leak: any membership attack
    on the released generator or buffer (effects.membership_attacks) with strength (the better direction's AUROC)
    above --max-auroc and two-sided p below ALPHA over the number of attacks (Bonferroni: the verdict reads the
    strongest
    of several); members rebuilt more or less often than non-members (p < ALPHA); the buffer's closest records
    members, or non-members, in a share beyond --max-auroc (p < ALPHA); members' median distance to the buffer
    under --min-distance. A pass needs every attack's AUROC interval and the buffer share's within
    [1 - --max-auroc, --max-auroc]; the privacy effect is reported beside it, not folded in."""
    attacks = effects.membership_attacks(summary)
    rebuilt = summary["generators"]["privacy"]["reconstruction_share"]
    buffer = summary["buffer"]
    threshold, alpha = cfg.max_auroc, effects.ALPHA / len(attacks)
    reasons, doubts, reversed_ = [], [], []
    for attack, mia in attacks.items():
        if mia["strength"] > threshold and mia["p_value"] < alpha:
            flipped = mia["direction"] == effects.REVERSED
            reversed_ += [attack] if flipped else []
            reasons.append(f"{'reversed ' if flipped else ''}{attack} AUROC {mia['auroc']:.3f}"
                           + (f" (members further than non-members: the flipped attack scores {mia['strength']:.3f})"
                              if flipped else "") + f", beyond {threshold} (p = {mia['p_value']:.2g} < {alpha:.2g})")
    if rebuilt["leak"]:
        flipped = rebuilt["direction"] == effects.REVERSED
        reversed_ += ["reconstruction"] if flipped else []
        reasons.append(f"{'reversed: ' if flipped else ''}members rebuilt closer than their nearest other image "
                       f"{rebuilt['members']:.3f} vs non-members {rebuilt['non_members']:.3f} "
                       f"(p = {rebuilt['p_value']:.2g})")
    share = buffer["dcr_share"]
    if max(share, 1 - share) > threshold and buffer["dcr_p_value"] < effects.ALPHA:
        flipped = share < 0.5
        reversed_ += ["buffer closest records"] if flipped else []
        reasons.append(f"{'reversed: ' if flipped else ''}buffer's closest records are members in {share:.3f}, "
                       f"beyond {threshold} (p = {buffer['dcr_p_value']:.2g})")
    if buffer["member_nearest_lpips_median"] < cfg.min_distance:
        reasons.append(f"members' median distance to the buffer {buffer['member_nearest_lpips_median']:.4f} < "
                       f"{cfg.min_distance}")
    for attack, mia in attacks.items():
        if not effects.resolves(mia, threshold):
            doubts.append(f"{attack} AUROC's 95% interval [{mia['auroc_ci_low']:.3f}, {mia['auroc_ci_high']:.3f}] "
                          f"reaches beyond [{1 - threshold:.2g}, {threshold}]: too few images to rule out a leak in "
                          "either direction")
    if not 1 - threshold <= buffer["dcr_ci_low"] <= buffer["dcr_ci_high"] <= threshold:
        doubts.append(f"buffer member share's 95% interval [{buffer['dcr_ci_low']:.3f}, {buffer['dcr_ci_high']:.3f}] "
                      f"reaches beyond [{1 - threshold:.2g}, {threshold}]: too few images to rule out a leak")
    result = "fail" if reasons else "inconclusive" if doubts else "pass"
    return {"result": result, "reasons": reasons or doubts, "reversed": reversed_,
            "attacks": {name: {"auroc": m["auroc"], "strength": m["strength"], "direction": m["direction"],
                               "ci_low": m["auroc_ci_low"], "ci_high": m["auroc_ci_high"], "p_value": m["p_value"]}
                        for name, m in attacks.items()},
            "privacy_effect": summary["privacy_effect"]["verdict"] if "privacy_effect" in summary else None,
            "thresholds": {"max_auroc": threshold, "min_distance": cfg.min_distance, "alpha": effects.ALPHA,
                           "alpha_per_attack": alpha, "effect_ratio": effects.EFFECT}}
