"""Weighted means of model states exact in fixed point, so that every order of summation (a simulated server's
loop, any all-reduce algorithm, a peer collecting others' models) gives the same bits."""

from __future__ import annotations

import torch


def scale_exponents(state: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    """Per tensor, the exponent E with every |value| < 2**E (int64, one per tensor)."""
    return torch.tensor([int(torch.frexp(state[n].detach().abs().max().double()).exponent) if state[n].numel() else 0
                         for n in names], dtype=torch.int64)  # the max of the tensor, not a float64 copy of it


def precision_bits(total_weight: int) -> int:
    """Fixed-point bits below each tensor's top exponent: the sum of all nodes stays below 2**62."""
    return 62 - int(total_weight).bit_length()


def fixed_point(state: dict[str, torch.Tensor], names: list[str], weight: int, exponents: torch.Tensor,
                bits: int) -> torch.Tensor:
    """weight * state, flattened, as integers in units of 2**(E - bits) of each tensor. Integer sums are
    exact, so every order of summation (a server's loop, any all-reduce algorithm) gives the same
    bits; float sums would differ in the last bit, which local training then amplifies."""
    return torch.cat([torch.round(state[n].detach().double().reshape(-1) * weight * 2.0 ** (bits - int(e)))
                      .to(torch.int64) for n, e in zip(names, exponents.tolist())])


def from_fixed_point(total: torch.Tensor, template: dict[str, torch.Tensor], exponents: torch.Tensor, bits: int,
                     total_weight: int) -> dict[str, torch.Tensor]:
    """The weighted mean from the summed fixed-point vector, in the template's dtypes (integer tensors,
    BatchNorm's batch counters, are rounded)."""
    out, start = {}, 0
    for (name, reference), e in zip(template.items(), exponents.tolist()):
        mean = total[start:start + reference.numel()].double() * 2.0 ** (int(e) - bits) / total_weight
        out[name] = (mean.to(reference.dtype) if reference.is_floating_point()
                     else mean.round().to(reference.dtype)).view(reference.shape)
        start += reference.numel()
    return out


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[int]) -> dict[str, torch.Tensor]:
    """Weighted mean of each tensor, exact in fixed point, so independent of the order of summation."""
    names, total_weight = list(states[0]), sum(weights)
    exponents = torch.stack([scale_exponents(state, names) for state in states]).amax(dim=0)
    bits = precision_bits(total_weight)
    total = sum(fixed_point(state, names, weight, exponents, bits) for state, weight in zip(states, weights))
    return from_fixed_point(total, states[0], exponents, bits, total_weight)
