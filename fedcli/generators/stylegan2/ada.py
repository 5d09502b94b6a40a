"""Adaptive discriminator augmentation (after StyleGAN2-ADA), differentiable, on [-1, 1] tensors.

With few real images D memorises them and its signal to G degrades. ADA shows D every real and fake
image through random transforms, each hitting each image independently with probability p. For
p below about 0.8 the transforms do not "leak": the augmented distribution still determines the clean
one, so G gains nothing by generating augmented-looking images. p follows r_t = E[sign(D(real))]:
above the target D is over-fitting, and p rises.

The set is StyleGAN2-ADA's "bgc" pipeline, in its order (TRANSFORMS):
- blit, exact pixel moves: x-flip; rotation by k * 90 degrees (k uniform in 0..3, so k = 0 leaves the
  image as it was); integer translation (uniform, up to 1/8 of the side, reflected border).
- general geometric: isotropic scaling (log2-normal, std 0.2); rotation by a uniform angle, applied
  before and again after the anisotropic scaling, each with probability 1 - sqrt(1 - p), so p overall;
  anisotropic scaling (x by s, y by 1/s, log2-normal, std 0.2); fractional translation (normal, std 1/8
  of the side). They compose into one affine map per image, so an image is resampled once (bilinear,
  reflected border), and the batch not at all when none of them fired.
- colour: brightness (added, normal, std 0.2); contrast about the image mean (log2-normal, std 0.5);
  luma flip (with probability 1/2 once chosen, as in the reference: mirror along the luma axis, which
  for gray images is x -> -x); hue rotation about the luma axis (uniform angle); saturation (chroma
  scaled, log2-normal, std 1). They compose into one 4x4 colour matrix per image. Hue and saturation
  need colour, so images without 3 channels neither draw nor apply them (transforms_for).

How many numbers are drawn depends on the batch shape only, never on the images or on `only`, so a seed
fixes the augmentation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

TRANSFORMS = ("xflip", "rot90", "xint", "scale", "rotate", "aniso", "xfrac",
              "brightness", "contrast", "lumaflip", "hue", "saturation")
_GENERAL = frozenset({"scale", "rotate", "aniso", "xfrac"})
_COLOUR = frozenset({"brightness", "contrast", "lumaflip", "hue", "saturation"})
_NEEDS_COLOUR = ("hue", "saturation")

# per image: (uniforms deciding whether it fires, parameter uniforms, parameter normals)
_DRAWS = {"xflip": (1, 0, 0), "rot90": (1, 1, 0), "xint": (1, 2, 0), "scale": (1, 0, 1),
          "rotate": (2, 2, 0), "aniso": (1, 0, 1), "xfrac": (1, 0, 2), "brightness": (1, 0, 1),
          "contrast": (1, 0, 1), "lumaflip": (1, 1, 0), "hue": (1, 1, 0), "saturation": (1, 0, 1)}

_Draws = dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def transforms_for(channels: int) -> tuple[str, ...]:
    """The transforms that apply to images with this many channels."""
    return TRANSFORMS if channels == 3 else tuple(t for t in TRANSFORMS if t not in _NEEDS_COLOUR)


def augment(x: torch.Tensor, p: float, generator: torch.Generator, only: str | None = None) -> torch.Tensor:
    """x (B, C, H, W), H = W, through each transform with probability p per image; p = 0 returns x itself.

    `only` names the one transform allowed to fire; the others still draw, so the random stream is
    the same with or without it.
    """
    if p <= 0:
        return x
    if only is not None and only not in TRANSFORMS:
        raise ValueError(f"unknown transform {only!r}; choose from {TRANSFORMS}")
    draws, fired = _draw(transforms_for(x.shape[1]), p, generator, only, x)
    x = _blit(x, draws, fired)
    if fired & _GENERAL:
        x = _general(x, draws)
    if fired & _COLOUR:
        x = _colour(x, draws)
    return x


def _draw(names: tuple[str, ...], p: float, generator: torch.Generator, only: str | None,
          x: torch.Tensor) -> tuple[_Draws, set[str]]:
    """name -> (fires (B, 1), (B, 2) for "rotate"; uniforms; normals) on x's device and in its dtype, and
    the names that fired for some image, decided on the generator's device (no sync for a CPU one)."""
    batch = x.shape[0]
    n_fire, n_uniform, n_normal = zip(*(_DRAWS[t] for t in names))
    p_rotate = 1 - math.sqrt(max(1 - p, 0.0))
    threshold = [(p_rotate if t == "rotate" else p) if only in (None, t) else 0.0
                 for t, k in zip(names, n_fire) for _ in range(k)]
    on = {"generator": generator, "device": generator.device}
    fires = torch.rand(batch, sum(n_fire), **on) < torch.tensor(threshold, device=generator.device)
    uniforms, normals = torch.rand(batch, sum(n_uniform), **on), torch.randn(batch, sum(n_normal), **on)
    anywhere = torch.stack([f.any() for f in fires.split(n_fire, dim=1)]).tolist()
    parts = zip(fires.to(x.device).split(n_fire, dim=1), uniforms.to(x).split(n_uniform, dim=1),
                normals.to(x).split(n_normal, dim=1))
    return dict(zip(names, parts)), {t for t, hit in zip(names, anywhere) if hit}


