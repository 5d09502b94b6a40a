"""A data-source plugin: a flat folder of `<site>__<label>__<study>.png` files, as some archives export them,
each file one study of one patient (the study name before a dash: `p12-2` is patient p12's second study)."""

from __future__ import annotations

from pathlib import Path

from fedcli.core.errors import UserError
from fedcli.data.records import Sample, SourceData


def read(data_dir: Path) -> SourceData:
    files = sorted(p for p in Path(data_dir).glob("*.png") if p.stem.count("__") == 2)
    if not files:
        raise UserError(f"no <site>__<label>__<study>.png files in {data_dir}")
    parts = [p.stem.split("__") for p in files]
    labels = sorted({label for _, label, _ in parts})
    samples = [Sample(id=p.name, label=labels.index(label), site=site, group=f"{site}/{study.split('-')[0]}", path=p.name)
               for p, (site, label, study) in zip(files, parts)]
    return SourceData(name="studies", samples=samples, label_names=labels, channels=1, root=Path(data_dir))
