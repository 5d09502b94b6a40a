"""Split training: a node computes the bottom of the network on its batch and sends the activations (with
the labels) to the server, which computes the top and the loss and sends back the gradient of the loss
with respect to those activations; each side then steps its own optimiser. Every batch's two messages
go through the transport (none when the node is the server), so both engines give the same numbers, and
with the same batches, optimiser and learning rates it is the whole network's training (Adam, SGD and
weight decay act on each parameter alone): tests/test_splitnn.py checks this to 1e-6.

On the distributed engine only the node holds the batches; the server loops over as many steps as the
node's batches number (`steps`), which both sides compute from the node's train size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fedcli.comm.payloads import decode_features, encode_features
from fedcli.training.local import LocalSettings
from fedcli.training.objectives import Batch

if TYPE_CHECKING:
    from fedcli.comm.transport import Transport

CHANNELS_LAST = torch.channels_last


@dataclasses.dataclass
class Link:
    """The messages of one node's turn with the server: activations up, gradients down."""

    transport: "Transport"
    round: int
    node: str
    server: str
    shape: tuple[int, ...]  # the activations of one image
    num_classes: int

    def __post_init__(self) -> None:
        self._held: list = []  # in memory, when the node is the server

    @property
    def remote(self) -> bool:
        return self.node != self.server

    def up(self, activations: torch.Tensor, labels: torch.Tensor) -> None:
        if self.remote:
            self.transport.send(self.round, self.node, self.server, "activations", encode_features(activations, labels))
        else:
            self._held.append((activations.detach(), labels))

    def received_up(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.remote:
            return self._held.pop(0)
        data = self.transport.receive(self.round, self.node, self.server, "activations")
        return decode_features(data, "activations", self.shape, self.num_classes)

    def down(self, gradient: torch.Tensor) -> None:
        if self.remote:
            self.transport.send(self.round, self.server, self.node, "gradients", encode_features(gradient))
        else:
            self._held.append(gradient)

    def received_down(self, shape: torch.Size) -> torch.Tensor:
        if not self.remote:
            return self._held.pop(0)
        data = self.transport.receive(self.round, self.server, self.node, "gradients")
        gradient, _ = decode_features(data, "gradients", tuple(shape[1:]))
        if gradient.shape != shape:
            raise ValueError(f"the gradients for {self.node} are for {len(gradient)} images, not {shape[0]}")
        return gradient


def train_split(bottom: nn.Module | None, top: nn.Module | None, batches: Iterable[Batch] | None, steps: int,
                settings: LocalSettings, link: Link, device: str = "cpu", on_step=None) -> int:
    """`steps` steps of split training; `bottom` and `batches` where this process runs the node, `top` where it
    runs the server (None elsewhere). Each side's optimiser is fresh, as in local training. `on_step(step,
    activations, labels, gradient)` sees each step at the server (the kept sample of what travels)."""
    sides = [m for m in (bottom, top) if m is not None]
    for module in sides:
        module.train()
        module.to(memory_format=CHANNELS_LAST)
    try:
        return _train(bottom, top, iter(batches) if batches is not None else None, steps, settings, link, device,
                      on_step)
    finally:
        for module in sides:
            module.to(memory_format=torch.contiguous_format)


def _train(bottom, top, batches, steps, settings, link, device, on_step) -> int:
    bottom_opt = settings.new_optimizer(bottom.parameters()) if bottom is not None else None
    top_opt = settings.new_optimizer(top.parameters()) if top is not None else None
    for step in range(steps):
        lr = settings.lr_at(step, steps)
        if bottom is not None:
            batch = next(batches).to(device)
            activations = bottom(batch.x)
            link.up(activations, batch.labels)
        if top is not None:
            received, labels = link.received_up()
            received = received.to(device).contiguous(memory_format=CHANNELS_LAST).requires_grad_(True)
            loss = F.cross_entropy(top(received), labels.to(device))
            step_optimizer(top_opt, loss, lr)
            if on_step is not None:
                on_step(step, received.detach(), labels, received.grad)
            link.down(received.grad)
        if bottom is not None:
            gradient = link.received_down(activations.shape).to(device)
            bottom_opt.zero_grad(set_to_none=True)
            activations.backward(gradient)
            set_lr(bottom_opt, lr)
            bottom_opt.step()
        link.transport.flush()  # this step's sends delivered: a turn never holds more than one batch's payloads
    return steps


def step_optimizer(optimizer: torch.optim.Optimizer, loss: torch.Tensor, lr: float) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    set_lr(optimizer, lr)
    optimizer.step()


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
