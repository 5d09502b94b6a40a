"""Artifact I/O: atomic writes, staged output folders, JSON/CSV/safetensors helpers, provenance.

A stage writes everything into a hidden staging folder next to its final one and renames it
into place only when it has finished, so an error never leaves a partial artifact behind.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fedcli import __version__
from fedcli.core.environment import environment
from fedcli.core.errors import UserError


METADATA_KEY = "fedcli"


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = current_umask()  # temp files and folders get private modes; finished ones get the usual


T = TypeVar("T")
RACE_ATTEMPTS = 1000  # each attempt takes microseconds; a sibling's create-and-remove cycle cannot win them all


def in_folder(folder: Path, create: Callable[[], T] = lambda: None) -> T:
    """Make `folder` (and its parents), then `create()` something inside it (a temp file or folder).

    The ranks of one run start at once and share `<exp>`, `<exp>/.locks` and `<exp>/federate`; each removes
    the empty folders it made when its lock or its writability probe ends. So between this process's
    `mkdir` and its `create()`, a sibling may remove the folder (`create` fails: not found), or it may
    vanish between `mkdir`'s "exists" and its "is a folder" check (`mkdir` fails: exists): both are retried.
    Something else standing in the way (a file) is the OSError a user sees."""
    folder = Path(folder)
    for _ in range(RACE_ATTEMPTS - 1):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return create()
        except (FileExistsError, FileNotFoundError):
            if any(os.path.lexists(p) and not p.is_dir() for p in (folder, *folder.parents)):
                raise
    folder.mkdir(parents=True, exist_ok=True)
    return create()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = in_folder(path.parent, lambda: tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        with named(path), os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~UMASK)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def named(path: Path) -> Iterator[None]:
    """An OSError raised inside names `path` when it names no file: a write to a full disk raises one without
    a name, and the one line a user reads must say where (errors.environment_message)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace variation; the input of every content hash."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode())


def read_json(path: Path, what: str, fix: str = "recreate it") -> Any:
    """`fix`: how a user recreates the file when it is not JSON (the stage or command that writes it)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found at {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{what} at {path} is not valid JSON ({exc}); {fix}") from exc
    except RecursionError as exc:
        raise UserError(f"{what} at {path} nests deeper than Python can read; {fix}") from exc


def write_csv(path: Path, frame) -> None:
    """A table with "\n" line ends. Python's csv does not quote a cell holding a carriage return under
    "\n", which would split its row when read back (a file name from predict can hold one): then every
    text cell is quoted; other tables keep their bytes."""
    text = [c for c in frame.columns if frame[c].dtype.kind not in "biufcmM"]  # not numbers, booleans or times
    carriage_return = any(frame[c].astype(str).str.contains("\r", regex=False).any() for c in text)
    quoting = csv.QUOTE_NONNUMERIC if carriage_return else csv.QUOTE_MINIMAL
    atomic_write_bytes(path, frame.to_csv(index=False, lineterminator="\n", quoting=quoting).encode())


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def json_sha256(value: Any) -> str:
    """The hash of a JSON value as canonical_json writes it: the same for equal values, whatever their key order."""
    return sha256_bytes(canonical_json(value).encode())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def tensor_bytes(tensors: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> bytes:
    """Safetensors bytes: the only format a peer's model or buffer travels in.

    Metadata goes in as one canonical-JSON entry: safetensors writes a metadata map in hash
    order, which would make the same tensors serialize to different bytes from run to run.
    """
    from safetensors.torch import save

    contiguous = {name: tensor.contiguous() for name, tensor in tensors.items()}
    return save(contiguous, metadata={METADATA_KEY: canonical_json(dict(metadata))} if metadata else None)


def save_tensors(path: Path, tensors: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> None:
    atomic_write_bytes(path, tensor_bytes(tensors, metadata))


def parse_tensors(data: bytes) -> tuple[dict, dict]:
    """Tensors and fedcli metadata of safetensors bytes; ValueError when they are not valid."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        tensors = load(data)
        header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
        metadata = json.loads((header.get("__metadata__") or {}).get(METADATA_KEY, "{}"))
    except (SafetensorError, OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError, RecursionError) as exc:
        raise ValueError(str(exc)) from exc
    if not isinstance(metadata, dict):  # every reader looks keys up in it
        raise ValueError(f"its {METADATA_KEY} metadata is {type(metadata).__name__} JSON, not an object")
    return tensors, metadata


