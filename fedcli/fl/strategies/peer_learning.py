"""Peer learning on few labels: FedPerl (Bdair et al. 2021) and FedMatch (Jeong et al. 2021, the variant without
weight decomposition). Both are SSFL (FedAvg with FixMatch at every node, always on: they learn from unlabelled
images) in which each node also learns, each round, from a few other nodes' models, its peers.

Each round after the warm-up, once the nodes have trained local models (their models before the last average):
1. **Describe.** Every node describes its local model: FedPerl by the mean and standard deviation of every
   parameter tensor (fl/peers.py), FedMatch by its logits on one random image (uniform in [-1, 1], from the run's
   keyed stream, the same at every node). The descriptions are all-gathered, so every node computes the same
   similarity matrix (FedPerl: cosine after min-max normalisation; FedMatch: minus the Euclidean distance, the
   nearest neighbours its KD-tree finds): no server.
2. **Filter** (FedPerl's policies, fl/peers.py). The validation policies need every local model's accuracy on
   the held-apart set: every node sends its local model to the node holding that set (kind `peer-check`),
   which scores them all and tells everyone; it sees every local model, as FedPerl's server does.
3. **Send.** Each node's top-T peers send it their local models (`peer-model`). With --anonymize the most
   similar peer collects the others' models (`peer-model`) and sends the node their mean alone
   (`anonymised-peer`): the node downloads one model instead of T and cannot tell its peers apart; the
   collecting peer sees the others' models, as FedPerl's server does.
4. **Learn.** The node trains from the global model with FixMatch whose pseudo labels its peers help form, plus
   a consistency term (fl/peer_teaching.py); the models are then averaged as FedAvg's.
With --participation, only the round's participants choose peers and train; a peer is any node with a local model
(its latest), and a participant without one yet learns without peers that round. With T = 0, or before the first peers, a round is SSFL's exactly. Every node's choice of peers is recorded
(`peers.csv`: round, node, peer, rank, similarity), the community matrix's counts.

Where the public code (tbdair/FedPerlV1.0) differs and fedcli follows the paper: its features add every
BatchNorm running statistic and the validation accuracy and loss (fl/peers.py); its peers start at round 1 (here
--warmup-rounds 0, round 0 being the initial round); FedMatch there reuses FedPerl's objective with FedMatch's
choice of helpers, here FedMatch labels by agreement and pulls by KL, as its paper.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import nn

from fedcli.config import MAX_COUNT
from fedcli.errors import UserError
from fedcli.fl import peers
from fedcli.fl.evaluate import predict
from fedcli.fl.objectives import Objective
from fedcli.fl.payloads import decode_model, encode_model
from fedcli.fl.peer_teaching import PeerFixMatch
from fedcli.fl.strategies.averaging import SHARED_STATISTICS, ServerAveraging
from fedcli.fl.strategies.base import Declaration, flag, option
from fedcli.rng import torch_stream

if TYPE_CHECKING:
    from fedcli.fl.engine import Federation

Policy = Literal["static", "validation", "gated-validation", "gated-similarity"]
VALIDATED = ("validation", "gated-validation")  # the policies that read the held-apart set
GATED = ("gated-validation", "gated-similarity")  # the policies with a threshold
PEER_MODEL, ANONYMISED, PEER_CHECK = "peer-model", "anonymised-peer", "peer-check"
CHOICES = "peers"
WEIGHTS, OUTPUTS = "weights", "outputs"  # how a model is described: FedPerl's, FedMatch's


@dataclasses.dataclass(frozen=True)
class PeerOptions:
    peers: int = option(2, 0, 64, help="T: the peers whose models help label each node's unlabelled images "
                        "(0: SSFL).")
    anonymize: bool = flag(False, "Peer anonymisation: each node receives one model, the mean of its T peers', "
                           "instead of T models.")
    consistency: float = option(0.01, 0, 100, help="beta: weight of the consistency between a node's predictions "
                                "on its unlabelled images and its peers' (FedPerl: MSE; FedMatch: KL).")


@dataclasses.dataclass(frozen=True)
class PerlOptions(PeerOptions):
    warmup_rounds: int = option(0, 0, MAX_COUNT, help="Rounds of plain SSFL before peers are chosen (round 0, the "
                                "initial round, has none).")
    policy: Policy = dataclasses.field(default="static", metadata={
        "help": "Which peers a node may choose: static (any), validation (at least its own accuracy on the "
                "held-apart set), gated-validation (accuracy at least --policy-threshold), gated-similarity "
                "(similarity at least --policy-threshold).", "select": False})
    policy_threshold: float | None = option(None, 0, 1, help="The gated policies' threshold (the study's 0.75, "
                                            "0.85, 0.95).")

    def __post_init__(self) -> None:
        if self.policy in GATED and self.policy_threshold is None:
            raise UserError(f"--policy {self.policy} needs --policy-threshold (the study's 0.75, 0.85 or 0.95)")


class PeerLearning(ServerAveraging):
    def __init__(self, name: str, options: PeerOptions, describe: str, labelling: str, consistency: str):
        super().__init__(name, options)
        self.describe, self.labelling, self.consistency = describe, labelling, consistency

    def init_server(self, fed: "Federation") -> None:
        self.fixmatch, self.nodes = fed.trainer.semi.fixmatch, fed.nodes
        self.probe = torch.rand((1, *fed.data.image_shape), generator=torch_stream(fed.seed, "fedmatch-probe"),
                                dtype=torch.float32) * 2 - 1  # FedMatch's one random image, the same at every node
        self.own_models: dict[str, nn.Module] = {}  # each local node's model after its last local training
        self.teachers: dict[str, list[nn.Module]] = {}  # this round's peers of each local node
        self.choices: list[dict] = []  # every node's peers, every round (every node holds them all)

    def train_and_average(self, fed: "Federation", round_: int, epochs: int) -> None:
        warmed = round_ > getattr(self.options, "warmup_rounds", 0)
        known = trained_before(fed, round_)
        self.teachers = self.exchange(fed, round_, known) if self.options.peers and warmed and known else {}
        super().train_and_average(fed, round_, epochs)
        self.teachers = {}

    def objective(self, node: str, anchor: dict[str, torch.Tensor]) -> Objective:
        return PeerFixMatch(self.fixmatch, self.teachers.get(node, []), self.labelling, self.consistency,
                            self.options.consistency)

    def train_node(self, fed: "Federation", node: str, round_: int, model: nn.Module, epochs: int,
                   anchor: dict[str, torch.Tensor]) -> int:
        steps = super().train_node(fed, node, round_, model, epochs, anchor)
        self.own_models[node] = model  # a fresh model each round: the average does not touch it
        return steps

    def exchange(self, fed: "Federation", round_: int, known: list[str]) -> dict[str, list[nn.Module]]:
        """The peers of each node training this round, among the `known` nodes (those with a local model), chosen
        alike at every node, and their models as this process's nodes receive them."""
        participants = fed.participants(round_)
        described = {node: self.description(fed, node) for node in fed.local_nodes if node in known}
        gathered = {k: v for part in fed.transport.gather(described, "describing the models to choose peers")
                    for k, v in part.items()}
        matrix = torch.tensor([gathered[node] for node in known], dtype=torch.float64)
        sim = peers.similarity(matrix) if self.describe == WEIGHTS else -torch.cdist(matrix, matrix)
        policy = getattr(self.options, "policy", "static")
        accuracy = self.held_apart_accuracy(fed, round_, known) if policy in VALIDATED else None
        chosen = {node: [] for node in fed.nodes}
        for i, node in enumerate(known):
            if node not in participants:
                continue
            allowed = peers.allowed(i, policy, sim, accuracy, getattr(self.options, "policy_threshold", None))
            ranked = peers.top_peers(i, sim, self.options.peers, allowed)
            chosen[node] = [known[j] for j in ranked]
            self.choices += [{"round": round_, "node": node, "peer": known[j], "rank": rank + 1,
                              "similarity": float(sim[i, j])} for rank, j in enumerate(ranked)]
        return {node: [fed.trainer.rebuild(node, state) for state in states]
                for node, states in self.send_peers(fed, round_, chosen).items()}

    def description(self, fed: "Federation", node: str) -> list[float]:
        model = self.own_models[node]
        if self.describe == WEIGHTS:
            return peers.features(list(model.parameters())).tolist()
        model.eval()
        with torch.no_grad():
            return model(self.probe.to(fed.trainer.device)).double().reshape(-1).tolist()

    def held_apart_accuracy(self, fed: "Federation", round_: int, known: list[str]) -> list[float]:
        """The accuracy on the held-apart set of every `known` node's local model, which the set's holder scores."""
        holder, template = fed.data.held_apart_holder, self.global_model.state_dict()
        for node in fed.local_nodes:
            if node != holder and node in known:
                fed.transport.send(round_, node, holder, PEER_CHECK, encode_model(self.own_models[node].state_dict()))
        scores = {}
        if holder in fed.local_nodes:
            held = fed.data.held_apart()
            for node in known:
                model = self.own_models[node] if node == holder else fed.trainer.rebuild(
                    node, decode_model(fed.transport.receive(round_, node, holder, PEER_CHECK), template))
                predicted = predict(model, held.images, fed.trainer.device).argmax(axis=1)
                scores[node] = float(np.mean(predicted == held.labels.numpy()))
        fed.transport.flush()
        gathered = {k: v for part in fed.transport.gather(scores, "the held-apart accuracies") for k, v in part.items()}
        return [gathered[node] for node in known]

    def send_peers(self, fed: "Federation", round_: int, chosen: dict[str, list[str]]
                   ) -> dict[str, list[dict[str, torch.Tensor]]]:
        """Each node's peers' models (or, anonymised, their mean, which the most similar peer collects and sends)."""
        anonymize, template = self.options.anonymize, self.global_model.state_dict()
        for sender in fed.local_nodes:
            for node, its_peers in chosen.items():
                if sender in (its_peers[1:] if anonymize else its_peers):
                    fed.transport.send(round_, sender, its_peers[0] if anonymize else node, PEER_MODEL,
                                       encode_model(self.own_models[sender].state_dict()))
        if anonymize:
            for collector in fed.local_nodes:
                for node, its_peers in chosen.items():
                    if its_peers and its_peers[0] == collector:
                        states = [self.own_models[collector].state_dict()] + [
                            decode_model(fed.transport.receive(round_, peer, collector, PEER_MODEL), template)
                            for peer in its_peers[1:]]
                        fed.transport.send(round_, collector, node, ANONYMISED, encode_model(peers.anonymised(states)))
        received = {}
        for node in fed.local_nodes:
            its_peers = chosen[node][:1] if anonymize else chosen[node]
            kind = ANONYMISED if anonymize else PEER_MODEL
            received[node] = [decode_model(fed.transport.receive(round_, peer, node, kind), template)
                              for peer in its_peers]
        fed.transport.flush()
        return received

    def tables(self) -> dict[str, list[dict]]:
        return {CHOICES: list(self.choices)} if self.choices else {}

    def state(self) -> dict[str, dict[str, torch.Tensor]]:
        states = super().state() | {f"peer-local:{node}": model.state_dict() for node, model in self.own_models.items()}
        if self.choices:
            states[CHOICES] = choice_columns(self.choices, self.nodes)
        return states

    def load_state(self, fed: "Federation", states: dict[str, dict[str, torch.Tensor]]) -> None:
        super().load_state(fed, states)
        self.own_models = {node: fed.trainer.rebuild(node, states[f"peer-local:{node}"]) for node in fed.local_nodes
                           if f"peer-local:{node}" in states}
        self.choices = choice_rows(states[CHOICES], fed.nodes) if CHOICES in states else []


