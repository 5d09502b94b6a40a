"""Data folders that lie (issue 31, points 4, 5, 8 and 12): one file under two names, linked folders,
truncated files, EXIF orientation, multi-page TIFFs. Each case is recorded for the closing note's table."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from conftest import make_folders, one_clean_line, record_case, write_png
from fedcli.data.dataset import NodeDataset
from fedcli.data.manifest import Manifest


def partition_args(source: str, data, exp) -> list:
    return ["partition", "--source", source, "--data-dir", data, "--exp", exp, "--folds", "2", "--image-size", "16"]


def refused(cli, point: int, case: str, source: str, data, exp) -> str:
    """Partition's one error line for a hostile data folder (recorded for the note), having written nothing."""
    args = partition_args(source, data, exp)
    result = cli(*args)
    record_case(point, case, args, result, intact=not exp.exists())
    assert result.exit_code == 2 and one_clean_line(result), result.output + result.stderr
    assert not exp.exists()
    return result.stderr.strip()


@pytest.mark.parametrize("second_name", ["./a/0.png", "link.png"])
def test_a_csv_naming_one_file_twice_is_refused_naming_both_rows(cli, tmp_path, second_name):
    """`a/0.png` and `./a/0.png` (or a link to it) are one image: the text-based check let it sit on two nodes."""
    data = tmp_path / "data"
    rows = [(f"a/{i}.png", "xy"[i % 2], "s0" if i < 12 else "s1") for i in range(24)]
    for i, (path, _, _) in enumerate(rows):
        write_png(data / path, i)
    if second_name == "link.png":
        (data / "link.png").symlink_to(data / "a" / "0.png")
    rows.append((second_name, "x", "s1"))
    (data / "labels.csv").write_text("path,label,node\n" + "".join(f"{p},{c},{n}\n" for p, c, n in rows))
    exp = tmp_path / "exp"
    line = refused(cli, 4, f"a csv naming a/0.png and {second_name}", "csv", data, exp)
    assert "rows 2 (a/0.png) and 26" in line and second_name in line and "same file" in line


def test_a_folder_linked_inside_a_class_folder_is_read_like_a_linked_file(tmp_path, cli):
    data = make_folders(tmp_path / "data", {"a": {"x": 6, "y": 6}, "b": {"x": 6, "y": 6}})
    batch = tmp_path / "second_batch"
    for k in range(3):
        write_png(batch / f"late_{k}.png", 100 + k)
    (data / "a" / "x" / "batch2").symlink_to(batch, target_is_directory=True)
    exp = tmp_path / "exp"
    cli.ok(*partition_args("folders", data, exp))
    manifest = Manifest.load(exp)
    paths = {r["path"] for n in manifest.node_names for s in ("train", "test") for r in manifest.records(n, s)}
    assert len(paths) == 27 and {f"a/x/batch2/late_{k}.png" for k in range(3)} <= paths


def test_a_folder_link_loop_is_refused(cli, tmp_path):
    data = make_folders(tmp_path / "data", {"a": {"x": 6, "y": 6}, "b": {"x": 6, "y": 6}})
    (data / "a" / "x" / "loop").symlink_to(data / "a" / "x", target_is_directory=True)
    exp = tmp_path / "exp"
    line = refused(cli, 5, "a class folder holding a link to itself", "folders", data, exp)
    assert "same folder" in line and "loop" in line and "remove the link" in line


def test_a_truncated_jpeg_is_refused_at_partition(cli, tmp_path):
    """PIL's verify() does not decode a JPEG, so a cut file once passed partition and failed in train-gan."""
    data = tmp_path / "data"
    rng = np.random.default_rng(0)
    for site in ("a", "b"):
        for cls in ("x", "y"):
            for k in range(6):
                (data / site / cls).mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(data / site / cls / f"{k}.jpg")
    cut = data / "b" / "y" / "5.jpg"  # not among the summary figure's examples, which partition decodes
    cut.write_bytes(cut.read_bytes()[: os.path.getsize(cut) // 2])
    exp = tmp_path / "exp"
    line = refused(cli, 8, "a JPEG cut in half", "folders", data, exp)
    assert str(cut) in line and "truncated" in line


def test_exif_orientation_is_applied(cli, tmp_path):
    """A camera's portrait photo is stored sideways with an orientation tag; training saw it sideways."""
    data = make_folders(tmp_path / "data", {"a": {"x": 6, "y": 6}, "b": {"x": 6, "y": 6}})
    upright = np.zeros((16, 16), np.uint8)
    upright[:4] = 255  # a bright top edge
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: turn 90 degrees clockwise to display
    Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90).save(data / "a" / "x" / "img_0.png", exif=exif)
    exp = tmp_path / "exp"
    cli.ok(*partition_args("folders", data, exp))
    manifest = Manifest.load(exp)
    split = next(s for s in ("train", "test") if any(r["path"] == "a/x/img_0.png" for r in manifest.records("a", s)))
    dataset = NodeDataset(manifest, "a", split)
    index = next(i for i, r in enumerate(dataset.records) if r["path"] == "a/x/img_0.png")
    np.testing.assert_array_equal(dataset.images[index, 0].numpy(), upright)


def test_a_multi_page_tiff_is_refused_naming_its_pages(cli, tmp_path):
    data = make_folders(tmp_path / "data", {"a": {"x": 6, "y": 6}, "b": {"x": 6, "y": 6}})
    stack = data / "b" / "x" / "stack.tif"
    pages = [Image.new("L", (16, 16), 40 * k) for k in range(3)]
    pages[0].save(stack, save_all=True, append_images=pages[1:])
    exp = tmp_path / "exp"
    line = refused(cli, 12, "a 3-page TIFF among the images", "folders", data, exp)
    assert str(stack) in line and "3 pages" in line and "its own file" in line
