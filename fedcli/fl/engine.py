"""The federation engine: data per node, model construction, the round loop, evaluation and
per-round checkpoints.

Data is loaded lazily per node and split, so a strategy that never asks for real training images
(FedER-B) never reads them. Every random draw is keyed by (seed, model key, round, purpose).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedcli.artifacts import load_tensors, save_tensors, write_json
from fedcli.data.dataset import NodeDataset
from fedcli.data.manifest import Manifest
from fedcli.errors import UserError
from fedcli.fl.evaluate import evaluate, predict
from fedcli.fl.local import LocalSettings, TensorSource, train_local
from fedcli.fl.payloads import decode_buffer, encode_buffer
from fedcli.fl.strategies import Strategy
from fedcli.fl.transport import InProcessTransport, Transfer
from fedcli.models.classifier import build_classifier
from fedcli.rng import numpy_stream, stream_seed, torch_stream


class LazySources(dict):
    """node -> TensorSource, loaded on first access."""

    def __init__(self, load: Callable[[str], TensorSource]):
        super().__init__()
        self._load = load

    def __missing__(self, node: str) -> TensorSource:
        self[node] = source = self._load(node)
        return source


class NodeImages:
    """Decoded node splits, shared by every strategy and fold of one federate run: each
    (node, split, folds) is decoded once, not once per strategy."""

    def __init__(self, manifest: Manifest):
        self.manifest = manifest
        self._cache: dict[tuple, TensorSource] = {}

    def get(self, node: str, split: str, folds: list[int] | None) -> TensorSource:
        key = (node, split, None if folds is None else tuple(folds))
        if key not in self._cache:
            data = NodeDataset(self.manifest, node, split, folds)
            self._cache[key] = TensorSource(data.images, data.labels)
        return self._cache[key]


class Federation:
    def __init__(self, manifest: Manifest, buffers: Callable[[str], TensorSource], *, seed: int, model: str,
                 epochs: int, init_epochs: int, lr: float, batch: int, lam: float, buffer_codec: str = "png",
                 fold: int | None = None, device: str = "cpu", bootstrap: int = 1000, pretrained: bool = False,
                 model_weights: Path | None = None, node_batch: dict[str, int] | None = None,
                 images: NodeImages | None = None):
        self.manifest, self.nodes, self.seed, self.device = manifest, manifest.node_names, seed, device
        self.model_name, self.pretrained, self.model_weights = model, pretrained, model_weights
        self.epochs, self.init_epochs, self.lr, self.batch, self.lam = epochs, init_epochs, lr, batch, lam
        self.node_batch = dict(node_batch or {})
        unknown = sorted(set(self.node_batch) - set(self.nodes))
        if unknown:
            raise UserError(f"--node-batch names {unknown[0]}, which is not a node; nodes: {', '.join(self.nodes)}")
        self.num_classes = manifest.num_classes
        self.image_shape = (manifest["channels"], manifest["image_size"], manifest["image_size"])
        self.augment = tuple(manifest.data.get("augment", ()))
        self.buffer_codec, self.bootstrap = buffer_codec, bootstrap
        folds = list(range(manifest["folds"]))
        train_folds = None if fold is None else [f for f in folds if f != fold]
        self.images = images or NodeImages(manifest)
        self.train = LazySources(lambda node: self._source(node, "train", train_folds))
        self.test = LazySources(lambda node: self._source(node, "train", [fold]) if fold is not None
                                else self._source(node, "test", None))
        self.buffers = LazySources(buffers)
        self.transport = InProcessTransport()
        self._buffer_payloads: dict[str, bytes] = {}
        self._decoded_buffers: dict[str, TensorSource] = {}

    def _source(self, node: str, split: str, folds: list[int] | None) -> TensorSource:
        return self.images.get(node, split, folds)

    def new_model(self, key: str) -> nn.Module:
        """A freshly initialised classifier; the same key always gives the same weights."""
        model = build_classifier(self.model_name, self.image_shape[0], self.num_classes,
                                 stream_seed(self.seed, "model-init", key), self.pretrained, self.model_weights)
        return model.to(self.device)

    def train_local(self, model: nn.Module, key: str, round_: int, primary: TensorSource,
                    replay: TensorSource | None, epochs: int, anchor: dict | None = None, mu: float = 0.0) -> int:
        settings = LocalSettings(epochs=epochs, lr=self.lr, batch=self.node_batch.get(key, self.batch), lam=self.lam,
                                 mu=mu, augment=self.augment)
        return train_local(model, primary, replay, settings, torch_stream(self.seed, key, round_, "local-train"),
                           self.device, anchor)

    def buffer_payload(self, node: str) -> bytes:
        if node not in self._buffer_payloads:
            buffer = self.buffers[node]
            self._buffer_payloads[node] = encode_buffer(buffer.images, buffer.labels, self.buffer_codec)
        return self._buffer_payloads[node]

    def receive_buffer(self, node: str) -> TensorSource:
        """The buffer payload waiting for `node`, decoded and validated. A payload whose exact bytes were
        decoded before is not decoded again (buffers do not change between rounds; the bytes still
        travel and are counted every round)."""
        data = self.transport.receive(node, "buffer")
        key = hashlib.sha256(data).hexdigest()
        if key not in self._decoded_buffers:
            self._decoded_buffers[key] = TensorSource(*decode_buffer(data, self.image_shape, self.num_classes))
        return self._decoded_buffers[key]

    def evaluate(self, strategy: str, round_: int, models: dict[str, nn.Module]) -> list[dict]:
        """Every model on every node's test set; plus the ensemble (mean softmax) of node models."""
        probs = {key: {node: predict(model, self.test[node].images, self.device) for node in self.nodes}
                 for key, model in models.items()}
        node_models = [key for key in models if key in self.nodes]
        if len(node_models) > 1:
            probs["ensemble"] = {node: np.mean([probs[k][node] for k in node_models], axis=0) for node in self.nodes}
        rows = []
        for key, per_node in probs.items():
            for node, p in per_node.items():
                y = self.test[node].labels.numpy()
                rng = numpy_stream(self.seed, "bootstrap", strategy, round_, key, node)
                rows.append({"round": round_, "strategy": strategy, "model_node": key, "test_node": node,
                             "n_test": len(y), **evaluate(y, p, rng, self.bootstrap)})
        return rows


