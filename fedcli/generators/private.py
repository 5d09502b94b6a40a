"""Differentially private discriminator training: DP-SGD (Abadi et al. 2016) through Opacus.

The discriminator is the only network that reads real images, so only its updates are privatised;
the generator learns from the discriminator's outputs on synthetic images alone, and it and its
buffer are private by post-processing. Each D step:

- draws the real batch by Poisson sampling (every training image independently with probability
  q = batch / N), the sampling the RDP accountant's amplification assumes;
- computes every real image's own gradient (its logistic loss plus, on R1 steps, its R1 penalty,
  whose double backward runs per sample under torch.func.vmap);
- hands them to Opacus's DPOptimizer, which clips each to L2 norm C over all D parameters (the
  conditioning embedding included), sums them, adds Gaussian noise of std sigma x C and divides by
  the expected batch q x N; the noise comes from a generator keyed by the run's seed (`keyed`, reproducible:
  private only while the seed stays secret) or from a CSPRNG seeded by the OS (`secure`, generators/secure_noise.py);
- adds the synthetic half of the loss without clipping or noise: it reads no real image.

The noise multiplier sigma is solved from the target epsilon for the planned steps (Opacus's RDP
accountant), and the epsilon reported is that accountant's for the steps taken. The unit of privacy
is one training image.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import warnings
from collections.abc import Sequence

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedcli.core.errors import UserError
from fedcli.generators import losses

ACCOUNTANT = "rdp (opacus)"
NOISE = {"keyed": "keyed", "secure": "secure (ChaCha20, OS entropy)"}  # --dp-noise: config.json's dp.noise
# Opacus's default RDP orders run to 63; a few steps at a low noise need higher ones for a tight bound
ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 256))


@dataclasses.dataclass(frozen=True)
class DpPlan:
    """What the accountant needs and what it says: the keys of config.json's `dp`."""

    target_epsilon: float  # inf: the DP code path (sampling, clipping) with no noise
    delta: float
    max_grad_norm: float
    sample_rate: float
    steps: int
    noise_multiplier: float
    images: int
    noise: str = "keyed"  # a key of NOISE

    @property
    def expected_batch(self) -> float:
        return self.sample_rate * self.images

    def record(self) -> dict:
        """config.json's `dp`: the epsilon the accountant gives for the steps taken, and every input."""
        return {"epsilon": spent_epsilon(self.noise_multiplier, self.sample_rate, self.steps, self.delta),
                "target_epsilon": self.target_epsilon, "delta": self.delta,
                "noise_multiplier": self.noise_multiplier, "max_grad_norm": self.max_grad_norm,
                "sample_rate": self.sample_rate, "steps": self.steps, "accountant": ACCOUNTANT,
                "unit": "one training image", "sampling": "poisson", "noise": NOISE[self.noise]}


def default_delta(images: int) -> float:
    """1 / (10 N): well under the 1 / N at which releasing one random image outright would be allowed."""
    return 1 / (10 * images)


def plan(epsilon: float, delta: float | None, max_grad_norm: float, batch: int, images: int, steps: int,
         node: str, what: str = "discriminator steps", fewer: str = "--iterations", noise: str = "keyed") -> DpPlan:
    """The noise multiplier that spends `epsilon` over `steps` DP-SGD steps (`what` they are, and the options
    that lower them, `fewer`, for a refusal) at sample rate batch / N, refusing a delta of 1 / N or more and an
    epsilon that only noise louder than the gradients could meet; `noise`: where the noise comes from (NOISE)."""
    if importlib.util.find_spec("opacus") is None:
        raise UserError("--dp-epsilon needs Opacus, which is not installed: pip install 'fedcli[dp]'")
    if noise == "secure" and importlib.util.find_spec("cryptography") is None:
        raise UserError("--dp-noise secure needs the cryptography package, which is not installed: "
                        "pip install 'fedcli[dp]'")
    delta = default_delta(images) if delta is None else delta
    if delta >= 1 / images:
        raise UserError(f"--dp-delta {delta:g} is at least 1 / N = 1 / {images} for node {node}: such a delta allows "
                        f"releasing a training image outright; use a delta below {1 / images:.3g} (default 1 / (10 N))")
    sample_rate = min(1.0, batch / images)
    sigma = 0.0 if math.isinf(epsilon) else solve_noise(epsilon, delta, sample_rate, steps, what, fewer)
    # the noise on the averaged gradient (std sigma x C / expected batch, per coordinate) would exceed the
    # largest averaged gradient itself (norm C): every step would be mostly noise
    if sigma > sample_rate * images:
        raise UserError(f"--dp-epsilon {epsilon:g} is too small for {steps} {what} on node {node}'s "
                        f"{images} images: it needs noise multiplier {sigma:.3g}, more than the expected batch "
                        f"({sample_rate * images:.3g}); raise --dp-epsilon or lower {fewer}")
    return DpPlan(epsilon, delta, max_grad_norm, sample_rate, steps, sigma, images, noise)


def solve_noise(epsilon: float, delta: float, sample_rate: float, steps: int, what: str = "discriminator steps",
                fewer: str = "--iterations") -> float:
    from opacus.accountants.utils import get_noise_multiplier

    try:
        with warnings.catch_warnings():  # the search's quiet trial sigmas peak past any order; the plan's do not
            warnings.filterwarnings("ignore", "Optimal order is the largest alpha", UserWarning)
            return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
                                              steps=steps, accountant="rdp", epsilon_tolerance=0.01 * epsilon,
                                              alphas=ORDERS))
    except ValueError as exc:  # Opacus: sigma would pass its ceiling
        raise UserError(f"--dp-epsilon {epsilon:g} is too small for {steps} {what} ({exc}); raise "
                        f"--dp-epsilon or lower {fewer}") from exc


