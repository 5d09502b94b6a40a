"""Data sources. Each reader turns a dataset on disk (or built in) into `SourceData`; a source plugin's reader
(core/plugins.py, group fedcli.sources) is called with --data-dir and returns samples naming image files under
its `root`, which fedcli decodes and checks as it does its own readers' files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fedcli.core import plugins
from fedcli.data.imagefiles import check_images
from fedcli.data.records import SourceData
from fedcli.data.sources import digits, folders, isic2019, medmnist, retinopathy, table, tuberculosis
from fedcli.experiment.config import SOURCES, PartitionConfig

READERS = {
    "digits": lambda cfg: digits.read(),
    "tuberculosis": lambda cfg: tuberculosis.read(cfg.data_dir),
    "isic2019": lambda cfg: isic2019.read(cfg.data_dir, cfg.task),
    "medmnist": lambda cfg: medmnist.read(cfg.data_dir),
    "folders": lambda cfg: folders.read(cfg.data_dir),
    "csv": lambda cfg: table.read(cfg.data_dir),
    "retinopathy": lambda cfg: retinopathy.read(cfg.data_dir,
                                                cfg.retina_per_class if cfg.retina_balanced else None),
}
assert tuple(READERS) == SOURCES


def read_source(cfg: PartitionConfig) -> SourceData:
    if cfg.source in READERS:
        return READERS[cfg.source](cfg)
    plugin = next(p for p in plugins.installed("sources") if p.name == cfg.source)
    return checked_files(plugin, plugin.load()(Path(cfg.data_dir)))


def checked_files(plugin: plugins.Plugin, data: object) -> SourceData:
    """A plugin reader's answer with every image decoded once, as fedcli's own readers check theirs: its file sizes
    (part of the content hash), the channels the images need and the pixel scale come from the files."""
    if not isinstance(data, SourceData):
        raise plugin.refuse(f"returned {type(data).__name__}, not fedcli.data.records.SourceData")
    if data.root is None or any(s.path is None for s in data.samples):
        raise plugin.refuse("returned samples without a file path under a root; give SourceData(root=...) and "
                            "each Sample(path=...) relative to it")
    sizes, channels, pixels = check_images(Path(data.root), [s.path for s in data.samples])
    samples = [dataclasses.replace(s, nbytes=size) for s, size in zip(data.samples, sizes)]
    return dataclasses.replace(data, name=plugin.name, samples=samples, channels=channels, root=Path(data.root).resolve(),
                               pixels=pixels)
