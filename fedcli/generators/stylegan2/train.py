"""Training one node's GAN: phase 1 (standard, FID early stopping), phase 2 (privacy loss) and its control.

Phase 1 trains without L_PP; its snapshot rule (fedcli/generators/stylegan2/selection.py: by default the latest
snapshot whose FID is within the checks' own noise of the lowest, stopping after `patience`
iterations without one; or the snapshot whose buffer teaches a classifier best) keeps the "standard
GAN". Phase 2 fine-tunes from that snapshot with L_G - alpha * L_PP and stops when FID exceeds
`fid_factor` times the kept phase-1 snapshot's FID (or at its iteration cap); its generator is the last
snapshot whose FID was within the factor. The control generator is phase 2 again at alpha = 0, as many
iterations as the kept snapshot had.
Every random draw comes from the trainer's generator, keyed by (seed, node) by the caller.

After StyleGAN2-ADA: lazy R1, an EMA generator whose half-life ramps up with the images seen,
ADA, style-mixing regularisation (with probability `style_mixing` a batch's blocks take their w
from two latents, split at a random block, so no block relies on its neighbours sharing a w), and
each class's mean w tracked for truncation.

`--precision bf16|fp16` runs the synthesis network and D under autocast, with StyleGAN2-ADA's fp32 islands: the
mapping network, R1 (a gradient of a gradient), the losses' reductions and the EMA; fp16 scales each optimiser's
loss. Under DP-SGD the whole D step is fp32: clipping per-example gradient norms and calibrated noise assume
fp32 sums (a bf16 norm is off by up to 0.4%, which would break the clipping bound the accountant relies on).
`--compile` compiles D's forward for the passes that need no second derivative (torch.compile's graphs have no
double backward, so R1 runs eager D) and the synthesis network.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from fedcli.core.precision import Scaled, autocast, full
from fedcli.generators import fid, losses
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.private import DpPlan, PrivateUpdate, check_per_sample, poisson_batch
from fedcli.generators.stylegan2 import ada
from fedcli.generators.stylegan2.networks import Architecture, Discriminator, Generator
from fedcli.generators.stylegan2.selection import SnapshotSelection


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    batch: int = 32
    lr: float = 0.0025
    r1_gamma: float = 0.05
    r1_every: int = 4  # lazy R1: every k-th D step, weighted by k
    ema_kimg: float = 2.0  # EMA half-life in thousands of images, at most ema_rampup x the images seen
    ema_rampup: float = 0.05
    style_mixing: float = 0.9
    ada_target: float = 0.6
    ada_kimg: float = 20.0  # images (thousands) for p to travel from 0 to 1
    alpha: float = 1.0
    privacy_loss: str = "all-pairs"  # or "nearest" (losses.nearest_privacy_loss)
    privacy_scale: str = "absolute"  # or "relative": L_PP over losses.real_reference
    iterations: int = 400  # phase-1 cap
    patience: int = 400
    select: str = "stable"  # phase 1's snapshot rule (fedcli/generators/stylegan2/selection.py)
    pp_iterations: int = 200  # phase-2 cap
    fid_every: int = 100
    fid_images: int = 512
    fid_factor: float = 2.5
    precision: str = "fp32"
    compile: bool = False


def build_networks(arch: Architecture, seed_value: int, mbstd_group: int = 4) -> tuple[Generator, Discriminator]:
    """Networks initialised from a keyed seed, leaving the global generator untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_value)
        return Generator(arch), Discriminator(arch, mbstd_group)