class CheckpointMismatch(UserError):
    """A checkpoint left by a run with other options: it cannot be resumed."""


class Checkpoint:
    """The last completed round: model states (safetensors) and the rows so far (JSON, written last)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    @property
    def exists(self) -> bool:
        return (self.folder / "progress.json").is_file()

    def save(self, round_: int, states: dict[str, dict[str, torch.Tensor]], rows: list[dict],
             transfers: list[Transfer], config: dict) -> None:
        """Models go to a file of their own round first; progress.json, which names that file, is
        replaced last, so a crash in between leaves the previous round's pair intact."""
        flat = {f"{key}/{name}": tensor.detach().cpu() for key, state in states.items() for name, tensor in state.items()}
        models = f"models-round{round_}.safetensors"
        save_tensors(self.folder / models, flat)
        write_json(self.folder / "progress.json", {"round": round_, "models": models, "config": config, "rows": rows,
                                                   "transfers": [t.__dict__ for t in transfers]})
        for old in self.folder.glob("models-round*.safetensors"):
            if old.name != models:
                old.unlink()

    def load(self, config: dict) -> tuple[int, dict[str, dict[str, torch.Tensor]], list[dict], list[Transfer]]:
        progress = json.loads((self.folder / "progress.json").read_text())
        if progress["config"] != config:
            raise CheckpointMismatch(f"the checkpoint in {self.folder} was made with other options; rerun without "
                                     "--resume (with --overwrite) or with the same options")
        states: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in load_tensors(self.folder / progress["models"], "checkpoint").items():
            key, _, tensor_name = name.partition("/")
            states.setdefault(key, {})[tensor_name] = tensor
        return progress["round"], states, progress["rows"], [Transfer(**t) for t in progress["transfers"]]


def run_rounds(fed: Federation, strategy: Strategy, rounds: int, eval_every: int, checkpoint: Checkpoint,
               config: dict, resume: bool, after_round: Callable[[int], None] | None = None
               ) -> tuple[list[dict], list[Transfer]]:
    """Rounds 0..R with evaluation every `eval_every` rounds and at the end; resumable."""
    if resume and checkpoint.exists:
        done, states, rows, transfers = checkpoint.load(config)
        strategy.load_state(fed, {k: {n: t.to(fed.device) for n, t in s.items()} for k, s in states.items()})
        fed.transport.transfers = transfers
    else:
        strategy.setup(fed)
        done, rows = 0, fed.evaluate(strategy.name, 0, strategy.models())
        checkpoint.save(0, strategy.state(), rows, fed.transport.transfers, config)
    for round_ in range(done + 1, rounds + 1):
        strategy.run_round(fed, round_)
        if round_ % eval_every == 0 or round_ == rounds:
            rows += fed.evaluate(strategy.name, round_, strategy.models())
        checkpoint.save(round_, strategy.state(), rows, fed.transport.transfers, config)
        if after_round is not None:
            after_round(round_)
    return rows, fed.transport.transfers

