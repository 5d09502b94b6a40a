"""What travels between nodes, as bytes: models, buffers and features in safetensors, never pickle (a kind of
generator encodes its own payloads with the same readers: VQ-VAE-2 codes in generators/vqvae2/codes.py).

A receiver rebuilds a model from bytes and checks it against its own architecture (same tensor
names, shapes and dtypes, finite values); a buffer is checked for uint8 images of the expected
shape and labels in range. Buffers travel losslessly compressed, one PNG per image by default.
"""

from __future__ import annotations

import io

import numpy as np
import torch

from fedcli.core.errors import UserError
from fedcli.experiment.artifact_kinds import buffer_problem
from fedcli.experiment.artifacts import parse_tensors, tensor_bytes

CODECS = ("png", "raw")


class PayloadError(UserError):
    """A payload that failed validation on receipt."""


def load_payload(data: bytes, what: str) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors and fedcli metadata of a safetensors payload; anything unreadable is a PayloadError."""
    try:
        return parse_tensors(data)
    except ValueError as exc:
        raise PayloadError(f"received {what} is not a valid safetensors payload ({exc})") from exc


def encode_model(state: dict[str, torch.Tensor]) -> bytes:
    return tensor_bytes({k: v.detach().cpu() for k, v in state.items()})


def decode_model(data: bytes, template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict from bytes, valid for the receiver's own model (whose state is `template`)."""
    state, _ = load_payload(data, "model")
    if set(state) != set(template):
        missing = sorted(set(template) - set(state)) or sorted(set(state) - set(template))
        raise PayloadError(f"received model does not match this architecture (tensor {missing[0]!r} differs)")
    for name, tensor in state.items():
        expected = template[name]
        if tensor.shape != expected.shape or tensor.dtype != expected.dtype:
            raise PayloadError(f"received model tensor {name!r} is {tuple(tensor.shape)} {tensor.dtype}, expected "
                               f"{tuple(expected.shape)} {expected.dtype}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise PayloadError(f"received model tensor {name!r} holds non-finite values")
    return state


def encode_buffer(images: torch.Tensor, labels: torch.Tensor, codec: str = "png") -> bytes:
    """uint8 images (N, C, H, W) and labels; `png` compresses each image losslessly."""
    if codec == "raw":
        return tensor_bytes({"images": images, "labels": labels}, {"codec": "raw"})
    from PIL import Image

    blobs = []
    for image in images.numpy():
        handle = io.BytesIO()
        Image.fromarray(image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)).save(handle, "PNG")
        blobs.append(np.frombuffer(handle.getvalue(), dtype=np.uint8))
    offsets = np.cumsum([0] + [len(b) for b in blobs])
    return tensor_bytes({"png": torch.from_numpy(np.concatenate(blobs) if blobs else np.zeros(0, np.uint8)),
                         "offsets": torch.from_numpy(offsets.astype(np.int64)), "labels": labels},
                        {"codec": "png", "shape": list(images.shape)})


def decode_buffer(data: bytes, shape: tuple[int, int, int], num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (N, C, H, W) uint8 and labels, checked against the expected image shape and classes."""
    tensors, metadata = load_payload(data, "buffer")
    labels = tensors.get("labels")
    if labels is None or labels.dtype != torch.int64 or labels.ndim != 1:
        raise PayloadError("received buffer has no int64 label vector")
    if metadata.get("codec") == "png":
        images = decode_png(tensors, len(labels), shape)
    else:
        images = tensors.get("images")
    problem = buffer_problem(images, labels, shape, num_classes)
    if problem:
        raise PayloadError(f"received buffer {problem}")
    return images, labels


def decode_png(tensors: dict, n: int, shape: tuple[int, int, int]) -> torch.Tensor:
    """PNG images, each required to be 8-bit L or RGB of the expected size before it is decoded."""
    from PIL import Image, UnidentifiedImageError

    blob, offsets = tensors.get("png"), tensors.get("offsets")
    if blob is None or offsets is None or len(offsets) != n + 1:
        raise PayloadError("received PNG buffer is missing its image data or offsets")
    channels, height, width = shape
    mode = "L" if channels == 1 else "RGB"
    raw = blob.numpy().tobytes()
    images = []
    try:
        for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
            with Image.open(io.BytesIO(raw[start:end])) as image:
                if image.mode != mode or image.size != (width, height):
                    raise PayloadError(f"received buffer image is {image.mode} {image.size[0]}x{image.size[1]}, "
                                       f"expected 8-bit {mode} {width}x{height}")
                array = np.asarray(image)
            images.append(array[None] if array.ndim == 2 else array.transpose(2, 0, 1))
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise PayloadError(f"received buffer holds an undecodable PNG image ({exc})") from exc
    if not images:
        return torch.zeros((0, channels, height, width), dtype=torch.uint8)
    return torch.from_numpy(np.stack(images))


def encode_features(features: torch.Tensor, labels: torch.Tensor | None = None) -> bytes:
    """What a cut layer computes (latents, activations) or its gradient: float32 (N, C, H, W), with the
    int64 labels of its images where the receiver computes the loss. N x C x H x W x 4 bytes (+ 8 N for
    the labels) and the safetensors header."""
    tensors = {"features": features.detach().to("cpu", torch.float32)}
    return tensor_bytes(tensors | ({"labels": labels.detach().cpu()} if labels is not None else {}))


def decode_features(data: bytes, what: str, shape: tuple[int, ...], num_classes: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Features of the expected per-image `shape` (and, where `num_classes` is given, one label in range
    per image), finite: the receiver's check before it computes on them."""
    tensors, _ = load_payload(data, what)
    features = tensors.get("features")
    if features is None or features.dtype != torch.float32 or tuple(features.shape[1:]) != tuple(shape):
        got = "nothing" if features is None else f"{tuple(features.shape[1:])} {features.dtype}"
        raise PayloadError(f"received {what} are {got} per image, expected {tuple(shape)} torch.float32")
    if not torch.isfinite(features).all():
        raise PayloadError(f"received {what} hold non-finite values")
    if num_classes is None:
        return features, None
    labels = tensors.get("labels")
    if labels is None or labels.dtype != torch.int64 or labels.shape != features.shape[:1] or \
            (len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < num_classes):
        raise PayloadError(f"received {what} lack one int64 label in 0..{num_classes - 1} per image")
    return features, labels
