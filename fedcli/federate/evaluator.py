"""Evaluation of a run's models on the test sets of this process's nodes: metrics with bootstrap
intervals, the ensemble of the node models, the final round's BatchNorm diagnostic, and the final
predictions the report pairs strategies on.

`--eval-statistics local` scores every model on a node's test (and validation) images with its BatchNorm
statistics first re-estimated on that node's training images, labelled and unlabelled (images only: no label is
read), as a hospital calibrates a model it receives: one set of statistics averaged over differing scanners, which
no hospital's images have, is then no part of a score. The global test set, no node's, keeps the stored
statistics; the final round's diagnostic keeps its three readings, the stored one included."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from fedcli.comm.payloads import decode_model, encode_model
from fedcli.comm.transport import Transport
from fedcli.core.rng import torch_stream
from fedcli.data.node_data import NodeData
from fedcli.data.tensor_source import TensorSource
from fedcli.federate.strategies import REGISTRY
from fedcli.federate.strategies.base import ENSEMBLE, GLOBAL_TEST, LABELS
from fedcli.metrics.scores import accuracy, evaluate, predict, resample_counts
from fedcli.training.batchnorm_check import has_batchnorm, reestimated, refresh_batches
from fedcli.training.settings import LocalTrainer

TrainedOn = Callable[[str], tuple[TensorSource, "TensorSource | None"]]  # node -> its last round's sources


class Evaluator:
    def __init__(self, data: NodeData, trainer: LocalTrainer, transport: Transport, local_nodes: list[str],
                 bootstrap: int = 1000, cross_eval: bool = True, local_statistics: bool = False):
        """`cross_eval`: evaluate every node's model, not only this process's (models then travel to every
        test set); `local_statistics`: score with statistics re-estimated on the test node's training images."""
        self.data, self.trainer, self.transport = data, trainer, transport
        self.local_nodes, self.bootstrap, self.cross_eval = local_nodes, bootstrap, cross_eval
        self.own: TrainedOn = lambda node: (data.own[node], None)  # labelled and unlabelled, labels unread
        self.scoring: TrainedOn | None = self.own if local_statistics else None
        self.seed, self.device = trainer.seed, trainer.device
        self._counts: dict[str, np.ndarray] = {}

    def shared_models(self, round_: int, models: dict[str, nn.Module]) -> dict[str, nn.Module]:
        """`models` plus every other node's model of the same kind, fetched through the transport and
        validated on receipt (cross-evaluation; in process, every model is already here)."""
        nodes = self.data.nodes
        own = {key: model for key, model in models.items() if key in nodes}
        if not own or set(own) == set(nodes):
            return models
        received = self.transport.share(round_, {key: encode_model(m.state_dict()) for key, m in own.items()})
        merged = {}
        for key in nodes:
            if key in own:
                merged[key] = own[key]
            else:  # checked against the sender's own architecture
                merged[key] = self.trainer.new_model(key)
                merged[key].load_state_dict(decode_model(received[key], merged[key].state_dict()))
        return merged | {key: model for key, model in models.items() if key not in nodes}

    def evaluate(self, strategy: str, round_: int, models: dict[str, nn.Module],
                 trained_on: TrainedOn | None = None) -> list[dict]:
        """The models on the test sets of this process's nodes; plus the ensemble (mean softmax) of the
        node models when there are several. With `trained_on` (the final round), each row also holds
        the BatchNorm diagnostic's accuracies (training/batchnorm_check.py). Then the global test set's rows, where
        the partition has one (no diagnostic: it is no node's)."""
        if self.cross_eval:
            models = self.shared_models(round_, models)
        scored, validation = self.scored(models, round_)
        probs = self.with_ensemble(models, dict(scored))
        manifest = self.data.manifest
        rows = []
        for key, per_node in probs.items():
            for node, p in per_node.items():
                y = self.data.test[node].labels.numpy()
                counts = self.resample_counts(node)
                rows.append({"round": round_, "strategy": strategy, "model_node": key, "test_node": node,
                             "n_test": len(y), **evaluate(y, p, counts, manifest.positive_class,
                                                          manifest["label_names"])})
        if trained_on is not None:
            real = scored if self.scoring else self.probabilities(models, self.own, (), round_)
            same = not self.data.augment and all(trained_on(node)[0] is self.data.own[node]
                                                 and trained_on(node)[1] is None
                                                 for node in self.local_nodes)  # one stream: the same statistics
            as_trained = real if same else self.probabilities(models, trained_on, self.data.augment, round_)
            stored = self.with_ensemble(models, self.probabilities(models)) if self.scoring else probs
            variants = {"accuracy_stored": stored, "accuracy_refreshed": self.with_ensemble(models, real),
                        "accuracy_refreshed_as_trained": self.with_ensemble(models, as_trained)}
            for row in rows:
                y = self.data.test[row["test_node"]].labels.numpy()
                for column, p in variants.items():
                    row[column] = float((p[row["model_node"]][row["test_node"]].argmax(axis=1) == y).mean())
        if self.data.has_validation:
            for row in rows:  # the ensemble has no one model: NaN, as for an empty part
                row["validation_accuracy"] = validation.get((row["model_node"], row["test_node"]), float("nan"))
        return rows + self.on_global_test(strategy, round_, models)

    def scored(self, models: dict[str, nn.Module], round_: int) -> tuple[dict[str, dict[str, np.ndarray]],
                                                                         dict[tuple[str, str], float]]:
        """model key -> test node -> softmax, each model as it is scored on that node (the module's docstring); and,
        on a few-labels partition with validation parts, (model key, node) -> accuracy on the node's validation part
        (never trained on), by which the report's best-validation reading selects, as FedPerl's authors keep each
        client's model of best validation accuracy. One re-estimate serves both."""
        probs: dict[str, dict[str, np.ndarray]] = {key: {} for key in models}
        validation: dict[tuple[str, str], float] = {}
        for node in self.local_nodes:
            held = self.data.validation[node] if self.data.has_validation else None
            for key, model in models.items():
                if self.scoring is not None:
                    model = self.refreshed(model, node, self.scoring, (), round_)
                probs[key][node] = predict(model, self.data.test[node].images, self.device)
                if held is not None and len(held.labels):
                    validation[key, node] = accuracy(model, held, self.device)
        return probs, validation

    def on_global_test(self, strategy: str, round_: int, models: dict[str, nn.Module]) -> list[dict]:
        """The rows of the global test set (test node GLOBAL_TEST): each model scored once, a node's model by its
        node's process, a shared model and the node models' ensemble by the first node's."""
        held = self.data.global_test()
        if held is None:
            return []
        first = self.data.nodes[0] in self.local_nodes
        node_models = [key for key in models if key in self.data.nodes]
        ensemble = first and len(node_models) > 1 and set(node_models) == set(self.data.nodes)
        probs = {key: predict(model, held.images, self.device) for key, model in models.items()
                 if key in self.local_nodes or (first and key not in self.data.nodes) or ensemble}
        rows = {key: p for key, p in probs.items() if key in self.local_nodes or key not in self.data.nodes}
        if ensemble:
            rows[ENSEMBLE] = np.mean([probs[k] for k in node_models], axis=0)
        y, manifest = held.labels.numpy(), self.data.manifest
        counts = self.resample_counts(GLOBAL_TEST, len(y))
        return [{"round": round_, "strategy": strategy, "model_node": key, "test_node": GLOBAL_TEST, "n_test": len(y),
                 **evaluate(y, p, counts, manifest.positive_class, manifest["label_names"])} for key, p in rows.items()]

    def resample_counts(self, node: str, n: int | None = None) -> np.ndarray:
        """The bootstrap resamples of a test set: drawn once per run, as every model and round shares them."""
        if node not in self._counts:
            size = len(self.data.test[node]) if n is None else n
            self._counts[node] = resample_counts(self.seed, node, size, self.bootstrap)
        return self._counts[node]

    def own_predictions(self, models: dict[str, nn.Module], round_: int) -> dict[str, torch.Tensor]:
        """Each local node's own (or the shared) model's softmax on that node's test set, `<model key>/<test
        node>`, with the labels, `labels/<test node>`: what the report pairs strategies on (report/paired.py);
        scored as round `round_`'s metrics are (the final round)."""
        shared = REGISTRY.shared_model_keys()
        probs = self.probabilities({key: m for key, m in models.items() if key in self.local_nodes or key in shared},
                                   self.scoring, (), round_)
        out = {f"{key}/{node}": torch.from_numpy(p) for key, per_node in probs.items() for node, p in per_node.items()
               if key in (node, *shared)}
        return out | {f"{LABELS}/{node}": self.data.test[node].labels.clone() for node in self.local_nodes}

    def probabilities(self, models: dict[str, nn.Module], refresh: TrainedOn | None = None,
                      augment: tuple[str, ...] = (), round_: int = 0) -> dict[str, dict[str, np.ndarray]]:
        """model key -> test node -> softmax; with `refresh`, each model's BatchNorm statistics are first
        re-estimated on the batches `refresh(test node)` gives (augmented with `augment`), from one keyed
        stream, so identical sources give identical statistics."""
        out: dict[str, dict[str, np.ndarray]] = {key: {} for key in models}
        for node in self.local_nodes:
            for key, model in models.items():
                if refresh is not None:
                    model = self.refreshed(model, node, refresh, augment, round_)
                out[key][node] = predict(model, self.data.test[node].images, self.device)
        return out

    def refreshed(self, model: nn.Module, node: str, refresh: TrainedOn, augment: tuple[str, ...],
                  round_: int) -> nn.Module:
        if not has_batchnorm(model):
            return model
        primary, replay = refresh(node)
        batches = refresh_batches(primary, replay, self.trainer.batch_of(node), augment,
                                  torch_stream(self.seed, node, round_, "bn-reestimate"))
        return reestimated(model, batches, self.device)

    def with_ensemble(self, models: dict[str, nn.Module], probs: dict[str, dict[str, np.ndarray]]) -> dict:
        node_models = [key for key in models if key in self.data.nodes]
        if len(node_models) > 1:
            probs[ENSEMBLE] = {node: np.mean([probs[k][node] for k in node_models], axis=0)
                               for node in self.local_nodes}
        return probs
