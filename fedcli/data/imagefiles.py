"""Finding, checking and decoding image files."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from fedcli.errors import UserError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".gif", ".webp"}
GRAY_MODES = {"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F"}


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


def check_images(root: Path, relpaths: Iterable[str]) -> tuple[list[int], int]:
    """Open each image's header (cheap); return file sizes and the channel count they need.

    A file that is not a readable image is an error that names it.
    """
    from PIL import Image, UnidentifiedImageError

    sizes, channels = [], 1
    for rel in relpaths:
        path = root / rel
        try:
            with Image.open(path) as image:
                image.verify()
                if image.mode not in GRAY_MODES:
                    channels = 3
        except FileNotFoundError as exc:
            raise UserError(f"image {path} is missing; restore it or remove it from the labels") from exc
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise UserError(f"image {path} is unreadable or corrupt ({exc}); replace or delete it") from exc
        sizes.append(path.stat().st_size)
    return sizes, channels


def decode_image(path: Path, size: int, channels: int) -> np.ndarray:
    """Decode one file to a (C, size, size) uint8 array (anti-aliased resize, square)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image = image.convert("L" if channels == 1 else "RGB")
            if image.size != (size, size):
                image = image.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0)
            array = np.asarray(image, dtype=np.uint8)
    except FileNotFoundError as exc:
        raise UserError(f"image {path} is missing; re-run fedcli partition on the current data") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise UserError(f"image {path} is unreadable or corrupt ({exc}); replace or delete it") from exc
    return array[None] if channels == 1 else array.transpose(2, 0, 1)
