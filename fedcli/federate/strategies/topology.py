"""Who sends to whom: FedER's random ring, and the fixed ring of cyclic training."""

from __future__ import annotations

from fedcli.core.rng import numpy_stream


def random_ring(nodes: list[str], seed: int, round_: int) -> dict[str, str]:
    """successor[node]: one cycle through all N nodes, uniform over the (N-1)! cycles (Sattolo's
    algorithm), drawn from a stream keyed by (seed, round), so every node derives the same ring."""
    order = list(range(len(nodes)))
    rng = numpy_stream(seed, "ring", round_)
    for i in range(len(order) - 1, 0, -1):
        j = int(rng.integers(0, i))  # j < i: this is what makes a single cycle
        order[i], order[j] = order[j], order[i]
    return {nodes[i]: nodes[order[i]] for i in range(len(nodes))}


def fixed_ring(nodes: list[str]) -> dict[str, str]:
    return {node: nodes[(i + 1) % len(nodes)] for i, node in enumerate(nodes)}


def predecessors(successor: dict[str, str]) -> dict[str, str]:
    return {receiver: sender for sender, receiver in successor.items()}
