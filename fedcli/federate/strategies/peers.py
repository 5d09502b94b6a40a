"""FedPerl's peers (Bdair et al.): how a client finds the clients it learns from, and the anonymised peer.

- **Features.** A client is its model's mean and standard deviation of every parameter tensor, as the paper
  describes. Its public code takes every state tensor but BatchNorm's batch counter (so the running means and
  variances too) and appends the model's validation accuracy and loss by default; the caller chooses the
  tensors, and fedcli appends neither (the paper's features).
- **Similarity.** Each feature is min-max normalised across the clients (a feature equal at every client
  becomes 1), as the public code does: models that start from one initialisation differ little in raw
  statistics, so raw cosines are all near 1 and pick no one. Then the cosine similarity of every pair.
- **Peers.** A client's top-T others by similarity (ties to the lower index), then those of them its policy
  keeps, in the paper's order ("regardless of the used policy, we first select the top similar peers ... then
  one of the above policies is applied"): `static` all; `validation` those whose accuracy on the held-apart set
  is at least the client's own; `gated-validation` those whose accuracy is at least the threshold;
  `gated-similarity` those whose similarity to the client is at least the threshold. A policy never reaches
  further down the ranking for a peer it dropped, so a client may learn from fewer than T, or none.
- **Anonymised peer.** The T peers' models averaged into one, which is all that travels to the client: less
  traffic, and the client cannot tell its peers apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedcli.comm.exact_average import weighted_average

POLICIES = ("static", "validation", "gated-validation", "gated-similarity")


def features(model_parameters: Sequence[torch.Tensor]) -> torch.Tensor:
    """The mean and (population) standard deviation of each parameter tensor, in order, as one float64 vector."""
    stats = []
    for tensor in model_parameters:
        values = tensor.detach().double().reshape(-1)
        stats += [values.mean(), values.std(unbiased=False)]
    return torch.stack(stats)


def similarity(client_features: torch.Tensor) -> torch.Tensor:
    """The clients' pairwise cosine similarity after min-max normalising each feature across them (clients x
    features in, clients x clients out)."""
    low, high = client_features.min(dim=0).values, client_features.max(dim=0).values
    spread = high - low
    normalised = torch.where(spread > 0, (client_features - low) / torch.where(spread > 0, spread, 1.0),
                             torch.ones_like(client_features))
    unit = normalised / normalised.norm(dim=1, keepdim=True).clamp_min(torch.finfo(normalised.dtype).tiny)
    return unit @ unit.T


def choose(client: int, sim: torch.Tensor, count: int, policy: str = "static",
           accuracy: Sequence[float] | None = None, threshold: float | None = None) -> list[int]:
    """`client`'s peers: its top-`count` others, then those `policy` keeps, most similar first."""
    return allowed(client, policy, sim, top_peers(client, sim, count, [j for j in range(len(sim)) if j != client]),
                   accuracy, threshold)


def allowed(client: int, policy: str, sim: torch.Tensor, others: Sequence[int],
            accuracy: Sequence[float] | None = None, threshold: float | None = None) -> list[int]:
    """Those of `others` that `policy` lets `client` learn from, in their order."""
    if policy == "static":
        return list(others)
    if policy != "validation" and threshold is None:
        raise ValueError(f"policy {policy} needs a threshold")
    if policy == "gated-similarity":
        return [j for j in others if sim[client, j] >= threshold]
    if accuracy is None:
        raise ValueError(f"policy {policy} needs every client's validation accuracy")
    floor = accuracy[client] if policy == "validation" else threshold
    return [j for j in others if accuracy[j] >= floor]


def top_peers(client: int, sim: torch.Tensor, count: int, candidates: Sequence[int]) -> list[int]:
    """The `count` candidates most similar to `client`, most similar first (ties to the lower index)."""
    ranked = sorted(candidates, key=lambda j: (-float(sim[client, j]), j))
    return ranked[:count]


def anonymised(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The peers' models averaged with equal weights, the one model the client receives: the averaging
    strategies' exact fixed-point mean (comm/exact_average.py), so it is the same whichever order they arrive in."""
    return weighted_average(list(states), [1] * len(states))
