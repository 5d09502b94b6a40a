"""FixMatch's strong augmentation: every operation with a magnitude is the identity at magnitude 0, the others
equal PIL's, and a batch's augmentation is a function of its key alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from fedcli.core.rng import torch_stream
from fedcli.data.fixmatch_augment import NAMES, POOL, WITH_MAGNITUDE, cutout, strong_augment


def images(channels: int, side: int = 16, n: int = 4) -> torch.Tensor:
    """Smooth gradients with noise: every value range and orientation an operation can change."""
    generator = torch.Generator().manual_seed(channels * 100 + side)
    ramp = torch.linspace(20, 230, side)
    base = (ramp.view(1, 1, -1) + ramp.view(1, -1, 1)) / 2
    noise = torch.randint(-20, 21, (n, channels, side, side), generator=generator)
    return (base + noise).clamp(0, 255).to(torch.uint8)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("name", sorted(WITH_MAGNITUDE))
def test_an_operation_with_a_magnitude_is_the_identity_at_magnitude_zero(name, channels):
    for image in images(channels, side=32):
        assert torch.equal(POOL[name](image, 0.0), image), name


@pytest.mark.parametrize("name", sorted(WITH_MAGNITUDE))
def test_an_operation_at_full_magnitude_changes_the_image(name):
    image = images(3, side=32)[0]
    assert not torch.equal(POOL[name](image, 1.0), image), name


def pil(image: torch.Tensor) -> Image.Image:
    array = image.permute(1, 2, 0).numpy()
    return Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)


def from_pil(picture: Image.Image, channels: int) -> torch.Tensor:
    array = np.asarray(picture)
    return torch.from_numpy(array.reshape(*array.shape[:2], channels).copy()).permute(2, 0, 1)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("name, reference", [("autocontrast", ImageOps.autocontrast), ("equalize", ImageOps.equalize)])
def test_the_operations_without_a_magnitude_equal_pils(name, reference, channels):
    for image in images(channels, side=32):
        assert torch.equal(POOL[name](image, 0.5), from_pil(reference(pil(image)), channels)), name


@pytest.mark.parametrize("channels", [1, 3])
def test_posterize_and_solarize_equal_pils_at_their_magnitudes(channels):
    for image in images(channels):
        for m in (0.25, 0.5, 1.0):
            bits = 8 - round(4 * m)
            assert torch.equal(POOL["posterize"](image, m), from_pil(ImageOps.posterize(pil(image), bits), channels))
            threshold = 256 * (1 - m)
            assert torch.equal(POOL["solarize"](image, m), from_pil(ImageOps.solarize(pil(image), threshold), channels))


def test_cutout_greys_a_square_of_the_stated_side_at_the_drawn_centre():
    image = torch.zeros(1, 16, 16, dtype=torch.uint8)
    for seed in range(20):
        generator = torch.Generator().manual_seed(seed)
        cy, cx = (int(torch.randint(0, 16, (1,), generator=generator)) for _ in range(2))
        grey = cutout(image, 1.0, torch.Generator().manual_seed(seed))[0] == 128
        rows = [y for y in range(cy - 4, cy + 4) if 0 <= y < 16]  # side 8 = 0.5 x 16, centred, clipped
        cols = [x for x in range(cx - 4, cx + 4) if 0 <= x < 16]
        expected = torch.zeros(16, 16, dtype=torch.bool)
        expected[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1] = True
        assert torch.equal(grey, expected), seed
    assert torch.equal(cutout(image, 0.0, torch.Generator().manual_seed(3)), image)


def test_the_views_are_reproducible_per_key_and_keep_shape_and_range():
    from fedcli.data.fixmatch_augment import strong_view, weak_view

    batch = images(1, n=6)
    for view in (weak_view, strong_view):
        first = view(batch, ("hflip",), torch_stream(0, "n", 3, "u"))
        assert torch.equal(first, view(batch, ("hflip",), torch_stream(0, "n", 3, "u")))
        assert first.shape == batch.shape and first.min() >= -1 and first.max() <= 1
    assert weak_view(batch[:0], (), torch_stream(0, "empty")).shape == (0, 1, 16, 16)


def test_a_batch_is_augmented_by_its_key_alone():
    batch = images(3, n=8)
    first = strong_augment(batch, torch_stream(0, "node0", 1, "strong"))
    assert torch.equal(first, strong_augment(batch, torch_stream(0, "node0", 1, "strong")))
    assert not torch.equal(first, strong_augment(batch, torch_stream(0, "node0", 2, "strong")))
    state = torch.get_rng_state()
    torch.manual_seed(123)  # global state plays no part
    assert torch.equal(first, strong_augment(batch, torch_stream(0, "node0", 1, "strong")))
    torch.set_rng_state(state)
    assert first.dtype == torch.uint8 and first.shape == batch.shape


def test_every_operation_of_the_pool_is_drawn():
    drawn = set()
    original = dict(POOL)
    try:
        for name in NAMES:
            POOL[name] = (lambda n: lambda image, m: drawn.add(n) or original[n](image, m))(name)
        strong_augment(images(1, n=64), torch_stream(0, "pool"))
    finally:
        POOL.update(original)
    assert drawn == set(NAMES)
