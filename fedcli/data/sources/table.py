"""A CSV table with columns `path,label[,node][,group]`; `group` (e.g. a patient id) keeps a
patient's images on one side of every split. Paths are relative to the table's folder."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedcli.core.errors import UserError
from fedcli.data.imagefiles import check_images
from fedcli.data.records import Sample, SourceData

DEFAULT_NAME = "labels.csv"


def find_table(data_dir: Path) -> Path:
    path = Path(data_dir)
    if path.is_dir():
        path = path / DEFAULT_NAME
        if not path.is_file():
            raise UserError(f"no {DEFAULT_NAME} in {data_dir}; point --data-dir at the CSV table")
    elif not path.is_file():
        raise UserError(f"CSV table {path} does not exist; check --data-dir")
    return path


def label_order(values: list[str]) -> list[str]:
    """Class names sorted numerically when they are all integers, else alphabetically."""
    try:
        return [str(v) for v in sorted({int(v) for v in values})]
    except ValueError:
        return sorted(set(values))


def read(data_dir: Path) -> SourceData:
    path = find_table(data_dir)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not a readable CSV table ({exc})") from exc
    missing = [c for c in ("path", "label") if c not in frame.columns]
    if missing:
        raise UserError(f"{path} lacks column(s) {', '.join(missing)}; found: {', '.join(frame.columns)}")
    if frame.empty:
        raise UserError(f"{path} has no rows")
    blank = frame.index[(frame["path"].str.strip() == "") | (frame["label"].str.strip() == "")]
    if len(blank):
        raise UserError(f"{path}: row {int(blank[0]) + 2} has an empty path or label; fill or remove it")
    labels = frame["label"].str.strip().tolist()
    if all(v.lstrip("-").isdigit() for v in labels):
        labels = [str(int(v)) for v in labels]
    names = label_order(labels)
    root = path.parent
    check_distinct_files(path, root, frame["path"].tolist())
    sizes, channels, pixels = check_images(root, frame["path"].tolist())
    sites = frame["node"].tolist() if "node" in frame.columns else [path.stem] * len(frame)
    groups = frame["group"].tolist() if "group" in frame.columns else [None] * len(frame)
    samples = [
        Sample(id=rel, label=names.index(label), site=str(site), group=group or None, path=rel, nbytes=nbytes)
        for rel, label, site, group, nbytes in zip(frame["path"], labels, sites, groups, sizes)
    ]
    return SourceData(name="csv", samples=samples, label_names=names, channels=channels, root=root.resolve(),
                      default_scheme="source" if "node" in frame.columns else "iid", pixels=pixels)


def check_distinct_files(table: Path, root: Path, relpaths: list[str]) -> None:
    """Rows name distinct files, compared as files (device and inode), not as text: `a/0.png`, `./a/0.png`
    and a link to it are one image, which two rows would put on two nodes, or in train and test of one.
    A missing file is left for the image check to name."""
    seen: dict[tuple[int, int], int] = {}  # (device, inode) -> the row that named it first
    for row, rel in enumerate(relpaths):
        try:
            stat = (root / rel).stat()
        except OSError:
            continue
        first = seen.setdefault((stat.st_dev, stat.st_ino), row)
        if first != row:
            raise UserError(f"{table}: rows {first + 2} ({relpaths[first]}) and {row + 2} ({rel}) name the same file, "
                            "which would sit on two nodes or in both train and test; keep one of the rows")
