"""Every kind of file fedcli writes under an experiment folder, and how it is checked when read back.

A stage lists what it wrote in its folder's `config.json` (`files: {relpath: {bytes, sha256}}`,
`record_files`); a loader reads an artifact through `read_recorded`, which refuses a file whose
size or hash differs from that record (truncated, edited, or another node's copied over it), then
applies the content checks of its kind (`load_recorded`, `buffer_problem`, finiteness). `stale_inputs`
compares the inputs a `config.json` names (the partition's content hash, upstream files' hashes)
with what the experiment holds now. Kinds are matched by path relative to an experiment folder;
`runs/<point>/` (sweeps) and `select/<point>/` (model selection) are experiments of their own.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from fedcli.core.errors import UserError
from fedcli.experiment.artifacts import OLD, STAGING, parse_tensors, read_json, sha256_bytes, sha256_file
from fedcli.experiment.paths import (BUFFER, CODES, GENERATOR, GENERATOR_CONTROL, GENERATOR_PHASE1, GENERATOR_REFERENCE,
                                     GENERATOR_RESEEDED, GENERATOR_TINY, LIRA_PATTERN, PHASE1_STATE, PREDICTIONS,
                                     inside)

CONFIG = "config.json"
SUB_EXPERIMENTS = ("runs", "select")  # <exp>/runs/<point>/ and <exp>/select/<point>/ hold whole experiments
RECORDED = "bytes and sha256 as its folder's config.json recorded"


@dataclasses.dataclass(frozen=True)
class Kind:
    name: str
    patterns: tuple[str, ...]  # relative to an experiment; `*` matches within one name, `**` any folders
    on_load: str  # what a reader checks ("" where fedcli never reads it back)
    recorded: bool = False  # listed under `files` in its folder's config.json
    link: bool = False  # a symlink to another sub-experiment's output (fedcli run shares a unit)


def fold_too(*patterns: str) -> tuple[str, ...]:
    """Federate patterns for a final run (`federate/<strategy>/`) and a fold (`federate/cv/<strategy>/fold<k>/`)."""
    return tuple(p for pattern in patterns for p in (pattern, pattern.replace("federate/*/", "federate/cv/*/fold*/")))


KINDS: tuple[Kind, ...] = (
    Kind("transient", (f"**/.*.{STAGING}-*/**", f"**/.*.{OLD}-*/**", "**/.*.tmp", "**/.probe-*", "logs/.rendezvous-*"),
         "never read: a stage's work in progress, renamed into place or removed when it ends"),
    Kind("manifest", ("partition/manifest.json",),
         "schema, its own content hash, node/site/class names, every label a class index and every fold in range "
         "(Manifest.load)"),
    Kind("node manifest", ("partition/nodes/*.json",), "schema, node name and its own content hash "
         "(load_node_manifest)"),
    Kind("provenance", ("partition/config.json", "gan/*/config.json", *fold_too("federate/*/config.json"),
                        "audit/*/config.json"),
         "valid JSON; the inputs it names still hash to what it recorded (stale_inputs: fedcli run, report)"),
    Kind("partition summary", ("partition/summary.csv", "partition/summary.png"), ""),
    Kind("hidden labels", ("partition/hidden_labels.json",),
         "the labels a few-labels partition hides, tied to its content hash; read only by the upper bounds' oracle "
         "(federate --labels all: read_hidden_labels checks the hash and every label)"),
    Kind("generator", tuple("gan/*/" + name for name in (GENERATOR, GENERATOR_PHASE1, GENERATOR_CONTROL,
                                                         GENERATOR_RESEEDED, GENERATOR_TINY,
                                                         GENERATOR_REFERENCE, LIRA_PATTERN)),
         f"{RECORDED}; metadata names its node; tensors fit the architecture; finite values", recorded=True),
    Kind("phase-1 state", ("gan/*/" + PHASE1_STATE,),
         f"{RECORDED}; metadata names its node; its key (every option up to phase 2, the partition, seed, node, "
         "device and threads) equals the reader's before train-gan --phase1-from starts from it; it fits the trainer; "
         "finite values", recorded=True),
    Kind("buffer", ("gan/*/" + BUFFER,),
         f"{RECORDED}; metadata names its node and partition; uint8 images (N, C, S, S); one int64 label per "
         "image, each a class the node holds", recorded=True),
    Kind("codes", ("gan/*/" + CODES,),
         f"{RECORDED}; metadata names its node and partition; int16 top and bottom codes, each below the codebook's "
         "size, one int64 label per image (vqvae2 kind)", recorded=True),
    Kind("serial checkpoint", ("gan/.serial/after-*.safetensors",),
         "a serial generator after each institution; its config fingerprint compared before it is resumed"),
    Kind("GAN training log", ("gan/*/metrics.csv", "gan/*/samples.png"), "", recorded=True),
    Kind("federate results", fold_too("federate/*/metrics.csv", "federate/*/comm.csv", "federate/*/bn_statistics.csv",
                                      "federate/*/forgetting.csv", "federate/*/peers.csv", "federate/*/global_test.csv",
                                      "federate/*/budget.csv", "federate/*/encoder.csv"),
         "read as tables by the report and by model selection", recorded=True),
    Kind("classifier", fold_too("federate/*/models/*.safetensors"),
         f"{RECORDED}; tensors fit the classifier; finite values (predict)", recorded=True),
    Kind("shared samples", fold_too("federate/*/shared/*.safetensors"),
         f"{RECORDED}; what a strategy sent (latents, activations and gradients, updates), kept for an audit",
         recorded=True),
    Kind("test-set predictions", fold_too("federate/*/" + PREDICTIONS),
         f"{RECORDED}; one softmax per test image of each own model, labels in range, finite values (report: "
         "paired bootstrap)", recorded=True),
    Kind("checkpoint", ("federate/.*.checkpoint/*/round-*.*", "federate/cv/*/.fold*.checkpoint/*/round-*.*",
                        "federate/.*.checkpoint/*/final/**/*.safetensors",
                        "federate/cv/*/.fold*.checkpoint/*/final/**/*.safetensors"),
         "options and round compared on --resume (Checkpoint.load)"),
    Kind("audit results", ("audit/*/distances.csv", "audit/*/summary.json", "audit/*/*.png"),
         "summary.json read by the report", recorded=True),
    Kind("report", ("report/report.md", "report/*.csv", "report/tex/*.tex", "report/figures/*.png"), ""),
    Kind("predictions", ("predict/*.csv",), ""),
    Kind("run ledger", (".fedcli-run.json",), "units with a fingerprint and output hashes (Ledger)"),
    Kind("node log", ("logs/*.log",), "the launcher reads the last error line of a failed node"),
    Kind("stage events", ("logs/*/events.jsonl", "logs/tensorboard/**"),
         "never read: the run's progress for people and TensorBoard (fedcli/experiment/events.py)"),
    Kind("lock", (".locks/*.lock",), "the holder named in a refusal"),
    Kind("shared output", ("partition", "gan", "audit", "federate/*", "federate/cv/*"),
         "a unit up to date in another sub-experiment, linked rather than rerun (fedcli run)", link=True),
)


def matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(matches(parts[i:], rest) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and matches(parts[1:], rest)


def kind_of(relpath: str, link: bool = False) -> Kind | None:
    """The kind of a file (or, with `link`, a symlink) at `relpath` inside an experiment folder."""
    parts = tuple(Path(relpath).parts)
    candidates = [parts]
    while len(parts) > 2 and parts[0] in SUB_EXPERIMENTS:
        parts = parts[2:]
        candidates.append(parts)
    for kind in KINDS:
        if kind.link == link and any(matches(c, tuple(p.split("/"))) for c in candidates for p in kind.patterns):
            return kind
    return None


def output_files(folder: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every file below `folder`, sorted, without following links; hidden names
    are work in progress (staging folders, checkpoints, temporary files), never a stage's output."""
    folder = Path(folder)
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root) / name for name in files if not name.startswith(".")]
    for path in sorted(found):
        yield path.relative_to(folder).as_posix(), path


