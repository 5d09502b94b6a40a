"""DICOM files (`.dcm`) through pydicom, an optional extra (`pip install 'fedcli[dicom]'`).

A DICOM file states how its stored values are displayed, so `--bit-depth` does not apply to it: the
modality LUT (Rescale Slope and Intercept, or a Modality LUT Sequence) and then the VOI LUT Sequence or
else the first window (Window Center and Width) are applied as pydicom applies them, and the result is
read on that stage's output range, the one pydicom's windowing maps onto: the VOI LUT's entries
(0..2^bits - 1), else the modality stage's (Bits Stored's range, rescaled). MONOCHROME1 (higher values
darker) is inverted, so bright means dense in every file. One frame of grayscale or 8-bit colour is read;
anything else is refused with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedcli.core.errors import UserError

SUFFIX = ".dcm"
GRAY = ("MONOCHROME1", "MONOCHROME2")
ONE_IMAGE = "fedcli reads one image per file: save the frame to use as its own file"  # every multi-frame file's advice


class DicomError(ValueError):
    """Why a .dcm file is not one usable image, for the decoder to report with its path."""

    def __init__(self, reason: str, advice: str = "replace or delete it"):
        super().__init__(reason)
        self.reason, self.advice = reason, advice


def pydicom_module(path: Path):
    try:
        import pydicom
    except ImportError as exc:
        raise UserError(f"image {path} is DICOM, which fedcli reads with pydicom, not installed here; "
                        "pip install 'fedcli[dicom]'") from exc
    return pydicom


def read(path: Path, check_size: Callable[[int, int], None]) -> np.ndarray:
    """The displayed image: float32 (H, W) in [0, 1] for grayscale, uint8 (H, W, 3) for colour.
    `check_size(width, height)` runs on the header, before the pixel data is decoded."""
    pydicom = pydicom_module(path)
    try:
        ds = pydicom.dcmread(path)
        check_size(int(ds.Columns), int(ds.Rows))
        frames = int(ds.get("NumberOfFrames") or 1)
        if frames > 1:
            raise DicomError(f"holds {frames} frames", ONE_IMAGE)
        photometric = str(ds.PhotometricInterpretation)
        values = pixels(ds)
        if photometric in GRAY:
            return grayscale(ds, values)
        if values.ndim == 3 and values.dtype == np.uint8:
            return values
        raise DicomError(f"has photometric interpretation {photometric} with {ds.BitsAllocated}-bit samples",
                         "fedcli reads MONOCHROME1, MONOCHROME2 and 8-bit colour: export it as one of them")
    except (DicomError, UserError, FileNotFoundError):
        raise
    except Exception as exc:  # pydicom raises many types for a damaged or unsupported file
        raise DicomError(f"is unreadable or corrupt ({plain(exc)})") from exc


def pixels(ds) -> np.ndarray:
    """The stored pixel values (colour as RGB: pydicom converts YBR); data its transfer syntax's decoders cannot
    read is refused naming that syntax."""
    try:
        return ds.pixel_array
    except Exception as exc:
        syntax = getattr(ds.get("file_meta"), "TransferSyntaxUID", None)
        raise DicomError(f"holds pixel data{f' in {syntax.name}' if syntax else ''} that cannot be decoded "
                         f"({plain(exc)})", "replace it, or export it uncompressed") from exc


def plain(exc: Exception) -> str:
    """pydicom's message on one line, without the object reprs (`<_io.BytesIO object at 0x...>`) it names."""
    text = re.sub(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>", "", str(exc))
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return text[:200] or type(exc).__name__


def grayscale(ds, values: np.ndarray) -> np.ndarray:
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    lut = voi_lut(ds)
    low, high = (0, 2 ** int(lut.LUTDescriptor[2]) - 1) if lut is not None else modality_range(ds)
    values = np.asarray(apply_voi_lut(apply_modality_lut(values, ds), ds), dtype=np.float64)
    unit = np.clip((values - low) / (high - low), 0, 1) if high != low else np.zeros_like(values)
    return (1 - unit if ds.PhotometricInterpretation == "MONOCHROME1" else unit).astype(np.float32)


def voi_lut(ds):
    """The first VOI LUT when it is complete: pydicom's `apply_voi_lut` then prefers it to a window."""
    items = ds.get("VOILUTSequence")
    item = items[0] if items else None
    complete = item is not None and item.get("LUTDescriptor") is not None and item.get("LUTData") is not None
    return item if complete else None


def modality_range(ds) -> tuple[float, float]:
    """The modality stage's output range: a Modality LUT's entries, else Bits Stored's range rescaled
    (reversed by a negative slope, which the division in `grayscale` then keeps)."""
    if ds.get("ModalityLUTSequence"):
        return 0, 2 ** int(ds.ModalityLUTSequence[0].LUTDescriptor[2]) - 1
    bits = int(ds.BitsStored)
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if ds.PixelRepresentation == 1 else (0, 2**bits - 1)
    if "RescaleSlope" in ds and "RescaleIntercept" in ds:
        slope, intercept = float(ds.RescaleSlope), float(ds.RescaleIntercept)
        low, high = low * slope + intercept, high * slope + intercept
    return low, high