def _integer(u: torch.Tensor, n: int) -> torch.Tensor:
    """Uniform integers in 0..n-1 from uniforms in [0, 1)."""
    return (u * n).floor().long().clamp(max=n - 1)


def _per_image(mask: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, 1, 1, 1)


def _blit(x: torch.Tensor, draws: _Draws, fired: set[str]) -> torch.Tensor:
    """x-flip, rotation by multiples of 90 degrees, integer translation: exact, no resampling."""
    if "xflip" in fired:
        x = torch.where(_per_image(draws["xflip"][0]), x.flip(-1), x)
    if "rot90" in fired:
        fires, u, _ = draws["rot90"]
        turns = _integer(u[:, 0], 4) * fires[:, 0]
        for k in (1, 2, 3):
            x = torch.where(_per_image(turns == k), torch.rot90(x, k, dims=(-2, -1)), x)
    if "xint" in fired:
        fires, u, _ = draws["xint"]
        reach = x.shape[-1] // 8
        x = translate(x, (_integer(u, 2 * reach + 1) - reach) * fires)
    return x


def translate(x: torch.Tensor, shifts: torch.Tensor) -> torch.Tensor:
    """Shift each image by integer (dy, dx) (shifts (B, 2), each below the side), reflected border."""
    batch, channels, height, width = x.shape
    shifts = shifts.to(x.device)
    rows = _reflect(torch.arange(height, device=x.device) - shifts[:, :1], height)
    cols = _reflect(torch.arange(width, device=x.device) - shifts[:, 1:], width)
    x = x.gather(2, rows.view(batch, 1, height, 1).expand(batch, channels, height, width))
    return x.gather(3, cols.view(batch, 1, 1, width).expand(batch, channels, height, width))


def _reflect(index: torch.Tensor, n: int) -> torch.Tensor:
    """Fold indices in (-n, 2n - 1) into 0..n-1, mirroring about the first and last pixel."""
    return (n - 1) - ((n - 1) - index.abs()).abs()


def _general(x: torch.Tensor, draws: _Draws) -> torch.Tensor:
    """Isotropic scaling, rotation, anisotropic scaling, rotation, fractional translation: one resampling.

    grid_sample wants the map from output to input coordinates: the inverse transforms in forward
    order, G = S(1/s) R(-a1) S(1/k, k) R(-a2) T(-shift) (k the anisotropic factor), on pixel
    coordinates centred in the image.
    """
    batch, side = x.shape[0], x.shape[-1]
    (f_scale, _, z_scale), (f_rot, u_rot, _), (f_aniso, _, z_aniso), (f_frac, _, z_frac) = (
        draws[t] for t in ("scale", "rotate", "aniso", "xfrac"))
    scale = torch.exp2(0.2 * z_scale * f_scale).view(batch, 1, 1)
    angle = (2 * u_rot - 1) * math.pi * f_rot  # (B, 2): before and after the anisotropic scaling
    aniso = torch.exp2(0.2 * z_aniso * f_aniso)
    shift = (0.125 * side) * z_frac * f_frac  # pixels, (x, y)
    cos, sin = angle.cos(), angle.sin()
    unturn = torch.stack([cos, sin, -sin, cos], dim=-1).view(batch, 2, 2, 2)  # R(-a1), R(-a2)
    unstretch = torch.cat([1 / aniso, aniso], dim=1).view(batch, 1, 2)
    linear = (unturn[:, 0] * unstretch) @ unturn[:, 1] / scale
    # align_corners=False: normalised coordinate = centred pixel coordinate * 2 / side
    offset = linear @ shift.unsqueeze(-1) * (-2 / side)
    grid = F.affine_grid(torch.cat([linear, offset], dim=2), list(x.shape), align_corners=False)
    moved = F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
    hit = torch.cat([f_scale, f_rot, f_aniso, f_frac], dim=1).any(dim=1)
    return torch.where(_per_image(hit), moved, x)


