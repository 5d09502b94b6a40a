"""DICOM through pydicom (the `dicom` extra): the modality LUT, the VOI window and MONOCHROME1 as pydicom
applies them, on files the tests write with pydicom; without pydicom, one line saying what to install."""

from __future__ import annotations

import sys

import numpy as np
import pydicom
import pytest
from pydicom.dataset import FileDataset, FileMetaDataset
from pydicom.pixels import apply_modality_lut, apply_voi_lut
from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage

from conftest import make_folders, one_clean_line, record_case
from fedcli.data.dataset import NodeDataset
from fedcli.data.imagefiles import BadImageError, native_pixels
from fedcli.data.manifest import Manifest
from fedcli.data.pixelscale import Scale

EIGHT_BIT = Scale(bit_depth=8)  # a DICOM file ignores the dataset's scale: any will do


def write_dicom(path, stored: np.ndarray, photometric: str = "MONOCHROME1", **elements) -> None:
    """A 12-bit-in-16 single-frame secondary capture holding `stored` (frames first when 3-D)."""
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = "1.2.826.0.1.3680043.8.498.1"
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Rows, ds.Columns = stored.shape[-2:]
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    if stored.ndim == 3:
        ds.NumberOfFrames = stored.shape[0]
    for name, value in elements.items():
        setattr(ds, name, value)
    ds.PixelData = stored.astype(np.uint16).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


RAMP = np.linspace(0, 4095, 16 * 16).round().reshape(16, 16)  # every stored value from 0 to 4095


def test_monochrome1_with_rescale_and_window_decodes_as_pydicom_displays_it_inverted(tmp_path):
    path = tmp_path / "cr.dcm"
    write_dicom(path, RAMP, RescaleSlope=2, RescaleIntercept=-1000, WindowCenter=3000, WindowWidth=4000)
    ds = pydicom.dcmread(path)
    shown = apply_voi_lut(apply_modality_lut(ds.pixel_array, ds), ds)
    low, high = shown.min(), shown.max()  # the window clips both ends: its output range
    assert (shown == low).sum() > 1 and (shown == high).sum() > 1
    expected = 1 - (shown - low) / (high - low)  # MONOCHROME1: high values are dark
    decoded = native_pixels(path, EIGHT_BIT)
    assert decoded.shape == (1, 16, 16) and decoded.dtype == np.float32
    np.testing.assert_allclose(decoded[0], expected, atol=1e-6)
    assert decoded[0, 0, 0] == 1 and decoded[0, -1, -1] == 0  # the smallest stored value is the brightest


def test_monochrome2_without_window_is_read_on_its_rescaled_stored_range(tmp_path):
    path = tmp_path / "ct.dcm"
    write_dicom(path, RAMP, "MONOCHROME2", RescaleSlope=1, RescaleIntercept=-1024)
    np.testing.assert_allclose(native_pixels(path, EIGHT_BIT)[0], RAMP / 4095, atol=1e-6)


def test_a_folders_dataset_of_dicom_files_partitions_and_trains_on_the_displayed_pixels(cli, tmp_path):
    data = tmp_path / "data"
    for k in range(24):
        site, cls = "ab"[k // 12], "xy"[k % 2]
        write_dicom(data / site / cls / f"{k}.dcm", np.roll(RAMP, k), WindowCenter=2048, WindowWidth=2000)
    exp = tmp_path / "exp"
    cli.ok("partition", "--source", "folders", "--data-dir", data, "--exp", exp, "--folds", "2", "--image-size", "16")
    manifest = Manifest.load(exp)
    assert manifest["channels"] == 1
    dataset = NodeDataset(manifest, "b", "train")
    for record, image in zip(dataset.records, dataset.images):
        expected = np.rint(native_pixels(data / record["path"], EIGHT_BIT) * 255)
        np.testing.assert_array_equal(image.numpy(), expected)


def test_a_multi_frame_file_is_refused(tmp_path):
    write_dicom(tmp_path / "cine.dcm", np.stack([RAMP, RAMP]))
    with pytest.raises(BadImageError, match="cine.dcm holds 2 frames; fedcli reads one image per file"):
        native_pixels(tmp_path / "cine.dcm", EIGHT_BIT)


def test_undecodable_compressed_pixel_data_is_one_line_naming_its_transfer_syntax(tmp_path):
    """Issue 57, point 11: the message ran over two lines and showed `<_io.BytesIO object at 0x...>`."""
    from pydicom.encaps import encapsulate
    from pydicom.uid import JPEGBaseline8Bit

    path = tmp_path / "scan.dcm"
    write_dicom(path, RAMP, "MONOCHROME2")
    ds = pydicom.dcmread(path)
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 8, 8, 7
    ds.PixelData = encapsulate([b"\xff\xd8garbage" * 4])
    ds["PixelData"].VR = "OB"
    ds.save_as(path, enforce_file_format=True)
    with pytest.raises(BadImageError) as raised:
        native_pixels(path, EIGHT_BIT)
    message = str(raised.value)
    assert "scan.dcm holds pixel data in JPEG Baseline (Process 1) that cannot be decoded" in message
    assert "replace it, or export it uncompressed" in message and " at 0x" not in message and "\n" not in message


def test_without_pydicom_a_dicom_file_says_what_to_install(cli, tmp_path, monkeypatch):
    data = make_folders(tmp_path / "data", {"a": {"x": 6, "y": 6}, "b": {"x": 6, "y": 6}})
    write_dicom(data / "b" / "y" / "scan.dcm", RAMP)
    monkeypatch.setitem(sys.modules, "pydicom", None)  # import pydicom now raises ImportError
    exp = tmp_path / "exp"
    args = ["partition", "--source", "folders", "--data-dir", data, "--exp", exp, "--folds", "2"]
    result = cli(*args)
    record_case(12, "a .dcm file without pydicom installed", args, result, intact=not exp.exists())
    assert result.exit_code == 2 and one_clean_line(result), result.output + result.stderr
    assert "scan.dcm is DICOM" in result.stderr and "pip install 'fedcli[dicom]'" in result.stderr
    assert not exp.exists()
