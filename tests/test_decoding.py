"""One decoder for partition, training and predict: deep images scaled, not clipped, on one scale per
dataset; 8-bit files as they always were; bombs refused."""

from __future__ import annotations

import json
import struct
import warnings
import zlib

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from conftest import one_clean_line, record_case
from fedcli.core.errors import UserError
from fedcli.data.dataset import NodeDataset
from fedcli.data.imagefiles import BadImageError, decode_image, open_image
from fedcli.data.loading import load_images
from fedcli.data.manifest import Manifest, content_hash, manifest_path
from fedcli.data.pixelscale import Scale, automatic, deep_pixels
from fedcli.experiment.artifacts import write_json
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
    image = decode_image(tmp_path / f"ramp{suffix}", 48, 1, Scale(bit_depth=16))
    assert image.dtype == np.uint8 and image.shape == (1, 48, 48)
    assert image.min() == 0 and image.max() == 255 and monotone(image)
    assert len(np.unique(image)) == 256 and (image == 255).mean() < 0.01


def test_12_bit_data_in_16_bits_is_not_crushed_to_16_levels(tmp_path):
    Image.fromarray(RAMP12).save(tmp_path / "ramp12.png")
    image = decode_image(tmp_path / "ramp12.png", 48, 1, Scale(bit_depth=12))
    assert image.min() == 0 and image.max() == 255 and monotone(image)
    assert len(np.unique(image)) >= 200
    rgb = decode_image(tmp_path / "ramp12.png", 24, 3, Scale(bit_depth=12))  # resized as floats, channels replicated
    assert rgb.shape == (3, 24, 24) and (rgb[0] == rgb[1]).all() and (rgb[1] == rgb[2]).all()
    assert len(np.unique(rgb)) > 100 and rgb.max() > 240


@pytest.mark.parametrize("values, expected", [
    (np.full((8, 8), 0.5, np.float32), 128),                                 # within [0, 1]: as it is
    (np.linspace(-3, 7, 64, dtype=np.float32).reshape(8, 8), None),         # elsewhere: the data's range
])
def test_float_tiffs_are_scaled_once(tmp_path, values, expected):
    Image.fromarray(values, "F").save(tmp_path / "f.tif")
    image = decode_image(tmp_path / "f.tif", 8, 1, automatic([deep_pixels(values)]))
    if expected is not None:
        assert (image == expected).all()
    else:
        assert image.min() == 0 and image.max() == 255 and monotone(image)


@pytest.mark.parametrize("values, expected", [
    (np.array([[0, 255]], np.uint16), [0, 1]),                        # 8 bits hold it: full scale 255
    (np.array([[0, 4095]], np.uint16), [0, 1]),                       # 12-bit full scale
    (np.array([[0, 4096]], np.uint16), [0, 4096 / 16383]),            # 14-bit full scale
    (np.array([[0, 16384]], np.uint16), [0, 16384 / 65535]),          # 16-bit full scale
    (np.array([[-1000, 3000]], np.int32), [0, 1]),                    # negative (e.g. CT): the data's range
    (np.array([[70000, 170000]], np.int32), [0, 1]),                  # 32-bit beyond 65535: the data's range
    (np.array([[7, 7]], np.int32) * 100000, [0, 0]),                  # constant out of range: 0
    (np.array([[np.nan, 0.25, np.inf]], np.float32), [0, 0.25, 0]),   # float in [0, 1]: as it is; non-finite: 0
])
def test_the_automatic_scale_of_a_one_file_dataset(values, expected):
    np.testing.assert_allclose(automatic([deep_pixels(values)]).unit(values)[0], expected, rtol=1e-6)


