"""Kaggle Diabetic Retinopathy Detection (EyePACS) in its competition layout, read as the generative-replay
study (Qu et al. 2022) uses it.

`trainLabels.csv` (columns `image,level`) names each fundus photograph `{patient}_{left|right}` with its
grade 0-4; the images are `{patient}_{left|right}.jpeg`, found anywhere under the data folder (the
archive's `train/`). The study's binary task: grade 0 (no DR) against grades 2-4 (referable DR), grade 1
dropped, left eyes only, so every patient gives one image. What is dropped is counted.

The study then "randomly selected" 6000 images of each class (3000 training, 1500 validation, 1500 test);
`per_class` keeps that many of each class as one pool, which the partition splits into nodes, test sets and
folds. Each image's rank is a keyed hash of its name, not a draw from the partition's seed: every --seed and
--ks of a sweep federates the same images, the CSV's row order does not matter, and a smaller count keeps a
subset of a larger one's images.
"""

from __future__ import annotations

import re
from pathlib import Path

from fedcli.core.errors import UserError
from fedcli.core.rng import stream_seed
from fedcli.data.imagefiles import check_images, is_image_file, require_dir
from fedcli.data.records import Sample, SourceData

LABELS = "trainLabels.csv"
IMAGE = re.compile(r"^(\d+)_(left|right)$")
GRADES = range(5)
CLASSES = ("normal (grade 0)", "referable (grades 2-4)")


def labels_file(root: Path) -> Path:
    found = sorted(root.rglob(LABELS))
    if len(found) != 1:
        raise UserError(f"{'no' if not found else 'more than one'} {LABELS} under {root}; --source retinopathy reads "
                        "the Kaggle competition's labels file (columns image,level) beside its train/ images")
    return found[0]


def read_rows(path: Path) -> list[tuple[str, int]]:
    import pandas as pd

    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as exc:
        raise UserError(f"{path} is not a readable CSV ({exc}); restore the competition's {LABELS}") from None
    if not {"image", "level"} <= set(table.columns):
        raise UserError(f"{path} has columns {', '.join(table.columns)}; it needs image and level (the competition's "
                        f"{LABELS})")
    rows = []
    for line, (image, level) in enumerate(zip(table["image"], table["level"]), start=2):
        if not IMAGE.match(image) or not level.isdigit() or int(level) not in GRADES:
            raise UserError(f"{path} line {line}: {image!r}, {level!r} is not PATIENT_left|right with a grade 0-4; "
                            f"restore the competition's {LABELS}")
        rows.append((image, int(level)))
    return rows


def rank(image: str) -> int:
    """An image's place in the selection: a keyed hash of its name (the module's docstring says why)."""
    return stream_seed(0, "retinopathy-select", image)


def balanced(kept: list[tuple[str, int]], per_class: int, root: Path) -> list[tuple[str, int]]:
    """The `per_class` lowest-ranked images of each class, in `kept`'s order."""
    classes = [[image for image, level in kept if int(level >= 2) == label] for label in (0, 1)]
    if min(map(len, classes)) < per_class:
        have = " and ".join(f"{len(images)} {name}" for images, name in zip(classes, CLASSES))
        raise UserError(f"--retina-per-class {per_class}: {root} has {have} left-eye images; lower "
                        f"--retina-per-class to {min(map(len, classes))} or less")
    chosen = {image for images in classes for image in sorted(images, key=rank)[:per_class]}
    return [row for row in kept if row[0] in chosen]


def read(data_dir: Path, per_class: int | None = None) -> SourceData:
    """The study's binary task; `per_class`: that many images of each class (None: every one)."""
    root = require_dir(data_dir, "retinopathy")
    rows = read_rows(labels_file(root))
    files = {path.stem: path for path in sorted(root.rglob("*")) if is_image_file(path) and IMAGE.match(path.stem)}
    dropped = {"grade 1 (the study's binary task leaves it out)": 0, "right eye (the study keeps left eyes)": 0}
    kept = []
    for image, level in rows:
        eye = IMAGE.match(image).group(2)
        if eye == "right":
            dropped["right eye (the study keeps left eyes)"] += 1
        elif level == 1:
            dropped["grade 1 (the study's binary task leaves it out)"] += 1
        elif image not in files:
            raise UserError(f"{LABELS} lists {image}, but no {image}.jpeg is under {root}; restore it or unpack the "
                            "whole train archive")
        else:
            kept.append((image, level))
    if not kept:
        raise UserError(f"{LABELS} under {root} lists no left-eye image of grade 0 or 2-4; check the data folder")
    if per_class is not None:
        selected = balanced(kept, per_class, root)
        reason = f"no place in the equal classes ({per_class} of each, the study's selection)"
        dropped[reason] = len(kept) - len(selected)
        kept = selected
    rels = [str(files[image].relative_to(root)) for image, _ in kept]
    sizes, _, pixels = check_images(root, rels)
    samples = [Sample(id=image, label=int(level >= 2), site="eyepacs", group=IMAGE.match(image).group(1), path=rel,
                      nbytes=nbytes) for (image, level), rel, nbytes in zip(kept, rels, sizes)]
    return SourceData(name="retinopathy", samples=samples, label_names=["normal", "referable"], channels=3,
                      root=root.resolve(), augment=("hflip",), default_scheme="iid", dropped=dropped, pixels=pixels)
