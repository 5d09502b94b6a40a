"""The federation engine: data per node, model construction, the round loop, evaluation and
per-round checkpoints, for the nodes this process runs (all of them in process, one per rank).

Data is loaded lazily per node and split, so a strategy that never asks for real training images
(FedER-B) never reads them, and a distributed rank never reads another node's. Every random draw is
keyed by (seed, model key, round, purpose), so both engines draw the same numbers. Rows and
transfers are sorted into one canonical order, whatever order they were computed or gathered in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedcli.data.dataset import NodeDataset
from fedcli.config import architectures
from fedcli.data.manifest import Manifest
from fedcli.errors import UserError
from fedcli.fl.batchnorm_check import has_batchnorm, reestimated, refresh_batches
from fedcli.fl.evaluate import evaluate, predict, resample_counts
from fedcli.data.tensor_source import TensorSource
from fedcli.fl.local import LocalSettings, train_local
from fedcli.fl.payloads import decode_buffer, decode_model, encode_buffer, encode_model
from fedcli.fl.checkpoint import Checkpoint, CheckpointMismatch
from fedcli.fl.strategies import SHARED_MODELS, Strategy
from fedcli.fl.transport import EVERYONE, KINDS, InProcessTransport, Transfer, Transport
from fedcli.models.classifier import build_classifier
from fedcli.rng import stream_seed, torch_stream

TrainedOn = Callable[[str], tuple[TensorSource, "TensorSource | None"]]  # node -> its last round's sources


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
    def __init__(self, manifest: Manifest, buffers: Callable[[str], TensorSource], *, seed: int,
                 model: tuple[str, ...] | str,
                 epochs: int, init_epochs: int, lr: float, batch: int, lam: float, buffer_codec: str = "png",
                 fold: int | None = None, device: str = "cpu", bootstrap: int = 1000, pretrained: bool = False,
                 model_weights: Path | None = None, node_batch: dict[str, int] | None = None,
                 images: NodeImages | None = None, transport: Transport | None = None,
                 local_nodes: list[str] | None = None, cross_eval: bool = True, weighting: str = "samples",
                 rounds: int = 1, lr_schedule: str = "constant"):
        """`local_nodes`: the nodes this process runs (default all: the in-process simulation); the
        transport connects them to the others. `cross_eval`: evaluate every node's model, not only
        this process's (models then travel to every test set). `rounds` with the epochs sets the budget over
        which a cosine `lr_schedule` anneals."""
        self.manifest, self.nodes, self.seed, self.device = manifest, manifest.node_names, seed, device
        self.local_nodes = list(self.nodes if local_nodes is None else local_nodes)
        self.cross_eval = cross_eval
        self.model_name, self.own_models = architectures(model)
        self.pretrained, self.model_weights = pretrained, model_weights
        self.epochs, self.init_epochs, self.lr, self.batch, self.lam = epochs, init_epochs, lr, batch, lam
        self.weighting, self.rounds, self.lr_schedule = weighting, rounds, lr_schedule
        self.node_batch = dict(node_batch or {})
        for option, given in (("--node-batch", self.node_batch), ("--model", self.own_models)):
            unknown = sorted(set(given) - set(self.nodes))
            if unknown:
                raise UserError(f"{option} names {unknown[0]}, which is not a node; nodes: {', '.join(self.nodes)}")
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
        self.transport = transport or InProcessTransport()
        self._train_sizes: dict[str, int] | None = None
        self._buffer_payloads: dict[str, bytes] = {}
        self._decoded_buffers: dict[str, TensorSource] = {}
        self._counts: dict[str, np.ndarray] = {}

    def _source(self, node: str, split: str, folds: list[int] | None) -> TensorSource:
        return self.images.get(node, split, folds)

    def new_model(self, key: str) -> nn.Module:
        """A freshly initialised classifier; the same key always gives the same weights."""
        model = build_classifier(self.own_models.get(key, self.model_name), self.image_shape[0], self.num_classes,
                                 stream_seed(self.seed, "model-init", key), self.pretrained, self.model_weights)
        return model.to(self.device)

    def local_settings(self, key: str, round_: int, epochs: int, mu: float = 0.0) -> LocalSettings:
        return LocalSettings(epochs=epochs, lr=self.lr, batch=self.node_batch.get(key, self.batch), lam=self.lam,
                             mu=mu, augment=self.augment, schedule=self.lr_schedule,
                             span=self.budget_span(round_, epochs))

    def train_local(self, model: nn.Module, key: str, round_: int, primary: TensorSource,
                    replay: TensorSource | None, epochs: int, anchor: dict | None = None, mu: float = 0.0,
                    correction: dict | None = None) -> int:
        return train_local(model, primary, replay, self.local_settings(key, round_, epochs, mu),
                           torch_stream(self.seed, key, round_, "local-train"), self.device, anchor,
                           correction=correction)

    def budget_span(self, round_: int, epochs: int) -> tuple[float, float]:
        """The fractions of the run's epochs (round 0's init-epochs, then R x E) done before and after
        `epochs` epochs of round `round_`: where a learning-rate schedule stands."""
        total = self.init_epochs + self.rounds * self.epochs
        start = 0 if round_ == 0 else self.init_epochs + (round_ - 1) * self.epochs
        return start / total, (start + epochs) / total

    def buffer_payload(self, node: str) -> bytes:
        if node not in self._buffer_payloads:
            buffer = self.buffers[node]
            self._buffer_payloads[node] = encode_buffer(buffer.images, buffer.labels, self.buffer_codec)
        return self._buffer_payloads[node]

    def train_sizes(self) -> dict[str, int]:
        """Every node's number of training images (the averaging weights), gathered once."""
        if self._train_sizes is None:
            local = {node: len(self.train[node]) for node in self.local_nodes}
            self._train_sizes = {k: v for part in self.transport.gather(local, "sharing train sizes")
                                 for k, v in part.items()}
        return self._train_sizes

    def averaging_weights(self) -> dict[str, int]:
        """Each node's weight in an average: its train-set size (`samples`) or 1 (`equal`)."""
        return self.train_sizes() if self.weighting == "samples" else dict.fromkeys(self.nodes, 1)

    def receive_buffer(self, round_: int, sender: str, node: str) -> TensorSource:
        """The buffer payload from `sender` to `node`, decoded and validated. A payload whose exact bytes
        were decoded before is not decoded again (buffers do not change between rounds; the bytes still
        travel and are counted every round)."""
        data = self.transport.receive(round_, sender, node, "buffer")
        key = hashlib.sha256(data).hexdigest()
        if key not in self._decoded_buffers:
            self._decoded_buffers[key] = TensorSource(*decode_buffer(data, self.image_shape, self.num_classes))
        return self._decoded_buffers[key]

    def shared_models(self, round_: int, models: dict[str, nn.Module]) -> dict[str, nn.Module]:
        """`models` plus every other node's model of the same kind, fetched through the transport and
        validated on receipt (cross-evaluation; in process, every model is already here)."""
        own = {key: model for key, model in models.items() if key in self.nodes}
        if not own or set(own) == set(self.nodes):
            return models
        received = self.transport.share(round_, {key: encode_model(m.state_dict()) for key, m in own.items()})
        merged = {}
        for key in self.nodes:
            if key in own:
                merged[key] = own[key]
            else:  # checked against the sender's own architecture
                merged[key] = self.new_model(key)
                merged[key].load_state_dict(decode_model(received[key], merged[key].state_dict()))
        return merged | {key: model for key, model in models.items() if key not in self.nodes}

    def evaluate(self, strategy: str, round_: int, models: dict[str, nn.Module],
                 trained_on: TrainedOn | None = None) -> list[dict]:
        """The models on the test sets of this process's nodes; plus the ensemble (mean softmax) of the
        node models when there are several. With `trained_on` (the final round), each row also holds
        the BatchNorm diagnostic's accuracies (fl/batchnorm_check.py)."""
        if self.cross_eval:
            models = self.shared_models(round_, models)
        probs = self.with_ensemble(models, self.probabilities(models))
        rows = []
        for key, per_node in probs.items():
            for node, p in per_node.items():
                y = self.test[node].labels.numpy()
                counts = self.resample_counts(node)
                rows.append({"round": round_, "strategy": strategy, "model_node": key, "test_node": node,
                             "n_test": len(y), **evaluate(y, p, counts, self.manifest.positive_class,
                                                          self.manifest["label_names"])})
        if trained_on is not None:
            real = self.probabilities(models, lambda node: (self.train[node], None), (), round_)
            same = not self.augment and all(trained_on(node)[0] is self.train[node] and trained_on(node)[1] is None
                                            for node in self.local_nodes)  # one stream: the same statistics
            as_trained = real if same else self.probabilities(models, trained_on, self.augment, round_)
            variants = {"accuracy_refreshed": self.with_ensemble(models, real),
                        "accuracy_refreshed_as_trained": self.with_ensemble(models, as_trained)}
            for row in rows:
                y = self.test[row["test_node"]].labels.numpy()
                for column, p in variants.items():
                    row[column] = float((p[row["model_node"]][row["test_node"]].argmax(axis=1) == y).mean())
        return rows

    def resample_counts(self, node: str) -> np.ndarray:
        """The bootstrap resamples of a test set: drawn once per run, as every model and round shares them."""
        if node not in self._counts:
            self._counts[node] = resample_counts(self.seed, node, len(self.test[node]), self.bootstrap)
        return self._counts[node]

    def own_predictions(self, models: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
        """Each local node's own (or the shared) model's softmax on that node's test set, `<model key>/<test
        node>`, with the labels, `labels/<test node>`: what the report pairs strategies on (report/paired.py)."""
        probs = self.probabilities({key: m for key, m in models.items() if key in self.local_nodes or
                                    key in SHARED_MODELS})
        out = {f"{key}/{node}": torch.from_numpy(p) for key, per_node in probs.items() for node, p in per_node.items()
               if key in (node, *SHARED_MODELS)}
        return out | {f"labels/{node}": self.test[node].labels.clone() for node in self.local_nodes}

    def probabilities(self, models: dict[str, nn.Module], refresh: TrainedOn | None = None,
                      augment: tuple[str, ...] = (), round_: int = 0) -> dict[str, dict[str, np.ndarray]]:
        """model key -> test node -> softmax; with `refresh`, each model's BatchNorm statistics are first
        re-estimated on the batches `refresh(test node)` gives (augmented with `augment`), from one keyed
        stream, so identical sources give identical statistics."""
        out: dict[str, dict[str, np.ndarray]] = {key: {} for key in models}
        for node in self.local_nodes:
            for key, model in models.items():
                if refresh is not None and has_batchnorm(model):
                    primary, replay = refresh(node)
                    batches = refresh_batches(primary, replay, self.node_batch.get(node, self.batch), augment,
                                              torch_stream(self.seed, node, round_, "bn-reestimate"))
                    model = reestimated(model, batches, self.device)
                out[key][node] = predict(model, self.test[node].images, self.device)
        return out

    def with_ensemble(self, models: dict[str, nn.Module], probs: dict[str, dict[str, np.ndarray]]) -> dict:
        node_models = [key for key in models if key in self.nodes]
        if len(node_models) > 1:
            probs["ensemble"] = {node: np.mean([probs[k][node] for k in node_models], axis=0)
                                 for node in self.local_nodes}
        return probs


def row_order(nodes: list[str]) -> Callable[[dict], tuple]:
    """Metrics rows by round, model (nodes, then shared models, then the ensemble) and test node: one
    order for every engine, whatever order the rows were computed or gathered in."""
    keys = {key: i for i, key in enumerate([*nodes, *SHARED_MODELS, "ensemble"])}
    index = {node: i for i, node in enumerate(nodes)}
    return lambda row: (row["round"], keys[row["model_node"]], index[row["test_node"]])


def transfer_order(nodes: list[str]) -> Callable[[Transfer], tuple]:
    index = {node: i for i, node in enumerate([*nodes, EVERYONE])}
    return lambda t: (t.round, index[t.sender], KINDS.index(t.kind), index[t.receiver])


def run_rounds(fed: Federation, strategy: Strategy, rounds: int, eval_every: int, checkpoint: Checkpoint,
               config: dict, resume: bool, after_round: Callable[[int], None] | None = None
               ) -> tuple[list[dict], list[Transfer]]:
    """Rounds 0..R with evaluation every `eval_every` rounds and at the end; resumable. Returns this
    process's rows and transfers (every node's, gathered, on a distributed run)."""
    done = resume_round(fed, checkpoint) if resume else None
    if done is not None:
        states, rows, transfers = checkpoint.load(done, config)
        checkpoint.truncate(done)
        strategy.load_state(fed, {k: {n: t.to(fed.device) for n, t in s.items()} for k, s in states.items()})
        fed.transport.transfers = transfers
    else:
        checkpoint.clear()
        strategy.setup(fed)
        done, rows = 0, fed.evaluate(strategy.name, 0, strategy.models())
        checkpoint.save(0, strategy.state(), rows, fed.transport.transfers, config)
    for round_ in range(done + 1, rounds + 1):
        strategy.run_round(fed, round_)
        if round_ % eval_every == 0 or round_ == rounds:
            trained_on = (lambda node: strategy.trained_on(fed, node)) if round_ == rounds else None
            rows += fed.evaluate(strategy.name, round_, strategy.models(), trained_on)
        checkpoint.save(round_, strategy.state(), rows, fed.transport.transfers, config)
        fed.transport.gather(round_, f"the end of round {round_}")  # every node has saved it
        if after_round is not None:
            after_round(round_)
    rows = [row for part in fed.transport.gather(rows, "gathering the metrics") for row in part]
    transfers = [Transfer(**t) for part in fed.transport.gather([t.__dict__ for t in fed.transport.transfers],
                                                                "gathering the transfers") for t in part]
    return sorted(rows, key=row_order(fed.nodes)), sorted(transfers, key=transfer_order(fed.nodes))


def resume_round(fed: Federation, checkpoint: Checkpoint) -> int | None:
    """The latest round every node's checkpoint holds; None when no node has one (a fresh start)."""
    held = fed.transport.gather(sorted(checkpoint.rounds()), "comparing the checkpoints")
    if not any(held):
        return None
    common = set.intersection(*map(set, held))
    if not common:
        raise CheckpointMismatch(f"the nodes' checkpoints in {checkpoint.folder} share no completed round; rerun "
                                 "without --resume (with --overwrite)")
    return max(common)
