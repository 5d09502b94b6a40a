"""A VQ-VAE-2 under --dp-epsilon: the chain hands on weights alone (no codes), each institution trains on its own
images by DP-SGD with gradient codebooks, each image's gradient is its own and clipped, the node's prior composes
into one guarantee, only prior samples are released, and the chain resumes on either engine to the same bytes."""

from __future__ import annotations

import json
import math
import shutil

import pandas as pd
import pytest
import torch

from conftest import Cli, copy_exp
from fedcli.data.dataset import NodeDataset, to_float
from fedcli.data.manifest import Manifest
from fedcli.generators import private
from fedcli.generators.vqvae2 import kind as vqvae2
from fedcli.generators.vqvae2.networks import VqArchitecture, VqVae2
from fedcli.report.tables import audit_phase2_note

DP_VQ = ["--generator", "vqvae2", "--iterations", "6", "--batch", "16", "--vq-channels", "8", "--vq-codebook", "8",
         "--vq-dim", "4", "--prior-iterations", "4", "--prior-channels", "4", "--prior-layers", "1", "--buffer-size",
         "12", "--fidelity-seeds", "0", "--dp-epsilon", "10", "--threads", "1"]


@pytest.fixture(scope="module")
def dp_chain(tmp_path_factory):
    """Two 16 px digits nodes and a DP VQ-VAE-2 chain across them, with what each institution trained on and
    every payload kind the chain sent recorded."""
    exp = tmp_path_factory.mktemp("vq-dp") / "exp"
    Cli().ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp)
    trained, sent, priors = [], [], []
    original_train, original_send = vqvae2.train_vqvae_private, vqvae2.SerialTraining.send
    original_prior = vqvae2.train_prior_private

    def recording(model, images, cfg, plan, *rest):
        trained.append((images.clone(), plan))
        original_train(model, images, cfg, plan, *rest)

    def recording_prior(generator, codes, cfg, plan, *rest):
        priors.append((len(codes), plan))
        original_prior(generator, codes, cfg, plan, *rest)

    def sending(self, round_, sender, receiver, kind, payload, counted=True):
        sent.append(kind)
        original_send(self, round_, sender, receiver, kind, payload, counted)

    vqvae2.train_vqvae_private, vqvae2.SerialTraining.send = recording, sending
    vqvae2.train_prior_private = recording_prior
    try:
        Cli().ok("train-gan", "--exp", exp, *DP_VQ)
    finally:
        vqvae2.train_vqvae_private, vqvae2.SerialTraining.send = original_train, original_send
        vqvae2.train_prior_private = original_prior
    return exp, trained, sent, priors


def test_the_dp_chain_hands_on_weights_alone_and_releases_prior_samples_only(dp_chain):
    exp, trained, sent, priors = dp_chain
    manifest = Manifest.load(exp)
    assert len(trained) == len(priors) == 2
    for (images, plan), (codes, prior_plan), node in zip(trained, priors, manifest.node_names):
        assert torch.equal(images, to_float(NodeDataset(manifest, node, "train").images))  # its own images alone
        # its prior: one code map per image of its own, Poisson-sampled and noised by the same plan
        assert codes == plan.images == len(images) and prior_plan is plan
    assert set(sent) == {"model"}  # no codes leave a node, on the chain or its return leg
    for node in manifest.node_names:
        folder = exp / "gan" / node
        assert sorted(p.name for p in folder.glob("*.safetensors")) == ["buffer.safetensors", "generator.safetensors"]
        record = json.loads((folder / "config.json").read_text())
        assert record["buffer_kind"] == "prior samples" and record["serial"]["replayed"] == {}
        assert "codes" not in record  # no statistic of the node's real images beside the guarantee
        dp = record["dp"]
        assert dp["steps"] == 6 + 4 and dp["parts"] == {"vqvae": 6, "prior": 4}
        assert dp["epsilon"] <= 10 and dp["epsilon"] == pytest.approx(10, rel=0.02) and dp["noise_multiplier"] > 0
        metrics = pd.read_csv(folder / "metrics.csv")
        assert set(metrics.columns) == {"phase", "iteration"}  # no loss, nor a Poisson batch's size, is logged
        assert list(metrics.phase) == ["vqvae"] * 6 + ["prior"] * 4


