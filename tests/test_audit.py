"""The privacy audit: projection works, scores detect memorisation and only memorisation."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_GAN, copy_exp, tiny_gan_exp
from dataclasses import replace

from fedcli.audit import controls, effects, scores
from fedcli.audit.projection import ProjectionSettings, project
from fedcli.audit.stage import (Audited, buffer_attack, check_inputs, distances_to_buffer, summarize, tiny_node_control,
                                verdict)
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.data.sources.digits import load_digit_images
from fedcli.experiment.config import AuditConfig
from fedcli.generators.groups import matched_groups
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.registry import recorded_kind
from fedcli.generators.stylegan2.networks import Architecture, Generator, class_mean_w


@pytest.fixture(scope="module")
def perceptual():
    return Perceptual("alex")


def digits(n: int, offset: int = 0, size: int = 32) -> torch.Tensor:
    images = torch.from_numpy(load_digit_images()[0][offset:offset + n]).unsqueeze(1)
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False) * 2 - 1


def streams(keys) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(k) for k in keys]


def project_all(synthesis, targets, w_start, perceptual, steps, spread=0.0):
    settings = ProjectionSettings(steps=steps, lr=0.1)
    out = [project(synthesis, targets[i:i + 32], w_start[i:i + 32], perceptual, settings,
                   streams(range(i, min(i + 32, len(targets)))), spread) for i in range(0, len(targets), 32)]
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
    assert effects.membership(distances.numpy(), is_member, np.random.default_rng(0))["auroc"] > 0.95


def test_a_generator_that_ignores_the_data_gives_chance_auroc(perceptual):
    torch.manual_seed(0)
    arch = Architecture(resolution=32, channels=1, num_classes=1, z_dim=16, w_dim=16, channel_base=128,
                        channel_max=16)
    generator = Generator(arch).requires_grad_(False)
    targets = torch.cat([digits(200), digits(200, offset=1000)])
    means, spread = class_mean_w(generator, 16, [0], 256, torch.Generator().manual_seed(1))
    w_start = means[0].expand(400, -1)
    distances, _ = project_all(lambda w: generator.synthesis(w, noise_mode="const"), targets, w_start, perceptual,
                               steps=8, spread=spread)
    auroc = effects.membership(distances.numpy(), np.array([1] * 200 + [0] * 200), np.random.default_rng(0))["auroc"]
    sigma = np.sqrt((200 + 200 + 1) / (12 * 200 * 200))  # AUROC's standard deviation under no leak
    assert abs(auroc - 0.5) < 3.5 * sigma, auroc


def test_projection_recovers_an_image_the_generator_made(perceptual, tmp_path_factory):
    from fedcli.generators.registry import load_generator
    from fedcli.experiment.paths import GENERATOR, gan_dir

    exp = tiny_gan_exp(tmp_path_factory, nodes=2)
    config = json.loads((gan_dir(exp, "node0") / "config.json").read_text())
    generator = load_generator(gan_dir(exp, "node0"), GENERATOR, config)
    generator.requires_grad_(False)
    means, spread = class_mean_w(generator, 16, [3], 256, torch.Generator().manual_seed(0))
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
    distance, index = scores.nearest(scores.distance_matrix(perceptual, queries, pool, chunk=4))
    rgb = lambda t: t.expand(-1, 3, -1, -1)  # noqa: E731
    brute = torch.tensor([[perceptual.model(rgb(q[None]), rgb(p[None])).item() for p in pool] for q in queries])
    assert torch.allclose(distance, brute.min(dim=1).values, atol=1e-6)
    assert torch.equal(index, brute.argmin(dim=1))


@pytest.mark.parametrize("released", ["members", "non-members"])
def test_the_buffer_attack_rebuilds_the_members_a_buffer_holds_and_none_it_does_not(perceptual, tmp_path, released):
    """A kind with no latent is attacked through its buffer: each image's nearest buffer image is its
    reconstruction. A buffer of the members themselves (decoded codes at their best) gives every member back and
    AUROC 1; a buffer of the non-members gives the score's other extreme, a reversed leak."""
    members, others = digits(24), digits(24, offset=500)
    images = torch.cat([members, others])
    real = scores.distance_matrix(perceptual, images, images)
    audited = Audited(images, torch.zeros(48, dtype=torch.long), [str(i) for i in range(48)],
                      np.array([1] * 24 + [0] * 24), scores.nearest(real, exclude=torch.arange(48))[0],
                      real[24:, :24].min(dim=1).values)
    buffer = members if released == "members" else others
    distances = distances_to_buffer(perceptual, buffer, audited)
    frame, reconstructions = buffer_attack(buffer, audited, distances, Perceptual("alex", random_seed=1))
    summary = summarize(frame, audited, distances, AuditConfig(exp=tmp_path), 0, "node0")
    privacy = summary["generators"]["privacy"]
    rebuilt = privacy["reconstruction_share"]
    if released == "members":
        assert torch.equal(reconstructions["buffer"][:24], members)
        assert privacy["mia"]["auroc"] == 1.0 and rebuilt["members"] == 1.0 and rebuilt["leak"]
        assert summary["verdict"]["result"] == "fail"
    else:
        assert torch.equal(reconstructions["buffer"][24:], others)
        assert privacy["mia"]["auroc"] == 0.0 and rebuilt["non_members"] == 1.0
        # two-sided: the score's other extreme names the groups as surely, and is read as reversed
        assert rebuilt["leak"] and rebuilt["direction"] == effects.REVERSED and privacy["mia"]["strength"] == 1.0
        assert summary["verdict"]["result"] == "fail" and "reconstruction" in summary["verdict"]["reversed"]
    assert summary["buffer"]["mia"]["auroc"] == privacy["mia"]["auroc"]


