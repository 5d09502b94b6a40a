"""What a data source hands to the partitioner: samples with labels, sites and load references."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fedcli.data.pixelscale import Pixels


@dataclasses.dataclass(frozen=True)
class Sample:
    id: str
    label: int
    site: str
    group: str | None = None  # patient or lesion: never split across train/test or folds
    path: str | None = None  # image file, relative to the data root
    index: int | None = None  # row of a built-in or .npz array
    nbytes: int | None = None  # file size, part of the content hash

    @property
    def group_key(self) -> str:
        return self.group if self.group is not None else self.id

    def record(self) -> dict:
        """The manifest record: id, label and what is needed to load the image."""
        out: dict = {"id": self.id, "label": self.label}
        for key in ("group", "path", "index", "nbytes"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclasses.dataclass
class SourceData:
    name: str
    samples: list[Sample]
    label_names: list[str]
    channels: int
    root: Path | None = None  # data root that record paths are relative to
    data_file: str | None = None  # an array file under the root (medmnist)
    augment: tuple[str, ...] = ("hflip",)  # train-time augmentation suited to the images
    default_scheme: str = "source"
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    pixels: dict[str, Pixels] = dataclasses.field(default_factory=dict)  # image file -> what decoding it found

    @property
    def sites(self) -> list[str]:
        return sorted({s.site for s in self.samples})
