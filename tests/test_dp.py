"""Differentially private generators (train-gan --dp-epsilon): the accountant, per-image clipping, the
noise, Poisson sampling, refusals, and the audit's DP sanity bound."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.optimize import minimize_scalar

from conftest import TINY_GAN, Cli
from fedcli.audit import effects
from fedcli.core.errors import UserError
from fedcli.generators import private
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.stylegan2.networks import Architecture, Discriminator
from fedcli.generators.stylegan2.train import GanTrainer, TrainSettings, build_networks

ARCH = Architecture(resolution=16, channels=1, num_classes=10, z_dim=16, w_dim=16, channel_base=128, channel_max=16)
_PP = TINY_GAN.index("--pp-iterations")
TINY_DP = TINY_GAN[:_PP] + TINY_GAN[_PP + 2:]  # an explicit phase 2 is refused under DP


def closed_form_epsilon(sigma: float, steps: int, delta: float) -> float:
    """The Gaussian mechanism without sampling: RDP T x alpha / (2 sigma^2) at every order alpha, converted to
    (epsilon, delta) as the RDP accountant does (Balle et al. 2020), minimised over continuous alpha."""
    def epsilon(alpha: float) -> float:
        return (steps * alpha / (2 * sigma ** 2) + math.log((alpha - 1) / alpha)
                - (math.log(delta) + math.log(alpha)) / (alpha - 1))

    return float(minimize_scalar(epsilon, bounds=(1.01, 500), method="bounded").fun)


@pytest.mark.parametrize("sigma,steps,delta", [(2.0, 10, 1e-5), (5.0, 100, 1e-3)])
def test_the_accountant_matches_the_closed_form_gaussian_rdp_at_sample_rate_one(sigma, steps, delta):
    spent = private.spent_epsilon(sigma, 1.0, steps, delta)
    assert spent == pytest.approx(closed_form_epsilon(sigma, steps, delta), rel=0.05)


@pytest.mark.parametrize("epsilon", [1.0, 3.0, 10.0])
def test_the_solved_noise_spends_the_target_by_an_independent_accountant(epsilon):
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    plan = private.plan(epsilon, None, 1.0, batch=32, images=479, steps=300, node="node0")
    assert plan.delta == pytest.approx(1 / 4790) and plan.sample_rate == pytest.approx(32 / 479)
    event = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(plan.sample_rate, dp_event.GaussianDpEvent(plan.noise_multiplier)), 300)
    rdp, pld = rdp_privacy_accountant.RdpAccountant(), pld_privacy_accountant.PLDAccountant()
    spent = plan.record()["epsilon"]
    assert spent <= epsilon and spent == pytest.approx(epsilon, rel=0.02)
    assert rdp.compose(event).get_epsilon(plan.delta) == pytest.approx(spent, rel=0.05)
    # RDP is an upper bound: the tighter PLD accounting of the same mechanism must not exceed it
    assert pld.compose(event).get_epsilon(plan.delta) <= spent * 1.001


def private_discriminator(sigma: float, clip: float, expected_batch: int = 8) -> private.PrivateUpdate:
    _, discriminator = build_networks(ARCH, seed_value=3, mbstd_group=1)
    plan = private.DpPlan(math.inf, 1e-5, clip, expected_batch / 400, 10, sigma, 400)
    adam = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    return private.PrivateUpdate(discriminator, adam, plan, torch.Generator().manual_seed(5))


def summed_clipped(update: private.PrivateUpdate, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    assert update.noised_mean(update.real_loss(0.5), images, labels)
    return torch.cat([p.grad.flatten() for p in update.D.parameters()]) * update.dp.expected_batch


def test_adding_or_removing_one_image_moves_the_summed_clipped_gradient_by_at_most_c():
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(6, 1, 16, 16, generator=generator)
    labels = torch.tensor([0, 1, 2, 3, 4, 5])
    for clip in (1e-3, 1.0, 1e3):  # clipping every gradient, some, none
        update = private_discriminator(sigma=0.0, clip=clip)
        with_all = summed_clipped(update, images, labels)
        without_one = summed_clipped(update, images[1:], labels[1:])
        assert (with_all - without_one).norm() <= clip * (1 + 1e-4)
    # one norm over every parameter, the conditioning embedding included: a tiny C clips the whole gradient
    update = private_discriminator(sigma=0.0, clip=1e-3)
    summed_clipped(update, images[:1], labels[:1])
    grads = dict(zip([n for n, _ in update.D.named_parameters()], [p.grad * 8 for p in update.D.parameters()]))
    assert grads["embed.weight"].abs().sum() > 0
    assert torch.cat([g.flatten() for g in grads.values()]).norm() == pytest.approx(1e-3, rel=1e-3)


def test_the_added_noise_has_std_sigma_times_c():
    update = private_discriminator(sigma=2.0, clip=0.5)
    noise = summed_clipped(update, torch.zeros(0, 1, 16, 16), torch.zeros(0, dtype=torch.long))
    assert noise.numel() > 10_000
    assert float(noise.std()) == pytest.approx(2.0 * 0.5, rel=0.03) and abs(float(noise.mean())) < 0.03


def test_real_images_are_drawn_by_poisson_sampling_at_rate_q():
    generator = torch.Generator().manual_seed(1)
    n, q, draws = 200, 0.1, 2000
    masks = torch.zeros(draws, n)
    for i in range(draws):
        masks[i, private.poisson_batch(n, q, generator)] = 1
    sizes = masks.sum(dim=1)
    assert float(masks.mean()) == pytest.approx(q, rel=0.03)  # every image at rate q
    assert float(masks.mean(dim=0).std()) < 0.02  # no image favoured
    assert float(sizes.var()) == pytest.approx(n * q * (1 - q), rel=0.15)  # binomial batch sizes, not fixed


def test_the_private_trainer_samples_by_poisson_and_labels_fakes_uniformly():
    labels = torch.tensor([0] * 90 + [1] * 10)
    plan = private.plan(10.0, None, 1.0, batch=8, images=100, steps=5, node="node0")
    trainer = GanTrainer(ARCH, TrainSettings(batch=8, fid_images=8), torch.zeros(100, 1, 16, 16), labels,
                         perceptual=Perceptual("alex"), features=_Features(),
                         generator=torch.Generator().manual_seed(2),
                         init_seed=4, dp=plan, noise=torch.Generator().manual_seed(6))
    sizes = {len(trainer._real_batch()[0]) for _ in range(30)}
    assert len(sizes) > 2  # Poisson: the batch size varies
    fakes = trainer._fake_labels(4000)
    assert float((fakes == 1).float().mean()) == pytest.approx(0.5, abs=0.03)  # not the 10% histogram
    assert trainer.D.mbstd_group == 1


class _Features:
    calibrated = True

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return images.flatten(1)[:, :4]


def test_training_refuses_a_discriminator_that_mixes_samples():
    generator = torch.Generator().manual_seed(0)
    private.check_per_sample(Discriminator(ARCH, mbstd_group=1), ARCH, generator)
    with pytest.raises(UserError, match="mixes samples"):
        private.check_per_sample(Discriminator(ARCH, mbstd_group=4), ARCH, generator)

    class WithBatchNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm2d(1)

        def forward(self, x, labels):
            return self.norm(x).flatten(1).sum(dim=1)

    with pytest.raises(UserError, match="mixes samples"):
        private.check_per_sample(WithBatchNorm(), ARCH, generator)


def test_the_dp_bound_check_flags_an_attack_above_e_to_the_epsilon_fpr_plus_delta():
    mia = {"tpr_at_fpr": {"0.1": {"fpr": 0.1, "tpr": 0.2}, "0.01": None}, "tpr_at_min_fpr": {"fpr": 0.05, "tpr": 0.1}}
    assert effects.dp_bound(mia, epsilon=1.0, delta=0.0, non_members=200)["holds"]  # 0.2 <= e x 0.1
    assert not effects.dp_bound(mia, epsilon=0.1, delta=0.0, non_members=200)["holds"]  # 0.2 > 1.105 x 0.1


def test_the_dp_bound_says_when_it_cannot_fail():
    """At 40 non-members the lowest resolvable FPR is 0.25, where e^epsilon x FPR reaches 1 for every epsilon above
    ln 4: the bound then holds for any attack, and says so."""
    mia = {"tpr_at_fpr": {"0.1": None}, "tpr_at_min_fpr": {"fpr": 0.25, "tpr": 1.0}}
    loose = effects.dp_bound(mia, epsilon=3.0, delta=1e-3, non_members=40)
    assert loose["holds"] and not loose["informative"] and loose["non_members"] == 40
    assert effects.dp_bound(mia, epsilon=1.0, delta=1e-3, non_members=40)["informative"]


@pytest.fixture(scope="module")
def dp_exp(tmp_path_factory):
    exp = tmp_path_factory.mktemp("dp") / "exp"
    cli = Cli()
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp)
    cli.ok("train-gan", "--exp", exp, *TINY_DP, "--dp-epsilon", "3")
    cli.ok("audit-privacy", "--exp", exp, "--max-images", "60", "--steps", "3")
    return exp


def test_a_dp_generator_records_its_guarantee_and_the_audit_stays_within_it(dp_exp):
    for node in ("node0", "node1"):
        saved = json.loads((dp_exp / "gan" / node / "config.json").read_text())
        dp = saved["dp"]
        assert set(dp) >= {"epsilon", "delta", "noise_multiplier", "max_grad_norm", "sample_rate", "steps",
                           "accountant"}
        train = len(json.loads((dp_exp / "partition" / "manifest.json").read_text())["nodes"][int(node[-1])]["train"])
        assert dp["delta"] == pytest.approx(1 / (10 * train)) and dp["sample_rate"] == pytest.approx(8 / train)
        assert dp["epsilon"] <= 3 and dp["steps"] == 12 and dp["noise_multiplier"] > 0
        # fixed iterations, no phase 2, ADA off (R1 stays, per image inside the clipped gradient)
        assert saved["phase1"]["iterations"] == 12 and saved["phase2"]["iterations"] == 0
        assert saved["settings"]["r1_gamma"] > 0 and saved["config"]["pp_iterations"] == 0
        metrics = pd.read_csv(dp_exp / "gan" / node / "metrics.csv")
        assert (metrics["ada_p"] == 0).all() and set(metrics["phase"].astype(str)) == {"1"}
        summary = json.loads((dp_exp / "audit" / node / "summary.json").read_text())
        assert summary["dp"]["epsilon"] == dp["epsilon"] and summary["dp"]["audit_bound"]["holds"]
        # the sanity bound, recomputed from the audit's distances at every resolvable FPR
        frame = pd.read_csv(dp_exp / "audit" / node / "distances.csv")
        frame = frame[frame.generator == "privacy"]
        members, others = -frame[frame.member == 1].lpips.to_numpy(), -frame[frame.member == 0].lpips.to_numpy()
        for fpr in np.arange(1, len(others)) / len(others):
            point = effects.tpr_at_fpr(members, others, fpr)
            assert point["tpr"] <= math.exp(dp["epsilon"]) * point["fpr"] + dp["delta"]


def test_a_generator_trained_without_dp_has_no_dp_record(tmp_path, cli):
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp)
    cli.ok("train-gan", "--exp", exp, *TINY_GAN, "--node", "node0", "--fidelity-seeds", "0")
    assert "dp" not in json.loads((exp / "gan" / "node0" / "config.json").read_text())


def test_a_plan_without_opacus_installed_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "opacus" else real(name, *a))
    with pytest.raises(UserError, match=r"pip install 'fedcli\[dp\]'"):
        private.plan(3.0, None, 1.0, 8, 719, 12, "node0")


@pytest.mark.parametrize("epsilon", [0.001, 3.0])
def test_solving_a_plan_prints_no_accountant_warning_of_its_trial_noises(epsilon):
    """The search for sigma tries quiet noises whose best RDP order lies past the largest one; Opacus warns of
    each, lines a user would see above the one-line refusal (or the answer) that they cannot act on."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if epsilon < 1:
            with pytest.raises(UserError, match="too small for 12 discriminator steps"):
                private.plan(epsilon, None, 1.0, 8, 719, 12, "node0")
        else:
            plan = private.plan(epsilon, None, 1.0, 8, 719, 12, "node0")
            assert plan.record()["epsilon"] <= epsilon