def spent_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """The RDP accountant's epsilon at `delta` after `steps` Poisson-sampled Gaussian steps."""
    if noise_multiplier == 0:
        return math.inf
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    return float(accountant.get_epsilon(delta, alphas=ORDERS))


def poisson_batch(images: int, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of the images drawn, each independently with probability `sample_rate`."""
    return torch.nonzero(torch.rand(images, generator=generator, device=generator.device) < sample_rate).flatten()


def check_per_sample(discriminator: nn.Module, arch, generator: torch.Generator) -> None:
    """Refuse a discriminator whose output for one image depends on the others in its batch (minibatch
    standard deviation, BatchNorm): per-sample clipping would then not bound one image's influence."""
    shape = (4, arch.channels, arch.resolution, arch.resolution)
    x = torch.randn(shape, generator=generator, device=generator.device)
    labels = torch.arange(4, device=x.device) % arch.num_classes
    changed = x.clone()
    changed[0] = torch.randn(shape[1:], generator=generator, device=generator.device)
    was = discriminator.training
    with torch.no_grad():
        discriminator.train()
        before, after = discriminator(x, labels), discriminator(changed, labels)
    discriminator.train(was)
    if not torch.equal(before[1:], after[1:]):
        raise UserError("the discriminator mixes samples (one image's output depends on the others in its batch), "
                        "so per-sample clipping would not bound an image's influence; DP training needs a "
                        "discriminator without minibatch statistics")


class DpSgd:
    """An optimiser under DP-SGD: Adam wrapped by Opacus's DPOptimizer, fed per-example gradients of a loss of
    one example computed by torch.func (no hooks: any module, masked or functional layers included). Its noise
    comes from `noise` (keyed), or under the plan's secure noise from generators/secure_noise.py, `noise` unused."""

    def __init__(self, module: nn.Module, adam: torch.optim.Optimizer, dp: DpPlan, noise: torch.Generator):
        secure = dp.noise == "secure"
        if secure:
            from fedcli.generators.secure_noise import SecureDPOptimizer as optimizer
        else:
            from opacus.optimizers import DPOptimizer as optimizer

        self.module, self.dp = module, dp
        self.optimizer = optimizer(adam, noise_multiplier=dp.noise_multiplier, max_grad_norm=dp.max_grad_norm,
                                   expected_batch_size=dp.expected_batch, loss_reduction="mean",
                                   generator=None if secure else noise)

    def per_example_grads(self, loss, *batch: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every example's gradient of `loss(params, *one_example)`, by parameter name."""
        params = {name: p.detach() for name, p in self.module.named_parameters()}
        return vmap(grad(loss), in_dims=(None, *(0,) * len(batch)))(params, *batch)

    def noised_mean(self, loss, *batch: torch.Tensor) -> bool:
        """Set every parameter's .grad to the DP estimate of the batch's mean gradient: per-example gradients
        clipped to C, summed, Gaussian noise of std sigma x C added, divided by the expected batch. False when
        Opacus skips the step."""
        self.optimizer.zero_grad(set_to_none=True)
        if len(batch[0]):
            grads = self.per_example_grads(loss, *batch)
        else:  # an empty Poisson draw: one zero gradient, which clipping leaves at zero
            grads = {name: torch.zeros((1, *p.shape), device=p.device) for name, p in self.module.named_parameters()}
        for name, p in self.module.named_parameters():
            p.grad_sample = grads[name]
        return self.optimizer.pre_step()

    def step(self, loss, *batch: torch.Tensor, exact: Sequence[torch.Tensor] = ()) -> bool:
        """One DP-SGD update of the module on `batch`, plus `exact`: gradients (one per parameter) of a loss that
        reads no real image, added without clipping or noise. False when Opacus skips the step."""
        if not self.noised_mean(loss, *batch):
            return False
        for p, extra in zip(self.module.parameters(), exact):
            p.grad.add_(extra)
        self.optimizer.original_optimizer.step()
        return True


class PrivateUpdate(DpSgd):
    """D's optimiser under DP-SGD: the real half's per-image gradients privatised, the fake half's added."""

    @property
    def D(self) -> nn.Module:
        return self.module

    def real_loss(self, r1_weight: float):
        """softplus(-D(x)) + r1_weight x |dD/dx|^2 of one real image, as a function of D's parameters."""
        def loss(p: dict, x: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
            def logit(image: torch.Tensor) -> torch.Tensor:
                return functional_call(self.D, p, (image.unsqueeze(0), label.unsqueeze(0)))[0]

            value = losses.d_real(logit(x))
            if r1_weight:
                value = value + r1_weight * grad(logit)(x).square().sum()
            return value

        return loss

    def d_step(self, reals: torch.Tensor, labels: torch.Tensor, r1_weight: float, fake_loss: torch.Tensor) -> None:
        """One D update: the noised mean of the real half plus fake_loss's own gradient, which reads no real
        image and so needs neither clipping nor noise."""
        fake_grads = torch.autograd.grad(fake_loss, list(self.D.parameters()))
        self.step(self.real_loss(r1_weight), reals, labels, exact=fake_grads)
