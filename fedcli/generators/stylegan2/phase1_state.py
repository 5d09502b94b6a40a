"""Phase 1's end state, kept in each StyleGAN node folder so that another train-gan can start from it.

Phase 2 and its control both restart from the trainer's state at the kept phase-1 snapshot
(GanTrainer.snapshot: networks, optimisers, ADA, counters, data order, random stream). Options that only
phase 2 reads (alpha, the privacy loss's form and scale, phase 2's cap and FID limit) or that only act
after it (the buffer, the side GANs) leave phase 1 bitwise the same, so a sweep over alpha need not
retrain it: `train-gan --phase1-from EXP` starts phase 2 from EXP's state where the key matches (every
other option, the partition's content, the seed, the node, the device type and the CPU threads) and
refuses otherwise. The outputs are those of a full run, byte for byte; only phase 1's time is saved.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fedcli.core.errors import UserError
from fedcli.data.manifest import Manifest
from fedcli.experiment.artifact_kinds import load_recorded
from fedcli.experiment.config import settled, to_json
from fedcli.experiment.paths import PHASE1_STATE, gan_dir
from fedcli.generators.config import GAN_ENGINE_OPTIONS, GanConfig
from fedcli.generators.stylegan2.train import GanTrainer, PhaseResult

FORMAT = 1
AFTER_PHASE1 = frozenset({"alpha", "privacy_loss", "privacy_scale", "pp_iterations", "fid_factor", "buffer_size",
                          "truncation", "controls", "tiny_node", "reference", "lira_references"})
# where and how it runs (the device and threads enter the key as used)
NOT_READ = GAN_ENGINE_OPTIONS | {"exp", "node", "overwrite", "threads", "sample_only", "device"}
NETWORKS = ("G", "D", "G_ema")
OPTIMISERS = ("opt_g", "opt_d")


def phase1_options(cfg: GanConfig) -> dict:
    """The options that decide phase 1 (what `fedcli run` matches sub-experiments by, before the key)."""
    return settled({k: v for k, v in to_json(cfg).items() if k not in AFTER_PHASE1 | NOT_READ})


def key(cfg: GanConfig, manifest: Manifest, node: str, seed: int, device: str) -> dict:
    """What decides a node's phase 1."""
    return {"format": FORMAT, "options": phase1_options(cfg), "partition": manifest.content_hash, "node": node,
            "seed": seed, "device": torch.device(device).type, "threads": torch.get_num_threads()}


def state_file(cfg: GanConfig, manifest: Manifest, node: str, seed: int, device: str, phase1: PhaseResult,
               state: dict, rows: list[dict]) -> tuple[dict[str, torch.Tensor], dict]:
    """The (tensors, metadata) of PHASE1_STATE: the trainer's state at the kept snapshot, phase 1's result and
    its metrics rows."""
    tensors = {f"{net}.{name}": t.detach().cpu() for net in NETWORKS for name, t in state[net].items()}
    for opt in OPTIMISERS:
        tensors |= {f"{opt}.{index}.{name}": t.detach().cpu() for index, slots in state[opt]["state"].items()
                    for name, t in slots.items()}
    tensors |= {"order": state["order"].cpu(), "rng": state["rng"]}
    metadata = {"node": node, "key": json.dumps(key(cfg, manifest, node, seed, device), sort_keys=True),
                "phase1": json.dumps({"fid": phase1.fid, "iteration": phase1.iteration,
                                      "iterations_run": phase1.iterations_run, "stopped": phase1.stopped,
                                      "selection": phase1.selection}),
                "ada": json.dumps(state["ada"]), "counters": json.dumps([state["iteration"], state["images_seen"]]),
                "rows": json.dumps(rows)}
    return tensors, metadata


class Phase1Source:
    """A node's phase-1 state in another experiment, checked whole against this run's key before anything trains,
    and read again when its node's turn comes (every node's state held at once would be several times the
    networks' size per node)."""

    def __init__(self, source: Path, cfg: GanConfig, manifest: Manifest, node: str, seed: int, device: str):
        path = gan_dir(source, node) / PHASE1_STATE
        self.source, self.path, self.node = source, path, node
        self.fix = f"drop --phase1-from, or retrain {source}"
        if not path.is_file():
            raise UserError(f"--phase1-from {source}: no phase-1 state for node {node} ({path} is missing: a DP, "
                            "VQ-VAE-2 or older train-gan keeps none); drop --phase1-from")
        _, metadata = self.load()
        try:
            theirs = json.loads(metadata["key"])
        except (KeyError, ValueError) as exc:
            raise UserError(f"node {node}'s phase-1 state at {path} is corrupt (no key: {exc}); {self.fix}") from None
        ours = key(cfg, manifest, node, seed, device)
        if theirs != ours:
            raise UserError(f"--phase1-from {source}: node {node}'s phase 1 there differs from this run's in "
                            f"{differences(theirs, ours)}; drop --phase1-from, or train with the same options")

    def load(self) -> tuple[dict, dict]:
        return load_recorded(self.path, f"node {self.node}'s phase-1 state", self.fix, {"node": self.node})

    def restore(self, trainer: GanTrainer) -> tuple[PhaseResult, dict, list[dict]]:
        """Phase 1's result, the trainer's state at its kept snapshot (restored into `trainer`'s shapes and
        device) and its metrics rows."""
        tensors, metadata = self.load()
        state = {net: {name.removeprefix(f"{net}."): t for name, t in tensors.items()
                       if name.startswith(f"{net}.")} for net in NETWORKS}
        for opt in OPTIMISERS:
            slots: dict[int, dict[str, torch.Tensor]] = {}
            for name, t in tensors.items():
                if name.startswith(f"{opt}."):
                    index, slot = name.removeprefix(f"{opt}.").split(".", 1)
                    slots.setdefault(int(index), {})[slot] = t
            state[opt] = {"state": slots, "param_groups": getattr(trainer, opt).state_dict()["param_groups"]}
        state["ada"] = json.loads(metadata["ada"])
        state["iteration"], state["images_seen"] = json.loads(metadata["counters"])
        state["order"], state["rng"] = tensors["order"].to(trainer.device), tensors["rng"]
        result = json.loads(metadata["phase1"])
        phase1 = PhaseResult(state["G_ema"], result["fid"], result["iteration"], result["iterations_run"],
                             result["stopped"], result["selection"])
        try:
            trainer.restore(state)
        except (RuntimeError, KeyError, ValueError, IndexError) as exc:
            raise UserError(f"the phase-1 state at {self.path} does not fit this trainer ({str(exc).splitlines()[0]}); "
                            f"{self.fix}") from None
        return phase1, state, json.loads(metadata["rows"])


NAMED = {"seed": "--seed", "device": "--device", "threads": "--threads", "node": "the node",
         "partition": "the partition", "format": "the state's format"}


def differences(theirs: dict, ours: dict) -> str:
    """The key's differing entries, named as a user sets them."""
    named = []
    for k in sorted(set(theirs) | set(ours)):
        there, here = theirs.get(k), ours.get(k)
        if k == "options" and isinstance(there, dict):
            named += [f"--{o.replace('_', '-')} ({there.get(o)} there, {here.get(o)} here)"
                      for o in sorted(there.keys() | here.keys()) if there.get(o) != here.get(o)]
        elif k == "partition" and there != here:
            named.append("the partition (another content)")
        elif there != here:
            named.append(f"{NAMED.get(k, k)} ({there} there, {here} here)")
    return ", ".join(named)
