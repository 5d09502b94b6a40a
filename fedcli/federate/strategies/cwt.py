"""Cyclic weight transfer (CWT; Chang et al. 2018), as the generative-replay study (Qu et al. 2022) runs it:
one model visits the nodes one after another in a fixed order (the partition's), training at each for
floor(|D_k| / b) iterations per epoch (full batches only; one batch of all its images at a node smaller
than b); a round is one cycle. Unlike `cyclic`, where every node's model moves one step along a ring at
once, only one node trains at a time and the others wait.

Budget: each visit is E epochs (init-epochs in round 0), so every node takes the same epochs as under any
other strategy, in floor(|D_k|/b) rather than ceil(|D_k|/b) steps each. Round 0 with init-epochs 0 is the
common initial model, which every node builds alike, so nothing travels for it.

What travels: the model from each node to the next (the last node's to the first at the start of the next
round). The model after a cycle is then held only by the last node; testing it on every node's test set
publishes it (the distributed engine's `eval` traffic, as cross-evaluation's), after every round, so that every
node also checkpoints the same model.

On the distributed engine a node waits for the model while the nodes before it train, up to a whole cycle:
`--timeout` must exceed one cycle's training, not one node's.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from fedcli.comm.payloads import decode_model, encode_model
from fedcli.experiment.panels import REPLAY
from fedcli.federate.strategies.base import Declaration, Strategy, flag
from fedcli.metrics.scores import predict
from fedcli.training.local import Batches

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation

KEY = "global"
FORGETTING = "forgetting"


def forgetting_option() -> bool:
    return flag(False, "CWT, CWT+Replay: score the model after each visit of the last cycle on every node's "
                       "training data (the generative-replay study's Table 1; distributed, the model is broadcast "
                       "after each visit, as eval traffic).")


@dataclasses.dataclass(frozen=True)
class CwtOptions:
    forgetting: bool = forgetting_option()


def full_batches(primary, replay, settings, generator) -> Batches:
    """floor(n / b) full batches per epoch (CWT's iterations per visit); all n images when n < b; --partial-batch
    keep overrides it."""
    return Batches(primary, replay, settings, generator, partial="drop")


class CyclicWeightTransfer(Strategy):
    name = "cwt"

    def __init__(self, options: CwtOptions = CwtOptions()):
        self.options = options
        self.model: nn.Module | None = None
        self.forgetting: list[dict] = []

    def setup(self, fed: "Federation", train: bool = True) -> None:
        self.build(fed)
        if train and fed.trainer.init_epochs:
            self.cycle(fed, 0, fed.trainer.init_epochs, handed_over=False)

    def run_round(self, fed: "Federation", round_: int) -> None:
        trained_before = round_ > 1 or fed.trainer.init_epochs > 0
        self.cycle(fed, round_, fed.trainer.epochs, handed_over=trained_before)

    def build(self, fed: "Federation") -> None:
        self.nodes = fed.nodes
        self.model = fed.trainer.new_model(KEY)

    def travelling(self) -> nn.Module:
        """What passes from node to node."""
        return self.model

    def cycle(self, fed: "Federation", round_: int, epochs: int, handed_over: bool) -> None:
        """One visit per node in order; `handed_over`: the model starts at the last node (trained), else every
        node holds the common initial model. Then the model is published, to be tested on every node."""
        order, travelling = fed.nodes, self.travelling()
        for i, node in enumerate(order):
            before = order[i - 1]
            if handed_over or i > 0:
                if before in fed.local_nodes:
                    fed.transport.send(round_, before, node, "model", encode_model(travelling.state_dict()))
                if node in fed.local_nodes:
                    travelling.load_state_dict(decode_model(fed.transport.receive(round_, before, node, "model"),
                                                            travelling.state_dict()))
            self.visit(fed, node, round_, epochs)
            if getattr(self.options, "forgetting", False) and round_ == fed.trainer.budget.rounds:
                self.score_visit(fed, round_, i)
        fed.transport.flush()
        holder = self.assemble(fed, round_)
        published = fed.transport.publish(round_, holder, encode_model(self.model.state_dict())
                                          if holder in fed.local_nodes else None)
        self.model.load_state_dict(decode_model(published, self.model.state_dict()))

    def visit(self, fed: "Federation", node: str, round_: int, epochs: int) -> None:
        if node in fed.local_nodes:
            fed.trainer.train(self.model, node, round_, fed.data.train[node], None, epochs, compose=full_batches)

    def score_visit(self, fed: "Federation", round_: int, visit: int) -> None:
        """Every node's accuracy on its own training data under the model that has just visited node `visit`."""
        node = fed.nodes[visit]
        fed.transport.flush()
        published = fed.transport.publish(round_, node, encode_model(self.model.state_dict())
                                          if node in fed.local_nodes else None)
        scorer = copy.deepcopy(self.model)
        scorer.load_state_dict(decode_model(published, scorer.state_dict()))
        rows = []
        for data_node in fed.local_nodes:
            train = fed.data.train[data_node]
            if not len(train):
                continue
            correct = predict(scorer, train.images, fed.trainer.device).argmax(axis=1) == train.labels.numpy()
            rows.append({"round": round_, "data": data_node, "after_visit": visit + 1, "visited": node,
                         "accuracy": float(np.mean(correct)), "n": len(train)})
        self.forgetting += [row for part in fed.transport.gather(rows, "the forgetting scores") for row in part]

    def tables(self) -> dict[str, list[dict]]:
        return {FORGETTING: list(self.forgetting)} if self.forgetting else {}

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        """The model, and the forgetting scores so far (every node holds them all), as columns."""
        if not self.forgetting:
            return super().state()
        index = {node: i for i, node in enumerate(self.nodes)}
        columns = {"round": torch.tensor([r["round"] for r in self.forgetting]),
                   "data": torch.tensor([index[r["data"]] for r in self.forgetting]),
                   "after_visit": torch.tensor([r["after_visit"] for r in self.forgetting]),
                   "accuracy": torch.tensor([r["accuracy"] for r in self.forgetting], dtype=torch.float64),
                   "n": torch.tensor([r["n"] for r in self.forgetting])}
        return super().state() | {FORGETTING: columns}

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, {k: v for k, v in states.items() if k != FORGETTING})
        held = states.get(FORGETTING)
        self.forgetting = [] if held is None else [
            {"round": int(r), "data": fed.nodes[int(d)], "after_visit": int(v), "visited": fed.nodes[int(v) - 1],
             "accuracy": float(a), "n": int(n)}
            for r, d, v, a, n in zip(*(held[c].tolist() for c in ("round", "data", "after_visit", "accuracy", "n")))]

    def assemble(self, fed: "Federation", round_: int) -> str:
        """The node that holds the whole model after a cycle and publishes it: the last one visited."""
        return fed.nodes[-1]

    def models(self) -> dict[str, nn.Module]:
        return {KEY: self.model}


DECLARED = (
    Declaration("cwt", "CWT: one model visits the nodes in a fixed order, floor(|D_k|/b) steps per epoch at "
                "each (Chang et al.)", lambda o: CyclicWeightTransfer(o), options=CwtOptions, model_key=KEY, transfers=("model",),
                families=("federated",), published=True, semi_supervised=True,
                bn_averaged="the last node's: the statistics of the node the model visited last, not the evaluating "
                "node's", panel=REPLAY),
)