def _colour_basis() -> torch.Tensor:
    """4x4 matrices: identity, the colour block, the shift column, the projection onto the luma axis
    v = (1, 1, 1) / sqrt(3) and the cross product v x (.); each colour transform is the identity plus
    a mix of the others."""
    a = 3**-0.5
    basis = torch.zeros(5, 4, 4)
    basis[0] = torch.eye(4)
    basis[1, :3, :3] = torch.eye(3)
    basis[2, :3, 3] = 1.0
    basis[3, :3, :3] = 1 / 3
    basis[4, :3, :3] = torch.tensor([[0.0, -a, a], [a, 0.0, -a], [-a, a, 0.0]])
    return basis


_COLOUR_BASIS = _colour_basis()


def _colour(x: torch.Tensor, draws: _Draws) -> torch.Tensor:
    """Brightness, contrast, luma flip, hue, saturation composed into one 4x4 matrix C per image.

    A gray image is a point (g, g, g) on the luma axis, which brightness, contrast and the luma flip
    keep it on, so C acts on it as the scalar map g -> mean row sum of C's colour block * g + its mean
    shift. An image none of them chose gets exactly the identity (0 and 1 entries), so stays bit for bit.
    """
    batch, channels = x.shape[:2]
    eye, block, shift, along, cross = _COLOUR_BASIS.to(x)
    chroma = block - along
    mean = x.mean(dim=(2, 3)) if channels == 3 else x.mean(dim=(1, 2, 3)).unsqueeze(1).expand(batch, 3)

    fires, _, z = draws["brightness"]
    C = eye + (0.2 * z * fires).view(batch, 1, 1) * shift
    fires, _, z = draws["contrast"]
    gain = torch.exp2(0.5 * z * fires).view(batch, 1, 1)
    centre = (C[:, :3, :3] @ mean.unsqueeze(-1) + C[:, :3, 3:]).mean(dim=1, keepdim=True)  # (B, 1, 1)
    C = (eye + (gain - 1) * block + (1 - gain) * centre * shift) @ C
    fires, u, _ = draws["lumaflip"]
    C = (eye - 2 * (_integer(u, 2) * fires).view(batch, 1, 1) * along) @ C
    if channels == 3:
        fires, u, _ = draws["hue"]
        angle = ((2 * u - 1) * math.pi * fires).view(batch, 1, 1)
        C = (eye + (angle.cos() - 1) * chroma + angle.sin() * cross) @ C  # rotation about the luma axis
        fires, _, z = draws["saturation"]
        C = (eye + (torch.exp2(z * fires).view(batch, 1, 1) - 1) * chroma) @ C  # chroma scaled
        return torch.einsum("bij,bjhw->bihw", C[:, :3, :3], x) + C[:, :3, 3].view(batch, 3, 1, 1)
    gain, offset = C[:, :3, :3].sum(dim=2).mean(dim=1), C[:, :3, 3].mean(dim=1)
    return x * _per_image(gain) + _per_image(offset)


class AdaptiveAugment:
    """The augmentation probability and its controller."""

    def __init__(self, target: float = 0.6, speed_kimg: float = 20.0, interval: int = 4, p: float = 0.0):
        self.target, self.speed_kimg, self.interval, self.p = target, speed_kimg, interval, p
        self._signs: list[float] = []
        self._images = 0
        self.rt = math.nan

    def observe(self, real_logits: torch.Tensor) -> None:
        """Record sign(D(real)) of one D step; every `interval` steps, move p."""
        self._signs.append(float(torch.sign(real_logits.detach()).mean()))
        self._images += real_logits.shape[0]
        if len(self._signs) >= self.interval:
            self.rt = sum(self._signs) / len(self._signs)
            step = math.copysign(self._images / (self.speed_kimg * 1000), self.rt - self.target)
            self.p = min(max(self.p + step, 0.0), 1.0)
            self._signs, self._images = [], 0

    def state_dict(self) -> dict:
        return {"p": self.p, "rt": self.rt}

    def load_state_dict(self, state: dict) -> None:
        self.p, self.rt = state["p"], state["rt"]
        self._signs, self._images = [], 0
