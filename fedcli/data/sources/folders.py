"""A user's own multi-site data laid out as `root/<node>/<class>/*.png|jpg|...`."""

from __future__ import annotations

from pathlib import Path

from fedcli.data.imagefiles import check_images, is_image_file, require_dir
from fedcli.data.records import Sample, SourceData
from fedcli.errors import UserError


def visible_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))


def read(data_dir: Path) -> SourceData:
    root = require_dir(data_dir, "folders")
    found: list[tuple[str, str, str]] = []  # (site, class, relative path)
    seen: dict[tuple[int, int], str] = {}  # (device, inode) -> the relative path the file was first found under
    for site_dir in visible_dirs(root):
        for class_dir in visible_dirs(site_dir):
            for path in sorted(class_dir.rglob("*")):
                if is_image_file(path):
                    rel = str(path.relative_to(root))
                    stat = path.stat()
                    first = seen.setdefault((stat.st_dev, stat.st_ino), rel)
                    if first != rel:
                        raise UserError(f"{root / first} and {root / rel} are the same file (a linked folder or "
                                        "file), so its images would sit on two nodes; remove the link")
                    found.append((site_dir.name, class_dir.name, rel))
    if not found:
        raise UserError(f"no images found under {root}; expected {root}/<node>/<class>/*.png (or .jpg, ...)")
    classes = sorted({c for _, c, _ in found})
    sizes, channels = check_images(root, [rel for _, _, rel in found])
    samples = [
        Sample(id=rel, label=classes.index(cls), site=site, path=rel, nbytes=nbytes)
        for (site, cls, rel), nbytes in zip(found, sizes)
    ]
    return SourceData(name="folders", samples=samples, label_names=classes, channels=channels,
                      root=root.resolve(), default_scheme="source")
