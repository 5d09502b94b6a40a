"""Training without exchange: `standalone` (each node alone) and the centralized upper bounds, which
pool every node's data in one place: `central` (real train data), `central-synthetic` (the buffers),
`central-mixed` (both). Each trains init-epochs + R x E epochs, the budget of every strategy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from fedcli.data.tensor_source import TensorSource
from fedcli.federate.strategies.base import Declaration, NoOptions, Strategy
from fedcli.federate.strategies.replay_options import PooledBufferOptions

if TYPE_CHECKING:
    from fedcli.federate.engine import Federation

CENTRAL = "central"


class Pooled(Strategy):
    def __init__(self, name: str, options: Any, real: bool, synthetic: bool, per_node: bool):
        self.name, self.options, self.real, self.synthetic, self.per_node = name, options, real, synthetic, per_node
        self.trained: dict[str, nn.Module] = {}

    def sources(self, fed: "Federation") -> dict[str, TensorSource]:
        if self.per_node:
            return {node: fed.data.train[node] for node in fed.local_nodes}
        parts = ([fed.data.train[n] for n in fed.nodes] if self.real else []) + \
                ([fed.data.buffers[n] for n in fed.nodes] if self.synthetic else [])
        return {CENTRAL: TensorSource.concat(parts)}

    def setup(self, fed: "Federation", train: bool = True) -> None:
        self.data = self.sources(fed)
        for key, source in self.data.items():
            model = fed.trainer.new_model(key)
            if train:
                fed.trainer.train(model, key, 0, source, None, fed.trainer.init_epochs)
            self.trained[key] = model

    def run_round(self, fed: "Federation", round_: int) -> None:
        """Every round, whatever --participation: a local model depends on no one taking part (FedPerl's public
        code trains its local baselines every round), so under participation the lower bound is not starved."""
        for key, model in self.trained.items():
            fed.trainer.train(model, key, round_, self.data[key], None, fed.trainer.epochs)

    def trained_on(self, fed: "Federation", node: str) -> tuple[TensorSource, TensorSource | None]:
        return self.data[node if self.per_node else CENTRAL], None

    def models(self) -> dict[str, nn.Module]:
        return dict(self.trained)


def central(name: str, summary: str, real: bool, synthetic: bool, as_trained_on: str) -> Declaration:
    return Declaration(name, summary, lambda o: Pooled(name, o, real, synthetic, per_node=False),
                       options=PooledBufferOptions if synthetic else NoOptions, model_key=CENTRAL,
                       needs_buffers=synthetic, pooled=True, families=("baselines",), as_trained_on=as_trained_on)


DECLARED = (
    Declaration("standalone", "each node trains alone on its own images",
                lambda o: Pooled("standalone", o, real=True, synthetic=False, per_node=True), own_architectures=True,
                families=("baselines", "convergence"), semi_supervised=True, partial=True),
    central("central", "centralized: every node's real images pooled", True, False, "pooled real"),
    central("central-synthetic", "centralized on every node's synthetic buffer", False, True, "pooled buffers"),
    central("central-mixed", "centralized on every node's real images and buffers", True, True,
            "pooled real + buffers"),
)
