"""FixMatch with peers: other nodes' models help label a node's unlabelled images, and a consistency term pulls
the node's predictions towards theirs (FedPerl, Bdair et al. 2021; FedMatch, Jeong et al. 2021).

On each batch's weak views the peers (in eval mode, no gradient) give their softmax p_j; the node's own is q.
- **Pseudo labels.** `mean` (FedPerl's paper): the mean of q and every p_j, its top class kept where its
  probability reaches the threshold. `agreement` (FedMatch's code, wyjeong/FedMatch `loss_fn_u` and
  `agreement_based_labeling`): an image is kept where the node's own top probability reaches the threshold, and
  there every model (the node's and each peer's) votes for its top class, confident or not; the class with most
  votes wins (ties to the lower index, numpy's argmax). FedMatch's paper describes only the vote; its code is
  followed for who votes and which images count. Then FixMatch's masked cross-entropy of the strong views, times
  lambda_u, as without peers.
- **Consistency.** beta times the mean over the peers of `mse` (FedPerl: torch's MSELoss of q and p_j, averaged
  over every image and class) or `kl` (FedMatch: KL(p_j || q) summed over classes and averaged over the kept
  images only, as its code computes it on the confident images; none kept: 0), with the gradient through q.
  FedPerl's public code computes its MSE on detached predictions, so the term moves no weight there; fedcli
  follows the paper, in which it does.
FedPerl's code forms its peer label as `np.sum([prob, np.sum(probs)], axis=0)`, which adds one scalar (the sum of
every peer probability) to the local probabilities, so the peers decide no label there; fedcli follows the
paper's mean. Without peers this is FixMatch exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedcli.training.fixmatch import FixMatch, FixMatchSettings, SemiBatch, masked_cross_entropy

LABELLINGS = ("mean", "agreement")
CONSISTENCIES = ("mse", "kl")


class PeerFixMatch(FixMatch):
    def __init__(self, settings: FixMatchSettings, peers: list[nn.Module], labelling: str, consistency: str,
                 beta: float):
        super().__init__(settings)
        if labelling not in LABELLINGS or consistency not in CONSISTENCIES:
            raise ValueError(f"unknown labelling {labelling!r} or consistency {consistency!r}")
        self.peers, self.labelling, self.consistency, self.beta = peers, labelling, consistency, beta
        for peer in peers:
            peer.eval().requires_grad_(False)

    def to(self, device: str) -> "PeerFixMatch":
        self.peers = [peer.to(device, memory_format=torch.channels_last) for peer in self.peers]
        return self

    def unlabelled(self, weak_logits: torch.Tensor, strong_logits: torch.Tensor, batch: SemiBatch) -> torch.Tensor:
        if not self.peers:
            return super().unlabelled(weak_logits, strong_logits, batch)
        with torch.no_grad():
            theirs = [torch.softmax(peer(batch.weak), dim=1) for peer in self.peers]
        confident, pseudo = pseudo_labels(self.labelling, torch.softmax(weak_logits.detach(), dim=1), theirs,
                                          self.settings.confidence)
        term = self.settings.lambda_u * masked_cross_entropy(strong_logits, pseudo, confident)
        if self.beta == 0:
            return term
        return term + self.beta * agreement_loss(self.consistency, weak_logits, theirs, confident)


def pseudo_labels(labelling: str, own: torch.Tensor, theirs: list[torch.Tensor], threshold: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, label) of each unlabelled image from the node's softmax `own` and its peers' `theirs`."""
    if labelling == "mean":
        confidence, label = torch.stack([own, *theirs]).mean(dim=0).max(dim=1)
        return confidence >= threshold, label
    votes = torch.zeros_like(own)
    for probs in (own, *theirs):
        votes[torch.arange(len(probs)), probs.argmax(dim=1)] += 1
    return own.max(dim=1).values >= threshold, votes.argmax(dim=1)  # torch's argmax: the first of ties


def agreement_loss(kind: str, weak_logits: torch.Tensor, theirs: list[torch.Tensor], kept: torch.Tensor
                   ) -> torch.Tensor:
    """The mean over the peers of the node's distance to each peer's predictions (gradient through the node's):
    `mse` over every image, `kl` over the `kept` ones."""
    if kind == "mse":
        own = torch.softmax(weak_logits, dim=1)
        return torch.stack([F.mse_loss(own, probs) for probs in theirs]).mean()
    log_own = torch.log_softmax(weak_logits[kept], dim=1)
    per_peer = [F.kl_div(log_own, probs[kept], reduction="sum") for probs in theirs]
    return torch.stack(per_peer).mean() / max(int(kept.sum()), 1)
