"""Adaptive discriminator augmentation: each transform's probability, effect, range and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from fedcli.generators.stylegan2 import ada

GEOMETRIC = ("xflip", "rot90", "xint", "scale", "rotate", "aniso", "xfrac")
COLOUR_ONLY = ("hue", "saturation")


def images(n: int, channels: int, side: int = 8, seed: int = 0) -> torch.Tensor:
    """Random images in [-1, 1]: no symmetry, so any real move or recolouring changes them."""
    return torch.rand(n, channels, side, side, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def seeded(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def changed(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x != y).flatten(1).any(dim=1)


def all_cases() -> list[tuple[int, str]]:
    return [(c, t) for c in (1, 3) for t in ada.transforms_for(c)]


# Chance that a chosen transform leaves a 12x12 image as it was, counted exactly rather than exposed:
# rot90 draws k = 0 with 1/4; integer translation draws (0, 0) of 3 x 3 shifts (reach 12 // 8 = 1 px);
# the luma flip, as in the reference, flips with 1/2 once chosen. Everything else moves a.s.
# (12 px, not 8: at 12 an identity resampling is not bit-exact, so images not chosen must be kept.)
IDENTITY_DRAW = {"rot90": 1 / 4, "xint": 1 / 9, "lumaflip": 1 / 2}


def test_transform_list_and_gray_images_skip_hue_and_saturation():
    assert ada.TRANSFORMS[:7] == GEOMETRIC and ada.transforms_for(3) == ada.TRANSFORMS
    assert set(ada.transforms_for(1)) == set(ada.TRANSFORMS) - set(COLOUR_ONLY)
    x = images(16, 1)
    for name in COLOUR_ONLY:
        assert torch.equal(ada.augment(x, 1.0, seeded(), only=name), x)
    with pytest.raises(ValueError):
        ada.augment(x, 0.5, seeded(), only="cutout")


@pytest.mark.parametrize("channels,name", all_cases())
def test_nothing_changes_when_nothing_fires(channels, name):
    x = images(64, channels)
    assert ada.augment(x, 0.0, seeded(), only=name) is x
    assert torch.equal(ada.augment(x, 1e-9, seeded(), only=name), x)


@pytest.mark.parametrize("channels,name", all_cases())
def test_each_transform_changes_an_image_with_probability_p(channels, name):
    n, p = 2000, 0.3
    x = images(n, channels, side=12)
    diff = (ada.augment(x, p, seeded(), only=name) - x).abs().flatten(1).amax(dim=1)
    moved = diff > 1e-5  # well above the round-off of resampling with an identity map
    assert ((diff == 0) | moved).all()  # an image is really transformed or kept bit for bit
    fraction = moved.float().mean().item()
    expected = p * (1 - IDENTITY_DRAW.get(name, 0.0))  # "rotate" fires twice with 1 - sqrt(1 - p): p overall
    assert abs(fraction - expected) < 4.5 * math.sqrt(expected * (1 - expected) / n)


def test_transforms_fire_independently_of_each_other():
    n, p = 2000, 0.1
    x = images(n, 3, side=12)
    untouched = (~changed(x, ada.augment(x, p, seeded()))).float().mean().item()
    expected = math.prod(1 - p * (1 - IDENTITY_DRAW.get(t, 0.0)) for t in ada.TRANSFORMS)
    assert abs(untouched - expected) < 4.5 * math.sqrt(expected * (1 - expected) / n)


@pytest.mark.parametrize("channels", (1, 3))
def test_gradients_reach_the_input_through_every_transform(channels):
    x = images(32, channels, side=16).requires_grad_(True)
    ada.augment(x, 1.0, seeded()).sum().backward()
    assert x.grad is not None and x.grad.isfinite().all() and x.grad.abs().sum() > 0
    for name in ada.transforms_for(channels):
        x.grad = None
        weights = torch.rand(x.shape, generator=seeded(5))
        (ada.augment(x, 1.0, seeded(), only=name) * weights).sum().backward()
        assert x.grad.isfinite().all() and x.grad.abs().sum() > 0, name


@pytest.mark.parametrize("channels", (1, 3))
def test_a_seed_fixes_the_augmentation_and_the_images_do_not_change_the_draws(channels):
    x = images(64, channels, side=16)
    assert torch.equal(ada.augment(x, 0.5, seeded(3)), ada.augment(x, 0.5, seeded(3)))
    assert not torch.equal(ada.augment(x, 0.5, seeded(3)), ada.augment(x, 0.5, seeded(4)))
    states = []
    for other, only in ((x, None), (-x.flip(0), None), (torch.zeros_like(x), "xflip")):
        generator = seeded(3)
        ada.augment(other, 0.5, generator, only=only)
        states.append(generator.get_state())
    assert all(torch.equal(states[0], s) for s in states[1:])


@pytest.mark.parametrize("name", GEOMETRIC)
def test_geometric_transforms_stay_in_the_input_range_and_keep_a_flat_image_flat(name):
    x = images(256, 3, side=16)
    y = ada.augment(x, 1.0, seeded(), only=name)
    assert y.isfinite().all()
    assert y.min() >= x.min() - 1e-5 and y.max() <= x.max() + 1e-5
    flat = torch.full((16, 1, 16, 16), 0.37)  # reflected, not zero-filled, border
    assert torch.allclose(ada.augment(flat, 1.0, seeded(), only=name), flat, atol=1e-6)


def test_everything_at_once_stays_finite():
    x = images(256, 3, side=16)
    y = ada.augment(x, 1.0, seeded())
    assert y.shape == x.shape and y.isfinite().all()


def test_blit_transforms_are_exact_pixel_moves():
    x = images(400, 1)
    assert torch.equal(ada.augment(x, 1.0, seeded(), only="xflip"), x.flip(-1))
    turned = ada.augment(x, 1.0, seeded(), only="rot90")
    match = torch.stack([(turned == torch.rot90(x, k, dims=(-2, -1))).flatten(1).all(1) for k in range(4)])
    assert match.sum(0).eq(1).all() and match.any(1).all()  # each image one turn; every turn drawn
    moved = ada.augment(x, 1.0, seeded(), only="xint")
    shifts = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    match = torch.stack([(moved == ada.translate(x, torch.tensor([s] * len(x)))).flatten(1).all(1)
                         for s in shifts])
    assert match.any(0).all() and match.any(1).all()


def moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Centre (B, 2) and covariance (B, 2, 2) in pixels of the intensity (x + 1) / 2 of 1-channel images."""
    weight = (x[:, 0] + 1) / 2
    weight = weight / weight.sum(dim=(1, 2), keepdim=True)
    side = x.shape[-1]
    ys, xs = torch.meshgrid(torch.arange(side, dtype=x.dtype), torch.arange(side, dtype=x.dtype), indexing="ij")
    points = torch.stack([xs, ys], dim=-1)  # (H, W, 2)
    centre = torch.einsum("bhw,hwk->bk", weight, points)
    offset = points - centre.view(-1, 1, 1, 2)
    return centre, torch.einsum("bhw,bhwk,bhwl->bkl", weight, offset, offset)


