"""Montgomery County and Shenzhen chest X-ray sets in their official archive layouts.

Files are found recursively by their official names, `MCUCXR_0001_0.png` and
`CHNCXR_0001_0.png`; the digit before `.png` is the label (0 normal, 1 tuberculosis).
"""

from __future__ import annotations

import re
from pathlib import Path

from fedcli.core.errors import UserError
from fedcli.data.imagefiles import check_images, is_image_file, require_dir
from fedcli.data.records import Sample, SourceData

NAME = re.compile(r"^(MCUCXR|CHNCXR)_(\d{4})_([01])\.png$", re.IGNORECASE)
SITES = {"MCUCXR": "montgomery", "CHNCXR": "shenzhen"}


def read(data_dir: Path) -> SourceData:
    root = require_dir(data_dir, "tuberculosis")
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*")):
        match = NAME.match(path.name)
        if not match or not is_image_file(path):
            continue
        key = path.stem.upper()
        if key in found:
            raise UserError(f"{path.name} appears twice ({found[key]} and {path}); keep one copy of each archive")
        found[key] = path
    if not found:
        raise UserError(
            f"no Montgomery (MCUCXR_####_L.png) or Shenzhen (CHNCXR_####_L.png) images under {root}; "
            "unpack the official archives there"
        )
    rels = [str(p.relative_to(root)) for p in found.values()]
    sizes, _, pixels = check_images(root, rels)
    samples = []
    for (key, path), rel, nbytes in zip(found.items(), rels, sizes):
        prefix, _, label = NAME.match(path.name).groups()
        samples.append(Sample(id=key, label=int(label), site=SITES[prefix.upper()], path=rel, nbytes=nbytes))
    return SourceData(
        name="tuberculosis",
        samples=samples,
        label_names=["normal", "tuberculosis"],
        channels=1,  # X-rays are grayscale even where a file stores RGB
        root=root.resolve(),
        augment=("hflip",),
        default_scheme="source",
        pixels=pixels,
    )
