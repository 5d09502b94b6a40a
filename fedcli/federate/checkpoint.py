"""Checkpoints of the last completed rounds, one part per node, readable by either engine.

`<work>/<node>/round-<r>.safetensors` holds the models that node keeps (its own model, the global
model, its BatchNorm state) and `round-<r>.json` the metrics rows of its test set (and of its model on the
global test set), the transfers it sent and the cost of its training calls, up to round r. A distributed rank writes
only its node's part; the in-process engine writes
every part, so a run started by one engine can be resumed by the other. The two latest rounds are
kept, because nodes on separate machines may stop one round apart; a resume starts from the latest
round that every node still has readable, so a newest round damaged on disk (truncated, not valid
JSON) falls back to the one before, with a note.
"""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import torch

from safetensors import SafetensorError, safe_open

from fedcli.comm.node_process import MISMATCH_EXIT
from fedcli.comm.transport import Transfer
from fedcli.core import console
from fedcli.core.errors import UserError
from fedcli.experiment.artifacts import load_tensors, save_tensors, write_json
from fedcli.federate.strategies import REGISTRY

KEEP = 2


class CheckpointMismatch(UserError):
    """A checkpoint that cannot be resumed: left by a run with other options, or unreadable."""

    node_exit = MISMATCH_EXIT  # a node process ends with it, so the launcher does not offer --resume