def test_ssim_and_l2_are_zero_distance_for_identical_images():
    x = digits(4)
    assert torch.allclose(scores.ssim(x, x), torch.ones(4), atol=1e-5)
    assert torch.allclose(scores.pixel_l2(x, x), torch.zeros(4))
    assert (scores.ssim(x, x.flip(-1)) < 0.9).all()


def summary(auroc: float, share: float, distance: float, n: int = 400, rebuilt: tuple = (0.1, 0.1)) -> dict:
    """An audit summary whose statistics come from effects' own functions on made-up distances."""
    rng = np.random.default_rng(0)
    is_member = np.array([1] * n + [0] * n)
    # member distances shifted so that the attack's AUROC is about `auroc`
    shift = np.sqrt(2) * __import__("scipy").stats.norm.ppf(auroc)
    distances = np.concatenate([rng.normal(-shift, 1, n), rng.normal(0, 1, n)])
    members_rebuilt = np.arange(n) < rebuilt[0] * n
    others_rebuilt = np.arange(n) < rebuilt[1] * n
    projection = np.where(np.concatenate([members_rebuilt, others_rebuilt]), 0.0, 1.0)
    # one synthetic image near each audited image, member or not as `share` says
    nearest = np.concatenate([np.arange(round(share * 2 * n)) % n, n + np.arange(2 * n - round(share * 2 * n)) % n])
    return {"generators": {"privacy": {
                "mia": effects.membership(distances, is_member, rng),
                "reconstruction_share": effects.reconstruction_share(projection, np.full(2 * n, 0.5), is_member)}},
            "buffer": {"member_nearest_lpips_median": distance,
                       **effects.buffer_records(nearest, is_member, np.ones(3), np.ones(3), rng)},
            "privacy_effect": {"verdict": "none"}}


def test_the_verdict_fails_on_evidence_of_a_leak_and_passes_only_on_evidence_against_one():
    cfg = AuditConfig(exp=None, max_auroc=0.6, min_distance=0.02)
    assert verdict(summary(0.5, 0.5, 0.05), cfg)["result"] == "pass"
    failed = verdict(summary(0.75, 0.5, 0.05), cfg)
    assert failed["result"] == "fail" and "membership (training LPIPS) AUROC" in failed["reasons"][0]
    assert "closest records" in verdict(summary(0.5, 0.75, 0.05), cfg)["reasons"][0]
    assert "rebuilt" in verdict(summary(0.5, 0.5, 0.05, rebuilt=(0.4, 0.1)), cfg)["reasons"][0]
    failed = verdict(summary(0.5, 0.5, 0.01), cfg)
    assert failed["result"] == "fail" and "median distance" in failed["reasons"][0]
    assert verdict(summary(0.75, 0.5, 0.05), AuditConfig(exp=None, max_auroc=0.8))["result"] == "pass"
    # too few images: no leak shown, none ruled out
    few = verdict(summary(0.5, 0.5, 0.05, n=15), cfg)
    assert few["result"] == "inconclusive" and "95% interval" in few["reasons"][0]