def blob(n: int, sx: float, sy: float, side: int) -> torch.Tensor:
    """n copies of a centred Gaussian blob (std sx along x, sy along y) on a -1 background."""
    grid = torch.arange(side, dtype=torch.float64) - (side - 1) / 2
    profile = torch.exp(-grid.view(-1, 1) ** 2 / (2 * sy**2) - grid.view(1, -1) ** 2 / (2 * sx**2))
    return (2 * profile - 1).expand(n, 1, side, side).contiguous()


def test_general_geometric_transforms_move_a_blob_as_their_matrices_say():
    n, side = 400, 64  # blobs small against the side, big against a pixel (bilinear smoothing)
    round_blob, long_blob = blob(n, 4.0, 4.0, side), blob(n, 5.0, 2.5, side)
    _, cov0 = moments(long_blob)
    centre, cov = moments(ada.augment(long_blob, 1.0, seeded(), only="rotate"))
    assert torch.allclose(centre, torch.full_like(centre, (side - 1) / 2), atol=0.05)  # about the centre
    assert torch.allclose(torch.linalg.eigvalsh(cov), torch.linalg.eigvalsh(cov0), rtol=0.08)  # rigid
    axis = torch.atan2(2 * cov[:, 0, 1], cov[:, 0, 0] - cov[:, 1, 1])  # twice the major axis' angle
    assert axis.cos().mean().abs() < 0.15 and axis.sin().mean().abs() < 0.15  # uniform angles
    _, cov0 = moments(round_blob)
    _, cov = moments(ada.augment(round_blob, 1.0, seeded(), only="scale"))
    ratio = cov[:, 0, 0] / cov0[:, 0, 0]
    assert torch.allclose(cov[:, 1, 1] / cov0[:, 1, 1], ratio, rtol=0.05)  # isotropic
    assert abs(0.5 * ratio.log2().std().item() - 0.2) < 0.03  # scale: log2-normal, std 0.2
    _, cov = moments(ada.augment(round_blob, 1.0, seeded(), only="aniso"))
    sx2, sy2 = cov[:, 0, 0] / cov0[:, 0, 0], cov[:, 1, 1] / cov0[:, 1, 1]
    assert torch.allclose(sx2 * sy2, torch.ones_like(sx2), rtol=0.08)  # x by s, y by 1/s
    assert abs(0.5 * sx2.log2().std().item() - 0.2) < 0.03