def test_partition_training_and_predict_decode_a_deep_file_identically(cli, tmp_path):
    """A csv dataset of 16-bit, 12-bit and float files: the tensors partition's summary and training
    load equal what predict decodes from the same file."""
    data = tmp_path / "data"
    data.mkdir()
    rows, rng = [], np.random.default_rng(0)
    for k in range(16):
        image = Image.fromarray(rng.integers(0, 65536 if k % 2 else 4096, (20, 20)).astype(np.uint16))
        name = f"img_{k}.{'tif' if k % 4 == 1 else 'png'}"
        image.save(data / name)
        rows.append({"path": name, "label": k % 2})
    pd.DataFrame(rows).to_csv(data / "labels.csv", index=False)
    exp, before = tmp_path / "exp", file_bytes(data)
    args = ["partition", "--source", "csv", "--data-dir", data / "labels.csv", "--scheme", "iid", "--nodes", "2",
            "--folds", "2", "--image-size", "16", "--exp", exp]
    result = cli(*args)
    record_case(2, "16-bit and 12-bit files partition and decode alike", args, result,
                intact=file_bytes(data) == before)
    assert result.exit_code == 0, result.output + result.stderr
    manifest = Manifest.load(exp)
    assert manifest["channels"] == 1 and manifest["bit_depth"] == 16
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
        with open_image(tmp_path / "big.png") as image:
            assert image.size == (9500, 9500)
    bomb_png(tmp_path / "huge.png", 10001)
    with pytest.raises(BadImageError, match="10001 x 10001"):
        with open_image(tmp_path / "huge.png"):
            pass


def test_medmnist_arrays_that_are_not_uint8_are_refused(cli, tmp_path):
    path = tmp_path / "deep.npz"
    np.savez(path, train_images=np.full((8, 4, 4), 1000, np.uint16), train_labels=np.zeros((8, 1), np.int64))
    exp = tmp_path / "exp"
    args = ["partition", "--source", "medmnist", "--data-dir", path, "--exp", exp]
    result = cli(*args)
    record_case(2, "MedMNIST npz with uint16 images (would wrap)", args, result, intact=not exp.exists())
    assert result.exit_code == 2 and "uint16" in result.stderr and "uint8" in result.stderr
    assert not exp.exists()


def csv_dataset(folder, images: dict) -> object:
    """labels.csv over the given {file name: PIL image}, two classes alternating."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, image in images.items():
        image.save(folder / name)
    pd.DataFrame({"path": list(images), "label": [k % 2 for k in range(len(images))]}).to_csv(
        folder / "labels.csv", index=False)
    return folder / "labels.csv"


def partition_args(table, exp, *options) -> list:
    return ["partition", "--source", "csv", "--data-dir", table, "--scheme", "iid", "--nodes", "2", "--folds", "2",
            "--image-size", "16", "--exp", exp, *options]


def partition(cli, table, exp, *options):
    return cli(*partition_args(table, exp, *options))


def decoded_by_path(manifest: Manifest) -> dict:
    """Every record's training pixels, by file."""
    out = {}
    for node in manifest.node_names:
        for split in ("train", "test"):
            records = manifest.records(node, split)
            for record, image in zip(records, load_images(manifest, node, records)):
                out[record["path"]] = image.numpy()
    return out


def test_a_14_bit_dataset_keeps_the_brightness_order_of_its_raw_values(cli, tmp_path):
    """Scaled per image, raw maximum 3000 decoded brighter (187) than raw maximum 16000 (62)."""
    images = {f"img_{k}.png": Image.fromarray(np.full((16, 16), 3000 if k < 8 else 16000, np.uint16))
              for k in range(16)}
    table, exp = csv_dataset(tmp_path / "data", images), tmp_path / "exp"
    result = partition(cli, table, exp)
    assert result.exit_code == 0, result.output + result.stderr
    manifest = Manifest.load(exp)
    dark, bright = round(3000 / 16383 * 255), round(16000 / 16383 * 255)
    for name, image in decoded_by_path(manifest).items():
        assert (image == (dark if int(name[4:-4]) < 8 else bright)).all()
        np.testing.assert_array_equal(decode(manifest, tmp_path / "data" / name), image)  # predict agrees
    assert manifest["bit_depth"] == 14 and "14-bit (0..16,383)" in result.output


def test_8_bit_files_decode_as_pil_converts_and_resizes_them(cli, tmp_path):
    """The decoder before the per-dataset scale, written out: every 8-bit mode gives the same bytes."""
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (20, 20), dtype=np.uint8)
    sources = {"l.png": Image.fromarray(gray), "rgb.png": Image.fromarray(rgb),
               "rgba.png": Image.fromarray(rgb).convert("RGBA"), "p.png": Image.fromarray(rgb).convert("P"),
               "la.png": Image.fromarray(gray).convert("LA"),
               "one.png": Image.fromarray(gray).convert("1"), "rgb.jpg": Image.fromarray(rgb),
               "l.jpg": Image.fromarray(gray), "rgb.bmp": Image.fromarray(rgb), "l.tif": Image.fromarray(gray)}
    images = {f"{k}_{name}": image for k in range(2) for name, image in sources.items()}
    table = csv_dataset(tmp_path / "data", images)
    for channels, mode in ((1, "L"), (3, "RGB")):
        exp = tmp_path / f"exp{channels}"
        result = partition(cli, table, exp, "--channels", channels)
        assert result.exit_code == 0, result.output + result.stderr
        for name, image in decoded_by_path(Manifest.load(exp)).items():
            with Image.open(tmp_path / "data" / name) as file:
                expected = np.asarray(file.convert(mode).resize((16, 16), Image.Resampling.BILINEAR, reducing_gap=3.0))
            np.testing.assert_array_equal(image, expected[None] if channels == 1 else expected.transpose(2, 0, 1))