def tensor_metadata(path: Path) -> dict:
    return parse_tensors(Path(path).read_bytes())[1]


def load_tensors(path: Path, what: str) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found at {path}")
    try:
        return parse_tensors(path.read_bytes())[0]
    except ValueError as exc:
        raise UserError(f"{what} at {path} is corrupt ({exc}); recreate it") from exc


def provenance(stage: str, config: Mapping[str, Any], seed: int, inputs: Mapping[str, str]) -> dict:
    """The `config.json` every artifact folder carries: enough to detect a stale input, and the environment
    the stage ran in (a record outside `config` and `inputs`, which is all that resume and staleness read)."""
    return {
        "stage": stage,
        "fedcli_version": __version__,
        "seed": seed,
        "config": dict(config),
        "inputs": dict(inputs),
        "environment": environment(),
    }


STAGING, OLD = "staging", "old"  # the folders next to an output that staged_output makes while writing it


def aside(final: Path, kind: str) -> str:
    """The name prefix of `final`'s staging folders (STAGING) or of its previous version moved aside (OLD)."""
    return f".{Path(final).name}.{kind}-"


@contextlib.contextmanager
def staged_output(final: Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty staging folder that replaces `final` only if the block succeeds."""
    final = Path(final)
    check_output_free(final, overwrite)
    created_parents = [p for p in reversed(final.parents) if not p.exists()]
    staging = Path(in_folder(final.parent, lambda: tempfile.mkdtemp(dir=final.parent, prefix=aside(final, STAGING))))
    os.chmod(staging, 0o777 & ~UMASK)
    try:
        yield staging
        if final.exists():
            trash = Path(tempfile.mkdtemp(dir=final.parent, prefix=aside(final, OLD)))
            os.replace(final, trash / final.name)
            os.replace(staging, final)
            shutil.rmtree(trash)
        else:
            os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in reversed(created_parents):
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise


def remove_leftovers(final: Path) -> tuple[list[str], bool]:
    """Remove what a killed `staged_output` of `final` left next to it: staging folders, and the previous
    output moved aside, which is put back first when `final` itself is missing (killed between the two
    renames). Only for the holder of final's lock (fedcli.experiment.locking), so no live writer's folder goes.
    Returns the names removed and whether the previous output was put back."""
    final = Path(final)
    try:  # a sibling rank may remove the empty folder it made at any moment (see in_folder)
        found = sorted(p for p in final.parent.iterdir()
                       if p.name.startswith((aside(final, STAGING), aside(final, OLD))))
    except FileNotFoundError:
        return [], False
    restored = False
    for folder in found:
        previous = folder / final.name
        if folder.name.startswith(aside(final, OLD)) and previous.is_dir() and not final.exists():
            os.replace(previous, final)
            restored = True
        shutil.rmtree(folder, ignore_errors=True)
    return [p.name for p in found], restored


def check_writable(folder: Path) -> None:
    """Fail now, not after hours of training, when `folder` cannot be made or written: create it if needed
    and write a probe file there; both are removed again. The OSError is the CLI's (or a node's) one line."""
    folder = Path(folder)
    created = [p for p in reversed([folder, *folder.parents]) if not p.exists()]
    try:
        fd, probe = in_folder(folder, lambda: tempfile.mkstemp(dir=folder, prefix=".probe-"))
        os.close(fd)
        os.unlink(probe)
    finally:
        for parent in reversed(created):
            with contextlib.suppress(OSError):
                parent.rmdir()


def check_output_free(final: Path, overwrite: bool) -> None:
    if Path(final).exists() and not overwrite:
        raise UserError(f"{final} already exists; pass --overwrite to replace it")
