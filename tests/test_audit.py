"""The privacy audit: projection works, scores detect memorisation and only memorisation."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from conftest import copy_exp, tiny_gan_exp
from fedcli.audit import scores
from fedcli.audit.groups import matched_groups
from fedcli.audit.projection import ProjectionSettings, class_mean_w, project
from fedcli.audit.stage import verdict
from fedcli.config import AuditConfig
from fedcli.data.sources.digits import load_digit_images
from fedcli.gan.networks import Architecture, Generator
from fedcli.gan.perceptual import Perceptual


@pytest.fixture(scope="module")
def perceptual():
    return Perceptual("alex")


def digits(n: int, offset: int = 0, size: int = 32) -> torch.Tensor:
    images = torch.from_numpy(load_digit_images()[0][offset:offset + n]).unsqueeze(1)
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False) * 2 - 1


def project_all(synthesis, targets, w_start, perceptual, steps, spread=0.0):
    settings = ProjectionSettings(steps=steps, lr=0.1)
    out = [project(synthesis, targets[i:i + 32], w_start[i:i + 32], perceptual, settings,
                   torch.Generator().manual_seed(i), spread) for i in range(0, len(targets), 32)]
    return torch.cat([o.lpips for o in out]), torch.cat([o.images for o in out])


def test_a_generator_that_memorised_its_training_images_is_caught(perceptual):
    """G(w) = softmax(20 w) . members: it can rebuild every member exactly and nothing else."""
    members, others = digits(32), digits(32, offset=500)
    flat = members.flatten(1)

    def synthesis(w):
        return (torch.softmax(20 * w, dim=1) @ flat).view(-1, 1, 32, 32)

    targets = torch.cat([members, others])
    distances, _ = project_all(synthesis, targets, torch.zeros(64, 32), perceptual, steps=150)
    is_member = np.array([1] * 32 + [0] * 32)
    assert distances[:32].mean() < 0.05 * distances[32:].mean()
    assert scores.membership(distances.numpy(), is_member)["auroc"] > 0.95


def test_a_generator_that_ignores_the_data_gives_chance_auroc(perceptual):
    torch.manual_seed(0)
    arch = Architecture(resolution=32, channels=1, num_classes=1, z_dim=16, w_dim=16, channel_base=128,
                        channel_max=16)
    generator = Generator(arch).requires_grad_(False)
    targets = torch.cat([digits(200), digits(200, offset=1000)])
    means, spread = class_mean_w(generator, [0], 256, torch.Generator().manual_seed(1))
    w_start = means[0].expand(400, -1)
    distances, _ = project_all(lambda w: generator.synthesis(w, noise_mode="const"), targets, w_start, perceptual,
                               steps=8, spread=spread)
    auroc = scores.membership(distances.numpy(), np.array([1] * 200 + [0] * 200))["auroc"]
    sigma = np.sqrt((200 + 200 + 1) / (12 * 200 * 200))  # AUROC's standard deviation under no leak
    assert abs(auroc - 0.5) < 3.5 * sigma, auroc


def test_projection_recovers_an_image_the_generator_made(perceptual, tmp_path_factory):
    from fedcli.gan.stage import load_generator
    from fedcli.layout import GENERATOR, gan_dir

    exp = tiny_gan_exp(tmp_path_factory, nodes=2)
    config = json.loads((gan_dir(exp, "node0") / "config.json").read_text())
    generator = load_generator(gan_dir(exp, "node0"), GENERATOR, Architecture(**config["architecture"]))
    generator.requires_grad_(False)
    means, spread = class_mean_w(generator, [3], 256, torch.Generator().manual_seed(0))
    with torch.no_grad():
        w_true = generator.mapping(torch.randn(8, 16, generator=torch.Generator().manual_seed(5)),
                                   torch.full((8,), 3, dtype=torch.long))
        targets = generator.synthesis(w_true, noise_mode="const")
    synthesis = lambda w: generator.synthesis(w, noise_mode="const")  # noqa: E731
    start, _ = project_all(synthesis, targets, means[3].expand(8, -1), perceptual, steps=1)
    found, images = project_all(synthesis, targets, means[3].expand(8, -1), perceptual, steps=300, spread=spread)
    assert found.max() < 1e-3 and found.mean() < 0.05 * start.mean(), (found, start)


def test_buffer_nearest_neighbours_equal_a_brute_force_search(perceptual):
    queries, pool = digits(7), digits(11, offset=300)
    distance, index = scores.nearest(perceptual, queries, pool, chunk=4)
    rgb = lambda t: t.expand(-1, 3, -1, -1)  # noqa: E731
    brute = torch.tensor([[perceptual.model(rgb(q[None]), rgb(p[None])).item() for p in pool] for q in queries])
    assert torch.allclose(distance, brute.min(dim=1).values, atol=1e-6)
    assert torch.equal(index, brute.argmin(dim=1))


def test_ssim_and_l2_are_zero_distance_for_identical_images():
    x = digits(4)
    assert torch.allclose(scores.ssim(x, x), torch.ones(4), atol=1e-5)
    assert torch.allclose(scores.pixel_l2(x, x), torch.zeros(4))
    assert (scores.ssim(x, x.flip(-1)) < 0.9).all()


def summary(auroc: float, share: float, distance: float) -> dict:
    return {"generators": {"privacy": {"mia_lpips": {"auroc": auroc}}},
            "buffer": {"share_nearest_is_member": share, "member_nearest_lpips_median": distance}}


def test_thresholds_drive_the_verdict():
    cfg = AuditConfig(exp=None, max_auroc=0.6, min_distance=0.02)
    assert verdict(summary(0.55, 0.5, 0.05), cfg)["result"] == "pass"
    assert verdict(summary(0.65, 0.5, 0.05), cfg)["result"] == "fail"
    assert verdict(summary(0.55, 0.7, 0.05), cfg)["result"] == "fail"
    failed = verdict(summary(0.55, 0.5, 0.01), cfg)
    assert failed["result"] == "fail" and "median distance" in failed["reasons"][0]
    assert verdict(summary(0.65, 0.5, 0.05), AuditConfig(exp=None, max_auroc=0.7))["result"] == "pass"


def test_groups_are_size_matched_and_class_stratified():
    train = [{"label": i % 3} for i in range(90)] + [{"label": 3}] * 5
    test = [{"label": i % 3} for i in range(12)]
    members, non_members = matched_groups(train, test, max_images=100, seed=0, node="n")
    assert len(members) == len(non_members) == 12
    assert sorted(train[i]["label"] for i in members) == sorted(test[i]["label"] for i in non_members)
    members, _ = matched_groups(train, test, max_images=7, seed=0, node="n")
    assert len(members) == 7 and set(train[i]["label"] for i in members) == {0, 1, 2}


@pytest.fixture(scope="module")
def audit_exp(tmp_path_factory):
    return tiny_gan_exp(tmp_path_factory, nodes=2)


AUDIT_FAST = ["--max-images", "20", "--steps", "3"]


def test_audit_writes_scores_figures_and_provenance(cli, audit_exp, tmp_path):
    exp = copy_exp(audit_exp, tmp_path)
    output = cli.ok("audit-privacy", "--exp", exp, *AUDIT_FAST).output
    assert "not a formal privacy guarantee" in output
    for node in ("node0", "node1"):
        folder = exp / "audit" / node
        assert {p.name for p in folder.iterdir()} == {"distances.csv", "summary.json", "histogram.png", "pairs.png",
                                                      "nearest.png", "roc.png", "config.json"}
        frame = pd.read_csv(folder / "distances.csv")
        assert set(frame["generator"]) == {"standard", "privacy"} and len(frame) == 2 * 40
        assert {"image_id", "member", "lpips", "l2", "ssim", "steps"} <= set(frame.columns)
        result = json.loads((folder / "summary.json").read_text())
        assert result["members"] == result["non_members"] == 20
        assert 0 <= result["generators"]["privacy"]["mia_lpips"]["auroc"] <= 1
        assert result["verdict"]["result"] in ("pass", "fail")


def test_strict_fails_the_exit_code_on_a_failing_verdict(cli, audit_exp, tmp_path):
    exp = copy_exp(audit_exp, tmp_path)
    result = cli("audit-privacy", "--exp", exp, "--node", "node0", *AUDIT_FAST, "--min-distance", "10", "--strict")
    assert result.exit_code == 1 and "fail" in result.output


def listing(exp):
    return sorted(p.relative_to(exp).as_posix() for p in exp.rglob("*"))


def test_bad_inputs(cli, audit_exp, tmp_path):
    exp = copy_exp(audit_exp, tmp_path)
    assert "--steps" in cli.user_error("audit-privacy", "--exp", exp, "--steps", "0")
    (exp / "gan" / "node1" / "generator_phase1.safetensors").write_bytes(b"not a checkpoint")
    assert "corrupt" in cli.user_error("audit-privacy", "--exp", exp, "--node", "node1", *AUDIT_FAST)
    (exp / "gan" / "node1" / "generator.safetensors").unlink()
    assert "run fedcli train-gan" in cli.user_error("audit-privacy", "--exp", exp, "--node", "node1", *AUDIT_FAST)
    config = json.loads((exp / "gan" / "node0" / "config.json").read_text())
    config["architecture"]["resolution"] = 32
    (exp / "gan" / "node0" / "config.json").write_text(json.dumps(config))
    assert "16 px" in cli.user_error("audit-privacy", "--exp", exp, "--node", "node0", *AUDIT_FAST)
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--seed", "9", "--exp", exp, "--overwrite")
    before = listing(exp)
    assert "stale" in cli.user_error("audit-privacy", "--exp", exp, "--node", "node0", *AUDIT_FAST)
    assert listing(exp) == before and not (exp / "audit").exists()