@pytest.mark.parametrize("options,words", [
    (["--dp-epsilon", "0"], "--dp-epsilon must be positive"),
    (["--dp-epsilon", "-1"], "--dp-epsilon must be positive"),
    (["--dp-epsilon", "nan"], "--dp-epsilon must be a number, got nan"),
    (["--dp-epsilon", "-inf"], "--dp-epsilon must be a finite number"),
    (["--dp-epsilon", "often"], "--dp-epsilon must be a positive number, inf"),
    (["--dp-epsilon", "3", "--dp-delta", "0.01"], "is at least 1 / N"),
    (["--dp-epsilon", "0.001"], "too small for 12 discriminator steps"),
    (["--dp-epsilon", "3", "--pp-iterations", "50"], "--pp-iterations 50 with --dp-epsilon"),
    (["--dp-epsilon", "3", "--controls"], "--controls with --dp-epsilon"),
    (["--dp-epsilon", "3", "--select", "fidelity"], "--select fidelity with --dp-epsilon"),
    (["--dp-delta", "1e-5"], "--dp-delta needs --dp-epsilon"),
])
def test_bad_dp_options_are_one_clear_line_and_write_nothing(tmp_path, cli, options, words):
    exp = tmp_path / "exp"
    cli.ok("partition", "--nodes", "2", "--image-size", "16", "--exp", exp)
    line = cli.user_error("train-gan", "--exp", exp, *TINY_DP, *options)
    assert words in line
    assert not (exp / "gan").exists() or not any((exp / "gan").iterdir())
