"""`audit-privacy --shared`: what FedReplay, SplitNN and FedAvg share is kept with what an attacker needs (the
network that computed it, the images' positions), and the white-box attacks rebuild the patients where the cut
keeps them; a recipe runs the attacks as their own unit, rerun only when the federations or attack options change."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from fedcli.audit.shared_attacks import Attack, decoy_scores, in_matched_order
from fedcli.core.rng import torch_stream
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifacts import load_tensors
from fedcli.models.classifier import build_classifier
from fedcli.models.cuts import split

RECIPE = """
[partition]
nodes = 2
image-size = 16
train-size = 24
folds = 2

[federate]
strategy = ["fedreplay", "splitnn", "fedavg"]
rounds = 1
epochs = 1
init-epochs = 1
batch = 32
bootstrap = 10

[audit]
shared = true
attack-images = 4
attack-iterations = 150
attack-restarts = 1
"""


def statuses(output: str) -> dict[str, str]:
    from test_run import statuses as parse

    return parse(output)


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    from conftest import Cli

    folder = tmp_path_factory.mktemp("shared-attacks")
    (folder / "recipe.toml").write_text(RECIPE)
    result = Cli().ok("run", folder / "recipe.toml", "--exp", folder / "exp", "--threads", "2")
    return folder / "exp", result.stdout


def test_kept_activations_and_latents_are_what_the_kept_network_computes_from_the_recorded_images(exp):
    exp, _ = exp
    manifest = Manifest.load(exp)
    kept = load_tensors(exp / "federate" / "splitnn" / "shared" / "activations.safetensors", "activations")
    for node in manifest.node_names:
        bottom, _ = split(build_classifier("cnn", 1, manifest.num_classes, init_seed=0), "cnn", "stem")
        bottom.load_state_dict({k.split("/bottom/")[1]: v for k, v in kept.items() if k.startswith(f"{node}/bottom/")})
        train = NodeDataset(manifest, node, "train")
        index = kept[f"{node}/index"]
        with torch.no_grad():  # a training step: BatchNorm normalises by the batch
            computed = bottom.train()(to_float(train.images[index]))
        assert torch.allclose(computed, kept[f"{node}/activations"], atol=1e-5)
        assert torch.equal(train.labels[index], kept[f"{node}/labels"])
    latents = load_tensors(exp / "federate" / "fedreplay" / "shared" / "latents.safetensors", "latents")
    model = build_classifier("cnn", 1, manifest.num_classes, init_seed=0)
    model.load_state_dict(load_tensors(exp / "federate" / "fedreplay" / "models" / "global.safetensors", "model"))
    encoder, _ = split(model, "cnn", "stem")
    for i, node in enumerate(manifest.node_names):
        rows = latents["node"] == i
        train = NodeDataset(manifest, node, "train")
        assert torch.equal(latents["index"][rows], torch.arange(min(256, len(train))))
        with torch.no_grad():
            computed = encoder.eval()(to_float(train.images[latents["index"][rows]]))
        assert torch.allclose(computed, latents["latents"][rows], atol=1e-5)


def test_the_attacks_rebuild_the_patients_behind_the_stems_output_and_score_every_image(exp):
    exp, stdout = exp
    assert statuses(stdout)["audit-privacy --shared"] == "ran"
    assert not (exp / "audit").exists()  # no generator: only the attacks ran
    manifest = Manifest.load(exp)
    summaries = {s: json.loads((exp / "attacks" / s / "summary.json").read_text())
                 for s in ("fedreplay", "splitnn", "fedavg")}
    assert sorted(p.name for p in (exp / "attacks").iterdir()) == ["fedavg", "fedreplay", "splitnn"]
    for strategy in ("fedreplay", "splitnn"):  # the stem keeps an image: white-box inversion rebuilds it
        for row in summaries[strategy]["attacks"]:
            assert row["reconstructed"]["ssim"]["share"] == 1.0 and row["psnr_mean"] > 25, (strategy, row)
            assert row["chance"]["ssim"]["share"] < 0.5  # other patients' images do not pass for these
            assert row["psnr_mean"] > row["psnr_nearest_other_mean"] + 5
    gradient = [(r["node"], r["attack"], r["batch"], r["images"]) for r in summaries["fedavg"]["attacks"]]
    first = manifest.node_names[0]  # two nodes: its peer recovers its first round's update by subtraction
    assert gradient == [(node, "gradient", b, b) for node in manifest.node_names for b in (1, 4, 8)] + [
        (first, "round update", 24, 24)]
    assert summaries["fedavg"]["notes"] == []
    frame = pd.read_csv(exp / "attacks" / "fedreplay" / "reconstructions.csv")
    for node, group in frame.groupby("node"):
        records = manifest.records(node, "train")
        assert list(group["id"]) == [records[i]["id"] for i in group["index"]]
        assert list(group["index"]) == [0, 1, 2, 3]  # --attack-images 4
    assert json.loads((exp / "attacks" / "fedavg" / "config.json").read_text())["config"]["settings"]["iterations"] == 150


def test_the_report_puts_every_attack_beside_its_strategys_accuracy(exp):
    exp, _ = exp
    table = pd.read_csv(exp / "report" / "privacy_frontier.csv").set_index("method")
    reconstruction = [*(f"fedavg: gradient (batch {b})" for b in (1, 4, 8)), "fedavg: round update (batch 24)",
                      "fedreplay: latents", "splitnn: activations"]
    membership = [f"{s}: global model (membership)" for s in ("fedavg", "fedreplay", "splitnn")]
    assert list(table.index) == reconstruction + membership  # every shared model is attacked for membership too
    assert table.loc["fedreplay: latents", "reconstructed by attack"] == 1.0
    assert 0 <= table.loc["fedavg: global model (membership)", "membership AUROC"] <= 1
    assert (exp / "report" / "figures" / "privacy_frontier.png").is_file()


def test_the_attacks_rerun_alone_when_their_options_change(tmp_path, exp, cli):
    exp, _ = exp
    again = cli.ok("run", exp.parent / "recipe.toml", "--exp", exp, "--threads", "2",
                   "--set", "audit.attack-restarts=2", "--dry-run").stdout
    from test_run import plan

    planned = plan(again)
    assert planned["audit-privacy --shared"] == "run"
    assert {u for u, status in planned.items() if status == "run"} == {"audit-privacy --shared", "report"}


def test_a_batch_is_scored_in_the_order_that_matches_it_best():
    originals = torch.linspace(-1, 1, 5 * 4).view(5, 1, 2, 2)
    shuffled = originals[torch.tensor([3, 0, 4, 1, 2])] + 0.01
    assert torch.equal(in_matched_order(shuffled, originals), originals + 0.01)


def test_chance_pairs_decoys_with_a_batch_as_its_reconstructions_were_paired_and_not_otherwise():
    """Decoys that are near copies of the attacked images: matched to a gradient batch they "rebuild" every image
    whose copy was drawn; in the order a latent attack keeps, only those drawn in their own image's place."""
    from fedcli.data.sources.digits import load_digit_images
    from fedcli.generators.perceptual import Perceptual

    originals = torch.from_numpy(load_digit_images()[0][:4]).unsqueeze(1) * 2 - 1
    others = torch.cat([originals + 0.01, torch.zeros(1, *originals.shape[1:])])  # four copies and a blank
    perceptual = Perceptual("alex")
    for attack, paired in (("gradient", True), ("latents", False)):
        order = torch.randperm(5, generator=torch_stream(0, "n", "attack-decoys", attack, 4))[:4]
        chance = decoy_scores(Attack("n", attack, 4, torch.arange(4), originals, 0.0), originals, others, perceptual,
                              0)["reconstructed_psnr"]
        if paired:
            assert int((order < 4).sum()) <= int(chance.sum()) and int((order < 4).sum()) >= 3
        else:
            assert chance.tolist() == (order == torch.arange(4)).tolist()


def test_nothing_to_attack_is_one_line(cli, tmp_path):
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp)
    assert "no federation in" in cli.user_error("audit-privacy", "--exp", exp, "--shared")
    assert not (exp / "attacks").exists()
