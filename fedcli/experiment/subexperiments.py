"""How sub-experiments are named and which sweep point made one: shared by `fedcli run`, which
makes them, and the report, which reads them (so neither imports the other)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedcli.experiment.artifacts import read_json

LEDGER = ".fedcli-run.json"  # what `fedcli run` made in a folder (pipeline/ledger.py), with its sweep point
REMAKE_LEDGER = "delete it: the next fedcli run remakes it, rerunning every stage of that folder"


def key_values(items: Iterable[tuple[str, Any]]) -> str:
    """`key=value,...` with option names as on the command line: sub-experiment and grid folder names."""
    return ",".join(f"{key.replace('_', '-')}={format_value(value)}" for key, value in items)


def format_value(value: Any) -> str:
    return ("-".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)).replace("/", "_")


def point_values(folder: Path) -> dict[str, Any]:
    """The sweep values a sub-experiment was made with ({} for an experiment not made by a sweep)."""
    path = Path(folder) / LEDGER
    if not path.is_file():
        return {}
    return {f"{table}.{name}": value for table, name, value in read_json(path, "run ledger", REMAKE_LEDGER).get("point", [])}
