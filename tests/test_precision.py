"""--precision and --compile: bf16 runs every training step finite and near fp32, fp16 is CUDA's, and both options
are recorded only when they change what is computed.

On CPU bf16 autocast casts oneDNN's list of operations, not CUDA's: these tests check the regions' logic (what
runs in which dtype, that losses stay fp32 and near fp32's), not CUDA's numerics (bench/gpu_check.sh does)."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from fedcli.audit.projection import ProjectionSettings, project
from fedcli.core.devices import torch_threads
from fedcli.core.errors import UserError
from fedcli.core.precision import autocast, check_precision
from fedcli.data.sources.digits import load_digit_images
from fedcli.experiment.config import to_json
from fedcli.federate.config import FederateConfig
from fedcli.generators.fid import FeatureSpace
from fedcli.generators.perceptual import Perceptual
from fedcli.generators.stylegan2 import networks
from fedcli.generators.stylegan2.networks import Architecture, Generator
from fedcli.generators.stylegan2.train import GanTrainer, TrainSettings
from fedcli.generators.vqvae2.kind import train_vqvae
from fedcli.generators.vqvae2.networks import VqArchitecture, VqVae2
from fedcli.pipeline.runner import plain
from conftest import copy_exp

PIXELS = FeatureSpace(lambda images: F.avg_pool2d(images, 4).flatten(1), "pixels", False)
ARCH = Architecture(resolution=16, channels=1, num_classes=10, z_dim=16, w_dim=16, channel_base=128, channel_max=16)
STEPS = 5


@pytest.fixture(scope="module")
def perceptual() -> Perceptual:
    return Perceptual("alex")


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = load_digit_images()
    x = F.interpolate(torch.from_numpy(images[:128]).unsqueeze(1), size=16, mode="bilinear", align_corners=False)
    return x * 2 - 1, torch.from_numpy(labels[:128])


def close(bf16: float, fp32: float) -> bool:
    return abs(bf16 - fp32) <= 0.05 * abs(fp32)


def gan_losses(precision: str, perceptual, digits, alpha: float) -> dict[str, float]:
    settings = TrainSettings(batch=16, fid_images=16, style_mixing=0.0, ada_target=1.0, precision=precision)
    with torch_threads(1):
        trainer = GanTrainer(ARCH, settings, *digits, perceptual, PIXELS, torch.Generator().manual_seed(0),
                             init_seed=1)
        metrics = [trainer.step(alpha) for _ in range(STEPS)]
    return metrics[-1]


def test_a_bf16_gan_step_is_finite_and_within_5_percent_of_fp32_after_5_steps(perceptual, digits):
    fp32, bf16 = (gan_losses(p, perceptual, digits, alpha=1.0) for p in ("fp32", "bf16"))
    for name in ("loss_g", "loss_d", "l_pp"):
        assert torch.isfinite(torch.tensor(bf16[name])) and close(bf16[name], fp32[name]), (name, bf16, fp32)
    assert fp32 != bf16  # bf16 ran: its arithmetic differs


def test_bf16_runs_the_synthesis_and_discriminator_in_bf16_and_keeps_r1_and_the_mapping_in_fp32(digits,
                                                                                                monkeypatch):
    seen = {"synthesis": set()}
    convolve = networks.modulated_conv2d

    def recorded(*args, **kwargs):
        out = convolve(*args, **kwargs)
        seen["synthesis"].add(out.dtype)
        return out

    monkeypatch.setattr(networks, "modulated_conv2d", recorded)
    settings = TrainSettings(batch=8, fid_images=8, precision="bf16", r1_every=1)
    trainer = GanTrainer(ARCH, settings, *digits, Perceptual("alex"), PIXELS, torch.Generator().manual_seed(0),
                         init_seed=1)
    for name, module in [("mapping", trainer.G.mapping), ("discriminator", trainer.D)]:
        module.register_forward_hook(lambda m, i, out, name=name: seen.setdefault(name, set()).add(out.dtype))
    seen["synthesis"].clear()
    with torch_threads(1):
        metrics = trainer.step()
    assert seen["mapping"] == {torch.float32} and seen["synthesis"] == {torch.bfloat16}
    assert seen["discriminator"] == {torch.bfloat16, torch.float32}  # R1's pass in fp32, the others in bf16
    assert all(p.dtype == torch.float32 for p in trainer.G.parameters()) and torch.isfinite(
        torch.tensor(metrics["r1"]))


def vq_losses(precision: str, digits) -> list[dict]:
    model = VqVae2(VqArchitecture(resolution=16, channels=1, num_classes=10, hidden=32, codes=32, dim=16))
    cfg = types.SimpleNamespace(vq_lr=4e-4, iterations=STEPS, batch=16, vq_beta=0.25, precision=precision,
                                compile=False)
    rows = []
    with torch_threads(1):
        torch.manual_seed(0)
        model.load_state_dict(VqVae2(model.arch).state_dict())
        train_vqvae(model, digits[0], cfg, torch.Generator().manual_seed(0), "cpu", rows.append)
    return rows


def test_a_bf16_vqvae2_step_is_finite_and_within_5_percent_of_fp32_after_5_steps(digits):
    fp32, bf16 = vq_losses("fp32", digits)[-1], vq_losses("bf16", digits)[-1]
    objective = {run: row["mse"] + 0.25 * row["commitment"] for run, row in (("fp32", fp32), ("bf16", bf16))}
    # the commitment term alone (1e-3 of the objective here) follows which codes bf16's encoder picks
    assert torch.isfinite(torch.tensor(objective["bf16"])) and close(objective["bf16"], objective["fp32"])
    assert close(bf16["mse"], fp32["mse"]) and torch.isfinite(torch.tensor(bf16["commitment"]))
    assert fp32["mse"] != bf16["mse"]


def test_the_quantiser_stays_fp32_under_autocast():
    model = VqVae2(VqArchitecture(resolution=16, channels=1, num_classes=10, hidden=32, codes=32, dim=16))
    with autocast("bf16", "cpu"):
        quantised, codes, commitment, _ = model.quant_t(torch.randn(2, 16, 4, 4).bfloat16())
    assert quantised.dtype == commitment.dtype == model.quant_t.embed.dtype == torch.float32


def test_a_bf16_projection_is_finite_and_within_5_percent_of_fp32_after_5_steps(perceptual, digits):
    torch.manual_seed(0)
    generator = Generator(ARCH).eval().requires_grad_(False)
    targets, labels = digits[0][:4], digits[1][:4]
    w = generator.styles(torch.randn(4, ARCH.z_dim), labels).detach()
    distances = {}
    for precision in ("fp32", "bf16"):
        streams = [torch.Generator().manual_seed(i) for i in range(4)]
        with torch_threads(1):
            result = project(lambda w_: generator.synthesis(w_, generator=torch.Generator().manual_seed(0)),
                             targets, w, perceptual, ProjectionSettings(steps=STEPS, precision=precision), streams,
                             w_spread=1.0)
        distances[precision] = result.lpips
    assert torch.isfinite(distances["bf16"]).all() and distances["bf16"].dtype == torch.float32
    assert torch.allclose(distances["bf16"], distances["fp32"], rtol=0.05)


def test_fp16_on_cpu_is_refused_in_one_line_and_writes_nothing(cli, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: fp16 is allowed")
    with pytest.raises(UserError, match="fp16 needs a CUDA device"):
        check_precision("fp16", "auto")
    for stage in ("train-gan", "federate", "audit-privacy"):
        exp = tmp_path / stage
        assert "fp16 needs a CUDA device" in cli.user_error(stage, "--exp", exp, "--precision", "fp16")
        assert not exp.exists()


def test_precision_and_compile_are_recorded_only_when_not_the_default(tmp_path):
    default = FederateConfig(exp=tmp_path)
    assert not {"precision", "compile"} & set(to_json(default)) & set(plain(default))
    changed = FederateConfig(exp=tmp_path, precision="bf16", compile=True)
    assert to_json(changed)["precision"] == plain(changed)["precision"] == "bf16"
    assert to_json(changed)["compile"] is plain(changed)["compile"] is True


def test_a_bf16_feder_round_is_finite_and_within_5_percent_of_fp32(cli, gan3_exp, tmp_path):
    """Each node's model after one round of 5 local steps: its test cross-entropy, from predictions.safetensors."""
    losses = {}
    for precision in ("fp32", "bf16"):
        exp = copy_exp(gan3_exp, tmp_path / precision)
        cli.ok("federate", "--exp", exp, "--strategy", "feder", "--rounds", "1", "--epochs", "1", "--steps-per-round",
               str(STEPS), "--bootstrap", "20", "--threads", "1", "--precision", precision)
        run = exp / "federate" / "feder"
        predictions = load_file(run / "predictions.safetensors")
        losses[precision] = torch.stack([
            -predictions[f"{node}/{node}"][torch.arange(len(labels)), labels].clamp_min(1e-12).log().mean()
            for node, labels in ((k.split("/")[1], v) for k, v in predictions.items() if k.startswith("labels/"))])
        assert ("precision" in (run / "config.json").read_text()) == (precision != "fp32")
    assert torch.isfinite(losses["bf16"]).all() and not torch.equal(losses["bf16"], losses["fp32"])
    assert torch.allclose(losses["bf16"], losses["fp32"], rtol=0.05), losses


def test_a_default_run_records_neither_option(gan3_exp):
    text = (gan3_exp / "gan" / "node0" / "config.json").read_text()
    assert '"precision"' not in text and '"compile"' not in text  # config.json as before the options existed
