"""A globally shared set (FedAvg+Share, Zhao et al. 2018): a class-balanced sample of every node's training
images, set apart at partition time. Zhao et al.'s shared set lies apart from the clients' data, so here its
images leave their nodes' training sets for every strategy (the comparison stays on the same training images);
each node keeps the records of its own images in the set under "shared", its part to send, and fedavg-share
gives the union to every node. Never drawn from a test set.

Its size is the fraction of all training images rounded to a whole number per class (C x round(F N / C)); the
draw is keyed by the partition's seed.
"""

from __future__ import annotations

from fedcli.core.errors import UserError
from fedcli.core.rng import numpy_stream


def set_apart(nodes: list[dict], fraction: float, label_names: list[str], seed: int) -> None:
    """Move `fraction` of the nodes' training records, the same number of each class, into `node["shared"]`."""
    for node, drawn in zip(nodes, balanced_draw(nodes, fraction, label_names, seed, "shared-set", "--shared-fraction")):
        node["shared"] = drawn


def balanced_draw(nodes: list[dict], fraction: float, label_names: list[str], seed: int, purpose: str,
                  option: str) -> list[list[dict]]:
    """Per node, the training records drawn out of it (and removed from its `train`): round(fraction N / C) of
    every class over all the nodes, keyed by `purpose`; `option` names the setting in an error."""
    pool = [(i, j, record["label"]) for i, node in enumerate(nodes) for j, record in enumerate(node["train"])]
    per_class = round(fraction * len(pool) / len(label_names))
    if per_class < 1:
        raise UserError(f"{option} {fraction} of {len(pool)} training images is less than one image per class; "
                        "raise it")
    rng = numpy_stream(seed, purpose)
    chosen: set[tuple[int, int]] = set()
    for label, name in enumerate(label_names):
        members = [(i, j) for i, j, y in pool if y == label]
        if len(members) < per_class:
            raise UserError(f"{option} {fraction} needs {per_class} training images of every class, but class "
                            f"{name} has {len(members)}; lower it")
        chosen.update(members[k] for k in rng.choice(len(members), per_class, replace=False))
    drawn = []
    for i, node in enumerate(nodes):
        drawn.append([r for j, r in enumerate(node["train"]) if (i, j) in chosen])
        node["train"] = [r for j, r in enumerate(node["train"]) if (i, j) not in chosen]
        if not node["train"]:
            raise UserError(f"{option} {fraction} leaves node {node['name']} no training image; lower it")
    return drawn