class Checkpoint:
    def __init__(self, folder: Path, nodes: list[str], local: list[str] | None = None):
        """`local`: the nodes whose parts this process writes and reads (None: every node, in process)."""
        self.folder, self.nodes = Path(folder), list(nodes)
        self.local = None if local is None else list(local)

    def _parts(self) -> list[Path]:
        if self.local is not None:
            return [self.folder / node for node in self.local]
        return sorted(p for p in self.folder.iterdir() if p.is_dir()) if self.folder.is_dir() else []

    def _owners(self, key: str) -> list[str]:
        """The parts holding a state key: a node's own (`<node>`, `<prefix>:<node>`, federate/strategies/base.py),
        a pooled model's own part, or every node's (the global model, server state)."""
        _, sep, node = key.rpartition(":")
        if sep and node in self.nodes:
            return [node]
        if key in self.nodes or key in REGISTRY.pooled_keys():
            return [key]
        return self.local if self.local is not None else self.nodes

    def save(self, round_: int, states: dict[str, dict[str, torch.Tensor]], rows: list[dict],
             transfers: list[Transfer], config: dict, spent: list[dict]) -> None:
        """Each part's models go to their own file first; its JSON, which completes the round, last. `spent`:
        the training calls' costs so far (LocalTrainer.spent)."""
        def empty() -> dict:
            return {"states": {}, "rows": [], "transfers": [], "spent": []}
        # every node's part is written, also one with nothing in it
        local = self.local if self.local is not None else self.nodes
        parts = defaultdict(empty, {node: empty() for node in local})
        for key, state in states.items():
            for owner in self._owners(key):
                parts[owner]["states"][key] = state
        for row in rows:  # a global test row is held by the node whose model it scores, a shared model's by the first
            owner = row["test_node"] if row["test_node"] in self.nodes else row["model_node"]
            parts[owner if owner in self.nodes else local[0]]["rows"].append(row)
        for row in spent:
            parts[row["key"] if row["key"] in self.nodes else local[0]]["spent"].append(row)
        for transfer in transfers:
            parts[transfer.sender if transfer.sender in self.nodes else transfer.receiver]["transfers"].append(
                transfer.__dict__)
        for owner, part in parts.items():
            folder = self.folder / owner
            flat = {f"{key}/{name}": tensor.detach().cpu() for key, state in part["states"].items()
                    for name, tensor in state.items()}
            save_tensors(folder / f"round-{round_}.safetensors", flat)
            write_json(folder / f"round-{round_}.json", {"round": round_, "config": config, "rows": part["rows"],
                                                         "transfers": part["transfers"], "spent": part["spent"]})
            for old in folder.glob("round-*.*"):
                if round_of(old) <= round_ - KEEP:
                    old.unlink()

    def written(self) -> dict[str, set[int]]:
        """Part -> the rounds whose JSON (the file that completes a round) is on disk, readable or not."""
        return {part.name: {round_of(p) for p in part.glob("round-*.json")} for part in self._parts() if part.is_dir()}

    def rounds(self) -> set[int]:
        """The completed rounds that every part of this process still holds readable."""
        parts = self._parts()
        found = [{r for r in rounds if readable(self.folder / name, r)} for name, rounds in self.written().items()]
        if not found or len(found) < len(parts):
            return set()
        return set.intersection(*found)

    def resume_point(self) -> int | None:
        """The round a resume continues from, None when nothing was checkpointed. A newer round that some
        part holds unreadable is noted; written rounds none of which is readable are an error."""
        written = self.written()
        held = self.rounds()
        if not held:
            if any(written.values()):
                raise CheckpointMismatch(f"the checkpoint in {self.folder} has no readable round (truncated or not "
                                         "valid JSON); rerun without --resume, with --overwrite, to start over")
            return None
        start = max(held)
        damaged = sorted((r, name) for name, rounds in written.items() for r in rounds
                         if r > start and not readable(self.folder / name, r))
        if damaged:
            round_, name = damaged[-1]
            console.out.print(f"note: round {round_} of the checkpoint in {self.folder} is unreadable (part {name}: "
                              f"truncated or not valid JSON); resuming from round {start}", markup=False,
                              soft_wrap=True)
        return start

    def load(self, round_: int, config: dict
             ) -> tuple[dict[str, dict[str, torch.Tensor]], list[dict], list[Transfer], list[dict]]:
        states: dict[str, dict[str, torch.Tensor]] = {}
        rows, transfers, spent = [], [], []
        for part in self._parts():
            progress = progress_of(part, round_)
            if progress is None:
                raise CheckpointMismatch(f"round {round_} of the checkpoint in {self.folder} is unreadable (part "
                                         f"{part.name}); rerun without --resume, with --overwrite, to start over")
            if progress["config"] != config:
                raise CheckpointMismatch(f"the checkpoint in {self.folder} was made with other options; rerun "
                                         "without --resume (with --overwrite) or with the same options")
            for name, tensor in load_tensors(part / f"round-{round_}.safetensors", "checkpoint").items():
                key, _, tensor_name = name.partition("/")
                states.setdefault(key, {})[tensor_name] = tensor
            rows += progress["rows"]
            transfers += [Transfer(**t) for t in progress["transfers"]]
            spent += progress["spent"]
        return states, rows, transfers, spent

    def truncate(self, round_: int) -> None:
        """Drop this process's rounds after `round_`, the round a resume restarts from: a node that got
        further must not offer those rounds to a later resume."""
        for part in self._parts():
            for path in part.glob("round-*.*"):
                if round_of(path) > round_:
                    path.unlink()

    def clear(self) -> None:
        """Remove what this process would write: its parts (a distributed rank) or everything."""
        for folder in [self.folder] if self.local is None else [self.folder / node for node in self.local]:
            shutil.rmtree(folder, ignore_errors=True)


def round_of(path: Path) -> int:
    return int(path.name.split(".")[0].removeprefix("round-"))


PROGRESS_KEYS = {"round", "config", "rows", "transfers", "spent"}


def progress_of(part: Path, round_: int) -> dict | None:
    """A part's `round-<r>.json`; None when it is missing or damaged."""
    try:
        progress = json.loads((part / f"round-{round_}.json").read_bytes())
    except (OSError, ValueError):
        return None
    ok = isinstance(progress, dict) and PROGRESS_KEYS <= set(progress) and progress["round"] == round_
    if isinstance(progress, dict) and "spent" not in progress and PROGRESS_KEYS - {"spent"} <= set(progress):
        raise CheckpointMismatch(f"the checkpoint in {part.parent} was written by an earlier fedcli, which did not "
                                 "count the training budget (budget.csv); rerun without --resume, with --overwrite, "
                                 "to start over")
    return progress if ok else None


def readable(part: Path, round_: int) -> bool:
    """Whether a part's round is whole: its JSON parses and its safetensors file is complete (the header
    is checked against the file size; the tensors are read on load)."""
    if progress_of(part, round_) is None:
        return False
    try:
        with safe_open(part / f"round-{round_}.safetensors", "pt"):
            return True
    except (SafetensorError, OSError):
        return False