def test_fractional_translation_moves_a_blob_by_an_eighth_of_the_side():
    n, side = 2000, 32
    centre, _ = moments(ada.augment(blob(n, 1.5, 1.5, side), 1.0, seeded(), only="xfrac"))
    shift = centre - (side - 1) / 2
    spread = 1.4826 * (shift - shift.median(dim=0).values).abs().median(dim=0).values  # robust to reflections
    assert torch.allclose(spread, torch.full_like(spread, 0.125 * side), rtol=0.12)  # about 4.5 standard errors


def luma_and_chroma(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    luma = x.mean(dim=1, keepdim=True)
    return luma, x - luma


def test_brightness_contrast_and_luma_flip_do_what_their_names_say():
    n = 2000
    x = images(n, 3)
    mean = x.mean(dim=(1, 2, 3))
    y = ada.augment(x, 1.0, seeded(), only="brightness")
    step = (y - x).flatten(1)
    assert torch.allclose(step, step[:, :1].expand_as(step), atol=1e-5)
    assert abs(step[:, 0].std().item() - 0.2) < 0.02
    y = ada.augment(x, 1.0, seeded(), only="contrast")
    assert torch.allclose(y.mean(dim=(1, 2, 3)), mean, atol=1e-5)  # about the image mean
    gain = ((y - mean.view(-1, 1, 1, 1)) / (x - mean.view(-1, 1, 1, 1))).flatten(1)
    assert torch.allclose(gain, gain.median(dim=1, keepdim=True).values.expand_as(gain), rtol=1e-3, atol=1e-3)
    assert abs(gain.median(dim=1).values.log2().std().item() - 0.5) < 0.05
    luma, chroma = luma_and_chroma(x)
    y_luma, y_chroma = luma_and_chroma(ada.augment(x, 1.0, seeded(), only="lumaflip"))
    assert torch.allclose(y_chroma, chroma, atol=1e-5)
    flipped = torch.allclose(y_luma, -luma, atol=1e-5), torch.allclose(y_luma, luma, atol=1e-5)
    assert not any(flipped)  # some images flipped, others not
    assert torch.logical_or((y_luma + luma).abs().flatten(1).amax(1) < 1e-5,
                            (y_luma - luma).abs().flatten(1).amax(1) < 1e-5).all()


def test_hue_turns_and_saturation_scales_the_chroma_about_the_luma_axis():
    x = images(2000, 3)
    luma, chroma = luma_and_chroma(x)
    y_luma, y_chroma = luma_and_chroma(ada.augment(x, 1.0, seeded(), only="hue"))
    assert torch.allclose(y_luma, luma, atol=1e-5)
    assert torch.allclose(y_chroma.norm(dim=1), chroma.norm(dim=1), atol=1e-5)  # a rotation of the chroma
    cos = (y_chroma * chroma).sum(dim=(1, 2, 3)) / chroma.square().sum(dim=(1, 2, 3))
    assert abs(cos.mean().item()) < 0.06 and abs(cos.square().mean().item() - 0.5) < 0.04  # uniform angle
    y_luma, y_chroma = luma_and_chroma(ada.augment(x, 1.0, seeded(), only="saturation"))
    assert torch.allclose(y_luma, luma, atol=1e-5)
    s = (y_chroma * chroma).sum(dim=(1, 2, 3)) / chroma.square().sum(dim=(1, 2, 3))
    assert torch.allclose(y_chroma, s.view(-1, 1, 1, 1) * chroma, rtol=1e-4, atol=1e-4)
    assert abs(s.log2().std().item() - 1.0) < 0.08


def test_gray_luma_flip_negates_the_image():
    x = images(200, 1)
    y = ada.augment(x, 1.0, seeded(), only="lumaflip")
    negated = (y + x).abs().flatten(1).amax(1) < 1e-6
    kept = (y == x).flatten(1).all(1)
    assert (negated ^ kept).all() and negated.any() and kept.any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_cpu_generator_drives_images_on_the_gpu_like_on_the_cpu():
    x = images(64, 3, side=16)
    on_gpu = ada.augment(x.cuda(), 0.5, seeded(7))
    assert torch.allclose(on_gpu.cpu(), ada.augment(x, 0.5, seeded(7)), atol=1e-4)
