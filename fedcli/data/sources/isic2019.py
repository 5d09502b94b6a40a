"""ISIC 2019 skin lesions: the official training images and the two official tables.

Node = source hospital, read from the `lesion_id` prefix (BCN_, HAM_, MSK4_); rows without a
lesion id have no known source and are dropped (and counted). Images of one lesion form a
group, so they never straddle train and test or two folds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedcli.core.errors import UserError
from fedcli.data.imagefiles import check_images, require_dir
from fedcli.data.records import Sample, SourceData

GROUND_TRUTH = "ISIC_2019_Training_GroundTruth.csv"
METADATA = "ISIC_2019_Training_Metadata.csv"
IMAGES = "ISIC_2019_Training_Input"
CLASSES = ["MEL", "NV", "BCC", "AK", "BKL", "DF", "VASC", "SCC"]


def find_table(root: Path, name: str) -> Path:
    direct = root / name
    if direct.is_file():
        return direct
    found = sorted(root.rglob(name))
    if not found:
        raise UserError(f"{name} not found under {root}; download the official ISIC 2019 tables there")
    return found[0]


def read_table(path: Path, required: list[str]) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not a readable CSV table ({exc})") from exc
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise UserError(f"{path} lacks column(s) {', '.join(missing)}; is it the official ISIC 2019 table?")
    return frame


def read(data_dir: Path, task: str) -> SourceData:
    root = require_dir(data_dir, "isic2019")
    truth = read_table(find_table(root, GROUND_TRUTH), ["image", *CLASSES])
    meta = read_table(find_table(root, METADATA), ["image", "lesion_id"])
    if not (root / IMAGES).is_dir():
        raise UserError(f"no {IMAGES}/ folder in {root}; unpack the official training images there")
    table = truth.merge(meta[["image", "lesion_id"]], on="image", how="left")
    dropped = {}
    has_lesion = table["lesion_id"].notna() & (table["lesion_id"].astype(str).str.strip() != "")
    dropped["no lesion_id"] = int((~has_lesion).sum())
    table = table[has_lesion]
    onehot = table[CLASSES].to_numpy(dtype=float)
    if task == "melanoma":
        labels = (onehot[:, 0] >= 0.5).astype(np.int64)
        label_names = ["other", "melanoma"]
    else:
        diagnosed = onehot.max(axis=1) >= 0.5
        dropped["no diagnosis among the 8 classes"] = int((~diagnosed).sum())
        table, onehot = table[diagnosed], onehot[diagnosed]
        labels = onehot.argmax(axis=1).astype(np.int64)
        label_names = list(CLASSES)
    rels = [f"{IMAGES}/{image}.jpg" for image in table["image"]]
    sizes, _, pixels = check_images(root, rels)
    samples = [
        Sample(id=str(image), label=int(label), site=str(lesion).split("_")[0].lower(), group=str(lesion),
               path=rel, nbytes=nbytes)
        for image, lesion, label, rel, nbytes in zip(table["image"], table["lesion_id"], labels, rels, sizes)
    ]
    return SourceData(
        name="isic2019",
        samples=samples,
        label_names=label_names,
        channels=3,
        root=root.resolve(),
        augment=("hflip", "rot90"),
        default_scheme="source",
        dropped=dropped,
        pixels=pixels,
    )
