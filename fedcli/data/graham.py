"""Graham's preprocessing of fundus photographs (the Kaggle DR winner, Graham 2015), as the generative-replay
study applies it: "first rescaling images to the same eye radius of 300, subtracting the local average color
of each image, then cropping to remove the image boundaries".

The eye's radius is read from the middle row as Graham's code does: half the count of pixels brighter than a
tenth of the row's mean, the eye centred in the frame. Only the eye's bounding square is rescaled, so a
misread small radius cannot blow the image up. The local average is a Gaussian blur of sigma radius/30, and
the result 4 (image - average) + 128 puts every region of even colour at mid-grey, whatever the camera's
exposure. The blur's bright ring at the eye's rim (where the black background enters the average) is masked
out with everything beyond 90% of the radius, set to 128, and the image is cropped to that disc's square.
"""

from __future__ import annotations

import math

import numpy as np

RADIUS = 300  # the eye's radius after rescaling, in pixels
KEPT = 0.9  # the share of the radius kept


def eye_radius(image: np.ndarray) -> float:
    """Half the count of the middle row's pixels brighter than a tenth of its mean; half the width when none
    is (a black frame)."""
    row = image[image.shape[0] // 2].astype(np.float64)
    row = row.sum(axis=-1) if row.ndim == 2 else row
    return float((row > row.mean() / 10).sum()) / 2 or image.shape[1] / 2


def graham(image: np.ndarray) -> np.ndarray:
    """A uint8 (H, W) or (H, W, C) fundus photograph as Graham's square uint8 image of side 2 x 0.9 x RADIUS."""
    from PIL import Image
    from scipy.ndimage import gaussian_filter

    height, width = image.shape[:2]
    radius = eye_radius(image)
    top, left = max(0, math.floor(height / 2 - radius)), max(0, math.floor(width / 2 - radius))
    bottom, right = min(height, math.ceil(height / 2 + radius)), min(width, math.ceil(width / 2 + radius))
    factor = RADIUS / radius
    crop = Image.fromarray(image[top:bottom, left:right])
    scaled = np.asarray(crop.resize((max(1, round(crop.width * factor)), max(1, round(crop.height * factor))),
                                    Image.Resampling.BILINEAR, reducing_gap=3.0), dtype=np.float32)
    sigma = (RADIUS / 30, RADIUS / 30, 0)[:scaled.ndim]
    sharpened = np.clip(4 * scaled - 4 * gaussian_filter(scaled, sigma, mode="reflect") + 128, 0, 255)
    kept = round(KEPT * RADIUS)
    out = np.full((2 * kept, 2 * kept, *scaled.shape[2:]), 128, dtype=np.float32)
    # the frame's centre, in the scaled crop, lands on the output's centre
    row0 = round((height / 2 - top) * factor) - kept
    col0 = round((width / 2 - left) * factor) - kept
    rows = slice(max(0, row0), min(scaled.shape[0], row0 + 2 * kept))
    cols = slice(max(0, col0), min(scaled.shape[1], col0 + 2 * kept))
    out[rows.start - row0:rows.stop - row0, cols.start - col0:cols.stop - col0] = sharpened[rows, cols]
    centre = np.arange(2 * kept) + 0.5 - kept
    out[centre[:, None] ** 2 + centre[None, :] ** 2 > kept ** 2] = 128
    return np.rint(out).astype(np.uint8)