def trained_before(fed: "Federation", round_: int) -> list[str]:
    """The nodes with a local model before round `round_`: those that trained in an earlier round (round 0 trains
    only with init-epochs), in the partition's order; every process derives the same list."""
    first = 0 if fed.trainer.init_epochs else 1
    trained = {node for r in range(first, round_) for node in fed.participants(r)}
    return [node for node in fed.nodes if node in trained]


def choice_columns(rows: list[dict], nodes: list[str]) -> dict[str, torch.Tensor]:
    index = {node: i for i, node in enumerate(nodes)}
    return {"round": torch.tensor([r["round"] for r in rows]), "node": torch.tensor([index[r["node"]] for r in rows]),
            "peer": torch.tensor([index[r["peer"]] for r in rows]), "rank": torch.tensor([r["rank"] for r in rows]),
            "similarity": torch.tensor([r["similarity"] for r in rows], dtype=torch.float64)}


def choice_rows(columns: dict[str, torch.Tensor], nodes: list[str]) -> list[dict]:
    return [{"round": int(r), "node": nodes[int(n)], "peer": nodes[int(p)], "rank": int(k), "similarity": float(s)}
            for r, n, p, k, s in zip(*(columns[c].tolist() for c in ("round", "node", "peer", "rank", "similarity")))]


def fedmatch(options: PeerOptions) -> PeerLearning:
    return PeerLearning("fedmatch", options, OUTPUTS, "agreement", "kl")


def fedperl(options: PerlOptions) -> PeerLearning:
    return PeerLearning("fedperl", options, WEIGHTS, "mean", "mse")


PEER_FACTS = dict(model_key="global", families=("federated",), bn_averaged=SHARED_STATISTICS, semi_supervised=True,
                  fixmatch=True, partial=True)
DECLARED = (
    Declaration("fedmatch", 40, "FedMatch: SSFL whose nodes also learn from helpers chosen by their outputs on one "
                "random image (labels by agreement, KL consistency; no weight decomposition)", fedmatch,
                options=PeerOptions, transfers=("all-reduce", PEER_MODEL, ANONYMISED), **PEER_FACTS),
    Declaration("fedperl", 41, "FedPerl: SSFL whose nodes also learn from the T peers most similar in their "
                "weights' statistics (mean-of-softmax labels, MSE consistency; --anonymize, --policy)", fedperl,
                options=PerlOptions, transfers=("all-reduce", PEER_MODEL, ANONYMISED, PEER_CHECK), **PEER_FACTS),
)
