"""The audit's controls (`audit-privacy --controls`): generators whose answer is known, audited exactly
as the node's own, so a reader sees that the audit can fail and that its "none" is not blindness.

- memoriser: renders softmax(10 w . K^T) mixtures of the node's audited members (K: fixed random
  keys), so it can rebuild every member and no one else, and its buffer is near copies of members.
  Expected verdict: fail.
- data-free: the node's generator kind and architecture at a keyed random initialisation, never trained on
  anything. Expected: no leak (not fail).
- tiny-node: a GAN trained as long as phase 1's cap on tens of the node's images (`train-gan --controls`),
  against the node's standard generator on those images and as many class-matched unseen ones.
  Expected: the higher membership AUROC.
- reseeded: the control trained once more from the same snapshot with another random stream
  (`train-gan --controls`), compared with the control as the privacy generator is. Expected privacy
  effect: none, in the training LPIPS.
"""

from __future__ import annotations

import torch
from torch import nn

from fedcli.core.rng import stream_seed, torch_stream
from fedcli.generators.stylegan2.networks import class_mean_start

SHARPNESS = 10.0  # softmax temperature: w of unit scale picks one member


class Memoriser(nn.Module):
    """A generator that stores `members` ([-1, 1] images) and renders mixtures of them: a Sampler and
    Invertible (fedcli/generators/protocol.py) with the audited kind's latent sizes."""

    def __init__(self, members: torch.Tensor, z_dim: int, w_dim: int, stream: torch.Generator):
        super().__init__()
        self.z_dim = z_dim
        fixed = lambda tensor: nn.Parameter(tensor, requires_grad=False)  # noqa: E731
        self.members = fixed(members.flatten(1).clone())
        self.keys = fixed(torch.randn(len(members), w_dim, generator=stream) / w_dim ** 0.5)
        self.to_w = fixed(torch.randn(z_dim, w_dim, generator=stream) / z_dim ** 0.5)
        self.shape = members.shape[1:]

    def mapping(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return z @ self.to_w

    def render(self, latents: torch.Tensor, noise=None) -> torch.Tensor:
        weights = torch.softmax(SHARPNESS * latents @ self.keys.T, dim=1)
        return (weights @ self.members).view(-1, *self.shape)

    def sample(self, labels: torch.Tensor, stream: torch.Generator, truncation: float = 1.0) -> torch.Tensor:
        z = torch.randn(len(labels), self.z_dim, generator=stream)
        return self.render(self.mapping(z.to(labels.device), labels))

    def start(self, labels: torch.Tensor, stream: torch.Generator) -> tuple[torch.Tensor, float]:
        return class_mean_start(self, self.z_dim, labels, stream)

    def noise_shapes(self) -> list[tuple[int, ...]]:
        return []


def memoriser(members: torch.Tensor, sizes: tuple[int, int], seed: int, node: str) -> Memoriser:
    """`sizes`: the audited kind's (noise, latent) sizes."""
    return Memoriser(members.cpu(), *sizes, torch_stream(seed, node, "audit-control-memoriser"))


def data_free(kind, record: dict, seed: int, node: str) -> nn.Module:
    """An untrained generator of the node's kind, initialised from a keyed stream, not global state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed, node, "audit-control-data-free"))
        return kind.build(record).eval()


def outcome(name: str, summary: dict) -> dict:
    """What a control should give, what it gave, and whether that holds."""
    if name == "tiny-node":
        tiny, standard = summary["auroc"]["tiny"], summary["auroc"]["standard"]
        gap = summary["difference"]
        return {"expected": "membership AUROC above the standard generator's",
                "observed": f"membership AUROC {tiny:.3f} vs {standard:.3f} (difference {gap['difference']:+.3f}, "
                            f"95% [{gap['ci_low']:+.3f}, {gap['ci_high']:+.3f}])",
                "holds": gap["difference"] > 0}
    if name == "reseeded":
        observed = summary["privacy_effect"]["verdict"]
        return {"expected": "privacy effect none", "observed": f"privacy effect {observed}",
                "holds": observed == "none"}
    observed = summary["verdict"]["result"]
    expected = {"memoriser": "fail", "data-free": "not fail"}[name]
    holds = observed == "fail" if name == "memoriser" else observed != "fail"
    return {"expected": f"verdict {expected}", "observed": f"verdict {observed}", "holds": holds}
