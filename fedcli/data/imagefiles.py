"""Finding, checking and decoding image files: the one decoder partition, training and predict share.

Pixel rule (docs/data.md): a file is first turned upright by its EXIF
orientation. 8-bit files are then converted by PIL as they are; deeper grayscale files (16-bit PNG/TIFF,
32-bit integer, float) are scaled to [0, 1] on the dataset's one scale (`pixelscale`, chosen at
partition and kept in the manifest), then resized as floats and quantised to uint8 once; DICOM files go
through their own modality and VOI transforms (`dicom`). A file declaring more than `MAX_PIXELS` pixels
is refused from its header, before anything is decompressed; a file of several images (a multi-page TIFF, an
animated GIF, PNG or WebP, a multi-frame DICOM) is refused rather than silently read at its first one. An MPO
file, a camera's JPEG with a preview or a stereo pair appended, is read at its first image, as every viewer
shows it.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fedcli.core.errors import UserError
from fedcli.data import dicom
from fedcli.data.graham import graham
from fedcli.data.pixelscale import DICOM, EIGHT_BIT, Pixels, Scale, deep_pixels

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".gif", ".webp", dicom.SUFFIX}
GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"}
DEEP_MODES = {"I", "I;16", "I;16B", "I;16L", "I;16N", "F"}  # more than 8 bits per pixel: see pixelscale
MAX_PIXELS = 100_000_000  # 10,000 x 10,000; a larger file is refused as a likely decompression bomb
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
    """A PIL image whose header declares at most MAX_PIXELS pixels and one page; any failure is a BadImageError.

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
        check_size(path, image.width, image.height)
        try:
            frames = getattr(image, "n_frames", 1)
            if frames > 1 and image.format != "MPO":
                raise BadImageError(path, f"holds {frames} {'pages' if image.format == 'TIFF' else 'frames'}",
                                    dicom.ONE_IMAGE)
            yield image
        except unreadable as exc:
            raise BadImageError(path, f"is unreadable or corrupt ({exc})", "replace or delete it") from exc


def check_size(path: Path, width: int, height: int) -> None:
    if width * height > MAX_PIXELS:
        raise too_large(path, f"{width} x {height}")


def too_large(path: Path, pixels: str) -> BadImageError:
    return BadImageError(path, f"declares {pixels} pixels, over fedcli's limit of {MAX_PIXELS:,} (a decompression "
                         "bomb?)", "shrink or delete it")


def read_dicom(path: Path) -> np.ndarray:
    """A DICOM file's displayed pixels (`dicom.read`); pydicom's warnings are silenced, under the lock."""
    try:
        with OPEN_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return dicom.read(path, lambda width, height: check_size(path, width, height))
    except FileNotFoundError as exc:
        raise BadImageError(path, "is missing", "restore it or re-run fedcli partition on the current data") from exc
    except dicom.DicomError as exc:
        raise BadImageError(path, exc.reason, exc.advice) from exc


def inspect_image(path: Path) -> Pixels:
    """Decode the whole file once, so that truncated or corrupt data stops partition rather than a later
    stage: its kind, value range (deeper files) and colour. JPEGs decode at 1/8 size (libjpeg's DCT
    scaling still reads every coded block), the one format where a smaller decode is cheaper."""
    from PIL import ImageOps

    if path.suffix.lower() == dicom.SUFFIX:
        return Pixels(DICOM, rgb=read_dicom(path).ndim == 3)
    with open_image(path) as image:
        if image.format == "JPEG":
            image.draft(None, (1, 1))
        ImageOps.exif_transpose(image, in_place=True)  # loads the file, and reads its orientation as decoding will
        if image.mode in DEEP_MODES:
            return deep_pixels(np.asarray(image))
        return Pixels(EIGHT_BIT, rgb=image.mode not in GRAY_MODES)


def check_images(root: Path, relpaths: Iterable[str]) -> tuple[list[int], int, dict[str, Pixels]]:
    """Decode each image once (in threads: PIL releases the GIL); return file sizes, the channel count they
    need, and what decoding each found (for the dataset's pixel scale).

    A file that is missing, not a readable image, truncated, or that declares too many pixels is an error
    that names it.
    """
    relpaths = list(relpaths)

    def inspect(rel: str) -> tuple[int, Pixels]:
        path = root / rel
        if not path.is_file():
            raise UserError(f"image {path} is missing; restore it or remove it from the labels")
        return path.stat().st_size, inspect_image(path)

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        found = list(pool.map(inspect, relpaths))
    channels = 3 if any(pixels.rgb for _, pixels in found) else 1
    return [size for size, _ in found], channels, {rel: pixels for rel, (_, pixels) in zip(relpaths, found)}


def displayed(path: Path, gray: bool | None, scale: Scale):
    """The file upright as a PIL image: 'L' or 'RGB' for 8-bit files, as PIL converts them; 'F' in [0, 1]
    for deeper grayscale files (on `scale`) and grayscale DICOM, to be quantised once at the end.
    `gray` None keeps what the file is (grayscale or colour)."""
    from PIL import Image, ImageOps

    if path.suffix.lower() == dicom.SUFFIX:
        values = read_dicom(path)
        if values.ndim == 2:
            return Image.fromarray(values, "F")
        return Image.fromarray(values, "RGB").convert("L" if gray else "RGB")
    with open_image(path) as image:
        ImageOps.exif_transpose(image, in_place=True)
        if image.mode in DEEP_MODES:
            values = np.asarray(image)
            if problem := scale.misfit(deep_pixels(values)):
                raise BadImageError(path, *problem)
            return Image.fromarray(scale.unit(values), "F")
        if gray is None:
            gray = image.mode in GRAY_MODES
        return image.convert("L" if gray else "RGB")


def channels_first(array: np.ndarray) -> np.ndarray:
    """(H, W) or (H, W, C) -> (C, H, W)."""
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def decode_image(path: Path, size: int, channels: int, scale: Scale, preprocess: str = "none") -> np.ndarray:
    """Decode one file to a (C, size, size) uint8 array (anti-aliased resize, square); `preprocess` graham
    prepares the file at its own size first (`graham`), as the partition's manifest says."""
    from PIL import Image

    image = displayed(path, channels == 1, scale)
    if preprocess == "graham":
        image = Image.fromarray(graham(np.asarray(image)))
    if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0)
    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = np.rint(array * 255).clip(0, 255).astype(np.uint8)
    array = channels_first(array)
    return np.repeat(array, channels, axis=0) if array.shape[0] != channels else array


def native_pixels(path: Path, scale: Scale) -> np.ndarray:
    """(C, H, W) at the file's own size, one channel for grayscale files, else RGB: uint8 for 8-bit
    files, float32 in [0, 1] for deeper ones (for array-source experiments, which resize tensors)."""
    return channels_first(np.asarray(displayed(path, None, scale)))
