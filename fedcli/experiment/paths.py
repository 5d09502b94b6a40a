"""Where each stage's artifacts live inside an experiment folder (see docs/layout.md).

Every folder a stage writes or replaces comes from here, and each is checked to lie inside the
experiment folder before it is used: names come from data (node names) and recipes, and a hostile
one must not make fedcli write or delete anywhere else. The check is on the names (one plain path
component each, never `.`, `..`, empty, absolute or holding a separator), so the result is a child
of `--exp` whatever the file system holds; links inside the experiment (`fedcli run` shares units
between sub-experiments through relative links) are followed as links.
"""

from __future__ import annotations

from pathlib import Path

from fedcli.core.errors import UserError

GENERATOR = "generator.safetensors"  # phase 2, privacy-preserving (EMA)
GENERATOR_PHASE1 = "generator_phase1.safetensors"  # phase 1, standard GAN (EMA)
GENERATOR_CONTROL = "generator_control.safetensors"  # phase 2 at alpha = 0: the privacy generator's control
GENERATOR_RESEEDED = "generator_reseeded.safetensors"  # the control from another random stream (--controls)
GENERATOR_TINY = "generator_tiny.safetensors"  # trained long on a tiny subset of the node (--controls)
GENERATOR_REFERENCE = "generator_reference.safetensors"  # phase 1 without the audit's members (--reference)
LIRA_PATTERN = "generator_lira_*.safetensors"  # the LiRA game's reference generators (--lira-references)
# the trainer at the kept phase-1 snapshot (generators/stylegan2/phase1_state.py)
PHASE1_STATE = "phase1_state.safetensors"
BUFFER = "buffer.safetensors"
CODES = "codes.safetensors"  # a VQ-VAE-2 node's codes of its training images, with their labels
SERIAL = ".serial"  # gan/.serial/: a serially trained generator's checkpoint after each institution
HIDDEN_LABELS = "hidden_labels.json"  # partition/: the labels few-labels partitions hide, for the oracle alone
PREDICTIONS = "predictions.safetensors"  # federate: the final models' softmax on their own test sets


def inside(exp: Path, *parts: str) -> Path:
    """`exp/parts...`, refused unless every part is one plain path component."""
    for part in parts:
        if not isinstance(part, str) or part in ("", ".", "..") or "/" in part or "\\" in part or "\0" in part:
            raise UserError(f"{part!r} cannot name a folder inside the experiment {exp} (it would lead elsewhere); "
                            "rename it in the data and re-run fedcli partition")
    return Path(exp).joinpath(*parts)


def check_experiment_folder(exp: Path) -> None:
    """An experiment folder must be a folder of its own: stages write their folders straight into it and
    `fedcli run` removes the ones its recipe no longer makes (`runs/`, `select/`, ...), so the file system's
    root or the home folder itself is refused."""
    resolved = Path(exp).expanduser().resolve()
    if resolved == Path(resolved.anchor):
        raise UserError(f"--exp {exp} is the file system's root; pass a folder of the experiment's own "
                        "(e.g. --exp results/demo)")
    if resolved == Path.home().resolve():
        raise UserError(f"--exp {exp} is your home folder itself; pass a folder of the experiment's own "
                        "(e.g. --exp ~/results/demo)")


def partition_dir(exp: Path) -> Path:
    return inside(exp, "partition")


def gan_dir(exp: Path, node: str) -> Path:
    return inside(exp, "gan", node)


def federate_dir(exp: Path, strategy: str, fold: int | None = None) -> Path:
    parts = ("federate", strategy) if fold is None else ("federate", "cv", strategy, f"fold{fold}")
    return inside(exp, *parts)


def audit_dir(exp: Path, node: str) -> Path:
    return inside(exp, "audit", node)


def attacks_dir(exp: Path, strategy: str) -> Path:
    """`audit-privacy --shared`: the attacks on what a federation shared."""
    return inside(exp, "attacks", strategy)


def report_dir(exp: Path) -> Path:
    return inside(exp, "report")


def lira_generator(reference: int, role: str) -> str:
    """The file of LiRA reference `reference`'s generator in `role` (the released one, "privacy", or "control")."""
    return LIRA_PATTERN.replace("*", f"{reference}_{role}")
