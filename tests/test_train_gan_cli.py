"""`fedcli train-gan` end to end on a tiny digits partition: artifacts, buffer, determinism, errors."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pandas as pd
import pytest
import torch
from safetensors import safe_open

from conftest import TINY_GAN, Cli, copy_exp, tiny_gan_exp
from fedcli.data.manifest import content_hash
from fedcli.experiment.artifacts import tensor_metadata

TINY = TINY_GAN


@pytest.fixture(scope="module")
def gan_exp(tmp_path_factory):
    return tiny_gan_exp(tmp_path_factory, nodes=2)


def test_every_node_gets_generators_buffer_metrics_samples_and_config(gan_exp):
    for node in ("node0", "node1"):
        files = {p.name for p in (gan_exp / "gan" / node).iterdir()}
        assert files == {"generator.safetensors", "generator_phase1.safetensors", "generator_control.safetensors",
                         "buffer.safetensors", "metrics.csv", "samples.png", "config.json", "phase1_state.safetensors"}
        config = json.loads((gan_exp / "gan" / node / "config.json").read_text())
        manifest = json.loads((gan_exp / "partition" / "manifest.json").read_text())
        assert config["inputs"]["manifest"] == manifest["content_hash"]
        assert config["architecture"]["resolution"] == 16 and config["config"]["iterations"] == 12
        assert config["lpips"] == {"net": "alex", "name": "alex-random", "calibrated": False, "weights_sha256": None}
        # the control ran as many iterations as the kept privacy snapshot
        assert config["control"]["iterations"] == config["phase2"]["kept_iteration"]
        assert config["fid"] == {"name": "cnn-node", "calibrated": False}


def test_metrics_name_the_networks_behind_them(gan_exp):
    metrics = pd.read_csv(gan_exp / "gan" / "node0" / "metrics.csv")
    assert {"fid[cnn-node]", "l_pp[alex-random]", "lpips_mean[alex-random]", "ada_p"} <= set(metrics.columns)
    phase = metrics["phase"].astype(str)
    assert set(phase) <= {"1", "2", "control"} and {"1", "2"} <= set(phase)
    assert metrics[phase == "1"]["l_pp[alex-random]"].isna().all()
    assert metrics[phase == "2"]["l_pp[alex-random]"].notna().all()
    assert metrics[phase == "control"]["l_pp[alex-random]"].isna().all()
    assert metrics["fid[cnn-node]"].notna().sum() >= 2


def test_buffer_is_uint8_exact_size_class_interleaved_and_pickle_free(gan_exp):
    path = gan_exp / "gan" / "node1" / "buffer.safetensors"
    with safe_open(str(path), framework="pt") as handle:  # safetensors: no code runs on load
        images, labels = handle.get_tensor("images"), handle.get_tensor("labels")
    assert tensor_metadata(path)["node"] == "node1"
    assert images.dtype == torch.uint8 and images.shape == (30, 1, 16, 16)
    assert labels.dtype == torch.int64 and labels.tolist() == [i % 10 for i in range(30)]
    for prefix in (10, 20, 30):
        assert set(Counter(labels[:prefix].tolist()).values()) == {prefix // 10}


def test_same_seed_same_buffer_bytes_and_one_node_alone_equals_all(gan_exp, tmp_path):
    exp = tmp_path / "again"
    cli = Cli()
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp)
    cli.ok("train-gan", "--exp", exp, "--node", "node1", *TINY)
    assert not (exp / "gan" / "node0").exists()
    for name in ("buffer.safetensors", "generator.safetensors"):
        assert (exp / "gan" / "node1" / name).read_bytes() == (gan_exp / "gan" / "node1" / name).read_bytes()


def test_sample_only_writes_a_prefix_stable_buffer_of_another_size(gan_exp, tmp_path):
    exp = copy_exp(gan_exp, tmp_path)
    cli = Cli()
    cli.ok("train-gan", "--exp", exp, "--node", "node0", "--sample-only", "--buffer-size", "100",
           "--fidelity-epochs", "1", "--fidelity-seeds", "1")
    with safe_open(str(exp / "gan" / "node0" / "buffer.safetensors"), framework="pt") as big:
        images = big.get_tensor("images")
    with safe_open(str(gan_exp / "gan" / "node0" / "buffer.safetensors"), framework="pt") as small:
        assert torch.equal(images[:30], small.get_tensor("images"))
    assert images.shape[0] == 100
    assert json.loads((exp / "gan" / "node0" / "config.json").read_text())["buffer"]["size"] == 100


def test_quick_defaults_are_recorded(gan_exp):
    config = json.loads((gan_exp / "gan" / "node0" / "config.json").read_text())
    assert config["config"]["lpips_net"] == "alex" and config["config"]["fid_factor"] == 2.5
    assert config["phase2"]["fid"] <= config["phase2"]["fid_limit"] or config["phase2"]["kept_iteration"] == 0
    # the snapshot rule and its kept iteration; the released buffer's flags against chance and its control
    assert config["config"]["select"] == config["phase1"]["select"] == "stable"
    assert config["phase1"]["best_iteration"] in (6, 12) and config["phase1"]["noise_factor"] >= 1
    assert set(config["fidelity"]["flags"]) <= {"below chance", "below control"}
    assert config["fidelity"]["floor"] == pytest.approx(config["fidelity"]["chance_accuracy"]
                                                        / config["fidelity"]["real_accuracy"])


def assert_gan_untouched(exp, before):
    after = sorted(p.relative_to(exp).as_posix() for p in exp.rglob("*"))
    assert after == before


def listing(exp):
    return sorted(p.relative_to(exp).as_posix() for p in exp.rglob("*"))


def test_missing_manifest_and_unknown_node(cli, tmp_path, gan_exp):
    assert "run fedcli partition" in cli.user_error("train-gan", "--exp", tmp_path / "none")
    assert not (tmp_path / "none").exists()
    exp = copy_exp(gan_exp, tmp_path)
    before = listing(exp)
    line = cli.user_error("train-gan", "--exp", exp, "--node", "node9", *TINY)
    assert "node9" in line and "valid nodes: node0, node1" in line
    assert_gan_untouched(exp, before)


def test_existing_output_buffer_size_alpha_and_weights(cli, tmp_path, gan_exp):
    exp = copy_exp(gan_exp, tmp_path)
    before = listing(exp)
    assert "--overwrite" in cli.user_error("train-gan", "--exp", exp, *TINY)
    assert "smaller than node node0's 10 classes" in cli.user_error("train-gan", "--exp", exp, *TINY,
                                                                    "--buffer-size", "5", "--overwrite")
    assert "--alpha" in cli.user_error("train-gan", "--exp", exp, *TINY, "--alpha", "-1", "--overwrite")
    assert "nearest" in cli.user_error("train-gan", "--exp", exp, *TINY, "--privacy-loss", "closest", "--overwrite")
    assert "does not exist" in cli.user_error("train-gan", "--exp", exp, "--lpips-weights", tmp_path / "x.pth")
    assert "smaller than" in cli.user_error("train-gan", "--exp", exp, "--sample-only", "--buffer-size", "3")
    assert_gan_untouched(exp, before)


def test_phase1_from_gives_another_alpha_a_full_runs_bytes_and_refuses_another_phase1(cli, tmp_path, gan_exp):
    """--phase1-from starts phase 2 and the control from the source's kept phase-1 state: every file equals
    that of the same train-gan run from scratch; a phase 1 that would differ, or a DP run, is refused before
    anything trains."""
    def fresh(name):
        exp = tmp_path / name / "exp"
        shutil.copytree(gan_exp / "partition", exp / "partition")
        return exp

    reused, scratch = fresh("reused"), fresh("scratch")
    out = cli.ok("train-gan", "--exp", reused, "--node", "node0", *TINY, "--alpha", "4",
                 "--phase1-from", gan_exp).stdout
    assert "node node0: phase 1 from" in out and "not retrained" in out
    cli.ok("train-gan", "--exp", scratch, "--node", "node0", *TINY, "--alpha", "4")
    folder, other = reused / "gan" / "node0", scratch / "gan" / "node0"
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in other.iterdir())
    for path in folder.iterdir():
        if path.name != "config.json":
            assert path.read_bytes() == other.joinpath(path.name).read_bytes(), path.name
    ours, theirs = (json.loads((f / "config.json").read_text()) for f in (folder, other))
    assert ours["config"]["phase1_from"] == str(gan_exp) and theirs["config"]["phase1_from"] is None
    assert {k: v for k, v in ours.items() if k not in ("config", "environment", "files")} == \
        {k: v for k, v in theirs.items() if k not in ("config", "environment", "files")}
    # phase 2 did change with alpha: the released generator is not the source's
    assert (folder / "generator.safetensors").read_bytes() != (gan_exp / "gan" / "node0" /
                                                              "generator.safetensors").read_bytes()

    refused = fresh("refused")
    line = cli.user_error("train-gan", "--exp", refused, *TINY, "--iterations", "18", "--phase1-from", gan_exp)
    assert "--iterations (12 there, 18 here)" in line
    line = cli.user_error("train-gan", "--exp", refused, *TINY, "--dp-epsilon", "10", "--pp-iterations", "0",
                          "--phase1-from", gan_exp)
    assert "drop --phase1-from" in line
    assert "no gan folder" in cli.user_error("train-gan", "--exp", refused, *TINY, "--phase1-from", tmp_path)
    damaged = copy_exp(gan_exp, tmp_path / "damaged")
    state = damaged / "gan" / "node0" / "phase1_state.safetensors"
    state.write_bytes(state.read_bytes()[:-8] + bytes(b ^ 0xFF for b in state.read_bytes()[-8:]))
    line = cli.user_error("train-gan", "--exp", refused, *TINY, "--phase1-from", damaged)
    assert "node node0's phase-1 state" in line and "corrupt or was replaced" in line
    assert not (refused / "gan").exists()


def test_stale_manifest_is_detected(cli, tmp_path, gan_exp):
    exp = copy_exp(gan_exp, tmp_path)
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--seed", "5", "--exp", exp, "--overwrite")
    before = listing(exp)
    line = cli.user_error("train-gan", "--exp", exp, "--sample-only", "--buffer-size", "40")
    assert "stale" in line and "node0" in line
    assert_gan_untouched(exp, before)


def test_corrupt_checkpoint_is_refused(cli, tmp_path, gan_exp):
    exp = copy_exp(gan_exp, tmp_path)
    checkpoint = exp / "gan" / "node1" / "generator.safetensors"
    checkpoint.write_bytes(checkpoint.read_bytes()[:200])
    line = cli.user_error("train-gan", "--exp", exp, "--node", "node1", "--sample-only")
    assert "generator checkpoint" in line and "corrupt" in line
    from fedcli.experiment.artifacts import save_tensors

    save_tensors(checkpoint, {"weight": torch.zeros(3)})  # refused by the sha256 config.json recorded
    assert "was replaced" in cli.user_error("train-gan", "--exp", exp, "--node", "node1", "--sample-only")


def test_resolution_that_is_not_a_power_of_two(cli, tmp_path, gan_exp):
    exp = copy_exp(gan_exp, tmp_path)
    path = exp / "partition" / "manifest.json"
    data = json.loads(path.read_text())
    data["image_size"] = 24  # as another tool might write it
    data["content_hash"] = content_hash(data)
    path.write_text(json.dumps(data))
    shutil.rmtree(exp / "gan")
    assert "power of two" in cli.user_error("train-gan", "--exp", exp, *TINY)
    assert not (exp / "gan").exists()


def test_select_fidelity_keeps_the_phase1_snapshot_whose_buffer_teaches_best(tmp_path):
    """Each check's reading is logged; the kept snapshot is the (latest) best, and its reading is reproduced from
    the saved phase-1 generator by the buffer train-gan would release from it; the reference GAN reads its own."""
    from fedcli.data.dataset import NodeDataset
    from fedcli.data.manifest import Manifest
    from fedcli.data.tensor_source import TensorSource
    from fedcli.generators.fidelity import selection_judge
    from fedcli.generators.registry import load_generator
    from fedcli.generators.config import GanConfig

    exp = tmp_path / "exp"
    cli = Cli()
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp)
    cli.ok("train-gan", "--exp", exp, "--node", "node0", *TINY, "--fid-every", "3", "--select", "fidelity",
           "--reference", "10")
    folder = exp / "gan" / "node0"
    config = json.loads((folder / "config.json").read_text())
    metrics = pd.read_csv(folder / "metrics.csv")
    checks = metrics[metrics["phase"].astype(str) == "1"].dropna(subset=["selection_accuracy"])
    assert list(checks["iteration"]) == [3, 6, 9, 12]
    best = checks["selection_accuracy"].max()
    phase1 = config["phase1"]
    assert phase1["select"] == "fidelity" and phase1["selection_accuracy"] == pytest.approx(best)
    assert phase1["best_iteration"] == checks[checks["selection_accuracy"] == best]["iteration"].max()
    reference = metrics[metrics["phase"].astype(str) == "reference"]["selection_accuracy"].dropna()
    assert len(reference) == 4 and config["reference"]["selection_accuracy"] == pytest.approx(reference.max())
    manifest = Manifest.load(exp)
    data = NodeDataset(manifest, "node0", "train")
    judge = selection_judge(GanConfig(exp, buffer_size=30, fidelity_epochs=1), manifest, "node0", config["seed"],
                            TensorSource(data.images, data.labels), "cpu")
    assert judge(load_generator(folder, "generator_phase1.safetensors", config)) == phase1["selection_accuracy"]
