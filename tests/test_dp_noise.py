"""train-gan --dp-noise: DP-SGD's noise keyed by the run's seed (reproducible) or drawn from a CSPRNG seeded by the
OS (secure: another draw every run, whatever the seed)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from torch.func import functional_call

from fedcli.core.rng import torch_stream
from fedcli.experiment.config import settled, to_json
from fedcli.generators import private, secure_noise
from fedcli.generators.config import GanConfig
from fedcli.generators.node_training import check_options
from fedcli.generators.stylegan2 import kind as stylegan2
from fedcli.generators.vqvae2 import kind as vqvae2

SEED = 7
PLAN = private.DpPlan(target_epsilon=3.0, delta=1e-3, max_grad_norm=1.0, sample_rate=0.08, steps=10,
                      noise_multiplier=1.0, images=100)
with torch.random.fork_rng():
    torch.manual_seed(0)
    LINEAR, INPUTS, TARGETS = nn.Linear(4, 3), torch.randn(8, 4), torch.randn(8, 3)


def test_the_secure_gaussians_are_standard_normal():
    draws = secure_noise.standard_normal(200_000)
    assert draws.dtype == np.float64 and len(draws) == 200_000
    standard_error = 1 / np.sqrt(len(draws))
    assert abs(draws.mean()) < 5 * standard_error
    assert abs(draws.std() - 1) < 5 * standard_error / np.sqrt(2)
    assert stats.kstest(draws, "norm").pvalue > 1e-3
    assert len(secure_noise.standard_normal(5)) == 5  # an odd count: half a Box-Muller pair is dropped


def test_secure_noise_takes_the_gradients_shape_dtype_and_device_and_never_repeats():
    reference = torch.zeros(300, 40, dtype=torch.float32)
    first, second = (secure_noise.gaussian_like(reference, 2.5) for _ in range(2))
    assert first.shape == reference.shape and first.dtype == torch.float32 and first.device == reference.device
    assert float(first.std()) == pytest.approx(2.5, rel=0.03)
    assert not torch.equal(first, second)


def dp_config(noise: str, **options) -> GanConfig:
    return GanConfig(exp=Path("exp"), dp_epsilon=3.0, dp_noise=noise, **options)


def one_dp_step(noise: str) -> torch.Tensor:
    """A tiny linear model's parameters after one DP-SGD step on fixed data, its noise keyed by SEED or secure;
    torch's global generator seeded too, so only a source outside torch can tell two runs apart."""
    model = copy.deepcopy(LINEAR)
    update = private.DpSgd(model, torch.optim.SGD(model.parameters(), lr=0.1), dataclasses.replace(PLAN, noise=noise),
                           torch_stream(SEED, "node0", "train-gan-dp-noise"))

    def loss(params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (functional_call(model, params, (x[None],)) - y).square().sum()

    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        assert update.step(loss, INPUTS, TARGETS)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_under_secure_noise_two_runs_with_one_seed_draw_different_noise_while_keyed_ones_repeat():
    assert torch.equal(one_dp_step("keyed"), one_dp_step("keyed"))
    assert not torch.equal(one_dp_step("secure"), one_dp_step("secure"))
    # the runs' configs and dp records differ only in the noise's source
    keyed, secure = to_json(dp_config("keyed")), to_json(dp_config("secure"))
    assert {k for k in keyed if keyed[k] != secure[k]} == {"dp_noise"}
    records = {noise: dataclasses.replace(PLAN, noise=noise).record() for noise in ("keyed", "secure")}
    assert {k for k in records["keyed"] if records["keyed"][k] != records["secure"][k]} == {"noise"}
    assert records["keyed"]["noise"] == "keyed" and records["secure"]["noise"] == "secure (ChaCha20, OS entropy)"
    assert "dp_noise" not in settled(keyed)  # the default leaves every existing fingerprint as it was


def test_secure_noise_on_the_summed_gradient_has_std_sigma_times_c():
    model = nn.Linear(200, 100)
    plan = dataclasses.replace(PLAN, noise="secure", noise_multiplier=2.0, max_grad_norm=0.5)
    update = private.DpSgd(model, torch.optim.SGD(model.parameters(), lr=0.1), plan, torch.Generator())
    assert update.noised_mean(None, torch.zeros(0, 200))  # an empty Poisson draw: the noise alone
    noise = torch.cat([p.grad.flatten() for p in model.parameters()]) * plan.expected_batch
    assert float(noise.std()) == pytest.approx(2.0 * 0.5, rel=0.03) and abs(float(noise.mean())) < 0.03


class _Manifest:
    def records(self, node: str, split: str) -> list[dict]:
        return [{}] * 100

    def train_count(self, node: str) -> int:
        return 100


def test_both_kinds_read_the_option_and_their_dp_sgd_draws_secure_noise():
    manifest = _Manifest()
    gan = dp_config("secure")
    vq = dp_config("secure", generator="vqvae2", prior_iterations=5)
    check_options(gan, stylegan2.StyleGan2())
    check_options(vq, vqvae2.VqVae2Kind())
    plans = [stylegan2.dp_plan(gan, manifest, "node0"), vqvae2.dp_plans(vq, manifest, ["node0"])["node0"]]
    for plan in plans:
        assert plan.noise == "secure"
        model = nn.Linear(2, 1)
        update = private.DpSgd(model, torch.optim.SGD(model.parameters(), lr=0.1), plan, torch.Generator())
        assert isinstance(update.optimizer, secure_noise.SecureDPOptimizer)


def test_secure_noise_without_dp_epsilon_is_one_clear_line_and_writes_nothing(tmp_path, cli):
    line = cli.user_error("train-gan", "--exp", tmp_path / "exp", "--dp-noise", "secure")
    assert "--dp-noise secure needs --dp-epsilon" in line
    assert not (tmp_path / "exp").exists()
