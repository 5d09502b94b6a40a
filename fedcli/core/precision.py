"""`--precision fp32|bf16|fp16`: autocast regions, the fp32 islands inside them, and fp16's loss scaling.

fp32 is the default everywhere and runs exactly the code it ran before the option existed (no autocast context,
no scaler), so every fp32 number and fingerprint stays as it was. bf16 keeps fp32's exponent range and needs no
loss scaling; fp16 does (a GradScaler per optimiser) and is CUDA's only: CPU autocast has no fp16 kernels worth
the name, so it is refused there. On CPU, bf16 autocast casts other operations than CUDA's (oneDNN's list), so a
CPU run tests the logic of the regions, not CUDA's numerics.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

from fedcli.core.errors import UserError

Precision = Literal["fp32", "bf16", "fp16"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PRECISION_HELP = ("Arithmetic of the training steps: fp32, bf16 (autocast; CUDA Ampere or newer, or CPU) or fp16 (autocast "
        "with loss scaling; CUDA only). Losses, R1, DP-SGD's clipping and noise, and optimiser states stay fp32.")
COMPILE_HELP = "torch.compile the training step's networks (the first steps pay the compilation)."


def check_precision(precision: str, device: str) -> None:
    """Refuse fp16 where it cannot run: on CPU, or `auto` on a machine with no CUDA device."""
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if precision == "fp16" and on_cpu:
        raise UserError("--precision fp16 needs a CUDA device (CPU autocast has no fp16 path); use --precision bf16 "
                        "or fp32 on CPU")


def device_type(device) -> str:
    return torch.device(device).type


def autocast(precision: str, device) -> contextlib.AbstractContextManager:
    """The region a network's forward runs in: none at fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type(device), dtype=DTYPES[precision])


def full(precision: str, device) -> contextlib.AbstractContextManager:
    """An fp32 island inside an autocast region (StyleGAN2-ADA keeps the mapping network, R1 and the losses'
    reductions in fp32; DP-SGD clips and noises per-example gradients there)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type(device), enabled=False)


class Scaled:
    """One optimiser's step from a loss: plain `backward(); step()` unless fp16, where GradScaler scales the loss,
    skips a step whose gradients overflowed and adapts its scale."""

    def __init__(self, optimizer: torch.optim.Optimizer, precision: str, device):
        self.optimizer = optimizer
        self.scaler = torch.amp.GradScaler(device_type(device)) if precision == "fp16" else None

    def step(self, loss: torch.Tensor) -> None:
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
            return
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
