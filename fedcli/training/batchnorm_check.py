"""The BatchNorm diagnostic: is a final accuracy a fact about the weights, or about their statistics?

In eval mode a BatchNorm layer normalises with running statistics that training updated with
momentum, so they can lag weights that moved fast (few steps per round, a fresh optimiser each
round) or describe batches unlike the test images (real plus another hospital's synthetic ones).
Each final model is scored on a node's test set three ways, the weights never changing:

- `accuracy_stored`: the running statistics as trained (what every table reports, unless federate scores with
  `--eval-statistics local`, whose tables hold `accuracy_refreshed`);
- `accuracy_refreshed`: statistics re-estimated on the evaluating node's real training images
  (test-time adaptation to that node);
- `accuracy_refreshed_as_trained`: re-estimated on the batches the evaluating node trains on in
  the last round, composed as in training (real plus replay for a replay strategy; the pooled
  data for a central model).

stored far from as-trained: the statistics lag the weights. as-trained far from refreshed: the
training batches are not distributed like the node's real images (mixing). Re-estimation is the
exact average over one pass (torch's `update_bn`), in batches of the training batch size.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn

from fedcli.data.tensor_source import TensorSource
from fedcli.training.local import Batches, LocalSettings

COLUMNS = ("model_node", "test_node", "accuracy_stored", "accuracy_refreshed", "accuracy_refreshed_as_trained")
DIAGNOSTIC = COLUMNS[2:]  # added to the final round's metrics rows, which carry them through checkpoints


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def reestimated(model: nn.Module, batches: Iterable[torch.Tensor], device: str) -> nn.Module:
    """A copy of `model` whose BatchNorm running statistics are the exact average over `batches`."""
    model = copy.deepcopy(model)
    torch.optim.swa_utils.update_bn(batches, model, device)
    return model.eval()


def refresh_batches(primary: TensorSource, replay: TensorSource | None, batch: int, augment: tuple[str, ...],
                    generator: torch.Generator) -> Iterable[torch.Tensor]:
    """One epoch of training-composed batches (images only) from a keyed stream."""
    settings = LocalSettings(epochs=1, lr=0.0, batch=batch, augment=augment)
    return (b.x for b in Batches(primary, replay, settings, generator))
