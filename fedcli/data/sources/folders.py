"""A user's own multi-site data laid out as `root/<node>/<class>/*.png|jpg|...` (any depth below a class).

Linked files and folders are followed alike, so a batch of images linked into a class folder is read
like the rest. A file or folder reached twice (two links to it, or a link back up the tree) is refused,
since its images would sit on two nodes or be read without end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fedcli.core.errors import UserError
from fedcli.data.imagefiles import check_images, is_image_file, require_dir
from fedcli.data.records import Sample, SourceData


def visible_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith((".", "__")))


def identity(path: Path) -> tuple[int, int]:
    """What a path leads to, links followed: (device, inode)."""
    stat = path.stat()
    return stat.st_dev, stat.st_ino


def image_paths(folder: Path, folders: dict[tuple[int, int], Path]) -> Iterator[Path]:
    """Every image under `folder`, linked folders followed; `folders` holds every folder already walked."""
    for entry in folder.iterdir():
        if entry.is_dir() and entry.name != "__MACOSX":
            first = folders.setdefault(identity(entry), entry)
            if first != entry:
                raise UserError(f"{first} and {entry} are the same folder (a second link to it, or a link back up "
                                "the tree), so its images would be read twice; remove the link")
            yield from image_paths(entry, folders)
        elif is_image_file(entry):
            yield entry


def read(data_dir: Path) -> SourceData:
    root = require_dir(data_dir, "folders")
    found: list[tuple[str, str, str]] = []  # (site, class, relative path)
    seen: dict[tuple[int, int], str] = {}  # (device, inode) -> the relative path the file was first found under
    folders: dict[tuple[int, int], Path] = {}
    for site_dir in visible_dirs(root):
        for class_dir in visible_dirs(site_dir):
            for path in sorted(image_paths(class_dir, folders)):
                rel = str(path.relative_to(root))
                first = seen.setdefault(identity(path), rel)
                if first != rel:
                    raise UserError(f"{root / first} and {root / rel} are the same file (a linked folder or "
                                    "file), so its images would sit on two nodes; remove the link")
                found.append((site_dir.name, class_dir.name, rel))
    if not found:
        raise UserError(f"no images found under {root}; expected {root}/<node>/<class>/*.png (or .jpg, ...)")
    classes = sorted({c for _, c, _ in found})
    sizes, channels, pixels = check_images(root, [rel for _, _, rel in found])
    samples = [
        Sample(id=rel, label=classes.index(cls), site=site, path=rel, nbytes=nbytes)
        for (site, cls, rel), nbytes in zip(found, sizes)
    ]
    return SourceData(name="folders", samples=samples, label_names=classes, channels=channels,
                      root=root.resolve(), default_scheme="source", pixels=pixels)