@pytest.mark.parametrize("second, options, expected", [
    (Image.new("L", (16, 16), 9), [], ["mixes 8-bit images", "img_1.png", "img_0.png", "--bit-depth N"]),
    (Image.fromarray(np.full((16, 16), 0.5, np.float32), "F"), [], ["mixes integer images", "float ones"]),
    (Image.fromarray(np.full((16, 16), 900, np.uint16)), ["--bit-depth", "10"],
     ["img_0.png holds values 5000..5000, outside the 10-bit range 0..1,023", "larger --bit-depth"]),
])
def test_data_without_one_consistent_scale_is_refused(cli, tmp_path, second, options, expected):
    """Deep files beside 8-bit ones (auto), integer beside float, or values over the depth given."""
    images = {f"img_{k}.{'tif' if second.mode == 'F' and k % 2 else 'png'}":
              second if k % 2 else Image.fromarray(np.full((16, 16), 5000, np.uint16)) for k in range(8)}
    table, exp = csv_dataset(tmp_path / "data", images), tmp_path / "exp"
    args = partition_args(table, exp, *options)
    result = cli(*args)
    record_case(9, f"no consistent pixel scale: {expected[0]}", args, result, not exp.exists())
    assert result.exit_code == 2 and one_clean_line(result), result.output + result.stderr
    assert all(part in result.stderr for part in expected), result.stderr
    assert not exp.exists()


def test_a_stated_depth_scales_deep_files_and_leaves_8_bit_ones_as_they_are(cli, tmp_path):
    images = {f"img_{k}.png": Image.new("L", (16, 16), 51) if k % 2 else
              Image.fromarray(np.full((16, 16), 13107, np.uint16)) for k in range(16)}
    table, exp = csv_dataset(tmp_path / "data", images), tmp_path / "exp"
    assert partition(cli, table, exp, "--bit-depth", "16").exit_code == 0
    assert {int(image.max()) for image in decoded_by_path(Manifest.load(exp)).values()} == {51}  # 13107 / 65535


def test_a_manifest_without_a_scale_decodes_8_bit_files_and_refuses_deeper_ones(cli, tmp_path):
    """Manifests written before the per-dataset scale still load; their deep files were scaled per image."""
    def without_scale(exp):
        data = json.loads(manifest_path(exp).read_text())
        del data["bit_depth"], data["value_range"]
        data["content_hash"] = content_hash(data)
        write_json(manifest_path(exp), data)
        return Manifest.load(exp)

    eight = {f"img_{k}.png": Image.new("L", (16, 16), 10 * k) for k in range(16)}
    table = csv_dataset(tmp_path / "eight", eight)
    assert partition(cli, table, tmp_path / "exp8").exit_code == 0
    now, before = decoded_by_path(Manifest.load(tmp_path / "exp8")), decoded_by_path(without_scale(tmp_path / "exp8"))
    assert now.keys() == before.keys() and all(np.array_equal(now[name], before[name]) for name in now)
    deep = {f"img_{k}.png": Image.fromarray(np.full((16, 16), 1000 * k, np.uint16)) for k in range(16)}
    table = csv_dataset(tmp_path / "deep", deep)
    assert partition(cli, table, tmp_path / "exp16").exit_code == 0
    with pytest.raises(UserError, match="written before fedcli kept one pixel scale.*re-run fedcli partition"):
        decoded_by_path(without_scale(tmp_path / "exp16"))


@pytest.mark.parametrize("value", ["9", "twelve", "12.5"])
def test_bit_depth_must_be_auto_or_a_listed_depth(cli, tmp_path, value):
    line = cli.user_error("partition", "--bit-depth", value, "--exp", tmp_path / "exp")
    assert line.startswith("error: --bit-depth must be auto or one of 8, 10, 12, 14, 16")
