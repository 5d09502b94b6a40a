"""One decoder for partition, training and predict: deep images scaled, not clipped; bombs refused."""

from __future__ import annotations

import struct
import warnings
import zlib

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from conftest import record_case
from fedcli.data.dataset import NodeDataset
from fedcli.data.imagefiles import BadImageError, check_images, decode_image, unit_range
from fedcli.data.loading import load_images
from fedcli.data.manifest import Manifest
from fedcli.predict import decode

RAMP16 = np.linspace(0, 65535, 48 * 48).round().astype(np.uint16).reshape(48, 48)
RAMP12 = np.linspace(0, 4095, 48 * 48).round().astype(np.uint16).reshape(48, 48)


def bomb_png(path, side: int) -> None:
    """A valid PNG of a few dozen bytes whose header declares side x side pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # 8-bit grayscale
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))


def file_bytes(root) -> dict:
    """Every file under root and its content, to show a command left them as they were."""
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def monotone(array: np.ndarray) -> bool:
    return bool((np.diff(array.ravel().astype(int)) >= 0).all())


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_a_16_bit_ramp_keeps_its_order_and_full_range(tmp_path, suffix):
    Image.fromarray(RAMP16).save(tmp_path / f"ramp{suffix}")  # mode I;16; PIL used to clip it at 255
    image = decode_image(tmp_path / f"ramp{suffix}", 48, 1)
    assert image.dtype == np.uint8 and image.shape == (1, 48, 48)
    assert image.min() == 0 and image.max() == 255 and monotone(image)
    assert len(np.unique(image)) == 256 and (image == 255).mean() < 0.01


def test_12_bit_data_in_16_bits_is_not_crushed_to_16_levels(tmp_path):
    Image.fromarray(RAMP12).save(tmp_path / "ramp12.png")
    image = decode_image(tmp_path / "ramp12.png", 48, 1)
    assert image.min() == 0 and image.max() == 255 and monotone(image)
    assert len(np.unique(image)) >= 200
    rgb = decode_image(tmp_path / "ramp12.png", 24, 3)  # resized as floats, channels replicated
    assert rgb.shape == (3, 24, 24) and (rgb[0] == rgb[1]).all() and (rgb[1] == rgb[2]).all()
    assert len(np.unique(rgb)) > 100 and rgb.max() > 240


@pytest.mark.parametrize("values, expected", [
    (np.full((8, 8), 0.5, np.float32), 128),                                 # within [0, 1]: as it is
    (np.linspace(-3, 7, 64, dtype=np.float32).reshape(8, 8), None),         # elsewhere: min-max
])
def test_float_tiffs_are_scaled_once(tmp_path, values, expected):
    Image.fromarray(values, "F").save(tmp_path / "f.tif")
    image = decode_image(tmp_path / "f.tif", 8, 1)
    if expected is not None:
        assert (image == expected).all()
    else:
        assert image.min() == 0 and image.max() == 255 and monotone(image)


@pytest.mark.parametrize("values, expected", [
    (np.array([[0, 4095]], np.uint16), [0, 1]),                       # 12-bit full scale
    (np.array([[0, 4096]], np.uint16), [0, 4096 / 65535]),            # 16-bit full scale
    (np.array([[-1000, 3000]], np.int32), [0, 1]),                    # negative (e.g. CT): min-max
    (np.array([[70000, 170000]], np.int32), [0, 1]),                  # 32-bit beyond 65535: min-max
    (np.array([[7, 7]], np.int32) * 100000, [0, 0]),                  # constant out of range: 0
    (np.array([[np.nan, 0.25, np.inf]], np.float32), [0, 0.25, 0]),   # non-finite: 0
])
def test_unit_range_rule(values, expected):
    np.testing.assert_allclose(unit_range(values)[0], expected, rtol=1e-6)


def test_partition_training_and_predict_decode_a_deep_file_identically(cli, tmp_path):
    """A csv dataset of 16-bit, 12-bit and float files: the tensors partition's summary and training
    load equal what predict decodes from the same file."""
    data = tmp_path / "data"
    data.mkdir()
    rows, rng = [], np.random.default_rng(0)
    for k in range(16):
        if k % 3 == 0:
            image = Image.fromarray(rng.integers(0, 65536, (20, 20)).astype(np.uint16))
        elif k % 3 == 1:
            image = Image.fromarray(rng.integers(0, 4096, (20, 20)).astype(np.uint16))
        else:
            image = Image.fromarray(rng.normal(0, 50, (20, 20)).astype(np.float32), "F")
        name = f"img_{k}.{'tif' if k % 3 == 2 else 'png'}"
        image.save(data / name)
        rows.append({"path": name, "label": k % 2})
    pd.DataFrame(rows).to_csv(data / "labels.csv", index=False)
    exp, before = tmp_path / "exp", file_bytes(data)
    args = ["partition", "--source", "csv", "--data-dir", data / "labels.csv", "--scheme", "iid", "--nodes", "2",
            "--folds", "2", "--image-size", "16", "--exp", exp]
    result = cli(*args)
    record_case(2, "16-bit, 12-bit and float files partition and decode alike", args, result,
                intact=file_bytes(data) == before)
    assert result.exit_code == 0, result.output + result.stderr
    manifest = Manifest.load(exp)
    assert manifest["channels"] == 1
    for node in manifest.node_names:
        records = manifest.records(node, "train")
        training = NodeDataset(manifest, node, "train").images
        predicted = torch.from_numpy(np.stack([decode(manifest, data / r["path"]) for r in records]))
        assert torch.equal(load_images(manifest, node, records), training)  # the summary grid's path
        assert torch.equal(training, predicted)
        assert (training == 255).float().mean() < 0.05 and training.float().std() > 20  # not clipped


@pytest.mark.parametrize("side", [12000, 30000])  # PIL only warns at 12000^2, raises at 30000^2
def test_a_decompression_bomb_is_refused_at_partition(cli, tmp_path, side):
    data = tmp_path / "data"
    for k in range(4):
        for cls in ("x", "y"):
            (data / "site" / cls).mkdir(parents=True, exist_ok=True)
            Image.new("L", (8, 8), 40 * k).save(data / "site" / cls / f"img_{k}.png")
    bomb_png(data / "site" / "x" / "huge.png", side)
    exp = tmp_path / "exp"
    args = ["partition", "--source", "folders", "--data-dir", data, "--image-size", "16", "--exp", exp]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PIL's DecompressionBombWarning must not leak either
        result = cli(*args)
    record_case(7, f"decompression bomb PNG ({side} x {side}) at partition", args, result,
                intact=not exp.exists())
    assert result.exit_code == 2, result.output + result.stderr
    line = result.stderr.strip()
    assert line.startswith("error: image ") and "huge.png" in line and "decompression bomb" in line
    assert "\n" not in line and "100,000,000" in line
    assert not exp.exists()


def test_an_image_under_the_pixel_limit_opens_without_pils_warning(tmp_path):
    bomb_png(tmp_path / "big.png", 9500)  # 90 M pixels: over PIL's warning threshold, under fedcli's limit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_images(tmp_path, ["big.png"]) == ([(tmp_path / "big.png").stat().st_size], 1)
    bomb_png(tmp_path / "huge.png", 10001)
    with pytest.raises(BadImageError, match="10001 x 10001"):
        check_images(tmp_path, ["huge.png"])


def test_medmnist_arrays_that_are_not_uint8_are_refused(cli, tmp_path):
    path = tmp_path / "deep.npz"
    np.savez(path, train_images=np.full((8, 4, 4), 1000, np.uint16), train_labels=np.zeros((8, 1), np.int64))
    exp = tmp_path / "exp"
    args = ["partition", "--source", "medmnist", "--data-dir", path, "--exp", exp]
    result = cli(*args)
    record_case(2, "MedMNIST npz with uint16 images (would wrap)", args, result, intact=not exp.exists())
    assert result.exit_code == 2 and "uint16" in result.stderr and "uint8" in result.stderr
    assert not exp.exists()