class GanTrainer:
    def __init__(self, arch: Architecture, settings: TrainSettings, images: torch.Tensor, labels: torch.Tensor,
                 perceptual: Perceptual, features: fid.FeatureSpace, generator: torch.Generator,
                 init_seed: int, device: str = "cpu", dp: DpPlan | None = None,
                 noise: torch.Generator | None = None, judge: Callable[[Generator], float] | None = None):
        """With `dp`, D trains by DP-SGD (generators/private.py) with its Gaussian noise drawn from `noise`, its
        minibatch-std group is one image (nothing mixes samples), ADA stays off (its p would follow D's
        outputs on real images) and fake labels are uniform over the node's classes (not its histogram).
        `judge` reads a snapshot for `--select fidelity` (generators/fidelity.py SelectionJudge)."""
        if settings.select == "fidelity" and judge is None:
            raise ValueError("--select fidelity needs a judge")
        self.arch, self.s, self.device, self.rng, self.dp, self.judge = arch, settings, device, generator, dp, judge
        self.reals = images.to(device)  # float [-1, 1]
        self.labels = labels.to(device)
        self.classes = torch.unique(self.labels)
        self.G, self.D = (net.to(device) for net in build_networks(arch, init_seed, 1 if dp else 4))
        self.G_ema = copy.deepcopy(self.G).eval().requires_grad_(False)
        betas = (0.0, 0.99)
        r1_ratio = settings.r1_every / (settings.r1_every + 1)
        self.opt_g = torch.optim.Adam(self.G.parameters(), lr=settings.lr, betas=betas)
        self.opt_d = torch.optim.Adam(self.D.parameters(), lr=settings.lr * r1_ratio,
                                      betas=(0.0, 0.99 ** r1_ratio))
        self.step_g, self.step_d = (Scaled(opt, settings.precision, device) for opt in (self.opt_g, self.opt_d))
        self.compiled = None  # (D's forward, the synthesis network) under --compile
        if settings.compile:
            # every synthesis and D block is a code object compiled once per width: more than dynamo's default 8
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self.compiled = torch.compile(self.D), torch.compile(self.G.synthesis)
        self.private = None
        if dp is not None:
            check_per_sample(self.D, arch, generator)
            self.private = PrivateUpdate(self.D, self.opt_d, dp, noise)
        self.ada = ada.AdaptiveAugment(settings.ada_target, settings.ada_kimg)
        self.perceptual = perceptual.to(device)
        self.features = features
        self.iteration = 0
        self.images_seen = 0
        self._order = torch.empty(0, dtype=torch.long)
        with torch.no_grad():  # an uncalibrated space's FID reads in units of the real features' spread
            self.frechet = fid.Frechet(self._embed(self.reals[: settings.fid_images]), features.calibrated)
        # every real image's LPIPS features, for the nearest-form privacy loss
        self.real_lpips = self.perceptual.features_of(self.reals) if settings.privacy_loss == "nearest" else None
        self.privacy_reference = 1.0
        if settings.privacy_scale == "relative":  # all-pairs: a mean, estimated on the FID's real images
            reference_features = self.real_lpips or self.perceptual.features_of(self.reals[: settings.fid_images])
            self.privacy_reference = losses.real_reference(self.perceptual, reference_features, settings.privacy_loss)

    # -- sampling helpers ------------------------------------------------------------------
    def _randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.rng, device=self.rng.device).to(self.device)

    def _real_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Epochs of shuffled real images without replacement; under DP a Poisson draw."""
        if self.dp is not None:
            index = poisson_batch(len(self.reals), self.dp.sample_rate, self.rng).to(self.device)
            return self.reals[index], self.labels[index]
        b = self.s.batch
        if len(self._order) < b:
            more = torch.randperm(len(self.reals), generator=self.rng, device=self.rng.device).to(self.device)
            self._order = torch.cat([self._order, more])
        index, self._order = self._order[:b], self._order[b:]
        return self.reals[index], self.labels[index]

    def _fake_labels(self, n: int) -> torch.Tensor:
        """Labels drawn from the node's own label distribution; under DP uniform over its classes."""
        pool = self.classes if self.dp is not None else self.labels
        pick = torch.randint(0, len(pool), (n,), generator=self.rng, device=self.rng.device).to(self.device)
        return pool[pick]

    def _uniform(self) -> float:
        return float(torch.rand((), generator=self.rng, device=self.rng.device))

    def _generate(self, labels: torch.Tensor, track: bool = False) -> torch.Tensor:
        """Training fakes from G, style-mixed with probability `style_mixing`."""
        with full(self.s.precision, self.device):
            w = self.G.styles(self._randn(len(labels), self.arch.z_dim), labels)
            if track:
                self.G.track_w_avg(w, labels)
            if self._uniform() < self.s.style_mixing and self.G.num_ws > 1:
                cutoff = int(torch.randint(1, self.G.num_ws, (), generator=self.rng, device=self.rng.device))
                other = self.G.styles(self._randn(len(labels), self.arch.z_dim), labels)
                w = torch.stack([w if i < cutoff else other for i in range(self.G.num_ws)], dim=1)
        synthesis = self.compiled[1] if self.compiled else self.G.synthesis
        return synthesis(w, generator=self.rng)

    # -- one iteration -----------------------------------------------------------------------
    def step(self, alpha: float = 0.0) -> dict[str, float]:
        """One D step and one G step; alpha > 0 adds the privacy loss to the G step."""
        s, b = self.s, self.s.batch
        reals, real_labels = self._real_batch()
        p = self.ada.p

        self.D.requires_grad_(True)
        fake_labels = self._fake_labels(b)
        with torch.no_grad(), self._amp():
            fakes = self._generate(fake_labels, track=True)
        augmented_reals = ada.augment(reals, p, self.rng)  # under DP p stays 0: the reals themselves
        with (full if self.private is not None else autocast)(s.precision, self.device):
            fake_logits = self._forward_d(ada.augment(fakes, p, self.rng), fake_labels).float()
        do_r1 = s.r1_gamma > 0 and self.iteration % s.r1_every == 0
        if self.private is not None:
            loss_d = self._private_d_step(augmented_reals, real_labels, fake_logits, do_r1)
            r1 = torch.tensor(math.nan)
        else:
            loss_d, r1 = self._d_step(augmented_reals, real_labels, fake_logits, do_r1)

        self.D.requires_grad_(False)
        gen_labels = self._fake_labels(b)
        with self._amp():
            fakes = self._generate(gen_labels)
            logits = self._forward_d(ada.augment(fakes, p, self.rng), gen_labels)
        loss_g = losses.g_nonsaturating(logits.float())
        metrics = {"loss_g": loss_g.item(), "loss_d": loss_d.item(), "r1": r1.item() if do_r1 else math.nan,
                   "ada_p": p, "rt": self.ada.rt}
        if alpha > 0:
            with self._amp():
                if self.real_lpips is not None:
                    l_pp, mean_pp = losses.nearest_privacy_loss(self.perceptual, self.real_lpips, fakes)
                else:
                    l_pp, mean_pp = losses.privacy_loss(self.perceptual, reals, fakes)
            l_pp, mean_pp = l_pp.float(), mean_pp.float()
            loss_g = loss_g - alpha * l_pp / self.privacy_reference
            metrics.update(l_pp=l_pp.item(), lpips_mean=mean_pp.item())
        self.opt_g.zero_grad(set_to_none=True)
        self.step_g.step(loss_g)

        self.iteration += 1
        self.images_seen += b
        self._update_ema()
        return metrics

    def _d_step(self, augmented_reals: torch.Tensor, real_labels: torch.Tensor, fake_logits: torch.Tensor,
                do_r1: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The standard D update (logistic loss, lazy R1), and ADA's observation of D(real)."""
        s = self.s
        if do_r1:
            with full(s.precision, self.device):
                r1, real_logits = losses.r1_penalty(self.D, augmented_reals, real_labels)
        else:
            with self._amp():
                r1, real_logits = torch.zeros((), device=self.device), self._forward_d(augmented_reals, real_labels)
            real_logits = real_logits.float()
        loss_d = losses.d_logistic(real_logits, fake_logits) + (s.r1_gamma / 2) * r1 * s.r1_every * do_r1
        self.opt_d.zero_grad(set_to_none=True)
        self.step_d.step(loss_d)
        self.ada.observe(real_logits)
        return loss_d, r1

    def _private_d_step(self, reals: torch.Tensor, real_labels: torch.Tensor, fake_logits: torch.Tensor,
                        do_r1: bool) -> torch.Tensor:
        """The DP-SGD D update; the loss logged is the synthetic half only, as no number computed from real
        images may leave the step unnoised."""
        s = self.s
        fake_loss = losses.d_fake(fake_logits)
        r1_weight = s.r1_gamma / 2 * s.r1_every if do_r1 else 0.0
        with full(s.precision, self.device):
            self.private.d_step(reals, real_labels, r1_weight, fake_loss)
        return fake_loss.detach()

    def _forward_d(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return (self.compiled[0] if self.compiled else self.D)(images, labels)

    def _amp(self):
        return autocast(self.s.precision, self.device)

    def _update_ema(self) -> None:
        half_life = min(self.s.ema_kimg * 1000, self.images_seen * self.s.ema_rampup)
        beta = 0.5 ** (self.s.batch / max(half_life, 1e-8))
        with torch.no_grad():
            for p_ema, p in zip(self.G_ema.parameters(), self.G.parameters()):
                p_ema.lerp_(p, 1 - beta)
            for b_ema, b in zip(self.G_ema.buffers(), self.G.buffers()):
                b_ema.copy_(b)

    # -- evaluation and snapshots --------------------------------------------------------
    def _embed(self, images: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.features.embed(images[i:i + 256]) for i in range(0, len(images), 256)])

    @torch.no_grad()
    def fid(self) -> float:
        """FID of the EMA generator against the node's real train images (fixed draw per call order)."""
        n = min(self.s.fid_images, max(len(self.reals), 2))
        fakes = torch.cat([self.G_ema(self._randn(m, self.arch.z_dim), self._fake_labels(m), generator=self.rng)
                           for m in chunk_sizes(n, 256)])
        return self.frechet.distance(self._embed(fakes.clamp(-1, 1)))

    def redraw_order(self) -> None:
        """Forget the rest of the current pass over the data, so the next pass is drawn from the stream."""
        self._order = torch.empty(0, dtype=torch.long)

    def snapshot(self) -> dict:
        """Everything the next iteration depends on: networks, optimisers, ADA, counters, the data order
        and the random stream, so a restored trainer repeats exactly what it did from here."""
        return copy.deepcopy({"G": self.G.state_dict(), "D": self.D.state_dict(), "G_ema": self.G_ema.state_dict(),
                              "opt_g": self.opt_g.state_dict(), "opt_d": self.opt_d.state_dict(),
                              "ada": self.ada.state_dict(), "iteration": self.iteration,
                              "images_seen": self.images_seen, "order": self._order, "rng": self.rng.get_state()})

    def restore(self, state: dict) -> None:
        state = copy.deepcopy(state)  # the optimisers would otherwise update the snapshot's tensors in place
        self.G.load_state_dict(state["G"])
        self.D.load_state_dict(state["D"])
        self.G_ema.load_state_dict(state["G_ema"])
        self.opt_g.load_state_dict(state["opt_g"])
        self.opt_d.load_state_dict(state["opt_d"])
        self.ada.load_state_dict(state["ada"])
        self.iteration, self.images_seen = state["iteration"], state["images_seen"]
        self._order = state["order"]
        self.rng.set_state(state["rng"])


def chunk_sizes(n: int, size: int) -> list[int]:
    return [min(size, n - start) for start in range(0, n, size)]


@dataclasses.dataclass
class PhaseResult:
    generator: dict  # EMA state dict
    fid: float
    iteration: int
    iterations_run: int
    stopped: str  # "cap" (iteration limit), "patience" (phase 1), "fid-factor" (phase 2), "privacy-matched" (control)
    selection: dict = dataclasses.field(default_factory=dict)  # phase 1: the snapshot rule's record


class Phases(NamedTuple):
    phase1: PhaseResult
    privacy: PhaseResult
    control: PhaseResult
    reseeded: PhaseResult | None  # the control again from another random stream, when asked for


def run_phases(trainer: GanTrainer, log: Callable[[dict], None], reseed: int | None = None,
               start: tuple[PhaseResult, dict] | None = None) -> Phases:
    """Phase 1 (or `start`: phase 1's result and the state at its kept snapshot, from standard_phase), phase 2
    and phase 2's control; `log` receives one row per iteration (with `fid` where evaluated; the control's rows
    have phase "control").

    The control repeats phase 2 from the same snapshot, with the same iterations, data order and
    random draws, at alpha = 0: the privacy loss is the only difference between the two generators,
    so the privacy effect is measured against it rather than against the shorter-trained snapshot.
    With `reseed`, the control runs once more from the same snapshot with its random stream (data
    order, latents, augmentation) reseeded: a null pair for the audit's controls, whose paired effect
    must come out as none."""
    phase1, start = standard_phase(trainer, log) if start is None else start
    trainer.restore(start)
    privacy = privacy_phase(trainer, log, phase1.fid)
    trainer.restore(start)
    control = continuation(trainer, privacy.iteration, phase1, "control", log)
    reseeded = None
    if reseed is not None:
        trainer.restore(start)
        trainer.rng.manual_seed(reseed)
        trainer.redraw_order()
        reseeded = continuation(trainer, privacy.iteration, phase1, "reseeded", log)
    return Phases(phase1, privacy, control, reseeded)


def private_run(trainer: GanTrainer, log: Callable[[dict], None]) -> Phases:
    """Under DP: phase 1 for exactly its iterations (the steps the accountant planned for), with no early
    stopping and no snapshot chosen by FID (both read real images); FID is only logged. The last EMA
    generator is released, and stands as the standard and the control generator too: phase 2, whose
    privacy loss reads real images in the generator's gradient, does not run."""
    s, fid_value = trainer.s, math.nan
    for i in range(1, s.iterations + 1):
        row = {"phase": 1, "iteration": i, **trainer.step(alpha=0.0)}
        if evaluated(i, s.iterations, s.fid_every):
            row["fid"] = fid_value = trainer.fid()
        log(row)
    released = PhaseResult(copy.deepcopy(trainer.G_ema.state_dict()), fid_value, s.iterations, s.iterations, "cap",
                           {"select": "last"})
    off = PhaseResult(released.generator, fid_value, 0, 0, "dp")
    return Phases(released, off, off, None)


def continuation(trainer: GanTrainer, iterations: int, phase1: PhaseResult, name: str,
                 log: Callable[[dict], None]) -> PhaseResult:
    """`iterations` of phase 2 at alpha = 0 from the trainer's state, evaluated where phase 2 was."""
    result = PhaseResult(phase1.generator, phase1.fid, 0, 0, "privacy-matched")
    for j in range(1, iterations + 1):
        row = {"phase": name, "iteration": j, **trainer.step(alpha=0.0)}
        if evaluated(j, trainer.s.pp_iterations, trainer.s.fid_every):  # the privacy run's draws, in its order
            row["fid"] = result.fid = trainer.fid()
        log(row)
    if iterations:
        result.generator, result.iteration = copy.deepcopy(trainer.G_ema.state_dict()), iterations
        result.iterations_run = iterations
    return result


def long_run(trainer: GanTrainer, iterations: int, name: str, log: Callable[[dict], None]) -> dict:
    """`iterations` steps at alpha = 0 with no early stopping: the final EMA generator's state."""
    for i in range(1, iterations + 1):
        log({"phase": name, "iteration": i, **trainer.step(alpha=0.0)})
    return copy.deepcopy(trainer.G_ema.state_dict())


def evaluated(iteration: int, last: int, every: int) -> bool:
    return iteration % every == 0 or iteration == last


def standard_phase(trainer: GanTrainer, log: Callable[[dict], None], name: str | int = 1
                   ) -> tuple[PhaseResult, dict]:
    """Phase 1 (its rows logged as phase `name`), and the trainer's state at the snapshot `s.select` keeps
    (fedcli/generators/stylegan2/selection.py)."""
    s = trainer.s
    selection = SnapshotSelection(s.select, s.patience, s.fid_every)
    kept_state, stopped = None, "cap"
    for i in range(1, s.iterations + 1):
        row = {"phase": name, "iteration": i, **trainer.step(alpha=0.0)}
        if evaluated(i, s.iterations, s.fid_every):
            row["fid"] = trainer.fid()
            if s.select == "fidelity":
                row["selection_accuracy"] = trainer.judge(trainer.G_ema)
            if selection.check(i, row["fid"], row.get("selection_accuracy", math.nan)):
                kept_state = trainer.snapshot()
        log(row)
        if selection.exhausted:
            stopped = "patience"
            break
    return PhaseResult(copy.deepcopy(kept_state["G_ema"]), selection.kept_fid, selection.kept_iteration, i, stopped,
                       selection.record()), kept_state


def privacy_phase(trainer: GanTrainer, log: Callable[[dict], None], phase1_fid: float) -> PhaseResult:
    """Phase 2 from the trainer's current state: its last snapshot whose FID stayed within the factor."""
    s = trainer.s
    kept = PhaseResult(copy.deepcopy(trainer.G_ema.state_dict()), phase1_fid, 0, 0, "cap")
    limit = s.fid_factor * phase1_fid
    for j in range(1, s.pp_iterations + 1):
        row = {"phase": 2, "iteration": j, **trainer.step(alpha=s.alpha)}
        if evaluated(j, s.pp_iterations, s.fid_every):
            row["fid"] = trainer.fid()
            if row["fid"] > limit:
                log(row)
                kept.stopped, kept.iterations_run = "fid-factor", j
                return kept
            kept = PhaseResult(copy.deepcopy(trainer.G_ema.state_dict()), row["fid"], j, j, "cap")
        log(row)
    kept.iterations_run = s.pp_iterations
    return kept
