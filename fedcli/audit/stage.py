"""The `audit-privacy` stage: how much of a node's real patients its generators and buffer reveal.

For each node: members (train images, seen by the GAN) and size-matched, class-stratified
non-members (test images); both generators (standard phase 1, privacy-preserving phase 2)
project every image from the same starting w (its class's mean w under the phase-1 mapping);
distances (LPIPS, pixel L2, SSIM) of the best projection feed membership-inference scores; the
buffer is audited by nearest neighbours. These are empirical attack scores, not a formal
privacy guarantee.

Writes `<exp>/audit/<node>/`: distances.csv, summary.json, histogram.png, pairs.png,
nearest.png, roc.png, config.json.
"""

from __future__ import annotations


import dataclasses

import numpy as np
import pandas as pd
import torch

from fedcli import console
from fedcli.artifact_kinds import AUDITED, file_sha256, record_files
from fedcli.artifacts import check_output_free, provenance, staged_output, write_csv, write_json
from fedcli.audit import figures, scores
from fedcli.audit.groups import matched_groups
from fedcli.audit.progress import ProjectionProgress
from fedcli.audit.projection import ProjectionSettings, class_mean_w, project
from fedcli.config import AuditConfig, to_json
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.devices import resolve_device, with_threads
from fedcli.errors import UserError
from fedcli.gan.networks import Architecture, Generator
from fedcli.gan.perceptual import Perceptual
from fedcli.gan.buffer import load_buffer_file
from fedcli.gan.stage import load_generator, read_gan_config
from fedcli.locking import locked
from fedcli.layout import BUFFER, GENERATOR, GENERATOR_PHASE1, audit_dir, gan_dir
from fedcli.rng import torch_stream

GENERATORS = {"standard": GENERATOR_PHASE1, "privacy": GENERATOR}
MIN_GROUP = 200  # the audit asks for at least this many images per group where a node has them
W_AVG_SAMPLES = 1000


@dataclasses.dataclass
class NodeInputs:
    """What a node's audit reads, loaded and checked before any node's projections run."""

    saved: dict  # the node's GAN config.json
    generators: dict[str, Generator]  # "standard" and "privacy", on the CPU
    buffer: torch.Tensor  # uint8 images


def check_inputs(cfg: AuditConfig, manifest: Manifest, node: str) -> NodeInputs:
    folder = gan_dir(cfg.exp, node)
    for name in (GENERATOR, GENERATOR_PHASE1, BUFFER):
        if not (folder / name).is_file():
            raise UserError(f"node {node} has no {name} in {folder}; run fedcli train-gan --exp {cfg.exp} first")
    saved = read_gan_config(cfg.exp, manifest, node)
    if saved["architecture"]["resolution"] != manifest["image_size"]:
        raise UserError(f"node {node}'s generator makes {saved['architecture']['resolution']} px images but the "
                        f"partition has {manifest['image_size']} px; re-run fedcli train-gan")
    arch = Architecture(**saved["architecture"])
    generators = {name: load_generator(folder, file, arch) for name, file in GENERATORS.items()}
    return NodeInputs(saved, generators, load_buffer_file(folder, node, manifest, saved.get("classes"))[0])


@with_threads
def run(cfg: AuditConfig) -> list[dict]:
    manifest = Manifest.load(cfg.exp)
    nodes = [manifest.node(cfg.node)["name"]] if cfg.node else manifest.node_names
    with locked(cfg.exp, [audit_dir(cfg.exp, node) for node in nodes]):
        return audit_nodes(cfg, manifest, nodes)


def audit_nodes(cfg: AuditConfig, manifest: Manifest, nodes: list[str]) -> list[dict]:
    """`run`, with the nodes' folders locked."""
    inputs = {node: check_inputs(cfg, manifest, node) for node in nodes}
    for node in nodes:
        check_output_free(audit_dir(cfg.exp, node), cfg.overwrite)
    device = resolve_device(cfg.device)
    if cfg.optimize_noise and manifest["image_size"] < 128:
        console.warn(f"--optimize-noise at {manifest['image_size']} px: free noise maps can rebuild any image, "
                     "so projection distances say little about memorisation below 128 px")
    seed = manifest["seed"] if cfg.seed is None else cfg.seed
    perceptual = Perceptual(inputs[nodes[0]].saved["lpips"]["net"]).to(device)
    return [audit_node(cfg, manifest, node, inputs[node], seed, perceptual, device) for node in nodes]


