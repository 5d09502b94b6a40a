"""--source retinopathy: Kaggle's DR layout, read as the generative-replay study does (grade 0 against 2-4,
grade 1 dropped, left eyes only), on files the test writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from fedcli.data.manifest import Manifest

# patient -> (left grade, right grade)
GRADES = {10: (0, 0), 13: (0, 2), 15: (1, 1), 16: (4, 0), 17: (2, 3), 19: (0, 1), 20: (3, 3), 21: (0, 4),
          22: (1, 0), 23: (2, 2), 25: (0, 0), 26: (4, 4)}


def make_retinopathy(root: Path, grades=GRADES, missing: str | None = None) -> Path:
    rng = np.random.default_rng(0)
    lines = ["image,level"]
    for patient, pair in grades.items():
        for eye, grade in zip(("left", "right"), pair):
            name = f"{patient}_{eye}"
            lines.append(f"{name},{grade}")
            if name != missing:
                (root / "train").mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(root / "train" / f"{name}.jpeg")
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
