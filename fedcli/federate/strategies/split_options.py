"""The options of the strategies that cut the classifier in two (FedReplay, SplitNN): where, and which
node plays the server that holds the top (the option peer anonymisation's server shares)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from fedcli.models.cuts import ALL_CUTS

Cut = Literal[ALL_CUTS]  # each architecture's own cuts: fedcli/models/cuts.py


def cut(default: str) -> Cut:
    return dataclasses.field(default=default, metadata={
        "help": "Where the classifier is cut: stem (conv1, BN, ReLU, pooling), or after a later stage (cnn: stage2, "
                "stage3; resnet: layer1-layer4; densenet121: block1-block4).", "select": False})


def node(help: str) -> str | None:
    """An option naming a node (checked against the partition's nodes before anything runs)."""
    return dataclasses.field(default=None, metadata={"help": help, "select": False, "node": True})


def server_node() -> str | None:
    return node("The node that plays the study's server, and sees what that server sees: fedreplay's (default the "
                "encoder node) and splitnn's (default the last node) hold the top of the cut network and see every "
                "node's latents or activations; fedperl's and fedmatch's with --anonymize (default the node holding "
                "the held-apart set, else the first) see every local model and choose and average each node's peers.")