def audit_node(cfg: AuditConfig, manifest: Manifest, node: str, inputs: NodeInputs, seed: int,
               perceptual: Perceptual, device: str) -> dict:
    train, test = NodeDataset(manifest, node, "train"), NodeDataset(manifest, node, "test")
    member_idx, non_member_idx = matched_groups(train.records, test.records, cfg.max_images, seed, node)
    if len(member_idx) < min(MIN_GROUP, cfg.max_images):
        console.warn(f"node {node}: {len(member_idx)} images per group (members and non-members), fewer than "
                     f"{MIN_GROUP}: the scores are noisy")
    images = to_float(torch.cat([train.images[member_idx], test.images[non_member_idx]])).to(device)
    labels = torch.cat([train.labels[member_idx], test.labels[non_member_idx]]).to(device)
    ids = [train.records[i]["id"] for i in member_idx] + [test.records[i]["id"] for i in non_member_idx]
    is_member = np.array([1] * len(member_idx) + [0] * len(non_member_idx))
    folder = gan_dir(cfg.exp, node)
    generators = {name: generator.to(device) for name, generator in inputs.generators.items()}
    means, spread = class_mean_w(generators["standard"], sorted(set(labels.tolist())), W_AVG_SAMPLES,
                                 torch_stream(seed, node, "audit-w-mean"))
    w_start = torch.stack([means[int(c)] for c in labels])
    settings = ProjectionSettings(steps=cfg.steps, lr=cfg.lr)
    rows, reconstructions = [], {}
    for name, generator in generators.items():
        generator.requires_grad_(False)
        recon, lpips = [], []
        with ProjectionProgress(f"{node} {name}", len(images), cfg.steps) as progress:
            for start in range(0, len(images), cfg.batch_size):
                chunk = slice(start, start + cfg.batch_size)
                stream = torch_stream(seed, node, "audit-project", name, start)
                layers = generator.noise_layers if cfg.optimize_noise else None
                result = project(lambda w, noise=None, g=generator: g.synthesis(w, noise_mode="const", noise=noise),
                                 images[chunk], w_start[chunk], perceptual, settings, stream, spread, layers,
                                 on_step=progress.step)
                recon.append(result.images)
                lpips.append(result.lpips)
                progress.batch_done(len(result.lpips))
        reconstructions[name] = torch.cat(recon)
        lp = torch.cat(lpips).cpu()
        l2 = scores.pixel_l2(reconstructions[name], images).cpu()
        ss = scores.ssim(reconstructions[name], images).cpu()
        rows += [{"image_id": i, "member": int(m), "label": int(y), "generator": name, "lpips": float(a),
                  "l2": float(b), "ssim": float(c), "steps": cfg.steps}
                 for i, m, y, a, b, c in zip(ids, is_member, labels.tolist(), lp, l2, ss)]
    frame = pd.DataFrame(rows)
    buffer_images = to_float(inputs.buffer).to(device)
    real_to_buffer, nearest_buffer = scores.nearest(perceptual, images, buffer_images)
    buffer_to_real, nearest_real = scores.nearest(perceptual, buffer_images, images)
    summary = summarize(frame, is_member, real_to_buffer.cpu().numpy(), buffer_to_real.cpu().numpy(),
                        nearest_real.cpu().numpy(), cfg)
    summary |= {"node": node, "members": len(member_idx), "non_members": len(non_member_idx),
                "lpips_network": perceptual.name, "lpips_calibrated": perceptual.calibrated,
                "steps": cfg.steps, "optimize_noise": cfg.optimize_noise,
                "note": "empirical attack scores, not a formal privacy guarantee"}
    with staged_output(audit_dir(cfg.exp, node), cfg.overwrite) as out:
        write_csv(out / "distances.csv", frame)
        write_json(out / "summary.json", summary)
        figures.histogram(out / "histogram.png", frame, node, perceptual.name)
        figures.pairs(out / "pairs.png", images[:len(member_idx)], reconstructions, node)
        figures.nearest(out / "nearest.png", buffer_images, images, buffer_to_real.cpu(), nearest_real.cpu(), node)
        figures.roc(out / "roc.png", frame, node)
        hashes = {"manifest": manifest.content_hash} | {name: file_sha256(folder / f) for name, f in AUDITED.items()}
        write_json(out / "config.json", provenance("audit-privacy", to_json(cfg), seed, hashes)
                   | {"files": record_files(out)})
    return summary


def summarize(frame: pd.DataFrame, is_member: np.ndarray, real_to_buffer: np.ndarray, buffer_to_real: np.ndarray,
              nearest_real: np.ndarray, cfg: AuditConfig) -> dict:
    out: dict = {"generators": {}}
    for name, group in frame.groupby("generator", sort=False):
        members, others = group[group.member == 1], group[group.member == 0]
        member_flags = group["member"].to_numpy()
        out["generators"][name] = {
            "member_lpips_mean": float(members.lpips.mean()), "member_lpips_median": float(members.lpips.median()),
            "non_member_lpips_mean": float(others.lpips.mean()),
            "member_l2_mean": float(members.l2.mean()), "member_ssim_mean": float(members.ssim.mean()),
            "mia_lpips": scores.membership(group.lpips.to_numpy(), member_flags),
            "mia_l2": scores.membership(group.l2.to_numpy(), member_flags),
            "mia_ssim": scores.membership(-group.ssim.to_numpy(), member_flags),
        }
    n_members = int(is_member.sum())
    out["buffer"] = {
        "member_nearest_lpips_mean": float(real_to_buffer[is_member == 1].mean()),
        "member_nearest_lpips_median": float(np.median(real_to_buffer[is_member == 1])),
        "non_member_nearest_lpips_mean": float(real_to_buffer[is_member == 0].mean()),
        "share_nearest_is_member": float((nearest_real < n_members).mean()),
        "synthetic_nearest_real_lpips_mean": float(buffer_to_real.mean()),
    }
    out["verdict"] = verdict(out, cfg)
    return out


def verdict(summary: dict, cfg: AuditConfig) -> dict:
    """pass/fail: the privacy-preserving generator's membership AUROC and the buffer's nearest-member
    share stay at most --max-auroc (0.5 = no leak); members' median distance to the buffer is at
    least --min-distance (LPIPS of the network named in the summary; 0 disables that check)."""
    auroc = summary["generators"]["privacy"]["mia_lpips"]["auroc"]
    share = summary["buffer"]["share_nearest_is_member"]
    distance = summary["buffer"]["member_nearest_lpips_median"]
    reasons = []
    if auroc > cfg.max_auroc:
        reasons.append(f"membership AUROC {auroc:.3f} > {cfg.max_auroc}")
    if share > cfg.max_auroc:
        reasons.append(f"buffer nearest-member share {share:.3f} > {cfg.max_auroc}")
    if distance < cfg.min_distance:
        reasons.append(f"members' median distance to the buffer {distance:.4f} < {cfg.min_distance}")
    return {"result": "fail" if reasons else "pass", "reasons": reasons,
            "thresholds": {"max_auroc": cfg.max_auroc, "min_distance": cfg.min_distance}}