def test_a_reversed_signal_fails_the_audit_and_is_named_reversed():
    """Members projecting further than non-members (the review's case: AUROC about 0.11 at 40 images per group)
    name the members as surely as members projecting closer: an attacker flips the score."""
    cfg = AuditConfig(exp=None, max_auroc=0.6, min_distance=0.02)
    reversed_ = summary(0.112, 0.5, 0.05, n=40)
    mia = reversed_["generators"]["privacy"]["mia"]
    assert mia["auroc"] < 0.2 and mia["auroc_ci_high"] < 0.3 and mia["direction"] == effects.REVERSED
    assert mia["strength"] == pytest.approx(1 - mia["auroc"]) and mia["tpr_at_min_fpr"]["tpr"] > 0.5
    result = verdict(reversed_, cfg)
    assert result["result"] == "fail" and result["reversed"] == ["membership (training LPIPS)"]
    assert result["reasons"][0].startswith("reversed membership (training LPIPS) AUROC")
    # a buffer kept away from exactly the members names them too
    away = verdict(summary(0.5, 0.1, 0.05), cfg)
    assert away["result"] == "fail" and "buffer closest records" in away["reversed"]
    # members rebuilt less often than unseen images
    pushed = verdict(summary(0.5, 0.5, 0.05, rebuilt=(0.05, 0.4)), cfg)
    assert pushed["result"] == "fail" and "reconstruction" in pushed["reversed"]


def test_the_verdict_reads_the_strongest_of_its_attacks_at_a_corrected_level():
    """A leak that only the pixel attack sees fails the audit; each attack is tested at ALPHA over their number."""
    cfg = AuditConfig(exp=None, max_auroc=0.6, min_distance=0.02)
    found = summary(0.5, 0.5, 0.05)
    found["generators"]["privacy"]["mia_l2"] = summary(0.8, 0.5, 0.05)["generators"]["privacy"]["mia"]
    result = verdict(found, cfg)
    assert result["result"] == "fail" and result["reasons"][0].startswith("membership (pixel L2) AUROC")
    assert result["thresholds"]["alpha_per_attack"] == pytest.approx(effects.ALPHA / 2)
    assert set(result["attacks"]) == {"membership (training LPIPS)", "membership (pixel L2)"}


def test_the_buffer_test_counts_closest_records_not_synthetic_images():
    """An untrained generator's samples are alike, so all can share one closest record: that is one
    record, not hundreds of independent hits. Copies of many members are a leak."""
    rng = np.random.default_rng(0)
    is_member = np.array([1] * 200 + [0] * 200)
    clustered = effects.buffer_records(np.zeros(500, dtype=int), is_member, np.ones(3), np.ones(3), rng)
    assert clustered["dcr_share"] == 1.0 and clustered["dcr_records"] == 1
    assert clustered["dcr_p_value"] > 0.3 and clustered["dcr_ci_high"] > 0.9
    copies = effects.buffer_records(np.arange(500) % 150, is_member, np.ones(3), np.ones(3), rng)
    assert copies["dcr_share"] == 1.0 and copies["dcr_p_value"] < 0.01 and copies["dcr_ci_low"] > 0.9
    unseen = effects.buffer_records(rng.integers(0, 400, 500), is_member, np.ones(3), np.ones(3), rng)
    assert unseen["dcr_p_value"] > 0.01 and unseen["dcr_ci_low"] < 0.5 < unseen["dcr_ci_high"]


def test_the_paired_effect_is_significant_only_for_a_member_specific_push_and_reversed_for_a_pull():
    rng = np.random.default_rng(1)
    control = rng.uniform(0.5, 1.5, 400)
    is_member = np.array([1] * 200 + [0] * 200)
    noise = rng.normal(1, 0.05, 400)
    pushed_members = control * np.where(is_member == 1, 1.3, 1.0) * noise
    assert effects.privacy_effect(pushed_members, control, is_member, rng)["verdict"] == "significant"
    pushed_all = control * 1.3 * noise  # every image further: generalisation, not member protection
    assert effects.privacy_effect(pushed_all, control, is_member, rng)["verdict"] == "none"
    assert effects.privacy_effect(control * 0.8 * noise, control, is_member, rng)["verdict"] == "reversed"
    same = effects.privacy_effect(control, control, is_member, rng)
    assert same["verdict"] == "none" and same["median_ratio"] == 1 and same["p_value"] == 1


