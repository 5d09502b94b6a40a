"""--source retinopathy: Kaggle's DR layout, read as the generative-replay study does (grade 0 against 2-4,
grade 1 dropped, left eyes only, equal classes, Graham's preprocessing), on files the test writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from fedcli.data.graham import KEPT, graham
from fedcli.data.loading import load_images
from fedcli.data.manifest import Manifest
from fedcli.data.sources import retinopathy

# patient -> (left grade, right grade)
GRADES = {10: (0, 0), 13: (0, 2), 15: (1, 1), 16: (4, 0), 17: (2, 3), 19: (0, 1), 20: (3, 3), 21: (0, 4),
          22: (1, 0), 23: (2, 2), 25: (0, 0), 26: (4, 4)}


def make_retinopathy(root: Path, grades=GRADES, missing: str | None = None, picture=None) -> Path:
    """The competition's layout; `picture(rng)`: each image's pixels (default: 20 x 24 noise)."""
    rng = np.random.default_rng(0)
    picture = picture or (lambda rng: rng.integers(0, 256, (20, 24, 3), dtype=np.uint8))
    lines = ["image,level"]
    for patient, pair in grades.items():
        for eye, grade in zip(("left", "right"), pair):
            name = f"{patient}_{eye}"
            lines.append(f"{name},{grade}")
            if name != missing:
                (root / "train").mkdir(parents=True, exist_ok=True)
                Image.fromarray(picture(rng)).save(root / "train" / f"{name}.jpeg")
    (root / "trainLabels.csv").write_text("\n".join(lines) + "\n")
    return root


def test_left_eyes_of_grade_0_and_2_to_4_become_a_binary_task_and_the_drops_are_counted(cli, tmp_path):
    data = make_retinopathy(tmp_path / "dr")
    out = cli.ok("partition", "--source", "retinopathy", "--data-dir", data, "--nodes", "2", "--folds", "2",
                 "--image-size", "16", "--exp", tmp_path / "e").stdout
    manifest = Manifest.load(tmp_path / "e")
    records = {r["id"]: r for node in manifest["nodes"] for split in ("train", "test") for r in node[split]}
    kept = {f"{p}_left": int(left >= 2) for p, (left, _) in GRADES.items() if left != 1}
    assert {k: r["label"] for k, r in records.items()} == kept
    assert manifest["label_names"] == ["normal", "referable"] and manifest["channels"] == 3
    assert manifest["dropped"] == {"grade 1 (the study's binary task leaves it out)": 2,
                                   "right eye (the study keeps left eyes)": 12}
    assert "dropped 12 images with right eye" in " ".join(out.split())


def test_broken_labels_and_missing_images_are_one_line_each(cli, tmp_path):
    missing = make_retinopathy(tmp_path / "a", missing="16_left")
    assert "lists 16_left, but no 16_left.jpeg" in cli.user_error(
        "partition", "--source", "retinopathy", "--data-dir", missing, "--exp", tmp_path / "e1")
    bad = make_retinopathy(tmp_path / "b")
    (bad / "trainLabels.csv").write_text("image,level\n10_left,7\n")
    assert "line 2: '10_left', '7' is not PATIENT_left|right with a grade 0-4" in cli.user_error(
        "partition", "--source", "retinopathy", "--data-dir", bad, "--exp", tmp_path / "e2")
    (bad / "trainLabels.csv").write_text("name,grade\n10_left,0\n")
    assert "it needs image and level" in cli.user_error(
        "partition", "--source", "retinopathy", "--data-dir", bad, "--exp", tmp_path / "e3")
    (bad / "trainLabels.csv").unlink()
    assert "no trainLabels.csv under" in cli.user_error(
        "partition", "--source", "retinopathy", "--data-dir", bad, "--exp", tmp_path / "e4")
    assert not any((tmp_path / f"e{i}").exists() for i in range(1, 5))


def a_table(normal: int, referable: int, mild: int) -> dict[int, tuple[int, int]]:
    """Patients whose left eyes have these many grades 0, 2-4 and 1 (right eyes of every grade)."""
    left = [0] * normal + [2, 3, 4] * (referable // 3) + [2] * (referable % 3) + [1] * mild
    return {100 + i: (grade, i % 5) for i, grade in enumerate(left)}


def test_the_study_selection_keeps_equal_classes_of_left_eyes_drawn_the_same_for_every_seed(cli, tmp_path):
    table = a_table(normal=30, referable=13, mild=5)
    data = make_retinopathy(tmp_path / "dr", table)
    out = cli.ok("partition", "--source", "retinopathy", "--data-dir", data, "--retina-balanced",
                 "--retina-per-class", "8", "--nodes", "2", "--folds", "2", "--image-size", "16",
                 "--exp", tmp_path / "e").stdout
    manifest = Manifest.load(tmp_path / "e")
    records = [r for node in manifest["nodes"] for split in ("train", "test") for r in node[split]]
    assert sorted(r["label"] for r in records) == [0] * 8 + [1] * 8
    assert {r["id"] for r in records} <= {f"{p}_left" for p, (left, _) in table.items() if left != 1}
    assert manifest["dropped"] == {"grade 1 (the study's binary task leaves it out)": 5,
                                   "right eye (the study keeps left eyes)": 48,
                                   "no place in the equal classes (8 of each, the study's selection)": 30 + 13 - 16}
    assert "dropped 27 images with no place in the equal classes" in " ".join(out.split())
    chosen = {s.id for s in retinopathy.read(data, 8).samples}
    assert chosen == {r["id"] for r in records}
    cli.ok("partition", "--source", "retinopathy", "--data-dir", data, "--retina-balanced", "--retina-per-class", "8",
           "--nodes", "2", "--folds", "2", "--image-size", "16", "--seed", "1", "--exp", tmp_path / "e1")
    assert {r["id"] for node in Manifest.load(tmp_path / "e1")["nodes"] for split in ("train", "test")
            for r in node[split]} == chosen  # the partition's seed splits the pool, it does not redraw it
    assert {s.id for s in retinopathy.read(data, 5).samples} < chosen  # a smaller count, a subset


def test_asking_for_more_images_of_a_class_than_the_data_holds_is_one_line_with_the_counts(cli, tmp_path):
    data = make_retinopathy(tmp_path / "dr", a_table(normal=30, referable=13, mild=5))
    message = cli.user_error("partition", "--source", "retinopathy", "--data-dir", data, "--retina-balanced",
                             "--retina-per-class", "14", "--exp", tmp_path / "e1")
    assert "--retina-per-class 14" in message and "30 normal (grade 0) and 13 referable (grades 2-4)" in message
    assert "lower --retina-per-class to 13 or less" in message
    assert "the count of --retina-balanced's selection" in cli.user_error(
        "partition", "--source", "retinopathy", "--data-dir", data, "--retina-per-class", "8", "--exp", tmp_path / "e2")
    assert "--retina-preprocess applies to --source retinopathy only" in cli.user_error(
        "partition", "--source", "digits", "--retina-preprocess", "graham", "--exp", tmp_path / "e3")
    assert not any((tmp_path / f"e{i}").exists() for i in range(1, 4))


def fundus(height: int, width: int, radius: float, colour=(180, 90, 40)) -> np.ndarray:
    """A disc of one colour on black, centred in the frame (where Graham's code looks for the eye)."""
    rows, cols = np.mgrid[:height, :width] + 0.5
    image = np.zeros((height, width, 3), dtype=np.uint8)
    image[(rows - height / 2) ** 2 + (cols - width / 2) ** 2 < radius ** 2] = colour
    return image


def test_graham_puts_an_even_eye_and_its_background_at_mid_grey_whatever_its_size_and_keeps_a_lesion():
    small, large = fundus(160, 200, 60, colour=(90, 45, 20)), fundus(400, 500, 150)
    for image in small, large:
        out = graham(image).astype(int)
        side = out.shape[0]
        centre = np.arange(side) + 0.5 - side / 2
        outside = centre[:, None] ** 2 + centre[None, :] ** 2 > (side / 2) ** 2
        assert out.shape == (side, side, 3) and side == 2 * round(KEPT * 300)
        assert (out[outside] == 128).all()  # the rim's bright ring and the frame's black are masked out
        assert np.abs(out[~outside] - 128).max() <= 2  # the local average colour subtracted: no colour left
    lesion = large.copy()
    lesion[190:210, 240:260] = 0  # a dark spot in the eye's middle
    out = graham(lesion).astype(int)
    assert (out[270, 270] < 128 - 5).all() and np.abs(out[270, 150] - 128).max() <= 2  # kept, and local


def test_graham_is_applied_whenever_a_partition_made_with_it_is_read_and_changes_its_hash(cli, tmp_path):
    data = make_retinopathy(tmp_path / "dr", picture=lambda rng: fundus(120, 150, 50))
    args = ["partition", "--source", "retinopathy", "--data-dir", data, "--nodes", "2", "--folds", "2",
            "--image-size", "32"]
    cli.ok(*args, "--exp", tmp_path / "plain")
    cli.ok(*args, "--retina-preprocess", "graham", "--exp", tmp_path / "graham")
    plain, prepared = Manifest.load(tmp_path / "plain"), Manifest.load(tmp_path / "graham")
    assert prepared["preprocess"] == "graham" and "preprocess" not in plain.data
    assert prepared.content_hash != plain.content_hash  # every later stage's fingerprint follows the pixels
    records = plain.records("node0", "train")
    before, after = (load_images(m, "node0", records).float() for m in (plain, prepared))
    colour = torch.tensor([180.0, 90.0, 40.0])
    assert (before[:, :, 16, 16] - colour).abs().max() <= 12  # without Graham: the disc's own colour
    assert (after[:, :, 16, 16] - 128).abs().max() <= 12 and (after[:, :, 0, 0] == 128).all()  # with it: mid-grey
