"""A VQ-VAE-2 node's codes of its training images, as its GAN folder holds them (codes.safetensors).

Codes are per-image encodings of real images (top and bottom index maps, with labels): whoever holds the
decoder turns them back into reconstructions of those images. On the wire (encode_codes, read by
fedcli/comm/payloads.py's safetensors reader) they are int16 indices in safetensors, checked like the file: every map's
shape, every index against the codebook and
every label.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from fedcli.comm.payloads import PayloadError, load_payload
from fedcli.core.errors import UserError
from fedcli.experiment.artifact_kinds import load_recorded
from fedcli.experiment.artifacts import tensor_bytes
from fedcli.experiment.paths import CODES
from fedcli.generators.groups import interleave


@dataclasses.dataclass(frozen=True)
class NodeCodes:
    top: torch.Tensor  # (N, S/8, S/8) int64
    bottom: torch.Tensor  # (N, S/4, S/4) int64
    labels: torch.Tensor  # (N,) int64

    def __len__(self) -> int:
        return len(self.labels)

    def first(self, n: int) -> NodeCodes:
        """n codes, classes in turn (each class's in its order), so a small n replays every class, as a buffer's
        prefix does."""
        pools = [(self.labels == c).nonzero().flatten().tolist() for c in sorted(set(self.labels.tolist()))]
        index = torch.tensor(interleave(pools)[:n], dtype=torch.long)
        return NodeCodes(self.top[index], self.bottom[index], self.labels[index])

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"top": self.top.to(torch.int16), "bottom": self.bottom.to(torch.int16), "labels": self.labels}


@dataclasses.dataclass(frozen=True)
class CodeShape:
    """What valid codes look like: the maps' sides, the codebook's size and the classes."""

    top_side: int
    bottom_side: int
    codes: int
    num_classes: int


def codes_problem(tensors: dict, prefix: str, shape: CodeShape) -> str | None:
    top, bottom, labels = (tensors.get(f"{prefix}{part}") for part in ("top", "bottom", "labels"))
    if any(t is None for t in (top, bottom, labels)):
        return "lacks top or bottom codes or labels"
    if labels.dtype != torch.int64 or labels.ndim != 1:
        return "has no int64 label vector"
    n = len(labels)
    for name, t, side in (("top", top, shape.top_side), ("bottom", bottom, shape.bottom_side)):
        if t.dtype != torch.int16 or tuple(t.shape) != (n, side, side):
            return f"has {name} codes {tuple(t.shape)} {t.dtype}, expected ({n}, {side}, {side}) torch.int16"
        if n and not 0 <= int(t.min()) <= int(t.max()) < shape.codes:
            return f"has {name} codes outside the codebook's 0..{shape.codes - 1}"
    if n and not 0 <= int(labels.min()) <= int(labels.max()) < shape.num_classes:
        return f"has labels outside 0..{shape.num_classes - 1}"
    return None


def from_tensors(tensors: dict, prefix: str = "") -> NodeCodes:
    return NodeCodes(*(tensors[f"{prefix}{part}"].long() for part in ("top", "bottom", "labels")))


def load_codes_file(folder: Path, node: str, manifest, shape: CodeShape) -> NodeCodes:
    """Node `node`'s codes from its GAN folder, as its config.json recorded, for this node and partition."""
    what, fix = f"codes of node {node}", "re-run fedcli train-gan --generator vqvae2 --overwrite"
    path = Path(folder) / CODES
    if not path.is_file():
        raise UserError(f"{what} are missing ({path}): its generator is not a vqvae2; {fix}")
    tensors, _ = load_recorded(path, what, fix, expect={"node": node, "manifest": manifest.content_hash})
    problem = codes_problem(tensors, "", shape)
    if problem:
        raise UserError(f"{what} at {path} {problem}; {fix}")
    return from_tensors(tensors)


def encode_codes(codes: dict[str, NodeCodes]) -> bytes:
    """Codes by node, one payload."""
    return tensor_bytes({f"{node}/{k}": v for node, c in codes.items() for k, v in c.tensors().items()},
                        {"nodes": list(codes)})


def decode_codes(data: bytes, shape: CodeShape, expect: list[str]) -> dict[str, NodeCodes]:
    """The codes of exactly the nodes `expect` (a payload naming others is refused), each checked."""
    tensors, metadata = load_payload(data, "codes")
    nodes = metadata.get("nodes")
    if nodes != list(expect):
        raise PayloadError(f"received codes are of {nodes!r}, expected those of "
                           f"{', '.join(expect)}")
    for node in nodes:
        problem = codes_problem(tensors, f"{node}/", shape)
        if problem:
            raise PayloadError(f"received codes of {node} {problem}")
    return {node: from_tensors(tensors, f"{node}/") for node in nodes}
