"""The federation engine: the round loop with evaluation and per-round checkpoints, for the nodes this
process runs (all of them in process, one per rank), over a `Federation`: the run's roles (node data,
local training, evaluation, the buffer exchange) and its transport, built from the resolved config in
one place (`build`).

Every random draw is keyed by (seed, model key, round, purpose), so both engines draw the same
numbers. Rows and transfers are sorted into one canonical order, whatever order they were computed or
gathered in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from fedcli.comm.buffer_exchange import BufferExchange
from fedcli.comm.transport import EVERYONE, InProcessTransport, Transfer, Transport
from fedcli.core.rng import numpy_stream
from fedcli.data.label_parts import read_hidden_labels
from fedcli.data.manifest import Manifest
from fedcli.data.node_data import NodeData, NodeImages
from fedcli.data.tensor_source import TensorSource
from fedcli.federate.checkpoint import Checkpoint, CheckpointMismatch
from fedcli.federate.config import FederateConfig, semi_supervised
from fedcli.federate.evaluator import Evaluator
from fedcli.federate.strategies import EVAL, REGISTRY, Strategy
from fedcli.federate.strategies.base import ENSEMBLE, GLOBAL_TEST
from fedcli.generators.registry import node_codec
from fedcli.training.fixmatch import FixMatchSettings, Semi
from fedcli.training.settings import Budget, LocalTrainer


@dataclasses.dataclass
class Federation:
    """One run's roles, as this process holds them; `local_nodes`: the nodes it runs (all of them in
    process), which the transport connects to the others."""

    data: NodeData
    trainer: LocalTrainer
    evaluator: Evaluator
    exchange: BufferExchange
    transport: Transport
    local_nodes: list[str]
    weighting: str = "samples"
    participation: float = 1.0

    def __post_init__(self) -> None:
        self._train_sizes: dict[str, int] | None = None

    @property
    def nodes(self) -> list[str]:
        return self.data.nodes

    @property
    def seed(self) -> int:
        return self.trainer.seed

    def train_sizes(self) -> dict[str, int]:
        """Every node's number of training images (the averaging weights), gathered once: its labelled images and,
        under --ssl, its unlabelled ones, which it trains on too (all of a node's in FedPerl's scenarios 2 and 4)."""
        if self._train_sizes is None:
            local = {node: self.data.training_images(node) if self.trainer.semi else len(self.data.train[node])
                     for node in self.local_nodes}
            self._train_sizes = {k: v for part in self.transport.gather(local, "sharing train sizes")
                                 for k, v in part.items()}
        return self._train_sizes

    def averaging_weights(self) -> dict[str, int]:
        """Each node's weight in an average: its train-set size (`samples`) or 1 (`equal`); 0 for a node with
        nothing to train on (no labels and no --ssl), which would only bring back the model it was sent."""
        sizes = self.train_sizes()
        return sizes if self.weighting == "samples" else {node: int(size > 0) for node, size in sizes.items()}

    def participants(self, round_: int) -> list[str]:
        """The nodes that train in round `round_` (--participation): every node in round 0, then round(share x
        nodes) of them, at least one, drawn from the stream of (seed, round), in the partition's order."""
        if round_ == 0 or self.participation >= 1:
            return list(self.nodes)
        count = max(1, round(self.participation * len(self.nodes)))
        drawn = numpy_stream(self.seed, "participation", round_).choice(len(self.nodes), count, replace=False)
        return [self.nodes[i] for i in sorted(drawn)]


def build(cfg: FederateConfig, manifest: Manifest, seed: int, *, name: str | None = None, device: str = "cpu",
          fold: int | None = None, buffers: dict[str, TensorSource] | None = None, images: NodeImages | None = None,
          transport: Transport | None = None, local_nodes: list[str] | None = None,
          cross_eval: bool = True) -> Federation:
    """The Federation of strategy `name`'s run (default: cfg's first strategy) of `cfg` on `fold`; the engine's
    parts: `transport`, `local_nodes` (default: every node, in process) and `cross_eval`."""
    buffers = buffers or {}
    data = NodeData(manifest, lambda node: buffers[node], fold, images,
                    lambda node: node_codec(cfg.exp, manifest, node, ", ".join(cfg.strategy)),
                    read_hidden_labels(cfg.exp, manifest) if cfg.labels == "all" else None)
    budget = Budget.of(cfg)
    fixmatch = semi_supervised({"ssl": cfg.ssl, "strategy": name or cfg.strategy[0]})
    semi = Semi(FixMatchSettings(cfg.confidence, cfg.lambda_u), cfg.unlabeled_ratio) if fixmatch else None
    trainer = LocalTrainer(data, budget, seed, device, cfg.model, cfg.pretrained, cfg.model_weights, semi)
    transport = transport or InProcessTransport(REGISTRY.transfer_kinds())
    local_nodes = list(data.nodes if local_nodes is None else local_nodes)
    evaluator = Evaluator(data, trainer, transport, local_nodes, cfg.bootstrap, cross_eval,
                          cfg.eval_statistics == "local")
    return Federation(data, trainer, evaluator, BufferExchange(data, transport), transport, local_nodes,
                      cfg.weighting, cfg.participation)


