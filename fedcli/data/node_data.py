"""Every node's images as one process sees them: train and test sources, loaded lazily per node, and
the buffers. A strategy that never asks for real training images (FedER-B) never reads them, and a
distributed rank never reads another node's."""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedcli.data.dataset import NodeDataset
from fedcli.data.label_parts import hides_labels, labels_at_server
from fedcli.data.loading import load_images
from fedcli.data.manifest import Manifest
from fedcli.data.tensor_source import TensorSource


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


class NodeData:
    """The sources of one run: with `fold` k, training uses the other train folds and testing fold k
    (model selection); otherwise the train and test splits. `oracle` (federate --labels all, the upper bounds):
    each node's hidden labels, which join its unlabelled images to its labelled ones, leaving none unlabelled."""

    def __init__(self, manifest: Manifest, buffers: Callable[[str], TensorSource], fold: int | None = None,
                 images: NodeImages | None = None, codecs: Callable[[str], object] | None = None,
                 oracle: dict[str, list[int]] | None = None):
        self.manifest, self.nodes = manifest, manifest.node_names
        self.num_classes = manifest.num_classes
        self.image_shape = (manifest["channels"], manifest["image_size"], manifest["image_size"])
        self.augment = tuple(manifest.data.get("augment", ()))
        train_folds = None if fold is None else [f for f in range(manifest["folds"]) if f != fold]
        self.images = images or NodeImages(manifest)
        self.train = LazySources(lambda node: self.images.get(node, "train", train_folds) if oracle is None
                                 else with_hidden_labels(self.images, node, oracle[node]))
        self.test = LazySources(lambda node: self.images.get(node, "train", [fold]) if fold is not None
                                else self.images.get(node, "test", None))
        self.buffers = LazySources(buffers)
        self.shared = LazySources(lambda node: self.images.get(node, "shared", None))  # its part of the shared set
        self.unlabeled = LazySources(lambda node: self.images.get(node, "unlabeled", None) if oracle is None
                                     else empty(self.images.get(node, "unlabeled", None)))  # labels: UNSEEN
        self.own = LazySources(lambda node: self.train[node] if not len(self.unlabeled[node]) else
                               TensorSource.concat([self.train[node], self.unlabeled[node]]))  # every training image
        self.validation = LazySources(lambda node: self.images.get(node, "validation", None))  # few labels' part
        self.has_validation = bool((manifest.data.get("labels") or {}).get("validation_fraction"))
        # a node's decoder and codes, for code replay (fedcli/generators/vqvae2/codec.py)
        self.codecs = LazySources(codecs or (lambda node: None))
        self._global_test: TensorSource | None = None
        labels = manifest.data.get("labels")
        held_apart = (labels or {}).get("held_apart")
        self.held_apart_holder: str | None = held_apart["holder"] if held_apart else None
        self.labels_at_server = labels_at_server(labels)  # scenario 2: the server trains on the held-apart set
        self.hides_labels = hides_labels(labels, self.nodes)

    def global_test(self) -> TensorSource | None:
        """The partition's global test set (partition --global-test), decoded once; None where it has none."""
        records = self.manifest.data.get("global_test")
        if records and self._global_test is None:
            self._global_test = TensorSource(load_images(self.manifest, None, records),
                                             torch.tensor([r["label"] for r in records], dtype=torch.int64))
        return self._global_test

    def training_images(self, node: str) -> int:
        """A few-labels node's images to train on, labelled or not."""
        return len(self.train[node]) + len(self.unlabeled[node])

    def held_apart(self) -> TensorSource:
        """The labelled set held apart (partition --held-apart-fraction), as its holder reads it."""
        return self.images.get(self.held_apart_holder, "held_apart", None)


def with_hidden_labels(images: NodeImages, node: str, hidden: list[int]) -> TensorSource:
    labelled, unlabelled = images.get(node, "train", None), images.get(node, "unlabeled", None)
    return TensorSource(torch.cat([labelled.images, unlabelled.images]),
                        torch.cat([labelled.labels, torch.tensor(hidden, dtype=labelled.labels.dtype)]))


def empty(source: TensorSource) -> TensorSource:
    return TensorSource(source.images[:0], source.labels[:0])
