"""Finding, checking and decoding image files: the one decoder partition, training and predict share.

Pixel rule (README, "Preparing the real datasets"): 8-bit files are converted by PIL as they are;
deeper grayscale files (16-bit PNG/TIFF, 32-bit integer, float) are first scaled to [0, 1] by
`unit_range`, then resized as floats and quantised to uint8 once. A file declaring more than
`MAX_PIXELS` pixels is refused from its header, before anything is decompressed.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fedcli.errors import UserError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".gif", ".webp"}
GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}
DEEP_MODES = {"I", "I;16", "I;16B", "I;16L", "I;16N", "F"}  # more than 8 bits per pixel: see unit_range
MAX_PIXELS = 100_000_000  # 10,000 x 10,000; a larger file is refused as a likely decompression bomb
TWELVE_BIT, SIXTEEN_BIT = 4095, 65535
OPEN_LOCK = threading.Lock()  # warnings.catch_warnings is not thread-safe; decoding runs in threads


class BadImageError(UserError):
    """A file that is not a usable image; `reason` alone (e.g. "is missing") serves lists of skipped files."""

    def __init__(self, path: Path, reason: str, advice: str):
        super().__init__(f"image {path} {reason}; {advice}")
        self.path, self.reason = path, reason


def is_image_file(path: Path) -> bool:
    """An image by suffix, skipping hidden files and macOS archive debris (`__MACOSX`, `._x`)."""
    return (
        path.suffix.lower() in IMAGE_SUFFIXES
        and not path.name.startswith(".")
        and "__MACOSX" not in path.parts
        and path.is_file()
    )


def require_dir(path: Path, source: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise UserError(f"data folder {path} does not exist; check --data-dir for --source {source}")
    if not path.is_dir():
        raise UserError(f"--data-dir {path} is not a folder (--source {source} reads a folder)")
    if not any(path.iterdir()):
        raise UserError(f"data folder {path} is empty; put the {source} data there")
    return path


@contextmanager
def open_image(path: Path) -> Iterator:
    """A PIL image whose header declares at most MAX_PIXELS pixels; any failure is a BadImageError.

    PIL's own bomb check (a warning above 89.5 M pixels, an error above twice that) is replaced by
    fedcli's single limit, so a file is either accepted silently or refused with one line.
    """
    from PIL import Image, UnidentifiedImageError

    unreadable = (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError)
    try:
        with OPEN_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(path)
    except FileNotFoundError as exc:
        raise BadImageError(path, "is missing", "restore it or re-run fedcli partition on the current data") from exc
    except Image.DecompressionBombError as exc:  # PIL's hard limit, above twice its warning threshold
        raise too_large(path, f"more than {2 * Image.MAX_IMAGE_PIXELS:,}") from exc
    except unreadable as exc:
        raise BadImageError(path, f"is unreadable or corrupt ({exc})", "replace or delete it") from exc
    with image:
        if image.width * image.height > MAX_PIXELS:
            raise too_large(path, f"{image.width} x {image.height}")
        try:
            yield image
        except unreadable as exc:
            raise BadImageError(path, f"is unreadable or corrupt ({exc})", "replace or delete it") from exc


def too_large(path: Path, pixels: str) -> BadImageError:
    return BadImageError(path, f"declares {pixels} pixels, over fedcli's limit of {MAX_PIXELS:,} (a decompression "
                         "bomb?)", "shrink or delete it")


def check_images(root: Path, relpaths: Iterable[str]) -> tuple[list[int], int]:
    """Open each image's header (cheap); return file sizes and the channel count they need.

    A file that is not a readable image, or that declares too many pixels, is an error that names it.
    """
    sizes, channels = [], 1
    for rel in relpaths:
        path = root / rel
        if not path.is_file():
            raise UserError(f"image {path} is missing; restore it or remove it from the labels")
        with open_image(path) as image:
            image.verify()
            if image.mode not in GRAY_MODES:
                channels = 3
        sizes.append(path.stat().st_size)
    return sizes, channels


def unit_range(values: np.ndarray) -> np.ndarray:
    """A deep grayscale image's values as float32 in [0, 1].

    Integers in [0, 4095] are 12-bit data (full scale 4095), in [0, 65535] 16-bit data (full scale
    65535); floats in [0, 1] stay as they are; anything else (negative values, 32-bit integers over
    65535, floats outside [0, 1]) is min-max scaled over the image's finite values, a constant image
    giving 0. NaN and +-inf become 0.
    """
    floats = values.dtype.kind == "f"
    values = values.astype(np.float64)
    finite = np.isfinite(values)
    low, high = (values[finite].min(), values[finite].max()) if finite.any() else (0.0, 0.0)
    if floats and 0 <= low and high <= 1:
        scaled = values
    elif not floats and 0 <= low and high <= SIXTEEN_BIT:
        scaled = values / (TWELVE_BIT if high <= TWELVE_BIT else SIXTEEN_BIT)
    else:
        scaled = (values - low) / (high - low) if high > low else np.zeros_like(values)
    return np.where(finite, scaled, 0.0).astype(np.float32)


def decodable(image, gray: bool):
    """The opened image in a mode resize handles: 8-bit files as 'L' (gray) or 'RGB', as PIL converts
    them; deeper grayscale files as 'F' in [0, 1] (`unit_range`), to be quantised once at the end."""
    from PIL import Image

    if image.mode in DEEP_MODES:
        return Image.fromarray(unit_range(np.asarray(image)), "F")
    return image.convert("L" if gray else "RGB")


def channels_first(array: np.ndarray) -> np.ndarray:
    """(H, W) or (H, W, C) -> (C, H, W)."""
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def decode_image(path: Path, size: int, channels: int) -> np.ndarray:
    """Decode one file to a (C, size, size) uint8 array (anti-aliased resize, square)."""
    from PIL import Image

    with open_image(path) as image:
        image = decodable(image, gray=channels == 1)
        if image.size != (size, size):
            image = image.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0)
        array = np.asarray(image)
    if array.dtype != np.uint8:
        array = np.rint(array * 255).clip(0, 255).astype(np.uint8)
    array = channels_first(array)
    return np.repeat(array, channels, axis=0) if array.shape[0] != channels else array


def native_pixels(path: Path) -> np.ndarray:
    """(C, H, W) at the file's own size, one channel for grayscale modes, else RGB: uint8 for 8-bit
    files, float32 in [0, 1] for deeper ones (for array-source experiments, which resize tensors)."""
    with open_image(path) as image:
        return channels_first(np.asarray(decodable(image, gray=image.mode in GRAY_MODES)))