def row_order(nodes: list[str]) -> Callable[[dict], tuple]:
    """Metrics rows by round, model (nodes, then shared models, then the ensemble) and test node: one
    order for every engine, whatever order the rows were computed or gathered in."""
    keys = {key: i for i, key in enumerate([*nodes, *REGISTRY.shared_model_keys(), ENSEMBLE])}
    index = {node: i for i, node in enumerate([*nodes, GLOBAL_TEST])}
    return lambda row: (row["round"], keys[row["model_node"]], index[row["test_node"]])


def spent_order(nodes: list[str]) -> Callable[[dict], tuple]:
    """Training calls by round and the key that trained (nodes, then shared models); a key's calls of a round
    keep the order they were made in (sorting is stable)."""
    keys = {key: i for i, key in enumerate([*nodes, *REGISTRY.shared_model_keys()])}
    return lambda row: (row["round"], keys.get(row["key"], len(keys)))


def transfer_order(nodes: list[str]) -> Callable[[Transfer], tuple]:
    index = {node: i for i, node in enumerate([*nodes, EVERYONE])}
    kinds = REGISTRY.transfer_kinds()
    return lambda t: (t.round, index[t.sender], kinds.index(t.kind), index[t.receiver])


@dataclasses.dataclass(frozen=True)
class RoundEnd:
    """What every process learns at the end of a round, the same on both engines: every node's metrics rows
    of it (none between evaluations), in row order, and the bytes the nodes sent to train in it (models sent
    only to be tested elsewhere, --cross-eval's, aside)."""

    round: int
    rows: list[dict]
    bytes: int


def run_rounds(fed: Federation, strategy: Strategy, rounds: int, eval_every: int, checkpoint: Checkpoint,
               config: dict, resume: bool, after_round: Callable[[RoundEnd], None] | None = None
               ) -> tuple[list[dict], list[Transfer], list[dict]]:
    """Rounds 0..R with evaluation every `eval_every` rounds and at the end; resumable. Returns this
    process's rows, transfers and training calls' costs (LocalTrainer.spent; every node's, gathered, on a
    distributed run); `after_round` hears of each round once every node has checkpointed it, round 0 (the
    set-up models, before any round trains) too on a fresh start."""
    done = resume_round(fed, checkpoint) if resume else None
    if done is not None:
        states, rows, transfers, fed.trainer.spent = checkpoint.load(done, config)
        checkpoint.truncate(done)
        strategy.load_state(fed, {k: {n: t.to(fed.trainer.device) for n, t in s.items()} for k, s in states.items()})
        fed.transport.transfers = transfers
    else:
        checkpoint.clear()
        strategy.setup(fed)
        done, rows = 0, fed.evaluator.evaluate(strategy.name, 0, strategy.models())
        checkpoint.save(0, strategy.state(), rows, fed.transport.transfers, config, fed.trainer.spent)
        round_ended(fed, 0, rows, after_round)
    for round_ in range(done + 1, rounds + 1):
        strategy.run_round(fed, round_)
        evaluated = []
        if round_ % eval_every == 0 or round_ == rounds:
            trained_on = (lambda node: strategy.trained_on(fed, node)) if round_ == rounds else None
            evaluated = fed.evaluator.evaluate(strategy.name, round_, strategy.models(), trained_on)
            rows += evaluated
        checkpoint.save(round_, strategy.state(), rows, fed.transport.transfers, config, fed.trainer.spent)
        round_ended(fed, round_, evaluated, after_round)
    rows = [row for part in fed.transport.gather(rows, "gathering the metrics") for row in part]
    transfers = [Transfer(**t) for part in fed.transport.gather([t.__dict__ for t in fed.transport.transfers],
                                                                "gathering the transfers") for t in part]
    spent = [row for part in fed.transport.gather(fed.trainer.spent, "gathering the training budget") for row in part]
    return (sorted(rows, key=row_order(fed.nodes)), sorted(transfers, key=transfer_order(fed.nodes)),
            sorted(spent, key=spent_order(fed.nodes)))


def round_ended(fed: Federation, round_: int, evaluated: list[dict],
                after_round: Callable[[RoundEnd], None] | None) -> None:
    """`after_round` hears of round `round_` (its RoundEnd) once every node has saved it."""
    sent = sum(t.bytes for t in fed.transport.transfers if t.round == round_ and t.kind != EVAL)
    parts = fed.transport.gather({"rows": evaluated, "bytes": sent}, f"the end of round {round_}")
    if after_round is not None:
        after_round(RoundEnd(round_, sorted((row for part in parts for row in part["rows"]), key=row_order(fed.nodes)),
                             sum(part["bytes"] for part in parts)))


def resume_round(fed: Federation, checkpoint: Checkpoint) -> int | None:
    """The latest round every node's checkpoint holds; None when no node has one (a fresh start)."""
    held = fed.transport.gather(sorted(checkpoint.rounds()), "comparing the checkpoints")
    if not any(held):
        return None
    common = set.intersection(*map(set, held))
    if not common:
        raise CheckpointMismatch(f"the nodes' checkpoints in {checkpoint.folder} share no completed round; rerun "
                                 "without --resume (with --overwrite)")
    return max(common)
