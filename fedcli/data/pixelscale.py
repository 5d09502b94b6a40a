"""One intensity scale per dataset for images deeper than 8 bits, chosen at partition and kept in the manifest.

Scaling each image by its own maximum would reverse the brightness order of two patients (a dark 14-bit
image would come out brighter than a bright one), so partition decides one scale from every file it
decodes (`--bit-depth auto`) or takes the user's (`--bit-depth N`), and every later decode (training,
audit, predict) reads it from the manifest:

- integer data: full scale 2^N - 1, N the smallest of 8, 10, 12, 14, 16 that holds the data's maximum;
- float data within [0, 1]: as it is; other float data, and integers that are negative or above 65,535
  (no bit depth describes them): the dataset's own minimum and maximum.

8-bit files keep their own scale (PIL converts them), and so do DICOM files (their window, `dicom.py`).
A bit depth is a format's ceiling, so a value above it (a wrong depth) is refused; a value range is the
data's own, so a later image beyond it is clipped to it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedcli.core.errors import UserError
from fedcli.experiment.config import BIT_DEPTHS

EIGHT_BIT, INTEGER, FLOAT, DICOM = "8-bit", "integer", "float", "dicom"  # what decoding one file found
DEEP = (INTEGER, FLOAT)  # the kinds a dataset's scale applies to


@dataclasses.dataclass(frozen=True)
class Pixels:
    """What decoding one file found: its kind, the range of its finite values (deep kinds) and colour."""

    kind: str
    low: float = 0.0
    high: float = 0.0
    rgb: bool = False


def deep_pixels(values: np.ndarray) -> Pixels:
    """The kind and finite value range of a deeper-than-8-bit grayscale array."""
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    return Pixels(FLOAT if values.dtype.kind == "f" else INTEGER, low, high)


def full_scale(depth: int) -> int:
    return 2**depth - 1


@dataclasses.dataclass(frozen=True)
class Scale:
    """Deep values v map to (v - low) / (high - low), clipped to [0, 1]: on a bit depth (low 0, high
    2^N - 1) or on the data's value range. Neither set: a manifest written before partition recorded a
    scale, which decodes 8-bit files as it always did and refuses deeper ones."""

    bit_depth: int | None = None
    value_range: tuple[float, float] | None = None

    @classmethod
    def from_manifest(cls, data: dict[str, Any], path: Path | None) -> "Scale":
        if "bit_depth" not in data:
            return cls()
        depth, value_range = data.get("bit_depth"), data.get("value_range")
        valid_range = value_range is None or (
            isinstance(value_range, list) and len(value_range) == 2
            and all(isinstance(v, (int, float)) and math.isfinite(v) for v in value_range))
        one = (depth is None) != (value_range is None)
        if not one or (depth is not None and depth not in BIT_DEPTHS) or not valid_range:
            raise UserError(f"{path} has no valid pixel scale (bit_depth {depth!r}, value_range {value_range!r}); "
                            "re-run fedcli partition")
        return cls(depth, tuple(value_range) if value_range is not None else None)

    def manifest_fields(self) -> dict[str, Any]:
        return {"bit_depth": self.bit_depth, "value_range": list(self.value_range) if self.value_range else None}

    def describe(self) -> str:
        if self.bit_depth is not None:
            return f"{self.bit_depth}-bit (0..{full_scale(self.bit_depth):,})"
        return f"the data's value range {self.value_range[0]:g}..{self.value_range[1]:g}"

    def misfit(self, pixels: Pixels) -> tuple[str, str] | None:
        """(reason, advice) when a deep file's values cannot be read on this scale, else None."""
        if pixels.kind not in DEEP or self.value_range is not None:
            return None
        if self.bit_depth is None:
            return ("is deeper than 8 bits, but its partition was written before fedcli kept one pixel scale per "
                    "dataset", "re-run fedcli partition --overwrite")
        top = full_scale(self.bit_depth)
        if pixels.kind == FLOAT:
            return (f"is a float image, which has no bit depth (this dataset's scale is {self.describe()})",
                    "convert it to integers, or partition float data with --bit-depth auto")
        if pixels.low < 0 or pixels.high > top:
            return (f"holds values {pixels.low:g}..{pixels.high:g}, outside the {self.bit_depth}-bit range 0..{top:,}",
                    "partition with a larger --bit-depth, or auto")
        return None

    def unit(self, values: np.ndarray) -> np.ndarray:
        """Deep values as float32 in [0, 1] (after `misfit` found nothing); NaN and +-inf become 0."""
        low, high = self.value_range or (0.0, float(full_scale(self.bit_depth)))
        values = values.astype(np.float64)
        scaled = np.clip((values - low) / (high - low), 0, 1) if high > low else np.zeros_like(values)
        return np.where(np.isfinite(values), scaled, 0.0).astype(np.float32)


def decide(requested: int | str, files: dict[str, Pixels], root: Path | None) -> Scale:
    """The dataset's scale from `--bit-depth` and what decoding its files (relative path -> Pixels) found."""
    deep = {rel: p for rel, p in files.items() if p.kind in DEEP}
    first = {kind: next((rel for rel, p in files.items() if p.kind == kind), None) for kind in (EIGHT_BIT, *DEEP)}
    where = (lambda rel: Path(root) / rel) if root is not None else Path
    if first[INTEGER] and first[FLOAT]:
        raise UserError(f"the data mixes integer images ({where(first[INTEGER])}) with float ones "
                        f"({where(first[FLOAT])}), which share no scale; convert them to one type")
    if requested != "auto":
        scale = Scale(bit_depth=int(requested))
    elif first[EIGHT_BIT] and deep:
        raise UserError(f"the data mixes 8-bit images ({where(first[EIGHT_BIT])}) with deeper ones "
                        f"({where(next(iter(deep)))}), so --bit-depth auto cannot choose one scale; pass --bit-depth "
                        "N, the deeper files' depth (8-bit files keep theirs), or convert them to one depth")
    else:
        scale = automatic(list(deep.values()))
    for rel, pixels in deep.items():
        if problem := scale.misfit(pixels):
            raise UserError(f"image {where(rel)} {problem[0]}; {problem[1]}")
    return scale


def automatic(deep: list[Pixels]) -> Scale:
    """`--bit-depth auto` over the dataset's deep files (none: 8 bits)."""
    if not deep:
        return Scale(bit_depth=8)
    low, high = min(p.low for p in deep), max(p.high for p in deep)
    if deep[0].kind == INTEGER and low >= 0 and high <= full_scale(BIT_DEPTHS[-1]):
        return Scale(bit_depth=next(d for d in BIT_DEPTHS if high <= full_scale(d)))
    if deep[0].kind == FLOAT and low >= 0 and high <= 1:
        return Scale(value_range=(0.0, 1.0))
    return Scale(value_range=(low, high))
