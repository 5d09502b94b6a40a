"""Data sources. Each reader turns a dataset on disk (or built in) into `SourceData`."""

from __future__ import annotations

from fedcli.data.records import SourceData
from fedcli.data.sources import digits, folders, isic2019, medmnist, retinopathy, table, tuberculosis
from fedcli.experiment.config import PartitionConfig

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


def read_source(cfg: PartitionConfig) -> SourceData:
    return READERS[cfg.source](cfg)