def test_each_images_gradient_is_its_own_and_the_sum_moves_by_at_most_c_per_image():
    arch = VqArchitecture(resolution=16, channels=1, num_classes=2, hidden=8, codes=8, dim=4, codebook="gradient")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = VqVae2(arch)
        images = torch.rand(4, 1, 16, 16) * 2 - 1
    loss = vqvae2.example_loss(model, beta=0.25)
    plan = private.DpPlan(math.inf, 1e-5, 1e-3, 4 / 100, 10, 0.0, 100)
    update = private.DpSgd(model, torch.optim.Adam(model.parameters(), lr=1e-3), plan, torch.Generator())
    batched = update.per_example_grads(loss, images)
    for i in range(len(images)):  # torch.func's per-example gradient is plain autograd on that image alone
        params = dict(model.named_parameters())
        alone = torch.autograd.grad(loss(params, images[i]), list(params.values()))
        for (name, _), g in zip(params.items(), alone):
            assert torch.allclose(batched[name][i], g, atol=1e-6), name
    assert batched["quant_t.embed"].abs().sum() > 0 and batched["quant_b.embed"].abs().sum() > 0  # codebooks learn
    # the priors' per-image gradient, over both, is autograd on that image's code maps alone
    from fedcli.generators.vqvae2.prior import PriorArchitecture

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        pair = vqvae2.PriorPair(vqvae2.VqGenerator(arch, PriorArchitecture(codes=8, num_classes=2, channels=4,
                                                                             layers=1)))
    top, bottom = torch.randint(8, (3, 2, 2)), torch.randint(8, (3, 4, 4))
    labels = torch.tensor([0, 1, 1])
    prior_update = private.DpSgd(pair, torch.optim.Adam(pair.parameters()), plan, torch.Generator())
    batched = prior_update.per_example_grads(vqvae2.prior_loss(pair), top, bottom, labels)
    params = dict(pair.named_parameters())
    for i in range(3):
        alone = torch.autograd.grad(pair(top[i:i + 1], bottom[i:i + 1], labels[i:i + 1]), list(params.values()))
        for name, g in zip(params, alone):
            assert torch.allclose(batched[name][i], g, atol=1e-6), name

    def summed(batch: torch.Tensor) -> torch.Tensor:
        assert update.noised_mean(loss, batch)
        return torch.cat([p.grad.flatten() for p in model.parameters()]) * plan.expected_batch

    assert (summed(images) - summed(images[1:])).norm() <= 1e-3 * (1 + 1e-4)  # C clips every image here


def dp_run(exp, *more):
    from fedcli.cli import app
    from typer.testing import CliRunner

    return CliRunner().invoke(app, ["train-gan", "--exp", str(exp), "--overwrite", *DP_VQ, *more])


def test_the_dp_chain_resumes_on_the_distributed_engine_to_the_same_bytes(dp_chain, tmp_path, monkeypatch):
    exp = dp_chain[0]
    fresh = copy_exp(exp, tmp_path)
    original = vqvae2.SerialTraining.visit

    def crash(self, k, node, held):
        if k == 1:
            raise KeyboardInterrupt
        return original(self, k, node, held)

    with monkeypatch.context() as patched:
        patched.setattr(vqvae2.SerialTraining, "visit", crash)
        assert dp_run(fresh).exit_code == 130
    nodes = Manifest.load(exp).node_names
    for node in nodes:
        shutil.rmtree(fresh / "gan" / node, ignore_errors=True)
    result = dp_run(fresh, "--engine", "distributed", "--launch", "local")
    assert result.exit_code == 0, result.output
    for node in nodes:  # every process resumed after the first institution (its checkpoint holds no codes)
        assert f"resuming the serial training after {nodes[0]} (1 of 2)" in (fresh / "logs" / f"{node}.log").read_text()
    for node in nodes:
        for name in ("generator.safetensors", "buffer.safetensors", "metrics.csv"):
            assert (fresh / "gan" / node / name).read_bytes() == (exp / "gan" / node / name).read_bytes(), name
        records = [json.loads((e / "gan" / node / "config.json").read_text()) for e in (fresh, exp)]
        assert records[0]["serial"] == records[1]["serial"] and records[0]["dp"] == records[1]["dp"]


def test_a_dp_vqvae2_without_a_prior_and_a_replay_of_its_codes_are_refused_in_one_line(dp_chain, tmp_path, cli):
    exp = copy_exp(dp_chain[0], tmp_path)
    shutil.rmtree(exp / "gan")
    line = cli.user_error("train-gan", "--exp", exp, *DP_VQ, "--prior-iterations", "0")
    assert "--prior-iterations 0 trains no prior" in line and not (exp / "gan").exists()
    exp = copy_exp(dp_chain[0], tmp_path / "replay")
    line = cli.user_error("federate", "--exp", exp, "--strategy", "cwt-replay", "--rounds", "1", "--threads", "1")
    assert "keeps its codes" in line and "--replay-source buffers" in line
    assert not (exp / "federate" / "cwt-replay").exists()


def test_the_audit_states_the_dp_vqvae2s_guarantee_and_checks_its_attack_against_it(dp_chain, tmp_path, cli):
    exp = copy_exp(dp_chain[0], tmp_path)
    cli.ok("audit-privacy", "--exp", exp, "--node", "node0", "--max-images", "20", "--threads", "1")
    summary = json.loads((exp / "audit" / "node0" / "summary.json").read_text())
    assert summary["attack"] == "nearest buffer image"
    assert summary["dp"]["privatised"] == vqvae2.PRIVATISED and "VQ-VAE-2" in summary["note"]
    assert {"holds", "points"} <= set(summary["dp"]["audit_bound"])  # the attack read against e^eps FPR + delta
    assert audit_phase2_note(summary) == ""  # "under DP no phase 2 runs" is a StyleGAN's line


def test_the_frontier_names_each_vqvae2_row_by_what_it_releases():
    from pathlib import Path

    from fedcli.report.collect import SubExperiment
    from fedcli.report.frontier import generator_setting

    def sub(**config) -> SubExperiment:
        gans = [{"node": node, "config": {"generator": "vqvae2", **config}} for node in ("node0", "node1")]
        return SubExperiment(Path("."), {}, None, [], [], gans, [])

    assert generator_setting(sub(prior_iterations=0))[1] == "VQ-VAE-2: decoded codes"
    assert generator_setting(sub(prior_iterations=800))[1] == "VQ-VAE-2: prior samples"
    assert generator_setting(sub(prior_iterations=800, dp_epsilon=10.0))[:3] == (
        "VQ-VAE-2 DP", "VQ-VAE-2 DP epsilon 10: prior samples", 10.0)
