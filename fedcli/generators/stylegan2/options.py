"""The StyleGAN2 kind's options (FedER's two phases, the privacy loss, ADA, the audit's reference and control
GANs), beside those it shares with other kinds (LPIPS, DP-SGD). Defaults are the quick CPU configuration (about
a minute per digits node); the study's values (batch 32, lr 0.0025, 256x256, patience 10,000, VGG) belong in
recipes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from fedcli.core.errors import UserError
from fedcli.experiment.config import MAX_COUNT, check_weights_file, number_or_keyword, option, ranged
from fedcli.experiment.panels import GENERATOR, OUTPUT, PRIVACY_LOSS, REFERENCES
from fedcli.generators.shared_options import DpOptions, LpipsOptions

PrivacyLoss = Literal["all-pairs", "nearest"]
PrivacyScale = Literal["absolute", "relative"]
SelectRule = Literal["stable", "last", "fidelity"]  # phase 1's snapshot rule, fedcli/generators/stylegan2/selection.py
Auto = Literal["auto"]


@dataclasses.dataclass(frozen=True)
class StyleGan2Options(LpipsOptions, DpOptions):
    patience: int = ranged(200, 1, MAX_COUNT, panel=GENERATOR, help=(
        "Phase 1 stops when no check has come within the noise of the lowest FID (--select stable), or matched the "
        "best reading (--select fidelity), for this many iterations."))
    select: SelectRule = option("stable", panel=GENERATOR, help=(
        "Phase 1's snapshot: stable (the latest whose FID is within the checks' own noise, the median change of log "
        "FID between checks, of the lowest reading; --patience counts from it), last (every --iterations, the last "
        "snapshot: a fixed-iteration generator) or fidelity (at each FID check the snapshot's buffer trains one "
        "--fidelity-* classifier, scored on the node's training images; the highest is kept: costs a classifier per "
        "check). Under --dp-epsilon always last (fidelity refused)."))
    pp_iterations: int | None = ranged(None, 0, MAX_COUNT, why="default 100; 0 under --dp-epsilon",
                                       panel=PRIVACY_LOSS, help=(
        "Phase 2 (privacy loss) iteration cap \\[default: 100; 0 under --dp-epsilon, which refuses any other]."))
    fid_every: int = ranged(50, 1, MAX_COUNT, panel=GENERATOR, help="Iterations between FID evaluations.")
    fid_images: int = ranged(512, 1, MAX_COUNT, panel=GENERATOR, help=(
        "Generated (and at most real) images per FID evaluation."))
    fid_factor: float = ranged(2.5, 1, 1000, panel=PRIVACY_LOSS, help=(
        "Phase 2 stops when FID exceeds this times the kept phase-1 snapshot's FID."))
    alpha: float = ranged(1.0, 0, 1000, why="0 disables the privacy loss", panel=PRIVACY_LOSS, help=(
        "Weight of the privacy loss: G minimises L_G - alpha * L_PP."))
    privacy_loss: PrivacyLoss = option("all-pairs", panel=PRIVACY_LOSS, help=(
        "L_PP: all-pairs (the study: each synthetic image's mean LPIPS to the batch's real images) or nearest (its "
        "LPIPS to its nearest real training image)."))
    privacy_scale: PrivacyScale = option("absolute", panel=PRIVACY_LOSS, help=(
        "L_PP in LPIPS units (absolute, the study) or divided by the node's own real-vs-real distance of the same "
        "form (relative), so alpha means the same for every backbone."))
    lr: float = ranged(0.0025, 0, 1, low_open=True, panel=GENERATOR, help="Adam learning rate of G and D.")
    r1_gamma: float | Auto = ranged("auto", 0, 10_000, why="auto: 0.0002 x resolution^2 / batch",
                                    parser=number_or_keyword, panel=GENERATOR, help=(
        "R1 regularisation weight; auto: 0.0002 x resolution^2 / batch (StyleGAN2-ADA)."))
    ada_target: float = ranged(0.6, 0, 1, panel=GENERATOR, help="ADA target for E[sign(D(real))].")
    ada_kimg: float | Auto = ranged("auto", 0, MAX_COUNT, low_open=True, parser=number_or_keyword,
                                    panel=GENERATOR, help=(
        "ADA speed: thousands of images for p to go from 0 to 1; auto: a tenth of phase 1's images."))
    ema_kimg: float | Auto = ranged("auto", 0, MAX_COUNT, parser=number_or_keyword, panel=GENERATOR, help=(
        "Half-life of the EMA generator in thousands of images (ramped up over the first twentieth of the images "
        "seen); auto: the reference's 10 x batch / 32."))
    style_mixing: float = ranged(0.9, 0, 1, why="the share of training batches with two latents", panel=GENERATOR,
                                 help=(
        "Share of training batches whose blocks take their w from two latents (style-mixing regularisation)."))
    z_dim: int = ranged(64, 1, 4096, panel=GENERATOR, help="Latent z size.")
    w_dim: int = ranged(64, 1, 4096, panel=GENERATOR, help="Intermediate latent w size.")
    channel_base: int = ranged(512, 1, 2**16, panel=GENERATOR, help="Feature maps at resolution r: min(base / r, max).")
    channel_max: int = ranged(64, 1, 4096, panel=GENERATOR, help="Most feature maps per layer.")
    fid_weights: Path | None = option(None, panel=GENERATOR, help=(
        "torch-fidelity's TF-ported Inception-v3 weights for FID, as published FIDs \\[default: the torch hub cache, "
        "else a classifier of the node's images]."))
    controls: bool = option(False, panel=REFERENCES, help=(
        "Also train the reseeded control (phase 2 at alpha 0 from the same snapshot with another random stream): the "
        "null pair that audit-privacy --controls needs, and a GAN trained as long on a tiny subset of the node: the "
        "tiny-node control."))
    tiny_node: int = ranged(40, 2, MAX_COUNT, why="the tiny-node control's training images", panel=REFERENCES, help=(
        "Training images of the tiny-node control (--controls; at most a quarter of the node's), class by class."))
    reference: int = ranged(0, 0, MAX_COUNT, why="0: no reference GAN", panel=REFERENCES, help=(
        "Also train a reference GAN (phase 1's recipe) on the node's train images minus the first N that "
        "audit-privacy scores as members, for the calibrated attack (GAN-Leaks-cal; audit with --max-images at most "
        "N). 0: none."))
    lira_references: int = ranged(0, 0, MAX_COUNT, why="0: no LiRA game", panel=REFERENCES, help=(
        "Also train K reference generators per node for audit-privacy's LiRA membership game, each exactly as the "
        "released one (phase 1 and 2, or DP) on the node's train images outside the audited members plus a random half "
        "of its members and as many class-matched test images (complementary halves: every image IN for K/2). Even; 0: "
        "none. Costs K x the node's training."))
    # an experiment whose phase 1 this one's equals (generators/stylegan2/phase1_state.py)
    phase1_from: Path | None = option(None, panel=OUTPUT, help=(
        "An experiment whose train-gan ran the same phase 1 (the same options but --alpha, --privacy-loss, "
        "--privacy-scale, --pp-iterations, --fid-factor, the buffer's and the side GANs', on the same partition): "
        "phase 2 and the control start from its kept phase-1 state instead of retraining it, with the same results. "
        "Refused where phase 1 would differ."))

    def check(self) -> None:
        for name in ("r1_gamma", "ada_kimg", "ema_kimg"):
            value = getattr(self, name)
            if isinstance(value, str) and value != "auto":
                raise UserError(f"--{name.replace('_', '-')} must be a number or auto, got {value!r}")
        check_weights_file(self, "fid_weights")
        if self.lira_references % 2 or self.lira_references == 2:
            raise UserError(f"--lira-references {self.lira_references}: the references come in complementary halves "
                            "of the pool, and the game needs two IN and two OUT references per image to fit their "
                            "spread, so give an even number of at least 4 (or 0)")
        if self.phase1_from is not None and not (Path(self.phase1_from) / "gan").is_dir():
            raise UserError(f"--phase1-from {self.phase1_from} holds no trained GANs (no gan folder); name an "
                            "experiment that ran fedcli train-gan")
        if self.private:
            check_private(self)
        if self.pp_iterations is None:
            object.__setattr__(self, "pp_iterations", 0 if self.private else 100)


def check_private(cfg: StyleGan2Options) -> None:
    """Under --dp-epsilon: refuse what would read real images outside the accounting, or train a GAN outside it."""
    if cfg.pp_iterations:
        raise UserError(f"--pp-iterations {cfg.pp_iterations} with --dp-epsilon: phase 2's privacy loss reads real "
                        "images in the generator's gradient, outside the DP accounting; drop --pp-iterations "
                        "(0 under DP)")
    for flag, on, reads, remedy in (
            ("--controls", cfg.controls, "its GANs would train on", "run --controls without --dp-epsilon"),
            ("--reference", cfg.reference, "its GANs would train on", "run --reference without --dp-epsilon"),
            ("--select fidelity", cfg.select == "fidelity", "its readings score",
             "drop --select (under DP the last snapshot is released)")):
        if on:
            raise UserError(f"{flag} with --dp-epsilon: {reads} real images outside the DP accounting; {remedy}")


OPTIONS = StyleGan2Options