def test_tpr_is_given_only_at_resolvable_false_positive_rates():
    rng = np.random.default_rng(2)
    is_member = np.array([1] * 150 + [0] * 150)
    result = effects.membership(rng.normal(size=300), is_member, rng)
    assert result["tpr_at_fpr"]["0.1"] is not None and result["tpr_at_fpr"]["0.01"] is None
    assert "1000 non-members" in result["tpr_at_fpr_null_reason"]["0.01"]
    lowest = result["tpr_at_min_fpr"]
    assert lowest["min_fpr"] == pytest.approx(10 / 150) and lowest["fpr"] <= lowest["min_fpr"]
    assert lowest["ci_low"] <= lowest["tpr"] <= lowest["ci_high"]
    # members all closer than every non-member: every member found at any resolvable FPR
    perfect = effects.membership(np.r_[np.zeros(150), np.ones(150)], is_member, rng)
    assert perfect["auroc"] == 1 and perfect["tpr_at_fpr"]["0.1"]["tpr"] == 1 and perfect["p_value"] < 1e-10


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
    return tiny_gan_exp(tmp_path_factory, 2, "--controls")


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
        assert set(frame["generator"]) == {"control", "privacy"} and len(frame) == 2 * 40
        assert {"image_id", "member", "lpips", "lpips_independent", "l2", "ssim", "steps"} <= set(frame.columns)
        result = json.loads((folder / "summary.json").read_text())
        assert result["members"] == result["non_members"] == 20
        assert 0 <= result["generators"]["privacy"]["mia"]["auroc"] <= 1
        assert result["verdict"]["result"] in ("pass", "fail", "inconclusive")
        effect = result["privacy_effect"]
        assert effect["ci_low"] <= effect["median_ratio"] <= effect["ci_high"]
        assert {effect[k]["verdict"] for k in ("pixel", "independent")} <= {"significant", "none", "reversed"}
        assert effect["non_members"]["images"] == 20
        assert result["independent_network"] != result["lpips_network"]


def test_the_standard_generator_is_projected_on_request_without_moving_the_others(cli, audit_exp, tmp_path):
    """--standard adds the phase-1 generator's rows; the control's and privacy generator's are unchanged, as
    every generator is projected from the same start and per-image streams."""
    exp = copy_exp(audit_exp, tmp_path)
    folder = exp / "audit" / "node0"
    cli.ok("audit-privacy", "--exp", exp, "--node", "node0", *AUDIT_FAST)
    default = pd.read_csv(folder / "distances.csv")
    cli.ok("audit-privacy", "--exp", exp, "--node", "node0", *AUDIT_FAST, "--standard", "--overwrite")
    both = pd.read_csv(folder / "distances.csv")
    assert list(both.generator.unique()) == ["standard", "control", "privacy"]
    pd.testing.assert_frame_equal(both[both.generator != "standard"].reset_index(drop=True), default)
    cli.ok("report", "--exp", exp)
    assert "AUROC std" in (exp / "report" / "report.md").read_text()


def test_controls_behave_as_stated(cli, audit_exp, tmp_path):
    """A memoriser of the members fails, an untrained generator does not, and the control against its
    reseeded twin shows no privacy effect: the audit can fail, and its "none" is not blindness."""
    exp = copy_exp(audit_exp, tmp_path)
    output = cli.ok("audit-privacy", "--exp", exp, "--node", "node0", *AUDIT_FAST, "--controls").output
    summary = json.loads((exp / "audit" / "node0" / "summary.json").read_text())
    controls = summary["controls"]
    assert controls["memoriser"]["verdict"]["result"] == "fail"
    assert controls["data-free"]["verdict"]["result"] != "fail"
    assert controls["reseeded"]["privacy_effect"]["verdict"] == "none"
    assert all(controls[name]["holds"] for name in ("memoriser", "data-free", "reseeded"))
    # a 12-iteration tiny GAN has memorised nothing yet: its outcome is reported, whichever way it falls
    tiny = controls["tiny-node"]
    assert tiny["holds"] == (tiny["auroc_difference"]["difference"] > 0)
    trained = json.loads((exp / "gan" / "node0" / "config.json").read_text())
    assert tiny["images"] == trained["tiny"]["images"] == len(set(trained["tiny"]["member_ids"])) == 40
    kept = trained["phase2"]["kept_iteration"]
    assert summary["phase2_kept_iteration"] == kept and ("kept no privacy snapshot" in output) == (kept == 0)
    assert all(f"control {name}: expected" in output for name in controls)
    config = json.loads((exp / "audit" / "node0" / "config.json").read_text())
    assert {"reseeded", "tiny-node"} <= set(config["inputs"])
    (exp / "gan" / "node1" / "generator_tiny.safetensors").unlink()
    assert "train-gan" in cli.user_error("audit-privacy", "--exp", exp, "--node", "node1", *AUDIT_FAST, "--controls")
    assert not (exp / "audit" / "node1").exists()


