"""The server optimisers of FedAdagrad, FedAdam and FedYogi (Reddi et al., 2021, Algorithm 2).

Each round, delta = the weighted average of the nodes' trained parameters minus the global ones (a step
towards the average; FedAvg takes it whole). Then m <- beta1 m + (1 - beta1) delta, v by the optimiser's
rule, and x <- x + lr m / (sqrt(v) + tau). m and v start at 0 (FLamby's and Flower's convention; the
paper lets v start at tau^2 or above) and there is no bias correction (as in the paper). FedAdam offers
Adam's (`bias_correction`): lr_t = lr sqrt(1 - beta2^t) / (1 - beta1^t) with t the server steps taken,
this one included (the first is round 0's average), the form Flower's FedAdam uses with t = round + 1
counting rounds from 1 (so its first step takes t = 2). Only trainable parameters take the step:
BatchNorm's running statistics, which no gradient moves, are averaged as FedAvg averages them. Every
node holds the same m and v (float64: the step x + delta is then exactly the average) and computes the
same step from the same all-reduced average, so there is still no server.

With lr 1, beta1 0, beta2 1 (v stays 0) and tau 1 the step is delta: FedAvg. With both betas 0 it is
not: x + lr delta / (|delta| + tau), a step of nearly lr per weight in the sign of delta.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def second_moment(rule: str, v: torch.Tensor, delta: torch.Tensor, beta2: float) -> torch.Tensor:
    """v_t from v_{t-1} and delta_t: Adagrad sums delta^2; Adam averages it; Yogi moves v towards delta^2
    by (1 - beta2) delta^2 at most, additively, so v cannot collapse after one large delta."""
    square = delta * delta
    if rule == "fedadagrad":
        return v + square
    if rule == "fedadam":
        return beta2 * v + (1 - beta2) * square
    if rule == "fedyogi":
        return v - (1 - beta2) * square * torch.sign(v - square)
    raise ValueError(f"no server optimiser for {rule!r}")


class ServerOptimizer:
    def __init__(self, rule: str, options: Any):
        """`options`: server_lr, beta1, tau, and beta2 and bias_correction where the rule has them."""
        self.rule, self.options = rule, options
        self.m: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}
        self.steps = 0

    def lr(self) -> float:
        """The step size of the step being taken (the `steps`-th)."""
        o = self.options
        if not getattr(o, "bias_correction", False):
            return o.server_lr
        return o.server_lr * math.sqrt(1 - o.beta2 ** self.steps) / (1 - o.beta1 ** self.steps)

    def step(self, current: dict[str, torch.Tensor], averaged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The new values of the parameters in `current`, given their weighted average over the nodes."""
        o, beta2 = self.options, getattr(self.options, "beta2", None)
        self.steps += 1
        lr = self.lr()
        out = {}
        for name, x in current.items():
            start = x.double()
            delta = averaged[name].double() - start
            m = self.m.get(name, torch.zeros_like(start))
            v = self.v.get(name, torch.zeros_like(start))
            self.m[name] = o.beta1 * m + (1 - o.beta1) * delta
            self.v[name] = second_moment(self.rule, v, delta, beta2)
            out[name] = (start + lr * self.m[name] / (self.v[name].sqrt() + o.tau)).to(x.dtype)
        return out

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"server-m": dict(self.m), "server-v": dict(self.v), "server-steps": {"t": torch.tensor(self.steps)}}

    def load_state(self, states: dict[str, dict[str, torch.Tensor]]) -> None:
        self.m, self.v = dict(states.get("server-m", {})), dict(states.get("server-v", {}))
        self.steps = int(states["server-steps"]["t"]) if "server-steps" in states else 0
