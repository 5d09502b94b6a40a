"""`--class-mix NODE=CLASS:SHARE`: one node whose case mix differs from the others' (FedPerl's client 8).

FedPerl's client 8 (Derm7pt) harms its federation through "the class distribution mismatch between client 8
and the other clients". On a source whose nodes share one mix (iid, site-shift), a node's images are drawn,
before its test split, so that CLASS makes SHARE of them: the other classes keep their relative shares (a
class-stratified draw), and as many images stay as the share allows. The node's test set stays class-balanced
(data/splits.py), so its training images hold CLASS at a share a little further from the others' than SHARE.
"""

from __future__ import annotations

from fedcli.core.errors import UserError
from fedcli.data.records import Sample
from fedcli.data.splits import smaller_train


def parse(given: tuple[str, ...], label_names: list[str]) -> dict[str, tuple[int, float]]:
    """{node: (class index, share)} from the option's NODE=CLASS:SHARE values."""
    mixes: dict[str, tuple[int, float]] = {}
    for value in given:
        node, _, rest = value.partition("=")
        name, _, share_text = rest.rpartition(":")
        try:
            share = float(share_text)
        except ValueError:
            share = None
        if not node or not name or share is None:
            raise UserError(f"--class-mix {value} is not NODE=CLASS:SHARE (e.g. node8=normal:0.75)")
        if name not in label_names:
            raise UserError(f"--class-mix {value} names class {name}, not a class of the data; classes: "
                            f"{', '.join(label_names)}")
        if not 0 < share < 1:
            raise UserError(f"--class-mix {value}: the share must lie strictly between 0 and 1, got {share_text}")
        if node in mixes:
            raise UserError(f"--class-mix names node {node} twice; give each node one mix")
        mixes[node] = (label_names.index(name), share)
    return mixes


def check_nodes(mixes: dict[str, tuple[int, float]], names: list[str]) -> None:
    unknown = [node for node in mixes if node not in names]
    if unknown:
        raise UserError(f"--class-mix names {unknown[0]}, not a node of the partition; nodes: {', '.join(names)}")


def mixed(node: str, members: list[Sample], label: int, share: float, seed: int, label_names: list[str]) -> list[Sample]:
    """`members` drawn so that class `label` makes `share` of them, in their original order."""
    chosen = [s for s in members if s.label == label]
    others = [s for s in members if s.label != label]
    if not chosen or not others:
        which = label_names[label] if not chosen else "any other class"
        raise UserError(f"--class-mix: node {node} has no images of {which} to mix; choose another node or class")
    if len(chosen) / len(members) < share:
        others = smaller_train(node, others, max(1, round(len(chosen) * (1 - share) / share)), seed, "class-mix")
    else:
        chosen = smaller_train(node, chosen, max(1, round(len(others) * share / (1 - share))), seed, "class-mix")
    kept = {id(s) for s in chosen + others}
    return [s for s in members if id(s) in kept]
