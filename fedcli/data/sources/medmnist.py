"""A MedMNIST `.npz` file (train/val/test arrays); all splits are pooled, then re-partitioned."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedcli.core.errors import UserError
from fedcli.data.records import Sample, SourceData

SPLITS = ("train", "val", "test")
# Label names of MedMNIST v2's single-label 2D sets used with fedcli; others are numbered.
LABEL_NAMES = {
    "pneumoniamnist": ["normal", "pneumonia"],
    "breastmnist": ["malignant", "normal or benign"],
    "dermamnist": ["actinic keratosis", "basal cell carcinoma", "benign keratosis", "dermatofibroma",
                   "melanoma", "melanocytic nevus", "vascular lesion"],
}


def find_npz(data_dir: Path) -> Path:
    path = Path(data_dir)
    if path.is_file():
        if path.suffix != ".npz":
            raise UserError(f"{path} is not a MedMNIST .npz file")
        return path
    if not path.is_dir():
        raise UserError(f"data path {path} does not exist; point --data-dir at a MedMNIST .npz file")
    found = sorted(path.glob("*.npz"))
    if len(found) != 1:
        what = "no .npz file" if not found else f"{len(found)} .npz files ({', '.join(p.name for p in found)})"
        raise UserError(f"{path} holds {what}; point --data-dir at one MedMNIST .npz file")
    return found[0]


def load_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Pooled images (N, H, W[, 3]) uint8 and labels (N,), in train, val, test order."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            present = [s for s in SPLITS if f"{s}_images" in npz and f"{s}_labels" in npz]
            if not present:
                raise UserError(f"{path} has no train_images/train_labels arrays; is it a MedMNIST file?")
            images = np.concatenate([npz[f"{s}_images"] for s in present])
            labels = np.concatenate([npz[f"{s}_labels"].reshape(len(npz[f"{s}_labels"]), -1) for s in present])
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} is not a readable .npz file ({exc})") from exc
    if labels.shape[1] != 1:
        raise UserError(f"{path} is multi-label ({labels.shape[1]} labels per image); fedcli needs one label")
    if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] != 3):
        raise UserError(f"{path}: images of shape {images.shape[1:]} are neither grayscale nor RGB")
    if images.dtype != np.uint8:  # a cast would wrap 16-bit or float pixels silently
        raise UserError(f"{path}: images are {images.dtype}, MedMNIST files hold uint8; save them as uint8 "
                        "or as image files for --source folders or csv")
    return images, labels[:, 0].astype(np.int64)


def read(data_dir: Path) -> SourceData:
    path = find_npz(data_dir)
    images, labels = load_arrays(path)
    if len(labels) == 0:
        raise UserError(f"{path} holds no images")
    with np.load(path, allow_pickle=False) as npz:
        counts = [len(npz[f"{s}_labels"]) for s in SPLITS if f"{s}_labels" in npz]
        names = [s for s in SPLITS if f"{s}_labels" in npz]
    ids = [f"{split}-{i:05d}" for split, count in zip(names, counts) for i in range(count)]
    stem = path.stem.split("_")[0].lower()
    n_classes = int(labels.max()) + 1
    label_names = LABEL_NAMES.get(stem, [str(c) for c in range(n_classes)])
    if len(label_names) < n_classes:
        label_names = [str(c) for c in range(n_classes)]
    samples = [Sample(id=i, label=int(y), site=stem, index=k) for k, (i, y) in enumerate(zip(ids, labels))]
    return SourceData(
        name="medmnist",
        samples=samples,
        label_names=label_names,
        channels=1 if images.ndim == 3 else 3,
        root=path.parent.resolve(),
        data_file=path.name,
        augment=("hflip",),
        default_scheme="iid",
    )