def test_the_tiny_node_control_sees_a_generator_that_memorised_its_images(audit_exp):
    """The tiny-node comparison, given a generator that memorised the tiny node's images, finds it the
    easier to attack (the 12-iteration tiny GAN of the fixture cannot show it)."""
    manifest = Manifest.load(audit_exp)
    cfg = AuditConfig(exp=audit_exp, steps=20, max_images=20, controls=True)
    inputs = check_inputs(cfg, manifest, "node0", manifest["seed"])
    train, test = NodeDataset(manifest, "node0", "train"), NodeDataset(manifest, "node0", "test")
    position = {r["id"]: i for i, r in enumerate(train.records)}
    members = to_float(train.images[[position[i] for i in inputs.saved["tiny"]["member_ids"]]])
    networks = (Perceptual("alex"), Perceptual("alex", random_seed=1))
    sizes = recorded_kind(inputs.saved).latent_sizes(inputs.saved)
    memorised = tiny_node_control(cfg, replace(inputs, tiny=controls.memoriser(members, sizes, 0, "node0")), train,
                                  test, networks, 0, "node0", "cpu")
    assert memorised["holds"] and memorised["auroc_difference"]["ci_low"] > 0


def test_the_calibrated_attack_removes_each_images_own_difficulty():
    """Members sit 0.01 closer under the target than under a reference that never saw them, inside a per-image
    difficulty spread 20x wider: the raw distance barely tells members apart, the calibrated one does, and
    the verdict fails on it."""
    rng = np.random.default_rng(0)
    n = 60
    difficulty, is_member = rng.uniform(0.05, 0.25, 2 * n), np.repeat([1, 0], n)
    frame = pd.DataFrame([{"image_id": f"i{i}", "member": int(is_member[i]), "label": 0, "generator": name,
                           "lpips": d, "lpips_independent": d, "l2": d, "ssim": 0.5, "steps": 1}
                          for name in ("standard", "control", "privacy", "reference")
                          for i, d in enumerate(difficulty - (0.01 * is_member if name != "reference" else 0))])
    audited = Audited(torch.zeros(2 * n, 1, 4, 4), torch.zeros(2 * n), [f"i{i}" for i in range(2 * n)], is_member,
                      torch.full((2 * n,), 1e-4), torch.ones(n))
    buffer = {"real_to_buffer": np.ones(2 * n), "real_to_buffer_l2": np.ones(2 * n), "buffer_to_real": np.ones(2 * n),
              "nearest_real": np.arange(2 * n),
              "buffer_to_members": np.ones(2 * n), "non_members_to_members": np.ones(n)}
    summary = summarize(frame, audited, buffer, AuditConfig(exp=None), 0, "n0")
    privacy = summary["generators"]["privacy"]
    assert privacy["mia"]["auroc"] < 0.7 and privacy["mia_calibrated"]["auroc"] == 1.0
    assert "mia_calibrated" not in summary["generators"]["reference"]
    assert summary["verdict"]["result"] == "fail"
    assert any(reason.startswith("calibrated membership AUROC 1.000") for reason in summary["verdict"]["reasons"])


