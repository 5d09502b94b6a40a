"""What `fedcli run` last made in an experiment folder, so an up-to-date stage is skipped.

A unit of work (a stage, or one strategy of federate) has a fingerprint: the hash of its
resolved config, the fedcli and torch versions (another torch can give other numbers on the same
CPU, so an upgrade reruns every unit once) and its upstream units' fingerprints. It is up to date when
the ledger holds the same fingerprint, every file it wrote still hashes to what the run recorded
(a stage re-run by hand, a deleted folder, a truncated buffer or model makes it stale), and the
inputs its config.json files name still hash to what they recorded (a GAN retrained since, whose
buffer differs, makes what read the old buffer stale). A change upstream changes every fingerprint downstream of
it, nothing upstream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fedcli import __version__
from fedcli.core.environment import environment
from fedcli.core.errors import UserError
from fedcli.experiment.artifact_kinds import CONFIG, file_sha256, output_files, stale_inputs
from fedcli.experiment.artifacts import json_sha256, read_json, write_json
from fedcli.experiment.subexperiments import LEDGER, REMAKE_LEDGER


def fingerprint(unit: str, config: dict[str, Any], upstream: list[str]) -> str:
    payload = {"unit": unit, "config": config, "upstream": sorted(upstream), "fedcli": __version__,
               "torch": environment()["torch"]}
    return json_sha256(payload)


def output_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file a unit wrote (artifacts and configs; hidden work files aside)."""
    return {rel: file_sha256(path) for rel, path in output_files(folder)} if Path(folder).is_dir() else {}


class Ledger:
    def __init__(self, folder: Path):
        self.path = Path(folder) / LEDGER
        self.data = read_json(self.path, "run ledger", REMAKE_LEDGER) if self.path.is_file() else {"units": {}}
        units = self.data.get("units") if isinstance(self.data, dict) else None
        if not isinstance(units, dict) or not all(isinstance(u, dict) and {"fingerprint", "outputs"} <= set(u)
                                                  for u in units.values()):
            raise UserError(f"run ledger {self.path} is corrupt; {REMAKE_LEDGER}")

    def up_to_date(self, unit: str, fp: str, folder: Path) -> bool:
        entry = self.data["units"].get(unit)
        if entry is None or entry["fingerprint"] != fp or Path(folder).is_symlink():
            return False
        outputs = output_hashes(folder)
        return bool(outputs) and outputs == entry["outputs"] and not any(
            stale_inputs(Path(folder) / rel) for rel in outputs if Path(rel).name == CONFIG)

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
