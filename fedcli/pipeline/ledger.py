"""What `fedcli run` last made in an experiment folder, so an up-to-date stage is skipped.

A unit of work (a stage, or one strategy of federate) has a fingerprint: the hash of its
resolved config, the fedcli version and its upstream units' fingerprints. It is up to date when
the ledger holds the same fingerprint and its output files still hash to what the run wrote
(a stage re-run by hand since then, or a deleted folder, makes it stale). A change upstream
changes every fingerprint downstream of it, nothing upstream.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fedcli import __version__
from fedcli.artifacts import canonical_json, read_json, sha256_file, write_json
from fedcli.errors import UserError

LEDGER = ".fedcli-run.json"
OUTPUT_FILES = ("config.json", "manifest.json", "report.md")  # small files that change whenever a stage reruns


def fingerprint(unit: str, config: dict[str, Any], upstream: list[str]) -> str:
    payload = {"unit": unit, "config": config, "upstream": sorted(upstream), "fedcli": __version__}
    return "sha256:" + hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def output_hashes(folder: Path) -> dict[str, str]:
    """Hashes of a unit's provenance files (every config.json below it, the manifest, the report)."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    files = sorted(p for name in OUTPUT_FILES for p in folder.rglob(name) if "/." not in f"/{p.relative_to(folder)}")
    return {str(p.relative_to(folder)): sha256_file(p) for p in files}


class Ledger:
    def __init__(self, folder: Path):
        self.path = Path(folder) / LEDGER
        self.data = read_json(self.path, "run ledger") if self.path.is_file() else {"units": {}}
        units = self.data.get("units") if isinstance(self.data, dict) else None
        if not isinstance(units, dict) or not all(isinstance(u, dict) and {"fingerprint", "outputs"} <= set(u)
                                                  for u in units.values()):
            raise UserError(f"run ledger {self.path} is corrupt; delete it and fedcli run reruns every stage")

    def up_to_date(self, unit: str, fp: str, folder: Path) -> bool:
        entry = self.data["units"].get(unit)
        if entry is None or entry["fingerprint"] != fp or Path(folder).is_symlink():
            return False
        outputs = output_hashes(folder)
        return bool(outputs) and outputs == entry["outputs"]

    def record(self, unit: str, fp: str, folder: Path) -> None:
        self.data["units"][unit] = {"fingerprint": fp, "outputs": output_hashes(folder)}
        self.save()

    def forget(self, unit: str) -> None:
        if self.data["units"].pop(unit, None) is not None:
            self.save()

    def set_point(self, values: list[list[Any]]) -> None:
        values = json.loads(json.dumps(values, default=str))  # paths as strings
        if self.data.get("point") != values:
            self.data["point"] = values
            self.save()

    def save(self) -> None:
        write_json(self.path, self.data)


def point_values(folder: Path) -> dict[str, Any]:
    """The sweep values a sub-experiment was made with ({} for an experiment not made by a sweep)."""
    path = Path(folder) / LEDGER
    if not path.is_file():
        return {}
    return {f"{table}.{name}": value for table, name, value in read_json(path, "run ledger").get("point", [])}