def test_the_reference_gan_never_sees_the_members_the_audit_scores(cli, audit_exp, tmp_path):
    exp = copy_exp(audit_exp, tmp_path)
    cli.ok("train-gan", "--exp", exp, "--node", "node0", *TINY_GAN, "--reference", "20", "--overwrite")
    trained = json.loads((exp / "gan" / "node0" / "config.json").read_text())
    manifest = Manifest.load(exp)
    train = manifest.records("node0", "train")
    members = matched_groups(train, manifest.records("node0", "test"), 20, manifest["seed"], "node0")[0]
    assert set(trained["reference"]["held_out_ids"]) == {train[i]["id"] for i in members}
    assert trained["reference"]["images"] == len(train) - 20
    cli.ok("audit-privacy", "--exp", exp, "--node", "node0", *AUDIT_FAST)
    summary = json.loads((exp / "audit" / "node0" / "summary.json").read_text())
    assert all("mia_calibrated" in summary["generators"][name] for name in ("control", "privacy"))
    assert "reference" in pd.read_csv(exp / "audit" / "node0" / "distances.csv").generator.unique()
    assert "reference" in json.loads((exp / "audit" / "node0" / "config.json").read_text())["inputs"]
    line = cli.user_error("audit-privacy", "--exp", exp, "--node", "node0", "--max-images", "30", "--steps", "1",
                          "--overwrite")
    assert "reference GAN was trained on some of the 30 members" in line and "--reference 30" in line
    assert (exp / "audit" / "node0" / "summary.json").is_file()  # the earlier audit is left as it was


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
    line = cli.user_error("audit-privacy", "--exp", exp, *AUDIT_FAST, "--lpips-weights", tmp_path / "absent.pth")
    assert "--lpips-weights" in line and "does not exist" in line
    (exp / "gan" / "node1" / "generator_control.safetensors").unlink()
    assert "control" in cli.user_error("audit-privacy", "--exp", exp, "--node", "node1", *AUDIT_FAST)
    fake_weights = tmp_path / "alexnet.pth"
    fake_weights.write_bytes(b"weights of another backbone")
    line = cli.user_error("audit-privacy", "--exp", exp, "--node", "node0", *AUDIT_FAST, "--lpips-weights",
                          fake_weights)
    assert "trained against LPIPS" in line and "--lpips-weights" in line
    config = json.loads((exp / "gan" / "node0" / "config.json").read_text())
    config["architecture"]["resolution"] = 32
    (exp / "gan" / "node0" / "config.json").write_text(json.dumps(config))
    assert "16 px" in cli.user_error("audit-privacy", "--exp", exp, "--node", "node0", *AUDIT_FAST)
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--seed", "9", "--exp", exp, "--overwrite")
    before = listing(exp)
    assert "stale" in cli.user_error("audit-privacy", "--exp", exp, "--node", "node0", *AUDIT_FAST)
    assert listing(exp) == before and not (exp / "audit").exists()


@pytest.mark.parametrize("optimize_noise", [False, True])
def test_an_images_projection_does_not_depend_on_its_batch_or_companions(perceptual, optimize_noise):
    """In float64, image k projected alone, among companions, or elsewhere in a batch gets the same result
    to 1e-8: its draws come from its own stream and the noise regulariser is per image."""
    torch.manual_seed(0)
    arch = Architecture(resolution=16, channels=1, num_classes=1, z_dim=8, w_dim=8, channel_base=64, channel_max=8)
    generator = Generator(arch).double().requires_grad_(False)
    lpips64 = Perceptual("alex").double()
    lpips64.lin_weights = [w.double() for w in lpips64.lin_weights]
    targets = digits(4, size=16).double()
    w_start = torch.zeros(4, 8, dtype=torch.float64)
    settings = ProjectionSettings(steps=12, lr=0.1)
    shapes = generator.noise_shapes() if optimize_noise else None

    def run(order):
        result = project(generator.render, targets[order], w_start[order], lpips64, settings, streams(order), 0.5,
                         shapes)
        return {k: (result.lpips[i], result.w[i]) for i, k in enumerate(order)}

    together, reversed_, alone = run([0, 1, 2, 3]), run([3, 2, 1, 0]), run([2])
    for k in range(4):
        assert abs(together[k][0] - reversed_[k][0]) < 1e-8
        assert torch.allclose(together[k][1], reversed_[k][1], atol=1e-8, rtol=0)
    assert abs(together[2][0] - alone[2][0]) < 1e-8 and torch.allclose(together[2][1], alone[2][1], atol=1e-8, rtol=0)
    assert len({round(float(v[0]), 6) for v in together.values()}) == 4  # the images did differ


def test_nearest_can_skip_each_querys_own_image(perceptual):
    pool = digits(6)
    matrix = scores.distance_matrix(perceptual, pool[:3], pool)
    distance, index = scores.nearest(matrix, exclude=torch.tensor([0, 1, 2]))
    assert (index != torch.arange(3)).all() and (distance > 0).all()