_by_stat: dict[tuple, Any] = {}


def by_stat(path: Path, compute):
    """`compute(path)`, once per process while the file is unchanged (same inode, size and mtime)."""
    stat = os.stat(path)
    key = (str(path), compute.__name__, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _by_stat:
        _by_stat[key] = compute(path)
    return _by_stat[key]


def file_sha256(path: Path) -> str:
    return by_stat(path, sha256_file)


def manifest_hash(path: Path) -> str | None:
    data = read_json(path, "manifest")
    return data.get("content_hash") if isinstance(data, dict) else None


def record_files(folder: Path) -> dict[str, dict[str, Any]]:
    """`files` for the config.json of a finished artifact folder: every file but config.json itself."""
    return {rel: file_record(path) for rel, path in output_files(folder) if rel != CONFIG}


def file_record(path: Path) -> dict[str, Any]:
    return {"bytes": Path(path).stat().st_size, "sha256": file_sha256(path)}


def recorded(path: Path) -> tuple[Path, dict] | None:
    """(config.json, the record of `path` in it), from the nearest folder above that lists it."""
    for folder in list(Path(path).parents)[:2]:
        config = folder / CONFIG
        if config.is_file():
            saved = read_json(config, "artifact config")
            saved = saved if isinstance(saved, dict) else {}
            files = saved.get("files") if isinstance(saved.get("files"), dict) else {}
            record = files.get(Path(path).relative_to(folder).as_posix())
            if record is None and Path(path).name == BUFFER and isinstance(saved.get("buffer"), dict):
                record = {"sha256": saved["buffer"].get("sha256")}  # a GAN config written before `files`
            return (config, record) if isinstance(record, dict) else None
    return None


def read_recorded(path: Path, what: str, fix: str) -> bytes:
    """The bytes of an artifact, refused when they differ from what its folder's config.json recorded."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found at {path}; {fix}")
    data = path.read_bytes()
    found = recorded(path)
    if found is not None:
        config, record = found
        if "bytes" in record and len(data) != record["bytes"]:
            raise UserError(f"{what} at {path} is corrupt or was replaced after it was written: {len(data)} bytes, "
                            f"but {config} recorded {record['bytes']}; {fix}")
        if record.get("sha256") and sha256_bytes(data) != record["sha256"]:
            raise UserError(f"{what} at {path} is corrupt or was replaced after it was written: its sha256 differs "
                            f"from the one {config} recorded; {fix}")
    return data


def load_recorded(path: Path, what: str, fix: str, expect: dict[str, str] | None = None) -> tuple[dict, dict]:
    """(tensors, metadata) of a recorded safetensors artifact: the record matches, the file parses, the
    metadata holds `expect` (e.g. the node it belongs to) and every float tensor is finite."""
    try:
        tensors, metadata = parse_tensors(read_recorded(path, what, fix))
    except ValueError as exc:
        raise UserError(f"{what} at {path} is corrupt ({exc}); {fix}") from exc
    for key, wanted in (expect or {}).items():
        if key in metadata and metadata[key] != wanted:
            raise UserError(f"{what} at {path} was made for {key} {metadata[key]!r}, not {wanted!r}; {fix}")
    bad = next((name for name, t in tensors.items() if t.is_floating_point() and not t.isfinite().all()), None)
    if bad is not None:
        raise UserError(f"{what} at {path} holds non-finite values (tensor {bad!r}); {fix}")
    return tensors, metadata


def load_module(module, path: Path, what: str, fix: str, expect: dict[str, str] | None = None, unfit: str = ""):
    """`module` with the state at `path` (see `load_recorded`); a state that does not fit it is refused,
    saying `unfit` (what the module is) when given."""
    state, _ = load_recorded(path, what, fix, expect)
    own = module.state_dict()
    cast = next((name for name, t in state.items() if name in own and t.dtype != own[name].dtype), None)
    if cast is not None:  # load_state_dict would cast it silently; fedcli writes every tensor as its module holds it
        raise UserError(f"{what} at {path} holds tensor {cast!r} as {state[cast].dtype}, not {own[cast].dtype}; {fix}")
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:  # torch's first line only names the module; the next names the tensors
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = lines[min(1, len(lines) - 1)] if lines else type(exc).__name__
        detail = detail if len(detail) <= 160 else detail[:157] + "..."
        raise UserError(f"{what} at {path} does not fit{': ' + unfit if unfit else ''} ({detail}); {fix}") from exc
    return module


def buffer_problem(images, labels, shape: tuple[int, int, int], num_classes: int,
                   classes: list[int] | None = None) -> str | None:
    """What is wrong with a buffer's tensors, or None: uint8 images (N, *shape), one int64 label per
    image, each in 0..num_classes-1 (and, given `classes`, one of them)."""
    import torch

    if labels is None or labels.dtype != torch.int64 or labels.ndim != 1:
        got = "none" if labels is None else f"{labels.dtype} of shape {tuple(labels.shape)}"
        return f"has no int64 label vector (labels: {got})"
    if images is None or images.dtype != torch.uint8 or tuple(images.shape[1:]) != tuple(shape) or images.ndim != 4:
        got = None if images is None else (tuple(images.shape), images.dtype)
        return f"images are {got}, expected uint8 (N, {', '.join(map(str, shape))})"
    if len(images) != len(labels):
        return f"has {len(images)} images but {len(labels)} labels (one per image expected)"
    allowed = set(range(num_classes) if classes is None else classes) & set(range(num_classes))
    outside = sorted(set(labels.unique().tolist()) - allowed)
    if outside:
        return (f"has labels outside 0..{num_classes - 1} (e.g. {outside[0]})" if classes is None else
                f"has label {outside[0]}, not one of the node's classes {sorted(allowed)}")
    return None


def config_root(config: Path) -> Path | None:
    """The experiment folder an artifact's config.json belongs to: the nearest one holding a manifest."""
    return next((p for p in Path(config).parents if (p / "partition" / "manifest.json").is_file()), None)


# audit/<node>'s input names
AUDITED = {"standard": GENERATOR_PHASE1, "control": GENERATOR_CONTROL, "privacy": GENERATOR, "buffer": BUFFER}
AUDITED_CONTROLS = {"reseeded": GENERATOR_RESEEDED, "tiny-node": GENERATOR_TINY}  # with audit-privacy --controls


def input_file(key: str, folder: Path, root: Path) -> Path | None:
    """The file an input of `folder/config.json` names: `buffer:<node>` or `codes:<node>` (federate), an audited
    one, or the federation whose shared data attacks/<strategy> attacked (its config.json records its files)."""
    for prefix, name in (("buffer:", BUFFER), ("codes:", CODES)):
        if key.startswith(prefix):
            return inside(root, "gan", key.removeprefix(prefix), name)
    if key == "federate" and folder.parent.name == "attacks":
        return inside(root, "federate", folder.name, CONFIG)
    audited = AUDITED | AUDITED_CONTROLS
    if key in audited and folder.parent.name == "audit":
        return inside(root, "gan", folder.name, audited[key])
    return None


def stale_inputs(config: Path) -> list[str]:
    """The inputs named in an artifact's config.json that no longer are what it was made from: "another
    partition" when the manifest's content hash changed, an upstream file whose sha256 changed. Inputs
    that cannot be compared (no manifest or no file now, a config from before inputs were recorded) are
    not listed: the artifact's loader refuses what it cannot use."""
    config, root = Path(config), config_root(config)
    saved = read_json(config, "artifact config") if root is not None else {}
    inputs = saved.get("inputs") if isinstance(saved, dict) else None
    if not isinstance(inputs, dict):
        return []
    stale = []
    for key, value in inputs.items():
        if key == "manifest":
            if value != by_stat(root / "partition" / "manifest.json", manifest_hash):
                stale.append("another partition")
        elif (path := input_file(key, config.parent, root)) is not None and path.is_file() \
                and file_sha256(path) != value:
            stale.append(f"another {path.relative_to(root).as_posix()}")
    return stale
