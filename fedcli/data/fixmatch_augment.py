"""FixMatch's two views of an unlabelled image (Sohn et al. 2020). Weak: the source's flips (none for digits)
and a random shift of up to 12.5% of the side, reflect-padded. Strong: its RandAugment variant, two operations
drawn from the pool below, each applied with probability 0.5 at a magnitude drawn uniformly in [0, 1], then
Cutout, then the weak view's flips and shift (drawn anew).

Every draw comes from the caller's keyed generator, never from global state, so an image's augmentation is the
same wherever its batch is drawn. Images are uint8 tensors (N, C, H, W), grayscale or RGB, any side.

The pool follows the paper's Table 12 (not FedPerl's code, whose pool lacks Cutout, makes `equalize` the
identity, rotates up to 360 degrees and applies half the pool to every image). A magnitude m scales an
operation away from the identity, with a random sign where the operation has two directions:
brightness, color, contrast, sharpness enhance by 1 +- 0.9 m (PIL's factor, 0.1..1.9; the reference code's
0.1 + 1.9 b with the paper's b in [0.05, 0.95] spans 0.2..1.9, not centred on the identity); rotate +-30 m degrees;
shear +-0.3 m; translate +-0.3 m of the side; posterize to 8 - round(4 m) bits; solarize above 256 (1 - m);
Cutout a gray square of side round(0.5 m x side). At m = 0 each is the identity. Autocontrast, equalize and the
identity take no magnitude.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torchvision.transforms.v2.functional as F
from torchvision.transforms import InterpolationMode

from fedcli.data.dataset import augment_batch, to_float

GRAY = 128  # what geometry and Cutout fill with, as the paper's implementation does
Op = Callable[[torch.Tensor, float], torch.Tensor]  # (one uint8 image (C, H, W), signed magnitude in [-1, 1])


def enhance(adjust) -> Op:
    return lambda image, m: adjust(image, 1 + 0.9 * m)


def color(image: torch.Tensor, factor: float) -> torch.Tensor:
    return F.adjust_saturation(image, factor) if image.shape[0] == 3 else image  # a gray image has no colour


def affine(image: torch.Tensor, *, angle: float = 0.0, translate=(0, 0), shear=(0.0, 0.0)) -> torch.Tensor:
    return F.affine(image, angle=angle, translate=list(translate), scale=1.0, shear=list(shear),
                    interpolation=InterpolationMode.BILINEAR, fill=[GRAY] * image.shape[0])


def autocontrast(image: torch.Tensor, m: float) -> torch.Tensor:
    """Each channel stretched from its lowest to its highest value over 0..255, through PIL's own lookup table
    (truncated, as PIL rounds; torchvision's rounds differently)."""
    out = image.clone()
    for channel, values in enumerate(image):
        lo, hi = int(values.min()), int(values.max())
        if hi > lo:
            scale = 255.0 / (hi - lo)
            lut = torch.tensor([min(255, max(0, int(ix * scale - lo * scale))) for ix in range(256)], dtype=torch.uint8)
            out[channel] = lut[values.long()]
    return out


def posterize(image: torch.Tensor, m: float) -> torch.Tensor:
    return F.posterize(image, 8 - round(4 * abs(m)))


def solarize(image: torch.Tensor, m: float) -> torch.Tensor:
    """Invert every value at or above 256 (1 - m): none at m = 0."""
    threshold = 256 * (1 - abs(m))
    return torch.where(image >= threshold, 255 - image, image)


def translate(axis: int) -> Op:
    def op(image: torch.Tensor, m: float) -> torch.Tensor:
        shift = round(0.3 * m * image.shape[-1 - axis])  # axis 0: x (the width), 1: y
        return affine(image, translate=(shift, 0) if axis == 0 else (0, shift))
    return op


def shear(axis: int) -> Op:
    def op(image: torch.Tensor, m: float) -> torch.Tensor:
        degrees = math.degrees(math.atan(0.3 * m))  # torchvision takes the shear as an angle
        return affine(image, shear=(degrees, 0.0) if axis == 0 else (0.0, degrees))
    return op


WITH_MAGNITUDE: dict[str, Op] = {
    "brightness": enhance(F.adjust_brightness),
    "color": enhance(color),
    "contrast": enhance(F.adjust_contrast),
    "sharpness": enhance(F.adjust_sharpness),
    "posterize": posterize,
    "rotate": lambda image, m: affine(image, angle=30 * m),
    "shear_x": shear(0),
    "shear_y": shear(1),
    "solarize": solarize,
    "translate_x": translate(0),
    "translate_y": translate(1),
}
WITHOUT_MAGNITUDE: dict[str, Op] = {
    "identity": lambda image, m: image,
    "autocontrast": autocontrast,
    "equalize": lambda image, m: F.equalize(image),
}
POOL = {**WITH_MAGNITUDE, **WITHOUT_MAGNITUDE}
NAMES = sorted(POOL)


def cutout(image: torch.Tensor, m: float, generator: torch.Generator) -> torch.Tensor:
    """A gray square of side round(0.5 m x the shorter side) centred on a uniformly drawn pixel (clipped at the
    border)."""
    height, width = image.shape[-2:]
    side = round(0.5 * abs(m) * min(height, width))
    cy, cx = (int(torch.randint(0, n, (1,), generator=generator)) for n in (height, width))
    if side == 0:
        return image
    out = image.clone()
    out[:, max(0, cy - side // 2):cy - side // 2 + side, max(0, cx - side // 2):cx - side // 2 + side] = GRAY
    return out


def strong_augment(images: torch.Tensor, generator: torch.Generator, ops: int = 2) -> torch.Tensor:
    """Each image: `ops` operations drawn from the pool, each kept with probability 0.5 at a magnitude uniform in
    [0, 1] and a random sign, then Cutout at a uniform magnitude. The same number of draws per image whatever
    is drawn, so one image's augmentation does not shift the next one's."""
    out = []
    for image in images:
        for _ in range(ops):
            name = NAMES[int(torch.randint(0, len(NAMES), (1,), generator=generator))]
            keep, magnitude, sign = torch.rand(3, generator=generator).tolist()
            if keep < 0.5:
                image = POOL[name](image, magnitude if sign < 0.5 else -magnitude)
        image = cutout(image, float(torch.rand(1, generator=generator)), generator)
        out.append(image)
    return torch.stack(out) if out else images.clone()


def shift(images: torch.Tensor, generator: torch.Generator, fraction: float = 0.125) -> torch.Tensor:
    """Each float image moved by whole pixels, up to `fraction` of its side each way, the border reflected."""
    pad = round(fraction * images.shape[-1])
    if pad == 0 or len(images) == 0:
        return images
    padded = torch.nn.functional.pad(images, (pad, pad, pad, pad), mode="reflect")
    offsets = torch.randint(0, 2 * pad + 1, (len(images), 2), generator=generator).tolist()
    side_y, side_x = images.shape[-2:]
    return torch.stack([p[:, dy:dy + side_y, dx:dx + side_x] for p, (dy, dx) in zip(padded, offsets)])


def weak_view(images: torch.Tensor, flips: tuple[str, ...], generator: torch.Generator) -> torch.Tensor:
    """Float images in [-1, 1] from uint8 ones: the source's flips (`augment_batch`'s ops), then a shift."""
    x = to_float(images)
    return shift(augment_batch(x, flips, generator) if flips else x, generator)


def strong_view(images: torch.Tensor, flips: tuple[str, ...], generator: torch.Generator) -> torch.Tensor:
    """Float images in [-1, 1] from uint8 ones: RandAugment and Cutout, then the weak view's flips and shift."""
    return weak_view(strong_augment(images, generator), flips, generator)
