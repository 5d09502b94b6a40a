"""Peer learning on few labels: FedPerl (Bdair et al. 2021) and FedMatch (Jeong et al. 2021, the variant without
weight decomposition). Both are SSFL (FedAvg with FixMatch at every node, always on: they learn from unlabelled
images) in which each node also learns, each round, from a few other nodes' models, its peers.

Each round after the warm-up, once the nodes have trained local models (their models before the last average),
the nodes training that round choose peers, in one of two ways.

Without --anonymize (the paper's "w/o PA", serverless here):
1. **Describe.** Every node describes its local model: FedPerl by the mean and standard deviation of every
   parameter tensor (federate/strategies/peers.py), FedMatch by its logits on one random image (uniform in [-1, 1], from
   the run's
   keyed stream, the same at every node). The descriptions are all-gathered, so every node computes the same
   similarity matrix (FedPerl: cosine after min-max normalisation; FedMatch: minus the Euclidean distance, the
   nearest neighbours its KD-tree finds). Every node thus learns every node's description and choice of peers.
2. **Choose** (federate/strategies/peers.py): the top-T, then FedPerl's policy. The validation policies need every local
model's
   accuracy on the held-apart set: every node sends its local model to the node holding that set (kind
   `peer-check`), which scores them all and tells everyone; it sees every local model, as FedPerl's server does.
3. **Send.** Each node's peers send it their local models (`peer-model`): it receives T models and knows whose.

With --anonymize (the paper's peer anonymisation, "at the server side"): a server does steps 1-3, as in the
paper. --server-node (default the node holding the held-apart set, else the first node) plays it: every node with
a local model sends it to the server (`peer-model`); the server describes them, computes the similarities,
validates them on its held-apart set where the policy asks, chooses each training node's peers, averages them
into one model (federate/strategies/peers.py) and sends it (`anonymised-peer`). The server sees what the paper's server
sees:
every local model, the similarities and every choice. A node receives one model, from the server, and learns
neither who its peers are nor their models; whether a model comes at all (a policy may leave a node without
peers) is the one fact the server tells it. `peers.csv` is the server's record; it reaches the results writer
as metrics do, outside the protocol.

Then each training node **learns**: from the global model with FixMatch whose pseudo labels its peers help form,
plus a consistency term (federate/strategies/peer_teaching.py); the models are then averaged as FedAvg's.
With --participation, only the round's participants choose peers and train; a peer is any node with a local model
(its latest), and a participant without one yet learns without peers that round. With T = 0, or before the first
peers, a round is SSFL's exactly. `peers.csv` (round, node, peer, rank, similarity) is the community matrix's
counts.

Where the public code (tbdair/FedPerlV1.0) differs and fedcli follows the paper: its features add every
BatchNorm running statistic and the validation accuracy and loss (federate/strategies/peers.py); its peers start at
round 1 (here
--warmup-rounds 0, round 0 being the initial round); FedMatch there reuses FedPerl's objective with FedMatch's
choice of helpers, here FedMatch labels by agreement and pulls by KL, as its paper.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from fedcli.comm.payloads import decode_model, encode_model
from fedcli.core.errors import UserError
from fedcli.core.rng import torch_stream
from fedcli.experiment.config import MAX_COUNT
from fedcli.experiment.panels import PEERS
from fedcli.federate.strategies import peers
from fedcli.federate.strategies.averaging import SERVER_MODEL, SHARED_STATISTICS, ServerAveraging
from fedcli.federate.strategies.base import Declaration, flag, option
from fedcli.federate.strategies.peer_teaching import PeerFixMatch
from fedcli.federate.strategies.split_options import server_node
from fedcli.metrics.scores import accuracy
from fedcli.training.objectives import Objective

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation

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
    anonymize: bool = flag(False, "Peer anonymisation at a server (--server-node): each node receives one model, "
                           "the mean of its T peers', instead of T models, and learns neither who they are nor "
                           "their models.")
    consistency: float = option(0.01, 0, 100, help="beta: weight of the consistency between a node's predictions "
                                "on its unlabelled images and its peers' (FedPerl: MSE; FedMatch: KL).")
    server_node: str | None = server_node()


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
        self.choices: list[dict] = []  # every node's peers, every round (peers.csv)
        self.server = peer_server(self.options.server_node, fed.data.held_apart_holder, fed.nodes)

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
        """The peers' models of each node training this round (as this process's nodes receive them), chosen
        among the `known` nodes (those with a local model)."""
        if self.options.anonymize:
            received = self.through_server(fed, round_, known)
        else:
            received = self.send_peers(fed, round_, self.serverless_choices(fed, round_, known))
        return {node: [fed.trainer.rebuild(node, state) for state in states] for node, states in received.items()}

    @property
    def validated(self) -> bool:
        """Whether the policy reads the held-apart set."""
        return getattr(self.options, "policy", "static") in VALIDATED

    def choose(self, round_: int, participants: list[str], known: list[str], sim: torch.Tensor,
               accuracy: list[float] | None) -> tuple[dict[str, list[str]], list[dict]]:
        """Each participant's peers among `known` (rows and columns of `sim`), and their peers.csv rows."""
        policy = getattr(self.options, "policy", "static")
        chosen, rows = {}, []
        for i, node in enumerate(known):
            if node not in participants:
                continue
            ranked = peers.choose(i, sim, self.options.peers, policy, accuracy,
                                  getattr(self.options, "policy_threshold", None))
            chosen[node] = [known[j] for j in ranked]
            rows += [{"round": round_, "node": node, "peer": known[j], "rank": rank + 1,
                      "similarity": float(sim[i, j])} for rank, j in enumerate(ranked)]
        return chosen, rows

    def similarity(self, described: dict[str, list[float]], known: list[str]) -> torch.Tensor:
        matrix = torch.tensor([described[node] for node in known], dtype=torch.float64)
        return peers.similarity(matrix) if self.describe == WEIGHTS else -torch.cdist(matrix, matrix)

    def serverless_choices(self, fed: "Federation", round_: int, known: list[str]) -> dict[str, list[str]]:
        """Every node's choice, computed alike at every node from the all-gathered descriptions."""
        described = {node: self.description(fed, self.own_models[node]) for node in fed.local_nodes if node in known}
        gathered = {k: v for part in fed.transport.gather(described, "describing the models to choose peers")
                    for k, v in part.items()}
        scores = self.held_apart_accuracy(fed, round_, known) if self.validated else None
        chosen, rows = self.choose(round_, fed.participants(round_), known, self.similarity(gathered, known), scores)
        self.choices += rows
        return {node: chosen.get(node, []) for node in fed.nodes}

    def through_server(self, fed: "Federation", round_: int, known: list[str]
                       ) -> dict[str, list[dict[str, torch.Tensor]]]:
        """Peer anonymisation at the server: the local models go to it, each training node gets its peers' mean."""
        server, template = self.server, self.global_model.state_dict()
        for node in fed.local_nodes:
            if node in known and node != server:
                fed.transport.send(round_, node, server, PEER_MODEL, encode_model(self.own_models[node].state_dict()))
        means, record = {}, {}
        if server in fed.local_nodes:
            models = {node: self.own_models[node] if node == server else fed.trainer.rebuild(
                node, decode_model(fed.transport.receive(round_, node, server, PEER_MODEL), template))
                for node in known}
            sim = self.similarity({node: self.description(fed, model) for node, model in models.items()}, known)
            scores = [accuracy(models[node], fed.data.held_apart(), fed.trainer.device) for node in known] \
                if self.validated else None
            chosen, rows = self.choose(round_, fed.participants(round_), known, sim, scores)
            means = {node: peers.anonymised([models[p].state_dict() for p in its_peers])
                     for node, its_peers in chosen.items() if its_peers}
            record = {"rows": rows, "served": sorted(means)}
        fed.transport.flush()
        told = [part for part in fed.transport.gather(record, "the server's peer choices") if part]
        self.choices += told[0]["rows"]
        for node, mean in means.items():
            if node != server:
                fed.transport.send(round_, server, node, ANONYMISED, encode_model(mean))
        received = {node: [means[node]] if node == server else
                    [decode_model(fed.transport.receive(round_, server, node, ANONYMISED), template)]
                    for node in fed.local_nodes if node in told[0]["served"]}
        fed.transport.flush()
        return received

    def description(self, fed: "Federation", model: nn.Module) -> list[float]:
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
            for node in known:
                model = self.own_models[node] if node == holder else fed.trainer.rebuild(
                    node, decode_model(fed.transport.receive(round_, node, holder, PEER_CHECK), template))
                scores[node] = accuracy(model, fed.data.held_apart(), fed.trainer.device)
        fed.transport.flush()
        gathered = {k: v for part in fed.transport.gather(scores, "the held-apart accuracies") for k, v in part.items()}
        return [gathered[node] for node in known]

    def send_peers(self, fed: "Federation", round_: int, chosen: dict[str, list[str]]
                   ) -> dict[str, list[dict[str, torch.Tensor]]]:
        """Each node's peers' models, sent by each peer."""
        template = self.global_model.state_dict()
        for sender in fed.local_nodes:
            for node, its_peers in chosen.items():
                if sender in its_peers:
                    fed.transport.send(round_, sender, node, PEER_MODEL,
                                       encode_model(self.own_models[sender].state_dict()))
        received = {node: [decode_model(fed.transport.receive(round_, peer, node, PEER_MODEL), template)
                           for peer in chosen[node]] for node in fed.local_nodes}
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


def peer_server(server_node: str | None, holder: str | None, nodes: list[str]) -> str:
    """The node that plays peer anonymisation's server: the one named, else the held-apart set's holder, else the
    first node."""
    return server_node or holder or nodes[0]


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
    Declaration("fedmatch", "FedMatch: SSFL whose nodes also learn from helpers chosen by their outputs on one "
                "random image (labels by agreement, KL consistency; no weight decomposition)", fedmatch,
                options=PeerOptions, transfers=("all-reduce", PEER_MODEL, ANONYMISED, SERVER_MODEL), **PEER_FACTS,
                panel=PEERS),
    Declaration("fedperl", "FedPerl: SSFL whose nodes also learn from the T peers most similar in their "
                "weights' statistics (mean-of-softmax labels, MSE consistency; --anonymize, --policy)", fedperl,
                options=PerlOptions, transfers=("all-reduce", PEER_MODEL, ANONYMISED, PEER_CHECK, SERVER_MODEL),
                **PEER_FACTS, panel=PEERS),
)
